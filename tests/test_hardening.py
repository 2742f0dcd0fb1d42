"""Hardening: compiles and launches from several threads at once, resource errors that say
what was asked and what the device allows, and (marked gpu) GPU faults from user kernels
reported as ``kaio.CudaError`` naming the kernel, in a process of their own since they leave
the CUDA context unusable."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kaio
from kaio import f32, i32, u32
from kaio.errors import CompileError, CudaError, LaunchError
from kaio.runtime import memory
from kaio.runtime.arguments import describe
from kaio.runtime.module import check_static_shared
from tests.test_runtime_cpu import fake_device_array, fake_driver  # noqa: F401 (a fixture)

THREADS = 8


@kaio.gpu_kernel(block_size=64)
def scaled(x: f32[:], out: f32[:], n: u32, K: kaio.constexpr):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    s = kaio.shared(f32, (64,))
    s[kaio.thread_idx_x()] = x[i] if i < n else 0.0
    kaio.sync_threads()
    if i < n:
        out[i] = s[63 - kaio.thread_idx_x()] * K


@kaio.gpu_kernel(block_size=256)
def big_static_shared(out: f32[:]):
    s = kaio.shared(f32, (16384,))  # 64 KB: over the 48 KB a block may declare statically
    t = kaio.thread_idx_x()
    s[t] = f32(t)
    kaio.sync_threads()
    out[t] = s[255 - t]


def _expected(x: np.ndarray, k: int) -> np.ndarray:
    n = len(x)
    pad = np.zeros(-n % 64, np.float32)
    blocks = np.concatenate([x, pad]).reshape(-1, 64)[:, ::-1].reshape(-1)[:n]
    return blocks * np.float32(k)


def _fresh(kernel: kaio.Kernel) -> kaio.Kernel:
    """A new Kernel object (empty caches) for the same function."""
    return kaio.Kernel(kernel.pyfunc, block_size=kernel.block_size)


# ----------------------------------------------------------------------------- threads (CPU)
def test_threads_compile_one_specialization_once():
    kernel = _fresh(scaled)
    start = threading.Barrier(THREADS)

    def compile_it(_):
        start.wait()
        spec = kernel.specialize({"K": 3}, ("C", "C"))
        return spec, spec.ptx("sm_90")

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(compile_it, range(THREADS)))
    assert len({id(spec) for spec, _ in results}) == 1
    assert len({ptx for _, ptx in results}) == 1


def test_threads_compile_and_simulate_concurrently():
    """Threads compiling different specializations of one kernel and simulating them, some
    inside ``kaio.simulate()`` (a per-thread switch) and some through ``kernel.sim``."""
    kernel = _fresh(scaled)
    start = threading.Barrier(THREADS)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(100 + 7 * t).astype(np.float32) for t in range(THREADS)]

    def work(t):
        x = inputs[t]
        out = np.zeros_like(x)
        start.wait()
        if t % 2:
            with kaio.simulate():
                kernel[(len(x) + 63) // 64](x, out, len(x), t + 1)
        else:
            kernel.sim[(len(x) + 63) // 64](x, out, len(x), t + 1)
        return out

    with ThreadPoolExecutor(THREADS) as pool:
        outs = list(pool.map(work, range(THREADS)))
    for t, out in enumerate(outs):
        np.testing.assert_array_equal(out, _expected(inputs[t], t + 1))
    assert not kaio.sim.mode.active()


def test_current_device_is_per_thread():
    from kaio.runtime.device import current

    seen = []

    def other():
        seen.append((current.ordinal, current.context_ready))
        current.ordinal = 5

    before = current.ordinal
    current.ordinal = 3
    try:
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert seen == [(0, False)] and current.ordinal == 3
    finally:
        current.ordinal = before


def test_concurrent_launches_never_share_a_parameter_buffer(fake_driver):  # noqa: F811
    """Threads launching the same signature at once: the driver (faked, releasing the GIL
    mid-call as ctypes does) sees each launch's own parameters, unchanged during the call."""
    from kaio.runtime import launcher as launcher_mod
    from kaio.runtime.device import current
    from kaio.runtime.launcher import build_launcher
    from tests.test_runtime_gpu import add

    calls, loaded = fake_driver
    torn = []

    def slow_launch(config, func, params, extra):
        _, pointers = launcher_mod.argument_values(func, params)  # kernelParams
        start, size = pointers[0], pointers[-1] - pointers[0] + 4  # n is a u32, last
        first = ctypes.string_at(start, size)
        time.sleep(0.0005)  # another thread runs here
        if ctypes.string_at(start, size) != first:
            torn.append(first)
        calls.append(first)
        return 0

    launcher_mod_raw = launcher_mod.raw_launch_kernel
    launcher_mod.raw_launch_kernel = lambda: slow_launch
    try:
        dev = loaded.device
        x = fake_device_array(dev, 0x1000, (64,), (4,))
        args = (x, x, x, 1)
        infos = {k: describe(a) for k, a in enumerate(args) if not isinstance(a, int)}
        spec = add.specialize({}, ("C", "C", "C"))
        loaded.params = spec.function.params
        bind = build_launcher(add, spec, loaded, args, infos)
        launch = bind((1, 1, 1), (64, 1, 1), 0, 0)

        def work(t):
            current.ordinal = 0
            for _ in range(20):
                assert launch((x, x, x, t))

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(work, range(THREADS)))
    finally:
        launcher_mod.raw_launch_kernel = launcher_mod_raw
    assert not torn
    assert sorted(int.from_bytes(c[-4:], "little") for c in calls) == sorted(
        t for t in range(THREADS) for _ in range(20)
    )


