"""A custom weight rule's down-weighted tokens are logged as the keep-mask rule's silenced ones are: the same
records (token, context, p, H) in their own file, each with its weight, from the weight the workers folded."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from stapo.algorithm.custom_rule import CustomRule
from stapo.algorithm.masks import MaskSettings, get_token_mask
from stapo.spurious_log import DOWNWEIGHTED_NAME, LOG_NAME, read_records
from stapo.verl_plugin.training.diagnostic_outputs import GridAndSample, SpuriousTokenLog
from stapo.verl_plugin.training.driver_diagnostics import DriverDiagnostics, RoundTripResult, StepPlan, _Clock
from tests.integration.jagged_rows import response_rows


class _Ids:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def _halve_improbable(log_prob, response_mask, **_):
    """Half the weight of every token with p < 0.01, 1 elsewhere."""
    return torch.where(response_mask & (log_prob.exp() < 0.01), 0.5, 1.0)


def _diagnostics(run_dir, name: str) -> DriverDiagnostics:
    config = {"run_dir": str(run_dir), "spurious_log": {"every": 1, "max_tokens": 1000, "context": 2}}
    return DriverDiagnostics(MaskSettings(token_mask=name), get_token_mask(name), GridAndSample.from_config(config),
                             SpuriousTokenLog.from_config(config), tokenizer=_Ids())


def test_a_weight_rules_downweighted_tokens_are_logged_with_their_weight(tmp_path):
    CustomRule(_halve_improbable, "custom:halve", "weight", where="halve.py:1 (halve)").register()
    batch = response_rows(12, 0, max_len=60, specials=(1, 2, 3), low_share=0.1)
    data = TensorDict({key: torch.nested.as_nested_tensor(rows, layout=torch.jagged) for key, rows in batch.items()
                       if key != "responses"}, batch_size=12)
    driver = _diagnostics(tmp_path, "custom:halve")
    assert driver.downweights and not driver.silences and driver.plan(1).log_tokens
    driver.diagnose(1, StepPlan(False, False, True), data, RoundTripResult(), _Clock({}),
                    lambda rows: [batch["responses"][r] for r in rows])
    records = read_records(tmp_path / DOWNWEIGHTED_NAME)
    expected = [(row, position) for row in range(12) for position in range(len(batch["response_mask"][row]))
                if batch["response_mask"][row][position] and batch["old_log_probs"][row][position].exp() < 0.01]
    assert [(r["sample"], r["position"]) for r in records] == expected and expected
    assert {r["weight"] for r in records} == {0.5} and all(r["prob"] < 0.01 for r in records)
    assert all(r["token"] == str(int(batch["responses"][r["sample"]][r["position"]])) for r in records)
    assert not (tmp_path / LOG_NAME).exists()  # nothing silenced: the silenced-token log stays empty


def test_a_builtin_weight_writes_no_downweighted_log(tmp_path):
    assert not _diagnostics(tmp_path, "taco").downweights
