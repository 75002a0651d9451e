"""A checkpoint folder belongs to its run (stapo/verl_plugin/preflight/checkpoint_identity.py).

Real Hydra composition of the recipe (``stapo.check.compose_run``, with Hydra's runtime choices: the algorithm's
name); the checkpoint folders are laid out as verl 0.9.1 writes them (``latest_checkpointed_iteration.txt`` and
``global_step_N/``), in a temporary folder.
"""

from __future__ import annotations

import json

import pytest

from stapo.algorithm.validation import STAPOConfigError
from stapo.check import check_run, compose_run
from stapo.config_dir import folder_name
from stapo.verl_plugin.preflight.checkpoint_identity import (
    IDENTITY_FILE,
    check_checkpoint_identity,
    folder_to_resume,
    run_identity,
    write_identity,
)

LR = "actor_rollout_ref.actor.optim.lr"
MODEL = "actor_rollout_ref.model.path"


def run(folder, *overrides: str, preset: str = "qwen3_8b"):
    return compose_run([f"model_preset={preset}", f"trainer.default_local_dir={folder}", *overrides])


def save_checkpoint(folder, step: int) -> None:
    """What verl's trainer leaves after saving ``step``: the step's folder and the tracker naming it."""
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_the_default_folder_is_named_after_the_model_too():
    """verl's default (checkpoints/<project>/<experiment>) named only the preset and algorithm: two models of a
    preset shared it. The model's last path component, sanitised, is added."""
    assert compose_run(["model_preset=qwen3_8b"]).trainer.default_local_dir == (
        "checkpoints/stapo/qwen3_8b-stapo-Qwen3-8B-Base")
    other = compose_run(["model_preset=qwen3_8b", "algo=grpo", f"{MODEL}=/models/my org/run 3/"])
    assert other.trainer.default_local_dir == "checkpoints/stapo/qwen3_8b-grpo-run_3"
    assert compose_run(["model_preset=tiny"]).trainer.default_local_dir == "checkpoints/stapo/tiny-stapo-tiny"
    # given: kept as given
    assert run("/shared/ckpt/mine").trainer.default_local_dir == "/shared/ckpt/mine"
    for path, name in [("Qwen/Qwen3-14B-Base", "Qwen3-14B-Base"), ("stapo://smollm2", "smollm2"),
                       ("hdfs://nn/models/m@v2", "m_v2"), ("/", "model"), ("~/..", "model")]:
        assert folder_name(path) == name


def test_the_same_run_resumes_its_own_checkpoint_with_more_steps(tmp_path):
    """A resume after a kill, or asked for more steps, epochs, another save or validation frequency, other
    validation files: the same run."""
    folder = tmp_path / "ckpt"
    first = run(folder, "trainer.total_training_steps=4")
    assert check_checkpoint_identity(first) is None  # nothing to resume
    assert write_identity(first) == f"checkpoints: {folder}, this run recorded in {IDENTITY_FILE}"
    save_checkpoint(folder, 2)
    again = run(folder, "trainer.total_training_steps=40", "trainer.total_epochs=3", "trainer.save_freq=5",
                "trainer.test_freq=5", f"data.val_files=[{tmp_path}/other.parquet]", "trainer.nnodes=2")
    assert check_checkpoint_identity(again) == f"checkpoints: resumes {folder}, written by this run ({IDENTITY_FILE})"
    assert write_identity(again) is None  # unchanged
    # stapo check --no-paths (a cluster's config on a laptop): the folder is not read
    assert not [note for note in check_run(again, paths=False) if note.startswith("checkpoints")]


