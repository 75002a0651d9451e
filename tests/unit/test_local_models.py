"""The local model builders: deterministic, cached, atomic."""

from __future__ import annotations

import json
from pathlib import Path

from stapo.models.cache import build_once
from stapo.models.tiny import SETTINGS, build_tiny_model

# a build that takes a second and logs each time it runs, for the processes of the race below
SLOW_BUILD = """
import sys, time
from pathlib import Path
from stapo.models.cache import build_once

def build(folder):
    with open(sys.argv[2], "a") as log:
        log.write("built\\n")
    time.sleep(1.0)
    (folder / "done.txt").write_text("ok")

print(build_once(Path(sys.argv[1]), "done.txt", build))
"""


def test_tiny_model_is_deterministic_and_cached(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first = build_tiny_model(tmp_path / "a")
    second = build_tiny_model(tmp_path / "b")
    assert build_tiny_model(tmp_path / "a") == first  # cached: same folder, not rebuilt
    assert json.loads((Path(first) / "stapo_tiny.json").read_text()) == SETTINGS
    a = AutoModelForCausalLM.from_pretrained(first).state_dict()
    b = AutoModelForCausalLM.from_pretrained(second).state_dict()
    assert all((a[k] == b[k]).all() for k in a)
    tokenizer = AutoTokenizer.from_pretrained(first)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 plus 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_build_once_leaves_no_partial_folder_when_the_build_fails(tmp_path):
    def broken(folder: Path) -> None:
        (folder / "half.bin").write_text("x")
        raise RuntimeError("disk full")

    try:
        build_once(tmp_path / "model", "done.txt", broken)
    except RuntimeError:
        pass
    assert [p.name for p in tmp_path.iterdir()] == [".model.lock"]  # the lock file only, no partial folder
    calls = []
    path = build_once(tmp_path / "model", "done.txt", lambda f: (calls.append(1), (f / "done.txt").write_text("ok")))
    assert build_once(tmp_path / "model", "done.txt", lambda f: calls.append(2)) == path and calls == [1]


def test_processes_asking_at_once_build_once_and_share_the_result(tmp_path):
    """Three processes ask for the same missing model together: one builds, the others wait for it."""
    import subprocess
    import sys

    log = tmp_path / "builds.log"
    procs = [
        subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(tmp_path / "model"), str(log)],
                         stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert log.read_text() == "built\n"
    assert {line for out in outputs for line in out.splitlines() if not line.startswith("[stapo]")} == {
        str(tmp_path / "model")
    }
    assert (tmp_path / "model" / "done.txt").read_text() == "ok"


def test_a_folder_without_the_marker_is_replaced_not_a_rename_error(tmp_path):
    """A target left without its marker (an earlier layout, a copy made without the lock) used to turn the
    final rename into ``OSError: Directory not empty``: it is an unfinished build, replaced by this one."""
    stale = tmp_path / "model"
    stale.mkdir()
    (stale / "old.bin").write_text("stale")
    path = build_once(stale, "done.txt", lambda f: (f / "done.txt").write_text("ok"))
    assert sorted(p.name for p in Path(path).iterdir()) == ["done.txt"]


def test_a_finished_build_that_appears_during_the_build_is_used(tmp_path):
    """Another writer (not holding the lock) finishes the same target while this build runs: its result stands,
    and this build's copy is cleaned away."""
    target = tmp_path / "model"

    def racing(folder: Path) -> None:
        (folder / "done.txt").write_text("mine")
        target.mkdir()
        (target / "done.txt").write_text("theirs")
        (target / "weights.bin").write_text("x")  # a non-empty folder: the rename cannot replace it

    assert build_once(target, "done.txt", racing) == str(target)
    assert (target / "done.txt").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model-")] == []
