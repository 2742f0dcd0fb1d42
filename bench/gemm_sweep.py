"""The LLM GEMM shape sweep: ``kaio_ops.matmul`` (f16/bf16 in, output in the inputs' dtype)
against cuBLAS (``torch.matmul``) and, where Triton is installed, a Triton matmul with the same
output, over M in {1, 2, 4, ..., 8192} by the (N, K) of the Llama-3-8B and -70B layers, f16
and bf16; per-call kernel time with L2 rotated (bench/harness.py). Also the fused
``kaio_ops.linear`` epilogues (bias + activation + residual, and the SwiGLU gate) against
the separate torch ops they replace.

The ratio kaio / cuBLAS of each case is drawn as a heat map (M by shape, bench/plots.py).

Usage: ``python bench/gemm_sweep.py --out results.json [--quick]``. ``--quick`` (or
``KAIO_GEMM_SWEEP=quick``) keeps a subset that runs in about a minute: M in {1, 16, 128,
1024}, the Llama-3-8B shapes, f16, without Triton (its per-shape autotuning compiles for
seconds a case; ``--triton`` puts it back). The squares 1024³ and 2048³ ("gemm square")
run in both. ``--ms``, ``--models`` and ``--dtypes`` pick
any other subset; ``--mma`` also times kaio's mma.sync kernel (on sm_90 the op runs the
Hopper one).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

MS = [1 << i for i in range(14)]  # 1 .. 8192
SHAPES = {  # (N, K) of the attention QKV, attention out, MLP gate+up, MLP down layers
    "8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
}
QUICK = {"ms": [1, 16, 128, 1024], "models": ["8b"], "dtypes": ["f16"]}
SQUARES = [1024, 2048]  # M = N = K: the "gemm square" op
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
OP = "gemm sweep"  # op names: "gemm sweep f16", "gemm sweep bf16" (bench/plots.py's heat map)

try:
    from bench.matmul import triton_matmul
except ImportError:  # no Triton, or bench.matmul has no half-output launcher
    triton_matmul = None


def case_label(m: int, n: int, k: int) -> str:
    """The case name: ``M=<m> <N>x<K>`` (bench/plots.py reads it back for the heat map)."""
    return f"M={m} {n}x{k}"


def parse_label(label: str) -> tuple[int, str] | None:
    """(M, "NxK") of a case label, or None for another suite's label."""
    head, _, shape = label.partition(" ")
    if not head.startswith("M=") or "x" not in shape:
        return None
    return int(head[2:]), shape


def kaio_mma_sync(a, b):
    """kaio_ops.matmul forced onto the mma.sync kernel (``_gemm``), to compare with the
    Hopper kernel that the op runs on sm_90."""
    from kaio_ops import _arrays
    from kaio_ops.linear import gemm, plan

    inputs = _arrays.Inputs("matmul")
    x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
    (m, k), n = x.shape, y.shape[1]
    chosen = plan(m, n, k, _arrays.multiprocessors(x))
    return gemm("matmul", x, y, (m, n), (m, n, k), x.dtype, False, chosen=chosen)


def sweep(
    h: Harness,
    ms: list[int],
    models: list[str],
    dtypes: list[str],
    mma: bool = False,
    use_triton: bool = True,
    op: str = OP,
) -> None:
    """One harness case per (dtype, model shape, M) (``models``: names of ``SHAPES``, or
    "square": M = N = K for each M of ``ms``); ``mma``: also the mma.sync kernel;
    ``use_triton``: also Triton (autotuned per shape: seconds of compiling per case)."""
    for name in dtypes:
        dt = DTYPES[name]
        tol = 3e-3 if dt == torch.float16 else 2e-2
        for model in models:
            for n, k in SHAPES.get(model, [(0, 0)]):
                for m in ms:
                    if model == "square":
                        n = k = m

                    def make(m=m, n=n, k=k, dt=dt):
                        a = torch.randn(m, k, device="cuda").to(dt)
                        b = (torch.randn(k, n, device="cuda") * k**-0.5).to(dt)
                        return a, b

                    impls = {"kaio": kaio_ops.matmul, "cuBLAS": torch.matmul}
                    if mma:
                        impls["kaio mma.sync"] = kaio_mma_sync
                    if use_triton and triton_matmul is not None:
                        impls["Triton"] = triton_matmul
                    big = m * n * k > 2**36  # the float64 reference would take seconds
                    h.case(
                        f"{op} {name}",
                        case_label(m, n, k),
                        make,
                        impls,
                        reference=(lambda a, b: a.float() @ b.float())
                        if big
                        else (lambda a, b: a.double() @ b.double()),
                        tol=tol,
                        nbytes=(m * k + k * n + m * n) * 2,
                        flops=2.0 * m * n * k,
                        baseline="cuBLAS",
                    )


