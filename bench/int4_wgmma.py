"""``matmul_int4`` (W4A16) on sm_90 against cuBLAS f16 (``torch.matmul`` with the dequantized
f16 weight) over M at Llama-3 shapes: kernel time from CUDA graphs of ``REPS`` calls (the
weights rotated over copies so that they do not sit in L2), the median of ``REPLAYS`` replays.

Default: results checked against an f32 torch reference at real sizes, then the 8B sweep.
``--swap``: the op as routed at each (N x K, M) of ``--shapes`` / ``--ms`` (f16 out, as
cuBLAS), every result checked; with ``--variants`` a second pass over the same points times
explicit ``int4_swap`` tile configurations (``swap_variants``) and, from 2048 rows, the
dequantize-once path (the f16 weight made by ``kaio_ops._prefill``, then ``kaio_ops.matmul``)
to re-derive ``_int4_hopper.SWAP_PLANS``. ``--table FILE`` writes the Markdown tables.
``--variants-only``: no routed pass, every variant of a point in one pass beside cuBLAS timed
at that point; ``--variants-json FILE`` replaces ``swap_variants``' lists (M as text, or
"*", to a list of ``(WG, BM, CL, split, STAGES, MC, WSTAGES[, BUFS])`` or ``["decode",
WARPS]``); ``--trace`` prints each step as it starts and ``--watchdog S`` dumps every
thread's stack and exits after S seconds (a kernel that hangs shows where).

Usage: ``python bench/int4_wgmma.py [--out DIR] [--budget SECONDS] [--ms 16,64,...]
[--swap [--variants | --variants-only] [--variants-json FILE] [--shapes 4096x4096@16/64,...]
[--prewarm N] [--table FILE] [--trace] [--watchdog S]]``. Writes ``DIR/int4_wgmma.jsonl``
(one JSON object a measurement) and prints a table.
"""

# ruff: noqa: B023  (the timed lambdas run before the loop moves on)
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
import kaio_ops  # noqa: E402
from bench.quantized import int4_inputs, read_only  # noqa: E402
from kaio_ops import _arrays, _int4_decode, _int4_hopper, _prefill  # noqa: E402

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K)
MS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SETS = 4
REPS = 10
REPLAYS = 5
T0 = time.time()
CHECKS = (  # (M, N, K, out_dtype)
    (300, 4096, 4096, None),
    (64, 14336, 4096, None),
    (2048, 4096, 14336, None),
    (8192, 4096, 4096, None),
    (100, 4104, 4096, "float16"),
    (24, 4096, 4096, "bfloat16"),
)