@pytest.mark.parametrize("override, key", [
    (f"{LR}=2e-6", LR),
    (f"{MODEL}=Qwen/Qwen3-1.7B-Base", MODEL),
    ("data.train_files=/data/other.parquet", "data.train_files"),
    ("algo=grpo", "algo"),
    ("actor_rollout_ref.actor.policy_loss.tau_p=0.005", "actor_rollout_ref.actor.policy_loss"),
    ("data.max_response_length=4096", "data.max_response_length"),
    ("actor_rollout_ref.rollout.n=16", "actor_rollout_ref.rollout.n"),
    ("data.seed=7", "data.seed"),
    ("stapo.custom_rule.name=s2t_rule", "stapo.custom_rule"),
])
def test_another_run_s_checkpoint_is_refused_naming_what_differs(tmp_path, override, key):
    folder = tmp_path / "ckpt"
    write_identity(run(folder))
    save_checkpoint(folder, 20)
    other = run(folder, override)
    with pytest.raises(STAPOConfigError) as error:
        check_checkpoint_identity(other)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"trainer.default_local_dir={folder} holds checkpoints of another run, which "
                              "trainer.resume_mode=auto would resume: ")
    assert f"; {key}: " in message or f": {key}: " in message
    assert message.endswith("or stapo.resume_other_run=true to resume it on purpose")
    recorded = json.loads((folder / IDENTITY_FILE).read_text())["identity"]
    changed = [name for name, value in run_identity(other).items() if recorded[name] != value]
    # only what the override changed (another algorithm also brings its own loss and clip settings)
    assert key in changed and (key == "algo" or changed == [key])


def test_the_override_resumes_it_on_purpose_and_the_folder_records_the_new_run(tmp_path):
    folder = tmp_path / "ckpt"
    write_identity(run(folder))
    save_checkpoint(folder, 20)
    changed = run(folder, f"{LR}=2e-6", "stapo.resume_other_run=true")
    note = check_checkpoint_identity(changed)
    assert note == (f"checkpoints: resumes {folder}, written by another run (stapo.resume_other_run=true): "
                    f"{LR}: 1e-06 -> 2e-06")
    write_identity(changed)
    record = json.loads((folder / IDENTITY_FILE).read_text())
    assert record["identity"][LR] == 2e-6 and record["earlier"][0]["identity"][LR] == 1e-6
    # from now on the changed run is the folder's: resumed without the override, the first one refused
    assert "written by this run" in check_checkpoint_identity(run(folder, f"{LR}=2e-6"))
    with pytest.raises(STAPOConfigError, match=rf"{LR}: 2e-06 -> 1e-06"):
        check_checkpoint_identity(run(folder))


def test_stapo_check_refuses_it_and_resume_mode_decides_which_folder(tmp_path):
    folder = tmp_path / "ckpt"
    write_identity(run(folder, preset="tiny"))
    save_checkpoint(folder, 2)
    generated = f"stapo.synthetic_data_dir={tmp_path / 'data'}"
    with pytest.raises(STAPOConfigError, match=r"holds checkpoints of another run.*optim.lr: 0.001 -> 0.002"):
        check_run(run(folder, generated, f"{LR}=0.002", preset="tiny"), paths=True)
    # a fresh start: nothing is resumed, the record is replaced by the run that will save there
    fresh = run(folder, f"{LR}=0.002", "trainer.resume_mode=disable", preset="tiny")
    assert folder_to_resume(fresh) is None and check_checkpoint_identity(fresh) is None
    # resume_path: the folder holding the named step
    elsewhere = run(tmp_path / "new", f"{LR}=0.002", "trainer.resume_mode=resume_path",
                    f"trainer.resume_from_path={folder}/global_step_2", preset="tiny")
    assert folder_to_resume(elsewhere) == folder
    with pytest.raises(STAPOConfigError, match=r"trainer.resume_mode=resume_path would resume"):
        check_checkpoint_identity(elsewhere)


def test_a_folder_without_a_record_is_resumed_with_a_warning_and_adopted(tmp_path):
    """Checkpoints of an earlier version (or of verl's own entry point) carry no record: refusing would stop every
    such run from resuming, and only a folder named on purpose reaches them (the default name now has the model)."""
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, 20)
    config = run(folder)
    note = check_checkpoint_identity(config)
    assert note.startswith(f"warning: {folder} holds checkpoints but no {IDENTITY_FILE}")
    write_identity(config)
    assert "written by this run" in check_checkpoint_identity(config)


def test_a_run_that_never_saves_writes_no_record(tmp_path):
    assert write_identity(run(tmp_path / "ckpt", "trainer.save_freq=-1")) is None
    assert not (tmp_path / "ckpt").exists()
    (tmp_path / "file").write_text("")
    note = write_identity(run(tmp_path / "file" / "ckpt"))
    assert note.startswith(f"warning: {tmp_path}/file/ckpt/{IDENTITY_FILE} not written")
