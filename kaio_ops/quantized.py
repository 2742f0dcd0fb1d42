"""Quantized matmuls on tensor cores: W8A8 int8 (``matmul_int8``) and W4A16 int4
(``matmul_int4``).

``matmul_int8(a, b, scale)`` multiplies int8 (or uint8 bytes read as int8) ``a`` [M, K] and
``b`` [K, N] with ``mma.sync`` m16n8k32 s8 -> s32, exactly, and applies ``scale`` in the
epilogue: ``f32(a @ b) * scale``; on sm_90 from ``_int8_hopper.MIN_M`` rows (K % 16 == 0)
with ``wgmma`` s8 -> s32 instead (``kaio_ops._int8_hopper``, the same bits). The other
kernel is the one of the 16-bit matmuls (``kaio_ops._matmul_kernels``) specialized for
8-bit elements; since ``ldmatrix`` can only transpose 16-bit elements, B is first transposed
to N x K by a small kernel (2 K N bytes of traffic, a few percent of a large product); the
wgmma kernel reads that transpose too (PTX has no transposed 8-bit wgmma).

``matmul_int4(a, b_packed, scales)`` multiplies f16 ``a`` [M, K] by GPTQ-style int4 weights:
``b_packed`` [K/8, N] 32-bit words of 8 signed nibbles (low nibble first, k = 8 * row + i),
``scales`` f16 [K/128, N]; the weight is ``scales[k // 128, n] * q`` rounded to f16, made in
registers right before the f16 ``mma`` (the same kernel, ``QUANT = 4``): the weights cross
memory at a quarter of f16's bytes, which is the point for decode shapes. On sm_90 past 16
rows ``kaio_ops._int4_hopper`` runs it on ``wgmma`` (the words dequantized in registers as
the A operand of C^T = W^T a^T); ``out_dtype`` rounds the f32 sums once. Decode shapes
(M <= 64, on sm_90 M <= 16, N % 4 == 0, aligned operands) take ``kaio_ops._int4_decode``
instead (and so does
``qkv_project_int4``, one launch for the three weights), which reads
the words straight into ``mma`` fragments with no shared-memory staging.

``qkv_project_int8(x, wq, wk, wv, sq, sk, sv)`` (W8A16: int8 weights [K, N], a float scale
each, ``QUANT = 8``) and ``qkv_project_int4(x, wq, wk, wv, sq, sk, sv)`` (the weights and
scales of ``matmul_int4``) are the Q, K and V projections of one f16 ``x`` [M, K], in f16,
from one launch of ``qkv_kernel``: its grid covers the three outputs' column tiles and each
block runs the tile of the projection its columns belong to, the tile of the plain kernel
(at decode, a K split adds a second launch that sums the slices of the three outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import kaio
from kaio import f16, f32, i32, u8, u32
from kaio.types import i8
from kaio_ops import (
    _arrays,
    _int4_decode,
    _int4_hopper,
    _int8_decode,
    _int8_hopper,
    _prefill,
)
from kaio_ops._matmul_kernels import matmul_kernel, qkv_kernel, sum_qkv_slices
from kaio_ops._plan import planned
from kaio_ops.fp8 import _units
from kaio_ops.linear import out_type
from kaio_ops.matmul import (
    CONFIGS,
    SKINNY,
    SKINNY_M,
    Plan,
    _no_scales,
    k_slices,
    launch,
    plan_for,
)

__all__ = [
    "matmul_int4",
    "matmul_int8",
    "project_int8",
    "qkv_project_int4",
    "qkv_project_int8",
]

GROUP = 128  # int4 weights share a scale per 128 values along K
FALLBACK = "64x64"  # the fused projections' tile for shapes that need element copies
TILE = 32
ROWS_PER_PASS = 8


@kaio.gpu_kernel(block_size=(TILE, ROWS_PER_PASS))
def transpose_kernel(
    src: DT[:, :],  # noqa: F821  (DT: a dtype constexpr parameter)
    dst: DT[:, :],  # noqa: F821
    R: u32,
    C: u32,
    DT: kaio.constexpr,
):
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


def transpose(x: _arrays.Operand):
    """A new array of ``x``'s kind holding ``x`` [R, C] transposed to [C, R]."""
    r, c = x.shape
    out = _arrays.output(x, (c, r))
    grid = (math.ceil(c / TILE), math.ceil(r / TILE))
    transpose_kernel[grid, None, _arrays.stream_of(x), 0](x.obj, out, r, c, DT=x.dtype)
    return out


