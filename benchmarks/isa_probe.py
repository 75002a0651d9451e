"""``python -m benchmarks.isa_probe [--steps N] [--json OUT]``: which settings make the CPU's kind not matter.

The CPU trainer's numbers are bit for bit the same on one kind of machine, not across kinds (docs/reproducibility.md):
PyTorch's own kernels pick their vector width from the CPU (``torch.backends.cpu.get_cpu_capability()``), and MKL's
matmuls pick theirs too. Both can be pinned from the environment: ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``,
``avx512``) and ``MKL_CBWR`` (MKL's conditional numerical reproducibility: ``AVX2``, or ``COMPATIBLE``, a code path
meant to give the same results on every x86 CPU). Whether a pinned setting gives the same bits on two kinds of machine
can only be seen by running the same probe on both and comparing fingerprints, which is what this module is for.

The probe is the testbed's model shape (``stapo.models.testbed.RECIPE``: a 4-layer Qwen3, hidden 128) trained from a
fixed seed on random tokens with one thread (forward, cross-entropy, backward, AdamW), then a draw of tokens from its
softmax with a seeded generator: the operations a CPU run's update and rollout are made of. Its fingerprint is a
SHA-256 over the trained weights and the drawn tokens. Each setting runs in a fresh process (the settings are read once,
when torch and MKL start). The JSON keeps the machine's kind, and per setting the fingerprint, the capability torch
reports and the seconds taken.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# name: environment; "native" lets torch and MKL choose for the machine, as a run does by default
SETTINGS = {
    "native": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "avx2-capped": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
    "portable": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
}
PINNED = ("ATEN_CPU_CAPABILITY", "MKL_CBWR")


def fingerprint(steps: int, batch: int = 64, length: int = 40, vocab: int = 64) -> dict:
    """Train the probe model ``steps`` steps and draw from it; its fingerprint, last loss and torch's capability."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from stapo.models.testbed import RECIPE

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = {key: RECIPE[key] for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "head_dim")}
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, max_position_embeddings=length, **shape))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    started = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch, length), generator=generator)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        ids = torch.randint(0, vocab, (8, length), generator=generator)
        probs = torch.softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
        drawn = torch.multinomial(probs, 16, replacement=True, generator=generator)
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    digest.update(drawn.numpy().tobytes())
    return {"sha256": digest.hexdigest(), "last_loss": loss.item(), "seconds": round(time.perf_counter() - started, 2),
            "capability": torch.backends.cpu.get_cpu_capability()}


def run_setting(env: dict[str, str], steps: int) -> dict:
    """The probe in a fresh process under ``env`` (on top of this one's environment, the pinned variables cleared)."""
    child = {key: value for key, value in os.environ.items() if key not in PINNED}
    child.update(env, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "benchmarks.isa_probe", "--child", "--steps", str(steps)]
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, env=child, capture_output=True, text=True, check=True, cwd=repo)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps of the probe (default 30)")
    parser.add_argument("--only", default=",".join(SETTINGS),
                        help=f"settings to run, comma-separated (default all: {', '.join(SETTINGS)})")
    parser.add_argument("--json", type=Path, help="write the machine's kind and the settings' fingerprints here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(fingerprint(args.steps)))
        return
    from stapo.runs.machine import machine_kind

    names = [name for name in args.only.split(",") if name]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        parser.error(f"--only: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(SETTINGS)}")
    result = {"machine": machine_kind(), "steps": args.steps, "settings": {}}
    for name in names:
        found = run_setting(SETTINGS[name], args.steps)
        result["settings"][name] = {"env": SETTINGS[name], **found}
        print(f"{name:12s} {found['sha256'][:16]}  capability {found['capability']:8s} {found['seconds']:6.1f} s",
              flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
