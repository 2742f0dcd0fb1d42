"""Several GPUs: a launch runs on the GPU its arrays are on, and every op on its inputs' GPU,
whatever the current device (kaio's, torch's or CuPy's); a process that uses only GPU 1 makes
no context on GPU 0. Marked gpu; skipped where fewer than two GPUs are visible.

Each op's result on GPU 1 is compared bit for bit with the same op on GPU 0 (the two GPUs of
one machine are the same model, and the kernels are deterministic; the ops' own tests check
them against their references); the raw kernel's results and the CuPy case against NumPy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kaio
from kaio import f32, u32
from kaio.errors import LaunchError
from kaio.runtime.device import device_count, gpu_unavailable_reason

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _two_gpus() -> bool:
    return gpu_unavailable_reason() is None and device_count() >= 2


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("not _two_gpus()", reason="needs two GPUs"),
]


def fresh_process(script: str) -> str:
    """The output of ``script`` run by a new Python process in the repository (it must
    succeed): for what only a process's first CUDA calls decide."""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": REPO},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@kaio.gpu_kernel
def axpy(x: f32[:], y: f32[:], out: f32[:], a: f32, n: u32):
    i = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    if i < n:
        out[i] = a * x[i] + y[i]


def _device_of(ptr: int) -> int:
    """The ordinal of the GPU whose memory ``ptr`` points into: the device of the context the
    driver says the allocation belongs to."""
    from cuda.bindings import driver as cu

    attribute = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT
    err, context = cu.cuPointerGetAttribute(attribute, ptr)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    owners = [i for i in range(device_count()) if int(kaio.Device(i).context) == int(context)]
    assert len(owners) == 1, (ptr, owners)
    return owners[0]


def _axpy_on(ordinal: int, x: np.ndarray, y: np.ndarray):
    """(x, y, out) as DeviceArrays made on GPU ``ordinal``, out poisoned."""
    with kaio.Device(ordinal):
        arrays = kaio.to_device(x), kaio.to_device(y), kaio.to_device(np.full_like(x, np.nan))
    return arrays


