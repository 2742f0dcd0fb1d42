"""W4A16 on Hopper (sm_90a): ``out [M, N] = a [M, K] (f16) @ W`` with the int4 weights of
``matmul_int4`` (``W[k, n] = f16(scales[k // 128, n] * q)``) dequantized in the kernel, tile by
tile, into an f16 operand of ``wgmma``: the weights cross memory as their packed words
(K N / 2 bytes), never as an f16 copy.

``int4_swap`` (what ``matmul_int4`` runs past ``DECODE_M`` rows, ``run``) computes
C^T = W^T a^T, the roles of Marlin and Machete: the dequantized weights are wgmma's A operand
straight from registers (``wgmma`` with A in registers), the activations its B operand from
shared memory, so no thread ever stores the f16 weights; see its docstring. At small M
(memory-bound) the grid is filled by splitting K over ``grid.z`` (raw f32 partial tiles
summed in a fixed order by ``kaio_ops._gemm.gemm_reduce``: ``finish``), or (``CL``) over a
cluster of ``SPLIT`` blocks along x, one tile a cluster, whose partial tiles are summed in
rank order through distributed shared memory (``cluster_sum``; the rings, idle by then, hold
them): no workspace and no second launch. With ``KW`` the consumer warpgroups share one
tile and take its K slices in turn, summed in shared memory by the first of them
(``reduce_warpgroups``): a K split inside the block, the route at 65-512 rows where it wins
(``swap_plan``). Needs N % 8 == 0 (TMA rows of the words and the scales a multiple of 16
bytes), K % 128 == 0, and 16-byte aligned operands (``fits``).

(A first design, ``int4_wgmma``, dequantized the words into swizzled shared memory with a
dedicated warpgroup and ran wgmma with both operands in shared memory; 0.59-0.63x cuBLAS f16
past 512 rows on an H100 against the swap's 0.7-0.8x, it was removed once nothing routed to
it: git history before the int4m35 branch. The same lever on ``int4_swap``, ``DQ``: the
producer warpgroup's warps 2 and 3, or a fifth warpgroup (``DQW``), dequantized each slice's
words once into an f16 ring of W^T tiles in wgmma's swizzled layout, the consumers' wgmmas
with both operands in shared memory; on an H100 0.64-0.80x cuBLAS f16 at 300-512 rows of the
Llama-3 shapes against the route's 0.92-1.00x in the same runs (int4w, 2026-11-27; ncu at
6144x4096 M=512: tensor pipe 58% busy against the route's 77%, shared memory not saturated),
it was removed unrouted: the int4w branch's commits 6e9a3b4 .. 7fde021.)
"""

# ruff: noqa: F821  (OUT in annotations is a dtype parameter, not a module name)
from __future__ import annotations

import math

import kaio
from kaio import bf16, bool_, f16, f16x2, f32, i32, u32, u64
from kaio_ops._attention_hopper import PRODUCER_REGS, advance
from kaio_ops._gemm_streamk import owner, run_bound, segment
from kaio_ops._int4_decode import HIGH_TWICE, LOW_TWICE
from kaio_ops._matmul_hopper import grouped
from kaio_ops._matmul_kernels import GROUP_M, tile_col, tile_row

BK = 64  # K values a slice (one 128-byte swizzled row of f16 per tile row)
WORD_ROWS = BK // 8  # packed word rows a slice
SW = 128
SHARED_LIMIT = 227 * 1024


SUM_UNROLL = 4  # cluster_sum: column pairs a thread sums at once, every block's word in flight


