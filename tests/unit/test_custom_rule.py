"""A token rule from a file (stapo.custom_rule): exact against the built-in rules and the float64 loop
references, on every layout the trainer hands a rule, and refused before Ray in one line when it breaks the
contract (docs/algorithm.md section 10).

The example files are the ones recipe/stapo/examples/README.md shows; tests/unit/test_custom_rule_ranks.py runs
them on real gloo ranks and tests/e2e/test_custom_rule_runs.py through the trainer.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from stapo.algorithm.custom_rule import CustomRule, Rows, scope_quantile
from stapo.algorithm.masks import (
    MaskInputs,
    MaskSettings,
    build_token_mask,
    build_token_mask_in_parts,
    finalize_metrics,
    get_token_mask,
)
from stapo.algorithm.validation import STAPOConfigError
from stapo.files import sha256_file
from stapo.verl_plugin.preflight.custom_rule_check import check_rule, synthetic_batch
from stapo.verl_plugin.training.custom_rule import (
    IMPORTS_ENV,
    RULE_ENV,
    RuleSetting,
    apply_to_run,
    register_rule,
)
from tests.reference import reference_spurious, reference_taco_weight

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "recipe" / "stapo" / "examples"
S2T = RuleSetting(str(EXAMPLES / "s2t_rule.py"), "s2t_rule")
TACO = RuleSetting(str(EXAMPLES / "taco_weight.py"), "taco_weight")


def _batch(seed: int, rows: int = 12, length: int = 40, nonfinite: bool = False) -> dict[str, torch.Tensor]:
    """Padded float32 tensors with a tail of improbable tokens, an empty row and mixed advantage signs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    lengths[1] = 0
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    log_prob = -torch.empty(rows, length).exponential_(2.0, generator=g)
    low = torch.rand(rows, length, generator=g) < 0.15
    log_prob[low] = torch.empty(int(low.sum())).uniform_(math.log(1e-6), math.log(3e-3), generator=g)
    entropy = torch.empty(rows, length).exponential_(1.0, generator=g)
    entropy[:, ::7] = entropy[:, 3:4]  # ties
    advantages = torch.randn(rows, 1, generator=g).expand(rows, length).clone()
    advantages[2] = 0.0
    if nonfinite:
        log_prob[3, 0], entropy[4, 1], entropy[5, 2], log_prob[6, 3] = -math.inf, math.nan, math.inf, math.nan
    zero = torch.zeros(())
    return {"response_mask": mask, "log_prob": torch.where(mask, log_prob, zero),
            "entropy": torch.where(mask, entropy, zero), "advantages": torch.where(mask, advantages, zero)}


def _inputs(t: dict, offsets=None) -> MaskInputs:
    return MaskInputs(t["response_mask"], t["advantages"], t["log_prob"], t["entropy"], None, offsets)


def _flat(t: dict) -> tuple[dict, torch.Tensor]:
    """verl's jagged layout as the fold sees it: each row's tokens (its length, padding left out), row-major."""
    lengths = t["response_mask"].sum(1)
    keep = torch.arange(t["response_mask"].shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return {k: v[keep] for k, v in t.items()}, torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])


