"""The deterministic fused Hopper (sm_90a) flash-attention backward: one kernel computes dK,
dV and dQ (FlashAttention-3's backward, ``kaio_ops._attention_hopper_bwd``'s ``DQ`` 5
schedule, whose consumer and producer warps it runs), and adds each query tile's dQ
contribution to an f32 buffer in a FIXED order, so that dQ has the same bits every run
(FlashAttention-3's deterministic mode).

A block owns ``64 * WG`` keys (key block ``x``) of one K/V head and walks the query tiles of
its group's heads; for each tile its consumers store the tile's dQ share (64 x D f32, in
fragment order) to shared memory and the dQ writer (the producer warpgroup's second warp)
adds it to the tile's 64 D floats of ``dq_acc`` with one ``bulk_reduce_add`` (the tile's
first share: one ``bulk_store``, so that ``dq_acc`` needs no zeros before). The writer
first waits (``kaio.wait_eq``, acquire loads) until the tile's semaphore (``sem``: an i32
per (head, query tile), zeroed before the kernel) equals this block's rank among the tile's
contributors, waits for its reduction to complete (``bulk_wait``), then releases the next
one (``threadfence`` and ``atomic_add(sem, tile, 1)``). The ranks:

- not causal: every key block adds to every query tile, in increasing key-block order
  (rank ``x``); block x is launched as ``block_idx_x`` x, so a block only waits for blocks
  of lower linear index (dispatched before it: no deadlock), and the blocks of a K/V head
  are consecutive (dispatched together: short waits, a wave-front once per wave);
- causal: key block x adds to the query tiles from ``x * BK // BM`` on, in DECREASING
  key-block order (rank ``x_max(t) - x``, ``x_max(t)`` the last key block that tile t sees),
  and block x is launched as ``block_idx_x`` ``nkb - 1 - x``: block x reaches each tile two
  tiles after block x + 1 (its first tile is two tiles further on), so they seldom wait
  (increasing order would make block x wait for block 0 to reach its first tile).

The launch order interleaves ``hg`` K/V heads (``HG``, the kernel's argument ``hg``;
``interleaved``): key block 0 of each head of a group of ``hg``, then key block 1, ... (key
block x of the order above, reversed where causal), so that a head's consecutive key
blocks, each a turn behind the last on every tile, start ``hg`` blocks apart instead of
side by side (with ``hg`` 1 the blocks of a head started together and each waited a turn
longer than the last: 12-17% of the time without the mask on an H100 at S 4096), while
the blocks running at once still share few heads' Q, dO and dQ sums in L2. A block still
waits only for blocks of lower linear index.

``ROT`` (the kernel's constexpr; ``rotated``) lets a block wait for later blocks of
its head, where all the key blocks of a head fit on the GPU at once (blocks are dispatched
in launch order: while every multiprocessor is busy, the oldest unfinished head's blocks all
run): not causal, key block x's walk over its W (head, tile) items begins at item x W /
nkb and wraps around, and the turns on an item follow the order the walks reach it
(``turn_rank``), so that a head's key blocks, launched side by side, add to different
tiles at any time instead of queueing on the same ones; causal, the key blocks are
launched in increasing order (the longest walks first, the shortest last: a shorter tail).
With rotated walks, ``FINISH`` gives each tile's last turn the tile's dQ (``finish_dq``: the
others' sum read once the semaphore says they are in, its own added, rounded and stored).

The simulator runs a kernel with ``wait_eq`` one block at a time in linear order: every
wait is met at once there, and an order that needs a later block is reported.
"""

from __future__ import annotations

import functools

import kaio
from kaio import bool_, f32, i32, u32, u64
from kaio_ops._attention_hopper import PRODUCER_REGS, SHARED_LIMIT, issue_pv, pack_p
from kaio_ops._attention_hopper_bwd import (
    _ds_buffers,
    config,
    consume_dkdv,
    grads_t,
    hand_dq,
    init_barriers,
    issue_dq,
    issue_front,
    issue_pt,
    launch_outputs,
    next_tile_wrapped,
    produce,
    release,
    row_map,
    shared_bytes,
    stats_maps,
    store_dq_frags,
    store_ds,
    store_tile,
    walk_start,
    zero_acc,
)
from kaio_ops._attention_hopper_common import (
    key_block_queries,
    next_tile,
    store_pairs,
    thread_roles,
)
from kaio_ops._attention_tc import lse_log2
from kaio_ops._common import lanes_sum
from kaio_ops._matmul_hopper import next_stage

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)

# Whether ``flash_attention_bwd`` takes this kernel (else the deterministic pair) for head
# dim d and the mask (not causal, causal), where ``_attention_hopper_bwd.launch`` is not
# told otherwise (``takes``).
ORDERED = {64: (True, True), 128: (True, True)}


def takes(d: int, causal: bool) -> bool:
    """Whether ``_attention_hopper_bwd.launch`` runs this kernel by default (``ORDERED``)."""
    return ORDERED.get(d, (False, False))[bool(causal)]


@kaio.gpu_func
def write_dq_ordered(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], sem: i32[:], lt: u32, first_head: i32,
    group: i32, first: i32, n_tiles: i32, sq: i32, x: i32, nkb: i32, causal: i32,
    FULL: kaio.constexpr, D: kaio.constexpr, BM: kaio.constexpr, BK: kaio.constexpr,
    EARLY: kaio.constexpr,
):  # fmt: skip
    """The dQ writers, the producer warpgroup's warps 1 to 3 (thread ``lt`` of it): for each
    tile of the consumers' walk, once they stored its dQ in dq_s (``bars[1, FULL]``), warp
    1's first lane waits for this key block's turn on the tile's semaphore, adds the tile
    with one bulk reduction to its ``BM`` D floats of ``dq_acc`` (tile t of head h at (h
    n_tiles + t) BM D, rows past sq: zeros to padding), waits for the addition to complete
    and passes the turn on; then dq_s is free (``bars[1, FULL + 1]``: an arrival a warp).
    ``EARLY``: 0 as above; 1 dq_s is free once the reduction has read it, before it
    completes (the turn passes as late); 2 as 1, and the turn on each tile is awaited (and
    the last tile's passed on) before the consumers have its dQ, so that once they have
    only the reduction's read of dq_s stands between them and the next tile's."""
    lane = i32(lt % 32)
    t = first
    at0 = first_head * sq
    ph = u32(0)
    last = i32(0)  # the last tile (EARLY 2: its turn passed on at the next)
    total = group * kaio.max(n_tiles - first, 0)
    for _i in range(total):
        tile = at0 // sq * n_tiles + t
        rank = turn_rank(x, nkb, t, 0, 1, causal, 0, BM, BK)
        if EARLY == 2 and lt == 32:  # while the consumers compute the tile's dQ
            if _i > 0:
                pass_turn(sem, last)
            kaio.wait_eq(sem, tile, rank)
        kaio.mbarrier_wait(bars, (1, FULL), ph)
        ph ^= 1
        if lt == 32:
            if EARLY < 2:
                kaio.wait_eq(sem, tile, rank)
            kaio.bulk_reduce_add(dq_acc, tile * BM * D, dq_s, (0, 0), BM * D * 4)
            kaio.bulk_commit()
            if EARLY:
                kaio.bulk_wait_read(0)
            else:
                pass_turn(sem, tile)
        kaio.sync_warp()
        if lane == 0:
            kaio.mbarrier_arrive(bars, (1, FULL + 1))
        if EARLY == 1 and lt == 32:
            pass_turn(sem, tile)
        last = tile
        t, at0 = next_tile(t, at0, first, n_tiles, sq)
    if EARLY == 2 and lt == 32 and total > 0:
        pass_turn(sem, last)


@kaio.gpu_func
def walk(s: i32, first: i32, n_tiles: i32, at_first: i32, stride: i32,
         ROT: kaio.constexpr) -> tuple[i32, i32]:  # fmt: skip
    """(t, at) of a walk's first tile: ``ROT``, item s (``walk_start``); else the first."""
    t, at = first, at_first
    if ROT:
        t, at = walk_start(s, first, n_tiles, at_first, stride)
    return t, at


@kaio.gpu_func
def walk_next(t: i32, at: i32, first: i32, n_tiles: i32, stride: i32, at_first: i32,
              heads_n: i32, ROT: kaio.constexpr) -> tuple[i32, i32]:  # fmt: skip
    """The walk's next tile: ``ROT``, wrapping around (``next_tile_wrapped``); else
    ``next_tile``."""
    if ROT:
        t, at = next_tile_wrapped(t, at, first, n_tiles, stride, at_first, heads_n)
    else:
        t, at = next_tile(t, at, first, n_tiles, stride)
    return t, at


