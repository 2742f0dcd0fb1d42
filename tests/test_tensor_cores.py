"""Vector memory, ldmatrix, mma.sync, cp.async, swizzle and tf32 rounding: each kernel runs
in the simulator against an independent NumPy reference (layouts written here from the PTX
ISA's fragment tables, not taken from the simulator), its PTX assembles for sm_80 and sm_90,
and on a GPU it is bit-exact with the simulator (mma's f32 accumulation aside: there the GPU
and the simulator may differ by 1 ulp per accumulated product, k ulps of the magnitude sum).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio import bf16, f16, f32, f64, i32, u16, u32
from kaio.ptx.ptxas import assemble, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
RNG = np.random.default_rng(2026)


# --------------------------------------------------------------------------- kernels


@kaio.gpu_kernel(block_size=64)
def vec_f32(src: f32[:], dst: f32[:]):
    """16-byte global loads, a shared round trip with the neighbour's slot, 16-byte stores."""
    t = kaio.thread_idx_x()
    i = (kaio.block_idx_x() * 64 + t) * 4
    tile = kaio.shared(f32, (64, 4))
    r = kaio.local(f32, 4)
    kaio.load_vector(r, src, i)
    r[0] = r[0] * 2.0
    kaio.store_vector(tile, (t, 0), r)
    kaio.sync_threads()
    kaio.load_vector(r, tile, ((t + 1) % 64, 0))
    kaio.store_vector(dst, i, r)


@kaio.gpu_kernel(block_size=32)
def vec_f16(src: f16[:, :], dst: f16[:, :]):
    """8 f16 in one 16-byte access (16-bit registers travel in pairs)."""
    t = kaio.thread_idx_x()
    r = kaio.local(f16, 8)
    kaio.load_vector(r, src, (t, 8))
    for j in kaio.static_range(8):
        r[j] = r[j] + f16(j)
    kaio.store_vector(dst, (t, 0), r)


@kaio.gpu_kernel(block_size=32)
def vec_reinterpret(src: bf16[:, :], words: u32[:, :], wide: f64[:], back: f64[:]):
    """bf16 pairs read as u32 words (4 and 8 bytes); f64 pairs (16 bytes)."""
    t = kaio.thread_idx_x()
    one = kaio.local(u32, 1)
    two = kaio.local(u32, 2)
    kaio.load_vector(one, src, (t, 0))
    kaio.load_vector(two, src, (t, 4))
    words[t, 0] = one[0]
    kaio.store_vector(words, (t, 2), two)
    d = kaio.local(f64, 2)
    kaio.load_vector(d, wide, t * 2)
    kaio.store_vector(back, t * 2, d)


@kaio.gpu_kernel(block_size=64)
def ldm(src: u16[:, :], rows: u32[:], out: u32[:, :], N: kaio.constexpr, TRANS: kaio.constexpr):
    """Each lane names one 16-byte row of a 64-row shared tile; ldmatrix x{N}."""
    t = kaio.thread_idx_x()
    tile = kaio.shared(u16, (64, 8))
    for j in kaio.static_range(8):
        tile[t, j] = src[t, j]
    kaio.sync_threads()
    frag = kaio.local(u32, N)
    if TRANS:
        kaio.ldmatrix_trans(frag, tile, (rows[t], 0))
    else:
        kaio.ldmatrix(frag, tile, (rows[t], 0))
    for i in kaio.static_range(N):
        out[t, i] = frag[i]


@kaio.gpu_kernel(block_size=64)
def mma_one(a: u32[:, :], b: u32[:, :], c: u32[:, :], d: u32[:, :], KIND: kaio.constexpr):
    """One mma per warp on fragments given per lane as raw 32-bit words."""
    t = kaio.block_idx_x() * 64 + kaio.thread_idx_x()
    acc_type = i32 if KIND == "s8" else f32
    af = kaio.local(u32, 4)
    bf = kaio.local(u32, 2)
    acc = kaio.local(acc_type, 4)
    for i in kaio.static_range(4):
        af[i] = a[t, i]
        acc[i] = kaio.bitcast(c[t, i], acc_type)
    for i in kaio.static_range(2):
        bf[i] = b[t, i]
    if KIND == "f16":
        kaio.mma_f16(acc, af, bf, acc)
    elif KIND == "bf16":
        kaio.mma_bf16(acc, af, bf, acc)
    elif KIND == "s8":
        kaio.mma_s8(acc, af, bf, acc)
    else:
        kaio.mma_tf32(acc, af, bf, acc)
    for i in kaio.static_range(4):
        d[t, i] = kaio.bitcast(acc[i], u32)


