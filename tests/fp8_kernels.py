"""Kernels of tests/test_fp8.py (in a module of their own: the frontend reads their source).

Per fp8 type, one kernel converts f32, f16 and bf16 arrays to it, one converts it to the
three, and one runs each conversion the frontend routes through f32 (integers, f64 out,
e4m3 <-> e5m2).
"""

from __future__ import annotations

import kaio
from kaio import bf16, e4m3, e5m2, f16, f32, f64, i32, u32


@kaio.gpu_kernel(block_size=128)
def to_e4m3(x: f32[:], h: f16[:], b: bf16[:], qx: e4m3[:], qh: e4m3[:], qb: e4m3[:], n: u32):
    """q*[i] = e4m3(*[i])."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        qx[i] = e4m3(x[i])
        qh[i] = e4m3(h[i])
        qb[i] = e4m3(b[i])


@kaio.gpu_kernel(block_size=128)
def to_e5m2(x: f32[:], h: f16[:], b: bf16[:], qx: e5m2[:], qh: e5m2[:], qb: e5m2[:], n: u32):
    """q*[i] = e5m2(*[i])."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        qx[i] = e5m2(x[i])
        qh[i] = e5m2(h[i])
        qb[i] = e5m2(b[i])


@kaio.gpu_kernel(block_size=128)
def from_e4m3(q: e4m3[:], x: f32[:], h: f16[:], b: bf16[:], n: u32):
    """x[i], h[i], b[i] = q[i] widened."""
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        x[i] = f32(q[i])
        h[i] = f16(q[i])
        b[i] = bf16(q[i])


@kaio.gpu_kernel(block_size=128)
def from_e5m2(q: e5m2[:], x: f32[:], h: f16[:], b: bf16[:], n: u32):
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
