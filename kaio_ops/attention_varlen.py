"""Variable-length (packed) flash attention: ``flash_attention_varlen`` and its backward.

A batch of sequences of different lengths, packed token after token with no padding, as
FlashAttention's ``flash_attn_varlen_func`` takes it: q [total_q, H, D], k and v
[total_k, Hkv, D] (H a multiple of Hkv), ``cu_seqlens_q`` and ``cu_seqlens_k`` int32 [B + 1]
(sequence b owns tokens cu[b] .. cu[b + 1]) and the longest lengths ``max_seqlen_q``,
``max_seqlen_k``, which size the grid. The offsets stay on the GPU: the kernels
(``kaio_ops._attention_varlen``) read them, so a call never synchronizes with the device
and can be captured in a CUDA graph. Under ``kaio.simulate()`` the offsets are on the host
and are checked too (increasing, within the arrays, no sequence longer than its max).

Causal attention is aligned bottom-right as in FlashAttention >= 2.1: query i of a sequence
with sq queries and sk keys sees keys j <= i + sk - sq (for sq == sk: j <= i, the same as
``flash_attention``'s ``causal``); a query that sees no key (sk < sq, or sk == 0) gets zeros.
"""

from __future__ import annotations

import math

import numpy as np

from kaio.types import bf16, f16, f32, i32
from kaio_ops import _arrays
from kaio_ops import _attention_hopper_varlen as hopper_varlen
from kaio_ops import _attention_hopper_varlen_bwd as hopper_varlen_bwd
from kaio_ops import _attention_tc as tc
from kaio_ops import _attention_varlen as kernels
from kaio_ops._plan import planned
from kaio_ops.attention import (
    FLASH_DIMS,
    _pow2_dim,
    bwd_tile,
    check_heads,
    dkdv_passes,
    hopper_gpu,
    tc_config,
    tc_shared_bytes,
)

__all__ = [
    "flash_attention_varlen",
    "flash_attention_varlen_bwd",
    "flash_attention_varlen_with_stats",
    "shipped",
]

MAX_BATCH = 65535  # sequences: the grid's z dimension


def _check_lengths(inputs: _arrays.Inputs, name: str, cu, total: int, max_name: str, limit):
    """Offsets on the host (NumPy, in the simulator): increasing from >= 0, at most
    ``total``, no sequence longer than ``limit`` (the max_seqlen argument)."""
    offsets = np.asarray(cu, np.int64)
    lengths = np.diff(offsets)
    if offsets[0] < 0 or (lengths < 0).any() or offsets[-1] > total:
        raise inputs.error(
            name,
            f"must increase from 0 and stay within the {total} packed tokens, got "
            f"{offsets.tolist()}",
        )
    if lengths.size and lengths.max() > limit:
        raise ValueError(
            f"{inputs.op}: {max_name} = {limit} is less than the longest sequence of "
            f"{name} ({int(lengths.max())} tokens); pass the longest length"
        )


