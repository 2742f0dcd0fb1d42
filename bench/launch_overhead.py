"""Host time per launch of a 4-argument kernel (x, y, out, n: out = x + y), side by side:

- kaio ``add[grid, 256](x, y, out, n)`` with DeviceArray arguments, with a pre-bound
  ``launch = add[grid, 256]``, and with torch tensor arguments;
- raw cuda.bindings ``cuLaunchKernel`` on the same CUfunction (kernelParams as (values, types));
- Triton's launcher on an equivalent trivial kernel;
- the first launch in a new process, with an empty and with a warm disk cache.

Host time is measured in batches of launches (the GPU drained between batches, not timed) and
reported as the median microseconds per launch. Usage:
``python bench/launch_overhead.py --out results.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
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

N = 4096
BATCH = 500
BATCHES = 40


@kaio.gpu_kernel(block_size=256)
def add(x: f32[:], y: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[i] + y[i]


def use_hand_ptx() -> str:
    """Run the hand-written PTX unless the PTX emitter is available; returns which."""
    try:
        from kaio.ptx import emit  # noqa: F401

        return "emitted"
    except ImportError:
        add.specialize({}, ("C", "C", "C")).ptx_by_arch[kaio.device().arch] = ADD_PTX
        return "hand-written"


class Results(dict):
    """The results, each printed as a table row as soon as it is measured."""

    def __setitem__(self, name: str, value: float) -> None:
        unit = "ms" if name.endswith("(ms)") else "us/launch"
        print(f"  {name:<58} {value:8.2f} {unit}", flush=True)
        super().__setitem__(name, value)


def per_launch_us(launch_batch, sync) -> float:
    """Median host microseconds per launch over BATCHES batches of BATCH launches."""
    launch_batch()  # warm up
    sync()
    samples = []
    for _ in range(BATCHES):
        t0 = time.perf_counter()
        launch_batch()
        samples.append((time.perf_counter() - t0) / BATCH * 1e6)
        sync()
    return statistics.median(samples)


def bench_kaio(results: dict) -> None:
    x = kaio.to_device(np.random.default_rng(0).standard_normal(N).astype(np.float32))
    y = kaio.to_device(np.random.default_rng(1).standard_normal(N).astype(np.float32))
    out = kaio.empty((N,), f32)
    grid = N // 256

    def subscripted():
        for _ in range(BATCH):
            add[grid, 256](x, y, out, N)

    launch = add[grid, 256]

    def prebound():
        for _ in range(BATCH):
            launch(x, y, out, N)

    results["kaio add[grid, block](DeviceArray x3, n)"] = per_launch_us(
        subscripted, kaio.synchronize
    )
    results["kaio pre-bound launch(DeviceArray x3, n)"] = per_launch_us(prebound, kaio.synchronize)
    assert np.array_equal(out.numpy(), x.numpy() + y.numpy())

    from cuda.bindings import driver as cu

    from kaio.runtime.module import load

    dev = kaio.device()
    func = load(add.specialize({}, ("C", "C", "C")), dev, dev.arch).function
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    types = (ptr, i64, ptr, i64, ptr, i64, ctypes.c_uint32)

    def raw():
        for _ in range(BATCH):
            params = ((x.ptr, N, y.ptr, N, out.ptr, N, N), types)
            cu.cuLaunchKernel(func, grid, 1, 1, 256, 1, 1, 0, 0, params, 0)

    results["raw cuda.bindings cuLaunchKernel"] = per_launch_us(raw, kaio.synchronize)


def bench_torch_and_triton(results: dict) -> None:
    try:
        import torch
    except ImportError:
        return
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    out = torch.empty(N, device="cuda")
    grid = N // 256

    def kaio_torch():
        for _ in range(BATCH):
            add[grid, 256](x, y, out, N)

    results["kaio add[grid, block](torch x3, n)"] = per_launch_us(kaio_torch, kaio.synchronize)
    torch.testing.assert_close(out, x + y)
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

    def triton_batch():
        for _ in range(BATCH):
            triton_add[(grid,)](x, y, out, N, BLOCK=256)

    results["triton add[grid](torch x3, n)"] = per_launch_us(triton_batch, torch.cuda.synchronize)
    torch.testing.assert_close(out, x + y)


def cold_child() -> None:
    """In a fresh process: time import, then the first launch (compile, link or cache load)."""
    t0 = time.perf_counter()
    source = use_hand_ptx()
    x = kaio.zeros((N,), f32)
    t1 = time.perf_counter()
    add[N // 256](x, x, x, N)
    kaio.synchronize()
    t2 = time.perf_counter()
    print(
        json.dumps({"setup_ms": (t1 - t0) * 1e3, "first_launch_ms": (t2 - t1) * 1e3, "ptx": source})
    )


def bench_cold(results: dict) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "KAIO_CACHE_DIR": cache}
        for label in ("empty cache", "warm disk cache"):
            out = subprocess.run(
                [sys.executable, __file__, "--cold-child"], env=env, capture_output=True, text=True
            )
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
            child = json.loads(out.stdout.strip().splitlines()[-1])
            results[f"first launch in a new process, {label} (ms)"] = child["first_launch_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_child:
        cold_child()
        return
    ptx = use_hand_ptx()
    dev = kaio.device()
    print(f"{dev.name} ({dev.arch}), kernel PTX: {ptx}, {BATCHES} batches of {BATCH} launches")
    results, errors = Results(), {}
    for group in (bench_kaio, bench_torch_and_triton, bench_cold):
        try:
            group(results)
        except Exception as e:  # one failing peer must not lose the other rows
            errors[group.__name__] = f"{type(e).__name__}: {e}"
            print(f"  {group.__name__} failed: {errors[group.__name__]}", flush=True)
    if args.out:
        report = {"device": dev.name, "arch": dev.arch, "ptx": ptx, "results": results}
        with open(args.out, "w") as f:
            json.dump({**report, "errors": errors}, f, indent=2)


if __name__ == "__main__":
    main()
