"""What `stapo data prepare` says about the rows: oversized rows alike in CSV and JSONL, the right row and line
of a bad byte, an empty file, repeated questions, and a data_source shared by a task's train and test files.

The files are written here by the csv / json modules and pandas (not by the readers under test); the row
and line a message must name are counted here from the bytes written.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from stapo.cli import main as stapo_main
from stapo.data.custom import default_data_source
from stapo.data.prepare import prepare

FIELDS = ["--question-field", "q", "--answer-field", "a"]
LONG = 140_000  # over the csv module's own cell limit (131,072) and the converter's question limit (20,000)


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = stapo_main(["data", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refusal(capsys, argv: list[str]) -> str:
    code, out, err = run(capsys, argv)
    assert (code, out, err.count("\n")) == (2, "", 1), (code, out, err)
    return err.strip().removeprefix("stapo data: error: ")


def custom(source: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "custom", "--input", str(source), *FIELDS, "--out", str(out), *extra]


def write_csv(path: Path, rows: list[dict]) -> Path:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buffer.getvalue(), encoding="utf-8", newline="")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_an_oversized_row_is_skipped_and_counted_alike_in_csv_and_jsonl(tmp_path, capsys):
    rows = [{"q": "What is 1 + 1?", "a": "2", "note": ""},
            {"q": "x" * LONG, "a": "3", "note": ""},  # a question too long to train on
            {"q": "What is 2 + 2?", "a": "4", "note": "n" * LONG},  # a long cell the rows do not use
            {"q": "What is 3 + 3?", "a": "6" * 1_001, "note": ""}]  # an answer too long
    written = {}
    for suffix, write in ((".csv", write_csv), (".jsonl", write_jsonl)):
        source = write(tmp_path / f"big{suffix}", rows)
        code, out, err = run(capsys, custom(source, tmp_path / suffix[1:]))
        assert (code, err) == (0, "")
        summary = json.loads(out.splitlines()[0])
        counts = {"question longer than 20000 characters": 1, "answer longer than 1000 characters": 1}
        assert (summary["rows_in"], summary["rows_out"], summary["skipped"]) == (4, 2, counts)
        assert f"  skipped rows (see {tmp_path / suffix[1:] / 'train'}.skipped.jsonl): {counts}" in out.splitlines()
        skipped = (tmp_path / suffix[1:] / "train.skipped.jsonl").read_text().splitlines()
        assert [json.loads(line)["row"] for line in skipped] == [2, 4]
        written[suffix] = pd.read_parquet(summary["output"]).drop(columns="data_source")
    pd.testing.assert_frame_equal(written[".csv"], written[".jsonl"])


def bad_byte_csv(path: Path, bad_row: int) -> tuple[Path, int]:
    """A CSV whose every 7th question spans three lines (quoted), with a byte 0xff on the second line of row
    ``bad_row``'s question; returns the file and the line that byte is on, counted from the bytes."""
    rows = [{"q": f"Line one of {i}\nline two\nline three" if i % 7 == 0 else f"What is {i} + 1?",
             "a": "" if i == 1500 else str(i + 1)} for i in range(1, bad_row)]
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=["q", "a"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    data = buffer.getvalue().encode() + b'"Bad\nby\xffte\nthree",1\n' + b"What is 0?,0\n"
    path.write_bytes(data)
    return path, data[: data.index(b"\xff")].count(b"\n") + 1


def test_a_bad_byte_is_reported_at_its_row_and_line(tmp_path, capsys):
    source, line = bad_byte_csv(tmp_path / "multi.csv", 2001)
    assert line > 2001 + 2 * (2000 // 7) and source.stat().st_size > 8192 * 4  # rows != lines, many text chunks
    assert refusal(capsys, custom(source, tmp_path / "o")) == (
        f"{source}: row 2001 (line {line}) is not UTF-8 text (byte 0xff at column 3); save the file as UTF-8")

    # the rows before it are numbered as rows too: the row without an answer is row 1500 of the file
    good, _ = bad_byte_csv(tmp_path / "good.csv", 2001)
    good.write_bytes(good.read_bytes().replace(b"\xff", b"y"))
    code, out, _ = run(capsys, custom(good, tmp_path / "g"))
    assert code == 0 and json.loads(out.splitlines()[0])["rows_in"] == 2001 + 1
    skipped = [json.loads(s) for s in (tmp_path / "g" / "train.skipped.jsonl").read_text().splitlines()]
    assert [(s["row"], s["reason"]) for s in skipped] == [(1500, "missing or ambiguous answer")]
    rows = pd.read_parquet(tmp_path / "g" / "train.parquet")
    assert rows["extra_info"].iloc[-2]["source_row"] == 2001
    assert rows["prompt"].iloc[-2][0]["content"] == "Bad\nbyyte\nthree"

    lines = [json.dumps({"q": f"What is {i}?", "a": str(i)}).encode() for i in range(1, 2001)]
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_bytes(b"\n".join([*lines, b'{"q": "caf\xe9?", "a": "1"}', b""]))
    assert refusal(capsys, custom(jsonl, tmp_path / "o")) == (
        f"{jsonl}: row 2001 (line 2001) is not UTF-8 text (byte 0xe9 at column 11); save the file as UTF-8")

    listed = tmp_path / "listed.json"
    text = json.dumps([{"q": f"What is {i}?", "a": str(i)} for i in range(1, 2001)], indent=1).encode()
    listed.write_bytes(text.replace(b"What is 1999?", b"What is \xff?"))
    bad_line = listed.read_bytes()[: listed.read_bytes().index(b"\xff")].count(b"\n") + 1
    assert refusal(capsys, custom(listed, tmp_path / "o")) == (
        f"{listed}: line {bad_line} is not UTF-8 text (byte 0xff); save the file as UTF-8")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet", ".csv"])
def test_an_empty_file_says_so(tmp_path, capsys, suffix):
    empty = tmp_path / f"empty{suffix}"
    empty.write_bytes(b"")
    assert refusal(capsys, custom(empty, tmp_path / "o")) == f"{empty} is empty"
    if suffix != ".parquet":
        empty.write_bytes(b"\xef\xbb\xbf\n  \n\n")  # a byte order mark and blank lines: nothing either
        assert refusal(capsys, custom(empty, tmp_path / "o")) == f"{empty} is empty"
    no_rows = {".json": b"[]", ".jsonl": None, ".csv": b"q,a\n"}.get(suffix)
    if suffix == ".parquet":
        pd.DataFrame({"q": pd.Series(dtype=str), "a": pd.Series(dtype=str)}).to_parquet(empty)
    elif no_rows is not None:
        empty.write_bytes(no_rows)
    if suffix != ".jsonl":
        assert refusal(capsys, custom(empty, tmp_path / "o")) == f"{empty} is empty: it has no rows"
    assert not (tmp_path / "o").exists()


def test_repeated_questions_are_counted_and_dedup_named(tmp_path, capsys):
    rows = [{"q": "What is 1 + 1?", "a": "2"}, {"q": "What is 2 + 2?", "a": "4"},
            {"q": "What  is 1 + 1? ", "a": "2"}, {"q": "What is 1 + 1?", "a": "3"}]
    source = write_jsonl(tmp_path / "quiz.jsonl", rows)
    code, out, _ = run(capsys, custom(source, tmp_path / "kept"))
    summary = json.loads(out.splitlines()[0])
    assert code == 0 and (summary["rows_out"], summary["duplicates"], summary["skipped"]) == (4, 2, {})
    assert "  repeated questions kept: 2 (rows whose question an earlier row has; --dedup drops them)" in out
    code, out, _ = run(capsys, custom(source, tmp_path / "dedup", "--dedup"))
    summary = json.loads(out.splitlines()[0])
    assert (summary["rows_out"], summary["duplicates"], summary["skipped"]) == (2, 0, {"duplicate question": 2})
    assert "repeated questions kept" not in out
    code, out, _ = run(capsys, custom(write_jsonl(tmp_path / "once.jsonl", rows[:2]), tmp_path / "once"))
    assert json.loads(out.splitlines()[0])["duplicates"] == 0 and "repeated questions" not in out
    # the paper's data sets too (DAPO-Math-17k repeats each question ~100 times)
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "dapo_like.jsonl"
    assert prepare("dapo_math_17k", tmp_path / "dapo", fixture)["duplicates"] == 2


def test_the_train_and_test_files_of_a_task_share_a_data_source(tmp_path, capsys):
    cases = {"gsm/train.jsonl": "gsm", "gsm/test.jsonl": "gsm", "quiz/my_task_train.jsonl": "my_task",
             "quiz/my_task-Validation.jsonl": "my_task", "quiz/my_task.dev.jsonl": "my_task",
             "hub/data/test-00000-of-00001.jsonl": "data", "x/my_task.jsonl": "my_task", "x/retrain.jsonl": "retrain"}
    rows = [{"q": "What is 1 + 1?", "a": "2"}]
    for relative, expected in cases.items():
        source = tmp_path / relative
        source.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(source, rows)
        assert default_data_source(source)[0] == expected, relative
    out = tmp_path / "prepared"
    for split in ("train", "test"):
        code, stdout, _ = run(capsys, custom(tmp_path / "gsm" / f"{split}.jsonl", out, "--split", split))
        assert code == 0
        assert json.loads(stdout.splitlines()[0])["data_source"] == "gsm"
        assert stdout.splitlines()[1] == ("  data_source: 'gsm' (from the input's folder; --data-source NAME sets "
                                          "another: give a task's train and test files the same one)")
    assert {tuple(pd.read_parquet(out / f"{s}.parquet")["data_source"]) for s in ("train", "test")} == {("gsm",)}
    code, stdout, _ = run(capsys, custom(tmp_path / "quiz" / "my_task_train.jsonl", tmp_path / "q"))
    assert "from the input file's name without 'train'" in stdout.splitlines()[1]
    code, stdout, _ = run(capsys, custom(tmp_path / "gsm" / "train.jsonl", tmp_path / "n", "--data-source", "mine"))
    summary = json.loads(stdout.splitlines()[0])
    assert (summary["data_source"], summary["data_source_from"]) == ("mine", "--data-source")
    assert "data_source:" not in stdout
