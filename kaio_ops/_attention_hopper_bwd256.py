"""The Hopper (sm_90a) flash-attention backward at head dim 256, behind
``kaio_ops.flash_attention_bwd`` on sm_90 (``attention.hopper_takes`` with this module's
``eligible`` and ``worthwhile``): a dK/dV kernel whose two consumer warpgroups split the head
dim (FlashAttention-3's hdim-256 layout: 64-row key and query tiles, the dK and dV
accumulators of 64 x 256 split across the warpgroups), and a dQ kernel,
``attention_bwd_dq_d256`` (``KV`` 1; 0: the pair's ``attention_bwd_dq_wgmma`` of
``kaio_ops._attention_hopper_bwd`` at D 256), or, with ``DS`` 1 (the default), a plain
product ``attention_bwd_dq_ds``: dQ = scale dS K from the dS^T tiles that the dK/dV kernel
copies to a workspace (below). No atomics: the same bits every run. ``FUSED`` 1 (off:
slower, measured) makes the dK/dV kernel compute dQ too (``DQ`` 1), added in a fixed order
by ``_attention_hopper_bwd_fused``'s ordered writer: deterministic as well.

``attention_bwd_dkdv_d256``: a block owns 64 keys (key block x) of one K/V head (K and V
loaded once by TMA) and walks the query tiles of 64 rows of its group's heads (causal: those
at or past its first key) through an mbarrier ring of Q and dO filled by the producer
warpgroup's first thread (``_attention_hopper_bwd.produce``). Per query tile, consumer
warpgroup w (of 2):

- S^T = K Q_w^T and dP^T = V dO_w^T for the block's 64 keys and the tile's 32 queries
  32w .. 32w + 31 (m64n32k16, K-major operands; ``issue_st``);
- P^T and dS^T = P^T (dP^T - delta) for those (``_attention_hopper_bwd.grads_t``, lse and
  delta read from global memory), rounded to DT into columns 32w .. of a shared 64 x 64
  buffer each (``store_ds``, double-buffered), then a barrier of both warpgroups' warps;
- dV[:, 128w ..] += P^T dO and dK[:, 128w ..] += dS^T Q: the whole 64-query buffers times
  this warpgroup's 128 columns of dO, Q (m64n128k16, ``issue_pt``).

Each tile's products run in turn (issuing a tile's S^T and dP^T beside the last tile's dV
and dK, or splitting the front products by role, measured slower: docs/hopper.md). A
consumer thread holds 64 + 64 dK, dV accumulators and 16 + 16 of S^T, dP^T. The buffers of a
tile are rewritten two tiles later, after each warpgroup has passed the next tile's
barrier, so after both have finished the products that read them. dK, dV (scaled dK) are
stored from registers; GQA's are summed over the group's heads inside the block, in a fixed
order.

``attention_bwd_dq_d256``: a block owns 128 query rows of a head (Q, dO and their lse and
delta loaded once: 128 KB), each consumer warpgroup 64 of them, and walks the key tiles of 64
(causal: up to the diagonal) as the pair's dQ kernel does (S = Q K^T, dP = dO V^T, dS in
registers, dQ += dS K), but with K and V in buffers of their own, each on its own pair of
barriers (``produce_kv``, ``consume_dq_kv``): a tile's dP is issued as soon as its V has
landed, then S once K has; V is free once dP is done (the next V is copied while S, dS and
dQ run) and K once dQ is (the next K is copied while the next dP runs). The 192 KB of Q,
dO, K and V leave no room for a second stage of both, and with a single stage of both (the
pair's kernel) each tile's copies waited for its last product. A key tile that needs no mask
takes a branch without the mask's instructions (``grads``' SPLIT). With ``SFIRST`` 1 (the
default) K has two stages (224 KB in all) and each tile's S is issued first, then dP: P is
computed while dP's product runs, and the tile's dQ product stays in flight until the next
tile's S and dP are issued.

``attention_bwd_dkdv_d256q`` (``Q128`` 1): the dK/dV kernel with 128-query tiles in halves
of 64 (each warpgroup's front products at N 64: K and V read half as often a product as
with 32 queries), each half of Q and dO on barriers of its own, freed as soon as the
products that read it are done (``copy_in_turn``; one buffer of each: K, V, Q, dO and the
P^T, dS^T buffers take 224 KB), the P^T / dS^T buffers single and guarded by a "free"
barrier of both warpgroups. Each half's lse and delta come by TMA with its dO (1 KB of
shared memory; read from global memory in the P^T step, their loads and their bounds checks
were half of that step's instructions), unmasked tiles take a branch without the mask's
instructions (``grads_t``'s SPLIT), and the second warpgroup issues a tile's front products
once the first's are done (``bars[1, 6]``), so that the first's P^T, dS^T step runs beside
them instead of both at once (a branch a warpgroup: ``consume_q128``'s ``FIRST``). With
``HALVES`` 1 (the default) each warpgroup issues its dV and dK products a half of the tile's
queries at a time, each half as soon as its P^T and dS^T are stored (``back_halves``): the
first warpgroup's products of its own half run beside the second's P^T step.

With ``UNION`` 1 (off: no faster with rotated walks, measured) the two kernels run as one
launch, ``attention_bwd_d256``: the dK/dV blocks first, then the dQ blocks, which take the
multiprocessors that the last dK/dV blocks leave idle. Without the mask (``ROT`` 1, the
default) each block's walk begins at its own place (key block x at item x W / blocks of its
W (head, query tile) items, query block x at key tile x n / blocks) and wraps around, so that
a head's blocks read different tiles at any time.

With ``DS`` 1 (dense, ``attention_bwd_dkdv_d256q``) the dQ kernel's recomputation of S and
dP goes: the dK/dV kernel's producer warpgroup's second warp copies each tile's two dS^T
buffers (64 keys x 64 queries, f16 or bf16, swizzled as the wgmmas read them) whole to a
workspace as soon as they are stored (``store_ds_tiles``, one bulk copy each; the buffers
are freed once the copies have read them), and ``attention_bwd_dq_ds`` adds dS K over a
query block's key tiles from a ring of K tiles and dS^T tile pairs: one product a tile
instead of three, for B H Sq Sk 2 bytes of workspace written and read once (its dS^T tiles
of 64 x 64, for each head and 128-query tile two halves of a row of key blocks:
``ds_tiles_before``; causal, only the key blocks the tile's queries see, about half).
Where those exceed ``DS_BYTES`` the backward runs in the fewest chunks of K/V heads, as
even as can be, the workspace reused (``launch``). dS is rounded to the input type for its
product, as the dQ kernel rounds it.

With ``COLS`` 1 the dK/dV kernel is the varlen backward's at D 256
(``_attention_hopper_varlen_bwd``): a block (key block, K/V head, sequence) of packed
[tokens, heads * D] arrays, as the pair's ``attention_bwd_dkdv_wgmma`` with ``COLS`` 1.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import functools

import kaio
from kaio import bool_, f32, i32, i64, u32, u64
from kaio_ops._attention_hopper import (
    PRODUCER_REGS,
    SHARED_LIMIT,
    SW,
    consumer_registers,
    issue_pv,
    issue_s,
    pack_p,
)
from kaio_ops._attention_hopper_bwd import (
    dq_convert_tiles,
    grads,
    grads_t,
    hand_dq,
    init_barriers,
    issue_dq,
    issue_pt,
    next_tile_wrapped,
    produce,
    release,
    store_ds,
    store_tile,
    varlen_block,
    walk_start,
    zero_acc,
    zero_rows,
)
from kaio_ops._attention_hopper_bwd_fused import write_dq_ordered, zero_acc_sem
from kaio_ops._attention_hopper_common import (
    key_block_queries,
    kv_head_and_tiles,
    next_tile,
    thread_roles,
)
from kaio_ops._attention_tc import POS_INF, lse_log2
from kaio_ops._matmul_hopper import next_stage

D256 = 256


@kaio.gpu_func
def issue_st(s: f32[:, :], a_s: DT[:, :, :], x_s: DT[:, :, :, :], st: i32, r0: i32,
             D: kaio.constexpr, DT: kaio.constexpr):  # fmt: skip
    """Issue s = A X^T and commit: A the 64 rows of ``a_s`` [D / 64, 64, 64] (K, resp. V),
    X the rows r0 .. of ring stage st of ``x_s`` (Q, resp. dO; as many as s has columns),
    both K-major (D / 16 wgmmas)."""
    for kk in kaio.static_range(D // 16):
        da = kaio.smem_descriptor(a_s, (kk // 4, 0, kk % 4 * 16), SW, 16, 1024)
        dx = kaio.smem_descriptor(x_s, (st, kk // 4, r0, kk % 4 * 16), SW, 16, 1024)
        kaio.wgmma(DT, s, da, dx, kk > 0)
    kaio.wgmma_commit()


@kaio.gpu_func
def front(s: f32[:, :], dp: f32[:, :], k_s: DT[:, :, :], v_s: DT[:, :, :],
          q_s: DT[:, :, :, :], do_s: DT[:, :, :, :], st: i32, q1: i32, D: kaio.constexpr,
          DT: kaio.constexpr):  # fmt: skip
    """Issue a tile's S^T = K Q^T and dP^T = V dO^T for its queries q1 .. (stage st), each
    its own group, behind a wgmma fence."""
    kaio.wgmma_fence()
    issue_st(s, k_s, q_s, st, q1, D, DT)
    issue_st(dp, v_s, do_s, st, q1, D, DT)


@kaio.gpu_func
def back(dka: f32[:, :], dva: f32[:, :], pt_s: DT[:, :, :], b: i32, q_s: DT[:, :, :, :],
         do_s: DT[:, :, :, :], st: i32, cb: i32, BM: kaio.constexpr,
         DT: kaio.constexpr):  # fmt: skip
    """Issue a tile's dV += P^T dO and dK += dS^T Q (P^T, dS^T: buffers ``pt_s[2b]``,
    ``pt_s[2b + 1]``, all 64 keys; dO, Q: stage st, the columns from 64-column block
    ``cb``), each its own group."""
    issue_pt(dva, pt_s, 2 * b, u32(0), do_s, st, BM, DT, cb)
    issue_pt(dka, pt_s, 2 * b + 1, u32(0), q_s, st, BM, DT, cb)


@kaio.gpu_func
def hand_pt(pt_s: DT[:, :, :], b: i32, s: f32[:, :], dp: f32[:, :], bars: u64[:, :], kr: i32,
            lane: u32, lt: u32, q1: i32, H: kaio.constexpr, STAGES: kaio.constexpr,
            DT: kaio.constexpr):  # fmt: skip
    """This warp's P^T (``s``) and dS^T (``dp``) of queries q1 .. q1 + H to buffers
    ``pt_s[2b]``, ``pt_s[2b + 1]``, fenced for the tensor cores, then its arrival on their
    barrier ``bars[1, STAGES + b]``."""
    store_ds(pt_s, 2 * b, s, kr, lane, H, DT, q1)
    store_ds(pt_s, 2 * b + 1, dp, kr, lane, H, DT, q1)
    release(bars, STAGES + b, lt)


@kaio.gpu_func
def split_roles(
    lt: u32, wg: u32, H: kaio.constexpr, NH: kaio.constexpr
) -> tuple[u32, i32, i32, i32]:
    """``(lane, kr, q1, cb)`` of thread ``lt`` of consumer warpgroup ``wg`` in the dK/dV
    kernels (``H`` queries of a tile and ``NH`` columns of dK and dV a warpgroup): its lane,
    its rows kr, kr + 8 of the block's keys, the warpgroup's first query of a tile and its
    first 64-column block of dO and Q."""
    lane = lt % 32
    return lane, 16 * i32(lt // 32) + i32(lane // 4), H * i32(wg), i32(wg) * (NH // 64)


@kaio.gpu_func
def consume_split(
    k_s: DT[:, :, :], v_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], lse: f32[:], delta: f32[:],
    dk: DT[:], dv: DT[:], pt_s: DT[:, :, :], dq_s: f32[:, :], dq_acc: f32[:], wg: u32,
    lt: u32, first_head: i32, group: i32, first: i32, n_tiles: i32, k0: i32,
    sq: i32, sk: i32, causal: i32, scale_log2: f32, scale: f32, shift: i32, stat_at: i32,
    stat_stride: i32, out_at: i32, out_stride: i32, D: kaio.constexpr, BM: kaio.constexpr,
    STAGES: kaio.constexpr, DQ: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``wg`` (thread ``lt`` of it): dK and dV of the block's 64 keys in
    its D / 2 columns over the query tiles of the group's heads (module docstring), each
    tile's products in turn, then stored (rows ``out_stride`` apart from ``out_at``). The
    queries are seen shifted by ``shift`` (the varlen kernel's bottom-right causal mask;
    dense: 0); the lse and delta of the first head's seen query 0 are at ``stat_at``, the
    next head's ``stat_stride`` further. ``pt_s[2b]``, ``pt_s[2b + 1]``: P^T and dS^T of
    buffer b, whose "full" barrier is ``bars[1, STAGES + b]`` (an arrival from each consumer
    warp). ``DQ`` 1: each tile's dQ = dS K too, this warpgroup's D / 2 columns over the
    block's 64 keys, handed to the writer through ``dq_s`` (``hand_dq``, its barriers
    ``bars[1, STAGES + 2]``, ``+ 3``)."""
    H = BM // 2  # this warpgroup's queries of a tile
    NH = D // 2  # its columns of dK and dV
    lane, kr, q1, cb = split_roles(lt, wg, H, NH)
    key0 = k0 + kr
    s = kaio.local(f32, (H // 8, 4))  # S^T, then P^T
    dp = kaio.local(f32, (H // 8, 4))  # dP^T, then dS^T
    dqa = kaio.local(f32, (NH // 8, 4))  # DQ: the tile's dQ, this warpgroup's columns
    wph = u32(0)  # DQ: the parity of dq_s's "free" barrier
    dka = kaio.local(f32, (NH // 8, 4))
    dva = kaio.local(f32, (NH // 8, 4))
    zero_acc(dka, NH)
    zero_acc(dva, NH)
    kend = sk if DQ else 1 << 30  # DQ: keys past sk masked (their dS would reach dQ)
    total = group * kaio.max(n_tiles - first, 0)
    kaio.mbarrier_wait(turn, 0, 0)  # K and V landed
    st = i32(0)
    ph = u32(0)
    pb = i32(0)  # the P^T and dS^T buffers of this tile, their barrier's parity
    pph = u32(0)
    t = first
    at0 = stat_at
    for _i in range(total):
        kaio.mbarrier_wait(bars, (0, st), ph)
        front(s, dp, k_s, v_s, q_s, do_s, st, q1, D, DT)
        kaio.wgmma_wait(0)
        grads_t(s, dp, stats, st, lse, delta, at0, key0, t * BM + q1 + shift, sq + shift, kend,
                causal, scale_log2, lane, H, 0)  # fmt: skip
        hand_pt(pt_s, pb, s, dp, bars, kr, lane, lt, q1, H, STAGES, DT)
        kaio.mbarrier_wait(bars, (1, STAGES + pb), pph)  # both warpgroups' queries there
        kaio.wgmma_fence()
        back(dka, dva, pt_s, pb, q_s, do_s, st, cb, BM, DT)
        if DQ:  # dQ = dS K: K and the buffer only, so the stage is free before it ends
            issue_dq(dqa, pt_s, 2 * pb + 1, k_s, wg, D, NH, 1, 2, DT)
            kaio.wgmma_wait(1)
            release(bars, st, lt)
            kaio.wgmma_wait(0)
            wph = hand_dq(dq_s, bars, dq_acc, dqa, 0, 0, sq, cb * 64, lane, lt, _i > 0, wph,
                          STAGES + 2, D, NH, 5)  # fmt: skip
        else:
            kaio.wgmma_wait(0)
            release(bars, st, lt)
        pb, pph = next_stage(pb, pph, 2)
        t, at0 = next_tile(t, at0, first, n_tiles, stat_stride)
        st, ph = next_stage(st, ph, STAGES)
    at = out_at + NH * i32(wg)  # this warpgroup's columns
    store_tile(dk, dka, at, key0, sk, scale, lane, NH, DT, 1, out_stride)
    store_tile(dv, dva, at, key0, sk, 1.0, lane, NH, DT, 1, out_stride)


@kaio.gpu_func
def key_block(
    kvh: i32, k0: i32, heads: i32, group: i32, sq: i32, sk: i32, causal: i32, tp: i32,
    start_q: i32, start_k: i32, shift: i32, stat_off: i32, D: kaio.constexpr,
    BM: kaio.constexpr, COLS: kaio.constexpr,
) -> tuple[i32, i32, i32, i32, i32, i32, i32]:  # fmt: skip
    """``(first_head, first, n_tiles, stat_at, stat_stride, out_at, out_stride)`` of the
    dK/dV block of the keys from k0 of K/V head ``kvh`` (``key_block_queries``'s three; the
    lse and delta of the first head's seen query 0 and the next head's offset; where its dK
    and dV rows start and their stride). Dense: the stats at the query rows, dK and dV rows
    D apart; varlen (``COLS``, ``varlen_block``'s values): heads side by side, the stats
    [heads, tp] from ``stats_start``, the queries seen shifted."""
    first_head, first, n_tiles = key_block_queries(kvh, k0, heads, group, sq, causal, BM)
    stat_at = first_head * sq
    stat_stride = sq
    out_at = kvh * sk * D
    out_stride = D
    if COLS:
        if causal != 0:  # queries before k0 - shift see none of these keys
            first = kaio.max(k0 - shift, 0) // BM
        stat_at = first_head * tp + start_q + stat_off - shift
        stat_stride = tp
        out_at = (start_k * (heads // group) + kvh) * D
        out_stride = heads // group * D
    return first_head, first, n_tiles, stat_at, stat_stride, out_at, out_stride


@kaio.gpu_kernel(fastmath=True)  # ex2.approx.ftz: one instruction an exponential
def attention_bwd_dkdv_d256(
    tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap, tdo: kaio.tensormap,
    lse: f32[:], delta: f32[:], dk: DT[:], dv: DT[:], dq_acc: f32[:], sem: i32[:], seq_q: i32,
    seq_k: i32, heads: i32, group: i32, scale_log2: f32, scale: f32, causal: i32,
    D: kaio.constexpr, BM: kaio.constexpr, STAGES: kaio.constexpr, REGS: kaio.constexpr,
    DQ: kaio.constexpr, DT: kaio.constexpr, EARLY: kaio.constexpr,
    cu_q: i32[:], cu_k: i32[:], tp: i32, COLS: kaio.constexpr,
):  # fmt: skip
    """dk, dv [B * Hkv * sk * D] (flat) of the 64 keys of key block x (``block_idx_x``) and
    K/V head y (``block_idx_y``), summed over its group's query heads (module docstring).
    ``tk``, ``tv``: k, v as [B * Hkv * sk, D] in boxes of (64, 64); ``tq``, ``tdo``: q, do
    as [B * H * sq, D] in boxes of (BM, 64); lse, delta [B * H * sq] f32 (delta =
    rowsum(dO * O)); ``heads``: H, ``group``: H / Hkv; ``REGS``: the consumers' registers
    (setmaxnreg, 0: none). Rows a tile reads past a head's are masked (``grads_t``) and
    keys past sk not stored. ``DQ`` 1: dQ too (FlashAttention-3's one-kernel backward),
    each tile's share added to ``dq_acc`` (f32, whole 64-row tiles in fragment order, zeros
    before) in a fixed order (the semaphores ``sem``, zeros before:
    ``_attention_hopper_bwd_fused.write_dq_ordered``, by the producer warpgroup's warps 1
    to 3, ``EARLY`` its schedule: 1, dq_s free once the reduction has read it); key blocks
    then run in decreasing order where causal (its module docstring). ``COLS`` 1 (DQ 0):
    the varlen kernel (``_attention_hopper_varlen_bwd``), as the pair's
    (``_attention_hopper_bwd.attention_bwd_dkdv_wgmma``): K/V head y of sequence z = block
    z of packed [tokens, heads * D] arrays (sq and sk read from the offsets ``cu_q``,
    ``cu_k``), lse and delta [heads, tp] (``stats_start``), the queries seen shifted by sk -
    sq (the bottom-right causal mask); ``COLS`` 0: cu_q, cu_k and tp unused."""
    C = D // 64
    TILE = 64 * 64 * 2  # a 64 x 64 block of DT
    RING = STAGES * BM * D * 2  # Q, resp. dO: the ring
    k_s = kaio.shared_dynamic(DT, (C, 64, 64), 0)
    v_s = kaio.shared_dynamic(DT, (C, 64, 64), C * TILE)
    q_s = kaio.shared_dynamic(DT, (STAGES, C, BM, 64), 2 * C * TILE)
    do_s = kaio.shared_dynamic(DT, (STAGES, C, BM, 64), 2 * C * TILE + RING)
    PT = 2 * C * TILE + 2 * RING
    pt_s = kaio.shared_dynamic(DT, (4, 64, 64), PT)
    stats = kaio.shared_dynamic(f32, (2, 1, 2), PT + 4 * TILE)  # (unused: lse, delta loaded)
    DQS = PT + 4 * TILE + 16
    dq_s = kaio.shared_dynamic(f32, (BM * D // 4 if DQ else 1, 4), DQS)  # fragment order
    BARS = DQS + (BM * D * 4 if DQ else 16)
    NB = STAGES + 4  # the ring's, the two buffers', dq_s's (DQ)
    bars = kaio.shared_dynamic(u64, (2, NB), BARS)
    turn = kaio.shared_dynamic(u64, (2,), BARS + 16 * NB)
    t, wg, lt = thread_roles(2)
    x = i32(kaio.block_idx_x())
    start_q, start_k, shift, stat_off, sq, sk = varlen_block(cu_q, cu_k, seq_q, seq_k, causal,
                                                             COLS)  # fmt: skip
    nkb = (sk + 63) // 64
    if DQ and causal != 0:
        x = nkb - 1 - x  # the last key blocks first: they add to each tile before the rest
    k0 = x * 64
    if COLS and k0 >= sk:  # keys past the sequence's end: nothing to do
        return
    kvh = i32(kaio.block_idx_y())
    first_head, first, n_tiles, stat_at, stat_stride, out_at, out_stride = key_block(
        kvh, k0, heads, group, sq, sk, causal, tp, start_q, start_k, shift, stat_off, D, BM, COLS
    )
    if t == 0:
        init_barriers(bars, turn, 2, STAGES, 5 if DQ else 2, 1)  # buffers: 8 arrivals
    kaio.sync_threads()
    if wg < 2:
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        consume_split(k_s, v_s, q_s, do_s, stats, bars, turn, lse, delta, dk, dv, pt_s, dq_s,
                      dq_acc, wg, lt, first_head, group, first, n_tiles, k0, sq, sk, causal,
                      scale_log2, scale, shift, stat_at, stat_stride, out_at, out_stride, D, BM,
                      STAGES, DQ, DT)  # fmt: skip
    else:
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            if COLS:  # heads side by side: the K/V head's and the query heads' columns
                produce(k_s, v_s, q_s, do_s, stats, bars, turn, tk, tv, tq, tdo, tq, tdo,
                        start_k + k0, start_q, 0, group, first, n_tiles, D, 64, BM, STAGES, 0,
                        DT, 1, kvh * D, first_head * D)  # fmt: skip
            else:
                produce(k_s, v_s, q_s, do_s, stats, bars, turn, tk, tv, tq, tdo, tq, tdo,
                        kvh * sk + k0, first_head * sq, sq, group, first, n_tiles, D, 64, BM,
                        STAGES, 0, DT)  # fmt: skip
        elif DQ and lt >= 32:
            write_dq_ordered(dq_s, bars, dq_acc, sem, lt, first_head, group, first, n_tiles, sq,
                             x, nkb, causal, STAGES + 2, D, BM, 64, EARLY)  # fmt: skip


@kaio.gpu_func
def copy_in_turn(
    a_s: DT[:, :, :, :], b_s: DT[:, :, :, :], ta: kaio.tensormap, tb: kaio.tensormap,
    bars: u64[:, :], row: i32, col: i32, i: i32, ph: u32, s_s: f32[:, :, :], tl: kaio.tensormap,
    td: kaio.tensormap, srow: i32, ROWS: kaio.constexpr, PARTS: kaio.constexpr,
    D: kaio.constexpr, DT: kaio.constexpr, STATS: kaio.constexpr, BY_PART: kaio.constexpr = 0,
):  # fmt: skip
    """Tile i's copies (parity ``ph``): the ``ROWS`` rows from ``row`` (columns from ``col``)
    of ``ta``, then of ``tb``, each in ``PARTS`` parts of ROWS / PARTS rows, part p into
    ``a_s[p]``, resp. ``b_s[p]``, each on a barrier of its own: ``bars[0, j]`` for the j-th
    (a_s's parts, then b_s's), once the consumers freed it (``bars[1, j]``; for i > 0).
    ``BY_PART`` 1: issued part by part instead (a_s's part 0, b_s's part 0, a_s's part 1,
    ...: the order in which the consumers free them). ``STATS`` 1: with a_s's part p, the
    lse and delta of its rows (``tl``, ``td`` from ``srow + p R``) into ``s_s[0 and 1,
    p]``."""
    R = ROWS // PARTS
    for n in kaio.static_range(2 * PARTS):
        x = n % 2 if BY_PART else n // PARTS
        p = n // 2 if BY_PART else n % PARTS
        j = x * PARTS + p
        if i > 0:  # tile i - 1's copy read: free
            kaio.mbarrier_wait(bars, (1, j), ph ^ 1)
        kaio.mbarrier_arrive_expect_tx(bars, (0, j), u32(R * D * 2 + STATS * (1 - x) * R * 8))
        if STATS and x == 0:
            kaio.tma_load_2d(s_s, (0, p, 0), tl, 0, srow + p * R, bars, (0, j))
            kaio.tma_load_2d(s_s, (1, p, 0), td, 0, srow + p * R, bars, (0, j))
        for c in kaio.static_range(D // 64):
            if x == 0:
                kaio.tma_load_2d(a_s, (p, c, 0, 0), ta, row + p * R, col + c * 64, bars, (0, j))
            else:
                kaio.tma_load_2d(b_s, (p, c, 0, 0), tb, row + p * R, col + c * 64, bars, (0, j))


@kaio.gpu_func
def rotation(x: i32, nx: i32, items: i32, causal: i32, ROT: kaio.constexpr) -> i32:
    """The item where block x of ``nx`` begins a rotated walk over ``items`` (``ROT``,
    without the mask): x items / nx, else 0."""
    s0 = i32(0)
    if ROT:
        if causal == 0:
            s0 = x * items // nx
    return s0


@kaio.gpu_func
def produce_qdo(
    k_s: DT[:, :, :], v_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :],
    bars: u64[:, :], turn: u64[:], tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap,
    tdo: kaio.tensormap, once_row: i32, once_col: i32, ring_row: i32, ring_col: i32,
    head_stride: i32, col_stride: i32, heads_n: i32, first: i32, n_tiles: i32,
    s_s: f32[:, :, :], tl: kaio.tensormap, td: kaio.tensormap, stat_at: i32, stat_stride: i32,
    s0: i32, D: kaio.constexpr, BM: kaio.constexpr, DT: kaio.constexpr,
    HALVES: kaio.constexpr,
):  # fmt: skip
    """``attention_bwd_dkdv_d256q``'s copies: the 64 rows of K and V from ``once_row``
    (columns from ``once_col``) once, on ``turn[0]``; then for each head j < heads_n and
    query tile t in first .. n_tiles the ``BM`` rows from ``ring_row + j head_stride + t
    BM`` (columns from ``ring_col + j col_stride``) of dO, then of Q (``copy_in_turn``, in
    halves of 64 rows: ``do_s[0]``, ``do_s[1]``; ``HALVES`` 1: dO's and Q's first halves,
    then their second), with dO the lse and delta of its rows (``stats[0 and 1, half]``),
    head j's ``stat_at + j stat_stride`` further than the rows; the walk over these (head,
    tile) items begins at item ``s0`` and wraps around (``walk_start``)."""
    C = D // 64
    kaio.mbarrier_arrive_expect_tx(turn, 0, u32(2 * 64 * D * 2))
    for c in kaio.static_range(C):
        kaio.tma_load_2d(k_s, (c, 0, 0), tk, once_row, once_col + c * 64, turn, 0)
        kaio.tma_load_2d(v_s, (c, 0, 0), tv, once_row, once_col + c * 64, turn, 0)
    ph = u32(0)  # tile i's parity
    t, j = walk_start(s0, first, n_tiles, 0, 1)  # tile t of head j
    for i in range(heads_n * kaio.max(n_tiles - first, 0)):
        row = ring_row + j * head_stride + t * BM
        c0 = ring_col + j * col_stride
        srow = row + stat_at + j * stat_stride
        t, j = next_tile_wrapped(t, j, first, n_tiles, 1, 0, heads_n)
        copy_in_turn(do_s, q_s, tdo, tq, bars, row, c0, i, ph, s_s, tl, td, srow, BM, 2, D, DT,
                     1, HALVES)  # dO, then Q  # fmt: skip
        ph ^= 1


@kaio.gpu_func
def back_halves(
    dva: f32[:, :], dka: f32[:, :], pt_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :],
    bars: u64[:, :], ph: u32, lt: u32, cb: i32, H: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``consume_q128``'s dV += P^T dO and dK += dS^T Q (``HALVES`` 1) a half of the tile's
    queries at a time, each as soon as that half's P^T and dS^T are stored
    (``bars[1, 5]``: the first warpgroup's warps, ``bars[1, 7]``: the second's), so that the
    first warpgroup's products of its own half run beside the second's P^T step; then dO's
    and Q's first halves, then their second, freed as their products end (``produce_qdo``
    copies them in that order)."""
    for h in kaio.static_range(2):
        kaio.mbarrier_wait(bars, (1, 5 + 2 * h), ph)  # half h's P^T, dS^T stored
        kaio.mbarrier_wait(bars, (0, h), ph)  # its dO and Q (the other warpgroup's: landed)
        kaio.mbarrier_wait(bars, (0, 2 + h), ph)
        kaio.wgmma_fence()
        issue_pt(dva, pt_s, h, u32(0), do_s, h, H, DT, cb)
        issue_pt(dka, pt_s, 2 + h, u32(0), q_s, h, H, DT, cb)
    for j in kaio.static_range(4):  # dO's half 0, Q's half 0, dO's half 1, Q's half 1
        kaio.wgmma_wait(3 - j)
        release(bars, j % 2 * 2 + j // 2, lt)


@kaio.gpu_func
def consume_q128(
    k_s: DT[:, :, :], v_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], lse: f32[:], delta: f32[:], dk: DT[:],
    dv: DT[:], pt_s: DT[:, :, :], wg: u32, lt: u32, group: i32, first: i32, n_tiles: i32, k0: i32,
    sq: i32, sk: i32, causal: i32, scale_log2: f32, scale: f32, shift: i32, stat_at: i32,
    stat_stride: i32, out_at: i32, out_stride: i32, D: kaio.constexpr, BM: kaio.constexpr,
    s0: i32, DT: kaio.constexpr, FIRST: kaio.constexpr, HALVES: kaio.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``wg`` of ``attention_bwd_dkdv_d256q`` (thread ``lt`` of it): per
    query tile of ``BM`` (128) rows in two halves of 64, dP^T = V dO_w^T once dO's half wg
    has landed and S^T = K Q_w^T once Q's has, for its half (m64n64k16: K and V read half as
    often per product as with 32 queries); P^T and dS^T to buffers ``pt_s[wg]``,
    ``pt_s[2 + wg]`` (once both warpgroups' last tile's products are done: ``bars[1, 4]``),
    then, once both warpgroups' are there (``bars[1, 5]``), dV[:, D / 2 wg ..] += P^T dO and
    dK[:, D / 2 wg ..] += dS^T Q over the whole tile, a half at a time, each half of dO and
    Q freed (``bars[1, 0 .. 3]``) as soon as the products reading it are done; then dK, dV
    stored (rows ``out_stride`` apart from ``out_at``; the queries as ``consume_split``'s,
    the lse and delta from ``stats[0 and 1, wg]``). ``FIRST`` 1 (warpgroup 0): arrives on
    ``bars[1, 6]`` once its front products are done; 0: waits for that before issuing its
    own. ``HALVES`` 1: the products of each half of the queries as soon as its P^T and dS^T
    are stored (``back_halves``). The walk begins at item ``s0`` (``produce_qdo``'s)."""
    H = BM // 2  # this warpgroup's queries of a tile
    NH = D // 2  # its columns of dK and dV
    lane, kr, q1, cb = split_roles(lt, wg, H, NH)
    key0 = k0 + kr
    dka = kaio.local(f32, (NH // 8, 4))
    dva = kaio.local(f32, (NH // 8, 4))
    zero_acc(dka, NH)
    zero_acc(dva, NH)
    s = kaio.local(f32, (H // 8, 4))  # S^T, then P^T
    dp = kaio.local(f32, (H // 8, 4))  # dP^T, then dS^T
    total = group * kaio.max(n_tiles - first, 0)
    kaio.mbarrier_wait(turn, 0, 0)  # K and V landed
    ph = u32(0)  # tile i's parity: the copies', the buffers'
    t, at0 = walk_start(s0, first, n_tiles, stat_at, stat_stride)
    for _i in range(total):
        if FIRST == 0:  # the second warpgroup: the first's front products done
            kaio.mbarrier_wait(bars, (1, 6), ph)
        kaio.mbarrier_wait(bars, (0, i32(wg)), ph)  # dO's half of this warpgroup's queries
        kaio.wgmma_fence()
        issue_st(dp, v_s, do_s, i32(wg), 0, D, DT)
        kaio.mbarrier_wait(bars, (0, 2 + i32(wg)), ph)  # Q's
        issue_st(s, k_s, q_s, i32(wg), 0, D, DT)
        kaio.wgmma_wait(0)
        if FIRST:
            kaio.sync_warp()
            if lt % 32 == 0:
                kaio.mbarrier_arrive(bars, (1, 6))
        grads_t(s, dp, stats, i32(wg), lse, delta, at0, key0, t * BM + q1 + shift, sq + shift,
                1 << 30, causal, scale_log2, lane, H, 1, 1)  # fmt: skip
        if _i > 0:  # the last tile's dV and dK products done in both warpgroups
            kaio.mbarrier_wait(bars, (1, 4), ph ^ 1)
        store_ds(pt_s, i32(wg), s, kr, lane, H, DT)
        store_ds(pt_s, 2 + i32(wg), dp, kr, lane, H, DT)
        if HALVES:
            release(bars, 5 + 2 * i32(wg), lt)  # this half's P^T, dS^T there
            back_halves(dva, dka, pt_s, q_s, do_s, bars, ph, lt, cb, H, DT)
        else:
            release(bars, 5, lt)
            kaio.mbarrier_wait(bars, (1, 5), ph)  # both warpgroups' queries there
            for j in kaio.static_range(4):  # (the other halves landed: the other one waited)
                kaio.mbarrier_wait(bars, (0, j), ph)
            kaio.wgmma_fence()
            for h in kaio.static_range(2):  # dV += P^T dO, a half of the queries at a time
                issue_pt(dva, pt_s, h, u32(0), do_s, h, H, DT, cb)
            for h in kaio.static_range(2):  # dK += dS^T Q
                issue_pt(dka, pt_s, 2 + h, u32(0), q_s, h, H, DT, cb)
            for j in kaio.static_range(4):  # dO's halves, then Q's, free as their products end
                kaio.wgmma_wait(3 - j)
                release(bars, j, lt)
        release(bars, 4, lt)  # and the buffers
        ph ^= 1
        t, at0 = next_tile_wrapped(t, at0, first, n_tiles, stat_stride, stat_at, group)
    at = out_at + NH * i32(wg)  # this warpgroup's columns
    store_tile(dk, dka, at, key0, sk, scale, lane, NH, DT, 1, out_stride)
    store_tile(dv, dva, at, key0, sk, 1.0, lane, NH, DT, 1, out_stride)


@kaio.gpu_kernel(fastmath=True)  # ex2.approx.ftz: one instruction an exponential
def attention_bwd_dkdv_d256q(
    tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap, tdo: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, lse: f32[:], delta: f32[:], dk: DT[:], dv: DT[:],
    seq_q: i32, seq_k: i32, heads: i32, group: i32, scale_log2: f32, scale: f32, causal: i32,
    cu_q: i32[:], cu_k: i32[:], tp: i32, ws: DT[:], head_tiles: i32, tri: i32, y0: i32,
    D: kaio.constexpr,
    REGS: kaio.constexpr, DT: kaio.constexpr, COLS: kaio.constexpr, HALVES: kaio.constexpr,
    ROT: kaio.constexpr, DS: kaio.constexpr,
):  # fmt: skip
    """dk, dv of the 64 keys of key block x and K/V head y0 + y (``COLS`` 1: of sequence
    z): ``dkdv_block``, the workspace (``DS`` 1) from K/V head y0's first query head on."""
    t, wg, lt = thread_roles(2)
    dkdv_block(tk, tv, tq, tdo, tl, td, lse, delta, dk, dv, seq_q, seq_k, heads, group,
               scale_log2, scale, causal, cu_q, cu_k, tp, t, wg, lt, i32(kaio.block_idx_x()),
               y0 + i32(kaio.block_idx_y()), i32(kaio.grid_dim_x()), ws, head_tiles, tri,
               y0 * group, D, REGS, DT, COLS, HALVES, ROT, DS)  # fmt: skip


@kaio.gpu_func
def dkdv_block(
    tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap, tdo: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, lse: f32[:], delta: f32[:], dk: DT[:], dv: DT[:],
    seq_q: i32, seq_k: i32, heads: i32, group: i32, scale_log2: f32, scale: f32, causal: i32,
    cu_q: i32[:], cu_k: i32[:], tp: i32, t: u32, wg: u32, lt: u32, x: i32, y: i32, nx: i32,
    ws: DT[:], head_tiles: i32, tri: i32, ws_head0: i32, D: kaio.constexpr,
    REGS: kaio.constexpr,
    DT: kaio.constexpr, COLS: kaio.constexpr, HALVES: kaio.constexpr, ROT: kaio.constexpr,
    DS: kaio.constexpr,
):  # fmt: skip
    """dk, dv of the 64 keys of key block x (of nx) and K/V head y (``COLS`` 1: of sequence
    z) (thread t, warpgroup wg, its thread lt: ``thread_roles``), as
    ``attention_bwd_dkdv_d256`` (its arguments, DQ 0) but with query tiles of 128 rows in
    two halves of 64 (``tq``, ``tdo`` in boxes of (64, 64)), each half of Q and dO with
    barriers of its own (``produce_qdo``, ``consume_q128``): the 224 KB of K, V, Q, dO and
    the P^T, dS^T buffers leave no room for a second stage; a half is copied again as soon
    as the tile's products that read it are done. ``tl``, ``td``: lse and delta as [1, rows]
    f32 in boxes of (1, 64), copied with each half of dO (``lse``, ``delta``: unread).
    ``HALVES`` 1: each half's dV and dK products as soon as its P^T and dS^T are there
    (``back_halves``). ``ROT`` 1 (dense, without the mask): key block x's walk over its W
    (head, tile) items begins at item x W / nx and wraps around, so that the blocks of a
    head read different tiles at any time. ``DS`` 1 (dense, ``HALVES`` 1): each tile's dS^T
    halves also copied to the workspace ``ws`` by the producer warpgroup's second warp
    (``store_ds_tiles``; its heads from query head ``ws_head0`` on, ``head_tiles`` tiles a
    head, ``tri``: as ``ds_tiles_before``), for ``attention_bwd_dq_ds``."""
    BM = 128
    C = D // 64
    ONCE = 64 * D * 2
    TILE = BM * D * 2
    k_s = kaio.shared_dynamic(DT, (C, 64, 64), 0)
    v_s = kaio.shared_dynamic(DT, (C, 64, 64), ONCE)
    q_s = kaio.shared_dynamic(DT, (2, C, BM // 2, 64), 2 * ONCE)  # in halves of 64 rows
    do_s = kaio.shared_dynamic(DT, (2, C, BM // 2, 64), 2 * ONCE + TILE)
    PT = 2 * ONCE + 2 * TILE
    pt_s = kaio.shared_dynamic(DT, (4, 64, 64), PT)  # P^T halves, dS^T halves
    stats = kaio.shared_dynamic(f32, (2, 2, 64), PT + 4 * 64 * 64 * 2)  # lse, delta of the halves
    BARS = PT + 4 * 64 * 64 * 2 + 2 * 2 * 64 * 4
    bars = kaio.shared_dynamic(u64, (2, 8), BARS)
    turn = kaio.shared_dynamic(u64, (2,), BARS + 128)
    start_q, start_k, shift, stat_off, sq, sk = varlen_block(cu_q, cu_k, seq_q, seq_k, causal,
                                                             COLS)  # fmt: skip
    k0 = x * 64
    if COLS and k0 >= sk:  # keys past the sequence's end: nothing to do
        return
    kvh = y
    first_head, first, n_tiles, stat_at, stat_stride, out_at, out_stride = key_block(
        kvh, k0, heads, group, sq, sk, causal, tp, start_q, start_k, shift, stat_off, D, BM, COLS
    )
    s0 = rotation(x, nx, group * (n_tiles - first), causal, ROT * (1 - COLS))
    if t == 0:  # (0 and 1, 0 .. 3): dO's halves, Q's; (1, 4 ..): the buffers'
        init_barriers(bars, turn, 2, 4, 0, 1)
        kaio.mbarrier_init(bars, (1, 4), 8 + DS)  # the buffers free (DS: and copied out)
        kaio.mbarrier_init(bars, (1, 5), 4 if HALVES else 8)  # P^T, dS^T there (HALVES: half 0)
        kaio.mbarrier_init(bars, (1, 6), 4)  # the first warpgroup's front products done
        kaio.mbarrier_init(bars, (1, 7), 4)  # HALVES: half 1's P^T, dS^T there
    kaio.sync_threads()
    if wg < 2:
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        if wg == 0:  # (a branch a warpgroup: the second waits for the first)
            consume_q128(k_s, v_s, q_s, do_s, stats, bars, turn, lse, delta, dk, dv, pt_s, wg,
                         lt, group, first, n_tiles, k0, sq, sk, causal, scale_log2, scale,
                         shift, stat_at, stat_stride, out_at, out_stride, D, BM, s0, DT,
                         1, HALVES)  # fmt: skip
        else:
            consume_q128(k_s, v_s, q_s, do_s, stats, bars, turn, lse, delta, dk, dv, pt_s, wg,
                         lt, group, first, n_tiles, k0, sq, sk, causal, scale_log2, scale,
                         shift, stat_at, stat_stride, out_at, out_stride, D, BM, s0, DT,
                         0, HALVES)  # fmt: skip
    else:
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            if COLS:  # heads side by side: the K/V head's and the query heads' columns
                produce_qdo(k_s, v_s, q_s, do_s, bars, turn, tk, tv, tq, tdo, start_k + k0,
                            kvh * D, start_q, first_head * D, 0, D, group, first, n_tiles,
                            stats, tl, td, stat_at - start_q + shift, stat_stride, s0, D,
                            BM, DT, HALVES)  # fmt: skip
            else:
                produce_qdo(k_s, v_s, q_s, do_s, bars, turn, tk, tv, tq, tdo, kvh * sk + k0, 0,
                            first_head * sq, 0, sq, 0, group, first, n_tiles, stats, tl, td, 0,
                            0, s0, D, BM, DT, HALVES)  # fmt: skip
        elif DS and lt == 32:
            store_ds_tiles(ws, pt_s, bars, first_head - ws_head0, head_tiles, x, nx, tri,
                           group, first, n_tiles, s0, DT)  # fmt: skip


@kaio.gpu_func
def ds_tiles_before(t: i32, nkb: i32, tri: i32) -> i32:
    """The 64 x 64 dS^T tiles of a head's workspace (``attention_bwd_dq_ds``'s) before its
    128-query tile t: each tile u holds two halves of ``ds_row_tiles(u)`` key blocks. With
    ``tri`` 1 (causal) tile u keeps the key blocks its queries see, min(2u + 2, nkb), about
    half of them; those up to ``nkb // 2`` grow by two a tile, the rest are whole rows.
    (Plain arithmetic: the host calls it too, ``ds_head_tiles``.)"""
    u = min(t, tri * (nkb // 2))
    return 2 * u * (u + 1) + 2 * (t - u) * nkb


@kaio.gpu_func
def ds_row_tiles(t: i32, nkb: i32, tri: i32) -> i32:
    """The key blocks of each half of 128-query tile t in the workspace (``ds_tiles_before``):
    those its queries see (min(2t + 2, nkb)) with ``tri`` 1, else all ``nkb``."""
    return min(nkb, 2 * t + 2) if tri != 0 else nkb


@kaio.gpu_func
def store_ds_tiles(
    ws: DT[:], pt_s: DT[:, :, :], bars: u64[:, :], head0: i32, head_tiles: i32, x: i32,
    nkb: i32, tri: i32, heads_n: i32, first: i32, n_tiles: i32, s0: i32,
    DT: kaio.constexpr,
):  # fmt: skip
    """``dkdv_block``'s DS 1 (one thread): each tile's dS^T halves (``pt_s[2]``,
    ``pt_s[3]``: 64 keys x 64 queries, as ``store_ds`` swizzled them) copied whole to the
    workspace ``ws`` as they are stored (``bars[1, 5]``, ``bars[1, 7]``), the buffers freed
    (``bars[1, 4]``) once the copies have read them. The workspace is, for each head,
    ``head_tiles`` tiles of 64 x 64 (rows of 64): for each 128-query tile t its two halves
    of ``ds_row_tiles`` key blocks (``ds_tiles_before``). This block (key block x) writes
    tile x of half h of tile t of its head j (``head0 + j`` in the workspace); the walk as
    ``produce_qdo``'s."""
    ph = u32(0)
    t, j = walk_start(s0, first, n_tiles, 0, 1)
    for _i in range(heads_n * kaio.max(n_tiles - first, 0)):
        at = (head0 + j) * head_tiles + ds_tiles_before(t, nkb, tri) + x
        for h in kaio.static_range(2):
            kaio.mbarrier_wait(bars, (1, 5 + 2 * h), ph)  # half h's dS^T stored
            row = (at + h * ds_row_tiles(t, nkb, tri)) * 64
            kaio.bulk_store(ws, i64(row) * 64, pt_s, (2 + h, 0, 0), u32(64 * 64 * 2))
        kaio.bulk_commit()
        kaio.bulk_wait_read(0)
        kaio.mbarrier_arrive(bars, (1, 4))
        ph ^= 1
        t, j = next_tile_wrapped(t, j, first, n_tiles, 1, 0, heads_n)
    kaio.bulk_wait(0)


@kaio.gpu_func
def produce_kv(
    q_s: DT[:, :, :], do_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], tq: kaio.tensormap,
    tdo: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap, tl: kaio.tensormap,
    td: kaio.tensormap, q_row: i32, kv_row: i32, n_tiles: i32, q_col: i32, kv_col: i32,
    stat_at: i32, D: kaio.constexpr, BQ: kaio.constexpr, BN: kaio.constexpr,
    s0: i32, DT: kaio.constexpr, SFIRST: kaio.constexpr,
):  # fmt: skip
    """The dQ kernel's copies (``attention_bwd_dq_d256``): the ``BQ`` rows of Q and dO from
    ``q_row`` (columns from ``q_col``) and their lse and delta (from ``q_row + stat_at``)
    once, on ``turn[0]``; then for each key tile j the ``BN`` rows from ``kv_row + j BN`` of
    V, then of K (``copy_in_turn``: V's barriers ``bars[0 and 1, 0]``, K's ``bars[0 and 1,
    1]``), columns from ``kv_col``. ``SFIRST`` 1: K first, into stage j % 2 of two
    (barriers ``bars[0 and 1, 1 + j % 2]``), then V. The key tiles from tile ``s0`` on,
    wrapping around."""
    C = D // 64
    kaio.mbarrier_arrive_expect_tx(turn, 0, u32(2 * BQ * D * 2 + 2 * BQ * 4))
    for c in kaio.static_range(C):
        kaio.tma_load_2d(q_s, (c, 0, 0), tq, q_row, q_col + c * 64, turn, 0)
        kaio.tma_load_2d(do_s, (c, 0, 0), tdo, q_row, q_col + c * 64, turn, 0)
    kaio.tma_load_2d(stats, (0, 0, 0), tl, 0, q_row + stat_at, turn, 0)
    kaio.tma_load_2d(stats, (1, 0, 0), td, 0, q_row + stat_at, turn, 0)
    ph = u32(0)  # tile j's parity
    for j in range(n_tiles):
        row = kv_row + rotated(j, s0, n_tiles) * BN
        if SFIRST:
            st = j % 2
            copy_rows(k_s, st, tk, bars, 1 + st, j >= 2, u32(j // 2 % 2), row, kv_col, BN, D, DT)
            copy_rows(v_s, 0, tv, bars, 0, j >= 1, ph, row, kv_col, BN, D, DT)
        else:
            copy_in_turn(v_s, k_s, tv, tk, bars, row, kv_col, j, ph, stats, tl, td, 0, BN, 1, D,
                         DT, 0)  # V, then K  # fmt: skip
        ph ^= 1


@kaio.gpu_func
def copy_rows(
    x_s: DT[:, :, :, :], st: i32, tx: kaio.tensormap, bars: u64[:, :], bar: i32, wait: bool_,
    ph: u32, row: i32, col: i32, ROWS: kaio.constexpr, D: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The ``ROWS`` rows from ``row`` (columns from ``col``) of ``tx`` into stage st of x_s,
    on barrier ``bars[0, bar]`` (parity ``ph``), once the consumers freed the stage's last
    copy (``bars[1, bar]``) where ``wait``."""
    if wait:
        kaio.mbarrier_wait(bars, (1, bar), ph ^ 1)
    kaio.mbarrier_arrive_expect_tx(bars, (0, bar), u32(ROWS * D * 2))
    for c in kaio.static_range(D // 64):
        kaio.tma_load_2d(x_s, (st, c, 0, 0), tx, row, col + c * 64, bars, (0, bar))


@kaio.gpu_func
def row_stats(l2: f32[:], dl: f32[:], stats: f32[:, :, :], local: i32, row0: i32, sq: i32):
    """l2[h], dl[h] = the log2-scaled lse and the delta of this thread's rows row0 + 8h (at
    ``local`` + 8h in ``stats[0 and 1, 0]``); +inf and 0 for rows at or past sq (then
    masked: zero probabilities)."""
    for h in kaio.static_range(2):
        inside = row0 + 8 * h < sq
        l2[h] = kaio.select(inside, lse_log2(stats[0, 0, local + 8 * h]), POS_INF)
        dl[h] = kaio.select(inside, stats[1, 0, local + 8 * h], 0.0)


@kaio.gpu_func
def rotated(j: i32, s0: i32, n: i32) -> i32:
    """Item j of a walk over n items that begins at item s0 and wraps around."""
    k = j + s0
    if k >= n:
        k -= n
    return k


@kaio.gpu_func
def grads_after_s(
    s: f32[:, :], dp: f32[:, :], l2: f32[:], dl: f32[:], k0: i32, row0: i32, sk: i32,
    causal: i32, scale_log2: f32, lane: u32, BN: kaio.constexpr,
):  # fmt: skip
    """``grads`` (SPLIT) for S's product done and dP's, issued after it, in flight: P first
    (the exponentials beside dP's product), then, once dP is done, dp = dS = P (dP -
    delta)."""
    kaio.wgmma_wait(1)
    if k0 + BN > sk or (causal != 0 and k0 + BN > row0 - i32(lane // 4) + 1):
        probs(s, l2, k0, row0, sk, causal, scale_log2, lane, True, BN)
    else:
        probs(s, l2, k0, row0, sk, causal, scale_log2, lane, False, BN)
    kaio.wgmma_wait(0)
    for n in kaio.static_range(BN // 8):
        for x in kaio.static_range(4):
            dp[n, x] = s[n, x] * (dp[n, x] - dl[x // 2])


@kaio.gpu_func
def probs(
    s: f32[:, :], l2: f32[:], k0: i32, row0: i32, sk: i32, causal: i32, scale_log2: f32,
    lane: u32, masked: bool_, BN: kaio.constexpr,
):  # fmt: skip
    """s = P of one key tile (``grads_loop``'s keys and rows), masked where ``masked``."""
    for n in kaio.static_range(BN // 8):
        for x in kaio.static_range(4):
            p = kaio.exp2(kaio.fma(s[n, x], scale_log2, -l2[x // 2]))
            if masked:
                key = k0 + n * 8 + i32(lane % 4) * 2 + x % 2
                p = kaio.select(key < sk and (causal == 0 or key <= row0 + 8 * (x // 2)), p, 0.0)
            s[n, x] = p


@kaio.gpu_func
def consume_dq_kv(
    q_s: DT[:, :, :], do_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], dq: DT[:], wg: u32, lt: u32, q0: i32,
    n_tiles: i32, sq: i32, sk: i32, causal: i32, scale_log2: f32, scale: f32, out_at: i32,
    out_stride: i32, s0: i32, D: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr,
    SFIRST: kaio.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``wg``'s 64 query rows (thread ``lt`` of it) of
    ``attention_bwd_dq_d256``: per key tile dP = dO V^T as soon as V has landed, S = Q K^T
    once K has, V freed when dP is done (the next V loads while S, dS and dQ run), dS, dQ +=
    dS K, K freed (the next K loads while the next dP runs); then dQ stored at ``out_at``,
    rows ``out_stride`` apart. The unmasked key tiles take a branch without the mask's
    instructions (``grads``' SPLIT). ``SFIRST`` 1: S first (K in two stages, the next
    tile's loading while this one is read), then dP, P computed while dP's product runs
    (``grads_after_s``), and each tile's dQ product left in flight until the next tile's S
    and dP are issued (its K stage freed then). The key tiles from tile ``s0`` on, wrapping
    around."""
    lane, local, _, _ = split_roles(lt, wg, 64, 64)
    local += 64 * i32(wg)  # this thread's rows q0 + local (+ 8)
    row0 = q0 + local
    s = kaio.local(f32, (BN // 8, 4))
    dp = kaio.local(f32, (BN // 8, 4))
    ds = kaio.local(u32, (BN // 16, 4))
    dqa = kaio.local(f32, (D // 8, 4))
    zero_acc(dqa, D)
    l2 = kaio.local(f32, 2)
    dl = kaio.local(f32, 2)
    kaio.mbarrier_wait(turn, 0, 0)  # Q, dO and their rows' stats landed
    row_stats(l2, dl, stats, local, row0, sq)
    ph = u32(0)
    for j in range(n_tiles):
        k0 = rotated(j, s0, n_tiles) * BN
        kst = j % 2 if SFIRST else 0  # K's stage
        if SFIRST:
            kaio.mbarrier_wait(bars, (0, 1 + kst), u32(j // 2 % 2))  # K landed
            kaio.wgmma_fence()
            issue_s(s, q_s, k_s, kst, wg, 0, D, DT)  # S = Q K^T
            kaio.mbarrier_wait(bars, (0, 0), ph)  # V landed
            issue_s(dp, do_s, v_s, 0, wg, 0, D, DT)  # dP = dO V^T
            kaio.wgmma_wait(2)  # the last tile's dQ product, left in flight, done
            if j > 0:
                release(bars, 2 - kst, lt)  # its K free
            grads_after_s(s, dp, l2, dl, k0, row0, sk, causal, scale_log2, lane, BN)
            release(bars, 0, lt)  # V free
        else:
            kaio.mbarrier_wait(bars, (0, 0), ph)  # V landed
            kaio.wgmma_fence()
            issue_s(dp, do_s, v_s, 0, wg, 0, D, DT)  # dP = dO V^T
            kaio.mbarrier_wait(bars, (0, 1), ph)  # K landed
            issue_s(s, q_s, k_s, 0, wg, 0, D, DT)  # S = Q K^T
            kaio.wgmma_wait(1)
            release(bars, 0, lt)  # dP done: V free
            kaio.wgmma_wait(0)
            grads(s, dp, l2, dl, k0, row0, sk, causal, scale_log2, lane, BN, 1)
        pack_p(ds, dp, BN, DT)
        kaio.wgmma_fence()
        issue_pv(dqa, ds, k_s, kst, BN, DT)  # dQ += dS K
        if SFIRST == 0:
            kaio.wgmma_wait(0)
            release(bars, 1, lt)  # K free
        ph ^= 1
    kaio.wgmma_wait(0)
    store_tile(dq, dqa, out_at, row0, sq, scale, lane, D, DT, 1, out_stride)


@kaio.gpu_kernel(fastmath=True)
def attention_bwd_dq_d256(
    tq: kaio.tensormap, tdo: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, dq: DT[:], seq_q: i32, seq_k: i32, heads: i32,
    group: i32, scale_log2: f32, scale: f32, causal: i32, cu_q: i32[:], cu_k: i32[:], tp: i32,
    D: kaio.constexpr, REGS: kaio.constexpr, DT: kaio.constexpr, COLS: kaio.constexpr,
    SFIRST: kaio.constexpr, ROT: kaio.constexpr,
):  # fmt: skip
    """dq of the 128 query rows of block x (the heaviest causal tiles first) of (batch, head)
    block y (``COLS`` 1: of sequence z): ``dq_block``."""
    t, wg, lt = thread_roles(2)
    dq_block(tq, tdo, tk, tv, tl, td, dq, seq_q, seq_k, heads, group, scale_log2, scale, causal,
             cu_q, cu_k, tp, t, wg, lt, i32(kaio.block_idx_x()), i32(kaio.block_idx_y()),
             i32(kaio.grid_dim_x()), D, REGS, DT, COLS, SFIRST, ROT)  # fmt: skip


@kaio.gpu_kernel(fastmath=True)
def attention_bwd_d256(
    tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap, tdo: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, tq2: kaio.tensormap, tdo2: kaio.tensormap,
    tl2: kaio.tensormap, td2: kaio.tensormap, lse: f32[:], delta: f32[:], dq: DT[:],
    dk: DT[:], dv: DT[:], seq_q: i32, seq_k: i32, heads: i32, group: i32, scale_log2: f32,
    scale: f32, causal: i32, none: i32[:], nkb: i32, nqb: i32, n_dkdv: i32,
    D: kaio.constexpr, REGS: kaio.constexpr, DT: kaio.constexpr, HALVES: kaio.constexpr,
    SFIRST: kaio.constexpr, ROT: kaio.constexpr,
):  # fmt: skip
    """Both kernels in one launch (dense): blocks below ``n_dkdv`` are
    ``attention_bwd_dkdv_d256q``'s (``dkdv_block``: key block b % nkb of K/V head b //
    nkb; its tensor maps tk .. td), the others ``attention_bwd_dq_d256``'s (``dq_block``:
    query block b % nqb of (batch, head) b // nqb; tq2 .. td2 and tk, tv). Blocks start in
    order, so the dQ blocks take the multiprocessors that the last dK/dV blocks leave
    idle, where two launches would wait for the last of those."""
    t, wg, lt = thread_roles(2)
    b = i32(kaio.block_idx_x())
    if b < n_dkdv:
        dkdv_block(tk, tv, tq, tdo, tl, td, lse, delta, dk, dv, seq_q, seq_k, heads, group,
                   scale_log2, scale, causal, none, none, 0, t, wg, lt, b % nkb, b // nkb, nkb,
                   dk, 0, 0, D, REGS, DT, 0, HALVES, ROT, 0)  # fmt: skip
    else:
        b -= n_dkdv
        dq_block(tq2, tdo2, tk, tv, tl2, td2, dq, seq_q, seq_k, heads, group, scale_log2, scale,
                 causal, none, none, 0, t, wg, lt, b % nqb, b // nqb, nqb, D, REGS, DT, 0,
                 SFIRST, ROT)  # fmt: skip


@kaio.gpu_func
def dq_block(
    tq: kaio.tensormap, tdo: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, dq: DT[:], seq_q: i32, seq_k: i32, heads: i32,
    group: i32, scale_log2: f32, scale: f32, causal: i32, cu_q: i32[:], cu_k: i32[:], tp: i32,
    t: u32, wg: u32, lt: u32, x: i32, y: i32, nx: i32, D: kaio.constexpr, REGS: kaio.constexpr,
    DT: kaio.constexpr, COLS: kaio.constexpr, SFIRST: kaio.constexpr, ROT: kaio.constexpr,
):  # fmt: skip
    """dq of the 128 query rows of block x of nx (counted from the last: the heaviest causal
    tiles first) of (batch, head) y (thread t, warpgroup wg, its thread lt), as the pair's
    ``attention_bwd_dq_wgmma`` with two warpgroups and 64-key tiles (its tensor maps, boxes
    of 128, resp. 64 rows; ``COLS`` 1 its varlen kernel's block z of packed sequences), but
    K and V each in a buffer of its own with its own barriers (``produce_kv``,
    ``consume_dq_kv``): the 192 KB of Q, dO, K and V leave no room for a second stage, and
    with one stage of both a tile's copies wait for its last product. ``SFIRST`` 1: K in
    two stages (224 KB in all), each tile's S issued first (``consume_dq_kv``). ``ROT`` 1
    (dense, without the mask): the walk over the key tiles begins at tile x n_tiles / nx
    and wraps around."""
    BQ = 128
    BN = 64
    C = D // 64
    ONCE = BQ * D * 2
    KV = BN * D * 2
    q_s = kaio.shared_dynamic(DT, (C, BQ, 64), 0)
    do_s = kaio.shared_dynamic(DT, (C, BQ, 64), ONCE)
    KST = 2 if SFIRST else 1  # K's stages
    k_s = kaio.shared_dynamic(DT, (KST, C, BN, 64), 2 * ONCE)
    v_s = kaio.shared_dynamic(DT, (1, C, BN, 64), 2 * ONCE + KST * KV)
    stats = kaio.shared_dynamic(f32, (2, 1, BQ), 2 * ONCE + (KST + 1) * KV)
    BARS = 2 * ONCE + (KST + 1) * KV + 2 * BQ * 4
    bars = kaio.shared_dynamic(u64, (2, 3), BARS)
    turn = kaio.shared_dynamic(u64, (2,), BARS + 48)
    start_q, start_k, shift, stat_off, sq, sk = varlen_block(cu_q, cu_k, seq_q, seq_k, causal,
                                                             COLS)  # fmt: skip
    bh = y
    q0 = (nx - 1 - x) * BQ
    kvh, n_tiles = kv_head_and_tiles(bh, q0, heads, group, sk, causal, BQ, BN)
    out_at = bh * sq * D
    out_stride = D
    q_row = bh * sq + q0
    kv_row = kvh * sk
    q_col = 0
    kv_col = 0
    stat_at = 0
    if COLS:
        if q0 >= sq:  # past the sequence's end
            return
        kvh, n_tiles = kv_head_and_tiles(bh, q0 + shift, heads, group, sk, causal, BQ, BN)
        if n_tiles <= 0:  # no row sees a key: zeros
            zero_rows(dq, (start_q * heads + bh) * D, heads * D, q0, sq, 384, BQ, D, DT)
            return
        out_at = ((start_q - shift) * heads + bh) * D
        out_stride = heads * D
        q_row = start_q + q0
        kv_row = start_k
        q_col = bh * D
        kv_col = kvh * D
        stat_at = bh * tp + stat_off
    s0 = rotation(x, nx, n_tiles, causal, ROT * (1 - COLS))
    if t == 0:
        init_barriers(bars, turn, 2, 1 + KST, 0, 2)  # (0 and 1, 0): V's; (0 and 1, 1 ..): K's
    kaio.sync_threads()
    if wg < 2:
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        consume_dq_kv(q_s, do_s, k_s, v_s, stats, bars, turn, dq, wg, lt, q0 + shift, n_tiles,
                      sq + shift, sk, causal, scale_log2, scale, out_at, out_stride, s0, D, BN,
                      DT, SFIRST)  # fmt: skip
    else:
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            produce_kv(q_s, do_s, k_s, v_s, stats, bars, turn, tq, tdo, tk, tv, tl, td, q_row,
                       kv_row, n_tiles, q_col, kv_col, stat_at, D, BQ, BN, s0, DT,
                       SFIRST)  # fmt: skip


@kaio.gpu_func
def produce_ds(
    k_s: DT[:, :, :, :], ds_s: DT[:, :, :, :], bars: u64[:, :], tk: kaio.tensormap,
    tds: kaio.tensormap, kv_row: i32, ds_row: i32, half_rows: i32, n_tiles: i32,
    D: kaio.constexpr, STAGES: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``attention_bwd_dq_ds``'s copies (one thread): for each key tile j, its 64 rows of K
    (from ``kv_row + 64 j``) and the two dS^T tiles of the block's query halves (rows
    ``ds_row + h half_rows + 64 j`` of the workspace) into ring stage j % STAGES, once the
    consumers freed it."""
    st = i32(0)
    ph = u32(0)
    for j in range(n_tiles):
        if j >= STAGES:
            kaio.mbarrier_wait(bars, (1, st), ph ^ 1)
        kaio.mbarrier_arrive_expect_tx(bars, (0, st), u32(64 * D * 2 + 2 * 64 * 64 * 2))
        for h in kaio.static_range(2):
            kaio.tma_load_2d(ds_s, (st, h, 0, 0), tds, ds_row + h * half_rows + j * 64, 0,
                             bars, (0, st))  # fmt: skip
        for c in kaio.static_range(D // 64):
            kaio.tma_load_2d(k_s, (st, c, 0, 0), tk, kv_row + j * 64, c * 64, bars, (0, st))
        st, ph = next_stage(st, ph, STAGES)


@kaio.gpu_func
def issue_ds_k(dqa: f32[:, :], ds_s: DT[:, :, :, :], k_s: DT[:, :, :, :], st: i32, wg: u32,
               DT: kaio.constexpr):  # fmt: skip
    """Issue dqa += dS K and commit: dS^T the 64 keys x 64 queries of ``ds_s[st, wg]``
    (M-major, 128-byte swizzled), K the 64 keys of ``k_s[st]`` (N-major), all of dqa's
    columns."""
    for kk in kaio.static_range(4):
        da = kaio.smem_descriptor(ds_s, (st, i32(wg), kk * 16, 0), SW, 64 * SW, 1024)
        dk = kaio.smem_descriptor(k_s, (st, 0, kk * 16, 0), SW, 64 * SW, 1024)
        kaio.wgmma(DT, dqa, da, dk, True, True, True)
    kaio.wgmma_commit()


@kaio.gpu_func
def consume_ds(
    k_s: DT[:, :, :, :], ds_s: DT[:, :, :, :], bars: u64[:, :], dq: DT[:], wg: u32, lt: u32,
    n_tiles: i32, row0: i32, sq: i32, out_at: i32, scale: f32, D: kaio.constexpr,
    STAGES: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``wg`` of ``attention_bwd_dq_ds`` (thread ``lt``): dQ of its 64
    query rows += dS K over the key tiles, one tile's product left in flight while the next
    one's is issued, each stage freed once its product is done; then dQ scaled stored (this
    thread's rows ``row0``, ``row0 + 8``)."""
    lane = lt % 32
    dqa = kaio.local(f32, (D // 8, 4))
    zero_acc(dqa, D)
    st = i32(0)
    ph = u32(0)
    last = i32(0)
    for j in range(n_tiles):
        kaio.mbarrier_wait(bars, (0, st), ph)
        kaio.wgmma_fence()
        issue_ds_k(dqa, ds_s, k_s, st, wg, DT)
        kaio.wgmma_wait(1)
        if j > 0:
            release(bars, last, lt)  # the last tile's product done: its stage free
        last = st
        st, ph = next_stage(st, ph, STAGES)
    kaio.wgmma_wait(0)
    store_tile(dq, dqa, out_at, row0, sq, scale, lane, D, DT)


@kaio.gpu_kernel(fastmath=True)
def attention_bwd_dq_ds(
    tk: kaio.tensormap, tds: kaio.tensormap, dq: DT[:], seq_q: i32, seq_k: i32, heads: i32,
    group: i32, scale: f32, causal: i32, head_tiles: i32, tri: i32, bh0: i32,
    D: kaio.constexpr,
    REGS: kaio.constexpr, STAGES: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """dq of the 128 query rows of block x (counted from the last: the heaviest causal tiles
    first) of (batch, head) bh0 + y = scale dS K: dS^T from the workspace that the dK/dV
    kernel wrote (``DS`` 1; ``tds``: its rows of 64 in boxes of 64 x 64, unswizzled: the
    tiles are already swizzled; ``head_tiles`` tiles a head from bh0 on, laid out as
    ``ds_tiles_before`` with ``tri``) and K
    (``tk``, boxes of 64 rows) through a ring of ``STAGES`` stages: a plain product, no
    recomputation of S and dP (the dQ kernel's three products become one)."""
    C = D // 64
    KT = 64 * D * 2  # K's tile
    DST = 2 * 64 * 64 * 2  # the two dS^T tiles
    k_s = kaio.shared_dynamic(DT, (STAGES, C, 64, 64), 0)
    ds_s = kaio.shared_dynamic(DT, (STAGES, 2, 64, 64), STAGES * KT)
    BARS = STAGES * (KT + DST)
    bars = kaio.shared_dynamic(u64, (2, STAGES), BARS)
    turn = kaio.shared_dynamic(u64, (2,), BARS + 16 * STAGES)
    t, wg, lt = thread_roles(2)
    x = i32(kaio.block_idx_x())
    bh = bh0 + i32(kaio.block_idx_y())
    nx = i32(kaio.grid_dim_x())
    q0 = (nx - 1 - x) * 128
    kvh, n_tiles = kv_head_and_tiles(bh, q0, heads, group, seq_k, causal, 128, 64)
    nkb = (seq_k + 63) // 64
    if t == 0:
        init_barriers(bars, turn, 2, STAGES, 0, 1)
    kaio.sync_threads()
    if wg < 2:
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        row0 = q0 + 64 * i32(wg) + 16 * i32(lt // 32) + i32(lt % 32 // 4)
        consume_ds(k_s, ds_s, bars, dq, wg, lt, n_tiles, row0, seq_q, bh * seq_q * D, scale, D,
                   STAGES, DT)  # fmt: skip
    else:
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            tile = q0 // 128
            produce_ds(k_s, ds_s, bars, tk, tds, kvh * seq_k,
                       ((bh - bh0) * head_tiles + ds_tiles_before(tile, nkb, tri)) * 64,
                       ds_row_tiles(tile, nkb, tri) * 64, n_tiles, D, STAGES,
                       DT)  # fmt: skip


def ds_shared_bytes(d: int, stages: int) -> int:
    """``attention_bwd_dq_ds``'s dynamic shared memory: a ring of K tiles and dS^T tile
    pairs, the barriers."""
    return stages * (64 * d * 2 + 2 * 64 * 64 * 2) + 16 * stages + 16


def shared_bytes(d: int, bm: int, stages: int, dq: int = 0) -> int:
    """The dK/dV kernel's dynamic shared memory: K and V (64 rows), the ring's Q and dO
    (``bm`` rows a stage), four 64 x 64 P^T / dS^T buffers, the (unused) stats, dq_s (``dq``:
    ``bm`` x d f32; else 16 bytes), the barriers."""
    ring = 2 * 64 * d * 2 + 2 * stages * bm * d * 2
    return ring + 4 * 64 * 64 * 2 + 16 + (bm * d * 4 if dq else 16) + 16 * (stages + 4) + 16


def config(d: int = D256, dq: int | None = None) -> dict:
    """The constexprs for head dim ``d`` (256): ``{"dkdv": {BM, STAGES, REGS, DQ, EARLY},
    "dq": the pair's dQ kernel's {BN, WG, STAGES, PIPE, AREG, REGS}}``, as measured fastest
    on an H100 (f16 B4 H16 S4096 and B1 S16384, docs/hopper.md): 64-row query tiles and as
    many ring stages as fit (2; with ``DQ`` 1, the dK/dV kernel computing dQ too, 1) for
    dK/dV; for dQ (``DQ`` 0) two consumer warpgroups (128 query rows a block), one stage of
    64 keys, products in turn (496 TFLOP/s of its products, and 499 at S 16384, against one
    warpgroup with two stages' 492 and 431). ``dq``: ``DQ`` (default ``FUSED``)."""
    bm = 64
    dq = FUSED if dq is None else dq
    stages = max(n for n in (1, 2, 3) if shared_bytes(d, bm, n, dq) <= SHARED_LIMIT)
    regs = consumer_registers(2)
    dkdv = {"BM": bm, "STAGES": stages, "REGS": regs, "DQ": dq, "EARLY": 1, "COLS": 0,
            "Q128": Q128 if not dq else 0, "HALVES": HALVES, "ROT": ROT, "DS": DS}  # fmt: skip
    dq_cfg = {"BN": 64, "WG": 2, "STAGES": 1, "PIPE": 0, "AREG": 0, "REGS": regs, "KV": KV,
              "SFIRST": SFIRST, "ROT": ROT, "UNION": UNION}  # fmt: skip
    return {"dkdv": dkdv, "dq": dq_cfg}


# The dK/dV kernel at D 256 (without dQ): ``attention_bwd_dkdv_d256`` (0) or
# ``attention_bwd_dkdv_d256q`` (1: 128-query tiles, each half of Q and dO on barriers of its
# own; measured on an H100, f16 B4 H16 S4096, GPU round B of 2026-11-27: 503 TFLOP/s of its
# products against 463, causal 467 against 436).
Q128 = 1

# The Q128 kernel's dV and dK products: after both warpgroups' P^T, dS^T (0) or a half of the
# queries at a time, each as soon as its own are there (1: ``back_halves``; measured on an
# H100, f16 H16 D256, GPU round B of 2026-11-27: 581 TFLOP/s of its products against 545 at
# B4 S4096, 571 against 546 at B1 S16384; 2, S^T issued first and P^T computed while dP^T's
# product runs, 582 and 566: removed).
HALVES = 1

# Both kernels' walks rotated (without the mask: ``rotation``; measured on an H100, f16 H16
# D256, GPU round C of 2026-11-27, the whole backward timed in turn with the order rotated:
# 443 TFLOP/s against 427 at B4 S4096, 453 against 440 at B1 S16384).
ROT = 1

# The constexprs of config()["dkdv"] that only the Q128 kernel takes.
Q128_ONLY = ("Q128", "HALVES", "ROT", "DS")

# dQ from the dS^T tiles that the Q128 kernel copies to a workspace (1: ``DS``,
# ``attention_bwd_dq_ds``: one product a tile instead of three) or recomputed by the dQ kernel
# (0). Measured on an H100, H16 D256, GPU rounds A-D of 2026-11-27, each timed in a block
# after SDPA's (TFLOP/s, DS against the dQ kernel): f16 B1 S16384 542 / 423 causal, 531 / 436
# not; bf16 545 / 435, 533 / 446; B4 S4096 and B16 S1024 faster too (f16: 466 / 368, 515 /
# 405, 294 / 254, 378 / 347); grouped-query (Hkv 2 and 4, S16384, in turn) 17-24% faster.
# The kernels alone (f16 S16384 causal): the dK/dV kernel with its copies 535 against 541,
# dQ in 38% of the dQ kernel's time.
DS = 1

# attention_bwd_dq_ds's ring stages: as many as fit (48 KB each: K's tile, two dS^T tiles).
DS_STAGES = 4

# The most bytes of dS^T the workspace holds (DS 1): the backward runs in chunks of K/V heads
# whose tiles fit, and without DS where one head's do not. 2 GiB keeps the transient memory near
# that of the call's own tensors at long sequences (f16 B1 H16 S16384: four chunks, three
# causal: ``DS_TRI``), at some speed (measured on an H100, f16 B1 H16 S16384, GPU round D of
# 2026-11-27, timed in turn: TFLOP/s causal / not, unbounded 573 / 585, 8 GiB (one chunk)
# 561 / 572, 4 GiB (two) 558 / 536, 2 GiB (four) 523 / 520, against 451 / 440 without DS);
# lower it to trade speed for memory.
DS_BYTES = 2 << 30

# The causal workspace (DS 1) holds only the dS^T tiles that the causal queries see (1:
# ``ds_tiles_before``'s triangle, about half), or every key block of every query tile (0).
# Measured on an H100, causal, GPU rounds A-E of 2026-11-27: the same kernel times (f16 B1
# H16 S16384, profiler, 4 chunks each: 9279 µs against 9277; as chunked, 3 chunks against
# 4: 9286 against 9297), in turn 1% slower (7 rounds behind a GPU sleep: f16 9.47 ms
# against 9.38, bf16 9.25 against 9.16) to 2.5% faster (B4 S4096, 5 rounds); the call's
# transient memory 1.89 GiB against 2.38 at S16384, 1.41 against 2.38 at B4 S4096.
DS_TRI = 1


def dkdv_kernel(c: dict, d: int, dt) -> tuple:
    """(kernel, constexprs) of the dK/dV kernel of ``config(d)["dkdv"]`` ``c`` (``run_dkdv``)
    for element type ``dt``."""
    if c.get("Q128"):
        return attention_bwd_dkdv_d256q, {
            "D": d, "REGS": c["REGS"], "DT": dt, "COLS": c["COLS"], "HALVES": c["HALVES"],
            "ROT": c["ROT"], "DS": 0 if c["COLS"] else c.get("DS", 0),
        }  # fmt: skip
    return attention_bwd_dkdv_d256, {
        "D": d,
        "DT": dt,
        **{k: v for k, v in c.items() if k not in Q128_ONLY},
    }


def q128_shared_bytes(d: int) -> int:
    """``attention_bwd_dkdv_d256q``'s dynamic shared memory: K, V, Q, dO, the P^T and dS^T
    buffers, the lse and delta of a tile, the barriers."""
    return 2 * 64 * d * 2 + 2 * 128 * d * 2 + 4 * 64 * 64 * 2 + 2 * 2 * 64 * 4 + 128 + 16


def run_dkdv(c: dict, d: int, grid: tuple, stream, maps, stats, lse, delta, dk, dv,
             extra: tuple, args: tuple, offsets: dict, dt, ws=None, ws_layout: tuple = (0, 0),
             y0: int = 0) -> None:  # fmt: skip
    """Launch the dK/dV kernel of ``config(d)["dkdv"]`` ``c`` (``Q128`` 1:
    ``attention_bwd_dkdv_d256q``, else ``attention_bwd_dkdv_d256`` with ``extra``: its
    dq_acc and semaphores) on ``grid`` and ``stream``: ``maps(rows)`` the tensor maps of k, v
    (boxes of 64 rows) and q, do (boxes of ``rows``), ``stats(rows)`` those of lse and delta
    (the stats' rows in boxes of ``rows``), the lse and delta, dk and dv, the kernel's scalar
    ``args``, ``offsets`` (cu_q, cu_k, tp), the element type ``dt``; ``ws``, ``ws_layout``:
    the workspace of ``DS`` 1 and its (tiles a head, tri) (``ds_head_tiles``); ``y0``: grid
    row y is K/V head y0 + y."""
    if c.get("Q128"):
        smem = q128_shared_bytes(d)
        attention_bwd_dkdv_d256q[grid, 384, stream, smem](
            *maps(64), *stats(64), lse, delta, dk, dv, *args, **offsets,
            ws=dk if ws is None else ws, head_tiles=ws_layout[0], tri=ws_layout[1], y0=y0,
            D=d, REGS=c["REGS"], DT=dt,
            COLS=c["COLS"], HALVES=c["HALVES"], ROT=c["ROT"], DS=int(ws is not None),
        )  # fmt: skip
        return
    smem = shared_bytes(d, c["BM"], c["STAGES"], c["DQ"])
    consts = {k: v for k, v in c.items() if k not in Q128_ONLY}
    attention_bwd_dkdv_d256[grid, 384, stream, smem](
        *maps(c["BM"]), lse, delta, dk, dv, *extra, *args, **offsets, D=d, DT=dt, **consts
    )


# The dQ kernel at D 256: the pair's (0) or ``attention_bwd_dq_d256`` (1: K and V on
# barriers of their own; measured on an H100, f16 B4 H16 S4096, GPU round A of
# 2026-11-27: 648 TFLOP/s of its products against 507, causal 569 against 462).
KV = 1

# attention_bwd_dq_d256's order: dP first (0) or S first, K in two stages, each dQ product
# left in flight until the next tile's S and dP are issued (1; measured on an H100, f16 H16
# D256, GPU round B of 2026-11-27: 698 TFLOP/s of its products against 660 at B4 S4096, 599
# against 588 at B1 S16384, 637 against 613 causal; without dQ in flight: not timed, removed).
SFIRST = 1

# Both kernels in one launch (1: ``attention_bwd_d256``) or one after the other (0). Measured
# on an H100, f16 H16 D256, the whole backward timed in turn with the order rotated (TFLOP/s,
# one launch / two; B4 S4096, B1 S16384, causal S16384, causal S4096): without rotated walks
# 439/427, 456/440, 440/432, 392/383 (GPU round C of 2026-11-27); with them (as shipped)
# 426/430, 451/462 (round D), 423/425, 435/455, 421/407, 383/390 (round E): not faster, off.
UNION = 0


def dq_shared_bytes(d: int, sfirst: int) -> int:
    """``attention_bwd_dq_d256``'s dynamic shared memory: Q, dO, K (two stages where
    ``sfirst``), V, the rows' lse and delta, the barriers."""
    return 2 * 128 * d * 2 + (3 if sfirst else 2) * 64 * d * 2 + 2 * 128 * 4 + 48 + 16


def dq_kernel(c: dict, d: int, cols: int) -> tuple:
    """``(kernel, constexprs, threads, shared bytes, query rows, key rows)`` of the dQ
    kernel of ``config``'s ``c = config(d)["dq"]`` (``KV`` 1: ``attention_bwd_dq_d256``,
    else the pair's ``attention_bwd_dq_wgmma`` with c's other constexprs), ``COLS``
    ``cols``."""
    from kaio_ops import _attention_hopper_bwd as pair

    if c.get("KV"):
        smem = dq_shared_bytes(d, c["SFIRST"])
        consts = {"D": d, "REGS": c["REGS"], "COLS": cols, "SFIRST": c["SFIRST"], "ROT": c["ROT"]}
        return attention_bwd_dq_d256, consts, 384, smem, 128, 64
    bq = 64 * c["WG"]
    consts = {k: v for k, v in c.items() if k not in ("KV", "COLS", "SFIRST", "ROT", "UNION")}
    smem = pair.shared_bytes(d, bq, c["BN"], c["STAGES"], bq)
    return (pair.attention_bwd_dq_wgmma, {"D": d, "COLS": cols, **consts}, 128 * c["WG"] + 128,
            smem, bq, c["BN"])  # fmt: skip


# flash_attention_bwd's schedule at D 256: the pair (0) or the one kernel (1: ``DQ`` 1).
FUSED = 0


def eligible(d: int) -> bool:
    """Whether these kernels take head dim ``d``: 256 only."""
    return d == D256


def worthwhile(bh: int, sq: int, sk: int, d: int, sms: int) -> bool:
    """Whether ``flash_attention_bwd`` should take these kernels: head dim 256, whole 64-row
    tiles of queries and keys and sequences of 1024 and more (as the D 64 / 128 kernels'
    ``_attention_hopper_bwd.worthwhile``)."""
    return eligible(d) and sq % 64 == 0 and sk % 64 == 0 and sq >= 1024 and sk >= 1024


def launch(qa, ka, va, da, la, delta, dims: tuple, causal: bool, scale: float,
           cfg: dict | None = None, only: str | None = None,
           side: bool | None = None):  # fmt: skip
    """Run the kernels on checked operands (``_arrays.Operand``s q, do [B, H, Sq, D], k, v
    [B, Hkv, Sk, D], lse [B, H, Sq] f32) and ``delta`` (flat f32 [B * H * Sq], rowsum(dO *
    O)); ``dims``: (B * H, H, group, sq, sk, d, d); ``cfg``: overrides of ``config(d)``'s
    constexprs, per kernel. ``only``: "dkdv" or "dq" launches that kernel alone (to time
    it). ``side`` (default ``SIDE``; torch arrays): the pair's dQ kernel on a second stream
    beside the dK/dV kernel (``_attention_hopper_bwd.side_stream``). Returns (dq, dk, dv)
    of q's type and shapes."""
    import math

    from kaio_ops import _arrays
    from kaio_ops import _attention_hopper_bwd as pair

    bh, heads, group, sq, sk, d, _ = dims
    if sq % 4 or not eligible(d):
        raise ValueError(
            f"_attention_hopper_bwd256.launch: needs Sq a multiple of 4 (16-byte TMA copies of "
            f"lse and delta) and D 256, got Sq = {sq}, D = {d}; use the mma.sync kernels"
        )
    base = config(d, (cfg or {}).get("dkdv", {}).get("DQ"))
    c1, c2 = ({**base[n], **(cfg or {}).get(n, {})} for n in ("dkdv", "dq"))
    if c1["DQ"] and only:
        raise ValueError(f"_attention_hopper_bwd256.launch: DQ 1 is one kernel: only={only!r}")
    if c2["PIPE"] and c2["STAGES"] < 2:
        raise ValueError(f"_attention_hopper_bwd256.launch: PIPE 1 needs 2 stages: {c2}")
    stream, dq, dk, dv, rows_q, rows_kv = pair.launch_outputs(qa, ka, da, d)
    tmap = functools.partial(pair.row_map, d=d)

    args = (sq, sk, heads, group, math.log2(math.e) * scale, scale, int(causal))
    n_tiles = -(-sq // c1["BM"])
    acc_size = bh * n_tiles * c1["BM"] * d if c1["DQ"] else 4
    dq_acc = _arrays.output(da, (acc_size,), f32)  # (DQ 0: unused)
    sem = _arrays.output(da, (bh * n_tiles,), i32)
    none = _arrays.output(da, (1,), i32)  # (the varlen offsets: unused)
    if c1["DQ"]:
        zero_acc_sem[-(-acc_size // 1024), 256, stream, 0](dq_acc, acc_size, sem, bh * n_tiles)
    nkb = -(-sk // 64)
    tri = int(causal and DS_TRI)
    layout = (ds_head_tiles(-(-sq // 128), nkb, tri), tri)  # (tiles a head, tri)
    head_bytes = group * layout[0] * 64 * 64 * 2  # a K/V head's dS^T tiles (DS)
    # DS: keys past sk would reach dQ (the dK/dV kernel does not mask them)
    ds = c1.get("DS") and c1.get("Q128") and c1.get("HALVES") and sk % 64 == 0
    ds = ds and head_bytes <= DS_BYTES

    def dkdv_kernel(n_kv=bh // group, y0=0, ws=None):
        def maps(rows):
            return (
                tmap(ka, rows_kv, 64),
                tmap(va, rows_kv, 64),
                *(tmap(x, rows_q, rows) for x in (qa, da)),
            )

        out = (_arrays.output_arg(da, x, (ka.size,)) for x in (dk, dv))

        def stats(box):
            return pair.stats_maps(la, delta, rows_q, box)

        run_dkdv(c1, d, (nkb, n_kv), stream, maps, stats, la.arg(rows_q), delta, *out,
                 (dq_acc, sem), args, {"cu_q": none, "cu_k": none, "tp": 0}, qa.dtype,
                 None if ws is None else _arrays.output_arg(da, ws, (ws_size(ws),)), layout,
                 y0)  # fmt: skip

    if ds:  # in the fewest chunks of K/V heads whose dS^T fit DS_BYTES, as even as can be
        kv_heads = bh // group
        chunk = -(-kv_heads // -(-kv_heads // (DS_BYTES // head_bytes)))
        ws = _arrays.output(da, (chunk * group * layout[0] * 64 * 64,))
        for y0 in range(0, kv_heads, chunk):
            n = min(chunk, kv_heads - y0)
            if only != "dq":
                dkdv_kernel(n, y0, ws)
            if only != "dkdv":
                dq_from_ds(ka, da, ws, dq, dims, args, layout, c2["REGS"], stream, y0 * group,
                           n * group)  # fmt: skip
        return dq, dk, dv
    side = (SIDE if side is None else side) and only is None and not c1["DQ"]
    if c2["UNION"] and not side and c1["Q128"] and c2["KV"]:  # (only: that part's blocks)
        nkb, nqb = -(-sk // 64), -(-sq // 128)
        n_dkdv = nkb * (bh // group) if only != "dq" else 0
        outs = (_arrays.output_arg(da, x, (x_size,)) for x, x_size in
                ((dq, qa.size), (dk, ka.size), (dv, ka.size)))  # fmt: skip
        attention_bwd_d256[(n_dkdv + (nqb * bh if only != "dkdv" else 0),), 384, stream,
                           max(q128_shared_bytes(d), dq_shared_bytes(d, c2["SFIRST"]))](
            tmap(ka, rows_kv, 64), tmap(va, rows_kv, 64), tmap(qa, rows_q, 64),
            tmap(da, rows_q, 64), *pair.stats_maps(la, delta, rows_q, 64), tmap(qa, rows_q, 128),
            tmap(da, rows_q, 128), *pair.stats_maps(la, delta, rows_q, 128), la.arg(rows_q),
            delta, *outs, *args, none, nkb, nqb, n_dkdv, D=d, REGS=c1["REGS"],
            DT=qa.dtype, HALVES=c1["HALVES"], SFIRST=c2["SFIRST"], ROT=c2["ROT"],
        )  # fmt: skip
        return dq, dk, dv
    if only != "dq" and not side:
        dkdv_kernel()
    if c1["DQ"]:
        dq_convert_tiles[-(-qa.size // 1024), 256, stream, 0](
            _arrays.output_arg(da, dq, (qa.size,)), dq_acc, bh * sq, sq, scale, D=d, DT=qa.dtype
        )
    if only == "dkdv" or c1["DQ"]:
        return dq, dk, dv
    kernel, consts, threads, smem, bq, bn = dq_kernel(c2, d, 0)
    stats = pair.stats_maps(la, delta, rows_q, bq)
    with pair.side_stream(qa, side) as dq_stream:  # (there the dQ kernel first)
        kernel[(-(-sq // bq), bh), threads, dq_stream, smem](
            tmap(qa, rows_q, bq), tmap(da, rows_q, bq), tmap(ka, rows_kv, bn),
            tmap(va, rows_kv, bn), *stats, _arrays.output_arg(da, dq, (qa.size,)), *args,
            cu_q=none, cu_k=none, tp=0, DT=qa.dtype, **consts,
        )  # fmt: skip
        if side:
            dkdv_kernel()
    return dq, dk, dv


def ws_size(ws) -> int:
    """The elements of the workspace ``ws`` (a torch, CuPy, NumPy or kaio array)."""
    return int(ws.numel()) if hasattr(ws, "numel") else int(ws.size)


def ds_head_tiles(n_tiles: int, nkb: int, tri: int) -> int:
    """The 64 x 64 dS^T tiles of a head's workspace: ``ds_tiles_before`` its ``n_tiles``
    128-query tiles, ``nkb`` key blocks, ``tri`` 1 only those that the causal queries see."""
    return ds_tiles_before.__wrapped__(n_tiles, nkb, tri)


def dq_from_ds(ka, da, ws, dq, dims: tuple, args: tuple, layout: tuple, regs: int, stream,
               bh0: int, n_bh: int) -> None:  # fmt: skip
    """``attention_bwd_dq_ds`` on ``stream``: dq of the ``n_bh`` (batch, head)s from
    ``bh0`` = scale dS K from the workspace ``ws`` that the dK/dV kernel filled (``DS`` 1;
    ``layout``: its tiles a head and tri, as ``ds_head_tiles``), ``ka``, ``da`` the checked
    k and do, ``args`` the kernels' scalars."""
    from kaio_ops import _arrays
    from kaio_ops import _attention_hopper_bwd as pair

    bh, _, _, sq, sk, d, _ = dims
    tds = kaio.tensor_map_2d(_arrays.view(ws, da.kind, (ws_size(ws) // 64, 64)), (64, 64), 0)
    _, _, heads, group, _, scale, causal = args
    attention_bwd_dq_ds[(-(-sq // 128), n_bh), 384, stream, ds_shared_bytes(d, DS_STAGES)](
        pair.row_map(ka, bh // group * sk, 64, d), tds, _arrays.output_arg(da, dq, (bh * sq * d,)),
        sq, sk, heads, group, scale, causal, *layout, bh0, D=d, REGS=regs, STAGES=DS_STAGES,
        DT=da.dtype,
    )  # fmt: skip


# Whether the dQ kernel runs on a second stream beside the dK/dV kernel (``launch``).
SIDE = False


def specializations():
    """(kernel, constexprs) of the specializations ``launch`` runs (for PTX checks)."""
    from kaio import bf16, f16

    cfg = config()
    for dt in (f16, bf16):
        yield dkdv_kernel(cfg["dkdv"], D256, dt)
        if FUSED:
            yield dq_convert_tiles, {"D": D256, "DT": dt}
        elif DS:
            yield attention_bwd_dq_ds, {"D": D256, "REGS": cfg["dq"]["REGS"], "STAGES": DS_STAGES,
                                        "DT": dt}  # fmt: skip
        else:
            kernel, consts, *_ = dq_kernel(cfg["dq"], D256, 0)
            yield kernel, {"DT": dt, **consts}
        if UNION:
            yield attention_bwd_d256, {"D": D256, "REGS": cfg["dkdv"]["REGS"], "DT": dt,
                                       "HALVES": HALVES, "SFIRST": SFIRST, "ROT": ROT}  # fmt: skip
