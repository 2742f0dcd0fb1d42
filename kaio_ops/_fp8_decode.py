"""``matmul_fp8`` for a few rows (decode) in one launch: ``(a @ b) * scale_a * scale_b (+
bias)`` for fp8 ``a`` [M, K] and ``b`` [K, N] given column-major (its transpose B^T [N, K]
row-major, ``torch._scaled_mm``'s layout), f32 sums, one rounding to the output type.

At these M the product is a stream of B (M multiply-adds a byte): ``gemv_fp8`` streams it
with CUDA cores (as ``kaio_ops._gemv.gemv_nk`` does for f16), not tensor cores, and needs no
K split, workspace or second kernel: warp ``w`` of block ``x`` computes the ``NC``
adjacent columns from ``n = NC (8 x + w)`` of C (``COLS_PER_WARP``, even); its lanes read
16-byte pieces (16 values) of those B^T rows and of A's rows, ``U`` pieces of each B^T row
in flight before their sums, convert each value exactly to f32 (``f32(fp8)``; A's once for
the ``NC`` columns) and add the products in f32; the lanes' sums are then added with
shuffles (a fixed order), and lane ``m`` stores row ``m`` of the columns, a pair at a
time, through ``_fp8.store_scaled``, the epilogue of the other fp8 kernels (the scales per
tensor, per row of a or per column of b, the bias, one rounding).

Requirements (``fits``): M at most ``MAX_M`` (``SM90_MAX_M`` on sm_90, none: the wgmma
kernel's swapped tiles ran faster there from one row); the op's own (K and N multiples of 16,
16-byte aligned operands) cover the rest."""

# ruff: noqa: F821  (DT and FP8 in annotations are dtype constexpr parameters)
from __future__ import annotations

import math

import kaio
from kaio import f32, u8, u32
from kaio_ops._fp8 import store_scaled

__all__ = ["MAX_M", "SM90_MAX_M", "fits", "gemv_fp8", "launch", "specializations"]

THREADS = 256
WARPS = THREADS // 32
U = 2  # 16-byte pieces of each B^T row a lane has in flight
MAX_M = 1  # the rows routed here off sm_90: at M = 4 the wgmma kernel was faster (H100)
SM90_MAX_M = 0  # and on sm_90: none (the swapped wgmma tiles: 6-15% faster at one row, H100)
MOST_M = 4  # the rows the kernel is checked for (tests, bench/decode_gemms.py)
COLS_PER_WARP = 2  # NC: C columns a warp (even; A's values converted once for all of them)


@kaio.gpu_kernel(block_size=THREADS)
def gemv_fp8(
    a: u32[:, :], bt: u32[:, :], out: DT[:, :], sa: f32[:], sb: f32[:], bias: DT[:],
    N: u32, K: u32,
    MR: kaio.constexpr, NC: kaio.constexpr, ROW_A: kaio.constexpr, COL_B: kaio.constexpr,
    BIAS: kaio.constexpr, DT: kaio.constexpr, FP8: kaio.constexpr,
):  # fmt: skip
    """C = (A @ B) * scales (+ bias) for ``MR`` (= M) rows (module docstring): A as words
    [M, K / 4] and B^T as words [N, K / 4], 4 fp8 values a word, low byte first."""
    t = kaio.thread_idx_x()
    lane = t % 32
    n = (kaio.block_idx_x() * WARPS + t // 32) * NC
    acc = kaio.local(f32, (NC, MR))
    for m in kaio.static_range(MR):
        for c in kaio.static_range(NC):
            acc[c, m] = 0.0
    if n < N:
        kw = K // 4  # words a row
        vw = kaio.local(u32, (NC * U, 4))  # piece i of column c at NC i + c
        va = kaio.local(u32, 4)
        wv = kaio.local(f32, (NC, 16))
        w0 = lane * 4
        while w0 < kw:
            for i in kaio.static_range(U):  # U pieces of both rows in flight before their sums
                if w0 + 128 * i < kw:
                    for c in kaio.static_range(NC):
                        kaio.load_vector(vw[NC * i + c], bt, (n + c, w0 + 128 * i))
            for i in kaio.static_range(U):
                if w0 + 128 * i < kw:
                    for c in kaio.static_range(NC):
                        for j in kaio.static_range(16):
                            byte = u8(vw[NC * i + c, j // 4] >> (8 * (j % 4)))
                            wv[c, j] = f32(kaio.bitcast(byte, FP8))
                    for m in kaio.static_range(MR):
                        kaio.load_vector(va, a, (m, w0 + 128 * i))
                        for j in kaio.static_range(16):
                            x = f32(kaio.bitcast(u8(va[j // 4] >> (8 * (j % 4))), FP8))
                            for c in kaio.static_range(NC):
                                acc[c, m] += x * wv[c, j]
            w0 += 128 * U
        for m in kaio.static_range(MR):
            for c in kaio.static_range(NC):
                for width in kaio.static_range(5):
                    acc[c, m] += kaio.shfl_xor(acc[c, m], 16 >> width)
            if lane == m:
                for c in kaio.static_range(0, NC, 2):  # pairs of columns
                    store_scaled(out, u32(m), n + c, acc[c, m], acc[c + 1, m], sa, sb, bias,
                                 ROW_A, COL_B, BIAS, DT)  # fmt: skip


def fits(m: int, sm90: bool = False) -> bool:
    """Whether ``gemv_fp8`` computes a product of ``m`` rows: at most ``MAX_M``, or
    ``SM90_MAX_M`` on an sm_90 (``sm90``: where ``matmul_fp8`` has its wgmma kernel)."""
    return m <= (SM90_MAX_M if sm90 else MAX_M)


def launch(a, bt, out, sa, sb, bias, m: int, n: int, k: int, flags: dict, dt, fp8,
           stream) -> None:  # fmt: skip
    """Run ``gemv_fp8`` into ``out`` (``DT`` [m, n]): ``a`` an ``_arrays.Operand`` [m, k],
    ``bt`` B^T as words [n, k / 4], the scales and bias as ``_fp8._mm_fp8`` takes them,
    ``flags`` its ROW_A, COL_B and BIAS, ``fp8`` the element type."""
    a_words = a.arg(m, k // 4, dtype=u32)
    nc = COLS_PER_WARP
    gemv_fp8[math.ceil(n / (WARPS * nc)), THREADS, stream, 0](
        a_words, bt, out, sa, sb, bias, n, k, MR=m, NC=nc, **flags, DT=dt, FP8=fp8
    )


def specializations() -> list:
    """(kernel, constexprs) of a spread of the launches (for PTX checks, sm_89+)."""
    from kaio import bf16, e4m3, e5m2, f16

    return [
        (gemv_fp8, {"MR": 1, "NC": 2, "ROW_A": 0, "COL_B": 0, "BIAS": 0, "DT": bf16, "FP8": e4m3}),
        (gemv_fp8, {"MR": 3, "NC": 4, "ROW_A": 1, "COL_B": 1, "BIAS": 1, "DT": f16, "FP8": e5m2}),
        (gemv_fp8, {"MR": 4, "NC": 2, "ROW_A": 1, "COL_B": 0, "BIAS": 1, "DT": f32, "FP8": e4m3}),
    ]
