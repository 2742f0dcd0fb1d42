"""Search the Hopper GEMM's launch plans by measurement: for each shape, ``kaio_ops.matmul``'s
kernel (``_gemm_hopper.gemm_wgmma``, f16 in and out) under every plausible ``Plan`` (64- or
128-row tiles, N tiles of 64/128/256, K splits summed in the kernel or by the reduction
kernel, ring depth) against cuBLAS (``torch.matmul``), per-call kernel time with L2 rotated
(bench/harness.py). The best plan of each shape is what ``_gemm_hopper.plan``'s table is
checked against.

Usage: ``python bench/gemm_plans.py --out plans.json [--budget 70] [--set small,mid,...]``
(``linear``: B [N, K] shapes; ``epi``: fused ``linear`` epilogues against the torch ops);
stops starting shapes after ``--budget`` seconds (the JSON keeps what finished). Prints, per
shape, cuBLAS, the current heuristic's plan and the best plan found (µs), then a summary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import Harness  # noqa: E402
from kaio_ops import _arrays, _gemm_hopper, _gemv  # noqa: E402
from kaio_ops.linear import gemm  # noqa: E402
from kaio_ops.matmul import Plan as MmaPlan  # noqa: E402

linear_mod = importlib.import_module("kaio_ops.linear")

LLAMA8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LLAMA70B = [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
SETS = {
    "small": [(m, n, k) for m in (1, 16, 64) for n, k in LLAMA8B],
    "mid": [(1024, 1024, 1024), (2048, 2048, 2048)]
    + [(m, n, k) for m in (128, 256, 1024) for n, k in LLAMA8B],
    "more": [(m, n, k) for m in (4, 32, 512, 2048) for n, k in LLAMA8B]
    + [(m, n, k) for m in (1, 16, 128, 1024) for n, k in LLAMA70B],
}
SETS["all"] = SETS["small"] + SETS["mid"] + SETS["more"]
# M values of the sweep no set above measured (the table's ranges and rules cover them)
SETS["check"] = [(m, n, k) for m in (2, 8, 4096) for n, k in LLAMA8B]
# where a K split pays: its sum in the kernel against gemm_reduce
SETS["fixup"] = [(m, n, k) for m in (1, 16, 64) for n, k in ((4096, 4096), (4096, 14336))]
SETS["fixup"] += [(16, 6144, 4096), (4, 4096, 4096)]
# B [N, K] (``linear``, nn.Linear's weight), marked by a negative K
SETS["linear"] = [(m, n, -k) for m in (1, 4, 16, 128) for n, k in ((4096, 4096), (4096, 14336))]


# fused linear epilogues (B [N, K], bias, activation, residual) against the separate torch
# ops: (M, N (the output's columns), K, activation)
EPILOGUES = [
    (m, n, k, act)
    for m in (1, 16, 4096)
    for n, k, act in ((4096, 14336, "gelu"), (14336, 4096, "silu_gate"))
]


def candidates(m: int, n: int, k: int, sms: int, gate: bool = False) -> list[_gemm_hopper.Plan]:
    """The plans worth timing for one shape: every tile shape whose grid, times a K split
    of whole 64-deep steps (at least 2 a slice), gives between sms / 2 and 4 * sms blocks
    (or the one split nearest that), the split summed both ways. ``gate``: "silu_gate"
    (N tiles of at most 128)."""
    out = []
    for wg in (1,) if m <= 64 else (1, 2) if m <= 2048 else (2,):
        rows = math.ceil(m / (64 * wg))
        for bn in (64, 128) if gate else (64, 128, 256):
            tiles = rows * math.ceil(n / bn)
            stages = _gemm_hopper.stages_for(wg, bn, gate)
            for split in (1, 2, 3, 4, 6, 8, 12, 16):
                if split > 1 and k // split < 2 * _gemm_hopper.BK:
                    continue
                blocks = tiles * split
                if split > 1 and blocks > 4 * sms or split == 1 and tiles > 64 * sms:
                    continue
                if blocks < sms // 2 and tiles * 2 * split <= 4 * sms and split < 16:
                    continue  # a larger split fills the GPU better
                out.append(_gemm_hopper.Plan(wg, bn, stages, split, False))
                if split > 1:  # the split summed in the kernel too
                    out.append(_gemm_hopper.Plan(wg, bn, stages, split, True))
    return out


def _torch_linear(x, w, bias, res, act):
    """What the fused epilogue replaces: F.linear, the activation, the residual add."""
    F = torch.nn.functional
    z = F.linear(x, w, bias)
    if act == "silu_gate":
        g, u = z.chunk(2, -1)
        return F.silu(g) * u + res
    if act == "gelu":
        z = F.gelu(z)
    return z if res is None else z + res


def search(
    h: Harness, m: int, n: int, k: int, sms: int, transposed: bool = False, act: str = "none"
) -> dict:
    """Time the peer and each candidate plan of one shape (checked against an f32
    reference, and a split's result the same bits twice): the row of the JSON.
    ``transposed``: B is [N, K] (``linear``; cuBLAS through ``F.linear``); ``act`` other than
    "none": ``linear`` with bias, that activation and a residual, against the torch ops."""
    gate = act == "silu_gate"
    epi = act != "none"
    transposed = transposed or epi
    rows = 2 * n if gate else n
    nbytes = (m * k + k * rows + m * n * (2 if epi else 1)) * 2
    sets = []
    for _ in range(h.sets_for(nbytes)):
        a = torch.randn(m, k, device="cuda").half()
        shape = (rows, k) if transposed else (k, n)
        b = (torch.randn(*shape, device="cuda") * k**-0.5).half()
        extra = ()
        if epi:
            bias = torch.randn(rows, device="cuda").half()
            extra = (bias, torch.randn(m, n, device="cuda").half())
        sets.append((a, b, *extra))
    if epi:
        ref = _torch_linear(*[t.float() for t in sets[0]], act)
    else:
        ref = sets[0][0].float() @ (sets[0][1].float().T if transposed else sets[0][1].float())
    ops = {}
    for operands in sets:
        inputs = _arrays.Inputs("matmul")
        names = ("a", "b", "bias", "res")
        ops[operands[0].data_ptr()] = [
            inputs.array(t, nm, ndim=(1, 2)) for t, nm in zip(operands, names, strict=False)
        ]

    def kaio_fn(plan):
        fixup = plan == "mma.sync fixup"
        if plan in ("mma.sync fixup", "mma.sync reduce"):  # its own plan, K split summed two ways
            plan = linear_mod.plan(m, n, k, sms, gate)

        def fn(a, *_):
            ia, ib, *rest = ops[a.data_ptr()]
            bias, res = rest or (None, None)
            before, linear_mod.MMA_FIXUP = linear_mod.MMA_FIXUP, fixup
            try:
                return gemm("matmul", ia, ib, (m, n), (m, n, k), ia.dtype, transposed, bias,
                            res, act, chosen=plan)  # fmt: skip
            finally:
                linear_mod.MMA_FIXUP = before

        return fn

    def med(fn):
        return statistics.median(h.time(fn, sets)) * 1e3

    if epi:
        peer = med(lambda *t: _torch_linear(*t, act))
    else:
        peer = med(torch.nn.functional.linear if transposed else torch.matmul)
    default = _gemm_hopper.plan(m, n, k, sms, gate)
    plans = candidates(m, n, k, sms, gate)
    if default not in plans:
        plans.insert(0, default)
    if default.split > 1:
        plans.append(default._replace(fixup=False))
    if _gemv.MAX_M >= m and not transposed:  # the skinny kernel, K splits around its own choice
        mine = _gemv.split_for(m, n, k, sms)
        plans += sorted({_gemv.Plan(max(1, s)) for s in (mine // 4, mine // 2, mine, 2 * mine)})
    if _gemv.MAX_M_NK >= m and transposed:
        plans.append(_gemv.Plan(1))
    if m <= 64:
        plans += ["mma.sync fixup", "mma.sync reduce"]
        mine = linear_mod.plan(m, n, k, sms, gate)
        if mine.split > 1:  # its K split halved and doubled
            plans += [replace(mine, split=mine.split // 2), replace(mine, split=2 * mine.split)]
    if m >= 128 and not transposed:
        plans.append("persistent")  # _matmul_hopper's kernel (128 x 128 or 128 x 256 tiles)
    timed = []
    for plan in plans:
        fn = kaio_fn(plan)
        try:
            got = fn(*sets[0])
            err = ((got.float() - ref).norm() / ref.norm()).item()
            same = torch.equal(got, fn(*sets[0]))  # a split's sum: same bits each run
            us = med(fn)
        except Exception as e:  # noqa: BLE001  (a plan failing must not stop the search)
            print(f"  {plan}: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        ok = err < 3e-3 and same
        timed.append({"plan": _name(plan), "us": us, "err": err, "same": same, "ok": ok})
    good = [t for t in timed if t["ok"]]
    best = min(good, key=lambda t: t["us"]) if good else None
    dflt = next((t for t in timed if t["plan"] == _name(default)), None)
    return {
        "m": m,
        "n": n,
        "k": k,
        "transposed": transposed,
        "act": act,
        "cublas_us": peer,
        "default": dflt,
        "best": best,
        "all": timed,
    }


def main(argv: list[str] | None = None) -> None:
    """Time each shape's candidate plans; write the JSON (--out) as shapes finish."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="all", help=f"comma-separated, of {sorted(SETS)}")
    p.add_argument("--budget", type=float, default=70.0, help="seconds to start shapes in")
    p.add_argument("--reps", type=int, default=20)
    args, rest = p.parse_known_args(argv)
    h = Harness.from_args("Hopper GEMM plan search", rest, reps=args.reps)
    start = time.perf_counter()
    sms = h.meta["sms"]
    rows = []
    shapes = [
        (*shape, "none") if len(shape) == 3 else shape
        for name in args.set.split(",")
        for shape in (EPILOGUES if name == "epi" else SETS[name])
    ]
    for m, n, k, act in shapes:
        if time.perf_counter() - start > args.budget:
            print(f"budget spent: stopped before {m}x{n}x{k} {act}", flush=True)
            break
        row = search(h, m, n, abs(k), sms, transposed=k < 0, act=act)
        k = abs(k)
        rows.append(row)
        bad = [t["plan"] for t in row["all"] if not t["ok"]]
        cu = row["cublas_us"]
        print(
            f"M={m:5d} {_shape(row)} cuBLAS {cu:7.1f}us  default {_fmt(row['default'], cu)}  "
            f"best {_fmt(row['best'], cu)}" + (f"  WRONG {bad}" if bad else ""),
            flush=True,
        )
        if h.out:
            with open(h.out, "w") as fh:
                json.dump({"meta": h.meta, "rows": rows}, fh)
        torch.cuda.empty_cache()
    print(f"\nHopper GEMM plans on {h.meta['gpu']} ({sms} SMs), f16, B [K, N]; x = cuBLAS/kaio")
    print("| M | N x K | cuBLAS µs | default plan | x | best plan | x |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        d, b, cu = r["default"], r["best"], r["cublas_us"]
        print(
            f"| {r['m']} | {_shape(r)} | {cu:.1f} | {_fmt(d, cu, ' | ')} | {_fmt(b, cu, ' | ')} |"
        )


def _shape(row: dict) -> str:
    """ "NxK" of a row, marked " [N,K]" for B in nn.Linear's layout, and its epilogue (whose
    peer is the torch ops, not cuBLAS alone)."""
    text = f"{row['n']}x{row['k']}" + (" [N,K]" if row["transposed"] else "")
    return text + (f" {row['act']}+bias+res vs torch" if row["act"] != "none" else "")


def _name(plan) -> list:
    """A plan as JSON: ``[wg, bn, stages, split, fixup]``, ``["gemv", split]``,
    ``[config, split]`` (mma.sync) or ``["persistent"]``."""
    if isinstance(plan, str):
        return [plan]
    if isinstance(plan, MmaPlan):
        return [plan.config, plan.split]
    return ["gemv", plan.split] if isinstance(plan, _gemv.Plan) else list(plan)


def _fmt(t: dict | None, cublas: float, sep: str = " ") -> str:
    """A timed plan as "[plan] µs (x cuBLAS)", or "-" when none ran."""
    if t is None:
        return "-"
    if sep == " ":
        return f"{t['plan']} {t['us']:.1f}us ({cublas / t['us']:.2f}x)"
    return f"{t['plan']}{sep}{cublas / t['us']:.2f}"


if __name__ == "__main__":
    main()