@kaio.gpu_kernel(block_size=64)
def cp_async_two_groups(src: f32[:], first: f32[:], second: f32[:], n: i32, NB: kaio.constexpr):
    """Two copy groups of NB bytes per thread; the first is read after wait(1), the second
    after wait(0). Sources past n are zero-filled (src_bytes), sizes 4, 8 or 16."""
    t = i32(kaio.thread_idx_x())
    k = NB // 4
    tile = kaio.shared(f32, (2, 64 * 4))
    for g in kaio.static_range(2):
        i = (t + g * 64) * k
        valid = kaio.max(kaio.min(n - i, k), 0) * 4
        at = kaio.select(valid > 0, i, 0)  # an aligned, in-bounds address when nothing is read
        if NB == 16 and g == 1:
            kaio.cp_async_ca(tile, (g, t * k), src, at, NB, valid)
        else:
            kaio.cp_async(tile, (g, t * k), src, at, NB, valid)
        kaio.cp_async_commit()
    kaio.cp_async_wait(1)
    kaio.sync_threads()
    for j in kaio.static_range(k):
        first[t * k + j] = tile[0, ((t + 1) % 64) * k + j]
    kaio.cp_async_wait(0)
    kaio.sync_threads()
    for j in kaio.static_range(k):
        second[t * k + j] = tile[1, ((t + 1) % 64) * k + j]


@kaio.gpu_kernel(block_size=32)
def cp_async_unwaited(src: f32[:], out: f32[:]):
    """Reads the destination of a copy nobody waited for (a bug the simulator shows)."""
    t = kaio.thread_idx_x()
    tile = kaio.shared(f32, 32)
    kaio.cp_async(tile, t, src, t, 4)
    kaio.cp_async_commit()
    out[t] = tile[t]


@kaio.gpu_kernel(block_size=32)
def cp_async_refill(src: f32[:], out: f32[:], SYNC: kaio.constexpr):
    """A warp's ring slot refilled by cp.async after its lanes read it: lane t reads lane
    t + 1's element, then copies src[t] over its own. The copy may land as soon as it is
    issued, so only a sync_warp in between (SYNC) orders the neighbour's read before it; a
    barrier after the issue (as a ring's for another slot) does not."""
    t = kaio.thread_idx_x()
    tile = kaio.shared(f32, 32)
    tile[t] = f32(t)
    kaio.sync_warp()
    out[t] = tile[(t + 1) % 32]
    if SYNC:
        kaio.sync_warp()
    kaio.cp_async(tile, t, src, t, 4)
    kaio.cp_async_commit()
    kaio.sync_warp()
    kaio.cp_async_wait(0)
    kaio.sync_warp()
    out[t] += tile[(t + 1) % 32]


@kaio.gpu_kernel(block_size=64)
def swizzled(out: i32[:, :], ROWS: kaio.constexpr, COLS: kaio.constexpr, WIDE: kaio.constexpr):
    """The physical column of every [row, col] of a ROWS x COLS tile (f16, or f32 if WIDE)."""
    tile16 = kaio.shared(f16, (ROWS, COLS))
    tile32 = kaio.shared(f32, (ROWS, COLS))
    for r in range(kaio.thread_idx_x(), ROWS, 64):
        for c in range(COLS):
            if WIDE:
                out[r, c] = kaio.swizzle(tile32, r, c)
            else:
                out[r, c] = kaio.swizzle(tile16, r, c)


