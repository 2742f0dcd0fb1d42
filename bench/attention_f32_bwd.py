"""The f32 flash-attention backward (``kaio_ops.attention_flash_bwd``, single head [S, D])
against torch SDPA's memory-efficient backward, in one process, with CUDA events; each
variant's gradients checked against float64 and for the same bits on a second call.
TFLOP/s at 2.5x the forward's 4 S S D (halved when causal), as bench/attention.py counts.

Usage: ``python bench/attention_f32_bwd.py [--seqs 4096] [--dims 128] [--causal 0,1]
[--variants shipped,recompute] [--rotate --rounds N] [--warm]``. ``--warm``: each variant
once at S 128 (the same kernels: to fill kaio's cubin cache in parallel processes).
``NAME=N[+NAME=N]``: the op unplanned with ``kaio_ops.attention``'s module constants set
(``F32_DS_BYTES=0``); ``stored`` and ``recompute`` are short for the op unplanned with dQ
from the stored dS (wherever it fits 4 GiB) and with dQ recomputed (``F32_DS_BYTES`` 0).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.attention_bwd256 import time_rotated  # noqa: E402
from bench.attention_hopper import time_calls  # noqa: E402

SHORT = {"stored": f"F32_DS_BYTES={4 << 30}", "recompute": "F32_DS_BYTES=0"}


def variant(name: str):
    """(do, q, k, v, o, lse, causal) -> (dq, dk, dv): ``shipped`` the public op, else the op
    unplanned with ``kaio_ops.attention``'s constants as named."""
    import kaio_ops
    from kaio_ops import attention

    pairs = [x.split("=") for x in SHORT.get(name, name).split("+")] if name != "shipped" else []

    def run(do, q, k, v, o, lse, causal):
        if not pairs:
            op = kaio_ops.attention_flash_bwd_causal if causal else kaio_ops.attention_flash_bwd
            return op(do, q, k, v, o, lse)
        saved = {c: getattr(attention, c) for c, _ in pairs}
        for const, value in pairs:
            setattr(attention, const, int(value))
        try:  # unplanned (a call plan replays the launches it recorded first)
            return attention.flash_backward("bench", do, q, k, v, o, lse, causal)
        finally:
            for const, value in saved.items():
                setattr(attention, const, value)

    return run


def sdpa_backward(q, k, v, do, causal: bool):
    """A function computing SDPA efficient's gradients (its forward run once here)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    leaves = [x[None, None].clone().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = sdpa(*leaves, is_causal=causal)

    def run():
        grads = torch.autograd.grad(out, leaves, do[None, None], retain_graph=True)
        return tuple(g[0, 0] for g in grads)

    return run


def reference(q, k, v, do, causal: bool) -> tuple:
    """(dq, dk, dv) in float64 through SDPA's math backend."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out = sdpa(*(x[None, None] for x in leaves), is_causal=causal)[0, 0]
    return torch.autograd.grad(out, leaves, do.double())


def error(grads, ref) -> float:
    """The largest relative error (Frobenius norms) over dq, dk, dv."""
    return max(float((g.double() - r).norm() / r.norm()) for g, r in zip(grads, ref, strict=True))


def main() -> None:
    import torch

    import kaio_ops

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seqs", default="4096")
    p.add_argument("--dims", default="128")
    p.add_argument("--causal", default="0,1")
    p.add_argument("--variants", default="shipped")
    p.add_argument("--warm", action="store_true", help="each variant once at S 128, untimed")
    p.add_argument("--rotate", action="store_true", help="contenders timed in turn")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    names = a.variants.split(",")
    if a.warm:  # compile (the kernels of S 128 are those of any S at these head dims)
        for d in map(int, a.dims.split(",")):
            for causal in (bool(int(c)) for c in a.causal.split(",")):
                q, k, v, do = (torch.randn(128, d, device="cuda") for _ in range(4))
                o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
                for name in names:
                    variant(name)(do, q, k, v, o, lse, causal)
        return torch.cuda.synchronize()
    rows = []
    for s in map(int, a.seqs.split(",")):
        for d in map(int, a.dims.split(",")):
            for causal in (bool(int(c)) for c in a.causal.split(",")):
                gen = torch.Generator(device="cuda").manual_seed(s + d)
                q, k, v, do = (torch.randn(s, d, device="cuda", generator=gen) for _ in range(4))
                o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
                ref = reference(q, k, v, do, causal)
                fns = {"SDPA efficient": sdpa_backward(q, k, v, do, causal)}
                errs = {"SDPA efficient": error(fns["SDPA efficient"](), ref)}
                for name in names:
                    run = variant(name)
                    first = run(do, q, k, v, o, lse, causal)
                    same = all(
                        torch.equal(x, y)
                        for x, y in zip(first, run(do, q, k, v, o, lse, causal), strict=True)
                    )
                    errs[name] = error(first, ref)
                    if not same:
                        errs[name] = f"{errs[name]:.2e} NOT DETERMINISTIC"
                    fns[name] = functools.partial(run, do, q, k, v, o, lse, causal)
                if a.rotate:
                    ms = time_rotated(fns, a.rounds)
                else:
                    ms = {n: time_calls(f) for n, f in fns.items()}
                flops = 2.5 * 4.0 * s * s * d * (0.5 if causal else 1.0)
                base = ms["SDPA efficient"]
                for n in fns:
                    e = errs[n]
                    rows.append(
                        f"| S{s} D{d}{' causal' if causal else ''} | {n} | {ms[n] * 1e3:.0f} | "
                        f"{flops / ms[n] / 1e9:.1f} | {base / ms[n]:.2f}x | "
                        f"{e if isinstance(e, str) else f'{e:.2e}'} |"
                    )
                print(rows[-len(fns) :], flush=True)
    print("| case | contender | µs | TFLOP/s | x SDPA efficient | err vs float64 |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
