"""The Hopper (sm_90) GEMM behind ``kaio_ops.matmul`` and ``kaio_ops.linear``: TMA loads, an
mbarrier ring and ``wgmma``, with the epilogue of ``kaio_ops._gemm`` (bias, activation,
residual, one rounding to the output type, or raw f32 partial tiles for a K split summed by
``_gemm.gemm_reduce``).

Sized for every M an LLM runs: a block computes a ``64 * WG x BN`` tile of C with ``WG`` (1
or 2) consumer warpgroups, each multiplying its 64 rows of A by the whole B slice with
``wgmma.m64n{BN}k16`` and one group of wgmmas kept in flight, and a producer warp (one thread
of it works) that issues the TMA copies of each 64-deep K slice of A and B into a
``STAGES``-deep ring of 128-byte-swizzled shared tiles. Small M takes ``WG = 1`` (64-row
tiles) and narrow N tiles; when the tiles do not fill the GPU, K is split over ``grid.z``
(``SPLIT`` slices, each a whole number of 64-deep steps) and a second kernel sums the slices
in a fixed order (deterministic). One tile per block (no persistent loop); blocks go in
groups of 8 tile rows (``_matmul_kernels.tile_origin``) for L2 reuse.

Shared tiles (docs/hopper.md gives the descriptors): stage ``s`` of the ring is rows of 128
bytes (``load_slice``, ``mma_slice``, shared with ``kaio_ops._gemm_streamk``): first A's
``64 * WG x 64`` K-major rows (SBO 1024), then B's in blocks of 64 rows. B [N, K] (``BT``,
``nn.Linear``'s layout) is K-major too: ``BN`` rows of 64 K (for "silu_gate" the gate rows
then the up rows of the block's columns, two accumulator sets); B [K, N] is ``BN / 64``
column blocks of ``64 x 64`` N-major rows (LBO 8192, SBO 1024, ``trans_b``). ``BN`` is a
multiple of 16 (160 and 224 fill the waves of some LLM shapes): B is loaded in whole 64-row
blocks, the wgmmas read the first ``BN``. The K tail and the M and N edges read zeros from
TMA; the epilogue stores only the elements inside C (``_gemm.store_pair``; with a bias,
activation or residual on an unsplit tile ``_matmul_hopper.store_fused``, which loads a chunk's
operands before its stores, the residual rows prefetched into L2: ``FUSED_VEC``).
"""

# ruff: noqa: F821  (DT, OUT and RT in annotations are dtype constexpr parameters)
from __future__ import annotations

import math
from typing import NamedTuple

import kaio
from kaio import bool_, f16, f32, i32, u32, u64
from kaio_ops._gemm import last_arrival, store_pair, sum_tile
from kaio_ops._matmul_hopper import (
    init_ring,
    next_stage,
    prefetch_rows,
    retire_slice,
    store_fused,
    store_rows,
)
from kaio_ops._matmul_kernels import tile_col, tile_origin, tile_row

BK = 64
SW = 128  # swizzle bytes: one 128-byte row per 64 elements
SHARED_LIMIT = 227 * 1024
# the fused epilogue (bias, activation, residual) of an unsplit tile: ``store_fused`` (VEC
# 3), loading EPI_CHUNK n8 tiles of bias and residual before their stores. Measured on an
# H100 (bench/gemm_epilogue.py, M = 4096, 128 x 256 tiles): gelu + bias + residual at 4096 x
# 14336 694.7 µs against 740.7 pair by pair (VEC 0; 8 tiles a chunk: 712.1, its registers
# spilled), silu_gate at 14336 x 4096 1584 against 1723 µs; with the residual prefetched
# into L2 by the producer (VEC 4), 654.6 and 1437 µs, against 658.8 and 1487 (VEC 3), 695
# and 1613 (VEC 0) in the next round
FUSED_VEC = 4
EPI_CHUNK = 4


