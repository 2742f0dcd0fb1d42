"""Mistakes that compiled silently or escaped as the wrong exception (issue 29, items 5 and 6):
each is now a located error, a warning, or does what it says."""

import builtins
import importlib.util
import warnings

import numpy as np
import pytest

import kaio
from kaio import bf16, f16, f32, i32, i64, u32, u64

SHAPE = (2, 3)  # a module-level tuple used as a shape


def _module(tmp_path, name: str, source: str):
    """Import ``source`` as a module from a file (kernels need their source on disk)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- item 5
def test_kernel_parameter_defaults_are_refused_at_definition(tmp_path):
    source = (
        "import kaio\nfrom kaio import f32\n\n@kaio.gpu_kernel(block_size=32)\n"
        "def k(out: f32[:],\n      a: f32 = 1.0):\n    out[0] = a\n"
    )
    with pytest.raises(kaio.CompileError, match="'a' has a default value") as info:
        _module(tmp_path, "defaults_kernel", source)
    assert info.value.lineno == 6 and info.value.col == 6, str(info.value)


@kaio.gpu_func
def add_default(a: f32, b: f32 = 2.0) -> f32:
    return a + b


@kaio.gpu_kernel(block_size=32)
def uses_defaults(x: f32[:], out: f32[:]):
    i = kaio.thread_idx_x()
    out[i] = add_default(x[i]) + add_default(x[i], b=10.0)


def test_device_function_defaults_are_bound_as_python_binds_them():
    # A device function's default applies where a call leaves the argument out (keyword
    # arguments bind by name); only a kernel's defaults are refused, since launches pass all.
    x = np.random.default_rng(8).standard_normal(32).astype(np.float32)
    out = np.full(32, np.nan, np.float32)
    uses_defaults.sim[1](x, out)
    np.testing.assert_array_equal(out, (x + np.float32(2.0)) + (x + np.float32(10.0)))


@kaio.gpu_func
def scale_index(i: u32) -> u32:
    return i * 2


@kaio.gpu_kernel(block_size=32)
def float_to_u32_argument(x: f32[:], out: u32[:]):
    i = kaio.thread_idx_x()
    out[i] = scale_index(x[i])  # an f32 into a u32 parameter


@kaio.gpu_kernel(block_size=32)
def int_to_float_argument(x: f32[:], out: f32[:]):
    i = kaio.thread_idx_x()
    out[i] = kaio.fma(x[i], 2.0, 1.0) + f32(scale_index(i))


def test_device_function_arguments_convert_like_assignments():
    with pytest.raises(kaio.CompileError, match=r"'i' is u32 but this value is f32.*u32\(\.\.\.\)"):
        float_to_u32_argument.ir()
    x = np.random.default_rng(5).standard_normal(32).astype(np.float32)
    out = np.full(32, np.nan, np.float32)
    int_to_float_argument.sim[1](x, out)
    expected = x.astype(np.float64) * 2.0 + 1.0 + 2.0 * np.arange(32)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@kaio.gpu_kernel(block_size=32)
def unsigned_vs_negative(out: i32[:], n: u32):
    i = kaio.thread_idx_x()
    if n > -1:
        out[i] = 1


@kaio.gpu_kernel(block_size=32)
def signed_vs_negative(out: i32[:], n: i32):
    i = kaio.thread_idx_x()
    if n > -1:
        out[i] = 1


def test_unsigned_compared_with_a_negative_literal_warns_with_its_location():
    with pytest.warns(kaio.UnsignedComparisonWarning, match=r"test_language_edges.py:\d+:\d+"):
        unsigned_vs_negative.ir()
    assert issubclass(kaio.UnsignedComparisonWarning, kaio.KaioWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kaio.KaioWarning)
        signed_vs_negative.ir()  # no warning for a signed operand


@kaio.gpu_kernel(block_size=6)
def tuple_constant_shape(x: f32[:], out: f32[:]):
    s = kaio.shared(f32, SHAPE)
    i = kaio.thread_idx_x()
    s[i // 3, i % 3] = x[i]
    kaio.sync_threads()
    out[i] = s[1 - i // 3, i % 3]


def test_module_tuple_constant_is_a_shape():
    x = np.random.default_rng(6).standard_normal(6).astype(np.float32)
    out = np.full(6, np.nan, np.float32)
    tuple_constant_shape.sim[1](x, out)
    np.testing.assert_array_equal(out, x.reshape(2, 3)[::-1].ravel())


@kaio.gpu_kernel(block_size=4)
def numpy_constexpr(x: f32[:], out: f32[:], N: kaio.constexpr):
    i = kaio.thread_idx_x()
    acc = 0.0
    for j in kaio.static_range(N):
        acc += x[i] * f32(j)
    out[i] = acc


def test_numpy_integer_constexprs_are_ints():
    x = np.random.default_rng(7).standard_normal(4).astype(np.float32)
    out = np.full(4, np.nan, np.float32)
    numpy_constexpr.sim[1](x, out, N=np.int32(4))
    np.testing.assert_allclose(out, x * 6.0, rtol=1e-6)


def test_f16_overflow_is_inf_without_a_numpy_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isinf(f16(70000.0)) and f16(-70000.0) < 0
        assert np.isinf(np.float32(bf16(1e39)))


# ----------------------------------------------------------------------------- item 6
def test_long_operator_chains_and_deep_nesting(tmp_path):
    chain = " + ".join(["x[0]"] * 600)
    source = (
        "import kaio\nfrom kaio import f32\n\n@kaio.gpu_kernel(block_size=1)\n"
        f"def k(x: f32[:], out: f32[:]):\n    out[0] = {chain}\n\n"
        "@kaio.gpu_kernel(block_size=1)\n"
        f"def deep(x: f32[:], out: f32[:]):\n    out[0] = {'-' * 900}x[0]\n"
    )
    m = _module(tmp_path, "deep_kernels", source)
    x = np.array([0.25], np.float32)
    out = np.zeros(1, np.float32)
    m.k.sim[1](x, out)
    assert out[0] == 150.0
    with pytest.raises(kaio.CompileError, match="nests too deeply") as info:
        m.deep.ir()
    assert info.value.lineno == 10, str(info.value)


@pytest.mark.parametrize(
    "block_size", [256.0, 1e100, "256", (32, 0), (1, 2, 3, 4), True, (32, True)]
)
def test_bad_block_size_is_refused_at_decoration(block_size):
    with pytest.raises(kaio.LaunchError, match="block_size"):

        @kaio.gpu_kernel(block_size=block_size)
        def k(out: f32[:]):
            out[0] = 1.0


@pytest.mark.parametrize("annotation", ["f32[0]", "bf16x2[:]", "f32[:, 1]"])
@pytest.mark.parametrize("future", [False, True])
def test_malformed_annotations_give_one_located_error(tmp_path, annotation, future):
    source = (
        ("from __future__ import annotations\n" if future else "")
        + "import kaio\nfrom kaio import f32, bf16x2\n\n@kaio.gpu_kernel(block_size=1)\n"
        f"def k(out: f32[:],\n      bad: {annotation}):\n    out[0] = 1.0\n"
    )
    name = f"ann_{abs(hash((annotation, future)))}"
    with pytest.raises(kaio.CompileError, match="parameter 'bad'") as info:
        _module(tmp_path, name, source)
    assert info.value.lineno == 6 + future and info.value.col == 6, str(info.value)


def _nearest(t, exact) -> float:
    """The value of type ``t`` nearest to the Fraction ``exact`` (ties to the even bit
    pattern), by searching every finite value of the 16-bit type."""
    from fractions import Fraction

    with np.errstate(invalid="ignore"):
        values = np.arange(1 << 16, dtype=np.uint16).view(t.np_dtype).astype(np.float64)
    finite = np.isfinite(values)
    bits = np.arange(1 << 16)[finite]
    values = values[finite]
    x = float(exact)
    order = np.argsort(np.abs(values - x))[:8]  # candidates; then exact comparison
    best = min(order, key=lambda i: (abs(Fraction(values[i]) - exact), bits[i] & 1))
    return float(values[best])


@kaio.gpu_kernel(block_size=1)
def fma_f16(x: f16[:], out: f16[:]):
    out[0] = kaio.fma(x[0], x[1], x[2])


@kaio.gpu_kernel(block_size=1)
def fma_bf16(x: bf16[:], out: bf16[:]):
    out[0] = kaio.fma(x[0], x[1], x[2])


@pytest.mark.parametrize(
    ("t", "a", "b", "c"),
    [
        (f16, -3224.0, 14.0, -1.09e-4),  # one rounding: -45152 (two gave -45120)
        (f16, 1.0009765625, 1.0009765625, -1.0),
        (f16, 7.0, 37.0 / 256.0, 2.0**-24),
        (bf16, 1.0078125, 1.0078125, -1.0),
        (bf16, 7.0, 37.0 / 256.0, 2.0**-100),
        (bf16, -3.0, 85.5, 1e-30),
    ],
)
def test_half_fma_rounds_once(t, a, b, c):
    from fractions import Fraction

    kernel = fma_f16 if t == f16 else fma_bf16
    x = np.array([a, b, c], np.float64).astype(t.np_dtype)
    out = np.full(1, np.nan, t.np_dtype)
    kernel.sim[1](x, out)
    exact = Fraction(float(x[0])) * Fraction(float(x[1])) + Fraction(float(x[2]))
    assert float(out[0]) == _nearest(t, exact)
    if t == f16 and a == -3224.0:
        assert float(out[0]) == -45152.0
    for arch in ("sm_80", "sm_90"):
        assert f"fma.rn.{t.name} " in kernel.ptx(arch=arch)


def test_star_import_keeps_python_builtins():
    namespace: dict = {}
    exec("from kaio import *", namespace)
    for name in ("abs", "min", "max", "pow"):
        assert name not in namespace
        assert getattr(kaio, name) is not getattr(builtins, name)
    assert "f32" in namespace and "gpu_kernel" in namespace and "thread_idx_x" in namespace


@kaio.gpu_kernel(block_size=1)
def shifts_and_division(a: u64[:], s: u64[:], t: i64[:], out: u64[:], d: i32[:], q: i32[:]):
    out[0] = a[0] << s[0]
    out[1] = a[0] >> s[0]
    out[2] = a[0] << t[0]
    out[3] = a[0] << s[1]
    q[0] = d[0] // d[1]
    q[1] = d[0] % d[1]


def test_64_bit_shift_amounts_clamp_and_division_by_zero_is_zero_in_the_simulator():
    a = np.array([0x1234_5678_9ABC], np.uint64)
    s = np.array([2**32, 3], np.uint64)  # 2**32 once truncated to a shift by 0
    t = np.array([-1], np.int64)
    out = np.full(4, 7, np.uint64)
    q = np.full(2, 7, np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shifts_and_division.sim[1](a, s, t, out, np.array([9, 0], np.int32), q)
    np.testing.assert_array_equal(out, [0, 0, 0, 0x1234_5678_9ABC << 3])
    np.testing.assert_array_equal(q, [0, 0])
    assert "min.u64" in shifts_and_division.ptx(arch="sm_80")


@pytest.mark.gpu
def test_half_fma_and_64_bit_shifts_on_the_gpu():
    """The GPU gives the simulator's (and the correctly rounded) values."""
    from fractions import Fraction

    for t, kernel, (a, b, c) in (
        (f16, fma_f16, (-3224.0, 14.0, -1.09e-4)),
        (f16, fma_f16, (7.0, 37.0 / 256.0, 2.0**-24)),
        (bf16, fma_bf16, (7.0, 37.0 / 256.0, 2.0**-100)),
        (bf16, fma_bf16, (1.0078125, 1.0078125, -1.0)),
    ):
        x = np.array([a, b, c], np.float64).astype(t.np_dtype)
        out = kaio.to_device(np.full(1, np.nan, t.np_dtype))
        kernel[1](kaio.to_device(x), out)
        exact = Fraction(float(x[0])) * Fraction(float(x[1])) + Fraction(float(x[2]))
        assert float(out.numpy()[0]) == _nearest(t, exact), (t, a, b, c)
    a = np.array([0x1234_5678_9ABC], np.uint64)
    s = np.array([2**32, 3], np.uint64)
    t64 = np.array([-1], np.int64)
    out = kaio.to_device(np.full(4, 7, np.uint64))
    q = kaio.to_device(np.full(2, 7, np.int32))
    d = np.array([9, 3], np.int32)
    shifts_and_division[1](*(kaio.to_device(v) for v in (a, s, t64)), out, kaio.to_device(d), q)
    np.testing.assert_array_equal(out.numpy(), [0, 0, 0, 0x1234_5678_9ABC << 3])
    np.testing.assert_array_equal(q.numpy(), [3, 0])
