"""Variable-length attention: ``flash_attention_varlen`` on a packed batch against padding
every sequence to the longest, in one run.

A batch of B sequences whose lengths are drawn uniformly from [max / 8, max] (a fixed seed),
packed [total, H, D]. Implementations, each timed with CUDA events (bench/harness.py):

- ``kaio varlen``: ``kaio_ops.flash_attention_varlen`` on the packed tensors (on sm_90 the
  Hopper kernel where it measured faster, ``attention_varlen.hopper_takes``), and its two
  kernels launched directly: ``kaio varlen Hopper`` (``kaio_ops._attention_hopper_varlen``:
  TMA, wgmma; sm_90 only) and ``kaio varlen mma.sync`` (what other GPUs run);
- ``kaio padded``: ``kaio_ops.flash_attention`` on [B, H, max, D] (zeros past each end; on
  sm_90 it takes the Hopper kernel where that measured faster), and ``kaio padded
  mma.sync``: the same kernel as varlen's, padded;
- ``torch SDPA padded``: the flash backend on the padded batch, no mask (the fastest padded
  peer: its results past each sequence's keys are not masked, so only timed; causal padding
  at the end is exact);
- ``torch varlen``: ``torch.nn.attention.varlen.varlen_attn`` where this torch has it.

The padded implementations are timed on tensors already padded (the copies to and from the
packed layout are not counted: the comparison favours padding). TFLOP/s counts the useful
work, 4 * H * sum(sq * sk) * D (causal: sum(sq * (sq + 1) / 2)), for every implementation.
The backward cases (``BWD_CASES``) compare ``flash_attention_varlen_bwd`` (as dispatched:
on sm_90 the Hopper kernels where they measured faster, ``attention_varlen.hopper_bwd_takes``)
and its two paths launched directly (``kaio varlen Hopper``,
``kaio_ops._attention_hopper_varlen_bwd``, sm_90 and D 64 or 128 only; ``kaio varlen
mma.sync``) with ``flash_attention_bwd`` padded and torch SDPA flash's backward padded.
Correctness first: the varlen outputs against float32 attention per sequence (SDPA's
memory-efficient backend, f32 throughout, else its math one).

Usage: ``python bench/attention_varlen.py --out results.json [--quick] [--cases 0,2]
[--no-bwd] [--no-fwd] [--bwd-cases 0,1]`` (``--cases``: the forward cases of ``CASES`` by
index; ``--bwd-cases``: the backward cases of ``BWD_CASES`` (default the first three);
``--no-bwd``, ``--no-fwd``: no backward, resp. forward, cases).
"""

from __future__ import annotations

import inspect
import os
import sys

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402
from kaio_ops import _attention_hopper_varlen, attention_varlen  # noqa: E402
from kaio_ops.attention import _arrays, tc_forward  # noqa: E402

try:  # torch >= 2.9
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - older torch
    varlen_attn = None


def torch_varlen(q, k, v, cu, top, causal):
    """torch's own varlen attention (FlashAttention's kernels): ``is_causal`` in the first
    releases, ``window_size=(-1, 0)`` in later ones."""
    if "is_causal" in inspect.signature(varlen_attn).parameters:
        return varlen_attn(q, k, v, cu, cu, top, top, is_causal=causal)
    return varlen_attn(q, k, v, cu, cu, top, top, window_size=(-1, 0) if causal else (-1, -1))


