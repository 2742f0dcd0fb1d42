"""Table-driven lowering of IR ops to LLVM IR, with the exact semantics of ``kaio.ir.ops``.

``LOWERING`` maps every op of ``kaio.ir.ops.OPS`` to the function that emits it, like
``kaio.ptx.lowering.LOWERING``. Arithmetic is one table per rule (``BINARY``, ``UNARY``);
each entry maps a type class (``"int"``, ``"uint"``, ``"float"`` for f16/bf16/f32/f64,
``"half"``, ``"pred"``, ``"any"``) to a function ``(g, t, a, b) -> value``.

Where LLVM's own instruction would not mean what the op means, the lowering says so:

- no fast-math flags anywhere, so ``fmul``/``fadd`` stay separate; the NVPTX backend then
  prints ``mul.rn``/``add.rn``, which ptxas never contracts into an FMA;
- ``shl``/``shr`` by the width or more are poison in LLVM: a ``select`` gives PTX's clamped
  result (0 or the sign fill);
- ``sdiv``/``udiv`` by zero (and ``INT_MIN / -1``) are undefined behaviour in LLVM: a
  variable divisor is replaced by 1 in those cases (division by zero is unspecified in
  ``ops.py``; ``INT_MIN // -1`` wraps to ``INT_MIN``, which ``INT_MIN // 1`` gives);
- float to int is ``cvt.rzi`` (``llvm.nvvm.f2i.rz``... saturating, NaN to 0) for 32 and 64
  bits, with NaN made 0 explicitly for 64 bits as the emitter does; ``llvm.fptosi.sat`` for
  narrower integers;
- f32 is the bridge for f16/bf16 ops the arch lacks, exactly where the PTX emitter uses one
  (``kaio.ir.legality.native`` decides for both, and its pass checked and versioned the
  kernel before either runs); integers and f64 go to bf16 through an f32 rounded to
  odd where the arch has no direct ``cvt`` (LLVM would round twice);
- f64 to f16/bf16 gives the canonical NaN 0x7FFF; f16/bf16 ``neg``/``abs`` flip/clear the
  sign bit of the bits, as the emitter does;
- float ``min``/``max`` are NVVM's ``fmin``/``fmax`` (PTX ``min``/``max``: NaN-ignoring, -0 <
  +0); approximate math is NVVM's ``*.approx`` intrinsics (non-ftz) or, for ``rcp.approx.f32``
  (NVVM has only the ftz form) and ``tanh.approx.f32`` (none before LLVM 21), inline PTX.

Memory ops live in ``kaio.llvm.memory``, fragments and tensor cores in ``kaio.llvm.tensor``,
packed pairs in ``kaio.llvm.packed``, wgmma, TMA and mbarriers in ``kaio.llvm.hopper``.
"""

from __future__ import annotations

from llvmlite import ir

from kaio.ir.legality import native
from kaio.ir.nodes import Const, Instr
from kaio.ir.ops import OpTable, integer_classes
from kaio.llvm import fp8, hopper, memory, packed, tensor
from kaio.llvm.typemap import (
    DOUBLE,
    FLOAT,
    I1,
    I16,
    I32,
    I64,
    PURE,
    const,
    half_bits_const,
    int_const,
    lltype,
)
from kaio.types import ScalarType, f32, f64


def suffix(ty: ir.Type) -> str:
    """The overload suffix of an LLVM intrinsic for ``ty`` (``i32``, ``f16``, ``bf16``...)."""
    if isinstance(ty, ir.IntType):
        return f"i{ty.width}"
    return {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}[str(ty)]


def classes(t: ScalarType) -> tuple[str, ...]:
    """The table keys that may hold ``t``'s entry, most specific first."""
    integer = integer_classes(t)
    if integer is not None:
        return integer
    if t.is_float and t.bits == 16:
        return (t.name, "half", "float", "any")
    return (t.name, "float", "any")


def entry(table: dict, t: ScalarType):
    """The entry of ``table`` for type ``t``."""
    for key in classes(t):
        if key in table:
            return table[key]
    raise AssertionError(f"no LLVM lowering for {t}")  # the verifier rejects these


