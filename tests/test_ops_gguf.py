"""kaio_ops GGUF quantizers: the simulator's bytes against a NumPy port of ggml's reference
encoders (tests/gguf_reference.py; f32, f16, bf16 inputs, aligned and misaligned, zero and
tiny groups, exact halves, heavy tails), the dequantizers against NumPy and against the
``gguf`` package's decoder, argument checking, PTX through ptxas, and (marked gpu) a
4096 x 4096 tensor on the GPU against the simulator and the NumPy reference."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import gguf
from tests import gguf_reference as ref
from tests.poison import poison_allocations

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output an op allocates starts poisoned (NaN, or 0xA5 bytes), so a value nobody
    wrote fails the comparisons."""
    poison_allocations(monkeypatch)


def _place(values: np.ndarray, offset: bool) -> np.ndarray:
    """``values``, or a copy one element past a 16-byte boundary (the scalar-load path)."""
    if not offset:
        return values
    buf = np.empty(values.size + 1, values.dtype)
    out = buf[1:].reshape(values.shape)
    out[...] = values
    return out


def _q6_inputs(rng, dtype) -> np.ndarray:
    """[3, 768] (nine super-blocks: two blocks of the kernel, the second partly idle) with the
    cases the encoder branches on: a zero sub-block, a sub-block so small its int8 scale is
    0 (its quants then come from the scale search), two largest scales of opposite signs, an
    all-zero super-block, integers (rounding ties), a heavy tail and a super-block whose only
    large value is negative."""
    x = rng.standard_normal((3, 768)).astype(np.float32)
    x[0, :16] = 0
    x[0, 16:32] *= 1e-6
    x[0, 256:272] *= 10  # the largest scale, twice with opposite signs: the first one counts
    x[0, 288:304] = -x[0, 256:272]
    x[1, 256:512] = 0
    x[1, 512:768] = rng.integers(-40, 40, 256)
    x[2, :256] = rng.standard_t(2, 256)
    x[2, 256:512] *= 0.01
    x[2, 300] = -50.0
    return x.astype(dtype)


def _q8_inputs(rng, dtype) -> np.ndarray:
    """[3, 96] with exact halves: a block whose |max| is 127 has d = 1, so x * (1/d) = x
    and roundf must take halves away from zero; also a zero block."""
    x = (rng.standard_normal((3, 96)) * 3).astype(np.float32)
    x[0, :32] = np.arange(32) - 15.5
    x[0, 7] = 127.0
    x[0, 8] = -0.5
    x[0, 9] = 0.49999997
    x[1, 32:64] = 0
    return x.astype(dtype)


