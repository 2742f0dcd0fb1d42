"""Quantized weights at prefill shapes on sm_90: dequantized to f16 once, then the Hopper
matmul (``kaio_ops._matmul_hopper``: TMA, wgmma).

At prefill the product is compute-bound, and the tiled quantized kernels (mma.sync, each
weight made f16 in registers by every block that reads it) run at mma.sync's rate at best.
Writing the f16 weights out once costs ``2 K N`` bytes written (and ``K N / 2`` int4 or
``K N`` int8 bytes read): about 15 µs for a 4096 x 4096 weight on an H100, against some
200 µs for the 4096-row product that follows on the wgmma kernel. The f16 weights live only
for the call (a temporary of 2 K N bytes per weight).

The f16 weights are those the other kernels make in registers, so the ops' contracts are
unchanged: ``dequantize_int4`` writes ``f16(scales[k // 128, n] * q)``, rounded once, and
``widen_int8`` the int8 values exactly; an int8 projection's scale is applied to the f32 sums
in the matmul's epilogue (``f16(f32(x @ w) * s)``).
"""

from __future__ import annotations

import math

import kaio
from kaio import f16, f16x2, u8, u32
from kaio_ops import _arrays, _matmul_hopper
from kaio_ops._int4_decode import ROWS_PER_GROUP
from kaio_ops._matmul_kernels import INT4_BIAS, INT4_MAGIC, INT8_BIAS, INT8_MAGIC
from kaio_ops.matmul import hopper_takes

THREADS = 256
INT4_COLS = 8  # columns a thread dequantizes: two 16-byte loads of words, 16-byte row stores
INT8_COLS = 16  # columns a thread widens: one 16-byte load, two 16-byte stores


