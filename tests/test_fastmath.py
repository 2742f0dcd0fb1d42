"""``@kaio.gpu_kernel(fastmath=True)``: the .ftz approximations of exp, exp2, log, log2, sin,
cos, rsqrt and f32 division, in the IR, both PTX lowerings, ptxas, the simulator (against
float64 within the documented bounds, subnormals flushed) and the caches."""

import numpy as np
import pytest

import kaio
from kaio import f32, f64, u32
from kaio.ptx.ptxas import assemble, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
COLUMNS = 9
FAST_PTX = (
    "ex2.approx.ftz.f32",
    "lg2.approx.ftz.f32",
    "sin.approx.ftz.f32",
    "cos.approx.ftz.f32",
    "rsqrt.approx.ftz.f32",
    "div.full.ftz.f32",
)


def _math(fastmath: bool):
    @kaio.gpu_kernel(block_size=64, fastmath=fastmath)
    def math_ops(x: f32[:], y: f32[:], d: f64[:], out: f32[:, :], dout: f64[:], n: u32):
        i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
        if i < n:
            v = x[i]
            out[i, 0] = kaio.exp(v)
            out[i, 1] = kaio.exp2(v)
            out[i, 2] = kaio.log(kaio.abs(v))
            out[i, 3] = kaio.log2(kaio.abs(v))
            out[i, 4] = kaio.sin(v)
            out[i, 5] = kaio.cos(v)
            out[i, 6] = kaio.rsqrt(kaio.abs(v))
            out[i, 7] = v / y[i]
            out[i, 8] = kaio.sqrt(kaio.abs(v))  # not approximated: exact either way
            dout[i] = d[i] / 3.0  # f64 division stays IEEE

    return math_ops


FAST, PRECISE = _math(True), _math(False)


def _run(kernel, x, y):
    n = len(x)
    out = np.full((n, COLUMNS), np.nan, np.float32)
    d = np.linspace(-5, 5, n)
    dout = np.full(n, np.nan)
    kernel.sim[(n + 63) // 64](x, y, d, out, dout, n)
    np.testing.assert_array_equal(dout, d / 3.0)
    return out


def test_fastmath_ptx_and_ir():
    fast, precise = FAST.ptx(arch="sm_90"), PRECISE.ptx(arch="sm_90")
    for instr in FAST_PTX:
        assert instr in fast, instr
        assert instr not in precise, instr
    assert "div.rn.f64" in fast and "div.rn.f32" in precise and "div.rn.f32" not in fast
    assert "sqrt.rn.f32" in fast
    assert "div_ftz" in FAST.ir() and "div_ftz" not in PRECISE.ir()


def test_fastmath_in_cache_keys():
    assert FAST.specialize().key != PRECISE.specialize().key
    same = _math(True)
    assert same.specialize().key == FAST.specialize().key


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_fastmath_assembles(arch, backend):
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    text = FAST.ptx(arch=arch, backend=backend)
    for instr in FAST_PTX:
        assert instr.replace(".f32", "") in text, instr
    assemble(text, arch)


def test_fastmath_simulated_within_bounds():
    rng = np.random.default_rng(4)
    x = rng.uniform(-3, 3, 256).astype(np.float32)
    y = (rng.uniform(0.5, 4, 256) * rng.choice([-1, 1], 256)).astype(np.float32)
    out = _run(FAST, x, y).astype(np.float64)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    ax = np.abs(x64)
    refs = [np.exp(x64), 2**x64, np.log(ax), np.log2(ax), np.sin(x64), np.cos(x64)]
    refs += [1 / np.sqrt(ax), x64 / y64, np.sqrt(ax)]
    rel = [2.0**-21, 2.0**-22, None, None, None, None, 2.0**-22, 2.0**-22, 2.0**-24]
    for col, (ref, r) in enumerate(zip(refs, rel, strict=True)):
        got = out[:, col]
        if r is None:  # absolute bounds: log near 1, sin and cos on [-pi, pi]
            np.testing.assert_allclose(got, ref, rtol=2.0**-21, atol=2.0**-20, err_msg=str(col))
        else:
            np.testing.assert_allclose(got, ref, rtol=r, atol=0, err_msg=str(col))


def test_fastmath_flushes_subnormals():
    tiny = np.float32(1e-40)  # subnormal in f32
    x = np.array([tiny, -tiny, 1e-30, 3.0], np.float32)
    y = np.array([2.0, 2.0, 1e9, 2.0], np.float32)
    fast, precise = _run(FAST, x, y), _run(PRECISE, x, y)
    # a subnormal input reads as (signed) zero
    np.testing.assert_array_equal(fast[:2, 0], [1.0, 1.0])
    np.testing.assert_array_equal(fast[:2, 3], [-np.inf, -np.inf])
    np.testing.assert_array_equal(fast[:2, 6], [np.inf, np.inf])
    assert fast[0, 4] == 0 and np.signbit(fast[1, 4])
    np.testing.assert_array_equal(fast[:3, 7], [0.0, -0.0, 0.0])  # quotients below 2^-126
    assert precise[0, 7] != 0 and precise[2, 7] != 0  # kept without fastmath
    assert precise[0, 3] > -200  # log2(1e-40) ~ -132.9 without flushing
    np.testing.assert_allclose(fast[3], precise[3], rtol=2.0**-20)


@pytest.mark.gpu
def test_fastmath_on_gpu_within_bounds():
    rng = np.random.default_rng(5)
    n = 4096
    x = rng.uniform(-3, 3, n).astype(np.float32)
    y = rng.uniform(0.5, 4, n).astype(np.float32)
    d = np.linspace(-5, 5, n)
    args = [kaio.to_device(a) for a in (x, y, d)]
    out = kaio.to_device(np.full((n, COLUMNS), np.nan, np.float32))
    dout = kaio.to_device(np.full(n, np.nan))
    FAST[(n // 64,)](*args, out, dout, n)
    got = out.numpy()
    expected = _run(FAST, x, y)  # the simulator's model: the documented bounds apart
    np.testing.assert_allclose(got[:, [0, 1, 6, 7, 8]], expected[:, [0, 1, 6, 7, 8]], rtol=2**-20)
    np.testing.assert_allclose(got[:, 2:6], expected[:, 2:6], rtol=2**-19, atol=2**-19)
