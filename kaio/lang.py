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
import functools
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kaio import types as T
from kaio.ir.nodes import Array, Const, Var
from kaio.ir.ops import MMA_KINDS

__all__ = ["BUILTINS", "Builtin", "static_range"]


@dataclass(frozen=True)
class Builtin:
    """A builtin's typing+lowering rule, its documentation and its Python signature (from
    the call form its documentation starts with: ``shared(dtype, shape): ...``; optional
    parameters in brackets, ``shared_dynamic(dtype[, shape[, offset]])``; ``min(a, b, ...)``
    takes any number; no call form: no parameters)."""

    name: str
    lower: Callable
    doc: str
    signature: inspect.Signature = None

    def bind(self, ctx, args: list, kwargs: dict, node) -> list:
        """The call's arguments in parameter order, bound as Python binds them (a wrong,
        duplicate or missing name is a CompileError at the call); optional parameters not
        given are left off the end."""
        if not kwargs and self._positional_ok(len(args)):
            return args
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            ctx.error(f"kaio.{self.name}{self.signature}: {e}", node)
        out, gap = [], None
        for p in self.signature.parameters.values():
            if p.kind is p.VAR_POSITIONAL:
                out.extend(bound.arguments.get(p.name, ()))
            elif p.name in bound.arguments:
                if gap is not None:
                    ctx.error(
                        f"kaio.{self.name}{self.signature}: {p.name!r} is given, so {gap!r} "
                        "must be given too",
                        node,
                    )
                out.append(bound.arguments[p.name])
            else:
                gap = p.name
        return out

    def _positional_ok(self, n: int) -> bool:
        low, high = self._arity
        return low <= n <= high

    @functools.cached_property
    def _arity(self) -> tuple:
        """The fewest and most positional arguments a call may give without keywords (every
        named parameter before ``...``; else the required ones up to all of them)."""
        params = self.signature.parameters.values()
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            return sum(1 for p in params if p.kind is not p.VAR_POSITIONAL), math.inf
        return sum(1 for p in params if p.default is p.empty), len(params)


BUILTINS: dict[object, Builtin] = {}

OPTIONAL = None  # the default of an optional builtin parameter: "not given"


def signature_of(name: str, doc: str) -> inspect.Signature:
    """The signature a builtin's documentation gives in its leading call form."""
    if not doc.startswith(name + "("):
        return inspect.Signature()
    depth, start = 0, len(name) + 1
    for end in range(start, len(doc)):
        depth += {"(": 1, ")": -1}.get(doc[end], 0)
        if depth < 0:
            break
    inner = doc[start:end]
    params, level = [], 0
    for m in re.finditer(r"\[|\]|\.\.\.|[A-Za-z_]\w*", inner):
        token = m.group()
        if token in "[]":
            level += 1 if token == "[" else -1
        elif token == "...":
            params.append(inspect.Parameter("more", inspect.Parameter.VAR_POSITIONAL))
        else:
            default = OPTIONAL if level else inspect.Parameter.empty
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            params.append(inspect.Parameter(token, kind, default=default))
    return inspect.Signature(params)


def _stub(name: str, doc: str, signature: inspect.Signature):
    def stub(*args, **kwargs):
        raise RuntimeError(
            f"kaio.{name}() can only be used inside a @kaio.gpu_kernel or @kaio.gpu_func "
            "function (compiled for the GPU or run with kernel.sim[...])"
        )

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = doc
    stub.__module__ = "kaio"
    stub.__signature__ = signature
    return stub


def _define(name: str, doc: str, lower: Callable):
    signature = signature_of(name, doc)
    stub = _stub(name, doc, signature)
    BUILTINS[stub] = Builtin(name, lower, doc, signature)
    globals()[name] = stub
    __all__.append(name)
    return stub


# ---------------------------------------------------------------- thread geometry
def _sreg(reg: str):
    def lower(ctx, args, node):
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
    return ctx.b.emit("sreg", T.u32, (), name="laneid")


def _warp_id(ctx, args, node):
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
        dtype = ctx.dtype_arg(args[0], node)
        arr = ctx.new_array(space, dtype, _shape_of(ctx, args[1], node, name), node)
        if space == "shared":
            _check_static_shared(ctx, arr, node)
        return arr

    return lower


def _check_static_shared(ctx, arr, node) -> None:
    """A located CompileError at the ``kaio.shared`` call that takes the kernel's static shared
    memory over the 48 KB every GPU allows (ptxas refuses more)."""
    from kaio.limits import STATIC_SHARED_LIMIT, static_shared_bytes

    total = sum(n for _, n in static_shared_bytes(ctx))
    if total > STATIC_SHARED_LIMIT:
        size = arr.static_size * arr.dtype.itemsize
        ctx.error(
            f"static shared memory is limited to {STATIC_SHARED_LIMIT} bytes (48 KB) per "
            f"block: this kaio.shared() takes {size} bytes, {total} in all; use smaller tiles, "
            "or kaio.shared_dynamic() (sized at launch, up to the GPU's opt-in limit)",
            node,
        )


