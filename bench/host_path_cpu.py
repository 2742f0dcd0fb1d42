"""The Python side of an op call, measured on the CPU against a fake driver: microseconds per
``kaio_ops`` call at decode sizes with call plans (the op as shipped) and without (the op's
own body, ``op.__wrapped__``, through the kernel launchers), everything up to the driver call
(``cuLaunchKernelEx`` replaced by a function that returns 0). Arrays are fake
``kaio.DeviceArray``s (made-up addresses; outputs too). The ``torch`` column replays the same
plans for CPU torch tensors standing in for CUDA ones, as a loop of calls takes them: the
wrapper's key of torch's own accessors for the first calls, then the fast path (one
``tensor_check``); dropped outputs handed out again (``cuda_stand_ins``: torch's CUDA
queries answered as on a GPU), new ones made by ``torch.empty`` on the CPU. The fake GPU is
an sm_90 and takes an H100's routes (``LeanFakeGPU``).
Times are thread CPU time (``time.thread_time``), which a busy shared machine disturbs less
than wall time; bench/launch_overhead.py measures the whole call on a GPU.

    PYTHONPATH=$PWD python3 bench/host_path_cpu.py
"""

from __future__ import annotations

import functools
import importlib
import statistics
import time

import pytest

import kaio_ops
from kaio import e4m3, f16, f32, i32, u32
from kaio_ops import _arrays, _plan
from tests.test_plans import FakeGPU