@kaio.gpu_func
def wgmma_step(
    acc: f32[:, :, :],
    da: u64, db: u64, accumulate: bool_,
    TRANS_B: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """acc (+)= the k16 product of descriptors da and db, in DT."""
    kaio.wgmma(DT, acc, da, db, accumulate, False, TRANS_B)


@kaio.gpu_func
def copy_box(
    ring: DT[:, :, :], s: i32, row: i32, tmap: kaio.tensormap, c0: i32, c1: i32, bars: u64[:, :],
    SHARED: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """One TMA box of ``tmap`` at (``c0``, ``c1``) into rows ``row``.. of stage ``s``,
    completing on the stage's full barrier; ``SHARED``: into both blocks of the cluster
    (multicast)."""
    if SHARED:
        kaio.tma_load_2d_multicast(ring, (s, row, 0), tmap, c0, c1, bars, (0, s), 3)
    else:
        kaio.tma_load_2d(ring, (s, row, 0), tmap, c0, c1, bars, (0, s))


@kaio.gpu_func
def load_slice(
    ring: DT[:, :, :], bars: u64[:, :], ta: kaio.tensormap, tb: kaio.tensormap, s: i32,
    m0: i32, n0: i32, k0: i32, N: u32, rank: i32,
    WG: kaio.constexpr, BN: kaio.constexpr, BT: kaio.constexpr, ACT: kaio.constexpr,
    PAIR: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The producer's TMA copies of one 64-deep K slice (from ``k0``) into stage ``s`` of
    ``ring``, armed on its full barrier: A's rows from ``m0``, then B's columns from ``n0`` in
    64-row blocks (for "silu_gate" then the up rows' blocks, from ``N + n0``). A width that
    is not a multiple of 64 (160, 224) loads its last block whole. In a pair of blocks
    (``PAIR``, a cluster of two: block ``rank``), the shared operand's boxes (B's blocks for
    ``PAIR`` 1, A's 64-row boxes for 2) go to both blocks, the two blocks taking them in
    turn; each block's barrier expects the whole stage."""
    NBLK = (BN + 63) // 64
    NB = 2 if ACT == "silu_gate" else 1
    BM = 64 * WG
    kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32((BM + NB * NBLK * 64) * BK * 2))
    if PAIR == 2:  # A shared: its 64-row boxes in turn
        for i in kaio.static_range(WG):
            if rank == i % 2:
                copy_box(ring, s, 64 * i, ta, m0 + 64 * i, k0, bars, True, DT)
    else:
        kaio.tma_load_2d(ring, (s, 0, 0), ta, m0, k0, bars, (0, s))
    for j in kaio.static_range(NBLK):
        mine = PAIR != 1 or rank == j % 2  # B shared (PAIR 1): its blocks in turn
        if BT:
            if mine:
                copy_box(ring, s, BM + 64 * j, tb, n0 + 64 * j, k0, bars, PAIR == 1, DT)
            if NB == 2 and (PAIR != 1 or rank == (NBLK + j) % 2):
                copy_box(ring, s, BM + 64 * (NBLK + j), tb, i32(N) + n0 + 64 * j, k0, bars,
                         PAIR == 1, DT)  # fmt: skip
        elif mine:
            copy_box(ring, s, BM + 64 * j, tb, k0, n0 + 64 * j, bars, PAIR == 1, DT)


@kaio.gpu_func
def mma_slice(
    acc: f32[:, :, :], acc_u: f32[:, :, :], ring: DT[:, :, :], s: i32, wg: u32, fresh: bool_,
    WG: kaio.constexpr, BN: kaio.constexpr, BT: kaio.constexpr, ACT: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``wg``'s wgmmas of the K slice in stage ``s`` of ``ring``
    (``load_slice``'s layout): acc (+)= its 64 rows of A times the B tile, and for
    "silu_gate" acc_u (+)= them times the up tile; ``fresh``: the slice starts the sum."""
    NBLK = (BN + 63) // 64
    BM = 64 * WG
    for kk in kaio.static_range(BK // 16):
        da = kaio.smem_descriptor(ring, (s, 64 * wg, kk * 16), SW, 16, 1024)
        more = kk > 0 or not fresh
        if BT:
            db = kaio.smem_descriptor(ring, (s, BM, kk * 16), SW, 16, 1024)
            wgmma_step(acc, da, db, more, False, DT)
            if ACT == "silu_gate":
                du = kaio.smem_descriptor(ring, (s, BM + 64 * NBLK, kk * 16), SW, 16, 1024)
                wgmma_step(acc_u, da, du, more, False, DT)
        else:  # B [K, N]: 64-column blocks of N-major rows, LBO between blocks
            db = kaio.smem_descriptor(ring, (s, BM + kk * 16, 0), SW, BK * SW, 1024)
            wgmma_step(acc, da, db, more, True, DT)


@kaio.gpu_func
def mma_run(
    acc: f32[:, :, :], acc_u: f32[:, :, :], ring: DT[:, :, :], bars: u64[:, :], kb: i32,
    ke: i32, s: i32, ph: u32, ps: i32, wg: u32, lt: u32,
    STAGES: kaio.constexpr, WG: kaio.constexpr, BN: kaio.constexpr, BT: kaio.constexpr,
    ACT: kaio.constexpr, PAIR: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """A consumer warpgroup's sum of K slices ``kb`` to ``ke`` (> ``kb``) of one tile: each
    waited for at ring position ``s``, ``ph``, multiplied (``mma_slice``) and retired (its
    stage before freed, ``retire_slice``; ``ps``: the stage of the slice before), then all
    its wgmmas waited for. Returns the ring position after it and the stage of its last
    slice (``s, ph, ps``), which the caller frees when it no longer needs it. In a pair of
    blocks (``PAIR``) a stage is freed in both (each block's producer writes into both)."""
    for kt in range(kb, ke):
        kaio.mbarrier_wait(bars, (0, s), ph)
        kaio.wgmma_fence()
        mma_slice(acc, acc_u, ring, s, wg, kt == kb, WG, BN, BT, ACT, DT)
        ps, s, ph = retire_slice(bars, kt - kb, lt, s, ph, ps, STAGES, PAIR)
    kaio.wgmma_wait(0)
    return s, ph, ps


@kaio.gpu_func
def store_shared(
    acc: f32[:, :, :], c: OUT[:, :], ebuf: OUT[:, :, :], row0: i32, col0: i32, m: i32, n: i32,
    wg: u32, lt: u32, BN: kaio.constexpr, OUT: kaio.constexpr, DEFER: kaio.constexpr = 0,
):  # fmt: skip
    """Store a warpgroup's 64 rows of C from ``row0``, BN columns from ``col0`` (thread
    ``lt`` holds ``acc``, the m16n8 C fragment of each n8 tile of its warp's 16 rows): each
    warp rounds its 16 rows into its buffer ``ebuf[warp]`` (rows of BN + 8, against bank
    conflicts), then lane r < 16 copies row r out by one bulk copy (n a multiple of 8) and
    waits until the copy has read the buffer (the block may then leave). ``DEFER``: that
    wait comes at the start of the warp's next store instead, so that the copies drain while
    the warp goes on (the caller waits for the last ones before the block leaves)."""
    lane = i32(lt % 32)
    w = i32(wg) * 4 + i32(lt // 32)
    if DEFER:  # the copies of the warp's store before have read its buffer
        if lane < 16:
            kaio.bulk_wait_read(0)
        kaio.sync_warp()
    two = kaio.local(OUT, (2,))
    for h in kaio.static_range(2):
        for j in kaio.static_range(BN // 8):
            two[0] = OUT(acc[j, h, 0])
            two[1] = OUT(acc[j, h, 1])
            kaio.store_vector(ebuf, (w, lane // 4 + 8 * h, 8 * j + 2 * (lane % 4)), two)
    kaio.fence_proxy_async()
    kaio.sync_warp()
    r = row0 + 16 * i32(lt // 32) + lane
    if lane < 16 and r < m and col0 < n:
        kaio.bulk_store(c, (r, col0), ebuf, (w, lane, 0), kaio.min(BN, n - col0) * OUT.itemsize)
        kaio.bulk_commit()
        if not DEFER:
            kaio.bulk_wait_read(0)


@kaio.gpu_func
def finish(
    acc: f32[:, :, :], acc_u: f32[:, :, :], c: OUT[:, :], ws: f32[:, :], bias: DT[:],
    res: RT[:, :], ebuf: OUT[:, :, :], m0: u32, n0: u32, M: u32, N: u32, wg: u32, lt: u32,
    BN: kaio.constexpr, CH: kaio.constexpr, SPLIT: kaio.constexpr, BIAS: kaio.constexpr,
    ACT: kaio.constexpr, RES: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr,
    RT: kaio.constexpr, VEC: kaio.constexpr,
):  # fmt: skip
    """Consumer warpgroup ``wg``'s epilogue of its 64 rows of the tile at (``m0``, ``n0``)
    (``gemm_wgmma``'s ``VEC``)."""
    # lane (g, t) of warp w holds rows 16w + g (+ 8) and columns 8j + 2t, + 1
    GATE = ACT == "silu_gate"
    lane = lt % 32
    if VEC == 1:
        store_rows(acc, c, c, c, i32(m0 + 64 * wg), i32(n0), i32(M), i32(N), i32(N), 0,
                   f32(1.0), f32(1.0), f32(1.0), lt, BN, OUT)  # fmt: skip
    if VEC == 2:
        store_shared(acc, c, ebuf, i32(m0 + 64 * wg), i32(n0), i32(M), i32(N), wg, lt, BN,
                     OUT)  # fmt: skip
    if VEC == 3 or VEC == 4:
        store_fused(acc, acc_u, c, bias, res, m0 + 64 * wg, n0, M, N, lt, BN, CH, BIAS, ACT,
                    RES, DT, OUT, RT)  # fmt: skip
    for j in kaio.static_range(BN // 8 if VEC == 0 else 0):
        col = n0 + 8 * j + 2 * (lane % 4)
        for h in kaio.static_range(2):
            row = m0 + 64 * wg + 16 * (lt // 32) + lane // 4 + 8 * h
            u0 = f32(0.0)
            u1 = f32(0.0)
            if GATE:
                u0 = acc_u[j, h, 0]
                u1 = acc_u[j, h, 1]
            store_pair(c, ws, bias, res, acc[j, h, 0], acc[j, h, 1], u0, u1, row, col, M, N,
                       SPLIT, BIAS, ACT, RES, DT, OUT, RT)  # fmt: skip


@kaio.gpu_kernel
def gemm_wgmma(
    ta: kaio.tensormap, tb: kaio.tensormap, c: OUT[:, :], ws: f32[:, :], bias: DT[:],
    res: RT[:, :], counters: i32[:],
    M: u32, N: u32, K: u32, k_slice: u32,
    WG: kaio.constexpr, BN: kaio.constexpr, STAGES: kaio.constexpr, BT: kaio.constexpr,
    SPLIT: kaio.constexpr, FIXUP: kaio.constexpr, BIAS: kaio.constexpr, ACT: kaio.constexpr,
    RES: kaio.constexpr, PAIR: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr,
    RT: kaio.constexpr, VEC: kaio.constexpr, CH: kaio.constexpr,
):  # fmt: skip
    """C = epilogue(A @ B) (module docstring): block x computes C tile x, or with a K split
    block (x, z) the raw partial tile of K slice z into ``ws``. ``ta``: A [M, K] in boxes of
    (64 * WG, 64) (64 rows for ``PAIR`` 2); ``tb``: B [N, K] (BT 1; [2N, K] for "silu_gate")
    or [K, N] (BT 0) in boxes of (64, 64). ``PAIR``: 0, or clusters of two blocks whose
    tiles share B (1: one above the other) or A (2: side by side), copied once for both.
    ``VEC`` (a plain product, no K split, N a multiple of 8; ``vec_ok``): 0, a pair of
    columns a store (``_gemm.store_pair``); 1, 4 adjacent columns a store, lanes trading
    pairs (``_matmul_hopper.store_rows``); 2, each warp's 16 rows through its own shared
    buffer, then a bulk copy a row (``store_shared``); 3 (no K split, any epilogue): the
    epilogue's loads ``CH`` n8 tiles at a time before their stores (``store_fused``); 4: as
    3, the producer having asked for the tile's residual rows in L2 after its last K slice
    (``prefetch_rows``)."""
    kaio.launch_bounds(WG * 128 + 32, 1)
    if PAIR:
        kaio.cluster_dims(2)
    GATE = ACT == "silu_gate"
    BM = 64 * WG
    ROWS = BM + (2 if GATE else 1) * ((BN + 63) // 64) * 64  # a stage: A, B (``load_slice``)
    ring = kaio.shared_dynamic(DT, (STAGES, ROWS, BK), 0)
    bars = kaio.shared_dynamic(u64, (2, STAGES), STAGES * ROWS * BK * 2)
    arrived = kaio.shared_dynamic(u32, (4,), STAGES * (ROWS * BK * 2 + 16))
    EB = STAGES * (ROWS * BK * 2 + 16) + 16 if VEC == 2 else 0  # unused: a stub over the ring
    ebuf = kaio.shared_dynamic(OUT, (4 * WG if VEC == 2 else 1, 16, BN + 8), EB)
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    x = kaio.block_idx_x()
    rank = i32(0)
    m0 = u32(0)
    n0 = u32(0)
    if PAIR == 0:
        origin = tile_origin(x, (M + BM - 1) // BM, (N + BN - 1) // BN)
        m0 = tile_row(origin) * BM
        n0 = tile_col(origin) * BN
    else:  # the pair's tiles: x // 2 in a grid of pairs, block x % 2 of it
        rank = i32(kaio.cluster_rank())
        if PAIR == 1:
            origin = tile_origin(x // 2, (M + 2 * BM - 1) // (2 * BM), (N + BN - 1) // BN)
            m0 = (2 * tile_row(origin) + u32(rank)) * BM
            n0 = tile_col(origin) * BN
        else:
            origin = tile_origin(x // 2, (M + BM - 1) // BM, (N + 2 * BN - 1) // (2 * BN))
            m0 = tile_row(origin) * BM
            n0 = (2 * tile_col(origin) + u32(rank)) * BN
    k_begin = kaio.block_idx_z() * k_slice
    k_end = kaio.min(k_begin + k_slice, K)
    k_tiles = i32((k_end - k_begin + BK - 1) // BK)
    init_ring(bars, t, STAGES, WG * (2 if PAIR else 1))  # "free": each consumer warpgroup's
    if PAIR:
        kaio.cluster_sync()  # the other block's barriers are ready before any copy
    acc = kaio.local(f32, (BN // 8, 2, 2))
    acc_u = kaio.local(f32, (BN // 8 if GATE else 1, 2, 2))
    s, ph = i32(0), u32(0)  # the ring position: stage, phase parity
    if wg < WG:  # the consumers
        mma_run(acc, acc_u, ring, bars, 0, k_tiles, s, ph, 0, wg, lt, STAGES, WG, BN, BT, ACT,
                PAIR, DT)  # fmt: skip
        finish(acc, acc_u, c, ws, bias, res, ebuf, m0, n0, M, N, wg, lt, BN, CH, SPLIT, BIAS, ACT,
               RES, DT, OUT, RT, VEC)  # fmt: skip
    elif t == WG * 128:  # the producer: each K slice, STAGES ahead at most
        for g in range(k_tiles):
            if g >= STAGES:  # stage s held slice g - STAGES: wait until the consumers freed it
                kaio.mbarrier_wait(bars, (1, s), ph ^ 1)
            k0 = i32(k_begin) + g * BK
            load_slice(ring, bars, ta, tb, s, i32(m0), i32(n0), k0, N, rank, WG, BN, BT, ACT,
                       PAIR, DT)  # fmt: skip
            s, ph = next_stage(s, ph, STAGES)
        if VEC == 4 and RES:  # the epilogue's residual rows into L2 while the last slices run
            prefetch_rows(res, m0, n0, M, N, BM, BN, RT)
    if FIXUP:  # the last of the tile's grid.z blocks to finish sums the slices, in order
        if last_arrival(counters, kaio.block_idx_x(), kaio.grid_dim_z(), arrived, t):
            sum_tile(c, ws, bias, res, m0, n0, M, N, kaio.grid_dim_z(), t, WG * 128 + 32, BM,
                     BN, BIAS, ACT, RES, DT, OUT, RT)  # fmt: skip
    if PAIR:
        kaio.cluster_sync()  # no block leaves while the other may still write to it


def eligible(a, b, n: int, k: int, transposed: bool) -> bool:
    """Whether TMA can read ``a`` and ``b`` (``_arrays.Operand``s): rows a multiple of 16
    bytes apart (K, and N for B [K, N], multiples of 8) and 16-byte aligned bases."""
    return k % 8 == 0 and (transposed or n % 8 == 0) and a.aligned(16) and b.aligned(16)


def shared_bytes(wg: int, bn: int, stages: int, gate: bool, vec: int = 0, size: int = 2) -> int:
    """The dynamic shared memory of ``gemm_wgmma``: the tile ring, its barriers and the
    K-split fixup's arrival count, and for ``vec`` 2 the warps' epilogue buffers (of
    ``size``-byte outputs)."""
    ring = stages * ((64 * wg + (2 if gate else 1) * -(-bn // 64) * 64) * BK * 2 + 16) + 16
    return ring + (4 * wg * 16 * (bn + 8) * size if vec == 2 else 0)


def vec_ok(n: int, split: int, plain: bool, vec: int = 1) -> bool:
    """Whether ``gemm_wgmma`` may store C with ``VEC`` ``vec``: 1 or 2 (whole 16-byte rows
    of 8 columns), a plain product (no bias, activation or residual), no K split, N a
    multiple of 8; 3 and 4 (the fused epilogue's loads first, ``store_fused``), no K
    split."""
    if vec in (3, 4):
        return split == 1
    return plain and split == 1 and n % 8 == 0


class Plan(NamedTuple):
    """A launch plan of ``gemm_wgmma``: ``WG`` warpgroups (64 * WG rows a tile), ``BN``
    columns a tile, a ring of ``stages``, ``split`` K slices (grid.z) and whether their sum
    is the fixup in the kernel (the last block of a tile to finish sums the slices in
    order: ``fixup``) or the separate ``_gemm.gemm_reduce`` kernel; ``pair``: 0, or blocks in
    clusters of two that share B (1) or A (2) (``gemm_wgmma``); ``vec``: its epilogue's
    stores (``gemm_wgmma``'s ``VEC``, where ``vec_ok``; else 0)."""

    wg: int
    bn: int
    stages: int
    split: int
    fixup: bool
    pair: int = 0
    vec: int = 0


def fixup_ok(n: int) -> bool:
    """Whether a K split of an ``n``-column product may be summed in the kernel (``FIXUP``):
    each 128-byte line of the f32 workspace then holds one tile's columns only (N a multiple
    of 32), so a block never reads a line it cached before its tile's slices were written."""
    return n % 32 == 0


def plan(m: int, n: int, k: int, sms: int, gate: bool = False) -> Plan:
    """The ``Plan`` of an ``m x n x k`` product on ``sms`` multiprocessors (the rules behind
    the measured table of ``linear.MEASURED``, which bench/gemm_plans.py checked on an
    H100): 64-row tiles (one warpgroup) up to M = 256, else 128; the widest N tile (256,
    128, 64; at most 128 for "silu_gate", whose two accumulator sets share the registers)
    whose tiles fill 90% of the multiprocessors, else 64; then, if the tiles fill fewer than
    half of them, a K split towards one block per multiprocessor, each slice at least 4
    steps of 64, summed by ``_gemm.gemm_reduce`` (measured faster than the in-kernel sum);
    as many stages as fit in shared memory (``stages_for``)."""
    wg = 1 if m <= 256 else 2
    rows = math.ceil(m / (64 * wg))
    widths = (128, 64) if gate else (256, 128, 64)
    bn = next((w for w in widths if rows * math.ceil(n / w) >= 0.9 * sms), 64)
    tiles = rows * math.ceil(n / bn)
    split = 1
    if tiles < sms / 2:
        split = max(1, min(sms // tiles, k // (4 * BK), 16))
    return Plan(wg, bn, stages_for(wg, bn, gate), split, False)


def stages_for(
    wg: int, bn: int, gate: bool, most: int | None = None, vec: int = 0, size: int = 2
) -> int:
    """As many ring stages as fit in shared memory, 2 to ``most`` (default: 12 for stages of
    16 KB, 64 x 64 tiles, else 6). Measured on an H100 (bench/gemm_plans.py --deep): at
    small M the bytes in flight set the speed, and 64 x 64 tiles ran at 0.95-0.99x cuBLAS
    at M = 64-128 of 4096 x 4096 with 12 stages against 0.86-0.88x with 6; wider tiles hold
    enough in 6 stages, and deeper rings of them were as fast or slower (0.88x against
    0.97x for 128 x 128 tiles at M = 128 of 10240 x 8192). ``vec`` 2: room left for the
    warps' epilogue buffers (of ``size``-byte outputs)."""
    if most is None:
        most = 12 if wg * 64 + bn <= 128 and not gate else 6
    room = SHARED_LIMIT - 16 - (shared_bytes(wg, bn, 0, gate, vec, size) - 16)
    return max(2, min(most, room // shared_bytes(wg, bn, 1, gate)))


def tensor_maps(a, b, m: int, k: int, wg: int, transposed: bool, rows: int = 0) -> tuple:
    """The TMA maps of A (an ``Operand`` of any rank, seen as [M, K]; boxes of ``rows``
    rows, default 64 * ``wg``) and B."""
    from kaio_ops import _arrays

    a2 = a.obj if len(a.shape) == 2 else _arrays.view(a.obj, a.kind, (m, k))
    box = (rows or 64 * wg, BK)
    return kaio.tensor_map_2d(a2, box, SW), kaio.tensor_map_2d(b.obj, (64, 64), SW)


def grid_tiles(m: int, n: int, wg: int, bn: int, pair: int) -> int:
    """The blocks along x of ``gemm_wgmma`` for an ``m x n`` C: its tiles, in whole pairs
    (``pair``: a tile row or column more where their count is odd)."""
    rows, cols = math.ceil(m / (64 * wg)), math.ceil(n / bn)
    if pair == 1:
        rows += rows % 2
    elif pair == 2:
        cols += cols % 2
    return rows * cols


def specializations() -> list:
    """(kernel, constexprs) of the Hopper GEMM variants to check with ptxas (sm_90)."""
    from kaio.types import bf16

    out = []
    for dt, ot, wg, bn, bt, act, split, pair, vec in (
        (f16, f16, 1, 64, 1, "none", 4, 0, 0),
        (f16, f16, 2, 256, 1, "gelu", 1, 0, 4),  # the fused epilogue's loads first (routed)
        (bf16, bf16, 2, 128, 1, "silu_gate", 1, 0, 0),
        (bf16, f16, 1, 128, 1, "silu_gate", 2, 0, 0),
        (f16, f32, 2, 128, 0, "none", 1, 0, 0),
        (bf16, bf16, 1, 64, 0, "silu", 3, 0, 0),
        (f16, f16, 2, 160, 0, "none", 1, 1, 0),  # widths not a multiple of 64, pairs
        (bf16, bf16, 1, 32, 1, "silu_gate", 4, 0, 0),
        (f16, f16, 2, 64, 0, "none", 1, 2, 0),
        (f16, f16, 2, 64, 0, "none", 1, 0, 1),  # wide stores, through shared memory
        (bf16, f32, 2, 256, 1, "none", 1, 0, 1),
        (f16, f16, 2, 64, 0, "none", 1, 0, 2),
        (bf16, f32, 1, 128, 1, "none", 1, 0, 2),
    ):
        stages = stages_for(wg, bn, act == "silu_gate", None, vec, ot.itemsize)
        consts = {"WG": wg, "BN": bn, "STAGES": stages, "BT": bt, "SPLIT": min(split, 2)}
        consts["FIXUP"] = int(split > 2)
        epi = {"BIAS": int(vec in (0, 3, 4)), "ACT": act, "RES": int(vec in (0, 3, 4))}
        epi["PAIR"] = pair
        epi |= {"VEC": vec, "CH": EPI_CHUNK}
        out.append((gemm_wgmma, {**consts, **epi, "DT": dt, "OUT": ot, "RT": ot}))
    return out
