"""kaio_ops.torch: the kaio ops as torch custom operators (``torch.ops.kaio.*``).

Without a GPU (CPU torch): every kaio_ops op is registered with a schema matching its Python
signature; ``torch.library.opcheck`` (schema, fake tensors, autograd registration, AOT
dispatch) on kaio's CPU simulator; results bit-exact with direct kaio_ops calls; backward
formulas through ``gradcheck`` in float64; every op's gradients against torch autograd of an
independent reference; the matmul gradient's hi/lo split against a plain cast; torch.compile
with ``fullgraph=True`` (meta tensors and the simulator); CPU tensors refused; the decoder-block
example. Marked gpu: the same at real sizes on CUDA tensors, plus CUDA graph capture and
replay, torch's current stream, no synchronization, torch.compile with inductor.
"""

from __future__ import annotations

import inspect
import runpy
from pathlib import Path

import pytest

import kaio
import kaio_ops

torch = pytest.importorskip("torch")
kt = pytest.importorskip("kaio_ops.torch")
F = torch.nn.functional

ROOT = Path(__file__).resolve().parent.parent
HALF = (torch.float16, torch.bfloat16)
# relative error (Frobenius) of gradients against float64 torch, by the input dtype
GRAD_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


# ---------------------------------------------------------------------------- references
def up(t):
    """t in the precision references compute in: f32 for f16/bf16, else its own."""
    return t.float() if t.dtype in HALF else t


def ref_rms_norm(x, w, eps=1e-6):
    xf = up(x)
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * up(w)).to(x.dtype)


def ref_rms_norm_residual(x, residual, w, eps=1e-6):
    s = (up(residual) + up(x)).to(x.dtype)
    return ref_rms_norm(s, w, eps), s


def ref_rope(x, cos, sin, interleaved=False):
    xf = up(x)
    a, b = (xf[..., 0::2], xf[..., 1::2]) if interleaved else xf.chunk(2, -1)
    c, s = up(cos), up(sin)
    if x.dim() == 3:
        c, s = c[:, None, :], s[:, None, :]
    first, second = a * c - b * s, b * c + a * s
    out = (
        torch.stack([first, second], -1).flatten(-2)
        if interleaved
        else torch.cat([first, second], -1)
    )
    return out.to(x.dtype)


def ref_matmul(a, b):
    return up(a) @ up(b)