# ----------------------------------------------------------------------------- resources (CPU)
def _fake_device(**extra):
    return types.SimpleNamespace(
        ordinal=0,
        name="Fake GPU",
        arch="sm_90",
        max_block_dim=(1024, 1024, 64),
        max_threads_per_block=1024,
        max_grid_dim=(2**31 - 1, 65535, 65535),
        max_shared_per_block=48 * 1024,
        max_shared_per_block_optin=227 * 1024,
        **extra,
    )


def test_out_of_memory_says_asked_free_and_total(monkeypatch):
    cu = memory.cu
    monkeypatch.setattr(
        cu, "cuMemAlloc", lambda n: (cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), raising=True
    )
    monkeypatch.setattr(
        cu, "cuMemGetInfo", lambda: (cu.CUresult.CUDA_SUCCESS, 3 * 2**30, 80 * 2**30)
    )
    monkeypatch.setattr(memory, "visiting", contextlib.nullcontext)  # no driver to switch
    with pytest.raises(CudaError) as info:
        memory.Allocation(2**40, _fake_device())
    err = info.value
    assert err.name == "CUDA_ERROR_OUT_OF_MEMORY"
    text = str(err)
    assert "asked for 1.00 TiB (1099511627776 bytes) on Fake GPU" in text
    assert "3.00 GiB (3221225472 bytes) free of 80.00 GiB (85899345920 bytes)" in text


def test_static_shared_over_the_block_limit_is_a_located_compile_error():
    # Regression: 64 KB of kaio.shared used to simulate and emit PTX; only ptxas or the
    # driver refused it. Now .ptx(), the simulator and a launch all refuse it at compile.
    for compile_it in (
        big_static_shared.ptx,
        lambda: big_static_shared.sim[1](np.zeros(256, np.float32)),
    ):
        with pytest.raises(CompileError) as info:
            compile_it()
        err = info.value
        assert err.lineno == big_static_shared.pyfunc.__code__.co_firstlineno + 2
        assert err.filename.endswith("test_hardening.py")
        assert "kaio.shared(f32, (16384,))" in str(err)
        assert "65536 bytes" in str(err) and "49152" in str(err) and "shared_dynamic" in str(err)


def test_static_shared_check_before_linking_names_the_arrays():
    function = types.SimpleNamespace(
        arrays=[
            types.SimpleNamespace(name="a", space="shared", static_size=8192, dtype=f32),
            types.SimpleNamespace(name="b", space="shared", static_size=8192, dtype=f32),
        ]
    )
    with pytest.raises(LaunchError) as info:
        check_static_shared(function, "big_static_shared", _fake_device())
    text = str(info.value)
    assert "65536 bytes of static shared memory" in text and "at most 49152" in text
    assert "kaio.shared_dynamic" in text and "232448" in text
    check_static_shared(scaled.specialize({"K": 1}).function, "scaled", _fake_device())


