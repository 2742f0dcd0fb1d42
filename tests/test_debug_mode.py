"""Debug mode (``@kaio.gpu_kernel(debug=True)``, ``KAIO_DEBUG=1``): bounds checks in the PTX,
their error record, and (marked gpu) the reports on a GPU, after which the context still
works. Without debug nothing of it is emitted."""

from __future__ import annotations

import inspect
import os
import struct
import subprocess
import sys
import textwrap
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kaio
from kaio import f32, i32, u32
from kaio.ptx.debug import RECORD, RECORD_BYTES, declares_record
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio.runtime.debug import DebugRecord, describe_record, parse_sites
from tests.catalog import CASES
from tests.test_runtime_cpu import fake_device_array, fake_driver  # noqa: F401 (a fixture)

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@kaio.gpu_kernel(block_size=64, debug=True)
def gather(x: f32[:], idx: i32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[idx[i]]  # GATHER


@kaio.gpu_kernel(block_size=64, debug=True)
def shared_shift(x: f32[:], out: f32[:], k: u32):
    s = kaio.shared(f32, (64,))
    t = kaio.thread_idx_x()
    s[t + k] = x[t]  # SHARED
    kaio.sync_threads()
    out[t] = s[t]


@kaio.gpu_kernel(block_size=(8, 8), debug=True)
def grid2d(y: f32[:, :], out: f32[:, :], j0: i32):
    i = kaio.thread_idx_y()
    j = i32(kaio.thread_idx_x()) + j0
    out[i, kaio.thread_idx_x()] = y[i, j]  # GRID2D


@kaio.gpu_kernel(block_size=32, debug=True)
def dynamic(out: f32[:]):
    d = kaio.shared_dynamic(f32)
    t = kaio.thread_idx_x()
    d[t] = f32(t)  # DYNAMIC
    kaio.sync_threads()
    out[t] = d[31 - t]


@kaio.gpu_kernel(block_size=32, debug=True)
def dynamic_view(out: f32[:]):
    d = kaio.shared_dynamic(f32, (32,))
    t = kaio.thread_idx_x()
    d[t] = f32(t)  # VIEW
    kaio.sync_threads()
    out[t] = d[31 - t]


@kaio.gpu_kernel(block_size=32, debug=True)
def vectors(x: f32[:], out: f32[:], start: u32):
    t = kaio.thread_idx_x()
    regs = kaio.local(f32, 4)
    kaio.load_vector(regs, x, start + 4 * t)  # VECTOR
    kaio.store_vector(out, 4 * t, regs)


@kaio.gpu_kernel(block_size=32, debug=True)
def counts(bins: u32[:], keys: i32[:]):
    t = kaio.thread_idx_x()
    kaio.atomic_add(bins, keys[t], 1)  # ATOMIC


@kaio.gpu_kernel(block_size=64)
def plain_gather(x: f32[:], idx: i32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[idx[i]]


def _line(marker: str) -> int:
    lines, _ = inspect.getsourcelines(sys.modules[__name__])
    return next(k + 1 for k, line in enumerate(lines) if f"# {marker}" in line)


def debug_twin(kernel: kaio.Kernel) -> kaio.Kernel:
    """The same kernel compiled in debug mode."""
    return kaio.Kernel(kernel.pyfunc, block_size=kernel.block_size, arch=kernel.arch, debug=True)


# ----------------------------------------------------------------------------- PTX (CPU)
def test_debug_off_emits_nothing():
    ptx = plain_gather.ptx()
    assert "kaio_debug" not in ptx and "oob" not in ptx and "exit" not in ptx
    assert not declares_record(ptx) and declares_record(gather.ptx())
    twin = debug_twin(plain_gather).ptx()
    body = twin.split(".param .u64 kaio_debug", 1)
    assert len(body) == 2 and body[1].lstrip().startswith(")")  # the last parameter
    assert twin.count("setp.ge.u64") >= 3 and "atom.global.cas.b32" in twin and "exit;" in twin


def test_debug_is_part_of_every_cache_key(monkeypatch):
    twin = debug_twin(plain_gather)
    assert twin.specialize().key != plain_gather.specialize().key
    monkeypatch.setenv("KAIO_DEBUG", "1")
    assert kaio.Kernel(plain_gather.pyfunc, block_size=64).debug
    monkeypatch.setenv("KAIO_DEBUG", "0")
    assert not kaio.Kernel(plain_gather.pyfunc, block_size=64).debug
    kernel = kaio.Kernel(plain_gather.pyfunc, block_size=64)
    plain = kernel.specialize()
    kernel.debug = True  # the in-memory cache follows the flag too
    checked = kernel.specialize()
    assert checked is not plain and checked.key != plain.key
    assert "kaio_debug" in checked.ptx("sm_90") and "kaio_debug" not in plain.ptx("sm_90")


def test_sites_describe_every_checked_access():
    sites = parse_sites(gather.ptx())
    by_array = {(s["what"], s["array"]) for s in sites.values()}
    assert by_array == {("load", "idx"), ("load", "x"), ("store", "out")}
    (x_site,) = [s for s in sites.values() if s["array"] == "x"]
    assert x_site["line"] == _line("GATHER") and x_site["signed"] == [True]
    vector = parse_sites(vectors.ptx())
    assert {tuple(s["checks"]) for s in vector.values() if "vector" in s["what"]} == {
        ("dim", "end")
    }
    view = parse_sites(dynamic_view.ptx())
    dyn = {tuple(s["checks"]) for s in view.values() if s["space"] == "shared_dyn"}
    assert dyn == {("dim", "dynamic")}


def _assemble_all(texts, arch):
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda text: assemble(text, arch), texts))


