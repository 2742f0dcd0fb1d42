"""W4A16 at prefill shapes on sm_90: the int4 weights dequantized to f16 once, then the Hopper
matmul (``kaio_ops._matmul_hopper``: TMA, wgmma).

At prefill the product is compute-bound, and the tiled int4 kernel (mma.sync, each weight
unpacked in registers by every block that reads it) runs at mma.sync's rate at best. Writing
the f16 weights out once costs ``K N`` x 2.5 bytes of traffic (read K N / 2, write 2 K N):
about 15 µs for a 4096 x 4096 weight on an H100, against some 200 µs for the 4096-row
product that follows on the wgmma kernel. The f16 weights live only for the call (a
temporary of 2 K N bytes per weight).

``dequantize_int4`` writes ``f16(scales[k // 128, n] * q)``, rounded once: the same bits as
the weights the other int4 kernels make in registers, so the op's contract is unchanged.
"""

from __future__ import annotations

import math

import kaio
from kaio import f16, f16x2, u32
from kaio_ops import _arrays, _matmul_hopper
from kaio_ops.matmul import hopper_takes

THREADS = 256
COLS = 8  # columns a thread dequantizes: two 16-byte loads of words, a 16-byte store a row
ROWS_PER_GROUP = 16  # packed word rows per scale group (128 values)
MAGIC = 0x64006400  # f16 1024.0 in both halves: OR-ing a nibble in gives 1024 + nibble
BIAS = 0x64086408  # f16 1032.0 = 1024 + 8 in both halves (the nibble's sign bit is flipped)


@kaio.gpu_kernel(block_size=THREADS)
def dequantize_int4(words: u32[:, :], scales: f16[:, :], w: f16[:, :], col0: u32):
    """``w[8 r + i, col0 + c] = f16(scales[r // 16, c] * q)``, q the signed nibble ``i`` of
    ``words[r, c]``: each thread takes one packed row ``r`` and 8 adjacent columns (N % 8 ==
    0, every array 16-byte aligned, ``col0`` a multiple of 8)."""
    chunks = u32(words.shape[1]) // COLS
    idx = kaio.block_idx_x() * THREADS + kaio.thread_idx_x()
    r = idx // chunks
    c = idx % chunks * COLS
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
                bits = ((lo | (hi << 16)) ^ 0x00080008) | MAGIC
                v = (kaio.bitcast(bits, f16x2) - kaio.bitcast(u32(BIAS), f16x2)) * kaio.bitcast(
                    sc[p], f16x2
                )
                row[p] = kaio.bitcast(v, u32)
            kaio.store_vector(w, (8 * r + i, col0 + c), row)


def fits(x: _arrays.Operand, *weights) -> bool:
    """Whether ``x`` [M, K] times int4 ``weights`` ((packed words, scales) ``Operand``
    pairs) takes this path: the matmul ops would run the Hopper kernel on the f16 weights (an
    sm_90 GPU, enough tiles), and the dequantization's 16-byte accesses fit (N % 8 == 0, the
    words and scales 16-byte aligned)."""
    m, k = x.shape
    n = sum(b.shape[1] for b, _ in weights)
    vec = all(b.shape[1] % COLS == 0 and b.aligned(16) and s.aligned(16) for b, s in weights)
    return vec and hopper_takes(x, None, m, n, k)


def dequantized(like: _arrays.Operand, weights) -> object:
    """A new f16 array [K, sum of N] of ``like``'s kind: the int4 ``weights`` side by side."""
    k = weights[0][0].shape[0] * 8
    n = sum(b.shape[1] for b, _ in weights)
    w = _arrays.output(like, (k, n), f16)
    col0 = 0
    for b, s in weights:
        blocks = math.ceil(b.size // COLS / THREADS)
        words = _arrays.retype(b.obj, b.kind, u32)  # int32 words: the same bits
        dequantize_int4[blocks, THREADS, _arrays.stream_of(like), 0](words, s.obj, w, col0)
        col0 += b.shape[1]
    return w


def matmul(x: _arrays.Operand, b: _arrays.Operand, s: _arrays.Operand):
    """``x @ W`` in f32 for the int4 weight (``b``, ``s``): dequantized, then the Hopper
    matmul."""
    m, k = x.shape
    w = _arrays.Inputs("matmul_int4").array(dequantized(x, [(b, s)]), "w")
    return _matmul_hopper.launch(x, w, m, b.shape[1], k, _arrays.multiprocessors(), False)


def qkv(x: _arrays.Operand, weights: list) -> tuple:
    """``(q, k, v)`` in f16 for the three int4 weights: dequantized side by side into one f16
    [K, Nq + Nk + Nv], then one Hopper matmul whose epilogue writes each column to its
    projection."""
    m, k = x.shape
    w = _arrays.Inputs("qkv_project_int4").array(dequantized(x, weights), "w")
    outs = [_arrays.output(x, (m, b.shape[1]), f16) for b, _ in weights]
    n = w.shape[1]
    return tuple(
        _matmul_hopper.launch(x, w, m, n, k, _arrays.multiprocessors(), False, f16_outs=outs)
    )


def specializations() -> list:
    """(kernel, constexprs) of every specialization these paths launch (for PTX checks)."""
    return [(dequantize_int4, {})]
