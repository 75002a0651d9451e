"""A checkpoint folder belongs to the run that saved into it (stapo/verl_plugin/preflight/checkpoint_identity.py),
and every folder of a run is one absolute path (stapo/verl_plugin/preflight/run_paths.py).

Real Hydra composition of the recipe (``stapo.check.compose_run``); the checkpoint folders are laid out as verl
0.9.1 writes them (``global_step_N/``, then ``latest_checkpointed_iteration.txt``) in a temporary folder, and a
run's saves go through the trainer's own record calls (``begin_save`` before verl writes, ``end_save`` after its
tracker), so a kill can be placed between any two of them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError, refusal_line
from stapo.check import check_run, compose_run
from stapo.config_dir import folder_name
from stapo.verl_plugin.preflight.checkpoint_identity import (
    IDENTITY_FILE,
    RESUMABLE,
    begin_save,
    check_checkpoint_identity,
    driver_view,
    end_save,
    folder_to_resume,
    hand_to_trainer,
    handed_identity,
    run_identity,
)
from stapo.verl_plugin.preflight.run_paths import absolute_path, settle_run_paths

LR = "actor_rollout_ref.actor.optim.lr"
MODEL = "actor_rollout_ref.model.path"
RULE = Path(__file__).resolve().parents[2] / "recipe" / "stapo" / "examples" / "s2t_rule.py"
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n    return 0.0\n"


def run(folder, *overrides: str, preset: str = "qwen3_8b"):
    return compose_run([f"model_preset={preset}", f"trainer.default_local_dir={folder}", *overrides])


def handed(config):
    """The config as the driver hands it to verl, with the run's identity for the trainer's saves."""
    view = driver_view(config)
    hand_to_trainer(view, run_identity(view))
    return view


def verl_saves(folder: Path, step: int) -> None:
    """What verl's trainer leaves after saving ``step``: the step's folder, then the tracker naming it."""
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def train(config, *steps: int) -> None:
    """A run that saves ``steps`` the way the trainer does (``STAPOTrainer._save_checkpoint``)."""
    view = handed(config)
    folder = Path(view.trainer.default_local_dir)
    for step in steps:
        begin_save(view, step)
        verl_saves(folder, step)
        end_save(view, step)


def refusal(config) -> str:
    with pytest.raises(STAPOConfigError) as error:
        check_checkpoint_identity(config)
    return str(error.value)


# --- the run's folders ---------------------------------------------------------------------------------------------


def test_the_default_folder_is_named_after_the_model_too():
    """Without a run folder, verl's default (checkpoints/<project>/<experiment>) plus the model's last path
    component, sanitised: two models of a preset never share it."""
    assert compose_run(["model_preset=qwen3_8b"]).trainer.default_local_dir == (
        "checkpoints/stapo/qwen3_8b-stapo-Qwen3-8B-Base")
    other = compose_run(["model_preset=qwen3_8b", "algo=grpo", f"{MODEL}=/models/my org/run 3/"])
    assert other.trainer.default_local_dir == "checkpoints/stapo/qwen3_8b-grpo-run_3"
    assert compose_run(["model_preset=tiny"]).trainer.default_local_dir == "checkpoints/stapo/tiny-stapo-tiny"
    assert run("/shared/ckpt/mine").trainer.default_local_dir == "/shared/ckpt/mine"  # given: kept as given
    for path, name in [("Qwen/Qwen3-14B-Base", "Qwen3-14B-Base"), ("stapo://smollm2", "smollm2"),
                       ("hdfs://nn/models/m@v2", "m_v2"), ("/", "model"), ("~/..", "model")]:
        assert folder_name(path) == name


def test_the_checkpoints_live_in_the_run_folder_so_two_run_folders_never_share_them(tmp_path, monkeypatch):
    """The default folder depended only on preset and algorithm: two runs with their own stapo.run_dir (the
    README's two commands one after the other) shared it, and the second was refused. A run folder holds its
    checkpoints; a folder given on purpose stays where it was given."""
    monkeypatch.chdir(tmp_path)
    first, second = (compose_run(["model_preset=tiny", f"stapo.run_dir=runs/{name}"]) for name in ("a", "b"))
    for config in (first, second):
        settle_run_paths(config)
    assert first.trainer.default_local_dir == str(tmp_path / "runs/a/checkpoints")
    assert second.trainer.default_local_dir == str(tmp_path / "runs/b/checkpoints")
    assert first.stapo.run_dir == str(tmp_path / "runs/a")
    given = compose_run(["model_preset=tiny", "stapo.run_dir=runs/a", "trainer.default_local_dir=/shared/ckpt"])
    assert given.trainer.default_local_dir == "/shared/ckpt"


def test_the_checkpoint_folder_is_settled_from_the_model_path_as_given(tmp_path, monkeypatch):
    """The folder was an interpolation of the model path: the driver checked it with ``stapo://tiny`` and verl
    saved after the path had become the model's cache folder, into another folder. Settled first, it stays."""
    monkeypatch.chdir(tmp_path)
    config = compose_run(["model_preset=tiny"])
    unsettled = config.copy()
    OmegaConf.update(unsettled, MODEL, "/cache/tiny-qwen3-0123")
    assert unsettled.trainer.default_local_dir == "checkpoints/stapo/tiny-stapo-tiny-qwen3-0123"  # what verl saw
    settled = str(tmp_path / "checkpoints/stapo/tiny-stapo-tiny")
    assert f"trainer.default_local_dir={settled}" in settle_run_paths(config)
    OmegaConf.update(config, MODEL, "/cache/tiny-qwen3-0123")
    assert config.trainer.default_local_dir == settled


def test_a_relative_folder_is_made_absolute_once_against_the_job_s_working_folder(tmp_path, monkeypatch):
    """verl's TaskRunner made a relative folder absolute against its own working folder (the head's, on a joined
    cluster) while the driver used its own: the record went to one, the checkpoint to the other. The driver
    settles each folder of the run against the job's working folder; every process is handed that path."""
    monkeypatch.chdir(tmp_path)
    config = run("ckpt/mine", "trainer.resume_from_path=ckpt/mine/global_step_2", "trainer.rollout_data_dir='~/r'",
                 "trainer.validation_data_dir=hdfs://nn/v")
    settle_run_paths(config)
    assert config.trainer.default_local_dir == str(tmp_path / "ckpt/mine")
    assert config.trainer.resume_from_path == str(tmp_path / "ckpt/mine/global_step_2")
    assert config.trainer.rollout_data_dir == str(Path.home() / "r")
    assert config.trainer.validation_data_dir == "hdfs://nn/v"  # a URL as given
    assert settle_run_paths(config) == []  # once: settled paths stay
    assert absolute_path("a/../b", cwd="/job") == "/job/b" and absolute_path("/x/./y", cwd="/job") == "/x/y"
    # the guard reads the folder verl will: a checkpoint there is found whichever folder the check runs from
    verl_saves(tmp_path / "ckpt/mine", 2)
    monkeypatch.chdir(tmp_path / "ckpt")
    assert folder_to_resume(config) == (tmp_path / "ckpt/mine", 2)


# --- the identity ------------------------------------------------------------------------------------------------


def test_the_same_run_resumes_its_own_checkpoint_with_more_steps(tmp_path):
    """A resume after a kill, or asked for more steps, epochs, another save or validation frequency, another
    cluster shape or logger: the same run, which the named list says, each with its reason."""
    folder = tmp_path / "ckpt"
    first = run(folder, "trainer.total_training_steps=4")
    assert check_checkpoint_identity(first) is None  # nothing to resume
    train(first, 2)
    again = run(folder, "trainer.total_training_steps=40", "trainer.total_epochs=3", "trainer.save_freq=5",
                "trainer.test_freq=5", "trainer.nnodes=2", "trainer.logger=[console,tensorboard]",
                f"stapo.run_dir={tmp_path}/elsewhere", "trainer.experiment_name=renamed")
    assert check_checkpoint_identity(again) == (
        f"checkpoints: resumes {folder}/global_step_2, saved by this run ({IDENTITY_FILE})")
    assert all(reason and not reason.endswith(".") for reason in RESUMABLE.values())
    # stapo check --no-paths (a cluster's config on a laptop): the folder is not read
    assert not [note for note in check_run(again, paths=False) if note.startswith("checkpoints")]


@pytest.mark.parametrize("override, key", [
    (f"{LR}=2e-6", LR),
    (f"{MODEL}=Qwen/Qwen3-1.7B-Base", MODEL),
    ("data.train_files=/data/other.parquet", "data.train_files"),
    ("data.val_files=/data/other.parquet", "data.val_files"),
    ("algo=grpo", "actor_rollout_ref.actor.policy_loss.token_mask"),
    ("actor_rollout_ref.actor.policy_loss.tau_p=0.005", "actor_rollout_ref.actor.policy_loss.tau_p"),
    ("data.max_response_length=4096", "data.max_response_length"),
    ("actor_rollout_ref.rollout.n=16", "actor_rollout_ref.rollout.n"),
    ("data.seed=7", "data.seed"),
    # beyond any list of what matters: everything of the config is the run
    ("+reward.custom_reward_function.reward_kwargs.scale=100", "reward.custom_reward_function.reward_kwargs.scale"),
    ("actor_rollout_ref.actor.grad_clip=1000", "actor_rollout_ref.actor.grad_clip"),
    ("algorithm.kl_ctrl.kl_coef=0.5", "algorithm.kl_ctrl.kl_coef"),
])
def test_another_run_s_checkpoint_is_refused_naming_each_key_on_a_line(tmp_path, override, key):
    folder = tmp_path / "ckpt"
    train(run(folder), 20)
    message = refusal(run(folder, override))
    head, *lines = message.splitlines()
    assert head.startswith(f"trainer.default_local_dir={folder} holds checkpoints of another run, which "
                           "trainer.resume_mode=auto would resume (global_step_20); ")
    assert head.endswith("or stapo.resume_other_run=true to resume it on purpose; it differs in:")
    assert any(line.startswith(f"  {key}: ") for line in lines), lines
    assert all(len(line) < 200 for line in lines)  # values truncated, no dumps of a whole section
    assert refusal_line(STAPOConfigError(message)).count("\n") == 0  # an ordinary refusal stays one line


def test_files_edited_in_place_are_another_run(tmp_path, monkeypatch):
    """A rule, a reward file or a local model's config edited in place kept its path: the run resumed as "written
    by this run". Each file's sha256 is the run's; a relative rule path is recorded as the absolute file it
    names, so the same words from another folder are another file."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(RULE, tmp_path / "rule.py")
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"hidden_size": 8}')
    overrides = ("stapo.custom_rule.path=rule.py", "stapo.custom_rule.name=s2t_rule",
                 f"reward.custom_reward_function.path={tmp_path}/reward.py",
                 "reward.custom_reward_function.name=compute_score", f"{MODEL}={tmp_path}/model")
    folder = tmp_path / "ckpt"
    train(run(folder, *overrides), 2)
    assert "saved by this run" in check_checkpoint_identity(run(folder, *overrides))
    recorded = json.loads((folder / IDENTITY_FILE).read_text())["identity"]["files"]
    assert {str(tmp_path / name) for name in ("rule.py", "reward.py", "model/config.json")} <= set(recorded)
    for name, edit in [("rule.py", "\n# tuned\n"), ("reward.py", "\nSCALE = 100\n"), ("model/config.json", " ")]:
        original = (tmp_path / name).read_text()
        (tmp_path / name).write_text(original + edit)
        assert f"\n  file {tmp_path / name}: " in refusal(run(folder, *overrides))
        (tmp_path / name).write_text(original)
    # the same relative rule path from another folder: another file
    (tmp_path / "other").mkdir()
    shutil.copy(RULE, tmp_path / "other" / "rule.py")
    (tmp_path / "other" / "rule.py").write_text(RULE.read_text() + "\n# mine\n")
    monkeypatch.chdir(tmp_path / "other")
    assert f"\n  file {tmp_path / 'other' / 'rule.py'}: (not set) -> " in refusal(run(folder, *overrides))


def test_rerunning_one_s_own_rule_with_more_steps_resumes_it(tmp_path):
    """The guard compared the recorded ``custom:NAME`` with the preset's rule, read before the user's rule was
    filled in, and refused the README's own-rule command run again with more steps, printing the whole loss
    config twice. The identity is the config the run hands to verl, the rule in place."""
    folder = tmp_path / "ckpt"
    mine = ("stapo.custom_rule.path=" + str(RULE), "stapo.custom_rule.name=s2t_rule")
    train(run(folder, "trainer.total_training_steps=2", *mine), 2)
    recorded = json.loads((folder / IDENTITY_FILE).read_text())["identity"]["config"]
    assert recorded["actor_rollout_ref.actor.policy_loss.token_mask"] == "custom:s2t_rule"
    assert "saved by this run" in check_checkpoint_identity(run(folder, "trainer.total_training_steps=4", *mine))
    message = refusal(run(folder, "trainer.total_training_steps=4"))  # the preset's rule instead
    assert "\n  actor_rollout_ref.actor.policy_loss.token_mask: 'custom:s2t_rule' -> 'stapo'" in message
    assert len(message) < 1500


def test_the_driver_hands_the_trainer_the_identity_it_checked(tmp_path):
    """The trainer writes what the driver checked, not its own reading of a config verl has changed since."""
    view = handed(run(tmp_path / "ckpt"))
    assert handed_identity(view) == run_identity(driver_view(run(tmp_path / "ckpt")))
    assert "stapo.checkpoint_record" not in handed_identity(view)["config"]


# --- the record: written by the run that saves, agreeing with the checkpoint whenever it is killed --------------------


def test_a_fresh_start_in_another_run_s_folder_leaves_its_record_until_it_saves(tmp_path):
    """``trainer.resume_mode=disable`` rewrote the record before anything was saved: when that run died before its
    first save, the next ``auto`` run resumed the other run's steps as its own. The driver writes nothing; the
    record changes owner at the new run's first save."""
    folder = tmp_path / "ckpt"
    train(run(folder), 2, 4)
    before = (folder / IDENTITY_FILE).read_bytes()
    fresh = run(folder, f"{LR}=2e-6", "trainer.resume_mode=disable")
    assert folder_to_resume(fresh) is None and check_checkpoint_identity(fresh) is None
    handed(fresh)  # the driver's whole part: it dies before its first save
    assert (folder / IDENTITY_FILE).read_bytes() == before
    assert f"\n  {LR}: 1e-06 -> 2e-06" in refusal(run(folder, f"{LR}=2e-6"))
    assert "saved by this run" in check_checkpoint_identity(run(folder))
    # it saves: from then on the folder is the new run's, the old one listed as earlier
    train(fresh, 1)
    record = json.loads((folder / IDENTITY_FILE).read_text())
    assert record["steps"] == [1] and record["earlier"][0]["steps"] == [2, 4]
    assert "saved by this run" in check_checkpoint_identity(run(folder, f"{LR}=2e-6"))
    assert f"\n  {LR}: 2e-06 -> 1e-06" in refusal(run(folder))


def test_a_run_killed_during_a_save_resumes_what_the_record_and_checkpoint_agree_on(tmp_path):
    """Killed after its record marked the step and before verl's tracker: the previous step, its own; killed after
    the tracker and before the step was listed: the new step, its own."""
    folder = tmp_path / "ckpt"
    config = run(folder)
    train(config, 2)
    view = handed(config)
    begin_save(view, 4)
    (folder / "global_step_4" / "actor").mkdir(parents=True)  # verl writing; the tracker still names step 2
    own = f"checkpoints: resumes {folder}/global_step_{{}}, saved by this run ({IDENTITY_FILE})"
    assert check_checkpoint_identity(run(folder)) == own.format(2)
    verl_saves(folder, 4)  # the tracker moved; killed before end_save
    assert check_checkpoint_identity(run(folder)) == own.format(4)
    assert f"\n  {LR}: " in refusal(run(folder, f"{LR}=2e-6"))
    # resumed from step 4, its next save killed before verl's tracker: step 4 is still its own
    resumed = handed(run(folder))
    begin_save(resumed, 6)
    assert json.loads((folder / IDENTITY_FILE).read_text())["steps"] == [2, 4]
    assert check_checkpoint_identity(run(folder)).endswith("global_step_4, saved by this run (stapo_run.json)")


def test_a_save_cut_off_over_another_run_s_step_is_refused_to_both(tmp_path):
    """A fresh run saving the step another run's tracker names, killed before verl's tracker: neither run's
    checkpoint can be trusted (the step's folder is half overwritten), and neither resumes it by accident."""
    folder = tmp_path / "ckpt"
    train(run(folder), 2)
    fresh = handed(run(folder, f"{LR}=2e-6", "trainer.resume_mode=disable"))
    begin_save(fresh, 2)
    assert "may be incomplete" in refusal(run(folder, f"{LR}=2e-6"))
    message = refusal(run(folder))
    assert "may be incomplete" in message and message.count("\n") == 1
    # over another step: the old run's step is no longer the recorded run's, the new one has none yet
    other = tmp_path / "other"
    train(run(other), 4)
    begin_save(handed(run(other, f"{LR}=2e-6", "trainer.resume_mode=disable")), 2)
    assert "global_step_4: not saved by the run" in refusal(run(other))


def test_the_override_resumes_it_on_purpose_and_the_folder_records_the_new_run_at_its_save(tmp_path):
    folder = tmp_path / "ckpt"
    train(run(folder), 20)
    changed = run(folder, f"{LR}=2e-6", "stapo.resume_other_run=true")
    note = check_checkpoint_identity(changed)
    assert note == (f"checkpoints: resumes {folder}/global_step_20, saved by another run "
                    "(stapo.resume_other_run=true); the folder records this run from its first save on; it differs "
                    f"in:\n  {LR}: 1e-06 -> 2e-06")
    train(changed, 21)
    assert "saved by this run" in check_checkpoint_identity(run(folder, f"{LR}=2e-6"))
    assert f"{LR}: 2e-06 -> 1e-06" in refusal(run(folder))


def test_stapo_check_refuses_it_and_resume_mode_decides_which_folder(tmp_path):
    folder = tmp_path / "ckpt"
    generated = f"stapo.synthetic_data_dir={tmp_path / 'data'}"
    train(run(folder, generated, preset="tiny"), 2)
    with pytest.raises(STAPOConfigError, match=r"holds checkpoints of another run.*\n  .*optim.lr: 0.001 -> 0.002"):
        check_run(run(folder, generated, f"{LR}=0.002", preset="tiny"), paths=True)
    # resume_path: the folder holding the named step
    elsewhere = run(tmp_path / "new", generated, f"{LR}=0.002", "trainer.resume_mode=resume_path",
                    f"trainer.resume_from_path={folder}/global_step_2", preset="tiny")
    assert folder_to_resume(elsewhere) == (folder, 2)
    assert "trainer.resume_mode=resume_path would resume" in refusal(elsewhere)


def test_a_folder_without_a_record_is_resumed_with_a_warning_and_adopted(tmp_path):
    """Checkpoints of an earlier version (or of verl's own entry point) carry no record, or a smaller one: refusing
    would stop every such run from resuming, and only a folder named on purpose reaches them."""
    folder = tmp_path / "ckpt"
    verl_saves(folder, 20)
    config = run(folder)
    assert check_checkpoint_identity(config).startswith(f"warning: {folder} holds checkpoints but no {IDENTITY_FILE}")
    (folder / IDENTITY_FILE).write_text(json.dumps({"identity": {LR: 1e-6}, "written": "earlier"}))
    assert f"but an earlier version's {IDENTITY_FILE}" in check_checkpoint_identity(config)
    train(config, 21)
    assert "saved by this run" in check_checkpoint_identity(config)


def test_a_run_that_never_saves_writes_no_record(tmp_path):
    handed(run(tmp_path / "ckpt", "trainer.save_freq=-1"))
    assert not (tmp_path / "ckpt").exists()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / IDENTITY_FILE).write_text("{")
    verl_saves(tmp_path / "ckpt", 1)
    with pytest.raises(STAPOConfigError, match="unreadable .*delete it to adopt the folder"):
        check_checkpoint_identity(run(tmp_path / "ckpt"))