@pytest.mark.parametrize(
    "grid, block, attrs, message",
    [
        ((1, 70000, 1), (32, 1, 1), {}, r"70000 blocks in y; Fake GPU allows at most 65535"),
        ((1, 1, 1), (2048, 1, 1), {}, r"2048 threads in x; Fake GPU allows at most 1024"),
        ((1, 1, 1), (32, 32, 2), {}, r"2048 threads; Fake GPU allows 1024"),
        (
            (1, 1, 1),
            (1024, 1, 1),
            {"MAX_THREADS_PER_BLOCK": 512, "NUM_REGS": 128},
            r"uses 128 registers per thread \(131072 for the block\), so at most 512",
        ),
    ],
)
def test_launch_limits_name_what_was_asked_and_what_the_device_allows(grid, block, attrs, message):
    from kaio.runtime.launcher import validate_config

    values = {"MAX_THREADS_PER_BLOCK": 1024, "NUM_REGS": 32, **attrs}
    loaded = types.SimpleNamespace(
        device=_fake_device(),
        name="k",
        reqntid=None,
        maxntid=None,
        cluster=None,
        pdl=False,
        attribute=values.__getitem__,
        allow_dynamic_shared=lambda n: None,
    )
    with pytest.raises(LaunchError, match=message):
        validate_config(grid, block, 0, loaded, None)


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_threads_compile_and_launch_concurrently():
    kernel = _fresh(scaled)
    start = threading.Barrier(THREADS)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(1000 + 37 * t).astype(np.float32) for t in range(THREADS)]

    def work(t):
        x = inputs[t]
        stream = kaio.Stream()
        dx, out = kaio.to_device(x), kaio.zeros(len(x), f32)
        start.wait()
        for k in (t + 1, t + 2):  # two specializations per thread, shared with its neighbour
            kernel[(len(x) + 63) // 64, 64, stream](dx, out, len(x), k)
            stream.synchronize()
            np.testing.assert_array_equal(out.numpy(), _expected(x, k))
        return True

    with ThreadPoolExecutor(THREADS) as pool:
        assert all(pool.map(work, range(THREADS)))


@pytest.mark.gpu
def test_gpu_resource_errors():
    dev = kaio.device()
    free, total = dev.mem_info()
    with pytest.raises(CudaError, match="out of GPU memory: asked for") as info:
        kaio.empty((total // 4 + 2**30,), f32)  # more bytes than the device has
    assert info.value.name == "CUDA_ERROR_OUT_OF_MEMORY" and "free of" in str(info.value)
    out = kaio.zeros(256, f32)
    with pytest.raises(CompileError, match="65536 bytes"):
        big_static_shared[1](out)
    x = kaio.zeros(64, f32)
    with pytest.raises(LaunchError, match="blocks in y"):
        scaled[(1, dev.max_grid_dim[1] + 1), 64](x, x, 64, 1)
    with pytest.raises(LaunchError, match="declares"):
        scaled[1, 2048](x, x, 64, 1)
    scaled[1](x, x, 64, 1)  # and the context is fine
    kaio.synchronize()


FAULTS = {
    "misaligned": "ld.global.f32 %f1, [%rd2+2];",
    "trap": "trap;",
    "illegal": "mov.u64 %rd2, 8;",  # the store below then writes to address 8
}


def _fault_ptx(name: str, body: str) -> str:
    return f"""
.version 8.0
.target sm_80
.address_size 64
.visible .entry {name}(.param .u64 o, .param .s64 on)
{{
    .reg .b64 %rd<3>; .reg .f32 %f<2>;
    ld.param.u64 %rd1, [o]; cvta.to.global.u64 %rd2, %rd1;
    mov.f32 %f1, 0f3F800000;
    {body}
    st.global.f32 [%rd2], %f1;
    ret;
}}
"""


@kaio.gpu_kernel
def misaligned(out: f32[:]):
    out[0] = 1.0


@kaio.gpu_kernel
def trap(out: f32[:]):
    out[0] = 1.0


@kaio.gpu_kernel
def illegal(out: f32[:]):
    out[0] = 1.0


@kaio.gpu_kernel(block_size=32)
def harmless(out: i32[:]):
    out[kaio.thread_idx_x()] = 7


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, expected",
    [
        ("misaligned", {"CUDA_ERROR_MISALIGNED_ADDRESS"}),
        ("trap", {"CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_LAUNCH_FAILED"}),
        ("illegal", {"CUDA_ERROR_ILLEGAL_ADDRESS"}),
    ],
)
def test_gpu_fault_on_a_stream_names_the_kernel_and_is_sticky(name, expected):
    """In a process of its own: the faulting kernel is named (the last one on its stream;
    another stream ran another kernel); afterwards driver calls keep failing, as the docs say
    (the context is dead: start a new process)."""
    from tests.test_runtime_gpu import _run

    code = f"""
        import kaio
        from kaio import f32, i32
        from tests.test_hardening import FAULTS, _fault_ptx, harmless, {name} as kernel
        kernel.specialize({{}}, ("C",)).ptx_by_arch[kaio.device().arch] = _fault_ptx(
            "{name}", FAULTS["{name}"])
        s, other = kaio.Stream(non_blocking=True), kaio.Stream(non_blocking=True)
        out, ints = kaio.zeros(64, f32), kaio.zeros(32, i32)
        harmless[1, 32, other](ints)
        other.synchronize()
        kernel[1, 1, s](out)
        try:
            s.synchronize()
            print("no error")
        except kaio.CudaError as e:
            print(e.name, "|", e)
        try:
            kaio.zeros(4, f32).numpy()
            print("context alive")
        except kaio.CudaError as e:
            print("sticky", e.name)
    """
    first, second = _run(code, {}).splitlines()[-2:]
    error, message = first.split(" | ", 1)
    assert error in expected, first
    assert f"last kernel launched on this stream: {name}" in message
    assert "restart the process" in message
    assert second.startswith("sticky CUDA_ERROR_"), second
