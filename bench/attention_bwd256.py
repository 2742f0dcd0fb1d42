"""Head dim 256 flash-attention backward on an sm_90 GPU: ``kaio_ops.flash_attention_bwd``
(as shipped, and the variants named) against torch SDPA's flash backward, in one process,
with CUDA events. TFLOP/s at 2.5x the forward's 4 B H Sq Sk D (halved when causal).

Usage: ``python bench/attention_bwd256.py [--dtypes float16,bfloat16] [--seqs 1024,4096,16384]
[--variants shipped,mma.sync,pair,fused] [--out FILE.json] [--check]``: H 16 at S 1024 (B
16), 4096 (B 4), 16384 (B 1); ``--check`` compares each variant's gradients with SDPA's
first (the largest difference over the largest of SDPA's). ``--tiny pair,fused``: each
schedule once at small sizes against float64 (for compute-sanitizer; with ``--dtypes`` and
``--causal``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.attention_hopper import time_calls  # noqa: E402

SCHEDULES = {"pair": 0, "fused": 1}  # _attention_hopper_bwd256.FUSED forced
BATCH = {1024: 16, 2048: 8, 4096: 4, 8192: 2, 16384: 1}


def variant(name: str):
    """(do, q, k, v, o, lse, causal) -> (dq, dk, dv): ``shipped`` the public op, ``mma.sync``
    the op with the Hopper kernels off, ``pair`` and ``fused`` the D 256 wgmma kernels with
    that schedule (``_attention_hopper_bwd256.FUSED``), else the op unplanned."""
    import kaio_ops
    from kaio_ops import _attention_hopper_bwd256 as hopper_bwd256
    from kaio_ops import attention

    raw = attention.flash_attention_bwd.__wrapped__

    def run(do, q, k, v, o, lse, causal):
        if name == "shipped":
            return kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal)
        if name in SCHEDULES:
            saved, hopper_bwd256.FUSED = hopper_bwd256.FUSED, SCHEDULES[name]
            try:
                return raw(do, q, k, v, o, lse, causal)
            finally:
                hopper_bwd256.FUSED = saved
        os.environ["KAIO_HOPPER_ATTENTION"] = "0" if name == "mma.sync" else "1"
        try:
            return raw(do, q, k, v, o, lse, causal)
        finally:
            del os.environ["KAIO_HOPPER_ATTENTION"]

    return run


def sdpa_grads(q, k, v, do, causal):
    """SDPA flash's output and a function computing its gradients."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = sdpa(*leaves, is_causal=causal)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def tiny(schedules: str, dtypes: str = "float16,bfloat16", masks: str = "0,1") -> None:
    """Each schedule (``pair``, ``fused``) once per case at small sizes (``dtypes``, ``masks``
    causal or not, grouped-query heads, partial tiles, Sq != Sk), against float64 autograd:
    for compute-sanitizer."""
    import torch

    import kaio_ops
    from kaio.types import f32
    from kaio_ops import _arrays, attention
    from kaio_ops import _attention_hopper_bwd256 as hopper_bwd256
    from tests.test_ops_attention import _rel_t, _sdpa64

    for dtype in dtypes.split(","):
        for causal in [bool(int(c)) for c in masks.split(",")]:
            gen = torch.Generator(device="cuda").manual_seed(1)
            dt = getattr(torch, dtype)
            q, do = (torch.randn((1, 4, 200, 256), device="cuda", dtype=dt, generator=gen)
                     for _ in "qo")  # fmt: skip
            k, v = (torch.randn((1, 2, 300, 256), device="cuda", dtype=dt, generator=gen)
                    for _ in "kv")  # fmt: skip
            o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
            leaves = [x.double().requires_grad_() for x in (q, k, v)]
            _sdpa64(*leaves, causal, group=2).backward(do.double())
            inputs = _arrays.Inputs("tiny")
            (qa, ka, va), dims, scale = attention._check_flash("tiny", q, k, v, None, inputs)
            da = inputs.array(do, "do", ndim=4)
            la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
            delta = (o.float() * do.float()).sum(-1).reshape(-1)
            for name in schedules.split(","):
                cfg = {"dkdv": {"DQ": SCHEDULES[name]}}
                grads = hopper_bwd256.launch(qa, ka, va, da, la, delta, dims, causal, scale, cfg)
                errs = [_rel_t(g, x.grad) for g, x in zip(grads, leaves, strict=True)]
                print(f"tiny {dtype} {name} causal={causal}: rel {errs}", flush=True)


def main() -> None:
    import torch

    import kaio_ops

    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--seqs", default="4096,1024,16384")
    p.add_argument("--causal", default="0,1")
    p.add_argument("--variants", default="shipped")
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out")
    p.add_argument("--tiny", help="schedules to run once at small sizes (pair,fused)")
    a = p.parse_args()
    if a.tiny:
        return tiny(a.tiny, a.dtypes, a.causal)
    gpu = torch.cuda.get_device_name()
    rows = []
    d, h = a.d, a.heads
    for s in [int(x) for x in a.seqs.split(",")]:
        b = BATCH[s]
        for dtype in a.dtypes.split(","):
            dt = getattr(torch, dtype)
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn((b, h, s, d), device="cuda", dtype=dt, generator=gen)
                           for _ in range(4))  # fmt: skip
            for causal in [bool(int(c)) for c in a.causal.split(",")]:
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
                ref = sdpa_grads(q, k, v, do, causal)
                ref_ms = time_calls(ref, reps=3)
                row = dict(gpu=gpu, dtype=dtype, d=d, b=b, h=h, s=s, causal=causal,
                           sdpa_ms=ref_ms, sdpa=flops / ref_ms / 1e9)  # fmt: skip
                want = ref() if a.check else None
                for name in a.variants.split(","):
                    fn = variant(name)
                    if want is not None:
                        got = fn(do, q, k, v, o, lse, causal)
                        errs = [float((g.float() - w.float()).abs().max() / w.float().abs().max())
                                for g, w in zip(got, want, strict=True)]  # fmt: skip
                        row[f"{name}_err"] = max(errs)
                    args = (do, q, k, v, o, lse, causal)
                    ms = time_calls(lambda fn=fn, args=args: fn(*args), reps=3)
                    row[f"{name}_ms"], row[name] = ms, flops / ms / 1e9
                    row[f"{name}/sdpa"] = ref_ms / ms
                rows.append(row)
                print(json.dumps(row), flush=True)
                del ref
                if a.out:
                    with open(a.out, "w") as f:
                        json.dump(rows, f, indent=1)
    print(f"\n{gpu}: head dim {d} backward, TFLOP/s (x SDPA flash)")
    for r in rows:
        cells = "  ".join(f"{n} {r[n]:.0f} ({r[n + '/sdpa']:.2f}x)" for n in a.variants.split(","))
        print(f"{r['dtype']:9} S{r['s']:5} {'causal' if r['causal'] else 'full  '}  "
              f"sdpa {r['sdpa']:.0f}  {cells}")  # fmt: skip


if __name__ == "__main__":
    main()