@kaio.gpu_func
def turn_rank(
    x: i32, nkb: i32, t: i32, item: i32, total: i32, causal: i32, rot: i32, BM: kaio.constexpr,
    BK: kaio.constexpr,
) -> i32:  # fmt: skip
    """Key block x's turn (of ``nkb``) on query tile t, item ``item`` of its walk of
    ``total``: causal, decreasing key blocks from the last that sees the tile; ``rot``
    (``rotated``: key block x's walk begins at item ``x total // nkb`` and wraps), in the
    order the walks reach the item: first the key blocks whose walk began at or before it,
    the latest begun first, then the others, the latest first; else increasing key blocks."""
    rank = x
    if causal != 0:
        rank = kaio.min(nkb - 1, ((t + 1) * BM - 1) // BK) - x
    elif rot != 0:
        begun = kaio.min(nkb, ((item + 1) * nkb + total - 1) // total)  # walks begun by item
        rank = begun - 1 - x
        if x >= begun:
            rank += nkb
    return rank


@kaio.gpu_func
def pass_turn(sem: i32[:], tile: i32):
    """Once this thread's bulk reductions are done (the sums made, not only their source
    read), the next key block's turn on the tile: a fence, then the semaphore's increment."""
    kaio.bulk_wait(0)
    kaio.threadfence()
    kaio.atomic_add(sem, tile, 1)


@kaio.gpu_func
def consume_late(
    k_s: DT[:, :, :], v_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :],
    stats: f32[:, :, :], bars: u64[:, :], turn: u64[:], lse: f32[:], delta: f32[:],
    dk: DT[:], dv: DT[:], pt_s: DT[:, :, :], dq_s: f32[:, :], dq_acc: f32[:], sem: i32[:],
    dq: DT[:], wg: u32, lt: u32, kvh: i32, first_head: i32, group: i32, first: i32,
    n_tiles: i32, start: i32, x: i32, nkb: i32, k0: i32, sq: i32, sk: i32,
    causal: i32, scale_log2: f32, scale: f32, D: kaio.constexpr, BM: kaio.constexpr,
    WG: kaio.constexpr, STAGES: kaio.constexpr, TSTATS: kaio.constexpr, SCHED: kaio.constexpr,
    TWO: kaio.constexpr, DT: kaio.constexpr, NW: kaio.constexpr, NDS: kaio.constexpr,
    SPLIT: kaio.constexpr = 0, L2: kaio.constexpr = 0, PFIRST: kaio.constexpr = 0,
    ROT: kaio.constexpr = 0, FINISH: kaio.constexpr = 0, PERSIST: kaio.constexpr = 0,
    kb: i32 = 0, kph: u32 = 0, g0: i32 = 0, st: i32 = 0, ph: u32 = 0, pb: i32 = 0,
    hph: u32 = 0, wph: u32 = 0, fb: i32 = 0,
) -> tuple[i32, u32, i32, u32, u32, i32]:  # fmt: skip
    """Consumer warpgroup ``wg``'s 64 keys (thread ``lt`` of it) with ``SCHED`` 1 or 2: tile i's
    S^T and dP^T issued first, then tile i - 1's dV += P^T dO, dK += dS^T Q and dQ = dS K, all
    three from shared memory (``pt_s``: dS^T in buffers 0 and 1, P^T in 2 and 3, by tile
    parity; both warpgroups' rows there, ``bars[1, STAGES + b]``), so that tile i's P^T and
    dS^T are computed while they run; then tile i - 1's stage released, its dQ handed to the
    writer (``hand_dq``: DQ 5) and tile i's P^T and dS^T stored. ``SCHED`` 2: tile i - 1's
    dQ product only then (issued and handed on after tile i's P^T and dS^T are stored: at D
    128 its accumulators beside them and dK's and dV's spilled). ``TWO``: dQ handed to two
    writers by tile parity (``give_dq``). ``SCHED`` 4: as 2 with P^T in registers (``p``, as
    the pair's ``PIPE`` 3: two buffers of shared memory instead of four, so that three ring
    stages fit at D 128). ``SCHED`` 2, 4: a tile's P^T / dS^T is stored once both
    warpgroups' dQ of the tile two back (the buffer's last readers) completed
    (``free_buffer``: the other warpgroup's may run after its arrival on the tile before).
    ``NDS`` 3 (``SCHED`` 4): three dS^T buffers in turn instead (their barriers
    ``bars[0, STAGES + b]``): the other warpgroup's dQ three tiles back completed before its
    arrival on the tile before, and no "free" wait is needed. ``SCHED`` 6 (D 64: dQ's
    accumulators fit beside the rest): as 4, with tile i - 1's dQ issued with its dV and
    dK (as 1), so that it runs beside tile i's probabilities, and handed on after tile i's
    P^T and dS^T (each warpgroup's dQ of a buffer completes before its arrival on the next
    tile's, which the other waits for before storing again: no "free" wait with two or
    three buffers). ``NW``: the writers (``TWO``), whose tiles come in turn. ``SPLIT``,
    ``L2``: ``grads_t``'s; ``PFIRST``: P^T computed once S^T is done, dS^T once dP^T is
    (``grads_t``'s ``WAIT``). The walk over the tiles begins at its item ``start``
    (``ROT``: ``walk_start``, ``rotated``); ``FINISH``: a tile's dQ where this key block has
    its last turn goes to dq (``out_dq``). ``PERSIST``: one work item of a persistent
    block, after ``g0`` tiles of its others: K and V in buffer ``kb`` (landed:
    ``turn[kb]``'s phase ``kph``; freed once its products are done: ``turn[2 + kb]``), the
    ring, the dS^T buffers, dq_s's parity and the writers going on from the state given
    (st, ph, pb, hph, wph, fb; returned for the next item). Then dK, dV stored."""
    NQ = D // WG  # dQ's columns in this warpgroup, from c0
    s = kaio.local(f32, (BM // 8, 4))  # S^T, then P^T
    dp = kaio.local(f32, (BM // 8, 4))  # dP^T, then dS^T
    dqa = kaio.local(f32, (NQ // 8, 4))
    dqo = kaio.local(f32, (NQ // 8, 4))  # FINISH: the other turns' sum (fetch_others)
    p = kaio.local(u32, (BM // 16, 4))  # SCHED 4, 6: P^T's A fragments
    af = kaio.local(u32, (D // 16, 4))  # (unused: issue_front's AREG 0)
    dka = kaio.local(f32, (D // 8, 4))
    dva = kaio.local(f32, (D // 8, 4))
    zero_acc(dka, D)
    zero_acc(dva, D)
    lane = lt % 32
    kr = 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)  # pt_s's rows kr, kr + 8
    key0 = k0 + kr  # the rows' keys
    c0 = i32(wg) * NQ
    FULL = STAGES + 2 * WG  # dq_s's barriers (init_barriers with DQ 5, NBUF 2)
    ROW = 0 if NDS == 3 else 1  # the dS^T buffers' barriers' row
    total = group * kaio.max(n_tiles - first, 0)
    handed = i32(0)
    kc = kb * (D // 64)  # K's and V's first 64-column block
    kaio.mbarrier_wait(turn, kb, kph)  # K and V landed
    at_first = first_head * sq
    t, at0 = walk(start, first, n_tiles, at_first, sq, ROT)
    BK = 64 * WG
    q = 16 * i32(lt // 32) + i32(lane // 4)  # this thread's dQ rows in a tile: q, q + 8
    if total > 0:
        kaio.mbarrier_wait(bars, (0, st), ph)
        kaio.wgmma_fence()
        issue_front(s, dp, k_s, v_s, q_s, do_s, af, af, st, wg, D, 0, DT, kc)
        kaio.wgmma_wait(0)
        grads_t(s, dp, stats, st, lse, delta, at0, key0, t * BM, sq, sk, causal, scale_log2,
                lane, BM, TSTATS, SPLIT, L2)  # fmt: skip
        hand_pt(pt_s, pb, p, s, dp, bars, STAGES, kr, lane, lt, BM, SCHED, DT, ROW)
        ps = st  # tile i - 1's stage
        pt, pat0, item = t, at0, start  # tile i - 1's, and its item of the walk
        st, ph = next_stage(st, ph, STAGES)
        t, at0 = walk_next(t, at0, first, n_tiles, sq, at_first, group, ROT)
        for _i in range(1, total):
            kaio.mbarrier_wait(bars, (0, st), ph)
            kaio.wgmma_fence()
            issue_front(s, dp, k_s, v_s, q_s, do_s, af, af, st, wg, D, 0, DT, kc)
            kaio.mbarrier_wait(bars, (ROW, STAGES + pb), hph)  # tile i - 1's, every warp
            issue_back_late(dka, dva, dqa, p, pt_s, pb, k_s, q_s, do_s, ps, wg, D, BM, NQ, WG,
                            SCHED, DT, kc)  # fmt: skip
            BACK = 3 if SCHED % 5 == 1 else 2  # the back products' groups
            kaio.wgmma_wait(BACK + PFIRST)  # S^T, dP^T done (SCHED 4, 6: with dV's A, p, in
            # flight: p is packed again only after the wait for all; PFIRST: S^T only)
            grads_t(s, dp, stats, st, lse, delta, at0, key0, t * BM, sq, sk, causal, scale_log2,
                    lane, BM, TSTATS, SPLIT, L2, BACK if PFIRST else -1)  # fmt: skip
            kaio.wgmma_wait(0)  # tile i - 1's products done: its stage (and dQ)
            release(bars, ps, lt)
            if SCHED == 1:
                wph, handed, fb = dq_out(dq_s, bars, dq_acc, sem, dq, dqa, dqo, x, nkb, pt, pat0,
                                         item, total, q, sq, n_tiles, g0 + _i > 1, c0, lane, lt,
                                         handed, wph, fb, scale, 0, FULL, D, BM, BK, NQ, TWO, NW,
                                         DT, FINISH, DONE)  # fmt: skip
            qb = pb  # tile i - 1's buffers
            pb, hph = next_stage(pb, hph, NDS)  # (last read by tile i - NDS's products)
            if SCHED >= 2 and SCHED < 6 and NDS == 2 and _i > 1:  # (the other wg's
                kaio.mbarrier_wait(bars, (0, STAGES + pb), hph ^ 1)  # dQ among them)
            hand_pt(pt_s, pb, p, s, dp, bars, STAGES, kr, lane, lt, BM, SCHED, DT, ROW)
            if SCHED == 6:  # tile i - 1's dQ (done with dV, dK) once tile i's dS^T is out
                wph, handed, fb = dq_out(dq_s, bars, dq_acc, sem, dq, dqa, dqo, x, nkb, pt, pat0,
                                         item, total, q, sq, n_tiles, g0 + _i > 1, c0, lane, lt,
                                         handed, wph, fb, scale, 0, FULL, D, BM, BK, NQ, TWO, NW,
                                         DT, FINISH, DONE)  # fmt: skip
            elif SCHED >= 2:  # tile i - 1's dQ now: s, dp are stored (dqa and they never coexist)
                kaio.wgmma_fence()
                issue_dq(dqa, pt_s, qb, k_s, wg, D, NQ, WG, 5, DT, kc)
                wph, handed, fb = dq_out(dq_s, bars, dq_acc, sem, dq, dqa, dqo, x, nkb, pt, pat0,
                                         item, total, q, sq, n_tiles, g0 + _i > 1, c0, lane, lt,
                                         handed, wph, fb, scale, STAGES + qb, FULL, D, BM, BK,
                                         NQ, TWO, NW, DT, FINISH, 0,
                                         FREE if NDS == 2 else 0)  # fmt: skip
            ps = st
            pt, pat0 = t, at0
            item += 1
            if item == total:
                item = 0
            st, ph = next_stage(st, ph, STAGES)
            t, at0 = walk_next(t, at0, first, n_tiles, sq, at_first, group, ROT)
        kaio.mbarrier_wait(bars, (ROW, STAGES + pb), hph)
        kaio.wgmma_fence()
        last = 1 if SCHED < 4 else 6  # (1: P^T from pt_s; 6: from p; both with dQ)
        issue_back_late(dka, dva, dqa, p, pt_s, pb, k_s, q_s, do_s, ps, wg, D, BM, NQ, WG,
                        last, DT, kc)  # fmt: skip
        wph, handed, fb = dq_out(dq_s, bars, dq_acc, sem, dq, dqa, dqo, x, nkb, pt, pat0, item,
                                 total, q, sq, n_tiles, g0 + total > 1, c0, lane, lt, handed, wph,
                                 fb, scale, ps, FULL, D, BM, BK, NQ, TWO, NW, DT, FINISH, 0,
                                 RELEASE)  # fmt: skip
        pb, hph = next_stage(pb, hph, NDS)  # (the next item's first tile: the next buffer)
    if PERSIST:  # K and V read for the last time: the producer may load an item after next's
        kaio.sync_warp()
        if lt % 32 == 0:
            kaio.mbarrier_arrive(turn, 2 + kb)
    store_tile(dk, dka, kvh * sk * D, key0, sk, scale, lane, D, DT)
    store_tile(dv, dva, kvh * sk * D, key0, sk, 1.0, lane, D, DT)
    return st, ph, pb, hph, wph, fb


@kaio.gpu_func
def interleaved(bx: i32, by: i32, nkb: i32, hg: i32, ny: i32) -> tuple[i32, i32]:
    """(key block, K/V head) of block (bx, by) of a (nkb, heads) grid whose launch order
    (linear: bx fastest; ``ny`` heads) takes groups of ``hg`` heads' key blocks in turn: key
    block 0 of each head of the group, then key block 1, ... Consecutive key blocks of a head then
    start ``hg`` blocks apart (a block still waits only for lower linear indices: key block
    x - 1 of its head comes before it), and the blocks running at once still cover few
    heads (their Q, dO and dQ sums in L2)."""
    lin = by * nkb + bx
    g = lin // (hg * nkb)
    hk = kaio.min(hg, ny - g * hg)  # (the last group: the heads left)
    r = lin - g * hg * nkb
    return r // hk, g * hg + r % hk


@kaio.gpu_func
def work_item(
    b: i32, nkb: i32, nkvh: i32, hg: i32, rot: i32, heads: i32, group: i32, sq: i32,
    causal: i32, BM: kaio.constexpr, BK: kaio.constexpr,
) -> tuple[i32, i32, i32, i32, i32, i32]:  # fmt: skip
    """(key block x, K/V head, first query head, first query tile, the query tiles, the
    walk's first item) of block b (linear index; the launch order of ``interleaved`` over
    the nkb key blocks of the ``nkvh`` K/V heads, reversed where causal without ``rot``:
    module docstring)."""
    x, kvh = interleaved(b % nkb, b // nkb, nkb, hg, nkvh)  # hg K/V heads' key blocks in turn
    if causal != 0 and rot == 0:
        x = nkb - 1 - x  # the last key blocks first: they add to each tile before the rest
    first_head, first, n_tiles = key_block_queries(kvh, x * BK, heads, group, sq, causal, BM)
    start = i32(0)  # the walk's first item
    if rot != 0 and causal == 0:
        start = x * (group * n_tiles) // nkb
    return x, kvh, first_head, first, n_tiles, start


@kaio.gpu_func
def full_bar(fb: i32, FULL: kaio.constexpr) -> i32:
    """The "dQ in dq_s" barrier (``bars[1, .]``) of writer ``fb``: the dS^T barriers of
    buffers 2, 3 (unused by ``consume_late``), the one-writer "full"
    (unused with ``TWO``), then those past the "dq_s free" one (writers 3 to 5)."""
    return FULL - 2 + fb + i32(fb >= 3)


@kaio.gpu_func
def next_writer(fb: i32, NW: kaio.constexpr) -> i32:
    """The writer of the next tile after writer ``fb``'s (``NW`` of them, in turn)."""
    if NW == 2:
        return fb ^ 1
    return (fb + 1) % NW


@kaio.gpu_func
def free_buffer(bars: u64[:, :], b: i32, lt: u32):
    """This warp's dQ product of the P^T / dS^T buffer whose barriers are ``bars[., b]`` is
    done (waited for): its arrival on ``bars[0, b]``, which the consumer warps wait on before
    they store the tile two further on there (the other warpgroup's dQ reads every row)."""
    kaio.sync_warp()
    if lt % 32 == 0:
        kaio.mbarrier_arrive(bars, (0, b))


@kaio.gpu_func
def give_dq(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], dqa: f32[:, :], sq: i32, c0: i32,
    lane: u32, lt: u32, after: bool_, wph: u32, fb: i32, FULL: kaio.constexpr,
    D: kaio.constexpr, NQ: kaio.constexpr, TWO: kaio.constexpr,
) -> u32:  # fmt: skip
    """A tile's dQ to dq_s for the writer (``hand_dq`` with DQ 5), or with ``TWO`` for the
    writer of tiles of parity ``fb``: once dq_s is free (``bars[1, FULL + 1]``, ``after`` a
    first tile; parity ``wph``), stored in fragment order, then this warp's arrival on
    ``bars[1, full_bar(fb)]``.
    Returns the next parity."""
    if TWO:
        if after:
            kaio.mbarrier_wait(bars, (1, FULL + 1), wph)
            wph ^= 1
        store_dq_frags(dq_s, dqa, c0, lt, NQ)
        release(bars, full_bar(fb, FULL), lt)
        return wph
    return hand_dq(dq_s, bars, dq_acc, dqa, 0, 0, sq, c0, lane, lt, after, wph, FULL, D, NQ, 5)


@kaio.gpu_func
def last_turn(x: i32, nkb: i32, t: i32, item: i32, total: i32, BM: kaio.constexpr,
              BK: kaio.constexpr) -> i32:  # fmt: skip
    """Whether key block x finishes the tile of item ``item`` of its rotated walk (tile t;
    ``FINISH``, not causal: every key block adds to every tile): its turn there is the
    last."""
    return i32(turn_rank(x, nkb, t, item, total, 0, 1, BM, BK) == nkb - 1)


# What ``dq_out`` does once the tile's dQ product is awaited (its ``THEN``): nothing, arrive
# on the P^T / dS^T buffer's "free" barrier (``free_buffer``) or release the ring stage
# (``release``); its ``LEFT``: the wgmma groups left in flight by that wait (``DONE``: no
# wait, the product is done).
FREE, RELEASE = 1, 2
DONE = -1


@kaio.gpu_func
def dq_out(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], sem: i32[:], dq: DT[:], dqa: f32[:, :],
    dqo: f32[:, :], x: i32, nkb: i32, t: i32, at0: i32, item: i32, total: i32, q: i32, sq: i32,
    n_tiles: i32, after: bool_, c0: i32, lane: u32, lt: u32, handed: i32, wph: u32, fb: i32,
    scale: f32, b: i32, FULL: kaio.constexpr, D: kaio.constexpr, BM: kaio.constexpr,
    BK: kaio.constexpr, NQ: kaio.constexpr, TWO: kaio.constexpr, NW: kaio.constexpr,
    DT: kaio.constexpr, FINISH: kaio.constexpr, LEFT: kaio.constexpr, THEN: kaio.constexpr = 0,
) -> tuple[u32, i32, i32]:  # fmt: skip
    """Query tile t's dQ share (dqa; head at row at0, item ``item`` of key block x's walk)
    out of the consumers: ``fetch_others`` (``FINISH``: the wait for the other turns issued
    while the tile's dQ product runs), then the product awaited (``wgmma_wait(LEFT)``; not
    with ``DONE``) and ``THEN`` (``FREE``: ``free_buffer`` of buffer barrier b,
    ``RELEASE``: ``release`` of ring stage b), then ``out_dq`` (``after`` a first tile) and
    the next tile's writer. Returns (the dq_s parity, handed, the next writer)."""
    fin = fetch_others(dqo, dq_acc, sem, x, nkb, t, at0, item, total, sq, n_tiles, c0, lt,
                       FINISH, D, BM, BK, NQ)  # fmt: skip
    if LEFT != DONE:
        kaio.wgmma_wait(LEFT)
    if THEN == FREE:
        free_buffer(bars, b, lt)
    elif THEN == RELEASE:
        release(bars, b, lt)
    wph, handed = out_dq(dq_s, bars, dq_acc, sem, dq, dqa, dqo, fin, t, at0, q, sq, n_tiles,
                         nkb, after, c0, lane, lt, handed, wph, fb, scale, FULL, D, BM, NQ, TWO,
                         DT, FINISH)  # fmt: skip
    return wph, handed, next_writer(fb, NW)


@kaio.gpu_func
def out_dq(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], sem: i32[:], dq: DT[:], dqa: f32[:, :],
    dqo: f32[:, :], fin: i32, t: i32, at0: i32, q: i32, sq: i32, n_tiles: i32, nkb: i32,
    after: bool_, c0: i32, lane: u32, lt: u32, handed: i32, wph: u32, fb: i32, scale: f32,
    FULL: kaio.constexpr, D: kaio.constexpr, BM: kaio.constexpr, NQ: kaio.constexpr,
    TWO: kaio.constexpr, DT: kaio.constexpr, FINISH: kaio.constexpr,
) -> tuple[u32, i32]:  # fmt: skip
    """Query tile t's dQ share (head at row at0; this thread's rows q, q + 8 of it) out of
    dqa: with ``FINISH``, where this key block has the tile's last turn (``fin``:
    ``fetch_others``, whose sum of the other turns is in dqo), ``finish_dq``, else to the
    writers (``give_dq``, after the dq_s of the last tile ``handed`` to them is free);
    without, to the writers (``after`` a first tile). Returns (the dq_s parity, handed)."""
    if FINISH:
        if fin != 0:
            finish_dq(dq, dqa, dqo, dq_acc, t, at0, t * BM + q, sq, n_tiles, nkb - 1, c0, lane,
                      lt, scale, D, BM, NQ, DT)  # fmt: skip
        else:
            wph = give_dq(dq_s, bars, dq_acc, dqa, sq, c0, lane, lt, handed != 0, wph, fb, FULL,
                          D, NQ, TWO)  # fmt: skip
            handed = 1
    else:
        wph = give_dq(dq_s, bars, dq_acc, dqa, sq, c0, lane, lt, after, wph, fb, FULL, D, NQ,
                      TWO)  # fmt: skip
    return wph, handed


@kaio.gpu_func
def fetch_others(
    dqo: f32[:, :], dq_acc: f32[:], sem: i32[:], x: i32, nkb: i32, t: i32, at0: i32,
    item: i32, total: i32, sq: i32, n_tiles: i32, c0: i32, lt: u32, FINISH: kaio.constexpr,
    D: kaio.constexpr, BM: kaio.constexpr, BK: kaio.constexpr, NQ: kaio.constexpr,
) -> i32:  # fmt: skip
    """``FINISH``: whether key block x finishes query tile t (head at row at0, item ``item``
    of its walk: ``last_turn``), and then the wait until the turns before its own have
    added theirs (the tile's semaphore), issued while the tile's dQ product runs; at D 64
    also this thread's fragment of their sum (``others_sum``) in dqo (at D 128 its
    registers beside the product's spill: ``finish_dq`` reads it). Else 0."""
    fin = i32(0)
    if FINISH:
        fin = last_turn(x, nkb, t, item, total, BM, BK)
        if fin != 0:
            before = nkb - 1
            if before > 0:
                kaio.wait_eq(sem, at0 // sq * n_tiles + t, before)
            if D == 64:
                for n in kaio.static_range(NQ // 8):
                    for e in kaio.static_range(4):
                        dqo[n, e] = 0.0
                others_sum(dqo, dq_acc, t, at0, sq, n_tiles, before, c0, lt, D, BM, NQ)
    return fin


@kaio.gpu_func
def others_sum(acc: f32[:, :], dq_acc: f32[:], t: i32, at0: i32, sq: i32, n_tiles: i32,
               before: i32, c0: i32, lt: u32, D: kaio.constexpr, BM: kaio.constexpr,
               NQ: kaio.constexpr):  # fmt: skip
    """acc += this thread's fragment of query tile t's sum in ``dq_acc`` (head at row at0;
    fragment order: ``store_dq_frags``), where ``before`` turns added to it."""
    if before > 0:
        tile = at0 // sq * n_tiles + t
        for n in kaio.static_range(NQ // 8):
            v = kaio.local(f32, 4)
            kaio.load_vector(v, dq_acc, tile * BM * D + ((c0 // 8 + n) * 128 + i32(lt)) * 4)
            for e in kaio.static_range(4):
                acc[n, e] += v[e]


@kaio.gpu_func
def finish_dq(
    dq: DT[:], dqa: f32[:, :], dqo: f32[:, :], dq_acc: f32[:], t: i32, at0: i32, q: i32,
    sq: i32, n_tiles: i32, before: i32, c0: i32, lane: u32, lt: u32, scale: f32,
    D: kaio.constexpr, BM: kaio.constexpr, NQ: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The last turn on query tile t (``before`` turns before it, their sum in dqo at D 64,
    read now at D 128: ``fetch_others``): their sum plus this thread's own share (dqa)
    times ``scale``, rounded to DT, to dq's rows q, q + 8 of the head at row at0 (those
    below sq), the warpgroup's columns from c0: the tile needs no reduction and no
    ``dq_convert_rows``."""
    if D == 64:
        for n in kaio.static_range(NQ // 8):
            for e in kaio.static_range(4):
                dqa[n, e] += dqo[n, e]
    else:
        others_sum(dqa, dq_acc, t, at0, sq, n_tiles, before, c0, lt, D, BM, NQ)
    for h in kaio.static_range(2):
        if q + 8 * h < sq:
            store_pairs(dq, (at0 + q + 8 * h) * D + c0, dqa, h, scale, lane, NQ, DT)


@kaio.gpu_func
def write_dq_two(
    dq_s: f32[:, :], bars: u64[:, :], dq_acc: f32[:], sem: i32[:], w: i32, first_head: i32,
    group: i32, first: i32, n_tiles: i32, sq: i32, x: i32, nkb: i32, causal: i32, start: i32,
    FULL: kaio.constexpr, D: kaio.constexpr, BM: kaio.constexpr, BK: kaio.constexpr,
    ORDER: kaio.constexpr = 1, NW: kaio.constexpr = 2, ROT: kaio.constexpr = 0,
    FINISH: kaio.constexpr = 0, g0: i32 = 0, ph: u32 = 0,
) -> u32:  # fmt: skip
    """``EARLY`` 3: writer ``w`` (0, 1: the first lanes of the producer warpgroup's warps 1
    and 2) of the tiles of parity w of the consumers' walk (``give_dq``'s ``TWO``): for each,
    the last one's turn passed on (its reduction complete), the turn on this one awaited,
    then once its dQ is in dq_s (``bars[1, full_bar(w)]``) one bulk reduction, its reads
    waited for, and dq_s freed (three arrivals on ``bars[1, FULL + 1]``, whose count is the
    three writer warps'). Each tile's addition then takes one writer half the tiles' time.
    ``ORDER`` (the kernel's; for timing what the order costs): 1 as above, 0 no semaphore
    (the additions in any order: not deterministic), -1 no additions either (dQ wrong).
    ``NW``: the writers (the first lanes of warps 1 .. 3, then lane 16 of them), tile i
    writer i % NW's (``NW`` 3: each writer's wait for its last reduction to complete and
    pass the turn on spread over three tiles). The first turn on a tile (``ORDER`` 1) stores
    its share, so that ``dq_acc`` needs no zeros before (``stores_first``). The walk begins at
    its item ``start``, the turns ``turn_rank``'s (``ROT``: ``rotated``); ``FINISH``: the
    tiles whose last turn is this key block's are the consumers' (``out_dq``), not a
    writer's. A persistent block's work item after ``g0`` tiles of its others: tile i is
    writer (g0 + i) % NW's, its "full" barrier's parity ``ph`` (returned: the next)."""
    at_first = first_head * sq
    t, at0 = walk(start, first, n_tiles, at_first, sq, ROT)
    item = start
    last = i32(0)
    pending = i32(0)  # whether the turn on tile ``last`` is still to pass on
    total = group * kaio.max(n_tiles - first, 0)
    for _i in range(total):
        mine = (g0 + _i) % NW == w
        if FINISH:  # (the tiles this key block finishes: the consumers')
            mine = mine and last_turn(x, nkb, t, item, total, BM, BK) == 0
        if mine:
            tile = at0 // sq * n_tiles + t
            rank = turn_rank(x, nkb, t, item, total, causal, ROT, BM, BK)
            if ORDER > 0:
                if pending != 0:
                    pass_turn(sem, last)
                kaio.wait_eq(sem, tile, rank)
            kaio.mbarrier_wait(bars, (1, full_bar(w, FULL)), ph)
            ph ^= 1
            if ORDER > 0 and rank == 0:  # the tile's first share: stored (no zeros before)
                kaio.bulk_store(dq_acc, tile * BM * D, dq_s, (0, 0), BM * D * 4)
            elif ORDER >= 0:
                kaio.bulk_reduce_add(dq_acc, tile * BM * D, dq_s, (0, 0), BM * D * 4)
            if ORDER >= 0:
                kaio.bulk_commit()
                kaio.bulk_wait_read(0)  # (dq_s read: free for the consumers' next tile)
            for _a in kaio.static_range(3):
                kaio.mbarrier_arrive(bars, (1, FULL + 1))
            last = tile
            pending = 1
        t, at0 = walk_next(t, at0, first, n_tiles, sq, at_first, group, ROT)
        item += 1
        if item == total:
            item = 0
    if ORDER > 0 and pending != 0:
        pass_turn(sem, last)
    if ORDER == 0:
        kaio.bulk_wait(0)
    return ph


@kaio.gpu_func
def issue_back_late(
    dka: f32[:, :], dva: f32[:, :], dqa: f32[:, :], p: u32[:, :], pt_s: DT[:, :, :], b: i32,
    k_s: DT[:, :, :], q_s: DT[:, :, :, :], do_s: DT[:, :, :, :], st: i32, wg: u32,
    D: kaio.constexpr, BM: kaio.constexpr, NQ: kaio.constexpr, WG: kaio.constexpr,
    SCHED: kaio.constexpr, DT: kaio.constexpr, kc: i32 = 0,
):  # fmt: skip
    """Issue a tile's dV += P^T dO (P^T: this warpgroup's rows of ``pt_s[2 + b]``; ``SCHED``
    4, 6: the registers ``p``), dK += dS^T Q (``pt_s[b]``; dO, Q in stage st) and (``SCHED``
    1, 6) dQ = dS K (every row of ``pt_s[b]``, this warpgroup's NQ columns of K from its
    64-column block ``kc``), each its own group."""
    if SCHED >= 4:
        issue_pv(dva, p, do_s, st, BM, DT)
    else:
        issue_pt(dva, pt_s, 2 + b, wg, do_s, st, BM, DT)
    issue_pt(dka, pt_s, b, wg, q_s, st, BM, DT)
    if SCHED % 5 == 1:  # (1, 6)
        issue_dq(dqa, pt_s, b, k_s, wg, D, NQ, WG, 5, DT, kc)


@kaio.gpu_func
def hand_pt(
    pt_s: DT[:, :, :], b: i32, p: u32[:, :], s: f32[:, :], dp: f32[:, :], bars: u64[:, :],
    base: i32, kr: i32, lane: u32, lt: u32, BM: kaio.constexpr, SCHED: kaio.constexpr,
    DT: kaio.constexpr, ROW: kaio.constexpr = 1,
):  # fmt: skip
    """A tile's P^T (``s``) and dS^T (``dp``) to ``pt_s[2 + b]`` (``SCHED`` 4, 6: packed into
    the registers ``p``) and ``pt_s[b]`` (rows kr, kr + 8), fenced for the tensor cores, then
    this warp's arrival on ``bars[ROW, base + b]``."""
    if SCHED >= 4:
        pack_p(p, s, BM, DT)
    else:
        store_ds(pt_s, 2 + b, s, kr, lane, BM, DT)
    store_ds(pt_s, b, dp, kr, lane, BM, DT)
    if ROW == 1:
        release(bars, base + b, lt)
    else:
        kaio.fence_proxy_async()
        kaio.sync_warp()
        if lt % 32 == 0:
            kaio.mbarrier_arrive(bars, (ROW, base + b))


@kaio.gpu_kernel(fastmath=True)  # ex2.approx.ftz: one instruction an exponential
def attention_bwd_fused_ordered(
    tk: kaio.tensormap, tv: kaio.tensormap, tq: kaio.tensormap, tdo: kaio.tensormap,
    tl: kaio.tensormap, td: kaio.tensormap, lse: f32[:], delta: f32[:], dk: DT[:], dv: DT[:],
    dq_acc: f32[:], sem: i32[:], dq: DT[:], sq: i32, sk: i32, heads: i32, group: i32, nkvh: i32,
    scale_log2: f32, scale: f32, causal: i32, hg: i32, D: kaio.constexpr,
    BM: kaio.constexpr, WG: kaio.constexpr, STAGES: kaio.constexpr, PIPE: kaio.constexpr,
    AREG: kaio.constexpr, TSTATS: kaio.constexpr,
    REGS: kaio.constexpr, DT: kaio.constexpr, DQ: kaio.constexpr, LATE: kaio.constexpr,
    EARLY: kaio.constexpr, SCHED: kaio.constexpr, ORDER: kaio.constexpr, NW: kaio.constexpr,
    NDS: kaio.constexpr, SPLIT: kaio.constexpr, L2: kaio.constexpr, PFIRST: kaio.constexpr,
    ROT: kaio.constexpr, FINISH: kaio.constexpr, PERSIST: kaio.constexpr,
):  # fmt: skip
    """dk, dv of the ``64 * WG`` keys of key block x (``block_idx_x`` through
    ``interleaved``, reversed where causal: module docstring) and K/V head block y, summed
    over its group's query heads, and their share of dQ / scale added to ``dq_acc`` (f32,
    whole 64-row tiles in fragment order; zeros before unless ``stores_first``: the first
    share stored) in the fixed order of the
    semaphores ``sem`` (i32 [B * H * n_tiles], zeros before). The arguments as
    ``_attention_hopper_bwd.attention_bwd_dkdv_wgmma``'s (its ``DQ`` 5 constexprs: PIPE 0,
    BM 64); ``EARLY``: ``write_dq_ordered``'s;
    ``SCHED`` 0: the consumers of ``_attention_hopper_bwd`` (``consume_dkdv``, with LATE),
    1, 2, 4, 6: ``consume_late`` (four P^T and dS^T buffers; 4, 6: ``NDS``, dS^T); ``ORDER``:
    ``write_dq_two``'s (1: the fixed order); ``NW``: its writers (2 to 6, with ``EARLY`` 3);
    ``hg``: ``interleaved``'s (1: block (x, y) is key block x of K/V head y); ``ROT``
    (``rotated``; ``hg`` 1): not causal, key block x's walk begins at item x W / nkb of its
    W; causal, the key blocks launched in increasing order (the longest walks first);
    either way a block may wait for a later one of its head (all of them must fit on the
    GPU at once: the launch's ``rotated``); ``FINISH`` (with ``ROT``, not causal):
    the last turn on each tile stores its dQ to ``dq`` (``finish_dq``), no ``dq_convert_rows``
    after the kernel; ``PERSIST`` (``SCHED`` 4, ``EARLY`` 3,
    ``NDS`` 3, neither ``ROT`` nor ``FINISH``): a persistent block (a 1-d grid of at
    most one block a multiprocessor) takes the work items of the launch order from a
    counter (``take_item``), one after the other (a block whose items are short takes more
    of them), K and V in two buffers (the next item's loaded while one runs), the ring, the
    dS^T buffers and the dQ writers going on across them (an item waits only for items
    taken before it: those run or ran); ``NDS``:
    ``consume_late``'s dS^T buffers (2, or 3 with ``SCHED`` 4, 6); ``SPLIT``, ``L2``,
    ``PFIRST``: ``grads_t``'s (with ``SCHED`` 1 to 6; ``L2`` 1: ``lse`` and its TMA map hold
    ``lse_log2(lse)``, ``prep``)."""
    NBUF = 3 if LATE == 2 else 2  # the dS^T buffers of SCHED 0 (and their barriers)
    NPT = 4 if SCHED and SCHED < 4 else NDS if SCHED else NBUF  # P^T, dS^T (0, 4: dS^T)
    BK = 64 * WG
    TILE = BK * 64 * 2  # one K or V column block, resp. P^T or dS^T buffer (64 queries)
    RING = 2 * STAGES * BM * D * 2  # Q and dO: the ring
    NB = STAGES + NBUF * WG + 2 + (NW - 3 if NW > 3 else 0)  # (writers 3 .. NW - 1's "full")
    KC = (1 + PERSIST) * D // 64  # K's (and V's) 64-column blocks: PERSIST, two buffers
    k_s = kaio.shared_dynamic(DT, (KC, BK, 64), 0)
    v_s = kaio.shared_dynamic(DT, (KC, BK, 64), KC * TILE)
    KV = 2 * KC * TILE
    q_s = kaio.shared_dynamic(DT, (STAGES, D // 64, BM, 64), KV)
    do_s = kaio.shared_dynamic(DT, (STAGES, D // 64, BM, 64), KV + RING // 2)
    ds_s = kaio.shared_dynamic(DT, (NPT, BK, 64), KV + RING)
    DQS = KV + RING + NPT * TILE
    dq_s = kaio.shared_dynamic(f32, (BM * D // 4, 4), DQS)  # fragment order (store_dq_frags)
    stats = kaio.shared_dynamic(f32, (2, STAGES, BM), DQS + BM * (D + 4) * 4)
    BARS = DQS + BM * (D + 4) * 4 + 2 * STAGES * BM * 4
    bars = kaio.shared_dynamic(u64, (2, NB), BARS)
    turn = kaio.shared_dynamic(u64, (2 + 2 * PERSIST,), BARS + 16 * NB)  # (PERSIST: K/V free)
    taken = kaio.shared_dynamic(i32, (2,), BARS + 16 * NB + 8 * (2 + 2 * PERSIST))  # PERSIST's
    nkb = (sk + BK - 1) // BK
    blk = i32(kaio.block_idx_y() * kaio.grid_dim_x() + kaio.block_idx_x())
    # PERSIST: a 1-d grid, the items taken from a counter, sem's entry past the tiles' (at
    # most all of them, and the index past them that says there are no more)
    counter = nkvh * group * ((sq + BM - 1) // BM)
    items = 1 if PERSIST == 0 else nkb * nkvh + 1

    t, wg, lt = thread_roles(WG)
    if t == 0:
        init_barriers(bars, turn, WG, STAGES, DQ, NBUF)
        for j in kaio.static_range(NW - 3 if NW > 3 else 0):  # writers 3 .. NW - 1's "full"
            kaio.mbarrier_init(bars, (1, STAGES + NBUF * WG + 2 + j), 4 * WG)
        if SCHED >= 2:  # the dS^T buffers' "free" (free_buffer), resp. NDS 3's "full"
            for b in kaio.static_range(NDS):
                kaio.mbarrier_init(bars, (0, STAGES + b), 4 * WG)
        if PERSIST:  # K and V's second buffer landed; either free (an arrival a consumer warp)
            kaio.mbarrier_init(turn, 1, 1)
            for b in kaio.static_range(2):  # (and the writers', once they read the item)
                kaio.mbarrier_init(turn, 2 + b, 4 * WG + NW)
        kaio.fence_proxy_async()
    kaio.sync_threads()
    # launched while prep finishes (programmatic dependent launch: its arrays are read after
    # this wait), and dq_convert_behind may launch once every block has begun
    kaio.grid_dependency_wait()
    kaio.launch_dependents()
    x, kvh, first_head, first, n_tiles, start = work_item(blk, nkb, nkvh, hg, ROT, heads, group,
                                                          sq, causal, BM, BK)  # fmt: skip
    if wg < WG:  # the consumers
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        if SCHED:
            st, ph, pb, hph, wph, fb, g0 = i32(0), u32(0), i32(0), u32(0), u32(0), i32(0), i32(0)
            for j in range(items):  # (PERSIST 0: one, unrolled)
                if PERSIST:
                    b = taken_item(turn, taken, j)
                    if b >= nkb * nkvh:
                        break
                    x, kvh, first_head, first, n_tiles, start = work_item(
                        b, nkb, nkvh, hg, ROT, heads, group, sq, causal, BM, BK
                    )  # fmt: skip
                st, ph, pb, hph, wph, fb = consume_late(
                    k_s, v_s, q_s, do_s, stats, bars, turn, lse, delta, dk, dv, ds_s, dq_s,
                    dq_acc, sem, dq, wg, lt, kvh, first_head, group, first, n_tiles, start,
                    x, nkb, x * BK, sq, sk, causal, scale_log2, scale, D, BM, WG, STAGES,
                    TSTATS, SCHED, EARLY == 3, DT, NW, NDS, SPLIT, L2, PFIRST, ROT, FINISH,
                    PERSIST, j % 2, u32(j // 2 % 2), g0, st, ph, pb, hph, wph, fb,
                )  # fmt: skip
                g0 += item_stages(group, first, n_tiles)
        else:
            consume_dkdv(k_s, v_s, q_s, do_s, stats, bars, turn, lse, delta, dk, dv, ds_s, dq_s,
                         dq_acc, wg, lt, kvh, first_head, group, first, n_tiles, x * BK, sq, sk,
                         causal, scale_log2, scale, D, BM, WG, STAGES, PIPE, AREG, TSTATS, DQ,
                         LATE, DT)  # fmt: skip
    else:  # the producer warpgroup: its first thread loads, warps 1 to 3 add dQ
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        w = i32(lt // 32) - 1 + 3 * i32(lt % 32 // 16)  # (writers 3-5: lane 16 of warps 1-3)
        if EARLY == 3 and lt % 16 == 0 and lt >= 32 and w < NW:
            ph, g0 = u32(0), i32(0)
            for j in range(items):  # (PERSIST 0: one, unrolled)
                if PERSIST:  # (read: the producer may take the item after next in its place)
                    b = taken_item(turn, taken, j)
                    kaio.mbarrier_arrive(turn, 2 + j % 2)
                    if b >= nkb * nkvh:
                        break
                    x, kvh, first_head, first, n_tiles, start = work_item(
                        b, nkb, nkvh, hg, ROT, heads, group, sq, causal, BM, BK
                    )  # fmt: skip
                ph = write_dq_two(dq_s, bars, dq_acc, sem, w, first_head, group, first,
                                  n_tiles, sq, x, nkb, causal, start, STAGES + NBUF * WG, D,
                                  BM, BK, ORDER, NW, ROT, FINISH, g0, ph)  # fmt: skip
                g0 += item_stages(group, first, n_tiles)
        elif lt == 0:
            st, ph, g0 = i32(0), u32(0), i32(0)
            for j in range(items):  # (PERSIST 0: one, unrolled)
                kv = -1
                if PERSIST:  # (buffer j % 2 again once free: take_item waits)
                    b = take_item(turn, taken, sem, counter, j, -1 if j < 2 else (j - 2) // 2 % 2,
                                  nkb * nkvh)  # fmt: skip
                    if b >= nkb * nkvh:
                        break
                    x, kvh, first_head, first, n_tiles, start = work_item(
                        b, nkb, nkvh, hg, ROT, heads, group, sq, causal, BM, BK
                    )  # fmt: skip
                st, ph = produce(k_s, v_s, q_s, do_s, stats, bars, turn, tk, tv, tq, tdo, tl,
                                 td, kvh * sk + x * BK, first_head * sq, sq, group, first,
                                 n_tiles, D, BK, BM, STAGES, TSTATS, DT, WRAP=ROT, start=start,
                                 kb=j % 2, st=st, ph=ph, ring0=g0, kv_ph=kv)  # fmt: skip
                g0 += item_stages(group, first, n_tiles)
        elif lt >= 32 and EARLY < 3:
            write_dq_ordered(dq_s, bars, dq_acc, sem, lt, first_head, group, first, n_tiles,
                             sq, x, nkb, causal, STAGES + NBUF * WG, D, BM, BK,
                             EARLY)  # fmt: skip


@kaio.gpu_func
def item_stages(group: i32, first: i32, n_tiles: i32) -> i32:
    """The ring stages (a query tile of a head each) of a work item's walk: its ``group``
    heads' query tiles ``first`` .. ``n_tiles`` - 1 (none where ``first`` is past them); a
    persistent block's roles count them alike to agree on the ring's position."""
    return group * kaio.max(n_tiles - first, 0)


@kaio.gpu_func
def take_item(turn: u64[:], taken: i32[:], sem: i32[:], counter: i32, j: i32, kv: i32,
              n: i32) -> i32:  # fmt: skip
    """``PERSIST``: the producer's work item j, the next in launch order (``sem[counter]``, zeroed
    by ``prep``), taken once K/V buffer j % 2 is free (``turn[2 + j % 2]``'s phase kv, where
    kv >= 0: the consumers' last reads of item j - 2 and the writers' of its index) and
    written to ``taken[j % 2]`` for the other warps (``taken_item``); past the n items, the
    "landed" barrier is completed without a load: no more work."""
    kb = j % 2
    if kv >= 0:
        kaio.mbarrier_wait(turn, 2 + kb, u32(kv))
    b = kaio.atomic_add(sem, counter, 1)
    taken[kb] = b
    if b >= n:
        kaio.mbarrier_arrive(turn, kb)
    return b


@kaio.gpu_func
def taken_item(turn: u64[:], taken: i32[:], j: i32) -> i32:
    """``PERSIST``: work item j of this block (``take_item``'s), once its K and V landed."""
    kaio.mbarrier_wait(turn, j % 2, u32(j // 2 % 2))
    return taken[j % 2]


@kaio.gpu_kernel(block_size=256)
def zero_acc_sem(acc: f32[:], n: i32, sem: i32[:], m: i32):
    """acc[0 .. n) = 0, four a thread (n a multiple of 4), and sem[0 .. m) = 0: the dQ sums
    and semaphores of ``_attention_hopper_bwd256``'s ordered dQ, in one launch."""
    zero_sums(acc, n, sem, m, i32(kaio.block_idx_x() * 256 + kaio.thread_idx_x()))


@kaio.gpu_kernel(block_size=256)
def prep(o: DT[:], do: DT[:], delta: f32[:], lse: f32[:], l2: f32[:], rows: i32, acc: f32[:],
         n: i32, sem: i32[:], m: i32, D: kaio.constexpr, R: kaio.constexpr,
         DOT: kaio.constexpr, DT: kaio.constexpr):  # fmt: skip
    """The launch's one kernel before the backward: acc[0 .. n) = 0, four a thread of the
    grid (n 0 where the kernel ``stores_first``), sem[0 .. m) = 0 (the dQ sums and their
    semaphores), l2 = ``lse_log2(lse)`` for the ``rows`` rows (the base-2 offsets the
    kernel's ``L2`` reads: one conversion a query row, not one a key block) and, with ``DOT``
    (the launch given ``o``), delta[row] = rowsum(o * do) of the [rows, D] matrices: D / 8 lanes a
    row, each one 16-byte load of o and of do, ``R`` rows a lane whose loads are all issued
    before the sums (R * 256 / (D / 8) rows a block)."""
    kaio.launch_dependents()  # (the backward kernel may start: its wait is for all of this)
    L = D // 8  # (lanes a row)
    t = i32(kaio.thread_idx_x())
    j = i32(kaio.block_idx_x()) * 256 + t
    zero_sums(acc, n, sem, m, j)
    row0 = i32(kaio.block_idx_x()) * (R * 256 // L) + t // L
    c = 8 * (t % L)
    a = kaio.local(DT, (R, 8))
    b = kaio.local(DT, (R, 8))
    x = kaio.local(f32, R)  # (the rows' lse, loaded with the rest)
    for s in kaio.static_range(R):
        row = row0 + s * (256 // L)
        if row < rows:
            x[s] = lse[row]
            if DOT:
                kaio.load_vector(a[s], o, row * D + c)
                kaio.load_vector(b[s], do, row * D + c)
    for s in kaio.static_range(R):
        row = row0 + s * (256 // L)
        dot = 0.0
        if DOT:
            for e in kaio.static_range(8):
                dot += f32(a[s, e]) * f32(b[s, e])
            dot = lanes_sum(dot, L)  # (a row's L lanes are aligned in the warp)
        if row < rows and c == 0:
            l2[row] = lse_log2(x[s])
            if DOT:
                delta[row] = dot


def prep_rows(d: int, r: int) -> int:
    """The rows of one block of ``prep`` for head dim ``d`` and ``r`` rows a lane."""
    return r * 256 // (d // 8)


@kaio.gpu_func
def convert_tile(dq: DT[:], acc: f32[:], tile: i32, sq: i32, scale: f32, D: kaio.constexpr,
                 DT: kaio.constexpr):  # fmt: skip
    """dQ's rows of 64-row tile ``tile`` (over the heads' tiles, sq rows a head) = its floats
    in ``acc`` (fragment order, ``store_dq_frags``: float4 f holds (r, c), (r, c + 1), (r + 8,
    c), (r + 8, c + 1), r = 16 (f % 128 / 32) + f % 32 / 4, c = 8 (f / 128) + 2 (f % 4)) times
    ``scale``, rounded to DT, by the block's 256 threads: the float4s read in order (each
    load instruction a warp's 512 contiguous bytes; L2 only, ``cg``: other blocks' bulk
    reductions wrote them), their pairs to a row-major tile in shared memory (rows padded
    by 16 bytes: a warp's 4-byte stores on 32 banks), then 16-byte row chunks out (a warp's
    stores along whole rows). Rows past sq (a partial last tile) are left alone."""
    t = i32(kaio.thread_idx_x())
    s_t = kaio.shared(DT, (64, D + 8))
    x = kaio.local(f32, (D // 16, 4))  # (64 D / 4 float4s, 256 threads)
    for k in kaio.static_range(D // 16):
        kaio.load_vector(x[k], acc, tile * 64 * D + 4 * (t + 256 * k), 0, "cg")
    r = t % 128 // 32 * 16 + t % 32 // 4
    pair = kaio.local(DT, 2)
    for k in kaio.static_range(D // 16):
        c = (t // 128 + 2 * k) * 8 + t % 4 * 2
        for h in kaio.static_range(2):  # rows r, r + 8
            for e in kaio.static_range(2):
                pair[e] = DT(x[k, 2 * h + e] * scale)
            kaio.store_vector(s_t, (r + 8 * h, c), pair)
    kaio.sync_threads()
    nt = (sq + 63) // 64
    row0 = tile // nt * sq + tile % nt * 64  # the tile's first row of dq
    y = kaio.local(DT, 8)
    for m in kaio.static_range(D // 32):  # 64 rows of D / 8 chunks
        chunk = t + 256 * m
        row = chunk // (D // 8)
        c8 = chunk % (D // 8) * 8
        if tile % nt * 64 + row < sq:
            kaio.load_vector(y, s_t, (row, c8))
            kaio.store_vector(dq, (row0 + row) * D + c8, y)


@kaio.gpu_kernel(block_size=256)
def dq_convert_rows(dq: DT[:], acc: f32[:], sq: i32, scale: f32, D: kaio.constexpr,
                    DT: kaio.constexpr):  # fmt: skip
    """``dq_convert_tiles`` a tile a block (``convert_tile``): dq [heads * sq, D] = acc *
    scale rounded to DT, acc the heads' whole 64-row tiles in fragment order."""
    convert_tile(dq, acc, i32(kaio.block_idx_x()), sq, scale, D, DT)


@kaio.gpu_kernel(block_size=256)
def dq_convert_behind(dq: DT[:], acc: f32[:], sem: i32[:], sq: i32, nkb: i32, causal: i32,
                      scale: f32, D: kaio.constexpr, BK: kaio.constexpr,
                      DT: kaio.constexpr):  # fmt: skip
    """``dq_convert_rows`` behind the ordered kernel: launched with programmatic dependent
    launch (its ``grid_dependency_wait``) once every block of that kernel has begun (its
    ``launch_dependents``), its blocks run on the multiprocessors that kernel's last blocks
    leave idle, each converting its tile once the tile's semaphore counts every turn
    (``tile_turns``: the last reduction in and released; thread 0 waits, the block
    follows); the wait at its end keeps it from completing before that kernel does."""
    tile = i32(kaio.block_idx_x())
    if kaio.thread_idx_x() == 0:
        kaio.wait_eq(sem, tile, tile_turns(tile % ((sq + 63) // 64), nkb, causal, 64, BK))
    kaio.sync_threads()
    convert_tile(dq, acc, tile, sq, scale, D, DT)
    kaio.grid_dependency_wait()


@kaio.gpu_func
def tile_turns(t: i32, nkb: i32, causal: i32, BM: kaio.constexpr, BK: kaio.constexpr) -> i32:
    """The key blocks that add to query tile t: causal, those up to the last that sees it;
    else all ``nkb``."""
    n = nkb
    if causal != 0:
        n = kaio.min(nkb - 1, ((t + 1) * BM - 1) // BK) + 1
    return n


@kaio.gpu_func
def zero_sums(acc: f32[:], n: i32, sem: i32[:], m: i32, j: i32):
    """Thread j's share of ``prep``'s zeros: acc[4j .. 4j + 4) and sem[j]."""
    i = j * 4
    if i < n:
        z = kaio.local(f32, 4)
        for e in kaio.static_range(4):
            z[e] = 0.0
        kaio.store_vector(acc, i, z)
    if j < m:
        sem[j] = 0


# The consumers' schedule (``consume_late``) by head dim and mask (not causal, causal):
# measured on an H100 (f16 B4 H16 S4096, TFLOP/s at 2.5x the forward's FLOPs), SCHED 4 /
# 2 / 0: D 128 454 / 418 / 392, causal 400 / 422 / 371; D 64 (4 / 2 / 1) 318 / 303 / 285,
# causal 316 / 302 / 271. (At D 128 SCHED 1 spills 280 bytes.) With the dS^T buffers'
# "free" wait and HG 4, D 128 causal SCHED 4 against 2: 422 against 408 (H200), 410
# against 402 (H100, HG 1).
SCHED = {64: (4, 4), 128: (4, 4)}

# The launch order's interleaved K/V heads (``HG``: the kernel's ``hg``, ``interleaved``) by
# head dim and mask, f16 H16, interleaved A/B (docs/performance.md): H100 B4 S4096, HG 4
# against 1: D 128 496 against 422, D 64 337 against 285 (without the order, ORDER 0 and
# HG 1: 481, 347); H200, HG 8 / 4 / 2 / 1: D 128 B4 S4096 495 / 497 / 476 / 435, B16
# S1024 355 / 326 / - / 317, B1 S16384 - / 555 / 508 / 496; D 64 B4 S4096 353 / 334 / - /
# 303 (causal: HG 4 and 1 alike); with NDS 3 at D 64 (H200): HG 8 / 4 364 / 360, causal
# 313 / 312; D 128 B1 S16384 HG 4 / 8: 553 / 516. Causal, HG 4 (8 at D 64) against 1
# (H100, the lead's final check, 2026-11-27, f16 / bf16): D 128 B1 S16384 431 / 437 against
# 477 / 531, B4 S4096 410 / 416 against 421 / 412, B16 S1024 alike; D 64 B1 S16384 338 / 350
# against 352 / 366, S4096 and S1024 alike: causal blocks finish at different times, so
# spreading a head's key blocks apart only delays the turns. H100, f16 B16 H16 S1024 D 64
# (2026-11-27, two rounds): HG 16 243 and 246 against 8's 237 and 241 (SDPA flash 186, 194);
# earlier at B4 S4096 HG 16 403 / 348 against 4's 402 / 348. D 64 causal with persistent
# blocks taking the items in this order (bwd rounds E and F, H100, queued): HG 4 against 1,
# f16 B16 S1024 259 / 257 against 253 / 255 (HG 2 253, 8 258), bf16 262 against 256, B4
# S4096 409 against 404, B1 S16384 473 against 471; without the mask HG 4 318 against 16's
# 367.
HG = {64: (16, 4), 128: (4, 1)}

# Whether the key blocks of a head may wait for later ones (``ROT``; not causal, rotated
# walks; causal, the longest walks launched first) by head dim and mask, where they all fit
# on the GPU at once (``rotated``), and whether then (not causal) the last turn on each tile
# stores dQ (``FINISH``; ``finishes``). H100, B16 H16 S1024, TFLOP/s, each against main's
# kernel in the same run: D 128 with both 344 and 355 against 311 and 314 (f16; SDPA flash
# 211, 212), bf16 348 against 311; f16 B4 S4096 514 against 513; D 64 249 / 238 / 236 / 259
# against 226 / 236 / 237 / 257 (four runs); causal D 64 (ROT alone) 114 / 173 against
# 120 / 171; with prep, PDL and dQ converted behind (bwd64 round E, queued): 239 against
# 242, B4 S4096 387 against 389.
ROT = {64: (False, False), 128: (True, False)}
FINISH = {64: False, 128: True}

# The dS^T buffers of SCHED 4 (``NDS``) by head dim (D 128: three do not fit beside three
# ring stages): H200, f16 B4 H16 S4096, D 64 with HG 4, NDS 3 against 2: 360 against 334,
# causal 295 against 282.
NDS = {64: 3, 128: 2}


# ``prep``'s rows a lane (all their loads issued before the sums) by head dim. H100, B16 H16
# S1024, µs a call alone (queued; bwd64 rounds A, C, D), R 1 / 2 / 4: D 64 34.3 / 34.1 /
# 34.8, 34.1 / 34.1 / 35.0, 33.9 / 34.0 / -; D 128 55.8 / 55.8 / 56.2, 56.2 / 56.4 / 56.9
# (row_dot_vec and the zeroing kernel before: 39.0, 37.3, 37.8; D 128 58.6, 58.9, 59.4).
PREP_R = {64: 2, 128: 2}


# Whether the blocks are persistent (``PERSIST``: one a multiprocessor, each taking work
# items from a counter in launch order, the next item's K and V loaded while one runs), by
# head dim and mask; D 64 only (two K and V buffers do not fit beside D 128's ring). H100,
# f16 H16 D 64, TFLOP/s, each call's GPU time (queued): every grid-th item to each block,
# against the same kernel without (and main's module; round D): B16 S1024 345 against 331
# (332), B4 S4096 443 against 439, B1 S16384 471 against 463; through the same host path
# B16 S1024 298 against 282 (round B), 281 against main's 270, B4 S4096 403 against 394,
# bf16 B16 S1024 258 against 239 (round E). With the mask (items of unequal walks: blocks
# given the same share end apart) B16 S1024 160 against 185, B4 S4096 224 against 317 (the
# odd rounds' items reversed to even the walks out: 172 against 178). Tried: the blocks
# converting dQ's tiles themselves once their items are done (no dq_convert_tiles): 327
# against 345, 449 against 443, 447 against 471. With the mask, a head's key blocks in pairs
# of equal work (nkb - 1 - p, then p; bwd64 round C, queued): B16 S1024 226 against 234, B4
# S4096 330 against 384. The items taken from a counter (bwd, rounds A, C, D; against the
# shipped kernel, resp. main's, in the same run): B16 S1024 causal 252, 255 and 251 against
# 240, 243 and 240 (SDPA flash 143, 144, 143), bf16 252 against 241, B4 S4096 causal 405 and
# 400 against 392 and 385; B16 S1024 364 and 370 against 359 and 365 (every grid-th item:
# 365). Tried with them (removed): the turns under the mask in increasing key-block order
# with the longest walks first (each key block then waits for the one before to be two
# tiles ahead): 127 (16 heads interleaved) and 193 (32) at B16 S1024 causal, 316 at B4
# S4096; delta computed in the kernel from O's tiles in the ring by the producer
# warpgroup's fourth warp (no pass over O and dO before; three ring stages, the consumers at
# 232 registers): 248 causal (255 without), 325 (shipped 363) without the mask, 331
# (shipped 390) at B4 S4096 causal; with the last turn on each tile storing dQ (no
# conversion after): 241, 313, 321.
PERSIST = {64: (1, 1), 128: (0, 0)}

# Whether dQ's conversion runs behind the kernel (``dq_convert_behind``) rather than after
# it (``dq_convert_rows``), by head dim. H100, f16 H16 B16 S1024, queued, each against the
# same kernels converting after (bwd64 rounds A and C, with 16-byte conversions in
# registers): D 64 347 / 348 against 348 / 348, causal 237 / 237 against 234 / 234; D 128
# causal 298 / 295 against 303 / 299; with dq_convert_rows (round D): D 64 358 against
# 351, causal 241 against 235, B4 S4096 449 against 452, causal 383 against 380. Tried:
# two or four tiles a conversion block (round E: 50.1 / 50.9 µs against 50.1 alone at D 64
# B16 S1024; 365, causal 242 in the backward, as one tile).
BEHIND = {64: True, 128: False}


def ordered_config(d: int, sched: int | None = None, causal: bool = False) -> dict:
    """The kernel's constexprs for head dim ``d``: ``_attention_hopper_bwd.config(d)``'s
    fused ones (``DQ`` 5), ``SCHED`` ``sched`` (default ``SCHED[d][causal]``), ``EARLY`` 3
    (2 with ``SCHED`` 0; H100, f16 B4 H16 S4096, ``SCHED`` 2 at D 128, 1 at D 64: 3 against 2
    411 / 410, causal 403 / 385; at D 64 293 / 271, causal 278 / 268), ``ORDER`` 1 (dQ added
    in the fixed order), two dQ writers (``NW``), ``HG[d][causal]`` heads interleaved in the
    launch order, ``NDS[d]`` dS^T buffers with ``SCHED`` 4 (else 2), as many ring stages as
    fit (at most 4), and with ``SCHED`` 1 to 6 ``SPLIT``, ``L2`` and ``PFIRST`` (H100, f16
    B4 H16 S4096 D 64, each against the one before, interleaved: SPLIT and L2 375 against
    372, causal 295 against 294; PFIRST 418 against 375, causal 325 against 295)."""
    sched = SCHED[d][bool(causal)] if sched is None else sched
    c = {**config(d)["fused"], "EARLY": 3 if sched else 2, "SCHED": sched, "ORDER": 1, "NW": 2}
    on = int(bool(sched))  # (consume_late's: SCHED 1 to 6)
    c.update(SPLIT=on, L2=on, PFIRST=on)
    c["HG"] = HG[d][bool(causal)]
    c["ROT"] = ROT[d][bool(causal)]
    c["FINISH"] = FINISH[d]
    c["NDS"] = NDS[d] if sched >= 4 else 2
    c["PERSIST"] = PERSIST[d][bool(causal)]
    return {**c, "STAGES": fit_stages(d, c)}


def stores_first(c: dict) -> bool:
    """Whether the kernel with constexprs ``c`` stores each tile's first dQ share (the
    writers of ``write_dq_two`` with the fixed order) rather than adding it to zeros: then
    the launch zeroes only the semaphores (at B16 H16 S1024 D64, 67 MB fewer bytes written,
    and as many not read back by the first reductions)."""
    return c["EARLY"] == 3 and c["ORDER"] == 1


def constexprs(c: dict) -> dict:
    """The kernel's constexprs among ``ordered_config``'s (``HG`` is its argument ``hg``;
    ``ROT`` and ``FINISH`` as ``launch`` takes them: ``rotated``, ``finishes``)."""
    return {k: int(v) for k, v in c.items() if k != "HG"}


def persistent(c: dict) -> bool:
    """Whether the kernel runs with persistent blocks: ``PERSIST`` in the configuration
    ``c``, with ``SCHED`` 4, three dS^T buffers, the two writers and neither ``ROT`` nor
    ``FINISH`` (whose rotated walks wait for later blocks of a head)."""
    return (bool(c.get("PERSIST")) and c["SCHED"] == 4 and c["NDS"] == 3 and c["EARLY"] == 3
            and not c["ROT"] and not c["FINISH"])  # fmt: skip


def rotated(c: dict, nkb: int, sms: int) -> bool:
    """Whether the kernel runs with ``rot`` (``ROT`` in the configuration ``c``): where the
    ``nkb`` key blocks of a head, which may then wait for each other, all fit on the
    ``sms`` multiprocessors at once (one block each), and with the two writers (``EARLY``
    3). Blocks are dispatched in launch order, so that the oldest unfinished head's blocks
    are all running whenever every multiprocessor is busy: no deadlock."""
    return bool(c.get("ROT")) and nkb <= sms and c["EARLY"] == 3


def finishes(c: dict, rot: bool, causal: bool) -> bool:
    """Whether the kernel runs with ``finish`` (``FINISH`` in the configuration ``c``): with
    ``rot`` (``rotated``), not causal (its last turns are key block 0's on every tile: H100,
    f16 B16 H16 S1024 D 128, that order finishing them ran 239 and 246 TFLOP/s against 230
    and 255 without, B4 S4096 443 against 459) and the fixed order (``ORDER`` 1)."""
    return bool(c.get("FINISH")) and rot and not causal and c["ORDER"] == 1


def fit_stages(d: int, c: dict) -> int:
    """The most ring stages (at most 4) whose ``smem_bytes`` fit, for head dim ``d`` and the
    other constexprs ``c``."""
    fit = [n for n in range(1, 5) if smem_bytes(d, {**c, "STAGES": n}) <= SHARED_LIMIT]
    return max(fit, default=1)


def _buffers(c: dict) -> int:
    """The P^T and dS^T buffers of 64 queries (``shared_bytes``'s ``nbuf``): ``NDS`` (two or
    three), four with ``SCHED`` 1, 2."""
    sched = c.get("SCHED")
    n = 4 if sched in (1, 2) else c.get("NDS", 2) if sched else _ds_buffers(c)[1]
    return n


def smem_bytes(d: int, c: dict) -> int:
    """The kernel's dynamic shared memory for head dim ``d`` and constexprs ``c``."""
    more = 32 * max(c.get("NW", 2) - 3, 0) + 8  # (writers 3 .. NW - 1's barriers; ``taken``)
    if c.get("PERSIST"):  # K and V's second buffer, its two barriers
        more += 2 * 64 * c["WG"] * d * 2 + 16
    return more + shared_bytes(d, 64 * c["WG"], c["BM"], c["STAGES"], c["STAGES"] * c["BM"], 5,
                               _buffers(c))  # fmt: skip


def launch(qa, ka, va, da, la, delta, dims: tuple, causal: bool, scale: float,
           cfg: dict | None = None, o=None):  # fmt: skip
    """Run the deterministic fused backward on checked operands (as
    ``_attention_hopper_bwd.launch``: q, do [B, H, Sq, D], k, v [B, Hkv, Sk, D], lse [B, H,
    Sq] f32, ``delta`` flat f32 [B * H * Sq]; ``dims``: (B * H, H, group, sq, sk, d, d);
    ``cfg``: overrides of ``ordered_config(d)``'s constexprs; ``o``: O [B, H, Sq, D], given
    where ``delta`` is to be written, rowsum(dO * O)): ``prep`` (delta with ``o``, the
    semaphores' zeros, the dQ sums' unless ``stores_first``, lse_log2), the kernel, then dQ
    rounded to q's type. Returns (dq, dk, dv)."""
    import math
    import types

    from kaio_ops import _arrays

    bh, heads, group, sq, sk, d, _ = dims
    cfg = cfg or {}
    c = {**ordered_config(d, cfg.get("SCHED"), causal), **cfg}  # (EARLY too)
    c["PERSIST"] = int(persistent(c))
    if "STAGES" not in cfg:  # as many as fit with the overrides
        c["STAGES"] = fit_stages(d, c)
    if c.get("DQ") != 5 or c["PIPE"] or c["BM"] != 64 or (c["SCHED"] and c["LATE"]):
        raise ValueError(
            f"_attention_hopper_bwd_fused.launch: needs the DQ 5 schedule (PIPE 0, BM 64; "
            f"SCHED 1 without LATE), got {c}; pass ordered_config(d)"
        )
    if c["EARLY"] == 3 and not c["SCHED"]:
        raise ValueError(f"_attention_hopper_bwd_fused.launch: EARLY 3 needs SCHED 1 to 4: {c}")
    if c["NW"] not in range(2, 7) or c["NW"] > 2 and c["EARLY"] != 3:
        raise ValueError(f"_attention_hopper_bwd_fused.launch: NW 2, or 3 to 6 with EARLY 3: {c}")
    if c["NDS"] not in (2, 3) or c["NDS"] == 3 and c["SCHED"] < 4:
        raise ValueError(f"_attention_hopper_bwd_fused.launch: NDS 2, or 3 with SCHED 4, 6: {c}")
    if not c["SCHED"] and (c["SPLIT"] or c["L2"] or c["PFIRST"]):
        raise ValueError(
            f"_attention_hopper_bwd_fused.launch: SPLIT, L2, PFIRST need SCHED 1 to 6: {c}"
        )
    if c["SCHED"] and c["STAGES"] < 2:
        raise ValueError(f"_attention_hopper_bwd_fused.launch: SCHED 1 needs 2 stages: {c}")
    stream, dq, dk, dv, rows_q, rows_kv = launch_outputs(qa, ka, da, d)
    n_tiles = -(-sq // c["BM"])  # the semaphores' (dq_acc: whole tiles of 64 rows)
    acc_size = bh * -(-sq // 64) * 64 * d
    dq_acc = _arrays.output(da, (acc_size,), f32)
    n_sem = bh * n_tiles + 1  # (and PERSIST's counter of the work items taken)
    sem = _arrays.output(da, (n_sem,), i32)
    zeros = 0 if stores_first(c) else acc_size  # (the dQ sums' zeros)
    l2 = _arrays.output(da, (rows_q,), f32)  # lse_log2(lse) once a query row
    l2_arg = _arrays.output_arg(da, l2, (rows_q,), f32)
    r = PREP_R[d]
    grid = max(-(-rows_q // prep_rows(d, r)), -(-max(zeros // 4, n_sem) // 256))
    src = da if o is None else o  # (without o, delta is given: DOT 0 reads neither)
    prep[grid, 256, stream, 0](src.arg(src.size), da.arg(da.size), delta, la.arg(rows_q), l2_arg,
                               rows_q, dq_acc, zeros, sem, n_sem, D=d, R=r,
                               DOT=int(o is not None), DT=qa.dtype)  # fmt: skip
    if c["L2"]:  # (the kernel's stats: l2, else lse)
        la = types.SimpleNamespace(obj=l2, kind=da.kind, arg=lambda *_: l2_arg)

    tmap = functools.partial(row_map, d=d)
    stats = stats_maps(la, delta, rows_q, c["BM"])
    bk = 64 * c["WG"]
    smem = smem_bytes(d, c)
    nkb = -(-sk // bk)
    rot = rotated(c, nkb, _arrays.multiprocessors(qa))
    finish = finishes(c, rot, causal)
    hg = 1 if rot else c["HG"]  # (rotated walks: a head's key blocks side by side)
    grid = (nkb, bh // group)
    if c["PERSIST"]:  # at most one block a multiprocessor
        grid = (min(nkb * (bh // group), _arrays.multiprocessors(qa)),)
    dq_out = _arrays.output_arg(da, dq, (qa.size,))
    attention_bwd_fused_ordered[grid, 128 * c["WG"] + 128, stream, smem](
        tmap(ka, rows_kv, bk), tmap(va, rows_kv, bk), tmap(qa, rows_q, c["BM"]),
        tmap(da, rows_q, c["BM"]), *stats, la.arg(rows_q), delta,
        _arrays.output_arg(da, dk, (ka.size,)), _arrays.output_arg(da, dv, (ka.size,)),
        dq_acc, sem, dq_out, sq, sk, heads, group, bh // group, math.log2(math.e) * scale, scale,
        int(causal), hg, D=d, DT=qa.dtype, **{**constexprs(c), "ROT": int(rot),
                                                      "FINISH": int(finish)},
    )  # fmt: skip
    tiles = bh * -(-sq // 64)  # (finish: the last turn on each tile stored its dQ)
    if not finish and BEHIND[d] and c["ORDER"] == 1:  # each tile once its turns are in (the
        # semaphores count them), on the multiprocessors the kernel leaves idle
        dq_convert_behind[tiles, 256, stream, 0](dq_out, dq_acc, sem, sq, nkb, int(causal), scale,
                                                 D=d, BK=bk, DT=qa.dtype)  # fmt: skip
    elif not finish:
        dq_convert_rows[tiles, 256, stream, 0](dq_out, dq_acc, sq, scale, D=d, DT=qa.dtype)
    return dq, dk, dv


def specializations():
    """(kernel, constexprs) of the specializations ``launch`` runs (for PTX checks)."""
    from kaio import bf16, f16

    for dt in (f16, bf16):
        for d in (64, 128):
            seen = []
            for causal in (False, True):  # the configurations taken (by mask)
                cfg = ordered_config(d, None, causal)
                rot = bool(cfg["ROT"]) and cfg["EARLY"] == 3  # (rotated, where all fit)
                c = {**constexprs(cfg), "ROT": int(rot), "FINISH": int(finishes(cfg, rot, causal))}
                if c not in seen:
                    seen.append(c)
                    yield attention_bwd_fused_ordered, {"D": d, "DT": dt, **c}
    for dt in (f16, bf16):
        for d in (64, 128):
            for dot in (0, 1):
                yield prep, {"D": d, "R": PREP_R[d], "DOT": dot, "DT": dt}
    for dt in (f16, bf16):
        for d in (64, 128):
            yield (
                (dq_convert_behind, {"D": d, "BK": 128, "DT": dt})
                if BEHIND[d]
                else (dq_convert_rows, {"D": d, "DT": dt})
            )
    yield zero_acc_sem, {}