@pytest.fixture(scope="module")
def rules() -> dict[str, str]:
    """The two example rules, checked and registered as the driver does."""
    return {"s2t": check_rule(S2T).setting.registry_name, "taco": check_rule(TACO).setting.registry_name}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_the_s2t_file_is_the_builtin_mask_and_the_loop_reference(rules, seed, nonfinite):
    t = _batch(seed, nonfinite=nonfinite)
    custom = build_token_mask(_inputs(t), MaskSettings(token_mask=rules["s2t"]))
    builtin = build_token_mask(_inputs(t), MaskSettings(token_mask="stapo"))
    assert torch.equal(custom.drop_response, builtin.drop_response)
    assert torch.equal(custom.drop_count, builtin.drop_count) and custom.weight is None
    nested = {k: v.tolist() for k, v in t.items()}
    spurious, _ = reference_spurious(nested["log_prob"], nested["entropy"], nested["advantages"],
                                     nested["response_mask"], 0.002, 0.75)
    assert custom.drop_response.tolist() == spurious
    assert custom.counts["num_dropped"] == builtin.counts["num_spurious"] > 0
    metrics = finalize_metrics(get_token_mask(rules["s2t"]), custom.counts, custom.stats)
    stapo = finalize_metrics(get_token_mask("stapo"), builtin.counts, builtin.stats)
    assert metrics["mask_ratio"] == stapo["mask_ratio"]
    assert metrics["keep_ratio"] + metrics["mask_ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_the_taco_file_is_the_builtin_weight_and_the_loop_reference(rules, seed, nonfinite):
    t = _batch(seed, nonfinite=nonfinite)
    custom = build_token_mask(_inputs(t), MaskSettings(token_mask=rules["taco"]))
    builtin = build_token_mask(_inputs(t), MaskSettings(token_mask="taco"))
    assert torch.equal(custom.weight, builtin.weight) and custom.weight.dtype == torch.float32
    assert not custom.drop_response.any() and not custom.drop_count.any()
    assert custom.counts == builtin.counts and custom.stats == builtin.stats
    for (i, j) in t["response_mask"].nonzero().tolist():
        want = reference_taco_weight(float(t["log_prob"][i, j]), float(t["entropy"][i, j]),
                                     float(t["advantages"][i, j]), 0.01, 0.9)
        assert float(custom.weight[i, j]) == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert get_token_mask(rules["taco"]).weighted and not get_token_mask(rules["s2t"]).weighted


@pytest.mark.parametrize("name", ["s2t", "taco"])
def test_the_rule_sees_rows_on_the_trainers_flat_layout_and_per_mini_batch(rules, name):
    """The fold hands flat tokens with row bounds: the rule still gets (batch, response_len), and per part (PPO
    mini-batch) its quantile is that part's; both equal the built-in on the same layout bit for bit."""
    t = _batch(7, rows=16)
    flat, offsets = _flat(t)
    builtin_name = {"s2t": "stapo", "taco": "taco"}[name]
    custom = build_token_mask(_inputs(flat, offsets), MaskSettings(token_mask=rules[name]))
    padded = build_token_mask(_inputs(t), MaskSettings(token_mask=rules[name]))
    assert torch.equal(custom.drop_response, padded.drop_response[t["response_mask"].sum(1).unsqueeze(1) >
                                                                   torch.arange(t["response_mask"].shape[1])])
    rows = torch.arange(16) % 3  # three mini-batches, rows interleaved as a shuffled split
    part = torch.repeat_interleave(rows, offsets.diff())
    custom_parts = build_token_mask_in_parts(_inputs(flat, offsets), MaskSettings(token_mask=rules[name]), part, 3)
    builtin_parts = build_token_mask_in_parts(_inputs(flat, offsets), MaskSettings(token_mask=builtin_name), part, 3)
    assert torch.equal(custom_parts.drop_response, builtin_parts.drop_response)
    if name == "taco":
        assert torch.equal(custom_parts.weight, builtin_parts.weight) and custom_parts.counts == builtin_parts.counts
    else:
        assert custom_parts.counts["num_dropped"] == builtin_parts.counts["num_spurious"] > 0


def test_rows_pad_and_unpad_verls_jagged_layout():
    offsets = torch.tensor([0, 3, 3, 7, 8])
    rows = Rows.from_offsets(offsets, "cpu")
    flat = torch.arange(8.0) + 1
    padded = rows.pad(flat)
    assert padded.tolist() == [[1, 2, 3, 0], [0, 0, 0, 0], [4, 5, 6, 7], [8, 0, 0, 0]]
    assert torch.equal(rows.unpad(padded), flat)


def test_the_quantile_helper_is_numpys_over_the_finite_values():
    np = pytest.importorskip("numpy")
    values = torch.tensor([3.0, math.nan, 1.0, math.inf, 2.0, 2.0])
    quantile = scope_quantile(None)
    for q in (0.0, 0.25, 0.75, 1.0):
        assert quantile(values, q) == float(np.quantile(np.array([3.0, 1.0, 2.0, 2.0]), q))
    assert math.isnan(quantile(torch.tensor([]), 0.5))
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\]"):
        quantile(values, 1.5)


