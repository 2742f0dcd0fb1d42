"""Host time per launch of a 4-argument kernel (x, y, out, n: out = x + y), side by side in one
process:

- raw ctypes ``cuLaunchKernelEx`` / ``cuLaunchKernel`` on kaio's CUfunction with everything
  prepared (parameters packed once, configuration built once): the floor for a Python launcher,
  with ctypes releasing the GIL around the call (``CFUNCTYPE``) and keeping it (``PYFUNCTYPE``,
  as kaio's launcher does); the same on other streams than the legacy default one (a
  created stream, a non-blocking one, the per-thread default stream); and the ctypes call
  alone, made the same way to a C function that does nothing (the Python side of the floor);
- raw cuda.bindings ``cuLaunchKernel``, kernelParams as (values, types), the bindings' own
  way of passing arguments;
- kaio ``add[grid, 256](x, y, out, n)`` and pre-bound ``launch = add[grid, 256]``, with
  DeviceArray, torch tensor and CuPy arguments;
- raw cuda.bindings ``cuLaunchKernel`` with a prebuilt ``kernelParams`` array (its address
  as an int: nothing converted per call), the cheapest way through the bindings;
- kaio's call-plan replay of the same launch (``kaio.runtime.plan.CallPlan.run``: the three
  addresses written into a buffer that holds the other parameters, and ``cuLaunchKernelEx``
  through ctypes), what every planned ``kaio_ops`` call ends in;
- Triton's launcher on an equivalent kernel, torch tensors;
- the first launch in a new process, with an empty and with a warm disk cache;
- ``kaio_ops`` calls at decode sizes (argument checks, output allocation and launch) beside
  torch eager doing the same work: what a decode step pays per op when it is not captured in
  a CUDA graph; each op also as ``torch.ops.kaio.<op>`` beside its floor: the ``kaio_ops``
  call plus the dispatcher's cost of an empty custom op registered the way kaio_ops.torch
  registers its ops (``torch.ops.kaio_bench.empty_kaio``, and one of the op's own schema;
  ``f.torch``: with torch.library.register_autograd's kernel, ``...empty``; measured in
  the same rounds).

Method. Each figure is the median, over BATCHES batches of BATCH launches, of the host time of
one batch divided by BATCH, with no synchronization inside a batch (the GPU is drained between
batches, untimed). The rows are measured in interleaved rounds (one batch of each row per
round, every other round in the reverse order), so that a slow spell of the shared host falls
on every row alike. Each kaio row has its
own kernel object, so it measures one argument signature, as a kernel launched with one kind of
argument sees it. Two columns:

- ``host``: each batch is enqueued behind a kernel that spins on the GPU for SPIN_MS, so no
  launch runs during the batch and the queue never fills: pure host-side cost. A batch after
  which the spinner had already finished is counted and reported (it would mean the GPU could
  have throttled the host);
- ``free``: no spinner; the GPU runs the kernels while the host launches them. When the host
  launches faster than the GPU runs them (``GPU us/kernel``, measured with events over a queued
  batch), this column measures the GPU instead.

Usage: ``python bench/launch_overhead.py --out results.json`` (``--skip-cold``: no first-launch
rows).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

import kaio
from kaio import f32, u32

ADD_PTX = """.version 8.0
.target sm_80
.address_size 64
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

# One thread that spins until %globaltimer has advanced by `ns` nanoseconds.
SPIN_PTX = """.version 7.8
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 ns)
{
    .reg .pred %p; .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}
"""

N = 4096
GRID = N // 256
BATCH = 200
BATCHES = 40
OP_BATCH = 200  # kaio_ops calls a batch
OP_SPIN_MS = 2.0  # GPU spin a batch of op calls, times SPIN_MS: 200 calls take longer
SPIN_MS = 8.0
OPS: list = []  # the kaio_ops measured (--ops; empty: all)
# the clock of a batch: wall time; bench/host_ab.py --cpu-time: the thread's CPU time, which
# leaves out the time the thread waits for a core on a busy host
CLOCK = time.perf_counter


