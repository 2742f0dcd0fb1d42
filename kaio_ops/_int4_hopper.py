"""W4A16 on Hopper (sm_90a): ``out [M, N] = a [M, K] (f16) @ W`` with the int4 weights of
``matmul_int4`` (``W[k, n] = f16(scales[k // 128, n] * q)``) dequantized in the kernel, tile by
tile, into an f16 operand of ``wgmma``: the weights cross memory as their packed words
(K N / 2 bytes), never as an f16 copy. Two kernels:

``int4_swap`` (what ``matmul_int4`` runs, ``run``) computes C^T = W^T a^T, the roles of
Marlin and Machete: the dequantized weights are wgmma's A operand straight from registers
(``wgmma`` with A in registers), the activations its B operand from shared memory, so no
thread ever stores the f16 weights; see its docstring.

``int4_wgmma`` (the first design, kept for comparison: ``bench/int4_wgmma.py --variants``)
dequantizes into shared memory instead. A persistent block (one a multiprocessor) computes
``64 * WG x BN`` tiles of the output, one after another, with two kinds of warpgroups:

- a dequantizing warpgroup, whose thread 0 first issues, for each 64-deep K slice, the TMA
  copies of A's ``64 * WG x 64`` rows (128-byte swizzled, as ``kaio_ops._gemm_hopper``), the
  packed words of the slice (``8 x BN`` u32, unswizzled) and the slice's row of group scales
  (``BN`` f16) into a ``STAGES``-deep ring (barriers ``full`` / ``free``), ``STAGES - 2``
  slices ahead (the stage it refills was freed when the slice before the current one had its
  wgmmas issued: no wait on work not yet dequantized, so no deadlock). The warpgroup then
  turns each slice's words into the f16 tile ``BN x 64`` K-major in a second,
  ``DSTAGES``-deep ring (barriers ``ready`` / ``drained``): a thread takes a word (8 values
  of K of one column n), makes its four f16 pairs by the magic number
  (``_int4_decode.weight_pair``: ``(w >> 4 j) & 0x000F000F ^ 0x64086408`` is ``1032 + q``
  in each half, minus 1032, times the scale: ``f16(scale * q)`` rounded once, the op's
  weight), reorders them with ``prmt`` into k order and stores them as one 16-byte chunk of
  row n, chunk ``kw ^ (n % 8)`` (the 128-byte swizzle that ``wgmma``'s descriptor expects);
  ``fence.proxy.async`` then makes the stores visible to ``wgmma``;
- ``WG`` consumer warpgroups (64 rows each) run ``wgmma.m64n{BN}k16`` on A's tile and the
  f16 tile, one group of wgmmas in flight, free both stages of a slice when the group after
  it is issued (the last slice of a tile when the tile is done), and store the tile while
  the next tile's slices are copied and dequantized.

The dequantizing warpgroup works while the tensor cores multiply the slice before, so at
large M the kernel runs at the f16 ``wgmma`` rate with the weights read at a quarter of the
bytes; at small M (memory-bound) the grid is filled by splitting K over ``grid.z``
(``SPLIT`` slices, raw f32 partial tiles summed in a fixed order by
``kaio_ops._gemm.gemm_reduce``), or (``CL``) over a cluster of ``SPLIT`` blocks along x, one
tile a cluster, whose partial tiles are summed in rank order through distributed shared
memory (the ring, idle by then, holds them): no workspace and no second launch. Needs
N % 8 == 0 (TMA rows of the words and the scales a multiple of 16 bytes), K % 128 == 0, and
16-byte aligned operands (``fits``).
"""

# ruff: noqa: F821  (OUT in annotations is a dtype parameter, not a module name)
from __future__ import annotations

import math

import kaio
from kaio import bf16, f16, f16x2, f32, i32, u32, u64
from kaio_ops._attention_hopper import PRODUCER_REGS, consumer_registers
from kaio_ops._int4_decode import HIGH_HALVES, HIGH_TWICE, LOW_HALVES, LOW_TWICE, weight_pair
from kaio_ops._matmul_kernels import tile_col, tile_origin, tile_row

BK = 64  # K values a slice (one 128-byte swizzled row of f16 per tile row)
WORD_ROWS = BK // 8  # packed word rows a slice
SW = 128
SHARED_LIMIT = 227 * 1024
DEQUANT = 128  # the dequantizing warpgroup's threads


