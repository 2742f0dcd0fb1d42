"""The Hopper matmul (sm_90): ``C[M, N] = A[M, K] @ B[K, N]`` in f32 for f16 or bf16 inputs,
with TMA loads, an mbarrier pipeline and ``wgmma``, written in the DSL.

The grid is persistent: at most one block a multiprocessor, block ``b`` of ``G`` computing
tiles ``b``, ``b + G``, ... of C in the grouped order (``grouped``: down columns of
``GROUP`` tile rows, so the tiles in flight at once share their A and B slices in L2). A block
computes a ``128 x BN`` tile with two warpgroups, each multiplying its 64 rows of A by the
whole B slice with ``wgmma.m64n{BN}k16`` and keeping one group of wgmmas in flight. Thread 0
also produces: it issues the TMA copies of each 64-deep K slice of A and B into a
``STAGES``-deep ring of 128-byte-swizzled shared tiles, ``STAGES - 1`` slices ahead, across
tile boundaries: the next tile's first slices load during this tile's epilogue.
Two barriers per stage: ``bars[0, s]`` ("full": the slice's TMA bytes landed) and
``bars[1, s]`` ("empty": both warpgroups are done reading the stage). Every shared array is
dynamic, barriers included: after a static array the dynamic region is not 1024-byte aligned
(``kaio.lang_hopper.dynamic_tile_conflict``).

Why not a separate producer warpgroup: ptxas serializes wgmmas whose accumulators live across
divergent branches (warning C7518), and the simulator runs warps in lockstep in program order,
so a producer loop apart from the consumers' would wait for releases that come later in that
order. Here the only divergent code is the producer's (no accumulators), and every wait is for
work done earlier in program order (docs/hopper.md, "Simulating pipelines").

Shared tiles (docs/hopper.md gives the descriptor of each layout): A stage ``s`` is
``128 x 64`` K-major rows of 128 bytes (descriptor: SBO 1024); B stage ``s`` is ``BN / 64``
column blocks of ``64 x 64``, N-major rows of 128 bytes (LBO 8192 between column blocks,
SBO 1024 between 8-row groups). The K tail and the M and N edges read zeros from TMA; the
epilogue stores only the elements inside C.
"""

from __future__ import annotations

import kaio
from kaio import f16, f32, i32, u32, u64
from kaio_ops._typed import by_dtype

BM = 128
BK = 64  # the default K slice (``launch``): A rows of 128 bytes
THREADS = 256
SW = 128  # B's swizzle: column blocks of 64 elements, rows of 128 bytes
DT = f32  # the output element type placeholder (see _typed.by_dtype): f32, or f16
GROUP_ROWS = 8  # tile rows a group of the tile order spans (``grouped``)