def ref_attention(q, k, v, causal=False, scale=None):
    """(softmax(q k^T * scale) v, logsumexp of the scaled scores), computed in q's precision
    or f32; [S, D] or [B, H, S, D] with k, v [B, Hkv, S, D]."""
    q, k, v = up(q), up(k), up(v)
    if q.dim() == 4 and k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    if causal:
        i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
        scores = scores.masked_fill((j > i).to(scores.device), float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def ref_stats(q, k, v, causal=False, scale=None):
    """(attention of q's dtype, logsumexp in f32 with no gradient)."""
    out, lse = ref_attention(q, k, v, causal, scale)
    return out.to(q.dtype), lse.detach().to(torch.float32 if q.dtype != torch.float64 else q.dtype)


def ref_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, scale=None):
    """(packed attention, logsumexp [H, total_q]) sequence by sequence, causal aligned
    bottom-right (query i of sq sees keys j <= i + sk - sq); a row with no key: zeros."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cq[:-1], cq[1:], ck[:-1], ck[1:], strict=True):
        qs = up(q[q0:q1]).transpose(0, 1)
        ks, vs = (up(x[k0:k1]).repeat_interleave(group, 1).transpose(0, 1) for x in (k, v))
        scores = (qs @ ks.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
        if causal:
            i, j = torch.arange(q1 - q0)[:, None], torch.arange(k1 - k0)[None, :]
            hidden = j > i + (k1 - k0) - (q1 - q0)
            scores = scores.masked_fill(hidden.to(scores.device), float("-inf"))
        outs.append((torch.softmax(scores, -1).nan_to_num(0.0) @ vs).transpose(0, 1))
        lses.append(torch.logsumexp(scores, -1))
    return torch.cat(outs).to(q.dtype), torch.cat(lses, -1).detach().float()


REFERENCES = {
    "silu_gate": lambda x, g: (F.silu(up(x)) * up(g)).to(x.dtype),
    "gelu": lambda x, approximate="tanh": F.gelu(up(x), approximate=approximate).to(x.dtype),
    "add": lambda x, y: (up(x) + up(y)).to(x.dtype),
    "mul": lambda x, y: (up(x) * up(y)).to(x.dtype),
    "rms_norm": ref_rms_norm,
    "rms_norm_residual": ref_rms_norm_residual,
    "layer_norm": lambda x, w, b, eps=1e-5: F.layer_norm(up(x), x.shape[-1:], up(w), up(b), eps).to(
        x.dtype
    ),
    "softmax": lambda x: torch.softmax(up(x), -1).to(x.dtype),
    "rope": ref_rope,
    "attention_flash": lambda q, k, v: ref_attention(q, k, v)[0],
    "attention_flash_causal": lambda q, k, v: ref_attention(q, k, v, True)[0],
    "attention_flash_with_stats": lambda q, k, v, causal=False: ref_stats(q, k, v, causal),
    "flash_attention": lambda q, k, v, causal=False, scale=None: ref_attention(
        q, k, v, causal, scale
    )[0].to(q.dtype),
    "flash_attention_with_stats": ref_stats,
    "flash_attention_varlen": lambda *args: ref_varlen(*args)[0],
    "flash_attention_varlen_with_stats": ref_varlen,
}


def ref_linear(x, w, bias=None, residual=None, activation=None, out_dtype=None):
    """F.linear in f32 (or float64), then the activation and the residual."""
    z = F.linear(up(x), up(w), None if bias is None else up(bias))
    if activation == "silu_gate":
        g, u = z.chunk(2, -1)
        z = F.silu(g) * u
    elif activation is not None:
        z = {"gelu": F.gelu, "silu": F.silu}.get(
            activation, lambda t: F.gelu(t, approximate="tanh")
        )(z)
    return z if residual is None else z + up(residual)


REFERENCES["matmul"] = lambda a, b, out_dtype=None: up(a) @ up(b)
REFERENCES["linear"] = ref_linear
MATMULS = ("matmul_tc", "matmul_tc_async", "matmul_tc_bf16", "matmul_tc_bf16_async")
REFERENCES.update(dict.fromkeys(MATMULS, ref_matmul))


# ---------------------------------------------------------------------------- samples
class Maker:
    """Random tensors on one device from one seeded generator."""

    def __init__(self, device: str, seed: int):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, *shape, dtype=torch.float32, scale: float = 1.0):
        return (torch.randn(shape, generator=self.gen) * scale).to(self.device, dtype)

    def ints(self, low: int, high: int, *shape, dtype=torch.int8):
        return torch.randint(low, high, shape, generator=self.gen).to(self.device, dtype)


def _gguf_blocks(rows: int, blocks: int, nbytes: int, scale_at: int):
    """make(r, dtype): random GGUF block bytes whose f16 scale (at byte ``scale_at`` of each
    block) is a small positive number."""

    def make(r: Maker, dtype):
        raw = r.ints(0, 256, rows, blocks, nbytes, dtype=torch.uint8)
        scale = (torch.rand(rows, blocks, generator=r.gen) * 0.01 + 0.001).half()
        raw[..., scale_at : scale_at + 2] = (
            scale.view(torch.uint8).view(rows, blocks, 2).to(r.device)
        )
        return (raw.reshape(rows, blocks * nbytes),)

    return make


def _flash_bwd_args(q_shape: tuple, kv_shape: tuple, causal: bool, multi_head: bool):
    """make(r, dtype): (do, q, k, v, o, lse) with o and lse those of q, k, v (and for the
    multi-head op, causal)."""

    def make(r: Maker, dtype):
        q, k, v = r(*q_shape, dtype=dtype), r(*kv_shape, dtype=dtype), r(*kv_shape, dtype=dtype)
        o, lse = ref_attention(q, k, v, causal)
        args = (r(*q_shape, dtype=dtype), q, k, v, o.to(dtype), lse.float())
        return (*args, causal) if multi_head else args

    return make


def _varlen_args(big: bool, causal: bool, backward: bool = False):
    """make(r, dtype): (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    causal) of a packed batch with an empty and a length-1 sequence (for the backward op:
    (do, q, k, v, o, lse, ...) with o and lse of the reference)."""
    lens_q, lens_k = ([300, 0, 1, 700], [300, 5, 1, 900]) if big else ([5, 0, 1, 9], [5, 2, 1, 7])
    h, hkv, d = (8, 2, 128) if big else (4, 2, 16)

    def make(r: Maker, dtype):
        cu_q, cu_k = (
            torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32).to(r.device)
            for n in (lens_q, lens_k)
        )
        q = r(sum(lens_q), h, d, dtype=dtype)
        k, v = r(sum(lens_k), hkv, d, dtype=dtype), r(sum(lens_k), hkv, d, dtype=dtype)
        args = (cu_q, cu_k, max(lens_q), max(lens_k), causal)
        if not backward:
            return (q, k, v, *args)
        o, lse = ref_varlen(q, k, v, *args)
        return (r(*q.shape, dtype=dtype), q, k, v, o, lse, *args)

    return make


def same(*shapes, extra=(), scale: float = 1.0):
    """make(r, dtype): random tensors of ``shapes`` in the dtype given, then ``extra``."""
    return lambda r, d: (*(r(*shape, dtype=d, scale=scale) for shape in shapes), *extra)


def _decode_args(big: bool, paged: bool, append: bool | None = False):
    """make(r, dtype): (q, k_cache, v_cache, seq_lens[, block_table]) of a decode step, or
    (k_cache, v_cache, k, v, seq_lens[, block_table]) of a cache append (``append``), or
    ``kv_cache_append_rope``'s arguments (``append`` None); ragged lengths, a contiguous
    cache or 16-token pages."""
    b, h, hkv, sq, d, cap = (3, 32, 8, 2, 128, 1024) if big else (2, 4, 2, 2, 64, 48)
    lens = [cap, 3, 700][:b] if big else [cap, 3]

    def make(r: Maker, dtype):
        shape = (b * cap // 16 + 1, 16, hkv, d) if paged else (b, hkv, cap, d)
        k_cache, v_cache = r(*shape, dtype=dtype), r(*shape, dtype=dtype)
        seq_lens = torch.tensor(lens, dtype=torch.int32).to(r.device)
        pages = torch.randperm(shape[0], generator=r.gen)[: b * cap // 16]
        table = (pages.reshape(b, cap // 16).to(torch.int32).to(r.device),) if paged else ()
        if append:
            new = (r(b, hkv, sq, d, dtype=dtype), r(b, hkv, sq, d, dtype=dtype))
            return (k_cache, v_cache, *new, seq_lens, *table)
        if append is None:  # kv_cache_append_rope: a fused projection and position tables
            qkv = r(b, sq, (h + 2 * hkv) * d, dtype=dtype)
            cos, sin = r(cap, d // 2, dtype=dtype), r(cap, d // 2, dtype=dtype)
            return (k_cache, v_cache, qkv, cos, sin, seq_lens, h, *table)
        return (r(b, h, sq, d, dtype=dtype), k_cache, v_cache, seq_lens, *table)

    return make


def samples(big: bool, only=None, skip=(), every_dtype: bool = True):
    """pytest params (op name, make(r, dtype) -> args, dtype) of every op, at simulator sizes or
    GPU sizes (``big``), in each dtype listed (``every_dtype=False``: the first); ``only`` and
    ``skip``: sample ids to keep or leave out."""
    s, n = (256, 1000) if big else (3, 40)  # rows and an odd row length (the scalar path)
    s2, n2 = (128, 4096) if big else (4, 64)  # the 16-byte path
    m, k, nn = (200, 264, 136) if big else (24, 40, 32)
    seq, heads, hd = (128, 8, 128) if big else (6, 2, 16)
    sq, sk, d, dv = (100, 300, 64, 32) if big else (8, 12, 16, 8)  # attention
    b, h, hkv = (2, 4, 2) if big else (1, 4, 2)  # batch, heads, kv heads (multi-head attention)
    mh_q, mh_kv, sd = (b, h, sk, d), (b, hkv, sk, d), (sk, d)
    mem = (torch.float32, torch.bfloat16)  # f16 goes through the matmuls and the decoder block
    f16, bf16, f32, u8 = (torch.float16,), (torch.bfloat16,), (torch.float32,), (torch.uint8,)
    half = (torch.float16, torch.bfloat16)
    int4 = (torch.int32, -(2**31), 2**31 - 1)
    table = [
        ("silu_gate", "silu_gate", same((2, s, n), (2, s, n)), mem),
        ("gelu-tanh", "gelu", same((s2, n2), scale=3), mem),
        ("gelu-none", "gelu", same((s, n), extra=("none",), scale=3), mem),
        ("add", "add", same((s, n), (s, n)), mem),
        ("add-row", "add", same((2, s2, n2), (n2,)), mem),
        ("mul", "mul", same((s2, n2), (s2, n2)), mem),
        ("mul-row", "mul", same((s, n), (n,)), mem),
        ("rms_norm", "rms_norm", same((2, s, n), (n,)), mem),
        ("rms_norm-eps", "rms_norm", same((s2, n2), (n2,), extra=(1e-5,)), mem),
        ("rms_norm_residual", "rms_norm_residual", same((s2, n2), (s2, n2), (n2,)), mem),
        ("layer_norm", "layer_norm", same((s, n), (n,), (n,), scale=2), mem),
        ("softmax", "softmax", same((2, s, n), scale=3), mem),
        ("softmax-vec", "softmax", same((s2, n2), scale=3), mem),
        ("rope", "rope", same((seq, heads, hd), (seq, hd // 2), (seq, hd // 2)), mem),
        (
            "rope-2d-interleaved",
            "rope",
            same((seq, hd), (seq, hd // 2), (seq, hd // 2), extra=(True,)),
            mem,
        ),
        ("matmul", "matmul", same((m, k), (k, nn)), half),
        ("matmul-f32", "matmul", same((3, k), (k, nn), extra=(torch.float32,)), f16),
        ("linear", "linear", same((2, 5, k), (nn, k), (nn,)), half),
        (
            "linear-gate",
            "linear",
            same((6, k), (2 * nn, k), (2 * nn,), (6, nn), extra=("silu_gate",), scale=0.5),
            bf16,
        ),
        ("matmul_tc", "matmul_tc", same((m, k), (k, nn)), f16),
        ("matmul_tc-skinny", "matmul_tc", same((3, k), (k, nn)), f16),
        ("matmul_tc_async", "matmul_tc_async", same((m, k), (k, nn)), f16),
        ("matmul_tc_bf16", "matmul_tc_bf16", same((m, k), (k, nn)), bf16),
        ("matmul_tc_bf16_async", "matmul_tc_bf16_async", same((m, k), (k, nn)), bf16),
        ("quantize_q8_0", "quantize_q8_0", same((2, 64)), mem),
        ("quantize_q6_k", "quantize_q6_k", same((2, 256)), mem),
        ("dequantize_q8_0", "dequantize_q8_0", _gguf_blocks(2, 2, 34, 0), u8),
        ("dequantize_q6_k", "dequantize_q6_k", _gguf_blocks(2, 1, 210, 208), u8),
        ("attention_tc", "attention_tc", same((sq, d), (sk, d), (sk, dv)), f16),
        ("attention_tc_causal", "attention_tc_causal", same((sq, d), (sk, d), (sk, dv)), f16),
        ("attention_flash", "attention_flash", same((sk, d), (sk, d), (sk, d)), f32),
        ("attention_flash_causal", "attention_flash_causal", same((sk, d), (sk, d), (sk, d)), f32),
        (
            "attention_flash_with_stats",
            "attention_flash_with_stats",
            same((sk, d), (sk, d), (sk, d), extra=(True,)),
            f32,
        ),
        ("attention_flash_bwd", "attention_flash_bwd", _flash_bwd_args(sd, sd, False, False), f32),
        (
            "attention_flash_bwd_causal",
            "attention_flash_bwd_causal",
            _flash_bwd_args(sd, sd, True, False),
            f32,
        ),
        ("flash_attention", "flash_attention", same(mh_q, mh_kv, mh_kv, extra=(True,)), half),
        (
            "flash_attention-scale",
            "flash_attention",
            same(mh_q, mh_kv, mh_kv, extra=(False, 0.3)),
            f16,
        ),
        (
            "flash_attention_with_stats",
            "flash_attention_with_stats",
            same(mh_q, mh_kv, mh_kv, extra=(True,)),
            half,
        ),
        (
            "flash_attention_bwd",
            "flash_attention_bwd",
            _flash_bwd_args(mh_q, mh_kv, True, True),
            half,
        ),
        (
            "flash_attention_varlen",
            "flash_attention_varlen",
            _varlen_args(big, True),
            half,
        ),
        (
            "flash_attention_varlen_with_stats",
            "flash_attention_varlen_with_stats",
            _varlen_args(big, False),
            f16,
        ),
        (
            "flash_attention_varlen_bwd",
            "flash_attention_varlen_bwd",
            _varlen_args(big, True, backward=True),
            bf16,
        ),
        ("flash_attention_decode", "flash_attention_decode", _decode_args(big, False), half),
        (
            "flash_attention_decode-paged",
            "flash_attention_decode",
            _decode_args(big, True),
            f16,
        ),
        (
            "flash_attention_decode_with_stats",
            "flash_attention_decode_with_stats",
            _decode_args(big, True),
            bf16,
        ),
        ("kv_cache_append", "kv_cache_append", _decode_args(big, True, append=True), half),
        ("kv_cache_append_rope", "kv_cache_append_rope", _decode_args(big, True, None), half),
        # shared/API.md's quantized matmuls, tested here once kaio_ops exports them
        (
            "matmul_int8",
            "matmul_int8",
            lambda r, t: (r.ints(-128, 128, 32, 64), r.ints(-128, 128, 64, 32), 0.01),
            (torch.int8,),
        ),
        (
            "matmul_int4",
            "matmul_int4",
            lambda r, t: (
                r(16, 256, dtype=t),
                r.ints(*int4[1:], 32, 32, dtype=int4[0]),
                r(2, 32, dtype=t, scale=0.01),
            ),
            f16,
        ),
        (
            "qkv_project_int8",
            "qkv_project_int8",
            lambda r, t: (
                r(16, 64, dtype=t),
                *(r.ints(-128, 128, 64, 32) for _ in range(3)),
                0.01,
                0.02,
                0.03,
            ),
            f16,
        ),
        (
            "qkv_project_int4",
            "qkv_project_int4",
            lambda r, t: (
                r(16, 256, dtype=t),
                *(r.ints(*int4[1:], 32, 32, dtype=int4[0]) for _ in range(3)),
                *(r(2, 32, dtype=t, scale=0.01) for _ in range(3)),
            ),
            f16,
        ),
        # FP8: quantize (a tuple result) and the scaled matmul, b column-major as torch wants
        ("quantize_fp8", "quantize_fp8", lambda r, t: (r(s2, n2, dtype=t, scale=20.0),), mem),
        (
            "matmul_fp8",
            "matmul_fp8",
            lambda r, t: (
                r(16, 32, scale=8.0).to(torch.float8_e4m3fn),
                r(16, 32, scale=8.0).to(torch.float8_e4m3fn).t(),
                torch.full((1,), 0.5, device=r.device),
                torch.full((1,), 0.25, device=r.device),
            ),
            (torch.float8_e4m3fn,),
        ),
    ]
    return [
        pytest.param(name, make, dtype, id=f"{sid}-{str(dtype).removeprefix('torch.')}")
        for sid, name, make, dtypes in table
        if (only is None or sid in only) and sid not in skip
        for dtype in (dtypes if every_dtype else dtypes[:1])
    ]


def needs(name: str):
    """Skip unless kaio_ops exports the op (ops of API.md that have not landed yet)."""
    if name not in kt.REGISTERED:
        pytest.skip(f"kaio_ops has no {name} yet")
    return getattr(torch.ops.kaio, name)


def differentiable(name: str) -> bool:
    return name in kt.REGISTERED and kt.differentiable(name)


def tensors(args):
    return [a for a in args if isinstance(a, torch.Tensor)]


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def to_numpy(t):
    return kt._to_numpy(t) if isinstance(t, torch.Tensor) else t


def relative_error(a, ref) -> float:
    ref = ref.double()
    return float((a.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def check_gradients(name: str, args, upstream_seed: int = 7):
    """The op's gradients (kaio forward and backward) against torch autograd of the float64
    reference on the same inputs, for the same random upstream gradients."""
    op = getattr(torch.ops.kaio, name)
    leaves = [
        a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    ]
    outs = as_tuple(op(*leaves))
    gen = torch.Generator().manual_seed(upstream_seed)
    ups = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device) for o in outs]
    sum(((o.double() * u).sum() for o, u in zip(outs, ups, strict=True))).backward()
    ref_leaves = [
        a.detach().double().requires_grad_()
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a
        for a in args
    ]
    ref_outs = as_tuple(REFERENCES[name](*ref_leaves))
    sum(((o * u).sum() for o, u in zip(ref_outs, ups, strict=True))).backward()
    floats = [(a, b) for a, b in zip(tensors(leaves), tensors(ref_leaves), strict=True)
              if a.is_floating_point()]  # fmt: skip
    for i, (ours, ref) in enumerate(floats):  # offsets (int32 tensors) have no gradient
        assert ours.grad is not None and ours.grad.dtype == ours.dtype
        err = relative_error(ours.grad, ref.grad)
        assert err < GRAD_TOL[ours.dtype], (
            f"{name}: gradient of input {i}: relative error {err:.2e}"
        )


# ---------------------------------------------------------------------------- registration
def test_every_kaio_op_is_registered():
    ops = [
        n
        for n in kaio_ops.__all__
        if callable(getattr(kaio_ops, n)) and not inspect.ismodule(getattr(kaio_ops, n))
    ]
    missing = [n for n in ops if n not in kt.REGISTERED]
    assert not missing, f"kaio_ops ops without an OpSpec in kaio_ops.torch.OPS: {missing}"
    for name in kt.REGISTERED:
        assert hasattr(torch.ops.kaio, name)
        assert getattr(kt, name) is getattr(torch.ops.kaio, name)
    assert {s.name for s in kt.OPS} >= set(ops)


@pytest.mark.parametrize("name", sorted(kt.REGISTERED))
def test_schema_matches_python_signature(name):
    """Argument names and defaults agree, so keywords and defaults mean the same thing."""
    schema = torch.ops.kaio.__getattr__(name).default._schema
    params = inspect.signature(getattr(kaio_ops, name)).parameters
    assert [a.name for a in schema.arguments] == list(params)
    for arg in schema.arguments:
        default = params[arg.name].default
        if default is inspect.Parameter.empty:
            assert not arg.has_default_value(), arg.name
        else:
            assert arg.default_value == default, arg.name


def test_sample_ids_cover_every_registered_op():
    covered = {p.values[0] for p in samples(False)}
    assert set(kt.REGISTERED) <= covered


def test_cpu_tensors_are_refused():
    x, w = torch.randn(4, 64), torch.randn(64)
    with pytest.raises(
        ValueError, match=r"kaio.rms_norm: argument 'x' is a CPU tensor.*\.cuda\(\).*kaio\.simulate"
    ):
        torch.ops.kaio.rms_norm(x, w)
    with pytest.raises(ValueError, match="argument 'w' is a CPU tensor"):
        torch.ops.kaio.rms_norm(x.to("meta"), w)


def test_meta_tensors_give_shapes():
    a, b = (
        torch.empty(5, 7, dtype=torch.float16, device="meta"),
        torch.empty(7, 3, dtype=torch.float16, device="meta"),
    )
    c = torch.ops.kaio.matmul_tc(a, b)
    assert c.device.type == "meta" and c.shape == (5, 3) and c.dtype == torch.float32
    x = torch.empty(2, 3, 8, dtype=torch.bfloat16, device="meta")
    out, res = torch.ops.kaio.rms_norm_residual(
        x, x, torch.empty(8, dtype=torch.bfloat16, device="meta")
    )
    assert out.shape == res.shape == x.shape and out.dtype == torch.bfloat16


# ---------------------------------------------------------------------------- on the simulator
# kinds of op for the (slow) full opcheck: a tuple result, a string, a bool, a broadcast
# gradient, a saved output, the matmul backward, an integer result, float arguments and three
# results
OPCHECK = {
    "rms_norm_residual",
    "gelu-none",
    "rope-2d-interleaved",
    "add-row",
    "softmax-vec",
    "matmul_tc-skinny",
    "linear-gate",
    "quantize_q6_k",
    "qkv_project_int8",
    "kv_cache_append",  # an op that writes into its arguments (declared in its schema)
    "kv_cache_append_rope",  # writes into its arguments and returns a tensor
}
# kernels that take long to compile for the simulator, tested on the GPU (and, through the
# causal flash attention's gradient, on the simulator)
SLOW_ON_SIMULATOR = {"attention_flash", "attention_flash_bwd", "attention_flash_bwd_causal"}
# ops that return nothing and write into their arguments (tests/test_ops_decode.py checks them)
IN_PLACE = {"kv_cache_append", "kv_cache_append_rope"}


def opcheck(name: str, args) -> None:
    """torch.library.opcheck: schema, fake tensors against real outputs, autograd
    registration, and AOT dispatch (forward and backward traced with fake tensors)."""
    if differentiable(name):
        args = [
            a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        ]
    torch.library.opcheck(getattr(torch.ops.kaio, name), tuple(args))


@pytest.mark.parametrize("name, make, dtype", samples(False, only=OPCHECK, every_dtype=False))
def test_opcheck_on_simulator(name, make, dtype):
    needs(name)
    with kaio.simulate():
        opcheck(name, make(Maker("cpu", 0), dtype))


@pytest.mark.parametrize("name, make, dtype", samples(False, skip=SLOW_ON_SIMULATOR | IN_PLACE))
def test_bit_exact_with_kaio_ops_on_simulator(name, make, dtype):
    """The op equals the kaio_ops function on the same values; its fake (meta) outputs have
    the real outputs' shapes and dtypes."""
    op = needs(name)
    args = make(Maker("cpu", 1), dtype)
    with kaio.simulate():
        ours = as_tuple(op(*args))
        direct = as_tuple(kt._positional(getattr(kaio_ops, name))(*map(to_numpy, args)))
    meta = as_tuple(op(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)))
    for o, d, f in zip(ours, direct, meta, strict=True):
        assert isinstance(o, torch.Tensor) and o.device.type == "cpu"
        assert torch.equal(o, kt._from_numpy(d))
        assert (f.shape, f.dtype, f.is_contiguous()) == (o.shape, o.dtype, True)


