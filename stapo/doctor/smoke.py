"""`stapo doctor --smoke`: the GPU smoke preset submitted to the cluster as a real Ray job.

The job goes through ``launch/ray/submit.sh`` (the same upload, runtime env and driver overrides
as a real run), waits for its end, and its log is judged by ``stapo.doctor.checks.check_smoke``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

SMOKE_PRESET = "qwen3_0p6b_smoke"
DEFAULT_STEPS = 2


@dataclass
class SmokeRun:
    job_id: str
    succeeded: bool
    seconds: float
    log: str
    log_path: str
    timed_out: bool = False


def launch_dir() -> Path | None:
    """``launch/ray`` of a checkout (or of the image's /opt/stapo): $STAPO_HOME, else next to the package."""
    import stapo

    for root in (os.environ.get("STAPO_HOME"), Path(stapo.__file__).resolve().parents[1]):
        if root and (Path(root) / "launch" / "ray" / "submit.sh").is_file():
            return Path(root) / "launch" / "ray"
    return None


def job_address(address: str) -> str:
    """The job API of the cluster whose GCS is ``address`` (the dashboard port, default 8265)."""
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    port = os.environ.get("RAY_DASHBOARD_PORT", "8265")
    if address in ("auto", "local", ""):
        return f"http://127.0.0.1:{port}"
    host = urlparse(f"//{address.removeprefix('ray://')}").hostname or "127.0.0.1"
    return f"http://{host}:{port}"


def smoke_overrides(overrides: list[str]) -> list[str]:
    """The preset and STAPO first; the user's overrides after them win."""
    given = {item.lstrip("+").partition("=")[0] for item in overrides}
    base = [] if "model_preset" in given else [f"model_preset={SMOKE_PRESET}"]
    base += [] if "algo" in given else ["algo=stapo"]
    return base + list(overrides)


def total_steps(overrides: list[str]) -> int:
    for item in overrides:
        key, _, value = item.lstrip("+").partition("=")
        if key == "trainer.total_training_steps":
            return int(value)
    return DEFAULT_STEPS


def run_smoke(address: str, overrides: list[str], timeout_s: float, echo: bool) -> SmokeRun:
    """Submit, stream the log (step lines only unless ``echo``), stop the job on timeout."""
    launch = launch_dir()
    if launch is None:
        raise FileNotFoundError(
            "launch/ray/submit.sh not found: run `stapo doctor --smoke` from a checkout of the repository "
            "(or the image, /opt/stapo), or set STAPO_HOME to one"
        )
    job_id = f"stapo-smoke-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    api = job_address(address)
    env = dict(os.environ, RAY_ADDRESS=api, STAPO_WAIT="1", STAPO_JOB_ID=job_id)
    log_path = Path(tempfile.gettempdir()) / f"{job_id}.log"
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(launch / "submit.sh"), *overrides],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        subprocess.run(["ray", "job", "stop", "--address", api, job_id], check=False, capture_output=True, timeout=120)
        proc.terminate()

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    lines = []
    with open(log_path, "w", encoding="utf-8") as sink:
        for line in proc.stdout:
            lines.append(line)
            sink.write(line)
            if echo or "step:" in line or "[stapo-ray" in line:
                print(line.rstrip()[:300], file=sys.stderr, flush=True)
    proc.wait()
    timer.cancel()
    log = "".join(lines)
    return SmokeRun(
        job_id,
        proc.returncode == 0 and not timed_out.is_set(),
        time.monotonic() - started,
        log,
        str(log_path),
        timed_out.is_set(),
    )
