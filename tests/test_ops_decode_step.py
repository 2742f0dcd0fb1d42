"""``kv_cache_append_rope``: the fused rotary embedding and KV cache append of a decode step,
in the simulator against a float64 NumPy reference (both cache layouts, f16 and bf16, the
vector and scalar paths, lengths under Sq and at the capacity), input checks, every shipped
specialization through ptxas, and on a GPU against ``rope`` + ``kv_cache_append``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio.types import f16
from kaio_ops import _plan, decode_step
from tests.poison import poison_allocations
from tests.test_ops_decode import make_cache
from tests.test_plans import fake  # noqa: F401, F811  (the fixture)

BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def poisoned_outputs(request, monkeypatch):
    """Every array an op allocates starts as NaN (not on the plan test's fake GPU)."""
    if "fake" not in request.fixturenames:
        poison_allocations(monkeypatch)


def tables(rng, positions, half, dtype):
    """cos and sin [P, D/2] of random angles."""
    angles = rng.uniform(-np.pi, np.pi, (positions, half))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def reference(qkv, cos, sin, k_cache, v_cache, lens, heads, table):
    """(q, k_cache, v_cache) in float64: rotated q, the caches with the new rows written."""
    b_, sq, width = qkv.shape
    d = k_cache.shape[-1]
    half = d // 2
    hkv = (width // d - heads) // 2
    x = qkv.astype(np.float64).reshape(b_, sq, width // d, d)
    k_want, v_want = k_cache.astype(np.float64), v_cache.astype(np.float64)
    q = np.zeros((b_, heads, sq, d))
    cap = k_cache.shape[2] if table is None else table.shape[1] * k_cache.shape[1]
    for b in range(b_):
        for i in range(sq):
            pos = int(lens[b]) - sq + i
            p = min(max(pos, 0), len(cos) - 1)
            c, s = cos[p].astype(np.float64), sin[p].astype(np.float64)
            a, bb = x[b, i, :, :half], x[b, i, :, half:]
            rot = np.concatenate([a * c - bb * s, bb * c + a * s], axis=-1)
            q[b, :, i] = rot[:heads]
            if not 0 <= pos < cap:
                continue
            new_k, new_v = rot[heads : heads + hkv], x[b, i, heads + hkv :]
            for cache, new in ((k_want, new_k), (v_want, new_v)):
                if table is None:
                    cache[b, :, pos] = new
                else:
                    ps = k_cache.shape[1]
                    cache[table[b, pos // ps], pos % ps] = new
    return q, k_want, v_want


@pytest.mark.parametrize(
    "lens, sq, heads, hkv, d, dtype, page_size, capacity",
    [
        ((5, 24), 3, 4, 2, 16, np.float16, None, 24),  # vector path; a length at the capacity
        ((1, 17, 40), 1, 8, 2, 32, BF16, 16, 48),  # paged, across a page boundary
        ((2, 9), 4, 2, 1, 12, np.float16, None, 16),  # scalar path (D/2 = 6); a length < Sq
        ((33,), 2, 4, 4, 64, BF16, 16, 64),  # group ratio 1, paged
    ],
)
def test_rope_append_in_simulator(lens, sq, heads, hkv, d, dtype, page_size, capacity):
    rng = np.random.default_rng(len(lens) * 7 + d)
    b = len(lens)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, dtype, page_size)
    qkv = rng.standard_normal((b, sq, (heads + 2 * hkv) * d)).astype(dtype)
    cos, sin = tables(rng, capacity + 5, d // 2, dtype)
    lens = np.array(lens, np.int32)
    want_q, want_k, want_v = reference(qkv, cos, sin, k_cache, v_cache, lens, heads, table)
    with kaio.simulate():
        q = kaio_ops.kv_cache_append_rope(k_cache, v_cache, qkv, cos, sin, lens, heads, table)
    tol = 2e-3 if dtype == np.float16 else 1.6e-2  # one rounding of values below ~4
    assert q.shape == (b, heads, sq, d) and q.dtype == qkv.dtype
    assert np.abs(q.astype(np.float64) - want_q).max() < tol * 4
    assert np.abs(k_cache.astype(np.float64) - want_k).max() < tol * 4
    assert np.array_equal(v_cache.astype(np.float64), want_v)  # copied exactly


def _args(**change):
    rng = np.random.default_rng(1)
    k_cache, v_cache, _ = make_cache(rng, 2, 2, 16, 8, np.float16)
    args = dict(
        k_cache=k_cache,
        v_cache=v_cache,
        qkv=np.zeros((2, 1, 6 * 16), np.float16),
        cos=np.ones((8, 8), np.float16),
        sin=np.zeros((8, 8), np.float16),
        seq_lens=np.array([1, 2], np.int32),
        heads=2,
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(heads=3), "argument 'qkv'.*width 96"),
        (dict(cos=np.ones((8, 4), np.float16)), "argument 'cos'.*D/2 = 8"),
        (dict(sin=np.ones((9, 8), np.float16)), "argument 'sin'"),
        (dict(qkv=np.zeros((2, 1, 96), np.float32)), "argument 'qkv'"),
        (dict(seq_lens=np.array([1, 9], np.int32)), "seq_lens\\[1\\] = 9"),
        (dict(seq_lens=np.array([1], np.int32)), "argument 'seq_lens'"),
    ],
)
def test_bad_inputs_raise_before_launch(change, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        kaio_ops.kv_cache_append_rope(**_args(**change))


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_call_plan_replays_what_it_launches(fake, paged):  # noqa: F811
    """The op's call plan replays its one launch with each call's addresses (the caches
    written in place, q a new output each call)."""
    plans = _plan.plans_of(kaio_ops.kv_cache_append_rope)
    outs = []
    for _ in range(2):
        if paged:
            k_cache, v_cache = (fake.array((8, 16, 2, 64), f16) for _ in range(2))
            table = fake.array((2, 4), kaio.i32)
        else:
            k_cache, v_cache = (fake.array((2, 2, 64, 64), f16) for _ in range(2))
            table = None
        qkv = fake.array((2, 1, 12 * 64), f16)
        cos, sin = fake.array((64, 32), f16), fake.array((64, 32), f16)
        lens = fake.array((2,), kaio.i32)
        planned, unplanned, q = fake.run(
            kaio_ops.kv_cache_append_rope, k_cache, v_cache, qkv, cos, sin, lens, 8, table
        )
        assert planned == unplanned and len(planned) == 1
        assert k_cache.ptr.to_bytes(8, "little") in planned[0][5]
        outs.append(q.ptr)
    assert len(plans) == 1 and None not in plans.values() and outs[0] != outs[1]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_specialization_assembles(arch):
    shipped = list(decode_step.shipped())
    assert len(shipped) == 8
    for kernel, constexprs in shipped:
        assemble(kernel.ptx(arch=arch, **constexprs), arch)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16])
def test_gpu_rope_append_equals_rope_then_append(page_size):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    rng = np.random.default_rng(3)
    b, sq, heads, hkv, d, cap = 4, 2, 32, 8, 128, 4096
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, cap, np.float16, page_size)
    kc, vc = (torch.from_numpy(c).cuda() for c in (k_cache, v_cache))
    kc2, vc2 = kc.clone(), vc.clone()
    t = None if table is None else torch.from_numpy(table).cuda()
    qkv = torch.randn(b, sq, (heads + 2 * hkv) * d, device="cuda", dtype=torch.float16)
    cos, sin = (torch.from_numpy(a).cuda() for a in tables(rng, cap, d // 2, np.float16))
    lens = torch.tensor([1 + sq, 700, 2049, cap], device="cuda", dtype=torch.int32)
    q = kaio_ops.kv_cache_append_rope(kc, vc, qkv, cos, sin, lens, heads, t)
    # the same with separate ops: rope over each token's heads, then the append
    pos = (lens[:, None] - sq + torch.arange(sq, device="cuda")).long()  # [B, Sq]
    x = qkv.view(b * sq, heads + 2 * hkv, d)
    c, s = cos[pos.reshape(-1)], sin[pos.reshape(-1)]
    rot = kaio_ops.rope(x[:, : heads + hkv].contiguous(), c, s).view(b, sq, heads + hkv, d)
    want_q = rot[:, :, :heads].transpose(1, 2)
    k = rot[:, :, heads:].transpose(1, 2).contiguous()
    v = x.view(b, sq, -1, d)[:, :, heads + hkv :].transpose(1, 2).contiguous()
    kaio_ops.kv_cache_append(kc2, vc2, k, v, lens, t)
    assert torch.equal(q, want_q)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
