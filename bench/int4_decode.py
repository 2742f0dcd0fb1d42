"""The W4A16 decode kernel (``kaio_ops._int4_decode``, M <= 16) against cuBLAS f16 and the
weight-read floor: kernel time from CUDA graphs (``bench/int4_wgmma.graph_time``), the int4
words rotated over enough copies to cover 200 MB (cuBLAS's f16 weights in the same sets),
f16 out for both, every result checked against the f32 product of the dequantized weights.

Per (N x K, M): cuBLAS f16, ``matmul_int4`` as routed (``_int4_decode.plan``),
the decode kernel with each ``--warps`` count a block, and with ``--baseline W,...`` another
version of the module copied in as ``kaio_ops/_int4_decode_v0.py`` (an A/B in one run); the
floor (``bench/floors.read_words``: every word read once, nothing else) once per shape.
``--once`` runs each kernel once eagerly and times nothing (for a profiler).

Usage: ``python bench/int4_decode.py [--shapes 8192x8192,...] [--ms 1,16] [--warps 4,8]
[--variants W/P/D/B/M/L/S/X/WB/CS/WC/A/XS/XC/SP/T/PDL,...] [--out DIR] [--budget S]
[--prewarm N] [--once]``: W warps a block, then ``KNOBS`` in order (``_int4_decode.TUNED``'s
PREFETCH, DEQ, MINB, PMODE, L2F, SWAP, XLEAD, WBUF, CS, WC, ASYNC, XS, XC, then SPLIT, TAIL
and PDL). Writes
``DIR/int4_decode.jsonl`` and prints a table: µs, x cuBLAS, and % of the floor (floor time
/ time). ``--plan-tunes DEQ=1;WC=1/PREFETCH=1`` adds, per point, ``plan``'s warps and knobs
with those knobs overridden; ``--baseline 0`` runs the copied module at its own ``plan``.
"""

# ruff: noqa: B023  (the timed lambdas run before the loop moves on)
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
import kaio_ops  # noqa: E402
from bench.int4_wgmma import L2_BYTES, graph_time, operand  # noqa: E402
from bench.quantized import int4_bytes, int4_inputs, read_only  # noqa: E402
from kaio_ops import _arrays, _int4_decode  # noqa: E402

