"""Generic kernels (dtype constexprs), device functions returning tuples, and keyword
arguments of builtins and device functions: in the simulator against NumPy, through both
PTX lowerings and ptxas, and their misuse as located errors."""

# ruff: noqa: F821  (DT in annotations is a dtype parameter, not a module name)
from __future__ import annotations

import numpy as np
import pytest

import kaio
from kaio import f16, f32, i32, u32
from kaio.ptx.ptxas import assemble, find_ptxas
from tests import plain_generic

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
RNG = np.random.default_rng(32)
DTYPES = (kaio.f16, kaio.bf16, kaio.f32)


@kaio.gpu_func
def load_scaled(a: DT[:], i: u32, k: f32, DT: kaio.constexpr) -> f32:
    return f32(a[i]) * k


@kaio.gpu_kernel(block_size=64)
def scaled_sum(x: DT[:], y: DT[:], out: DT[:], acc: f32[:], n: u32, DT: kaio.constexpr):
    """out = DT(2*x) + y through a DT shared tile; acc = f32 sum of a DT local pair."""
    i = kaio.thread_idx_x()
    tile = kaio.shared(DT, 64)
    pair: DT = DT(0)
    regs = kaio.local(DT, 2)
    if i < n:
        tile[i] = DT(load_scaled(x, i, 2.0, DT))
        regs[0] = tile[i]
        regs[1] = y[i]
        pair = regs[0] + regs[1]
        out[i] = pair
        acc[i] = f32(regs[0]) + f32(regs[1])


def _reference(x, y, dt):
    twice = (x.astype(np.float64) * 2).astype(dt.np_dtype)
    out = (twice.astype(np.float64) + y.astype(np.float64)).astype(dt.np_dtype)
    acc = (twice.astype(np.float32) + y.astype(np.float32)).astype(np.float32)
    return out, acc


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_dtype_constexpr_simulated(dt):
    n = 50
    x = RNG.standard_normal(64).astype(dt.np_dtype)
    y = RNG.standard_normal(64).astype(dt.np_dtype)
    out = np.full(64, np.nan, dt.np_dtype)
    acc = np.full(64, np.nan, np.float32)
    scaled_sum.sim[1](x, y, out, acc, n, dt)
    ref_out, ref_acc = _reference(x, y, dt)
    np.testing.assert_array_equal(out[:n], ref_out[:n])
    np.testing.assert_array_equal(acc[:n], ref_acc[:n])
    assert np.isnan(out[n:].astype(np.float32)).all()  # untouched past n


def test_one_specialization_per_dtype():
    keys = {dt: scaled_sum.specialize({"DT": dt}).key for dt in DTYPES}
    assert len(set(keys.values())) == len(DTYPES)
    assert scaled_sum.specialize({"DT": f16}) is scaled_sum.specialize({"DT": f16})
    ptx16 = scaled_sum.ptx(DT=f16)
    ptx32 = scaled_sum.ptx(DT=f32)
    assert ".shared .align 2 .b8" in ptx16 or "b16" in ptx16
    assert ptx16 != ptx32
    assert dict(scaled_sum.runtime_params({"DT": f16}))["x"] == f16[:]
    assert dict(scaled_sum.runtime_params({"DT": kaio.bf16}))["out"] == kaio.bf16[:]


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_dtype_constexpr_ptxas(dt, arch):
    assemble(scaled_sum.ptx(arch=arch, DT=dt), arch)


def test_dtype_constexpr_llvm():
    pytest.importorskip("llvmlite")
    for dt in DTYPES:
        text = scaled_sum.ptx(arch="sm_90", backend="llvm", DT=dt)
        if find_ptxas() is not None:
            assemble(text, "sm_90")


@kaio.gpu_kernel(block_size=32)
def scale_by(x: DT[:], s: DT, DT: kaio.constexpr):
    """A scalar parameter of the dtype parameter's type."""
    x[kaio.thread_idx_x()] = x[kaio.thread_idx_x()] * s


def test_scalar_parameter_of_a_dtype_parameter():
    for dt in (f16, i32):
        x = RNG.integers(-50, 50, 32).astype(dt.np_dtype)
        want = (x * 3).astype(dt.np_dtype)
        scale_by.sim[1](x, 3, dt)
        np.testing.assert_array_equal(x, want)
    assert dict(scale_by.runtime_params({"DT": i32}))["s"] == i32


