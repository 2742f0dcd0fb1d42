"""The matmul backward of kaio_ops.torch: precision of its f32-gradient handling, and its time.

``C = A @ B`` with f16/bf16 A, B and f32 C: the backward needs ``dA = dC @ B^T`` and
``dB = A^T @ dC`` with an f32 ``dC``, while kaio's matmul takes f16/bf16 operands. Printed:

- precision: the relative error (Frobenius) of dA and dB in f32, before they are rounded to
  the inputs' dtype, against float64, for three ways to feed dC: a plain cast to the dtype,
  one cast after a power-of-two scaling per row/column (``parts=1``), and the scaled hi + lo
  split (``parts=2``, the default); then the error of the gradient autograd returns (rounded
  to the dtype) next to torch autograd's own f16/bf16 matmul backward. dC at scale 1, at 1e-6
  (f16's subnormal range) and with rows spread over six decades;
- time (GPU only): forward and backward at 4096^3 against torch (cuBLAS), CUDA events,
  median of 20 after 3 warm-ups.

Runs on the GPU if there is one, else on kaio's CPU simulator at a small size (no timing).
Run: python bench/torch_matmul_grad.py
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
import kaio_ops.torch as kt  # noqa: E402

OPS = {torch.float16: "matmul_tc_async", torch.bfloat16: "matmul_tc_bf16_async"}


def relative_error(a, ref) -> float:
    """|a - ref| / |ref| in Frobenius norms, in float64."""
    return float((a.double() - ref).norm() / ref.norm())


def upstream(kind: str, m: int, n: int, gen, device):
    """dC [m, n] in f32: standard normal, times 1e-6, or rows scaled by 10^U(-6, 0)."""
    g = torch.randn(m, n, generator=gen)
    if kind == "1e-6":
        g = g * 1e-6
    elif kind == "spread":
        g = g * 10 ** (-6 * torch.rand(m, 1, generator=gen))
    return g.to(device)


def precision(m: int, n: int, k: int, device) -> None:
    """Print the error table for C [m, n] = A [m, k] @ B [k, n]."""
    gen = torch.Generator().manual_seed(0)
    print(f"precision, C[{m}, {n}] = A[{m}, {k}] @ B[{k}, {n}]: relative error vs float64")
    head = (
        "| dtype | dC | plain cast | scaled cast | hi + lo | returned (hi + lo) | torch autograd |"
    )
    print(head)
    print("|---" * 7 + "|")
    for dtype, op in OPS.items():
        a = torch.randn(m, k, generator=gen).to(device, dtype)
        b = torch.randn(k, n, generator=gen).to(device, dtype)
        for kind in ("1", "1e-6", "spread"):
            dc = upstream(kind, m, n, gen, device)
            ref_a = dc.double() @ b.double().t()
            ref_b = a.double().t() @ dc.double()
            matmul = getattr(torch.ops.kaio, op)
            plain = max(
                relative_error(matmul(dc.to(dtype), b.t().contiguous()), ref_a),
                relative_error(matmul(a.t().contiguous(), dc.to(dtype)), ref_b),
            )
            errors = []
            for parts in (1, 2):
                da, db = kt.matmul_grads(a, b, dc, op, parts=parts)
                errors.append(max(relative_error(da, ref_a), relative_error(db, ref_b)))
            la, lb = (t.detach().clone().requires_grad_() for t in (a, b))
            getattr(torch.ops.kaio, op)(la, lb).backward(dc)
            returned = max(relative_error(la.grad, ref_a), relative_error(lb.grad, ref_b))
            ta, tb = (t.detach().clone().requires_grad_() for t in (a, b))
            (ta @ tb).float().backward(dc)  # torch autograd: dC cast to the dtype
            theirs = max(relative_error(ta.grad, ref_a), relative_error(tb.grad, ref_b))
            name = str(dtype).removeprefix("torch.")
            print(
                f"| {name} | {kind} | {plain:.2e} | {errors[0]:.2e} | {errors[1]:.2e} "
                f"| {returned:.2e} | {theirs:.2e} |"
            )


def timed(fn, iters: int = 20) -> float:
    """Median milliseconds of fn() over ``iters`` runs after 3 warm-ups (CUDA events)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def timing_row(dtype, op: str, size: int) -> str:
    """One table row: kaio forward, backward (hi + lo, one cast), torch forward, backward."""
    a, b = (torch.randn(size, size, device="cuda", dtype=dtype) for _ in range(2))
    dc = torch.randn(size, size, device="cuda")
    dc16 = dc.to(dtype)
    matmul = getattr(torch.ops.kaio, op)
    cells = [
        (lambda: matmul(a, b), 1),
        (lambda: kt.matmul_grads(a, b, dc, op, parts=2), 2),
        (lambda: kt.matmul_grads(a, b, dc, op, parts=1), 2),
        (lambda: a @ b, 1),
        (lambda: (dc16 @ b.t(), a.t() @ dc16), 2),
    ]
    flop = 2 * size**3
    times = [(timed(fn), n) for fn, n in cells]
    return " | ".join(f"{ms:.3f} ({n * flop / ms / 1e9:.0f})" for ms, n in times)


def timing(size: int = 4096) -> None:
    """Print forward and backward times of kaio and torch at size^3 (f16 and bf16)."""
    print(f"\ntime at {size}^3, {torch.cuda.get_device_name()}: milliseconds (TFLOP/s)")
    print("| dtype | kaio fwd | kaio bwd, hi + lo | kaio bwd, one cast | torch fwd | torch bwd |")
    print("|---|---|---|---|---|---|")
    for dtype, op in OPS.items():
        print(f"| {str(dtype).removeprefix('torch.')} | {timing_row(dtype, op, size)} |")


def main() -> None:
    """Precision (and on a GPU, time) of the matmul backward."""
    gpu = torch.cuda.is_available() and kaio.gpu_available()
    with contextlib.nullcontext() if gpu else kaio.simulate():
        if gpu:
            precision(1024, 1024, 1024, "cuda")
            timing()
        else:
            print("no GPU: kaio's CPU simulator, small size, no timing")
            precision(64, 96, 128, "cpu")


if __name__ == "__main__":
    main()