def _check(
    op: str, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, inputs=None
):
    """Check the packed q [total_q, H, D], k, v [total_k, Hkv, D] (f16 or bf16, 16-byte
    aligned, D a multiple of 8 up to 256), the int32 offsets [B + 1] and the max lengths;
    returns the operands (q, k, v, cu_q, cu_k), (batch, heads, group, total_q, d, max_q,
    max_k) and the scale."""
    inputs = inputs or _arrays.Inputs(op)
    qa = inputs.array(q, "q", ndim=3, dtypes=(f16, bf16), form="[total_q, H, D]")
    ka = inputs.array(k, "k", ndim=3, form="[total_k, Hkv, D]")
    va = inputs.array(v, "v", ndim=3, shape=ka.shape, form="[total_k, Hkv, D]")
    total_q, h, d = qa.shape
    total_k, hkv, kd = ka.shape
    if h == 0 or d == 0:
        raise inputs.error("q", f"has an empty dimension: shape {qa.shape}")
    scale = check_heads(inputs, (qa, ka, va), h, hkv, d, kd, scale)
    cqa = inputs.array(cu_seqlens_q, "cu_seqlens_q", ndim=1, dtypes=(i32,), form="[B + 1]")
    if not 2 <= cqa.shape[0] <= MAX_BATCH + 1:
        raise inputs.error(
            "cu_seqlens_q",
            f"must hold B + 1 offsets for 1 to {MAX_BATCH} sequences, got shape {cqa.shape}",
        )
    cka = inputs.array(
        cu_seqlens_k, "cu_seqlens_k", ndim=1, shape=cqa.shape, dtypes=(i32,), form="[B + 1]"
    )
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{op}: {name} must be a non-negative int, got {value!r}")
    if cqa.kind == "numpy":  # the simulator: the offsets are on the host, check them
        _check_lengths(inputs, "cu_seqlens_q", cu_seqlens_q, total_q, "max_seqlen_q", max_seqlen_q)
        _check_lengths(inputs, "cu_seqlens_k", cu_seqlens_k, total_k, "max_seqlen_k", max_seqlen_k)
    # no sequence is longer than the packed arrays: a larger max only adds idle blocks
    dims = (cqa.shape[0] - 1, h, h // hkv, total_q, d,
            min(int(max_seqlen_q), total_q), min(int(max_seqlen_k), total_k))  # fmt: skip
    return (qa, ka, va, cqa, cka), dims, scale


def hopper_takes(qa, ka, dims: tuple, causal: bool, kernels=hopper_varlen) -> bool:
    """Whether the forward runs ``kaio_ops._attention_hopper_varlen`` (TMA, wgmma) rather
    than the mma.sync kernel: an sm_90 GPU (never under the simulator, whose tests launch
    the kernel directly; ``KAIO_HOPPER_ATTENTION=0`` opts out, as for ``flash_attention``),
    a head dim it takes (64, 128, 256), keys to read (a tensor map needs rows) and sequences
    long enough on average that it measured faster (``_attention_hopper_varlen.worthwhile``;
    the mean lengths are the packed totals over B, known without reading the offsets).
    ``kernels``: the module whose ``worthwhile`` decides (the backward's: ``hopper_bwd_takes``)."""
    if not hopper_gpu(qa):
        return False
    batch, _, _, total_q, d, max_q, max_k = dims
    return (
        max_q > 0
        and max_k > 0
        and kernels.worthwhile(total_q / batch, ka.shape[0] / batch, d, causal)
    )


def _forward(
    op: str, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale
):
    (qa, ka, va, cqa, cka), dims, scale = _check(
        op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale
    )
    if hopper_takes(qa, ka, dims, bool(causal)):
        return hopper_varlen.launch(qa, ka, va, cqa, cka, dims, bool(causal), scale)
    return _forward_mma(qa, ka, va, cqa, cka, dims, bool(causal), scale)


