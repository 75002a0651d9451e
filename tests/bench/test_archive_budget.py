"""The recorded results stay within a stated budget: results/ plus benchmarks/, as git tracks them.

They were 47 MB (432 files) before issue 57 and had grown tenfold in four days, 95 % of the packed history. What
a quoted figure needs is kept (each set's comparison.json, COMMAND, configs, the archived runs' metrics of the keys
a reader reads); plots are drawn on demand (``stapo plot results/<set> --out DIR``) and a JSON file over 50 KB is
kept gzipped (stapo.runs.archive), and so is each archived run's config.yaml (stapo.runs.folder.load_run_config).
A set that outgrows the budget is trimmed the same way, or the budget is raised here on purpose, with the reason,
in the same commit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stapo.runs.archive import GZIP_ABOVE

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("results", "benchmarks")
BUDGET = 12_000_000  # bytes (12 MB): results/ plus benchmarks/ were 10.0 MB when it was set (issue 57)
SHOWN = 10  # the largest files the failure lists


def tracked_sizes() -> dict[str, int]:
    """Bytes of each file git tracks under FOLDERS, as the working tree holds it (a tracked file deleted and not yet
    committed counts nothing; a new file counts once it is added)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing tells the tracked files apart")
    listed = subprocess.run(["git", "ls-files", "-z", "--", *FOLDERS], cwd=REPO, capture_output=True, check=True)
    names = [name for name in listed.stdout.decode("utf-8").split("\0") if name]
    return {name: (REPO / name).stat().st_size for name in names if (REPO / name).is_file()}


def over_budget(sizes: dict[str, int], budget: int, shown: int = SHOWN) -> str | None:
    """None within ``budget``, else one message with the total and the largest files."""
    total = sum(sizes.values())
    if total <= budget:
        return None
    largest = sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:shown]
    listing = "\n".join(f"  {size:>10,}  {name}" for name, size in largest)
    return (f"results/ + benchmarks/ hold {total:,} bytes in {len(sizes)} tracked files, over the budget of "
            f"{budget:,} (tests/bench/test_archive_budget.py); the largest:\n{listing}")


def test_the_recorded_results_stay_within_the_budget():
    sizes = tracked_sizes()
    assert sizes, "git lists no file under results/ or benchmarks/"
    message = over_budget(sizes, BUDGET)
    assert message is None, message


def test_no_plot_and_no_large_plain_json_is_tracked():
    """Plots are drawn on demand; an archived JSON file over GZIP_ABOVE bytes is kept as X.json.gz."""
    sizes = tracked_sizes()
    plots = sorted(name for name in sizes if name.endswith(".png"))
    large = sorted(name for name, size in sizes.items() if name.endswith(".json") and size > GZIP_ABOVE)
    assert not plots and not large, (plots, large)


def test_the_message_names_the_total_and_the_largest_files_first():
    sizes = {"results/a/comparison.json.gz": 700, "results/b/COMMAND": 20, "benchmarks/x.json": 300}
    assert over_budget(sizes, 1020) is None
    message = over_budget(sizes, 1019, shown=2)
    assert message.splitlines() == [
        ("results/ + benchmarks/ hold 1,020 bytes in 3 tracked files, over the budget of 1,019 "
         "(tests/bench/test_archive_budget.py); the largest:"),
        "         700  results/a/comparison.json.gz",
        "         300  benchmarks/x.json",
    ]
