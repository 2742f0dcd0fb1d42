"""Hugging Face transformers models on kaio_ops: ``kaio_ops.hf.apply(model)``.

``apply`` patches a ``transformers`` causal LM in place (the Liger-Kernel convention) and
returns it. For the Llama family (Llama, Mistral, Qwen2: one structure) it replaces

- every RMSNorm by ``rms_norm`` (``KaioRMSNorm``);
- the rotary embedding by a wrapper that hands the layers half-width cos/sin tables for kaio's
  ``rope`` (computed once a step by the model's own rotary module, so every rope scaling type
  the model knows still applies) and the sequences' lengths for decode attention;
- each attention block by ``KaioAttention``: Q, K and V in one ``linear`` (the three weights
  concatenated), ``rope`` on q and k, the model's KV cache, then attention through the
  attention-function interface of transformers (registered as ``"kaio"``: prefill takes
  ``flash_attention``, steps of at most 16 new tokens over a cache ``flash_attention_decode``),
  and the output projection with the residual add in its epilogue;
- the MLP by ``KaioGatedMLP``: gate and up in one ``linear`` with the SiLU-gate epilogue, down
  with the residual add in its epilogue; and the decoder layer's ``forward`` by one that hands
  both residuals to those epilogues (no separate add kernel);
- ``lm_head`` by a ``linear``.

Gemma2 gets its norms (``x * (1 + w)``) and every projection; its attention stays with
transformers, because kaio's attention has no logit soft-capping, and the report says so.

``quantize="int4"`` quantizes the projection weights (not ``lm_head``) once, at patch time, to
W4A16: symmetric round-to-nearest in groups of 128 along K (GPTQ's layout without its error
feedback), run by ``matmul_int4``. It needs f16 models.

What was replaced is counted in ``model.kaio_report`` (a dict: module kind to count, and
``"kept"``: what stayed with transformers, and why). A model of another family raises a
``ValueError``; nothing is replaced silently or half-way: the checks run before any change.

Limits (each raises a clear error when met): batches with padding (an attention mask with
zeros) and prefill of more than 16 tokens on top of cached ones are not handled by kaio's
attention yet.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections import Counter
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from transformers.cache_utils import StaticLayer
from transformers.modeling_outputs import BaseModelOutputWithPast

import kaio_ops
import kaio_ops.torch  # noqa: F401  (registers torch.ops.kaio)

__all__ = [
    "FAMILIES",
    "Divergence",
    "greedy",
    "first_divergence",
    "KaioAttention",
    "KaioGatedMLP",
    "KaioLinear",
    "KaioRMSNorm",
    "KaioRotary",
    "apply",
    "quantize_int4",
    "dequantize_int4",
    "set_dense_prefill",
    "Step",
]

FAMILIES = ("llama", "mistral", "qwen2", "gemma2")
LLAMA_LIKE = ("llama", "mistral", "qwen2")
ATTENTION = "kaio"  # the name under transformers' attention-function interface
GROUP = 128  # int4 scale group along K (matmul_int4's)
MAX_DECODE_TOKENS = 16  # flash_attention_decode's Sq limit
# rows from which an int4 projection with a dense copy takes it: past 64 rows the f16 GEMM is
# faster than matmul_int4 (on an H100: about 1.0x cuBLAS f16 at 64 rows, 0.45x to 0.9x past)
DENSE_ROWS = 64

ops = torch.ops.kaio
_compiling = torch.compiler.is_compiling


def _direct(x: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
    """Whether a call on ``x`` (and ``residual``) goes to the ``kaio_ops`` function itself
    rather than ``torch.ops.kaio``: eagerly (not traced by ``torch.compile``), on contiguous
    CUDA tensors that need no gradient. It skips torch's dispatcher (a few µs a call, and
    for ``flash_attention_decode`` two dispatches); the op's call plan is the same either way.
    Anything else (CPU tensors for the simulator, autograd, tracing) takes the registered op."""
    if _compiling() or not x.is_cuda or x.requires_grad or not x.is_contiguous():
        return False
    return residual is None or not residual.requires_grad and residual.is_contiguous()


# ---------------------------------------------------------------------------- int4 weights
def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b_packed, scales)`` of an ``nn.Linear`` weight ``w`` [N, K] for ``matmul_int4``:
    ``x @ w.T ≈ matmul_int4(x, b_packed, scales)``. Symmetric round-to-nearest in groups of
    128 along K (scale = group max |w| / 7, q in -7..7); b_packed int32 [K/8, N], eight 4-bit
    values a word, low nibble first; scales f16 [K/128, N]."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"quantize_int4: K = {k} must be a multiple of {GROUP}")
    b = w.detach().to(torch.float32).t().reshape(k // GROUP, GROUP, n)  # [groups, 128, N]
    scale = b.abs().amax(dim=1, keepdim=True) / 7.0
    scale = scale.to(torch.float16).to(torch.float32)  # quantize against the stored scale
    q = torch.where(scale > 0, torch.round(b / scale.clamp_min(1e-30)), 0).clamp_(-8, 7)
    nibbles = (q.to(torch.int64) & 0xF).reshape(k // 8, 8, n)
    shifts = (4 * torch.arange(8, device=w.device, dtype=torch.int64)).view(1, 8, 1)
    words = (nibbles << shifts).sum(dim=1)  # < 2^32: the u32 word
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return packed.contiguous(), scale.reshape(k // GROUP, n).to(torch.float16).contiguous()


def dequantize_int4(b_packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The f16 weight [N, K] (``nn.Linear``'s layout) that ``quantize_int4``'s
    ``(b_packed, scales)`` stand for: q * scale, exactly (q in -8..7, the scale f16)."""
    k8, n = b_packed.shape
    shifts = (4 * torch.arange(8, device=b_packed.device, dtype=torch.int32)).view(1, 8, 1)
    q = (b_packed.view(k8, 1, n) >> shifts) & 0xF  # [K/8, 8, N], low nibble first
    q = torch.where(q >= 8, q - 16, q).reshape(k8 * 8, n).float()
    w = q * scales.float().repeat_interleave(GROUP, dim=0)
    return w.t().to(torch.float16).contiguous()


