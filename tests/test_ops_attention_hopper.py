"""The Hopper flash-attention forward (``kaio_ops._attention_hopper``: TMA, mbarriers, a
producer warpgroup, wgmma with P from registers) in the simulator against a NumPy float64
reference at small sizes (every head dim, f16 and bf16, causal and not, grouped-query heads,
Sq != Sk, a query tail, each pipeline variant; the race detector on), its PTX through ptxas
for sm_90a (no spills, no serialized wgmma), and on an sm_90 GPU ``flash_attention``'s
dispatch to it against torch SDPA in float64."""

from __future__ import annotations

import importlib
import math

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import find_ptxas
from kaio_ops import _arrays, attention
from kaio_ops import _attention_hopper as hopper
from tests.harness import assemble_wgmma, covering
from tests.poison import poison_allocations
from tests.test_ops_attention import reference, rel


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates starts as NaN."""
    poison_allocations(monkeypatch)


def run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg, scale=None, ctas=None):
    """(out, lse, reference out, reference lse) of ``_attention_hopper.launch`` in the
    simulator on random inputs (``ctas``: the blocks of a persistent launch)."""
    rng = np.random.default_rng(sq * 7 + sk + d)
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    k, v = (rng.standard_normal((b, hkv, sk, d)).astype(dtype) for _ in range(2))
    with kaio.simulate():
        (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, scale)
        out, lse = hopper.launch(qa, ka, va, dims, causal, scale, cfg, ctas=ctas)
    g = h // hkv
    ref, ref_lse, _ = reference(q, np.repeat(k, g, 1), np.repeat(v, g, 1), causal, scale)
    return out, lse, ref, ref_lse


def small(d: int, **over) -> dict:
    """A small configuration of the kernel for head dim d (two consumer warpgroups):
    64-key tiles, two stages, the row sums by FADD (``ONES`` 0, which ``launch`` would
    route: test_row_sums_on_the_tensor_cores_in_simulator takes it)."""
    two = {"WG": 2, "REGS": hopper.consumer_registers(2)}
    return {**hopper.config(d, causal=True), **two, "BN": 64, "STAGES": 2, "ONES": 0, **over}


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d, dtype, causal, over",
    [
        # one consumer warpgroup, the plain order, a query tail
        (1, 2, 1, 70, 128, 64, np.float16, False, {"WG": 1, "REGS": 0, "PIPE": 0}),
        # two warpgroups, the intra-warpgroup overlap, grouped-query, Sq > Sk, causal
        (2, 4, 2, 150, 128, 64, ml_dtypes.bfloat16, True, {"PIPE": 1}),
        # ping-pong, more key tiles than stages, Sq < Sk, causal (top-left aligned)
        (1, 2, 2, 64, 320, 64, np.float16, True, {"PIPE": 2}),
        # D = 128, 128-key tiles, three stages, ping-pong
        (1, 1, 1, 70, 384, 128, np.float16, False, {"BN": 128, "STAGES": 2, "PIPE": 2}),
        # D = 256, bf16, causal
        (1, 1, 1, 100, 192, 256, ml_dtypes.bfloat16, True, {"PIPE": 1}),
        # FlashAttention-3's order, a partial last key tile, causal
        (1, 2, 1, 130, 200, 64, np.float16, True, {"PIPE": 3}),
        # that order with ping-pong, more key tiles than stages
        (1, 1, 1, 128, 320, 64, ml_dtypes.bfloat16, False, {"PIPE": 4}),
        # three consumer warpgroups (192 query rows), D = 64's default without the mask
        (1, 1, 1, 200, 192, 64, np.float16, False, {**hopper.config(64), "BN": 64}),
    ],
)
def test_hopper_forward_in_simulator(b, h, hkv, sq, sk, d, dtype, causal, over):
    out, lse, ref, ref_lse = run_sim(b, h, hkv, sq, sk, d, dtype, causal, small(d, **over))
    assert out.dtype == dtype and out.shape == (b, h, sq, d)
    # P is rounded to the input type for the tensor cores
    assert rel(out, ref) < (1e-3 if dtype == np.float16 else 1e-2)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-4)


THREE = {"WG": 3, "REGS": hopper.consumer_registers(3)}  # three consumer warpgroups


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d, dtype, causal, over, ctas",
    [
        # two blocks of two tiles each: the ring, the Q buffer and the ping-pong turns carried
        # from one tile to the next; causal (tiles of 4 and 2 key tiles)
        (1, 2, 1, 256, 256, 64, np.float16, True, {"PIPE": 4}, 2),
        # one block for all four tiles, the plain order, grouped-query heads
        (1, 4, 2, 100, 192, 64, ml_dtypes.bfloat16, False, {"PIPE": 0}, 1),
        # heaviest tiles first, back and forth over three blocks (the last round leaves two
        # blocks out)
        (1, 2, 1, 256, 128, 64, np.float16, True, {"PIPE": 0, "PERSIST": 2}, 3),
        # sections of two heads (the last of one), heaviest query tiles first: a block a
        # tile, and two persistent blocks going back and forth
        (1, 3, 3, 200, 256, 64, np.float16, True, {"PIPE": 4, "PERSIST": 0, "SECTION": 2}, 0),
        (1, 3, 1, 256, 256, 64, np.float16, True, {"PIPE": 0, "PERSIST": 2, "SECTION": 2}, 2),
        # pairs of query tiles, the heaviest with the lightest: three tiles a head (the
        # middle one alone), two blocks (their unmasked key tiles a branch of the loop of
        # their own, DIAG 2); and a block for each pair
        (1, 2, 1, 320, 320, 64, np.float16, True, {"PIPE": 4, "PERSIST": 3, "DIAG": 2}, 2),
        (1, 2, 2, 256, 200, 64, ml_dtypes.bfloat16, False, {"PIPE": 0, "PERSIST": 3}, 0),
        # one stream of key-tile steps a block (XT), the next tile's first S = Q K^T issued
        # with the last P V: pairs with two Q buffers, causal (tiles of 5, 1 and 3 key tiles)
        (
            1,
            2,
            1,
            320,
            320,
            64,
            np.float16,
            True,
            {"PIPE": 1, "PERSIST": 3, "XT": 1, "QB": 2},
            2,
        ),  # fmt: skip
        # FlashAttention-3's order, one block for eight tiles of grouped-query heads, Sq !=
        # Sk, each tile's last key tile partial (the zeros' barrier over eight phases)
        (
            1,
            4,
            2,
            100,
            200,
            64,
            ml_dtypes.bfloat16,
            False,
            {"PIPE": 3, "PERSIST": 1, "XT": 1, "QB": 2},
            1,
        ),  # fmt: skip
        # causal, Sq > Sk, partial key tiles, one Q buffer, a block for each pair
        (2, 2, 1, 256, 200, 128, np.float16, True, {"PIPE": 3, "PERSIST": 3, "XT": 1}, 0),
        # three warpgroups (192 rows) of 64-key tiles, one block, causal: warpgroups 0 and 1
        # skip two and one key tiles of each query tile (two: its last P V and rows first)
        (1, 2, 1, 384, 384, 64, np.float16, True, {**THREE, "PIPE": 1, "XT": 1, "QB": 2}, 1),
        # and without the mask, the second query tile's warpgroups 1 and 2 past Sq (one step)
        (1, 2, 2, 200, 256, 64, np.float16, False, {**THREE, "PIPE": 3, "XT": 1, "QB": 2}, 1),
        # a tile at a time with two Q buffers (the second tile's Q in the second), three
        # warpgroups of 64-key tiles, causal: warpgroups 0 and 1 free the two and one key
        # tiles past their rows (two: the pending P V first); the second tile's two unmasked
        # key tiles in a loop of their own (DIAG; one block: blocks simulated together run
        # in lockstep, and their loops of different lengths would wait on each other)
        (1, 1, 1, 384, 384, 64, np.float16, True, {**THREE, "PIPE": 1, "QB": 2, "DIAG": 1}, 1),
        # the tiles of a plan (PERSIST 5: sections of two heads, each tile to the block with
        # the least work), bf16, FlashAttention-3's order, a partial last key tile in every
        # tile, a query tail, P packed as the exponentials come (EARLY)
        (
            1,
            3,
            3,
            300,
            330,
            64,
            ml_dtypes.bfloat16,
            False,
            {"BN": 128, "PIPE": 3, "PERSIST": 5, "SECTION": 2, "EARLY": 1},
            2,
        ),  # fmt: skip
    ],
)
def test_persistent_blocks_in_simulator(b, h, hkv, sq, sk, d, dtype, causal, over, ctas):
    cfg = small(d, **{"PERSIST": 1, **over})
    out, lse, ref, ref_lse = run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg, ctas=ctas or None)
    assert rel(out, ref) < (1e-3 if dtype == np.float16 else 1e-2)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "dtype, lazy, scale, causal, sums",
    [
        (np.float16, 1, 1.0, True, "ones"),
        (np.float16, 2, 1.0, True, "ones"),  # (P rescaled, the scores again: growths past 2^15)
        (ml_dtypes.bfloat16, 2, 1.0, False, "ones"),  # (P rescaled)
        (ml_dtypes.bfloat16, 2, 20.0, False, "ones"),  # (the scores again: past 2^120)
        (ml_dtypes.bfloat16, 2, 20.0, False, "fadd"),
    ],
)
def test_row_max_kept_while_it_grows_little_in_simulator(dtype, lazy, scale, causal, sums):
    """``LAZY`` 1: a row max kept while the scores pass it by at most 2^LAZY_GROWTH; 2: and
    the exponentials taken on the kept max, P rescaled where a max grew past it (``grown``).
    A scale of 1 spreads the scores (std 8) so that some rows' maxima grow past that in
    later key tiles and others' do not; 20, so far that f32 would overflow. On D64's routes
    with the mask and without it (the head's last tile split among the warpgroups there,
    SPLIT), the sums on the tensor cores (``ones``) or by FADD (``fadd``)."""
    over = {**THREE, **D64_COUNTER, "ONES": int(sums == "ones"), "PIPE": 1 if causal else 3}
    cfg = small(64, **{**over, "PERSIST": 4, "SECTION": 2, "EARLY": 1, "LAZY": lazy, "SPLIT": 1})
    out, lse, ref, ref_lse = run_sim(1, 2, 1, 200, 330, 64, dtype, causal, cfg, scale, 2)
    assert rel(out, ref) < (1e-3 if dtype == np.float16 else 1e-2)
    # (bf16's sums on the tensor cores: the probabilities rounded, up to 2^8 on the kept
    # max: 3.9e-3 at a scale of 1)
    bf16_ones = dtype != np.float16 and sums == "ones"
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=5e-3 if bf16_ones else 1e-3)


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d, dtype, causal, over, ctas",
    [
        # pairs of query tiles, causal, the overlapped order
        (1, 2, 1, 256, 256, 64, np.float16, True, {"PIPE": 1, "PERSIST": 3}, 2),
        # FlashAttention-3's order, persistent blocks, a partial last key tile, bf16, a
        # query tail; O stored as 16-byte vectors (OV: the rows past sq left alone)
        (1, 2, 1, 130, 200, 128, ml_dtypes.bfloat16, False, {"PIPE": 3, "PERSIST": 1, "OV": 1}, 1),
        # three warpgroups, the plain order, a block a tile, causal
        (1, 2, 1, 200, 384, 64, np.float16, True, {**THREE, "PIPE": 0, "PERSIST": 0}, 0),
        # ping-pong, grouped-query heads
        (1, 2, 2, 130, 300, 128, np.float16, False, {"PIPE": 4, "PERSIST": 1}, 1),
        # one stream of steps a block
        (1, 2, 1, 384, 384, 64, np.float16, True, {**THREE, "PIPE": 1, "XT": 1, "QB": 2}, 1),
        # and the rounding added back (LSE), carried from one tile to the next, bf16
        (1, 2, 1, 256, 256, 64, ml_dtypes.bfloat16, True, {"PIPE": 3, "XT": 1, "LSE": 1}, 1),
        # D = 64's route without the mask (three warpgroups, FlashAttention-3's order,
        # persistent blocks), a query tail, grouped-query heads
        (1, 4, 2, 200, 256, 64, ml_dtypes.bfloat16, False, {**THREE, "PIPE": 3}, 2),
        # the exponentials two at a time (HEXP): pairs of query tiles with the mask, a partial
        # last key tile; bf16 (its .ftz form) without it, grouped-query heads
        (1, 1, 1, 130, 200, 64, np.float16, True, {"PERSIST": 3, "HEXP": 1}, 1),
        (1, 2, 1, 64, 128, 64, ml_dtypes.bfloat16, False, {"PIPE": 3, "HEXP": 1}, 1),
        # D128's route with the mask (f16): two Q buffers over a pair of query tiles of
        # 128-key tiles, a partial last key tile; O stored as 16-byte vectors (OV)
        (1, 1, 1, 256, 200, 128, np.float16, True, {"BN": 128, "QB": 2, "PERSIST": 3, "OV": 1}, 1),
        # and as routed with many query tiles: the tiles of a balanced plan (PERSIST 5), the
        # unmasked key tiles apart (DIAG), two heads over two blocks
        (
            1,
            2,
            1,
            384,
            384,
            128,
            np.float16,
            True,
            {"BN": 128, "QB": 2, "PERSIST": 5, "DIAG": 1, "OV": 1},
            2,
        ),  # fmt: skip
    ],
)
def test_row_sums_on_the_tensor_cores_in_simulator(b, h, hkv, sq, sk, d, dtype, causal, over,
                                                    ctas):  # fmt: skip
    """ONES: the row sums from 8 more columns of O (P times a block of ones beside each V
    stage). They sum the probabilities as rounded for P V, so the logsumexp moves by up to
    that rounding (a few 1e-4 in f16 at these lengths), and the output stays as close."""
    cfg = small(d, **{"PERSIST": 1, **over, "ONES": 1})
    out, lse, ref, ref_lse = run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg, ctas=ctas or None)
    assert rel(out, ref) < (1e-3 if dtype == np.float16 else 1e-2)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=5e-4 if dtype == np.float16 else 3e-3)


D64_COUNTER = {"QB": 2, "ONES": 1, "STAGES": 3, "OV": 1}  # (the route's, but PERSIST's)


@pytest.mark.parametrize(
    "d, h, sq, sk, causal, over, ctas, section",
    [
        # the mask, grouped-query heads, partial last key tiles, two Q buffers, three
        # stages, O as 16-byte vectors, the unmasked key tiles apart (D64's route), three
        # blocks taking 8 tiles from the counter, heads in sections of two
        # (and P packed as the exponentials come, P V waited for before them: EARLY)
        (64, 4, 256, 300, True, {**D64_COUNTER, "PIPE": 1, "DIAG": 1, "EARLY": 1}, 3, 2),
        # one block takes every head's tiles (one head a section, as launch picks)
        (64, 4, 128, 128, False, {"PIPE": 3, "OV": 1}, 1, 0),
        # D64's route without the mask (three warpgroups, FlashAttention-3's order, the
        # full key tiles apart): each head's last tile of 50 rows with its five key tiles
        # shared by the warpgroups (SPLIT; two blocks, each with two such tiles: the parts'
        # barriers over phases)
        (64, 4, 242, 300, False, {**THREE, **D64_COUNTER, "PIPE": 3, "SPLIT": 1, "DIAG": 1}, 2, 2),
        # f16 D128's options at 1024 keys or fewer (extras: two Q buffers), a partial last
        # key tile
        (128, 2, 256, 200, False, hopper.extras(128, False, kaio.f16, 200), 2, 0),
    ],
)
def test_tiles_taken_from_a_counter_in_simulator(d, h, sq, sk, causal, over, ctas, section):
    """``PERSIST`` 4: the producers take the work tiles from a counter in global memory and
    tell their consumers through shared memory; the last block done sets the counters back
    to 0, so that a second launch, which reuses them, takes every tile again."""
    counters = importlib.import_module("kaio_ops.linear")._counters
    cfg = small(d, **{"PERSIST": 4, "SECTION": section, "BN": 128 if d == 128 else 64, **over})
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, h, sq, d)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, sk, d)).astype(np.float16) for _ in range(2))
    g = h // 2
    ref, ref_lse, _ = reference(q, np.repeat(k, g, 1), np.repeat(v, g, 1), causal, None)
    with kaio.simulate():
        (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, None)
        for _ in range(2):
            out, lse = hopper.launch(qa, ka, va, dims, causal, scale, dict(cfg), ctas=ctas)
            assert rel(out, ref) < 1e-3
            np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=5e-4)
            assert not counters(qa, 2)[:2].any()


@pytest.mark.parametrize("causal", [False, True])
def test_balanced_plan_gives_every_tile_once(causal):
    """``balanced_plan`` (PERSIST 5): every work tile to exactly one block, each block's in
    the order given (``tile_of``'s: heaviest first in a section), and no block more than
    the heaviest tile past the mean work (the greedy's bound)."""
    bhs, n_qt, hs, ctas, sk, bm, bn, boundary = 6, 5, 4, 7, 640, 128, 128, 2
    plan = hopper.balanced_plan(bhs, n_qt, n_qt * bm, hs, ctas, sk, causal, bm, bn, boundary)
    r = int(plan[0])
    rows = plan[1:].reshape(ctas, r)
    tiles = [int(t) for row in rows for t in row if t >= 0]
    assert sorted(tiles) == list(range(bhs * n_qt))
    for row in rows:
        kept = [t for t in row if t >= 0]
        assert kept == sorted(kept) and all(t < 0 for t in row[len(kept) :])

    def work(t):
        first = t // (hs * n_qt) * hs
        q0 = (n_qt - 1 - (t - first * n_qt) // min(hs, bhs - first)) * bm
        n = -(-sk // bn)
        return (min(n, (q0 + bm + bn - 1) // bn) if causal else n) + boundary

    loads = [sum(work(t) for t in row if t >= 0) for row in rows]
    assert max(loads) <= sum(loads) / ctas + max(map(work, tiles))


@pytest.mark.parametrize("lse_fix", [0, 1])
def test_rounding_of_the_row_sums_added_back_in_simulator(lse_fix):
    """ONES sums the probabilities as rounded to bf16 for P V; ``LSE`` 1 adds back what
    that rounding took on the masked (diagonal) tiles, where a causal row with few keys
    sees them all: those rows' logsumexp as close as with the sums by FADD (1e-5; without
    it, up to ~1e-3), the others within the rounding of their unmasked tiles."""
    cfg = small(64, PERSIST=1, PIPE=3, ONES=1, LSE=lse_fix)
    out, lse, ref, ref_lse = run_sim(1, 2, 1, 128, 128, 64, ml_dtypes.bfloat16, True, cfg)
    assert rel(out, ref) < 1e-2
    few = np.abs(lse[..., :64] - ref_lse[..., :64]).max()  # rows of 1 to 64 keys
    assert (few < 1e-5) == bool(lse_fix), few
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=3e-3)


@pytest.mark.parametrize("persist, xt", [(0, 0), (1, 0), (1, 1)])
def test_keys_past_sk_are_left_out_in_simulator(persist, xt):
    """The last key tile reaches past sk into the next head's keys, whose V rows hold inf:
    those keys are masked and their V rows zeroed before P V (no NaN); a scale other than
    1/sqrt(D) is applied. Persistent: one block takes both heads, each with a partial last
    key tile (the zeros' barrier in its second phase for the second, the ring's stage
    counted over both)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 64, 64)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float16) for _ in range(2))
    v[0, 1, :28] = np.inf  # the rows head 0's last 64-key tile reads past its 100 keys
    cfg = small(64, PERSIST=persist, PIPE=4 if persist else 0, STAGES=3)
    if xt:  # one stream of steps over both heads' tiles, two Q buffers
        cfg.update(PIPE=1, XT=1, QB=2)
    with kaio.simulate():
        (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, 0.2)
        out, lse = hopper.launch(qa, ka, va, dims, False, scale, cfg, ctas=1)
    ref, ref_lse, _ = reference(q[:, :1], k[:, :1], v[:, :1], False, 0.2)
    assert rel(out[:, :1], ref) < 1e-3
    np.testing.assert_allclose(lse[:, :1], ref_lse, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"XT": 1, "PIPE": 4}, "PIPE 1's or 3's order"),
        ({"XT": 0, "QB": 3}, "barriers for 1 or 2"),
        ({"XT": 1, "QB": 2, "D": 256}, "more than"),
        ({"ONES": 1, "D": 256}, "past wgmma's 256"),
        ({"HEXP": 1, "ONES": 0}, "ONES 1, LSE 0"),
        ({"HEXP": 1, "ONES": 1, "LSE": 1}, "ONES 1, LSE 0"),
        ({"LAZY": 2, "EARLY": 1, "ONES": 1, "LSE": 1}, "without LSE"),
    ],
)
def test_stream_configurations_are_checked(over, match):
    d = over.pop("D", 128)
    with pytest.raises(ValueError, match=match):
        hopper.check_stream({**hopper.config(d), **over}, d)


def test_routes_by_type_mask_and_keys(monkeypatch):
    """``extras``: the row sums on the tensor cores for f16 at D 64 and 128, and for bf16 at
    D 64 without the mask (there on f16's route); two Q buffers
    for f16 at D 128 with the mask or at most SHORT_KEYS keys, where the launch has many
    query tiles (and there tiles taken from a counter, with ROUTE_COUNTER); at D 64 with the
    mask and at most D64_COUNTER_KEYS keys, without it at most SHORT_KEYS (either type),
    tiles from the counter with two Q buffers and three stages, O stored as 16-byte vectors
    and the unmasked key tiles apart; O stored as 16-byte vectors at D 128 and
    256 (either type), the unmasked key tiles apart at D 128 with the mask, and
    there (either type) the tiles of a balanced plan where the launch has many; at D 64 with
    the mask past SHORT_KEYS keys (either type) D64_SECTION heads a section; at D 64 on
    every route (either type) P packed among the exponentials (EARLY), with the sums on the
    tensor cores there the exponentials on the kept row max (LAZY 2) and without the mask a
    head's last tile split among the warpgroups (SPLIT); nothing more for bf16 with the mask
    or D 256."""
    f16, bf16 = kaio.f16, kaio.bf16
    ov, diag = {"OV": 1}, {"OV": 1, "DIAG": 1}  # D 128 and 256; D128 with the mask
    plan = {**diag, "PERSIST": 5}
    short = {"ONES": 1, "QB": 2, **ov}
    monkeypatch.setattr(hopper, "ROUTE_COUNTER", True)
    assert hopper.extras(128, False, f16, hopper.SHORT_KEYS) == {**short, "PERSIST": 4}
    monkeypatch.setattr(hopper, "ROUTE_COUNTER", False)
    assert hopper.extras(128, False, f16, hopper.SHORT_KEYS) == short
    assert hopper.extras(128, True, f16, hopper.SHORT_KEYS) == {**short, **plan}
    assert hopper.extras(128, True, f16, 4096) == {"ONES": 1, "QB": 2, **plan}
    assert hopper.extras(128, False, f16, 4096) == {"ONES": 1, **ov}
    assert hopper.extras(128, True, f16, 1024, many=False) == {"ONES": 1, **diag}
    sections = {"SECTION": hopper.D64_SECTION}  # D64 with the mask past SHORT_KEYS keys
    early = {"EARLY": 1}  # D64, every route
    lazy = {**early, "LAZY": 2}  # f16 D64, every route (and SPLIT without the mask)
    split = {**lazy, "SPLIT": 1}
    assert hopper.extras(64, False, f16, 2048) == hopper.extras(64, False, f16, 4096)
    assert hopper.extras(64, False, f16, 4096) == {"ONES": 1, **split}
    assert hopper.extras(64, True, f16, 4096) == {"ONES": 1, **sections, **lazy}
    plain = {"ONES": 1, "PERSIST": 4, "QB": 2, "STAGES": 3, **sections, **ov, **early}
    counter = {**plain, "DIAG": 1, "LAZY": 2}  # (with the mask)
    assert hopper.extras(64, False, f16, 1024) == {**plain, **split, "DIAG": 1}
    assert hopper.extras(64, False, bf16, 1024) == hopper.extras(64, False, f16, 1024)
    assert hopper.extras(64, True, f16, 1024) == hopper.extras(64, True, f16, 2048) == counter
    assert hopper.extras(64, True, f16, 1024, many=False) == {"ONES": 1, **lazy}
    assert hopper.extras(64, True, f16, 256) == counter  # (a partial last key tile's V
    # is the producer's until zeroed, whatever the tiles: ``zero_tail``)
    assert hopper.extras(128, True, bf16, 1024) == plan
    assert hopper.extras(128, True, bf16, 1024, many=False) == diag
    assert hopper.extras(256, True, f16, 1024) == hopper.extras(128, False, bf16, 1024) == ov
    assert hopper.extras(64, True, bf16, 1024) == {**plain, "DIAG": 1, "ONES": 0}
    assert hopper.extras(64, True, bf16, 1024, many=False) == early
    assert hopper.extras(64, False, bf16, 4096) == hopper.extras(64, False, f16, 4096)
    assert hopper.extras(64, False, bf16, 1024, many=False) == {"ONES": 1, **split}
    assert hopper.extras(64, True, bf16, 4096) == {**sections, **early}


def test_dispatch_needs_a_whole_64_column_head_dim_and_a_gpu():
    assert hopper.eligible(128) and hopper.eligible(64) and hopper.eligible(256)
    assert not hopper.eligible(96) and not hopper.eligible(32)
    with kaio.simulate():  # never under the simulator: its tests launch the kernel directly
        q = np.zeros((1, 1, 1024, 128), np.float16)
        (qa, _, _), dims, _ = attention._check_flash("test", q, q, q, None)
        assert not attention.hopper_takes(qa, dims)
    assert hopper.worthwhile(16, 2048, 4096, 128, 132)
    assert not hopper.worthwhile(8, 2048, 4096, 128, 132)  # 128 blocks: under a wave
    assert hopper.worthwhile(64, 1024, 1024, 128, 132)
    assert not hopper.worthwhile(64, 512, 1024, 128, 132)  # short: measured slower
    assert hopper.worthwhile(16, 2048, 4000, 128, 132)  # a partial last key tile too
    assert hopper.worthwhile(16, 4096, 4096, 256, 132)  # D = 256 too (whole-program JIT)


SPECS = list(hopper.specializations())


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("index", covering(SPECS))  # (every value of each constexpr)
def test_specializations_assemble_for_sm_90a(index):
    assemble_wgmma(*SPECS[index])


def test_other_targets_are_compile_errors():
    kernel, constexprs = next(iter(hopper.specializations()))
    with pytest.raises(kaio.CompileError, match="needs sm_90"):
        kernel.ptx(arch="sm_80", **constexprs)


# --------------------------------------------------------------------------- GPU


def _hopper_gpu() -> bool:
    return kaio.gpu_available() and kaio.device().arch == "sm_90"


@pytest.mark.gpu
@pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d",
    # the third: f16's route at 1024 keys and 2048 tiles (two Q buffers, with or without
    # the mask); the fourth: D64's there (with the mask: tiles from the counter, three
    # stages); the fifth: D64's at 2048 keys and 1536 tiles (the counter too)
    [
        (2, 8, 8, 2048, 2048, 128),
        (2, 8, 2, 2048, 4096, 64),
        (16, 16, 4, 1024, 1024, 128),
        (16, 16, 4, 1024, 1024, 64),
        (6, 16, 4, 2048, 2048, 64),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_flash_attention_takes_the_hopper_kernel(b, h, hkv, sq, sk, d, causal, dtype):
    import torch

    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(sq + d)
    q = torch.randn((b, h, sq, d), device="cuda", dtype=dt, generator=gen)
    k, v = (torch.randn((b, hkv, sk, d), device="cuda", dtype=dt, generator=gen) for _ in "kv")
    (qa, _, _), dims, _ = attention._check_flash("test", q, k, v, None)
    assert attention.hopper_takes(qa, dims)
    out, lse = kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)
    g = h // hkv
    k64, v64 = (x.repeat_interleave(g, dim=1).double() for x in (k, v))
    s = q.double() @ k64.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(~torch.ones((sq, sk), dtype=torch.bool, device="cuda").tril(), -math.inf)
    ref = torch.softmax(s, -1) @ v64
    err = (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()
    assert err < (1e-3 if dtype == "float16" else 1e-2)
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
    assert torch.equal(kaio_ops.flash_attention(q, k, v, causal=causal), out)


def test_operands_are_viewed_without_copies():
    """The tensor maps see q as [B * H * Sq, D]: a view of the caller's array."""
    x = np.zeros((2, 3, 4, 64), np.float16)
    assert np.shares_memory(_arrays.view(x, "numpy", (24, 64)), x)