def _op(name: str):
    """A builder instruction: ``add``, ``fmul``, ``and_``..."""
    return lambda g, t, *xs: getattr(g.b, name)(*xs)


def _overloaded(name: str):
    """An overloaded LLVM intrinsic (``llvm.smin``, ``llvm.sqrt``...) on the operand type."""
    return lambda g, t, *xs: g.intrinsic(f"{name}.{suffix(xs[0].type)}", xs[0].type, list(xs))


def _nvvm(name: str):
    """An NVVM intrinsic taking and returning f32 (approximate math)."""
    return lambda g, t, a: g.intrinsic(name, FLOAT, [a])


def _ptx(text: str, constraints: str):
    """One pure PTX instruction as inline assembly (``$0`` the result)."""
    return lambda g, t, *xs: g.asm(text, constraints, lltype(t), list(xs), PURE)


# ----------------------------------------------------------------------------- integers


def _shift(g, t: ScalarType, a, amount, shift, overflow):
    """``shift(a, amount)`` with PTX's clamp: ``overflow`` for amounts >= the width."""
    width = t.bits
    big = g.b.icmp_unsigned(">=", amount, int_const(I32, width))
    n = _resize(g, amount, a.type, signed=False)
    return g.b.select(big, overflow, shift(a, n))


def _resize(g, x, ty: ir.IntType, signed: bool):
    """An integer value widened (by ``signed``) or truncated to ``ty``."""
    if x.type.width == ty.width:
        return x
    if x.type.width > ty.width:
        return g.b.trunc(x, ty)
    return g.b.sext(x, ty) if signed else g.b.zext(x, ty)


def _shl(g, t, a, b):
    return _shift(g, t, a, b, g.b.shl, ir.Constant(a.type, 0))


def _lshr(g, t, a, b):
    return _shift(g, t, a, b, g.b.lshr, ir.Constant(a.type, 0))


def _ashr(g, t, a, b):
    top = int_const(I32, t.bits - 1)  # shifting by width - 1 already gives the sign fill
    amount = g.b.select(g.b.icmp_unsigned(">", b, top), top, b)
    return g.b.ashr(a, _resize(g, amount, a.type, signed=False))


def _safe_divisor(g, t: ScalarType, a, b):
    """``b``, with 1 where LLVM's division would be undefined (b == 0; INT_MIN / -1)."""
    if isinstance(b, ir.Constant) and b.constant not in (0, -1):
        return b
    bad = g.b.icmp_unsigned("==", b, ir.Constant(b.type, 0))
    if t.kind == "int":
        least = int_const(a.type, 1 << (t.bits - 1))
        overflow = g.b.and_(
            g.b.icmp_unsigned("==", a, least), g.b.icmp_unsigned("==", b, int_const(b.type, -1))
        )
        bad = g.b.or_(bad, overflow)
    return g.b.select(bad, ir.Constant(b.type, 1), b)


def _divmod(g, t: ScalarType, a, b):
    """Python's floored quotient and remainder: truncating ``sdiv``/``srem``, then one step
    back when the remainder is nonzero and its sign differs from the divisor's."""
    b = _safe_divisor(g, t, a, b)
    if t.kind == "uint":
        return g.b.udiv(a, b), g.b.urem(a, b)
    q, r = g.b.sdiv(a, b), g.b.srem(a, b)
    zero = ir.Constant(a.type, 0)
    fix = g.b.and_(g.b.icmp_signed("!=", r, zero), g.b.icmp_signed("<", g.b.xor(r, b), zero))
    q = g.b.sub(q, g.b.zext(fix, a.type))
    r = g.b.add(r, g.b.select(fix, b, zero))
    return q, r


def _floordiv(g, t, a, b):
    return _divmod(g, t, a, b)[0]


def _mod(g, t, a, b):
    return _divmod(g, t, a, b)[1]


# ----------------------------------------------------------------------------- floats


def _minmax(which: str):
    """NVVM ``fmin``/``fmax``: PTX ``min``/``max`` (the non-NaN operand; -0 below +0)."""
    names = {"f16": "f16", "bf16": "bf16", "f32": "f", "f64": "d"}
    return lambda g, t, a, b: g.intrinsic(f"llvm.nvvm.{which}.{names[t.name]}", a.type, [a, b])


