"""The 8-bit floats e4m3 and e5m2 in the simulator: the GPU's conversions, bit for bit.

To fp8, PTX has only ``cvt.rn.satfinite``: round to nearest even, anything beyond the largest
finite value (infinities included) saturates to it with its sign, and NaN becomes the
canonical NaN ``0x7F``. ml_dtypes rounds the same way but overflows to NaN (e4m3) or infinity
(e5m2), so values are clipped to the finite range first; clipping before rounding is the same
as saturating after it, as everything past the largest value rounds to it or beyond. Inputs
are rounded to f32 to odd first, which keeps one rounding overall (docs/dsl-reference.md).
From fp8 every conversion is exact (f16, bf16 and f32 hold every fp8 value).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kaio.numerics import CANONICAL_NAN, MAX_FINITE, to_fp8

__all__ = ["CANONICAL_NAN", "MAX_FINITE", "from_fp8", "is_fp8_dtype", "to_fp8"]


def from_fp8(x, dtype) -> np.ndarray:
    """fp8 values converted (exactly) to a wider float NumPy dtype."""
    return np.asarray(x).astype(np.float32).astype(dtype)


def is_fp8_dtype(dtype) -> bool:
    """Whether a NumPy dtype is one of ml_dtypes' float8_e4m3fn or float8_e5m2."""
    return np.dtype(dtype) in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
