"""Decode attention (``flash_attention_decode``) and the KV cache append: in the simulator
against a float64 NumPy reference over ragged lengths (0, 1, page boundaries, lengths that
are no multiple of a tile), grouped-query ratios 1, 4 and 8, 1 to 16 new tokens, both cache
layouts and f16/bf16; one split (the direct path) and several (the merge); input checks;
every shipped specialization through ptxas; on a GPU, real sizes against torch SDPA on the
gathered cache and a decode step captured in a CUDA graph, replayed with new lengths."""

from __future__ import annotations

import math
import os
import re
import types
from concurrent.futures import ProcessPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _decode as dk
from kaio_ops import _plan, decode
from tests.poison import poison_allocations

BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates (outputs, partial results, stats) starts as NaN."""
    poison_allocations(monkeypatch)


# --------------------------------------------------------------------------- reference


def gathered(k_cache, v_cache, seq_lens, block_table):
    """Each sequence's keys and values [Hkv, L, D] in float64, read from the cache."""
    out = []
    for b, n in enumerate(seq_lens):
        if block_table is None:
            out.append((k_cache[b, :, :n], v_cache[b, :, :n]))
        else:
            pos = np.arange(n)
            ps = k_cache.shape[1]
            pages, slots = block_table[b, pos // ps], pos % ps
            out.append(tuple(np.swapaxes(c[pages, slots], 0, 1) for c in (k_cache, v_cache)))
    return [(k.astype(np.float64), v.astype(np.float64)) for k, v in out]


def reference(q, k_cache, v_cache, seq_lens, block_table=None, scale=None):
    """(out, lse) in float64: new token i of sequence b at position L - Sq + i sees keys
    0 .. L - Sq + i; no key gives zeros and -inf."""
    b_, h_, sq, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b_, h_, sq, d))
    lse = np.full((b_, h_, sq), -np.inf)
    for b, (k, v) in enumerate(gathered(k_cache, v_cache, seq_lens, block_table)):
        group = h_ // k.shape[0]
        for h in range(h_):
            for i in range(sq):
                visible = seq_lens[b] - sq + i + 1
                if visible <= 0:
                    continue
                s = k[h // group, :visible] @ q[b, h, i].astype(np.float64) * scale
                e = np.exp(s - s.max())
                out[b, h, i] = e @ v[h // group, :visible] / e.sum()
                lse[b, h, i] = s.max() + np.log(e.sum())
    return out, lse


def make_cache(rng, batch, kv_heads, d, capacity, dtype, page_size=None):
    """(k_cache, v_cache, block_table) of random values: contiguous [B, Hkv, capacity, D], or
    paged with ``page_size`` and each sequence's pages shuffled through a pool with spares."""
    if page_size is None:
        shape = (batch, kv_heads, capacity, d)
        return (*(rng.standard_normal(shape).astype(dtype) for _ in range(2)), None)
    max_pages = -(-capacity // page_size)
    pages = batch * max_pages + 3
    shape = (pages, page_size, kv_heads, d)
    table = rng.permutation(pages)[: batch * max_pages].reshape(batch, max_pages)
    return (*(rng.standard_normal(shape).astype(dtype) for _ in range(2)), table.astype(np.int32))


def poison_past_lengths(caches, lens, table=None, page_size=None):
    """Each cache's positions at or past each sequence's length set to NaN (a kernel that
    reads one shows it), in either layout."""
    for cache in caches:
        for i, n in enumerate(lens):
            capacity = cache.shape[2] if table is None else table.shape[1] * page_size
            for pos in range(n, capacity):
                if table is None:
                    cache[i, :, pos] = np.nan
                else:
                    cache[table[i, pos // page_size], pos % page_size] = np.nan


# --------------------------------------------------------------------------- simulator


@pytest.mark.parametrize(
    "lens, h, hkv, sq, d, dtype, page_size, capacity",
    [
        ((70,), 4, 1, 1, 64, np.float16, None, 100),  # MQA-like group of 4, a partial tile
        ((0, 1, 16, 33), 8, 8, 1, 64, BF16, 16, 48),  # ratio 1; length 0, 1, a page boundary
        ((37, 128), 8, 1, 3, 64, np.float16, 32, 128),  # ratio 8, Sq 3: two M-tiles
        ((64,), 8, 1, 16, 64, BF16, None, 64),  # ratio 8, Sq 16: 128 rows, one split (direct)
        ((2, 95), 4, 4, 16, 64, np.float16, 16, 96),  # Sq 16 over a length of 2
        ((31,), 8, 2, 5, 128, BF16, 64, 64),  # D 128, ratio 4, one page
        ((70,), 2, 2, 2, 256, np.float16, None, 80),  # D 256
    ],
)
def test_decode_in_simulator(lens, h, hkv, sq, d, dtype, page_size, capacity):
    rng = np.random.default_rng(sum(lens) + h + sq + d)
    b = len(lens)
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, dtype, page_size)
    seq_lens = np.array(lens, np.int32)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(q, k_cache, v_cache, seq_lens, table)
        again = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    ref, ref_lse = reference(q, k_cache, v_cache, lens, table)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (b, h, sq)
    assert np.array_equal(out, again, equal_nan=True)
    out = out.astype(np.float64)
    assert np.isfinite(out).all(), "an element was not written"
    # P is rounded to 16 bits for the tensor cores
    tol = 4e-3 if dtype == np.float16 else 3e-2
    assert np.abs(out - ref).max() < tol
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse))
    seen = np.isfinite(ref_lse)
    assert np.abs(lse[seen] - ref_lse[seen]).max() < 1e-4
    assert (out[~seen] == 0).all()


@pytest.mark.parametrize("merge", ["fused", "kernel", "cluster"])
def test_decode_scale_and_splits(monkeypatch, merge):
    # a scale; several splits merged by the last block of each row chunk (fused: its
    # counters are back to 0 afterwards, ready for the next call), by the separate merge
    # kernel (what runs where no counters are at hand) or through a cluster's shared memory
    counters = np.zeros(64, np.uint32)
    monkeypatch.setattr(decode, "_counters", lambda *_: counters if merge == "fused" else None)
    monkeypatch.setattr(decode, "CLUSTER_MERGE", merge == "cluster")
    monkeypatch.setattr(decode, "splits_for", lambda *_: 4 if merge == "cluster" else 3)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 2, 64)).astype(np.float16)
    k_cache, v_cache, _ = make_cache(rng, 1, 4, 64, 300, np.float16)
    seq_lens = np.array([257], np.int32)
    with kaio.simulate():
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, scale=0.2)
        again = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, scale=0.2)
    assert not counters.any()
    assert np.array_equal(out, again)
    ref = reference(q, k_cache, v_cache, [257], scale=0.2)[0]
    assert np.abs(out.astype(np.float64) - ref).max() < 4e-3


