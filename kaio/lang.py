"""The DSL's builtins: one table, one entry per builtin.

Each builtin is a Python stub (what users import: ``kaio.thread_idx_x``, ``kaio.exp``...) that
raises when called outside a kernel, and an entry in ``BUILTINS`` mapping the stub to its
typing and lowering rule: a function ``(ctx, args, node) -> value`` that checks the operand
types and emits IR through ``ctx`` (the frontend's lowering context). The PTX emitter and the
simulator give each IR op its machine meaning; docs/dsl-reference.md lists every builtin with
its accuracy.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from dataclasses import dataclass

from kaio import types as T
from kaio.ir.nodes import Const

__all__ = ["BUILTINS", "Builtin", "static_range"]


@dataclass(frozen=True)
class Builtin:
    """A builtin's typing+lowering rule and its one-line documentation."""

    name: str
    lower: Callable
    doc: str


BUILTINS: dict[object, Builtin] = {}


def _stub(name: str, doc: str):
    def stub(*args, **kwargs):
        raise RuntimeError(
            f"kaio.{name}() can only be used inside a @kaio.gpu_kernel or @kaio.gpu_func "
            "function (compiled for the GPU or run with kernel.sim[...])"
        )

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = doc
    stub.__module__ = "kaio"
    return stub


def _define(name: str, doc: str, lower: Callable):
    stub = _stub(name, doc)
    BUILTINS[stub] = Builtin(name, lower, doc)
    globals()[name] = stub
    __all__.append(name)
    return stub


def _arity(ctx, name, args, node, n):
    if len(args) != n:
        ctx.error(f"kaio.{name}() takes {n} argument{'s' * (n != 1)}, got {len(args)}", node)


# ---------------------------------------------------------------- thread geometry
def _sreg(reg: str):
    def lower(ctx, args, node):
        _arity(ctx, reg, args, node, 0)
        return ctx.b.emit("sreg", T.u32, (), name=reg)

    return lower


for _axis in "xyz":
    for _name, _reg, _what in (
        ("thread_idx", "tid", "this thread's index in its block"),
        ("block_idx", "ctaid", "this block's index in the grid"),
        ("block_dim", "ntid", "threads per block"),
        ("grid_dim", "nctaid", "blocks in the grid"),
    ):
        _define(f"{_name}_{_axis}", f"u32: {_what} along {_axis}.", _sreg(f"{_reg}.{_axis}"))


def _linear_tid(ctx):
    b = ctx.b
    tx, ty, tz = (b.emit("sreg", T.u32, (), name=f"tid.{a}") for a in "xyz")
    nx, ny = (b.emit("sreg", T.u32, (), name=f"ntid.{a}") for a in "xy")
    yz = b.emit("add", T.u32, (ty, b.emit("mul", T.u32, (tz, ny))))
    return b.emit("add", T.u32, (tx, b.emit("mul", T.u32, (yz, nx))))


def _lane_id(ctx, args, node):
    _arity(ctx, "lane_id", args, node, 0)
    return ctx.b.emit("sreg", T.u32, (), name="laneid")


def _warp_id(ctx, args, node):
    _arity(ctx, "warp_id", args, node, 0)
    return ctx.b.emit("shr", T.u32, (_linear_tid(ctx), Const(5, T.u32)))


_define("lane_id", "u32: this thread's lane in its warp (0..31).", _lane_id)
_define("warp_id", "u32: this thread's warp in its block (linear thread index // 32).", _warp_id)


# ---------------------------------------------------------------- memory
def _shape_of(ctx, arg, node, name):
    shape = ctx.const_value(arg, node, f"the shape of kaio.{name}()")
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d > 0 for d in shape):
        ctx.error(f"kaio.{name}() needs a shape of positive compile-time ints, got {shape!r}", node)
    return shape


def _alloc(space: str):
    name = {"shared": "shared", "local": "local"}[space]

    def lower(ctx, args, node):
        _arity(ctx, name, args, node, 2)
        dtype = ctx.dtype_arg(args[0], node)
        return ctx.new_array(space, dtype, _shape_of(ctx, args[1], node, name), node)

    return lower


def _shared_dynamic(ctx, args, node):
    _arity(ctx, "shared_dynamic", args, node, 1)
    return ctx.new_array("shared_dyn", ctx.dtype_arg(args[0], node), (None,), node)