def _sign_bits(op: str, mask: int):
    """``neg``/``abs`` of f16/bf16 on the bits (as the emitter: NaN payloads kept)."""

    def lower(g, t, a):
        bits = getattr(g.b, op)(g.b.bitcast(a, I16), int_const(I16, mask))
        return g.b.bitcast(bits, a.type)

    return lower


BINARY = {
    "add": {"int": _op("add"), "float": _op("fadd")},
    "sub": {"int": _op("sub"), "float": _op("fsub")},
    "mul": {"int": _op("mul"), "float": _op("fmul")},
    "div": {"float": _op("fdiv")},
    "div_ftz": {"float": _ptx("div.full.ftz.f32 $0, $1, $2;", "=f,f,f")},
    "floordiv": {"int": _floordiv},
    "mod": {"int": _mod},
    "and": {"any": _op("and_")},
    "or": {"any": _op("or_")},
    "xor": {"any": _op("xor")},
    "shl": {"int": _shl},
    "shr": {"uint": _lshr, "int": _ashr},
    "min": {
        "uint": _overloaded("llvm.umin"),
        "int": _overloaded("llvm.smin"),
        "float": _minmax("fmin"),
    },
    "max": {
        "uint": _overloaded("llvm.umax"),
        "int": _overloaded("llvm.smax"),
        "float": _minmax("fmax"),
    },
}

UNARY = {
    "neg": {
        "int": lambda g, t, a: g.b.neg(a),
        "half": _sign_bits("xor", 0x8000),
        "float": _op("fneg"),
    },
    "abs": {
        "uint": lambda g, t, a: a,
        "int": lambda g, t, a: g.intrinsic(
            f"llvm.abs.{suffix(a.type)}", a.type, [a, ir.Constant(I1, 0)]
        ),
        "half": _sign_bits("and", 0x7FFF),
        "float": _overloaded("llvm.fabs"),
    },
    "not": {"pred": _op("not_")},
    "invert": {"int": _op("not_")},
    "brev": {"int": _overloaded("llvm.bitreverse")},
    "sqrt": {"float": _overloaded("llvm.sqrt")},
    "floor": {"float": _overloaded("llvm.floor")},
    "ceil": {"float": _overloaded("llvm.ceil")},
    "trunc": {"float": _overloaded("llvm.trunc")},
    "rint": {"float": _overloaded("llvm.rint")},
    "exp2": {"float": _nvvm("llvm.nvvm.ex2.approx.f")},
    "log2": {"float": _nvvm("llvm.nvvm.lg2.approx.f")},
    "rsqrt": {"float": _nvvm("llvm.nvvm.rsqrt.approx.f")},
    "rcp_approx": {"float": _ptx("rcp.approx.f32 $0, $1;", "=f,f")},
    "exp2_ftz": {"float": _nvvm("llvm.nvvm.ex2.approx.ftz.f")},
    "rcp_ftz": {"float": _nvvm("llvm.nvvm.rcp.approx.ftz.f")},
    "log2_ftz": {"float": _nvvm("llvm.nvvm.lg2.approx.ftz.f")},
    "rsqrt_ftz": {"float": _nvvm("llvm.nvvm.rsqrt.approx.ftz.f")},
    "sin_ftz": {"float": _nvvm("llvm.nvvm.sin.approx.ftz.f")},
    "cos_ftz": {"float": _nvvm("llvm.nvvm.cos.approx.ftz.f")},
    "sin": {"float": _nvvm("llvm.nvvm.sin.approx.f")},
    "cos": {"float": _nvvm("llvm.nvvm.cos.approx.f")},
    "tanh": {"float": _ptx("tanh.approx.f32 $0, $1;", "=f,f")},  # no intrinsic before LLVM 21
}


def _is_half(t: ScalarType) -> bool:
    return t.is_float and t.bits == 16


def binary(g, op: str, t: ScalarType, a, b):
    """``a op b`` for values of type ``t``. An f16/bf16 op the PTX emitter computes in f32
    (no template for the arch) is computed in f32 here too and rounded once."""
    if _is_half(t) and not native(op, t.name, g.target):
        wide = binary(g, op, f32, convert(g, a, t, f32), convert(g, b, t, f32))
        return convert(g, wide, f32, t)
    return entry(BINARY[op], t)(g, t, a, b)