def graph_time(fn, sets: int) -> float:
    """Microseconds per call of ``fn(i)`` (i = 0 .. sets - 1 in turn): a CUDA graph of
    ``REPS`` calls, the median of ``REPLAYS`` timed replays (negative: eager calls between
    events, if the capture failed)."""
    try:
        return _graph_time(fn, sets)
    except Exception as e:  # noqa: BLE001
        print("graph capture failed:", type(e).__name__, str(e)[:300], flush=True)
        torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for r in range(REPS):
            fn(r % sets)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / REPS)
    return -sorted(times)[len(times) // 2]


def _graph_time(fn, sets: int) -> float:
    """``graph_time`` through a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(REPS):
            fn(r % sets)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / REPS)
    return sorted(times)[len(times) // 2]


def operand(x, name):
    """``x`` as a checked ``_arrays.Operand`` (for direct kernel launches)."""
    types = (kaio.f16, kaio.i32, kaio.u32, kaio.f32)
    return _arrays.Inputs("bench").array(x, name, ndim=2, dtypes=types, form="[R, C]")


def check(log, m: int, n: int, k: int, out_dtype=None) -> None:
    """matmul_int4 against the f32 product of the dequantized weights (TF32 off)."""
    a, packed, scales, w = int4_inputs(m, n, k)
    ref = a.float() @ w.float()
    got = kaio_ops.matmul_int4(a, packed, scales, out_dtype=out_dtype).float()
    err = ((got - ref).norm() / ref.norm()).item()
    path = (
        "wgmma" if _int4_hopper.takes(*(operand(x, "x") for x in (a, packed, scales))) else "other"
    )
    log({"check": [m, n, k], "out": str(out_dtype), "rel_err": err, "path": path,
         "nan": bool(got.isnan().any())})  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--budget", type=float, default=80.0)
    p.add_argument("--ms", default=",".join(map(str, MS)))
    p.add_argument("--swap", action="store_true", help="the role-swap kernel's sweep only")
    p.add_argument("--routed", action="store_true", help="(kept for old command lines)")
    p.add_argument("--variants", action="store_true", help="--swap: then tile variants")
    p.add_argument("--table", default="", help="--swap: write the Markdown tables here")
    p.add_argument("--markdown", default="", help="print --swap's JSONL file as a table, no GPU")
    p.add_argument("--shapes", default="", help="N x K list for --swap, e.g. 4096x4096,8192x8192")
    p.add_argument(
        "--variants-only", action="store_true", help="--variants without the routed pass"
    )
    p.add_argument("--variants-json", default="", help="--variants: M -> variants (JSON file)")
    p.add_argument("--watchdog", type=float, default=0, help="dump the stacks and exit after S s")
    p.add_argument("--trace", action="store_true", help="log each step as it starts")
    p.add_argument(
        "--prewarm", type=int, default=0, help="compile --swap's kernels first in N processes"
    )
    args = p.parse_args()
    if args.markdown:
        markdown(args.markdown)
        return
    if args.watchdog:  # a hang (a kernel, a compile) shows where it is, not just a timeout
        import faulthandler

        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    TRACE[0] = args.trace
    if args.variants_json:
        with open(args.variants_json) as f:
            VARIANTS.update(json.load(f))
    torch.backends.cuda.matmul.allow_tf32 = False
    ms = [int(x) for x in args.ms.split(",")]
    path = os.path.join(args.out, "int4_wgmma.jsonl")
    sink = open(path, "w")  # noqa: SIM115

    def log(rec):
        rec["t"] = round(time.time() - T0, 1)
        print(json.dumps(rec), flush=True)
        sink.write(json.dumps(rec) + "\n")
        sink.flush()

    log(
        {
            "gpu": torch.cuda.get_device_name(),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        }
    )
    if args.swap:
        shapes = [shape_ms(x, ms) for x in args.shapes.split(",") if x]
        shapes = shapes or [(n, k, ms) for n, k in SWAP_SHAPES]
        if args.prewarm:
            prewarm(log, shapes, args.prewarm, args.variants or args.variants_only)
        recs = [] if args.variants_only else swap_sweep(log, shapes, args.budget, False)
        if args.variants_only:  # every variant of a point together, multicast or not
            recs += swap_sweep(log, shapes, args.budget, True, multicast=None)
        elif args.variants:  # the multicast pairs last (a cluster's first timing on a GPU)
            recs += swap_sweep(log, shapes, args.budget, True)
            recs += swap_sweep(log, shapes, args.budget, True, multicast=True)
        text = swap_tables(recs, torch.cuda.get_device_name())
        if args.table:
            with open(args.table, "w") as f:
                f.write(text)
        print(text)
        return
    for case in CHECKS:
        check(log, *case)
    rows = []
    weights = {}
    for n, k in SHAPES:
        weights[n, k] = [int4_inputs(1, n, k)[1:] for _ in range(SETS)]  # (packed, scales, w)
        for m in ms:
            if time.time() - T0 > args.budget:
                log({"skipped": [m, n, k]})
                continue
            rows.append(measure(log, m, n, k, weights[n, k]))
    table(rows)


def measure(log, m: int, n: int, k: int, sets: list) -> dict:
    """cuBLAS f16, matmul_int4 and (M <= 64) the decode kernel at one shape."""
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    t_cublas = graph_time(lambda i: torch.matmul(a, sets[i][2]), SETS)
    t_kaio = graph_time(lambda i: kaio_ops.matmul_int4(a, sets[i][0], sets[i][1]), SETS)
    t_f16 = graph_time(
        lambda i: kaio_ops.matmul_int4(a, sets[i][0], sets[i][1], out_dtype=torch.float16), SETS
    )
    sms = _arrays.multiprocessors(operand(a, "a"))
    rec = {"m": m, "n": n, "k": k, "cublas_us": t_cublas, "kaio_us": t_kaio, "kaio_f16_us": t_f16,
           "plan": list(_int4_hopper.swap_plan(m, n, k, sms)), "sms": sms}  # fmt: skip
    ops = [[operand(x, "x") for x in (a, s[0], s[1])] for s in sets]
    if m <= _int4_decode.MAX_M:
        rec["decode_us"] = graph_time(lambda i: _int4_decode.matmul(*ops[i]), SETS)
    if m >= 512:  # the path this kernel replaces: the weights made f16, then the f16 matmul
        rec["prefill_us"] = graph_time(lambda i: _prefill.matmul_int4(*ops[i]), SETS)
    log(rec)
    return rec


def table(rows: list) -> None:
    """The summary: cuBLAS f16 against matmul_int4 (and the decode kernel)."""
    head = f"{'N x K':>12} {'M':>5} {'cuBLAS us':>10} {'kaio us':>9} {'ratio':>6} {'other':>7}"
    print("\n" + head + "  (other: the decode kernel at M <= 64, dequantize + f16 matmul past)")
    for r in rows:
        other = r.get("decode_us", r.get("prefill_us"))
        other = f"{other:7.1f}" if other is not None else ""
        print(f"{r['n']:>5}x{r['k']:<6} {r['m']:>5} {r['cublas_us']:10.1f} {r['kaio_us']:9.1f} "
              f"{r['cublas_us'] / r['kaio_us']:6.2f} {other}")  # fmt: skip


SWAP_SHAPES = ((4096, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (57344, 8192),
               (8192, 28672))  # fmt: skip
L2_BYTES = 200 << 20  # the int4 bytes a rotation covers: 4x the 50 MB L2


TRACE = [False]  # --trace: print each step of swap_sweep as it starts


def trace(*what) -> None:
    """With ``--trace``, the step about to run and the seconds since start."""
    if TRACE[0]:
        print(f"[{time.time() - T0:6.1f}s]", *what, flush=True)


VARIANTS: dict = {}  # --variants-json: M (as text, or "*") -> the variants to time there


def swap_variants(m: int) -> list:
    """(WG, BM, CL, split, STAGES, MC, WSTAGES[, BUFS]) tile configurations of
    ``_int4_hopper.int4_swap`` to time at M = ``m`` besides the plan's (``matmul_int4``)
    (CL: a K split summed in a cluster, else by a second launch; split 0: ``swap_split``'s;
    STAGES 0: as many as fit; MC: pairs of tiles sharing a's rows by multicast; WSTAGES: the
    words' ring stages (0: as many as fit); BUFS: fragment buffers, 2 if left
    out). ``--variants-json`` replaces the lists below."""
    if VARIANTS:
        return [tuple(v) for v in VARIANTS.get(str(m), VARIANTS.get("*", []))]
    if m <= 16:  # the decode kernel's range
        return []
    bm = min(256, -(-m // 8) * 8)
    if m <= 64:
        return [(4, bm, 0, 0, 0, 0, 0), (2, bm, 0, 0, 0, 0, 0)]
    if m <= 128:
        return [(2, 128, 0, 0, 0, 0, 0), (2, 128, 1, 0, 0, 0, 0)]
    if m <= 256:
        return [(2, 256, 0, 0, 0, 1, 0), (2, 128, 1, 0, 0, 0, 0), (2, 128, 0, 0, 0, 0, 0)]
    if m <= 512:
        return [(2, 256, 1, 0, 0, 0, 0), (2, 256, 0, 0, 0, 1, 0)]
    return [(2, 256, 0, 0, 0, 1, 0), (2, 192, 0, 0, 0, 1, 0)]


def variant_key(
    wg: int, bm: int, cl: int, sp: int, stages: int, mc: int = 0, wstages=0, bufs=2
) -> str:
    """A ``swap_variants`` entry as text: ``WG,BM,CL[,split S][,stages S][,mc][,wW][,bB]``."""
    return (
        f"{wg},{bm},{cl}" + (f",split {sp}" if sp else "") + (f",stages {stages}" * bool(stages))
        + ",mc" * mc + (f",w{wstages}" if wstages else "") + (f",b{bufs}" if bufs != 2 else "")
    )  # fmt: skip


def as_config(v: tuple) -> tuple:
    """A ``swap_variants`` entry as ``launch_swap``'s config (WG, BM, STAGES, split, CL, MC,
    WSTAGES, BUFS)."""
    wg, bm, cl, sp, st, mc, wstages, *bufs = v
    return (wg, bm, st, sp, cl, mc, wstages, bufs[0] if bufs else 2)


def _warm(consts: dict) -> str:
    """Compile one ``int4_swap`` specialization into the disk cache (a worker process;
    ``INT4_RAW`` set: ``bench/int4_w35.py --raw``'s undecoded build)."""
    if os.environ.get("INT4_RAW"):
        from bench.int4_w35 import raw_dequant

        raw_dequant()
    try:
        _int4_hopper.int4_swap.resources(**{**consts, "OUT": getattr(kaio, consts["OUT"])})
        return ""
    except Exception as e:  # noqa: BLE001
        return f"{consts}: {type(e).__name__}: {str(e)[:200]}"


def shape_ms(text: str, ms: list) -> tuple:
    """(N, K, Ms) from ``NxK`` (the Ms of --ms) or ``NxK@m1/m2/...``."""
    shape, _, own = text.partition("@")
    n, k = map(int, shape.split("x"))
    return n, k, [int(m) for m in own.split("/")] if own else ms


def prewarm(log, shapes, workers: int, variants: bool = True) -> None:
    """Every ``int4_swap`` specialization that ``swap_sweep`` and ``matmul_int4`` will launch,
    compiled into the disk cache by ``workers`` processes at once (a new process then loads
    each cubin without compiling)."""
    points = []
    for n, k, ms in shapes:
        for m in ms:
            configs = (
                [as_config(v) for v in swap_variants(m) if v[0] != "decode"] if variants else []
            )
            if m > _int4_hopper.DECODE_M:
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                configs.append(_int4_hopper.swap_plan(m, n, k, sms))
            points += [(m, n, k, cfg) for cfg in configs]
    t = time.time()
    errors = compile_swaps(points, workers)
    log({"prewarm": len(points), "seconds": round(time.time() - t, 1), "errors": errors[:5]})


@contextlib.contextmanager
def switched(switches: dict):
    """``_int4_hopper``'s module switches (name: value) set inside the block."""
    before = {name: getattr(_int4_hopper, name) for name in switches}
    for name, value in switches.items():
        setattr(_int4_hopper, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(_int4_hopper, name, value)


def swap_consts(m: int, n: int, k: int, config: tuple, sms: int, switches: dict) -> dict:
    """``int4_swap``'s constexprs for ``config`` at ``m x n x k`` (f16 out) with
    ``_int4_hopper``'s module ``switches`` set, as ``launch_swap`` reads them."""
    with switched(switches):
        return _int4_hopper.swap_launch_plan(m, n, k, config, sms, kaio.f16)[3]


def compile_swaps(points: list, workers: int, variants: tuple = ({},), plain: list = ()) -> list:
    """Compile ``int4_swap`` for every ``(m, n, k, config[, out])`` of ``points`` (``out``
    the output type's name, f16 if left out), once with each of ``variants`` (module
    switches of ``_int4_hopper``: ``swap_consts``; {} for none), and every ``(m, n, k,
    config, switches)`` of ``plain``, in ``workers`` processes at once; the errors, as
    text."""
    import concurrent.futures
    import multiprocessing

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    todo = {}
    builds = [(p, v) for p in points for v in variants] + [(p[:4], p[4]) for p in plain]
    for (m, n, k, cfg, *out), v in builds:
        consts = swap_consts(m, n, k, cfg, sms, v)
        consts["OUT"] = out[0] if out else "f16"
        todo[str(sorted(consts.items()))] = consts
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return [e for e in pool.map(_warm, todo.values()) if e]


def swap_sweep(log, shapes, budget: float, variants: bool = False, multicast=False) -> list:
    """Without ``variants``: cuBLAS f16 against ``matmul_int4`` as routed (f16 out, as cuBLAS),
    checked against the f32 product (relative error), and at M <= 16 the floor that only reads
    the words; with ``variants``: ``swap_variants``' explicit ``int4_swap`` configurations,
    (M <= 64) the decode kernel and (M >= 2048) the dequantize-once path, each checked the
    same way (``multicast``: the variants with MC only, else those without; None: all of
    them, after cuBLAS f16 at the same point). The int4 words
    rotated over enough sets to cover ``L2_BYTES``. Returns the records."""
    from bench.quantized import int4_bytes

    recs = []
    for n, k, ms in shapes:
        if time.time() - T0 > budget:
            log({"skipped": [n, k, ms, variants]})
            continue
        sets = max(2, min(24, -(-L2_BYTES // int4_bytes(n, k))))
        trace("weights", n, k, sets)
        weights = [int4_inputs(1, n, k)[1:] for _ in range(sets)]
        for m in ms:
            if time.time() - T0 > budget:
                log({"skipped": [m, n, k, variants]})
                continue
            trace("point", m, n, k, "variants" if variants else "routed")
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ops = [[operand(x, "x") for x in (a, s[0], s[1])] for s in weights]
            ref = a.float() @ weights[0][2].float()
            rec = {"m": m, "n": n, "k": k, "sets": sets}
            f16 = torch.float16
            if not variants:
                trace("cublas")
                rec["cublas_us"] = graph_time(lambda i: torch.matmul(a, weights[i][2]), sets)
                trace("check", m, n, k)
                try:
                    got = kaio_ops.matmul_int4(a, weights[0][0], weights[0][1], out_dtype=f16)
                    rec["kaio_err"] = ((got.float() - ref).norm() / ref.norm()).item()
                    trace("time")
                    rec["kaio_us"] = graph_time(
                        lambda i: kaio_ops.matmul_int4(a, *weights[i][:2], out_dtype=f16), sets
                    )
                    if m <= 16:  # the decode kernel's range: the floor that only reads the words
                        floor = [read_only(w[0]) for w in weights]
                        rec["floor_us"] = graph_time(
                            lambda i: floor[i](None, weights[i][0], None, None), sets
                        )
                except Exception as e:  # noqa: BLE001
                    rec["kaio_failed"] = f"{type(e).__name__}: {str(e)[:300]}"
                log(rec)
                recs.append(rec)
                continue
            rec["swap"], rec["err"] = {}, {}
            variants, mc = swap_variants(m), multicast
            if mc is None and any(v[0] != "decode" for v in variants):  # the peer, this run
                rec["cublas_us"] = graph_time(lambda i: torch.matmul(a, weights[i][2]), sets)
            todo = [
                (variant_key(*v), v)
                for v in variants
                if v[0] != "decode" and (mc is None or v[5] == mc)
            ]
            if not multicast:  # ("decode", WARPS): the decode kernel with that many warps a block
                todo += [(f"decode kernel, {v[1]} warps", v) for v in variants if v[0] == "decode"]
            if not multicast and _int4_hopper.DECODE_M < m <= _int4_decode.MAX_M:
                todo.append(("decode kernel", "decode"))
            if not multicast and m >= 2048:
                todo.append(("dequantize + matmul", None))
            if not todo:
                continue
            for key, v in todo:
                if time.time() - T0 > budget:
                    break
                if v == "decode":

                    def fn(i):
                        return _int4_decode.matmul(*ops[i], kaio.f16)

                elif v is None:

                    def fn(i):
                        w16 = _prefill.int4_to_f16(ops[i][0], [(ops[i][1], ops[i][2])])
                        return kaio_ops.matmul(a, w16)
                elif v[0] == "decode":

                    def fn(i, w=v[1]):
                        return _int4_decode.matmul(*ops[i], kaio.f16, warps=w)

                else:
                    config = as_config(v)

                    def fn(i, c=config):
                        return _int4_hopper.launch_swap(*ops[i], kaio.f16, c)

                try:
                    trace("variant", key)
                    rec["err"][key] = ((fn(0).float() - ref).norm() / ref.norm()).item()
                    rec["swap"][key] = graph_time(fn, sets)
                except Exception as e:  # noqa: BLE001
                    rec["swap"][key] = f"{type(e).__name__}: {str(e)[:200]}"
            log(rec)
            recs.append(rec)
        weights = None
        torch.cuda.empty_cache()
    return recs


def swap_tables(recs: list, gpu: str) -> str:
    """Markdown: the routed op against cuBLAS f16 at each point, then (records of the variant
    pass) every variant's time and its ratio to cuBLAS, the best marked."""
    cublas = {(r["m"], r["n"], r["k"]): r["cublas_us"] for r in recs if "cublas_us" in r}
    lines = [f"matmul_int4 as routed on {gpu} (f16 out, µs, CUDA graphs, L2 rotated)", "",
             "| N x K | M | cuBLAS f16 µs | matmul_int4 µs | x cuBLAS | rel err |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        if "cublas_us" in r and "kaio_us" in r:
            lines.append(
                f"| {r['n']}x{r['k']} | {r['m']} | {r['cublas_us']:.1f} | {r['kaio_us']:.1f} | "
                f"{r['cublas_us'] / r['kaio_us']:.2f}x | {r.get('kaio_err', 0):.1e} |"
            )
        elif "cublas_us" in r:
            lines.append(f"| {r['n']}x{r['k']} | {r['m']} | {r['cublas_us']:.1f} | failed: "
                         f"{r.get('kaio_failed', '')[:80]} | | |")  # fmt: skip
    lines += ["", "Variants (WG, BM, CL[, split][, stages]): µs (x cuBLAS), best first", "",
              "| N x K | M | variants |", "|---|---|---|"]  # fmt: skip
    for r in recs:
        if "swap" not in r:
            continue
        base = cublas.get((r["m"], r["n"], r["k"]))
        timed = sorted((t, key) for key, t in r["swap"].items() if isinstance(t, float))
        cells = [f"{key}: {t:.1f}" + (f" ({base / t:.2f}x)" if base else "") for t, key in timed]
        cells += [f"{key}: {t[:60]}" for key, t in r["swap"].items() if not isinstance(t, float)]
        lines.append(f"| {r['n']}x{r['k']} | {r['m']} | {'; '.join(cells)} |")
    return "\n".join(lines) + "\n"


def markdown(path: str) -> None:
    """The ``--swap`` records of ``path`` as a Markdown table: cuBLAS f16 against
    ``matmul_int4`` (f16 out) and, at M <= 16, the floor that only reads the words."""
    print("| N x K | M | cuBLAS f16 µs | matmul_int4 µs | x cuBLAS | floor µs | x floor | "
          "best int4_swap variant µs (WG, BM, CL) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for line in open(path):  # noqa: SIM115
        r = json.loads(line)
        if "kaio_us" not in r:
            continue
        best = min(((t, v) for v, t in r.get("swap", {}).items() if isinstance(t, float)),
                   default=None)  # fmt: skip
        floor = r.get("floor_us")
        extra = f"{floor:.1f} | {floor / r['kaio_us']:.2f}x" if floor else "– | –"
        best = f"{best[0]:.1f} ({best[1]})" if best else "–"
        print(f"| {r['n']}x{r['k']} | {r['m']} | {r['cublas_us']:.1f} | {r['kaio_us']:.1f} | "
              f"{r['cublas_us'] / r['kaio_us']:.2f}x | {extra} | {best} |")  # fmt: skip


if __name__ == "__main__":
    main()
