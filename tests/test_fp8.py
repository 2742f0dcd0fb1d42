"""The 8-bit floats kaio.e4m3 and kaio.e5m2: conversions bit-exact (simulator) against an
independent exact rounding and ml_dtypes over all 256 codes and every rounding boundary; PTX
from both backends assembled for sm_89 and sm_90; the errors (sm_80, arithmetic, f64)."""

from __future__ import annotations

import bisect
import functools

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio.ptx.ptxas import assemble, find_ptxas
from tests import fp8_kernels as K

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
FORMATS = {"e4m3": (4, 7, ml_dtypes.float8_e4m3fn), "e5m2": (5, 15, ml_dtypes.float8_e5m2)}


def decode(code: int, name: str) -> float:
    """The value of an fp8 code from its fields (not from ml_dtypes)."""
    ebits, bias, _ = FORMATS[name]
    mbits = 7 - ebits
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if name == "e4m3" and e == 15 and m == 7:
        return float("nan")
    if name == "e5m2" and e == 31:
        return float("nan") if m else sign * float("inf")
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / 2**mbits) * 2.0 ** (e - bias)


@functools.cache
def finite_codes(name: str) -> list[tuple[float, int]]:
    """(value, code) of the non-negative finite codes, by value."""
    return sorted((decode(c, name), c) for c in range(128) if np.isfinite(decode(c, name)))


def reference(x: float, name: str) -> int:
    """cvt.rn.satfinite by hand: the nearest finite code (ties to the even code), saturating,
    NaN to 0x7F. Differences are exact in float64 (the operands have few significant bits)."""
    if np.isnan(x):
        return 0x7F
    finite = finite_codes(name)
    sign = 0x80 if np.signbit(x) else 0
    ax = abs(x)
    if ax >= finite[-1][0]:
        return sign | finite[-1][1]
    at = bisect.bisect_left(finite, (ax, -1))
    near = finite[max(at - 1, 0) : at + 1]
    best = min(near, key=lambda vc: (abs(vc[0] - ax), vc[1] & 1))
    return sign | best[1]


def boundaries(name: str) -> np.ndarray:
    """Every midpoint between neighbouring finite codes, with its f32 neighbours, the largest
    value and beyond, zeros, infinities and NaN; both signs."""
    vals = sorted({decode(c, name) for c in range(128)} - {float("nan")})
    vals = [v for v in vals if np.isfinite(v)]
    pts = []
    for lo, hi in zip(vals, vals[1:], strict=False):
        mid = np.float32((lo + hi) / 2)  # exact: few significant bits
        pts += [lo, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(1e9))]
    top = vals[-1]
    step = top - vals[-2]
    pts += [top, top + step / 2, top + step / 2 + 1e-3, top + step, 1e30, np.inf, np.nan]
    pts += [2.0**-30, 0.0]
    x = np.array(pts, np.float32)
    return np.concatenate([x, -x])


def launch(kernel, *arrays, **constexprs):
    n = len(arrays[0])
    kernel.sim[(n + 127) // 128,](*arrays, np.uint32(n), **constexprs)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_from_fp8_all_codes(name):
    dtype = FORMATS[name][2]
    q = np.arange(256, dtype=np.uint8).view(dtype)
    x = np.full(256, -7.0, np.float32)
    h = np.full(256, -7.0, np.float16)
    b = np.full(256, -7.0, ml_dtypes.bfloat16)
    launch(K.from_fp8, q, x, h, b, FP8=K.TYPES[name])
    expect = np.array([decode(c, name) for c in range(256)])
    for got in (x, h, b):
        got = got.astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(expect))
        ok = ~np.isnan(expect)
        assert np.array_equal(got[ok], expect[ok])
        assert np.array_equal(np.signbit(got[ok]), np.signbit(expect[ok]))  # -0 stays -0
    assert np.array_equal(x[~np.isnan(x)], q.astype(np.float32)[~np.isnan(x)])  # ml_dtypes


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_to_fp8_boundaries(name):
    dtype = FORMATS[name][2]
    x = boundaries(name)
    h = x.astype(np.float16)  # the boundaries of f16 inputs are exact in f16 too
    b = x.astype(ml_dtypes.bfloat16)
    outs = [np.full(len(x), 0x55, np.uint8).view(dtype) for _ in range(3)]
    launch(K.to_fp8, x, h, b, *outs, FP8=K.TYPES[name])
    for src, got in zip((x, h, b), outs, strict=True):
        wide = src.astype(np.float64)
        expect = np.array([reference(float(v), name) for v in wide], np.uint8)
        assert np.array_equal(got.view(np.uint8), expect), wide[got.view(np.uint8) != expect]
        limit = float(ml_dtypes.finfo(dtype).max)
        finite = ~np.isnan(wide)
        via_ml = np.clip(wide[finite].astype(np.float32), -limit, limit).astype(dtype)
        assert np.array_equal(got.view(np.uint8)[finite], via_ml.view(np.uint8))


