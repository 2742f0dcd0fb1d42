"""kaio_ops GGUF quantizers on the GPU against the NumPy port of ggml's reference encoder on
the host (python bench/gguf.py --out results.json).

A 4096 x 4096 weight (f32, f16, bf16, values ~ N(0, 0.02)) is quantized to Q6_K and Q8_0 and
the blocks decoded back. Every GPU result is first checked byte for byte (tolerance 0) against
tests/gguf_reference.py, then timed by bench/harness.py (CUDA events, median). The reference
encoder's host time (time.perf_counter, median of REPS calls on the f32 tensor) is the
baseline of the quantizer rows: "vs baseline" is how many times faster the GPU is. GB/s
counts the bytes the op must move: the input read once and the output written once.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness, Result  # noqa: E402
from tests import gguf_reference as ref  # noqa: E402

SHAPE = (4096, 4096)
REPS = 3  # host calls of the NumPy reference encoder
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
OPS = {  # name: (kaio quantizer, kaio dequantizer, numpy quantizer, block bytes, values a block)
    "q6_k": (kaio_ops.quantize_q6_k, kaio_ops.dequantize_q6_k, ref.quantize_q6_k, 210, 256),
    "q8_0": (kaio_ops.quantize_q8_0, kaio_ops.dequantize_q8_0, ref.quantize_q8_0, 34, 32),
}


def host_time(fn, x) -> tuple[float, object]:
    """Median milliseconds of REPS calls fn(x) on the host, and the last result."""
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        out = fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main() -> None:
    h = Harness.from_args("kaio_ops GGUF quantizers vs ggml's reference encoder (NumPy)")
    print(f"GPU: {h.meta['gpu']}; copy bandwidth {h.copy_bandwidth():.0f} GB/s", flush=True)
    base = torch.randn(SHAPE, device="cuda") * 0.02
    n = base.numel()
    for op, (quantize, dequantize, np_quantize, nbytes, group) in OPS.items():
        out_bytes = n // group * nbytes
        host_ms = None
        for name, dt in DTYPES.items():
            x = base.to(dt)
            host = x.float().cpu().numpy()
            if host_ms is None:  # the reference's host time, on the f32 tensor
                host_ms, expected = host_time(np_quantize, host)
                h.results.append(
                    Result(
                        f"quantize_{op}",
                        f"f32 {list(SHAPE)}",
                        "numpy ref (host)",
                        True,
                        0.0,
                        host_ms,
                        note=f"median of {REPS} calls, time.perf_counter",
                    )
                )
            else:
                expected = np_quantize(host)
            expected_t = torch.from_numpy(expected).cuda()
            done = h.case(
                f"quantize_{op}",
                f"{name} {list(SHAPE)}",
                lambda x=x: (x,),
                {"kaio": quantize},
                reference=lambda x, e=expected_t: e,
                tol=0.0,
                nbytes=n * x.element_size() + out_bytes,
            )
            for r in done:
                if r.ms:
                    r.vs_baseline = host_ms / r.ms
        blocks = quantize(base)
        np_dequantize = {"q6_k": ref.dequantize_q6_k, "q8_0": ref.dequantize_q8_0}[op]
        decoded = torch.from_numpy(np_dequantize(blocks.cpu().numpy())).cuda()
        h.case(
            f"dequantize_{op}",
            f"{out_bytes} B -> f32 {list(SHAPE)}",
            lambda b=blocks: (b,),
            {"kaio": dequantize},
            reference=lambda b, e=decoded: e,
            tol=0.0,
            nbytes=out_bytes + 4 * n,
        )
    h.copy_bandwidth()  # again at the end: the GPU's state may drift in a shared machine
    h.finish()


if __name__ == "__main__":
    main()
