"""A/B of the memory-bound kernels against main, in one process (issue 9 and the silu*gate
user kernel): python bench/mem_ab.py [--only silu|rms] [--out results.json].

silu: API.md's one-element-a-thread kernel compiled without and with the IR pass
``loads_before_slow_paths``, with ``fastmath=True``, ``examples/quickstart.py``'s
four-elements-a-thread kernel, and Triton. rms: ``kaio_ops.rows`` as it is against main's
(the module's text with main's tables, imported from a temporary file) and Triton, on
16-byte aligned rows and on rows one element past an allocation (the scalar path).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
from bench.fastmath import N, _tri_silu_gate  # noqa: E402
from bench.harness import Harness  # noqa: E402
from bench.memory_ops import TOL, _randn, torch_rms, tri_rows  # noqa: E402
from examples.quickstart import fused_silu_gate, fused_silu_gate_x4  # noqa: E402
from kaio import f32, u32  # noqa: E402
from kaio_ops import rows  # noqa: E402


def silu_unhoisted(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    """API.md's kernel under another name (its own cache key), compiled without
    ``loads_before_slow_paths``: the compiler before it."""
    idx = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if idx < n:
        xi = x[idx]
        sig = 1.0 / (1.0 + kaio.exp(-xi))
        out[idx] = xi * sig * gate[idx]


def _kernel(fn, block, fastmath):
    return kaio.gpu_kernel(block_size=block, fastmath=fastmath)(fn)


def _launch(kernel, per_thread=1):
    block = kernel.block_size

    def run(x, g):
        out = torch.empty_like(x)
        kernel[(-(-N // (block * per_thread)),)](x, g, out, N)
        return out

    return run


def _triton(x, g):
    out = torch.empty_like(x)
    _tri_silu_gate[(-(-N // 1024),)](x, g, out, N, BLOCK=1024)
    return out


def _without_load_pass(kernel):
    """``kernel``, compiled now (a launch on a small input) with the IR pass
    ``loads_before_slow_paths`` turned off."""
    from kaio.ir import passes

    keep = passes.loads_before_slow_paths
    passes.loads_before_slow_paths = lambda fn: None
    try:
        x = torch.randn(256, device="cuda")
        kernel[(1,)](x, x, torch.empty_like(x), 256)
        torch.cuda.synchronize()
    finally:
        passes.loads_before_slow_paths = keep
    return kernel


def silu_cases(h: Harness) -> None:
    fast = kaio.gpu_kernel(block_size=256, fastmath=True)(fused_silu_gate.pyfunc)
    before = _without_load_pass(_kernel(silu_unhoisted, 256, False))
    impls = {
        "kaio before": _launch(before),
        "kaio": _launch(fused_silu_gate),
        "kaio fastmath": _launch(fast),
        "kaio x4": _launch(fused_silu_gate_x4, 4),
        "triton": _triton,
    }
    h.case(
        "silu_gate user kernel",
        f"f32 [{N}]",
        lambda: (torch.randn(N, device="cuda"), torch.randn(N, device="cuda")),
        impls,
        reference=lambda x, g: torch.nn.functional.silu(x.double()) * g.double(),
        tol=1e-6,
        nbytes=3 * N * 4,
        baseline="kaio before",
    )


# rows.py's tables as they are here: main's (e1bfc42) in the variant (the same PTX as main's)
MAIN_TABLES = {
    'LOADS_FIRST = ("softmax", "rms_norm", "rms_norm_residual")': (
        'LOADS_FIRST = ("softmax", "rms_norm")'
    ),
    'WEIGHTS_FIRST = ("rms_norm", "rms_norm_residual")': "WEIGHTS_FIRST = ()",
}


def _rows_as_on_main(where: str):
    """kaio_ops.rows with main's tables, imported from a file in ``where``."""
    src = inspect.getsource(rows)
    for old, new in MAIN_TABLES.items():
        assert old in src, old
        src = src.replace(old, new)
    path = os.path.join(where, "rows_main.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location("rows_main", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rms_cases(h: Harness, where: str) -> None:
    mods = {"kaio": rows, "main": _rows_as_on_main(where)}
    for name, dt, shape, offset in (
        ("f32 offset", torch.float32, (16384, 4096), 1),
        ("f16 offset", torch.float16, (32768, 4096), 1),
        ("f32", torch.float32, (16384, 4096), 0),
        ("f16", torch.float16, (32768, 4096), 0),
        ("bf16", torch.bfloat16, (32768, 4096), 0),
    ):
        n = shape[0] * shape[1]
        size = torch.tensor([], dtype=dt).element_size()

        def inputs(shape=shape, dt=dt, offset=offset):
            """x and the residual start ``offset`` elements past an allocation (offset 1:
            not 16-byte aligned, the scalar path)."""
            x, r = (_randn(shape[0] * shape[1] + offset, dt)[offset:].view(shape) for _ in range(2))
            return x, r, _randn(shape[-1:], dt)

        def residual(x, r, dt=dt):
            return (x.float() + r.float()).to(dt)

        res = {k: (lambda x, r, w, m=m: m.rms_norm_residual(x, r, w)) for k, m in mods.items()}
        res["triton"] = lambda x, r, w: tri_rows("rms_norm_residual", x, r=r, w=w)
        h.case(
            "rms_norm_residual",
            f"{name} {list(shape)}",
            inputs,
            res,
            reference=lambda x, r, w: (
                torch_rms(residual(x, r).double(), w.double()),
                residual(x, r),
            ),
            nbytes=(4 * n + shape[1]) * size,
            tol=TOL[dt],
            baseline="main",
        )
        if dt is torch.bfloat16:
            continue
        plain = {k: (lambda x, r, w, m=m: m.rms_norm(x, w)) for k, m in mods.items()}
        plain["triton"] = lambda x, r, w: tri_rows("rms_norm", x, w=w)
        h.case(
            "rms_norm",
            f"{name} {list(shape)}",
            inputs,
            plain,
            reference=lambda x, r, w: torch_rms(x.double(), w.double()),
            nbytes=(2 * n + shape[1]) * size,
            tol=TOL[dt],
            baseline="main",
        )


def main() -> None:
    h = Harness.from_args("memory-bound A/B: silu*gate user kernel, rows variants")
    print(f"GPU: {h.meta['gpu']}; copy bandwidth {h.copy_bandwidth():.0f} GB/s", flush=True)
    if h.only in "silu_gate user kernel":
        silu_cases(h)
    with tempfile.TemporaryDirectory() as where:
        rms_cases(h, where)
    h.copy_bandwidth()
    h.finish()
    print(h.table())


if __name__ == "__main__":
    main()
