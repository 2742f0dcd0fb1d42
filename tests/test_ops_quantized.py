"""Quantized matmuls: int8 (exact: bit-identical with an integer NumPy reference, on the
simulator and on the GPU) and int4 (against float64 products with the dequantized weights),
input checks, and every specialization's PTX through ptxas."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops.quantized import specializations

RNG = np.random.default_rng(77)


def int8_reference(a, b, scale) -> np.ndarray:
    """f32(a @ b) * f32(scale) with exact integer products and sums."""
    exact = a.astype(np.int8).astype(np.int64) @ b.astype(np.int8).astype(np.int64)
    return exact.astype(np.float32) * np.float32(scale)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """[K, N] signed nibbles -> [K/8, N] uint32 words, nibble i of word r is k = 8 r + i."""
    k, n = q.shape
    nibbles = (q & 0xF).astype(np.uint32).reshape(k // 8, 8, n)
    return np.bitwise_or.reduce([nibbles[:, i] << np.uint32(4 * i) for i in range(8)])


def int4_case(m, n, k, rng=RNG):
    """f16 activations, packed weights, f16 scales, and the dequantized f16 weights."""
    a = rng.standard_normal((m, k)).astype(np.float16)
    q = rng.integers(-8, 8, (k, n))
    scales = (rng.random((k // 128, n)) * 0.05 + 0.01).astype(np.float16)
    w = (np.repeat(scales.astype(np.float32), 128, axis=0) * q).astype(np.float16)
    return a, pack_int4(q), scales, w


@pytest.mark.parametrize(
    "m, n, k", [(40, 48, 96), (33, 17, 21), (130, 136, 128), (3, 72, 520), (1, 40, 1000)]
)
@pytest.mark.parametrize("unsigned", [False, True])
def test_int8_exact_in_simulator(m, n, k, unsigned):
    a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    scale = 0.37
    if unsigned:
        a, b = a.view(np.uint8), b.view(np.uint8)
    with kaio.simulate():
        c = kaio_ops.matmul_int8(a, b, scale)
    np.testing.assert_array_equal(c, int8_reference(a, b, scale))


@pytest.mark.parametrize("m, n, k", [(40, 48, 128), (3, 72, 256), (130, 136, 384), (17, 20, 128)])
def test_int4_in_simulator(m, n, k):
    a, packed, scales, w = int4_case(m, n, k)
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    assert c.dtype == np.float32 and np.isfinite(c).all()
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-5


def test_int4_packing_reference_matches_the_documented_layout():
    q = RNG.integers(-8, 8, (16, 3))
    words = pack_int4(q)
    for k in range(16):
        for n in range(3):
            nibble = (int(words[k // 8, n]) >> (4 * (k % 8))) & 0xF
            assert nibble - 16 * (nibble >= 8) == q[k, n]


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: kaio_ops.matmul_int8(np.ones((4, 8), np.float16), np.ones((8, 4), np.int8)),
            "'a' must be a 2-D array",
        ),
        (
            lambda: kaio_ops.matmul_int8(np.ones((4, 8), np.int8), np.ones((8, 4), np.uint8)),
            "'b' must be a 2-D array",
        ),
        (
            lambda: kaio_ops.matmul_int8(np.ones((4, 8), np.int8), np.ones((9, 4), np.int8)),
            "'b' must have K = 8",
        ),
        (
            lambda: kaio_ops.matmul_int4(
                np.ones((4, 100), np.float16),
                np.ones((12, 4), np.uint32),
                np.ones((1, 4), np.float16),
            ),
            "multiple of 128",
        ),
        (
            lambda: kaio_ops.matmul_int4(
                np.ones((4, 128), np.float16),
                np.ones((15, 4), np.uint32),
                np.ones((1, 4), np.float16),
            ),
            "'b_packed' must have shape",
        ),
        (
            lambda: kaio_ops.matmul_int4(
                np.ones((4, 128), np.float16),
                np.ones((16, 4), np.uint32),
                np.ones((2, 4), np.float16),
            ),
            "'scales' must have shape",
        ),
    ],
)
def test_bad_inputs_name_the_argument(call, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_specialization_assembles(arch):
    texts = [kernel.ptx(arch=arch, **constexprs) for kernel, constexprs in specializations()]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda ptx: assemble(ptx, arch), texts))


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (16, 4096, 4096), (1000, 1030, 770)])
def test_gpu_int8_exact(m, n, k):
    import torch

    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, device="cuda")
    c = kaio_ops.matmul_int8(a, b, 0.25)
    exact = a.double() @ b.double()  # sums below 2**53: exact in float64, fast on the GPU
    want = (exact.float() * 0.25).cpu().numpy()  # f32(sum) * f32(0.25), like the reference
    np.testing.assert_array_equal(c.cpu().numpy(), want)


@pytest.mark.gpu
def test_gpu_int8_matches_simulator_bits():
    a = RNG.integers(-128, 128, (70, 200)).astype(np.int8)
    b = RNG.integers(-128, 128, (200, 90)).astype(np.int8)
    with kaio.simulate():
        sim = kaio_ops.matmul_int8(a, b, 1.5)
    gpu = kaio_ops.matmul_int8(kaio.to_device(a), kaio.to_device(b), 1.5).numpy()
    np.testing.assert_array_equal(gpu, sim)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1, 4096, 4096), (16, 4096, 4096)])
def test_gpu_int4(m, n, k):
    import torch

    a, packed, scales, w = int4_case(m, n, k, np.random.default_rng(m))
    dev = [torch.from_numpy(x).cuda() for x in (a, packed.view(np.int32), scales)]
    c = kaio_ops.matmul_int4(*dev).cpu().numpy()
    ref = a.astype(np.float64) @ w.astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-4