# ---------------------------------------------------------------------------- modules
class _TensorParallel:
    """How a parameter is split by transformers' tensor-parallel plan: its local shard,
    ``split`` (None: whole; ``"cols"``: output features; ``"rows"``: input features, whose
    partial products are summed), and the process group and this process's rank in it."""

    def __init__(self, local: torch.Tensor, split: str | None, group=None, rank: int = 0):
        self.local, self.split, self.group, self.rank = local, split, group, rank

    @classmethod
    def of(cls, param: torch.Tensor) -> _TensorParallel:
        """The split of ``param`` (a plain tensor, or a DTensor over a 1-D mesh)."""
        placements = getattr(param, "placements", None)
        if placements is None:
            return cls(param, None)
        mesh = param.device_mesh
        if mesh.ndim != 1:
            raise ValueError(
                "kaio_ops.hf: only a 1-D tensor-parallel mesh is supported, got "
                f"{mesh.ndim} dimensions"
            )
        (placement,) = placements
        local = param.to_local()
        if placement.is_replicate():
            return cls(local, None)
        dims = (0, 1) if param.ndim == 2 else (0,)
        if not placement.is_shard() or placement.dim % param.ndim not in dims:
            raise ValueError(f"kaio_ops.hf: unsupported tensor-parallel placement {placement}")
        split = "cols" if placement.dim % param.ndim == 0 else "rows"
        return cls(local, split, mesh.get_group(), mesh.get_local_rank())


