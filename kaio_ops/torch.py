"""PyTorch integration: every kaio_ops op as a torch custom operator, ``torch.ops.kaio.<name>``.

``import kaio_ops.torch`` registers each op of ``kaio_ops`` with ``torch.library`` (namespace
``kaio``): ``torch.ops.kaio.rms_norm(x, w)``, or ``kaio_ops.torch.rms_norm(x, w)``. Each op has

- a real implementation: the kaio_ops function, launched on torch's current CUDA stream, with
  no device synchronization (so it can be captured in a CUDA graph). Non-contiguous inputs are
  made contiguous first (a copy); CPU tensors are refused with a ``ValueError``, except inside
  ``with kaio.simulate():``, where they run on kaio's CPU simulator (as NumPy arrays do);
- a fake (meta) implementation giving the outputs' shapes and dtypes, so ``torch.compile``
  traces through the op without a graph break, and meta tensors work;
- an autograd formula (``Grad``) or, for forward-only ops (quantized, short-sequence
  attention), a backward that raises a ``RuntimeError`` saying so.

Gradients: the matmuls differentiate through kaio's own matmul (``matmul_grads``: the f32
output gradient is split into two f16/bf16 parts after a power-of-two scaling per row or
column), flash attention through kaio's backward kernels from the saved output and
logsumexp (``flash_attention`` is a ``Composite`` over ``flash_attention_with_stats``), rope
through kaio's rope (the inverse rotation); the other memory-bound ops have backward formulas
written with torch ops, computed in f32. docs/torch.md has the details and the measured
errors.

The registration is table-driven: ``OPS`` holds one ``OpSpec`` per op (its schema, its fake
and its gradient). An op of ``kaio_ops`` is registered when its name is in ``OPS``; adding an
op is one entry there. Entries for ops that ``kaio_ops`` does not export are skipped.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

try:
    import torch  # absolute import: the real PyTorch, not this module
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "kaio_ops.torch needs PyTorch: pip install 'kaio[torch]' (or a torch build of your choice)"
    ) from e

import kaio_ops
from kaio.sim import active as simulating
from kaio_ops import _plan

__all__ = [
    "Composite",
    "Grad",
    "OPS",
    "OpSpec",
    "REGISTERED",
    "differentiable",
    "matmul_grad_parts",
    "matmul_grads",
    "register",
    "set_matmul_grad_parts",
]

NAMESPACE = "kaio"
HALF = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Grad:
    """An op's backward.

    ``fn(saved, needs, *grads) -> {input name: gradient}``: ``saved`` has as attributes the
    tensors named in ``saves`` (inputs by their schema names, outputs as ``out`` or ``out0``,
    ``out1``, ...), every non-tensor argument, and ``shapes`` (each tensor input's shape);
    ``needs`` maps each input name to whether its gradient is wanted; ``grads`` are the
    outputs' gradients. Gradients are cast to their input's dtype afterwards; names missing
    from the result get no gradient.
    """

    fn: Callable[..., dict]
    saves: tuple[str, ...] = ()
    constant_outputs: tuple[int, ...] = ()  # outputs with no gradient (statistics, say)


@dataclass(frozen=True)
class Composite:
    """An op written with another kaio op, ``of``: ``fn`` is registered as its
    CompositeImplicitAutograd kernel, so its fake implementation and gradient are those of
    the ops ``fn`` calls (and torch.compile traces through it)."""

    of: str
    fn: Callable


@dataclass(frozen=True)
class OpSpec:
    """How one kaio_ops op is registered as ``torch.ops.kaio.<name>``.

    ``schema``: the torch schema of its arguments and results, with the argument names and
    defaults of the Python function (tests check that they agree); ``fake``: called with the
    (fake or meta) arguments, returns empty outputs of the right shapes and dtypes (None for a
    ``Composite``); ``grad``: its ``Grad``, a string saying why the op has no gradient
    (forward-only), or a ``Composite``; ``contiguous``: whether tensors are made contiguous
    before the call (False for ops that read a layout themselves: ``matmul_fp8``'s
    column-major ``b``). Keyword-only arguments of the schema reach the function as keywords.
    """

    name: str
    schema: str
    fake: Callable | None
    grad: Grad | str | Composite
    contiguous: bool = True


# ---------------------------------------------------------------------------- fakes
def _like(x, *_):
    """One output of x's shape and dtype."""
    return x.new_empty(x.shape)


def _two_like(x, *_):
    """Two outputs of x's shape and dtype."""
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _f32(x, *shape):
    """An f32 output of ``shape`` on x's device."""
    return x.new_empty(shape, dtype=torch.float32)


def _matmul_out(a, b, *_):
    """A [M, K] @ B [K, N] -> f32 [M, N] (b: the weights, packed or not)."""
    return _f32(a, a.shape[0], b.shape[1])


def _int4_out(a, b_packed, scales, out_dtype=None):
    """``kaio_ops.matmul_int4``: [M, K] @ the packed [K/8, N] -> [M, N] in ``out_dtype``
    (default f32)."""
    return a.new_empty((a.shape[0], b_packed.shape[1]), dtype=out_dtype or torch.float32)


def _gemm_out(a, b, out_dtype=None):
    """``kaio_ops.matmul``: [M, K] @ [K, N] -> [M, N] in ``out_dtype`` (default a's)."""
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


def _linear_out(x, w, bias=None, residual=None, activation=None, out_dtype=None):
    """``kaio_ops.linear``: x [..., K], w [N, K] -> [..., N] ([..., N / 2] for "silu_gate")
    in ``out_dtype`` (default x's)."""
    n = w.shape[0] // 2 if activation == "silu_gate" else w.shape[0]
    return x.new_empty((*x.shape[:-1], n), dtype=out_dtype or x.dtype)


_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _quantize_fp8_out(x, *, dtype="e4m3", per="tensor"):
    """(q: fp8 of x's shape, scale: f32 [1] or [..., 1])."""
    name = {str(v): k for k, v in _FP8_DTYPES.items()}.get(str(dtype), dtype)
    q = x.new_empty(x.shape, dtype=_FP8_DTYPES.get(name, torch.float8_e4m3fn))
    shape = (*x.shape[:-1], 1) if per == "row" else (1,)
    return q, x.new_empty(shape, dtype=torch.float32)


def _matmul_fp8_out(a, b, scale_a, scale_b, out_dtype=None, bias=None):
    """[M, N] of out_dtype (bf16 by default)."""
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.bfloat16)


