"""The two backends side by side: kaio's PTX emitter (``kaio.ptx``) and LLVM's NVPTX backend
(``kaio.llvm``) on every kernel of kaio_ops (docs/performance.md, "Two backends").

Registers (no GPU): every specialization the op modules ship (their ``shipped()`` or
``specializations()``) compiled by both backends, each PTX text assembled by ``ptxas -v`` for
one arch: registers, spill bytes (stores + loads) and the time each backend took to emit the
PTX from the same optimized IR.

Times (``--time``; a GPU and torch): each kaio_ops op run through both backends on the same
inputs; the outputs must be equal bit for bit (NaN equal to NaN) before anything is timed;
then bench/harness.py times each (CUDA events, median of ``--reps``).

    python bench/backends.py --out registers.json            # registers and spills, sm_90
    python bench/backends.py --time --out times.json         # GPU times (and a bit check)
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import multiprocessing
import os
import pkgutil
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from kaio.kernel import BACKENDS  # noqa: E402
from kaio.llvm import using  # noqa: E402
from kaio.ptx.ptxas import assemble  # noqa: E402


# ---------------------------------------------------------------------------- the kernels
def kaio_ops_specializations() -> list[tuple[str, object, dict]]:
    """(module, kernel, constexprs) of every specialization the kaio_ops modules list in
    ``shipped()`` or ``specializations()``, modules in name order."""
    out = []
    for info in sorted(pkgutil.iter_modules(kaio_ops.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"kaio_ops.{info.name}")
        except Exception as e:  # noqa: BLE001  (a module being written must not stop the rest)
            print(f"kaio_ops.{info.name} not imported: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        listing = getattr(module, "shipped", None) or getattr(module, "specializations", None)
        if listing is not None:
            out += [(info.name, k, dict(c)) for k, c in listing()]
    return out


def label(kernel, constexprs: dict) -> str:
    """``name[dtype] K=V ...``: the kernel, its element type (kaio_ops' dtype constexpr
    ``DT``) and the other values."""
    dt = constexprs.get("DT")
    name = f"{kernel.__name__}[{dt}]" if dt is not None else kernel.__name__
    return " ".join([name, *(f"{k}={v}" for k, v in constexprs.items() if k != "DT")])


_RESOURCES = {
    "registers": r"Used (\d+) registers",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
}


def ptxas_resources(report: str) -> dict:
    """Registers and spill bytes from a ``ptxas -v`` report of one kernel."""
    return {k: int(re.search(p, report).group(1)) for k, p in _RESOURCES.items()}


_SPECS: list = []  # the specializations, listed before the worker processes fork


def _row(index: int, arch: str) -> dict:
    """One specialization (``_SPECS[index]``): each backend's emission time and resources."""
    module, kernel, constexprs = _SPECS[index]
    row = {"module": module, "kernel": label(kernel, constexprs)}
    for backend in BACKENDS:
        spec = kernel.specialize(constexprs, backend=backend)
        t0 = time.perf_counter()
        text = spec.ptx(arch)
        row[f"{backend}_emit_ms"] = 1e3 * (time.perf_counter() - t0)
        for key, value in ptxas_resources(assemble(text, arch)).items():
            row[f"{backend}_{key}"] = value
    return row


def registers(arch: str, jobs: int) -> list[dict]:
    """One row per specialization, computed by ``jobs`` processes (forked: no GPU is used)."""
    _SPECS[:] = kaio_ops_specializations()
    rows = []
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for row in pool.imap(functools.partial(_row, arch=arch), range(len(_SPECS))):
            rows.append(row)
            print(f"  {row['kernel']}", flush=True)
    return rows


