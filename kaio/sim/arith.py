"""The pure ops of the IR as NumPy functions ``fn(type, *operands)``, bit-exact with
``kaio.ir.ops``: integers wrap at their width, f16/bf16 arithmetic is computed in f32 and
rounded once, ``fma`` and every conversion round exactly once (``kaio.numerics``).

The approximate math ops are the GPU's bit for bit (``kaio.sim.mufu``), except ``tanh``
(``approx``): computed in float64 and rounded to f32, the correctly rounded value, which lies
within ``tanh.approx.f32``'s documented error bound but is not bit-identical to it.
"""

from __future__ import annotations

import numpy as np

from kaio import numerics
from kaio.sim import fp8
from kaio.types import ScalarType

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def _half(t: ScalarType) -> bool:
    return t.is_float and t.bits == 16


def _arith(ufunc):
    """A binary or unary op that wraps for integers and rounds f16/bf16 once via f32."""

    def run(t: ScalarType, *vals):
        if _half(t):
            return ufunc(*(v.astype(F32) for v in vals)).astype(t.np_dtype)
        return ufunc(*vals)

    return run


def _minmax(int_fn, float_fn):
    """Integer min/max, or the NaN-ignoring float version (PTX ``min``/``max``)."""
    int_op, float_op = _arith(int_fn), _arith(float_fn)
    return lambda t, a, b: (float_op if t.is_float else int_op)(t, a, b)


add = _arith(np.add)
sub = _arith(np.subtract)
mul = _arith(np.multiply)
div = _arith(np.divide)


def _sign_bit(mask: int, flip: bool):
    """An f16/bf16 sign operation on the bits, as both backends lower it (``xor``/``and``
    with the sign bit): a NaN keeps its payload, as on the GPU."""

    def run(a):
        bits = np.asarray(a).view(np.uint16)
        bits = bits ^ np.uint16(mask) if flip else bits & np.uint16(mask)
        return bits.view(a.dtype)

    return run


_neg_half = _sign_bit(0x8000, flip=True)
_abs_half = _sign_bit(0x7FFF, flip=False)


def neg(t: ScalarType, a):
    """-a; integers wrap; f16/bf16 flip the sign bit (NaN payloads kept)."""
    return _neg_half(np.asarray(a)) if _half(t) else np.negative(a)


def _zero_signs(r, a, b, negative):
    """Where a and b are both zeros, give r the sign PTX min/max give (-0 < +0, seen on an
    H200); the dtype stays r's."""
    both_zero = (a == 0) & (b == 0)
    if not np.any(both_zero):
        return r
    return np.where(both_zero, np.where(negative, -np.abs(r), np.abs(r)), r)


def _signed_zero_fmin(a, b):
    """np.fmin with -0.0 < +0.0."""
    return _zero_signs(np.fmin(a, b), a, b, np.signbit(a) | np.signbit(b))


def _signed_zero_fmax(a, b):
    """np.fmax with +0.0 > -0.0."""
    return _zero_signs(np.fmax(a, b), a, b, np.signbit(a) & np.signbit(b))


min_ = _minmax(np.minimum, _signed_zero_fmin)
max_ = _minmax(np.maximum, _signed_zero_fmax)


def abs_(t: ScalarType, a):
    """|a|; the most negative integer stays itself, unsigned values are unchanged; f16/bf16
    clear the sign bit (NaN payloads kept)."""
    if t.kind == "uint":
        return a
    return _abs_half(np.asarray(a)) if _half(t) else np.abs(a)


def integer(op: str):
    """An op of integers or bools only: ``kaio.numerics.integer_op``, which the constant
    folder computes with too."""
    return lambda t, *vals: numerics.integer_op(op, t, *vals)


def fma(t: ScalarType, a, b, c):
    """``a * b + c`` rounded once (f16, bf16, f32, f64)."""
    if t.bits == 16:
        return fma_half(t, a, b, c)
    fn = numerics.fma_f32 if t.bits == 32 else numerics.fma_f64
    return fn(np.asarray(a), np.asarray(b), np.asarray(c))


def fma_half(t: ScalarType, a, b, c) -> np.ndarray:
    """f16/bf16 ``a * b + c`` rounded once: the float64 product is exact, the sum is rounded
    to odd at 53 bits, then to nearest even in ``t`` (``kaio.numerics``)."""
    with np.errstate(all="ignore"):
        product = np.asarray(a).astype(F64) * np.asarray(b).astype(F64)
        total = numerics.add_round_to_odd(product, np.asarray(c).astype(F64))
        return numerics.round_f64(total, t.np_dtype)


def approx(fn):
    """f32 approximate math: computed in float64, rounded once to f32."""

    def run(t: ScalarType, a):
        return fn(np.asarray(a).astype(F64)).astype(F32)

    return run


def cvt(src: ScalarType, dst: ScalarType, a):
    """Conversion with the rules of ``kaio.ir.ops`` (fp8: ``kaio.sim.fp8``)."""
    a = np.asarray(a)
    if dst.is_fp8:
        return fp8.to_fp8(a, dst)
    if src.is_fp8:
        return fp8.from_fp8(a, dst.np_dtype)
    if dst.is_bool:
        return a != 0
    if src.is_bool or (src.is_int and dst.is_int):
        return a.astype(dst.np_dtype)  # integer narrowing wraps
    if dst.is_float:
        if src.is_float:
            return numerics.round_f64(a.astype(F64), dst.np_dtype)
        return numerics.int_to_float(a, dst.np_dtype)
    return numerics.float_to_int(a, dst)


def bitcast(src: ScalarType, dst: ScalarType, a):
    """Reinterpret the bits (same width)."""
    return np.asarray(a).view(dst.np_dtype)


def select(t: ScalarType, c, a, b):
    """``c ? a : b``."""
    return np.where(c, a, b)


def mov(t: ScalarType, a):
    """A copy (values are never modified in place, so no copy is made)."""
    return a


def compare(ufunc):
    """A comparison (bf16 compared exactly through f32)."""

    def run(t: ScalarType, a, b):
        if t.name == "bf16":
            return ufunc(a.astype(F32), b.astype(F32))
        return ufunc(a, b)

    return run


def plain(fn):
    """An op whose NumPy function already has the IR's meaning for every allowed type."""

    def run(t: ScalarType, *vals):
        return fn(*vals)

    return run
