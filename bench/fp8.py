"""FP8 against cuBLAS: ``kaio_ops.matmul_fp8`` against ``torch._scaled_mm`` (cuBLASLt FP8,
CUTLASS for per-row scales) on the same e4m3 operands, bf16 out, B column-major as torch
requires: 4096^3 and 8192^3 (per-tensor scales; 4096^3 also per-row/per-column), then the
M sweep at Llama-3-8B's projection shapes (N x K = 4096 x 4096, 14336 x 4096, 4096 x 14336,
the attention output, the MLP up/gate and down projections). Kernel time with CUDA events,
inputs rotated through ~3x the L2 (bench.harness). Then ``quantize_fp8`` (per row, bf16 in)
against torch's recipe (amax, clamp, divide, cast: several kernels).

M starts at 16: ``torch._scaled_mm`` wants M a multiple of 16. Each implementation is first
checked against float64 of the same fp8 values. Usage: ``python bench/fp8.py --out
results.json`` (``--quick``: 4096^3 and a short sweep, about 2 minutes).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

E4M3 = torch.float8_e4m3fn
LLAMA_8B = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K)
SWEEP = (16, 64, 256, 1024, 4096, 8192)
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


def reference(a, b, sa, sb):
    return (a.double() @ b.double()) * sa.double() * sb.double()


def matmul_case(h: Harness, m: int, n: int, k: int, rowwise: bool, label: str = "") -> None:
    h.case(
        "matmul_fp8",
        label or f"{m}x{n}x{k}" + (", row/col scales" if rowwise else ""),
        lambda: fp8_operands(m, n, k, rowwise),
        {
            "torch._scaled_mm": lambda a, b, sa, sb: torch._scaled_mm(
                a, b, sa, sb, out_dtype=torch.bfloat16
            ),
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
    args, _ = p.parse_known_args()
    h = Harness.from_args("FP8 matmul")
    quick = args.quick
    for size in (4096,) if quick else (4096, 8192):
        matmul_case(h, size, size, size, False)
    matmul_case(h, 4096, 4096, 4096, True)
    for n, k in LLAMA_8B[:2] if quick else LLAMA_8B:
        for m in QUICK_SWEEP if quick else SWEEP:
            matmul_case(h, m, n, k, False, f"Llama-3-8B N={n} K={k}, M={m}")
    quantize_case(h, 8192, 4096)
    h.finish()


if __name__ == "__main__":
    main()
