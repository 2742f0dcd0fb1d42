"""W4A16 past 16 rows in a short GPU round: cuBLAS f16 against ``matmul_int4`` as routed and
explicit ``int4_swap`` configurations at a few (N x K, M) points, kernel time from CUDA graphs
of ``REPS`` calls with the int4 words rotated over enough copies to cover 200 MB (as
``bench/int4_wgmma.py --swap``), every result checked against the f32 product.

Usage: ``python bench/int4_w35.py time --points 4096x4096@1024/4096,... [--configs
"2,256,0,0,0,0,0,2,1;512=2,128,0,1,0,0,0,2,1+LEAD:1"] [--prewarm N [--warm-tests]] [--raw] [--kmm]
[--dequant] [--no-route] [--repeat R] [--out FILE]``: configs as ``launch_swap``'s (WG, BM, STAGES,
split, CL, MC, WSTAGES, BUFS, EARLY, GROUP, KW, ...), ``M=`` before one for that M only,
``NxK@M=`` for that point only, ``+NAME:V`` after one: launched with ``_int4_hopper.NAME``
V; ``--prewarm N``: compile every build first in N processes (``--warm-tests``: the int4 GPU
tests' too; ``--prewarm-only``: then stop); ``--raw``: the words go to wgmma undecoded (no
dequantization: the pipeline's own limit, results not checked); ``--kmm``: also
``kaio_ops.matmul`` on the f16 weight; ``--dequant``: also ``_int4_hopper.dequantized`` (the
weight made f16 once a call, then ``kaio_ops.matmul``); ``--repeat R``: R passes over the
kernels of a point, each timed once a pass (``pass_order``), the median kept. On a GPU of
the faster memory (``_arrays.fast_memory``) "main", the slower memory's plan, is timed
beside the route where the two differ (``routes``).
``prof --points P --configs C``: one call of each inside an NVTX range "prof" (for ``ncu
--nvtx --nvtx-include prof/``). ``names --points P --configs C``: each kernel's name, grid,
block, registers and shared memory as torch.profiler sees one call (``--out F``: the trace
goes to F.json). ``table FILE``: the records of ``--out`` as a Markdown table and the
geometric mean by M.
"""

# ruff: noqa: B023  (the timed lambdas run before the loop moves on)
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
import kaio_ops  # noqa: E402
from bench.int4_wgmma import graph_time, operand, swap_consts  # noqa: E402
from bench.quantized import int4_bytes, int4_inputs  # noqa: E402
from kaio_ops import _arrays, _int4_hopper  # noqa: E402

L2_BYTES = 200 << 20
# (M, N, K, output type) of test_gpu_int4_wgmma, test_gpu_int4 past 16 rows,
# test_gpu_int4_dependent_launch_chain and test_gpu_int4_fast_memory_plans (--warm-tests)
TEST_POINTS = ((17, 4096, 4096, "f32"), (200, 4104, 4096, "f32"), (1000, 1024, 14336, "f16"),
               (300, 4096, 4096, "f32"), (2048, 8192, 4096, "f16"), (4096, 4096, 4096, "bf16"),
               (100, 8192, 4096, "f32"), (256, 8192, 2048, "f16"),
               (4096, 4096, 4096, "f32"), (1024, 32768, 1024, "f16"), (600, 28672, 2048, "bf16"),
               (120, 4096, 2048, "f16"), (200, 1024, 4096, "bf16"), (40, 10240, 2048, "f16"),
               (700, 6144, 1024, "bf16"), (250, 10240, 1024, "f16"),
               (300, 10240, 8192, "bf16"), (600, 4096, 2048, "f16"),
               (1500, 6144, 1024, "bf16"), (300, 6144, 4096, "f16"), (300, 4096, 4096, "f16"),
               (600, 4096, 4096, "f16"), (520, 6144, 4096, "f32"), (128, 10240, 8192, "f16"),
               (100, 10240, 4096, "f32"), (240, 10240, 8192, "f32"),
               (1024, 10240, 8192, "bf16"))  # fmt: skip


def raw_dequant() -> None:
    """Replace the nibble decode by the raw word (``nibble_pair``): timing only."""

    @kaio.gpu_func
    def raw_pair(word: kaio.u32, sel: kaio.u32, scale: kaio.f16x2) -> kaio.u32:
        """The word itself."""
        return word

    _int4_hopper.nibble_pair = raw_pair


