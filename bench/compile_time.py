"""Compile time: Python source to PTX for a 40-line kernel, first call in a fresh process
(imports excluded) and repeat calls served by the in-memory cache.

Both are timed in several fresh processes, each as wall time and as CPU time (the process's
own, all threads, and that of any child process it waited for); the median and the fastest
process of each are kept. The targets are read on the fastest process's CPU time, which is
robust to the two ways a busy host slows a process: waiting for a core (in wall time only:
seen on a 2-core machine with busy loops) and a process that runs slower as a whole (in CPU
time too: seen on the GPU machines, where 74 fresh processes took 40.5 to 162 ms; the fastest
of 15 of them was under 43.0 ms in 99% of draws, the fastest of 5 under 59.8). More compile
work slows every process, the fastest too.

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


# figure -> (the child's wall-time key, its CPU-time key, unit)
FIGURES = {
    "first_compile": ("first_ms", "first_cpu_ms", "ms"),
    "cached_ptx_call": ("repeat_us", "repeat_cpu_us", "us"),
}


def measure(runs: int = 15) -> dict:
    """Run the measurement in ``runs`` fresh processes, one after the other; report each
    figure's median and fastest, in wall time and in CPU time (``first_compile_ms``,
    ``first_compile_min_ms``, ``first_compile_cpu_ms``, ``first_compile_cpu_min_ms``, ...)."""
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
    r = {"kernel": "bench/kernels40.py::rms_norm_rows (40 lines)"}
    for name, (wall, cpu, unit) in FIGURES.items():
        for kind, key in (("", wall), ("cpu_", cpu)):
            values = [x[key] for x in results]
            r[f"{name}_{kind}{unit}"] = statistics.median(values)
            r[f"{name}_{kind}min_{unit}"] = min(values)
    return {**r, "ptx_lines": results[0]["ptx_lines"], "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    r = measure(args.runs)
    print(f"{'what':<40} {'CPU: fastest':>12} {'median':>8} {'wall: fastest':>14} {'median':>8}")
    for name, what in (("first_compile", "source -> PTX, first call"),
                       ("cached_ptx_call", "repeat ptx() from the cache")):  # fmt: skip
        unit = FIGURES[name][2]
        cells = [r[f"{name}_{k}{unit}"] for k in ("cpu_min_", "cpu_", "min_", "")]
        print(f"{what + ' (' + unit + ')':<40} {cells[0]:>12.2f} {cells[1]:>8.2f} "
              f"{cells[2]:>14.2f} {cells[3]:>8.2f}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
