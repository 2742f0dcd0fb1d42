"""Kernels of tests/test_fp8.py (in a module of their own: the frontend reads their source).

Per fp8 type (a dtype constexpr, ``FP8``), one kernel converts f32, f16 and bf16 arrays to
it, one converts it to the three; and one kernel runs each conversion the
frontend routes through f32 (integers, f64 out, e4m3 <-> e5m2).
"""

# ruff: noqa: F821  (FP8 in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import bf16, e4m3, e5m2, f16, f32, f64, i8, i32, u8, u32

TYPES = {"e4m3": e4m3, "e5m2": e5m2}  # the FP8 of each format


@kaio.gpu_kernel(block_size=128)
def to_fp8(
    x: f32[:],
    h: f16[:],
    b: bf16[:],
    qx: FP8[:],
    qh: FP8[:],
    qb: FP8[:],
    n: u32,
    FP8: kaio.constexpr,
):
    """q*[i] = FP8(*[i])."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        qx[i] = FP8(x[i])
        qh[i] = FP8(h[i])
        qb[i] = FP8(b[i])


@kaio.gpu_kernel(block_size=128)
def from_fp8(q: FP8[:], x: f32[:], h: f16[:], b: bf16[:], n: u32, FP8: kaio.constexpr):
    """x[i], h[i], b[i] = q[i] widened."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        x[i] = f32(q[i])
        h[i] = f16(q[i])
        b[i] = bf16(q[i])


@kaio.gpu_kernel(block_size=128)
def routed(q: e4m3[:], r: e5m2[:], ints: i32[:], d: f64[:], qi: e4m3[:], qr: e5m2[:], n: u32):
    """Conversions through f32: i32 -> e4m3 and e4m3 -> i32, e4m3 -> f64, e4m3 -> e5m2, a
    constant, and a copy of an fp8 value."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        qi[i] = e4m3(ints[i])
        ints[i] = i32(q[i])
        d[i] = f64(q[i])
        qr[i] = e5m2(q[i])
        if i == 0:
            qi[i] = e4m3(1000.0)  # a constant, saturated at compile time
        v = r[i]
        r[i] = v


@kaio.gpu_kernel(block_size=128)
def from_bits(w: u32[:], x: f32[:], codes: i32[:], n: u32, FP8: kaio.constexpr):
    """x[i] = byte i of the words ``w`` (low byte first) read as FP8 and widened; codes[i]
    = that FP8 value's bits read back as an int8 (the two ``bitcast`` directions)."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        q = kaio.bitcast(u8(w[i // 4] >> (8 * (i % 4))), FP8)
        x[i] = f32(q)
        codes[i] = i32(kaio.bitcast(q, i8))
