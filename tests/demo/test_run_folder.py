"""The run folder: metrics segments across resumes, progress lines, plots, the spurious-token log."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from stapo.algorithm.token_sample import spread_positions
from stapo.rundir import METRICS_NAME, metric_segments, read_metrics, rotate_metrics
from stapo.runs.plot import plot_runs, run_labels, series, trailing_mean
from stapo.runs.progress import Progress, format_duration, parse_step_line, parse_steps
from stapo.runs.train import MetricsFollower
from stapo.spurious_log import LOG_NAME, SUMMARY_NAME, append_jsonl, write_summary
from stapo.verl_plugin.training.diagnostic_outputs import SpuriousTokenLog
from stapo.verl_plugin.training.driver_diagnostics import reward_extra_means
from tests.spurious_log_reference import spread_evenly, write_padded_log

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write(path, records):
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))


def test_resume_keeps_earlier_metrics_and_later_lines_win(tmp_path):
    _write(tmp_path / "metrics.jsonl", [(0, {"val/average/acc": 0.1}), (1, {"x": 1.0}), (2, {"x": 2.0})])
    assert rotate_metrics(tmp_path).name == "metrics.prev-1.jsonl"
    # the resumed run repeats step 2 (after the step-1 checkpoint) and goes on; its last line is torn
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "data": {"x": 20.0}})
        + "\n"
        + json.dumps({"step": 3, "data": {"x": 3.0}})
        + "\n"
        + '{"step": 4, "da'
    )
    assert rotate_metrics(tmp_path).name == "metrics.prev-2.jsonl"
    _write(tmp_path / "metrics.jsonl", [(4, {"x": 4.0, "note": "text is dropped"})])
    assert [p.name for p in metric_segments(tmp_path)] == [
        "metrics.prev-1.jsonl",
        "metrics.prev-2.jsonl",
        "metrics.jsonl",
    ]
    steps = read_metrics(tmp_path)
    assert list(steps) == [0, 1, 2, 3, 4]
    assert steps[2]["x"] == 20.0 and steps[4] == {"x": 4.0} and steps[0]["val/average/acc"] == 0.1


def test_gzipped_segments_read_as_the_plain_ones_in_the_same_order(tmp_path):
    import gzip

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for folder in (plain, packed):
        folder.mkdir()
    segments = {
        "metrics.prev-2.jsonl": [(2, {"x": 20.0}), (3, {"x": 3.0})],
        "metrics.prev-1.jsonl": [(0, {"x": 0.5}), (1, {"x": 1.0}), (2, {"x": 2.0})],
        "metrics.jsonl": [(3, {"x": 30.0, "y": 1.0}), (4, {"x": 4.0})],
    }
    for name, records in segments.items():
        _write(plain / name, records)
        # prev-1 stays plain in the mixed folder: a gzipped and a plain segment sort by their index alone
        if name == "metrics.prev-1.jsonl":
            _write(packed / name, records)
        else:
            (packed / (name + ".gz")).write_bytes(gzip.compress((plain / name).read_bytes()))
    assert [p.name for p in metric_segments(packed)] == [
        "metrics.prev-1.jsonl",
        "metrics.prev-2.jsonl.gz",
        "metrics.jsonl.gz",
    ]
    assert read_metrics(packed) == read_metrics(plain)
    assert read_metrics(plain)[3] == {"x": 30.0, "y": 1.0} and read_metrics(plain)[2] == {"x": 20.0}


def test_lines_that_are_not_records_are_skipped_with_a_warning_naming_them(tmp_path, capsys):
    record = json.dumps({"step": 1, "data": {"x": 1.0}})
    lines = [record, "garbage", '{"no": "step"}', "[1, 2]", '{"step": "two", "data": {}}', "",
             json.dumps({"step": 2, "data": {"x": 2.0}})]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 3, "da')  # + a line being written
    assert read_metrics(tmp_path) == {1: {"x": 1.0}, 2: {"x": 2.0}}
    err = capsys.readouterr().err
    assert "4 line(s) are not metric records, skipped (line 2, 3, 4, 5)" in err and "metrics.jsonl" in err
    (tmp_path / "metrics.jsonl").write_text(record + "\n")
    assert read_metrics(tmp_path) == {1: {"x": 1.0}} and capsys.readouterr().err == ""


def test_rotate_ignores_a_missing_or_empty_file_and_read_names_the_setting(tmp_path):
    assert rotate_metrics(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text("")
    assert rotate_metrics(tmp_path) is None and (tmp_path / "metrics.jsonl").exists()
    (tmp_path / "metrics.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="stapo.run_dir"):
        read_metrics(tmp_path)


def test_console_lines_parse_and_progress_has_eta():
    line = "(TaskRunner pid=1) step:3 - critic/score/mean:-0.25 - actor/stapo/mask_ratio:0.0125 - timing_s/step:10.0"
    step, metrics = parse_step_line(line)
    assert step == 3 and metrics == {
        "critic/score/mean": -0.25,
        "actor/stapo/mask_ratio": 0.0125,
        "timing_s/step": 10.0,
    }
    assert parse_step_line("no metrics here") is None
    # numpy scalars as verl's console prints them, signs, exponents and non-finite values; a value that is no
    # number is left out, not guessed
    numpy_line = ("step:2 - val-core/x/acc/mean@1:np.float64(-0.3125) - num_turns/min:np.int32(2) - a:-inf - b:nan - "
            "c:1.5e-07 - d:np.float64(nan) - e:hello - f:1.0 ")
    got = parse_step_line(numpy_line)[1]
    assert {k: v for k, v in got.items() if v == v} == {
        "val-core/x/acc/mean@1": -0.3125, "num_turns/min": 2.0, "a": float("-inf"), "c": 1.5e-07, "f": 1.0}
    assert sorted(k for k, v in got.items() if v != v) == ["b", "d"]
    assert parse_steps(line + "\nstep:4 - timing_s/step:30.0\n") == {3: metrics, 4: {"timing_s/step": 30.0}}
    progress = Progress(total_steps=10)
    assert "held-out accuracy before training: 0.250" in progress.line(0, {"val/average/acc": 0.25})
    second = {"val/average/acc": 0.25, "val@T0.7/average/acc": 0.5}  # stapo.val_decodings=[T0.7]
    assert progress.line(0, second).endswith("held-out accuracy before training: 0.250 (T0.7 0.500)")
    assert Progress(total_steps=10).line(10, {**second, "timing_s/step": 1.0}).endswith(
        "| held-out acc 0.250 (T0.7 0.500)")
    text = progress.line(3, metrics)
    assert "step 3/10" in text and "reward -0.250" in text and "mask 0.0125" in text and "ETA 1m10s" in text
    assert "acc -" in text  # absent metrics show a dash, never a crash
    assert "ETA 2m00s" in progress.line(4, {"timing_s/step": 30.0})  # mean of 10 and 30 s, 6 steps left
    assert format_duration(59.6) == "1m00s" and format_duration(-3) == "0s"
    # the mean entropy of a response token when logged, verl's actor/entropy otherwise
    assert "entropy 0.090" in progress.line(5, {"actor/entropy": 0.09})
    assert "entropy 0.120" in progress.line(5, {"actor/entropy": 0.09, "actor/stapo/entropy_token_mean": 0.12})


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plots_of_two_runs_are_valid_pngs_with_a_summary(tmp_path):
    for name, scale in (("stapo", 1.0), ("grpo", 2.0)):
        run = tmp_path / name
        run.mkdir()
        records = [(0, {"val/average/acc": 0.1})]
        records += [
            (s, {"critic/score/mean": s * scale, "actor/entropy": 1 / s, "timing_s/step": 5.0}) for s in (1, 2, 3)
        ]
        if name == "stapo":
            records += [(s, {"actor/stapo/mask_ratio": 0.01 * s, "actor/stapo/tau_h": 0.3}) for s in (1, 2, 3)]
        records.append((3, {"val/average/acc": 0.3}))
        _write(run / "metrics.jsonl", records)
    written = plot_runs([tmp_path / "stapo", tmp_path / "grpo"], tmp_path / "plots")
    assert sorted(p.name for p in written) == ["entropy.png", "mask.png", "reward.png"]
    for path in written:
        width, height = _png_size(path)
        assert width > 300 and height > 200
    summary = (tmp_path / "plots" / "summary.md").read_text()
    assert "| stapo | 3 | 0.100 -> 0.300 | 0.0200 | 5.0 |" in summary
    assert "| grpo | 3 | 0.100 -> 0.300 | - | 5.0 |" in summary


@pytest.mark.parametrize("length, window", [(1, 10), (9, 10), (10, 10), (137, 10), (50, 1), (50, 7)])
def test_trailing_mean_is_the_mean_of_the_window_ending_at_each_step(length, window):
    values = torch.rand(length, dtype=torch.float64, generator=torch.Generator().manual_seed(length)).tolist()
    expected = [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
                for i in range(length)]
    assert trailing_mean(values, window) == pytest.approx(expected, abs=1e-12)


def test_series_takes_the_first_key_present_and_labels_are_unique(tmp_path):
    steps = {1: {"b": 1.0}, 2: {"a": 5.0, "b": 2.0}}
    assert series(steps, ("a", "b")) == ("a", [2], [5.0])
    assert series(steps, ("c",)) is None
    assert run_labels([tmp_path / "x" / "stapo", tmp_path / "y" / "stapo", tmp_path / "grpo"]) == [
        "x/stapo",
        "y/stapo",
        "grpo",
    ]


def test_reward_extra_means_skip_non_numbers_and_non_finite():
    class Wrapped:  # how a TensorDict non-tensor entry hands over its dict
        def __init__(self, data):
            self.data = data

    items = [
        {"reward_extra_info": {"acc": 1.0, "checker": "strict", "has_box": True}},
        Wrapped({"reward_extra_info": {"acc": 0.0, "has_box": False, "bad": float("nan")}}),
        {"no_info": 1},
        None,
    ]
    assert reward_extra_means(items) == {"reward/acc/mean": 0.5, "reward/has_box/mean": 0.5}
    assert reward_extra_means([]) == {}


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i) for i in ids)


def test_spurious_token_log_caps_tokens_and_decodes_context(tmp_path):
    log = SpuriousTokenLog.from_config(
        {"run_dir": str(tmp_path), "spurious_log": {"every": 2, "max_tokens": 3, "context": 2}}
    )
    assert not log.wants(1) and log.wants(2)
    responses = torch.arange(12).view(2, 6)
    spurious = torch.zeros(2, 6, dtype=torch.bool)
    spurious[0, [0, 4]] = True
    spurious[1, [0, 2, 3, 5]] = True
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])  # row 0: padding at position 5
    padded = {
        "old_log_probs": torch.full((2, 6), -7.0),
        "entropy": torch.full((2, 6), 0.5),
        "response_mask": response_mask,
    }
    write_padded_log(log, 2, responses, spurious, padded, _CharTokenizer())
    records = [json.loads(line) for line in (tmp_path / "spurious_tokens.jsonl").read_text().splitlines()]
    # capped at 3 of 6: the middle token of each third of the batch, not the first three
    assert [(r["sample"], r["position"]) for r in records] == [(0, 4), (1, 2), (1, 5)]
    assert records[0] == {
        "step": 2,
        "sample": 0,
        "position": 4,
        "token": "e",
        "before": "cd",
        "after": "",
        "prob": pytest.approx(torch.exp(torch.tensor(-7.0)).item()),
        "entropy": 0.5,
    }
    assert spurious.sum() == 6  # the caller's mask is not modified


def test_spurious_token_log_is_off_without_a_run_dir_or_with_every_zero(tmp_path):
    assert not SpuriousTokenLog.from_config({}).wants(1)
    assert not SpuriousTokenLog.from_config({"run_dir": str(tmp_path), "spurious_log": {"every": 0}}).wants(0)


def test_a_capped_log_spreads_evenly_over_the_whole_batch():
    """A cap of N must not keep the first N tokens, i.e. the first prompts of the batch only."""
    spurious = torch.zeros(100, 50, dtype=torch.bool)
    spurious[:, ::5] = True  # 1,000 silenced tokens, 10 per response
    kept = spread_evenly(spurious, 20)
    assert kept.sum() == 20 and not (kept & ~spurious).any()
    flat = spurious.view(-1).nonzero().squeeze(1)
    expected = flat[[(2 * i + 1) * 1000 // 40 for i in range(20)]]  # the middle of each 50-token run
    assert kept.view(-1).nonzero().squeeze(1).tolist() == expected.tolist()
    rows = kept.nonzero()[:, 0]
    assert rows.min() < 5 and rows.max() >= 95 and rows.unique().numel() == 20
    assert torch.equal(spread_evenly(spurious, 20), kept)  # deterministic
    assert torch.equal(spread_evenly(spurious, 5000), spurious)  # under the cap: everything
    assert not spread_evenly(spurious, 0).any()


def test_summary_reads_the_log_and_skips_a_torn_line(tmp_path):
    append_jsonl(tmp_path / LOG_NAME, [{"token": " 7"}, {"token": "7"}, {"token": "so"}])
    with (tmp_path / LOG_NAME).open("a") as handle:
        handle.write('{"token": "tor')  # a run killed mid-write
    assert write_summary(tmp_path, top=1) == [("7", 2)]
    summary = (tmp_path / SUMMARY_NAME).read_text()
    assert "| `7` | 2 |" in summary and "3 logged" in summary
    assert write_summary(tmp_path / "missing") == []


@pytest.mark.parametrize("size", [1, 1023, 1024, 1025, 5000, 70_001])
@pytest.mark.parametrize("density", [0.0, 0.0005, 0.3, 1.0])
def test_spread_positions_equal_the_listed_reference(size, density):
    """spread_positions counts blocks instead of listing every True position (a 31M-token batch):
    it must pick what indexing the full list of positions picks, for any length and density."""
    g = torch.Generator().manual_seed(size * 7 + int(density * 1e4))
    mask = torch.rand(size, generator=g) < density
    if density == 0.3:
        mask[size // 3 : size // 3 + 3000] = False  # whole empty blocks between full ones
    listed = mask.nonzero().squeeze(1)
    for cap in (0, 1, 7, 200, 2000, size + 1):
        got = spread_positions(mask, cap)
        n = listed.numel()
        if cap <= 0 or n == 0:
            expected = []
        elif n <= cap:
            expected = listed.tolist()
        else:
            expected = [int(listed[(2 * i + 1) * n // (2 * cap)]) for i in range(cap)]  # loop, one by one
        assert got.tolist() == expected, (size, density, cap)
    assert torch.equal(spread_evenly(mask.view(1, -1), 50).view(-1).nonzero().squeeze(1), spread_positions(mask, 50))


def test_plot_refuses_a_file_an_unknown_group_key_and_runs_without_any_metric(tmp_path, capsys):
    from stapo.runs.plot import main as plot_main

    good, garbage = tmp_path / "stapo-s1", tmp_path / "grpo-s1"
    for run in (good, garbage):
        run.mkdir()
        (run / "config.yaml").write_text("actor_rollout_ref:\n  actor:\n    policy_loss:\n      token_mask: stapo\n")
    _write(good / "metrics.jsonl", [(1, {"critic/score/mean": 0.5})])
    (garbage / "metrics.jsonl").write_text("not json\n{\"step\": \n")
    with pytest.raises(SystemExit) as exit_:
        plot_main([str(good / "metrics.jsonl")])
    assert exit_.value.code == 2 and "is a file; give its run folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        plot_main([str(good), "--group-by", "actor_rollout_ref.actor.policy_loss.token_msk"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "(did you mean 'actor_rollout_ref.actor.policy_loss.token_mask'?)" in err
    assert plot_main([str(garbage), "--out", str(tmp_path / "p0")]) == 1
    assert f"no metric line could be read from ['{garbage}']" in capsys.readouterr().err
    assert plot_main([str(good), str(garbage), "--per-run", "--out", str(tmp_path / "p1")]) == 0
    assert "warning: no metric line could be read" in capsys.readouterr().err


def test_metrics_follower_reads_complete_lines_of_the_new_file_only(tmp_path):
    path = tmp_path / METRICS_NAME
    path.write_text('{"step": 7, "data": {"x": 1}}\n')  # an earlier run's metrics in the same folder
    follower = MetricsFollower(tmp_path)
    assert follower.new_steps() == []  # not this run's: the recipe moves it aside first
    rotate_metrics(tmp_path)
    assert follower.new_steps() == []  # verl's logger has not created its file yet
    with path.open("wb", buffering=0) as handle:  # as verl's FileLogger writes: unbuffered, one line a step
        handle.write(b'{"step": 0, "data": {"val/average/acc": 0.25, "note": "text"}}\n{"step": 1, "da')
        assert follower.new_steps() == [(0, {"val/average/acc": 0.25})]  # the torn line waits
        handle.write(b'ta": {"timing_s/step": 3}}\n')
        assert follower.new_steps() == [(1, {"timing_s/step": 3.0})]
        assert follower.new_steps() == []
    fresh = tmp_path / "fresh"
    fresh.write_text('{"step": 1, "data": {"y": 2}}\n')
    fresh.replace(path)  # another file (another inode) in its place: read from its start
    assert follower.new_steps() == [(1, {"y": 2.0})]


def test_the_test_runner_completes_console_steps_from_this_runs_metrics_file_only(tmp_path):
    from tests.e2e.cpu_runs import logged_steps

    (tmp_path / "metrics.prev-1.jsonl").write_text('{"step": 1, "data": {"x": 1}}\n{"step": 2, "data": {"x": 2}}\n')
    (tmp_path / METRICS_NAME).write_text('{"step": 3, "data": {"x": 3}}\n{"step": 4, "data": {"x": 4, "s": "a"}}\n{"st')
    steps = logged_steps("step:3 - x:30\n", [f"stapo.run_dir={tmp_path}"])
    assert steps == {3: {"x": 30.0}, 4: {"x": 4.0}}  # the console line wins; an earlier run's segment is not its
    assert logged_steps("step:3 - x:30\n", []) == {3: {"x": 30.0}}


def test_a_runs_config_is_parsed_once_a_version_read_only_and_read_again_once_rewritten(tmp_path):
    """stapo.runs.folder.load_run_config: `stapo compare` asks for each run's config several times; the parsed
    config is shared, so it is read-only, and a rewritten file (another size or time) is parsed again."""
    import gzip
    import os

    from omegaconf import OmegaConf
    from omegaconf.errors import ReadonlyConfigError

    from stapo.runs.folder import load_run_config

    assert load_run_config(tmp_path) is None
    (tmp_path / "config.yaml.gz").write_bytes(gzip.compress(b"trainer:\n  total_training_steps: 7\n  lr: 1e-6\n"))
    packed = load_run_config(tmp_path)
    assert OmegaConf.to_container(packed) == {"trainer": {"total_training_steps": 7, "lr": 1e-6}}
    config = tmp_path / "config.yaml"  # the plain file first, as before
    config.write_text("trainer:\n  total_training_steps: 3\n")
    first = load_run_config(tmp_path)
    assert first.trainer.total_training_steps == 3 and load_run_config(tmp_path) is first
    with pytest.raises(ReadonlyConfigError):
        first.trainer.total_training_steps = 4
    config.write_text("trainer:\n  total_training_steps: 15\n")  # one more byte
    assert load_run_config(tmp_path).trainer.total_training_steps == 15
    stat = config.stat()
    config.write_text("trainer:\n  total_training_steps: 16\n")  # the same size, a later time
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert load_run_config(tmp_path).trainer.total_training_steps == 16


def test_a_config_replaced_by_rename_with_the_same_size_and_time_is_read_again(tmp_path):
    """A writer that renames a new file over the config (``os.replace``, as stapo.files does) may leave the old
    size and modification time; the cache must still see a new version."""
    import os

    from stapo.runs.folder import load_run_config

    config = tmp_path / "config.yaml"
    config.write_text("trainer:\n  total_training_steps: 3\n")
    assert load_run_config(tmp_path).trainer.total_training_steps == 3
    stat = config.stat()
    replacement = tmp_path / "new.yaml"
    replacement.write_text("trainer:\n  total_training_steps: 4\n")  # the same size
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same modification time
    os.replace(replacement, config)
    assert (config.stat().st_size, config.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert load_run_config(tmp_path).trainer.total_training_steps == 4