def unary(g, op: str, t: ScalarType, a):
    """``op(a)`` for the ops of ``UNARY``."""
    return entry(UNARY[op], t)(g, t, a)


# ----------------------------------------------------------------------------- compares

_PREDICATES = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def compare(g, op: str, t: ScalarType, a, b):
    """``a op b`` as an i1. Float compares are ordered (false on NaN) except ``ne``."""
    p = _PREDICATES[op]
    if t.is_float:
        if t.name == "bf16" and not native(op, "bf16", g.target):
            return compare(g, op, f32, convert(g, a, t, f32), convert(g, b, t, f32))
        if op == "ne":
            return g.b.fcmp_unordered(p, a, b)
        return g.b.fcmp_ordered(p, a, b)
    if t.kind == "int":
        return g.b.icmp_signed(p, a, b)
    return g.b.icmp_unsigned(p, a, b)  # unsigned, bool, packed bits


# ----------------------------------------------------------------------------- conversions

# cvt.rzi to 32/64-bit integers (saturating, NaN to 0 at 32 bits), by (source, signed, bits)
_F2I = {
    ("f32", True, 32): "llvm.nvvm.f2i.rz",
    ("f32", False, 32): "llvm.nvvm.f2ui.rz",
    ("f32", True, 64): "llvm.nvvm.f2ll.rz",
    ("f32", False, 64): "llvm.nvvm.f2ull.rz",
    ("f64", True, 32): "llvm.nvvm.d2i.rz",
    ("f64", False, 32): "llvm.nvvm.d2ui.rz",
    ("f64", True, 64): "llvm.nvvm.d2ll.rz",
    ("f64", False, 64): "llvm.nvvm.d2ull.rz",
}

# cvt.rz.f32 (round toward zero) from 32/64-bit integers and f64, by (kind, bits)
_TO_F32_RZ = {
    ("int", 32): "llvm.nvvm.i2f.rz",
    ("uint", 32): "llvm.nvvm.ui2f.rz",
    ("int", 64): "llvm.nvvm.ll2f.rz",
    ("uint", 64): "llvm.nvvm.ull2f.rz",
    ("float", 64): "llvm.nvvm.d2f.rz",
}


def convert(g, a, st: ScalarType, dt: ScalarType):
    """``a: st`` converted to ``dt`` with the semantics of ``kaio.ir.ops`` (truncating
    saturating float-to-int with NaN to 0, round-to-nearest-even otherwise, wrapping
    int-to-int, ``!= 0`` to bool), feature by feature as ``kaio.ptx.lowering.convert``."""
    if dt == st:
        return a
    if dt.is_bool:
        if st.is_float:
            return g.b.fcmp_unordered("!=", a, ir.Constant(a.type, 0.0))
        return g.b.icmp_unsigned("!=", a, ir.Constant(a.type, 0))
    if st.is_bool:
        if dt.is_float:
            return g.b.select(a, const(Const(1.0, dt)), const(Const(0.0, dt)))
        return g.b.zext(a, lltype(dt))
    if dt.is_fp8 or st.is_fp8:
        return fp8.convert(g, a, st, dt)
    if dt.is_int and st.is_int:
        return _resize(g, a, lltype(dt), signed=st.kind == "int")
    if "bf16" in (dt.name, st.name):
        return _bf16_convert(g, a, st, dt)
    return _cvt(g, a, st, dt)


