"""kaio_ops.matmul and kaio_ops.linear (torch's conventions, fused epilogues): in the simulator
against NumPy float64 (tails in M, N and K, K = N = M = 1, unaligned bases, the K split and
its determinism, every activation with and without bias and residual, each output dtype),
input checks, every specialization's PTX through ptxas for sm_80 and sm_90; marked gpu, the
same against torch at real sizes (the mma.sync kernels on any GPU, sm_90 included)."""

from __future__ import annotations

import importlib
import math
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _gemm_hopper as hopper
from kaio_ops import _gemm_streamk as streamk
from kaio_ops.linear import Persistent, gemm, plan, specializations
from kaio_ops.matmul import Plan
from tests.harness import covering
from tests.linear_reference import torch_linear_reference

BF16 = ml_dtypes.bfloat16
# the rounding of one output element, relative, by output dtype
ROUNDING = {np.float16: 2.0**-10, BF16: 2.0**-7, np.float32: 2.0**-22}


def _gelu(z):
    return 0.5 * z * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


ACTS = {
    None: lambda z: z,
    "gelu": _gelu,
    "gelu_tanh": lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))),
    "silu": lambda z: z / (1 + np.exp(-z)),
}


def reference(x, w, bias=None, residual=None, activation=None):
    """float64 linear with its epilogue; also the magnitude sum |x| @ |w|.T, for tolerances."""
    x64, w64 = x.astype(np.float64).reshape(-1, x.shape[-1]), w.astype(np.float64)
    z = x64 @ w64.T
    if bias is not None:
        z = z + bias.astype(np.float64)
    size = np.abs(x64) @ np.abs(w64).T
    if activation == "silu_gate":
        f = w.shape[0] // 2
        g, u = z[:, :f], z[:, f:]
        y = ACTS["silu"](g) * u
        size = size[:, :f] * (1 + np.abs(u)) + size[:, f:] * (1 + np.abs(g))
    else:
        y = ACTS[activation](z)
    if residual is not None:
        y = y + residual.astype(np.float64).reshape(y.shape)
    return y.reshape(*x.shape[:-1], -1), size.reshape(*x.shape[:-1], -1)


def check(c, ref, size, out_dtype):
    """Every element (none left unwritten) within one output rounding plus f32 accumulation
    and the approximate activations' error."""
    assert c.shape == ref.shape and c.dtype == np.dtype(out_dtype)
    c64 = c.astype(np.float64)
    assert np.isfinite(c64).all(), "NaN or inf: an element was not written"
    tol = ROUNDING[out_dtype] * np.abs(ref) + 2e-6 * size + 1e-6
    bad = np.abs(c64 - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.abs(c64 - ref).max():.3g}"


def rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize(
    "m, n, k, dtype, out_dtype",
    [
        (17, 19, 23, np.float16, None),  # nothing aligned: element copies, tails everywhere
        (130, 136, 64, BF16, np.float32),  # edge tiles in M and N, 16-byte copies
        (3, 72, 520, np.float16, BF16),  # small M: K split, summed by gemm_reduce
        (1, 1, 1, BF16, None),  # M = N = K = 1
        (5, 1, 40, np.float16, np.float32),  # N = 1
        (1, 33, 1, np.float16, None),  # K = 1
    ],
)
def test_matmul_in_simulator(m, n, k, dtype, out_dtype):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    with kaio.simulate():
        c = kaio_ops.matmul(a, b, out_dtype=out_dtype)
    ref, size = reference(a, b.T.copy())
    check(c, ref, size, out_dtype or dtype)


@pytest.mark.parametrize(
    "shape, n, dtype, activation, bias, residual, out_dtype",
    [
        ((2, 9, 40), 24, np.float16, None, True, True, None),  # batch dims, aligned
        ((20, 33), 17, BF16, "gelu", True, False, np.float32),  # nothing aligned, tails
        ((4, 64), 40, np.float16, "gelu_tanh", False, True, np.float32),  # split K
        ((70, 16), 72, BF16, "silu", True, True, BF16),
        ((3, 5, 24), 20, np.float16, "silu_gate", True, True, None),  # [2F, K] weight
        ((1, 130), 9, BF16, "silu_gate", False, False, np.float32),  # M = 1, split, gate
        ((66, 1), 1, np.float16, None, True, False, None),  # K = 1, N = 1
    ],
)
def test_linear_epilogues_in_simulator(shape, n, dtype, activation, bias, residual, out_dtype):
    rng = np.random.default_rng(sum(shape) + n)
    k = shape[-1]
    rows = 2 * n if activation == "silu_gate" else n
    x, w = rand(rng, shape, dtype), rand(rng, (rows, k), dtype, 0.5)
    b = rand(rng, (rows,), dtype) if bias else None
    res_dtype = np.float32 if activation == "silu" else out_dtype or dtype  # any float type
    res = rand(rng, (*shape[:-1], n), res_dtype) if residual else None
    with kaio.simulate():
        c = kaio_ops.linear(x, w, b, residual=res, activation=activation, out_dtype=out_dtype)
    ref, size = reference(x, w, b, res, activation)
    check(c, ref, size, out_dtype or dtype)


def test_unaligned_base_in_simulator():
    """A base 2 bytes past a 16-byte boundary takes the element copies, still exact."""
    rng = np.random.default_rng(3)
    flat = rand(rng, 24 * 64 + 1, np.float16)
    x = flat[1:].reshape(24, 64)
    w = rand(rng, (48, 64), np.float16)
    with kaio.simulate():
        c = kaio_ops.linear(x, w)
    check(c, *reference(x, w), np.float16)


def test_split_k_is_deterministic_and_matches_one_slice_in_simulator():
    rng = np.random.default_rng(11)
    x, w = rand(rng, (3, 256), np.float16), rand(rng, (40, 256), np.float16)
    res = rand(rng, (3, 40), np.float32)
    with kaio.simulate():
        args = (_operand(x), _operand(w), (3, 40), (3, 40, 256), kaio.f32, True)
        kw = {"residual": _operand(res, "residual"), "activation": "silu"}
        runs = [gemm("linear", *args, chosen=Plan("16x128", 4), **kw) for _ in range(2)]
        whole = gemm("linear", *args, chosen=Plan("16x128", 1), **kw)
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    np.testing.assert_allclose(runs[0], whole, rtol=1e-5, atol=1e-5)
    check(runs[0], *reference(x, w, None, res, "silu"), np.float32)


