"""The Hopper flash-attention backward at head dim 256 (``kaio_ops._attention_hopper_bwd256``:
the dK/dV kernel whose two consumer warpgroups split the head dim, and the pair's dQ kernel at
D 256) in the simulator against NumPy float64 gradients at small sizes (f16 and bf16, causal
and not, grouped-query heads, Sq != Sk, partial tiles; the race detector on), its PTX
through ptxas for sm_90a (no spills, no serialized wgmma), the dispatch (sm_90 only, D 256
only; sm_80 keeps the mma.sync kernels), and on an sm_90 GPU ``flash_attention_bwd`` against
float64 autograd and torch SDPA at real sizes, deterministic."""

from __future__ import annotations

import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import find_ptxas
from kaio.types import f32
from kaio_ops import _arrays, attention
from kaio_ops import _attention_hopper_bwd256 as bwd256
from tests.harness import assemble_wgmma
from tests.poison import poison_allocations
from tests.test_ops_attention_hopper_bwd import check_grads, simulated_grads


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates starts as NaN."""
    poison_allocations(monkeypatch)


def run_sim(b, h, hkv, sq, sk, dtype, causal, cfg=None):
    """``simulated_grads`` of ``_attention_hopper_bwd256.launch`` with ``cfg`` (D 256)."""

    def launch(*args):
        return bwd256.launch(*args, cfg)

    return simulated_grads(launch, b, h, hkv, sq, sk, 256, dtype, causal)


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, causal, dq",
    [
        # grouped-query (dK, dV summed over two heads), causal, more tiles than ring stages;
        # the one-kernel schedule: dQ added in a fixed order (decreasing key blocks)
        (1, 2, 1, 128, 128, True, 1),
        # the pair: partial query and key tiles, Sq < Sk (bf16: the GPU tests; each type
        # compiles the kernels again, seconds of CI)
        (1, 1, 1, 100, 136, False, 0),
        # the pair, grouped-query and causal with whole tiles: the unmasked tiles' branch of
        # both kernels (a 128-query tile past a key block's last key, key tiles below a
        # query block's rows), the second warpgroup waiting for the first's front products
        (1, 2, 1, 256, 256, True, 0),
        # the pair without the mask: rotated walks (key block x from its (head, tile) item x,
        # query block x from key tile 2x), K's two stages reused
        (1, 2, 1, 256, 256, False, 0),
        # DS: dQ from the dS^T tiles the dK/dV kernel copies out (poisoned workspace: a tile
        # read but not written fails), grouped-query and causal (the zero tiles past the
        # diagonal of a 128-query tile's first half); a partial 128-query tile, Sq < Sk
        (1, 2, 1, 256, 256, True, "ds"),
        (1, 1, 1, 192, 256, False, "ds"),
        # in chunks of one K/V head (DS_BYTES: each chunk's tiles from the workspace's start)
        (2, 2, 1, 128, 128, True, "ds chunks"),
        # causal, the workspace bound at the triangle's 10 tiles (of the 12 a dense layout
        # has): rows of 2 and then 3 key blocks (the last 128-query tile's whole row)
        (1, 1, 1, 192, 192, True, "ds triangle"),
    ],
)
def test_backward_d256_in_simulator(b, h, hkv, sq, sk, causal, dq, monkeypatch):
    cfg = {"DQ": 0, "DS": 1} if str(dq).startswith("ds") else {"DQ": dq, "DS": 0}
    if dq == "ds chunks":  # a K/V head's dS^T: its 2 query heads' 2 x 2 tiles of 64 x 64
        monkeypatch.setattr(bwd256, "DS_BYTES", 2 * 2 * 2 * 64 * 64 * 2)
    taken = []
    if dq == "ds triangle":
        assert bwd256.ds_head_tiles(2, 3, 1) == 10 and bwd256.ds_head_tiles(2, 3, 0) == 12
        monkeypatch.setattr(bwd256, "DS_BYTES", 10 * 64 * 64 * 2)
        dq_from_ds = bwd256.dq_from_ds
        monkeypatch.setattr(bwd256, "dq_from_ds", lambda *a: taken.append(dq_from_ds(*a)))
    grads = run_sim(b, h, hkv, sq, sk, np.float16, causal, {"dkdv": cfg})
    check_grads(*grads, np.float16)
    assert len(taken) == (dq == "ds triangle")


def test_ds_keeps_to_its_workspace_bound(monkeypatch):
    """DS's workspace holds at most ``DS_BYTES``: where one K/V head's dS^T tiles do not
    fit, the backward takes the dQ kernel instead (right gradients, no dS product)."""
    taken = []
    monkeypatch.setattr(bwd256, "dq_from_ds", lambda *a: taken.append(a))
    monkeypatch.setattr(bwd256, "DS_BYTES", 2 * 2 * 64 * 64 * 2 - 1)  # a head's tiles: 2 x 2
    grads = run_sim(1, 1, 1, 128, 128, np.float16, False, {"dkdv": {"DQ": 0, "DS": 1}})
    check_grads(*grads, np.float16)
    assert not taken


def test_dispatch_takes_d256_on_sm_90_only(monkeypatch):
    """``flash_attention_bwd``'s D 256 branch (``hopper_takes(..., bwd256)``): an sm_90 GPU,
    D 256, whole 64-row tiles, S >= 1024; an sm_80 GPU keeps the mma.sync kernels, and the
    D 64 / 128 kernels never take D 256 (nor this module D 128)."""
    from types import SimpleNamespace

    from kaio_ops import _attention_hopper_bwd as hopper_bwd

    arch = {"now": "sm_90"}
    monkeypatch.setattr(attention, "simulating", lambda: False)
    monkeypatch.setattr(_arrays, "gpu", lambda a: SimpleNamespace(arch=arch["now"]))
    monkeypatch.setattr(_arrays, "multiprocessors", lambda a: 132)

    def takes(d, s=1024, sk=None, module=bwd256):
        with kaio.simulate():  # (host arrays only: nothing runs)
            q = np.zeros((1, 2, s, d), np.float16)
            k = np.zeros((1, 1, sk or s, d), np.float16)
            (qa, _, _), dims, _ = attention._check_flash("test", q, k, k, None)
        return attention.hopper_takes(qa, dims, module)

    assert takes(256) and takes(256, 2048, 1088)
    assert not takes(256, 1000) and not takes(256, 1024, 1000)  # partial tiles
    assert not takes(256, 512)  # short: the mma.sync kernels
    assert not takes(128) and not takes(256, module=hopper_bwd) and takes(128, module=hopper_bwd)
    arch["now"] = "sm_80"
    assert not takes(256) and not takes(128, module=hopper_bwd)


SHIPPED = [(k, c) for k, c in bwd256.specializations() if c["DT"] != kaio.bf16]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("index", range(len(SHIPPED)))
def test_specializations_assemble_for_sm_90a(index):
    """No spills, no serialized wgmma (f16: bf16 differs in the wgmma's type only); sm_80
    has no wgmma: a compile error that says so."""
    kernel, constexprs = SHIPPED[index]
    assemble_wgmma(kernel, constexprs)
    with pytest.raises(kaio.CompileError, match="needs sm_90"):
        kernel.ptx(arch="sm_80", **constexprs)


def test_launch_refuses_other_head_dims():
    q = np.zeros((1, 1, 128, 128), np.float16)
    lse = np.zeros((1, 1, 128), np.float32)
    with kaio.simulate():
        inputs = _arrays.Inputs("test")
        (qa, ka, va), dims, scale = attention._check_flash("test", q, q, q, None, inputs)
        la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
        with pytest.raises(ValueError, match="D 256, got Sq = 128, D = 128"):
            bwd256.launch(qa, ka, va, qa, la, lse.reshape(-1), dims, False, scale)


# --------------------------------------------------------------------------- GPU


def _hopper_gpu() -> bool:
    return kaio.gpu_available() and kaio.device().arch == "sm_90"


@pytest.mark.gpu
@pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, chunk",
    # the grouped-query case with DS's workspace one K/V head's dS^T: two chunks (causal: a
    # triangle of 144 tiles of the 512 a dense workspace has)
    [(2, 4, 4, 1024, 1024, False), (1, 4, 2, 1024, 2048, True)],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_flash_attention_bwd_d256(b, h, hkv, sq, sk, chunk, causal, dtype, monkeypatch):
    """``flash_attention_bwd`` at D 256 on sm_90 (these kernels) against float64 autograd:
    within the tolerance of P and dS rounded to the input type, or of twice torch SDPA
    flash's distance where that runs; the same bits on a second run."""
    import torch

    if chunk:  # a K/V head's tiles (its 2 query heads')
        tiles = bwd256.ds_head_tiles(sq // 128, sk // 64, int(causal))
        assert tiles == (144 if causal else 512)
        monkeypatch.setattr(bwd256, "DS_BYTES", 2 * tiles * 64 * 64 * 2)
    chunks = []
    dq_from_ds = bwd256.dq_from_ds
    monkeypatch.setattr(bwd256, "dq_from_ds", lambda *a: chunks.append(dq_from_ds(*a)))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tests.test_ops_attention import _rel_t, _sdpa64

    d = 256
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(sq + sk + h)
    q, do = (torch.randn((b, h, sq, d), device="cuda", dtype=dt, generator=gen) for _ in "qo")
    k, v = (torch.randn((b, hkv, sk, d), device="cuda", dtype=dt, generator=gen) for _ in "kv")
    (qa, _, _), dims, _ = attention._check_flash("test", q, k, v, None)
    assert attention.hopper_takes(qa, dims, bwd256)
    o, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    _sdpa64(*leaves, causal, group=h // hkv).backward(do.double())
    grads = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal)
    tol = 5e-3 if dtype == "float16" else 3e-2
    theirs = [None] * 3
    if not causal or sq == sk:  # (SDPA flash has no kernel for causal with Sq != Sk)
        flash = [x.detach().requires_grad_() for x in (q, k, v)]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(
                *flash, is_causal=causal, enable_gqa=h != hkv
            )
        theirs = torch.autograd.grad(out, flash, do)
    for g, t, leaf in zip(grads, theirs, leaves, strict=True):
        assert g.dtype == dt and g.shape == leaf.shape
        near = tol if t is None else max(tol, 2 * _rel_t(t, leaf.grad))
        assert _rel_t(g, leaf.grad) < near
    assert len(chunks) == (2 if chunk else 1)
    again = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal)
    assert all(torch.equal(x, y) for x, y in zip(again, grads, strict=True))