def offs(args) -> list:
    """(name, value) of the module switches of ``_int4_hopper`` that ``--off`` names
    (``PDL``, ``PSUM``: 0; ``NAME=V``: V)."""
    out = []
    for item in filter(None, args.off.split(",")):
        name, _, value = item.partition("=")
        out.append((name, int(value or 0)))
    return out


def launch_with(ops: list, config: tuple, switches: dict):
    """``launch_swap`` of ``config`` with ``_int4_hopper``'s module switches set as
    ``switches`` says (name: value)."""
    from bench.int4_wgmma import switched

    with switched(switches):
        return _int4_hopper.launch_swap(*ops, kaio.f16, config)


def points(text: str) -> list:
    """``NxK@m1/m2,...`` as [(n, k, [m, ...])]."""
    out = []
    for item in text.split(","):
        shape, _, ms = item.partition("@")
        n, k = map(int, shape.split("x"))
        out.append((n, k, [int(m) for m in ms.split("/")]))
    return out


def configs(text: str, m: int, n: int = 0, k: int = 0) -> list:
    """``a,b,...;M=c,d,...;NxK@M=e,f,...+NAME:V`` as (tuple of ints, {module switch:
    value}): every entry without ``=``, those with ``M=`` at M = ``m``, those with ``NxK@M=``
    at that point only; ``+NAME:V`` after a config: launched with ``_int4_hopper.NAME`` V."""
    out = []
    for c in text.split(";"):
        only, _, c = c.rpartition("=")
        if c and only in ("", str(m), f"{n}x{k}@{m}"):
            c, *sets = c.split("+")
            switches = {name: int(v) for name, _, v in (s.partition(":") for s in sets)}
            out.append((tuple(int(x) for x in c.split(",")), switches))
    return out


def config_name(config: tuple, switches: dict) -> str:
    """A config's key in the records: its numbers, then ``+NAME:V`` a switch."""
    return ",".join(map(str, config)) + "".join(f"+{k}:{v}" for k, v in switches.items())


def gpu_memory_fast() -> bool:
    """Whether this process's GPU takes ``_int4_hopper.swap_plan``'s plans for the faster
    memory (``_arrays.fast_memory``: an H200)."""
    return _arrays.fast_memory(operand(torch.empty(8, 8, device="cuda"), "probe"))


def routes(m: int, n: int, k: int, sms: int, fast: bool) -> dict:
    """The plans to time as routed: {"route": ``swap_plan``'s for this GPU's memory}, and on
    the faster memory, where it differs, "main": the plan of the slower memory (the H100's,
    main's route before fast-memory plans)."""
    plans = {"route": _int4_hopper.swap_plan(m, n, k, sms, fast)}
    slow = _int4_hopper.swap_plan(m, n, k, sms)
    if slow != plans["route"]:
        plans["main"] = slow
    return plans


def prewarm(args, pts: list) -> None:
    """Every ``int4_swap`` build the points will launch, compiled by ``args.prewarm``
    processes at once (kaio's disk cache and the driver's JIT cache keep them)."""
    from bench.int4_wgmma import compile_swaps

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fast = gpu_memory_fast()
    todo, plain = [], []  # the routed plans (with each --off variant), the --configs
    for n, k, ms in pts:
        for m in ms:
            plain += [(m, n, k, c, sw) for c, sw in configs(args.configs, m, n, k)]
            if m < _int4_hopper.DEQUANT_M and not args.no_route:
                todo += [(m, n, k, plan) for plan in routes(m, n, k, sms, fast).values()]
    if args.warm_tests:  # tests/test_ops_quantized.py::test_gpu_int4_wgmma's routed builds
        for m, n, k, out in TEST_POINTS:
            todo.append((m, n, k, _int4_hopper.swap_plan(m, n, k, sms, fast), out))
    variants = ({}, *({name: value} for name, value in offs(args)))
    for e in compile_swaps(todo, args.prewarm, variants, plain):
        print("prewarm:", e, flush=True)