@pytest.mark.parametrize(
    "name, make, dtype",
    samples(False, skip=SLOW_ON_SIMULATOR | {"attention_flash_with_stats"}),
)
def test_gradients_on_simulator(name, make, dtype):
    needs(name)
    if not differentiable(name):
        pytest.skip(f"{name} is forward-only")
    with kaio.simulate():
        check_gradients(name, make(Maker("cpu", 2), dtype))


FORMULAS = [
    "silu_gate",
    "gelu",
    "add",
    "mul",
    "rms_norm",
    "rms_norm_residual",
    "layer_norm",
    "softmax",
]


@pytest.mark.parametrize(
    "name, make",
    [
        (p.values[0], p.values[1])
        for p in samples(False)
        if p.values[0] in FORMULAS and p.values[2] == torch.float32
    ],
)
def test_backward_formulas_gradcheck_float64(name, make):
    """The torch-op backward formulas, under the float64 reference forward: gradcheck."""
    spec = kt.REGISTERED[name]
    names = [a.name for a in torch.ops.kaio.__getattr__(name).default._schema.arguments]
    setup_context, backward = kt._autograd(spec, names)
    formula = type(
        f"{name}_formula",
        (torch.autograd.Function,),
        {
            "forward": staticmethod(REFERENCES[name]),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
        },
    )
    args = make(Maker("cpu", 3), torch.float32)
    defaults = [
        a.default_value
        for a in torch.ops.kaio.__getattr__(name).default._schema.arguments[len(args) :]
    ]
    args = [
        a.double().requires_grad_() if isinstance(a, torch.Tensor) else a
        for a in (*args, *defaults)
    ]
    assert torch.autograd.gradcheck(lambda *xs: formula.apply(*xs), tuple(args), fast_mode=True)


