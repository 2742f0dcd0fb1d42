"""A 40-line kernel for the compile-time benchmark: a row-wise RMS norm with a block
reduction through shared memory and warp shuffles."""

import kaio
from kaio import f32, u32


@kaio.gpu_func
def warp_sum(v: f32) -> f32:
    for k in kaio.static_range(5):
        v += kaio.shfl_xor(v, 16 >> k)
    return v


@kaio.gpu_kernel(block_size=256)
def rms_norm_rows(x: f32[:, :], w: f32[:], out: f32[:, :], eps: f32):
    partial = kaio.shared(f32, (8,))
    row = kaio.block_idx_x()
    t = kaio.thread_idx_x()
    n = u32(x.shape[1])
    acc = 0.0
    i = t
    while i < n:
        v = x[row, i]
        acc += v * v
        i += 256
    acc = warp_sum(acc)
    if kaio.lane_id() == 0:
        partial[kaio.warp_id()] = acc
    kaio.sync_threads()
    total = 0.0
    if t < 32:
        total = partial[t] if t < 8 else 0.0
        total = warp_sum(total)
        if t == 0:
            partial[0] = total
    kaio.sync_threads()
    scale = kaio.rsqrt(partial[0] / f32(n) + eps)
    i = t
    while i < n:
        out[row, i] = x[row, i] * scale * w[i]
        i += 256