def test_quoted_annotations_without_future_import():
    x = RNG.standard_normal(32).astype(np.float16)
    out = np.full(32, np.nan, np.float16)
    plain_generic.scale_copy.sim[1](x, out, 20, f16)
    np.testing.assert_array_equal(out[:20], (x[:20].astype(np.float64) * 3).astype(np.float16))
    xs = RNG.integers(-100, 100, 32).astype(np.int32)
    outs = np.full(32, -7, np.int32)
    plain_generic.scale_copy.sim[1](xs, outs, 32, i32)
    np.testing.assert_array_equal(outs, xs * 3)


def test_dtype_constexpr_misuse():
    x = np.zeros(64, np.float32)
    with pytest.raises(kaio.LaunchError, match="must be a kaio scalar type"):
        scaled_sum.ptx(DT=4)
    with pytest.raises(kaio.LaunchError, match="x"):  # f32 data for DT=f16
        scaled_sum.sim[1](x, x, x, x, 4, f16)
    with pytest.raises(kaio.CompileError, match="'DT'.*kaio.constexpr"):

        @kaio.gpu_kernel(block_size=32)
        def no_param(x: DT[:]):  # DT is not a parameter
            pass


# ------------------------------------------------------------------ tuple-returning functions
@kaio.gpu_func
def minmax(a: f32, b: f32):
    if a < b:
        return a, b
    return b, a


@kaio.gpu_func
def divmod_u(a: u32, b: u32) -> tuple[u32, u32]:
    return a // b, a % b


@kaio.gpu_kernel(block_size=32)
def tuples(x: f32[:], y: f32[:], lo: f32[:], hi: f32[:], q: u32[:], r: u32[:]):
    i = kaio.thread_idx_x()
    a, b = minmax(x[i], y[i])
    lo[i] = a
    hi[i] = b
    both = divmod_u(i + 100, 7)
    q[i] = both[0]
    r[i] = both[1]


