"""Packed half-precision pairs (``f16x2``, ``bf16x2``), ``prmt`` and ``lop3`` in LLVM IR.

A pair is an ``i32`` (element 0 in the low half, PTX's layout). The ops of
``kaio.ir.ops.PACKED_OPS`` bitcast it to ``<2 x half>`` / ``<2 x bfloat>`` and use LLVM's
vector arithmetic (``add.rn.f16x2``, ``fma.rn.bf16x2``... once the NVPTX backend has chosen;
every form rounds each half once), NVVM's ``fmin``/``fmax`` for pairs, ``ex2.approx`` of a
pair as inline PTX, and integer ``xor``/``and`` of the sign bits for ``neg``/``abs``. Which
ops an arch allows, and the errors for the others, are ``kaio.ir.legality``'s, checked before
either backend runs, so both accept the same kernels.
"""

from __future__ import annotations

from kaio.ir.nodes import Instr
from kaio.llvm.typemap import I16, I32, PURE, int_const, lltype, pair
from kaio.ptx import packed as ptx
from kaio.types import f32

_NVVM_PAIR = {"f16x2": "f16x2", "bf16x2": "bf16x2"}


def _vector_op(name: str):
    return lambda g, t, v: getattr(g.b, name)(*v)


def _nvvm(which: str):
    def lower(g, t, v):
        return g.intrinsic(f"llvm.nvvm.{which}.{_NVVM_PAIR[t.name]}", v[0].type, list(v))

    return lower


def _ex2(g, t, v):
    """ex2.approx of both halves in one instruction, as inline PTX (``kaio.ptx.packed``'s
    form: NVVM's pair intrinsics differ between LLVM versions)."""
    word = g.b.bitcast(v[0], I32)
    text = ptx.FORMS["exp2"][t.name][0].format(d="$0", a="$1") + ";"
    return g.b.bitcast(g.asm(text, "=r,r", I32, [word], PURE), v[0].type)


def _fma(g, t, v):
    return g.intrinsic("llvm.fma.v2" + ("f16" if t.name == "f16x2" else "bf16"), v[0].type, v)


# op -> a function (g, t, halves) on <2 x half/bfloat> values, or (integer op, mask) for
# neg/abs, which work on both sign bits of the i32
ARITH = {
    "add": _vector_op("fadd"),
    "sub": _vector_op("fsub"),
    "mul": _vector_op("fmul"),
    "fma": _fma,
    "min": _nvvm("fmin"),
    "max": _nvvm("fmax"),
    "neg": ("xor", 0x80008000),
    "abs": ("and", 0x7FFF7FFF),
    "exp2": _ex2,
}


def arith(g, ins: Instr) -> None:
    """An op of ``PACKED_OPS`` on a packed type."""
    t = ins.dst.type
    words = [g.value(x) for x in ins.args]
    how = ARITH[ins.op]
    if isinstance(how, tuple):
        op, mask = how
        g.set(ins.dst, getattr(g.b, op)(words[0], int_const(I32, mask)))
        return
    halves = [g.b.bitcast(w, pair(t)) for w in words]
    g.set(ins.dst, g.b.bitcast(how(g, t, halves), I32))


def _pack(g, ins: Instr) -> None:
    t = ins.dst.type
    lo, hi = ins.args
    a, b = g.value(lo), g.value(hi)
    if lo.type == f32:  # two f32, each rounded once
        element = lltype(t.element)
        a, b = g.b.fptrunc(a, element), g.b.fptrunc(b, element)
    low = g.b.zext(g.b.bitcast(a, I16), I32)
    high = g.b.shl(g.b.zext(g.b.bitcast(b, I16), I32), int_const(I32, 16))
    g.set(ins.dst, g.b.or_(low, high))


def _unpack(g, ins: Instr) -> None:
    word = g.value(ins.args[0])
    if ins.op == "unpack_hi":
        word = g.b.lshr(word, int_const(I32, 16))
    g.set(ins.dst, g.b.bitcast(g.b.trunc(word, I16), lltype(ins.dst.type)))


def _prmt(g, ins: Instr) -> None:
    a, b, selector = (g.value(x) for x in ins.args)
    text, constraints = "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r"
    g.set(ins.dst, g.asm(text, constraints, I32, [a, b, selector], PURE))


def _lop3(g, ins: Instr) -> None:
    a, b, c = (g.value(x) for x in ins.args)
    text, constraints = f"lop3.b32 $0, $1, $2, $3, {ins.attrs['lut']};", "=r,r,r,r"
    g.set(ins.dst, g.asm(text, constraints, I32, [a, b, c], PURE))


def lowering(table: dict) -> dict:
    """Entries for ``kaio.llvm.lowering.LOWERING`` (``kaio.ptx.packed.packed_lowering``)."""
    return ptx.packed_lowering(table, arith, _pack, _unpack, _prmt, _lop3)