def test_kernel_runs_on_the_gpu_of_its_arrays():
    rng = np.random.default_rng(0)
    n = 5000
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    want = np.float32(1.5) * x + y
    assert kaio.device().ordinal == 0
    on1 = _axpy_on(1, x, y)
    on0 = _axpy_on(0, x, y)
    assert [_device_of(a.ptr) for a in on1 + on0] == [1, 1, 1, 0, 0, 0]
    for arrays in (on1, on0, on1):  # launchers for both GPUs, taken in turn
        axpy[(n + 255) // 256, 256](*arrays, 1.5, n)
        np.testing.assert_array_equal(arrays[2].numpy(), want)
    assert kaio.device().ordinal == 0  # the current device did not move
    with kaio.Device(1):  # nor does it matter where the launch is made from
        axpy[(n + 255) // 256, 256](*on0, -1.0, n)
    np.testing.assert_array_equal(on0[2].numpy(), np.float32(-1.0) * x + y)


def test_arrays_on_two_gpus_are_refused():
    x = np.ones(8, np.float32)
    x0, y0, _ = _axpy_on(0, x, x)
    _, _, out1 = _axpy_on(1, x, x)
    with pytest.raises(LaunchError, match=r"'out' .* is on GPU 1 but 'x' is on GPU 0"):
        axpy[1, 32](x0, y0, out1, 1.0, 8)


def test_device_array_for_another_gpu_is_allocated_there():
    a = kaio.DeviceArray((1024,), np.float32, device=kaio.Device(1))
    assert kaio.device().ordinal == 0
    assert _device_of(a.ptr) == 1 and a.device.ordinal == 1
    a.copy_from_host(np.arange(1024, dtype=np.float32))
    np.testing.assert_array_equal(a.numpy(), np.arange(1024, dtype=np.float32))


def test_cuda_array_interface_arrays_say_their_gpu():
    """An array known only by its ``__cuda_array_interface__`` (a pointer) is found on the
    GPU that holds it, and runs there."""
    from kaio.runtime.arguments import describe

    class Interface:  # nothing but the protocol: kaio must ask the driver for the device
        def __init__(self, array):
            self.__cuda_array_interface__ = array.__cuda_array_interface__
            self.keep = array

    x = np.arange(300, dtype=np.float32)
    on1 = _axpy_on(1, x, x)
    wrapped = [Interface(a) for a in on1]
    assert [describe(w).device for w in wrapped] == [1, 1, 1]
    axpy[2, 256](*wrapped, 3.0, 300)
    np.testing.assert_array_equal(on1[2].numpy(), np.float32(4.0) * x)


def _torch_cases():
    """(name, make inputs on a torch device, call): ops of each family, at sizes that take
    their GPU-specific paths (the mma.sync and the Hopper matmuls, the decode int4 kernel,
    the cluster softmax, flash attention's split plans)."""
    import torch

    import kaio_ops

    def f16(device, *shape, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        return torch.randn(*shape, generator=g).half().to(device)

    def int4(device):
        g = torch.Generator(device="cpu").manual_seed(7)
        words = torch.randint(-(2**31), 2**31, (4096 // 8, 4096), generator=g, dtype=torch.int64)
        scales = (torch.rand(4096 // 128, 4096, generator=g) * 0.05 + 0.01).half()
        return f16(device, 1, 4096, seed=8), words.int().to(device), scales.to(device)

    return [
        ("rms_norm", lambda d: (f16(d, 4, 4096, seed=1), f16(d, 4096, seed=2)), kaio_ops.rms_norm),
        ("matmul_tc", lambda d: (f16(d, 512, 1024, seed=3), f16(d, 1024, 1024, seed=4)),
         kaio_ops.matmul_tc),
        # enough 128 x 128 tiles of C (2 an SM) for the Hopper kernel (TMA, wgmma) on sm_90
        ("matmul_tc_async", lambda d: (f16(d, 2048, 256, seed=13), f16(d, 256, 2304, seed=14)),
         kaio_ops.matmul_tc_async),
        ("matmul_int4", int4, kaio_ops.matmul_int4),
        ("softmax long rows", lambda d: (f16(d, 2, 262144, seed=5).float(),), kaio_ops.softmax),
        ("flash_attention", lambda d: tuple(f16(d, 1, 8, 256, 64, seed=s) for s in (9, 10, 11)),
         kaio_ops.flash_attention),
        ("quantize_q8_0", lambda d: (f16(d, 64, 256, seed=12).float(),), kaio_ops.quantize_q8_0),
        ("torch.ops.kaio.rms_norm", lambda d: (f16(d, 4, 4096, seed=1), f16(d, 4096, seed=2)),
         lambda x, w: torch.ops.kaio.rms_norm(x, w)),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(8))
@pytest.mark.parametrize("torch_device", [None, 1], ids=["torch-current-0", "torch-current-1"])
def test_torch_ops_run_on_their_inputs_gpu(case, torch_device):
    """The same op on copies of one input on GPU 0 and GPU 1: the same bits, each result on
    its inputs' GPU, with torch's current device left at 0 or set to 1 (one process per GPU,
    as torchrun runs them) and kaio's at 0."""
    torch = pytest.importorskip("torch")
    import kaio_ops.torch  # noqa: F401 (registers torch.ops.kaio)

    name, make, call = _torch_cases()[case]
    expected = call(*make("cuda:0"))
    torch.cuda.synchronize(0)
    with torch.cuda.device(torch_device if torch_device is not None else 0):
        got = call(*make("cuda:1"))
        torch.cuda.synchronize(1)
    outs = (got,) if isinstance(got, torch.Tensor) else got
    for o, e in zip(outs, (expected,) if isinstance(expected, torch.Tensor) else expected,
                    strict=True):  # fmt: skip
        assert o.device == torch.device("cuda", 1), name
        assert torch.equal(o.cpu(), e.cpu()), name
    assert kaio.device().ordinal == 0


def test_cupy_arrays_on_another_gpu():
    cupy = pytest.importorskip("cupy")
    import kaio_ops

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 1024), np.float32), rng.standard_normal(1024, np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w
    with cupy.cuda.Device(1):
        out = kaio_ops.rms_norm(cupy.asarray(x), cupy.asarray(w))
        assert out.device.id == 1
        np.testing.assert_allclose(cupy.asnumpy(out), want, rtol=1e-5, atol=1e-5)


def test_a_process_on_gpu_1_makes_no_context_on_gpu_0():
    """kaio ops and launches on GPU 1 only, in a fresh process: GPU 0's primary context is
    never made (it would hold hundreds of MB of GPU 0 in every process of a multi-GPU job)."""
    script = textwrap.dedent(
        """
        import numpy as np
        from cuda.bindings import driver as cu
        import kaio, kaio_ops
        from tests.test_multi_gpu import axpy

        x = np.random.default_rng(0).standard_normal((4, 1024)).astype(np.float32)
        with kaio.Device(1):
            xd, wd = kaio.to_device(x), kaio.to_device(np.ones(1024, np.float32))
            out = kaio.empty(x.size, np.float32)
        axpy[(x.size + 255) // 256, 256](xd.reshape(x.size), xd.reshape(x.size), out, 2.0,
                                         x.size)
        y = kaio_ops.rms_norm(xd, wd)
        assert np.allclose(out.numpy(), 3 * x.reshape(-1))
        assert np.isfinite(y.numpy()).all() and y.device.ordinal == 1
        _, dev0 = cu.cuDeviceGet(0)
        _, dev1 = cu.cuDeviceGet(1)
        print("active", int(cu.cuDevicePrimaryCtxGetState(dev0)[2]),
              int(cu.cuDevicePrimaryCtxGetState(dev1)[2]))
        """
    )
    assert fresh_process(script).split()[-2:] == ["0", "1"]


def test_kaio_starts_on_the_threads_current_gpu_and_leaves_torchs_alone():
    """In a process that chose GPU 1 through torch first (as a torchrun rank does), kaio's
    current device is GPU 1, its arrays go there, and torch's current device stays GPU 1."""
    script = textwrap.dedent(
        """
        import numpy as np, torch
        from cuda.bindings import driver as cu
        import kaio

        torch.cuda.set_device(1)
        torch.ones(4, device="cuda")
        assert kaio.device().ordinal == 1, kaio.device()
        assert kaio.to_device(np.ones(4, np.float32)).device.ordinal == 1
        assert torch.ones(4, device="cuda").device.index == 1
        assert torch.cuda.current_device() == 1
        print("active", int(cu.cuDevicePrimaryCtxGetState(cu.cuDeviceGet(0)[1])[2]))
        """
    )
    pytest.importorskip("torch")
    assert fresh_process(script).split()[-2:] == ["active", "0"]


def test_dlpack_export_of_an_array_on_gpu_1_to_a_torch_stream_there():
    """torch takes a GPU-1 DeviceArray on one of its own GPU-1 streams: the values a kaio
    kernel wrote, with the consumer stream made to wait on GPU 1's default stream."""
    torch = pytest.importorskip("torch")
    x = np.arange(4096, dtype=np.float32)
    on1 = _axpy_on(1, x, x)
    axpy[16, 256](*on1, 2.0, 4096)
    side = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(side):
        t = torch.from_dlpack(on1[2])
        copy = t.clone()  # on the side stream
    side.synchronize()
    assert t.device == torch.device("cuda", 1)
    np.testing.assert_array_equal(copy.cpu().numpy(), 3 * x)


def test_cuda_graph_of_ops_on_gpu_1():
    """A CUDA graph captured on GPU 1 around kaio ops (kaio's current device 0: each launch
    switches to GPU 1's context inside the capture) replays with new inputs to the results of
    direct calls."""
    torch = pytest.importorskip("torch")
    import kaio_ops

    g = torch.Generator(device="cpu").manual_seed(21)
    x = torch.randn(8, 4096, generator=g).half().to("cuda:1")
    w = torch.randn(4096, generator=g).half().to("cuda:1")
    with torch.cuda.device(1):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up: compile and load before capturing
            kaio_ops.silu_gate(kaio_ops.rms_norm(x, w), x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = kaio_ops.silu_gate(kaio_ops.rms_norm(x, w), x)
        x.copy_(torch.randn(8, 4096, generator=g).half().to("cuda:1"))
        graph.replay()
        want = kaio_ops.silu_gate(kaio_ops.rms_norm(x, w), x)
        torch.cuda.synchronize(1)
    assert kaio.device().ordinal == 0
    assert torch.equal(y, want)


def test_launches_repeated_on_gpu_1_run_there_whatever_context_is_current():
    """The same launch made again and again (the launcher's native front, where there is
    one: kaio's arrays and torch tensors alike) with GPU 1's arrays, while GPU 1, GPU 0 or
    torch's GPU 1 is current: every launch computes its arrays' result on GPU 1, into an
    output poisoned first."""
    torch = pytest.importorskip("torch")
    import contextlib

    n = 4096
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    want = np.float32(2.0) * x + y
    kx, ky, kout = _axpy_on(1, x, y)
    tx, ty = torch.from_numpy(x).to("cuda:1"), torch.from_numpy(y).to("cuda:1")
    tout = torch.empty(n, device="cuda:1")
    kinds = (
        (kx, ky, kout, lambda: kout.copy_from_host(np.full(n, np.nan, np.float32)), kout.numpy),
        (tx, ty, tout, lambda: tout.fill_(float("nan")), lambda: tout.cpu().numpy()),
    )
    launch = axpy[n // 256, 256]
    for where in (kaio.Device(1), kaio.Device(0), torch.cuda.device(1), contextlib.nullcontext()):
        for a, b, out, poison, read in kinds:
            poison()
            kaio.Device(1).synchronize()
            with where:
                for _ in range(3):
                    launch(a, b, out, 2.0, n)
            kaio.Device(1).synchronize()
            np.testing.assert_array_equal(read(), want)
