"""The Hopper (sm_90a) FP8 matmul: ``kaio_ops._matmul_hopper``'s design (a persistent grid,
TMA into a ring of 128-byte-swizzled shared stages, consumer warpgroups on ``wgmma``, a
producer warpgroup whose first thread issues the copies, full/free mbarriers per stage; see
that module's docstring) with 8-bit operands: ``wgmma.mma_async.m64n{N}k32`` with e4m3 or
e5m2 A and B. Its consumer loop (``consume``) and producer loop (``produce_all``) are also
``kaio_ops._int8_hopper``'s, parameterised by the wgmma kind (``KIND``: e4m3, e5m2 or i8 for
s8) and the accumulation.

A block computes a ``64 * WG x BN`` tile with ``WG`` (1 to 3) consumer warpgroups, each
multiplying its 64 rows of A by the whole B slice: ``WG = 2`` for large M, ``WG = 1`` and 16
to 128 columns for decode shapes, where the weight bytes are the cost and the tiles must
cover the multiprocessors (``config``); a decode tile copies only the A rows there are
(``AR``, ``a_rows``), not 64 rows mostly out of bounds, and its A stages hold only those
rows (``a_stage_rows``: a stage's 64-row wgmma operand runs on into the next stages' rows or
the ring's padding, rows whose results are never stored), so that deeper rings of weights
fit. ``OCC`` (a launch option, not a constexpr): up to that many blocks a multiprocessor on
the persistent grid, their rings small enough to fit together. With more than one consumer
warpgroup the producer warpgroup gives its registers to them (``setmaxnreg``: 24 left to it,
240 or 160 to each consumer: 128 x 160 to 128 x 224 tiles hold their acc and one slice sum
there; the runtime's whole-program JIT spills none of them, where the old relocatable one
gave them local memory: docs/performance.md). ``CL = 2``: clusters of two blocks, which take
pairs of tiles one above the other and share each B slice (each copies half of it into both,
TMA multicast). ``SPLIT``: the tiles of the last, partial wave of the persistent grid (all
of them when there are fewer tiles than multiprocessors) split along K into ``parts``
(``unit_of``, ``split_parts``), their raw f32 sums in a workspace that ``sum_parts`` adds in
order and scales, or (``SPLIT`` 3) that the last warp to arrive of each tile's warps adds
in the same order before its epilogue (``last_part``: no second launch). ``SWAP``: the roles
swapped, C^T = B^T A^T (cuBLAS's decode layout, its ``64x8`` tiles): the weights B^T are the
64-row operand and a's few rows the wgmma's N = 8 to 32 columns, so that no wgmma reads rows
that are not there; the same kernel (both operands K-major), the tensor maps and M, N
exchanged by ``launch``, the tiles of C^T stored transposed (``store_transposed``: lanes
trading values so that each stores two adjacent columns of C). ``swap_config`` routes them
up to ``SWAP_M`` rows. ``PDL``: the kernel is launched with programmatic dependent launch:
it is placed and set up while the kernel before it ends, and waits for that kernel's writes
(``kaio.grid_dependency_wait``) before it touches global memory; the swapped tiles with
their shared memory padded so that the next kernel's blocks cannot crowd onto their
multiprocessors (``exclusive_shared``).

Accumulation is promoted, as CUTLASS's default FP8 GEMMs and ``torch._scaled_mm`` (without
``use_fast_accum``) do: Hopper's fp8 wgmma keeps its running sum with fewer bits than f32
(measured on an H200: K = 8192 sums of quantized normal data off by up to ~0.5% of the
largest output, where small-integer data is exact), so each 128-deep K slice (four k32
wgmmas) starts a fresh wgmma sum ``part`` that is then added to the f32 ``acc`` of the tile
(``PROMOTE``):

- 2 ("double"): two ``part`` register sets in turn; slice k's wgmmas are issued into one while
  slice k - 1's sum, in the other, is added to ``acc`` (one group of wgmmas kept in flight, as
  the f16 kernel). Three accumulators.
- 3 ("halves"): for BN = 256, where a second 256-wide ``part`` does not fit in registers:
  each slice is multiplied as two 128-wide halves into one ``part`` of half the width, each
  waited for (``wgmma_wait(0)``) and added before the next.
- 1 ("single"): one ``part``, waited for after each slice; the other warpgroups' wgmmas keep
  the tensor cores busy meanwhile. Each stage is freed as soon as its wgmmas are done,
  where 2 frees it only once the next slice's data came and its wgmmas were issued: the
  routed mode of the narrow tiles up to 128 rows (one warpgroup, two on a shared 64-row
  tile, the swapped decode tiles), whose wgmmas are short and whose time is the weights'
  stream (``promotion``).
- 4 ("turns", two consumer warpgroups): as 1, but the warpgroups issue each slice's wgmmas in
  turn (warpgroup 1 after 0, 0 after 1's slice before; two mbarriers, an arrival a warp), so
  that one warpgroup's group runs while the other waits for and adds its own: they do not
  wait at the same time.
- 5 ("halves in flight", ``consume_pair``): each slice multiplied as two column halves,
  each its own group of wgmmas into its own half-width sum; one group kept in flight, so a
  half's sum is added to ``acc`` while the next half runs. Promoted every slice (as 1), with
  the registers of two accumulators (acc and two half-width sums), which fit 168 registers
  at 128 columns; slow on an H100 (0.66x of mode 1's speed: 64-column wgmmas read A twice
  as often from shared memory).
- 6 (``consume_pair``): mode 2's numerics and schedule in ``consume_pair``'s loop.
- 7 ("carried"): as 1, and the first slice of the warpgroup's next tile issued before the
  epilogue of this one (``carry_slice``: its stage waited for, its wgmmas into ``part``,
  not waited for), so that the tensor cores multiply while the epilogue scales and stores
  the tile; ``consume`` then waits for it and adds it to ``acc``, zeroed after the
  epilogue: the same sums in the same order as 1. ptxas waits for the wgmmas at the first
  branch they are in flight across, so a slice is carried only over an epilogue without
  one: a whole 64-row block inside C (``store_rows`` with ``CHECK`` 0), per-tensor scales,
  no bias (the per-column scales and bias spill the two accumulators' registers), one
  block a tile, ``VEC`` 1; elsewhere 7 is 1.
- 10 * E + S (``consume_every``): one sum over E slices (one group in flight within the
  interval), waited for and added at the interval's end: fewer waits, at the cost of E
  times longer wgmma sums (the error: docs/performance.md); S = 1 staggers the warpgroups'
  intervals by half an interval, so that they do not wait at the same time.
- 0: no promotion (the wgmma sum over all of K): the s8 kernel's exact integer sums.

The simulator's wgmma sums in f32 (the documented result, not the hardware's rounding), so
it cannot tell these apart; the GPU tests compare against ``torch._scaled_mm``. On an H100
(bench/fp8_plans.py, 2026-11-26, under the old relocatable JIT) the modes that hold three
accumulators in a 384-thread block (2 at 128 columns, 3) ran at a third of the speed of
the others (local memory); built whole (ptxas, or the JIT since), two sums in turn at 128
columns still ran at 0.82x of cuBLAS against one sum waited for's 0.91x, so ``promotion``
keeps mode 2 to the tiles where three accumulators fit in 160 registers.

PTX has no transposed 8-bit wgmma, so both operands are K-major: A [M, K] and B's transpose
[N, K] (what a column-major B, ``torch._scaled_mm``'s layout, already is). The shared tiles
and the TMA copies do not care about the element type: they are written for 16-bit units
(pairs of 8-bit values, the arrays viewed as f16 [rows, K / 2]), so a stage holds 64 units =
128 values of K, four k32 wgmmas, and both operands use A's descriptor (K-major, SBO 1024).
The epilogue scales the accumulators in registers first (the scales and bias loaded once a
tile, before any store), then stores 4 adjacent columns a lane (``VEC`` 1, lanes trading
pairs: ``_matmul_hopper.store_rows``), a pair (0), or (2, 16-bit outputs) each warp's 16
rows through its shared buffer, copied out a row by a lane's asynchronous bulk copy (3: each
copy waited for at the warp's next epilogue, not this one, so that the copies drain while
the next tile's wgmmas run; the routed epilogue of two consumer warpgroups, at a stage less:
stored by the threads, a wave's C left the tensor cores idle while the copies went out):
``acc * (scale_a * scale_b) (+ bias)`` rounded once.
"""

# ruff: noqa: F821  (DT and ACC in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import bool_, e4m3, e5m2, f16, f32, i32, u32, u64
from kaio_ops import _arrays
from kaio_ops._arrays import ByMemory
from kaio_ops._fp8 import FP8_TYPES, store_scaled, store_scaled_by
from kaio_ops._gemm_hopper import store_shared
from kaio_ops._matmul_hopper import (
    BK,
    GROUP_ROWS,
    SW,
    init_ring,
    next_position,
    next_stage,
    store_rows,
    tile_origin,
    tile_schedule,
)

__all__ = ["config", "launch", "specializations"]

SHARED_LIMIT = 227 * 1024
SUM_THREADS = 256
PRODUCER_REGS = 24  # registers a producer thread keeps (setmaxnreg), with 2 or 3 consumers
CONSUMER_REGS = (0, 0, 240, 160)  # and a consumer thread takes: (64K - 128 * 24) / (128 WG)


@kaio.gpu_func
def load_slice(
    sa: f16[:, :, :], sb: f16[:, :, :], bars: u64[:, :], ta: kaio.tensormap, tb: kaio.tensormap,
    kt: i32, row0: i32, col0: i32, s: i32, BN: kaio.constexpr, ROWS: kaio.constexpr,
    CL: kaio.constexpr, AR: kaio.constexpr,
):  # fmt: skip
    """The TMA copies of K slice ``kt`` of the tile at rows ``row0``, columns ``col0`` into
    stage ``s`` (``AR`` A rows, ``BN`` B^T rows). ``AR``: the A rows a copy brings (``ROWS``,
    or fewer for a decode tile of fewer rows: the stage's other rows keep what they held,
    and the results of those rows are never stored). In a cluster of two (``CL``), the
    position is the pair's (``2 * ROWS`` rows a tile): block r copies its own A rows and
    half r of the B slice, multicast into both blocks."""
    k0 = kt * BK
    kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32((AR + BN) * BK * 2))
    if CL == 1:
        kaio.tma_load_2d(sa, (s, 0, 0), ta, row0, k0, bars, (0, s))
        kaio.tma_load_2d(sb, (s, 0, 0), tb, col0, k0, bars, (0, s))
    else:
        r = i32(kaio.cluster_rank())
        kaio.tma_load_2d(sa, (s, 0, 0), ta, row0 + r * ROWS, k0, bars, (0, s))
        half = r * (BN // 2)
        kaio.tma_load_2d_multicast(sb, (s, half, 0), tb, col0 + half, k0, bars, (0, s), 3)


@kaio.gpu_func
def produce_all(
    sa: f16[:, :, :], sb: f16[:, :, :], bars: u64[:, :], ta: kaio.tensormap, tb: kaio.tensormap,
    tile0: i32, count: i32, k_tiles: i32, step: i32, tiles_m: i32, tiles_n: i32, full: i32,
    parts: i32, BN: kaio.constexpr, STAGES: kaio.constexpr, GROUP: kaio.constexpr,
    ROWS: kaio.constexpr, CL: kaio.constexpr, SPLIT: kaio.constexpr, AR: kaio.constexpr,
):  # fmt: skip
    """The producer's loop: every K slice of the block's tiles (from tile ``tile0``, ``step``
    apart; ``count`` slices; ``_matmul_hopper.next_position``) through ``load_slice``, each
    stage reused once the consumers freed it (8-bit operands, A and B^T K-major: also
    ``kaio_ops._int8_hopper``'s). With ``SPLIT`` (the tiles from ``full`` on split in
    ``parts`` along K), ``count`` units instead (``unit_of``), from ``tile0``, ``step``
    apart."""
    s = i32(0)  # the ring position: stage, phase parity
    ph = u32(0)
    if SPLIT == 1:
        kt = i32(0)
        tile = tile0
        row0, col0 = tile_origin(tile0, tiles_m, tiles_n, BN, GROUP, ROWS * CL)
        for g in range(count):
            wait_free(bars, s, ph, g, STAGES)
            load_slice(sa, sb, bars, ta, tb, kt, row0, col0, s, BN, ROWS, CL, AR)
            kt, tile, row0, col0 = next_position(kt, tile, row0, col0, k_tiles, step, tiles_m,
                                                 tiles_n, BN, GROUP, ROWS * CL)  # fmt: skip
            s, ph = next_stage(s, ph, STAGES)
    else:
        g = i32(0)  # slices so far
        for i in range(count):
            tile, kb, ke, _slot = unit_of(tile0 + i * step, k_tiles, full, parts)
            row0, col0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP, ROWS)
            for kt in range(kb, ke):
                wait_free(bars, s, ph, g, STAGES)
                load_slice(sa, sb, bars, ta, tb, kt, row0, col0, s, BN, ROWS, 1, AR)
                s, ph = next_stage(s, ph, STAGES)
                g += 1


