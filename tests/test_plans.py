"""Call plans (kaio_ops._plan, kaio.runtime.plan) on the CPU, against a fake driver: a planned
call launches exactly what the op launches unplanned (same kernels, grids, streams and
parameter bytes), plans are reused for one signature and never for another (shape, dtype,
strides, alignment, device, stream, a scalar argument), and every argument check still
raises."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import itertools
import math
import os
import re
import struct
import subprocess
import sys
import types

import numpy as np
import pytest

import kaio
import kaio_ops
from kaio import bf16, f16, f32, i8, i32
from kaio.runtime import launch as launch_mod
from kaio.runtime import launcher as launcher_mod
from kaio.runtime.device import current
from kaio.runtime.memory import DeviceArray
from kaio_ops import _arrays, _plan

# the module: the package attribute kaio_ops.matmul is the function of that name
MATMUL_MODULE = importlib.import_module("kaio_ops.matmul")
linear_module = importlib.import_module("kaio_ops.linear")  # likewise


def forget_launchers() -> None:
    """Every kernel's launchers, and the launch objects bound to them, dropped: on a host
    with a GPU, the fake GPU 0's launchers and the real one's would take each other's
    arrays (the same signature on GPU 0)."""
    for obj in gc.get_objects():
        if type(obj) is kaio.kernel.Kernel:  # (isinstance would ask lazy objects)
            obj._launchers.clear()
            obj._launches.clear()


class FakeGPU:
    """Fake GPUs: arrays with made-up addresses, a kernel loader that compiles nothing past
    the IR, and a ``cuLaunchKernelEx`` that records each launch."""

    def __init__(self, monkeypatch):
        self.calls: list = []
        self.devices: dict = {}
        self.next_ptr = itertools.count(0x10_0000, 0x1_0000)
        self.stream = None  # the stream ops launch on (None: the default one)
        # launchers built in earlier tests keep the launch function they were built with
        _ACTIVE[0] = self
        forget_launchers()  # a real GPU's launchers would take the fake arrays of GPU 0
        monkeypatch.setattr(launcher_mod, "raw_launch_kernel", lambda: _launch)
        monkeypatch.setattr(launcher_mod, "launcher_elsewhere", _elsewhere)
        monkeypatch.setattr(launcher_mod, "visiting", contextlib.nullcontext)
        monkeypatch.setattr(launch_mod, "visiting", contextlib.nullcontext)
        monkeypatch.setattr(launch_mod, "_device", lambda kernel, arrays: self.device(
            arrays[0][0].device))  # fmt: skip
        monkeypatch.setattr(launch_mod, "select_arch", lambda arch, dev: "sm_90")
        monkeypatch.setattr(launch_mod, "load", self.load)
        monkeypatch.setattr(_arrays, "new_array", self.new_array)
        # fake arrays hold no memory: what ops copy into them once (the GEMMs' zeroed
        # arrival counters) is dropped
        monkeypatch.setattr(DeviceArray, "copy_from_host", lambda array, host: None)
        monkeypatch.setattr(_arrays, "stream_of", lambda like: self.stream)
        monkeypatch.setattr(_plan, "stream_key", lambda obj, raw: self.stream)
        monkeypatch.setattr(_arrays, "multiprocessors", lambda like: 132)
        monkeypatch.setattr(MATMUL_MODULE, "_hopper", lambda a: False)
        monkeypatch.setattr(linear_module, "_hopper", lambda a: False)  # tensor maps
        monkeypatch.setattr(linear_module, "_pipelined", lambda a: True)  # sm_90
        monkeypatch.setattr(kaio_ops.decode, "_hopper", lambda a: False)  # clusters
        varlen = importlib.import_module("kaio_ops.attention_varlen")
        monkeypatch.setattr(varlen, "hopper_takes", lambda *a: False)  # tensor maps
        monkeypatch.setattr(kaio_ops.tune, "lookup", lambda *a, **k: None)
        monkeypatch.setattr(kaio_ops._long_rows, "available", lambda a: False)
        _plan.clear()

    def device(self, ordinal: int):
        if ordinal not in self.devices:
            self.devices[ordinal] = types.SimpleNamespace(
                ordinal=ordinal,
                max_block_dim=(1024, 1024, 64),
                max_threads_per_block=1024,
                max_grid_dim=(2**31 - 1, 65535, 65535),
                name=f"fake{ordinal}",
                arch="sm_90",
            )
        return self.devices[ordinal]

    def load(self, spec, dev, arch):
        if id(spec) not in _HANDLES:  # (the spec kept: its id stays its own)
            handle = 0x1000 + len(_HANDLES)
            _HANDLES[id(spec)] = spec, handle
            _FORMATS[handle] = launcher_mod.param_format(spec.function.params)[0]
        handle = _HANDLES[id(spec)][1]
        return types.SimpleNamespace(
            handle=handle,
            device=dev,
            name=spec.function.name if hasattr(spec.function, "name") else "k",
            params=spec.function.params,
            reqntid=None,
            maxntid=None,
            cluster=None,
            pdl=False,
            attribute=lambda name: 1024,
            allow_dynamic_shared=lambda n: None,
            debug=None,
        )

    def launch(self, config, func, params, extra):
        cfg = config._obj
        handle, pointers = launcher_mod.argument_values(func, params)
        self.calls.append(
            (
                handle,
                tuple(cfg.grid),
                tuple(cfg.block),
                cfg.shared,
                cfg.stream or 0,
                self.parameters(handle, pointers),
                current.ordinal,
            )
        )
        return 0

    def parameters(self, handle: int, pointers: list) -> bytes:
        """The parameter bytes the driver would read: each parameter at its kernelParams
        pointer (wherever the buffer keeps it), laid out as the kernel's format, padding
        zero."""
        fmt = _FORMATS[handle]
        entries = re.findall(r"(\d*)([a-zA-Z?])", fmt)
        sizes = [struct.calcsize(f"={count}{code}") for count, code in entries if code != "x"]
        laid = bytearray(struct.calcsize(fmt))
        for at, size, pointer in zip(launcher_mod.entry_offsets(fmt), sizes, pointers, strict=True):
            laid[at : at + size] = ctypes.string_at(pointer, size)
        return bytes(laid)

    def array(self, shape, dtype=f32, device=0, strides=None, offset=0):
        """A fake array on fake GPU ``device`` (strides in elements; default row-major)."""
        np_dtype = np.dtype(dtype.np_dtype)
        if strides is None:
            strides = _arrays_c_strides(shape)
        ptr = next(self.next_ptr) + offset
        a = DeviceArray.__new__(DeviceArray)
        alloc = types.SimpleNamespace(ptr=ptr, device=self.device(device))
        a._init(alloc, ptr, tuple(shape), tuple(s * np_dtype.itemsize for s in strides),
                np_dtype, dtype)  # fmt: skip
        return a

    def new_array(self, kind, device, like_obj, shape, dtype):
        return self.array(shape, dtype, device)

    def run(self, op, *args, **kwargs):
        """Call the planned op and the op unplanned with the same output addresses: both
        launch lists (planned, unplanned) and the planned call's result. The op runs once
        unplanned first: what it allocates once and keeps (the GEMMs' arrival counters) is
        then allocated outside the compared calls, whichever test came first."""
        op.__wrapped__(*args, **kwargs)
        start = next(self.next_ptr)
        self.next_ptr = itertools.count(start, 0x1_0000)
        self.calls = []
        result = op(*args, **kwargs)
        planned = self.calls
        self.next_ptr = itertools.count(start, 0x1_0000)
        self.calls = []
        op.__wrapped__(*args, **kwargs)
        unplanned = self.calls
        assert planned, "the op launched nothing"
        return planned, unplanned, result


_ACTIVE: list = [None]  # the FakeGPU of the running test
# the kernel handle of each specialization, the same on every fake GPU (launchers keep
# theirs from test to test): id -> (spec, handle); and each handle's parameter format
_HANDLES: dict = {}
_FORMATS: dict = {}


def _launch(config, func, params, extra):
    return _ACTIVE[0].launch(config, func, params, extra)


def _elsewhere(device):
    def elsewhere(config, func, params):
        _ACTIVE[0].calls.append(("context", device.ordinal))
        return _launch(config, func, params, None)

    return elsewhere


def _arrays_c_strides(shape):
    from kaio.runtime.arginfo import c_strides

    return c_strides(tuple(shape))


@pytest.fixture
def fake(monkeypatch):
    fake = FakeGPU(monkeypatch)
    yield fake
    _plan.clear()
    forget_launchers()  # the fake's would take a later test's arrays on a real GPU 0


def same_as_unplanned(fake, op, *args, **kwargs):
    planned, unplanned, result = fake.run(op, *args, **kwargs)
    assert planned == unplanned
    return result


def test_plan_is_built_once_and_replays_the_ops_launches(fake):
    plans = _plan.plans_of(kaio_ops.rms_norm)
    x, w = fake.array((2, 64)), fake.array((64,))
    out = same_as_unplanned(fake, kaio_ops.rms_norm, x, w)
    assert len(plans) == 1 and None not in plans.values()
    assert out.shape == (2, 64) and out.kaio_dtype == f32
    replay = next(iter(plans.values()))
    for _ in range(3):  # new inputs of the same signature: the same plan, new addresses
        x2, w2 = fake.array((2, 64)), fake.array((64,))
        planned, unplanned, out2 = fake.run(kaio_ops.rms_norm, x2, w2)
        assert planned == unplanned
        assert x2.ptr.to_bytes(8, "little") in planned[0][5]
        assert out2.ptr.to_bytes(8, "little") in planned[0][5]
    assert list(plans.values()) == [replay]


def test_replay_does_not_run_the_op(fake, monkeypatch):
    """A hit goes straight to the launch: the op's own body (its checks, its plan) is not
    entered."""
    x, w = fake.array((2, 64)), fake.array((64,))
    kaio_ops.rms_norm(x, w)
    entered = []
    monkeypatch.setattr(kaio_ops.rows, "_run", lambda *a, **k: entered.append(1))
    fake.calls = []
    kaio_ops.rms_norm(fake.array((2, 64)), fake.array((64,)))
    assert not entered and len(fake.calls) == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda g: ((g.array((4, 64)), g.array((64,))), {}),  # shape
        lambda g: ((g.array((2, 64), f16), g.array((64,), f16)), {}),  # dtype
        lambda g: ((g.array((2, 64), offset=4), g.array((64,))), {}),  # alignment
        lambda g: ((g.array((2, 64), device=1), g.array((64,), device=1)), {}),  # device
        lambda g: ((g.array((2, 64)), g.array((64,))), {"eps": 1e-3}),  # a scalar
    ],
    ids=["shape", "dtype", "alignment", "device", "eps"],
)
def test_a_new_signature_gets_a_new_plan(fake, change):
    plans = _plan.plans_of(kaio_ops.rms_norm)
    same_as_unplanned(fake, kaio_ops.rms_norm, fake.array((2, 64)), fake.array((64,)))
    args, kwargs = change(fake)
    same_as_unplanned(fake, kaio_ops.rms_norm, *args, **kwargs)
    assert len(plans) == 2


def test_a_new_stream_gets_a_new_plan(fake):
    x, w = fake.array((2, 64)), fake.array((64,))
    kaio_ops.rms_norm(x, w)
    fake.stream = 0x7F0000005000
    planned, unplanned, _ = fake.run(kaio_ops.rms_norm, x, w)
    assert planned == unplanned and planned[0][4] == 0x7F0000005000
    fake.stream = None
    planned, _, _ = fake.run(kaio_ops.rms_norm, x, w)
    assert planned[0][4] == 0
    assert len(_plan.plans_of(kaio_ops.rms_norm)) == 2


def test_a_plan_of_another_gpu_switches_context(fake, monkeypatch):
    x, w = fake.array((2, 64), device=1), fake.array((64,), device=1)
    kaio_ops.rms_norm(x, w)
    fake.calls = []
    kaio_ops.rms_norm(x, w)  # replayed while GPU 0 is current
    assert fake.calls[0] == ("context", 1)
    monkeypatch.setattr(current, "ordinal", 1)
    fake.calls = []
    kaio_ops.rms_norm(x, w)
    assert fake.calls[0][-1] == 1 and len(fake.calls) == 1


def test_checks_still_raise_once_a_plan_exists(fake):
    x, w = fake.array((2, 64)), fake.array((64,))
    kaio_ops.rms_norm(x, w)
    with pytest.raises(ValueError, match="'w'.*f32"):
        kaio_ops.rms_norm(x, fake.array((64,), f16))
    with pytest.raises(ValueError, match="'w'.*shape"):
        kaio_ops.rms_norm(x, fake.array((32,)))
    with pytest.raises(ValueError, match="'w'.*GPU 1"):
        kaio_ops.rms_norm(x, fake.array((64,), device=1))
    with pytest.raises(ValueError, match="'x'.*contiguous"):
        kaio_ops.rms_norm(fake.array((2, 64), strides=(128, 1)), w)
    with pytest.raises(ValueError, match="'x'.*NumPy"):
        kaio_ops.rms_norm(np.ones((2, 64), np.float32), w)
    with kaio.simulate(), pytest.raises(ValueError, match="'x'.*inside `with kaio.simulate"):
        kaio_ops.rms_norm(x, w)  # the plan's arrays, but the simulator takes NumPy arrays
    assert len(_plan.plans_of(kaio_ops.rms_norm)) == 1


def test_a_scalar_of_another_type_is_checked_again(fake):
    a, b = fake.array((1, 64), i8), fake.array((64, 64), i8)
    MATMUL_MODULE._NO_SCALES.clear()
    kaio_ops.matmul_int8.__wrapped__(a, b, 2.0)  # makes the op's constant placeholder
    same_as_unplanned(fake, kaio_ops.matmul_int8, a, b, 2.0)
    with pytest.raises(ValueError, match="'scale'"):
        kaio_ops.matmul_int8(a, b, np.float32(2.0))


def test_an_array_passed_twice_is_planned_with_each_address_in_its_place(fake):
    """silu_gate(x, x) records its plan with a twin of x in the second place: the plan
    replays silu_gate(x, y) with y's address where the op puts y, and (x, x) as the op
    launches it."""
    x, y = fake.array((1, 256)), fake.array((1, 256))
    same_as_unplanned(fake, kaio_ops.silu_gate, x, x)
    plans = _plan.plans_of(kaio_ops.silu_gate)
    assert len(plans) == 1 and None not in plans.values()
    planned, unplanned, _ = fake.run(kaio_ops.silu_gate, x, y)
    assert planned == unplanned and y.ptr.to_bytes(8, "little") in planned[0][5]
    planned, unplanned, _ = fake.run(kaio_ops.silu_gate, y, y)
    assert planned == unplanned and x.ptr.to_bytes(8, "little") not in planned[0][5]
    assert len(plans) == 1


def test_an_array_without_a_twin_passed_twice_is_not_planned(fake, monkeypatch):
    """An array passed twice that the plan cannot view again runs unplanned."""
    monkeypatch.setattr(_plan, "_twin", lambda a: None)
    x = fake.array((1, 256))
    same_as_unplanned(fake, kaio_ops.silu_gate, x, x)
    assert list(_plan.plans_of(kaio_ops.silu_gate).values()) in ([], [None])


@pytest.mark.parametrize(
    "call",
    [
        lambda g: (kaio_ops.add, g.array((2, 256), bf16), g.array((256,), bf16)),
        lambda g: (
            kaio_ops.rms_norm_residual,
            *(g.array((2, 64), f16) for _ in range(2)),
            g.array((64,), f16),
        ),
        lambda g: (kaio_ops.matmul_tc, g.array((1, 256), f16), g.array((256, 128), f16)),
        lambda g: (
            kaio_ops.flash_attention_varlen,
            g.array((10, 4, 64), bf16),
            g.array((12, 2, 64), bf16),
            g.array((12, 2, 64), bf16),
            g.array((3,), i32),
            g.array((3,), i32),
            7,
            9,
            True,
        ),
    ],  # fmt: skip
    ids=["add", "rms_norm_residual", "matmul_tc", "flash_attention_varlen"],
)
def test_ops_replay_what_they_launch(fake, call):
    op, *args = call(fake)
    first = same_as_unplanned(fake, op, *args)
    fresh = [fake.array(a.shape, a.kaio_dtype) if hasattr(a, "shape") else a for a in args]
    second = same_as_unplanned(fake, op, *fresh)
    plans = _plan.plans_of(op)
    assert len(plans) == 1 and None not in plans.values()
    firsts = first if isinstance(first, tuple) else (first,)
    seconds = second if isinstance(second, tuple) else (second,)
    assert [o.shape for o in firsts] == [o.shape for o in seconds]
    assert {o.ptr for o in firsts}.isdisjoint(o.ptr for o in seconds)  # new outputs each call


def test_an_op_made_of_planned_ops_records_their_launches(fake):
    """A planned op that calls another: while the outer one records, the inner one runs its
    launches through the recorder instead of replaying its own plan past it."""

    @_plan.planned("x", "w")
    def twice(x, w):
        return kaio_ops.rms_norm(kaio_ops.rms_norm(x, w), w)

    x, w = fake.array((2, 64)), fake.array((64,))
    kaio_ops.rms_norm(x, w)  # the inner op's plan exists before the outer one records
    planned, unplanned, _ = fake.run(twice, x, w)
    assert len(planned) == 2 and planned == unplanned
    planned, unplanned, _ = fake.run(twice, fake.array((2, 64)), fake.array((64,)))
    assert len(planned) == 2 and planned == unplanned
    assert len(_plan.plans_of(twice)) == 1


def test_matmul_fp8_replays_what_it_launches(fake, monkeypatch):
    """matmul_fp8 has plans: mma.sync (sm_89) and wgmma (sm_90, tensor maps over the 16-bit
    views the op makes of its inputs and workspace, traced to them at their addresses), with
    and without bias, a row-major b (transposed into a workspace first); a new shape of a
    scale, another plan; a forced tile choice (``_fp8_hopper.config`` replaced) runs
    unplanned; a wrong scale still raises."""
    from kaio import e4m3

    tensormap = importlib.import_module("kaio.tensormap")

    def encode(tm, address=None):  # a fake cuTensorMapEncodeTiled: the address, the box
        address = tm.array.ptr if address is None else address
        return (address.to_bytes(8, "little") + bytes(tm.box)).ljust(128, b"\0")

    monkeypatch.setattr(tensormap, "_encode", encode)
    plans = _plan.plans_of(kaio_ops.matmul_fp8)

    def args(m=16, per_row=False):
        a, b = fake.array((m, 64), e4m3), fake.array((64, 32), e4m3)
        sa = fake.array((m, 1) if per_row else (1,), f32)
        return a, b, sa, fake.array((1,), f32)

    # one fake GPU for both kernels: launchers keep the kernel handles they were built with
    for arch in ((8, 9), (9, 0)):
        gpu = types.SimpleNamespace(compute_capability=arch, multiprocessor_count=132)
        monkeypatch.setattr(_arrays, "gpu", lambda like, gpu=gpu: gpu)
        _plan.clear()  # the fake GPUs are both GPU 0
        for kwargs in ({}, {"bias": None}, {"out_dtype": "f16"}):
            for _ in range(2):
                planned, unplanned, _ = fake.run(kaio_ops.matmul_fp8, *args(), **kwargs)
                assert planned == unplanned
        bias = fake.array((32,), bf16)
        planned, unplanned, _ = fake.run(kaio_ops.matmul_fp8, *args(), bias=bias)
        assert planned == unplanned
        assert bias.ptr.to_bytes(8, "little") in planned[-1][5]
        assert None not in plans.values()
        count = len(plans)
        planned, unplanned, _ = fake.run(kaio_ops.matmul_fp8, *args(per_row=True))
        assert planned == unplanned and len(plans) == count + 1
        with pytest.raises(ValueError, match="scale_a"):
            kaio_ops.matmul_fp8(*args()[:2], fake.array((3,), f32), args()[3])
    hopper = importlib.import_module("kaio_ops._fp8_hopper")
    count, chosen = len(plans), hopper.config
    forced = hopper.plan(1, 128)[:5]  # a tile choice forced (the plan search, tests)
    assert chosen(16, 32, 64, 132)[:5] != forced
    monkeypatch.setattr(hopper, "config", lambda *a: forced)
    for _ in range(2):
        planned, unplanned, _ = fake.run(kaio_ops.matmul_fp8, *args())
        assert planned == unplanned and len(plans) == count  # runs unplanned, as forced
    assert kaio_ops.matmul_fp8.replay_only(*args(), None, None) is _plan.MISS
    monkeypatch.setattr(hopper, "config", chosen)
    assert kaio_ops.matmul_fp8.replay_only(*args(), None, None) is not _plan.MISS


# ----------------------------------------------------------------------------- on a GPU
def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    return torch


def _rms_reference(torch, x, w, eps=1e-6):
    x64, w64 = x.double(), w.double()
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64


def _error(torch, got, want) -> float:
    got = got.double()
    return (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()


@pytest.mark.gpu
def test_replays_compute_on_new_inputs_streams_and_graphs():
    """Replayed calls on a GPU: new inputs each call (the later ones through the fast path,
    calls of another shape and in inference mode between them), another stream, a CUDA
    graph captured from replays (its kernels read the captured inputs' new contents)."""
    torch = _torch_cuda()
    _plan.clear()
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    for rows in (2, 2, 2, 2, 2, 3, 2, 2, 2, "inference", 2, 2, 2):
        with torch.inference_mode(rows == "inference"):
            x = torch.randn(2 if rows == "inference" else rows, 4096, device="cuda").half()
            out = kaio_ops.rms_norm(x, w)
            assert _error(torch, out, _rms_reference(torch, x, w)) < 1e-3
            del out
    assert kaio_ops.rms_norm.__globals__["FAST"][0] is not None
    assert len(_plan.plans_of(kaio_ops.rms_norm)) == 2
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(2, 4096, device="cuda", dtype=torch.float16)
        out = kaio_ops.rms_norm(x, w)
    side.synchronize()
    assert _error(torch, out, _rms_reference(torch, x, w)) < 1e-3
    assert len(_plan.plans_of(kaio_ops.rms_norm)) == 3
    static = torch.randn(2, 4096, device="cuda", dtype=torch.float16)
    capture = torch.cuda.Stream()
    with torch.cuda.stream(capture):
        kaio_ops.rms_norm(static, w)  # the plan of the capture stream, built outside capture
    capture.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        captured = kaio_ops.rms_norm(static, w)
    static.copy_(torch.randn(2, 4096, device="cuda", dtype=torch.float16))
    graph.replay()
    torch.cuda.synchronize()
    assert _error(torch, captured, _rms_reference(torch, static, w)) < 1e-3


@pytest.mark.gpu
def test_torch_ops_replay_and_still_copy_strided_inputs():
    torch = _torch_cuda()
    import kaio_ops.torch  # noqa: F401

    w = torch.randn(512, device="cuda", dtype=torch.float16)
    for _ in range(2):
        x = torch.randn(3, 512, device="cuda", dtype=torch.float16)
        out = torch.ops.kaio.rms_norm(x, w)
        assert _error(torch, out, _rms_reference(torch, x, w)) < 1e-3
    strided = torch.randn(512, 3, device="cuda", dtype=torch.float16).t()  # a new signature
    out = torch.ops.kaio.rms_norm(strided, w)
    assert _error(torch, out, _rms_reference(torch, strided, w)) < 1e-3
    with pytest.raises(ValueError, match="contiguous"):
        kaio_ops.rms_norm(strided, w)


@pytest.mark.gpu
def test_a_plan_runs_on_its_inputs_gpu():
    torch = _torch_cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        x = torch.randn(2, 1024, device=device, dtype=torch.float16)
        w = torch.randn(1024, device=device, dtype=torch.float16)
        out = kaio_ops.rms_norm(x, w)
        assert out.device == x.device
        assert _error(torch, out, _rms_reference(torch, x, w)) < 1e-3


# ------------------------------------------------- ops with keyword-only and optional arrays
def _linear_args(g, dtype=f16, bias=True, residual=True):
    x, w = g.array((1, 64), dtype), g.array((128, 64), dtype)
    b = g.array((128,), dtype) if bias else None
    r = g.array((1, 128), dtype) if residual else None
    return (x, w, b), {"residual": r}


def test_linear_plans_keyword_only_and_none_arguments(fake):
    """linear's keyword-only arguments (residual, activation, out_dtype) and its optional
    arrays given as None or not are part of the key: each gets its own plan, each replays
    exactly what the op launches."""
    plans = _plan.plans_of(kaio_ops.linear)
    calls = [
        ({}, {}),
        ({"bias": False, "residual": False}, {}),
        ({"residual": False}, {"activation": "silu"}),
        ({}, {"out_dtype": "f32"}),
        ({}, {"out_dtype": f32}),  # the same type named differently: its own key
        ({"bias": False, "residual": False}, {"activation": "silu_gate"}),
    ]
    for made, extra in calls:
        for _ in range(2):  # the second call replays the first one's plan
            args, kwargs = _linear_args(fake, **made)
            out = same_as_unplanned(fake, kaio_ops.linear, *args, **kwargs, **extra)
    assert len(plans) == len(calls) and None not in plans.values()
    assert out.shape == (1, 64)  # silu_gate: half the rows
    x, w, b = _linear_args(fake)[0]
    r = fake.array((1, 128), f16)
    planned, unplanned, out = fake.run(kaio_ops.linear, x, w, b, residual=r)
    assert planned == unplanned and len(plans) == len(calls)
    for a in (x, w, b, r, out):  # every address is the call's own
        assert a.ptr.to_bytes(8, "little") in planned[0][5]
    with pytest.raises(ValueError, match="'activation'"):
        kaio_ops.linear(x, w, b, activation="relu")
    with pytest.raises(ValueError, match="'residual'"):
        kaio_ops.linear(x, w, b, residual=fake.array((1, 64), f16))


def test_matmul_plans_out_dtype(fake):
    plans = _plan.plans_of(kaio_ops.matmul)
    for out_dtype in (None, None, "f32", "f32"):
        a, b = fake.array((1, 256), bf16), fake.array((256, 128), bf16)
        out = same_as_unplanned(fake, kaio_ops.matmul, a, b, out_dtype=out_dtype)
    assert out.kaio_dtype == f32 and len(plans) == 2 and None not in plans.values()


def _decode_args(g, paged=False, batch=2):
    q = g.array((batch, 8, 1, 64), f16)
    lens = g.array((batch,), kaio.i32)
    if paged:
        k, v = (g.array((8, 16, 2, 64), f16) for _ in range(2))
        return q, k, v, lens, g.array((batch, 32), kaio.i32)
    k, v = (g.array((batch, 2, 512, 64), f16) for _ in range(2))
    return q, k, v, lens, None


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decode_ops_replay_what_they_launch(fake, paged):
    """flash_attention_decode (split over the keys: a workspace allocated per call and a merge
    kernel), its _with_stats form and kv_cache_append (which writes its inputs and returns
    None) replay their launches with each call's addresses and new workspaces."""
    ops = (kaio_ops.flash_attention_decode, kaio_ops.flash_attention_decode_with_stats)
    for op in ops:
        results = []
        for _ in range(2):
            q, k, v, lens, table = _decode_args(fake, paged)
            planned, unplanned, result = fake.run(op, q, k, v, lens, table)
            assert planned == unplanned and len(planned) == 2  # split, then merged
            assert q.ptr.to_bytes(8, "little") in planned[0][5]
            results.append(result)
        assert len(_plan.plans_of(op)) == 1 and None not in _plan.plans_of(op).values()
        first, second = (r if isinstance(r, tuple) else (r,) for r in results)
        assert {o.ptr for o in first}.isdisjoint(o.ptr for o in second)
    same_as_unplanned(fake, ops[0], *_decode_args(fake, paged), scale=0.5)
    assert len(_plan.plans_of(ops[0])) == 2
    plans = _plan.plans_of(kaio_ops.kv_cache_append)
    for _ in range(2):
        q, k_cache, v_cache, lens, table = _decode_args(fake, paged)
        k, v = (fake.array((2, 2, 1, 64), f16) for _ in range(2))
        planned, unplanned, result = fake.run(
            kaio_ops.kv_cache_append, k_cache, v_cache, k, v, lens, table
        )
        assert result is None and planned == unplanned
        assert k_cache.ptr.to_bytes(8, "little") in planned[0][5]
    assert len(plans) == 1 and None not in plans.values()


def test_folded_decode_replays_what_it_launches(fake, monkeypatch):
    """decode_folded (two sequences a block, B64-sized calls) replays its one launch."""
    monkeypatch.setattr(kaio_ops.decode, "folds", lambda *_: 2)
    q, k, v, lens, table = _decode_args(fake, paged=True, batch=3)
    planned, unplanned, _ = fake.run(kaio_ops.flash_attention_decode, q, k, v, lens, table)
    assert planned == unplanned and len(planned) == 1


def test_decode_none_block_table_and_a_table_get_their_own_plans(fake):
    op = kaio_ops.flash_attention_decode
    same_as_unplanned(fake, op, *_decode_args(fake, paged=False))
    same_as_unplanned(fake, op, *_decode_args(fake, paged=True))
    assert len(_plan.plans_of(op)) == 2
    q, k, v, lens, table = _decode_args(fake, paged=True)
    with pytest.raises(ValueError, match="'block_table'"):
        op(q, k, v, lens, fake.array((2, 32), f32))


def test_planned_keyword_only_signature_is_kept():
    import inspect

    sig = inspect.signature(kaio_ops.linear)
    assert sig.parameters["residual"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError):
        kaio_ops.linear(None, None, None, None)  # residual is keyword-only


def test_torch_ops_fast_path_takes_keyword_only_arguments_positionally(fake, monkeypatch):
    """torch.ops.kaio.linear's implementation gets every argument positionally (the
    dispatcher's order): a call with a plan replays it through ``dispatch_entry`` without the
    device checks or the op's body; a call without one runs the op (keyword-only arguments
    passed by name) and leaves a plan."""
    pytest.importorskip("torch")
    import kaio_ops.torch as kt

    names = ["x", "w", "bias", "residual", "activation", "out_dtype"]
    impl = kt._implementation(kt.REGISTERED["linear"], names)
    (x, w, b), kw = _linear_args(fake)
    out = impl(x, w, b, kw["residual"], "silu", "f32")  # a miss: the op runs, a plan is left
    assert out.kaio_dtype == f32 and len(_plan.plans_of(kaio_ops.linear)) == 1

    def entered(*args):
        raise AssertionError("a call with a plan went past dispatch_entry")

    monkeypatch.setattr(kt, "_check_devices", entered)
    monkeypatch.setattr(linear_module, "gemm", entered)  # the op's body
    (x, w, b), kw = _linear_args(fake)
    fake.calls = []
    out = impl(x, w, b, kw["residual"], "silu", "f32")
    assert len(fake.calls) == 1 and out.kaio_dtype == f32
    for a in (x, w, b, kw["residual"], out):
        assert a.ptr.to_bytes(8, "little") in fake.calls[0][5]
    assert kaio_ops.linear.replay_only(x, w, b, None, "silu", "f32") is _plan.MISS


def test_linear_on_hopper_replays_its_tensor_maps(fake, monkeypatch):
    """The Hopper GEMM takes TMA tensor maps, which hold their array's address: a plan
    encodes the map again for each call's address (x seen as [M, K] through a view the op
    makes, w as it is), keeping those it has met, and where a buffer's map holds another
    address."""
    tensormap = importlib.import_module("kaio.tensormap")  # the module, not the annotation
    encoded = []

    def encode(tm, address=None):  # a fake cuTensorMapEncodeTiled: the address, the box
        address = tm.array.ptr if address is None else address
        encoded.append(address)
        return (address.to_bytes(8, "little") + bytes(tm.box)).ljust(128, b"\0")

    monkeypatch.setattr(tensormap, "_encode", encode)
    monkeypatch.setattr(linear_module, "_hopper", lambda a: True)
    plans = _plan.plans_of(kaio_ops.linear)
    seen = []
    for _ in range(3):
        # 32 rows: past linear.SKINNY_M, where sm_90 takes the Hopper kernel
        x, w = fake.array((1, 32, 64), f16), fake.array((128, 64), f16)
        r = fake.array((1, 32, 128), f16)
        planned, unplanned, _ = fake.run(kaio_ops.linear, x, w, residual=r)
        assert planned == unplanned
        for a in (x, w, r):
            assert a.ptr.to_bytes(8, "little") in planned[0][5]
        seen.append(x.ptr)
    assert len(plans) == 1 and None not in plans.values()
    maps = [tm for prepared, _ in next(iter(plans.values())).plan.steps
            for _, tm in prepared.maps.values()]  # fmt: skip
    assert len(maps) == 2 and all(tm.array is None for tm in maps)  # the arrays are not kept
    encoded.clear()
    fake.calls = []
    kaio_ops.linear(x, w, residual=r)  # addresses met before: no new encoding
    assert not encoded and len(fake.calls) == 1
    from kaio.runtime import plan as plan_mod

    monkeypatch.setattr(plan_mod, "MAPS_KEPT", 2)
    for _ in range(3):  # more addresses than kept: the oldest go, every launch stays right
        x = fake.array((1, 32, 64), f16)
        planned, unplanned, _ = fake.run(kaio_ops.linear, x, w, residual=r)
        assert planned == unplanned and x.ptr.to_bytes(8, "little") in planned[0][5]
    # a buffer whose map holds the call's address keeps it; another address is encoded
    xs = [fake.array((1, 32, 64), f16) for _ in range(2)]
    for i in (0, 0, 1, 0, 1, 1):
        fake.calls = []
        kaio_ops.linear(xs[i], w, residual=r)
        (call,) = fake.calls
        assert xs[i].ptr.to_bytes(8, "little") in call[5]
        assert xs[1 - i].ptr.to_bytes(8, "little") not in call[5]


@pytest.mark.gpu
def test_linear_and_decode_replay_on_a_gpu():
    """linear (3-D x as the hf patch passes it; the Hopper GEMM with its tensor maps on
    sm_90), kv_cache_append and flash_attention_decode (split over the keys, its per-stream
    counters a plan constant) replayed with new inputs and lengths each step, against
    float64 references."""
    torch = _torch_cuda()
    _plan.clear()
    gen = torch.Generator(device="cuda").manual_seed(7)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen)

    w, b = randn(256, 128) / 12, randn(256)
    for _ in range(3):
        x, r = randn(1, 1, 128), randn(1, 1, 256)
        y = kaio_ops.linear(x, w, b, residual=r)
        want = x.double() @ w.double().T + b.double() + r.double()
        assert _error(torch, y, want) < 2e-3
    assert len(_plan.plans_of(kaio_ops.linear)) == 1
    assert None not in _plan.plans_of(kaio_ops.linear).values()
    batch, heads, kv_heads, d, capacity = 2, 8, 2, 128, 1024
    k_cache, v_cache = randn(batch, kv_heads, capacity, d), randn(batch, kv_heads, capacity, d)
    lens = torch.tensor([700, 313], device="cuda", dtype=torch.int32)
    for _ in range(3):
        lens += 1
        k, v = randn(batch, kv_heads, 1, d), randn(batch, kv_heads, 1, d)
        kaio_ops.kv_cache_append(k_cache, v_cache, k, v, lens)
        q = randn(batch, heads, 1, d)
        out = kaio_ops.flash_attention_decode(q, k_cache, v_cache, lens)
        for i, n in enumerate(lens.tolist()):
            assert torch.equal(k_cache[i, :, n - 1], k[i, :, 0])
            assert torch.equal(v_cache[i, :, n - 1], v[i, :, 0])
            keys = k_cache[i, :, :n].double().repeat_interleave(heads // kv_heads, 0)
            values = v_cache[i, :, :n].double().repeat_interleave(heads // kv_heads, 0)
            scores = q[i].double() @ keys.transpose(1, 2) / d**0.5
            want = torch.softmax(scores, -1) @ values
            assert _error(torch, out[i], want) < 2e-3
    for op in (kaio_ops.kv_cache_append, kaio_ops.flash_attention_decode):
        assert len(_plan.plans_of(op)) == 1 and None not in _plan.plans_of(op).values()


@pytest.mark.gpu
def test_torch_ops_composite_and_repeated_array_calls_build_and_replay_plans():
    """torch.ops.kaio.flash_attention_decode builds and then replays the plan of
    kaio_ops.flash_attention_decode (one dispatch a call); silu_gate(x, x) and
    flash_attention(q, kv, kv) are planned, and their plans serve calls with distinct
    arrays; every result against a float64 reference."""
    torch = _torch_cuda()
    import kaio_ops.torch  # noqa: F401 (registers torch.ops.kaio)

    _plan.clear()
    gen = torch.Generator(device="cuda").manual_seed(5)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen)

    lens = torch.tensor([300], device="cuda", dtype=torch.int32)
    for _ in range(3):
        q, k, v = randn(1, 8, 1, 64), randn(1, 2, 512, 64), randn(1, 2, 512, 64)
        out = torch.ops.kaio.flash_attention_decode(q, k, v, lens)
        keys, values = (t[0, :, :300].double().repeat_interleave(4, 0) for t in (k, v))
        scores = q[0].double() @ keys.transpose(1, 2) / 8.0
        assert _error(torch, out[0], torch.softmax(scores, -1) @ values) < 2e-3
    plans = _plan.plans_of(kaio_ops.flash_attention_decode)
    assert len(plans) == 1 and None not in plans.values()
    assert not _plan.plans_of(kaio_ops.flash_attention_decode_with_stats)

    x, y = randn(2, 256), randn(2, 256)
    for a, b in ((x, x), (x, y), (y, y)):
        got = kaio_ops.silu_gate(a, b)
        want = torch.nn.functional.silu(a.double()) * b.double()
        assert _error(torch, got, want) < 2e-3
    assert list(_plan.plans_of(kaio_ops.silu_gate).values()) != [None]
    q, kv, kv2 = randn(1, 4, 1, 64), randn(1, 4, 128, 64), randn(1, 4, 128, 64)
    for k, v in ((kv, kv), (kv, kv2)):
        got = kaio_ops.flash_attention(q, k, v)
        want = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8.0, -1) @ v.double()
        assert _error(torch, got, want) < 2e-3
    plans = _plan.plans_of(kaio_ops.flash_attention)
    assert len(plans) == 1 and None not in plans.values()


@pytest.mark.gpu
def test_matmul_fp8_plans_compute_right_on_a_gpu():
    """On an fp8 GPU: matmul_fp8 replays its plans on new inputs (b column-major, as torch
    takes it, and row-major: transposed into a workspace first; per-tensor and per-row
    scales; bias) with the results of float64 on the same fp8 values."""
    torch = _torch_cuda()
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89 or newer")
    _plan.clear()
    gen = torch.Generator(device="cuda").manual_seed(5)
    m, k, n = 16, 256, 128
    for rowwise, col_major, biased in (
        (False, True, False),
        (True, True, True),
        (False, False, True),
    ):
        for _ in range(3):  # recorded, then replayed on new inputs
            x = torch.randn(m, k, device="cuda", generator=gen)
            w = torch.randn(n, k, device="cuda", generator=gen)
            a, sa = kaio_ops.quantize_fp8(x, per="row" if rowwise else "tensor")
            wq, sw = kaio_ops.quantize_fp8(w, per="row" if rowwise else "tensor")
            sb = sw.view(1, n) if rowwise else sw
            b = wq.t() if col_major else wq.t().contiguous()
            bias = torch.randn(n, device="cuda", generator=gen).bfloat16() if biased else None
            got = kaio_ops.matmul_fp8(a, b, sa, sb, bias=bias)
            want = (a.double() @ b.double()) * sa.double().reshape(-1, 1) * sb.double()
            if biased:
                want = want + bias.double()
            assert _error(torch, got, want) < 1e-2
    plans = _plan.plans_of(kaio_ops.matmul_fp8)
    assert len(plans) == 3 and None not in plans.values()


@pytest.mark.gpu
def test_outputs_unlike_their_inputs_handed_out_again_on_a_gpu(monkeypatch):
    """On a GPU: the f32 output of matmul_tc (f16 inputs) and matmul_int8 (int8 inputs),
    dropped, comes back from the next call with the new product, right each time."""
    torch = _torch_cuda()
    monkeypatch.setattr(_plan, "RECYCLE_BYTES", 1 << 20)  # the default
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    _plan.clear()
    gen = torch.Generator(device="cuda").manual_seed(4)
    w = torch.randn(1024, 512, device="cuda", dtype=torch.float16, generator=gen)
    b8 = torch.randint(-128, 128, (1024, 512), device="cuda", dtype=torch.int8, generator=gen)
    for op, make, other in (
        (kaio_ops.matmul_tc, lambda: torch.randn(1, 1024, device="cuda", dtype=torch.float16,
                                                 generator=gen), w),
        (kaio_ops.matmul_int8, lambda: torch.randint(-128, 128, (1, 1024), device="cuda",
                                                     dtype=torch.int8, generator=gen), b8),
    ):  # fmt: skip
        for _ in range(3):  # torch's types bound, the plan recorded, replayed
            op(make(), other)
        op(make(), other).kaio_test_mark = 0
        for i in range(3):
            x = make()
            out = op(x, other)
            assert out.kaio_test_mark == i and out.dtype == torch.float32
            assert _error(torch, out, x.double() @ other.double()) < 1e-5
            out.kaio_test_mark = i + 1
            del out


@pytest.mark.gpu
def test_outputs_handed_out_again_compute_right_on_a_gpu(monkeypatch):
    """On a GPU: an add whose output was dropped hands the same tensor out again, with the
    new result, but not while a detached tensor, an inference-mode view or its storage
    uses its memory; outputs the caller keeps are all distinct and right; a graph captured
    meanwhile keeps its own output."""
    torch = _torch_cuda()
    monkeypatch.setattr(_plan, "RECYCLE_BYTES", 1 << 20)  # the default
    monkeypatch.setattr(_plan, "RECYCLING", [True])  # whatever ran before in this process
    _plan.clear()
    gen = torch.Generator(device="cuda").manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen)

    y = randn(1, 4096)
    for _ in range(3):  # torch's types bound, the plan recorded, replayed
        kaio_ops.add(randn(1, 4096), y)
    kaio_ops.add(randn(1, 4096), y).kaio_test_mark = 0  # a mark tells the object again
    for i in range(3):
        x = randn(1, 4096)
        out = kaio_ops.add(x, y)
        assert out.kaio_test_mark == i  # the last output, dropped: handed out again
        assert _error(torch, out, x.double() + y.double()) < 1e-3
        out.kaio_test_mark = i + 1
        del out
    # dropped while a detached tensor, a view made in inference mode or its storage still
    # uses its memory: never handed out again

    def detached(t):  # what is kept of t, and how it is read as a tensor
        kept = t.detach()
        return lambda: kept

    def viewed(t):
        kept = t.view(4096)
        return lambda: kept

    def storage(t):
        kept, dtype = t.untyped_storage(), t.dtype
        return lambda: torch.empty(0, dtype=dtype, device="cuda").set_(kept)

    for inference, keep in ((False, detached), (True, viewed), (False, storage)):
        with torch.inference_mode(inference):
            x = randn(1, 4096)
            for _ in range(3):  # the plan's fast path, in that mode
                kaio_ops.add(randn(1, 4096), y)
            kept = keep(kaio_ops.add(x, y))
            later = [kaio_ops.add(randn(1, 4096), y) for _ in range(3)]
            assert all(o.data_ptr() != kept().data_ptr() for o in later)
            assert _error(torch, kept().view(1, 4096), x.double() + y.double()) < 1e-3
    xs = [randn(1, 4096) for _ in range(3)]
    kept = [kaio_ops.add(x, y) for x in xs]
    assert len({id(o) for o in kept}) == 3
    for x, out in zip(xs, kept, strict=True):
        assert _error(torch, out, x.double() + y.double()) < 1e-3
    static = randn(1, 4096)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        kaio_ops.add(static, y)  # the capture stream's plan, outside the capture
    capture.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        captured = kaio_ops.add(static, y)
    with torch.cuda.stream(capture):
        eager = [kaio_ops.add(x, y) for x in xs]
    static.copy_(randn(1, 4096))
    graph.replay()
    torch.cuda.synchronize()
    assert all(captured is not o for o in eager)
    assert _error(torch, captured, static.double() + y.double()) < 1e-3
    for x, out in zip(xs, eager, strict=True):
        assert _error(torch, out, x.double() + y.double()) < 1e-3
    # an output read on another stream, recorded there and dropped: never handed out again
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    _plan.clear()
    side = torch.cuda.Stream()
    x = randn(1, 4096)
    for _ in range(2):
        kaio_ops.add(x, y)
    out = kaio_ops.add(x, y)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # the side stream still reads out after the drop
        total = out.double().sum()
    out.record_stream(side)
    out.kaio_test_mark = "read on the side stream"
    want = (x.double() + y.double()).sum()
    del out
    assert not hasattr(kaio_ops.add(randn(1, 4096), y), "kaio_test_mark")
    side.synchronize()
    assert abs(total.item() - want.item()) < 1.0


