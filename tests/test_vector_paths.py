"""The ops' vector paths at boundary shapes (issue 30.1): a path of 16-byte copies or paired
stores is taken only when every array it touches allows it. The simulator checks each
vector access for alignment and bounds, so a wrong choice is an error here, where on a GPU it
is CUDA_ERROR_MISALIGNED_ADDRESS (the context lost) or a write past the output."""

from __future__ import annotations

import numpy as np
import pytest

import kaio
import kaio_ops
from kaio_ops.matmul import Plan, run
from tests.test_ops_quantized import int4_case, int8_reference, pack_int4

RNG = np.random.default_rng(30)

# (m, k, n): K a multiple of 16 (the int8 copy width) with N odd, N = 1, M = 1
INT8_BOUNDARIES = [(16, 32, 17), (1, 32, 3), (40, 64, 33)]


@pytest.mark.parametrize("m, k, n", INT8_BOUNDARIES)
def test_int8_output_stores_need_n_even(m, k, n):
    """Before: the vector path was chosen from K alone, and its paired stores of c were
    misaligned (N odd) or one past the row."""
    a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    with kaio.simulate():
        c = kaio_ops.matmul_int8(a, b, 0.75)
    np.testing.assert_array_equal(c, int8_reference(a, b, 0.75))


@pytest.mark.parametrize("m, k, n", [(1, 16, 1), (17, 32, 5)])
def test_f16_matmul_boundaries(m, k, n):
    """K a multiple of 8 (the f16 copy width) with N = 1 or odd, M = 1 and M just past a
    tile (the tile of test_ops_matmul's element-path case: one compiled variant)."""
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    with kaio.simulate():
        c = run(a, b, kaio.f16, True, Plan("128x128"))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-3)


def test_int4_boundary():
    """N odd: the words' rows (2N halves) are no whole 16-byte copy."""
    a, packed, scales, w = int4_case(5, 3, 128, RNG)
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n", [*INT8_BOUNDARIES, (1, 32, 1), (7, 4096, 4097), (1000, 1024, 1031)]
)
def test_gpu_int8_odd_n(m, k, n):
    """On the GPU, the shapes whose paired stores were misaligned or past the row: exact
    results and no CUDA error (compute-sanitizer memcheck over this test shows no access
    out of bounds)."""
    a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    c = kaio_ops.matmul_int8(kaio.to_device(a), kaio.to_device(b), 0.75)
    np.testing.assert_array_equal(c.numpy(), int8_reference(a, b, 0.75))
    kaio.synchronize()


def test_int4_pack_helper_is_the_documented_one():
    """The packing this file borrows packs nibble i of word r as k = 8 r + i."""
    q = np.arange(16).reshape(16, 1) % 8 - 4
    words = pack_int4(q)
    assert words.shape == (2, 1)
    assert [(int(words[1, 0]) >> (4 * i)) & 0xF for i in range(8)] == [x & 0xF for x in q[8:, 0]]
