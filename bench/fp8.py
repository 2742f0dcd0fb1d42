"""FP8 against cuBLAS: ``kaio_ops.matmul_fp8`` against ``torch._scaled_mm`` (cuBLASLt FP8,
CUTLASS for per-row scales) on the same e4m3 operands, bf16 out, B column-major as torch
requires: 4096^3 and 8192^3 (per-tensor scales; 4096^3 also per-row/per-column), then the
M sweep (M = 1, 2, 4, ..., 8192) at the Llama-3-8B and -70B projection shapes of the GEMM
sweep (bench/gemm_sweep.py: N x K of the QKV, attention output, MLP gate+up and down
layers). Kernel time with CUDA events, inputs rotated through ~3x the L2 (bench.harness).
Then ``quantize_fp8`` (per row, bf16 in) against torch's recipe (amax, clamp, divide, cast:
several kernels).

Where the installed torch refuses an M that is not a multiple of 16 (older versions do), the
peer's call pads a with zero rows to the next multiple, as a user must, and the padding is
timed with it (``PADS`` records it). Each implementation is first checked against float64 of
the same fp8 values. Usage:
``python bench/fp8.py --out results.json`` (``--quick``: 4096^3 and a short sweep, about 2
minutes; ``--ms 1,16,256 --models 8b`` any other subset; ``--no-squares`` the sweep only).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

E4M3 = torch.float8_e4m3fn
SHAPES = {  # (N, K), as bench/gemm_sweep.py
    "8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
}
SWEEP = tuple(1 << i for i in range(14))  # 1 .. 8192
QUICK_SWEEP = (16, 256, 4096)


def fp8_operands(m: int, n: int, k: int, rowwise: bool):
    """(a [M, K] e4m3, b [K, N] e4m3 column-major, scale_a, scale_b): quantized with torch
    alone (per tensor, or per row of a and column of b)."""
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") * 0.02
    if rowwise:
        sa = x.abs().amax(-1, keepdim=True) / 448.0
        sw = w.abs().amax(-1, keepdim=True) / 448.0
    else:
        sa = x.abs().amax().reshape(1) / 448.0
        sw = w.abs().amax().reshape(1) / 448.0
    a = (x / sa).to(E4M3)
    b = (w / sw).to(E4M3).t()
    return a, b, sa.float(), (sw.reshape(1, n) if rowwise else sw).float()


PADS = []  # [True] once torch._scaled_mm refused an M that is not a multiple of 16


def scaled_mm(a, b, sa, sb):
    """``torch._scaled_mm`` to bf16; where torch refuses an M that is not a multiple of 16,
    a padded with zero rows to one (as a user must; the padding is timed with it)."""
    m = a.shape[0]
    if m % 16 == 0 or not PADS:
        try:
            return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        except RuntimeError:
            if m % 16 == 0:
                raise
            PADS.append(True)
    pad = -m % 16
    a = torch.cat([a, a.new_zeros(pad, a.shape[1])])
    if sa.numel() > 1:
        sa = torch.cat([sa, sa.new_ones(pad, 1)])
    return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)[:m]


def reference(a, b, sa, sb):
    return (a.double() @ b.double()) * sa.double() * sb.double()


def matmul_case(h: Harness, m: int, n: int, k: int, rowwise: bool, label: str = "") -> None:
    h.case(
        "matmul_fp8",
        label or f"{m}x{n}x{k}" + (", row/col scales" if rowwise else ""),
        lambda: fp8_operands(m, n, k, rowwise),
        {
            "torch._scaled_mm": scaled_mm,
            "kaio": lambda a, b, sa, sb: kaio_ops.matmul_fp8(a, b, sa, sb),
        },
        reference=reference,
        tol=1e-2,  # bf16 output
        nbytes=m * k + k * n + 2 * m * n,
        flops=2.0 * m * n * k,
        baseline="torch._scaled_mm",
    )


def quantize_case(h: Harness, rows: int, k: int) -> None:
    def torch_recipe(x):
        scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
        return (x.float() / scale).to(E4M3), scale

    h.case(
        "quantize_fp8",
        f"bf16 [{rows}, {k}], per row",
        lambda: (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16),),
        {
            "torch": torch_recipe,
            "kaio": lambda x: kaio_ops.quantize_fp8(x, per="row"),
        },
        reference=lambda x: tuple(t.double() for t in torch_recipe(x)),
        tol=0.0,  # bit-identical
        nbytes=rows * k * 3 + rows * 4,
        baseline="torch",
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="4096^3 and a short M sweep")
    p.add_argument("--ms", default="", help="the sweep's M values (comma-separated)")
    p.add_argument("--models", default="8b,70b", help="the sweep's shapes: 8b, 70b")
    p.add_argument("--no-squares", action="store_true", help="the M sweep only")
    args, _ = p.parse_known_args()
    h = Harness.from_args("FP8 matmul")
    quick = args.quick
    if not args.no_squares:
        for size in (4096,) if quick else (4096, 8192):
            matmul_case(h, size, size, size, False)
        matmul_case(h, 4096, 4096, 4096, True)
    ms = [int(x) for x in args.ms.split(",")] if args.ms else QUICK_SWEEP if quick else SWEEP
    shapes = SHAPES["8b"][1:3] if quick else [s for m in args.models.split(",") for s in SHAPES[m]]
    for m in ms:
        for n, k in shapes:
            matmul_case(h, m, n, k, False, f"M={m} {n}x{k}")
    if not args.no_squares:
        quantize_case(h, 8192, 4096)
    h.finish()
    cases = [r for r in h.results if r.impl == "kaio" and r.case.startswith("M=") and r.vs_baseline]
    if cases:
        geo = math.exp(sum(math.log(r.vs_baseline) for r in cases) / len(cases))
        print(f"matmul_fp8 / torch._scaled_mm over the M sweep: geometric mean {geo:.3f}x "
              f"({len(cases)} cases, {min(r.vs_baseline for r in cases):.2f}x to "
              f"{max(r.vs_baseline for r in cases):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