@pytest.mark.parametrize(
    "op, dtype", [("matmul_tc", torch.float16), ("matmul_tc_bf16_async", torch.bfloat16)]
)
@pytest.mark.parametrize("scale", [1.0, 1e-9])
def test_matmul_gradient_split_on_simulator(op, dtype, scale):
    """dC split into hi + lo (after power-of-two scaling) keeps about twice the bits of one
    cast; scaling keeps tiny f16 gradients from underflowing."""
    with kaio.simulate():
        check_matmul_split(Maker("cpu", 4), op, dtype, 48, 64, 40, scale)


def check_matmul_split(r: Maker, op: str, dtype, m: int, k: int, n: int, scale: float) -> dict:
    a, b, dc = r(m, k, dtype=dtype), r(k, n, dtype=dtype), r(m, n, scale=scale)
    ref_a, ref_b = dc.double() @ b.double().t(), a.double().t() @ dc.double()
    errors = {}
    for parts in (1, 2):
        da, db = kt.matmul_grads(a, b, dc, op, parts=parts)
        assert da.dtype == db.dtype == torch.float32
        errors[parts] = max(relative_error(da, ref_a), relative_error(db, ref_b))
    cast = relative_error((dc.to(dtype).double() @ b.double().t()), ref_a)
    bits = 11 if dtype == torch.float16 else 8
    assert errors[1] < 2.0**-bits, errors  # one (scaled) cast: its dtype's rounding
    # hi + lo: down to the f32 accumulation's own rounding (about sqrt(K) * 2^-24: 1.7e-6 on an
    # H200 at K = 1024), far below one cast
    assert errors[2] < min(errors[1] / 50, 2.0**-16), errors
    if scale < 1e-8 and dtype == torch.float16:
        assert cast > 0.1, cast  # an unscaled cast loses tiny f16 gradients; scaling does not
    errors["cast"] = cast
    return errors


