"""Host time per call and GPU time of ``flash_attention`` on the Hopper route (issue 31).

For each shape: host µs per call (``--calls`` calls in a row, no synchronisation between,
timed on the host) of ``_attention_hopper.launch`` (what bench/attention_hopper.py's grid
calls: checks done by the caller, no call plan), of ``flash_attention`` unplanned
(``flash_attention.__wrapped__``: checks, routing, launch) and planned (the op as users
call it), each with the tensor maps' bytes kept (``kaio.tensormap.MAPS_KEPT``, the
default) and encoded on every call (``MAPS_KEPT = 0``: what every unplanned call did
before); the wall µs per call of a stream of such calls (CUDA events: the larger of host and
GPU time), and the kernel's GPU µs (CUDA events around calls queued behind a
``torch.cuda._sleep``, so that the GPU never waits for the host). Also torch SDPA's GPU µs
on the same inputs. ``python3 bench/attention_host.py [--out results.json]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

import torch
import torch.nn.functional as F

import kaio_ops
from kaio_ops import _attention_hopper as hopper
from kaio_ops import attention

tensormap = importlib.import_module("kaio.tensormap")

SHAPES = [  # (B, H, Hkv, S, D, causal)
    (1, 32, 32, 1024, 128, False),
    (1, 32, 32, 1024, 64, True),
    (1, 32, 8, 1, 128, False),  # decode: q [1, 32, 1, 128], kv 512 (the mma.sync route)
]


def host_us(fn, calls: int) -> float:
    """Host µs per call of ``calls`` calls in a row (the GPU queue absorbs them)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def events_us(fn, calls: int, sleep: bool) -> float:
    """µs per call between CUDA events around ``calls`` calls; with ``sleep`` they are
    queued behind a spin of the GPU (their GPU time), else as they come (wall time)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if sleep:
        torch.cuda._sleep(60_000_000)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def shape_rows(b: int, h: int, hkv: int, s: int, d: int, causal: bool, n: int) -> list:
    """The rows of one shape: every call, with the maps kept and encoded each call."""
    rows = []
    kept = tensormap.MAPS_KEPT
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    sk = 512 if s == 1 else s
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=gen)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, generator=gen)
            for _ in range(2))  # fmt: skip
    (qa, ka, va), dims, scale = attention._check_flash("bench", q, k, v, None)
    routed = attention.hopper_takes(qa, dims)
    calls = {
        "flash_attention (planned)": lambda: kaio_ops.flash_attention(q, k, v, causal),
        "flash_attention unplanned": lambda: kaio_ops.flash_attention.__wrapped__(q, k, v, causal),
    }
    if routed:
        calls["_attention_hopper.launch"] = lambda: hopper.launch(qa, ka, va, dims, causal, scale)
    name = f"B{b} H{h}/{hkv} S{s} Sk{sk} D{d}{' causal' if causal else ''}"
    ref = F.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(h // hkv, 1),
        v.float().repeat_interleave(h // hkv, 1), is_causal=causal,
    )  # fmt: skip
    err = (kaio_ops.flash_attention(q, k, v, causal).float() - ref).abs().max().item()
    for what, fn in calls.items():
        for maps in ("kept", "encoded each call"):
            tensormap.MAPS_KEPT = kept if maps == "kept" else 0
            tensormap._KEPT.clear()
            for _ in range(20):
                fn()
            host = min(host_us(fn, n) for _ in range(3))
            wall = min(events_us(fn, 50, False) for _ in range(2))
            gpu = min(events_us(fn, 50, True) for _ in range(2))
            rows.append({"shape": name, "route": "hopper" if routed else "mma.sync",
                         "call": what, "maps": maps, "host_us": host, "wall_us": wall,
                         "gpu_us": gpu, "max_err": err})  # fmt: skip
            if not routed:
                break  # no tensor maps on this route
    tensormap.MAPS_KEPT = kept
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # noqa: E731
    for _ in range(5):
        sdpa()
    rows.append({"shape": name, "route": "torch", "call": "F.sdpa", "maps": "-",
                 "host_us": min(host_us(sdpa, n) for _ in range(3)),
                 "wall_us": events_us(sdpa, 50, False), "gpu_us": events_us(sdpa, 50, True),
                 "max_err": 0.0})  # fmt: skip
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}")
    print(f"{'shape':34} {'route':8} {'call':28} {'maps':18} host µs  wall µs  GPU µs")
    rows = []
    for shape in SHAPES:  # each shape's rows printed as they come (a cut run keeps them)
        for r in shape_rows(*shape, args.calls):
            rows.append(r)
            print(f"{r['shape']:34} {r['route']:8} {r['call']:28} {r['maps']:18} "
                  f"{r['host_us']:7.1f}  {r['wall_us']:7.1f}  {r['gpu_us']:6.1f}  "
                  f"err {r['max_err']:.1e}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": dev, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
