"""kaio_ops: LLM kernels written in the kaio DSL (``@kaio.gpu_kernel``), called like library
functions.

Every op takes CUDA arrays (torch tensors, CuPy arrays, ``kaio.DeviceArray``; contiguous,
row-major) and returns new arrays of the kind of its first input, on its device, launched on
the caller's current torch/CuPy stream. Inside ``with kaio.simulate():`` ops take NumPy arrays,
run on the CPU simulator and return NumPy arrays. A wrong dtype, rank, shape, device or a
non-contiguous input raises ``ValueError`` naming the argument and the form expected.
docs/ops.md gives each op's contract.

GEMMs with torch's conventions (f16/bf16 in, f32 accumulation, the inputs' dtype out unless
``out_dtype`` says f16, bf16 or f32, written by the epilogue):

- ``matmul(a, b, *, out_dtype=None)``: a [M, K] @ b [K, N]
- ``linear(x, w, bias=None, *, residual=None, activation=None, out_dtype=None)``: x [..., K]
  @ w.T with w [N, K] (``nn.Linear``), then + bias, activation ("gelu", "gelu_tanh", "silu",
  "silu_gate"), + residual, fused into the epilogue

Tensor-core matmul (A [M, K] @ B [K, N] -> f32 [M, N]; ``kaio_ops.tune.matmul`` autotunes):

- ``matmul_tc(a, b)``, ``matmul_tc_async(a, b)``: f16 inputs
- ``matmul_tc_bf16(a, b)``, ``matmul_tc_bf16_async(a, b)``: bf16 inputs
- ``matmul_int8(a, b, scale)``: int8 (or uint8 read as int8), exact s32 sums, scaled
- ``matmul_int4(a, b_packed, scales)``: f16 activations, int4 weights in groups of 128
- ``qkv_project_int8(x, wq, wk, wv, sq, sk, sv)``, ``qkv_project_int4(...)``: the Q, K and V
  projections of f16 ``x`` with int8 (W8A16) or int4 weights, f16 outputs, one launch

Attention (scale 1/sqrt(D); causal masks key j > i; no S x S matrix in memory):

- ``attention_flash(q, k, v)``, ``attention_flash_causal``: f32 [S, D] on the SIMT cores;
  ``attention_flash_with_stats`` (also the row logsumexp), ``attention_flash_bwd(_causal)``
- ``attention_tc(q, k, v)``, ``attention_tc_causal``: f16 q [Sq, D], k [Sk, D], v [Sk, Dv]
  on tensor cores -> f32 [Sq, Dv]
- ``flash_attention(q, k, v, causal=False, scale=None)``: f16/bf16 [B, H, S, D], grouped-query
  K/V [B, Hkv, S, D], on tensor cores (FlashAttention-2); ``flash_attention_with_stats``,
  ``flash_attention_bwd(do, q, k, v, o, lse, causal=False, scale=None)`` (D <= 256)
- ``flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  causal=False, scale=None)``: packed sequences of different lengths, q [total_q, H, D], k, v
  [total_k, Hkv, D], int32 offsets [B + 1] on the GPU (FlashAttention's varlen convention;
  causal aligned bottom-right); ``flash_attention_varlen_with_stats``,
  ``flash_attention_varlen_bwd(do, q, k, v, o, lse, cu_seqlens_q, ...)``
- ``flash_attention_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None)``:
  Sq <= 16 new tokens over a contiguous or paged KV cache, lengths on the GPU (split-KV);
  ``flash_attention_decode_with_stats``; ``kv_cache_append(k_cache, v_cache, k, v,
  seq_lens, block_table=None)`` writes the new tokens' K/V in place;
  ``kv_cache_append_rope(k_cache, v_cache, qkv, cos, sin, seq_lens, heads, block_table=None)``
  rotates a fused QKV projection's q and k, appends k and v, and returns q (one launch)

Memory-bound ops (f32, f16, bf16; computed in f32; rows are the last axis):

- ``silu_gate(x, gate)``: ``x * sigmoid(x) * gate``
- ``gelu(x, approximate="tanh")``: GELU, tanh form or exact (``"none"``)
- ``add(x, y)``, ``mul(x, y)``: y of x's shape or a row vector [N]
- ``rms_norm(x, w, eps=1e-6)``, ``rms_norm_residual(x, residual, w, eps=1e-6)``
- ``layer_norm(x, w, b, eps=1e-5)``
- ``softmax(x)``: over the last axis, rows of any length
- ``rope(x, cos, sin, interleaved=False)``: rotary embedding, x [S, D] or [S, H, D]

GGUF quantizers (llama.cpp's block bytes, byte-identical to ggml's reference encoders):

- ``quantize_q8_0(x)``, ``quantize_q6_k(x)``: f32/f16/bf16 [R, C] -> uint8 block bytes
- ``dequantize_q8_0(blocks)``, ``dequantize_q6_k(blocks)``: uint8 block bytes -> f32 [R, C]

FP8 (e4m3, e5m2; sm_89+):

- ``quantize_fp8(x, *, dtype="e4m3", per="tensor")``: (q, scale), torch's recipe bit for bit
- ``matmul_fp8(a, b, scale_a, scale_b, *, out_dtype=bf16, bias=None)``: ``torch._scaled_mm``

PyTorch: ``import kaio_ops.torch`` registers every op as ``torch.ops.kaio.<name>``, with fake
implementations (torch.compile) and autograd (docs/torch.md).
"""