@pytest.mark.parametrize("merge", ["fused", "kernel", "cluster"])
def test_decode_merge_of_many_splits_and_rows(monkeypatch, merge):
    # 40 splits (past one warp's lanes, not a multiple of the merge's unrolling; the last
    # ones past the length hold no key) over 40 query rows (group 8 x Sq 5: four M-tiles,
    # more rows than warps); without the fused merge, 3 K/V stages (the grid of a full GPU);
    # through a cluster, its largest size (16 splits, several elements a thread)
    splits = 16 if merge == "cluster" else 40
    monkeypatch.setattr(decode, "splits_for", lambda *_: splits)
    monkeypatch.setattr(decode, "CLUSTER_MERGE", merge == "cluster")
    if merge == "kernel":
        monkeypatch.setattr(decode, "deep_stages", decode.stages_for)
        monkeypatch.setattr(decode, "_counters", lambda *_: None)
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 8, 5, 64)).astype(np.float16)
    k_cache, v_cache, _ = make_cache(rng, 1, 1, 64, splits * 64, np.float16)
    seq_lens = np.array([(splits - 7) * 64 + 5], np.int32)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(q, k_cache, v_cache, seq_lens)
    ref, ref_lse = reference(q, k_cache, v_cache, list(seq_lens))
    assert np.abs(out.astype(np.float64) - ref).max() < 4e-3
    assert np.abs(lse - ref_lse).max() < 1e-4


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_append_then_decode_in_simulator(page_size, dtype):
    rng = np.random.default_rng(5)
    b, hkv, sq, d, h = 3, 2, 4, 64, 4
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, 48, dtype, page_size)
    before = [c.copy() for c in (k_cache, v_cache)]
    k, v = (rng.standard_normal((b, hkv, sq, d)).astype(dtype) for _ in range(2))
    lens = np.array([4, 19, 48], np.int32)  # from position 0, across a page, to the end
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    with kaio.simulate():
        assert kaio_ops.kv_cache_append(k_cache, v_cache, k, v, lens, table) is None
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, lens, table)
    # the expected cache: the old one with the new rows written where the reference says
    want = [c.copy() for c in before]
    for bi, n in enumerate(lens):
        for j in range(sq):
            pos = n - sq + j
            for cache, new in zip(want, (k, v), strict=True):
                if table is None:
                    cache[bi, :, pos] = new[bi, :, j]
                else:
                    cache[table[bi, pos // 16], pos % 16] = new[bi, :, j]
    for got, w in zip((k_cache, v_cache), want, strict=True):
        assert np.array_equal(got.view(np.uint16), w.view(np.uint16))
    ref = reference(q, *want, lens, table)[0]
    assert np.abs(out.astype(np.float64) - ref).max() < (4e-3 if dtype == np.float16 else 3e-2)


@pytest.mark.parametrize("splits, window", [(1, True), (2, True), (2, False)])
def test_paged_window_moves_over_many_pages_in_simulator(monkeypatch, splits, window):
    # the block table read through a window of 64 entries held across a warp's lanes: one
    # split over 69 pages of 16 keys moves it twice (at pages 32 and 64), a second split
    # starts mid-table; a length ending on the window's boundary (512 keys = 32 pages);
    # without the window (PAGE_WINDOW off), a load per row a tile ahead
    monkeypatch.setattr(decode, "splits_for", lambda *_: splits)
    monkeypatch.setattr(decode, "PAGE_WINDOW", window)
    monkeypatch.setattr(decode, "CLUSTER_MERGE", False)
    rng = np.random.default_rng(9 + splits)
    q = rng.standard_normal((2, 2, 1, 64)).astype(np.float16)
    k_cache, v_cache, table = make_cache(rng, 2, 1, 64, 1100, np.float16, 16)
    lens = np.array([1090, 512], np.int32)
    with kaio.simulate():
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, lens, table)
    ref = reference(q, k_cache, v_cache, list(lens), table)[0]
    assert np.abs(out.astype(np.float64) - ref).max() < 4e-3


@pytest.mark.parametrize("page_size", [None, 16])
def test_one_split_copies_before_the_length_in_simulator(monkeypatch, page_size):
    # one split, the first three tiles copied before the length is read (SPEC: shipped for
    # paged caches, forced here for both); rows past each length hold NaN (an unwritten
    # cache), which must not reach the output
    monkeypatch.setattr(decode, "splits_for", lambda *_: 1)
    monkeypatch.setattr(decode, "speculates", lambda paged, splits=1: 1)
    rng = np.random.default_rng(12)
    lens = [0, 1, 63, 64, 65, 130, 250]
    b, hkv, d = len(lens), 1, 64
    q = rng.standard_normal((b, 4, 1, d)).astype(np.float16)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, 256, np.float16, page_size)
    for cache in (k_cache, v_cache):
        for i, n in enumerate(lens):
            for pos in range(n, 256):
                if page_size is None:
                    cache[i, :, pos] = np.nan
                else:
                    cache[table[i, pos // page_size], pos % page_size] = np.nan
    with kaio.simulate():
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, np.array(lens, np.int32), table)
    ref = reference(q, k_cache, v_cache, lens, table)[0]
    assert np.isfinite(out.astype(np.float64)).all()
    assert np.abs(out.astype(np.float64) - ref).max() < 4e-3


@pytest.mark.parametrize("merge", ["fused", "cluster"])
def test_splits_copy_before_the_length_in_simulator(monkeypatch, merge):
    # several splits over a contiguous cache, each taking every 5th key tile from its own,
    # the first ones copied before the length is read (SPLIT_SPEC); rows past each length
    # hold NaN, which must not reach the output. Lengths: 0, a tile and one (splits with no
    # tile), a partial last tile, the capacity; Sq 2
    monkeypatch.setattr(decode, "SPLIT_SPEC", True)
    monkeypatch.setattr(decode, "CLUSTER_MERGE", merge == "cluster")
    monkeypatch.setattr(decode, "splits_for", lambda *_: 5)
    counters = np.zeros(64, np.uint32)
    monkeypatch.setattr(decode, "_counters", lambda *_: counters)
    rng = np.random.default_rng(13)
    lens = [0, 65, 517, 640]
    b, hkv, d, capacity = len(lens), 1, 64, 640
    q = rng.standard_normal((b, 4, 2, d)).astype(np.float16)
    k_cache, v_cache, _ = make_cache(rng, b, hkv, d, capacity, np.float16)
    for cache in (k_cache, v_cache):
        for i, n in enumerate(lens):
            cache[i, :, n:] = np.nan
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(
            q, k_cache, v_cache, np.array(lens, np.int32)
        )
    ref, ref_lse = reference(q, k_cache, v_cache, lens)
    assert np.isfinite(out.astype(np.float64)).all() and not counters.any()
    assert np.abs(out.astype(np.float64) - ref).max() < 4e-3
    seen = np.isfinite(ref_lse)
    assert np.array_equal(seen, np.isfinite(lse))
    assert np.abs(lse[seen] - ref_lse[seen]).max() < 1e-4


class _Launches:
    """A kernel stand-in that records each launch's constexprs and passes it on."""

    def __init__(self, kernel):
        self.kernel, self.constexprs = kernel, []

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, config):
        launch = self.kernel[config]

        def run(*args, **constexprs):
            self.constexprs.append(constexprs)
            return launch(*args, **constexprs)

        return run


class _Planned(_Launches):
    """A kernel stand-in that records each launch's constexprs and launches nothing."""

    def __getitem__(self, config):
        return lambda *args, **constexprs: self.constexprs.append(constexprs)


