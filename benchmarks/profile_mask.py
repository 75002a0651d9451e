"""``python -m benchmarks.profile_mask [--device cuda]``: where ``build_token_mask`` spends a paper-size step.

torch.profiler over the registry's ``stapo`` entry with every diagnostic on the ``all_max`` batch of
``benchmarks/mask_build.py`` (2048 x 15360 tokens); prints the operators by total time. Not a section of
BENCHMARKS.md: the table there says how long, this says where (used for the GPU figures of section 2a).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import pick_device, sync
from benchmarks.mask_build import _build, paper_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--responses", type=int, default=2048)
    parser.add_argument("--max-len", type=int, default=15360)
    args = parser.parse_args()
    device = pick_device(args.device)
    batch = [t.to(device) for t in paper_batch(args.responses, args.max_len, "all_max")[:4]]
    _build(*batch)  # warm-up
    sync(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        _build(*batch)
        sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=50))


if __name__ == "__main__":
    main()