@kaio.gpu_kernel(block_size=256)
def add(x: f32[:], y: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[i] + y[i]


def use_hand_ptx(kernel=add) -> str:
    """Run the hand-written PTX unless the PTX emitter is available; returns which."""
    try:
        from kaio.ptx import emit  # noqa: F401

        return "emitted"
    except ImportError:
        kernel.specialize({}, ("C", "C", "C")).ptx_by_arch[kaio.device().arch] = ADD_PTX
        return "hand-written"


def new_add():
    """Another kernel object for ``add``: its own launchers, so one argument signature."""
    kernel = kaio.gpu_kernel(block_size=256)(add.pyfunc)
    use_hand_ptx(kernel)
    return kernel


class Spinner:
    """Enqueues SPIN_MS of GPU spinning on the default stream; says whether it still runs."""

    def __init__(self, spin_ms: float | None = None):
        from cuda.bindings import driver as cu

        from kaio.runtime.driver import check

        kaio.device()  # the primary context, current
        self.cu, self.check = cu, check
        module = check(cu.cuModuleLoadData(SPIN_PTX.encode() + b"\0"), "load spin")
        self.func = check(cu.cuModuleGetFunction(module, b"spin"), "spin")
        self.params = ((int((spin_ms or SPIN_MS) * 1e6),), (ctypes.c_uint64,))
        self.module = module

    def start(self) -> None:
        self.check(self.cu.cuLaunchKernel(self.func, 1, 1, 1, 1, 1, 1, 0, 0, self.params, 0))

    def running(self) -> bool:
        return self.cu.cuStreamQuery(0)[0] == self.cu.CUresult.CUDA_ERROR_NOT_READY


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


class Bench:
    """Launch loops, measured in interleaved rounds."""

    def __init__(self, batch: int = BATCH, spin_ms: float | None = None):
        self.spinner = Spinner(spin_ms)
        self.batch_size = batch
        self.rows: dict = {}  # name -> launch_one
        self.around: dict = {}  # name -> a context entered around each of its batches
        self.keep: list = []  # ctypes buffers that raw rows' launches point into
        self.late = 0  # batches that outlasted the spinner

    def row(self, name: str, launch_one, around=None) -> None:
        """A row timing ``launch_one``; ``around``: a context manager entered around each
        of its batches (a stand-in swapped in while they run)."""
        launch_one()  # warm up (and build any launcher)
        kaio.synchronize()
        self.rows[name] = launch_one
        if around is not None:
            self.around[name] = around

    def batch(self, launch_one, behind_spinner: bool) -> float:
        """Host microseconds per launch over one batch."""
        if behind_spinner:
            self.spinner.start()
        t0 = CLOCK()
        for _ in range(self.batch_size):
            launch_one()
        elapsed = CLOCK() - t0
        if behind_spinner and not self.spinner.running():
            self.late += 1
        kaio.synchronize()
        return elapsed / self.batch_size * 1e6

    def run(self) -> dict:
        samples = {name: ([], []) for name in self.rows}
        for i in range(BATCHES):  # every other round in the reverse order: no row always first
            for name, launch_one in list(self.rows.items())[:: 1 - 2 * (i % 2)]:
                with self.around.get(name, contextlib.nullcontext()):
                    samples[name][0].append(self.batch(launch_one, True))
                    samples[name][1].append(self.batch(launch_one, False))
        results = {}
        for name, (host, free) in samples.items():
            results[name] = {"host_us": statistics.median(host), "free_us": statistics.median(free)}
            print(f"  {name:<52} {results[name]['host_us']:8.2f} {results[name]['free_us']:8.2f}")
        return results

    def gpu_us_per_kernel(self, launch_one) -> float:
        """GPU time per kernel when the kernels run back to back (queued behind the spinner)."""
        start, end = kaio.Event(), kaio.Event()
        self.spinner.start()
        start.record()
        for _ in range(BATCH):
            launch_one()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / BATCH


def prepared_add(x, y, out) -> tuple:
    """``add(x, y, out, N)`` ready for a raw driver call: (the loaded kernel, its parameter
    buffer, the ``kernelParams`` array pointing into it, the ``CUlaunchConfig``)."""
    from kaio.runtime.launcher import param_format
    from kaio.runtime.module import load

    dev = kaio.device()
    spec = add.specialize({}, ("C", "C", "C"))
    loaded = load(spec, dev, dev.arch)
    fmt, size = param_format(spec.function.params)
    buf = ctypes.create_string_buffer(size)
    struct.pack_into(fmt, buf, 0, x.ptr, N, y.ptr, N, out.ptr, N, N)
    offsets = [0, 8, 16, 24, 32, 40, 48]  # x, xn, y, yn, out, outn, n: fmt "=QqQqQqI"
    params = (ctypes.c_void_p * 7)(*[ctypes.addressof(buf) + o for o in offsets])
    config = CUlaunchConfig((GRID, 1, 1), (256, 1, 1), 0, None, None, 0)
    return loaded, buf, params, config


def floor_rows(bench: Bench, x, y, out, prepared: tuple | None = None) -> tuple:
    """The floor of a launch from Python: kaio's own CUfunction (``prepared_add``) launched
    with kaio's four arguments made once, through ctypes and through
    ``kaio.runtime.native``'s builtin, and each call alone to a C function that does nothing;
    returns (the ctypes call, the ``byref`` config, function and params)."""
    from kaio.runtime.driver import libcuda
    from kaio.runtime.launcher import pointer_argument

    loaded, buf, params, config = prepared or prepared_add(x, y, out)
    launch_ex_gil = ctypes.PYFUNCTYPE(ctypes.c_int)(("cuLaunchKernelEx", libcuda()))
    cfg, par = ctypes.byref(config), ctypes.byref(params)
    # every argument a ctypes object made once that ctypes passes as it is (kaio's launches)
    func_ref = pointer_argument(loaded.handle)
    bench.keep += [buf, params, config]
    bench.row(
        "raw ctypes cuLaunchKernelEx, GIL kept, byref function (kaio's arguments)",
        lambda: launch_ex_gil(cfg, func_ref, par, None),
    )
    # the foreign-function call alone, as kaio's launches make it (GIL kept, four byref
    # arguments) to a C function that does nothing (memcmp of 0 bytes; the fourth argument
    # ignored): the Python side of the floor, the rest of a raw launch being the driver's
    nothing = ctypes.PYFUNCTYPE(ctypes.c_int)(("memcmp", ctypes.CDLL(None)))
    bench.row(
        "ctypes call of a C no-op (memcmp of 0 bytes), 4 arguments",
        lambda: nothing(cfg, func_ref, None, par),
    )
    native_rows(bench, (launch_ex_gil, nothing), (cfg, func_ref, par), x, y, out)
    return launch_ex_gil, cfg, func_ref, par


def raw_rows(bench: Bench, x, y, out) -> None:
    """Launches of kaio's own CUfunction with no launcher at all."""
    from cuda.bindings import driver as cu

    from kaio.runtime.driver import libcuda

    prepared = prepared_add(x, y, out)
    loaded, buf, params, config = prepared
    launch_ex_gil, cfg, func_ref, par = floor_rows(bench, x, y, out, prepared)
    lib = libcuda()
    buf_size = ctypes.c_size_t(len(buf))
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(buf_size), 0)
    func = ctypes.c_void_p(loaded.handle)
    launch_ex = ctypes.CFUNCTYPE(ctypes.c_int)(("cuLaunchKernelEx", lib))
    launch = ctypes.CFUNCTYPE(ctypes.c_int)(("cuLaunchKernel", lib))
    ext = ctypes.byref(extra)
    bench.keep += [buf_size, extra]
    bench.row("raw ctypes cuLaunchKernelEx, extra buffer", lambda: launch_ex(cfg, func, None, ext))
    bench.row("raw ctypes cuLaunchKernelEx, kernelParams", lambda: launch_ex(cfg, func, par, None))
    bench.row(
        "raw ctypes cuLaunchKernelEx, kernelParams, GIL kept",
        lambda: launch_ex_gil(cfg, func, par, None),
    )
    bench.row(
        "raw ctypes cuLaunchKernel, extra buffer",
        lambda: launch(func, GRID, 1, 1, 256, 1, 1, 0, None, None, ext),
    )
    # the same launch on other streams than the legacy default one (which the driver
    # synchronizes with every blocking stream): a created stream, a non-blocking one, and the
    # per-thread default stream (CU_STREAM_PER_THREAD)
    from kaio.runtime.stream import Stream

    for label, stream in (
        ("a created stream", Stream()),
        ("a non-blocking stream", Stream(non_blocking=True)),
        ("the per-thread default stream", 2),
    ):
        handle = stream if isinstance(stream, int) else stream.handle
        other = CUlaunchConfig((GRID, 1, 1), (256, 1, 1), 0, handle, None, 0)
        config_ref = ctypes.byref(other)
        bench.keep += [other, stream]
        bench.row(
            f"raw ctypes cuLaunchKernelEx, GIL kept, byref function, {label}",
            lambda c=config_ref: launch_ex_gil(c, func_ref, par, None),
        )
    launch_gil = ctypes.PYFUNCTYPE(ctypes.c_int)(("cuLaunchKernel", lib))
    bench.row(
        "raw ctypes cuLaunchKernel, kernelParams, GIL kept, byref function",
        lambda: launch_gil(func_ref, GRID, 1, 1, 256, 1, 1, 0, None, par, None),
    )
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    types = (ptr, i64, ptr, i64, ptr, i64, ctypes.c_uint32)
    function = loaded.function

    def bindings():
        params = ((x.ptr, N, y.ptr, N, out.ptr, N, N), types)
        cu.cuLaunchKernel(function, GRID, 1, 1, 256, 1, 1, 0, 0, params, 0)

    bench.row("raw cuda.bindings cuLaunchKernel, (values, types)", bindings)
    address = ctypes.addressof(params)

    def bindings_prebuilt():
        cu.cuLaunchKernel(function, GRID, 1, 1, 256, 1, 1, 0, 0, address, 0)

    bench.row("raw cuda.bindings cuLaunchKernel, prebuilt kernelParams", bindings_prebuilt)
    try:
        ex_config = cu.CUlaunchConfig()
        ex_config.gridDimX, ex_config.gridDimY, ex_config.gridDimZ = GRID, 1, 1
        ex_config.blockDimX, ex_config.blockDimY, ex_config.blockDimZ = 256, 1, 1
        ex_config.sharedMemBytes, ex_config.numAttrs = 0, 0
        ex_config.hStream = cu.CUstream(0)
    except Exception as e:  # noqa: BLE001 (an older cuda-bindings: say so, go on)
        print(f"  cuda.bindings CUlaunchConfig: {type(e).__name__}: {e}")
    else:

        def bindings_ex():
            cu.cuLaunchKernelEx(ex_config, function, address, 0)

        bench.row("raw cuda.bindings cuLaunchKernelEx, prebuilt config and params", bindings_ex)
    plan_row(bench, x, y, out)