# --- refused before Ray: one line, the file, the line, the reason ----------------------------------------------


def _rule_file(tmp_path: Path, body: str, name: str = "rule.py") -> RuleSetting:
    path = tmp_path / name
    path.write_text("import torch\n\n" + textwrap.dedent(body))
    return RuleSetting(str(path), "rule")


REFUSALS = [
    ("def rule(response_mask, **_):\n    return response_mask[:, :-1]\n",
     r"\.py:3 \(rule\): returned shape \(8, 31\), the inputs' shape is \(8, 32\)"),
    ("def rule(response_mask, **_):\n    return response_mask.long()\n",
     r"\.py:3 \(rule\): returned dtype torch.int64"),
    ("def rule(entropy, **_):\n    return entropy * float('nan')\n", r"\.py:3 \(rule\): returned \d+ non-finite"),
    ("def rule(entropy, **_):\n    return entropy - 1.0\n", r"\.py:3 \(rule\): returned \d+ negative weight"),
    ("def rule(entropy, response_mask, **_):\n    entropy.mul_(2)\n    return response_mask\n",
     r"\.py:3 \(rule\): changes its input\(s\) \['entropy'\] in place"),
    ("def rule(response_mask, **_):\n    x = 1\n    return response_mask / 0 + undefined\n",
     r"\.py:5 \(rule\): raised on a synthetic batch of 8 x 32: NameError"),
    ("def rule(response_mask, **_):\n    return None\n", r"\.py:3 \(rule\): returned NoneType, not a tensor"),
    ("def rule(response_mask, tau):\n    return response_mask\n", r"takes a parameter 'tau' that is not passed"),
    ("def rule(entropy, **_):\n    return entropy * 1e6\n",
     r"\.py:3 \(rule\): returned \d+ weight\(s\) above max_weight=10 .*stapo.custom_rule.max_weight raises"),
    ("import sys\ndef rule(response_mask, **_):\n    sys.exit(0)\n",
     r"\.py:5 \(rule\): raised on a synthetic batch of 8 x 32: SystemExit\(0\): it calls sys.exit"),
    ("def rule(response_mask, w=1.0):\n    return response_mask\n",
     r"takes no keyword \['ww'\] \(stapo.custom_rule.kwargs\); the keywords it takes: \['w'\]"),
]


@pytest.mark.parametrize(("body", "message"), REFUSALS)
def test_a_rule_that_breaks_the_contract_is_refused_in_one_line(tmp_path, body, message):
    setting = _rule_file(tmp_path, body, f"r{abs(hash(body))}.py")
    with pytest.raises(STAPOConfigError, match=message) as refused:
        check_rule(RuleSetting(setting.path, setting.name, {"ww": 0.5}) if "w=1.0" in body else setting)
    assert "\n" not in str(refused.value) and str(tmp_path) in str(refused.value)


def test_a_missing_file_a_missing_name_and_an_import_error_are_refused(tmp_path):
    with pytest.raises(STAPOConfigError, match=r"stapo.custom_rule.path=.*/none\.py: no such file"):
        check_rule(RuleSetting(str(tmp_path / "none.py"), "rule"))
    setting = _rule_file(tmp_path, "def other(**_):\n    pass\n", "named.py")
    with pytest.raises(STAPOConfigError, match=r"named\.py: no function 'rule' .*defines \['other'\]"):
        check_rule(setting)
    broken = _rule_file(tmp_path, "import not_a_module_anywhere\n", "broken.py")
    with pytest.raises(STAPOConfigError, match=r"broken\.py:3: cannot import: ModuleNotFoundError"):
        check_rule(broken)
    syntax = _rule_file(tmp_path, "def rule(:\n", "syntax.py")
    with pytest.raises(STAPOConfigError, match=r"syntax\.py:3: cannot import: SyntaxError"):
        check_rule(syntax)


