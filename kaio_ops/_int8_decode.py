"""``matmul_int8`` for a few rows (decode) in one launch: ``f32(a @ b) * scale`` for int8 ``a``
[M, K] and ``b`` [K, N] read as they are (no transpose of B), exact s32 sums.

At these M the product is a stream of B (M multiply-adds a byte), so ``gemv_int8`` streams
B with CUDA cores, as ``kaio_ops._gemv.gemv_kn`` does for f16: a block of 256 threads (8
warps) covers 256 columns of C; lane ``l`` of each warp owns the 8 adjacent columns ``8 l ..
8 l + 7`` and loads them from a row of B as two 32-bit words (one 8-byte access); warp ``w``
takes the 8 consecutive rows ``8 w .. 8 w + 7`` of each 64-row step of the block's K slice
(all 8 loads issued before their sums), and reads the matching 8 bytes of each row of A as
two words (a broadcast to the warp). Each byte is sign-extended to 32 bits by one ``prmt``
and multiplied into ``M x 8`` s32 sums: exact (|a b| <= 2**14, K < 2**17). The 8 warps'
sums are added in shared memory; K is split over ``grid.y`` (slices of whole 64-row steps)
when the column blocks do not fill the GPU: each slice's block writes its s32 sums to a
workspace and the last of them to finish (an arrival count per column block,
``_gemm.last_arrival``) adds the slices and writes ``f32(sum) * scale``: integer sums, so
the same bits whatever the order, and one kernel. uint8 inputs are read as int8 (the op's
contract) since every byte goes through the sign-extending ``prmt``.

Requirements (``fits``): M <= ``MAX_M``, K a multiple of 8 (whole words of A's rows), N a
multiple of 8 and both operands 8-byte aligned (8-byte accesses)."""

from __future__ import annotations

import math

import kaio
from kaio import f32, i32, u32
from kaio_ops import _arrays
from kaio_ops._gemv import finish_columns

__all__ = ["MAX_M", "MOST_M", "fits", "gemv_int8", "matmul", "specializations", "split_for"]

THREADS = 256
COLS = 8 * 32  # C columns a block: 8 a lane
ROWS = 8  # consecutive B rows a warp takes a step (two words of A's row)
STEP = ROWS * THREADS // 32  # B rows a block takes a step
# the rows routed here: at K = N = 4096 on an H100 8 rows took 21.8 µs of GPU time against
# 33.5 for the transpose and the mma.sync kernel (bench/decode_gemms.py); 16 is what the
# kernel is checked for (MOST_M: tests, the bench)
MAX_M = 8
MOST_M = 16
# prmt selector of byte r of a word sign-extended to 32 bits: SIGNED + BYTE * r
# (nibbles r, 8 + r, 8 + r, 8 + r)
SIGNED = 0x8880
BYTE = 0x1111