def capture_untold(monkeypatch, torch) -> None:
    """Replays made as on a host without a GPU, whatever this one has: torch cannot tell a
    stream's capture (its stand-in raises), so outputs are never handed out again and
    workspaces never kept between calls (``_plan``'s paths that need the capture test)."""

    def no_driver():
        raise RuntimeError("no CUDA driver (the test's stand-in)")

    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", no_driver)


class _TorchKeys:
    """The keys a planned op's wrapper makes for torch tensors, on the CPU: the op's plan
    lookups and misses are recorded, the current stream is ``stream``, and tensors of the
    subclass ``OnGPU`` (CPU tensors that say they are on GPU ``gpu``) are read as the wrapper
    reads ``torch.nn.Parameter``s, with torch's own accessors."""

    def __init__(self, monkeypatch, op):
        import torch

        class OnGPU(torch.Tensor):
            gpu = 0

            def get_device(self):
                return self.gpu

        self.torch, self.OnGPU, self.op = torch, OnGPU, op
        self.stream = 0x7F00_0000_1000
        self.misses: list = []
        env = op.__globals__  # the generated wrapper's namespace
        monkeypatch.setitem(env, "P", OnGPU)
        monkeypatch.setitem(env, "RAW", lambda device: self.stream)
        monkeypatch.setitem(env, "slow", lambda key, args, pointers: self.misses.append(key))
        self.plans = _plan.plans_of(op)
        self.plans.clear()
        capture_untold(monkeypatch, torch)  # the marks replays return are not tensors

    def tensor(self, *shape, dtype=None, gpu=0, t=False, offset=0):
        """A new ``OnGPU`` tensor (transposed when ``t``; ``offset`` elements into its
        memory)."""
        torch = self.torch
        base = torch.randn(*shape, offset + 1, dtype=dtype or torch.float32)
        a = base.flatten()[offset : offset + math.prod(shape)].view(shape)
        a = (a.t().contiguous().t() if t else a).as_subclass(self.OnGPU)
        a.gpu = gpu
        return a

    def key(self, *args, **kwargs):
        """The key of a call with no plan (its miss)."""
        before = len(self.misses)
        self.op(*args, **kwargs)
        assert len(self.misses) == before + 1
        return self.misses[-1]