def test_a_rule_returning_bad_weights_at_run_time_is_refused_on_every_rank():
    """After its check, a rule returning another kind or a NaN weight on a real batch fails the fold loudly."""
    calls = []

    def flaky(entropy, **_):
        calls.append(1)
        return entropy * (math.nan if len(calls) > 1 else 1.0)

    CustomRule(flaky, "custom:flaky", "weight", where="flaky.py:1 (flaky)").register()
    t = synthetic_batch()
    build_token_mask(_inputs(t), MaskSettings(token_mask="custom:flaky"))
    with pytest.raises(ValueError, match=r"flaky\.py:1 \(flaky\): returned \d+ non-finite"):
        build_token_mask(_inputs(t), MaskSettings(token_mask="custom:flaky"))


def test_the_synthetic_batch_exercises_s2t(rules):
    t = synthetic_batch()
    built = build_token_mask(_inputs(t), MaskSettings(token_mask="stapo"))
    assert built.counts["num_spurious"] > 0 and built.counts["empty_responses"] == 1
    assert torch.equal(synthetic_batch()["entropy"], t["entropy"])  # the same batch every time


# --- every process: the driver's settings reach a fresh process through the job's environment ------------------


def test_apply_to_run_names_the_rule_and_hands_the_files_to_every_process(monkeypatch):
    from omegaconf import OmegaConf

    for name in (RULE_ENV, IMPORTS_ENV):  # recorded as absent: apply_to_run's os.environ writes are undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    config = OmegaConf.create({
        "stapo": {"custom_rule": {"path": S2T.path, "name": "s2t_rule", "kwargs": {"tau_p": 0.005}},
                  "import_files": [str(EXAMPLES / "my_loss.py")]},
        "actor_rollout_ref": {"actor": {"policy_loss": {"token_mask": "stapo"}}},
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"OTHER": "1"}}}},
    })
    done = apply_to_run(config, "mask")
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert config.actor_rollout_ref.actor.policy_loss.token_mask == "custom:s2t_rule"
    assert json.loads(env[RULE_ENV]) == {"path": S2T.path, "name": "s2t_rule", "kind": "mask",
                                         "kwargs": {"tau_p": 0.005}, "fallback": S2T.path,
                                         "sha256": sha256_file(Path(S2T.path)), "max_weight": 10.0}
    loss = str(EXAMPLES / "my_loss.py")
    assert json.loads(env[IMPORTS_ENV]) == [[loss, loss, sha256_file(Path(loss))]] and env.OTHER == "1"
    assert os.environ[RULE_ENV] == env[RULE_ENV] and len(done) == 3
    config.ray_kwargs.ray_init.runtime_env.env_vars[RULE_ENV] = "something else"
    with pytest.raises(STAPOConfigError, match=f"env_vars.{RULE_ENV} is set by the recipe"):
        apply_to_run(config, "mask")


@pytest.mark.slow  # starts processes: out of make test-fast
def test_a_fresh_process_registers_the_rule_and_the_loss_at_import_verl():
    """What a Ray worker does: the plugin (``import verl``) reads the job's environment and registers the rule
    when the mask registry is imported and the loss when verl's loss registry is."""
    env = {**os.environ, RULE_ENV: RuleSetting(S2T.path, "s2t_rule", {}, "mask").to_env(),
           IMPORTS_ENV: json.dumps([["recipe/stapo/examples/my_loss.py", "/nowhere/my_loss.py"]])}
    code = (
        "import verl\n"
        "from stapo.algorithm.masks import TOKEN_MASK_REGISTRY\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
        "custom = sorted(k for k in TOKEN_MASK_REGISTRY if k.startswith('custom:'))\n"
        "print(custom, 'my_ppo_clip' in POLICY_LOSS_REGISTRY)\n"
    )
    # cwd: the repository, as a Ray job's uploaded working directory (the relative path is found there)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "['custom:s2t_rule'] True"


