"""Floors: kernels that do only part of an op's work (no torch; tested in the simulator).

Timed beside the op and its peers, a floor shows what no implementation can beat under the
same timing, e.g. ``read_words``: the weight traffic of a W4A16 matmul without its product.
"""

from __future__ import annotations

import kaio
from kaio import i32, u32

LOADS = 4  # 16-byte loads a thread of read_words
THREADS = 1024


@kaio.gpu_kernel
def read_words(w: i32[:, :], out: i32[:]):
    """Read every word of ``w`` [R, C] (C % 4 == 0) once and write one XOR a thread: the
    weight traffic of a W4A16 matmul without any of its work. Each thread issues its LOADS
    16-byte loads before it uses one (the last thread's excess loads re-read the last vector)."""
    kaio.launch_bounds(THREADS)
    per_row = u32(w.shape[1]) // 4
    last = u32(w.shape[0]) * per_row - 1
    first = kaio.block_idx_x() * (THREADS * LOADS) + kaio.thread_idx_x()
    frag = kaio.local(i32, (LOADS, 4))
    for k in kaio.static_range(LOADS):
        v = kaio.min(first + k * THREADS, last)
        kaio.load_vector(frag[k], w, (v // per_row, 4 * (v % per_row)))
    acc = i32(0)
    for k in kaio.static_range(LOADS):
        acc = acc ^ frag[k, 0] ^ frag[k, 1] ^ frag[k, 2] ^ frag[k, 3]
    out[kaio.block_idx_x() * THREADS + kaio.thread_idx_x()] = acc


def blocks_for(words: int) -> int:
    """The blocks of ``read_words`` over ``words`` 32-bit words."""
    return -(-words // (4 * THREADS * LOADS))
