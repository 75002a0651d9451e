"""`stapo data prepare custom`: a user's JSON / JSONL / parquet / CSV file into rows verl's own loader accepts.

The same raw rows are written in each format by pandas / the json module (not by the code under test), and
the rows expected out of them are spelt out here by hand. verl's real ``RLHFDataset`` loads the written
parquet with the tokenizer of the project's local test model (``stapo://tiny``, built on this machine, no
download) and its chat template renders each prompt. Refusals are checked as a user sees them: one line on
stderr, exit code 2, nothing on stdout. The command of recipe/stapo/examples/README.md is run as written,
and the row it writes is the one that README shows.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from stapo.cli import main as stapo_main
from stapo.data.cli import main as data_main
from stapo.data.custom import prepare_custom
from stapo.data.readers import DataError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "recipe" / "stapo" / "examples"
SYSTEM = "You are terse."
TEMPLATE = "Q: {question}\nAnswer in \\boxed{}."
RAW = [
    {"q": "What is 2 + 3?", "a": "5", "note": "easy"},
    {"q": 'A "quoted", comma\nsecond line', "a": "7", "note": None},
    {"q": "", "a": "1", "note": None},  # no question: skipped
    {"q": "What is 4 * 4?", "a": "", "note": None},  # no answer: skipped
    {"q": "What is 10 / 4?", "a": "2.5", "note": None},
]
USABLE = [(1, "What is 2 + 3?", "5"), (2, 'A "quoted", comma\nsecond line', "7"), (5, "What is 10 / 4?", "2.5")]
SKIPPED = [(3, "missing question"), (4, "missing or ambiguous answer")]


def write_as(path: Path, rows: list[dict]) -> Path:
    frame = pd.DataFrame(rows)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    elif path.suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    return path


def expected_row(number: int, question: str, answer: str, index: int, source: str, split: str = "train") -> dict:
    user = "Q: " + question + "\nAnswer in \\boxed{}."
    return {
        "data_source": source,
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "source_row": number},
    }


def plain(value):
    """A parquet value as plain Python (numpy arrays of dicts -> lists)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def written_rows(path: str | Path) -> list[dict]:
    return [{key: plain(value) for key, value in row.items()} for row in pd.read_parquet(path).to_dict("records")]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from stapo.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


def verl_dataset(path: Path, tokenizer, cache: Path, monkeypatch):
    """verl's own RL dataset over ``path``, with its over-long-prompt filter on (it drops a row whose chat
    template fails to render, so a row lost there shows as a shorter dataset). The Arrow copy that
    ``datasets`` makes of the file goes to ``cache``, not the user's cache."""
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "cache_dir": str(cache)})
    return RLHFDataset(str(path), tokenizer, config)


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet", ".csv"])
def test_each_format_becomes_rows_verls_loader_and_chat_template_accept(tmp_path, tokenizer, suffix, monkeypatch):
    source = write_as(tmp_path / f"quiz{suffix}", RAW)
    summary = prepare_custom(source, tmp_path / "out", "q", "a", system_prompt=SYSTEM, template=TEMPLATE)
    expected = [expected_row(n, q, a, i, "quiz") for i, (n, q, a) in enumerate(USABLE)]
    assert summary["output"] == str(tmp_path / "out" / "train.parquet")
    assert written_rows(summary["output"]) == expected
    assert (summary["rows_in"], summary["rows_out"]) == (5, 3)
    assert summary["skipped"] == {"missing question": 1, "missing or ambiguous answer": 1}
    skipped = [json.loads(line) for line in (tmp_path / "out" / "train.skipped.jsonl").read_text().splitlines()]
    assert [(s["row"], s["reason"]) for s in skipped] == SKIPPED and {s["file"] for s in skipped} == {str(source)}
    assert json.loads((tmp_path / "out" / "train.summary.json").read_text()) == summary

    dataset = verl_dataset(Path(summary["output"]), tokenizer, tmp_path / "cache", monkeypatch)
    assert len(dataset) == len(expected)
    for index, row in enumerate(expected):
        item = dataset[index]
        assert item["raw_prompt"] == row["prompt"] and item["data_source"] == "quiz"
        assert item["reward_model"]["ground_truth"] == row["reward_model"]["ground_truth"]
        assert item["index"] == index
        # what verl's agent loop does with the messages before generation
        text = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
        assert text.index(SYSTEM) < text.index(row["prompt"][1]["content"])
        ids = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True)
        assert tokenizer.decode(ids if isinstance(ids, list) else ids["input_ids"]) == text