@pytest.mark.parametrize("act", ["silu_gate", "gelu"])
def test_mma_sync_split_summed_in_kernel_in_simulator(act, monkeypatch):
    """The mma.sync kernel's K split summed by the last block of each tile (N a multiple of
    32): right, and the same bits as the gemm_reduce kernel."""
    rng = np.random.default_rng(12)
    m, n, k = 5, 64, 320  # 4 slices of 80 (K 64 a step: 2 steps, the last half empty)
    rows = 2 * n if act == "silu_gate" else n
    x, w = rand(rng, (m, k), np.float16), rand(rng, (rows, k), np.float16)
    b, res = rand(rng, (rows,), np.float16), rand(rng, (m, n), np.float32)
    linear_mod = importlib.import_module("kaio_ops.linear")

    def run():
        args = (_operand(x), _operand(w, "w"), (m, n), (m, n, k), kaio.f32, True)
        return gemm("linear", *args, _operand(b, "bias"), _operand(res, "residual"), act,
                    chosen=Plan("16x128", 4))  # fmt: skip

    with kaio.simulate():
        monkeypatch.setattr(linear_mod, "MMA_FIXUP", True)
        fixed = run()
        monkeypatch.setattr(linear_mod, "MMA_FIXUP", False)
        monkeypatch.setattr(linear_mod, "FIXUP_ROWS", 0)
        reduced = run()
    assert np.array_equal(fixed.view(np.uint32), reduced.view(np.uint32))
    check(fixed, *reference(x, w, b, res, act), np.float32)


@pytest.mark.parametrize(
    "config, m, n, k, split, act",
    [
        ("16x128s8", 5, 96, 1040, 2, "gelu"),  # N and K tails, summed in the kernel
        ("16x64s8", 3, 64, 1100, 3, "silu_gate"),
        ("16x64s8", 17, 40, 600, 2, None),  # two row tiles; N % 32: summed by gemm_reduce
        ("16x128s8", 1, 1, 9, 1, None),  # K shorter than a ring stage, N = 1
        ("32x64s8", 29, 72, 1100, 2, "gelu"),  # 32-row tiles: M, N and K tails
        ("32x128s8", 40, 136, 600, 3, None),  # two row tiles, the second of 8 rows
        ("32x64s8", 32, 64, 1000, 2, "silu_gate"),  # two rings of gate and up rows
        ("32x64s8", 32, 64, 300, 1, "gelu"),  # K shorter than the ring
        ("32x64s8", 33, 96, 1024, 1, "matmul"),  # B [K, N]: two row tiles, N tail
        ("32x128s8", 20, 200, 720, 2, "matmul"),  # B [K, N], K split summed in the kernel
        ("16x128s6", 6, 160, 1000, 2, "gelu"),  # 6 stages: N and K tails, summed in the kernel
    ],
)
def test_deep_skinny_tiles_in_simulator(config, m, n, k, split, act):
    """The mma.sync kernel's skinny tiles with 6- and 8-stage rings (``linear.SKINNY_CONFIGS``,
    16 and 32 rows), named by a Plan: ``linear`` with bias, activation and residual
    ("matmul": B [K, N], no epilogue), against float64."""
    rng = np.random.default_rng(m + n + k)
    rows = 2 * n if act == "silu_gate" else n
    x, w = rand(rng, (m, k), np.float16), rand(rng, (rows, k), np.float16, 0.3)
    b, res = rand(rng, (rows,), np.float16), rand(rng, (m, n), np.float16)
    with kaio.simulate():
        if act == "matmul":
            wt = np.ascontiguousarray(w.T)
            got = gemm("matmul", _operand(x), _operand(wt, "b"), (m, n), (m, n, k), kaio.f16,
                       False, chosen=Plan(config, split))  # fmt: skip
            check(got, *reference(x, w), np.float16)
            return
        args = (_operand(x), _operand(w, "w"), (m, n), (m, n, k), kaio.f16, True)
        got = gemm("linear", *args, _operand(b, "bias"), _operand(res, "residual"),
                   act or "none", chosen=Plan(config, split))  # fmt: skip
    check(got, *reference(x, w, b, res, act), np.float16)


def test_few_rows_sum_their_k_split_in_the_kernel():
    """Up to FIXUP_ROWS rows: the K split summed by the mma.sync kernel (one launch, faster
    on an H100); more rows, N not a multiple of 32 or no split: through gemm_reduce
    (MMA_FIXUP off)."""
    linear_mod = importlib.import_module("kaio_ops.linear")
    rows = linear_mod.FIXUP_ROWS
    assert not linear_mod.MMA_FIXUP
    assert linear_mod.mma_fixup(1, 4096, 4) and linear_mod.mma_fixup(rows, 4096, 4)
    assert not linear_mod.mma_fixup(rows + 1, 4096, 4)
    assert not linear_mod.mma_fixup(1, 4100, 4)
    assert not linear_mod.mma_fixup(1, 4096, 1)


def _operand(arr, name="x"):
    inputs = kaio_ops._arrays.Inputs("test")
    return inputs.array(arr, name, ndim=(1, 2, 3), dtypes=None)


@pytest.mark.parametrize(
    "m, n, k, act, dtype, out_dtype",
    [
        (70, 72, 136, "gelu", np.float16, None),  # two warpgroups, tails in M, N and K
        (5, 40, 512, "silu_gate", BF16, np.float32),  # one warpgroup, gate, K split in 2
        (33, 136, 200, "matmul", np.float16, BF16),  # B [K, N]: N-major tiles
    ],
)
def test_hopper_kernel_in_simulator(m, n, k, act, dtype, out_dtype):
    """The sm_90 kernel (TMA, mbarriers, wgmma) with the same epilogue, forced in the
    simulator (on a GPU it runs only on sm_90)."""
    rng = np.random.default_rng(m + n + k)
    out = out_dtype or dtype
    transposed = act != "matmul"
    rows = 2 * n if act == "silu_gate" else n
    x = rand(rng, (m, k), dtype)
    w = rand(rng, (rows, k) if transposed else (k, n), dtype, 0.3)
    b = rand(rng, (rows,), dtype) if transposed else None
    res = rand(rng, (m, n), out) if transposed else None
    with kaio.simulate():
        got = gemm(
            "linear",
            _operand(x),
            _operand(w, "w"),
            (m, n),
            (m, n, k),
            kaio.types.from_numpy_dtype(np.dtype(out)),
            transposed,
            _operand(b, "bias") if b is not None else None,
            _operand(res, "residual") if res is not None else None,
            act if transposed else "none",
            chosen="hopper",
        )
    if transposed:
        check(got, *reference(x, w, b, res, act), out)
    else:
        check(got, *reference(x, w.T.copy()), out)