def test_matmul_grad_parts_setting():
    assert kt.matmul_grad_parts() == 2
    with pytest.raises(ValueError, match="1 or 2"):
        kt.set_matmul_grad_parts(3)
    kt.set_matmul_grad_parts(1)
    try:
        assert kt.matmul_grad_parts() == 1
    finally:
        kt.set_matmul_grad_parts(2)


def chain(x, w, b):
    """A few kaio ops in a row (x f16 [T, D], w f16 [D], b f16 [D, 2F]), as a model would."""
    h = torch.ops.kaio.rms_norm(x, w)
    c = torch.ops.kaio.matmul_tc(h, b).half()
    gate, up_ = c.chunk(2, dim=1)  # non-contiguous views: the ops copy them
    y = torch.ops.kaio.silu_gate(gate, up_)
    return torch.ops.kaio.softmax(torch.ops.kaio.gelu(y))


def chain_inputs(r: Maker, t: int, d: int, f: int):
    return (
        r(t, d, dtype=torch.float16),
        r(d, dtype=torch.float16),
        r(d, 2 * f, dtype=torch.float16, scale=d**-0.5),
    )


def run_chain(fn, inputs, upstream):
    leaves = [a.clone().requires_grad_() for a in inputs]
    y = fn(*leaves)
    y.backward(upstream)
    return y.detach(), [a.grad for a in leaves]


