"""``stapo check`` says how many training rows each epoch leaves out and how many steps the run makes.

verl's training dataloader drops the last incomplete batch (``drop_last=True``, verl/trainer/ppo/v1/trainer_base.py):
301 rows in batches of 256 train one step and never see 45 rows (issue 61). The note is checked against a real
torch ``DataLoader`` with verl's ``drop_last`` over the same rows, on real parquet files and the recipe's own
composition (``stapo.check.compose_run``).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from stapo.check import compose_run
from stapo.data.rows import rl_row, write_rows
from stapo.input_checks import check_inputs


def rows_seen(rows: int, batch: int, epochs: int, steps: int | None, shuffle: bool) -> tuple[int, set[int]]:
    """(steps trained, rows never read in the first epoch) by a torch DataLoader with verl's drop_last."""
    loader = DataLoader(range(rows), batch_size=batch, drop_last=True, shuffle=shuffle,
                        generator=torch.Generator().manual_seed(0))
    done, first_epoch = 0, set()
    for epoch in range(epochs):
        for indices in loader:
            if steps is not None and done == steps:
                return done, set(range(rows)) - first_epoch
            done += 1
            if epoch == 0:
                first_epoch.update(int(i) for i in indices)
    return done, set(range(rows)) - first_epoch


@pytest.mark.parametrize("rows, batch, epochs, steps, shuffle", [
    (301, 256, 1, None, True), (301, 256, 1, 1, False), (12, 4, 2, None, True), (14, 4, 3, 5, True),
    (40, 4, 1, 3, False), (13, 4, 1, 2, True),
])
def test_the_rows_left_out_and_the_steps_are_said(tmp_path, rows, batch, epochs, steps, shuffle):
    train = write_rows(tmp_path / "train.parquet", [rl_row("t", f"{i} + 1 = ?", str(i + 1), {"index": i})
                                                    for i in range(rows)])
    overrides = ["model_preset=tiny", "stapo.cpu_preset.allow_other_inputs=true", "stapo.synthetic_data_dir=null",
                 f"data.train_files={train}", f"data.val_files=[{train}]", f"data.train_batch_size={batch}",
                 f"trainer.total_epochs={epochs}", f"trainer.total_training_steps={'null' if steps is None else steps}",
                 f"data.shuffle={str(shuffle).lower()}"]
    note = check_inputs(compose_run(overrides))[-1]
    trained, unseen = rows_seen(rows, batch, epochs, steps, shuffle)
    assert note.startswith(f"steps: {trained}, ")
    left = rows - rows // batch * batch  # what one whole epoch leaves out
    if left:
        which = "other rows each epoch (data.shuffle=true)" if shuffle else "the same last rows each epoch"
        assert f"; each epoch leaves out {left} of the {rows} rows ({which}: verl drops the last incomplete batch " \
               f"of data.train_batch_size={batch})" in note
    else:
        assert "leaves out" not in note
    if len(unseen) > left:  # the run ends inside its first epoch
        assert note.endswith(f"; the run's {trained} step(s) read {rows - len(unseen)} of the {rows} rows")
    else:
        assert "step(s) read" not in note
