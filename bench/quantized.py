"""Quantized matmuls against their peers, in one run: ``matmul_int8`` at 4096^3 against
``torch._int_mm`` (cuBLAS int8), and ``matmul_int4`` (W4A16, groups of 128) at decode shapes
(M = 1, 16) and at M = 4096 against cuBLAS f16 on the same shape with the dequantized
weights. Then the fused QKV projections, ``qkv_project_int4`` and ``qkv_project_int8``
(W8A16), against three separate calls (``matmul_int4``; for int8 the same kernel launched
once per weight, ``kaio_ops.quantized.project_int8``), at M = 1, 16 and 4096 with K = 4096
and N = 4096 per projection: the peer's time is the three calls' together. Each
implementation is first checked against float64. Usage:
``python bench/quantized.py --out results.json``.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402
from kaio_ops.quantized import project_int8  # noqa: E402

SEPARATE_INT4 = "3 separate calls (matmul_int4)"
SEPARATE_INT8 = "3 separate calls (same kernel)"


def int4_inputs(m: int, n: int, k: int):
    """f16 activations, packed int4 weights (int32 words), f16 scales, dequantized weights."""
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    q = torch.randint(-8, 8, (k, n), device="cuda", dtype=torch.int32)
    scales = (torch.rand(k // 128, n, device="cuda") * 0.05 + 0.01).half()
    nibbles = (q & 0xF).reshape(k // 8, 8, n)
    packed = torch.zeros(k // 8, n, device="cuda", dtype=torch.int64)
    for i in range(8):
        packed |= nibbles[:, i].long() << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # same bits
    w = (scales.float().repeat_interleave(128, 0) * q).half()
    return a, packed, scales, w


def qkv_int4_inputs(m: int, n: int, k: int):
    """x and three int4 weights: (x, the packed words, the scales, the dequantized f16
    weights), the last three a tuple of three each."""
    weights = [int4_inputs(m, n, k) for _ in range(3)]
    return weights[0][0], *(tuple(w[i] for w in weights) for i in (1, 2, 3))


def qkv_int8_inputs(m: int, n: int, k: int):
    """x, three int8 weights [K, N] and their scales."""
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = tuple(torch.randint(-128, 128, (k, n), device="cuda", dtype=torch.int8) for _ in "qkv")
    return x, w, (0.01, 0.02, 0.005)


def separate_int4(x, packed, scales, w):
    """Three ``matmul_int4`` calls, one per weight (f32 outputs)."""
    return [kaio_ops.matmul_int4(x, p, s) for p, s in zip(packed, scales, strict=True)]


def separate_int8(x, w, scales):
    """Three launches of the fused op's kernel, one per weight (f16 outputs)."""
    return [project_int8(x, a, s) for a, s in zip(w, scales, strict=True)]


def qkv_cases(h: Harness, n: int, k: int) -> None:
    """The fused QKV projections against three separate calls, at decode and prefill."""
    for mm in (1, 16, 4096):
        label = f"{mm}x{n}x{k}, 3 weights"
        h.case(
            "qkv_project_int4",
            label,
            lambda mm=mm: qkv_int4_inputs(mm, n, k),
            {
                SEPARATE_INT4: separate_int4,
                "kaio fused": lambda x, p, s, w: kaio_ops.qkv_project_int4(x, *p, *s),
            },
            reference=lambda x, p, s, w: tuple(x.double() @ wi.double() for wi in w),
            tol=1e-3,
            nbytes=mm * k * 2 + 3 * (k * n // 2 + mm * n * 2),
            flops=3 * 2.0 * mm * n * k,
            baseline=SEPARATE_INT4,
            set_bytes=mm * k * 2 + 3 * k * n * 3,
        )
        h.case(
            "qkv_project_int8",
            label,
            lambda mm=mm: qkv_int8_inputs(mm, n, k),
            {
                SEPARATE_INT8: separate_int8,
                "kaio fused": lambda x, w, s: kaio_ops.qkv_project_int8(x, *w, *s),
            },
            reference=lambda x, w, s: tuple(
                x.double() @ a.double() * s[i] for i, a in enumerate(w)
            ),
            tol=1e-3,
            nbytes=mm * k * 2 + 3 * (k * n + mm * n * 2),
            flops=3 * 2.0 * mm * n * k,
            baseline=SEPARATE_INT8,
        )


def main() -> None:
    h = Harness.from_args("quantized matmul")
    m = n = k = 4096

    def make8():
        a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
        return a, torch.randint(-128, 128, (k, n), device="cuda", dtype=torch.int8)

    h.case(
        "matmul_int8",
        f"{m}x{n}x{k}",
        make8,
        {"torch._int_mm": torch._int_mm, "kaio": lambda a, b: kaio_ops.matmul_int8(a, b, 1.0)},
        reference=lambda a, b: a.double() @ b.double(),
        tol=1e-7,
        nbytes=2 * m * k + m * n * 4,
        flops=2.0 * m * n * k,
        baseline="torch._int_mm",
    )
    for mm in (1, 16, 4096):
        h.case(
            "matmul_int4",
            f"{mm}x{n}x{k}",
            lambda mm=mm: int4_inputs(mm, n, k),
            {
                "cuBLAS f16": lambda a, p, s, w: torch.matmul(a, w),
                "kaio int4": lambda a, p, s, w: kaio_ops.matmul_int4(a, p, s),
            },
            reference=lambda a, p, s, w: a.double() @ w.double(),
            tol=1e-3,
            nbytes=mm * k * 2 + k * n // 2 + mm * n * 4,
            flops=2.0 * mm * n * k,
            baseline="cuBLAS f16",
            set_bytes=mm * k * 2 + k * n * 3,
        )
    qkv_cases(h, n, k)
    h.finish()


if __name__ == "__main__":
    main()
