"""A generic kernel in a module without ``from __future__ import annotations``: the dtype
parameter's annotations are quoted (tests/test_dsl_generic.py)."""

import kaio
from kaio import u32


@kaio.gpu_kernel(block_size=32)
def scale_copy(x: "DT[:]", out: "DT[:]", n: u32, DT: kaio.constexpr):  # noqa: F821
    """out = x * 3 in x's element type."""
    i = kaio.thread_idx_x()
    if i < n:
        out[i] = x[i] * DT(3)