def native_rows(bench: Bench, ctypes_calls: tuple, arguments: tuple, x, y, out) -> None:
    """The raw launch and the C no-op of ``raw_rows`` (``ctypes_calls``, the same
    ``arguments``) called through ``kaio.runtime.native``'s builtin instead of ctypes; the
    launch checked first on a poisoned output."""
    from kaio.runtime import native

    launch_ex, nothing = (
        native.trampoline(ctypes.cast(f, ctypes.c_void_p).value) for f in ctypes_calls
    )
    if launch_ex is None:
        print(f"  no native call: {native.status()}")
        return
    cfg, func_ref, par = arguments
    check_poisoned(out, x, y, lambda: launch_ex(cfg, func_ref, par, None))
    bench.row(
        "raw native cuLaunchKernelEx (kaio.runtime.native), byref function",
        lambda: launch_ex(cfg, func_ref, par, None),
    )
    bench.row(
        "native call of a C no-op (memcmp of 0 bytes), 4 arguments",
        lambda: nothing(cfg, func_ref, None, par),
    )
    # a native front's test of the thread's context (launcher.front_setup), with the call
    # around it: the trampoline passes four pointers, cuCtxGetCurrent reads the first
    from kaio.runtime.launcher import context_getter

    get_context = native.trampoline(context_getter())
    into = ctypes.byref(ctypes.c_void_p())
    bench.row("native call of cuCtxGetCurrent", lambda: get_context(into, None, None, None))


def check_poisoned(out, x, y, launch_one) -> None:
    """Raise unless ``launch_one()`` writes ``x + y`` into ``out`` (NaN before), all
    ``DeviceArray``s; launched once before, so that the launch checked is the one a loop
    repeats (a native front's, say)."""
    launch_one()
    kaio.synchronize()
    out.copy_from_host(np.full(N, np.nan, np.float32))
    launch_one()
    kaio.synchronize()
    if not np.array_equal(out.numpy(), x.numpy() + y.numpy()):
        raise AssertionError("a launch computed a wrong result")


def ctypes_rows(bench: Bench, x, y, out) -> None:
    """kaio's launches with the driver called through ctypes
    (``launcher.ctypes_launch_kernel``, as before ``kaio.runtime.native``), so without the
    native fronts: the A/B of the native call in one process; each checked first on a
    poisoned output."""
    from kaio.runtime import launcher

    saved = launcher._raw_launch, launcher.LAUNCH_FRONTS
    launcher._raw_launch = launcher.ctypes_launch_kernel()
    launcher.LAUNCH_FRONTS = False
    try:
        subscripted, later = new_add(), new_add()
        check_poisoned(out, x, y, lambda: subscripted[GRID, 256](x, y, out, N))
        bench.row(
            "kaio add[grid, 256](...), DeviceArray, ctypes call, no native front",
            lambda: subscripted[GRID, 256](x, y, out, N),
        )
        later[GRID, 256](x, y, out, N)
        direct = later[GRID, 256]
        check_poisoned(out, x, y, lambda: direct(x, y, out, N))
        bench.row(
            "kaio launch taken after a first launch, DeviceArray, ctypes call, no native front",
            lambda: direct(x, y, out, N),
        )
        plan_row(bench, x, y, out, ", ctypes call")
    finally:
        launcher._raw_launch, launcher.LAUNCH_FRONTS = saved


def step_rows(bench: Bench, x, y, out) -> None:
    """The bare launch built up one Python step at a time from the raw driver call, each
    row the previous one plus one step, so that each step's cost is the difference of two
    rows; and the ctypes call made other ways (``argtypes`` set, ``c_void_p`` objects)."""
    from kaio.runtime.launcher import parameter_slot, pointer_argument, raw_launch_kernel

    loaded, buf, params, config = prepared_add(x, y, out)
    launch_ex = raw_launch_kernel()  # kaio's: the native builtin (else PYFUNCTYPE, no argtypes)
    cfg, func = ctypes.byref(config), pointer_argument(loaded.handle)
    par = ctypes.byref(params)
    bench.keep += [buf, params, config]
    bench.row(
        "step 0: raw call (raw_launch_kernel), byref arguments made once",
        lambda: launch_ex(cfg, func, par, None),
    )
    from kaio.runtime.driver import libcuda

    typed = ctypes.PYFUNCTYPE(ctypes.c_int)(("cuLaunchKernelEx", libcuda()))
    typed.argtypes = [ctypes.c_void_p] * 4
    addresses = (ctypes.addressof(config), loaded.handle, ctypes.addressof(params))
    bench.row(
        "ctypes: argtypes c_void_p x4, int arguments",
        lambda: typed(addresses[0], addresses[1], addresses[2], None),
    )
    untyped = ctypes.PYFUNCTYPE(ctypes.c_int)(("cuLaunchKernelEx", libcuda()))
    vp = ctypes.c_void_p
    bench.row(
        "ctypes: no argtypes, c_void_p objects made per call",
        lambda: untyped(vp(addresses[0]), vp(addresses[1]), vp(addresses[2]), None),
    )
    held = (vp(addresses[0]), vp(addresses[1]), vp(addresses[2]))
    bench.row(
        "ctypes: no argtypes, c_void_p objects made once",
        lambda: untyped(held[0], held[1], held[2], None),
    )

    # the steps, as generated launchers write them
    from kaio.runtime.launcher import merge_entries, param_format

    fmt, size = param_format(loaded.params)
    pack = struct.Struct(merge_entries(fmt, {0: 2, 2: 2, 4: 2})).pack_into
    slot = parameter_slot(size, [0, 8, 16, 24, 32, 40, 48])
    free = [slot]
    env = {"take": free.pop, "give": free.append, "pack": pack, "launch_ex": launch_ex}
    env.update(cfg=cfg, func=func, T=type(x), S=x._info.sig, last=[None])
    # each step's lines, added to the previous steps' (as a generated launcher writes them)
    checks = [
        f"if type(a{k}) is not T or (i{k} := a{k}._info).sig is not S:\n    return False"
        for k in range(3)
    ]
    launch = ["rc = launch_ex(cfg, func, params, None)", "give(slot)"]
    packing = "pack(buf, 0, i0.abi_c, i1.abi_c, i2.abi_c, a3)"
    steps = [
        ("a parameter buffer off a free list", [], ["buf, params = slot = take()"], []),
        ("pack_into (3 ArgInfo byte runs and n)", [], [packing], []),
        ("the signature checks of 3 DeviceArrays", checks, [], []),
        ("the error test and the last-launch note", [], [], ["if rc:", "    raise RuntimeError(rc)",
                                                           "last[0] = 'add'"]),
    ]  # fmt: skip
    before, middle, after = [], [], []
    for i, (label, check, pre, post) in enumerate(steps, 1):
        before, middle, after = before + check, middle + pre, after + post
        packs = len(middle) > 1  # the arrays' ArgInfos read here when no check read them
        infos = ["i0, i1, i2 = a0._info, a1._info, a2._info"] if packs and not before else []
        body = before + infos + middle + launch + after
        fn = _generated("def step(a0, a1, a2, a3):", body, env)
        bench.row(f"step {i}: + {label}", lambda fn=fn: fn(x, y, out, N))
    unpack = ["if kwargs:", "    return False", "a0, a1, a2, a3 = args"]
    fn = _generated("def step(*args, **kwargs):", unpack + body, env)
    bench.row("step 5: + (*args, **kwargs) instead of parameters", lambda: fn(x, y, out, N))