def test_torch_keys_tell_every_signature_apart(monkeypatch):
    """The wrapper's own key for torch tensors (flat, torch's accessors): one signature, one
    key, whatever the tensors' addresses; another shape, dtype, strides, alignment, GPU,
    stream or scalar, another key."""
    pytest.importorskip("torch")
    keys = _TorchKeys(monkeypatch, kaio_ops.rms_norm)
    t, torch = keys.tensor, keys.torch
    first = keys.key(t(4, 64), t(64))
    assert keys.key(t(4, 64), t(64)) == first  # new tensors, same signature
    assert keys.key(t(4, 64), t(64), eps=1e-6) == first  # the default, given
    others = [
        keys.key(t(8, 64), t(64)),  # shape
        keys.key(t(4, 64, dtype=torch.float16), t(64, dtype=torch.float16)),  # dtype
        keys.key(t(4, 64, t=True), t(64)),  # strides (column-major)
        keys.key(t(4, 128)[:, :64], t(64)),  # strides (rows of 128), also not contiguous
        keys.key(t(4, 64, offset=1), t(64)),  # alignment (4 bytes off 16)
        keys.key(t(4, 64), t(64, gpu=1)),  # the second array's GPU
        keys.key(t(4, 64, gpu=1), t(64, gpu=1)),  # both on another GPU
        keys.key(t(4, 64), t(64), 1e-3),  # a scalar
        keys.key(t(4, 64), t(64), 1),  # the same value, another type
    ]
    keys.stream = 0x7F00_0000_2000
    others.append(keys.key(t(4, 64), t(64)))  # another stream
    assert len({first, *others}) == 1 + len(others)


