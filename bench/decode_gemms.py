"""Decode-size GEMMs, one launch against two: GPU time and host time per call.

For each op at M rows (default 1, 2, 4, 8, 16) of a K x N = 4096 x 4096 weight:

- ``matmul_tc`` (f16 in, f32 out) as routed (``linear``'s GEMM);
- ``matmul`` and ``linear`` (f16): the K split summed in the kernel (``linear.FIXUP_ROWS``
  16) against ``gemm_reduce`` (``FIXUP_ROWS`` 0);
- ``matmul_int8``: ``_int8_decode.gemv_int8`` (one launch, B read as it is; its K split
  aiming at 1, 2 or 4 blocks a multiprocessor) against the transposing path
  (``_int8_decode.MAX_M`` 0: B transposed, then the mma.sync kernel);
- ``matmul_fp8`` (e4m3, b column-major, per-tensor scales, bf16 out): ``_fp8_decode.gemv_fp8``
  (``MAX_M`` and ``SM90_MAX_M`` 16) with 2 or 4 columns a warp, and the wgmma kernel (as
  routed: ``MAX_M`` 0);
- cuBLAS beside: ``x @ w`` in f16 (``torch._scaled_mm`` for fp8, M padded to 16).

GPU time: CUDA events around 100 calls queued behind a spinner (back to back), median of 5,
with the weight L2-warm (``same``) and rotated over 4 copies (128 MB for f16, past the L2).
Host time: the mean of 200 calls with no synchronization, behind a spinner (pure host
cost), median of 9. Every path is checked against a float64 reference first.

    PYTHONPATH=$PWD python3 bench/decode_gemms.py [--ms 1 4 16] [--ops matmul_tc ...]
        [--out decode.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from contextlib import contextmanager

import torch

import kaio
import kaio_ops
from bench.launch_overhead import Spinner
from kaio_ops import _plan

K = N = 4096
ROT = 4


@contextmanager
def setting(*changes: tuple):
    """Each ``(module, name, value)`` of ``changes`` set for the block (plans dropped before
    and after)."""
    saved = []
    for module, name, value in changes:
        mod = importlib.import_module(module)
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)
    _plan.clear()
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)
        _plan.clear()


def nothing():
    """No setting changed."""
    return setting()


def gpu_us(spinner: Spinner, fn, args_list: list) -> float:
    """Median over 5 of the GPU time a call of 100 queued back to back."""
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    times = []
    for _ in range(5):
        spinner.start()
        start.record()
        for i in range(100):
            fn(*args_list[i % len(args_list)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 10)
    return statistics.median(times)


def host_us(spinner: Spinner, fn, args: tuple) -> float:
    """Median over 9 of the host time a call of 200 with no synchronization, behind the
    spinner."""
    fn(*args)
    times = []
    for _ in range(9):
        torch.cuda.synchronize()
        spinner.start()
        t0 = time.perf_counter()
        for _ in range(200):
            fn(*args)
        times.append((time.perf_counter() - t0) / 200 * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def cases(m: int) -> list:
    """(op name, [(path label, context manager factory, kaio call)], argument sets (ROT
    weights), float64 reference of set 0, cuBLAS call)."""
    from bench.fp8 import fp8_operands, scaled_mm

    f16 = torch.float16
    x = torch.randn(m, K, device="cuda", dtype=f16)
    ws = [torch.randn(K, N, device="cuda", dtype=f16) / 64 for _ in range(ROT)]
    wts = [w.t().contiguous() for w in ws]
    a8 = torch.randint(-128, 128, (m, K), device="cuda", dtype=torch.int8)
    b8s = [torch.randint(-128, 128, (K, N), device="cuda", dtype=torch.int8) for _ in range(ROT)]
    fp8 = [fp8_operands(m, N, K, rowwise=False) for _ in range(ROT)]
    fixup = ("kaio_ops.linear", "FIXUP_ROWS")
    int8 = "kaio_ops._int8_decode"
    fp8m = "kaio_ops._fp8_decode"
    out = [
        ("matmul_tc", [
            ("as routed", nothing, kaio_ops.matmul_tc),
        ], [(x, w) for w in ws], x.double() @ ws[0].double(), torch.matmul),
        ("matmul", [
            ("summed in the kernel", lambda: setting((*fixup, 16)), kaio_ops.matmul),
            ("+ gemm_reduce", lambda: setting((*fixup, 0)), kaio_ops.matmul),
        ], [(x, w) for w in ws], x.double() @ ws[0].double(), torch.matmul),
        ("linear", [
            ("summed in the kernel", lambda: setting((*fixup, 16)), kaio_ops.linear),
            ("+ gemm_reduce", lambda: setting((*fixup, 0)), kaio_ops.linear),
        ], [(x, w) for w in wts], x.double() @ ws[0].double(), torch.nn.functional.linear),
        ("matmul_int8", [
            (f"gemv_int8, {b} blocks/SM", lambda b=b: setting((int8, "BLOCKS_PER_SM", b)),
             kaio_ops.matmul_int8) for b in (1, 2, 4)
        ] + [
            ("transpose + mma.sync", lambda: setting((int8, "MAX_M", 0)), kaio_ops.matmul_int8),
        ], [(a8, b) for b in b8s], a8.double() @ b8s[0].double(),
         lambda a, b: x @ ws[0]),
    ]  # fmt: skip
    fp8_paths = [
        (f"gemv_fp8, {nc} columns a warp",
         lambda nc=nc: setting((fp8m, "MAX_M", 16), (fp8m, "SM90_MAX_M", 16),
                               (fp8m, "COLS_PER_WARP", nc)),
         kaio_ops.matmul_fp8) for nc in (2, 4)
    ] + [("wgmma", lambda: setting((fp8m, "MAX_M", 0)), kaio_ops.matmul_fp8)]  # fmt: skip
    a, b, sa, sb = fp8[0]
    ref = (a.double() @ b.double()) * sa.double() * sb.double()
    out.append(("matmul_fp8", fp8_paths, fp8, ref, scaled_mm))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    parser.add_argument("--ops", nargs="*", default=[])
    parser.add_argument("--out")
    args = parser.parse_args()
    dev = kaio.device()
    print(f"{dev.name} ({dev.arch}); K = N = {K}; GPU us a call (weight same / rotated over "
          f"{ROT}), host us a call behind a spinner")  # fmt: skip
    spinner = Spinner(5.0)
    rows = []
    for m in args.ms:
        for op, paths, arg_sets, ref, peer in cases(m):
            if args.ops and op not in args.ops:
                continue
            for label, context, fn in paths:
                try:
                    with context():
                        got = fn(*arg_sets[0]).double()
                        err = (torch.linalg.norm(got - ref) / torch.linalg.norm(ref)).item()
                        if not err < 1e-2:
                            raise AssertionError(f"relative error {err:.2e}")
                        row = {"op": op, "m": m, "path": label, "error": err,
                               "gpu_same_us": gpu_us(spinner, fn, arg_sets[:1]),
                               "gpu_rotated_us": gpu_us(spinner, fn, arg_sets),
                               "host_us": host_us(spinner, fn, arg_sets[0])}  # fmt: skip
                except Exception as e:  # one failing path must not lose the others
                    row = {"op": op, "m": m, "path": label, "failed": f"{type(e).__name__}: {e}"}
                rows.append(row)
                _print(row)
            row = {"op": op, "m": m, "path": "cuBLAS",
                   "gpu_same_us": gpu_us(spinner, peer, arg_sets[:1]),
                   "gpu_rotated_us": gpu_us(spinner, peer, arg_sets),
                   "host_us": host_us(spinner, peer, arg_sets[0])}  # fmt: skip
            rows.append(row)
            _print(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": dev.name, "rows": rows}, f, indent=2)


def _print(row: dict) -> None:
    head = f"  {row['op']:<12} M={row['m']:<3} {row['path']:<26}"
    if "failed" in row:
        print(f"{head} failed: {row['failed']}", flush=True)
        return
    print(f"{head} GPU {row['gpu_same_us']:7.2f} / {row['gpu_rotated_us']:7.2f}  host "
          f"{row['host_us']:6.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
