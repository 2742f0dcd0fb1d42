"""Table-driven lowering of IR ops to PTX instructions.

``LOWERING`` maps every op of ``kaio.ir.ops.OPS`` to the function that emits it. Most ops are
one line of a template table (``BINARY``, ``UNARY``, ``TERNARY``, ``COMPARE``; the entry format
is in ``kaio.ptx.templates``). An entry that needs a feature the arch lacks falls back, for
f16/bf16, to computing in f32 and rounding once (bit-identical for these ops); for any other
type, ``kaio.ir.legality`` (run before the emitter) has already refused the kernel.

The few ops that need sequences have small helpers here: Python floor ``floordiv``/``mod``,
bool compares and selects, conversions (``convert``), shuffles of 16- and 64-bit values.
Memory ops (load, store, atomics) live in ``kaio.ptx.memory``; packed pairs (f16x2, bf16x2)
and ``prmt`` in ``kaio.ptx.packed``.
"""

from __future__ import annotations

from kaio.ir.legality import native
from kaio.ir.nodes import Const, Instr
from kaio.ir.ops import OpTable
from kaio.ptx import fp8, hopper, memory, packed, tensor
from kaio.ptx.regs import bty, immediate, is_half, is_narrow, ity, normalise, storage
from kaio.ptx.templates import fmt, pick
from kaio.types import ScalarType, f32, f64, u32

# ----------------------------------------------------------------------------- arithmetic

# "any" is every other type the op takes (f32, f64, f16, bf16): the verifier checks which.
BINARY = {
    "add": {"int": "add.{ty} {d}, {a}, {b}", "any": "add.rn.{ty} {d}, {a}, {b}"},
    "sub": {"int": "sub.{ty} {d}, {a}, {b}", "any": "sub.rn.{ty} {d}, {a}, {b}"},
    "mul": {"int": "mul.lo.{ty} {d}, {a}, {b}", "any": "mul.rn.{ty} {d}, {a}, {b}"},
    "div": {"float": "div.rn.{ty} {d}, {a}, {b}"},
    "div_ftz": {"float": "div.full.ftz.f32 {d}, {a}, {b}"},
    "and": {"pred": "and.pred {d}, {a}, {b}", "int": "and.{bt} {d}, {a}, {b}"},
    "or": {"pred": "or.pred {d}, {a}, {b}", "int": "or.{bt} {d}, {a}, {b}"},
    "xor": {"pred": "xor.pred {d}, {a}, {b}", "int": "xor.{bt} {d}, {a}, {b}"},
    "shl": {"int": "shl.{bt} {d}, {a}, {b}"},
    "shr": {"int": "shr.{ty} {d}, {a}, {b}"},
    "min": {"any": "min.{ty} {d}, {a}, {b}"},
    "max": {"any": "max.{ty} {d}, {a}, {b}"},
}

UNARY = {
    "mov": {"pred": "mov.pred {d}, {a}", "any": "mov.{bt} {d}, {a}"},
    "neg": {
        "int": "neg.{st} {d}, {a}",
        "float": "neg.{ty} {d}, {a}",
        "half": "xor.b16 {d}, {a}, 0x8000",
    },
    "abs": {
        "uint": "mov.{bt} {d}, {a}",
        "int": "abs.{ty} {d}, {a}",
        "float": "abs.{ty} {d}, {a}",
        "half": "and.b16 {d}, {a}, 0x7FFF",
    },
    "not": {"pred": "not.pred {d}, {a}"},
    "invert": {"int": "not.{bt} {d}, {a}"},
    "brev": {"int": "brev.{bt} {d}, {a}"},
    "sqrt": {"float": "sqrt.rn.{ty} {d}, {a}"},
    "floor": {"float": "cvt.rmi.{ty}.{ty} {d}, {a}"},
    "ceil": {"float": "cvt.rpi.{ty}.{ty} {d}, {a}"},
    "trunc": {"float": "cvt.rzi.{ty}.{ty} {d}, {a}"},
    "rint": {"float": "cvt.rni.{ty}.{ty} {d}, {a}"},
    "exp2": {"float": "ex2.approx.f32 {d}, {a}"},
    "log2": {"float": "lg2.approx.f32 {d}, {a}"},
    "rsqrt": {"float": "rsqrt.approx.f32 {d}, {a}"},
    "rcp_approx": {"float": "rcp.approx.f32 {d}, {a}"},
    "exp2_ftz": {"float": "ex2.approx.ftz.f32 {d}, {a}"},
    "rcp_ftz": {"float": "rcp.approx.ftz.f32 {d}, {a}"},
    "log2_ftz": {"float": "lg2.approx.ftz.f32 {d}, {a}"},
    "rsqrt_ftz": {"float": "rsqrt.approx.ftz.f32 {d}, {a}"},
    "sin_ftz": {"float": "sin.approx.ftz.f32 {d}, {a}"},
    "cos_ftz": {"float": "cos.approx.ftz.f32 {d}, {a}"},
    "sin": {"float": "sin.approx.f32 {d}, {a}"},
    "cos": {"float": "cos.approx.f32 {d}, {a}"},
    "tanh": {"float": "tanh.approx.f32 {d}, {a}"},
}

