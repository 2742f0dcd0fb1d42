"""kaio_ops.quantize_fp8 and kaio_ops.matmul_fp8: the simulator against independent NumPy
references (float64 for the matmul, torch's recipe in f32 for quantization, and torch itself
where installed), their PTX assembled by ptxas, their errors; on a GPU (``gpu`` marker)
against torch and ``torch._scaled_mm``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _fp8, _fp8_decode
from tests.harness import covering

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
NP_FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
LIMIT = {"e4m3": 448.0, "e5m2": 57344.0}


def inverse_limit(name: str) -> np.float32:
    """1 / fp8_max rounded to f32: torch on CUDA computes ``amax / fp8_max`` (a Python number
    divisor) as ``amax * inverse_limit``."""
    return np.float32(1) / np.float32(LIMIT[name])


def quantize_reference(x: np.ndarray, name: str, per: str):
    """torch's recipe in NumPy f32, with torch's CUDA arithmetic: amax, clamp(min=1e-12) *
    f32(1 / fp8_max), x / scale, RNE with saturation (ml_dtypes after a clip)."""
    x32 = x.astype(np.float32)
    ax = np.abs(x32)
    amax = ax.max(axis=-1, keepdims=True) if per == "row" else ax.max().reshape(1)
    scale = np.maximum(amax, np.float32(1e-12)) * inverse_limit(name)
    y = x32 / scale
    q = np.clip(y, -LIMIT[name], LIMIT[name]).astype(NP_FP8[name])
    return q, scale.astype(np.float32)


def _inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))  # wide magnitudes
    x = x.astype(np.float32)
    x.reshape(-1, shape[-1])[1] = 0.0  # an all-zero row: the 1e-12 floor
    return x.astype(dtype)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
@pytest.mark.parametrize("per", ["tensor", "row"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=str)
def test_quantize_sim(name, per, dtype):
    x = _inputs((3, 4, 70), dtype)
    with kaio.simulate():
        q, scale = kaio_ops.quantize_fp8(x, dtype=name, per=per)
    rq, rs = quantize_reference(x, name, per)
    assert q.dtype == NP_FP8[name] and q.shape == x.shape
    assert scale.shape == ((3, 4, 1) if per == "row" else (1,)) and scale.dtype == np.float32
    assert np.array_equal(scale.view(np.uint32), rs.view(np.uint32))
    assert np.array_equal(q.view(np.uint8), rq.view(np.uint8))
    assert np.count_nonzero(q.view(np.uint8)) > x.size // 2  # not a trivially zero answer


def test_quantize_matches_torch():
    """Against torch's lines, the scale with torch's CUDA arithmetic (the CPU torch here
    divides by fp8_max where CUDA torch multiplies by its f32 reciprocal)."""
    torch = pytest.importorskip("torch")
    x = _inputs((6, 96), np.float32, seed=3)
    for name, tdt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        for per in ("tensor", "row"):
            with kaio.simulate():
                q, scale = kaio_ops.quantize_fp8(x, dtype=tdt, per=per)
            tx = torch.from_numpy(x)
            amax = tx.abs().amax() if per == "tensor" else tx.abs().amax(-1, keepdim=True)
            ts = amax.float().clamp(min=1e-12) * torch.tensor(inverse_limit(name))
            tq = (tx.float() / ts).to(tdt)
            assert np.array_equal(q.view(np.uint8), tq.view(torch.uint8).numpy())
            assert np.array_equal(scale.reshape(ts.shape), ts.numpy())


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_quantize_scale_is_reciprocal_product(name):
    """Regression: the scale is amax * f32(1 / fp8_max) (torch on CUDA), not amax / fp8_max;
    amax 155 is one where the two differ in the last bit (the GPU test found it)."""
    x = np.zeros((2, 32), np.float32)
    x[:, 3] = [155.0, -36.25]
    want = np.array([155.0, 36.25], np.float32) * inverse_limit(name)
    divided = np.array([155.0, 36.25], np.float32) / np.float32(LIMIT[name])
    assert not np.array_equal(want, divided)  # the case tells the two apart
    with kaio.simulate():
        _, scale = kaio_ops.quantize_fp8(x, dtype=name, per="row")
        _, st = kaio_ops.quantize_fp8(x[:1], dtype=name)
    assert np.array_equal(scale.reshape(-1).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(st.view(np.uint32), want[:1].view(np.uint32))


def test_quantize_nan_propagates():
    x = _inputs((2, 40), np.float32)
    x[0, 5] = np.nan
    with kaio.simulate():
        q, scale = kaio_ops.quantize_fp8(x, per="row")
        qt, st = kaio_ops.quantize_fp8(x)
    assert np.isnan(scale[0, 0]) and np.isfinite(scale[1, 0]) and np.isnan(st[0])
    assert (q.view(np.uint8)[0] == 0x7F).all() and (qt.view(np.uint8) == 0x7F).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "e3m4"}, "dtype must be one of"),
        ({"per": "column"}, "per must be"),
    ],
)
def test_quantize_errors(kwargs, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        kaio_ops.quantize_fp8(np.ones((2, 16), np.float32), **kwargs)
    with kaio.simulate(), pytest.raises(ValueError, match="has no elements"):
        kaio_ops.quantize_fp8(np.ones((0, 16), np.float32))
    with kaio.simulate(), pytest.raises(ValueError, match="must be .* of f32, f16 or bf16"):
        kaio_ops.quantize_fp8(np.ones((2, 16), np.int32))


def matmul_reference(a, b, sa, sb, bias=None):
    """float64 (a @ b) * sa * sb + bias: exact products; the sums differ from the kernel's
    f32 accumulation by far less than the tolerances below."""
    r = a.astype(np.float64) @ b.astype(np.float64)
    r = r * np.asarray(sa, np.float64).reshape(-1, 1) * np.asarray(sb, np.float64).reshape(1, -1)
    return r if bias is None else r + bias.astype(np.float64)


def _fp8_operands(m, k, n, name, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * 8).astype(NP_FP8[name])
    w = (rng.standard_normal((n, k)) * 8).astype(NP_FP8[name])  # an nn.Linear weight
    return a, w


@pytest.mark.parametrize(
    "name, layout, scales, out, with_bias, k",
    [
        ("e4m3", "col", "row", "bf16", True, 128),  # two k tiles (the double buffer)
        ("e5m2", "row", "tensor", "f32", False, 96),  # a partial last k tile
        ("e4m3", "row", "tensor", "f16", True, 48),  # one partial k tile
    ],
)
def test_matmul_sim(name, layout, scales, out, with_bias, k):
    m, n = 20, 32  # a partial tile of rows and of columns
    a, w = _fp8_operands(m, k, n, name, seed=hash((name, layout)) % 1000)
    b = w.T if layout == "col" else np.ascontiguousarray(w.T)
    rng = np.random.default_rng(5)
    if scales == "row":
        sa = rng.uniform(0.5, 2, (m, 1)).astype(np.float32)
        sb = rng.uniform(0.5, 2, (1, n)).astype(np.float32)
    else:
        sa, sb = np.array([0.75], np.float32), np.array([1.5], np.float32)
    np_out = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[out]
    bias = rng.standard_normal(n).astype(np_out) * 10 if with_bias else None
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, b, sa, sb, out_dtype=out, bias=bias)
    ref = matmul_reference(a, b, sa, sb, bias)
    assert got.dtype == np_out and got.shape == (m, n)
    # the f32 sum (< 1e-6 relative) then one rounding to the output type
    eps = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-20}[out]
    bound = (
        np.abs(ref) * eps
        + 1e-6
        * np.abs(
            matmul_reference(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)), sa, sb)
        )
        + 1e-3
    )
    assert np.all(np.abs(got.astype(np.float64) - ref) <= bound)
    assert np.abs(ref).max() > 100  # a real product


@pytest.mark.parametrize(
    "m, n, k, name, scales, out, with_bias",
    [
        (1, 48, 160, "e4m3", "tensor", "bf16", False),  # K: 10 pieces of 16, a partial step
        (3, 32, 528, "e5m2", "both", "f32", True),
        (4, 16, 1056, "e4m3", "row", "f16", True),  # K past one step of the 32 lanes
    ],
)
def test_decode_rows_one_launch_sim(m, n, k, name, scales, out, with_bias, monkeypatch):
    """Up to ``_fp8_decode.MOST_M`` rows with a column-major b: one launch of ``gemv_fp8``
    (no K split, no second kernel), against float64 within one rounding; a row-major b
    (transposed first) gives the same bits."""
    from kaio_ops import _fp8_decode
    from tests.launches import launched

    a, w = _fp8_operands(m, k, n, name, seed=m + k)
    rng = np.random.default_rng(n)
    sa = rng.uniform(0.5, 2, (m, 1) if scales in ("row", "both") else (1,)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (1, n) if scales == "both" else (1,)).astype(np.float32)
    np_out = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[out]
    bias = (rng.standard_normal(n) * 10).astype(np_out) if with_bias else None
    monkeypatch.setattr(_fp8_decode, "MAX_M", _fp8_decode.MOST_M)  # routed: fewer rows
    kernels = launched(monkeypatch)
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, w.T, sa, sb, out_dtype=out, bias=bias)
        assert kernels == [_fp8_decode.gemv_fp8]
        again = kaio_ops.matmul_fp8(a, np.ascontiguousarray(w.T), sa, sb, out_dtype=out,
                                    bias=bias)  # fmt: skip
    assert got.dtype == np_out and got.shape == (m, n)
    np.testing.assert_array_equal(got.view(np.uint8), again.view(np.uint8))
    ref = matmul_reference(a, w.T, sa, sb, bias)
    eps = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-20}[out]
    mag = matmul_reference(np.abs(a.astype(np.float64)), np.abs(w.T.astype(np.float64)), sa, sb)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= np.abs(ref) * eps + 1e-6 * mag + 1e-3)
    assert np.abs(ref).max() > 100


@pytest.mark.parametrize("hopper", [True, False])
def test_one_row_route_sim(hopper, monkeypatch):
    """One row of a: on an sm_90 the wgmma kernel's swapped tiles (faster than ``gemv_fp8``
    there: docs/performance.md), elsewhere ``gemv_fp8``; both against float64."""
    from kaio_ops import _fp8_hopper, fp8
    from tests.launches import launched

    monkeypatch.setattr(fp8, "HOPPER_IN_SIMULATOR", hopper)
    a, w = _fp8_operands(1, 256, 64, "e4m3", seed=7)
    sa, sb = np.float32([0.75]), np.float32([1.5])
    kernels = launched(monkeypatch)
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, w.T, sa, sb)
    want = _fp8_hopper.matmul_fp8_wgmma if hopper else _fp8_decode.gemv_fp8
    assert kernels == [want]
    ref = matmul_reference(a, w.T, sa, sb)
    got64 = got.astype(np.float64)
    assert np.all(np.abs(got64 - ref) <= np.abs(ref) * 2.0**-8 + 1e-3)
    assert np.abs(ref).max() > 100


def test_matmul_hopper_kernel_sim(monkeypatch):
    """The sm_90 kernel (TMA, wgmma k32, the persistent grid) on the simulator: e5m2, per-row
    scale_a, bias, f32 out; K = 160 is two k slices, the second partial; M and N partial."""
    from kaio_ops import fp8

    monkeypatch.setattr(fp8, "HOPPER_IN_SIMULATOR", True)
    m, k, n = 130, 160, 48
    a, w = _fp8_operands(m, k, n, "e5m2", seed=4)
    rng = np.random.default_rng(6)
    sa = rng.uniform(0.5, 2, (m, 1)).astype(np.float32)
    sb = np.array([0.5], np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, w.T, sa, sb, out_dtype="f32", bias=bias)
    ref = matmul_reference(a, w.T, sa, sb, bias)
    scale = matmul_reference(np.abs(a.astype(np.float64)), np.abs(w.T.astype(np.float64)), sa, sb)
    assert np.all(np.abs(got - ref) <= 1e-6 * scale + 1e-5 * np.abs(ref))
    assert np.abs(ref).max() > 100


@pytest.mark.parametrize(
    "plan, m, n, k, scales, out",
    [
        ((2, 128, 3, 2, 1), 130, 48, 384, "row", "f32"),  # double sums, odd number of slices
        ((2, 256, 2, 3, 1), 70, 272, 256, "col", "bf16"),  # 256-wide halves, 2 tiles of N
        ((2, 128, 2, 1, 0), 20, 160, 128, "tensor", "f16"),  # one sum waited for; pair stores
        ((1, 32, 4, 2, 1), 9, 112, 512, "both", "bf16"),  # decode: 64-row tiles, 4 a block
        ((1, 64, 2, 2, 0), 64, 80, 128, "row", "f32"),  # one slice, a partial N tile
        ((2, 128, 2, 2, 1, 2), 300, 272, 384, "both", "bf16"),  # clusters of two, multicast B
        ((2, 64, 3, 2, 1, 1, 1, 1, 0, 0, 8, 1), 130, 208, 384, "both", "bf16"),  # 64 rows, two
        ((2, 128, 3, 1, 3, 1, 1, 1, 0, 0, 8, 1), 70, 272, 256, "row", "f16"),  # halves (NS)
        ((2, 64, 3, 2, 1, 1, 1, 1, 0, 0, 8, 2), 100, 208, 640, "row", "f16"),  # odd K slices
        ((2, 128, 3, 1, 1, 1, 1, 1, 0, 0, 8, 2), 70, 272, 384, "col", "bf16"),  # one sum each
        ((2, 48, 5, 1, 1, 1, 1, 1, 0, 0, 8, 2), 5, 208, 640, "both", "f16"),  # 8 A rows copied
        ((2, 64, 3, 1, 1, 1, 1, 1, 0, 0, 8, 1), 20, 144, 384, "row", "bf16"),  # 32, halves
        ((3, 96, 2, 2, 1), 200, 208, 256, "row", "f16"),  # three consumer warpgroups
        ((2, 128, 3, 4, 1), 260, 144, 384, "col", "bf16"),  # warpgroups issuing in turn
        ((1, 64, 3, 2, 1, 1, 3), 20, 192, 640, "both", "f16"),  # last tile split 3 ways
        ((2, 192, 2, 1, 1, 1, 2), 100, 176, 384, "row", "bf16"),  # 1 tile, 2 blocks: K split
        ((2, 192, 2, 1, 2), 200, 432, 256, "both", "f16"),  # C through shared, bulk copies
        ((2, 200, 2, 1, 3), 200, 432, 256, "row", "bf16"),  # copies waited for later; 25 n8s
        ((2, 200, 2, 1, 1), 130, 416, 256, "both", "f32"),  # 25 n8s from registers
        ((2, 128, 3, 21, 1), 130, 144, 640, "row", "bf16"),  # promoted every 2, staggered
        ((2, 128, 3, 5, 1), 70, 144, 384, "both", "f16"),  # halves, one in flight
        ((2, 128, 3, 6, 1), 130, 144, 640, "row", "f16"),  # two full sums, one in flight
        ((1, 112, 3, 2, 1), 5, 240, 384, "col", "f32"),  # a decode width (8 A rows copied)
        ((1, 32, 4, 40, 1), 9, 96, 768, "col", "f32"),  # every 4 (6 slices: a short interval)
        ((1, 16, 9, 2, 1, 1, 1, 2), 3, 96, 1152, "both", "bf16"),  # 2 blocks an SM, deep ring
        ((1, 32, 5, 2, 1, 1, 2, 2), 12, 64, 768, "row", "f16"),  # 2 blocks an SM, K split
        ((1, 32, 5, 2, 1, 1, 2, 1, 1), 12, 96, 768, "col", "bf16"),  # split summed in kernel
        ((1, 16, 4, 2, 1, 1, 3, 2, 1), 20, 96, 1152, "both", "f32"),  # the same, 3 parts
        ((2, 48, 3, 7, 1, 1, 3), 100, 96, 384, "both", "bf16"),  # mode 7 split: as 1
    ],
)
def test_hopper_plans_sim(plan, m, n, k, scales, out, monkeypatch):
    """Every tile shape and accumulation mode of the sm_90 kernel on the simulator, two
    persistent blocks (several tiles each, the ring running across tiles), against float64:
    per-tensor, per-row and per-column scales, bias, the output types, M and N edges."""
    _check_plan_sim(plan, m, n, k, scales, out, monkeypatch)


def test_split_of_a_200_column_tile_sim(monkeypatch):
    """The K split of a 128 x 200 tile (25 n8 tiles: the workspace's last 8 columns stored a
    pair a lane, ``_matmul_hopper.store_pair``; before, left unwritten), three persistent
    blocks: the last of four tiles, a full-width one, split in two and added by
    ``sum_parts``."""
    _check_plan_sim((2, 200, 2, 1, 3, 1, 2), 130, 400, 384, "col", "bf16", monkeypatch, sms=3)


def _check_plan_sim(plan, m, n, k, scales, out, monkeypatch, sms=2):
    """``plan`` at ``m x n x k`` on ``sms`` persistent blocks of the simulator against
    float64 (``scales``: per tensor, row, column or both; bias; ``out`` the output type)."""
    from kaio_ops import fp8

    monkeypatch.setattr(fp8, "HOPPER_IN_SIMULATOR", True)
    calls = _force_plan(monkeypatch, plan, sms)
    a, w = _fp8_operands(m, k, n, "e4m3", seed=m + n)
    rng = np.random.default_rng(k)
    sa = rng.uniform(0.5, 2, (m, 1) if scales in ("row", "both") else (1,)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (1, n) if scales in ("col", "both") else (1,)).astype(np.float32)
    np_out = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[out]
    bias = (rng.standard_normal(n) * 10).astype(np_out)
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, w.T, sa, sb, out_dtype=out, bias=bias)
    assert calls == [1]
    ref = matmul_reference(a, w.T, sa, sb, bias)
    eps = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-20}[out]
    mag = matmul_reference(np.abs(a.astype(np.float64)), np.abs(w.T.astype(np.float64)), sa, sb)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= np.abs(ref) * eps + 1e-6 * mag + 1e-3)
    assert np.abs(ref).max() > 100


@pytest.mark.parametrize(
    "plan, m, n, k, out",
    [
        ((2, 64, 3, 7, 1), 200, 144, 384, "bf16"),  # inside tiles carried, edge tiles not
        ((2, 32, 2, 7, 1), 256, 96, 128, "f32"),  # one slice a tile: every slice carried
    ],
)
def test_carried_slice_sim(plan, m, n, k, out, monkeypatch):
    """``PROMOTE`` 7 (per-tensor scales, no bias: the next tile's first slice multiplied
    during the epilogue, ``carry_slice``) on the simulator, two persistent blocks of several
    tiles each, against float64."""
    from kaio_ops import fp8

    monkeypatch.setattr(fp8, "HOPPER_IN_SIMULATOR", True)
    calls = _force_plan(monkeypatch, plan)
    a, w = _fp8_operands(m, k, n, "e4m3", seed=k)
    sa, sb = np.float32([0.75]), np.float32([1.5])
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, w.T, sa, sb, out_dtype=out)
    assert calls == [1]
    ref = matmul_reference(a, w.T, sa, sb)
    eps = {"bf16": 2.0**-8, "f32": 2.0**-20}[out]
    mag = matmul_reference(np.abs(a.astype(np.float64)), np.abs(w.T.astype(np.float64)), sa, sb)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= np.abs(ref) * eps + 1e-6 * mag + 1e-3)
    assert np.abs(ref).max() > 100


def _force_plan(monkeypatch, plan, sms=2) -> list:
    """Make ``_fp8_hopper.launch`` run ``plan`` on ``sms`` persistent blocks; the list it
    returns gets a 1 per launch."""
    from kaio_ops import _fp8_hopper

    calls = []
    launch = _fp8_hopper.launch

    def forced(*args, like=None):
        calls.append(1)
        launch(*args[:12], sms, args[13], plan, like=like)

    monkeypatch.setattr(_fp8_hopper, "launch", forced)
    return calls


@pytest.mark.parametrize(
    "plan, m, n, k, scales, out, name",
    [
        ((1, 8, 4, 2, 1, 1, 1, 1, 0, 1), 1, 112, 384, "tensor", "bf16", "e4m3"),  # M = 1
        ((1, 8, 4, 2, 1, 1, 1, 1, 0, 1), 13, 208, 512, "row", "f32", "e5m2"),  # 2 column tiles
        ((1, 16, 5, 2, 1, 1, 2, 2, 0, 1), 16, 96, 768, "col", "f16", "e4m3"),  # K split, OCC 2
        ((2, 8, 4, 2, 1, 1, 1, 1, 0, 1), 3, 272, 384, "both", "bf16", "e5m2"),  # 128-row tiles
        ((1, 32, 3, 2, 1, 1, 3, 1, 1, 1), 30, 144, 640, "both", "bf16", "e4m3"),  # 3 parts
        ((2, 16, 3, 1, 1, 1, 2, 1, 0, 1), 9, 128, 512, "row", "f16", "e4m3"),  # split, 2 WG
        ((2, 8, 4, 2, 1, 1, 1, 2, 0, 1, 8, 2), 5, 144, 640, "both", "bf16", "e4m3"),  # NS 2
        ((2, 16, 4, 1, 1, 1, 1, 1, 0, 1, 8, 2), 12, 144, 640, "row", "f16", "e5m2"),  # 1 sum
        ((1, 8, 4, 1, 1, 1, 1, 2, 0, 1), 7, 208, 640, "both", "bf16", "e4m3"),  # 1 sum, OCC 2
        ((1, 16, 4, 2, 1, 2, 1, 1, 0, 1), 11, 400, 640, "both", "bf16", "e4m3"),  # CL 2
    ],
)
def test_swapped_plans_sim(plan, m, n, k, scales, out, name, monkeypatch):
    """The swapped tiles (``SWAP``: C^T = B^T A^T, the weights as the wgmma's 64-row operand,
    a's rows its columns, stored transposed by ``store_transposed``) on the simulator against
    float64: M = 1 and partial column tiles of a's rows, N tails (partial 64-row weight
    tiles), K splits summed in the kernel, per-tensor, per-row and per-column scales, bias,
    e4m3 and e5m2, every output type."""
    from kaio_ops import fp8

    monkeypatch.setattr(fp8, "HOPPER_IN_SIMULATOR", True)
    monkeypatch.setattr(_fp8_decode, "MAX_M", 0)  # (M = 1 on the wgmma kernel)
    calls = _force_plan(monkeypatch, plan)
    maps = []  # the rows of the arrays the tensor maps cover: the weights' first when swapped
    tensor_map_2d = kaio.tensor_map_2d
    monkeypatch.setattr(
        kaio, "tensor_map_2d", lambda arr, *r: maps.append(arr.shape[0]) or tensor_map_2d(arr, *r)
    )
    a, w = _fp8_operands(m, k, n, name, seed=m + n)
    rng = np.random.default_rng(k)
    sa = rng.uniform(0.5, 2, (m, 1) if scales in ("row", "both") else (1,)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (1, n) if scales in ("col", "both") else (1,)).astype(np.float32)
    np_out = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[out]
    bias = (rng.standard_normal(n) * 10).astype(np_out)
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(a, w.T, sa, sb, out_dtype=out, bias=bias)
    assert calls == [1] and maps == [n, m]
    ref = matmul_reference(a, w.T, sa, sb, bias)
    eps = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-20}[out]
    mag = matmul_reference(np.abs(a.astype(np.float64)), np.abs(w.T.astype(np.float64)), sa, sb)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= np.abs(ref) * eps + 1e-6 * mag + 1e-3)
    assert np.abs(ref).max() > 100


def test_split_of_the_last_wave():
    """The K split splits only the last partial wave's tiles, into the parts that make it
    shortest: 4096^3 in 128 x 192 tiles is 704 tiles on 132 multiprocessors, 5 whole waves
    and 44 tiles split 3 ways (132 parts: one more round of a third of a tile); tiles that
    fill whole waves are not split; fewer tiles than multiprocessors are all split."""
    from kaio_ops import _fp8_hopper as H

    assert (H.split_parts(704, 132, 32), H.split_from(704, 132, 3)) == (3, 660)
    assert H.split_parts(528, 132, 32) == 1 and H.split_from(528, 132, 3) == 528
    assert (H.split_parts(32, 132, 32), H.split_from(32, 132, 4)) == (4, 0)
    assert H.split_parts(32, 132, 4) == 2  # two slices a part at least
    assert H.split_parts(250, 132, 64) == 1  # 118 tiles left: a split saves nothing
    assert H.split_from(704, 132, 1) == 704


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("sms", [132, 114, 78])
def test_config_plans_fit(sms, fast):
    """Every plan ``config`` picks over the M sweep (1..8192) at the Llama-3 shapes fits: its
    ring in shared memory (beside the epilogue's buffers where C goes through shared
    memory: two consumer warpgroups, 128 to 224 columns), a promotion mode its registers
    hold (two warpgroups on every other K slice: one slice sum waited for each), a
    K split only with one block a tile and two slices a part; on an H100's 132
    multiprocessors 4096^3 and 8192^3 take tiles of 192 columns or more (faster than 128 x
    128 tiles there: the H100 rounds' sweep, docs/performance.md), and 256 x 4096 x K two
    warpgroups' 64 x 128 tiles on every other K slice; for either memory speed (``fast``)."""
    from kaio_ops import _fp8_hopper as H

    for m in [1 << i for i in range(14)] + [3, 100, 1000]:
        for n, k in LLAMA_SHAPES:
            wg, bn, stages, promote, vec, cl, split, *rest = H.config(m, n, k, sms, fast)
            occ, _, swap, _, ns, l2 = (*rest, *(1, 0, 0, 0, 0, 256)[len(rest) :])
            assert l2 in (128, 256)
            room = H.shared_bytes(wg, bn, stages, vec, 64, ns) + 1024
            assert occ * room <= H.SHARED_LIMIT + 1024
            if ns == 2:  # (every other K slice: one sum waited for)
                assert promote == 1
            else:
                assert promote == H.promotion(1 if ns else wg, bn // (1 + (ns == 1)))
            shared_c = wg == 2 and 128 <= bn <= 224 and not ns  # C through shared memory
            assert vec == (3 if shared_c else 1)
            assert (wg, bn, cl) in H.RATES or (wg == 1 and bn <= 128 and m <= 64) or ns
            most = H.WIDE_ALTERNATE_M if fast else H.NS_M  # (fast: to 256 rows)
            assert ns != 1 or (m <= most and -(-m // 64) * -(-n // bn) <= sms)
            narrow = m <= H.NS_M and bn <= H.ALTERNATE_BN  # (alternating_plan's tiles)
            wide = m <= H.WIDE_ALTERNATE_M and bn == 128  # (wide_alternating_plan's)
            assert ns != 2 or (wg == 2 and (narrow or wide))
            assert split == 1 or (cl == 1 and k // 128 >= 2 * split)
            assert not swap or (m <= H.SWAP_M and bn == max(8, -(-m // 8) * 8))
            assert not swap or wg == 1 + (ns == 2)  # (two warpgroups on alternate slices)
    assert {(wg, bn) for wg, bn, _ in H.RATES} <= set(H.PLANS)  # each in the PTX checks
    if sms == 132:
        assert min(H.config(s, s, s, sms, fast)[1] for s in (4096, 8192)) >= 192
        assert H.config(256, 4096, 14336, sms, fast) == H.alternating_plan(128)


LLAMA_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192),
                (8192, 8192), (57344, 8192), (8192, 28672)]  # fmt: skip


def test_config_by_memory_speed():
    """On a GPU of the faster memory (``fast``: an H200, ``_arrays.fast_memory``) ``config``
    differs from the H100's plans (``fast`` False, main's) in two ways only, over the M
    sweep at the Llama-3 shapes: the decode tiles' tensor maps promote 128 bytes
    (``DECODE_L2``; up to 64 rows, not the swapped two-warpgroup tiles), and ``shared_plan``'s
    64-row tiles run where they make one wave (65 to 128 rows in place of 128-row tiles:
    10240 x 8192; 129 to 256 at K up to ``SHARED_K``: 6144 and 4096 x 4096, 8192 x 8192 up
    to 192 rows); the H100 keeps 256 bytes and its tiles."""
    from kaio_ops import _fp8_hopper as H

    changed = set()
    for m in [1 << i for i in range(14)] + [3, 65, 96, 100, 129, 160, 192, 1000]:
        for n, k in LLAMA_SHAPES:
            slow, fast = H.config(m, n, k, 132), H.config(m, n, k, 132, True)
            assert H.config(m, n, k, 132, False) == slow
            if slow == fast:
                continue
            changed.add((m, n, k))
            if m <= 64:
                two = len(slow) > 11 and slow[9] and slow[0] == 2  # swapped, two warpgroups
                assert not two and fast == H.promoted(slow, 128)
                assert len(slow) < 13 or slow[12] == 256
            else:
                assert fast == H.shared_plan(m, n, 132) and m <= H.WIDE_ALTERNATE_M
                assert m <= H.NS_M or k <= H.SHARED_K
                assert -(-m // 64) * -(-n // fast[1]) <= 132 and fast[11] == 1
    assert {(8, 57344, 8192), (64, 10240, 8192), (128, 10240, 8192)} <= changed
    assert {(256, 6144, 4096), (256, 4096, 4096)} <= changed
    assert not changed & {(8, 4096, 4096), (256, 4096, 14336), (512, 4096, 4096)}


def test_launch_asks_the_memory_speed(monkeypatch):
    """``_fp8_hopper.launch`` plans for the memory of the arrays' GPU: ``config`` gets
    ``fast`` from ``_arrays.fast_memory`` (the peak bandwidth against
    ``_arrays.FAST_MEMORY``; None, the simulator's, is not fast)."""
    import kaio_ops._arrays as arrays
    from kaio_ops import _fp8_hopper as H
    from kaio_ops import fp8

    monkeypatch.setattr(fp8, "HOPPER_IN_SIMULATOR", True)
    config, asked = H.config, []
    monkeypatch.setattr(H, "config", lambda *args: asked.append(args[4]) or config(*args))
    a, w = _fp8_operands(3, 128, 64, "e4m3", seed=3)
    one = np.float32([1.0])
    for peak in (None, 3.35e12, 4.8e12):
        monkeypatch.setattr(arrays, "memory_bandwidth", lambda like, p=peak: p)
        with kaio.simulate():
            kaio_ops.matmul_fp8(a, w.T, one, one)
    assert asked == [False, False, True]


def test_matmul_torch_dtypes_accepted():
    torch = pytest.importorskip("torch")
    a, w = _fp8_operands(16, 32, 16, "e4m3", seed=2)
    with kaio.simulate():
        got = kaio_ops.matmul_fp8(
            a, w.T, np.ones(1, np.float32), np.ones(1, np.float32), out_dtype=torch.float32
        )
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, matmul_reference(a, w.T, 1.0, 1.0), rtol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"b": "e5m2"}, "argument 'b' must be .* of e4m3"),
        ({"k": 40}, "multiples of 16"),
        ({"sa": (3,)}, "argument 'scale_a' must have 1 element"),
        ({"out": "f64"}, "out_dtype must be one of"),
        ({"bias": np.float32}, "argument 'bias' must be .* of bf16"),
        ({"a": np.float16}, "argument 'a' must be .* of e4m3 or e5m2"),
    ],
)
def test_matmul_errors(change, message):
    k = change.get("k", 32)
    a, w = _fp8_operands(16, k, 16, "e4m3", seed=1)
    if "a" in change:
        a = a.astype(change["a"])
    b = w.T.astype(NP_FP8[change["b"]]) if "b" in change else w.T
    sa = np.ones(change.get("sa", (1,)), np.float32)
    bias = np.zeros(16, change["bias"]) if "bias" in change else None
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        kaio_ops.matmul_fp8(
            a, b, sa, np.ones(1, np.float32), out_dtype=change.get("out"), bias=bias
        )


@needs_ptxas
@pytest.mark.parametrize("arch, fmt, dt", [("sm_89", "e4m3", "bf16"), ("sm_90", "e5m2", "f16")])
def test_ptx_assembles(arch, fmt, dt):
    """Every kind of kernel the ops ship (the matmul with every flag set, one output type per
    arch, and the quantizers of one input type); the GPU tests compile the rest."""
    shipped = list(_fp8.shipped())
    assert len(shipped) == 2 * 3 * 10 + 2 + 3 + 1
    t = getattr(kaio, dt)
    flags = {"ROW_A": 1, "COL_B": 1, "BIAS": 1}
    types = {"DT": t, "FP8": _fp8.FP8_TYPES[fmt]}
    chosen = [
        (_fp8._mm_fp8, {**flags, **types}),
        (_fp8._quantize_rows, {"LIMIT": _fp8.FP8_MAX[fmt], **types}),
        (_fp8._quantize_flat, types),
        (_fp8._tensor_scale, {"LIMIT": _fp8.FP8_MAX[fmt]}),
        (_fp8._amax_partial, {"DT": t}),
        (_fp8._transpose_bytes, {}),
    ]
    for kernel, constexprs in chosen:
        assert (kernel, constexprs) in shipped
        assemble(kernel.ptx(arch=arch, **constexprs), arch)
    for kernel, constexprs in _fp8_decode.specializations():  # decode rows
        assemble(kernel.ptx(arch=arch, **constexprs), arch)


@needs_ptxas
def test_hopper_kernel_assembles_for_sm_90a():
    """The tile shapes the sm_90 kernel ships and a cluster of two (a covering subset,
    ``tests.harness.covering``) through ptxas: the fp8 wgmma of each width, the grid
    dependency wait where launched with programmatic dependent launch (``PDL``), no spills
    (the consumers' registers raised by setmaxnreg)."""
    from kaio_ops import _fp8_hopper

    cases = list(_fp8_hopper.specializations())
    kernel, constexprs = cases[0]
    cases.append((kernel, {**constexprs, "CL": 2}))
    for kernel, constexprs in (cases[i] for i in covering(cases)):
        ptx = kernel.ptx(arch="sm_90", **constexprs)
        if kernel is _fp8_hopper.sum_parts:  # the K split's sum
            assert " 0 bytes spill stores" in assemble(ptx, "sm_90")
            continue
        fp8 = constexprs["FP8"].name
        halves = constexprs["PROMOTE"] in (3, 5) or constexprs.get("NS") == 1  # (a warpgroup's)
        width = constexprs["BN"] // (2 if halves else 1)
        assert f"wgmma.mma_async.sync.aligned.m64n{width}k32.f32.{fp8}" in ptx
        assert ("griddepcontrol.wait;" in ptx) == bool(constexprs["PDL"])
        assert " 0 bytes spill stores" in assemble(ptx, "sm_90a")


@needs_ptxas
def test_hopper_kernel_llvm_backend_assembles():
    pytest.importorskip("llvmlite")
    from kaio_ops import _fp8_hopper

    kernel, constexprs = list(_fp8_hopper.specializations())[3]
    assemble(kernel.ptx(arch="sm_90", backend="llvm", **constexprs), "sm_90a")


@needs_ptxas
def test_llvm_backend_assembles():
    pytest.importorskip("llvmlite")
    for kernel, constexprs in (
        (_fp8._mm_fp8, {"ROW_A": 1, "COL_B": 1, "BIAS": 1, "DT": kaio.bf16, "FP8": kaio.e5m2}),
        (_fp8._quantize_rows, {"LIMIT": 448.0, "DT": kaio.f16, "FP8": kaio.e4m3}),
    ):
        assemble(kernel.ptx(arch="sm_90", backend="llvm", **constexprs), "sm_90")


def test_sm80_refused():
    with pytest.raises(kaio.CompileError, match=r"kaio.mma_e4m3\(\) needs sm_89"):
        _fp8._mm_fp8.ptx(arch="sm_80", ROW_A=0, COL_B=0, BIAS=0, DT=kaio.bf16, FP8=kaio.e4m3)


# ---------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("per", ["tensor", "row"])
@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_quantize_gpu_matches_torch(per, name):
    torch = pytest.importorskip("torch")
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(1000, 4096, device="cuda") * torch.rand(1000, 1, device="cuda") * 50
        x = x.to(dtype)
        q, scale = kaio_ops.quantize_fp8(x, dtype=name, per=per)
        amax = x.abs().amax() if per == "tensor" else x.abs().amax(-1, keepdim=True)
        ts = amax.float().clamp(min=1e-12) / LIMIT[name]
        tq = (x.float() / ts).to(tdt)
        assert torch.equal(scale.view(ts.shape), ts)
        assert torch.equal(q.view(torch.uint8), tq.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["auto", "mma_sync"])
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1, 4096, 14336), (77, 8192, 1024)])
@pytest.mark.parametrize("scales", ["tensor", "row"])
def test_matmul_gpu_vs_scaled_mm(shape, scales, path, monkeypatch):
    """Against torch._scaled_mm; ``auto`` is the GPU's own kernel (wgmma on sm_90),
    ``mma_sync`` the sm_89 kernel on any sm_89+ GPU."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    if path == "mma_sync":
        from kaio_ops import fp8

        monkeypatch.setattr(fp8, "_uses_wgmma", lambda a: False)
    m, k, n = shape
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    per = "row" if scales == "row" else "tensor"
    a, sa = kaio_ops.quantize_fp8(x, per=per)
    wq, sw = kaio_ops.quantize_fp8(w, per=per)
    sb = sw.view(1, n) if per == "row" else sw
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    got = kaio_ops.matmul_fp8(a, wq.t(), sa, sb, bias=bias)
    mp = -(-m // 16) * 16  # torch._scaled_mm wants M a multiple of 16: pad with zero rows
    ap = torch.zeros(mp, k, device="cuda").to(a.dtype)
    ap[:m] = a
    sap = sa
    if per == "row":
        sap = torch.ones(mp, 1, device="cuda")
        sap[:m] = sa
    # bf16 out (row-wise scaling takes no other) and the bias added here (not every torch
    # version takes one with row-wise scales): two roundings where kaio has one
    want = torch._scaled_mm(ap, wq.t(), sap, sb, out_dtype=torch.bfloat16)[:m]
    want = want.float() + bias.float()
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    diff = (got.float() - want).abs()
    assert (diff <= want.abs() * 2**-6 + 1e-3 * want.abs().max()).all()
    # and the row-major b path (a transposed copy) gives the same bits
    again = kaio_ops.matmul_fp8(a, wq.t().contiguous(), sa, sb, bias=bias)
    assert torch.equal(again, got)


@pytest.mark.gpu
@pytest.mark.parametrize("vec", [1, 0])
@pytest.mark.parametrize(
    "wg, bn, split, promote",
    [(2, 128, 1, None), (2, 96, 1, None), (3, 128, 1, None), (2, 64, 1, None), (1, 64, 1, None),
     (1, 256, 1, None), (1, 64, 3, None), (2, 128, 1, 5), (2, 128, 1, 21), (2, 192, 1, 41),
     (1, 32, 1, 20), (1, 112, 1, None), (1, 48, 1, None), (2, 192, 1, None),
     (2, 224, 1, None), (2, 208, 3, None), (2, 256, 2, None), (2, 200, 3, None)],
)  # fmt: skip
def test_hopper_plans_gpu_vs_scaled_mm(wg, bn, split, promote, vec, monkeypatch):
    """Every tile shape of the sm_90 kernel, forced, against torch._scaled_mm at K = 8192 (64
    slices: the promoted sums): per-row and per-column scales, bias, M and N edges; K split
    (``split_from``: every tile when fewer than the multiprocessors, else the last wave's;
    the parts summed by ``sum_parts``)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    from kaio_ops import _fp8_hopper as H

    plan = (*H.plan(wg, bn)[:3], promote or H.promotion(wg, bn), vec, 1, split)
    _forced_plan_vs_scaled_mm(torch, plan, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("vec", [2, 3])
@pytest.mark.parametrize(
    "wg, bn, split", [(2, 208, 1), (2, 192, 3), (2, 256, 1), (1, 64, 1), (2, 200, 1)]
)
def test_hopper_shared_epilogue_gpu_vs_scaled_mm(wg, bn, split, vec, monkeypatch):
    """The epilogue through shared memory (``VEC`` 2: each warp's 16 rows copied out a row by
    a bulk copy, the last column tile partial; 3: the copies waited for at the warp's next
    epilogue) against torch._scaled_mm, as above."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    from kaio_ops import _fp8_hopper as H

    plan = (wg, bn, H.stages_for(wg, bn, vec=vec), H.promotion(wg, bn), vec, 1, split)
    _forced_plan_vs_scaled_mm(torch, plan, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "plan, m",
    [((2, 48, 12, 2, 1, 1, 1, 1, 0, 0, 8, 2), 64), ((2, 128, 8, 1, 1, 1, 1, 1, 0, 0, 8, 2), 100),
     ((2, 8, 8, 2, 1, 1, 1, 2, 0, 1, 8, 2), 5), ((2, 32, 12, 2, 1, 1, 1, 1, 0, 1, 8, 2), 32),
     ((1, 32, 32, 2, 1), 1), ((1, 16, 26, 2, 1, 1, 1, 2), 16), ((1, 32, 17, 2, 1, 1, 2, 2), 13),
     ((1, 64, 7, 2, 1, 1, 1, 2), 64), ((1, 48, 27, 2, 1), 5), ((1, 32, 17, 2, 1, 1, 2, 2, 1), 16),
     ((1, 64, 7, 2, 1, 1, 3, 2, 1), 40), ((2, 80, 16, 1, 1, 1, 1, 1, 0, 0, 8, 2), 7),
     ((2, 32, 16, 1, 1, 1, 1, 1, 0, 1, 8, 2), 32), ((1, 16, 8, 1, 1, 1, 1, 2, 0, 1, 8, 0), 9),
     ((2, 160, 8, 1, 1, 1, 1, 1, 0, 0, 8, 1), 100), ((2, 192, 7, 1, 1, 1, 1, 1, 0, 0, 8, 1), 256),
     ((2, 80, 11, 1, 1, 1, 1, 1, 0, 0, 8, 2, 128), 40)],
)  # fmt: skip
def test_decode_plans_gpu_vs_scaled_mm(plan, m, monkeypatch):
    """Decode tiles (one warpgroup, A stages of only the rows copied) with deep rings, two
    blocks a multiprocessor (OCC) and a K split (its parts summed by ``sum_parts`` or in the
    kernel), two warpgroups on every other K slice (``NS`` 2, swapped or not), forced,
    against torch._scaled_mm."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    _forced_plan_vs_scaled_mm(torch, plan, monkeypatch, m)


SWAPPED_GPU_PLANS = [
    ((1, 8, 25, 2, 1, 1, 1, 1, 0, 1), 1),
    ((1, 8, 25, 2, 1, 1, 2, 1, 1, 1), 5),
    ((1, 16, 11, 2, 1, 1, 2, 2, 1, 1), 13),
    ((1, 32, 18, 2, 1, 1, 1, 1, 0, 1), 32),
    ((2, 16, 12, 2, 1, 1, 1, 1, 0, 1), 16),
    ((2, 64, 9, 2, 1, 1, 2, 1, 1, 1), 64),
    ((1, 8, 8, 1, 1, 1, 1, 2, 0, 1, 8, 0, 128), 5),  # L2 promotion 128 bytes (SWAP_L2)
    ((1, 32, 8, 1, 1, 1, 1, 2, 0, 1, 8, 0, 128), 32),
]


@pytest.mark.gpu
@pytest.mark.parametrize("plan, m", SWAPPED_GPU_PLANS)
def test_swapped_plans_gpu_vs_scaled_mm(plan, m, monkeypatch):
    """The swapped tiles (``SWAP``), forced, against torch._scaled_mm: per-row and
    per-column scales and bias within the bias's second rounding (N = 1008: a partial
    64-row weight tile), and bit for bit with per-tensor scales, no bias, bf16 out."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    monkeypatch.setattr(_fp8_decode, "MAX_M", 0)  # (M = 1 on the wgmma kernel)
    _forced_plan_vs_scaled_mm(torch, plan, monkeypatch, m)
    torch.manual_seed(m)
    _same_bits_as_scaled_mm(torch, m, 4096, 4096)


def _same_bits_as_scaled_mm(torch, m: int, n: int, k: int, w_scale: float = 1.0) -> None:
    """``matmul_fp8`` of random e4m3 a [m, k] and weights [n, k] (times ``w_scale`` before
    quantizing), per-tensor scales, no bias, equals torch._scaled_mm's bf16 bit for bit
    (torch's a padded to 16 rows)."""
    a, sa = kaio_ops.quantize_fp8(torch.randn(m, k, device="cuda"))
    wq, sw = kaio_ops.quantize_fp8(torch.randn(n, k, device="cuda") * w_scale)
    got = kaio_ops.matmul_fp8(a, wq.t(), sa, sw)
    ap = torch.zeros(-(-m // 16) * 16, k, device="cuda").to(a.dtype)
    ap[:m] = a
    want = torch._scaled_mm(ap, wq.t(), sa, sw, out_dtype=torch.bfloat16)[:m]
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(2, 6144, 4096), (8, 28672, 4096), (16, 4096, 14336),
                                     (32, 8192, 8192), (16, 10240, 8192), (1, 4096, 4096),
                                     (1, 8192, 28672), (1, 10240, 8192),
                                     (256, 4096, 4096), (8, 57344, 8192), (1, 28672, 4096),
                                     (100, 10240, 8192), (128, 10240, 8192), (64, 10240, 8192),
                                     (256, 6144, 4096), (160, 8192, 8192),
                                     (192, 4096, 4096)])  # fmt: skip
def test_routed_decode_gpu_bit_identical(m, n, k):
    """The routed decode plans (swapped tiles from one row up to ``SWAP_M`` rows where
    ``swap_config`` takes them, on an H200 promoting 128 bytes; 10240 columns unswapped; on
    an H200 ``shared_plan``'s tiles at 65 to 256 rows where they make one wave) and
    ``wide_alternating_plan`` at 256 rows give torch._scaled_mm's bf16 outputs bit for bit
    (per-tensor scales, no bias; torch's A padded to 16 rows; at one row ``gemv_fp8``'s
    sums, in another order, were not)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    torch.manual_seed(m + n)
    _same_bits_as_scaled_mm(torch, m, n, k, 0.02)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "plan",
    [
        (2, 208, 5, 7, 1),
        (2, 192, 5, 7, 1),
        (2, 208, 4, 1, 3),
        (2, 200, 4, 1, 3),
        (2, 128, 6, 2, 3, 2),
        (2, 64, 14, 2, 1, 1, 1, 1, 0, 0, 8, 1),
    ],  # fmt: skip
)
def test_forced_plans_gpu_bit_identical(plan, monkeypatch):
    """``PROMOTE`` 7 (the next tile's first slice multiplied during the epilogue), ``VEC`` 3
    (C through shared memory, the copies drained during the next tile; alone and in
    clusters of two) and ``NS`` (two warpgroups on a 64-row tile, half its columns each)
    forced, 2000 x 4144 x 4096 (several tiles a block; partial last tile row and column,
    stored with the bounds checked and no slice carried) give torch._scaled_mm's bf16
    outputs bit for bit (per-tensor scales, no bias: the case that carries)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    from kaio_ops import _fp8_hopper as H
    from kaio_ops import _plan

    monkeypatch.setattr(H, "config", lambda *args: plan)
    _plan.clear()  # (a call plan keeps the tile it was made with)
    m, n, k = 2000, 4144, 4096
    torch.manual_seed(n)
    a, sa = kaio_ops.quantize_fp8(torch.randn(m, k, device="cuda"))
    wq, sw = kaio_ops.quantize_fp8(torch.randn(n, k, device="cuda") * 0.02)
    got = kaio_ops.matmul_fp8(a, wq.t(), sa, sw)
    want = torch._scaled_mm(a, wq.t(), sa, sw, out_dtype=torch.bfloat16)
    assert torch.equal(got, want)


def _forced_plan_vs_scaled_mm(torch, plan, monkeypatch, m=1000):
    """matmul_fp8 forced onto ``plan``, M = ``m`` (1000), K = 8192, N = 1008, per-row and
    per-column scales and bias, against torch._scaled_mm (its A padded to 1008 rows)."""
    from kaio_ops import _fp8_hopper as H

    monkeypatch.setattr(H, "config", lambda *args: plan)
    k, n = 8192, 1008
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    a, sa = kaio_ops.quantize_fp8(x, per="row")
    wq, sw = kaio_ops.quantize_fp8(w, per="row")
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    got = kaio_ops.matmul_fp8(a, wq.t(), sa, sw.view(1, n), bias=bias)
    mp = 1008
    ap = torch.zeros(mp, k, device="cuda").to(a.dtype)
    ap[:m] = a
    sap = torch.ones(mp, 1, device="cuda")
    sap[:m] = sa
    want = torch._scaled_mm(ap, wq.t(), sap, sw.view(1, n), out_dtype=torch.bfloat16)[:m]
    want = want.float() + bias.float()
    diff = (got.float() - want).abs()
    assert (diff <= want.abs() * 2**-6 + 1e-3 * want.abs().max()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(4096, 4096), (16, 4096), (512, 6144)])
def test_matmul_gpu_error_no_worse_than_cublas(m, n):
    """The promoted sums as routed (each shape's own plan) against float64 of the same fp8
    values at K = 8192, f32 out, on all-positive data (the sums grow with K: where the
    wgmma's short running sum loses most): the error no larger than torch._scaled_mm's
    (cuBLAS, use_fast_accum=False) beyond a 25% margin (docs/performance.md)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    torch.manual_seed(m + n)
    k = 8192
    x = torch.randn(m, k, device="cuda").abs()
    w = torch.randn(n, k, device="cuda").abs()
    a, sa = kaio_ops.quantize_fp8(x)
    wq, sw = kaio_ops.quantize_fp8(w)
    ref = (a.double() @ wq.t().double()) * sa.double() * sw.double()
    got = kaio_ops.matmul_fp8(a, wq.t(), sa, sw, out_dtype=torch.float32)
    want = torch._scaled_mm(a, wq.t(), sa, sw, out_dtype=torch.float32)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    peer = ((want.double() - ref).norm() / ref.norm()).item()
    assert err <= 1.25 * peer + 1e-7, (err, peer)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4096, 256, 128, 8])
def test_dependent_launch_chain_gpu(m, monkeypatch):
    """The wgmma kernel launched with programmatic dependent launch (``_fp8_hopper.PDL``)
    right behind the kernels that make its inputs (six steps, each quantizing the output
    before: x -> quantize_fp8 -> matmul_fp8 -> x; the routed plan of M rows at N = K = 4096)
    gives the bits it gives without it, and each step torch._scaled_mm's."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    from kaio_ops import _fp8_hopper as H
    from kaio_ops import _plan

    def chain(pdl: int) -> list:
        monkeypatch.setattr(H, "PDL", pdl)
        _plan.clear()  # (a call plan keeps the launch it was made with)
        torch.manual_seed(m)
        x = torch.randn(m, 4096, device="cuda")
        wq, sw = kaio_ops.quantize_fp8(torch.randn(4096, 4096, device="cuda") * 0.02)
        outs = []
        for _ in range(6):
            a, sa = kaio_ops.quantize_fp8(x)
            x = kaio_ops.matmul_fp8(a, wq.t(), sa, sw)
            outs.append((x, a, sa))
        torch.cuda.synchronize()
        return outs, wq, sw

    plain, _, _ = chain(0)
    dependent, wq, sw = chain(1)
    for (x0, _, _), (x1, a, sa) in zip(plain, dependent, strict=True):
        assert torch.equal(x0, x1)
        pad = -(-m // 16) * 16 - m  # (torch's A padded to 16 rows)
        ap = torch.cat([a, torch.zeros(pad, 4096, device="cuda").to(a.dtype)])
        want = torch._scaled_mm(ap, wq.t(), sa, sw, out_dtype=torch.bfloat16)[:m]
        assert torch.equal(x1, want)


@pytest.mark.gpu
def test_dependent_launch_in_a_cuda_graph():
    """The routed kernel at 128 x 4096 x 4096 (launched with programmatic dependent launch)
    captured in a CUDA graph behind the kernels that quantize its input, replayed on new
    input: the bits of the same calls made eagerly."""
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    torch.manual_seed(3)
    wq, sw = kaio_ops.quantize_fp8(torch.randn(4096, 4096, device="cuda") * 0.02)
    x = torch.randn(128, 4096, device="cuda")

    def step():
        a, sa = kaio_ops.quantize_fp8(x)
        return kaio_ops.matmul_fp8(a, wq.t(), sa, sw)

    step()  # (compiled and planned outside the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    x.copy_(torch.randn(128, 4096, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, step())
