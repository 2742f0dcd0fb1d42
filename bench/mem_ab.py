"""A/B of the memory-bound kernels in one process: python bench/mem_ab.py [--only silu|rms]
[--out results.json].

silu: API.md's one-element-a-thread kernel at several block sizes, with ``fastmath=True``,
``examples/quickstart.py``'s four-elements-a-thread kernel, and Triton. rms: ``kaio_ops.rows``
variants (the module's text with a constant replaced, imported from a temporary file) against
the shipped module and Triton, on rows that do not start or end on a 16-byte boundary: rows
one element past an allocation and rows of an odd length.
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

SILU_BLOCKS = (128, 512)  # API.md's kernel at other block sizes than its 256


@kaio.gpu_kernel(block_size=256)
def silu_nc(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    """API.md's kernel with both loads through the read-only data path (ld.global.nc)."""
    idx = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if idx < n:
        xv = kaio.local(f32, (1,))
        gv = kaio.local(f32, (1,))
        kaio.load_vector(xv, x, idx, 0, "nc")
        kaio.load_vector(gv, gate, idx, 0, "nc")
        sig = 1.0 / (1.0 + kaio.exp(-xv[0]))
        out[idx] = xv[0] * sig * gv[0]


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


def silu_cases(h: Harness) -> None:
    impls = {"kaio": _launch(fused_silu_gate)}
    for block in SILU_BLOCKS:
        impls[f"kaio block {block}"] = _launch(kaio.gpu_kernel(block_size=block)(
            fused_silu_gate.pyfunc))  # fmt: skip
    impls["kaio fastmath"] = _launch(kaio.gpu_kernel(block_size=256, fastmath=True)(
        fused_silu_gate.pyfunc))  # fmt: skip
    impls["kaio nc"] = _launch(silu_nc)
    impls["kaio x4"] = _launch(fused_silu_gate_x4, 4)
    impls["triton"] = _triton
    h.case(
        "silu_gate user kernel",
        f"f32 [{N}]",
        lambda: (torch.randn(N, device="cuda"), torch.randn(N, device="cuda")),
        impls,
        reference=lambda x, g: torch.nn.functional.silu(x.double()) * g.double(),
        tol=1e-6,
        nbytes=3 * N * 4,
        baseline="kaio",
    )


# rows.py variants: name -> {text in rows.py: its replacement}. "EDGES G4": with EDGES the
# weights of 4 chunks loaded before their stores; "scalar": the rms norms without EDGES (VEC
# 1 on such rows), SCALAR_WEIGHTS_GROUP chunks' weights before their stores (1: main's order)
SCALAR = {'EDGE_OPS = ("rms_norm", "rms_norm_residual")': "EDGE_OPS = ()"}
ROWS_VARIANTS = {
    "EDGES G4": {"EDGE_WEIGHTS_GROUP = 1": "EDGE_WEIGHTS_GROUP = 4"},
    **{
        f"scalar G{g}": {**SCALAR, "SCALAR_WEIGHTS_GROUP = 8": f"SCALAR_WEIGHTS_GROUP = {g}"}
        for g in (1, 8)
    },
}


def _rows_variant(where: str, name: str, replacements: dict):
    """kaio_ops.rows with ``replacements`` made in its text, imported from a file in
    ``where``."""
    src = inspect.getsource(rows)
    for old, new in replacements.items():
        assert old in src, old
        src = src.replace(old, new)
    tag = "".join(ch if ch.isalnum() else "_" for ch in name)
    path = os.path.join(where, f"rows_{tag}.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(f"rows_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# (name, dtype, shape, offset): x and the residual start ``offset`` elements past an
# allocation (offset 1: not 16-byte aligned); an odd row length takes VEC 1 as well
RMS_SHAPES = (
    ("f32 offset", torch.float32, (16384, 4096), 1),
    ("f16 offset", torch.float16, (32768, 4096), 1),
    ("f32 odd", torch.float32, (16384, 4095), 0),
    ("f16 odd", torch.float16, (32768, 4095), 0),
)


def rms_cases(h: Harness, where: str) -> None:
    mods = {"kaio": rows}
    mods.update({k: _rows_variant(where, k, v) for k, v in ROWS_VARIANTS.items()})
    for name, dt, shape, offset in RMS_SHAPES:
        n = shape[0] * shape[1]
        size = torch.tensor([], dtype=dt).element_size()

        def inputs(shape=shape, dt=dt, offset=offset):
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
            baseline="triton",
        )
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
            baseline="triton",
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