def cases(g: FakeGPU) -> list:
    """(label, op, arguments) at decode sizes."""
    h = 4096
    return [
        ("rms_norm [1, 4096] f16", kaio_ops.rms_norm, (g.array((1, h), f16), g.array((h,), f16))),
        ("rms_norm_residual [1, 4096] f16", kaio_ops.rms_norm_residual,
         (g.array((1, h), f16), g.array((1, h), f16), g.array((h,), f16))),
        ("silu_gate [1, 14336] f16", kaio_ops.silu_gate,
         (g.array((1, 14336), f16), g.array((1, 14336), f16))),
        ("add [1, 4096] f16", kaio_ops.add, (g.array((1, h), f16), g.array((1, h), f16))),
        ("gelu [1, 4096] f16", kaio_ops.gelu, (g.array((1, h), f16),)),
        ("softmax [32, 512] f32", kaio_ops.softmax, (g.array((32, 512), f32),)),
        ("layer_norm [1, 4096] f16", kaio_ops.layer_norm,
         (g.array((1, h), f16), g.array((h,), f16), g.array((h,), f16))),
        ("rope [1, 32, 128] f16", kaio_ops.rope,
         (g.array((1, 32, 128), f16), g.array((1, 64), f16), g.array((1, 64), f16))),
        ("matmul_tc [1, 4096] x [4096, 4096]", kaio_ops.matmul_tc,
         (g.array((1, h), f16), g.array((h, h), f16))),
        ("matmul_int4 [1, 4096] x [4096, 4096]", kaio_ops.matmul_int4,
         (g.array((1, h), f16), g.array((h // 8, h), u32), g.array((h // 128, h), f16))),
        ("flash_attention q [1, 32, 1, 128], kv 512", kaio_ops.flash_attention,
         (g.array((1, 32, 1, 128), f16), g.array((1, 32, 512, 128), f16),
          g.array((1, 32, 512, 128), f16))),
        ("linear [1, 4096] x [4096, 4096]^T f16", kaio_ops.linear,
         (g.array((1, h), f16), g.array((h, h), f16))),
        ("matmul [1, 4096] x [4096, 4096] f16", kaio_ops.matmul,
         (g.array((1, h), f16), g.array((h, h), f16))),
        ("flash_attention_decode q [1, 32, 1, 128], 4k cache", kaio_ops.flash_attention_decode,
         (g.array((1, 32, 1, 128), f16), g.array((1, 8, 4096, 128), f16),
          g.array((1, 8, 4096, 128), f16), g.array((1,), i32))),
        ("matmul_fp8 [1, 4096] x [4096, 4096] e4m3", kaio_ops.matmul_fp8,
         (g.array((1, h), e4m3), g.array((h, h), e4m3).T, g.array((1,), f32),
          g.array((1,), f32))),
        ("kv_cache_append k [1, 8, 1, 128], 4k cache", kaio_ops.kv_cache_append,
         (g.array((1, 8, 4096, 128), f16), g.array((1, 8, 4096, 128), f16),
          g.array((1, 8, 1, 128), f16), g.array((1, 8, 1, 128), f16), g.array((1,), i32))),
    ]  # fmt: skip


def per_call_us(fn, args, calls: int = 2000, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls, in microseconds."""
    fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(calls):
            fn(*args)
        times.append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(times)


class LeanFakeGPU(FakeGPU):
    """The test's fake GPU with a launch that does nothing and outputs made once per shape
    and dtype, so the figures are the call path's own. It is an sm_90 and takes the routes
    an H100 takes at these sizes (decode's clusters: one launch; matmul_fp8's wgmma, its
    tensor maps encoded by a stand-in; a column-major b as torch passes it)."""

    def __init__(self, monkeypatch):
        super().__init__(monkeypatch)
        self.outputs: dict = {}
        # the GPU an op asks for its arch (attention's Hopper dispatch): the fake one
        monkeypatch.setattr(_arrays, "gpu", lambda like: self.device(like.device))
        decode = importlib.import_module("kaio_ops.decode")
        monkeypatch.setattr(decode, "_hopper", lambda like: True)
        monkeypatch.setattr(decode, "CLUSTER_CHECK", False)
        monkeypatch.setattr(importlib.import_module("kaio_ops.fp8"), "_k_major", _k_major)
        tensormap = importlib.import_module("kaio.tensormap")
        monkeypatch.setattr(tensormap, "_encode", lambda tm, address=None: bytes(128))

    def device(self, ordinal: int):
        dev = super().device(ordinal)  # (the tests' fake GPU, with what sm_90 ops ask)
        dev.compute_capability, dev.multiprocessor_count = (9, 0), 132
        return dev

    def launch(self, config, func, params, extra):
        return 0

    def new_array(self, kind, device, like_obj, shape, dtype):
        # four arrays a shape and dtype, taken in turn: the outputs of one call
        # (rms_norm_residual's two) are distinct
        made = self.outputs.setdefault((device, shape, dtype), [])
        if len(made) < 4:
            made.insert(0, self.array(shape, dtype, device))
        made.append(made.pop(0))
        return made[-1]


def _k_major(b):
    """``kaio_ops.fp8._k_major`` for a fake array: a column-major one as its transpose."""
    if not b.is_contiguous and b.T.is_contiguous:
        return b.T, True
    return b, False


def cuda_stand_ins(monkeypatch) -> None:
    """What a plan asks torch's CUDA side, answered as on a GPU with nothing captured, GPU 0
    current and a caching allocator that hands out one address: the torch column's plans
    then hand dropped outputs out again and own their workspaces, as on a GPU."""
    try:
        import torch
    except ImportError:
        return
    for name, stand_in in (
        ("_cuda_isCurrentStreamCapturing", lambda: False),
        ("_cuda_getDevice", lambda: 0),
        ("_cuda_cudaCachingAllocator_raw_alloc", lambda size, stream: 0x7000_0000),
        ("_cuda_cudaCachingAllocator_raw_delete", lambda address: None),
    ):
        monkeypatch.setattr(torch._C, name, stand_in, raising=False)


def torch_twin(op, arrays: tuple) -> tuple | None:
    """CPU torch tensors like the fake ``arrays``, and the op's plan for ``arrays`` stored
    again under the key the op makes for them, its outputs made by ``torch.empty`` on the
    CPU; None without torch or a plan."""
    try:
        import torch
    except ImportError:
        return None
    plans = _plan.plans_of(op)
    replay = next(iter(plans.values()), None)
    if replay is None:
        return None
    tensors = tuple(torch.empty(a.shape, dtype=_arrays.torch_dtype(a.kaio_dtype)) for a in arrays)
    if _plan._UNBOUND:  # the wrappers take torch's types from the first tensor they see
        _plan._bind_torch()
    env, keys = op.__globals__, []  # the wrapper's namespace: its misses give the key
    slow, env["slow"] = env["slow"], lambda key, args, pointers: keys.append(key)
    try:
        op(*tensors)
    finally:
        env["slow"] = slow
    made = replay.__globals__
    allocations = []
    while f"A{len(allocations)}" in made:
        _kind, device, _like, shape, dtype = made[f"A{len(allocations)}"].args
        output = torch.empty(shape, dtype=_arrays.torch_dtype(dtype))  # the recorded call's
        allocations.append((output, "torch", device, None, shape, dtype))
    returned = replay.source.strip().splitlines()[-1].split("return ", 1)[1]
    inputs = replay.__code__.co_argcount // 2  # (addresses, arrays) of every array parameter
    twin = _plan._replay(replay.plan, inputs, allocations, returned)
    for j, (*_, shape, dtype) in enumerate(allocations):
        twin.__globals__[f"A{j}"] = functools.partial(
            torch.empty, *shape, dtype=_arrays.torch_dtype(dtype), device=torch.device("cpu")
        )
    plans[keys[0]] = twin
    return tensors


def main() -> None:
    with pytest.MonkeyPatch.context() as mp:
        g = LeanFakeGPU(mp)
        cuda_stand_ins(mp)
        print(
            f"{'op (fake driver, CPU)':<44} {'unplanned':>10} {'planned':>9} {'torch':>7}  us/call"
        )
        for label, op, args in cases(g):
            g.calls = []
            before = per_call_us(op.__wrapped__, args)
            after = per_call_us(op, args)
            g.calls = []
            plans = list(_plan.plans_of(op).values())
            note = "" if plans and None not in plans else "  (unplanned)"
            tensors = torch_twin(op, args) if not note else None
            with_torch = f"{per_call_us(op, tensors):7.2f}" if tensors else f"{'-':>7}"
            print(f"{label:<44} {before:10.2f} {after:9.2f} {with_torch}{note}", flush=True)


if __name__ == "__main__":
    main()
