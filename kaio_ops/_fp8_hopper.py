"""The Hopper (sm_90a) FP8 matmul: ``kaio_ops._matmul_hopper``'s design (a persistent grid,
TMA into a ring of 128-byte-swizzled shared stages, two consumer warpgroups on ``wgmma``, a
producer warp, full/empty mbarriers per stage; see that module's docstring) with 8-bit
operands: ``wgmma.mma_async.m64n{BN}k32`` with e4m3 or e5m2 A and B.

Accumulation is promoted, as CUTLASS's default FP8 GEMMs and ``torch._scaled_mm`` (without
``use_fast_accum``) do: Hopper's fp8 wgmma keeps its running sum with fewer bits than f32
(measured on an H200: K = 8192 sums of quantized normal data off by up to ~0.5% of the
largest output, where small-integer data is exact), so each 128-deep K slice (four k32
wgmmas) starts a fresh wgmma sum ``part`` that is then added to the f32 ``acc`` of the tile.
The wgmmas of a slice are waited for (``wgmma_wait(0)``) before the add; the other consumer
warpgroup keeps the tensor cores busy meanwhile. The simulator's wgmma sums in f32 (the
documented result, not the hardware's rounding), so it cannot tell the two apart.

PTX has no transposed 8-bit wgmma, so both operands are K-major: A [M, K] and B's transpose
[N, K] (what a column-major B, ``torch._scaled_mm``'s layout, already is). The shared tiles
and the TMA copies do not care about the element type: they are written for 16-bit units
(pairs of fp8 values, the arrays viewed as f16 [rows, K / 2]), so a stage holds 64 units =
128 fp8 values of K, four k32 wgmmas, and both operands use A's descriptor (K-major, SBO 1024).
The epilogue is ``kaio_ops._fp8.store_scaled`` per pair of adjacent columns (one 4- or
8-byte store): ``acc * scale_a * scale_b (+ bias)`` rounded once.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import e4m3, f16, f32, i32, u32, u64
from kaio_ops._fp8 import FP8_TYPES, store_scaled
from kaio_ops._matmul_hopper import (
    A_STAGE_BYTES,
    BK,
    BM,
    CONSUMERS,
    GROUP_ROWS,
    SW,
    THREADS,
    init_ring,
    next_slice,
    place,
    shared_bytes,
    tile_schedule,
)

__all__ = ["launch", "specializations"]


@kaio.gpu_func
def produce_fp8(
    sa: f16[:, :, :], sb: f16[:, :, :], bars: u64[:, :], ta: kaio.tensormap, tb: kaio.tensormap,
    at: i32[:], s: i32, k_tiles: i32, step: i32, tiles_m: i32, tiles_n: i32,
    BN: kaio.constexpr, GROUP: kaio.constexpr,
):  # fmt: skip
    """The TMA copies of the producer's next K slice (A rows, B^T rows) into stage ``s``,
    then the producer's position ``at`` stepped (as ``_matmul_hopper.produce``)."""
    k0 = at[0] * BK
    kaio.mbarrier_arrive_expect_tx(bars, (0, s), u32(A_STAGE_BYTES + BK * BN * 2))
    kaio.tma_load_2d(sa, (s, 0, 0), ta, at[2], k0, bars, (0, s))
    kaio.tma_load_2d(sb, (s, 0, 0), tb, at[3], k0, bars, (0, s))
    next_slice(at, k_tiles, step, tiles_m, tiles_n, BN, GROUP)