@pytest.mark.parametrize("peak", [3.35e12, 4.8e12])  # H100, H200
def test_long_walk_route_by_memory(monkeypatch, peak):
    # the suite's paged one-split grids (H 32, Hkv 8, D 128, pages of 16, one new token)
    # from LONG_KEYS (32k) keys on memory of at least LONG_BANDWIDTH (an H200): 3 K/V
    # stages in one wave (B16), each warp on its own keys in two (B64); under them, or on
    # an H100, main's route (4 stages and OWN in one wave, 3 stages and SYNC1 in two);
    # launches checked without running them
    monkeypatch.setattr(decode, "DECODE", spy := _Planned(decode.DECODE))
    monkeypatch.setattr(decode, "memory_bandwidth", lambda _: peak)
    fast = peak >= decode.LONG_BANDWIDTH
    pool = np.zeros((1, 16, 8, 128), np.float16)  # (every table entry names page 0)
    for b, keys, stages, own in (
        (16, 32768, 3 if fast else 4, 1),
        (64, 32768, 3, int(fast)),
        (16, 16384, 4, 1),
        (64, 16384, 3, 0),
    ):
        q = np.zeros((b, 32, 1, 128), np.float16)
        lens = np.full(b, keys, np.int32)
        table = np.zeros((b, keys // 16), np.int32)
        with kaio.simulate():
            decode._decode("route", q, pool, pool, lens, table, None)
        c = spy.constexprs.pop()
        flags = (c["STAGES"], c["OWN"], c["SYNC1"], c["SORT"], c["PDL"], c["DIRECT"])
        assert flags == (stages, own, 1 - own, 0, 0, True), (b, keys)
    assert not spy.constexprs


@pytest.mark.parametrize(
    "merge, page_size, sq, d, dtype, stages",
    [
        ("direct", 16, 1, 128, np.float16, 4),  # the suite's group of 4 heads: OWN
        ("direct", 16, 2, 64, BF16, 3),  # 8 rows: OWN at 3 stages
        ("direct", None, 2, 64, BF16, 3),  # SYNC1
        ("fused", 16, 2, 64, np.float16, 3),  # SYNC1
        ("cluster", None, 1, 128, BF16, 3),  # OWN in a cluster grid
    ],
)
def test_keys_in_m_and_the_barriers_in_simulator(
    monkeypatch, merge, page_size, sq, d, dtype, stages
):
    # decode_fwd with the keys in the mma's M dimension (SWAP: a group of 4 heads x Sq 1
    # or 2) and one barrier a key tile (SYNC1) or none (OWN: each warp copies and waits
    # for its own keys; a paged cache, one split, or a cluster merge), against float64 and
    # the race checker: one split with its first copies before the length, or several
    # merged; rows past each length hold NaN, which must not reach the output
    monkeypatch.setattr(decode, "DECODE", spy := _Launches(decode.DECODE))
    monkeypatch.setattr(decode, "splits_for", lambda *_: 1 if merge == "direct" else 3)
    monkeypatch.setattr(decode, "CLUSTER_MERGE", merge == "cluster")
    monkeypatch.setattr(decode, "OWN_CLUSTER_TILES", 3)  # (OWN in the cluster grid: 3 tiles)
    monkeypatch.setattr(decode, "one_split_stages", lambda *_: stages)
    monkeypatch.setattr(decode, "deep_stages", lambda *_: stages)
    monkeypatch.setattr(decode, "speculates", lambda paged, splits=1: int(splits == 1))
    counters = np.zeros(64, np.uint32)
    monkeypatch.setattr(decode, "_counters", lambda *_: counters)
    rng = np.random.default_rng(14)
    lens = [0, 1, 63, 65, 300]
    b, hkv, capacity = len(lens), 2, 320
    q = rng.standard_normal((b, 8, sq, d)).astype(dtype)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, dtype, page_size)
    poison_past_lengths((k_cache, v_cache), lens, table, page_size)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(
            q, k_cache, v_cache, np.array(lens, np.int32), table
        )
    own = int(page_size is not None and merge == "direct" or merge == "cluster")
    assert [(c["SWAP"], c["SYNC1"], c["OWN"]) for c in spy.constexprs] == [(1, 1 - own, own)]
    ref, ref_lse = reference(q, k_cache, v_cache, lens, table)
    out = out.astype(np.float64)
    assert np.isfinite(out).all() and not counters.any()
    assert np.abs(out - ref).max() < (4e-3 if dtype == np.float16 else 3e-2)
    seen = np.isfinite(ref_lse)
    assert np.array_equal(seen, np.isfinite(lse))
    assert np.abs(lse[seen] - ref_lse[seen]).max() < 1e-4


@kaio.gpu_kernel(block_size=128)
def sort_probe(src: kaio.u32[:], dst: kaio.u32[:], N: kaio.constexpr):
    """``_decode.sort_keys`` of src's N keys into dst."""
    lane = kaio.lane_id()
    warp = kaio.thread_idx_x() // 32
    buf = kaio.shared(kaio.u32, (N,))
    key = kaio.local(kaio.u32, N // 128)
    for r in kaio.static_range(N // 128):
        key[r] = src[warp * (N // 4) + 32 * r + lane]
    dk.sort_keys(key, buf, lane, warp, N)
    kaio.sync_threads()
    for r in kaio.static_range(N // 128):
        dst[warp * (N // 4) + 32 * r + lane] = buf[warp * (N // 4) + 32 * r + lane]


@pytest.mark.parametrize("n", [128, 256, 512])
def test_sort_keys_in_simulator(n):
    # the bitonic network over a block: pairs by shuffles, within a thread (256, 512: 2, 4
    # keys a thread; 128 and 256 are the routed SORT sizes) and across warps; random keys
    # with repeats and the padding key among them
    rng = np.random.default_rng(n)
    src = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    src[: n // 8] = dk.PAD
    src[n // 8 : n // 4] = src[n // 4 : 3 * n // 8]
    rng.shuffle(src)
    dst = np.full(n, 7, np.uint32)
    with kaio.simulate():
        sort_probe[1, 128](src, dst, N=n)
    assert np.array_equal(dst, np.sort(src))


def test_programmatic_dependent_launch_route(monkeypatch):
    # PDL in a grid of one split over a paged cache of up to 4k keys, on sm_90 (and in the
    # simulator, no GPU: planned as sm_90 of an H100's memory, its wait, trigger and
    # prefetches doing nothing): one wave (with the L2 prefetch where the memory is slower
    # than PDL_PREFETCH_BANDWIDTH, else without it up to PDL_FAST_KEYS keys), or several
    # where the memory is slower than PDL_WAVES_BANDWIDTH
    like = types.SimpleNamespace(device=None)
    paged = types.SimpleNamespace(paged=True, capacity=4096)
    short = types.SimpleNamespace(paged=True, capacity=decode.PDL_FAST_KEYS)
    assert decode.pdls(like, paged, direct=True, alone=True) == 1
    assert decode.pdls(like, short, direct=True, alone=True) == 1
    assert decode.pdls(like, paged, direct=True, alone=False) == 1  # (as an H100)
    assert decode.pdls(like, paged, direct=False, alone=False) == 0
    monkeypatch.setattr(decode, "memory_bandwidth", lambda _: 4.8e12)  # an H200
    assert decode.pdls(like, paged, direct=True, alone=False) == 0
    assert decode.pdls(like, short, direct=True, alone=True) == 2
    assert decode.pdls(like, paged, direct=True, alone=True) == 0  # (over PDL_FAST_KEYS)
    for other in ({"capacity": 8192}, {"paged": False}):
        changed = types.SimpleNamespace(**{**vars(paged), **other})
        assert decode.pdls(like, changed, True, True) == 0
    monkeypatch.setattr(decode, "PDL", False)
    assert decode.pdls(like, paged, direct=True, alone=True) == 0
    shipped = [c for k, c in decode.shipped() if k is decode.DECODE]
    assert {c["PDL"] for c in shipped if c["DIRECT"] and c["PAGED"]} == {0, 1, 2}
    assert {c["PDL"] for c in shipped if not (c["DIRECT"] and c["PAGED"])} == {0}


def test_sorted_walk_route():
    # SORT: one split over pages of 16, from 128 pages a sequence (64 in a grid of one
    # wave), a power of two of slots
    assert decode.sorts(True, 1, 256, 16) == 256
    assert decode.sorts(True, 1, 128, 16) == 128
    assert decode.sorts(True, 1, 2048, 16) == 0 and decode.SORT_MAX_PAGES == 256
    assert decode.sorts(True, 1, 64, 16) == decode.sorts(True, 1, 256, 32) == 0
    assert decode.sorts(True, 1, 64, 16, alone=True) == 128
    assert decode.sorts(True, 1, 32, 16, alone=True) == 0
    assert decode.sorts(True, 2, 256, 16) == decode.sorts(False, 1, 0, 0) == 0
    launched = [c["SORT"] for k, c in decode.shipped() if k is decode.DECODE]
    assert sorted(set(launched)) == [0, 128, 256]


@pytest.mark.parametrize("peak, pdl", [(3.35e12, 1), (4.8e12, 2)])  # H100, H200
def test_programmatic_dependent_launch_in_simulator(monkeypatch, peak, pdl):
    # one split in one wave over a paged cache of 1k keys (SORT 128): PDL 1 (the L2
    # prefetch before the wait) on an H100's memory, PDL 2 (none) on an H200's, against
    # float64 with the race checker; lengths 0, 1, a page boundary, the capacity, rows past
    # each length poisoned
    monkeypatch.setattr(decode, "DECODE", spy := _Launches(decode.DECODE))
    monkeypatch.setattr(decode, "memory_bandwidth", lambda _: peak)
    monkeypatch.setattr(decode, "splits_for", lambda *_: 1)  # (as B16 over 8 K/V heads)
    rng = np.random.default_rng(34)
    lens = [0, 1, 16, 700, 1024]
    b, hkv, d, capacity = len(lens), 2, 64, 1024
    q = rng.standard_normal((b, 8, 1, d)).astype(np.float16)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, np.float16, 16)
    poison_past_lengths((k_cache, v_cache), lens, table, 16)
    with kaio.simulate():
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, np.array(lens, np.int32), table)
    assert [(c["PDL"], c["SORT"], c["DIRECT"]) for c in spy.constexprs] == [(pdl, 128, True)]
    ref, _ = reference(q, k_cache, v_cache, lens, table)
    out = out.astype(np.float64)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < 4e-3


@pytest.mark.parametrize("own, sq, stages, page_size", [(1, 1, 4, 16), (0, 2, 3, 32)])
def test_sorted_pages_in_simulator(monkeypatch, own, sq, stages, page_size):
    # one split over a paged cache whose table slots after the first copies are visited in
    # pool order where every new token sees their keys (SORT), each warp on its own keys
    # (OWN) or the block's rows (one barrier a tile, SYNC1), against float64 and the race
    # checker; lengths 0, 1, under the first copies, a page boundary, past the sorted slots
    # (SORT 128 of 15 + 128 pages), rows past each length NaN
    monkeypatch.setattr(decode, "DECODE", spy := _Launches(decode.DECODE))
    monkeypatch.setattr(decode, "splits_for", lambda *_: 1)
    monkeypatch.setattr(decode, "one_split_stages", lambda *_: stages)
    monkeypatch.setattr(decode, "owns", lambda *_: own)
    monkeypatch.setattr(decode, "sorts", lambda paged, splits, *_: 128 if paged else 0)
    rng = np.random.default_rng(15)
    lens = [0, 1, 150, 257, 4000]
    b, hkv, d, capacity = len(lens), 1, 64, 4096
    q = rng.standard_normal((b, 4, sq, d)).astype(np.float16)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, np.float16, page_size)
    poison_past_lengths((k_cache, v_cache), lens, table, page_size)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(
            q, k_cache, v_cache, np.array(lens, np.int32), table
        )
    assert [(c["SORT"], c["OWN"], c["SYNC1"]) for c in spy.constexprs] == [(128, own, 1 - own)]
    ref, ref_lse = reference(q, k_cache, v_cache, lens, table)
    out = out.astype(np.float64)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < 4e-3
    seen = np.isfinite(ref_lse)
    assert np.array_equal(seen, np.isfinite(lse))
    assert np.abs(lse[seen] - ref_lse[seen]).max() < 1e-4


@pytest.mark.parametrize(
    "lens, h, hkv, sq, d, dtype, page_size, splits, spec",
    [
        ((0, 1, 16, 33), 8, 8, 1, 64, BF16, 16, 1, 1),  # ratio 1; 0, 1, a page boundary
        ((0, 1, 16, 33), 8, 8, 1, 64, BF16, 16, 1, 0),  # the same, splits of the length
        ((37, 128), 32, 4, 2, 64, np.float16, 32, 3, 0),  # ratio 8, Sq 2: 16 rows a warp
        ((2, 95, 48), 16, 4, 4, 64, np.float16, 16, 2, 1),  # ratio 4, Sq 4 over a length of 2
        ((17, 64, 250), 8, 8, 16, 64, BF16, 16, 5, 1),  # ratio 1, Sq 16; splits past a length
        ((17, 64, 250), 8, 8, 16, 64, BF16, 16, 10, 0),  # more splits than the merge prefetches
        ((31, 70), 32, 8, 1, 128, np.float16, 64, 2, 1),  # the suite's heads, D 128, pages of 64
    ],
)
def test_whole_page_blocks_in_simulator(
    monkeypatch, lens, h, hkv, sq, d, dtype, page_size, splits, spec
):
    # decode_pages (a block a key split and sequence over all K/V heads, reading whole
    # pages; not routed by default), forced at any batch, splitting the capacity (spec: the
    # first copies before the length is read) or the length, several splits merged by
    # decode_merge; rows past each length hold NaN (an unwritten cache), which must not
    # reach the output
    monkeypatch.setattr(decode, "PAGE_MIN_BATCH", 1)
    monkeypatch.setattr(decode, "PAGE_SPEC", bool(spec))
    monkeypatch.setattr(decode, "WHOLE_PAGES", True)
    monkeypatch.setattr(decode, "page_splits", lambda *_: splits)
    monkeypatch.setattr(decode, "PAGES", spy := _Spy(decode.PAGES))
    rng = np.random.default_rng(sum(lens) + h + sq)
    b = len(lens)
    capacity = -(-max(lens) // page_size) * page_size
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, dtype, page_size)
    poison_past_lengths((k_cache, v_cache), lens, table, page_size)
    seq_lens = np.array(lens, np.int32)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(q, k_cache, v_cache, seq_lens, table)
        again = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    assert spy.calls == 2
    assert np.array_equal(out, again)
    ref, ref_lse = reference(q, k_cache, v_cache, lens, table)
    out = out.astype(np.float64)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < (4e-3 if dtype == np.float16 else 3e-2)
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse))
    seen = np.isfinite(ref_lse)
    assert np.abs(lse[seen] - ref_lse[seen]).max() < 1e-4
    assert (out[~seen] == 0).all()


class _Spy:
    """A kernel stand-in that counts its launches and passes them on."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __getitem__(self, config):
        self.calls += 1
        return self.kernel[config]


def test_whole_page_blocks_route_and_plan(monkeypatch):
    # off by default (measured no faster); switched on, the suite's paged caches from batch
    # 8 (Hkv 8, D 128, one new token) take decode_pages, a block a multiprocessor over the
    # batch; contiguous caches, batch 1 and groups of more than 16 query rows do not
    assert not decode.WHOLE_PAGES
    monkeypatch.setattr(decode, "WHOLE_PAGES", True)
    with kaio.simulate():
        inputs = decode._arrays.Inputs("test")
        cache = decode._Cache(inputs, PAGES_8, PAGES_8, TABLE_16, 16, 128, kaio.f16)
        assert decode.uses_pages(cache, 16, 4, 1, 128)
        assert not decode.uses_pages(cache, 1, 4, 1, 128)
        assert not decode.uses_pages(cache, 16, 4, 5, 128)  # 20 rows
        contiguous = decode._Cache(inputs, KC_8, KC_8, None, 16, 128, kaio.f16)
        assert not decode.uses_pages(contiguous, 16, 4, 1, 128)
    assert decode.page_splits(16, 4096 // 16, 132) == 8
    assert decode.page_splits(64, 4096 // 16, 132) == 2
    assert decode.page_splits(256, 4096 // 16, 132) == 1
    assert decode.page_splits(16, 8, 132) == 2  # at least 4 tiles a split
    assert decode.page_shared(8, 128, 3) == 192 * 1024


PAGES_8 = np.zeros((16, 16, 8, 128), np.float16)
TABLE_16 = np.zeros((16, 1), np.int32)
KC_8 = np.zeros((16, 8, 16, 128), np.float16)


def test_bad_block_table_stays_inside_the_cache_in_simulator(monkeypatch):
    # what the GPU only sees (the table's values; a graph replayed after the table was
    # freed and its memory reused): pages outside the pool are read as the last page and
    # never written, instead of an access outside the cache (the simulator would raise)
    monkeypatch.setattr(decode, "_host_check", lambda *_: None)
    rng = np.random.default_rng(8)
    k_cache, v_cache, table = make_cache(rng, 2, 2, 64, 64, np.float16, 16)
    table[1] = [10**6, -5, 2**31 - 1, len(k_cache)]
    lens = np.array([50, 64], np.int32)
    q = rng.standard_normal((2, 4, 1, 64)).astype(np.float16)
    k, v = (rng.standard_normal((2, 2, 1, 64)).astype(np.float16) for _ in range(2))
    before = [c.copy() for c in (k_cache, v_cache)]
    with kaio.simulate():
        kaio_ops.kv_cache_append(k_cache, v_cache, k, v, lens, table)
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, lens, table)
    changed = np.flatnonzero((k_cache != before[0]).any(axis=(1, 2, 3)))
    assert list(changed) == [table[0, 49 // 16]]  # sequence 0's new row only
    ref = reference(q[:1], k_cache, v_cache, lens[:1], table[:1])[0]
    assert np.abs(out[:1].astype(np.float64) - ref).max() < 4e-3
    assert np.isfinite(out.astype(np.float64)).all()


def test_append_unaligned_head_dim_and_short_length_in_simulator():
    # D = 12: the scalar path; a length under Sq skips the positions before 0
    rng = np.random.default_rng(6)
    k_cache = rng.standard_normal((2, 1, 8, 12)).astype(np.float16)
    v_cache = k_cache.copy()
    k, v = (rng.standard_normal((2, 1, 3, 12)).astype(np.float16) for _ in range(2))
    before = k_cache.copy()
    with kaio.simulate():
        kaio_ops.kv_cache_append(k_cache, v_cache, k, v, np.array([2, 8], np.int32))
    assert np.array_equal(k_cache[0, 0, :2], k[0, 0, 1:]) and np.array_equal(
        v_cache[1, 0, 5:], v[1, 0]
    )
    assert np.array_equal(k_cache[0, 0, 2:], before[0, 0, 2:])
    assert np.array_equal(k_cache[1, 0, :5], before[1, 0, :5])


def test_split_heuristic_fills_the_gpu():
    # Llama-3-8B at batch 1 (8 K/V heads): the blocks cover the GPU about once, at most one
    # a multiprocessor (measured fastest on an H200: 16 splits of 4 tiles at 4096 keys, 8
    # of 2 at 1024, the merge's cost growing with the splits)
    assert decode.splits_for(8, 4096 // 64, 132) == 16
    assert decode.splits_for(8, 32768 // 64, 132) == 16
    assert decode.splits_for(8, 1024 // 64, 132) == 8
    assert decode.splits_for(4 * 8, 4096 // 64, 132) == 4
    # a batch that streams at the memory's speed with one block per sequence and head: no
    # split (the merge would only add to it)
    assert decode.splits_for(16 * 8, 1024 // 64, 132) == 1
    assert decode.splits_for(64 * 8, 4096 // 64, 132) == 1
    assert decode.splits_for(8, 1, 132) == 1  # one tile: one split


def test_cluster_merge_takes_short_splits_one_block_a_multiprocessor(monkeypatch):
    # in the simulator every cluster is resident: B = 1 at 4k and 1k keys merge through
    # clusters (16 and 8 splits, four K/V stages, shared memory over half a multiprocessor);
    # splits of more than 64 tiles and grids of more than a block a multiprocessor do not
    q = np.zeros((1, 32, 1, 128), np.float16)
    with kaio.simulate():
        qa = decode._arrays.Inputs("test").array(q, "q", ndim=4, dtypes=(kaio.f16,), form="q")
        plan = lambda blocks, tiles: decode.plan_grid(  # noqa: E731
            qa, decode.DECODE, blocks, tiles, 128, 1, False
        )
        assert plan(8, 64)[:3] == (16, 4, 16) and plan(8, 64)[3] >= decode.SPREAD
        assert plan(8, 16)[:3] == (8, 4, 8)
        assert plan(8, 512)[2] == 16
        assert plan(8, 16 * 128)[2] == 1  # splits of 128 tiles: the global merge
        assert plan(128, 64)[:3] == (1, 2, 1)  # contiguous, one split: 2 stages
        paged = lambda blocks, tiles: decode.plan_grid(  # noqa: E731
            qa, decode.DECODE, blocks, tiles, 128, 1, True
        )
        assert paged(128, 64)[:3] == (1, 4, 1)
        # paged: splits of up to 16 tiles through a cluster, longer ones the global merge
        assert paged(8, 64)[2] > 1 and paged(8, 512)[:3] == (16, 4, 1)
    # with the bandwidth rule on (decode.CLUSTER_BANDWIDTH, off by default): on a GPU whose
    # memory outruns a cluster's SMs (an H200's 4.9 TB/s; an H100's 3.35 do not), splits of
    # over 16 tiles take every SM: the global merge
    monkeypatch.setattr(decode, "CLUSTER_BANDWIDTH", True)
    for peak, long_cl in ((4.9e12, 1), (3.35e12, 8)):
        monkeypatch.setattr(decode, "memory_bandwidth", lambda _, p=peak: p)
        monkeypatch.setattr(decode, "CLUSTERS", (2, 4, 8))
        with kaio.simulate():
            assert plan(8, 512)[:3] == ((16, 4, 1) if long_cl == 1 else (8, 4, 8))
            assert plan(8, 128)[2] == 8 and plan(8, 64)[2] == 8  # 16 and 8 tiles a split


# --------------------------------------------------------------------------- input checks


def _h(*shape, dtype=np.float16):
    return np.ones(shape, dtype)


def _lens(*values):
    return np.array(values, np.int32)


Q = _h(2, 8, 1, 64)
KC = _h(2, 2, 32, 64)
PAGES = _h(6, 16, 2, 64)
TABLE = np.arange(6, dtype=np.int32).reshape(2, 3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kaio_ops.flash_attention_decode(Q, KC, KC, _lens(3, 33)), "seq_lens\\[1\\] = 33"),
        (lambda: kaio_ops.flash_attention_decode(Q, KC, KC, _lens(-1, 3)), "seq_lens\\[0\\] = -1"),
        (
            lambda: kaio_ops.flash_attention_decode(Q, PAGES, PAGES, _lens(3, 49), TABLE),
            "seq_lens\\[1\\] = 49, outside 0 .. 48",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(Q, PAGES, PAGES, _lens(3, 4), TABLE[:1]),
            "'block_table' must have shape \\[B = 2",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(Q, PAGES, PAGES, _lens(3, 20), TABLE + 4),
            "'block_table' row 1 names pages outside 0 .. 5",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(
                Q, _h(2, 3, 32, 64), _h(2, 3, 32, 64), _lens(1, 1)
            ),
            "Hkv = 3 heads, which must divide q's H = 8",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(
                Q, KC, _h(2, 2, 32, 64, dtype=BF16), _lens(1, 1)
            ),
            "'v_cache' must be a 4-D array .* of f16, got dtype bf16",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(
                _h(2, 8, 1, 64, dtype=np.float32), KC, KC, _lens(1, 1)
            ),
            "'q' must be a 4-D array .* of f16 or bf16, got dtype f32",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(Q, KC, KC, np.array([1, 1], np.int64)),
            "'seq_lens' must be a 1-D array \\[B\\] of i32, got dtype i64",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(Q, KC, KC, _lens(1)),
            "'seq_lens' must have shape",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(_h(2, 8, 17, 64), KC, KC, _lens(20, 20)),
            "Sq = 17 new tokens",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(_h(2, 8, 1, 96), KC, KC, _lens(1, 1)),
            "head dim D = 96",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(
                Q, _h(2, 2, 32, 128), _h(2, 2, 32, 128), _lens(1, 1)
            ),
            "'k_cache' must have head dim D = 64",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(
                Q, _h(3, 2, 32, 64), _h(3, 2, 32, 64), _lens(1, 1)
            ),
            "'k_cache' must have batch B = 2",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(
                Q, _h(6, 8, 2, 64), _h(6, 8, 2, 64), _lens(1, 1), TABLE
            ),
            "page_size 8",
        ),
        (
            lambda: kaio_ops.flash_attention_decode(Q, KC, KC, _lens(1, 1), scale=0.0),
            "scale must be a positive",
        ),
        (
            lambda: kaio_ops.kv_cache_append(KC, KC, _h(2, 4, 1, 64), _h(2, 4, 1, 64), _lens(1, 1)),
            "'k_cache' has Hkv = 2 heads; k has 4",
        ),
        (
            lambda: kaio_ops.kv_cache_append(
                KC, KC, _h(2, 2, 1, 64), _h(2, 2, 1, 64), _lens(1, 40)
            ),
            "seq_lens\\[1\\] = 40",
        ),
        (
            lambda: kaio_ops.kv_cache_append(
                KC, _h(2, 2, 32, 64, dtype=BF16), _h(2, 2, 1, 64), _h(2, 2, 1, 64), _lens(1, 1)
            ),
            "'v_cache' must be",
        ),
    ],
)
def test_bad_inputs_raise_before_launch(call, message):
    with kaio.simulate(), pytest.raises(ValueError, match=message):
        call()


def test_folded_walk_route():
    # two sequences a block: paged in pages of 16, 4 query rows a K/V group, D 128, more
    # than two blocks a multiprocessor, tables of 128 to 512 pages
    cache = types.SimpleNamespace(paged=True, page_size=16, max_pages=256, kv_heads=8)
    assert decode.folds(cache, 64, 4, 128, 132) == 2 and decode.FOLD_PAIR >= 64
    assert decode.folds(cache, 34, 4, 128, 132) == 2  # 272 blocks
    assert decode.folds(cache, 32, 4, 128, 132) == 0  # 256 blocks: one wave already
    assert decode.folds(cache, 64, 8, 128, 132) == decode.folds(cache, 64, 4, 64, 132) == 0
    for name, value in (("max_pages", 1024), ("max_pages", 64), ("page_size", 32)):
        other = types.SimpleNamespace(**{**vars(cache), name: value})
        assert decode.folds(other, 64, 4, 128, 132) == 0
    launched = {(c["SORT"], c["PAIR"]) for k, c in decode.shipped() if k is decode.FOLDED}
    assert {(256, 64), (512, 64), (1024, 256), (1024, 0)} <= launched
    assert min(n for n, _ in launched) == 256
    flat = types.SimpleNamespace(**{**vars(cache), "paged": False})
    assert decode.folds(flat, 64, 4, 128, 132) == 0


@pytest.mark.parametrize(
    "heads, sq, dtype, stages, pair, spec, lens",
    [
        (8, 1, np.float16, 3, 0, 1, [0, 300, 1, 15, 16, 65, 512]),
        (4, 2, BF16, 4, 64, 1, [512, 300, 65, 16, 15, 1, 0]),  # (ranked as loaded first)
        (8, 1, np.float16, 3, 64, 0, [0, 300, 1, 15, 16, 65, 512]),
    ],
)
def test_folded_walk_in_simulator(monkeypatch, heads, sq, dtype, stages, pair, spec, lens):
    # two sequences a block (decode_folded), the union of their pages in pool order, 4
    # query rows a K/V group (group 4 at Sq 1, group 2 at Sq 2), 3 or 4 K/V stages, the
    # longest with the shortest (PAIR: lengths in rank order or not) or not, each
    # sequence's first keys copied before the sort (SPEC: 2 tiles, at 4 stages then one
    # of the walk) or not, against float64 and the race checker: an odd batch (a block
    # with one sequence), lengths 0, 1, under a page, a page boundary, past the first
    # tile, full, rows past each length NaN
    monkeypatch.setattr(decode, "FOLDED", spy := _Launches(decode.FOLDED))
    monkeypatch.setattr(decode, "folds", lambda *_: 2)
    monkeypatch.setattr(decode, "FOLD_STAGES", stages)
    monkeypatch.setattr(decode, "FOLD_PAIR", pair)
    monkeypatch.setattr(decode, "FOLD_SPEC", spec)
    rng = np.random.default_rng(heads + sq)
    b, hkv, d, capacity, page_size = len(lens), 2, 64, 512, 16
    q = rng.standard_normal((b, heads, sq, d)).astype(dtype)
    k_cache, v_cache, table = make_cache(rng, b, hkv, d, capacity, dtype, page_size)
    poison_past_lengths((k_cache, v_cache), lens, table, page_size)
    with kaio.simulate():
        out, lse = kaio_ops.flash_attention_decode_with_stats(
            q, k_cache, v_cache, np.array(lens, np.int32), table
        )
    flags = [(c["FOLD"], c["SORT"], c["STAGES"], c["PAIR"], c["SPEC"]) for c in spy.constexprs]
    assert flags == [(2, 128, stages, pair, spec)]
    ref, ref_lse = reference(q, k_cache, v_cache, lens, table)
    out = out.astype(np.float64)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < (4e-3 if dtype == np.float16 else 3e-2)
    seen = np.isfinite(ref_lse)
    assert np.array_equal(seen, np.isfinite(lse))
    assert np.abs(lse[seen] - ref_lse[seen]).max() < 1e-3


def assembled() -> list:
    """The specializations assembled here: each family of ``decode.shipped()`` (every head
    dim, M-tile count, layout and merge mode, both dtypes; the merge kernel; the append's
    vector and scalar paths), not all of them (the CI time budget). The largest
    (D = 256, four M-tiles) and the one compiled for 3 blocks per SM (168 registers) are in."""

    def fwd(dp, mt, paged, merge, deep=False, cl=1, dt=kaio.f16, swap=0, own=0, sort=0):
        flags = {"DIRECT": merge == "direct", "FUSED": merge == "fused", "CL": cl}
        stages = (decode.deep_stages if deep else decode.stages_for)(dp, mt)
        pw = int(decode.PAGE_WINDOW and paged)
        base = {"DP": dp, "MT": mt, "PAGED": paged, "DT": dt, "STAGES": stages, "PW": pw}
        spec = decode.speculates(paged) if merge == "direct" else 0
        tile = {"SWAP": swap, "SYNC1": decode.stage_syncs(stages, own), "OWN": own, "SORT": sort}
        return {**base, "SPEC": spec, **flags, **tile, "PDL": int(merge == "direct" and paged)}

    def folded(sort, pair, dt):
        flags = {"DP": 128, "STAGES": 3, "FOLD": 2, "SORT": sort, "PAIR": pair}
        return {**flags, "SPEC": decode.FOLD_SPEC, "DT": dt}

    return [
        (decode.DECODE, fwd(64, 4, True, "fused")),
        (decode.DECODE, fwd(128, 1, True, "fused")),
        (decode.DECODE, fwd(128, 4, False, "fused", deep=True)),
        (decode.DECODE, fwd(128, 2, False, "direct")),
        (decode.DECODE, fwd(256, 1, False, "kernel")),
        (decode.DECODE, fwd(256, 4, True, "fused")),
        (decode.DECODE, fwd(128, 1, False, "fused", dt=kaio.bf16)),
        (decode.DECODE, fwd(128, 1, True, "cluster", deep=True, cl=16, swap=1, own=1)),
        (decode.DECODE, fwd(128, 1, True, "direct", deep=True, swap=1, own=1)),
        (decode.DECODE, fwd(128, 1, True, "direct", deep=True, swap=1, own=1, sort=256)),
        (decode.DECODE, fwd(128, 1, True, "direct", dt=kaio.bf16, swap=1, sort=128)),
        (decode.DECODE, {**fwd(128, 1, True, "direct", swap=1, sort=128), "PDL": 2}),
        (decode.FOLDED, folded(512, 64, kaio.f16)),
        (decode.FOLDED, folded(1024, 0, kaio.bf16)),
        (decode.DECODE, fwd(128, 1, False, "direct", dt=kaio.bf16, swap=1)),
        (decode.DECODE, fwd(256, 4, False, "cluster", deep=True, cl=2, dt=kaio.bf16)),
        (decode.MERGE, {"DP": 256, "MT": 4, "DT": kaio.bf16}),
        (decode.APPEND, {"PAGED": True, "VEC": 8, "DT": kaio.f16}),
        (decode.APPEND, {"PAGED": False, "VEC": 1, "DT": kaio.bf16}),
    ]


def _assemble(index: int) -> None:
    kernel, constexprs = assembled()[index]
    for arch in ("sm_80", "sm_90") if constexprs.get("CL", 1) == 1 else ("sm_90",):
        pdl = {"PDL": 0} if arch == "sm_80" and "PDL" in constexprs else {}  # (sm_90's)
        report = assemble(kernel.ptx(arch=arch, **{**constexprs, **pdl}), arch)
        if arch == "sm_90":  # H100/H200: every kernel fits its registers
            spills = re.search(r"(\d+) bytes spill stores", report)
            assert spills and spills[1] == "0", (kernel.pyfunc.__name__, constexprs, report)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize(
    "constexprs",
    [
        {"HKV": 8, "DP": 128, "STAGES": 3, "DIRECT": False, "DT": kaio.f16, "SPEC": 1},
        {"HKV": 4, "DP": 64, "STAGES": 2, "DIRECT": True, "DT": kaio.bf16, "SPEC": 0},
    ],
)
def test_whole_page_blocks_assemble(constexprs):
    # decode_pages (off by default, so not among decode.shipped()) for sm_80 and sm_90,
    # without spills on sm_90
    for arch in ("sm_80", "sm_90"):
        report = assemble(decode.PAGES.ptx(arch=arch, **constexprs), arch)
        if arch == "sm_90":
            spills = re.search(r"(\d+) bytes spill stores", report)
            assert spills and spills[1] == "0", report


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_every_specialization_family_assembles():
    shipped = list(decode.shipped())
    assert all(pair in shipped for pair in assembled())
    count = len(assembled())
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(_assemble, range(count)))


# --------------------------------------------------------------------------- GPU


def _gpu_case(b, h, hkv, sq, d, capacity, lens, page_size, dtype, seed):
    """Random q and a cache on the GPU (torch), with the lengths as an int32 tensor."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn((b, h, sq, d), device="cuda", dtype=dt, generator=gen)
    if page_size is None:
        shape, table = (b, hkv, capacity, d), None
    else:
        max_pages = -(-capacity // page_size)
        pages = b * max_pages + 5
        shape = (pages, page_size, hkv, d)
        perm = torch.randperm(pages, device="cuda", generator=gen)[: b * max_pages]
        table = perm.reshape(b, max_pages).to(torch.int32)
    k_cache, v_cache = (torch.randn(shape, device="cuda", dtype=dt, generator=gen) for _ in "kv")
    return q, k_cache, v_cache, torch.tensor(lens, device="cuda", dtype=torch.int32), table


def _gather_torch(cache, b, n, table):
    """Sequence b's first n rows of a cache, [Hkv, n, D]."""
    import torch

    if table is None:
        return cache[b, :, :n]
    ps = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    return cache[table[b, pos // ps].long(), pos % ps].transpose(0, 1)


def _sdpa_reference(q, k_cache, v_cache, lens, table, scale=None):
    """torch SDPA in float64 per sequence on the gathered cache (causal among new tokens)."""
    import torch

    out = torch.zeros_like(q, dtype=torch.float64)
    sq = q.shape[2]
    for b, n in enumerate(lens):
        if n == 0:
            continue
        k, v = (_gather_torch(c, b, n, table).double() for c in (k_cache, v_cache))
        group = q.shape[1] // k.shape[0]
        k, v = (x.repeat_interleave(group, 0) for x in (k, v))
        pos = torch.arange(n - sq, n, device=q.device)[:, None]
        mask = torch.arange(n, device=q.device)[None] <= pos
        out[b] = torch.nn.functional.scaled_dot_product_attention(
            q[b].double(), k, v, attn_mask=mask, scale=scale
        ).nan_to_num(0.0)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b, h, hkv, sq, d, capacity, lens",
    [
        (1, 32, 8, 1, 128, 4096, [4096]),
        (1, 32, 8, 1, 128, 1024, [1000]),  # clusters of 8, 2 tiles a split: OWN
        (4, 32, 8, 1, 128, 8192, [1, 4095, 8192, 0]),
        (3, 32, 4, 4, 128, 2048, [2047, 16, 1000]),
        (2, 8, 1, 16, 64, 5000, [4999, 17]),
        (2, 16, 16, 2, 256, 3000, [3000, 129]),
        # a full GPU's grid (one split: its first tiles copied before the length is read)
        (16, 32, 8, 2, 128, 1000, [0, 1, 2, 15, 16, 17, 999, 1000, 500, 64, 65, 128, 3, 7, 8, 9]),
        # ... over 1024 pages of 16 (past SORT's tables)
        (
            16,
            32,
            8,
            1,
            128,
            16384,
            [16384, 0, 1, 17, 4095, 4096, 4097, 8000, 12345, 16383, 2048, 2049, 30, 64, 1000, 9999],
        ),  # fmt: skip
        # two waves of blocks (one split, more blocks than run at once), SORT over pages of 16
        (64, 32, 8, 1, 128, 2048, [2048, 1, *((i * 977) % 2049 for i in range(62))]),
    ],
)
@pytest.mark.parametrize("page_size", [None, 16, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_decode_against_sdpa(b, h, hkv, sq, d, capacity, lens, page_size, dtype):
    import torch

    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        b, h, hkv, sq, d, capacity, lens, page_size, dtype, seed=sum(lens) + d
    )
    out, lse = kaio_ops.flash_attention_decode_with_stats(q, k_cache, v_cache, seq_lens, table)
    ref = _sdpa_reference(q, k_cache, v_cache, lens, table)
    assert out.dtype == q.dtype and torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    assert err < (5e-3 if dtype == "float16" else 3e-2), err
    assert torch.isfinite(lse[[i for i, n in enumerate(lens) if n >= sq]]).all()
    again = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    assert torch.equal(again, out)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize(
    "capacity, sq, dtype, sort",
    [(4096, 1, "float16", 256), (2048, 2, "bfloat16", 128), (1024, 1, "float16", 128)],
)
def test_gpu_sorted_pages_against_sdpa(capacity, sq, dtype, sort, monkeypatch):
    """The routed SORT (one split over a shuffled pool of 16-token pages, 128 to 256 a
    sequence, from 64 in one wave: B16 at 1k, 2k and 4k keys, the suite's H 32, Hkv 8, D
    128) through the public op, ragged lengths (0, 1, page boundaries, the capacity)
    against SDPA in float64 on the gathered cache; the launch's SORT checked, so that the
    test fails if the route drifts."""

    _plan.clear()  # (a plan recorded before would replay without the spy)
    monkeypatch.setattr(decode, "DECODE", spy := _Launches(decode.DECODE))
    lens = [capacity, 0, 1, 15, 16, 17, 255, 256, 257, 1000, 1024, capacity - 1, 2, 31, 500, 33]
    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        16, 32, 8, sq, 128, capacity, lens, 16, dtype, seed=capacity + sq
    )
    out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    assert [c["SORT"] for c in spy.constexprs] == [sort]
    _check_paged_against_sdpa(out, q, k_cache, v_cache, seq_lens, table, lens, dtype)


def _check_paged_against_sdpa(out, q, k_cache, v_cache, seq_lens, table, lens, dtype):
    """``out`` (the public op's result over the paged cache) against SDPA in float64 on the
    gathered cache, finite and in q's dtype; a second call gives the same bits."""
    import torch

    ref = _sdpa_reference(q, k_cache, v_cache, lens, table)
    assert out.dtype == q.dtype and torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    assert err < (5e-3 if dtype == "float16" else 3e-2), err
    again = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    assert torch.equal(again, out)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("b, dtype", [(16, "float16"), (64, "bfloat16")])
def test_gpu_long_walk_against_sdpa(b, dtype, monkeypatch):
    """The long-table route (``decode.long_walk``, forced here on any GPU: fast memory's)
    over 2048 pages of 16 (32k keys): B16, one wave at 3 K/V stages, each warp on its own
    keys; B64, two waves, each warp on its own keys at 3 stages (the launch checked);
    the suite's H 32, Hkv 8, D 128, ragged lengths (0, 1, page and tile boundaries, the
    capacity) against SDPA in float64 on the gathered cache; the same bits twice."""

    _plan.clear()  # (a plan recorded before would replay without the spy)
    monkeypatch.setattr(decode, "DECODE", spy := _Launches(decode.DECODE))
    monkeypatch.setattr(decode, "LONG_BANDWIDTH", 0)
    capacity = 32768
    lens = [capacity, 0, 1, 15, 16, 17, 63, 64, 65, 4095, 20000, capacity - 1, 257, 31000]
    lens += [(i * 7919) % (capacity + 1) for i in range(b - len(lens))]
    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        b, 32, 8, 1, 128, capacity, lens, 16, dtype, seed=b
    )
    out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    launched = [(c["STAGES"], c["OWN"], c["SYNC1"], c["DIRECT"]) for c in spy.constexprs]
    assert launched == [(3, 1, 0, True)]
    _check_paged_against_sdpa(out, q, k_cache, v_cache, seq_lens, table, lens, dtype)


@pytest.mark.gpu
def test_gpu_cache_past_two_to_the_31_elements():
    """Caches of 3 * 2**30 elements each (the kernels address them with u32 arithmetic, so up
    to 2**32 - 1 are taken): the second sequence's rows lie past element 2**31; decode reads
    them and the append writes them. A cache of 2**32 elements is refused before launch."""
    import torch

    if torch.cuda.mem_get_info()[0] < 24 * 2**30:
        pytest.skip("needs 24 GB of free GPU memory")
    b, h, hkv, sq, d, capacity, lens = 2, 16, 8, 2, 128, 3 * 2**19, [300, 1000]
    gen = torch.Generator(device="cuda").manual_seed(31)
    k_cache, v_cache = (
        torch.empty((b, hkv, capacity, d), device="cuda", dtype=torch.float16) for _ in "kv"
    )
    for cache in (k_cache, v_cache):
        cache[:, :, : max(lens)].normal_(generator=gen)
    assert k_cache.numel() > 2**31
    q = torch.randn((b, h, sq, d), device="cuda", dtype=torch.float16, generator=gen)
    k_new, v_new = (
        torch.randn((b, hkv, sq, d), device="cuda", dtype=q.dtype, generator=gen) for _ in "kv"
    )
    seq_lens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    kaio_ops.kv_cache_append(k_cache, v_cache, k_new, v_new, seq_lens)
    for cache, new in ((k_cache, k_new), (v_cache, v_new)):
        for i, n in enumerate(lens):
            assert torch.equal(cache[i, :, n - sq : n], new[i])
    out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens)
    err = (out.double() - _sdpa_reference(q, k_cache, v_cache, lens, None)).abs().max().item()
    assert err < 5e-3, err
    del k_cache, v_cache
    huge = torch.empty((1, hkv, 2**22, d), device="cuda", dtype=torch.float16)  # 2**32 elements
    with pytest.raises(ValueError, match="k_cache.*4294967296 elements.*at most 4294967295"):
        kaio_ops.flash_attention_decode(q[:1], huge, huge, seq_lens[:1])


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize(
    "first, replays",
    [
        ([100, 2000, 4096, 2], ([5, 3000, 17, 4096], [2, 64, 4095, 1000])),
        ([3000], ([5], [4096])),  # batch 1: the cluster merge on sm_90
    ],
)
def test_gpu_decode_step_in_a_cuda_graph(page_size, first, replays):
    import torch

    b, h, hkv, sq, d, capacity = len(first), 32, 8, 2, 128, 4096
    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        b, h, hkv, sq, d, capacity, first, page_size, "float16", seed=7
    )
    k_new, v_new = (torch.randn((b, hkv, sq, d), device="cuda", dtype=q.dtype) for _ in "kv")

    def step():
        kaio_ops.kv_cache_append(k_cache, v_cache, k_new, v_new, seq_lens, table)
        return kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and load outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for lens in replays:
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        k_new.normal_()
        v_new.normal_()
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        ref = _sdpa_reference(q, k_cache, v_cache, lens, table)
        assert (out.double() - ref).abs().max().item() < 5e-3
        for bi, n in enumerate(lens):  # the new rows are in the cache
            got = _gather_torch(k_cache, bi, n, table)[:, n - sq :]
            assert torch.equal(got, k_new[bi])
        assert torch.equal(step(), out)  # eager (appending the same rows again): same bits


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("b, capacity", [(1, 4096), (16, 1024), (64, 1024), (64, 2048)])
def test_gpu_decode_reads_what_the_kernels_before_wrote(b, capacity, page_size):
    """Calls queued right behind kernels that write every input they read (the lengths,
    the table, q, the cache) and right behind each other, with no host synchronization:
    programmatic dependent launch (``decode.PDL`` on sm_90) lets a call start, prefetch
    and read hints before the kernel before it ends, so its output must still be that of
    the new values. B16 at 1k keys: one split, with PDL (paged: SORT); B64 at 1k: one
    split in two waves (paged: with PDL on an H100, not an H200); without it B1 (the
    cluster merge) and B64 at 2k (two waves; paged: the folded walk)."""
    import torch

    h, hkv, d = 32, 8, 128
    lens = [capacity - 7 * i % 500 for i in range(b)]
    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        b, h, hkv, 1, d, capacity, lens, page_size, "float16", seed=b
    )
    gen = torch.Generator(device="cuda").manual_seed(11)
    base = seq_lens.clone()
    pages = None if table is None else table.flatten().clone()
    outs, inputs = [], []
    for i in range(3):
        torch.clamp(base - 37 * i, min=0, out=seq_lens)  # (kernels: not copies)
        if table is not None:  # another permutation of the same pages
            perm = torch.randperm(pages.numel(), device="cuda", generator=gen)
            torch.index_select(pages, 0, perm, out=table.view(-1))
        for x in (q, k_cache, v_cache):
            x.normal_(generator=gen)
        outs += [kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)]
        outs += [kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)]
        now = [x.clone() for x in (q, k_cache, v_cache, seq_lens)]
        inputs.append((*now, None if table is None else table.clone()))
    torch.cuda.synchronize()
    for i, (qi, ki, vi, li, ti) in enumerate(inputs):
        assert li.tolist() == [max(0, n - 37 * i) for n in lens]
        ref = _sdpa_reference(qi, ki, vi, li.tolist(), ti)
        assert (outs[2 * i].double() - ref).abs().max().item() < 5e-3, i
        assert torch.equal(outs[2 * i + 1], outs[2 * i])  # right behind the same call


@pytest.mark.gpu
def test_gpu_decode_at_a_graphs_root_and_after_a_kernel():
    """A call with programmatic dependent launch (B16 at 1k keys, paged: on sm_90) captured
    as the root of a CUDA graph, and right behind a kernel that writes its lengths (the
    graph's edge to it programmatic): replays with new lengths and queries write a poisoned
    output, against SDPA in float64."""
    import torch

    b, capacity = 16, 1024
    first = [capacity - 9 * i for i in range(b)]
    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        b, 32, 8, 1, 128, capacity, first, 16, "float16", seed=5
    )
    wanted = seq_lens.clone()

    def call():
        return kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)

    def after_a_kernel():
        torch.clamp(wanted, min=0, out=seq_lens)
        return call()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compiles and loads outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    alone, behind = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(alone, stream=stream):
        out_alone = call()
    with torch.cuda.graph(behind, stream=stream):
        out_behind = after_a_kernel()
    for lens in ([5, *first[1:]], [capacity] * b, [(7 * i) % 1000 for i in range(b)]):
        wanted.copy_(torch.tensor(lens, dtype=torch.int32))
        q.normal_()
        for graph, out in ((alone, out_alone), (behind, out_behind)):
            seq_lens.copy_(wanted if graph is alone else torch.zeros_like(wanted))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = _sdpa_reference(q, k_cache, v_cache, lens, table)
            assert (out.double() - ref).abs().max().item() < 5e-3


