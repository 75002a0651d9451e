"""The image's build times and sizes, measured on this machine (BENCHMARKS.md, "The image").

    python -m benchmarks.image_build [--from-nothing] --out benchmarks/image_runs/NAME.json
    python -m benchmarks.image_build --render benchmarks/image_runs/NAME.json   (BENCHMARKS.md's section)

Times, with the command each ran: ``make image-base`` (the stand-in base), ``make image BASE=<it>`` and
``make image-test``; then the image again after a change of the project's code alone (a file added to stapo/
for the build and removed after it), which rebuilds only the layers after the locked packages.
``--from-nothing`` first removes every image and the build cache, so the base's root file system and every
download are in the times. Sizes: the images' and each layer's, from the engine's own ``history``. The machine
(lscpu's model name, CPUs, load) is recorded beside them: take the figures with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

from stapo.machine_kind import machine_kind

REPO = Path(__file__).resolve().parents[1]
ENGINE = str(REPO / "docker" / "engine.sh")
STANDIN = "localhost/stapo-base:py311-torch2.11.0-vllm0.24.0"
IMAGE = "stapo:0.1.0-verl0.9.1-vllm024"


def timed(argv: list[str]) -> dict:
    start = time.monotonic()
    subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return {"command": " ".join(argv), "seconds": round(time.monotonic() - start, 1)}


def engine(*args: str) -> str:
    return subprocess.run([ENGINE, *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def step_text(created_by: str) -> str:
    """The Dockerfile step a layer came from, without the engine's prefixes (build arguments, the shell)."""
    text = re.sub(r"^\|\d+ (\S+=\S* )*", "", " ".join(created_by.split()))
    text = re.sub(r"^(/bin/(ba)?sh (-o pipefail )?-c )?(#\(nop\) )?", "", text)
    text = re.sub(r"--mount=type=secret,id=\w+ ", "", text)
    return re.sub(r"if \[ -s /run/secrets/\w+ \]; then export \w+=/run/secrets/\w+; fi && ", "", text)[:160]


def layers(image: str) -> list[dict]:
    """Each layer's size in bytes and the step that made it, newest first (empty layers left out). podman prints
    ``--format json`` as one array, docker ``{{json .}}`` as a line a layer."""
    argv = ["history", "--human=false", "--no-trunc", "--format"]
    try:
        rows = json.loads(engine(*argv, "json", image))
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        rows = [json.loads(line) for line in engine(*argv, "{{json .}}", image).splitlines() if line.strip()]
    found = []
    for row in rows:
        size, step = int(row.get("size", row.get("Size", 0))), row.get("CreatedBy", "")
        if size > 0:
            found.append({"bytes": size, "step": step_text(step)})
    return found


def image_bytes(image: str) -> int:
    return int(engine("image", "inspect", "--format", "{{.Size}}", image).strip())


def sizes() -> dict:
    return {name: {"bytes": image_bytes(name), "layers": layers(name)} for name in (STANDIN, IMAGE)}


MARKERS = ("<!-- image:figures -->", "<!-- /image:figures -->")


def gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB"


def render(record: dict, source: str) -> str:
    """BENCHMARKS.md's image figures, from one record (tests/benchmarks/test_image_figures.py compares)."""
    steps = record["steps"]
    start = "from nothing (no image, no cache)" if record["from_nothing"] else "cached"
    base, image = record["sizes"][STANDIN], record["sizes"][IMAGE]
    lines = [
        f"From `{source}`: {record['machine']}, {record['cpus']} CPUs, load {record['load_before']:.1f} before the "
        f"first step and {record['load_after']:.1f} after the last, {record['engine']}, {start}.",
        "",
        "| step | seconds |",
        "|---|---|",
    ]
    for step in steps:
        after = f" ({step['after']})" if "after" in step else ""
        lines.append(f"| `{step['command']}`{after} | {step['seconds']:.0f} |")
    lines += ["", f"The image {gib(image['bytes'])}, the stand-in base {gib(base['bytes'])}; the image's layers over "
              "the base, largest first:", "", "| layer | size |", "|---|---|"]
    own = image["layers"][: len(image["layers"]) - len(base["layers"])]
    for layer in sorted(own, key=lambda row: -row["bytes"])[:4]:
        lines.append(f"| `{layer['step'][:90]}` | {layer['bytes'] / 2**20:.0f} MiB |")
    lines.append(f"| the base's largest layer: `{max(base['layers'], key=lambda row: row['bytes'])['step'][:60]}` | "
                 f"{gib(max(row['bytes'] for row in base['layers']))} |")
    return "\n".join([MARKERS[0], *lines, MARKERS[1]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-nothing", action="store_true", help="remove every image and the build cache first")
    parser.add_argument("--out", type=Path, help="the record to write")
    parser.add_argument("--sizes-into", type=Path, help="re-read the images' sizes into this record, build nothing")
    parser.add_argument("--render", type=Path, help="print BENCHMARKS.md's section from this record, measure nothing")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text()), args.render.resolve().relative_to(REPO).as_posix()))
        return
    if args.sizes_into:
        record = json.loads(args.sizes_into.read_text())
        record["sizes"] = sizes()
        args.sizes_into.write_text(json.dumps(record, indent=2) + "\n")
        return
    if args.out is None:
        parser.error("--out is needed to measure")
    load_before = os.getloadavg()[0]
    if args.from_nothing:
        subprocess.run([ENGINE, "system", "prune", "--all", "--force"], check=True, stdout=subprocess.DEVNULL)
    steps = [timed(["make", "image-base"]), timed(["make", "image", f"BASE={STANDIN}"])]
    probe = REPO / "stapo" / ".image-build-probe"
    probe.write_text(f"{time.time()}\n")  # a change of the project's code alone
    try:
        steps.append(timed(["make", "image", f"BASE={STANDIN}"]) | {"after": "a file added to stapo/"})
    finally:
        probe.unlink()
    steps.append(timed(["make", "image-test"]))
    record = {
        "machine": machine_kind(), "cpus": os.cpu_count(), "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "from_nothing": args.from_nothing, "engine": engine("--version").strip(), "steps": steps,
        "sizes": sizes(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({"steps": steps, "bytes": {k: v["bytes"] for k, v in record["sizes"].items()}}, indent=2))


if __name__ == "__main__":
    main()