def reuse_step_rows(bench: Bench, x, y, out) -> None:
    """kaio's launch of arguments it launched last (the parameters reused: the default
    path of ``add[grid, 256](...)`` in a loop) built up one step at a time from the raw
    native call, each row the previous one plus one step, as a generated launcher writes
    them (``launcher.reuse_lines``, ``build_launcher``): what kaio adds to the driver call."""
    from kaio.runtime import launch as launch_mod
    from kaio.runtime.device import current, moved
    from kaio.runtime.launcher import MISSING, parameter_slot, pointer_argument, raw_launch_kernel
    from kaio.sim.mode import anywhere

    loaded, buf, params, config = prepared_add(x, y, out)
    slot = [*parameter_slot(len(buf), [0, 8, 16, 24, 32, 40, 48]), None]
    slot[0].cast("B")[: len(buf)] = buf.raw  # packed for x, y, out, N
    slot[2] = (x._info, y._info, out._info, N)
    free = collections.deque([slot])
    env = {"take": free.popleft, "give": free.append, "launch_ex": raw_launch_kernel()}
    env.update(cfg=ctypes.byref(config), func=pointer_argument(loaded.handle), MISSING=MISSING)
    env["params"] = ctypes.byref(params)  # the raw call's (the steps take the slot's)
    env.update(MOVED=moved, current=current, DEV=0, LAST=[None], SIMULATING=anywhere)
    env.update(recordings=launch_mod.recordings, admitted=True)
    bench.keep += [buf, params, config, slot]
    same = ("a0._info is k[0] and a1._info is k[1] and a2._info is k[2] and "
            "((r3 := k[3]) is a3 or type(a3) is int and a3 == r3)")  # fmt: skip
    call = "rc = launch_ex(cfg, func, params, None)"
    steps = [  # (label, lines before the call, the call, lines after it)
        ("raw native call", [], [call], []),
        ("the parameter buffer off a deque and back", ["buf, params, k = slot = take()"],
         [call], ["give(slot)"]),
        ("the test that the arguments are the buffer's last",
         ["try:", f"    same = {same}", "except AttributeError:", "    same = False",
          "if not same:", "    return False"], [call], []),
        ("the GPU test, the admission test, the error test, the last-launch note",
         ["home = not MOVED[0] or current.ordinal == DEV", "if not admitted:",
          "    return False"], ["if home:", f"    {call}", "    if rc:", "        return False",
                               "else:", "    return False"],
         ["if rc:", "    raise RuntimeError(rc)", "LAST[0] = 'add'"]),
    ]  # fmt: skip
    before, middle, after = [], [], []
    header = "def step(a0, a1, a2, a3):"
    for i, (label, pre, launch, post) in enumerate(steps):
        before, middle, after = before + pre, launch, after + post
        fn = _generated(header, before + middle + after, env)
        check_poisoned(out, x, y, lambda fn=fn: fn(x, y, out, N))
        bench.row(f"reuse step {i}: {'+ ' if i else ''}{label}", lambda fn=fn: fn(x, y, out, N))
    body = before + middle + after
    tests = "SIMULATING[0] or recordings[0]"
    for label, params, test in (
        ("defaults", "a0=MISSING, a1=MISSING, a2=MISSING, a3=MISSING", "a3 is MISSING"),
        ("defaults, *more, **kwargs (kaio's)",
         "a0=MISSING, a1=MISSING, a2=MISSING, a3=MISSING, *more, **kwargs",
         "kwargs or more or a3 is MISSING"),
    ):  # fmt: skip
        fn = _generated(f"def step({params}):", [f"if {test} or {tests}:", "    return False"]
                        + body, env)  # fmt: skip
        bench.row(f"reuse step 4: + the direct function's tests, {label}",
                  lambda fn=fn: fn(x, y, out, N))  # fmt: skip
    # the subscript of add[grid, 256](...) alone (no launch), beside a dict's
    subscripted = new_add()
    subscripted[GRID, 256](x, y, out, N)
    table = {(GRID, 256): subscripted[GRID, 256]}
    bench.row("the subscript alone: add[grid, 256]", lambda: subscripted[GRID, 256])
    bench.row("a dict's subscript alone: table[grid, 256]", lambda: table[GRID, 256])
    # the same launch found through the dict instead of the kernel's subscript (beside
    # kaio_rows' add[grid, 256](...) and the launch taken after a first launch)
    check_poisoned(out, x, y, lambda: table[GRID, 256](x, y, out, N))
    bench.row(
        "kaio launch through a dict's subscript: table[grid, 256](...)",
        lambda: table[GRID, 256](x, y, out, N),
    )


def _generated(header: str, body: list[str], env: dict):
    """The function ``header`` with ``body`` (lines, unindented) defined in ``env``."""
    source = header + "\n" + "".join(f"    {line}\n" for line in "\n".join(body).split("\n"))
    exec(compile(source, "<step>", "exec"), env)
    return env["step"]