class KaioLinear(nn.Module):
    """``y = activation(x @ w.T + bias) + residual`` through ``kaio_ops.linear`` (w [N, K] as
    ``nn.Linear`` keeps it), or through ``matmul_int4`` when the weight was quantized. A
    quantized weight may keep a dense f16 copy of its dequantized values (``dense``, see
    ``dense_prefill``), which calls of more than ``DENSE_ROWS`` rows (prompts) take through
    ``linear`` with the epilogues fused: the same weights, at f16 GEMM speed."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, quantize: str | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        # a buffer (moved by .to(), not saved in the state dict): see keep_dense
        self.register_buffer("dense", None, persistent=False)
        if quantize == "int4":
            packed, scales = quantize_int4(weight)
            self.register_buffer("b_packed", packed)
            self.register_buffer("scales", scales)
            self.weight = None
        else:
            self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.reduce: _TensorParallel | None = None  # a row-wise tensor-parallel split

    def keep_dense(self, on: bool) -> None:
        """Keep (``on``) or drop the dense f16 copy of a quantized weight."""
        if self.weight is not None:
            return
        self.dense = dequantize_int4(self.b_packed, self.scales) if on else None

    @classmethod
    def of(cls, *linears: nn.Linear, quantize: str | None = None) -> KaioLinear:
        """One ``KaioLinear`` computing the given ``nn.Linear``s side by side (their output
        features concatenated in order). Under tensor parallelism (transformers' ``tp_plan``:
        the weights are DTensors) it takes this rank's shards; a row-wise split (``o_proj``,
        ``down_proj``) sums the ranks' partial products with an all-reduce."""
        shards = [_TensorParallel.of(m.weight) for m in linears]
        parallel = shards[0]
        if any(sh.split != parallel.split for sh in shards):
            raise ValueError(
                "kaio_ops.hf: the projections fused into one linear are split differently "
                f"by the tensor-parallel plan ({[sh.split for sh in shards]})"
            )
        weights = [sh.local for sh in shards]
        weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        biases = [None if m.bias is None else _TensorParallel.of(m.bias).local for m in linears]
        if all(b is None for b in biases):
            bias = None
        else:
            bias = torch.cat(
                [
                    b if b is not None else w.new_zeros(w.shape[0])
                    for w, b in zip(weights, biases, strict=True)
                ]
            )
        linear = cls(weight, bias, quantize)
        if parallel.split == "rows":
            linear.reduce = parallel
        return linear

    def forward(self, x, residual=None, activation=None):
        """The projection of ``x`` [..., K], then the epilogue."""
        if self.reduce is None:
            return self._project(x, self.bias, residual, activation)
        # A row-wise split: this rank's partial product, the residual added by rank 0 only
        # (in the epilogue, before the sum), the all-reduce, then the bias, once.
        if activation is not None:
            raise ValueError("KaioLinear: a row-wise tensor-parallel split takes no activation")
        y = self._project(x, None, residual if self.reduce.rank == 0 else None, None)
        dist.all_reduce(y, group=self.reduce.group)
        return y if self.bias is None else y + self.bias

    def _project(self, x, bias, residual, activation):
        weight = self.weight
        if weight is None and self.dense is not None and x.numel() > DENSE_ROWS * x.shape[-1]:
            weight = self.dense
        if weight is not None:
            op = kaio_ops.linear if _direct(x, residual) else ops.linear
            return op(x, weight, bias, residual=residual, activation=activation)
        flat = x.reshape(-1, self.in_features)
        if bias is None and activation in (None, "silu_gate"):
            return self._int4_rounded(x, flat, residual, activation)
        y = ops.matmul_int4(flat, self.b_packed, self.scales)  # f32 [M, N]
        if bias is not None:
            y = y + bias.float()
        if activation == "silu_gate":
            gate, up = y.chunk(2, dim=-1)
            y = nn.functional.silu(gate) * up
        elif activation is not None:
            raise ValueError(f"KaioLinear (int4): activation {activation!r} is not supported")
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        if residual is not None:
            y = y + residual.float()
        return y.to(x.dtype)

    def _int4_rounded(self, x, flat, residual, activation):
        """The int4 product rounded to x's dtype in the kernel, then the SiLU gate or the
        residual as one kaio op each (eagerly on CUDA: straight to kaio_ops, as ``_direct``
        says): few launches and little host work a decode step."""
        direct = _direct(flat, residual)
        if direct:
            y = kaio_ops.matmul_int4(flat, self.b_packed, self.scales, out_dtype=x.dtype)
        else:
            y = ops.matmul_int4(flat, self.b_packed, self.scales, x.dtype)
        if activation == "silu_gate":
            gate, up = y.chunk(2, dim=-1)
            contiguous = direct and gate.is_contiguous()
            y = (kaio_ops.silu_gate if contiguous else ops.silu_gate)(gate, up)
        if residual is not None:
            y = (kaio_ops.add if direct else ops.add)(y, residual.reshape(y.shape))
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        kind = "int4" if self.weight is None else "dense"
        return (
            f"in={self.in_features}, out={self.out_features}, {kind}, bias={self.bias is not None}"
        )


class KaioRMSNorm(nn.Module):
    """``rms_norm(x, w)``; Gemma's ``x * (1 + w)`` norms keep ``1 + w`` as their weight."""

    def __init__(self, weight: torch.Tensor, eps: float, offset: float = 0.0):
        super().__init__()
        w = weight.detach().float() + offset
        self.weight = nn.Parameter(w.to(weight.dtype), requires_grad=False)
        self.eps = float(eps)

    def forward(self, x):
        """The normalized ``x``."""
        op = kaio_ops.rms_norm if _direct(x) else ops.rms_norm
        return op(x, self.weight, self.eps)


STATIC_ROPE = ("default", "linear", "llama3")  # rope types whose angles depend on the position only


class Step:
    """What a decode or prefill step's layers share, computed once a step by ``KaioRotary``
    (``owner``):
        ``seq_lens`` (each sequence's cached length after the step: the last position + 1, int32
        on the GPU), ``tables`` (cos and sin [P, D/2] for every position up to the model's
        ``max_position_embeddings``, made once, on the first step: the fused decode path reads
        them on the GPU) or None (a rope type whose angles change with the length), ``attend``
        (the model's attention function now) and, made only when a layer asks (``angles``), this
        step's cos and sin [P, S, D/2] and the decode rows."""

    def __init__(self, owner, x, position_ids, seq_lens, tables, attend):
        self.owner, self.x, self.position_ids = owner, x, position_ids
        self.seq_lens, self.tables, self.attend = seq_lens, tables, attend
        self._angles = None

    def tables_for(self, positions: int) -> tuple:
        """The tables, covering at least ``positions`` positions (a static cache's capacity)."""
        if self.tables[0].shape[0] < positions:
            self.tables = self.owner.tables(self.x, positions)
        return self.tables

    def angles(self) -> tuple:
        """``(cos, sin, rows)``: cos and sin [P, S, D/2] (P: 1 or the batch); for a decode
        step of one position for the whole batch (P = S = 1), ``rows`` is ``(cos[0],
        sin[0])`` ([1, D/2]), else None. Gathered from the tables where there are tables,
        else from the model's rotary module; made once a step."""
        if self._angles is None:
            if self.tables is not None:
                cos, sin = (t[self.position_ids] for t in self.tables)
            else:
                cos, sin = self.owner.rotary(self.x, self.position_ids)
                half = cos.shape[-1] // 2
                cos, sin = cos[..., :half].contiguous(), sin[..., :half].contiguous()
            rows = (cos[0], sin[0]) if cos.shape[0] == 1 and cos.shape[1] == 1 else None
            self._angles = cos, sin, rows
        return self._angles


