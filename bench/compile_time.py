"""Compile time: Python source to PTX for a 40-line kernel, first call in a fresh process
(imports excluded) and repeat calls served by the in-memory cache.

Both are timed twice over: wall time, and CPU time (the process's own, all threads, and that
of any child process it waited for). On a busy host the wall time also counts the time the
process waited for a core; the CPU time counts only the work the compile did, so the targets
are read on it, with the wall time beside it (well above the CPU time: the host was busy). The
fastest wall time of the processes is kept too: under a load that comes and goes it is the
figure least touched by it.

    python bench/compile_time.py [--out results.json] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {bench!r})
import kaio, kernels40                      # imports are excluded from the timing

def cpu():
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime

k = kernels40.rms_norm_rows
c0, t0 = cpu(), time.perf_counter()
ptx = k.ptx(arch="sm_90")
t1, c1 = time.perf_counter(), cpu()
n = 20000
c2, t2 = cpu(), time.perf_counter()
for _ in range(n):
    k.ptx(arch="sm_90")
t3, c3 = time.perf_counter(), cpu()
print(json.dumps({{"first_ms": (t1 - t0) * 1e3, "first_cpu_ms": (c1 - c0) * 1e3,
                  "repeat_us": (t3 - t2) / n * 1e6, "repeat_cpu_us": (c3 - c2) / n * 1e6,
                  "ptx_lines": ptx.count("\n")}}))
"""


BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def measure(runs: int = 7) -> dict:
    """Run the measurement in ``runs`` fresh processes, one after the other; report the median
    of each figure, and the fastest first call."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here]))
    # one BLAS thread: a pool left spinning after the imports' numpy work would add its own
    # CPU time to the compile's (measured: 32 ms of wall time, 40 ms of CPU time)
    env.update(dict.fromkeys(BLAS_THREADS, "1"))
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
        return statistics.median(r[key] for r in results)

    return {
        "kernel": "bench/kernels40.py::rms_norm_rows (40 lines)",
        "first_compile_ms": median("first_ms"),
        "first_compile_min_ms": min(r["first_ms"] for r in results),
        "first_compile_cpu_ms": median("first_cpu_ms"),
        "cached_ptx_call_us": median("repeat_us"),
        "cached_ptx_call_cpu_us": median("repeat_cpu_us"),
        "ptx_lines": results[0]["ptx_lines"],
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    r = measure(args.runs)
    rows = [
        ("source -> PTX, first call, CPU time", r["first_compile_cpu_ms"], "ms"),
        ("source -> PTX, first call, wall time", r["first_compile_ms"], "ms"),
        (f"  the fastest of the {r['runs']} processes", r["first_compile_min_ms"], "ms"),
        ("repeat ptx() from the cache, CPU time", r["cached_ptx_call_cpu_us"], "us"),
        ("repeat ptx() from the cache, wall time", r["cached_ptx_call_us"], "us"),
    ]
    print(f"{'what (median of the processes)':<44} {'figure':>12}")
    for what, value, unit in rows:
        print(f"{what:<44} {value:>9.2f} {unit}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
