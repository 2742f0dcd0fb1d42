"""The sm_90 FP8 kernel's tile plans side by side with ``torch._scaled_mm`` (cuBLAS FP8):
for each shape, every plan ``(WG, BN, STAGES, PROMOTE, VEC[, CL[, SPLIT]])`` of
``kaio_ops._fp8_hopper`` worth trying there, and the plan ``config`` picks, each checked
against ``torch._scaled_mm`` first; kernel time with CUDA events (``--timing``), the
operands rotated over enough copies to exceed the L2 cache three times; e4m3, bf16 out,
per-tensor scales (``--rowwise``: per row / column).

Usage: ``python bench/fp8_plans.py --out DIR [--budget SECONDS] [--cases warm,big,sweep]``
(``--summary FILE``: the table of a run's jsonl). Cases: ``mem`` the routed plans at the
``--ms`` over the ``--models``' shapes, beside the other memory speed's route (``OTHER``)
where it differs; ``warm`` compiles every plan first,
14 processes at once (with ``only``: nothing else); ``final`` the routed plan at 4096^3,
8192^3 and 4096^3 with per-row scales; ``wide``, ``depth``, ``epi``, ``big``, ``regs``,
``interval``, ``cluster``, ``rowwise``, ``acc``, ``diag``: the plan lists of their rounds at
the squares; ``ksweep`` (``kdec``: at 8 rows) the routed plan over K; ``carry``
(``carrysq``: the squares only) the routed tiles with the next tile's first slice carried
over the epilogue; ``midsplit`` wide tiles split along K at 128 and 256
rows; ``sweep``, ``sweepnew``, ``sweepwide``, ``sweepfinal``: the M sweep over the
Llama-3-8B/-70B shapes with ``plans_for``'s, ``SWEEP_WIDE``'s (``with_splits``) or
``final_plans``' alternatives (``pick``: none from ``plans_for``; ``sweepbefore``: the
routing before this branch, ``BEFORE``); ``decgrid`` the decode
plans of ``decode_plans`` at ``DECODE_SHAPES`` (the ``--ms`` up to 64) with the weight-read
floor (``copy_bandwidth``); ``bands`` ``band_plans`` at ``BAND_SHAPES`` (``allshapes``: the
8), ``names`` the kernels cuBLAS and kaio launch at the ``--ms`` over the ``--models``'
shapes (each one's grid, block, cluster and shared memory), ``rings`` ``ring_plans`` at
``RING_SHAPES``, ``one`` one row at the 8 shapes against ``gemv_fp8``, ``clk`` the 128 x 208
tile alone and in clusters of two with each epilogue at K = 1024 and 2048, ``squares``
``SQUARE_PLANS`` at 4096^3 and 8192^3, ``widths`` ``without_200`` at ``WIDTH_CASES``,
``paired`` ``paired_plans`` at ``BAND_SHAPES``, ``ns`` ``ns_plans`` (two consumer
warpgroups on a 64-row tile) up to 256 rows, ``nsroute`` the routed plans against
``unshared``'s, ``once`` one call of cuBLAS and kaio at the ``--ms`` over the ``--models``'
shapes (for ncu), ``gaps``
the kernels' spans and gaps at ``GAP_CASES``, ``pdl`` the routed plans with and without
programmatic dependent launch at ``PDL_CASES`` (``pdlsweep``: at the ``--ms`` up to
``SWAP_M`` over the models' shapes), ``alt`` ``alternate_plans`` (two warpgroups on every
other K slice), ``vsmain`` the
routed plans against main's routing (``main_plan``). Writes ``DIR/fp8_plans.jsonl`` (one line
per case) and prints a table. The sweep stops starting cases once ``--budget`` seconds have
passed. ``cold`` (``cold2``, ``cold3``, ``cold4``): ``cold_plans`` (``cold2_plans``,
``cold3_plans``, ``cold4_plans``) beside the routed plan; ``tiles``: ``tile_plans`` (every
wide tile, split or not) beside it past 256 rows; ``waits``, ``depths``, ``mids``,
``arows``: ``wait_plans`` (the narrow tiles with two slice sums in turn), ``depth_plans``,
``mid_tile_plans``, ``arow_plans`` beside it; ``h200`` (``h200b``): ``h200_plans`` (the
faster memory's alternatives) beside it at the cases of ``H200_SETS``; ``spans``: a call's
kernel time and the rest (``percall_spans``) at ``SPAN_CASES``.
``--timing``: ``percall`` (the default) times each call as bench/fp8.py does, the issue's
figure (``percall_times``: its own pair of events, as many input sets as bench/fp8.py
rotates); ``batched`` (every figure before 2026-11-27's cold pass) times batches of calls
back to back, where a kernel launched with programmatic dependent launch overlaps the end
of the one before it and no call pays the launch and ramp that a call between events
does."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
import traceback


def summary(path) -> None:
    """A table of a run's ``fp8_plans.jsonl``: each case's cuBLAS time and each plan's speed
    against it (x), then per plan the geometric mean over the sweep cases it ran in."""
    recs = [json.loads(line) for line in open(path)]  # noqa: SIM115
    per_plan: dict = {}
    for r in recs:
        if "cublas_us" not in r:
            print(r["case"], {k: v for k, v in r.items() if isinstance(v, dict)})
            continue
        xs = {k: v for k, v in r.items() if isinstance(v, dict) and "x" in v}
        row = " ".join(f"{k}={v['x']:.3f}" for k, v in sorted(xs.items(), key=lambda i: -i[1]["x"]))
        print(f"{r['case']:>20} cublas {r['cublas_us']:8.1f}us best {r.get('best')} | {row}")
        if r["case"].startswith("M="):
            for k, v in xs.items():
                per_plan.setdefault(k, []).append(v["x"])
            if r.get("best"):
                per_plan.setdefault("best", []).append(r[r["best"]]["x"])
    for k, xs in sorted(per_plan.items(), key=lambda i: -len(i[1])):
        geo = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"{k:>22}: geomean {geo:.3f}x over {len(xs)} cases ({min(xs):.2f}..{max(xs):.2f})")


if __name__ == "__main__" and sys.argv[1:2] == ["--summary"]:  # no torch needed
    summary(sys.argv[2])
    sys.exit(0)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.fp8 import PADS, scaled_mm  # noqa: E402
from bench.harness import Harness  # noqa: E402
from kaio_ops import _fp8_decode as D  # noqa: E402
from kaio_ops import _fp8_hopper as H  # noqa: E402
from kaio_ops import _plan  # noqa: E402

T = importlib.import_module("kaio.tensormap")  # (kaio.tensormap is also the annotation type)


def gpu_memory_is_fast() -> bool:
    """Whether this process's GPU takes the faster memory's routes (``_arrays.fast_memory``:
    an H200, not an H100)."""
    from kaio_ops import _arrays

    x = _arrays.Inputs("fp8_plans").array(torch.empty(16, device="cuda"), "x", ndim=1)
    return _arrays.fast_memory(x)


FAST = torch.cuda.is_available() and gpu_memory_is_fast()


def routed(m, n, k, sms=132):
    """The plan ``matmul_fp8`` routes an ``m x n x k`` product to on this GPU (``FAST``)."""
    return H.config(m, n, k, sms, FAST)


def other_route(m, n, k, sms=132):
    """The plan of a GPU of the other memory speed (``OTHER``: the H100's on an H200)."""
    return H.config(m, n, k, sms, not FAST)


E4M3 = torch.float8_e4m3fn
SHAPES = {
    "8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
}


def operands(m, n, k, rowwise, sets):
    """``sets`` copies of (a, b column-major, scale_a, scale_b), quantized by torch."""
    out = []
    for _ in range(sets):
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda") * 0.02
        if rowwise:
            sa = x.abs().amax(-1, keepdim=True) / 448.0
            sw = w.abs().amax(-1, keepdim=True).reshape(1, n) / 448.0
        else:
            sa = x.abs().amax().reshape(1) / 448.0
            sw = w.abs().amax().reshape(1) / 448.0
        a = (x / sa).to(E4M3)
        b = (w / sw.reshape(-1, 1) if rowwise else w / sw).to(E4M3).t()
        out.append((a, b, sa.float(), sw.float()))
        del x, w
    return out


def prepare(fn, sets, target_ms=3.0):
    """(batch, host ms) for timing ``fn``: warmed up, its host time per call (an upper bound
    on enqueue time) and the calls a batch needs to last about ``target_ms``."""
    for s in sets[:2]:
        fn(*s)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(3):
        fn(*sets[i % len(sets)])
    host_ms = (time.perf_counter() - t0) / 3 * 1e3
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    fn(*sets[0])
    e1.record()
    torch.cuda.synchronize()
    once = max(e0.elapsed_time(e1), 1e-3)
    return max(len(sets), min(200, int(target_ms / once) + 1)), host_ms


def one_batch(fn, sets, batch, host_ms):
    """ms per call of one batch of calls in a row (inputs rotated), CUDA events around it,
    enqueued behind a GPU spin long enough that host time never shows."""
    torch.cuda._sleep(int((1.5 * host_ms * batch + 0.2) * 2e6))
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(batch):
        fn(*sets[i % len(sets)])
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / batch


ROUNDS = [5]  # time_all's rounds (--rounds)
TIMING = ["percall"]  # time_all's way (--timing): "percall" or "batched"
HARNESS = Harness("fp8_plans")  # bench/fp8.py's timing (percall) and its count of input sets


def input_sets(m, n, k, rowwise=False):
    """The operand sets a case rotates over: as many as bench/fp8.py makes (``bench.harness``:
    ~3x the L2 in all, so that no call finds its weight in the L2)."""
    return operands(m, n, k, rowwise, HARNESS.sets_for(m * k + k * n + 2 * m * n))


def percall_times(fns: dict, sets, rounds: int, calls: int = 10) -> dict:
    """Median ms of one call of each of ``fns`` timed as bench/fp8.py times them, the issue's
    figure (``Harness.time``: each call between its own pair of CUDA events, queued behind a
    GPU spin, the inputs rotated): ``calls`` calls a round, ``rounds`` rounds taking them
    in turn. Unlike ``batched``'s calls back to back, no kernel overlaps the one before it
    (programmatic dependent launch) and each call pays its own launch and ramp."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            times[name] += HARNESS.time(fn, sets, reps=calls, warmup=None if r == 0 else 1)
    return {name: statistics.median(t) for name, t in times.items()}


def time_all(fns: dict, sets, rounds=None) -> dict:
    """Median ms per call of each of ``fns``, in ``rounds`` rounds that take them in turn
    (a clock that drops as the GPU heats falls on all alike): ``percall_times`` (the
    default), or (``--timing batched``) batches of calls back to back (``one_batch``)."""
    rounds = rounds or ROUNDS[0]
    if TIMING[0] == "percall":
        return percall_times(fns, sets, rounds)
    setup = {name: prepare(fn, sets) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(one_batch(fn, sets, *setup[name]))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def use_ptxas() -> None:
    """With ``FP8_PLANS_PTXAS=1``: the kernels' cubins built by ``ptxas`` (the runtime's
    ``KAIO_PTXAS=auto``), not by the driver's JIT, which gives the consumers of ``setmaxnreg``
    kernels local memory where ptxas does not (round A's diag). Called before any kernel
    loads: the runtime reads ``KAIO_PTXAS`` once a process."""
    if os.environ.get("FP8_PLANS_PTXAS") == "1":
        os.environ.setdefault("KAIO_PTXAS", "auto")


REGS = [  # plans that need the setmaxnreg registers (FP8_PLANS_PTXAS=1 --cases regs)
    (2, 128, 7, 1, 1),
    (2, 128, 7, 2, 1),
    (2, 256, 4, 3, 1),
    (2, 192, 5, 1, 1),
    (2, 192, 5, 3, 1),
    (3, 128, 5, 1, 1),
    (2, 128, 7, 4, 1),
    (2, 256, 4, 0, 1),
]


def with_plan(plan, out_dtype=None):
    """matmul_fp8 forced onto ``plan`` (None: the op's own choice; a plan also at the rows
    that ``_fp8_decode`` takes, its limits set to 0 meanwhile; ``GEMV``: ``gemv_fp8`` up to
    ``MOST_M`` rows; ``BEFORE``: the routing before this branch, ``without_200``'s plan and
    no programmatic dependent launch; ``NO_PDL``: the routed plan without it; a name of
    ``PROMOTIONS``: the routed plan with its tensor maps' L2 promotion at that)."""

    def run(a, b, sa, sb):
        return kaio_ops.matmul_fp8(a, b, sa, sb, out_dtype=out_dtype)

    if plan is None:
        return run

    def forced(a, b, sa, sb):
        keep = H.config, D.MAX_M, D.SM90_MAX_M, H.PDL
        if plan == GEMV:  # gemv_fp8 at the rows it takes anywhere (unplanned: another
            D.SM90_MAX_M = D.MOST_M  # H.config, so that no call plan of the op's is used)
            H.config = lambda *args: keep[0](*args)
        elif plan == BEFORE:  # (unplanned too)
            H.config, H.PDL = (lambda m, n, k, sms, *_: without_200(m, n, k, sms, keep[0])[0]), 0
        elif plan == NO_PDL:  # (unplanned too)
            H.config, H.PDL = (lambda *args: keep[0](*args)), 0
        elif plan in PROMOTIONS:  # (unplanned too)
            H.config = lambda *args: (*full_plan(keep[0](*args))[:12], PROMOTIONS[plan])
        elif plan == AR64:  # (unplanned too; 64 A rows copied, as before fp8 round E)
            H.config = lambda *args: keep[0](*args)
            H.a_rows = lambda m, wg, cl: 64 * wg
        elif plan == OTHER:  # (unplanned too)
            H.config = lambda m, n, k, sms, *_: keep[0](m, n, k, sms, not FAST)
        elif plan == MAIN:  # (unplanned too)
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            before = main_plan(keep[0](a.shape[0], b.shape[1], a.shape[1], sms), a.shape[0])
            H.config, H.PDL = (lambda *args: before), int(not full_plan(before)[9])
        else:
            H.config = lambda *args: tuple(plan)
            D.MAX_M = D.SM90_MAX_M = 0
        try:
            return run(a, b, sa, sb)
        finally:
            H.config, D.MAX_M, D.SM90_MAX_M, H.PDL = keep
            H.a_rows = A_ROWS

    return forced


ROUTED_PDL = H.PDL  # (_warm sets H.PDL for a job, and back)
GEMV = "gemv"  # the plan name of _fp8_decode's kernel (with_plan)
MAIN = "main"  # the plan name of main's routing before this branch (with_plan, main_plan)
BEFORE = "before"  # the plan name of the routing before this branch (with_plan)
NO_PDL = "nopdl"  # the plan name of the routed plan without programmatic dependent launch
OTHER = "othermem"  # the plan name of the route of a GPU of the other memory speed (with_plan:
# the H100's on an H200, main's route there before issue 35's H200 pass, and the reverse)
AR64 = "ar64"  # the plan name of the routed plan with 64 A rows copied whatever M (with_plan)
A_ROWS = H.a_rows
PROMOTIONS = {"l2none": 0, "l2p128": 128, "l2p256": 256}  # plan names: the routed plan with
# its tensor maps' L2 promotion at these bytes (its L2 field)
NAMED = (GEMV, BEFORE, MAIN, NO_PDL, AR64, OTHER, *PROMOTIONS)


BIG = [  # (WG, BN, STAGES, PROMOTE, VEC[, CL[, SPLIT]])
    (2, 128, 7, 4, 1),
    (2, 128, 7, 1, 1),
    (3, 128, 5, 1, 1),
    (2, 104, 7, 2, 1),
    (2, 96, 8, 2, 1),
    (2, 128, 6, 4, 1, 2),
    (3, 128, 5, 1, 1, 2),
    (2, 256, 4, 0, 1),
]
INTERVAL = [  # promoted every PROMOTE // 10 slices (one group in flight; 1: staggered)
    (2, 128, 7, 1, 1),
    (2, 128, 7, 5, 1),
    (2, 192, 5, 5, 1),
    (2, 128, 6, 5, 1, 2),
    (2, 96, 8, 2, 1),
    (2, 128, 7, 20, 1),
    (2, 128, 7, 21, 1),
    (2, 128, 7, 41, 1),
    (2, 128, 7, 81, 1),
    (2, 192, 5, 21, 1),
    (3, 128, 5, 21, 1),
    (2, 128, 6, 21, 1, 2),
    (2, 128, 7, 0, 1),
    (2, 256, 4, 0, 1),
]
CLUSTER = [(2, 128, 6, 4, 1, 2), (3, 128, 5, 1, 1, 2)]
WIDE = [  # the tile widths that fit 240 registers a consumer (whole-program JIT), clusters
    (2, 128, 7, 1, 1),
    (2, 160, 6, 1, 1),
    (2, 176, 5, 1, 1),
    (2, 192, 5, 1, 1),
    (2, 208, 5, 1, 1),
    (2, 224, 5, 1, 1),
    (2, 256, 4, 3, 1),
    (2, 192, 5, 5, 1),
    (2, 192, 5, 4, 1),
    (3, 128, 5, 1, 1),
    (2, 128, 7, 1, 1, 2),
    (2, 192, 5, 1, 1, 2),
    (2, 208, 5, 1, 1, 2),
    (2, 256, 4, 3, 1, 2),
    (2, 256, 4, 0, 1),
    (2, 192, 5, 1, 1, 1, 3),
    (2, 160, 6, 1, 1, 1, 3),
    (3, 128, 5, 1, 1, 1, 3),
    (2, 208, 5, 1, 1, 1, 2),
]
SWEEP_WIDE = [  # the mid and large M plans of "sweepwide": WIDE's one sum waited for (128 to
    p  # 208 columns), halves at 256, clusters of two, no split (with_splits adds them)
    for p in WIDE
    if p[0] == 2 and p[3] in (1, 3) and p[1] not in (176, 224) and (p + (1, 1))[6] == 1
]
EPI = [  # C through shared memory, a bulk copy a row (VEC 2; a stage fewer) and controls
    (2, 208, 5, 1, 1),
    (2, 208, 4, 1, 1),
    (2, 208, 4, 1, 2),
    (2, 192, 5, 1, 1),
    (2, 192, 4, 1, 2),
    (2, 224, 5, 1, 1),
    (2, 224, 3, 1, 2),
    (2, 256, 4, 3, 1),
    (2, 256, 3, 3, 2),
]
DEPTH = [(2, 128, 7, 1, 1), (2, 192, 5, 1, 1), (2, 256, 4, 3, 1), (2, 192, 5, 1, 1, 2)]
KSWEEP = [(4096, 4096, k) for k in (1024, 2048, 4096, 8192, 16384)] + [
    (8192, 8192, k) for k in (2048, 8192)
]  # ("ksweep": the routed tile's time against K, a line: per slice and per tile)
KDEC = [(8, 4096, k) for k in (1024, 2048, 4096, 8192)]  # ("kdec": the same, decode)
EPIQ = [  # C through shared memory, the bulk copies waited for at the next epilogue (VEC 3)
    (2, 208, 4, 1, 2),
    (2, 208, 4, 1, 3),
    (2, 192, 4, 1, 3),
    (2, 160, 5, 1, 3),
    (2, 128, 6, 2, 3),
    (2, 128, 6, 1, 3),
    (2, 128, 6, 2, 3, 2),
    (2, 208, 4, 1, 3, 2),
]


def deferred_plans(m, n, k, sms=132):
    """The routed plan with the other epilogue: stored from registers (``VEC`` 1, the stages
    that fit: main's plan before 2026-11-27) where it goes through shared memory, else
    through shared memory with the copies drained during the next tile (``VEC`` 3), where the
    routed plan is unswapped (128 x 128 tiles so, cuBLAS's tile at 4096^3, ran at 0.77x to
    0.91x: round B)."""
    wg, bn, _, pr, vec, *rest = routed(m, n, k, sms)
    if len(rest) > 3 and rest[4]:  # swapped
        return []
    other = 1 if vec == 3 else 3
    return [(wg, bn, H.stages_for(wg, bn, vec=other), pr, other, *rest[:2])]


EPIQ_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 1024), (4096, 4096, 16384),
               (8192, 4096, 14336), (2048, 28672, 4096)]  # fmt: skip