TERNARY = {
    "fma": {
        "float": "fma.rn.{ty} {d}, {a}, {b}, {c}",
        "half": "fma.rn.{ty} {d}, {a}, {b}, {c}",  # rounded once, like the f32 and f64 forms
    }
}

# setp comparison per operand kind: (signed int, unsigned int, float). Float ``ne`` is the
# unordered ``neu`` (true on NaN); the other float compares are ordered (false on NaN).
COMPARE = {
    "lt": ("lt", "lo", "lt"),
    "le": ("le", "ls", "le"),
    "gt": ("gt", "hi", "gt"),
    "ge": ("ge", "hs", "ge"),
    "eq": ("eq", "eq", "eq"),
    "ne": ("ne", "ne", "neu"),
}

# Integer ops whose 32-bit result may leave a narrow integer's normalised form.
WRAPPING = {"add", "sub", "mul", "neg", "abs", "invert", "shl", "floordiv"}


def binary(e, op: str, t: ScalarType, d: str, a: str, b: str) -> None:
    """``d = a op b`` on registers/immediates of type ``t``."""
    if op in ("floordiv", "mod"):
        _floor_divmod(e, op, t, d, a, b)
        return
    template = pick(BINARY[op], t) if native(op, t.name, e.target) else None
    if template is None:
        _half_via_f32(e, op, t, d, (a, b))
        return
    e.line(fmt(template, t, d=d, a=a, b=b))
    if op in WRAPPING and is_narrow(t):
        e.line(normalise(t, d))


def unary(e, op: str, t: ScalarType, d: str, a: str) -> None:
    """``d = op(a)`` for the ops of ``UNARY``."""
    template = pick(UNARY[op], t)
    if template is None:
        raise AssertionError(f"no lowering of {op} for {t}")  # the verifier rejects these
    e.line(fmt(template, t, d=d, a=a))
    if op in WRAPPING and is_narrow(t):
        e.line(normalise(t, d))


def _half_via_f32(e, op: str, t: ScalarType, d: str, operands: tuple) -> None:
    """An f16/bf16 op computed in f32 and rounded once to ``t``."""
    wide = []
    for x in operands:
        w = e.tmp(f32)
        convert(e, w, f32, x, t)
        wide.append(w)
    r = e.tmp(f32)
    binary(e, op, f32, r, *wide)
    convert(e, d, t, r, f32)


def _floor_divmod(e, op: str, t: ScalarType, d: str, a: str, b: str) -> None:
    """Python ``//`` and ``%``: truncating div/rem, then one correction step for signed ints
    when the remainder is nonzero and its sign differs from the divisor's."""
    if t.kind == "uint":
        e.line(f"{'div' if op == 'floordiv' else 'rem'}.{ity(t)} {d}, {a}, {b}")
        return
    q, r, x = e.tmp(t), e.tmp(t), e.tmp(t)
    p, s = e.tmp_pred(), e.tmp_pred()
    ty, bt = ity(t), bty(t)
    e.line(f"div.{ty} {q}, {a}, {b}")
    e.line(f"rem.{ty} {r}, {a}, {b}")
    e.line(f"xor.{bt} {x}, {r}, {b}")
    e.line(f"setp.ne.{ty} {p}, {r}, 0")
    e.line(f"setp.lt.{ty} {s}, {x}, 0")
    e.line(f"and.pred {p}, {p}, {s}")
    if op == "floordiv":
        e.line(f"@{p} sub.{ty} {q}, {q}, 1")
        e.line(f"mov.{bt} {d}, {q}")
        if is_narrow(t):
            e.line(normalise(t, d))
    else:
        e.line(f"@{p} add.{ty} {r}, {r}, {b}")
        e.line(f"mov.{bt} {d}, {r}")


