"""fwdc's probe for the GPU rounds (temporary, removed before the merge): per-call time of
the forward two ways, in one process: as ``attention_hopper.py grid`` times it (4 calls
between events, the first call's host time inside the window) and queued behind a
``torch.cuda._sleep`` (the GPU never waits for the host: kernel time).

Usage: python bench/_fwdc_probe.py "SPECS" "B,H,HKV,S;..." (grid's spec syntax)."""

import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import attention_hopper as ah  # noqa: E402


def queued(fn, calls=8, rounds=5):
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)  # ~1 ms: longer than the host time of the first call
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]


def main():
    import time

    import torch

    specs, shapes = sys.argv[1], sys.argv[2]
    vs = ah.parse_specs(specs)
    name = torch.cuda.get_device_name()
    for shape in shapes.split(";"):
        b, h, hkv, s = (int(x) for x in shape.split(",")[:4])
        for dtype in dict.fromkeys(dt for _, dt, _, _, _ in vs):
            q, k, v = ah.tensors(b, h, hkv, s, s, 128, dtype)
            for causal in (True, False):
                flops = 4 * b * h * s * s * 128 / (2 if causal else 1)
                fns = {"sdpa flash": partial(ah.sdpa_flash, q, k, v, causal)}
                for label, dt, d, kind, over in vs:
                    if dt == dtype:
                        fns[label] = partial(ah.runner(kind, d, over), q, k, v, causal)
                t0 = time.time()
                host = {}
                for lab, fn in fns.items():  # host time of a call (no sync)
                    fn()
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    for _ in range(20):
                        fn()
                    host[lab] = (time.perf_counter() - t) / 20 * 1e6
                    torch.cuda.synchronize()
                res = {lab: [] for lab in fns}
                for _ in range(3):
                    for lab, fn in fns.items():
                        res[lab].append((ah.time_calls(fn, reps=4, rounds=1), queued(fn)))
                print(
                    f"{name} {dtype} B{b} H{h} S{s}{' causal' if causal else ''} "
                    f"({time.time() - t0:.1f}s): TFLOP/s grid-style / queued, host us"
                )
                for lab, r in res.items():
                    g = sorted(x for x, _ in r)[1]
                    qd = sorted(y for _, y in r)[1]
                    print(
                        f"    {flops / g / 1e9:6.0f} {flops / qd / 1e9:6.0f}  "
                        f"{host[lab]:6.1f}  {lab}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