def test_tuple_returns_simulated():
    x = RNG.standard_normal(32).astype(np.float32)
    y = RNG.standard_normal(32).astype(np.float32)
    lo, hi = (np.full(32, np.nan, np.float32) for _ in range(2))
    q, r = (np.full(32, 12345, np.uint32) for _ in range(2))
    tuples.sim[1](x, y, lo, hi, q, r)
    np.testing.assert_array_equal(lo, np.minimum(x, y))
    np.testing.assert_array_equal(hi, np.maximum(x, y))
    np.testing.assert_array_equal(q, (np.arange(32) + 100) // 7)
    np.testing.assert_array_equal(r, (np.arange(32) + 100) % 7)


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tuple_returns_ptxas(arch):
    assemble(tuples.ptx(arch=arch), arch)


def test_tuple_returns_llvm():
    pytest.importorskip("llvmlite")
    text = tuples.ptx(arch="sm_80", backend="llvm")
    if find_ptxas() is not None:
        assemble(text, "sm_80")


@kaio.gpu_func
def ragged(a: f32):
    if a < 0.0:
        return a, a
    return a


@kaio.gpu_func
def wrong_arity(a: f32) -> tuple[f32, f32]:
    return a, a, a


@kaio.gpu_kernel(block_size=32)
def uses_ragged(x: f32[:]):
    x[0] = ragged(x[1])


@kaio.gpu_kernel(block_size=32)
def uses_wrong_arity(x: f32[:]):
    a, b = wrong_arity(x[1])
    x[0] = a + b


@kaio.gpu_kernel(block_size=32)
def unpacks_three(x: f32[:]):
    a, b, c = minmax(x[1], x[2])
    x[0] = a + b + c


@pytest.mark.parametrize(
    "kernel, message",
    [
        (uses_ragged, "returns a tuple tuple[f32, f32] elsewhere"),
        (uses_wrong_arity, "this returns 3 values"),
        (unpacks_three, "cannot unpack 2 values into 3 names"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_tuple_return_misuse(kernel, message):
    with pytest.raises(kaio.CompileError, match=message.replace("[", r"\[")) as info:
        kernel.ir()
    assert info.value.lineno > 0


# ------------------------------------------------------------------ keyword arguments
@kaio.gpu_func
def axpy(a: f32, x: f32, y: f32 = 1.0) -> f32:
    return a * x + y


@kaio.gpu_kernel(block_size=32)
def keywords(x: f32[:], out: f32[:], old: f32[:]):
    i = kaio.thread_idx_x()
    tile = kaio.shared(shape=32, dtype=f32)
    tile[i] = axpy(x=x[i], a=2.0)
    kaio.sync_threads()
    v = kaio.shfl_xor(tile[i], mask=1)
    out[i] = axpy(3.0, v, y=kaio.max(v, b=0.0))
    old[i] = kaio.atomic_add(out, v=1.0, idx=31 - i)


def test_keyword_arguments_simulated():
    x = RNG.standard_normal(32).astype(np.float32)
    out = np.full(32, np.nan, np.float32)
    old = np.full(32, np.nan, np.float32)
    keywords.sim[1](x, out, old)
    tile = (2.0 * x.astype(np.float64) + 1.0).astype(np.float32)
    v = tile[np.arange(32) ^ 1]
    ref = (np.float32(3.0) * v + np.maximum(v, 0)).astype(np.float32)
    np.testing.assert_array_equal(old[::-1], ref)  # every lane adds once to another's slot
    np.testing.assert_array_equal(out, ref + np.float32(1.0))


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_keyword_arguments_ptxas(arch):
    assemble(keywords.ptx(arch=arch), arch)


@kaio.gpu_kernel(block_size=32)
def _k_unknown(x: f32[:]):
    x[0] = kaio.exp(x[1], y=x[2])


@kaio.gpu_kernel(block_size=32)
def _k_missing(x: f32[:]):
    kaio.atomic_add(x, v=1.0)


@kaio.gpu_kernel(block_size=32)
def _k_twice(x: f32[:]):
    x[0] = kaio.fma(x[1], x[2], x[3], a=1.0)


@kaio.gpu_kernel(block_size=32)
def _k_device_unknown(x: f32[:]):
    x[0] = axpy(1.0, 2.0, z=3.0)


@kaio.gpu_kernel(block_size=32)
def _k_conversion(x: f32[:]):
    x[0] = f32(value=x[1])


@kaio.gpu_kernel(block_size=32)
def _k_gap(x: f32[:]):
    s = kaio.shared_dynamic(f32, offset=16)
    x[0] = s[0]


@pytest.mark.parametrize(
    "kernel, message",
    [
        (_k_unknown, r"kaio.exp\(x\): got an unexpected keyword argument 'y'"),
        (_k_missing, "missing a required argument: 'idx'"),
        (_k_twice, "multiple values for argument 'a'"),
        (_k_device_unknown, r"axpy\(a, x, y=1.0\): got an unexpected keyword argument 'z'"),
        (_k_conversion, "takes no keyword arguments"),
        (_k_gap, "'offset' is given, so 'shape' must be given too"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_keyword_misuse(kernel, message):
    with pytest.raises(kaio.CompileError, match=message) as info:
        kernel.ir()
    err = info.value
    assert err.filename.endswith("test_dsl_generic.py")
    assert err.lineno == kernel.pyfunc.__code__.co_firstlineno + 2  # the call's line


def test_builtins_have_signatures():
    import inspect

    assert str(inspect.signature(kaio.shared)) == "(dtype, shape)"
    assert str(inspect.signature(kaio.shared_dynamic)) == "(dtype, shape=None, offset=None)"
    assert str(inspect.signature(kaio.max)) == "(a, b, *more)"
    assert str(inspect.signature(kaio.thread_idx_x)) == "()"


def test_cli_gives_dtype_constexprs_by_name(capsys):
    from kaio.cli import main

    assert main(["ptx", "tests/plain_generic.py::scale_copy", "-D", "DT=bf16"]) == 0
    text = capsys.readouterr().out
    assert "cvt.f32.bf16" in text or "bf16" in text
    assert main(["ptx", "tests/plain_generic.py::scale_copy", "-D", "DT=kaio.f32"]) == 0
    assert "ld.global.f32" in capsys.readouterr().out


@pytest.mark.gpu
def test_dtype_constexpr_launches_dispatch_per_type():
    """One kernel launched with f16, then f32, then f16 arrays (the launcher built for the
    first type must not take the second's arguments), each against the simulator."""
    for dt in (f16, f32, f16, kaio.bf16):
        n = 50
        x = RNG.standard_normal(64).astype(dt.np_dtype)
        y = RNG.standard_normal(64).astype(dt.np_dtype)
        host = [x, y, np.full(64, np.nan, dt.np_dtype), np.full(64, np.nan, np.float32)]
        dev = [kaio.to_device(a) for a in host]
        scaled_sum[1](*dev, n, dt)
        scaled_sum.sim[1](*host, n, dt)
        for d, h in zip(dev[2:], host[2:], strict=True):
            assert d.numpy().tobytes() == h.tobytes()
