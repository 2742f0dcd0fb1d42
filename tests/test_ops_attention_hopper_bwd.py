"""The Hopper flash-attention backward (``kaio_ops._attention_hopper_bwd``: TMA, mbarriers, a
producer warpgroup, wgmma with P^T and dS from registers; the fused kernel's dQ by atomics
and the deterministic pair) in the simulator against NumPy
float64 gradients at small sizes (both head dims, f16 and bf16, causal and not,
grouped-query heads, Sq != Sk, partial tiles of queries and keys; the race detector on), its
PTX through ptxas for sm_90a (no spills, no serialized wgmma), and on an sm_90 GPU
``flash_attention_bwd``'s dispatch to it against float64 autograd."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import find_ptxas
from kaio.types import f32
from kaio_ops import _arrays, attention
from kaio_ops import _attention_hopper_bwd as hopper_bwd
from tests.harness import assemble_wgmma
from tests.poison import poison_allocations
from tests.test_ops_attention import reference, reference_grads, rel


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates starts as NaN."""
    poison_allocations(monkeypatch)


def small(wg: int, pipe: int, areg: int = 0, dq: int = 0, late: int = 0) -> dict:
    """A small configuration of the kernels: ``wg`` consumer warpgroups, 64-row tiles, two
    ring stages (so that the ring wraps), schedule ``pipe``, A fragments of the tiles loaded
    once in registers where ``areg`` (and then the dK/dV kernel's lse and delta read from
    global memory, not copied by TMA); the fused kernel's dQ split ``dq`` and ``late`` (its
    PIPE 0)."""
    base = {"WG": wg, "STAGES": 2, "PIPE": pipe, "AREG": areg, "REGS": 0 if wg == 1 else 240}
    dkdv = {"BM": 64, "TSTATS": 1 - areg, **base, "DQ": 0, "LATE": 0}
    fused = {**dkdv, "PIPE": 0, "DQ": dq, "LATE": late}
    return {"dkdv": dkdv, "dq": {"BN": 64, **base, "PIPE": min(pipe, 1)}, "fused": fused}


def simulated_grads(launch, b, h, hkv, sq, sk, d, dtype, causal, with_o=False):
    """(dq, dk, dv) of ``launch(qa, ka, va, da, la, delta, dims, causal, scale)`` (a Hopper
    backward's) in the simulator on random inputs, and the float64 reference gradients. o
    and lse are the float64 forward's (o rounded to the input type, as the forward returns
    it). ``with_o``: the launch is given ``o=`` and a poisoned delta to write."""
    rng = np.random.default_rng(sq * 7 + sk + d)
    q, do = (rng.standard_normal((b, h, sq, d)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal((b, hkv, sk, d)).astype(dtype) for _ in range(2))
    g = h // hkv
    o, lse, _ = reference(q, np.repeat(k, g, 1), np.repeat(v, g, 1), causal)
    o, lse = o.astype(dtype), lse.astype(np.float32)
    delta = (o.astype(np.float32) * do.astype(np.float32)).sum(-1).reshape(-1)
    with kaio.simulate():
        inputs = _arrays.Inputs("test")
        (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, None, inputs)
        da = inputs.array(do, "do", ndim=4)
        la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
        given = {"o": inputs.array(o, "o", ndim=4)} if with_o else {}
        if with_o:
            delta = np.full_like(delta, np.nan)
        grads = launch(qa, ka, va, da, la, delta, dims, causal, scale, **given)
    return grads, reference_grads(q, k, v, do, causal, g)


def run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg, fused=False, with_o=False):
    """``simulated_grads`` of ``_attention_hopper_bwd.launch`` with ``cfg``."""

    def launch(*args, **keywords):
        return hopper_bwd.launch(*args, cfg, fused=fused, **keywords)

    return simulated_grads(launch, b, h, hkv, sq, sk, d, dtype, causal, with_o)


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d, dtype, causal, wg, pipe, areg",
    [
        # one consumer warpgroup, whole tiles, each product waited for
        (1, 1, 1, 128, 128, 64, np.float16, False, 1, 0, 0),
        # grouped-query (dK, dV summed over two heads), Sq > Sk, causal, bf16, pipelined,
        # K, V (Q, dO) fragments in registers
        (1, 2, 1, 256, 192, 64, ml_dtypes.bfloat16, True, 1, 1, 1),
        # two warpgroups, partial query tiles, grouped-query, Sq < Sk, causal
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 1, 0),
        # D = 128, a query tail, keys past the last query (causal: zero dK, dV)
        (1, 1, 1, 100, 384, 128, np.float16, True, 2, 0, 0),
        # D = 128, bf16, more tiles than stages, Sq > Sk with a partial key tile
        (1, 1, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 1, 1),
        # dK/dV with P^T and dS^T (PIPE 2), resp. dS^T (3), through shared memory:
        # grouped-query, partial query tiles, causal, Sq < Sk; D 128 bf16, a partial key tile
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 2, 0),
        (1, 2, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 3, 0),
        (1, 1, 1, 100, 384, 128, np.float16, True, 2, 2, 0),
        # three consumer warpgroups (192 keys, resp. query rows, a block): partial tiles,
        # grouped-query, causal
        (1, 2, 1, 200, 256, 64, np.float16, True, 3, 0, 0),
    ],
)
def test_hopper_backward_in_simulator(b, h, hkv, sq, sk, d, dtype, causal, wg, pipe, areg):
    cfg = small(wg, pipe, areg)
    check_grads(*run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg), dtype)


