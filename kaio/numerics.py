"""Exact floating-point helpers: one rounding, fused multiply-add, conversions (fp8 included);
and the IR's integer ops on NumPy values (``integer_op``).

Backend-neutral: the host conversions of ``kaio.types`` (``kaio.f16x2(...)``, ``kaio.e4m3(...)``)
and the simulator use them, the constant folder (``kaio.ir.passes``) computes integer results
with ``integer_op`` as the simulator does, and this module imports none of them.

NumPy's own casts round twice in a few places (``float64 -> bfloat16`` and ``int64 ->
bfloat16`` go through float32). Everything here rounds exactly once, using *round to odd*:
rounding a value to odd at 53 bits and then to nearest even at p <= 51 bits gives the same
result as one rounding to nearest even (Boldo and Melquiond, "Emulation of FMA and
correctly-rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kaio.types import ScalarType

F64 = np.dtype(np.float64)
F32 = np.dtype(np.float32)


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``s = fl(a + b)`` and the exact error ``e`` with ``a + b == s + e`` (Knuth's TwoSum)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _nudge_to_odd(s: np.ndarray, inexact: np.ndarray, toward: np.ndarray) -> np.ndarray:
    """Round-to-odd fix-up: where ``inexact`` and the significand of ``s`` is even, step one
    ulp toward ``toward`` (the exact value lies between ``s`` and that neighbour)."""
    bits = s.view(np.uint64 if s.dtype == F64 else np.uint32)
    fix = inexact & ((bits & 1) == 0) & np.isfinite(s)
    if fix.any():
        s = s.copy()
        s[fix] = np.nextafter(s[fix], toward[fix])
    return s


def add_round_to_odd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` (float64) rounded to odd."""
    s, e = two_sum(a, b)
    return _nudge_to_odd(s, e != 0, s + np.where(e > 0, np.inf, -np.inf))


def f64_to_f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 values rounded to odd at float32 precision."""
    r = x.astype(F32)
    r64 = r.astype(F64)
    inexact = (r64 != x) & ~np.isnan(x)
    return _nudge_to_odd(r, inexact, np.where(x > r64, np.inf, -np.inf).astype(F32))


def round_f64(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 values rounded once to nearest even in ``dtype`` (f64, f32, f16 or bf16)."""
    dtype = np.dtype(dtype)
    if dtype == F64:
        return x
    if dtype in (F32, np.dtype(np.float16)):
        return x.astype(dtype)  # NumPy rounds these directly from float64
    return f64_to_f32_round_to_odd(x).astype(dtype)


def int_to_f64_round_to_odd(x: np.ndarray) -> np.ndarray:
    """64-bit integers as float64, rounded to odd (exact for |x| < 2**53)."""
    hi = (x >> 32).astype(F64) * 2.0**32  # exact: at most 32 significant bits
    lo = (x & 0xFFFFFFFF).astype(F64)
    return add_round_to_odd(hi, lo)