def _launch_bounds(ctx, args, node):
    if len(args) not in (1, 2):
        ctx.error("kaio.launch_bounds() takes (max_threads[, min_blocks_per_sm])", node)
    values = [ctx.const_value(a, node, "the arguments of kaio.launch_bounds()") for a in args]
    for v, top in zip(values, (1024, 32), strict=False):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top:
            ctx.error(f"kaio.launch_bounds() needs compile-time ints in 1..{top}, got {v!r}", node)
    ctx.meta["max_threads"] = values[0]
    if len(values) == 2:
        ctx.meta["min_blocks"] = values[1]


_define(
    "launch_bounds",
    "launch_bounds(n[, min_blocks]): promise that blocks have at most n threads (PTX "
    ".maxntid; a larger launch is an error) and ask ptxas to fit min_blocks blocks per "
    "multiprocessor (.minnctapersm), which caps registers per thread accordingly.",
    _launch_bounds,
)


def _shared_dynamic(ctx, args, node):
    if not 1 <= len(args) <= 3:
        ctx.error("kaio.shared_dynamic() takes (dtype[, shape[, offset_bytes]])", node)
    dtype = ctx.dtype_arg(args[0], node)
    if len(args) == 1:
        return ctx.new_array("shared_dyn", dtype, (None,), node)
    shape = _shape_of(ctx, args[1], node, "shared_dynamic")
    offset = 0
    if len(args) == 3:
        offset = ctx.const_value(args[2], node, "the offset of kaio.shared_dynamic()")
    if not isinstance(offset, int) or offset < 0 or offset % 16:
        ctx.error(
            f"kaio.shared_dynamic(): the offset must be a multiple of 16 bytes, got {offset!r}",
            node,
        )
    arr = ctx.new_array("shared_dyn", dtype, shape, node)
    arr.offset = offset
    return arr