class GraphCounter:
    """A torch.compile backend that records the graphs and the ops in them."""

    def __init__(self, inner="eager"):
        self.graphs = []
        self.inner = inner

    def ops(self) -> set:
        """The functions the graphs call, as 'namespace.name' for torch ops."""
        targets = [n.target for g in self.graphs for n in g.graph.nodes if n.op == "call_function"]
        return {str(t).removesuffix(".default") for t in targets}

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        if self.inner == "eager":
            return gm.forward
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.inner)(gm, example_inputs)


def test_torch_compile_fullgraph_on_meta_tensors():
    """torch.compile traces kaio ops (forward and, through AOT autograd, backward) from their
    fake implementations, with no graph break (fullgraph=True raises on one)."""
    torch._dynamo.reset()
    counter = GraphCounter("aot_eager")
    fn = torch.compile(chain, backend=counter, fullgraph=True)
    x, w, b = (a.to("meta").requires_grad_() for a in chain_inputs(Maker("cpu", 5), 8, 32, 16))
    y = fn(x, w, b)
    assert y.shape == (8, 16) and y.device.type == "meta"
    y.sum().backward()
    assert x.grad.shape == x.shape and b.grad.shape == b.shape
    assert len(counter.graphs) == 1
    assert {"kaio.rms_norm", "kaio.matmul_tc", "kaio.softmax"} <= counter.ops()