@needs_ptxas
def test_debug_ptx_of_every_catalog_and_test_kernel_assembles():
    kernels = [gather, shared_shift, grid2d, dynamic, dynamic_view, vectors, counts]
    texts = [k.ptx(arch="sm_90") for k in kernels]
    texts += [debug_twin(c.kernel).ptx(arch="sm_90", **c.constexprs) for c in CASES]
    _assemble_all(texts, "sm_90")


@needs_ptxas
def test_debug_ptx_of_op_kernels_assembles():
    """The op library's kernels (tensor cores, ldmatrix, cp.async, 16-byte vectors, swizzled
    shared memory) in debug mode, a few specializations each."""
    from tests.test_ops_matmul import specializations
    from tests.test_ops_memory import _shipped

    matmuls = list(specializations())
    chosen = [matmuls[0], matmuls[1], matmuls[3]] + list(_shipped())[::13]
    texts = [debug_twin(k).ptx(arch="sm_80", **c) for k, c in chosen]
    _assemble_all(texts, "sm_80")


# ----------------------------------------------------------------------------- the record
def _record(site: int, index, shape, thread, block, value=0, limit=0) -> bytes:
    raw = bytearray(RECORD_BYTES)
    struct.pack_into("<2I", raw, RECORD["flag"], 1, site)
    struct.pack_into("<3I", raw, RECORD["thread"], *thread)
    struct.pack_into("<3I", raw, RECORD["block"], *block)
    struct.pack_into("<2Q", raw, RECORD["value"], value, limit)
    for d, (i, n) in enumerate(zip(index, shape, strict=True)):
        struct.pack_into("<Q", raw, RECORD["index"] + 8 * d, i % 2**64)
        struct.pack_into("<Q", raw, RECORD["shape"] + 8 * d, n)
    return bytes(raw)