def check_grads(grads, refs, dtype) -> None:
    """dq, dk, dv of the input type and shapes within the tolerance of P and dS rounded to
    the input type."""
    tol = 1e-3 if dtype == np.float16 else 1e-2
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert g.dtype == dtype and g.shape == r.shape, name
        assert rel(g, r) < tol, (name, rel(g, r))


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d, dtype, causal, wg, dq, late",
    [
        # one consumer warpgroup, each its keys' dQ over every column
        (1, 1, 1, 128, 128, 64, np.float16, False, 1, 1, 0),
        # grouped-query, partial query tiles, Sq < Sk, causal; dQ's 32 columns a warpgroup,
        # its product run with the next tile's
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 2, 1),
        # D = 128, a query tail, keys past the last query; 64 columns a warpgroup
        (1, 1, 1, 100, 384, 128, np.float16, True, 2, 2, 0),
        # D = 128, bf16, grouped-query, more tiles than stages, Sq > Sk, a partial key tile
        # whose rows past Sk are the next batch's keys (their dS must not reach dQ)
        (2, 2, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 1, 1),
        # dQ through shared memory and the writer warps (atomics, bulk reductions):
        # grouped-query, partial query tiles, causal (D 64), more tiles than stages, a
        # partial key tile (D 128, bf16), two batches
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 3, 0),
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 4, 0),  # bulk reductions
        (1, 2, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 3, 0),
        (2, 1, 1, 100, 384, 128, np.float16, True, 2, 4, 0),
        # each tile's dQ in one bulk reduction to a tile-ordered buffer (DQ 5): partial query
        # tiles, grouped-query, causal; D 128 bf16 with a partial key tile, two batches
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 5, 0),
        (2, 2, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 5, 0),
        # each tile's dQ product behind the next tile's dV, dK (three dS^T buffers), or
        # with the next tile's S^T, dP^T, with and without the writer warps
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 2, 2),
        (2, 2, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 2, 2),
        (1, 2, 1, 152, 256, 64, np.float16, True, 2, 4, 2),
        (1, 1, 1, 256, 256, 64, np.float16, True, 2, 3, 1),
    ],
)
def test_fused_backward_in_simulator(
    b, h, hkv, sq, sk, d, dtype, causal, wg, dq, late, monkeypatch
):  # fmt: skip
    """The fused kernel: dK, dV and dQ (atomics) from one kernel. With the writer warps and
    a late dQ, one block a simulator batch: blocks with different tile counts (causal) in
    one lockstep batch made the simulator report a deadlock (the waits of each block alone
    have none; with one block a batch the results are right)."""
    if dq > 2 and late:
        from kaio.sim import launcher

        run = launcher.simulate
        monkeypatch.setattr(launcher, "simulate", lambda *a, **k: run(*a, **k, batch_lanes=384))
    cfg = small(wg, 0, 0, dq, late)
    check_grads(*run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg, True), dtype)


def test_dispatch_needs_whole_tiles_and_a_gpu():
    assert hopper_bwd.eligible(64) and hopper_bwd.eligible(128)
    assert not hopper_bwd.eligible(256) and not hopper_bwd.eligible(96)
    with kaio.simulate():  # never under the simulator: its tests launch the kernels directly
        q = np.zeros((1, 1, 1024, 128), np.float16)
        (qa, _, _), dims, _ = attention._check_flash("test", q, q, q, None)
        assert not attention.hopper_takes(qa, dims, hopper_bwd)
    assert hopper_bwd.worthwhile(16, 4096, 4096, 128, 132)
    assert not hopper_bwd.worthwhile(16, 4096, 4000, 128, 132)  # a partial key tile
    assert not hopper_bwd.worthwhile(16, 4096, 4096, 256, 132)  # D = 256: not eligible


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("index", range(len(list(hopper_bwd.specializations()))))
def test_specializations_assemble_for_sm_90a(index):
    assemble_wgmma(*list(hopper_bwd.specializations())[index])


def test_other_targets_are_compile_errors():
    for kernel, constexprs in list(hopper_bwd.specializations())[:2]:
        with pytest.raises(kaio.CompileError, match="needs sm_90"):
            kernel.ptx(arch="sm_80", **constexprs)


# --------------------------------------------------------------------------- GPU


