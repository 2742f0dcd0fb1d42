"""Where the host time of a planned op call goes, on a GPU: the parts of one call timed alone.

- torch's accessors on a CUDA tensor (what a call plan's key reads), the current raw stream,
  and output allocation spellings (``torch.empty`` and others);
- the launch through other foreign-function layers than kaio's ctypes ``cuLaunchKernelEx``
  (cffi, if installed, on the same driver entry point), in ``launch_overhead``'s interleaved
  rounds behind a GPU spinner;
- a planned ``kaio_ops`` call taken apart: the whole call, the key and lookup alone (the
  plan's replay swapped for a no-op), the replay alone (allocation and launch), the
  allocation alone.

Times with ``time.perf_counter`` over many calls (median of repeats); the launch rows as
``bench/launch_overhead.py`` measures them.

    PYTHONPATH=$PWD python3 bench/host_parts.py [--out parts.json]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import re
import statistics
import sys
import time
import weakref

import kaio


def per_call_ns(fn, calls: int = 20000, repeats: int = 9) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls of ``fn``, in ns."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e9)
    return statistics.median(times)


def accessor_rows(out: dict) -> None:
    """torch accessors, the raw stream and allocation spellings on CUDA tensors."""
    import torch

    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    dev = x.device
    dt = torch.float16
    raw = torch._C._cuda_getCurrentRawStream
    alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
    delete = torch._C._cuda_cudaCachingAllocator_raw_delete
    y = torch.randn(4096, device="cuda", dtype=torch.float16)
    key = (x.dtype, x.shape, True, 0, 0, y.dtype, y.shape, True, 0, 0, 1e-6, float, raw(0), False)
    plans = {key: None}
    rows = {
        "empty lambda": lambda: None,
        "type(x) is Tensor": lambda: type(x) is torch.Tensor,
        "x.get_device()": lambda: x.get_device(),
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.dtype": lambda: x.dtype,
        "x.shape": lambda: x.shape,
        "x.stride()": lambda: x.stride(),
        "x.is_contiguous()": lambda: x.is_contiguous(),
        "x.device": lambda: x.device,
        "_cuda_getCurrentRawStream(0)": lambda: raw(0),
        "torch.empty(1, 4096, dtype, device)": lambda: torch.empty(1, 4096, dtype=dt, device=dev),
        "partial(torch.empty, 1, 4096, ...)()": functools.partial(
            torch.empty, 1, 4096, dtype=dt, device=dev
        ),
        "torch.empty((1, 4096), dtype, device)": lambda: torch.empty(
            (1, 4096), dtype=dt, device=dev
        ),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.new_empty((1, 4096))": lambda: x.new_empty((1, 4096)),
        "torch.empty_strided": lambda: torch.empty_strided(
            (1, 4096), (4096, 1), dtype=dt, device=dev
        ),
        "torch.empty(1, 4096, dtype, device=0)": lambda: torch.empty(1, 4096, dtype=dt, device=0),
        "torch.empty((1, 4096), dtype, device=0)": lambda: torch.empty(
            (1, 4096), dtype=dt, device=0
        ),
        "torch.empty(x.shape, dtype, device)": lambda: torch.empty(x.shape, dtype=dt, device=dev),
        "raw_alloc + raw_delete (caching allocator)": lambda: delete(alloc(8192, 0)),
        "x.untyped_storage()": lambda: x.untyped_storage(),
        "x.__cuda_array_interface__": lambda: x.__cuda_array_interface__,
        "x.is_cuda": lambda: x.is_cuda,
        "x.size()": lambda: x.size(),
        "x.ndim": lambda: x.ndim,
        "x.numel()": lambda: x.numel(),
        "x.storage_offset()": lambda: x.storage_offset(),
        "x.element_size()": lambda: x.element_size(),
        "x.layout": lambda: x.layout,
        "x.requires_grad": lambda: x.requires_grad,
        "x.is_inference()": lambda: x.is_inference(),
        "x._use_count()": lambda: x._use_count(),
        "sys.getrefcount(x)": lambda: sys.getrefcount(x),
        "weakref.getweakrefcount(x)": lambda: weakref.getweakrefcount(x),
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled,
        "_cuda_isCurrentStreamCapturing()": torch._C._cuda_isCurrentStreamCapturing,
        "torch.empty_like(x, memory_format)": lambda: torch.empty_like(
            x, memory_format=torch.contiguous_format
        ),
        "x.new_empty(x.shape)": lambda: x.new_empty(x.shape),
        "torch.empty_like(x) + .data_ptr()": lambda: torch.empty_like(x).data_ptr(),
        "hash of a 14-item key": lambda: hash(key),
        "dict lookup of a 14-item key": lambda: plans.get(key),
    }
    base = per_call_ns(rows["empty lambda"])
    out["accessors_ns"] = {}
    for name, fn in rows.items():
        ns = per_call_ns(fn)
        out["accessors_ns"][name] = ns
        print(f"  {name:<44} {ns:8.0f} ns  ({ns - base:6.0f} over a lambda)", flush=True)


def ffi_rows(out: dict) -> None:
    """The launch of launch_overhead's ``add`` through ctypes and cffi, behind the spinner."""
    from bench.launch_overhead import (
        GRID,
        Bench,
        N,
        new_add,
        plan_row,
        prepared_add,
        use_hand_ptx,
    )
    from kaio import f32
    from kaio.runtime.driver import libcuda

    use_hand_ptx()
    x, y, o = kaio.zeros((N,), f32), kaio.zeros((N,), f32), kaio.zeros((N,), f32)
    loaded, buf, params, config = prepared_add(x, y, o)
    lib = libcuda()
    bench = Bench()
    keep = [buf, params, config]
    func = ctypes.c_void_p(loaded.handle)
    gil = ctypes.PYFUNCTYPE(ctypes.c_int)(("cuLaunchKernelEx", lib))
    cfg, par = ctypes.byref(config), ctypes.byref(params)
    bench.row("ctypes PYFUNCTYPE cuLaunchKernelEx (kaio's)", lambda: gil(cfg, func, par, None))
    entry = ctypes.cast(lib.cuLaunchKernelEx, ctypes.c_void_p).value
    try:
        import cffi
    except ImportError:
        print("  cffi: not installed")
    else:
        ffi = cffi.FFI()
        fn = ffi.cast("int(*)(void *, void *, void **, void **)", entry)
        c_cfg = ffi.cast("void *", ctypes.addressof(config))
        c_func = ffi.cast("void *", loaded.handle)
        c_par = ffi.cast("void **", ctypes.addressof(params))
        null = ffi.NULL
        bench.row("cffi ABI cuLaunchKernelEx", lambda: fn(c_cfg, c_func, c_par, null))
    kernel = new_add()
    launch = kernel[GRID, 256]
    bench.row("kaio pre-bound launch(...), DeviceArray", lambda: launch(x, y, o, N))
    plan_row(bench, x, y, o)
    out["ffi"] = bench.run()
    del keep


