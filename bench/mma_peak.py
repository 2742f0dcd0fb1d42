"""The mma.sync instruction ceiling: a register-only loop of m16n8k16 tensor-core steps, written
in the kaio DSL. No memory traffic in the loop, 8 independent accumulators per warp to cover
the instruction's latency. The figure matmul kernels are compared against ("% of what the
instruction can do"). Usage: ``python bench/mma_peak.py``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
from kaio import f32, u32  # noqa: E402

CHAINS = 8
WARPS = 8


@kaio.gpu_kernel(block_size=WARPS * 32)
def mma_loop(out: f32[:], iters: u32, BF16: kaio.constexpr):
    """CHAINS independent accumulators, each stepped ``iters`` times."""
    tid = kaio.thread_idx_x()
    a = kaio.local(u32, 4)
    b = kaio.local(u32, 2)
    acc = kaio.local(f32, (CHAINS, 4))
    for i in kaio.static_range(4):
        a[i] = (tid * 2654435761 + i) & 0x3BFF3BFF  # small finite halves, unknown to the compiler
    for i in kaio.static_range(2):
        b[i] = (tid * 40503 + i) & 0x3BFF3BFF
    for c in kaio.static_range(CHAINS):
        for e in kaio.static_range(4):
            acc[c, e] = 0.0
    for _ in range(iters):
        for c in kaio.static_range(CHAINS):
            if BF16:
                kaio.mma_bf16(acc[c], a, b, acc[c])
            else:
                kaio.mma_f16(acc[c], a, b, acc[c])
    total = f32(0.0)
    for c in kaio.static_range(CHAINS):
        for e in kaio.static_range(4):
            total += acc[c, e]
    out[kaio.block_idx_x() * WARPS * 32 + tid] = total


def mma_peak_tflops(iters: int = 4096) -> dict:
    """Measured TFLOP/s of the loop for f16 and bf16 on the current GPU (CUDA events)."""
    dev = kaio.device()
    blocks = dev.multiprocessor_count * 4
    out = kaio.empty(blocks * WARPS * 32, f32)
    result = {}
    for name, bf16 in (("f16", False), ("bf16", True)):
        launch = mma_loop[blocks]
        launch(out, iters, BF16=bf16)  # compile and warm up
        start, end = kaio.Event(), kaio.Event()
        best = None
        for _ in range(5):
            start.record()
            launch(out, iters, BF16=bf16)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            best = ms if best is None else min(best, ms)
        flops = blocks * WARPS * iters * CHAINS * 2 * 16 * 8 * 16
        result[name] = round(flops / best / 1e9, 1)
    return result


if __name__ == "__main__":
    print(f"mma.sync m16n8k16 register-only loop on {kaio.device().name}: {mma_peak_tflops()}")
