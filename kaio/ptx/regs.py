"""How each DSL scalar type lives in PTX registers and memory.

Register classes (one ``.reg`` declaration each)::

    bool_                      %p   .pred
    f16, bf16                  %h   .b16  (raw bits; f16 ops take .b16 registers)
    e4m3, e5m2                 %h   .b16  (the code in the low byte; the high byte is junk)
    i8 u8 i16 u16 i32 u32      %r   .b32
    i64 u64                    %rd  .b64
    f32                        %f   .f32
    f64                        %fd  .f64

Narrow integers (i8, u8, i16, u16) live in 32-bit registers, *normalised*: always sign-extended
(signed) or zero-extended (unsigned) from their width. Loads (``ld.s8``/``ld.u16``...) produce
that form, and every op that can leave it (add, sub, mul, neg, shl, ...) is followed by one
``cvt.s32.s8``-style instruction; compares, min/max, shifts right and bitwise ops need nothing.
Stores truncate (``st.u8``). bool in memory is one byte (0 or 1).
"""

from __future__ import annotations

import struct

import numpy as np

from kaio.ir.nodes import Const
from kaio.types import ScalarType

# storage class (its ``.reg`` type) -> register prefix
REG_PREFIX: dict[str, str] = {
    "pred": "%p",
    "b16": "%h",
    "b32": "%r",
    "b64": "%rd",
    "f32": "%f",
    "f64": "%fd",
}


def storage(t: ScalarType) -> str:
    """The register class key of ``t`` (see the module docstring)."""
    if t.is_bool:
        return "pred"
    if t.is_fp8:
        return "b16"
    if t.is_float:
        return {16: "b16", 32: "f32", 64: "f64"}[t.bits]
    return "b64" if t.bits == 64 else "b32"


def is_narrow(t: ScalarType) -> bool:
    """True for i8, u8, i16, u16 (kept normalised in 32-bit registers)."""
    return t.is_int and t.bits < 32


def is_half(t: ScalarType) -> bool:
    """True for f16 and bf16."""
    return t.is_float and t.bits == 16


def ity(t: ScalarType) -> str:
    """The PTX type of arithmetic on ``t``'s register (``s32`` for i8: it lives in 32 bits)."""
    if is_narrow(t):
        return "s32" if t.kind == "int" else "u32"
    return t.ptx


def sty(t: ScalarType) -> str:
    """The signed integer PTX type of ``t``'s register width (``neg`` has no unsigned form)."""
    return "s64" if t.bits == 64 else "s32"


def bty(t: ScalarType) -> str:
    """The bit-size PTX type of ``t``'s register (``b16``, ``b32``, ``b64``) or ``pred``."""
    if t.is_bool:
        return "pred"
    if t.is_fp8:
        return "b16"
    return {16: "b16", 32: "b32", 64: "b64"}[max(t.bits, 32) if t.is_int else t.bits]


def mem_type(t: ScalarType) -> str:
    """The PTX type of a load, store or parameter of ``t`` (``u8`` for bool, ``b16`` for
    f16/bf16, ``s8``... for narrow integers, which ``ld`` extends into a 32-bit register)."""
    if t.is_bool or t.is_fp8:
        return "u8"
    if is_half(t):
        return "b16"
    return t.ptx


def normalise(t: ScalarType, reg: str) -> str | None:
    """The instruction that re-extends a narrow integer register in place, or None."""
    if not is_narrow(t):
        return None
    s = "s" if t.kind == "int" else "u"
    return f"cvt.{s}32.{s}{t.bits} {reg}, {reg}"


def half_bits(value: float, t: ScalarType) -> int:
    """The 16-bit pattern of ``value`` as an f16 or bf16 (round to nearest even)."""
    return int(np.asarray(value, dtype=t.np_dtype).view(np.uint16))


def immediate(c: Const) -> str:
    """A constant as a PTX literal, exact: hex bit patterns for floats (``0f3F800000``)."""
    t = c.type
    if t.is_bool:
        return "1" if c.value else "0"
    if t.is_fp8:
        return f"0x{int(np.asarray(t(c.value)).view(np.uint8)):02X}"
    if t.is_float:
        if t.bits == 16:
            return f"0x{half_bits(c.value, t):04X}"
        if t.bits == 32:
            return f"0f{struct.unpack('>I', struct.pack('>f', float(c.value)))[0]:08X}"
        return f"0d{struct.unpack('>Q', struct.pack('>d', float(c.value)))[0]:016X}"
    v = int(c.value)
    return str(v) if v < 2**31 else hex(v)