@pytest.mark.parametrize(
    "m, n, k, act, dtype, chosen",
    [
        (3, 64, 520, "silu_gate", np.float16, hopper.Plan(1, 64, 2, 4, True)),  # K tail, 3 slices
        (70, 96, 264, "gelu", BF16, hopper.Plan(2, 64, 2, 2, True)),  # tails in M, N, K
        (1, 32, 256, "matmul", np.float16, hopper.Plan(1, 64, 2, 4, True)),  # M = 1, B [K, N]
    ],
)
def test_hopper_split_fixup_in_simulator(m, n, k, act, dtype, chosen):
    """The Hopper kernel's K split summed in the kernel (the last block of each tile adds
    the slices in order): right, the same bits run to run and the same bits as the separate
    reduction kernel (``fixup`` off), whose sum has the same order."""
    rng = np.random.default_rng(m * n + k)
    transposed = act != "matmul"
    rows = 2 * n if act == "silu_gate" else n
    x = rand(rng, (m, k), dtype)
    w = rand(rng, (rows, k) if transposed else (k, n), dtype, 0.3)
    b = rand(rng, (rows,), dtype) if transposed else None
    res = rand(rng, (m, n), np.float32) if transposed else None

    def run(plan):
        return gemm(
            "linear",
            _operand(x),
            _operand(w, "w"),
            (m, n),
            (m, n, k),
            kaio.f32,
            transposed,
            _operand(b, "bias") if b is not None else None,
            _operand(res, "residual") if res is not None else None,
            act if transposed else "none",
            chosen=plan,
        )

    with kaio.simulate():
        runs = [run(chosen) for _ in range(2)]
        reduced = run(chosen._replace(fixup=False))
    for got in runs[1:] + [reduced]:
        assert np.array_equal(runs[0].view(np.uint32), got.view(np.uint32))
    if transposed:
        check(runs[0], *reference(x, w, b, res, act), np.float32)
    else:
        check(runs[0], *reference(x, w.T.copy()), np.float32)


@pytest.mark.parametrize(
    "m, n, k, act, dtype, chosen",
    [
        # widths that are not a multiple of 64: the last 64-row block of B loaded whole, the
        # wgmmas read its first part; tails in M, N and K
        (70, 200, 136, "silu_gate", np.float16, hopper.Plan(2, 160, 2, 1, False)),
        (33, 200, 200, "matmul", BF16, hopper.Plan(1, 192, 2, 1, False)),
        (5, 72, 520, "matmul", np.float16, hopper.Plan(1, 32, 12, 2, True)),  # deep ring
        # clusters of two blocks: side by side sharing A (two 64-row boxes, one each), one
        # above the other sharing B (the gate and up blocks in turn), an odd count of tiles
        (130, 72, 136, "matmul", np.float16, hopper.Plan(2, 64, 2, 1, False, 2)),
        (70, 200, 200, "silu_gate", BF16, hopper.Plan(1, 64, 2, 1, False, 1)),
    ],
)
def test_hopper_tile_widths_and_pairs_in_simulator(m, n, k, act, dtype, chosen):
    """The Hopper kernel at tile widths of 160, 192 and 32 columns, and in pairs."""
    rng = np.random.default_rng(m + n)
    transposed = act != "matmul"
    rows = 2 * n if act == "silu_gate" else n
    x = rand(rng, (m, k), dtype)
    w = rand(rng, (rows, k) if transposed else (k, n), dtype, 0.3)
    b = rand(rng, (rows,), dtype) if transposed else None
    with kaio.simulate():
        got = gemm("linear", _operand(x), _operand(w, "w"), (m, n), (m, n, k), kaio.f32,
                   transposed, _operand(b, "bias") if transposed else None, None,
                   act if transposed else "none", chosen=chosen)  # fmt: skip
    if transposed:
        check(got, *reference(x, w, b, None, act), np.float32)
    else:
        check(got, *reference(x, w.T.copy()), np.float32)


@pytest.mark.parametrize(
    "m, n, k, transposed, dtype, out, chosen",
    [
        # 4 adjacent columns a store (lanes trading pairs): tails in M and N, both layouts
        (70, 200, 136, False, np.float16, kaio.f16, hopper.Plan(2, 64, 2, 1, False, 0, 1)),
        (33, 72, 200, True, BF16, kaio.f32, hopper.Plan(1, 128, 3, 1, False, 0, 1)),
        (40, 264, 136, False, BF16, kaio.bf16, hopper.Plan(1, 256, 2, 1, False, 0, 1)),  # routed
        (65, 72, 200, False, np.float16, kaio.f16, hopper.Plan(1, 64, 3, 1, False, 0, 1)),
        # 32 columns a tile, f32 out (routed at 256^3, matmul_tc's f32 included)
        (70, 72, 136, False, np.float16, kaio.f32, hopper.Plan(1, 32, 3, 1, False, 0, 1)),
        # a width not a multiple of 64 (routed: 64 x 192 at M = 129-256 of 6144 x 4096)
        (40, 200, 136, False, BF16, kaio.bf16, hopper.Plan(1, 192, 2, 1, False, 0, 1)),
        # through shared memory, a bulk copy a row: a partial last column tile and rows
        (70, 200, 136, False, np.float16, kaio.f16, hopper.Plan(2, 64, 2, 1, False, 0, 2)),
        (33, 72, 200, True, BF16, kaio.bf16, hopper.Plan(1, 128, 2, 1, False, 0, 2)),
        (17, 40, 64, False, np.float16, kaio.f32, hopper.Plan(1, 64, 2, 1, False, 0, 2)),
        (130, 72, 136, False, BF16, kaio.bf16, hopper.Plan(2, 64, 2, 1, False, 2, 2)),  # pairs
    ],
)
def test_hopper_vector_epilogues_in_simulator(m, n, k, transposed, dtype, out, chosen):
    """The Hopper kernel's wide stores (``VEC`` 1 and 2) against float64, every output
    type, tails in M and N."""
    rng = np.random.default_rng(m + n + chosen.vec)
    x = rand(rng, (m, k), dtype)
    w = rand(rng, (n, k) if transposed else (k, n), dtype, 0.3)
    with kaio.simulate():
        got = gemm("matmul", _operand(x), _operand(w, "w"), (m, n), (m, n, k), out, transposed,
                   chosen=chosen)  # fmt: skip
    types = {kaio.f16: np.float16, kaio.bf16: BF16, kaio.f32: np.float32}
    check(got, *reference(x, w if transposed else w.T.copy()), types[out])


@pytest.mark.parametrize(
    "m, n, k, act, dtype, out, chosen",
    [
        # the fused epilogue's loads first (VEC 3): tails in M and N, chunks of 8 n8 tiles
        # and a last partial chunk (96 and 48 columns), an odd N (element loads), every output type
        (70, 200, 136, "gelu", np.float16, kaio.f16, hopper.Plan(2, 64, 2, 1, False, 0, 3)),
        (33, 75, 72, "silu_gate", BF16, kaio.f32, hopper.Plan(1, 64, 2, 1, False, 0, 3)),
        (20, 104, 64, "gelu_tanh", BF16, kaio.bf16, hopper.Plan(1, 96, 2, 1, False, 0, 3)),
        (65, 40, 64, "silu", np.float16, kaio.f32, hopper.Plan(2, 48, 2, 1, False, 0, 4)),
        (130, 72, 136, "gelu_tanh", BF16, kaio.bf16, hopper.Plan(2, 64, 3, 1, False, 0, 4)),
    ],
)
def test_hopper_fused_epilogue_in_simulator(m, n, k, act, dtype, out, chosen):
    """The Hopper kernel's fused epilogue with its loads ahead of the stores (``VEC`` 3,
    ``store_fused``; 4, the residual prefetched): bias, activation and residual against
    float64."""
    rng = np.random.default_rng(m + n + k)
    rows = 2 * n if act == "silu_gate" else n
    x = rand(rng, (m, k), dtype)
    w = rand(rng, (rows, k), dtype, 0.3)
    b = rand(rng, (rows,), dtype)
    types = {kaio.f16: np.float16, kaio.bf16: BF16, kaio.f32: np.float32}
    res = rand(rng, (m, n), types[out])
    with kaio.simulate():
        got = gemm("linear", _operand(x), _operand(w, "w"), (m, n), (m, n, k), out, True,
                   _operand(b, "bias"), _operand(res, "residual"), act, chosen=chosen)  # fmt: skip
    check(got, *reference(x, w, b, res, act), types[out])


