"""The Hopper varlen backward (``kaio_ops._attention_hopper_varlen_bwd``: the dense Hopper
backward's deterministic pair over packed sequences) in the simulator against the float64
reference of ``tests/test_ops_attention_varlen`` (both head dims, f16 and bf16, causal
aligned bottom-right with sq != sk, grouped-query heads, empty and length-1 sequences, rows
and tiles that see no key, the race detector on), its PTX through ptxas for sm_90a,
``flash_attention_varlen_bwd``'s dispatch, and on an sm_90 GPU at real sizes against float64
torch and against the mma.sync varlen backward."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio.ptx.ptxas import find_ptxas
from kaio_ops import _attention_hopper_varlen_bwd as hvb
from kaio_ops import attention_varlen
from tests.harness import assemble_wgmma, assemble_without_spills
from tests.poison import poison_allocations
from tests.test_ops_attention_varlen import batch, reference, rel

BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates starts as NaN."""
    poison_allocations(monkeypatch)


def small(d: int, **over) -> dict:
    """The shipped configuration for head dim d with two ring stages (so that the ring
    wraps at these sizes; D 256: as shipped, its dK/dV kernel's two, its dQ kernel's one)
    and ``over``'s changes to both kernels."""
    cfg = hvb.config(d)
    if d == 256:
        return {name: {**c, **over} for name, c in cfg.items()}
    return {name: {**c, "STAGES": 2, **over} for name, c in cfg.items()}


def run_sim(lens_q, lens_k, h, hkv, d, dtype, causal, cfg, scale=None):
    """(dq, dk, dv) of ``_attention_hopper_varlen_bwd.launch`` in the simulator and the
    float64 reference's, on random packed inputs (o and lse: the float64 forward's, o
    rounded to the input type as the forward returns it)."""
    rng = np.random.default_rng(sum(lens_q) * 5 + sum(lens_k) + d)
    q, k, v, do, cu_q, cu_k = batch(rng, lens_q, lens_k, h, hkv, d, dtype)
    o, lse, *ref = reference(q, k, v, do, cu_q, cu_k, causal, scale)
    o, lse = o.astype(dtype), lse.astype(np.float32)
    with kaio.simulate():
        arrays, dims, sc, oa = attention_varlen._check_bwd(
            "test", do, q, k, v, o, lse, cu_q, cu_k, max(lens_q), max(lens_k), scale
        )
        grads = hvb.launch(*arrays, oa, dims, causal, sc, cfg)
    return grads, ref


@pytest.mark.parametrize(
    "lens_q, lens_k, h, hkv, d, dtype, causal",
    [
        # an empty and a length-1 sequence, a query tail, 2 query heads a K/V head, causal
        ([66, 0, 1, 9], None, 2, 1, 64, np.float16, True),
        # sq != sk causal (bottom-right): more keys, fewer keys (rows that see none, a whole
        # dQ tile that sees none), no keys, no queries; bf16
        ([9, 3, 1, 0, 150, 5], [4, 20, 1, 6, 0, 3], 1, 1, 64, BF16, True),
        # D = 128, not causal, sq != sk, several key tiles (more than the stages)
        ([5, 0, 70], [140, 4, 70], 1, 1, 128, np.float16, False),
        # D = 256 (the dense D 256 backward's dK/dV kernel, the pair's dQ kernel): causal
        # with fewer and more keys than queries, two query heads a K/V head, an empty and a
        # length-1 sequence, the ring wrapping
        ([70, 0, 1, 9], [66, 4, 1, 20], 2, 1, 256, np.float16, True),
    ],
)
def test_hopper_varlen_backward_in_simulator(lens_q, lens_k, h, hkv, d, dtype, causal):
    lens_k = lens_q if lens_k is None else lens_k
    grads, ref = run_sim(lens_q, lens_k, h, hkv, d, dtype, causal, small(d))
    tol = 2e-3 if dtype == np.float16 else 1e-2  # P and dS rounded to 16 bits for wgmma
    for name, g, r in zip("qkv", grads, ref, strict=True):
        assert g.dtype == dtype and rel(g, r) < tol, name