def test_without_template_or_system_prompt_the_user_turn_is_the_question(tmp_path):
    source = write_as(tmp_path / "quiz.jsonl", RAW)
    summary = prepare_custom(source, tmp_path / "out", "q", "a", split="test", data_source="my/quiz")
    rows = written_rows(summary["output"])
    assert Path(summary["output"]).name == "test.parquet"
    assert [row["prompt"] for row in rows] == [[{"role": "user", "content": q}] for _, q, _ in USABLE]
    assert {row["data_source"] for row in rows} == {"my/quiz"}
    assert [row["extra_info"]["split"] for row in rows] == ["test"] * 3


def test_json_shapes_numbers_and_bad_rows_are_read_and_counted(tmp_path):
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps([{"q": "1+1?", "a": 2}, "not an object", {"q": "2+2?", "a": [4]},
                                  {"q": "3+3?", "a": [6, 7]}, {"q": "0.5+0.5?", "a": 1.0}]))
    summary = prepare_custom(listed, tmp_path / "a", "q", "a")
    assert [row["reward_model"]["ground_truth"] for row in written_rows(summary["output"])] == ["2", "4", "1"]
    assert summary["skipped"] == {"not a JSON object": 1, "missing or ambiguous answer": 1}
    one_object = tmp_path / "one.json"
    one_object.write_text(json.dumps({"q": "5-1?", "a": "4"}, indent=2))
    assert prepare_custom(one_object, tmp_path / "b", "q", "a")["rows_out"] == 1
    lines_named_json = tmp_path / "lines.json"
    lines_named_json.write_text('{"q": "1?", "a": "1"}\n{"q": "2?", "a": "2"}\n')
    assert prepare_custom(lines_named_json, tmp_path / "c", "q", "a")["rows_out"] == 2
    broken = tmp_path / "broken.json"
    broken.write_text('[{"q": "1?", "a": "1"},\n{"q": }]')
    with pytest.raises(DataError, match=r"broken.json: not valid JSON at line 2"):
        prepare_custom(broken, tmp_path / "d", "q", "a")


def test_csv_with_a_byte_order_mark_and_a_multiline_cell(tmp_path):
    source = tmp_path / "sheet.csv"
    source.write_bytes('\ufeffquestion,answer\n"Two\nlines?",3\nplain?,\n'.encode())
    summary = prepare_custom(source, tmp_path / "out", "question", "answer")
    assert [row["prompt"][0]["content"] for row in written_rows(summary["output"])] == ["Two\nlines?"]
    assert summary["skipped"] == {"missing or ambiguous answer": 1}