class KaioRotary(nn.Module):
    """Wraps a model's rotary embedding: the same cos/sin, cut to the half-width tables kaio's
    ``rope`` takes (for rope types whose angles depend on the position only, one table over
    every position, made by the model's own module on the first step), and each sequence's
    cached length after this step; the layers get them as a ``Step``."""

    def __init__(self, rotary: nn.Module, config):
        super().__init__()
        self.rotary = rotary
        self.config = config
        self.positions = int(config.max_position_embeddings)
        self.static = getattr(rotary, "rope_type", None) in STATIC_ROPE
        self._tables: dict = {}

    def tables(self, x, positions: int = 0) -> tuple | None:
        """cos and sin [P, D/2] in x's dtype on x's device, P the model's
        ``max_position_embeddings`` or ``positions`` if more (made once, and again when a
        static cache of more positions asks)."""
        if not self.static:
            return None
        key = (x.device, x.dtype)
        have = self._tables.get(key)
        if have is None or have[0].shape[0] < positions:
            count = max(self.positions, positions)
            ids = torch.arange(count, device=x.device)[None]
            cos, sin = self.rotary(x[:1, :1], ids)
            half = cos.shape[-1] // 2
            have = self._tables[key] = (
                cos[0, :, :half].contiguous(),
                sin[0, :, :half].contiguous(),
            )
        return have

    def forward(self, x, position_ids):
        """The step's ``Step``."""
        seq_lens = (position_ids[:, -1] + 1).to(torch.int32).expand(x.shape[0]).contiguous()
        attend = _interface()[self.config.__dict__["_attn_implementation_internal"]]
        return Step(self, x, position_ids, seq_lens, self.tables(x), attend)


def _rope_op(x, cos, sin):
    """``rope`` through ``kaio_ops`` eagerly on CUDA, else ``torch.ops.kaio`` (``_direct``)."""
    return (kaio_ops.rope if _direct(x) else ops.rope)(x, cos, sin)


def _rope(x, cos, sin):
    """kaio ``rope`` (half-split pairs) on x [B, S, heads, D] with cos, sin [P, S, D/2]."""
    b, s, heads, d = x.shape
    if s == 1 and cos.shape[0] == 1:  # a decode step: one position for the whole batch
        rows = x.reshape(1, b * heads, d)
        return _rope_op(rows, cos[0], sin[0]).reshape(b, s, heads, d)
    if cos.shape[0] != b:
        cos, sin = cos.expand(b, -1, -1), sin.expand(b, -1, -1)
    rows = x.reshape(b * s, heads, d)
    out = _rope_op(rows, cos.reshape(b * s, -1), sin.reshape(b * s, -1))
    return out.reshape(b, s, heads, d)


def _decode_qkv(qkv, b: int, h: int, hkv: int, d: int, rows: tuple):
    """q [B, H, 1, D], k and v [B, Hkv, 1, D] of a decode step's fused projection ``qkv``
    [B, 1, (H + 2 Hkv) D], q and k rotated by one ``rope`` call over every head of the batch
    (the V heads' rotation is computed and dropped: cheaper than the views and the second
    call that would skip them), all as views: no copies."""
    width = h + 2 * hkv
    rotated = _rope_op(qkv.view(1, b * width, d), *rows).view(b, width, 1, d)
    return rotated[:, :h], rotated[:, h : h + hkv], qkv.view(b, width, 1, d)[:, h + hkv :]


def _static_layer(cache, layer_idx: int, like, kv_heads: int, d: int):
    """The ``StaticLayer`` of ``cache`` for ``layer_idx`` (allocated now if it was not: the
    batch and dtype of ``like``), or None for any other kind of cache or layer."""
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers) or type(layers[layer_idx]) is not StaticLayer:
        return None
    layer = layers[layer_idx]
    if not layer.is_initialized:
        empty = like.new_empty((like.shape[0], kv_heads, 0, d))
        layer.lazy_initialization(empty, empty)
    return layer