def plan_row(bench: Bench, x, y, out, label: str = "") -> None:
    """kaio's call-plan replay of ``add``: the three addresses packed with the prepared
    parameters, one ``cuLaunchKernelEx``; checked first on a poisoned output."""
    from kaio.runtime.plan import CallPlan, prepare

    kernel = new_add()
    prepared = prepare(kernel[GRID, 256], (x, y, out, N))
    run = CallPlan([(prepared, {0: (0, 0), 1: (1, 0), 2: (2, 0)})]).run
    pointers = (x.ptr, y.ptr, out.ptr)
    check_poisoned(out, x, y, lambda: run(pointers))
    bench.row(f"kaio call plan replay (CallPlan.run){label}", lambda: run(pointers))


def kaio_rows(bench: Bench, x, y, out, kind: str) -> None:
    """kaio's launches of ``add`` with ``kind`` arrays: the subscript spelled each call,
    pre-bound, taken after a first launch; for ``DeviceArray``s also with the parameters
    reused or not, and without the native fronts."""
    subscripted, prebound = new_add(), new_add()
    launch = prebound[GRID, 256]
    if kind == "DeviceArray":
        check_poisoned(out, x, y, lambda: subscripted[GRID, 256](x, y, out, N))
        check_poisoned(out, x, y, lambda: launch(x, y, out, N))
    bench.row(f"kaio add[grid, 256](...), {kind}", lambda: subscripted[GRID, 256](x, y, out, N))
    bench.row(f"kaio pre-bound launch(...), {kind}", lambda: launch(x, y, out, N))
    later = new_add()
    later[GRID, 256](x, y, out, N)
    direct = later[GRID, 256]  # taken after a launch: the bound launcher's own function
    if kind == "DeviceArray":
        check_poisoned(out, x, y, lambda: direct(x, y, out, N))
    bench.row(f"kaio launch taken after a first launch, {kind}", lambda: direct(x, y, out, N))
    if kind == "DeviceArray":
        reuse_rows(bench, x, y, out)
        front_rows(bench, x, y, out)


def front_rows(bench: Bench, x, y, out) -> None:
    """kaio's launches without the launchers' native fronts (``launcher.LAUNCH_FRONTS``
    off: the generated Python launch as before them), beside ``kaio_rows``' own; each
    checked first on a poisoned output."""
    from kaio.runtime import launcher

    saved = launcher.LAUNCH_FRONTS
    launcher.LAUNCH_FRONTS = False
    try:
        subscripted, later, prebound = new_add(), new_add(), new_add()
        check_poisoned(out, x, y, lambda: subscripted[GRID, 256](x, y, out, N))
        bench.row(
            "kaio add[grid, 256](...), DeviceArray, no native front",
            lambda: subscripted[GRID, 256](x, y, out, N),
        )
        launch = prebound[GRID, 256]
        check_poisoned(out, x, y, lambda: launch(x, y, out, N))
        bench.row("kaio pre-bound launch(...), DeviceArray, no native front",
                  lambda: launch(x, y, out, N))  # fmt: skip
        later[GRID, 256](x, y, out, N)
        direct = later[GRID, 256]
        check_poisoned(out, x, y, lambda: direct(x, y, out, N))
        bench.row(
            "kaio launch taken after a first launch, DeviceArray, no native front",
            lambda: direct(x, y, out, N),
        )
        bench.row("two kaio launches, arguments taking turns, no native front",
                  _taking_turns(new_add(), x, y, out))  # fmt: skip
    finally:
        launcher.LAUNCH_FRONTS = saved


def _taking_turns(kernel, x, y, out):
    """Two launches of ``kernel``'s launch taken after a first launch, the arrays of the
    second the first's taking turns (x + y, then y + x)."""
    kernel[GRID, 256](x, y, out, N)
    direct = kernel[GRID, 256]

    def alternate():
        direct(x, y, out, N)
        direct(y, x, out, N)

    return alternate


def reuse_rows(bench: Bench, x, y, out) -> None:
    """The parameter buffer of the last launch reused (``launcher.REUSE_PACKED``) against
    packed on every launch, and two argument sets taking turns (every launch repacks)."""
    from kaio.runtime import launcher

    saved = launcher.REUSE_PACKED
    try:
        for reuse in (False, True):
            launcher.REUSE_PACKED = reuse
            word = "reused" if reuse else "packed each launch"
            kernel = new_add()
            kernel[GRID, 256](x, y, out, N)
            direct = kernel[GRID, 256]
            bench.row(
                f"kaio launch, DeviceArray, parameters {word}", lambda d=direct: d(x, y, out, N)
            )
            bench.row(
                f"two kaio launches, arguments taking turns, {word}",
                _taking_turns(new_add(), x, y, out),
            )
    finally:
        launcher.REUSE_PACKED = saved


def main_rows(bench: Bench, results: dict) -> None:
    rng = np.random.default_rng(0)
    hx, hy = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y, out = kaio.to_device(hx), kaio.to_device(hy), kaio.empty((N,), f32)
    raw_rows(bench, x, y, out)
    kaio_rows(bench, x, y, out, "DeviceArray")
    ctypes_rows(bench, x, y, out)
    results["GPU us/kernel, back to back"] = bench.gpu_us_per_kernel(
        lambda: add[GRID, 256](x, y, out, N)
    )
    checks = [lambda: np.array_equal(out.numpy(), hx + hy)]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tx, ty = torch.from_numpy(hx).cuda(), torch.from_numpy(hy).cuda()
        tout = torch.empty(N, device="cuda")
        kaio_rows(bench, tx, ty, tout, "torch")
        checks.append(lambda: bool(torch.equal(tout, tx + ty)))
        checks += guard_rows(bench, (", no torch guard",))
    try:
        import cupy as cp
    except ImportError:
        cp = None
    if cp is not None:
        cx, cy, cout = cp.asarray(hx), cp.asarray(hy), cp.empty(N, cp.float32)
        kernel = new_add()
        bench.row("kaio add[grid, 256](...), CuPy", lambda: kernel[GRID, 256](cx, cy, cout, N))
        checks.append(lambda: np.array_equal(cp.asnumpy(cout), hx + hy))
    if torch is not None:
        triton_row(bench, tx, ty)
    results["rows"] = bench.run()
    if not all(check() for check in checks):
        raise AssertionError("a launched kernel computed a wrong result")


def main_steps(bench: Bench, results: dict) -> None:
    """The step rows (``step_rows``) beside kaio's own launches of the same arguments."""
    x = kaio.to_device(np.ones(N, np.float32))
    y, out = kaio.to_device(np.full(N, 2, np.float32)), kaio.empty((N,), f32)
    step_rows(bench, x, y, out)
    reuse_step_rows(bench, x, y, out)
    kaio_rows(bench, x, y, out, "DeviceArray")
    results["rows"] = bench.run()
    if not np.array_equal(out.numpy(), np.full(N, 3, np.float32)):
        raise AssertionError("a launched kernel computed a wrong result")