@pytest.mark.gpu
def test_gpu_fused_merge_captured_on_a_stream_first_seen_capturing(monkeypatch):
    """The fused merge (splits merged by the last block, FUSED: a paged cache of 8192 keys,
    4 sequences, 4 splits, on sm_90 too) captured into a CUDA graph on a stream first seen
    capturing, after a call on another stream: the capture takes one of the counter rows
    zeroed ahead (``decode.zeroed_row``), outside the graph. Replays with new lengths and
    queries write a poisoned output, against SDPA in float64, and equal an eager call."""
    import torch

    monkeypatch.setattr(decode, "_COUNTERS", {})  # every stream new to the counters
    monkeypatch.setattr(decode, "_SPARE", {})
    _plan.clear()
    monkeypatch.setattr(decode, "DECODE", spy := _Launches(decode.DECODE))
    first = [8192, 1, 5000, 4097]
    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        4, 32, 8, 1, 128, 8192, first, 16, "float16", seed=21
    )

    def call():
        return kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)

    other, capture = torch.cuda.Stream(), torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        call()  # compiles and loads; zeroes this stream's counters and the spare rows
    other.synchronize()
    assert [(c["FUSED"], c["CL"]) for c in spy.constexprs] == [(True, 1)]
    (spare,) = decode._SPARE.values()
    assert len(spare) == decode.SPARE_ROWS
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        out = call()
    assert len(spare) == decode.SPARE_ROWS - 1  # the capture's counters: a spare row
    assert len(decode._COUNTERS) == 2
    for lens in ([5, 8192, 17, 4096], [8191, 0, 64, 2], first):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.normal_()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = _sdpa_reference(q, k_cache, v_cache, lens, table)
        assert (out.double() - ref).abs().max().item() < 5e-3, lens
        assert torch.equal(call(), out)  # eager on the default stream: same bits


