"""The Hopper varlen forward (``kaio_ops._attention_hopper_varlen``: the dense Hopper
kernel's TMA producer and wgmma consumers over packed sequences) in the simulator against
the float64 reference of ``tests/test_ops_attention_varlen`` (every head dim, f16 and bf16,
causal aligned bottom-right with sq != sk, grouped-query heads, empty and length-1
sequences, rows and tiles that see no key, the race detector on), its PTX through ptxas for
sm_90a, ``flash_attention_varlen``'s dispatch to it, and on an sm_90 GPU at real sizes
against float64 torch and against the mma.sync varlen kernel."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _arrays, attention_varlen
from kaio_ops import _attention_hopper as hopper
from kaio_ops import _attention_hopper_varlen as hv
from tests.poison import poison_allocations
from tests.test_ops_attention_varlen import batch, check_lse, reference, rel

BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates starts as NaN."""
    poison_allocations(monkeypatch)


def small(d: int, causal: bool, **over) -> dict:
    """A small configuration for head dim d: two consumer warpgroups (one for D = 256, to
    keep the simulator quick), 64-key tiles, two stages."""
    wg = 1 if d == 256 else 2
    two = {"WG": wg, "REGS": hopper.consumer_registers(wg)}
    return {**hv.config(d, causal), **two, "BN": 64, "STAGES": 2, **over}


def run_sim(lens_q, lens_k, h, hkv, d, dtype, causal, cfg, scale=None, max_q=None, ctas=None):
    """(out, lse) of ``_attention_hopper_varlen.launch`` in the simulator and the float64
    reference's (out, lse), on random packed inputs; inf in every packed row of k and v past
    the last sequence's keys would be read by nobody, so inf goes into a spare last sequence
    of keys only no query reads (its queries: none)."""
    rng = np.random.default_rng(sum(lens_q) * 3 + sum(lens_k) + d)
    q, k, v, do, cu_q, cu_k = batch(rng, lens_q, lens_k, h, hkv, d, dtype)
    with kaio.simulate():
        args = attention_varlen._check(
            "test", q, k, v, cu_q, cu_k, max_q or max(lens_q), max(lens_k), scale
        )
        (qa, ka, va, cqa, cka), dims, sc = args
        out, lse = hv.launch(qa, ka, va, cqa, cka, dims, causal, sc, cfg, ctas)
    ref_out, ref_lse, *_ = reference(q, k, v, do, cu_q, cu_k, causal, scale)
    return out, lse, ref_out, ref_lse


@pytest.mark.parametrize(
    "lens_q, lens_k, h, hkv, d, dtype, causal, over",
    [
        # an empty and a length-1 sequence, a query tail, 2 query heads a K/V head, causal
        ([70, 0, 1, 33], None, 2, 1, 64, np.float16, True, {"PIPE": 1}),
        # sq != sk causal (bottom-right): more keys (a prefix), fewer keys (rows that see
        # none, a whole tile that sees none), no keys; bf16, FlashAttention-3's order
        ([9, 3, 1, 0, 130, 5], [4, 20, 1, 6, 0, 3], 2, 2, 64, BF16, True, {"PIPE": 3}),
        # sq > sk causal over two key tiles: the first rows see no key in the first tile
        # either (negative shifted rows: the mask's test of the warp's first row signed)
        ([70, 9], [66, 200], 1, 1, 64, np.float16, True, {"PIPE": 1}),
        # D = 128, not causal, sq != sk, several key tiles (more than the stages)
        ([5, 0, 40], [200, 4, 70], 2, 1, 128, np.float16, False, {"PIPE": 1}),
        # D = 256, causal, keys in a partial last tile, the plain order
        ([3, 18], [21, 70], 1, 1, 256, BF16, True, {"PIPE": 0}),
        # three stages, three consumer warpgroups (D = 64's default: 192-row tiles)
        ([100, 1, 270], None, 2, 2, 64, np.float16, False, {"STAGES": 3, "WG": 3, "REGS": 160}),
    ],
)
def test_hopper_varlen_forward_in_simulator(lens_q, lens_k, h, hkv, d, dtype, causal, over):
    lens_k = lens_q if lens_k is None else lens_k
    out, lse, ref_out, ref_lse = run_sim(
        lens_q, lens_k, h, hkv, d, dtype, causal, small(d, causal, **over)
    )
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert rel(out, ref_out) < (1e-3 if dtype == np.float16 else 1e-2)
    check_lse(lse, ref_lse)


