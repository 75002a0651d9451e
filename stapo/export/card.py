"""The model card (README.md) of an exported checkpoint: what was trained, how, and how it stood.

Built from the run's resolved config (``config.yaml`` of ``stapo.run_dir``) when there is one, else
from the checkpoint's own model config, and from the metrics logged at the exported step. Pure:
dicts in, markdown out.
"""

from __future__ import annotations

from typing import Any

import yaml

# the settings each token-mask registry entry reads (stapo.algorithm.masks.MaskSettings); others show them all
MASK_SETTINGS = {
    "none": (),
    "stapo": ("source", "tau_p", "entropy_quantile", "threshold_scope"),
    "entropy20": ("source", "entropy_top_fraction", "entropy_denominator", "threshold_scope"),
    "taco": ("source", "taco_alpha", "taco_lambda"),
    "advrew": ("source", "advrew_alpha"),
    "stare": ("source", "threshold_scope", "stare_variant", "stare_top_ratio", "stare_w", "stare_m",
              "stare_target_entropy"),
    "steer": ("source", "steer_lambda_min"),
}
_ALL_MASK_SETTINGS = ("source", "tau_p", "entropy_quantile", "entropy_top_fraction", "entropy_denominator",
                      "threshold_scope", "taco_alpha", "taco_lambda", "advrew_alpha", "stare_variant",
                      "stare_top_ratio", "stare_w", "stare_m", "stare_target_entropy", "steer_lambda_min", "lopti",
                      "lopti_eta")
# Lopti's, shown with any mask when it is on (it is not a mask: two updates per step, docs/algorithm.md 7)
LOPTI_SETTINGS = ("lopti", "lopti_eta")
# metrics shown first, when logged (everything logged is listed below them)
KEY_METRICS = (
    "critic/score/mean",
    "val-core/average/acc",
    "actor/stapo/mask_ratio",
    "actor/stapo/num_spurious",
    "actor/stapo/drop_ratio",
    "actor/entropy",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "actor/lr",
    "response_length/mean",
    "timing_s/step",
)


