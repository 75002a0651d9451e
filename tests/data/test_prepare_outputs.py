"""`stapo data prepare` never overwrites what the user gave, and each of its errors is one line.

Run as a user runs it (the top-level ``stapo`` command): an output that is the input (named directly, through a
relative path or a symlink), an output that exists (replaced only with ``--force``), an ``--out`` that is a file,
an unwritable place, a missing or unreadable input. Each refusal is one line on stderr with exit code 2 and
nothing on stdout, and the files it names are byte for byte what they were. A write interrupted or failed
half way leaves the old files whole and no temporary file.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import types
from pathlib import Path

import pandas as pd

from stapo.cli import main as stapo_main

ROWS = [{"q": "What is 2 + 3?", "a": "5"}, {"q": "What is 4 * 4?", "a": "16"}]
OTHER = [{"q": "What is 9 - 1?", "a": "8"}]
FIELDS = ["--question-field", "q", "--answer-field", "a"]


def refusal(capsys, argv: list[str]) -> str:
    """``stapo data ARGV``: exit code 2, one line on stderr, nothing on stdout; the line without its prefix."""
    assert stapo_main(["data", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("stapo data: error: ")
    return captured.err.strip().removeprefix("stapo data: error: ")


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden temporaries included) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def custom(source: Path, out: Path | str, *extra: str) -> list[str]:
    return ["prepare", "custom", "--input", str(source), *FIELDS, "--out", str(out), *extra]


def test_an_output_that_is_the_input_is_refused_even_with_force(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "task"
    folder.mkdir()
    source = folder / "train.parquet"  # the user's own file, named as the output would be
    pd.DataFrame(ROWS).to_parquet(source)
    before = snapshot(tmp_path)
    for extra in ([], ["--force"]):
        line = refusal(capsys, custom(source, folder, *extra))
        assert line == (f"--out {folder} would overwrite the input {source} with its conversion "
                        f"({folder / 'train.parquet'}); choose another --out DIR")
    monkeypatch.chdir(tmp_path)  # the same file through a relative path
    assert "would overwrite the input" in refusal(capsys, custom(Path("task/../task/train.parquet"), "task",
                                                                 "--force"))
    linked = tmp_path / "linked"  # and through a symlink where the output goes
    linked.mkdir()
    (linked / "train.parquet").symlink_to(source)
    assert "would overwrite the input" in refusal(capsys, custom(source, linked, "--force"))
    (linked / "train.parquet").unlink()
    # a sidecar file of the output is an output too
    side = jsonl(tmp_path / "side" / "train.summary.json", ROWS)
    assert "would overwrite the input" in refusal(capsys, custom(side, side.parent, "--force"))
    side.unlink()
    assert snapshot(tmp_path) == before

    # the paper's data sets: OUT/NAME/<split>.parquet
    paper = tmp_path / "paper" / "aime24"
    paper.mkdir(parents=True)
    bench = paper / "test.parquet"
    pd.DataFrame([{"problem": "1+1?", "answer": "2"}]).to_parquet(bench)
    kept = bench.read_bytes()
    assert "would overwrite the input" in refusal(
        capsys, ["prepare", "aime24", "--input", str(bench), "--out", str(paper.parent), "--force"])
    assert bench.read_bytes() == kept


def test_an_existing_output_is_refused_naming_force_and_replaced_with_it(tmp_path, capsys):
    first, second = jsonl(tmp_path / "a" / "quiz.jsonl", ROWS), jsonl(tmp_path / "b" / "quiz.jsonl", OTHER)
    out = tmp_path / "out"
    assert stapo_main(["data", *custom(first, out)]) == 0
    capsys.readouterr()
    written = snapshot(out)
    assert sorted(written) == ["train.parquet", "train.skipped.jsonl", "train.summary.json"]
    line = refusal(capsys, custom(second, out))
    assert line == (f"{out}: train.parquet, train.skipped.jsonl, train.summary.json already exist(s); --force "
                    "replaces them (or choose another --out DIR)")
    assert snapshot(out) == written
    (out / "train.summary.json").unlink()  # any one of the three is enough to refuse
    assert "train.parquet, train.skipped.jsonl already exist(s); --force" in refusal(capsys, custom(second, out))
    assert stapo_main(["data", *custom(second, out, "--force")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rows_out"] == 1
    assert [row["reward_model"]["ground_truth"] for row in pd.read_parquet(out / "train.parquet").to_dict("records")] \
        == ["8"]
    assert sorted(snapshot(out)) == ["train.parquet", "train.skipped.jsonl", "train.summary.json"]  # no temporaries
    # another split beside it is a different output
    assert stapo_main(["data", *custom(first, out, "--split", "test")]) == 0
    capsys.readouterr()

    # the paper's data sets, from a file ...
    bench = jsonl(tmp_path / "bench.jsonl", [{"problem": "1+1?", "answer": "2"}])
    assert stapo_main(["data", "prepare", "amc23", "--input", str(bench), "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    assert "already exist(s); --force replaces them" in refusal(
        capsys, ["prepare", "amc23", "--input", str(bench), "--out", str(tmp_path / "p")])


def test_several_data_sets_are_all_checked_before_the_first_is_written(tmp_path, capsys, monkeypatch):
    """From the hub (a stand-in module: no download in tests): one existing output refuses them all."""
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append(name)
        return [{"problem": "1+1?", "answer": "2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    (tmp_path / "amc23").mkdir()
    (tmp_path / "amc23" / "test.parquet").write_bytes(b"mine")
    assert "amc23: test.parquet already exist(s); --force" in refusal(
        capsys, ["prepare", "math500", "amc23", "--out", str(tmp_path)])
    assert calls == [] and snapshot(tmp_path) == {"amc23/test.parquet": b"mine"}
    assert stapo_main(["data", "prepare", "math500", "amc23", "--out", str(tmp_path), "--force"]) == 0
    assert calls == ["HuggingFaceH4/MATH-500", "math-ai/amc23"]
    assert len(pd.read_parquet(tmp_path / "amc23" / "test.parquet")) == 1


def test_out_that_is_a_file_or_unwritable_and_bad_inputs_are_one_line(tmp_path, capsys):
    source = jsonl(tmp_path / "quiz.jsonl", ROWS)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    assert refusal(capsys, custom(source, a_file)) == (
        f"--out {a_file}: {a_file} is a file; --out names a folder (or one to create)")
    assert refusal(capsys, custom(source, a_file / "sub")) == (
        f"--out {a_file / 'sub'}: {a_file} is a file; --out names a folder (or one to create)")
    assert f"--out {a_file}: {a_file} is a file" in refusal(
        capsys, ["prepare", "aime24", "--input", str(source), "--out", str(a_file)])
    assert a_file.read_text() == "mine\n"
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "train.parquet").mkdir()  # an output name taken by a folder: not replaced, even with --force
    assert refusal(capsys, custom(source, tmp_path / "o", "--force")) == (
        f"{tmp_path / 'o' / 'train.parquet'} is a folder; choose another --out DIR")

    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert refusal(capsys, custom(source, locked / "out")) == (
            f"--out {locked / 'out'}: {locked} is not writable; choose another --out DIR")
    else:  # root writes anywhere a mode allows; /sys refuses even root (read-only, or not permitted)
        assert "/sys" in refusal(capsys, custom(source, "/sys/stapo-unwritable/out"))

    missing = tmp_path / "nope.jsonl"
    assert refusal(capsys, custom(missing, tmp_path / "o2")) == f"{missing}: no such file"
    assert refusal(capsys, custom(tmp_path, tmp_path / "o2")) == (
        f"{tmp_path} is a folder; --input takes one file (.json, .jsonl, .parquet, .csv)")
    assert "no such file" in refusal(capsys, ["prepare", "aime24", "--input", str(tmp_path / "x.jsonl"),
                                              "--out", str(a_file)])  # the input is said before the output
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really\n" * 50)
    assert refusal(capsys, custom(garbage, tmp_path / "o2")).startswith(
        f"{garbage}: not a readable parquet file")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert refusal(capsys, custom(binary, tmp_path / "o2")) == (
        f"{binary}: row 1 (line 1) is not UTF-8 text (byte 0x89 at column 1); save the file as UTF-8")
    assert not (tmp_path / "o2").exists()


def test_a_failed_or_interrupted_write_leaves_the_old_files_whole(tmp_path, capsys, monkeypatch):
    first, second = jsonl(tmp_path / "a" / "quiz.jsonl", ROWS), jsonl(tmp_path / "b" / "quiz.jsonl", OTHER)
    out = tmp_path / "out"
    assert stapo_main(["data", *custom(first, out)]) == 0
    capsys.readouterr()
    written = snapshot(out)

    def half_then(error):
        def to_parquet(self, path, *args, **kwargs):
            Path(path).write_bytes(b"PAR1half")  # a part of the file is on disk when the run stops
            raise error
        return to_parquet

    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_then(KeyboardInterrupt()))
    assert stapo_main(["data", *custom(second, out, "--force")]) == 130  # Ctrl-C: stapo's exit code for it
    assert snapshot(out) == written  # the three old files, byte for byte, and no temporary
    monkeypatch.setattr(pd.DataFrame, "to_parquet",
                        half_then(OSError(errno.ENOSPC, "No space left on device", str(out / ".train.tmp"))))
    assert refusal(capsys, custom(second, out, "--force")) == (
        f"{out / '.train.tmp'}: cannot write (No space left on device)")
    assert snapshot(out) == written
    assert refusal(capsys, custom(second, tmp_path / "fresh")).endswith("cannot write (No space left on device)")
    assert snapshot(tmp_path / "fresh") == {}


def test_a_run_killed_while_writing_leaves_no_temporary_file_after_the_next_run(tmp_path, capsys):
    """A kill runs no ``finally``: the killed writer's temporaries (this host's, its process gone) are removed by the
    next run of the split, even one that is then refused; a live writer's and another host's are left."""
    import socket
    import subprocess

    out = tmp_path / "out"
    killed = ("import os, pathlib, sys\n"
              "from stapo.data.outputs import split_files, write_together\n"
              "def die(tmp):\n    tmp.write_bytes(b'half')\n    os._exit(9)\n"
              "write_together({path: die for path in split_files(pathlib.Path(sys.argv[1]), 'train')})\n")
    assert subprocess.run([sys.executable, "-c", killed, str(out)], check=False, timeout=120).returncode == 9
    (left,) = out.glob(".train.parquet.*.tmp")
    live = out / f".train.skipped.jsonl.{socket.gethostname()}-{os.getpid()}.0000.tmp"
    other_host = out / ".train.summary.json.elsewhere-1.0000.tmp"
    live.write_bytes(b"x")
    other_host.write_bytes(b"x")
    (out / "train.parquet").write_bytes(b"mine")  # the next run is refused (no --force), and cleans all the same
    source = jsonl(tmp_path / "quiz.jsonl", ROWS)
    assert "already exist(s)" in refusal(capsys, custom(source, out))
    assert not left.exists() and live.exists() and other_host.exists()
    assert stapo_main(["data", *custom(source, out, "--force")]) == 0
    assert sorted(p.name for p in out.glob(".*.tmp")) == sorted([live.name, other_host.name])