@pytest.mark.parametrize(
    "m, n, k, dtype",
    [
        (1, 264, 200, np.float16),  # a partial column block, K in 3 slices (tail 8 rows)
        (3, 40, 1000, BF16),  # 15 slices
        (8, 16, 72, np.float16),  # M = 8, one slice with a K tail
        (1, 8, 1, BF16),  # K = 1
    ],
)
def test_gemv_in_simulator(m, n, k, dtype):
    """The skinny kernel (M <= 8, B [K, N]): right against float64, and a K split's
    in-kernel sum the same bits run to run."""
    rng = np.random.default_rng(m * n + k)
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype, 0.3)
    with kaio.simulate():
        args = (_operand(a), _operand(b, "b"), (m, n), (m, n, k), kaio.f32, False)
        runs = [gemm("matmul", *args, chosen="gemv") for _ in range(2)]
        half = gemm("matmul", *args[:4], kaio.types.from_numpy_dtype(np.dtype(dtype)), False,
                    chosen="gemv")  # fmt: skip
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    check(runs[0], *reference(a, b.T.copy()), np.float32)
    check(half, *reference(a, b.T.copy()), dtype)


@pytest.mark.parametrize(
    "m, n, k, act, dtype, out_dtype",
    [
        (1, 9, 520, "gelu", np.float16, None),  # K past one pass of 4 x 256, N tail of a block
        (3, 16, 264, "silu_gate", BF16, np.float32),
        (4, 8, 8, "silu", np.float16, BF16),  # one 16-byte piece of K
        (2, 1, 16, "none", BF16, None),  # N = 1
    ],
)
def test_gemv_nk_in_simulator(m, n, k, act, dtype, out_dtype):
    """The skinny kernel for W [N, K] (``linear`` at M <= 4) with every epilogue stage."""
    rng = np.random.default_rng(m * n + k + 1)
    out = out_dtype or dtype
    rows = 2 * n if act == "silu_gate" else n
    x, w = rand(rng, (m, k), dtype), rand(rng, (rows, k), dtype, 0.3)
    b, res = rand(rng, (rows,), dtype), rand(rng, (m, n), out)
    with kaio.simulate():
        got = gemm("linear", _operand(x), _operand(w, "w"), (m, n), (m, n, k),
                   kaio.types.from_numpy_dtype(np.dtype(out)), True, _operand(b, "bias"),
                   _operand(res, "residual"), act, chosen="gemv")  # fmt: skip
    check(got, *reference(x, w, b, res, None if act == "none" else act), out)


@pytest.mark.parametrize(
    "dtype, out, chosen",
    [
        (np.float16, np.float16, "persistent"),
        (BF16, BF16, "persistent"),
        (BF16, np.float32, "persistent"),
        (np.float16, np.float16, Persistent(160)),  # 2.5 blocks of 64 columns: the last whole
        (BF16, BF16, Persistent(128, 8, 1)),  # pairs sharing B, an odd count of tile rows
        (np.float16, np.float16, Persistent(320, 8, 1)),  # two wgmmas a K step, 384 threads
        (BF16, np.float32, Persistent(320)),
        (np.float16, np.float16, Persistent(128, 8, 0, 2)),  # the second warpgroup 2 slices behind
        (BF16, BF16, Persistent(320, 8, 1, 4)),  # a skew of a whole ring (4 stages), pairs
    ],
)
def test_persistent_kernel_in_simulator(dtype, out, chosen):
    """``matmul`` on ``_matmul_hopper``'s persistent kernel (its f16 and bf16 outputs packed
    in pairs): 2 x 2 tiles with tails in M, N and K."""
    rng = np.random.default_rng(5)
    m, n, k = 130 if chosen == "persistent" else 300, 136 if chosen == "persistent" else 200, 200
    if chosen in (Persistent(320, 8, 1), Persistent(320)):  # a tile of 256 + 64 columns and
        n = 344  # one of 24: both wgmmas' columns cut at N
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype, 0.3)
    with kaio.simulate():
        ot = kaio.types.from_numpy_dtype(np.dtype(out))
        got = gemm("matmul", _operand(a), _operand(b, "b"), (m, n), (m, n, k), ot, False,
                   chosen=chosen)  # fmt: skip
    check(got, *reference(a, b.T.copy()), out)