@pytest.mark.parametrize(
    "lens_q, lens_k, causal, over, ctas",
    [
        # two blocks over every tile: tiles past a sequence's end skipped, a tile that sees
        # no key (zeros, the pipeline untouched), partial last key tiles (the zeros' barrier
        # in several phases), the ring's stage counted over the tiles
        ([130, 0, 1, 9, 70], [4, 3, 70, 200, 66], True, {"PIPE": 1}, 2),
        # one block for all, the plain order, three stages
        ([70, 1, 100], [100, 1, 64], False, {"PIPE": 0, "STAGES": 3}, 1),
    ],
)
def test_hopper_varlen_persistent_in_simulator(lens_q, lens_k, causal, over, ctas):
    cfg = small(64, causal, PERSIST=1, **over)
    out, lse, ref_out, ref_lse = run_sim(
        lens_q, lens_k, 2, 1, 64, np.float16, causal, cfg, ctas=ctas
    )
    assert rel(out, ref_out) < 1e-3
    check_lse(lse, ref_lse)


def test_hopper_varlen_keys_of_the_next_sequence_are_left_out_in_simulator():
    """The last key tile of sequence 0 reaches into sequence 1's keys, whose V rows hold
    inf: those keys are masked and their V rows zeroed (no NaN); sequence 1's queries see
    none of it (they attend to their own keys, none inf: none of them is kept)."""
    rng = np.random.default_rng(9)
    lens = [40, 30]
    q, k, v, do, cu_q, cu_k = batch(rng, lens, lens, 2, 1, 64, np.float16)
    v[40:] = np.inf
    with kaio.simulate():
        (qa, ka, va, cqa, cka), dims, sc = attention_varlen._check(
            "test", q, k, v, cu_q, cu_k, 40, 40, 0.3
        )
        out, lse = hv.launch(qa, ka, va, cqa, cka, dims, False, sc, small(64, False))
    ref_out, ref_lse, *_ = reference(q[:40], k[:40], v[:40], do[:40], cu_q[:2], cu_k[:2],
                                     False, 0.3)  # fmt: skip
    assert rel(out[:40], ref_out) < 1e-3
    check_lse(lse[:, :40], ref_lse)


def test_hopper_varlen_rows_past_the_max_are_idle_in_simulator():
    """A max_seqlen_q above the longest sequence adds query tiles past every sequence's
    end, which return without writing (outputs as with the exact max, to the bit)."""
    lens = [50, 7]
    cfg = small(64, True)
    out, lse, *_ = run_sim(lens, lens, 1, 1, 64, np.float16, True, cfg)
    more, more_lse, *_ = run_sim(lens, lens, 1, 1, 64, np.float16, True, cfg, max_q=300)
    assert np.array_equal(out.view(np.uint16), more.view(np.uint16))
    assert np.array_equal(lse, more_lse)


def test_dispatch_to_the_hopper_varlen():
    """Whole 64-column head dims with keys on an sm_90 GPU; never in the simulator."""
    assert hv.eligible(64) and hv.eligible(128) and hv.eligible(256)
    assert not hv.eligible(96) and not hv.eligible(72)
    q = np.zeros((8, 2, 128), np.float16)
    cu = np.array([0, 8], np.int32)
    with kaio.simulate():
        (qa, *_), dims, _ = attention_varlen._check("test", q, q, q, cu, cu, 8, 8, None)
        assert not attention_varlen.hopper_takes(qa, qa, dims, False)
    # long enough on average (the packed totals over B): measured faster
    assert hv.worthwhile(1792, 1792, 128, True) and hv.worthwhile(569, 569, 64, False)
    assert hv.worthwhile(300, 300, 128, False) and hv.worthwhile(3336, 3336, 256, True)
    assert not hv.worthwhile(271, 271, 128, True)  # short, causal: the mma.sync kernel
    assert not hv.worthwhile(604, 604, 64, True) and not hv.worthwhile(150, 150, 128, False)
    assert not hv.worthwhile(2000, 100, 128, False)  # few keys a sequence
    assert not hv.worthwhile(2000, 2000, 96, False)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("index", range(len(list(hv.specializations()))))
def test_specializations_assemble_for_sm_90a(index):
    kernel, constexprs = list(hv.specializations())[index]
    ptx = kernel.ptx(arch="sm_90", **constexprs)
    assert ".target sm_90a" in ptx
    if constexprs["DT"] != kaio.f16:  # bf16's kernels: the same code but the wgmma type
        return
    report = assemble(ptx, "sm_90a")
    spills = re.search(r"(\d+) bytes spill stores", report)
    assert spills and spills[1] == "0", (constexprs, report)
    # no wgmma serialized by ptxas (C7508, C7510, C7518: the dense kernel's test)
    assert "C7518" not in report and "C7508" not in report and "C7510" not in report, report


