"""Tensor-core matmul: kaio_ops against cuBLAS (torch.matmul), cuBLAS sgemm with TF32 off,
a Triton matmul and the mma.sync instruction ceiling, in one run.

Cases: M = N = K in 256..8192 (f16 and bf16), and decode shapes M = 1, 16 with K = N = 4096.
On sm_90 ``matmul_tc`` and its variants run ``kaio_ops.matmul``'s planner with f32 output
(the Hopper kernels, the skinny ones at M = 1 and 16); "kaio mma.sync" is the ``mma.sync``
kernel on the same shapes.
Every implementation is checked against float64 first (relative error normalized by the
reference's norm: 1e-3 for f16, 1e-2 for bf16). kaio's output is f32, cuBLAS's and Triton's
f16/bf16 (they write half the bytes), so both also run with f32 output ("cuBLAS f32 out",
"Triton f32 out": the same job as kaio's); on sm_90 at 4096 and up, the op "matmul f16, f16 C"
times the Hopper kernel writing f16 against them on their own output. ``--configs`` also
times every kaio tile configuration.
Usage: ``python bench/matmul.py --out results.json [--sizes 1024,4096]``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402
from bench.mma_peak import mma_peak_tflops  # noqa: E402
from kaio_ops import _arrays, _matmul_hopper  # noqa: E402
from kaio_ops.matmul import CONFIGS, SKINNY, Plan, heuristic, run  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # the Triton peer is skipped
    triton = None


if triton is not None:

    @triton.autotune(
        configs=[
            triton.Config({"BM": 128, "BN": 256, "BK": 64, "G": 8}, num_stages=3, num_warps=8),
            triton.Config({"BM": 256, "BN": 128, "BK": 64, "G": 8}, num_stages=3, num_warps=8),
            triton.Config({"BM": 128, "BN": 128, "BK": 64, "G": 8}, num_stages=4, num_warps=4),
            triton.Config({"BM": 128, "BN": 64, "BK": 64, "G": 8}, num_stages=4, num_warps=4),
            triton.Config({"BM": 64, "BN": 128, "BK": 32, "G": 8}, num_stages=4, num_warps=4),
            triton.Config({"BM": 64, "BN": 32, "BK": 32, "G": 8}, num_stages=5, num_warps=2),
        ],
        key=["M", "N", "K"],
    )
    @triton.jit
    def _triton_mm(
        a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr
    ):
        pid = tl.program_id(0)
        grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        group = pid // (G * grid_n)
        first = group * G
        size = min(grid_m - first, G)
        pm = first + (pid % (G * grid_n)) % size
        pn = (pid % (G * grid_n)) // size
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            kk = k * BK + rk
            x = tl.load(
                a + rm[:, None] * K + kk[None, :],
                mask=(rm[:, None] < M) & (kk[None, :] < K),
                other=0.0,
            )
            y = tl.load(
                b + kk[:, None] * N + rn[None, :],
                mask=(kk[:, None] < K) & (rn[None, :] < N),
                other=0.0,
            )
            acc += tl.dot(x, y)
        tl.store(
            c + rm[:, None] * N + rn[None, :],
            acc.to(c.dtype.element_ty),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )

    def triton_matmul(a, b, out_dtype=None):
        """Triton's tutorial matmul with 6 standard configurations, autotuned; C in
        ``out_dtype`` (default: the inputs')."""
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty((m, n), device=a.device, dtype=out_dtype or a.dtype)
        grid = lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)  # noqa: E731
        _triton_mm[grid](a, b, c, m, n, k)
        return c


def cublas_f32_out(a, b):
    """cuBLAS with f32 output (``torch.mm(..., out_dtype=torch.float32)``): the same job as
    kaio's matmul ops, whose contract is f32 C."""
    return torch.mm(a, b, out_dtype=torch.float32)


def hopper_f16_out(a, b):
    """kaio's Hopper kernel writing C in f16 (the variant the quantized QKV projections use,
    not a public op): the kernel against cuBLAS and Triton on their own f16 output."""
    inputs = _arrays.Inputs("matmul")
    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=torch.float16)
    m, k = a.shape
    _matmul_hopper.launch(
        inputs.array(a, "a"), inputs.array(b, "b"), m, b.shape[1], k,
        _arrays.multiprocessors(inputs.first), False, f16_outs=[c],
    )  # fmt: skip
    return c


