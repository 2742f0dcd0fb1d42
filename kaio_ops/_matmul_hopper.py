"""The Hopper matmul (sm_90): ``C[M, N] = A[M, K] @ B[K, N]`` in f32 for f16 or bf16 inputs,
with TMA loads, an mbarrier pipeline and ``wgmma``, written in the DSL, generic over its input
and output element types (dtype constexprs ``IN`` and ``OUT``). The f16-output variant
(``OUT=f16``) writes C's columns to up to three f16 outputs, each times its own scale
(the quantized QKV projections, ``kaio_ops._prefill``: constexpr ``OUTS`` 3); with ``OUTS`` 1
the epilogue writes one output unscaled, choosing nothing per column.

The grid is persistent: at most one block a multiprocessor, block ``b`` of ``G`` computing
tiles ``b``, ``b + G``, ... of C in the grouped order (``grouped``: down columns of
``GROUP`` tile rows, so the tiles in flight at once share their A and B slices in L2). A block
computes a ``128 x BN`` tile with two consumer warpgroups, each multiplying its 64 rows of A by
the whole B slice with ``wgmma.m64n{BN}k16`` (past 256 columns, up to ``MAX_BN``, two wgmmas
a K step: ``m64n256k16`` and one for the rest) and keeping one group of wgmmas in flight, and a
producer warp (the ninth; one thread of it works) that issues the TMA copies of each 64-deep
K slice of A and B into a ``STAGES``-deep ring of 128-byte-swizzled shared tiles, up to
``STAGES`` slices ahead, across tile boundaries: the next tile's first slices load during
this tile's epilogue. The roles are the two branches of one ``if``, each with its own loop
(the simulator runs them in turns, docs/hopper.md "Simulating pipelines"); the warpgroup
index goes through a shuffle so that ptxas knows it is warp-uniform and keeps the wgmmas
asynchronous. Two barriers per stage: ``bars[0, s]`` ("full": the slice's TMA bytes landed)
and ``bars[1, s]`` ("empty": both warpgroups are done reading the stage). Every shared array
is dynamic, barriers included: after a static array the dynamic region is not 1024-byte
aligned (``kaio.lang_hopper.dynamic_tile_conflict``).

Shared tiles (docs/hopper.md gives the descriptor of each layout): A stage ``s`` is
``128 x 64`` K-major rows of 128 bytes (descriptor: SBO 1024); B stage ``s`` is ``BN / 64``
column blocks of ``64 x 64``, N-major rows of 128 bytes (LBO 8192 between column blocks,
SBO 1024 between 8-row groups). The K tail and the M and N edges read zeros from TMA; the
epilogue stores only the elements inside C, 4 adjacent columns a lane (lanes t and t ^ 1
trade a pair of columns with one shuffle).
"""

# ruff: noqa: F821  (IN, OUT, DT and RT in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import bool_, f16, f32, i32, u32, u64
from kaio_ops._common import store_cols
from kaio_ops._gemm import activate

BM = 128
BK = 64
CONSUMERS = 256  # two warpgroups: 128 rows of C
THREADS = CONSUMERS + 32  # and a producer warp
A_STAGE_BYTES = BM * BK * 2
SW = 128  # swizzle bytes: one 128-byte row per 64 elements
GROUP_ROWS = 8  # tile rows a group of the tile order spans (``grouped``)
WGMMA_MAX_N = 256  # the widest wgmma: a wider tile (up to MAX_BN) takes two a K step
MAX_BN = 320
# a tile wider than 256 columns holds 160 accumulators a consumer thread, more than the 168
# registers of 9 warps (3 on one of the 4 schedulers: 64K / 4 / 3 / 32) leave room for: its
# block is 384 threads, the producer's whole warpgroup keeping PRODUCER_REGS a thread
# (setmaxnreg) and the consumers taking CONSUMER_REGS (128 x 40 + 256 x 232 <= 64K)
WIDE_EXTRA = 96
PRODUCER_REGS = 40
CONSUMER_REGS = 232


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
def tile_origin(tile: i32, tiles_m: i32, tiles_n: i32, BN: kaio.constexpr, GROUP: kaio.constexpr,
                ROWS: kaio.constexpr) -> tuple[i32, i32]:  # fmt: skip
    """``(row0, col0)``: the first row and column of tile number ``tile`` (tiles of
    ``ROWS x BN``)."""
    idx = grouped(tile, tiles_m, tiles_n, GROUP)
    return (idx // tiles_n) * ROWS, (idx % tiles_n) * BN


@kaio.gpu_func
def next_position(kt: i32, tile: i32, row0: i32, col0: i32, k_tiles: i32, step: i32,
                  tiles_m: i32, tiles_n: i32, BN: kaio.constexpr, GROUP: kaio.constexpr,
                  ROWS: kaio.constexpr):  # fmt: skip
    """The producer's position ``(kt, tile, row0, col0)`` (K slice, tile number, the tile's
    first row and column) after K slice ``kt`` of ``tile``: the next tile's first slice
    (``tile_origin``) after the tile's last, dividing only when the tile changes (the short
    path keeps the producer ahead of the consumers)."""
    kt += 1
    if kt == k_tiles:
        kt = 0
        tile += step
        row0, col0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP, ROWS)
    return kt, tile, row0, col0


