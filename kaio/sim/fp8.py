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

from kaio.sim.numerics import F32, F64, f64_to_f32_round_to_odd
from kaio.types import ScalarType

# The canonical NaN the GPU's cvt writes, and the largest finite value, per type name.
CANONICAL_NAN = {"e4m3": 0x7F, "e5m2": 0x7F}
MAX_FINITE = {"e4m3": 448.0, "e5m2": 57344.0}


def to_fp8(x, t: ScalarType) -> np.ndarray:
    """Float values (any NumPy float dtype) converted to ``t`` as ``cvt.rn.satfinite`` does."""
    x = np.asarray(x)
    x32 = f64_to_f32_round_to_odd(x.astype(F64)) if x.dtype == F64 else x.astype(F32)
    limit = F32.type(MAX_FINITE[t.name])
    out = np.asarray(np.clip(x32, -limit, limit)).astype(t.np_dtype)
    nan = np.isnan(x32)
    if nan.any():
        out = np.array(out, copy=True)
        out.view(np.uint8)[nan] = CANONICAL_NAN[t.name]
    return out


def from_fp8(x, dtype) -> np.ndarray:
    """fp8 values converted (exactly) to a wider float NumPy dtype."""
    return np.asarray(x).astype(np.float32).astype(dtype)


def is_fp8_dtype(dtype) -> bool:
    """Whether a NumPy dtype is one of ml_dtypes' float8_e4m3fn or float8_e5m2."""
    return np.dtype(dtype) in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