def lengths(b: int, top: int, seed: int) -> list[int]:
    """B lengths uniform in [top / 8, top], the first one ``top`` (the max is reached)."""
    rng = np.random.default_rng(seed)
    out = rng.integers(max(1, top // 8), top + 1, b).tolist()
    out[0] = top
    return out


def offsets(lens: list[int]) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")


def pad(x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """Packed [total, H, D] -> [B, H, max, D], zeros past each sequence's end."""
    out = x.new_zeros(len(lens), x.shape[1], max(lens), x.shape[2])
    start = 0
    for b, n in enumerate(lens):
        out[b, :, :n] = x[start : start + n].transpose(0, 1)
        start += n
    return out


def reference(q, k, v, lens, causal):
    """Packed float32 attention, sequence by sequence (SDPA's memory-efficient backend in
    f32, or its math one)."""
    group = q.shape[1] // k.shape[1]
    outs, start = [], 0
    for n in lens:
        qs, ks, vs = (x[start : start + n].transpose(0, 1).float() for x in (q, k, v))
        ks, vs = (x.repeat_interleave(group, 0) for x in (ks, vs))
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            outs.append(sdpa(qs, ks, vs, is_causal=causal).transpose(0, 1))
        start += n
    return torch.cat(outs)


def mma_sync_padded(q, k, v, causal):
    """flash_attention's mma.sync kernel (the varlen kernel's body) on the padded batch."""
    inputs = _arrays.Inputs("bench")
    qa, ka, va = (inputs.array(x, n, ndim=4) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    b, h, s, d = q.shape
    dims = (b * h, h, h // k.shape[1], s, k.shape[2], d, d)
    dp = 64 if d <= 64 else 128 if d <= 128 else 256
    return tc_forward(qa, ka, va, qa.dtype, q.shape, dims, causal, d**-0.5, dp)[0]


def mma_sync_varlen(q, k, v, cu, top, causal):
    """flash_attention_varlen's mma.sync kernel (what GPUs other than sm_90 run)."""
    args = attention_varlen._check("bench", q, k, v, cu, cu, top, top, None)
    return attention_varlen._forward_mma(*args[0], args[1], causal, args[2])[0]


def hopper_varlen(q, k, v, cu, top, causal):
    """flash_attention_varlen's Hopper kernel (sm_90), whatever the dispatch would pick."""
    (qa, ka, va, cqa, cka), dims, scale = attention_varlen._check(
        "bench", q, k, v, cu, cu, top, top, None
    )
    return _attention_hopper_varlen.launch(qa, ka, va, cqa, cka, dims, causal, scale)[0]


def useful_flops(lens, h, d, causal) -> float:
    pairs = sum(n * (n + 1) / 2 if causal else n * n for n in lens)
    return 4.0 * h * d * pairs


def forward_case(hb: Harness, b, top, h, hkv, d, dt, causal, seed):
    lens = lengths(b, top, seed)
    total = sum(lens)

    def make():
        q = torch.randn(total, h, d, device="cuda", dtype=dt)
        k, v = (torch.randn(total, hkv, d, device="cuda", dtype=dt) for _ in range(2))
        cu = offsets(lens)
        padded = [pad(x, lens) for x in (q, k, v)]
        return q, k, v, cu, *padded

    def kaio_varlen(q, k, v, cu, *_):
        return kaio_ops.flash_attention_varlen(q, k, v, cu, cu, top, top, causal)

    impls = {
        "kaio varlen": kaio_varlen,
        "kaio varlen mma.sync": lambda q, k, v, cu, *_: mma_sync_varlen(q, k, v, cu, top, causal),
        "kaio padded": lambda q, k, v, cu, qp, kp, vp: kaio_ops.flash_attention(
            qp, kp, vp, causal=causal
        ),
        "kaio padded mma.sync": lambda q, k, v, cu, qp, kp, vp: mma_sync_padded(qp, kp, vp, causal),
        "torch SDPA padded": lambda q, k, v, cu, qp, kp, vp: _sdpa_flash(qp, kp, vp, causal),
    }
    if torch.cuda.get_device_capability() == (9, 0):
        impls["kaio varlen Hopper"] = lambda q, k, v, cu, *_: hopper_varlen(
            q, k, v, cu, top, causal
        )
    if varlen_attn is not None and h == hkv:
        impls["torch varlen"] = lambda q, k, v, cu, *_: torch_varlen(q, k, v, cu, top, causal)
    name = {torch.float16: "f16", torch.bfloat16: "bf16"}[dt]
    return hb.case(
        f"flash_attention_varlen {name}" + " causal" * causal,
        f"B{b} H{h}/{hkv} S<={top} D{d} (mean {total // b})",
        make,
        impls,
        reference=lambda q, k, v, *_: reference(q, k, v, lens, causal),
        tol=1e-3 if dt == torch.float16 else 1e-2,
        flops=useful_flops(lens, h, d, causal),
        baseline="torch SDPA padded",
        set_bytes=2 * 3 * (total + b * top) * h * d,
        timing_only=("kaio padded", "kaio padded mma.sync", "torch SDPA padded"),
    )


def _sdpa_flash(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return sdpa(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def mma_sync_varlen_bwd(do, q, k, v, o, lse, cu, top, causal):
    """flash_attention_varlen_bwd's mma.sync kernels (what GPUs other than sm_90 run)."""
    return attention_varlen.backward_mma(do, q, k, v, o, lse, cu, cu, top, top, causal, None)


def hopper_varlen_bwd(do, q, k, v, o, lse, cu, top, causal):
    """flash_attention_varlen_bwd's Hopper kernels (sm_90), whatever the dispatch would pick."""
    return attention_varlen.backward_hopper(do, q, k, v, o, lse, cu, cu, top, top, causal, None)


def backward_case(hb: Harness, b, top, h, hkv, d, dt, causal, seed):
    lens = lengths(b, top, seed)
    total = sum(lens)

    def make():
        q, do = (torch.randn(total, h, d, device="cuda", dtype=dt) for _ in range(2))
        k, v = (torch.randn(total, hkv, d, device="cuda", dtype=dt) for _ in range(2))
        cu = offsets(lens)
        o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, cu, cu, top, top, causal)
        qp, kp, vp, dop = (pad(x, lens) for x in (q, k, v, do))
        op, lsep = kaio_ops.flash_attention_with_stats(qp, kp, vp, causal=causal)
        leaves = [x.clone().requires_grad_() for x in (qp, kp, vp)]
        out = _sdpa_flash(*leaves, causal)
        return q, k, v, do, cu, o, lse, qp, kp, vp, dop, op, lsep, leaves, out

    def kaio_varlen(q, k, v, do, cu, o, lse, *_):
        return kaio_ops.flash_attention_varlen_bwd(do, q, k, v, o, lse, cu, cu, top, top, causal)

    def kaio_padded(q, k, v, do, cu, o, lse, qp, kp, vp, dop, op, lsep, *_):
        return kaio_ops.flash_attention_bwd(dop, qp, kp, vp, op, lsep, causal=causal)

    def sdpa_padded(*args):
        dop, leaves, out = args[10], args[13], args[14]
        return torch.autograd.grad(out, leaves, dop, retain_graph=True)

    def ref(q, k, v, do, *_):
        leaves = [x.float().requires_grad_() for x in (q, k, v)]
        reference(*leaves, lens, causal).backward(do.float())
        return tuple(x.grad for x in leaves)

    impls = {
        "kaio varlen": kaio_varlen,
        "kaio varlen mma.sync": lambda q, k, v, do, cu, o, lse, *_: mma_sync_varlen_bwd(
            do, q, k, v, o, lse, cu, top, causal
        ),
        "kaio padded": kaio_padded,
        "torch SDPA padded": sdpa_padded,
    }
    if torch.cuda.get_device_capability() == (9, 0) and d in (64, 128):
        impls["kaio varlen Hopper"] = lambda q, k, v, do, cu, o, lse, *_: hopper_varlen_bwd(
            do, q, k, v, o, lse, cu, top, causal
        )
    name = {torch.float16: "f16", torch.bfloat16: "bf16"}[dt]
    return hb.case(
        f"flash_attention_varlen_bwd {name}" + " causal" * causal,
        f"B{b} H{h}/{hkv} S<={top} D{d} (mean {total // b})",
        make,
        impls,
        reference=ref,
        tol=5e-3 if dt == torch.float16 else 3e-2,
        flops=2.5 * useful_flops(lens, h, d, causal),
        baseline="torch SDPA padded",
        set_bytes=2 * 8 * (total + b * top) * h * d,
        timing_only=("kaio padded", "torch SDPA padded"),
    )


# forward cases (B, max length, H, Hkv, D, dtype)
CASES = [
    (8, 4096, 16, 16, 128, torch.float16),
    (16, 2048, 32, 8, 128, torch.bfloat16),
    (32, 1024, 16, 16, 64, torch.float16),
    (4, 8192, 16, 16, 128, torch.float16),
    (8, 4096, 16, 16, 256, torch.float16),
    (64, 512, 16, 16, 128, torch.float16),
]

# backward cases (B, max length, H, Hkv, D, dtype); the first one's seed (7) as before
BWD_CASES = [
    (8, 4096, 16, 16, 128, torch.float16),
    (32, 1024, 16, 16, 64, torch.float16),
    (16, 2048, 32, 8, 128, torch.bfloat16),
    (64, 512, 16, 16, 128, torch.float16),
    (4, 8192, 16, 16, 128, torch.float16),
    (16, 2048, 16, 16, 64, torch.bfloat16),
]


def main() -> None:
    quick = "--quick" in sys.argv
    hb = Harness.from_args("attention varlen", reps=20 if quick else 30)
    cases = CASES if not quick else CASES[:3]
    if "--cases" in sys.argv:
        picked = sys.argv[sys.argv.index("--cases") + 1].split(",")
        cases = [CASES[int(i)] for i in picked]
    if "--no-fwd" in sys.argv:
        cases = []
    for b, top, h, hkv, d, dt in cases:
        for causal in (False, True):
            forward_case(
                hb, b, top, h, hkv, d, dt, causal, seed=CASES.index((b, top, h, hkv, d, dt))
            )
    bwd_cases = BWD_CASES[:3] if not quick else BWD_CASES[:2]  # the others: --bwd-cases
    if "--bwd-cases" in sys.argv:
        picked = sys.argv[sys.argv.index("--bwd-cases") + 1].split(",")
        bwd_cases = [BWD_CASES[int(i)] for i in picked]
    if "--no-bwd" not in sys.argv:
        for c in bwd_cases:
            b, top, h, hkv, d, dt = c
            for causal in (False, True):
                backward_case(hb, b, top, h, hkv, d, dt, causal, seed=7 + BWD_CASES.index(c))
    hb.finish()
    print(hb.table())


if __name__ == "__main__":
    main()