def test_hopper_varlen_backward_keys_of_the_next_sequence_are_left_out_in_simulator():
    """Sequence 0's last tiles reach into sequence 1's rows, whose inputs are 1000 times
    larger: masked, they change none of sequence 0's gradients (the reference sees
    sequence 0 alone)."""
    lens = [40, 30]
    rng = np.random.default_rng(11)
    q, k, v, do, cu_q, cu_k = batch(rng, lens, lens, 2, 1, 64, np.float16)
    for x in (q, k, v, do):
        x[40:] *= 1000
    o, lse, *_ = reference(q, k, v, do, cu_q, cu_k, False, 0.3)
    o, lse = o.astype(np.float16), lse.astype(np.float32)
    with kaio.simulate():
        arrays, dims, sc, oa = attention_varlen._check_bwd(
            "test", do, q, k, v, o, lse, cu_q, cu_k, 40, 40, 0.3
        )
        grads = hvb.launch(*arrays, oa, dims, False, sc, small(64))
    _, _, *ref = reference(q[:40], k[:40], v[:40], do[:40], cu_q[:2], cu_k[:2], False, 0.3)
    for name, g, r in zip("qkv", grads, ref, strict=True):
        assert rel(g[:40], r) < 2e-3, name


def test_dispatch_to_the_hopper_varlen_backward():
    """Head dims 64, 128 and 256 on an sm_90 GPU where the mean lengths measured faster;
    never in the simulator."""
    assert hvb.eligible(64) and hvb.eligible(128) and hvb.eligible(256)
    assert not hvb.eligible(96) and not hvb.eligible(512)
    q = np.zeros((8, 2, 128), np.float16)
    cu = np.array([0, 8], np.int32)
    with kaio.simulate():
        (qa, *_), dims, _ = attention_varlen._check("test", q, q, q, cu, cu, 8, 8, None)
        assert not attention_varlen.hopper_bwd_takes(qa, qa, dims, False)
    assert hvb.worthwhile(4000, 4000, 128, True) and hvb.worthwhile(4000, 4000, 64, False)
    assert hvb.worthwhile(149, 149, 128, True) and hvb.worthwhile(149, 149, 64, False)
    assert hvb.worthwhile(304, 304, 64, True)
    assert not hvb.worthwhile(149, 149, 64, True)  # short, causal, D 64: the mma.sync ones
    assert hvb.worthwhile(149, 149, 256, True) and hvb.worthwhile(4000, 4000, 256, False)
    assert not hvb.worthwhile(100, 4000, 256, False)  # shorter than measured
    assert not hvb.worthwhile(4000, 10, 128, False)  # few keys a sequence


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("index", range(3))
def test_specializations_assemble_for_sm_90a(index):
    """The f16 D 128 pair (the most registers; bf16's kernels are the same code but the
    wgmma type, D 64's the dense pair's body at D 64, assembled by its tests) and the D 256
    dK/dV kernel with COLS 1 (its dQ kernel: the dense D 256 one's body)."""
    picked = [(k, c) for k, c in hvb.specializations() if c["DT"] == kaio.f16 and c["D"] == 128]
    picked += [(k, c) for k, c in hvb.specializations()
               if c["DT"] == kaio.f16 and c["D"] == 256][:1]  # fmt: skip
    assemble_wgmma(*picked[index])


def test_other_targets_are_compile_errors():
    for kernel, constexprs in list(hvb.specializations())[:1]:
        with pytest.raises(kaio.CompileError, match="needs sm_90"):
            kernel.ptx(arch="sm_80", **constexprs)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_stats_copies_assemble():
    """The lse and delta copies (plain SIMT) assemble for sm_80 and sm_90, no spills."""
    for d in (64, 128):
        assemble_without_spills(hvb.varlen_stats, {"D": d, "DT": kaio.f16})


# --------------------------------------------------------------------------- GPU


def _sm90():
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


LENGTHS = [1, 0, 777, 1500, 64, 2048, 129, 333, 4000]
OTHER = [7, 3, 777, 1000, 0, 2100, 129, 400, 3000]