def int_to_float(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Integers converted to a float type, rounded once to nearest even."""
    dtype = np.dtype(dtype)
    if x.dtype.itemsize < 8:
        return round_f64(x.astype(F64), dtype)
    if dtype == F64:
        return x.astype(F64)  # the C conversion rounds once
    return round_f64(int_to_f64_round_to_odd(x), dtype)


def float_to_int(x: np.ndarray, t: ScalarType) -> np.ndarray:
    """Floats converted to integer type ``t``: truncate toward zero, saturate, NaN gives 0
    (PTX ``cvt.rzi.sat``)."""
    x = np.trunc(x.astype(F64))
    lo = -(2 ** (t.bits - 1)) if t.kind == "int" else 0
    hi = 2 ** (t.bits - 1) if t.kind == "int" else 2**t.bits  # exclusive, a power of two
    over = x >= float(hi)
    under = x < float(lo)
    bad = over | under | np.isnan(x)
    out = np.where(bad, 0.0, x).astype(t.np_dtype)
    out[over] = hi - 1
    out[under] = lo
    return out


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 ``a * b + c``: the float64 product is exact, the sum is
    rounded to odd at 53 bits and then to nearest at 24 bits."""
    p = a.astype(F64) * b.astype(F64)
    return add_round_to_odd(p, c.astype(F64)).astype(F32)


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp split of float64 values into two 26-bit halves (|a| < 2**996)."""
    t = a * 134217729.0  # 2**27 + 1
    hi = t - (t - a)
    return hi, a - hi


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's exact product ``a * b == p + e`` (no overflow or underflow)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def _in_range(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    ax = np.abs(x)
    return (ax >= lo) & (ax <= hi)


def fma_f64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded float64 ``a * b + c``.

    Vectorized Boldo-Melquiond emulation (exact product, exact sum, round to odd, one final
    rounding) where no intermediate can overflow or underflow; the rare remaining finite
    inputs are computed exactly with ``fractions.Fraction``.
    """
    a, b, c = np.broadcast_arrays(a.astype(F64), b.astype(F64), c.astype(F64))
    with np.errstate(all="ignore"):
        out = a * b + c  # exact whenever a product factor is 0, or for inf/nan inputs
        finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
        # a finite product plus an infinite c is c, even when the product overflows
        out = np.where(np.isfinite(a) & np.isfinite(b) & np.isinf(c), c, out)
        general = finite & (a != 0) & (b != 0)
        safe = (
            general
            & _in_range(a, 2.0**-450, 2.0**450)
            & _in_range(b, 2.0**-450, 2.0**450)
            & ((c == 0) | _in_range(c, 2.0**-900, 2.0**900))
        )
        if safe.any():
            sa, sb, sc = a[safe], b[safe], c[safe]
            uh, ul = _two_prod(sa, sb)
            th, tl = two_sum(sc, uh)
            out[safe] = th + add_round_to_odd(tl, ul)
    for i in np.flatnonzero(general & ~safe):
        out[i] = _fma_exact(float(a[i]), float(b[i]), float(c[i]))
    return out


def _fma_exact(a: float, b: float, c: float) -> float:
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # a and b are nonzero: an exact cancellation, +0 when rounding to nearest
        return 0.0
    try:
        return float(exact)  # int / int true division rounds correctly
    except OverflowError:
        return float("inf") if exact > 0 else float("-inf")


# ----------------------------------------------------------------------------- integers

# Integer (and bool) ops that are one NumPy ufunc on values of the type's dtype: NumPy's
# integers wrap at their width, and floor_divide/remainder are Python's ``//`` and ``%``.
_INTEGER_UFUNCS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "floordiv": np.floor_divide,
    "mod": np.remainder,
    "min": np.minimum,
    "max": np.maximum,
    "neg": np.negative,
    "invert": np.invert,
    "not": np.logical_not,
}


def shl(t: ScalarType, a, n):
    """``a << n`` with a u32 amount; amounts >= the width give 0."""
    s = np.minimum(n, t.bits - 1).astype(t.np_dtype)
    return np.where(n >= t.bits, np.zeros((), t.np_dtype), np.left_shift(a, s))


def shr(t: ScalarType, a, n):
    """``a >> n`` with a u32 amount: arithmetic for signed types; clamped like PTX."""
    s = np.minimum(n, t.bits - 1).astype(t.np_dtype)
    shifted = np.right_shift(a, s)
    if t.kind == "int":
        return shifted  # a shift by width-1 already gives the sign fill
    return np.where(n >= t.bits, np.zeros((), t.np_dtype), shifted)


INTEGER_OPS = frozenset(_INTEGER_UFUNCS) | {"shl", "shr"}
"""The ops ``integer_op`` computes."""


def integer_op(op: str, t: ScalarType, *vals):
    """The IR op ``op`` (one of ``INTEGER_OPS``) on NumPy values of the integer or bool type
    ``t`` (a shift amount is u32), as ``kaio.ir.ops`` defines it: wrapping at the width,
    Python's floor division and modulo, PTX's clamped shifts. Division by zero gives an
    unspecified value, as on the GPU. NumPy warns of a wrap unless called under
    ``np.errstate(all="ignore")`` (as the simulator runs)."""
    if op == "shl":
        return shl(t, *vals)
    if op == "shr":
        return shr(t, *vals)
    return _INTEGER_UFUNCS[op](*vals)


# The 8-bit floats: the canonical NaN the GPU's cvt writes, and the largest finite value, per
# type name (kaio.sim.fp8 describes the conversions).
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