@pytest.mark.gpu
def test_gpu_decode_step_does_not_synchronize():
    import torch

    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        8, 32, 8, 1, 128, 2048, [2048, 5, 1000, 64, 1, 0, 2047, 300], 16, "bfloat16", seed=3
    )
    k = torch.randn((8, 8, 1, 128), device="cuda", dtype=q.dtype)

    def step():
        kaio_ops.kv_cache_append(k_cache, v_cache, k, k, seq_lens, table)
        return kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)

    step()  # compiles and loads
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_gpu_torch_ops_and_debug_length_check(monkeypatch):
    import torch

    import kaio_ops.torch  # noqa: F401

    q, k_cache, v_cache, seq_lens, table = _gpu_case(
        2, 8, 2, 1, 64, 256, [256, 3], 16, "bfloat16", seed=9
    )
    out = torch.ops.kaio.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
    assert torch.equal(out, kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table))
    k = torch.randn((2, 2, 1, 64), device="cuda", dtype=q.dtype)
    torch.ops.kaio.kv_cache_append(k_cache, v_cache, k, k, seq_lens, table)
    assert torch.equal(_gather_torch(k_cache, 1, 3, table)[:, 2], k[1, :, 0])
    # debug mode copies the lengths to the host and checks them; plans were built with the
    # kernel's setting of the time, so they are dropped after changing it
    monkeypatch.setattr(decode.DECODE, "debug", True)
    _plan.clear()
    seq_lens[0] = 257
    with pytest.raises(ValueError, match="seq_lens\\[0\\] = 257"):
        kaio_ops.flash_attention_decode(q, k_cache, v_cache, seq_lens, table)