def test_qkv_projections_trace_under_torch_compile():
    """The fused projections' fake gives three f16 [M, N] outputs, N from each weight (here
    grouped-query widths), and torch.compile traces them with no graph break."""
    torch._dynamo.reset()
    counter = GraphCounter()
    widths = (64, 16, 16)
    x = torch.empty(5, 256, dtype=torch.float16, device="meta")
    words = [torch.empty(32, n, dtype=torch.int32, device="meta") for n in widths]
    scales = [torch.empty(2, n, dtype=torch.float16, device="meta") for n in widths]
    fn = torch.compile(torch.ops.kaio.qkv_project_int4, backend=counter, fullgraph=True)
    outs = fn(x, *words, *scales)
    assert [(o.shape, o.dtype) for o in outs] == [((5, n), torch.float16) for n in widths]
    assert "kaio.qkv_project_int4" in counter.ops()


def test_torch_compile_matches_eager_on_simulator():
    torch._dynamo.reset()
    r = Maker("cpu", 6)
    inputs = chain_inputs(r, 8, 32, 16)
    upstream = r(8, 16, dtype=torch.float16)
    with kaio.simulate():
        y, grads = run_chain(chain, inputs, upstream)
        yc, grads_c = run_chain(
            torch.compile(chain, backend="aot_eager", fullgraph=True), inputs, upstream
        )
    assert torch.equal(y, yc)
    for g, gc in zip(grads, grads_c, strict=True):
        torch.testing.assert_close(gc, g, rtol=2e-3, atol=1e-5)


def test_forward_only_op_says_so(monkeypatch):
    """A forward-only op runs, and asking it for a gradient raises a clear error."""
    name = "_test_forward_only"
    monkeypatch.setattr(kaio_ops, name, kaio_ops.softmax, raising=False)
    if not hasattr(torch.ops.kaio, name):
        kt.register(kt.OpSpec(name, "(Tensor x) -> Tensor", kt._like, "it is a test"))
    x = torch.randn(3, 8, requires_grad=True)
    with kaio.simulate():
        y = getattr(torch.ops.kaio, name)(x)
        assert torch.equal(y.detach(), torch.ops.kaio.softmax(x.detach()))
        with pytest.raises(RuntimeError, match=f"kaio.{name} has no gradient: it is a test"):
            y.sum().backward()


def load_example() -> dict:
    return runpy.run_path(str(ROOT / "examples" / "torch_decoder_block.py"))