@kaio.gpu_func
def wait_free(bars: u64[:, :], s: i32, ph: u32, g: i32, STAGES: kaio.constexpr):
    """The producer waits until the consumers freed stage ``s`` (phase parity ``ph``) for
    its ``g``-th slice (from the ring's second round on)."""
    if g >= STAGES:
        kaio.mbarrier_wait(bars, (1, s), ph ^ 1)


@kaio.gpu_func
def k_range(part: i32, k_tiles: i32, parts: i32):
    """The K slices [begin, end) of part ``part`` of a tile's ``k_tiles`` split ``parts``
    ways (``(k_tiles + parts - 1) // parts`` each, the last part the rest)."""
    per = (k_tiles + parts - 1) // parts
    begin = kaio.min(part * per, k_tiles)
    return begin, kaio.min(begin + per, k_tiles)


@kaio.gpu_func
def unit_of(u: i32, k_tiles: i32, full: i32, parts: i32):
    """``(tile, first slice, end slice, slot)`` of work unit ``u`` of a K-split launch:
    units below ``full`` are whole tiles (slot -1, stored by the epilogue); the tiles from
    ``full`` on are split in ``parts`` along K (``k_range``), unit ``full + slot`` being
    part ``slot % parts`` of tile ``full + slot // parts`` (its raw sums go to rows
    ``slot * ROWS ..`` of the workspace; ``sum_parts`` adds a tile's parts in order)."""
    tile = u
    kb = i32(0)
    ke = k_tiles
    slot = i32(-1)
    if u >= full:
        slot = u - full
        tile = full + slot // parts
        kb, ke = k_range(slot % parts, k_tiles, parts)
    return tile, kb, ke, slot


