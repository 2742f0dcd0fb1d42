"""The tensor-core matmul ops: in the simulator against NumPy float64 on random shapes (edge
tiles, K tails, unaligned leading dimensions, skinny K splits), input checks, every
specialization's PTX through ptxas, and on a GPU larger shapes, torch/CuPy/DeviceArray
inputs and run-to-run determinism."""

from __future__ import annotations

import importlib
import os
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops._matmul_kernels import matmul_kernel
from kaio_ops.matmul import CONFIGS, Plan, heuristic, run, specializations
from tests.harness import covering
from tests.launches import launched

OPS = {
    "matmul_tc": (kaio_ops.matmul_tc, np.float16, 1e-3),
    "matmul_tc_async": (kaio_ops.matmul_tc_async, np.float16, 1e-3),
    "matmul_tc_bf16": (kaio_ops.matmul_tc_bf16, ml_dtypes.bfloat16, 1e-2),
    "matmul_tc_bf16_async": (kaio_ops.matmul_tc_bf16_async, ml_dtypes.bfloat16, 1e-2),
}


def _inputs(rng, m, n, k, dtype):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    return a, b


def _rel_error(c, a, b) -> float:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.shape == ref.shape and c.dtype == np.float32
    assert np.isfinite(c).all(), "NaN or inf: an element was not written"
    return float(np.linalg.norm(c - ref) / max(np.linalg.norm(ref), 1e-30))


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(sorted(OPS)),
    m=st.integers(1, 200),
    n=st.integers(1, 200),
    k=st.integers(1, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes_in_simulator(op, m, n, k, seed):
    fn, dtype, _ = OPS[op]
    a, b = _inputs(np.random.default_rng(seed), m, n, k, dtype)
    with kaio.simulate():
        c = fn(a, b)
    # f32 accumulation of exact products: far below the f16/bf16 input rounding
    assert _rel_error(c, a, b) < 1e-5


@pytest.mark.parametrize(
    "m, n, k, plan",
    [
        (130, 136, 64, Plan("64x64")),  # edge tiles in M and N, aligned
        (64, 128, 96, Plan("64x128")),  # exact tiles, three K tiles through the pipeline
        (129, 264, 40, Plan("128x256")),  # the largest tile, K tail of 8
        (3, 72, 520, Plan("16x128", 4)),  # skinny: K split in 4 slices summed in order
        (1, 40, 2000, Plan("16x128", 16)),  # decode-like, 16 slices
        (17, 19, 23, Plan("128x128")),  # nothing aligned: the element-wise path
    ],
)
@pytest.mark.parametrize("pipelined", [False, True])
def test_each_config_in_simulator(m, n, k, plan, pipelined):
    a, b = _inputs(np.random.default_rng(m * n + k), m, n, k, np.float16)
    with kaio.simulate():
        c = run(a, b, kaio.f16, pipelined, plan)
    assert _rel_error(c, a, b) < 1e-5


def test_unaligned_base_takes_the_element_path_in_simulator():
    rng = np.random.default_rng(5)
    a_big, b = _inputs(rng, 32, 64, 65, np.float16)
    a = a_big[:, 1:]  # a view: not contiguous, refused
    with kaio.simulate(), pytest.raises(ValueError, match="'a' must be contiguous"):
        kaio_ops.matmul_tc(a, b)
    flat = rng.standard_normal(32 * 64 + 1).astype(np.float16)
    a = flat[1:].reshape(32, 64)  # contiguous, 2 bytes past a 16-byte boundary
    with kaio.simulate():
        c = kaio_ops.matmul_tc_async(a, b[:64].copy())
    assert _rel_error(c, a, b[:64]) < 1e-5


@pytest.mark.parametrize(
    "op, m, n, k",
    [("matmul_tc", 1, 64, 2048), ("matmul_tc_bf16_async", 16, 96, 1000),
     ("matmul_tc_async", 4, 32, 512), ("matmul_tc_bf16", 2, 64, 512)],
)  # fmt: skip
def test_decode_rows_take_linears_gemm_in_simulator(op, m, n, k, monkeypatch):
    """Up to 16 rows: linear's GEMM, its K split summed by the last block of a tile (one
    launch) up to ``linear.FIXUP_ROWS`` rows (N a multiple of 32 here), else by
    ``gemm_reduce``; right against float64."""
    from kaio_ops._gemm import GEMM, REDUCE

    fn, dtype, _ = OPS[op]
    a, b = _inputs(np.random.default_rng(m + n), m, n, k, dtype)
    kernels = launched(monkeypatch)
    with kaio.simulate():
        c = fn(a, b)
    one = m <= importlib.import_module("kaio_ops.linear").FIXUP_ROWS
    assert kernels == ([GEMM] if one else [GEMM, REDUCE])
    assert _rel_error(c, a, b) < 1e-5


@pytest.mark.parametrize(
    "op, m, n, k",
    [("matmul_tc", 130, 136, 200), ("matmul_tc_bf16_async", 4, 64, 512)],
)
def test_sm90_runs_the_gemm_planner_in_simulator(op, m, n, k, monkeypatch):
    """On sm_90 (stood in for: ``_hopper``, the Hopper kernels' operand check, 132 SMs) the
    ops are ``kaio_ops.matmul`` with f32 output: the kernels its planner picks (the Hopper
    GEMM at 130 rows, a skinny kernel at 4), the same bits, right against float64."""
    linear_mod = importlib.import_module("kaio_ops.linear")
    monkeypatch.setattr(importlib.import_module("kaio_ops.matmul"), "_hopper", lambda a: True)
    monkeypatch.setattr(linear_mod, "hopper_takes", lambda *args: True)
    monkeypatch.setattr(kaio_ops._arrays, "multiprocessors", lambda like: 132)
    fn, dtype, _ = OPS[op]
    a, b = _inputs(np.random.default_rng(m + k), m, n, k, dtype)
    kernels = launched(monkeypatch)
    with kaio.simulate():
        c = fn(a, b)
        ours = list(kernels)
        planned = kaio_ops.matmul(a, b, out_dtype=np.float32)
    assert ours == kernels[len(ours) :] and matmul_kernel not in ours
    assert np.array_equal(c, planned)
    assert _rel_error(c, a, b) < 1e-5


@pytest.mark.parametrize(
    "args, message",
    [
        (((4, 8), np.float32, (8, 4), np.float16), "'a' must be a 2-D array \\[M, K\\] of f16"),
        (((4, 8), np.float16, (8, 4), ml_dtypes.bfloat16), "'b' must be a 2-D array"),
        (((4, 8, 2), np.float16, (8, 4), np.float16), "'a' must be a 2-D array"),
        (((4, 8), np.float16, (9, 4), np.float16), "'b' must have K = 8 rows"),
        (((0, 8), np.float16, (8, 4), np.float16), "'a' has an empty dimension"),
        (((4, 8), np.float16, (8, 0), np.float16), "'b' has an empty dimension"),
    ],
)
def test_bad_inputs_name_the_argument(args, message):
    sa, ta, sb, tb = args
    a, b = np.ones(sa, ta), np.ones(sb, tb)
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        kaio_ops.matmul_tc(a, b)


def test_numpy_outside_simulate_names_both_ways_out():
    a = np.ones((4, 8), np.float16)
    with pytest.raises(ValueError, match="kaio.to_device.*kaio.simulate|kaio.simulate.*to_device"):
        kaio_ops.matmul_tc(a, a.T.copy())


def test_heuristic_plans_are_valid():
    for m, n, k in [(1, 4096, 4096), (16, 4096, 4096), (256, 256, 256), (8192, 8192, 8192)]:
        plan = heuristic(m, n, k)
        assert plan.config in CONFIGS and plan.split >= 1
    assert heuristic(1, 4096, 4096).split > 1  # decode shapes split K
    assert heuristic(8192, 8192, 8192).config == "128x256"


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_specialization_assembles(arch):
    specs = specializations()
    texts = [specs[i][0].ptx(arch=arch, **specs[i][1]) for i in covering(specs)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda ptx: assemble(ptx, arch), texts))  # ptxas runs in parallel


