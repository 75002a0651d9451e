"""Validation at the paper's second decoding (``stapo.val_decodings``): metric names, the tagged batches, the
trainer's swap of loader and dump folder, and the seeded agent loop's request (no trainer; the whole path runs
in tests/e2e/test_paired.py, where the extra pass changes no training number and samples other texts)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.stapo.main_stapo import CONF_DIR
from stapo.eval.core import DECODING
from stapo.eval.val_metrics import benchmark_val_metrics, decoding_key
from stapo.verl_plugin.training.val_decodings import DECODING_FIELD, DecodedBatches, decoded_validation, sampling_of


@pytest.mark.parametrize("key, expected", [
    ("val/average/acc", "val@T0.7/average/acc"),
    ("val-core/stapo/addition/acc/mean@8", "val-core@T0.7/stapo/addition/acc/mean@8"),
    ("val-aux/stapo/addition/has_answer/std@8", "val-aux@T0.7/stapo/addition/has_answer/std@8"),
    ("plain", "plain@T0.7"),
])
def test_decoding_key_tags_the_first_segment(key, expected):
    assert decoding_key(key, "T0.7") == expected


def test_renamed_keys_are_not_read_as_the_first_decoding():
    """A pass's val/average/acc is computed inside the pass, before the renaming: the renamed core keys must not
    feed the first decoding's benchmark mean."""
    renamed = {decoding_key("val-core/stapo/addition/acc/mean@8", "T0.7"): 0.9}
    assert benchmark_val_metrics({"val-core/stapo/addition/acc/mean@8": 0.3, **renamed}) == {
        "val/addition/acc": 0.3, "val/average/acc": 0.3}


def test_sampling_of_the_paper_settings_and_unknown_names():
    assert sampling_of("T0.7") == {"temperature": 0.7, "top_p": 0.9} == DECODING["T0.7"]
    sampling_of("T0.7")["temperature"] = 5.0  # a copy: the table itself is not changed
    assert DECODING["T0.7"]["temperature"] == 0.7
    with pytest.raises(ValueError, match=r"stapo.val_decodings: unknown decoding 'T0.5'"):
        sampling_of("T0.5")


def test_decoded_batches_tag_every_row_and_keep_the_rest():
    loader = [{"raw_prompt": np.array([["a"], ["b"], ["c"]], dtype=object), "index": np.arange(3)},
              {"raw_prompt": np.array([["d"]], dtype=object), "index": np.arange(3, 4)}]
    batches = list(DecodedBatches(loader, "T0.7"))
    assert len(DecodedBatches(loader, "T0.7")) == 2
    assert [list(b[DECODING_FIELD]) for b in batches] == [["T0.7"] * 3, ["T0.7"]]
    assert all(b[DECODING_FIELD].dtype == object for b in batches)
    assert batches[0]["index"] is loader[0]["index"] and DECODING_FIELD not in loader[0]


class _Trainer:
    def __init__(self, dump_dir):
        self.val_dataloader = ["batch"]
        self.config = OmegaConf.create({"trainer": {"validation_data_dir": dump_dir}})
        OmegaConf.set_struct(self.config, True)


@pytest.mark.parametrize("dump_dir", ["/runs/val", None])
def test_decoded_validation_swaps_loader_and_dump_folder_and_restores_them(dump_dir):
    trainer = _Trainer(dump_dir)
    loader = trainer.val_dataloader
    with pytest.raises(RuntimeError, match="in the pass"):
        with decoded_validation(trainer, "T0.7"):
            assert isinstance(trainer.val_dataloader, DecodedBatches) and trainer.val_dataloader.loader is loader
            assert trainer.config.trainer.validation_data_dir == (f"{dump_dir}/T0.7" if dump_dir else None)
            raise RuntimeError("in the pass")
    assert trainer.val_dataloader is loader
    assert trainer.config.trainer.validation_data_dir == dump_dir


def _rollout_config():
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("stapo_trainer", overrides=["model_preset=testbed", "stapo.val_decodings=[T0.7]"])
    rollout = cfg.actor_rollout_ref.rollout
    OmegaConf.update(rollout, "agent.default_agent_loop", "stapo_seeded")
    return rollout


def test_seeded_loop_sends_the_rows_decoding_with_the_same_seed_and_group(monkeypatch):
    """The loop's request, captured where it leaves for verl's single-turn loop (whose server is not started
    here): the tagged row is sampled at T=0.7 / top-p 0.9 with the untagged row's seed and group."""
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from stapo.verl_plugin.cpu.rollout import GROUP_PARAM
    from stapo.verl_plugin.reproducible.seeded_agent_loop import SeededSingleTurnAgentLoop

    sent = []

    async def capture(self, sampling_params, **kwargs):
        sent.append(sampling_params)

    monkeypatch.setattr(SingleTurnAgentLoop, "run", capture)
    loop = object.__new__(SeededSingleTurnAgentLoop)
    loop.rollout_config = _rollout_config()
    val = loop.rollout_config.val_kwargs
    params = {"temperature": val.temperature, "top_p": val.top_p, "top_k": val.top_k, "repetition_penalty": 1.0}
    row = {"global_steps": 25, "raw_prompt": [{"role": "user", "content": "1+2"}], "index": 3, "uid": "u",
           "session_id": 5}
    asyncio.run(loop.run(dict(params), **row))
    asyncio.run(loop.run(dict(params), **row, **{DECODING_FIELD: "T0.7"}))
    first, second = sent
    assert (first["temperature"], first["top_p"]) == (1.0, 1.0)
    assert (second["temperature"], second["top_p"]) == (0.7, 0.9)
    assert second["seed"] == first["seed"] and second[GROUP_PARAM] == first[GROUP_PARAM]
    assert first[GROUP_PARAM]["size"] == val.n == 8
    assert {k: v for k, v in second.items() if k not in ("temperature", "top_p")} == {
        k: v for k, v in first.items() if k not in ("temperature", "top_p")}