def test_register_rule_keeps_builtin_names():
    with pytest.raises(ValueError, match="built-in"):
        CustomRule(lambda **_: None, "stapo", "mask").register()
    assert register_rule(RuleSetting(S2T.path, "s2t_rule", {}, "mask")) == "custom:s2t_rule"


def test_a_relative_path_is_read_where_the_process_runs_or_at_the_drivers_absolute_path(tmp_path, monkeypatch):
    from stapo.verl_plugin.training.custom_rule import locate

    monkeypatch.chdir(REPO)
    relative = "recipe/stapo/examples/s2t_rule.py"
    assert locate(relative, "/elsewhere/s2t_rule.py") == S2T.path  # here: the job's working directory
    monkeypatch.chdir(tmp_path)
    assert locate(relative, S2T.path) == S2T.path  # not here: the driver's absolute path
    assert locate(S2T.path, "/elsewhere") == S2T.path


@pytest.mark.parametrize(("overrides", "message"), [
    (["stapo.custom_rule.name=s2t_rule"], r"stapo.custom_rule.name=s2t_rule needs stapo.custom_rule.path"),
    ([f"stapo.custom_rule.path={S2T.path}", "stapo.custom_rule.name=s2t_rule",
      "actor_rollout_ref.actor.policy_loss.source=current", "actor_rollout_ref.actor.calculate_entropy=true"],
     r"source='current' is not available for actor_rollout_ref.actor.policy_loss.token_mask='custom:s2t_rule'"),
    (["actor_rollout_ref.actor.policy_loss.token_mask=custom:s2t_rule"], r"names a custom rule: set stapo.custom_rule"),
    ([f"stapo.custom_rule.path={S2T.path}", "stapo.custom_rule.name=s2t_rule", "+stapo.custom_rule.kwargs.entropy=1"],
     r"stapo.custom_rule.kwargs may not name what the rule is given already: \['entropy'\]"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=my_ppo_clip_unregistered"], r"loss_mode must be one of"),
])
def test_the_run_checks_refuse_a_custom_setting_that_cannot_run(overrides, message):
    from stapo.check import check_run, compose_run

    with pytest.raises(STAPOConfigError, match=message):
        check_run(compose_run(overrides), paths=False)


def test_a_loss_file_is_seen_by_the_registry_check_and_the_rule_replaces_any_presets(monkeypatch):
    from stapo.check import check_run, compose_run

    monkeypatch.chdir(REPO)
    check_run(compose_run(["stapo.import_files=[recipe/stapo/examples/my_loss.py]",
                           "actor_rollout_ref.actor.policy_loss.loss_mode=my_ppo_clip"]), paths=False)
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    assert POLICY_LOSS_REGISTRY["my_ppo_clip"].__module__.startswith("stapo_user_files.my_loss_")
    for algo in ("grpo", "entropy20", "taco"):  # none of them is refused with the S2T rule in place of its own
        check_run(compose_run([f"algo={algo}", f"stapo.custom_rule.path={S2T.path}",
                               "stapo.custom_rule.name=s2t_rule"]), paths=False)


def test_the_example_loss_sums_over_the_folded_mask_as_a_loop_reference():
    """``my_loss.py`` as verl calls a registered loss, on a micro-batch whose response_mask carries a folded mask
    (silenced tokens 0, one of them NaN): the float64 loop over the kept tokens, divided by verl's count."""
    from types import SimpleNamespace

    from stapo.verl_plugin.training.custom_rule import load_file

    loss_fn = load_file(str(EXAMPLES / "my_loss.py"), "stapo.import_files").my_ppo_clip
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 9, generator=g) * 3
    new = old + 0.4 * torch.randn(4, 9, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 9).clone()
    mask = torch.rand(4, 9, generator=g) < 0.8
    new[~mask] = math.nan  # a silenced or padded position never reaches the loss
    count = 2 * int(mask.sum())  # verl's DP-global token count (another rank's tokens too)
    config = SimpleNamespace(clip_ratio=0.2, global_batch_info={"dp_size": 1, "batch_num_tokens": count})
    loss, metrics = loss_fn(old, new, adv, mask.float(), "token-mean", config)
    want = 0.0
    for i, j in mask.nonzero().tolist():
        ratio = math.exp(float(new[i, j]) - float(old[i, j]))
        a = float(adv[i, j])
        want += max(-a * ratio, -a * min(max(ratio, 0.8), 1.2))
    assert float(loss) == pytest.approx(want / count, rel=1e-5) and math.isfinite(metrics["actor/ppo_kl"])


