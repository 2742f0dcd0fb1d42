"""The Hopper (sm_90a) flash-attention forward behind ``kaio_ops.flash_attention``:
FlashAttention-3's design (TMA, an mbarrier ring, warp specialization, ``wgmma``), written in
the DSL, generic over its element type (the dtype constexpr ``DT``: f16 or bf16).

A block owns ``BM = 64 * WG`` query rows of one (batch, head) and loops over the key tiles of
``BN`` keys (causal: up to the diagonal). Its threads:

- ``WG`` consumer warpgroups, each owning 64 query rows: S = Q K^T by ``wgmma`` with both
  operands in shared memory (Q K-major, K rows K-major: ``D / 16`` k-steps of
  ``m64n{BN}k16``), the online softmax on the accumulators in registers (a row's values sit
  in the 4 lanes of a lane group, as mma.sync's; ``_attention_tc.softmax_step``), then
  O += P V by ``wgmma`` with P from registers (the S accumulators of two adjacent n8 tiles
  rounded to DT pairs are the A fragment of a k-step: docs/hopper.md "A from registers") and
  V from shared memory, N-major (``BN / 16`` k-steps of ``m64n{D}k16``).
- a producer warp (one thread of it works): the TMA copies of the tile's Q (once) and
  of each key tile's K and V into a ``STAGES``-deep ring, each on its own "full" barrier so
  that S = Q K^T can start before V has landed; it waits on the ring's "free" barriers
  (one for K, one for V, an arrival from each consumer warpgroup) before refilling a stage.

``PIPE`` picks the schedule. 0: the plain order (S, softmax, P V, each waited for). 1 to 4
overlap the softmax with the tensor cores inside a warpgroup (FlashAttention-3's
intra-warpgroup pipelining): tile j's S = Q K_j^T and tile j - 1's O += P V are issued
together and the softmax of tile j runs while P V still runs; 3 and 4 (FlashAttention-3's
order) rescale O by tile j - 1's factors while S_j runs, before P V is issued, 1 and 2 once
P V has finished; 2 and 4 also make the two consumer warpgroups take turns to issue their
products (ping-pong: ``turn`` mbarriers, an arrival from each warp of the other warpgroup),
so that one's softmax overlaps the other's products. The softmax of the overlapped loop sits
in a block of its own (``if sk > 0``, always true): in one block with the wait for P V,
ptxas hoisted that wait above the softmax (SASS: ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` then
``0x0`` back to back), which undid the overlap.

The work tiles (query tile, head) come in sections of heads (``tile_of``), each
section's heaviest query tiles first (the causal mask's longest), so that the blocks
started last have the least work; ``launch`` takes sections of one head (a section of
several measured no faster, and slower at S = 16384; but for PERSIST 5, ``plan_section``).
``PERSIST`` 1: one block a multiprocessor, each looping over the work tiles first, first +
grid, ... (2: the rounds of tiles going back and forth over the blocks, for the causal
mask's unequal tiles; 3: pairs of a head's query tiles, the heaviest with the lightest,
``work_tile``; 4: each block's producer takes the next tile from a counter in global
memory, ``produce_dynamic``; 5: each block's tiles from a plan made on the host, each tile
to the block with the least work so far, ``balanced_plan``, passed in ``sched``);
without it, block (x, y) takes tile y * grid x + x (the hardware starts the blocks in that
order as others finish); the K/V ring's stage and parity, the ping-pong turns and the Q
buffer (refilled once every consumer warpgroup's last S = Q K^T of a tile is done,
``turn[4]``) carry from one tile to the next (``consume_tile``'s state), so that the
producer loads the next tile's keys while the consumers finish a tile.

``XT`` 1 (``consume_stream``) runs a persistent block's tiles as one stream of key-tile
steps: the first S = Q K^T of a tile is issued with the last O += P V of the one before, its
softmax (on fresh row maxima and sums) runs under that P V, then the finished tile's rows
are stored; a warpgroup whose rows end before the tile's last key tiles (the causal
diagonal with 192-row tiles and 128-key tiles) or lie past sq frees those key tiles as they
land instead of computing them (the tile-at-a-time consumers too, ``skip_tile``). ``QB`` 2
gives either schedule two Q buffers (the next tile's Q loads while this one's is read);
``ONES`` 1 has the tensor cores sum each row's probabilities, as 8 more columns of O from a
column block of ones beside each V stage (one FADD a score fewer; the sums are of the
probabilities as rounded for P V), and ``LSE`` 1 with it adds back what that rounding took
on the masked tiles, where a causal row with few keys sees all of them (its logsumexp then
as exact as with the FADD sums; ``softmax_tile``). ``HEXP`` 1 with ONES takes the
exponentials two at a time, as 16-bit pairs (``ex2.approx.f16x2``: one MUFU.EX2 for two
probabilities, which are then P's A fragments as they stand).
``LAZY`` 1 keeps a row's max while the scores pass it by at most 2^LAZY_GROWTH
(FlashAttention-4's lazy rescale: probabilities up to 2^8, O rescaled only where a max grew
further); 2, with EARLY, also takes the step's exponentials on the kept max, beside the new
max's chain rather than after it, and rescales P afterwards where a max did grow (``grown``;
rarely, the scores computed again from q and k in global memory). ``SPLIT`` 1 gives a head's
last tile, when its rows are all warpgroup 0's (no mask), the key tiles of every warpgroup
(``consume_split``: their parts merged through shared memory).

Shared tiles (128-byte swizzle, 64-column blocks, docs/hopper.md): Q ``[D / 64, BM, 64]``,
K and V stages ``[STAGES, D / 64, BN, 64]``. The tensor maps see Q as ``[B * H * Sq, D]`` and
K, V as ``[B * Hkv * Sk, D]``: a Q tile past the head's last row reads the next head's rows
(their outputs are not stored); keys at or past ``sk`` are masked, and when the last key
tile reaches past ``sk`` its V lands on the producer's own barrier (``turn[3]``), the
producer warp sets those V rows (another head's) to zeros in shared memory and only then
completes the stage's V barrier for the consumers (their zero probabilities would still
make NaN of a non-finite value there; ``zero_tail``).
Grouped-query attention: query head h reads K/V head h // group. Each row's natural-log
logsumexp goes to ``lse`` (-inf, and a zero output, for a row with no valid key).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import importlib

import numpy as np

import kaio
from kaio import bool_, f32, i32, u32, u64
from kaio_ops._attention_hopper_common import kv_head_and_tiles, store_pairs, thread_roles
from kaio_ops._attention_tc import (
    LN2,
    NEG_INF,
    exponentials,
    rescale,
    row_max,
    softmax_step,
    start_rows,
)
from kaio_ops._matmul_hopper import next_stage

SW = 128  # swizzle bytes: one 128-byte row per 64 elements
# LAZY 2 (``grown``): a factor under these (a row max grown past 2^15 in f16, 2^120 in bf16)
# and P, packed from probabilities taken on the kept max, may hold infinities
HARD_FACTOR_F16 = 2.0**-15
HARD_FACTOR_BF16 = 2.0**-120
SHARED_LIMIT = 227 * 1024
PRODUCER_REGS = 24  # registers a thread of the producer warpgroup keeps (setmaxnreg)


@kaio.gpu_func
def producer_start(REGS: kaio.constexpr) -> tuple[i32, i32, i32]:
    """The producer warpgroup's start: its registers handed to the consumers
    (``setmaxnreg.dec`` to PRODUCER_REGS, when ``REGS``), and its counters of key tiles,
    work tiles and partial last key tiles (``zero_tail``) loaded, all 0."""
    if REGS:
        kaio.setmaxnreg_dec(PRODUCER_REGS)
    return i32(0), i32(0), i32(0)


def consumer_registers(wg: int) -> int:
    """``REGS``: the registers a consumer thread takes (setmaxnreg) once the producer
    warpgroup has given up its own: the block's registers at launch (the launch bounds'
    share of the 64K a thread, a multiple of 8) less the producer's, over the consumers, a
    multiple of 8, at most 240 (setmaxnreg.inc waits for registers the block does not have:
    four consumer warpgroups launch with 96 a thread, 61440 in all, and can take 112, not
    the 120 of the whole 64K; an H100 hung at 120); 0 (no setmaxnreg) for one consumer
    warpgroup, which has 255 anyway."""
    if wg == 1:
        return 0
    start = 65536 // (128 * (wg + 1)) // 8 * 8
    return min(240, (start * (wg + 1) - PRODUCER_REGS) // wg // 8 * 8)


@kaio.gpu_func
def s_step(s: f32[:, :], q_s: DT[:, :, :], k_s: DT[:, :, :, :], st: i32, wg: u32, qc: i32,
           kk: kaio.constexpr, DT: kaio.constexpr):  # fmt: skip
    """s (+)= k-step kk of Q (this warpgroup's 64 rows of the Q buffer whose first 64-column
    block is ``qc``) @ K^T (stage st)."""
    dq = kaio.smem_descriptor(q_s, (qc + kk // 4, 64 * wg, kk % 4 * 16), SW, 16, 1024)
    dk = kaio.smem_descriptor(k_s, (st, kk // 4, 0, kk % 4 * 16), SW, 16, 1024)
    kaio.wgmma(DT, s, dq, dk, kk > 0)


@kaio.gpu_func
def issue_s(s: f32[:, :], q_s: DT[:, :, :], k_s: DT[:, :, :, :], st: i32, wg: u32, qc: i32,
            D: kaio.constexpr, DT: kaio.constexpr):  # fmt: skip
    """Issue S = Q K^T of the key tile in stage ``st`` (D / 16 wgmmas; Q from the buffer whose
    first 64-column block is ``qc``: 0, or D / 64 for the second of ``QB`` 2) and commit
    them."""
    for kk in kaio.static_range(D // 16):
        s_step(s, q_s, k_s, st, wg, qc, kk, DT)
    kaio.wgmma_commit()


@kaio.gpu_func
def issue_pv(o: f32[:, :], p: u32[:, :], v_s: DT[:, :, :, :], st: i32, BN: kaio.constexpr,
             DT: kaio.constexpr):  # fmt: skip
    """Issue O += P V of the key tile in stage ``st`` (BN / 16 wgmmas, P from registers) and
    commit them."""
    for kk in kaio.static_range(BN // 16):
        dv = kaio.smem_descriptor(v_s, (st, 0, kk * 16, 0), SW, BN * SW, 1024)
        kaio.wgmma(DT, o, p[kk], dv, True, False, True)
    kaio.wgmma_commit()


@kaio.gpu_func
def s_tile(s: f32[:, :], q_s: DT[:, :, :], k_s: DT[:, :, :, :], bars: u64[:, :], st: i32,
           ph: u32, wg: u32, lt: u32, D: kaio.constexpr, DT: kaio.constexpr,
           qc: i32 = 0):  # fmt: skip
    """S = Q K^T of the key tile in stage ``st`` once it has landed (phase parity ``ph``),
    waited for; then the stage's K is free (``qc``: the Q buffer's first 64-column block,
    ``issue_s``)."""
    kaio.mbarrier_wait(bars, (0, st), ph)
    kaio.wgmma_fence()
    issue_s(s, q_s, k_s, st, wg, qc, D, DT)
    kaio.wgmma_wait(0)
    if lt == 0:
        kaio.mbarrier_arrive(bars, (2, st))


@kaio.gpu_func
def pv_tile(o: f32[:, :], p: u32[:, :], v_s: DT[:, :, :, :], bars: u64[:, :], st: i32,
            ph: u32, lt: u32, BN: kaio.constexpr, DT: kaio.constexpr):  # fmt: skip
    """O += P V of the key tile in stage ``st`` once its V has landed (a partial last tile's
    with its rows past the keys zeroed, ``zero_tail``), waited for; then the stage's V is
    free."""
    kaio.mbarrier_wait(bars, (1, st), ph)
    kaio.wgmma_fence()
    issue_pv(o, p, v_s, st, BN, DT)
    kaio.wgmma_wait(0)
    if lt == 0:
        kaio.mbarrier_arrive(bars, (3, st))


@kaio.gpu_func
def skip_tile(bars: u64[:, :], st: i32, ph: u32, lt: u32):
    """A key tile (stage ``st``, parity ``ph``) that none of the warpgroup's rows sees: its K
    and V freed once landed (then the free barriers' phase is this use's: the producer saw
    the last one complete)."""
    kaio.mbarrier_wait(bars, (0, st), ph)
    if lt == 0:
        kaio.mbarrier_arrive(bars, (2, st))
    kaio.mbarrier_wait(bars, (1, st), ph)
    if lt == 0:
        kaio.mbarrier_arrive(bars, (3, st))


@kaio.gpu_func
def pack_p(p: u32[:, :], s: f32[:, :], BN: kaio.constexpr, DT: kaio.constexpr,
           HEXP: kaio.constexpr = 0):  # fmt: skip
    """P's A fragments: k-step kk is n8 tiles 2kk, 2kk + 1 of s rounded to DT pairs (``HEXP``
    1: s[n, e] already holds the pair's bits, ``softmax_tile``)."""
    for kk in kaio.static_range(BN // 16):
        for r in kaio.static_range(4):
            n = 2 * kk + r // 2
            e = 2 * (r % 2)
            if HEXP:
                p[kk, r] = kaio.bitcast(s[n, e], u32)
            elif DT == kaio.bf16:
                p[kk, r] = kaio.bitcast(kaio.bf16x2(s[n, e], s[n, e + 1]), u32)
            else:
                p[kk, r] = kaio.bitcast(kaio.f16x2(s[n, e], s[n, e + 1]), u32)


@kaio.gpu_func
def mask_tile(s: f32[:, :], j: i32, row0: i32, sk: i32, causal: i32, lane: u32,
              BN: kaio.constexpr, MASK: kaio.constexpr = 1) -> bool_:  # fmt: skip
    """Key tile j's scores s set to -inf at the keys at or past sk, and past the row when
    causal, where the tile needs it (``MASK`` 0: a tile that the caller knows none of the
    warp's rows masks); whether it did. The mask compares each score's column in the tile,
    a constant, with the row's bound (one comparison a score)."""
    k0 = j * BN
    # (the warp's first row as i32: a varlen row shifted by sk - sq may be negative)
    masked = False
    if MASK:
        masked = k0 + BN > sk or (causal != 0 and k0 + BN > row0 - i32(lane // 4) + 1)
    if masked:
        for h in kaio.static_range(2):
            bound = sk  # the keys below it are seen: below sk, and up to the row when causal
            if causal != 0:
                bound = kaio.min(sk, row0 + 8 * h + 1)
            bound -= k0 + i32(lane % 4) * 2  # as a column of this lane's first pair
            for n in kaio.static_range(BN // 8):
                for e in kaio.static_range(2):
                    s[n, 2 * h + e] = kaio.select(n * 8 + e < bound, s[n, 2 * h + e], NEG_INF)
    return masked


@kaio.gpu_func
def softmax_tile(
    s: f32[:, :], m: f32[:], l: f32[:], alpha: f32[:], j: i32, row0: i32, sk: i32,
    causal: i32, scale_log2: f32, lane: u32, BN: kaio.constexpr, SUMS: kaio.constexpr = 1,
    LSE: kaio.constexpr = 0, DT: kaio.constexpr = kaio.f16, HEXP: kaio.constexpr = 0,
    MASK: kaio.constexpr = 1, WAIT: kaio.constexpr = 0, LAZY: kaio.constexpr = 0,
):  # fmt: skip
    """Mask key tile j's scores (``mask_tile``), then one online-softmax step of both row
    halves (row0 + 8h); the factors of the earlier accumulators go to alpha (``SUMS``:
    ``_attention_tc.softmax_step``'s). ``LSE`` 1 (with ``SUMS`` 0, the sums on the tensor cores of
    the probabilities as rounded to DT): l[h] keeps what that rounding took from the sums of
    the masked tiles (``rounding``), as a multiple of 2^-l[2 + h] (the max it was last
    rescaled to: nothing to do on the other tiles), for ``ones_sums`` to add back. ``HEXP``
    1 (with ``SUMS`` 0): the probabilities as DT pairs from one ``ex2.approx`` each (half the
    MUFU.EX2s; ``softmax_step``'s ``PAIRS``), their bits in s[n, 2h] for ``pack_p``.
    ``WAIT`` 1: the pending wgmma group (P V of the key tile before) waited for between the
    row maxima and the exponentials (``overlap_step``'s ``EARLY``). ``LAZY`` 1: a row max
    kept while the scores exceed it by little (``row_max``'s); 2 (with ``WAIT``): and the
    exponentials taken on the kept max without waiting for the new one (``grown``)."""
    k0 = j * BN
    masked = mask_tile(s, j, row0, sk, causal, lane, BN, MASK)
    if WAIT and LAZY == 2:  # the exponentials on the kept max, the new one beside them
        kept = kaio.local(f32, 2)
        kaio.wgmma_wait(0)
        for h in kaio.static_range(2):
            kept[h] = kaio.select(m[h] == NEG_INF, 0.0, m[h])
            if SUMS:  # (l[2 + h]: LSE's, which the FADD sums leave free: ``grown``)
                l[2 + h] = l[h]
            base, alpha[h] = row_max(s, m, h, scale_log2, BN // 8, LAZY)
        for h in kaio.static_range(2):
            exponentials(s, l, h, kept[h], 1.0, scale_log2, BN // 8, SUMS, HEXP, DT)
    elif WAIT:
        bases = kaio.local(f32, 2)
        if k0 >= 0:  # (always: a block of its own, above which ptxas does not hoist the wait)
            for h in kaio.static_range(2):
                bases[h], alpha[h] = row_max(s, m, h, scale_log2, BN // 8, LAZY)
        kaio.wgmma_wait(0)
        for h in kaio.static_range(2):
            exponentials(s, l, h, bases[h], alpha[h], scale_log2, BN // 8, SUMS, HEXP, DT)
    else:
        for h in kaio.static_range(2):
            alpha[h] = softmax_step(s, m, l, h, scale_log2, BN // 8, SUMS, HEXP, DT, LAZY)
    if LSE == 1 and SUMS == 0:
        if masked:  # a row with few keys sees them all here: its sum to the last bit
            for h in kaio.static_range(2):
                base = kaio.select(m[h] == NEG_INF, 0.0, m[h])  # (softmax_step's)
                l[h] = l[h] * kaio.exp2(l[2 + h] - base) + rounding(s, h, BN, DT)
                l[2 + h] = base


@kaio.gpu_func
def grown(
    s: f32[:, :], p: u32[:, :], m: f32[:], l: f32[:], alpha: f32[:], qg: DT[:], kg: DT[:],
    lt: u32, j: i32, row0: i32, o_at: i32, o_stride: i32, sq: i32, kv_at: i32, sk: i32,
    causal: i32, scale_log2: f32, D: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr,
    SUMS: kaio.constexpr, MASK: kaio.constexpr,
):  # fmt: skip
    """``LAZY`` 2, after the exponentials on the kept max (``softmax_tile``) and P packed:
    where a row's max grew past the kept one by more than LAZY_GROWTH (its factor ``alpha``
    not 1, rare after the first key tiles), its probabilities in P, and with ``SUMS`` its
    sum, rescaled to the new max m; where one grew so far that P may hold infinities (past
    2^15 in f16, 2^120 in bf16: the factor under HARD_FACTOR), the warp's scores of the tile
    computed again from q and k in global memory (``scores_again``: shared memory's may be
    refilled by then) and the step taken again on the new max (the sums from before it, kept
    in l[2 + h])."""
    hard = HARD_FACTOR_F16
    if DT == kaio.bf16:
        hard = HARD_FACTOR_BF16
    if kaio.vote_any(alpha[0] < hard or alpha[1] < hard):
        scores_again(s, qg, kg, lt, j, row0, o_at, o_stride, sq, kv_at, sk, D, BN, DT)
        mask_tile(s, j, row0, sk, causal, lt % 32, BN, MASK)
        for h in kaio.static_range(2):
            if SUMS:
                l[h] = l[2 + h]
            base = kaio.select(m[h] == NEG_INF, 0.0, m[h])
            exponentials(s, l, h, base, alpha[h], scale_log2, BN // 8, SUMS, 0, DT)
        pack_p(p, s, BN, DT)
    elif kaio.vote_any(alpha[0] != 1.0 or alpha[1] != 1.0):
        for kk in kaio.static_range(BN // 16):
            for r in kaio.static_range(4):
                if DT == kaio.bf16:
                    pair = kaio.bitcast(p[kk, r], kaio.bf16x2)
                    a = f32(kaio.low(pair)) * alpha[r % 2]
                    b = f32(kaio.high(pair)) * alpha[r % 2]
                    p[kk, r] = kaio.bitcast(kaio.bf16x2(a, b), u32)
                else:
                    pair = kaio.bitcast(p[kk, r], kaio.f16x2)
                    a = f32(kaio.low(pair)) * alpha[r % 2]
                    b = f32(kaio.high(pair)) * alpha[r % 2]
                    p[kk, r] = kaio.bitcast(kaio.f16x2(a, b), u32)
        if SUMS:
            for h in kaio.static_range(2):
                l[h] = l[h] * alpha[h]


@kaio.gpu_func
def scores_again(
    s: f32[:, :], qg: DT[:], kg: DT[:], lt: u32, j: i32, row0: i32, o_at: i32, o_stride: i32,
    sq: i32, kv_at: i32, sk: i32, D: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """This lane's scores of key tile j (the S accumulators' places: rows row0 + 8h, keys
    j BN + 8n + 2 (lane % 4) + e) as dot products in f32 of q's rows (``qg``, laid out as
    the output: row r at o_at + r o_stride) and k's (``kg``: key x at (kv_at + x) D); 0 for
    a row past the head's or a key past sk (masked, or a row not stored): ``grown``'s rare
    path, slow."""
    lane = lt % 32
    for n in kaio.static_range(BN // 8):
        for e in kaio.static_range(4):
            s[n, e] = 0.0
    for d in range(D):
        for h in kaio.static_range(2):
            row = row0 + 8 * h
            q = 0.0
            if row >= 0 and row < sq:
                q = f32(qg[o_at + row * o_stride + d])
            for n in kaio.static_range(BN // 8):
                for e in kaio.static_range(2):
                    key = j * BN + i32(8 * n + 2 * (lane % 4) + e)
                    k = 0.0
                    if key < sk:
                        k = f32(kg[(kv_at + key) * D + d])
                    s[n, 2 * h + e] += q * k


@kaio.gpu_func
def start_sums(l: f32[:], LSE: kaio.constexpr):
    """``softmax_tile``'s sums at the start of a tile (with ``LSE``: none of the rounding yet,
    l[2 + h] = -inf; l[h] is ``start_rows``')."""
    if LSE:
        for h in kaio.static_range(2):
            l[2 + h] = NEG_INF


@kaio.gpu_func
def rounding(s: f32[:, :], h: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr) -> f32:
    """What rounding row half h's probabilities s to DT (P's type) takes from this lane's
    part of their sum: sum(p - DT(p))."""
    total = 0.0
    for n in kaio.static_range(BN // 8):
        for e in kaio.static_range(2):
            p = s[n, 2 * h + e]
            total += p - f32(DT(p))
    return total


@kaio.gpu_func
def rescale_rows(o: f32[:, :], alpha: f32[:], D: kaio.constexpr):
    """Both row halves of the accumulators o times their factors, skipped where no row of the
    warp needs it (every factor 1: no row's max grew, the common case after the first
    tiles): the same values, 64 multiplications a thread fewer at D = 128."""
    if kaio.vote_any(alpha[0] != 1.0 or alpha[1] != 1.0):
        for h in kaio.static_range(2):
            rescale(o, h, alpha[h], D)


@kaio.gpu_func
def store_quads(
    out: DT[:], at0: i32, acc: f32[:, :], h: kaio.constexpr, factor: f32, lane: u32,
    ok: bool_, D: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``store_pairs``' stores (accumulator row half h times ``factor``, rounded to DT, at
    out[at0 + col], where ``ok``; called by every lane of the warp) as 16-byte vectors: for
    each block of 4 n8 tiles, a 4 x 4 transpose of the lane group's pairs (two rounds of
    ``shfl_xor``) gives lane q the 8 columns of the block's tile q, one store instead of
    four (a quarter of the store instructions, each row written 64 bytes at a time)."""
    q = lane % 4
    for g in kaio.static_range(D // 32):
        x = kaio.local(u32, 4)  # lane q's pair of n8 tile 4g + i
        for i in kaio.static_range(4):
            a = acc[4 * g + i, 2 * h] * factor
            b = acc[4 * g + i, 2 * h + 1] * factor
            if DT == kaio.bf16:
                x[i] = kaio.bitcast(kaio.bf16x2(a, b), u32)
            else:
                x[i] = kaio.bitcast(kaio.f16x2(a, b), u32)
        for r in kaio.static_range(2):  # swap 2 x 2 blocks with lane q ^ 2, then pairs with q ^ 1
            bit = (q >> u32(1 - r)) & 1
            d = 2 >> r
            for i in kaio.static_range(2):
                lo = i if r == 0 else 2 * i  # x[lo] and x[lo + d] trade places across lanes
                got = kaio.shfl_xor(kaio.select(bit != 0, x[lo], x[lo + d]), d)
                x[lo] = kaio.select(bit != 0, got, x[lo])
                x[lo + d] = kaio.select(bit != 0, x[lo + d], got)
        vals = kaio.local(DT, 8)  # lane q: the 8 columns of tile 4g + q, x[j] from lane j
        for j in kaio.static_range(4):
            if DT == kaio.bf16:
                pair = kaio.bitcast(x[j], kaio.bf16x2)
            else:
                pair = kaio.bitcast(x[j], kaio.f16x2)
            vals[2 * j] = kaio.low(pair)
            vals[2 * j + 1] = kaio.high(pair)
        if ok:
            kaio.store_vector(out, at0 + i32(8 * 4 * g) + i32(q) * 8, vals)


@kaio.gpu_func
def store_rows(
    out: DT[:], lse: f32[:], o: f32[:, :], m: f32[:], l: f32[:], o_at: i32, o_stride: i32,
    l_at: i32, row0: i32, lo: i32, sq: i32, lane: u32, D: kaio.constexpr, DT: kaio.constexpr,
    OV: kaio.constexpr = 0,
):  # fmt: skip
    """out[o_at + row * o_stride:][:D] = o / the row's sum and lse[l_at + row] for this lane's
    rows row = row0 + 8h from lo and below sq (the dense layout: o_at = bh * sq * D,
    o_stride = D, l_at = bh * sq, lo = 0, ``tile_of``'s causal tiles starting before the
    head's first row; the packed varlen one: ``_attention_hopper_varlen``)."""
    for h in kaio.static_range(2):
        total = l[h] + kaio.shfl_xor(l[h], 1)
        total += kaio.shfl_xor(total, 2)
        row = row0 + 8 * h
        mine = row >= lo and row < sq
        if OV and D % 32 == 0:  # (the shuffles in every lane; the stores of its rows)
            inv = kaio.select(total > 0.0, 1.0 / total, 0.0)
            store_quads(out, o_at + row * o_stride, o, h, inv, lane, mine, D, DT)
        if mine:
            inv = kaio.select(total > 0.0, 1.0 / total, 0.0)
            if not OV or D % 32 != 0:
                store_pairs(out, o_at + row * o_stride, o, h, inv, lane, D, DT)
            if lane % 4 == 0:
                lse[l_at + row] = kaio.select(total > 0.0, (m[h] + kaio.log2(total)) * LN2, NEG_INF)


@kaio.gpu_func
def q_buffer(it: i32, QB: kaio.constexpr) -> tuple[i32, i32, i32]:
    """``(b, landed, read)`` of the block's tile ``it``: its Q buffer ``it % QB`` and that
    buffer's ``turn`` barriers, the Q tile landed (2, or 5 for the second) and read by every
    consumer warpgroup (4, or 6)."""
    b = it % QB
    return b, 2 + 3 * b, 4 + 2 * b


@kaio.gpu_func
def produce(
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    tq: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap, q_row: i32, kv_row: i32,
    q_col: i32, kv_col: i32, n_tiles: i32, it: i32, cnt: i32, tail: bool_, D: kaio.constexpr,
    BN: kaio.constexpr, WG: kaio.constexpr, STAGES: kaio.constexpr, DT: kaio.constexpr,
    QB: kaio.constexpr = 1,
):  # fmt: skip
    """The producer's copies for the block's tile ``it`` (0 for the first): the Q tile
    (``64 * WG`` rows from ``q_row``, D columns from ``q_col``) into Q buffer ``it % QB``
    (``q_buffer``) once the consumers are done with that buffer's previous tile, then K and
    V of each key tile (from ``kv_row``, ``kv_col``), each on its own "full" barrier, STAGES
    tiles ahead: a stage is refilled once the consumers have freed it (K and V apart).
    ``cnt``: the key tiles the ring has taken so far (for their stage and parity). ``tail``:
    the last key tile is partial: its V lands on ``turn[3]``, for ``zero_tail``, which then
    completes the stage's V barrier."""
    C = D // 64
    KV_BYTES = BN * D * 2
    b, landed, read = q_buffer(it, QB)
    if it >= QB:
        kaio.mbarrier_wait(turn, read, u32(it // QB - 1) & 1)
    kaio.mbarrier_arrive_expect_tx(turn, landed, u32(64 * WG * D * 2))
    for c in kaio.static_range(C):
        kaio.tma_load_2d(q_s, (b * C + c, 0, 0), tq, q_row, q_col + c * 64, turn, landed)
    for j in range(n_tiles):
        n = cnt + j
        st = n % STAGES
        ph = u32(n // STAGES) & 1
        if n >= STAGES:  # stage st held key tile n - STAGES: wait until its K is free
            kaio.mbarrier_wait(bars, (2, st), ph ^ 1)
        kaio.mbarrier_arrive_expect_tx(bars, (0, st), u32(KV_BYTES))
        for c in kaio.static_range(C):
            kaio.tma_load_2d(k_s, (st, c, 0, 0), tk, kv_row + j * BN, kv_col + c * 64, bars,
                             (0, st))  # fmt: skip
        if n >= STAGES:
            kaio.mbarrier_wait(bars, (3, st), ph ^ 1)
        if tail and j == n_tiles - 1:  # (the producer's own barrier: ``zero_tail``)
            kaio.mbarrier_arrive_expect_tx(turn, 3, u32(KV_BYTES))
            for c in kaio.static_range(C):
                kaio.tma_load_2d(v_s, (st, c, 0, 0), tv, kv_row + j * BN, kv_col + c * 64, turn,
                                 3)  # fmt: skip
        else:
            kaio.mbarrier_arrive_expect_tx(bars, (1, st), u32(KV_BYTES))
            for c in kaio.static_range(C):
                kaio.tma_load_2d(v_s, (st, c, 0, 0), tv, kv_row + j * BN, kv_col + c * 64, bars,
                                 (1, st))  # fmt: skip


@kaio.gpu_func
def produce_dynamic(
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    tile_s: i32[:], sched: i32[:], tq: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap,
    lane: u32, end: i32, n_qt: i32, bhs: i32, hs: i32, heads: i32, group: i32, sq: i32, sk: i32,
    causal: i32, D: kaio.constexpr, BN: kaio.constexpr, WG: kaio.constexpr,
    STAGES: kaio.constexpr, DT: kaio.constexpr, QB: kaio.constexpr,
):  # fmt: skip
    """``PERSIST`` 4, the producer warp: work tiles taken one at a time from the counter
    ``sched[0]`` (``tile_of``'s order, heaviest first in each section of heads: the blocks
    that finish first take the next, so that the last to start are the lightest), each
    tile's index written to ``tile_s`` (its Q buffer's slot) for the consumers before its Q
    copy, then its loads (``produce``) and, for a partial last key tile, ``zero_tail``; a
    slot is written once every consumer thread has read the previous tile's (``turn[7]``).
    Past the last tile: -1 in the slot and an arrival on the Q buffer's "landed" barrier
    (the consumers stop), then the block counts itself done on ``sched[1]``, and the last block
    done sets both counters back to 0 for the next launch."""
    it = i32(0)  # the work tiles taken, the key tiles loaded, the partial last ones
    cnt = i32(0)
    tails = i32(0)
    w = i32(0)
    while w >= 0:
        got = i32(0)
        if lane == 0:
            got = kaio.atomic_add(sched, 0, 1)
        w = kaio.shfl_idx(got, 0)
        if w >= end:
            w = -1
        b, landed, read = q_buffer(it, QB)
        if lane == 0 and it >= QB:  # the consumers are done with the buffer
            kaio.mbarrier_wait(turn, read, u32(it // QB - 1) & 1)
        if lane == 0 and it >= 1:  # every consumer thread has read the previous tile's slot
            kaio.mbarrier_wait(turn, 7, u32(it - 1) & 1)
        if w < 0:
            if lane == 0:
                tile_s[b] = -1
                kaio.mbarrier_arrive(turn, landed)  # (release: the consumers see the -1)
        else:
            bh, q0, kvh, n_tiles = tile_of(w, n_qt, bhs, hs, heads, group, sq, sk, causal, 64 * WG,
                                           BN)  # fmt: skip
            tail = n_tiles * BN > sk
            if lane == 0:
                tile_s[b] = w  # seen by the consumers once the Q copy's barrier completes
                produce(q_s, k_s, v_s, bars, turn, tq, tk, tv, bh * sq + q0, kvh * sk, 0, 0,
                        n_tiles, it, cnt, tail, D, BN, WG, STAGES, DT, QB)  # fmt: skip
            cnt += n_tiles
            it += 1
            if tail:  # (as in the kernel's static loop)
                kaio.sync_warp()
                zero_tail(v_s, bars, turn, n_tiles - 1, cnt - 1, tails, sk, lane, D, BN, STAGES,
                          DT)  # fmt: skip
                tails += 1
    if lane == 0:
        kaio.threadfence()  # this block's takes before its count
        if kaio.atomic_add(sched, 1, 1) == i32(kaio.grid_dim_x()) - 1:
            sched[0] = 0
            sched[1] = 0


@kaio.gpu_func
def zero_tail(
    v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:], j: i32, n: i32, tails: i32, sk: i32,
    lane: u32, D: kaio.constexpr, BN: kaio.constexpr, STAGES: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """The producer warp, once V of key tile j (the last, partial; the ring's n-th) has
    landed on ``turn[3]`` (``produce``; ``tails``: the block's partial tiles before it, which
    give the phase; called after the copy was issued, so that the wait sees its phase, not an
    earlier one): its rows past the keys (the next head's, or TMA's zeros past the array)
    set to zeros, so that their zero probabilities never meet a non-finite value there;
    fenced for the tensor cores, then the stage's V barrier completed for the consumers. Only
    this warp waits on ``turn[3]``, each of its phases in turn: the consumers, whose
    warpgroups may all skip the tile (``skip_tile``), wait on the V barrier as for any
    tile."""
    st = n % STAGES
    kaio.mbarrier_wait(turn, 3, u32(tails) & 1)
    r0 = sk - j * BN
    zero = kaio.local(DT, 8)
    for e in kaio.static_range(8):
        zero[e] = DT(0.0)
    for c in kaio.static_range(D // 64):  # a row's 8 16-byte chunks, 4 rows a step
        for r in range(r0 + i32(lane // 8), BN, 4):
            kaio.store_vector(v_s, (st, c, r, i32(lane % 8) * 8), zero)
    kaio.fence_proxy_async()
    kaio.sync_warp()  # every lane's zeros before the arrival
    if lane == 0:
        kaio.mbarrier_arrive(bars, (1, st))


@kaio.gpu_func
def advance(pos: i32[:], STAGES: kaio.constexpr):
    """The ring's next stage ``pos[0]`` and its phase parity ``pos[1]``."""
    pos[0] += 1
    if pos[0] == STAGES:
        pos[0] = 0
        pos[1] ^= 1


@kaio.gpu_func
def overlap_step(
    s: f32[:, :], o: f32[:, :], p: u32[:, :], m: f32[:], l: f32[:], alpha: f32[:],
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    wg: u32, lt: u32, qc: i32, gj: i32, row0: i32, sk: i32, causal: i32, scale_log2: f32,
    st: i32, ph: u32, ps: i32, pph: u32, j: i32, qg: DT[:], kg: DT[:], o_at: i32,
    o_stride: i32, sq: i32, kv_at: i32, D: kaio.constexpr, BN: kaio.constexpr,
    PIPE: kaio.constexpr, DT: kaio.constexpr, ONES: kaio.constexpr, LSE: kaio.constexpr,
    HEXP: kaio.constexpr, MASK: kaio.constexpr = 1, EARLY: kaio.constexpr = 0,
    LAZY: kaio.constexpr = 0,
):  # fmt: skip
    """One overlapped step of ``consume_tile`` (PIPE 1 to 4): S = Q K_j^T (stage ``st``,
    parity ``ph``) issued with the pending P_{j-1} V_{j-1} (stage ``ps``, parity ``pph``),
    the softmax of tile j while P V runs, then P of tile j packed (``gj``: the block's
    overlapped steps so far, for the ping-pong turns of PIPE 2 and 4; ``MASK`` 0: a tile
    that no row of the warpgroup masks, ``softmax_tile``'s). ``EARLY`` 1: P V waited for
    after the row maxima (under it), before the exponentials, so that P's registers are
    free and each pair is packed as its exponentials come (the F2FPs among the MUFU.EX2s,
    not after them). ``LAZY``: ``softmax_tile``'s."""
    lane = lt % 32
    DO = D + 8 * ONES
    kaio.mbarrier_wait(bars, (0, st), ph)
    if PIPE == 2 or PIPE == 4:  # wait for this warpgroup's turn on the tensor cores
        if wg == 0:
            if gj > 1:
                kaio.mbarrier_wait(turn, 0, u32(gj - 2) & 1)
        else:
            kaio.mbarrier_wait(turn, 1, u32(gj - 1) & 1)
    kaio.wgmma_fence()
    issue_s(s, q_s, k_s, st, wg, qc, D, DT)
    if PIPE >= 3:
        rescale_rows(o, alpha, DO)
    kaio.mbarrier_wait(bars, (1, ps), pph)
    kaio.wgmma_fence()
    issue_pv(o, p, v_s, ps, BN, DT)
    if (PIPE == 2 or PIPE == 4) and lt % 32 == 0:  # the other warpgroup's turn
        kaio.mbarrier_arrive(turn, 1 - wg)
    kaio.wgmma_wait(1)  # S_j done
    if lt == 0:
        kaio.mbarrier_arrive(bars, (2, st))
    if sk > 0:  # always: a block of its own, which ptxas does not hoist the wait into
        softmax_tile(s, m, l, alpha, j, row0, sk, causal, scale_log2, lane, BN, 1 - ONES, LSE,
                     DT, HEXP, MASK, EARLY, LAZY)  # fmt: skip
        if EARLY:  # (P V waited for: no wait between the exponentials and their packing)
            pack_p(p, s, BN, DT, HEXP)
            if LAZY == 2:
                grown(s, p, m, l, alpha, qg, kg, lt, j, row0, o_at, o_stride, sq, kv_at, sk,
                      causal, scale_log2, D, BN, DT, 1 - ONES, MASK)  # fmt: skip
    kaio.wgmma_wait(0)  # P_{j-1} V_{j-1} done (EARLY: already, but ptxas must see it on every path)
    if lt == 0:
        kaio.mbarrier_arrive(bars, (3, ps))
    if PIPE < 3:
        rescale_rows(o, alpha, DO)
    if EARLY == 0:
        pack_p(p, s, BN, DT, HEXP)


@kaio.gpu_func
def plain_step(
    s: f32[:, :], o: f32[:, :], p: u32[:, :], m: f32[:], l: f32[:], alpha: f32[:],
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], st: i32,
    ph: u32, wg: u32, lt: u32, lane: u32, qc: i32, j: i32, row0: i32, sk: i32, causal: i32,
    scale_log2: f32, D: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr,
    ONES: kaio.constexpr, LSE: kaio.constexpr, HEXP: kaio.constexpr,
):  # fmt: skip
    """One step over key tile j with nothing overlapped (PIPE 0's, ``consume_split``'s):
    S = Q K_j^T from the stage ``st`` (parity ``ph``) on warpgroup ``wg``'s rows of the Q
    buffer, the softmax, O rescaled, P packed and O += P V_j, each waited for."""
    s_tile(s, q_s, k_s, bars, st, ph, wg, lt, D, DT, qc)
    softmax_tile(s, m, l, alpha, j, row0, sk, causal, scale_log2, lane, BN, 1 - ONES, LSE, DT,
                 HEXP)  # fmt: skip
    rescale_rows(o, alpha, D + 8 * ONES)
    pack_p(p, s, BN, DT, HEXP)
    pv_tile(o, p, v_s, bars, st, ph, lt, BN, DT)


@kaio.gpu_func
def consume_split(
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    o: f32[:, :], s: f32[:, :], p: u32[:, :], m: f32[:], l: f32[:], alpha: f32[:], wg: u32,
    lt: u32, qc: i32, row0: i32, n_tiles: i32, sk: i32, scale_log2: f32, st: i32, ph: u32,
    k: i32, D: kaio.constexpr, BN: kaio.constexpr, WG: kaio.constexpr, STAGES: kaio.constexpr,
    DT: kaio.constexpr, ONES: kaio.constexpr, HEXP: kaio.constexpr, QB: kaio.constexpr,
) -> tuple[i32, u32]:  # fmt: skip
    """``SPLIT`` 1: a tile whose rows are all warpgroup 0's (a head's last query tile, no
    mask) with its key tiles split among the warpgroups, key tile j to warpgroup j % WG (the
    others free it as it lands, ``skip_tile``), each on the Q buffer's first 64 rows (``row0``
    warpgroup 0's), each step waited for (PIPE 0's: no stage held across steps, so that
    the warpgroups take the ring's stages side by side); then warpgroups 1 to WG - 1 in
    turn leave their row maxima, sums and accumulators in one part of shared memory
    (``turn[0]``: written) and warpgroup 0 adds them to its own (``merge_part``; ``turn[1]``:
    read, and ``turn[8]`` for warpgroup 2's: so that the next may be written).
    ``k``: the block's split tiles before this one (the barriers' phases). Returns the ring's
    next stage and parity."""
    lane = lt % 32
    DO = D + 8 * ONES
    for j in range(n_tiles):
        if j % WG == i32(wg):
            plain_step(s, o, p, m, l, alpha, q_s, k_s, v_s, bars, st, ph, u32(0), lt, lane, qc,
                       j, row0, sk, 0, scale_log2, D, BN, DT, ONES, 0, HEXP)  # fmt: skip
        else:
            skip_tile(bars, st, ph, lt)
        st, ph = next_stage(st, ph, STAGES)
    # (the parts after the ring, the barriers and the tile slots: ``shared_bytes``)
    at = QB * 64 * WG * D * 2 + STAGES * BN * (2 * D + 64 * ONES) * 2 + 32 * STAGES + 96
    part = kaio.shared_dynamic(f32, (4 + DO // 2, 128), at)
    for w in kaio.static_range(WG - 1):  # warpgroup w + 1's part
        if wg == 0:
            kaio.mbarrier_wait(turn, 0, u32(k * (WG - 1) + w) & 1)  # written
            merge_part(part, o, m, l, lt, DO)
            kaio.mbarrier_arrive(turn, 1 + 7 * ((w + 1) // 2))  # (1, 8: warpgroup 1's, 2's)
        elif wg == w + 1:  # once warpgroup 0 has read the part before (warpgroup w's of this
            # tile, or the last one's of the block's split tile before): each writer's reads
            # on a barrier of its own, at most one phase from the one waited for
            if w > 0:
                kaio.mbarrier_wait(turn, 1 + 7 * (w // 2), u32(k) & 1)
            elif k > 0:
                kaio.mbarrier_wait(turn, 1 + 7 * ((WG - 1) // 2), u32(k - 1) & 1)
            for h in kaio.static_range(2):
                part[h, lt] = m[h]
                part[2 + h, lt] = l[h]
            for n in kaio.static_range(DO // 8):
                for e in kaio.static_range(4):
                    part[4 + 4 * n + e, lt] = o[n, e]
            kaio.mbarrier_arrive(turn, 0)
    return st, ph


@kaio.gpu_func
def merge_part(part: f32[:, :], o: f32[:, :], m: f32[:], l: f32[:], lt: u32,
               DO: kaio.constexpr):  # fmt: skip
    """Warpgroup 0's rows (thread ``lt``) joined with the part of the same rows that another
    warpgroup left in ``part`` (``consume_split``): each row's max the larger, its sums and
    accumulators rescaled to it and added."""
    for h in kaio.static_range(2):
        mw = part[h, lt]
        top = kaio.max(m[h], mw)
        base = kaio.select(top == NEG_INF, 0.0, top)
        a = kaio.exp2(m[h] - base)
        b = kaio.exp2(mw - base)
        m[h] = top
        l[h] = l[h] * a + part[2 + h, lt] * b
        for n in kaio.static_range(DO // 8):
            for e in kaio.static_range(2):
                i = 4 * n + 2 * h + e
                o[n, 2 * h + e] = o[n, 2 * h + e] * a + part[4 + i, lt] * b


@kaio.gpu_func
def consume(
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    out: DT[:], lse: f32[:], wg: u32, lt: u32, o_at: i32, o_stride: i32, l_at: i32, q0: i32,
    n_tiles: i32, sq: i32, sk: i32, causal: i32, scale_log2: f32, pos: i32[:], D: kaio.constexpr,
    BN: kaio.constexpr, STAGES: kaio.constexpr, PIPE: kaio.constexpr, DT: kaio.constexpr,
    ONES: kaio.constexpr = 0, LSE: kaio.constexpr = 0,
):  # fmt: skip
    """``consume_tile`` with its carried state in ``pos`` (the ring's stage and parity, the
    ping-pong steps, the tiles done), for callers that keep it in an array (the varlen
    forward, ``_attention_hopper_varlen``; without the skips, ``SKIP`` 0, as measured
    there; no LAZY 2, whose rare path reads q and k in global memory: ``out`` in their
    place)."""
    st, ph, g, done = consume_tile(
        q_s, k_s, v_s, bars, turn, out, lse, wg, lt, o_at, o_stride, l_at, q0, n_tiles, q0, sq,
        sk, causal, scale_log2, pos[0], u32(pos[1]), pos[2], pos[3], out, out, 0, D, BN, STAGES,
        PIPE, DT, ONES, LSE,
    )  # fmt: skip
    pos[0] = st
    pos[1] = i32(ph)
    pos[2] = g
    pos[3] = done


@kaio.gpu_func
def consume_tile(
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    out: DT[:], lse: f32[:], wg: u32, lt: u32, o_at: i32, o_stride: i32, l_at: i32, q0: i32,
    n_tiles: i32, lo: i32, sq: i32, sk: i32, causal: i32, scale_log2: f32, st: i32, ph: u32,
    g: i32, done: i32, qg: DT[:], kg: DT[:], kv_at: i32, D: kaio.constexpr,
    BN: kaio.constexpr, STAGES: kaio.constexpr, PIPE: kaio.constexpr, DT: kaio.constexpr,
    ONES: kaio.constexpr = 0, LSE: kaio.constexpr = 0, QB: kaio.constexpr = 1,
    SKIP: kaio.constexpr = 0, HEXP: kaio.constexpr = 0, DIAG: kaio.constexpr = 0,
    OV: kaio.constexpr = 0, EARLY: kaio.constexpr = 0, LAZY: kaio.constexpr = 0,
    SPLIT: kaio.constexpr = 0,
) -> tuple[i32, u32, i32, i32]:  # fmt: skip
    """Consumer warpgroup ``wg``'s 64 query rows of one tile (thread ``lt`` of it) over the
    key tiles (module docstring), then its rows of ``out`` and ``lse`` from ``lo`` and below
    ``sq`` (``store_rows``: ``o_at``, ``o_stride``, ``l_at`` place them; ``q0``, ``lo`` and
    ``sq`` may be shifted alike, as the varlen kernel's bottom-right causal mask shifts
    them). The state carried from the
    block's earlier tiles, returned as it stands after this one: ``(st, ph)`` the ring's
    stage and phase parity, ``g`` the ping-pong steps taken, ``done`` the tiles done (whose
    count picks the Q buffer, ``q_buffer``, of ``QB``). ``turn[0]``, ``turn[1]``: the
    ping-pong barriers of warpgroups 0 and 1 (PIPE 2, 4), ``turn[2]`` (``turn[5]``): the Q
    tile landed, ``turn[4]`` (``turn[6]``): the Q tile read (by every consumer warpgroup).
    ``ONES`` 1: the row sums come from O's 8 more columns (``ones_sums``), the V stages
    having a column block of ones; ``LSE`` 1 with it: the masked tiles' rounding of the
    probabilities added back to the sums (``softmax_tile``).
    ``SKIP`` 1: the key tiles past the warpgroup's rows are only freed (``skip_tile``; for
    tiles of more rows than keys: the branch cost up to 4% at D 128, where it never skips).
    ``DIAG`` 1 (PIPE 1 to 4): the steps over the key tiles that no row of the block masks
    run in a loop of their own, without the mask's test (``overlap_step``). ``OV`` 1: the
    rows of O stored as 16-byte vectors (``store_quads``). ``EARLY`` 1: ``overlap_step``'s,
    ``LAZY`` 1: ``softmax_tile``'s. ``SPLIT``: the block's consumer warpgroups (0: off),
    which share the key tiles of a tile whose rows are all warpgroup 0's, no mask
    (``consume_split``; ``g`` then counts the block's split tiles, not ping-pong steps)."""
    lane = lt % 32
    row0 = q0 + 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)
    m = kaio.local(f32, 2)
    l = kaio.local(f32, 4)  # (2, 3: LSE's, ``softmax_tile``)
    alpha = kaio.local(f32, 2)
    DO = D + 8 * ONES  # O's columns (ONES: and 8 of the row sums, ``ones_sums``)
    o = kaio.local(f32, (DO // 8, 4))
    start_rows(m, l, o, DO)
    start_sums(l, LSE)
    s = kaio.local(f32, (BN // 8, 4))
    p = kaio.local(u32, (BN // 16, 4))
    b, landed, read = q_buffer(done, QB)
    qc = b * (D // 64)  # the Q buffer's first 64-column block
    kaio.mbarrier_wait(turn, landed, u32(done // QB) & 1)  # this tile's Q landed
    split = False
    if SPLIT:
        split = causal == 0 and q0 + 64 >= sq
    n_mine = n_tiles  # the key tiles this warpgroup's rows see; with SKIP those past them
    # (causal: past the diagonal; rows all past sq: all but one) are freed as they land
    # (``skip_tile``); ping-pong takes turns at every step
    if SKIP == 1 and PIPE != 2 and PIPE != 4:
        if causal != 0:
            n_mine = kaio.max(1, kaio.min(n_tiles, (q0 + 64 * i32(wg) + 64 + BN - 1) // BN))
        if q0 + 64 * i32(wg) >= sq:
            n_mine = 1
    if SPLIT and split:  # (SPLIT 0: no shared part declared, ``consume_split``)
        row0 = q0 + 16 * i32(lt // 32) + i32(lane // 4)  # warpgroup 0's, in every warpgroup
        st, ph = consume_split(q_s, k_s, v_s, bars, turn, o, s, p, m, l, alpha, wg, lt, qc, row0,
                               n_tiles, sk, scale_log2, st, ph, g, D, BN, SPLIT, STAGES, DT,
                               ONES, HEXP, QB)  # fmt: skip
        g += 1
        if lt == 0:
            kaio.mbarrier_arrive(turn, read)
        if wg > 0:  # (warpgroup 0 stores the rows)
            lo = sq
    elif PIPE == 0:
        for j in range(n_tiles):
            if SKIP == 0 or j < n_mine:
                plain_step(s, o, p, m, l, alpha, q_s, k_s, v_s, bars, st, ph, wg, lt, lane, qc,
                           j, row0, sk, causal, scale_log2, D, BN, DT, ONES, LSE,
                           HEXP)  # fmt: skip
            else:
                skip_tile(bars, st, ph, lt)
            st, ph = next_stage(st, ph, STAGES)
        if lt == 0:
            kaio.mbarrier_arrive(turn, read)
    else:
        # tile 0: S, softmax, P; then each tile j issues S_j with P_{j-1} V_{j-1}, and the
        # softmax of tile j runs while P V is on the tensor cores. PIPE 3, 4 (FlashAttention-3's
        # order) rescale O by tile j - 1's factors while S_j runs, PIPE 1, 2 once P V is done;
        # PIPE 2, 4: the warpgroups take turns to issue their products (ping-pong)
        s_tile(s, q_s, k_s, bars, st, ph, wg, lt, D, DT, qc)
        softmax_tile(s, m, l, alpha, 0, row0, sk, causal, scale_log2, lane, BN, 1 - ONES, LSE, DT,
                     HEXP)  # fmt: skip
        pack_p(p, s, BN, DT, HEXP)
        ps = st  # the stage and parity of tile j - 1
        pph = ph
        st, ph = next_stage(st, ph, STAGES)
        j0 = i32(1)  # the first masked key tile (DIAG: the earlier ones are not)
        if DIAG != 0:  # the key tiles that no row of the block masks run without the mask's
            # test: in a loop of their own (1), or a branch of the loop (2: one loop, whose
            # steps the simulator runs in lockstep over the blocks simulated together); the
            # same in every warpgroup, so that one whose rows lie past sq runs those steps too
            j0 = kaio.max(1, sk // BN)
            if causal != 0:
                j0 = kaio.max(1, kaio.min(j0, (q0 + 1) // BN))
            n_mine = kaio.max(n_mine, j0)
        jstart = i32(1)
        if DIAG == 1:
            jstart = j0
            for j in range(1, j0):
                overlap_step(s, o, p, m, l, alpha, q_s, k_s, v_s, bars, turn, wg, lt, qc,
                             g + j, row0, sk, causal, scale_log2, st, ph, ps, pph, j, qg, kg, o_at,
                             o_stride, sq, kv_at, D,
                             BN, PIPE, DT, ONES, LSE, HEXP, 0, EARLY, LAZY)  # fmt: skip
                ps = st
                pph = ph
                st, ph = next_stage(st, ph, STAGES)
        for j in range(jstart, n_tiles):
            plain = False  # (DIAG 2: a key tile that no row of the block masks)
            if DIAG == 2:
                plain = j < j0
            if plain:
                overlap_step(s, o, p, m, l, alpha, q_s, k_s, v_s, bars, turn, wg, lt, qc,
                             g + j, row0, sk, causal, scale_log2, st, ph, ps, pph, j, qg, kg, o_at,
                             o_stride, sq, kv_at, D,
                             BN, PIPE, DT, ONES, LSE, HEXP, 0, EARLY, LAZY)  # fmt: skip
                ps = st
                pph = ph
            elif SKIP == 0 or j < n_mine:
                overlap_step(s, o, p, m, l, alpha, q_s, k_s, v_s, bars, turn, wg, lt, qc,
                             g + j, row0, sk, causal, scale_log2, st, ph, ps, pph, j, qg, kg, o_at,
                             o_stride, sq, kv_at, D,
                             BN, PIPE, DT, ONES, LSE, HEXP, 1, EARLY, LAZY)  # fmt: skip
                ps = st
                pph = ph
            else:  # a key tile past this warpgroup's rows
                if j == n_mine:  # the pending P V first: its stage may be the next refilled
                    if PIPE >= 3:
                        rescale_rows(o, alpha, DO)
                    pv_tile(o, p, v_s, bars, ps, pph, lt, BN, DT)
                skip_tile(bars, st, ph, lt)
            st, ph = next_stage(st, ph, STAGES)
        if PIPE == 2 or PIPE == 4:
            g += n_tiles - 1
        if lt == 0:  # every S = Q K^T of the tile is done: Q's buffer is free
            kaio.mbarrier_arrive(turn, read)
        if SKIP == 0 or n_mine == n_tiles:  # the last P V
            if PIPE >= 3:
                rescale_rows(o, alpha, DO)
            pv_tile(o, p, v_s, bars, ps, pph, lt, BN, DT)
    if ONES:
        ones_sums(l, o, D, m, LSE)
    store_rows(out, lse, o, m, l, o_at, o_stride, l_at, row0, lo, sq, lane, D, DT, OV)
    return st, ph, g, done + 1


@kaio.gpu_func
def consume_stream(
    q_s: DT[:, :, :], k_s: DT[:, :, :, :], v_s: DT[:, :, :, :], bars: u64[:, :], turn: u64[:],
    out: DT[:], lse: f32[:], wg: u32, lt: u32, first: i32, step: i32, end: i32, rounds: i32,
    n_qt: i32, bhs: i32, hs: i32, heads: i32, group: i32, sq: i32, sk: i32, causal: i32,
    scale_log2: f32, D: kaio.constexpr, BN: kaio.constexpr, WG: kaio.constexpr,
    STAGES: kaio.constexpr, PIPE: kaio.constexpr, PERSIST: kaio.constexpr,
    QB: kaio.constexpr, ONES: kaio.constexpr, DT: kaio.constexpr, LSE: kaio.constexpr = 0,
    HEXP: kaio.constexpr = 0,
):  # fmt: skip
    """``XT`` 1: consumer warpgroup ``wg``'s rows of every work tile of the block (thread
    ``lt`` of it) as one stream of key-tile steps in PIPE 1's or 3's order, the last
    O += P V of a tile issued with the first S = Q K^T of the next: that step's softmax (on
    fresh row maxima and sums) runs while the P V does, then the finished tile's rows are
    stored and O is zeroed. Only the block's first step (S, softmax, P) and its last P V
    stand alone. The Q tiles come from ``QB`` buffers (``q_buffer``: with two, the producer
    loads the next tile's Q while this one's is read; ``HEXP``: ``consume_tile``'s)."""
    BM = 64 * WG
    C = D // 64
    lane = lt % 32
    m = kaio.local(f32, 2)
    l = kaio.local(f32, 4)  # (2, 3: LSE's, ``softmax_tile``)
    mo = kaio.local(f32, 2)  # the finished tile's row maxima and sums, for its store
    lo = kaio.local(f32, 4)
    alpha = kaio.local(f32, 2)
    DO = D + 8 * ONES  # O's columns (ONES: and 8 of the row sums)
    o = kaio.local(f32, (DO // 8, 4))
    start_rows(m, l, o, DO)
    start_sums(l, LSE)
    s = kaio.local(f32, (BN // 8, 4))
    p = kaio.local(u32, (BN // 16, 4))
    st = i32(0)  # the ring's stage of the next key tile and its phase parity
    ph = u32(0)
    ps = i32(0)  # the stage and parity of the step whose P V is pending
    pph = u32(0)
    it = i32(0)  # the work tiles started
    pending = i32(0)  # whether a P V is pending (the stream's first step, and one after a
    # flush, stand alone)
    prev_bh = i32(0)  # the finished tile's (batch, head) and this thread's first row of it
    prev_row0 = i32(0)
    for k in range(rounds):
        w = work_tile(k, first, step, end, n_qt, PERSIST)
        if w >= 0:
            bh, q0, kvh, n_tiles = tile_of(w, n_qt, bhs, hs, heads, group, sq, sk, causal, BM, BN)
            row0 = q0 + 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)
            n_mine = n_tiles  # the key tiles this warpgroup's rows see (causal: fewer, at
            if causal != 0:  # least one; one where the rows are all past sq: none of them
                # is stored)
                n_mine = kaio.max(1, kaio.min(n_tiles, (q0 + 64 * i32(wg) + 64 + BN - 1) // BN))
            if q0 + 64 * i32(wg) >= sq:
                n_mine = 1
            b, landed, read = q_buffer(it, QB)
            kaio.mbarrier_wait(turn, landed, u32(it // QB) & 1)  # this tile's Q landed
            # one loop for every kind of step, j the same in every warpgroup: the simulator
            # runs the warps in lockstep, and one warpgroup's step waits for another's earlier
            for j in range(n_tiles):
                if j == 0 and pending == 0:  # the block's first step, or the first after a
                    # flush: nothing pending (S, softmax, P)
                    kaio.mbarrier_wait(bars, (0, st), ph)
                    kaio.wgmma_fence()
                    issue_s(s, q_s, k_s, st, wg, b * C, D, DT)
                    kaio.wgmma_wait(0)
                    if lt == 0:
                        kaio.mbarrier_arrive(bars, (2, st))
                        if n_mine == 1:
                            kaio.mbarrier_arrive(turn, read)
                    softmax_tile(s, m, l, alpha, 0, row0, sk, causal, scale_log2, lane, BN,
                                 1 - ONES, LSE, DT, HEXP)  # fmt: skip
                    pack_p(p, s, BN, DT, HEXP)
                    ps = st
                    pph = ph
                    pending = 1
                elif j < n_mine:
                    kaio.mbarrier_wait(bars, (0, st), ph)
                    kaio.wgmma_fence()
                    issue_s(s, q_s, k_s, st, wg, b * C, D, DT)
                    if PIPE >= 3:
                        rescale_rows(o, alpha, DO)
                    kaio.mbarrier_wait(bars, (1, ps), pph)
                    kaio.wgmma_fence()
                    issue_pv(o, p, v_s, ps, BN, DT)
                    kaio.wgmma_wait(1)  # S done
                    if lt == 0:
                        kaio.mbarrier_arrive(bars, (2, st))
                        if j == n_mine - 1:  # this tile's last S: its Q buffer is free
                            kaio.mbarrier_arrive(turn, read)
                    if j == 0:  # a new tile: its own row maxima and sums
                        for h in kaio.static_range(2):
                            mo[h] = m[h]
                            lo[h] = l[h]
                            m[h] = NEG_INF
                            l[h] = 0.0
                            if LSE:
                                lo[2 + h] = l[2 + h]
                                l[2 + h] = NEG_INF
                    # always true: a block of its own, which ptxas does not hoist the wait into
                    if sk > 0:
                        softmax_tile(s, m, l, alpha, j, row0, sk, causal, scale_log2, lane, BN,
                                     1 - ONES, LSE, DT, HEXP)  # fmt: skip
                    kaio.wgmma_wait(0)  # the pending P V done
                    if lt == 0:
                        kaio.mbarrier_arrive(bars, (3, ps))
                    if j == 0:  # the finished tile's rows, then O from zero
                        if ONES:
                            ones_sums(lo, o, D, mo, LSE)
                        store_rows(out, lse, o, mo, lo, prev_bh * sq * D, D, prev_bh * sq,
                                   prev_row0, 0, sq, lane, D, DT)  # fmt: skip
                        start_rows(mo, lo, o, DO)
                    if PIPE < 3:
                        rescale_rows(o, alpha, DO)
                    pack_p(p, s, BN, DT, HEXP)
                    ps = st
                    pph = ph
                else:  # a key tile past this warpgroup's diagonal, or its rows past sq
                    if j == n_mine and n_tiles - n_mine >= STAGES:  # the skips would wait for
                        # the stage of the pending P V to be refilled: that P V first, and
                        # the tile's rows
                        finish_tile(out, lse, o, p, m, l, alpha, v_s, bars, ps, pph, bh, row0,
                                    sq, lt, D, BN, PIPE, ONES, DT, LSE)  # fmt: skip
                        pending = 0
                    skip_tile(bars, st, ph, lt)
                st, ph = next_stage(st, ph, STAGES)
            prev_bh = bh
            prev_row0 = row0
            it += 1
    if pending != 0:  # the last tile's last P V and its rows
        finish_tile(out, lse, o, p, m, l, alpha, v_s, bars, ps, pph, prev_bh, prev_row0, sq,
                    lt, D, BN, PIPE, ONES, DT, LSE)  # fmt: skip


@kaio.gpu_func
def finish_tile(
    out: DT[:], lse: f32[:], o: f32[:, :], p: u32[:, :], m: f32[:], l: f32[:], alpha: f32[:],
    v_s: DT[:, :, :, :], bars: u64[:, :], ps: i32, pph: u32, bh: i32, row0: i32, sq: i32,
    lt: u32, D: kaio.constexpr, BN: kaio.constexpr, PIPE: kaio.constexpr, ONES: kaio.constexpr,
    DT: kaio.constexpr, LSE: kaio.constexpr = 0,
):  # fmt: skip
    """A tile's pending last O += P V (stage ``ps``, parity ``pph``), waited for, its rows stored
    (``store_rows``; ``ONES``: the row sums from O's last 8 columns, ``LSE``: and the
    rounding added back), then O and the row maxima and sums from the start."""
    DO = D + 8 * ONES
    if PIPE >= 3:
        rescale_rows(o, alpha, DO)
    pv_tile(o, p, v_s, bars, ps, pph, lt, BN, DT)
    if ONES:
        ones_sums(l, o, D, m, LSE)
    store_rows(out, lse, o, m, l, bh * sq * D, D, bh * sq, row0, 0, sq, lt % 32, D, DT)
    start_rows(m, l, o, DO)
    start_sums(l, LSE)


@kaio.gpu_func
def ones_sums(l: f32[:], o: f32[:, :], D: kaio.constexpr, m: f32[:], LSE: kaio.constexpr = 0):
    """``l[h]``: a quarter of row half h's sum of probabilities, from O's column block of
    ones (``ONES``: each of the row's 4 lanes holds the whole sum, and ``store_rows`` adds
    the 4 lanes' parts), plus with ``LSE`` this lane's part of what rounding took from the
    masked tiles' sums (``softmax_tile``), rescaled to the row max ``m[h]``."""
    for h in kaio.static_range(2):
        total = o[D // 8, 2 * h] * 0.25
        if LSE:
            base = kaio.select(m[h] == NEG_INF, 0.0, m[h])
            total += l[h] * kaio.exp2(l[2 + h] - base)
        l[h] = total


@kaio.gpu_func
def tile_of(
    t: i32, n_qt: i32, bhs: i32, hs: i32, heads: i32, group: i32, sq: i32, sk: i32, causal: i32,
    BM: kaio.constexpr, BN: kaio.constexpr,
) -> tuple[i32, i32, i32, i32]:  # fmt: skip
    """(bh, q0, kv head, key tiles) of work tile ``t``: the tiles come in sections of ``hs``
    (batch, head)s (the last may have fewer; ``bhs`` in all), each section's heaviest query
    tiles first (the causal mask's longest), its heads inner: query tile ``n_qt - 1 - r //
    h`` of (batch, head) ``section * hs + r % h``, for the section's r-th tile and h heads.
    ``hs`` 1: one head's tiles after another's; ``hs`` = ``bhs``: every head's heaviest
    first. Causal: the tiles end at sq (``first_row``), so that where BM does not divide sq
    the partial tile is the lightest, not the heaviest."""
    first = t // (hs * n_qt) * hs
    h = kaio.min(hs, bhs - first)
    r = t - first * n_qt
    bh = first + r % h
    q0 = first_row(n_qt - 1 - r // h, n_qt, sq, causal, BM)
    kvh, n_tiles = kv_head_and_tiles(bh, q0, heads, group, sk, causal, BM, BN)
    return bh, q0, kvh, n_tiles


@kaio.gpu_func
def first_row(x: i32, n_qt: i32, sq: i32, causal: i32, BM: kaio.constexpr) -> i32:
    """The first row of query tile ``x`` of a head's ``n_qt`` tiles of ``BM`` rows: x BM, or
    with the mask x BM - (n_qt BM - sq), the tiles ending at sq and the first starting up to
    BM - 1 rows before the head's (rows that see no key and are not stored, ``store_rows``):
    its few rows then see 1 key tile, where the last tile's would see them all and keep
    their warpgroup busy with the tile's others idle (fwd64, issue 36: D 64's 192 rows)."""
    q0 = x * BM
    if causal != 0:
        q0 -= n_qt * BM - sq
    return q0


@kaio.gpu_func
def work_tile(
    k: i32, first: i32, step: i32, end: i32, n_qt: i32, PERSIST: kaio.constexpr
) -> i32:  # fmt: skip
    """The block's k-th work tile (``tile_of``'s index), or -1 where it has none (past
    ``end``): ``first + k * step``; with ``PERSIST`` 2 the rounds of ``step`` tiles go back
    and forth over the blocks (``first`` the block's place), so that with the tiles heaviest
    first every block's sum of work comes out nearly the same; with ``PERSIST`` 3 the
    block's k // 2-th pair u = first + k // 2 * step of a head's query tiles (``end``: twice
    the pairs), the head's u % half-th heaviest and then its u % half-th lightest (half =
    ceil(n_qt / 2); an odd count's middle tile has no partner): the causal mask's work
    the same in every pair."""
    w = first + k * step
    if PERSIST == 2 and k % 2 == 1:
        w = k * step + step - 1 - first
    if PERSIST == 3:
        w = 2 * (first + k // 2 * step) + k % 2
    if w >= end:
        w = -1
    elif PERSIST == 3:
        half = (n_qt + 1) // 2
        i = w // 2 % half  # the pair's rank from the heaviest
        r = i
        if w % 2 == 1:
            r = n_qt - 1 - i
        w = kaio.select(w % 2 == 1 and r == i, -1, w // 2 // half * n_qt + r)
    return w


@kaio.gpu_func
def planned_tile(
    k: i32, first: i32, step: i32, end: i32, n_qt: i32, plan: i32[:], PERSIST: kaio.constexpr
) -> i32:  # fmt: skip
    """``work_tile``'s, or with ``PERSIST`` 5 the block's k-th tile in ``plan``
    (``balanced_plan``: ``step`` tiles a block, -1 past its last)."""
    w = i32(-1)
    if PERSIST == 5:
        w = plan[1 + first * step + k]
    else:
        w = work_tile(k, first, step, end, n_qt, PERSIST)
    return w


@kaio.gpu_func
def init_barriers(bars: u64[:, :], turn: u64[:], t: u32, WG: kaio.constexpr,
                  STAGES: kaio.constexpr, SLOT: kaio.constexpr = 0,
                  SPLIT: kaio.constexpr = 0):  # fmt: skip
    """The block's barriers (``attention_fwd_wgmma``'s ``bars`` and ``turn``) initialized by
    its first thread, then the block synchronized: each stage's K and V "full" barriers
    (one arrival: the producer's, with the copies' bytes) and "free" ones (an arrival from
    each consumer warpgroup), the ping-pong turns (an arrival from each warp of the other
    warpgroup), Q landed (one), a partial key tile's V landed (one, ``zero_tail``), Q read
    (each consumer warpgroup), and the same two of the second Q buffer (``q_buffer``);
    ``SLOT`` 1 (PERSIST 4): the tile slot read (an arrival from each consumer thread);
    ``SPLIT`` 1: turn[0] and turn[1] (no ping-pong) a split tile's part written (an arrival
    from each thread of a warpgroup) and read (warpgroup 0's, ``consume_split``), turn[8]
    warpgroup 2's read."""
    if t == 0:
        for s in kaio.static_range(STAGES):
            for r in kaio.static_range(2):
                kaio.mbarrier_init(bars, (r, s), 1)
                kaio.mbarrier_init(bars, (2 + r, s), WG)
        kaio.mbarrier_init(turn, 0, 128 if SPLIT else 4)
        kaio.mbarrier_init(turn, 1, 128 if SPLIT else 4)
        if SPLIT and WG > 2:
            kaio.mbarrier_init(turn, 8, 128)
        kaio.mbarrier_init(turn, 2, 1)
        kaio.mbarrier_init(turn, 3, 1)
        kaio.mbarrier_init(turn, 4, WG)
        kaio.mbarrier_init(turn, 5, 1)  # the second Q buffer's (``QB`` 2) landed and read
        kaio.mbarrier_init(turn, 6, WG)
        if SLOT:
            kaio.mbarrier_init(turn, 7, 128 * WG)
        kaio.fence_proxy_async()
    kaio.sync_threads()


@kaio.gpu_kernel(fastmath=True)  # ex2.approx.ftz: one instruction an exponential
def attention_fwd_wgmma(
    tq: kaio.tensormap,
    tk: kaio.tensormap,
    tv: kaio.tensormap,
    out: DT[:],
    lse: f32[:],
    qg: DT[:],
    kg: DT[:],
    sq: i32,
    sk: i32,
    heads: i32,
    group: i32,
    scale_log2: f32,
    causal: i32,
    bhs: i32,
    hs: i32,
    sched: i32[:],
    D: kaio.constexpr,
    BN: kaio.constexpr,
    WG: kaio.constexpr,
    STAGES: kaio.constexpr,
    PIPE: kaio.constexpr,
    REGS: kaio.constexpr,
    PERSIST: kaio.constexpr,
    DT: kaio.constexpr,
    XT: kaio.constexpr,
    QB: kaio.constexpr,
    ONES: kaio.constexpr,
    LSE: kaio.constexpr,
    HEXP: kaio.constexpr,
    DIAG: kaio.constexpr,
    OV: kaio.constexpr,
    EARLY: kaio.constexpr,
    LAZY: kaio.constexpr,
    SPLIT: kaio.constexpr,
):
    """out[bh, row] = softmax(q[bh, row] k[kv]^T * scale) v[kv] and lse[bh, row] for the
    work tiles of ``64 * WG`` query rows of one (batch, head) ``bh`` (``tile_of``; ``bhs``:
    B * H of them, in sections of ``hs``): block (x, y)'s tile y * grid x + x, or with
    ``PERSIST`` tiles x, x + grid x, ... (module docstring). ``tq``: q as [B * H * sq, D]
    in boxes of (64 * WG, 64); ``tk``, ``tv``: k, v as [B * Hkv * sk, D] in boxes of (BN, 64);
    ``out`` [B * H * sq * D] and ``lse`` [B * H * sq] flat; ``qg``, ``kg``: q and k flat
    (``LAZY`` 2's rare path, ``scores_again``); ``scale_log2``: the scale times
    log2(e). ``XT``, ``QB``, ``ONES``: the one-stream schedule, its Q buffers and the row
    sums on the tensor cores (module docstring; ``extras``); ``DIAG`` 1: the unmasked key
    tiles in a loop of their own, ``OV`` 1: O stored as 16-byte vectors, ``EARLY`` 1: P
    packed as the exponentials come, ``LAZY`` 1: a row max kept while the scores exceed it
    by little, ``SPLIT`` 1: a head's last tile, when warpgroup 0's rows are all its rows, with
    its key tiles shared by the warpgroups (``consume_tile``).
    ``sched``: two i32 counters, 0 at the launch, that ``PERSIST`` 4 takes its tiles from
    and leaves 0 (``produce_dynamic``); with ``PERSIST`` 5 the plan of every block's tiles
    (``balanced_plan``)."""
    BM = 64 * WG
    C = D // 64  # 64-column blocks of a row
    KV_BYTES = BN * D * 2
    Q_BYTES = QB * BM * D * 2
    V_BYTES = BN * (D + 64 * ONES) * 2  # a V stage (ONES: and a column block of ones)
    q_s = kaio.shared_dynamic(DT, (QB * C, BM, 64), 0)
    k_s = kaio.shared_dynamic(DT, (STAGES, C, BN, 64), Q_BYTES)
    v_s = kaio.shared_dynamic(DT, (STAGES, C + ONES, BN, 64), Q_BYTES + STAGES * KV_BYTES)
    # bars[0, s]: K of stage s landed, [1, s]: V landed, [2, s]: K free, [3, s]: V free;
    # turn[0], turn[1]: warpgroup 0's, 1's turn on the tensor cores (PIPE 2, 4), turn[2]: Q
    # landed, turn[3]: a partial key tile's V landed (the producer's, ``zero_tail``), turn[4]:
    # Q read by every consumer warpgroup; turn[5], turn[6]: the second Q buffer's landed and
    # read (QB 2); turn[7]: the tile slot read (PERSIST 4); SPLIT: turn[0] a part written,
    # turn[1] and turn[8] warpgroup 1's and 2's read (``consume_split``)
    bars = kaio.shared_dynamic(u64, (4, STAGES), Q_BYTES + STAGES * (KV_BYTES + V_BYTES))
    turn = kaio.shared_dynamic(u64, (10,), Q_BYTES + STAGES * (KV_BYTES + V_BYTES) + 32 * STAGES)
    # PERSIST 4: the work tile of each Q buffer (``produce_dynamic``)
    tile_s = kaio.shared_dynamic(
        i32, (4,), Q_BYTES + STAGES * (KV_BYTES + V_BYTES) + 32 * STAGES + 80
    )
    t, wg, lt = thread_roles(WG)
    n_qt = (sq + BM - 1) // BM
    first = i32(kaio.block_idx_x())  # PERSIST: tiles first, first + grid, ...
    end = n_qt * bhs
    if PERSIST == 0:  # a tile a block
        first = i32(kaio.block_idx_y()) * n_qt + i32(kaio.block_idx_x())
        end = first + 1
    if PERSIST == 3:  # pairs of query tiles: twice the pairs
        end = 2 * ((n_qt + 1) // 2) * bhs  # (launch passes hs = 1: head after head)
    step = i32(kaio.grid_dim_x())
    rounds = (end - first + step - 1) // step  # the block's tiles
    if PERSIST == 2:  # rounds of step tiles, back and forth: one may leave the block out
        rounds = (end + step - 1) // step
    if PERSIST == 3:  # pairs first, first + grid, ...
        rounds = 2 * ((end // 2 - first + step - 1) // step)
    if PERSIST == 5:  # a plan's tiles (``balanced_plan``): as many for every block
        rounds = sched[0]
        step = rounds
    init_barriers(bars, turn, t, WG, STAGES, PERSIST == 4, SPLIT)
    if ONES:  # each V stage's column block of ones (the copies never write it)
        one = kaio.local(DT, 8)
        for e in kaio.static_range(8):
            one[e] = DT(1.0)
        for st in kaio.static_range(STAGES):
            for r in range(i32(t) // 8, BN, (WG + 1) * 16):
                kaio.store_vector(v_s, (st, C, r, i32(t % 8) * 8), one)
        kaio.fence_proxy_async()  # for the tensor cores
        kaio.sync_threads()
    if wg < WG and XT:  # the consumers, the block's tiles as one stream
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        consume_stream(q_s, k_s, v_s, bars, turn, out, lse, wg, lt, first, step, end, rounds,
                       n_qt, bhs, hs, heads, group, sq, sk, causal, scale_log2, D, BN, WG,
                       STAGES, PIPE, PERSIST, QB, ONES, DT, LSE, HEXP)  # fmt: skip
    elif wg < WG and PERSIST == 4:  # the consumers, tiles as the producer takes them
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        st = i32(0)  # (``consume_tile``'s state, as below)
        ph = u32(0)
        g = i32(0)
        done = i32(0)
        w = i32(0)
        while w >= 0:
            b, landed, read = q_buffer(done, QB)
            kaio.mbarrier_wait(turn, landed, u32(done // QB) & 1)
            # every thread reads the slot (-1: no more) and tells the producer: no branch on
            # the lane, which ptxas took for divergence, computing every wgmma descriptor of
            # the tile loop in regular registers (R2UR, ~40 more instructions a key tile)
            w = tile_s[b]
            kaio.mbarrier_arrive(turn, 7)
            if w >= 0:
                bh, q0, kvh, n_tiles = tile_of(w, n_qt, bhs, hs, heads, group, sq, sk, causal,
                                               BM, BN)  # fmt: skip
                st, ph, g, done = consume_tile(
                    q_s, k_s, v_s, bars, turn, out, lse, wg, lt, bh * sq * D, D, bh * sq,
                    q0, n_tiles, 0, sq, sk, causal, scale_log2, st, ph, g, done, qg, kg,
                    kvh * sk, D, BN,
                    STAGES, PIPE, DT, ONES, LSE, QB, 64 * WG > BN, HEXP, DIAG, OV, EARLY, LAZY,
                    SPLIT * WG,
                )  # fmt: skip
    elif wg < WG:  # the consumers
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        st = i32(0)  # the ring's stage and parity, the ping-pong steps, the tiles done
        ph = u32(0)  # (``consume_tile``)
        g = i32(0)
        done = i32(0)
        for k in range(rounds):
            w = planned_tile(k, first, step, end, n_qt, sched, PERSIST)
            if w >= 0:
                bh, q0, kvh, n_tiles = tile_of(w, n_qt, bhs, hs, heads, group, sq, sk, causal,
                                               BM, BN)  # fmt: skip
                if (PIPE == 2 or PIPE == 4) and wg == 0:  # ping-pong: a loop in each branch
                    st, ph, g, done = consume_tile(
                        q_s, k_s, v_s, bars, turn, out, lse, wg, lt, bh * sq * D, D, bh * sq,
                        q0, n_tiles, 0, sq, sk, causal, scale_log2, st, ph, g, done, qg, kg,
                    kvh * sk, D, BN,
                        STAGES, PIPE, DT, ONES, LSE, QB, 64 * WG > BN, HEXP, DIAG, OV, EARLY,
                        LAZY, SPLIT * WG,
                    )  # fmt: skip
                else:
                    st, ph, g, done = consume_tile(
                        q_s, k_s, v_s, bars, turn, out, lse, wg, lt, bh * sq * D, D, bh * sq,
                        q0, n_tiles, 0, sq, sk, causal, scale_log2, st, ph, g, done, qg, kg,
                    kvh * sk, D, BN,
                        STAGES, PIPE, DT, ONES, LSE, QB, 64 * WG > BN, HEXP, DIAG, OV, EARLY,
                        LAZY, SPLIT * WG,
                    )  # fmt: skip
    elif PERSIST == 4:  # the producer warpgroup: its first warp takes the tiles
        producer_start(REGS)
        if lt < 32:
            produce_dynamic(q_s, k_s, v_s, bars, turn, tile_s, sched, tq, tk, tv, lt, end, n_qt,
                            bhs, hs, heads, group, sq, sk, causal, D, BN, WG, STAGES, DT,
                            QB)  # fmt: skip
    else:  # the producer warpgroup: its first thread loads
        cnt, it, tails = producer_start(REGS)
        for k in range(rounds):
            w = planned_tile(k, first, step, end, n_qt, sched, PERSIST)
            if w >= 0:
                bh, q0, kvh, n_tiles = tile_of(w, n_qt, bhs, hs, heads, group, sq, sk, causal,
                                               BM, BN)  # fmt: skip
                tail = n_tiles * BN > sk  # the last key tile reaches past the keys
                if lt == 0:
                    produce(q_s, k_s, v_s, bars, turn, tq, tk, tv, bh * sq + q0, kvh * sk, 0, 0,
                            n_tiles, it, cnt, tail, D, BN, WG, STAGES, DT, QB)  # fmt: skip
                cnt += n_tiles
                it += 1
                if lt < 32 and tail:  # the warp waits until its first thread has issued every
                    # copy: an earlier wait on turn[3] could see an earlier phase of the same
                    # parity complete (measured on an H100: the zeros landed before the copy
                    # did)
                    kaio.sync_warp()
                    zero_tail(v_s, bars, turn, n_tiles - 1, cnt - 1, tails, sk, lt, D, BN,
                              STAGES, DT)  # fmt: skip
                    tails += 1


def shared_bytes(d: int, bn: int, wg: int, stages: int, qb: int = 1, ones: int = 0,
                 split: int = 0) -> int:  # fmt: skip
    """The dynamic shared memory of ``attention_fwd_wgmma``: ``qb`` Q buffers, the K/V ring
    (``ones``: a column block of ones beside each V stage), its barriers (``split``: and the
    part of a split tile, ``consume_split``)."""
    parts = split * (4 + (d + 8 * ones) // 2) * 128 * 4
    return qb * 64 * wg * d * 2 + stages * bn * (2 * d + 64 * ones) * 2 + 32 * stages + 96 + parts


def config(d: int, causal: bool = False) -> dict:
    """The constexprs of ``attention_fwd_wgmma`` for head dim ``d`` (64, 128, 256) and the
    mask, as measured fastest on an H100 under the driver's whole-program JIT
    (docs/hopper.md, "Schedules under the whole-program JIT"): key tiles of 128 (64 for
    d = 256, whose O accumulators take 128 registers a thread); two stages; the softmax
    overlapped with the tensor cores inside each warpgroup (no ping-pong: it measured
    slower), O rescaled after P V (PIPE 1) or while S = Q K^T runs (PIPE 3); three
    consumer warpgroups (192 query rows) at D = 64, two (128 rows) otherwise. Blocks:
    persistent over pairs of a head's query tiles (PERSIST 3, the heaviest with the
    lightest) at D = 128 (514 TFLOP/s against 489 for a tile a block at S = 4096 with the
    mask, 586-668 without it, as fast as a tile at a time) and at D = 256 with the mask
    (564 against 531); at D = 64 persistent without the mask; a tile a block otherwise
    (the hardware starts them heaviest first)."""
    bn = 64 if d == 256 else 128
    wg = 3 if d == 64 else 2
    fit = (SHARED_LIMIT - 64 * wg * d * 2 - 256) // (2 * bn * d * 2)
    stages = max(1, min(2, fit))
    pipe = 1 if causal or d == 128 else 3
    persist = 3 if d == 128 or (d == 256 and causal) else int(d == 64 and not causal)
    return {
        "BN": bn, "WG": wg, "STAGES": stages, "PIPE": pipe, "REGS": consumer_registers(wg),
        "PERSIST": persist,
    }  # fmt: skip


# a tile at a time, one Q buffer, sums by FADD (LSE: the rounding added back, with ONES)
EXTRAS_OFF = {
    "XT": 0,
    "QB": 1,
    "ONES": 0,
    "LSE": 0,
    "HEXP": 0,
    "DIAG": 0,
    "OV": 0,
    "EARLY": 0,
    "LAZY": 0,
    "SPLIT": 0,
}


SHORT_KEYS = 1024  # f16 D128 at most this many keys: tiles from a counter (``extras``)
MANY_TILES = 8  # query tiles a multiprocessor from which ``extras`` routes QB 2, PERSIST 4
# PERSIST 4 at D128 and SHORT_KEYS keys or fewer: compute-sanitizer's racecheck reports no
# hazard on the tile slot's barrier now (``produce_dynamic``), but it measured no faster than
# pairs of tiles there in the fourth pass (docs/performance.md): off
ROUTE_COUNTER = False
# D64 with the mask: heads a section of ``tile_of`` (``launch``'s SECTION), whose query
# tiles go heaviest first together, so that the blocks started last are light (fwd64,
# docs/performance.md: 1-6% faster than one head a section at S 2048-16384, on the counter
# at S 1024 too; a tile a block at S 1024 and without the mask: -4% to +3%, not routed)
D64_SECTION = 32
D64_COUNTER_KEYS = 2048  # f16 D64 with the mask at most this many keys: the counter


def extras(d: int, causal: bool = False, dt=None, sk: int = 0, many: bool = True) -> dict:
    """The constexprs beyond ``config``'s that ``launch`` adds where its configuration has
    none (``EXTRAS_OFF`` under them): ``XT`` (1: a block's tiles as one stream of key-tile
    steps, ``consume_stream``), ``QB`` (its Q buffers, 2 where they fit in shared memory
    beside the ring) and ``ONES`` (1: the row sums of the probabilities on the tensor
    cores, as 8 more columns of O from a block of ones beside each V stage; D <= 248), for
    element type ``dt`` (a kaio type; None: f16). Measured on an H100 (docs/hopper.md, "Row
    sums on the tensor cores"): ONES at D 64 and 128 for f16 (up to 5% faster, within 2%
    where it was behind); for bf16 only at D 64 without the mask (below): its rounded
    probabilities moved the logsumexp of causal rows with few keys by up to 1.5e-3 (the GPU
    test's bound is 1e-3); with ``LSE``
    (the masked tiles' rounding added back) 5.8e-4, but bf16 ONES + LSE ran no faster than
    the FADD sums (-3% to +2%, docs/performance.md "the consumer's state as a tuple"), and
    f16 LSE no faster than ONES alone, so neither is routed; XT measured 1-8% slower at
    S 16384, so not routed. QB 2 (the next tile's Q and first keys loaded while this tile's
    are read) for f16 at D 128 with the mask, where the query tiles are short: 1-3% faster
    at S 2048-4096, 1-9% at S 1024, as fast at S 16384 (docs/performance.md, "exponentials
    two at a time"); without the mask it lost 4-5% at S 16384, and bf16 ran as fast either
    way. For f16 at D 128 and at most ``SHORT_KEYS`` keys ``sk`` (0: unknown), QB 2 with
    the mask or not, and with ``ROUTE_COUNTER`` (on: see there) ``PERSIST`` 4 (tiles taken
    from a counter, one head a section): 3-7% faster at S 1024 (2-7% behind at S
    4096-16384); ``launch`` lets this PERSIST override ``config``'s when it routes. Both
    only where the launch has ``many`` (at least MANY_TILES query tiles a multiprocessor:
    they were measured faster with 15, 5-12% slower with 2 and 4, B2 and B4 H16 S1024).
    D 64 with the mask and at most ``D64_COUNTER_KEYS`` keys, with ``many``, either type:
    ``PERSIST`` 4, QB 2 and three stages (three warpgroups taking tiles from the counter,
    heaviest first, where ``config`` has a tile a block: 8.6% faster at B16 H16 S1024 with
    two stages, fourth pass; three stages and D64_SECTION heads a section 5% faster again at
    S 1024 and 2048, as fast as a tile a block at S 4096, slower at S 16384; fwd64; bf16,
    its sums by FADD: 311 TFLOP/s against a tile a block's 257 at B16 H16 S1024, fwd64's
    second pass); the same without the mask at most SHORT_KEYS keys (in place of
    ``config``'s persistent blocks: f16 +2.3%, bf16 +2.6% and +2.9% at B16 H16 S1024; at
    S 2048 5% slower; fwd64's second pass); on it O stored as 16-byte vectors (``OV`` 1:
    f16 +3.3% at B16 H16 S1024, +3.6% at Sk 512, with the mask +2.0% and +1.5% at S 2048)
    and with the mask the unmasked key tiles apart (``DIAG`` 1: +1.6% and +2.6% against the
    same counter without it); both against main: f16 +2.3% to +2.8% at B16 H16 S1024, with
    the mask +3.2% to +3.3% there and at S 2048; bf16 +1.9% to +2.8% (fwd64's third pass).
    D64 with the mask past SHORT_KEYS keys, either type: ``SECTION`` D64_SECTION
    (``launch``'s sections of heads). D64, every route, either type: ``EARLY`` 1 (P V
    waited for after the row maxima, P packed among the exponentials: ``overlap_step``;
    against main at B16 H16 S1024 f16 +1.4%, with the mask +1.2%, bf16 +0.8% and +1.1%; at
    B8 S2048 f16 +0.7% and +2.1%, bf16 +1.3% and +1.9%: fwd64, 2026-11-27, round D).
    D64 f16, every route: ``LAZY`` 2 (FlashAttention-4's lazy rescale, the exponentials
    taken on the kept row max beside the new max's chain; against main at B16 H16 S1024
    +4.1%, with the mask +2.2%; B8 S2048 +3.5% and +1.2%; on the FADD sums 1-11% slower,
    f16's too: -10% at B16 S1024, fwd64 2026-11-27 round B), and without the mask ``SPLIT``
    1 (a head's last tile of at most 64 rows with its key tiles shared by the three
    warpgroups: +1.2% on top at S1024); on the counter without the mask ``DIAG`` 1 too
    (every full key tile without the mask's test: +1.4% at B16 H16 S1024, fwd64 round E).
    bf16 at D64 without the mask: f16's route, ONES 1 with LAZY 2, SPLIT and on the counter
    DIAG (fwd64 2026-11-27, round C: +13% against main at B16 H16 S1024, +4% at B8 S2048;
    the logsumexp off by up to 4.1e-4 on random inputs, 4.2e-3 with q times 8: the
    probabilities rounded to bf16, up to 2^8 on the kept max; f16's 1.8e-4 and 5.5e-4).
    With the mask bf16 keeps the FADD sums: there its rows of few keys were off by 1.5e-3,
    past the GPU test's 1e-3, and LSE's fix of them ran 9% slower (round B).
    ``HEXP`` (the exponentials as f16 pairs) measured no faster (-2% to +2%). ``OV`` 1 (O
    stored as 16-byte vectors) at D 128 and 256, either type (fourth pass: D128 f16 +2% at
    S 4096, +4% with the mask, +10% and +13% at S 1024; D256 +5% to +20%; D64 no faster on
    its routes then, faster on the counter since, above);
    ``DIAG`` 1 (the unmasked key tiles in a loop of their own) at D 128 with the mask (+1%
    to +2%). ``PERSIST`` 5 (each block's tiles from a plan made on the host,
    ``balanced_plan``: the tiles heaviest first in sections of heads, ``plan_section``, each
    to the block with the least work so far) at D 128 with the mask, either type, where the
    launch has ``many`` query tiles, in place of ``config``'s pairs (PERSIST 3), whose
    blocks took 8 or 7 pairs where the plan evens them out (H100, kernel time: B4 H16 S4096
    f16 +1.0% to +2.0%, bf16 +2.2% to +2.6%; B1 S16384 f16 +2.6%, bf16 +7%; B4 H32/8 S4096
    +1.3% to +2.6%; B16 S1024 -1% to +1%; docs/performance.md, fwdc)."""
    f16 = dt in (None, kaio.f16)
    ones = f16 or (d == 64 and not causal)  # (bf16 at D64 without the mask: fwd64, 2026-11-27)
    every = {"OV": 1} if d in (128, 256) else {"EARLY": 1}  # (either type)
    if d == 128 and causal:
        every["DIAG"] = 1
        if many:
            every["PERSIST"] = 5
    if d == 64 and causal and sk > SHORT_KEYS:  # (launch's, not the kernel's)
        every["SECTION"] = D64_SECTION
    if d == 64 and ones:  # (LAZY 2: fwd64, 2026-11-27, rounds B and C)
        every["LAZY"] = 2
        if not causal:
            every["SPLIT"] = 1
    if d == 64 and many and 0 < sk <= (D64_COUNTER_KEYS if causal else SHORT_KEYS):  # (counter)
        return {"PERSIST": 4, "QB": 2, "STAGES": 3, "SECTION": D64_SECTION, "ONES": int(ones),
                "OV": 1, "DIAG": 1, **every}  # fmt: skip
    if d > 128 or not ones:
        return every
    more = d == 128 and many
    short = more and 0 < sk <= SHORT_KEYS
    return {**every, "ONES": 1, **({"QB": 2} if more and (causal or short) else {}),
            **({"PERSIST": 4} if short and ROUTE_COUNTER else {})}  # fmt: skip


def takes_lazy(cfg: dict) -> bool:
    """Whether ``cfg``'s schedule takes ``LAZY`` 2: P V waited for before the exponentials
    (EARLY), a tile at a time (XT 0), no rounding added back (LSE 0: it would take the
    rounding on the new max, not on the kept one nor after ``grown``'s rare paths; bf16
    with the mask measured 9% slower than the FADD sums with it, fwd64 2026-11-27)."""
    return bool(cfg.get("EARLY", 0)) and not cfg.get("XT", 0) and not cfg.get("LSE", 0)


def takes_split(cfg: dict) -> bool:
    """Whether ``cfg``'s schedule takes ``SPLIT`` 1: two or more consumer warpgroups, a tile
    at a time (XT 0), no ping-pong (whose barriers SPLIT takes), the sums without LSE's
    rounding."""
    return (
        not cfg.get("XT", 0) and not cfg.get("LSE", 0) and cfg["PIPE"] in (1, 3) and cfg["WG"] >= 2
    )


def check_stream(cfg: dict, d: int) -> None:
    """A ValueError where ``cfg``'s ``XT`` and ``QB`` do not go together with its schedule
    and the shared memory."""
    xt, qb = cfg.get("XT", 0), cfg.get("QB", 1)
    if cfg.get("ONES", 0) and d + 8 > 256:
        raise ValueError(
            f"attention_fwd_wgmma: the row sums on the tensor cores (ONES 1) widen P V to "
            f"{d + 8} columns, past wgmma's 256, at D = {d}: use ONES 0 there"
        )
    if cfg.get("LSE", 0) and not cfg.get("ONES", 0):
        raise ValueError(
            "attention_fwd_wgmma: LSE 1 adds the rounding of the probabilities back to the "
            "row sums on the tensor cores, but ONES is 0 (the sums by FADD need no "
            "correction): use LSE 0, or ONES 1"
        )
    if cfg.get("HEXP", 0) and (not cfg.get("ONES", 0) or cfg.get("LSE", 0)):
        raise ValueError(
            "attention_fwd_wgmma: HEXP 1 computes the probabilities as 16-bit pairs, so the "
            "row sums must come from the tensor cores (ONES 1) and LSE (which sums the f32 "
            "probabilities' rounding) must be 0: use ONES 1, LSE 0, or HEXP 0"
        )
    if cfg.get("LAZY", 0) == 2 and not takes_lazy(cfg):
        raise ValueError(
            "attention_fwd_wgmma: LAZY 2 takes the exponentials on the kept row max as P V "
            "is waited for (EARLY 1), a tile at a time (XT 0), without LSE: use LAZY 0 or 1 "
            "otherwise"
        )
    if cfg.get("SPLIT", 0) and not takes_split(cfg):
        raise ValueError(
            "attention_fwd_wgmma: SPLIT 1 shares a tile's key tiles among two or more consumer "
            "warpgroups (WG >= 2) of a tile at a time (XT 0) in PIPE 1's or 3's order, its "
            "sums without LSE's rounding: use SPLIT 0 otherwise"
        )
    if xt and cfg.get("PERSIST") == 5:
        raise ValueError(
            "attention_fwd_wgmma: one stream of a block's tiles (XT 1) takes its tiles in "
            "work_tile's order, not from a plan (PERSIST 5): use XT 0, or PERSIST 0 to 4"
        )
    if xt and cfg["PIPE"] not in (1, 3):
        raise ValueError(
            f"attention_fwd_wgmma: one stream of a block's tiles (XT 1) takes PIPE 1's or 3's "
            f"order, got PIPE {cfg['PIPE']}: use PIPE 1 or 3, or XT 0"
        )
    if qb not in (1, 2):
        raise ValueError(
            f"attention_fwd_wgmma: QB {qb} Q buffers: the kernel has barriers for 1 or 2 "
            f"(``q_buffer``): use QB 1 or 2"
        )
    need = shared_bytes(d, cfg["BN"], cfg["WG"], cfg["STAGES"], qb, cfg.get("ONES", 0),
                        cfg.get("SPLIT", 0))  # fmt: skip
    if need > SHARED_LIMIT:
        raise ValueError(
            f"attention_fwd_wgmma: {qb} Q buffers and {cfg['STAGES']} stages of {cfg['BN']} "
            f"keys at D = {d} take {need} bytes of shared memory, more than {SHARED_LIMIT}: "
            f"use QB 1 or fewer stages"
        )


def eligible(d: int) -> bool:
    """Whether the kernel takes head dim ``d``: 64, 128 or 256 (whole 64-column blocks)."""
    return d in (64, 128, 256)


def worthwhile(bh: int, sq: int, sk: int, d: int, sms: int) -> bool:
    """Whether the kernel beat the mma.sync one (measured on an H100, docs/hopper.md): every
    head dim it takes (64, 128, 256: 1.4x to 2.8x its TFLOP/s at S = 4096; a partial last
    key tile too: 507 against 265 at S = 4000), sequences of 1024 and more (at 512 it lost
    with the causal mask: 178 against 190) and enough 128-row tiles to give every
    multiprocessor a block."""
    return eligible(d) and sq >= 1024 and sk >= 1024 and bh * -(-sq // 128) >= sms


PLAN_BOUNDARY = 2  # PERSIST 5: a tile's start and end, in key tiles' work (``balanced_plan``)
PLAN_SECTION_BYTES = 8 << 20  # PERSIST 5: the keys and values of a section of heads


def plan_section(sk: int, d: int, group: int) -> int:
    """``PERSIST`` 5's (batch, head)s a section (``tile_of``): as many as read at most
    PLAN_SECTION_BYTES of keys and values (``group`` query heads share a K/V head), so that
    they stay in L2 while the section's tiles run, and at least 2 (fewer sections, a better
    balance at the end). The best measured on an H100 (docs/performance.md, fwdc): 16 at
    S 1024, 4 to 8 at S 4096, 2 at S 16384 (D 128)."""
    return max(2, PLAN_SECTION_BYTES * group // (4 * sk * d))


_PLANS: dict = {}  # (kind, device, plan's key) -> the plan on the device (``planned_tiles``)


def balanced_plan(bhs: int, n_qt: int, sq: int, hs: int, ctas: int, sk: int, causal: bool,
                  bm: int, bn: int, boundary: int) -> np.ndarray:  # fmt: skip
    """``PERSIST`` 5's plan: ``tile_of``'s work tiles (sections of ``hs`` (batch, head)s,
    each section's heaviest query tiles first), in that order, each to the block with the
    least work so far (its key tiles, plus ``boundary`` a tile; the tiles heaviest first in
    a section: nearly the same work for every block, the last tiles the lightest), as int32
    [1 + ctas * R]: R, then each block's R tiles in order, -1 past its last."""
    import heapq

    n_kv = -(-sk // bn)
    loads = [(0, b) for b in range(ctas)]
    tiles = [[] for _ in range(ctas)]
    for t in range(n_qt * bhs):
        first = t // (hs * n_qt) * hs
        x = n_qt - 1 - (t - first * n_qt) // min(hs, bhs - first)
        n = min(n_kv, (x * bm - (n_qt * bm - sq) + bm + bn - 1) // bn) if causal else n_kv
        load, b = heapq.heappop(loads)
        tiles[b].append(t)
        heapq.heappush(loads, (load + n + boundary, b))
    r = max(len(x) for x in tiles)
    plan = np.full(1 + ctas * r, -1, np.int32)
    plan[0] = r
    for b, x in enumerate(tiles):
        plan[1 + b * r : 1 + b * r + len(x)] = x
    return plan


def planned_tiles(like, key: tuple, make):
    """The plan ``make()`` (``balanced_plan``) on ``like``'s device, made once for ``key``
    and kept (call plans pass it as it is)."""
    from kaio_ops import _arrays

    full = (like.kind, like.device, key)
    found = _PLANS.get(full)
    if found is None:
        plan = make()
        if like.kind == "torch":
            found = importlib.import_module("torch").from_numpy(plan).to(like.obj.device)
        elif like.kind == "cupy":
            cupy = importlib.import_module("cupy")
            with cupy.cuda.Device(like.device):
                found = cupy.asarray(plan)
        elif like.kind == "kaio":
            found = _arrays.new_array("kaio", like.device, like.obj, plan.shape, i32)
            found.copy_from_host(plan)
        else:
            found = plan
        _PLANS[full] = _arrays.constant(found)
    return found


def launch(qa, ka, va, dims: tuple, causal: bool, scale: float, cfg: dict | None = None,
           kernel=None, ctas: int | None = None):  # fmt: skip
    """Run ``attention_fwd_wgmma`` (or ``kernel``, a variant of it: bench/attention_hopper.py)
    on checked operands (``_arrays.Operand``s q [B, H, Sq, D], k, v [B, Hkv, Sk, D] of one
    16-bit type); ``dims``: (B * H, H, group, sq, sk, d, d); ``cfg``: the constexprs (default
    ``config(d)``); ``ctas``: the blocks of a
    persistent launch (default: one a multiprocessor). Returns (out [B, H, Sq, D] of q's type,
    lse [B, H, Sq] f32)."""
    import math

    from kaio_ops import _arrays

    bh, heads, group, sq, sk, d, _ = dims
    many = bh * -(-sq // 128) >= MANY_TILES * _arrays.multiprocessors(qa)
    routed = extras(d, causal, qa.dtype, sk, many)
    given = cfg or {}
    cfg = {**EXTRAS_OFF, **routed, **cfg} if cfg else {**EXTRAS_OFF, **config(d, causal), **routed}
    if "LAZY" not in given and cfg["LAZY"] >= 2 and not takes_lazy(cfg):  # (routed: left out
        cfg["LAZY"] = 0  # where the given schedule cannot take it)
    if "SPLIT" not in given and cfg["SPLIT"] and not takes_split(cfg):
        cfg["SPLIT"] = 0
    check_stream(cfg, d)
    # sections of heads (tile_of): one head's tiles after another's (PERSIST 2: every head's
    # heaviest tiles first; PERSIST 3 takes pairs of a head's tiles, head after head)
    # (PERSIST 5: sections whose keys and values stay in L2, ``plan_section``)
    section = cfg.pop("SECTION", 0)
    hs = section or (bh if cfg.get("PERSIST") == 2 else 1)
    if cfg.get("PERSIST") == 3:
        hs = 1
    if cfg.get("PERSIST") == 5 and not section:
        hs = plan_section(sk, d, group)
    if cfg["PIPE"] in (2, 4) and cfg["PERSIST"] == 4:
        raise ValueError(
            f"attention_fwd_wgmma: ping-pong (PIPE {cfg['PIPE']}) with tiles taken from a "
            f"counter (PERSIST 4) is not written: use PIPE 0, 1 or 3, or PERSIST 0 to 3"
        )
    if cfg["PIPE"] in (2, 4) and cfg["WG"] != 2:
        raise ValueError(
            f"attention_fwd_wgmma: ping-pong (PIPE {cfg['PIPE']}) takes turns between two "
            f"consumer warpgroups, got WG = {cfg['WG']}: use PIPE 0, 1 or 3 for other counts"
        )
    bm = 64 * cfg["WG"]
    out = _arrays.output(qa, qa.shape)
    lse = _arrays.output(qa, qa.shape[:-1], f32)
    rows_q, rows_kv = bh * sq, ka.size // d
    # the maps over the operands' memory as 2-D arrays (``Operand.arg``: no view made);
    # their bytes are encoded once per address and layout (``kaio.tensormap.MAPS_KEPT``)
    tq = kaio.tensor_map_2d(qa.arg(rows_q, d), (bm, 64), SW)
    tk = kaio.tensor_map_2d(ka.arg(rows_kv, d), (cfg["BN"], 64), SW)
    tv = kaio.tensor_map_2d(va.arg(rows_kv, d), (cfg["BN"], 64), SW)
    out_flat = _arrays.output_arg(qa, out, (bh * sq * d,))
    lse_flat = _arrays.output_arg(qa, lse, (bh * sq,), f32)
    smem = shared_bytes(d, cfg["BN"], cfg["WG"], cfg["STAGES"], cfg.get("QB", 1), cfg["ONES"],
                        cfg.get("SPLIT", 0))  # fmt: skip
    n_qt = -(-sq // bm)
    if cfg["PERSIST"]:
        work = bh * (-(-n_qt // 2) if cfg["PERSIST"] == 3 else n_qt)  # pairs of tiles, or tiles
        grid = (min(work, ctas or _arrays.multiprocessors(qa)), 1)
    else:
        grid = (n_qt, bh)
    sched = importlib.import_module("kaio_ops.linear")._counters(qa, 2)  # (PERSIST 4's)
    if cfg["PERSIST"] == 5:  # the plan's tiles in place of the counters
        key = (bh, n_qt, sq, min(hs, bh), grid[0], sk, causal, bm, cfg["BN"], PLAN_BOUNDARY)
        sched = planned_tiles(qa, key, lambda: balanced_plan(*key))
    (kernel or attention_fwd_wgmma)[grid, 128 * cfg["WG"] + 128, _arrays.stream_of(qa), smem](
        tq, tk, tv, out_flat, lse_flat, qa.arg(rows_q * d), ka.arg(rows_kv * d), sq, sk, heads,
        group, math.log2(math.e) * scale,
        int(causal), bh, min(hs, bh), sched, D=d, DT=qa.dtype, **cfg,
    )  # fmt: skip
    return out, lse


def specializations():
    """(kernel, constexprs) of the specializations the ops launch (for PTX checks)."""
    from kaio import bf16, f16

    for dt in (f16, bf16):
        for d in (64, 128, 256):
            routed = (
                {**EXTRAS_OFF, **config(d, c), **extras(d, c, dt, sk)}
                for c in (False, True)
                for sk in (0, SHORT_KEYS)  # (``extras``: fewer keys, another route)
            )
            kernel_cfgs = (tuple((k, v) for k, v in r.items() if k != "SECTION") for r in routed)
            for cfg in dict.fromkeys(kernel_cfgs):
                yield attention_fwd_wgmma, {"D": d, "DT": dt, **dict(cfg)}  # each once
