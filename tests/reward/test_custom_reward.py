"""The reward hook's worked example (recipe/stapo/examples/my_reward.py) through verl 0.9.1's own loader.

The data are written by the README's `stapo data prepare custom` command from the shipped my_task.jsonl;
`stapo check` is run with the README's overrides (the paper's 8B preset: the recipe's real composition and
every check before Ray); the function is then loaded from the composed config by verl's
``get_custom_reward_fn`` (what verl's reward workers call) and, through ``load_reward_manager``, scored by
verl's naive reward manager on a tokenised response, as a reward worker does (no Ray: the manager's
``run_single`` is called in this process). The expected scores are written by hand.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from stapo.check import compose_run
from stapo.cli import main as stapo_main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "recipe" / "stapo" / "examples" / "README.md"
# (response, ground truth, score): the last \boxed{} after any </think>, compared after normalisation
RESPONSES = [
    ("17 + 25 = 42, so the answer is \\boxed{42}.", "42", 1.0),
    ("\\boxed{42.0}", "42", 1.0),
    ("\\boxed{$42$}", "42", 1.0),
    ("<think>maybe \\boxed{41}</think> so \\boxed{42}", "42", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{41}", "42", 0.0),
    ("\\boxed{42} no, \\boxed{43}", "42", 0.0),
    ("the answer is 42", "42", 0.0),
    ("<think>it is \\boxed{42}", "42", 0.0),  # still reasoning when cut off: no answer
    ("", "42", 0.0),
    ("\\boxed{}", "", 0.0),  # an empty ground truth matches nothing
]


def readme_command(start: str, home: Path) -> list[str]:
    """The README's command beginning with ``start``, continuations joined, ``~``/``$HOME``/``$PWD`` expanded
    as the shell would (HOME: a temporary folder; PWD: the repository root)."""
    text = README.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith(start):
                line = line.replace("~/", f"{home}/").replace("$HOME", str(home)).replace("$PWD", str(REPO))
                return shlex.split(line)
    raise AssertionError(f"no command starting {start!r} in {README}")


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """(the overrides of the README's `stapo check`, run to OK, after its `stapo data prepare custom`)."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        patch.delenv("HF_HUB_OFFLINE", raising=False)  # the preset's hub id is only named, never fetched
        assert stapo_main(readme_command("stapo data prepare custom", home)[1:]) == 0
        check = readme_command("stapo check", home)
        assert stapo_main(check[1:]) == 0
    return check[2:], home / "data" / "my_task" / "train.parquet"


def custom_reward_fn(overrides: list[str]):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    return get_custom_reward_fn(compose_run(overrides))


def test_stapo_check_accepts_the_prepared_file_and_verl_loads_the_example(checked):
    overrides, parquet = checked
    assert f"data.train_files={parquet}" in overrides
    assert f"reward.custom_reward_function.path={REPO}/recipe/stapo/examples/my_reward.py" in overrides
    compute_score = custom_reward_fn(overrides)
    for response, truth, score in RESPONSES:
        # the keywords verl's reward manager passes (verl/experimental/reward_loop/reward_manager/naive.py)
        result = compute_score(data_source="my_task", solution_str=response, ground_truth=truth,
                               extra_info={"index": 0, "num_turns": 2, "rollout_reward_scores": {}})
        assert result == {"score": score, "acc": score}, (response, truth)


def test_reward_kwargs_reach_the_function_as_keywords(checked):
    overrides, _ = checked
    compute_score = custom_reward_fn([*overrides, "+reward.custom_reward_function.reward_kwargs.format_score=0.1"])
    scores = {response: compute_score(data_source="my_task", solution_str=response, ground_truth=truth,
                                      extra_info={})["score"] for response, truth, _ in RESPONSES}
    assert scores["\\boxed{41}"] == 0.1 and scores["\\boxed{42} no, \\boxed{43}"] == 0.1
    assert scores["the answer is 42"] == 0.0 and scores["\\boxed{42.0}"] == 1.0


def test_verls_reward_manager_scores_the_prepared_rows_with_the_example(checked):
    import pandas as pd
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    from stapo.models.tiny import build_tiny_model

    overrides, parquet = checked
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    manager = load_reward_manager(compose_run(overrides), tokenizer)
    rows = pd.read_parquet(parquet).to_dict("records")
    answers = [json.loads(line)["answer"] for line in (README.parent / "my_task.jsonl").read_text().splitlines()]
    assert [row["reward_model"]["ground_truth"] for row in rows] == answers
    for row, answer in zip(rows, answers, strict=True):
        for response, score in ((f"So it is \\boxed{{{answer}}}.", 1.0), (f"\\boxed{{{answer}1}}", 0.0),
                                (answer, 0.0)):
            prompt = tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=True)
            prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
            reply = tokenizer.encode(response) + [tokenizer.eos_token_id]
            data = DataProto.from_dict(
                tensors={"prompts": torch.tensor([prompt]), "responses": torch.tensor([reply]),
                         "attention_mask": torch.ones(1, len(prompt) + len(reply), dtype=torch.long)},
                non_tensors={key: np.array([row[key]], dtype=object)
                             for key in ("data_source", "reward_model", "extra_info")},
            )
            result = manager.loop.run_until_complete(manager.run_single(data))
            assert result == {"reward_score": score, "reward_extra_info": {"score": score, "acc": score}}, response
