"""A Llama-style decoder block built from kaio ops in PyTorch, checked against plain torch.

The block (pre-norm, as in Llama): ``h = x + Wo(attention(rope(q), rope(k), v))`` with q, k, v
from one fused QKV projection of ``rms_norm(x)``, then ``out = h + W_down(silu(g) * u)`` with
g, u from one fused gate/up projection of ``rms_norm(h)``. It is written once (``block``)
against a small set of ops, and run with two sets:

- ``KAIO``: ``torch.ops.kaio.*`` (``import kaio_ops.torch``): rms_norm, the QKV, output and MLP
  projections on kaio's tensor-core matmul (``matmul_tc``: f16 in, f32 out, cast to f16), rope,
  rms_norm_residual (the residual add and the second norm in one pass), silu_gate, add, and
  attention: kaio's ``flash_attention`` (causal; its backward on kaio's kernels too), or
  torch's ``scaled_dot_product_attention`` where kaio_ops has no differentiable one.
- ``TORCH``: the same block in plain torch ops.

With random weights, the f16 kaio block's output and the gradients of the input and of every
weight are compared with the same block in plain torch computed in f32 (weights and input
upcast), as relative errors ``|a - ref| / |ref|`` (Frobenius norms), next to the errors of the
plain-torch block in f16; each must be below ``TOLERANCE``.

Runs on the GPU when there is one; without one, runs a tiny block on kaio's CPU simulator
(``with kaio.simulate():``, CPU tensors); without PyTorch it says so and exits.
Run: python examples/torch_decoder_block.py
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from dataclasses import dataclass

TOLERANCE = 1e-2  # relative error of the f16 kaio block against the f32 torch block


@dataclass(frozen=True)
class Config:
    """Block and batch sizes."""

    batch: int = 2
    seq: int = 128
    dim: int = 512
    heads: int = 8
    ffn: int = 1376  # about 8/3 * dim, a multiple of 32
    eps: float = 1e-6
    theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        """Dimension of one head."""
        return self.dim // self.heads


GPU = Config()
TINY = Config(batch=1, seq=8, dim=64, heads=2, ffn=96)  # for the CPU simulator


def kaio_ops_set():
    """The block's ops from ``torch.ops.kaio`` (attention: kaio's flash attention if it has a
    gradient, else torch SDPA)."""
    import torch
    import torch.nn.functional as F

    import kaio_ops.torch as kt

    if "flash_attention" in kt.REGISTERED and kt.differentiable("flash_attention"):
        attention = types.SimpleNamespace(
            name="kaio flash_attention",
            fn=lambda q, k, v: torch.ops.kaio.flash_attention(q, k, v, True),
        )
    else:
        attention = types.SimpleNamespace(
            name="torch SDPA",
            fn=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        )
    kaio = torch.ops.kaio
    return types.SimpleNamespace(
        rms_norm=kaio.rms_norm,
        rms_norm_residual=kaio.rms_norm_residual,
        matmul=kaio.matmul_tc,
        rope=kaio.rope,
        attention=attention.fn,
        attention_name=attention.name,
        silu_gate=kaio.silu_gate,
        add=kaio.add,
    )


def torch_ops_set():
    """The same ops in plain torch, computed in f32 and rounded to the input dtype, as the
    kaio ops do."""
    import torch
    import torch.nn.functional as F

    def rms_norm(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def rms_norm_residual(x, residual, w, eps):
        s = (residual.float() + x.float()).to(x.dtype)
        return rms_norm(s, w, eps), s

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        a, b = x.float()[..., :half], x.float()[..., half:]
        c, s = cos.float()[:, None, :], sin.float()[:, None, :]
        return torch.cat([a * c - b * s, b * c + a * s], -1).to(x.dtype)

    def silu_gate(x, gate):
        return (F.silu(x.float()) * gate.float()).to(x.dtype)

    return types.SimpleNamespace(
        rms_norm=rms_norm,
        rms_norm_residual=rms_norm_residual,
        matmul=lambda a, b: torch.matmul(a, b).float(),
        rope=rope,
        attention=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        attention_name="torch SDPA",
        silu_gate=silu_gate,
        add=lambda x, y: (x.float() + y.float()).to(x.dtype),
    )


def weights(cfg: Config, device, dtype, seed: int = 0) -> dict:
    """Random weights: projections [in, out] scaled by 1/sqrt(in), norm weights near 1."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def proj(fan_in: int, fan_out: int):
        return torch.randn(fan_in, fan_out, generator=gen) / math.sqrt(fan_in)

    w = {
        "attn_norm": 1 + 0.1 * torch.randn(cfg.dim, generator=gen),
        "wqkv": proj(cfg.dim, 3 * cfg.dim),
        "wo": proj(cfg.dim, cfg.dim),
        "mlp_norm": 1 + 0.1 * torch.randn(cfg.dim, generator=gen),
        "w_gate_up": proj(cfg.dim, 2 * cfg.ffn),
        "w_down": proj(cfg.ffn, cfg.dim),
    }
    return {k: v.to(device=device, dtype=dtype) for k, v in w.items()}


