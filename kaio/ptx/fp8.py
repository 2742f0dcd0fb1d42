"""PTX for the conversions between the 8-bit floats (e4m3, e5m2) and f16, bf16, f32.

An fp8 value lives in a .b16 register, its code in the low byte (the high byte is junk:
loads zero it, conversions to fp8 write a copy of the value there). From fp8,
``cvt.rn.f16x2.e4m3x2`` widens both bytes to f16 (exact) and the low half is kept; f32 and
bf16 go on from that f16 exactly. To fp8, ``cvt.rn.satfinite.e4m3x2.f32`` (f32, and bf16
widened exactly to f32 first) or ``.f16x2`` (f16) rounds to nearest even and saturates.
sm_89+, PTX ISA 8.1 (ptxas accepts 7.8 on sm_90 only; the ``fp8_cvt`` feature of
``kaio.ir.legality``).
"""

from __future__ import annotations

from kaio.types import ScalarType, f16, f32, u32


def _fmt(t: ScalarType) -> str:
    return f"{t.name}x2"  # e4m3x2, e5m2x2


def convert(e, d: str, dt: ScalarType, a: str, st: ScalarType) -> None:
    """``d: dt = a: st`` where one side is fp8 and the other f16, bf16 or f32 (or fp8)."""
    if st.is_fp8:
        half = d if dt == f16 else e.tmp(f16)
        pair = e.tmp(u32)
        e.line(f"cvt.rn.f16x2.{_fmt(st)} {pair}, {a}")
        e.line(f"cvt.u16.u32 {half}, {pair}")
        if dt == f16:
            return
        if dt == f32:
            e.line(f"cvt.f32.f16 {d}, {half}")
            return
        wide = e.tmp(f32)  # bf16: exact through f32
        e.line(f"cvt.f32.f16 {wide}, {half}")
        e.line(f"cvt.rn.bf16.f32 {d}, {wide}")
        return
    if st == f16:
        pair = e.tmp(u32)
        e.line(f"mov.b32 {pair}, {{{a}, {a}}}")
        e.line(f"cvt.rn.satfinite.{_fmt(dt)}.f16x2 {d}, {pair}")
        return
    if st != f32:  # bf16: exact to f32
        wide = e.tmp(f32)
        e.line(f"cvt.f32.bf16 {wide}, {a}")
        a = wide
    e.line(f"cvt.rn.satfinite.{_fmt(dt)}.f32 {d}, {a}, {a}")