@kaio.gpu_kernel(block_size=64)
def tf32_round(x: f32[:], y: f32[:]):
    """y = x rounded to tf32."""
    i = kaio.block_idx_x() * 64 + kaio.thread_idx_x()
    y[i] = kaio.to_tf32(x[i])


# --------------------------------------------------------------------------- references


def _pack16(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)


def ldmatrix_reference(src, rows, count, trans):
    """PTX ISA ldmatrix: lane 8*i + r gives row r of matrix i; lane l receives, for matrix
    i, elements (l//4, 2*(l%4)) and (l//4, 2*(l%4)+1), or with .trans (2*(l%4), l//4) and
    (2*(l%4)+1, l//4)."""
    out = np.zeros((64, count), np.uint32)
    for warp in range(2):
        for lane in range(32):
            for i in range(count):
                mat = src[rows[warp * 32 + 8 * i : warp * 32 + 8 * i + 8]]  # 8 x 8
                if trans:
                    lo, hi = mat[2 * (lane % 4), lane // 4], mat[2 * (lane % 4) + 1, lane // 4]
                else:
                    lo, hi = mat[lane // 4, 2 * (lane % 4)], mat[lane // 4, 2 * (lane % 4) + 1]
                out[warp * 32 + lane, i] = _pack16(np.uint16(lo), np.uint16(hi))
    return out


# (row, col) of element e of lane l, g = l // 4, t = l % 4, straight from the PTX ISA's
# "Matrix fragments for mma.m16n8k16 (f16/bf16), mma.m16n8k32 (s8), mma.m16n8k8 (tf32)".
def _layouts(kind):
    if kind in ("f16", "bf16"):
        a = lambda g, t, e: (g + 8 * ((e // 2) % 2), 2 * t + e % 2 + 8 * (e // 4))  # noqa: E731
        b = lambda g, t, e: (2 * t + e % 2 + 8 * (e // 2), g)  # noqa: E731
        return (16, 8, 16), 8, 4, a, b
    if kind == "s8":
        a = lambda g, t, e: (g + 8 * ((e // 4) % 2), 4 * t + e % 4 + 16 * (e // 8))  # noqa: E731
        b = lambda g, t, e: (4 * t + e % 4 + 16 * (e // 4), g)  # noqa: E731
        return (16, 8, 32), 16, 8, a, b
    a = lambda g, t, e: (g + 8 * (e % 2), t + 4 * (e // 2))  # noqa: E731
    b = lambda g, t, e: (t + 4 * e, g)  # noqa: E731
    return (16, 8, 8), 4, 2, a, b


def _acc_at(g, t, e):
    return g + 8 * (e // 2), 2 * t + e % 2


_ELEMENT = {
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "s8": np.int8,
    "tf32": np.float32,
}


def mma_case(kind, warps=4, rng=RNG):
    """Random A, B, C per warp; the per-lane words; and the exact D in float64 / int64."""
    (m, n, k), a_count, b_count, a_at, b_at = _layouts(kind)
    dt = _ELEMENT[kind]
    lanes = warps * 32
    a_words = np.zeros((lanes, a_count * np.dtype(dt).itemsize // 4), np.uint32)
    b_words = np.zeros((lanes, b_count * np.dtype(dt).itemsize // 4), np.uint32)
    c = np.zeros((lanes, 4), np.uint32)
    expected = np.zeros((lanes, 4))
    sums = np.zeros((lanes, 4))
    for w in range(warps):
        if kind == "s8":
            A = rng.integers(-128, 128, (m, k)).astype(np.int8)
            B = rng.integers(-128, 128, (k, n)).astype(np.int8)
            C = rng.integers(-(2**31), 2**31, (m, n)).astype(np.int32)
        else:
            A = rng.standard_normal((m, k)).astype(dt)
            B = rng.standard_normal((k, n)).astype(dt)
            C = rng.standard_normal((m, n)).astype(np.float32)
        if kind == "tf32":  # inputs exactly representable: the truncation rule is not tested
            A = (A.view(np.uint32) & 0xFFFFE000).view(np.float32)
            B = (B.view(np.uint32) & 0xFFFFE000).view(np.float32)
        wide = np.int64 if kind == "s8" else np.float64
        D = A.astype(wide) @ B.astype(wide) + C.astype(wide)
        S = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)) + np.abs(C)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            row = w * 32 + lane
            a_elems = np.array([A[a_at(g, t, e)] for e in range(a_count)], dt)
            b_elems = np.array([B[b_at(g, t, e)] for e in range(b_count)], dt)
            a_words[row] = a_elems.view(np.uint32)
            b_words[row] = b_elems.view(np.uint32)
            for e in range(4):
                c[row, e] = np.asarray(C[_acc_at(g, t, e)]).view(np.uint32)
                expected[row, e] = D[_acc_at(g, t, e)]
                sums[row, e] = S[_acc_at(g, t, e)]
    if kind == "s8":
        expected = expected.astype(np.int64).astype(np.int32)  # wraps like the hardware
    return [a_words, b_words, c, np.full((lanes, 4), 0xDEADBEEF, np.uint32)], expected, sums


def tf32_reference(x: np.ndarray) -> np.ndarray:
    """Round to 10 mantissa bits, ties away from zero, computed in float64."""
    wide = x.astype(np.float64)
    _, exp = np.frexp(wide)  # |x| = m * 2**exp, m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(exp, -125) - 11)  # subnormals keep the fixed quantum
    rounded = np.copysign(np.floor(np.abs(wide) / quantum + 0.5) * quantum, wide)
    return np.where(np.isfinite(x), rounded.astype(np.float32), x)


# --------------------------------------------------------------------------- cases


def _vector_cases():
    src = RNG.standard_normal(512).astype(np.float32)
    out = np.full(512, np.nan, np.float32)
    cases = [("vec_f32", vec_f32, 2, [src, out], {})]
    h = RNG.standard_normal((32, 16)).astype(np.float16)
    cases.append(("vec_f16", vec_f16, 1, [h, np.full((32, 8), np.nan, np.float16)], {}))
    bf = RNG.standard_normal((32, 8)).astype(ml_dtypes.bfloat16)
    words = np.full((32, 4), 0xFFFFFFFF, np.uint32)
    wide = RNG.standard_normal(64)
    cases.append(
        ("vec_reinterpret", vec_reinterpret, 1, [bf, words, wide, np.full(64, np.nan)], {})
    )
    return cases


def _vector_expected(name, args):
    if name == "vec_f32":
        x = args[0].reshape(-1, 64, 4).copy()
        x[:, :, 0] *= 2
        return {1: np.roll(x, -1, axis=1).reshape(-1)}
    if name == "vec_f16":
        return {1: (args[0][:, 8:] + np.arange(8, dtype=np.float16)).astype(np.float16)}
    bits = args[0].view(np.uint16)
    words = _pack16(bits[:, 0::2], bits[:, 1::2])
    return {
        1: np.concatenate([words[:, :1], np.full((32, 1), 0xFFFFFFFF), words[:, 2:]], 1),
        3: args[2],
    }


def _ldmatrix_args(count):
    src = RNG.integers(0, 2**16, (64, 8)).astype(np.uint16)
    rows = np.concatenate([RNG.permutation(64)[:32] for _ in range(2)]).astype(np.uint32)
    return [src, rows, np.full((64, count), 0xFFFFFFFF, np.uint32)]


def _cp_args(nbytes):
    """The last copies are partly or wholly past ``n``; the source array itself reaches the end
    of every copy (compute-sanitizer's memcheck counts a copy's whole size against the
    allocation, src_bytes or not), and holds nonzero values past ``n`` that must not land."""
    k = nbytes // 4
    src = RNG.standard_normal(2 * 64 * k).astype(np.float32)
    n = src.size - 7
    return [src, np.full(64 * k, np.nan, np.float32), np.full(64 * k, np.nan, np.float32), n]


def _cp_expected(args, nbytes):
    src, n, k = args[0], args[3], nbytes // 4
    padded = np.zeros(2 * 64 * k, np.float32)
    padded[:n] = src[:n]
    groups = padded.reshape(2, 64, k)
    return {1: np.roll(groups[0], -1, axis=0).reshape(-1), 2: np.roll(groups[1], -1, 0).ravel()}


# --------------------------------------------------------------------------- simulator tests


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want).astype(got.dtype)
    assert got.shape == want.shape
    g = got.view(f"u{got.itemsize}")
    w = want.view(f"u{got.itemsize}")
    bad = np.argwhere(g != w)
    assert not len(bad), (
        f"{len(bad)} elements differ; first at {tuple(bad[0])}: "
        f"{got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )


@pytest.mark.parametrize("case", _vector_cases(), ids=lambda c: c[0])
def test_vector_memory_in_simulator(case):
    name, kernel, grid, args, consts = case
    run = [a.copy() for a in args]
    kernel.sim[grid](*run, **consts)
    for index, want in _vector_expected(name, args).items():
        _same_bits(run[index], want)


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_in_simulator(count, trans):
    args = _ldmatrix_args(count)
    ldm.sim[1](*args, N=count, TRANS=trans)
    _same_bits(args[2], ldmatrix_reference(args[0], args[1], count, trans))


@pytest.mark.parametrize("kind", ["f16", "bf16", "s8", "tf32"])
def test_mma_in_simulator(kind):
    args, expected, sums = mma_case(kind)
    mma_one.sim[2](*args, KIND=kind)
    if kind == "s8":
        _same_bits(args[3].view(np.int32), expected)
    else:
        got = args[3].view(np.float32).astype(np.float64)
        assert np.all(np.abs(got - expected) <= 2.0**-23 * sums)  # one rounding of the sum


@pytest.mark.parametrize("nbytes", [4, 8, 16])
def test_cp_async_groups_and_zero_fill_in_simulator(nbytes):
    args = _cp_args(nbytes)
    run = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    cp_async_two_groups.sim[1](*run, NB=nbytes)
    for index, want in _cp_expected(args, nbytes).items():
        _same_bits(run[index], want)


def test_unwaited_copy_reads_old_shared_memory_in_simulator():
    src = RNG.standard_normal(32).astype(np.float32)
    out = np.zeros(32, np.float32)
    cp_async_unwaited.sim[1](src, out)
    assert np.isnan(out).all()  # fresh shared memory is poison until the wait lands the copy


def test_cp_async_over_another_lanes_read_is_a_race_in_simulator():
    """The race detector checks a copy's write when it is issued (not only at the wait that
    lands it): a read of the slot by another lane before it needs a barrier in between."""
    src = RNG.standard_normal(32).astype(np.float32)
    with pytest.raises(
        kaio.SimulationError, match=r"(?s)race on 'tile\w*'\[0\].*writes it.*read it"
    ):
        cp_async_refill.sim[1](src, np.zeros(32, np.float32), SYNC=False)
    out = np.full(32, np.nan, np.float32)
    cp_async_refill.sim[1](src, out, SYNC=True)
    np.testing.assert_array_equal(out, (np.arange(1, 33, dtype=np.float32) % 32) + np.roll(src, -1))


@pytest.mark.parametrize(
    "rows, cols, wide",
    [(16, 64, False), (16, 32, False), (16, 16, False), (16, 32, True), (8, 128, False)],
)
def test_swizzle_is_a_conflict_free_permutation(rows, cols, wide):
    out = np.full((rows, cols), -1, np.int32)
    swizzled.sim[1](out, ROWS=rows, COLS=cols, WIDE=wide)
    itemsize = 4 if wide else 2
    per_chunk = 16 // itemsize
    for r in range(rows):
        assert sorted(out[r]) == list(range(cols)), "each row is permuted within itself"
        assert np.all(out[r] % per_chunk == np.arange(cols) % per_chunk), "chunks move whole"
    for r0 in range(0, rows, 8):
        for c in range(0, cols, per_chunk):  # 8 rows at one logical chunk: ldmatrix, cp_async
            byte = np.arange(r0, r0 + 8) * cols * itemsize + out[r0 : r0 + 8, c] * itemsize
            assert len(set(byte % 128 // 16)) == 8, "8 rows hit 8 different bank groups"


def test_to_tf32_in_simulator():
    x = np.concatenate(
        [
            RNG.standard_normal(250).astype(np.float32),
            np.float32([np.inf, -np.inf, 0, -0.0, 3.4e38, 1e-40]),
        ]
    )
    y = np.full(256, np.nan, np.float32)
    tf32_round.sim[4](x, y)
    _same_bits(y, tf32_reference(x))


def test_example_matmul_runs_in_simulator():
    import runpy

    runpy.run_path("examples/tensor_core_matmul.py", run_name="__main__")


# --------------------------------------------------------------------------- errors


def test_mma_for_sm75_names_the_builtin_and_the_arch():
    with pytest.raises(kaio.CompileError, match=r"kaio.mma_f16\(\) needs sm_80 or newer"):
        mma_one.ptx(arch="sm_75", KIND="f16")


def test_wrong_fragment_size_is_a_compile_error():
    @kaio.gpu_kernel(block_size=32)
    def bad(x: f32[:]):
        acc = kaio.local(f32, 2)
        a = kaio.local(u32, 4)
        b = kaio.local(u32, 2)
        kaio.mma_f16(acc, a, b, acc)

    with pytest.raises(kaio.CompileError, match=r"d is 4 x f32 registers"):
        bad.ptx()


def test_fragment_indexed_at_runtime_is_a_compile_error():
    @kaio.gpu_kernel(block_size=32)
    def bad(x: u32[:]):
        frag = kaio.local(u32, 4)
        tile = kaio.shared(u16, (32, 8))
        kaio.ldmatrix(frag, tile, (kaio.lane_id(), 0))
        x[0] = frag[kaio.lane_id() % 4]

    with pytest.raises(kaio.CompileError, match="index it only with compile-time constants"):
        bad.ptx()


def test_vector_size_is_checked():
    @kaio.gpu_kernel(block_size=32)
    def bad(x: f32[:]):
        r = kaio.local(f32, 3)
        kaio.load_vector(r, x, 0)

    with pytest.raises(kaio.CompileError, match="moves 4, 8 or 16 bytes"):
        bad.ptx()


def test_misaligned_vector_access_is_reported_by_the_simulator():
    src = RNG.standard_normal(512).astype(np.float32)
    with pytest.raises(kaio.SimulationError, match="misaligned 16-byte vector load"):
        vec_f32.sim[1](src[1:257], np.zeros(256, np.float32))


def test_prefetch_l2_checks_bounds_and_changes_no_value():
    """kaio.prefetch_l2 is a hint (prefetch.global.L2 in both backends): the simulator only
    checks that the element exists, and refuses shared arrays at compile time."""

    @kaio.gpu_kernel(block_size=32)
    def ahead(x: f32[:, :], out: f32[:], D: kaio.constexpr):
        i = kaio.thread_idx_x()
        kaio.prefetch_l2(x, (i // 8 + D, i % 8))
        out[i] = x[i // 8, i % 8] * 2.0

    x = RNG.standard_normal((6, 8)).astype(np.float32)
    out = np.full(32, np.nan, np.float32)
    ahead.sim[1](x, out, D=2)
    np.testing.assert_array_equal(out, x[:4].ravel() * 2)
    with pytest.raises(kaio.SimulationError, match="L2 prefetch"):
        ahead.sim[1](x, out, D=3)
    for backend in ("ptx", "llvm"):
        assert "prefetch.global.L2" in ahead.ptx(arch="sm_80", backend=backend, D=0)

    @kaio.gpu_kernel(block_size=32)
    def bad(x: f32[:]):
        tile = kaio.shared(f32, 32)
        kaio.prefetch_l2(tile, kaio.lane_id())
        x[0] = tile[0]

    with pytest.raises(kaio.CompileError, match="needs a global array"):
        bad.ptx()


def test_l2_fetch_size_and_bulk_prefetch():
    """load_vector's l2 (ld.global.L2::256B, sm_80+) loads the same values; prefetch_l2 with
    a size is cp.async.bulk.prefetch.L2 (sm_90+), its whole span checked for bounds."""

    @kaio.gpu_kernel(block_size=32)
    def hinted(x: f32[:, :], out: f32[:, :], NB: kaio.constexpr):
        i = kaio.thread_idx_x()
        kaio.prefetch_l2(x, (i // 4, 4 * (i % 4)), NB)
        r = kaio.local(f32, 4)
        kaio.load_vector(r, x, (i // 4, 4 * (i % 4)), 256)
        kaio.store_vector(out, (i // 4, 4 * (i % 4)), r)

    x = RNG.standard_normal((8, 16)).astype(np.float32)
    out = np.full((8, 16), np.nan, np.float32)
    hinted.sim[1](x, out, NB=16)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(kaio.SimulationError, match="L2 prefetch"):
        hinted.sim[1](x, out, NB=32)  # lanes 4 i + 3 ask for 4 floats past their row
    for backend in ("ptx", "llvm"):
        text = hinted.ptx(arch="sm_90", backend=backend, NB=16)
        assert "ld.global.L2::256B.v4" in text and "cp.async.bulk.prefetch.L2.global" in text
    with pytest.raises(kaio.CompileError, match="needs sm_90"):
        hinted.ptx(arch="sm_80", NB=16)


@kaio.gpu_kernel(block_size=32)
def cached(x: f32[:, :], out: f32[:, :], C: kaio.constexpr, L2: kaio.constexpr):
    """out = x, each lane's 16 bytes by one load_vector with cache operator C."""
    i = kaio.thread_idx_x()
    r = kaio.local(f32, 4)
    kaio.load_vector(r, x, (i // 4, 4 * (i % 4)), L2, C)
    kaio.store_vector(out, (i // 4, 4 * (i % 4)), r)


def test_load_vector_cache_operator():
    """load_vector's cache ('cg': L2 only, 'cs': streaming, 'nc': the read-only path, an L1
    eviction priority) loads the same values, is ld.global.cg / .cs / .nc /
    .L1::evict_last in both backends (before the L2 fetch size), and is refused for a shared
    array or an unknown operator."""
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    out = np.full((8, 16), np.nan, np.float32)
    cached.sim[1](x, out, C="cg", L2=0)
    np.testing.assert_array_equal(out, x)
    for backend in ("ptx", "llvm"):
        assert "ld.global.cg.v4" in cached.ptx(arch="sm_80", backend=backend, C="cg", L2=0)
        text = cached.ptx(arch="sm_80", backend=backend, C="cs", L2=128)
        assert "ld.global.cs.L2::128B.v4" in text
        assert "ld.global.nc.v4" in cached.ptx(arch="sm_80", backend=backend, C="nc", L2=0)
        text = cached.ptx(arch="sm_80", backend=backend, C="L1::evict_last", L2=128)
        assert "ld.global.L1::evict_last.L2::128B.v4" in text
    assemble(cached.ptx(arch="sm_80", C="cs", L2=128), "sm_80")
    assemble(cached.ptx(arch="sm_80", C="L1::evict_last", L2=128), "sm_80")
    assemble(cached.ptx(arch="sm_80", C="nc", L2=0), "sm_80")
    with pytest.raises(kaio.CompileError, match="cache is one of"):
        cached.ptx(C="lu", L2=0)

    @kaio.gpu_kernel(block_size=32)
    def bad(x: f32[:]):
        tile = kaio.shared(f32, 32)
        r = kaio.local(f32, 4)
        kaio.load_vector(r, tile, 0, 0, "cg")
        x[0] = r[0]

    with pytest.raises(kaio.CompileError, match="for a shared array"):
        bad.ptx()


# --------------------------------------------------------------------------- PTX

PTX_CASES = [
    (vec_f32, {}),
    (vec_f16, {}),
    (vec_reinterpret, {}),
    *[(ldm, {"N": n, "TRANS": t}) for n in (1, 2, 4) for t in (False, True)],
    *[(mma_one, {"KIND": k}) for k in ("f16", "bf16", "s8", "tf32")],
    *[(cp_async_two_groups, {"NB": n}) for n in (4, 8, 16)],
    (swizzled, {"ROWS": 16, "COLS": 64, "WIDE": False}),
    (tf32_round, {}),
]


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kernel, consts", PTX_CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_ptx_assembles(kernel, consts, arch):
    assemble(kernel.ptx(arch=arch, **consts), arch)


# --------------------------------------------------------------------------- GPU


def _on_gpu(kernel, grid, args, consts):
    dev = [kaio.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    kernel[grid](*dev, **consts)
    return [d.numpy() if isinstance(d, kaio.DeviceArray) else d for d in dev]


def _both(kernel, grid, args, consts):
    sim = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel.sim[grid](*sim, **consts)
    return sim, _on_gpu(kernel, grid, args, consts)


@pytest.mark.gpu
def test_gpu_load_vector_cache_operator():
    """On the GPU, ld.global.cg and .cs (with and without an L2 fetch size) load exactly
    the values: every element against the input, the output poisoned first."""
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    for c, l2 in (("cg", 0), ("cs", 128), ("cg", 256)):
        out = _on_gpu(cached, 1, [x, np.full((8, 16), np.nan, np.float32)], {"C": c, "L2": l2})
        np.testing.assert_array_equal(out[1], x, err_msg=c)


@pytest.mark.gpu
def test_gpu_bit_exact_with_simulator_vectors_ldmatrix_cp_async_tf32():
    runs = [(k, g, a, c) for _, k, g, a, c in _vector_cases()]
    runs += [(ldm, 1, _ldmatrix_args(n), {"N": n, "TRANS": t}) for n in (1, 2, 4) for t in (0, 1)]
    runs += [(cp_async_two_groups, 1, _cp_args(n), {"NB": n}) for n in (4, 8, 16)]
    x = RNG.standard_normal(256).astype(np.float32) * np.float32(1e3)
    runs.append((tf32_round, 4, [x, np.full(256, np.nan, np.float32)], {}))
    for kernel, grid, args, consts in runs:
        sim, gpu = _both(kernel, grid, args, consts)
        for s, g in zip(sim, gpu, strict=True):
            if isinstance(s, np.ndarray):
                _same_bits(g, s)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["f16", "bf16", "s8", "tf32"])
def test_gpu_mma_matches_simulator_and_numpy(kind):
    args, expected, sums = mma_case(kind, warps=8)
    sim, gpu = _both(mma_one, 4, args, {"KIND": kind})
    if kind == "s8":
        _same_bits(gpu[3], sim[3])
        return
    k = {"f16": 16, "bf16": 16, "tf32": 8}[kind]
    g = gpu[3].view(np.float32).astype(np.float64)
    s = sim[3].view(np.float32).astype(np.float64)
    # 1 ulp (2^-23 relative to the magnitude sum) per accumulated product, k + 1 in all.
    assert np.all(np.abs(g - s) <= (k + 1) * 2.0**-23 * sums)
    assert np.all(np.abs(g - expected) <= (k + 1) * 2.0**-23 * sums)


@pytest.mark.gpu
def test_gpu_example_matmul():
    import runpy

    runpy.run_path("examples/tensor_core_matmul.py", run_name="__main__")


@kaio.gpu_kernel
def bounded(x: f32[:], N: kaio.constexpr):
    """Declares its block size to ptxas."""
    kaio.launch_bounds(N, 2)
    x[kaio.thread_idx_x()] = 1.0


def test_launch_bounds_reach_ptx_and_the_simulator():
    ptx = bounded.ptx(N=64)
    assert ".maxntid 64, 1, 1" in ptx and ".minnctapersm 2" in ptx
    x = np.zeros(128, np.float32)
    bounded.sim[1, 64](x, N=64)
    assert x[:64].sum() == 64 and x[64:].sum() == 0
    with pytest.raises(kaio.LaunchError, match=r"launch_bounds\(64\) but was launched with 128"):
        bounded.sim[1, 128](x, N=64)
    if find_ptxas() is not None:
        assemble(ptx, "sm_90")
