"""The skinny GEMMs behind ``kaio_ops.matmul`` and ``kaio_ops.linear`` for a few rows of A
(decode): f16 or bf16 in, f32 sums, one rounding to ``OUT``. At these M the product is a
stream of B (M * N * K multiply-adds on N * K elements: a few per byte), so these kernels
stream B at the memory's rate with CUDA cores, not tensor cores.

``gemv_kn`` (B [K, N], ``matmul``, M <= 8): a block of 256 threads (8 warps) covers 256
columns of C: lane ``l`` of each warp owns the 8 adjacent columns ``8 l .. 8 l + 7`` and
loads them from a row of B in one 16-byte access; warp ``w`` takes rows ``w, w + 8, ...`` of
the block's K slice, ``U`` rows in flight at once (all their loads issued before their
sums). Each thread keeps ``M x 8`` f32 sums; A's elements are read by all the lanes of a
warp at once (one broadcast). The 8 warps' sums are added in shared memory, warp 0's first
(a fixed order). K is split over ``grid.y`` (slices of whole ``8 U``-row steps) when the
column blocks do not fill the GPU; each slice's block writes its raw sums to a workspace
and the last of them to finish (an arrival count per column block) adds the slices in
order and writes C: deterministic run to run, one kernel.

``gemv_nk`` (W [N, K], ``linear``, M <= 4, every epilogue of ``_gemm.epilogue``): a warp a
column of C, its lanes reading 16-byte pieces of the W row and of A's rows, the lanes' sums
added with shuffles (a fixed order); no K split (the LLM layers have N of 1024 and more:
enough warps).
"""

# ruff: noqa: F821  (DT, OUT, RT and T in annotations are dtype constexpr parameters)
from __future__ import annotations

import math
from typing import NamedTuple

import kaio
from kaio import f32, i32, u32
from kaio_ops._gemm import epilogue, last_arrival

THREADS = 256
COLS = 8 * 32  # C columns a block: 8 a lane
MAX_M = 8
U = 4  # B rows a warp has in flight


@kaio.gpu_kernel(block_size=THREADS)
def gemv_kn(
    a: DT[:], b: DT[:, :], c: OUT[:, :], ws: f32[:, :], counters: i32[:],
    M: u32, N: u32, K: u32, k_slice: u32,
    MR: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr,
):  # fmt: skip
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
    part = kaio.shared(f32, (8, COLS))
    last = kaio.shared(u32, (1,))
    finish_columns(acc, part, last, c, ws, counters, 1.0, M, N, n0, t, MR, f32, OUT)


@kaio.gpu_func
def finish_columns(
    acc: T[:, :], part: T[:, :], last: u32[:], c: OUT[:, :], ws: T[:, :], counters: i32[:],
    alpha: f32, M: u32, N: u32, n0: u32, t: u32,
    MR: kaio.constexpr, T: kaio.constexpr, OUT: kaio.constexpr,
):  # fmt: skip
    """The end of a block of ``gemv_kn`` (and of ``_int8_decode.gemv_int8``), by its 256
    threads: the 8 warps' sums of C columns ``n0 .. n0 + 255`` (lane ``l`` of each warp
    holds its sums of columns ``8 l .. 8 l + 7`` of row m in ``acc[m, j]``; element type
    ``T``) added in warp order (warp 0's first) through ``part`` (shared [8, 256]), thread
    ``t`` taking column ``n0 + t``; then ``C = OUT(f32(sum) * alpha)`` when K is not split
    (``grid.y`` 1), else the block's sums into its K slice's rows of the workspace ``ws`` and
    the last of the column block's slices to finish (``last``: a shared u32) adds the
    slices in order, 4 of each row loaded at once (one round trip to the L2 per 4 slices,
    not one per slice and row), and writes C."""
    warp = t // 32
    lane = t % 32
    sums = kaio.local(T, MR)
    for m in kaio.static_range(MR):
        for j in kaio.static_range(8):
            part[warp, lane * 8 + j] = acc[m, j]
        kaio.sync_threads()
        total = part[0, t]
        for w in kaio.static_range(1, 8):
            total += part[w, t]
        sums[m] = total
        kaio.sync_threads()
    mine = n0 + t
    split = kaio.grid_dim_y()
    if split == 1:
        if mine < N:
            for m in kaio.static_range(MR):
                c[m, mine] = OUT(f32(sums[m]) * alpha)
    else:
        if mine < N:
            for m in kaio.static_range(MR):
                ws[kaio.block_idx_y() * M + m, mine] = sums[m]
        if last_arrival(counters, kaio.block_idx_x(), split, last, t):  # the slices, in order
            if mine < N:
                got = kaio.local(T, (MR, 4))  # 4 slices of each row in flight at once
                z0 = u32(0)
                while z0 < split:
                    for m in kaio.static_range(MR):
                        for e in kaio.static_range(4):
                            if z0 + e < split:
                                got[m, e] = ws[(z0 + e) * M + m, mine]
                    for m in kaio.static_range(MR):
                        for e in kaio.static_range(4):
                            if z0 + e == 0:
                                sums[m] = got[m, e]
                            elif z0 + e < split:
                                sums[m] += got[m, e]
                    z0 += 4
                for m in kaio.static_range(MR):
                    c[m, mine] = OUT(f32(sums[m]) * alpha)