def compare(e, op: str, t: ScalarType, d: str, a: str, b: str) -> None:
    """``d = a op b`` into a predicate."""
    if t.is_bool:  # eq or ne: a == b is not (a xor b)
        e.line(f"xor.pred {d}, {a}, {b}")
        if op == "eq":
            e.line(f"not.pred {d}, {d}")
        return
    if t.name == "bf16" and not native(op, "bf16", e.target):
        wa, wb = e.tmp(f32), e.tmp(f32)
        convert(e, wa, f32, a, t)
        convert(e, wb, f32, b, t)
        compare(e, op, f32, d, wa, wb)
        return
    signed, unsigned, floating = COMPARE[op]
    code = floating if t.is_float else unsigned if t.kind == "uint" else signed
    e.line(f"setp.{code}.{ity(t)} {d}, {a}, {b}")


def select(e, t: ScalarType, d: str, c: str, a: str, b: str) -> None:
    """``d = c ? a : b``."""
    if t.is_bool:
        x = e.tmp_pred()
        e.line(f"@{c} mov.pred {x}, {a}")
        e.line(f"@!{c} mov.pred {x}, {b}")
        e.line(f"mov.pred {d}, {x}")
        return
    e.line(f"selp.{bty(t)} {d}, {a}, {b}, {c}")


# ----------------------------------------------------------------------------- conversions


def convert(e, d: str, dt: ScalarType, a: str, st: ScalarType) -> None:
    """``d: dt = a: st`` with the semantics of ``kaio.ir.ops`` (truncating saturating
    float-to-int, round-to-nearest-even otherwise, wrapping int-to-int, ``!= 0`` to bool)."""
    if dt == st:
        e.line(fmt(UNARY["mov"]["pred" if dt.is_bool else "any"], dt, d=d, a=a))
    elif dt.is_bool:
        _to_bool(e, d, a, st)
    elif st.is_bool:
        one, zero = immediate(Const(1, dt)), immediate(Const(0, dt))
        e.line(f"selp.{bty(dt) if is_half(dt) else ity(dt)} {d}, {one}, {zero}, {a}")
    elif dt.is_fp8 or st.is_fp8:
        fp8.convert(e, d, dt, a, st)
    elif dt.is_int and st.is_int:
        _int_to_int(e, d, dt, a, st)
    elif "bf16" in (dt.name, st.name):
        _bf16_convert(e, d, dt, a, st)
    else:
        _cvt(e, d, dt, a, st)


def _cvt(e, d: str, dt: ScalarType, a: str, st: ScalarType) -> None:
    """One ``cvt`` between an integer and a float or two floats, with the rounding of ops.py."""
    if dt.is_int:
        rnd = ".rzi"  # saturating, NaN to 0
    elif st.is_int or dt.bits < st.bits:
        rnd = ".rn"
    else:
        rnd = ""  # exact widening
    dtype = dt.ptx if is_narrow(dt) else ity(dt)
    e.line(f"cvt{rnd}.{dtype}.{ity(st)} {d}, {a}")
    if dt.is_int and st.is_float:
        # the hardware gives INT64_MIN for NaN to 64-bit integers (seen on an H200); ops.py
        # says NaN converts to 0 for every integer type, so make it explicit
        nan = e.tmp_pred()
        e.line(f"setp.nan.{st.ptx} {nan}, {a}, {a}")
        e.line(f"@{nan} mov.{bty(dt)} {d}, 0")
    elif is_half(dt) and st == f64:
        # f64 to f16/bf16 keeps the NaN's sign and top payload bits (seen on an H200; the sm_80
        # bf16 path through f32 gives 0x7FFF): make it the canonical 0x7FFF of every other NaN
        nan = e.tmp_pred()
        e.line(f"setp.nan.f64 {nan}, {a}, {a}")
        e.line(f"@{nan} mov.b16 {d}, 0x7FFF")
    if is_narrow(dt):
        e.line(normalise(dt, d))


def _to_bool(e, d: str, a: str, st: ScalarType) -> None:
    if is_half(st):  # nonzero magnitude bits (NaN included) means != 0
        m = e.tmp(st)
        e.line(f"and.b16 {m}, {a}, 0x7FFF")
        e.line(f"setp.ne.b16 {d}, {m}, 0")
    elif st.is_float:
        e.line(f"setp.neu.{st.ptx} {d}, {a}, {immediate(Const(0.0, st))}")
    else:
        e.line(f"setp.ne.{ity(st)} {d}, {a}, 0")