_define(
    "shared",
    "shared(dtype, shape): a static shared-memory array of the block (shape: compile-time).",
    _alloc("shared"),
)
_define(
    "shared_dynamic",
    "shared_dynamic(dtype): the block's dynamic shared memory as a 1-D array (bytes at launch).",
    _shared_dynamic,
)
_define(
    "local",
    "local(dtype, shape): a per-thread array (registers when indexed by constants).",
    _alloc("local"),
)


# ---------------------------------------------------------------- synchronization
def _barrier(op: str):
    def lower(ctx, args, node):
        _arity(ctx, op, args, node, 0)
        ctx.b.emit(op, None, ())
        return None

    return lower


_define(
    "sync_threads", "Barrier for all threads of the block (bar.sync 0).", _barrier("sync_threads")
)
_define("sync_warp", "Barrier for the 32 lanes of the warp (bar.warp.sync).", _barrier("sync_warp"))
_define("threadfence", "Device-wide memory fence (membar.gl).", _barrier("threadfence"))


# ---------------------------------------------------------------- warp
def _shuffle(mode: str, name: str):
    def lower(ctx, args, node):
        _arity(ctx, name, args, node, 2)
        value = ctx.value(args[0], node)
        if value.type.is_bool:
            ctx.error(f"kaio.{name}() shuffles numbers; use kaio.ballot() for booleans", node)
        lane = ctx.convert(ctx.value(args[1], node, T.u32), T.u32)
        return ctx.b.emit("shfl", value.type, (value, lane), mode=mode)

    return lower


for _mode, _name, _doc in (
    ("bfly", "shfl_xor", "shfl_xor(v, mask): v from lane (lane ^ mask)."),
    ("down", "shfl_down", "shfl_down(v, delta): v from lane + delta (own value past 31)."),
    ("up", "shfl_up", "shfl_up(v, delta): v from lane - delta (own value below 0)."),
    ("idx", "shfl_idx", "shfl_idx(v, lane): v from the given lane."),
):
    _define(_name, _doc + " All 32 lanes must take part.", _shuffle(_mode, _name))


def _vote(op: str, result: T.ScalarType):
    def lower(ctx, args, node):
        _arity(ctx, op, args, node, 1)
        p = ctx.truth(args[0], node)
        return ctx.b.emit(op, result, (p,))

    return lower


_define(
    "vote_any", "vote_any(p): True if p holds on any lane of the warp.", _vote("vote_any", T.bool_)
)
_define(
    "vote_all",
    "vote_all(p): True if p holds on every lane of the warp.",
    _vote("vote_all", T.bool_),
)
_define("ballot", "ballot(p): u32 mask with bit i set where lane i has p.", _vote("ballot", T.u32))


# ---------------------------------------------------------------- atomics
_ATOMIC_TYPES = {
    "add": ("i32", "u32", "i64", "u64", "f32", "f64", "f16", "bf16"),
    "max": ("i32", "u32", "i64", "u64", "f32", "f64"),
    "min": ("i32", "u32", "i64", "u64", "f32", "f64"),
    "exch": ("i32", "u32", "i64", "u64", "f32", "f64"),
    "cas": ("i32", "u32", "i64", "u64", "f32", "f64"),
}


def _atomic(kind: str):
    name = f"atomic_{kind}"
    nvals = 2 if kind == "cas" else 1

    def lower(ctx, args, node):
        if len(args) != 2 + nvals:
            what = "arr, idx, expected, new" if kind == "cas" else "arr, idx, value"
            ctx.error(f"kaio.{name}() takes ({what})", node)
        arr = ctx.array_arg(args[0], node, name)
        if arr.space == "local":
            ctx.error(f"kaio.{name}() works on global or shared arrays, not local ones", node)
        if arr.dtype.name not in _ATOMIC_TYPES[kind]:
            ok = ", ".join(_ATOMIC_TYPES[kind])
            ctx.error(f"kaio.{name}() does not support {arr.dtype} arrays (supported: {ok})", node)
        idx = ctx.indices(arr, args[1], node)
        vals = [ctx.convert(ctx.value(a, node, arr.dtype), arr.dtype) for a in args[2:]]
        return ctx.b.emit("atomic", arr.dtype, (arr, *idx, *vals), kind=kind)

    return lower


for _kind in ("add", "max", "min", "exch", "cas"):
    _define(
        f"atomic_{_kind}",
        f"atomic_{_kind}(arr, idx, {'expected, new' if _kind == 'cas' else 'v'}): "
        "atomically update arr[idx]; returns the old value.",
        _atomic(_kind),
    )