class KaioAttention(nn.Module):
    """A Llama-family attention block on kaio: fused QKV ``linear``, ``rope``, the model's KV
    cache, attention through transformers' interface (``"kaio"``), and ``o_proj`` with the
    residual add in its epilogue.

    With a static cache (transformers' ``StaticCache``: ``generate(...,
    cache_implementation="static")``) and kaio's attention, a step rotates q and k and writes
    k and v into the cache in one ``kv_cache_append_rope`` (positions from the step's
    ``seq_lens``, angles from the position tables), then ``flash_attention_decode`` over the
    cache (steps of up to 16 tokens) or ``flash_attention`` over the prompt (a prefill from
    an empty cache): nothing is reallocated or concatenated, and nothing synchronizes with the
    GPU in a decode step."""

    def __init__(self, attn: nn.Module, config, quantize: str | None):
        super().__init__()
        self.config = config
        self.layer_idx = attn.layer_idx
        self.head_dim = attn.head_dim
        # this rank's heads (all of them without tensor parallelism)
        self.heads = _TensorParallel.of(attn.q_proj.weight).local.shape[0] // attn.head_dim
        self.kv_heads = _TensorParallel.of(attn.k_proj.weight).local.shape[0] // attn.head_dim
        self.num_key_value_groups = self.heads // self.kv_heads
        self.scaling = attn.scaling
        self.is_causal = True
        self.qkv_proj = KaioLinear.of(attn.q_proj, attn.k_proj, attn.v_proj, quantize=quantize)
        self.o_proj = KaioLinear.of(attn.o_proj, quantize=quantize)

    def forward(
        self, hidden_states, position_embeddings, attention_mask=None, residual=None, **kwargs
    ):
        """``residual + o_proj(attention(hidden_states))`` (without ``residual`` when None)."""
        b, s, _ = hidden_states.shape
        h, hkv, d = self.heads, self.kv_heads, self.head_dim
        step: Step = position_embeddings
        qkv = self.qkv_proj.forward(hidden_states)
        cache = kwargs.get("cache")  # (transformers 5.24 and later; before: past_key_values)
        if cache is None:
            cache = kwargs.get("past_key_values")
        if step.tables is not None and step.attend is kaio_attention and cache is not None:
            layer = _static_layer(cache, self.layer_idx, qkv, hkv, d)
            if layer is not None:
                out = self._static_step(qkv, cache, layer, step, attention_mask, b, s)
                return self.o_proj.forward(out, residual=residual)
        cos, sin, rows = step.angles()
        if s == 1 and rows is not None:
            q, k, v = _decode_qkv(qkv, b, h, hkv, d, rows)
        else:
            qkv = qkv.view(b, s, h + 2 * hkv, d)
            q = _rope(qkv[:, :, :h], cos, sin).transpose(1, 2)
            k = _rope(qkv[:, :, h : h + hkv], cos, sin).transpose(1, 2)
            v = qkv[:, :, h + hkv :].transpose(1, 2)
        past = 0
        if cache is not None:
            if s > MAX_DECODE_TOKENS:
                past = cache.get_seq_length(self.layer_idx)  # prefill only: may synchronize
            k, v = cache.update(k, v, self.layer_idx)
        seq_lens = step.seq_lens
        if step.attend is kaio_attention:  # kaio's own: [B, H, S, D], one view fewer for decode
            out = _attend(q, k, v, attention_mask, self.scaling, seq_lens=seq_lens, past=past)
            out = out.view(b, s, h * d) if s == 1 else out.transpose(1, 2).reshape(b, s, h * d)
        else:
            out, _ = step.attend(
                self, q, k, v, attention_mask, scaling=self.scaling, seq_lens=seq_lens, past=past
            )
            out = out.reshape(b, s, h * d)
        return self.o_proj.forward(out, residual=residual)

    def _static_step(self, qkv, cache, layer, step: Step, attention_mask, b: int, s: int):
        """Attention of a step over a transformers ``StaticLayer`` written by kaio: [B, S, H D]."""
        h, d = self.heads, self.head_dim
        if attention_mask is not None:
            _attend(None, None, None, attention_mask)  # raises: padding is not supported
        keys, values = layer.keys, layer.values
        if layer.batch_size != b:
            raise ValueError(
                f"kaio attention: the static cache holds {layer.batch_size} sequences, the step "
                f"has {b}; make the cache for this batch size"
            )
        cos, sin = step.tables_for(layer.max_cache_len)
        seq_lens = step.seq_lens
        x = qkv.view(b, s, qkv.shape[-1])
        if _direct(x):
            q = kaio_ops.kv_cache_append_rope(keys, values, x, cos, sin, seq_lens, h)
            decode = kaio_ops.flash_attention_decode
        else:
            q = ops.kv_cache_append_rope(keys, values, x, cos, sin, seq_lens, h)
            decode = ops.flash_attention_decode
        if self.layer_idx == 0:  # every layer's count, once a step (what transformers reads)
            _advance(cache, qkv, self.kv_heads, d, s)
        if s <= MAX_DECODE_TOKENS:
            out = decode(q, keys, values, seq_lens, scale=self.scaling)
        else:
            if int(layer.cumulative_length) != s:  # prefill only: synchronizes
                raise NotImplementedError(
                    f"kaio attention: {s} new tokens on top of cached ones (chunked prefill "
                    f"over {MAX_DECODE_TOKENS} tokens) is not supported yet"
                )
            k, v = keys[:, :, :s].contiguous(), values[:, :, :s].contiguous()
            out = ops.flash_attention(q, k, v, causal=True, scale=self.scaling)
        return out.view(b, s, h * d) if s == 1 else out.transpose(1, 2).reshape(b, s, h * d)


