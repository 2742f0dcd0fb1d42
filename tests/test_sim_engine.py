"""The CPU simulator on hand-built IR: op semantics against independent references, masks and
control flow, warps, atomics, and the errors it reports."""

from __future__ import annotations

import math
import threading
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio.errors import LaunchError, SimulationError
from kaio.ir.nodes import Break, Const, Continue, If, Loop, Region, Return, fresh_id
from kaio.sim import mode
from kaio.types import (
    SCALAR_TYPES,
    bf16,
    bool_,
    f16,
    f32,
    f64,
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
)
from tests.sim_ir import KernelIR, here, poisoned

RNG = np.random.default_rng(20240611)
INTS = [i8, u8, i16, u16, i32, u32, i64, u64]
FLOATS = [f16, bf16, f32, f64]
# (significand bits with the implicit one, minimum normal exponent, maximum exponent)
FORMATS = {
    "f16": (11, -14, 15),
    "bf16": (8, -126, 127),
    "f32": (24, -126, 127),
    "f64": (53, -1022, 1023),
}


# ------------------------------------------------------------------------ references
def round_fraction(x: Fraction, t) -> float:
    """Round an exact rational to nearest even in float type ``t`` (independent of NumPy)."""
    p, emin, emax = FORMATS[t.name]
    if x == 0:
        return 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    e = max(e, emin)
    q = x / Fraction(2) ** (e - p + 1)
    n = q.numerator // q.denominator
    r = q - n
    if r > Fraction(1, 2) or (r == Fraction(1, 2) and n % 2):
        n += 1
    result = n * Fraction(2) ** (e - p + 1)
    if result >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(result)


def wrap(v: int, t) -> int:
    v &= (1 << t.bits) - 1
    return v - (1 << t.bits) if t.kind == "int" and v >= 1 << (t.bits - 1) else v


def int_values(t, n):
    lo, hi = (-(2 ** (t.bits - 1)), 2 ** (t.bits - 1)) if t.kind == "int" else (0, 2**t.bits)
    edges = [lo, lo + 1, -1 if t.kind == "int" else 1, 0, 1, hi - 1, hi - 2, 7]
    rand = [
        int(x)
        for x in RNG.integers(
            lo, hi, n - len(edges), dtype=np.int64 if t.bits < 64 or t.kind == "int" else np.uint64
        )
    ]
    return np.array(edges + rand, dtype=t.np_dtype)


