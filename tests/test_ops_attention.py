"""The attention ops: in the simulator against a NumPy float64 reference at small sizes
(hypothesis over the sequence lengths and head dims; key splits; causal masks; grouped-query
heads), the f32 backward against the reference's gradients and finite differences, input
checks, every shipped specialization through ptxas (no register spills for sm_90), and on a
GPU, torch's scaled_dot_product_attention in float64 at real sizes."""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kaio
import kaio_ops
from kaio.ptx.ptxas import find_ptxas
from kaio_ops import attention
from tests.harness import assemble_without_spills, covering
from tests.poison import poison_allocations

SMALL = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates (outputs, partial results, stats) starts as NaN."""
    poison_allocations(monkeypatch)


# --------------------------------------------------------------------------- references


def reference(q, k, v, causal=False, scale=None):
    """(out, lse, p) of attention in float64; q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv]
    (k and v broadcast over grouped heads by the caller)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    sq, d = q.shape[-2:]
    sk = k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(d) if scale is None else scale)
    if causal:
        s = np.where(np.tril(np.ones((sq, sk), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    p = e / total
    return p @ v, (m + np.log(total))[..., 0], p


def reference_grads(q, k, v, do, causal=False, group=1):
    """(dq, dk, dv) of attention in float64, from the reference's softmax; q, do
    [..., H, S, D], k, v [..., H / group, Sk, D] (dk, dv summed over each group's heads)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    if group > 1:
        k, v = (np.repeat(x, group, -3) for x in (k, v))
    o, _, p = reference(q, k, v, causal)
    scale = 1 / math.sqrt(q.shape[-1])
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    dq = ds @ k * scale
    dk, dv = np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ do
    if group > 1:
        shape = (*k.shape[:-3], k.shape[-3] // group, group, *k.shape[-2:])
        dk, dv = (x.reshape(shape).sum(-3) for x in (dk, dv))
    return dq, dk, dv


def finite_differences(q, k, v, do, causal, h=1e-6):
    """d(sum(out * do)) / d(q, k, v) by central differences of the float64 reference."""
    args = [np.asarray(x, np.float64).copy() for x in (q, k, v)]
    grads = []
    for a in args:
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            keep = a[idx]
            a[idx] = keep + h
            up = (reference(*args, causal)[0] * do).sum()
            a[idx] = keep - h
            down = (reference(*args, causal)[0] * do).sum()
            a[idx] = keep
            g[idx] = (up - down) / (2 * h)
        grads.append(g)
    return grads


def rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "NaN or inf: an element was not written"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- f32 flash


@SMALL
@given(
    s=st.integers(1, 80),
    d=st.integers(8, 64),
    causal=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_attention_flash_in_simulator(s, d, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (randn(rng, (s, d)) for _ in range(3))
    op = kaio_ops.attention_flash_causal if causal else kaio_ops.attention_flash
    with kaio.simulate():
        out = op(q, k, v)
    assert out.dtype == np.float32
    assert rel(out, reference(q, k, v, causal)[0]) < 2e-6


@pytest.mark.parametrize(
    "s, d, causal, splits",
    [
        (130, 40, True, 3),  # splits past the diagonal hold no valid key: lse -inf, zeros
        (70, 72, False, 2),  # D = 72 > 64: the 128-wide specialization, two key splits
        (33, 13, True, 1),  # odd D: element loads, no split
        (40, 136, True, 2),  # D 136: the 256-wide specialization (on the SIMT cores)
    ],
)
def test_attention_flash_stats_and_splits_in_simulator(s, d, causal, splits):
    rng = np.random.default_rng(s * d)
    q, k, v = (randn(rng, (s, d)) for _ in range(3))
    with kaio.simulate():
        out, lse = attention.flash_forward("test", q, k, v, causal, splits)
        out2, lse2 = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
    ref, ref_lse, _ = reference(q, k, v, causal)
    assert rel(out, ref) < 2e-6
    assert np.abs(lse - ref_lse).max() < 1e-5
    assert rel(out2, ref) < 2e-6 and np.abs(lse2 - ref_lse).max() < 1e-5


def test_split_heuristic_fills_the_gpu():
    assert attention.splits_for(64, 64, 1, 132) == 2  # S = 4096: 128 blocks on 132 SMs
    assert attention.splits_for(1000, 1000, 1, 132) == 1
    assert attention.splits_for(1, 2, 1, 132) == 2
    assert attention.splits_for(2, 100, 1, 132) == 15  # 30 blocks of 7 tiles
    # causal: the blocks' schedule (the heaviest query tiles first, as launched)
    assert attention.causal_splits(128, 128, 132) == 2  # S 8192: 256 blocks, 2 waves even
    assert attention.causal_splits(64, 64, 132) == 11
    assert attention.causal_splits(300, 300, 132) == 1  # more than two waves of tiles
    assert attention.causal_splits(1, 1, 132) == 1


@pytest.mark.parametrize(
    "s, dp, causal, ds",
    [
        (4096, 128, False, True),
        (4096, 128, True, True),
        (1000, 256, True, False),
        (200, 64, False, False),
    ],
)
def test_bwd_shares_cover_each_step_once_in_equal_shares(s, dp, causal, ds):
    """``bwd_shares``: every (kind, tile, step) in exactly one item, the shares of each plan
    within two steps' cost of each other, each tile's pieces in consecutive slots in step
    order (``starts``), dK slots then dV then dQ."""
    plan = attention.bwd_shares(s, dp, causal, 132, ds)
    rows = 16 * attention.simt.bwd_cols(dp)  # of the dK/dV steps' query tiles, dQ's key tiles
    tiles, inner = -(-s // 64), -(-s // rows)
    seen = {}
    for table, per_block in zip(plan.tables, plan.per_block, strict=True):
        costs = []
        for b in range(len(table) // per_block):
            items = [r for r in table[b * per_block : (b + 1) * per_block] if r[0] >= 0]
            costs.append(0)
            for kind, tile, t0, t1, slot in items:
                cost = attention.F32_STEP_COST[0 if kind == 0 else 2 if ds else 1]
                costs[-1] += (t1 - t0) * cost
                for t in range(t0, t1):
                    assert (kind, tile, t) not in seen
                    seen[kind, tile, t] = slot
        assert max(costs) - min(costs) <= 2 * max(attention.F32_STEP_COST)  # (a step an end)
    for tile in range(tiles):
        first = tile * 64 // rows if causal else 0
        n_dq = min(inner, -(-(tile * 64 + 64) // rows)) if causal else inner
        if ds:  # (64-key tiles)
            n_dq = min(tiles, tile + 1) if causal else tiles
        for kind, steps, at in ((0, range(first, inner), tiles + 1), (1, range(n_dq), 0)):
            slots = [seen.pop((kind, tile, t)) for t in steps]
            assert slots == sorted(slots) and slots[0] == plan.starts[at + tile]
            assert slots[-1] == plan.starts[at + tile + 1] - 1
    assert not seen and plan.starts[0] == 2 * plan.dk_slots and plan.starts[tiles + 1] == 0
    assert plan.slots == plan.starts[tiles] and plan.starts[2 * tiles + 1] == plan.dk_slots


def test_attention_flash_bwd_against_finite_differences_in_simulator():
    rng = np.random.default_rng(7)
    s, d = 6, 8
    q, k, v, do = (randn(rng, (s, d)) for _ in range(4))
    for causal in (False, True):
        bwd = kaio_ops.attention_flash_bwd_causal if causal else kaio_ops.attention_flash_bwd
        with kaio.simulate():
            o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
            grads = bwd(do, q, k, v, o, lse)
        expected = finite_differences(q, k, v, do, causal)
        for name, g, fd in zip("qkv", grads, expected, strict=True):
            assert rel(g, fd) < 1e-5, name


@pytest.mark.parametrize(
    "s, d, causal, sms, ds",
    [
        (70, 24, True, 132, True),  # DP 64, dS stored (a triangle of blocks)
        (5, 136, False, 132, True),  # DP 256
        # shares of several items, tiles in pieces over blocks (bwd_shares); dQ recomputed
        (70, 24, True, 5, False),
        (130, 24, False, 2, True),  # the same in both plans, dQ from dS
        (66, 100, True, 132, True),  # DP 128 (the tensor cores' widest), dQ from dS
    ],
)
def test_attention_flash_bwd_in_simulator(s, d, causal, sms, ds, monkeypatch):
    monkeypatch.setattr(attention._arrays, "multiprocessors", lambda like: sms)
    if not ds:
        monkeypatch.setattr(attention, "F32_DS_BYTES", 0)
    if sms < 10:  # more slots than tiles (pieces) of each kind, several items a block
        plan = attention.bwd_shares(s, 64, causal, sms, ds)
        tiles = -(-s // 64)
        assert min(plan.per_block) > 1 and plan.dk_slots > tiles
        assert plan.slots - 2 * plan.dk_slots > tiles
    rng = np.random.default_rng(s + d)
    q, k, v, do = (randn(rng, (s, d)) for _ in range(4))
    bwd = kaio_ops.attention_flash_bwd_causal if causal else kaio_ops.attention_flash_bwd
    with kaio.simulate():
        o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
        grads = bwd(do, q, k, v, o, lse)
    for name, g, r in zip("qkv", grads, reference_grads(q, k, v, do, causal), strict=True):
        assert rel(g, r) < 1e-5, name


def test_reference_grads_match_finite_differences():
    rng = np.random.default_rng(3)
    q, k, v, do = (randn(rng, (5, 8)) for _ in range(4))
    for causal in (False, True):
        for g, fd in zip(
            reference_grads(q, k, v, do, causal),
            finite_differences(q, k, v, do, causal),
            strict=True,
        ):
            assert rel(g, fd) < 1e-7


# --------------------------------------------------------------------------- tensor cores


@SMALL
@given(
    sq=st.integers(1, 80),
    sk=st.integers(1, 80),
    d=st.integers(8, 64),
    dv=st.integers(8, 64),
    causal=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_attention_tc_in_simulator(sq, sk, d, dv, causal, seed):
    rng = np.random.default_rng(seed)
    q, k = randn(rng, (sq, d), np.float16), randn(rng, (sk, d), np.float16)
    v = randn(rng, (sk, dv), np.float16)
    op = kaio_ops.attention_tc_causal if causal else kaio_ops.attention_tc
    with kaio.simulate():
        out = op(q, k, v)
    assert out.dtype == np.float32 and out.shape == (sq, dv)
    # P is rounded to f16 for the tensor cores: about 2^-11 relative
    assert rel(out, reference(q, k, v, causal)[0]) < 1e-3


@pytest.mark.parametrize(
    "b, h, hkv, s, d, dtype, causal, scale",
    [
        (2, 4, 2, 40, 64, np.float16, True, None),  # grouped-query, causal
        (1, 2, 1, 70, 32, ml_dtypes.bfloat16, False, 0.3),  # multi-query, bf16, a scale
        (1, 1, 1, 20, 136, np.float16, True, None),  # D = 136: the 256-wide kernel
    ],
)
def test_flash_attention_in_simulator(b, h, hkv, s, d, dtype, causal, scale):
    rng = np.random.default_rng(s + d)
    q = randn(rng, (b, h, s, d), dtype)
    k, v = (randn(rng, (b, hkv, s, d), dtype) for _ in range(2))
    with kaio.simulate():
        out = kaio_ops.flash_attention(q, k, v, causal=causal, scale=scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    group = h // hkv
    ref = reference(q, np.repeat(k, group, 1), np.repeat(v, group, 1), causal, scale)[0]
    assert rel(out, ref) < (1e-3 if dtype == np.float16 else 1e-2)


@pytest.mark.parametrize(
    "b, h, hkv, s, d, dtype, causal",
    [
        (1, 2, 1, 40, 64, np.float16, True),  # grouped heads: dK, dV summed over 2 heads
        (2, 2, 1, 20, 128, ml_dtypes.bfloat16, False),  # D = 128, K/V re-read each tile
        # D > 128: dQ from 128-column A fragments, dK and dV from one launch each
        (1, 4, 2, 33, 256, np.float16, True),  # grouped heads, causal, a partial tile
        (2, 1, 1, 17, 200, ml_dtypes.bfloat16, False),  # D = 200 padded to 256
        (1, 2, 2, 3, 136, np.float16, True),  # D = 136, three rows
    ],
)
def test_flash_attention_bwd_in_simulator(b, h, hkv, s, d, dtype, causal):
    rng = np.random.default_rng(s + d)
    q, do = (randn(rng, (b, h, s, d), dtype) for _ in range(2))
    k, v = (randn(rng, (b, hkv, s, d), dtype) for _ in range(2))
    with kaio.simulate():
        o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
        grads = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal=causal)
    group = h // hkv
    _, ref_lse, _ = reference(q, np.repeat(k, group, 1), np.repeat(v, group, 1), causal)
    assert lse.shape == (b, h, s) and np.abs(lse - ref_lse).max() < 1e-3
    tol = 2e-3 if dtype == np.float16 else 1e-2  # P and dS rounded to 16 bits for the mma
    for name, g, r in zip("qkv", grads, reference_grads(q, k, v, do, causal, group), strict=True):
        assert g.dtype == q.dtype and rel(g, r) < tol, name


# --------------------------------------------------------------------------- input checks


def _f32(*shape):
    return np.ones(shape, np.float32)


def _f16(*shape):
    return np.ones(shape, np.float16)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: kaio_ops.attention_flash(_f32(4, 8), _f32(5, 8), _f32(4, 8)),
            "'k' must have shape",
        ),
        (lambda: kaio_ops.attention_flash(_f32(4, 300), _f32(4, 300), _f32(4, 300)), "D = 300"),
        (lambda: kaio_ops.attention_flash(_f16(4, 8), _f32(4, 8), _f32(4, 8)), "'q' must be a 2-D"),
        (lambda: kaio_ops.attention_flash(_f32(0, 8), _f32(0, 8), _f32(0, 8)), "empty dimension"),
        (
            lambda: kaio_ops.attention_flash_bwd(*[_f32(4, 8)] * 5, _f32(5)),
            "'lse' must have shape \\(4,\\)",
        ),
        (lambda: kaio_ops.attention_tc(_f16(4, 8), _f16(5, 9), _f16(5, 8)), "'k' must have D = 8"),
        (lambda: kaio_ops.attention_tc(_f16(4, 8), _f16(5, 8), _f16(6, 8)), "'v' must have Sk = 5"),
        (lambda: kaio_ops.attention_tc(_f16(4, 8), _f16(5, 8), _f16(5, 257)), "'v' has 257"),
        (
            lambda: kaio_ops.flash_attention(
                _f16(1, 4, 8, 64), _f16(1, 3, 8, 64), _f16(1, 3, 8, 64)
            ),
            "Hkv = 3 heads, which must divide q's H = 4",
        ),
        (
            lambda: kaio_ops.flash_attention(
                _f16(1, 4, 8, 60), _f16(1, 4, 8, 60), _f16(1, 4, 8, 60)
            ),
            "head dim D = 60",
        ),
        (
            lambda: kaio_ops.flash_attention_bwd(*[_f16(1, 2, 8, 264)] * 5, _f32(1, 2, 8)),
            "head dim D = 264; flash_attention_bwd takes multiples of 8 up to 256",
        ),
        (
            lambda: kaio_ops.flash_attention(
                _f16(1, 4, 8, 64), _f16(2, 4, 8, 64), _f16(2, 4, 8, 64)
            ),
            "batch B = 1",
        ),
        (
            lambda: kaio_ops.flash_attention(
                _f16(1, 4, 8, 64), _f16(1, 4, 8, 64), _f16(1, 4, 9, 64)
            ),
            "'v' must have shape",
        ),
        (
            lambda: kaio_ops.flash_attention(
                _f16(1, 1, 8, 64), _f16(1, 1, 8, 64), _f16(1, 1, 8, 64), scale=-1.0
            ),
            "scale must be a positive",
        ),
    ],
)
def test_bad_inputs_name_the_dimension(call, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        call()


def test_numpy_outside_simulate_names_both_ways_out():
    x = _f32(4, 8)
    with pytest.raises(ValueError, match="kaio.to_device.*kaio.simulate|kaio.simulate.*to_device"):
        kaio_ops.attention_flash(x, x, x)


def _assemble_shipped(index: int) -> None:
    assemble_without_spills(*list(attention.shipped())[index])


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_every_shipped_specialization_assembles():
    kept = covering(list(attention.shipped()))
    # emitting the PTX is Python: processes, not threads, run it (and ptxas) in parallel
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(_assemble_shipped, kept))


# --------------------------------------------------------------------------- GPU


# Under compute-sanitizer (docs/testing.md) KAIO_SANITIZER_SHAPES=1 runs the GPU tests below
# at small shapes: racecheck tracks every shared-memory access, and at the sizes given the
# attention tests alone take more than half an hour under it. Every kernel specialization
# still runs (head dims, dtypes, masks, head groups and sequence tails are kept); the batch,
# the number of heads and the longest sequences shrink.
SANITIZER_SHAPES = os.environ.get("KAIO_SANITIZER_SHAPES") == "1"


def _gpu_seq(s: int) -> int:
    """A GPU test's sequence length: ``s``, or 520 (eight 64-row tiles and a tail) for
    sequences over 1100 under KAIO_SANITIZER_SHAPES=1."""
    return 520 if SANITIZER_SHAPES and s > 1100 else s


def _gpu_heads(b: int, h: int, hkv: int) -> tuple[int, int, int]:
    """A GPU test's (batch, heads, kv heads): as given, or one batch with at most two kv
    heads (the group size kept) under KAIO_SANITIZER_SHAPES=1."""
    if not SANITIZER_SHAPES:
        return b, h, hkv
    f = hkv // min(hkv, 2)
    return 1, h // f, hkv // f


def _torch(shape, dtype, gen):
    import torch

    return torch.randn(shape, device="cuda", dtype=dtype, generator=gen)


def _sdpa64(q, k, v, causal, scale=None, group=1):
    import torch

    if group > 1:
        k, v = (x.repeat_interleave(group, dim=-3) for x in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, scale=scale
    )


def _rel_t(out, ref) -> float:
    import torch

    assert torch.isfinite(out).all()
    return (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("s, d", [(4096, 128), (8192, 64), (1000, 200), (77, 13)])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_flash_against_sdpa(s, d, causal):
    import torch

    s = _gpu_seq(s)
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v = (_torch((s, d), torch.float32, gen) for _ in range(3))
    out, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
    ref = _sdpa64(q[None], k[None], v[None], causal)[0]
    assert _rel_t(out, ref) < 1e-5
    scores = (q.double() @ k.double().T) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, device="cuda").triu(1).bool(), -math.inf)
    assert (lse.double() - torch.logsumexp(scores, -1)).abs().max().item() < 1e-4
    assert torch.equal(kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)[0], out)


@pytest.mark.gpu
@pytest.mark.parametrize("s, d, causal", [(2048, 128, False), (2048, 64, True), (300, 200, True)])
def test_gpu_attention_flash_bwd_against_autograd(s, d, causal):
    import torch

    s = _gpu_seq(s)
    gen = torch.Generator(device="cuda").manual_seed(s)
    q, k, v, do = (_torch((s, d), torch.float32, gen) for _ in range(4))
    o, lse = kaio_ops.attention_flash_with_stats(q, k, v, causal=causal)
    bwd = kaio_ops.attention_flash_bwd_causal if causal else kaio_ops.attention_flash_bwd
    grads = bwd(do, q, k, v, o, lse)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref = _sdpa64(q64[None], k64[None], v64[None], causal)[0]
    ref.backward(do.double())
    for g, r in zip(grads, (q64.grad, k64.grad, v64.grad), strict=True):
        assert _rel_t(g, r) < 1e-5
    assert all(torch.equal(a, b) for a, b in zip(bwd(do, q, k, v, o, lse), grads, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "sq, sk, d, dv", [(512, 512, 64, 64), (100, 3000, 128, 96), (257, 64, 40, 24)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_tc_against_sdpa(sq, sk, d, dv, causal):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(sq + sk)
    q, k = _torch((sq, d), torch.float16, gen), _torch((sk, d), torch.float16, gen)
    v = _torch((sk, dv), torch.float16, gen)
    op = kaio_ops.attention_tc_causal if causal else kaio_ops.attention_tc
    out = op(q, k, v)
    assert out.dtype == torch.float32
    assert _rel_t(out, _sdpa64(q[None], k[None], v[None], causal)[0]) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b, h, hkv, s, d",
    [(4, 16, 16, 4096, 128), (1, 8, 2, 8192, 64), (2, 4, 1, 1000, 256), (2, 6, 3, 333, 96)],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_flash_attention_against_sdpa(b, h, hkv, s, d, causal, dtype):
    import torch

    (b, h, hkv), s = _gpu_heads(b, h, hkv), _gpu_seq(s)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(s + d)
    q = _torch((b, h, s, d), dt, gen)
    k, v = (_torch((b, hkv, s, d), dt, gen) for _ in range(2))
    out = kaio_ops.flash_attention(q, k, v, causal=causal)
    assert out.dtype == dt and out.shape == q.shape
    ref = _sdpa64(q, k, v, causal, group=h // hkv)
    assert _rel_t(out, ref) < (1e-3 if dtype == "float16" else 1e-2)
    assert torch.equal(kaio_ops.flash_attention(q, k, v, causal=causal), out)


@pytest.mark.gpu
def test_gpu_device_array_inputs():
    rng = np.random.default_rng(1)
    q, k, v = (randn(rng, (100, 32)) for _ in range(3))
    out = kaio_ops.attention_flash(*(kaio.to_device(x) for x in (q, k, v)))
    assert isinstance(out, kaio.DeviceArray)
    assert rel(out.numpy(), reference(q, k, v)[0]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b, h, hkv, s, d",
    [
        (4, 16, 16, 2048, 128),
        (2, 8, 2, 1024, 64),  # sm_90: the ordered kernel (prep's delta, dQ converted behind)
        (2, 8, 2, 1000, 64),
        (1, 4, 1, 333, 96),
        (2, 8, 2, 2048, 256),  # D > 128: dK and dV from one launch each
        (1, 4, 4, 1031, 200),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_flash_attention_bwd_against_autograd(b, h, hkv, s, d, causal, dtype):
    import torch

    (b, h, hkv), s = _gpu_heads(b, h, hkv), _gpu_seq(s)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(s + d + 1)
    q, do = (_torch((b, h, s, d), dt, gen) for _ in range(2))
    k, v = (_torch((b, hkv, s, d), dt, gen) for _ in range(2))
    o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
    grads = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal=causal)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    _sdpa64(*leaves, causal, group=h // hkv).backward(do.double())
    tol = 5e-3 if dtype == "float16" else 3e-2
    for g, leaf in zip(grads, leaves, strict=True):
        assert g.dtype == dt and _rel_t(g, leaf.grad) < tol
    again = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal=causal)
    assert all(torch.equal(x, y) for x, y in zip(again, grads, strict=True))
