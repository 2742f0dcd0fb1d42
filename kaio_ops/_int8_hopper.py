"""W8A8 on Hopper (sm_90a): ``matmul_int8``'s ``f32(a @ b) * scale`` for int8 ``a`` [M, K]
and ``b`` [K, N] on ``wgmma.mma_async.m64n{BN}k32.s32.s8.s8``: exact s32 sums (K < 2**17),
the same bits as the ``mma.sync`` kernel and as NumPy's integer product.

The design is ``kaio_ops._fp8_hopper``'s (``kaio_ops._matmul_hopper``'s persistent grid, TMA
into a ring of 128-byte-swizzled shared stages, two consumer warpgroups, a producer warp,
full/free mbarriers per stage; its producer loop, ``produce_all``, is reused as it is): PTX has no
transposed 8-bit wgmma, so both operands are K-major, A [M, K] and B's transpose [N, K]
(``matmul_int8`` transposes B first, as for its other kernel), and the tiles, TMA boxes and
descriptors are written for 16-bit units (pairs of int8 values, the arrays viewed as f16
[rows, K / 2]): a stage holds 128 values of K, four k32 wgmmas. The s32 accumulators need no
promotion (integer sums are exact), so a consumer keeps one group of wgmmas in flight and
frees a stage when the group after it is issued. The epilogue stores ``f32(acc) * scale``.
"""

from __future__ import annotations

import kaio
from kaio import f16, f32, i32, u32, u64
from kaio.types import i8
from kaio_ops._fp8_hopper import consume, produce_all
from kaio_ops._matmul_hopper import (
    A_STAGE_BYTES,
    BK,
    BM,
    CONSUMERS,
    GROUP_ROWS,
    SW,
    THREADS,
    init_ring,
    shared_bytes,
    tile_origin,
    tile_schedule,
)

__all__ = ["eligible", "launch", "specializations", "takes"]

SHARED_LIMIT = 227 * 1024


