"""flash_attention_varlen (packed sequences of different lengths): in the simulator against a
float64 NumPy reference computed sequence by sequence (random lengths with empty and
length-1 sequences, causal aligned bottom-right with sq != sk, grouped-query heads, D 64, 128
and 256, f16 and bf16), the backward against the reference's gradients, input checks, every
shipped specialization through ptxas (no spills on sm_90), and on a GPU, real sizes against
float64 torch per sequence, autograd through torch.ops.kaio, determinism and CUDA graphs."""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import find_ptxas
from kaio_ops import attention_varlen
from tests.harness import assemble_without_spills
from tests.poison import poison_allocations

BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates (outputs, stats, delta) starts as NaN."""
    poison_allocations(monkeypatch)


# --------------------------------------------------------------------------- references


def offsets(lengths) -> np.ndarray:
    """cu_seqlens of ``lengths``: int32 [B + 1]."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def sequence_attention(q, k, v, do, causal: bool, scale: float):
    """(out, lse, dq, dk, dv) of one sequence's one head in float64: q, do [sq, D], k, v
    [sk, D]; causal aligned bottom-right (query i sees keys j <= i + sk - sq); a query that
    sees no key gets zeros (and lse -inf, no gradient)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    sq, sk = len(q), len(k)
    s = q @ k.T * scale
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    seen = np.isfinite(s).any(-1) if sk else np.zeros(sq, bool)
    m = np.where(seen, s.max(-1, initial=-np.inf), 0.0)[:, None]
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    p = np.where(seen[:, None], e / np.where(seen[:, None], total, 1.0), 0.0)
    out = p @ v
    lse = np.where(seen, (m + np.log(np.where(seen[:, None], total, 1.0)))[:, 0], -np.inf)
    ds = p * (do @ v.T - (do * out).sum(-1, keepdims=True))
    return out, lse, ds @ k * scale, ds.T @ q * scale, p.T @ do


def reference(q, k, v, do, cu_q, cu_k, causal, scale=None):
    """(out [total_q, H, D], lse [H, total_q], dq, dk, dv) of the packed batch in float64,
    sequence by sequence and head by head (K/V head h // group), dk and dv summed over each
    group; rows past the last offset stay zero."""
    total_q, h, d = q.shape
    group = h // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out, dq = np.zeros(q.shape), np.zeros(q.shape)
    dk, dv = np.zeros(k.shape), np.zeros(k.shape)
    lse = np.full((h, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        for head in range(h):
            kv = head // group
            o, l, gq, gk, gv = sequence_attention(
                q[rq, head], k[rk, kv], v[rk, kv], do[rq, head], causal, scale
            )
            out[rq, head], lse[head, rq], dq[rq, head] = o, l, gq
            dk[rk, kv] += gk
            dv[rk, kv] += gv
    return out, lse, dq, dk, dv


def rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "NaN or inf: an element was not written"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def batch(rng, lens_q, lens_k, h, hkv, d, dtype):
    """Random packed q, k, v, do and their offsets."""
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    q, do = (rng.standard_normal((cu_q[-1], h, d)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal((cu_k[-1], hkv, d)).astype(dtype) for _ in range(2))
    return q, k, v, do, cu_q, cu_k


def check_lse(lse, ref_lse):
    """The same rows see no key (-inf), the others within 1e-3."""
    assert lse.dtype == np.float32 and lse.shape == ref_lse.shape
    empty = np.isneginf(ref_lse)
    assert (np.isneginf(lse) == empty).all()
    assert np.abs(lse[~empty] - ref_lse[~empty]).max(initial=0.0) < 1e-3


# --------------------------------------------------------------------------- simulator


def _random_lengths(seed: int, n: int, top: int) -> list:
    """n random lengths up to ``top``, with an empty and a length-1 sequence among them."""
    lens = np.random.default_rng(seed).integers(2, top + 1, n).tolist()
    lens[1], lens[-1] = 0, 1
    return lens


@pytest.mark.parametrize(
    "lens_q, lens_k, h, hkv, d, dtype, causal, scale",
    [
        # random lengths (an empty and a length-1 sequence), 4 query heads a K/V head
        (_random_lengths(1, 5, 70), None, 4, 1, 64, np.float16, True, None),
        (_random_lengths(2, 4, 40), None, 2, 2, 128, BF16, False, 0.2),
        # sq != sk: more keys (a prefix), fewer keys (rows that see none), no keys at all
        ([9, 3, 1, 0, 5], [4, 20, 1, 6, 0], 2, 1, 64, BF16, True, None),
        ([5, 0, 33], [9, 4, 0], 4, 4, 128, np.float16, False, None),
        ([3, 18], [21, 18], 1, 1, 256, np.float16, True, None),  # D = 256: BN = 32
        ([7, 12], [7, 12], 2, 2, 72, np.float16, True, None),  # D = 72, padded to 128
    ],
)
def test_varlen_forward_in_simulator(lens_q, lens_k, h, hkv, d, dtype, causal, scale):
    lens_k = lens_q if lens_k is None else lens_k
    rng = np.random.default_rng(sum(lens_q) + d)
    q, k, v, do, cu_q, cu_k = batch(rng, lens_q, lens_k, h, hkv, d, dtype)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_varlen_with_stats(
            q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, scale=scale
        )
        plain = kaio_ops.flash_attention_varlen(
            q, k, v, cu_q, cu_k, max(lens_q) + 5, max(lens_k), causal, scale
        )
    assert out.dtype == q.dtype and out.shape == q.shape
    ref_out, ref_lse, *_ = reference(q, k, v, do, cu_q, cu_k, causal, scale)
    assert rel(out, ref_out) < (1e-3 if dtype == np.float16 else 1e-2)
    check_lse(lse, ref_lse)
    # a larger max_seqlen only adds idle blocks
    assert np.array_equal(plain.view(np.uint16), out.view(np.uint16))


@pytest.mark.parametrize(
    "lens_q, lens_k, h, hkv, d, dtype, causal",
    [
        (_random_lengths(3, 4, 50), None, 4, 2, 64, np.float16, True),
        ([6, 0, 1, 17], [3, 5, 1, 0], 2, 2, 128, BF16, True),  # sq != sk, rows with no key
        ([20, 1], [9, 33], 2, 1, 64, BF16, False),
    ],
)
def test_varlen_backward_in_simulator(lens_q, lens_k, h, hkv, d, dtype, causal):
    lens_k = lens_q if lens_k is None else lens_k
    rng = np.random.default_rng(sum(lens_q) + d + 1)
    q, k, v, do, cu_q, cu_k = batch(rng, lens_q, lens_k, h, hkv, d, dtype)
    args = (cu_q, cu_k, max(lens_q), max(lens_k), causal)
    with kaio.simulate():
        o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, *args)
        grads = kaio_ops.flash_attention_varlen_bwd(do, q, k, v, o, lse, *args)
    _, _, *ref = reference(q, k, v, do, cu_q, cu_k, causal)
    tol = 2e-3 if dtype == np.float16 else 1e-2  # P and dS rounded to 16 bits for the mma
    for name, g, r in zip("qkv", grads, ref, strict=True):
        assert g.dtype == q.dtype and rel(g, r) < tol, name


def test_varlen_equals_flash_attention_per_sequence_in_simulator():
    """With Sq == Sk (where both causal conventions agree) each sequence's rows are those of
    flash_attention on that sequence alone, to the bit: the same kernel body."""
    lens = [37, 1, 64]
    rng = np.random.default_rng(4)
    q, k, v, _, cu, _ = batch(rng, lens, lens, 4, 2, 64, BF16)
    with kaio.simulate():
        packed = kaio_ops.flash_attention_varlen(q, k, v, cu, cu, 64, 64, causal=True)
        for b in range(len(lens)):
            rows = slice(cu[b], cu[b + 1])
            one = [np.ascontiguousarray(x[rows].transpose(1, 0, 2)[None]) for x in (q, k, v)]
            dense = kaio_ops.flash_attention(*one, causal=True)[0].transpose(1, 0, 2)
            assert np.array_equal(packed[rows].view(np.uint16), dense.view(np.uint16)), b


def test_varlen_empty_batch_in_simulator():
    """No tokens at all (every sequence empty): empty outputs, nothing launched."""
    q = np.zeros((0, 2, 64), np.float16)
    cu = np.zeros(3, np.int32)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_varlen_with_stats(q, q, q, cu, cu, 0, 0)
        dq, dk, dv = kaio_ops.flash_attention_varlen_bwd(q, q, q, q, out, lse, cu, cu, 0, 0)
    assert out.shape == dq.shape == dk.shape == (0, 2, 64) and lse.shape == (2, 0)


# --------------------------------------------------------------------------- input checks


def _h(*shape, dtype=np.float16):
    return np.ones(shape, dtype)


def _cu(*values, dtype=np.int32):
    return np.array(values, dtype)


def _call(q=None, k=None, v=None, cu_q=None, cu_k=None, max_q=4, max_k=4, **kw):
    q = _h(8, 4, 64) if q is None else q
    k = _h(8, 2, 64) if k is None else k
    v = k if v is None else v
    cu_q = _cu(0, 4, 8) if cu_q is None else cu_q
    cu_k = _cu(0, 4, 8) if cu_k is None else cu_k
    return lambda: kaio_ops.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def _bwd(**given):
    """flash_attention_varlen_bwd of 2 sequences of 4 tokens, some arguments replaced."""
    args = {"do": _h(8, 4, 64), "q": _h(8, 4, 64), "k": _h(8, 2, 64), "v": _h(8, 2, 64)}
    args.update(o=_h(8, 4, 64), lse=_h(4, 8, dtype=np.float32), cu_seqlens_q=_cu(0, 4, 8))
    args.update(cu_seqlens_k=_cu(0, 4, 8), max_seqlen_q=4, max_seqlen_k=4)
    args.update(given)
    return lambda: kaio_ops.flash_attention_varlen_bwd(**args)


@pytest.mark.parametrize(
    "call, message",
    [
        (_call(q=_h(8, 4, 64, dtype=np.float32)), "'q' must be a 3-D array .* of f16 or bf16"),
        (_call(k=_h(8, 2, 64, dtype=BF16)), "'k' must be .* of f16, got dtype bf16"),
        (_call(q=_h(8, 64)), "'q' must be a 3-D array \\[total_q, H, D\\]"),
        (_call(k=_h(8, 3, 64)), "Hkv = 3 heads, which must divide q's H = 4"),
        (_call(k=_h(8, 2, 32)), "'k' must have head dim D = 64"),
        (_call(v=_h(9, 2, 64)), "'v' must have shape \\(8, 2, 64\\)"),
        (_call(q=_h(8, 4, 60), k=_h(8, 2, 60)), "head dim D = 60"),
        (_call(cu_q=_cu(0, 4, 8, dtype=np.int64)), "'cu_seqlens_q' must be .* of i32"),
        (_call(cu_k=_cu(0, 8)), "'cu_seqlens_k' must have shape \\(3,\\)"),
        (_call(cu_q=_cu(0)), "'cu_seqlens_q' must hold B \\+ 1 offsets"),
        (_call(cu_q=_cu(0, 5, 3)), "'cu_seqlens_q' must increase"),
        (_call(cu_k=_cu(0, 4, 9)), "'cu_seqlens_k' must increase .* within the 8"),
        (_call(max_q=3), "max_seqlen_q = 3 is less than the longest sequence of cu_seqlens_q"),
        (_call(max_k=-1), "max_seqlen_k must be a non-negative int"),
        (_call(max_q=4.0), "max_seqlen_q must be a non-negative int"),
        (_call(scale=0.0), "scale must be a positive"),
        (_bwd(lse=_h(8, 4, dtype=np.float32)), "'lse' must have shape \\(4, 8\\)"),
        (_bwd(do=_h(8, 4, 64, dtype=BF16)), "'do' must be a 3-D array .* of f16, got dtype bf16"),
        (_bwd(o=_h(8, 4, 32)), "'o' must have shape \\(8, 4, 64\\)"),
    ],
)
def test_bad_inputs_name_the_argument(call, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        call()


def _assembled() -> list:
    """The specializations assembled here: every f16 one (head dims 64, 128, 256; dK and dV
    apart at 256) and the bf16 ones at D = 128 (bf16 changes only the mma's type)."""
    return [
        (kernel, constexprs)
        for kernel, constexprs in attention_varlen.shipped()
        if constexprs["DT"] == kaio.f16 or constexprs["DP"] == 128
    ]


def _assemble(index: int) -> None:
    assemble_without_spills(*_assembled()[index])  # sm_80 and sm_90, no spills on sm_90


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_shipped_specializations_assemble():
    assert len(list(attention_varlen.shipped())) == 2 * (3 + 3 + 4)  # f16, bf16; 3 head dims
    count = len(_assembled())
    assert count == 10 + 3
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(_assemble, range(count)))


# --------------------------------------------------------------------------- GPU


# KAIO_SANITIZER_SHAPES=1 (compute-sanitizer runs, docs/testing.md): shorter sequences, the
# same tails and empty and length-1 sequences
SANITIZER_SHAPES = os.environ.get("KAIO_SANITIZER_SHAPES") == "1"
if SANITIZER_SHAPES:
    GPU_LENGTHS, OTHER_LENGTHS = [1, 0, 77, 150, 64, 205, 129, 33], [7, 3, 77, 100, 0, 210, 129, 40]
else:
    GPU_LENGTHS = [1, 0, 777, 1500, 64, 2048, 129, 333]
    OTHER_LENGTHS = [7, 3, 777, 1000, 0, 2100, 129, 400]


def _gpu_batch(lens_q, lens_k, h, hkv, d, dtype, seed):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device="cuda").to(dtype)

    cu_q = torch.tensor(offsets(lens_q), device="cuda")
    cu_k = torch.tensor(offsets(lens_k), device="cuda")
    q, do = rand(int(sum(lens_q)), h, d), rand(int(sum(lens_q)), h, d)
    k, v = rand(int(sum(lens_k)), hkv, d), rand(int(sum(lens_k)), hkv, d)
    return q, k, v, do, cu_q, cu_k


