"""``kaio_ops.linear``'s fused epilogues against the torch ops they replace, with the plans
behind them: the Llama-3-8B MLP shapes of bench/gemm_sweep.py's epilogue cases (gelu,
gelu_tanh or silu + bias + residual on the down projection, N x K = 4096 x 14336; the SwiGLU
gate + bias + residual on gate+up, 14336 x 4096), f16, per-call kernel time (bench/harness.py:
the implementations in turn, interleaved, in one process).

Implementations of a case: ``torch`` (F.linear with the bias, the activation, + residual:
the baseline), ``kaio`` (``kaio_ops.linear`` as routed), and with ``--variants`` the routed
Hopper plan forced with another epilogue (``v3c8``: ``Plan.vec`` 3, the fused epilogue's
loads 8 n8 tiles ahead of its stores, ``_gemm_hopper.store_fused``; ``v0``: the pair-by-pair
epilogue); ``--parts`` adds timing-only floors: ``F.linear+bias`` (cuBLAS with its bias
epilogue), and kaio without an epilogue (``kaio plain``) and with the activation only
(``kaio act``).

Usage: ``python bench/gemm_epilogue.py --ms 4096 --acts gelu,silu_gate --variants v0,v3c8
--parts --out epi.json``; ``--warm R/J`` compiles shard R of J of the kaio kernels (J
processes side by side fill the disk cache before the timed run, as gemm_sweep.py's).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

SHAPES = {"gelu": (4096, 14336), "gelu_tanh": (4096, 14336), "silu": (4096, 14336),
          "silu_gate": (14336, 4096)}  # fmt: skip
# "plain": ``linear`` without an epilogue at the Llama-3-8B shapes, against F.linear
PLAIN = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
F = torch.nn.functional


def torch_ops(x, w, b, r, act):
    """The separate torch ops: F.linear with the bias, the activation, + residual ("plain":
    F.linear alone)."""
    if act == "plain":
        return F.linear(x, w)
    z = F.linear(x, w, b)
    if act == "silu_gate":
        g, u = z.chunk(2, -1)
        return F.silu(g) * u + r
    if act == "silu":
        return F.silu(z) + r
    return F.gelu(z, approximate="tanh" if act == "gelu_tanh" else "none") + r


def reference(x, w, b, r, act):
    """torch_ops in f32."""
    return torch_ops(x.float(), w.float(), b.float(), r.float(), act)


def plain(fn):
    """``fn`` (an implementation of a case) without bias and residual for the "plain"
    cases."""
    return lambda x, w, b, r, act: (
        fn(x, w, None, None, "none") if act == "plain" else fn(x, w, b, r, act)
    )


def forced(variant: str):
    """``linear`` on the routed Hopper plan with the epilogue of ``variant``: "vV" (``Plan.vec``
    V: 0 pairs of columns, 3 ``store_fused``, 4 and the residual prefetched), then "cC"
    (chunks of C n8 tiles, ``_gemm_hopper.EPI_CHUNK``); or "PW" (then "p": in pairs sharing
    B): the persistent kernel with 128 x W tiles (``linear.Persistent``)."""
    import re

    from kaio_ops import _arrays, _gemm_hopper
    from kaio_ops.linear import Persistent, gemm, route

    if variant.startswith("P"):
        width, pair = re.fullmatch(r"P(\d+)(p?)", variant).groups()
        plan = Persistent(int(width), pair=int(bool(pair)))

        def run_persistent(x, w, b, r, act):
            inputs = _arrays.Inputs("linear")
            xo, wo = inputs.array(x, "x", ndim=2), inputs.array(w, "w", ndim=2)
            bo = None if b is None else inputs.array(b, "bias", ndim=1)
            ro = None if r is None else inputs.array(r, "residual", ndim=2)
            (m, k), n = x.shape, w.shape[0]
            return gemm("linear", xo, wo, (m, n), (m, n, k), xo.dtype, True, bo, ro, act,
                        chosen=plan)  # fmt: skip

        return run_persistent
    vec, chunk = re.fullmatch(r"v(\d)(?:c(\d+))?", variant).groups()

    def run(x, w, b, r, act):
        inputs = _arrays.Inputs("linear")
        xo, wo = inputs.array(x, "x", ndim=2), inputs.array(w, "w", ndim=2)
        bo = None if b is None else inputs.array(b, "bias", ndim=1)
        ro = None if r is None else inputs.array(r, "residual", ndim=2)
        (m, k), n = x.shape, w.shape[0] // (2 if act == "silu_gate" else 1)
        chosen = route(xo, wo, (m, n, k), True, bo is None and ro is None and act == "none",
                       act == "silu_gate")  # fmt: skip
        if not isinstance(chosen, _gemm_hopper.Plan):
            raise RuntimeError(f"not a Hopper plan: {chosen}")
        chosen = chosen._replace(vec=int(vec))
        saved = _gemm_hopper.EPI_CHUNK, _gemm_hopper.FUSED_VEC
        _gemm_hopper.EPI_CHUNK = int(chunk or saved[0])
        _gemm_hopper.FUSED_VEC = int(vec)  # "v0": the pair-by-pair epilogue
        try:
            return gemm("linear", xo, wo, (m, n), (m, n, k), xo.dtype, True, bo, ro, act,
                        chosen=chosen)  # fmt: skip
        finally:
            _gemm_hopper.EPI_CHUNK, _gemm_hopper.FUSED_VEC = saved

    return run


def impls(variants: list[str], parts: bool) -> dict:
    """name -> fn(x, w, b, r, act) of a case; and the timing-only names."""
    out = {
        "torch": torch_ops,
        "kaio": plain(lambda x, w, b, r, act: kaio_ops.linear(x, w, b, residual=r,
                                                              activation=None if act == "none"
                                                              else act)),
    }  # fmt: skip
    for v in variants:
        out[f"kaio {v}"] = plain(forced(v))
    if parts:
        out["F.linear+bias"] = lambda x, w, b, r, act: F.linear(x, w, b)
        out["kaio plain"] = lambda x, w, b, r, act: kaio_ops.linear(x, w)
        plain_p = forced("P256")  # the persistent kernel, no epilogue
        out["kaio plain P256"] = lambda x, w, b, r, act: plain_p(x, w, None, None, "none")
        out["kaio act"] = lambda x, w, b, r, act: kaio_ops.linear(
            x, w, activation="silu" if act == "silu_gate" else act
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", default="4096", help="comma-separated M values")
    p.add_argument("--acts", default="gelu,silu_gate", help="comma-separated activations")
    p.add_argument("--variants", default="", help="comma-separated: v0, v3c4, v3c8, ...")
    p.add_argument("--parts", action="store_true", help="also the timing-only floors")
    p.add_argument("--warm", default=None, help="R/J: compile shard R of J, time nothing")
    args, _ = p.parse_known_args()
    ms = [int(v) for v in args.ms.split(",")]
    acts = args.acts.split(",")
    variants = [v for v in args.variants.split(",") if v]
    fns = impls(variants, args.parts)
    timing_only = ("F.linear+bias", "kaio plain", "kaio plain P256", "kaio act")
    cases = [(m, act, *SHAPES[act]) for act in acts if act != "plain" for m in ms]
    cases += [(m, "plain", n, k) for n, k in PLAIN for m in ms if "plain" in acts]
    if args.warm:
        shard, shards = (int(v) for v in args.warm.split("/"))
        jobs = [(*case, name) for case in cases for name in fns if "kaio" in name]
        for m, act, n, k, name in jobs[shard::shards]:
            rows = 2 * n if act == "silu_gate" else n
            dev = {"device": "cuda", "dtype": torch.float16}
            x, w = torch.zeros(m, k, **dev), torch.zeros(rows, k, **dev)
            b, r = torch.zeros(rows, **dev), torch.zeros(m, n, **dev)
            try:
                fns[name](x, w, b, r, act)
            except Exception as e:  # noqa: BLE001  (the timed run reports it)
                print(f"warm {name}: {type(e).__name__}: {e}"[:200], flush=True)
        torch.cuda.synchronize()
        return
    h = Harness.from_args("linear epilogues")
    for m, act, n, k in cases:
        rows = 2 * n if act == "silu_gate" else n

        def make(m=m, n=n, k=k, rows=rows, act=act):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = (torch.randn(rows, k, device="cuda") * k**-0.5).half()
            b = torch.randn(rows, device="cuda", dtype=torch.float16)
            r = torch.randn(m, n, device="cuda", dtype=torch.float16)
            return x, w, b, r, act

        h.case(
            "linear" if act == "plain" else f"linear {act} + bias + residual",
            f"M={m} {n}x{k}",
            make,
            fns,
            reference=reference,
            tol=3e-3,
            nbytes=(m * k + rows * k + 2 * m * n) * 2,
            flops=2.0 * m * rows * k,
            baseline="torch",
            timing_only=timing_only,
        )
    h.finish()


if __name__ == "__main__":
    main()
