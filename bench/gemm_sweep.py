"""The LLM GEMM shape sweep: ``kaio_ops.matmul`` (f16/bf16 in, output in the inputs' dtype)
against cuBLAS (``torch.matmul``) and, where Triton is installed, a Triton matmul with the same
output, over M in {1, 2, 4, ..., 8192} by the (N, K) of the Llama-3-8B and -70B layers, f16
and bf16; per-call kernel time with L2 rotated (bench/harness.py). Also the fused
``kaio_ops.linear`` epilogues (bias + activation + residual, and the SwiGLU gate) against
the separate torch ops they replace.

The ratio kaio / cuBLAS of each case is drawn as a heat map (M by shape, bench/plots.py).

Usage: ``python bench/gemm_sweep.py --out results.json [--quick]``. ``--quick`` (or
``KAIO_GEMM_SWEEP=quick``) keeps a subset that runs in about a minute: M in {1, 16, 128,
1024}, the Llama-3-8B shapes, f16, without Triton (``--triton`` puts it back). The squares
1024³ and 2048³ ("gemm square") run in both. ``--ms``, ``--models`` and ``--dtypes`` pick
any other subset; ``--mma`` also times kaio's mma.sync kernel (on sm_90 the op runs the
Hopper one); ``--sk`` also times stream-K plans (``kaio_ops._gemm_streamk``) where the
tiles do not fill the GPU in whole waves (the measurements behind ``linear.MEASURED``);
``--alt`` also times the routed plan's variant (``alt_plan``: wide stores, pairs of blocks);
``--other-memory`` also the route of a GPU of the other memory speed (``other_memory_plan``:
the H100's route on an H200 and the reverse, where ``linear.ByMemory`` entries
differ).

The Triton peer is the tutorial matmul of bench/matmul.py (f16/bf16 out), tuned here per
shape over a few standard configurations (each timed a few calls with CUDA events, the best
kept): Triton's own autotuner benchmarks for ~0.1 s a configuration and shape, which the
whole sweep cannot afford.

``--report A.json B.json --plots DIR`` prints the ratio tables of finished runs (later
files replace earlier ones' cases) and draws the heat maps from them, one against cuBLAS
and one against Triton where it ran. A sweep run in chunks (``--models``, ``--ms``,
``--dtypes``, each with its own ``--out``) is put back together this way.

Time: the full sweep is 224 cases plus the squares; ``--budget S`` stops starting cases after
S seconds (the JSON and table keep what ran), and a run cut in parts (``--models 8b
--dtypes f16``, ...) fits one at a time. Kernels compile on first use (seconds each on a
cold cache): ``--warm R/J`` compiles the kaio kernels and Triton configurations of shard R of
J of the same cases, calling each implementation once on uninitialized inputs, so that J
processes started side by side fill the disk caches before the timed run (bench/README:
``for r in $(seq 0 15); do python bench/gemm_sweep.py --warm $r/16 & done; wait``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

MS = [1 << i for i in range(14)]  # 1 .. 8192
SHAPES = {  # (N, K) of the attention QKV, attention out, MLP gate+up, MLP down layers
    "8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
}
QUICK = {"ms": [1, 16, 128, 1024], "models": ["8b"], "dtypes": ["f16"]}
SQUARES = [1024, 2048]  # M = N = K: the "gemm square" op
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
OP = "gemm sweep"  # op names: "gemm sweep f16", "gemm sweep bf16" (bench/plots.py's heat map)

try:
    import triton

    from bench.matmul import _triton_mm
except ImportError:  # no Triton: the peer is skipped
    triton = None

# (BM, BN, BK, num_stages, num_warps) tried per shape: wide tiles for large M, narrow ones
# for small M (bench/matmul.py's standard set)
TRITON_CONFIGS = {
    "large": [(128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (128, 64, 64, 4, 4)],
    "small": [(64, 128, 32, 4, 4), (64, 64, 64, 4, 4), (64, 32, 32, 5, 2)],
}
_TRITON_BEST: dict = {}


def _triton_configs(m: int) -> list[tuple]:
    """The Triton configurations tried at ``m`` rows."""
    return TRITON_CONFIGS["small"] + (TRITON_CONFIGS["large"] if m > 64 else [])


def _triton_launch(a, b, cfg: tuple):
    """C = a @ b (C in a's dtype) by bench/matmul.py's Triton kernel with one configuration."""
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk, stages, warps = cfg
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _triton_mm.fn[grid](
        a, b, c, m, n, k, BM=bm, BN=bn, BK=bk, G=8, num_stages=stages, num_warps=warps
    )
    return c


def triton_matmul(a, b):
    """The Triton peer: on its first call for a shape and dtype, each configuration of
    ``_triton_configs`` is timed (3 calls after 2, CUDA events) and the fastest kept."""
    key = (*a.shape, b.shape[1], a.dtype)
    best = _TRITON_BEST.get(key)
    if best is None:
        times = {}
        for cfg in _triton_configs(a.shape[0]):
            for _ in range(2):
                _triton_launch(a, b, cfg)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                _triton_launch(a, b, cfg)
            end.record()
            end.synchronize()
            times[cfg] = start.elapsed_time(end)
        best = _TRITON_BEST[key] = min(times, key=times.get)
    return _triton_launch(a, b, best)


def case_label(m: int, n: int, k: int) -> str:
    """The case name: ``M=<m> <N>x<K>`` (bench/plots.py reads it back for the heat map)."""
    return f"M={m} {n}x{k}"


def parse_label(label: str) -> tuple[int, str] | None:
    """(M, "NxK") of a case label, or None for another suite's label."""
    head, _, shape = label.partition(" ")
    if not head.startswith("M=") or "x" not in shape:
        return None
    return int(head[2:]), shape


def kaio_mma_sync(a, b):
    """kaio_ops.matmul forced onto the mma.sync kernel (``_gemm``), to compare with the
    Hopper kernel that the op runs on sm_90."""
    from kaio_ops import _arrays
    from kaio_ops.linear import gemm, plan

    inputs = _arrays.Inputs("matmul")
    x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
    (m, k), n = x.shape, y.shape[1]
    chosen = plan(m, n, k, _arrays.multiprocessors(x))
    return gemm("matmul", x, y, (m, n), (m, n, k), x.dtype, False, chosen=chosen)


def streamk_plans(m: int, n: int, sms: int) -> list:
    """The stream-K plans worth timing at ``m x n`` on ``sms`` multiprocessors: where the
    128 x 128 tiles make fewer than three waves (more: whole waves leave little to share),
    64-row tiles up to M = 256 and 128-row ones from M = 128, and from M = 512 the same
    with only the last partial wave shared."""
    from kaio_ops import _gemm_streamk as sk

    shapes = []
    if math.ceil(m / 128) * math.ceil(n / 128) < 3 * sms:
        shapes = [(1, 64), (1, 128)] if m <= 64 else [(1, 128), (2, 128)] if m <= 256 else []
        shapes += [(2, 128)] if m > 256 else []
    plans = [sk.Plan(wg, bn, sk.stages_for(wg, bn, False)) for wg, bn in shapes]
    if m > 256 and math.ceil(m / 128) * math.ceil(n / 128) % sms:  # only the last wave shared
        plans.append(sk.Plan(2, 128, sk.stages_for(2, 128, False), spread=0))
    return plans


def streamk_name(plan) -> str:
    """The implementation name of a stream-K plan: "kaio sk WGxBN", " s0" for spread 0."""
    return f"kaio sk {plan.wg}x{plan.bn}" + (" s0" if plan.spread == 0 else "")


def route_name(a, b) -> str:
    """What ``kaio_ops.matmul`` runs for ``a @ b`` (``linear.route``'s choice, as text)."""
    from kaio_ops import _arrays
    from kaio_ops.linear import route

    inputs = _arrays.Inputs("matmul")
    x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
    (m, k), n = x.shape, y.shape[1]
    chosen = route(x, y, (m, n, k), False, True, False)
    if isinstance(chosen, tuple):
        return f"{type(chosen).__module__.rsplit('.', 1)[-1]} {tuple(chosen)}"
    return str(chosen)


def alt_plan(a, b, sms: int):
    """The routed plan's variant that ``--alt`` times beside it (None where it has none):
    for the Hopper kernel unsplit, the same plan with 4 adjacent columns a store
    (``Plan.vec`` 1); for the persistent kernel from 256 rows, the same width in clusters of
    two sharing the B slice (``linear.Persistent`` pair 1)."""
    from kaio_ops import _arrays, _gemm_hopper
    from kaio_ops.linear import Persistent, persistent_width, route

    inputs = _arrays.Inputs("matmul")
    x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
    (m, k), n = x.shape, y.shape[1]
    chosen = route(x, y, (m, n, k), False, True, False)
    if isinstance(chosen, _gemm_hopper.Plan) and chosen.split == 1 and not chosen.vec:
        return chosen._replace(vec=1)
    if chosen == "persistent" and m >= 256:
        chosen = Persistent(persistent_width(m, n, sms))
    if isinstance(chosen, Persistent) and not chosen.pair and m >= 256:
        return chosen._replace(pair=1)
    return None


def other_memory_plan(a, b):
    """The route a GPU on the other side of ``_arrays.FAST_MEMORY`` takes for ``a @ b`` (an
    H100's on an H200 and the reverse: where ``linear.ByMemory`` entries differ), or None
    where both take this GPU's route."""
    import importlib

    from kaio_ops import _arrays

    linear = importlib.import_module("kaio_ops.linear")  # the module, not the op
    inputs = _arrays.Inputs("matmul")
    x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
    (m, k), n = x.shape, y.shape[1]
    chosen = linear.route(x, y, (m, n, k), False, True, False)
    before = _arrays.FAST_MEMORY
    try:
        routes = []
        for limit in (0.0, math.inf):  # every GPU fast, then every GPU slow
            _arrays.FAST_MEMORY = limit
            routes.append(linear.route(x, y, (m, n, k), False, True, False))
    finally:
        _arrays.FAST_MEMORY = before
    return next((r for r in routes if r != chosen), None)


def skew_plan(a, b, sms: int, skew: int):
    """The routed persistent plan with its second consumer warpgroup ``skew`` K slices
    behind the first (``linear.Persistent.skew``, at most the ring's stages), or None
    where the route is not the persistent kernel."""
    from kaio_ops import _arrays, _matmul_hopper
    from kaio_ops.linear import Persistent, persistent_width, route

    inputs = _arrays.Inputs("matmul")
    x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
    (m, k), n = x.shape, y.shape[1]
    chosen = route(x, y, (m, n, k), False, True, False)
    if chosen == "persistent":
        chosen = Persistent(persistent_width(m, n, sms))
    if not isinstance(chosen, Persistent):
        return None
    return chosen._replace(skew=min(skew, _matmul_hopper.stages_for(chosen.bn)))


def kaio_plan(chosen):
    """kaio_ops.matmul's launch with a forced plan (``linear.gemm``'s ``chosen``)."""

    def run(a, b):
        from kaio_ops import _arrays
        from kaio_ops.linear import gemm

        inputs = _arrays.Inputs("matmul")
        x, y = inputs.array(a, "a", ndim=2), inputs.array(b, "b", ndim=2)
        (m, k), n = x.shape, y.shape[1]
        return gemm("matmul", x, y, (m, n), (m, n, k), x.dtype, False, chosen=chosen)

    return run


class Budget:
    """Stops starting cases once ``seconds`` have passed (None: never), counting what was
    skipped; ``warm``: (shard, shards) of warm mode (``--warm``), else None."""

    def __init__(self, seconds: float | None, warm: tuple[int, int] | None = None):
        self.start = time.perf_counter()
        self.seconds = seconds
        self.warm = warm
        self.index = -1
        self.skipped = 0

    def take(self) -> bool:
        """Whether the next case runs (in warm mode: whether it is this shard's)."""
        self.index += 1
        if self.warm is not None:
            return self.index % self.warm[1] == self.warm[0]
        if self.seconds is not None and time.perf_counter() - self.start > self.seconds:
            self.skipped += 1
            return False
        return True


def warm_case(make_empty, impls: dict) -> None:
    """Warm mode: call each kaio implementation once on uninitialized inputs of the case's
    shape (compiling its kernels into the disk cache; Triton's are ``warm_triton``'s)."""
    args = make_empty()
    for name, fn in impls.items():
        if name in ("cuBLAS", "Triton", "torch"):
            continue
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  (warming must go on; the timed run reports it)
            print(f"warm {name}: {type(e).__name__}: {e}"[:200], flush=True)


def warm_triton(dtypes: list[str], shard: int, shards: int) -> None:
    """Warm mode: compile shard ``shard`` of ``shards`` of the Triton kernels the sweep can
    use (each configuration for M = 1, M not a multiple of 16, and a multiple: Triton
    specializes on them), on small inputs."""
    jobs = [
        (dt, cfg, m)
        for dt in dtypes
        for m in (1, 2, 16, 128)
        for cfg in _triton_configs(m)
        if m <= 64 or cfg in TRITON_CONFIGS["large"]
    ]
    for dt, cfg, m in jobs[shard::shards]:
        a = torch.zeros(m, 256, device="cuda", dtype=DTYPES[dt])
        _triton_launch(a, torch.zeros(256, 256, device="cuda", dtype=DTYPES[dt]), cfg)


def sweep(
    h: Harness,
    ms: list[int],
    models: list[str],
    dtypes: list[str],
    mma: bool = False,
    use_triton: bool = True,
    op: str = OP,
    budget: Budget | None = None,
    sk: bool = False,
    alt: bool = False,
    skews: tuple = (),
    shapes: tuple = (),
    other: bool = False,
) -> None:
    """One harness case per (dtype, model shape, M) (``models``: names of ``SHAPES``, or
    "square": M = N = K for each M of ``ms``); ``mma``: also the mma.sync kernel;
    ``use_triton``: also Triton (tuned per shape); ``sk``: also stream-K plans
    (``streamk_plans``); ``alt``: also the routed plan's variant (``alt_plan``); ``skews``:
    also the routed persistent plan with each skew (``skew_plan``); ``shapes``: only these
    "NxK" shapes (default all); ``other``: also the route of the other side of
    ``_arrays.FAST_MEMORY`` (``other_memory_plan``); ``budget``: stops starting cases when
    spent (or warm mode)."""
    budget = budget or Budget(None)
    sms = h.meta.get("sms", 132)
    for name in dtypes:
        dt = DTYPES[name]
        tol = 3e-3 if dt == torch.float16 else 2e-2
        for model in models:
            for n, k in SHAPES.get(model, [(0, 0)]):
                if shapes and f"{n}x{k}" not in shapes:
                    continue
                for m in ms:
                    if model == "square":
                        n = k = m

                    def make(m=m, n=n, k=k, dt=dt):
                        a = torch.randn(m, k, device="cuda").to(dt)
                        b = (torch.randn(k, n, device="cuda") * k**-0.5).to(dt)
                        return a, b

                    impls = {"kaio": kaio_ops.matmul, "cuBLAS": torch.matmul}
                    if mma:
                        impls["kaio mma.sync"] = kaio_mma_sync
                    if use_triton and triton is not None:
                        impls["Triton"] = triton_matmul
                    if alt:
                        found = alt_plan(
                            torch.empty(m, k, device="cuda", dtype=dt),
                            torch.empty(k, n, device="cuda", dtype=dt),
                            sms,
                        )
                        if found is not None:
                            impls["kaio alt"] = kaio_plan(found)
                    if other:
                        found = other_memory_plan(
                            torch.empty(m, k, device="cuda", dtype=dt),
                            torch.empty(k, n, device="cuda", dtype=dt),
                        )
                        if found is not None:
                            impls["kaio other memory"] = kaio_plan(found)
                    for s in skews:
                        found = skew_plan(
                            torch.empty(m, k, device="cuda", dtype=dt),
                            torch.empty(k, n, device="cuda", dtype=dt),
                            sms,
                            s,
                        )
                        if found is not None:
                            impls[f"kaio skew{s}"] = kaio_plan(found)
                    if sk:
                        for p in streamk_plans(m, n, sms):
                            impls[streamk_name(p)] = kaio_plan(p)
                    if not budget.take():
                        continue
                    if budget.warm is not None:

                        def empty(m=m, n=n, k=k, dt=dt):
                            a = torch.empty(m, k, device="cuda", dtype=dt)
                            return a, torch.empty(k, n, device="cuda", dtype=dt)

                        warm_case(empty, impls)
                        continue
                    big = m * n * k > 2**36  # the float64 reference would take seconds
                    done = h.case(
                        f"{op} {name}",
                        case_label(m, n, k),
                        make,
                        impls,
                        reference=(lambda a, b: a.float() @ b.float())
                        if big
                        else (lambda a, b: a.double() @ b.double()),
                        tol=tol,
                        nbytes=(m * k + k * n + m * n) * 2,
                        flops=2.0 * m * n * k,
                        baseline="cuBLAS",
                    )
                    for r in done:
                        if r.impl == "kaio":
                            a = torch.empty(m, k, device="cuda", dtype=dt)
                            b = torch.empty(k, n, device="cuda", dtype=dt)
                            r.note = (r.note + " " if r.note else "") + route_name(a, b)
                    if done:
                        h.save()


def epilogues(h: Harness, ms: list[int], budget: Budget | None = None) -> None:
    """``linear`` with its epilogue fused against torch's separate ops, Llama-3-8B MLP
    shapes: gelu + bias + residual on the down projection, the SwiGLU gate on gate+up."""
    F = torch.nn.functional
    budget = budget or Budget(None)
    for m in ms:
        for act, n, k in (("gelu", 4096, 14336), ("silu_gate", 14336, 4096)):
            rows = 2 * n if act == "silu_gate" else n
            if not budget.take():
                continue

            def make(m=m, n=n, k=k, rows=rows):
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                w = (torch.randn(rows, k, device="cuda") * k**-0.5).half()
                b = torch.randn(rows, device="cuda", dtype=torch.float16)
                r = torch.randn(m, n, device="cuda", dtype=torch.float16)
                return x, w, b, r

            def torch_ops(x, w, b, r, act=act):
                z = F.linear(x, w, b)
                if act == "silu_gate":
                    g, u = z.chunk(2, -1)
                    return F.silu(g) * u + r
                return F.gelu(z) + r

            def ref(x, w, b, r, act=act):
                z = F.linear(x.float(), w.float(), b.float())
                if act == "silu_gate":
                    g, u = z.chunk(2, -1)
                    return F.silu(g) * u + r.float()
                return F.gelu(z) + r.float()

            if budget.warm is not None:
                warm_case(make, {"kaio": lambda *t, act=act: kaio_ops.linear(
                              t[0], t[1], t[2], residual=t[3], activation=act)})  # fmt: skip
                continue
            h.case(
                f"linear {act} + bias + residual",
                case_label(m, n, k),
                make,
                {
                    "kaio": lambda x, w, b, r, act=act: kaio_ops.linear(
                        x, w, b, residual=r, activation=act
                    ),
                    "torch": torch_ops,
                },
                reference=ref,
                tol=3e-3,
                nbytes=(m * k + rows * k + 2 * m * n) * 2,
                flops=2.0 * m * rows * k,
                baseline="torch",
            )


def report(paths: list[str], plot_dir: str | None = None) -> str:
    """Markdown tables of the sweep JSONs at ``paths`` (a case in a later file replaces
    every record of that case in earlier ones, so that no ratio mixes two runs): per op,
    peer time / kaio time by shape (rows) and M (columns) for cuBLAS and Triton, with the
    geometric mean and range; heat maps (bench/plots.py) into ``plot_dir``."""
    import json

    from bench import perfdata, plots

    found: dict[tuple[str, str], list] = {}  # (op, case) -> its records, the last file's
    gpus = set()
    for path in paths:
        with open(path) as fh:
            raw = json.load(fh)
        gpus.add(raw.get("meta", {}).get("gpu", "?"))
        mine: dict[tuple[str, str], list] = {}
        for d in raw.get("results", []):
            rec = perfdata.Record.from_dict(d)
            mine.setdefault((rec.op, rec.case), []).append(rec)
        found.update(mine)  # a case of a later file replaces all of the case's records
    ops: dict[str, perfdata.Op] = {}
    for (op, _), records in found.items():
        for rec in records:
            ops.setdefault(op, perfdata.Op("gemm-sweep", op)).add(rec)
    lines = [f"GPU: {', '.join(sorted(gpus))}"]
    for op in ops.values():
        for peer in ("cuBLAS", "Triton", "torch"):
            cells = {}
            for case in op.cases:
                kaio, other = op.get(case, "kaio"), op.get(case, peer)
                if kaio and other and kaio.timed and other.timed:
                    cells[case] = other.ms / kaio.ms
            if not cells:
                continue
            at = {parse_label(c) or (0, c): v for c, v in cells.items()}
            ms = sorted({m for m, _ in at})
            shapes = list(dict.fromkeys(s for _, s in at))
            gm = math.exp(sum(math.log(v) for v in cells.values()) / len(cells))
            lines += [
                "",
                f"{op.name}: {peer} time / kaio time over {len(cells)} cases: geometric mean "
                f"{gm:.3f}x, {min(cells.values()):.2f}x to {max(cells.values()):.2f}x",
                "",
                "| N x K | " + " | ".join(f"M={m}" for m in ms) + " |",
                "|---|" + "---|" * len(ms),
            ]
            for shape in shapes:
                row = [f"{at[(m, shape)]:.2f}" if (m, shape) in at else "" for m in ms]
                lines.append(f"| {shape} | " + " | ".join(row) + " |")
        if plot_dir and op.name.startswith(plots.SWEEP_OP):
            os.makedirs(plot_dir, exist_ok=True)
            for peer in ("cuBLAS", "Triton"):  # a heat map a peer that ran
                if not any(op.get(case, peer) for case in op.cases):
                    continue
                tail = "" if peer == "cuBLAS" else f"-{peer.lower()}"
                path = os.path.join(plot_dir, f"{perfdata.slug(op.name)}{tail}-heatmap.png")
                plots._sweep_heatmap(plots._pyplot(), op, path, peer)
                lines.append(f"\n(heat map against {peer}: {path})")
    return "\n".join(lines)


def propose(paths: list[str], margin: float = 0.02) -> str:
    """``linear.MEASURED``'s B [K, N] entries remade from sweep JSONs run with ``--sk``: at
    each measured M the fastest stream-K plan where it beats the op's own choice by
    ``margin``, else the table's choice as it was ("rules": ``route``'s rules); as Python
    lines to paste."""
    import json

    from bench.gemm_plans import route_steps
    from kaio_ops import _gemm_streamk as sk
    from kaio_ops.linear import MEASURED

    times: dict = {}
    for path in paths:
        with open(path) as fh:
            for d in json.load(fh).get("results", []):
                at = parse_label(d.get("case", ""))
                if at and d.get("ok") and d.get("ms") and "f16" in d.get("op", ""):
                    times.setdefault(at, {})[d["impl"]] = d["ms"]
    wins: dict = {}
    for (m, shape), t in times.items():
        plans = {i: v for i, v in t.items() if i.startswith("kaio sk ")}
        if "kaio" in t and plans:
            best = min(plans, key=plans.get)
            if plans[best] < (1 - margin) * t["kaio"]:
                tiles, *spread = best.removeprefix("kaio sk ").split()
                wg, bn = (int(v) for v in tiles.split("x"))
                stages = sk.stages_for(wg, bn, False)
                wins[(m, shape)] = sk.Plan(wg, bn, stages, 0, 0 if spread else 1)
    lines = []
    for shape in sorted({s for _, s in wins}):
        n, k = (int(v) for v in shape.split("x"))
        old = MEASURED.get((n, k, "kn"), [])
        points = {most for most, _ in old} | {m for m, s in times if s == shape}
        entries = route_steps(
            old, points, lambda p, before, shape=shape: wins.get((p, shape), before(p))
        )
        text = ", ".join(f"({p}, {_code(c)})" for p, c in entries)
        lines.append(f'    ({n}, {k}, "kn"): [{text}],')
    return "\n".join(lines)


def _code(choice) -> str:
    """A MEASURED choice as the table's source writes it (``gemm_plans.choice_source``)."""
    from bench.gemm_plans import choice_source

    return choice_source(choice)


def use_routes(path: str, quiet: bool = False) -> None:
    """Put the plans that beat the op's own choice in a bench/gemm_plans.py run (JSON at
    ``path``) into ``linear.MEASURED`` for this process, and print the changed entries as
    source (to check into kaio_ops/linear.py)."""
    import importlib
    import json

    from bench import gemm_plans

    with open(path) as fh:
        found = gemm_plans.wins(json.load(fh).get("rows", []))
    table = importlib.import_module("kaio_ops.linear").MEASURED
    table.update(gemm_plans.measured_with(found))
    if not quiet:
        changed = {key: table[key] for key in found}
        print("linear.MEASURED entries from the plan search:\n" + gemm_plans.table_source(changed))


def main(argv: list[str] | None = None) -> None:
    """Run the sweep (a subset with --quick or KAIO_GEMM_SWEEP=quick) and the epilogues."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the ~1 minute subset")
    p.add_argument("--ms", help="comma-separated M values (default 1..8192, powers of 2)")
    p.add_argument("--models", help="comma-separated: 8b, 70b (default both), or none")
    p.add_argument("--dtypes", help="comma-separated: f16, bf16 (default both)")
    p.add_argument("--mma", action="store_true", help="also time the mma.sync kernel")
    p.add_argument(
        "--triton",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time Triton too (default: yes, except with --quick)",
    )
    p.add_argument("--no-epilogues", action="store_true", help="skip the fused linear cases")
    p.add_argument("--no-squares", action="store_true", help="skip the squares 1024³, 2048³")
    p.add_argument("--sk", action="store_true", help="also time stream-K plans")
    p.add_argument("--alt", action="store_true", help="also the routed plan's variant")
    p.add_argument(
        "--other-memory", action="store_true", help="also the route of the other memory speed"
    )
    p.add_argument("--skew", help="comma-separated K slices: also the persistent plan so skewed")
    p.add_argument("--shapes", help="comma-separated NxK: only these shapes of the models")
    p.add_argument("--budget", type=float, help="seconds to start cases in (default: no limit)")
    p.add_argument("--warm", help="R/J: compile shard R of J of the cases' kernels, time nothing")
    p.add_argument("--routes", help="a bench/gemm_plans.py JSON: its wins go into the table")
    p.add_argument("--report", nargs="+", help="JSON files: print their tables, time nothing")
    p.add_argument("--plots", help="with --report: draw the heat maps into this directory")
    args, rest = p.parse_known_args(argv)
    if args.report:
        print(report(args.report, args.plots))
        print("\nstream-K wins (linear.MEASURED, B [K, N]):\n" + propose(args.report))
        return
    if args.routes:
        use_routes(args.routes, quiet=bool(args.warm))
    quick = args.quick or os.environ.get("KAIO_GEMM_SWEEP") == "quick"
    warm = tuple(int(v) for v in args.warm.split("/")) if args.warm else None
    budget = Budget(args.budget, warm)
    h = Harness.from_args("LLM GEMM shape sweep", rest, reps=20 if quick else 30)
    ms = [int(v) for v in args.ms.split(",")] if args.ms else (QUICK["ms"] if quick else MS)
    models = (
        args.models.split(",") if args.models else (QUICK["models"] if quick else ["8b", "70b"])
    )
    if models == ["none"]:  # only the squares and the epilogues
        models = []
    dtypes = (
        args.dtypes.split(",") if args.dtypes else (QUICK["dtypes"] if quick else ["f16", "bf16"])
    )
    use_triton = not quick if args.triton is None else args.triton
    if not args.no_squares:
        sweep(h, SQUARES, ["square"], dtypes, args.mma, use_triton, "gemm square", budget, args.sk,
              args.alt)  # fmt: skip
    if not args.no_epilogues:
        epilogues(h, [16, 4096] if quick else [1, 16, 256, 4096], budget)
    skews = tuple(int(v) for v in args.skew.split(",")) if args.skew else ()
    shapes = tuple(args.shapes.split(",")) if args.shapes else ()
    sweep(h, ms, models, dtypes, args.mma, use_triton, OP, budget, args.sk, args.alt, skews,
          shapes, args.other_memory)  # fmt: skip
    if warm is not None:
        if use_triton and triton is not None:
            warm_triton(dtypes, *warm)
        torch.cuda.synchronize()
        return
    if budget.skipped:
        print(f"budget of {args.budget:.0f} s spent: {budget.skipped} cases not started")
    h.meta["skipped_cases"] = budget.skipped
    print(h.table())
    print(summary(h))
    h.finish()


def summary(h: Harness) -> str:
    """Per op: the geometric mean and the range of cuBLAS time / kaio time (and / Triton
    time), the cases below 0.9x, as text."""
    lines = []
    by_op: dict = {}
    for r in h.results:
        if r.ms:
            by_op.setdefault(r.op, {}).setdefault(r.case, {})[r.impl] = r.ms
    for op, cases in by_op.items():
        for peer in ("cuBLAS", "Triton", "torch"):
            ratios = {c: t[peer] / t["kaio"] for c, t in cases.items() if "kaio" in t and peer in t}
            if not ratios:
                continue
            gm = math.exp(sum(math.log(v) for v in ratios.values()) / len(ratios))
            low = sorted((v, c) for c, v in ratios.items() if v < 0.9)
            lines.append(
                f"{op}: kaio vs {peer} over {len(ratios)} cases: geomean {gm:.3f}x, "
                f"{min(ratios.values()):.2f}x to {max(ratios.values()):.2f}x"
                + (f"; below 0.9x: {', '.join(f'{c} {v:.2f}' for v, c in low)}" if low else "")
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