# ---------------------------------------------------------------- math
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _float_operand(ctx, arg, node, name, approx: bool):
    """The operand as a float IR value and the type the result is converted back to."""
    v = ctx.value(arg, node, T.f32)
    t = v.type
    if t.is_bool or t.is_int:
        t = T.f32
    if t == T.f64 and approx:
        ctx.error(
            f"kaio.{name}() has no f64 version (it uses the f32 hardware approximation); "
            f"convert to f32 first: kaio.{name}(f32(x))",
            node,
        )
    compute = T.f32 if t.bits < 32 else t
    return ctx.convert(v, compute), t


def _math1(name: str, build: Callable, approx: bool):
    def lower(ctx, args, node):
        _arity(ctx, name, args, node, 1)
        x, out_t = _float_operand(ctx, args[0], node, name, approx)
        return ctx.convert(build(ctx.b, x), out_t)

    return lower


def _c(v: float, t=T.f32):
    return Const(v, t)


_MATH1 = {
    "exp": (
        "exp(x): e**x as ex2.approx(x*log2(e)); rel. error ~2 ulp + |x|*2^-24.",
        True,
        lambda b, x: b.emit("exp2", T.f32, (b.emit("mul", T.f32, (x, _c(LOG2E))),)),
    ),
    "exp2": (
        "exp2(x): 2**x, ex2.approx.f32; max rel. error 2^-22 (2 ulp).",
        True,
        lambda b, x: b.emit("exp2", T.f32, (x,)),
    ),
    "log": (
        "log(x): natural log as lg2.approx(x)*ln(2); abs. error 2^-21 near 1, rel. 2^-22 else.",
        True,
        lambda b, x: b.emit("mul", T.f32, (b.emit("log2", T.f32, (x,)), _c(LN2))),
    ),
    "log2": (
        "log2(x): lg2.approx.f32; abs. error 2^-22 for x in [0.5, 2], rel. 2^-22 elsewhere.",
        True,
        lambda b, x: b.emit("log2", T.f32, (x,)),
    ),
    "rsqrt": (
        "rsqrt(x): 1/sqrt(x), rsqrt.approx.f32; max rel. error 2^-22.9.",
        True,
        lambda b, x: b.emit("rsqrt", T.f32, (x,)),
    ),
    "sin": (
        "sin(x): sin.approx.f32; abs. error 2^-20.9 on [-pi, pi], grows outside.",
        True,
        lambda b, x: b.emit("sin", T.f32, (x,)),
    ),
    "cos": (
        "cos(x): cos.approx.f32; abs. error 2^-20.9 on [-pi, pi], grows outside.",
        True,
        lambda b, x: b.emit("cos", T.f32, (x,)),
    ),
    "tanh": (
        "tanh(x): tanh.approx.f32 (sm_75+); max rel. error 2^-10.7.",
        True,
        lambda b, x: b.emit("tanh", T.f32, (x,)),
    ),
    "sqrt": (
        "sqrt(x): IEEE correctly rounded (sqrt.rn), f32 and f64.",
        False,
        lambda b, x: b.emit("sqrt", x.type, (x,)),
    ),
    "floor": (
        "floor(x): exact, result keeps the float type.",
        False,
        lambda b, x: b.emit("floor", x.type, (x,)),
    ),
    "ceil": (
        "ceil(x): exact, result keeps the float type.",
        False,
        lambda b, x: b.emit("ceil", x.type, (x,)),
    ),
    "trunc": (
        "trunc(x): round toward zero, exact.",
        False,
        lambda b, x: b.emit("trunc", x.type, (x,)),
    ),
    "rint": (
        "rint(x): round half to even, exact.",
        False,
        lambda b, x: b.emit("rint", x.type, (x,)),
    ),
}

for _name, (_doc, _approx, _build) in _MATH1.items():
    _define(_name, _doc, _math1(_name, _build, _approx))


def _erf_build(b, x):
    # Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 (plus ex2.approx's error).
    ax = b.emit("abs", T.f32, (x,))
    t = b.emit("div", T.f32, (_c(1.0), b.emit("fma", T.f32, (ax, _c(0.3275911), _c(1.0)))))
    poly = _c(1.061405429)
    for coef in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly = b.emit("fma", T.f32, (poly, t, _c(coef)))
    poly = b.emit("mul", T.f32, (poly, t))
    x2 = b.emit("mul", T.f32, (ax, ax))
    e = b.emit("exp2", T.f32, (b.emit("mul", T.f32, (x2, _c(-LOG2E))),))
    y = b.emit("sub", T.f32, (_c(1.0), b.emit("mul", T.f32, (poly, e))))
    neg = b.emit("lt", T.bool_, (x, _c(0.0)))
    return b.emit("select", T.f32, (neg, b.emit("neg", T.f32, (y,)), y))