# --------------------------------------------------------------------------- GPU


def _gpu_case(lens_q, lens_k, h, hkv, d, dtype, seed):
    import torch

    from tests.test_ops_attention_varlen import _gpu_batch

    return _gpu_batch(lens_q, lens_k, h, hkv, d, getattr(torch, dtype), seed)


def _sm90():
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


HOPPER_LENGTHS = [1, 0, 777, 1500, 64, 2048, 129, 333, 4000]
HOPPER_OTHER = [7, 3, 777, 1000, 0, 2100, 129, 400, 3000]


@pytest.mark.gpu
@pytest.mark.parametrize("h, hkv, d", [(8, 2, 128), (4, 4, 64), (4, 1, 256)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("same_lengths", [True, False])
def test_gpu_hopper_varlen_against_float64_and_mma_sync(h, hkv, d, causal, dtype, same_lengths):
    """The Hopper varlen kernel (launched directly) against float64 torch per sequence and
    against the mma.sync varlen kernel (``KAIO_HOPPER_ATTENTION=0``'s path)."""
    import torch

    from tests.test_ops_attention_varlen import _rel_t, _torch_reference

    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    lens_q = HOPPER_LENGTHS
    lens_k = lens_q if same_lengths else HOPPER_OTHER
    q, k, v, _, cu_q, cu_k = _gpu_case(lens_q, lens_k, h, hkv, d, dtype, d + h + 7)
    args = (cu_q, cu_k, max(lens_q), max(lens_k))
    (qa, ka, va, cqa, cka), dims, sc = attention_varlen._check("test", q, k, v, *args, None)
    out, lse = hv.launch(qa, ka, va, cqa, cka, dims, causal, sc)
    ref = _torch_reference(q, k, v, lens_q, lens_k, causal)
    tol = 1e-3 if dtype == "float16" else 1e-2
    assert _rel_t(out, ref) < tol
    mma_out, mma_lse = attention_varlen._forward_mma(qa, ka, va, cqa, cka, dims, causal, sc)
    assert _rel_t(out, mma_out.double()) < tol
    seen = torch.isfinite(mma_lse)
    assert torch.equal(seen, torch.isfinite(lse))
    assert (lse[seen] - mma_lse[seen]).abs().max() < 1e-3


@pytest.mark.gpu
def test_gpu_flash_attention_varlen_takes_the_hopper_kernel():
    """On sm_90 ``flash_attention_varlen`` runs the Hopper kernel for D 128 (the same
    outputs as launching it), and ``KAIO_HOPPER_ATTENTION=0`` opts out."""
    import torch

    import kaio_ops

    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    lens = HOPPER_LENGTHS
    q, k, v, _, cu, _ = _gpu_case(lens, lens, 8, 2, 128, "float16", 3)
    (qa, ka, *_), dims, _ = attention_varlen._check("test", q, k, v, cu, cu, 4000, 4000, None)
    assert attention_varlen.hopper_takes(qa, ka, dims, True)
    out = kaio_ops.flash_attention_varlen(q, k, v, cu, cu, 4000, 4000, True)
    (qa, ka, va, cqa, cka), dims, sc = attention_varlen._check(
        "test", q, k, v, cu, cu, 4000, 4000, None
    )
    direct, _ = hv.launch(qa, ka, va, cqa, cka, dims, True, sc)
    assert torch.equal(out, direct)
    assert math.isfinite(float(out.float().abs().max()))
    assert _arrays.gpu(qa).arch == "sm_90"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_hopper_varlen_tiny(causal):
    """A tiny case for compute-sanitizer (memcheck, racecheck, synccheck): empty and length-1
    sequences, sq != sk (rows and a tile that see no key), the last tile of keys and queries
    at the end of the packed arrays, against float64 torch."""

    from tests.test_ops_attention_varlen import _rel_t, _torch_reference

    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    lens_q, lens_k = [1, 0, 70, 200, 5], [1, 3, 90, 60, 0]
    q, k, v, _, cu_q, cu_k = _gpu_case(lens_q, lens_k, 2, 1, 64, "float16", 11)
    args = (cu_q, cu_k, max(lens_q), max(lens_k))
    (qa, ka, va, cqa, cka), dims, sc = attention_varlen._check("test", q, k, v, *args, None)
    out, _ = hv.launch(qa, ka, va, cqa, cka, dims, causal, sc)
    assert _rel_t(out, _torch_reference(q, k, v, lens_q, lens_k, causal)) < 1e-3