def _int_to_int(e, d: str, dt: ScalarType, a: str, st: ScalarType) -> None:
    """Wrap or extend: the source's signedness decides the extension."""
    if is_narrow(dt):
        if st.bits == 64:
            low = e.tmp(u32)
            e.line(f"cvt.u32.u64 {low}, {a}")
            a = low
        s = "s" if dt.kind == "int" else "u"
        e.line(f"cvt.{s}32.{s}{dt.bits} {d}, {a}")
    elif dt.bits == 64 and st.bits < 64:
        e.line(f"cvt.{dt.ptx}.{ity(st)} {d}, {a}")
    elif dt.bits == 32 and st.bits == 64:
        e.line(f"cvt.u32.u64 {d}, {a}")
    else:
        e.line(f"mov.{bty(dt)} {d}, {a}")


def _bf16_convert(e, d: str, dt: ScalarType, a: str, st: ScalarType) -> None:
    """Conversions to or from bf16: f32 directly (sm_80); 32/64-bit integers and f64 directly
    on sm_90, else through f32 (exactly, or rounded to odd so that the final rounding is the
    only one). f16 and 8/16-bit integers (which cvt.bf16 does not accept in 32-bit registers)
    always go through f32, exactly."""
    other = st if dt.name == "bf16" else dt
    if other == f32:
        _cvt(e, d, dt, a, st)
    elif other.bits > 16 and native("cvt", f"{st}->{dt}", e.target):  # 32/64-bit ints, f64
        _cvt(e, d, dt, a, st)
    elif st.name == "bf16":
        w = e.tmp(f32)
        _bf16_convert(e, w, f32, a, st)
        convert(e, d, dt, w, f32)
    else:
        w = e.tmp(f32)
        if st.bits > 16:  # wider than f32's precision: round to odd
            _to_f32_round_odd(e, w, a, st)
        else:
            convert(e, w, f32, a, st)
        _bf16_convert(e, d, dt, w, f32)


def _to_f32_round_odd(e, d: str, a: str, st: ScalarType) -> None:
    """``d = f32(a)`` rounded to odd: truncate, then set the last bit when inexact. Rounding
    that once more to bf16 (8 bits) gives the correctly rounded result."""
    back, bits = e.tmp(st), e.tmp(u32)
    inexact = e.tmp_pred()
    e.line(f"cvt.rz.f32.{ity(st)} {d}, {a}")
    e.line(f"cvt{'.rzi' if st.is_int else ''}.{ity(st)}.f32 {back}, {d}")
    e.line(f"setp.ne.{ity(st)} {inexact}, {back}, {a}")
    e.line(f"mov.b32 {bits}, {d}")
    e.line(f"@{inexact} or.b32 {bits}, {bits}, 1")
    e.line(f"mov.b32 {d}, {bits}")


def bitcast(e, d: str, dt: ScalarType, a: str, st: ScalarType) -> None:
    """Reinterpret the bits of a same-width value."""
    if (dt.is_int or dt.is_bool) and (st.is_int or st.is_bool):
        convert(e, d, dt, a, st)  # narrow integers: re-extend; bool: 0/1
    elif (is_half(st) or st.is_fp8) and dt.is_int:  # into a (32-bit register) integer
        s = "s" if dt.kind == "int" else "u"
        e.line(f"cvt.{s}32.{s}{st.bits} {d}, {a}")  # fp8: the code in the low byte
    elif (is_half(dt) or dt.is_fp8) and st.is_int:  # into a 16-bit register
        e.line(f"cvt.u16.u32 {d}, {a}")
    else:  # f32 <-> 32-bit int, f64 <-> 64-bit int, f16 <-> bf16
        e.line(f"mov.{bty(dt)} {d}, {a}")


# ----------------------------------------------------------------------------- warp ops


