"""A stream-K schedule of the Hopper (sm_90) GEMM behind ``kaio_ops.matmul`` and
``kaio_ops.linear``: for products whose ``64 * WG x BN`` tiles do not fill the GPU in whole
waves, a persistent grid of ``G`` blocks (one a multiprocessor) shares out the work by K
steps rather than by tiles, so every block gets the same number of 64-deep K steps.

The work is ``tiles x k_tiles`` steps. The first ``dp_tiles`` tiles (a multiple of ``G``;
zero unless the tiles make two waves or more) go whole, block ``b`` taking tiles ``b, b + G,
...`` (data parallel); the steps of the remaining tiles, numbered tile by tile, go in ``G``
contiguous runs, run ``b`` = steps ``[b W / G, (b + 1) W / G)`` of the ``W`` left, so a
block's run is the tail of one tile, whole tiles, and the head of another (each a
"segment"). A segment that covers its whole tile is finished in place (the epilogue of
``kaio_ops._gemm``: bias, activation, residual, one rounding to ``OUT``). A partial segment
stores its raw f32 sums in the workspace, in the slot of its place among the tile's
segments (``ws`` rows ``slot * MP + row``, MP and the columns padded to whole tiles), then
each warp counts its arrival on the tile's counter of its 16 rows; the warp that arrives
last sets its accumulators to the sum of the tile's slots in slot order (its own read back
too), each slot's loads in flight at once, and finishes them as a whole tile is. The order
of the sum is fixed by the schedule, not by which block comes last: the result is the same
bits run to run. Nothing waits on another block
(no spin), so the schedule cannot deadlock whatever runs beside it.

Each block is ``_gemm_hopper.gemm_wgmma``'s: ``WG`` consumer warpgroups (64 rows each,
``wgmma.m64n{BN}k16``, one group in flight) and a producer warp whose one working thread
issues the TMA copies of each K step of A and B into a ``STAGES``-deep ring of
128-byte-swizzled tiles, walking the same segments as the consumers, up to ``STAGES``
steps ahead across segment boundaries (the next segment's loads overlap this one's
epilogue and fixup). Both B layouts (``BT``: [N, K], ``nn.Linear``'s; else [K, N]) and the
"silu_gate" pair of accumulators (gate rows then up rows) as there.
"""

# ruff: noqa: F821  (DT, OUT and RT in annotations are dtype constexpr parameters)
from __future__ import annotations

import math
from typing import NamedTuple

import kaio
from kaio import bool_, f32, i32, u32, u64
from kaio_ops import _gemm_hopper
from kaio_ops._gemm import epilogue
from kaio_ops._gemm_hopper import load_slice, mma_run
from kaio_ops._matmul_hopper import grouped, init_ring, next_stage

BK = 64
SW = 128  # swizzle bytes: one 128-byte row per 64 elements
GROUP = 8  # tile rows a group of the tile order spans (``_matmul_hopper.grouped``)
SHARED_LIMIT = _gemm_hopper.SHARED_LIMIT


@kaio.gpu_func
def owner(step: i32, g: i32, work: i32) -> i32:
    """The block whose run holds stream-K step ``step`` (runs ``[b W / G, (b + 1) W / G)``;
    ``W * G`` < 2**31, ``schedule`` checks: a 64-bit division would be a call, and the call
    would spill the accumulators)."""
    return ((step + 1) * g - 1) // work


@kaio.gpu_func
def run_bound(b: i32, g: i32, work: i32) -> i32:
    """The first stream-K step of block ``b``'s run (``b W / G``)."""
    return b * work // g


@kaio.gpu_func
def segment(seg: i32, b: i32, g: i32, dp: i32, dp_tiles: i32, first: i32, k_tiles: i32,
            sk_end: i32):  # fmt: skip
    """(tile, first K step, end K step) of block ``b``'s segment number ``seg``: its data
    parallel tiles (``dp`` of them) first, then its stream-K run, which starts at step
    ``first`` and ends before ``sk_end`` (steps counted from the first stream-K tile)."""
    j = seg - dp
    tile_sk = first // k_tiles + j
    kb = kaio.select(j == 0, first - tile_sk * k_tiles, 0)
    ke = kaio.min(k_tiles, sk_end - tile_sk * k_tiles)
    is_dp = seg < dp
    tile = kaio.select(is_dp, b + seg * g, dp_tiles + tile_sk)
    return tile, kaio.select(is_dp, 0, kb), kaio.select(is_dp, k_tiles, ke)