PREFERRED_M = 0  # the largest M the ops send here by default (bench/gemm_plans.py measures)


@kaio.gpu_kernel(block_size=THREADS)
def gemv_nk(
    a: DT[:, :], w: DT[:, :], c: OUT[:, :], bias: DT[:], res: RT[:, :],
    N: u32, K: u32,
    MR: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr, RT: kaio.constexpr,
    BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr,
):  # fmt: skip
    """C = epilogue(A @ W.T) for ``MR`` (= M) rows, W [N, K] (``nn.Linear``'s layout; [2N,
    K], gate rows then up rows, for "silu_gate"): warp w of block x computes column
    ``8 x + w`` of C, its lanes reading 16-byte pieces of the W row (and of A's rows) ``U``
    at a time, then adding the lanes' sums with shuffles (a fixed order) and the epilogue
    of ``_gemm.epilogue``. K a multiple of 8."""
    GATE = ACT == "silu_gate"
    t = kaio.thread_idx_x()
    lane = t % 32
    n = kaio.block_idx_x() * 8 + t // 32
    acc = kaio.local(f32, (2 if GATE else 1, MR))
    for m in kaio.static_range(MR):
        acc[0, m] = 0.0
        if GATE:
            acc[1, m] = 0.0
    if n < N:
        vw = kaio.local(DT, (U, 8))
        vu = kaio.local(DT, (U if GATE else 1, 8))
        va = kaio.local(DT, 8)
        k0 = lane * 8
        while k0 < K:
            for i in kaio.static_range(U):  # U pieces of the row in flight before their sums
                if k0 + 256 * i < K:
                    kaio.load_vector(vw[i], w, (n, k0 + 256 * i))
                    if GATE:
                        kaio.load_vector(vu[i], w, (N + n, k0 + 256 * i))
            for i in kaio.static_range(U):
                if k0 + 256 * i < K:
                    for m in kaio.static_range(MR):
                        kaio.load_vector(va, a, (m, k0 + 256 * i))
                        for j in kaio.static_range(8):
                            x = f32(va[j])
                            acc[0, m] += x * f32(vw[i, j])
                            if GATE:
                                acc[1, m] += x * f32(vu[i, j])
            k0 += 256 * U
        for m in kaio.static_range(MR):
            for h in kaio.static_range(2 if GATE else 1):
                for width in kaio.static_range(5):
                    acc[h, m] += kaio.shfl_xor(acc[h, m], 16 >> width)
            if lane == m:
                up = f32(0.0)
                if GATE:
                    up = acc[1, m]
                v = epilogue(acc[0, m], up, m, n, N, bias, res, BIAS, ACT, RES, DT, RT)
                c[m, n] = OUT(v)


MAX_M_NK = 4  # gemv_nk's sums: M x 8 products a 16-byte piece of W, and M pieces of A


def takes(a, b, mnk: tuple, transposed: bool, plain: bool) -> bool:
    """Whether a skinny kernel can compute the product of ``Operand``s ``a`` and ``b``:
    ``gemv_kn`` for B [K, N] (``matmul``) with no epilogue (``plain``), M at most ``MAX_M``,
    N a multiple of 8 and B 16-byte aligned; ``gemv_nk`` for B [N, K] (``linear``), any
    epilogue, M at most ``MAX_M_NK``, K a multiple of 8, A and B 16-byte aligned (16-byte
    pieces of their rows)."""
    m, n, k = mnk
    if transposed:
        return m <= MAX_M_NK and k % 8 == 0 and a.aligned(16) and b.aligned(16)
    return plain and m <= MAX_M and n % 8 == 0 and b.aligned(16)


def preferred(a, b, mnk: tuple, transposed: bool, plain: bool) -> bool:
    """Whether the ops run a skinny kernel (``takes``, and M at most ``PREFERRED_M``)."""
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