def _hopper_gpu() -> bool:
    return kaio.gpu_available() and kaio.device().arch == "sm_90"


@pytest.mark.gpu
@pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d", [(2, 8, 8, 2048, 2048, 128), (2, 8, 2, 1024, 2048, 64)]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_flash_attention_bwd_takes_the_hopper_kernels(b, h, hkv, sq, sk, d, causal, dtype):
    import torch

    from tests.test_ops_attention import _rel_t, _sdpa64

    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(sq + d)
    q, do = (torch.randn((b, h, sq, d), device="cuda", dtype=dt, generator=gen) for _ in "qo")
    k, v = (torch.randn((b, hkv, sk, d), device="cuda", dtype=dt, generator=gen) for _ in "kv")
    (qa, _, _), dims, _ = attention._check_flash("test", q, k, v, None)
    assert attention.hopper_takes(qa, dims, hopper_bwd)
    o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    _sdpa64(*leaves, causal, group=h // hkv).backward(do.double())
    tol = 5e-3 if dtype == "float16" else 3e-2
    for fixed in (False, True):  # the fused kernel (dQ by atomics), the deterministic pair
        grads = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal, None, fixed)
        for g, leaf in zip(grads, leaves, strict=True):
            assert g.dtype == dt and _rel_t(g, leaf.grad) < tol
    again = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal, None, True)
    assert all(torch.equal(x, y) for x, y in zip(again, grads, strict=True))


def _dq3(d: int) -> dict:
    """The dQ kernel with three consumer warpgroups (192 query rows a block)."""
    return {"WG": 3, "REGS": 160, "STAGES": 3 if d == 128 else 4, "PIPE": 0 if d == 128 else 1}


VARIANTS = {  # name: (overrides of config(d) for head dim d, launch's keywords)
    "pair, dQ beside": (lambda d: {}, {"side": True, "deterministic": True}),
    "dK/dV PIPE 2": (
        lambda d: {"dkdv": {"PIPE": 2, "STAGES": 3 if d == 128 else 4}},
        {"deterministic": True},
    ),
    "dK/dV PIPE 3": (lambda d: {"dkdv": {"PIPE": 3, "STAGES": 4}}, {"deterministic": True}),
    "dQ 3 warpgroups": (lambda d: {"dq": _dq3(d)}, {"deterministic": True}),
    "fused DQ 5": (lambda d: {"fused": {"DQ": 5}}, {"fused": True}),
}


@pytest.mark.gpu
@pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("d, causal", [(128, True), (64, False)])
def test_gpu_backward_variants(name, d, causal):
    """Each variant that ``config`` or ``launch`` can select against float64 autograd
    (grouped-query heads, Sq < Sk, a partial query tile) and, where deterministic, the same
    bits on a second run."""
    import torch

    from tests.test_ops_attention import _rel_t, _sdpa64

    b, h, hkv, sq, sk = 1, 4, 2, 1000, 1280
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, do = (torch.randn((b, h, sq, d), device="cuda", dtype=torch.float16, generator=gen)
             for _ in "qo")  # fmt: skip
    k, v = (torch.randn((b, hkv, sk, d), device="cuda", dtype=torch.float16, generator=gen)
            for _ in "kv")  # fmt: skip
    o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    _sdpa64(*leaves, causal, group=h // hkv).backward(do.double())
    over, keywords = VARIANTS[name]
    over = over(d)
    base = hopper_bwd.config(d)
    cfg = {key: {**base[key], **over.get(key, {})} for key in base}
    inputs = _arrays.Inputs("test")
    (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, None, inputs)
    da = inputs.array(do, "do", ndim=4)
    la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
    delta = (o.float() * do.float()).sum(-1).reshape(-1)

    def run():
        grads = hopper_bwd.launch(qa, ka, va, da, la, delta, dims, causal, scale, cfg,
                                  **keywords)  # fmt: skip
        torch.cuda.synchronize()
        return grads

    grads = run()
    for g, leaf in zip(grads, leaves, strict=True):
        assert _rel_t(g, leaf.grad) < 5e-3, (name, _rel_t(g, leaf.grad))
    if keywords.get("deterministic"):
        assert all(torch.equal(x, y) for x, y in zip(run(), grads, strict=True))


def test_launch_refuses_what_the_kernels_do_not_take():
    """lse and delta are copied by TMA from query row bh * Sq on: Sq must be a multiple of 4;
    and only D 64 and 128 have kernels."""
    q = np.zeros((1, 1, 150, 64), np.float16)
    lse = np.zeros((1, 1, 150), np.float32)
    with kaio.simulate():
        inputs = _arrays.Inputs("test")
        (qa, ka, va), dims, scale = attention._check_flash("test", q, q, q, None, inputs)
        la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
        with pytest.raises(ValueError, match="Sq a multiple of 4"):
            hopper_bwd.launch(qa, ka, va, qa, la, lse.reshape(-1), dims, False, scale)