@kaio.gpu_func
def put_pair(
    c: OUT[:, :], bias: DT[:], res: RT[:, :], g0: f32, g1: f32, u0: f32, u1: f32, row: i32,
    col: i32, M: u32, N: u32, BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr,
    DT: kaio.constexpr, OUT: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """C (row, col) and (row, col + 1) (col even) from their f32 sums (up sums u0, u1 for
    "silu_gate") through ``_gemm.epilogue``, rounded to OUT, where inside C."""
    if u32(row) < M:
        pair = kaio.local(OUT, 2)
        for e in kaio.static_range(2):
            at = u32(kaio.min(col + e, i32(N) - 1))
            g = kaio.select(e == 0, g0, g1)
            u = kaio.select(e == 0, u0, u1)
            pair[e] = OUT(epilogue(g, u, u32(row), at, N, bias, res, BIAS, ACT, RES, DT, RT))
        if N % 2 == 0:  # two adjacent columns, 2 * OUT.itemsize aligned
            if u32(col) < N:
                kaio.store_vector(c, (row, col), pair)
        else:
            for e in kaio.static_range(2):
                if u32(col + e) < N:
                    c[row, col + e] = pair[e]


@kaio.gpu_func
def fixup(
    ws: f32[:, :], counters: i32[:], acc: f32[:, :, :], acc_u: f32[:, :, :], tile_sk: i32,
    b: i32, g: i32, work: i32, k_tiles: i32, row0: i32, col0: i32, M: u32, wcols: i32,
    wslot: i32, lane: i32, WG: kaio.constexpr, BN: kaio.constexpr, GATE: kaio.constexpr,
) -> bool_:  # fmt: skip
    """One warp's part of a partial segment of stream-K tile ``tile_sk``: store its raw
    sums (rows ``row0 (+ 8)``, columns ``col0 + 8 j (+ 1)``) in its slot of ``ws`` and
    count the warp's arrival. The tile's last warp of these rows then sets its accumulators
    to the sum of the slots in slot order (its own read back: the same value it stored),
    a slot's loads all in flight at once, and returns True (it finishes the tile's rows)."""
    lo = owner(tile_sk * k_tiles, g, work)
    slots = owner(tile_sk * k_tiles + k_tiles - 1, g, work) - lo + 1
    im = ((i32(M) + 64 * WG - 1) // (64 * WG)) * 64 * WG  # a slot's rows: whole tiles
    pair = kaio.local(f32, 2)
    for j in kaio.static_range(BN // 8):
        for h in kaio.static_range(2):
            at = (b - lo) * im + row0 + 8 * h
            pair[0] = acc[j, h, 0]
            pair[1] = acc[j, h, 1]
            kaio.store_vector(ws, (at, col0 + 8 * j), pair)
            if GATE:
                pair[0] = acc_u[j, h, 0]
                pair[1] = acc_u[j, h, 1]
                kaio.store_vector(ws, (at, wcols + col0 + 8 * j), pair)
    kaio.threadfence()
    kaio.sync_warp()
    slot = tile_sk * (4 * WG) + wslot
    before = i32(0)
    if lane == 0:
        before = kaio.atomic_add(counters, slot, 1)
    last = kaio.shfl_idx(before, 0) == slots - 1
    if last:  # the last of the tile's segments for these rows: sum them
        kaio.threadfence()
        if lane == 0:
            counters[slot] = 0  # zero again for the next launch on the stream
        for z in range(slots):
            for j in kaio.static_range(BN // 8):
                for h in kaio.static_range(2):
                    at = z * im + row0 + 8 * h
                    kaio.load_vector(pair, ws, (at, col0 + 8 * j))
                    for e in kaio.static_range(2):
                        acc[j, h, e] = kaio.select(z == 0, pair[e], acc[j, h, e] + pair[e])
                    if GATE:
                        kaio.load_vector(pair, ws, (at, wcols + col0 + 8 * j))
                        for e in kaio.static_range(2):
                            acc_u[j, h, e] = kaio.select(z == 0, pair[e], acc_u[j, h, e] + pair[e])
    return last


@kaio.gpu_kernel
def gemm_streamk(
    ta: kaio.tensormap, tb: kaio.tensormap, c: OUT[:, :], ws: f32[:, :], bias: DT[:],
    res: RT[:, :], counters: i32[:], M: u32, N: u32, K: u32, dp_tiles: i32, wcols: i32,
    WG: kaio.constexpr, BN: kaio.constexpr, STAGES: kaio.constexpr, BT: kaio.constexpr,
    BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr, DT: kaio.constexpr,
    OUT: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """C = epilogue(A @ B) on the stream-K schedule (module docstring). ``ta``: A [M, K] in
    boxes of (64 * WG, 64); ``tb``: B [N, K] (BT 1; [2N, K] for "silu_gate") or [K, N] (BT
    0) in boxes of (64, 64); ``ws``: the partial sums, f32 [slots * MP, wcols] (gate: 2 *
    wcols columns; MP and wcols: M and N rounded up to whole tiles); ``counters``: zeroed
    i32, 4 * WG a stream-K tile (left zero again)."""
    kaio.launch_bounds(WG * 128 + 32, 1)
    GATE = ACT == "silu_gate"
    BM = 64 * WG
    ROWS = BM + (2 if GATE else 1) * ((BN + 63) // 64) * 64  # a stage: A, B (``load_slice``)
    ring = kaio.shared_dynamic(DT, (STAGES, ROWS, BK), 0)
    bars = kaio.shared_dynamic(u64, (2, STAGES), STAGES * ROWS * BK * 2)
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    b = i32(kaio.block_idx_x())
    g = i32(kaio.grid_dim_x())
    tiles_m = i32((M + BM - 1) // BM)
    tiles_n = i32((N + BN - 1) // BN)
    k_tiles = i32((K + BK - 1) // BK)
    work = (tiles_m * tiles_n - dp_tiles) * k_tiles  # the stream-K steps
    dp = (dp_tiles - b + g - 1) // g
    first = run_bound(b, g, work)
    sk_end = run_bound(b + 1, g, work)
    segments = dp + kaio.select(sk_end > first, (sk_end - 1) // k_tiles - first // k_tiles + 1, 0)
    init_ring(bars, t, STAGES, WG)  # "free": lane 0 of each consumer warpgroup
    acc = kaio.local(f32, (BN // 8, 2, 2))
    acc_u = kaio.local(f32, (BN // 8 if GATE else 1, 2, 2))
    s, ph = i32(0), u32(0)  # the ring position: stage, phase parity
    if wg < WG:  # the consumers
        ps = i32(0)  # the stage of the step before
        lane = i32(lt % 32)
        warp = i32(lt // 32)
        for sg in range(segments):
            tile, kb, ke = segment(sg, b, g, dp, dp_tiles, first, k_tiles, sk_end)
            s, ph, ps = mma_run(acc, acc_u, ring, bars, kb, ke, s, ph, ps, wg, lt, STAGES, WG, BN,
                                BT, ACT, 0, DT)  # fmt: skip
            if lt == 0:  # the segment's last stage, before its epilogue
                kaio.mbarrier_arrive(bars, (1, ps))
            idx = grouped(tile, tiles_m, tiles_n, GROUP)
            row0 = (idx // tiles_n) * BM + 64 * i32(wg) + 16 * warp + lane // 4
            col0 = (idx % tiles_n) * BN + 2 * (lane % 4)
            done = kb == 0 and ke == k_tiles  # the whole tile: finish it in place
            if not done:  # a part: to the workspace; the last part's warp sums and finishes
                done = fixup(ws, counters, acc, acc_u, tile - dp_tiles, b, g, work, k_tiles, row0,
                             col0, M, wcols, i32(wg) * 4 + warp, lane, WG, BN, GATE)  # fmt: skip
            if done:
                for j in kaio.static_range(BN // 8):
                    for h in kaio.static_range(2):
                        u0 = f32(0.0)
                        u1 = f32(0.0)
                        if GATE:
                            u0 = acc_u[j, h, 0]
                            u1 = acc_u[j, h, 1]
                        put_pair(c, bias, res, acc[j, h, 0], acc[j, h, 1], u0, u1,
                                 row0 + 8 * h, col0 + 8 * j, M, N, BIAS, ACT, RES, DT, OUT,
                                 RT)  # fmt: skip
    elif t == WG * 128:  # the producer: each K step of each segment, STAGES ahead at most
        issued = i32(0)
        for sg in range(segments):
            tile, kb, ke = segment(sg, b, g, dp, dp_tiles, first, k_tiles, sk_end)
            idx = grouped(tile, tiles_m, tiles_n, GROUP)
            m0 = (idx // tiles_n) * BM
            n0 = (idx % tiles_n) * BN
            for kt in range(kb, ke):
                if issued >= STAGES:  # stage s held step issued - STAGES: wait until freed
                    kaio.mbarrier_wait(bars, (1, s), ph ^ 1)
                load_slice(ring, bars, ta, tb, s, m0, n0, kt * BK, N, 0, WG, BN, BT, ACT, 0, DT)
                issued += 1
                s, ph = next_stage(s, ph, STAGES)


class Plan(NamedTuple):
    """A launch plan of ``gemm_streamk``: ``WG`` warpgroups (64 * WG rows a tile), ``BN``
    columns a tile (64 or 128: the sum of a split tile holds a slot's loads and the
    accumulators in registers at once, which spills at 256), a ring of ``stages``,
    ``blocks``: the persistent grid (0: one block a multiprocessor), and ``spread``: the
    whole waves of tiles left to the stream-K part besides the last partial one (1: each
    block's run is one to two tiles long; 0: only the partial wave is shared, each block's
    run less than a tile)."""

    wg: int
    bn: int
    stages: int
    blocks: int = 0
    spread: int = 1


class Schedule(NamedTuple):
    """The host's view of a launch: the grid, the data-parallel tiles, the workspace's slots
    and columns (N rounded up to whole tiles), the stream-K tiles (each with 4 * WG
    arrival counters), and whether the kernel's step arithmetic (``owner``: stream-K steps
    times the grid) fits in 31 bits."""

    grid: int
    dp_tiles: int
    slots: int
    wcols: int
    sk_tiles: int
    fits: bool


def schedule(m: int, n: int, k: int, chosen: Plan, sms: int) -> Schedule:
    """The schedule of ``chosen`` for an ``m x n x k`` product on ``sms`` multiprocessors
    (``share``: up to one block a multiprocessor, ``chosen.blocks`` if set)."""
    tiles = math.ceil(m / (64 * chosen.wg)) * math.ceil(n / chosen.bn)
    grid, dp_tiles, slots, fits = share(tiles, k, chosen.blocks or sms, chosen.spread)
    wcols = -(-n // chosen.bn) * chosen.bn
    return Schedule(grid, dp_tiles, slots, wcols, tiles - dp_tiles, fits)


def share(tiles: int, k: int, grid: int, spread: int) -> tuple:
    """(grid, data-parallel tiles, workspace slots, whether the kernel's step arithmetic
    fits in 31 bits) of a stream-K schedule of ``tiles`` tiles of K = ``k`` over ``grid``
    blocks: whole waves of tiles data parallel but the last partial one and ``spread``
    more, whose K steps are shared; every block must get at least one stream-K step (a
    tile's arrival count covers every block between its first and last), so a
    data-parallel wave goes back to the shared part while it has fewer steps than blocks,
    and without one the grid is cut to the steps."""
    k_tiles = max(1, math.ceil(k / BK))
    dp_tiles = max(0, tiles // grid - spread) * grid
    while dp_tiles and 0 < (tiles - dp_tiles) * k_tiles < grid:
        dp_tiles -= grid
    work = (tiles - dp_tiles) * k_tiles
    if not dp_tiles:
        grid = min(grid, work)
    least = max(1, work // grid)  # steps of the shortest run (none: all data parallel)
    slots = min(grid, -(-k_tiles // least) + 1)
    return grid, dp_tiles, slots, work * grid < 2**31


# the tile ring is _gemm_hopper's (the same stage layout): its size and depth too
shared_bytes = _gemm_hopper.shared_bytes
stages_for = _gemm_hopper.stages_for


def plan(m: int, n: int, k: int, sms: int, gate: bool = False) -> Plan:
    """A default ``Plan``: 128-row tiles (64 up to M = 64), 128 columns (the two
    accumulator sets of "silu_gate" share the registers of one), the deepest ring that fits
    (``stages_for``), one block a multiprocessor."""
    wg = 1 if m <= 64 else 2
    return Plan(wg, 128, stages_for(wg, 128, gate))


def specializations() -> list:
    """(kernel, constexprs) of the stream-K variants to check with ptxas (sm_90)."""
    from kaio.types import bf16, f16

    out = []
    for dt, ot, wg, bn, bt, act in (
        (f16, f16, 2, 128, 0, "none"),
        (bf16, bf16, 1, 64, 1, "gelu"),
        (f16, f32, 2, 64, 1, "silu_gate"),
        (bf16, f16, 2, 128, 0, "silu"),
    ):
        stages = stages_for(wg, bn, act == "silu_gate")
        consts = {"WG": wg, "BN": bn, "STAGES": stages, "BT": bt, "BIAS": 1, "ACT": act}
        out.append((gemm_streamk, {**consts, "RES": 1, "DT": dt, "OUT": ot, "RT": ot}))
    return out
