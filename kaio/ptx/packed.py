"""PTX lowering of packed half-precision pairs (``f16x2``, ``bf16x2``), ``prmt`` and ``lop3``.

A pair lives in one 32-bit register (``%r``), element 0 in the low half, which is PTX's own
layout: loads, stores, moves, selects and shuffles treat it as ``b32``. This module lowers
the ops that look inside: the arithmetic ops of ``kaio.ir.ops.PACKED_OPS`` when their type is
packed (``lowering()`` routes them here), ``pack``, ``unpack_lo``/``unpack_hi``, ``prmt`` and
``lop3``.

``FORMS`` lists, per op and type, the instruction that computes it and, for bf16x2 on archs
without it, the fallback (``kaio.ir.legality`` checked which one the arch gets: ``native``).
``add/sub/mul.bf16x2`` need sm_90, so on sm_80 they are one ``fma.rn.bf16x2`` with a constant
operand, which rounds once to the same bits: ``a + b = a*1 + b``, ``a - b = b*(-1) + a``,
``a * b = a*b + (-0)`` (-0 keeps the sign of a zero product). ``neg`` and ``abs`` flip or clear
the two sign bits, like the scalar f16 forms.
"""

from __future__ import annotations

from kaio.ir.legality import native
from kaio.ir.nodes import Const, Instr
from kaio.ir.ops import PACKED_OPS
from kaio.types import f32

# bf16x2 constants the sm_80 forms use, by template name.
CONSTANTS = {"one": 0x3F803F80, "minus_one": 0xBF80BF80, "minus_zero": 0x80008000}

FORMS: dict[str, dict[str, tuple]] = {
    "add": {
        "f16x2": ("add.rn.f16x2 {d}, {a}, {b}",),
        "bf16x2": ("add.rn.bf16x2 {d}, {a}, {b}", "fma.rn.bf16x2 {d}, {a}, {one}, {b}"),
    },
    "sub": {
        "f16x2": ("sub.rn.f16x2 {d}, {a}, {b}",),
        "bf16x2": ("sub.rn.bf16x2 {d}, {a}, {b}", "fma.rn.bf16x2 {d}, {b}, {minus_one}, {a}"),
    },
    "mul": {
        "f16x2": ("mul.rn.f16x2 {d}, {a}, {b}",),
        "bf16x2": ("mul.rn.bf16x2 {d}, {a}, {b}", "fma.rn.bf16x2 {d}, {a}, {b}, {minus_zero}"),
    },
    "fma": {"packed": ("fma.rn.{t} {d}, {a}, {b}, {c}",)},
    "min": {"packed": ("min.{t} {d}, {a}, {b}",)},
    "max": {"packed": ("max.{t} {d}, {a}, {b}",)},
    "neg": {"packed": ("xor.b32 {d}, {a}, 0x80008000",)},
    "abs": {"packed": ("and.b32 {d}, {a}, 0x7FFF7FFF",)},
    "exp2": {  # one MUFU.EX2 for both halves (bf16x2: only the .ftz form exists)
        "f16x2": ("ex2.approx.f16x2 {d}, {a}",),
        "bf16x2": ("ex2.approx.ftz.bf16x2 {d}, {a}",),
    },
}

# pack from two f32: one cvt that rounds each (PTX puts its first source in the high half);
# sm_75 has it for neither type: f16x2 falls back to two cvt.rn.f16.f32.
FROM_F32 = "cvt.rn.{t}.f32 {d}, {hi}, {lo}"


def form(target, op: str, t) -> str:
    """The template of packed ``op`` on ``t`` that ``target`` gets: its own instruction, or
    the fallback where ``kaio.ir.legality.native`` says the arch lacks it."""
    entry = FORMS[op]
    forms = entry.get(t.name) or entry["packed"]
    return forms[0] if native(op, t.name, target) else forms[-1]


def arith(e, ins: Instr) -> None:
    """An op of ``PACKED_OPS`` on a packed type: one instruction for both halves."""
    t = ins.dst.type
    template = form(e.target, ins.op, t).replace("{t}", t.name)
    operands = dict(zip("abc", (e.r(x) for x in ins.args), strict=False))
    for name, bits in CONSTANTS.items():
        if "{" + name + "}" in template:
            operands[name] = e.r(Const(bits, t))
    e.line(template.format(d=e.dst(ins), **operands))


def _pack(e, ins: Instr) -> None:
    t = ins.dst.type
    lo, hi = ins.args
    d = e.dst(ins)
    if lo.type != f32:  # two halves
        e.line(f"mov.b32 {d}, {{{e.r(lo)}, {e.r(hi)}}}")
        return
    if not native("pack", f"f32->{t}", e.target):  # f16x2 on sm_75: two conversions
        a, b = e.tmp(t.element), e.tmp(t.element)
        e.line(f"cvt.rn.f16.f32 {a}, {e.r(lo)}")
        e.line(f"cvt.rn.f16.f32 {b}, {e.r(hi)}")
        e.line(f"mov.b32 {d}, {{{a}, {b}}}")
        return
    e.line(FROM_F32.format(t=t.name, d=d, lo=e.r(lo), hi=e.r(hi)))


def _unpack(e, ins: Instr) -> None:
    (p,) = ins.args
    other = e.tmp(ins.dst.type)
    halves = (e.dst(ins), other) if ins.op == "unpack_lo" else (other, e.dst(ins))
    e.line(f"mov.b32 {{{halves[0]}, {halves[1]}}}, {e.r(p)}")


def _prmt(e, ins: Instr) -> None:
    a, b, selector = ins.args
    e.line(f"prmt.b32 {e.dst(ins)}, {e.r(a)}, {e.r(b)}, {e.o(selector)}")


def _lop3(e, ins: Instr) -> None:
    a, b, c = ins.args
    e.line(f"lop3.b32 {e.dst(ins)}, {e.o(a)}, {e.o(b)}, {e.o(c)}, {ins.attrs['lut']}")


def packed_lowering(table: dict, arith, pack, unpack, prmt, lop3) -> dict:
    """A backend's lowering entries for packed pairs: each op of ``PACKED_OPS`` goes to
    ``arith`` when its type is packed, else to ``table``'s entry; and the packed-only ops.
    Shared by the PTX emitter and the LLVM backend (each passes its own functions)."""

    def route(scalar):
        def lower(backend, ins: Instr) -> None:
            (arith if ins.dst.type.is_packed else scalar)(backend, ins)

        return lower

    return {
        **{op: route(table[op]) for op in PACKED_OPS},
        "pack": pack,
        "unpack_lo": unpack,
        "unpack_hi": unpack,
        "prmt": prmt,
        "lop3": lop3,
    }


def lowering(table: dict) -> dict:
    """Entries for ``kaio.ptx.lowering.LOWERING`` (``packed_lowering``)."""
    return packed_lowering(table, arith, _pack, _unpack, _prmt, _lop3)
