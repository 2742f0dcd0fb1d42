"""Conversions between the 8-bit floats (e4m3, e5m2) and f16, bf16, f32 in LLVM IR: the
PTX emitter's instructions (``kaio.ptx.fp8``) as inline PTX, so both backends round and
saturate alike. An fp8 value is an ``i8`` (register and memory); the instructions work on
16-bit registers (the ``h`` constraint), so it is widened and narrowed around them.
"""

from __future__ import annotations

from kaio.llvm.typemap import BFLOAT, FLOAT, HALF, I8, I16, I32, PURE
from kaio.types import ScalarType, f16, f32


def convert(g, a, st: ScalarType, dt: ScalarType):
    """``a: st`` converted to ``dt`` where one side is fp8 and the other f16, bf16 or f32."""
    b = g.b
    if st.is_fp8:
        text = f"cvt.rn.f16x2.{st.name}x2 $0, $1;"
        pair = g.asm(text, "=r,h", I32, [b.zext(a, I16)], PURE)
        half = b.bitcast(b.trunc(pair, I16), HALF)
        if dt == f16:
            return half
        wide = b.fpext(half, FLOAT)  # exact
        return wide if dt == f32 else b.fptrunc(wide, BFLOAT)  # bf16: exact too
    if st == f16:
        text = (
            f"{{ .reg .b32 t; mov.b32 t, {{$1, $1}}; cvt.rn.satfinite.{dt.name}x2.f16x2 $0, t; }}"
        )
        code = g.asm(text, "=h,h", I16, [b.bitcast(a, I16)], PURE)
        return b.trunc(code, I8)
    if st != f32:  # bf16: exact to f32
        a = b.fpext(a, FLOAT)
    code = g.asm(f"cvt.rn.satfinite.{dt.name}x2.f32 $0, $1, $1;", "=h,f", I16, [a], PURE)
    return b.trunc(code, I8)