# --------------------------------------------------------------------------- GPU


def _torch_inputs(m, n, k, dtype, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    return a, b


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize(
    "m, n, k",
    [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (1, 4096, 4096), (16, 4096, 4096),
     (1000, 1030, 777), (5, 1000, 3000)],
)  # fmt: skip
def test_gpu_against_float64_and_deterministic(op, m, n, k):
    import torch

    fn, _, tol = OPS[op]
    dtype = torch.float16 if "bf16" not in op else torch.bfloat16
    a, b = _torch_inputs(m, n, k, dtype)
    c = fn(a, b)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32 and c.device == a.device
    ref = a.double() @ b.double()
    err = (torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)).item()
    assert err < tol / 10, err  # f32 accumulation of exact products
    assert torch.equal(fn(a, b), c), "results differ run to run"


@pytest.mark.gpu
def test_gpu_cupy_and_device_array_inputs():
    rng = np.random.default_rng(3)
    a, b = _inputs(rng, 200, 136, 72, np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = kaio_ops.matmul_tc_async(kaio.to_device(a), kaio.to_device(b))
    assert isinstance(c, kaio.DeviceArray)
    assert np.linalg.norm(c.numpy() - ref) / np.linalg.norm(ref) < 1e-5
    cupy = pytest.importorskip("cupy")
    c = kaio_ops.matmul_tc(cupy.asarray(a), cupy.asarray(b))
    assert isinstance(c, cupy.ndarray)
    assert np.linalg.norm(cupy.asnumpy(c) - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.gpu
def test_gpu_bad_inputs():
    import torch

    a, b = _torch_inputs(64, 64, 64, torch.float16)
    with pytest.raises(ValueError, match="'b' must be contiguous"):
        kaio_ops.matmul_tc(a, b.t())
    with pytest.raises(ValueError, match="'a' must be a 2-D array"):
        kaio_ops.matmul_tc_bf16(a, b)


def test_matmul_example_runs():
    import runpy

    runpy.run_path("examples/matmul_ops.py", run_name="__main__")
