"""Reading the recorded results (results/, benchmarks/): large JSON kept gzipped, a comparison's curves.

The repository keeps what the quoted figures need and stays small (tests/bench/test_archive_budget.py
states the budget): an archived JSON file over ``GZIP_ABOVE`` bytes is stored as ``X.json.gz`` (gzip, lossless,
no time or name in its header), so every reader of an archived ``X.json`` goes through ``read_json``, which
reads whichever of the two forms is there. Plots are not kept: ``stapo plot`` draws them from an archived
set's run folders or, for a set whose runs are gone, from the per-run series its ``comparison.json`` keeps
(``runs_from_comparison``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from stapo.rundir import ENTROPY_TOKEN_MEAN, VERL_ENTROPY
from stapo.runs.folder import RunData
from stapo.runs.summary import DECODING_ACC, SERIES

GZIP_ABOVE = 50_000  # bytes: an archived JSON file larger than this is kept gzipped
GZIP_SUFFIX = ".gz"
COMPARISON = "comparison.json"


def json_file(path: str | Path) -> Path:
    """``X.json`` if it exists, else ``X.json.gz``; FileNotFoundError naming both when neither does."""
    path = Path(path)
    packed = path.with_name(path.name + GZIP_SUFFIX)
    for file in (path, packed):
        if file.is_file():
            return file
    raise FileNotFoundError(f"{path}: no such file, nor {packed.name} beside it")


def read_json(path: str | Path):
    """The JSON document of an archived ``X.json``, read from ``X.json`` or, when absent, ``X.json.gz``."""
    file = json_file(path)
    data = file.read_bytes()
    if file.name.endswith(GZIP_SUFFIX):
        data = gzip.decompress(data)
    return json.loads(data.decode("utf-8"))


def has_comparison(folder: Path) -> bool:
    return any((folder / name).is_file() for name in (COMPARISON, COMPARISON + GZIP_SUFFIX))


# comparison.json's series names -> the metric each was read from (stapo.runs.summary)
SERIES_KEYS = {**SERIES, **{f"held_out_acc@{name}": key for name, key in DECODING_ACC.items()}}


def runs_from_comparison(folder: str | Path) -> dict[str, list[RunData]]:
    """The groups of a recorded comparison as runs whose steps hold the per-step series it kept
    (``groups[].runs[].series``; for a comparison written before series were kept, the entropy trajectory
    only), under the metric names the series were read from: what ``stapo plot`` draws for a set whose run
    folders are gone. The steps hold nothing else, so only the quantities kept can be drawn."""
    folder = Path(folder)
    document = read_json(folder / COMPARISON)
    groups: dict[str, list[RunData]] = {}
    for group in document["groups"]:
        for run in group["runs"]:
            entropy_key = ENTROPY_TOKEN_MEAN if run.get("entropy_token_mean", True) else VERL_ENTROPY
            kept = dict(run.get("series") or {})
            kept.setdefault("entropy", run.get("entropy_trajectory") or {})
            steps: dict[int, dict[str, float]] = {}
            for name, values in kept.items():
                key = entropy_key if name == "entropy" else SERIES_KEYS.get(name)
                if key is None:
                    continue
                for step, value in values.items():
                    steps.setdefault(int(step), {})[key] = value
            path = Path(run.get("run_dir") or folder / group["group"])
            groups.setdefault(group["group"], []).append(
                RunData(path, dict(sorted(steps.items())), group["group"], run.get("seed")))
    return groups