SHAPES = "8192x8192,10240x8192,57344x8192,8192x28672,4096x4096,6144x4096,28672x4096,4096x14336"
T0 = time.time()
# --variants' fields past W: the constexprs, then matmul's SPLIT, TAIL (a TAIL is a SPLIT of
# the last partial round's blocks) and PDL (programmatic dependent launch: 1 the wait alone, 3
# launch_dependents and the first groups' L2 prefetches before it, 4 the wait, then
# launch_dependents after the main loop)
KNOBS = {**_int4_decode.TUNED, "SPLIT": _int4_decode.SPLIT, "TAIL": 0, "PDL": 0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--ms", default="1,16")
    p.add_argument("--warps", default="4,8", help="the decode kernel with these warps a block")
    p.add_argument(
        "--variants",
        default="",
        help="W/P/D/B/M/L/S/X/WB/CS/WC/A/XS/XC/SP/T/PDL,...: warps and KNOBS' values",
    )
    p.add_argument("--budget", type=float, default=40.0)
    p.add_argument("--once", action="store_true", help="run each kernel eagerly, no timing")
    p.add_argument("--no-routed", action="store_true", help="skip matmul_int4 as routed")
    p.add_argument("--prewarm", type=int, default=0, help="compile first in N processes")
    p.add_argument(
        "--baseline", default="", help="WARPS list: kaio_ops._int4_decode_v0 (another version)"
    )
    p.add_argument(
        "--plan-tunes",
        default="",
        help="K=V/K=V;...: plan's warps and knobs at each point with these KNOBS overridden",
    )
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    here = tuple(KNOBS.values())
    variants = [(int(w), *here) for w in args.warps.split(",") if w]
    variants += [tuple(map(int, v.split("/"))) for v in args.variants.split(",") if v]
    ms = [int(m) for m in args.ms.split(",")]
    args.plan_tunes = plan_tunes(args.plan_tunes)
    os.makedirs(args.out, exist_ok=True)
    sink = open(os.path.join(args.out, "int4_decode.jsonl"), "w")  # noqa: SIM115

    def log(rec):
        rec["t"] = round(time.time() - T0, 1)
        print(json.dumps(rec), flush=True)
        sink.write(json.dumps(rec) + "\n")
        sink.flush()

    log({"gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0)
         .multi_processor_count})  # fmt: skip
    if args.prewarm:
        sizes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
        grids = [(-(-n // _int4_decode.COLS), k // 128) for n, k in sizes]
        fast = _arrays.fast_memory(operand(torch.empty(1, 8, device="cuda"), "x"))
        prewarm(log, variants, ms, args.prewarm, args.plan_tunes, grids, fast)
    rows = []
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        if time.time() - T0 > args.budget:
            log({"skipped": [n, k]})
            continue
        sets = 2 if args.once else max(2, min(24, -(-L2_BYTES // int4_bytes(n, k))))
        weights = [int4_inputs(1, n, k)[1:] for _ in range(sets)]
        floor = [read_only(w[0]) for w in weights]
        floor_us = None
        for m in ms:
            if time.time() - T0 > args.budget:
                log({"skipped": [m, n, k]})
                continue
            rows.append(point(log, args, m, n, k, weights, floor, variants))
            if floor_us is None and not args.once:
                floor_us = graph_time(lambda i: floor[i](None, weights[i][0], None, None), sets)
                log({"n": n, "k": k, "floor_us": floor_us})
            rows[-1]["floor_us"] = floor_us
    if not args.once:
        summary(rows, torch.cuda.get_device_name())


def _warm(consts: dict) -> str:
    """Compile one ``int4_decode`` specialization into the disk cache (a worker process);
    with a ``TAIL``, both forms (split where the grid leaves a partial round, else not)."""
    consts = {**KNOBS, **consts}
    tail = consts.pop("TAIL")
    try:
        for split in {consts["SPLIT"], tail or consts["SPLIT"]}:
            _int4_decode.int4_decode.resources(**{**consts, "SPLIT": split, "DT": kaio.f16})
        return ""
    except Exception as e:  # noqa: BLE001
        return f"{consts}: {type(e).__name__}: {str(e)[:200]}"


def plan_tunes(text: str) -> list[dict]:
    """``--plan-tunes``' overrides: ``K=V/K=V;...`` as a list of {KNOB: value}."""
    tunes = []
    for spec in filter(None, text.split(";")):
        tune = dict(kv.split("=") for kv in spec.split("/"))
        unknown = set(tune) - set(KNOBS)
        if unknown:
            raise SystemExit(f"--plan-tunes {spec!r}: {sorted(unknown)} are not in {list(KNOBS)}")
        tunes.append({k: int(v) for k, v in tune.items()})
    return tunes


BRANCHES = [(t, g) for t in (1, 133, 265, 397, 529, 661, 1321) for g in (1, 64)]


def specializations(
    variants: list, ms: list, tunes: list = (), grids: list = BRANCHES, fast: bool = False
) -> list:
    """The constexprs of every ``int4_decode`` specialization a run times (``variants``'
    (warps, *tuned), blocks of 4 and 8 warps and ``plan`` at each M and (32-column tiles,
    scale groups) of ``grids`` (default: each branch on 132 SMs) for a GPU with the faster
    memory or not (``fast``), alone and with each of ``tunes``' overrides, as ``matmul``
    launches them: ``_tuned``), DT aside."""
    routed = [(w, *KNOBS.values()) for w in (4, 8)]
    todo = set()
    for m in ms:
        for w, *tuned in (*routed, *variants):
            consts = _int4_decode._tuned(m, dict(zip(KNOBS, tuned, strict=True)))
            todo.add((w, *(consts.get(k, 0) for k in KNOBS), _int4_decode._rows(m)))
        for count, groups in grids:  # plan's choices on 132 SMs (matmul_int4)
            w, tune = _int4_decode.plan(m, count, 132, groups, fast=fast)
            for extra in ({}, *tunes):
                consts = _int4_decode._tuned(m, {**tune, "SPLIT": _int4_decode.SPLIT, **extra})
                todo.add((w, *(consts.get(k, 0) for k in KNOBS), _int4_decode._rows(m)))
    names = ("WARPS", *KNOBS, "ROWS")
    return [dict(zip(names, v, strict=True)) for v in sorted(todo)]


def prewarm(
    log, variants: list, ms: list, workers: int, tunes: list = (), grids=None, fast=False
) -> None:
    """Every specialization timed (``specializations``, ``fast``: this GPU's memory) compiled
    in ``workers`` processes at once: a launch then loads each from the disk cache."""
    import concurrent.futures
    import multiprocessing

    jobs = specializations(variants, ms, tunes, grids or BRANCHES, fast)
    t = time.time()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        errors = [e for e in pool.map(_warm, jobs) if e]
    log({"prewarm": len(jobs), "seconds": round(time.time() - t, 1), "errors": errors[:5]})


def point(log, args, m, n, k, weights, floor, variants) -> dict:
    """cuBLAS, the routed op and each variant at one (M, N, K): µs and relative errors."""
    sets = len(weights)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    ref = a.float() @ weights[0][2].float()
    ops = [[operand(x, "x") for x in (a, s[0], s[1])] for s in weights]
    f16 = torch.float16
    calls = {"cublas": lambda i: torch.matmul(a, weights[i][2])}
    if not args.no_routed:
        calls["routed"] = lambda i: kaio_ops.matmul_int4(a, *weights[i][:2], out_dtype=f16)
    for w, *tuned in variants:
        tune = dict(zip(KNOBS, tuned, strict=True))
        name = f"{w}w " + "".join(f"{k[0].lower()}{v}" for k, v in tune.items())
        calls[name] = lambda i, w=w, t=tune: _int4_decode.matmul(*ops[i], kaio.f16, w, t)
    planned = _int4_decode.planned(ops[0][0], -(-n // _int4_decode.COLS), k // 128)
    for extra in args.plan_tunes:  # plan's warps and knobs, some knobs overridden
        name = "plan " + "/".join(f"{k}={v}" for k, v in extra.items())
        w, t = planned[0], {**planned[1], **extra}
        calls[name] = lambda i, w=w, t=t: _int4_decode.matmul(*ops[i], kaio.f16, w, t)
    if args.baseline:  # an earlier version of the module, copied in as _int4_decode_v0
        import importlib

        v0 = importlib.import_module("kaio_ops._int4_decode_v0")
        for w in map(int, args.baseline.split(",")):
            calls[f"v0 {w}"] = lambda i, w=w: v0.matmul(*ops[i], kaio.f16, w)
    rec = {"m": m, "n": n, "k": k, "sets": sets, "routed_warps": planned[0], "us": {}, "err": {}}
    for name, call in calls.items():
        try:
            got = call(0)
            if name != "cublas":
                got = torch.as_tensor(got) if not isinstance(got, torch.Tensor) else got
                rec["err"][name] = ((got.float() - ref).norm() / ref.norm()).item()
            if args.once:
                torch.cuda.synchronize()
            else:
                rec["us"][name] = graph_time(call, sets)
        except Exception as e:  # noqa: BLE001
            rec["err"][name] = f"{type(e).__name__}: {str(e)[:300]}"
    if args.once:
        floor[0](None, weights[0][0], None, None)
        torch.cuda.synchronize()
    log(rec)
    return rec


def summary(rows: list, gpu: str) -> None:
    """The table: per point, each implementation's µs, x cuBLAS and % of the floor."""
    names = list(dict.fromkeys(k for r in rows for k in r["us"] if k != "cublas"))
    print(f"\n{gpu}: µs (x cuBLAS f16, % of the weight-read floor)")
    print(f"{'N x K':>12} {'M':>3} {'cuBLAS':>7} {'floor':>6} " + " ".join(
        f"{n:>20}" for n in names))  # fmt: skip
    for r in rows:
        cb, fl = r["us"].get("cublas"), r.get("floor_us")
        cells = []
        for name in names:
            t = r["us"].get(name)
            if t is None or cb is None or fl is None:
                cells.append(f"{'-':>20}")
                continue
            cells.append(f"{t:7.1f} ({cb / t:4.2f}x {100 * fl / t:3.0f}%)")
        print(f"{r['n']:>5}x{r['k']:<6} {r['m']:>3} {cb or 0:7.1f} {fl or 0:6.1f} "
              + " ".join(cells))  # fmt: skip
    print("\nbest per point: plan, µs, x cuBLAS, % floor (routed: the same)")
    for r in rows:
        timed = {k: v for k, v in r["us"].items() if k != "cublas"}
        if not timed or "cublas" not in r["us"] or not r.get("floor_us"):
            continue
        best = min(timed, key=timed.get)
        t, cb, fl = timed[best], r["us"]["cublas"], r["floor_us"]
        rt = timed.get("routed", float("nan"))
        print(f"{r['n']:>5}x{r['k']:<6} {r['m']:>3} {best:>12} {t:7.1f} {cb / t:5.2f}x "
              f"{100 * fl / t:4.0f}%  (routed, {r['routed_warps']} warps: {cb / rt:5.2f}x "
              f"{100 * fl / rt:4.0f}%)")  # fmt: skip
    print("\nrouted by M: geometric mean (min) x cuBLAS and % of the floor")
    for m in sorted({r["m"] for r in rows}):
        got = [r for r in rows if r["m"] == m and "routed" in r["us"] and r.get("floor_us")]
        if got:
            x = [r["us"]["cublas"] / r["us"]["routed"] for r in got]
            f = [r["floor_us"] / r["us"]["routed"] for r in got]
            geo = [math.exp(sum(map(math.log, v)) / len(v)) for v in (x, f)]
            print(
                f"M = {m}: {geo[0]:.2f}x ({min(x):.2f}x), {100 * geo[1]:.0f}% ({100 * min(f):.0f}%)"
            )


if __name__ == "__main__":
    main()
