"""The runtime on a real GPU: memory, views, interop with torch and CuPy, launches, caches,
dynamic shared memory, launch errors. The kernels run hand-written PTX (installed into their
specialization) so these tests check the runtime independently of the PTX emitter."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kaio
from kaio import f16, f32, u32
from kaio.errors import LaunchError

pytestmark = pytest.mark.gpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = ".version 8.0\n.target sm_80\n.address_size 64\n"

ADD_PTX = (
    HEADER
    + """
.visible .entry add(.param .u64 x, .param .s64 xn, .param .u64 y, .param .s64 yn,
                    .param .u64 o, .param .s64 on, .param .u32 n)
{
    .reg .pred %p; .reg .b32 %r<6>; .reg .b64 %rd<8>; .reg .f32 %f<4>;
    ld.param.u64 %rd1, [x]; ld.param.u64 %rd2, [y]; ld.param.u64 %rd3, [o];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x; mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r5, %r3, %r4, %r2;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    add.u64 %rd5, %rd1, %rd4; add.u64 %rd6, %rd2, %rd4; add.u64 %rd7, %rd3, %rd4;
    ld.global.f32 %f1, [%rd5]; ld.global.f32 %f2, [%rd6];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd7], %f3;
DONE:
    ret;
}
"""
)

# out[i] = x[i * stride] for i < len(out): reads the strided ('A') launch ABI.
GATHER_PTX = (
    HEADER
    + """
.visible .entry gather(.param .u64 x, .param .s64 xn, .param .s64 xs,
                       .param .u64 o, .param .s64 on)
{
    .reg .pred %p; .reg .b32 %r<5>; .reg .b64 %rd<10>; .reg .f32 %f1;
    ld.param.u64 %rd1, [x]; ld.param.s64 %rd2, [xs]; ld.param.u64 %rd3, [o];
    ld.param.s64 %rd4, [on];
    mov.u32 %r2, %tid.x; mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x;
    mad.lo.u32 %r1, %r3, %r4, %r2;
    cvt.u64.u32 %rd5, %r1;
    setp.ge.s64 %p, %rd5, %rd4;
    @%p bra DONE;
    mul.lo.s64 %rd6, %rd5, %rd2;
    shl.b64 %rd6, %rd6, 2;
    add.s64 %rd7, %rd1, %rd6;
    ld.global.f32 %f1, [%rd7];
    shl.b64 %rd8, %rd5, 2;
    add.s64 %rd9, %rd3, %rd8;
    st.global.f32 [%rd9], %f1;
DONE:
    ret;
}
"""
)

# Each thread writes its index at byte 65536 + 4 * tid of dynamic shared memory, then reads its
# mirror's: needs more than 64 KB of dynamic shared memory.
DYN_PTX = (
    HEADER
    + """
.extern .shared .align 16 .b8 dyn[];
.visible .entry big_shared(.param .u64 o, .param .s64 on, .param .u32 n)
{
    .reg .b32 %r<8>; .reg .b64 %rd<4>; .reg .f32 %f<2>;
    ld.param.u64 %rd1, [o];
    mov.u32 %r1, %tid.x; mov.u32 %r2, %ntid.x;
    mov.u32 %r3, dyn;
    shl.b32 %r4, %r1, 2; add.u32 %r4, %r4, 65536; add.u32 %r4, %r4, %r3;
    cvt.rn.f32.u32 %f1, %r1;
    st.shared.f32 [%r4], %f1;
    bar.sync 0;
    sub.u32 %r5, %r2, %r1; sub.u32 %r5, %r5, 1;
    shl.b32 %r6, %r5, 2; add.u32 %r6, %r6, 65536; add.u32 %r6, %r6, %r3;
    ld.shared.f32 %f1, [%r6];
    mul.wide.u32 %rd2, %r1, 4; add.u64 %rd3, %rd1, %rd2;
    st.global.f32 [%rd3], %f1;
    ret;
}
"""
)

FAULT_PTX = (
    HEADER
    + """
