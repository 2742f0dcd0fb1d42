"""Simulator speed: simulated thread-instructions per second on an elementwise kernel, on a
shared-memory reduction and on ``kaio_ops.matmul_tc_async`` at 128 x 128 x 128
(f16: ``cp.async``, ``ldmatrix``, ``mma.sync``); CPU only, under a minute.

    python bench/sim_speed.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import kaio
import kaio_ops
from kaio import f32, u32
from kaio.sim import engine

BLOCK = 256
MM = 128  # the simulated matmul's M = N = K


@kaio.gpu_kernel(block_size=BLOCK)
def silu_gate(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        xi = x[i]
        out[i] = xi / (1.0 + kaio.exp(-xi)) * gate[i]


@kaio.gpu_kernel(block_size=BLOCK)
def block_sum(x: f32[:], out: f32[:], n: u32):
    s = kaio.shared(f32, (BLOCK,))
    t = kaio.thread_idx_x()
    i = kaio.block_idx_x() * BLOCK + t
    s[t] = x[i] if i < n else 0.0
    kaio.sync_threads()
    stride = BLOCK // 2
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        kaio.sync_threads()
        stride //= 2
    if t == 0:
        out[kaio.block_idx_x()] = s[0]


def simulated_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``kaio_ops.matmul_tc_async(a, b)`` on the simulator."""
    with kaio.simulate():
        return kaio_ops.matmul_tc_async(a, b)


def count_thread_instructions(run) -> int:
    """Active lanes summed over every executed instruction, counted in a separate run."""
    counted = [0]
    original = engine.Machine._instr

    def counting(m, ins):
        counted[0] += int(np.count_nonzero(m.mask))
        yield from original(m, ins)

    engine.Machine._EXEC[engine.Instr] = counting
    try:
        run()
    finally:
        engine.Machine._EXEC[engine.Instr] = original
    return counted[0]


def measure(name: str, run, repeats: int = 3) -> dict:
    run()  # compile and warm up
    work = count_thread_instructions(run)
    best = min(_timed(run) for _ in range(repeats))
    return {"kernel": name, "thread_instructions": work, "seconds": best, "rate": work / best}


def _timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 20, help="elements (default 2**20)")
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    x, gate = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = np.empty(n, np.float32)
    grid = -(-n // BLOCK)
    sums = np.empty(grid, np.float32)
    a, b = (rng.standard_normal((MM, MM)).astype(np.float16) for _ in "ab")
    results = [
        measure("elementwise silu_gate", lambda: silu_gate.sim[grid](x, gate, out, n)),
        measure("shared-memory block_sum", lambda: block_sum.sim[grid](x, sums, n)),
        measure(f"tensor-core matmul {MM}^3 f16", lambda: simulated_matmul(a, b)),
    ]
    print(f"{'kernel':<34} {'thread-instr':>14} {'seconds':>9} {'thread-instr/s':>15}")
    for r in results:
        work, secs, rate = r["thread_instructions"], r["seconds"], r["rate"]
        print(f"{r['kernel']:<34} {work:>14,} {secs:>9.3f} {rate:>15.3e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"n": n, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