# --- what every process runs is what the check saw -----------------------------------------------------------


def test_a_weight_bound_is_a_setting_the_user_can_raise(tmp_path):
    from omegaconf import OmegaConf

    from stapo.verl_plugin.training.custom_rule import rule_setting

    setting = _rule_file(tmp_path, "def rule(entropy, **_):\n    return entropy * 1e6\n", "big.py")
    raised = RuleSetting(setting.path, "rule", {}, None, None, None, 1e9)
    assert check_rule(raised).kind == "weight"
    section = {"path": setting.path, "name": "rule"}
    assert rule_setting(OmegaConf.create({"stapo": {"custom_rule": section}})).max_weight == 10.0
    assert rule_setting(OmegaConf.create({"stapo": {"custom_rule": {**section, "max_weight": 1e9}}})).max_weight == 1e9
    for bad in (0, -1, "x", True):
        with pytest.raises(STAPOConfigError, match=r"stapo.custom_rule.max_weight must be a number > 0"):
            rule_setting(OmegaConf.create({"stapo": {"custom_rule": {**section, "max_weight": bad}}}))


def test_a_weight_above_the_bound_at_run_time_is_refused_on_every_rank():
    CustomRule(lambda entropy, **_: entropy * 1e6, "custom:huge", "weight", where="huge.py:1 (huge)",
               max_weight=10.0).register()
    with pytest.raises(ValueError, match=r"huge\.py:1 \(huge\): returned \d+ weight\(s\) above max_weight=10"):
        build_token_mask(_inputs(synthetic_batch()), MaskSettings(token_mask="custom:huge"))


def test_a_file_edited_after_the_check_is_refused_where_it_is_loaded(tmp_path, monkeypatch):
    """The digest the driver hands over is compared with the bytes a process is about to run, before they run."""
    from stapo.verl_plugin.training import custom_rule as files

    setting = _rule_file(tmp_path, "def rule(response_mask, **_):\n    return response_mask\n", "edited.py")
    checked = check_rule(setting)
    assert checked.sha256 == sha256_file(Path(setting.path)) and checked.sha256[:12] in checked.note()
    handed = RuleSetting(setting.path, "rule", {}, "mask", setting.path, checked.sha256)
    Path(setting.path).write_text(
        "import torch\n\nRAN = True\ndef rule(response_mask, **_):\n    return ~response_mask\n")
    for name in [n for n in sys.modules if n.startswith(files.MODULE_PREFIX + "edited_")]:
        monkeypatch.delitem(sys.modules, name)  # a fresh process: nothing of the file loaded yet
    with pytest.raises(STAPOConfigError, match=r"edited\.py: the file changed after the driver checked it") as refused:
        register_rule(handed)
    assert "\n" not in str(refused.value)
    assert not any(n.startswith(files.MODULE_PREFIX + "edited_") for n in sys.modules)  # refused before it ran
    monkeypatch.setenv(RULE_ENV, handed.to_env())  # a TaskRunner's check reads the digest from the job's environment
    with pytest.raises(STAPOConfigError, match=r"the file changed after the driver checked it"):
        check_rule(setting)