def test_to_fp8_every_f16():
    """All 65536 f16 values to e4m3 and e5m2 (the GPU's f16x2 path), against ml_dtypes
    clipped (checked against the exact reference above at the boundaries)."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = h.astype(np.float32)
    b = x.astype(ml_dtypes.bfloat16)
    for name in ("e4m3", "e5m2"):
        dtype = FORMATS[name][2]
        outs = [np.zeros(len(h), dtype) for _ in range(3)]
        launch(K.to_fp8, x, h, b, *outs, FP8=K.TYPES[name])
        limit = np.float32(ml_dtypes.finfo(dtype).max)
        expect = np.clip(x, -limit, limit).astype(dtype).view(np.uint8).copy()
        expect[np.isnan(x)] = 0x7F
        assert np.array_equal(outs[0].view(np.uint8), expect)
        assert np.array_equal(outs[1].view(np.uint8), expect)


def test_routed_conversions():
    q = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    r = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2)
    ints = np.arange(-128, 128, dtype=np.int32) * 7
    d = np.zeros(256)
    qi = np.zeros(256, ml_dtypes.float8_e4m3fn)
    qr = np.zeros(256, ml_dtypes.float8_e5m2)
    ints_in = ints.copy()
    launch(K.routed, q, r, ints, d, qi, qr)
    wide = q.astype(np.float64)
    finite = ~np.isnan(wide)
    expect_i = np.where(finite, np.trunc(np.nan_to_num(wide)), 0).astype(np.int32)
    assert np.array_equal(ints, expect_i)
    assert np.array_equal(d[finite], wide[finite]) and np.isnan(d[~finite]).all()
    assert qi.view(np.uint8)[0] == 0x7E  # e4m3(1000.0): saturated to 448
    expect = [reference(float(v), "e4m3") for v in ints_in[1:]]
    assert np.array_equal(qi.view(np.uint8)[1:], expect)
    expect = [reference(float(v), "e5m2") for v in wide]
    assert np.array_equal(qr.view(np.uint8), expect)
    assert np.array_equal(r.view(np.uint8), np.arange(256))


def test_host_conversion():
    assert np.asarray(kaio.e4m3(500.0)).view(np.uint8) == 0x7E
    assert np.asarray(kaio.e5m2(-np.inf)).view(np.uint8) == 0xFB
    assert np.asarray(kaio.f8e4m3(float("nan"))).view(np.uint8) == 0x7F
    # one rounding from f64: 1 + 2**-4 + 2**-40 is just above the e4m3 midpoint 1.0625
    assert float(kaio.e4m3(1 + 2**-4 + 2**-40)) == 1.125
    assert kaio.types.from_numpy_dtype(ml_dtypes.float8_e5m2) is kaio.e5m2


@needs_ptxas
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
def test_ptx_assembles(arch, backend):
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    kernels = (K.to_fp8, K.from_fp8, K.from_bits)
    cases = [(k, {"FP8": t}) for k in kernels for t in K.TYPES.values()]
    for kernel, constexprs in [*cases, (K.routed, {})]:
        ptx = kernel.ptx(arch=arch, backend=backend, **constexprs)
        assert "cvt.rn.satfinite.e" in ptx or "cvt.rn.f16x2.e" in ptx
        assemble(ptx, arch)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_bytes_bitcast_to_and_from_fp8(name):
    """Every code as a byte of a u32 word, ``bitcast`` to fp8 (its value, against the
    fields' decoding) and back to int8 (the same code)."""
    codes = np.arange(256, dtype=np.uint8)
    x, back = np.full(256, 7.0, np.float32), np.zeros(256, np.int32)
    with kaio.simulate():
        K.from_bits[2, 128](codes.view(np.uint32), x, back, 256, FP8=K.TYPES[name])
    want = np.array([decode(int(c), name) for c in codes])
    np.testing.assert_array_equal(x, want.astype(np.float32))  # NaN where NaN
    np.testing.assert_array_equal(back, codes.view(np.int8))


def test_sm80_refused_with_location():
    with pytest.raises(kaio.CompileError) as info:
        K.to_fp8.ptx(arch="sm_80", FP8=kaio.e4m3)
    err = info.value
    assert err.filename.endswith("fp8_kernels.py") and err.lineno > 0
    assert "sm_89" in str(err) and "kaio.e4m3()" in str(err)


def _compile(src: str):
    import importlib.util
    import pathlib
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp()) / "fp8_bad.py"
    path.write_text("import kaio\nfrom kaio import e4m3, f32, f64, u32\n\n" + src)
    spec = importlib.util.spec_from_file_location("fp8_bad", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.k.ptx(arch="sm_90")


@pytest.mark.parametrize(
    "body, message",
    [
        ("o[0] = q[0] + q[1]", "no arithmetic on e4m3"),
        ("o[0] = q[0] * 2.0", "no arithmetic on e4m3"),
        ("o[0] = -q[0]", "no arithmetic on e4m3"),
        ("o[0] = e4m3(d[0])", "round twice"),
    ],
)
def test_errors(body, message):
    src = (
        f"@kaio.gpu_kernel(block_size=32)\ndef k(q: e4m3[:], o: e4m3[:], d: f64[:]):\n    {body}\n"
    )
    with pytest.raises(kaio.CompileError, match=message) as info:
        _compile(src)
    assert info.value.lineno == 6


def test_wgmma_fp8_has_no_transpose():
    src = (
        "@kaio.gpu_kernel(block_size=128)\n"
        "def k(q: e4m3[:], o: e4m3[:], d: f64[:]):\n"
        "    acc = kaio.local(f32, (64,))\n"
        "    s = kaio.shared(kaio.u8, (2048,))\n"
        "    da = kaio.smem_descriptor(s, (0,), 0, 128, 256)\n"
        "    kaio.wgmma_e4m3(acc, da, da, True, False, True)\n"
    )
    # no transpose arguments: the call binds against the builtin's signature, which has none
    with pytest.raises(kaio.CompileError, match="accumulate\\): too many positional") as info:
        _compile(src)
    assert info.value.lineno == 9


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_gpu_conversions_match_simulator(backend):
    """On an sm_89+ GPU, both backends' conversions give the simulator's bits: every f16
    value (so every boundary, saturation, infinities and NaN payloads) to e4m3 and e5m2,
    through the f32, f16 and bf16 paths, and all 256 codes back."""
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    from tests.test_llvm_backend import twin

    dev = kaio.device()
    if dev.compute_capability < (8, 9):
        pytest.skip(f"fp8 conversions need sm_89+, this GPU is {dev.arch}")
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x = h.astype(np.float32)
    b = x.astype(ml_dtypes.bfloat16)
    for name, dtype in ((n, FORMATS[n][2]) for n in FORMATS):
        fp8 = K.TYPES[name]
        kernel = twin(K.to_fp8, backend)
        outs = [kaio.to_device(np.full(len(h), 0x55, np.uint8).view(dtype)) for _ in range(3)]
        ins = [kaio.to_device(v) for v in (x, h, b)]
        kernel[(len(h) + 127) // 128,](*ins, *outs, np.uint32(len(h)), FP8=fp8)
        want = [np.zeros(len(h), dtype) for _ in range(3)]
        launch(K.to_fp8, x, h, b, *want, FP8=fp8)
        for got, w in zip(outs, want, strict=True):
            assert np.array_equal(got.numpy().view(np.uint8), w.view(np.uint8))
        q = np.arange(256, dtype=np.uint8).view(dtype)
        back = [
            kaio.to_device(np.zeros(256, t)) for t in (np.float32, np.float16, ml_dtypes.bfloat16)
        ]
        twin(K.from_fp8, backend)[2,](kaio.to_device(q), *back, np.uint32(256), FP8=fp8)
        want = [np.zeros(256, t) for t in (np.float32, np.float16, ml_dtypes.bfloat16)]
        launch(K.from_fp8, q, *want, FP8=fp8)
        for got, w in zip(back, want, strict=True):
            assert np.array_equal(got.numpy().view(np.uint8), w.view(np.uint8))