@kaio.gpu_func
def produce(
    sa: IN[:, :, :],
    sb: IN[:, :, :, :],
    bars: u64[:, :],
    ta: kaio.tensormap,
    tb: kaio.tensormap,
    s: i32,
    kt: i32,
    row0: i32,
    col0: i32,
    rank: i32,
    BN: kaio.constexpr,
    IN: kaio.constexpr,
    PAIR: kaio.constexpr,
    BT: kaio.constexpr,
):
    """Issue the TMA copies of K slice ``kt`` of the tile at (``row0``, ``col0``) into stage
    ``s``, armed on its full barrier. In a pair (``PAIR``: block ``rank`` of a cluster of
    two, tiles one above the other) the tile is the pair's: this block's A rows are ``rank *
    BM`` further, and it copies every other 64-column block of the shared B slice into both
    blocks. ``BT``: B is [N, K] (``nn.Linear``'s weight), a block 64 rows of N by 64 of K."""
    k0 = kt * BK
    NBLK = (BN + 63) // 64  # 64-column TMA boxes: a width of 160 or 224 loads a whole last box
    kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32(A_STAGE_BYTES + BK * NBLK * 128))
    kaio.tma_load_2d(sa, (s, 0, 0), ta, row0 + rank * BM, k0, bars, (0, s))
    for j in kaio.static_range(NBLK):
        c0 = col0 + j * 64 if BT else k0  # the box's first row and column of B
        c1 = k0 if BT else col0 + j * 64
        if PAIR == 0:
            kaio.tma_load_2d(sb, (s, j, 0, 0), tb, c0, c1, bars, (0, s))
        elif rank == j % 2:
            kaio.tma_load_2d_multicast(sb, (s, j, 0, 0), tb, c0, c1, bars, (0, s), 3)


@kaio.gpu_func
def produce_all(
    sa: IN[:, :, :], sb: IN[:, :, :, :], bars: u64[:, :], ta: kaio.tensormap,
    tb: kaio.tensormap, tile0: i32, step: i32, tiles_m: i32, tiles_n: i32, k_tiles: i32,
    slices: i32, rank: i32, res: RT[:, :], m: i32, n: i32, BN: kaio.constexpr,
    STAGES: kaio.constexpr, IN: kaio.constexpr, GROUP: kaio.constexpr, ROWS: kaio.constexpr,
    PAIR: kaio.constexpr, BT: kaio.constexpr, RES: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """The producer thread's loop: each K slice of each of the block's ``slices / k_tiles``
    tiles (from ``tile0``, every ``step``), ``STAGES`` ahead of the consumers at most; with a
    residual (``RES``), after a tile's last slice its residual rows asked for in L2
    (``prefetch_rows``), for the epilogue."""
    s = i32(0)  # the stage and phase parity of a slice (``next_stage``)
    ph = u32(0)
    kt = i32(0)  # the producer's position: K slice kt of tile number tile, at row0, col0
    tile = tile0
    row0, col0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP, ROWS)
    for g in range(slices):
        if g >= STAGES:  # stage s held slice g - STAGES: wait until both freed it
            kaio.mbarrier_wait(bars, (1, s), ph ^ 1)
        produce(sa, sb, bars, ta, tb, s, kt, row0, col0, rank, BN=BN, IN=IN, PAIR=PAIR, BT=BT)
        if RES and kt == k_tiles - 1:
            prefetch_rows(res, u32(row0 + rank * BM), u32(col0), u32(m), u32(n), BM, BN, RT)
        kt, tile, row0, col0 = next_position(
            kt, tile, row0, col0, k_tiles, step, tiles_m, tiles_n, BN, GROUP, ROWS
        )
        s, ph = next_stage(s, ph, STAGES)


@kaio.gpu_func
def scale_of(col: i32, n0: i32, n1: i32, s0: f32, s1: f32, s2: f32) -> f32:
    """The scale of the output that column ``col`` of C belongs to."""
    return kaio.select(col < n0, s0, kaio.select(col < n0 + n1, s1, s2))


@kaio.gpu_func
def store_c(
    c0: OUT[:, :], c1: OUT[:, :], c2: OUT[:, :], row: i32, col: i32, m: i32, n: i32, n0: i32,
    n1: i32, out: u32[:], OUT: kaio.constexpr, CHECK: kaio.constexpr = 1,
):  # fmt: skip
    """Store ``out`` (4 columns) at column ``col`` of C (columns [0, n0) in c0, then n1 in
    c1, the rest in c2), if inside C. ``CHECK`` 0: the caller knows the store is inside C
    and in c0 (no branch: a warpgroup's wgmmas may stay in flight across it)."""
    if not CHECK:
        kaio.store_vector(c0, (row, col), out)
    elif row < m and col < n:
        if col < n0:
            kaio.store_vector(c0, (row, col), out)
        elif col < n0 + n1:
            kaio.store_vector(c1, (row, col - n0), out)
        else:
            kaio.store_vector(c2, (row, col - n0 - n1), out)


