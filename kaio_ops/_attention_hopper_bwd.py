"""The Hopper (sm_90a) flash-attention backward behind ``kaio_ops.flash_attention_bwd``:
FlashAttention-2's deterministic pair of kernels (no atomics) rebuilt on FlashAttention-3's
machinery (TMA, an mbarrier ring filled by a producer warp, ``WG`` consumer warpgroups on
``wgmma``, ``setmaxnreg``), generic over the element type ``DT`` (f16 or bf16). The
products and the ring are those of the forward, ``kaio_ops._attention_hopper``, whose
helpers this module calls.

``attention_bwd_dkdv_wgmma``: a block owns ``64 * WG`` keys of one K/V head (each consumer
warpgroup 64 of them, their dK and dV accumulators in registers) and loops over the query
tiles of ``BM`` rows of every query head of its group (causal: those at or past its first
key). Per query tile, transposed so that the keys are the wgmma's M:

- S^T = K Q^T and dP^T = V dO^T (both operands in shared memory, K-major, as the forward's
  S = Q K^T), issued together;
- P^T = exp2(S^T * scale * log2(e) - lse2[query]) (masked), dS^T = P^T (dP^T - delta[query]);
  a thread's columns are queries, so lse and delta come with the tile into shared memory
  (TMA, ``TSTATS`` 1) or from global memory (8-byte loads, 0);
- dV += P^T dO and dK += dS^T Q, with P^T and dS^T from registers (the accumulators of two
  adjacent n8 tiles rounded to DT pairs are a k-step's A fragment) and dO, Q N-major from
  the ring stage.

``attention_bwd_dq_wgmma``: a block owns ``64 * WG`` query rows of one head (Q and dO loaded
once) and loops over the key tiles of ``BN`` keys (causal: up to the diagonal) in the ring:
S = Q K^T and dP = dO V^T issued together, dS = P (dP - delta) in registers, dQ += dS K (dS
from registers, K N-major). The rows' lse and delta come once with Q and dO (TMA), two
registers a thread.

Both end by scaling (dK, dQ by the softmax scale) and storing from registers; GQA's dK and dV
are summed over the group's heads inside the block, in a fixed order: deterministic.

With ``DQ`` (``config(d)["fused"]``, ``launch(fused=True)``; not ``flash_attention_bwd``'s
default: ``FUSED``) the dK/dV kernel also computes dQ, FlashAttention-3's one-kernel
backward: each query tile's dS^T goes to shared memory (``store_ds``), both warpgroups
compute dQ = dS K for their half of the columns (``issue_dq``) and add it to an f32 buffer
(``dq_zero`` before, ``dq_convert`` after): with atomics from the registers (``add_dq``) or
through ``dq_s`` and the producer warpgroup's other warps (``write_dq``: atomics a row at a
time, or ``kaio.bulk_reduce_add``); keys past sk are masked there (their dS would reach
dQ).
``DQ`` 5 stores each tile's dQ in fragment order (``store_dq_frags``) and adds it with one
bulk reduction to a buffer of whole 64-row tiles (``dq_convert_tiles`` reorders it).
``delta`` = rowsum(dO * O) comes from ``_attention_tc.row_dot`` (the host).

Shared tiles (128-byte swizzle, 64-column blocks): the tiles loaded once ``[D / 64, 64 * WG,
64]`` (K and V, resp. Q and dO), the ring's stages ``[STAGES, D / 64, R, 64]`` (Q and dO of
``R = BM`` rows, resp. K and V of ``R = BN`` rows), the lse and delta (f32), then the
barriers: ``bars[0, s]`` stage s landed (its tiles), ``bars[1, s]`` stage s free (an arrival
from each consumer warp, ``release``), ``turn[0]`` the tiles loaded once landed. The tensor
maps see the arrays as ``[rows, D]``: a tile reaching past a head's rows reads the next
head's (or TMA's zeros past the array); those rows are masked (zero probabilities and dS)
and their outputs not stored, which needs the inputs finite there, as they are for any
finite input.

With ``COLS`` 1 both kernels are the varlen backward's (``_attention_hopper_varlen_bwd``):
a block z a sequence of packed arrays seen as [tokens, heads * D] (a head's rows from its
sequence's start, read from ``cu_seqlens`` on the GPU, its columns from h * D:
``produce``'s ``COLS``), rows stored by a base and a stride (``store_tile``), query rows
shifted for the bottom-right causal mask.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import functools

import kaio
from kaio import bool_, f32, i32, u32, u64
from kaio_ops._attention_hopper import (
    PRODUCER_REGS,
    SHARED_LIMIT,
    SW,
    consumer_registers,
    issue_pv,
    issue_s,
    pack_p,
)
from kaio_ops._attention_hopper_common import (
    kv_head_and_tiles,
    next_tile,
    query_block,
    store_pairs,
    thread_roles,
)
from kaio_ops._attention_tc import POS_INF, fill_delta, lse_log2
from kaio_ops._matmul_hopper import next_stage


@kaio.gpu_func
def produce(
    a_s: DT[:, :, :], b_s: DT[:, :, :], x_s: DT[:, :, :, :], y_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], ta: kaio.tensormap,
    tb: kaio.tensormap, tx: kaio.tensormap, ty: kaio.tensormap, tl: kaio.tensormap,
    td: kaio.tensormap, once_row: i32, ring_row: i32, head_stride: i32, heads_n: i32,
    first: i32, n_tiles: i32, D: kaio.constexpr, ONCE: kaio.constexpr, R: kaio.constexpr,
    STAGES: kaio.constexpr, STATS: kaio.constexpr, DT: kaio.constexpr,
    COLS: kaio.constexpr = 0, once_col: i32 = 0, ring_col: i32 = 0, stat_at: i32 = 0,
    stat_stride: i32 = 0, WRAP: kaio.constexpr = 0, start: i32 = 0, kb: i32 = 0, st: i32 = 0,
    ph: u32 = 0, ring0: i32 = 0, kv_ph: i32 = -1,
) -> tuple[i32, u32]:  # fmt: skip
    """The producer's copies: ``ONCE`` rows of ``ta``, ``tb`` from ``once_row`` into a_s,
    b_s (once, on ``turn[0]``), then for each head j < heads_n and tile t in first ..
    n_tiles the ``R`` rows from ``ring_row + j * head_stride + t * R`` of ``tx``, ``ty``
    into the ring's next stage (on its "landed" barrier), once the consumers freed it. The
    rows' lse and delta (``tl``, ``td``: [1, rows] f32) go to ``stats[0 and 1, stage]``
    with each ring tile where ``STATS`` is 1, to ``stats[0 and 1, 0]`` with the tiles loaded
    once where it is 2 (0: not at all). ``COLS`` 1 (the varlen kernels: heads side by side
    in the columns of [tokens, heads * D]): the tiles loaded once are the D columns from
    ``once_col``, head j's ring tiles those from ``ring_col + j * D``, and the stats of a
    row r of head j are at ``r + stat_at + j * stat_stride`` (0: columns from 0, stats at
    the rows). ``WRAP`` 1 (``COLS`` 0): the walk over (head, tile) begins at its item
    ``start`` and wraps around past the last head (``walk_start``, ``next_tile_wrapped``).
    Several walks in turn (a persistent block's work items): the tiles loaded once go to
    buffer ``kb`` (their 64-column blocks from ``kb`` D / 64) on ``turn[kb]``, once with
    ``kv_ph`` >= 0 ``turn[2 + kb]`` (the consumers' last reads of that buffer) completed
    phase ``kv_ph``; the ring goes on from stage ``st`` of parity ``ph`` after ``ring0``
    tiles. Returns the ring's next stage and parity."""
    C = D // 64
    STATS_ONCE = 2 * ONCE * 4 if STATS == 2 else 0
    if kv_ph >= 0:
        kaio.mbarrier_wait(turn, 2 + kb, u32(kv_ph))
    kaio.mbarrier_arrive_expect_tx(turn, kb, u32(2 * ONCE * D * 2 + STATS_ONCE))
    for c in kaio.static_range(C):
        kaio.tma_load_2d(a_s, (kb * C + c, 0, 0), ta, once_row, once_col + c * 64, turn, kb)
        kaio.tma_load_2d(b_s, (kb * C + c, 0, 0), tb, once_row, once_col + c * 64, turn, kb)
    if STATS == 2:
        kaio.tma_load_2d(stats, (0, 0, 0), tl, 0, once_row + stat_at, turn, 0)
        kaio.tma_load_2d(stats, (1, 0, 0), td, 0, once_row + stat_at, turn, 0)
    STATS_RING = 2 * R * 4 if STATS == 1 else 0
    t = first  # the tile of head row0 / head_stride: a counter, not divisions
    row0 = ring_row
    if WRAP:
        t, row0 = walk_start(start, first, n_tiles, ring_row, head_stride)
    col = i32(ring_col)  # COLS: head j's first column, its stats' offset
    sat = i32(stat_at)
    for i in range(heads_n * kaio.max(n_tiles - first, 0)):
        row = row0 + t * R
        at = sat
        c0 = col
        t += 1  # written out: ``next_tile`` here changed the dK/dV kernel's SASS
        if t == n_tiles:
            t = first
            row0 += head_stride
            if WRAP and row0 == ring_row + heads_n * head_stride:
                row0 = ring_row
            if COLS:
                col += D
                sat += stat_stride
        if i + ring0 >= STAGES:  # stage st held tile i - STAGES: wait until it is free
            kaio.mbarrier_wait(bars, (1, st), ph ^ 1)
        kaio.mbarrier_arrive_expect_tx(bars, (0, st), u32(2 * R * D * 2 + STATS_RING))
        for c in kaio.static_range(C):
            if COLS:
                kaio.tma_load_2d(x_s, (st, c, 0, 0), tx, row, c0 + c * 64, bars, (0, st))
                kaio.tma_load_2d(y_s, (st, c, 0, 0), ty, row, c0 + c * 64, bars, (0, st))
            else:
                kaio.tma_load_2d(x_s, (st, c, 0, 0), tx, row, c * 64, bars, (0, st))
                kaio.tma_load_2d(y_s, (st, c, 0, 0), ty, row, c * 64, bars, (0, st))
        if STATS == 1:
            if COLS:
                kaio.tma_load_2d(stats, (0, st, 0), tl, 0, row + at, bars, (0, st))
                kaio.tma_load_2d(stats, (1, st, 0), td, 0, row + at, bars, (0, st))
            else:
                kaio.tma_load_2d(stats, (0, st, 0), tl, 0, row, bars, (0, st))
                kaio.tma_load_2d(stats, (1, st, 0), td, 0, row, bars, (0, st))
        st, ph = next_stage(st, ph, STAGES)
    return st, ph


@kaio.gpu_func
def walk_start(s: i32, first: i32, n_tiles: i32, at_first: i32, stride: i32) -> tuple[i32, i32]:
    """``(t, at)`` of item ``s`` of a walk over the tiles ``first`` .. ``n_tiles`` of each
    head in turn (``next_tile``'s), the heads' rows ``stride`` apart from ``at_first``."""
    n = kaio.max(n_tiles - first, 1)
    return first + s % n, at_first + s // n * stride


@kaio.gpu_func
def next_tile_wrapped(
    t: i32, at: i32, first: i32, n_tiles: i32, stride: i32, at_first: i32, heads_n: i32
) -> tuple[i32, i32]:
    """``next_tile`` of a walk that began at any item (``walk_start``): past the last tile of
    the last of the ``heads_n`` heads, back to the first head's first."""
    t, at = next_tile(t, at, first, n_tiles, stride)
    if at == at_first + heads_n * stride:
        at = at_first
    return t, at


@kaio.gpu_func
def store_tile(
    out: DT[:], acc: f32[:, :], at0: i32, row: i32, rows: i32, factor: f32, lane: u32,
    D: kaio.constexpr, DT: kaio.constexpr, COLS: kaio.constexpr = 0, stride: i32 = 0,
):  # fmt: skip
    """out[at0 + (row + 8h) * D + col] = acc * factor for this lane's two row halves h whose
    row is below ``rows`` (its columns 8n + 2 (lane % 4) + e, pairs stored together); rows
    ``stride`` apart where ``COLS`` (heads side by side: ``produce``)."""
    for h in kaio.static_range(2):
        if row + 8 * h < rows:
            if COLS:
                store_pairs(out, at0 + (row + 8 * h) * stride, acc, h, factor, lane, D, DT)
            else:
                store_pairs(out, at0 + (row + 8 * h) * D, acc, h, factor, lane, D, DT)


@kaio.gpu_func
def zero_acc(acc: f32[:, :], N: kaio.constexpr):
    """acc's N / 8 n8 tiles of accumulators = 0."""
    for n in kaio.static_range(N // 8):
        for e in kaio.static_range(4):
            acc[n, e] = 0.0


@kaio.gpu_func
def grads_t(
    s: f32[:, :], dp: f32[:, :], stats: f32[:, :, :], st: i32, lse: f32[:], delta: f32[:],
    at0: i32, key0: i32, q0: i32, sq: i32, kend: i32, causal: i32, scale_log2: f32, lane: u32,
    BM: kaio.constexpr, TSTATS: kaio.constexpr, SPLIT: kaio.constexpr = 0,
    L2: kaio.constexpr = 0, WAIT: kaio.constexpr = -1,
):  # fmt: skip
    """s = P^T, dp = dS^T = P^T (dP^T - delta) of the query tile q0 in ring stage ``st``
    (columns: queries q0 + 8n + 2 (lane % 4) + e, whose lse and delta are ``stats[0 and 1,
    st]`` where ``TSTATS``, else read from ``lse``, ``delta`` at ``at0`` (the head's query
    0); rows: keys key0 + 8h), the queries past sq, (causal) before the key and the keys at
    or past ``kend`` (the fused kernel's sk: its dS reaches dQ) masked to zero probability
    where the tile needs it. ``SPLIT``: a branch between the masked and the unmasked loop
    (else every element's mask is computed, and applied where needed: no branch while the
    caller's products run); ``L2``: the lse values are already ``lse_log2``'s; ``WAIT`` (0
    or more): P^T first, then ``wgmma_wait(WAIT)`` (the caller's dP^T product, issued
    after S^T, done), then dS^T: the exponentials run beside dP^T's product."""
    key_tile = key0 - i32(lane // 4)  # the warp's first key
    masked = q0 + BM > sq or (causal != 0 and q0 < key_tile + 15) or key_tile + 16 > kend
    if SPLIT:
        if masked:
            probs_t(s, dp, stats, st, lse, delta, at0, key0, q0, sq, kend, causal, scale_log2,
                    lane, True, BM, TSTATS, L2, WAIT)  # fmt: skip
        else:
            probs_t(s, dp, stats, st, lse, delta, at0, key0, q0, sq, kend, causal, scale_log2,
                    lane, False, BM, TSTATS, L2, WAIT)  # fmt: skip
    else:
        probs_t(s, dp, stats, st, lse, delta, at0, key0, q0, sq, kend, causal, scale_log2,
                lane, masked, BM, TSTATS, L2, WAIT)  # fmt: skip
    if WAIT >= 0:
        kaio.wgmma_wait(WAIT)
        for n in kaio.static_range(BM // 8):
            pair = kaio.local(f32, 2)
            dpair = kaio.local(f32, 2)
            stat_pairs(pair, dpair, stats, st, lse, delta, at0, q0, sq, n * 8, lane, TSTATS)
            for e in kaio.static_range(2):
                for h in kaio.static_range(2):
                    dp[n, 2 * h + e] = s[n, 2 * h + e] * (dp[n, 2 * h + e] - dpair[e])


@kaio.gpu_func
def stat_pairs(
    pair: f32[:], dpair: f32[:], stats: f32[:, :, :], st: i32, lse: f32[:], delta: f32[:],
    at0: i32, q0: i32, sq: i32, c: i32, lane: u32, TSTATS: kaio.constexpr,
):  # fmt: skip
    """``grads_t``'s lse and delta of this thread's two columns c + 2 (lane % 4) + e of the
    tile: from ``stats`` (``TSTATS``) or ``lse``, ``delta``."""
    col0 = c + i32(lane % 4) * 2
    if TSTATS:
        for e in kaio.static_range(2):
            pair[e] = stats[0, st, col0 + e]
            dpair[e] = stats[1, st, col0 + e]
    elif q0 + col0 + 1 < sq and sq % 2 == 0:  # both inside, 8-byte aligned
        kaio.load_vector(pair, lse, at0 + q0 + col0)
        kaio.load_vector(dpair, delta, at0 + q0 + col0)
    else:
        for e in kaio.static_range(2):
            at = at0 + kaio.min(q0 + col0 + e, sq - 1)
            pair[e] = lse[at]
            dpair[e] = delta[at]


@kaio.gpu_func
def probs_t(
    s: f32[:, :], dp: f32[:, :], stats: f32[:, :, :], st: i32, lse: f32[:], delta: f32[:],
    at0: i32, key0: i32, q0: i32, sq: i32, kend: i32, causal: i32, scale_log2: f32, lane: u32,
    masked: bool_, BM: kaio.constexpr, TSTATS: kaio.constexpr, L2: kaio.constexpr,
    WAIT: kaio.constexpr,
):  # fmt: skip
    """``grads_t``'s loop over the tile's elements, masked where ``masked`` (``WAIT``: P^T
    only)."""
    for n in kaio.static_range(BM // 8):
        pair = kaio.local(f32, 2)
        dpair = kaio.local(f32, 2)
        stat_pairs(pair, dpair, stats, st, lse, delta, at0, q0, sq, n * 8, lane, TSTATS)
        for e in kaio.static_range(2):
            col = n * 8 + i32(lane % 4) * 2 + e
            l2 = pair[e] if L2 else lse_log2(pair[e])
            for h in kaio.static_range(2):
                x = kaio.exp2(kaio.fma(s[n, 2 * h + e], scale_log2, -l2))
                if masked:
                    ok = q0 + col < sq and (causal == 0 or key0 + 8 * h <= q0 + col)
                    x = kaio.select(ok and key0 + 8 * h < kend, x, 0.0)
                s[n, 2 * h + e] = x
                if WAIT < 0:
                    dp[n, 2 * h + e] = x * (dp[n, 2 * h + e] - dpair[e])


@kaio.gpu_func
def issue_front(
    s: f32[:, :], dp: f32[:, :], a_s: DT[:, :, :], b_s: DT[:, :, :], x_s: DT[:, :, :, :],
    y_s: DT[:, :, :, :], af: u32[:, :], bf: u32[:, :], st: i32, wg: u32, D: kaio.constexpr,
    AREG: kaio.constexpr, DT: kaio.constexpr, kc: i32 = 0,
):  # fmt: skip
    """Issue a tile's first two products, each its own group: s = A X^T and dp = B Y^T for
    this warpgroup's 64 rows of the tiles loaded once (a_s, b_s from their 64-column block
    ``kc``: 0, or D / 64 for a second buffer; where ``AREG``, their A fragments ``af``,
    ``bf`` from ``load_frags``) and the ring's stage st of x_s, y_s (S^T = K Q^T and dP^T =
    V dO^T, resp. S = Q K^T and dP = dO V^T)."""
    if AREG:
        issue_s_regs(s, af, x_s, st, D, DT)
        issue_s_regs(dp, bf, y_s, st, D, DT)
    else:
        issue_s(s, a_s, x_s, st, wg, kc, D, DT)
        issue_s(dp, b_s, y_s, st, wg, kc, D, DT)


@kaio.gpu_func
def issue_s_regs(
    s: f32[:, :], af: u32[:, :], x_s: DT[:, :, :, :], st: i32, D: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """Issue s = A X^T (A from the registers ``af``, X stage st of the ring, K-major) and
    commit: ``issue_s`` without A's shared-memory reads in every product."""
    for kk in kaio.static_range(D // 16):
        dx = kaio.smem_descriptor(x_s, (st, kk // 4, 0, kk % 4 * 16), SW, 16, 1024)
        kaio.wgmma(DT, s, af[kk], dx, kk > 0)
    kaio.wgmma_commit()


@kaio.gpu_func
def load_frags(af: u32[:, :], a_s: DT[:, :, :], row0: i32, lane: u32, D: kaio.constexpr,
               DT: kaio.constexpr):  # fmt: skip
    """af[kk] = the wgmma A fragments (mma.m16n8k16's A layout) of rows row0 .. row0 + 15 of
    the TMA-swizzled tile a_s [D / 64, rows, 64], k-step kk < D / 16 (``ldmatrix``)."""
    r = row0 + i32(lane % 16)
    for kk in kaio.static_range(D // 16):
        col = kaio.swizzle(a_s, r, kk % 4 * 16 + i32(lane // 16) * 8)
        kaio.ldmatrix(af[kk], a_s, (kk // 4, r, col))


@kaio.gpu_func
def consume_dkdv(
    k_s: DT[:, :, :], v_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], lse: f32[:], delta: f32[:],
    dk: DT[:], dv: DT[:], ds_s: DT[:, :, :], dq_s: f32[:, :], dq_acc: f32[:], wg: u32, lt: u32,
    kvh: i32,
    first_head: i32, group: i32, first: i32, n_tiles: i32, k0: i32, sq: i32, sk: i32,
    causal: i32, scale_log2: f32, scale: f32, D: kaio.constexpr, BM: kaio.constexpr,
    WG: kaio.constexpr, STAGES: kaio.constexpr, PIPE: kaio.constexpr, AREG: kaio.constexpr,
    TSTATS: kaio.constexpr, DQ: kaio.constexpr, LATE: kaio.constexpr, DT: kaio.constexpr,
    COLS: kaio.constexpr = 0, shift: i32 = 0, out_at: i32 = 0, out_stride: i32 = 0,
):  # fmt: skip
    """Consumer warpgroup ``wg``'s 64 keys (thread ``lt`` of it): dK and dV over the query
    tiles of the group's heads (module docstring), then stored (where ``COLS``: at
    ``out_at``, rows ``out_stride`` apart, the queries seen shifted by ``shift``: the
    varlen kernels' bottom-right causal mask; TSTATS 1 and DQ 0 only). ``PIPE``: 0 each tile's
    products issued and waited for in turn; 1 tile i's S^T and dP^T issued together with
    tile i - 1's dV and dK, so that tile i's P^T and dS^T are computed while those run (the
    forward's intra-warpgroup overlap); 2, 3 the same with P^T and dS^T (2), resp. dS^T (3),
    handed to dV and dK through shared memory (``ds_s``, double-buffered: ``hand_off``), not
    registers. ``DQ`` (PIPE 0 only): 0 no dQ; else each tile's dS^T
    also goes to shared memory (``ds_s``, double-buffered) and dQ += dS K is added to the
    f32 ``dq_acc`` with atomics, over this warpgroup's 64 keys and every column (1) or over
    the block's keys and this warpgroup's D / WG columns (2: a barrier across the
    warpgroups, half the atomics), or as 2 but stored to ``dq_s`` for the producer
    warpgroup's other warps to add (3: atomics, 4: bulk reductions of a row, 5: of the
    whole tile, in fragment order, to a tile-ordered buffer; ``write_dq``);
    ``LATE``: a tile's dQ product issued a tile late, 1: with the next tile's S^T
    and dP^T (run while that tile's P^T and dS^T are computed), 2: behind the next tile's dV
    and dK (three dS^T buffers: the warpgroups may drift a tile apart); 0: at once."""
    lane = lt % 32
    key0 = k0 + 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)  # rows key0, key0 + 8
    dka = kaio.local(f32, (D // 8, 4))
    dva = kaio.local(f32, (D // 8, 4))
    zero_acc(dka, D)
    zero_acc(dva, D)
    s = kaio.local(f32, (BM // 8, 4))
    dp = kaio.local(f32, (BM // 8, 4))
    p = kaio.local(u32, (BM // 16, 4))
    ds = kaio.local(u32, (BM // 16, 4))
    total = group * kaio.max(n_tiles - first, 0)
    kaio.mbarrier_wait(turn, 0, 0)  # K and V landed
    af = kaio.local(u32, (D // 16, 4))
    bf = kaio.local(u32, (D // 16, 4))
    if AREG:  # K's and V's A fragments stay in registers
        load_frags(af, k_s, 64 * i32(wg) + 16 * i32(lt // 32), lane, D, DT)
        load_frags(bf, v_s, 64 * i32(wg) + 16 * i32(lt // 32), lane, D, DT)
    st = i32(0)  # the stage and parity of tile i
    ph = u32(0)
    t = first  # tile i's query tile and head (its lse at at0): counters, not divisions
    at0 = first_head * sq
    NQ = D if DQ == 1 else D // WG  # dQ's columns in this warpgroup
    dqa = kaio.local(f32, (NQ // 8, 4))
    kr = 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)  # key0 - k0: ds_s's rows
    c0 = 0 if DQ == 1 else i32(wg) * NQ  # dQ's first column here
    db = i32(0)  # the ds_s buffer of tile i and the parity of its barrier
    dph = u32(0)
    pq = i32(0)  # the last tile's first query row of this thread, its head's row 0
    pat0 = i32(0)
    NBUF = 3 if LATE == 2 else 2  # ds_s buffers
    FULL = STAGES + NBUF * WG  # DQ 3, 4: dq_s written (the consumers), read (the writers)
    wph = u32(0)
    pdb = i32(0)  # the last tile's buffer and barrier parity (LATE)
    pph = u32(0)
    G = 0 if DQ >= 2 else NBUF * i32(wg)  # this warpgroup's dS barriers: bars[1, STAGES + G + b]
    kend = sk if DQ else 1 << 30  # keys past sk: their dS would reach dQ
    if PIPE == 0:
        for _i in range(total):
            kaio.mbarrier_wait(bars, (0, st), ph)
            kaio.wgmma_fence()
            issue_front(s, dp, k_s, v_s, q_s, do_s, af, bf, st, wg, D, AREG, DT)  # S^T, dP^T
            if DQ and LATE == 1 and _i > 0:  # the last tile's dQ product while P^T, dS^T are made
                kaio.mbarrier_wait(bars, (1, STAGES + G + pdb), pph)
                issue_dq(dqa, ds_s, pdb, k_s, wg, D, NQ, WG, DQ, DT)
                kaio.wgmma_wait(1)
            else:
                kaio.wgmma_wait(0)
            grads_t(s, dp, stats, st, lse, delta, at0, key0, t * BM + shift, sq + shift, kend,
                    causal, scale_log2, lane, BM, TSTATS)  # fmt: skip
            pack_p(p, s, BM, DT)
            pack_p(ds, dp, BM, DT)
            if DQ and LATE == 1 and _i > 0:
                kaio.wgmma_wait(0)
                wph = hand_dq(dq_s, bars, dq_acc, dqa, pat0, pq, sq, c0, lane, lt, _i > 1, wph,
                              FULL, D, NQ, DQ)  # fmt: skip
            kaio.wgmma_fence()
            issue_back_dkdv(dka, dva, p, ds, q_s, do_s, st, BM, DT)
            if DQ:  # dS^T (dp: no operand of dV's, dK's) to ds_s while they run; once every
                # warp's rows are there (DQ 2-4: both warpgroups'), dQ (LATE: the next tile's)
                if LATE == 2 and _i > 0:  # the last tile's dS^T everywhere: its dQ may run,
                    # and every warp is past the dQ product that read buffer db (tile i - 3)
                    kaio.mbarrier_wait(bars, (1, STAGES + G + pdb), pph)
                store_ds(ds_s, db, dp, kr, lane, BM, DT)
                release(bars, STAGES + G + db, lt)
                if not LATE:
                    kaio.mbarrier_wait(bars, (1, STAGES + G + db), dph)
                    issue_dq(dqa, ds_s, db, k_s, wg, D, NQ, WG, DQ, DT)
                elif LATE == 2 and _i > 0:  # the last tile's, behind this tile's dV, dK
                    issue_dq(dqa, ds_s, pdb, k_s, wg, D, NQ, WG, DQ, DT)
            kaio.wgmma_wait(0)
            release(bars, st, lt)
            if DQ:
                if LATE == 2 and _i > 0:
                    wph = hand_dq(dq_s, bars, dq_acc, dqa, pat0, pq, sq, c0, lane, lt, _i > 1,
                                  wph, FULL, D, NQ, DQ)  # fmt: skip
                pq = t * BM + 16 * i32(lt // 32) + i32(lane // 4)
                pat0 = at0
                if not LATE:
                    wph = hand_dq(dq_s, bars, dq_acc, dqa, at0, pq, sq, c0, lane, lt, _i > 0,
                                  wph, FULL, D, NQ, DQ)  # fmt: skip
                pdb = db
                pph = dph
                db += 1
                if db == NBUF:
                    db = 0
                    dph ^= 1
            t, at0 = next_tile(t, at0, first, n_tiles, sq)
            st, ph = next_stage(st, ph, STAGES)
        if DQ and LATE and total > 0:  # the last tile's dQ
            kaio.mbarrier_wait(bars, (1, STAGES + G + pdb), pph)
            kaio.wgmma_fence()
            issue_dq(dqa, ds_s, pdb, k_s, wg, D, NQ, WG, DQ, DT)
            kaio.wgmma_wait(0)
            hand_dq(dq_s, bars, dq_acc, dqa, pat0, pq, sq, c0, lane, lt, total > 1, wph, FULL,
                    D, NQ, DQ)  # fmt: skip
    elif total > 0:  # PIPE 1-3
        kaio.mbarrier_wait(bars, (0, 0), 0)
        kaio.wgmma_fence()
        issue_front(s, dp, k_s, v_s, q_s, do_s, af, bf, 0, wg, D, AREG, DT)
        kaio.wgmma_wait(0)
        grads_t(s, dp, stats, 0, lse, delta, at0, key0, t * BM + shift, sq + shift, kend, causal,
                scale_log2, lane, BM, TSTATS)  # fmt: skip
        pb = i32(0)  # PIPE 2, 3: tile i - 1's ds_s buffers (4 - PIPE of them from pb)
        wph = hand_off(ds_s, pb, p, ds, s, dp, bars, STAGES + i32(wg), wph, kr, lane, lt, BM,
                       PIPE, DT)  # fmt: skip
        ps = i32(0)  # the stage of tile i - 1 (two stages at least: launch)
        st = 1
        t, at0 = next_tile(t, at0, first, n_tiles, sq)
        for _i in range(1, total):
            kaio.mbarrier_wait(bars, (0, st), ph)
            kaio.wgmma_fence()
            issue_front(s, dp, k_s, v_s, q_s, do_s, af, bf, st, wg, D, AREG, DT)
            issue_back(dka, dva, p, ds, ds_s, pb, wg, q_s, do_s, ps, BM, PIPE, DT)  # tile i - 1's
            kaio.wgmma_wait(2)  # S^T, dP^T done (tile i - 1's dV, dK may still run)
            grads_t(s, dp, stats, st, lse, delta, at0, key0, t * BM + shift, sq + shift, kend,
                    causal, scale_log2, lane, BM, TSTATS)  # fmt: skip
            kaio.wgmma_wait(0)  # tile i - 1's dV, dK done: p, ds (ds_s) and its stage are free
            release(bars, ps, lt)
            if PIPE >= 2:  # the other buffers: tile i - 1's may still be read by another
                pb = 4 - PIPE - pb  # warp's products (each warp waited only for its own)
            wph = hand_off(ds_s, pb, p, ds, s, dp, bars, STAGES + i32(wg), wph, kr, lane, lt, BM,
                           PIPE, DT)  # fmt: skip
            t, at0 = next_tile(t, at0, first, n_tiles, sq)
            ps = st
            st, ph = next_stage(st, ph, STAGES)
        kaio.wgmma_fence()
        issue_back(dka, dva, p, ds, ds_s, pb, wg, q_s, do_s, ps, BM, PIPE, DT)
        kaio.wgmma_wait(0)
        release(bars, ps, lt)
    if COLS:
        store_tile(dk, dka, out_at, key0, sk, scale, lane, D, DT, 1, out_stride)
        store_tile(dv, dva, out_at, key0, sk, 1.0, lane, D, DT, 1, out_stride)
    else:
        at = kvh * sk * D
        store_tile(dk, dka, at, key0, sk, scale, lane, D, DT)
        store_tile(dv, dva, at, key0, sk, 1.0, lane, D, DT)


@kaio.gpu_func
def issue_back_dkdv(
    dka: f32[:, :], dva: f32[:, :], p: u32[:, :], ds: u32[:, :], q_s: DT[:, :, :, :],
    do_s: DT[:, :, :, :], st: i32, BM: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """Issue dV += P^T dO and dK += dS^T Q of the query tile in stage st (each its own
    group; P^T and dS^T from registers)."""
    issue_pv(dva, p, do_s, st, BM, DT)
    issue_pv(dka, ds, q_s, st, BM, DT)


@kaio.gpu_func
def issue_back(
    dka: f32[:, :], dva: f32[:, :], p: u32[:, :], ds: u32[:, :], pt_s: DT[:, :, :], pb: i32,
    wg: u32, q_s: DT[:, :, :, :], do_s: DT[:, :, :, :], st: i32, BM: kaio.constexpr,
    PIPE: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``issue_back_dkdv`` (``PIPE`` 1: P^T and dS^T from the registers ``p``, ``ds``), or
    with dS^T from shared memory (``pt_s[pb + 3 - PIPE]``, this warpgroup's 64 rows) and
    P^T from ``pt_s[pb]`` (2) or the registers (3)."""
    if PIPE == 1:
        issue_back_dkdv(dka, dva, p, ds, q_s, do_s, st, BM, DT)
    else:
        if PIPE == 2:
            issue_pt(dva, pt_s, pb, wg, do_s, st, BM, DT)
        else:
            issue_pv(dva, p, do_s, st, BM, DT)
        issue_pt(dka, pt_s, pb + 3 - PIPE, wg, q_s, st, BM, DT)


@kaio.gpu_func
def issue_pt(
    acc: f32[:, :], pt_s: DT[:, :, :], b: i32, wg: u32, x_s: DT[:, :, :, :], st: i32,
    BM: kaio.constexpr, DT: kaio.constexpr, cb: i32 = 0,
):  # fmt: skip
    """Issue acc += A X and commit: A this warpgroup's 64 rows of ``pt_s[b]`` (K-major: 64
    queries a row, 128-byte swizzled, as ``store_ds`` writes them), X the BM rows of ring
    stage st (N-major) from its 64-column block ``cb`` (acc's columns wide)."""
    for kk in kaio.static_range(BM // 16):
        da = kaio.smem_descriptor(pt_s, (b, 64 * i32(wg), kk * 16), SW, 16, 1024)
        dx = kaio.smem_descriptor(x_s, (st, cb, kk * 16, 0), SW, BM * SW, 1024)
        kaio.wgmma(DT, acc, da, dx, True, False, True)
    kaio.wgmma_commit()


@kaio.gpu_func
def hand_off(
    pt_s: DT[:, :, :], pb: i32, p: u32[:, :], ds: u32[:, :], s: f32[:, :], dp: f32[:, :],
    bars: u64[:, :], bar: i32, wph: u32, kr: i32, lane: u32, lt: u32, BM: kaio.constexpr,
    PIPE: kaio.constexpr, DT: kaio.constexpr,
) -> u32:  # fmt: skip
    """A tile's P^T (``s``) and dS^T (``dp``) to the next products' operands: packed into
    ``p``, ``ds`` (``PIPE`` 1); or dS^T (and, for PIPE 2, P^T) stored to ``pt_s[pb ..]``
    (rows ``kr``, ``kr`` + 8), fenced for the tensor cores, and once every warp of the
    warpgroup has (``bars[1, bar]``, parity ``wph``), on, P^T packed into ``p`` for PIPE 3.
    Returns the next parity."""
    if PIPE == 1:
        pack_p(p, s, BM, DT)
        pack_p(ds, dp, BM, DT)
        return wph
    if PIPE == 2:
        store_ds(pt_s, pb, s, kr, lane, BM, DT)
    else:
        pack_p(p, s, BM, DT)
    store_ds(pt_s, pb + 3 - PIPE, dp, kr, lane, BM, DT)
    release(bars, bar, lt)
    kaio.mbarrier_wait(bars, (1, bar), wph)
    return wph ^ 1


@kaio.gpu_func
def store_ds(ds_s: DT[:, :, :], b: i32, dp: f32[:, :], kr: i32, lane: u32, BM: kaio.constexpr,
             DT: kaio.constexpr, c0: i32 = 0):  # fmt: skip
    """ds_s[b, kr + 8h, query] = this thread's dS^T (``dp``: rows kr, kr + 8 of the block's
    keys, columns its queries c0 + 8n + 2 (lane % 4) + e) rounded to DT, in pairs, the rows
    of 64 queries 128-byte swizzled: dS, the dQ product's A, M-major (``BM``: the columns
    in ``dp``, 64, or 32 from ``c0`` 0 or 32 for the head dim 256 kernel's halves)."""
    for h in kaio.static_range(2):
        for n in kaio.static_range(BM // 8):
            pair = kaio.local(DT, 2)
            for e in kaio.static_range(2):
                pair[e] = DT(dp[n, 2 * h + e])
            col = kaio.swizzle(ds_s, kr + 8 * h, c0 + n * 8 + i32(lane % 4) * 2)
            kaio.store_vector(ds_s, (b, kr + 8 * h, col), pair)


@kaio.gpu_func
def issue_dq(
    dqa: f32[:, :], ds_s: DT[:, :, :], b: i32, k_s: DT[:, :, :], wg: u32, D: kaio.constexpr,
    NQ: kaio.constexpr, WG: kaio.constexpr, DQ: kaio.constexpr, DT: kaio.constexpr,
    kc: i32 = 0,
):  # fmt: skip
    """Issue dqa = dS K (its first product overwrites) and commit: the 64 queries of ds_s
    buffer b (M-major) times the keys of k_s (N-major; from its 64-column block ``kc``), the
    warpgroup's 64 keys and all D columns (``DQ`` 1) or the block's 64 WG keys and columns
    wg NQ .. (2)."""
    rows = 64 if DQ == 1 else 64 * WG
    r0 = 64 * i32(wg) if DQ == 1 else 0
    c0 = 0 if DQ == 1 else i32(wg) * NQ
    for kk in kaio.static_range(rows // 16):
        da = kaio.smem_descriptor(ds_s, (b, r0 + kk * 16, 0), SW, 64 * WG * SW, 1024)
        dk = kaio.smem_descriptor(k_s, (kc + c0 // 64, r0 + kk * 16, c0 % 64), SW,
                                  64 * WG * SW, 1024)  # fmt: skip
        kaio.wgmma(DT, dqa, da, dk, kk > 0, True, True)
    kaio.wgmma_commit()


@kaio.gpu_func
def add_dq(
    dq_acc: f32[:], dqa: f32[:, :], at0: i32, q: i32, sq: i32, c0: i32, lane: u32,
    D: kaio.constexpr, NQ: kaio.constexpr,
):  # fmt: skip
    """dq_acc[at0 + q + 8h, c0 + col] += dqa (atomics; rows q, q + 8 of the head whose row 0
    is at0; this lane's columns col = 8n + 2 (lane % 4) + e of NQ). A row at or past sq
    (its dS masked: zeros) adds its zeros to row sq - 1: no branch, which would serialize
    the products in flight (ptxas C7518)."""
    for h in kaio.static_range(2):
        at = (at0 + kaio.min(q + 8 * h, sq - 1)) * D + c0 + i32(lane % 4) * 2
        for n in kaio.static_range(NQ // 8):
            for e in kaio.static_range(2):
                kaio.atomic_add(dq_acc, at + n * 8 + e, dqa[n, 2 * h + e])


@kaio.gpu_func
def store_dq(dq_s: f32[:, :], dqa: f32[:, :], q: i32, c0: i32, lane: u32, NQ: kaio.constexpr):
    """dq_s[q + 8h, c0 + col] = dqa (rows q, q + 8 of the tile; this lane's columns col =
    8n + 2 (lane % 4) + e of NQ, in pairs)."""
    for h in kaio.static_range(2):
        for n in kaio.static_range(NQ // 8):
            pair = kaio.local(f32, 2)
            for e in kaio.static_range(2):
                pair[e] = dqa[n, 2 * h + e]
            kaio.store_vector(dq_s, (q + 8 * h, c0 + n * 8 + i32(lane % 4) * 2), pair)


@kaio.gpu_func
def store_dq_frags(dq_s: f32[:, :], dqa: f32[:, :], c0: i32, lt: u32, NQ: kaio.constexpr):
    """dq_s[(c0 / 8 + n) 128 + lt] = dqa[n] (DQ 5: the tile in fragment order, four floats
    of thread ``lt`` an n8 tile, the warpgroup's columns from c0; consecutive threads'
    16-byte stores are consecutive: no bank conflicts). ``dq_tile_order`` is its inverse."""
    for n in kaio.static_range(NQ // 8):
        v = kaio.local(f32, 4)
        for e in kaio.static_range(4):
            v[e] = dqa[n, e]
        kaio.store_vector(dq_s, ((c0 // 8 + n) * 128 + i32(lt), 0), v)


@kaio.gpu_func
def hand_dq(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], dqa: f32[:, :], at0: i32, q: i32,
    sq: i32, c0: i32, lane: u32, lt: u32, after: bool_, wph: u32, FULL: kaio.constexpr,
    D: kaio.constexpr, NQ: kaio.constexpr, DQ: kaio.constexpr,
) -> u32:  # fmt: skip
    """A tile's dQ out of the registers (rows q, q + 8 of the head at at0, columns c0 ..):
    DQ 3 and 4, to dq_s once the writers have read the last tile's (``after`` a first; parity
    ``wph``), then the "full" arrival; else added to dq_acc (``add_dq``). Returns the next
    parity."""
    if DQ >= 3:
        if after:
            kaio.mbarrier_wait(bars, (1, FULL + 1), wph)
            wph ^= 1
        if DQ == 5:
            store_dq_frags(dq_s, dqa, c0, lt, NQ)
        else:
            store_dq(dq_s, dqa, q % 64, c0, lane, NQ)
        release(bars, FULL, lt)
    else:
        add_dq(dq_acc, dqa, at0, q, sq, c0, lane, D, NQ)
    return wph


@kaio.gpu_func
def write_dq(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], lt: u32, first_head: i32, group: i32,
    first: i32, n_tiles: i32, sq: i32, FULL: kaio.constexpr, D: kaio.constexpr,
    BM: kaio.constexpr, DQ: kaio.constexpr,
):  # fmt: skip
    """The dQ writers, the producer warpgroup's warps 1 to 3 (thread ``lt`` of it): for each
    tile of the consumers' walk, once the consumers have stored its dQ in dq_s
    (``bars[1, FULL]``), add its rows below sq to ``dq_acc``, then free dq_s (``bars[1,
    FULL + 1]``). DQ 3: atomics, a warp a row at a time (128 contiguous bytes an
    instruction); DQ 4: warp 1's lanes each a row's ``bulk_reduce_add`` (two rows), warps 2
    and 3 only pass the barriers; DQ 5: warp 1's first lane the whole tile's, to the tile's
    ``BM`` D contiguous floats of ``dq_acc`` (tile t of head h at (h n_tiles + t) BM D; the
    order within: ``store_dq_frags``)."""
    lane = i32(lt % 32)
    t = first
    at0 = first_head * sq
    ph = u32(0)
    for _i in range(group * kaio.max(n_tiles - first, 0)):
        kaio.mbarrier_wait(bars, (1, FULL), ph)
        ph ^= 1
        q0 = t * BM
        if DQ == 3:
            for r in range(i32(lt // 32) - 1, kaio.min(BM, sq - q0), 3):
                at = (at0 + q0 + r) * D + lane
                for c in kaio.static_range(D // 32):
                    kaio.atomic_add(dq_acc, at + 32 * c, dq_s[r, lane + 32 * c])
        elif DQ == 5:  # the tile in one bulk reduction (rows past sq: zeros to padding)
            if lt == 32:
                tile = (at0 // sq * n_tiles + t) * BM * D
                kaio.bulk_reduce_add(dq_acc, tile, dq_s, (0, 0), BM * D * 4)
                kaio.bulk_commit()
                kaio.bulk_wait_read(0)
        elif lt < 64:
            for h in kaio.static_range(BM // 32):
                r = lane + 32 * h
                if q0 + r < sq:
                    kaio.bulk_reduce_add(dq_acc, (at0 + q0 + r) * D, dq_s, (r, 0), D * 4)
            kaio.bulk_commit()
            kaio.bulk_wait_read(0)
        kaio.sync_warp()
        if lane == 0:
            kaio.mbarrier_arrive(bars, (1, FULL + 1))
        t, at0 = next_tile(t, at0, first, n_tiles, sq)
    if DQ >= 4:
        kaio.bulk_wait(0)


@kaio.gpu_func
def grads(
    s: f32[:, :], dp: f32[:, :], l2: f32[:], dl: f32[:], k0: i32, row0: i32, sk: i32,
    causal: i32, scale_log2: f32, lane: u32, BN: kaio.constexpr, SPLIT: kaio.constexpr = 0,
):  # fmt: skip
    """dp = dS = P (dP - delta) of one key tile (keys k0 + 8n + 2 (lane % 4) + e, rows row0 +
    8h), keys past sk and (causal) past the row masked where the tile needs it. ``SPLIT``: a
    branch between the masked and the unmasked loop (else every element's mask is computed,
    and applied where needed)."""
    masked = k0 + BN > sk or (causal != 0 and k0 + BN > row0 - i32(lane // 4) + 1)
    if SPLIT:
        if masked:
            grads_loop(s, dp, l2, dl, k0, row0, sk, causal, scale_log2, lane, True, BN)
        else:
            grads_loop(s, dp, l2, dl, k0, row0, sk, causal, scale_log2, lane, False, BN)
    else:
        grads_loop(s, dp, l2, dl, k0, row0, sk, causal, scale_log2, lane, masked, BN)


@kaio.gpu_func
def grads_loop(
    s: f32[:, :], dp: f32[:, :], l2: f32[:], dl: f32[:], k0: i32, row0: i32, sk: i32,
    causal: i32, scale_log2: f32, lane: u32, masked: bool_, BN: kaio.constexpr,
):  # fmt: skip
    """``grads``' loop over the tile's elements, masked where ``masked``."""
    for n in kaio.static_range(BN // 8):
        for e in kaio.static_range(2):
            for h in kaio.static_range(2):
                x = kaio.exp2(kaio.fma(s[n, 2 * h + e], scale_log2, -l2[h]))
                if masked:
                    key = k0 + n * 8 + i32(lane % 4) * 2 + e
                    ok = key < sk and (causal == 0 or key <= row0 + 8 * h)
                    x = kaio.select(ok, x, 0.0)
                dp[n, 2 * h + e] = x * (dp[n, 2 * h + e] - dl[h])


@kaio.gpu_func
def consume_dq(
    q_s: DT[:, :, :], do_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], dq: DT[:], wg: u32, lt: u32, bh: i32,
    q0: i32, n_tiles: i32, sq: i32, sk: i32, causal: i32, scale_log2: f32, scale: f32,
    D: kaio.constexpr, BN: kaio.constexpr, STAGES: kaio.constexpr, PIPE: kaio.constexpr,
    AREG: kaio.constexpr, DT: kaio.constexpr, COLS: kaio.constexpr = 0, out_at: i32 = 0,
    out_stride: i32 = 0,
):  # fmt: skip
    """Consumer warpgroup ``wg``'s 64 query rows (thread ``lt`` of it): dQ over the key tiles
    (module docstring; at least one), then stored (where ``COLS``: at ``out_at``, rows
    ``out_stride`` apart); ``PIPE`` as ``consume_dkdv``'s. The rows' lse and delta are
    ``stats[0 and 1, 0]``."""
    lane = lt % 32
    local = 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)  # rows q0 + local (+ 8)
    row0 = q0 + local
    dqa = kaio.local(f32, (D // 8, 4))
    zero_acc(dqa, D)
    s = kaio.local(f32, (BN // 8, 4))
    dp = kaio.local(f32, (BN // 8, 4))
    ds = kaio.local(u32, (BN // 16, 4))
    kaio.mbarrier_wait(turn, 0, 0)  # Q, dO and their rows' stats landed
    af = kaio.local(u32, (D // 16, 4))
    bf = kaio.local(u32, (D // 16, 4))
    if AREG:  # Q's and dO's A fragments stay in registers
        load_frags(af, q_s, 64 * i32(wg) + 16 * i32(lt // 32), lane, D, DT)
        load_frags(bf, do_s, 64 * i32(wg) + 16 * i32(lt // 32), lane, D, DT)
    l2 = kaio.local(f32, 2)
    dl = kaio.local(f32, 2)
    for h in kaio.static_range(2):
        inside = row0 + 8 * h < sq
        l2[h] = kaio.select(inside, lse_log2(stats[0, 0, local + 8 * h]), POS_INF)
        dl[h] = kaio.select(inside, stats[1, 0, local + 8 * h], 0.0)
    st = i32(0)
    ph = u32(0)
    if PIPE == 0:
        for j in range(n_tiles):
            kaio.mbarrier_wait(bars, (0, st), ph)
            kaio.wgmma_fence()
            issue_front(s, dp, q_s, do_s, k_s, v_s, af, bf, st, wg, D, AREG, DT)  # S, dP
            kaio.wgmma_wait(0)
            grads(s, dp, l2, dl, j * BN, row0, sk, causal, scale_log2, lane, BN)
            pack_p(ds, dp, BN, DT)
            kaio.wgmma_fence()
            issue_pv(dqa, ds, k_s, st, BN, DT)  # dQ += dS K
            kaio.wgmma_wait(0)
            release(bars, st, lt)
            st += 1  # written out (twice): ``next_stage`` here changed this kernel's SASS
            if st == STAGES:
                st = 0
                ph ^= 1
    else:
        kaio.mbarrier_wait(bars, (0, 0), 0)
        kaio.wgmma_fence()
        issue_front(s, dp, q_s, do_s, k_s, v_s, af, bf, 0, wg, D, AREG, DT)
        kaio.wgmma_wait(0)
        grads(s, dp, l2, dl, 0, row0, sk, causal, scale_log2, lane, BN)
        pack_p(ds, dp, BN, DT)
        ps = i32(0)  # the stage of tile j - 1
        st = 1
        for j in range(1, n_tiles):
            kaio.mbarrier_wait(bars, (0, st), ph)
            kaio.wgmma_fence()
            issue_front(s, dp, q_s, do_s, k_s, v_s, af, bf, st, wg, D, AREG, DT)
            issue_pv(dqa, ds, k_s, ps, BN, DT)  # tile j - 1's dQ += dS K
            kaio.wgmma_wait(1)  # S, dP done (tile j - 1's dQ product may still run)
            grads(s, dp, l2, dl, j * BN, row0, sk, causal, scale_log2, lane, BN)
            kaio.wgmma_wait(0)  # tile j - 1's dQ product done: ds and its stage are free
            release(bars, ps, lt)
            pack_p(ds, dp, BN, DT)
            ps = st
            st += 1
            if st == STAGES:
                st = 0
                ph ^= 1
        kaio.wgmma_fence()
        issue_pv(dqa, ds, k_s, ps, BN, DT)
        kaio.wgmma_wait(0)
        release(bars, ps, lt)
    if COLS:
        store_tile(dq, dqa, out_at, row0, sq, scale, lane, D, DT, 1, out_stride)
    else:
        store_tile(dq, dqa, bh * sq * D, row0, sq, scale, lane, D, DT)


@kaio.gpu_func
def release(bars: u64[:, :], st: i32, lt: u32):
    """This warp is done with ring stage st (its products waited for): each thread fences its
    reads of the stage (the lse and delta read with ordinary loads) against the next TMA
    copy into it, then the warp's first lane arrives on the stage's "free" barrier."""
    kaio.fence_proxy_async()
    kaio.sync_warp()
    if lt % 32 == 0:
        kaio.mbarrier_arrive(bars, (1, st))


@kaio.gpu_func
def init_barriers(bars: u64[:, :], turn: u64[:], WG: kaio.constexpr, STAGES: kaio.constexpr,
                  DQ: kaio.constexpr, NBUF: kaio.constexpr):  # fmt: skip
    """Thread 0: the ring's barriers (landed: the producer's arrival; free: one from each
    consumer warp, ``release``), ``turn[0]`` (the tiles loaded once) and, where ``DQ``, the
    dS buffers' ``bars[1, STAGES + NBUF g + b]`` (buffer b of warpgroup g's warps, ``DQ`` 1,
    or g = 0 of all consumer warps, 2 to 4) and for DQ 3 dq_s's (``write_dq``), fenced for
    the copy engine."""
    for s in kaio.static_range(STAGES):
        kaio.mbarrier_init(bars, (0, s), 1)
        kaio.mbarrier_init(bars, (1, s), 4 * WG)  # an arrival from each consumer warp
    if DQ:
        for j in kaio.static_range(NBUF * WG):
            kaio.mbarrier_init(bars, (1, STAGES + j), 4 if DQ == 1 else 4 * WG)
    if DQ >= 3:  # dq_s written by the consumer warps, read by the 3 writer warps
        kaio.mbarrier_init(bars, (1, STAGES + NBUF * WG), 4 * WG)
        kaio.mbarrier_init(bars, (1, STAGES + NBUF * WG + 1), 3)
    kaio.mbarrier_init(turn, 0, 1)
    kaio.fence_proxy_async()


@kaio.gpu_func
def stats_start(cu_q: i32[:], b: u32) -> i32:
    """Where sequence b's lse and delta start in a head's row of the varlen stats copies
    (``_attention_hopper_varlen_bwd.varlen_stats``): cu_q[b] + 3 b rounded up to 4, so that
    a TMA copy from there starts 16 bytes into a row."""
    return (i32(cu_q[b]) + 3 * i32(b) + 3) // 4 * 4


@kaio.gpu_func
def varlen_block(
    cu_q: i32[:], cu_k: i32[:], seq_q: i32, seq_k: i32, causal: i32, COLS: kaio.constexpr
) -> tuple[i32, i32, i32, i32, i32, i32]:  # fmt: skip
    """``(start_q, start_k, shift, stat_off, sq, sk)`` of block z's sequence where ``COLS``
    (the varlen kernels): where its queries and keys start, the causal shift sk - sq (0
    without the mask), its stats' offset from its query rows (``stats_start`` - start_q) and
    its lengths; else zeros and the dense lengths ``seq_q``, ``seq_k``."""
    start_q = i32(0)
    start_k = i32(0)
    shift = i32(0)
    stat_off = i32(0)
    sq = seq_q
    sk = seq_k
    if COLS:
        b = kaio.block_idx_z()
        start_q = i32(cu_q[b])
        start_k = i32(cu_k[b])
        sq = i32(cu_q[b + 1]) - start_q
        sk = i32(cu_k[b + 1]) - start_k
        if causal != 0:
            shift = sk - sq
        stat_off = stats_start(cu_q, b) - start_q
    return start_q, start_k, shift, stat_off, sq, sk


@kaio.gpu_func
def zero_rows(
    out: DT[:], at0: i32, stride: i32, q0: i32, sq: i32, THREADS: kaio.constexpr,
    BQ: kaio.constexpr, D: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """out[at0 + r * stride + c] = 0 for the rows q0 <= r < min(q0 + BQ, sq) and the D
    columns c, 8 a thread at a time over the block's ``THREADS`` threads."""
    z = kaio.local(DT, 8)
    for e in kaio.static_range(8):
        z[e] = DT(0.0)
    for i in range(i32(kaio.thread_idx_x()), BQ * D // 8, THREADS):
        r = q0 + i // (D // 8)
        if r < sq:
            kaio.store_vector(out, at0 + r * stride + i % (D // 8) * 8, z)


@kaio.gpu_kernel(fastmath=True)  # ex2.approx.ftz: one instruction an exponential
def attention_bwd_dkdv_wgmma(
    tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap, tdo: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, lse: f32[:], delta: f32[:], dk: DT[:], dv: DT[:],
    dq_acc: f32[:], seq_q: i32, seq_k: i32, heads: i32, group: i32, scale_log2: f32, scale: f32,
    causal: i32, D: kaio.constexpr, BM: kaio.constexpr, WG: kaio.constexpr,
    STAGES: kaio.constexpr, PIPE: kaio.constexpr, AREG: kaio.constexpr, TSTATS: kaio.constexpr,
    REGS: kaio.constexpr, DT: kaio.constexpr, DQ: kaio.constexpr, LATE: kaio.constexpr,
    cu_q: i32[:], cu_k: i32[:], tp: i32, COLS: kaio.constexpr,
):  # fmt: skip
    """dk, dv of the ``64 * WG`` keys of block x and K/V head ``kvh`` = block y, summed over
    the query heads of its group (module docstring); where ``DQ`` (1 or 2, PIPE 0, BM 64),
    their share of dQ / scale too, added to ``dq_acc`` (f32 [B * H * sq * D], zeros before)
    with atomics (``consume_dkdv``; ``LATE`` there). ``tk``, ``tv``: k, v as [B * Hkv * sk,
    D] in boxes of (64 * WG, 64); ``tq``, ``tdo``: q, do as [B * H * sq, D] in boxes of (BM,
    64); ``tl``, ``td``: lse, delta as [1, B * H * sq] f32 in boxes of (1, BM); dk, dv
    [B * Hkv * sk * D] flat; ``scale_log2``: the scale times log2(e). ``COLS`` 1: the varlen
    kernel (``_attention_hopper_varlen_bwd``, TSTATS 1, DQ 0): K/V head y of sequence z of
    packed [tokens, heads * D] arrays (``produce``'s ``COLS``; sq and sk are read from the
    offsets ``cu_q``, ``cu_k``), lse and delta [heads, tp] (``stats_start``), the queries
    seen shifted by sk - sq (the bottom-right causal mask); ``COLS`` 0: cu_q, cu_k and tp
    unused."""
    BK = 64 * WG
    C = D // 64
    ONCE_BYTES = BK * D * 2
    RING_BYTES = STAGES * BM * D * 2
    DS = 2 * ONCE_BYTES + 2 * RING_BYTES
    NBUF = 3 if LATE == 2 else 2
    PT = 0 if DQ or PIPE < 2 else 8 - 2 * PIPE  # PIPE 2, 3: P^T and dS^T, resp. dS^T, twice
    DQS = DS + (NBUF * BK * 64 * 2 if DQ else PT * BK * 64 * 2)
    STATS = DQS + (BM * (D + 4) * 4 if DQ >= 3 else 0)
    BARS = STATS + 2 * STAGES * BM * 4
    NB = STAGES + (NBUF * WG if DQ else (WG if PT else 0)) + (2 if DQ >= 3 else 0)
    k_s = kaio.shared_dynamic(DT, (C, BK, 64), 0)
    v_s = kaio.shared_dynamic(DT, (C, BK, 64), ONCE_BYTES)
    q_s = kaio.shared_dynamic(DT, (STAGES, C, BM, 64), 2 * ONCE_BYTES)
    do_s = kaio.shared_dynamic(DT, (STAGES, C, BM, 64), 2 * ONCE_BYTES + RING_BYTES)
    # (without DQ, resp. DQ 3, these two are unused: a row at the stats)
    ds_s = kaio.shared_dynamic(DT, (NBUF if DQ else (PT if PT else 1), BK if DQ or PT else 1, 64),
                               DS)  # fmt: skip
    DQ_ROWS = BM * D // 4 if DQ == 5 else (BM if DQ >= 3 else 1)  # DQ 5: fragment order
    dq_s = kaio.shared_dynamic(f32, (DQ_ROWS, 4 if DQ == 5 else D + 4), DQS)  # rows padded
    stats = kaio.shared_dynamic(f32, (2, STAGES, BM), STATS)
    bars = kaio.shared_dynamic(u64, (2, NB), BARS)
    turn = kaio.shared_dynamic(u64, (2,), BARS + 16 * NB)
    t, wg, lt = thread_roles(WG)
    kvh = i32(kaio.block_idx_y())
    kv_heads = heads // group
    first_head = kvh // kv_heads * heads + kvh % kv_heads * group
    k0 = i32(kaio.block_idx_x()) * BK  # causal: the first key tiles see the most queries
    start_q, start_k, shift, stat_off, sq, sk = varlen_block(cu_q, cu_k, seq_q, seq_k, causal,
                                                             COLS)  # fmt: skip
    if COLS and k0 >= sk:  # keys past the sequence's end: nothing to do
        return
    first = i32(0)
    if causal != 0:
        if COLS:  # queries before k0 - shift see none of these keys
            first = kaio.max(k0 - shift, 0) // BM
        else:
            first = k0 // BM  # queries before k0 see none of these keys
    n_tiles = (sq + BM - 1) // BM
    if t == 0:  # (PT: a barrier a warpgroup, ``hand_off``: as DQ 1's with one buffer)
        init_barriers(bars, turn, WG, STAGES, DQ if DQ else (1 if PT else 0), NBUF if DQ else 1)
    kaio.sync_threads()
    if wg < WG:  # the consumers
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        consume_dkdv(k_s, v_s, q_s, do_s, stats, bars, turn, lse, delta, dk, dv, ds_s, dq_s,
                     dq_acc, wg, lt, kvh, first_head, group, first, n_tiles, k0, sq, sk, causal,
                     scale_log2, scale, D, BM, WG, STAGES, PIPE, AREG, TSTATS, DQ, LATE, DT,
                     COLS, shift, (start_k * kv_heads + kvh) * D, kv_heads * D)  # fmt: skip
    else:  # the producer warpgroup: its first thread loads
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            if COLS:  # heads side by side: the query heads' columns and stats
                produce(k_s, v_s, q_s, do_s, stats, bars, turn, tk, tv, tq, tdo, tl, td,
                        start_k + k0, start_q, 0, group, first, n_tiles, D, BK, BM, STAGES,
                        TSTATS, DT, 1, kvh * D, first_head * D,
                        first_head * tp + stat_off, tp)  # fmt: skip
            else:
                produce(k_s, v_s, q_s, do_s, stats, bars, turn, tk, tv, tq, tdo, tl, td,
                        kvh * sk + k0, first_head * sq, sq, group, first, n_tiles, D, BK, BM,
                        STAGES, TSTATS, DT)  # fmt: skip
        elif lt >= 32:  # warps 1 to 3: the dQ writers (DQ 3; DQ 4: warp 1's lanes add)
            if DQ >= 3:
                write_dq(dq_s, bars, dq_acc, lt, first_head, group, first, n_tiles, sq,
                         STAGES + NBUF * WG, D, BM, DQ)  # fmt: skip


@kaio.gpu_kernel(fastmath=True)
def attention_bwd_dq_wgmma(
    tq: kaio.tensormap, tdo: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, dq: DT[:],
    seq_q: i32, seq_k: i32, heads: i32, group: i32, scale_log2: f32, scale: f32, causal: i32,
    D: kaio.constexpr, BN: kaio.constexpr, WG: kaio.constexpr, STAGES: kaio.constexpr,
    PIPE: kaio.constexpr, AREG: kaio.constexpr, REGS: kaio.constexpr, DT: kaio.constexpr,
    cu_q: i32[:], cu_k: i32[:], tp: i32, COLS: kaio.constexpr,
):  # fmt: skip
    """dq of the ``64 * WG`` query rows of block x (the heaviest causal tiles first) of
    (batch, head) ``bh`` = block y (module docstring). ``tq``, ``tdo``: q, do as
    [B * H * sq, D] in boxes of (64 * WG, 64); ``tk``, ``tv``: k, v as [B * Hkv * sk, D] in
    boxes of (BN, 64); ``tl``, ``td``: lse, delta as [1, B * H * sq] f32 in boxes of
    (1, 64 * WG); dq [B * H * sq * D] flat. ``COLS`` 1: the varlen kernel (as
    ``attention_bwd_dkdv_wgmma``'s): head y's query tile x (counted from the last) of
    sequence z; a tile whose rows see no key stores zeros (``zero_rows``)."""
    BQ = 64 * WG
    C = D // 64
    ONCE_BYTES = BQ * D * 2
    RING_BYTES = STAGES * BN * D * 2
    STATS = 2 * ONCE_BYTES + 2 * RING_BYTES
    BARS = STATS + 2 * BQ * 4
    q_s = kaio.shared_dynamic(DT, (C, BQ, 64), 0)
    do_s = kaio.shared_dynamic(DT, (C, BQ, 64), ONCE_BYTES)
    k_s = kaio.shared_dynamic(DT, (STAGES, C, BN, 64), 2 * ONCE_BYTES)
    v_s = kaio.shared_dynamic(DT, (STAGES, C, BN, 64), 2 * ONCE_BYTES + RING_BYTES)
    stats = kaio.shared_dynamic(f32, (2, 1, BQ), STATS)
    bars = kaio.shared_dynamic(u64, (2, STAGES), BARS)
    turn = kaio.shared_dynamic(u64, (2,), BARS + 16 * STAGES)
    t, wg, lt = thread_roles(WG)
    start_q, start_k, shift, stat_off, sq, sk = varlen_block(cu_q, cu_k, seq_q, seq_k, causal,
                                                             COLS)  # fmt: skip
    if COLS:
        bh = i32(kaio.block_idx_y())
        q0 = i32(kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * BQ
        if q0 >= sq:  # past the sequence's end
            return
        kvh, n_tiles = kv_head_and_tiles(bh, q0 + shift, heads, group, sk, causal, BQ, BN)
        if n_tiles <= 0:  # no row sees a key: zeros
            zero_rows(dq, (start_q * heads + bh) * D, heads * D, q0, sq, 128 * WG + 128, BQ, D,
                      DT)  # fmt: skip
            return
    else:
        bh, kvh, q0, n_tiles = query_block(heads, group, sk, causal, BQ, BN)
    if t == 0:
        init_barriers(bars, turn, WG, STAGES, 0, 2)
    kaio.sync_threads()
    if wg < WG:
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        if COLS:  # rows seen shifted by shift, stored shifted back
            consume_dq(q_s, do_s, k_s, v_s, stats, bars, turn, dq, wg, lt, bh, q0 + shift,
                       n_tiles, sq + shift, sk, causal, scale_log2, scale, D, BN, STAGES, PIPE,
                       AREG, DT, 1, ((start_q - shift) * heads + bh) * D,
                       heads * D)  # fmt: skip
        else:
            consume_dq(q_s, do_s, k_s, v_s, stats, bars, turn, dq, wg, lt, bh, q0, n_tiles, sq,
                       sk, causal, scale_log2, scale, D, BN, STAGES, PIPE, AREG, DT)  # fmt: skip
    else:
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            if COLS:
                produce(q_s, do_s, k_s, v_s, stats, bars, turn, tq, tdo, tk, tv, tl, td,
                        start_q + q0, start_k, 0, 1, 0, n_tiles, D, BQ, BN, STAGES, 2, DT, 1,
                        bh * D, kvh * D, bh * tp + stat_off, 0)  # fmt: skip
            else:
                produce(q_s, do_s, k_s, v_s, stats, bars, turn, tq, tdo, tk, tv, tl, td,
                        bh * sq + q0, kvh * sk, 0, 1, 0, n_tiles, D, BQ, BN, STAGES, 2,
                        DT)  # fmt: skip


def shared_bytes(
    d: int, once: int, ring: int, stages: int, stat_rows: int, dq: int = 0, nbuf: int = 2
) -> int:
    """The dynamic shared memory of either kernel: the two tiles loaded once (``once`` rows),
    the ring's two tiles of ``ring`` rows a stage, (``dq``: the ``nbuf`` dS^T buffers of
    ``once`` x 64, dq_s,) the lse and delta of ``stat_rows`` rows, the barriers."""
    ds = nbuf * once * 64 * 2 + 8 * nbuf * once // 32 if dq else 0  # buffers, barriers
    ds += ring * (d + 4) * 4 + 32 if dq >= 3 else 0  # dq_s, its barriers
    return 2 * once * d * 2 + 2 * stages * ring * d * 2 + 2 * stat_rows * 4 + 16 * stages + 16 + ds


def _ds_buffers(c: dict) -> tuple[int, int]:
    """(dq, nbuf) of ``shared_bytes`` for the dK/dV kernel's constexprs ``c``: its dQ mode
    and dS^T buffers (``PIPE`` 2, 3 without dQ: P^T and dS^T, resp. dS^T, double-buffered,
    each as a dS^T buffer)."""
    if c.get("DQ"):
        return c["DQ"], 3 if c.get("LATE") == 2 else 2
    if c["PIPE"] >= 2:
        return 1, 8 - 2 * c["PIPE"]
    return 0, 2


def _stages(d: int, once: int, ring: int, ring_stats: bool, dq: int = 0, nbuf: int = 2) -> int:
    """The most ring stages (at most 4) whose ``shared_bytes`` fit."""

    def size(n: int) -> int:
        return shared_bytes(d, once, ring, n, n * ring if ring_stats else once, dq, nbuf)

    fit = [n for n in range(1, 5) if size(n) <= SHARED_LIMIT]
    return max(fit, default=1)


@kaio.gpu_kernel(block_size=256)
def dq_zero(acc: f32[:], n: i32):
    """acc[0 .. n) = 0, four a thread (n a multiple of 4)."""
    i = i32(kaio.block_idx_x() * 256 + kaio.thread_idx_x()) * 4
    if i < n:
        z = kaio.local(f32, 4)
        for e in kaio.static_range(4):
            z[e] = 0.0
        kaio.store_vector(acc, i, z)


@kaio.gpu_kernel(block_size=256)
def dq_convert(dq: DT[:], acc: f32[:], n: i32, scale: f32, DT: kaio.constexpr):
    """dq[i] = acc[i] * scale rounded to DT for i < n, four a thread (n a multiple of 4)."""
    i = i32(kaio.block_idx_x() * 256 + kaio.thread_idx_x()) * 4
    if i < n:
        x = kaio.local(f32, 4)
        y = kaio.local(DT, 4)
        kaio.load_vector(x, acc, i)
        for e in kaio.static_range(4):
            y[e] = DT(x[e] * scale)
        kaio.store_vector(dq, i, y)


@kaio.gpu_kernel(block_size=256)
def dq_convert_tiles(dq: DT[:], acc: f32[:], rows: i32, sq: i32, scale: f32, D: kaio.constexpr,
                     DT: kaio.constexpr):  # fmt: skip
    """dq[row, c .. c + 3] = acc * scale rounded to DT, four columns a thread, for the ``rows``
    rows (heads of sq rows) of dq [rows, D]; acc in DQ 5's order (``store_dq_frags``): each
    head's 64-row tiles of 64 D floats, element (r, c) of a tile at ((c / 8) 128 + 32 (r /
    16) + 4 (r % 8) + c % 8 / 2) 4 + 2 (r % 16 / 8) + c % 2 (the fragment of thread 32 (r /
    16) + 4 (r % 8) + c % 8 / 2 of the warpgroup that had column c)."""
    i = i32(kaio.block_idx_x() * 256 + kaio.thread_idx_x()) * 4
    row = i // D
    if row < rows:
        col = i % D
        r = row % sq
        at = (row // sq * ((sq + 63) // 64) + r // 64) * 64 * D  # the tile's first float
        r = r % 64
        at += (col // 8 * 128 + r // 16 * 32 + r % 8 * 4 + col % 8 // 2) * 4 + r % 16 // 8 * 2
        x = kaio.local(f32, 4)
        pair = kaio.local(f32, 2)
        for j in kaio.static_range(2):  # columns col + 2j, + 1: the next thread's pair
            kaio.load_vector(pair, acc, at + 4 * j)
            for e in kaio.static_range(2):
                x[2 * j + e] = pair[e]
        y = kaio.local(DT, 4)
        for e in kaio.static_range(4):
            y[e] = DT(x[e] * scale)
        kaio.store_vector(dq, i, y)


# Whether the fused kernel is flash_attention_bwd's default for head dim d (else the pair).
# Measured on an H100 (round B, f16 B4 H16 S4096, TFLOP/s at 2.5x forward FLOPs): D 128
# fused 357-360 (bulk reductions or writer atomics) against the pair's 416; D 64 273 against
# 311. With DQ 5 (issue 36, round C) it ran faster than the pair (462 against 403-414 at
# D 128, 315 against 305 at D 64), but its dQ's additions come in a varying order: not
# deterministic, so the deterministic pair stays the default.
FUSED = {64: False, 128: False}


def config(d: int) -> dict:
    """The constexprs of the kernels for head dim ``d`` (64 or 128): ``{"dkdv": {BM, WG,
    STAGES, PIPE, AREG, TSTATS, REGS, DQ, LATE}, "dq": {BN, WG, STAGES, PIPE, AREG, REGS},
    "fused": (dkdv's, with DQ)}``. The pair (the default, ``FUSED``): two consumer
    warpgroups (128 keys, resp. 128 query rows, a block), query tiles of 64 for dK/dV, key
    tiles of 64 for dQ, as many ring stages as fit (at most 4), lse and delta by TMA, and
    the schedule measured fastest on an H100 under the whole-program JIT (docs/hopper.md,
    docs/performance.md): dQ's products overlapped (``PIPE`` 1); dK/dV's too, at D 64 with
    P^T and dS^T in registers (``PIPE`` 1: 324 against 304 TFLOP/s), at D 128 (where PIPE
    1 spills) with dS^T through shared memory (``PIPE`` 3: the dK/dV kernel alone 657
    against 610 on the pair's FLOP scale, 568 against 536 causal). The fused kernel: dQ's
    columns split between the warpgroups, each tile's added by one bulk reduction from
    shared memory (``DQ`` 5: 462 against ``DQ`` 4's 343 at D 128), at once."""
    wg = 2
    common = {"WG": wg, "AREG": 0, "REGS": consumer_registers(wg)}
    bm, bn = 64, 64
    dkdv = {"BM": bm, "PIPE": 1 if d == 64 else 3, "TSTATS": 1, "DQ": 0, "LATE": 0}
    dkdv["STAGES"] = _stages(d, 64 * wg, bm, True, *_ds_buffers(dkdv))
    dq = {"BN": bn, "STAGES": _stages(d, 64 * wg, bn, False), "PIPE": 1}
    fused = {**dkdv, "PIPE": 0, "DQ": 5, "LATE": 0}
    fused["STAGES"] = _stages(d, 64 * wg, bm, True, *_ds_buffers(fused))
    return {"dkdv": {**dkdv, **common}, "dq": {**dq, **common}, "fused": {**fused, **common}}


def eligible(d: int) -> bool:
    """Whether the kernels take head dim ``d``: 64 or 128 (256's dK and dV accumulators do
    not fit beside the products in a thread's registers)."""
    return d in (64, 128)


def worthwhile(bh: int, sq: int, sk: int, d: int, sms: int) -> bool:
    """Whether ``flash_attention_bwd`` should take these kernels (see ``eligible``): whole
    128-row tiles of queries and keys (the kernels mask partial ones, untimed) and sequences
    of 1024 and more. Measured on an H100 (docs/hopper.md), f16 D 128, under the old
    (relocatable) JIT: 1.25x the mma.sync pair at S 4096 (1.21x causal), 1.18x at S 1024
    (1.05x causal); at S 512 it lost (0.50x, 0.97x causal). Under the whole-program JIT at S
    4096: 2.18x (2.09x causal), D 64 1.70x (1.52x)."""
    return eligible(d) and sq % 128 == 0 and sk % 128 == 0 and sq >= 1024 and sk >= 1024


def launch_outputs(qa, ka, da, d: int) -> tuple:
    """A backward launch's stream, its outputs dQ, dK, dV (q's and k's shapes, dO's type) and
    the rows of Q and of K as [rows, D] matrices."""
    from kaio_ops import _arrays

    stream = _arrays.stream_of(qa)
    dq = _arrays.output(da, qa.shape)
    dk, dv = (_arrays.output(da, ka.shape) for _ in range(2))
    return stream, dq, dk, dv, qa.size // d, ka.size // d


def row_map(a, rows: int, box: int, d: int):
    """A TMA map of operand ``a`` as a [rows, d] matrix, boxes of box x 64 elements, swizzled."""
    from kaio_ops import _arrays

    return kaio.tensor_map_2d(_arrays.view(a.obj, a.kind, (rows, d)), (box, 64), SW)


def stats_maps(la, delta, rows: int, box: int) -> list:
    """TMA maps of lse and delta as [1, rows] f32 (B * H * Sq), boxes of 1 x box."""
    from kaio_ops import _arrays

    flat = (_arrays.view(x, la.kind, (1, rows)) for x in (la.obj, delta))
    return [kaio.tensor_map_2d(x, (1, box), 0) for x in flat]


def launch(qa, ka, va, da, la, delta, dims: tuple, causal: bool, scale: float,
           cfg: dict | None = None, only: str | None = None, deterministic: bool = False,
           fused: bool | None = None, side: bool | None = None,
           ordered: bool | dict | None = None, o=None):  # fmt: skip
    """Run the kernels on checked operands (``_arrays.Operand``s q, do [B, H, Sq, D], k, v
    [B, Hkv, Sk, D], lse [B, H, Sq] f32) and ``delta`` (flat f32 [B * H * Sq], rowsum(dO *
    O)); ``dims``: (B * H, H, group, sq, sk, d, d); ``cfg``: the constexprs (default
    ``config(d)``). The pair (``cfg["dkdv"]``, ``cfg["dq"]``: the same bits every run), or
    where ``fused`` (default ``FUSED[d]``) and not ``deterministic`` one kernel
    (``cfg["fused"]``) that computes dK, dV and adds dQ in f32 with atomics (then rounded by
    ``dq_convert``): the order of those additions varies from run to run, so dQ's last bits
    may. ``only``: "dkdv" or "dq" launches that kernel of the pair alone (to time it: the
    other's outputs are left unwritten). ``side`` (default ``SIDE``; torch arrays): the
    pair's dQ kernel runs on a second stream beside the dK/dV kernel (``side_stream``), so
    that each fills the other's last wave. ``ordered`` (default
    ``_attention_hopper_bwd_fused.takes(d, causal)`` where none of ``cfg``, ``fused``,
    ``side`` is given): the
    deterministic fused kernel (``kaio_ops._attention_hopper_bwd_fused``: dQ added in a fixed
    order), deterministic too (a dict: with these overrides of its ``ordered_config``).
    ``o`` (O, like q): given, ``delta`` is written here first (the ordered kernel's ``prep``
    computes it beside its other preparation; else ``_attention_tc.fill_delta``). Returns
    (dq, dk, dv) of q's type and shapes."""
    import math

    from kaio_ops import _arrays
    from kaio_ops import _attention_hopper_bwd_fused as fused_ordered

    bh, heads, group, sq, sk, d, _ = dims
    if sq % 4 or not eligible(d):
        raise ValueError(
            f"_attention_hopper_bwd.launch: needs Sq a multiple of 4 (16-byte TMA copies of "
            f"lse and delta) and D 64 or 128, got Sq = {sq}, D = {d}; use the mma.sync kernels"
        )
    asked = fused is not None or side is not None or cfg is not None  # the pair's, the fused
    take = not asked and fused_ordered.takes(d, causal) if ordered is None else ordered
    cfg = cfg or config(d)
    if only is None and take:
        over = ordered if isinstance(ordered, dict) else None
        return fused_ordered.launch(qa, ka, va, da, la, delta, dims, causal, scale, over, o)
    if o is not None:
        fill_delta(o, da, delta, bh * sq, d)
    fused = not deterministic and only is None and (FUSED[d] if fused is None else fused)
    c1, c2 = (cfg["fused"] if fused else cfg["dkdv"]), cfg["dq"]
    for c in (c1, c2):
        if c["PIPE"] and c["STAGES"] < 2:
            raise ValueError(f"_attention_hopper_bwd.launch: PIPE 1-3 needs 2 stages or more: {c}")
    if c1.get("DQ") and (c1["PIPE"] or c1["BM"] != 64):
        raise ValueError(f"_attention_hopper_bwd.launch: DQ needs PIPE 0 and BM 64: {c1}")
    stream, dq, dk, dv, rows_q, rows_kv = launch_outputs(qa, ka, da, d)
    tmap = functools.partial(row_map, d=d)

    args = (sq, sk, heads, group, math.log2(math.e) * scale, scale, int(causal))
    none = _arrays.output(da, (1,), i32)
    dense = {"cu_q": none, "cu_k": none, "tp": 0}  # unused with COLS 0
    bk = 64 * c1["WG"]
    tiles = fused and c1.get("DQ") == 5  # dq_acc in whole 64-row tiles (``store_dq_frags``)
    acc_size = bh * -(-sq // 64) * 64 * d if tiles else qa.size
    dq_acc = _arrays.output(da, (acc_size,), f32) if fused else delta  # (unused: DQ 0)
    grid = -(-acc_size // 1024)
    if fused:
        dq_zero[grid, 256, stream, 0](dq_acc, acc_size)
    smem1 = shared_bytes(d, bk, c1["BM"], c1["STAGES"], c1["STAGES"] * c1["BM"],
                         *_ds_buffers(c1))  # fmt: skip

    def dkdv_kernel():
        grid = (-(-sk // bk), bh // group)
        attention_bwd_dkdv_wgmma[grid, 128 * c1["WG"] + 128, stream, smem1](
            tmap(ka, rows_kv, bk), tmap(va, rows_kv, bk), tmap(qa, rows_q, c1["BM"]),
            tmap(da, rows_q, c1["BM"]), *stats_maps(la, delta, rows_q, c1["BM"]),
            la.arg(rows_q), delta,
            _arrays.output_arg(da, dk, (ka.size,)), _arrays.output_arg(da, dv, (ka.size,)),
            dq_acc, *args, **dense, D=d, DT=qa.dtype, COLS=0, **c1,
        )  # fmt: skip

    side = (SIDE if side is None else side) and only is None and not fused
    if not side and only != "dq":
        dkdv_kernel()
    if fused:
        dq_out = _arrays.output_arg(da, dq, (qa.size,))
        grid = -(-qa.size // 1024)
        if tiles:
            dq_convert_tiles[grid, 256, stream, 0](dq_out, dq_acc, bh * sq, sq, scale, D=d,
                                                   DT=qa.dtype)  # fmt: skip
        else:
            dq_convert[grid, 256, stream, 0](dq_out, dq_acc, qa.size, scale, DT=qa.dtype)
        return dq, dk, dv
    bq = 64 * c2["WG"]
    smem = shared_bytes(d, bq, c2["BN"], c2["STAGES"], bq)
    if only == "dkdv":
        return dq, dk, dv
    with side_stream(qa, side) as dq_stream:  # (there the dQ kernel first)
        attention_bwd_dq_wgmma[(-(-sq // bq), bh), 128 * c2["WG"] + 128, dq_stream, smem](
            tmap(qa, rows_q, bq), tmap(da, rows_q, bq), tmap(ka, rows_kv, c2["BN"]),
            tmap(va, rows_kv, c2["BN"]), *stats_maps(la, delta, rows_q, bq),
            _arrays.output_arg(da, dq, (qa.size,)), *args, **dense, D=d, DT=qa.dtype, COLS=0,
            **c2,
        )  # fmt: skip
        if side:
            dkdv_kernel()
    return dq, dk, dv


# Whether the pair's dQ kernel runs on a second stream beside the dK/dV kernel (``launch``).
SIDE = False
_SIDE_STREAMS: dict = {}


class side_stream:
    """``with side_stream(like, on) as s``: ``s`` is the stream to launch on. Where ``on`` and
    ``like`` is a torch array on a GPU, a second stream of its device (one per device, kept),
    made to wait for the current stream's work before the block and waited for by it after
    (so that the caller's later work, and the allocator's reuse of the block's arrays, come
    after it); else the current stream (``_arrays.stream_of``)."""

    def __init__(self, like, on: bool):
        from kaio_ops import _arrays

        self.like, self.on = like, bool(on) and like.kind == "torch"
        self.stream = None if self.on else _arrays.stream_of(like)

    def __enter__(self):
        if not self.on:
            return self.stream
        import torch

        dev = self.like.obj.device
        self.main = torch.cuda.current_stream(dev)
        self.side = _SIDE_STREAMS.get(dev)
        if self.side is None:
            self.side = _SIDE_STREAMS[dev] = torch.cuda.Stream(dev)
        self.side.wait_stream(self.main)
        return self.side.cuda_stream

    def __exit__(self, *exc):
        if self.on:
            self.main.wait_stream(self.side)
        return False


def specializations():
    """(kernel, constexprs) of the specializations the ops launch (for PTX checks)."""
    from kaio import bf16, f16

    for dt in (f16, bf16):
        for d in (64, 128):
            cfg = config(d)
            yield attention_bwd_dkdv_wgmma, {"D": d, "DT": dt, "COLS": 0, **cfg["dkdv"]}
            yield attention_bwd_dq_wgmma, {"D": d, "DT": dt, "COLS": 0, **cfg["dq"]}
            yield attention_bwd_dkdv_wgmma, {"D": d, "DT": dt, "COLS": 0, **cfg["fused"]}
