"""Generated tasks the recipe writes on demand (``stapo.synthetic_data_dir``), rewritten only when asked for.

``synthetic`` is the tiny model's smoke task, ``arithmetic`` the demo's word problems, ``addition``
the testbed's worked multi-operand sums; all are deterministic functions of (rows, seed), so the
folder is kept as long as those match.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from stapo.files import write_text_atomically

TASKS = {
    # task name: (module with write_parquet(out_dir, train, val, seed), its file names)
    "synthetic": ("stapo.data.synthetic", ("train.parquet", "val.parquet")),
    "arithmetic": ("stapo.data.arithmetic", ("train.parquet", "heldout.parquet")),
    "addition": ("stapo.data.addition", ("train.parquet", "heldout.parquet")),
}
MARKER = "stapo_synthetic.json"


def ensure_task_data(data_dir: str | Path, train_rows: int, val_rows: int, seed: int, task: str = "synthetic") -> None:
    """Write a generated task's parquet files unless the folder already holds these exact settings."""
    if task not in TASKS:
        raise ValueError(f"stapo.synthetic_task={task!r}: known tasks are {', '.join(TASKS)}")
    module, names = TASKS[task]
    folder = Path(data_dir)
    marker = folder / MARKER
    wanted = {"task": task, "train_rows": int(train_rows), "val_rows": int(val_rows), "seed": int(seed)}
    present = all((folder / name).exists() for name in names)
    if present and marker.exists() and json.loads(marker.read_text()) == wanted:
        return
    importlib.import_module(module).write_parquet(folder, wanted["train_rows"], wanted["val_rows"], wanted["seed"])
    write_text_atomically(marker, json.dumps(wanted))