def python_rows(out: dict) -> None:
    """The Python side of each launch path alone: each path timed as it is, with its driver
    call swapped for a ctypes call of a C function that does nothing with the same four
    arguments (``atoi``, which reads the first bytes of the launch configuration, a small grid
    size, as 0: ctypes' own cost), and for a Python function that returns 0
    (the path's Python code alone)."""
    import torch

    import kaio_ops
    from bench.launch_overhead import GRID, N, new_add, use_hand_ptx
    from kaio import f32
    from kaio.runtime.plan import CallPlan, prepare

    use_hand_ptx()
    libc = ctypes.CDLL(None)
    ctypes_nothing = ctypes.PYFUNCTYPE(ctypes.c_int)(("atoi", libc))

    def nothing(*args):
        return 0

    x, y, o = kaio.zeros((N,), f32), kaio.zeros((N,), f32), kaio.zeros((N,), f32)
    tx, ty, to = (torch.zeros(N, device="cuda") for _ in range(3))
    h = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    r = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    g = torch.randn(4096, device="cuda", dtype=torch.float16)
    paths = {}
    for kind, args in (("DeviceArray", (x, y, o, N)), ("torch", (tx, ty, to, N))):
        launch = new_add()[GRID, 256]
        launch(*args)
        bound = launch.launch._first  # the generated launcher bound to this configuration
        paths[f"kaio launch, {kind}"] = (
            bound.__globals__,
            lambda launch=launch, a=args: launch(*a),
        )
    prepared = prepare(new_add()[GRID, 256], (x, y, o, N))
    run = CallPlan([(prepared, {0: (0, 0), 1: (1, 0), 2: (2, 0)})]).run
    pointers = (x.ptr, y.ptr, o.ptr)
    paths["CallPlan.run"] = (run.__globals__, lambda: run(pointers))
    for name, op, args in (("add", kaio_ops.add, (h, r)), ("rms_norm", kaio_ops.rms_norm, (h, g))):
        op(*args)
        replay = next(v for v in kaio_ops._plan.plans_of(op).values() if v is not None)
        paths[f"kaio_ops.{name}"] = (replay.__globals__, lambda op=op, args=args: op(*args))
    torch.cuda.synchronize()
    out["python_ns"] = {}
    for name, (env, fn) in paths.items():
        real = env["launch_kernel"]
        results = {}
        for label, stand_in in (("driver", real), ("ctypes no-op", ctypes_nothing),
                                ("python no-op", nothing)):  # fmt: skip
            env["launch_kernel"] = stand_in
            try:
                results[label] = per_call_ns(fn, calls=2000, repeats=15)
            finally:
                env["launch_kernel"] = real
            torch.cuda.synchronize()
        out["python_ns"][name] = results
        print(
            f"  {name:<28} " + "  ".join(f"{k} {v:6.0f} ns" for k, v in results.items()),
            flush=True,
        )