def test_record_names_kernel_array_index_thread_block_and_line():
    sites = parse_sites(gather.ptx())
    (number,) = [n for n, s in sites.items() if s["array"] == "x"]
    raw = _record(number, [-1], [100], (37, 0, 0), (1, 0, 0))
    err = describe_record("gather", sites, raw)
    assert isinstance(err, kaio.OutOfBoundsError) and isinstance(err, kaio.CudaError)
    text = str(err)
    assert f"test_debug_mode.py:{_line('GATHER')}:" in text
    assert "out-of-bounds load of global array 'x' (shape (100,)) at index [-1]" in text
    assert "thread (37, 0, 0) of block (1, 0, 0) in kernel gather" in text
    assert "out[i] = x[idx[i]]" in text.splitlines()[-1]
    assert (err.array, err.index, err.thread, err.block, err.lineno) == (
        "x",
        (-1,),
        (37, 0, 0),
        (1, 0, 0),
        _line("GATHER"),
    )
    assert describe_record("gather", sites, bytes(RECORD_BYTES)) is None


def test_record_explains_vector_ends_and_short_dynamic_shared():
    sites = parse_sites(vectors.ptx())
    (load,) = [n for n, s in sites.items() if s["what"] == "vector load"]
    raw = _record(load, [126], [128], (31, 0, 0), (0, 0, 0), value=129)
    assert "reaches element 129 of the last dimension" in str(describe_record("v", sites, raw))
    sites = parse_sites(dynamic_view.ptx())
    (store,) = [n for n, s in sites.items() if s["what"] == "store" and s["space"] == "shared_dyn"]
    raw = _record(store, [0], [32], (0, 0, 0), (0, 0, 0), limit=64)
    text = str(describe_record("dynamic_view", sites, raw))
    assert "ends at byte 128 of dynamic shared memory, but the launch gave 64 bytes" in text


def test_debug_launcher_passes_the_record_and_checks_after_each_launch(fake_driver):  # noqa: F811
    """The generated launcher of a debug kernel appends the record's address to the parameter
    buffer and calls the record's check with the stream after launching."""
    from kaio.runtime.arguments import describe
    from kaio.runtime.launcher import build_launcher

    calls, loaded = fake_driver
    checked = []
    loaded.debug = types.SimpleNamespace(
        pointer=0xDEB6,
        check=checked.append,
        extend_format=DebugRecord.extend_format,
        refuse_capture=lambda stream: checked.append(("capturing?", stream)),
    )
    x = fake_device_array(loaded.device, 0x1000, (8,), (4,))
    idx = fake_device_array(loaded.device, 0x2000, (8,), (4,))
    args = (x, idx, x, 8)
    infos = {k: describe(a) for k, a in enumerate(args) if not isinstance(a, int)}
    loaded.params = gather.specialize().function.params
    bind = build_launcher(gather, gather.specialize(), loaded, args, infos)
    assert bind((1, 1, 1), (64, 1, 1), 0, 0x55)(args)
    fields = struct.unpack("=QqQqQqIxxxxQ", calls[-1][5][:64])
    assert calls[-1][6][-1] == 56  # the record address, 8-byte aligned after n
    assert fields == (0x1000, 8, 0x2000, 8, 0x1000, 8, 8, 0xDEB6)
    assert checked == [("capturing?", 0x55), 0x55]


# ----------------------------------------------------------------------------- GPU
def _dev(a):
    return kaio.to_device(np.ascontiguousarray(a))