@kaio.gpu_kernel(block_size=THREADS)
def gemv_int8(
    a: u32[:], b: u32[:, :], c: f32[:, :], ws: i32[:, :], counters: i32[:],
    alpha: f32, M: u32, N: u32, K: u32, k_slice: u32,
    MR: kaio.constexpr,
):  # fmt: skip
    """C = f32(A @ B) * alpha for ``MR`` (= M) rows (module docstring): block (x, y) sums K
    slice y of C columns 256 x .. 256 x + 255; A comes as words [M * K / 4], B as words [K,
    N / 4]."""
    t = kaio.thread_idx_x()
    warp = t // 32
    lane = t % 32
    n0 = kaio.block_idx_x() * COLS
    col = n0 + lane * 8
    inside = col < N
    k_begin = kaio.block_idx_y() * k_slice
    k_end = kaio.min(k_begin + k_slice, K)
    kw = K // 4  # words a row of A
    acc = kaio.local(i32, (MR, 8))
    for m in kaio.static_range(MR):
        for j in kaio.static_range(8):
            acc[m, j] = 0
    v = kaio.local(u32, (ROWS, 2))
    aw = kaio.local(u32, (MR, 2))
    bv = kaio.local(i32, 8)
    kk = k_begin + ROWS * warp
    while kk < k_end:
        for i in kaio.static_range(ROWS):  # the 8 rows' loads in flight before their sums
            if inside and kk + i < k_end:
                kaio.load_vector(v[i], b, (kk + i, col // 4))
            else:
                v[i, 0] = 0
                v[i, 1] = 0
        for m in kaio.static_range(MR):
            for h in kaio.static_range(2):
                aw[m, h] = 0
                if kk + 4 * h < k_end:
                    aw[m, h] = a[m * kw + kk // 4 + h]
        for i in kaio.static_range(ROWS):
            for j in kaio.static_range(8):
                bv[j] = kaio.bitcast(kaio.prmt(v[i, j // 4], 0, SIGNED + BYTE * (j % 4)), i32)
            for m in kaio.static_range(MR):
                x = kaio.bitcast(kaio.prmt(aw[m, i // 4], 0, SIGNED + BYTE * (i % 4)), i32)
                for j in kaio.static_range(8):
                    acc[m, j] += x * bv[j]
        kk += STEP
    part = kaio.shared(i32, (8, COLS))
    last = kaio.shared(u32, (1,))
    finish_columns(acc, part, last, c, ws, counters, alpha, M, N, n0, t, MR, i32, f32)


def fits(a: _arrays.Operand, b: _arrays.Operand, m: int, n: int, k: int) -> bool:
    """Whether ``gemv_int8`` computes ``a`` [M, K] @ ``b`` [K, N] (``Operand``s): M at most
    ``MAX_M``, K and N multiples of 8, both operands 8-byte aligned."""
    return m <= MAX_M and k % 8 == 0 and n % 8 == 0 and a.aligned(8) and b.aligned(8)


# the K split aims at this many blocks a multiprocessor: 2 was fastest at M = 1 to 8 on an
# H100 (8.7 µs at M = 1 against 9.1 with 1 and 9.5 with 4; bench/decode_gemms.py)
BLOCKS_PER_SM = 2


def split_for(n: int, k: int, sms: int) -> int:
    """The K slices of a launch: towards ``BLOCKS_PER_SM`` blocks a multiprocessor, each
    slice at least 2 full steps of ``STEP`` rows, at most 64 slices."""
    blocks = math.ceil(n / COLS)
    return max(1, min(math.ceil(BLOCKS_PER_SM * sms / blocks), k // (2 * STEP), 64))


def matmul(a: _arrays.Operand, b: _arrays.Operand, alpha: float, mnk: tuple):
    """``f32(a @ b) * alpha`` (``fits``) in a new f32 [M, N] array of ``a``'s kind: one
    launch of ``gemv_int8``."""
    from kaio_ops.linear import _counters, _placeholder

    m, n, k = mnk
    split = split_for(n, k, _arrays.multiprocessors(a))
    k_slice = math.ceil(math.ceil(k / split) / STEP) * STEP
    split = math.ceil(k / k_slice)
    c = _arrays.output(a, (m, n), f32)
    blocks = math.ceil(n / COLS)
    if split > 1:
        ws = _arrays.output(a, (split * m, n), i32)
        counters = _counters(a, blocks)
    else:
        ws, counters = _placeholder(a, i32, 2), _placeholder(a, i32, 1)
    gemv_int8[(blocks, split, 1), THREADS, _arrays.stream_of(a), 0](
        a.arg(m * k // 4, dtype=u32), b.arg(k, n // 4, dtype=u32),
        _arrays.output_arg(a, c, (m, n), f32), ws, counters, alpha, m, n, k, k_slice, MR=m,
    )  # fmt: skip
    return c


def specializations() -> list:
    """(kernel, constexprs) of a spread of the launches (for PTX checks)."""
    return [(gemv_int8, {"MR": mr}) for mr in (1, 5, 16)]