@pytest.mark.parametrize(
    "act, dtype, out, chosen",
    [
        ("gelu", np.float16, np.float16, Persistent(128)),  # B [N, K], the fused epilogue
        ("silu", BF16, np.float32, Persistent(320, 8, 1)),  # 256 + 64 columns, pairs
        (None, np.float16, BF16, Persistent(160)),  # no epilogue: stores of 4 columns
    ],
)
def test_persistent_linear_in_simulator(act, dtype, out, chosen):
    """``linear`` on the persistent kernel: B [N, K], bias, activation and residual (the
    fused epilogue, the residual rows prefetched), x with a batch dimension; 2 x 2 tiles
    (or pairs) with tails in M, N and K."""
    rng = np.random.default_rng(6)
    m, n, k = 300, 344 if chosen.bn == 320 else 200, 136
    x, w = rand(rng, (2, m // 2, k), dtype), rand(rng, (n, k), dtype, 0.3)
    b = rand(rng, (n,), dtype) if act else None
    res = rand(rng, (2, m // 2, n), out) if act else None
    ot = kaio.types.from_numpy_dtype(np.dtype(out))
    with kaio.simulate():
        got = gemm("linear", _operand(x), _operand(w, "w"), (2, m // 2, n), (m, n, k), ot, True,
                   _operand(b, "bias") if act else None, _operand(res, "residual") if act else None,
                   act or "none", chosen=chosen)  # fmt: skip
    check(got, *reference(x, w, b, res, act), out)


def test_plans():
    assert plan(1, 4096, 4096, 132).split > 1  # decode: K split
    assert plan(4096, 4096, 4096, 132).split == 1
    assert plan(4096, 14336, 4096, 132, gate=True).config == "64x128"  # registers
    assert hopper.plan(1, 4096, 4096, 132)[:4:3] == (1, 2)  # 64-row tiles, K split
    assert hopper.plan(16, 4096, 4096, 132)[1] == 64  # narrow N tiles for small M
    assert hopper.plan(8192, 8192, 8192, 132)[:4] == (2, 256, 4, 1)
    assert hopper.plan(4096, 14336, 4096, 132, gate=True)[1] == 128


def test_skinny_plans_of_unlisted_shapes(monkeypatch):
    """At most 16 rows of a shape the table does not list (sm_90, B [K, N]): unsplit deep
    16 x 64 tiles where they make half a wave to a wave (132 SMs: N = 4096-8192), unsplit
    16 x 128 tiles from half a wave of those (N = 10240 and up), else the K split of
    ``tuned_plan``; B [N, K] unsplit deep 16 x 64 tiles from half a wave (at any N), else
    ``tuned_plan``; "silu_gate" keeps ``tuned_plan``."""
    linear_mod = importlib.import_module("kaio_ops.linear")
    monkeypatch.setattr(kaio_ops._arrays, "multiprocessors", lambda like: 132)
    with kaio.simulate():
        a = _operand(np.zeros((4, 64), np.float16))
        got = {n: linear_mod.skinny_plan(a, 4, n, 4096, False, False)
               for n in (2048, 4096, 8192, 10240, 20000)}  # fmt: skip
        nk = {n: linear_mod.skinny_plan(a, 4, n, 4096, False, True) for n in (2048, 4096, 28672)}
        assert linear_mod.skinny_plan(a, 4, 4096, 4096, True, False).config == "16x128"
    assert got == {2048: Plan("16x128", 8), 4096: Plan("16x64s8"), 8192: Plan("16x64s8"),
                   10240: Plan("16x128"), 20000: Plan("16x128")}  # fmt: skip
    assert nk == {2048: Plan("16x128", 8), 4096: Plan("16x64s8"), 28672: Plan("16x64s8")}


def test_plain_linear_routes_to_the_persistent_kernel(monkeypatch):
    """On sm_90, plain ``linear`` (B [N, K]) from ``PERSISTENT_NK_M`` rows runs the
    persistent kernel: 320-column tiles where the B [K, N] table names them, else 256; with
    an epilogue, fewer rows or N not a multiple of 8 it keeps the table's Hopper plans."""
    linear_mod = importlib.import_module("kaio_ops.linear")
    monkeypatch.setattr(linear_mod, "hopper_takes", lambda *args: True)
    monkeypatch.setattr(kaio_ops._arrays, "multiprocessors", lambda like: 132)
    with kaio.simulate():
        a = _operand(np.zeros((4, 64), np.float16))

        def route(m, n, k, plain=True):
            return linear_mod.route(a, a, (m, n, k), True, plain, False)

        assert route(4096, 28672, 4096) == Persistent(320, 8, 1)
        assert route(1024, 6144, 4096) == Persistent(256)
        assert route(8192, 4096, 14336) == Persistent(256)
        assert route(4096, 4096, 14336, plain=False) == hopper.Plan(2, 256, 4, 1, False)
        assert route(1000, 4096, 14336) == hopper.Plan(2, 256, 4, 1, False)
        assert not isinstance(route(4096, 4100, 4096), Persistent)


@pytest.mark.parametrize("peak", [None, 3.35e12, 4.8e12])
def test_measured_choices_by_memory_bandwidth(peak, monkeypatch):
    """A ``linear.ByMemory`` entry routes by the GPU's peak memory bandwidth: its ``fast``
    choice from ``FAST_MEMORY`` (an H200), else (an H100, or the driver does not tell) its
    ``slow`` one; the entries around it keep theirs."""
    linear_mod = importlib.import_module("kaio_ops.linear")
    slow, fast = hopper.Plan(1, 64, 6, 1, False, 0, 1), Plan("32x64s8", 1)
    table = {(1000, 2000, "kn"): [(16, Plan("16x64s8")), (32, linear_mod.ByMemory(slow, fast))]}
    monkeypatch.setattr(linear_mod, "MEASURED", table)
    monkeypatch.setattr(linear_mod, "hopper_takes", lambda *args: True)
    monkeypatch.setattr(kaio_ops._arrays, "memory_bandwidth", lambda like: peak)
    with kaio.simulate():
        a = _operand(np.zeros((4, 64), np.float16))
        got = [linear_mod.route(a, a, (m, 1000, 2000), False, True, False) for m in (16, 17, 32)]
    want = fast if peak is not None and peak >= kaio_ops._arrays.FAST_MEMORY else slow
    assert got == [Plan("16x64s8"), want, want]


@pytest.mark.parametrize("peak", [None, 3.35e12, 4.8e12])
def test_skinny_routes_by_memory_bandwidth(peak, monkeypatch):
    """At most 16 rows (issue 33 on the H200): from ``FAST_MEMORY`` (an H200) the deep 16 x 64
    tiles in 2 K slices at 4096 x 14336 (``matmul`` and ``linear``), unsplit 16 x 128 tiles
    with 6-stage rings at 10240 and 57344 columns of K = 8192; an H100 (and the simulator)
    keeps its plans: unsplit 16 x 64 tiles, 16 x 128 ones with 4 stages, the skinny kernel
    at one row of 57344 columns (and main's past 16 rows)."""
    linear_mod = importlib.import_module("kaio_ops.linear")
    monkeypatch.setattr(linear_mod, "hopper_takes", lambda *args: True)
    monkeypatch.setattr(kaio_ops._arrays, "multiprocessors", lambda like: 132)
    monkeypatch.setattr(kaio_ops._arrays, "memory_bandwidth", lambda like: peak)
    fast = peak is not None and peak >= kaio_ops._arrays.FAST_MEMORY
    with kaio.simulate():
        a = _operand(np.zeros((4, 64), np.float16))

        def route(m, n, k, transposed=False):
            return linear_mod.route(a, a, (m, n, k), transposed, not transposed, False)

        for m in (1, 8, 16):
            assert route(m, 4096, 14336) == Plan("16x64s8", 2 if fast else 1)
            assert route(m, 4096, 14336, transposed=True) == Plan("16x64s8", 2 if fast else 1)
            assert route(m, 10240, 8192) == (Plan("16x128s6") if fast else Plan("16x128"))
        assert route(1, 57344, 8192) == (Plan("16x128s6") if fast else "gemv")
        assert route(8, 57344, 8192) == (Plan("16x128s6") if fast else Plan("16x128", 4))
        assert route(16, 57344, 8192) == (Plan("16x128s6") if fast else Plan("16x128"))
        if not fast:
            assert route(17, 4096, 14336) == Plan("16x64s8")
            assert route(17, 57344, 8192) == hopper.Plan(1, 128, 9, 1, False, 0, 1)


def test_persistent_width_fills_the_waves():
    """The persistent kernel's tile width per shape (132 SMs), as the H100 measured it
    (bench/gemm_plans.py --set w33): 192 at M = 512 of N = 6144 (one wave of 128 tiles, 0.97x
    cuBLAS, where 128 x 128 tiles make 1.45 waves, 0.78x), 160 at M = 256 of 10240 (1.05x,
    against 0.74x), 224 at M = 512 of 28672, 256 for 2048 x 2048."""
    from kaio_ops.linear import WIDTHS, persistent_width

    got = {(m, n): persistent_width(m, n, 132) for m, n in
           ((512, 6144), (256, 10240), (512, 28672), (2048, 2048), (8192, 8192))}  # fmt: skip
    assert got == {(512, 6144): 192, (256, 10240): 160, (512, 28672): 224, (2048, 2048): 256,
                   (8192, 8192): 256}  # fmt: skip
    assert all(persistent_width(m, 4096, 132) in WIDTHS for m in (128, 1000, 8192))


def test_hopper_plans_fit_over_the_llm_sweep():
    """Every plan of the bench sweep's shapes (H100/H200 SM counts) fits shared memory, gives
    each K slice at least 4 steps and fills at least half the multiprocessors when the shape
    allows it."""
    shapes = [
        (6144, 4096),
        (4096, 4096),
        (28672, 4096),
        (4096, 14336),
        (10240, 8192),
        (8192, 8192),
        (57344, 8192),
        (8192, 28672),
    ]  # fmt: skip  (Llama-3 8B, 70B)
    for sms in (114, 132):
        for n, k in shapes:
            for m in (1 << i for i in range(14)):
                for gate in (False, True):
                    wg, bn, stages, split, *_ = hopper.plan(m, n, k, sms, gate)
                    assert hopper.shared_bytes(wg, bn, stages, gate) <= hopper.SHARED_LIMIT
                    assert stages >= 2 and 1 <= split <= 16 and k // split >= 4 * hopper.BK
                    assert bn <= (128 if gate else 256)
                    blocks = -(-m // (64 * wg)) * -(-n // bn) * split
                    assert blocks >= min(sms // 2, -(-m // (64 * wg)) * -(-n // 64))


def test_measured_table_is_well_formed():
    """linear.MEASURED: M limits increasing, each choice (both of a ``ByMemory``) a kernel
    the router knows (or "rules"), each Hopper or stream-K plan fitting shared memory, a K
    split with at least 4 steps of K a slice."""
    from kaio_ops.linear import MEASURED, ByMemory

    for (n, k, layout), entries in MEASURED.items():
        assert layout in ("kn", "nk", "gate")
        limits = [most for most, _ in entries]
        assert limits == sorted(set(limits)), (n, k, layout)
        choices = [c for _, e in entries for c in (e if isinstance(e, ByMemory) else (e,))]
        for choice in choices:
            if isinstance(choice, hopper.Plan):
                gate = layout == "gate"
                size = hopper.shared_bytes(choice.wg, choice.bn, choice.stages, gate, choice.vec)
                assert size <= hopper.SHARED_LIMIT
                assert choice.vec in (0, 1, 2) and (not choice.vec or choice.split == 1)
                assert k // choice.split >= 4 * hopper.BK
                assert not choice.fixup or hopper.fixup_ok(n)
            elif isinstance(choice, Plan):  # an mma.sync plan
                linear_mod = importlib.import_module("kaio_ops.linear")
                assert linear_mod.mma_config(choice.config).bm in (16, 32, 64, 128)
                assert choice.split >= 1
            elif type(choice).__name__ == "Plan":  # a _gemv.Plan
                assert choice.split >= 1 and layout != "gate"
            elif isinstance(choice, Persistent):  # the persistent kernel (plain matmul)
                from kaio_ops import _matmul_hopper

                assert layout == "kn" and choice.pair in (0, 1) and choice.group >= 1
                assert choice.bn % 16 == 0 and 128 <= choice.bn <= _matmul_hopper.MAX_BN
                stages = _matmul_hopper.stages_for(choice.bn)
                assert stages >= 3 and _matmul_hopper.shared_bytes(choice.bn, stages) <= (
                    hopper.SHARED_LIMIT
                )
            elif isinstance(choice, streamk.Plan):
                gate = layout == "gate"
                assert streamk.shared_bytes(choice.wg, choice.bn, choice.stages, gate) <= (
                    streamk.SHARED_LIMIT
                )
            else:
                assert choice in ("gemv", "mma.sync", "persistent", "rules"), choice
                assert choice != "persistent" or layout == "kn"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda a: kaio_ops.matmul(a, a.astype(np.float32)), "'b' must be a 2-D array"),
        (lambda a: kaio_ops.matmul(a, a), "'b' must have K = 8 rows"),
        (lambda a: kaio_ops.matmul(a.astype(np.float32), a.T), "'a' must be a 2-D array"),
        (lambda a: kaio_ops.matmul(a, a.T.copy(), out_dtype="int8"), "'out_dtype' must be"),
        (lambda a: kaio_ops.linear(a, a[:, :4].copy()), "'w' must be \\[N, K\\] with K = 8"),
        (lambda a: kaio_ops.linear(a, a, activation="relu"), "'activation' must be None"),
        (lambda a: kaio_ops.linear(a, a[:3].copy(), activation="silu_gate"), "odd"),
        (lambda a: kaio_ops.linear(a, a, np.ones(3, np.float16)), "'bias' must have shape"),
        (
            lambda a: kaio_ops.linear(a, a, residual=np.ones((4, 5), np.float32)),
            "'residual' must have shape",
        ),
    ],
)
def test_bad_inputs_name_the_argument(call, message):
    a = np.ones((4, 8), np.float16)
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        call(a)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_specialization_assembles(arch):
    specs = specializations()
    texts = [(specs[i][0].ptx(arch=arch, **specs[i][1]), arch) for i in covering(specs)]
    if arch == "sm_90":  # the Hopper kernel: wgmma is sm_90a, and must stay asynchronous
        wgmma = hopper.specializations()
        texts += [(wgmma[i][0].ptx(arch=arch, **wgmma[i][1]), "sm_90a") for i in covering(wgmma)]
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda job: assemble(*job), texts))
    for report in reports:
        assert "C7518" not in report and "C7508" not in report, report


# ---------------------------------------------------------------------------- GPU
def _torch_reference(torch, x, w, bias, residual, activation, out_dtype):
    """The float64 torch reference of the GPU tests."""

    def up(t):
        return None if t is None else t.double()

    return torch_linear_reference(up(x), up(w), up(bias), up(residual), activation)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 64, 300, 2048])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("out", [None, "float32"])