@kaio.gpu_func
def grouped(tile: i32, tiles_m: i32, tiles_n: i32, GROUP: kaio.constexpr) -> i32:
    """The row-major index ``tm * tiles_n + tn`` of C tile number ``tile`` in the grouped
    order: tiles go down columns of ``GROUP`` tile rows, so that the blocks running at once
    share their A and B slices in L2."""
    width = GROUP * tiles_n
    first = (tile // width) * GROUP
    rows = kaio.min(tiles_m - first, GROUP)
    return (first + (tile % width) % rows) * tiles_n + (tile % width) // rows


@kaio.gpu_func
def place(at: i32[:], tiles_m: i32, tiles_n: i32, BN: kaio.constexpr, GROUP: kaio.constexpr):
    """Set ``at[2], at[3]`` to the first row and column of tile number ``at[1]``."""
    idx = grouped(at[1], tiles_m, tiles_n, GROUP)
    at[2] = (idx // tiles_n) * BM
    at[3] = (idx % tiles_n) * BN


@kaio.gpu_func
def produce(
    sa: f16[:, :, :],
    sb: f16[:, :, :, :],
    bars: u64[:, :],
    ta: kaio.tensormap,
    tb: kaio.tensormap,
    at: i32[:],
    s: i32,
    k_tiles: i32,
    step: i32,
    tiles_m: i32,
    tiles_n: i32,
    BN: kaio.constexpr,
    BK: kaio.constexpr,
    GROUP: kaio.constexpr,
):
    """Issue the TMA copies of the producer's next K slice into stage ``s``, armed on its full
    barrier, and step the producer's position ``at`` (K slice, tile number, the tile's first
    row and column) to the slice after it: divisions only when the tile changes, since the
    producer's thread is also a consumer's and its work delays its warpgroup's wgmmas."""
    k0 = at[0] * BK
    kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32((BM + BN) * BK * 2))
    kaio.tma_load_2d(sa, (s, 0, 0), ta, at[2], k0, bars, (0, s))
    for j in kaio.static_range(BN // 64):
        kaio.tma_load_2d(sb, (s, j, 0, 0), tb, k0, at[3] + j * 64, bars, (0, s))
    at[0] += 1
    if at[0] == k_tiles:
        at[0] = 0
        at[1] += step
        place(at, tiles_m, tiles_n, BN, GROUP)


@kaio.gpu_func
def store_run(
    c: DT[:, :], row: i32, first: i32, last: i32, a: i32, b: i32, cst: DT[:, :], t: i32,
    SIZE: kaio.constexpr,
):  # fmt: skip
    """Bulk-store the columns [a, b) of C held in row ``t`` of the staging tile ``cst``
    (from column a), where they meet [first, last): the columns of C that output ``c`` (row
    ``row``) holds from its column 0."""
    lo = kaio.max(a, first)
    hi = kaio.min(b, last)
    if lo < hi:
        kaio.bulk_store(c, (row, lo - first), cst, (t, lo - a), u32(hi - lo) * SIZE)


@kaio.gpu_kernel(block_size=THREADS)
def matmul_wgmma(
    ta: kaio.tensormap,
    tb: kaio.tensormap,
    c0: DT[:, :],
    c1: DT[:, :],
    c2: DT[:, :],
    m: i32,
    n: i32,
    n0: i32,
    n1: i32,
    k: i32,
    BN: kaio.constexpr,
    BK: kaio.constexpr,
    STAGES: kaio.constexpr,
    BF16: kaio.constexpr,
    GROUP: kaio.constexpr,
    SIZE: kaio.constexpr,
    INFLIGHT: kaio.constexpr,
):
    kaio.launch_bounds(THREADS, 1)
    ring = STAGES * (BM + BN) * BK * 2
    sa = kaio.shared_dynamic(f16, (STAGES, BM, BK), 0)
    sb = kaio.shared_dynamic(f16, (STAGES, BN // 64, BK, 64), STAGES * BM * BK * 2)
    # C's staging tile: 64 columns of the tile's rows, each row padded by 16 bytes (the
    # accumulator pairs' writes then hit 32 distinct banks)
    cst = kaio.shared_dynamic(DT, (BM, 64 + 16 // SIZE), ring)
    bars = kaio.shared_dynamic(u64, (2, STAGES), ring + BM * (64 * SIZE + 16))
    t = kaio.thread_idx_x()
    wg = t // 128
    lt = t % 128
    tile0 = i32(kaio.block_idx_x())
    step = i32(kaio.grid_dim_x())
    tiles_m = (m + BM - 1) // BM
    tiles_n = (n + BN - 1) // BN
    tiles = tiles_m * tiles_n
    my_tiles = (tiles - tile0 + step - 1) // step
    k_tiles = (k + BK - 1) // BK
    slices = my_tiles * k_tiles
    if t == 0:
        for s in kaio.static_range(STAGES):
            kaio.mbarrier_init(bars, (0, s), 1)
            kaio.mbarrier_init(bars, (1, s), 2)
        kaio.fence_proxy_async()
    kaio.sync_threads()
    # the producer runs STAGES - INFLIGHT slices ahead, across tiles (slice g + STAGES -
    # INFLIGHT follows slice g), so the next tile's first slices load during an epilogue
    at = kaio.local(i32, (4,))
    at[0] = 0
    at[1] = tile0
    place(at, tiles_m, tiles_n, BN, GROUP)
    for g in kaio.static_range(STAGES - INFLIGHT):
        if t == 0 and g < slices:
            produce(sa, sb, bars, ta, tb, at, g, k_tiles, step, tiles_m, tiles_n, BN, BK, GROUP)
    acc = kaio.local(f32, (BN // 8, 2, 2))
    # the stage and phase parity of slice g, and of slice g - INFLIGHT (rs, rph), kept as
    # counters: a stage computed as g % STAGES is not known to be warp-uniform when STAGES is
    # not a power of two, and the wgmmas then ran at half speed
    s = i32(0)
    ph = u32(0)
    rs = i32(STAGES - INFLIGHT)
    rph = u32(1)
    for i in range(my_tiles):
        for kt in range(k_tiles):
            g = i * k_tiles + kt
            kaio.mbarrier_wait(bars, (0, s), ph)
            kaio.wgmma_fence()
            for kk in kaio.static_range(BK // 16):
                da = kaio.smem_descriptor(sa, (s, 64 * wg, kk * 16), 2 * BK, 16, 16 * BK)
                db = kaio.smem_descriptor(sb, (s, 0, kk * 16, 0), SW, BK * SW, 1024)
                if BF16:
                    kaio.wgmma_bf16(acc, da, db, kt + kk > 0, False, True)
                else:
                    kaio.wgmma_f16(acc, da, db, kt + kk > 0, False, True)
            kaio.wgmma_commit()
            kaio.wgmma_wait(INFLIGHT)
            if g >= INFLIGHT and lt == 0:  # slice g - INFLIGHT's wgmmas are done: release it
                kaio.mbarrier_arrive(bars, (1, rs))
            if t == 0 and g + STAGES - INFLIGHT < slices:  # that slice + STAGES into stage rs
                if g >= INFLIGHT:  # wait until both warpgroups released stage rs
                    kaio.mbarrier_wait(bars, (1, rs), rph)
                produce(
                    sa, sb, bars, ta, tb, at, rs, k_tiles, step, tiles_m, tiles_n, BN, BK, GROUP
                )
            rs += 1
            if rs == STAGES:
                rs = 0
                rph ^= 1
            s += 1
            if s == STAGES:
                s = 0
                ph ^= 1
        kaio.wgmma_wait(0)
        idx = grouped(tile0 + i * step, tiles_m, tiles_n, GROUP)
        row0 = (idx // tiles_n) * BM
        col0 = (idx % tiles_n) * BN
        # the epilogue: 64 columns at a time through the staging tile, each row of it
        # bulk-stored by one thread, asynchronously: the next tile's wgmmas start while the
        # copies run (as one block a tile, 128 x 256 stores per thread stalled the tensor cores)
        r = 64 * i32(wg) + 16 * i32(lt // 32) + i32(lt % 32 // 4)
        pair = kaio.local(DT, 2)
        for cb in kaio.static_range(BN // 64):
            kaio.bulk_wait_read(0)  # this thread's copies of the last block left the staging
            kaio.sync_threads()
            for jj in kaio.static_range(8):
                for h in kaio.static_range(2):
                    pair[0] = DT(acc[8 * cb + jj, h, 0])
                    pair[1] = DT(acc[8 * cb + jj, h, 1])
                    kaio.store_vector(cst, (r + 8 * h, 8 * jj + 2 * i32(lt % 4)), pair)
            kaio.fence_proxy_async()
            kaio.sync_threads()
            row = row0 + i32(t)
            if t < BM and row < m:
                a = col0 + 64 * cb
                b = kaio.min(a + 64, n)
                store_run(c0, row, 0, n0, a, b, cst, i32(t), SIZE)
                store_run(c1, row, n0, n0 + n1, a, b, cst, i32(t), SIZE)
                store_run(c2, row, n0 + n1, n, a, b, cst, i32(t), SIZE)
            kaio.bulk_commit()
    kaio.bulk_wait(0)  # the block's shared memory outlives the copies that read it


WGMMA = by_dtype(matmul_wgmma)


def eligible(a, b, m: int, n: int, k: int) -> bool:
    """Whether the Hopper kernel takes ``a @ b`` (``_arrays.Operand``s; ``b`` None for a
    fresh array): TMA needs rows a multiple of 16 bytes apart (K and N multiples of 8) and
    16-byte aligned bases."""
    return k % 8 == 0 and n % 8 == 0 and a.aligned(16) and (b is None or b.aligned(16))


def worthwhile(m: int, n: int, sms: int) -> bool:
    """Whether C has enough 128 x 128 tiles (two per multiprocessor) for the Hopper kernel
    to beat the mma.sync one: measured on an H200 (132 SMs), wgmma was 0.8-0.9x of mma.sync
    at 1024^3 and 2048^3 (64 and 256 tiles) and 1.6x at 4096^3 (1024 tiles)."""
    return -(-m // BM) * -(-n // 128) >= 2 * sms


def choose_tiling(m: int, n: int, sms: int) -> tuple:
    """(BN, BK, STAGES, INFLIGHT) for C [m, n] on ``sms`` multiprocessors: 128 x 256 tiles
    when they give every multiprocessor a block, else 128 x 128."""
    bn = 256 if -(-m // BM) * -(-n // 256) >= sms else 128
    return (bn, BK, 4 if bn == 256 else 5, 1)


def launch(
    a, b, m: int, n: int, k: int, sms: int, bf16: bool, f16_outs: list | None = None,
    group: int = GROUP_ROWS, tiling: tuple | None = None,
):  # fmt: skip
    """``a @ b`` with ``matmul_wgmma`` on a persistent grid of at most ``sms`` blocks: 128 x
    256 tiles when they give every one of ``sms`` multiprocessors a block, else 128 x 128;
    tiles taken ``group`` tile rows at a time. The result is a new f32 array of ``a``'s kind,
    or with ``f16_outs`` (one to three f16 arrays [M, N_i], the N_i summing to N) the columns
    of C go to them in turn, rounded to f16; returns ``f16_outs``."""
    from kaio_ops import _arrays

    bn, bk, stages, inflight = tiling or choose_tiling(m, n, sms)
    if f16_outs is None:
        outs = _arrays.output(a, (m, n), f32)
        targets, widths = [outs] * 3, [n, 0]
    else:
        outs = f16_outs
        targets = outs + outs[:1] * (3 - len(outs))
        widths = ([o.shape[1] for o in outs] + [0, 0])[:2]
    ta = kaio.tensor_map_2d(a.obj, (BM, bk), 2 * bk)
    tb = kaio.tensor_map_2d(b.obj, (bk, 64), SW)
    grid = min(sms, -(-m // BM) * -(-n // bn))
    out = f32 if f16_outs is None else f16
    size = out.itemsize
    WGMMA[out][grid, THREADS, _arrays.stream_of(a), shared_bytes(bn, stages, bk, size)](
        ta, tb, *targets, m, n, *widths, k,
        BN=bn, BK=bk, STAGES=stages, BF16=int(bf16), GROUP=group, SIZE=size, INFLIGHT=inflight,
    )  # fmt: skip
    return outs


def shared_bytes(bn: int, stages: int, bk: int = BK, size: int = 4) -> int:
    """The dynamic shared memory of ``matmul_wgmma``: the tile ring, C's staging tile (f32:
    ``size`` 4; f16: 2) and the 2 x STAGES barriers."""
    return stages * ((BM + bn) * bk * 2 + 16) + BM * (64 * size + 16)


def specializations() -> list:
    """(kernel, constexprs) of every specialization ``launch`` uses (for PTX checks)."""
    return [
        (
            WGMMA[out],
            {
                "BN": bn,
                "BK": bk,
                "STAGES": st,
                "BF16": bf,
                "GROUP": GROUP_ROWS,
                "SIZE": out.itemsize,
                "INFLIGHT": 1,
            },
        )
        for bn, bk, st in ((256, BK, 4), (128, BK, 5))
        for bf in (0, 1)
        for out in (f32, f16)
    ]