def _cvt(g, a, st: ScalarType, dt: ScalarType):
    """One conversion between an integer and a float, or two floats."""
    b, ty = g.b, lltype(dt)
    if dt.is_int:
        if _is_half(st):
            a, st = b.fpext(a, FLOAT), f32  # exact
        if dt.bits < 32:  # saturate to the narrow range (cvt.rzi.s8.f32 does the same)
            kind = "fptosi" if dt.kind == "int" else "fptoui"
            name = f"llvm.{kind}.sat.{suffix(ty)}.{suffix(a.type)}"
            return g.intrinsic(name, ty, [a], PURE)
        r = g.intrinsic(_F2I[(st.name, dt.kind == "int", dt.bits)], ty, [a], PURE)
        if dt.bits == 64:  # the hardware gives INT64_MIN for NaN; ops.py says 0
            r = b.select(b.fcmp_unordered("uno", a, a), ir.Constant(ty, 0), r)
        return r
    if st.is_int:
        return (b.sitofp if st.kind == "int" else b.uitofp)(a, ty)
    if dt.bits > st.bits:
        if _is_half(st) and _is_half(dt):  # f16 <-> bf16 through f32, exactly
            return b.fptrunc(b.fpext(a, FLOAT), ty)
        return b.fpext(a, ty)
    r = b.fptrunc(a, ty)
    if _is_half(dt) and st == f64:  # the canonical NaN, as every other path gives
        r = b.select(b.fcmp_unordered("uno", a, a), half_bits_const(dt, 0x7FFF), r)
    return r


def _bf16_convert(g, a, st: ScalarType, dt: ScalarType):
    """Conversions to or from bf16, with the PTX emitter's routes: f32
    directly; 32/64-bit integers and f64 directly on sm_90, else through f32 (exactly, or
    rounded to odd so that the final rounding is the only one)."""
    other = st if dt.name == "bf16" else dt
    if other == f32:
        return _cvt(g, a, st, dt)
    if other.bits > 16 and native("cvt", f"{st}->{dt}", g.target):
        if st.name == "bf16":
            return _cvt(g, g.b.fpext(a, FLOAT), f32, dt)  # exact, then one conversion
        return _cvt(g, a, st, dt)
    if st.name == "bf16":
        return convert(g, _bf16_convert(g, a, st, f32), f32, dt)
    wide = _to_f32_round_odd(g, a, st) if st.bits > 16 else convert(g, a, st, f32)
    return _bf16_convert(g, wide, f32, dt)


def _to_f32_round_odd(g, a, st: ScalarType):
    """``f32(a)`` rounded to odd: toward zero, then the last bit set when inexact. Rounding
    that once more to bf16 (8 bits) gives the correctly rounded result."""
    b = g.b
    kind = "float" if st.is_float else st.kind
    rz = g.intrinsic(_TO_F32_RZ[(kind, st.bits)], FLOAT, [a], PURE)
    if st.is_float:
        inexact = b.fcmp_unordered("!=", b.fpext(rz, DOUBLE), a)
    else:
        back = g.intrinsic(_F2I[("f32", st.kind == "int", st.bits)], a.type, [rz], PURE)
        inexact = b.icmp_unsigned("!=", back, a)
    bits = b.or_(b.bitcast(rz, I32), b.zext(inexact, I32))
    return b.bitcast(bits, FLOAT)


def bitcast(g, a, st: ScalarType, dt: ScalarType):
    """Reinterpret the bits of a same-width value (integers and bool: as ``convert``)."""
    if (dt.is_int or dt.is_bool) and (st.is_int or st.is_bool):
        return convert(g, a, st, dt)
    ty = lltype(dt)
    return a if a.type == ty else g.b.bitcast(a, ty)


# ----------------------------------------------------------------------------- warp ops


def _shfl32(g, mode: str, v, lane):
    clamp = 0 if mode == "up" else 0x1F
    args = [int_const(I32, -1), v, lane, int_const(I32, clamp)]
    return g.intrinsic(f"llvm.nvvm.shfl.sync.{mode}.i32", I32, args)


def shuffle(g, mode: str, t: ScalarType, v, lane):
    """``shfl.sync`` of any type: 32-bit values directly, 64-bit as two halves, narrower
    values and bool widened to 32 bits."""
    b, ty = g.b, v.type
    if t.is_bool:
        return b.icmp_unsigned("!=", _shfl32(g, mode, b.zext(v, I32), lane), int_const(I32, 0))
    if t.bits == 64:
        bits = b.bitcast(v, I64) if t.is_float else v
        lo = _shfl32(g, mode, b.trunc(bits, I32), lane)
        hi = _shfl32(g, mode, b.trunc(b.lshr(bits, int_const(I64, 32)), I32), lane)
        out = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), int_const(I64, 32)))
        return b.bitcast(out, ty) if t.is_float else out
    as_int = ir.IntType(t.bits)
    bits = b.bitcast(v, as_int) if t.is_float else v
    out = _shfl32(g, mode, _resize(g, bits, I32, signed=False), lane)
    out = _resize(g, out, as_int, signed=False)
    return b.bitcast(out, ty) if t.is_float else out