@kaio.gpu_func
def dequantize_rows(words: u32[:, :], scales: f16[:, :], w: f16[:, :], col0: u32):
    """``w[8 r + i, col0 + c] = f16(scales[r // 16, c] * q)``, q the signed nibble ``i`` of
    ``words[r, c]``: this thread's packed row ``r`` and 8 adjacent columns (N % 8 == 0,
    every array 16-byte aligned, ``col0`` a multiple of 8)."""
    chunks = u32(words.shape[1]) // INT4_COLS
    idx = kaio.block_idx_x() * THREADS + kaio.thread_idx_x()
    r = idx // chunks
    c = idx % chunks * INT4_COLS
    if r < u32(words.shape[0]):
        packed = kaio.local(u32, (2, 4))
        kaio.load_vector(packed[0], words, (r, c))
        kaio.load_vector(packed[1], words, (r, c + 4))
        sc = kaio.local(u32, 4)  # the 8 columns' scales, two f16 a register
        kaio.load_vector(sc, scales, (r // ROWS_PER_GROUP, c))
        row = kaio.local(u32, 4)
        for i in kaio.static_range(8):
            for p in kaio.static_range(4):
                lo = (packed[p // 2, 2 * (p % 2)] >> (4 * i)) & 0xF
                hi = (packed[p // 2, 2 * (p % 2) + 1] >> (4 * i)) & 0xF
                bits = ((lo | (hi << 16)) ^ 0x00080008) | INT4_MAGIC
                v = (kaio.bitcast(bits, f16x2) - kaio.bitcast(u32(INT4_BIAS), f16x2)) * (
                    kaio.bitcast(sc[p], f16x2)
                )
                row[p] = kaio.bitcast(v, u32)
            kaio.store_vector(w, (8 * r + i, col0 + c), row)


@kaio.gpu_kernel(block_size=THREADS)
def dequantize_int4(
    b0: u32[:, :], b1: u32[:, :], b2: u32[:, :], s0: f16[:, :], s1: f16[:, :], s2: f16[:, :],
    w: f16[:, :], n0: u32, n1: u32,
):  # fmt: skip
    """Up to three int4 weights (words ``b``, scales ``s``; ``block_idx_y`` picks one) made
    f16 side by side in ``w``, from columns 0, n0 and n0 + n1 (``dequantize_rows``)."""
    z = kaio.block_idx_y()
    if z == 0:
        dequantize_rows(b0, s0, w, 0)
    elif z == 1:
        dequantize_rows(b1, s1, w, n0)
    else:
        dequantize_rows(b2, s2, w, n0 + n1)


@kaio.gpu_func
def widen_rows(src: u8[:, :], w: f16[:, :], col0: u32):
    """``w[k, col0 + c] = f16(int8(src[k, c]))``, exactly: this thread's 16 adjacent bytes of
    one row (N % 16 == 0, both arrays 16-byte aligned, ``col0`` a multiple of 8)."""
    chunks = u32(src.shape[1]) // INT8_COLS
    idx = kaio.block_idx_x() * THREADS + kaio.thread_idx_x()
    k = idx // chunks
    c = idx % chunks * INT8_COLS
    if k < u32(src.shape[0]):
        raw = kaio.local(u32, 4)
        kaio.load_vector(raw, src, (k, c))
        half = kaio.local(u32, 4)
        for h in kaio.static_range(2):
            for p in kaio.static_range(4):
                # bytes 2p and 2p + 1 of this half's 8 (word 2h + p // 2), sign bit flipped,
                # each under 0x64: f16 1152 + q, minus 1152
                biased = raw[2 * h + p // 2] ^ 0x80808080
                bits = kaio.prmt(biased, INT8_MAGIC, 0x4140 + 0x202 * (p % 2))
                v = kaio.bitcast(bits, f16x2) - kaio.bitcast(u32(INT8_BIAS), f16x2)
                half[p] = kaio.bitcast(v, u32)
            kaio.store_vector(w, (k, col0 + c + 8 * h), half)


@kaio.gpu_kernel(block_size=THREADS)
def widen_int8(src0: u8[:, :], src1: u8[:, :], src2: u8[:, :], w: f16[:, :], n0: u32, n1: u32):
    """Up to three int8 weights (``block_idx_y`` picks one) made f16 side by side in ``w``,
    from columns 0, n0 and n0 + n1 (``widen_rows``)."""
    z = kaio.block_idx_y()
    if z == 0:
        widen_rows(src0, w, 0)
    elif z == 1:
        widen_rows(src1, w, n0)
    else:
        widen_rows(src2, w, n0 + n1)


def fits(x: _arrays.Operand, weights: list, cols: int) -> bool:
    """Whether ``x`` [M, K] times the quantized ``weights`` (each an ``Operand`` [rows, N]
    whose first element starts a 16-byte chunk of the row) takes this path: the persistent
    Hopper kernel takes the f16 weights side by side (``matmul.hopper_takes``: an sm_90 GPU,
    enough tiles), and the conversion's 16-byte accesses fit (each N a multiple of ``cols``,
    each weight 16-byte aligned)."""
    m, k = x.shape
    n = sum(w.shape[1] for w in weights)
    vec = all(w.shape[1] % cols == 0 and w.aligned(16) for w in weights)
    return vec and hopper_takes(x, None, m, n, k)


def fits_int4(x: _arrays.Operand, *weights) -> bool:
    """``fits`` for int4 ``(words, scales)`` pairs (the scales 16-byte aligned too)."""
    return all(s.aligned(16) for _, s in weights) and fits(x, [b for b, _ in weights], INT4_COLS)


def fits_int8(x: _arrays.Operand, *weights) -> bool:
    """``fits`` for int8 (or uint8) weights [K, N]."""
    return fits(x, list(weights), INT8_COLS)


def _side_by_side(
    kernel, cols: int, like: _arrays.Operand, k: int, weights: list, *operands
) -> object:
    """A new f16 array [k, sum of N] of ``like``'s kind: the ``weights`` (``Operand``s [rows,
    N]) made f16 side by side by one launch of ``kernel`` (``cols`` columns a thread, a y
    block row per weight), whose arguments are ``operands`` (one list per kind of weight
    parameter, padded to three), the result and the first two widths."""
    widths = [b.shape[1] for b in weights]
    w = _arrays.output(like, (k, sum(widths)), f16)
    blocks = max(math.ceil(b.size // cols / THREADS) for b in weights)
    padded = [_arrays.three(group) for group in operands]
    config = ((blocks, len(weights)), THREADS, _arrays.stream_of(like), 0)
    kernel[config](*(x for group in padded for x in group), w, *(widths + [0, 0])[:2])
    return w


def int4_to_f16(like: _arrays.Operand, weights: list):
    """The int4 ``(words, scales)`` weights as f16, side by side in one new [K, sum of N]."""
    words = [b.arg(dtype=u32) for b, _ in weights]  # int32: the same bits
    k = weights[0][0].shape[0] * 8
    packed = [b for b, _ in weights]
    return _side_by_side(
        dequantize_int4, INT4_COLS, like, k, packed, words, [s.obj for _, s in weights]
    )


def int8_to_f16(like: _arrays.Operand, weights: list):
    """The int8 (or uint8, read as int8) weights as f16, side by side in one new [K, sum of
    N]."""
    raw = [b.arg(dtype=u8) for b in weights]
    return _side_by_side(widen_int8, INT8_COLS, like, weights[0].shape[0], weights, raw)


def _hopper(x: _arrays.Operand, w, **outputs):
    """``_matmul_hopper.launch`` of ``x`` @ the f16 weights ``w``."""
    m, k = x.shape
    w = _arrays.Inputs("prefill").array(w, "w", dtypes=(f16,))
    return _matmul_hopper.launch(
        x, w, m, w.shape[1], k, _arrays.multiprocessors(x), False, **outputs
    )


def matmul_int4(x: _arrays.Operand, b: _arrays.Operand, s: _arrays.Operand):
    """``x @ W`` in f32 for the int4 weight (``b``, ``s``)."""
    return _hopper(x, int4_to_f16(x, [(b, s)]))


def project(x: _arrays.Operand, w, widths: list[int], scales: list[float]) -> tuple:
    """``f16(f32(x @ W_i) * scales[i])`` for the f16 weights ``w`` [K, sum of widths] side
    by side: one Hopper matmul whose epilogue writes each column, scaled, to its output."""
    outs = [_arrays.output(x, (x.shape[0], n), f16) for n in widths]
    return tuple(_hopper(x, w, f16_outs=outs, scales=scales))


def qkv_int4(x: _arrays.Operand, weights: list) -> tuple:
    """``(q, k, v)`` in f16 for the three int4 ``(words, scales)`` weights."""
    widths = [b.shape[1] for b, _ in weights]
    return project(x, int4_to_f16(x, weights), widths, [1.0] * len(widths))


def qkv_int8(x: _arrays.Operand, weights: list, scales: list[float]) -> tuple:
    """``f16(f32(x @ w) * s)`` for each int8 weight ``w`` and its scale (one to three)."""
    return project(x, int8_to_f16(x, weights), [b.shape[1] for b in weights], scales)


def specializations() -> list:
    """(kernel, constexprs) of every specialization these paths launch (for PTX checks)."""
    return [(dequantize_int4, {}), (widen_int8, {})]