def rope_tables(cfg: Config, device, dtype) -> tuple:
    """cos and sin [batch * seq, head_dim / 2] of the rotary angles (positions per batch)."""
    import torch

    half = cfg.head_dim // 2
    freq = cfg.theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angle = torch.arange(cfg.seq, dtype=torch.float64)[:, None] * freq[None, :]
    angle = angle.repeat(cfg.batch, 1)
    return angle.cos().to(device, dtype), angle.sin().to(device, dtype)


def block(ops, w: dict, x, cos, sin, cfg: Config):
    """The decoder block on x [batch, seq, dim] with the op set ``ops``."""
    b, s, d = x.shape
    t, h, hd, dtype = b * s, cfg.heads, cfg.head_dim, x.dtype
    x2 = x.reshape(t, d)
    qkv = ops.matmul(ops.rms_norm(x2, w["attn_norm"], cfg.eps), w["wqkv"]).to(dtype)
    q, k, v = (part.reshape(t, h, hd) for part in qkv.split(d, dim=1))
    q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
    heads = [u.reshape(b, s, h, hd).transpose(1, 2) for u in (q, k, v)]  # [b, h, s, hd]
    attn = ops.attention(*heads).transpose(1, 2).reshape(t, d)
    o = ops.matmul(attn, w["wo"]).to(dtype)
    normed, residual = ops.rms_norm_residual(o, x2, w["mlp_norm"], cfg.eps)  # residual = x + o
    gate, up = ops.matmul(normed, w["w_gate_up"]).to(dtype).split(cfg.ffn, dim=1)
    down = ops.matmul(ops.silu_gate(gate, up), w["w_down"]).to(dtype)
    return ops.add(residual, down).reshape(b, s, d)


def _forward_backward(ops, w: dict, x, cos, sin, cfg: Config, upstream) -> dict:
    """The block's output and the gradients of x and every weight, for loss sum(out * upstream)."""
    leaves = {"x": x, **w}
    leaves = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
    out = block(ops, {k: leaves[k] for k in w}, leaves["x"], cos, sin, cfg)
    (out.float() * upstream).sum().backward()
    result = {"out": out.detach()}
    result.update({f"d{k}": v.grad for k, v in leaves.items()})
    return {k: v.float() for k, v in result.items()}


def relative_error(a, ref) -> float:
    """|a - ref| / |ref| in Frobenius norms."""
    return float((a.double() - ref.double()).norm() / ref.double().norm())


def compare(cfg: Config, device, seed: int = 0) -> dict:
    """Run the f16 kaio block, the f16 torch block and the f32 torch block on the same random
    input and weights; returns {name: (kaio error, torch f16 error)} against the f32 block,
    for the output and each gradient, and the attention used under ``"attention"``."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(cfg.batch, cfg.seq, cfg.dim, generator=gen).to(device)
    upstream = torch.randn(cfg.batch, cfg.seq, cfg.dim, generator=gen).to(device)
    w32 = weights(cfg, device, torch.float32, seed)
    w16 = {k: v.half() for k, v in w32.items()}
    cos, sin = rope_tables(cfg, device, torch.float16)
    kaio_set, torch_set = kaio_ops_set(), torch_ops_set()
    ours = _forward_backward(kaio_set, w16, x.half(), cos, sin, cfg, upstream)
    half = _forward_backward(torch_set, w16, x.half(), cos, sin, cfg, upstream)
    ref = _forward_backward(
        torch_set, {k: v.float() for k, v in w16.items()}, x.half().float(), cos.float(),
        sin.float(), cfg, upstream,
    )  # fmt: skip
    errors = {k: (relative_error(ours[k], ref[k]), relative_error(half[k], ref[k])) for k in ref}
    errors["attention"] = kaio_set.attention_name
    return errors


def main() -> int:
    """Compare the blocks on the GPU (or a tiny one on the simulator); 0 when within TOLERANCE."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed (pip install 'kaio[torch]'): nothing to run")
        return 0
    import kaio

    if torch.cuda.is_available() and kaio.gpu_available():
        cfg, device, where = GPU, "cuda", torch.cuda.get_device_name()
        mode = contextlib.nullcontext()
    else:
        cfg, device, where = TINY, "cpu", "kaio's CPU simulator (no GPU here), tiny block"
        mode = kaio.simulate()
    with mode:
        errors = compare(cfg, device)
    print(f"Llama-style decoder block on {where}: {cfg}")
    print(f"attention: {errors.pop('attention')}")
    print(f"relative error against the f32 torch block (tolerance {TOLERANCE:g} for kaio):")
    print(f"  {'':10} {'kaio f16':>10} {'torch f16':>10}")
    worst = 0.0
    for name, (ours, theirs) in errors.items():
        print(f"  {name:10} {ours:10.2e} {theirs:10.2e}")
        worst = max(worst, ours)
    ok = worst <= TOLERANCE
    print("OK" if ok else f"FAILED: {worst:.2e} > {TOLERANCE:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