def test_torch_calls_replay_only_their_own_plan(monkeypatch):
    """A plan stored under a torch call's key is replayed, with the new tensors' addresses,
    by calls of that signature and by no other (through the op, through ``replay_only``
    and through ``dispatch_entry``, torch.ops.kaio's entry, which calls its fallback on a
    miss)."""
    pytest.importorskip("torch")
    keys = _TorchKeys(monkeypatch, kaio_ops.rms_norm)
    t = keys.tensor
    keys.key(t(4, 64), t(64))
    keys.plans[keys.misses[-1]] = lambda p0, p1, *arrays: ("replayed", (p0, p1))
    x, w = t(4, 64), t(64)
    assert kaio_ops.rms_norm(x, w) == ("replayed", (x.data_ptr(), w.data_ptr()))
    assert kaio_ops.rms_norm.replay_only(x, w, 1e-6) == ("replayed", (x.data_ptr(), w.data_ptr()))
    entry = kaio_ops.rms_norm.dispatch_entry(lambda *args: ("fell back", args))
    assert entry(x, w, 1e-6) == ("replayed", (x.data_ptr(), w.data_ptr()))
    assert entry(x, w, eps=1e-6) == ("replayed", (x.data_ptr(), w.data_ptr()))
    for stale in [(t(4, 64, t=True), t(64)), (t(4, 32), t(32)), (t(4, 64), t(64, gpu=1))]:
        assert kaio_ops.rms_norm(*stale) is None  # a miss (recorded), not the plan
        assert kaio_ops.rms_norm.replay_only(*stale, 1e-6) is _plan.MISS
        assert entry(*stale, 1e-6) == ("fell back", (*stale, 1e-6))