def float_values(t, n):
    special = [0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 3.0e-5, 65504.0, 1e-8]
    vals = RNG.standard_normal(n - len(special)) * np.exp2(RNG.integers(-12, 12, n - len(special)))
    return np.concatenate([special, vals]).astype(t.np_dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality, any NaN matching any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" or a.dtype == ml_dtypes.bfloat16:
        fa, fb = a.astype(np.float64), b.astype(np.float64)
        nan = np.isnan(fa) & np.isnan(fb)
        ua = a.view(f"u{a.itemsize}")
        ub = b.view(f"u{b.itemsize}")
        return bool(np.all(nan | (ua == ub)))
    return np.array_equal(a, b)


def run_op(op, dst_t, *operands, attrs=None, block=64):
    """``out[i] = op(operands[0][i], ...)`` on the simulator; operands are (array, type)."""
    k = KernelIR()
    arrays = [k.global_array(f"a{j}", t) for j, (_, t) in enumerate(operands)]
    out = k.global_array("out", dst_t)
    n = k.scalar("n", u32)
    i = k.global_id()
    with k.b.block() as then:
        vals = [k.load(a, i) for a in arrays]
        k.store(out, i, k.op(op, dst_t, *vals, **(attrs or {})))
    k.b.append(If(k.op("lt", bool_, i, n), then, []))
    size = len(operands[0][0])
    result = poisoned(size, dst_t.np_dtype)
    data = {f"a{j}": np.ascontiguousarray(v) for j, (v, _) in enumerate(operands)}
    k.run(-(-size // block), block, {**data, "out": result}, {"n": size})
    return result


# ------------------------------------------------------------------------ integer ops
INT_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "min": min,
    "max": max,
}


@pytest.mark.parametrize("t", INTS, ids=str)
@pytest.mark.parametrize("op", list(INT_BINARY) + ["floordiv", "mod"])
def test_integer_binary_ops_wrap(t, op):
    a, b = int_values(t, 300), int_values(t, 300)[::-1].copy()
    if op in ("floordiv", "mod"):
        b[b == 0] = 3
    got = run_op(op, t, (a, t), (b, t))
    py = {"floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y}.get(op) or INT_BINARY[op]
    ref = np.array([wrap(py(int(x), int(y)), t) for x, y in zip(a, b, strict=True)], t.np_dtype)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("t", INTS, ids=str)
def test_integer_unary_ops_and_compares(t):
    a = int_values(t, 200)
    b = RNG.permutation(a)
    assert np.array_equal(run_op("neg", t, (a, t)), [wrap(-int(x), t) for x in a])
    assert np.array_equal(run_op("invert", t, (a, t)), [wrap(~int(x), t) for x in a])
    assert np.array_equal(run_op("abs", t, (a, t)), [wrap(abs(int(x)), t) for x in a])
    for op, fn in [
        ("lt", "__lt__"),
        ("le", "__le__"),
        ("gt", "__gt__"),
        ("ge", "__ge__"),
        ("eq", "__eq__"),
        ("ne", "__ne__"),
    ]:
        ref = [getattr(int(x), fn)(int(y)) for x, y in zip(a, b, strict=True)]
        assert np.array_equal(run_op(op, bool_, (a, t), (b, t)), ref)


@pytest.mark.parametrize("t", INTS, ids=str)
def test_shifts_are_clamped(t):
    a = int_values(t, 150)
    amount = RNG.integers(0, t.bits + 8, 150).astype(np.uint32)
    amount[:3] = [0, 2**32 - 1, t.bits]
    shl = [wrap(int(x) << int(s), t) if s < t.bits else 0 for x, s in zip(a, amount, strict=True)]
    if t.kind == "int":
        shr = [int(x) >> min(int(s), t.bits - 1) for x, s in zip(a, amount, strict=True)]
    else:
        shr = [int(x) >> int(s) if s < t.bits else 0 for x, s in zip(a, amount, strict=True)]
    assert np.array_equal(run_op("shl", t, (a, t), (amount, u32)), np.array(shl, t.np_dtype))
    assert np.array_equal(run_op("shr", t, (a, t), (amount, u32)), np.array(shr, t.np_dtype))


# ------------------------------------------------------------------------ float ops
def exact(x) -> Fraction:
    return Fraction(float(x))


FLOAT_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("t", FLOATS, ids=str)
@pytest.mark.parametrize("op", list(FLOAT_BINARY))
def test_float_arithmetic_rounds_once(t, op):
    a, b = float_values(t, 400), RNG.permutation(float_values(t, 400))
    got = run_op(op, t, (a, t), (b, t))
    with np.errstate(all="ignore"):
        naive = FLOAT_BINARY[op](a.astype(np.float64), b.astype(np.float64))
    for x, y, g, nv in zip(a, b, got, naive, strict=True):
        if not (np.isfinite(float(x)) and np.isfinite(float(y))) or (op == "div" and y == 0):
            assert same_bits(np.array([g]), np.array([nv]).astype(t.np_dtype)), (x, y)
            continue
        ref = round_fraction(FLOAT_BINARY[op](exact(x), exact(y)), t)
        assert float(g) == ref, (op, x, y, float(g), ref)


@pytest.mark.parametrize("t", FLOATS, ids=str)
def test_float_min_max_ignore_nan_and_ne_is_true_on_nan(t):
    a = np.array([1.0, np.nan, np.nan, -2.0, 0.5], t.np_dtype)
    b = np.array([np.nan, 3.0, np.nan, -1.0, 0.25], t.np_dtype)
    assert same_bits(
        run_op("min", t, (a, t), (b, t)), np.array([1, 3, np.nan, -2, 0.25], t.np_dtype)
    )
    assert same_bits(
        run_op("max", t, (a, t), (b, t)), np.array([1, 3, np.nan, -1, 0.5], t.np_dtype)
    )
    assert run_op("ne", bool_, (a, t), (b, t)).tolist() == [True, True, True, True, True]
    assert run_op("eq", bool_, (a, t), (a, t)).tolist() == [True, False, False, True, True]


def _fma_cases(t, n):
    """Products with c chosen to land on or next to rounding midpoints of the sum."""
    p = FORMATS[t.name][0]
    a = (1 + RNG.integers(0, 2 ** (p // 2), n) * 2.0 ** -(p // 2)).astype(t.np_dtype)
    b = (1 + RNG.integers(0, 2 ** (p // 2), n) * 2.0 ** -(p // 2)).astype(t.np_dtype)
    scale = RNG.choice([2.0**-p, 2.0 ** -(p + 1), 2.0 ** -(2 * p), 2.0 ** -(p + 30), 1.0], n)
    c = (RNG.integers(-64, 64, n) * scale).astype(t.np_dtype)
    return a, b, c


@pytest.mark.parametrize("t", [f32, f64], ids=str)
def test_fma_is_correctly_rounded(t):
    a, b, c = _fma_cases(t, 3000)
    got = run_op("fma", t, (a, t), (b, t), (c, t))
    ref = [
        round_fraction(exact(x) * exact(y) + exact(z), t) for x, y, z in zip(a, b, c, strict=True)
    ]
    assert np.array_equal(got, np.array(ref, t.np_dtype))
    naive = (a.astype(np.float64) * b + c).astype(t.np_dtype) if t is f32 else a * b + c
    assert not np.array_equal(naive, got), "the cases should include double-rounding traps"


def test_fma_f64_extreme_exponents():
    a = np.array([1e300, 1e-300, 3.0, 2.0**-1070, 1e308], np.float64)
    b = np.array([1e10, 1e-20, 1e308, 2.0**60, 10.0], np.float64)
    c = np.array([-1e310 if False else -1e308, 1e-320, -np.inf, 2.0**-1074, -1e309], np.float64)
    got = run_op("fma", f64, (a, f64), (b, f64), (c, f64))
    for x, y, z, g in zip(a, b, c, got, strict=True):
        if np.isinf(z):
            assert g == z
        else:
            assert float(g) == round_fraction(exact(x) * exact(y) + exact(z), f64)


@pytest.mark.parametrize("t", [f32, f64], ids=str)
def test_exact_unary_float_ops(t):
    a = float_values(t, 300)
    with np.errstate(all="ignore"):
        for op, fn in [("floor", math.floor), ("ceil", math.ceil), ("trunc", math.trunc)]:
            ref = [float(fn(x)) if np.isfinite(x) else x for x in a.astype(np.float64)]
            assert same_bits(run_op(op, t, (a, t)), np.copysign(np.array(ref, t.np_dtype), a))
        rint = [float(round(x)) if np.isfinite(x) else x for x in a.astype(np.float64)]
        assert same_bits(run_op("rint", t, (a, t)), np.copysign(np.array(rint, t.np_dtype), a))
        sq = [math.sqrt(x) if x >= 0 else math.nan for x in np.abs(a[::2]).astype(np.float64)]
        assert same_bits(run_op("sqrt", t, (np.abs(a[::2]), t)), np.array(sq).astype(t.np_dtype))


@pytest.mark.parametrize(
    "op,fn,lo,hi,rtol,atol",  # the GPU's documented errors (the simulator is the GPU's bits)
    [
        ("exp2", lambda x: 2.0**x, -20, 20, 2**-22, 0),
        ("log2", math.log2, 1e-3, 1e3, 2**-22, 2**-22),
        ("rsqrt", lambda x: 1 / math.sqrt(x), 1e-3, 1e3, 2**-22.9, 0),
        ("rcp_approx", lambda x: 1 / x, 0.5, 100, 2**-23, 0),
        ("exp2_ftz", lambda x: 2.0**x, -20, 20, 2**-22, 0),
        ("rcp_ftz", lambda x: 1 / x, 0.5, 100, 2**-23, 0),
        ("sin", math.sin, -10, 10, 0, 2**-19),  # the argument in turns, 25 fraction bits
        ("cos", math.cos, -10, 10, 0, 2**-19),
        ("tanh", math.tanh, -5, 5, 2e-7, 1e-7),  # correctly rounded in the simulator
    ],
)
def test_approximate_math_is_close(op, fn, lo, hi, rtol, atol):
    a = RNG.uniform(lo, hi, 500).astype(np.float32)
    got = run_op(op, f32, (a, f32))
    ref = np.array([fn(float(x)) for x in a])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def test_ftz_math_flushes_subnormals():
    tiny = np.float32(1e-39)  # subnormal in f32
    a = np.array([-130.0, tiny, -tiny, 3.0], np.float32)
    np.testing.assert_array_equal(run_op("exp2_ftz", f32, (a, f32)), [0.0, 1.0, 1.0, 8.0])
    np.testing.assert_array_equal(run_op("exp2", f32, (a[:1], f32)), [np.float32(2.0**-130)])
    r = run_op("rcp_ftz", f32, (np.array([tiny, -tiny, 2.0**127, 4.0], np.float32), f32))
    np.testing.assert_array_equal(r, [np.inf, -np.inf, 0.0, 0.25])


# ------------------------------------------------------------------------ conversions
def ref_cvt(x, src, dst):
    if dst.is_bool:
        return bool(x != 0)
    if src.is_float:
        xf = float(x)
        if dst.is_float:
            return xf if not np.isfinite(xf) or xf == 0 else round_fraction(Fraction(xf), dst)
        if math.isnan(xf):
            return 0
        lo, hi = (
            (-(2 ** (dst.bits - 1)), 2 ** (dst.bits - 1) - 1)
            if dst.kind == "int"
            else (0, 2**dst.bits - 1)
        )
        return hi if xf >= hi else lo if xf <= lo else math.trunc(xf)
    xi = int(x)
    if dst.is_float:
        return round_fraction(Fraction(xi), dst)
    return wrap(xi, dst)


def convert_sources(t):
    if t.is_bool:
        return np.array([True, False, True], bool)
    if t.is_int:
        vals = int_values(t, 120)
        if t.bits == 64:  # values next to float rounding midpoints
            base = 2**62 if t.kind == "int" else 2**63
            extra = [base + 2**38 + 1, base + 2**38, base + 2**39 + 2**38, base + 2**54 + 2**20 + 1]
            vals = np.concatenate([vals, np.array(extra, t.np_dtype)])
        return vals
    extra = [
        1 + 2.0**-8 + 2.0**-30,
        2.5,
        -2.5,
        3.0e9,
        -3.0e9,
        1e20,
        -1e20,
        300.7,
        -129.5,
        0.5,
        -0.99,
    ]
    with np.errstate(over="ignore"):
        return np.concatenate([float_values(t, 120), np.array(extra).astype(t.np_dtype)])


@pytest.mark.parametrize("src", list(SCALAR_TYPES.values()), ids=str)
def test_cvt_from_every_type_to_every_type(src):
    a = convert_sources(src)
    for dst in SCALAR_TYPES.values():
        got = run_op("cvt", dst, (a, src))
        ref = np.array([ref_cvt(x, src, dst) for x in a], dtype=object)
        if dst.is_float:
            assert same_bits(got, np.array(ref.tolist(), np.float64).astype(dst.np_dtype)), (
                src,
                dst,
            )
        else:
            assert got.tolist() == ref.tolist(), (src, dst)


def test_cvt_narrowing_does_not_double_round():
    x = np.array([1 + 2.0**-8 + 2.0**-30], np.float64)
    assert float(run_op("cvt", bf16, (x, f64))[0]) == 1 + 2.0**-7
    big = np.array([2**31 + 2**23 + 1], np.int64)
    assert float(run_op("cvt", bf16, (big, i64))[0]) == 2**31 + 2**24


def _bits_of(x, t) -> int:
    """The bit pattern of one value (floats read as unsigned integers of their width: a
    signalling NaN keeps its bits, which a round trip through a Python float would quiet)."""
    if t.is_float:
        return int(np.asarray(x, t.np_dtype).view(f"u{t.itemsize}"))
    return int(x) & ((1 << t.bits) - 1)


@pytest.mark.parametrize(
    "src,dst", [(f32, u32), (u32, f32), (f64, i64), (f16, u16), (bf16, i16), (i8, u8)]
)
def test_bitcast_reinterprets_bits(src, dst):
    a = convert_sources(src)
    got = run_op("bitcast", dst, (a, src))
    assert [_bits_of(g, dst) for g in got] == [_bits_of(x, src) for x in a]


def test_select_and_logic():
    c = RNG.integers(0, 2, 100).astype(bool)
    a, b = RNG.standard_normal(100).astype(np.float32), RNG.standard_normal(100).astype(np.float32)
    assert np.array_equal(run_op("select", f32, (c, bool_), (a, f32), (b, f32)), np.where(c, a, b))
    d = RNG.integers(0, 2, 100).astype(bool)
    assert np.array_equal(run_op("not", bool_, (c, bool_)), ~c)
    assert np.array_equal(run_op("xor", bool_, (c, bool_), (d, bool_)), c ^ d)
    assert np.array_equal(run_op("mov", f32, (a, f32)), a)


# ------------------------------------------------------------------------ control flow
def test_nested_if_divergence():
    k = KernelIR()
    out = k.global_array("out", i32)
    t = k.op("cvt", i32, k.sreg("tid.x"))
    m3 = k.op("mod", i32, t, Const(3, i32))
    res = k.b.var(i32, "r")
    with k.b.block() as inner_then:
        k.b.assign(res, Const(10, i32))
    with k.b.block() as inner_else:
        k.b.assign(res, k.op("mul", i32, t, Const(2, i32)))
    with k.b.block() as then:
        k.b.append(If(k.op("lt", bool_, t, Const(20, i32)), inner_then, inner_else))
    with k.b.block() as orelse:
        k.b.assign(res, k.op("neg", i32, t))
    k.b.append(If(k.op("eq", bool_, m3, Const(0, i32)), then, orelse))
    k.store(out, t, res)
    o = poisoned(50, np.int32)
    k.run(1, 50, {"out": o})
    tid = np.arange(50)
    assert np.array_equal(o, np.where(tid % 3 == 0, np.where(tid < 20, 10, 2 * tid), -tid))


def _loop_kernel():
    """acc = 0; k = 0; while True: if k >= tid: break; k += 1; if k % 3 == 0: continue;
    acc += k; if acc > 40: break  -> out[tid] = acc * 100 + k"""
    k = KernelIR()
    out = k.global_array("out", i32)
    t = k.op("cvt", i32, k.sreg("tid.x"))
    acc, kk = k.b.var(i32, "acc"), k.b.var(i32, "k")
    k.b.assign(acc, Const(0, i32))
    k.b.assign(kk, Const(0, i32))
    lid = fresh_id()
    with k.b.block() as body:
        k.b.append(If(k.op("ge", bool_, kk, t), [Break(lid)], []))
        k.b.assign(kk, k.op("add", i32, kk, Const(1, i32)))
        k.b.append(
            If(
                k.op("eq", bool_, k.op("mod", i32, kk, Const(3, i32)), Const(0, i32)),
                [Continue(lid)],
                [],
            )
        )
        k.b.assign(acc, k.op("add", i32, acc, kk))
        k.b.append(If(k.op("gt", bool_, acc, Const(40, i32)), [Break(lid)], []))
    k.b.append(Loop(lid, body, []))
    k.store(out, t, k.op("add", i32, k.op("mul", i32, acc, Const(100, i32)), kk))
    return k


def _loop_reference(tid):
    acc = kk = 0
    while True:
        if kk >= tid:
            break
        kk += 1
        if kk % 3 == 0:
            continue
        acc += kk
        if acc > 40:
            break
    return acc * 100 + kk


def test_loop_with_per_thread_trip_counts_break_continue():
    k = _loop_kernel()
    o = poisoned(64, np.int32)
    k.run(1, 64, {"out": o})
    assert o.tolist() == [_loop_reference(t) for t in range(64)]


def test_early_return_and_region_break():
    k = KernelIR()
    out = k.global_array("out", i32)
    t = k.op("cvt", i32, k.sreg("tid.x"))
    k.b.append(
        If(k.op("eq", bool_, k.op("mod", i32, t, Const(4, i32)), Const(1, i32)), [Return()], [])
    )
    rid = fresh_id()
    val = k.b.var(i32, "v")
    k.b.assign(val, Const(7, i32))
    with k.b.block() as region:
        k.b.append(If(k.op("lt", bool_, t, Const(10, i32)), [Break(rid)], []))
        k.b.assign(val, t)
    k.b.append(Region(rid, region))
    k.store(out, t, val)
    o = np.full(32, -99, np.int32)
    k.run(1, 32, {"out": o})
    tid = np.arange(32)
    assert np.array_equal(o, np.where(tid % 4 == 1, -99, np.where(tid < 10, 7, tid)))


def test_three_d_geometry_and_lane_ids():
    k = KernelIR()
    out = k.global_array("out", u32, 2)
    names = [
        "tid.x",
        "tid.y",
        "tid.z",
        "ctaid.x",
        "ctaid.y",
        "ctaid.z",
        "ntid.y",
        "nctaid.z",
        "laneid",
    ]
    tx, ty, tz = k.sreg("tid.x"), k.sreg("tid.y"), k.sreg("tid.z")
    bx, by, bz = k.sreg("ctaid.x"), k.sreg("ctaid.y"), k.sreg("ctaid.z")
    lin_t = k.op(
        "add",
        u32,
        tx,
        k.op("mul", u32, Const(5, u32), k.op("add", u32, ty, k.op("mul", u32, tz, Const(3, u32)))),
    )
    lin_b = k.op(
        "add",
        u32,
        bx,
        k.op("mul", u32, Const(2, u32), k.op("add", u32, by, k.op("mul", u32, bz, Const(1, u32)))),
    )
    row = k.op("add", u32, k.op("mul", u32, lin_b, Const(30, u32)), lin_t)
    for j, name in enumerate(names):
        k.store(out, row, Const(j, u32), k.sreg(name))
    o = poisoned((4 * 30, len(names)), np.uint32)
    k.run((2, 1, 2), (5, 3, 2), {"out": o}, batch_lanes=64)
    for b in range(4):
        bxv, bzv = b % 2, b // 2
        for t in range(30):
            x, y, z = t % 5, t // 5 % 3, t // 15
            assert o[b * 30 + t].tolist() == [x, y, z, bxv, 0, bzv, 3, 2, t % 32]


# ------------------------------------------------------------------------ memory
def test_shared_memory_tree_reduction_many_blocks_and_batches():
    block = 128
    k = KernelIR()
    x = k.global_array("x", i64)
    out = k.global_array("out", i64)
    s = k.shared("s", i64, (block,))
    t = k.sreg("tid.x")
    k.store(s, t, k.load(x, k.global_id()))
    k.op("sync_threads", None)
    stride = k.b.var(u32, "stride")
    k.b.assign(stride, Const(block // 2, u32))
    lid = fresh_id()
    with k.b.block() as body:
        k.b.append(If(k.op("eq", bool_, stride, Const(0, u32)), [Break(lid)], []))
        with k.b.block() as add_half:
            other = k.op("add", u32, t, stride)
            k.store(s, t, k.op("add", i64, k.load(s, t), k.load(s, other)))
        k.b.append(If(k.op("lt", bool_, t, stride), add_half, []))
        k.op("sync_threads", None)
    with k.b.block() as step:
        k.b.assign(stride, k.op("shr", u32, stride, Const(1, u32)))
    k.b.append(Loop(lid, body, step))
    with k.b.block() as first:
        k.store(out, k.sreg("ctaid.x"), k.load(s, Const(0, u32)))
    k.b.append(If(k.op("eq", bool_, t, Const(0, u32)), first, []))
    data = RNG.integers(-(2**40), 2**40, 37 * block)
    o = poisoned(37, np.int64)
    k.run(37, block, {"x": data, "out": o}, batch_lanes=512)
    assert np.array_equal(o, data.reshape(37, block).sum(axis=1))


def test_dynamic_shared_memory_and_its_size_register():
    k = KernelIR()
    out = k.global_array("out", u32)
    dyn = k.shared("dyn", u32, None, space="shared_dyn")
    t = k.sreg("tid.x")
    k.store(dyn, t, k.op("mul", u32, t, k.sreg("dynamic_smem_size")))
    k.op("sync_threads", None)
    k.store(out, t, k.load(dyn, k.op("sub", u32, Const(15, u32), t)))
    o = poisoned(16, np.uint32)
    k.run(1, 16, {"out": o}, dynamic_shared_bytes=64)
    assert o.tolist() == [(15 - t) * 64 for t in range(16)]
    with pytest.raises(SimulationError, match="out-of-bounds store of shared_dyn array 'dyn'"):
        k.run(1, 16, {"out": o}, dynamic_shared_bytes=32)


def test_strided_views_are_read_and_written_in_place():
    k = KernelIR()
    x = k.global_array("x", f32, 2)
    out = k.global_array("out", f32, 2)
    i, j = k.sreg("tid.y"), k.sreg("tid.x")
    k.store(out, i, j, k.op("add", f32, k.load(x, j, i), Const(1.0, f32)))
    base = RNG.standard_normal((8, 12)).astype(np.float32)
    target = np.zeros((6, 20), np.float32)
    view = target[::2, 1::3][:, :4]  # a (3, 4) non-contiguous view
    k.run(1, (4, 3), {"x": base[2:6:1, 1:10:3], "out": view})
    assert np.array_equal(target[::2, 1::3][:, :4], base[2:6, 1:10:3].T + 1)
    assert np.count_nonzero(target) == 12


def test_local_arrays_are_per_thread():
    k = KernelIR()
    out = k.global_array("out", i32)
    loc = k.shared("loc", i32, (4,), space="local")
    t = k.op("cvt", i32, k.sreg("tid.x"))
    for j in range(4):
        k.store(loc, Const(j, i32), k.op("mul", i32, t, Const(j + 1, i32)))
    k.store(out, t, k.load(loc, k.op("mod", i32, t, Const(4, i32))))
    o = poisoned(40, np.int32)
    k.run(1, 40, {"out": o})
    assert o.tolist() == [t * (t % 4 + 1) for t in range(40)]


def _oob_kernel(index_type, offset):
    k = KernelIR()
    x = k.global_array("x", f32)
    out = k.global_array("out", f32)
    i = k.op("add", index_type, k.op("cvt", index_type, k.global_id()), Const(offset, index_type))
    k.b.loc = loc = here()
    v = k.load(x, i)
    k.b.loc = None
    k.store(out, k.global_id(), v)
    return k, loc


def test_out_of_bounds_load_names_array_index_thread_block_and_line():
    k, loc = _oob_kernel(i32, 3)
    with pytest.raises(SimulationError) as e:
        k.run(2, 32, {"x": np.zeros(64, np.float32), "out": np.zeros(64, np.float32)})
    msg = str(e.value)
    assert f"{loc.filename}:{loc.lineno}" in msg
    assert "'x'" in msg and "[64]" in msg and "shape (64,)" in msg
    assert "thread (29, 0, 0) of block (1, 0, 0)" in msg
    assert "k.b.loc = loc = here()" in msg  # the source text of the line


@pytest.mark.parametrize("t,offset,shown", [(i32, -1, "-1"), (u64, 2**64 - 1, str(2**64 - 1))])
def test_out_of_bounds_negative_and_huge_indices(t, offset, shown):
    k, _ = _oob_kernel(t, offset)
    with pytest.raises(
        SimulationError, match=rf"index \[{shown}\] by thread \(0, 0, 0\) of block \(0, 0, 0\)"
    ):
        k.run(1, 8, {"x": np.zeros(8, np.float32), "out": np.zeros(8, np.float32)})


def test_inactive_lanes_do_not_touch_memory():
    k = KernelIR()
    x = k.global_array("x", f32)
    i = k.global_id()
    with k.b.block() as then:
        k.store(x, i, Const(1.0, f32))  # would be out of bounds for the inactive lanes
    k.b.append(If(k.op("lt", bool_, i, Const(10, u32)), then, []))
    data = np.zeros(10, np.float32)
    k.run(1, 64, {"x": data})
    assert data.tolist() == [1.0] * 10


# ------------------------------------------------------------------------ warps
def _warp_ref(values, lane_param, mode_name, block):
    out = values.copy()
    for w0 in range(0, block, 32):
        size = min(32, block - w0)
        for lane in range(size):
            b = int(lane_param[w0 + lane])
            j = {"bfly": lane ^ b, "down": lane + b, "up": lane - b, "idx": b & 31}[mode_name]
            if 0 <= j < size:
                out[w0 + lane] = values[w0 + j]
    return out


@pytest.mark.parametrize("mode_name", ["bfly", "down", "up", "idx"])
@pytest.mark.parametrize("block", [64, 48])
def test_shuffles(mode_name, block):
    k = KernelIR()
    x = k.global_array("x", f64)
    lanes = k.global_array("lanes", u32)
    out = k.global_array("out", f64)
    t = k.sreg("tid.x")
    k.store(out, t, k.op("shfl", f64, k.load(x, t), k.load(lanes, t), mode=mode_name))
    x_data = RNG.standard_normal(block)
    lane_data = RNG.integers(0, 40, block).astype(np.uint32)
    lane_data[:2] = [2**32 - 1, 31]
    o = poisoned(block, np.float64)
    k.run(1, block, {"x": x_data, "lanes": lane_data, "out": o})
    assert np.array_equal(o, _warp_ref(x_data, lane_data, mode_name, block))


@pytest.mark.parametrize("block", [96, 40])
def test_votes_and_ballot(block):
    k = KernelIR()
    p = k.global_array("p", bool_)
    out_any, out_all = k.global_array("any", bool_), k.global_array("all", bool_)
    out_ballot = k.global_array("ballot", u32)
    t = k.sreg("tid.x")
    v = k.load(p, t)
    k.store(out_any, t, k.op("vote_any", bool_, v))
    k.store(out_all, t, k.op("vote_all", bool_, v))
    k.store(out_ballot, t, k.op("ballot", u32, v))
    pred = RNG.random(block) < 0.5
    pred[:32] = True  # one warp all true
    pred[32:64] = False if block > 64 else pred[32:64]
    res = {
        "any": poisoned(block, bool),
        "all": poisoned(block, bool),
        "ballot": poisoned(block, np.uint32),
    }
    k.run(1, block, {"p": pred, **res})
    for w0 in range(0, block, 32):
        seg = pred[w0 : w0 + 32]
        bits = sum(1 << j for j, q in enumerate(seg) if q)
        assert res["any"][w0 : w0 + 32].tolist() == [bool(seg.any())] * len(seg)
        assert res["all"][w0 : w0 + 32].tolist() == [bool(seg.all())] * len(seg)
        assert res["ballot"][w0 : w0 + 32].tolist() == [bits] * len(seg)


def _divergent(op_builder):
    k = KernelIR()
    out = k.global_array("out", u32)
    t = k.sreg("tid.x")
    with k.b.block() as then:
        k.b.loc = loc = here()
        v = op_builder(k, t)
        k.b.loc = None
        if v is not None:
            k.store(out, t, v)
    k.b.append(If(k.op("lt", bool_, t, Const(5, u32)), then, []))
    return k, loc


@pytest.mark.parametrize(
    "builder,what",
    [
        (lambda k, t: k.op("shfl", u32, t, Const(1, u32), mode="down"), "warp shuffle"),
        (lambda k, t: k.op("ballot", u32, k.op("lt", bool_, t, Const(3, u32))), "ballot"),
        (lambda k, t: k.op("sync_threads", None), "sync_threads"),
        (lambda k, t: k.op("sync_warp", None), "sync_warp"),
    ],
)
def test_divergent_warp_ops_and_barriers_are_errors(builder, what):
    k, loc = _divergent(builder)
    with pytest.raises(SimulationError, match=what) as e:
        k.run(1, 32, {"out": np.zeros(32, np.uint32)})
    assert f":{loc.lineno}" in str(e.value) and "divergent" in str(e.value)
    assert "threads (0, 0, 0), (1, 0, 0)" in str(e.value) and "(5, 0, 0)" in str(e.value)


def test_barrier_after_early_return_is_fine():
    k = KernelIR()
    out = k.global_array("out", u32)
    t = k.sreg("tid.x")
    k.b.append(If(k.op("ge", bool_, t, Const(20, u32)), [Return()], []))
    k.op("sync_threads", None)
    k.store(out, t, t)
    o = np.zeros(32, np.uint32)
    k.run(1, 32, {"out": o})
    assert o.tolist() == list(range(20)) + [0] * 12


def test_barrier_in_a_loop_with_block_dependent_trip_counts():
    # each block loops ctaid.x times with a barrier inside: uniform per block, not per batch
    k = KernelIR()
    out = k.global_array("out", u32)
    count = k.b.var(u32, "count")
    k.b.assign(count, Const(0, u32))
    lid = fresh_id()
    with k.b.block() as body:
        k.b.append(If(k.op("ge", bool_, count, k.sreg("ctaid.x")), [Break(lid)], []))
        k.op("sync_threads", None)
        k.b.assign(count, k.op("add", u32, count, Const(1, u32)))
    k.b.append(Loop(lid, body, []))
    k.store(out, k.global_id(), count)
    o = poisoned(4 * 32, np.uint32)
    k.run(4, 32, {"out": o})
    assert o.tolist() == [b for b in range(4) for _ in range(32)]


# ------------------------------------------------------------------------ atomics
@pytest.mark.parametrize("t", [i32, u64, i8])
def test_atomic_add_returns_old_values_in_lane_order(t):
    k = KernelIR()
    counters = k.global_array("c", t)
    idx = k.global_array("idx", u32)
    vals = k.global_array("v", t)
    old = k.global_array("old", t)
    i = k.global_id()
    k.store(old, i, k.op("atomic", t, counters, k.load(idx, i), k.load(vals, i), kind="add"))
    n = 4 * 64
    idx_data = RNG.integers(0, 5, n).astype(np.uint32)
    v_data = int_values(t, n)
    c = int_values(t, 20)[-5:]
    old_out = poisoned(n, t.np_dtype)
    expect_c = [int(x) for x in c]
    expect_old = []
    for j, v in zip(idx_data, v_data, strict=True):
        expect_old.append(expect_c[j])
        expect_c[j] = wrap(expect_c[j] + int(v), t)
    k.run(4, 64, {"c": c, "idx": idx_data, "v": v_data, "old": old_out}, batch_lanes=128)
    assert old_out.tolist() == expect_old and c.tolist() == expect_c


def _ref_combine(kind, t, old, v1, v2):
    if kind == "add":
        return np.float32(old) + np.float32(v1) if t.is_float else old + v1
    if kind == "cas":
        return v2 if old == v1 else old
    return {"max": max, "min": min, "exch": lambda o, v: v}[kind](old, v1)


@pytest.mark.parametrize("kind", ["add", "max", "min", "exch", "cas"])
@pytest.mark.parametrize("t", [f32, f16, i64])
@pytest.mark.parametrize("targets", [1, 3, 200])
def test_atomics_are_sequential_in_lane_order(kind, t, targets):
    k = KernelIR()
    arr = k.global_array("a", t)
    idx = k.global_array("idx", u32)
    v1, v2 = k.global_array("v1", t), k.global_array("v2", t)
    old = k.global_array("old", t)
    i = k.global_id()
    operands = [k.load(v1, i)] + ([k.load(v2, i)] if kind == "cas" else [])
    k.store(old, i, k.op("atomic", t, arr, k.load(idx, i), *operands, kind=kind))
    n = 3 * 100
    idx_data = RNG.integers(0, targets, n).astype(np.uint32)
    small = RNG.integers(-4, 4, (3, n))
    d1 = (small[0] * 1.25).astype(t.np_dtype) if t.is_float else small[0].astype(t.np_dtype)
    d2 = small[1].astype(t.np_dtype)
    a = (
        small[2][:targets].astype(t.np_dtype)
        if t.is_int
        else (RNG.standard_normal(targets) * 1e3).astype(t.np_dtype)
    )
    if kind == "cas":
        d1 = (
            a[idx_data]
            if t.is_int
            else np.where(RNG.random(n) < 0.5, a[idx_data], d1).astype(t.np_dtype)
        )
    ref_a, ref_old = a.copy(), np.empty(n, t.np_dtype)
    for j in range(n):
        o = ref_a[idx_data[j]]
        ref_old[j] = o
        new = _ref_combine(kind, t, o, d1[j], d2[j])
        ref_a[idx_data[j]] = t.np_dtype.type(new)
    old_out = poisoned(n, t.np_dtype)
    k.run(3, 100, {"a": a, "idx": idx_data, "v1": d1, "v2": d2, "old": old_out}, batch_lanes=100)
    assert same_bits(old_out, ref_old) and same_bits(a, ref_a)


def test_shared_memory_atomics_are_per_block():
    k = KernelIR()
    out = k.global_array("out", u32)
    hist = k.shared("hist", u32, (4,))
    t = k.sreg("tid.x")
    with k.b.block() as init:
        k.store(hist, t, Const(0, u32))
    k.b.append(If(k.op("lt", bool_, t, Const(4, u32)), init, []))
    k.op("sync_threads", None)
    bucket = k.op("mod", u32, k.op("add", u32, t, k.sreg("ctaid.x")), Const(4, u32))
    k.op("atomic", u32, hist, bucket, Const(1, u32), kind="add")
    k.op("sync_threads", None)
    with k.b.block() as write:
        k.store(
            out,
            k.op("add", u32, k.op("mul", u32, k.sreg("ctaid.x"), Const(4, u32)), t),
            k.load(hist, t),
        )
    k.b.append(If(k.op("lt", bool_, t, Const(4, u32)), write, []))
    o = poisoned(12, np.uint32)
    k.run(3, 10, {"out": o})
    expect = [np.bincount((np.arange(10) + b) % 4, minlength=4).tolist() for b in range(3)]
    assert o.tolist() == sum(expect, [])


# ------------------------------------------------------------------------ races
def _race_kernel(sync: str | None, read_offset: int, block: int = 64):
    k = KernelIR()
    out = k.global_array("out", u32)
    s = k.shared("s", u32, (block,))
    t = k.sreg("tid.x")
    k.b.loc = write_loc = here()
    k.store(s, t, t)
    if sync:
        k.op(sync, None)
    j = k.op("mod", u32, k.op("add", u32, t, Const(read_offset, u32)), Const(block, u32))
    k.b.loc = read_loc = here()
    v = k.load(s, j)
    k.b.loc = None
    k.store(out, t, v)
    return k, write_loc, read_loc


def test_race_without_barrier_is_reported_with_both_lines():
    k, wloc, rloc = _race_kernel(None, 1)
    with pytest.raises(SimulationError, match="shared-memory race on 's'") as e:
        k.run(1, 64, {"out": np.zeros(64, np.uint32)})
    msg = str(e.value)
    assert f":{wloc.lineno}" in msg and f":{rloc.lineno}" in msg and "thread (" in msg


def test_no_race_with_barrier_or_own_element():
    for sync, offset in [("sync_threads", 1), (None, 0)]:
        k, _, _ = _race_kernel(sync, offset)
        o = poisoned(64, np.uint32)
        k.run(2, 64, {"out": o})
        assert o.tolist() == [(t + offset) % 64 for t in range(64)]


@kaio.gpu_kernel(block_size=64)
def aliased_views(out: kaio.u32[:], SYNC: kaio.constexpr, OFFSET: kaio.constexpr):
    """Thread t stores word t (t in both halves) through a u32 view of the dynamic region,
    then reads the low half of word t + OFFSET through a u16 view of the same bytes."""
    words = kaio.shared_dynamic(kaio.u32, (64,), 0)
    halves = kaio.shared_dynamic(kaio.u16, (128,), 0)
    t = kaio.thread_idx_x()
    words[t] = t * 65537
    if SYNC:
        kaio.sync_threads()
    out[t] = kaio.u32(halves[2 * ((t + OFFSET) % 64)])


def test_race_through_overlapping_dynamic_views_is_reported():
    """Views of the dynamic region that overlap share one race detector over its bytes: a
    store through one and a load through the other meet."""
    with pytest.raises(SimulationError, match=r"(?s)race on 'halves_dsmem1'\[2\].*wrote it"):
        aliased_views.sim[1, 64, 0, 256](np.zeros(64, np.uint32), SYNC=False, OFFSET=1)
    for sync, offset in ((True, 1), (False, 0)):  # a barrier between, or the thread's own bytes
        out = poisoned(64, np.uint32)
        aliased_views.sim[2, 64, 0, 256](out, SYNC=sync, OFFSET=offset)
        assert out.tolist() == [(t + offset) % 64 for t in range(64)]


def test_sync_warp_orders_accesses_within_a_warp_only():
    k, _, _ = _race_kernel("sync_warp", 1)  # lane 31 reads lane 32's element: another warp
    with pytest.raises(SimulationError, match="race"):
        k.run(1, 64, {"out": np.zeros(64, np.uint32)})
    k, _, _ = _race_kernel("sync_warp", 1, block=32)
    o = poisoned(32, np.uint32)
    k.run(1, 32, {"out": o})
    assert o.tolist() == [(t + 1) % 32 for t in range(32)]
    o[:] = 0
    k.run(1, 32, {"out": o}, race_check=False)  # the detector can be turned off


def test_two_threads_storing_one_element_is_a_race():
    k = KernelIR()
    s = k.shared("s", u32, (4,))
    k.b.loc = here()
    k.store(s, Const(2, u32), k.sreg("tid.x"))
    with pytest.raises(SimulationError, match=r"race on 's'\[2\]"):
        k.run(1, 8, {})


# ------------------------------------------------------------------------ launching
def _launch_kernel_and_ir():
    """A Kernel whose specialization is hand-built IR (the frontend is not needed)."""
    from kaio.kernel import Kernel

    def scale(x: f32[:], out: f32[:], factor: f32, n: u32):
        pass

    kernel = Kernel(scale, block_size=32)
    k = KernelIR("scale")
    x = k.global_array("x", f32)
    out = k.global_array("out", f32)
    factor, n = k.scalar("factor", f32), k.scalar("n", u32)
    i = k.global_id()
    with k.b.block() as then:
        k.store(out, i, k.op("mul", f32, k.load(x, i), factor))
    k.b.append(If(k.op("lt", bool_, i, n), then, []))
    seen = []

    def specialize(constexprs=None, layouts=None):
        seen.append(layouts)
        from types import SimpleNamespace

        return SimpleNamespace(function=k.function())

    kernel.specialize = specialize
    return kernel, seen


def test_kernel_sim_launch_checks_arguments():
    kernel, seen = _launch_kernel_and_ir()
    from kaio.sim import SimLauncher

    x = RNG.standard_normal(100).astype(np.float32)
    out = np.zeros(200, np.float32)
    SimLauncher(kernel)[4](x, out[::2], 2.5, 100)
    assert np.array_equal(out[::2], x * np.float32(2.5)) and seen == [("C", "A")]
    with pytest.raises(LaunchError, match="'x'"):
        SimLauncher(kernel)[4](x.astype(np.float64), out, 1.0, 100)
    with pytest.raises(LaunchError, match="'x'"):
        SimLauncher(kernel)[4](list(x), out, 1.0, 100)
    with pytest.raises(LaunchError, match="'n'.*outside"):
        SimLauncher(kernel)[4](x, out, 1.0, -1)
    with pytest.raises(LaunchError, match="'n'"):
        SimLauncher(kernel)[4](x, out, 1.0, 2**32)


def test_simulate_mode_is_thread_local_and_nests():
    assert not mode.active()
    seen = []
    with mode.simulate():
        with mode.simulate():
            assert mode.active()
        assert mode.active()
        t = threading.Thread(target=lambda: seen.append(mode.active()))
        t.start()
        t.join()
    assert not mode.active() and seen == [False]


def test_batching_does_not_change_results():
    k = _loop_kernel()
    a, b = poisoned(64, np.int32), poisoned(64, np.int32)
    k.run(1, 64, {"out": a})
    k.run(1, 64, {"out": b}, batch_lanes=1)
    assert np.array_equal(a, b)


# ------------------------------------------------------------------------ real kernels
import kaio  # noqa: E402

BLOCK = 128


@kaio.gpu_kernel(block_size=BLOCK)
def block_sums(x: i32[:], sums: i32[:], total: i32[:], n: u32):
    s = kaio.shared(i32, (BLOCK,))
    t = kaio.thread_idx_x()
    i = kaio.block_idx_x() * kaio.block_dim_x() + t
    v = 0
    if i < n:
        v = x[i]
    for k in kaio.static_range(5):
        v += kaio.shfl_down(v, 16 >> k)
    if kaio.lane_id() == 0:
        s[kaio.warp_id()] = v
    kaio.sync_threads()
    if t == 0:
        acc = 0
        for w in range(BLOCK // 32):
            acc += s[w]
        sums[kaio.block_idx_x()] = acc
        kaio.atomic_add(total, 0, acc)


@kaio.gpu_kernel
def shift_left(x: f32[:], y: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        y[i] = x[i + 1]


@kaio.gpu_kernel(block_size=(8, 8))
def transpose_tile(a: f32[:, :], out: f32[:, :], sync: kaio.constexpr):
    tile = kaio.shared(f32, (8, 8))
    tx, ty = kaio.thread_idx_x(), kaio.thread_idx_y()
    tile[ty, tx] = a[ty, tx]
    if sync:
        kaio.sync_threads()
    out[ty, tx] = tile[tx, ty]


def test_real_kernel_reduction_with_shuffles_shared_memory_and_atomics():
    n = 1000
    x = RNG.integers(-1000, 1000, n).astype(np.int32)
    nblocks = -(-n // BLOCK)
    sums, total = poisoned(nblocks, np.int32), np.zeros(1, np.int32)
    block_sums.sim[nblocks](x, sums, total, n)
    padded = np.concatenate([x, np.zeros(nblocks * BLOCK - n, np.int32)])
    assert np.array_equal(sums, padded.reshape(nblocks, BLOCK).sum(axis=1))
    assert total[0] == x.sum()


def test_real_kernel_out_of_bounds_shows_the_source_line():
    x, y = np.zeros(64, np.float32), np.zeros(64, np.float32)
    with pytest.raises(SimulationError) as e:
        shift_left.sim[2, 32](x, y, 64)
    msg = str(e.value)
    assert "y[i] = x[i + 1]" in msg and "'x'" in msg and "[64]" in msg
    assert "thread (31, 0, 0) of block (1, 0, 0)" in msg and "test_sim_engine.py:" in msg


def test_real_kernel_transpose_and_race_without_barrier():
    a = RNG.standard_normal((8, 8)).astype(np.float32)
    out = poisoned((16, 8), np.float32)
    transpose_tile.sim[1](a, out[::2], sync=True)  # a strided output view
    assert np.array_equal(out[::2], a.T)
    with pytest.raises(SimulationError, match=r"race on 'tile.*\n.*tile\[tx, ty\]"):
        transpose_tile.sim[1](a, out[::2], sync=False)


def test_launches_inside_kaio_simulate_run_on_the_simulator():
    x, y = np.arange(65, dtype=np.float32), poisoned(64, np.float32)
    with kaio.simulate():
        assert kaio.sim.active()
        shift_left[2, 32](x, y, 64)
    assert not kaio.sim.active()
    assert np.array_equal(y, x[1:])


def test_half_neg_and_abs_work_on_the_sign_bit():
    """neg/abs of f16 and bf16 flip/clear the sign bit, keeping NaN payloads, as both
    backends lower them (the GPU's -(inf - inf) in bf16 is 0xFFFF, not 0xFFC0)."""
    from kaio.sim import arith

    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**16, 4096, dtype=np.uint16)
    bits[:4] = [0x7FFF, 0x7FC1, 0xFFFF, 0x7C01]  # NaNs with payloads (0x7C01: an f16 NaN)
    for t in (kaio.f16, kaio.bf16):
        x = bits.view(t.np_dtype)
        assert np.array_equal(arith.neg(t, x).view(np.uint16), bits ^ 0x8000)
        assert np.array_equal(arith.abs_(t, x).view(np.uint16), bits & 0x7FFF)
