"""One kernel per DSL construct, each with random inputs and an independent NumPy reference.

The same catalog drives four checks: the IR verifies after every pass, the PTX assembles with
ptxas, the simulator matches NumPy, and (marked gpu) the GPU matches NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import kaio
from kaio import bf16, f16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64

SCALE = 3  # a module-level constant kernels read


@dataclass
class Case:
    """A kernel, how to launch it, and what it must compute."""

    name: str
    kernel: kaio.Kernel
    make: object  # rng -> (args, grid, block, shared_bytes)
    reference: object  # args (inputs, host copies) -> {arg index: expected array}
    rtol: float = 0.0  # 0: bit-exact
    atol: float = 0.0
    constexprs: dict = field(default_factory=dict)
    views: dict = field(default_factory=dict)  # arg index -> index key making a strided view


CASES: list[Case] = []


def case(make, reference, rtol=0.0, atol=0.0, views=None, **constexprs):
    """Register a kernel in the catalog."""

    def wrap(kernel):
        CASES.append(
            Case(kernel.__name__, kernel, make, reference, rtol, atol, constexprs, views or {})
        )
        return kernel

    return wrap


def poison(shape, dtype):
    """An output buffer full of NaN (floats) or 0x5A bytes (integers)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16):
        return np.full(shape, np.nan, dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer(b"\x5a" * n, dtype).reshape(shape).copy()


def rand_int(rng, dtype, n, lo=None, hi=None):
    """Random integers over the whole range of ``dtype`` (or [lo, hi))."""
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi - 1
    return rng.integers(lo, hi, size=n, dtype=dtype, endpoint=True)


# ---------------------------------------------------------------------------- elementwise
@kaio.gpu_kernel(block_size=128)
def silu_gate(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    idx = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if idx < n:
        xi = x[idx]
        sig = 1.0 / (1.0 + kaio.exp(-xi))
        out[idx] = xi * sig * gate[idx]


def _make_silu(rng):
    n = 1000
    x = rng.standard_normal(n).astype(np.float32) * 4
    g = rng.standard_normal(n).astype(np.float32)
    return [x, g, poison(n, np.float32), n], (n + 127) // 128, None, 0


def _ref_silu(a):
    x, g = a[0].astype(np.float64), a[1].astype(np.float64)
    return {2: x / (1 + np.exp(-x)) * g}


case(_make_silu, _ref_silu, rtol=1e-5, atol=1e-6)(silu_gate)


@kaio.gpu_kernel(block_size=64)
def int_arith(a: i32[:], b: i32[:], out: i32[:, :]):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    if i < a.shape[0]:
        x = a[i]
        y = b[i]
        out[i, 0] = x + y
        out[i, 1] = x - y
        out[i, 2] = x * y
        out[i, 3] = x // y
        out[i, 4] = x % y
        out[i, 5] = x & y | (x ^ 7)
        out[i, 6] = -x
        out[i, 7] = ~y
        out[i, 8] = x >> 3
        out[i, 9] = y << 5
        out[i, 10] = kaio.abs(x) + kaio.min(x, y) - kaio.max(x, 9)
        out[i, 11] = x * SCALE + 2**10


def _make_int(rng):
    n = 200
    a = rand_int(rng, np.int32, n)
    b = rand_int(rng, np.int32, n, -1000, 1000)
    b[b == 0] = 3
    a[:8] = [-7, 7, -7, 7, np.iinfo(np.int32).min, 0, -1, 5]
    b[:8] = [2, -2, -2, 2, -1, -5, 3, 5]
    return [a, b, poison((n, 12), np.int32)], (n + 63) // 64, None, 0


def _ref_int(args):
    a, b = args[0].astype(np.int64), args[1].astype(np.int64)
    cols = [
        a + b,
        a - b,
        a * b,
        a // b,
        a % b,
        (a & b) | (a ^ 7),
        -a,
        ~b,
        a >> 3,
        b << 5,
        np.abs(a) + np.minimum(a, b) - np.maximum(a, 9),
        a * SCALE + 1024,
    ]
    return {2: np.stack(cols, 1).astype(np.int32)}  # wraps like the GPU (two's complement)


case(_make_int, _ref_int)(int_arith)


@kaio.gpu_kernel(block_size=64)
def mixed_promotion(a: u32[:], b: i32[:], c: i64[:], out_u: u32[:], out_l: i64[:], out_f: f32[:]):
    i = kaio.thread_idx_x()
    out_u[i] = a[i] + b[i]  # same width, mixed signedness: unsigned
    out_l[i] = c[i] * b[i] + a[i]  # wider wins: i64
    out_f[i] = b[i] * 0.5 + a[i]  # int with float: f32


def _make_mixed(rng):
    n = 64
    return (
        [
            rand_int(rng, np.uint32, n),
            rand_int(rng, np.int32, n),
            rand_int(rng, np.int64, n, -(2**40), 2**40),
            poison(n, np.uint32),
            poison(n, np.int64),
            poison(n, np.float32),
        ],
        1,
        None,
        0,
    )


def _ref_mixed(args):
    a, b, c = args[0], args[1], args[2]
    u = (a.astype(np.uint64) + b.astype(np.int64).astype(np.uint64)) & 0xFFFFFFFF
    lo = c * b.astype(np.int64) + a.astype(np.int64)
    f = b.astype(np.float32) * np.float32(0.5) + a.astype(np.float32)
    return {3: u.astype(np.uint32), 4: lo, 5: f}


case(_make_mixed, _ref_mixed)(mixed_promotion)


@kaio.gpu_kernel(block_size=64)
def narrow_ints(
    a: i8[:], b: u8[:], c: i16[:], d: u16[:], o8: i8[:], ou8: u8[:], o16: i16[:], ou16: u16[:]
):
    i = kaio.thread_idx_x()
    o8[i] = a[i] * a[i] + 100
    ou8[i] = b[i] * 3 - 7
    o16[i] = c[i] * c[i] // 3
    ou16[i] = d[i] + d[i] % 1000


def _make_narrow(rng):
    n = 64
    return (
        [
            rand_int(rng, np.int8, n),
            rand_int(rng, np.uint8, n),
            rand_int(rng, np.int16, n),
            rand_int(rng, np.uint16, n),
            poison(n, np.int8),
            poison(n, np.uint8),
            poison(n, np.int16),
            poison(n, np.uint16),
        ],
        1,
        None,
        0,
    )


def _ref_narrow(args):
    a, b, c, d = (x.astype(np.int64) for x in args[:4])

    def wrap(v, dt):
        return v.astype(np.int64).astype(dt)

    cc = wrap(c * c, np.int16).astype(np.int64)
    return {
        4: wrap(wrap(a * a, np.int8).astype(np.int64) + 100, np.int8),
        5: wrap(wrap(b * 3, np.uint8).astype(np.int64) - 7, np.uint8),
        6: wrap(cc // 3, np.int16),
        7: wrap(d + d % 1000, np.uint16),
    }


case(_make_narrow, _ref_narrow)(narrow_ints)


@kaio.gpu_kernel(block_size=64)
def half_arith(a: f16[:], b: f16[:], c: bf16[:], d: bf16[:], oh: f16[:], ob: bf16[:], of: f32[:]):
    i = kaio.thread_idx_x()
    oh[i] = a[i] * b[i] + a[i] / b[i]
    ob[i] = c[i] * d[i] - c[i]
    of[i] = a[i] + c[i]  # f16 with bf16: f32


def _make_half(rng):
    n = 64
    a = rng.standard_normal(n).astype(np.float16)
    b = (rng.standard_normal(n) + 3).astype(np.float16)
    c = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    d = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    return (
        [a, b, c, d, poison(n, np.float16), poison(n, ml_dtypes.bfloat16), poison(n, np.float32)],
        1,
        None,
        0,
    )


def _ref_half(args):
    a, b, c, d = (x.astype(np.float64) for x in args[:4])
    h = np.float16

    def rh(v):  # each f16 operation rounds once
        return v.astype(h).astype(np.float64)

    bb = ml_dtypes.bfloat16

    def rb(v):
        return v.astype(bb).astype(np.float64)

    return {
        4: (rh(rh(a * b) + rh(a / b))).astype(h),
        5: rb(rb(c * d) - c).astype(bb),
        6: (a + c).astype(np.float32),
    }


case(_make_half, _ref_half)(half_arith)


@kaio.gpu_kernel(block_size=64)
def double_math(a: f64[:], out: f64[:, :]):
    i = kaio.thread_idx_x()
    x = a[i]
    out[i, 0] = x * 3.0 + 1.0 / x
    out[i, 1] = kaio.sqrt(kaio.abs(x))
    out[i, 2] = kaio.fma(x, x, -1.0)
    out[i, 3] = kaio.floor(x) + kaio.ceil(x)
    out[i, 4] = f64(f32(x))


def _make_double(rng):
    n = 64
    return [rng.standard_normal(n) * 10, poison((n, 5), np.float64)], 1, None, 0


def _ref_double(args):
    x = args[0]
    cols = [
        x * 3.0 + 1.0 / x,
        np.sqrt(np.abs(x)),
        None,
        np.floor(x) + np.ceil(x),
        x.astype(np.float32).astype(np.float64),
    ]
    # fma: x*x is exact in (double-double); a few ulps of difference only at cancellation
    cols[2] = x * x - 1.0
    return {1: np.stack(cols, 1)}


case(_make_double, _ref_double, rtol=1e-15, atol=1e-13)(double_math)


@kaio.gpu_kernel(block_size=64)
def wide_ints(a: u64[:], b: i64[:], out_u: u64[:], out_i: i64[:]):
    i = kaio.thread_idx_x()
    out_u[i] = (a[i] >> 7) ^ (a[i] << 13) + u64(b[i])
    out_i[i] = b[i] // 1000 - b[i] % 7 * (b[i] >> 60)


def _make_wide(rng):
    n = 64
    return (
        [
            rand_int(rng, np.uint64, n),
            rand_int(rng, np.int64, n),
            poison(n, np.uint64),
            poison(n, np.int64),
        ],
        1,
        None,
        0,
    )


def _ref_wide(args):
    a = [int(v) for v in args[0]]
    b = [int(v) for v in args[1]]
    m = 2**64
    u = [((x >> 7) ^ (((x << 13) + (y % m)) % m)) % m for x, y in zip(a, b, strict=True)]

    def s64(v):
        v %= m
        return v - m if v >= 2**63 else v

    i = [s64(y // 1000 - (y % 7) * (y >> 60)) for y in b]
    return {2: np.array(u, dtype=np.uint64), 3: np.array(i, dtype=np.int64)}


case(_make_wide, _ref_wide)(wide_ints)


# ---------------------------------------------------------------------------- control flow
@kaio.gpu_kernel(block_size=64)
def branches(x: f32[:], out: i32[:], n: i32):
    i = i32(kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x())
    if i < n and x[i] > 0.0:  # short-circuit: x[i] is not read past n
        out[i] = 1
    elif i < n and (x[i] < -1.0 or x[i] == -0.5):
        out[i] = 2
    elif i < n:
        out[i] = 3 if x[i] > -0.25 else 4
    if not i < n:
        return
    if 0.0 < x[i] < 0.5:
        out[i] += 10


def _make_branches(rng):
    n = 100
    x = rng.standard_normal(n).astype(np.float32)
    x[:3] = [-0.5, 0.25, -0.3]
    return [x, poison(n, np.int32), n - 3], 2, None, 0


def _ref_branches(args):
    x, n = args[0].astype(np.float64), args[2]
    out = args[1].copy()
    for i in range(n):
        v = x[i]
        out[i] = 1 if v > 0 else 2 if (v < -1 or v == -0.5) else (3 if v > -0.25 else 4)
        if 0 < v < 0.5:
            out[i] += 10
    return {1: out}


case(_make_branches, _ref_branches)(branches)


@kaio.gpu_kernel(block_size=64)
def loops(start: i32[:], out: i32[:, :]):
    i = kaio.thread_idx_x()
    v = start[i]
    steps = 0
    while v != 1 and steps < 500:  # per-thread trip counts (Collatz)
        if v % 2 == 0:
            v = v // 2
        else:
            v = 3 * v + 1
        steps += 1
    out[i, 0] = steps
    total = 0
    for k in range(start[i] % 17, -3, -2):  # runtime bounds, negative step
        if k == 5:
            continue
        if total > 40:
            break
        total += k
    out[i, 1] = total
    acc = 0
    for k in kaio.static_range(4):
        for j in kaio.static_range(k, 3):  # bounds may depend on an outer static index
            acc += j * 10 + k
    for k in range(3):  # constant bounds: the unroll pass expands it
        acc += k * v
    out[i, 2] = acc


def _make_loops(rng):
    n = 64
    return [rand_int(rng, np.int32, n, 1, 1000), poison((n, 3), np.int32)], 1, None, 0


def _ref_loops(args):
    out = args[1].copy()
    for i, s in enumerate(args[0]):
        v, steps = int(s), 0
        while v != 1 and steps < 500:
            v = v // 2 if v % 2 == 0 else 3 * v + 1
            steps += 1
        total = 0
        for k in range(int(s) % 17, -3, -2):
            if k == 5:
                continue
            if total > 40:
                break
            total += k
        acc = sum(j * 10 + k for k in range(4) for j in range(k, 3)) + 3 * v
        out[i] = [steps, total, acc]
    return {1: out}


case(_make_loops, _ref_loops)(loops)


@kaio.gpu_func
def clamp01(v: f32) -> f32:
    if v < 0.0:
        return 0.0
    if v > 1.0:
        return 1.0
    return v


@kaio.gpu_func
def smooth(v: f32, k: kaio.constexpr):
    c = clamp01(v)
    return c * c * (3.0 - 2.0 * c) * k


@kaio.gpu_kernel(block_size=64)
def device_functions(x: f32[:], out: f32[:]):
    i = kaio.thread_idx_x()
    out[i] = smooth(x[i], 2.0) + clamp01(x[i] * 0.5)


def _make_devfn(rng):
    n = 64
    return [rng.uniform(-0.5, 1.5, n).astype(np.float32), poison(n, np.float32)], 1, None, 0


def _ref_devfn(args):
    x = args[0].astype(np.float64)
    c = np.clip(x, 0, 1)
    return {1: c * c * (3 - 2 * c) * 2 + np.clip(x * 0.5, 0, 1)}


case(_make_devfn, _ref_devfn, rtol=1e-6, atol=1e-7)(device_functions)


@kaio.gpu_kernel
def constexpr_tiles(x: f32[:], out: f32[:], BS: kaio.constexpr, MODE: kaio.constexpr):
    tile = kaio.shared(f32, (BS,))
    t = kaio.thread_idx_x()
    base = kaio.block_idx_x() * BS
    tile[t] = x[base + t]
    kaio.sync_threads()
    if MODE == "reverse":
        out[base + t] = tile[BS - 1 - t]
    else:
        out[base + t] = tile[t] * 2.0


def _make_constexpr(rng):
    n = 4 * 32
    return [rng.standard_normal(n).astype(np.float32), poison(n, np.float32)], 4, 32, 0


def _ref_constexpr(args):
    return {1: args[0].reshape(4, 32)[:, ::-1].reshape(-1)}


case(_make_constexpr, _ref_constexpr, BS=32, MODE="reverse")(constexpr_tiles)


@kaio.gpu_kernel(block_size=(8, 4, 2))
def geometry(out: u32[:, :]):
    tid = (
        kaio.thread_idx_x()
        + kaio.thread_idx_y() * kaio.block_dim_x()
        + (kaio.thread_idx_z() * kaio.block_dim_x() * kaio.block_dim_y())
    )
    bid = kaio.block_idx_x() + kaio.block_idx_y() * kaio.grid_dim_x()
    g = bid * 64 + tid
    out[g, 0] = kaio.lane_id()
    out[g, 1] = kaio.warp_id()
    out[g, 2] = kaio.thread_idx_z() * 100 + kaio.block_idx_y() * 10 + kaio.grid_dim_y()
    a, b = kaio.thread_idx_y(), kaio.block_dim_z()
    a, b = b, a  # tuple swap
    out[g, 3] = a * 10 + b


def _make_geometry(rng):
    return [poison((6 * 64, 4), np.uint32)], (2, 3), None, 0


def _ref_geometry(args):
    out = np.zeros((6 * 64, 4), np.uint32)
    for by in range(3):
        for bx in range(2):
            for tz in range(2):
                for ty in range(4):
                    for tx in range(8):
                        tid = tx + ty * 8 + tz * 32
                        g = (bx + by * 2) * 64 + tid
                        out[g] = [tid % 32, tid // 32, tz * 100 + by * 10 + 3, 2 * 10 + ty]
    return {0: out}


case(_make_geometry, _ref_geometry)(geometry)


# ---------------------------------------------------------------------------- memory
@kaio.gpu_kernel(block_size=64)
def strided_views(a: f32[:, :], out: f32[:]):
    i = kaio.thread_idx_x()
    if i < a.shape[0]:
        s = 0.0
        for j in range(a.shape[1]):
            s += a[i, j] * f32(j + 1)
        out[i] = s


STRIDED = (slice(None, None, 2), slice(1, None, 3))


def _make_strided(rng):
    base = rng.standard_normal((40, 12)).astype(np.float32)
    return [base, poison(20, np.float32)], 1, None, 0


def _ref_strided(args):
    a = args[0][STRIDED].astype(np.float64)
    return {1: a @ np.arange(1, a.shape[1] + 1)}


case(_make_strided, _ref_strided, rtol=1e-6, views={0: STRIDED})(strided_views)


@kaio.gpu_kernel(block_size=128)
def shared_reduce(x: f32[:], out: f32[:]):
    buf = kaio.shared(f32, (128,))
    t = kaio.thread_idx_x()
    buf[t] = x[kaio.block_idx_x() * 128 + t]
    kaio.sync_threads()
    s = 64
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        kaio.sync_threads()
        s //= 2
    if t == 0:
        out[kaio.block_idx_x()] = buf[0]


def _make_shared_reduce(rng):
    return [rng.standard_normal(4 * 128).astype(np.float32), poison(4, np.float32)], 4, None, 0


def _ref_shared_reduce(args):
    return {1: args[0].astype(np.float64).reshape(4, 128).sum(1)}


case(_make_shared_reduce, _ref_shared_reduce, rtol=1e-5)(shared_reduce)


@kaio.gpu_kernel(block_size=32)
def dynamic_shared(x: i32[:], out: i32[:]):
    buf = kaio.shared_dynamic(i32)
    t = kaio.thread_idx_x()
    buf[t] = x[t]
    buf[t + 32] = x[t] * 2
    kaio.sync_threads()
    out[t] = buf[63 - t] + buf[31 - t]


def _make_dynamic(rng):
    return [rand_int(rng, np.int32, 32, -1000, 1000), poison(32, np.int32)], 1, None, 256


def _ref_dynamic(args):
    x = args[0]
    buf = np.concatenate([x, x * 2])
    return {1: buf[63 - np.arange(32)] + buf[31 - np.arange(32)]}


case(_make_dynamic, _ref_dynamic)(dynamic_shared)


@kaio.gpu_kernel(block_size=32)
def local_arrays(x: f32[:, :], out: f32[:, :]):
    i = kaio.thread_idx_x()
    acc = kaio.local(f32, (4,))
    for k in kaio.static_range(4):
        acc[k] = 0.0
    for j in range(x.shape[1]):
        for k in kaio.static_range(4):
            acc[k] += x[i, j] * f32(k + 1)
    scratch = kaio.local(i32, (8,))
    for k in range(8):  # runtime-indexed local memory
        scratch[(k * 3) % 8] = k
    for k in kaio.static_range(4):
        out[i, k] = acc[k] + f32(scratch[k])


def _make_local(rng):
    return (
        [rng.standard_normal((32, 5)).astype(np.float32), poison((32, 4), np.float32)],
        1,
        None,
        0,
    )


def _ref_local(args):
    x = args[0].astype(np.float64)
    scratch = np.zeros(8)
    for k in range(8):
        scratch[(k * 3) % 8] = k
    return {1: x.sum(1)[:, None] * np.arange(1, 5)[None, :] + scratch[:4][None, :]}


case(_make_local, _ref_local, rtol=1e-6, atol=1e-6)(local_arrays)


# ---------------------------------------------------------------------------- warp
@kaio.gpu_kernel(block_size=64)
def warp_ops(x: f32[:], y: i32[:], out: f32[:, :], votes: u32[:, :]):
    t = kaio.thread_idx_x()
    v = x[t]
    s = v
    for k in kaio.static_range(5):
        s += kaio.shfl_xor(s, 16 >> k)
    out[t, 0] = s
    out[t, 1] = kaio.shfl_down(v, 3)
    out[t, 2] = kaio.shfl_up(v, 2)
    out[t, 3] = kaio.shfl_idx(v, 7)
    w = y[t]
    votes[t, 0] = kaio.ballot(w > 0)
    votes[t, 1] = u32(kaio.vote_any(w > 900))
    votes[t, 2] = u32(kaio.vote_all(w > -1000))
    votes[t, 3] = u32(kaio.shfl_xor(w, 1))


def _make_warp(rng):
    x = rng.integers(-100, 100, 64).astype(np.float32)  # sums exact in any order
    return (
        [
            x,
            rand_int(rng, np.int32, 64, -999, 999),
            poison((64, 4), np.float32),
            poison((64, 4), np.uint32),
        ],
        1,
        None,
        0,
    )


def _ref_warp(args):
    x, y = args[0].reshape(2, 32), args[1].reshape(2, 32)
    out = np.zeros((2, 32, 4), np.float32)
    votes = np.zeros((2, 32, 4), np.uint32)
    lanes = np.arange(32)
    for w in range(2):
        out[w, :, 0] = x[w].sum()
        out[w, :, 1] = np.where(lanes + 3 < 32, x[w][np.minimum(lanes + 3, 31)], x[w])
        out[w, :, 2] = np.where(lanes >= 2, x[w][np.maximum(lanes - 2, 0)], x[w])
        out[w, :, 3] = x[w][7]
        votes[w, :, 0] = int(sum(1 << int(i) for i in lanes[y[w] > 0]))
        votes[w, :, 1] = int((y[w] > 900).any())
        votes[w, :, 2] = int((y[w] > -1000).all())
        votes[w, :, 3] = y[w][lanes ^ 1].astype(np.uint32)
    return {2: out.reshape(64, 4), 3: votes.reshape(64, 4)}


case(_make_warp, _ref_warp)(warp_ops)


@kaio.gpu_kernel(block_size=128)
def atomics(x: i32[:], counters: i32[:], fsum: f32[:], slots: u32[:], old: i32[:]):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 128
    v = x[i]
    kaio.atomic_add(counters, 0, 1)
    kaio.atomic_max(counters, 1, v)
    kaio.atomic_min(counters, 2, v)
    kaio.atomic_add(fsum, 0, f32(v % 16))  # small integers: exact in any order
    kaio.atomic_max(fsum, 1, f32(v))
    old[i] = kaio.atomic_exch(counters, 3, 7)
    # each thread claims a slot with compare-and-swap; exactly one winner per slot
    slot = i % 16
    if kaio.atomic_cas(slots, slot, 0, u32(i + 1)) == 0:
        kaio.atomic_add(counters, 4, 1)
    sh = kaio.shared(i32, (1,))
    if kaio.thread_idx_x() == 0:
        sh[0] = 0
    kaio.sync_threads()
    kaio.atomic_add(sh, 0, 2)
    kaio.sync_threads()
    if kaio.thread_idx_x() == 0:
        kaio.atomic_add(counters, 5, sh[0])


def _make_atomics(rng):
    n = 256
    counters = np.array([0, -(2**31), 2**31 - 1, 7, 0, 0], np.int32)
    return (
        [
            rand_int(rng, np.int32, n, -(10**6), 10**6),
            counters,
            np.array([0.0, -np.inf], np.float32),
            np.zeros(16, np.uint32),
            poison(n, np.int32),
        ],
        2,
        None,
        0,
    )


def _ref_atomics(args):
    x = args[0].astype(np.int64)
    return {
        1: np.array([256, x.max(), x.min(), 7, 16, 2 * 256], np.int32),
        2: np.array([(x % 16).sum(), x.max()], np.float32),
        4: np.full(256, 7, np.int32),  # every exchange returns 7 (the value all write)
    }


case(_make_atomics, _ref_atomics)(atomics)


@kaio.gpu_kernel(block_size=64)
def turns(x: f32[:], sem: i32[:], out: f32[:]):
    """Blocks take turns in linear order (``wait_eq`` on a semaphore, released with a fence
    and an atomic): out[0] = out[0] / 2 + x[block], an order-dependent result."""
    b = i32(kaio.block_idx_x())
    if kaio.thread_idx_x() == 0:
        kaio.wait_eq(sem, 0, b)
        out[0] = out[0] * 0.5 + x[b]
        kaio.threadfence()
        kaio.atomic_add(sem, 0, 1)


def _make_turns(rng):
    x = rng.standard_normal(8).astype(np.float32)
    return [x, np.zeros(1, np.int32), np.zeros(1, np.float32)], 8, 64, 0


def _ref_turns(args):
    acc = np.float32(0)
    for v in args[0]:
        acc = np.float32(acc * np.float32(0.5) + v)
    return {1: np.array([8], np.int32), 2: np.array([acc], np.float32)}


case(_make_turns, _ref_turns)(turns)


# ---------------------------------------------------------------------------- math and conversions
@kaio.gpu_kernel(block_size=64)
def math_builtins(x: f32[:], out: f32[:, :]):
    i = kaio.thread_idx_x()
    v = x[i]
    a = kaio.abs(v) + 0.1
    out[i, 0] = kaio.exp(v)
    out[i, 1] = kaio.log(a)
    out[i, 2] = kaio.sqrt(a)
    out[i, 3] = kaio.rsqrt(a)
    out[i, 4] = kaio.sin(v)
    out[i, 5] = kaio.cos(v)
    out[i, 6] = kaio.tanh(v)
    out[i, 7] = kaio.erf(v)
    out[i, 8] = kaio.pow(a, 1.5)
    out[i, 9] = v**3
    out[i, 10] = kaio.exp2(v) + kaio.log2(a)
    out[i, 11] = kaio.fma(v, 2.0, 1.0) + kaio.floor(v) - kaio.ceil(v)
    out[i, 12] = kaio.min(v, 0.5) * kaio.max(v, -0.5)
    out[i, 13] = v // 0.75 + v % 0.75
    out[i, 14] = kaio.exp2_ftz(v)
    out[i, 15] = kaio.rcp_ftz(a)


def _make_math(rng):
    return [rng.uniform(-3, 3, 64).astype(np.float32), poison((64, 16), np.float32)], 1, None, 0


def _erf(x):
    return np.array([math.erf(v) for v in x])


def _ref_math(args):
    v = args[0].astype(np.float64)
    a = np.abs(v) + np.float64(np.float32(0.1))
    cols = [
        np.exp(v),
        np.log(a),
        np.sqrt(a),
        1 / np.sqrt(a),
        np.sin(v),
        np.cos(v),
        np.tanh(v),
        _erf(v),
        a**1.5,
        v**3,
        2**v + np.log2(a),
        v * 2 + 1 + np.floor(v) - np.ceil(v),
        np.minimum(v, 0.5) * np.maximum(v, -0.5),
        np.floor(v / 0.75) + (v - np.floor(v / 0.75) * 0.75),
        2**v,
        1 / a,
    ]
    return {1: np.stack(cols, 1)}


case(_make_math, _ref_math, rtol=2e-3, atol=2e-5)(math_builtins)


@kaio.gpu_kernel(block_size=64)
def conversions(
    x: f32[:], oi: i32[:], ou: u8[:], of: f16[:], ob: bf16[:], ol: i64[:], obool: u8[:]
):
    i = kaio.thread_idx_x()
    v = x[i]
    oi[i] = i32(v)  # truncates toward zero, saturates, NaN -> 0
    ou[i] = u8(i32(v))  # int to int wraps
    of[i] = f16(v)  # round to nearest even
    ob[i] = bf16(v)
    ol[i] = i64(v * 1.0e10)
    obool[i] = u8(bool(v)) + u8(kaio.select(v > 0.0, 2, 0)) + u8(kaio.bitcast(v, u32) >> 31)


def _make_conv(rng):
    x = (rng.standard_normal(64) * 1e3).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 3e9, -3e9, 0.0]
    return (
        [
            x,
            poison(64, np.int32),
            poison(64, np.uint8),
            poison(64, np.float16),
            poison(64, ml_dtypes.bfloat16),
            poison(64, np.int64),
            poison(64, np.uint8),
        ],
        1,
        None,
        0,
    )


def _sat(v, dt):
    """float -> int as PTX cvt.rzi: truncate, saturate, NaN -> 0 (per element, exactly)."""
    info = np.iinfo(dt)
    out = []
    for x in v.tolist():
        if math.isnan(x):
            out.append(0)
        elif math.isinf(x):
            out.append(info.max if x > 0 else info.min)
        else:
            out.append(max(info.min, min(info.max, math.trunc(x))))
    return np.array(out, dtype=dt)


def _ref_conv(args):
    x = args[0]
    with np.errstate(over="ignore", invalid="ignore"):
        return _conv_expected(x)


def _conv_expected(x):
    i32v = _sat(x.astype(np.float64), np.int32)
    sign = (x.view(np.uint32) >> 31).astype(np.uint8)
    return {
        1: i32v,
        2: (i32v.astype(np.int64) & 0xFF).astype(np.uint8),
        3: x.astype(np.float16),
        4: x.astype(ml_dtypes.bfloat16),
        5: _sat((x * np.float32(1e10)).astype(np.float64), np.int64),
        6: ((x != 0).astype(np.uint8) + np.where(x > 0, 2, 0) + sign).astype(np.uint8),
    }


case(_make_conv, _ref_conv)(conversions)


# ------------------------------------------------------------ generic kernels, tuples, keywords
@kaio.gpu_func
def _sorted_pair(a: f32, b: f32, *, descending: kaio.constexpr = False) -> tuple[f32, f32]:
    lo = kaio.min(a, b)
    hi = kaio.max(a=a, b=b)
    if descending:
        return hi, lo
    return lo, hi


@kaio.gpu_kernel(block_size=64)
def generic_tuples(x: DT[:], y: DT[:], out: DT[:, :], DT: kaio.constexpr):  # noqa: F821
    """A dtype parameter (bf16 here) in annotations, kaio.shared and conversions; a device
    function returning a tuple, called with keyword arguments."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    tile = kaio.shared(dtype=DT, shape=64)
    if i < x.shape[0]:
        tile[kaio.thread_idx_x()] = DT(f32(x[i]) * 2.0)
        lo, hi = _sorted_pair(f32(tile[kaio.thread_idx_x()]), b=f32(y[i]))
        down = _sorted_pair(lo, hi, descending=True)
        out[i, 0] = DT(lo)
        out[i, 1] = DT(hi)
        out[i, 2] = DT(down[0] - down[1])


def _make_generic(rng):
    n = 150
    x = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    y = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
    return [x, y, poison((n, 3), ml_dtypes.bfloat16)], (n + 63) // 64, None, 0


def _ref_generic(args):
    twice = (args[0].astype(np.float64) * 2).astype(ml_dtypes.bfloat16).astype(np.float64)
    y = args[1].astype(np.float64)
    lo, hi = np.minimum(twice, y), np.maximum(twice, y)
    cols = [lo, hi, (hi - lo).astype(np.float32)]
    return {2: np.stack(cols, 1).astype(ml_dtypes.bfloat16)}


case(_make_generic, _ref_generic, DT=bf16)(generic_tuples)


@kaio.gpu_kernel(block_size=64, fastmath=True)
def silu_gate_fastmath(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    """The silu*gate kernel with fastmath: ex2.approx.ftz and div.full.ftz.f32."""
    idx = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if idx < n:
        xi = x[idx]
        out[idx] = xi / (1.0 + kaio.exp(-xi)) * gate[idx]


def _make_silu_fast(rng):
    n = 300
    x = rng.uniform(-8, 8, n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    return [x, g, poison(n, np.float32), n], (n + 63) // 64, None, 0


case(_make_silu_fast, _ref_silu, rtol=2e-6, atol=1e-7)(silu_gate_fastmath)


@kaio.gpu_kernel(block_size=64)
def bit_reverse(a: u32[:], b: i64[:], out_a: u32[:], out_b: i64[:]):
    """kaio.brev on 32- and 64-bit integers (brev.b32, brev.b64); each thread first asks L2
    for its element of b (kaio.prefetch_l2: a hint, values unchanged)."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    if i < a.shape[0]:
        kaio.prefetch_l2(b, i)
        out_a[i] = kaio.brev(a[i])
        out_b[i] = kaio.brev(b[i]) ^ kaio.brev(i64(i))


def _make_brev(rng):
    n = 100
    a, b = rand_int(rng, np.uint32, n), rand_int(rng, np.int64, n)
    return [a, b, poison(n, np.uint32), poison(n, np.int64)], 2, None, 0


def _reversed_bits(values, bits: int) -> list[int]:
    """Each value's low ``bits`` bits in reverse order, by Python string reversal."""
    return [int(format(int(v) % (1 << bits), f"0{bits}b")[::-1], 2) for v in values]


def _ref_brev(args):
    a, b = args[0], args[1]
    rb = np.array(_reversed_bits(b, 64), np.uint64)
    rb ^= np.array(_reversed_bits(range(100), 64), np.uint64)
    return {2: np.array(_reversed_bits(a, 32), np.uint32), 3: rb.view(np.int64)}


case(_make_brev, _ref_brev)(bit_reverse)
