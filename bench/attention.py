"""Attention: kaio_ops against torch's scaled_dot_product_attention backends, in one run.

Cases (each implementation checked against float64 SDPA first):

- ``flash_attention`` f16 (and bf16) [B=4, H=16, S=4096, D=128], causal and not, against
  SDPA's flash backend (on sm_90 "kaio" is the Hopper kernel, "kaio mma.sync" the other);
  also grouped-query heads (H=32, Hkv=8) and other kaio tile configurations (``kaio w4 mb3``:
  4 warps, 3 blocks/SM; ``kaio w8``: 8 warps, 128-row tiles).
- ``flash_attention_bwd`` f16 at the same shape against SDPA flash's backward, and at
  [B=2, H=16, S=4096, D=256] (non-causal; dK and dV from one launch each).
- ``attention_flash`` f32 [S=4096, D=128] (single head), causal and not, against SDPA's
  memory-efficient backend in f32; and ``attention_flash_bwd`` against that backend's backward.
- ``attention_tc`` f16 [S, 64] for S in 64..512 against SDPA (default backend choice).

TFLOP/s counts 4 * B * H * Sq * Sk * D for a forward (half of it when causal), 2.5 times that
for a backward. Usage: ``python bench/attention.py --out results.json``.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402
from kaio_ops.attention import _arrays, tc_forward  # noqa: E402


def sdpa_with(backend):
    """torch SDPA restricted to one backend."""

    def run(q, k, v, causal=False):
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    return run


def reference(q, k, v, causal=False):
    """float64 SDPA (the math backend), grouped heads repeated."""
    group = q.shape[-3] // k.shape[-3] if q.dim() == 4 else 1
    if group > 1:
        k, v = (x.repeat_interleave(group, dim=-3) for x in (k, v))
    return sdpa(q.double(), k.double(), v.double(), is_causal=causal)


def reference_grads(q, k, v, do, causal=False):
    """(dq, dk, dv) through float64 SDPA (the math backend)."""
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out = sdpa(q64, k64, v64, is_causal=causal)
    return torch.autograd.grad(out, (q64, k64, v64), do.double())


def kaio_config(warps: int, min_blocks: int):
    """flash_attention with a given tile configuration (D = 128: 64 keys a tile)."""

    def run(q, k, v, causal=False):
        inputs = _arrays.Inputs("bench")
        qa, ka, va = (inputs.array(x, n, ndim=4) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        b, h, s, d = q.shape
        dims = (b * h, h, h // k.shape[1], s, k.shape[2], d, d)
        cfg = {"WARPS": warps, "BN": 64, "MIN_BLOCKS": min_blocks}
        return tc_forward(qa, ka, va, qa.dtype, q.shape, dims, causal, d**-0.5, 128, cfg)[0]

    return run


def flops(b, h, sq, sk, d, causal, backward=False):
    f = 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0)
    return f * 2.5 if backward else f


def main() -> None:
    h = Harness.from_args("attention", reps=30)
    flash = sdpa_with(SDPBackend.FLASH_ATTENTION)
    efficient = sdpa_with(SDPBackend.EFFICIENT_ATTENTION)

    # flash_attention, [B, H, S, D] f16 / bf16
    shapes = [(4, 16, 16, 4096, 128, torch.float16), (4, 16, 16, 4096, 128, torch.bfloat16)]
    shapes.append((2, 32, 8, 4096, 128, torch.float16))  # grouped-query
    for b, hq, hkv, s, d, dt in shapes:
        for causal in (False, True):
            if dt == torch.bfloat16 and causal or hkv != hq and causal:
                continue

            def make(b=b, hq=hq, hkv=hkv, s=s, d=d, dt=dt):
                q = torch.randn(b, hq, s, d, device="cuda", dtype=dt)
                k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=dt) for _ in range(2))
                return q, k, v

            impls = {
                "torch SDPA flash": lambda q, k, v, c=causal: flash(q, k, v, c),
                "kaio": lambda q, k, v, c=causal: kaio_ops.flash_attention(q, k, v, causal=c),
                # the mma.sync kernel, which "kaio" runs on GPUs other than sm_90
                "kaio mma.sync": lambda q, k, v, c=causal: kaio_config(4, 2)(q, k, v, c),
            }
            if dt == torch.float16 and hq == hkv:
                impls["kaio w4 mb3"] = lambda q, k, v, c=causal: kaio_config(4, 3)(q, k, v, c)
                impls["kaio w8"] = lambda q, k, v, c=causal: kaio_config(8, 1)(q, k, v, c)
            name = {torch.float16: "f16", torch.bfloat16: "bf16"}[dt]
            h.case(
                f"flash_attention {name}" + " causal" * causal,
                f"B{b} H{hq}/{hkv} S{s} D{d}",
                make,
                impls,
                reference=lambda q, k, v, c=causal: reference(q, k, v, c),
                tol=1e-3 if dt == torch.float16 else 1e-2,
                nbytes=2 * (b * hq * s * d * 2 + 2 * b * hkv * s * d),
                flops=flops(b, hq, s, s, d, causal),
                baseline="torch SDPA flash",
            )

    # flash_attention_bwd, f16 [B, H, S, D]
    bwd_shapes = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (2, 16, 4096, 256, False)]
    for b, hq, s, d, causal in bwd_shapes:

        def make_fbwd(c=causal, b=b, hq=hq, s=s, d=d):
            q, k, v, do = (
                torch.randn(b, hq, s, d, device="cuda", dtype=torch.half) for _ in "qkvd"
            )
            o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=c)
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            out = flash(*leaves, c)
            return q, k, v, do, o, lse, leaves, out

        h.case(
            "flash_attention_bwd f16" + " causal" * causal,
            f"B{b} H{hq} S{s} D{d}",
            make_fbwd,
            {
                "torch SDPA flash": lambda q, k, v, do, o, lse, leaves, out: torch.autograd.grad(
                    out, leaves, do, retain_graph=True
                ),
                "kaio": lambda q, k, v, do, o, lse, leaves, out, c=causal: (
                    kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal=c)
                ),
            },
            reference=lambda q, k, v, do, o, lse, leaves, out, c=causal: reference_grads(
                q, k, v, do, c
            ),
            tol=5e-3,
            flops=flops(b, hq, s, s, d, causal, backward=True),
            baseline="torch SDPA flash",
            set_bytes=7 * b * hq * s * d * 2,
        )

    # attention_flash, f32 [S, D] single head, forward and backward
    s, d = 4096, 128
    for causal in (False, True):

        def make32(s=s, d=d):
            return tuple(torch.randn(s, d, device="cuda") for _ in range(3))

        fwd = kaio_ops.attention_flash_causal if causal else kaio_ops.attention_flash
        h.case(
            "attention_flash f32" + " causal" * causal,
            f"S{s} D{d}",
            make32,
            {
                "torch SDPA efficient": lambda q, k, v, c=causal: efficient(
                    q[None, None], k[None, None], v[None, None], c
                )[0, 0],
                "kaio": fwd,
            },
            reference=lambda q, k, v, c=causal: reference(q, k, v, c),
            tol=1e-5,
            nbytes=4 * 4 * s * d,
            flops=flops(1, 1, s, s, d, causal),
            baseline="torch SDPA efficient",
        )

        def make_bwd(s=s, d=d, c=causal):
            q, k, v, do = (torch.randn(s, d, device="cuda") for _ in range(4))
            o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=c)
            leaves = [x[None, None].clone().requires_grad_() for x in (q, k, v)]
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                out = sdpa(*leaves, is_causal=c)
            return q, k, v, do, o, lse, leaves, out

        bwd = kaio_ops.attention_flash_bwd_causal if causal else kaio_ops.attention_flash_bwd

        def torch_bwd(q, k, v, do, o, lse, leaves, out):
            grads = torch.autograd.grad(out, leaves, do[None, None], retain_graph=True)
            return tuple(g[0, 0] for g in grads)

        def ref_bwd(q, k, v, do, o, lse, leaves, out, c=causal):
            grads = reference_grads(*(x[None, None] for x in (q, k, v, do)), c)
            return tuple(g[0, 0] for g in grads)

        h.case(
            "attention_flash_bwd f32" + " causal" * causal,
            f"S{s} D{d}",
            make_bwd,
            {
                "torch SDPA efficient": torch_bwd,
                "kaio": lambda q, k, v, do, o, lse, leaves, out, b=bwd: b(do, q, k, v, o, lse),
            },
            reference=ref_bwd,
            tol=1e-5,
            flops=flops(1, 1, s, s, d, causal, backward=True),
            baseline="torch SDPA efficient",
            set_bytes=8 * 4 * s * d,
        )

    # attention_tc, f16 single head at short sequences
    for s in (64, 128, 256, 512):
        d = 64

        def make16(s=s, d=d):
            return tuple(torch.randn(s, d, device="cuda", dtype=torch.float16) for _ in range(3))

        h.case(
            "attention_tc f16",
            f"S{s} D{d}",
            make16,
            {
                "torch SDPA": lambda q, k, v: sdpa(q[None, None], k[None, None], v[None, None])[
                    0, 0
                ],
                "kaio": kaio_ops.attention_tc,
            },
            reference=lambda q, k, v: reference(q, k, v),
            tol=1e-3,
            flops=flops(1, 1, s, s, d, False),
            baseline="torch SDPA",
        )
    h.finish()


if __name__ == "__main__":
    main()