_define(
    "shared",
    "shared(dtype, shape): a static shared-memory array of the block (shape: compile-time).",
    _alloc("shared"),
)
_define(
    "shared_dynamic",
    "shared_dynamic(dtype[, shape[, offset]]): the block's dynamic shared memory (sized at "
    "launch) as a 1-D array, or as an array of a compile-time shape starting offset bytes in "
    "(a multiple of 16): several shaped views split one allocation.",
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


def _lower_wait_eq(ctx, args, node):
    if len(args) != 3:
        ctx.error("kaio.wait_eq() takes (arr, idx, value)", node)
    arr = ctx.array_arg(args[0], node, "wait_eq")
    if arr.space != "global":
        where = f"not a {arr.space} one"
        ctx.error(f"kaio.wait_eq() waits on a global array (a kernel argument), {where}", node)
    if arr.dtype.name not in ("i32", "u32"):
        ctx.error(f"kaio.wait_eq() waits on an i32 or u32 array, not {arr.dtype}", node)
    idx = ctx.indices(arr, args[1], node)
    value = ctx.convert(ctx.value(args[2], node, arr.dtype), arr.dtype)
    ctx.b.emit("wait_eq", None, (arr, *idx, value))
    return None


_define(
    "wait_eq",
    "wait_eq(arr, idx, value): spin until the global i32/u32 arr[idx] equals value, reading "
    "it with acquire loads (ld.acquire.gpu): what the thread that stored the value wrote "
    "before its release (threadfence() then a store or atomic) is then visible. For blocks "
    "that take turns (a semaphore another block increments); the waited-for block must be "
    "running or done (one of lower linear index: blocks start in that order). The simulator "
    "runs a kernel that calls it one block at a time, in linear order, and reports a wait "
    "that the blocks before it did not satisfy.",
    _lower_wait_eq,
)


# ---------------------------------------------------------------- math
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _float_operand(ctx, arg, node, name, approx: bool):
    """The operand as a float IR value and the type the result is converted back to."""
    v = ctx.value(arg, node, T.f32)
    t = v.type
    if t.is_packed and name == "exp2":
        return v, t  # ex2.approx of both halves, one instruction
    require_scalar(ctx, v, node, f"kaio.{name}()")
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
        x, out_t = _float_operand(ctx, args[0], node, name, approx)
        return ctx.convert(build(ctx.b, x), out_t)

    return lower


def _one_op(op: str) -> Callable:
    """The build of a math builtin that is the one IR op ``op``, in the operand's type (f32
    for the approximations: ``_float_operand`` computes them in f32)."""
    return lambda b, x: b.emit(op, x.type, (x,))


def _c(v: float, t=T.f32):
    return Const(v, t)


_MATH1 = {
    "exp": (
        "exp(x): e**x as ex2.approx(x*log2(e)); rel. error ~2 ulp + |x|*2^-24.",
        True,
        lambda b, x: b.emit("exp2", T.f32, (b.emit("mul", T.f32, (x, _c(LOG2E))),)),
    ),
    "exp2": (
        "exp2(x): 2**x, ex2.approx.f32; max rel. error 2^-22 (2 ulp). On an f16x2/bf16x2 pair: "
        "both halves in one ex2.approx.f16x2 (max rel. error 2^-9.9) or .ftz.bf16x2 (sm_90, "
        "within one bf16 ulp).",
        True,
        _one_op("exp2"),
    ),
    "log": (
        "log(x): natural log as lg2.approx(x)*ln(2); abs. error 2^-21 near 1, rel. 2^-22 else.",
        True,
        lambda b, x: b.emit("mul", T.f32, (b.emit("log2", T.f32, (x,)), _c(LN2))),
    ),
    "log2": (
        "log2(x): lg2.approx.f32; abs. error 2^-22 for x in [0.5, 2], rel. 2^-22 elsewhere.",
        True,
        _one_op("log2"),
    ),
    "exp2_ftz": (
        "exp2_ftz(x): 2**x, ex2.approx.ftz.f32: exp2's accuracy, one instruction; subnormal "
        "inputs and results are flushed to zero.",
        True,
        _one_op("exp2_ftz"),
    ),
    "rcp_ftz": (
        "rcp_ftz(x): 1/x, rcp.approx.ftz.f32; max rel. error 2^-23, one instruction; subnormal "
        "inputs and results are flushed to zero (1/0 is inf).",
        True,
        _one_op("rcp_ftz"),
    ),
    "rsqrt": (
        "rsqrt(x): 1/sqrt(x), rsqrt.approx.f32; max rel. error 2^-22.9.",
        True,
        _one_op("rsqrt"),
    ),
    "sin": (
        "sin(x): sin.approx.f32; abs. error 2^-20.9 on [-pi, pi], grows outside.",
        True,
        _one_op("sin"),
    ),
    "cos": (
        "cos(x): cos.approx.f32; abs. error 2^-20.9 on [-pi, pi], grows outside.",
        True,
        _one_op("cos"),
    ),
    "tanh": (
        "tanh(x): tanh.approx.f32 (sm_75+); max rel. error 2^-10.7.",
        True,
        _one_op("tanh"),
    ),
    "sqrt": (
        "sqrt(x): IEEE correctly rounded (sqrt.rn), f32 and f64.",
        False,
        _one_op("sqrt"),
    ),
    "floor": (
        "floor(x): exact, result keeps the float type.",
        False,
        _one_op("floor"),
    ),
    "ceil": (
        "ceil(x): exact, result keeps the float type.",
        False,
        _one_op("ceil"),
    ),
    "trunc": (
        "trunc(x): round toward zero, exact.",
        False,
        _one_op("trunc"),
    ),
    "rint": (
        "rint(x): round half to even, exact.",
        False,
        _one_op("rint"),
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
    a, b = ctx.unify(args[0], args[1], node)
    a, c = ctx.unify(a, args[2], node)
    b = ctx.convert(b, a.type)
    t = a.type
    if t.is_packed:  # fma.rn.f16x2 / .bf16x2: each half rounded once
        return ctx.b.emit("fma", t, (a, b, c))
    if not t.is_float:
        t = T.f32
    vals = [ctx.convert(v, t) for v in (a, b, c)]
    return ctx.b.emit("fma", t, tuple(vals))  # f16/bf16 too: fma.rn.f16, rounded once


def _pow(ctx, args, node):
    return ctx.power(args[0], args[1], node)


_define("abs", "abs(x): |x| for ints, floats and packed pairs (exact).", _abs)
_define("min", "min(a, b, ...): minimum; for floats a NaN operand is ignored.", _minmax("min"))
_define("max", "max(a, b, ...): maximum; for floats a NaN operand is ignored.", _minmax("max"))
_define(
    "fma",
    "fma(a, b, c): a*b+c rounded once (fma.rn): f16, bf16, f32, f64, f16x2/bf16x2 pairs.",
    _fma,
)
_define(
    "pow",
    "pow(x, y): x**y; a small constant integer y is exact multiplication, otherwise "
    "ex2.approx(y*lg2.approx(x)) (x > 0; NaN for x < 0).",
    _pow,
)


# ---------------------------------------------------------------- values
def _select(ctx, args, node):
    c = ctx.truth(args[0], node)
    a, b = ctx.unify(args[1], args[2], node)
    return ctx.b.emit("select", a.type, (c, a, b))


def _bitcast(ctx, args, node):
    v = ctx.value(args[0], node)
    t = ctx.dtype_arg(args[1], node)
    if v.type.bits != t.bits or v.type.is_bool or t.is_bool:
        ctx.error(f"kaio.bitcast() needs types of the same width, got {v.type} to {t}", node)
    if v.type == t:
        return v
    return ctx.b.emit("bitcast", t, (v,))


_define("select", "select(c, a, b): a where c else b; both sides are evaluated.", _select)
_define("bitcast", "bitcast(x, dtype): the bits of x read as dtype (same width).", _bitcast)


# ---------------------------------------------------------------- registers, vectors, tensor cores
# Multi-register instructions read and write *fragments*: a kaio.local array, or a part of one
# named by leading constant indices (acc[i, j] of a 3-D acc), kept in registers.
_VECTOR_BYTES = (4, 8, 16)


def _memory_array(ctx, v, node, name: str, spaces: tuple) -> Array:
    arr = ctx.array_arg(v, node, name)
    if arr.space not in spaces:
        where = " or ".join(dict.fromkeys("shared" if s == "shared_dyn" else s for s in spaces))
        ctx.error(f"kaio.{name}() needs a {where} array; {arr.name!r} is {arr.space}", node)
    return arr


def _vector_frag(ctx, v, arr, node, name: str):
    frag = ctx.fragment(v, node, f"kaio.{name}()")
    t = frag.array.dtype
    nbytes = frag.size * t.itemsize
    if t.is_bool or t.bits < 16 or nbytes not in _VECTOR_BYTES:
        ctx.error(
            f"kaio.{name}() moves 4, 8 or 16 bytes of 16-, 32- or 64-bit registers; "
            f"{frag!r} is {frag.size} x {t} = {nbytes} bytes",
            node,
        )
    if nbytes % arr.dtype.itemsize:
        ctx.error(f"kaio.{name}(): {nbytes} bytes is not a whole number of {arr.dtype}", node)
    return frag


_L2_SIZES = (0, 64, 128, 256)  # load_vector's l2: the bytes L2 fetches on a miss (0: its own)
# load_vector's cache operator ("": the default, .ca), the read-only path (.nc) or an L1
# eviction priority
_LOAD_CACHES = ("", "ca", "cg", "cs", "nc", "L1::evict_last", "L1::evict_first", "L1::no_allocate")


def _load_vector(ctx, args, node):
    arr = _memory_array(ctx, args[1], node, "load_vector", ("global", "shared", "shared_dyn"))
    frag = _vector_frag(ctx, args[0], arr, node, "load_vector")
    l2 = ctx.const_value(args[3], node, "kaio.load_vector()'s l2") if len(args) > 3 else 0
    if l2 not in _L2_SIZES or isinstance(l2, bool) or (l2 and arr.space != "global"):
        ctx.error(
            f"kaio.load_vector(): l2 is 0, 64, 128 or 256 (a global array's L2 fetch size), "
            f"got {l2!r} for a {arr.space} array",
            node,
        )
    cache = ctx.const_value(args[4], node, "kaio.load_vector()'s cache") if len(args) > 4 else ""
    if cache not in _LOAD_CACHES or (cache and arr.space != "global"):
        ctx.error(
            f"kaio.load_vector(): cache is one of {_LOAD_CACHES} (a global array's cache "
            f"operator or L1 eviction priority), got {cache!r} for a {arr.space} array",
            node,
        )
    operands = (frag, arr, *ctx.indices(arr, args[2], node))
    if cache:
        ctx.b.emit("ld_vec", None, operands, l2=l2, cache=cache)
    else:
        ctx.b.emit("ld_vec", None, operands, l2=l2)


def _store_vector(ctx, args, node):
    arr = _memory_array(ctx, args[0], node, "store_vector", ("global", "shared", "shared_dyn"))
    frag = _vector_frag(ctx, args[2], arr, node, "store_vector")
    ctx.b.emit("st_vec", None, (arr, *ctx.indices(arr, args[1], node), frag))


_define(
    "load_vector",
    "load_vector(regs, arr, index[, l2[, cache]]): regs[:] = the bytes at arr[index...] in ONE "
    "4/8/16-byte access (ld.v4.b32...); the address must be aligned to the size. l2 (64, "
    "128 or 256; global arrays, sm_80+): on an L2 miss, L2 fetches that many bytes around "
    "the address (ld.L2::256B), a hint. cache ('ca', 'cg', 'cs', 'nc' or an L1 eviction "
    "priority 'L1::evict_last', 'L1::evict_first', 'L1::no_allocate'; global arrays): the "
    "cache operator, ld.global.cg (L2 only, L1 not filled: keeps L1 for data read again) "
    "or .cs (streaming, evict first), the read-only data path ld.global.nc (data the "
    "kernel never writes), or ld.global.L1::evict_last...; '' or 'ca' is the default.",
    _load_vector,
)
_define(
    "store_vector",
    "store_vector(arr, index, regs): write regs to arr[index...] in ONE 4/8/16-byte access; "
    "the address must be aligned to the size.",
    _store_vector,
)


def _prefetch_l2(ctx, args, node):
    arr = _memory_array(ctx, args[0], node, "prefetch_l2", ("global",))
    if len(args) > 2 and isinstance(args[2], Var):  # a size known at run time
        size = ctx.value(args[2], node, T.u32)
        if not size.type.is_int or size.type.bits > 32:
            ctx.error(f"kaio.prefetch_l2(): nbytes is a 32-bit integer, got {size.type}", node)
        size = ctx.convert(size, T.u32)
        ctx.b.emit("bulk_prefetch", None, (arr, *ctx.indices(arr, args[1], node), size))
        return
    nbytes = ctx.const_value(args[2], node, "kaio.prefetch_l2()'s size") if len(args) > 2 else 0
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0 or nbytes % 16:
        ctx.error(
            f"kaio.prefetch_l2(): nbytes is a compile-time multiple of 16, got {nbytes!r}", node
        )
    ctx.b.emit("prefetch_l2", None, (arr, *ctx.indices(arr, args[1], node)), bulk=nbytes)


_define(
    "prefetch_l2",
    "prefetch_l2(arr, index[, nbytes]): ask for the cache line holding global arr[index...] "
    "to be brought into L2 (prefetch.global.L2), no register written: a later load of it "
    "waits on L2, not DRAM; with nbytes (a multiple of 16, 16-byte aligned; known at "
    "compile time or only at run time), those bytes from there on "
    "(cp.async.bulk.prefetch.L2, sm_90+). A hint: no effect on any value; "
    "the bytes must be in bounds.",
    _prefetch_l2,
)


def _word_frag(ctx, v, node, name: str, sizes: tuple, what: str):
    """A fragment of 32-bit registers (u32, i32, packed pairs; f32 where allowed)."""
    frag = ctx.fragment(v, node, f"kaio.{name}()")
    t = frag.array.dtype
    if t.bits != 32 or t.is_bool:
        ctx.error(f"kaio.{name}(): {what} needs 32-bit registers (u32), got {t}", node)
    if frag.size not in sizes:
        ok = " or ".join(str(n) for n in sizes)
        ctx.error(f"kaio.{name}(): {what} is {ok} registers, {frag!r} has {frag.size}", node)
    return frag


def _ldmatrix(trans: bool):
    name = "ldmatrix_trans" if trans else "ldmatrix"

    def lower(ctx, args, node):
        frag = _word_frag(ctx, args[0], node, name, (1, 2, 4), "the destination")
        if frag.array.dtype.is_float and frag.array.dtype.name == "f32":
            ctx.error(f"kaio.{name}() loads 16-bit pairs: use u32 (or packed) registers", node)
        arr = _memory_array(ctx, args[1], node, name, ("shared", "shared_dyn"))
        if 16 % arr.dtype.itemsize or (trans and arr.dtype.itemsize != 2):
            need = "16-bit" if trans else "8-, 16- or 32-bit"
            ctx.error(f"kaio.{name}() reads rows of {need} elements, not {arr.dtype}", node)
        ctx.b.emit("ldmatrix", None, (frag, arr, *ctx.indices(arr, args[2], node)), trans=trans)

    return lower


_define(
    "ldmatrix",
    "ldmatrix(frag, smem, index): warp-wide load of len(frag) (1, 2, 4) 8x8 matrices of "
    "16-bit elements; lane 8*i+r gives the address of row r of matrix i, frag[i] gets this "
    "lane's pair of matrix i (row lane//4, columns 2*(lane%4), +1). sm_75+.",
    _ldmatrix(False),
)
_define(
    "ldmatrix_trans",
    "ldmatrix_trans(frag, smem, index): like ldmatrix, each 8x8 matrix transposed (frag[i] "
    "holds rows 2*(lane%4), +1 of column lane//4). sm_75+.",
    _ldmatrix(True),
)


def _mma(kind: str):
    name = f"mma_{kind}"
    info = MMA_KINDS[kind]
    acc = T.i32 if info.acc == "s32" else T.f32

    def lower(ctx, args, node):
        d, a, b, c = (ctx.fragment(v, node, f"kaio.{name}()") for v in args)
        for frag, regs, what in ((d, info.c_regs, "d"), (c, info.c_regs, "c")):
            if frag.array.dtype != acc or frag.size != regs:
                ctx.error(
                    f"kaio.{name}(): {what} is {regs} x {acc} registers, got {frag!r} "
                    f"({frag.size} x {frag.array.dtype})",
                    node,
                )
        _word_frag(ctx, a, node, name, (info.a_regs,), "a")
        _word_frag(ctx, b, node, name, (info.b_regs,), "b")
        ctx.b.emit("mma", None, (d, a, b, c), kind=kind)

    return lower


for _kind, _what in (
    ("f16", "f16 inputs, f32 accumulators, m16n8k16"),
    ("bf16", "bf16 inputs, f32 accumulators, m16n8k16"),
    ("s8", "s8 inputs, s32 accumulators (wrapping), m16n8k32"),
    ("tf32", "tf32 inputs (f32 registers, low 13 mantissa bits ignored), f32 acc., m16n8k8"),
):
    _define(
        f"mma_{_kind}",
        f"mma_{_kind}(d, a, b, c): warp-wide tensor-core d = a @ b + c (mma.sync.aligned, "
        f"{_what}); fragments per docs/tensor-cores.md. sm_80+.",
        _mma(_kind),
    )


def _to_tf32(ctx, args, node):
    x = ctx.convert(ctx.value(args[0], node, T.f32), T.f32)
    return ctx.b.emit("to_tf32", T.f32, (x,))


_define(
    "to_tf32",
    "to_tf32(x): x rounded to tf32 (10 mantissa bits, nearest, ties away; cvt.rna.tf32.f32), "
    "as an f32. sm_80+.",
    _to_tf32,
)


def _cp_async(cache: str | None):
    name = "cp_async" if cache is None else f"cp_async_{cache}"

    def lower(ctx, args, node):
        if len(args) not in (5, 6):
            ctx.error(
                f"kaio.{name}() takes (dst, dst_index, src, src_index, nbytes[, src_bytes])",
                node,
            )
        dst = _memory_array(ctx, args[0], node, name, ("shared", "shared_dyn"))
        src = _memory_array(ctx, args[2], node, name, ("global",))
        nbytes = ctx.const_value(args[4], node, f"the size of kaio.{name}()")
        if nbytes not in _VECTOR_BYTES:
            ctx.error(f"kaio.{name}() copies 4, 8 or 16 bytes, got {nbytes!r}", node)
        level = cache or ("cg" if nbytes == 16 else "ca")
        if level == "cg" and nbytes != 16:
            ctx.error("kaio.cp_async_cg() copies 16 bytes (use cp_async_ca for 4 or 8)", node)
        for arr in (dst, src):
            if nbytes % arr.dtype.itemsize:
                ctx.error(
                    f"kaio.{name}(): {nbytes} bytes is not a whole number of {arr.dtype}", node
                )
        size = ctx.value(args[5], node, T.u32) if len(args) == 6 else Const(nbytes, T.u32)
        operands = (
            dst,
            *ctx.indices(dst, args[1], node),
            src,
            *ctx.indices(src, args[3], node),
            ctx.convert(size, T.u32),
        )
        ctx.b.emit("cp_async", None, operands, bytes=nbytes, cache=level)

    return lower


_CP_ASYNC_DOC = (
    "(dst, dst_index, src, src_index, nbytes[, src_bytes]): start an asynchronous copy of "
    "nbytes (4, 8, 16) from global src[src_index...] to shared dst[dst_index...]; only the "
    "first src_bytes are read, the rest of the destination is zero-filled (edge tiles). "
    "Complete it with cp_async_commit() + cp_async_wait(n). sm_80+."
)
for _cache, _how in (
    (None, " 16 bytes are cached in L2 only (.cg), 4 and 8 in L1 and L2 (.ca)."),
    ("ca", " Cached in L1 and L2 (.ca)."),
    ("cg", " Cached in L2 only (.cg); 16 bytes."),
):
    _cp_name = "cp_async" if _cache is None else f"cp_async_{_cache}"
    _define(_cp_name, _cp_name + _CP_ASYNC_DOC + _how, _cp_async(_cache))


def _cp_async_commit(ctx, args, node):
    ctx.b.emit("cp_async_commit", None, ())


def _cp_async_wait(ctx, args, node):
    n = ctx.const_value(args[0], node, "the group count of kaio.cp_async_wait()")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 7:
        ctx.error(f"kaio.cp_async_wait(n) needs a compile-time int 0..7, got {n!r}", node)
    ctx.b.emit("cp_async_wait", None, (), pending=n)


def _cp_async_wait_all(ctx, args, node):
    ctx.b.emit("cp_async_commit", None, ())
    ctx.b.emit("cp_async_wait", None, (), pending=0)


_define(
    "cp_async_commit",
    "cp_async_commit(): close this thread's group of pending cp_async copies. sm_80+.",
    _cp_async_commit,
)
_define(
    "cp_async_wait",
    "cp_async_wait(n): wait until at most n of this thread's committed copy groups are "
    "pending (the older ones are complete and visible to this thread; sync_threads() to "
    "share them). sm_80+.",
    _cp_async_wait,
)
_define(
    "cp_async_wait_all",
    "cp_async_wait_all(): commit, then wait for every copy of this thread. sm_80+.",
    _cp_async_wait_all,
)


def _swizzle(ctx, args, node):
    arr = _memory_array(ctx, args[0], node, "swizzle", ("shared", "shared_dyn"))
    if arr.ndim < 2:
        ctx.error("kaio.swizzle() needs a shared array of 2 or more dimensions (rows, cols)", node)
    row_bytes = int(arr.shape[-1].value) * arr.dtype.itemsize
    chunks = row_bytes // 16
    if row_bytes % 16 or chunks & (chunks - 1):
        ctx.error(
            "kaio.swizzle() permutes 16-byte chunks of rows that are a power of two of "
            f"16-byte chunks; {arr.name!r} has rows of {row_bytes} bytes",
            node,
        )
    row, col = ctx.unify(args[1], args[2], node)
    t = col.type
    if not t.is_int:
        ctx.error(f"kaio.swizzle() takes integer row and column, got {t}", node)
    span = builtins.min(chunks, 8)
    if span == 1:
        return col
    b = ctx.b
    shift = (8 // span).bit_length() - 1  # rows that share one 128-byte line
    phase = b.emit("shr", t, (row, Const(shift, T.u32))) if shift else row
    phase = b.emit("and", t, (phase, Const(span - 1, t)))
    per_chunk = 16 // arr.dtype.itemsize
    flip = b.emit("shl", t, (phase, Const(per_chunk.bit_length() - 1, T.u32)))
    return b.emit("xor", t, (col, flip))


_define(
    "swizzle",
    "swizzle(smem, row, col): the physical column of logical element [..., row, col] of a "
    "shared tile (2-D or more) stored XOR-swizzled: 16-byte chunk c of row r goes to chunk "
    "c ^ phase(r) within its 128-byte line, so 8 consecutive rows at one logical chunk (ldmatrix, "
    "cp_async) hit 8 different bank groups. Use it for every access of the tile.",
    _swizzle,
)


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


# ---------------------------------------------------------------- packed half-precision pairs
# f16x2 / bf16x2 (kaio.types): two f16 (bf16) numbers in one 32-bit value, element 0 in the
# low half. Calling the type packs (kaio.f16x2(lo, hi), kaio.f16x2(v)); low() and high()
# unpack. + - * unary -, fma, min, max and abs work on both halves at once (kaio.ptx.packed,
# kaio.sim.packed); a pair never meets a scalar (no promotion): pack the scalar first. The
# frontend calls packed_mix, packed_conversion, require_scalar and pack; prmt is the byte
# permute the int4/int8 unpacking tricks use.

_PACKED_OPERATORS = {"+": "add", "-": "sub", "*": "mul"}


def packed_mix(a: T.ScalarType, b: T.ScalarType) -> str | None:
    """The error message for combining ``a`` and ``b`` when one is a packed pair (None when
    neither is)."""
    if not (a.is_packed or b.is_packed):
        return None
    p, other = (a, b) if a.is_packed else (b, a)
    if other.is_packed:
        return f"cannot combine {a} and {b}: a pair only combines with a pair of its own type"
    return (
        f"cannot combine {p} with the scalar {other}: pack it first (kaio.{p.name}(x) puts x "
        f"in both halves), or unpack the pair with kaio.low()/kaio.high()"
    )


def packed_conversion(src: T.ScalarType, dst: T.ScalarType) -> str | None:
    """The error message for converting between a packed pair and another type (None when
    the conversion is not one of those)."""
    if src == dst or not (src.is_packed or dst.is_packed):
        return None
    if src.is_packed:
        return (
            f"cannot convert {src} to {dst}: take a half with kaio.low()/kaio.high(), or the "
            f"bits with kaio.bitcast(p, kaio.u32)"
        )
    how = f"kaio.{dst.name}(lo, hi) or kaio.{dst.name}(x)"
    return f"cannot convert {src} to {dst}: pack it with {how}"


def require_scalar(ctx, v, node, what: str) -> None:
    """CompileError when the IR value ``v`` is a packed pair, which ``what`` cannot take."""
    if v.type.is_packed:
        ctx.error(
            f"{what} needs a scalar, got {v.type}: unpack it with kaio.low()/kaio.high() "
            f"(or take its bits with kaio.bitcast(p, kaio.u32))",
            node,
        )


def packed_operator(ctx, sym: str, a, b, node):
    """``a sym b`` on two pairs of one packed type: ``+ - *``, each half rounded once."""
    op = _PACKED_OPERATORS.get(sym)
    if op is None:
        fix = (
            "bit operations need integers: kaio.bitcast(p, kaio.u32) first"
            if sym in "&|^"
            else "only + - * (and kaio.fma, min, max, abs) work on pairs; unpack with "
            "kaio.low()/kaio.high(), compute, and pack again"
        )
        ctx.error(f"'{sym}' on {a.type}: {fix}", node)
    return ctx.b.emit(op, a.type, (a, b))


def _exact_in_f32(t: T.ScalarType) -> bool:
    return t.is_bool or (t.is_float and t.bits <= 32) or (t.is_int and t.bits <= 16)


def pack(ctx, t: T.ScalarType, args, node):
    """``kaio.f16x2(lo, hi)`` or ``kaio.f16x2(v)`` (both halves): each value rounded once to
    nearest even to ``t.element``. Two f32 halves are one ``cvt.rn.f16x2.f32``; values exact
    in f32 join them; others (f64, 32/64-bit ints) are converted to the element type first."""
    if len(args) not in (1, 2):
        ctx.error(f"kaio.{t.name}() takes (lo, hi), or one value for both halves", node)
    halves = []
    for arg in args:
        if isinstance(arg, Array):
            ctx.value(arg, node)  # the "array used as a value" error
        if not isinstance(arg, Var | Const):  # a compile-time Python value
            x = ctx.const_value(arg, node, f"an argument of kaio.{t.name}()")
            if not isinstance(x, int | float | bool | np.number):
                ctx.error(f"cannot pack {x!r} into {t}", node)
            halves.append(x)
            continue
        require_scalar(ctx, arg, node, f"kaio.{t.name}()")
        halves.append(arg)
    if len(halves) == 1:
        halves *= 2
    if not any(isinstance(h, Var | Const) for h in halves):
        return Const(int(T.pack_host(t, *halves)), t)
    vals = []
    for h in halves:
        if not isinstance(h, Var | Const):
            h = Const(float(T.unpack_host(t, T.pack_host(t, h))[0]), t.element)
        elif h.type != t.element:
            h = ctx.convert(h, T.f32 if _exact_in_f32(h.type) else t.element)
        vals.append(h)
    if any(v.type == T.f32 for v in vals):  # one cvt rounds both halves
        vals = [ctx.convert(v, T.f32) for v in vals]
    return ctx.b.emit("pack", t, tuple(vals))


def _unpack(op: str, name: str):
    def lower(ctx, args, node):
        p = ctx.value(args[0], node)
        if not p.type.is_packed:
            ctx.error(f"kaio.{name}() takes a packed pair (f16x2, bf16x2), got {p.type}", node)
        return ctx.b.emit(op, p.type.element, (p,))

    return lower


def _prmt(ctx, args, node):
    vals = tuple(_u32_operand(ctx, "prmt", arg, node) for arg in args)
    return ctx.b.emit("prmt", T.u32, vals)


def _lop3(ctx, args, node):
    lut = ctx.const_value(args[3], node, "the truth table of kaio.lop3()")
    if not isinstance(lut, int) or isinstance(lut, bool) or not 0 <= lut <= 0xFF:
        ctx.error(
            f"kaio.lop3(a, b, c, lut) needs lut a compile-time int 0..255, got {lut!r} (write "
            "the function of a = 0xF0, b = 0xCC, c = 0xAA, e.g. (0xF0 & 0xCC) ^ 0xAA)",
            node,
        )
    vals = tuple(_u32_operand(ctx, "lop3", arg, node) for arg in args[:3])
    return ctx.b.emit("lop3", T.u32, vals, lut=lut)


def _brev(ctx, args, node):
    v = ctx.value(args[0], node, T.u32)
    if not v.type.is_int or v.type.bits < 32:
        ctx.error(
            f"kaio.brev() takes a 32- or 64-bit integer, got {v.type} (widen a narrower "
            "integer first, kaio.u32(x), and shift the result right by 32 - its width)",
            node,
        )
    return ctx.b.emit("brev", v.type, (v,))


def _u32_operand(ctx, name: str, arg, node):
    """``arg`` as a u32 operand of the bit builtin ``name`` (32-bit integers only)."""
    v = ctx.value(arg, node, T.u32)
    if not v.type.is_int or v.type.bits > 32:
        ctx.error(
            f"kaio.{name}() takes 32-bit integers, got {v.type} (kaio.bitcast(x, kaio.u32) "
            "reads other values as u32)",
            node,
        )
    return ctx.convert(v, T.u32)


for _name, _op, _what in (
    ("low", "unpack_lo", "element 0 (the low"),
    ("high", "unpack_hi", "element 1 (the high"),
):
    _define(_name, f"{_name}(p): {_what} 16 bits) of an f16x2/bf16x2 pair.", _unpack(_op, _name))
_define(
    "brev",
    "brev(x): the bits of x, a 32- or 64-bit integer, in reverse order (brev.b32/b64): bit i "
    "of the result is bit width - 1 - i of x; the result has x's type.",
    _brev,
)
_define(
    "prmt",
    "prmt(a, b, selector): u32 byte permute (prmt.b32): byte i is byte (selector nibble i) & 7 "
    "of {b, a} (a = bytes 0-3), or its sign replicated when the nibble's bit 3 is set.",
    _prmt,
)
_define(
    "lop3",
    "lop3(a, b, c, lut): any bitwise function of three u32 in one instruction (lop3.b32); lut "
    "is the function applied to a = 0xF0, b = 0xCC, c = 0xAA, a compile-time int: "
    "(a & b) ^ c is lop3(a, b, c, (0xF0 & 0xCC) ^ 0xAA).",
    _lop3,
)


# ---------------------------------------------------------------- Hopper (sm_90 / sm_90a)
# wgmma, smem descriptors, mbarriers, TMA, fence.proxy.async, setmaxnreg: they register
# themselves in BUILTINS through _define (their typing rules are in kaio/lang_hopper.py).
# The 8-bit floats' builtins (mma_e4m3, mma_e5m2) and conversions are in kaio/lang_fp8.py.
from kaio import lang_fp8 as _lang_fp8  # noqa: E402, F401
from kaio import lang_hopper as _lang_hopper  # noqa: E402, F401
