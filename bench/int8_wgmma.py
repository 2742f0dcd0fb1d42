"""``matmul_int8`` (W8A8, exact s32 sums) on sm_90: the wgmma kernel (``kaio_ops._int8_hopper``)
against the ``mma.sync`` kernel and ``torch._int_mm`` (cuBLASLt int8), at N = K = 4096 over M.
Each result is first checked bit for bit against ``f32(torch._int_mm(a, b)) * scale``. Kernel
time from CUDA graphs (``bench.int4_wgmma.graph_time``); TOP/s count 2 M N K.

Usage: ``python bench/int8_wgmma.py [--out DIR] [--ms 128,4096]``; writes
``DIR/int8_wgmma.jsonl`` and prints a table.
"""

# ruff: noqa: B023  (the timed lambdas run before the loop moves on)
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.int4_wgmma import graph_time  # noqa: E402
from kaio_ops import _int8_hopper, _plan  # noqa: E402

SCALE = 0.37
N = K = 4096


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--ms", default="128,1024,4096,8192")
    args = p.parse_args()
    sink = open(os.path.join(args.out, "int8_wgmma.jsonl"), "w")  # noqa: SIM115
    rows = []
    b = torch.randint(-128, 128, (K, N), device="cuda", dtype=torch.int8)
    for m in (int(x) for x in args.ms.split(",")):
        a = torch.randint(-128, 128, (m, K), device="cuda", dtype=torch.int8)
        ref = torch._int_mm(a, b).float() * SCALE
        rec = {"m": m, "n": N, "k": K, "gpu": torch.cuda.get_device_name()}
        for name, min_m in (("wgmma", 1), ("mma.sync", 1 << 30)):
            _int8_hopper.MIN_M = min_m
            _plan.clear()  # call plans keep the path they were recorded with
            got = kaio_ops.matmul_int8(a, b, SCALE)
            rec[f"{name}_exact"] = bool(torch.equal(got, ref))
            rec[f"{name}_us"] = graph_time(lambda i: kaio_ops.matmul_int8(a, b, SCALE), 1)
        _int8_hopper.MIN_M = 65
        _plan.clear()
        rec["int_mm_us"] = graph_time(lambda i: torch._int_mm(a, b), 1)
        print(json.dumps(rec), flush=True)
        sink.write(json.dumps(rec) + "\n")
        rows.append(rec)
    print(f"\n{'M':>5} {'wgmma TOP/s':>12} {'mma.sync':>9} {'_int_mm':>8}  exact")
    for r in rows:
        ops = 2 * r["m"] * N * K / 1e6
        rates = [ops / abs(r[f"{x}_us"]) for x in ("wgmma", "mma.sync", "int_mm")]
        exact = f"{r['wgmma_exact']} {r['mma.sync_exact']}"
        print(f"{r['m']:>5} {rates[0]:12.0f} {rates[1]:9.0f} {rates[2]:8.0f}  {exact}")


if __name__ == "__main__":
    main()