def test_decoder_block_example_on_simulator():
    example = load_example()
    with kaio.simulate():
        errors = example["compare"](example["TINY"], "cpu")
    assert errors.pop("attention")
    for name, (ours, theirs) in errors.items():
        assert ours < example["TOLERANCE"], (name, ours, theirs)


# ---------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name, make, dtype", samples(True, skip=IN_PLACE))
def test_gpu_bit_exact_with_kaio_ops(name, make, dtype):
    op = needs(name)
    args = make(Maker("cuda", 11), dtype)
    ours = as_tuple(op(*args))
    direct = as_tuple(kt._positional(getattr(kaio_ops, name))(*args))
    for o, d in zip(ours, direct, strict=True):
        assert o.is_cuda and torch.equal(o, d)


@pytest.mark.gpu
@pytest.mark.parametrize("name, make, dtype", samples(True))
def test_gpu_gradients(name, make, dtype):
    needs(name)
    if not differentiable(name):
        pytest.skip(f"{name} is forward-only")
    check_gradients(name, make(Maker("cuda", 12), dtype))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, make, dtype",
    samples(
        False,
        only={
            "rms_norm_residual",
            "rope",
            "matmul_tc_bf16",
            "attention_flash_causal",
            "flash_attention",
            "flash_attention_varlen",
        },
        every_dtype=False,
    ),
)
def test_gpu_opcheck(name, make, dtype):
    needs(name)
    opcheck(name, make(Maker("cuda", 13), dtype))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op, dtype", [("matmul_tc_async", torch.float16), ("matmul_tc_bf16", torch.bfloat16)]
)
@pytest.mark.parametrize("scale", [1.0, 1e-9])
def test_gpu_matmul_gradient_split(op, dtype, scale):
    check_matmul_split(Maker("cuda", 14), op, dtype, 512, 768, 384, scale)


@pytest.mark.gpu
def test_gpu_noncontiguous_inputs_are_copied():
    r = Maker("cuda", 15)
    a, b = r(64, 96, dtype=torch.float16), r(80, 96, dtype=torch.float16)
    assert torch.equal(
        torch.ops.kaio.matmul_tc(a, b.t()), kaio_ops.matmul_tc(a, b.t().contiguous())
    )


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_matches_eager():
    """Forward and backward captured in one CUDA graph; replayed on new inputs copied into the
    static ones, the outputs and gradients equal an eager run on those inputs, bit for bit."""
    r = Maker("cuda", 16)
    static = [a.requires_grad_() for a in chain_inputs(r, 64, 256, 128)]
    upstream = r(64, 128, dtype=torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles and loads every kernel) off the capture
        for _ in range(2):
            for a in static:
                a.grad = None
            chain(*static).backward(upstream)
    torch.cuda.current_stream().wait_stream(side)
    for a in static:
        a.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = chain(*static)
        y.backward(upstream)
    fresh = chain_inputs(r, 64, 256, 128)
    with torch.no_grad():
        for a, new in zip(static, fresh, strict=True):
            a.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    y_eager, grads = run_chain(chain, fresh, upstream)
    assert torch.equal(y, y_eager)
    for a, g in zip(static, grads, strict=True):
        assert torch.equal(a.grad, g)


@pytest.mark.gpu
def test_gpu_runs_on_the_current_stream():
    """On a side stream held up by a long sleep, the op sees the fill queued before it: it was
    launched on that stream, not the default one."""
    x = torch.zeros(1 << 20, device="cuda")
    w = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of spinning on the side stream
        x.fill_(3.0)
        y = torch.ops.kaio.add(x, w)
    side.synchronize()
    assert bool((y == 4.0).all())


@pytest.mark.gpu
def test_gpu_no_synchronization():
    r = Maker("cuda", 17)
    inputs, upstream = chain_inputs(r, 32, 128, 64), r(32, 64, dtype=torch.float16)
    run_chain(chain, inputs, upstream)  # compile and load first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run_chain(chain, inputs, upstream)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_gpu_torch_compile_inductor():
    torch._dynamo.reset()
    r = Maker("cuda", 18)
    inputs, upstream = chain_inputs(r, 64, 256, 128), r(64, 128, dtype=torch.float16)
    counter = GraphCounter("inductor")
    y, grads = run_chain(chain, inputs, upstream)
    yc, grads_c = run_chain(torch.compile(chain, backend=counter, fullgraph=True), inputs, upstream)
    assert len(counter.graphs) == 1 and "kaio.matmul_tc" in counter.ops()
    torch.testing.assert_close(yc, y, rtol=2e-3, atol=1e-5)
    # inductor fuses the backward formulas' torch ops without rounding every intermediate to
    # f16 as eager does: a few elements differ by some f16 ulps (5 of 65536 on an H200)
    for g, gc in zip(grads, grads_c, strict=True):
        assert relative_error(gc, g) < 2e-3


@pytest.mark.gpu
def test_gpu_decoder_block_example():
    example = load_example()
    errors = example["compare"](example["GPU"], "cuda")
    print(errors)
    assert errors.pop("attention")
    for name, (ours, theirs) in errors.items():
        assert ours < example["TOLERANCE"], (name, ours, theirs)