@planned("a", "b")
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
    alpha = _scale(inputs, scale, "scale")
    if _int8_decode.fits(a, b, m, n, k):  # decode: one launch, B read as it is
        return _int8_decode.matmul(a, b, alpha, (m, n, k))
    bt = transpose(b)
    if _int8_hopper.takes(a, m, k):
        out = _arrays.output(a, (m, n), f32)
        _int8_hopper.launch(
            _units(a.obj, a.kind), _units(bt, a.kind), _arrays.output_arg(a, out, (m, n), f32),
            alpha, m, n, _arrays.multiprocessors(a), _arrays.stream_of(a),
        )  # fmt: skip
        return out
    flat_b = _arrays.output_arg(a, bt, (n * k,))
    return launch(a, flat_b, (m, n, k), True, plan_for(a, m, n, k, "int8"), alpha=alpha)


def _scale(inputs: _arrays.Inputs, scale, name: str) -> float:
    """The int8 scale ``scale`` (argument ``name``), which must be a Python int or float."""
    if not isinstance(scale, int | float):
        raise inputs.error(name, f"must be a Python float, got {type(scale).__name__}")
    return float(scale)


@planned("a", "b_packed", "scales")
def matmul_int4(a, b_packed, scales, *, out_dtype=None):
    """``a @ W`` for f16 ``a`` [M, K] and int4 weights ``W[k, n] = scales[k // 128, n] * q``
    (q the signed nibble ``k % 8`` of word ``b_packed[k // 8, n]``, low nibble first;
    ``b_packed`` u32 or int32 [K/8, N], ``scales`` f16 [K/128, N], K % 128 == 0): f32 sums,
    rounded once to ``out_dtype`` (f32 by default; f16 or bf16). On sm_90 past 16 rows the
    wgmma kernel of ``kaio_ops._int4_hopper`` (from ``DEQUANT_M`` rows, a measured option now
    off, the weight made f16 once, then ``kaio_ops.matmul``); up to 64 rows (16 on sm_90) the
    decode kernel (``kaio_ops._int4_decode``)."""
    inputs = _arrays.Inputs("matmul_int4")
    out = out_type("matmul_int4", out_dtype, f32)
    a = _activations(inputs, a, "a", GROUP)
    m, k = a.shape
    b, s = _int4_operands(inputs, k, b_packed, "b_packed", scales, "scales")
    n = b.shape[1]
    if _int4_hopper.takes(a, b, s):
        return _int4_hopper.run(a, b, s, out)
    if _int4_decode.fits(a, (b, s)):
        return _int4_decode.matmul(a, b, s, out)
    if _prefill.fits_int4(a, (b, s)):
        c = _prefill.matmul_int4(a, b, s)
    else:
        plan = plan_for(a, m, n, k, "int4")
        flat = _flat_halves(b)
        c = launch(a, flat, (m, n, k), True, plan, aligned=b.aligned(16), scales=s.obj)
    return c if out == f32 else _int4_hopper.finish(a, c, 1, out)


def _activations(inputs: _arrays.Inputs, a, name: str, group: int = 1) -> _arrays.Operand:
    """The f16 activations ``a`` [M, K], M >= 1 and K a positive multiple of ``group``."""
    a = inputs.array(a, name, ndim=2, dtypes=(f16,), form="[M, K]")
    m, k = a.shape
    if group > 1 and (k % group or k == 0):
        raise inputs.error(
            name, f"needs K a positive multiple of {group} (the group size), got {k}"
        )
    if 0 in (m, k):
        raise inputs.error(name, "has an empty dimension")
    return a