def register_summary(rows: list[dict]) -> str:
    """A Markdown table: per kernel family (kernel and element type), the specializations,
    registers (min-max) and spill bytes of each backend, and the emission time (median)."""
    families: dict[str, list] = {}
    for r in rows:
        families.setdefault(r["kernel"].split(" ")[0], []).append(r)
    out = [
        "| kernel | specs | registers ptx | registers llvm | llvm - ptx (median) | "
        "spills ptx | spills llvm | emit ms ptx | emit ms llvm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in families.items():

        def span(key, rs=rs):
            values = [r[key] for r in rs]
            lo, hi = min(values), max(values)
            return str(lo) if lo == hi else f"{lo}-{hi}"

        def spills(b, rs=rs):
            return sum(r[f"{b}_spill_stores"] + r[f"{b}_spill_loads"] for r in rs)

        diff = statistics.median(r["llvm_registers"] - r["ptx_registers"] for r in rs)
        ms = {b: statistics.median(r[f"{b}_emit_ms"] for r in rs) for b in BACKENDS}
        out.append(
            f"| {name} | {len(rs)} | {span('ptx_registers')} | {span('llvm_registers')} | "
            f"{diff:+g} | {spills('ptx')} | {spills('llvm')} | {ms['ptx']:.0f} | "
            f"{ms['llvm']:.0f} |"
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------- GPU times
def ops_cases(randn, shapes, matmuls) -> list[tuple]:
    """(name, op, make inputs, flops or None) of every kaio_ops op: the memory-bound ones in
    f32, f16 and bf16 for each (rows, cols) of ``shapes``, the four tensor-core matmuls for
    each (m, n, k) of ``matmuls``. ``randn(shape, dtype name)`` makes one input array."""

    def gelu_none(x):
        return kaio_ops.gelu(x, approximate="none")

    def rope(interleaved):
        return lambda x, c, s: kaio_ops.rope(x, c, s, interleaved=interleaved)

    def rope_shapes(r, c):
        d = 2 * (c // 8)  # 4 heads of an even head dim
        return [(r, 4, d), (r, d // 2), (r, d // 2)]

    # name, op, input shapes given (rows, cols)
    memory_ops = [
        ("silu_gate", kaio_ops.silu_gate, lambda r, c: [(r, c), (r, c)]),
        ("gelu", kaio_ops.gelu, lambda r, c: [(r, c)]),
        ("gelu none", gelu_none, lambda r, c: [(r, c)]),
        ("add", kaio_ops.add, lambda r, c: [(r, c), (r, c)]),
        ("mul row", kaio_ops.mul, lambda r, c: [(r, c), (c,)]),
        ("rms_norm", kaio_ops.rms_norm, lambda r, c: [(r, c), (c,)]),
        ("rms_norm_residual", kaio_ops.rms_norm_residual, lambda r, c: [(r, c), (r, c), (c,)]),
        ("layer_norm", kaio_ops.layer_norm, lambda r, c: [(r, c), (c,), (c,)]),
        ("softmax", kaio_ops.softmax, lambda r, c: [(r, c)]),
        ("rope", rope(False), rope_shapes),
        ("rope interleaved", rope(True), rope_shapes),
    ]
    cases = []
    for dt in ("f32", "f16", "bf16"):
        for rows, cols in shapes:
            for name, op, shapes_of in memory_ops:
                sizes = shapes_of(rows, cols)

                def make(dt=dt, sizes=sizes):
                    return [randn(s, dt) for s in sizes]

                label = f"{name} {dt} {'x'.join(map(str, sizes[0]))}"
                cases.append((label, op, make, None))
    for dt, suffix in (("f16", ""), ("bf16", "_bf16")):
        for m, n, k in matmuls:
            for variant in ("", "_async"):

                def make(dt=dt, m=m, n=n, k=k):
                    return [randn((m, k), dt), randn((k, n), dt)]

                name = f"matmul_tc{suffix}{variant}"
                cases.append(
                    (f"{name} {m}x{n}x{k}", getattr(kaio_ops, name), make, 2.0 * m * n * k)
                )
    return cases


def run_both(kernels: list, op, inputs: list) -> dict:
    """{backend: op's outputs (a tuple)} with ``kernels`` compiled by each backend in turn."""
    outs = {}
    for backend in BACKENDS:
        with using(kernels, backend):
            out = op(*inputs)
        outs[backend] = out if isinstance(out, tuple) else (out,)
    return outs


def _same(a, b) -> bool:
    """Equal bit for bit (torch tensors), NaN equal to NaN."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        nan = torch.isnan(a)
        if not torch.equal(nan, torch.isnan(b)):
            return False
        a, b = a[~nan], b[~nan]
    return torch.equal(a, b)


def times(args) -> list[dict]:
    """Check, then time, every op through both backends (bench/harness.py)."""
    import torch

    from bench.harness import Harness

    h = Harness.from_args("kaio_ops through two backends", reps=args.reps, warmup=3)
    h.out = None  # this script writes its own JSON
    kernels = [k for _, k, _ in kaio_ops_specializations()]
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

    def randn(shape, dt):
        return (torch.randn(shape, device="cuda") * 2).to(dtypes[dt])

    side = 4096 if args.quick else 8192
    matmuls = [(side // 2, side // 2, side // 2), (16, 4096, 4096)]
    results = []
    for name, op, make, flops in ops_cases(randn, [(side, side)], matmuls):
        if args.only and args.only not in name:
            continue
        inputs = make()
        outs = run_both(kernels, op, inputs)
        exact = all(_same(p, q) for p, q in zip(*outs.values(), strict=True))
        moved = sum(x.nbytes for x in inputs) + sum(x.nbytes for x in outs["ptx"])
        del outs, inputs
        amounts = {"flops": flops, "set_bytes": moved} if flops else {"nbytes": moved}
        row = {"op": name, "bit_exact": exact}
        for backend in BACKENDS:
            with using(kernels, backend):
                (r,) = h.case(name, backend, make, {backend: op}, **amounts)
            row[f"{backend}_us"] = r.ms and r.ms * 1e3
            row[f"{backend}_rate"] = r.tflops if flops else r.gbps
            row[f"{backend}_note"] = r.note
        ptx_us, llvm_us = row["ptx_us"], row["llvm_us"]
        row["ptx_over_llvm"] = ptx_us / llvm_us if ptx_us and llvm_us else None
        results.append(row)
        print(f"    {row}", flush=True)
        save(args.out, {"meta": {**h.meta, "reps": args.reps}, "rows": results})
    return [h.meta, *results]


def time_table(meta: dict, rows: list[dict]) -> str:
    """A Markdown table of the timed ops (``ptx time / llvm time`` > 1: LLVM faster)."""
    out = [
        f"{meta.get('gpu')}, {meta.get('date')}: median of {meta.get('reps')} calls",
        "",
        "| op | bit-exact | ptx µs | llvm µs | GB/s or TFLOP/s ptx | llvm | ptx / llvm |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def f(v, fmt=".1f"):
            return "" if v is None else format(v, fmt)

        out.append(
            f"| {r['op']} | {'yes' if r['bit_exact'] else 'NO'} | "
            f"{f(r['ptx_us'])} | {f(r['llvm_us'])} | {f(r['ptx_rate'])} | "
            f"{f(r['llvm_rate'])} | {f(r['ptx_over_llvm'], '.2f')} |"
        )
    return "\n".join(out)


def save(path: str | None, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` (if given), replacing it whole."""
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--arch", default="sm_90", help="ptxas target of the register report")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compiling processes")
    p.add_argument("--time", action="store_true", help="time the ops on the GPU instead")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="smaller inputs")
    p.add_argument("--only", default="", help="time only the ops whose name contains this")
    args, _ = p.parse_known_args(argv)
    if args.time:
        meta, *rows = times(args)
        meta["reps"] = args.reps
        table = time_table(meta, rows)
        data = {"meta": meta, "rows": rows}
    else:
        rows = registers(args.arch, args.jobs)
        table = register_summary(rows)
        data = {"meta": {"arch": args.arch}, "rows": rows}
    data["markdown"] = table  # python -m bench report shows it as is
    save(args.out, data)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
