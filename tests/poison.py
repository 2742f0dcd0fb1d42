"""Poisoned allocations: every array ``kaio_ops`` allocates (outputs, workspaces) starts as
NaN (floats) or 0xA5 bytes (integers), so an element no kernel wrote fails the checks."""

from __future__ import annotations

import numpy as np

from kaio_ops import _arrays

POISON = 0xA5


def poison_allocations(monkeypatch) -> None:
    """Make ``kaio_ops._arrays._allocate`` fill what it returns, for every kind of array."""
    allocate = _arrays._allocate

    def poisoned(like, shape, dtype):
        out = allocate(like, shape, dtype)
        fill = float("nan") if dtype.is_float else POISON
        if like.kind == "numpy":
            out[...] = fill
        elif like.kind == "torch":
            out.fill_(fill)
        elif like.kind == "cupy":
            out.fill(fill)
        else:
            out.copy_from_host(np.full(shape, fill, dtype.np_dtype))
        return out

    monkeypatch.setattr(_arrays, "_allocate", poisoned)
