"""Quantized matmuls on tensor cores: W8A8 int8 (``matmul_int8``) and W4A16 int4
(``matmul_int4``).

``matmul_int8(a, b, scale)`` multiplies int8 (or uint8 bytes read as int8) ``a`` [M, K] and
``b`` [K, N] with ``mma.sync`` m16n8k32 s8 -> s32, exactly, and applies ``scale`` in the
epilogue: ``f32(a @ b) * scale``. The kernel is the one of the 16-bit matmuls
(``kaio_ops._matmul_kernels``) specialized for 8-bit elements; since ``ldmatrix`` can only
transpose 16-bit elements, B is first transposed to N x K by a small kernel (2 K N bytes of
traffic, a few percent of a large product).

``matmul_int4(a, b_packed, scales)`` multiplies f16 ``a`` [M, K] by GPTQ-style int4 weights:
``b_packed`` [K/8, N] 32-bit words of 8 signed nibbles (low nibble first, k = 8 * row + i),
``scales`` f16 [K/128, N]; the weight is ``scales[k // 128, n] * q`` rounded to f16, made in
registers right before the f16 ``mma`` (the same kernel, ``QUANT = 4``): the weights cross
memory at a quarter of f16's bytes, which is the point for decode shapes.
"""

from __future__ import annotations

import math

import kaio
from kaio import f16, i32, u8, u32
from kaio.types import i8
from kaio_ops import _arrays
from kaio_ops._typed import by_dtype
from kaio_ops.matmul import launch, plan_for

__all__ = ["matmul_int4", "matmul_int8"]

DT = u8  # the element type placeholder (see _typed.by_dtype)
GROUP = 128  # int4 weights share a scale per 128 values along K
TILE = 32
ROWS_PER_PASS = 8


@kaio.gpu_kernel(block_size=(TILE, ROWS_PER_PASS))
def transpose_kernel(src: DT[:, :], dst: DT[:, :], R: u32, C: u32):
    """dst [C, R] = src [R, C] transposed, a 32 x 32 tile per block through shared memory."""
    tile = kaio.shared(DT, (TILE, TILE + 1))
    tx = kaio.thread_idx_x()
    ty = kaio.thread_idx_y()
    r0 = kaio.block_idx_y() * TILE
    c0 = kaio.block_idx_x() * TILE
    for j in kaio.static_range(0, TILE, ROWS_PER_PASS):
        if r0 + ty + j < R and c0 + tx < C:
            tile[ty + j, tx] = src[r0 + ty + j, c0 + tx]
    kaio.sync_threads()
    for j in kaio.static_range(0, TILE, ROWS_PER_PASS):
        if c0 + ty + j < C and r0 + tx < R:
            dst[c0 + ty + j, r0 + tx] = tile[tx, ty + j]


TRANSPOSE = by_dtype(transpose_kernel)


def transpose(x: _arrays.Operand):
    """A new array of ``x``'s kind holding ``x`` [R, C] transposed to [C, R]."""
    r, c = x.shape
    out = _arrays.output(x, (c, r))
    grid = (math.ceil(c / TILE), math.ceil(r / TILE))
    TRANSPOSE[x.dtype][grid, None, _arrays.stream_of(x), 0](x.obj, out, r, c)
    return out


def matmul_int8(a, b, scale: float = 1.0):
    """``f32(a @ b) * scale`` for int8 (or uint8, read as int8) ``a`` [M, K] and ``b``
    [K, N] of the same dtype: exact integer products and sums (s32, K < 2**17), f32 out."""
    inputs = _arrays.Inputs("matmul_int8")
    a = inputs.array(a, "a", ndim=2, dtypes=(i8, u8), form="[M, K]")
    b = inputs.array(b, "b", ndim=2, dtypes=(a.dtype,), form="[K, N]")
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k:
        raise inputs.error("b", f"must have K = {k} rows (a is {a.shape}), got shape {b.shape}")
    if 0 in (m, k, n):
        raise inputs.error("a" if 0 in a.shape else "b", "has an empty dimension")
    if not isinstance(scale, int | float):
        raise inputs.error("scale", f"must be a Python float, got {type(scale).__name__}")
    flat_b = _arrays.view(transpose(b), a.kind, (n * k,))
    return launch(a, flat_b, (m, n, k), True, plan_for(m, n, k, "int8"), alpha=float(scale))


def matmul_int4(a, b_packed, scales):
    """``a @ W`` in f32 for f16 ``a`` [M, K] and int4 weights ``W[k, n] = scales[k // 128,
    n] * q`` (q the signed nibble ``k % 8`` of word ``b_packed[k // 8, n]``, low nibble
    first; ``b_packed`` u32 or int32 [K/8, N], ``scales`` f16 [K/128, N], K % 128 == 0)."""
    inputs = _arrays.Inputs("matmul_int4")
    a = inputs.array(a, "a", ndim=2, dtypes=(f16,), form="[M, K]")
    m, k = a.shape
    if k % GROUP or k == 0:
        raise inputs.error("a", f"needs K a positive multiple of {GROUP} (the group size), got {k}")
    b = inputs.array(b_packed, "b_packed", ndim=2, dtypes=(u32, i32), form="[K/8, N]")
    n = b.shape[1]
    if b.shape[0] != k // 8 or n == 0:
        raise inputs.error(
            "b_packed", f"must have shape [K/8, N] = [{k // 8}, N >= 1], got {b.shape}"
        )
    s = inputs.array(
        scales, "scales", ndim=2, dtypes=(f16,), shape=(k // GROUP, n), form="[K/128, N]"
    )
    if m == 0:
        raise inputs.error("a", "has an empty dimension")
    halves = _arrays.retype(_arrays.view(b.obj, b.kind, (k // 8 * n,)), b.kind, f16)
    plan = plan_for(m, n, k, "int4")
    return launch(a, halves, (m, n, k), True, plan, aligned=b.aligned(16), scales=s.obj)


def specializations() -> list:
    """(kernel, constexprs) of every specialization these ops launch (for PTX checks)."""
    from kaio_ops._matmul_kernels import MATMUL
    from kaio_ops.matmul import CONFIGS

    out = [(TRANSPOSE[t], {}) for t in (i8, u8)]
    for cfg in CONFIGS.values():
        for vec in (False, True):
            out.append((MATMUL[i8], cfg.for_itemsize(1).constexprs(True, vec)))
    out.append((MATMUL[u8], CONFIGS["128x256"].for_itemsize(1).constexprs(True, True)))
    for cfg in CONFIGS.values():
        for vec in (False, True):
            out.append((MATMUL[f16], cfg.constexprs(True, vec, 4)))
    return out
