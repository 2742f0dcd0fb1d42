"""kaio_ops memory-bound ops: the simulator against NumPy float64 (every op, f32/f16/bf16, odd
and vector-friendly row lengths, aligned and misaligned inputs, rows longer than a block
holds), argument checking, PTX through ptxas for every shipped specialization, and (marked
gpu) the GPU against torch at real sizes."""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import kaio
import kaio_ops
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _arrays, _long_rows, elementwise, rotary, rows
from kaio_ops._common import vector_width
from tests.poison import poison_allocations

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1.5e-2}
SHAPES = [(3, 37), (2, 3, 40), (4, 64), (1, 1)]


# ---------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output an op allocates starts as NaN, so an element nobody wrote fails."""
    poison_allocations(monkeypatch)


def rand(rng, shape, dtype, offset: bool = False, scale: float = 1.0):
    """Random values of ``dtype``; ``offset`` places the array one element past a 16-byte
    boundary, which forces the scalar (unvectorized) path."""
    values = (rng.standard_normal(shape) * scale).astype(dtype)
    return misaligned(values) if offset else values


def misaligned(values, by: int = 1):
    """A copy of ``values`` ``by`` elements past a 16-byte boundary."""
    buf = np.empty(values.size + by, values.dtype)
    out = buf[by:].reshape(values.shape)
    out[...] = values
    return out


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def check(out, ref, dtype):
    out = f64(out)
    assert out.shape == ref.shape
    assert np.isfinite(out).all(), "NaN or inf in the output (an element not written?)"
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err <= TOL[np.dtype(dtype)], f"relative error {err:.3g}"


def ref_silu_gate(x, g):
    return x / (1 + np.exp(-x)) * g


def ref_gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def ref_rms(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def ref_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def ref_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_rope(x, cos, sin, interleaved):
    c, s = (cos[:, None, :], sin[:, None, :]) if x.ndim == 3 else (cos, sin)
    h = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :h], x[..., h:])
    ra, rb = a * c - b * s, b * c + a * s
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :h], out[..., h:] = ra, rb
    return out


def residual_sum(x, r, dtype):
    """residual + x as the op stores it: computed in f32, rounded to the dtype."""
    return f64((r.astype(np.float32) + x.astype(np.float32)).astype(dtype))