def test_gpu_matmul_against_torch(m, dtype, out):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    gen = torch.Generator("cuda").manual_seed(m)
    n, k = 1000, 4104
    a = torch.randn(m, k, generator=gen, device="cuda").to(dt)
    b = torch.randn(k, n, generator=gen, device="cuda").to(dt)
    c = kaio_ops.matmul(a, b, out_dtype=None if out is None else getattr(torch, out))
    ref = a.double() @ b.double()
    assert c.dtype == (dt if out is None else torch.float32) and c.shape == (m, n)
    err = ((c.double() - ref).norm() / ref.norm()).item()
    assert err < (3e-3 if out is None else 1e-5), err
    again = kaio_ops.matmul(a, b, out_dtype=None if out is None else getattr(torch, out))
    assert torch.equal(c, again)  # deterministic, split K included


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 16])
@pytest.mark.parametrize("n, k", [(4096, 14336), (10240, 8192), (57344, 8192)])
def test_gpu_skinny_llm_shapes_against_torch(m, n, k):
    """The routes of the Llama-3 layers at M <= 16 (``MEASURED``; an H200 takes the ``fast``
    ones): ``matmul`` f16 and ``linear`` bf16 with gelu, bias and residual (4096 x 14336),
    against float64, the same bits twice."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator("cuda").manual_seed(m + n)
    a = torch.randn(m, k, generator=gen, device="cuda").half()
    w = (torch.randn(n, k, generator=gen, device="cuda") * k**-0.5).half()
    b = w.T.contiguous()
    c = kaio_ops.matmul(a, b)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 3e-3
    assert torch.equal(c, kaio_ops.matmul(a, b))
    if n == 4096:
        x, wb = a.bfloat16(), w.bfloat16()
        bias = torch.randn(n, generator=gen, device="cuda").bfloat16()
        res = torch.randn(m, n, generator=gen, device="cuda").bfloat16()
        y = kaio_ops.linear(x, wb, bias, residual=res, activation="gelu")
        ref = _torch_reference(torch, x, wb, bias, res, "gelu", torch.bfloat16)
        assert ((y.double() - ref).norm() / ref.norm()).item() < 8e-3
        assert torch.equal(y, kaio_ops.linear(x, wb, bias, residual=res, activation="gelu"))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu", "silu_gate"])
@pytest.mark.parametrize("m", [1, 16, 333, 4096])
def test_gpu_linear_epilogues_against_torch(activation, m):
    torch = pytest.importorskip("torch")
    gen = torch.Generator("cuda").manual_seed(m)
    k, n = 4096, 1032
    rows = 2 * n if activation == "silu_gate" else n
    dt = torch.bfloat16 if m % 2 else torch.float16
    x = torch.randn(m, k, generator=gen, device="cuda").to(dt)
    w = (torch.randn(rows, k, generator=gen, device="cuda") * 0.02).to(dt)
    bias = torch.randn(rows, generator=gen, device="cuda").to(dt)
    res = torch.randn(m, n, generator=gen, device="cuda").to(dt)
    y = kaio_ops.linear(x, w, bias, residual=res, activation=activation)
    ref = _torch_reference(torch, x, w, bias, res, activation, dt)
    assert y.dtype == dt and y.shape == (m, n)
    err = ((y.double() - ref).norm() / ref.norm()).item()
    assert err < (8e-3 if dt == torch.bfloat16 else 2e-3), err


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["hopper", "mma.sync"])
@pytest.mark.parametrize("m", [1, 64, 200, 1000])
def test_gpu_both_kernels_against_torch(path, m):
    """Each kernel forced, whatever the GPU picks by default (the Hopper one on sm_90 only):
    linear with every epilogue stage, f32 out to see the f32 accumulation's accuracy."""
    torch = pytest.importorskip("torch")
    from kaio_ops import _arrays

    if path == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernel needs sm_90")
    gen = torch.Generator("cuda").manual_seed(m)
    k, n = 2048, 520
    x = torch.randn(m, k, generator=gen, device="cuda").half()
    w = (torch.randn(2 * n, k, generator=gen, device="cuda") * 0.05).half()
    bias = torch.randn(2 * n, generator=gen, device="cuda").half()
    res = torch.randn(m, n, generator=gen, device="cuda")
    inputs = _arrays.Inputs("linear")
    ops = [inputs.array(t, name, ndim=(1, 2), dtypes=_arrays.FLOATS) for t, name in
           ((x, "x"), (w, "w"), (bias, "bias"), (res, "residual"))]  # fmt: skip
    chosen = "hopper" if path == "hopper" else plan(m, n, k, 132, gate=True)
    y = gemm("linear", ops[0], ops[1], (m, n), (m, n, k), kaio.f32, True, ops[2], ops[3],
             "silu_gate", chosen=chosen)  # fmt: skip
    ref = _torch_reference(torch, x, w, bias, res, "silu_gate", torch.float32)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.gpu