def shuffle(e, mode: str, t: ScalarType, d: str, a: str, lane: str) -> None:
    """``shfl.sync`` of any type: 32-bit values directly, 64-bit as two halves, 16-bit and
    bool widened to 32 bits."""
    clamp = "0" if mode == "up" else "0x1f"

    def shfl32(dst: str, src: str) -> None:
        e.line(f"shfl.sync.{mode}.b32 {dst}, {src}, {lane}, {clamp}, 0xffffffff")

    width = storage(t)
    if width in ("b32", "f32"):
        shfl32(d, a)
        return
    if width in ("b64", "f64"):
        lo, hi, lo2, hi2 = (e.tmp(u32) for _ in range(4))
        e.line(f"mov.b64 {{{lo}, {hi}}}, {a}")
        shfl32(lo2, lo)
        shfl32(hi2, hi)
        e.line(f"mov.b64 {d}, {{{lo2}, {hi2}}}")
        return
    w, w2 = e.tmp(u32), e.tmp(u32)
    if t.is_bool:
        e.line(f"selp.u32 {w}, 1, 0, {a}")
        shfl32(w2, w)
        e.line(f"setp.ne.u32 {d}, {w2}, 0")
    else:
        e.line(f"cvt.u32.u16 {w}, {a}")
        shfl32(w2, w)
        e.line(f"cvt.u16.u32 {d}, {w2}")


# ----------------------------------------------------------------------------- per-op entry

LOWERING = OpTable()


@LOWERING.register(*BINARY, "floordiv", "mod")
def _lower_binary(e, ins: Instr) -> None:
    binary(e, ins.op, ins.dst.type, e.dst(ins), *(e.o(x) for x in ins.args))


@LOWERING.register(*(op for op in UNARY if op != "mov"))
def _lower_unary(e, ins: Instr) -> None:
    unary(e, ins.op, ins.dst.type, e.dst(ins), e.r(ins.args[0]))


@LOWERING.register("mov")
def _lower_mov(e, ins: Instr) -> None:
    convert(e, e.dst(ins), ins.dst.type, e.o(ins.args[0]), ins.dst.type)


@LOWERING.register("fma")
def _lower_fma(e, ins: Instr) -> None:
    a, b, c = (e.o(x) for x in ins.args)
    template = pick(TERNARY["fma"], ins.dst.type)
    e.line(fmt(template, ins.dst.type, d=e.dst(ins), a=a, b=b, c=c))


@LOWERING.register(*COMPARE)
def _lower_compare(e, ins: Instr) -> None:
    a, b = ins.args
    compare(e, ins.op, a.type, e.dst(ins), e.o(a), e.o(b))


@LOWERING.register("select")
def _lower_select(e, ins: Instr) -> None:
    c, a, b = ins.args
    select(e, ins.dst.type, e.dst(ins), e.r(c), e.o(a), e.o(b))


@LOWERING.register("cvt")
def _lower_cvt(e, ins: Instr) -> None:
    (a,) = ins.args
    convert(e, e.dst(ins), ins.dst.type, e.r(a), a.type)


@LOWERING.register("bitcast")
def _lower_bitcast(e, ins: Instr) -> None:
    (a,) = ins.args
    bitcast(e, e.dst(ins), ins.dst.type, e.r(a), a.type)


@LOWERING.register("sreg")
def _lower_sreg(e, ins: Instr) -> None:
    e.line(f"mov.u32 {e.dst(ins)}, %{ins.attrs['name']}")


@LOWERING.register("shfl")
def _lower_shfl(e, ins: Instr) -> None:
    value, lane = ins.args
    shuffle(e, ins.attrs["mode"], value.type, e.dst(ins), e.r(value), e.o(lane))


@LOWERING.register("vote_any", "vote_all", "ballot")
def _lower_vote(e, ins: Instr) -> None:
    mode = {"vote_any": "any.pred", "vote_all": "all.pred", "ballot": "ballot.b32"}[ins.op]
    e.line(f"vote.sync.{mode} {e.dst(ins)}, {e.r(ins.args[0])}, 0xffffffff")


@LOWERING.register("atomic")
def _lower_atomic(e, ins: Instr) -> None:
    memory.lower_atomic(e, ins, binary)


_FIXED = {
    "sync_threads": "bar.sync 0",
    "sync_warp": "bar.warp.sync 0xffffffff",
    "threadfence": "membar.gl",
}


@LOWERING.register(*_FIXED)
def _lower_fixed(e, ins: Instr) -> None:
    e.line(_FIXED[ins.op])


LOWERING.include(memory.LOWERING, tensor.LOWERING, hopper.LOWERING)
LOWERING.update(packed.lowering(LOWERING))  # f16x2/bf16x2 arithmetic, pack/unpack, prmt