def get(config: dict | None, dotted: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; ``default`` when any part is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def algorithm(config: dict | None) -> dict[str, Any]:
    """Loss mode, token mask and the thresholds that mask reads, plus the objective's constants."""
    loss = get(config, "actor_rollout_ref.actor.policy_loss", {}) or {}
    mask = loss.get("token_mask", "none")
    wanted = MASK_SETTINGS.get(mask, _ALL_MASK_SETTINGS) + (LOPTI_SETTINGS if loss.get("lopti") is True else ())
    actor = get(config, "actor_rollout_ref.actor", {}) or {}
    return {
        "loss_mode": loss.get("loss_mode"),
        "token_mask": mask,
        "mask_settings": {key: loss[key] for key in wanted if key in loss},
        "adv_estimator": get(config, "algorithm.adv_estimator"),
        "clip_ratio": [actor.get("clip_ratio_low"), actor.get("clip_ratio_high"), actor.get("clip_ratio_c")],
        "loss_agg_mode": actor.get("loss_agg_mode"),
        "use_kl_loss": actor.get("use_kl_loss"),
        "entropy_coeff": actor.get("entropy_coeff"),
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return "-" if value is None else str(value)


def _hub_id(path: Any) -> str | None:
    text = str(path or "")
    parts = text.split("/")
    return text if len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and ":" not in text else None


def _training_rows(config: dict, algo: dict[str, Any]) -> list[tuple[str, str]]:
    mask = algo["token_mask"]
    settings = ", ".join(f"{k} {_fmt(v)}" for k, v in algo["mask_settings"].items())
    return [
        ("base model", _fmt(get(config, "actor_rollout_ref.model.path"))),
        ("policy loss", f"loss_mode {_fmt(algo['loss_mode'])}"),
        ("token mask", f"{mask}" + (f" ({settings})" if settings else "")),
        ("advantages", _fmt(algo["adv_estimator"])),
        ("clip ratio low / high / dual", " / ".join(_fmt(v) for v in algo["clip_ratio"])),
        ("loss aggregation", _fmt(algo["loss_agg_mode"])),
        ("KL loss / entropy coeff", f"{_fmt(algo['use_kl_loss'])} / {_fmt(algo['entropy_coeff'])}"),
        ("learning rate", _fmt(get(config, "actor_rollout_ref.actor.optim.lr"))),
        (
            "prompts x samples per step",
            f"{_fmt(get(config, 'data.train_batch_size'))} x {_fmt(get(config, 'actor_rollout_ref.rollout.n'))}",
        ),
        (
            "max prompt / response tokens",
            f"{_fmt(get(config, 'data.max_prompt_length'))} / {_fmt(get(config, 'data.max_response_length'))}",
        ),
        (
            "rollout",
            (
                f"{_fmt(get(config, 'actor_rollout_ref.rollout.name'))}, temperature "
                f"{_fmt(get(config, 'actor_rollout_ref.rollout.temperature'))}"
            ),
        ),
        ("train data", _fmt(get(config, "data.train_files"))),
        (
            "hardware",
            (
                f"{_fmt(get(config, 'trainer.nnodes'))} node(s) x {_fmt(get(config, 'trainer.n_gpus_per_node'))} "
                f"{_fmt(get(config, 'trainer.device'))}"
            ),
        ),
    ]


def _table(rows: list[tuple[str, str]], head: tuple[str, str]) -> list[str]:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    return lines + [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]


def model_card(
    *,
    step: int,
    steps: list[int],
    source: str,
    dtype: str,
    config: dict | None,
    model_config: dict,
    metrics: dict[str, float] | None,
    run_dir: str | None,
) -> str:
    """README.md of the export: front matter for the hub, training settings, the step's metrics, config."""
    algo = algorithm(config)
    name = get(config, "trainer.experiment_name") or model_config.get("model_type", "model")
    base = _hub_id(get(config, "actor_rollout_ref.model.path"))
    tags = ["stapo", "verl", "reinforcement-learning"] + ([str(algo["adv_estimator"])] if algo["adv_estimator"] else [])
    front = {"library_name": "transformers", "tags": tags} | ({"base_model": base} if base else {})
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "", f"# {name}, step {step}", ""]
    lines += [
        (
            f"Exported by `stapo export` from the FSDP checkpoint `{source}` (saved steps: "
            f"{', '.join(map(str, steps))}), weights in {dtype}, architecture "
            f"{', '.join(model_config.get('architectures') or ['?'])}."
        ),
        "",
        "## Training",
        "",
    ]
    if config is None:
        lines += [
            (
                "The run's config is not available (no run folder: the run was started without `stapo.run_dir`, "
                "or `--run-dir` was not given), so the algorithm is unknown; the model config is the checkpoint's."
            ),
            "",
        ]
    else:
        lines += _table(_training_rows(config, algo), ("setting", "value")) + [""]
    lines += [f"## Metrics at step {step}", ""]
    if not metrics:
        reason = "no run folder was given" if run_dir is None else f"{run_dir} logged nothing for this step"
        lines += [f"No metrics: {reason}.", ""]
    else:
        first = [(k, _fmt(metrics[k])) for k in KEY_METRICS if k in metrics]
        lines += _table(first, ("metric", "value")) + ["", "<details><summary>every metric of this step</summary>", ""]
        lines += _table([(k, _fmt(v)) for k, v in sorted(metrics.items())], ("metric", "value"))
        lines += ["", "</details>", ""]
    if config is not None:
        lines += [
            "## Config",
            "",
            f"The resolved config of the run ({run_dir}/config.yaml):",
            "",
            "<details><summary>config.yaml</summary>",
            "",
            "```yaml",
            yaml.safe_dump(config, sort_keys=False).strip(),
            "```",
            "",
            "</details>",
            "",
        ]
    lines += [
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        'model = AutoModelForCausalLM.from_pretrained("PATH")',
        "```",
        "",
        "`stapo eval PATH` scores it on the paper's benchmarks (avg@N, both decoding settings).",
        "",
    ]
    return "\n".join(lines)