# ---------------------------------------------------------------------------- simulator
@pytest.mark.parametrize("offset", [False, True], ids=["aligned", "offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_elementwise_sim(dtype, offset):
    rng = np.random.default_rng(1)
    for shape in SHAPES[:3]:
        x = rand(rng, shape, dtype, offset, scale=3)
        g = rand(rng, shape, dtype, offset)
        row = rand(rng, shape[-1:], dtype, offset)
        with kaio.simulate():
            check(kaio_ops.silu_gate(x, g), ref_silu_gate(f64(x), f64(g)), dtype)
            for form in ("tanh", "none"):
                check(kaio_ops.gelu(x, approximate=form), ref_gelu(f64(x), form), dtype)
            check(kaio_ops.add(x, g), f64(x) + f64(g), dtype)
            check(kaio_ops.mul(x, g), f64(x) * f64(g), dtype)
            check(kaio_ops.add(x, row), f64(x) + f64(row), dtype)
            check(kaio_ops.mul(x, row), f64(x) * f64(row), dtype)


@pytest.mark.parametrize("offset", [0, 1, 3], ids=["aligned", "offset", "x offset"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_row_ops_sim(dtype, offset):
    """offset: every array one element past a 16-byte boundary (VEC 1); "x offset": x and
    the residual only, three elements (SHIFT on the rows of whole chunks)."""
    rng = np.random.default_rng(2)
    for shape in SHAPES:
        n = shape[-1]
        x = misaligned(rand(rng, shape, dtype), offset)
        r = misaligned(rand(rng, shape, dtype), offset)
        w, b = rand(rng, n, dtype, offset == 1), rand(rng, n, dtype, offset == 1)
        with kaio.simulate():
            check(kaio_ops.rms_norm(x, w), ref_rms(f64(x), f64(w)), dtype)
            out, s = kaio_ops.rms_norm_residual(x, r, w, eps=1e-5)
            check(s, residual_sum(x, r, dtype), dtype)
            check(out, ref_rms(residual_sum(x, r, dtype), f64(w), 1e-5), dtype)
            if n > 1:
                check(kaio_ops.layer_norm(x, w, b), ref_layer_norm(f64(x), f64(w), f64(b)), dtype)
            check(kaio_ops.softmax(x), ref_softmax(f64(x)), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_rope_sim(dtype):
    rng = np.random.default_rng(3)
    for shape, offset in [
        ((3, 6), False),
        ((5, 3, 16), False),
        ((4, 2, 64), True),
        ((3, 34), False),
    ]:
        x = rand(rng, shape, dtype, offset)
        theta = rng.uniform(0, 2 * np.pi, (shape[0], shape[-1] // 2))
        cos, sin = np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)
        for interleaved in (False, True):
            with kaio.simulate():
                out = kaio_ops.rope(x, cos, sin, interleaved=interleaved)
            check(out, ref_rope(f64(x), f64(cos), f64(sin), interleaved), dtype)


@pytest.mark.parametrize(
    "n, offset", [(4500, False), (4501, False), (4616, False), (4501, True), (4616, True)]
)
def test_rows_longer_than_a_block_sim(monkeypatch, n, offset):
    """Rows past what the block's registers hold are walked in segments (64 threads here:
    2048 elements a segment), also for softmax with a large offset and masked (-inf) entries;
    4616: 16-byte chunks (VEC 4), the last segment partly filled; 4501: chunks with the rows'
    edges apart (EDGES); offset: x one element past a 16-byte boundary (4501: VEC 1; 4616:
    SHIFT, 64 threads a row: WIDE)."""
    monkeypatch.setattr(rows, "MAX_BLOCK", 64)
    rng = np.random.default_rng(4)
    x = rand(rng, (2, n), np.float32, scale=4) + np.float32(30)
    x[1, ::7] = -np.inf
    x = misaligned(x) if offset else x
    r, w = rand(rng, (2, n), np.float32, offset), rand(rng, n, np.float32)
    b = rand(rng, n, np.float32)
    finite = np.where(np.isinf(x), 0, x)
    with kaio.simulate():
        check(kaio_ops.softmax(x), ref_softmax(f64(x)), np.float32)
        check(kaio_ops.rms_norm(finite, w), ref_rms(f64(finite), f64(w)), np.float32)
        check(
            kaio_ops.layer_norm(finite, w, b), ref_layer_norm(*map(f64, (finite, w, b))), np.float32
        )
        out, s = kaio_ops.rms_norm_residual(finite, r, w)
    check(out, ref_rms(residual_sum(finite, r, np.float32), f64(w)), np.float32)


@pytest.mark.parametrize(
    "dtype, n, offset", [(np.float32, 20000, False), (np.float16, 16391, True)]
)
def test_softmax_rows_for_a_cluster_sim(dtype, n, offset):
    """Rows longer than a block's registers go to a cluster of blocks, each keeping its slice
    in shared memory (kaio_ops._long_rows): 16-byte and scalar paths, a large offset, masked
    (-inf) entries, and a last block with a short slice (n / VEC not a multiple of 8)."""
    rng = np.random.default_rng(6)
    x = rand(rng, (2, n), dtype, offset, scale=4)
    x += dtype(20)
    x[1, ::5] = -np.inf
    vec = 1 if offset else 16 // np.dtype(dtype).itemsize
    assert _long_rows.plan(n, np.dtype(dtype).itemsize, vec) is not None
    with kaio.simulate():
        check(kaio_ops.softmax(x), ref_softmax(f64(x)), dtype)


def test_cluster_path_only_where_it_pays_and_fits():
    plan = _long_rows.plan
    assert plan(_long_rows.MIN_ROW - 1, 4, 4) is None  # one block holds it
    assert plan(262144, 2, 8) == _long_rows.Plan(8, _long_rows.THREADS, 65536, 8, 4, False)
    assert plan(262144, 4, 4) == _long_rows.Plan(16, _long_rows.THREADS, 65536, 4, 4, True, 4, 3)
    assert not plan(65536, 4, 4).persistent  # clusters of 8: one a row
    assert plan(150000, 4, 4).blocks == 4  # 37 KB slices: the register cap, not shared memory
    longest = plan(16 * _long_rows.MAX_SLICE_BYTES // 4, 4, 1)  # 160 KB slices: one an SM
    assert (longest.cluster, longest.shared_bytes, longest.blocks) == (16, 163840, 1)
    for p in (plan(262144, 4, 4), longest, plan(150000, 4, 1)):  # the f32 groups cover a slice
        per = p.shared_bytes // (p.vec * 4)
        assert (p.groups - 1) * p.threads * p.unroll < per
        assert p.groups * p.threads * p.unroll >= per
    assert plan(16 * _long_rows.MAX_SLICE_BYTES // 4 + 4, 4, 4) is None  # too long


def test_softmax_rows_for_a_cluster_of_16_sim():
    """A row whose slices need a cluster of 16 blocks (the non-portable size)."""
    rng = np.random.default_rng(8)
    n = 8 * _long_rows.SLICE_BYTES // 4 + 100
    x = rand(rng, (1, n), np.float32, scale=4)
    assert _long_rows.plan(n, 4, 4).cluster == 16
    with kaio.simulate():
        check(kaio_ops.softmax(x), ref_softmax(f64(x)), np.float32)


def test_softmax_cluster_takes_several_rows_sim():
    """f32's persistent grid: SIM_CLUSTERS clusters take 5 rows in turns (3 and 2), each
    row's slices copied while the previous row is written; 16-byte and scalar chunks."""
    rng = np.random.default_rng(9)
    for offset in (False, True):
        x = rand(rng, (5, 140000), np.float32, offset, scale=4)
        x[3, ::3] = -np.inf
        with kaio.simulate():
            a = _arrays.Inputs("t").array(x, "x")
            p = _long_rows.plan(140000, 4, vector_width(a, multiple_of=140000))
            assert p.persistent and p.vec == (1 if offset else 4)
            assert _long_rows.clusters(a, p, 5) == 2
            check(kaio_ops.softmax(x), ref_softmax(f64(x)), np.float32)


def test_softmax_large_values_sim():
    x = np.array([[1000.0, 999.0, -1000.0, 0.0, 88.0]], np.float32)
    with kaio.simulate():
        check(kaio_ops.softmax(x), ref_softmax(f64(x)), np.float32)


def test_vector_path_taken():
    """The aligned test inputs take the 16-byte path, the offset ones the scalar path."""
    rng = np.random.default_rng(5)
    with kaio.simulate():
        inputs = _arrays.Inputs("t")
        aligned = inputs.array(rand(rng, (2, 64), np.float16), "x")
        offset = inputs.array(rand(rng, (2, 64), np.float16, offset=True), "y")
    assert vector_width(aligned, multiple_of=64) == 8
    assert vector_width(aligned, multiple_of=60) == 1
    assert vector_width(aligned, offset, multiple_of=64) == 1
    with kaio.simulate():
        inputs = _arrays.Inputs("t")
        x = inputs.array(rand(rng, (3, 37), np.float32), "x")
        y = inputs.array(rand(rng, (3, 37), np.float32), "y")
        row = inputs.array(rand(rng, 37, np.float32), "row", ndim=1)
    assert elementwise.plan(x, y) == (False, 4)  # 111 elements: 27 chunks and a tail of 3
    assert elementwise.plan(x, row) == (True, 1)  # a 37-element row cannot hold whole chunks
    assert elementwise.plan(aligned, aligned) == (False, 8)
    # rows of a length that is not a multiple of the chunk, in arrays that start on a
    # 16-byte boundary, take 16-byte chunks with the rows' edges apart (VEC, EDGES, w_lead)
    with kaio.simulate():
        w = _arrays.Inputs("t").array(rand(rng, 64, np.float16), "w", ndim=1)
        w1 = _arrays.Inputs("t").array(rand(rng, 37, np.float32, offset=True), "w", ndim=1)
    assert rows.layout("rms_norm", 37, x, w=row) == (4, True, 0, 0)
    assert rows.layout("rms_norm", 37, x, w=w1) == (4, True, 1, 0)
    assert rows.layout("rms_norm_residual", 37, x, y, row) == (4, True, 0, 0)
    assert rows.layout("softmax", 37, x) == (4, True, 0, 0)
    assert rows.layout("rms_norm", 64, aligned, w=w) == (8, False, 0, 0)
    assert rows.layout("layer_norm", 64, aligned, w=w, b=offset) == (1, False, 0, 0)
    # x (and the residual) one element past a 16-byte boundary, w and b on one: chunks
    # aligned with w and the outputs, x realigned (VEC, EDGES, w_lead, SHIFT)
    assert rows.layout("rms_norm", 64, offset, w=w) == (8, False, 0, 1)
    assert rows.layout("rms_norm_residual", 64, offset, offset, w) == (8, False, 0, 1)
    assert rows.layout("layer_norm", 64, offset, w=w, b=w) == (8, False, 0, 1)
    assert rows.layout("softmax", 64, offset) == (8, False, 0, 1)
    assert rows.layout("rms_norm", 64, offset, w=offset) == (1, False, 0, 0)
    assert rows.layout("rms_norm_residual", 64, offset, aligned, w) == (1, False, 0, 0)
    assert rows.layout("softmax", 60, offset) == (1, False, 0, 0)
    assert rows.layout("softmax", 8, offset) == (1, False, 0, 0)  # one chunk
    assert rows.layout("softmax", 16384, offset) == (8, False, 0, 1)  # 512 threads: WIDE


def test_kernels_per_dtype_have_their_own_cache_keys():
    keys = {
        elementwise._elementwise.specialize({"OP": "add", "BCAST": False, "VEC": 1, "DT": dt}).key
        for dt in _arrays.FLOATS
    }
    assert len(keys) == 3


# ---------------------------------------------------------------------------- errors
def _expect(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


def test_bad_inputs_raise_value_error_naming_the_argument():
    x = np.ones((4, 8), np.float32)
    w = np.ones(8, np.float32)
    with kaio.simulate():
        _expect(
            "argument 'x'.*f32, f16 or bf16, got dtype f64",
            kaio_ops.rms_norm,
            x.astype(np.float64),
            w,
        )
        _expect("argument 'w'.*dtype f16", kaio_ops.rms_norm, x, w.astype(np.float16))
        _expect(r"argument 'w'.*shape \(8,\)", kaio_ops.rms_norm, x, np.ones(7, np.float32))
        _expect(
            r"argument 'x'.*1-D, 2-D or 3-D array \[..., N\]",
            kaio_ops.softmax,
            np.ones((2, 2, 2, 2), np.float32),
        )
        _expect("argument 'x'.*contiguous", kaio_ops.softmax, x[:, ::2])
        _expect("argument 'gate'.*shape", kaio_ops.silu_gate, x, x[:2])
        _expect("argument 'y'.*row vector", kaio_ops.add, x, np.ones(3, np.float32))
        _expect("argument 'residual'", kaio_ops.rms_norm_residual, x, x[:, :4].copy(), w)
        _expect("argument 'b'", kaio_ops.layer_norm, x, w, np.ones(9, np.float32))
        _expect("argument 'x'.*even", kaio_ops.rope, np.ones((4, 7), np.float32), x, x)
        _expect(r"argument 'cos'.*\(4, 4\)", kaio_ops.rope, x, x, x)
        _expect("approximate", kaio_ops.gelu, x, approximate="erf")
        _expect("argument 'x'.*NumPy array inside", kaio_ops.softmax, [[1.0, 2.0]])


def test_numpy_outside_simulate_names_both_ways_out():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="argument 'x'") as e:
        kaio_ops.softmax(x)
    assert "kaio.to_device" in str(e.value) and "kaio.simulate()" in str(e.value)


# ---------------------------------------------------------------------------- PTX
def _shipped():
    for module in (elementwise, rows, rotary):
        yield from module.shipped()


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_every_shipped_specialization_assembles():
    """Every specialization assembles for sm_80 and sm_90 (one test: the two share each
    kernel's IR, built once); on sm_90 the SHIFT kernels that keep the row in f32 registers
    (not PACKED; also under the 512-thread launch bounds, WIDE) do not spill."""
    shipped = list(_shipped())
    assert len(shipped) == 254
    jobs = [(k.ptx(arch=arch, **c), arch) for arch in ("sm_80", "sm_90") for k, c in shipped]
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda job: assemble(*job), jobs))
    sm_90 = reports[len(shipped) :]
    spilled = [
        constexprs
        for (_, constexprs), report in zip(shipped, sm_90, strict=True)
        if constexprs.get("SHIFT")
        and not constexprs["PACKED"]
        and re.search(r"(\d+) bytes spill stores", report)[1] != "0"
    ]
    assert not spilled


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_cluster_softmax_assembles_for_sm_90_only():
    for kernel, constexprs in _long_rows.shipped():
        assemble(kernel.ptx(arch="sm_90", **constexprs), "sm_90")
    kernel, constexprs = next(iter(_long_rows.shipped()))
    with pytest.raises(kaio.CompileError, match="needs sm_90"):
        kernel.ptx(arch="sm_80", **constexprs)


def test_vector_path_uses_16_byte_accesses():
    for shift, packed in [(0, False), (3, False), (3, True)]:  # packed: 512 threads
        ptx = rows._rows.ptx(
            arch="sm_90", OP="rms_norm", VEC=8, EDGES=False, SHIFT=shift, WIDE=packed,
            PACKED=packed, DT=kaio.bf16,
        )  # fmt: skip
        assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
        assert ("shfl.sync.down" in ptx) == (shift > 0)


# ---------------------------------------------------------------------------- GPU
def _torch():
    return pytest.importorskip("torch")


def _torch_dtypes(torch):
    return [torch.float32, torch.float16, torch.bfloat16]


def _torch_check(out, ref, like):
    torch = _torch()
    assert type(out) is torch.Tensor and out.device == like.device and out.dtype == like.dtype
    assert out.shape == ref.shape
    out64, ref64 = out.double(), ref.double()
    assert torch.isfinite(out64).all()
    err = (torch.linalg.norm(out64 - ref64) / torch.linalg.norm(ref64)).item()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[like.dtype]
    assert err <= tol, f"relative error {err:.3g}"


def _misaligned(t, offset: int):
    """``t`` copied to ``offset`` elements past the start of a fresh buffer (offset 1: not on
    a 16-byte boundary, so ops take their scalar path)."""
    if not offset:
        return t
    buf = _torch().empty(t.numel() + offset, device=t.device, dtype=t.dtype)
    out = buf[offset:].view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.gpu
def test_elementwise_gpu_vs_torch():
    torch = _torch()
    F = torch.nn.functional
    for dt in _torch_dtypes(torch):
        for shape, offset in [((4096, 4096), 0), ((3, 1000, 999), 0), ((1000, 1000), 1)]:
            x = _misaligned(torch.randn(shape, device="cuda", dtype=dt) * 3, offset)
            g = _misaligned(torch.randn(shape, device="cuda", dtype=dt), offset)
            row = torch.randn(shape[-1], device="cuda", dtype=dt)
            xf, gf, rf = x.double(), g.double(), row.double()
            _torch_check(kaio_ops.silu_gate(x, g), F.silu(xf) * gf, x)
            _torch_check(kaio_ops.gelu(x), F.gelu(xf, approximate="tanh"), x)
            _torch_check(kaio_ops.gelu(x, approximate="none"), F.gelu(xf), x)
            _torch_check(kaio_ops.add(x, g), xf + gf, x)
            _torch_check(kaio_ops.mul(x, row), xf * rf, x)
            _torch_check(kaio_ops.add(x, row), xf + rf, x)


def _torch_rms(v, w):
    torch = _torch()
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.gpu
def test_row_ops_gpu_vs_torch():
    torch = _torch()
    F = torch.nn.functional
    for dt in _torch_dtypes(torch):
        # offset: x and the residual that many elements past an allocation (w, b aligned):
        # SHIFT where rows are whole chunks (4096; 16384: 512-thread blocks; 40000 +5: in
        # segments), else VEC 1 (30001 +3: in segments); 1001 takes EDGES
        for shape, offset in [
            ((4096, 4096), 0),
            ((2, 300, 1001), 0),
            ((8, 100_000), 0),
            ((1000, 4096), 1),
            ((8, 16384), 1),
            ((8, 40_000), 5),
            ((8, 30_001), 3),
        ]:
            n = shape[-1]
            x = _misaligned(torch.randn(shape, device="cuda", dtype=dt), offset)
            r = _misaligned(torch.randn(shape, device="cuda", dtype=dt), offset)
            w, b = torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
            xf, wf, bf = x.double(), w.double(), b.double()
            _torch_check(kaio_ops.rms_norm(x, w), _torch_rms(xf, wf), x)
            out, s = kaio_ops.rms_norm_residual(x, r, w)
            s_ref = (x.float() + r.float()).to(dt)
            assert torch.equal(s, s_ref)
            _torch_check(out, _torch_rms(s_ref.double(), wf), x)
            _torch_check(kaio_ops.layer_norm(x, w, b), F.layer_norm(xf, (n,), wf, bf, 1e-5), x)
            x8 = _misaligned(x * 8, offset)
            _torch_check(kaio_ops.softmax(x8), torch.softmax(x8.double(), -1), x)


@pytest.mark.gpu
def test_softmax_long_rows_gpu_vs_torch():
    """Rows for a cluster of blocks (sm_90) at the benchmark's size, a misaligned row (scalar
    path) and masked entries; each agrees with the two-pass path to the last bit or so."""
    torch = _torch()
    for dt, shape, offset in [
        (torch.float32, (256, 262144), 0),
        (torch.bfloat16, (64, 262144), 0),
        (torch.float16, (3, 50001), 1),
        (torch.float32, (40, 150001), 1),  # f32's persistent grid, scalar chunks
    ]:
        x = _misaligned(torch.randn(shape, device="cuda", dtype=dt) * 8, offset)
        x[1, ::7] = -float("inf")
        out = kaio_ops.softmax(x)
        _torch_check(out, torch.softmax(x.double(), -1), x)
        two_pass = rows._run("softmax", _arrays.Inputs("softmax").array(x, "x"))
        assert (out.double() - two_pass.double()).abs().max().item() <= 4e-3 * out.max().item()


@pytest.mark.gpu
def test_rope_gpu_vs_torch():
    torch = _torch()
    for dt in _torch_dtypes(torch):
        for shape in [(4096, 32, 128), (1000, 8, 62), (77, 96)]:
            x = torch.randn(shape, device="cuda", dtype=dt)
            theta = torch.rand(shape[0], shape[-1] // 2, device="cuda", dtype=torch.float64) * 6
            cos, sin = theta.cos().to(dt), theta.sin().to(dt)
            for interleaved in (False, True):
                ref = ref_rope(
                    x.double().cpu().numpy(),
                    *(t.double().cpu().numpy() for t in (cos, sin)),
                    interleaved,
                )
                out = kaio_ops.rope(x, cos, sin, interleaved=interleaved)
                _torch_check(out, torch.from_numpy(ref).to("cuda"), x)


@pytest.mark.gpu
def test_device_array_in_device_array_out():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 1024)).astype(np.float16)
    w = rng.standard_normal(1024).astype(np.float16)
    out = kaio_ops.rms_norm(kaio.to_device(x), kaio.to_device(w))
    assert isinstance(out, kaio.DeviceArray) and out.shape == x.shape
    check(out.numpy(), ref_rms(f64(x), f64(w)), np.float16)
    g = rng.standard_normal(x.shape).astype(np.float16)
    check(
        kaio_ops.silu_gate(kaio.to_device(x), kaio.to_device(g)).numpy(),
        ref_silu_gate(f64(x), f64(g)),
        np.float16,
    )


@pytest.mark.gpu
def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 3000)).astype(np.float32)
    out = kaio_ops.softmax(cupy.asarray(x))
    assert isinstance(out, cupy.ndarray)
    check(cupy.asnumpy(out), ref_softmax(f64(x)), np.float32)
