"""Device functions shared by the memory-bound kernels: chunk loads and stores, reductions.

Kernels move data in *chunks* of ``VEC`` consecutive elements: with ``VEC > 1`` a chunk is one
16-byte vector access (``kaio.load_vector``/``kaio.store_vector``), which needs its address
aligned to 16 bytes; ``VEC == 1`` is the scalar path, correct for any alignment. The host side
picks ``VEC`` (``vector_width``). Values are computed in f32 whatever the element type ``DT``
(a dtype constexpr argument of the chunk functions).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import bool_, f32, u32
from kaio_ops._arrays import Operand

VECTOR_BYTES = 16


def vector_width(*operands: Operand, multiple_of: int = 0) -> int:
    """``VEC`` for kernels on these operands: the elements of one 16-byte access when every
    operand starts on a 16-byte boundary and ``multiple_of`` (a row length, say, that chunks
    must not straddle; 0 for none) is a multiple of it, else 1 (the scalar path)."""
    vec = VECTOR_BYTES // operands[0].dtype.itemsize
    ok = multiple_of % vec == 0 and all(op.aligned(VECTOR_BYTES) for op in operands)
    return vec if ok else 1


def widths(dtype) -> tuple:
    """The ``VEC`` values kernels are specialized for with element type ``dtype``."""
    return (1, VECTOR_BYTES // dtype.itemsize)


@kaio.gpu_func
def load_f32(
    dst: f32[:], at: kaio.constexpr, src: DT[:], i: u32, VEC: kaio.constexpr, DT: kaio.constexpr
):
    """dst[at : at + VEC] = src[i : i + VEC] converted to f32 (one vector load when VEC > 1)."""
    raw = kaio.local(DT, (VEC,))
    if VEC == 1:
        raw[0] = src[i]
    else:
        kaio.load_vector(raw, src, i)
    for j in kaio.static_range(VEC):
        dst[at + j] = f32(raw[j])


@kaio.gpu_func
def fetch(
    VEC: kaio.constexpr, raw: DT[:, :], k: kaio.constexpr, src: DT[:], i: u32, DT: kaio.constexpr
):
    """raw[k] = src[i : i + VEC] as stored (one vector load when VEC > 1)."""
    if VEC == 1:
        raw[k, 0] = src[i]
    else:
        kaio.load_vector(raw[k], src, i)


@kaio.gpu_func
def store_f32(
    dst: DT[:], i: u32, src: f32[:], at: kaio.constexpr, VEC: kaio.constexpr, DT: kaio.constexpr
):
    """dst[i : i + VEC] = src[at : at + VEC] rounded to DT (one vector store when VEC > 1)."""
    raw = kaio.local(DT, (VEC,))
    for j in kaio.static_range(VEC):
        raw[j] = src[at + j]
    if VEC == 1:
        dst[i] = raw[0]
    else:
        kaio.store_vector(dst, i, raw)


@kaio.gpu_func
def thread_element(rows: u32, cols: u32) -> tuple[bool_, u32, u32]:
    """``(inside, row, col)``: the element of a row-major [rows, cols] matrix that this thread
    owns when a 1-D grid gives each thread one element, block after block, and whether the
    matrix has it (the last block may reach past its end)."""
    i = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    return i < rows * cols, i // cols, i % cols


@kaio.gpu_func
def store_cols(
    dst: DT[:, :], row: u32, col: u32, v: DT[:], n: u32, vec: bool_, E: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """dst[row, col .. col + E - 1] = v[0 .. E - 1], the columns below ``n`` only: one vector
    store when ``vec`` (the caller vouches that the address is aligned and that the chunk
    lies inside whenever ``col < n``), else element by element."""
    if vec:
        if col < n:
            kaio.store_vector(dst, (row, col), v)
    else:
        for e in kaio.static_range(E):
            if col + e < n:
                dst[row, col + e] = v[e]


@kaio.gpu_func
def lanes_sum(v: f32, LANES: kaio.constexpr) -> f32:
    """The sum of ``v`` over each aligned group of ``LANES`` lanes (a power of two, 2 to 32),
    in every lane of the group (the same bits in each): ``shfl_xor`` LANES / 2, ..., 2, 1."""
    for k in kaio.static_range(5):
        if (16 >> k) < LANES:
            v += kaio.shfl_xor(v, 16 >> k)
    return v


@kaio.gpu_func
def lanes_max(v: f32, LANES: kaio.constexpr) -> f32:
    """The max of ``v`` over each aligned group of ``LANES`` lanes (as ``lanes_sum``)."""
    for k in kaio.static_range(5):
        if (16 >> k) < LANES:
            v = kaio.max(v, kaio.shfl_xor(v, 16 >> k))
    return v


@kaio.gpu_func
def warp_sum(v: f32) -> f32:
    """The sum of ``v`` over the warp, in every lane (the same bits in each)."""
    return lanes_sum(v, 32)


@kaio.gpu_func
def block_sum(v: f32, red: f32[:]) -> f32:
    """The sum of ``v`` over the block, in every thread. ``red``: a shared f32[32] that no
    other reduction of this kernel uses. The block is a whole number of warps."""
    v = warp_sum(v)
    if kaio.lane_id() == 0:
        red[kaio.warp_id()] = v
    kaio.sync_threads()
    lane = kaio.lane_id()
    v = red[lane] if lane < (kaio.block_dim_x() >> 5) else 0.0
    return warp_sum(v)


@kaio.gpu_func
def merge_max_sum(m: f32, s: f32, m2: f32, s2: f32) -> tuple[f32, f32]:
    """The running ``(max, sum of exp(v - max))`` pair ``(m, s)`` merged with ``(m2, s2)``."""
    top = kaio.max(m, m2)
    return top, s * kaio.exp(m - top) + s2 * kaio.exp(m2 - top)


@kaio.gpu_func
def warp_max_sum(m: f32, s: f32) -> tuple[f32, f32]:
    """The ``(max, sum of exp(v - max))`` pairs of the warp's lanes merged, in every lane."""
    for k in kaio.static_range(5):
        m, s = merge_max_sum(m, s, kaio.shfl_xor(m, 16 >> k), kaio.shfl_xor(s, 16 >> k))
    return m, s


@kaio.gpu_func
def block_max_sum(m: f32, s: f32, red_m: f32[:], red_s: f32[:]) -> tuple[f32, f32]:
    """The ``(max, sum of exp(v - max))`` pairs of the block's threads merged, in every
    thread. ``red_m``, ``red_s``: shared f32[32] arrays."""
    m, s = warp_max_sum(m, s)
    lane = kaio.lane_id()
    if lane == 0:
        red_m[kaio.warp_id()] = m
        red_s[kaio.warp_id()] = s
    kaio.sync_threads()
    m = LOWEST
    s = 0.0
    if lane < (kaio.block_dim_x() >> 5):
        m = red_m[lane]
        s = red_s[lane]
    return warp_max_sum(m, s)


LOG2E = 1.4426950408889634  # exp(v) = exp2_ftz(v * LOG2E): one instruction
LOWEST = -3.0e38  # the start of a running max: finite, so exp(LOWEST - LOWEST) is 1, not NaN
