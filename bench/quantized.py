"""Quantized matmuls against their peers, in one run: ``matmul_int8`` at 4096^3 against
``torch._int_mm`` (cuBLAS int8), and ``matmul_int4`` (W4A16, groups of 128) at decode shapes
(M = 1, 16) and at M = 4096 against cuBLAS f16 on the same shape with the dequantized
weights. Then the fused QKV projections, ``qkv_project_int4`` and ``qkv_project_int8``
(W8A16), against three separate calls (``matmul_int4``; for int8 the same kernel launched
once per weight, ``kaio_ops.quantized.project_int8``), at M = 1, 16 and 4096 with K = 4096
and N = 4096 per projection: the peer's time is the three calls' together. Each
implementation is first checked against float64.

At decode shapes two more things are timed. A floor, ``bench.floors.read_words``: a kernel
that only reads the packed weights once (16-byte loads, all in flight before any is used) and
does none of the product, so no W4A16 kernel can beat it under the same timing. And the same
cases with ``BATCH`` calls back to back between one pair of events: a call of a few
microseconds is otherwise timed with the gap that each pair of events adds around it (about
2 µs on an H100, the same for every implementation, which pulls every ratio towards 1).
Last, ``matmul_int4`` over M = 1, 16, 32, 64, 128 at K = N = 4096 and 8192 against cuBLAS
f16 (``int4_sweep``; alone with ``--only matmul_int4_sweep``; ``--quick`` leaves it out).
Usage: ``python bench/quantized.py --out results.json``.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench import floors  # noqa: E402
from bench.harness import Harness  # noqa: E402
from kaio_ops.quantized import project_int8  # noqa: E402

SEPARATE_INT4 = "3 separate calls (matmul_int4)"
SEPARATE_INT8 = "3 separate calls (same kernel)"
READ_ONLY = "floor: read the weights only"
BATCH = 20  # calls a pair of events in the batched decode cases
SWEEP_M = (1, 16, 32, 64, 128)  # int4_sweep's batch sizes


def read_only(packed: torch.Tensor):
    """A call of ``read_words`` over ``packed`` (its scratch output made once here), on
    torch's current stream: a launch given no stream does not join a CUDA graph being
    captured on another (the floor then timed 1-2 µs for 33-235 MB, an empty graph)."""
    blocks = floors.blocks_for(packed.numel())
    scratch = torch.empty(blocks * floors.THREADS, dtype=torch.int32, device=packed.device)

    def call(a, p, s, w):
        stream = torch.cuda.current_stream(p.device).cuda_stream
        return floors.read_words[blocks, floors.THREADS, stream, 0](p, scratch)

    return call


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


def int4_bytes(n: int, k: int) -> int:
    """The bytes of one int4 weight [K, N]: packed words and f16 scales. The L2 rotation is
    sized on these (the f16 copy in the same set is read only by cuBLAS): with the whole set
    counted, 3 sets of 4096 x 4096 weights kept the int4 words warm in a 50 MB L2."""
    return k * n // 2 + k // 128 * n * 2


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
            set_bytes=mm * k * 2 + 3 * int4_bytes(n, k),  # the int4 side's data, cold too
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


def int4_case(h: Harness, op: str, label: str, mm: int, n: int, k: int, floor: dict,
              batch: int) -> None:  # fmt: skip
    """``matmul_int4`` of ``mm`` rows by an [n, k] weight (``op``: the case's name, ``label``
    its row) against cuBLAS f16 on the dequantized weights, and the ``floor`` implementations
    (timed, not checked); ``batch`` calls between a pair of events."""
    h.case(
        op,
        label,
        lambda: int4_inputs(mm, n, k),
        {
            "cuBLAS f16": lambda a, p, s, w: torch.matmul(a, w),
            "kaio int4": lambda a, p, s, w: kaio_ops.matmul_int4(a, p, s),
            **floor,
        },
        reference=lambda a, p, s, w: a.double() @ w.double(),
        tol=1e-3,
        nbytes=mm * k * 2 + k * n // 2 + mm * n * 4,
        flops=2.0 * mm * n * k,
        baseline="cuBLAS f16",
        set_bytes=mm * k * 2 + int4_bytes(n, k),  # the int4 side's data, cold too
        batch=batch,
        timing_only=tuple(floor),
    )


def int4_sweep(h: Harness) -> None:
    """``matmul_int4`` over the batch sizes of a decode step (M = 1 .. 128) at K = N = 4096
    and 8192, against cuBLAS f16 on the dequantized weights and the read-the-weights floor,
    ``BATCH`` calls between a pair of events: M <= 64 runs the decode kernel (M > 16 with
    several m16 tiles a block), M = 128 the prefill or tiled path. Alone:
    ``--only matmul_int4_sweep``."""
    for size in (4096, 8192):
        floor = {
            READ_ONLY: read_only(torch.empty(size // 8, size, dtype=torch.int32, device="cuda"))
        }
        for mm in SWEEP_M:
            label = f"{mm}x{size}x{size}, {BATCH} calls in a row"
            int4_case(h, "matmul_int4_sweep", label, mm, size, size, floor, BATCH)


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
    floor = {READ_ONLY: read_only(torch.empty(k // 8, n, dtype=torch.int32, device="cuda"))}
    for mm, batch in ((1, 1), (16, 1), (4096, 1), (1, BATCH), (16, BATCH)):
        label = f"{mm}x{n}x{k}" + (f", {batch} calls in a row" if batch > 1 else "")
        int4_case(h, "matmul_int4", label, mm, n, k, floor if mm <= 16 else {}, batch)
    qkv_cases(h, n, k)
    if "--quick" not in sys.argv:  # the sweep: full runs, or alone with --only
        int4_sweep(h)
    h.finish()


if __name__ == "__main__":
    main()