def test_dedup_limit_and_strict_work_for_custom_files(tmp_path, capsys):
    source = write_as(tmp_path / "quiz.jsonl", [*RAW, RAW[0]])
    args = ["prepare", "custom", "--input", str(source), "--question-field", "q", "--answer-field", "a"]
    assert data_main([*args, "--out", str(tmp_path / "d"), "--dedup"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["rows_out"] == 3 and summary["skipped"]["duplicate question"] == 1
    assert data_main([*args, "--out", str(tmp_path / "l"), "--limit", "2", "--strict"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rows_in"] == 2
    assert data_main([*args, "--out", str(tmp_path / "s"), "--strict"]) == 1
    captured = capsys.readouterr()
    assert "skipped rows" in captured.out and "--strict: rows were skipped" in captured.err


def one_line_refusal(capsys, argv: list[str]) -> str:
    """``stapo data ...`` through the top-level CLI: exit code 2, one line on stderr, nothing on stdout."""
    assert stapo_main(["data", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("stapo data: error: ")
    return captured.err.strip()


def test_refusals_are_one_line_on_stderr(tmp_path, capsys):
    source = write_as(tmp_path / "quiz.jsonl", RAW)
    custom = ["prepare", "custom", "--input", str(source), "--out", str(tmp_path / "o")]
    text = tmp_path / "quiz.txt"
    text.write_text("What is 1 + 1?\n")
    assert one_line_refusal(capsys, ["prepare", "custom", "--input", str(text), "--question-field", "q",
                                     "--answer-field", "a", "--out", str(tmp_path / "o")]).endswith(
        "quiz.txt: unsupported file type '.txt' (allowed: .json, .jsonl, .parquet, .csv)")
    assert one_line_refusal(capsys, [*custom, "--question-field", "problem", "--answer-field", "a"]).endswith(
        "no field --question-field 'problem'; the rows have fields ['a', 'note', 'q']")
    assert "no field --question-field 'Q' or --answer-field 'A'" in one_line_refusal(
        capsys, [*custom, "--question-field", "Q", "--answer-field", "A"])
    assert one_line_refusal(capsys, [*custom, "--question-field", "q", "--answer-field", "a", "--template",
                                     "Answer this: {q}"]).endswith(
        "--template must contain {question} where the question goes, got 'Answer this: {q}'")
    assert "`custom` needs --answer-field F and --out DIR" in one_line_refusal(
        capsys, ["prepare", "custom", "--input", str(source), "--question-field", "q"])
    assert "`custom` needs --input FILE" in one_line_refusal(
        capsys, ["prepare", "custom", "--question-field", "q", "--answer-field", "a", "--out", str(tmp_path)])
    assert "`custom` converts one file; name it alone" in one_line_refusal(
        capsys, ["prepare", "custom", "aime24", *custom[2:], "--question-field", "q", "--answer-field", "a"])
    assert one_line_refusal(capsys, ["prepare", "aime24", "--input", str(source), "--template", "{question}",
                                     "--split", "test"]).endswith(
        "--template, --split apply to `custom` only (the paper's data sets keep the paper's prompt)")
    assert "no such file" in one_line_refusal(
        capsys, ["prepare", "custom", "--input", str(tmp_path / "nope.csv"), "--question-field", "q",
                 "--answer-field", "a", "--out", str(tmp_path / "o")])
    empty = write_as(tmp_path / "empty.jsonl", [{"q": "", "a": ""}])
    assert "no usable row among 1" in one_line_refusal(
        capsys, ["prepare", "custom", "--input", str(empty), "--question-field", "q", "--answer-field", "a",
                 "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # nothing is written by a refused command
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal of a value outside the choices
        data_main([*custom, "--question-field", "q", "--answer-field", "a", "--split", "validation"])
    assert exit_.value.code == 2 and "invalid choice: 'validation'" in capsys.readouterr().err


def test_list_and_help_name_custom(capsys):
    assert data_main(["list"]) == 0
    assert re.search(r"^custom\s+your own --input file", capsys.readouterr().out, flags=re.MULTILINE)
    with pytest.raises(SystemExit):
        data_main(["prepare", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag in ("--question-field", "--answer-field", "--system-prompt", "--template", "--split", "--data-source"):
        assert flag in help_text
    assert "or 'custom' (your own --input)" in help_text


def readme_blocks(lang: str) -> list[str]:
    text = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


def readme_command(start: str) -> list[str]:
    """The README's command that begins with ``start``, as the shell splits it (continuations joined)."""
    for block in readme_blocks("bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.strip().startswith(start):
                return shlex.split(line)
    raise AssertionError(f"no command starting {start!r} in {EXAMPLES / 'README.md'}")


def test_the_readme_command_writes_the_row_the_readme_shows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the README's commands run from the repository root
    argv = readme_command("stapo data prepare custom")
    out = argv.index("--out")
    assert argv[out + 1] == "~/data/my_task"
    argv[out + 1] = str(tmp_path / "my_task")  # the shell expands ~; here a temporary folder
    assert stapo_main(argv[1:]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (summary["rows_in"], summary["rows_out"], summary["skipped"]) == (8, 8, {})
    shown = ast.literal_eval(readme_blocks("python")[0])
    assert written_rows(tmp_path / "my_task" / "train.parquet")[0] == shown