# ---------------------------------------------------------------------------- simulator
@pytest.mark.parametrize("offset", [False, True], ids=["aligned", "offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_quantize_q6_k_sim_matches_ggml_reference(dtype, offset):
    x = _place(_q6_inputs(np.random.default_rng(1), dtype), offset)
    with kaio.simulate():
        out = kaio_ops.quantize_q6_k(x)
    assert out.dtype == np.uint8 and out.shape == (3, 3 * 210)
    expected = ref.quantize_q6_k(x.astype(np.float32))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("offset", [False, True], ids=["aligned", "offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_quantize_q8_0_sim_matches_ggml_reference(dtype, offset):
    x = _place(_q8_inputs(np.random.default_rng(2), dtype), offset)
    with kaio.simulate():
        out = kaio_ops.quantize_q8_0(x)
    assert out.dtype == np.uint8 and out.shape == (3, 3 * 34)
    np.testing.assert_array_equal(out, ref.quantize_q8_0(x.astype(np.float32)))


def _random_blocks(rng, rows: int, n: int, nbytes: int) -> np.ndarray:
    """Random block bytes whose fp16 scales are finite (the last two bytes of a Q6_K block,
    the first two of a Q8_0 block)."""
    b = rng.integers(0, 256, (rows, n, nbytes), dtype=np.uint8)
    d = (rng.standard_normal((rows, n)) * 0.1).astype(np.float16).view(np.uint8)
    at = 0 if nbytes == ref.Q8_0_BYTES else nbytes - 2
    b[:, :, at : at + 2] = d.reshape(rows, n, 2)
    return b.reshape(rows, n * nbytes)


@pytest.mark.parametrize(
    "op, numpy_op, nbytes, group",
    [
        (kaio_ops.dequantize_q8_0, ref.dequantize_q8_0, ref.Q8_0_BYTES, ref.QK8_0),
        (kaio_ops.dequantize_q6_k, ref.dequantize_q6_k, ref.Q6_K_BYTES, ref.QK_K),
    ],
    ids=["q8_0", "q6_k"],
)
def test_dequantize_sim_matches_numpy(op, numpy_op, nbytes, group):
    blocks = _random_blocks(np.random.default_rng(3), 3, 3, nbytes)
    with kaio.simulate():
        out = op(blocks)
    assert out.dtype == np.float32 and out.shape == (3, 3 * group)
    np.testing.assert_array_equal(out, numpy_op(blocks))


def test_gguf_package_decodes_our_blocks():
    """The gguf package's NumPy dequantizer reads our bytes as the values our dequantizer
    gives, and the reference port agrees with the package's own Q8_0 encoder."""
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    with kaio.simulate():
        q6 = kaio_ops.quantize_q6_k(x)
        q8 = kaio_ops.quantize_q8_0(x)
        d6 = kaio_ops.dequantize_q6_k(q6)
        d8 = kaio_ops.dequantize_q8_0(q8)
    np.testing.assert_array_equal(gguf_quants.dequantize(q6, Q.Q6_K), d6)
    np.testing.assert_array_equal(gguf_quants.dequantize(q8, Q.Q8_0), d8)
    np.testing.assert_array_equal(gguf_quants.quantize(x, Q.Q8_0), q8)
    # and the values are x to within 6 and 8 bits
    assert np.linalg.norm(d6 - x) / np.linalg.norm(x) < 0.03
    assert np.linalg.norm(d8 - x) / np.linalg.norm(x) < 0.01


def test_reference_nearest_int_and_roundf():
    """The port's two rounding helpers, against Python on values around halves."""
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999997, -2.5000002, 126.5, 3.0], np.float32)
    np.testing.assert_array_equal(ref.nearest_int(v), [0, 2, 2, 0, -2, 0, -3, 126, 3])
    np.testing.assert_array_equal(ref.roundf(v), [1, 2, 3, -1, -2, 0, -3, 127, 3])


def test_empty_inputs():
    with kaio.simulate():
        assert kaio_ops.quantize_q6_k(np.ones((0, 256), np.float32)).shape == (0, 210)
        assert kaio_ops.quantize_q8_0(np.ones((2, 0), np.float32)).shape == (2, 0)
        assert kaio_ops.dequantize_q6_k(np.ones((0, 210), np.uint8)).shape == (0, 256)


# ---------------------------------------------------------------------------- errors
def _expect(match, fn, *args):
    with pytest.raises(ValueError, match=match):
        fn(*args)


def test_bad_inputs_raise_value_error_naming_the_argument():
    with kaio.simulate():
        _expect(
            "quantize_q6_k: argument 'x'.*f32, f16 or bf16, got dtype f64",
            kaio_ops.quantize_q6_k,
            np.ones((2, 256)),
        )
        _expect(
            "argument 'x' must have a multiple of 256 columns",
            kaio_ops.quantize_q6_k,
            np.ones((2, 128), np.float32),
        )
        _expect(
            "argument 'x' must have a multiple of 32 columns",
            kaio_ops.quantize_q8_0,
            np.ones((2, 48), np.float32),
        )
        _expect(r"argument 'x'.*2-D array", kaio_ops.quantize_q8_0, np.ones(64, np.float32))
        _expect("argument 'x'.*contiguous", kaio_ops.quantize_q8_0, np.ones((4, 64), "f4")[::2])
        _expect(
            "dequantize_q8_0: argument 'blocks'.*u8, got dtype f32",
            kaio_ops.dequantize_q8_0,
            np.ones((2, 34), np.float32),
        )
        _expect(
            "argument 'blocks' must have a multiple of 210 bytes",
            kaio_ops.dequantize_q6_k,
            np.ones((2, 200), np.uint8),
        )
    with pytest.raises(ValueError, match="argument 'x'") as e:
        kaio_ops.quantize_q8_0(np.ones((2, 32), np.float32))
    assert "kaio.to_device" in str(e.value) and "kaio.simulate()" in str(e.value)


# ---------------------------------------------------------------------------- PTX
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_shipped_specialization_assembles(arch):
    texts = [kernel.ptx(arch=arch, **constexprs) for kernel, constexprs in gguf.shipped()]
    assert len(texts) == 14
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda text: assemble(text, arch), texts))


# ---------------------------------------------------------------------------- GPU
SIM_ROWS = 2  # rows of the 4096-wide GPU tensor also run through the simulator


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_quantizers_gpu_4096(name):
    """4096 x 4096 on the GPU: bytes equal to the NumPy reference everywhere and to the
    simulator on the first rows; the dequantizers equal NumPy on those bytes."""
    torch = pytest.importorskip("torch")
    dt = getattr(torch, name)
    np_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]
    x = (torch.randn(4096, 4096, device="cuda") * 0.02).to(dt)
    x[7, :256] = 0
    host = x.float().cpu().numpy()
    for quantize, dequantize, np_quantize, np_dequantize in [
        (kaio_ops.quantize_q6_k, kaio_ops.dequantize_q6_k, ref.quantize_q6_k, ref.dequantize_q6_k),
        (kaio_ops.quantize_q8_0, kaio_ops.dequantize_q8_0, ref.quantize_q8_0, ref.dequantize_q8_0),
    ]:
        q = quantize(x)
        assert type(q) is torch.Tensor and q.dtype == torch.uint8 and q.device == x.device
        got = q.cpu().numpy()
        expected = np_quantize(host)
        np.testing.assert_array_equal(got, expected)
        with kaio.simulate():
            first = x[:SIM_ROWS].float().cpu().numpy().astype(np_dtype)  # exact
            np.testing.assert_array_equal(quantize(first), got[:SIM_ROWS])
        d = dequantize(q)
        assert d.dtype == torch.float32 and d.shape == x.shape
        np.testing.assert_array_equal(d.cpu().numpy(), np_dequantize(expected))


@pytest.mark.gpu
def test_device_array_and_cupy_in_kind_out():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    q = kaio_ops.quantize_q6_k(kaio.to_device(x))
    assert isinstance(q, kaio.DeviceArray)
    np.testing.assert_array_equal(q.numpy(), ref.quantize_q6_k(x))
    d = kaio_ops.dequantize_q6_k(q)
    assert isinstance(d, kaio.DeviceArray)
    np.testing.assert_array_equal(d.numpy(), ref.dequantize_q6_k(q.numpy()))
    cupy = pytest.importorskip("cupy")
    q8 = kaio_ops.quantize_q8_0(cupy.asarray(x))
    assert isinstance(q8, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(q8), ref.quantize_q8_0(x))
    d8 = kaio_ops.dequantize_q8_0(q8)
    np.testing.assert_array_equal(cupy.asnumpy(d8), ref.dequantize_q8_0(cupy.asnumpy(q8)))