NOT_SHIPPED = (
    (2, 256, 4, 0, 1),
    (1, 64, 12, 0, 1),
    (2, 128, 7, 0, 1),
    (2, 208, 4, 0, 3),
    (2, 192, 4, 0, 3),
)  # no promotion


def fitted_bn(n, sms, most=224):
    """Decode tile widths (multiples of 16, at most ``most``: two 224-wide sums fill 255
    registers) that suit ``n`` columns on ``sms`` multiprocessors: the one with the least
    idle share of its last wave, and the one of ``config``'s cost (waves times the width
    plus 64)."""
    options = range(16, most + 1, 16)

    def tiles(b):
        return -(-n // b)

    def waves(b):
        return -(-tiles(b) // sms)

    fullest = min(options, key=lambda b: (waves(b) * sms / tiles(b), -b))
    cheapest = min(options, key=lambda b: (waves(b) * (b + 64), -b))
    return sorted({fullest, cheapest})


def plans_for(m, n, new=False):
    """The plans worth timing at an ``m x n`` output (``new``: the second set, the plans
    that promote every slice as cuBLAS does: decode widths fitted to the multiprocessors,
    K splits, and the mid-M tiles)."""
    p = H.plan
    if new:
        if m <= 64:
            out = [p(1, 64)[:5], p(1, 128)[:5]]
            for bn in fitted_bn(n, 132):
                st, deep = H.stages_for(1, bn), H.stages_for(1, bn, 24)
                out += [(1, bn, st, H.promotion(1, bn), 1)]
                out += [(1, bn, deep, H.promotion(1, bn), 1)] if deep > st else []
            return out + [(1, 64, 12, 2, 1, 1, 2), (1, 32, 12, 2, 1, 1, 2), (1, 128, 9, 2, 1, 1, 2)]
        out = [(2, 128, 7, 1, 1), (2, 128, 7, 4, 1), (2, 96, 8, 2, 1), p(2, 64)[:5]]
        out += [(2, 128, 6, 1, 1, 2)]
        return out + ([p(1, 64)[:5], p(1, 128)[:5], (1, 96, 11, 2, 1)] if m <= 1024 else [])
    if m <= 64:
        splits = [(1, 64, 12, 2, 1, 1, 2), (1, 64, 12, 2, 1, 1, 4)]
        return [p(1, 64)[:5], p(1, 128)[:5], p(1, 256)[:5], (1, 64, 12, 0, 1), *splits]
    out = [p(2, 64)[:5], p(2, 128)[:5], (2, 128, 7, 1, 1), p(3, 128)[:5], p(2, 104)[:5]]
    return out + ([p(1, 64)[:5]] if m <= 512 else [])


def with_splits(plans, m, n, k, sms=132):
    """``plans`` and, for each one of a block a tile, the same plan with the K split of its
    last partial wave (``_fp8_hopper.split_parts``) where that saves a fifth of a tile."""
    out = list(plans)
    for p in plans:
        if len(p) == 5:
            tiles = -(-m // (64 * p[0])) * -(-n // p[1])
            parts = H.split_parts(tiles, sms, k // 128)
            if parts > 1:
                out.append((*p, 1, parts))
    return out


DECODE_SHAPES = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (8192, 8192)]


def occ_stages(bn, ar, occ):
    """The deepest ring (at most 32 stages) of a decode tile of ``bn`` columns copying
    ``ar`` A rows of which ``occ`` blocks fit one multiprocessor's 228 KiB."""
    return H.stages_for(1, bn, 32, ar=ar, limit=228 * 1024 // occ - 1024)


def decode_plans(m, n, k, sms=132):
    """The decode (M <= 64) alternatives "decgrid" times beside the routed plan: its width
    with the deepest ring that fits (A stages of the copied rows only), the width that fills
    two blocks a multiprocessor (``OCC`` 2) and the routed width with two blocks a
    multiprocessor and a K split in two (every tile split: twice the blocks streaming), its
    parts summed in the kernel (``FUSE``)."""
    ar = H.a_rows(m, 1, 1)
    _, bn, st, pr, *_ = routed(m, n, k, sms)

    def cost(b):  # config's: waves of tiles times the width plus 64, on 2 * sms slots
        return math.ceil(math.ceil(n / b) / (2 * sms)) * (b + 64), -b

    bn2 = min(range(16, 65, 16), key=cost)
    out = (
        [(1, bn, H.stages_for(1, bn, 32, ar=ar), pr, 1)]
        if H.stages_for(1, bn, 32, ar=ar) > st
        else []
    )
    out.append((1, bn2, occ_stages(bn2, ar, 2), 2, 1, 1, 1, 2))
    if bn <= 64:  # (two blocks' registers)
        out.append((1, bn, occ_stages(bn, ar, 2), pr, 1, 1, 2, 2, 1))  # summed in the kernel
    return out


def swap_width(m):
    """The columns of a swapped tile (``SWAP``) for ``m`` rows of a: m rounded up to 8."""
    return max(8, -(-m // 8) * 8)


def swap_plans(m, n, k, sms=132):
    """The swapped plans (C^T = B^T A^T: 64 or 128 weight rows a tile, a's rows its
    ``swap_width`` columns) "swap" times beside the routed plan: one consumer warpgroup with
    the deepest ring, K split in two (summed in the kernel), two blocks a multiprocessor,
    both; two consumer warpgroups, unsplit and split."""
    bn = swap_width(m)
    s1 = H.stages_for(1, bn, 32)
    s2 = H.stages_for(2, bn, 32)
    o2 = occ_stages(bn, 64, 2)
    pr1, pr2 = H.promotion(1, bn), H.promotion(2, bn)
    return [
        (1, bn, s1, pr1, 1, 1, 1, 1, 0, 1),
        (1, bn, s1, pr1, 1, 1, 2, 1, 1, 1),
        (1, bn, o2, pr1, 1, 1, 1, 2, 0, 1),
        (1, bn, o2, pr1, 1, 1, 2, 2, 1, 1),
        (2, bn, s2, pr2, 1, 1, 1, 1, 0, 1),
        (2, bn, s2, pr2, 1, 1, 2, 1, 1, 1),
    ]


BAND_SHAPES = [(4096, 4096), (4096, 14336), (6144, 4096)]  # the slowest decode/mid shapes


def band_plans(m, n, k, sms=132):
    """The plans "bands" times beside the routed one where the H200 sweep lost most
    (2026-11-27): at one row ``gemv_fp8`` (routed there off sm_90); to 256 rows the swapped
    tiles (64 weight rows, a's rows rounded up to 8, two blocks a multiprocessor up to 64 of
    them) with K split 2 and 4 ways (summed in the kernel: 64 tiles at N = 4096 fill half
    the multiprocessors), and unsplit past ``SWAP_M``."""
    bn = swap_width(m)
    if bn > 256:
        return []
    occ = 2 if bn <= 64 else 1
    st, pr = occ_stages(bn, 64, occ), H.promotion(1, bn)
    out = [(1, bn, st, pr, 1, 1, s, occ, 1, 1) for s in ((1, 2, 4) if m > H.SWAP_M else (2, 4))]
    pick = routed(max(m, 2), n, k, sms)
    out = [p for p in out if full_plan(p) != full_plan(routed(m, n, k, sms))]
    return [pick if D.fits(m, True) else GEMV, *out] if D.fits(m) else out


RING_SHAPES = [(4096, 4096), (6144, 4096), (8192, 8192), (4096, 14336)]  # tiles <= the SMs


def ring_plans(m, n, k, sms=132):
    """The plans "rings" times beside the routed one: its tile with one block a
    multiprocessor (where its 64-row tiles are no more than the multiprocessors: the second
    block's slot idles anyway) and deeper rings (12, 16 and the most that fit; cuBLAS's
    64 x 8 decode tile keeps 16 stages)."""
    wg, bn, st, pr, *rest = routed(m, n, k, sms)
    swapped = len(rest) > 5 and rest[5]
    rows = 64 if swapped else H.a_rows(m, wg, 1)
    most = occ_stages(bn, rows, 1)
    deep = sorted({d for d in (12, 16, most) if st < d <= most})
    if swapped:
        return [(wg, bn, d, pr, 1, 1, 1, 1, 0, 1) for d in deep]
    return [(wg, bn, d, pr, *rest) for d in deep] if wg == 1 else []


CLUSTER_K = [(4096, 4096, 1024), (4096, 4096, 2048)]
CLUSTER_VEC = [(2, 208, 4, 1, 3, 2), (2, 208, 5, 1, 1, 2), (2, 208, 4, 1, 2, 2), (2, 208, 4, 1, 3),
               (2, 208, 5, 1, 1)]  # fmt: skip


def call_once(cases) -> None:
    """``torch._scaled_mm`` and the routed ``matmul_fp8`` called once each at ``cases`` (m,
    n, k), for a profiler that picks their kernels out (ncu -k)."""
    for m, n, k in cases:
        a, b, sa, sb = operands(m, n, k, False, 1)[0]
        scaled_mm(a, b, sa, sb)
        with_plan(None)(a, b, sa, sb)
        torch.cuda.synchronize()


def kernel_names(cases, deadline=math.inf) -> None:
    """The kernels ``torch._scaled_mm`` and the routed ``matmul_fp8`` launch at ``cases``
    (m, n, k): torch.profiler's names (cuBLAS's encode its tile and K split), until the
    ``deadline`` (``time.time()``) passes."""
    from torch.profiler import ProfilerActivity, profile

    for m, n, k in cases:
        if time.time() > deadline:
            print(f"names: deadline, skipped M={m} {n}x{k}", flush=True)
            continue
        a, b, sa, sb = operands(m, n, k, False, 1)[0]
        for name, fn in (("cublas", scaled_mm), ("kaio", with_plan(None))):
            fn(a, b, sa, sb)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn(a, b, sa, sb)
                torch.cuda.synchronize()
            print(f"names M={m} {n}x{k} {name}: "
                  + "; ".join(launch_shapes(prof)), flush=True)  # fmt: skip


def launch_shapes(prof) -> list:
    """Each kernel of a profile as its name, grid, block, cluster and dynamic shared memory
    (from the profiler's trace: what cuBLAS's kernel names do not say) and its time."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))  # noqa: SIM115
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel":
            a = e.get("args", {})
            keys = ("grid", "block", "cluster", "shared memory", "registers per thread")
            shape = " ".join(f"{key.split()[0]}={a[key]}" for key in keys if key in a)
            out.append(f"{e['name'][:100]} [{shape}] {e.get('dur', 0):.1f}us")
    return out


def percall_spans(cases, deadline=math.inf, calls: int = 20) -> None:
    """Where a call's time goes, timed as bench/fp8.py times it (``Harness.time``: each call
    between its own pair of events, queued behind a GPU spin) under the profiler: the
    median event time of ``torch._scaled_mm`` and of the routed ``matmul_fp8`` at ``cases``
    (m, n, k), the median span of their kernels in the profiler's device timestamps, and
    the difference (the launch and whatever else the events hold), until ``deadline``."""
    from torch.profiler import ProfilerActivity, profile

    for m, n, k in cases:
        if time.time() > deadline:
            print(f"spans: deadline, skipped M={m} {n}x{k}", flush=True)
            continue
        sets = input_sets(m, n, k)
        row = []
        for name, fn in (("cublas", scaled_mm), ("kaio", with_plan(None))):
            HARNESS.time(fn, sets, reps=2)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                ms = HARNESS.time(fn, sets, reps=calls, warmup=1)
            spans: dict = {}  # kernel name -> its spans (the GPU spins left out)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > 0:
                    spans.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
            ours = {nm: t for nm, t in spans.items() if len(t) >= calls}  # (a kernel a call)
            kernel = sum(statistics.median(t) for t in ours.values())
            event = statistics.median(ms) * 1e3
            names = ",".join(f"{nm[:40]}x{len(t)}" for nm, t in ours.items())
            row.append(f"{name} event {event:6.2f} kernels {kernel:6.2f} rest "
                       f"{event - kernel:5.2f} ({names})")  # fmt: skip
        print(f"spans M={m} {n}x{k}: " + " | ".join(row), flush=True)
        del sets
        torch.cuda.empty_cache()


GAP_CASES = [(128, 4096, 4096), (8, 4096, 4096)]
SPAN_CASES = [(8, 4096, 4096), (32, 4096, 4096), (8, 8192, 8192), (8, 28672, 4096),
              (8, 4096, 14336)]  # fmt: skip


def with_pdl(pdl: int):
    """The routed ``matmul_fp8`` with its wgmma kernel launched with (1) or without (0)
    programmatic dependent launch (``_fp8_hopper.PDL``), unplanned (another ``H.config``:
    a call plan keeps the launch it was made with)."""

    def run(a, b, sa, sb):
        keep = H.config, H.PDL
        H.config, H.PDL = (lambda *args: keep[0](*args)), pdl
        try:
            return kaio_ops.matmul_fp8(a, b, sa, sb)
        finally:
            H.config, H.PDL = keep

    return run


PDL_CASES = [(4096, 4096, 4096), (8192, 8192, 8192), (128, 4096, 4096), (256, 6144, 4096),
             (1024, 4096, 4096), (2048, 4096, 4096), (64, 10240, 8192),
             (32, 4096, 4096)]  # fmt: skip


def pdl_case(m, n, k, log) -> dict:
    """cuBLAS, the routed plan (its call plan) and the routed plan unplanned without and with
    programmatic dependent launch (``with_pdl``), each checked against cuBLAS, timed in the
    same interleaved rounds."""
    sets = input_sets(m, n, k)
    ref = scaled_mm(*sets[0]).float()
    fns = {"cublas": scaled_mm, "pick": with_plan(None), "pdl0": with_pdl(0),
           "pdl1": with_pdl(1)}  # fmt: skip
    rec = {"case": f"pdl {m}x{n}x{k}", "m": m, "n": n, "k": k, "plan": list(routed(m, n, k, 132))}
    for name, fn in fns.items():
        got = fn(*sets[0]).float()
        rec[name] = {"err": ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()}
    ms = time_all(fns, sets)
    for name, t in ms.items():
        rec[name].update(us=t * 1e3, x=ms["cublas"] / t)
    rec["gpu"] = torch.cuda.get_device_name()
    log.write(json.dumps(rec) + "\n")
    log.flush()
    print(f"{rec['case']:>22} {rec['plan']} cuBLAS {ms['cublas'] * 1e3:7.1f} us | "
          + " | ".join(f"{nm} {rec[nm]['us']:7.1f} us {rec[nm]['x']:.3f}x err {rec[nm]['err']:.0e}"
                       for nm in ("pick", "pdl0", "pdl1")), flush=True)  # fmt: skip
    del sets
    torch.cuda.empty_cache()
    return rec


def kernel_gaps(cases, calls: int = 6) -> None:
    """Each kernel's span and the gap from the kernel before (negative: the two overlapped,
    as programmatic dependent launch allows) of ``calls`` back-to-back calls of
    ``torch._scaled_mm`` and of the routed ``matmul_fp8`` at ``cases`` (m, n, k), in the
    profiler's device timestamps: where the time between kernels goes."""
    from torch.profiler import ProfilerActivity, profile

    for m, n, k in cases:
        sets = operands(m, n, k, False, 2)
        for name, fn in (("cublas", scaled_mm), ("kaio", with_pdl(0)), ("kaio pdl", with_pdl(1))):
            for s in sets:
                fn(*s)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(int(3e6))  # (the calls queue up behind a GPU spin)
                for i in range(calls):
                    fn(*sets[i % 2])
                torch.cuda.synchronize()
            spans = sorted(
                (e.time_range.start, e.time_range.end, e.name)
                for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA
                and e.time_range.end > 0
                and "sleep" not in e.name
            )
            t0 = spans[0][0]
            rows = [f"{s - t0:.1f}+{e - s:.1f}" for s, e, _ in spans]
            gaps = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
            print(f"gaps M={m} {n}x{k} {name}: {len(spans)} kernels ({spans[0][2][:60]}), "
                  f"span/call {(spans[-1][1] - t0) / calls:.2f} us, gaps "
                  + " ".join(f"{g:.2f}" for g in gaps) + " | " + " ".join(rows),
                  flush=True)  # fmt: skip


def group_plans(m, n, k, sms=132, groups=(2, 4, 16)):
    """The routed plan with the tile order grouped ``groups`` tile rows at a time (the
    routed one: ``_matmul_hopper.GROUP_ROWS``)."""
    return [(*routed(m, n, k, sms), 1, 0, 0, g) for g in groups]


def unswapped(m, n, k, sms=132):
    """The plan ``config`` picks with no swapped tiles (``_fp8_hopper.SWAP_M`` 0)."""
    keep = H.SWAP_M
    H.SWAP_M = 0
    try:
        return routed(m, n, k, sms)
    finally:
        H.SWAP_M = keep


def decode_alternatives(m, n, k, sms=132):
    """The plans "decode" times beside the routed plan at M <= 64: the unswapped plan, the
    swapped one (two blocks a multiprocessor) with 6, 8 and 12 stages (at most what fits)
    and with ``swap_stages``'."""
    plans = [unswapped(m, n, k, sms)]
    swap = H.swap_config(m, n, k, sms)
    if swap:
        most = occ_stages(swap[1], 64, 2)
        plans += [(*swap[:2], min(st, most), *swap[3:]) for st in (6, 8, 12)] + [swap]
    pick = routed(m, n, k, sms)
    return sorted({p for p in plans if p != pick})


def mid_plans(m, n, k, sms=132):
    """The plans "mid" times beside the routed one at 128 and 256 rows, where the weights
    still cost most: 64 x 64 and 64 x 32 tiles two blocks a multiprocessor, 128 x 32."""
    return [
        (1, 64, occ_stages(64, 64, 2), 2, 1, 1, 1, 2),
        (1, 32, occ_stages(32, 64, 2), 2, 1, 1, 1, 2),
        (2, 32, H.stages_for(2, 32), H.promotion(2, 32), 1),
    ]


def config_without(limit, m, n, k, sms=132):
    """[the plan ``config`` picks with the module's row limit ``limit`` set to 0 (the rule it
    bounds switched off)] where it differs from the routed one, else []."""
    keep = getattr(H, limit)
    setattr(H, limit, 0)
    try:
        old = routed(m, n, k, sms)
    finally:
        setattr(H, limit, keep)
    return [old] if old != routed(m, n, k, sms) else []


def unshared(m, n, k, sms=132):
    """[the plan ``config`` picked before ``shared_plan`` (``_fp8_hopper.NS_M`` 0)] where it
    differs from the routed one, else []."""
    return config_without("NS_M", m, n, k, sms)


def ns_stages(bn, most=16):
    """The deepest ring (at most ``most``) of a 64 x ``bn`` tile shared by two consumer
    warpgroups (``NS``) that fits."""
    fits = [s for s in range(2, most + 1) if H.shared_bytes(2, bn, s, 1, 64, 1) <= H.SHARED_LIMIT]
    return fits[-1]


def ns_plans(m, n, k, sms=132):
    """The plans "ns" times beside the routed one up to 256 rows: 64-row tiles of 32 to 128
    columns whose two consumer warpgroups each take half the columns (``NS``: cuBLAS's
    64 x 64 tiles at 128 rows run 384 threads) where the tiles fill more than half of one
    wave, and 128 x 96 tiles (cuBLAS's at 256 x 6144)."""
    out = []
    for bn in (32, 64, 96, 128):
        if sms // 2 < -(-m // 64) * -(-n // bn) <= sms:
            out.append((2, bn, ns_stages(bn), 2, 1, 1, 1, 1, 0, 0, H.GROUP_ROWS, 1))
    return out + ([(2, 96, H.stages_for(2, 96), 2, 1)] if m > 64 else [])


def paired_plans(m, n, k, sms=132):
    """The routed plan in clusters of two tiles one above the other sharing each B slice
    (``CL`` 2, multicast; cuBLAS's kernel at 128 rows: 64 x 64 tiles, 384 threads, clusters
    of two) where it is one block a tile and unswapped, else nothing."""
    p = full_plan(routed(m, n, k, sms))
    if p[5] != 1 or p[6] != 1 or p[7] != 1 or p[9]:
        return []
    return [(*p[:5], 2, *p[6:])]


SQUARE_PLANS = {  # (the plans "squares" times beside the routed one at 4096^3 and 8192^3:
    # 128 x 200, whose tiles fill 8192 columns and 20 waves best, 128 x 192 and 208; the
    # routed tile without promotion, one wgmma sum over K: what the promotion costs, not
    # shipped)
    4096: [(2, 200, 4, 1, 3), (2, 192, 4, 1, 3), (2, 208, 4, 0, 3)],
    8192: [(2, 200, 4, 1, 3), (2, 208, 4, 1, 3), (2, 192, 4, 0, 3)],
}
WIDTH_CASES = [(512, 57344, 8192), (1024, 28672, 4096), (2048, 8192, 8192), (2048, 57344, 8192),
               (2048, 8192, 28672), (4096, 28672, 4096), (4096, 10240, 8192), (4096, 8192, 8192),
               (4096, 8192, 28672), (8192, 8192, 28672), (8192, 8192, 8192)]  # fmt: skip


def without_200(m, n, k, sms=132, config=None):
    """[the plan ``config`` (default ``H.config``) picks without the 128 x 200 tile]
    ("widths": where it takes it)."""
    keep = dict(H.RATES)
    del H.RATES[2, 200, 1]
    try:
        return [(config or H.config)(m, n, k, sms)]
    finally:
        H.RATES.clear()
        H.RATES.update(keep)


def copy_bandwidth(nbytes=2**30):
    """Bytes a second that a device-to-device copy moves (read + written), the median of 5."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    ts = []
    for _ in range(5):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / sorted(ts)[2]


def final_plans(m, n, k, sms=132):
    """The alternatives "sweepfinal" times beside the routed plan (past 64 rows): its
    epilogue through shared memory (VEC 2, the stages that still fit)."""
    if m <= 64:
        return []
    wg, bn, _, pr, _, cl, sp = routed(m, n, k, sms)
    return [(wg, bn, H.stages_for(wg, bn, vec=2), pr, 2, cl, sp)]


CARRY_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 6144, 4096), (4096, 28672, 4096),
                (2048, 4096, 14336), (8192, 4096, 4096), (2048, 8192, 8192),
                (4096, 57344, 8192)]  # fmt: skip


def carry_plans(m, n, k, sms=132):
    """The routed plan with the next tile's first slice carried over the epilogue
    (``PROMOTE`` 7) where it promotes every slice (1), and 128 x 256 tiles carried."""
    wg, bn, st, pr, *rest = routed(m, n, k, sms)
    out = [(wg, bn, st, 7, *rest)] if pr == 1 else []
    others = [(2, 256, 4, 3, 1), (2, 224, 5, 7, 1), (2, 208, 5, 7, 1), (2, 192, 5, 7, 1)]
    return out + [p for p in others if full_plan(p) not in map(full_plan, out)]


def split_plans(m, n, k, sms=132):
    """The plans "midsplit" times beside the routed one at 128 and 256 rows: 128 x 128 and
    128 x 256 tiles with the K split of their last partial wave (every tile when fewer than
    the multiprocessors) summed in the kernel (``FUSE``: no second launch), 2 to 4 parts."""
    out = []
    for wg, bn in ((2, 128), (2, 192), (2, 256)):
        tiles = -(-m // 128) * -(-n // bn)
        for parts in (2, 4):
            if H.split_from(tiles, sms, parts) < tiles:
                out.append((*H.plan(wg, bn)[:5], 1, parts, 1, 1))
    return out


def alternate_plans(m, n, k, sms=132):
    """The routed plan's tile with two consumer warpgroups on every other K slice each
    (``NS`` 2, the sums added through shared memory; one slice sum waited for past
    ``ALTERNATE_BN`` columns), the deepest ring that fits as many blocks a multiprocessor
    as the routed plan (at most its stages), where the routed tile is 64 rows of one
    warpgroup or ``shared_plan``'s half the columns each (``NS`` 1); where it is swapped
    (16 to 32 rows, N up to 8192), the unswapped plan instead (``NS`` 2 at 64 rows)."""
    wg, bn, stages, *_ = full = full_plan(routed(m, n, k, sms))
    occ, swap, ns = full[7], full[9], (full + (0,))[11]
    if swap:  # (the swapped tiles with NS 2 ran no faster: fp8 round A, 2026-11-27)
        return [unswapped(m, n, k, sms)] if m >= 16 and n <= 8192 else []
    if (wg, ns) not in ((1, 0), (2, 1)) or bn > 128:
        return []
    limit = (H.SHARED_LIMIT + 1024) // occ - 1024
    fits = [s for s in range(2, stages + 1) if H.shared_bytes(2, bn, s, 1, 64, 2) <= limit]
    promote = 2 if bn <= H.ALTERNATE_BN else 1  # (three sums of 112 columns or more spill)
    return [(2, bn, fits[-1], promote, 1, 1, 1, occ, 0, swap, H.GROUP_ROWS, 2)] if fits else []


def cold_plans(m, n, k, sms=132):
    """The alternatives "cold" times beside the routed plan (with ``--timing percall``: the
    choices of the fp8 branch of 2026-11-27, made with calls back to back, re-checked one
    call at a time; in round A of that day also the per-tensor scales loaded before the
    first tile, since removed). Swapped tiles (up to ``SWAP_M`` rows): ``gemv_fp8`` (one
    row), without programmatic dependent launch, deeper rings (16 and 24 stages, one block
    a multiprocessor, where the tiles fit one wave), K split 2 and 4 ways summed in the
    kernel. Past 64 rows: 64 x 128 and 64 x 64 tiles of two warpgroups on every other K
    slice (at 128 columns one slice sum waited for), 128 x 96 tiles, ``alternate_plans``."""
    wg, bn, st, pr, *rest = full = full_plan(routed(m, n, k, sms))
    if full[9] and wg == 1:  # swapped, one warpgroup (as routed in round A)
        out = [NO_PDL] + ([GEMV] if D.fits(m) else [])
        if -(-n // 64) <= sms:
            deep = sorted({H.stages_for(1, bn, d) for d in (16, 24)} - {st})
            out += [(wg, bn, d, pr, 1, 1, 1, 1, *full[8:]) for d in deep if d > st]
        return out + [(wg, bn, st, pr, 1, 1, s, 2, 1, 1) for s in (2, 4)]
    if m <= 64:
        return []
    fits = [s for s in range(2, 17) if H.shared_bytes(2, 128, s, 1, 64, 2) <= H.SHARED_LIMIT]
    out = [(2, 128, fits[-1], 1, 1, 1, 1, 1, 0, 0, H.GROUP_ROWS, 2)]
    out += [H.plan(2, 96)[:5], H.alternating_plan(64, 16)]
    return out + alternate_plans(m, n, k, sms)


def unwide(m, n, k, sms=132):
    """[the plan ``config`` picks without ``wide_alternating_plan``] where it differs from
    the routed one, else []."""
    return config_without("WIDE_ALTERNATE_M", m, n, k, sms)


def cold2_plans(m, n, k, sms=132):
    """The alternatives "cold2" times beside the routed plan (``--timing percall``; round C
    of 2026-11-27 also the tensor maps prefetched at the kernel's start, within 1%, the
    builtin removed again): the swapped tiles (up to ``SWAP_M`` rows) with their tensor
    maps' L2 promotion at none and 128 bytes instead of 256 (``PROMOTIONS``), in clusters
    of two tiles one above the other sharing a's slice (``CL`` 2, one block a
    multiprocessor: cuBLAS's decode kernels run clusters), and from 16 rows with two
    consumer warpgroups on alternate K slices (``NS`` 2); past 64 rows the plan ``config``
    picked before ``wide_alternating_plan``, 64 x 96 tiles of two warpgroups on alternate
    K slices and 128 x 96 tiles in clusters of two one above the other sharing each B
    slice (``CL`` 2: cuBLAS's kernel at 256 x 6144)."""
    full = full_plan(routed(m, n, k, sms))
    if full[9]:  # swapped
        wg, bn, st, pr = full[:4]
        out = [*PROMOTIONS, (wg, bn, st, pr, 1, 2, 1, 1, 0, 1)]
        if bn >= 16:  # two consumer warpgroups on alternate K slices, one block an SM
            fits = [s for s in range(2, 13) if H.shared_bytes(2, bn, s, 1, 64, 2) <= H.SHARED_LIMIT]
            out.append((2, bn, fits[-1], 2, 1, 1, 1, 1, 0, 1, H.GROUP_ROWS, 2))
        return out
    if m <= 64:
        return []
    paired = (*H.plan(2, 96)[:5], 2)
    return [*unwide(m, n, k, sms), H.alternating_plan(96), paired]


def cold3_plans(m, n, k, sms=132):
    """The alternatives "cold3" times beside the routed plan (``--timing percall``): where
    the routed plan is swapped and its tiles fit one wave, the swapped tile with two
    consumer warpgroups on alternate K slices (``NS`` 2, one block a multiprocessor), 8,
    12 and 16 stages."""
    full = full_plan(routed(m, n, k, sms))
    if not full[9] or -(-n // 64) > sms:
        return []
    bn = full[1]
    fits = [s for s in range(2, 17) if H.shared_bytes(2, bn, s, 1, 64, 2) <= H.SHARED_LIMIT]
    return [(2, bn, s, 2, 1, 1, 1, 1, 0, 1, H.GROUP_ROWS, 2) for s in (8, 12, 16) if s in fits]


def swap_before(m, n, k, sms=132):
    """[the swapped plan ``swap_config`` picked before ``swap_alternating_plan`` (one
    consumer warpgroup, two blocks a multiprocessor; past K = 8192 it also split a tile's K
    slices over a cluster of two, since removed)] where the routed plan is two
    warpgroups', else []."""
    full = full_plan(routed(m, n, k, sms))
    if not full[9] or full[0] == 1:
        return []
    bn = full[1]
    most = H.stages_for(1, bn, 32, limit=(H.SHARED_LIMIT + 1024) // H.SWAP_OCC - 1024)
    stages = min(most, H.swap_stages(n, k, sms))
    return [(1, bn, stages, 2, 1, 1, 1, H.SWAP_OCC, 0, 1, H.GROUP_ROWS, 0)]


def cold4_plans(m, n, k, sms=132):
    """The alternatives "cold4" times beside the routed plan (``--timing percall``): the
    plan before ``swap_alternating_plan`` (``swap_before``) or ``wide_alternating_plan``
    (``unwide``) where that is routed: this session's routing against main's at 338b9d6;
    where the swapped tiles fit one wave but run one warpgroup (6144 and 8192 columns),
    two consumer warpgroups on alternate K slices, 12 and 16 stages."""
    full = full_plan(routed(m, n, k, sms))
    if not full[9]:
        return unwide(m, n, k, sms)
    if full[0] == 2 or -(-n // 64) > sms:
        return swap_before(m, n, k, sms)
    return [(2, full[1], s, 2, 1, 1, 1, 1, 0, 1, H.GROUP_ROWS, 2) for s in (12, 16)]


def wait_plans(m, n, k, sms=132):
    """The alternative "waits" times beside the routed plan (``--timing percall``): where
    the routed plan is a narrow tile with one slice sum waited for (``PROMOTE`` 1: one
    warpgroup up to 128 columns, or two sharing a 64-row tile, ``NS``), the same plan with
    two sums in turn (2: each slice's stage freed only once the next slice's wgmmas are
    issued), the routing before fp8 round C of 2026-11-27."""
    full = full_plan(routed(m, n, k, sms))
    wg, bn, promote, ns = full[0], full[1], full[3], (*full, 0)[11]
    narrow = (wg == 1 and bn <= 128) or (ns == 2 and bn <= H.ALTERNATE_BN) or ns == 1
    return [(*full[:3], 2, *full[4:])] if promote == 1 and narrow else []


def depth_plans(m, n, k, sms=132):
    """The alternatives "depths" times beside the routed plan (``--timing percall``): where
    it is swapped (up to ``SWAP_M`` rows), its ring two stages shallower and the deepest
    that fits its blocks a multiprocessor (with one slice sum waited for, each stage is
    freed as soon as its wgmmas are done: the depth the ring really has)."""
    full = full_plan(routed(m, n, k, sms))
    if not full[9]:
        return []
    wg, bn, st, occ, ns = full[0], full[1], full[2], full[7], (*full, 0)[11]
    limit = (H.SHARED_LIMIT + 1024) // occ - 1024
    fits = [s for s in range(2, 33) if H.shared_bytes(wg, bn, s, 1, 64, ns) <= limit]
    return [(*full[:2], d, *full[3:]) for d in sorted({st - 2, fits[-1]} - {st})]


def mid_tile_plans(m, n, k, sms=132):
    """The alternatives "mids" times beside the routed plan (``--timing percall``) where it
    is a two-warpgroup tile of 128 rows or more with C through shared memory (``VEC`` 3):
    the same tile storing C from registers with the stage that frees (``VEC`` 1), and 128 x
    96 and 128 x 112 tiles (one slice sum waited for, ``VEC`` 1; cuBLAS's tile at 256 x
    6144 x 4096 is 128 x 96)."""
    full = full_plan(routed(m, n, k, sms))
    if full[0] != 2 or full[4] != 3 or (*full, 0)[11]:
        return []
    out = [(*full[:2], H.stages_for(2, full[1]), full[3], 1, *full[5:])]
    return out + [(2, bn, H.stages_for(2, bn), 1, 1) for bn in (96, 112) if bn != full[1]]


def arow_plans(m, n, k, sms=132):
    """The alternatives "arows" times beside the routed plan (``--timing percall``) where it
    is an unswapped tile of two warpgroups sharing 64 rows (``NS``) at fewer rows than that
    (10240 columns up to ``SWAP_M`` rows): the same with 64 A rows copied whatever M
    (``AR64``, the launch before), and with the deepest ring that fits the A rows copied
    (``a_rows``: 8 to 32), at most 24 stages."""
    full = full_plan(routed(m, n, k, sms))
    ns, ar = (*full, 0)[11], H.a_rows(m, 1, 1)
    if full[9] or not ns or ar >= 64:
        return []
    fits = [s for s in range(2, 25) if H.shared_bytes(2, full[1], s, 1, ar, ns) <= H.SHARED_LIMIT]
    return [AR64] + ([(*full[:2], fits[-1], *full[3:])] if fits[-1] > full[2] else [])


def tile_plans(m, n, k, sms=132):
    """The alternatives "tiles" times beside the routed plan past 256 rows (``--timing
    percall``): every two-warpgroup tile of ``RATES`` from 128 columns with ``plan``'s ring
    and epilogue, unsplit and with the K split of its last partial wave that
    ``split_parts`` gives (its parts added by ``sum_parts``); where the routed plan is
    swapped, the unswapped one (64-row tiles of a, 128 of them at N = 4096) and, where the
    routed tile is two warpgroups' and twice its tiles fit one wave, tiles of half a's rows
    (two a weight tile, each read twice: cuBLAS's 64 x 16 tiles at 32 x 4096 x 4096); from
    ``NS_M`` to ``WIDE_ALTERNATE_M`` rows ``shared_plan``'s where its tiles fit one wave
    (64 x 192 at 256 x 6144)."""
    full = full_plan(routed(m, n, k, sms))
    if full[9]:  # swapped: unswapped, and where it fits, half a's rows a tile (16 stages, 24)
        half = max(8, -(-m // 16) * 8)
        fits = full[0] == 2 and half < full[1] and 2 * -(-n // 64) <= sms
        deep = max(
            s for s in range(2, 25) if H.shared_bytes(2, half, s, 1, 64, 2) <= H.SHARED_LIMIT
        )
        rows = [(2, half, s, *full[3:]) for s in sorted({16, deep})] if fits else []
        return [unswapped(m, n, k, sms), *rows]
    if m <= H.NS_M:
        return []
    if m <= H.WIDE_ALTERNATE_M:  # shared_plan's 64-row tile of two warpgroups, one wave
        shared = H.shared_plan(m, n, sms)
        fits = -(-m // 64) * -(-n // shared[1]) <= sms
        return [shared] if fits and shared != routed(m, n, k, sms) else []
    out = []
    for wg, bn, cl in H.RATES:
        if wg == 2 and bn >= 128:
            p = H.plan(wg, bn, cl)
            parts = H.split_parts(-(-m // 128) * -(-n // bn), sms, k // 128)
            out += [p[:6] + (1,)] + ([p[:6] + (parts,)] if parts > 1 else [])
    return out


def fitting_stages(wg, bn, ns, occ=1, most=16, ar=64):
    """The deepest ring (at most ``most``) of a ``wg``-warpgroup tile of ``bn`` columns
    (``ns``: sharing 64 rows) of which ``occ`` blocks fit one multiprocessor."""
    limit = (H.SHARED_LIMIT + 1024) // occ - 1024
    fits = [s for s in range(2, most + 1) if H.shared_bytes(wg, bn, s, 1, ar, ns) <= limit]
    return fits[-1] if fits else 0


def h200_plans(m, n, k, sms=132):
    """The alternatives "h200" times beside the routed plan (``--timing percall``), for a
    faster memory than the H100's (4.8 TB/s), where a weight-bound product needs more
    multiprocessors streaming (about 48 GB/s each) or more bytes in flight an SM. Everywhere
    the route of the other memory speed (``OTHER``, where it differs), the routed plan
    without programmatic dependent launch and with its tensor maps' L2 promotion at 128
    bytes (256 where it is 128), each plan with the routed plan's promotion. Swapped tiles
    (up to ``SWAP_M`` rows): in clusters of two sharing a's slice (from 16 of its rows),
    with the deepest ring at its blocks a multiprocessor; three blocks a multiprocessor (one
    warpgroup); half a's rows a tile (two warpgroups, from 16 rows: two tiles a weight
    tile); 128 weight rows a tile (28672 columns and more: cuBLAS's 128 x 8). Unswapped to
    64 rows: the routed tile's deepest ring, and the swapped 64 x ``m`` tile of two
    warpgroups on alternate slices. 65 to 256 rows: 128 x 96 (one sum waited for), 64 x 128
    of two warpgroups on alternate slices, ``shared_plan``'s. (K splits summed in the kernel
    lost at every shape and band: round A of 2026-11-28.)"""
    full = full_plan(routed(m, n, k, sms))
    wg, bn, st, pr = full[:4]
    occ, swap, ns, l2 = full[7], full[9], full[11], full[12]
    g = H.GROUP_ROWS
    out = [NO_PDL, "l2p128" if l2 == 256 else "l2p256"]
    if other_route(m, n, k, sms) != routed(m, n, k, sms):
        out.insert(0, OTHER)
    if swap:
        if bn >= 16:  # pairs of weight tiles sharing a's slice (multicast), one block an SM
            out.append((wg, bn, fitting_stages(wg, bn, ns, 1, 24), pr, 1, 2, 1, 1, 0, 1, g, ns))
        deep = fitting_stages(wg, bn, ns, occ, 32)
        if deep > st:
            out.append((wg, bn, deep, pr, 1, 1, 1, occ, 0, 1, g, ns))
        if wg == 1:
            out.append((1, bn, fitting_stages(1, bn, 0, 3, 32), pr, 1, 1, 1, 3, 0, 1, g, 0))
        half = max(8, -(-m // 16) * 8)
        if wg == 2 and half < bn:
            out.append((2, half, fitting_stages(2, half, 2), 1, 1, 1, 1, 1, 0, 1, g, 2))
        if n >= 28672:
            out.append((2, bn, fitting_stages(2, bn, 0), 1, 1, 1, 1, 1, 0, 1, g, 0))
    elif m <= 64:
        deep = fitting_stages(wg, bn, ns, 1, 24, H.a_rows(m, 1, 1))
        if deep > st:
            out.append((wg, bn, deep, *full[3:]))
        sw = max(8, -(-m // 8) * 8)
        if -(-n // 64) <= sms:
            out.append((2, sw, fitting_stages(2, sw, 2), 1, 1, 1, 1, 1, 0, 1, g, 2))
    elif m <= H.WIDE_ALTERNATE_M:
        out += [(2, 96, H.stages_for(2, 96), 1, 1), H.alternating_plan(128),
                H.shared_plan(m, n, sms)]  # fmt: skip
    out = [p if p in NAMED else (*full_plan(p)[:12], l2) for p in out]  # (the routed maps')
    return list(dict.fromkeys(p for p in out if full_plan(p) != full))


COLDS = {"cold": cold_plans, "cold2": cold2_plans, "cold3": cold3_plans, "cold4": cold4_plans,
         "tiles": tile_plans, "waits": wait_plans, "depths": depth_plans,
         "mids": mid_tile_plans, "arows": arow_plans}  # fmt: skip
# h200_plans' cases ("h200": the H200 page run's weakest first; "h200b": the decode rows
# and the mid rows at the other shapes), each list in the order timed
H200_SETS = {
    "h200": [(256, 6144, 4096), (32, 4096, 14336), (64, 4096, 14336), (32, 4096, 4096),
             (64, 4096, 4096), (256, 4096, 4096), (128, 6144, 4096), (128, 10240, 8192),
             (32, 28672, 4096)] + [(m, n, k) for m in (4, 16) for mo in SHAPES.values()
                                   for n, k in mo],
    "h200b": [(m, n, k) for m in (1, 8) for mo in SHAPES.values() for n, k in mo]
    + [(m, n, k) for m in (32, 64, 128) for n, k in ((6144, 4096), (10240, 8192),
                                                      (8192, 8192), (57344, 8192))]
    + [(256, 8192, 8192), (256, 4096, 14336), (256, 10240, 8192), (128, 4096, 14336),
       (128, 8192, 28672), (128, 4096, 4096)],
}  # fmt: skip


def main_plan(plan, m) -> tuple:
    """The plan main's ``config`` picked (at 79c8fca, before the fp8 branch of 2026-11-27)
    where ``config`` now picks ``plan`` for ``m`` rows: ``shared_plan``'s half the columns
    a warpgroup (``NS`` 1) where it now takes every other K slice (``NS`` 2), one
    warpgroup's tile where ``alternating_plan``'s now; ``with_plan`` also launches the
    swapped tiles without programmatic dependent launch, as main did."""
    full = full_plan(plan)
    if len(full) < 12 or full[11] != 2:
        return plan
    bn = full[1]
    if m <= 64:
        return H.plan(1, bn)
    fits = [s for s in range(2, 17) if H.shared_bytes(2, bn, s, 1, 64, 1) <= H.SHARED_LIMIT]
    return (*full[:2], fits[-1], *full[3:11], 1)


def full_plan(plan) -> tuple:
    """``plan`` with its defaults spelled out: (WG, BN, STAGES, PROMOTE, VEC, CL, SPLIT, OCC,
    FUSE, SWAP, GROUP, NS, L2); a named plan (``NAMED``) as it is."""
    if plan in NAMED:
        return (plan,)
    return (*plan, *H.PLAN_DEFAULTS[len(plan) - 5 :])


def run_case(m, n, k, rowwise, plans, log, label="", floor_us=None):
    sets = input_sets(m, n, k, rowwise)
    ref = scaled_mm(*sets[0]).float()
    rec = {"case": label or f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "rowwise": rowwise}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rec["pick_plan"] = GEMV if D.fits(m, True) else list(routed(m, n, k, sms))
    fns = {"cublas": scaled_mm}
    for plan in [None, *plans]:
        if plan is not None and full_plan(plan) == full_plan(rec["pick_plan"]):
            continue  # timed as "pick"
        named = plan in NAMED
        name = "pick" if plan is None else plan if named else "/".join(map(str, plan))
        _plan.clear()
        fn = with_plan(plan)
        try:
            got = fn(*sets[0]).float()
            err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        except Exception as e:  # noqa: BLE001  (a plan that fails is reported, not fatal)
            rec[name] = {"error": str(e)[:200]}
            continue
        rec[name] = {"err": err}
        fns[name] = fn
    ms = time_all(fns, sets)
    rec["cublas_us"] = ms.pop("cublas") * 1e3
    best = None
    for name, t in ms.items():
        rec[name].update(us=t * 1e3, x=rec["cublas_us"] / (t * 1e3))
        named = name == "pick" or name in NAMED
        plan = name if named else tuple(int(x) for x in name.split("/"))
        if rec[name]["err"] < 1e-2 and plan not in NOT_SHIPPED:
            if best is None or t * 1e3 < rec[best]["us"]:
                best = name
    rec["best"] = best
    rec["gpu"] = torch.cuda.get_device_name()
    if floor_us:  # the weights read once at the copy bandwidth
        rec["floor_us"] = floor_us
    rec["peer_padded"] = bool(PADS) and m % 16 != 0
    log.write(json.dumps(rec) + "\n")
    log.flush()
    pick = rec.get("pick", {})
    print(
        f"{rec['case']:>24} cuBLAS {rec['cublas_us']:8.1f} us"
        + (f" floor {floor_us:6.1f} us" if floor_us else "")
        + f" | pick {rec['pick_plan']} "
        f"{pick.get('us', float('nan')):8.1f} us {pick.get('x', 0):.2f}x | best {best} "
        f"{rec[best]['us'] if best else float('nan'):8.1f} us {rec[best]['x'] if best else 0:.2f}x"
        + "".join(
            f" | {kk} {v['x']:.2f}x" + ("" if v.get("err", 0) == 0 else f" (err {v['err']:.1e})")
            for kk, v in rec.items()
            if isinstance(v, dict) and "x" in v and kk not in ("pick", best)
        ),
        flush=True,
    )
    del sets
    torch.cuda.empty_cache()
    return rec


def diagnose() -> None:
    """Registers and local (spill) bytes the driver gives each big plan, and the slow ones."""
    import subprocess

    from kaio import bf16, e4m3
    from kaio.ptx.ptxas import assemble, find_ptxas

    ptxas = find_ptxas()
    if ptxas:
        version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
        print("ptxas", ptxas, version.strip().splitlines()[-1:], flush=True)

    for plan in REGS:
        wg, bn, st, pr, vec, *rest = plan
        c = dict(WG=wg, BN=bn, STAGES=st, PROMOTE=pr, GROUP=H.GROUP_ROWS, ROW_A=0, COL_B=0,
                 BIAS=0, DT=bf16, FP8=e4m3, VEC=vec, CL=rest[0] if rest else 1,
                 SPLIT=1, AR=64 * wg, SWAP=0, NS=0, PDL=H.PDL)  # fmt: skip
        try:
            print(plan, H.matmul_fp8_wgmma.resources(**c), flush=True)
            if pr in (2, 5) and ptxas:  # the local ptxas' view of the same PTX
                report = assemble(H.matmul_fp8_wgmma.ptx(arch="sm_90", **c), "sm_90a")
                print("  ptxas:", [ln.strip() for ln in report.splitlines() if "Used" in ln
                                   or "spill" in ln], flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            print(plan, "resources failed:", str(e)[:200], flush=True)


def accuracy(log, k=8192, size=1024) -> None:
    """Error against float64 of the same fp8 values at K = ``k``, f32 out (so that the
    output's rounding hides nothing): cuBLAS (``torch._scaled_mm``, with and without
    ``use_fast_accum``) and each promotion interval, for zero-mean data (the benchmark's)
    and all-positive data (the sums grow with K: the hard case for the wgmma's short sum)."""
    torch.manual_seed(0)
    plans = {f"every {p // 10 if p >= 10 else p}" + (" staggered" if p % 10 == 1 and p > 10
             else ""): (2, 128, 7, p, 1) for p in (1, 20, 21, 41, 81)}  # fmt: skip
    plans["halves"] = (2, 128, 7, 5, 1)
    plans["no promotion"] = (2, 128, 7, 0, 1)
    for data in ("randn", "positive"):
        x = torch.randn(size, k, device="cuda")
        w = torch.randn(size, k, device="cuda")
        if data == "positive":
            x, w = x.abs(), w.abs()
        sa = (x.abs().amax() / 448.0).reshape(1)
        sw = (w.abs().amax() / 448.0).reshape(1)
        a, b = (x / sa).to(E4M3), (w / sw).to(E4M3).t()
        ref = (a.double() @ b.double()) * sa.double() * sw.double()
        rec = {"case": f"accuracy K={k} {data}", "k": k, "size": size}
        outs = {
            "cublas": torch._scaled_mm(a, b, sa, sw, out_dtype=torch.float32),
            "cublas fast accum": torch._scaled_mm(
                a, b, sa, sw, out_dtype=torch.float32, use_fast_accum=True
            ),
        }
        for name, plan in plans.items():
            _plan.clear()
            try:
                outs[name] = with_plan(plan, torch.float32)(a, b, sa, sw)
            except Exception as e:  # noqa: BLE001  (reported, not fatal)
                print(name, "failed:", str(e)[:200], flush=True)
        for name, got in outs.items():
            d = got.double() - ref
            rec[name] = {
                "rel_fro": (d.norm() / ref.norm()).item(),
                "max_rel": (d.abs().max() / ref.abs().max()).item(),
            }
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(rec["case"], " | ".join(
            f"{nm} {v['rel_fro']:.2e} / {v['max_rel']:.2e}" for nm, v in rec.items()
            if isinstance(v, dict)), flush=True)  # fmt: skip


def _warm(jobs):
    """Compile (into kaio's disk cache) the specializations of ``jobs``: (plan, rowwise[,
    m[, pdl]]: the rows, which set a decode tile's A rows copied; ``_fp8_hopper.PDL``)."""
    use_ptxas()
    for plan, rowwise, *rows in jobs:
        (a, b, sa, sb) = operands(*rows[:1] or [256], 256, 1024, rowwise, 1)[0]
        H.PDL = rows[1] if len(rows) > 1 else ROUTED_PDL
        with_plan(plan)(a, b, sa, sb)
        if rows == [1]:  # (gemv_fp8, which a forced plan bypasses)
            with_plan(GEMV)(a, b, sa, sb)
    torch.cuda.synchronize()


def warm(cases, ms, models, processes: int = 14) -> None:
    """Every plan this run times, compiled by ``processes`` workers at once."""
    import multiprocessing as mp

    new = "sweepnew" in cases
    plans = set(INTERVAL if "interval" in cases else BIG if "big" in cases else [])
    if "regs" in cases:
        plans.update(REGS)
    if "cluster" in cases:
        plans.update(CLUSTER)
    if "wide" in cases:
        plans.update(WIDE)
    if "depth" in cases:
        plans.update(DEPTH)
    if "epi" in cases:
        plans.update(EPI)
    if "sweepwide" in cases:
        plans.update(SWEEP_WIDE)
        plans.update((*p[:5], 1, 2) for p in SWEEP_WIDE if len(p) == 5)
    if "acc" in cases:
        plans.update((2, 128, 7, p, 1) for p in (0, 1, 5, 20, 21, 41, 81))
    sweeping = any(c.startswith("sweep") or c == "pick" for c in cases)
    shapes = [s for mo in models for s in SHAPES[mo]] if sweeping else []
    for m in ms:
        for n, k in shapes:
            if "pick" not in cases:
                plans.update(plans_for(m, n, new))
            if "sweepfinal" in cases:
                plans.update(final_plans(m, n, k))
    jobs = [(p, False) for p in sorted(plans)]
    for m in ms:  # the routed plans, at their own rows (a decode tile's A rows copied)
        rows = 1 if m == 1 else min(H.a_rows(m, 1, 1), 256)  # (one row: gemv_fp8)
        jobs += [(routed(m, n, k, 132), False, rows) for n, k in shapes]
    if "swap" in cases:
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                jobs += [(p, False) for p in swap_plans(m, n, k)]
                jobs.append((routed(m, n, k, 132), False, min(H.a_rows(m, 1, 1), 64)))
    if "decgrid" in cases:
        for m in {min(H.a_rows(m, 1, 1), 64) for m in ms if m <= 64}:
            for n, k in DECODE_SHAPES:
                jobs += [(p, False, m) for p in [routed(m, n, k, 132), *decode_plans(m, n, k)]]
    if "interval" in cases:
        jobs += [(p, True) for p in INTERVAL[:5]]
    if "final" in cases:
        jobs += [(routed(4096, 4096, 4096, 132), r) for r in (False, True)]
        jobs.append((routed(8192, 8192, 8192, 132), False))
    if "mid" in cases:
        for m in [m for m in ms if 64 < m <= 256]:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                jobs += [(p, False, m) for p in [routed(m, n, k, 132), *mid_plans(m, n, k)]]
    if "decode" in cases:
        for m in [m for m in ms if m <= 64]:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 64)
                pick = routed(m, n, k, 132)
                jobs += [(p, False, rows) for p in [pick, *decode_alternatives(m, n, k)]]
    if "midsplit" in cases:
        for m in [m for m in ms if 64 < m <= 256]:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                jobs += [(p, False, m) for p in [routed(m, n, k, 132), *split_plans(m, n, k)]]
    if "carry" in cases or "carrysq" in cases:
        for m, n, k in CARRY_SHAPES[: 2 if "carrysq" in cases else None]:
            jobs += [(p, False) for p in [routed(m, n, k, 132), *carry_plans(m, n, k)]]
    if "clk" in cases:
        jobs += [(p, False) for p in CLUSTER_VEC]
    if "one" in cases:
        jobs += [(routed(1, n, k, 132), False, 1) for mo in models for n, k in SHAPES[mo]]
    if "rings" in cases:
        for m in ms:
            for n, k in RING_SHAPES:
                rows = min(H.a_rows(m, 1, 1), 256)
                jobs += [(p, False, rows) for p in [routed(m, n, k, 132), *ring_plans(m, n, k)]]
    if "bands" in cases:
        bshapes = [s for mo in models for s in SHAPES[mo]] if "allshapes" in cases else BAND_SHAPES
        for m in ms:
            for n, k in bshapes:
                rows = 1 if m == 1 else min(H.a_rows(m, 1, 1), 256)
                jobs.append((routed(m, n, k, 132), False, rows))
                jobs += [(p, False, m) for p in band_plans(m, n, k) if p != GEMV]
    if "sweepdef" in cases:
        for m in ms:
            for n, k in shapes:
                jobs += [(p, False, min(m, 256)) for p in deferred_plans(m, n, k)]
    if "epiq" in cases:
        jobs += [(p, False) for p in EPIQ]
        jobs += [(routed(*shape, 132), False) for shape in EPIQ_SHAPES]
    if "ksweep" in cases:
        jobs += [(routed(m, n, k, 132), False) for m, n, k in KSWEEP]
    if "kdec" in cases:
        jobs += [(routed(m, n, k, 132), False, m) for m, n, k in KDEC]
    if "nsroute" in cases:
        for m in [m for m in ms if m <= 256]:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                jobs += [(p, False, m) for p in [routed(m, n, k, 132), *unshared(m, n, k)]]
    if "ns" in cases:
        for m in [m for m in ms if m <= 256]:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                jobs += [(p, False, m) for p in [routed(m, n, k, 132), *ns_plans(m, n, k)]]
    if "squares" in cases:
        jobs += [(p, False) for s in SQUARE_PLANS for p in [routed(s, s, s, 132),
                                                           *SQUARE_PLANS[s]]]  # fmt: skip
    if "gaps" in cases or "pdl" in cases or "pdlsweep" in cases:  # (with and without PDL)
        cs = set(GAP_CASES) | (set(PDL_CASES) if "pdl" in cases else set())
        if "pdlsweep" in cases:
            cs = {(m, n, k) for m in ms if m <= H.SWAP_M for mo in models for n, k in SHAPES[mo]}
        jobs += [(routed(*c, 132), False, min(H.a_rows(c[0], 1, 1), 256), p) for c in cs
                 for p in (0, 1)]  # fmt: skip
    if "paired" in cases:
        for m in ms:
            for n, k in BAND_SHAPES:
                jobs += [(p, False, m) for p in [routed(m, n, k, 132), *paired_plans(m, n, k)]]
    if "alt" in cases:
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 256)
                jobs += [
                    (p, False, rows) for p in [routed(m, n, k, 132), *alternate_plans(m, n, k)]
                ]
    if "cold" in cases:
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 256)
                pick = routed(m, n, k, 132)
                plans = [p for p in cold_plans(m, n, k) if p not in NAMED]
                jobs += [(p, False, rows) for p in [pick, *plans]] + [(pick, False, rows, 0)]
    if "cold2" in cases:
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 256)
                plans = [p for p in cold2_plans(m, n, k) if p not in NAMED]
                pick = routed(m, n, k, 132)
                jobs += [(p, False, rows) for p in [pick, *plans]]
    for name in [c for c in cases if c in COLDS and c not in ("cold", "cold2")]:
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 256)
                plans = [routed(m, n, k, 132), *COLDS[name](m, n, k)]
                jobs += [(p, False, rows) for p in plans if p not in NAMED]
    for m, n, k in [c for name in cases for c in H200_SETS.get(name, [])]:
        rows = min(H.a_rows(m, 1, 1), 256)
        pick = routed(m, n, k, 132)
        jobs += [(p, False, rows) for p in [pick, *h200_plans(m, n, k)] if p not in NAMED]
        jobs += [(pick, False, rows, 0), (other_route(m, n, k), False, rows)]
    if "mem" in cases:  # the routed plans and the other memory speed's
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 256)
                jobs += [(routed(m, n, k), False, rows), (other_route(m, n, k), False, rows)]
    if "vsmain" in cases:  # main's routing: its swapped tiles without PDL
        for m in ms:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                rows = min(H.a_rows(m, 1, 1), 256)
                pick = routed(m, n, k, 132)
                before = main_plan(pick, m)
                jobs += [(pick, False, rows), (before, False, rows, int(not full_plan(before)[9]))]
    if "sweepbefore" in cases:  # the routing before this branch: no PDL
        for m in ms:
            for n, k in shapes:
                if m > H.SWAP_M:
                    jobs.append((without_200(m, n, k)[0], False, min(m, 256), 0))
    if "widths" in cases:
        jobs += [(p, False) for c in WIDTH_CASES for p in [routed(*c, 132), *without_200(*c)]]
    if "group" in cases:
        jobs += [(p, False) for s in (4096, 8192) for p in [routed(s, s, s, 132),
                                                            *group_plans(s, s, s)]]  # fmt: skip
    jobs = sorted(set(jobs))
    chunks = [jobs[i::processes] for i in range(processes)]
    with mp.get_context("spawn").Pool(processes) as pool:
        pool.map(_warm, chunks)
    print(f"warmed {len(jobs)} specializations", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--budget", type=float, default=70.0)
    p.add_argument("--cases", default="big,rowwise,sweep,cluster")
    p.add_argument("--ms", default="1,8192,16,4096,64,1024,256,2048,128,512,2,4,8,32")
    p.add_argument("--models", default="8b,70b", help="8b, 70b or shapes NxK")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timing", default="percall", choices=("percall", "batched"))
    args = p.parse_args()
    ROUNDS[0] = args.rounds
    TIMING[0] = args.timing
    t0 = time.time()
    use_ptxas()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "fp8_plans.jsonl"), "a")  # noqa: SIM115
    recs = []

    def over_shapes(rows: list, plans_of, shapes=None, tag="", some=False, bw=None) -> None:
        """Time each M of ``rows`` at every shape of ``models`` (or ``shapes``: (N, K) pairs;
        ``run_case`` with ``plans_of(m, n, k)``, labelled ``tag`` first; ``some``: only
        where that gives a plan; ``bw``: the copy bandwidth, for the weight-read floor)
        while the budget lasts; a failing case is printed and the run goes on."""
        for m in rows:
            for n, k in shapes or [s for mo in models for s in SHAPES[mo]]:
                if time.time() - t0 > args.budget:
                    print(f"budget: skipped M={m} {n}x{k}", flush=True)
                    continue
                plans = plans_of(m, n, k)
                if some and not plans:
                    continue
                try:
                    floor = n * k / bw * 1e6 if bw else None
                    label = f"{tag}M={m} {n}x{k}"
                    recs.append(run_case(m, n, k, False, plans, log, label, floor))
                except Exception:  # noqa: BLE001
                    traceback.print_exc()

    cases = args.cases.split(",")
    ms = [int(x) for x in args.ms.split(",") if x]
    models = args.models.split(",")
    for model in models:  # an "NxK" model: that one shape
        if model not in SHAPES:
            SHAPES[model] = [tuple(int(x) for x in model.split("x"))]
    if "warm" in cases:
        try:
            warm(cases, ms, models)
        except Exception:  # noqa: BLE001  (the timed cases compile what is missing)
            traceback.print_exc()
        if "only" in cases:  # compile, time nothing (another process times them)
            return
    if "diag" in cases:
        diagnose()
    if "acc" in cases:
        try:
            accuracy(log)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    if "interval" in cases:
        recs.append(run_case(4096, 4096, 4096, False, INTERVAL, log))
        recs.append(run_case(8192, 8192, 8192, False, INTERVAL, log))
        recs.append(run_case(4096, 4096, 4096, True, INTERVAL[:5], log, "4096^3 rowwise"))
    if "regs" in cases:
        tag = " ptxas" if os.environ.get("FP8_PLANS_PTXAS") == "1" else ""
        recs.append(run_case(4096, 4096, 4096, False, REGS, log, "4096^3" + tag))
        recs.append(run_case(8192, 8192, 8192, False, REGS, log, "8192^3" + tag))
    if "epi" in cases:
        recs.append(run_case(4096, 4096, 4096, False, EPI, log))
        recs.append(run_case(8192, 8192, 8192, False, EPI, log))
    if "decgrid" in cases:  # decode: the routed plan and decode_plans', the weight floor
        bw = copy_bandwidth()
        print(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + written)", flush=True)
        for m in [m for m in ms if m <= 64]:
            for n, k in DECODE_SHAPES:
                if time.time() - t0 > args.budget:
                    print(f"budget: skipped M={m} {n}x{k}", flush=True)
                    continue
                try:
                    rec = run_case(m, n, k, False, decode_plans(m, n, k), log, f"dec M={m} {n}x{k}",
                                   floor_us=n * k / bw * 1e6)  # fmt: skip
                    recs.append(rec)
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
    if "bands" in cases:  # the slowest bands of the sweep at their shapes (band_plans)
        over_shapes(ms, band_plans, None if "allshapes" in cases else BAND_SHAPES)
    if "clk" in cases:  # clusters of two with each epilogue at short K (VEC 3 ran 0.43x)
        for m, n, k in CLUSTER_K:
            recs.append(run_case(m, n, k, False, CLUSTER_VEC, log))
    if "one" in cases:  # one row: the routed plan against gemv_fp8
        for model in models:
            for n, k in SHAPES[model]:
                recs.append(run_case(1, n, k, False, [GEMV], log, f"M=1 {n}x{k}"))
    if "rings" in cases:  # deeper rings, one block a multiprocessor
        over_shapes(ms, ring_plans, RING_SHAPES, "ring ")
    if "alt" in cases:  # two warpgroups on every other K slice of the routed narrow tile
        over_shapes(ms, alternate_plans, some=True)
    if "mem" in cases:  # the routed plans against the other memory speed's where they differ
        over_shapes(ms, lambda m, n, k: [OTHER] if other_route(m, n, k) != routed(m, n, k) else [])
    if "vsmain" in cases:  # the routed plans against main's routing
        over_shapes(ms, lambda m, n, k: [MAIN])
    colds = [c for c in cases if c in COLDS]  # (--timing percall)
    bw = copy_bandwidth() if colds else None
    if colds:
        print(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + written)", flush=True)
    for name in colds:
        some = name not in ("cold", "cold2")
        over_shapes(ms, COLDS[name], bw=bw, some=some)
    for name in [c for c in cases if c in H200_SETS]:  # the faster memory's alternatives
        for m, n, k in H200_SETS[name]:
            if time.time() - t0 > args.budget:
                print(f"budget: skipped M={m} {n}x{k}", flush=True)
                continue
            try:
                recs.append(run_case(m, n, k, False, h200_plans(m, n, k), log, f"M={m} {n}x{k}"))
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    if "pdl" in cases:  # the routed plans with and without programmatic dependent launch
        for m, n, k in PDL_CASES:
            if time.time() - t0 > args.budget:
                print(f"budget: skipped pdl {m}x{n}x{k}", flush=True)
                continue
            recs.append(pdl_case(m, n, k, log))
    if "pdlsweep" in cases:  # the same at --ms (the swapped tiles') over the models' shapes
        for m in [m for m in ms if m <= H.SWAP_M]:
            for n, k in [s for mo in models for s in SHAPES[mo]]:
                if time.time() - t0 > args.budget:
                    print(f"budget: skipped pdl {m}x{n}x{k}", flush=True)
                    continue
                recs.append(pdl_case(m, n, k, log))
    if "widths" in cases:  # 128 x 200 where config takes it, against the plan before
        for m, n, k in WIDTH_CASES:
            if time.time() - t0 > args.budget:
                print(f"budget: skipped {m}x{n}x{k}", flush=True)
                continue
            recs.append(run_case(m, n, k, False, without_200(m, n, k), log, f"M={m} {n}x{k}"))
    if "gaps" in cases:  # the kernels' spans and the gaps between back-to-back calls
        try:
            kernel_gaps(GAP_CASES)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    if "spans" in cases:  # per call: kernel time and the rest, both
        percall_spans(SPAN_CASES, t0 + args.budget + 6)
    if "once" in cases:  # one call of each (under ncu)
        call_once([(m, n, k) for m in ms for mo in models for n, k in SHAPES[mo]])
    if "names" in cases:  # which kernels cuBLAS runs where kaio loses most
        try:
            names = [(m, n, k) for m in ms for mo in models for n, k in SHAPES[mo]]
            if "squares" in cases:
                names.append((8192, 8192, 8192))
            kernel_names(names, t0 + args.budget + 6)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    if "decode" in cases:  # the routed decode plans against the old route, stages, preload
        over_shapes([m for m in ms if m <= 64], decode_alternatives)
    if "mid" in cases:  # small tiles at 128 and 256 rows
        over_shapes([m for m in ms if 64 < m <= 256], mid_plans)
    if "midsplit" in cases:  # wide tiles split along K, summed in the kernel
        over_shapes([m for m in ms if 64 < m <= 256], split_plans)
    if "squares" in cases:  # cuBLAS's tile width, clusters of two at the squares
        for size, plans in SQUARE_PLANS.items():
            recs.append(run_case(size, size, size, False, plans, log))
    if "paired" in cases:  # the routed plans in clusters of two sharing B, the slow bands
        over_shapes(ms, paired_plans, BAND_SHAPES, "paired ")
    if "nsroute" in cases:  # the routed plans against those before shared_plan
        over_shapes([m for m in ms if m <= 256], unshared)
    if "ns" in cases:  # two consumer warpgroups on a 64-row tile, half the columns each
        over_shapes([m for m in ms if m <= 256], ns_plans)
    if "group" in cases:  # the routed tile with other groupings of the tile order
        for size in (4096, 8192):
            recs.append(run_case(size, size, size, False, group_plans(size, size, size), log))
    if "carry" in cases or "carrysq" in cases:  # the next tile's first slice over the epilogue
        squares = "carrysq" in cases  # (4096^3 and 8192^3, the routed tile carried only)
        for m, n, k in CARRY_SHAPES[: 2 if squares else None]:
            if time.time() - t0 > args.budget:
                print(f"budget: skipped {m}x{n}x{k}", flush=True)
                continue
            plans = carry_plans(m, n, k)[: 1 if squares else None]
            recs.append(run_case(m, n, k, False, plans, log))
    if "final" in cases:  # the op as routed (config's plans) against cuBLAS
        recs.append(run_case(4096, 4096, 4096, False, [], log))
        recs.append(run_case(8192, 8192, 8192, False, [], log))
        recs.append(run_case(4096, 4096, 4096, True, [], log, "4096^3 rowwise"))
    if "wide" in cases:
        recs.append(run_case(4096, 4096, 4096, False, WIDE, log))
        recs.append(run_case(8192, 8192, 8192, False, WIDE, log))
    if "epiq" in cases:  # the epilogue's bulk copies drained during the next tile
        for m, n, k in EPIQ_SHAPES:
            if time.time() - t0 > args.budget:
                print(f"budget: skipped {m}x{n}x{k}", flush=True)
                continue
            recs.append(run_case(m, n, k, False, EPIQ, log))
    if "ksweep" in cases:  # the routed tile over K: the slope per K slice, the fixed cost
        for m, n, k in KSWEEP:
            recs.append(run_case(m, n, k, False, [], log))
    if "kdec" in cases:  # the same at 8 rows (the swapped tile)
        for m, n, k in KDEC:
            recs.append(run_case(m, n, k, False, [], log))
    if "depth" in cases:  # 4x longer tiles than 4096^3: the fixed cost of a tile shows
        recs.append(run_case(4096, 4096, 16384, False, DEPTH, log))
    if "big" in cases:
        recs.append(run_case(4096, 4096, 4096, False, BIG, log))
        recs.append(run_case(8192, 8192, 8192, False, BIG, log))
    if "rowwise" in cases:
        recs.append(run_case(4096, 4096, 4096, True, BIG[:2], log, "4096^3 rowwise"))
    if "cluster" in cases:
        recs.append(run_case(4096, 4096, 4096, False, CLUSTER, log, "4096^3 clusters"))
        recs.append(run_case(8192, 8192, 8192, False, CLUSTER, log, "8192^3 clusters"))
    if "swap" in cases:  # the swapped decode plans at the sweep's shapes
        over_shapes(ms, swap_plans)
    if "sweepdef" in cases:  # the routed plans against their epilogue drained later
        over_shapes(ms, deferred_plans)
    if any(c in cases for c in ("sweep", "sweepnew", "sweepwide", "sweepfinal", "sweepbefore")):

        def sweep_plans(m: int, n: int, k: int) -> list:
            if "sweepfinal" in cases:
                return final_plans(m, n, k)
            if "sweepwide" in cases:
                return with_splits(SWEEP_WIDE, m, n, k)
            if "sweepbefore" in cases:
                return [BEFORE]
            return [] if "pick" in cases else plans_for(m, n, "sweepnew" in cases)

        over_shapes(ms, sweep_plans)
    xs = [r["pick"]["x"] for r in recs if isinstance(r.get("pick"), dict) and "x" in r["pick"]]
    bx = [r[r["best"]]["x"] for r in recs if r.get("best")]
    for m in sorted({r["m"] for r in recs}):
        got = [r["pick"]["x"] for r in recs if r["m"] == m and "x" in r.get("pick", {})]
        best = [r[r["best"]]["x"] for r in recs if r["m"] == m and r.get("best")]
        if got and best:
            span = f"{min(best):.2f}..{max(best):.2f}x"
            print(f"M={m}: pick {min(got):.2f}..{max(got):.2f}x, best {span}")
    if xs:
        print(f"geomean pick {math.exp(sum(map(math.log, xs)) / len(xs)):.3f}x over {len(xs)}")
    if bx:
        print(f"geomean best {math.exp(sum(map(math.log, bx)) / len(bx)):.3f}x over {len(bx)}")
    print(f"elapsed {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