def test_gpu_linear_batched_f32_out():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 100, 512, device="cuda", dtype=torch.float16)
    w = torch.randn(768, 512, device="cuda", dtype=torch.float16) * 0.05
    y = kaio_ops.linear(x, w, out_dtype=torch.float32)
    ref = torch.nn.functional.linear(x.double(), w.double())
    assert y.shape == (2, 3, 100, 768) and y.dtype == torch.float32
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k, activation, chosen",
    [
        (1, 4096, 4096, "matmul", "gemv"),  # the skinny kernel, K split 8 ways or more
        (5, 2048, 1032, "matmul", "gemv"),
        (3, 4096, 4096, "silu_gate", "gemv"),  # the skinny kernel for W [N, K]
        (1, 1000, 14336, "gelu", "gemv"),
        (16, 1024, 4096, "gelu", hopper.Plan(1, 64, 6, 8, True)),  # sums in the kernel
        (5, 2048, 4096, "silu_gate", hopper.Plan(1, 128, 4, 4, True)),
        (200, 512, 8192, "matmul", hopper.Plan(2, 128, 4, 6, True)),
        (16, 1024, 4096, "silu_gate", Plan("16x128", 8)),  # mma.sync, summed in the kernel
        (3, 2048, 4096, "matmul", Plan("16x128", 4)),
        (1, 4096, 4096, "matmul", Plan("16x128", 4)),  # one row: summed in the kernel
        (13, 4096, 4096, "matmul", Plan("16x64s8", 1)),  # the deep skinny tile (sm_90 route)
        (30, 2000, 4104, "gelu", Plan("16x64s8", 3)),  # N and K tails: gemm_reduce
        (9, 1024, 8192, "gelu", Plan("16x128s8", 4)),
        (20, 4096, 4096, "silu", Plan("16x64s8", 1)),  # W [N, K] on the deep skinny tile
        (32, 8192, 8192, "matmul", Plan("32x64s8", 1)),  # 32-row tiles (the H200's routes)
        (29, 28672, 4096, "matmul", Plan("32x128s4", 1)),
        (24, 10240, 1024, "gelu", Plan("32x128s8", 1)),
        (40, 1000, 4104, "silu_gate", Plan("32x64s8", 2)),  # two row tiles, tails: reduce
        (27, 4096, 14336, "matmul", Plan("16x64s8", 2)),  # two row tiles, summed in kernel
        (1, 4096, 14336, "gelu", Plan("16x64s8", 2)),  # the H200's routes at M <= 16
        (16, 4096, 14336, "matmul", Plan("16x64s8", 2)),
        (7, 10240, 8192, "matmul", Plan("16x128s6", 1)),
        (16, 1000, 8200, "gelu", Plan("16x128s6", 2)),  # N and K tails: gemm_reduce
    ],
)
def test_gpu_split_sums_deterministic(m, n, k, activation, chosen, monkeypatch):
    """The K splits summed in the kernel at real sizes: right against torch in float64 and
    the same bits run to run."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(importlib.import_module("kaio_ops.linear"), "MMA_FIXUP", True)
    if isinstance(chosen, hopper.Plan) and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernel needs sm_90")
    runs, ref = forced_runs(torch, m, n, k, activation, chosen)
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    assert ((runs[0].double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k, activation, chosen",
    [
        (512, 6144, 4096, "matmul", hopper.Plan(2, 192, 5, 1, False)),  # widths off 64
        (300, 1000, 4104, "gelu", hopper.Plan(2, 160, 5, 2, True)),  # tails, split in kernel
        (64, 4096, 4096, "matmul", hopper.Plan(1, 32, 12, 2, True)),  # a deep ring
        (1024, 1024, 1024, "matmul", hopper.Plan(2, 64, 6, 1, False, 2)),  # pairs sharing A
        (333, 1000, 2048, "silu_gate", hopper.Plan(1, 128, 4, 1, False, 1)),  # sharing B
        (256, 10240, 1024, "matmul", Persistent(160)),  # the persistent kernel's widths
        (520, 6144, 1032, "matmul", Persistent(224, 4)),
        (1000, 2048, 2048, "matmul", Persistent(256, 8, 1)),  # pairs sharing B
        (512, 10240, 1024, "matmul", Persistent(320, 8, 1)),  # 256 + 64 columns, 384 threads
        (700, 1000, 1032, "matmul", Persistent(320)),  # tails in M, N (a 40-column tile), K
        (64, 6144, 4096, "matmul", hopper.Plan(1, 64, 12, 1, False, 0, 1)),  # routes, wide
        (128, 28672, 1024, "matmul", hopper.Plan(2, 256, 4, 1, False, 0, 1)),  # stores
        (1000, 1000, 1024, "matmul", hopper.Plan(2, 64, 8, 1, False, 0, 1)),  # wide stores
        (200, 6144, 4096, "matmul", hopper.Plan(1, 192, 7, 1, False, 0, 1)),  # issue 33's
        (250, 8192, 2048, "matmul", hopper.Plan(2, 128, 6, 1, False, 0, 1)),  # seventh pass's
        (256, 10240, 1024, "matmul", hopper.Plan(2, 192, 5, 1, False, 0, 1)),  # routes
        (1000, 1000, 1024, "matmul", hopper.Plan(2, 64, 6, 1, False, 0, 2)),  # through shared
        (300, 1000, 1032, "gelu", hopper.Plan(2, 256, 4, 1, False, 0, 3)),  # fused epilogue,
        (333, 1000, 2048, "silu_gate", hopper.Plan(2, 128, 4, 1, False, 0, 4)),  # loads first
        (600, 1000, 1032, "gelu", Persistent(256)),  # the persistent kernel: B [N, K], the
        (1000, 2048, 2048, "silu", Persistent(320, 8, 1)),  # fused epilogue
        (1000, 2048, 2048, "matmul", Persistent(256, 8, 0, 2)),  # the second warpgroup behind
        (250, 4096, 4096, "gelu", hopper.Plan(2, 64, 9, 1, False)),  # the H200's deeper
        (100, 8192, 2048, "matmul", hopper.Plan(2, 64, 9, 1, False, 0, 1)),  # rings
    ],
)
def test_gpu_hopper_tiles_against_torch(m, n, k, activation, chosen):
    """The Hopper kernels' tile widths, deep rings and pairs at real sizes: right against
    torch in float64 (f32 out) and the same bits run to run."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernels need sm_90")
    runs, ref = forced_runs(torch, m, n, k, activation, chosen, times=2)
    assert torch.equal(runs[0], runs[1])
    assert ((runs[0].double() - ref).norm() / ref.norm()).item() < 1e-5