@kaio.gpu_func
def wgmma_slice(
    part: ACC[:, :, :], sa: f16[:, :, :], sb: f16[:, :, :], s: i32, wg: u32, fresh: bool_,
    N0: kaio.constexpr, KIND: kaio.constexpr, ACC: kaio.constexpr, nb: i32 = 0,
):  # fmt: skip
    """``part`` (+)= warpgroup ``wg``'s 64 rows of stage ``s``'s A slice times B^T rows
    ``nb + N0 ..`` (as many as ``part`` has columns): four k32 wgmmas of kind ``KIND``, the
    first one starting a fresh sum when ``fresh``."""
    for kk in kaio.static_range(BK // 16):
        da = kaio.smem_descriptor(sa, (s, 64 * wg, kk * 16), SW, 16, 1024)
        db = kaio.smem_descriptor(sb, (s, nb + N0, kk * 16), SW, 16, 1024)
        keep = kk > 0 or not fresh
        if KIND == e4m3:
            kaio.wgmma_e4m3(part, da, db, keep)
        elif KIND == e5m2:
            kaio.wgmma_e5m2(part, da, db, keep)
        else:
            kaio.wgmma_s8(part, da, db, keep)


@kaio.gpu_func
def zero(acc: f32[:, :, :], BN: kaio.constexpr):
    """``acc = 0``: the ``BN // 8`` n8 tiles of a C fragment."""
    for j in kaio.static_range(BN // 8):
        for h in kaio.static_range(2):
            for e in kaio.static_range(2):
                acc[j, h, e] = 0.0


@kaio.gpu_func
def promote(acc: f32[:, :, :], part: f32[:, :, :], J0: kaio.constexpr, NJ: kaio.constexpr):
    """``acc[J0 + j] += part[j]`` for the ``NJ`` n8 tiles of ``part``."""
    for j in kaio.static_range(NJ):
        for h in kaio.static_range(2):
            for e in kaio.static_range(2):
                acc[J0 + j, h, e] += part[j, h, e]


@kaio.gpu_func
def promote_either(
    acc: f32[:, :, :], part0: f32[:, :, :], part1: f32[:, :, :], first: bool_,
    NJ: kaio.constexpr,
):  # fmt: skip
    """``acc += part0`` when ``first``, else ``acc += part1`` (the sum of an even slice, or
    of an odd one)."""
    if first:
        promote(acc, part0, 0, NJ)
    else:
        promote(acc, part1, 0, NJ)


@kaio.gpu_func
def free_stage(bars: u64[:, :], s: i32, lt: u32, CL: kaio.constexpr):
    """Lane 0 of the warpgroup tells the producer that stage ``s`` may be refilled (in a
    cluster of two, both blocks' producers: each writes half of the B slice into both)."""
    if lt == 0:
        if CL == 1:
            kaio.mbarrier_arrive(bars, (1, s))
        else:
            kaio.mbarrier_arrive_cluster(bars, (1, s), 0)
            kaio.mbarrier_arrive_cluster(bars, (1, s), 1)


@kaio.gpu_func
def consume(
    acc: ACC[:, :, :], part0: ACC[:, :, :], part1: ACC[:, :, :], sa: f16[:, :, :],
    sb: f16[:, :, :], bars: u64[:, :], turn: u64[:], st: i32, ph: u32, g: i32, k_tiles: i32,
    wg: u32, lt: u32, BN: kaio.constexpr, STAGES: kaio.constexpr, PROMOTE: kaio.constexpr,
    KIND: kaio.constexpr, ACC: kaio.constexpr, CL: kaio.constexpr, cs: i32 = 0,
    carried: bool_ = False, nb: i32 = 0,
):  # fmt: skip
    """Warpgroup ``wg``'s sums of one tile over its ``k_tiles`` K slices into ``acc``, each
    slice's stage waited for (full barrier) and freed once read; the ring position (stage
    ``st``, phase parity ``ph``, slices so far ``g``) after them returned; ``PROMOTE`` as the
    module docstring says (``part``: the slice sums, ``part0`` and ``part1`` for 2;
    ``turn``: the two warpgroups' turns for 4; for 7, ``carried``: the first slice is in
    ``part0`` already, from stage ``cs``: ``carry_slice``); ``nb``: the warpgroup's first B^T
    row in a stage (``NS``)."""
    kb = i32(0)
    if PROMOTE == 7:
        if carried:  # the first slice was issued before the tile before's epilogue
            kaio.wgmma_wait(0)
            free_stage(bars, cs, lt, CL)
            promote(acc, part0, 0, BN // 8)  # (acc zeroed after that epilogue)
            kb = 1
        else:
            zero(acc, BN)
    elif PROMOTE > 0:
        zero(acc, BN)
    ps = i32(0)  # the stage of the slice before
    for kt in range(kb, k_tiles):
        s = st
        kaio.mbarrier_wait(bars, (0, s), ph)
        if PROMOTE == 4:  # warpgroup 1 issues after 0, 0 after 1 (the slice before)
            if wg == 1 or g > 0:
                kaio.mbarrier_wait(turn, wg, u32((g + i32(wg) + 1) & 1))
            kaio.wgmma_fence()
            wgmma_slice(part0, sa, sb, s, wg, True, 0, KIND, ACC, nb)
            kaio.wgmma_commit()
            if lt % 32 == 0:
                kaio.mbarrier_arrive(turn, 1 - wg)
            kaio.wgmma_wait(0)
            free_stage(bars, s, lt, CL)
            promote(acc, part0, 0, BN // 8)
        elif PROMOTE == 3:
            for half in kaio.static_range(2):
                kaio.wgmma_fence()
                wgmma_slice(part0, sa, sb, s, wg, True, half * BN // 2, KIND, ACC, nb)
                kaio.wgmma_commit()
                kaio.wgmma_wait(0)
                promote(acc, part0, half * BN // 16, BN // 16)
            free_stage(bars, s, lt, CL)
        elif PROMOTE == 1 or PROMOTE == 7:
            kaio.wgmma_fence()
            wgmma_slice(part0, sa, sb, s, wg, True, 0, KIND, ACC, nb)
            kaio.wgmma_commit()
            kaio.wgmma_wait(0)
            free_stage(bars, s, lt, CL)
            promote(acc, part0, 0, BN // 8)
        else:  # one group kept in flight: the slice before's stage freed (and its sum added)
            kaio.wgmma_fence()
            if PROMOTE == 0:
                wgmma_slice(acc, sa, sb, s, wg, kt == 0, 0, KIND, ACC, nb)
            elif kt % 2 == 0:
                wgmma_slice(part0, sa, sb, s, wg, True, 0, KIND, ACC, nb)
            else:
                wgmma_slice(part1, sa, sb, s, wg, True, 0, KIND, ACC, nb)
            kaio.wgmma_commit()
            kaio.wgmma_wait(1)
            if kt > 0:
                free_stage(bars, ps, lt, CL)
                if PROMOTE == 2:  # the slice before's sum
                    promote_either(acc, part0, part1, kt % 2 == 1, BN // 8)
        ps = s
        st, ph = next_stage(st, ph, STAGES)
        g += 1
    if PROMOTE == 0 or PROMOTE == 2:
        kaio.wgmma_wait(0)
        free_stage(bars, ps, lt, CL)
        if PROMOTE == 2:  # the last slice's sum
            promote_either(acc, part0, part1, k_tiles % 2 == 1, BN // 8)
    return st, ph, g


@kaio.gpu_func
def consume_every(
    acc: ACC[:, :, :], part: ACC[:, :, :], sa: f16[:, :, :], sb: f16[:, :, :],
    bars: u64[:, :], st: i32, ph: u32, g: i32, k_tiles: i32, wg: u32, lt: u32,
    BN: kaio.constexpr, STAGES: kaio.constexpr, EVERY: kaio.constexpr,
    STAGGER: kaio.constexpr, KIND: kaio.constexpr, ACC: kaio.constexpr, CL: kaio.constexpr,
):  # fmt: skip
    """``consume`` with ``PROMOTE >= 10`` (module docstring): one wgmma sum ``part`` over
    ``EVERY`` K slices (a group of wgmmas a slice, one kept in flight: the slice before's
    stage freed once the next group is issued), waited for and added to the zeroed ``acc``
    at the last slice of each interval (and of the tile). ``STAGGER``: warpgroup 1's
    intervals start half an interval later than warpgroup 0's, so that the two do not wait
    for their sums at the same time. Returns the ring position as ``consume``."""
    pend = i32(0)  # whether the stage of the slice before (ps) is still to be freed
    ps = i32(0)
    for kt in range(k_tiles):
        s = st
        kaio.mbarrier_wait(bars, (0, s), ph)
        q = kt  # the slice's place in the intervals
        if STAGGER:
            q = kt + i32(wg) * (EVERY // 2)
        kaio.wgmma_fence()
        wgmma_slice(part, sa, sb, s, wg, kt == 0 or q % EVERY == 0, 0, KIND, ACC)
        kaio.wgmma_commit()
        if q % EVERY == EVERY - 1 or kt == k_tiles - 1:  # the interval's sum is complete
            kaio.wgmma_wait(0)
            if pend:
                free_stage(bars, ps, lt, CL)
            free_stage(bars, s, lt, CL)
            promote(acc, part, 0, BN // 8)
            pend = i32(0)
        else:
            kaio.wgmma_wait(1)
            if pend:
                free_stage(bars, ps, lt, CL)
            pend = i32(1)
        ps = s
        st, ph = next_stage(st, ph, STAGES)
        g += 1
    kaio.wgmma_wait(0)  # (the last slice waited already: for ptxas, which cannot tell)
    return st, ph, g


@kaio.gpu_func
def consume_pair(
    acc: ACC[:, :, :], p0: ACC[:, :, :], p1: ACC[:, :, :], sa: f16[:, :, :],
    sb: f16[:, :, :], bars: u64[:, :], st: i32, ph: u32, g: i32, k_tiles: i32, wg: u32,
    lt: u32, BN: kaio.constexpr, STAGES: kaio.constexpr, HALF: kaio.constexpr,
    KIND: kaio.constexpr, ACC: kaio.constexpr, CL: kaio.constexpr,
):  # fmt: skip
    """``consume`` with two sums in turn and one group of wgmmas kept in flight, each sum
    added to ``acc`` while the other's group runs (promoted every slice, as ``PROMOTE = 1``,
    without waiting for the last group). ``HALF`` (``PROMOTE = 5``, module docstring): each
    K slice multiplied as two halves of the columns, ``p0`` the first, ``p1`` the second;
    else (``PROMOTE = 6``, as 2) the slices in turn into the full-width ``p0`` and ``p1``.
    Returns the ring position as ``consume``."""
    ps = i32(0)  # the stage of the slice before
    s = i32(0)
    for h in range((1 + HALF) * k_tiles):  # half h % 2 of slice h // 2, or slice h
        if h % 2 == 0 or not HALF:
            s = st
            kaio.mbarrier_wait(bars, (0, s), ph)
        kaio.wgmma_fence()
        if h % 2 == 0:
            wgmma_slice(p0, sa, sb, s, wg, True, 0, KIND, ACC)
        else:
            wgmma_slice(p1, sa, sb, s, wg, True, HALF * BN // 2, KIND, ACC)
        kaio.wgmma_commit()
        kaio.wgmma_wait(1)  # the group before
        if h % 2 == 0:
            if h > 0:  # the group before: the second half (its stage read), or a slice
                free_stage(bars, ps, lt, CL)
                promote(acc, p1, HALF * BN // 16, BN // (8 + 8 * HALF))
        else:
            if not HALF:
                free_stage(bars, ps, lt, CL)
            promote(acc, p0, 0, BN // (8 + 8 * HALF))
        if h % 2 == 1 or not HALF:  # the slice issued
            ps = s
            st, ph = next_stage(st, ph, STAGES)
            g += 1
    kaio.wgmma_wait(0)
    if k_tiles > 0:
        free_stage(bars, ps, lt, CL)
        if HALF or k_tiles % 2 == 0:
            promote(acc, p1, HALF * BN // 16, BN // (8 + 8 * HALF))
        else:
            promote(acc, p0, 0, BN // 8)
    return st, ph, g


@kaio.gpu_func
def epilogue_fp8(
    acc: f32[:, :, :], out: DT[:, :], ebuf: DT[:, :, :], sa: f32[:], sb: f32[:], pa: f32,
    pb: f32, bias: DT[:], row0: i32, col0: i32, m: i32, n: i32, wg: u32, lt: u32,
    BN: kaio.constexpr, ROW_A: kaio.constexpr, COL_B: kaio.constexpr, BIAS: kaio.constexpr,
    DT: kaio.constexpr, VEC: kaio.constexpr, SWAP: kaio.constexpr,
):  # fmt: skip
    """Store a warpgroup's 64 rows from ``row0`` and BN columns from ``col0`` (thread ``lt``
    holds ``acc``, the m16n8 C fragment of each n8 tile of its warp's 16 rows): first every
    accumulator scaled (and biased) in registers, the scales per tensor (element 0) or per
    row of a / column of b (ROW_A, COL_B) loaded before any store; then 4 adjacent columns
    a store (``VEC`` 1), a pair (0), or (2, 16-bit ``DT``) the warp's 16 rows through its
    shared buffer ``ebuf[warp]``, each row then copied out by one lane's bulk copy
    (``_gemm_hopper.store_shared``: each lane waits until its copy has read the buffer; 3:
    at the warp's next epilogue, the last ones before the block leaves).
    N is a multiple of 16. ``SWAP``: the tile is of C^T (``store_transposed``). ``pa``, ``pb``:
    the per-tensor scales ``sa[0]``, ``sb[0]``, loaded by the caller."""
    if SWAP:
        store_transposed(acc, out, sa, sb, pa, pb, bias, row0, col0, m, n, lt, BN, ROW_A, COL_B,
                         BIAS, DT)  # fmt: skip
    else:
        epilogue_rows(acc, out, ebuf, sa, sb, pa, pb, bias, row0, col0, m, n, wg, lt, BN, ROW_A,
                      COL_B, BIAS, DT, VEC)  # fmt: skip


@kaio.gpu_func
def store_transposed(
    acc: f32[:, :, :], out: DT[:, :], sa: f32[:], sb: f32[:], pa: f32, pb: f32, bias: DT[:],
    row0: i32, col0: i32, nt: i32, mt: i32, lt: u32, BN: kaio.constexpr, ROW_A: kaio.constexpr,
    COL_B: kaio.constexpr, BIAS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``epilogue_fp8`` of a swapped tile (``SWAP``): ``acc`` holds the warpgroup's 64 rows
    of C^T from ``row0`` (columns of C, < ``nt`` = N) and BN columns from ``col0`` (rows of
    C, < ``mt`` = M). Lanes ``l`` and ``l ^ 4`` (C^T rows r and r ^ 1) trade values, so that
    each holds two adjacent columns of one row of C: an even row lane C's row c, columns r,
    r + 1; its partner row c + 1, columns r - 1, r; each pair stored by ``_fp8.store_scaled``
    (the same arithmetic, one rounding). N is a multiple of 16."""
    lane = i32(lt % 32)
    row = row0 + 16 * i32(lt // 32) + lane // 4
    even = (lane // 4) % 2 == 0
    for j in kaio.static_range(BN // 8):
        col = col0 + 8 * j + 2 * (lane % 4)
        for h in kaio.static_range(2):
            give = acc[j, h, 0]
            if even:
                give = acc[j, h, 1]
            got = kaio.shfl_xor(give, 4)
            r = row + 8 * h
            c = col + 1 - i32(even)  # the row of C this lane stores
            s_a = pa
            if ROW_A:
                s_a = sa[kaio.min(c, mt - 1)]
            if even:
                if c < mt and r < nt:
                    store_scaled_by(out, u32(c), u32(r), acc[j, h, 0], got, s_a, pb, sb,
                                    bias, COL_B, BIAS, DT)  # fmt: skip
            elif c < mt and r - 1 < nt:
                store_scaled_by(out, u32(c), u32(r - 1), got, acc[j, h, 1], s_a, pb, sb,
                                bias, COL_B, BIAS, DT)  # fmt: skip


@kaio.gpu_func
def epilogue_rows(
    acc: f32[:, :, :], out: DT[:, :], ebuf: DT[:, :, :], sa: f32[:], sb: f32[:], pa: f32,
    pb: f32, bias: DT[:], row0: i32, col0: i32, m: i32, n: i32, wg: u32, lt: u32,
    BN: kaio.constexpr, ROW_A: kaio.constexpr, COL_B: kaio.constexpr, BIAS: kaio.constexpr,
    DT: kaio.constexpr, VEC: kaio.constexpr, CHECK: kaio.constexpr = 1,
):  # fmt: skip
    """``epilogue_fp8`` of a tile of C (its docstring). ``CHECK`` 0 (``VEC`` 1): the 64 x BN
    block is inside C, stored without a branch (``carry_slice``'s wgmmas stay in flight)."""
    lane = i32(lt % 32)
    row = row0 + 16 * i32(lt // 32) + lane // 4
    s_a = kaio.local(f32, (2,))
    for h in kaio.static_range(2):
        s_a[h] = pa
        if ROW_A:
            s_a[h] = sa[kaio.min(row + 8 * h, m - 1)]
    for j in kaio.static_range(BN // 8):
        col = kaio.min(col0 + 8 * j + 2 * (lane % 4), n - 2)
        for e in kaio.static_range(2):
            s_b = pb
            if COL_B:
                s_b = sb[col + e]
            add = f32(0.0)
            if BIAS:
                add = f32(bias[col + e])
            for h in kaio.static_range(2):
                acc[j, h, e] = acc[j, h, e] * (s_a[h] * s_b)
                if BIAS:
                    acc[j, h, e] += add
    if VEC >= 2:  # through shared memory, a bulk copy a row, as the f16 kernel's (3: the
        # copies waited for at the warp's next epilogue, not this one)
        store_shared(acc, out, ebuf, row0, col0, m, n, wg, lt, BN, DT, VEC == 3)
    elif VEC:  # 4 adjacent columns a store (lanes trade pairs), as the f16 kernel's
        store_rows(acc, out, out, out, row0, col0, m, n, n, 0, 1.0, 1.0, 1.0, lt, BN, DT, CHECK)
    else:
        for h in kaio.static_range(2):
            if row + 8 * h < m:
                for j in kaio.static_range(BN // 8):
                    col = col0 + 8 * j + 2 * (lane % 4)
                    if col < n:
                        pair = kaio.local(DT, (2,))
                        pair[0] = DT(acc[j, h, 0])
                        pair[1] = DT(acc[j, h, 1])
                        kaio.store_vector(out, (row + 8 * h, col), pair)


@kaio.gpu_func
def last_part(
    acc: f32[:, :, :], ws: f32[:, :], cnt: i32[:], cw: i32, at: i32, p: i32, parts: i32,
    lane: i32, ROWS: kaio.constexpr, BN: kaio.constexpr,
) -> bool_:  # fmt: skip
    """Part ``p`` of a K-split tile (``SPLIT`` 3), by one warp: its C fragment (thread rows
    ``at``, ``at + 8`` of ``ws``) stored, the warp's arrival counted at ``cnt[cw]``; the
    last of the ``parts`` arrivals (the others' stores then visible to it) resets the count
    for the next launch and sums the parts in order into ``acc`` (part q's rows ``(q - p) *
    ROWS`` from its own: the bits of ``sum_parts``) and returns True: the warp then stores
    the sums through the epilogue."""
    for h in kaio.static_range(2):
        for j in kaio.static_range(BN // 8):
            pair = kaio.local(f32, (2,))
            pair[0] = acc[j, h, 0]
            pair[1] = acc[j, h, 1]
            kaio.store_vector(ws, (at + 8 * h, 8 * j + 2 * (lane % 4)), pair)
    kaio.threadfence()
    kaio.sync_warp()
    old = i32(0)
    if lane == 0:
        old = i32(kaio.atomic_add(cnt, cw, 1))
    last = kaio.shfl_idx(old, 0) == parts - 1
    if last:
        kaio.threadfence()
        if lane == 0:
            cnt[cw] = 0
        zero(acc, BN)
        for q in range(parts):
            for h in kaio.static_range(2):
                for j in kaio.static_range(BN // 8):
                    got = kaio.local(f32, (2,))
                    kaio.load_vector(got, ws, (at + (q - p) * ROWS + 8 * h, 8 * j + 2 * (lane % 4)))
                    acc[j, h, 0] += got[0]
                    acc[j, h, 1] += got[1]
    return last


@kaio.gpu_func
def consume_tiles(
    acc: f32[:, :, :], part0: f32[:, :, :], part1: f32[:, :, :], sa_s: f16[:, :, :],
    sb_s: f16[:, :, :], bars: u64[:, :], turn: u64[:], red: f32[:, :], out: DT[:, :],
    ebuf: DT[:, :, :], ws: f32[:, :], cnt: i32[:], sa: f32[:], sb: f32[:], bias: DT[:],
    tile0: i32, step: i32, my_tiles: i32,
    k_tiles: i32, tiles_m: i32, tiles_n: i32, full: i32, parts: i32, rank: i32,
    m: i32, n: i32, wg: u32, lt: u32,
    ROWS: kaio.constexpr, BN: kaio.constexpr, STAGES: kaio.constexpr, PROMOTE: kaio.constexpr,
    GROUP: kaio.constexpr, ROW_A: kaio.constexpr, COL_B: kaio.constexpr,
    BIAS: kaio.constexpr, DT: kaio.constexpr, FP8: kaio.constexpr, VEC: kaio.constexpr,
    CL: kaio.constexpr, SPLIT: kaio.constexpr, SWAP: kaio.constexpr, NS: kaio.constexpr,
):  # fmt: skip
    """A consumer warpgroup's tiles: each one's sums (``consume``), then its epilogue (``NS``
    1: of its half of the tile's columns, the 64 rows shared with the other warpgroup; 2:
    warpgroup 0's, of the whole tile, once it added warpgroup 1's sums, of the other K
    slices: ``consume_alternate``, ``add_warpgroup_sums``); with
    ``SPLIT``, its units (``unit_of``: whole tiles below ``full``, then parts of the split
    tiles, whose raw sums go to rows ``slot * ROWS ..`` of ``ws`` for ``sum_parts``; with
    ``SPLIT`` 3, each warp's last arrival of a tile sums them: ``last_part``). The
    per-tensor scales are loaded at each epilogue (loading them once before the first tile
    instead ran 0.3% slower on an H100: docs/performance.md)."""
    st = i32(0)  # the ring position: stage, phase parity, slices so far
    ph = u32(0)
    g = i32(0)
    cs = i32(0)  # PROMOTE 7: the stage of the carried slice, whether one is
    carried = False
    CW = BN // (1 + (NS == 1))  # noqa: N806  (the warpgroup's columns)
    wa = wg * (NS == 0)  # the warpgroup's 64 rows of the stage's A (NS: both the same)
    nb = i32(wg) * CW * (NS == 1)  # and its first B^T row
    for i in range(my_tiles):
        u = tile0 + i * step
        count = k_tiles
        slot = i32(-1)
        tile = u
        if SPLIT > 1:
            tile, kb, ke, slot = unit_of(u, k_tiles, full, parts)
            count = ke - kb
        if NS == 2:  # every other K slice; warpgroup 0 adds 1's sums and stores the tile
            st, ph, g = consume_alternate(acc, part0, part1, sa_s, sb_s, bars, st, ph, g, count,
                                          wg, lt, CW, STAGES, PROMOTE, FP8, f32, CL)  # fmt: skip
            if not add_warpgroup_sums(acc, red, turn, i, wg, lt, CW):
                continue
        elif PROMOTE == 5 or PROMOTE == 6:  # two sums in turn, one group in flight
            zero(acc, CW)
            st, ph, g = consume_pair(acc, part0, part1, sa_s, sb_s, bars, st, ph, g, count, wg,
                                     lt, CW, STAGES, PROMOTE == 5, FP8, f32, CL)  # fmt: skip
        elif PROMOTE >= 10:  # promoted every PROMOTE // 10 slices
            zero(acc, CW)
            st, ph, g = consume_every(acc, part0, sa_s, sb_s, bars, st, ph, g, count, wg, lt,
                                      CW, STAGES, PROMOTE // 10, PROMOTE % 10, FP8, f32,
                                      CL)  # fmt: skip
        else:
            st, ph, g = consume(acc, part0, part1, sa_s, sb_s, bars, turn, st, ph, g, count, wa,
                                lt, CW, STAGES, PROMOTE, FP8, f32, CL, cs, carried,
                                nb)  # fmt: skip
            carried = False
        tr, tc = tile_origin(tile, tiles_m, tiles_n, BN, GROUP, ROWS * CL)
        row0 = tr + rank * ROWS + 64 * i32(wa)
        col0 = tc + nb
        pa = sa[0]
        pb = sb[0]
        carry = PROMOTE == 7 and VEC == 1 and SPLIT == 1 and SWAP + ROW_A + COL_B + BIAS == 0
        if carry and i + 1 < my_tiles and row0 + 64 <= m and col0 + CW <= n:
            # the next tile's first slice multiplied during this epilogue (no branch in it:
            # ptxas would wait for the wgmmas there)
            cs = st
            st, ph = carry_slice(part0, sa_s, sb_s, bars, st, ph, wg, STAGES, FP8)
            g += 1
            carried = True
            epilogue_rows(acc, out, ebuf, sa, sb, pa, pb, bias, row0, col0, m, n, wg, lt, CW,
                          ROW_A, COL_B, BIAS, DT, VEC, 0)  # fmt: skip
            zero(acc, CW)  # (the carried slice is added to it)
        elif slot >= 0 and SPLIT == 3:  # fused: the warp's last arrival sums and stores
            w = i32(lt // 32)
            cw = (slot // parts) * (4 * ROWS // 64) + i32(wg) * 4 + w  # the warp's counter
            at = slot * ROWS + 64 * i32(wg) + 16 * w + i32(lt % 32) // 4
            if last_part(acc, ws, cnt, cw, at, slot % parts, parts, i32(lt % 32), ROWS, CW):
                epilogue_fp8(acc, out, ebuf, sa, sb, pa, pb, bias, row0, col0, m, n, wg, lt, CW,
                             ROW_A, COL_B, BIAS, DT, VEC, SWAP)  # fmt: skip
        elif slot >= 0:  # a part of a split tile (SPLIT): its raw sums, BN columns a row
            store_rows(acc, ws, ws, ws, slot * ROWS + 64 * i32(wg), 0, (slot + 1) * ROWS, CW,
                       CW, 0, 1.0, 1.0, 1.0, lt, CW, f32)  # fmt: skip
        else:
            epilogue_fp8(acc, out, ebuf, sa, sb, pa, pb, bias, row0, col0, m, n, wg, lt, CW,
                         ROW_A, COL_B, BIAS, DT, VEC, SWAP)  # fmt: skip
    if VEC >= 2:
        if lt % 32 < 16:
            kaio.bulk_wait(0)  # (the buffer stays until its copies are done)


@kaio.gpu_func
def consume_alternate(
    acc: ACC[:, :, :], part0: ACC[:, :, :], part1: ACC[:, :, :], sa: f16[:, :, :],
    sb: f16[:, :, :], bars: u64[:, :], st: i32, ph: u32, g: i32, k_tiles: i32, wg: u32,
    lt: u32, BN: kaio.constexpr, STAGES: kaio.constexpr, PROMOTE: kaio.constexpr,
    KIND: kaio.constexpr, ACC: kaio.constexpr, CL: kaio.constexpr,
):  # fmt: skip
    """``NS`` 2: warpgroup ``wg``'s sums of a tile's K slices ``wg``, ``wg + 2``, ... (the
    other warpgroup takes the others: two chains of wgmmas a block instead of one) over the
    whole 64 x BN tile into ``acc``, as ``consume``'s ``PROMOTE`` 2 (two slice sums in turn,
    one group of wgmmas in flight) or 1 (one sum, waited for: the registers of two sums,
    for wider tiles; the other warpgroup's wgmmas run meanwhile), each slice's stage freed
    by this warpgroup alone. The ring position after all ``k_tiles`` slices returned, as
    ``consume``."""
    zero(acc, BN)
    i = i32(0)  # the warpgroup's slices so far
    ps = i32(0)  # the stage of its slice before
    for kt in range(k_tiles):
        if kt % 2 == i32(wg):
            if PROMOTE == 1:
                kaio.mbarrier_wait(bars, (0, st), ph)
                kaio.wgmma_fence()
                wgmma_slice(part0, sa, sb, st, 0, True, 0, KIND, ACC)
                kaio.wgmma_commit()
                kaio.wgmma_wait(0)
                free_stage(bars, st, lt, CL)
                promote(acc, part0, 0, BN // 8)
            else:
                s = st
                kaio.mbarrier_wait(bars, (0, s), ph)
                kaio.wgmma_fence()
                if i % 2 == 0:
                    wgmma_slice(part0, sa, sb, s, 0, True, 0, KIND, ACC)
                else:
                    wgmma_slice(part1, sa, sb, s, 0, True, 0, KIND, ACC)
                kaio.wgmma_commit()
                kaio.wgmma_wait(1)
                if i > 0:  # the slice before's stage and sum
                    free_stage(bars, ps, lt, CL)
                    promote_either(acc, part0, part1, i % 2 == 1, BN // 8)
                ps = s
                i += 1
        st, ph = next_stage(st, ph, STAGES)
        g += 1
    if PROMOTE == 2:
        kaio.wgmma_wait(0)
        if i > 0:  # the last slice's
            free_stage(bars, ps, lt, CL)
            promote_either(acc, part0, part1, i % 2 == 1, BN // 8)
    return st, ph, g


@kaio.gpu_func
def add_warpgroup_sums(
    acc: f32[:, :, :], red: f32[:, :], turn: u64[:], i: i32, wg: u32, lt: u32,
    BN: kaio.constexpr,
) -> bool_:  # fmt: skip
    """``NS`` 2, after the warpgroups' sums of their tile number ``i``: warpgroup 1 puts its
    ``acc`` into ``red`` (a thread's values in a column: no bank conflicts), warpgroup 0
    adds them to its own (the even slices' sums plus the odd ones', always in that order)
    and returns True: it stores the tile. ``turn[0]``: the sums are in ``red`` (128
    arrivals a tile); ``turn[1]``: warpgroup 0 has read them, ``red`` is free again."""
    par = u32(i & 1)
    if wg == 1:
        if i > 0:
            kaio.mbarrier_wait(turn, 1, par ^ 1)
        for j in kaio.static_range(BN // 8):
            for h in kaio.static_range(2):
                for e in kaio.static_range(2):
                    red[4 * j + 2 * h + e, lt] = acc[j, h, e]
        kaio.mbarrier_arrive(turn, 0)
    else:
        kaio.mbarrier_wait(turn, 0, par)
        for j in kaio.static_range(BN // 8):
            for h in kaio.static_range(2):
                for e in kaio.static_range(2):
                    acc[j, h, e] += red[4 * j + 2 * h + e, lt]
        kaio.mbarrier_arrive(turn, 1)
    return wg == 0


@kaio.gpu_func
def carry_slice(
    part: f32[:, :, :], sa: f16[:, :, :], sb: f16[:, :, :], bars: u64[:, :], st: i32, ph: u32,
    wg: u32, STAGES: kaio.constexpr, KIND: kaio.constexpr,
):  # fmt: skip
    """``PROMOTE`` 7: the first K slice of the warpgroup's next tile (stage ``st`` of parity
    ``ph``) issued into ``part`` before the epilogue of the tile before, which then runs
    while the tensor cores multiply; ``consume`` waits for it, frees its stage and adds it
    to the zeroed ``acc``. Returns the ring's next (stage, parity)."""
    kaio.mbarrier_wait(bars, (0, st), ph)
    kaio.wgmma_fence()
    wgmma_slice(part, sa, sb, st, wg, True, 0, KIND, f32)
    kaio.wgmma_commit()
    return next_stage(st, ph, STAGES)


@kaio.gpu_kernel
def matmul_fp8_wgmma(
    ta: kaio.tensormap, tb: kaio.tensormap, out: DT[:, :], ws: f32[:, :], cnt: i32[:],
    sa: f32[:], sb: f32[:], bias: DT[:], m: i32, n: i32, k2: i32, full: i32, parts: i32,
    WG: kaio.constexpr, BN: kaio.constexpr,
    STAGES: kaio.constexpr, PROMOTE: kaio.constexpr, GROUP: kaio.constexpr,
    ROW_A: kaio.constexpr, COL_B: kaio.constexpr, BIAS: kaio.constexpr, DT: kaio.constexpr,
    FP8: kaio.constexpr, VEC: kaio.constexpr, CL: kaio.constexpr, SPLIT: kaio.constexpr,
    AR: kaio.constexpr, SWAP: kaio.constexpr, NS: kaio.constexpr, PDL: kaio.constexpr,
):  # fmt: skip
    """out = (A @ B) * sa * sb (+ bias): A [m, K] through ``ta`` and B^T [n, K] through
    ``tb``, both as 16-bit units [rows, k2 = K / 2]; ``64 * WG x BN`` tiles; with ``CL = 2``
    clusters of two blocks, which take pairs of tiles one above the other and share the
    copies of their B slices (multicast). ``AR``: the A rows a copy brings (``a_rows``).
    ``SPLIT`` (one block a cluster): the tiles from ``full`` on split in ``parts`` along K,
    their raw sums in ``ws`` [(tiles - full) * parts * 64 WG, BN] (``unit_of``), added by
    ``sum_parts``, or with ``SPLIT`` 3 by each warp's last arrival (``last_part``, counting
    in ``cnt``). ``SWAP``: the roles swapped (``swap_plan``): ``ta`` maps B^T [n, K] and
    ``tb`` A [m, K], the kernel's ``m`` is N and ``n`` is M, its tiles are of C^T, stored
    transposed (``store_transposed``). ``NS`` (two consumer warpgroups): 64 x BN tiles, the
    warpgroups sharing the rows, each multiplying half the columns (1, ``CW``) or every
    other K slice of the whole tile (2, ``PROMOTE`` 2's or 1's sums: ``consume_alternate``,
    the other warpgroup's sums added through ``red``; no ``setmaxnreg``). ``PDL``: launched
    with programmatic stream serialization, its launch and set-up overlapping the end of
    the kernel before it, every thread waiting for that kernel's writes before any global
    access (``kaio.grid_dependency_wait``)."""
    kaio.launch_bounds(WG * 128 + 128, 1)
    if CL == 2:
        kaio.cluster_dims(2)
    ROWS = 64 * WG - 64 * (WG - 1) * (NS > 0)  # noqa: N806  (compile-time ints, as the
    CW = BN // (1 + (NS == 1))  # noqa: N806  constexprs; NS: two warpgroups share 64 rows)
    # a decode tile's A stages hold only the AR rows copied (a_stage_rows), the ring padded
    # so that the last stage's 64-row wgmma operand stays inside it
    SR = ROWS + (AR - ROWS) * ((ROWS == 64) * (CL == 1) * (AR < 64))  # noqa: N806
    A_BYTES = (STAGES * SR + ROWS - SR) * BK * 2  # noqa: N806
    sa_s = kaio.shared_dynamic(f16, (STAGES + ROWS // SR - 1, SR, BK), 0)
    sb_s = kaio.shared_dynamic(f16, (STAGES, BN, BK), A_BYTES)
    bars = kaio.shared_dynamic(u64, (2, STAGES), A_BYTES + STAGES * BK * BN * 2)
    turn = kaio.shared_dynamic(u64, (2,), A_BYTES + STAGES * (BK * BN * 2 + 16))
    # NS 2: warpgroup 1's sums on their way to warpgroup 0 (add_warpgroup_sums); else a stub
    RED = 1 + (CW // 2 - 1) * (NS == 2)  # noqa: N806  (a thread's values)
    RT = 1 + 127 * (NS == 2)  # noqa: N806  (the threads)
    red = kaio.shared_dynamic(f32, (RED, RT), A_BYTES + STAGES * (BK * BN * 2 + 16) + 16)
    # VEC 2, 3: each consumer warp's 16 rows of C on their way out (rows padded by 16
    # bytes, 32 where BN is an odd multiple of 8: ebuf_row)
    on = VEC >= 2  # (else a stub of 8 values)
    ebuf = kaio.shared_dynamic(
        DT, (1 + (WG * 4 - 1) * on, 1 + 15 * on, 8 + (BN + 8 * (BN % 16 != 0)) * on),
        A_BYTES + STAGES * (BK * BN * 2 + 16) + 16 + 4 * RED * RT * (NS == 2),
    )  # fmt: skip
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    tile0, step, tiles_m, tiles_n, my_tiles, k_tiles, slices = tile_schedule(
        m, n, k2, ROWS * CL, BN, BK
    )
    # the producer's registers to the consumers (not with NS 2: decode tiles, two blocks a
    # multiprocessor)
    NREG = (WG > 1) * (NS != 2)  # noqa: N806
    if PROMOTE == 4 and t == 0:  # turn[w]: warpgroup w may issue (an arrival a warp)
        kaio.mbarrier_init(turn, 0, 4)
        kaio.mbarrier_init(turn, 1, 4)
    if NS == 2 and t == 0:  # add_warpgroup_sums': an arrival a thread
        kaio.mbarrier_init(turn, 0, 128)
        kaio.mbarrier_init(turn, 1, 128)
    rank = i32(0)
    if CL == 2:  # the cluster's pair of tiles: tile0, step and the counts in pairs
        rank = i32(kaio.cluster_rank())
        tile0 = tile0 // 2
        step = step // 2
        my_tiles = (tiles_m * tiles_n - tile0 + step - 1) // step
        slices = my_tiles * k_tiles
    if SPLIT > 1:  # units: the whole tiles, then the parts of the split ones (unit_of)
        units = full + (tiles_m * tiles_n - full) * parts
        my_tiles = (units - tile0 + step - 1) // step
    # "free": lane 0 of each consumer warpgroup (of both blocks; NS 2: of the one that read it)
    init_ring(bars, t, STAGES, (1 + (WG - 1) * (NS != 2)) * CL)
    if CL == 2:
        kaio.cluster_sync()  # the other block's barriers are ready before any copy
    if PDL:  # (no global memory touched above)
        kaio.grid_dependency_wait()
    acc = kaio.local(f32, (CW // 8, 2, 2))  # the tile's f32 sums
    # the slice sums (module docstring): two sets for PROMOTE 2, half the width for 3 and
    # 5 (two halves for 5)
    halves = (PROMOTE == 3) + (PROMOTE == 5)
    part0 = kaio.local(f32, (CW // (8 + 8 * halves), 2, 2))
    wide1 = (CW // 8 - 1) * ((PROMOTE == 2) + (PROMOTE == 6)) + (CW // 16 - 1) * (PROMOTE == 5)
    part1 = kaio.local(f32, (1 + wide1, 2, 2))
    if wg < WG:  # the consumers
        if NREG:  # the registers the producer warpgroup gave up
            kaio.setmaxnreg_inc(CONSUMER_REGS[WG])
        if PROMOTE == 4 and wg == 0:  # turns: a loop in each branch (the simulator's turns)
            consume_tiles(acc, part0, part1, sa_s, sb_s, bars, turn, red, out, ebuf, ws, cnt, sa,
                          sb, bias, tile0, step, my_tiles, k_tiles, tiles_m, tiles_n, full, parts,
                          rank, m, n, wg, lt, ROWS, BN, STAGES, PROMOTE, GROUP, ROW_A, COL_B,
                          BIAS, DT, FP8, VEC, CL, SPLIT, SWAP, NS)  # fmt: skip
        else:
            consume_tiles(acc, part0, part1, sa_s, sb_s, bars, turn, red, out, ebuf, ws, cnt, sa,
                          sb, bias, tile0, step, my_tiles, k_tiles, tiles_m, tiles_n, full, parts,
                          rank, m, n, wg, lt, ROWS, BN, STAGES, PROMOTE, GROUP, ROW_A, COL_B,
                          BIAS, DT, FP8, VEC, CL, SPLIT, SWAP, NS)  # fmt: skip
    else:  # the producer warpgroup: its first thread issues the copies
        if NREG:
            kaio.setmaxnreg_dec(PRODUCER_REGS)
        if lt == 0:
            produce_all(sa_s, sb_s, bars, ta, tb, tile0, my_tiles if SPLIT > 1 else slices,
                        k_tiles, step, tiles_m, tiles_n, full, parts, BN, STAGES, GROUP, ROWS,
                        CL, SPLIT, AR)  # fmt: skip
    if CL == 2:
        kaio.cluster_sync()  # no block leaves while another may still write to it or read it


@kaio.gpu_kernel(block_size=SUM_THREADS)
def sum_parts(
    ws: f32[:, :], out: DT[:, :], sa: f32[:], sb: f32[:], bias: DT[:], m: i32, n: i32,
    full: i32, parts: i32, ROWS: kaio.constexpr, BN: kaio.constexpr, GROUP: kaio.constexpr,
    ROW_A: kaio.constexpr, COL_B: kaio.constexpr, BIAS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The split tiles of ``matmul_fp8_wgmma`` (``ROWS x BN`` tiles from number ``full``
    on): out = (the sum of a tile's ``parts`` raw partial tiles in ``ws``, in order) * sa *
    sb (+ bias), a pair of columns a thread (``_fp8.store_scaled``, the epilogue's
    arithmetic)."""
    idx = i32(kaio.block_idx_x() * SUM_THREADS + kaio.thread_idx_x())
    per = ROWS * (BN // 2)  # pairs a tile
    tiles_m = (m + ROWS - 1) // ROWS
    tiles_n = (n + BN - 1) // BN
    j = idx // per  # the split tile
    if j < tiles_m * tiles_n - full:
        row0, col0 = tile_origin(full + j, tiles_m, tiles_n, BN, GROUP, ROWS)
        r = (idx % per) // (BN // 2)
        c = 2 * (idx % (BN // 2))
        if row0 + r < m and col0 + c < n:
            v = kaio.local(f32, (2,))
            kaio.load_vector(v, ws, (j * parts * ROWS + r, c))
            for p in range(1, parts):
                w = kaio.local(f32, (2,))
                kaio.load_vector(w, ws, ((j * parts + p) * ROWS + r, c))
                v[0] += w[0]
                v[1] += w[1]
            store_scaled(out, u32(row0 + r), u32(col0 + c), v[0], v[1], sa, sb, bias, ROW_A,
                         COL_B, BIAS, DT)  # fmt: skip


def a_stage_rows(wg: int, cl: int, ar: int) -> int:
    """The rows of an A stage of the ring: a decode tile's (64 rows: one warpgroup, or two
    sharing them, ``NS``, passed as ``wg`` 1; no cluster) only the ``ar`` rows its copies
    bring (``a_rows``), else the tile's ``64 * wg``. The wgmma still reads 64 rows from a
    stage: the rows past ``ar`` are the next stages' (or the ring's padding), whose results
    are never stored."""
    return ar if wg == 1 and cl == 1 and ar < 64 else 64 * wg


def ebuf_row(bn: int) -> int:
    """The 16-bit values a row of a consumer warp's epilogue buffer holds (``VEC`` 2, 3):
    the tile's ``bn`` and a pad that keeps the rows' 4-byte stores (8 rows, 4 lanes a row)
    on 32 different banks: 8 values where ``bn`` is a multiple of 16, else 16 (a row of
    ``bn + 8`` would be a multiple of 8 words: two rows on each bank)."""
    return bn + 8 + 8 * (bn % 16 != 0)


def shared_bytes(wg: int, bn: int, stages: int, vec: int = 1, ar: int = 64, ns: int = 0) -> int:
    """The dynamic shared memory of a ``64 * wg x bn`` tile ring of ``stages`` (8-bit
    operands, 128 values of K a stage; A stages of ``a_stage_rows`` rows for ``ar`` A
    rows copied, padded to a last 64-row operand; ``ns``: 64 rows shared by the ``wg``
    warpgroups), its barriers, the two turn barriers and the consumer warps' epilogue
    buffers of 16-bit values (``vec`` 2; else a stub)."""
    rows = 64 if ns else 64 * wg
    sr = a_stage_rows(1 if ns else wg, 1, ar)
    ebuf = wg * 4 * 16 * ebuf_row(bn) * 2 if vec >= 2 else 32  # (a stub: 8 values)
    red = bn * 256 if ns == 2 else 0  # (NS 2: warpgroup 1's sums, 128 threads' bn / 2 f32)
    a_bytes = (stages * sr + rows - sr) * BK * 2
    return a_bytes + stages * (bn * BK * 2 + 16) + 16 + red + ebuf


def stages_for(wg: int, bn: int, most: int = 12, vec: int = 1, ar: int = 64,
               limit: int = SHARED_LIMIT) -> int:  # fmt: skip
    """The ring stages that fit in ``limit`` bytes of shared memory (at most ``most``)
    beside the rest (``shared_bytes``; ``ar``: the A rows a copy brings)."""
    per = shared_bytes(wg, bn, 1, vec, ar) - shared_bytes(wg, bn, 0, vec, ar)
    return max(2, min(most, (limit - shared_bytes(wg, bn, 0, vec, ar)) // per))


def promotion(wg: int, bn: int) -> int:
    """The ``PROMOTE`` mode of a ``64 * wg x bn`` tile (module docstring). One warpgroup:
    one slice sum waited for up to 128 columns (each stage freed as soon as its wgmmas are
    done: on an H100, one call at a time, 1-3% faster than two sums in turn for the swapped
    decode tiles and ``shared_plan``'s halves, fp8 rounds B and C of 2026-11-27,
    docs/performance.md), 128-column halves past that. Two or three:
    two sums in turn where the three accumulators fit in 160 registers, else one sum waited
    for (acc and one sum fit the 240 registers that ``setmaxnreg`` gives two consumer
    warpgroups up to 224 columns: the whole-program JIT spills none of them), halves past
    224."""
    if wg == 1:
        return 3 if bn > 128 else 1
    if bn > 224:
        return 3
    if wg == 2 and 3 * bn // 2 <= 160:
        return 2
    return 1


def plan(wg: int, bn: int, cl: int = 1, split: int = 1) -> tuple:
    """The full plan (WG, BN, STAGES, PROMOTE, VEC, CL, SPLIT) of a tile shape: two consumer
    warpgroups and 128 to 224 columns store C through shared memory by bulk copies drained
    during the next tile (``VEC`` 3, a stage fewer: 2 to 6% faster than ``VEC`` 1 at 4096 and
    8192 rows on an H100 and an H200; at 256 columns, 3 stages, and 64, slower:
    docs/performance.md), the others 4 adjacent columns a store."""
    vec = 3 if wg == 2 and 128 <= bn <= 224 else 1
    return wg, bn, stages_for(wg, bn, vec=vec), promotion(wg, bn), vec, cl, split


# (WG, BN, CL): a tile's work (rows x columns) a unit of time, relative (1: cuBLAS FP8 at
# 8192^3). Measured on an H100 under the whole-program JIT (bench/fp8_plans.py --cases
# sweepwide, 2026-11-26: the median over M >= 1024 of the 8 Llama-3 shapes, the 64-column
# tiles' and 128 x 128's fitted to the M = 128 and 256 cases, where they win; 224 columns
# timed at 4096^3 and 8192^3 only; docs/performance.md). Clusters of two ran slower (0.85
# to 0.95 of the same tile alone), so none is routed.
RATES = {
    (2, 128, 1): 0.90,
    (2, 200, 1): 0.958,  # (fills 8192 columns and 20 waves: fp8 rounds A, B, 2026-11-27)
    (2, 160, 1): 0.934,
    (2, 192, 1): 0.96,
    (2, 208, 1): 0.964,
    (2, 224, 1): 0.95,
    (2, 256, 1): 0.92,
    (2, 64, 1): 0.60,
    (1, 64, 1): 0.50,
}
SPLIT_COST = 1e-6  # seconds a K split adds (the sum_parts launch), besides its workspace
SM_RATE = 1450e12 / 132  # FLOP/s a multiprocessor at rate 1 (cuBLAS FP8 at 8192^3, H100)
WS_RATE = 1e12  # bytes/s of the workspace's round trip (fitted to the same sweep)
HBM_RATE = 3.0e12  # bytes/s an H100 reads and writes (the floor of a memory-bound product)


def estimate(m: int, n: int, k: int, sms: int, wg: int, bn: int, cl: int) -> tuple:
    """(seconds, seconds without the memory floor: the tie-break, split) that ``config``'s
    model gives a ``64 * wg x bn`` tile (``cl`` blocks a cluster) at ``m x n x k``: the
    waves of tiles on the persistent grid (the last wave's tiles split along K where
    ``split_parts`` says so) times a tile's time at its ``RATES`` speed, no less than the
    time to read the operands once (memory-bound products), plus a split's fixed cost and
    its workspace's traffic (splits only for tiles of 128 columns or more: the ones
    measured split), or unsplit where that is less."""
    rows = 64 * wg * cl
    tiles = -(-m // rows) * -(-n // bn)
    slots = sms // cl
    tile_s = 2.0 * rows * bn * k / (RATES[wg, bn, cl] * SM_RATE * cl)
    parts = split_parts(tiles, slots, k // 128) if cl == 1 and bn >= 128 else 1
    tail = tiles % slots if tiles >= slots else tiles
    waves = tiles // slots if tiles >= slots else 0
    floor = (m * k + n * k + 2 * m * n) / HBM_RATE  # the operands read once, C written
    compute = (waves + (tail > 0)) * tile_s
    best = (max(compute, floor), compute, 1)
    if parts > 1:
        extra = SPLIT_COST + tail * parts * rows * bn * 8 / WS_RATE
        compute = (waves + -(-parts * tail // slots) / parts) * tile_s
        best = min(best, (max(compute, floor) + extra, compute + extra, parts))
    return best


# matmul_fp8_wgmma's PDL: 1, programmatic dependent launch (H100, bench/fp8_plans.py --cases
# pdl, pdlsweep, docs/performance.md: its launch and set-up overlap the end of the kernel
# before it, 1 to 1.6 µs a call: 128 x 4096 x 4096 0.86x -> 0.94x of cuBLAS, 4096^3 1.00x
# -> 1.02x, the swapped decode tiles 2% to 18% faster at 1 to 32 rows); 0 forced off (tests)
PDL = 1


SWAP_M = 32  # a's rows up to which the swapped tiles run (swap_config; one row: _fp8_decode)
SWAP_OCC = 2  # swapped blocks a multiprocessor
# the L2 promotion (bytes an L2 miss fetches) of the decode tiles' tensor maps (up to 64 rows;
# not the swapped two-warpgroup tiles): 128 on the faster memory (H200, fp8 rounds A2 and C of
# 2026-11-28, bench/fp8_plans.py --cases h200,h200b: the swapped one-warpgroup tiles at 1 to
# 8 rows 0.95-0.98x -> 1.00-1.01x of cuBLAS at 57344 x 8192, 0.98-1.02x -> 1.04-1.06x at 8192
# x 28672, 0.96-0.97x -> 0.99x at 8192 x 8192; the unswapped 64 x 80 tiles of 10240 x 8192
# 1-2% faster; the swapped two-warpgroup tiles at 4096 columns 1% slower, kept at 256), 256
# on an H100 (main's: not measured there in this pass)
DECODE_L2 = ByMemory(256, 128)


def swap_stages(n: int, k: int, sms: int) -> int:
    """The ring stages of a swapped tile (``swap_config``), as measured on an H100 (bench
    /fp8_plans.py --cases decode, docs/performance.md): 12 for long K (past 8192: 4096 x
    14336 ran 5% slower on 8), 6 where the tiles outnumber the slots at K = 4096 (28672 x
    4096: 2-3% faster than 8), else 8 (6144 x 4096: 3% faster than 12)."""
    if k > 8192:
        return 12
    return 6 if -(-n // 64) > SWAP_OCC * sms and k <= 4096 else 8


def swap_config(m: int, n: int, k: int, sms: int, fast: bool = False) -> tuple | None:
    """The swapped decode plan (``SWAP``, C^T = B^T A^T, as cuBLAS's 64 x 8 tiles): tiles of
    64 weight rows by a's ``m`` rows rounded up to 8. Where the tiles fill at most half the
    multiprocessors once (4096 columns), two consumer warpgroups
    (``swap_alternating_plan``); else one, one slice sum waited for, up to ``SWAP_OCC``
    blocks a multiprocessor, ``swap_stages`` ring stages (at most what fits ``1 /
    SWAP_OCC`` of one). None where the ``n / 64`` tiles would leave some multiprocessors
    with one block and others with two (more tiles than multiprocessors but fewer than the
    slots: 10240 columns): the unswapped tiles were faster there. Measured on an H100
    (bench/fp8_plans.py --cases swap, decode, cold3; docs/performance.md). (A tile's K
    slices over a cluster of two blocks, routed at 4096 x 14336 from 9 to 32 rows before,
    ran 1-3% slower there than two warpgroups, and was removed.) ``fast``: the GPU's memory
    is (``_arrays.fast_memory``): the one-warpgroup tiles' maps promote ``DECODE_L2``'s."""
    tiles = -(-n // 64)
    if sms < tiles <= SWAP_OCC * sms:
        return None
    bn = max(8, -(-m // 8) * 8)
    if 2 * tiles <= sms:
        return swap_alternating_plan(bn)
    most = stages_for(1, bn, 32, limit=(SHARED_LIMIT + 1024) // SWAP_OCC - 1024)
    stages = min(most, swap_stages(n, k, sms))
    l2 = DECODE_L2.on(fast)
    return 1, bn, stages, promotion(1, bn), 1, 1, 1, SWAP_OCC, 0, 1, GROUP_ROWS, 0, l2


def swap_alternating_plan(bn: int) -> tuple:
    """The swapped tile (``swap_config``) of two consumer warpgroups, each multiplying
    every other K slice (``NS`` 2), one block a multiprocessor, 16 ring stages. A swapped
    tile's wgmmas (64 weight rows by 8 to 32 of a's) are short and one warpgroup waits for
    each slice's before the next; two keep twice the wgmmas in flight. Measured on an H100,
    each call between its own events as bench/fp8.py times it (bench/fp8_plans.py --cases
    cold3, cold4; docs/performance.md), against one warpgroup, two blocks a multiprocessor,
    8 stages (9 to 12 and a tile's K over a cluster of two at K = 14336), 1 to 32 rows, two
    rounds: 4096 x 4096 0.88x-0.97x of cuBLAS against 0.87x-0.94x, 4096 x 14336 0.95x-1.07x
    against 0.93x-1.04x. At 6144 and 8192 columns (96 and 128 tiles) within 2% either way.
    One slice sum waited for a warpgroup (``promotion``)."""
    return 2, bn, 16, 1, 1, 1, 1, 1, 0, 1, GROUP_ROWS, 2


NS_M = 128  # a's rows up to which narrow tiles run as shared_plan's (two warpgroups, 64 rows)
ALTERNATE_BN = 96  # the widest 64-row decode tile whose warpgroups multiply every other K
# slice (NS 2) up to 64 rows (alternating_plan; one warpgroup's tile past it)


def alternating_plan(bn: int, most: int = 12) -> tuple:
    """The plan of a 64 x ``bn`` tile multiplied by two consumer warpgroups, each every
    other K slice (``NS`` 2), the deepest ring (at most ``most`` stages) that fits, one
    slice sum waited for (each stage freed as soon as its wgmmas are done: 1-3% faster on
    an H100 than two sums in turn at 64 and 128 rows, fp8 rounds B and C of 2026-11-27,
    docs/performance.md). Measured on an H100 (bench/fp8_plans.py --cases alt,
    docs/performance.md) at 64 rows against one warpgroup's tile: 1-9% faster at all six
    shapes where the tile is at most 96 wide (4096 x 4096 1.14x against 1.05x of cuBLAS),
    1-2% at 10240 x 8192 from 1 to 32 rows."""
    fits = [s for s in range(2, most + 1) if shared_bytes(2, bn, s, 1, 64, 2) <= SHARED_LIMIT]
    return 2, bn, fits[-1], 1, 1, 1, 1, 1, 0, 0, GROUP_ROWS, 2


WIDE_ALTERNATE_M = 256  # a's rows up to which wide_alternating_plan's tiles may run
SHARED_K = 8192  # the K up to which the faster memory takes shared_plan's tiles to 256 rows


def wide_alternating_plan(m: int, n: int, sms: int) -> tuple | None:
    """64 x 128 tiles of two warpgroups on every other K slice (``alternating_plan``)
    from ``NS_M`` to ``WIDE_ALTERNATE_M`` rows where they fill three quarters of one wave
    or more (256 x 4096 x K: 128 tiles), else None. Measured on an H100, each call between
    its own events as bench/fp8.py times it (bench/fp8_plans.py --cases cold,
    docs/performance.md): at 256 rows 0.97x of cuBLAS against 0.91x for 128 x 64 tiles at
    4096 x 4096, 1.02x against 0.93x at 4096 x 14336; at 128 rows (64 tiles) slower."""
    tiles = -(-m // 64) * -(-n // 128)
    if NS_M < m <= WIDE_ALTERNATE_M and 3 * sms <= 4 * tiles <= 4 * sms:
        return alternating_plan(128)
    return None


def shared_plan(m: int, n: int, sms: int) -> tuple:
    """The plan of 64-row tiles whose two consumer warpgroups share the rows (``NS``;
    cuBLAS's kernel at 128 rows runs 64 x 64 tiles on 384 threads), the narrowest multiple
    of 32 columns whose tiles fit one wave, the deepest ring that fits (at most 16 stages),
    one slice sum waited for a warpgroup (``promotion``): each warpgroup multiplies every
    other K slice of the whole tile (``NS`` 2) where it is 64 columns wide, else half the
    columns (1). Measured on an H100 (bench/fp8_plans.py --cases ns, alt;
    docs/performance.md): at 128 rows half the columns each ran 2-3% faster than 64 x 64
    tiles of one warpgroup or 128 x 64 of two at N = 4096, 6144 and 8192; every other K
    slice 6-7% faster again at N = 4096 (K = 4096 and 14336), the same at 6144 (96
    columns)."""
    bn = next(b for b in range(32, 257, 32) if -(-m // 64) * -(-n // b) <= sms or b == 256)
    if bn <= 64:
        return alternating_plan(bn, 16)
    fits = [s for s in range(2, 17) if shared_bytes(2, bn, s, 1, 64, 1) <= SHARED_LIMIT]
    return 2, bn, fits[-1], promotion(1, bn // 2), 1, 1, 1, 1, 0, 0, GROUP_ROWS, 1


def config(m: int, n: int, k: int, sms: int, fast: bool = False) -> tuple:
    """(WG, BN, STAGES, PROMOTE, VEC, CL, SPLIT[, OCC, FUSE, SWAP, GROUP, NS[, L2]]) for an ``m
    x n`` output on ``sms`` multiprocessors. Up to ``SWAP_M`` rows the swapped tiles
    (``swap_config``) where they fit the multiprocessors. Up to 64 rows the weights' bytes are
    the cost: 64-row tiles of 16 to 128 columns (one slice sum waited for; up to
    ``ALTERNATE_BN`` columns two warpgroups on every other K slice: ``alternating_plan``), the
    width that fills the waves of tiles best (each tile costs about 64 columns more than its
    width: 32 columns for N = 4096, 48 for 6144, 112 for 28672). Past that, the tile of
    ``RATES`` whose ``estimate`` is least: its speed times how well its tiles fill the waves,
    the last wave's tiles split along K where that shortens it; up to ``NS_M`` rows, where that
    is two warpgroups' 128 x 64 tile (or past 96 rows one's 64 x 64), ``shared_plan``'s; up to
    ``WIDE_ALTERNATE_M`` rows ``wide_alternating_plan``'s where it fills a wave. Measured on an
    H100 (bench/fp8_plans.py; docs/performance.md). On the faster memory (``fast``:
    ``_arrays.fast_memory``, an H200; measured there) the decode tiles' tensor maps promote
    ``DECODE_L2``'s bytes, and ``shared_plan``'s tiles run where they make one wave: in place of
    128-row tiles up to ``NS_M`` rows, of any tile up to ``WIDE_ALTERNATE_M`` rows at K up to
    ``SHARED_K``."""

    def waves(rows: int, bn: int) -> int:
        return -(-(-(-m // rows) * -(-n // bn)) // sms)

    swapped = swap_config(m, n, k, sms, fast) if m <= SWAP_M else None
    if swapped:
        return swapped
    if m <= 64:
        bn = min(range(16, 129, 16), key=lambda b: (waves(64, b) * (b + 64), -b))
        tile = alternating_plan(bn) if bn <= ALTERNATE_BN else plan(1, bn)
        return promoted(tile, DECODE_L2.fast) if fast else tile
    (*_, split), tile = min((estimate(m, n, k, sms, *tile), tile) for tile in RATES)
    # narrow tiles: two warpgroups on 64 rows (one warpgroup's 64 x 64 only past 96 rows: at
    # 96 it tied or lost on an H100, at 128 it gained 3%); on the faster memory also in place
    # of 128-row tiles where they make one wave, up to NS_M rows and, at K up to SHARED_K, to
    # WIDE_ALTERNATE_M (H200, fp8 rounds A, A2 and C of 2026-11-28: 128 x 10240 x 8192 in 64 x
    # 160 tiles 0.95-0.99x of cuBLAS against 128 x 128's 0.92-0.94x; 256 x 6144 x 4096 in 64 x
    # 192 0.90x against 128 x 128's 0.84x, 256 x 4096 x 4096 in 64 x 128 0.93x against
    # wide_alternating_plan's 0.90-0.91x, which at K = 14336 was 1% faster)
    narrow = tile == (2, 64, 1) or (tile == (1, 64, 1) and m > 96)
    one_wave = fast and shared_plan(m, n, sms)[1] < 256
    if m <= NS_M and (narrow or (one_wave and tile[1] >= 128)):
        return shared_plan(m, n, sms)
    if one_wave and NS_M < m <= WIDE_ALTERNATE_M and k <= SHARED_K:
        return shared_plan(m, n, sms)
    return wide_alternating_plan(m, n, sms) or plan(*tile, split)


PLAN_DEFAULTS = (1, 1, 1, 0, 0, GROUP_ROWS, 0, 256)  # a plan's CL, SPLIT, OCC, FUSE, SWAP,
# GROUP, NS and L2 where it stops short (launch)


def promoted(p: tuple, l2: int) -> tuple:
    """Plan ``p`` (its defaults spelled out) with its tensor maps' L2 promotion ``l2``."""
    return (*p, *PLAN_DEFAULTS[len(p) - 5 :])[:12] + (l2,)


def a_rows(m: int, wg: int, cl: int) -> int:
    """The A rows a copy brings (``AR``): a decode tile's (64 rows: one warpgroup, or two
    sharing them, passed as ``wg`` 1; no cluster) rows rounded up to a power of two from 8
    when M is smaller than its 64, else the tile's."""
    if wg == 1 and cl == 1 and m < 64:
        return max(8, 1 << (m - 1).bit_length())
    return 64 * wg


def split_from(tiles: int, sms: int, parts: int) -> int:
    """The first tile that a K split ``parts`` ways splits (``unit_of``'s ``full``) on a
    persistent grid of at most ``sms`` blocks: every tile when there are fewer tiles than
    blocks; else those of the last, partial wave (none when the tiles fill whole waves, or
    ``parts`` is 1)."""
    if parts == 1:
        return tiles
    if tiles < sms:
        return 0
    return tiles - tiles % sms


def split_parts(tiles: int, sms: int, k_tiles: int, most: int = 4) -> int:
    """The K split (``split_from``) that most shortens a persistent launch of ``tiles``
    equal tiles on ``sms`` blocks, 1 unless it saves a fifth of a tile's time: the split
    tiles' parts run as ``ceil(parts * tail / sms)`` rounds of ``1 / parts`` of a tile (at
    most ``most`` parts, each at least 2 of the ``k_tiles`` K slices)."""
    tail = tiles % sms if tiles >= sms else tiles
    if tail == 0:
        return 1
    options = [(-(-p * tail // sms) / p, p) for p in range(2, min(most, k_tiles // 2) + 1)]
    cost, parts = min(options, default=(1.0, 1))
    return parts if cost <= 0.8 else 1


def launch(a_units, bt_units, out, sa, sb, bias, m: int, n: int, k: int, name: str, dt,
           flags: dict, sms: int, stream, plan: tuple | None = None, *,
           like=None) -> None:  # fmt: skip
    """Run ``matmul_fp8_wgmma`` on a persistent grid of at most ``sms`` blocks. ``a_units`` and
    ``bt_units``: A [m, k] and B^T [n, k] viewed as f16 [rows, k / 2] (for the tensor maps); the
    other arrays as ``_fp8._mm_fp8`` takes them; ``flags``: its ROW_A, COL_B and BIAS; ``plan``:
    (WG, BN, STAGES, PROMOTE, VEC[, CL[, SPLIT[, OCC[, FUSE[, SWAP[, GROUP[, NS[, L2]]]]]]]]),
    default ``config``'s for the GPU of ``like`` (its memory's speed: ``_arrays.fast_memory``);
    CL: 1, or clusters of two tiles one above the other (2); SPLIT > 1 (one block a cluster):
    the tiles of the last partial wave split that many ways along K (``split_from``), their raw
    sums in a workspace made like ``like`` (an ``_arrays.Operand``), added by ``sum_parts``. OCC
    (one block a cluster; default 1): a persistent grid of up to OCC blocks a multiprocessor
    (with a ring of STAGES small enough that OCC blocks' shared memory fits one: more blocks
    streaming the weights at decode sizes). FUSE (with SPLIT > 1): the parts summed in the
    kernel, by each warp's last arrival (``last_part``; counters from ``linear._counters``), not
    by ``sum_parts``. SWAP: C^T = B^T A^T (``swap_plan``): ``64 * WG``-row tiles of the weights,
    BN of a's rows a tile; its K split always summed in the kernel. GROUP: the tile rows a group
    of the tile order spans (``_matmul_hopper.grouped``; ``GROUP_ROWS``). NS: the kernel's (two
    warpgroups on a 64-row tile). L2: the tensor maps' L2 promotion, bytes (default 256)."""
    from kaio_ops.linear import _counters, _placeholder

    wg, bn, stages, promote_mode, vec, *rest = plan or config(
        m, n, k, sms, _arrays.fast_memory(like)
    )
    cl, split, occ, fuse, swap, group, ns, l2 = (*rest, *PLAN_DEFAULTS[len(rest) :])[:8]
    if (split > 1 or occ > 1) and cl > 1:
        raise ValueError(
            f"matmul_fp8: plan {plan}: a K split or OCC > 1 needs CL = 1 (one block a tile)"
        )
    if swap:  # C^T = B^T A^T: the weights are the 64-row operand, the rows of a the columns
        a_units, bt_units, m, n = bt_units, a_units, n, m
        fuse, vec = 1, 1  # (sum_parts and the shared epilogue store tiles of C, not C^T)
    rows = 64 if ns else 64 * wg  # (NS: the warpgroups share the rows, each half the columns)
    ar = a_rows(m, 1 if ns else wg, cl)
    ta = kaio.tensor_map_2d(a_units, (ar, BK), SW, l2)
    tb = kaio.tensor_map_2d(bt_units, (bn // cl, BK), SW, l2)
    constexprs = dict(
        WG=wg, BN=bn, STAGES=stages, PROMOTE=promote_mode, GROUP=group, **flags, DT=dt,
        FP8=FP8_TYPES[name], VEC=vec, CL=cl, SPLIT=min(split, 2) + (split > 1 and fuse), AR=ar,
        SWAP=int(bool(swap)), NS=ns, PDL=PDL,
    )  # fmt: skip
    if vec >= 2 and dt.itemsize != 2:
        vec = 1  # (the shared buffers hold 16-bit outputs)
        constexprs["VEC"] = 1
        if plan is None:  # config's: the ring takes the buffers' room
            stages = constexprs["STAGES"] = stages_for(wg, bn)
    threads, shared = wg * 128 + 128, shared_bytes(wg, bn, stages, vec, ar, ns)
    tiles = -(-m // (rows * cl)) * -(-n // bn)
    if swap and constexprs["PDL"]:  # (the next kernel's blocks placed beside this one's)
        shared = max(shared, exclusive_shared(1 if tiles <= sms else occ))
    full = split_from(tiles, sms * occ, split)
    units = full + (tiles - full) * split
    if cl == 1:
        grid = min(sms * occ, units)
    else:
        grid = 2 * min(tiles, _clusters(threads, shared, constexprs))
    if full < tiles:
        ws = _arrays.output(like, ((tiles - full) * split * rows, bn), f32)
    else:
        ws = _placeholder(like, f32, 2)
    fused = full < tiles and constexprs["SPLIT"] == 3
    cnt = _counters(like, (tiles - full) * 4 * wg) if fused else _placeholder(like, i32, 1)
    matmul_fp8_wgmma[grid, threads, stream, shared](
        ta, tb, out, ws, cnt, sa, sb, bias, m, n, k // 2, full, split, **constexprs
    )
    if full < tiles and not fused:
        pairs = (tiles - full) * rows * bn // 2
        sum_parts[-(-pairs // SUM_THREADS), SUM_THREADS, stream](
            ws, out, sa, sb, bias, m, n, full, split, ROWS=rows, BN=bn, GROUP=group,
            **flags, DT=dt,
        )  # fmt: skip


SM_SHARED = 228 * 1024  # shared memory a multiprocessor (H100, H200), 1 KB a block reserved


def exclusive_shared(blocks: int) -> int:
    """The dynamic shared memory that lets at most ``blocks`` blocks share a multiprocessor:
    with programmatic dependent launch, the next kernel's blocks are placed while this
    one's run, and would otherwise crowd two or three small decode blocks onto some
    multiprocessors (H100, bench/fp8_plans.py --cases pdlsweep: unpadded, 8 x 4096 x 4096
    ran at 0.42x of cuBLAS and 32 x 28672 x 4096 at 0.82x, padded at 1.06x and 1.04x)."""
    return SM_SHARED // (blocks + 1) - 1024 + 16


_CLUSTERS: dict = {}


def _clusters(threads: int, shared: int, constexprs: dict) -> int:
    """How many clusters of two of this configuration run at once (asked once)."""
    from kaio.sim.mode import active as simulating

    if simulating():
        return 1
    key = (threads, shared, tuple(sorted((k, str(v)) for k, v in constexprs.items())))
    if key not in _CLUSTERS:
        _CLUSTERS[key] = max(1, matmul_fp8_wgmma.max_active_clusters(threads, shared, **constexprs))
    return _CLUSTERS[key]


# (WG, BN) tile shapes for the PTX checks (the decode widths config picks among them)
PLANS = [(2, 128), (2, 64), (1, 64), (1, 128), (1, 256), (3, 128), (2, 96), (1, 32), (1, 112),
         (2, 160), (2, 192), (2, 208), (2, 224), (2, 256), (2, 200)]  # fmt: skip


def specializations():
    """(kernel, constexprs) of the specializations ``launch`` uses (a spread for PTX checks:
    every tile shape, and across them every fp8 type, output type and flag)."""
    from kaio import bf16

    combos = [(nm, d) for nm in FP8_TYPES for d in (bf16, f16, f32)]
    for i, (wg, bn) in enumerate(PLANS):
        name, dt = combos[i % len(combos)]
        flags = {"ROW_A": i % 2, "COL_B": (i // 2) % 2, "BIAS": (i + 1) // 3 % 2}
        w, b, stages, promote_mode, vec, cl, _ = plan(wg, bn)
        vec = vec if dt.itemsize == 2 else 1  # (as launch: 16-bit outputs through shared)
        tile = {"WG": w, "BN": b, "STAGES": stages, "PROMOTE": promote_mode}
        yield matmul_fp8_wgmma, {**tile, "GROUP": GROUP_ROWS, **flags, "DT": dt,
                                 "FP8": FP8_TYPES[name], "VEC": vec, "CL": cl,
                                 "SPLIT": 2 if wg == 1 and bn == 64 else 1,
                                 "AR": {128: 16, 32: 8}.get(bn, 64) if wg == 1
                                 else 64 * wg, "SWAP": 0, "NS": 0, "PDL": i % 2}  # fmt: skip
    shared_c = {"WG": 2, "BN": 208, "STAGES": stages_for(2, 208, vec=2), "PROMOTE": 1,
                "GROUP": GROUP_ROWS, "ROW_A": 0, "COL_B": 1, "BIAS": 1, "DT": bf16,
                "FP8": e4m3, "VEC": 2, "CL": 1, "SPLIT": 1, "AR": 128, "SWAP": 0,
                "NS": 0, "PDL": 1}  # fmt: skip
    yield matmul_fp8_wgmma, shared_c  # (C through shared memory)
    yield (
        matmul_fp8_wgmma,
        {**shared_c, "WG": 1, "BN": 32, "STAGES": 20, "PROMOTE": 2, "VEC": 1, "SPLIT": 3, "AR": 8},
    )  # (the K split summed in kernel)
    yield (
        matmul_fp8_wgmma,
        {**shared_c, "WG": 1, "BN": 8, "STAGES": 25, "PROMOTE": 2, "VEC": 1, "SPLIT": 3,
         "AR": 64, "SWAP": 1, "FP8": e5m2, "DT": f16, "PDL": 0},
    )  # (swapped: C^T = B^T A^T, stored transposed)  # fmt: skip
    yield (
        matmul_fp8_wgmma,
        {**shared_c, "VEC": 1, "PROMOTE": 7, "COL_B": 0, "BIAS": 0, "STAGES": stages_for(2, 208)},
    )  # (the next tile's first slice carried over the epilogue)
    yield (
        matmul_fp8_wgmma,
        {**shared_c, "BN": 96, "STAGES": 11, "PROMOTE": 2, "VEC": 1, "AR": 64, "NS": 1},
    )  # fmt: skip  (two warpgroups on 64 rows)
    alternate = {"BN": 16, "STAGES": 8, "PROMOTE": 2, "VEC": 1, "AR": 64, "SWAP": 1, "NS": 2}
    # (two warpgroups on every other K slice of a swapped tile)
    yield matmul_fp8_wgmma, {**shared_c, **alternate, "COL_B": 0, "PDL": 0}
    yield sum_parts, {"ROWS": 64, "BN": 64, "GROUP": GROUP_ROWS, "ROW_A": 1, "COL_B": 0,
                      "BIAS": 1, "DT": bf16}  # fmt: skip