def _plan_of_marks(keys, key, shape, arrays: int = 2) -> list:
    """A replay (``_plan._replay``, no launches) of an op of ``arrays`` array parameters,
    stored under ``key``, that returns the mark "replayed" and counts its calls in the
    returned list."""
    replay = _plan._replay(None, arrays, [(None, "torch", 0, None, shape, f32, None)], "o0")
    served: list = []
    replay.__globals__["A0"] = lambda: served.append(1) or "replayed"
    keys.plans[key] = replay
    return served


def test_the_fast_path_serves_only_the_signature_of_its_plan(monkeypatch):
    """Two calls in a row that hit one plan arm its fast path (one tensor_check for every
    tensor), which then serves the calls of that signature (through the op, replay_only and
    dispatch_entry); a call of any other signature (shape, dtype, strides, alignment, scalar
    value or type, stream) or in a recording is not served by it but looked up as before,
    and turns it off until two calls in a row hit one plan again; a tensor the check refuses
    but the key allows (one requiring a gradient) is replayed through the key.
    Calls that take turns between plans never arm it; clear() turns it off."""
    pytest.importorskip("torch")
    keys = _TorchKeys(monkeypatch, kaio_ops.rms_norm)
    t, torch, op = keys.tensor, keys.torch, kaio_ops.rms_norm
    fast = op.__globals__["FAST"]
    x, w = t(4, 64), t(64)
    served = _plan_of_marks(keys, keys.key(x, w), (4, 64))
    assert [op(x, w), fast[0]] == ["replayed", None]  # a hit: counted
    assert op(x, w) == "replayed" and fast[0] is not None  # the second in a row: armed
    quick = fast[0]
    assert op(t(4, 64), t(64)) == "replayed" and fast[0] is quick and len(served) == 3
    assert op.replay_only(t(4, 64), t(64), 1e-6) == "replayed" and fast[0] is quick
    entry = op.dispatch_entry(lambda *args: "fell back")
    assert entry(t(4, 64), t(64), 1e-6) == "replayed" and fast[0] is quick
    stale = [
        (t(8, 64), t(64)),  # shape
        (t(4, 64, dtype=torch.float16), t(64, dtype=torch.float16)),  # dtype
        (t(4, 64, t=True), t(64)),  # strides
        (t(4, 64, offset=1), t(64)),  # alignment
        (t(4, 64), t(64), 1e-3),  # a scalar's value
        (t(4, 64), t(64), 1),  # its type
    ]
    for args in stale:
        misses = len(keys.misses)
        assert op(*args) is None and len(keys.misses) == misses + 1  # looked up: a miss
        assert fast[0] is None
        assert op(x, w) == "replayed" and fast[0] is None
        assert op(x, w) == "replayed" and fast[0] is quick  # armed again, the same function
    keys.stream = 0x7F00_0000_2000  # another stream: another key
    assert op(x, w) is None and fast[0] is None
    keys.stream = 0x7F00_0000_1000
    for _ in range(2):
        op(x, w)
    with _plan.recording():
        assert op(x, w) is None  # a recording looks up (a miss here)
    for _ in range(2):
        op(x, w)
    assert op(t(4, 64).requires_grad_(), w) == "replayed" and fast[0] is None  # by the key
    assert op(x, w) == "replayed" and fast[0] is quick  # the second hit in a row
    other = t(4, 32), t(32)
    _plan_of_marks(keys, keys.key(*other), (4, 32))
    fast[0] = op.__globals__["LAST"][0] = None
    for _ in range(3):  # taking turns: never armed
        assert op(x, w) == "replayed" and op(*other) == "replayed" and fast[0] is None
    op(x, w)
    op(x, w)
    assert fast[0] is not None
    _plan.clear()
    assert fast[0] is None and op.__globals__["LAST"][0] is None


def test_the_fast_path_of_an_optional_array(monkeypatch):
    """A fast path armed with an optional array given as None serves only calls that give
    None there."""
    pytest.importorskip("torch")
    keys = _TorchKeys(monkeypatch, kaio_ops.linear)
    t, op = keys.tensor, kaio_ops.linear
    x, w = t(2, 64), t(32, 64)
    _plan_of_marks(keys, keys.key(x, w), (2, 32), arrays=4)
    for _ in range(3):
        assert op(x, w) == "replayed"
    assert op.__globals__["FAST"][0] is not None
    assert op(x, w, t(32)) is None  # a bias: looked up, a miss
    assert op(x, w, residual=t(2, 32)) is None


def test_torch_keys_of_an_optional_array(monkeypatch):
    """An optional array given as None and given as a tensor make different keys."""
    pytest.importorskip("torch")
    keys = _TorchKeys(monkeypatch, kaio_ops.linear)
    t = keys.tensor
    none = keys.key(t(2, 64), t(32, 64))
    assert keys.key(t(2, 64), t(32, 64), None) == none
    bias = keys.key(t(2, 64), t(32, 64), t(32))
    residual = keys.key(t(2, 64), t(32, 64), residual=t(2, 32))
    assert len({none, bias, residual}) == 3


def test_launches_recover_a_missing_or_foreign_context(fake, monkeypatch):
    """A launch the driver refuses for want of a context (a new thread: 201) makes the GPU's
    context current and launches again; one refused for another library's context (400)
    launches with the GPU's context made current for the call; any other error raises. The
    same for a kernel launcher (the recording call) and a plan's replay."""
    from kaio.runtime import device as device_mod

    made_current = []

    class Device:
        def __init__(self, ordinal):
            self.ordinal = ordinal

        def set_current(self):
            made_current.append(self.ordinal)

    monkeypatch.setattr(launcher_mod, "Device", Device)
    monkeypatch.setattr(device_mod, "Device", Device)
    codes: list = []  # what the next launches return
    launched = fake.launch
    monkeypatch.setattr(fake, "launch", lambda *a: codes.pop(0) if codes else launched(*a))
    x, w = fake.array((2, 64)), fake.array((64,))
    kaio_ops.rms_norm(x, w)  # the plan
    for op in (kaio_ops.rms_norm.__wrapped__, kaio_ops.rms_norm):  # the launcher, the plan
        codes[:], made_current[:], fake.calls = [201], [], []
        op(x, w)
        assert made_current == [0] and len(fake.calls) == 1 and not codes
        codes[:], fake.calls = [400], []
        op(x, w)
        assert fake.calls[0] == ("context", 0) and len(fake.calls) == 2
        codes[:] = [700]
        with pytest.raises(kaio.CudaError, match="ILLEGAL_ADDRESS"):
            op(x, w)


def test_prepare_takes_what_kernel_subscript_gives(fake):
    """``prepare(kernel[config], args)``: the subscript's function (``.launch`` its
    ``Launch``) is prepared like the ``Launch`` itself, and its plan replays the launch."""
    from kaio.runtime.plan import CallPlan, prepare

    @kaio.gpu_kernel(block_size=256)
    def copy(x: f32[:], out: f32[:], n: kaio.u32):
        i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
        if i < n:
            out[i] = x[i]

    launch = copy[2, 256]
    assert launch.launch.config is launch.config and launch.kernel is copy
    x, out = fake.array((512,)), fake.array((512,))
    prepared = prepare(launch, (x, out, 512))
    assert sorted(prepared.arrays) == [0, 1] and tuple(prepared.config.grid) == (2, 1, 1)
    fake.calls = []
    launch(x, out, 512)
    x2, out2 = fake.array((512,)), fake.array((512,))
    CallPlan([(prepared, {0: (0, 0), 1: (1, 0)})]).run((x2.ptr, out2.ptr))
    launch(x2, out2, 512)
    assert fake.calls[1] == fake.calls[2] != fake.calls[0]