def _attention_f32(q, k, v):
    """Single-head attention -> f32 [Sq, Dv]."""
    return _f32(q, q.shape[0], v.shape[1])


def _flash_stats_out(q, k, v, *_):
    """f32 flash attention with stats: (out [S, Dv], logsumexp [S])."""
    return _attention_f32(q, k, v), _f32(q, q.shape[0])


def _flash_bwd_out(do, q, k, v, *_):
    """(dq, dk, dv) shaped like q, k, v, in f32."""
    return tuple(_f32(t, *t.shape) for t in (q, k, v))


def _mh_stats_out(q, k, v, *_):
    """Multi-head flash attention with stats: (out like q, logsumexp f32 [B, H, S])."""
    return q.new_empty(q.shape), _f32(q, *q.shape[:3])


def _mh_bwd_out(do, q, k, v, *_):
    """(dq, dk, dv) like q, k, v."""
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _varlen_stats_out(q, *_):
    """Packed varlen attention with stats: (out like q, logsumexp f32 [H, total_q])."""
    return q.new_empty(q.shape), _f32(q, q.shape[1], q.shape[0])


def _nothing(*_):
    """An op that only writes into its (mutable) arguments returns nothing."""
    return None


def _rope_append_out(k_cache, v_cache, qkv, cos, sin, seq_lens, heads, *_):
    """The rotated queries [B, heads, Sq, D] (D: the cache's head dim)."""
    return qkv.new_empty((qkv.shape[0], heads, qkv.shape[1], k_cache.shape[-1]))


def _qkv_out(x, wq, wk, wv, *_):
    """Three f16 [M, N] outputs, N from each weight."""
    return tuple(x.new_empty((x.shape[0], w.shape[1]), dtype=torch.float16) for w in (wq, wk, wv))