def op_parts(out: dict) -> None:
    """A planned op call taken apart (torch tensors at decode size)."""
    import torch

    import kaio_ops
    from kaio_ops import _plan

    h = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    r = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    g = torch.randn(4096, device="cuda", dtype=torch.float16)
    out["op_parts_ns"] = {}
    u = torch.randn(1, 14336, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    cases = (
        ("rms_norm", kaio_ops.rms_norm, (h, g)),
        ("add", kaio_ops.add, (h, r)),
        ("gelu", kaio_ops.gelu, (u,)),
        ("matmul", kaio_ops.matmul, (h, w)),
    )
    for name, op, args in cases:
        op(*args)
        torch.cuda.synchronize()
        plans = _plan.plans_of(op)
        key = next(k for k, v in plans.items() if v is not None)
        replay = plans[key]
        pointers = tuple(a.data_ptr() for a in args)
        allocate = replay.__globals__.get("A0")
        parts = {"whole call": lambda op=op, args=args: op(*args)}
        parts["replay (allocate, launch)"] = lambda r=replay, p=pointers, a=args: r(*p, *a)
        if allocate is not None:
            parts["allocate alone (torch.empty)"] = allocate
        if "EMPTY_LIKE(a0)" in replay.source:
            parts["allocate alone (empty_like)"] = lambda x=args[0]: torch.empty_like(x)
        results = {}
        for label, fn in parts.items():
            results[label] = per_call_ns(fn, calls=200, repeats=41)
            torch.cuda.synchronize()
        plans[key] = lambda *p: None
        results["key and lookup (no-op replay)"] = per_call_ns(
            lambda op=op, args=args: op(*args), calls=200, repeats=41
        )
        plans[key] = replay
        out["op_parts_ns"][name] = results
        for label, ns in results.items():
            print(f"  {name:<10} {label:<36} {ns:8.0f} ns", flush=True)


def plan_rows(out: dict) -> None:
    """Which ``bench/launch_overhead`` op calls replay a plan, and what each replay does
    (launches, allocations, workspaces from the caching allocator)."""
    import torch

    from bench.launch_overhead import op_pairs
    from kaio_ops import _plan

    out["plans"] = {}
    for label, op, args, _spelled, _torch_call in op_pairs():
        _plan.clear()
        op(*args)
        op(*args)
        torch.cuda.synchronize()
        replays = list(_plan.plans_of(op).values())
        if not replays or None in replays:
            note = "UNPLANNED (runs the op each call)"
        else:
            source, plan = replays[0].source, replays[0].plan
            note = (
                f"{len(plan.steps) if plan else 0} launches, "
                f"{len(set(re.findall(r'A[0-9]+[(][)]', source)))} allocations, "
                f"{source.count('ALLOCATE(')} workspaces from the caching allocator"
            )
        try:
            note += f"; torch.ops.kaio: {_replay_only_hits(op, args)}"
        except Exception as e:  # noqa: BLE001 (a diagnostic: say why and go on)
            note += f"; torch.ops.kaio failed: {type(e).__name__}: {e}"
        out["plans"][label] = note
        print(f"  {label:<60} {note}", flush=True)


class _CountingPlans(dict):
    """An op's plans that count what ``replay_only`` finds (``get``)."""

    hits = misses = 0

    def get(self, key, default=None):
        found = super().get(key, default)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found


def _replay_only_hits(op, args) -> str:
    """How many of three ``torch.ops.kaio`` calls found their plan through ``replay_only``."""
    import torch

    import kaio_ops.torch  # noqa: F401 (registers torch.ops.kaio)

    env = op.replay_only.__globals__  # the generated functions' namespace
    plans = env["plans"]
    counting = env["plans"] = _CountingPlans(plans)
    try:
        for _ in range(3):
            getattr(torch.ops.kaio, op.__name__)(*args)
    finally:
        env["plans"] = plans
    return f"{counting.hits} replayed, {counting.misses} missed"


def dispatch_rows(out: dict) -> None:
    """The dispatcher's cost of an empty custom op (one tensor in, a tensor made beforehand
    out) registered in several ways: as kaio_ops.torch registers its ops (define, a
    CompositeExplicitAutograd impl, a fake, ``_register_autograd``: an Autograd kernel that
    answers a call needing no gradient itself), with torch.library.register_autograd's
    kernel, without an autograd formula, as a CompositeImplicitAutograd kernel
    (kaio_ops.torch's composites); beside them planned ops called directly and through
    torch.ops.kaio."""
    import torch

    import kaio_ops
    import kaio_ops.torch  # noqa: F401

    made = torch.empty(1, device="cuda")
    probe = torch.empty(1, device="cuda")
    lib = torch.library.Library("kaio_parts", "FRAGMENT")
    ops = {}
    from kaio_ops.torch import _register_autograd

    def backward(ctx, g):
        return g

    def setup(ctx, inputs, output):
        pass

    for name, autograd, implicit in (
        ("kaio_way", "kaio", False),
        ("register_autograd", "torch", False),
        ("no_autograd", None, False),
        ("implicit", None, True),
    ):
        lib.define(f"{name}(Tensor x) -> Tensor")
        qualname = f"kaio_parts::{name}"
        if implicit:
            lib.impl(name, lambda x: made, "CompositeImplicitAutograd")
        else:
            lib.impl(name, lambda x: made, "CompositeExplicitAutograd")
            torch.library.register_fake(qualname, lambda x: x.new_empty(1), lib=lib)
        if autograd == "torch":
            torch.library.register_autograd(qualname, backward, setup_context=setup, lib=lib)
        elif autograd == "kaio":
            _register_autograd(lib, qualname, backward, setup, lambda *args: made)
        ops[name] = getattr(torch.ops.kaio_parts, name)
    rows = {f"empty op, {name}": (lambda f=f: f(probe)) for name, f in ops.items()}
    rows["empty op, kaio_way, .default"] = lambda f=ops["kaio_way"].default: f(probe)
    u = torch.randn(1, 14336, device="cuda", dtype=torch.float16)
    h = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    rows["kaio_ops.gelu"] = lambda: kaio_ops.gelu(u)
    rows["torch.ops.kaio.gelu"] = lambda: torch.ops.kaio.gelu(u)
    rows["torch.ops.kaio.gelu.default"] = lambda f=torch.ops.kaio.gelu.default: f(u)
    rows["kaio_ops.add"] = lambda: kaio_ops.add(h, h)
    rows["torch.ops.kaio.add"] = lambda: torch.ops.kaio.add(h, h)
    out["dispatch_ns"] = {}
    for name, fn in rows.items():
        ns = per_call_ns(fn, calls=2000, repeats=15)
        torch.cuda.synchronize()
        out["dispatch_ns"][name] = ns
        print(f"  {name:<44} {ns:8.0f} ns", flush=True)
    del lib


def gemv_rows(out: dict) -> None:
    """``kaio_ops.matmul`` at M = 1, K = N = 4096 (f16, B [K, N]): GPU time a call back to
    back (queued behind a spinner, CUDA events) and host time a call, through the mma.sync
    kernel with a K split and its sum (two launches), the same summing its K split in the
    kernel (``linear.MMA_FIXUP``, ``FIXUP_ROWS``: one launch) and through the one-launch
    skinny kernel (``_gemv.gemv_kn``, its K split summed by the last block), the weight the
    same (L2-warm) or rotated over 4 (128 MB, past the L2); cuBLAS (``x @ w``) beside."""
    import importlib

    import torch

    import kaio_ops
    from bench.decode_gemms import gpu_us
    from bench.launch_overhead import Spinner
    from kaio_ops import _plan

    linear = importlib.import_module("kaio_ops.linear")
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    ws = [torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 64 for _ in range(4)]
    spinner = Spinner(5.0)
    key = (4096, 4096, "kn")
    routed = linear.MEASURED[key]
    out["gemv"] = {}
    fixup, rows = linear.MMA_FIXUP, linear.FIXUP_ROWS
    for label, table, in_kernel in (
        ("mma.sync split-K", [(1, "mma.sync"), *routed], False),
        ("mma.sync split-K summed in the kernel", [(1, "mma.sync"), *routed], True),
        ("gemv_kn", [(1, "gemv"), *routed], False),
    ):
        linear.MEASURED[key] = table
        linear.MMA_FIXUP, linear.FIXUP_ROWS = in_kernel, rows if in_kernel else 0
        _plan.clear()
        try:
            for w in ws:
                got = kaio_ops.matmul(x, w).double()
                want = x.double() @ w.double()
                err = (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()
                assert err < 1e-2, f"{label}: relative error {err}"
            peers = [(f"kaio {label}", kaio_ops.matmul)]
            if not in_kernel:
                peers.append((f"cuBLAS x @ w [{label}]", torch.matmul))
            for name, fn in peers:
                for rot in (1, 4):
                    gpu = gpu_us(spinner, fn, [(x, w) for w in ws[:rot]])
                    host = per_call_ns(lambda fn=fn: fn(x, ws[0]), calls=200, repeats=21) / 1e3
                    torch.cuda.synchronize()
                    row = f"{name}, {'rotated' if rot > 1 else 'same'} weight"
                    out["gemv"][row] = {"gpu_us": gpu, "host_us": host}
                    print(f"  {row:<52} GPU {gpu:7.2f} us  host {host:6.2f} us", flush=True)
        finally:
            linear.MEASURED[key], linear.MMA_FIXUP, linear.FIXUP_ROWS = routed, fixup, rows
            _plan.clear()


def native_no_op():
    """A native builtin (``kaio.runtime.native``) that takes a launch's four arguments and
    does nothing (it calls ``fegetround``, which returns 0 under the default rounding),
    for timing a call's Python side alone; None where there is none."""
    from kaio.runtime import native

    libm = ctypes.CDLL(None)
    nothing = native.trampoline(ctypes.cast(libm.fegetround, ctypes.c_void_p).value)
    return nothing if nothing is not None and libm.fegetround() == 0 else None


def _generated_functions(op) -> list:
    """The generated functions a planned call of ``op`` may run (its plans' replays and
    their fast paths), whose globals hold the plan's ``launch_kernel`` (``op._plans``:
    whichever source tree the op comes from, ``bench/host_ab.py``)."""
    found = []
    for replay in op._plans.values():
        if replay is None:
            continue
        found.append(replay)
        found += [f for f in getattr(replay, "fasts", {}).values() if f is not None]
    return found


class Swapped:
    """``launch_kernel`` in an op's generated functions swapped for ``stand_in`` while a
    batch runs (``with``), the real call put back after."""

    def __init__(self, op, stand_in):
        self.op, self.stand_in = op, stand_in

    def __enter__(self):
        self.saved = [(f.__globals__, f.__globals__["launch_kernel"])
                      for f in _generated_functions(self.op)]  # fmt: skip
        for env, _ in self.saved:
            env["launch_kernel"] = self.stand_in

    def __exit__(self, *exc):
        for env, real in self.saved:
            env["launch_kernel"] = real


def _captured_launches(op, args: tuple) -> tuple[list, object]:
    """(each launch of one planned call of ``op``: ``(config, function, kernelParams)``
    over a private copy of its parameter buffer, the call's result, kept alive by the
    caller so that the addresses in the copies stay the call's)."""
    from kaio.runtime.launcher import argument_values

    launches = []

    def capture(config, function, params, extra):
        _handle, pointers = argument_values(function, params)
        base, end = min(pointers), max(pointers) + 128  # 128: the widest entry (a map)
        copy = (ctypes.c_uint8 * (end - base))()
        ctypes.memmove(copy, base, end - base)
        at = ctypes.addressof(copy)
        array = (ctypes.c_void_p * len(pointers))(*(at + p - base for p in pointers))
        launches.append((config, function, ctypes.byref(array), copy, array))
        return real(config, function, params, extra)

    functions = _generated_functions(op)
    real = functions[0].__globals__["launch_kernel"]
    with Swapped(op, capture):
        result = op(*args)
    return [(c, f, p) for c, f, p, *_ in launches], (result, launches)


def _allocations_a_call(op, args: tuple, calls: int = 10) -> float:
    """How many outputs a call of ``op`` allocates (``A<j>()`` or ``EMPTY_LIKE``, counted
    in its generated functions), over ``calls`` calls whose results are dropped: 0 where
    its plan hands the dropped outputs out again."""
    count = [0]
    saved = []
    for f in _generated_functions(op):
        env = f.__globals__
        for name in [n for n in env if re.fullmatch(r"A\d+|EMPTY_LIKE", n)]:
            saved.append((env, name, env[name]))

            def counted(*a, real=env[name], **k):
                count[0] += 1
                return real(*a, **k)

            env[name] = counted
    try:
        for _ in range(calls):
            op(*args)
    finally:
        for env, name, real in saved:
            env[name] = real
    return count[0] / calls


def _context_rows(bench, driver, tensors: tuple) -> None:
    """What torch's accessors cost between launches, as a plan's call makes them: the raw
    launch ``driver`` followed by 4 ``data_ptr()`` calls, 4 ``_use_count()`` calls, one
    ``TensorGuards`` check of the tensors, ``torch.is_inference_mode_enabled()``, or 4
    calls of a Python builtin (``len``)."""
    import torch

    from kaio_ops._plan import tensor_check

    x = tensors[0]
    check = tensor_check(list(tensors))
    inference = torch.is_inference_mode_enabled

    def data_ptrs():
        driver()
        x.data_ptr(), x.data_ptr(), x.data_ptr(), x.data_ptr()

    def use_counts():
        driver()
        x._use_count(), x._use_count(), x._use_count(), x._use_count()

    def guards():
        driver()
        check(*tensors)

    def mode():
        driver()
        inference()

    def builtins():
        driver()
        len(tensors), len(tensors), len(tensors), len(tensors)

    for label, row in (("4 x.data_ptr()", data_ptrs), ("4 x._use_count()", use_counts),
                       (f"TensorGuards of {len(tensors)}", guards),
                       ("is_inference_mode_enabled()", mode), ("4 len()", builtins)):  # fmt: skip
        bench.row(f"context: the launch + {label}", row)


def split_rows(out: dict) -> None:
    """Where a planned op call's host time goes, behind the GPU spinner in interleaved
    rounds (``launch_overhead.Bench``): the whole call; the same call with its driver calls
    swapped for a native call of a C function that does nothing (``fegetround``: the
    call's Python side); and the call's own launches alone, through the same native
    ``cuLaunchKernelEx`` with copies of the parameter buffers one planned call filled (the
    driver's side). Each op's result is first compared with torch's."""
    import torch

    from bench.launch_overhead import OP_BATCH, OP_SPIN_MS, SPIN_MS, Bench, _check_pair, op_pairs
    from kaio.runtime import launcher, native

    nothing = native_no_op()
    if nothing is None:
        print(f"  split: no native no-op ({native.status()})")
        return
    launch = launcher.raw_launch_kernel()
    bench = Bench(OP_BATCH, OP_SPIN_MS * SPIN_MS)
    names = set(SPLIT_OPS)
    keep = []
    for label, op, args, _spelled, torch_call in op_pairs():
        if op.__name__ not in names:
            continue
        _check_pair(torch, label, op, args, torch_call)
        op(*args), op(*args)  # the fast path armed
        made = _allocations_a_call(op, args)
        out.setdefault("allocations_a_call", {})[op.__name__] = made
        print(f"  {op.__name__}: {made:.2f} outputs allocated a call (not handed out again)")
        launches, kept = _captured_launches(op, args)
        keep.append(kept)

        def driver(launches=launches):
            for config, function, params in launches:
                launch(config, function, params, None)

        bench.row(f"{op.__name__}: whole call", lambda op=op, args=args: op(*args))
        bench.row(
            f"{op.__name__}: Python side (no-op driver call)",
            lambda op=op, args=args: op(*args),
            around=Swapped(op, nothing),
        )
        bench.row(f"{op.__name__}: its {len(launches)} launch(es) alone, raw native", driver)
        if op.__name__ == "rms_norm":
            _context_rows(bench, driver, args)
    rows = bench.run()
    out["split"] = rows
    out["split_late"] = bench.late
    print(f"  {'op':<28} {'whole':>8} {'python':>8} {'driver':>8} {'sum':>8}  (host us a call)")
    for name in SPLIT_OPS:
        found = [v["host_us"] for k, v in rows.items() if k.startswith(name + ":")]
        if len(found) == 3:
            whole, python, driver = found
            print(f"  {name:<28} {whole:8.2f} {python:8.2f} {driver:8.2f} {python + driver:8.2f}")
    print(f"  batches that outlasted the spinner: {bench.late}")
    del keep


SPLIT_OPS = ("rms_norm", "rms_norm_residual", "flash_attention_decode", "matmul_fp8", "add")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON to this file")
    groups = {
        "accessors": accessor_rows,
        "ffi": ffi_rows,
        "python": python_rows,
        "ops": op_parts,
        "plans": plan_rows,
        "dispatch": dispatch_rows,
        "gemv": gemv_rows,
        "split": split_rows,
    }
    parser.add_argument(
        "--only", choices=sorted(groups), action="append", help="run only these groups"
    )
    parser.add_argument("--batches", type=int, help="batches a row of the spinner's groups")
    parser.add_argument("--spin-ms", type=float, help="GPU spin a batch (the spinner's groups)")
    args = parser.parse_args()
    import bench.launch_overhead as overhead

    overhead.BATCHES = args.batches or overhead.BATCHES
    overhead.SPIN_MS = args.spin_ms or overhead.SPIN_MS
    dev = kaio.device()
    print(f"{dev.name} ({dev.arch})")
    out: dict = {"device": dev.name}
    for name in args.only or groups:
        group = groups[name]
        try:
            group(out)
        except Exception as e:  # one failing group must not lose the others
            print(f"  {group.__name__} failed: {type(e).__name__}: {e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
