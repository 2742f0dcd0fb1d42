"""Quantized matmuls: int8 (exact: bit-identical with an integer NumPy reference, on the
simulator and on the GPU) and int4 (against float64 products with the dequantized weights),
input checks, and every specialization's PTX through ptxas."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

import kaio
import kaio_ops
from kaio import f16, f32, u32
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _arrays, _int4_decode, _int8_decode, _prefill
from kaio_ops._matmul_kernels import qkv_kernel
from kaio_ops.matmul import CONFIGS, Plan, heuristic, k_slices
from kaio_ops.quantized import FALLBACK, _qkv_plan, project_int8, qkv_constexprs, specializations
from tests.harness import covering
from tests.launches import launched
from tests.poison import poison_allocations

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
    "m, n, k",
    # (3, 72, 524), (1, 44, 1000): decode rows _int8_decode does not fit (K, N % 8): mma.sync
    [(40, 48, 96), (33, 17, 21), (130, 136, 128), (3, 72, 524), (1, 44, 1000), (3, 72, 520)],
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


@pytest.mark.parametrize(
    "m, n, k, sms, unsigned",
    [
        (1, 264, 328, 4, False),  # K split in 2, the second a partial step; a partial block
        (16, 40, 200, 1, True),  # the most rows, one slice, K not a whole step; uint8
        (5, 512, 1024, 8, False),  # 8 slices summed by the last block of each column block
        (2, 8, 8, 1, True),  # one word of A a row
    ],
)
def test_int8_decode_one_launch_exact_in_simulator(m, n, k, sms, unsigned, poisoned, monkeypatch):
    """Decode rows (``_int8_decode``): one launch of ``gemv_int8`` reading B [K, N] as it is
    (no transpose), bit-identical with the integer reference, every output element written
    (poisoned allocations), uint8 bytes read as int8."""
    monkeypatch.setattr(_arrays, "multiprocessors", lambda like: sms)
    monkeypatch.setattr(_int8_decode, "MAX_M", _int8_decode.MOST_M)  # routed: fewer rows
    a = RNG.integers(-128, 128, (m, k)).astype(np.int8)
    b = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    if unsigned:
        a, b = a.view(np.uint8), b.view(np.uint8)
    kernels = launched(monkeypatch)
    with kaio.simulate():
        c = kaio_ops.matmul_int8(a, b, -0.75)
    np.testing.assert_array_equal(c, int8_reference(a, b, -0.75))
    assert kernels == [_int8_decode.gemv_int8]
    assert _int8_decode.fits(_operand(a), _operand(b), m, n, k)


def test_int8_decode_takes_only_what_it_fits(monkeypatch):
    """More than ``MAX_M`` rows, K or N not a multiple of 8, or an operand off an 8-byte
    boundary: the transposing mma.sync path (``test_int8_exact_in_simulator``)."""
    assert 1 <= _int8_decode.MAX_M <= _int8_decode.MOST_M
    monkeypatch.setattr(_int8_decode, "MAX_M", 16)
    a, b = np.zeros((16, 64), np.int8), np.zeros((64, 32), np.int8)
    assert _int8_decode.fits(_operand(a), _operand(b), 16, 32, 64)
    assert not _int8_decode.fits(_operand(np.zeros((17, 64), np.int8)), _operand(b), 17, 32, 64)
    a60, b60 = np.zeros((16, 60), np.int8), np.zeros((60, 32), np.int8)
    assert not _int8_decode.fits(_operand(a60), _operand(b60), 16, 32, 60)
    assert not _int8_decode.fits(_operand(a), _operand(np.zeros((64, 28), np.int8)), 16, 28, 64)
    off = np.zeros(16 * 64 + 4, np.int8)[4:].reshape(16, 64)
    assert not _int8_decode.fits(_operand(off), _operand(b), 16, 32, 64)


def _operand(x: np.ndarray) -> _arrays.Operand:
    with kaio.simulate():
        return _arrays.Inputs("test").array(x, "x", ndim=2, dtypes=(kaio.i8, kaio.u8))


@pytest.mark.parametrize("m, n, k", [(40, 48, 128), (3, 72, 256), (130, 136, 384), (17, 20, 128)])
def test_int4_in_simulator(m, n, k):
    a, packed, scales, w = int4_case(m, n, k)
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    assert c.dtype == np.float32 and np.isfinite(c).all()
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize(
    "m, n, k", [(1, 36, 256), (7, 100, 384), (9, 64, 128), (16, 132, 512), (2, 70, 256)]
)
def test_int4_decode_shapes_in_simulator(m, n, k):
    """M <= 16 with N % 4 == 0 takes the decode kernel (rows past M and columns past N
    read clamped addresses; an odd N takes the tiled kernel): every element checked."""
    a, packed, scales, w = int4_case(m, n, k)
    with kaio.simulate():
        inputs = _arrays.Inputs("test")
        operands = [
            inputs.array(x, name, dtypes=(t,))
            for x, name, t in ((a, "a", f16), (packed, "b", u32), (scales, "s", f16))
        ]
        assert _int4_decode.fits(operands[0], operands[1:]) == (n % 4 == 0)
        c = kaio_ops.matmul_int4(a, packed.view(np.int32), scales)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    assert c.shape == (m, n) and np.isfinite(c).all()
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("m", [1, 9])
def test_int4_decode_long_k_in_simulator(m):
    """K long enough that each warp of the decode kernel goes round its two register buffers
    more than once, the last round partial and uneven across warps (K = 4096 is one round)."""
    warps = _int4_decode.WARPS
    a, packed, scales, w = int4_case(m, 8, 128 * (3 * warps + 3))
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


# (M, N, K, WARPS): the decode kernel's blocks of 4 and 8 warps at M <= 16 (TUNED's
# knobs; plan's are in the tests below and in matmul_int4's); N past a 32-column block,
# group counts that leave the warps unequal shares, one round of the two register buffers
# partial, fewer groups than warps
DECODE_PLANS = [
    (1, 36, 128 * 9, 4),
    (16, 40, 128 * 7, 4),
    (9, 100, 128 * 13, 4),
    (5, 68, 128 * 3, 4),
    (16, 8, 128 * 19, 8),
    (3, 4, 128 * 2, 8),
    (12, 100, 128 * 5, 4),
]


@pytest.mark.parametrize("m, n, k, warps", DECODE_PLANS)
def test_int4_decode_warps_in_simulator(m, n, k, warps, poisoned):
    """Every element against float64 products with the dequantized weights, f32 and f16 out
    (outputs start as NaN: an element never stored fails). Its own generator: the shared
    RNG's later draws stay as the other tests expect."""
    a, packed, scales, w = int4_case(m, n, k, np.random.default_rng(m * 1000 + n))
    ref = a.astype(np.float64) @ w.astype(np.float64)
    with kaio.simulate():
        ops = _sim_operands(a, packed, scales)
        c32 = _int4_decode.matmul(*ops, f32, warps)
        c16 = _int4_decode.matmul(*ops, f16, warps)
    np.testing.assert_allclose(c32, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert c16.dtype == np.float16
    np.testing.assert_allclose(c16, ref, rtol=2.0**-10, atol=1e-5 * np.abs(ref).max())


# (M, N, K, WARPS, tune): the decode kernel's knobs away from their defaults. L2 prefetches (by
# sector, line and bulk) up to the last group and none past it (the simulator checks each
# address), the other dequantizations (DEQ 0 and 1: the same bits), main's unswapped mma at
# M <= 8 and no swap past 8 rows, K splits whose parts hold unequal group counts (fewer groups
# than warps in one), the last part adding them in order, x's fragments loads ahead in a ring
# (XLEAD: past the last group and the last round's partial second buffer, fewer groups than
# warps), the swapped mma at M = 9-16 (SWAP 2), a byte's two nibbles a pair (DEQ 6, also past
# 16 rows), blocks of 2 and 4 column blocks (CS: a partial last block; a K split with it),
# the words' cache operators (WC 1 .cg, 2 .cs), the words and scales through shared rings by
# cp.async (ASYNC: more slots than groups a warp, a partial last round, a K split), x through
# shared rings a K slice (XS: slices of 2 and 4 warps, copies .cg and .ca, a partial last
# column block, with the words' rings, unswapped, 16 warps, three slots), blocks of 5 and 3
# warps (their threads do not divide a tile's 512 sums; with a K split), programmatic
# dependent launch (PDL 3, 1); each twice: the arrival counters are back to zero.
TUNED_PLANS = [
    (1, 36, 128 * 9, 4, {"PREFETCH": 1, "DEQ": 1, "SWAP": 0}),
    (16, 40, 128 * 7, 4, {"PREFETCH": 2, "PMODE": 2, "SPLIT": 3, "SWAP": 1}),
    (5, 68, 128 * 5, 8, {"SPLIT": 2, "DEQ": 0, "L2F": 256}),
    (3, 36, 128 * 5, 4, {"SPLIT": 2, "PREFETCH": 1, "PMODE": 1, "DEQ": 1}),
    (7, 36, 128 * 11, 4, {"XLEAD": 3, "DEQ": 6, "WC": 1}),
    (16, 8, 128 * 5, 8, {"XLEAD": 3, "SPLIT": 2, "SWAP": 2, "WC": 2}),
    (20, 8, 128 * 2, 8, {"DEQ": 6}),
    (12, 100, 128 * 13, 4, {"CS": 2, "SWAP": 2, "DEQ": 6, "XLEAD": 3}),
    (5, 68, 128 * 7, 8, {"CS": 4, "XLEAD": 1, "SPLIT": 2}),
    (7, 36, 128 * 11, 4, {"ASYNC": 1, "WBUF": 4, "DEQ": 6}),
    (16, 40, 128 * 37, 8, {"ASYNC": 1, "WBUF": 3, "SWAP": 2, "DEQ": 6, "SPLIT": 2}),
    (16, 72, 128 * 7, 8, {"XS": 1, "CS": 2, "SWAP": 2, "DEQ": 6}),
    (9, 72, 128 * 19, 16, {"XS": 1, "CS": 2, "ASYNC": 1, "SWAP": 2, "DEQ": 6}),
    (13, 100, 128 * 13, 4, {"XS": 2, "CS": 4, "WBUF": 3, "DEQ": 6}),
    (16, 100, 128 * 11, 5, {"SWAP": 2, "DEQ": 6, "XLEAD": 3}),
    (9, 64, 128 * 7, 3, {"SWAP": 2, "DEQ": 6, "XLEAD": 3, "PDL": 3}),
    (16, 72, 128 * 6, 3, {"SWAP": 2, "DEQ": 6, "XLEAD": 3, "SPLIT": 2, "PDL": 1}),
]


def _check_int4_decode_in_simulator(m, n, k, warps, tune):
    """The decode kernel in the simulator: every element against float64 products with the
    dequantized weights, and the same bits on a second call."""
    a, packed, scales, w = int4_case(m, n, k, np.random.default_rng(m * 1000 + n))
    ref = a.astype(np.float64) @ w.astype(np.float64)
    with kaio.simulate():
        ops = _sim_operands(a, packed, scales)
        c = _int4_decode.matmul(*ops, f32, warps, tune)
        again = _int4_decode.matmul(*ops, f32, warps, tune)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(c, again)


@pytest.mark.parametrize("m, n, k, warps, tune", TUNED_PLANS)
def test_int4_decode_tuned_in_simulator(m, n, k, warps, tune, poisoned):
    """Every element against float64 products with the dequantized weights; the same bits
    on a second call."""
    _check_int4_decode_in_simulator(m, n, k, warps, tune)


# (M, N, K, WARPS, SMs, tune): the last partial round's blocks split over K (TAIL) on a few
# SMs: halves of single column blocks with fewer groups than warps in a part, of blocks of two
# column blocks (CS 2, the last one partial, one past N), thirds of main's unswapped blocks,
# with the words' rings (ASYNC) and with x's shared rings too (XS); plan's (WARPS 0) at 4.5
# tiles an SM: blocks of 3 warps; at 6.5: blocks of 4 over two column blocks, the last one
# partial, TAIL 2; at 2.5: blocks of 8 with the words' rings (M = 5, the last tile partial)
# and blocks of 4 swapped, x with the words (M = 13 with TAIL 2, K long enough for halves;
# M = 9 without); programmatic dependent launch (PDL 3: the first groups' L2 prefetches
# before the wait)
TAIL_PLANS = [
    (16, 32 * 7, 128 * 5, 4, 3, {"TAIL": 2, "SWAP": 2, "DEQ": 6, "XLEAD": 3}),
    (12, 220, 128 * 9, 4, 3, {"TAIL": 2, "CS": 2, "SWAP": 2, "DEQ": 6, "XLEAD": 3, "PDL": 3}),
    (9, 32 * 5, 128 * 7, 8, 4, {"TAIL": 3}),
    (8, 32 * 7, 128 * 6, 4, 3, {**_int4_decode.RINGS_8, "TAIL": 2}),
    (16, 32 * 10, 128 * 6, 4, 4, {**_int4_decode.SHARED_X_16, "TAIL": 2}),
    (12, 284, 128 * 7, 0, 2, {}),
    (12, 404, 128 * 7, 0, 2, {}),
    (5, 156, 128 * 65, 0, 2, {}),
    (13, 160, 128 * 65, 0, 2, {}),
    (9, 160, 128 * 7, 0, 2, {}),
    (6, 220, 128 * 33, 0, 2, {}),
]


@pytest.mark.parametrize("m, n, k, warps, sms, tune", TAIL_PLANS)
def test_int4_decode_tail_in_simulator(m, n, k, warps, sms, tune, monkeypatch, poisoned):
    """Every element against float64 products with the dequantized weights; the same bits
    on a second call (the arrival counters are back to zero)."""
    monkeypatch.setattr(_arrays, "multiprocessors", lambda like: sms)
    _check_int4_decode_in_simulator(m, n, k, warps, tune)


def test_int4_decode_tail_whole():
    """tail_whole: the last partial round of one block an SM split when each SM gets at most
    one part (10240 and 6144 columns at M = 16 on 132 SMs: 56 and 60 blocks left, halved;
    28672 in blocks of two column blocks: 52), else nothing (8192 columns: 124 left; a whole
    number of rounds; fewer blocks than SMs)."""
    whole = _int4_decode.tail_whole
    assert [whole(u, 132, 2) for u in (320, 192, 448)] == [264, 132, 396]
    assert [whole(u, 132, 2) for u in (256, 264, 100)] == [256, 264, 100]
    assert whole(320, 132, 3) == 320 and whole(270, 132, 3) == 264


@pytest.mark.parametrize(
    "m, n, k", [(5, 96, 128 * 7), (8, 288, 128 * 5), (3, 356, 128 * 9), (12, 356, 128 * 9)]
)
def test_int4_decode_ring_plans_in_simulator(m, n, k, monkeypatch, poisoned):
    """matmul_int4 and qkv_project_int4 as routed on one SM, so that these widths take
    ``plan``'s branches with the shared rings (blocks of 8 at 3 tiles, of 4 at 9, of 4 with
    CS 2 past ten: 12 tiles, the last one partial, and at M = 12 x's rings too (XS);
    qkv_project_int4, which keeps main's blocks there, at the same widths): every element
    against float64 products."""
    monkeypatch.setattr(_arrays, "multiprocessors", lambda like: 1)
    assert _int4_decode.plan(m, -(-n // 32), 1, k // 128)[1]["ASYNC"] == 1
    a, packed, scales, w = int4_case(m, n, k, np.random.default_rng(n))
    narrow = [np.ascontiguousarray(v[:, :4]) for v in (packed, scales, w)]
    ref = a.astype(np.float64) @ w.astype(np.float64)
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
        qkv = kaio_ops.qkv_project_int4(a, packed, narrow[0], narrow[0], scales, *narrow[1:2] * 2)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    for out, weights in zip(qkv, (w, narrow[2], narrow[2]), strict=True):
        check_f16_product(out, a, weights)


def test_int4_decode_warps_route():
    """plan: at M <= 8 blocks of 16 warps while each tile has an SM, 8 while the tiles fit two a SM
    (PDL 3), then the shared rings with DEQ 6 and x 3 loads ahead in blocks of 8 up to three
    tiles a SM, blocks of 4 with x with the words (LOADS_8, PDL 3) up to four where the last
    partial round is split, else the rings in blocks of 4 (PDL 1), of 4 taking two column blocks
    past ten, the last partial round split over K up to four tiles a SM where each warp keeps
    four groups of its half (TAIL 2: K = 8192 in blocks of 8, not 4096; 4096 in blocks of 4); at
    M = 9-16 the swapped mma with DEQ 6 in blocks of 8 (x with the words while each tile has an
    SM, else 3 loads ahead) up to two tiles a SM, blocks of 4 with x with the words up to three
    (TAIL 2 and PDL 1 with eight groups a warp of a half: K = 8192), blocks of 4 with x 3 loads
    ahead up to four, blocks of 3 up to five (PDL 4), then blocks of 4 taking two column blocks
    each (the last partial round split over K: TAIL 2), past ten those blocks sharing x through
    shared rings with the words' rings (without XS, as qkv plans: blocks of 8, x 3 loads ahead),
    x by the read-only path and the words not allocated in L1 but past ten, with programmatic
    dependent launch (PDL 3, the wait alone with the TAIL split) (the H100 measurements of
    docs/performance.md); the default past 16 rows; and each plan is a listed specialization
    (ptxas checks those)."""
    plan = _int4_decode.plan
    loads = {"XC": 3, "WC": 6, "PDL": 3}
    swapped, lead = {"SWAP": 2, "DEQ": 6, **loads}, {"SWAP": 2, "DEQ": 6, "XLEAD": 3, **loads}
    ns = (4096, 4224, 4256, 8448, 8480, 12672, 12704, 16896, 16928, 42240, 42272, 57344)
    rings = {"DEQ": 6, "XLEAD": 3, "ASYNC": 1, "WBUF": 2}
    early, late, tail = {"PDL": 3}, {"PDL": 1}, {"TAIL": 2, "PDL": 1}
    words_x = {"DEQ": 6, "XC": 3, "WC": 6}
    assert [plan(1, n // 32, 132, 64) for n in ns] == [(16, early)] * 2 + [(8, early)] * 2 + [
        (8, {**rings, **tail})
    ] * 2 + [(4, {**words_x, "TAIL": 2, **early}), (4, {**rings, "CS": 1, **tail})] + [
        (4, {**rings, "CS": 1, **late})
    ] * 2 + [(4, {**rings, "CS": 2})] * 2
    assert plan(8, 10240 // 32, 132, 63) == (8, {**rings, **late})  # halves of 3 groups a warp
    assert plan(8, 14336 // 32, 132, 32)[1]["TAIL"] == 2  # halves of 4 groups a warp
    assert plan(8, 14336 // 32, 132, 31) == (4, {**rings, "CS": 1, **late})  # of 3
    assert [plan(8, n // 32, 132, 1)[0] for n in (4096, 6144, 10240, 57344)] == [16, 8, 8, 4]
    ns = (4096, 6144, 8448, 10240, 12672, 12704, 16896, 16928, 21120, 21152, 28672)
    got = [plan(16, n // 32, 132, 64) for n in ns]
    pairs = {**lead, "CS": 2, "TAIL": 2, "PDL": 1}
    halved = {**swapped, "TAIL": 2, "PDL": 1}
    want = [(8, swapped), (8, lead), (8, lead), (4, halved), (4, halved), (4, lead), (4, lead)]
    assert got == want + [(3, {**lead, "PDL": 4})] * 2 + [(4, pairs)] * 2
    shared = {"SWAP": 2, "DEQ": 6, "CS": 2, "XS": 2, "ASYNC": 1}
    assert plan(16, 10240 // 32, 132, 63) == (4, swapped)  # halves of 7 groups a warp
    assert plan(16, 57344 // 32, 132, 64) == (4, shared)
    assert plan(16, 42272 // 32, 132, 64, shared_x=False) == (8, lead)
    assert plan(32, 4096, 132, 64) == (_int4_decode.WARPS, {})
    listed = [c for k, c in _int4_decode.specializations() if k is _int4_decode.int4_decode]
    for m, n in [
        (1, 4096),
        (1, 10240),
        (1, 28672),
        (1, 57344),
        (16, 4096),
        (16, 10240),
        (16, 14336),
        (16, 28672),
        (16, 57344),
    ]:
        warps, tune = plan(m, n // 32, 132, 64)
        tuned = _int4_decode._tuned(m, tune)
        want = {"WARPS": warps, "ROWS": _int4_decode._rows(m), "SPLIT": tuned.pop("TAIL", 1)}
        want.update(tuned)
        assert any(want.items() <= c.items() for c in listed), (m, n)


def test_int4_decode_fast_memory_route():
    """plan on a GPU with the faster memory (``fast``: an H200): at M <= 8 ``LOADS_8`` and PDL 3
    in blocks of 16 while each tile has an SM, of 8 up to two tiles an SM and past ten (not the
    rings); at M = 9-16 past ten tiles an SM ``PAIRS_16`` (blocks of 4 over two column blocks, x
    3 loads ahead, TAIL 2), without ``shared_x`` (qkv) the slower memory's blocks of 8;
    everywhere else the slower memory's plan (the H200 measurements of docs/performance.md)."""
    plan = _int4_decode.plan
    loads_8 = (16, {**_int4_decode.LOADS_8, "PDL": 3})
    pairs = (4, {"SWAP": 2, "DEQ": 6, "XC": 3, "WC": 6, "XLEAD": 3, "CS": 2, "TAIL": 2, "PDL": 1})
    for m in (1, 5, 8, 9, 12, 16, 17, 64):
        for tiles in (1, 132, 133, 264, 265, 320, 396, 397, 528, 529, 896, 1320, 1321, 1792):
            for groups in (9, 64, 224):
                fast, slow = plan(m, tiles, 132, groups, fast=True), plan(m, tiles, 132, groups)
                if m <= 8 and tiles <= 132:
                    assert fast == loads_8
                elif m <= 8 and (tiles <= 264 or tiles > 1320):
                    assert fast == (8, loads_8[1])
                elif m <= 16 and tiles > 1320:
                    assert fast == pairs
                    assert plan(m, tiles, 132, groups, False, True) == plan(
                        m, tiles, 132, groups, False
                    )
                else:
                    assert fast == slow, (m, tiles, groups)


@pytest.mark.parametrize(
    "m, n, k, sms",
    [(5, 96, 128 * 7, 3), (7, 160, 128 * 5, 3), (3, 356, 128 * 9, 1), (12, 356, 128 * 9, 1)],
)
def test_int4_decode_fast_memory_in_simulator(m, n, k, sms, monkeypatch, poisoned):
    """matmul_int4 and qkv_project_int4 as routed on a GPU with the faster memory (its peak
    bandwidth told as an H200's) on ``sms`` SMs, so that these widths take the fast plans:
    blocks of 16 with LOADS_8 at a tile an SM, of 8 with it at two tiles an SM (five tiles on
    three SMs) and past ten tiles an SM (M = 3),
    PAIRS_16 there at M = 12 (12 tiles, the last one partial): every element against float64
    products."""
    monkeypatch.setattr(_arrays, "multiprocessors", lambda like: sms)
    monkeypatch.setattr(_arrays, "memory_bandwidth", lambda like: 4.8e12)
    fast = _int4_decode.plan(m, -(-n // 32), sms, k // 128, fast=True)
    assert fast != _int4_decode.plan(m, -(-n // 32), sms, k // 128)
    a, packed, scales, w = int4_case(m, n, k, np.random.default_rng(n + m))
    narrow = [np.ascontiguousarray(v[:, :4]) for v in (packed, scales, w)]
    ref = a.astype(np.float64) @ w.astype(np.float64)
    with kaio.simulate():
        assert _int4_decode.planned(_sim_operands(a)[0], -(-n // 32), k // 128) == fast
        c = kaio_ops.matmul_int4(a, packed, scales)
        qkv = kaio_ops.qkv_project_int4(a, packed, narrow[0], narrow[0], scales, *narrow[1:2] * 2)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    for out, weights in zip(qkv, (w, narrow[2], narrow[2]), strict=True):
        check_f16_product(out, a, weights)


# 16 < M <= 64: the decode kernel with ceil(M / 16) m16 tiles per block (ROWS 4, 6, 8), the
# last tile's rows past M reading clamped addresses; a K long enough for both register
# buffers (each loads x for its own scale group); N % 4 != 0 takes the tiled kernel.
@pytest.mark.parametrize(
    "m, n, k",
    [(17, 36, 128), (31, 8, 256), (32, 40, 128), (48, 12, 128), (64, 4, 128), (33, 4, 3456)],
)
def test_int4_multi_tile_in_simulator(m, n, k, poisoned, monkeypatch):
    """Every element against float64 products with the dequantized weights; the call runs
    the decode kernel once (no f16 copy of the weights: the prefill and tiled paths raise)."""
    a, packed, scales, w = int4_case(m, n, k)
    calls = []
    decode = _int4_decode.matmul
    monkeypatch.setattr(_int4_decode, "matmul", lambda *args: calls.append(m) or decode(*args))
    for other in (_prefill, kaio_ops.quantized):
        name = "matmul_int4" if other is _prefill else "launch"
        monkeypatch.setattr(other, name, lambda *args, **kw: pytest.fail("not the decode kernel"))
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
    assert calls == [m] and c.shape == (m, n)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_int4_multi_tile_limits():
    """The decode kernel takes M <= MAX_M = 64 (4 m16 tiles: 8 would spill) with N % 4 == 0;
    ROWS is the 8-row slabs its tiles cover, each one ptxas checks (``specializations``)."""
    assert _int4_decode.MAX_M == 64
    assert [_int4_decode._rows(m) for m in (1, 8, 9, 16, 17, 32, 33, 48, 49, 64)] == [
        1, 1, 2, 2, 4, 4, 6, 6, 8, 8
    ]  # fmt: skip
    listed = {c["ROWS"] for _, c in _int4_decode.specializations()}
    assert listed == set(_int4_decode.ALL_ROWS) == {1, 2, 4, 6, 8}
    with kaio.simulate():
        for m, n, fits in ((64, 8, True), (65, 8, False), (32, 18, False)):
            a, packed, scales = (np.zeros(s, t) for s, t in (
                ((m, 128), np.float16), ((16, n), np.uint32), ((1, n), np.float16)
            ))  # fmt: skip
            assert _int4_decode.fits(*_sim_operands(a), _sim_operands(packed, scales)) == fits


def test_int4_multi_tile_fallback_in_simulator():
    """M = 32 with N % 4 != 0: not the decode kernel's shape, the tiled kernel's result."""
    a, packed, scales, w = int4_case(32, 18, 128)
    with kaio.simulate():
        c = kaio_ops.matmul_int4(a, packed, scales)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


# --------------------------------------------------------------------------- int4 on wgmma
# _int4_hopper.int4_swap (the role swap, A from registers) on the simulator: (M, N, K,
# out_dtype, (WG, BM, STAGES, split[, CL]), sms). M and N edges (TMA zero fill, stores cut at the
# edge), both consumer counts, the ring wrapping (STAGES 2), an odd number of slices (the
# last one alone), a K split summed by gemm_reduce, int32 words, every out_dtype, the
# persistent loop (6 tiles on 2 blocks), K splits summed in a cluster, and pairs of tiles
# whose blocks multicast a's rows to each other (MC: the last pair half past N); words'
# rings (WSTAGES, config[6]) of 1 and 2 stages, wrapping many times (the default fills the
# shared memory left); tile orders of GROUP (config[9]) rows that leave a shorter last group.
SWAP_CASES = [
    (40, 64, 256, None, (1, 40, 2, 1), None),
    (20, 136, 384, "float16", (2, 24, 3, 1), None),
    (17, 72, 640, "bfloat16", (1, 32, 2, 2, 0, 0, 2), None),  # 5 slices each, WSTAGES 2
    (50, 192, 256, None, (1, 16, 3, 1), 2),
    (20, 136, 512, "float16", (2, 24, 2, 4, 1), None),  # K split over a cluster
    (9, 64, 768, None, (4, 16, 2, 3, 1), None),  # a split of 3: rows 0, 3, 6... a block
    (40, 200, 256, None, (1, 48, 2, 1, 0, 1, 2), None),  # pairs of tiles sharing a by multicast
    # 6 pairs on a cluster, odd grid_n, the tile order in groups of 2 rows (GROUP, config[9])
    (70, 136, 384, "bfloat16", (1, 32, 2, 1, 0, 1, 2, 2, 0, 2), 2),
    (40, 200, 512, "float16", (1, 48, 2, 2, 0, 1), None),  # pairs and a K split along z
    # pairs and a K split of 2 in a cluster of 4 (two pairs), the last pair half past N
    (70, 136, 384, None, (1, 32, 3, 2, 1, 1, 2, 2, 1), None),
    # three fragment buffers (BUFS 3): 10 slices (one after the groups of 3) on 3 stages, the
    # persistent loop (WSTAGES 1); 8 slices (two after) with multicast pairs and WSTAGES 2
    (20, 136, 640, "float16", (2, 24, 3, 1, 0, 0, 1, 3), 1),
    (40, 200, 512, None, (1, 48, 4, 1, 0, 1, 2, 3), None),
    # a cluster sum of two trips a thread (SUM_UNROLL pairs each), the last rows past M
    (60, 64, 256, "bfloat16", (1, 64, 2, 2, 1), None),
    # EARLY (config[8]): each slice reads the next one's words, across tiles of the persistent
    # loop (the last slice of the last tile reads none); with 3 buffers and a 1-stage words'
    # ring; multicast pairs; a cluster's K split
    (50, 192, 256, None, (1, 16, 3, 1, 0, 0, 2, 2, 1, 3), 2),  # GROUP 3 of 4 tile rows
    (20, 136, 640, "float16", (2, 24, 3, 1, 0, 0, 1, 3, 1), 1),
    (40, 200, 512, None, (1, 48, 4, 1, 0, 1, 2, 3, 1), None),
    (20, 136, 512, "float16", (2, 24, 2, 4, 1, 0, 0, 2, 1), None),
    # EARLY in a cluster pair with 3 slices each (the last alone, after every wgmma), M and N
    # edges, 3-stage rings
    (33, 136, 384, "bfloat16", (2, 40, 3, 2, 1, 0, 3, 2, 1), None),
    # KW (config[10]): the warpgroups take a tile's slices in turn, summed in shared memory
    # in chunks through two buffers: 6 tiles on 2 blocks, one chunk a tile (the buffers
    # alternate across tiles), EARLY across tiles, the rings wrapping; a cluster pair's K
    # split; 3 warpgroups, 3 chunks
    (50, 192, 256, "float16", (2, 32, 4, 1, 0, 0, 2, 2, 1, 0, 1), 2),
    (20, 136, 512, "bfloat16", (2, 64, 4, 2, 1, 0, 2, 2, 1, 0, 1), None),
    (33, 72, 768, None, (3, 96, 6, 1, 0, 0, 3, 2, 1, 0, 1), None),
    # 3 consumer warpgroups side by side (192-column tiles, the route's 128 x 192 at 65-512
    # rows): 4 tiles on 2 blocks, the second column of tiles 8 columns wide
    (40, 200, 256, "float16", (3, 32, 0, 1, 0, 0, 2, 2, 0), 2),
    (40, 200, 256, "float16", (3, 32, 0, 1, 0, 0, 2, 1, 0), 2),  # one fragment buffer
    # LATE (config[11]): the words' stage freed after the wgmmas are issued, with EARLY's
    # reads of the next slice after it, KW, 6 tiles on 2 blocks
    (50, 192, 256, "float16", (2, 32, 4, 1, 0, 0, 2, 2, 1, 0, 1, 1), 2),
    # SK (config[12]): the stream-K schedule (SPREAD, config[13], 0: only the last partial
    # wave shared), 6 tiles of 4 slices on 5 blocks (runs of 4-5 slices: tiles split
    # between two blocks, the head's block summing), EARLY across the parts, the last row
    # and column tiles past M and N; one whole wave data parallel (6 tiles on 4 blocks, the
    # last 2 tiles' steps shared), BUFS 3; every tile shared (SPREAD 1: runs of 6 slices, 3
    # parts a block); runs shorter than a tile (1-2 slices on 16 blocks: 2-3 parts a tile).
    # (The simulator runs blocks side by side in lockstep: with a words' ring of 2, EARLY
    # and runs of unequal parts, one block's wait holds the others': 3 stages or more here.)
    (70, 200, 256, "float16", (2, 32, 3, 1, 0, 0, 4, 2, 1, 0, 0, 0, 1, 0), 5),
    (70, 200, 256, None, (2, 32, 3, 1, 0, 0, 3, 3, 0, 0, 0, 0, 1, 0), 4),
    (70, 200, 256, "bfloat16", (2, 32, 4, 1, 0, 0, 4, 2, 1, 0, 0, 0, 1, 1), 4),
    (70, 200, 256, None, (2, 32, 4, 1, 0, 0, 4, 2, 1, 0, 0, 0, 1, 1), 16),
    (70, 200, 256, "float16", (2, 40, 4, 1, 0, 0, 4, 2, 1, 0, 0, 0, 1, 1), 5),  # balanced_rows
    # three warpgroups' 40 x 192 tiles in cluster pairs (a K split of 2 summed by halves
    # through distributed shared memory, pair_sum), LATE: the route's at 257-352 rows of
    # 6144x4096; the second column of tiles 8 wide
    (40, 200, 512, "float16", (3, 40, 0, 2, 1, 0, 0, 2, 0, 0, 0, 1), None),
    # the same with three fragment buffers, and with one (the route's at 128-152 rows:
    # ONE_BUF_ROWS)
    (40, 200, 512, "float16", (3, 40, 0, 2, 1, 0, 0, 3, 0, 0, 0, 1), None),
    (40, 200, 512, "float16", (3, 40, 0, 2, 1, 0, 0, 1, 0, 0, 0, 1), None),
    # PAIRS (config[14]): two slices a warpgroup's turn, their 8 wgmmas one group; 4 tiles
    # on 2 blocks; cluster pairs of 3 slices each (the odd last alone); on 2 warpgroups'
    # tiles with a K split of 3 through the workspace
    (40, 200, 256, "float16", (3, 32, 0, 1, 0, 0, 2, 2, 0, 0, 0, 1, 0, 1, 1), 2),
    (40, 200, 384, "float16", (3, 40, 0, 2, 1, 0, 0, 2, 0, 0, 0, 1, 0, 1, 1), None),
    (70, 136, 384, "bfloat16", (2, 32, 4, 3, 0, 0, 2, 2, 0, 0, 0, 1, 0, 1, 1), None),
    # three warpgroups' 40 x 192 tiles (2 x 2, the second column 8 wide) on 3 blocks
    (70, 200, 256, "float16", (3, 40, 4, 1, 0, 0, 4, 2, 0, 0, 0, 0, 1, 1), 3),
    # CLAMP (every launch without CL): the last row tile moved up to end at row M - 1 (rows
    # 38-69 of 70, rows 38-63 repeated and stored by the tile before), with KW, and with
    # SK's parts (the cases above with a partial last row tile take it too)
    (70, 200, 256, "float16", (2, 32, 4, 1, 0, 0, 4, 2, 1, 0, 0), 2),
    (70, 72, 256, None, (2, 32, 4, 1, 0, 0, 2, 2, 0, 0, 1), 2),
    (70, 200, 256, "bfloat16", (2, 40, 4, 1, 0, 0, 4, 2, 1, 0, 0, 0, 1, 1), 5),
]


@pytest.mark.parametrize("m, n, k, out_dtype, config, sms", SWAP_CASES)
def test_int4_wgmma_in_simulator(m, n, k, out_dtype, config, sms, poisoned):
    """The sm_90 kernel (``launch_swap``: int4_swap) against the float64 product of the
    dequantized weights, within the f32 sums' error and the output's one rounding, every
    element written."""
    from kaio_ops import _int4_hopper

    a, packed, scales, w = int4_case(m, n, k)
    with kaio.simulate():
        ops = _sim_operands(a, packed.view(np.int32) if out_dtype else packed, scales)
        out = {None: f32, "float16": f16, "bfloat16": kaio.bf16}[out_dtype]
        c = np.asarray(_int4_hopper.launch_swap(*ops, out, config, sms)).astype(np.float64)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    bound = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))  # no cancellation
    rounding = {None: 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}[out_dtype]
    assert c.shape == (m, n) and np.isfinite(c).all()
    assert np.all(np.abs(c - ref) <= 1e-6 * bound + rounding * np.abs(ref))
    assert np.abs(ref).max() > 10  # a real product


@pytest.mark.parametrize(
    "m, n, k, out_dtype, config, sms",
    [  # PAIRS with LEAD: the first slice alone, the pairs, the last alone (4 tiles on 2
        # blocks); cluster pairs of 3 slices each (one alone and a pair)
        (40, 200, 512, "float16", (3, 32, 0, 1, 0, 0, 2, 2, 0, 0, 0, 1, 0, 1, 1), 2),
        (40, 200, 384, "bfloat16", (3, 40, 0, 2, 1, 0, 0, 2, 0, 0, 0, 1, 0, 1, 1), None),
    ],
)
@pytest.mark.parametrize("lead", [0, 1])
def test_int4_swap_lead_in_simulator(m, n, k, out_dtype, config, sms, lead, poisoned, monkeypatch):
    """PAIRS with ``LEAD`` (each work item's first slice alone before the pairs, routed) and
    without it (the pairs from the first slice), as above."""
    from kaio_ops import _int4_hopper

    monkeypatch.setattr(_int4_hopper, "LEAD", lead)
    assert _int4_hopper.swap_launch_plan(m, n, k, config, sms, f16)[3]["LEAD"] == lead
    test_int4_wgmma_in_simulator(m, n, k, out_dtype, config, sms, poisoned)


def test_int4_swap_rejects_bad_k_split():
    """KW (the warpgroups take a tile's K slices in turn, each every WG-th ring stage)
    refuses one warpgroup, multicast pairs, tiles not in whole chunks of the sum, rings or
    slice counts that are no multiple of WG, and fewer than BUFS stages a warpgroup (a
    deadlock), each saying what to change."""
    from kaio_ops import _int4_hopper

    for config, k, why in (
        ((1, 64, 4, 1, 0, 0, 2, 2, 0, 0, 1), 256, "2 or more"),
        ((2, 64, 4, 1, 0, 1, 2, 2, 0, 0, 1), 256, "multicast"),
        ((2, 48, 4, 1, 0, 0, 2, 2, 0, 0, 1), 256, "BM (48) a multiple of 32"),
        ((2, 64, 3, 1, 0, 0, 2, 2, 0, 0, 1), 256, "STAGES (3)"),
        ((2, 64, 4, 1, 0, 0, 3, 2, 0, 0, 1), 256, "WSTAGES (3)"),
        ((3, 64, 6, 1, 0, 0, 3, 2, 0, 0, 1), 256, "K / 64 (4)"),
        ((2, 64, 4, 1, 0, 0, 2, 3, 0, 0, 1), 256, "BUFS x WG (6)"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            _int4_hopper.swap_launch_plan(64, 256, k, config, 132, f16)


def test_int4_swap_rejects_bad_buffers():
    """int4_swap's BUFS is 1 to 3, 3 fragment buffers need 3 ring stages (a slice's stage
    is freed two slices later), PAIRS takes two buffers and no EARLY, KW or SK, and with
    LATE two words' stages (a turn holds both): each refused with what to change."""
    from kaio_ops import _int4_hopper

    with pytest.raises(ValueError, match="must be 1 to 3"):
        _int4_hopper.swap_launch_plan(64, 128, 256, (1, 64, 0, 1, 0, 0, 2, 4), 132, f16)
    with pytest.raises(ValueError, match="need 3 stages, got 2"):
        _int4_hopper.swap_launch_plan(64, 128, 256, (1, 64, 2, 1, 0, 0, 2, 3), 132, f16)
    assert _int4_hopper.swap_launch_plan(64, 128, 256, (1, 64, 3, 1, 0, 0, 2, 3), 132, f16)
    with pytest.raises(ValueError, match="PAIRS takes BUFS 2 and no EARLY, KW or SK"):
        _int4_hopper.swap_launch_plan(64, 128, 256, (1, 64, 3, 1, 0, 0, 2, 2, 1, 0, 0, 0, 0, 1, 1),
                                      132, f16)  # fmt: skip
    with pytest.raises(ValueError, match="PAIRS with LATE needs 2 words' stages"):
        _int4_hopper.swap_launch_plan(64, 384, 256, (3, 64, 4, 1, 0, 0, 1, 2, 0, 0, 0, 1, 0, 1, 1),
                                      132, f16)  # fmt: skip


def test_int4_swap_plan_bands():
    """swap_plan's shape rules on 132 multiprocessors: at 65-512 rows KW tiles (two
    warpgroups sharing BM x 64 tiles) where one warpgroup's 64-column tiles were the choice
    (256-row tiles that need a K split halved instead up to K = KW_HALVE_K), where
    128-column tiles need a K split, or where twice the tiles fill the last wave better;
    up to 64 rows KW tiles where they are no more than the SMs (a cluster pair's split at
    most) and the tiles of before would write a workspace of a quarter of the words or
    more; past 512 rows multicast pairs in groups of WIDE_GROUP rows from WIDE_N columns
    only, below it KW tiles where they fill the last wave better than a full wave or more
    of 256 x 128 tiles; at 65-512 rows one wave of 128 x 192 tiles where it beats the tiles
    above by its waves, and at 257-512 rows cluster pairs of BM x 192 tiles where they cost
    least."""
    from kaio_ops import _int4_hopper

    def plan(m, n, k):
        config = _int4_hopper.swap_plan(m, n, k, 132)
        split, _, _, consts = _int4_hopper.swap_launch_plan(m, n, k, config, 132, f16)
        keys = ("WG", "BM", "CL", "MC", "GROUP", "KW")
        return (split, *(consts[key] for key in keys))

    g, wide = _int4_hopper.GROUP_M, _int4_hopper.WIDE_GROUP
    assert plan(64, 4096, 4096) == (2, 2, 64, 1, 0, g, 1)  # 64 KW tiles, a cluster pair
    assert plan(64, 8192, 8192) == (1, 2, 64, 0, 0, g, 1)  # 128 KW tiles of 64 x 64
    assert plan(32, 8192, 8192) == (4, 4, 32, 0, 0, g, 0)  # a workspace of 1/8 the words
    assert plan(64, 10240, 8192) == (3, 4, 64, 0, 0, g, 0)  # 160 KW tiles: 64 x 256, split 3
    assert plan(1024, 6144, 4096) == (1, 2, 256, 0, 0, g, 1)  # 384 KW tiles fill 97%, 192 73%
    assert plan(1024, 4096, 4096)[6] == 0  # 128 tiles of 256 x 128 fill as well as 256
    assert plan(512, 6144, 4096) == (1, 3, 128, 0, 0, g, 0)  # 128 of 128 x 192, not 96
    assert plan(256, 10240, 8192) == (1, 3, 128, 0, 0, g, 0)  # 108, not 80 of 256 x 128
    assert plan(512, 10240, 8192) == (1, 2, 256, 0, 0, g, 0)  # stream-K (below)
    assert plan(1000, 1024, 14336)[6] == 0  # 32 tiles of 256 x 128: a K split, not KW
    assert plan(512, 4096, 4096) == (1, 2, 256, 0, 0, g, 1)  # 128 KW tiles of 256 x 64
    assert plan(256, 4096, 4096) == (1, 2, 128, 0, 0, g, 1)  # 128-row ones, no split
    assert plan(256, 4096, 14336) == (2, 2, 256, 1, 0, g, 1)  # K past 4096: a cluster pair
    assert plan(128, 4096, 4096) == (2, 2, 128, 1, 0, g, 1)
    assert plan(256, 8192, 8192) == (1, 2, 256, 0, 0, g, 1)  # 256 x 128 needed a split
    assert plan(512, 8192, 8192) == (1, 2, 256, 0, 0, g, 0)  # 128 tiles of 256 x 128
    assert plan(256, 57344, 8192) == (1, 2, 256, 0, 0, g, 1)  # 896 tiles fill 97% of 7 waves
    assert plan(256, 28672, 4096) == (1, 2, 256, 0, 0, g, 0)  # 448 no better than 224
    assert plan(1024, 57344, 8192) == (1, 2, 256, 0, 1, wide, 0)
    assert plan(1024, _int4_hopper.WIDE_N - 8, 8192)[4:] == (0, g, 0)
    # the stream-K schedule (SK, balanced_rows x 128 or x 192 tiles) where a block's run is
    # long, a's rows fit L2, the run is well under the route's waves and it costs less than
    # whole tiles: 10240x8192 M=512 (256 x 128 tiles; at 300 rows one wave of 108 whole
    # tiles of 152 x 192), the padded row tiles of 28672x4096 and 57344x8192 at 300 rows
    # (not 28672x4096 at 512: 896 KW tiles), not where the tiles fill their waves (1024
    # rows), the runs are short (4096x4096 M=512: 31 steps), the run is near the route's
    # waves (6144x4096 M=1600) or a's rows outgrow L2 (8192x28672 M=1024, 4096x14336 M=520)
    sk = [(m, n, k) for m, n, k in ((300, 10240, 8192), (512, 10240, 8192), (1600, 6144, 4096),
          (1024, 10240, 8192), (512, 4096, 4096), (1024, 8192, 28672), (520, 4096, 14336),
          (256, 10240, 8192), (300, 28672, 4096), (600, 28672, 4096), (300, 57344, 8192),
          (512, 28672, 4096)) if _int4_hopper.swap_plan(m, n, k, 132)[12:13] == (1,)]  # fmt: skip
    assert sk == [(512, 10240, 8192), (300, 28672, 4096), (600, 28672, 4096),
                  (300, 57344, 8192)]  # fmt: skip
    assert _int4_hopper.swap_plan(300, 10240, 8192, 132)[1] == 152  # two row tiles of 152
    # balanced row tiles (300 rows: two of 152, not 256 + 44 or three of 128), and more of
    # them where they fill the waves better (600 rows of N = 4096: 4 x 32 tiles of 152, not
    # 3 x 32 of 200)
    assert plan(300, 4096, 4096)[1:3] == (2, 160)  # KW tiles: multiples of 32 rows
    # past 256 rows BM x 192 tiles (3 warpgroups) where they cost least: 6144x4096 M=520 one
    # wave of 136 x 192 (128 tiles), not 384 KW tiles of 160 x 64; 57344x8192 M=300 598 tiles
    # of 152 x 192 in 5 waves, not 896 of 152 x 128 in 7; none under THREE_MIN_ROWS rows
    assert plan(520, 6144, 4096) == (1, 3, 136, 0, 0, g, 0)
    assert plan(300, 57344, 8192) == (1, 3, 152, 0, 0, g, 0)
    # at 257-352 rows of 6144x4096 cluster pairs of 2 x 32 tiles of BM x 192 (PAIR_KINDS),
    # not 3 x 32 of 104 x 192 (too few rows) or 2 x 48 whole ones of 152 x 128
    assert plan(300, 6144, 4096) == (2, 3, 152, 1, 0, g, 0)
    assert plan(352, 6144, 4096) == (2, 3, 176, 1, 0, g, 0)
    assert plan(384, 6144, 4096)[1:3] == (2, 192)  # 2 x 32 tiles of 192 x 192: too many rows
    assert plan(1024, 8192, 8192)[1] == 2  # whole 256-row tiles: no BM x 192 weighed
    assert _int4_hopper.swap_plan(600, 57344, 8192, 132)[:2] == (3, 152)  # stream-K, not MC
    assert plan(600, 4096, 4096) == (1, 2, 152, 0, 0, g, 0)
    # one fragment buffer on three warpgroups' tiles of 128-152 rows, whole or pairs; two
    # slices a turn (PAIRS, config[14], two buffers) on whole ones of 96-136 rows instead
    plans = {m: _int4_hopper.swap_plan(m, 6144, 4096, 132) for m in (272, 300, 352, 512, 520, 600)}
    assert {m: p[7] for m, p in plans.items()} == {272: 1, 300: 1, 352: 2, 512: 2, 520: 2, 600: 1}
    assert {m: p[14:] for m, p in plans.items()} == {272: (), 300: (), 352: (), 512: (1,),
                                                     520: (1,), 600: ()}  # fmt: skip
    assert _int4_hopper.swap_plan(300, 10240, 8192, 132)[7] == 1  # 152 rows
    assert _int4_hopper.swap_plan(192, 10240, 8192, 132)[1::13] == (96, 1)
    assert _int4_hopper.swap_plan(1024, 6144, 4096, 132)[7] == 2  # (two warpgroups)
    assert _int4_hopper.swap_plan(300, 57344, 8192, 132)[7] == 2  # (stream-K)


@pytest.mark.parametrize("peak", [None, 3.35e12, 4.8e12])
def test_int4_swap_plans_by_memory_bandwidth(peak, monkeypatch):
    """``_int4_hopper.run`` plans by the GPU's memory (``_arrays.FAST_MEMORY``): an H200
    takes ``fast_memory_plan``'s changes (10240x8192: M=128 three warpgroups' 128 x 192
    tiles in cluster pairs, M=256 and M=1024 256 x 128 tiles on the stream-K schedule),
    and keeps ``base_plan``'s elsewhere; an H100, the simulator or a driver that does not
    tell keep ``base_plan``'s everywhere (main's plans, as ``test_int4_swap_plan_bands``)."""
    from kaio_ops import _int4_hopper

    monkeypatch.setattr(_arrays, "memory_bandwidth", lambda like: peak)
    monkeypatch.setattr(_arrays, "multiprocessors", lambda like: 132)
    launched_plans = []
    monkeypatch.setattr(_int4_hopper, "launch_swap", lambda *args: launched_plans.append(args[4]))

    class Shaped:  # an operand's shape, all that planning reads
        def __init__(self, *shape):
            self.shape = shape

    def plan(m, n, k):
        launched_plans.clear()
        _int4_hopper.run(Shaped(m, k), Shaped(k // 8, n), Shaped(k // 128, n), f16)
        return launched_plans[0]

    fast = peak is not None and peak >= _arrays.FAST_MEMORY
    sweep = [(m, n, k) for m in (17, 32, 64, 128, 256, 352, 512, 1024, 2048, 4096, 8192)
             for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                          (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))]  # fmt: skip
    changed = {
        (128, 10240, 8192): (3, 128, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1),
        (256, 10240, 8192): (2, 256, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 1, 1),
        (1024, 10240, 8192): (2, 256, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 1, 1),
    }
    for m, n, k in sweep:
        base = _int4_hopper.base_plan(m, n, k, 132)
        assert plan(m, n, k) == (changed.get((m, n, k), base) if fast else base), (m, n, k)
    assert _int4_hopper.base_plan(128, 10240, 8192, 132) == (2, 128, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0)
    assert _int4_hopper.base_plan(256, 10240, 8192, 132)[:2] == (3, 128)
    assert _int4_hopper.base_plan(1024, 10240, 8192, 132)[10] == 1  # KW tiles
    # the cluster pairs take a K split of 2 (108 blocks of 132: 80 before)
    split, _, tiles, consts = _int4_hopper.swap_launch_plan(
        128, 10240, 8192, changed[(128, 10240, 8192)], 132, f16
    )
    assert (split, tiles, consts["CL"], consts["PSUM"]) == (2, 54, 1, 1)


def test_int4_wgmma_dispatch(monkeypatch):
    """On sm_90 (here: the simulator with IN_SIMULATOR) M > DECODE_M takes the wgmma kernel
    (``run``) and M <= DECODE_M the decode kernel; N % 8 != 0 is not the wgmma kernel's
    shape; out_dtype reaches every path; qkv_project_int4 runs the kernel once per weight,
    in f16."""
    from kaio_ops import _int4_hopper

    monkeypatch.setattr(_int4_hopper, "IN_SIMULATOR", True)
    calls = []
    wgmma = _int4_hopper.run
    monkeypatch.setattr(_int4_hopper, "run", lambda *a: calls.append("wgmma") or wgmma(*a))
    low = _int4_hopper.DECODE_M
    paths = [(low + 1, 8, "wgmma"), (70, 12, "tiled")] + ([(low, 8, "decode")] if low else [])
    for m, n, path in paths:
        a, packed, scales, w = int4_case(m, n, 128)
        calls.clear()
        with kaio.simulate():
            c = kaio_ops.matmul_int4(a, packed, scales, out_dtype="float16")
        assert calls == ([path] if path == "wgmma" else []) and c.dtype == np.float16
        ref = a.astype(np.float64) @ w.astype(np.float64)
        np.testing.assert_allclose(c, ref, rtol=2e-3, atol=1e-3 * np.abs(ref).max())
    cases = [int4_case(low + 2, n, 128) for n in (16, 8, 8)]  # grouped-query widths
    calls.clear()
    with kaio.simulate():
        qkv = kaio_ops.qkv_project_int4(cases[0][0], *(c[1] for c in cases), *(c[2] for c in cases))
        alone = [kaio_ops.matmul_int4(cases[0][0], c[1], c[2], out_dtype="float16") for c in cases]
    assert calls == ["wgmma"] * 6
    for got, ref in zip(qkv, alone, strict=True):
        np.testing.assert_array_equal(got, ref)  # one kernel, one plan: the same bits
    monkeypatch.setattr(_int4_hopper, "IN_SIMULATOR", False)  # sm_80 and the like
    with kaio.simulate():
        assert not _int4_hopper.takes(*_sim_operands(*int4_case(low + 1, 8, 128)[:3]))


def test_int4_dequantized_route(monkeypatch):
    """From ``DEQUANT_M`` rows ``run`` makes the weight f16 once and multiplies with
    ``kaio_ops.matmul``: every out_dtype against the float64 product (the same weights'
    bits, f32 sums, one rounding)."""
    from kaio_ops import _int4_hopper

    monkeypatch.setattr(_int4_hopper, "IN_SIMULATOR", True)
    monkeypatch.setattr(_int4_hopper, "DEQUANT_M", 20)
    calls = []
    dequantized = _int4_hopper.dequantized
    monkeypatch.setattr(_int4_hopper, "dequantized", lambda *a: calls.append(1) or dequantized(*a))
    a, packed, scales, w = int4_case(24, 40, 256)
    ref = a.astype(np.float64) @ w.astype(np.float64)
    bound = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    for out_dtype, rounding in ((None, 0.0), ("float16", 2.0**-11), ("bfloat16", 2.0**-8)):
        with kaio.simulate():
            c = np.asarray(kaio_ops.matmul_int4(a, packed, scales, out_dtype=out_dtype))
        c = c.astype(np.float64)
        assert c.shape == (24, 40) and np.all(
            np.abs(c - ref) <= 1e-6 * bound + rounding * np.abs(ref)
        )
    assert len(calls) == 3


def test_int4_torch_op_out_dtype():
    """torch.ops.kaio.matmul_int4 takes out_dtype: the real op (CPU tensors, the simulator)
    and its fake implementation (meta tensors) agree on shape and dtype."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("kaio_ops.torch")  # registers torch.ops.kaio
    a, packed, scales, w = int4_case(3, 16, 128)
    args = [torch.from_numpy(x) for x in (a, packed.view(np.int32), scales)]
    for dtype in (None, torch.float16, torch.bfloat16):
        with kaio.simulate():
            out = torch.ops.kaio.matmul_int4(*args, dtype)
        fake = torch.ops.kaio.matmul_int4(*(x.to("meta") for x in args), dtype)
        assert out.dtype == fake.dtype == (dtype or torch.float32)
        assert out.shape == fake.shape == (3, 16)
        ref = a.astype(np.float64) @ w.astype(np.float64)
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_int4_swap_assembles_for_sm_90a():
    """The role-swap kernel's variants through ptxas: A from registers, no spills, and no
    wgmma serialized (ptxas's C7512 / C7513: too few registers, or a fragment redefined
    while a wgmma that reads it may be in flight)."""
    from kaio_ops import _int4_hopper

    specs = _int4_hopper.swap_specializations()
    for kernel, constexprs in (specs[i] for i in covering(specs)):
        ptx = kernel.ptx(arch="sm_90", **constexprs)
        assert f"wgmma.mma_async.sync.aligned.m64n{constexprs['BM']}k16.f32.f16.f16" in ptx
        report = assemble(ptx, "sm_90a")
        assert " 0 bytes spill stores" in report and "C751" not in report, (constexprs, report)
    if importlib.util.find_spec("llvmlite"):  # the LLVM lowering: a cluster variant
        kernel, constexprs = _int4_hopper.swap_specializations()[5]
        assemble(kernel.ptx(arch="sm_90", backend="llvm", **constexprs), "sm_90a")


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_int4_swap_plans_fit():
    """Every int4_swap configuration that matmul_int4 routes to at Llama-3-8B and -70B shapes
    (M 17..8192, 132 multiprocessors, either memory: ``swap_plan``'s ``fast``) fits: shared
    memory, at most 8 blocks a cluster, and ptxas for sm_90a without spills or serialized
    wgmmas."""
    from kaio_ops import _int4_hopper

    shapes = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (8192, 28672),
              (10240, 8192), (57344, 8192))  # fmt: skip
    seen = {}
    for n, k in shapes:
        for m, fast in itertools.product(
            (17, 32, 64, 100, 128, 200, 256, 300, 448, 512, 520, 1024, 1500, 2048, 3000, 8192),
            (False, True),
        ):
            split, _, _, consts = _int4_hopper.swap_launch_plan(
                m, n, k, _int4_hopper.swap_plan(m, n, k, 132, fast), 132, f16
            )
            cfg = (consts["WG"], consts["BM"], consts["STAGES"], consts["CL"], consts["MC"])
            shared = _int4_hopper.swap_shared_bytes(
                *cfg[:3], consts["CL"], consts["WSTAGES"], consts["KW"]
            )
            assert shared <= _int4_hopper.SHARED_LIMIT and split <= (8 if consts["CL"] else 64)
            seen[(*cfg, consts["SPLIT"], consts["SK"])] = consts
    builds = list(seen.values())
    texts = [_int4_hopper.int4_swap.ptx(arch="sm_90", **consts) for consts in builds]
    with ThreadPoolExecutor(4) as pool:  # ptxas runs in processes of its own
        reports = list(pool.map(lambda ptx: assemble(ptx, "sm_90a"), texts))
    for consts, report in zip(builds, reports, strict=True):
        assert " 0 bytes spill stores" in report and "C751" not in report, (consts, report)
        _assert_registers_balance(report, consts)


def _assert_registers_balance(report: str, consts: dict) -> None:
    """The setmaxnreg of an int4_swap build (ptxas ``report``) can be granted: the consumers'
    ``REGS`` and the producer's registers fit in what the block is launched with (ptxas's
    count times its threads); asking for more hangs ``setmaxnreg.inc`` on the GPU."""
    from kaio_ops._attention_hopper import PRODUCER_REGS

    if not consts["REGS"]:
        return
    used = int(re.search(r"Used (\d+) registers", report).group(1))
    wg = consts["WG"]
    assert consts["REGS"] * 128 * wg + PRODUCER_REGS * 128 <= used * 128 * (wg + 1), (consts, used)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_int4_swap_registers_can_be_granted():
    """Every consumer count's setmaxnreg balances against the block's registers as ptxas
    builds it (4 warpgroups: 96 a thread of 640, so the consumers get 112, not 120)."""
    from kaio_ops import _int4_hopper

    for wg, bm in ((2, 256), (3, 128), (4, 64)):
        consts = {"WG": wg, "BM": bm, "STAGES": _int4_hopper.swap_stages(wg, bm), "SPLIT": 2,
                  "CL": 0, "REGS": _int4_hopper.swap_registers(wg), "OUT": f16, "MC": 0,
                  "WSTAGES": 4, "BUFS": 2, "EARLY": 1, "GROUP": _int4_hopper.GROUP_M,
                  "KW": 0, "LATE": 0, "SK": 0, "CLAMP": 1, "PDL": 1, "PSUM": 0,
                  "HEAD": 1, "PAIRS": 0, "LEAD": 0}  # fmt: skip
        report = assemble(_int4_hopper.int4_swap.ptx(arch="sm_90", **consts), "sm_90a")
        assert " 0 bytes spill stores" in report, (consts, report)
        _assert_registers_balance(report, consts)


# --------------------------------------------------------------------------- int8 on wgmma
@pytest.mark.parametrize(
    "m, n, k, dtype", [(130, 136, 288, np.int8), (70, 9, 160, np.uint8), (300, 264, 128, np.int8)]
)
def test_int8_wgmma_exact_in_simulator(m, n, k, dtype, monkeypatch):
    """matmul_int8 on the sm_90 kernel (``_int8_hopper``, wgmma s8 -> s32) in the simulator:
    bit-identical with the integer reference; M and N edges, an odd N (element stores), uint8
    bytes read as int8, K slices past the ring's stages, and 2 blocks for up to 9 tiles."""
    from kaio_ops import _int8_hopper

    monkeypatch.setattr(_int8_hopper, "IN_SIMULATOR", True)
    calls = []
    launch = _int8_hopper.launch
    monkeypatch.setattr(
        _int8_hopper, "launch", lambda *a: calls.append(1) or launch(*a[:6], 2, a[7])
    )
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    a = RNG.integers(lo, hi, (m, k)).astype(dtype)
    b = RNG.integers(lo, hi, (k, n)).astype(dtype)
    with kaio.simulate():
        c = kaio_ops.matmul_int8(a, b, 0.37)
    assert calls == [1]
    np.testing.assert_array_equal(c, int8_reference(a, b, 0.37))


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_int8_wgmma_assembles_for_sm_90a(backend):
    """Both tiles of the int8 wgmma kernel through both lowerings and ptxas: no spills."""
    from kaio_ops import _int8_hopper

    for kernel, constexprs in _int8_hopper.specializations():
        ptx = kernel.ptx(arch="sm_90", backend=backend, **constexprs)
        assert f"wgmma.mma_async.sync.aligned.m64n{constexprs['BN']}k32.s32.s8.s8" in ptx
        assert " 0 bytes spill stores" in assemble(ptx, "sm_90a")


def test_wgmma_s8_needs_an_i32_accumulator():
    @kaio.gpu_kernel(block_size=128)
    def bad(out: f32[:]):
        acc = kaio.local(f32, 4)
        tile = kaio.shared_dynamic(f16, (64, 64), 0)
        d = kaio.smem_descriptor(tile, (0, 0), 128, 16, 1024)
        kaio.wgmma_s8(acc, d, d, False)
        out[0] = acc[0]

    with pytest.raises(kaio.CompileError, match="i32 accumulator"):
        bad.ptx(arch="sm_90")


def _sim_operands(*arrays):
    """Checked ``Operand``s of NumPy arrays (inside ``kaio.simulate()``)."""
    inputs = _arrays.Inputs("test")
    kinds = (f16, u32, kaio.i32, kaio.i8, kaio.u8)
    return [inputs.array(x, f"x{i}", dtypes=kinds) for i, x in enumerate(arrays)]


def test_int4_dequantized_side_by_side_in_simulator():
    """The prefill path's f16 weights: two weights side by side, every element the same bits
    as the reference's ``f16(scale * q)``."""
    cases = [int4_case(1, n, 384) for n in (40, 24)]
    words = (cases[0][1], cases[1][1].view(np.int32))  # int32 words: the same bits
    with kaio.simulate():
        like, *ops = _sim_operands(cases[0][0], words[0], cases[0][2], words[1], cases[1][2])
        w = _prefill.int4_to_f16(like, [ops[0:2], ops[2:4]])
    np.testing.assert_array_equal(w, np.concatenate([c[3] for c in cases], axis=1))


def test_int4_prefill_paths_in_simulator():
    """The sm_90 prefill path run whole in the simulator (dispatch picks it only on an H100 or
    H200): matmul_int4 as f32, and the three projections in f16 from one Hopper matmul."""
    m, k, widths = 130, 256, (40, 24, 72)
    cases = [int4_case(m, n, k) for n in widths]
    x = cases[0][0]
    with kaio.simulate():
        xo, *ops = _sim_operands(x, *(v for c in cases for v in c[1:3]))
        c = _prefill.matmul_int4(xo, *ops[0:2])
        q, kk, v = _prefill.qkv_int4(xo, [ops[0:2], ops[2:4], ops[4:6]])
    ref = [x.astype(np.float64) @ case[3].astype(np.float64) for case in cases]
    assert c.dtype == np.float32
    np.testing.assert_allclose(c, ref[0], rtol=1e-5, atol=1e-5 * np.abs(ref[0]).max())
    for got, want in zip((q, kk, v), ref, strict=True):
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2**-10, atol=2**-14 + 1e-5 * np.abs(want).max())


def test_int8_prefill_path_in_simulator():
    """int8 and uint8 weights widened to f16 side by side (exactly), then the projections
    ``f16(f32(x @ w) * s)`` from one Hopper matmul, each within an f16 rounding of the
    integer reference."""
    m, k, widths, scales = 130, 192, (48, 32, 16), [0.01, -0.5, 3.0]
    x = RNG.standard_normal((m, k)).astype(np.float16)
    ws = [RNG.integers(-128, 128, (k, n)).astype(np.int8) for n in widths]
    ws[1] = ws[1].view(np.uint8)  # bytes read as int8
    with kaio.simulate():
        xo, *ops = _sim_operands(x, *ws)
        w16 = _prefill.int8_to_f16(xo, ops)
        outs = _prefill.qkv_int8(xo, ops, scales)
    np.testing.assert_array_equal(w16, np.concatenate([w.view(np.int8) for w in ws], 1))
    for got, w, sc in zip(outs, ws, scales, strict=True):
        want = (x.astype(np.float64) @ w.view(np.int8).astype(np.float64)) * sc
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2**-10, atol=2**-14 + 1e-5 * np.abs(want).max())


def test_qkv_int8_route(monkeypatch):
    """qkv_project_int8's route: where the Hopper matmul takes the product (an sm_90 GPU past
    16 rows, ``hopper_takes``: stood in for here) and every width is a multiple of 16, the
    weights are widened once and the three projections come from one wgmma matmul
    (``_prefill.qkv_int8``); a width that is not (24) keeps the fused mma.sync kernel, whose
    results are checked."""
    from kaio_ops import _plan

    _plan.clear()  # (no plan recorded with the stand-ins outlives the test)
    taken = []
    monkeypatch.setattr(_prefill, "hopper_takes", lambda *a: True)
    monkeypatch.setattr(_prefill, "qkv_int8", lambda *a: taken.append(a) or (None,) * 3)
    x, weights, scales = int8_qkv_case(32, (48, 32, 16), 64)
    with kaio.simulate():
        assert kaio_ops.qkv_project_int8(x, *weights, *scales) == (None,) * 3
        assert len(taken) == 1 and [w.shape[1] for w in taken[0][1]] == [48, 32, 16]
        x, weights, scales = int8_qkv_case(32, (48, 24, 16), 64)
        outs = kaio_ops.qkv_project_int8(x, *weights, *scales)
    _plan.clear()
    assert len(taken) == 1
    for got, w, sc in zip(outs, weights, scales, strict=True):
        want = (x.astype(np.float64) @ w.astype(np.float64)) * sc
        np.testing.assert_allclose(got, want, rtol=2**-10, atol=2**-14 + 1e-5 * np.abs(want).max())


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


ARCHS = ("sm_80", "sm_90")


def _assemble(job: tuple) -> None:
    """Specialization ``index`` (of ``specializations()``) through ptxas for ``archs``."""
    index, archs = job
    kernel, constexprs = specializations()[index]
    if constexprs.get("XS"):
        archs = ("sm_90",)  # XS's turns wait at mbarriers (mbarrier.try_wait: sm_90)
    for arch in archs:
        report = assemble(kernel.ptx(arch=arch, **constexprs), arch)
        if kernel in (_int4_decode.int4_decode, _int4_decode.int4_decode_qkv):
            # the decode kernel's tiles live in registers: a spill is a slowdown (8 m16 tiles
            # spilled on sm_90, hence MAX_M = 64)
            assert " 0 bytes spill stores" in report, (constexprs, arch, report)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_every_specialization_assembles():
    """The specializations (a covering subset, ``tests.harness.covering``) through ptxas for
    sm_80 and sm_90, except that those of the fused QKV kernel and of the int4 decode kernels
    (big register tiles: seconds of Python and ptxas each) take the two in turn. Emitting
    PTX is Python: processes, not threads, run the jobs in parallel."""
    specs = specializations()
    kept = covering(specs)
    heavy = (qkv_kernel, _int4_decode.int4_decode, _int4_decode.int4_decode_qkv)
    fused = [i for i in kept if specs[i][0] in heavy]
    jobs = [(i, ARCHS) for i in kept if i not in fused]
    for n, i in enumerate(fused):  # (PDL, programmatic dependent launch: sm_90 only)
        jobs.append((i, ("sm_90",) if specs[i][1].get("PDL") else (ARCHS[n % 2],)))
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(_assemble, jobs))


# --------------------------------------------------------------------------- fused QKV
def int8_qkv_case(m, widths, k, rng=RNG):
    """f16 activations, three int8 weights [K, N] of the given widths, three scales."""
    x = rng.standard_normal((m, k)).astype(np.float16)
    weights = [rng.integers(-128, 128, (k, n)).astype(np.int8) for n in widths]
    scales = [float(s) for s in rng.random(3) * 0.02 + 0.005]
    return x, weights, scales


def int4_qkv_case(m, widths, k, rng=RNG):
    """f16 activations, then per width (packed words, f16 scales, dequantized f16 weights)."""
    x = rng.standard_normal((m, k)).astype(np.float16)
    return x, [int4_case(m, n, k, rng)[1:] for n in widths]


def f32_sum_slack(x, w, scale=1.0) -> np.ndarray:
    """What an f32 sum of the products of ``scale * x @ w`` may be off by on the simulator:
    2**-16 of the sum of their magnitudes (it rounds once per mma k step)."""
    return 2.0**-16 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) * scale)


def check_f16_product(out, x, w, scale=1.0):
    """``out`` is ``f16(scale * x @ w)`` with an f32 sum: within half an f16 ulp of the float64
    product (2**-11 relative, 2**-25 absolute for subnormals), plus the f32 sum's slack."""
    exact = x.astype(np.float64) @ w.astype(np.float64) * scale
    tol = 2.0**-11 * np.abs(exact) + 2.0**-25 + f32_sum_slack(x, w, scale)
    assert out.dtype == np.float16 and out.shape == exact.shape
    err = np.abs(out.astype(np.float64) - exact)
    assert (err <= tol).all(), f"{(err > tol).sum()} elements off, worst {err.max():.3g}"


def check_within_f16_rounding(fused, separate, slack):
    """``fused`` (f16) and ``separate`` (f16 or f32) are roundings of the same product summed
    in another f32 order: at most one f16 ulp apart beyond ``slack``, what the two sums may
    differ by."""
    a, b = fused.astype(np.float64), separate.astype(np.float64)
    ulp = np.spacing(np.maximum(np.abs(a), np.abs(b)).astype(np.float16)).astype(np.float64)
    assert (np.abs(a - b) <= ulp + slack).all()


@pytest.fixture
def poisoned(monkeypatch):
    """Arrays the ops allocate (outputs, K-split workspaces) start as NaN bytes, so an
    element a kernel never writes fails the checks."""
    poison_allocations(monkeypatch)


# (M, widths of Q, K, V, K): decode with a K split; decode with grouped-query widths; edge
# tiles with 16-byte copies; N % 16 != 0 (int8 element path); K % 8 != 0 and N > 128
QKV8_SHAPES = [
    (1, (32, 32, 32), 512),
    (16, (48, 16, 32), 64),
    (40, (48, 16, 32), 96),
    (33, (18, 34, 8), 40),
    (70, (130, 2, 66), 21),
]


@pytest.mark.parametrize("m, widths, k", QKV8_SHAPES)
def test_qkv_int8_in_simulator(m, widths, k, poisoned):
    x, weights, scales = int8_qkv_case(m, widths, k)
    with kaio.simulate():
        out = kaio_ops.qkv_project_int8(x, *weights, *scales)
    assert isinstance(out, tuple) and len(out) == 3
    for o, w, s in zip(out, weights, scales, strict=True):
        check_f16_product(o, x, w, s)


def test_qkv_int8_reads_uint8_bytes_as_int8(poisoned):
    x, weights, scales = int8_qkv_case(17, (32, 16, 48), 64)
    with kaio.simulate():
        signed = kaio_ops.qkv_project_int8(x, *weights, *scales)
        unsigned = kaio_ops.qkv_project_int8(x, *(w.view(np.uint8) for w in weights), *scales)
    for a, b in zip(signed, unsigned, strict=True):
        np.testing.assert_array_equal(a, b)


# decode with a K split; decode, grouped-query widths; edge tiles; N % 4 != 0 (element path)
QKV4_SHAPES = [
    (1, (32, 32, 32), 512),
    (16, (64, 8, 24), 256),
    (40, (48, 16, 40), 128),
    (33, (20, 36, 12), 384),
    (17, (18, 6, 10), 128),
    (32, (8, 4, 12), 128),
]


@pytest.mark.parametrize("m, widths, k", QKV4_SHAPES)
def test_qkv_int4_in_simulator(m, widths, k, poisoned):
    x, weights = int4_qkv_case(m, widths, k)
    with kaio.simulate():
        out = kaio_ops.qkv_project_int4(x, *(w[0] for w in weights), *(w[1] for w in weights))
    assert isinstance(out, tuple) and len(out) == 3
    for o, (_, _, w) in zip(out, weights, strict=True):
        check_f16_product(o, x, w)


def qkv_plan(m, widths, k, quant, vec=True, x=None):
    """``_qkv_plan`` for activations [m, k]: ``x`` on its GPU, else in the simulator."""
    if x is None:
        like = _arrays.Operand("x", None, "numpy", (m, k), f16, None, 0)
    else:
        like = _arrays.Inputs("test").array(x, "x", ndim=2, dtypes=(f16,))
    return _qkv_plan(like, widths, k, quant, vec)


@pytest.mark.parametrize("m, k", [(1, 512), (40, 96)])
def test_qkv_int8_equals_separate_calls_in_simulator(m, k):
    """One weight per launch (the same kernel, the same plan): the same bits."""
    x, weights, scales = int8_qkv_case(m, (48, 48, 48), k)
    assert qkv_plan(m, [48] * 3, k, 8) == qkv_plan(m, [48], k, 8)
    with kaio.simulate():
        fused = kaio_ops.qkv_project_int8(x, *weights, *scales)
        separate = [project_int8(x, w, s) for w, s in zip(weights, scales, strict=True)]
    for a, b in zip(fused, separate, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "m, widths, k", [(1, (40, 40, 40), 512), (9, (64, 36, 100), 256), (40, (40, 40, 40), 128)]
)
def test_qkv_int4_equals_matmul_int4_in_simulator(m, widths, k):
    """Against matmul_int4 rounded to f16: the same bits, since both take the same kernel
    code (at M <= 64 the decode kernel, one launch for the three weights in the fused op;
    above, the tiled kernel)."""
    x, weights = int4_qkv_case(m, widths, k)
    with kaio.simulate():
        fused = kaio_ops.qkv_project_int4(x, *(w[0] for w in weights), *(w[1] for w in weights))
        separate = [kaio_ops.matmul_int4(x, p, s) for p, s, _ in weights]
    for a, b in zip(fused, separate, strict=True):
        np.testing.assert_array_equal(a, b.astype(np.float16))


def test_qkv_plans():
    """At decode, the K split of one projection alone (a fused block walks no more of K than
    a separate call's); above, the tile for all the columns together."""
    with kaio.simulate():
        assert qkv_plan(16, [4096] * 3, 4096, 4) == heuristic(16, 4096, 4096)
        assert qkv_plan(1, [4096, 1024, 1024], 4096, 8) == heuristic(1, 4096, 4096)
        assert qkv_plan(512, [4096] * 3, 4096, 8) == heuristic(512, 3 * 4096, 4096)
        assert heuristic(16, 4096, 4096).split > 1
        assert heuristic(512, 3 * 4096, 4096) != heuristic(512, 4096, 4096)
        assert qkv_plan(512, [4096] * 3, 4096, 4, vec=False) == Plan(FALLBACK)
        assert qkv_plan(16, [4096] * 3, 4096, 4, vec=False) == heuristic(16, 4096, 4096)


def test_every_fused_plan_is_a_listed_specialization():
    """Whatever plan a fused launch takes, its kernel is one the PTX test assembles."""
    listed = [(k, c) for k, c in specializations() if k is qkv_kernel]
    shapes = [([4096] * 3, 4096), ([128] * 3, 4096), ([64] * 3, 256)]  # K splits of 4, 16, 1
    with kaio.simulate():
        for m, (widths, k), vec, quant in itertools.product(
            (1, 16, 17, 100, 300, 4096), shapes, (False, True), (4, 8)
        ):
            plan = qkv_plan(m, widths, k, quant, vec)
            cfg = CONFIGS[plan.config]
            out = f16 if k_slices(k, plan.split, cfg.bk)[0] == 1 else f32
            assert (qkv_kernel, qkv_constexprs(plan.config, vec, quant, out)) in listed, (m, plan)


def _qkv8(x=(4, 64), w=((64, 16),) * 3, s=(0.5, 0.5, 0.5), wdtype=np.int8):
    """A qkv_project_int8 call on ones of these shapes (or the arrays given)."""
    arrays = [np.ones(shape, wdtype) if isinstance(shape, tuple) else shape for shape in w]
    xs = np.ones(x, np.float16) if isinstance(x, tuple) else x
    return lambda: kaio_ops.qkv_project_int8(xs, *arrays, *s)


def _qkv4(x=(4, 128), w=((16, 8),) * 3, s=((1, 8),) * 3):
    """A qkv_project_int4 call on ones of these shapes."""
    args = [np.ones(x, np.float16), *(np.ones(a, np.uint32) for a in w)]
    return lambda: kaio_ops.qkv_project_int4(*args, *(np.ones(a, np.float16) for a in s))


@pytest.mark.parametrize(
    "call, message",
    [
        (_qkv8(x=np.ones((4, 64), np.float32)), "'x' must be a 2-D array \\[M, K\\] of f16"),
        (_qkv8(x=(0, 64)), "'x' has an empty dimension"),
        (_qkv8(w=((64, 16), (63, 16), (64, 16))), r"'wk' must have shape \[K, N\] = \[64, N\]"),
        (_qkv8(w=((64, 16), (64, 16), (64, 15))), "'wv' must have .* with N even"),
        (_qkv8(w=((64, 16), (64, 16), (64,))), "'wv' must be a 2-D array"),
        (_qkv8(wdtype=np.int16), "'wq' must be a 2-D array .* of i8 or u8"),
        (_qkv8(s=(0.5, np.ones(1), 0.5)), "'sk' must be a Python float"),
        (_qkv8(w=(np.ones((16, 64), np.int8).T, (64, 16), (64, 16))), "'wq' must be contiguous"),
        (_qkv4(x=(4, 100)), "'x' needs K a positive multiple of 128"),
        (_qkv4(w=((16, 8), (15, 8), (16, 8))), r"'wk' must have shape \[K/8, N\]"),
        (_qkv4(s=((1, 8), (1, 8), (2, 8))), r"'sv' must have shape \(1, 8\)"),
    ],
)
def test_qkv_bad_inputs_name_the_argument(call, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        call()


def test_qkv_numpy_outside_simulate_names_both_ways_out():
    with pytest.raises(ValueError, match="'x' is a NumPy array.*to_device.*simulate"):
        _qkv8()()


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k",
    # decode rows (_int8_decode): 16, 1, and 7 with a partial column block and K split
    [(4096, 4096, 4096), (16, 4096, 4096), (1000, 1030, 770), (1, 4096, 4096), (7, 1000, 1096)],
)
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
@pytest.mark.parametrize("m, n, k", [(1000, 1032, 4096), (4096, 4096, 4096), (130, 4104, 1024)])
def test_gpu_int8_wgmma_exact(m, n, k):
    """matmul_int8 at real sizes (the wgmma kernel on sm_90): bit-identical with
    f32(torch._int_mm) * scale, and the same bits on a second call."""
    import torch

    gen = torch.Generator("cuda").manual_seed(m)
    a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (k, n), device="cuda", dtype=torch.int8, generator=gen)
    out = kaio_ops.matmul_int8(a, b, 0.37)
    assert torch.equal(out, torch._int_mm(a, b).float() * 0.37)
    assert torch.equal(out, kaio_ops.matmul_int8(a, b, 0.37))


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1, 4096, 4096), (16, 4096, 4096)])
def test_gpu_int4(m, n, k):
    import torch

    a, packed, scales, w = int4_case(m, n, k, np.random.default_rng(m))
    dev = [torch.from_numpy(x).cuda() for x in (a, packed.view(np.int32), scales)]
    c = kaio_ops.matmul_int4(*dev).cpu().numpy()
    ref = a.astype(np.float64) @ w.astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("m", [32, 64])
def test_gpu_int4_multi_tile(m, monkeypatch):
    """K = N = 4096, M past one m16 tile (the decode kernel with 2 and 4 tiles a block; on
    sm_90 that M takes the wgmma kernel, turned off here): every element against float64
    products with the dequantized weights, within what the tensor cores' f32 sums may be off
    (1 ulp per product of the sum of magnitudes)."""
    import torch

    from kaio_ops import _plan

    monkeypatch.setenv("KAIO_HOPPER_MATMUL", "0")
    _plan.clear()  # plans keep the setting they were made with
    k = n = 4096
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).half()
    packed, scales, w = _torch_int4_weights(k, n, m)
    out = kaio_ops.matmul_int4(x, packed, scales)
    _plan.clear()
    x64, w64 = x.double(), w.double()
    exact = x64 @ w64
    slack = k * 2.0**-24 * (x64.abs() @ w64.abs())
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert bool(((out.double() - exact).abs() <= slack).all())


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k, out_dtype",
    [(17, 4096, 4096, None), (40, 10240, 2048, "float16"), (700, 6144, 1024, "bfloat16"),
     (250, 10240, 1024, "float16"), (300, 10240, 8192, "bfloat16"),
     (200, 4104, 4096, None), (1000, 1024, 14336, "float16"),
     (300, 4096, 4096, None), (2048, 8192, 4096, "float16"), (4096, 4096, 4096, "bfloat16"),
     (100, 8192, 4096, None), (256, 8192, 2048, "float16"), (1024, 32768, 1024, "float16"),
     (120, 4096, 2048, "float16"), (200, 1024, 4096, "bfloat16"),
     (600, 4096, 2048, "float16"), (1500, 6144, 1024, "bfloat16"),
     (600, 28672, 2048, "bfloat16"), (300, 6144, 4096, "float16"), (520, 6144, 4096, None)],
)  # fmt: skip
def test_gpu_int4_wgmma(m, n, k, out_dtype):
    """M > 16 on sm_90 (the wgmma kernel: at 17 rows KW tiles of 32 x 64 in cluster pairs, at 40
    rows of N = 10240 4 consumer warpgroups side by side and a workspace K split of 3, at
    700 rows of N = 6144 176 x 192 tiles (three warpgroups; they cost least), at 250 rows of
    N = 10240 3 consumer warpgroups on 128 x 192 tiles, the last column of tiles partly past
    N, two K slices a turn (PAIRS, a tile's first slice alone: LEAD; 136 x 192 tiles at 520
    rows of 6144 x 4096 too), at 300 rows of 10240 x 8192 on 152 x 192 ones; at 600 rows of
    28672 x 2048 the stream-K schedule on 152 x 192 tiles (SK: tiles split between blocks,
    summed by the tile's head; at 300 rows of 6144 x 4096 cluster pairs of 152 x 192 tiles);
    at 65-512 rows two warpgroups sharing BM x 64 tiles, each every other K slice (KW: a
    cluster pair's K split at 120 and 200 rows; 128-row tiles at 100 rows, 256 at 256, 160
    at 300; 128-row tiles and a K split of 4 through the workspace at 200 rows of N = 1024),
    256-row tiles past 512 rows (multicast pairs of 256 rows in groups of 4 rows at N =
    32768; balanced row tiles, as many as cost least: 600 rows in four of 152, 1500 in eight
    of 192 x 128, not KW tiles), every M up to 4096; elsewhere the other paths): every
    element against float64 products within the f32 sums' slack plus the output's rounding,
    and the same bits on a second call (a race would move them)."""
    _check_gpu_int4(m, n, k, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, n, k, out_dtype",
    [(128, 10240, 8192, "float16"), (100, 10240, 4096, None), (240, 10240, 8192, None),
     (1024, 10240, 8192, "bfloat16")],
)  # fmt: skip
def test_gpu_int4_fast_memory_plans(m, n, k, out_dtype, monkeypatch):
    """``_int4_hopper.fast_memory_plan``'s plans, forced on any GPU (an H200 takes them; its
    outputs poisoned): three warpgroups' BM x 192 tiles in cluster pairs at 100 and 128 rows
    (one fragment buffer at 128 rows), 240- and 256-row tiles x 128 on the stream-K schedule
    at 240 and 1024 rows, checked as ``test_gpu_int4_wgmma``."""
    from kaio_ops import _int4_hopper

    monkeypatch.setattr(_arrays, "fast_memory", lambda like: True)
    poison_allocations(monkeypatch)
    plan = _int4_hopper.swap_plan(m, n, k, 132, True)
    assert plan != _int4_hopper.base_plan(m, n, k, 132), plan
    _check_gpu_int4(m, n, k, out_dtype)


def _check_gpu_int4(m: int, n: int, k: int, out_dtype) -> None:
    """``matmul_int4`` of random f16 rows and int4 weights (``_torch_int4_weights``) on the
    GPU: every element within the f32 sums' slack plus the output's rounding of the
    float64 product, and the same bits on a second call."""
    import torch

    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).half()
    packed, scales, w = _torch_int4_weights(k, n, m)
    out = kaio_ops.matmul_int4(x, packed, scales, out_dtype=out_dtype)
    again = kaio_ops.matmul_int4(x, packed, scales, out_dtype=out_dtype)
    x64, w64 = x.double(), w.double()
    exact = x64 @ w64
    rounding = {None: 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}[out_dtype]
    slack = k * 2.0**-24 * (x64.abs() @ w64.abs()) + rounding * exact.abs()
    assert out.shape == (m, n) and str(out.dtype) == f"torch.{out_dtype or 'float32'}"
    assert bool(((out.double() - exact).abs() <= slack).all())
    assert torch.equal(out, again)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [300, 600])
def test_gpu_int4_dependent_launch_chain(m, monkeypatch):
    """int4_swap launched with programmatic dependent launch (``_int4_hopper.PDL`` 1, and 2:
    the kernel after it placed early) right behind the kernels that make its input (six
    steps x -> matmul_int4 -> x, normalized by torch between them; N = K = 4096, the routed
    plan: KW tiles of 160 x 64 at 300 rows, 152 x 128 tiles at 600) gives the bits it gives
    without it, each step within the f32 sums' slack and the f16 rounding of the float64
    product of its input."""
    import torch

    from kaio_ops import _int4_hopper, _plan

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("int4_swap needs sm_90")
    packed, scales, w = _torch_int4_weights(4096, 4096, m)

    def chain(pdl: int) -> list:
        monkeypatch.setattr(_int4_hopper, "PDL", pdl)
        _plan.clear()  # (a call plan keeps the launch it was made with)
        gen = torch.Generator("cuda").manual_seed(m)
        x = torch.randn(m, 4096, device="cuda", generator=gen).half()
        steps = []
        for _ in range(6):
            out = kaio_ops.matmul_int4(x, packed, scales, out_dtype="float16")
            steps.append((x, out))
            x = (out / out.abs().amax()).half()
        torch.cuda.synchronize()
        return steps

    plain, dependent, placed = chain(0), chain(1), chain(2)
    w64 = w.double()
    for (_, out0), (x, out1), (_, out2) in zip(plain, dependent, placed, strict=True):
        assert torch.equal(out0, out1) and torch.equal(out0, out2)
        exact = x.double() @ w64
        slack = 4096 * 2.0**-24 * (x.double().abs() @ w64.abs()) + 2.0**-11 * exact.abs()
        assert bool(((out1.double() - exact).abs() <= slack).all())


def _torch_int4_weights(k: int, n: int, seed: int):
    """On the GPU: packed int4 words (int32 [K/8, N]), f16 scales and the f16 weights."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(-8, 8, (k, n), device="cuda", generator=gen, dtype=torch.int32)
    scales = (torch.rand(k // 128, n, device="cuda", generator=gen) * 0.05 + 0.01).half()
    nibbles = (q & 0xF).reshape(k // 8, 8, n)
    words = sum(nibbles[:, i].long() << (4 * i) for i in range(8))
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # same bits
    return packed, scales, (scales.float().repeat_interleave(128, 0) * q).half()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 7, 9, 16])
def test_gpu_int4_decode_warps(m):
    """The decode kernel's blocks of 4 and 8 warps at real sizes (N past a 32-column block,
    K an odd number of groups): every element against float64 products with the dequantized
    weights within what the tensor cores' f32 sums may be off, and the same bits on a
    second call."""
    import torch

    k, n = 4096 + 3 * 128, 4104
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).half()
    packed, scales, w = _torch_int4_weights(k, n, m)
    x64, w64 = x.double(), w.double()
    exact = x64 @ w64
    slack = k * 2.0**-24 * (x64.abs() @ w64.abs())
    inputs = _arrays.Inputs("test")
    ops = [
        inputs.array(t, f"x{i}", dtypes=(f16, u32, kaio.i32))
        for i, t in enumerate((x, packed, scales))
    ]
    for warps in (4, 8):
        out = _int4_decode.matmul(*ops, f32, warps)
        assert out.shape == (m, n) and bool(((out.double() - exact).abs() <= slack).all()), warps
        assert torch.equal(out, _int4_decode.matmul(*ops, f32, warps)), warps


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize(
    "n, groups",
    [(n, 9) for n in (4096, 6144, 10240, 14336, 20480, 28672, 45056)] + [(10240, 65), (14336, 33)],
)
def test_gpu_int4_decode_plans(m, n, groups):
    """matmul_int4 at M <= 16 as routed (``_int4_decode.plan``: its warps, swap, x lead,
    dequantization and column blocks a block by the tiles an SM, each N here another
    branch on 132 SMs; K long enough for the halves of ``halves`` at 10240 and 14336
    columns), K an odd number of groups: every element against float64 products with the
    dequantized weights within the f32 sums' slack, and the same bits twice."""
    import torch

    k = groups * 128
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(n)).half()
    packed, scales, w = _torch_int4_weights(k, n, m + n)
    out = kaio_ops.matmul_int4(x, packed, scales)
    x64, w64 = x.double(), w.double()
    exact = x64 @ w64
    slack = k * 2.0**-24 * (x64.abs() @ w64.abs())
    assert out.shape == (m, n) and bool(((out.double() - exact).abs() <= slack).all())
    assert torch.equal(out, kaio_ops.matmul_int4(x, packed, scales))


def _gpu_check(fused, separate, x, weights, scales, same_plan: bool):
    """On the GPU, with float64 products from torch: each fused output against the exact
    product as check_f16_product does, allowing the tensor cores' f32 sums 1 ulp per
    product of the sum of magnitudes (docs/tensor-cores.md); and against the separate
    call's output, the same bits when both ran one plan, else check_within_f16_rounding."""
    for out, sep, w, scale in zip(fused, separate, weights, scales, strict=True):
        x64, w64 = x.double(), w.double()
        exact = x64 @ w64 * scale
        slack = x.shape[1] * 2.0**-24 * (x64.abs() @ w64.abs() * scale)
        assert out.dtype == x.dtype and out.shape == exact.shape
        err = (out.double() - exact).abs()
        assert bool((err <= 2.0**-11 * exact.abs() + 2.0**-25 + slack).all())
        if same_plan:
            assert bool((out == sep.half()).all())
        else:
            check_within_f16_rounding(out.cpu().numpy(), sep.cpu().numpy(), 2 * slack.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 512])
def test_gpu_qkv_int8(m):
    """K = N = 4096: against float64 products on the GPU, and against one launch per weight
    (project_int8)."""
    import torch

    k = n = 4096
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=gen).half()
    weights = [
        torch.randint(-128, 128, (k, n), device="cuda", generator=gen, dtype=torch.int8)
        for _ in range(3)
    ]
    scales = [0.01, 0.02, 0.005]
    fused = kaio_ops.qkv_project_int8(x, *weights, *scales)
    separate = [project_int8(x, w, s) for w, s in zip(weights, scales, strict=True)]
    same_plan = qkv_plan(m, [n] * 3, k, 8, x=x) == qkv_plan(m, [n], k, 8, x=x)
    _gpu_check(fused, separate, x, weights, scales, same_plan)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 512])
def test_gpu_qkv_int4(m):
    """K = N = 4096: against float64 products with the dequantized weights on the GPU, and
    against three matmul_int4 calls: the same bits at M <= 64 where both run the decode
    kernel with one plan (warps and knobs), else within f16 rounding (at M = 512 their own tiled
    plans)."""
    import torch

    k = n = 4096
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).half()
    weights = [_torch_int4_weights(k, n, seed) for seed in range(3)]
    fused = kaio_ops.qkv_project_int4(x, *(w[0] for w in weights), *(w[1] for w in weights))
    separate = [kaio_ops.matmul_int4(x, p, s) for p, s, _ in weights]
    # the decode kernel's plan follows the columns (3 x 4096 fused, 4096 apart): the same
    # bits where both take one plan (warps, swap, dequantization)
    xo = _arrays.Inputs("test").array(x, "x", dtypes=(f16,))
    fused_p, one_p = (_int4_decode.planned(xo, t, k // 128) for t in (3 * n // 32, n // 32))
    same = m <= _int4_decode.MAX_M and fused_p == one_p
    _gpu_check(fused, separate, x, [w[2] for w in weights], [1.0] * 3, same)


@pytest.mark.gpu
@pytest.mark.skipif(
    "not (kaio.gpu_available() and kaio.device().arch == 'sm_90')", reason="needs an sm_90 GPU"
)
def test_gpu_prefill_paths_on_hopper(monkeypatch):
    """On sm_90, matmul_int4 at M = 4096 and the int4 projections at M = 512 take the
    dequantize-then-wgmma path from ``_int4_hopper.PREFILL_M``, below it the int4 wgmma
    kernel (``_int4_hopper.run``); the int8 projections the dequantize-then-wgmma path; its
    int4 weights in f16 are the reference's bits."""
    import torch

    from kaio_ops import _int4_hopper

    monkeypatch.delenv("KAIO_HOPPER_MATMUL", raising=False)
    taken = []
    for module, name in ((_prefill, "matmul_int4"), (_prefill, "qkv_int4"),
                         (_prefill, "qkv_int8"), (_int4_hopper, "run")):  # fmt: skip
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _f=real: taken.append(_n) or _f(*a))
    k = n = 4096
    packed, scales, w = _torch_int4_weights(k, n, 11)
    x = torch.randn(4096, k, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    x = x.half()
    inputs = _arrays.Inputs("test")
    ops = [
        inputs.array(t, f"t{i}", dtypes=(f16, kaio.i32)) for i, t in enumerate((x, packed, scales))
    ]
    assert torch.equal(_prefill.int4_to_f16(ops[0], [ops[1:]]), w)
    kaio_ops.matmul_int4(x, packed, scales)
    kaio_ops.qkv_project_int4(x[:512], packed, packed, packed, scales, scales, scales)
    w8 = torch.randint(-128, 128, (k, n), device="cuda", dtype=torch.int8)
    kaio_ops.qkv_project_int8(x[:512], w8, w8, w8, 0.5, 0.25, 2.0)
    project_int8(x, w8, 0.5)
    int4 = ["matmul_int4" if 4096 >= _int4_hopper.PREFILL_M else "run"]
    int4 += ["qkv_int4"] if 512 >= _int4_hopper.PREFILL_M else ["run"] * 3
    assert taken == [*int4, "qkv_int8", "qkv_int8"]


@pytest.mark.gpu
def test_gpu_qkv_device_array_and_cupy_inputs():
    """The same results from kaio.DeviceArray (and CuPy, where installed) as from torch."""
    import torch

    x, weights, scales = int8_qkv_case(70, (64, 32, 48), 128)
    on_gpu = [torch.from_numpy(a).cuda() for a in (x, *weights)]
    want = kaio_ops.qkv_project_int8(*on_gpu, *scales)
    got = kaio_ops.qkv_project_int8(kaio.to_device(x), *map(kaio.to_device, weights), *scales)
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, kaio.DeviceArray)
        np.testing.assert_array_equal(a.numpy(), b.cpu().numpy())
    cupy = pytest.importorskip("cupy")
    got = kaio_ops.qkv_project_int8(cupy.asarray(x), *map(cupy.asarray, weights), *scales)
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(a), b.cpu().numpy())