@kaio.gpu_func
def dequantize_slice(
    words: u32[:, :, :], sc: u32[:, :], bt: u32[:, :, :], s: i32, d: i32, dt: u32,
    BN: kaio.constexpr,
):  # fmt: skip
    """Thread ``dt`` of the dequantizing warpgroup: its ``BN / 16`` words of ring stage
    ``s`` (``words[s]`` [8, BN], scales ``sc[s]`` as f16 pairs [BN / 2]) made f16 into
    ``bt[d]`` [BN, 32 u32]: row n = 64 K values, 16-byte chunk kw at ``kw ^ (n % 8)``.
    Every load comes first: ptxas cannot tell the stores from the loads (one shared space),
    so loads after a store would wait for it, and a warp per scheduler would then expose
    each word's whole latency (measured on an H100: about 3000 cycles a slice, 3x the
    wgmmas')."""
    words_r = kaio.local(u32, BN // 16)
    scales_r = kaio.local(u32, BN // 16)
    for i in kaio.static_range(BN // 16):
        idx = dt + DEQUANT * i
        n = idx % BN
        words_r[i] = words[s, idx // BN, n]
        scales_r[i] = sc[s, n // 2] >> (16 * (n % 2))  # column n's scale in the low half
    for i in kaio.static_range(BN // 16):
        idx = dt + DEQUANT * i
        n = idx % BN
        kw = idx // BN
        scale = kaio.bitcast(kaio.prmt(scales_r[i], scales_r[i], LOW_TWICE), f16x2)
        v = kaio.local(u32, 4)  # (k j, k j + 4) for j = 0..3
        for j in kaio.static_range(4):
            v[j] = weight_pair(words_r[i], j, scale)
        chunk = kaio.local(u32, 4)  # (k 0, 1), (2, 3), (4, 5), (6, 7)
        chunk[0] = kaio.prmt(v[0], v[1], LOW_HALVES)
        chunk[1] = kaio.prmt(v[2], v[3], LOW_HALVES)
        chunk[2] = kaio.prmt(v[0], v[1], HIGH_HALVES)
        chunk[3] = kaio.prmt(v[2], v[3], HIGH_HALVES)
        kaio.store_vector(bt, (d, n, 4 * (kw ^ (n % 8))), chunk)


@kaio.gpu_func
def store_tile(
    acc: f32[:, :, :], c: OUT[:, :], ws: f32[:, :], m0: u32, n0: u32, wg: u32, lt: u32, M: u32,
    N: u32, BN: kaio.constexpr, SPLIT: kaio.constexpr, OUT: kaio.constexpr,
):  # fmt: skip
    """Warpgroup ``wg``'s 64 rows of the tile at (m0, n0): lane (g, t) of warp w holds rows
    16 w + g (+ 8), columns 8 j + 2 t (+ 1). Without a K split, rounded to OUT into ``c``;
    with one, the raw f32 sums into this slice's rows of ``ws`` [SPLIT * M, N]. N is even:
    each pair is one store."""
    lane = lt % 32
    for h in kaio.static_range(2):
        row = m0 + 64 * wg + 16 * (lt // 32) + lane // 4 + 8 * h
        if row < M:
            for j in kaio.static_range(BN // 8):
                col = n0 + 8 * j + 2 * (lane % 4)
                if col < N:
                    if SPLIT > 1:
                        raw = kaio.local(f32, 2)
                        raw[0] = acc[j, h, 0]
                        raw[1] = acc[j, h, 1]
                        kaio.store_vector(ws, (kaio.block_idx_z() * M + row, col), raw)
                    else:
                        pair = kaio.local(OUT, 2)
                        pair[0] = OUT(acc[j, h, 0])
                        pair[1] = OUT(acc[j, h, 1])
                        kaio.store_vector(c, (row, col), pair)


@kaio.gpu_kernel
def int4_wgmma(
    ta: kaio.tensormap, tw: kaio.tensormap, ts: kaio.tensormap, c: OUT[:, :], ws: f32[:, :],
    M: u32, N: u32, K: u32, k_slice: u32, WG: kaio.constexpr, BN: kaio.constexpr,
    STAGES: kaio.constexpr, DSTAGES: kaio.constexpr, SPLIT: kaio.constexpr,
    CL: kaio.constexpr, OCC: kaio.constexpr, OUT: kaio.constexpr,
):  # fmt: skip
    """c = a @ W (module docstring): block x computes tile x of c, or with a K split block
    (x, z) the raw partial tile of K slice z into ``ws``; with ``CL`` the K split is a
    cluster of SPLIT blocks along x, one tile each, summed through distributed shared memory
    (``cluster_sum``). ``ta``: a [M, K] in boxes of (64 * WG, 64), 128-byte swizzled;
    ``tw``: the words [K / 8, N] in boxes of (8, BN); ``ts``: the scales [K / 128, N] in
    boxes of (1, BN)."""
    kaio.launch_bounds(WG * 128 + DEQUANT, OCC)  # OCC blocks a multiprocessor
    if CL:
        kaio.cluster_dims(SPLIT)
    BM = 64 * WG
    A_BYTES = BM * BK * 2
    W_BYTES = WORD_ROWS * BN * 4
    S_BYTES = BN * 2
    B_BYTES = BN * BK * 2
    sa = kaio.shared_dynamic(f16, (STAGES, BM, BK), 0)
    sb = kaio.shared_dynamic(f16, (DSTAGES, BN, BK), STAGES * A_BYTES)
    bt = kaio.shared_dynamic(u32, (DSTAGES, BN, BK // 2), STAGES * A_BYTES)  # sb's words
    raw = STAGES * A_BYTES + DSTAGES * B_BYTES
    sw = kaio.shared_dynamic(u32, (STAGES, WORD_ROWS, BN), raw)
    ss = kaio.shared_dynamic(f16, (STAGES, BN), raw + STAGES * W_BYTES)
    sc = kaio.shared_dynamic(u32, (STAGES, BN // 2), raw + STAGES * W_BYTES)  # ss's pairs
    # rows: 0 "full" (TMA), 1 "free" (A, words), 2 "ready" (f16 tile), 3 "drained" (f16 tile)
    bars = kaio.shared_dynamic(u64, (4, STAGES), raw + STAGES * (W_BYTES + S_BYTES))
    part = kaio.shared_dynamic(f32, (BM, BN), 0)  # CL: a partial tile, over the idle ring
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    grid_m = (M + BM - 1) // BM
    grid_n = (N + BN - 1) // BN
    first = kaio.block_idx_x()
    step = kaio.grid_dim_x()
    k_begin = kaio.block_idx_z() * k_slice
    if CL:  # a cluster per tile, its blocks the K slices
        first = first // SPLIT
        step = step // SPLIT
        k_begin = kaio.cluster_rank() * k_slice
    my_tiles = i32((grid_m * grid_n - first + step - 1) // step)
    k_end = kaio.min(k_begin + k_slice, K)
    k_tiles = i32((k_end - k_begin + BK - 1) // BK)
    if t == 0:
        for i in kaio.static_range(STAGES):
            kaio.mbarrier_init(bars, (0, i), 1)
            kaio.mbarrier_init(bars, (1, i), WG)
        for i in kaio.static_range(DSTAGES):
            kaio.mbarrier_init(bars, (2, i), DEQUANT // 32)
            kaio.mbarrier_init(bars, (3, i), WG)
        kaio.fence_proxy_async()
    kaio.sync_threads()
    acc = kaio.local(f32, (BN // 8, 2, 2))
    at = kaio.local(i32, 4)  # the current slice's ring positions (``advance``)
    for i in kaio.static_range(4):
        at[i] = 0
    if wg < WG:  # the consumers
        ps = i32(0)  # the stages of the slice before
        pd = i32(0)
        for i in range(my_tiles):
            origin = tile_origin(first + u32(i) * step, grid_m, grid_n)
            for kt in range(k_tiles):
                s = at[0]
                d = at[2]
                kaio.mbarrier_wait(bars, (0, s), u32(at[1]))
                kaio.mbarrier_wait(bars, (2, d), u32(at[3]))
                kaio.wgmma_fence()
                for kk in kaio.static_range(BK // 16):
                    da = kaio.smem_descriptor(sa, (s, 64 * wg, kk * 16), SW, 16, 1024)
                    db = kaio.smem_descriptor(sb, (d, 0, kk * 16), SW, 16, 1024)
                    kaio.wgmma_f16(acc, da, db, kt + kk > 0)
                kaio.wgmma_commit()
                kaio.wgmma_wait(1)
                if kt > 0 and lt == 0:  # the slice before's wgmmas are done: free its stages
                    kaio.mbarrier_arrive(bars, (1, ps))
                    kaio.mbarrier_arrive(bars, (3, pd))
                ps = s
                pd = d
                advance(at, STAGES, DSTAGES)
            kaio.wgmma_wait(0)
            if lt == 0:  # the tile's last slice
                kaio.mbarrier_arrive(bars, (1, ps))
                kaio.mbarrier_arrive(bars, (3, pd))
            m0 = tile_row(origin) * BM
            n0 = tile_col(origin) * BN
            if not CL:  # (with CL the one tile is summed below: cluster_sum)
                store_tile(acc, c, ws, m0, n0, wg, lt, M, N, BN, SPLIT, OUT)
    else:  # the dequantizing warpgroup; its thread 0 also issues the copies
        total = my_tiles * k_tiles  # the block's slices, tile after tile
        if lt == 0:
            for j in range(kaio.min(total, STAGES - 2)):
                produce(sa, sw, ss, bars, ta, tw, ts, j, k_tiles, k_begin, first, step, grid_m,
                        grid_n, BM, BN, STAGES)  # fmt: skip
        for j in range(total):
            # slice j + STAGES - 2 reuses the stage of slice j - 2, which the consumers
            # free once slice j - 1 (dequantized before this) has its wgmmas issued
            if lt == 0 and j + STAGES - 2 < total:
                produce(sa, sw, ss, bars, ta, tw, ts, j + STAGES - 2, k_tiles, k_begin, first,
                        step, grid_m, grid_n, BM, BN, STAGES)  # fmt: skip
            kaio.mbarrier_wait(bars, (0, at[0]), u32(at[1]))
            if j >= DSTAGES:  # the f16 tile held slice j - DSTAGES: wait until it is read
                kaio.mbarrier_wait(bars, (3, at[2]), u32(at[3] ^ 1))
            dequantize_slice(sw, sc, bt, at[0], at[2], lt, BN)
            kaio.fence_proxy_async()  # this thread's stores, for wgmma
            kaio.sync_warp()
            if lt % 32 == 0:  # a warp's stores in one arrival (not 32 on one barrier)
                kaio.mbarrier_arrive(bars, (2, at[2]))
            advance(at, STAGES, DSTAGES)
    if CL:  # one tile a cluster: sum its K slices through distributed shared memory
        kaio.sync_threads()  # every wgmma done: the ring is idle
        if wg < WG:
            put_partial(acc, part, wg, lt, BN)
        kaio.cluster_sync()
        origin = tile_origin(first, grid_m, grid_n)
        cluster_sum(part, c, tile_row(origin) * BM, tile_col(origin) * BN, t, M, N, BM, BN,
                    WG * 128 + DEQUANT, SPLIT, OUT)  # fmt: skip
        kaio.cluster_sync()  # no block leaves while another reads its part


@kaio.gpu_func
def put_partial(acc: f32[:, :, :], part: f32[:, :], wg: u32, lt: u32, BN: kaio.constexpr):
    """Warpgroup ``wg``'s 64 rows of the tile's partial sums into ``part`` [BM, BN] (lane
    (g, t) of warp w holds rows 16 w + g (+ 8), columns 8 j + 2 t (+ 1))."""
    lane = lt % 32
    for h in kaio.static_range(2):
        row = 64 * wg + 16 * (lt // 32) + lane // 4 + 8 * h
        for j in kaio.static_range(BN // 8):
            for e in kaio.static_range(2):
                part[row, 8 * j + 2 * (lane % 4) + e] = acc[j, h, e]


@kaio.gpu_func
def cluster_sum(
    part: f32[:, :], c: OUT[:, :], m0: u32, n0: u32, t: u32, M: u32, N: u32,
    BM: kaio.constexpr, BN: kaio.constexpr, THREADS: kaio.constexpr, SPLIT: kaio.constexpr,
    OUT: kaio.constexpr,
):  # fmt: skip
    """The K split of a cluster, once every block's partial ``BM x BN`` tile (at (m0, n0)
    of c) is in its ``part``: block ``r`` sums rows ``r``, ``r + SPLIT``, ... of the tile
    over the cluster's blocks in rank order (the same result run to run) and stores them,
    thread ``t`` of the block taking every ``THREADS``-th element."""
    rank = kaio.cluster_rank()
    for i in range(t, (BM + SPLIT - 1) // SPLIT * BN, THREADS):
        r = i // BN * SPLIT + rank
        col = i % BN
        if r < BM and m0 + r < M and n0 + col < N:
            total = kaio.cluster_load(part, (r, col), 0)
            for q in kaio.static_range(1, SPLIT):
                total += kaio.cluster_load(part, (r, col), q)
            c[m0 + r, n0 + col] = OUT(total)


@kaio.gpu_func
def advance(at: i32[:], STAGES: kaio.constexpr, DSTAGES: kaio.constexpr):
    """Step the ring positions ``at`` = (raw stage, its phase, f16 tile, its phase) to the
    next slice."""
    at[0] += 1
    if at[0] == STAGES:
        at[0] = 0
        at[1] ^= 1
    at[2] += 1
    if at[2] == DSTAGES:
        at[2] = 0
        at[3] ^= 1


@kaio.gpu_func
def produce(
    sa: f16[:, :, :], sw: u32[:, :, :], ss: f16[:, :], bars: u64[:, :], ta: kaio.tensormap,
    tw: kaio.tensormap, ts: kaio.tensormap, j: i32, k_tiles: i32, k_begin: u32, first: u32,
    step: u32, grid_m: u32, grid_n: u32, BM: kaio.constexpr, BN: kaio.constexpr,
    STAGES: kaio.constexpr,
):  # fmt: skip
    """The TMA copies of the block's slice ``j`` (K slice ``j % k_tiles`` of its tile
    ``first + (j // k_tiles) * step``: A rows, words, the scale row) into stage
    ``j % STAGES``, once the consumers freed the slice that stage held before."""
    s = j % STAGES
    if j >= STAGES:
        kaio.mbarrier_wait(bars, (1, s), u32((j // STAGES - 1) & 1))
    tile = first + u32(j // k_tiles) * step
    origin = tile_origin(tile, grid_m, grid_n)
    m0 = i32(tile_row(origin) * BM)
    n0 = i32(tile_col(origin) * BN)
    k0 = i32(k_begin) + j % k_tiles * BK
    kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32(BM * BK * 2 + WORD_ROWS * BN * 4 + BN * 2))
    kaio.tma_load_2d(sa, (s, 0, 0), ta, m0, k0, bars, (0, s))
    kaio.tma_load_2d(sw, (s, 0, 0), tw, k0 // 8, n0, bars, (0, s))
    kaio.tma_load_2d(ss, (s, 0), ts, k0 // 128, n0, bars, (0, s))


def fits(a, b, s) -> bool:
    """Whether ``int4_wgmma`` takes activations ``a`` [M, K] and the words ``b`` [K/8, N]
    and scales ``s`` [K/128, N] (``_arrays.Operand``s; K % 128 == 0 is the op's contract):
    N % 8 == 0 and every base 16-byte aligned (TMA rows and boxes)."""
    n = b.shape[1]
    return n % 8 == 0 and a.aligned(16) and b.aligned(16) and s.aligned(16)


def shared_bytes(wg: int, bn: int, stages: int, dstages: int) -> int:
    """The dynamic shared memory of ``int4_wgmma``: the two rings and their barriers."""
    per_stage = 64 * wg * BK * 2 + WORD_ROWS * bn * 4 + bn * 2
    return stages * per_stage + dstages * bn * BK * 2 + 4 * stages * 8


# By M (the first row whose bound M does not pass): (WG, the N tiles to try, widest first,
# the N tile when none fills the GPU, blocks a multiprocessor, K split in a cluster).
# Measured on an H100 (round of 2026-11-26, bench/int4_wgmma.py --variants): the best
# geometric mean over N x K = 4096x4096, 14336x4096, 4096x14336 at each M.
PLANS = (
    (64, 1, (256, 128, 64), 256, 1, 0),  # (only when the decode kernel cannot take it)
    (128, 2, (256, 128, 64), 128, 1, 0),
    (512, 2, (256,), 256, 1, 0),
    (1 << 62, 4, (128,), 128, 1, 0),  # 256 x 128 tiles: 0.59-0.63x cuBLAS f16 past 512
)


def plan(m: int, n: int, k: int, sms: int) -> tuple:
    """(WG, BN, STAGES, DSTAGES, split, CL, OCC) for an ``m x n x k`` product on ``sms``
    multiprocessors, from the row of ``PLANS`` for M: the widest N tile that gives every
    block slot (``OCC * sms``) a tile, else the row's fallback tile; then, if the tiles leave
    slots idle, a K split towards one block each, each slice at least 4 steps of 64 (at most
    8 in a cluster, else 16); two f16 tiles and as many raw stages as fit (at most 8)."""
    _, wg, widths, fallback, occ, cl = next(row for row in PLANS if m <= row[0])
    slots = occ * sms
    rows = math.ceil(m / (64 * wg))
    bn = next((w for w in widths if rows * math.ceil(n / w) >= slots), fallback)
    tiles = rows * math.ceil(n / bn)
    split = 1
    if tiles < slots:
        split = max(1, min(slots // tiles, k // (4 * BK), 8 if cl else 16))
    return wg, bn, stages_for(wg, bn, 2, occ), 2, split, cl, occ


def stages_for(wg: int, bn: int, dstages: int, occ: int = 1) -> int:
    """The raw stages (A rows, words, scales) that fit in shared memory beside ``dstages``
    f16 tiles, at most 8, with ``occ`` blocks a multiprocessor."""
    fixed = shared_bytes(wg, bn, 0, dstages)
    limit = SHARED_LIMIT if occ == 1 else 228 * 1024 // occ - 1024  # 1 KB a block: the system's
    return max(2, min(8, (limit - fixed) // shared_bytes(wg, bn, 1, 0)))


IN_SIMULATOR = False  # tests set it to run this kernel on the simulator
DECODE_M = 16  # up to this M the decode kernel (``_int4_decode``)
# From this M the f16 copy of the weight and the f16 wgmma matmul (``_prefill``); none: past
# DECODE_M every M runs int4_swap.
PREFILL_M = 1 << 62

# int4_swap's tiles by M (the first row whose bound M does not pass): (WG, BM; 0: M rounded
# up to 8, CL: a K split summed in a cluster, else by gemm_reduce). Measured on an H100
# (bench/int4_wgmma.py --swap, 2026-11-26): up to 64 rows the workspace split was 1.5-2x
# faster than the cluster's.
SWAP_PLANS = (
    (64, 4, 0, 0),
    (128, 2, 0, 1),
    (256, 2, 0, 1),
    (1 << 62, 2, 256, 1),
)


def swap_plan(m: int) -> tuple:
    """``int4_swap``'s (WG, BM, STAGES, split, CL) for M = ``m`` (``SWAP_PLANS``; as many
    stages as fit, ``swap_split``'s split)."""
    _, wg, bm, cl = next(row for row in SWAP_PLANS if m <= row[0])
    return wg, bm or min(256, -(-m // 8) * 8), 0, 0, cl


def takes(a, b, s) -> bool:
    """Whether ``matmul_int4`` runs a kernel of this module (``run``) for activations ``a``
    [M, K], words ``b`` and scales ``s`` (``_arrays.Operand``s): ``DECODE_M`` < M <
    ``PREFILL_M``, operands that ``fits``, and an sm_90 GPU (``KAIO_HOPPER_MATMUL=0`` opts
    out, as for the f16 matmuls), or under the simulator when ``IN_SIMULATOR``."""
    from kaio.sim.mode import active as simulating
    from kaio_ops.matmul import _hopper

    on = IN_SIMULATOR if simulating() else _hopper(a)
    return on and DECODE_M < a.shape[0] < PREFILL_M and fits(a, b, s)


def run(a, b, s, out_type):
    """``a @ W`` rounded to ``out_type`` for operands that this module ``takes``:
    ``int4_swap`` with ``swap_plan``'s tiles."""
    return launch_swap(a, b, s, out_type, swap_plan(a.shape[0]))


def finish(a, ws, split: int, out_type):
    """A new [M, N] array of ``out_type``: the sum of the ``split`` f32 partial products
    stacked in ``ws`` [split * M, N] (for ``a`` [M, K], an ``_arrays.Operand``), in slice
    order; ``split`` 1 converts an f32 result. ``kaio_ops._gemm.gemm_reduce`` does it."""
    from kaio_ops import _arrays
    from kaio_ops._gemm import REDUCE
    from kaio_ops.linear import _placeholder

    m, n = a.shape[0], ws.shape[1]
    c = _arrays.output(a, (m, n), out_type)
    REDUCE[(math.ceil(m * n / 256), 256, _arrays.stream_of(a), 0)](
        ws, _arrays.output_arg(a, c, (m, n), out_type), _placeholder(a, f16, 1),
        _placeholder(a, out_type, 2), m, n, SPLIT=split, BIAS=0, ACT="none", RES=0,
        DT=f16, OUT=out_type, RT=out_type,
    )  # fmt: skip
    return c


def launch(a, b, s, out_type, config: tuple | None = None, sms: int | None = None):
    """``a @ W`` rounded to ``out_type`` (a new [M, N] array of ``a``'s kind) for checked
    operands that ``fits``: ``a`` f16 [M, K], the words ``b`` [K/8, N] and the scales ``s``
    [K/128, N] (``_arrays.Operand``s), with ``config`` (``plan``'s tuple; default: ``plan``'s
    choice; a sixth element ``CL``, a seventh ``OCC``, blocks a multiprocessor) on a
    persistent grid of at most ``OCC * sms`` blocks (``sms`` default: the GPU's
    multiprocessors); a second launch sums the slices of a workspace K split (``finish``)."""
    from kaio_ops import _arrays
    from kaio_ops.linear import _placeholder
    from kaio_ops.matmul import k_slices

    m, k = a.shape
    n = b.shape[1]
    sms = sms or _arrays.multiprocessors(a)
    wg, bn, stages, dstages, split, *extra = config or plan(m, n, k, sms)
    cl = extra[0] if extra else 0
    occ = extra[1] if len(extra) > 1 else 1
    split, k_slice = k_slices(k, split, BK)
    cl = int(bool(cl) and split > 1)
    if split > 1 and not cl:
        c = _arrays.output(a, (split * m, n), f32)
        ws, target = c, _placeholder(a, out_type, 2)
    else:
        c = _arrays.output(a, (m, n), out_type)
        ws, target = _placeholder(a, f32, 2), _arrays.output_arg(a, c, (m, n), out_type)
    maps = (
        kaio.tensor_map_2d(a.obj, (64 * wg, BK), SW),
        kaio.tensor_map_2d(b.obj, (WORD_ROWS, bn), 0),
        kaio.tensor_map_2d(s.obj, (1, bn), 0),
    )
    tiles = math.ceil(m / (64 * wg)) * math.ceil(n / bn)
    blocks = min(tiles, occ * sms)
    grid = (tiles * split, 1, 1) if cl else (blocks, 1, split)  # a cluster: one tile
    threads = 128 * wg + DEQUANT
    shared = shared_bytes(wg, bn, stages, dstages)
    int4_wgmma[grid, threads, _arrays.stream_of(a), shared](
        *maps, target, ws, m, n, k, k_slice, WG=wg, BN=bn, STAGES=stages, DSTAGES=dstages,
        SPLIT=split, CL=cl, OCC=occ, OUT=out_type,
    )  # fmt: skip
    return finish(a, c, split, out_type) if split > 1 and not cl else c


def specializations() -> list:
    """(kernel, constexprs) of the variants to check with ptxas (sm_90a): both consumer
    counts, every N tile, a K split through the workspace and one through a cluster, every
    output type."""
    out = []
    for wg, bn, split, cl, ot in (
        (1, 256, 8, 0, f32),
        (1, 128, 1, 0, f16),
        (2, 256, 1, 0, f32),
        (2, 128, 4, 1, bf16),
        (2, 64, 2, 0, f16),
        (1, 128, 4, 0, f32),  # two blocks a multiprocessor
    ):
        occ = 2 if (wg, bn, split) == (1, 128, 4) else 1
        stages = stages_for(wg, bn, 2, occ)
        consts = {"WG": wg, "BN": bn, "STAGES": stages, "DSTAGES": 2, "SPLIT": split, "CL": cl,
                  "OCC": occ, "OUT": ot}  # fmt: skip
        out.append((int4_wgmma, consts))
    return out


# ---------------------------------------------------------------- the role swap (register A)
# C^T = W^T a^T: the dequantized weights are wgmma's A operand, straight from registers, and the
# activations its B operand from shared memory (module docstring of ``int4_swap``).
SWAP_MAGIC = 0x54806408  # low half: 1024 + (lo nibble ^ 8); high half: 64 + (hi nibble ^ 8)
SWAP_MASK = 0x00F0000F  # the low nibble of byte 0 and the high nibble of byte 2


@kaio.gpu_func
def nibble_pair(word: u32, sel: u32, scale: f16x2) -> u32:
    """The two nibbles of byte ``t`` of ``word`` (``sel`` = ``t * 0x1111``: that byte in
    every byte) as the f16 pair ``scale * q`` (low nibble in the low half): the low nibble
    lands in the mantissa of 1024 (ulp 1), the high one four bits up in that of 64 (ulp
    1/16), each biased by 8 (the sign bit flipped); one subtraction makes q exact, one
    multiplication rounds ``scale * q`` once."""
    biased = kaio.bitcast((kaio.prmt(word, word, sel) & SWAP_MASK) ^ SWAP_MAGIC, f16x2)
    return kaio.bitcast((biased - kaio.bitcast(u32(SWAP_MAGIC), f16x2)) * scale, u32)


@kaio.gpu_func
def swap_slice(
    sw: u32[:, :, :], sc: u32[:, :], sx: f16[:, :, :], bars: u64[:, :], acc: f32[:, :, :],
    af: u32[:, :, :], at: i32[:], kt: i32, nl: u32, sel: u32, lt: u32, BUF: kaio.constexpr,
    STAGES: kaio.constexpr,
):  # fmt: skip
    """One 64-deep K slice of a consumer warpgroup: wait for ring stage ``at[0]``, make the
    A fragments of its 4 steps (buffer ``BUF`` of ``af``) from the words of columns ``nl``
    and ``nl + 1`` (this lane's rows g and g + 8), issue the 4 wgmmas on the activations'
    tile, and free the stage of the slice before (``at[2]``) once its wgmmas are done."""
    s = at[0]
    kaio.mbarrier_wait(bars, (0, s), u32(at[1]))
    words = kaio.local(u32, (WORD_ROWS, 2))  # words[kw, h]: column nl + h, K 8 kw .. 8 kw + 7
    for kw in kaio.static_range(WORD_ROWS):
        kaio.load_vector(words[kw], sw, (s, kw, nl))
    kaio.fence_proxy_async()  # the reads before the stage's next TMA copy
    pair = sc[s, nl // 2]
    scale = kaio.local(u32, 2)
    scale[0] = kaio.prmt(pair, pair, LOW_TWICE)
    scale[1] = kaio.prmt(pair, pair, HIGH_TWICE)
    for kk in kaio.static_range(BK // 16):
        for r in kaio.static_range(4):  # (row g, k 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)
            af[BUF, kk, r] = nibble_pair(
                words[2 * kk + r // 2, r % 2], sel, kaio.bitcast(scale[r % 2], f16x2)
            )
    kaio.wgmma_fence()
    for kk in kaio.static_range(BK // 16):
        db = kaio.smem_descriptor(sx, (s, 0, kk * 16), SW, 16, 1024)
        kaio.wgmma_f16(acc, af[BUF, kk], db, kt + kk > 0)
    kaio.wgmma_commit()
    kaio.wgmma_wait(1)
    if kt > 0 and lt == 0:  # the slice before's wgmmas are done: free its stage
        kaio.mbarrier_arrive(bars, (1, at[2]))
    at[2] = s
    at[0] += 1
    if at[0] == STAGES:
        at[0] = 0
        at[1] ^= 1


@kaio.gpu_func
def store_swapped(
    acc: f32[:, :, :], c: OUT[:, :], ws: f32[:, :], m0: u32, n: u32, lt: u32, M: u32, N: u32,
    BM: kaio.constexpr, SPLIT: kaio.constexpr, OUT: kaio.constexpr,
):  # fmt: skip
    """This lane's part of C^T's tile: acc[j, h, e] is c[m0 + 8 j + 2 t + e, n + h]
    (columns n, n + 1 adjacent: one store a pair). Without a K split rounded to OUT into
    ``c``; with one the raw f32 sums into this slice's rows of ``ws`` [SPLIT * M, N]."""
    if n < N:  # N % 8 == 0 and n even: n + 1 < N too
        for j in kaio.static_range(BM // 8):
            for e in kaio.static_range(2):
                m = m0 + 8 * j + 2 * (lt % 4) + e
                if m < M:
                    if SPLIT > 1:
                        raw = kaio.local(f32, 2)
                        raw[0] = acc[j, 0, e]
                        raw[1] = acc[j, 1, e]
                        kaio.store_vector(ws, (kaio.block_idx_z() * M + m, n), raw)
                    else:
                        out = kaio.local(OUT, 2)
                        out[0] = OUT(acc[j, 0, e])
                        out[1] = OUT(acc[j, 1, e])
                        kaio.store_vector(c, (m, n), out)


@kaio.gpu_kernel
def int4_swap(
    tx: kaio.tensormap, tw: kaio.tensormap, ts: kaio.tensormap, c: OUT[:, :], ws: f32[:, :],
    M: u32, N: u32, K: u32, k_slice: u32, WG: kaio.constexpr, BM: kaio.constexpr,
    STAGES: kaio.constexpr, SPLIT: kaio.constexpr, CL: kaio.constexpr, REGS: kaio.constexpr,
    OUT: kaio.constexpr,
):  # fmt: skip
    """c = a @ W as C^T = W^T a^T, the Marlin / Machete design on wgmma: a persistent block
    computes ``BM x 64 WG`` tiles of c (BM rows of a, 64 WG columns of W) with ``WG``
    consumer warpgroups and a producer warpgroup, whose thread 0 copies each 64-deep K
    slice by TMA into a ``STAGES``-deep ring: a's ``BM x 64`` rows (128-byte swizzled, wgmma's
    B operand, K-major), the words ``8 x 64 WG`` and the scale row. Consumer warpgroup wg owns
    W's columns ``64 wg .. 64 wg + 63`` of the tile as the 64 rows of its ``m64n{BM}k16``
    wgmmas, row 16 w + g + 8 h (warp w, lane 4 g + t) being column ``16 w + 2 g + h``: a
    lane reads its two columns' 8 words of the slice in 8-byte loads and makes its A
    fragments in registers (``nibble_pair``: byte t of a word is k 2t, 2t + 1, exactly the
    fragment's pairs), two slices' fragments alternating so that a slice is dequantized
    while the wgmmas of the one before run. No f16 copy of the weight, in memory or in shared
    memory. With a K split (``grid.z``) the raw f32 partial tiles go to ``ws`` and
    ``finish`` sums them (``SPLIT`` 2 for any split, 1 for none: one specialization for
    every split); with ``CL`` the K split is a cluster of ``SPLIT`` blocks along x, one tile
    each, summed through distributed shared memory (``cluster_sum``). ``tx``: a [M, K] in
    boxes (BM, 64); ``tw``: the words [K / 8, N] in boxes (8, 64 WG); ``ts``: the scales
    [K / 128, N] in boxes (1, 64 WG). ``REGS``: the registers a consumer thread takes
    (``setmaxnreg``; 0: none)."""
    kaio.launch_bounds(WG * 128 + 128, 1)
    if CL:
        kaio.cluster_dims(SPLIT)
    BNW = 64 * WG
    X_BYTES = BM * BK * 2
    W_BYTES = WORD_ROWS * BNW * 4
    S_BYTES = BNW * 2
    sx = kaio.shared_dynamic(f16, (STAGES, BM, BK), 0)
    sw = kaio.shared_dynamic(u32, (STAGES, WORD_ROWS, BNW), STAGES * X_BYTES)
    ss = kaio.shared_dynamic(f16, (STAGES, BNW), STAGES * (X_BYTES + W_BYTES))
    sc = kaio.shared_dynamic(u32, (STAGES, BNW // 2), STAGES * (X_BYTES + W_BYTES))  # ss pairs
    # rows: 0 "full" (TMA), 1 "free" (the slice's wgmmas done), 2 (CL): every wgmma done
    bars = kaio.shared_dynamic(u64, (3, STAGES), STAGES * (X_BYTES + W_BYTES + S_BYTES))
    part = kaio.shared_dynamic(f32, (BM, BNW), 0)  # CL: the partial tile, over the idle ring
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    grid_m = (M + BM - 1) // BM
    grid_n = (N + BNW - 1) // BNW
    first = kaio.block_idx_x()
    step = kaio.grid_dim_x()
    k_begin = kaio.block_idx_z() * k_slice
    if CL:  # a cluster per tile, its blocks the K slices
        first = first // SPLIT
        step = step // SPLIT
        k_begin = kaio.cluster_rank() * k_slice
    my_tiles = i32((grid_m * grid_n - first + step - 1) // step)
    k_end = kaio.min(k_begin + k_slice, K)
    k_tiles = i32((k_end - k_begin + BK - 1) // BK)
    if t == 0:
        for i in kaio.static_range(STAGES):
            kaio.mbarrier_init(bars, (0, i), 1)
            kaio.mbarrier_init(bars, (1, i), WG)
        kaio.mbarrier_init(bars, (2, 0), WG * 128)
        kaio.fence_proxy_async()
    kaio.sync_threads()
    if wg < WG:  # the consumers
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        acc = kaio.local(f32, (BM // 8, 2, 2))
        lane = lt % 32
        nl = 64 * wg + 16 * (lt // 32) + 2 * (lane // 4)  # this lane's columns nl, nl + 1
        af = kaio.local(u32, (2, BK // 16, 4))  # two slices' A fragments
        at = kaio.local(i32, 3)  # (ring stage, its phase, the stage of the slice before)
        for i in kaio.static_range(3):
            at[i] = 0
        sel = (lane % 4) * 0x1111
        for i in range(my_tiles):
            origin = tile_origin(first + u32(i) * step, grid_m, grid_n)
            # slices in pairs, the fragments alternating; an odd last slice after every
            # wgmma is done (ptxas serializes all wgmmas if any path could redefine the
            # registers of one in flight)
            for kt in range(0, k_tiles - 1, 2):
                swap_slice(sw, sc, sx, bars, acc, af, at, kt, nl, sel, lt, 0, STAGES)
                swap_slice(sw, sc, sx, bars, acc, af, at, kt + 1, nl, sel, lt, 1, STAGES)
            if k_tiles % 2:
                kaio.wgmma_wait(0)
                swap_slice(sw, sc, sx, bars, acc, af, at, k_tiles - 1, nl, sel, lt, 0, STAGES)
            kaio.wgmma_wait(0)
            if lt == 0:  # the tile's last slice
                kaio.mbarrier_arrive(bars, (1, at[2]))
            if not CL:  # (with CL the one tile is summed below: cluster_sum)
                n = tile_col(origin) * BNW + nl
                store_swapped(acc, c, ws, tile_row(origin) * BM, n, lane, M, N, BM, SPLIT, OUT)
        if CL:  # the one tile's partial sums, over the ring once every wgmma is done
            kaio.mbarrier_arrive(bars, (2, 0))
            kaio.mbarrier_wait(bars, (2, 0), u32(0))
            for j in kaio.static_range(BM // 8):  # acc[j, h, e]: row 8 j + 2 t + e, column nl + h
                for e in kaio.static_range(2):
                    for h in kaio.static_range(2):
                        part[8 * j + 2 * (lane % 4) + e, nl + h] = acc[j, h, e]
    else:  # the producer warpgroup's first thread: the TMA copies, slice after slice
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            produce_swapped(sx, sw, ss, bars, tx, tw, ts, my_tiles * k_tiles, k_tiles, k_begin,
                            first, step, grid_m, grid_n, BM, WG, STAGES)  # fmt: skip
    if CL:  # one tile a cluster: sum its K slices through distributed shared memory
        kaio.cluster_sync()
        origin = tile_origin(first, grid_m, grid_n)
        cluster_sum(part, c, tile_row(origin) * BM, tile_col(origin) * BNW, t, M, N, BM, BNW,
                    WG * 128 + 128, SPLIT, OUT)  # fmt: skip
        kaio.cluster_sync()  # no block leaves while another reads its part


@kaio.gpu_func
def produce_swapped(
    sx: f16[:, :, :], sw: u32[:, :, :], ss: f16[:, :], bars: u64[:, :], tx: kaio.tensormap,
    tw: kaio.tensormap, ts: kaio.tensormap, total: i32, k_tiles: i32, k_begin: u32, first: u32,
    step: u32, grid_m: u32, grid_n: u32, BM: kaio.constexpr, WG: kaio.constexpr,
    STAGES: kaio.constexpr,
):  # fmt: skip
    """``int4_swap``'s copies: the block's ``total`` slices (``k_tiles`` a tile) into the
    ring, each stage once the consumers freed the slice it held before."""
    BNW = 64 * WG
    X_BYTES = BM * BK * 2
    W_BYTES = WORD_ROWS * BNW * 4
    for j in range(total):
        s = j % STAGES
        if j >= STAGES:
            kaio.mbarrier_wait(bars, (1, s), u32((j // STAGES - 1) & 1))
        origin = tile_origin(first + u32(j // k_tiles) * step, grid_m, grid_n)
        k0 = i32(k_begin) + j % k_tiles * BK
        kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32(X_BYTES + W_BYTES + BNW * 2))
        kaio.tma_load_2d(sx, (s, 0, 0), tx, i32(tile_row(origin) * BM), k0, bars, (0, s))
        kaio.tma_load_2d(sw, (s, 0, 0), tw, k0 // 8, i32(tile_col(origin) * BNW), bars,
                         (0, s))  # fmt: skip
        kaio.tma_load_2d(ss, (s, 0), ts, k0 // 128, i32(tile_col(origin) * BNW), bars,
                         (0, s))  # fmt: skip


def swap_shared_bytes(wg: int, bm: int, stages: int, cl: int = 0) -> int:
    """The dynamic shared memory of ``int4_swap``: the ring and its barriers. With ``cl``
    the f32 partial tile that a cluster's K split keeps over the ring must not reach the
    barriers (a producer may still be reading one)."""
    ring = stages * (swap_stage_bytes(wg, bm) - 24)
    if cl and bm * 64 * wg * 4 > ring:
        raise ValueError(
            f"int4_swap: the {bm} x {64 * wg} f32 partial tile does not fit in the {stages}-stage "
            "ring: use more stages"
        )
    return stages * swap_stage_bytes(wg, bm)


def swap_stage_bytes(wg: int, bm: int) -> int:
    """One stage of ``int4_swap``'s ring: a's rows, the words, the scale row, 3 barriers."""
    return bm * BK * 2 + WORD_ROWS * 64 * wg * 4 + 64 * wg * 2 + 24


def swap_stages(wg: int, bm: int) -> int:
    """The ring stages of ``int4_swap`` that fit in shared memory, at most 8."""
    return max(2, min(8, SHARED_LIMIT // swap_stage_bytes(wg, bm)))


def swap_split(tiles: int, k: int, sms: int) -> int:
    """The K split of ``int4_swap`` for ``tiles`` output tiles: none when they fill the
    ``sms`` multiprocessors, else towards one block each, every slice at least 4 steps of
    64, at most 8 slices (a cluster)."""
    if tiles >= sms:
        return 1
    return max(1, min(sms // tiles, k // (4 * BK), 8))


def swap_launch_plan(m: int, n: int, k: int, config: tuple, sms: int, out_type) -> tuple:
    """(split, k_slice, tiles, constexprs) of ``int4_swap`` for an ``m x n x k`` product
    with ``config`` (``launch_swap``) on ``sms`` multiprocessors."""
    from kaio_ops.matmul import k_slices

    wg, bm, stages, split, *more = config
    stages = stages or swap_stages(wg, bm)
    tiles = math.ceil(m / bm) * math.ceil(n / (64 * wg))
    split, k_slice = k_slices(k, split or swap_split(tiles, k, sms), BK)
    cl = int(bool(more and more[0]) and 1 < split <= 8)
    consts = {"WG": wg, "BM": bm, "STAGES": stages, "SPLIT": split if cl else min(split, 2),
              "CL": cl, "REGS": consumer_registers(wg), "OUT": out_type}  # fmt: skip
    return split, k_slice, tiles, consts


def launch_swap(a, b, s, out_type, config: tuple, sms: int | None = None):
    """``a @ W`` rounded to ``out_type`` by ``int4_swap`` (operands as ``launch``) with
    ``config`` = (WG, BM, STAGES, split[, CL]; 0: as many stages as fit, ``swap_split``'s
    split): a persistent grid of at most ``sms`` blocks along x, the K split along z summed
    by ``finish``, or with ``CL`` (and a split of 2 to 8) over a cluster of that many blocks
    along x, one tile a cluster, summed in distributed shared memory (no second launch)."""
    from kaio_ops import _arrays
    from kaio_ops.linear import _placeholder

    m, k = a.shape
    n = b.shape[1]
    sms = sms or _arrays.multiprocessors(a)
    split, k_slice, tiles, consts = swap_launch_plan(m, n, k, config, sms, out_type)
    wg, bm, cl = consts["WG"], consts["BM"], consts["CL"]
    if split > 1 and not cl:
        c = _arrays.output(a, (split * m, n), f32)
        ws, target = c, _placeholder(a, out_type, 2)
    else:
        c = _arrays.output(a, (m, n), out_type)
        ws, target = _placeholder(a, f32, 2), _arrays.output_arg(a, c, (m, n), out_type)
    maps = (
        kaio.tensor_map_2d(a.obj, (bm, BK), SW),
        kaio.tensor_map_2d(b.obj, (WORD_ROWS, 64 * wg), 0),
        kaio.tensor_map_2d(s.obj, (1, 64 * wg), 0),
    )
    grid = (tiles * split, 1, 1) if cl else (min(tiles, sms), 1, split)  # a cluster: one tile
    shared = swap_shared_bytes(wg, bm, consts["STAGES"], cl)
    int4_swap[grid, 128 * wg + 128, _arrays.stream_of(a), shared](
        *maps, target, ws, m, n, k, k_slice, **consts
    )
    return finish(a, c, split, out_type) if split > 1 and not cl else c


def swap_specializations() -> list:
    """(kernel, constexprs) of ``int4_swap``'s variants to check with ptxas (sm_90a): every
    consumer count, the widest and narrowest activation tiles, a K split through the
    workspace and through a cluster, every output type."""
    out = []
    for wg, bm, split, cl, ot in (
        (1, 8, 2, 1, f32),
        (2, 256, 1, 0, f16),
        (2, 64, 4, 1, bf16),
        (3, 128, 2, 0, f32),
        (4, 16, 8, 1, f16),
        (4, 64, 2, 0, f32),
    ):
        consts = {"WG": wg, "BM": bm, "STAGES": swap_stages(wg, bm), "SPLIT": split, "CL": cl,
                  "REGS": consumer_registers(wg), "OUT": ot}  # fmt: skip
        out.append((int4_swap, consts))
    return out