def _forward_mma(qa, ka, va, cqa, cka, dims: tuple, causal: bool, scale: float):
    """The mma.sync varlen forward (``_attention_varlen.varlen_fwd``) on checked operands:
    (out, lse)."""
    batch, heads, group, total_q, d, max_q, _ = dims
    out = _arrays.output(qa, qa.shape)
    lse = _arrays.output(qa, (heads, total_q), f32)
    if max_q == 0:  # no query at all
        return out, lse
    dp = _pow2_dim(d, FLASH_DIMS)
    cfg = tc_config(dp)
    rows = 16 * cfg["WARPS"]
    smem = tc_shared_bytes(dp, cfg["WARPS"], cfg["BN"])
    grid = (-(-max_q // rows), heads, batch)
    kernels.varlen_fwd[grid, 32 * cfg["WARPS"], _arrays.stream_of(qa), smem](
        *(a.arg(a.size) for a in (qa, ka, va)),
        _arrays.output_arg(qa, out, (qa.size,)),
        _arrays.output_arg(qa, lse, (heads * total_q,), f32),
        cqa.arg(), cka.arg(), total_q, heads, group, d, math.log2(math.e) * scale, bool(causal),
        DP=dp, **cfg, DT=qa.dtype,
    )  # fmt: skip
    return out, lse


@planned("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")
def flash_attention_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = False, scale: float | None = None,
):  # fmt: skip
    """Multi-head attention over a packed batch of variable-length sequences (FlashAttention's
    ``flash_attn_varlen_func``): q [total_q, H, D], k and v [total_k, Hkv, D] of f16 or bf16
    (H a multiple of Hkv: query head h reads K/V head h // (H // Hkv); D a multiple of 8 up to
    256; 16-byte aligned), ``cu_seqlens_q``, ``cu_seqlens_k`` int32 [B + 1] on the device
    (sequence b: tokens cu[b] .. cu[b + 1]), ``max_seqlen_q``, ``max_seqlen_k`` the longest
    lengths (ints on the host, at least the real ones). Scores scaled by ``scale`` (default
    1/sqrt(D)); ``causal`` aligned bottom-right (query i of a sequence of sq queries and sk
    keys sees keys j <= i + sk - sq). Returns [total_q, H, D] of q's dtype; tokens past
    cu_seqlens_q[B] are not written."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
    return _forward("flash_attention_varlen", *args)[0]


@planned("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")
def flash_attention_varlen_with_stats(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = False, scale: float | None = None,
):  # fmt: skip
    """``(out, lse)``: ``flash_attention_varlen`` and the natural logsumexp of each query row's
    scaled scores, f32 [H, total_q] (FlashAttention's varlen layout; -inf for a row that sees
    no key), which ``flash_attention_varlen_bwd`` takes."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
    return _forward("flash_attention_varlen_with_stats", *args)


def _check_bwd(op: str, do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, scale):  # fmt: skip
    """``_check`` and the backward's own operands: returns (qa, ka, va, da, la, cqa, cka),
    ``_check``'s dims, the scale and the output ``oa``."""
    inputs = _arrays.Inputs(op)
    (qa, ka, va, cqa, cka), dims, scale = _check(
        op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, inputs
    )
    da = inputs.array(do, "do", ndim=3, shape=qa.shape, form="[total_q, H, D] like q")
    oa = inputs.array(o, "o", ndim=3, shape=qa.shape, form="[total_q, H, D] like q")
    heads, total_q = dims[1], dims[3]
    la = inputs.array(
        lse, "lse", ndim=2, shape=(heads, total_q), dtypes=(f32,), form="[H, total_q]"
    )
    for a in (da, oa):
        if not a.aligned(16):
            raise inputs.error(a.name, "must start on a 16-byte boundary (16-byte copies)")
    return (qa, ka, va, da, la, cqa, cka), dims, scale, oa


@planned("do", "q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k")
def flash_attention_varlen_bwd(
    do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = False, scale: float | None = None,
):  # fmt: skip
    """Gradients ``(dq, dk, dv)`` of ``flash_attention_varlen`` (FlashAttention-2's backward on
    tensor cores, as ``flash_attention_bwd``) from the output gradient ``do`` and the output
    ``o`` [total_q, H, D], the inputs and ``lse`` [H, total_q] (f32) of
    ``flash_attention_varlen_with_stats``, with the same offsets, ``causal`` and ``scale``.
    dK and dV of a K/V head sum over the query heads of its group; no atomics (deterministic).
    Tokens past cu_seqlens[B] get no gradient written. On sm_90 the Hopper kernels
    (``_attention_hopper_varlen_bwd``) where they measured faster (``hopper_bwd_takes``)."""
    args = (do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    arrays, dims, scale, oa = _check_bwd("flash_attention_varlen_bwd", *args, scale)
    if hopper_bwd_takes(arrays[0], arrays[1], dims, bool(causal)):
        return hopper_varlen_bwd.launch(*arrays, oa, dims, bool(causal), scale)
    return _backward_mma(*arrays, oa, dims, bool(causal), scale)


def hopper_bwd_takes(qa, ka, dims: tuple, causal: bool) -> bool:
    """Whether the backward runs ``kaio_ops._attention_hopper_varlen_bwd`` (TMA, wgmma) rather
    than the mma.sync kernels: as ``hopper_takes`` for the forward, head dims 64, 128 and
    256 and mean lengths from which it measured faster
    (``_attention_hopper_varlen_bwd.worthwhile``)."""
    return hopper_takes(qa, ka, dims, causal, hopper_varlen_bwd)


def backward_mma(
    do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = False, scale: float | None = None,
):  # fmt: skip
    """``flash_attention_varlen_bwd`` on the mma.sync kernels whatever the GPU (what GPUs
    other than sm_90 run; for benchmarks and tests)."""
    args = (do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    arrays, dims, scale, oa = _check_bwd("flash_attention_varlen_bwd", *args, scale)
    return _backward_mma(*arrays, oa, dims, bool(causal), scale)


def backward_hopper(
    do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = False, scale: float | None = None,
):  # fmt: skip
    """``flash_attention_varlen_bwd`` on the Hopper kernels (sm_90, D 64, 128 or 256) whatever
    the lengths (for benchmarks and tests)."""
    args = (do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    arrays, dims, scale, oa = _check_bwd("flash_attention_varlen_bwd", *args, scale)
    return hopper_varlen_bwd.launch(*arrays, oa, dims, bool(causal), scale)


def _backward_mma(qa, ka, va, da, la, cqa, cka, oa, dims: tuple, causal: bool, scale: float):
    """The mma.sync varlen backward (``_attention_varlen.varlen_bwd_dq``, ``varlen_bwd_dkdv``)
    on checked operands: (dq, dk, dv)."""
    batch, heads, group, total_q, d, max_q, max_k = dims
    dq = _arrays.output(da, qa.shape)
    dk, dv = (_arrays.output(da, ka.shape) for _ in range(2))
    if max_q == 0 and max_k == 0:
        return dq, dk, dv
    dp = _pow2_dim(d, FLASH_DIMS)
    tile = bwd_tile(dp)
    stream = _arrays.stream_of(da)
    rows = total_q * heads
    delta = _arrays.output(da, (rows,), f32)
    flat = [a.arg(a.size) for a in (qa, ka, va, da)]
    out_flat = [_arrays.output_arg(da, x, (n,)) for x, n in
                ((dq, qa.size), (dk, ka.size), (dv, ka.size))]  # fmt: skip
    if rows:
        tc.row_dot[-(-rows // 8), 256, stream, 0](
            oa.arg(oa.size), flat[3], delta, rows, d, DT=qa.dtype
        )
    args = (cqa.arg(), cka.arg(), total_q, heads, group, d, math.log2(math.e) * scale, scale,
            bool(causal))  # fmt: skip
    smem = (128 + 2 * tile) * dp * 2
    lse_flat = la.arg(la.size)
    if max_q:
        kernels.varlen_bwd_dq[(-(-max_q // 64), heads, batch), 128, stream, smem](
            *flat, lse_flat, delta, out_flat[0], *args, DP=dp, BN=tile, DT=qa.dtype
        )
    if max_k:
        for with_dk, with_dv in dkdv_passes(dp):
            kernels.varlen_bwd_dkdv[(-(-max_k // 64), heads // group, batch), 128, stream, smem](
                *flat, lse_flat, delta, out_flat[1], out_flat[2], *args,
                DP=dp, BQ=tile, WITH_DK=with_dk, WITH_DV=with_dv, DT=qa.dtype,
            )  # fmt: skip
    return dq, dk, dv


def shipped():
    """(kernel, constexprs) of every specialization these ops launch."""
    for dtype in (f16, bf16):
        for dp in FLASH_DIMS:
            yield kernels.varlen_fwd, {"DP": dp, **tc_config(dp), "DT": dtype}
            yield kernels.varlen_bwd_dq, {"DP": dp, "BN": bwd_tile(dp), "DT": dtype}
            for with_dk, with_dv in dkdv_passes(dp):
                flags = {"WITH_DK": with_dk, "WITH_DV": with_dv}
                yield kernels.varlen_bwd_dkdv, {"DP": dp, "BQ": bwd_tile(dp), **flags, "DT": dtype}