# ----------------------------------------------------------------------------- per-op entry

LOWERING = OpTable()


@LOWERING.register(*BINARY)
def _lower_binary(g, ins: Instr) -> None:
    a, b = (g.value(x) for x in ins.args)
    g.set(ins.dst, binary(g, ins.op, ins.dst.type, a, b))


@LOWERING.register(*UNARY)
def _lower_unary(g, ins: Instr) -> None:
    g.set(ins.dst, unary(g, ins.op, ins.dst.type, g.value(ins.args[0])))


@LOWERING.register("mov")
def _lower_mov(g, ins: Instr) -> None:
    g.set(ins.dst, g.value(ins.args[0]))


@LOWERING.register("fma")
def _lower_fma(g, ins: Instr) -> None:
    a, b, c = (g.value(x) for x in ins.args)
    g.set(ins.dst, g.intrinsic(f"llvm.fma.{suffix(a.type)}", a.type, [a, b, c]))


@LOWERING.register(*_PREDICATES)
def _lower_compare(g, ins: Instr) -> None:
    a, b = ins.args
    g.set(ins.dst, compare(g, ins.op, a.type, g.value(a), g.value(b)))


@LOWERING.register("select")
def _lower_select(g, ins: Instr) -> None:
    c, a, b = (g.value(x) for x in ins.args)
    g.set(ins.dst, g.b.select(c, a, b))


@LOWERING.register("cvt")
def _lower_cvt(g, ins: Instr) -> None:
    (a,) = ins.args
    g.set(ins.dst, convert(g, g.value(a), a.type, ins.dst.type))


@LOWERING.register("bitcast")
def _lower_bitcast(g, ins: Instr) -> None:
    (a,) = ins.args
    g.set(ins.dst, bitcast(g, g.value(a), a.type, ins.dst.type))


@LOWERING.register("sreg")
def _lower_sreg(g, ins: Instr) -> None:
    name = ins.attrs["name"]
    if name in ("dynamic_smem_size", "cluster_ctarank"):  # read in PTX, as the emitter does
        value = g.asm(f"mov.u32 $0, %{name};", "=r", I32, [], PURE)
    else:
        value = g.intrinsic(f"llvm.nvvm.read.ptx.sreg.{name}", I32, [])
    g.set(ins.dst, value)


@LOWERING.register("shfl")
def _lower_shfl(g, ins: Instr) -> None:
    value, lane = ins.args
    mode = ins.attrs["mode"]
    g.set(ins.dst, shuffle(g, mode, value.type, g.value(value), g.value(lane)))


@LOWERING.register("vote_any", "vote_all", "ballot")
def _lower_vote(g, ins: Instr) -> None:
    """``llvm.nvvm.vote.{any,all,ballot}.sync`` over the whole warp."""
    mode, ty = ("ballot", I32) if ins.op == "ballot" else (ins.op.removeprefix("vote_"), I1)
    args = [int_const(I32, -1), g.value(ins.args[0])]
    g.set(ins.dst, g.intrinsic(f"llvm.nvvm.vote.{mode}.sync", ty, args))


def _call(name: str, *args: int):
    """A statement that is one call of an intrinsic with constant i32 arguments."""

    def lower(g, ins: Instr) -> None:
        g.intrinsic(name, ir.VoidType(), [int_const(I32, a) for a in args])

    return lower


LOWERING.add("atomic", lambda g, ins: memory.lower_atomic(g, ins, binary))
LOWERING.add("sync_threads", _call("llvm.nvvm.barrier0"))
LOWERING.add("sync_warp", _call("llvm.nvvm.bar.warp.sync", -1))
LOWERING.add("threadfence", _call("llvm.nvvm.membar.gl"))
LOWERING.include(memory.LOWERING, tensor.LOWERING, hopper.LOWERING)
LOWERING.update(packed.lowering(LOWERING))  # f16x2/bf16x2, pack/unpack, prmt