@kaio.gpu_func
def store_rows(
    acc: f32[:, :, :], c0: OUT[:, :], c1: OUT[:, :], c2: OUT[:, :], row0: i32, col0: i32,
    m: i32, n: i32, n0: i32, n1: i32, s0: f32, s1: f32, s2: f32, lt: u32, BN: kaio.constexpr,
    OUT: kaio.constexpr, CHECK: kaio.constexpr = 1,
):  # fmt: skip
    """Store a warpgroup's 64 rows of C from row ``row0``, BN columns from ``col0`` (thread
    ``lt`` of it holds ``acc``, the m16n8 C fragment of each n8 tile of its warp's 16 rows)
    through ``store_c``, each column times its output's scale. Lanes t and t ^ 1 trade
    pairs, so that each stores 4 adjacent columns (16 bytes of f32, 8 of f16): even lanes
    columns 2t..2t+3 of the first 8 of a 16, odd lanes 2t-2..2t+1 of the next 8; where BN is
    an odd multiple of 8 (200), the last 8 columns a pair a lane (``store_pair``).
    ``CHECK`` 0: the 64 x BN block is inside C and c0 (``store_c``)."""
    SIZE = OUT.itemsize  # noqa: N806  (a compile-time int, as the constexprs)
    lane = i32(lt % 32)
    row = row0 + 16 * i32(lt // 32) + lane // 4
    odd = lane % 2 == 1
    mine = kaio.local(u32, (2, SIZE // 2))  # a pair of each 8: its f32 bits or f16x2
    out = kaio.local(u32, SIZE)
    for jp in kaio.static_range(BN // 16):
        col = col0 + 16 * jp + 2 * (lane % 4)
        scales = kaio.local(f32, 2)
        scales[0] = scale_of(col, n0, n1, s0, s1, s2)
        scales[1] = scale_of(col + 8, n0, n1, s0, s1, s2)
        for h in kaio.static_range(2):
            for p in kaio.static_range(2):
                x = acc[2 * jp + p, h, 0] * scales[p]
                y = acc[2 * jp + p, h, 1] * scales[p]
                if SIZE == 4:
                    mine[p, 0] = kaio.bitcast(x, u32)
                    mine[p, 1] = kaio.bitcast(y, u32)
                elif OUT == kaio.bf16:
                    mine[p, 0] = kaio.bitcast(kaio.bf16x2(x, y), u32)
                else:
                    mine[p, 0] = kaio.bitcast(kaio.f16x2(x, y), u32)
            for w in kaio.static_range(SIZE // 2):
                got = kaio.shfl_xor(kaio.select(odd, mine[0, w], mine[1, w]), 1)
                out[w] = kaio.select(odd, got, mine[0, w])
                out[SIZE // 2 + w] = kaio.select(odd, mine[1, w], got)
            put = col + kaio.select(odd, 6, 0)
            store_c(c0, c1, c2, row + 8 * h, put, m, n, n0, n1, out, OUT, CHECK)
    if BN % 16:
        store_pair(acc, c0, c1, c2, row, col0 + BN - 8 + 2 * (lane % 4), m, n, n0, n1, s0, s1,
                   s2, BN // 8 - 1, OUT, CHECK)  # fmt: skip


@kaio.gpu_func
def store_pair(
    acc: f32[:, :, :], c0: OUT[:, :], c1: OUT[:, :], c2: OUT[:, :], row: i32, col: i32, m: i32,
    n: i32, n0: i32, n1: i32, s0: f32, s1: f32, s2: f32, J: kaio.constexpr,
    OUT: kaio.constexpr, CHECK: kaio.constexpr,
):  # fmt: skip
    """``store_rows`` of the C fragment's n8 tile ``J`` when it has no partner tile to trade
    with: each lane stores its own pair of columns ``col``, ``col + 1`` in rows ``row`` and
    ``row + 8`` (``store_c``)."""
    SIZE = OUT.itemsize  # noqa: N806
    s = scale_of(col, n0, n1, s0, s1, s2)
    for h in kaio.static_range(2):
        x = acc[J, h, 0] * s
        y = acc[J, h, 1] * s
        pair = kaio.local(u32, SIZE // 2)  # its f32 bits or f16x2
        if SIZE == 4:
            pair[0] = kaio.bitcast(x, u32)
            pair[1] = kaio.bitcast(y, u32)
        elif OUT == kaio.bf16:
            pair[0] = kaio.bitcast(kaio.bf16x2(x, y), u32)
        else:
            pair[0] = kaio.bitcast(kaio.f16x2(x, y), u32)
        store_c(c0, c1, c2, row + 8 * h, col, m, n, n0, n1, pair, OUT, CHECK)


@kaio.gpu_func
def store_fused(
    acc: f32[:, :, :], acc_u: f32[:, :, :], c: OUT[:, :], bias: DT[:], res: RT[:, :],
    row0: u32, col0: u32, M: u32, N: u32, lt: u32,
    BN: kaio.constexpr, CH: kaio.constexpr, BIAS: kaio.constexpr, ACT: kaio.constexpr,
    RES: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """The epilogue of a warpgroup's 64 rows of C from ``row0``, BN columns from ``col0``
    (``acc``: the m16n8 C fragment of each n8 tile; ``acc_u`` the up sums of "silu_gate"),
    ``CH`` n8 tiles at a time: first every bias and residual element of the chunk is loaded
    (indices clamped inside C, so no load waits on a branch or a store), then the chunk is
    computed (``_gemm.activate``) and stored by pairs of columns. ``store_pair`` loads each
    pair's operands after the previous pair's store, one memory latency a pair."""
    GATE = ACT == "silu_gate"
    lane = lt % 32
    row = row0 + 16 * (lt // 32) + lane // 4
    even = N % 2 == 0
    bv = kaio.local(f32, (CH, 2, 2))  # [tile, column, gate / up]
    rv = kaio.local(f32, (CH, 2, 2))  # [tile, row half, column]
    rp = kaio.local(RT, 2)
    pair = kaio.local(OUT, 2)
    NT = BN // 8
    for jc in kaio.static_range((NT + CH - 1) // CH):
        for jj in kaio.static_range(CH if (jc + 1) * CH <= NT else NT - jc * CH):
            col = col0 + 8 * (jc * CH + jj) + 2 * (lane % 4)
            for p in kaio.static_range(2):
                cp = kaio.min(col + p, N - 1)
                if BIAS:
                    bv[jj, p, 0] = f32(bias[cp])
                    if GATE:
                        bv[jj, p, 1] = f32(bias[N + cp])
            if RES:
                for h in kaio.static_range(2):
                    r = kaio.min(row + 8 * h, M - 1)
                    if even:  # one aligned load of the pair (a column at 0 when outside C)
                        kaio.load_vector(rp, res, (r, kaio.select(col < N, col, u32(0))))
                        rv[jj, h, 0] = f32(rp[0])
                        rv[jj, h, 1] = f32(rp[1])
                    else:
                        rv[jj, h, 0] = f32(res[r, kaio.min(col, N - 1)])
                        rv[jj, h, 1] = f32(res[r, kaio.min(col + 1, N - 1)])
        for jj in kaio.static_range(CH if (jc + 1) * CH <= NT else NT - jc * CH):
            j = jc * CH + jj
            col = col0 + 8 * j + 2 * (lane % 4)
            for h in kaio.static_range(2):
                for p in kaio.static_range(2):
                    u = f32(0.0)
                    if GATE:
                        u = acc_u[j, h, p]
                    pair[p] = OUT(activate(acc[j, h, p], u, bv[jj, p, 0], bv[jj, p, 1],
                                           rv[jj, h, p], BIAS, ACT, RES))  # fmt: skip
                if row + 8 * h < M:
                    store_cols(c, row + 8 * h, col, pair, N, even, 2, OUT)


@kaio.gpu_func
def prefetch_rows(
    res: RT[:, :], m0: u32, n0: u32, M: u32, N: u32, BM: kaio.constexpr, BN: kaio.constexpr,
    RT: kaio.constexpr,
):  # fmt: skip
    """One thread asks for the residual rows of the tile at (``m0``, ``n0``) to be brought
    into L2 (``prefetch_l2`` of a run-time size, a row at a time), where rows are 16-byte
    aligned."""
    if N % (16 // RT.itemsize) == 0 and n0 < N:
        nbytes = kaio.min(u32(BN), N - n0) * RT.itemsize
        for r in range(BM):
            if m0 + r < M:
                kaio.prefetch_l2(res, (m0 + r, n0), nbytes)


@kaio.gpu_func
def tile_schedule(m: i32, n: i32, k: i32, BM: kaio.constexpr, BN: kaio.constexpr,
                  BK: kaio.constexpr):  # fmt: skip
    """The persistent schedule of this block: (first tile, tile step, tiles_m, tiles_n,
    tiles it computes, K tiles per tile, slices = the two multiplied) for an m x n output
    of BM x BN tiles and K tiles of BK."""
    tile0 = i32(kaio.block_idx_x())
    step = i32(kaio.grid_dim_x())
    tiles_m = (m + BM - 1) // BM
    tiles_n = (n + BN - 1) // BN
    tiles = tiles_m * tiles_n
    my_tiles = (tiles - tile0 + step - 1) // step
    k_tiles = (k + BK - 1) // BK
    return tile0, step, tiles_m, tiles_n, my_tiles, k_tiles, my_tiles * k_tiles


@kaio.gpu_func
def init_ring(bars: u64[:, :], t: u32, STAGES: kaio.constexpr, FREES: kaio.constexpr):
    """Thread 0 initializes the ring's barriers (row 0 "stage full": one arrival, the
    producer's; row 1 "stage free": FREES arrivals) and fences them for the async proxy;
    then the block syncs."""
    if t == 0:
        for s in kaio.static_range(STAGES):
            kaio.mbarrier_init(bars, (0, s), 1)
            kaio.mbarrier_init(bars, (1, s), FREES)
        kaio.fence_proxy_async()
    kaio.sync_threads()


@kaio.gpu_func
def next_stage(s: i32, ph: u32, STAGES: kaio.constexpr):
    """``(stage, phase parity)`` of the ring slot after stage ``s`` of parity ``ph``: the
    parity flips when the ring wraps. Kept as counters: a stage computed as g % STAGES is not
    known to be warp-uniform when STAGES is not a power of two, and the wgmmas then ran at
    half speed (measured: 5 or 7 stages against 4 or 8)."""
    s += 1
    if s == STAGES:
        s = 0
        ph ^= 1
    return s, ph


@kaio.gpu_func
def free_stage(bars: u64[:, :], s: i32, lt: u32, PAIR: kaio.constexpr):
    """Lane ``lt`` 0 of a consumer warpgroup frees stage ``s`` for the producer; in a pair of
    blocks (``PAIR``, a cluster of two whose producers both write into it) for both."""
    if lt == 0 and PAIR == 0:
        kaio.mbarrier_arrive(bars, (1, s))
    elif lt == 0:
        for rank in kaio.static_range(2):  # the stage in each block of the cluster
            kaio.mbarrier_arrive_cluster(bars, (1, s), rank)


@kaio.gpu_func
def retire_slice(
    bars: u64[:, :], kt: i32, lt: u32, s: i32, ph: u32, ps: i32, STAGES: kaio.constexpr,
    PAIR: kaio.constexpr,
):  # fmt: skip
    """A consumer warpgroup's end of K slice ``kt`` (in stage ``s``, parity ``ph``; the slice
    before in stage ``ps``): commit its wgmmas, wait for the slice before's, free that one's
    stage (``free_stage``) and return ``(s, next stage, next parity)``, the new ``ps, s,
    ph``."""
    kaio.wgmma_commit()
    kaio.wgmma_wait(1)
    if kt > 0:  # the slice before's wgmmas are done: free its stage
        free_stage(bars, ps, lt, PAIR)
    s2, ph2 = next_stage(s, ph, STAGES)
    return s, s2, ph2


@kaio.gpu_func
def mma_blocks(
    acc: f32[:, :, :], da: u64, sb: IN[:, :, :, :], s: i32, k: i32, accumulate: bool_,
    J: kaio.constexpr, BT: kaio.constexpr, IN: kaio.constexpr,
):  # fmt: skip
    """acc (+)= A (descriptor ``da``) times B's k16 step at ``k`` of stage ``s`` from its
    64-column block ``J`` on: B [K, N] N-major blocks (LBO between them), or [N, K] (``BT``)
    K-major rows."""
    db = kaio.smem_descriptor(sb, (s, J, k, 0), SW, BK * SW, 1024)
    if BT:
        db = kaio.smem_descriptor(sb, (s, J, 0, k), SW, 16, 1024)
    kaio.wgmma(IN, acc, da, db, accumulate, False, not BT)


@kaio.gpu_func
def consume(
    acc: f32[:, :, :], acc2: f32[:, :, :], sa: IN[:, :, :], sb: IN[:, :, :, :],
    bars: u64[:, :], go: u64[:], c0: OUT[:, :], c1: OUT[:, :], c2: OUT[:, :], bias: IN[:],
    res: RT[:, :], wg: u32, lt: u32, tile0: i32, step: i32, tiles_m: i32, tiles_n: i32,
    my_tiles: i32, k_tiles: i32, rank: i32, m: i32, n: i32, n0: i32, n1: i32, s0: f32,
    s1: f32, s2: f32,
    BN: kaio.constexpr, STAGES: kaio.constexpr, IN: kaio.constexpr, GROUP: kaio.constexpr,
    OUT: kaio.constexpr, PAIR: kaio.constexpr, OUTS: kaio.constexpr, SKEW: kaio.constexpr,
    ROWS: kaio.constexpr, BT: kaio.constexpr, BIAS: kaio.constexpr, ACT: kaio.constexpr,
    RES: kaio.constexpr, RT: kaio.constexpr, CH: kaio.constexpr,
):  # fmt: skip
    """A consumer warpgroup's loop (``matmul_wgmma``): each of its block's tiles, K slice by
    K slice from the ring (waited for, multiplied into ``acc``, and past 256 columns
    ``acc2``, then freed), then its 64 rows of the tile stored (``store_rows``, or with a
    bias, activation or residual ``store_fused``). With a ``SKEW``, warpgroup 0 arrives on
    ``go`` once it has issued its first SKEW slices."""
    WIDE = BN // (WGMMA_MAX_N + 1)  # noqa: N806  (compile-time ints: 1 past 256 columns)
    BN1 = BN - (BN - WGMMA_MAX_N) * WIDE  # noqa: N806  (min(BN, 256))
    BN2 = (BN - WGMMA_MAX_N) * WIDE + 8 * (1 - WIDE)  # noqa: N806  (the rest, else 8)
    s = i32(0)  # the stage and phase parity of a slice (``next_stage``)
    ph = u32(0)
    ps = i32(0)  # the stage of the slice before
    for i in range(my_tiles):
        for kt in range(k_tiles):
            kaio.mbarrier_wait(bars, (0, s), ph)
            kaio.wgmma_fence()
            for kk in kaio.static_range(BK // 16):
                da = kaio.smem_descriptor(sa, (s, 64 * wg, kk * 16), SW, 16, 1024)
                mma_blocks(acc, da, sb, s, kk * 16, kt + kk > 0, 0, BT, IN)
                if BN > WGMMA_MAX_N:  # the columns past 256: B's blocks 4 on
                    mma_blocks(acc2, da, sb, s, kk * 16, kt + kk > 0, 4, BT, IN)
            ps, s, ph = retire_slice(bars, kt, lt, s, ph, ps, STAGES, PAIR)
            if SKEW and wg == 0 and lt == 0 and i == 0 and kt == kaio.min(SKEW, k_tiles) - 1:
                kaio.mbarrier_arrive(go, 0)
        kaio.wgmma_wait(0)
        free_stage(bars, ps, lt, PAIR)  # the tile's last stage, before the epilogue
        # the epilogue: this warpgroup's 64 rows (in a pair, of block rank's half)
        row0, col0 = tile_origin(tile0 + i * step, tiles_m, tiles_n, BN, GROUP, ROWS)
        row0 = row0 + rank * BM + 64 * i32(wg)
        if BIAS or RES or ACT != "none":  # the fused epilogue: one output
            store_fused(acc, acc, c0, bias, res, u32(row0), u32(col0), u32(m), u32(n), lt, BN1,
                        CH, BIAS, ACT, RES, IN, OUT, RT)  # fmt: skip
            if BN > WGMMA_MAX_N:
                store_fused(acc2, acc2, c0, bias, res, u32(row0), u32(col0 + WGMMA_MAX_N),
                            u32(m), u32(n), lt, BN2, CH, BIAS, ACT, RES, IN, OUT, RT)  # fmt: skip
        elif OUTS == 1:  # one output, unscaled: no output or scale chosen per column
            store_rows(acc, c0, c0, c0, row0, col0, m, n, n, 0, 1.0, 1.0, 1.0, lt, BN=BN1,
                       OUT=OUT)  # fmt: skip
            if BN > WGMMA_MAX_N:
                store_rows(acc2, c0, c0, c0, row0, col0 + WGMMA_MAX_N, m, n, n, 0, 1.0, 1.0,
                           1.0, lt, BN=BN2, OUT=OUT)  # fmt: skip
        else:
            store_rows(acc, c0, c1, c2, row0, col0, m, n, n0, n1, s0, s1, s2, lt, BN=BN1,
                       OUT=OUT)  # fmt: skip
            if BN > WGMMA_MAX_N:
                store_rows(acc2, c0, c1, c2, row0, col0 + WGMMA_MAX_N, m, n, n0, n1, s0, s1,
                           s2, lt, BN=BN2, OUT=OUT)  # fmt: skip


@kaio.gpu_kernel
def matmul_wgmma(
    ta: kaio.tensormap,
    tb: kaio.tensormap,
    c0: OUT[:, :],
    c1: OUT[:, :],
    c2: OUT[:, :],
    bias: IN[:],
    res: RT[:, :],
    m: i32,
    n: i32,
    n0: i32,
    n1: i32,
    k: i32,
    s0: f32,
    s1: f32,
    s2: f32,
    BN: kaio.constexpr,
    STAGES: kaio.constexpr,
    IN: kaio.constexpr,
    GROUP: kaio.constexpr,
    OUT: kaio.constexpr,
    PAIR: kaio.constexpr,
    OUTS: kaio.constexpr,
    SKEW: kaio.constexpr,
    BT: kaio.constexpr,
    BIAS: kaio.constexpr,
    ACT: kaio.constexpr,
    RES: kaio.constexpr,
    RT: kaio.constexpr,
    CH: kaio.constexpr,
):
    """C = A @ B on the persistent schedule (module docstring). ``SKEW`` > 0: the second
    consumer warpgroup starts once the first has issued its first ``SKEW`` K slices (at most
    ``STAGES``), and stays that far behind: one warpgroup's epilogue then runs while the
    other still multiplies, the tensor cores kept busy. ``BT``: B [N, K] (``tb`` in boxes of
    64 x 64). ``BIAS``, ``ACT``, ``RES`` (``kaio_ops._gemm``'s epilogue: + bias [N] of type
    IN, an activation but "silu_gate", + residual [M, N] of type ``RT``): C in ``c0`` through
    ``store_fused`` (``CH`` n8 tiles a chunk), the residual rows of each tile prefetched."""
    # past 256 columns, or with the fused epilogue, a whole producer warpgroup gives the
    # consumers registers (``threads_for``)
    # (``threads_for``; launch_bounds takes an expression of constexprs, not a variable)
    REGS = (BN > WGMMA_MAX_N) + BIAS + RES + (ACT != "none") > 0  # noqa: N806
    kaio.launch_bounds(
        THREADS + WIDE_EXTRA * ((BN > WGMMA_MAX_N) + BIAS + RES + (ACT != "none") > 0), 1
    )
    if PAIR:
        kaio.cluster_dims(2)
    sa = kaio.shared_dynamic(IN, (STAGES, BM, BK), 0)
    NBLK = (BN + 63) // 64  # B's 64-column blocks a stage (``produce``)
    sb = kaio.shared_dynamic(IN, (STAGES, NBLK, BK, 64), STAGES * A_STAGE_BYTES)
    bars = kaio.shared_dynamic(u64, (2, STAGES), STAGES * (A_STAGE_BYTES + BK * NBLK * 128))
    GO = STAGES * (A_STAGE_BYTES + BK * NBLK * 128 + 16) if SKEW else 0  # unused: a stub
    go = kaio.shared_dynamic(u64, (1,), GO)  # the first warpgroup's SKEW slices are issued
    t = kaio.thread_idx_x()
    if SKEW and t == 0:
        kaio.mbarrier_init(go, 0, 1)
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it (CUTLASS does the same)
    lt = t % 128
    ROWS = BM * (2 if PAIR else 1)  # a tile of the schedule: a pair's two tiles for PAIR
    tile0, step, tiles_m, tiles_n, my_tiles, k_tiles, slices = tile_schedule(m, n, k, ROWS, BN, BK)
    rank = i32(0)
    if PAIR:  # the cluster's pair of tiles: tile0, step and the counts in pairs
        rank = i32(kaio.cluster_rank())
        tile0 = tile0 // 2
        step = step // 2
        my_tiles = (tiles_m * tiles_n - tile0 + step - 1) // step
        slices = my_tiles * k_tiles
    init_ring(bars, t, STAGES, 2 * (2 if PAIR else 1))  # "free": each consumer warpgroup's
    if PAIR:
        kaio.cluster_sync()  # the other block's barriers are ready before any copy
    # a tile wider than one wgmma (N <= 256): its first 256 columns in acc, the rest in
    # acc2 (from the fifth 64-column block of B; unused below 257 columns)
    WIDE = BN // (WGMMA_MAX_N + 1)  # noqa: N806  (compile-time ints: 1 past 256 columns)
    BN1 = BN - (BN - WGMMA_MAX_N) * WIDE  # noqa: N806  (min(BN, 256))
    BN2 = (BN - WGMMA_MAX_N) * WIDE + 8 * (1 - WIDE)  # noqa: N806  (the rest, else 8)
    acc = kaio.local(f32, (BN1 // 8, 2, 2))
    acc2 = kaio.local(f32, (BN2 // 8, 2, 2))
    if wg < 2 and (SKEW == 0 or wg == 0):  # the consumers (with a SKEW, the first)
        if REGS:  # registers for acc2 or the epilogue: the producer's warpgroup gives them
            kaio.setmaxnreg_inc(CONSUMER_REGS)
        consume(acc, acc2, sa, sb, bars, go, c0, c1, c2, bias, res, wg, lt, tile0, step,
                tiles_m, tiles_n, my_tiles, k_tiles, rank, m, n, n0, n1, s0, s1, s2, BN, STAGES,
                IN, GROUP, OUT, PAIR, OUTS, SKEW, ROWS, BT, BIAS, ACT, RES, RT, CH)  # fmt: skip
    elif SKEW and wg == 1:  # the second consumer warpgroup, SKEW slices behind the first
        if REGS:
            kaio.setmaxnreg_inc(CONSUMER_REGS)
        if my_tiles > 0:
            kaio.mbarrier_wait(go, 0, 0)
        consume(acc, acc2, sa, sb, bars, go, c0, c1, c2, bias, res, wg, lt, tile0, step,
                tiles_m, tiles_n, my_tiles, k_tiles, rank, m, n, n0, n1, s0, s1, s2, BN, STAGES,
                IN, GROUP, OUT, PAIR, OUTS, SKEW, ROWS, BT, BIAS, ACT, RES, RT, CH)  # fmt: skip
    elif REGS:  # the producer's warpgroup (384 threads): its first thread
        kaio.setmaxnreg_dec(PRODUCER_REGS)
        if t == CONSUMERS:
            produce_all(sa, sb, bars, ta, tb, tile0, step, tiles_m, tiles_n, k_tiles, slices,
                        rank, res, m, n, BN=BN, STAGES=STAGES, IN=IN, GROUP=GROUP, ROWS=ROWS,
                        PAIR=PAIR, BT=BT, RES=RES, RT=RT)  # fmt: skip
    elif t == CONSUMERS:
        produce_all(sa, sb, bars, ta, tb, tile0, step, tiles_m, tiles_n, k_tiles, slices, rank,
                    res, m, n, BN=BN, STAGES=STAGES, IN=IN, GROUP=GROUP, ROWS=ROWS, PAIR=PAIR,
                    BT=BT, RES=RES, RT=RT)  # fmt: skip
    if PAIR:
        kaio.cluster_sync()  # no block leaves while the other may still write to it


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


def launch(
    a, b, m: int, n: int, k: int, sms: int, bf16: bool, f16_outs: list | None = None,
    scales: list | None = None, group: int = GROUP_ROWS, out_type=f16, bn: int | None = None,
    pair: int = 0, skew: int = 0, bt: bool = False, bias=None, residual=None, act: str = "none",
    chunk: int = 4,
):  # fmt: skip
    """``a @ b`` with ``matmul_wgmma`` on a persistent grid of at most ``sms`` blocks: 128 x
    256 tiles when they give every one of ``sms`` multiprocessors a block, else 128 x 128;
    tiles taken ``group`` tile rows at a time. The result is a new f32 array of ``a``'s kind,
    or with ``f16_outs`` (one to three arrays [M, N_i] of ``out_type``, f16 or bf16, the N_i
    summing to N) the columns of C go to them in turn, each times its float in ``scales``
    (default 1) and rounded to ``out_type``; returns ``f16_outs``. ``bn``: the tile width
    (a multiple of 16 up to ``MAX_BN``; 160, 192 and 224 fill the waves of some LLM shapes:
    ``linear.persistent_width``; past 256, two wgmmas a K step in a block of 384 threads)
    instead of that rule. ``pair`` 1: blocks in clusters of two
    that take pairs of tiles one above the other and load the B slice once for both (TMA
    multicast), as many clusters as run at once. ``skew``: the second consumer warpgroup
    that many K slices behind the first (``matmul_wgmma``'s ``SKEW``, at most the ring's
    stages). ``bt``: ``b`` is [N, K] (``nn.Linear``'s weight). ``bias`` ([N], of ``a``'s
    type), ``act`` (``kaio_ops._gemm``'s activations but "silu_gate") and ``residual`` ([M,
    N], f16, bf16 or f32; kernel arguments, or None): the fused epilogue of
    ``kaio_ops.linear`` (``store_fused``, ``chunk`` n8 tiles a chunk) into the one array of
    ``f16_outs``; ``a`` may have leading batch dimensions."""
    from kaio_ops import _arrays
    from kaio_ops.linear import _placeholder

    if bn is None:
        bn = 256 if -(-m // BM) * -(-n // 256) >= sms else 128
    if bn % 16 or not 16 <= bn <= MAX_BN:
        raise ValueError(f"matmul: the persistent kernel's tile width must be a multiple of 16 "
                         f"up to {MAX_BN}, got {bn}")  # fmt: skip
    stages = stages_for(bn)
    if not 0 <= skew <= stages:
        raise ValueError(f"matmul: the persistent kernel's skew must be 0 to {stages} K slices "
                         f"(its ring's stages at width {bn}), got {skew}")  # fmt: skip
    threads = threads_for(bn, bias is not None or residual is not None or act != "none")
    if f16_outs is None:
        outs = _arrays.output(a, (m, n), f32)
        targets, widths = [outs] * 3, [n, 0]
    else:
        outs = f16_outs
        targets = _arrays.three(outs)
        widths = ([o.shape[1] for o in outs] + [0, 0])[:2]
    factors = (list(scales or []) + [1.0, 1.0, 1.0])[:3]
    a2 = a.obj if len(a.shape) == 2 else _arrays.view(a.obj, a.kind, (m, k))
    ta = kaio.tensor_map_2d(a2, (BM, BK), SW)
    tb = kaio.tensor_map_2d(b.obj, (64, 64) if bt else (BK, 64), SW)
    out = f32 if f16_outs is None else out_type
    dt = kaio.bf16 if bf16 else f16
    consts = {"BN": bn, "STAGES": stages, "IN": dt, "GROUP": group}
    outs_used = 1 if f16_outs is None or len(f16_outs) == 1 and not scales else 3
    consts |= {"OUT": out, "PAIR": pair, "OUTS": outs_used, "SKEW": skew, "BT": int(bt)}
    rt = out if residual is None else residual.dtype
    consts |= {"BIAS": int(bias is not None), "ACT": act, "RES": int(residual is not None)}
    consts |= {"RT": rt, "CH": chunk}
    bias_arg = _placeholder(a, dt, 1) if bias is None else bias.arg(bias.size)
    res_arg = _placeholder(a, rt, 2) if residual is None else residual.arg(m, n)
    shared = shared_bytes(bn, stages, skew)
    grid = min(sms, -(-m // BM) * -(-n // bn))
    if pair:  # whole clusters, as many as the GPU runs at once
        grid = 2 * min(-(-m // (2 * BM)) * -(-n // bn), clusters(_arrays.gpu(a), shared, consts))
    matmul_wgmma[grid, threads, _arrays.stream_of(a), shared](
        ta, tb, *targets, bias_arg, res_arg, m, n, *widths, k, *factors, **consts
    )
    return outs


_CLUSTERS: dict = {}


def clusters(dev, shared: int, consts: dict) -> int:
    """How many clusters of two blocks of ``matmul_wgmma`` with ``consts`` run at once on
    ``dev`` (None, the simulator: one), asked of the driver once."""
    key = (dev and dev.ordinal, shared, str(sorted(consts.items(), key=str)))
    if key not in _CLUSTERS:
        threads = threads_for(consts["BN"], fused(consts))
        found = 1 if dev is None else matmul_wgmma.max_active_clusters(threads, shared, device=dev,
                                                                      **consts)  # fmt: skip
        _CLUSTERS[key] = max(1, found)
    return _CLUSTERS[key]


def fused(consts: dict) -> bool:
    """Whether ``matmul_wgmma`` with ``consts`` has the fused epilogue (a bias, an activation
    or a residual)."""
    return bool(consts.get("BIAS") or consts.get("RES") or consts.get("ACT", "none") != "none")


def threads_for(bn: int, fused: bool = False) -> int:
    """The block size of ``matmul_wgmma`` at tile width ``bn``: two consumer warpgroups and
    a producer warp, or past 256 columns or with the ``fused`` epilogue a whole producer
    warpgroup (``WIDE_EXTRA``) that gives the consumers its registers."""
    return THREADS + (WIDE_EXTRA if bn > WGMMA_MAX_N or fused else 0)


def shared_bytes(bn: int, stages: int, skew: int = 0) -> int:
    """The dynamic shared memory of ``matmul_wgmma``: the tile ring (B in whole 64-column
    blocks) and its 2 x STAGES barriers (and with a ``skew``, its barrier)."""
    return stages * (A_STAGE_BYTES + BK * -(-bn // 64) * 128 + 16) + (16 if skew else 0)


def stages_for(bn: int) -> int:
    """The ring depth of ``matmul_wgmma`` at tile width ``bn``: as many stages as fit in
    shared memory, at most 5 (4 at 256 columns)."""
    return min(5, 227 * 1024 // shared_bytes(bn, 1))


def specializations() -> list:
    """(kernel, constexprs) of every specialization ``launch`` uses (for PTX checks)."""
    specs = [
        (
            matmul_wgmma,
            {"BN": bn, "STAGES": st, "IN": in_, "GROUP": GROUP_ROWS, "OUT": out},
        )
        for bn, st in ((256, 4), (128, 5))
        for in_ in (f16, kaio.bf16)
        for out in (f32, f16, kaio.bf16)
    ]
    plain = {"SKEW": 0, "BT": 0, "BIAS": 0, "ACT": "none", "RES": 0, "CH": 4}
    for spec in specs:
        spec[1].update(PAIR=0, OUTS=1 if spec[1]["BN"] == 256 else 3, **plain, RT=spec[1]["OUT"])
    for bn, in_, pair in ((160, f16, 0), (192, kaio.bf16, 1), (224, f16, 0), (128, f16, 1),
                          (320, f16, 1), (320, kaio.bf16, 0)):  # fmt: skip
        consts = {"BN": bn, "STAGES": stages_for(bn), "IN": in_, "GROUP": GROUP_ROWS}
        specs.append((matmul_wgmma, {**consts, "OUT": in_, "PAIR": pair, "OUTS": 1, **plain,
                                     "RT": in_}))  # fmt: skip
    # B [N, K] and the fused epilogue (bias, activation, residual) in one specialization
    # (each costs seconds of CI through both backends; the skew, whose second consumer
    # branch doubles the code, is checked by the simulator and GPU tests)
    for bn, pair, skew, bt, act, rt in ((320, 1, 0, 1, "silu", f32),):
        consts = {"BN": bn, "STAGES": stages_for(bn), "IN": f16, "GROUP": GROUP_ROWS, "OUT": f16}
        epi = {"BIAS": int(act != "none"), "ACT": act, "RES": int(act != "none"), "RT": rt}
        specs.append((matmul_wgmma, {**consts, "PAIR": pair, "OUTS": 1, "SKEW": skew, "BT": bt,
                                     **epi, "CH": 4}))  # fmt: skip
    return specs