def main_front(bench: Bench, results: dict) -> None:
    """kaio's bare launches with and without the launchers' native fronts (``front_rows``),
    beside the raw native driver call: the A/B of the front in one process."""
    x = kaio.to_device(np.ones(N, np.float32))
    y, out = kaio.to_device(np.full(N, 2, np.float32)), kaio.empty((N,), f32)
    floor_rows(bench, x, y, out)
    kaio_rows(bench, x, y, out, "DeviceArray")
    checks = guard_rows(bench)
    results["rows"] = bench.run()
    if not np.array_equal(out.numpy(), np.full(N, 3, np.float32)):
        raise AssertionError("a launched kernel computed a wrong result")
    if not all(check() for check in checks):
        raise AssertionError("a launched kernel computed a wrong result (torch)")


TORCH_MODES = {  # a row's suffix -> (launcher.TORCH_GUARDS, launcher.TORCH_FRONTS)
    "": (True, True),
    ", no torch front": (True, False),
    ", no torch guard": (False, False),
}


def guard_rows(bench: Bench, modes: tuple = tuple(TORCH_MODES)) -> list:
    """kaio's launches of torch tensors with and without the launchers' torch guards and
    their native fronts (``modes``, ``TORCH_MODES``' keys); returns checks of the outputs
    for after the timing."""
    import torch

    from kaio.runtime import launcher

    tx, ty = torch.rand(N, device="cuda"), torch.rand(N, device="cuda")
    saved = launcher.TORCH_GUARDS, launcher.TORCH_FRONTS
    try:
        checks = []
        for word in modes:
            launcher.TORCH_GUARDS, launcher.TORCH_FRONTS = TORCH_MODES[word]
            checks.append(_torch_rows(bench, tx, ty, word))
    finally:
        launcher.TORCH_GUARDS, launcher.TORCH_FRONTS = saved
    return checks


def _torch_rows(bench: Bench, tx, ty, word: str):
    """The subscripted launch, the launch taken after a first launch, and two launches of
    that one with other tensors each (x + y into one output, y + x into another) of torch
    tensors, each checked first on poisoned outputs; returns a check of the outputs."""
    import torch

    tout, tother = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
    subscripted, later = new_add(), new_add()
    later[GRID, 256](tx, ty, tout, N)
    direct = later[GRID, 256]

    def two():
        direct(tx, ty, tout, N)
        direct(ty, tx, tother, N)

    rows = {
        f"kaio add[grid, 256](...), torch{word}": lambda: subscripted[GRID, 256](tx, ty, tout, N),
        f"kaio launch taken after a first launch, torch{word}": lambda: direct(tx, ty, tout, N),
        f"two kaio launches, other tensors each, torch{word}": two,
    }
    for name, launch_one in rows.items():
        launch_one()
        tout.fill_(float("nan"))
        tother.fill_(float("nan"))
        launch_one()
        both = not name.startswith("two") or torch.equal(tother, tx + ty)
        if not (torch.equal(tout, tx + ty) and both):
            raise AssertionError("a launch of torch tensors computed a wrong result")
        bench.row(name, launch_one)
    return lambda: bool(torch.equal(tout, tx + ty))