.visible .entry fault(.param .u64 o, .param .s64 on)
{
    .reg .b64 %rd1; .reg .f32 %f1;
    mov.u64 %rd1, 0; mov.f32 %f1, 0f3F800000;
    st.global.f32 [%rd1], %f1;
    ret;
}
"""
)


@kaio.gpu_kernel(block_size=256)
def add(x: f32[:], y: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[i] + y[i]


@kaio.gpu_kernel
def gather(x: f32[:], out: f32[:]):
    out[0] = x[0]


@kaio.gpu_kernel
def big_shared(out: f32[:], n: u32):
    out[0] = f32(n)


@kaio.gpu_kernel
def fault(out: f32[:]):
    out[0] = 1.0


def install(kernel, layouts: tuple, ptx: str) -> None:
    """Make ``kernel``'s specialization for ``layouts`` run ``ptx`` on the current GPU."""
    kernel.specialize({}, layouts).ptx_by_arch[kaio.device().arch] = ptx


@pytest.fixture(autouse=True)
def hand_ptx():
    install(add, ("C", "C", "C"), ADD_PTX)
    install(gather, ("A", "C"), GATHER_PTX)
    install(big_shared, ("C",), DYN_PTX)
    install(fault, ("C",), FAULT_PTX)


def rng_f32(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


# ----------------------------------------------------------------------------- memory
def test_device_properties():
    dev = kaio.Device(0)
    assert dev is kaio.Device(0) and kaio.device() is dev
    assert dev.arch.startswith("sm_") and dev.compute_capability[0] >= 7
    assert dev.total_memory > 2**30 and dev.multiprocessor_count > 0
    assert dev.max_shared_per_block_optin >= dev.max_shared_per_block
    assert dev.attribute("WARP_SIZE") == 32


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint64, kaio.bf16])
def test_round_trip(dtype):
    np_dtype = kaio.bf16.np_dtype if dtype is kaio.bf16 else np.dtype(dtype)
    host = (np.arange(60) % 7 - 3).astype(np_dtype).reshape(3, 4, 5)
    arr = kaio.to_device(host)
    assert arr.shape == (3, 4, 5) and arr.dtype == np_dtype and len(arr) == 3
    assert arr.strides == host.strides and arr.nbytes == host.nbytes
    np.testing.assert_array_equal(arr.numpy(), host)
    assert np.all(kaio.zeros((7,), dtype).numpy() == 0)
    assert kaio.empty((2, 2), dtype).kaio_dtype.np_dtype == np_dtype


def test_slicing_views_share_memory():
    host = np.arange(48, dtype=np.float32).reshape(6, 8)
    arr = kaio.to_device(host)
    for key in [np.s_[2:5], np.s_[:, 1], np.s_[1, ::-2], np.s_[::2, 3:7], np.s_[..., -1]]:
        np.testing.assert_array_equal(arr[key].numpy(), host[key])
    np.testing.assert_array_equal(arr.T.numpy(), host.T)
    row = arr[2]
    row.copy_from_host(np.full(8, -1, np.float32))
    host[2] = -1
    np.testing.assert_array_equal(arr.numpy(), host)
    del arr
    np.testing.assert_array_equal(row.numpy(), host[2])  # the view keeps the memory alive


def test_ten_thousand_allocations_do_not_leak():
    """10 000 arrays of 1 MiB, each dropped at once, leave the device's free memory where it
    was. The free memory is the whole device's, which other processes (parallel test workers)
    change meanwhile: three tries, one of which must stay within 64 MiB; a leak of even 1%
    of the arrays (100 MiB) fails every try."""
    dev = kaio.device()
    growth = []
    for _ in range(3):
        kaio.synchronize()
        free_before, _ = dev.mem_info()
        for _ in range(10_000):
            kaio.empty((1 << 18,), f32)  # 1 MiB, dropped at once
        kaio.synchronize()
        free_after, _ = dev.mem_info()
        growth.append(free_before - free_after)
        if growth[-1] < 64 << 20:
            break
    assert min(growth) < 64 << 20, f"free memory fell by {[g >> 20 for g in growth]} MiB"