def _linear_split(fake, monkeypatch) -> tuple:
    """(x, w, its plan's replay) of linear at decode size with its K split summed by
    gemm_reduce (2 rows over FIXUP_ROWS; the kernel's own sum makes one launch): a plan
    with a workspace."""
    monkeypatch.setattr(importlib.import_module("kaio_ops.linear"), "FIXUP_ROWS", 1)
    x, w = fake.array((2, 4096), f16), fake.array((4096, 4096), f16)
    kaio_ops.linear(x, w)
    (replay,) = _plan.plans_of(kaio_ops.linear).values()
    return x, w, replay


def _torch_allocations(replay) -> list:
    """The allocations of a kaio arrays' ``replay`` as a torch call of its plan makes them
    (for a ``_plan._replay`` twin of it)."""
    made = replay.__globals__
    allocations = []
    while f"A{len(allocations)}" in made:
        _kind, device, _like, shape, dtype = made[f"A{len(allocations)}"].args
        allocations.append((None, "torch", device, None, shape, dtype))
    return allocations


def test_a_torch_workspace_comes_from_the_caching_allocator(fake, monkeypatch):
    """A torch array an op makes for its kernels and does not return (linear's split-K
    workspace at decode size) is taken from torch's caching allocator on the plan's stream
    and given back after the launches, when torch's current device is the plan's; a tensor
    otherwise (here where the capture of the stream cannot be told: a plan on a created
    stream). Outputs are always tensors."""
    torch = pytest.importorskip("torch")
    capture_untold(monkeypatch, torch)
    fake.stream = 0x7F00_0000_6000
    x, w, replay = _linear_split(fake, monkeypatch)
    allocations = _torch_allocations(replay)
    assert len(allocations) == 2, "linear at decode size no longer makes a workspace"
    log, device = [], [0]
    allocator = (
        lambda: device[0],
        lambda size, stream: log.append(("allocate", size, stream)) or 0xABC000,
        lambda address: log.append(("free", address, len(fake.calls))),
    )
    monkeypatch.setattr(_plan, "_raw_allocator", lambda: allocator)
    twin = _plan._replay(replay.plan, 4, allocations, "o0")
    tensors = []
    for j, (*_, shape, dtype) in enumerate(allocations):
        empty = torch.empty(shape, dtype=_arrays.torch_dtype(dtype))  # on the CPU
        twin.__globals__[f"A{j}"] = lambda empty=empty: tensors.append(empty) or empty
    fake.calls = []
    out = twin(x.ptr, w.ptr, 0, 0)
    size = math.prod(allocations[1][4]) * allocations[1][5].itemsize
    assert log == [("allocate", size, fake.stream), ("free", 0xABC000, 2)] and tensors == [out]
    assert all(0xABC000.to_bytes(8, "little") in call[5] for call in fake.calls)
    device[0], log[:], tensors[:], fake.calls = 1, [], [], []  # torch's current device: 1
    assert twin(x.ptr, w.ptr, 0, 0) is out and not log and len(tensors) == 2
    workspace = tensors[1].data_ptr().to_bytes(8, "little")
    assert all(workspace in call[5] for call in fake.calls)


def test_an_owned_workspace_under_a_tensor_map(fake, monkeypatch):
    """matmul_fp8 with a row-major b on sm_90 transposes it into a workspace that its wgmma
    kernel reads through a tensor map: a legacy-stream plan that owns that workspace passes
    its address to the transpose and encodes the map over it."""
    torch = pytest.importorskip("torch")
    from kaio import e4m3

    tensormap = importlib.import_module("kaio.tensormap")

    def encode(tm, address=None):  # a fake cuTensorMapEncodeTiled: the address, the box
        address = tm.array.ptr if address is None else address
        return (address.to_bytes(8, "little") + bytes(tm.box)).ljust(128, b"\0")

    monkeypatch.setattr(tensormap, "_encode", encode)
    gpu = types.SimpleNamespace(compute_capability=(9, 0), multiprocessor_count=132)
    monkeypatch.setattr(_arrays, "gpu", lambda like: gpu)
    a, b = fake.array((16, 64), e4m3), fake.array((64, 32), e4m3)  # b row-major
    scales = fake.array((1,), f32), fake.array((1,), f32)
    kaio_ops.matmul_fp8(a, b, *scales)
    (replay,) = _plan.plans_of(kaio_ops.matmul_fp8).values()
    allocations = _torch_allocations(replay)
    allocator = (lambda: 0, lambda size, stream: 0xA000, lambda address: None)
    monkeypatch.setattr(_plan, "_raw_allocator", lambda: allocator)
    twin = _plan._replay(replay.plan, 5, allocations, "o0")
    assert twin.owned == [0xA000]
    out = torch.empty(16, 32, dtype=torch.bfloat16)  # on the CPU
    twin.__globals__["A0"] = lambda: out
    fake.calls = []
    assert twin(a.ptr, b.ptr, scales[0].ptr, scales[1].ptr, 0) is out
    assert len(fake.calls) == 2  # the transpose, then the product over the map
    assert all(0xA000.to_bytes(8, "little") in call[5] for call in fake.calls)


def _linear_call(fake, monkeypatch) -> tuple:
    """linear's split-K call at decode size: (its parameters' addresses, its replay)."""
    x, w, replay = _linear_split(fake, monkeypatch)
    return (x.ptr, w.ptr, 0, 0), replay


def _decode_call(fake, monkeypatch) -> tuple:
    """flash_attention_decode split over the keys (its logsumexps and the splits' partials
    made for the kernels, not returned): (its parameters' addresses, its replay)."""
    q, k, v, lens, table = _decode_args(fake)
    kaio_ops.flash_attention_decode(q, k, v, lens, table)
    (replay,) = _plan.plans_of(kaio_ops.flash_attention_decode).values()
    assert len(replay.plan.steps) == 2  # split, then merged
    return (q.ptr, k.ptr, v.ptr, lens.ptr, 0), replay


@pytest.mark.parametrize("call", [_linear_call, _decode_call], ids=["linear", "decode"])
def test_a_plan_on_the_legacy_default_stream_owns_its_small_workspace(fake, monkeypatch, call):
    """A plan on the legacy default stream (its calls' kernels run in order from any
    thread, never captured) takes its small workspaces from the allocator once, when it is
    made on its GPU, passes their addresses to every launch, and gives them back when
    dropped; made while another GPU is current, its calls take their own."""
    import gc

    torch = pytest.importorskip("torch")
    pointers, replay = call(fake, monkeypatch)
    allocations = _torch_allocations(replay)
    log, device, addresses = [], [0], itertools.count(0xA000, 0x1000)
    allocator = (
        lambda: device[0],
        lambda size, stream: log.append(("allocate", size, stream)) or next(addresses),
        lambda address: log.append(("free", address)),
    )
    monkeypatch.setattr(_plan, "_raw_allocator", lambda: allocator)
    sizes = [math.prod(shape) * dtype.itemsize for *_, shape, dtype in allocations[1:]]
    twin = _plan._replay(replay.plan, len(pointers), allocations, "o0")
    assert log == [("allocate", size, 0) for size in sizes] and "ALLOCATE" not in twin.source
    owned = [0xA000 + 0x1000 * i for i in range(len(sizes))]
    assert twin.owned == owned
    out = torch.empty(allocations[0][4], dtype=_arrays.torch_dtype(allocations[0][5]))
    twin.__globals__["A0"] = lambda: out  # on the CPU
    fake.calls = []
    for current_device in (0, 1, 0):
        device[0] = current_device
        assert twin(*pointers) is out
    assert len(log) == len(sizes) and fake.calls
    assert all(0xA000.to_bytes(8, "little") in call[5] for call in fake.calls)
    del twin
    gc.collect()
    assert log[len(sizes) :] == [("free", address) for address in owned]
    device[0] = 1  # made while GPU 1 is current: the calls take their own
    twin = _plan._replay(replay.plan, len(pointers), allocations, "o0")
    assert len(log) == 2 * len(sizes) and "ALLOCATE" in twin.source


def _paged_decode_case(torch, randn, lens: list, capacity: int = 8192, page_size: int = 16):
    """A paged decode call whose plan takes workspaces on every GPU: 4 sequences, H 32, Hkv 8,
    D 128, ``capacity`` keys in pages of ``page_size``; at 8192 keys in pages of 16 its keys
    are split 4 ways (one block a multiprocessor) into splits longer than a paged cluster
    merge takes (decode.PAGED_CLUSTER_TILES), so the splits' partial outputs and logsumexps
    are merged through global memory by the last block (FUSED) on sm_90 as elsewhere.
    Returns (q, k_cache, v_cache, seq_lens, table)."""
    batch, heads, kv_heads, d = len(lens), 32, 8, 128
    max_pages = capacity // page_size
    pages = batch * max_pages + 3
    gen = torch.Generator(device="cuda").manual_seed(capacity + sum(lens))
    order = torch.randperm(pages, device="cuda", generator=gen)[: batch * max_pages]
    table = order.reshape(batch, max_pages).to(torch.int32)
    k_cache, v_cache = (randn(pages, page_size, kv_heads, d) for _ in "kv")
    seq_lens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    return randn(batch, heads, 1, d), k_cache, v_cache, seq_lens, table