@kaio.gpu_func
def cluster_sum(
    pairs: u64[:, :], c: OUT[:, :], m0: u32, n0: u32, t: u32, M: u32, N: u32,
    BM: kaio.constexpr, BN: kaio.constexpr, THREADS: kaio.constexpr, SPLIT: kaio.constexpr,
    OUT: kaio.constexpr, MC: kaio.constexpr,
):  # fmt: skip
    """The K split of a cluster, once every block's partial ``BM x BN`` f32 tile (at (m0,
    n0) of c) is in its shared memory, read here as ``pairs`` [BM, BN / 2] (two adjacent
    columns a 64-bit word, the low half the even column): block ``r`` sums rows ``r``,
    ``r + SPLIT``, ... of the tile over the cluster's blocks in rank order (the same result
    run to run) and stores them, thread ``t`` of the block's ``THREADS`` (the consumer
    warpgroups) taking every ``THREADS``-th pair, ``SUM_UNROLL`` pairs at a time with the
    words of all the blocks in flight (distributed shared memory is read at its latency,
    not its bandwidth). N is even: a pair is in c or out of it whole. With ``MC`` the cluster
    is ``SPLIT`` multicast pairs (rank ``2 r + p``: K slice r, tile p of the pair), and the
    blocks of this block's tile p are summed."""
    rank = kaio.cluster_rank() // (1 + MC)
    mine = kaio.cluster_rank() % (1 + MC)
    PAIRS = BN // 2
    TOTAL = (BM + SPLIT - 1) // SPLIT * PAIRS
    for i0 in range(t, TOTAL, THREADS * SUM_UNROLL):
        raw = kaio.local(u64, (SUM_UNROLL, SPLIT))
        for u in kaio.static_range(SUM_UNROLL):
            i = i0 + u * THREADS
            if i < TOTAL and i // PAIRS * SPLIT + rank < BM:
                for q in kaio.static_range(SPLIT):
                    raw[u, q] = kaio.cluster_load(
                        pairs, (i // PAIRS * SPLIT + rank, i % PAIRS), q * (1 + MC) + mine
                    )
        for u in kaio.static_range(SUM_UNROLL):
            i = i0 + u * THREADS
            r = i // PAIRS * SPLIT + rank
            col = 2 * (i % PAIRS)
            if i < TOTAL and r < BM and m0 + r < M and n0 + col < N:
                lo = kaio.bitcast(u32(raw[u, 0]), f32)
                hi = kaio.bitcast(u32(raw[u, 0] >> 32), f32)
                for q in kaio.static_range(1, SPLIT):
                    lo += kaio.bitcast(u32(raw[u, q]), f32)
                    hi += kaio.bitcast(u32(raw[u, q] >> 32), f32)
                out = kaio.local(OUT, 2)
                out[0] = OUT(lo)
                out[1] = OUT(hi)
                kaio.store_vector(c, (m0 + r, n0 + col), out)


def fits(a, b, s) -> bool:
    """Whether ``int4_wgmma`` takes activations ``a`` [M, K] and the words ``b`` [K/8, N]
    and scales ``s`` [K/128, N] (``_arrays.Operand``s; K % 128 == 0 is the op's contract):
    N % 8 == 0 and every base 16-byte aligned (TMA rows and boxes)."""
    n = b.shape[1]
    return n % 8 == 0 and a.aligned(16) and b.aligned(16) and s.aligned(16)


IN_SIMULATOR = False  # tests set it to run this kernel on the simulator
DECODE_M = 16  # up to this M the decode kernel (``_int4_decode``)
# From this M the f16 copy of the weight and the f16 wgmma matmul (``_prefill``); none: past
# DECODE_M every M runs int4_swap.
PREFILL_M = 1 << 62

# int4_swap's tiles by M (the first row whose bound M does not pass): (WG, BM; 0: M rounded
# up to 8, or 16 with MC; CL: a K split summed in a cluster (1: of 2 blocks, a split past 2
# through the workspace; 2: of up to 8 blocks), else by gemm_reduce; MC: pairs of tiles
# sharing a's rows by multicast; BUFS: slices' A fragments in registers; EARLY: each slice
# reads the next one's words into registers, ``swap_slice``). Measured on an
# H100 under the whole-program JIT (bench/int4_wgmma.py --swap --variants-only, round C of
# 2026-11-26, x cuBLAS f16 at the same point): 129-256 rows one M-row tile with a cluster
# pair split, 8192x8192 1.00x against the 16-row multicast pairs' 0.86x (28672x4096 1.10x
# against 1.04x); 65-128 rows a cluster pair when the split is 2 (8192x8192 1.30x against
# 1.23x); clusters of 4 or 8 stay slower than the workspace (4096x4096 M=256: 0.45x
# against 0.70x); 3 fragment buffers (BUFS 3) within 1-3% of 2 either way (28672x4096
# M=2048 0.91x against 0.87x, 8192x8192 0.91x against 0.94x): 2 everywhere. With the words'
# ring and the division-free producers (int4w35 round C, H100, x cuBLAS f16): past 512 rows
# 256 x 128 tiles without multicast pairs (4096x4096 M=1024 1.01x against 0.99x, but
# 8192x8192 M=2048 1.00x against 1.02x, 28672x4096 M=1024 1.03x against 1.04x), EARLY
# within 0.5% either way; 129-256 rows 128-row tiles where the 256-row ones would need a K
# split past 2 (``swap_plan``; 4096x4096 M=256: 0.90x in cluster pairs against 0.80x with a
# split of 4 in the workspace), 257-512 rows where they would need any (M=512: 0.86x against
# a cluster pair's 0.83x); up to 128 and at 257-512 EARLY off (4096x4096 M=128 0.97x
# against 0.94x). Then (int4w35, this session's round C, the median of 4 interleaved
# passes) one consumer warpgroup with 256-row tiles (256 x 64: half the dequantization a
# multiply-add of the 128-row tiles, twice a's reads) where it needs no split past 2:
# 4096x4096 M=512 0.94x against the 128-row tiles' 0.87x (26.8 against 29.3 µs), M=256
# (cluster pairs) 1.00x against 0.97x (round D: 0.94x against 0.86x, 0.92x against 0.89x;
# 4096x14336 0.95x against 0.86x, 1.20x against 1.12x); at M=128 64-column tiles in cluster
# pairs, EARLY off, 1.09x against 1.00x (the workspace's split of 4), EARLY on 1.05x;
# multicast pairs at 257-512 rows lost (M=512 0.88x,
# 0.82x in round A), as did clusters of 4 (a multicast pair and a K split of 2: 0.43x at
# M=256, half the clusters waiting for a second wave) and of 8 (0.52x at M=128).
SWAP_PLANS = (
    (64, 4, 0, 0, 0, 2, 0),
    (128, 2, 0, 1, 0, 2, 0),
    (256, 2, 0, 1, 0, 2, 1),
    (512, 2, 256, 1, 0, 2, 0),
    (1 << 62, 2, 256, 0, 0, 2, 1),
)


# Past 512 rows on products at least this wide (N): multicast pairs and tile-order groups of
# WIDE_GROUP rows (int4w35, H100, rounds A-C of this session, x cuBLAS f16, the median of
# interleaved passes): 57344x8192 M=1024 1.06x / 1.06x against the route's 1.00x / 1.04x,
# M=2048 1.04x / 1.03x against 0.99x / 1.00x, M=4096 1.01x / 1.05x against 0.98x / 1.05x (a
# group of 8 rows of a spans 32 MB there while the 235 MB of words stream past it); at
# 28672x4096 and 8192x8192 within the passes' spread of the route (0.95-1.04x either way),
# at 4096x4096 M=8192 0.90x against 0.95x: those keep 256 x 128 tiles in groups of 8.
# Only on whole 256-row tiles (M a multiple of 256: the rows measured): at 57344x8192
# M=600 208-row pairs ran at 0.82-0.88x against stream-K's 0.98x on 152 x 192 tiles (int4w
# rounds A-C of 2026-11-27).
WIDE_N = 32768
WIDE_GROUP = 4


# KW tiles (two consumer warpgroups sharing BM x 64 tiles, each every other K slice, EARLY
# off) at 65-512 rows, by the tiles of before (int4w35 rounds B and C of 2026-11-27, H100,
# x cuBLAS f16, the median of 3 interleaved passes, KW against the tiles of before):
# - where one warpgroup had 64-column tiles (N = 4096): always (4096x4096 M=128 in a
#   cluster pair 1.12x against 1.06x, M=512 0.94-0.97x against 0.93-0.95x; 4096x14336
#   M=256 1.07x against 1.01x, M=512 1.00x against 0.95x), at K <= KW_HALVE_K with 256-row
#   tiles that need a K split 128-row tiles without one instead (4096x4096 M=256 0.97-1.04x
#   against 0.89-0.93x; 4096x14336 M=256 0.94x against the cluster pair's 1.07x, and
#   64-row tiles lost: 4096x14336 M=128 0.85x against 1.14x);
# - where 128-column tiles needed a K split (8192x8192 M=256 1.03-1.09x against
#   0.97-1.01x, M=128 1.13x against 1.12x; 8192x28672 M=256 1.10x against 1.09x), or where
#   twice the tiles fill the last wave better by KW_WAVE (57344x8192 M=256, 896 tiles
#   against 448 on 132 SMs: 1.07-1.10x against 0.93-1.00x; M=128 1.85x against 1.75x;
#   28672x4096 M=512 1.01x against 0.98x); elsewhere the tiles of before (8192x8192 M=512
#   0.96x with KW against 1.02x, 28672x4096 M=256 0.96x against 1.05x, 57344x8192 M=512
#   0.93x against 0.95x).
KW_HALVE_K = 4096
KW_WAVE = 0.05

# KW tiles at 17-64 rows too (two warpgroups on BM x 64 tiles, BM the rows rounded up to 32,
# a cluster pair's K split where swap_split asks for 2), where they number at most the SMs,
# need no split past 2, and the workspace of the tiles of before (4 warpgroups side by side,
# a K split of 3-8 summed by a second launch: split M N 4 bytes written and read) is at
# least a quarter of the words' K N / 2 bytes (32 split M >= K): int4w35 rounds A and B of
# 2026-11-27 (H100, x cuBLAS f16, the median of 3 interleaved passes, KW against the tiles
# of before): 4096x4096 (split 8) M=17 1.41x against 1.39x, M=32 1.42-1.44x against
# 1.33-1.35x, M=48 1.34x against 1.20x, M=64 1.33x against 1.13x; 8192x8192 M=64 (split 4)
# 1.82x against 1.68x; 6144x4096 (split 5) M=64 1.48x against 1.35x, M=32 1.57x against
# 1.62x (the one loss); 4096x14336 M=64 (split 8) 1.82x against 1.76x. Where the workspace
# is smaller they tied or lost (8192x8192 M=32 1.96x against 1.95x, 4096x14336 M=32 1.84x
# against 1.96x, 8192x28672 M=64 1.97x against 2.30x); with more tiles than SMs they lost
# (10240x8192 M=64, 160 tiles: 1.28x against 1.86x; 57344x8192, 896 tiles: 1.98x against
# 2.27x), as did 4 warpgroups on the same tiles (1.27x, 1.65x at 4096x4096 and 8192x8192
# M=64). K splits of the qkv shapes' partial waves lost everywhere (round B: 6144x4096
# M=512 in clusters of 4 0.48x against 0.87x, KW tiles in cluster pairs 0.62x; 10240x8192
# M=256 in clusters of 3 0.66x against 0.88x, a split of 3 through the workspace 0.88x).
# Past 512 rows KW tiles of
# 256 x 64 where they fill the last wave better (round A: 6144x4096 M=1024, 384 tiles
# against 192 on 132 SMs, 0.96x against 0.83x; 10240x8192 M=1024, 640 against 320, 0.96x
# against 0.83x): now ``cheapest_tiles``' choice (KW_TIME).
KW_SMALL_M = 64

# At 65-512 rows, tiles of 128 x 192 (three consumer warpgroups side by side, EARLY off)
# where they fit in one wave and take less time than the tiles above by the SMs' waves,
# counting them THREE_GAIN as fast a value as 256 x 128 ones (round C of int4w35,
# 2026-11-27, H100, x cuBLAS f16: 6144x4096 M=512, 128 tiles against 96 of 256 x 128,
# 0.92x against 0.87x; 10240x8192 M=256, 108 against 80, 0.93x against 0.83x; where they
# need two waves they lost: 10240x8192 M=512, 216 against 320 KW tiles, 0.75x against
# 0.85x; 6144x4096 M=1024, 256 against 384 KW tiles, 0.89x against 0.95x).
THREE_GAIN = 0.85


def wave_fill(tiles: int, sms: int) -> float:
    """The share of ``sms`` multiprocessors that ``tiles`` tiles of equal work keep busy over
    their waves (1.0: whole waves)."""
    return tiles / (math.ceil(tiles / sms) * sms)


def swap_plan(m: int, n: int = 0, k: int = 0, sms: int = 0, fast: bool = False) -> tuple:
    """``int4_swap``'s configuration for an ``m x n x k`` product on ``sms`` multiprocessors:
    ``base_plan``'s (measured on an H100), on a GPU of the faster memory (``fast``:
    ``fast_memory``, an H200) with ``fast_memory_plan``'s changes."""
    plan = base_plan(m, n, k, sms)
    return fast_memory_plan(m, n, k, sms, plan) if fast and n and sms else plan


def base_plan(m: int, n: int = 0, k: int = 0, sms: int = 0) -> tuple:
    """``int4_swap``'s (WG, BM, STAGES, split, CL, MC, WSTAGES, BUFS, EARLY, GROUP, KW) for
    M = ``m`` (``SWAP_PLANS``; as many stages of both rings as fit, ``swap_split``'s split,
    the tile order in groups of ``GROUP_M`` rows); given the product's ``n``, ``k`` and the
    GPU's ``sms``: at 65-512 rows, where the 64 WG-column tiles would need a K split (past 2
    up to 256 rows), 64-column tiles if those need none (past 2), else (past 128 rows)
    128-row tiles; then KW tiles where they win (``KW_HALVE_K``: the comment above it);
    then 128 x 192 tiles where one wave of them beats the tiles above (``THREE_GAIN``);
    up to ``KW_SMALL_M`` rows KW tiles where they fill the SMs with a K split of at most 2
    (a cluster pair) and the tiles of before would write a workspace of a quarter of the
    words or more; past 512 rows at N >= ``WIDE_N``, multicast pairs in groups of
    ``WIDE_GROUP`` rows, below it KW tiles or 128-column ones, whichever costs less
    (``cheapest_tiles``), and past 256 rows BM x 192 tiles (three warpgroups, at most
    ``THREE_ROWS``) where they cost less still; the row tiles as even as they can be
    (``balanced_rows``), and
    without multicast as many as cost least (``cheapest_tiles``); past 256 rows
    ``balanced_rows`` x 128 tiles on the stream-K schedule (SK, config[12]) where
    ``takes_streamk`` and it costs less than the tiles above (``SK_TIME``); at 257-512 rows
    BM x 192 tiles in cluster pairs too (``PAIR_KINDS``); LATE (config[11]) on three
    warpgroups' tiles in one wave (``late_words``); one fragment buffer on three
    warpgroups' tiles of ``ONE_BUF_ROWS`` rows (not on the stream-K schedule), or on their
    whole tiles (no K split) of ``PAIRS_ROWS`` rows two slices a warpgroup's turn (PAIRS,
    config[14], with two buffers: ``swap_pair``; a work item's first slice alone: ``LEAD``)."""
    _, wg, bm, cl, mc, bufs, early = next(row for row in SWAP_PLANS if m <= row[0])
    step = 16 if mc else 8
    bm = bm or min(256, -(-m // step) * step)
    tiles = math.ceil(m / bm) * math.ceil(n / (64 * wg))
    if n and sms and m <= KW_SMALL_M:
        bm32 = -(-m // 32) * 32
        narrow = math.ceil(m / bm32) * math.ceil(n / 64)
        split = swap_split(tiles, k, sms)  # the workspace's: split M N 4 bytes
        if narrow <= sms and swap_split(narrow, k, sms) <= 2 and 32 * split * m >= k > 0:
            return 2, bm32, 0, 0, 1, 0, 0, bufs, 0, 0, 1
    most = 2 if m <= 256 else 1  # the K split that 65-512 rows take
    group = kw = 0
    if n and 64 < m <= 512 and swap_split(tiles, k, sms) > most:
        if swap_split(math.ceil(m / bm) * math.ceil(n / 64), k, sms) <= most:
            wg, early = 1, int(early or m > 128)
        elif m > 128:
            bm = 128
    if n and 64 < m <= 512:
        bm32 = min(256, -(-bm // 32) * 32)  # KW's tiles: whole chunks of its sum
        narrow = math.ceil(m / bm32) * math.ceil(n / 64)  # KW's tile count
        if wg == 1:
            kw = 1
            if bm32 == 256 and k <= KW_HALVE_K and swap_split(narrow, k, sms) > 1:
                bm32 = 128
        elif wg == 2:
            wide = math.ceil(m / bm) * math.ceil(n / 128)
            kw = int(
                swap_split(wide, k, sms) > 1
                or wave_fill(narrow, sms) >= wave_fill(wide, sms) + KW_WAVE
            )
        if kw:
            wg, bm, early = 2, bm32, 0
        mine = math.ceil(m / bm) * math.ceil(n / (64 if kw else 64 * wg))
        three = math.ceil(m / 128) * math.ceil(n / 192)  # 128 x 192 tiles: 3 warpgroups
        rows = balanced_rows(m, bm, 32 if kw else 8)  # (the row tiles' rows, both sides)
        if swap_split(mine, k, sms) == 1 and three <= sms:
            width = 64 if kw else 64 * wg
            if balanced_rows(m, 128) * 192 < THREE_GAIN * rows * width * math.ceil(mine / sms):
                wg, bm, early, kw = 3, 128, 0, 0
    if m > 512 and n >= WIDE_N and m % 256 == 0:  # (whole 256-row tiles: WIDE_N's comment)
        mc, group = 1, WIDE_GROUP
    rows, cost = balanced_rows(m, bm, 32 if kw else 8 + 8 * mc), math.inf  # (MC: 8-row halves)
    band = (wg, bm, kw)
    if n and sms and not mc:  # past 512 rows KW tiles or not, past 256 BM x 192 ones too
        kinds = ((wg, 0), (wg, 1)) if m > 512 else ((wg, kw),)
        if m > 256 and wg == 2 and m % 256:  # (whole 256-row tiles: THREE_ROWS' comment)
            kinds += ((3, 0),)
        cost, wg, kw, rows = cheapest_tiles(m, bm, n, k, sms, kinds, bool(cl))
        early = early * (1 - kw) * (wg < 3)
    if n and sms and m > 256 and not mc and takes_streamk(m, n, k, sms, band):
        sk_cost, sk_wg, sk_rows = streamk_tiles(m, n, k, sms)
        if sk_cost < cost:
            return sk_wg, sk_rows, 0, 0, 0, 0, 0, bufs, int(sk_wg == 2), group, 0, 0, 1, 1
    late = late_words(m, n, k, sms, wg, rows)
    tiles = math.ceil(m / rows) * math.ceil(n / (64 * wg))
    if wg == 3 and PAIRS_ROWS[0] <= rows <= PAIRS_ROWS[1] and swap_split(tiles, k, sms) == 1:
        return wg, rows, 0, 0, cl, mc, 0, 2, early, group, kw, late, 0, 1, 1  # PAIRS
    if wg == 3 and ONE_BUF_ROWS[0] <= rows <= ONE_BUF_ROWS[1]:
        bufs = 1
    return wg, rows, 0, 0, cl, mc, 0, bufs, early, group, kw, late


# On the faster memory (H200) ``base_plan``'s tiles leave SMs idle where the H100's memory
# made that pay; ``fast_memory_plan`` (i4w, rounds A and A2 of 2026-11-28, NVIDIA H200, x
# cuBLAS f16, the median of 3-5 interleaved passes, against ``base_plan``'s in the same
# passes): at 10240x8192 M=128, 54 tiles of 128 x 192 in cluster pairs (108 blocks) 1.10x
# against 80 whole 128 x 128 tiles' 0.87x (41.7-41.9 against 53.2 µs, every pass; stream-K
# on 128 x 128 tiles 1.07x); at 10240x8192 M=256 stream-K on 256 x 128 tiles (a block's run
# 78 K steps) 0.98x against one wave of 108 tiles of 128 x 192's 0.93x (65.3 against 68.9
# µs, every pass); at 10240x8192 M=1024 stream-K on 256 x 128 tiles (runs of 310 steps)
# 0.99x / 0.98x against 640 KW tiles' 0.96x / 0.95x (faster in 8 of 8 passes). Routed
# (round B, 5 passes, against base_plan's in the same passes, faster in every pass):
# 10240x8192 M=72 / 100 / 128 32.1 / 35.7 / 40.1 against 43.9 / 47.4 / 52.0 µs, M=224 /
# 256 / 1024 57.9 / 64.3 / 251.0 against 63.4 / 68.1 / 257.3; off the sweep 8192x28672
# M=768 520 against 540, 28672x4096 M=1280 424 against 477. Stream-K lost where the runs
# are short or the route's tiles already fill their waves: 6144x4096 M=1024 (93 steps)
# 0.94x against 0.95x, M=2048 0.97x against 1.01x, 8192x8192 M=1024 0.96x against 1.01x;
# cluster pairs of 128 x 192 tiles lost at 6144x4096 and 4096x4096 M=256 (0.92x against
# 0.97x, 0.76x against 1.04x): there ``base_plan``'s keep more SMs busy.
FAST_SK_FILL = 0.85  # 129-256 rows: stream-K where base_plan's one wave fills at most this
FAST_SK_RUN = 64  # ... and a block's stream-K run is at least this many K steps
FAST_KW_SK_RUN = 256  # past 512 rows: stream-K in place of KW tiles from runs this long
# ... on row tiles of at least this many rows: two warpgroups' stream-K tiles of 136-192 rows
# spill 20-28 bytes a thread (ptxas 13.0, sm_90a), of 224 and 256 none
FAST_SK_ROWS = 224


def fast_memory_plan(m: int, n: int, k: int, sms: int, plan: tuple) -> tuple:
    """``plan`` (``base_plan``'s) for a GPU of the faster memory (the comment above): at 65-128
    rows BM x 192 tiles (three warpgroups, one row tile) in cluster pairs where they keep
    more SMs busy (``busy_blocks``) and need a K split of exactly 2; at 129-256 rows
    ``balanced_rows`` x 128 tiles on the stream-K schedule where ``plan`` is one wave that
    fills at most ``FAST_SK_FILL`` of the SMs and a block's run is ``FAST_SK_RUN`` steps or
    more; past 512 rows the same in place of KW tiles from runs of ``FAST_KW_SK_RUN``; the
    stream-K row tiles of ``FAST_SK_ROWS`` rows or more."""
    k_steps = -(-k // BK)
    busy = busy_blocks(m, n, k, plan, sms)
    if 64 < m <= 128:
        rows, tiles = balanced_rows(m, 128), math.ceil(n / 192)
        if swap_split(tiles, k, sms) == 2 and busy < 2 * tiles <= sms:
            bufs = 1 if ONE_BUF_ROWS[0] <= rows <= ONE_BUF_ROWS[1] else 2
            return 3, rows, 0, 0, 1, 0, 0, bufs, 0, 0, 0, late_words(m, n, k, sms, 3, rows)
    rows = balanced_rows(m)
    run = math.ceil(m / rows) * math.ceil(n / 128) * k_steps / sms  # a stream-K block's steps
    one_wave = 128 < m <= 256 and busy <= FAST_SK_FILL * sms and run >= FAST_SK_RUN
    kw_past = m > 512 and len(plan) > 10 and plan[10] and run >= FAST_KW_SK_RUN
    if (one_wave or kw_past) and rows >= FAST_SK_ROWS:
        return 2, rows, 0, 0, 0, 0, 0, 2, 1, plan[9], 0, 0, 1, 1
    return plan


def busy_blocks(m: int, n: int, k: int, plan: tuple, sms: int) -> int:
    """The SMs that ``int4_swap`` with ``plan`` keeps busy in its first wave: its blocks
    (tiles times the K split, two a multicast pair; the stream-K schedule all), at most
    ``sms``."""
    split, _, tiles, consts = swap_launch_plan(m, n, k, plan, sms, f16)
    return sms if consts["SK"] else min(sms, tiles * split * (1 + consts["MC"]))


def late_words(m: int, n: int, k: int, sms: int, wg: int, rows: int) -> int:
    """``int4_swap``'s LATE for ``swap_plan``'s whole tiles (or cluster pairs) of ``rows`` x
    64 ``wg`` columns: 1 for three warpgroups' tiles that run in one wave (the comment below)."""
    tiles = math.ceil(m / rows) * math.ceil(n / (64 * wg)) if n and sms else 0
    return int(wg == 3 and 0 < tiles * swap_split(tiles, k, sms) <= sms)


# LATE (a slice's words' stage freed after its wgmmas are issued) on three warpgroups' tiles
# in one wave (int4w rounds C and D of 2026-11-27, H100, x cuBLAS f16, the median of 3
# interleaved passes, against the route in the same passes): 6144x4096 M=512 1.010x /
# 0.935x against 0.991x / 0.932x, M=520 0.955x against 0.947x, M=600 1.009x against
# 1.003x, M=300 (cluster pairs) 0.909x against 0.906x; 10240x8192 M=300 0.979x / 0.999x
# against 0.970x / 0.989x; 8192x8192 M=520 1.017x both. Over several waves it lost
# (10240x8192 M=1500, 486 tiles: 0.966x against 0.974x), and on the stream-K schedule it
# went both ways (28672x4096 M=300 1.002x against 1.007x, 57344x8192 M=300 0.956x against
# 0.888x): not routed there.


def streamk_tiles(m: int, n: int, k: int, sms: int) -> tuple:
    """(cost, WG, BM) of the stream-K schedule's tiles for an ``m x n x k`` product on
    ``sms`` multiprocessors: ``balanced_rows`` x 128 (two warpgroups), or x 192 (three, of
    ``THREE_MIN_ROWS`` to ``THREE_ROWS`` rows, where ``m`` is no multiple of 256 and a
    block's run is ``SK_RUN`` K steps or more), whichever costs less: the tiles' work
    spread evenly over the SMs, in ``cheapest_tiles``' count (``TILE_COSTS``), times
    ``SK_TIME`` (``SK_THREE_TIME``), plus ``SK_FIXED``."""
    best = (math.inf, 2, balanced_rows(m))
    for wg, most in ((2, 256), (3, THREE_ROWS))[: 1 + bool(m % 256)]:
        width, fixed, least, _ = TILE_COSTS[(wg, 0)]
        rows = balanced_rows(m, most)
        tiles = math.ceil(m / rows) * math.ceil(n / (64 * wg))
        if rows >= least and (wg == 2 or tiles * -(-k // BK) >= SK_RUN * sms):
            cost = tiles / sms * (rows + fixed) * width * (SK_TIME if wg == 2 else SK_THREE_TIME)
            best = min(best, (cost + SK_FIXED, wg, rows))
    return best


def balanced_rows(m: int, most: int = 256, step: int = 8) -> int:
    """The rows of ``m``'s row tiles of at most ``most`` (a multiple of ``step``), as even
    as multiples of ``step`` make them (300 rows: two of 152, not 256 and a padded 256)."""
    rows = -(-m // -(-m // most))
    return -(-rows // step) * step


# The cost of a row tile of BM rows in ``cheapest_tiles``: BM + ROW_COST (the words'
# dequantization and a slice's fixed steps, the same for each row of a tile, counted in
# rows), a KW tile's (BM x 64, two warpgroups) KW_TIME of a BM x 128 one's: the values
# that order the pairs int4w rounds A-D of 2026-11-27 timed (H100, x cuBLAS f16 in the same
# passes; 28672x4096 M=1500 216 x 128 tiles 1.02x against 256 x 128's 0.95x, 10240x8192
# M=1536 192 x 128 0.95x against 0.88x; 6144x4096 M=1536 192 x 128 0.96x against KW 256 x
# 64's 0.84x, 8192x8192 M=600 152 x 128 0.88x against KW 0.67-0.69x, M=768 KW 256 x 64
# 0.99x against 192 x 128's 0.94x, 6144x4096 M=520 KW 160 x 64 0.76x against 136 x 128's
# 0.71x), all but 4096x4096 M=1500 (KW 0.95x, 192 x 128 0.97-0.98x). A KW tile reads a's
# rows from L2 twice as often for its multiply-adds: 192-row ones at 6144x4096 M=1536 ran
# at 0.64x.
ROW_COST = 60
KW_TIME = 0.52
ROW_TRIES = 3  # the row tiles past ceil(M / BM) that ``cheapest_tiles`` weighs
MIN_ROWS = 128

# Past 256 rows, tiles of BM x 192 (three consumer warpgroups side by side, at most
# THREE_ROWS rows: a thread's 128 registers at 512 threads; at least THREE_MIN_ROWS), each
# costing THREE_TIME x (BM + THREE_ROW_COST) in the units above: the values that order the
# pairs int4w rounds A-D of 2026-11-27 timed (H100, x cuBLAS f16, the median of 3-4
# interleaved passes, against the route of before in the same passes): 6144x4096
# M=520 128 tiles of 136 x 192 0.93-0.94x against 384 KW tiles of 160 x 64 0.75x, M=600 152
# x 192 1.00x against 0.84x; 10240x8192 M=300 108 tiles of 152 x 192 0.97-0.98x against
# stream-K's 0.86x, M=1500 168 x 192 0.96x against 192 x 128's 0.92x; 8192x8192 M=520 176
# x 192 1.03x against 136 x 128's 0.82x, M=3000 168 x 192 0.99x / 1.08x against 256 x 128's
# 0.97x / 1.02x; 4096x14336 M=3000 1.01x / 1.14x against 0.98x / 1.06x. On whole 256-row
# tiles 256 x 128 stays ahead (8192x8192 M=512 1.04x against 176 x 192's 0.99x, M=1024
# 0.99x against 0.97x; 4096x4096 M=4096 1.00x against 0.96x; 28672x4096 M=1024 1.02x
# against 0.94x; round D: 10240x8192 M=512 on the stream-K schedule 0.95x against 176 x
# 192's 0.88x): where M is a multiple of 256 they are not weighed. 28672x4096 M=3000 went
# both ways (216 x 128 0.98x / 0.96x / 0.89x against 168 x 192's 0.90x / 0.95x / 0.93x).
# Under 136 rows they lost everywhere (6144x4096 M=300 104 rows 0.77x against 0.84x, M=384
# 128 rows 0.78x against 0.84x; 8192x28672 M=768 128 rows 0.84x against 0.98x). (Likely
# why they win: three warpgroups hide a slice's dequantization and waits behind each
# other's wgmmas better than two; not profiled.)
THREE_ROWS = 176
THREE_MIN_ROWS = 136
THREE_TIME = 1.0
THREE_ROW_COST = 144
# At 257-512 rows, tiles of BM x 192 (three warpgroups) that number sms / 3 to sms / 2 run
# in cluster pairs, each block half of K, the pair's partial tiles summed through
# distributed shared memory (``pair_sum``): each costing half a whole tile's time plus
# PAIR_ROWS rows (int4w rounds A and C of 2026-11-27, H100, x cuBLAS f16, the median of 3
# interleaved passes, against whole tiles of 2 warpgroups in the same passes: 6144x4096
# M=300, 64 tiles of 152 x 192 on 128 blocks, 29.4 µs (0.916x, with ``cluster_sum``)
# against 96 of 152 x 128, 31.2 µs (0.866x); with ``pair_sum`` M=272 / 300 / 352 26.7 /
# 28.6 / 31.3 µs (0.987x / 0.907x / 0.942x) against 29.0 / 30.6 / 33.8 (0.910x / 0.847x /
# 0.873x): PAIR_ROWS 40 / 50 / 58 there).
# One fragment buffer (BUFS 1: a slice's fragments made once the warpgroup's wgmmas before them are
# done, the other two warpgroups' wgmmas running meanwhile) on three warpgroups' whole tiles or
# cluster pairs of ONE_BUF_ROWS rows (int4w round B of 2026-11-28, H100, 3 interleaved passes
# against the route of before in the same passes, faster in each pass): 6144x4096 M=272 (136 rows,
# pairs) 26.7-26.9 against 27.0-27.1 µs, M=300 (152, pairs) 27.7-28.1 against 28.3-28.7, M=512 (128,
# whole) 39.3-39.7 against 39.7-40.0 (round A: 38.9-39.2 against 39.2-39.6), M=520 (136, whole; BUFS
# 3 before) 41.1 against 41.3-41.5; 10240x8192 M=300 (152, pairs; BUFS 3 before) 78.2-78.6 against
# 78.8-80.0; round C (the median of 5, against BUFS 2 / 3 in the same passes, faster in 37 of 40
# passes): 6144x4096 M=300 / 512 / 520 / 600 28.0 / 38.9 / 40.7 / 42.9 against 28.8 / 39.7 / 41.1 /
# 43.1 µs; 10240x8192 M=256 / 272 / 300 70.3 / 73.3 / 77.6 against 72.5 / 74.4 / 78.7; 6144x8192
# M=300 47.1 against 48.9. Not on 176-row pairs (6144x4096 M=352 31.3 against 31.2, slower in each
# pass) or whole tiles (round D: 8192x8192 M=520 91.0 against 90.8), nor on two warpgroups' tiles
# (6144x4096 M=1024 KW 75.1-75.9 against 74.7-77.1; 10240x8192 M=512 stream-K 122.7-123.7 against
# 122.8-123.5); with EARLY (the next slice's words read during the wgmmas) slower everywhere
# (6144x4096 M=512 41.2, M=520 42.7; 10240x8192 M=300 81.9). BUFS 3 (two slices' wgmmas in flight),
# routed before at 136-152 rows, lost to it (M=520, 10240x8192 M=300 above).
ONE_BUF_ROWS = (128, 152)
# Two slices a warpgroup's turn (PAIRS, ``swap_pair``: both slices' fragments, then their 8
# wgmmas as one group) on three warpgroups' whole tiles (no K split) of PAIRS_ROWS rows, in
# place of BUFS 1 (BUFS 2 under 128 rows). i4w rounds C and D of 2026-11-28 (H100, the
# median of 5 interleaved passes against the route of before, faster in each pass):
# 6144x4096 M=512 (128 rows) 38.5 / 38.2 against 38.8 / 38.6 µs, M=520 (136) 39.6 against
# 40.1; 6144x8192 M=512 72.8 against 74.3; 10240x8192 M=256 (128) 68.9 against 69.7, M=192
# (96, BUFS 2 before) 59.7 against 61.7; round E, routed (3 passes, against the plans of
# before): 6144x4096 M=400 (104 rows) 33.8 against 34.7, M=512 37.9 against 38.2, M=520 39.4
# against 40.1; 6144x8192 M=512 72.1 against 73.0; 10240x8192 M=224 (112) 64.0 against 66.7,
# M=272 (136) 71.1 against 72.4. Slower on cluster pairs (6144x4096 M=272, 136 rows:
# 26.8 against 26.2; M=300, 152 rows: 28.4 against 28.1) and on 152-row whole tiles
# (10240x8192 M=300: 82.6 against 76.7; 76 accumulator, 32 fragment and 18 word registers a
# thread leave ptxas no room at 128).
PAIRS_ROWS = (96, 136)
PAIR_KINDS = ((3, 0),)
PAIR_ROWS = 50
# (WG, KW): (a tile's time in 128-column tiles of as many rows, its fixed cost in rows,
# its least and most rows)
TILE_COSTS = {
    (2, 0): (1.0, ROW_COST, 0, 256),
    (2, 1): (KW_TIME, ROW_COST, 0, 256),
    (3, 0): (THREE_TIME, THREE_ROW_COST, THREE_MIN_ROWS, THREE_ROWS),
}


def cheapest_tiles(
    m: int, bm: int, n: int, k: int, sms: int, kinds: tuple, pairs: bool = False
) -> tuple:
    """(cost, WG, KW, BM) of ``m``'s row tiles (``balanced_rows``: multiples of 32 with KW,
    else 8) that take the least time on ``sms`` multiprocessors, of the ``kinds`` (WG, KW)
    (``TILE_COSTS``; BM at most ``bm`` and the kind's most, at least the kind's least; WG
    warpgroups side by side without KW): from ceil(m / BM) row tiles to ``ROW_TRIES`` more
    (of at least ``MIN_ROWS`` rows), each at its waves times its time, BM + the fixed rows
    times the kind's width, where ceil(m / BM) row tiles need no K split (``swap_split``),
    and without one only; with ``pairs`` (a split of 2 runs in cluster pairs) a kind of
    ``PAIR_KINDS`` also where they need a split of 2: half that time plus ``PAIR_ROWS``
    times the width; else ``kinds[0]`` and ceil(m / bm) row tiles."""
    wg0, kw0 = kinds[0]
    best = (math.inf, wg0, kw0, balanced_rows(m, bm, 32 if kw0 else 8))
    for wg, kw in kinds:
        width, fixed, least, most = TILE_COSTS.get((wg, kw), (wg / 2, ROW_COST, 0, bm))
        most = min(most, bm)
        across = math.ceil(n / (64 if kw else 64 * wg))
        first = -(-m // most)
        for count in range(first, first + ROW_TRIES + 1):
            rows = balanced_rows(m, -(-m // count), 32 if kw else 8)
            tiles = math.ceil(m / rows) * across
            split = swap_split(tiles, k, sms)
            paired = split == 2 and pairs and (wg, kw) in PAIR_KINDS
            if split > 1 and not paired:
                break
            if (rows >= MIN_ROWS or count == first) and rows >= least:
                cost = math.ceil(tiles / sms) * (rows + fixed) * width
                if paired:  # (one wave: the split of 2 leaves at most sms / 2 tiles)
                    cost = cost / 2 + PAIR_ROWS * width
                best = min(best, (cost, wg, kw, rows))
    return best


def takes_streamk(m: int, n: int, k: int, sms: int, tiles: tuple) -> bool:
    """Whether ``balanced_rows`` x 128 tiles on the stream-K schedule (``SK``) beat the
    ``tiles`` = (WG, BM, KW) of ``swap_plan`` for an ``m x n x k`` product on ``sms``
    multiprocessors: runs of at least ``SK_RUN`` K steps a block (a split tile's parts
    summed once a tile or more), the run (counted in a 256 x 128 tile's values a step) at
    most ``SK_GAIN`` of the other tiles' waves (their K steps, ``swap_split``'s split, in
    the same count), and a's rows within ``SK_A_BYTES`` (the blocks' runs take a's K slices
    at scattered offsets: L2 keeps them only if they fit)."""
    wg, bm, kw = tiles
    k_steps = -(-k // BK)
    steps = math.ceil(m / 256) * math.ceil(n / 128) * k_steps / sms  # a block's run
    cols = 64 * (1 if kw else wg)
    mine = math.ceil(m / bm) * math.ceil(n / cols)
    split = swap_split(mine, k, sms)
    waves = math.ceil(mine * split / sms) * (k_steps / split) * bm * cols / (256 * 128)
    run = steps * balanced_rows(m) / 256
    return steps >= SK_RUN and run <= SK_GAIN * waves and 2 * m * k <= SK_A_BYTES


# The stream-K schedule (``takes_streamk``; int4w rounds A-D of 2026-11-27, H100, x cuBLAS
# f16, the median of 3 interleaved passes, against the route of before in the same pass):
# 10240x8192 M=512, 160 tiles of 256 x 128 in runs of 155 steps against 320 KW tiles of 256
# x 64 in 2.42 waves, 0.95x / 0.94x / 0.94x / 0.94x against 0.88x / 0.86x / 0.85x / 0.84x;
# with balanced row tiles (round D) 10240x8192 M=300 (152-row tiles) 0.88x against 0.31x
# (256-row ones 0.51x), M=384 0.88x against 0.43x, 28672x4096 M=300 0.91x against 0.27x,
# M=600 1.46x against 0.63x, 57344x8192 M=300 0.78x against 0.62x. Where the route's tiles
# fill their waves (97%) it tied or lost: 10240x8192 M=1024 0.98x / 0.97x against 0.97x /
# 0.96x, 8192x8192 M=1024 0.91x against 0.94x, 28672x4096 M=1024 0.95x against 0.98x; with
# short runs it lost (6144x4096 M=512, 47 steps: 0.82-0.84x against 0.93x; 4096x4096 M=512,
# 31 steps: 0.71-0.73x against 0.96x: a part's f32 sums written, and read by the tile's
# head, cost more than the wave they save), as near the route's waves (6144x4096 M=1600,
# 0.875 of them: 0.81x against 0.88x) and where a's rows outgrow 8 MB (4096x14336 M=520,
# 15 MB: 0.55x against 0.61x; 8192x28672 M=1024, 58 MB: 0.92x against 0.99x).
SK_GAIN = 0.82
# The stream-K schedule's cost against whole tiles' (``swap_plan``): its tiles' work spread
# evenly over the SMs, in ``cheapest_tiles``' count, times SK_TIME (the parts' sums, a's
# scattered reads). int4w rounds A and B (H100): 57344x8192 M=300, 896 tiles of 152 x 128
# in 6.79 waves, stream-K 0.73x / 0.84x cuBLAS against whole tiles' 0.87x / 0.83x; with
# 10240x8192 and 28672x4096 at 300-600 rows (0.88-1.37x, ahead of KW tiles) it puts SK_TIME
# at 1.03-1.11.
SK_TIME = 1.05
# Stream-K on BM x 192 tiles (three warpgroups, ``streamk_tiles``) costs SK_THREE_TIME of
# their work spread evenly, and every stream-K schedule SK_FIXED more (its parts' sums,
# whatever the tiles): int4w round C of 2026-11-27 (H100, x cuBLAS f16, the median of 4
# interleaved passes): 28672x4096 M=300, 300 tiles of 152 x 192 in 2.27 waves, 1.02x against
# stream-K on 152 x 128 tiles 0.87x; 57344x8192 M=600, 1196 of 152 x 192 in 9.06 waves,
# 0.98x against 208-row multicast pairs' 0.88x (a's rows 9.8 MB: SK_A_BYTES 10 MB); where
# the tiles are fewer than the SMs whole ones won (10240x8192 M=300, 108 tiles: 0.98x
# whole, 0.96x stream-K, 0.87x stream-K on 152 x 128). Rounds D and E: 57344x8192 M=300
# 1.01x / 0.89x against 152 x 128's 0.83x / 0.84x, M=520 0.91x against 176-row multicast
# pairs' 0.79x, M=600 0.88x / 0.87x against 0.87x / 0.87x; 28672x4096 M=600 1.25x / 1.33x
# against stream-K on 200 x 128's 1.30x / 1.38x (the one loss, above cuBLAS both).
SK_THREE_TIME = 1.0
SK_FIXED = 50
SK_RUN = 128
SK_A_BYTES = 10 << 20


def takes(a, b, s) -> bool:
    """Whether ``matmul_int4`` runs a kernel of this module (``run``) for activations ``a``
    [M, K], words ``b`` and scales ``s`` (``_arrays.Operand``s): ``DECODE_M`` < M <
    ``PREFILL_M``, operands that ``fits``, and an sm_90 GPU (``KAIO_HOPPER_MATMUL=0`` opts
    out, as for the f16 matmuls), or under the simulator when ``IN_SIMULATOR``."""
    from kaio.sim.mode import active as simulating
    from kaio_ops.matmul import _hopper

    on = IN_SIMULATOR if simulating() else _hopper(a)
    return on and DECODE_M < a.shape[0] < PREFILL_M and fits(a, b, s)


# From this M the weight is made f16 once (``_prefill.int4_to_f16``: K N 2 bytes written and
# read again, a few percent of the product's time there) and ``kaio_ops.matmul`` multiplies.
# Measured on an H100 (bench/int4_wgmma.py --swap --variants, two runs): at M = 4096 and 8192
# 0.86-0.95x cuBLAS f16 against int4_swap's 0.78-0.89x; at 2048 the two equal (0.85x). Under
# the whole-program JIT (round C): at 2048 int4_swap 0.91-0.94x against 0.83-0.86x; at 4096
# 0.94x against 0.90x on 4096x4096 but 0.85-0.88x against 0.90x on 8192x8192. With the
# words' ring and the division-free producers (int4w35 round C): 4096x4096 M=4096 1.00x
# against 0.92x, M=8192 0.92x both: never (every M past DECODE_M runs int4_swap).
DEQUANT_M = 1 << 62

# int4_swap's PSUM: a cluster pair's K split of tiles without KW summed by ``pair_sum`` (1)
# or ``cluster_sum`` (0; KW tiles always, and splits past 2, and multicast pairs). int4w
# round C of 2026-11-27 (H100, x cuBLAS f16, the median of 3 interleaved passes, pair_sum
# against cluster_sum in the same passes): 6144x4096 M=272 / 300 / 352 (pairs of 136-176 x
# 192 tiles) 26.7 / 28.6 / 31.3 µs against 27.3 / 29.1 / 32.1 (0.987x / 0.907x / 0.942x
# against 0.966x / 0.890x / 0.919x); on KW tiles no gain: 4096x4096 M=128 13.2 against
# 13.1 µs, 4096x14336 M=256 45.8 against 45.4 (the same kernel timed twice in those passes
# moved by up to 1%).
PSUM = 1

# int4_swap's PDL: programmatic dependent launch (its placement and set-up overlap the end
# of the kernel before it, as matmul_fp8's); 0 launches it plainly. int4w rounds A and E of
# 2026-11-27 (H100, x cuBLAS f16, the median of 3 interleaved passes, against the route
# without it in the same passes): 0.1-1.1% faster at 21 of 24 timings at 300-1500 rows
# (6144x4096 M=300 0.965x against 0.955x, 10240x8192 M=1500 0.950x against 0.945x); slower
# at 10240x8192 M=512 (0.1%), 6144x4096 M=1024 (0.951x against 0.957x) and 57344x8192 M=300
# (476.5 against 438.9 µs, a point that ran at 411-476 µs either way over the rounds).
# PDL 2: the same, and the kernel after it placed once every block has passed its wait
# (``launch_dependents``): int4w round C of 2026-11-28 (H100, the median of 5 interleaved
# passes, against PDL 1 in the same passes): faster at all 8 points timed, by 0.2-0.7 µs
# (6144x4096 M=512 38.2 against 38.9 µs, M=520 40.1 against 40.7, M=300 27.7 against 28.0,
# M=600 42.4 against 42.9; 10240x8192 M=256 / 272 / 300 70.0 / 72.7 / 77.1 against 70.3 /
# 73.3 / 77.6; 6144x8192 M=300 46.9 against 47.1); round D (5 passes), every kind of plan:
# 6144x4096 M=272 / 300 / 352 / 512 / 520 / 1024 26.3 / 27.9 / 30.4 / 38.1 / 39.7 / 73.3
# against 26.6 / 28.3 / 30.6 / 39.0 / 40.2 / 74.6 µs; 10240x8192 M=272 72.1 against 72.3,
# M=512 (stream-K) 121.8 against 122.6, M=1024 (KW) 256.5 against 259.9; 8192x8192 M=520
# 90.3 against 90.8; 4096x4096 M=512 (KW pairs) 25.3 against 25.8; even at 10240x8192
# M=300 (76.8 against 76.7), 28672x4096 M=1024 (322.5 against 323.0) and 57344x8192 M=300
# (434.3 against 437.9, a point that moves by 10% between passes).
PDL = 2

# int4_swap's HEAD (SK): a stream-K tile's head part summed after the block's work items
# (``sum_parts`` out of the main loop: ``wait_eq``'s spin inside it, which each lane leaves
# on its own load, made ptxas keep the rings' state in vector registers, 16 R2UR a turn of
# two slices), on two warpgroups' tiles (three warpgroups' spill with it); 0: in the loop.
# int4w rounds D and E of 2026-11-27 (H100, against HEAD0 in the same passes): 10240x8192
# M=512 123.9 against 124.7 µs (faster in 4 of 4 passes), M=384 107.5 against 110.7 (3 of
# 4).
HEAD = 1

# int4_swap's LEAD (with PAIRS): each work item's first K slice alone, then the pairs (the
# tensor cores' first wgmmas one slice's fragments in, not two); 0: pairs from the first.
# i4w round B of 2026-11-28 (H100, 5 interleaved passes against LEAD 0 in the same passes,
# medians): 6144x4096 M=400 / 512 / 520 33.8 / 37.6 / 38.8 against 33.9 / 37.7 / 39.2 µs
# (faster in 5 / 4 / 5 passes), 6144x8192 M=512 71.8 against 72.0 (4), 10240x8192 M=272
# 70.7 against 71.2 (5); 128 x 192 PAIRS tiles at 6144x4096 M=1024 73.3 against 73.7 (4);
# round C (H100, 3 passes): M=512 / 520 38.3 / 39.3 against 38.5 / 40.1; round E (H200, 3
# passes): M=512 / 520 37.5 / 39.1 against 37.8 / 39.2, 10240x8192 M=272 70.5 against 70.8.
LEAD = 1


def run(a, b, s, out_type):
    """``a @ W`` rounded to ``out_type`` for operands that this module ``takes``:
    ``int4_swap`` with ``swap_plan``'s tiles, or from ``DEQUANT_M`` rows ``dequantized``."""
    if a.shape[0] >= DEQUANT_M:
        return dequantized(a, b, s, out_type)
    from kaio_ops import _arrays

    (m, k), n = a.shape, b.shape[1]
    sms = _arrays.multiprocessors(a)
    return launch_swap(a, b, s, out_type, swap_plan(m, n, k, sms, _arrays.fast_memory(a)), sms)


def dequantized(a, b, s, out_type):
    """``a @ W`` rounded to ``out_type`` through an f16 copy of the weight: the words and
    scales made f16 [K, N] by ``_prefill.int4_to_f16`` (the same bits as ``int4_swap``'s
    weights), then ``kaio_ops.matmul`` (f32 sums, one rounding to ``out_type``)."""
    import importlib

    from kaio_ops import _prefill

    w = _prefill.int4_to_f16(a, [(b, s)])
    return importlib.import_module("kaio_ops.linear").matmul(a.obj, w, out_dtype=out_type)


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


# ---------------------------------------------------------------- the role swap (register A)
# C^T = W^T a^T: the dequantized weights are wgmma's A operand, straight from registers, and the
# activations its B operand from shared memory (module docstring of ``int4_swap``).
SWAP_MAGIC = 0x54806408  # low half: 1024 + (lo nibble ^ 8); high half: 64 + (hi nibble ^ 8)
SWAP_MASK = 0x00F0000F  # the low nibble of byte 0 and the high nibble of byte 2
LOP_AND_XOR = (0xF0 & 0xCC) ^ 0xAA  # lop3's table of (a & b) ^ c


@kaio.gpu_func
def nibble_pair(word: u32, sel: u32, scale: f16x2) -> u32:
    """The two nibbles of byte ``t`` of ``word`` (``sel`` = ``t * 0x1111``: that byte in
    every byte) as the f16 pair ``scale * q`` (low nibble in the low half): the low nibble
    lands in the mantissa of 1024 (ulp 1), the high one four bits up in that of 64 (ulp
    1/16), each biased by 8 (the sign bit flipped); one subtraction makes q exact, one
    multiplication rounds ``scale * q`` once. The mask and the bias in one ``lop3`` (as two
    instructions, ``and`` then ``xor``, ptxas keeps both: an immediate each)."""
    byte = kaio.prmt(word, word, sel)
    biased = kaio.bitcast(kaio.lop3(byte, u32(SWAP_MASK), u32(SWAP_MAGIC), LOP_AND_XOR), f16x2)
    return kaio.bitcast((biased - kaio.bitcast(u32(SWAP_MAGIC), f16x2)) * scale, u32)


@kaio.gpu_func
def load_words(
    sw: u32[:, :, :], sc: u32[:, :], bars: u64[:, :], wr: u32[:, :], wpos: i32[:],
    at: i32[:], nl: u32, WSTAGES: kaio.constexpr, KW: kaio.constexpr = 1,
):  # fmt: skip
    """Wait for the next slice's words (stage ``wpos[0]`` of the words' ring, phase
    ``wpos[1]``) and read this lane's into ``wr``: ``wr[kw, h]`` the word of column ``nl +
    h``, K ``8 kw`` .. ``8 kw + 7``, ``wr[WORD_ROWS, 0]`` the scales of columns ``nl``, ``nl +
    1``; the stage goes to ``at[4]`` (freed once the words are used: ``swap_slice``). ``KW``:
    the warpgroups that take a tile's slices in turn (each reads every ``KW``-th stage)."""
    w = wpos[0]
    kaio.mbarrier_wait(bars, (3, w), u32(wpos[1]))
    for kw in kaio.static_range(WORD_ROWS):
        kaio.load_vector(wr[kw], sw, (w, kw, nl))
    wr[WORD_ROWS, 0] = sc[w, nl // 2]
    at[4] = w
    advance_by(wpos, WSTAGES, KW)


@kaio.gpu_func
def advance_by(pos: i32[:], STAGES: kaio.constexpr, STEP: kaio.constexpr):
    """``_attention_hopper.advance`` by ``STEP`` stages (``STAGES % STEP == 0``): a ring of
    which this warpgroup takes every ``STEP``-th stage."""
    if STEP == 1:
        advance(pos, STAGES)
    else:
        pos[0] += STEP
        if pos[0] >= STAGES:
            pos[0] -= STAGES
            pos[1] ^= 1


@kaio.gpu_func
def swap_slice(
    sw: u32[:, :, :], sc: u32[:, :], sx: f16[:, :, :], bars: u64[:, :], acc: f32[:, :, :],
    af: u32[:, :, :], wr: u32[:, :], wpos: i32[:], at: i32[:], kt: i32, nl: u32, sel: u32,
    lt: u32,
    more: bool_, BUF: kaio.constexpr, STAGES: kaio.constexpr, MC: kaio.constexpr,
    WSTAGES: kaio.constexpr, BUFS: kaio.constexpr, EARLY: kaio.constexpr, KW: kaio.constexpr,
    LATE: kaio.constexpr = 0,
):  # fmt: skip
    """One 64-deep K slice of a consumer warpgroup: its words (``load_words``; with
    ``EARLY`` read during the slice before) made into the A fragments of its 4 steps (buffer
    ``BUF`` of the ``BUFS`` of ``af``; this lane's rows g and g + 8 are W's columns ``nl``
    and ``nl + 1``) and their stage freed (each warp once its reads are done), then the wait
    for the activations' tile (stage ``at[0]`` of their ring, phase ``at[1]``), the 4 wgmmas,
    (``EARLY`` and ``more``: another slice follows) the next slice's words read, the wait
    until at most ``BUFS - 1`` slices' wgmmas are in flight (this one's among them) and the
    activations' stage of the slice ``BUFS - 1`` before freed (``at[2]``, with 3 buffers
    ``at[3]``; with 1 this slice's own), whose wgmmas are then done. The words go ahead of
    the activations in a ring of their own (``WSTAGES``), so the fragments are made while
    the activations are still on their way. With ``KW`` warpgroups taking the tile's slices
    in turn, ``kt`` counts this warpgroup's slices and its stages are every ``KW``-th of
    both rings. ``LATE``: the words' stage is freed once the wgmmas are issued, off the path
    from the fragments to the wgmmas (``free_words``)."""
    if not EARLY:
        load_words(sw, sc, bars, wr, wpos, at, nl, WSTAGES, KW)
    make_fragments(af, wr, sel, BUF)
    if not LATE:
        free_words(bars, at[4], lt)
    s = at[0]
    kaio.mbarrier_wait(bars, (0, s), u32(at[1]))
    kaio.wgmma_fence()
    for kk in kaio.static_range(BK // 16):
        db = kaio.smem_descriptor(sx, (s, 0, kk * 16), SW, 16, 1024)
        kaio.wgmma_f16(acc, af[BUF, kk], db, kt + kk > 0)
    kaio.wgmma_commit()
    if LATE:
        free_words(bars, at[4], lt)
    if EARLY and more:
        load_words(sw, sc, bars, wr, wpos, at, nl, WSTAGES, KW)
    kaio.wgmma_wait(BUFS - 1)
    if BUFS == 1:  # this slice's wgmmas are done: free its own stage
        if lt == 0:
            free_stage(bars, s, MC)
    else:
        if kt >= BUFS - 1 and lt == 0:  # that slice's wgmmas are done: free its stage
            free_stage(bars, at[BUFS], MC)
        if BUFS == 3:
            at[3] = at[2]
        at[2] = s
    advance_by(at, STAGES, KW)


@kaio.gpu_func
def make_fragments(af: u32[:, :, :], wr: u32[:, :], sel: u32, BUF: kaio.constexpr):
    """A slice's A fragments (buffer ``BUF`` of ``af``) from this lane's words and scales
    ``wr`` (``load_words``): ``nibble_pair`` of byte ``sel`` of each word by its column's
    scale."""
    pair = wr[WORD_ROWS, 0]
    scale = kaio.local(u32, 2)
    scale[0] = kaio.prmt(pair, pair, LOW_TWICE)
    scale[1] = kaio.prmt(pair, pair, HIGH_TWICE)
    for kk in kaio.static_range(BK // 16):
        for r in kaio.static_range(4):  # (row g, k 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)
            af[BUF, kk, r] = nibble_pair(
                wr[2 * kk + r // 2, r % 2], sel, kaio.bitcast(scale[r % 2], f16x2)
            )


@kaio.gpu_func
def swap_pair(
    sw: u32[:, :, :], sc: u32[:, :], sx: f16[:, :, :], bars: u64[:, :], acc: f32[:, :, :],
    af: u32[:, :, :], wr: u32[:, :], wpos: i32[:], at: i32[:], kt: i32, nl: u32, sel: u32,
    lt: u32, STAGES: kaio.constexpr, MC: kaio.constexpr, WSTAGES: kaio.constexpr,
    KW: kaio.constexpr, LATE: kaio.constexpr,
):  # fmt: skip
    """Two 64-deep K slices (``kt``, ``kt + 1`` of the warpgroup's) as one turn (``PAIRS``):
    both slices' fragments made (``af``'s two buffers), then their 8 wgmmas issued as one
    group and waited for, both activations' stages freed: a turn's waits, fence and issue
    set-up once for two slices, and the warpgroup's wgmmas twice as long a run while the
    other warpgroups make theirs. ``LATE``: both words' stages freed after the issue."""
    st = kaio.local(i32, 2)  # the slices' stages of a's ring
    wst = kaio.local(i32, 2)  # and of the words' ring
    for b in kaio.static_range(2):
        load_words(sw, sc, bars, wr, wpos, at, nl, WSTAGES, KW)
        make_fragments(af, wr, sel, b)
        wst[b] = at[4]
        if not LATE:
            free_words(bars, at[4], lt)
        st[b] = at[0]
        kaio.mbarrier_wait(bars, (0, st[b]), u32(at[1]))
        advance_by(at, STAGES, KW)
    kaio.wgmma_fence()
    for b in kaio.static_range(2):
        for kk in kaio.static_range(BK // 16):
            db = kaio.smem_descriptor(sx, (st[b], 0, kk * 16), SW, 16, 1024)
            kaio.wgmma_f16(acc, af[b, kk], db, kt + b + kk > 0)
    kaio.wgmma_commit()
    if LATE:
        for b in kaio.static_range(2):
            free_words(bars, wst[b], lt)
    kaio.wgmma_wait(0)
    if lt == 0:
        for b in kaio.static_range(2):
            free_stage(bars, st[b], MC)


@kaio.gpu_func
def free_words(bars: u64[:, :], w: i32, lt: u32):
    """A consumer warp's arrival on the words' stage ``w``'s "free" barrier once its lanes
    have read the words (every warp of every consumer warpgroup arrives), after a proxy
    fence: the reads ordered before the stage's next TMA copy."""
    kaio.fence_proxy_async()
    kaio.sync_warp()
    if lt % 32 == 0:
        kaio.mbarrier_arrive(bars, (4, w))


@kaio.gpu_func
def free_stage(bars: u64[:, :], s: i32, MC: kaio.constexpr):
    """A consumer warpgroup's arrival on ring stage ``s``'s "free" barrier: this block's, or
    with ``MC`` both blocks' of the pair (each block's producer multicasts half of the
    activations into both, so a stage is free once both blocks' consumers are done; the pair
    is ranks 2 p, 2 p + 1 of the cluster)."""
    if MC:
        pair = kaio.cluster_rank() // 2 * 2
        kaio.mbarrier_arrive_cluster(bars, (1, s), pair)
        kaio.mbarrier_arrive_cluster(bars, (1, s), pair + 1)
    else:
        kaio.mbarrier_arrive(bars, (1, s))


@kaio.gpu_func
def store_swapped(
    acc: f32[:, :, :], c: OUT[:, :], ws: f32[:, :], m0: u32, n: u32, lt: u32, M: u32, N: u32,
    BM: kaio.constexpr, SPLIT: kaio.constexpr, OUT: kaio.constexpr, lo: u32 = 0,
    CLAMP: kaio.constexpr = 0,
):  # fmt: skip
    """This lane's part of C^T's tile: acc[j, h, e] is c[m0 + 8 j + 2 t + e, n + h]
    (columns n, n + 1 adjacent: one store a pair), rows below M (``CLAMP``: and from ``lo``)
    only. Without a K split rounded to OUT into ``c``; with one the raw f32 sums into this
    slice's rows of ``ws`` [SPLIT * M, N]."""
    if n < N:  # N % 8 == 0 and n even: n + 1 < N too
        for j in kaio.static_range(BM // 8):
            for e in kaio.static_range(2):
                m = m0 + 8 * j + 2 * (lt % 4) + e
                mine = m < M
                if CLAMP:
                    mine = m < M and m >= lo
                if mine:
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


# Why CLAMP (every launch without CL: ``swap_launch_plan``): KW tiles whose last row tile
# lay partly past M ran slower than whole ones of the same plan, the more so the more rows
# past M (int4w rounds C and D of 2026-11-27, H100: 6144x4096 KW tiles of 160 rows 95.0 µs
# at M=520, 120 rows past M, against 52.7 at M=640; of 256 rows 112.6 at M=600 against
# 71.9 at M=768; 8192x8192 224 rows 157.2 at M=600 against 123.0 at M=672). With the last
# row tile moved up (round D): 6144x4096 M=520 52.8 against 94.6 µs, M=600 (256 rows) 72.4
# against 112.9; 8192x8192 M=600 126.9 against 155.2; 4096x4096 M=1500 0.945x cuBLAS
# against 0.889x; 128-column tiles within 2% either way (57344x8192 M=300 0.833x against
# 0.816x, 6144x4096 M=520 0.708x against 0.712x).
@kaio.gpu_func
def tile_top(r: u32, M: u32, BM: kaio.constexpr, CLAMP: kaio.constexpr) -> u32:
    """The first row of a that row tile ``r`` multiplies: ``r BM``, or with ``CLAMP`` at
    most M - BM (where M >= BM), the last row tile then ending at row M - 1 (it repeats the
    rows of the tile before it that it overlaps, which that tile stores) rather than
    reading rows past M (that a's TMA copies fill with zeros)."""
    top = r * BM
    if CLAMP:
        top = kaio.min(top, kaio.max(M, u32(BM)) - BM)
    return top


@kaio.gpu_kernel
def int4_swap(
    tx: kaio.tensormap, tw: kaio.tensormap, ts: kaio.tensormap, c: OUT[:, :], ws: f32[:, :],
    counters: i32[:], M: u32, N: u32, K: u32, k_slice: u32, dp_tiles: i32,
    WG: kaio.constexpr, BM: kaio.constexpr,
    STAGES: kaio.constexpr, SPLIT: kaio.constexpr, CL: kaio.constexpr, REGS: kaio.constexpr,
    OUT: kaio.constexpr, MC: kaio.constexpr, WSTAGES: kaio.constexpr, BUFS: kaio.constexpr,
    EARLY: kaio.constexpr, GROUP: kaio.constexpr, KW: kaio.constexpr, LATE: kaio.constexpr,
    SK: kaio.constexpr, CLAMP: kaio.constexpr, PDL: kaio.constexpr, PSUM: kaio.constexpr,
    HEAD: kaio.constexpr, PAIRS: kaio.constexpr, LEAD: kaio.constexpr,
):  # fmt: skip
    """c = a @ W as C^T = W^T a^T, the Marlin / Machete design on wgmma: a persistent block
    computes ``BM x 64 WG`` tiles of c (BM rows of a, 64 WG columns of W) with ``WG`` consumer
    warpgroups and a producer warpgroup, two of whose threads copy each 64-deep K slice by TMA:
    thread 0 a's ``BM x 64`` rows (128-byte swizzled, wgmma's B operand, K-major) into a
    ``STAGES``-deep ring, thread 32 the words ``8 x 64 WG`` and the scale row into a ring of
    their own, ``WSTAGES`` deep, freed as soon as the words are read: they run ahead, and a
    slice's fragments are made before its activations land (with one ring for both, the
    consumers waited for the activations, then dequantized). Consumer warpgroup wg owns W's
    columns ``64 wg .. 64 wg + 63`` of the tile as the 64 rows of its ``m64n{BM}k16`` wgmmas,
    row 16 w + g + 8 h (warp w, lane 4 g + t) being column ``16 w + 2 g + h``: a lane reads its
    two columns' 8 words of the slice in 8-byte loads and makes its A fragments in registers
    (``nibble_pair``: byte t of a word is k 2t, 2t + 1, exactly the fragment's pairs), ``BUFS``
    (1 to 3) slices' fragments in turn so that a slice is dequantized while the wgmmas of the
    ``BUFS - 1`` before it run (with 1, once the warpgroup's wgmmas are done, while the other
    warpgroups' run). No f16 copy of the weight, in memory or in shared memory. With a
    K split (``grid.z``) the raw f32 partial tiles go to ``ws`` and ``finish`` sums them
    (``SPLIT`` 2 for any split, 1 for none: one specialization for every split); with ``CL`` the
    K split is a cluster of ``SPLIT`` blocks along x, one tile each, summed through distributed
    shared memory (``cluster_sum``). ``tx``: a [M, K] in boxes (BM, 64); ``tw``: the words [K /
    8, N] in boxes (8, 64 WG); ``ts``: the scales [K / 128, N] in boxes (1, 64 WG). ``REGS``:
    the registers a consumer thread takes (``setmaxnreg``; 0: none). ``MC``: a cluster of two
    blocks takes two tiles side by side (the same rows of a, columns ``2
    p`` and ``2 p + 1`` of W's tiles, one a block), each block's producer copying half of a's
    rows by TMA multicast into both blocks (``tx`` in boxes (BM / 2, 64)): a's rows cross from
    L2 once for the pair; with ``CL`` too the cluster is ``SPLIT`` such pairs (rank ``2 r +
    p``: K slice r, tile p), each pair's blocks multicasting to each other, and the blocks of
    a tile summed by ``cluster_sum``. ``GROUP``: the tile order's rows a group
    (``swap_origin``). ``KW``: the ``WG`` consumer warpgroups share a ``BM x 64`` tile and
    take its K slices in turn (slice j to warpgroup j % WG: each uses every WG-th stage of
    both rings, which needs STAGES, WSTAGES and every block's slice count multiples of WG),
    their partial tiles summed at the tile's end through shared memory (``red``, after the
    barriers) by warpgroup 0, which stores the tile: a K split inside the block, two
    warpgroups' latency on a tile that the grid has too few of to split otherwise (no
    multicast pairs). ``CLAMP``: the last row tile ends at row M - 1 (``tile_top``; not
    with ``CL``). ``SK``: the stream-K schedule of ``_gemm_streamk`` (the first
    ``dp_tiles`` tiles whole, a block each in turn, then the K steps of the others in equal
    runs, one a block: ``swap_schedule``), the parts of a tile split between blocks summed
    by the tile's head (``publish_part``, ``sum_parts``: ``ws`` the other parts,
    ``counters`` zeroed, 4 WG a stream-K tile); no K split along z, no cluster, no ``KW``;
    with ``HEAD`` the head's part, always the block's last work item, summed after the loop
    over the work items. ``PDL``: launched with programmatic dependent launch, the block
    placed and its barriers set up while the kernel before it ends; every thread waits for
    that kernel (``kaio.grid_dependency_wait``) before any global memory is touched; with
    ``PDL`` 2 the kernel after it may then be placed too (``kaio.launch_dependents``: its
    blocks take the multiprocessors this grid leaves free and those of its blocks that
    exit, and wait there for the whole grid). ``PAIRS`` (with ``BUFS`` 2): a warpgroup takes
    its slices two a turn, their 8 wgmmas one group (``swap_pair``), an odd last one alone;
    with ``LEAD`` a work item's first slice alone too, then the pairs."""
    kaio.launch_bounds(WG * 128 + 128, 1)
    if CL:
        kaio.cluster_dims(SPLIT * (1 + MC))
    if MC and not CL:
        kaio.cluster_dims(2)
    COLS = WG - (WG - 1) * KW  # the warpgroups side by side along the tile's columns
    KSTEP = 1 + (WG - 1) * KW  # the warpgroups taking a tile's slices in turn
    BNW = 64 * COLS
    X_BYTES = BM * BK * 2
    W_BYTES = WORD_ROWS * BNW * 4
    S_BYTES = BNW * 2
    RING = STAGES if STAGES > WSTAGES else WSTAGES
    sx = kaio.shared_dynamic(f16, (STAGES, BM, BK), 0)
    sw = kaio.shared_dynamic(u32, (WSTAGES, WORD_ROWS, BNW), STAGES * X_BYTES)
    ss = kaio.shared_dynamic(f16, (WSTAGES, BNW), STAGES * X_BYTES + WSTAGES * W_BYTES)
    sc = kaio.shared_dynamic(u32, (WSTAGES, BNW // 2), STAGES * X_BYTES + WSTAGES * W_BYTES)
    # rows: 0 a's "full" (TMA), 1 a's "free" (the slice's wgmmas done), 2 (CL): every wgmma
    # done; 3 the words' "full", 4 their "free" (read by every consumer warp); KW: 5 the
    # partial tiles in ``red``, 6 ``red`` read (free)
    BARS_AT = STAGES * X_BYTES + WSTAGES * (W_BYTES + S_BYTES)
    bars = kaio.shared_dynamic(u64, (5 + 2 * KW, RING), BARS_AT)
    # KW: the partial tiles of warpgroups 1 .. WG - 1 after the barriers (else unused, a
    # stub over the rings)
    RED_AT = (BARS_AT + (5 + 2 * KW) * 8 * RING + 15) // 16 * 16 * KW
    RED_WG = (WG - 1) * KW + 1 - KW
    red = kaio.shared_dynamic(f32, (1 + KW, RED_WG, RED_CHUNK * KW + 1 - KW, 128), RED_AT)
    part = kaio.shared_dynamic(f32, (BM, BNW), 0)  # CL: the partial tile, over the idle ring
    pairs = kaio.shared_dynamic(u64, (BM, BNW // 2), 0)  # part's column pairs
    stage = kaio.shared_dynamic(f32, (BM // 8, WG * 128, 4), 0)  # SK: a part, over the rings
    # PSUM: the peer's rows of this block's partial tile, over the rings (``pair_sum``)
    share = kaio.shared_dynamic(f32, ((BM // 8 + 1) // 2, WG * 128, 4), 0)
    quads = kaio.shared_dynamic(u64, ((BM // 8 + 1) // 2, WG * 128, 2), 0)  # share's pairs
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    grid_m = (M + BM - 1) // BM
    grid_n = (N + BNW - 1) // BNW
    first = kaio.block_idx_x()
    step = kaio.grid_dim_x()
    k_begin = kaio.block_idx_z() * k_slice
    if CL:  # a cluster per tile (MC: per pair of tiles), its blocks (pairs) the K slices
        first = first // (SPLIT * (1 + MC))
        step = step // (SPLIT * (1 + MC))
        k_begin = kaio.cluster_rank() // (1 + MC) * k_slice
    mine = u32(0)  # MC: this block's tile of the pair
    if MC:  # a cluster per pair of tiles: the schedule's columns are pairs
        if not CL:
            first = first // 2
            step = step // 2
        grid_n = (grid_n + 1) // 2
        mine = kaio.cluster_rank() % 2
    my_tiles = i32((grid_m * grid_n - first + step - 1) // step)
    k_end = kaio.min(k_begin + k_slice, K)
    k_tiles = i32((k_end - k_begin + BK - 1) // BK)
    sched = kaio.local(i32, 8)  # the block's work items (swap_schedule)
    swap_schedule(sched, first, step, my_tiles, dp_tiles, grid_m * grid_n, k_tiles, SK)
    segments = swap_segments(sched, k_tiles, SK)  # tiles, or (SK) parts of tiles
    if t == 0:
        for i in kaio.static_range(STAGES):
            kaio.mbarrier_init(bars, (0, i), 1)
            kaio.mbarrier_init(bars, (1, i), COLS * (1 + MC))
        for i in kaio.static_range(WSTAGES):
            kaio.mbarrier_init(bars, (3, i), 1)
            kaio.mbarrier_init(bars, (4, i), COLS * 4)
        kaio.mbarrier_init(bars, (2, 0), WG * 128)
        if KW:
            for b in kaio.static_range(2):
                kaio.mbarrier_init(bars, (5, b), (WG - 1) * 128)
                kaio.mbarrier_init(bars, (6, b), 128)
        kaio.fence_proxy_async()
    kaio.sync_threads()
    if MC:
        kaio.cluster_sync()  # the other block's barriers are ready before any copy or arrival
    if PDL:  # (no global memory touched above)
        kaio.grid_dependency_wait()
    if PDL == 2:
        kaio.launch_dependents()
    if wg < WG:  # the consumers
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        acc = kaio.local(f32, (BM // 8, 2, 2))
        lane = lt % 32
        nl = 64 * wg + 16 * (lt // 32) + 2 * (lane // 4)  # this lane's columns nl, nl + 1
        af = kaio.local(u32, (BUFS, BK // 16, 4))  # BUFS slices' A fragments
        # (a's ring stage, its phase, the stages of the slice before and of the one before
        # that, the words' stage read last); wpos: the words' stage to read next, its phase
        at = kaio.local(i32, 5)
        wpos = kaio.local(i32, 2)
        for i in kaio.static_range(5):
            at[i] = 0
        wpos[0] = 0
        wpos[1] = 0
        stores = True  # the warpgroup stores its sums (KW: warpgroup 0 only)
        if KW:  # slices wg, wg + WG, ... of the tile: stages wg, wg + WG, ... of both rings
            nl -= 64 * wg  # (every warpgroup the tile's 64 columns)
            stores = wg == 0
            at[0] = i32(wg)
            wpos[0] = i32(wg)
        sel = (lane % 4) * 0x1111
        wr = kaio.local(u32, (WORD_ROWS + 1, 2))  # a slice's words and scales (load_words)
        head = i32(-1)  # SK, HEAD: the stream-K tile whose head part is the block's last item
        if EARLY and segments > 0:  # the first slice's words; then each slice reads the next's
            load_words(sw, sc, bars, wr, wpos, at, nl, WSTAGES, KSTEP)
        for i in range(segments):
            tile, kb, ke = work_item(sched, i, k_tiles, SK)
            origin = swap_origin(u32(tile), grid_m, grid_n, GROUP)
            last = i == segments - 1
            ck = (ke - kb) // KSTEP  # this warpgroup's slices of the item
            # slices in groups of BUFS, the fragment buffers in turn; the last k_tiles %
            # BUFS slices after every wgmma is done (ptxas serializes all wgmmas if any
            # path could redefine the registers of one in flight). PAIRS: two slices a
            # turn (``swap_pair``, BUFS 2), an odd last one alone (as BUFS 1's); with LEAD
            # the item's first slice alone too (its wgmmas start one slice's fragments in)
            lead = i32(0)
            if PAIRS and LEAD and ck > 0:
                swap_slice(sw, sc, sx, bars, acc, af, wr, wpos, at, 0, nl, sel, lt, True, 0,
                           STAGES, MC, WSTAGES, 1, EARLY, KSTEP, LATE)  # fmt: skip
                lead = 1
            for kt in range(lead, ck - (BUFS - 1), BUFS):
                if PAIRS:
                    swap_pair(sw, sc, sx, bars, acc, af, wr, wpos, at, kt, nl, sel, lt,
                              STAGES, MC, WSTAGES, KSTEP, LATE)  # fmt: skip
                    continue
                for b in kaio.static_range(BUFS):
                    more = not (last and kt + b == ck - 1)
                    swap_slice(sw, sc, sx, bars, acc, af, wr, wpos, at, kt + b, nl, sel, lt,
                               more, b, STAGES, MC, WSTAGES, BUFS, EARLY, KSTEP,
                               LATE)  # fmt: skip
            rest = (ck - lead) % BUFS
            if rest:
                kaio.wgmma_wait(0)
                for b in kaio.static_range(BUFS - 1):
                    if b < rest:
                        kt = ck - rest + b
                        more = not (last and kt == ck - 1)
                        # (PAIRS: one slice, its wgmmas waited for: BUFS 1's)
                        swap_slice(sw, sc, sx, bars, acc, af, wr, wpos, at, kt, nl, sel, lt,
                                   more, b, STAGES, MC, WSTAGES, 1 if PAIRS else BUFS, EARLY,
                                   KSTEP, LATE)  # fmt: skip
            kaio.wgmma_wait(0)
            if BUFS > 1 and not PAIRS and lt == 0:  # the tile's last slices, not yet freed
                if BUFS == 3 and ck > 1:
                    free_stage(bars, at[3], MC)
                free_stage(bars, at[2], MC)
            if KW:  # the warpgroups' partial tiles summed by warpgroup 0, which stores it
                reduce_warpgroups(acc, red, bars, wg, lt, i, BM, WG)
            n = (tile_col(origin) * (1 + MC) + mine) * BNW + nl
            done = stores
            if SK and (kb > 0 or ke < k_tiles):  # a part of the tile: the head sums them
                done = False
                if kb > 0:
                    publish_part(ws, counters, acc, sched, tile, k_tiles, t, BM, WG)
                elif HEAD:
                    head = tile
                else:
                    sum_parts(ws, counters, acc, stage, bars, sched, tile, k_tiles, t, BM, WG)
                    done = True
            if not CL and done:  # (with CL the one tile is summed below: cluster_sum)
                top = tile_top(tile_row(origin), M, BM, CLAMP)
                store_swapped(acc, c, ws, top, n, lane, M, N, BM, SPLIT, OUT,
                              tile_row(origin) * BM, CLAMP)  # fmt: skip
        if SK and HEAD and head >= 0:  # the block's last item a tile's head: its sum here,
            # out of the loop (wait_eq's spin, which the lanes may leave apart, inside the
            # loop makes ptxas keep the rings' state in vector registers: R2UR a wgmma)
            sum_parts(ws, counters, acc, stage, bars, sched, head, k_tiles, t, BM, WG)
            origin = swap_origin(u32(head), grid_m, grid_n, GROUP)
            top = tile_top(tile_row(origin), M, BM, CLAMP)
            store_swapped(acc, c, ws, top, tile_col(origin) * BNW + nl, lane, M, N, BM, SPLIT,
                          OUT, tile_row(origin) * BM, CLAMP)  # fmt: skip
        if CL:  # the one tile's partial sums, over the ring once every wgmma is done
            kaio.mbarrier_arrive(bars, (2, 0))
            kaio.mbarrier_wait(bars, (2, 0), u32(0))
            if PSUM:  # a cluster pair: half the rows each, the other half through the peer
                origin = swap_origin(first, grid_m, grid_n, GROUP)  # (the cluster's one tile)
                pair_sum(acc, share, quads, c, tile_row(origin) * BM,
                         tile_col(origin) * BNW + nl, t, lane, M, N, stores, BM, OUT)  # fmt: skip
            elif stores:  # (KW: warpgroup 0 holds the block's sum)
                for j in kaio.static_range(BM // 8):  # acc[j, h, e]: row 8j + 2t + e, col nl + h
                    for e in kaio.static_range(2):
                        pair = kaio.local(f32, 2)
                        pair[0] = acc[j, 0, e]
                        pair[1] = acc[j, 1, e]
                        kaio.store_vector(part, (8 * j + 2 * (lane % 4) + e, nl), pair)
    else:  # the producer warpgroup's threads 0 (a's rows) and 32 (the words): TMA copies
        if REGS:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt < 32:  # (two branches: the simulator runs either while the other waits)
            if lt == 0:
                produce(sx, sw, ss, bars, tx, tw, ts, sched, segments, k_tiles, k_begin,
                        grid_m, grid_n, mine, M, BM, COLS, STAGES, MC, 0, GROUP, SK,
                        CLAMP)  # fmt: skip
        elif lt == 32:
            produce(sx, sw, ss, bars, tx, tw, ts, sched, segments, k_tiles, k_begin,
                    grid_m, grid_n, mine, M, BM, COLS, WSTAGES, MC, 1, GROUP, SK,
                    CLAMP)  # fmt: skip
        if CL:  # the cluster barriers below wait for the threads that have not exited
            return
    if CL and not PSUM:  # one tile a cluster: sum its K slices through distributed shared
        # memory, in the consumers only (the producer has exited: ptxas compiles this with
        # their registers)
        kaio.cluster_sync()
        origin = swap_origin(first, grid_m, grid_n, GROUP)
        n0 = (tile_col(origin) * (1 + MC) + mine) * BNW
        cluster_sum(pairs, c, tile_row(origin) * BM, n0, t, M, N, BM, BNW, WG * 128, SPLIT, OUT,
                    MC)  # fmt: skip
        kaio.cluster_sync()  # no block leaves while another reads its part
    if MC:  # no block leaves while the other may still copy into it or free its stages
        kaio.cluster_sync()


@kaio.gpu_func
def pair_sum(
    acc: f32[:, :, :], share: f32[:, :, :], quads: u64[:, :, :], c: OUT[:, :], top: u32,
    n: u32, t: u32, lane: u32, M: u32, N: u32, stores: bool_, BM: kaio.constexpr,
    OUT: kaio.constexpr,
):  # fmt: skip
    """``int4_swap``'s K split of 2 in a cluster pair (``PSUM``), every wgmma of the block
    done: each block sums and stores the row groups ``j`` of the tile (``acc[j]``: rows
    ``top + 8 j + 2 (lane % 4) + e`` of columns ``n``, ``n + 1``) of its rank's parity. A
    thread first puts its values of the other groups in ``share[j // 2, t]`` (its own
    16 bytes, threads side by side), then, the pair synchronized, adds the peer's values of
    its groups, at the same place of the peer's ``share`` (``quads``: its 64-bit view), to
    its own, in rank order (the same bits run to run), and stores them: half the tile
    through distributed shared memory, none of it through this block's shared memory
    twice. ``stores``: the thread holds sums (KW: warpgroup 0 only); every consumer thread
    takes part in the pair's barriers."""
    rank = kaio.cluster_rank()
    quad = kaio.local(f32, 4)  # acc[j, :, :]: (col n, n + 1) of row e = 0, then e = 1
    if stores:
        for j in kaio.static_range(BM // 8):
            if j % 2 != rank:
                for v in kaio.static_range(4):
                    quad[v] = acc[j, v % 2, v // 2]
                kaio.store_vector(share, (j // 2, t, 0), quad)
    kaio.cluster_sync()
    if stores:
        for j in kaio.static_range(BM // 8):
            if j % 2 == rank:
                lo = kaio.cluster_load(quads, (j // 2, t, 0), 1 - rank)
                hi = kaio.cluster_load(quads, (j // 2, t, 1), 1 - rank)
                peer = kaio.local(f32, 4)
                peer[0] = kaio.bitcast(u32(lo), f32)
                peer[1] = kaio.bitcast(u32(lo >> 32), f32)
                peer[2] = kaio.bitcast(u32(hi), f32)
                peer[3] = kaio.bitcast(u32(hi >> 32), f32)
                for v in kaio.static_range(4):
                    if rank == 0:
                        quad[v] = acc[j, v % 2, v // 2] + peer[v]
                    else:
                        quad[v] = peer[v] + acc[j, v % 2, v // 2]
                for e in kaio.static_range(2):
                    m = top + 8 * j + 2 * (lane % 4) + e
                    if m < M and n < N:
                        out = kaio.local(OUT, 2)
                        out[0] = OUT(quad[2 * e])
                        out[1] = OUT(quad[2 * e + 1])
                        kaio.store_vector(c, (m, n), out)
    kaio.cluster_sync()  # no block leaves while the other reads its share


RED_CHUNK = 16  # KW: the values of a thread's partial tile that go through ``red`` at a time


@kaio.gpu_func
def reduce_warpgroups(
    acc: f32[:, :, :], red: f32[:, :, :, :], bars: u64[:, :], wg: u32, lt: u32, i: i32,
    BM: kaio.constexpr, WG: kaio.constexpr,
):  # fmt: skip
    """``int4_swap`` with ``KW``, tile ``i`` of the block done: warpgroups 1 .. WG - 1 pass
    their partial tiles to warpgroup 0, which adds them to its ``acc`` in warpgroup order,
    ``RED_CHUNK`` values a thread at a time through two buffers (``red[b, wg - 1, u, lt]``,
    the threads side by side): chunk n (counted over the block's tiles) goes through buffer
    n % 2 once warpgroup 0 has read chunk n - 2 from it (barrier row 6) and is read once
    written (row 5); each barrier of a buffer completes once every two chunks (parity n // 2
    % 2). A chunk is written while the one before is added, in 16 KB a warpgroup."""
    CHUNKS = BM // 2 // RED_CHUNK
    if wg > 0:
        for c in kaio.static_range(CHUNKS):
            n = i * CHUNKS + c
            if n >= 2:
                kaio.mbarrier_wait(bars, (6, n % 2), u32((n // 2 - 1) & 1))
            for u in kaio.static_range(RED_CHUNK):
                v = RED_CHUNK * c + u  # acc's values in order: acc[v // 4, v // 2 % 2, v % 2]
                red[n % 2, wg - 1, u, lt] = acc[v // 4, v // 2 % 2, v % 2]
            kaio.mbarrier_arrive(bars, (5, n % 2))
    else:
        for c in kaio.static_range(CHUNKS):
            n = i * CHUNKS + c
            kaio.mbarrier_wait(bars, (5, n % 2), u32((n // 2) & 1))
            for q in kaio.static_range(WG - 1):
                for u in kaio.static_range(RED_CHUNK):
                    v = RED_CHUNK * c + u
                    acc[v // 4, v // 2 % 2, v % 2] += red[n % 2, q, u, lt]
            kaio.mbarrier_arrive(bars, (6, n % 2))


@kaio.gpu_func
def swap_schedule(sched: i32[:], first: u32, step: u32, tiles: i32, dp_tiles: i32, total: u32,
                  k_tiles: i32, SK: kaio.constexpr):  # fmt: skip
    """The block's work items for ``work_item``: ``sched`` = (its first tile, the step to
    its next, its data-parallel tiles, the grid's, the first and the end of its stream-K
    run of K steps, the stream-K steps of the grid, the stream-K tiles). Without ``SK``
    every one of its ``tiles`` tiles is whole; with it (``first`` the block, ``step`` the
    grid) the first ``dp_tiles`` of the ``total`` tiles go whole and the K steps of the
    rest in equal runs (``_gemm_streamk``'s schedule, block b taking run g - 1 - b)."""
    sched[0] = i32(first)
    sched[1] = i32(step)
    sched[2] = tiles
    for i in kaio.static_range(3, 8):
        sched[i] = 0
    if SK:
        b = i32(first)
        g = i32(step)
        work = (i32(total) - dp_tiles) * k_tiles
        sched[2] = (dp_tiles - b + g - 1) // g
        sched[3] = dp_tiles
        sched[4] = run_bound(g - 1 - b, g, work)  # (the runs in reverse block order)
        sched[5] = run_bound(g - b, g, work)
        sched[6] = work
        sched[7] = i32(total) - dp_tiles


@kaio.gpu_func
def swap_segments(sched: i32[:], k_tiles: i32, SK: kaio.constexpr) -> i32:
    """The number of the block's work items (``swap_schedule``): its data-parallel tiles,
    then (``SK``) the tiles its stream-K run touches."""
    if not SK:
        return sched[2]
    first = sched[4]
    end = sched[5]
    return sched[2] + kaio.select(end > first, (end - 1) // k_tiles - first // k_tiles + 1, 0)


@kaio.gpu_func
def work_item(sched: i32[:], i: i32, k_tiles: i32, SK: kaio.constexpr):
    """(tile, first K step, end K step) of the block's work item ``i`` (``swap_schedule``;
    with ``SK`` ``_gemm_streamk.segment``)."""
    if not SK:
        return sched[0] + i * sched[1], i32(0), k_tiles
    return segment(i, sched[0], sched[1], sched[2], sched[3], sched[4], k_tiles, sched[5])


@kaio.gpu_func
def fixup_place(ws: f32[:, :], sched: i32[:], tile: i32, k_tiles: i32, t: u32,
                BM: kaio.constexpr, WG: kaio.constexpr):  # fmt: skip
    """Where stream-K tile ``tile``'s parts meet (``publish_part``, ``sum_parts``): (the
    block whose run holds its first K step, its parts, its first row of ``ws``, consumer
    thread ``t``'s warp's counter in ``counters``)."""
    tile_sk = tile - sched[3]
    lo = owner(tile_sk * k_tiles, sched[1], sched[6])
    parts = owner(tile_sk * k_tiles + k_tiles - 1, sched[1], sched[6]) - lo + 1
    width = i32(ws.shape[0]) // (BM // 8 * sched[7])  # the slots of a tile
    row = u32(tile_sk * width * (BM // 8))
    return lo, parts, row, tile_sk * (4 * WG) + i32(t // 32)


@kaio.gpu_func
def publish_part(
    ws: f32[:, :], counters: i32[:], acc: f32[:, :, :], sched: i32[:], tile: i32,
    k_tiles: i32, t: u32, BM: kaio.constexpr, WG: kaio.constexpr,
):  # fmt: skip
    """``int4_swap`` with ``SK``: one warp's part of a stream-K tile after its head
    (consumer thread ``t``'s sums ``acc``) to ``ws`` [stream-K tiles x slots x BM / 8, 512
    WG] (part z of a tile, its run's place among the tile's runs, at rows ``(tile x slots +
    z) BM / 8 + j``, thread t's ``acc[j]`` at columns ``4 t`` .. ``4 t + 3``), then the
    warp's arrival on the tile's counter of its 16 columns in ``counters``. The tile's head
    (``sum_parts``: K steps from 0, the end of its block's run, the highest block of the
    tile's, the runs being in reverse block order, ``swap_schedule``) adds them."""
    lo, _, row, slot = fixup_place(ws, sched, tile, k_tiles, t, BM, WG)
    run = sched[1] - 1 - sched[0]
    quad = kaio.local(f32, 4)  # acc[j, :, :]: a row of ws, 16 bytes a thread side by side
    mine = u32(run - lo) * (BM // 8) + row
    for j in kaio.static_range(BM // 8):
        for v in kaio.static_range(4):
            quad[v] = acc[j, v % 2, v // 2]
        kaio.store_vector(ws, (mine + j, 4 * t), quad)
    kaio.threadfence()
    kaio.sync_warp()
    if t % 32 == 0:
        kaio.atomic_add(counters, slot, 1)


@kaio.gpu_func
def sum_parts(
    ws: f32[:, :], counters: i32[:], acc: f32[:, :, :], stage: f32[:, :, :], bars: u64[:, :],
    sched: i32[:], tile: i32, k_tiles: i32, t: u32, BM: kaio.constexpr, WG: kaio.constexpr,
):  # fmt: skip
    """``int4_swap`` with ``SK``: the head of stream-K tile ``tile`` (its block's last work
    item) waits for the tile's other parts (``publish_part``, done at the start of lower
    blocks' runs: ``wait_eq``'s rule, no deadlock) and adds them to its own ``acc``, which
    never leaves the registers, in order (the same bits run to run), zeroing the counter
    again. A part is read into ``stage`` [BM / 8, 128 WG, 4] by ``cp_async`` (over the
    rings, idle once both consumer warpgroups are done), its loads all in flight at once."""
    _, parts, row, slot = fixup_place(ws, sched, tile, k_tiles, t, BM, WG)
    quad = kaio.local(f32, 4)
    kaio.wait_eq(counters, slot, parts - 1)
    kaio.sync_warp()
    if t % 32 == 0:
        counters[slot] = 0  # zero again for the next launch on the stream
    kaio.mbarrier_arrive(bars, (2, 0))  # both warpgroups' wgmmas done: the rings idle
    kaio.mbarrier_wait(bars, (2, 0), u32(0))
    for z in range(1, parts):
        for j in kaio.static_range(BM // 8):
            kaio.cp_async(stage, (j, t, 0), ws, (u32(z) * (BM // 8) + row + j, 4 * t), 16)
        kaio.cp_async_wait_all()
        for j in kaio.static_range(BM // 8):
            kaio.load_vector(quad, stage, (j, t, 0))
            for v in kaio.static_range(4):
                acc[j, v % 2, v // 2] += quad[v]


@kaio.gpu_func
def swap_origin(pid: u32, grid_m: u32, grid_n: u32, GROUP: kaio.constexpr) -> u64:
    """``_matmul_kernels.tile_origin`` (tile ``pid``'s row and column, packed) with
    ``GROUP`` tile rows a group (``_matmul_hopper.grouped``'s order) instead of ``GROUP_M``."""
    idx = u32(grouped(i32(pid), i32(grid_m), i32(grid_n), GROUP))
    return u64(idx // grid_n) << 32 | u64(idx % grid_n)


@kaio.gpu_func
def next_free(bars: u64[:, :], ring: i32[:], j: i32, FREE: kaio.constexpr,
              STAGES: kaio.constexpr) -> i32:  # fmt: skip
    """The stage of copy ``j`` in a ``STAGES``-deep ring whose next stage and phase are
    ``ring[0]``, ``ring[1]`` (advanced here), once its "free" barrier (row ``FREE`` of
    ``bars``) says the consumers are done with copy ``j - STAGES``: no division a copy (a
    producer thread's index arithmetic is on the pipeline's critical path)."""
    s = ring[0]
    if j >= STAGES:
        kaio.mbarrier_wait(bars, (FREE, s), u32(ring[1] ^ 1))
    advance(ring, STAGES)
    return s


@kaio.gpu_func
def produce(
    sx: f16[:, :, :], sw: u32[:, :, :], ss: f16[:, :], bars: u64[:, :], tx: kaio.tensormap,
    tw: kaio.tensormap, ts: kaio.tensormap, sched: i32[:], segments: i32, k_tiles: i32,
    k_begin: u32, grid_m: u32, grid_n: u32, mine: u32, M: u32, BM: kaio.constexpr,
    WG: kaio.constexpr, STAGES: kaio.constexpr, MC: kaio.constexpr, WORDS: kaio.constexpr,
    GROUP: kaio.constexpr, SK: kaio.constexpr, CLAMP: kaio.constexpr,
):  # fmt: skip
    """``int4_swap``'s copies, the K slices of the block's ``segments`` work items
    (``work_item``: tiles of ``k_tiles`` slices, or parts of them) into a ``STAGES``-deep
    ring, each stage once the consumers freed the slice it held before: a's rows (with
    ``MC``, freed by the consumers of both blocks of the pair: ``grid_n`` counts pairs of
    tiles, ``mine`` is this block's, and its half of a's rows goes to both blocks), or
    (``WORDS``) the words and scales, freed by every consumer warp once read."""
    BNW = 64 * WG
    peers = u32(3) << (kaio.cluster_rank() // 2 * 2)  # MC: the pair's blocks (a K slice's)
    ring = kaio.local(i32, 2)
    ring[0] = 0
    ring[1] = 0
    j = i32(0)
    for i in range(segments):
        tile, kb, ke = work_item(sched, i, k_tiles, SK)
        origin = swap_origin(u32(tile), grid_m, grid_n, GROUP)
        half = i32(mine * (BM // 2))
        row = i32(tile_top(tile_row(origin), M, BM, CLAMP)) + half * MC
        n0 = i32((tile_col(origin) * (1 + MC) + mine) * BNW)
        for kt in range(kb, ke):
            s = next_free(bars, ring, j, 1 + 3 * WORDS, STAGES)
            k0 = i32(k_begin) + kt * BK
            if WORDS:
                kaio.mbarrier_arrive_expect_tx(bars, (3, s), u32(WORD_ROWS * BNW * 4 + BNW * 2))
                kaio.tma_load_2d(sw, (s, 0, 0), tw, k0 // 8, n0, bars, (3, s))
                kaio.tma_load_2d(ss, (s, 0), ts, k0 // 128, n0, bars, (3, s))
            else:
                kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32(BM * BK * 2))
                if MC:  # half the rows, into both blocks (the other half from the other)
                    kaio.tma_load_2d_multicast(sx, (s, half, 0), tx, row, k0, bars, (0, s), peers)
                else:
                    kaio.tma_load_2d(sx, (s, 0, 0), tx, row, k0, bars, (0, s))
            j += 1


def swap_registers(wg: int) -> int:
    """``REGS`` of ``int4_swap`` with ``wg`` consumer warpgroups: the registers a consumer
    thread takes with ``setmaxnreg`` once the producer warpgroup kept ``PRODUCER_REGS``, out
    of what the block was launched with (its ``128 (wg + 1)`` threads at the launch bounds'
    share of the 64K register file, a multiple of 8: 168 for 384 threads, 128 for 512, 96
    for 640), at most 240; 0 (no ``setmaxnreg``) for one consumer warpgroup. Asking for more
    than the block holds blocks ``setmaxnreg.inc`` for ever: with 4 warpgroups the 64K-based
    share (120) hung the kernel on an H100 under the whole-program JIT."""
    if wg == 1:
        return 0
    threads = 128 * (wg + 1)
    launch = min(255, 65536 // threads // 8 * 8)
    return min(240, (launch * threads - 128 * PRODUCER_REGS) // (128 * wg) // 8 * 8)


def swap_shared_bytes(
    wg: int, bm: int, stages: int, cl: int = 0, wstages: int = 0, kw: int = 0
) -> int:
    """The dynamic shared memory of ``int4_swap``: a's ring (``stages``), the words' ring
    (``wstages``; 0: ``swap_word_stages``') and their barriers; with ``kw`` (the ``wg``
    warpgroups take a tile's slices in turn) two more barriers and the partial tiles that
    warpgroup 0 sums (``reduce_bytes``). With ``cl`` the f32 partial tile that a cluster's
    K split keeps over the rings must not reach the barriers (a producer may still be
    reading one)."""
    cols = 1 if kw else wg
    wstages = wstages or swap_word_stages(wg, bm, stages, kw)
    rings = stages * bm * BK * 2 + wstages * word_stage_bytes(cols)
    if cl and bm * 64 * cols * 4 > rings:
        raise ValueError(
            f"int4_swap: the {bm} x {64 * cols} f32 partial tile does not fit in the rings of "
            f"{stages} and {wstages} stages: use more stages"
        )
    total = rings + (5 + 2 * kw) * 8 * max(stages, wstages)
    return -(-total // 16) * 16 + reduce_bytes(wg, bm) if kw else total


def reduce_bytes(wg: int, bm: int) -> int:
    """The shared memory of ``int4_swap``'s ``red`` with ``KW``: two buffers of
    ``RED_CHUNK`` f32 values a thread of warpgroups 1 .. ``wg`` - 1 (``reduce_warpgroups``)."""
    return 2 * (wg - 1) * RED_CHUNK * 128 * 4


def word_stage_bytes(wg: int) -> int:
    """One stage of ``int4_swap``'s words' ring: the words of a slice and its scale row."""
    return WORD_ROWS * 64 * wg * 4 + 64 * wg * 2


def swap_stages(wg: int, bm: int, kw: int = 0) -> int:
    """The stages of a's ring in ``int4_swap``: as many as fit beside a words' stage each,
    at most 8; with ``kw`` beside ``reduce_bytes`` too, a multiple of ``wg``."""
    if not kw:
        return max(2, min(8, SHARED_LIMIT // (bm * BK * 2 + word_stage_bytes(wg) + 40)))
    left = SHARED_LIMIT - reduce_bytes(wg, bm) - 16
    return max(wg, min(8, left // (bm * BK * 2 + word_stage_bytes(1) + 56)) // wg * wg)


def swap_word_stages(wg: int, bm: int, stages: int, kw: int = 0) -> int:
    """The stages of the words' ring beside ``stages`` of a's: what the shared memory left
    holds, at most ``MAX_WORD_STAGES``, at least 1; with ``kw`` (``swap_stages``) a multiple
    of ``wg``."""
    left = SHARED_LIMIT - stages * bm * BK * 2 - (reduce_bytes(wg, bm) + 16 if kw else 0)
    for w in range(MAX_WORD_STAGES, 1, -1):
        fits = w * word_stage_bytes(1 if kw else wg) + (40 + 16 * kw) * max(stages, w) <= left
        if fits and not (kw and w % wg):
            return w
    return 1


MAX_WORD_STAGES = 16


def swap_split(tiles: int, k: int, sms: int) -> int:
    """The K split of ``int4_swap`` for ``tiles`` output tiles: none when they fill the
    ``sms`` multiprocessors, else towards one block each, every slice at least 4 steps of
    64, at most 8 slices (a cluster)."""
    if tiles >= sms:
        return 1
    return max(1, min(sms // tiles, k // (4 * BK), 8))


def k_split_problem(wg: int, bm: int, mc: int, stages: int, wstages: int, k: int, bufs: int) -> str:
    """What ``int4_swap`` with ``KW`` (each of the ``wg`` warpgroups every WG-th slice and
    stage of both rings) lacks in this configuration, or ""."""
    if wg < 2:
        return "2 or more consumer warpgroups"
    if mc:
        return "no multicast pairs"
    if bm % (2 * RED_CHUNK):  # whole chunks of a thread's partial tile (BM / 2 values)
        return f"BM ({bm}) a multiple of {2 * RED_CHUNK}"
    for what, v in (("STAGES", stages), ("WSTAGES", wstages), ("K / 64", k // BK)):
        if v % wg:
            return f"{what} ({v}) a multiple of WG ({wg})"
    if stages < bufs * wg:  # each warpgroup's BUFS slices in flight in its own stages
        return f"STAGES ({stages}) at least BUFS x WG ({bufs * wg})"
    return ""


def swap_launch_plan(m: int, n: int, k: int, config: tuple, sms: int, out_type) -> tuple:
    """(split, k_slice, tiles, constexprs) of ``int4_swap`` for an ``m x n x k`` product
    with ``config`` (``launch_swap``) on ``sms`` multiprocessors (with ``MC``, tiles counts
    the pairs of tiles)."""
    from kaio_ops.matmul import k_slices

    wg, bm, stages, split, *more = config
    mc = int(len(more) > 1 and bool(more[1]))
    wstages = more[2] if len(more) > 2 else 0
    bufs = more[3] if len(more) > 3 else 2
    early = int(bool(more[4])) if len(more) > 4 else 0
    group = (more[5] if len(more) > 5 else 0) or GROUP_M
    kw = int(bool(more[6])) if len(more) > 6 else 0
    late = int(bool(more[7])) if len(more) > 7 else 0
    sk = more[8] if len(more) > 8 else 0
    two = int(bool(more[10])) if len(more) > 10 else 0  # PAIRS
    if bufs not in (1, 2, 3):
        raise ValueError(f"int4_swap: BUFS (fragment buffers) must be 1 to 3, got {bufs}")
    if two and (bufs != 2 or early or kw or sk):
        raise ValueError(f"int4_swap: PAIRS takes BUFS 2 and no EARLY, KW or SK, got {config}")
    stages = stages or swap_stages(wg, bm, kw)
    wstages = wstages or swap_word_stages(wg, bm, stages, kw)
    if sk and bm * wg * 256 > stages * bm * BK * 2 + wstages * word_stage_bytes(wg):
        raise ValueError(f"int4_swap: SK: a tile's f32 part does not fit the rings, {config}")
    if two and late and wstages < 2:  # (a turn holds both slices' words' stages)
        raise ValueError(f"int4_swap: PAIRS with LATE needs 2 words' stages, got {config}")
    if stages < bufs:  # a slice's stage is freed BUFS - 1 slices later
        raise ValueError(f"int4_swap: {bufs} fragment buffers need {bufs} stages, got {stages}")
    problem = kw and k_split_problem(wg, bm, mc, stages, wstages, k, bufs)
    if problem:
        raise ValueError(f"int4_swap: KW (warpgroups taking K slices in turn) needs {problem}")
    if sk not in (0, 1):
        raise ValueError(f"int4_swap: SK (the stream-K schedule) is 0 or 1, got {sk}")
    if sk and (kw or mc or (more and more[0]) or split > 1):
        raise ValueError(f"int4_swap: SK (stream-K) takes no KW, MC, CL or K split, got {config}")
    cols = 1 if kw else wg  # warpgroups side by side along a tile's columns
    tiles = math.ceil(m / bm) * math.ceil(n / (64 * cols))
    step = BK * (wg if kw else 1)  # a K split's slices: whole steps of every warpgroup
    if mc:  # pairs of tiles (a K split along z, or with CL a cluster of pairs)
        if bm % 16:
            raise ValueError(f"int4_swap: a multicast pair needs BM % 16 == 0, got {bm}")
        pairs = math.ceil(m / bm) * math.ceil(math.ceil(n / (64 * wg)) / 2)
        split, k_slice = k_slices(k, split or swap_split(2 * pairs, k, sms), BK)
        tiles = pairs
    else:
        split, k_slice = k_slices(k, split or (1 if sk else swap_split(tiles, k, sms)), step)
    cl = int(bool(more and more[0]) and 1 < split <= 8 // (1 + mc))
    if cl and split > 2 and not config[3] and more[0] != 2:  # CL 1: the workspace past 2
        cl = 0
    consts = {"WG": wg, "BM": bm, "STAGES": stages, "SPLIT": split if cl else min(split, 2),
              "CL": cl, "REGS": swap_registers(wg), "OUT": out_type, "MC": mc,
              "WSTAGES": wstages, "BUFS": bufs, "EARLY": early, "GROUP": group,
              "KW": kw, "LATE": late, "SK": sk, "CLAMP": 1 - cl, "PDL": PDL,
              "PSUM": int(PSUM and cl and split == 2 and not mc and not kw),
              "HEAD": int(HEAD and wg == 2), "PAIRS": two,
              "LEAD": LEAD * two}  # fmt: skip
    return split, k_slice, tiles, consts


def launch_swap(a, b, s, out_type, config: tuple, sms: int | None = None):
    """``a @ W`` rounded to ``out_type`` by ``int4_swap`` (operands as ``launch``) with ``config``
    = (WG, BM, STAGES, split[, CL[, MC[, WSTAGES[, BUFS[, EARLY[, GROUP[, KW[, LATE[,
    SK[, SPREAD[, PAIRS]]]]]]]]]]]]; 0: as
    many stages as fit, ``GROUP_M`` tile rows a group,
    ``swap_split``'s split): a persistent grid of at most ``sms`` blocks along x, the K split
    along z summed by ``finish``, or with ``CL`` (and a split of 2 to 8; CL 1 and a split past 2
    that ``swap_split`` chose: the workspace) over a cluster of that many blocks along x, one
    tile a cluster, summed in distributed shared memory (no second launch); with ``MC`` clusters
    of two blocks sharing a's rows by TMA multicast (at most ``sms`` blocks along x, two a pair
    of tiles; a K split along z, or with ``CL`` a cluster of ``split`` pairs, one pair of
    tiles a cluster); with ``KW`` the ``WG`` warpgroups share ``BM x 64`` tiles, taking their
    K slices in turn; with ``LATE`` a slice's words' stage is freed after its wgmmas are
    issued; with ``SK`` the stream-K schedule (``sum_parts``), SPREAD
    (default 1) whole waves of tiles shared besides the last partial one (``_gemm_streamk.
    share``), the parts of split tiles in a workspace of ``share``'s slots a stream-K
    tile; with ``PAIRS`` (and BUFS 2) two slices a warpgroup's turn (``swap_pair``)."""
    from kaio_ops import _arrays
    from kaio_ops._gemm_streamk import share
    from kaio_ops.linear import _counters, _placeholder

    m, k = a.shape
    n = b.shape[1]
    sms = sms or _arrays.multiprocessors(a)
    split, k_slice, tiles, consts = swap_launch_plan(m, n, k, config, sms, out_type)
    wg, bm, cl, mc = consts["WG"], consts["BM"], consts["CL"], consts["MC"]
    kw = consts["KW"]
    cols = 1 if kw else wg
    counters, dp_tiles, blocks = _placeholder(a, i32, 1), 0, min(tiles, sms)
    if split > 1 and not cl:
        c = _arrays.output(a, (split * m, n), f32)
        ws, target = c, _placeholder(a, out_type, 2)
    else:
        c = _arrays.output(a, (m, n), out_type)
        ws, target = _placeholder(a, f32, 2), _arrays.output_arg(a, c, (m, n), out_type)
    if consts["SK"]:  # the stream-K schedule: its grid, workspace and arrival counters
        spread = config[13] if len(config) > 13 else 1
        blocks, dp_tiles, slots, fits = share(tiles, k, sms, spread)
        if not fits:  # (the kernel's step arithmetic is 32-bit)
            raise ValueError(f"int4_swap: SK: {m} x {n} x {k} has too many K steps")
        if dp_tiles < tiles:  # (publish_part: a slot a tile's part)
            ws = _arrays.output(a, ((tiles - dp_tiles) * slots * bm // 8, 512 * wg), f32)
            counters = _counters(a, (tiles - dp_tiles) * 4 * wg)
    maps = (
        kaio.tensor_map_2d(a.obj, (bm // (1 + mc), BK), SW),
        kaio.tensor_map_2d(b.obj, (WORD_ROWS, 64 * cols), 0),
        kaio.tensor_map_2d(s.obj, (1, 64 * cols), 0),
    )
    grid = (tiles * split * (1 + mc), 1, 1) if cl else (blocks, 1, split)  # one tile
    if mc and not cl:
        grid = (2 * min(tiles, sms // 2), 1, split)
    shared = swap_shared_bytes(wg, bm, consts["STAGES"], cl, consts["WSTAGES"], kw)
    int4_swap[grid, 128 * wg + 128, _arrays.stream_of(a), shared](
        *maps, target, ws, counters, m, n, k, k_slice, dp_tiles, **consts
    )
    return finish(a, c, split, out_type) if split > 1 and not cl else c


def swap_specializations() -> list:
    """(kernel, constexprs) of ``int4_swap``'s variants to check with ptxas (sm_90a): every
    consumer count, the widest and narrowest activation tiles, a K split through the
    workspace and through a cluster, every output type, pairs of tiles sharing a's rows by
    multicast (also in a cluster with a K split), one and three fragment buffers, the next
    slice's words read early, warpgroups taking a tile's K slices in turn (``KW``), the
    words' stage freed after the wgmmas (``LATE``), the stream-K schedule (``SK``), with and
    without programmatic dependent launch (``PDL`` 0 to 2), PAIRS with LEAD."""
    out = []
    plain = (  # without multicast
        (1, 8, 2, 1, f32, 0, 2, 0),
        (2, 256, 1, 0, f16, 0, 2, 0),
        (2, 256, 1, 0, f16, 0, 2, 1),
        (2, 64, 4, 1, bf16, 0, 2, 1),
        (3, 128, 2, 0, f32, 0, 2, 0),
        (4, 16, 8, 1, f16, 0, 2, 0),
        (4, 64, 2, 0, f32, 0, 2, 1),
        (2, 128, 2, 1, f32, 0, 3, 0),
        (3, 136, 2, 1, f16, 0, 1, 0),  # one fragment buffer (the route's ONE_BUF_ROWS)
        (2, 256, 1, 0, f16, 0, 2, 1),  # SK (the plain cases' last two)
        (2, 256, 1, 0, bf16, 0, 2, 0),
    )
    multicast = (  # pairs of tiles sharing a's rows
        (2, 256, 1, 0, f16, 1, 2, 0),
        (3, 128, 1, 0, bf16, 1, 2, 0),
        (2, 256, 1, 0, f16, 1, 3, 1),
        (2, 128, 2, 1, f16, 1, 2, 1),
    )
    split_k = (  # KW: the warpgroups take a tile's K slices in turn (mc: the KW flag here)
        (2, 256, 1, 0, f16, 1, 2, 1),
        (2, 256, 2, 1, bf16, 1, 2, 0),
        (3, 128, 2, 0, f32, 1, 2, 1),
    )
    cases = plain + multicast + split_k
    for i, (wg, bm, split, cl, ot, mc, bufs, early) in enumerate(cases):
        kw = int(i >= len(plain + multicast))
        mc *= 1 - kw
        stages = swap_stages(wg, bm, kw)
        consts = {"WG": wg, "BM": bm, "STAGES": stages, "SPLIT": split, "CL": cl,
                  "REGS": swap_registers(wg), "OUT": ot, "MC": mc,
                  "WSTAGES": swap_word_stages(wg, bm, stages, kw), "BUFS": bufs,
                  "EARLY": early, "GROUP": GROUP_M, "KW": kw,
                  "LATE": int(i == len(cases) - 1),
                  "SK": int(len(plain) - 2 <= i < len(plain)),
                  "CLAMP": 1 - cl, "PDL": i % 3,
                  "PSUM": int(cl == 1 and split == 2 and not mc and not kw),
                  "HEAD": i % 2, "PAIRS": int(i == 4),
                  "LEAD": int(i == 4)}  # fmt: skip
        out.append((int4_swap, consts))
    return out