_define(
    "erf",
    "erf(x): Abramowitz-Stegun 7.1.26 with ex2.approx; abs. error <= 2e-7.",
    _math1("erf", _erf_build, True),
)


def _abs(ctx, args, node):
    _arity(ctx, "abs", args, node, 1)
    v = ctx.value(args[0], node)
    if v.type.is_bool:
        ctx.error("kaio.abs() needs a number, got a bool", node)
    if v.type in (T.f16, T.bf16):
        return ctx.convert(ctx.b.emit("abs", T.f32, (ctx.convert(v, T.f32),)), v.type)
    return ctx.b.emit("abs", v.type, (v,))


def _minmax(op: str):
    def lower(ctx, args, node):
        if len(args) < 2:
            ctx.error(f"kaio.{op}() takes at least 2 arguments", node)
        result = args[0]
        for other in args[1:]:
            a, b = ctx.unify(result, other, node)
            t = a.type
            if t.is_bool:
                ctx.error(f"kaio.{op}() needs numbers, got bools", node)
            if t in (T.f16, T.bf16):
                r = ctx.b.emit(op, T.f32, (ctx.convert(a, T.f32), ctx.convert(b, T.f32)))
                result = ctx.convert(r, t)
            else:
                result = ctx.b.emit(op, t, (a, b))
        return result

    return lower


def _fma(ctx, args, node):
    _arity(ctx, "fma", args, node, 3)
    a, b = ctx.unify(args[0], args[1], node)
    a, c = ctx.unify(a, args[2], node)
    b = ctx.convert(b, a.type)
    t = a.type
    if not t.is_float:
        t = T.f32
    compute = T.f32 if t.bits < 32 else t
    vals = [ctx.convert(v, compute) for v in (a, b, c)]
    return ctx.convert(ctx.b.emit("fma", compute, tuple(vals)), t)


def _pow(ctx, args, node):
    _arity(ctx, "pow", args, node, 2)
    return ctx.power(args[0], args[1], node)


_define("abs", "abs(x): |x| for ints and floats (exact).", _abs)
_define("min", "min(a, b, ...): minimum; for floats a NaN operand is ignored.", _minmax("min"))
_define("max", "max(a, b, ...): maximum; for floats a NaN operand is ignored.", _minmax("max"))
_define("fma", "fma(a, b, c): a*b+c rounded once (fma.rn), f32 and f64.", _fma)
_define(
    "pow",
    "pow(x, y): x**y; a small constant integer y is exact multiplication, otherwise "
    "ex2.approx(y*lg2.approx(x)) (x > 0; NaN for x < 0).",
    _pow,
)


# ---------------------------------------------------------------- values
def _select(ctx, args, node):
    _arity(ctx, "select", args, node, 3)
    c = ctx.truth(args[0], node)
    a, b = ctx.unify(args[1], args[2], node)
    return ctx.b.emit("select", a.type, (c, a, b))


def _bitcast(ctx, args, node):
    _arity(ctx, "bitcast", args, node, 2)
    v = ctx.value(args[0], node)
    t = ctx.dtype_arg(args[1], node)
    if v.type.bits != t.bits or v.type.is_bool or t.is_bool:
        ctx.error(f"kaio.bitcast() needs types of the same width, got {v.type} to {t}", node)
    if v.type == t:
        return v
    return ctx.b.emit("bitcast", t, (v,))


_define("select", "select(c, a, b): a where c else b; both sides are evaluated.", _select)
_define("bitcast", "bitcast(x, dtype): the bits of x read as dtype (same width).", _bitcast)


def static_range(*args):
    """``for i in kaio.static_range(...)``: a loop unrolled at compile time (bounds must be
    compile-time ints); ``i`` is a constant in each copy of the body."""
    return range(*args)


# Python builtins usable in kernels, mapped to their kaio equivalents.
PYTHON_BUILTINS = {getattr(builtins, n): globals()[n] for n in ("abs", "min", "max", "pow")}

# math-module functions usable in kernels.
MATH_MODULE = {
    getattr(math, n): globals()[n]
    for n in (
        "exp",
        "exp2",
        "log",
        "log2",
        "sqrt",
        "sin",
        "cos",
        "tanh",
        "floor",
        "ceil",
        "erf",
        "trunc",
        "pow",
        "fma",
    )
    if hasattr(math, n)
}
