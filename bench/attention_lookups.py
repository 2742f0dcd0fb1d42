"""``n`` unplanned Hopper attention launches at a small shape, for compute-sanitizer to count
the driver calls a launch makes (issue 31): ``python3 bench/attention_lookups.py N KEPT``
(``KEPT``: ``kaio.tensormap.MAPS_KEPT``; 0 encodes the three tensor maps on every launch)."""

from __future__ import annotations

import importlib
import sys

import torch

from kaio_ops import _attention_hopper as hopper
from kaio_ops import attention

tensormap = importlib.import_module("kaio.tensormap")


def main() -> None:
    """Launch ``N`` times, then synchronize."""
    n, kept = int(sys.argv[1]), int(sys.argv[2])
    tensormap.MAPS_KEPT = kept
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    (qa, ka, va), dims, scale = attention._check_flash("lookups", q, k, v, None)
    for _ in range(n):
        hopper.launch(qa, ka, va, dims, False, scale)
    torch.cuda.synchronize()
    print(f"launches {n} MAPS_KEPT {kept}: done")


if __name__ == "__main__":
    main()
