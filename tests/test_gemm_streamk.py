"""The stream-K schedule of the Hopper GEMM (``kaio_ops._gemm_streamk``): in the simulator
against float64 (tails in M, N and K, M = 1, N = 1, every epilogue, both B layouts, grids
that split tiles between blocks and mix whole tiles with split ones), the same bits run to
run, the schedule's host arithmetic, and its PTX through ptxas (sm_90a)."""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _gemm_streamk as sk
from kaio_ops.linear import gemm
from tests.test_ops_linear import _operand, check, forced_runs, rand, reference

BF16 = ml_dtypes.bfloat16
linear_mod = importlib.import_module("kaio_ops.linear")


def _run(x, w, b, res, act, transposed, out, plan):
    m, k = x.shape
    n = (w.shape[0] // (2 if act == "silu_gate" else 1)) if transposed else w.shape[1]
    return gemm(
        "linear",
        _operand(x),
        _operand(w, "w"),
        (m, n),
        (m, n, k),
        kaio.types.from_numpy_dtype(np.dtype(out)),
        transposed,
        _operand(b, "bias") if b is not None else None,
        _operand(res, "residual") if res is not None else None,
        act,
        chosen=plan,
    )


@pytest.mark.parametrize(
    "m, n, k, act, dtype, out, plan, twice",
    [
        # 2 tiles of 5 K steps over 3 blocks: runs of 3, 3, 4 steps, tails in M, N and K
        (70, 96, 264, "gelu", BF16, BF16, sk.Plan(2, 64, 2, 3), True),
        # B [K, N], 6 tiles on 2 blocks: 4 whole (data parallel), 2 split
        (40, 136, 136, "none", np.float16, np.float32, sk.Plan(1, 64, 3, 2), False),
        # "silu_gate" with f32 residual, M = 1, K split over 4 blocks (some with 1 step)
        (1, 64, 320, "silu_gate", np.float16, np.float16, sk.Plan(1, 64, 2, 4), True),
        # N = 1 (B [N, K]), M a whole tile, a run inside one tile
        (64, 1, 520, "silu", BF16, np.float32, sk.Plan(1, 64, 2, 3), False),
        # spread 0: 2 tiles data parallel, the third's 3 steps shared by the 2 blocks
        (40, 136, 136, "gelu_tanh", np.float16, np.float16, sk.Plan(1, 64, 3, 2, 0), False),
    ],
)
def test_streamk_in_simulator(m, n, k, act, dtype, out, plan, twice):
    """Right against float64; ``twice``: the same bits on a second launch, which finds the
    arrival counters the first left zero (the simulator runs the blocks in one order, so a
    second launch checks the counters' reset, the same code in every case: two cases, one of
    each warpgroup count, keep it)."""
    rng = np.random.default_rng(m * 7 + n + k)
    transposed = act != "none"
    rows = 2 * n if act == "silu_gate" else n
    x = rand(rng, (m, k), dtype)
    w = rand(rng, (rows, k) if transposed else (k, n), dtype, 0.3)
    b = rand(rng, (rows,), dtype) if transposed else None
    res = rand(rng, (m, n), np.float32 if act == "silu_gate" else out) if transposed else None
    sched = sk.schedule(m, n, k, plan, 132)
    assert sched.sk_tiles > 0  # each case has split tiles
    with kaio.simulate():
        runs = [_run(x, w, b, res, act, transposed, out, plan) for _ in range(1 + twice)]
    assert np.array_equal(runs[0].view(np.uint8), runs[-1].view(np.uint8))
    if transposed:
        check(runs[0], *reference(x, w, b, res, act), out)
    else:
        check(runs[0], *reference(x, w.T.copy()), out)


def test_schedule_covers_every_step_once():
    """The runs of the blocks tile the stream-K steps exactly, every block gets one, and no
    tile has more segments than the workspace's slots (the kernel's arithmetic, in Python)."""
    for m, n, k, plan, sms in (
        (128, 4096, 4096, sk.Plan(2, 128, 4), 132),
        (1024, 1024, 1024, sk.Plan(2, 128, 4), 132),
        (2048, 6144, 4096, sk.Plan(2, 128, 6), 132),
        (70, 96, 264, sk.Plan(2, 64, 2, 3), 132),
        (8, 64, 64, sk.Plan(1, 64, 2), 132),  # one step: a grid of one block
        (2048, 6144, 4096, sk.Plan(2, 128, 6, 0, 0), 132),  # only the last wave shared
        (2176, 128, 64, sk.Plan(2, 64, 4, 4, 0), 132),  # 2 tiles of 1 step left: a wave back
        (1024, 256, 64, sk.Plan(2, 64, 4, 8, 0), 132),  # whole waves: nothing shared
    ):
        s = sk.schedule(m, n, k, plan, sms)
        tiles = -(-m // (64 * plan.wg)) * -(-n // plan.bn)
        kt = -(-k // 64)
        assert s.dp_tiles % s.grid == 0 and s.sk_tiles == tiles - s.dp_tiles
        work = s.sk_tiles * kt
        if (m, plan.spread) == (2176, 0):
            assert s.dp_tiles == 28  # 2 steps for 4 blocks: one wave more shared
        if not work:
            continue
        bounds = [b * work // s.grid for b in range(s.grid + 1)]
        assert all(hi > lo for lo, hi in zip(bounds, bounds[1:], strict=False))
        for t in range(s.sk_tiles):
            lo = ((t * kt + 1) * s.grid - 1) // work
            hi = (((t + 1) * kt) * s.grid - 1) // work
            assert bounds[lo] <= t * kt < bounds[lo + 1]
            assert hi - lo + 1 <= s.slots


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found")
def test_streamk_assembles_for_sm_90a():
    """Every listed variant through ptxas for sm_90a (wgmma), no spills."""
    for kernel, consts in sk.specializations():
        report = assemble(kernel.ptx(arch="sm_90", **consts), "sm_90a")
        # C7518/C7508: wgmma serialized; spills would cost the accumulators
        assert "C7518" not in report and "C7508" not in report, report
        assert " 0 bytes spill stores" in report, report


def test_streamk_dispatch_names():
    """``gemm`` takes ``"streamk"`` and a ``_gemm_streamk.Plan`` (the route's choices)."""
    assert "streamk" in linear_mod.gemm.__doc__


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k, activation, dtype, plan",
    [
        (128, 4096, 4096, "matmul", "float16", sk.Plan(2, 128, 6)),  # 32 tiles on every SM
        (1, 4096, 4104, "matmul", "bfloat16", sk.Plan(1, 64, 6)),  # M = 1, K tail
        (77, 2056, 4096, "silu_gate", "float16", sk.Plan(1, 64, 6)),  # gate, N tail
        (1000, 1000, 1000, "gelu", "bfloat16", sk.Plan(2, 128, 6)),  # tails everywhere
        (2048, 6144, 4096, "matmul", "float16", sk.Plan(2, 128, 6)),  # data parallel + split
    ],
)
def test_gpu_streamk_against_torch(m, n, k, activation, dtype, plan):
    """Stream-K at real sizes: f32 out against torch in float64, the same bits 3 times."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernels need sm_90")
    runs, ref = forced_runs(torch, m, n, k, activation, plan, getattr(torch, dtype))
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    assert ((runs[0].double() - ref).norm() / ref.norm()).item() < 1e-5
