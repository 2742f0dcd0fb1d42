"""Variable-length (packed) flash attention on tensor cores, written in the kaio DSL: the
kernels of ``kaio_ops.attention_varlen`` (the host side).

A batch of B sequences of different lengths is packed token after token: q [total_q, H, D],
k and v [total_k, Hkv, D]; sequence b owns the tokens cu_q[b] .. cu_q[b + 1] of q and
cu_k[b] .. cu_k[b + 1] of k and v (``cu_seqlens``, FlashAttention's convention, int32 on the
GPU). Each kernel reads its sequence's offsets from cu_seqlens itself, so the host never
reads them (no synchronization; the launches can be captured in a CUDA graph): the grid
covers the longest sequence (``max_seqlen``), and a block whose tile lies past its own
sequence's end returns at once.

The work of each block is that of the dense kernels of ``kaio_ops._attention_tc``, whose
bodies are device functions over row bases and strides (``attend_rows``, ``dq_rows``,
``dkdv_rows``): a head of a packed array is a matrix whose rows are H * D (Hkv * D)
elements apart. Causal attention is aligned bottom-right, as FlashAttention's (>= 2.1):
query i of a sequence of sq queries and sk keys sees keys j <= i + sk - sq (for sq == sk,
j <= i). Row logsumexps are f32 [H, total_q] (FlashAttention's varlen layout); the
backward's delta = rowsum(dO * O) is f32 [total_q, H] (``row_dot`` over the packed rows).
"""

# ruff: noqa: F821  (DT and OT in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import f32, i32, u32
from kaio_ops._attention_tc import attend_rows, dkdv_rows, dq_rows


@kaio.gpu_func
def sequence(cu_q: i32[:], cu_k: i32[:], b: u32) -> tuple[u32, u32, u32, u32]:
    """``(start_q, sq, start_k, sk)``: where sequence b's queries and keys start in the
    packed arrays and how many there are."""
    start_q = u32(cu_q[b])
    start_k = u32(cu_k[b])
    return start_q, u32(cu_q[b + 1]) - start_q, start_k, u32(cu_k[b + 1]) - start_k


@kaio.gpu_kernel
def varlen_fwd(
    q: DT[:], k: DT[:], v: DT[:], out: DT[:], lse: f32[:], cu_q: i32[:], cu_k: i32[:],
    total_q: u32, heads: u32, group: u32, d: u32, scale_log2: f32, causal: u32,
    DP: kaio.constexpr, WARPS: kaio.constexpr, BN: kaio.constexpr, MIN_BLOCKS: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """out and lse of the 16 * WARPS query rows of block x (heaviest causal tiles first) of
    head block y of sequence block z: q, out [total_q, heads, d], k, v [total_k,
    heads / group, d], lse [heads, total_q], all flat (d % 8 == 0, 16-byte aligned)."""
    BM = 16 * WARPS
    kaio.launch_bounds(32 * WARPS, MIN_BLOCKS)
    h = kaio.block_idx_y()
    start_q, sq, start_k, sk = sequence(cu_q, cu_k, kaio.block_idx_z())
    q0 = (kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * BM
    if q0 >= sq:
        return
    kv_heads = heads // group
    q_base = (start_q * heads + h) * d
    k_base = (start_k * kv_heads + h // group) * d
    attend_rows(
        q, k, v, out, lse,
        q_base=q_base, q_stride=heads * d,
        k_base=k_base, k_stride=kv_heads * d,
        v_base=k_base, v_stride=kv_heads * d,
        o_base=q_base, o_stride=heads * d,
        lse_base=h * total_q + start_q,
        sq=sq, sk=sk, d=d, dv=d, q0=q0, causal=causal, shift_q=sq, shift_k=sk,
        scale_log2=scale_log2, DP=DP, WARPS=WARPS, BN=BN, VEC=True, DT=DT, OT=DT,
    )  # fmt: skip


@kaio.gpu_kernel
def varlen_bwd_dq(
    q: DT[:], k: DT[:], v: DT[:], do: DT[:], lse: f32[:], delta: f32[:], dq: DT[:],
    cu_q: i32[:], cu_k: i32[:], total_q: u32, heads: u32, group: u32, d: u32,
    scale_log2: f32, scale: f32, causal: u32,
    DP: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """dQ of the 64 query rows of block x of head block y of sequence block z (see
    ``_attention_tc.attention_bwd_dq``); delta [total_q, heads]."""
    kaio.launch_bounds(128, 1)
    h = kaio.block_idx_y()
    start_q, sq, start_k, sk = sequence(cu_q, cu_k, kaio.block_idx_z())
    q0 = (kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * 64
    if q0 >= sq:
        return
    kv_heads = heads // group
    dq_rows(
        q, k, v, do, lse, delta, dq,
        q_base=(start_q * heads + h) * d, q_stride=heads * d,
        k_base=(start_k * kv_heads + h // group) * d, k_stride=kv_heads * d,
        lse_base=h * total_q + start_q, delta_base=start_q * heads + h, delta_stride=heads,
        sq=sq, sk=sk, d=d, q0=q0, causal=causal, shift_q=sq, shift_k=sk,
        scale_log2=scale_log2, scale=scale, DP=DP, BN=BN, DT=DT, OT=DT,
    )  # fmt: skip


@kaio.gpu_kernel
def varlen_bwd_dkdv(
    q: DT[:], k: DT[:], v: DT[:], do: DT[:], lse: f32[:], delta: f32[:], dk: DT[:], dv: DT[:],
    cu_q: i32[:], cu_k: i32[:], total_q: u32, heads: u32, group: u32, d: u32,
    scale_log2: f32, scale: f32, causal: u32,
    DP: kaio.constexpr, BQ: kaio.constexpr, WITH_DK: kaio.constexpr, WITH_DV: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """dK and dV of the 64 keys of block x of K/V head block y of sequence block z, summed
    over the ``group`` query heads that read it (see ``_attention_tc.attention_bwd_dkdv``)."""
    kaio.launch_bounds(128, 1)
    kvh = kaio.block_idx_y()
    start_q, sq, start_k, sk = sequence(cu_q, cu_k, kaio.block_idx_z())
    k0 = kaio.block_idx_x() * 64
    if k0 >= sk:
        return
    kv_heads = heads // group
    first_head = kvh * group
    dkdv_rows(
        q, k, v, do, lse, delta, dk, dv,
        q_base=(start_q * heads + first_head) * d, q_head=d, q_stride=heads * d,
        k_base=(start_k * kv_heads + kvh) * d, k_stride=kv_heads * d,
        lse_base=first_head * total_q + start_q, lse_head=total_q,
        delta_base=start_q * heads + first_head, delta_head=1, delta_stride=heads,
        group=group, sq=sq, sk=sk, d=d, k0=k0, causal=causal, shift_q=sq, shift_k=sk,
        scale_log2=scale_log2, scale=scale,
        DP=DP, BQ=BQ, WITH_DK=WITH_DK, WITH_DV=WITH_DV, DT=DT, OT=DT,
    )  # fmt: skip
