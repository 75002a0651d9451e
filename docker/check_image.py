"""What an installed STAPO environment must hold, checked where it is built: the image's last build step,
and the CPU test suite (tests/launch/test_docker_image.py), which runs this same file in its venv.

    python3 docker/check_image.py --verl 0.9.1 --transformers 5.10.4 --transfer-queue 0.1.11

- the installed versions of verl, transformers and TransferQueue are the ones given (the Dockerfile passes
  its ARGs);
- ``import verl`` loads this project's plugin: every policy loss, the trainer and the agent loop that
  ``stapo.verl_plugin.registration.assert_registered`` lists are in verl's registries;
- the ``stapo`` command and the image's entrypoint (``--entrypoint``, default ``stapo-entrypoint`` on the
  PATH) run;
- with ``--lock FILE`` (``auto``: docker/lock/py3XX.txt for this Python), every package of the lock is installed
  at the lock's version, but for those the base holds (docker/install_lock.py's HELD), which are only listed;
  on the stand-in base (``STAPO_STANDIN_BASE=1``, docker/base/Dockerfile), which was built from the lock, those
  must match too.

Prints one line with the versions on success; exits 1 with every problem on one line each otherwise.
No GPU is needed: nothing here initialises CUDA.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def version_problems(expected: dict[str, str]) -> list[str]:
    return [
        f"{name} {installed(name)} is installed, the image pins {wanted}"
        for name, wanted in expected.items()
        if installed(name) != wanted
    ]


def registration_problems() -> list[str]:
    import verl  # noqa: F401  (loads the 'verl.plugins' entry points, this project's among them)

    from stapo.verl_plugin.registration import assert_registered

    try:
        assert_registered()
    except RuntimeError as error:
        return [str(error)]
    return []


def lock_problems(lock: Path) -> list[str]:
    sys.path.insert(0, str(HERE))
    from install_lock import HELD, lock_entries, locked_version

    strict = os.environ.get("STAPO_STANDIN_BASE") == "1"
    problems = []
    for name, entry in lock_entries(lock.read_text(encoding="utf-8")).items():
        wanted, found = locked_version(entry), installed(name)
        if found == wanted:
            continue
        if HELD.match(name) and not strict:
            print(f"check_image: {name} {found} is the base's (the lock has {wanted})")
            continue
        problems.append(f"{name} {found} is installed, {lock.name} locks {wanted}")
    return problems


def default_lock() -> Path:
    return HERE / "lock" / f"py{sys.version_info.major}{sys.version_info.minor}.txt"


def command_problems(entrypoint: str) -> list[str]:
    problems = []
    for argv in (["stapo", "--help"], [entrypoint, "help"]):
        if shutil.which(argv[0]) is None:
            problems.append(f"{argv[0]}: not on the PATH")
            continue
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not done.stdout.strip():
            problems.append(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verl", required=True, help="the verl version the image pins")
    parser.add_argument("--transformers", required=True, help="the transformers version the image pins")
    parser.add_argument("--transfer-queue", required=True, help="the TransferQueue version the image pins")
    parser.add_argument("--entrypoint", default="stapo-entrypoint", help="the image's entrypoint command")
    parser.add_argument("--lock", help="a lock file every installed version must match ('auto': this Python's)")
    args = parser.parse_args(argv)
    expected = {"verl": args.verl, "transformers": args.transformers, "TransferQueue": args.transfer_queue}
    problems = version_problems(expected)
    problems += registration_problems()
    problems += command_problems(args.entrypoint)
    if args.lock:
        problems += lock_problems(default_lock() if args.lock == "auto" else Path(args.lock))
    if problems:
        for problem in problems:
            print(f"check_image: {problem}", file=sys.stderr)
        return 1
    others = ", ".join(f"{name} {installed(name)}" for name in ("torch", "vllm", "stapo"))
    print(f"check_image: ok: verl {args.verl}, transformers {args.transformers}, TransferQueue "
          f"{args.transfer_queue}, {others}; STAPO registered in verl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
