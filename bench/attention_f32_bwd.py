"""The f32 flash-attention backward (``kaio_ops.attention_flash_bwd``, single head [S, D])
against torch SDPA's memory-efficient backward, in one process, with CUDA events; each
variant's gradients checked against float64 and for the same bits on a second call.
TFLOP/s at 2.5x the forward's 4 S S D (halved when causal), as bench/attention.py counts.

Usage: ``python bench/attention_f32_bwd.py [--seqs 4096] [--dims 128] [--causal 0,1]
[--variants shipped,recompute] [--rotate --rounds N [--queued]] [--warm] [--profile S]``.
``--queued``: each round's calls behind a GPU sleep (kernel time: no host time, which the
unplanned variants have more of than the planned ``shipped``).
``--profile S``: at S, each variant's kernels under torch.profiler (µs, the median of 3 calls).
``--forward shipped,splits=N,F32_FWD_TC=1``: ``attention_flash`` against SDPA efficient's
forward instead. ``--warm``: each variant once at S 128 (the same kernels: to fill kaio's cubin
cache in parallel processes).
``NAME=N[+NAME=N]``: the op unplanned with ``kaio_ops.attention``'s module constants set
(``F32_DS_BYTES=0``; a table by head dim gets N at each, none where N is 0: ``F32_TC=0``
the SIMT cores everywhere); ``stored`` and ``recompute`` are short for the op unplanned
with dQ from the stored dS (wherever it fits 4 GiB) and with dQ recomputed
(``F32_DS_BYTES`` 0).
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


def variant(name: str, forward: bool = False):
    """``shipped``: the public op, else the op unplanned with ``kaio_ops.attention``'s
    constants as named (``splits=N``: the forward's key splits). The backward's:
    (do, q, k, v, o, lse, causal) -> (dq, dk, dv); the forward's: (q, k, v, causal) -> out."""
    import kaio_ops
    from kaio_ops import attention

    pairs = [x.split("=") for x in SHORT.get(name, name).split("+")] if name != "shipped" else []
    splits = int(dict(pairs).pop("splits", 0)) or None
    pairs = [(c, int(x)) for c, x in pairs if c != "splits"]

    def unplanned(*args):
        saved = {c: getattr(attention, c) for c, _ in pairs}
        for const, value in pairs:  # (a table by head dim: the value at each, 0 none)
            if isinstance(saved[const], dict):
                value = {key: value for key in saved[const]} if value else {}
            setattr(attention, const, value)
        try:  # unplanned (a call plan replays the launches it recorded first)
            if forward:
                return attention.flash_forward("bench", *args, splits)[0]
            return attention.flash_backward("bench", *args)
        finally:
            for const, value in saved.items():
                setattr(attention, const, value)

    def shipped(*args):
        causal = args[-1]
        if forward:
            return (kaio_ops.attention_flash_causal if causal else kaio_ops.attention_flash)(
                *args[:-1]
            )
        op = kaio_ops.attention_flash_bwd_causal if causal else kaio_ops.attention_flash_bwd
        return op(*args[:-1])

    return unplanned if pairs or splits else shipped


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


def kernel_times(fn, calls: int = 3) -> list:
    """(name, µs) of each kernel of a call of ``fn`` under torch.profiler, in launch order,
    the median over ``calls`` profiled calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(calls):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        gpu = sorted(
            (e.time_range.start, e.time_range.end, e.name)
            for e in prof.events()
            if e.device_type.name == "CUDA"
        )
        runs.append([(n[:24], e - b) for b, e, n in gpu])
    return [(n, sorted(r[i][1] for r in runs)[calls // 2]) for i, (n, _) in enumerate(runs[0])]


def forward_rows(seqs, dims, masks, names, rotate: bool, rounds: int, queued: bool) -> list:
    """``attention_flash`` f32 (``variant``'s names) against SDPA efficient's forward, each
    checked against float64."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for s in seqs:
        for d in dims:
            for causal in masks:
                gen = torch.Generator(device="cuda").manual_seed(s + d)
                q, k, v = (torch.randn(s, d, device="cuda", generator=gen) for _ in range(3))
                ref = sdpa(*(x.double()[None, None] for x in (q, k, v)), is_causal=causal)[0, 0]

                def efficient(q=q, k=k, v=v, causal=causal):
                    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                        return sdpa(q[None, None], k[None, None], v[None, None], is_causal=causal)[
                            0, 0
                        ]

                fns = {"SDPA efficient": efficient}
                for name in names:
                    fns[name] = functools.partial(variant(name, True), q, k, v, causal)
                errs = {n: float((f().double() - ref).norm() / ref.norm()) for n, f in fns.items()}
                ms = (
                    time_rotated(fns, rounds, queued=queued)
                    if rotate
                    else {n: time_calls(f) for n, f in fns.items()}
                )
                flops = 4.0 * s * s * d * (0.5 if causal else 1.0)
                base = ms["SDPA efficient"]
                for n in fns:
                    rows.append(
                        f"| fwd S{s} D{d}{' causal' if causal else ''} | {n} | {ms[n] * 1e3:.0f} | "
                        f"{flops / ms[n] / 1e9:.1f} | {base / ms[n]:.2f}x | {errs[n]:.2e} |"
                    )
                print(rows[-len(fns) :], flush=True)
    return rows


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
    p.add_argument("--queued", action="store_true", help="--rotate's rounds behind a GPU sleep")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", type=int, default=0, help="at this S: each variant's kernels")
    p.add_argument("--forward", help="time attention_flash instead: shipped,splits=N,...")
    a = p.parse_args()
    names = a.variants.split(",")
    seqs, dims = [int(x) for x in a.seqs.split(",")], [int(x) for x in a.dims.split(",")]
    masks = [bool(int(c)) for c in a.causal.split(",")]
    if a.warm:  # compile (the kernels of S 128 are those of any S at these head dims)
        for d in dims:
            for causal in masks:
                q, k, v, do = (torch.randn(128, d, device="cuda") for _ in range(4))
                if a.forward:
                    for name in a.forward.split(","):
                        variant(name, True)(q, k, v, causal)
                    continue
                o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
                for name in names:
                    variant(name)(do, q, k, v, o, lse, causal)
        return torch.cuda.synchronize()
    if a.forward:
        names = a.forward.split(",")
        rows = forward_rows(seqs, dims, masks, names, a.rotate, a.rounds, a.queued)
        print("| case | contender | µs | TFLOP/s | x SDPA efficient | err vs float64 |")
        print("|---|---|---|---|---|---|")
        return print("\n".join(rows))
    rows = []
    for s in seqs:
        for d in dims:
            for causal in masks:
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
                    if s == a.profile:
                        kernels = kernel_times(fns[name])
                        print(f"kernels S{s} D{d} causal={int(causal)} {name}: "
                              + ", ".join(f"{n} {t:.0f}" for n, t in kernels)
                              + f"; sum {sum(t for _, t in kernels):.0f}", flush=True)  # fmt: skip
                if a.rotate:
                    ms = time_rotated(fns, a.rounds, queued=a.queued)
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
