"""The skinny GEMM behind ``kaio_ops.matmul`` for M <= 8 (decode): ``C[M, N] = A[M, K] @
B[K, N]``, f16 or bf16 in, f32 sums, one rounding to ``OUT``. At these M the product is a
stream of B (M * N * K multiply-adds on N * K elements: a few per byte), so it is made to
stream B at the memory's rate with CUDA cores, not tensor cores.

A block of 256 threads (8 warps) covers 256 columns of C: lane ``l`` of each warp owns the 8
adjacent columns ``8 l .. 8 l + 7`` and loads them from a row of B in one 16-byte access;
warp ``w`` takes rows ``w, w + 8, ...`` of the block's K slice, ``U`` rows in flight at once
(all their loads issued before their sums). Each thread keeps ``M x 8`` f32 sums; A's
elements are read by all the lanes of a warp at once (one broadcast). The 8 warps' sums are
added in shared memory, warp 0's first (a fixed order). K is split over ``grid.y`` (slices
of whole ``8 U``-row steps) when the column blocks do not fill the GPU; each slice's block
writes its raw sums to a workspace and the last of them to finish (an arrival count per
column block) adds the slices in order and writes C: deterministic run to run, one kernel.
"""

# ruff: noqa: F821  (DT and OUT in annotations are dtype constexpr parameters)
from __future__ import annotations

import math
from typing import NamedTuple

import kaio
from kaio import f32, i32, u32

THREADS = 256
COLS = 8 * 32  # C columns a block: 8 a lane
MAX_M = 8
U = 4  # B rows a warp has in flight


@kaio.gpu_kernel(block_size=THREADS)
def gemv_kn(
    a: DT[:],
    b: DT[:, :],
    c: OUT[:, :],
    ws: f32[:, :],
    counters: i32[:],
    M: u32,
    N: u32,
    K: u32,
    k_slice: u32,
    MR: kaio.constexpr,
    DT: kaio.constexpr,
    OUT: kaio.constexpr,
):
    """C = A @ B for ``MR`` (= M) rows (module docstring): block (x, y) sums K slice y of C
    columns 256 x .. 256 x + 255; A comes flat [M, K], B [K, N] with N a multiple of 8."""
    t = kaio.thread_idx_x()
    warp = t // 32
    lane = t % 32
    n0 = kaio.block_idx_x() * COLS
    col = n0 + lane * 8
    k_begin = kaio.block_idx_y() * k_slice
    k_end = kaio.min(k_begin + k_slice, K)
    acc = kaio.local(f32, (MR, 8))
    for m in kaio.static_range(MR):
        for j in kaio.static_range(8):
            acc[m, j] = 0.0
    v = kaio.local(DT, (U, 8))
    inside = col < N
    kk = k_begin + warp
    while kk < k_end:
        for i in kaio.static_range(U):  # U rows' loads in flight before their sums
            row = kk + 8 * i
            if inside and row < k_end:
                kaio.load_vector(v[i], b, (row, col))
            else:
                for j in kaio.static_range(8):
                    v[i, j] = 0.0
        for i in kaio.static_range(U):
            row = kk + 8 * i
            if row < k_end:
                for m in kaio.static_range(MR):
                    x = f32(a[m * K + row])
                    for j in kaio.static_range(8):
                        acc[m, j] += x * f32(v[i, j])
        kk += 8 * U
    # the 8 warps' sums of row m: warp w's at part[w, column], added in warp order
    part = kaio.shared(f32, (8, COLS))
    mine = n0 + t  # thread t sums and writes column n0 + t
    split = kaio.grid_dim_y()
    sums = kaio.local(f32, MR)
    for m in kaio.static_range(MR):
        for j in kaio.static_range(8):
            part[warp, lane * 8 + j] = acc[m, j]
        kaio.sync_threads()
        total = part[0, t]
        for w in kaio.static_range(1, 8):
            total += part[w, t]
        sums[m] = total
        kaio.sync_threads()
    if split == 1:
        if mine < N:
            for m in kaio.static_range(MR):
                c[m, mine] = OUT(sums[m])
    else:
        if mine < N:
            for m in kaio.static_range(MR):
                ws[kaio.block_idx_y() * M + m, mine] = sums[m]
        last = kaio.shared(u32, (1,))
        kaio.threadfence()
        kaio.sync_threads()
        if t == 0:
            last[0] = u32(kaio.atomic_add(counters, kaio.block_idx_x(), 1))
        kaio.sync_threads()
        if last[0] == split - 1:  # the last slice of this column block to finish
            kaio.threadfence()
            if t == 0:
                counters[kaio.block_idx_x()] = 0  # ready for the next launch on this stream
            if mine < N:
                for m in kaio.static_range(MR):
                    total = ws[m, mine]
                    for z in range(1, split):
                        total += ws[z * M + m, mine]
                    c[m, mine] = OUT(total)


PREFERRED_M = 0  # the largest M the ops send here by default (bench/gemm_plans.py measures)


def takes(a, b, mnk: tuple, transposed: bool, plain: bool) -> bool:
    """Whether ``gemv_kn`` can compute the product of ``Operand``s ``a`` and ``b``: B [K, N]
    (``matmul``), no epilogue (``plain``), M at most ``MAX_M``, N a multiple of 8 and B
    16-byte aligned (16-byte rows of 8 columns)."""
    m, n, _ = mnk
    return not transposed and plain and m <= MAX_M and n % 8 == 0 and b.aligned(16)


def preferred(a, b, mnk: tuple, transposed: bool, plain: bool) -> bool:
    """Whether the ops run ``gemv_kn`` (``takes``, and M at most ``PREFERRED_M``)."""
    return mnk[0] <= PREFERRED_M and takes(a, b, mnk, transposed, plain)


def split_for(m: int, n: int, k: int, sms: int) -> int:
    """The K slices of a ``gemv_kn`` launch: towards 4 blocks a multiprocessor, each slice
    at least 2 full steps of ``8 U`` rows a warp (64 rows), at most 64 slices."""
    blocks = math.ceil(n / COLS)
    steps = k // (8 * U * 2)
    return max(1, min(math.ceil(4 * sms / blocks), steps, 64))


class Plan(NamedTuple):
    """A launch plan of ``gemv_kn``: K cut in (up to) ``split`` slices."""

    split: int


def slices(k: int, split: int) -> tuple[int, int]:
    """(slices, rows a slice) of ``split`` K slices, each a whole number of ``8 U`` rows."""
    k_slice = math.ceil(math.ceil(k / split) / (8 * U)) * 8 * U
    return math.ceil(k / k_slice), k_slice


def launch(a, b, c_arg, out, ws, counters, mnk: tuple, k_slice: int, stream) -> None:
    """Launch ``gemv_kn`` on ``Operand``s a [M, K] and b [K, N] into ``c_arg`` (of type
    ``out``); ``ws`` holds ``slices * M`` rows of N f32 sums when K is cut in slices of
    ``k_slice`` rows, ``counters`` a zero arrival count per block of 256 columns."""
    m, n, k = mnk
    grid = (math.ceil(n / COLS), math.ceil(k / k_slice), 1)
    gemv_kn[grid, THREADS, stream, 0](
        a.arg(m * k), b.arg(k, n), c_arg, ws, counters, m, n, k, k_slice,
        MR=m, DT=a.dtype, OUT=out,
    )  # fmt: skip
