"""The user silu*gate kernel of shared/API.md section 1 (one f32 element a thread, 64M
elements) with and without ``@kaio.gpu_kernel(fastmath=True)``, and written with four
elements a thread (``examples/quickstart.py``'s ``fused_silu_gate_x4``: 16-byte loads and
stores), against the same kernel in Triton (1024 elements a program, 8 a thread; its
``tl.exp`` is approximate too): python bench/fastmath.py --out results.json.

fastmath turns ``kaio.exp`` into ex2.approx.ftz and the division into div.full.ftz.f32 (the
IEEE ``div.rn.f32`` otherwise): the difference the issue measured between nvcc with and
without ``-use_fast_math`` (docs/dsl-reference.md, "Fast math").
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
from bench.harness import Harness  # noqa: E402
from examples.quickstart import fused_silu_gate, fused_silu_gate_x4  # noqa: E402

N = 64 * 2**20
BLOCK = 256
assert fused_silu_gate.block_size == fused_silu_gate_x4.block_size == BLOCK
PRECISE = fused_silu_gate  # API.md's kernel
FAST = kaio.gpu_kernel(block_size=BLOCK, fastmath=True)(fused_silu_gate.pyfunc)  # same source


@triton.jit
def _tri_silu_gate(x_ptr, g_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    g = tl.load(g_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x / (1.0 + tl.exp(-x)) * g, mask=mask)


def _kaio(kernel, per_thread=1):
    def run(x, g):
        out = torch.empty_like(x)
        kernel[(triton.cdiv(N, BLOCK * per_thread),)](x, g, out, N)
        return out

    return run


def _triton(x, g):
    out = torch.empty_like(x)
    _tri_silu_gate[(triton.cdiv(N, 1024),)](x, g, out, N, BLOCK=1024)
    return out


def main() -> None:
    h = Harness.from_args("silu*gate user kernel: kaio fastmath vs precise vs Triton")
    print(f"GPU: {h.meta['gpu']}; copy bandwidth {h.copy_bandwidth():.0f} GB/s", flush=True)
    h.case(
        "silu_gate user kernel",
        f"f32 [{N}]",
        lambda: (torch.randn(N, device="cuda"), torch.randn(N, device="cuda")),
        {
            "kaio": _kaio(PRECISE),
            "kaio fastmath": _kaio(FAST),
            "kaio x4": _kaio(fused_silu_gate_x4, 4),
            "triton": _triton,
        },
        reference=lambda x, g: torch.nn.functional.silu(x.double()) * g.double(),
        tol=1e-6,
        nbytes=3 * N * 4,
        baseline="kaio",
    )
    h.finish()


if __name__ == "__main__":
    main()
