"""How kaio's scalar types and constants look in LLVM IR.

==========  ===============  =============================================================
kaio        register         memory, parameters
==========  ===============  =============================================================
bool_       ``i1``           ``i8`` (0 or 1)
i8 ... u64  ``iN``           ``iN`` (LLVM integers have no sign: the ops choose ``sdiv``/``udiv``)
f16, bf16   ``half``         ``half``/``bfloat`` in memory; ``i16`` parameters (``.param .b16``)
            ``bfloat``
f32, f64    ``float``        ``float``, ``double``
f16x2 ...   ``i32``          ``i32`` (bitcast to ``<2 x half>`` / ``<2 x bfloat>`` for arithmetic)
e4m3 e5m2   ``i8``           ``i8`` (the code; conversions are inline PTX: ``kaio.llvm.fp8``)
==========  ===============  =============================================================

Constants are written with their exact bits: ``0xH3C00`` (half), ``0xR3F80`` (bfloat), and
floats and doubles as the hexadecimal double llvmlite prints, which is exact for them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from kaio.ir.nodes import Const
from kaio.ptx.regs import half_bits
from kaio.types import ScalarType


class BFloatType(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no such type)."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, BFloatType)

    def __hash__(self) -> int:
        return hash(BFloatType)


I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
HALF, BFLOAT, FLOAT, DOUBLE = ir.HalfType(), BFloatType(), ir.FloatType(), ir.DoubleType()
VOID = ir.VoidType()

# address spaces of the NVPTX target
GLOBAL, SHARED, LOCAL = 1, 3, 5

# Call-site attributes of intrinsics and inline PTX: a pure computation (LLVM may merge, hoist
# or delete it), one that only reads memory, one with side effects, and a warp-collective one
# (never moved into divergent code).
PURE = ("nounwind", "readnone")
READS = ("nounwind", "readonly")
EFFECTS = ("nounwind",)
CONVERGENT = ("convergent",)

_FLOATS = {"f16": HALF, "bf16": BFLOAT, "f32": FLOAT, "f64": DOUBLE}


def lltype(t: ScalarType) -> ir.Type:
    """The register type of ``t``."""
    if t.is_bool:
        return I1
    if t.is_packed:
        return I32
    if t.is_fp8:
        return I8
    if t.is_float:
        return _FLOATS[t.name]
    return ir.IntType(t.bits)


def memtype(t: ScalarType) -> ir.Type:
    """The type of ``t`` in memory (bool is one byte)."""
    return I8 if t.is_bool else lltype(t)


def paramtype(t: ScalarType) -> ir.Type:
    """The type of a scalar kernel parameter of type ``t`` (16-bit floats travel as i16)."""
    if t.is_float and t.bits == 16:
        return I16
    return memtype(t)


def pair(t: ScalarType) -> ir.VectorType:
    """The vector type of a packed pair's halves: ``<2 x half>`` or ``<2 x bfloat>``."""
    return ir.VectorType(lltype(t.element), 2)


def int_const(ty: ir.IntType, value: int) -> ir.Constant:
    """An integer constant of ``ty`` from any Python int (wrapped to the width, printed signed)."""
    bits = ty.width
    value &= (1 << bits) - 1
    if bits > 1 and value >= 1 << (bits - 1):
        value -= 1 << bits
    return ir.Constant(ty, value)


def half_const(t: ScalarType, value: float) -> ir.Constant:
    """An f16 or bf16 constant, rounded to nearest even, as its exact bits."""
    prefix = "0xH" if t.name == "f16" else "0xR"
    return ir.FormattedConstant(lltype(t), f"{prefix}{half_bits(value, t):04X}")


def half_bits_const(t: ScalarType, bits: int) -> ir.Constant:
    """An f16 or bf16 constant given by its 16-bit pattern (NaNs with a chosen payload)."""
    prefix = "0xH" if t.name == "f16" else "0xR"
    return ir.FormattedConstant(lltype(t), f"{prefix}{bits & 0xFFFF:04X}")


def const(c: Const) -> ir.Constant:
    """The LLVM constant of a kaio ``Const`` (packed pairs: their 32-bit pattern)."""
    t = c.type
    if t.is_bool:
        return ir.Constant(I1, int(bool(c.value)))
    if t.is_fp8:
        return int_const(I8, int(np.asarray(t(c.value)).view(np.uint8)))
    if t.is_float and t.bits == 16:
        return half_const(t, float(c.value))
    if t.is_float:
        return ir.Constant(lltype(t), float(c.value))
    return int_const(lltype(t), int(c.value))