def forced_runs(torch, m, n, k, activation, chosen, dt=None, times=3):
    """``gemm`` on the GPU with a forced plan ``chosen``, ``times`` times on the same random
    inputs (dt: default f16; f32 out; "matmul": B [K, N], else ``linear`` with bias, that
    activation and a residual of type dt): (the results, the float64 torch reference)."""
    dt = dt or torch.float16
    gen = torch.Generator("cuda").manual_seed(m + n)
    rows = 2 * n if activation == "silu_gate" else n
    transposed = activation != "matmul"
    x = torch.randn(m, k, generator=gen, device="cuda").to(dt)
    w = (torch.randn(rows, k, generator=gen, device="cuda") * 0.02).to(dt)
    bias = torch.randn(rows, generator=gen, device="cuda").to(dt) if transposed else None
    res = torch.randn(m, n, generator=gen, device="cuda").to(dt) if transposed else None
    wt = w if transposed else w.T.contiguous()
    inputs = kaio_ops._arrays.Inputs("test")
    args = [inputs.array(x, "x", ndim=2), inputs.array(wt, "w", ndim=2), (m, n), (m, n, k)]
    args += [kaio.f32, transposed]
    if transposed:
        args += [inputs.array(bias, "bias", ndim=1), inputs.array(res, "res", ndim=2), activation]
    runs = [gemm("linear", *args, chosen=chosen) for _ in range(times)]
    if transposed:
        ref = torch_linear_reference(x.double(), w.double(), bias.double(), res.double(),
                                     activation)  # fmt: skip
    else:
        ref = x.double() @ wt.double()
    return runs, ref


def test_gate_caps_tiles_whose_two_rings_would_not_fit():
    """ "silu_gate" reads two weights: a measured plan's tile is capped to one whose two B
    rings fit in shared memory (the deep 16x128 ring would need 272 KB)."""
    linear = importlib.import_module("kaio_ops.linear")
    assert linear._capped(Plan("16x128s8", 4), True) == Plan("16x64s8", 4)
    assert linear._capped(Plan("128x256", 2), True) == Plan("64x128", 2)
    assert linear._capped(Plan("16x128s8", 4), False) == Plan("16x128s8", 4)
    for config, capped in linear.GATE_CONFIG.items():
        wide, narrow = linear.mma_config(config), linear.mma_config(capped)
        assert narrow.bn * narrow.bm <= wide.bn * wide.bm
    for config in linear.SKINNY_CONFIGS:  # each deep ring's gate form fits (A, gate and up)
        cfg = linear.mma_config(linear._capped(Plan(config), True).config)
        assert cfg.stages * (cfg.bm + 2 * cfg.bn) * cfg.bk * 2 + 32 <= hopper.SHARED_LIMIT