def _blocks(values: int, nbytes: int) -> Callable:
    """Fake of a GGUF quantizer: ``values`` f32/f16/bf16 values per block of ``nbytes``."""
    return lambda x: x.new_empty((x.shape[0], x.shape[1] // values * nbytes), dtype=torch.uint8)


def _unblocks(values: int, nbytes: int) -> Callable:
    """Fake of a GGUF dequantizer: blocks of ``nbytes`` bytes to ``values`` f32 values."""
    return lambda b: _f32(b, b.shape[0], b.shape[1] // nbytes * values)


# ---------------------------------------------------------------------------- gradients
def _acc(t: torch.Tensor) -> torch.Tensor:
    """t in the precision backward formulas compute in: f32 for f16/bf16, else its own."""
    return t.float() if t.dtype in HALF else t


def _row_sum(t: torch.Tensor, n: int) -> torch.Tensor:
    """The sum of t over every axis but the last (of length n): a gradient of a row vector."""
    return t.reshape(-1, n).sum(0)


def _to_shape(t: torch.Tensor, shape) -> torch.Tensor:
    """t reduced to ``shape``: itself, or summed over rows for a broadcast row vector [N]."""
    return t if tuple(t.shape) == tuple(shape) else _row_sum(t, t.shape[-1])


def _silu_gate_grad(s, needs, dy):
    x, gate, dy = _acc(s.x), _acc(s.gate), _acc(dy)
    sig = torch.sigmoid(x)
    return {"x": dy * gate * sig * (1 + x * (1 - sig)), "gate": dy * x * sig}


def _gelu_grad(s, needs, dy):
    return {"x": torch.ops.aten.gelu_backward(_acc(dy), _acc(s.x), approximate=s.approximate)}


def _add_grad(s, needs, dy):
    return {"x": dy, "y": _to_shape(_acc(dy), s.shapes["y"])}


def _mul_grad(s, needs, dy):
    dy = _acc(dy)
    return {"x": dy * _acc(s.y), "y": _to_shape(dy * _acc(s.x), s.shapes["y"])}


def _rms_norm_grads(x, w, dy, eps: float):
    """(dx, dw) of ``x / sqrt(mean(x**2) + eps) * w``, computed in f32 (or f64)."""
    x, w, dy = _acc(x), _acc(w), _acc(dy)
    r = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    g = dy * w
    dx = r * (g - x * (r * r) * (g * x).mean(-1, keepdim=True))
    return dx, _row_sum(dy * x * r, x.shape[-1])


def _rms_norm_grad(s, needs, dy):
    dx, dw = _rms_norm_grads(s.x, s.w, dy, s.eps)
    return {"x": dx, "w": dw}


def _rms_norm_residual_grad(s, needs, d_out, d_sum):
    # out = rms_norm(sum, w), sum = residual + x (rounding to the dtype taken as the identity)
    dsum, dw = _rms_norm_grads(s.out1, s.w, d_out, s.eps)
    dsum = dsum + _acc(d_sum)
    return {"x": dsum, "residual": dsum, "w": dw}


def _layer_norm_grad(s, needs, dy):
    x, w, dy = _acc(s.x), _acc(s.w), _acc(dy)
    centered = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(centered.square().mean(-1, keepdim=True) + s.eps)
    xhat = centered * rstd
    g = dy * w
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    n = x.shape[-1]
    return {"x": dx, "w": _row_sum(dy * xhat, n), "b": _row_sum(dy, n)}


def _softmax_grad(s, needs, dy):
    y, dy = _acc(s.out), _acc(dy)
    return {"x": y * (dy - (dy * y).sum(-1, keepdim=True))}


def _pairs(t: torch.Tensor, interleaved: bool) -> tuple:
    """The two members of each rotated pair of t's last axis (views)."""
    if interleaved:
        return t[..., 0::2], t[..., 1::2]
    half = t.shape[-1] // 2
    return t[..., :half], t[..., half:]


def _rope_grad(s, needs, dy):
    grads = {}
    if needs["x"]:  # the inverse rotation: rope with -sin, on kaio's kernel
        grads["x"] = torch.ops.kaio.rope(dy, s.cos, torch.neg(s.sin), s.interleaved)
    if needs["cos"] or needs["sin"]:  # torch ops; a 3-D x shares cos/sin over its heads
        (xa, xb), (ga, gb) = _pairs(_acc(s.x), s.interleaved), _pairs(_acc(dy), s.interleaved)
        dcos, dsin = ga * xa + gb * xb, gb * xa - ga * xb
        if dcos.dim() == 3:
            dcos, dsin = dcos.sum(1), dsin.sum(1)
        grads["cos"], grads["sin"] = dcos, dsin
    return grads


_matmul_parts = 2


def matmul_grad_parts() -> int:
    """How many f16/bf16 parts the matmul backward splits the f32 output gradient into."""
    return _matmul_parts


def set_matmul_grad_parts(parts: int) -> None:
    """Set the matmul backward's split of the f32 output gradient: 2 (the default: hi + lo,
    about 22 significant bits for f16, 16 for bf16, at twice the backward's matmul work) or 1
    (one scaled cast: 11 or 8 bits). Read when the backward runs (or is traced)."""
    global _matmul_parts
    if parts not in (1, 2):
        raise ValueError(f"matmul gradient parts must be 1 or 2, got {parts!r}")
    _matmul_parts = parts


def _split(g: torch.Tensor, dim: int, dtype: torch.dtype, parts: int):
    """f32 ``g`` scaled by a power of two per row (``dim=1``) or column (``dim=0``), so that
    the largest magnitude of each lies in [2^14, 2^15), then split into ``parts`` arrays of
    ``dtype`` that sum to it (each part rounds what the previous ones left); returns (parts,
    1 / scale). Power-of-two scales are exact, and they keep f16 parts from overflowing or
    losing small gradients to underflow. No device synchronization: the scales stay tensors.
    """
    _, exponent = torch.frexp(g.abs().amax(dim=dim, keepdim=True))
    k = (15 - exponent).clamp(-126, 126)  # amax * 2^k in [2^14, 2^15)
    scale = ((k + 127) << 23).view(torch.float32)  # 2^k, built from its bits
    inverse = ((127 - k) << 23).view(torch.float32)
    rest = g * scale
    out = []
    for _ in range(parts - 1):
        hi = rest.to(dtype)
        out.append(hi)
        rest = rest - hi.float()
    out.append(rest.to(dtype))
    return out, inverse


def matmul_grads(
    a: torch.Tensor,
    b: torch.Tensor,
    dc: torch.Tensor,
    op: str = "matmul_tc",
    parts: int | None = None,
    need_a: bool = True,
    need_b: bool = True,
):
    """The gradients ``(dA, dB)`` of ``C = A @ B`` in f32, through kaio's matmul ``op``:
    ``dA = dC @ B^T`` and ``dB = A^T @ dC``.

    kaio's matmul takes f16/bf16 operands while ``dC`` is f32: ``dC`` is scaled by a power of
    two per row (for dA) or per column (for dB) and split into ``parts`` (default
    ``matmul_grad_parts()``) arrays of A's dtype; the parts are concatenated along the inner
    dimension against repeated copies of the other operand, so one matmul sums them in its
    f32 accumulators: ``dA = ([hi, lo] @ [B^T; B^T]) / scale``. The transposes are
    materialized (row-major copies, made by ``repeat``). A gradient not needed is None.
    """
    parts = parts or _matmul_parts
    matmul = getattr(torch.ops.kaio, op)
    dc = dc.float()
    da = db = None
    if need_a:
        pieces, inverse = _split(dc, 1, a.dtype, parts)
        da = matmul(torch.cat(pieces, 1), b.t().repeat(parts, 1)) * inverse
    if need_b:
        pieces, inverse = _split(dc, 0, a.dtype, parts)
        db = matmul(a.t().repeat(1, parts), torch.cat(pieces, 0)) * inverse
    return da, db


def _flash_grad(s, needs, d_out, d_lse):
    # FlashAttention-2's backward from the saved output and logsumexp (no forward recompute);
    # the logsumexp output is marked as having no gradient
    bwd = "attention_flash_bwd_causal" if s.causal else "attention_flash_bwd"
    dq, dk, dv = getattr(torch.ops.kaio, bwd)(d_out, s.q, s.k, s.v, s.out0, s.out1)
    return {"q": dq, "k": dk, "v": dv}


def _flash_attention_grad(s, needs, d_out, d_lse):
    # the same for the multi-head op, on tensor cores (dK, dV summed over each K/V group);
    # torch.use_deterministic_algorithms(True) takes the backward without atomics
    fixed = torch.are_deterministic_algorithms_enabled()
    dq, dk, dv = torch.ops.kaio.flash_attention_bwd(
        d_out, s.q, s.k, s.v, s.out0, s.out1, s.causal, s.scale, fixed
    )
    return {"q": dq, "k": dk, "v": dv}


def _flash_varlen_grad(s, needs, d_out, d_lse):
    # the packed variable-length op: its backward kernels, with the same offsets
    dq, dk, dv = torch.ops.kaio.flash_attention_varlen_bwd(
        d_out, s.q, s.k, s.v, s.out0, s.out1, s.cu_seqlens_q, s.cu_seqlens_k,
        s.max_seqlen_q, s.max_seqlen_k, s.causal, s.scale,
    )  # fmt: skip
    return {"q": dq, "k": dk, "v": dv}


def _varlen_output(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, scale=None
):
    # flash_attention_varlen: the output of the op with stats
    return torch.ops.kaio.flash_attention_varlen_with_stats(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale
    )[0]


def _matmul_grad(op: str) -> Grad:
    """The Grad of the matmul op ``op``: backward through ``op`` itself."""

    def fn(s, needs, dc):
        da, db = matmul_grads(s.a, s.b, dc, op, need_a=needs["a"], need_b=needs["b"])
        return {"a": da, "b": db}

    return Grad(fn, ("a", "b"))


def _gemm_grad(s, needs, dc):
    # kaio_ops.matmul: the matmul backward through kaio's f32 matmul of the inputs' dtype
    op = "matmul_tc_bf16" if s.a.dtype == torch.bfloat16 else "matmul_tc"
    da, db = matmul_grads(s.a, s.b, dc, op, need_a=needs["a"], need_b=needs["b"])
    return {"a": da, "b": db}


def _activation_grad(activation: str | None, z: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d(activation(z)) for f32 pre-activations ``z`` (gate then up columns for "silu_gate")
    and the output gradient ``dy``."""
    if activation is None:
        return dy
    if activation == "silu_gate":
        g, u = z.chunk(2, -1)
        return torch.cat(
            [torch.ops.aten.silu_backward(dy * u, g), dy * torch.nn.functional.silu(g)], -1
        )
    if activation == "silu":
        return torch.ops.aten.silu_backward(dy, z)
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    return torch.ops.aten.gelu_backward(dy, z, approximate=approximate)


def _linear_grad(s, needs, dy):
    # y = act(x @ w.T + bias) + residual: the pre-activation recomputed in f32 by kaio's
    # linear when there is an activation, dz = act'(z) dy, then the matmul backward of dz
    # (matmul_grads, through kaio's f32 matmul) and the bias's as the column sums of dz
    k, rows = s.shapes["x"][-1], s.shapes["w"][0]
    dy2 = dy.reshape(-1, dy.shape[-1]).float()
    z = None
    if s.activation is not None:
        z = torch.ops.kaio.linear(s.x, s.w, s.bias, None, None, torch.float32).reshape(-1, rows)
    dz = _activation_grad(s.activation, z, dy2)
    op = "matmul_tc_bf16" if s.x.dtype == torch.bfloat16 else "matmul_tc"
    dx, dw = matmul_grads(s.x.reshape(-1, k), s.w.t(), dz, op, need_a=needs["x"], need_b=needs["w"])
    return {
        "x": None if dx is None else dx.reshape(s.shapes["x"]),
        "w": None if dw is None else dw.t(),
        "bias": dz.sum(0) if needs["bias"] else None,
        "residual": dy,
    }


def _like_op(name: str, schema: str, grad: Callable, inputs: tuple) -> OpSpec:
    """The ``OpSpec`` of an op with one output shaped like its first input (``_like``),
    differentiable in ``inputs`` by ``grad`` (``Grad``)."""
    return OpSpec(name, schema, _like, Grad(grad, inputs))


_MATMUL = "(Tensor a, Tensor b) -> Tensor"
_QUANTIZED = "a quantized op is forward-only (its integer operands have no gradient)"
_SHORT = "short-sequence tensor-core attention is forward-only; use flash attention to train"
_BACKWARD = "it is a backward op (no second derivative)"
_QKV = "(Tensor q, Tensor k, Tensor v) -> Tensor"
_MH = "(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None)"
_DECODE = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens, Tensor? block_table=None,"
    " float? scale=None)"
)
_FORWARD_ONLY = "decode attention is forward-only (inference)"
_VARLEN = (
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q,"
    " int max_seqlen_k, bool causal=False, float? scale=None)"
)
_FLASH_BWD = (
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse) -> (Tensor, Tensor, Tensor)"
)

OPS: tuple[OpSpec, ...] = (
    OpSpec(
        "matmul",
        "(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor",
        _gemm_out,
        Grad(_gemm_grad, ("a", "b")),
    ),
    OpSpec(
        "linear",
        "(Tensor x, Tensor w, Tensor? bias=None, Tensor? residual=None, str? activation=None,"
        " ScalarType? out_dtype=None) -> Tensor",
        _linear_out,
        Grad(_linear_grad, ("x", "w", "bias")),
    ),
    OpSpec("matmul_tc", _MATMUL, _matmul_out, _matmul_grad("matmul_tc")),
    OpSpec("matmul_tc_async", _MATMUL, _matmul_out, _matmul_grad("matmul_tc_async")),
    OpSpec("matmul_tc_bf16", _MATMUL, _matmul_out, _matmul_grad("matmul_tc_bf16")),
    OpSpec("matmul_tc_bf16_async", _MATMUL, _matmul_out, _matmul_grad("matmul_tc_bf16_async")),
    _like_op("silu_gate", "(Tensor x, Tensor gate) -> Tensor", _silu_gate_grad, ("x", "gate")),
    _like_op("gelu", "(Tensor x, str approximate='tanh') -> Tensor", _gelu_grad, ("x",)),
    OpSpec("add", "(Tensor x, Tensor y) -> Tensor", _like, Grad(_add_grad)),
    _like_op("mul", "(Tensor x, Tensor y) -> Tensor", _mul_grad, ("x", "y")),
    _like_op(
        "rms_norm", "(Tensor x, Tensor w, float eps=1e-06) -> Tensor", _rms_norm_grad, ("x", "w")
    ),
    OpSpec(
        "rms_norm_residual",
        "(Tensor x, Tensor residual, Tensor w, float eps=1e-06) -> (Tensor, Tensor)",
        _two_like,
        Grad(_rms_norm_residual_grad, ("w", "out1")),
    ),
    _like_op(
        "layer_norm",
        "(Tensor x, Tensor w, Tensor b, float eps=1e-05) -> Tensor",
        _layer_norm_grad,
        ("x", "w"),
    ),
    _like_op("softmax", "(Tensor x) -> Tensor", _softmax_grad, ("out",)),
    _like_op(
        "rope",
        "(Tensor x, Tensor cos, Tensor sin, bool interleaved=False) -> Tensor",
        _rope_grad,
        ("x", "cos", "sin"),
    ),
    # Ops of shared/API.md section 5 registered as soon as kaio_ops exports them.
    OpSpec(
        "matmul_int8", "(Tensor a, Tensor b, float scale=1.0) -> Tensor", _matmul_out, _QUANTIZED
    ),
    OpSpec(
        "matmul_int4",
        "(Tensor a, Tensor b_packed, Tensor scales, ScalarType? out_dtype=None) -> Tensor",
        _int4_out,
        _QUANTIZED,
    ),
    OpSpec(
        "qkv_project_int8",
        "(Tensor x, Tensor wq, Tensor wk, Tensor wv, float sq, float sk, float sv)"
        " -> (Tensor, Tensor, Tensor)",
        _qkv_out,
        _QUANTIZED,
    ),
    OpSpec(
        "qkv_project_int4",
        "(Tensor x, Tensor wq, Tensor wk, Tensor wv, Tensor sq, Tensor sk, Tensor sv)"
        " -> (Tensor, Tensor, Tensor)",
        _qkv_out,
        _QUANTIZED,
    ),
    OpSpec(
        "quantize_fp8",
        "(Tensor x, *, str dtype='e4m3', str per='tensor') -> (Tensor, Tensor)",
        _quantize_fp8_out,
        _QUANTIZED,
    ),
    OpSpec(
        "matmul_fp8",
        # not keyword-only in the schema (register_autograd refuses keyword-only tensors);
        # the Python function's keyword-only arguments are passed by name (_implementation)
        "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType? out_dtype=None,"
        " Tensor? bias=None) -> Tensor",
        _matmul_fp8_out,
        _QUANTIZED,
        contiguous=False,
    ),
    OpSpec("quantize_q8_0", "(Tensor x) -> Tensor", _blocks(32, 34), _QUANTIZED),
    OpSpec("quantize_q6_k", "(Tensor x) -> Tensor", _blocks(256, 210), _QUANTIZED),
    OpSpec("dequantize_q8_0", "(Tensor blocks) -> Tensor", _unblocks(32, 34), _QUANTIZED),
    OpSpec("dequantize_q6_k", "(Tensor blocks) -> Tensor", _unblocks(256, 210), _QUANTIZED),
    OpSpec("attention_tc", _QKV, _attention_f32, _SHORT),
    OpSpec("attention_tc_causal", _QKV, _attention_f32, _SHORT),
    OpSpec(
        "attention_flash_with_stats",
        "(Tensor q, Tensor k, Tensor v, bool causal=False) -> (Tensor, Tensor)",
        _flash_stats_out,
        Grad(_flash_grad, ("q", "k", "v", "out0", "out1"), constant_outputs=(1,)),
    ),
    OpSpec(
        "attention_flash",
        _QKV,
        None,
        Composite(
            "attention_flash_with_stats",
            lambda q, k, v: torch.ops.kaio.attention_flash_with_stats(q, k, v, False)[0],
        ),
    ),
    OpSpec(
        "attention_flash_causal",
        _QKV,
        None,
        Composite(
            "attention_flash_with_stats",
            lambda q, k, v: torch.ops.kaio.attention_flash_with_stats(q, k, v, True)[0],
        ),
    ),
    OpSpec("attention_flash_bwd", _FLASH_BWD, _flash_bwd_out, _BACKWARD),
    OpSpec("attention_flash_bwd_causal", _FLASH_BWD, _flash_bwd_out, _BACKWARD),
    OpSpec(
        "flash_attention_with_stats",
        f"{_MH} -> (Tensor, Tensor)",
        _mh_stats_out,
        Grad(_flash_attention_grad, ("q", "k", "v", "out0", "out1"), constant_outputs=(1,)),
    ),
    OpSpec(
        "flash_attention",
        f"{_MH} -> Tensor",
        None,
        Composite(
            "flash_attention_with_stats",
            lambda q, k, v, causal=False, scale=None: torch.ops.kaio.flash_attention_with_stats(
                q, k, v, causal, scale
            )[0],
        ),
    ),
    OpSpec(
        "flash_attention_bwd",
        "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal=False,"
        " float? scale=None, bool deterministic=False) -> (Tensor, Tensor, Tensor)",
        _mh_bwd_out,
        _BACKWARD,
    ),
    OpSpec(
        "flash_attention_decode_with_stats",
        f"{_DECODE} -> (Tensor, Tensor)",
        _mh_stats_out,
        _FORWARD_ONLY,
    ),
    OpSpec(
        "flash_attention_decode",
        f"{_DECODE} -> Tensor",
        None,
        Composite(
            "flash_attention_decode_with_stats",
            lambda q, k_cache, v_cache, seq_lens, block_table=None, scale=None: (
                torch.ops.kaio.flash_attention_decode_with_stats(
                    q, k_cache, v_cache, seq_lens, block_table, scale
                )[0]
            ),
        ),
    ),
    OpSpec(
        "flash_attention_varlen_with_stats",
        f"{_VARLEN} -> (Tensor, Tensor)",
        _varlen_stats_out,
        Grad(
            _flash_varlen_grad,
            ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "out0", "out1"),
            constant_outputs=(1,),
        ),
    ),
    OpSpec(
        "flash_attention_varlen",
        f"{_VARLEN} -> Tensor",
        None,
        Composite(
            "flash_attention_varlen_with_stats",
            _varlen_output,
        ),
    ),
    OpSpec(
        "flash_attention_varlen_bwd",
        "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor cu_seqlens_q,"
        " Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal=False,"
        " float? scale=None) -> (Tensor, Tensor, Tensor)",
        _mh_bwd_out,
        _BACKWARD,
    ),
    OpSpec(
        "kv_cache_append",
        "(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor seq_lens,"
        " Tensor? block_table=None) -> ()",
        _nothing,
        _FORWARD_ONLY,
    ),
    OpSpec(
        "kv_cache_append_rope",
        "(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor qkv, Tensor cos, Tensor sin,"
        " Tensor seq_lens, int heads, Tensor? block_table=None) -> Tensor",
        _rope_append_out,
        _FORWARD_ONLY,
    ),
)


# ---------------------------------------------------------------------------- the glue
def _check_devices(name: str, names: list, args) -> None:
    """Refuse tensors kaio cannot run on: CPU tensors outside ``kaio.simulate()``."""
    for arg_name, a in zip(names, args, strict=False):
        if not isinstance(a, torch.Tensor) or a.device.type in ("cuda", "meta"):
            continue
        if a.device.type == "cpu" and simulating():
            continue
        raise ValueError(
            f"kaio.{name}: argument {arg_name!r} is a {a.device.type.upper()} tensor; kaio ops "
            "run on CUDA tensors (move it with .cuda()), or on kaio's CPU simulator inside "
            "`with kaio.simulate():`. Nothing falls back to the CPU silently."
        )


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a NumPy array sharing its memory (bf16 as ml_dtypes.bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        fp8 = ml_dtypes.float8_e4m3fn if t.dtype == torch.float8_e4m3fn else ml_dtypes.float8_e5m2
        return t.view(torch.uint8).numpy().view(fp8)
    return t.numpy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """A NumPy array as a CPU tensor sharing its memory."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        fp8 = torch.float8_e4m3fn if a.dtype == ml_dtypes.float8_e4m3fn else torch.float8_e5m2
        return torch.from_numpy(a.view(np.uint8)).view(fp8)
    return torch.from_numpy(a)


def _positional(fn: Callable) -> Callable:
    """``fn`` callable with every argument positional, as the dispatcher passes them: its
    keyword-only parameters (``out_dtype``, say) are passed by name. The torch schema lists
    them as ordinary arguments, so that tensors among them (``linear``'s residual) get
    gradients."""
    params = list(inspect.signature(fn).parameters.values())
    named = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if not named:
        return fn
    first = len(params) - len(named)
    return lambda *args, **kw: fn(
        *args[:first], **dict(zip(named, args[first:], strict=False)), **kw
    )


def _implementation(spec: OpSpec, names: list, written: tuple = ()) -> Callable:
    """The op's real implementation: checks devices, makes inputs contiguous and calls the
    kaio_ops function (through NumPy on the simulator for CPU tensors). The arguments the op
    writes (``written``: their positions) are passed as they are: a copy would lose the
    writes (kaio_ops refuses them if they are not contiguous)."""
    op = getattr(kaio_ops, spec.name)
    fn = _positional(op)

    def impl(*args, **kwargs):  # kwargs: the schema's keyword-only (non-tensor) arguments
        _check_devices(spec.name, names, args)
        if spec.contiguous:
            args = [
                a.contiguous() if isinstance(a, torch.Tensor) and i not in written else a
                for i, a in enumerate(args)
            ]
        if not simulating():
            return fn(*args, **kwargs)

        def host(a):
            return _to_numpy(a) if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a

        out = fn(*map(host, args), **{k: host(v) for k, v in kwargs.items()})
        if out is None:  # written in place (CPU tensors share the NumPy arrays' memory)
            return None
        return tuple(map(_from_numpy, out)) if isinstance(out, tuple) else _from_numpy(out)

    # A call whose plan exists (contiguous CUDA tensors of a signature already run) goes
    # straight to it, in the op's generated entry (its wrapper's lookup; on a miss, impl):
    # the checks and copies of impl would find nothing to do
    # (it takes every parameter positionally in signature order, as the dispatcher passes
    # them, or by name: the schema's keyword-only arguments)
    entry = getattr(op, "dispatch_entry", None)
    return impl if entry is None else entry(impl)


def _fake(spec: OpSpec, names: list) -> Callable:
    """The op's fake implementation: the device check, then ``spec.fake``."""

    def fake(*args, **kwargs):
        _check_devices(spec.name, names, args)
        return spec.fake(*args, **kwargs)

    return fake


def _autograd(spec: OpSpec, names: list) -> tuple[Callable, Callable]:
    """(setup_context, backward) for ``torch.library.register_autograd``."""
    grad = spec.grad

    def setup_context(ctx, inputs, output):
        if not isinstance(grad, Grad):
            return
        values = dict(zip(names, inputs, strict=True))
        outputs = output if isinstance(output, tuple) else (output,)
        tensors = {n: v for n, v in values.items() if isinstance(v, torch.Tensor)}
        ctx.dtypes = {n: v.dtype for n, v in tensors.items()}
        # an optional tensor argument given as None is saved, not a scalar
        ctx.scalars = {n: v for n, v in values.items() if n not in tensors and n not in grad.saves}
        ctx.scalars["shapes"] = {n: tuple(v.shape) for n, v in tensors.items()}
        if len(outputs) == 1:
            values["out"] = outputs[0]
        values.update({f"out{i}": o for i, o in enumerate(outputs)})
        ctx.save_for_backward(*(values[n] for n in grad.saves))
        if grad.constant_outputs:
            ctx.mark_non_differentiable(*(outputs[i] for i in grad.constant_outputs))

    def backward(ctx, *grads):
        if not isinstance(grad, Grad):
            raise RuntimeError(f"kaio.{spec.name} has no gradient: {grad}")
        saved = dict(zip(grad.saves, ctx.saved_tensors, strict=True))
        saved = types.SimpleNamespace(**ctx.scalars, **saved)
        # needs_input_grad covers the arguments given, not the defaulted ones (no tensors)
        needs = dict.fromkeys(names, False)
        needs.update(zip(names, ctx.needs_input_grad, strict=False))
        got = grad.fn(saved, needs, *grads)
        return tuple(
            got[n].to(ctx.dtypes[n]) if needs[n] and got.get(n) is not None else None for n in names
        )

    return setup_context, backward


def _composite(spec: OpSpec) -> Callable:
    """The CompositeImplicitAutograd kernel of a ``Composite`` op. When no argument needs a
    gradient and every tensor is a plain CUDA tensor, the call goes to the kaio_ops function
    of the same name as a registered op's would (``_implementation``: its plan, through
    ``replay_only``, or the checks and the op, which builds that plan), so an eager call is
    one dispatch, not two (``flash_attention_decode`` rather than ``..._with_stats``).
    Otherwise (gradients, the simulator, and the fake, functional and batched tensors of
    torch.compile and vmap, which trace through this kernel) it is ``spec.grad.fn``, the op
    it is written with."""
    fn = spec.grad.fn
    op = getattr(kaio_ops, spec.name, None)
    replay_only = getattr(op, "replay_only", None)
    if replay_only is None:
        return fn
    names = [
        a.name for a in torch._C.parse_schema(f"{NAMESPACE}::{spec.name}{spec.schema}").arguments
    ]
    direct = _implementation(spec, names)
    miss = _plan.MISS
    grad_enabled, any_requires_grad = torch.is_grad_enabled, torch._C._any_requires_grad
    plain = (torch.Tensor, torch.nn.Parameter)

    def composite(*args, **kwargs):
        if kwargs or (grad_enabled() and any_requires_grad(*args)):
            return fn(*args, **kwargs)
        out = replay_only(*args)
        if out is not miss:
            return out
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if all(type(a) in plain and a.is_cuda for a in tensors) and not simulating():
            return direct(*args)  # builds the plan the next call replays
        return fn(*args)

    return composite


_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")  # holds the composite ops


def register(spec: OpSpec):
    """Register ``spec`` as ``torch.ops.kaio.<name>`` (implementation, fake and autograd; for
    a ``Composite``, its CompositeImplicitAutograd kernel) and return the op."""
    if isinstance(spec.grad, Composite):
        _LIBRARY.define(f"{spec.name}{spec.schema}")
        _LIBRARY.impl(spec.name, _composite(spec), "CompositeImplicitAutograd")
        return getattr(getattr(torch.ops, NAMESPACE), spec.name)
    qualname = f"{NAMESPACE}::{spec.name}"
    arguments = torch._C.parse_schema(qualname + spec.schema).arguments
    names = [arg.name for arg in arguments]
    written = tuple(i for i, a in enumerate(arguments) if a.alias_info and a.alias_info.is_write)
    # The library's own define and impl, not torch.library.custom_op: custom_op wraps the
    # kernel in an aliasing check and a dynamo guard, 5 µs a call on an H200 host (43.0 ->
    # 37.7 µs for rms_norm at decode size, 20.7 called directly)
    _LIBRARY.define(spec.name + spec.schema)
    _LIBRARY.impl(spec.name, _implementation(spec, names, written), "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, _fake(spec, names), lib=_LIBRARY)
    if written:  # torch takes no autograd formula for an op that mutates its arguments
        return getattr(getattr(torch.ops, NAMESPACE), spec.name)
    setup_context, backward = _autograd(spec, names)
    replay_only = getattr(getattr(kaio_ops, spec.name), "replay_only", None)
    _register_autograd(_LIBRARY, qualname, backward, setup_context, replay_only)
    return getattr(getattr(torch.ops, NAMESPACE), spec.name)


def _register_autograd(
    lib, qualname: str, backward: Callable, setup_context: Callable, replay_only: Callable | None
) -> None:
    """``torch.library.register_autograd`` of the op ``name``, with the op's plan in front:
    a call that needs no gradient (grad mode off, or no input requiring one: what
    register_autograd's kernel tests before it redispatches below autograd to the op's
    implementation) whose plan exists replays it right there, at the Autograd key, one
    Python kernel instead of two (register_autograd's, then the implementation's); anything
    else (gradients, a miss, the fake and functional tensors of torch.compile) goes to
    register_autograd's own kernel, made by the same torch function. Where that function
    is not there (another torch), plain register_autograd. ``replay_only(*args)``: the
    plan's result or ``_plan.MISS`` (bench/launch_overhead.py registers its empty ops this
    way too, for the dispatcher's floor)."""
    try:
        made = torch._library.autograd
        op = torch._library.utils.lookup_op(qualname)
        kernel = made.make_autograd_impl(op, made.Info(backward, setup_context))
    except (AttributeError, TypeError):
        kernel = None
    if replay_only is None or kernel is None:
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)
        return
    grad_enabled, any_requires_grad = torch.is_grad_enabled, torch._C._any_requires_grad
    miss = _plan.MISS

    def autograd(keyset, *args, **kwargs):
        if not kwargs and not (grad_enabled() and any_requires_grad(*args)):
            out = replay_only(*args)
            if out is not miss:
                return out
        return kernel(keyset, *args, **kwargs)

    lib.impl(qualname.split("::")[1], autograd, "Autograd", with_keyset=True)


def differentiable(name: str) -> bool:
    """Whether the registered op ``name`` has a gradient."""
    grad = REGISTERED[name].grad
    if isinstance(grad, Composite):
        return differentiable(grad.of)
    return isinstance(grad, Grad)


REGISTERED: dict[str, OpSpec] = {}
for _spec in OPS:  # composites come after the ops they call
    if hasattr(kaio_ops, _spec.name) and (
        not isinstance(_spec.grad, Composite) or _spec.grad.of in REGISTERED
    ):
        register(_spec)
        REGISTERED[_spec.name] = _spec


def __getattr__(name: str):
    """``kaio_ops.torch.<op>``: the registered op ``torch.ops.kaio.<op>``."""
    if name in REGISTERED:
        return getattr(getattr(torch.ops, NAMESPACE), name)
    raise AttributeError(f"module 'kaio_ops.torch' has no attribute {name!r}")