@kaio.gpu_func
def produce_all(
    sa: f16[:, :, :], sb: f16[:, :, :], bars: u64[:, :], ta: kaio.tensormap, tb: kaio.tensormap,
    tile0: i32, slices: i32, k_tiles: i32, step: i32, tiles_m: i32, tiles_n: i32,
    BN: kaio.constexpr, STAGES: kaio.constexpr, GROUP: kaio.constexpr,
):  # fmt: skip
    """The producer's loop: every K slice of the block's tiles (from tile ``tile0``, ``step``
    apart) through ``produce_fp8``, each stage reused once the consumers freed it (8-bit
    operands, A and B^T K-major: also ``kaio_ops._int8_hopper``'s)."""
    at = kaio.local(i32, (4,))
    at[0] = 0
    at[1] = tile0
    place(at, tiles_m, tiles_n, BN, GROUP)
    s = i32(0)
    ph = u32(0)
    for g in range(slices):
        if g >= STAGES:
            kaio.mbarrier_wait(bars, (1, s), ph ^ 1)
        produce_fp8(sa, sb, bars, ta, tb, at, s, k_tiles, step, tiles_m, tiles_n, BN, GROUP)
        s += 1
        if s == STAGES:
            s = 0
            ph ^= 1


@kaio.gpu_func
def epilogue_fp8(
    acc: f32[:, :, :], out: DT[:, :], sa: f32[:], sb: f32[:], bias: DT[:], tile: i32,
    tiles_m: i32, tiles_n: i32, m: i32, n: i32, wg: u32, lt: u32, BN: kaio.constexpr,
    GROUP: kaio.constexpr, ROW_A: kaio.constexpr, COL_B: kaio.constexpr,
    BIAS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """Store warpgroup ``wg``'s 64 rows of tile number ``tile`` (thread ``lt`` holds ``acc``,
    the m16n8 C fragment of each n8 tile of its warp's 16 rows)."""
    here = kaio.local(i32, (4,))
    here[1] = tile
    place(here, tiles_m, tiles_n, BN, GROUP)
    lane = i32(lt % 32)
    row0 = here[2] + 64 * i32(wg) + 16 * i32(lt // 32) + lane // 4
    for h in kaio.static_range(2):
        row = row0 + 8 * h
        if row < m:
            for j in kaio.static_range(BN // 8):
                col = here[3] + 8 * j + 2 * (lane % 4)
                if col < n:
                    store_scaled(out, u32(row), u32(col), acc[j, h, 0], acc[j, h, 1], sa, sb,
                                 bias, ROW_A, COL_B, BIAS, DT)  # fmt: skip


@kaio.gpu_kernel(block_size=THREADS)
def matmul_fp8_wgmma(
    ta: kaio.tensormap, tb: kaio.tensormap, out: DT[:, :], sa: f32[:], sb: f32[:],
    bias: DT[:], m: i32, n: i32, k2: i32, BN: kaio.constexpr, STAGES: kaio.constexpr,
    GROUP: kaio.constexpr, ROW_A: kaio.constexpr, COL_B: kaio.constexpr,
    BIAS: kaio.constexpr, DT: kaio.constexpr, FP8: kaio.constexpr,
):  # fmt: skip
    """out = (A @ B) * sa * sb (+ bias): A [m, K] through ``ta`` and B^T [n, K] through
    ``tb``, both as 16-bit units [rows, k2 = K / 2]."""
    kaio.launch_bounds(THREADS, 1)
    sa_s = kaio.shared_dynamic(f16, (STAGES, BM, BK), 0)
    sb_s = kaio.shared_dynamic(f16, (STAGES, BN, BK), STAGES * A_STAGE_BYTES)
    bars = kaio.shared_dynamic(u64, (2, STAGES), STAGES * (A_STAGE_BYTES + BK * BN * 2))
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    tile0, step, tiles_m, tiles_n, my_tiles, k_tiles, slices = tile_schedule(m, n, k2, BM, BN, BK)
    init_ring(bars, t, STAGES, 2)  # "free": lane 0 of each consumer warpgroup
    part = kaio.local(f32, (BN // 8, 2, 2))  # one K slice's wgmma sums
    acc = kaio.local(f32, (BN // 8, 2, 2))  # the tile's f32 sums of the slices
    s = i32(0)
    ph = u32(0)
    if wg < 2:  # the consumers
        for i in range(my_tiles):
            for j in kaio.static_range(BN // 8):
                for h in kaio.static_range(2):
                    for e in kaio.static_range(2):
                        acc[j, h, e] = 0.0
            for _kt in range(k_tiles):
                kaio.mbarrier_wait(bars, (0, s), ph)
                kaio.wgmma_fence()
                for kk in kaio.static_range(BK // 16):
                    da = kaio.smem_descriptor(sa_s, (s, 64 * wg, kk * 16), SW, 16, 1024)
                    db = kaio.smem_descriptor(sb_s, (s, 0, kk * 16), SW, 16, 1024)
                    if FP8 == e4m3:
                        kaio.wgmma_e4m3(part, da, db, kk > 0)
                    else:
                        kaio.wgmma_e5m2(part, da, db, kk > 0)
                kaio.wgmma_commit()
                kaio.wgmma_wait(0)
                if lt == 0:
                    kaio.mbarrier_arrive(bars, (1, s))
                for j in kaio.static_range(BN // 8):  # promote: the f32 sum (see above)
                    for h in kaio.static_range(2):
                        for e in kaio.static_range(2):
                            acc[j, h, e] += part[j, h, e]
                s += 1
                if s == STAGES:
                    s = 0
                    ph ^= 1
            epilogue_fp8(acc, out, sa, sb, bias, tile0 + i * step, tiles_m, tiles_n, m, n, wg,
                         lt, BN, GROUP, ROW_A, COL_B, BIAS, DT)  # fmt: skip
    elif t == CONSUMERS:  # the producer
        produce_all(sa_s, sb_s, bars, ta, tb, tile0, slices, k_tiles, step, tiles_m, tiles_n, BN,
                    STAGES, GROUP)  # fmt: skip


def tiles(m: int, n: int, sms: int) -> tuple[int, int]:
    """(BN, STAGES): 128 x 128 tiles always: the promoted accumulation keeps two
    accumulators (``part`` and ``acc``), 128 registers a thread at BN 128 (256 at BN 256
    would spill)."""
    return 128, 5


def launch(a_units, bt_units, out, sa, sb, bias, m: int, n: int, k: int, name: str, dt,
           flags: dict, sms: int, stream) -> None:  # fmt: skip
    """Run ``matmul_fp8_wgmma`` on a persistent grid of at most ``sms`` blocks. ``a_units``
    and ``bt_units``: A [m, k] and B^T [n, k] viewed as f16 [rows, k / 2] (for the tensor
    maps); the other arrays as ``_fp8._mm_fp8`` takes them; ``flags``: its ROW_A, COL_B and
    BIAS."""
    bn, stages = tiles(m, n, sms)
    ta = kaio.tensor_map_2d(a_units, (BM, BK), SW)
    tb = kaio.tensor_map_2d(bt_units, (bn, BK), SW)
    grid = min(sms, -(-m // BM) * -(-n // bn))
    matmul_fp8_wgmma[grid, THREADS, stream, shared_bytes(bn, stages)](
        ta, tb, out, sa, sb, bias, m, n, k // 2, BN=bn, STAGES=stages, GROUP=GROUP_ROWS, **flags,
        DT=dt, FP8=FP8_TYPES[name],
    )  # fmt: skip


def specializations():
    """(kernel, constexprs) of the specializations ``launch`` uses (a spread for PTX checks:
    every fp8 type, output type, tile width and flag)."""
    from kaio import bf16

    for i, (name, dt) in enumerate((n, d) for n in FP8_TYPES for d in (bf16, f16, f32)):
        flags = {"ROW_A": i % 2, "COL_B": (i // 2) % 2, "BIAS": (i // 4) % 2}
        tile = {"BN": 128, "STAGES": 5, "GROUP": GROUP_ROWS}
        yield matmul_fp8_wgmma, {**tile, **flags, "DT": dt, "FP8": FP8_TYPES[name]}
