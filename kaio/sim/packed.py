"""The simulator's meaning of packed half-precision pairs (``f16x2``, ``bf16x2``), ``prmt``
and ``lop3``.

A pair is a ``uint32`` (element 0 in the low 16 bits). Arithmetic splits it into its two
halves, applies the scalar f16/bf16 meaning of ``kaio.sim.arith`` to each (computed in f32
and rounded once; ``fma`` exactly, with one rounding; ``exp2`` as ``ex2.approx``) and joins
them again. A NaN half is the
canonical 0x7FFF, as the GPU's f16/bf16 arithmetic gives; ``neg`` and ``abs`` only flip or
clear the sign bits. ``semantics()`` gives the entries of ``kaio.sim.semantics.SEMANTICS``.
"""

from __future__ import annotations

import numpy as np

from kaio.ir.ops import PACKED_OPS
from kaio.sim import arith
from kaio.types import ScalarType, f32, unpack_host

U16 = np.dtype(np.uint16)
U32 = np.dtype(np.uint32)
F64 = np.dtype(np.float64)
CANONICAL_NAN = 0x7FFF


def split(t: ScalarType, p) -> tuple[np.ndarray, np.ndarray]:
    """The low and high halves of packed values of type ``t``, as ``t.element`` arrays."""
    return unpack_host(t, p)


def join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two arrays of 16-bit floats packed into uint32 (``lo`` in the low half)."""
    lo_bits = np.asarray(lo).view(U16).astype(U32)
    hi_bits = np.asarray(hi).view(U16).astype(U32)
    return lo_bits | (hi_bits << np.uint32(16))


def canonical(x: np.ndarray) -> np.ndarray:
    """16-bit floats with every NaN replaced by the canonical NaN 0x7FFF."""
    x = np.asarray(x)
    nan = np.isnan(x.astype(np.float32))
    if not nan.any():
        return x
    bits = np.where(nan, np.uint16(CANONICAL_NAN), x.view(U16))
    return bits.astype(U16).view(x.dtype)


def _per_half(fn):
    """A packed op from a scalar ``fn(element_type, *halves)``; NaN results canonical."""

    def run(t: ScalarType, *vals):
        halves = [split(t, v) for v in vals]
        lo = canonical(fn(t.element, *(h[0] for h in halves)))
        hi = canonical(fn(t.element, *(h[1] for h in halves)))
        return join(lo, hi)

    return run


def _bits(mask: int, flip: bool):
    def run(t: ScalarType, a):
        a = np.asarray(a).astype(U32)
        return a ^ np.uint32(mask) if flip else a & np.uint32(mask)

    return run


def _ex2(element: ScalarType, x):
    """``ex2.approx`` of one half: 2**x computed in float64, rounded once to the half type
    (the hardware's is within 2^-9.9 relative of it); bf16 (``.ftz``) flushes subnormal
    inputs and results to zero."""
    x = np.asarray(x).astype(F64)
    if element.name == "bf16":
        tiny = float(np.finfo(np.float32).tiny)  # bf16 has f32's exponent range
        x = np.where(np.abs(x) < tiny, 0.0, x)
        y = arith.cvt(f32, element, np.exp2(x).astype(np.float32))
        return np.where(np.abs(y.astype(np.float32)) < tiny, np.zeros_like(y), y)
    return arith.cvt(f32, element, np.exp2(x).astype(np.float32))


ARITH = {
    "add": _per_half(arith.add),
    "sub": _per_half(arith.sub),
    "mul": _per_half(arith.mul),
    "fma": _per_half(arith.fma),
    "min": _per_half(arith.min_),
    "max": _per_half(arith.max_),
    "neg": _bits(0x80008000, flip=True),
    "abs": _bits(0x7FFF7FFF, flip=False),
    "exp2": _per_half(_ex2),
}


def pack(t: ScalarType, lo, hi) -> np.ndarray:
    """Two halves of ``t.element`` joined as they are, or two f32 values each rounded once to
    nearest even (NaN canonical), with ``lo`` in the low half."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    if lo.dtype == f32.np_dtype:
        lo, hi = (canonical(arith.cvt(f32, t.element, x)) for x in (lo, hi))
    return join(*np.broadcast_arrays(lo, hi))


def prmt(a, b, selector) -> np.ndarray:
    """PTX ``prmt.b32`` (default mode): byte i of the result is byte ``s & 7`` of the 8 bytes
    ``{b, a}`` (a is bytes 0-3), or that byte's sign bit replicated when ``s & 8``, where
    ``s`` is nibble i of the selector."""
    a, b, c = (np.asarray(x).astype(np.uint64) for x in (a, b, selector))
    source = a | (b << np.uint64(32))
    out = np.zeros(np.broadcast(a, b, c).shape, np.uint64)
    for i in range(4):
        s = (c >> np.uint64(4 * i)) & np.uint64(0xF)
        byte = (source >> ((s & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
        sign = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        byte = np.where(s & np.uint64(8), sign, byte)
        out |= byte << np.uint64(8 * i)
    return out.astype(U32)


def lop3(a, b, c, lut: int) -> np.ndarray:
    """PTX ``lop3.b32``: each result bit is bit ``4 a + 2 b + c`` of ``lut`` (of the three
    operands' bits at that position)."""
    a, b, c = (np.asarray(x).astype(U32) for x in (a, b, c))
    out = np.zeros(np.broadcast(a, b, c).shape, U32)
    for i in range(8):
        if lut >> i & 1:
            out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    return out


def _route(scalar, packed):
    def run(m, ins, vals):
        t = ins.dst.type
        return packed(t, *vals) if t.is_packed else scalar(m, ins, vals)

    return run


def semantics(table: dict) -> dict:
    """Entries for ``SEMANTICS``: the ops of ``PACKED_OPS`` routed here when their type is
    packed (else to ``table``'s entry), and the packed-only ops."""
    return {
        **{op: _route(table[op], ARITH[op]) for op in PACKED_OPS},
        "pack": lambda m, ins, vals: pack(ins.dst.type, *vals),
        "unpack_lo": lambda m, ins, vals: split(ins.args[0].type, vals[0])[0],
        "unpack_hi": lambda m, ins, vals: split(ins.args[0].type, vals[0])[1],
        "prmt": lambda m, ins, vals: prmt(*vals),
        "lop3": lambda m, ins, vals: lop3(*vals, ins.attrs["lut"]),
    }