def pass_order(keys: list, p: int) -> list:
    """The kernels' order in timed pass ``p``: cuBLAS first, the others in turn, reversed on
    odd passes (the first int4 kernel timed after cuBLAS in a pass runs slower at the
    widest products, whichever it is: alternating spreads that over all of them)."""
    rest = [k for k in keys if k != "cublas"]
    return keys[:1] + (rest if p % 2 == 0 else rest[::-1]) if keys[:1] == ["cublas"] else keys


def kernel_names(fns: dict, trace: str) -> None:
    """Each of ``fns``' kernels as the profiler saw one call of it (after one untimed call):
    name, grid, block, registers, shared memory and duration, from a chrome trace written
    to ``trace``."""
    from torch.profiler import ProfilerActivity, profile

    for key, fn in fns.items():
        fn(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(0)
            torch.cuda.synchronize()
        prof.export_chrome_trace(trace)
        events = json.load(open(trace))["traceEvents"]  # noqa: SIM115
        for e in events:
            if e.get("cat") == "kernel":
                a = e.get("args", {})
                shape = [a.get(f) for f in ("grid", "block", "registers per thread",
                                            "shared memory")]  # fmt: skip
                print(f"{key}: {e['name'][:110]} {shape} {e.get('dur')} us", flush=True)


def paired(rec: dict, key: str) -> float:
    """``key``'s speed against cuBLAS at one record: with ``--repeat``, the median over the
    passes of cuBLAS's time over ``key``'s in the same pass (neighbours in time share the
    GPU's clocks), else the ratio of the two times."""
    runs = rec.get("all", {})
    if key in runs and "cublas" in runs:
        xs = sorted(c / t for c, t in zip(runs["cublas"], runs[key], strict=True))
        return xs[len(xs) // 2]
    return rec["us"]["cublas"] / rec["us"][key]


def table(path: str) -> None:
    """The records of ``path`` (``time`` mode's ``--out``) as Markdown: cuBLAS f16 against
    each timed kernel (median µs, x cuBLAS: ``paired``), then the geometric mean of the
    route over shapes by M."""
    import math

    recs = [json.loads(line) for line in open(path)]  # noqa: SIM115
    keys = list(dict.fromkeys(k for r in recs for k in r["us"] if k != "cublas"))
    print("| N x K | M | cuBLAS f16 µs | " + " | ".join(f"{k} µs (x cuBLAS)" for k in keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    by_m: dict = {}
    for r in recs:
        base = r["us"].get("cublas")
        cells = []
        for k in keys:
            t = r["us"].get(k)
            ok = isinstance(t, float) and isinstance(base, float)
            x = paired(r, k) if ok else 0.0
            cells.append(f"{t:.1f} ({x:.2f}x)" if ok else str(t or "")[:40])
            if ok and k == "route":
                by_m.setdefault(r["m"], []).append(x)
        shown = f"{base:.1f}" if isinstance(base, float) else str(base)
        print(f"| {r['n']}x{r['k']} | {r['m']} | {shown} | " + " | ".join(cells) + " |")
    for m, xs in sorted(by_m.items()):
        geo = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"M {m}: route {geo:.3f}x cuBLAS (geomean of {len(xs)}; {min(xs):.2f}-{max(xs):.2f})")


def main() -> None:
    if sys.argv[1:2] == ["table"]:
        table(sys.argv[2])
        return
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("time", "prof", "names"))
    p.add_argument("--points", required=True)
    p.add_argument("--configs", default="")
    p.add_argument("--raw", action="store_true")
    p.add_argument("--no-route", action="store_true")
    p.add_argument("--kmm", action="store_true", help="also kaio_ops.matmul on the f16 weight")
    p.add_argument("--dequant", action="store_true", help="also the dequantize-once path")
    p.add_argument("--off", default="", help="the route, switches 0 (or =V): PDL,HEAD=0")
    p.add_argument("--out", default="")
    p.add_argument("--prewarm", type=int, default=0, help="compile in N processes first")
    p.add_argument("--warm-tests", action="store_true", help="--prewarm: the GPU tests' too")
    p.add_argument("--prewarm-only", action="store_true", help="compile, time nothing")
    p.add_argument("--tag", default="")
    p.add_argument("--repeat", type=int, default=1, help="timed passes over the kernels, median")
    args = p.parse_args()
    if args.raw:
        raw_dequant()
    t0 = time.time()
    if args.raw:  # the prewarm's workers build the undecoded kernel too
        os.environ["INT4_RAW"] = "1"
    if args.prewarm:
        prewarm(args, points(args.points))
        print(json.dumps({"prewarm_s": round(time.time() - t0, 1)}), flush=True)
    if args.prewarm_only:
        return
    sink = open(args.out, "a") if args.out else None  # noqa: SIM115
    f16 = torch.float16
    fast = gpu_memory_fast()
    print(json.dumps({"fast_memory": fast}), flush=True)
    for n, k, ms in points(args.points):
        sets = 1 if args.mode != "time" else max(2, min(24, -(-L2_BYTES // int4_bytes(n, k))))
        weights = [int4_inputs(1, n, k)[1:] for _ in range(sets)]
        for m in ms:
            a = torch.randn(m, k, device="cuda", dtype=f16)
            cfgs = configs(args.configs, m, n, k)
            ops = [[operand(x, "x") for x in (a, w[0], w[1])] for w in weights]
            ref = a.float() @ weights[0][2].float()
            fns = {"cublas": lambda i: torch.matmul(a, weights[i][2])}
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            plans = routes(m, n, k, sms, fast)
            if not args.no_route:
                fns["route"] = lambda i: kaio_ops.matmul_int4(a, *weights[i][:2], out_dtype=f16)
                if "main" in plans:  # main's route, the slower memory's plan
                    fns["main"] = lambda i, p=plans["main"]: launch_with(ops[i], p, {})
            for name, value in offs(args):  # the routed plan, a switch set (read anew)
                plan = _int4_hopper.swap_plan(m, n, k, sms, fast)
                fns[f"route {name}{value}"] = lambda i, name=name, value=value, plan=plan: (
                    launch_with(ops[i], plan, {name: value})
                )
            if args.kmm:
                fns["kaio f16"] = lambda i: kaio_ops.matmul(a, weights[i][2], out_dtype=f16)
            if args.dequant:
                fns["dequant"] = lambda i: _int4_hopper.dequantized(*ops[i], kaio.f16)
            for c, sw in cfgs:
                fns[config_name(c, sw)] = lambda i, c=c, sw=sw: launch_with(ops[i], c, sw)
            if args.mode == "names":
                print(f"{n}x{k} M={m}", flush=True)
                kernel_names(fns, (args.out or "trace") + ".json")
                continue
            if args.mode == "prof":
                for fn in fns.values():
                    fn(0)
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("prof")
                for fn in fns.values():
                    fn(0)
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
                continue
            rec = {"n": n, "k": k, "m": m, "tag": args.tag, "us": {}, "err": {}, "res": {}}
            routed = [(p, {}) for p in plans.values()] if m < _int4_hopper.DEQUANT_M else []
            rec["plans"] = {key: config_name(p, {}) for key, p in plans.items()}
            for c, sw in cfgs + routed:
                try:
                    consts = swap_consts(m, n, k, c, sms, sw)
                    res = _int4_hopper.int4_swap.resources(**consts)
                    rec["res"][config_name(c, sw)] = str(res)
                except Exception as e:  # noqa: BLE001
                    rec["res"][config_name(c, sw)] = f"{type(e).__name__}: {str(e)[:200]}"
            for key, fn in list(fns.items()):
                try:
                    got = fn(0).float()
                    rec["err"][key] = float(((got - ref).norm() / ref.norm()).item())
                except Exception as e:  # noqa: BLE001
                    rec["us"][key] = f"{type(e).__name__}: {str(e)[:300]}"
                    del fns[key]
            runs: dict = {key: [] for key in fns}
            for p in range(args.repeat):  # interleaved: every kernel once a pass
                for key in pass_order(list(fns), p):
                    runs[key].append(graph_time(fns[key], sets))
            for key, ts in runs.items():
                rec["us"][key] = sorted(ts)[len(ts) // 2]
                if args.repeat > 1:
                    rec.setdefault("all", {})[key] = [round(t, 2) for t in ts]
            rec["t"] = round(time.time() - t0, 1)
            line = json.dumps(rec)
            print(line, flush=True)
            if sink:
                sink.write(line + "\n")
                sink.flush()
        weights = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