def sgemm(a, b):
    """cuBLAS f32 sgemm with TF32 off (KAIO's published baseline)."""
    return torch.matmul(a, b)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    p.add_argument("--configs", action="store_true", help="also time every kaio config")
    p.add_argument("--dtypes", default="f16,bf16")
    args, _ = p.parse_known_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    h = Harness.from_args("tensor-core matmul")
    peak = mma_peak_tflops()
    h.meta["mma_sync_peak_tflops"] = peak
    print(f"register-only mma.sync m16n8k16 loop: {peak}", flush=True)
    hopper = kaio.device().arch == "sm_90"
    ops = {
        "f16": (torch.float16, kaio_ops.matmul_tc, kaio_ops.matmul_tc_async, 1e-3),
        "bf16": (torch.bfloat16, kaio_ops.matmul_tc_bf16, kaio_ops.matmul_tc_bf16_async, 1e-2),
    }
    for name in args.dtypes.split(","):
        dt, sync_op, async_op, tol = ops[name]
        kdt = {"f16": kaio.f16, "bf16": kaio.bf16}[name]
        shapes = [(s, s, s) for s in map(int, args.sizes.split(","))] + [
            (1, 4096, 4096),
            (16, 4096, 4096),
        ]
        for m, n, k in shapes:

            def make(m=m, n=n, k=k, dt=dt):
                return torch.randn(m, k, device="cuda", dtype=dt), torch.randn(
                    k, n, device="cuda", dtype=dt
                )

            impls = {"cuBLAS": torch.matmul, "kaio async": async_op, "kaio sync": sync_op}
            if m > 16:  # the same f32 output as kaio's ops
                impls["cuBLAS f32 out"] = cublas_f32_out
                if triton is not None:
                    impls["Triton f32 out"] = lambda a, b: triton_matmul(a, b, torch.float32)
            if m > 16:  # an explicit plan keeps the mma.sync kernel (sm_90 runs wgmma by default)
                plan = heuristic(m, n, k)
                impls["kaio mma.sync"] = lambda a, b, t=kdt, p=plan: run(a, b, t, True, p)
            if triton is not None:
                impls["Triton"] = triton_matmul
            if args.configs:
                names = [SKINNY] if m <= 16 else [c for c in CONFIGS if c != SKINNY]
                for cfg in names:
                    impls[f"kaio {cfg}"] = lambda a, b, c=cfg, t=kdt: run(a, b, t, True, Plan(c, 1))
                if m <= 16:
                    for s in (2, 4, 8, 16):
                        impls[f"kaio split{s}"] = lambda a, b, s=s, t=kdt: run(
                            a, b, t, True, Plan(SKINNY, s)
                        )
            h.case(
                f"matmul {name}",
                f"{m}x{n}x{k}",
                make,
                impls,
                reference=lambda a, b: a.double() @ b.double(),
                tol=tol,
                nbytes=(m * k + k * n) * 2 + m * n * 4,
                flops=2.0 * m * n * k,
                baseline="cuBLAS",
            )
            if name == "f16" and m == n == k and m >= 4096 and hopper:
                h.case(
                    "matmul f16, f16 C",
                    f"{m}x{n}x{k}",
                    make,
                    {"cuBLAS": torch.matmul, "kaio f16 out": hopper_f16_out}
                    | ({"Triton": triton_matmul} if triton is not None else {}),
                    reference=lambda a, b: a.double() @ b.double(),
                    tol=tol,
                    nbytes=(m * k + k * n + m * n) * 2,
                    flops=2.0 * m * n * k,
                    baseline="cuBLAS",
                )
            if name == "f16" and m == n == k and m in (1024, 4096):

                def make32(m=m, n=n, k=k):
                    return torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")

                h.case(
                    "sgemm f32 (TF32 off)",
                    f"{m}x{n}x{k}",
                    make32,
                    {"cuBLAS sgemm": sgemm},
                    reference=lambda a, b: a.double() @ b.double(),
                    tol=1e-5,
                    flops=2.0 * m * n * k,
                )
    h.finish()


if __name__ == "__main__":
    main()