def epilogues(h: Harness, ms: list[int]) -> None:
    """``linear`` with its epilogue fused against torch's separate ops, Llama-3-8B MLP
    shapes: gelu + bias + residual on the down projection, the SwiGLU gate on gate+up."""
    F = torch.nn.functional
    for m in ms:
        for act, n, k in (("gelu", 4096, 14336), ("silu_gate", 14336, 4096)):
            rows = 2 * n if act == "silu_gate" else n

            def make(m=m, n=n, k=k, rows=rows):
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                w = (torch.randn(rows, k, device="cuda") * k**-0.5).half()
                b = torch.randn(rows, device="cuda", dtype=torch.float16)
                r = torch.randn(m, n, device="cuda", dtype=torch.float16)
                return x, w, b, r

            def torch_ops(x, w, b, r, act=act):
                z = F.linear(x, w, b)
                if act == "silu_gate":
                    g, u = z.chunk(2, -1)
                    return F.silu(g) * u + r
                return F.gelu(z) + r

            def ref(x, w, b, r, act=act):
                z = F.linear(x.float(), w.float(), b.float())
                if act == "silu_gate":
                    g, u = z.chunk(2, -1)
                    return F.silu(g) * u + r.float()
                return F.gelu(z) + r.float()

            h.case(
                f"linear {act} + bias + residual",
                case_label(m, n, k),
                make,
                {
                    "kaio": lambda x, w, b, r, act=act: kaio_ops.linear(
                        x, w, b, residual=r, activation=act
                    ),
                    "torch": torch_ops,
                },
                reference=ref,
                tol=3e-3,
                nbytes=(m * k + rows * k + 2 * m * n) * 2,
                flops=2.0 * m * rows * k,
                baseline="torch",
            )


def main(argv: list[str] | None = None) -> None:
    """Run the sweep (a subset with --quick or KAIO_GEMM_SWEEP=quick) and the epilogues."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the ~1 minute subset")
    p.add_argument("--ms", help="comma-separated M values (default 1..8192, powers of 2)")
    p.add_argument("--models", help="comma-separated: 8b, 70b (default both)")
    p.add_argument("--dtypes", help="comma-separated: f16, bf16 (default both)")
    p.add_argument("--mma", action="store_true", help="also time the mma.sync kernel")
    p.add_argument(
        "--triton",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time Triton too (default: yes, except with --quick)",
    )
    p.add_argument("--no-epilogues", action="store_true", help="skip the fused linear cases")
    args, rest = p.parse_known_args(argv)
    quick = args.quick or os.environ.get("KAIO_GEMM_SWEEP") == "quick"
    h = Harness.from_args("LLM GEMM shape sweep", rest, reps=20 if quick else 30)
    ms = [int(v) for v in args.ms.split(",")] if args.ms else (QUICK["ms"] if quick else MS)
    models = (
        args.models.split(",") if args.models else (QUICK["models"] if quick else ["8b", "70b"])
    )
    dtypes = (
        args.dtypes.split(",") if args.dtypes else (QUICK["dtypes"] if quick else ["f16", "bf16"])
    )
    use_triton = not quick if args.triton is None else args.triton
    sweep(h, ms, models, dtypes, args.mma, use_triton)
    sweep(h, SQUARES, ["square"], dtypes, args.mma, use_triton, op="gemm square")
    if not args.no_epilogues:
        epilogues(h, [16, 4096] if quick else [1, 16, 256, 4096])
    print(h.table())
    h.finish()


if __name__ == "__main__":
    main()