def _int4_operands(inputs: _arrays.Inputs, k: int, b_packed, b_name: str, scales, s_name: str):
    """The checked int4 weights for K = ``k``: (``b_packed`` u32 or int32 [K/8, N],
    ``scales`` f16 [K/128, N])."""
    b = inputs.array(b_packed, b_name, ndim=2, dtypes=(u32, i32), form="[K/8, N]")
    n = b.shape[1]
    if b.shape[0] != k // 8 or n == 0:
        raise inputs.error(b_name, f"must have shape [K/8, N] = [{k // 8}, N >= 1], got {b.shape}")
    s = inputs.array(
        scales, s_name, ndim=2, dtypes=(f16,), shape=(k // GROUP, n), form="[K/128, N]"
    )
    return b, s


def _flat_halves(w: _arrays.Operand):
    """The contiguous array ``w`` (an even number of bytes a row) as a flat f16 kernel
    argument."""
    return w.arg(w.size * w.dtype.itemsize // 2, dtype=f16)


@dataclass(frozen=True)
class Weights:
    """One quantized weight matrix as ``qkv_kernel`` reads it: ``halves``, its bytes as a
    flat f16 array (int8: the K x N bytes; int4: the K/8 x N words), ``n`` output columns,
    ``row`` halves per row of the matrix, the int4 group ``scales`` (an unused 1 x 1 array
    for int8), the int8 ``scale`` (1 for int4), whether the bytes start on a 16-byte
    boundary, and the checked ``source`` (the packed words or the int8 matrix)."""

    halves: object
    n: int
    row: int
    scales: object
    scale: float
    aligned: bool
    source: _arrays.Operand


def _int4_weights(b: _arrays.Operand, s: _arrays.Operand) -> Weights:
    """The int4 ``Weights`` of checked packed words ``b`` [K/8, N] and group scales ``s``
    (``_int4_operands``)."""
    n = b.shape[1]
    return Weights(_flat_halves(b), n, 2 * n, s.obj, 1.0, b.aligned(16), b)


def _int8_weights(inputs: _arrays.Inputs, x, w, w_name: str, scale, s_name: str) -> Weights:
    """Checked int8 ``Weights`` for activations ``x`` [M, K]: ``w`` int8 or uint8 [K, N], N
    even, and its float ``scale``."""
    k = x.shape[1]
    w = inputs.array(w, w_name, ndim=2, dtypes=(i8, u8), form="[K, N]")
    n = w.shape[1]
    if w.shape[0] != k or n == 0 or n % 2:
        raise inputs.error(
            w_name,
            f"must have shape [K, N] = [{k}, N] with N even (the kernel reads the bytes in "
            f"pairs), got {w.shape}",
        )
    alpha = _scale(inputs, scale, s_name)
    return Weights(_flat_halves(w), n, n // 2, _no_scales(x), alpha, w.aligned(16), w)


def _qkv_plan(x: _arrays.Operand, widths: list[int], k: int, quant: int, vec: bool = True) -> Plan:
    """The plan of a fused launch for outputs of ``widths`` columns: at decode shapes, the K
    split a call of the widest weight alone takes (a block's K loop is the latency of a
    skinny product, so blocks do no more of it than in the separate calls); otherwise the
    tile chosen for all the columns together, except that shapes needing element copies
    (``vec`` False) take the 64x64 tile: one fallback specialization, not four (each holds
    the code of three tiles)."""
    m = x.shape[0]
    if m > SKINNY_M and not vec:
        return Plan(FALLBACK)
    return plan_for(x, m, max(widths) if m <= SKINNY_M else sum(widths), k, f"qkv_int{quant}")


def _project(x: _arrays.Operand, weights: list[Weights], quant: int) -> list:
    """``f16(scale * x @ W)`` for each of the 1 to 3 ``weights`` (int4 when ``quant`` is 4,
    int8 when 8), from one launch of ``qkv_kernel`` (two when K is split: the second sums
    the slices of all of them); int8 weights at prefill on sm_90 take ``_prefill``."""
    sources = [w.source for w in weights]
    if quant == 8 and _prefill.fits_int8(x, *sources):
        return list(_prefill.qkv_int8(x, sources, [w.scale for w in weights]))
    m, k = x.shape
    widths = [w.n for w in weights]
    vec = k % 8 == 0 and x.aligned(16) and all(w.row % 8 == 0 and w.aligned for w in weights)
    plan = _qkv_plan(x, widths, k, quant, vec)
    cfg = CONFIGS[plan.config]
    split, k_slice = k_slices(k, plan.split, cfg.bk)
    outs = [_arrays.output(x, (m, n), f16) for n in widths]
    split_out = [_arrays.output(x, (split * m, n), f32) for n in widths] if split > 1 else outs
    weights, targets = _arrays.three(weights), _arrays.three(split_out)
    scales = [w.scale for w in weights]
    columns = widths + [0] * (3 - len(widths))
    tiles = math.ceil(m / cfg.bm) * sum(math.ceil(n / cfg.bn) for n in widths)
    stream = _arrays.stream_of(x)
    config = ((tiles, 1, split), cfg.threads, stream, cfg.shared_bytes(True))
    qkv_kernel[config](
        x.arg(m * k), *(w.halves for w in weights), *targets, *(w.scales for w in weights),
        m, *columns, k, k_slice, *(scales if split == 1 else [1.0] * 3),
        **cfg.constexprs(True, vec, quant), OUT=f16 if split == 1 else f32,
    )  # fmt: skip
    if split > 1:
        grid = (math.ceil(m * sum(widths) / 256), 256, stream, 0)
        sum_qkv_slices[grid](*targets, *_arrays.three(outs), m, *columns, *scales, SPLIT=split)
    return outs


@planned("x", "wq", "wk", "wv")
def qkv_project_int8(x, wq, wk, wv, sq: float, sk: float, sv: float) -> tuple:
    """``(q, k, v)``, each ``f16(f32(x @ w) * s)``, for f16 ``x`` [M, K] and the int8 (or
    uint8, read as int8) weights ``wq``, ``wk``, ``wv`` [K, N] (N even, one N each) with
    their float scales: W8A16, the weights made f16 in registers, exact products summed in
    f32, one launch for the three."""
    inputs = _arrays.Inputs("qkv_project_int8")
    x = _activations(inputs, x, "x")
    named = ((wq, "wq", sq, "sq"), (wk, "wk", sk, "sk"), (wv, "wv", sv, "sv"))
    return tuple(_project(x, [_int8_weights(inputs, x, *args) for args in named], 8))


@planned("x", "wq", "wk", "wv", "sq", "sk", "sv")
def qkv_project_int4(x, wq, wk, wv, sq, sk, sv) -> tuple:
    """``(q, k, v)``, each ``f16(x @ W)``, for f16 ``x`` [M, K] (K % 128 == 0) and the int4
    weights ``wq``, ``wk``, ``wv`` (u32 or int32 [K/8, N], one N each) with their f16 group
    scales ``sq``, ``sk``, ``sv`` [K/128, N], packed as for ``matmul_int4``; f32
    accumulation, one launch for the three (on sm_90 past 16 rows: one launch of
    ``matmul_int4``'s wgmma kernel each)."""
    inputs = _arrays.Inputs("qkv_project_int4")
    x = _activations(inputs, x, "x", GROUP)
    named = ((wq, "wq", sq, "sq"), (wk, "wk", sk, "sk"), (wv, "wv", sv, "sv"))
    operands = [_int4_operands(inputs, x.shape[1], *args) for args in named]
    if all(_int4_hopper.takes(x, b, s) for b, s in operands):
        return tuple(_int4_hopper.run(x, b, s, f16) for b, s in operands)
    if _int4_decode.fits(x, *operands):
        return _int4_decode.qkv(x, operands)
    if _prefill.fits_int4(x, *operands):
        return _prefill.qkv_int4(x, operands)
    return tuple(_project(x, [_int4_weights(b, s) for b, s in operands], 4))


def project_int8(x, w, scale: float):
    """``f16(f32(x @ w) * scale)`` for f16 ``x`` [M, K] and one int8 (or uint8) weight ``w``
    [K, N], N even: ``qkv_project_int8``'s kernel with one weight (its baseline)."""
    inputs = _arrays.Inputs("project_int8")
    x = _activations(inputs, x, "x")
    return _project(x, [_int8_weights(inputs, x, w, "w", scale, "scale")], 8)[0]


def qkv_constexprs(config: str, vec: bool, quant: int, out) -> dict:
    """``qkv_kernel``'s constexprs for tile ``config`` (a key of ``CONFIGS``), 16-byte
    copies or not, ``quant`` (4 or 8) and output type ``out`` (f16, or f32 partial products
    when K is split)."""
    return {**CONFIGS[config].constexprs(True, vec, quant), "OUT": out}


def specializations() -> list:
    """(kernel, constexprs) of every specialization these ops launch (for PTX checks)."""
    out = [(transpose_kernel, {"DT": t}) for t in (i8, u8)]
    for cfg in CONFIGS.values():
        for vec in (False, True):
            out.append((matmul_kernel, {**cfg.for_itemsize(1).constexprs(True, vec), "DT": i8}))
    out.append(
        (matmul_kernel, {**CONFIGS["128x256"].for_itemsize(1).constexprs(True, True), "DT": u8})
    )
    for cfg in CONFIGS.values():
        for vec in (False, True):
            out.append((matmul_kernel, {**cfg.constexprs(True, vec, 4), "DT": f16}))
    for quant in (4, 8):
        # 16-byte copies: every tile; element copies: the skinny and the fallback tiles
        tiles = [(name, True) for name in CONFIGS] + [(SKINNY, False), (FALLBACK, False)]
        out += [(qkv_kernel, qkv_constexprs(c, vec, quant, f16)) for c, vec in tiles]
        # a K split (decode): f32 partial products, summed by sum_qkv_slices
        out += [(qkv_kernel, qkv_constexprs(SKINNY, vec, quant, f32)) for vec in (False, True)]
    out += [(sum_qkv_slices, {"SPLIT": s}) for s in (2, 16)]
    out += _int8_decode.specializations()
    return out + _int4_decode.specializations() + _prefill.specializations()