from kaio_ops import tune
from kaio_ops.attention import (
    attention_flash,
    attention_flash_bwd,
    attention_flash_bwd_causal,
    attention_flash_causal,
    attention_flash_with_stats,
    attention_tc,
    attention_tc_causal,
    flash_attention,
    flash_attention_bwd,
    flash_attention_with_stats,
)
from kaio_ops.attention_varlen import (
    flash_attention_varlen,
    flash_attention_varlen_bwd,
    flash_attention_varlen_with_stats,
)
from kaio_ops.decode import (
    flash_attention_decode,
    flash_attention_decode_with_stats,
    kv_cache_append,
)
from kaio_ops.decode_step import kv_cache_append_rope
from kaio_ops.elementwise import add, gelu, mul, silu_gate
from kaio_ops.fp8 import matmul_fp8, quantize_fp8
from kaio_ops.gguf import dequantize_q6_k, dequantize_q8_0, quantize_q6_k, quantize_q8_0
from kaio_ops.linear import linear, matmul
from kaio_ops.matmul import matmul_tc, matmul_tc_async, matmul_tc_bf16, matmul_tc_bf16_async
from kaio_ops.quantized import matmul_int4, matmul_int8, qkv_project_int4, qkv_project_int8
from kaio_ops.rotary import rope
from kaio_ops.rows import layer_norm, rms_norm, rms_norm_residual, softmax

__all__ = [
    "add",
    "attention_flash",
    "attention_flash_bwd",
    "attention_flash_bwd_causal",
    "attention_flash_causal",
    "attention_flash_with_stats",
    "attention_tc",
    "attention_tc_causal",
    "dequantize_q6_k",
    "dequantize_q8_0",
    "flash_attention",
    "flash_attention_bwd",
    "flash_attention_decode",
    "flash_attention_decode_with_stats",
    "flash_attention_varlen",
    "flash_attention_varlen_bwd",
    "flash_attention_varlen_with_stats",
    "flash_attention_with_stats",
    "gelu",
    "kv_cache_append",
    "kv_cache_append_rope",
    "layer_norm",
    "linear",
    "matmul_int4",
    "matmul_fp8",
    "matmul_int8",
    "matmul",
    "matmul_tc",
    "matmul_tc_async",
    "matmul_tc_bf16",
    "matmul_tc_bf16_async",
    "mul",
    "qkv_project_int4",
    "qkv_project_int8",
    "quantize_fp8",
    "quantize_q6_k",
    "quantize_q8_0",
    "rms_norm",
    "rms_norm_residual",
    "rope",
    "silu_gate",
    "softmax",
    "tune",
]
