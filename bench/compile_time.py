"""Compile time: Python source to PTX for a 40-line kernel, first call in a fresh process
(imports excluded) and repeat calls served by the in-memory cache.

    python bench/compile_time.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import time, json, sys
sys.path.insert(0, {bench!r})
import kaio, kernels40                      # imports are excluded from the timing
k = kernels40.rms_norm_rows
t0 = time.perf_counter(); ptx = k.ptx(arch="sm_90"); t1 = time.perf_counter()
n = 20000
t2 = time.perf_counter()
for _ in range(n):
    k.ptx(arch="sm_90")
t3 = time.perf_counter()
print(json.dumps({{"first_ms": (t1 - t0) * 1e3, "repeat_us": (t3 - t2) / n * 1e6,
                  "ptx_lines": ptx.count("\n")}}))
"""


def measure(runs: int = 5) -> dict:
    """Run the measurement in ``runs`` fresh processes; report the median of each figure."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    results = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _CHILD.format(bench=here)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))

    def median(key):
        return sorted(r[key] for r in results)[len(results) // 2]

    return {
        "kernel": "bench/kernels40.py::rms_norm_rows (40 lines)",
        "first_compile_ms": median("first_ms"),
        "cached_ptx_call_us": median("repeat_us"),
        "ptx_lines": results[0]["ptx_lines"],
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    r = measure(args.runs)
    print(f"{'what':<40} {'figure':>12}")
    print(f"{'source -> PTX, first call (fresh process)':<40} {r['first_compile_ms']:>9.1f} ms")
    print(f"{'repeat ptx() from the in-memory cache':<40} {r['cached_ptx_call_us']:>9.2f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