def _paged_decode_reference(torch, q, k_cache, v_cache, seq_lens, table):
    """Decode attention of one new token a sequence over a paged cache, in float64."""
    heads, d = q.shape[1], q.shape[3]
    page_size = k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for i, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n, device=q.device)
        rows = table[i, pos // page_size].long(), pos % page_size
        keys, values = (
            c[rows].double().transpose(0, 1).repeat_interleave(heads // c.shape[2], 0)
            for c in (k_cache, v_cache)
        )
        scores = q[i].double() @ keys.transpose(1, 2) / d**0.5
        out[i] = torch.softmax(scores, -1) @ values
    return out


@pytest.mark.gpu
def test_workspaces_from_the_allocator_on_streams_and_in_graphs():
    """Ops whose plans take workspaces: owned by the plan on the legacy default stream, from
    torch's caching allocator on others (given back once the launches are queued, or kept
    between calls): back-to-back calls without synchronizing (the next call may get the same
    memory), another stream, and a CUDA graph captured from replays, each against a float64
    reference. A paged decode call split over its keys takes three on every GPU (its
    logsumexps and the splits' partial outputs and logsumexps); decode-size GEMMs take a
    split-K workspace off sm_90 (on sm_90 they run the GEMM planner, whose decode-size plans
    take none: there they are checked without one)."""
    torch = _torch_cuda()
    _plan.clear()
    gen = torch.Generator(device="cuda").manual_seed(11)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen)

    w = randn(4096, 4096) / 64
    _, *cache = _paged_decode_case(torch, randn, [8192, 1, 5000, 4097])
    cases = [  # (op, its inputs after x, a new x, the float64 reference of x)
        (kaio_ops.linear, (w,), lambda: randn(1, 4096), lambda x: x.double() @ w.double().T),
        (kaio_ops.matmul_tc, (w,), lambda: randn(1, 4096), lambda x: x.double() @ w.double()),
        (kaio_ops.matmul, (w,), lambda: randn(1, 4096), lambda x: x.double() @ w.double()),
        (
            kaio_ops.flash_attention_decode,
            cache,
            lambda: randn(4, 32, 1, 128),
            lambda q: _paged_decode_reference(torch, q, *cache),
        ),
    ]
    owned = {}
    for op, rest, draw, reference in cases:
        for _ in range(2):  # (in a new process the first torch call binds torch, unplanned)
            op(draw(), *rest)
        (replay,) = _plan.plans_of(op).values()
        owned[op.__name__] = len(replay.owned)  # on the legacy default stream: owned
        xs = [draw() for _ in range(4)]
        outs = [op(x, *rest) for x in xs]  # queued back to back
        for x, out in zip(xs, outs, strict=True):
            assert _error(torch, out, reference(x)) < 2e-3, op.__name__
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            outs = [op(x, *rest) for x in xs]
        side.synchronize()
        for x, out in zip(xs, outs, strict=True):
            assert _error(torch, out, reference(x)) < 2e-3, op.__name__
        static = draw()
        capture = torch.cuda.Stream()
        capture.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(capture):
            op(static, *rest)  # the capture stream's plan, built outside the capture
        capture.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            captured = op(static, *rest)
        for _ in range(2):
            static.copy_(draw())
            captured.fill_(float("nan"))
            eager = op(draw(), *rest)  # eager calls between the graph's replays
            graph.replay()
            torch.cuda.synchronize()
            assert _error(torch, captured, reference(static)) < 2e-3, op.__name__
            assert torch.isfinite(eager).all()
    assert owned["flash_attention_decode"] == 3, owned  # lse, the partials and their lse
    if torch.cuda.get_device_capability()[0] < 9:  # the mma.sync path's split-K
        gemms = [owned[op] for op in ("linear", "matmul_tc", "matmul")]
        assert any(gemms), "no decode-size GEMM plan takes a workspace: test another shape"


def test_import_kaio_ops_does_not_import_torch_and_binds_it_when_a_tensor_comes():
    """``import kaio_ops`` leaves torch alone (it took 3 s); the ops' wrappers take torch's
    tensor types and stream accessor from the first torch tensor they describe, so later
    calls key torch tensors by their flat key and their stream."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    code = (
        "import sys, kaio_ops\n"
        "from kaio_ops import _plan\n"
        "assert 'torch' not in sys.modules, 'import kaio_ops imported torch'\n"
        "env = kaio_ops.rms_norm.__globals__\n"
        "assert env['T'] is _plan._NoTorch and env['RAW'] is None and _plan._UNBOUND\n"
        "import torch\n"
        "try:\n"
        "    _plan.describe(torch.zeros(2))\n"
        "except _plan._Rebound:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('the binding call must run unplanned')\n"
        "assert env['T'] is torch.Tensor and env['P'] is torch.nn.Parameter\n"
        "assert env['RAW'] is not None and not _plan._UNBOUND\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_torch_ops_composites_replay_their_own_plan(monkeypatch):
    """torch.ops.kaio.flash_attention_decode (written with ..._with_stats for its fake and
    gradient) replays the plan of kaio_ops.flash_attention_decode when no input needs a
    gradient: one dispatch. A call without a plan, or one that needs gradients, goes
    through the op it is written with (here it refuses the CPU tensors)."""
    pytest.importorskip("torch")
    import kaio_ops.torch  # noqa: F401 (registers torch.ops.kaio)

    keys = _TorchKeys(monkeypatch, kaio_ops.flash_attention_decode)
    torch, t = keys.torch, keys.tensor
    q, k, v = t(1, 4, 1, 64, dtype=torch.float16), *(t(1, 2, 32, 64, dtype=torch.float16)
                                                     for _ in range(2))  # fmt: skip
    lens = torch.full((1,), 32, dtype=torch.int32).as_subclass(keys.OnGPU)
    keys.key(q, k, v, lens)
    made = torch.zeros(1, 4, 1, 64, dtype=torch.float16)
    keys.plans[keys.misses[-1]] = lambda *pointers: made
    out = torch.ops.kaio.flash_attention_decode(q, k, v, lens)
    assert out.data_ptr() == made.data_ptr()
    with pytest.raises(ValueError, match="CPU tensor"):  # another signature: the composite
        torch.ops.kaio.flash_attention_decode(q, k, v, lens, None, 0.5)
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="CPU tensor"):
        torch.ops.kaio.flash_attention_decode(q, k, v, lens)


def test_torch_ops_replay_their_plan_at_the_autograd_key(monkeypatch):
    """torch.ops.kaio.add (an op with register_autograd's formula) replays its plan in its
    Autograd kernel (through ``replay_only``) when no input needs a gradient, grad mode on
    or off; a call needing a gradient goes through register_autograd's kernel to the
    implementation (``dispatch_entry``), which replays the same plan under autograd; a
    call without a plan runs the implementation (which refuses the CPU tensors standing in
    for CUDA ones here)."""
    torch = pytest.importorskip("torch")
    import kaio_ops.torch  # noqa: F401 (registers torch.ops.kaio)

    keys = _TorchKeys(monkeypatch, kaio_ops.add)
    t = keys.tensor
    x, y = t(2, 64, dtype=torch.float16), t(2, 64, dtype=torch.float16)
    keys.key(x, y)
    callers = []

    def replay(*pointers_and_arrays):
        callers.append(sys._getframe(1).f_code.co_name)  # replay_only, or the entry ("add")
        return torch.zeros(2, 64, dtype=torch.float16)

    keys.plans[keys.misses[-1]] = replay
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            assert not torch.ops.kaio.add(x, y).requires_grad
    assert callers == ["replay_only", "replay_only"]
    x.requires_grad_(True)
    out = torch.ops.kaio.add(x, y)
    assert callers[2:] == ["add"] and out.grad_fn is not None
    with pytest.raises(ValueError, match="CPU tensor"):  # no plan for this signature
        torch.ops.kaio.add(t(4, 64, dtype=torch.float16), t(4, 64, dtype=torch.float16))


def test_outputs_like_a_contiguous_input_are_made_with_empty_like():
    """An output with a contiguous input's shape, dtype and device is made by
    ``torch.empty_like(input)`` in the replay (cheaper than ``torch.empty`` with keywords);
    one of another shape or dtype, or like a strided input, is not."""
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 64, dtype=torch.float16)
    arrays = [x, torch.randn(64)]
    assert _plan._input_like(arrays, x, (2, 64), f16) == 0
    assert _plan._input_like(arrays, x, (2, 32), f16) is None
    assert _plan._input_like(arrays, x, (2, 64), f32) is None
    assert _plan._input_like(arrays, arrays[1], (64,), f32) == 1
    strided = torch.randn(64, 2, dtype=torch.float16).t()
    assert _plan._input_like([strided], strided, (2, 64), f16) is None
    replay = _plan._replay(None, 1, [(None, "torch", 0, None, (2, 64), f16, 0)], "o0")
    assert "EMPTY_LIKE(a0)" in replay.source
    out = replay(x.data_ptr(), x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.data_ptr() != x.data_ptr()


def test_a_plan_on_gpu_0_knows_it_is_home_until_a_thread_moves(fake):
    """A replay on GPU 0 reads the thread-local current device only once some thread has
    made another device current (``device.moved``)."""
    from kaio.runtime import device as device_mod

    saved, device_mod.moved[0] = device_mod.moved[0], False
    saved_ordinal = current._ordinal
    try:
        x, w = fake.array((2, 64)), fake.array((64,))
        kaio_ops.rms_norm(x, w)
        current._ordinal = 1  # not through the setter: not read
        fake.calls = []
        kaio_ops.rms_norm(x, w)
        assert len(fake.calls) == 1 and fake.calls[0][0] != "context"
        current.ordinal = 1
        fake.calls = []
        kaio_ops.rms_norm(x, w)
        assert fake.calls[0] == ("context", 0)
    finally:
        # both as they were: a ``moved`` left set would send later tests' launches
        # on a real GPU 0 down the other-device path
        current._ordinal, device_mod.moved[0] = saved_ordinal, saved


def test_a_subscript_hands_out_the_direct_launch_once_a_launcher_is_bound(fake):
    """After its first launch, ``kernel[config]`` gives the first launcher's ``direct``
    function (the launch without the ``Launch`` in between), which a ``kernel[config]``
    kept from before calls too: it launches what the ``Launch`` launches, and hands
    keywords, other signatures (their checks), the simulator and recordings to the
    ``Launch``."""

    @kaio.gpu_kernel(block_size=256)
    def copy(x: f32[:], out: f32[:], n: kaio.u32):
        i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
        if i < n:
            out[i] = x[i]

    first = copy[2, 256]
    x, out = fake.array((512,)), fake.array((512,))
    first(x, out, 512)
    direct = copy[2, 256]
    assert direct is not first and direct.launch is first.launch and direct.config is first.config
    assert first.launch._entry is direct  # what the kept function calls
    fake.calls = []
    direct(x, out, 512)
    first(x, out, 512)
    direct(x, out=out, n=512)  # keywords: through the Launch
    first(x, out=out, n=512)
    assert len(fake.calls) == 4 and all(call == fake.calls[0] for call in fake.calls)
    fake.calls = fake.calls[:3]
    with pytest.raises(kaio.LaunchError, match="'out'"):
        direct(x, fake.array((512,), f16), 512)
    x2 = np.arange(512, dtype=np.float32)
    out2 = np.zeros(512, np.float32)
    with kaio.simulate():
        direct(x2, out2, 512)
    assert np.array_equal(out2, x2) and len(fake.calls) == 3
    with _plan.recording() as recorder:
        direct(x, out, 512)
    assert len(recorder.launches) == 1 and len(fake.calls) == 4


@pytest.mark.parametrize("told", [False, True], ids=["accessors", "tensor_check"])
def test_an_output_the_caller_dropped_is_handed_out_again(monkeypatch, told):
    """A small output made like an input comes back from the next call of its plan when
    the caller has dropped it, and never while anything still refers to it (the caller, a
    view, in inference mode too, a detached tensor, its storage, a DLPack capsule, a weak
    reference),
    after it was changed (resized, made to need a gradient, viewed as another dtype or
    shape through ``.data``), in the other inference mode, or while the stream is being
    captured (nor one made during a capture); in a chain (each output passed to the next
    call), the one before the last comes back. The same whether "unchanged" is told by its
    accessors or, from the recorded call's output
    (``told``), by one ``tensor_check``."""
    import weakref

    torch = pytest.importorskip("torch")
    to_dlpack = pytest.importorskip("torch.utils.dlpack").to_dlpack
    capturing = [False]
    monkeypatch.setattr(
        torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing[0], raising=False
    )
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    assert _plan.RECYCLE_BYTES == 1 << 20  # on by default
    x = torch.randn(2, 64, dtype=torch.float16)
    made = torch.empty(2, 64, dtype=torch.float16) if told else None
    replay = _plan._replay(None, 1, [(made, "torch", 0, None, (2, 64), f16, 0)], "o0")
    assert "KEPT0.pop()" in replay.source and ("OUT0(o0)" in replay.source) == told

    def call():
        return replay(x.data_ptr(), x)

    marks = itertools.count()

    def dropped(keep=lambda out: None) -> tuple:
        """A call's output, marked and dropped (``keep`` may hold on to something of it):
        (its mark, what ``keep`` returned)."""
        out = call()
        out.kaio_test_mark = mark = next(marks)  # tells the object again, holding nothing
        return mark, keep(out)

    def again(out, mark) -> bool:
        return getattr(out, "kaio_test_mark", None) == mark

    last, _ = dropped()
    assert again(call(), last)  # dropped: handed out again
    held = call()
    assert call() is not held
    both = call(), call()  # the caller keeps every output: none handed out again
    assert len({id(held), *(id(o) for o in both)}) == 3
    assert all(call() is not o for o in (held, *both))
    del held, both
    # a view, a detached tensor, its storage (its memory, not its TensorImpl), a capsule,
    # a weakref
    keeps = (lambda out: out[0], lambda out: out.detach(), lambda out: out.untyped_storage())
    for keep in (*keeps, to_dlpack, weakref.ref):
        last, kept = dropped(keep)
        assert not again(call(), last)
        del kept
    changes = (
        lambda t: t.resize_(4, 64),
        lambda t: t.requires_grad_(True),
        lambda t: setattr(t, "data", t.view(torch.int16)),  # same address, another dtype
        lambda t: setattr(t, "data", t.view(1, 128)),  # same address, another shape
        lambda t: setattr(t, "data", t.as_strided((2, 64), (1, 2))),  # another strides
    )
    for change in changes:
        last, _ = dropped(change)
        fresh = call()
        assert not again(fresh, last) and fresh.shape == (2, 64) and not fresh.requires_grad
        assert fresh.dtype == torch.float16 and fresh.is_contiguous()
        del fresh
    for _ in range(2):  # the other inference mode: a new output, of that mode
        last, _ = dropped()
        with torch.inference_mode():
            fresh = call()
            assert not again(fresh, last) and fresh.is_inference()
            del fresh
            last, _ = dropped()
            assert again(call(), last)  # handed out again in that mode too
            last, kept = dropped(lambda out: out.view(128))  # a view untracked in this mode
            assert not again(call(), last)
            del kept
        assert not call().is_inference()
    # a chain (h = op(h)) passes the last output back in, still referenced then: the one
    # before it, dropped by then, comes back
    chain = _plan._replay(None, 1, [(made, "torch", 0, None, (2, 64), f16, 0)], "o0")
    h, seen = chain(x.data_ptr(), x), []
    h.kaio_test_mark = "c0"
    for i in range(1, 6):
        out = chain(h.data_ptr(), h)
        assert out is not h
        seen.append(getattr(out, "kaio_test_mark", None))
        out.kaio_test_mark = f"c{i}"
        h = out
        del out
    assert seen == [None, "c0", "c1", "c2", "c3"]
    capturing[0] = True
    last, _ = dropped()
    made = [weakref.ref(call()) for _ in range(2)]  # none kept
    assert all(r() is None for r in made)
    capturing[0] = False
    last, _ = dropped()
    assert again(call(), last)


def test_an_output_unlike_every_input_is_handed_out_again(monkeypatch):
    """An output with no input of its shape and dtype (``matmul_tc``'s f32 of f16 inputs,
    ``matmul_fp8``'s bf16 of fp8 ones) is made by the plan's ``torch.empty`` and, dropped by
    the caller, handed out again like one made like an input; not once changed."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False, raising=False)
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    x = torch.randn(1, 64, dtype=torch.float16)
    replay = _plan._replay(None, 1, [(None, "torch", 0, None, (1, 32), f32, None)], "o0")
    assert "KEPT0.pop()" in replay.source and "EMPTY_LIKE" not in replay.source
    made = []
    replay.__globals__["A0"] = lambda: made.append(1) or torch.empty(1, 32)  # on the CPU
    out = replay(x.data_ptr(), x)
    out.kaio_test_mark = "first"
    del out
    out = replay(x.data_ptr(), x)
    assert getattr(out, "kaio_test_mark", None) == "first" and len(made) == 1
    out.resize_(2, 32)
    del out
    assert replay(x.data_ptr(), x).shape == (1, 32) and len(made) == 2


def test_the_fast_path_tells_kept_outputs_with_its_inputs(monkeypatch):
    """A fast path of a plan that hands its outputs out again (two, as rms_norm_residual)
    tells the outputs kept for a call in the same ``tensor_check`` as its inputs; an output
    still held, changed or sharing its memory is not handed out again (each output on its
    own); inputs of another signature or inference mode miss. In the other mode, a fast
    path tells the outputs on their own and makes new ones."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False, raising=False)
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    x = torch.randn(2, 64, dtype=torch.float16)
    made = [torch.empty(2, 64, dtype=torch.float16) for _ in range(2)]
    allocations = [(m, "torch", 0, None, (2, 64), f16, 0) for m in made]
    replay = _plan._replay(None, 1, allocations, "(o0, o1)")
    env = {"RAW": None, "recordings": [0], "SIMULATING": [0]}
    fast = _plan._fast(replay, ["x"], [0], (x,), env)
    assert "CHECKS(x, o0, o1)" in fast.source and "CHECK(x)" in fast.source
    marks = itertools.count()

    def call(keep=lambda o0, o1: None):
        """The marks of a call's outputs (marked, then dropped but for what ``keep`` keeps),
        what ``keep`` returned."""
        outputs = fast(x)
        for out in outputs:
            out.kaio_test_mark = next(marks)
        return [o.kaio_test_mark for o in outputs], keep(*outputs)

    def again(last: list) -> list:
        """Which outputs of the next call are the last call's, handed out again."""
        outputs = fast(x)
        return [getattr(o, "kaio_test_mark", None) == m for o, m in zip(outputs, last, strict=True)]

    def grad(o0, o1):  # changed, then dropped
        o0.requires_grad_()

    def resize(o0, o1):
        o1.resize_(4, 64)

    told_alone = []  # the calls of each output's own check
    for j in range(2):
        check = fast.__globals__[f"OUT{j}"]
        fast.__globals__[f"OUT{j}"] = lambda o, check=check: told_alone.append(1) or check(o)
    call()
    last, _ = call()
    assert again(last) == [True, True] and not told_alone  # told with the input
    for keep, want in (
        (lambda o0, o1: o1, [True, False]),  # held by the caller
        (grad, [False, True]),
        (resize, [True, False]),
        (lambda o0, o1: o0.detach(), [False, True]),  # its memory shared
    ):
        last, kept = call(keep)
        assert again(last) == want
        del kept
    assert fast(torch.randn(4, 64, dtype=torch.float16)) is _plan.MISS
    last, _ = call()
    with torch.inference_mode():  # the other mode: the outputs told on their own, made anew
        xi = torch.randn(2, 64, dtype=torch.float16)
        inference = _plan._fast(replay, ["x"], [0], (xi,), env)
        assert "CHECKS" not in inference.source and fast(xi) is _plan.MISS
        assert all(not hasattr(o, "kaio_test_mark") and o.is_inference() for o in inference(xi))


def test_a_plan_on_the_default_stream_does_not_ask_about_captures(monkeypatch):
    """A replay asks torch whether its stream is being captured (0.5 µs) only when its plan
    launches on another stream than the legacy default one, which CUDA never captures; on
    either, a dropped output is handed out again."""
    torch = pytest.importorskip("torch")
    asked = []

    def capturing():
        asked.append(1)
        return False

    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", capturing, raising=False)
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    x = torch.randn(2, 64, dtype=torch.float16)
    for stream, asks in ((0, False), (None, False), (0x7F00_0000_1000, True)):

        class Plan:  # one launch on ``stream`` that the replay does not need to run here
            steps = [(types.SimpleNamespace(stream=stream), {})]

            def code(self, env, address, constants=None):
                return []

        replay = _plan._replay(Plan(), 1, [(None, "torch", 0, None, (2, 64), f16, 0)], "o0")
        asked.clear()
        out = replay(x.data_ptr(), x)
        out.kaio_test_mark = stream
        del out
        assert getattr(replay(x.data_ptr(), x), "kaio_test_mark", "new") == stream
        assert bool(asked) == asks and ("CAPTURING()" in replay.source) == asks


def test_a_record_stream_anywhere_stops_handing_outputs_out_again(monkeypatch):
    """``Tensor.record_stream`` (which the references cannot show: torch's allocator then
    keeps a dropped tensor's memory for the other stream's work) on any tensor turns the
    handing out again off for every plan; a plan built while torch.distributed is
    initialized never hands out again; ``KAIO_RECYCLE_OUTPUTS=0`` turns it off."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False, raising=False)
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    x = torch.randn(2, 64, dtype=torch.float16)
    allocations = [(None, "torch", 0, None, (2, 64), f16, 0)]
    replay = _plan._replay(None, 1, allocations, "o0")

    def call():
        return replay(x.data_ptr(), x)

    out = call()
    ptr = out.data_ptr()
    del out
    assert call().data_ptr() == ptr  # handed out again (the first output, dropped)
    other = torch.randn(3)
    try:  # a CPU tensor: torch refuses it after the watch has seen the call
        other.record_stream(torch.Stream())
    except Exception:  # noqa: BLE001
        pass
    assert _plan.RECYCLING == [False]
    out = call()
    out.kaio_test_mark = 1
    del out
    assert getattr(call(), "kaio_test_mark", None) is None  # a new output
    monkeypatch.setattr(_plan, "RECYCLING", [True])
    monkeypatch.setattr(_plan, "_distributed", lambda torch: True)
    assert "KEPT0.pop()" not in _plan._replay(None, 1, allocations, "o0").source
    monkeypatch.undo()
    code = "from kaio_ops import _plan; assert _plan.RECYCLE_BYTES == 0"
    env = {**os.environ, "KAIO_RECYCLE_OUTPUTS": "0", "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_a_plan_keeps_its_small_workspace_between_calls(fake, monkeypatch):
    """Where a capture can be told, a plan keeps its split-K workspace between calls (one
    allocation, no free per call), takes new ones while the stream is being captured (given
    back after), and gives the kept one back to the allocator when the plan is dropped."""
    import gc

    torch = pytest.importorskip("torch")
    capturing = [False]
    monkeypatch.setattr(
        torch._C, "_cuda_isCurrentStreamCapturing", lambda: capturing[0], raising=False
    )
    fake.stream = 0x7F00_0000_5000  # a stream that can be captured (not the legacy default)
    x, w, replay = _linear_split(fake, monkeypatch)
    allocations = _torch_allocations(replay)
    log, addresses = [], itertools.count(0xA000, 0x1000)
    allocator = (
        lambda: 0,
        lambda size, stream: log.append(("allocate", size)) or next(addresses),
        lambda address: log.append(("free", address)),
    )
    monkeypatch.setattr(_plan, "_raw_allocator", lambda: allocator)
    twin = _plan._replay(replay.plan, 4, allocations, "o0")
    assert "HELD.pop()" in twin.source
    empty = torch.empty(allocations[0][4], dtype=_arrays.torch_dtype(allocations[0][5]))
    twin.__globals__["A0"] = lambda: empty
    size = math.prod(allocations[1][4]) * allocations[1][5].itemsize
    fake.calls = []
    for _ in range(3):
        twin(x.ptr, w.ptr, 0, 0)
    assert log == [("allocate", size)]  # once, then kept
    assert all(0xA000.to_bytes(8, "little") in call[5] for call in fake.calls)
    capturing[0] = True
    twin(x.ptr, w.ptr, 0, 0)
    assert log[1:] == [("allocate", size), ("free", 0xB000)]
    capturing[0] = False
    twin(x.ptr, w.ptr, 0, 0)
    assert len(log) == 3
    del twin
    gc.collect()
    assert log[3:] == [("free", 0xA000)]


def test_a_plan_writes_each_address_once(fake):
    """rms_norm's kernel takes x in three parameters and its output in two: a call of its
    plan writes each of the three addresses once, into a word the parameters holding it
    point to, and the driver reads what the unplanned launch passes."""
    x, w = fake.array((2, 64)), fake.array((64,))
    planned, unplanned, _ = fake.run(kaio_ops.rms_norm, x, w)
    assert planned == unplanned
    x2 = fake.array((2, 64))
    planned, unplanned, _ = fake.run(kaio_ops.rms_norm, x2, w)
    assert planned == unplanned and x2.ptr.to_bytes(8, "little") in planned[0][5]
    (replay,) = _plan.plans_of(kaio_ops.rms_norm).values()
    assert len(re.findall(r"words\[\d+\] = ", replay.source)) == 3