def op_pairs():
    """(label, kaio_ops call, torch eager spelling, torch call doing the same work, the op's
    name in torch.ops.kaio, its arguments) at decode sizes, on fresh random inputs."""
    import torch
    import torch.nn.functional as F

    import kaio_ops
    from bench.fp8 import fp8_operands, scaled_mm
    from bench.quantized import int4_inputs

    def randn(*shape, dtype=torch.float16):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    x, packed, scales, w = int4_inputs(1, 4096, 4096)
    wb = w.bfloat16()
    xb = x.bfloat16()
    h, r, g, b = randn(1, 4096), randn(1, 4096), randn(4096), randn(4096)
    u, v = randn(1, 14336), randn(1, 14336)
    s32 = randn(32, 512, dtype=torch.float32)
    a8 = torch.randint(-128, 128, (1, 4096), device="cuda", dtype=torch.int8)
    b8 = torch.randint(-128, 128, (4096, 4096), device="cuda", dtype=torch.int8)
    q = randn(1, 32, 1, 128)
    kv, kv2 = randn(1, 32, 512, 128), randn(1, 32, 512, 128)
    xr = randn(1, 32, 128)  # rope: [S, H, D], one token
    cos, sin = randn(1, 64), randn(1, 64)
    wt = w.t().contiguous()  # nn.Linear's [N, K]
    qd = randn(1, 32, 1, 128)  # decode attention: Llama-3-8B heads over a 4k-token cache
    kc, vc = randn(1, 8, 4096, 128), randn(1, 8, 4096, 128)
    lens = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
    fp8 = fp8_operands(1, 4096, 4096, rowwise=False)  # b column-major, as torch takes it

    def rope_torch():
        x1, x2 = xr[..., :64], xr[..., 64:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)

    def residual_torch():
        s = h + r
        return F.rms_norm(s, (4096,), g, 1e-6), s

    return [
        ("matmul_tc [1, 4096] x [4096, 4096] f16", kaio_ops.matmul_tc, (x, w),
         "x @ w", lambda: x @ w),
        ("matmul_tc_bf16 [1, 4096] x [4096, 4096]", kaio_ops.matmul_tc_bf16, (xb, wb),
         "x @ w (bf16)", lambda: xb @ wb),
        ("matmul_int4 [1, 4096] x [4096, 4096]", kaio_ops.matmul_int4, (x, packed, scales),
         "x @ w (f16 weights, cuBLAS)", lambda: x @ w),
        ("matmul_int8 [1, 4096] x [4096, 4096]", kaio_ops.matmul_int8, (a8, b8),
         "x @ w (f16 weights, cuBLAS)", lambda: x @ w),
        ("rms_norm [1, 4096] f16", kaio_ops.rms_norm, (h, g),
         "F.rms_norm", lambda: F.rms_norm(h, (4096,), g, 1e-6)),
        ("rms_norm_residual [1, 4096] f16", kaio_ops.rms_norm_residual, (h, r, g),
         "s = x + r; F.rms_norm(s)", residual_torch),
        ("layer_norm [1, 4096] f16", kaio_ops.layer_norm, (h, g, b),
         "F.layer_norm", lambda: F.layer_norm(h, (4096,), g, b, 1e-5)),
        ("softmax [32, 512] f32", kaio_ops.softmax, (s32,),
         "torch.softmax", lambda: torch.softmax(s32, -1)),
        ("silu_gate [1, 14336] f16", kaio_ops.silu_gate, (u, v),
         "F.silu(x) * g", lambda: F.silu(u) * v),
        ("gelu [1, 14336] f16", kaio_ops.gelu, (u,),
         "F.gelu(tanh)", lambda: F.gelu(u, approximate="tanh")),
        ("add [1, 4096] f16", kaio_ops.add, (h, r), "x + y", lambda: h + r),
        ("mul [1, 4096] f16", kaio_ops.mul, (h, r), "x * y", lambda: h * r),
        ("rope [1, 32, 128] f16", kaio_ops.rope, (xr, cos, sin),
         "rotate halves (6 ops)", rope_torch),
        ("flash_attention q [1, 32, 1, 128], kv 512", kaio_ops.flash_attention, (q, kv, kv2),
         "F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, kv, kv2)),
        ("linear [1, 4096] x [4096, 4096]^T f16", kaio_ops.linear, (x, wt),
         "F.linear", lambda: F.linear(x, wt)),
        ("matmul [1, 4096] x [4096, 4096] f16", kaio_ops.matmul, (x, w),
         "x @ w", lambda: x @ w),
        ("flash_attention_decode q [1, 32, 1, 128], kv [1, 8, 4096, 128]",
         kaio_ops.flash_attention_decode, (qd, kc, vc, lens),
         "SDPA (GQA)", lambda: F.scaled_dot_product_attention(qd, kc, vc, enable_gqa=True)),
        ("matmul_fp8 [1, 4096] x [4096, 4096] e4m3", kaio_ops.matmul_fp8, fp8,
         "torch._scaled_mm (M padded to 16)", lambda: scaled_mm(*fp8)),
    ]  # fmt: skip


def _register_empty(lib, name: str, schema: str, made, kaio_way: bool):
    """``torch.ops.kaio_bench.<name>`` of ``schema``, whose impl only returns ``made``
    (tensors made beforehand), registered as kaio_ops.torch registers its ops (Library
    define, a CompositeExplicitAutograd impl, a fake, an autograd formula: with
    ``kaio_way``, kaio_ops.torch's Autograd kernel, which answers a call needing no
    gradient itself, as it replays a plan; else torch.library.register_autograd's)."""
    import torch

    from kaio_ops.torch import _register_autograd

    lib.define(name + schema)
    lib.impl(name, lambda *args, **kwargs: made, "CompositeExplicitAutograd")
    qualname = f"kaio_bench::{name}"
    fake = (
        (lambda *a, **k: tuple(t.new_empty(t.shape) for t in made))
        if isinstance(made, tuple)
        else (lambda *a, **k: made.new_empty(made.shape))
    )
    torch.library.register_fake(qualname, fake, lib=lib)
    backward, setup = (lambda ctx, *g: g), (lambda ctx, inputs, output: None)
    if kaio_way:
        _register_autograd(lib, qualname, backward, setup, lambda *args: made)
    else:
        torch.library.register_autograd(qualname, backward, setup_context=setup, lib=lib)
    return getattr(torch.ops.kaio_bench, name)


def empty_custom_op():
    """(the library, ``torch.ops.kaio_bench.empty(x) -> Tensor`` registered with
    torch.library.register_autograd's kernel, the same registered as kaio_ops.torch
    registers its ops): the dispatcher's own cost (``_register_empty``)."""
    import torch

    lib = torch.library.Library("kaio_bench", "FRAGMENT")
    made = torch.empty(1, device="cuda")
    ops = [_register_empty(lib, name, "(Tensor x) -> Tensor", made, kaio_way)
           for name, kaio_way in (("empty", False), ("empty_kaio", True))]  # fmt: skip
    return lib, *ops


def empty_twin(lib, op_name: str, made):
    """``torch.ops.kaio_bench.<op_name>``: an op with the schema of ``torch.ops.kaio.<op_name>``,
    registered the same way, whose impl returns ``made`` (tensors made beforehand): the
    dispatcher's cost for that op's arguments (more tensors, scalars), the floor of its
    ``torch.ops.kaio`` call beside the one-tensor empty op's."""
    import torch

    schema = str(getattr(torch.ops.kaio, op_name).default._schema)
    return _register_empty(lib, op_name, schema[schema.index("(") :], made, kaio_way=True)


def _as_tensors(out):
    return out if isinstance(out, tuple) else (out,)


def _launches_a_call(op) -> int | None:
    """The kernel launches a planned call of ``op`` makes (its plans' largest), None when
    the op has no plan."""
    from kaio_ops._plan import plans_of

    plans = getattr(op, "_plans", None)
    counts = [len(r.plan.steps) for r in (plans_of(op) if plans is not None else {}).values()
              if r is not None and getattr(r, "plan", None) is not None]  # fmt: skip
    return max(counts) if counts else None


def _check_pair(torch, label: str, op, args: tuple, torch_call) -> None:
    """Raise unless ``op(*args)`` (twice: the second call replays its plan) matches torch's
    result to 1e-2 (relative norm)."""
    if op.__name__ == "matmul_int8":  # the peer multiplies other (f16) weights
        a8, b8 = args
        reference = (a8.double() @ b8.double(),)
    else:
        reference = _as_tensors(torch_call())
    for _ in range(2):
        for got, want in zip(_as_tensors(op(*args)), reference, strict=False):
            got, want = got.double(), want.double()
            error = (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()
            if not error < 1e-2:
                raise AssertionError(f"kaio_ops.{label}: relative error {error:.2e} against torch")


def op_rows(results: dict) -> None:
    """Host time per call of every ``kaio_ops`` op at decode size, the same op through
    ``torch.ops.kaio``, and torch eager doing the same work (each pair's results compared
    first), OP_BATCH calls a batch; the empty custom op gives the dispatcher floor."""
    import torch

    import kaio_ops.torch  # noqa: F401 (registers torch.ops.kaio)

    bench = Bench(OP_BATCH, OP_SPIN_MS * SPIN_MS)
    pairs = [p for p in op_pairs() if not OPS or p[1].__name__ in OPS]
    lib, empty, empty_kaio = empty_custom_op()
    probe = torch.empty(1, device="cuda")
    bench.row("torch.ops.kaio_bench.empty (dispatcher floor)", lambda: empty(probe))
    bench.row("torch.ops.kaio_bench.empty_kaio (floor, kaio's way)", lambda: empty_kaio(probe))
    failed = results["op_errors"] = {}
    launches = {}  # label -> kernel launches a planned call makes
    for label, op, args, spelled, torch_call in list(pairs):
        dispatched = getattr(torch.ops.kaio, op.__name__)
        try:
            _check_pair(torch, label, op, args, torch_call)
        except Exception as e:  # one failing op must not lose the other rows
            failed[label] = f"{type(e).__name__}: {e}"
            print(f"  {label}: failed: {failed[label]}", flush=True)
            pairs.remove((label, op, args, spelled, torch_call))
            continue
        launches[label] = _launches_a_call(op)
        bench.row(f"kaio_ops.{label}", lambda op=op, args=args: op(*args))
        bench.row(f"torch.ops.kaio.{label}", lambda f=dispatched, args=args: f(*args))
        twin = empty_twin(lib, op.__name__, op(*args))
        bench.row(f"torch.ops.kaio_bench.{label} (empty)", lambda f=twin, args=args: f(*args))
        bench.row(f"torch {spelled} [{label}]", torch_call)
    rows = bench.run()
    results["ops_late"] = bench.late
    print(f"  op batches that outlasted their spinner: {bench.late}")
    floor = rows["torch.ops.kaio_bench.empty (dispatcher floor)"]["host_us"]
    results["dispatcher_floor_us"] = floor
    floor_kaio = rows["torch.ops.kaio_bench.empty_kaio (floor, kaio's way)"]["host_us"]
    results["dispatcher_floor_kaio_us"] = floor_kaio
    results["ops"] = [
        {
            "op": label,
            "torch": spelled,
            "kaio_us": rows[f"kaio_ops.{label}"]["host_us"],
            "torch_ops_kaio_us": rows[f"torch.ops.kaio.{label}"]["host_us"],
            "torch_ops_floor_us": rows[f"kaio_ops.{label}"]["host_us"] + floor,
            "torch_ops_floor_kaio_us": rows[f"kaio_ops.{label}"]["host_us"] + floor_kaio,
            # the same with the dispatcher's cost for this op's own schema
            "torch_ops_schema_floor_us": rows[f"kaio_ops.{label}"]["host_us"]
            + rows[f"torch.ops.kaio_bench.{label} (empty)"]["host_us"],
            "torch_us": rows[f"torch {spelled} [{label}]"]["host_us"],
            "launches": launches[label],
        }
        for label, _, _, spelled, _ in pairs
    ]
    print(
        f"  {'op':<44} {'kaio_ops':>8} {'torch':>8} {'ratio':>6} {'t.ops':>8} {'floor':>8} "
        f"{'schema':>8} {'f.torch':>8} {'launches':>8}"
    )
    for r in results["ops"]:
        print(
            f"  {r['op']:<44} {r['kaio_us']:8.2f} {r['torch_us']:8.2f} "
            f"{r['torch_us'] / r['kaio_us']:6.2f} {r['torch_ops_kaio_us']:8.2f} "
            f"{r['torch_ops_floor_kaio_us']:8.2f} {r['torch_ops_schema_floor_us']:8.2f} "
            f"{r['torch_ops_floor_us']:8.2f} {r['launches'] or '-':>8}"
        )
    del lib


def triton_row(bench: Bench, x, y) -> None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return

    @triton.jit
    def triton_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    out = x.new_empty(N)
    bench.row("triton add[grid](...), torch", lambda: triton_add[(GRID,)](x, y, out, N, BLOCK=256))
    assert bool((out == x + y).all())


def cold_child() -> None:
    """In a fresh process: time the first launch (compile, link or cache load)."""
    source = use_hand_ptx()
    x = kaio.zeros((N,), f32)
    t1 = time.perf_counter()
    add[GRID](x, x, x, N)
    kaio.synchronize()
    t2 = time.perf_counter()
    print(json.dumps({"first_launch_ms": (t2 - t1) * 1e3, "ptx": source}))


def cold_rows(results: dict) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "KAIO_CACHE_DIR": cache}
        for label in ("empty cache", "warm disk cache"):
            out = subprocess.run(
                [sys.executable, __file__, "--cold-child"], env=env, capture_output=True, text=True
            )
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
            child = json.loads(out.stdout.strip().splitlines()[-1])
            name = f"first launch in a new process, {label} (ms)"
            results[name] = child["first_launch_ms"]
            print(f"  {name:<52} {child['first_launch_ms']:8.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--skip-cold", action="store_true", help="no first-launch rows")
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--batches", type=int, default=BATCHES, help=f"batches a row (default {BATCHES})"
    )
    parser.add_argument(
        "--spin-ms", type=float, default=SPIN_MS, help=f"GPU spin a batch (default {SPIN_MS})"
    )
    parser.add_argument(
        "--ops", nargs="*", default=[], help="only these kaio_ops (names; default: all)"
    )
    parser.add_argument(
        "--rows",
        choices=("all", "launch", "ops", "steps", "front"),
        default="all",
        help="which rows to measure (steps: the bare launch built up one step at a time; "
        "front: with and without the native launch fronts)",
    )
    parser.add_argument(
        "--no-empty-like",
        action="store_true",
        help="plans make every output with torch.empty (kaio_ops._plan.EMPTY_LIKE off)",
    )
    parser.add_argument(
        "--no-recycle",
        action="store_true",
        help="plans never hand a dropped output out again (KAIO_RECYCLE_OUTPUTS=0)",
    )
    args = parser.parse_args()
    globals().update(BATCHES=args.batches, SPIN_MS=args.spin_ms, OPS=args.ops)
    if args.no_empty_like or args.no_recycle:
        from kaio_ops import _plan

        _plan.EMPTY_LIKE = _plan.EMPTY_LIKE and not args.no_empty_like
        _plan.RECYCLE_BYTES = 0 if args.no_recycle else _plan.RECYCLE_BYTES
    if args.cold_child:
        cold_child()
        return
    ptx = use_hand_ptx()
    dev = kaio.device()
    from kaio.runtime import launcher, native

    launcher.raw_launch_kernel()
    print(
        f"{dev.name} ({dev.arch}), kernel PTX: {ptx}; launches call the driver through "
        f"{native.status()}; median of {BATCHES} batches of {BATCH} launches; microseconds "
        "per launch"
    )
    print(f"  {'':<52} {'host':>8} {'free':>8}")
    bench, results, errors = Bench(), {}, {}
    groups = [lambda: main_rows(bench, results), lambda: op_rows(results)]
    steps = [lambda: main_steps(bench, results)]
    front = [lambda: main_front(bench, results)]
    groups = {"all": groups, "launch": groups[:1], "ops": groups[1:], "steps": steps,
              "front": front}[args.rows]  # fmt: skip
    if not args.skip_cold:
        groups.append(lambda: cold_rows(results))
    for group in groups:
        try:
            group()
        except Exception as e:  # one failing peer must not lose the other rows
            errors[len(errors)] = f"{type(e).__name__}: {e}"
            print(f"  failed: {errors[len(errors) - 1]}", flush=True)
    gpu = results.get("GPU us/kernel, back to back")
    if gpu is not None:
        print(f"  GPU time per kernel, back to back: {gpu:.2f} us")
    print(f"  batches that outlasted the {SPIN_MS} ms spinner: {bench.late}")
    if args.out:
        report = {"device": dev.name, "arch": dev.arch, "ptx": ptx, "method": __doc__}
        report.update(results=results, late=bench.late, errors=errors)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