@pytest.mark.gpu
def test_gpu_out_of_bounds_load_is_reported_and_the_context_survives():
    n = 200
    x = np.arange(100, dtype=np.float32)
    idx = np.arange(n, dtype=np.int32) % 100
    idx[101] = -1  # thread 37 of block 1
    out = kaio.zeros(n, f32)
    with pytest.raises(kaio.OutOfBoundsError) as info:
        gather[(n + 63) // 64](_dev(x), _dev(idx), out, n)
    err = info.value
    assert (err.kernel, err.array, err.index, err.shape) == ("gather", "x", (-1,), (100,))
    assert (err.thread, err.block, err.lineno) == ((37, 0, 0), (1, 0, 0), _line("GATHER"))
    assert "out[i] = x[idx[i]]" in str(err)
    idx[101] = 5
    gather[(n + 63) // 64](_dev(x), _dev(idx), out, n)  # the same process goes on
    np.testing.assert_array_equal(out.numpy(), x[idx])
    plain = kaio.zeros(n, f32)
    plain_gather[(n + 63) // 64](_dev(x), _dev(idx), plain, n)
    np.testing.assert_array_equal(plain.numpy(), out.numpy())


@pytest.mark.gpu
def test_gpu_shared_two_d_atomic_and_vector_accesses_are_checked():
    x = np.arange(128, dtype=np.float32)
    out = kaio.zeros(64, f32)
    with pytest.raises(kaio.OutOfBoundsError, match=r"store of shared array 's_smem0'") as info:
        shared_shift[1](_dev(x), out, 1)
    assert info.value.index == (64,) and info.value.thread == (63, 0, 0)
    shared_shift[1](_dev(x), out, 0)
    np.testing.assert_array_equal(out.numpy(), x[:64])

    y = np.arange(64, dtype=np.float32).reshape(8, 8)
    out2 = kaio.zeros((8, 8), f32)
    with pytest.raises(kaio.OutOfBoundsError, match=r"array 'y' \(shape \(8, 8\)\)") as info:
        grid2d[1](_dev(y), out2, -3)
    assert info.value.index[1] < 0 and info.value.lineno == _line("GRID2D")

    bins = kaio.zeros(4, u32)
    with pytest.raises(kaio.OutOfBoundsError, match="atomic_add of global array 'bins'"):
        counts[1](bins, _dev(np.full(32, 4, np.int32)))

    with pytest.raises(kaio.OutOfBoundsError, match="reaches element 127") as info:
        vectors[1](_dev(np.zeros(126, np.float32)), kaio.zeros(128, f32), 0)
    assert info.value.index == (124,) and info.value.thread == (31, 0, 0)
    vec_out = kaio.zeros(128, f32)
    vectors[1](_dev(x), vec_out, 0)
    np.testing.assert_array_equal(vec_out.numpy(), x)


@pytest.mark.gpu
def test_gpu_dynamic_shared_memory_smaller_than_the_kernel_needs():
    out = kaio.zeros(32, f32)
    with pytest.raises(
        kaio.OutOfBoundsError, match=r"shared_dyn array 'd_dsmem0' \(shape \(16,\)\)"
    ):
        dynamic[1, 32, None, 64](out)
    dynamic[1, 32, None, 128](out)
    np.testing.assert_array_equal(out.numpy(), np.arange(31, -1, -1, dtype=np.float32))
    with pytest.raises(kaio.OutOfBoundsError, match="launch gave 64 bytes"):
        dynamic_view[1, 32, None, 64](out)


@pytest.mark.gpu
def test_gpu_op_library_runs_clean_in_debug_mode():
    """KAIO_DEBUG=1 for a whole process: the op library's kernels (tensor cores, cp.async,
    vectors, shared memory) pass every check on valid inputs and give the same results."""
    code = """
        import numpy as np, torch, kaio, kaio_ops
        from kaio_ops import _matmul_kernels
        assert _matmul_kernels.matmul_kernel.debug
        torch.manual_seed(0)
        a = torch.randn(300, 200, device="cuda", dtype=torch.float16)
        b = torch.randn(200, 260, device="cuda", dtype=torch.float16)
        ref = a.double() @ b.double()
        for op in (kaio_ops.matmul_tc, kaio_ops.matmul_tc_async):
            c = op(a, b)
            assert torch.allclose(c.double(), ref, rtol=1e-2, atol=1e-2), op
        x = torch.randn(37, 1000, device="cuda")
        w = torch.randn(1000, device="cuda")
        got = kaio_ops.rms_norm(x, w)
        want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        s = kaio_ops.softmax(x.half())
        assert torch.allclose(s.float(), torch.softmax(x, -1), atol=2e-3)
        print("ok")
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": REPO, "KAIO_DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