@pytest.mark.gpu
@pytest.mark.parametrize("h, hkv, d", [(8, 2, 128), (4, 4, 64), (4, 2, 256)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("same_lengths", [True, False])
def test_gpu_hopper_varlen_backward_against_float64_and_mma_sync(
    h, hkv, d, causal, dtype, same_lengths
):
    """The Hopper varlen backward (launched directly) against float64 torch autograd per
    sequence and against the mma.sync varlen backward; twice the same bits."""
    import torch

    import kaio_ops
    from tests.test_ops_attention_varlen import _gpu_batch, _rel_t, _torch_reference

    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    lens_q = LENGTHS
    lens_k = lens_q if same_lengths else OTHER
    dt = getattr(torch, dtype)
    q, k, v, do, cu_q, cu_k = _gpu_batch(lens_q, lens_k, h, hkv, d, dt, d + h + 5)
    args = (cu_q, cu_k, max(lens_q), max(lens_k), causal)
    o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, *args)
    grads = attention_varlen.backward_hopper(do, q, k, v, o, lse, *args)
    _, *ref = _torch_reference(q, k, v, lens_q, lens_k, causal, grads_of=do)
    mma = attention_varlen.backward_mma(do, q, k, v, o, lse, *args)
    tol = 5e-3 if dtype == "float16" else 3e-2
    for name, g, r, m in zip("qkv", grads, ref, mma, strict=True):
        assert g.dtype == dt and _rel_t(g, r) < tol, name
        assert _rel_t(g, m.double()) < tol, name
    again = attention_varlen.backward_hopper(do, q, k, v, o, lse, *args)
    assert all(torch.equal(x, y) for x, y in zip(grads, again, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_varlen_autograd_takes_the_hopper_backward(causal):
    """torch.ops.kaio.flash_attention_varlen through autograd on sm_90 with long sequences:
    the dispatch takes the Hopper backward, whose gradients match float64 torch."""
    import torch

    import kaio_ops.torch  # noqa: F401  (registers torch.ops.kaio)
    from tests.test_ops_attention_varlen import _gpu_batch, _rel_t, _torch_reference

    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    lens = [4000, 1, 2500, 0, 3000, 2222]
    q, k, v, do, cu, _ = _gpu_batch(lens, lens, 8, 2, 128, torch.float16, 17)
    (qa, ka, *_), dims, _ = attention_varlen._check("test", q, k, v, cu, cu, 4000, 4000, None)
    assert attention_varlen.hopper_bwd_takes(qa, ka, dims, causal)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = torch.ops.kaio.flash_attention_varlen(*leaves, cu, cu, 4000, 4000, causal)
    out.backward(do)
    _, *ref = _torch_reference(q, k, v, lens, lens, causal, grads_of=do)
    for name, leaf, r in zip("qkv", leaves, ref, strict=True):
        assert _rel_t(leaf.grad, r) < 5e-3, name


@pytest.mark.gpu
def test_gpu_hopper_varlen_backward_tiny():
    """A tiny case for compute-sanitizer (``-k tiny``): D 64 causal, two query heads a K/V
    head, sq != sk, an empty and a length-1 sequence, a sequence with no keys; against
    float64 torch."""
    import torch

    import kaio_ops
    from tests.test_ops_attention_varlen import _gpu_batch, _rel_t, _torch_reference

    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    lens_q, lens_k = [70, 0, 1, 133, 5], [66, 4, 1, 140, 0]
    q, k, v, do, cu_q, cu_k = _gpu_batch(lens_q, lens_k, 2, 1, 64, torch.float16, 3)
    args = (cu_q, cu_k, max(lens_q), max(lens_k), True)
    o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, *args)
    grads = attention_varlen.backward_hopper(do, q, k, v, o, lse, *args)
    _, *ref = _torch_reference(q, k, v, lens_q, lens_k, True, grads_of=do)
    for name, g, r in zip("qkv", grads, ref, strict=True):
        assert _rel_t(g, r) < 5e-3, name