def test_an_import_file_edited_after_the_check_is_refused_in_every_process(tmp_path, monkeypatch):
    from stapo.verl_plugin.training.custom_rule import _import_files_from_env

    loss = tmp_path / "loss_edited.py"
    loss.write_text("X = 1\n")
    monkeypatch.setenv(IMPORTS_ENV, json.dumps([[str(loss), str(loss), sha256_file(loss)]]))
    loss.write_text("X = 2\n")
    with pytest.raises(STAPOConfigError, match=r"stapo.import_files=.*loss_edited\.py: the file changed"):
        _import_files_from_env(None)


def test_an_exit_at_import_is_a_refusal_naming_the_line(tmp_path):
    exits = _rule_file(tmp_path, "import sys\nsys.exit(0)\n", "exits.py")
    with pytest.raises(STAPOConfigError, match=r"exits\.py:4: cannot import: SystemExit\(0\)"):
        check_rule(exits)


def test_a_rule_raising_in_a_worker_names_the_line_that_raised(tmp_path):
    """Not the ``def`` line: the innermost frame in the user's file."""
    setting = _rule_file(tmp_path, "def rule(entropy, **_):\n    x = entropy\n    return x.view(8, 32) > 0\n",
                         "worker.py")
    from stapo.verl_plugin.training.custom_rule import find_function, load_file

    fn = find_function(load_file(setting.path, "stapo.custom_rule.path"), setting)
    CustomRule(fn, "custom:worker", "mask", where=f"{setting.path}:3 (rule)").register()
    with pytest.raises(ValueError, match=r"raised RuntimeError: .* at .*worker\.py:5$"):
        build_token_mask(_inputs(_batch(0)), MaskSettings(token_mask="custom:worker"))


def test_the_check_calls_the_rule_on_the_runs_own_shape(tmp_path):
    """A rule written for the check's small batch fails on the run's: here, not minutes after Ray starts."""
    from omegaconf import OmegaConf

    from stapo.verl_plugin.preflight.custom_rule_check import MAX_CHECK_TOKENS, run_shape

    setting = _rule_file(tmp_path, "def rule(response_mask, **_):\n    return response_mask.reshape(8, 32)\n",
                         "fixed.py")
    with pytest.raises(STAPOConfigError, match=r"fixed\.py:4 \(rule\): raised on a synthetic batch of 16 x 64"):
        check_rule(setting, (16, 64))
    assert check_rule(S2T, (16, 64)).shape == (16, 64)
    config = OmegaConf.create({"data": {"train_batch_size": 4, "max_response_length": 100},
                               "actor_rollout_ref": {"rollout": {"n": 3}}})
    assert run_shape(config) == (12, 100)
    config.data.max_response_length = MAX_CHECK_TOKENS // 2
    assert run_shape(config) == (2, MAX_CHECK_TOKENS // 2)  # rows capped, the length kept


def test_the_run_shaped_batch_is_ragged():
    mask = synthetic_batch(16, 64)["response_mask"]
    lengths = mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 2 and int(lengths[-1]) == 0 and mask.shape == (16, 64)


@pytest.mark.slow  # starts a process: out of make test-fast
def test_a_fresh_process_refuses_a_rule_file_that_is_not_the_one_checked():
    """What a Ray worker does with a digest that does not match: the import that loads the rule fails, naming it."""
    env = {**os.environ, RULE_ENV: RuleSetting(S2T.path, "s2t_rule", {}, "mask", S2T.path, "0" * 64).to_env()}
    code = "import verl\nimport stapo.algorithm.masks\n"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
                         check=False)
    assert out.returncode != 0
    assert (f"STAPOConfigError: stapo.custom_rule.path={S2T.path}: the file changed after the driver checked it "
            "(sha256 000000000000 checked") in out.stderr
