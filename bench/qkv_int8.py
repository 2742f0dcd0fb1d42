"""``qkv_project_int8`` (W8A16: f16 x, int8 weights, f16 q/k/v) at prefill sizes on the
Llama-3-8B QKV shape (K = 4096 -> 4096 + 1024 + 1024), each route timed beside the others:

- ``routed``: the op as shipped (on sm_90 past 16 rows: the weights widened to f16 once,
  ``kaio_ops._prefill``, then one ``wgmma`` matmul whose epilogue writes the three scaled
  outputs);
- ``mma.sync``: the fused ``qkv_kernel`` (``mma.sync``, the weights made f16 in registers),
  what runs where the routed path does not apply;
- ``widen only``: ``_prefill.int8_to_f16`` alone (the routed path's first launch);
- ``cuBLAS f16``: ``x @ W`` with the f16 weights side by side (already made: no widening),
  three column slices scaled (the peer that reads f16 weights);
- ``W8A8 int8 wgmma``: ``matmul_int8`` of x already quantized to int8 and the weights side by
  side (a different contract, f32 out, for reference: what int8 activations would give).

Kernel time with CUDA events (``bench.fp8_plans.time_all``: interleaved rounds, batches queued
behind a GPU spin). Each route is checked against float64 first (the int8 reference: its own).
Usage: ``python bench/qkv_int8.py --out DIR [--ms 1024,4096]``; writes ``DIR/qkv_int8.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.fp8_plans import time_all  # noqa: E402
from kaio.types import i8  # noqa: E402
from kaio_ops import _arrays, _prefill  # noqa: E402
from kaio_ops import quantized as Q  # noqa: E402

K = 4096
WIDTHS = (4096, 1024, 1024)
SCALES = (0.01, 0.02, 0.005)


def mma_sync(x, wq, wk, wv):
    """The fused ``qkv_kernel`` route (``_prefill`` declined)."""
    inputs = _arrays.Inputs("qkv_project_int8")
    xo = Q._activations(inputs, x, "x")
    ws = [
        Q._int8_weights(inputs, xo, w, "w", s, "s")
        for w, s in zip((wq, wk, wv), SCALES, strict=True)
    ]
    keep = Q._prefill.fits_int8
    Q._prefill.fits_int8 = lambda *a: False
    try:
        return tuple(Q._project(xo, ws, 8))
    finally:
        Q._prefill.fits_int8 = keep


def widen_only(x, wq, wk, wv):
    """The routed path's widening launch alone."""
    inputs = _arrays.Inputs("bench")
    xo = inputs.array(x, "x")
    ws = [inputs.array(w, f"w{i}", dtypes=(i8,)) for i, w in enumerate((wq, wk, wv))]
    return _prefill.int8_to_f16(xo, ws)


def run_case(m: int, log, gpu: str) -> None:
    """Check and time every route at M = ``m``; one jsonl line and one printed line."""
    torch.manual_seed(m)
    x = torch.randn(m, K, device="cuda").half()
    ws = [torch.randint(-128, 128, (K, n), device="cuda", dtype=torch.int8) for n in WIDTHS]
    w16 = torch.cat(ws, 1).half()
    w8 = torch.cat(ws, 1).contiguous()
    x8 = (x.float() / (x.float().abs().amax() / 127.0)).round().clamp(-127, 127).to(torch.int8)
    cols = [0, WIDTHS[0], WIDTHS[0] + WIDTHS[1], sum(WIDTHS)]
    ref = x.double() @ w16.double()
    refs = [ref[:, cols[i] : cols[i + 1]] * s for i, s in enumerate(SCALES)]

    def cublas(x, *_):
        y = x @ w16
        return tuple(y[:, cols[i] : cols[i + 1]] * s for i, s in enumerate(SCALES))

    fns = {
        "routed": lambda x, a, b, c: kaio_ops.qkv_project_int8(x, a, b, c, *SCALES),
        "mma.sync": mma_sync,
        "widen only": widen_only,
        "cuBLAS f16": cublas,
        "W8A8 int8 wgmma": lambda *_: kaio_ops.matmul_int8(x8, w8, 1.0),
    }
    rec = {"case": f"M={m} K={K} N={'+'.join(map(str, WIDTHS))}", "m": m, "gpu": gpu}
    sets = [(x, *ws)]
    routed = fns["routed"](*sets[0])
    for name in ("routed", "mma.sync", "cuBLAS f16"):
        got = fns[name](*sets[0])
        errs = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, refs, strict=True)]
        rec[name] = {"err": max(errs)}
        if name == "mma.sync":  # both exact products summed in f32: rounding apart
            diffs = [
                (g.float() - r.float()).abs().max().item() for g, r in zip(got, routed, strict=True)
            ]
            rec[name]["max_abs_vs_routed"] = max(diffs)
    assert torch.equal(widen_only(*sets[0]), w16)
    rec["widen only"] = {"err": 0.0}
    rec["W8A8 int8 wgmma"] = {}
    ms = time_all(fns, sets)
    flops = 2.0 * m * K * sum(WIDTHS)
    for name, t in ms.items():
        rec[name].update(us=t * 1e3, tflops=flops / (t * 1e-3) / 1e12)
    for name in ("routed", "mma.sync", "W8A8 int8 wgmma"):
        rec[name]["vs_cublas_f16"] = ms["cuBLAS f16"] / ms[name]
    log.write(json.dumps(rec) + "\n")
    log.flush()
    times = [
        f"{k} {v['us']:.1f} us {v['tflops']:.0f} T"
        for k, v in rec.items()
        if isinstance(v, dict) and "us" in v
    ]
    speedup = ms["mma.sync"] / ms["routed"]
    print(f"{rec['case']} ({gpu}): " + " | ".join(times) + f" | routed {speedup:.2f}x mma.sync")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--ms", default="1024,4096")
    args = p.parse_args()
    log = open(os.path.join(args.out, "qkv_int8.jsonl"), "a")  # noqa: SIM115
    for m in (int(v) for v in args.ms.split(",")):
        run_case(m, log, torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