@kaio.gpu_func
def store_int8(
    acc: i32[:, :, :], out: f32[:, :], alpha: f32, tile: i32, tiles_m: i32, tiles_n: i32, m: i32,
    n: i32, wg: u32, lt: u32, BN: kaio.constexpr, GROUP: kaio.constexpr,
):  # fmt: skip
    """Store ``f32(acc) * alpha`` for warpgroup ``wg``'s 64 rows of tile number ``tile``
    (thread ``lt`` holds the m16n8 C fragment of each n8 tile of its warp's 16 rows): a
    pair of adjacent columns a store when N is even."""
    tr, col0 = tile_origin(tile, tiles_m, tiles_n, BN, GROUP, BM)
    lane = i32(lt % 32)
    row0 = tr + 64 * i32(wg) + 16 * i32(lt // 32) + lane // 4
    for h in kaio.static_range(2):
        row = row0 + 8 * h
        if row < m:
            for j in kaio.static_range(BN // 8):
                col = col0 + 8 * j + 2 * (lane % 4)
                pair = kaio.local(f32, 2)
                pair[0] = f32(acc[j, h, 0]) * alpha
                pair[1] = f32(acc[j, h, 1]) * alpha
                if n % 2 == 0 and col < n:
                    kaio.store_vector(out, (row, col), pair)
                elif col < n:
                    out[row, col] = pair[0]
                    if col + 1 < n:
                        out[row, col + 1] = pair[1]


@kaio.gpu_kernel(block_size=THREADS)
def matmul_int8_wgmma(
    ta: kaio.tensormap, tb: kaio.tensormap, out: f32[:, :], alpha: f32, m: i32, n: i32, k2: i32,
    BN: kaio.constexpr, STAGES: kaio.constexpr, GROUP: kaio.constexpr,
):  # fmt: skip
    """out = f32(A @ B) * alpha: A [m, K] through ``ta`` and B^T [n, K] through ``tb``, both
    as 16-bit units [rows, k2 = K / 2]."""
    kaio.launch_bounds(THREADS, 1)
    sa_s = kaio.shared_dynamic(f16, (STAGES, BM, BK), 0)
    sb_s = kaio.shared_dynamic(f16, (STAGES, BN, BK), STAGES * A_STAGE_BYTES)
    bars = kaio.shared_dynamic(u64, (2, STAGES), STAGES * (A_STAGE_BYTES + BK * BN * 2))
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)  # warp-uniform as ptxas sees it
    lt = t % 128
    tile0, step, tiles_m, tiles_n, my_tiles, k_tiles, slices = tile_schedule(m, n, k2, BM, BN, BK)
    init_ring(bars, t, STAGES, 2)  # "free": lane 0 of each consumer warpgroup
    acc = kaio.local(i32, (BN // 8, 2, 2))
    unused = kaio.local(i32, (1, 2, 2))  # consume's slice sums: none (exact s32 sums)
    no_turns = kaio.shared_dynamic(u64, (2,), 0)  # nor turns (never read)
    st = i32(0)  # the ring position: stage, phase parity, slices so far
    ph = u32(0)
    g = i32(0)
    if wg < 2:  # the consumers
        for i in range(my_tiles):
            st, ph, g = consume(acc, unused, unused, sa_s, sb_s, bars, no_turns, st, ph, g,
                                k_tiles, wg, lt, BN, STAGES, 0, i8, i32, 1)  # fmt: skip
            store_int8(acc, out, alpha, tile0 + i * step, tiles_m, tiles_n, m, n, wg, lt, BN,
                       GROUP)  # fmt: skip
    elif t == CONSUMERS:  # the producer
        produce_all(sa_s, sb_s, bars, ta, tb, tile0, slices, k_tiles, step, tiles_m, tiles_n, 0,
                    1, BN, STAGES, GROUP, BM, 1, 1, BM)  # fmt: skip


def eligible(a, k: int) -> bool:
    """Whether TMA can read ``a`` [M, K] (an ``_arrays.Operand``) and B^T [N, K]: rows a
    multiple of 16 bytes apart (K % 16 == 0) and a 16-byte aligned base (B^T is new)."""
    return k % 16 == 0 and a.aligned(16)


IN_SIMULATOR = False  # tests set it to run this kernel on the simulator
MIN_M = 65  # below this the mma.sync kernel (not yet measured against this one)


def takes(a, m: int, k: int) -> bool:
    """Whether ``matmul_int8`` runs this kernel for ``a`` [M, K] (an ``_arrays.Operand``): an
    sm_90 GPU (``KAIO_HOPPER_MATMUL=0`` opts out; the simulator when ``IN_SIMULATOR``), M of
    at least ``MIN_M`` and operands TMA can read (``eligible``)."""
    from kaio.sim import active as simulating
    from kaio_ops.matmul import _hopper

    on = IN_SIMULATOR if simulating() else _hopper(a)
    return on and m >= MIN_M and eligible(a, k)


def stages(bn: int) -> int:
    """The ring stages that fit in shared memory at N tile ``bn`` (at most 6)."""
    return max(2, min(6, SHARED_LIMIT // shared_bytes(bn, 1)))


def tiles(m: int, n: int, sms: int) -> tuple[int, int]:
    """(BN, STAGES): 128 x 256 tiles when they give every multiprocessor one, else 128 x 128."""
    bn = 256 if -(-m // BM) * -(-n // 256) >= sms else 128
    return bn, stages(bn)


def launch(a_units, bt_units, out, alpha: float, m: int, n: int, sms: int, stream,
           config: tuple | None = None) -> None:  # fmt: skip
    """Run ``matmul_int8_wgmma`` on a persistent grid of at most ``sms`` blocks into ``out``
    (f32 [m, n]). ``a_units`` and ``bt_units``: A [m, K] and B^T [n, K] viewed as f16
    [rows, K / 2]; ``config``: (BN, STAGES), default ``tiles``'s."""
    bn, stages = config or tiles(m, n, sms)
    ta = kaio.tensor_map_2d(a_units, (BM, BK), SW)
    tb = kaio.tensor_map_2d(bt_units, (bn, BK), SW)
    k2 = a_units.shape[1]
    grid = min(sms, -(-m // BM) * -(-n // bn))
    matmul_int8_wgmma[grid, THREADS, stream, shared_bytes(bn, stages)](
        ta, tb, out, alpha, m, n, k2, BN=bn, STAGES=stages, GROUP=GROUP_ROWS
    )


def specializations() -> list:
    """(kernel, constexprs) of the tiles ``launch`` uses (for ptxas, sm_90a)."""
    return [
        (matmul_int8_wgmma, {"BN": bn, "STAGES": stages(bn), "GROUP": GROUP_ROWS})
        for bn in (128, 256)
    ]