# ----------------------------------------------------------------------------- launches
def test_launch_add_and_keywords():
    n = 10_000
    x, y = rng_f32(n, 1), rng_f32(n, 2)
    dx, dy = kaio.to_device(x), kaio.to_device(y)
    out = kaio.to_device(np.full(n, np.nan, np.float32))
    add[(n + 255) // 256](dx, dy, out, n)
    np.testing.assert_array_equal(out.numpy(), x + y)
    out2 = kaio.to_device(np.full(n, np.nan, np.float32))
    add[(n + 255) // 256, 256](dx, y=dy, out=out2, n=np.uint32(n))
    np.testing.assert_array_equal(out2.numpy(), x + y)


def test_raw_array_arguments_launch_and_wrong_ones_are_refused():
    # the launcher built for RawArrays takes later ones of the same signature (any address
    # and length) and declines others, which the slow path then refuses by name
    from kaio.runtime.arginfo import RawArray

    n = 1000
    x, y = rng_f32(n, 4), rng_f32(n, 5)
    dx, dy = kaio.to_device(x), kaio.to_device(y)
    out = kaio.to_device(np.full(2 * n, np.nan, np.float32))
    launch = add[(n + 255) // 256, 256]
    ordinal = kaio.device().ordinal
    for half in (0, 1):
        at = out.ptr + 4 * n * half
        launch(RawArray(dx.ptr, (n,), f32, ordinal, dx), dy, RawArray(at, (n,), f32, ordinal), n)
    np.testing.assert_array_equal(out.numpy(), np.concatenate([x + y, x + y]))
    with pytest.raises(LaunchError, match="'x'.*convert it to f32"):
        launch(RawArray(dx.ptr, (n,), f16, ordinal), dy, out, n)
    with pytest.raises(LaunchError, match="'x'.*reshape it to 1"):
        launch(RawArray(dx.ptr, (2, n // 2), f32, ordinal), dy, out, n)


def test_strided_argument_uses_the_strided_layout():
    host = rng_f32(300, 3)
    x = kaio.to_device(host)[::3]
    out = kaio.to_device(np.full(100, np.nan, np.float32))
    gather[1, 128](x, out)
    np.testing.assert_array_equal(out.numpy(), host[::3])


def test_dynamic_shared_above_48k():
    out = kaio.to_device(np.full(256, np.nan, np.float32))
    big_shared[1, 256, None, 70_000](out, 256)
    np.testing.assert_array_equal(out.numpy(), np.arange(255, -1, -1, dtype=np.float32))
    with pytest.raises(LaunchError, match="dynamic shared memory"):
        big_shared[1, 256, None, 10 << 20](out, 256)


def test_launch_errors():
    a = kaio.zeros((64,), f32)
    h = kaio.zeros((64,), f16)
    with pytest.raises(LaunchError, match=r"'y' \(expects f32\[:\]\).*f16"):
        add[1](a, h, a, 64)
    with pytest.raises(LaunchError, match=r"'out'.*2-d"):
        add[1](a, a, kaio.zeros((8, 8), f32), 64)
    with pytest.raises(LaunchError, match="kaio.to_device"):
        add[1](a, np.zeros(64, np.float32), a, 64)
    with pytest.raises(LaunchError, match="out of range"):
        add[1](a, a, a, -5)
    with pytest.raises(LaunchError, match="declares"):
        add[1, 2048](a, a, a, 64)
    with pytest.raises(LaunchError, match="grid"):
        add[(1, 1 << 20), 256](a, a, a, 64)
    with pytest.raises(LaunchError):
        add[1](a, a, a)


def test_resources():
    res = add.resources()
    assert res.registers > 0 and res.max_threads_per_block >= 256
    assert res.local_bytes == 0 and res.shared_bytes == 0


def test_stream_and_events():
    n = 1 << 20
    x = kaio.to_device(rng_f32(n))
    out = kaio.empty((n,), f32)
    stream = kaio.Stream()
    start, end = kaio.Event(), kaio.Event()
    start.record(stream)
    add[n // 256, 256, stream](x, x, out, n)
    end.record(stream)
    stream.synchronize()
    assert start.elapsed_time(end) > 0
    np.testing.assert_array_equal(out.numpy(), 2 * x.numpy())


# ----------------------------------------------------------------------------- interop
def test_torch_zero_copy_both_ways():
    torch = pytest.importorskip("torch")
    n = 4096
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    add[n // 256](x, y, out, n)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    arr = kaio.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    t = torch.from_dlpack(arr)
    assert t.data_ptr() == arr.ptr and t.shape == (3, 4) and t.is_cuda
    t += 1  # writes through to kaio's memory
    np.testing.assert_array_equal(arr.numpy(), np.arange(12).reshape(3, 4) + 1)
    tt = torch.from_dlpack(arr.T)
    assert tt.stride() == (1, 4)
    b = torch.from_dlpack(kaio.to_device(np.ones(4, kaio.bf16.np_dtype)))
    assert b.dtype == torch.bfloat16 and float(b.sum()) == 4.0
    with pytest.raises(LaunchError, match=r"\.cuda\(\)"):
        add[1](torch.zeros(4), x, out, 4)


def test_launches_with_the_last_arguments_and_new_ones():
    """A launch with the arguments of the last one reuses its packed parameters; a new
    scalar value, new arrays, another stream and a CUDA graph captured in between each get
    what they were given."""
    n = 4096
    hx, hy = rng_f32(n, 7), rng_f32(n, 8)
    x, y = kaio.to_device(hx), kaio.to_device(hy)
    out, other = kaio.empty((n,), f32), kaio.empty((n,), f32)
    launch = add[n // 256, 256]
    for _ in range(3):
        launch(x, y, out, n)
    np.testing.assert_array_equal(out.numpy(), hx + hy)
    out.copy_from_host(np.full(n, np.nan, np.float32))
    launch(x, y, out, n // 2)  # a new count: half written
    got = out.numpy()
    np.testing.assert_array_equal(got[: n // 2], (hx + hy)[: n // 2])
    assert np.isnan(got[n // 2 :]).all()
    launch(y, y, other, int(str(n)))  # new arrays; an int equal to n, another object
    np.testing.assert_array_equal(other.numpy(), 2 * hy)
    stream = kaio.Stream()
    add[n // 256, 256, stream](x, x, out, n)  # the same buffers, on another stream
    stream.synchronize()
    np.testing.assert_array_equal(out.numpy(), 2 * hx)
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    capture = add[n // 256, 256, side]
    for _ in range(2):  # the launcher's buffers (two, taken in turn) hold these arguments...
        capture(x, y, out, n)
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        capture(x, y, out, n)  # ...reused while capturing
    for _ in range(2):  # both repacked after: the graph keeps what it captured
        capture(y, y, other, n)
    out.copy_from_host(np.full(n, np.nan, np.float32))
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.numpy(), hx + hy)
    np.testing.assert_array_equal(other.numpy(), 2 * hy)


@pytest.mark.parametrize("kind", ["kaio", "torch"])
def test_threads_launching_one_configuration_each_launch_what_they_give(kind):
    """Threads launching one ``kernel[config]`` at once, each with its own arrays (kaio's or
    torch tensors) and count, two argument sets taking turns, each set twice in a row (the
    second launch through the launcher's native front where it has one, whose memos change
    hands between threads all the time): every round's outputs, poisoned before it, hold
    what that thread's launches computed."""
    from concurrent.futures import ThreadPoolExecutor

    threads, rounds, size = 8, 10, 4096
    launch = add[size // 256, 256]
    if kind == "torch":
        torch = pytest.importorskip("torch")

        def to_gpu(a):
            return torch.from_numpy(a).cuda()

        def poison(out):
            out.fill_(float("nan"))

        def read(out):
            return out.cpu().numpy()
    else:
        to_gpu = kaio.to_device

        def poison(out):
            out.copy_from_host(np.full(size, np.nan, np.float32))

        def read(out):
            return out.numpy()

    def work(t: int) -> bool:
        n = 1024 + 256 * t
        hx, hy = rng_f32(size, 10 + t), rng_f32(size, 40 + t)
        x, y = to_gpu(hx), to_gpu(hy)
        outs = (to_gpu(np.empty(size, np.float32)), to_gpu(np.empty(size, np.float32)))
        for _ in range(rounds):
            for out in outs:
                poison(out)
            for _ in range(2):
                launch(x, y, outs[0], n)
            for _ in range(2):
                launch(y, y, outs[1], n)
            kaio.synchronize()
            for out, want in zip(outs, (hx + hy, 2 * hy), strict=True):
                got = read(out)
                np.testing.assert_array_equal(got[:n], want[:n])
                assert np.isnan(got[n:]).all()
        return True

    with ThreadPoolExecutor(threads) as pool:
        assert all(pool.map(work, range(threads)))


def test_launches_of_torch_tensors_through_the_native_front():
    """Launches of torch tensors whose shapes pass the launcher's guard go through its
    native front (where there is one), which reads each tensor's address on every launch:
    new tensors, a tensor ``set_`` to other memory, a torch stream, a CUDA graph captured
    through the front and launches after it, new shapes and strides (Python's launch), each
    computes what it was given into outputs poisoned first."""
    torch = pytest.importorskip("torch")
    from kaio.runtime import native

    n, grid = 4096, 16

    def fresh(count: int = n):
        return torch.randn(count, device="cuda"), torch.randn(count, device="cuda")

    def poisoned(count: int = n):
        return torch.full((count,), float("nan"), device="cuda")

    x, y = fresh()
    out = poisoned()
    add[grid, 256](x, y, out, n)
    launch = add[grid, 256]
    if native.status() == "native":
        assert isinstance(launch, functools.partial)  # the front
    for _ in range(3):
        x, y = fresh()
        out = poisoned()
        launch(x, y, out, n)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    old = out.clone()
    out.set_(poisoned().untyped_storage())  # the same tensor object, other memory
    launch(y, y, out, n)
    torch.testing.assert_close(out, 2 * y, rtol=0, atol=0)
    assert not torch.equal(old, out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    on_side = add[grid, 256, side]
    on_side(x, y, out, n)
    on_side(x, x, out, n)
    side.synchronize()
    torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)
    graph, captured = torch.cuda.CUDAGraph(), poisoned()
    with torch.cuda.graph(graph, stream=side):
        on_side(x, y, captured, n)
    other = poisoned()
    on_side(y, y, other, n)  # after the capture: its own tensors
    side.synchronize()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, x + y, rtol=0, atol=0)
    torch.testing.assert_close(other, 2 * y, rtol=0, atol=0)
    half = poisoned(n // 2)  # a new shape: Python's launch
    launch(x[: n // 2], y[: n // 2], half, n // 2)
    torch.testing.assert_close(half, (x + y)[: n // 2], rtol=0, atol=0)
    strided = poisoned(2 * n)[::2]  # a new layout: another launcher
    launch(x, y, strided, n)
    torch.testing.assert_close(strided, x + y, rtol=0, atol=0)
    out = poisoned()
    launch(x, y, out, n)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_launch_on_torch_stream():
    torch = pytest.importorskip("torch")
    n = 1 << 16
    x = torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    add[n // 256, 256, s](x, x, out, n)
    s.synchronize()
    torch.testing.assert_close(out, 2 * x, rtol=0, atol=0)


def test_cupy_zero_copy_both_ways():
    cp = pytest.importorskip("cupy")
    n = 2048
    x = cp.random.standard_normal(n, dtype=cp.float32)
    out = cp.full(n, cp.nan, dtype=cp.float32)
    add[n // 256](x, x, out, n)
    cp.testing.assert_array_equal(out, 2 * x)
    arr = kaio.to_device(np.arange(10, dtype=np.float32))
    view = cp.asarray(arr[::2])
    assert view.data.ptr == arr.ptr
    cp.testing.assert_array_equal(view, cp.arange(0, 10, 2, dtype=cp.float32))


def test_fast_path_results_and_errors_for_each_array_kind():
    """One pre-bound launch takes DeviceArrays, torch tensors and CuPy arrays (mixed too) with
    right results; once the fast launchers exist, a wrong dtype, rank or device still raises
    LaunchError before anything is launched."""
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    n = 4096
    launch = add[n // 256, 256]
    x, y = rng_f32(n, 7), rng_f32(n, 8)
    kinds = {
        "kaio": (kaio.to_device, lambda a: a.numpy()),
        "torch": (lambda h: torch.from_numpy(h).cuda(), lambda a: a.cpu().numpy()),
        "cupy": (cp.asarray, cp.asnumpy),
    }
    for _ in range(3):  # the second and third rounds run on the fast launchers
        for a_kind, b_kind, o_kind in [(k, k, k) for k in kinds] + [("torch", "kaio", "cupy")]:
            out = kinds[o_kind][0](np.full(n, np.nan, np.float32))
            launch(kinds[a_kind][0](x), kinds[b_kind][0](y), out, n)
            np.testing.assert_array_equal(kinds[o_kind][1](out), x + y)
    for to_gpu, _ in kinds.values():
        good = to_gpu(x)
        with pytest.raises(LaunchError, match=r"'y' \(expects f32\[:\]\).*f16"):
            launch(good, to_gpu(x.astype(np.float16)), good, n)
        with pytest.raises(LaunchError, match=r"'out'.*2-d"):
            launch(good, good, to_gpu(x.reshape(64, 64)), n)
        with pytest.raises(LaunchError, match="out of range"):
            launch(good, good, good, -1)
    with pytest.raises(LaunchError, match=r"\.cuda\(\)"):
        launch(torch.zeros(n), torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda"), n)


def test_strided_torch_and_cupy_arguments():
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    host = rng_f32(300, 9)
    for x in (torch.from_numpy(host).cuda()[::3], cp.asarray(host)[::3]):
        for _ in range(2):
            out = kaio.to_device(np.full(100, np.nan, np.float32))
            gather[1, 128](x, out)
            np.testing.assert_array_equal(out.numpy(), host[::3])


# ----------------------------------------------------------------------------- processes
def _run(code: str, env: dict) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_disk_cache_hit_in_new_process(tmp_path):
    code = """
        import kaio
        from kaio.runtime.module import load
        from tests.test_runtime_gpu import ADD_PTX, add, install
        install(add, ("C", "C", "C"), ADD_PTX)
        dev = kaio.device()
        print(load(add.specialize({}, ("C", "C", "C")), dev, dev.arch).from_disk)
    """
    env = {"KAIO_CACHE_DIR": str(tmp_path)}
    assert _run(code, env) == "False"
    assert len(os.listdir(tmp_path)) == 1
    assert _run(code, env) == "True"
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])  # a torn entry: rebuilt, not a crash
    assert _run(code, env) == "False"


def test_warm_disk_cache_launch_compiles_nothing(tmp_path):
    """A new process whose kernel is in the disk cache launches it without the Python front
    end or the PTX emitter (both made to fail there) and gets the right result."""
    code = """
        import os
        import numpy as np
        import kaio, kaio.frontend, kaio.ptx
        from tests.test_runtime_gpu import add
        if os.environ.get("REFUSE_COMPILE"):
            def refuse(*args, **kwargs):
                raise AssertionError("compiled although the disk cache holds the kernel")
            kaio.frontend.compile_kernel = kaio.ptx.emit = refuse
        host = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
        x, out = kaio.to_device(host), kaio.to_device(np.full(1000, np.nan, np.float32))
        add[4, 256](x, x, out, 1000)
        print(np.array_equal(out.numpy(), host + host))
    """
    env = {"KAIO_CACHE_DIR": str(tmp_path)}
    assert _run(code, env) == "True"
    assert _run(code, {**env, "REFUSE_COMPILE": "1"}) == "True"


def test_gpu_fault_names_the_kernel():
    code = """
        import kaio
        from kaio import f32
        from tests.test_runtime_gpu import FAULT_PTX, fault, install
        install(fault, ("C",), FAULT_PTX)
        fault[1, 1](kaio.empty((1,), f32))
        try:
            kaio.synchronize()
        except kaio.CudaError as e:
            print(e.name, "|", e)
    """
    out = _run(code, {})
    assert out.startswith("CUDA_ERROR_ILLEGAL_ADDRESS") and "fault" in out.split("|")[1]


def test_emitted_kernel_if_available():
    pytest.importorskip("kaio.ptx", reason="PTX emitter not available")
    from kaio import ptx

    if not hasattr(ptx, "emit"):
        pytest.skip("PTX emitter not available yet")
    n = 5000
    x, g = rng_f32(n, 5), rng_f32(n, 6)
    out = kaio.to_device(np.full(n, np.nan, np.float32))
    silu_gate[(n + 255) // 256](kaio.to_device(x), kaio.to_device(g), out, n)
    ref = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64))) * g
    err = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
    assert err < 1e-5


@kaio.gpu_kernel(block_size=256)
def silu_gate(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    idx = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if idx < n:
        xi = x[idx]
        sig = 1.0 / (1.0 + kaio.exp(-xi))
        out[idx] = xi * sig * gate[idx]