def _advance(cache, like, kv_heads: int, d: int, s: int) -> None:
    """Add a step's ``s`` tokens to the running count of every static layer of ``cache``
    (transformers' ``cumulative_length``: what ``get_seq_length`` reads), in one launch;
    layers not allocated yet are allocated first (their count is a new tensor then)."""
    counts = []
    for i, layer in enumerate(cache.layers):
        if type(layer) is StaticLayer:
            _static_layer(cache, i, like, kv_heads, d)
            counts.append(layer.cumulative_length)
    torch._foreach_add_(counts, s)


class KaioGatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x)) + residual``: gate and up in one ``linear`` with the
    SiLU-gate epilogue, down with the residual add in its epilogue."""

    def __init__(self, mlp: nn.Module, quantize: str | None):
        super().__init__()
        self.gate_up_proj = KaioLinear.of(mlp.gate_proj, mlp.up_proj, quantize=quantize)
        self.down_proj = KaioLinear.of(mlp.down_proj, quantize=quantize)

    def forward(self, x, residual=None):
        """The MLP of ``x`` (plus ``residual``)."""
        up = self.gate_up_proj.forward(x, activation="silu_gate")
        return self.down_proj.forward(up, residual=residual)


def _llama_layer_forward(
    self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs
):
    """A Llama-family decoder layer with both residual adds in projection epilogues. The
    layer's kaio modules are called through their ``forward`` (not ``Module.__call__``: its
    hook checks cost host time every call; hooks on them do not run)."""
    h = self.self_attn.forward(
        self.input_layernorm.forward(hidden_states),
        position_embeddings=position_embeddings,
        attention_mask=attention_mask,
        residual=hidden_states,
        **kwargs,
    )
    return self.mlp.forward(self.post_attention_layernorm.forward(h), residual=h)


def cache_keyword(forward) -> str:
    """The keyword under which a transformers ``forward`` (a function or a bound method) takes
    the KV cache: ``cache`` from transformers 5.24 (which deprecates ``past_key_values``),
    ``past_key_values`` before."""
    return _cache_keyword(getattr(forward, "__func__", forward))


@functools.cache  # (keyed by the function, not a bound method: no model kept alive)
def _cache_keyword(function) -> str:
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


# the field of a model's output that holds its KV cache (renamed in transformers 5.24)
OUTPUT_CACHE = next(
    f for f in ("cache", "past_key_values") if f in BaseModelOutputWithPast.__dataclass_fields__
)


def _llama_model_forward(
    self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
    inputs_embeds=None, use_cache=None, **kwargs,
):  # fmt: skip
    """A Llama-family model's forward (``LlamaModel``'s) with less host work a step: with
    kaio's attention, no outputs to record and not training, it embeds, makes the step's
    ``Step`` and runs the layers' ``forward`` and the norm directly (no attention mask is
    built: kaio's attention takes none; a prompt's mask with padding raises, decode steps'
    masks, which only extend it, are not read, so a step never synchronizes); anything else
    goes to the model's own forward."""
    config = self.config.__dict__
    cache = kwargs.pop("cache", None)  # (transformers 5.24's name of past_key_values)
    if past_key_values is None:
        past_key_values = cache
    if (
        config.get("_attn_implementation_internal") != ATTENTION
        or self.training
        or kwargs.get("output_hidden_states")
        or kwargs.get("output_attentions")
        or config.get("output_hidden_states")
        or config.get("_output_attentions")
        or (input_ids is None) == (inputs_embeds is None)
    ):
        return self._kaio_forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **{cache_keyword(self._kaio_forward): past_key_values},
            **kwargs,
        )
    return_dict = kwargs.pop("return_dict", True)
    if use_cache is None:
        use_cache = config.get("use_cache", True)
    if inputs_embeds is None:
        inputs_embeds = self.embed_tokens(input_ids)
    if use_cache and past_key_values is None:
        from transformers import DynamicCache

        past_key_values = DynamicCache(config=self.config)
    s = inputs_embeds.shape[1]
    if position_ids is None:
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = (torch.arange(s, device=inputs_embeds.device) + past).unsqueeze(0)
    if attention_mask is not None and s > 1 and not _capturing():
        if not bool(attention_mask.all()):
            _attend(None, None, None, attention_mask)  # raises: padding is not supported
    step = self.rotary_emb(inputs_embeds, position_ids)
    hidden = inputs_embeds
    for layer in self.layers:
        hidden = layer.forward(
            hidden,
            attention_mask=None,
            position_embeddings=step,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
    out = BaseModelOutputWithPast(
        last_hidden_state=self.norm.forward(hidden), **{OUTPUT_CACHE: past_key_values}
    )
    return out if return_dict else out.to_tuple()


# ---------------------------------------------------------------------------- attention
def kaio_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function interface on kaio: query [B, H, S, D], key and value
    [B, Hkv, L, D] (the cache after this step's update); returns ([B, S, H, D], None).

    Prefill (no cached tokens before this step) runs ``flash_attention`` over the step's own
    keys, causal; a step of at most 16 new tokens runs ``flash_attention_decode`` with the
    lengths the patched rotary module computed (``seq_lens``; without it, every sequence is
    taken as L long), so nothing here synchronizes with the GPU."""
    return _attend(query, key, value, attention_mask, scaling, dropout, **kwargs).transpose(
        1, 2
    ), None


def _attend(query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``kaio_attention``'s output before its transpose: [B, H, S, D]."""
    if attention_mask is not None:
        raise NotImplementedError(
            "kaio attention: batches with padding (an attention mask with zeros) are not "
            "supported yet; generate from unpadded batches (prompts of one length)"
        )
    if dropout:
        raise NotImplementedError("kaio attention has no dropout (it is for inference)")
    b, _, s, _ = query.shape
    past = kwargs.get("past", 0)
    if past == 0 and (s > MAX_DECODE_TOKENS or key.shape[2] == s):
        k, v = key[:, :, :s].contiguous(), value[:, :, :s].contiguous()
        out = ops.flash_attention(query.contiguous(), k, v, causal=True, scale=scaling)
    elif s <= MAX_DECODE_TOKENS:
        seq_lens = kwargs.get("seq_lens")
        if seq_lens is None:
            seq_lens = torch.full((b,), key.shape[2], dtype=torch.int32, device=query.device)
        q = query.contiguous()
        op = kaio_ops.flash_attention_decode if _direct(q) else ops.flash_attention_decode
        out = op(q, key.contiguous(), value.contiguous(), seq_lens, scale=scaling)
    else:
        raise NotImplementedError(
            f"kaio attention: {s} new tokens on top of {past} cached ones (chunked prefill "
            f"over {MAX_DECODE_TOKENS} tokens) is not supported yet"
        )
    return out


def _no_padding_mask(batch_size, q_length, kv_length, *args, attention_mask=None, **kwargs):
    """The mask function registered with kaio's attention: None unless the batch has padding
    (then the 2D mask, which ``kaio_attention`` refuses). The padding check reads the mask on
    the host, so it is skipped while a CUDA graph is captured."""
    if attention_mask is None or _capturing():
        return None
    return None if bool(attention_mask.all()) else attention_mask


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _interface():
    """transformers' attention functions (imported once: an import statement costs a
    dictionary lookup and a lock each call)."""
    global _ATTENTION_FUNCTIONS
    if _ATTENTION_FUNCTIONS is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        _ATTENTION_FUNCTIONS = ALL_ATTENTION_FUNCTIONS
    return _ATTENTION_FUNCTIONS


_ATTENTION_FUNCTIONS = None


def register_attention() -> None:
    """Registers ``kaio_attention`` and its mask function as transformers'
    ``attn_implementation="kaio"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, kaio_attention)
    AttentionMaskInterface.register(ATTENTION, _no_padding_mask)


# ---------------------------------------------------------------------------- comparing
def greedy(model: nn.Module, ids: torch.Tensor, steps: int, cache: str = "dynamic"):
    """``(tokens, logits)``: ``steps`` greedy tokens [B, steps] after the prompt ``ids`` [B, S],
    with the model's KV cache (``cache``: ``"dynamic"``, transformers' ``DynamicCache``, or
    ``"static"``, a ``StaticCache`` of S + steps tokens), and each step's last-position
    logits (f32)."""
    import transformers

    tokens, logits = [], []
    if cache == "static":
        kv = transformers.StaticCache(config=model.config, max_cache_len=ids.shape[1] + steps)
    elif cache == "dynamic":
        kv = transformers.DynamicCache(config=model.config)
    else:
        raise ValueError(f"greedy: cache must be 'dynamic' or 'static', got {cache!r}")
    inp = ids
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=inp, use_cache=True, **{cache_keyword(model.forward): kv})
            last = out.logits[:, -1].float()
            nxt = last.argmax(-1, keepdim=True)
            tokens.append(nxt)
            logits.append(last)
            inp = nxt
    return torch.cat(tokens, 1), logits


class Divergence(NamedTuple):
    """Where two greedy generations first differ: the step, the reference's top-2 logit
    margin there, and the largest difference between the two models' logits there. It is a
    near-tie (not an error) when ``margin <= 2 * diff``."""

    step: int
    margin: float
    diff: float

    @property
    def near_tie(self) -> bool:
        """Whether the logit difference can explain the different token."""
        return self.margin <= 2 * self.diff


def first_divergence(ref_tokens, ref_logits, tokens, logits) -> Divergence | None:
    """The first step where ``tokens`` differ from the reference's (``greedy``'s results of
    two models), or None when they are equal."""
    for step in range(ref_tokens.shape[1]):
        if torch.equal(ref_tokens[:, step], tokens[:, step].to(ref_tokens.device)):
            continue
        ref, got = ref_logits[step], logits[step].to(ref_logits[step].device)
        top2 = ref.topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        return Divergence(step, margin, (ref - got).abs().max().item())
    return None


# ---------------------------------------------------------------------------- patching
def set_dense_prefill(model: nn.Module, on: bool) -> None:
    """Give every int4 projection of a patched ``model`` a dense f16 copy of its dequantized
    weight for prompts (``on``: calls of more than ``DENSE_ROWS`` rows take the f16 GEMM; the
    model then holds f16 weights beside the int4 ones), or drop the copies."""
    for module in model.modules():
        if isinstance(module, KaioLinear):
            module.keep_dense(on)


def apply(
    model: nn.Module, *, quantize: str | None = None, dense_prefill: bool = False
) -> nn.Module:
    """Patches a transformers causal LM (Llama, Mistral, Qwen2 or Gemma2 family) in place to
    run on kaio_ops, and returns it; ``model.kaio_report`` says what was replaced and what
    was kept. ``quantize="int4"`` quantizes the projections to W4A16 once, now;
    ``dense_prefill=True`` also keeps their dequantized f16 copies for prompts
    (``set_dense_prefill``: prefill at f16 speed with the same weights, for f16 memory)."""
    config = model.config
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise ValueError(
            f"kaio_ops.hf.apply: model type {family!r} is not supported; supported families: "
            f"{', '.join(FAMILIES)}"
        )
    if quantize not in (None, "int4"):
        raise ValueError(f"kaio_ops.hf.apply: quantize must be None or 'int4', got {quantize!r}")
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers"):
        raise ValueError(
            "kaio_ops.hf.apply: expected a causal LM with .model.layers, got "
            f"{type(model).__name__}"
        )
    dtype = next(model.parameters()).dtype
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"kaio_ops.hf.apply: the model must be f16 or bf16, got {dtype}")
    if quantize == "int4" and dtype != torch.float16:
        raise ValueError("kaio_ops.hf.apply: quantize='int4' needs an f16 model (W4A16)")
    if family in LLAMA_LIKE and config.hidden_act != "silu":
        raise ValueError(
            f"kaio_ops.hf.apply: {family} with hidden_act={config.hidden_act!r}: only 'silu' "
            "has a fused epilogue"
        )
    window = getattr(config, "sliding_window", None)
    if family in LLAMA_LIKE and window and getattr(config, "use_sliding_window", True):
        if window < config.max_position_embeddings:
            raise ValueError(
                f"kaio_ops.hf.apply: sliding-window attention (window {window}) is not supported"
            )

    report: Counter = Counter()
    kept: list[str] = []
    if family in LLAMA_LIKE:
        _patch_llama(model, base, quantize, report, kept)
    else:
        _patch_gemma2(model, base, quantize, report, kept)
    if quantize == "int4" and dense_prefill:
        set_dense_prefill(model, True)
    report = dict(report)
    report["kept"] = kept
    model.kaio_report = report
    return model


def _norm(module: nn.Module, offset: float = 0.0) -> KaioRMSNorm:
    eps = getattr(module, "variance_epsilon", None) or module.eps
    return KaioRMSNorm(module.weight, eps, offset)


def _patch_llama(model, base, quantize, report: Counter, kept: list[str]) -> None:
    register_attention()
    for layer in base.layers:
        layer.input_layernorm = _norm(layer.input_layernorm)
        layer.post_attention_layernorm = _norm(layer.post_attention_layernorm)
        layer.self_attn = KaioAttention(layer.self_attn, model.config, quantize)
        layer.mlp = KaioGatedMLP(layer.mlp, quantize)
        layer.forward = types.MethodType(_llama_layer_forward, layer)
        report["rms_norm"] += 2
        report["attention"] += 1
        report["linear"] += 4  # qkv, o, gate_up, down
    base.norm = _norm(base.norm)
    base.rotary_emb = KaioRotary(base.rotary_emb, model.config)
    base._kaio_forward = base.forward
    base.forward = types.MethodType(_llama_model_forward, base)
    model.config._attn_implementation = ATTENTION
    report["rms_norm"] += 1
    report["rotary"] += 1
    _patch_head(model, report, kept)


def _patch_gemma2(model, base, quantize, report: Counter, kept: list[str]) -> None:
    norms = ("input_layernorm", "post_attention_layernorm")
    norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    for layer in base.layers:
        for name in norms:
            setattr(layer, name, _norm(getattr(layer, name), offset=1.0))
            report["rms_norm"] += 1
        attn, mlp = layer.self_attn, layer.mlp
        for owner, names in (
            (attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
            (mlp, ("gate_proj", "up_proj", "down_proj")),
        ):
            for name in names:
                setattr(owner, name, KaioLinear.of(getattr(owner, name), quantize=quantize))
                report["linear"] += 1
    base.norm = _norm(base.norm, offset=1.0)
    report["rms_norm"] += 1
    kept.append("attention and rotary embedding: transformers' (Gemma2's logit soft-capping)")
    kept.append("MLP activation: transformers' gelu_tanh(gate) * up")
    _patch_head(model, report, kept)


def _patch_head(model, report: Counter, kept: list[str]) -> None:
    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Linear):
        return
    if _TensorParallel.of(head.weight).split is not None:
        kept.append("lm_head: transformers' (split by the tensor-parallel plan, output gathered)")
        return
    model.lm_head = KaioLinear.of(head)
    report["linear"] += 1