def _torch_reference(q, k, v, lens_q, lens_k, causal, grads_of=None):
    """Packed float64 attention per sequence (torch, on the GPU), bottom-right causal;
    with ``grads_of`` (do), also (dq, dk, dv) by autograd."""
    import torch

    leaves = [x.double().requires_grad_(grads_of is not None) for x in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    outs, sq0, sk0 = [], 0, 0
    for sq, sk in zip(lens_q, lens_k, strict=True):
        qs = leaves[0][sq0 : sq0 + sq].transpose(0, 1)
        ks, vs = (x[sk0 : sk0 + sk].repeat_interleave(group, 1).transpose(0, 1) for x in leaves[1:])
        s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            i = torch.arange(sq, device=q.device)[:, None]
            j = torch.arange(sk, device=q.device)[None, :]
            s = s.masked_fill(j > i + sk - sq, float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0)  # a row with no key: zeros
        outs.append((p @ vs).transpose(0, 1))
        sq0, sk0 = sq0 + sq, sk0 + sk
    out = torch.cat(outs)
    if grads_of is None:
        return out.detach()
    out.backward(grads_of.double())
    return out.detach(), *(x.grad for x in leaves)


def _rel_t(out, ref) -> float:
    import torch

    assert out.shape == ref.shape and torch.isfinite(out).all()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "h, hkv, d", [(8, 2, 128), (4, 4, 64), (4, 1, 256), (6, 3, 96)]
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("same_lengths", [True, False])
def test_gpu_varlen_against_torch(h, hkv, d, causal, dtype, same_lengths):
    import torch

    lens_q = GPU_LENGTHS
    lens_k = lens_q if same_lengths else OTHER_LENGTHS
    dt = getattr(torch, dtype)
    q, k, v, _, cu_q, cu_k = _gpu_batch(lens_q, lens_k, h, hkv, d, dt, d + h)
    out = kaio_ops.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal)
    assert out.dtype == dt and out.shape == q.shape
    ref = _torch_reference(q, k, v, lens_q, lens_k, causal)
    assert _rel_t(out, ref) < (1e-3 if dtype == "float16" else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("h, hkv, d", [(8, 2, 128), (4, 4, 64), (2, 1, 256)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_varlen_autograd_against_torch(h, hkv, d, causal, dtype):
    """torch.ops.kaio.flash_attention_varlen through autograd: dq, dk, dv against float64
    torch per sequence; the backward twice gives the same bits."""
    import torch

    import kaio_ops.torch  # noqa: F401  (registers torch.ops.kaio)

    lens_q, lens_k = GPU_LENGTHS, OTHER_LENGTHS
    if causal:
        lens_k = lens_q
    dt = getattr(torch, dtype)
    q, k, v, do, cu_q, cu_k = _gpu_batch(lens_q, lens_k, h, hkv, d, dt, d + h + 1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    args = (cu_q, cu_k, max(lens_q), max(lens_k), causal)
    out = torch.ops.kaio.flash_attention_varlen(*leaves, *args)
    out.backward(do)
    ref_out, *ref_grads = _torch_reference(q, k, v, lens_q, lens_k, causal, grads_of=do)
    assert _rel_t(out.detach(), ref_out) < (1e-3 if dtype == "float16" else 1e-2)
    tol = 5e-3 if dtype == "float16" else 3e-2
    for name, leaf, ref in zip("qkv", leaves, ref_grads, strict=True):
        assert leaf.grad.dtype == dt and _rel_t(leaf.grad, ref) < tol, name
    o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, *args)
    first = kaio_ops.flash_attention_varlen_bwd(do, q, k, v, o, lse, *args)
    again = kaio_ops.flash_attention_varlen_bwd(do, q, k, v, o, lse, *args)
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))


@pytest.mark.gpu
def test_gpu_varlen_in_a_cuda_graph():
    """The offsets are read on the GPU: a captured call replays with new lengths written into
    the same cu_seqlens tensors (the same totals and max), no host synchronization."""
    import torch

    h, d, dt = 4, 128, torch.float16
    lens, other = [300, 0, 1, 211], [1, 300, 200, 11]
    q, k, v, _, cu_q, cu_k = _gpu_batch(lens, lens, h, h, d, dt, 5)
    kaio_ops.flash_attention_varlen(q, k, v, cu_q, cu_k, 300, 300, True)  # compile, plan
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kaio_ops.flash_attention_varlen(q, k, v, cu_q, cu_k, 300, 300, True)
    for lengths in (other, lens):
        cu_q.copy_(torch.tensor(offsets(lengths), device="cuda"))
        cu_k.copy_(cu_q)
        graph.replay()
        ref = _torch_reference(q, k, v, lengths, lengths, True)
        assert _rel_t(out, ref) < 1e-3


@pytest.mark.gpu
def test_gpu_varlen_without_keys_or_queries():
    """No key at all (total_k = 0, a null pointer): zeros and lse -inf; no query at all:
    empty outputs; dK and dV of keys no query sees: zeros."""
    import torch

    q, _, _, do, cu_q, _ = _gpu_batch([3, 5], [0, 0], 2, 1, 64, torch.float16, 3)
    k = torch.empty(0, 1, 64, dtype=torch.float16, device="cuda")
    cu_k = torch.zeros(3, dtype=torch.int32, device="cuda")
    out, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, k, cu_q, cu_k, 5, 0)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    dq, dk, dv = kaio_ops.flash_attention_varlen_bwd(do, q, k, k, out, lse, cu_q, cu_k, 5, 0)
    assert torch.equal(dq, torch.zeros_like(dq)) and dk.shape == (0, 1, 64)
    kv = torch.randn(9, 1, 64, dtype=torch.float16, device="cuda")
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32, device="cuda")
    empty = q[:0]
    cu_q = torch.zeros(3, dtype=torch.int32, device="cuda")
    out, lse = kaio_ops.flash_attention_varlen_with_stats(empty, kv, kv, cu_q, cu_k, 0, 5)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    dq, dk, dv = kaio_ops.flash_attention_varlen_bwd(
        empty, empty, kv, kv, out, lse, cu_q, cu_k, 0, 5
    )
    assert torch.equal(dk, torch.zeros_like(dk)) and torch.equal(dv, torch.zeros_like(dv))
