"""A/B of the memory-bound kernels in one process: python bench/mem_ab.py [--silu]
[--prewarm N] [--cases NAME ...] [--out results.json].

rows: ``kaio_ops.rows`` against variants of it (the module's text with constants replaced,
imported from a temporary file; ``ROWS_VARIANTS``, "main": as on main) and Triton, on rows
that do not start or end on a 16-byte boundary (``ROW_CASES``: x and the residual one or
three elements past an allocation, w and b aligned: SHIFT, VEC 1 on main; rows of 4095
elements: EDGES). --cases: only the row cases whose name contains one of these (is one:
"=NAME"). --silu: also
API.md's one-element-a-thread silu*gate kernel at other block sizes, with
``fastmath=True`` and with ld.global.nc loads, ``examples/quickstart.py``'s
four-elements-a-thread kernel, and Triton.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

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


# rows.py variants: name -> {text in rows.py: its replacement}. "main": as on main (rows
# whose x starts off a 16-byte boundary on the scalar path, VEC 1; with EDGES, the edge
# elements' w and b loaded after the output pass, no PACKED, layer_norm and softmax
# strided); "strided": 16-bit layer_norm and softmax with a thread's chunks a block apart
_EDGES_LATE = {
    '        if OP != "softmax" and inside:  # its w and b with x (see SHIFT_OPS)\n': (
        '        if SHIFT > 0 and inside and OP != "softmax":\n'
    ),
    "            out[at] = DT((ex - mean) * scale * ew + eb)\n": (
        "            if SHIFT > 0:\n"
        "                out[at] = DT((ex - mean) * scale * ew + eb)\n"
        "            else:\n"
        "                out[at] = DT((ex - mean) * scale * f32(w[col]) + f32(b[col]))\n"
    ),
    "            out[at] = DT(ex * scale * ew)\n": (
        "            if SHIFT > 0:\n"
        "                out[at] = DT(ex * scale * ew)\n"
        "            else:\n"
        "                out[at] = DT(ex * scale * f32(w[col]))\n"
    ),
}
# 16-bit layer_norm and softmax rows of f32 registers with a thread's chunks a block apart
# at every shift (WARP_CHUNK_SHIFTS)
STRIDED = {
    '"layer_norm": range(3, 8),\n    "softmax": range(4, 8),': (
        '"layer_norm": (),\n    "softmax": (),'
    )
}
ROWS_VARIANTS = {
    "main": {
        "SHIFT_OPS = OPS": "SHIFT_OPS = ()",
        "packed = threads == MAX_BLOCK and": "packed = False and",
        **_EDGES_LATE,
        **STRIDED,
    },
    "strided": STRIDED,
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


# (ops, name, dtype, shape, offset, variants): x and the residual start ``offset`` elements
# past an allocation (offset 1: not 16-byte aligned); rows of an odd length start on one
RMS = ("rms_norm", "rms_norm_residual")
NORM_SOFTMAX = ("layer_norm", "softmax")
WEIGHTED = RMS + ("layer_norm",)  # the ops with w (softmax: no edge weights; past 16384
# elements on sm_90 a cluster of blocks)
F16, F32 = torch.float16, torch.float32
ALL = RMS + NORM_SOFTMAX
PACKED = ("rms_norm", "layer_norm", "softmax")  # rows.PACKED_OPS
ROW_CASES = (
    (RMS, "f16 +1", F16, (32768, 4096), 1, ("main",)),
    (NORM_SOFTMAX, "f16 +1", F16, (32768, 4096), 1, ("main",)),
    (RMS, "bf16 +1", torch.bfloat16, (32768, 4096), 1, ("main",)),
    (NORM_SOFTMAX, "bf16 +1", torch.bfloat16, (32768, 4096), 1, ("main",)),
    (RMS, "f32 +1", F32, (16384, 4096), 1, ("main",)),
    (NORM_SOFTMAX, "f32 +1", F32, (16384, 4096), 1, ("main",)),
    (RMS, "f16 +3", F16, (32768, 4096), 3, ()),
    *((NORM_SOFTMAX, f"f16 +{k}", F16, (32768, 4096), k, ("strided",)) for k in range(2, 8)),
    *(
        (NORM_SOFTMAX, f"bf16 +{k}", torch.bfloat16, (32768, 4096), k, ("strided",))
        for k in (3, 5, 7)
    ),
    # 512 threads a row
    (ALL, "f16 +1", F16, (8192, 16384), 1, ("main",)),
    (PACKED, "bf16 +1", torch.bfloat16, (8192, 16384), 1, ("main",)),
    (PACKED, "f16 +7", F16, (8192, 16384), 7, ("main",)),
    (ALL, "f16 aligned", F16, (8192, 16384), 0, ("main",)),
    (PACKED, "bf16 aligned", torch.bfloat16, (8192, 16384), 0, ("main",)),
    (PACKED, "bf16 +0", torch.bfloat16, (8192, 16383), 0, ("main",)),
    (ALL, "f32 +1", F32, (4096, 16384), 1, ("main",)),
    (ALL, "f32 aligned", F32, (4096, 16384), 0, ("main",)),
    (PACKED, "f16 +0", F16, (8192, 16383), 0, ("main",)),
    (PACKED, "f16 +1", F16, (8192, 16383), 1, ("main",)),
    (PACKED, "bf16 +1", torch.bfloat16, (8192, 16383), 1, ("main",)),
    (WEIGHTED, "f16 +1", F16, (4096, 32768), 1, ("main",)),
    # EDGES
    (WEIGHTED, "f16", F16, (32768, 4095), 0, ("main",)),
    (WEIGHTED, "f32", F32, (16384, 4095), 0, ("main",)),
)


def _case_name(case) -> str:
    return f"{case[1]} {list(case[3])}"


def _matches(pattern: str, name: str) -> bool:
    return pattern[1:] == name if pattern.startswith("=") else pattern in name


def selected(patterns) -> list:
    """Indices of the ROW_CASES whose name (dtype, offset, shape) contains one of
    ``patterns`` (is one, where it starts with "="; all without)."""
    return [
        i
        for i, c in enumerate(ROW_CASES)
        if not patterns or any(_matches(p, _case_name(c)) for p in patterns)
    ]


def _residual(x, r):
    return (x.float() + r.float()).to(x.dtype)


# op: (call on a rows module, Triton, float64 reference, elements moved in units of (a
# row's elements n_row, all elements n)); each fn(x, r, w, b)
ROW_OPS = {
    "rms_norm": (
        lambda m, x, r, w, b: m.rms_norm(x, w),
        lambda x, r, w, b: tri_rows("rms_norm", x, w=w),
        lambda x, r, w, b: torch_rms(x.double(), w.double()),
        (1, 2),
    ),
    "rms_norm_residual": (
        lambda m, x, r, w, b: m.rms_norm_residual(x, r, w),
        lambda x, r, w, b: tri_rows("rms_norm_residual", x, r=r, w=w),
        lambda x, r, w, b: (torch_rms(_residual(x, r).double(), w.double()), _residual(x, r)),
        (1, 4),
    ),
    "layer_norm": (
        lambda m, x, r, w, b: m.layer_norm(x, w, b),
        lambda x, r, w, b: tri_rows("layer_norm", x, w=w, b=b, eps=1e-5),
        lambda x, r, w, b: F.layer_norm(x.double(), x.shape[-1:], w.double(), b.double(), 1e-5),
        (2, 2),
    ),
    "softmax": (
        lambda m, x, r, w, b: m.softmax(x),
        lambda x, r, w, b: tri_rows("softmax", x),
        lambda x, r, w, b: torch.softmax(x.double(), -1),
        (0, 2),
    ),
}


def _row_inputs(shape, dt, offset):
    """x, the residual (``offset`` elements past an allocation), w and b."""
    x, r = (_randn(shape[0] * shape[1] + offset, dt)[offset:].view(shape) for _ in range(2))
    return x, r, _randn(shape[-1:], dt), _randn(shape[-1:], dt)


def _row_impls(mods: dict, op: str, variants) -> dict:
    """name -> fn(x, r, w, b): op of the shipped module, of each variant, and Triton."""
    call, triton_fn = ROW_OPS[op][:2]
    impls = {
        k: (lambda x, r, w, b, m=m: call(m, x, r, w, b))
        for k, m in {"kaio": rows, **{v: mods[v] for v in variants}}.items()
    }
    return {**impls, "triton": triton_fn}


def _warm(where: str, case: int) -> str:
    """Compile what ROW_CASES[case] launches (into the kaio and Triton disk caches), on four
    of its rows; '' or the error."""
    try:
        mods = {k: _rows_variant(where, k, v) for k, v in ROWS_VARIANTS.items()}
        ops, _, dt, shape, offset, variants = ROW_CASES[case]
        for op in ops:
            for fn in _row_impls(mods, op, variants).values():
                fn(*_row_inputs((4, shape[1]), dt, offset))
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001  (reported, the timed run compiles it again)
        return f"{type(e).__name__}: {e}"[:200]


def prewarm(where: str, workers: int, cases: list) -> None:
    """The kernels of ``cases`` (indices into ROW_CASES) compiled in ``workers`` processes at
    once (``_warm``): the timed run then loads them from the disk caches."""
    import concurrent.futures
    import multiprocessing
    import time

    t = time.time()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        jobs = [pool.submit(_warm, where, case) for case in cases]
        errors = [e for e in (job.result() for job in jobs) if e]
    print(f"prewarm: {len(cases)} cases in {time.time() - t:.1f} s {errors}", flush=True)


def row_cases(h: Harness, where: str, cases: list) -> None:
    """The ``cases`` of ROW_CASES: the shipped rows module, its variants and Triton."""
    mods = {k: _rows_variant(where, k, v) for k, v in ROWS_VARIANTS.items()}
    for ops, name, dt, shape, offset, variants in (ROW_CASES[i] for i in cases):
        n = shape[0] * shape[1]
        size = torch.tensor([], dtype=dt).element_size()

        def inputs(shape=shape, dt=dt, offset=offset):
            return _row_inputs(shape, dt, offset)

        for op in ops:
            reference, (rows_moved, all_moved) = ROW_OPS[op][2:]
            impls = _row_impls(mods, op, variants)
            h.case(
                op,
                f"{name} {list(shape)}",
                inputs,
                impls,
                reference=reference,
                nbytes=(rows_moved * shape[1] + all_moved * n) * size,
                tol=TOL[dt],
                baseline="triton",
            )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--silu", action="store_true", help="also the silu*gate user kernel")
    p.add_argument("--prewarm", type=int, default=0, help="compile in this many processes first")
    p.add_argument("--cases", nargs="*", help="the row cases whose name contains one of these")
    args, _ = p.parse_known_args()
    cases = selected(args.cases)
    # the variants' files at one path for every process (their kernels' cache keys)
    where = os.path.join(tempfile.gettempdir(), f"mem_ab_variants_{os.getpid()}")
    os.makedirs(where, exist_ok=True)
    if args.prewarm:
        prewarm(where, args.prewarm, cases)
    h = Harness.from_args("memory-bound A/B: silu*gate user kernel, rows variants")
    print(f"GPU: {h.meta['gpu']}; copy bandwidth {h.copy_bandwidth():.0f} GB/s", flush=True)
    if args.silu:
        silu_cases(h)
    row_cases(h, where, cases)
    h.copy_bandwidth()
    h.finish()
    print(h.table())


if __name__ == "__main__":
    main()
