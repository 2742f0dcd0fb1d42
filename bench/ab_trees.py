"""Time the same kaio_ops calls from two source trees in one process, interleaved: an A/B
check that a rewrite left the ops' speed alone (same run, same GPU, CUDA events).

    python bench/ab_trees.py BASE_TREE NEW_TREE [--reps 7] [--json out.json]

Each tree is a folder holding ``kaio`` and ``kaio_ops`` (a checkout, or ``git archive REV kaio
kaio_ops`` unpacked). Both are imported into this process under their own names: before each
tree's calls ``sys.modules`` is switched to that tree's modules, so that imports made inside
a call (kaio imports lazily) resolve to the same tree. Each case is timed per call with the
host path included (events around ``CALLS`` back-to-back calls) and as kernel time (the same
calls replayed from a CUDA graph), the trees alternating ``--reps`` times; the figures are
medians, and ``noise`` is the spread of the first tree's repetitions (max/min - 1).
Only public ops are called, so any two trees with the same API compare.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

ROOTS = ("kaio", "kaio_ops")
CALLS = 20


def _ours(name: str) -> bool:
    return name.split(".")[0] in ROOTS


class Tree:
    """One source tree's kaio and kaio_ops, importable side by side with another's."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        sys.path.insert(0, self.path)
        try:
            import kaio_ops  # noqa: F401

            self.modules = {n: m for n, m in sys.modules.items() if _ours(n)}
            self.ops = sys.modules["kaio_ops"]
            self.kaio = sys.modules["kaio"]
        finally:
            sys.path.remove(self.path)

    def use(self):
        """Make this tree's modules the ones ``import`` finds."""
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        sys.modules.update(self.modules)
        sys.path.insert(0, self.path)
        return self

    def done(self):
        """Keep the modules this tree imported since ``use`` (lazy imports inside calls)."""
        self.modules = {n: m for n, m in sys.modules.items() if _ours(n)}
        sys.path.remove(self.path)


def _int4(k: int, n: int, g):
    words = torch.randint(
        -(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device="cuda", generator=g
    )
    scales = (torch.rand((k // 128, n), device="cuda", generator=g) * 0.02 + 0.01).half()
    return words, scales


def cases(g):
    """(name, environment, [argument sets], call(ops, *args)): the rewritten ops' calls."""
    h = lambda *s, dt=torch.float16: torch.randn(s, device="cuda", dtype=dt, generator=g)  # noqa: E731
    out = []

    def decode(b, length, dt, paged):
        sets = []
        for _ in range(2):
            q = h(b, 32, 1, 128, dt=dt)
            if paged:
                pages = b * length // 16
                kc, vc = h(pages, 16, 8, 128, dt=dt), h(pages, 16, 8, 128, dt=dt)
                table = torch.randperm(pages, device="cuda", generator=g).int().view(b, -1)
            else:
                kc, vc = h(b, 8, length, 128, dt=dt), h(b, 8, length, 128, dt=dt)
                table = None
            lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
            sets.append((q, kc, vc, lens, table))
        return sets

    def call_decode(ops, q, kc, vc, lens, table):
        return ops.flash_attention_decode(q, kc, vc, lens, table)

    out.append(("decode f16 B1 L4096", {}, decode(1, 4096, torch.float16, False), call_decode))
    out.append(("decode f16 B16 L1024", {}, decode(16, 1024, torch.float16, False), call_decode))
    out.append(
        ("decode bf16 B4 L4096 paged", {}, decode(4, 4096, torch.bfloat16, True), call_decode)
    )

    def append_call(ops, q, kc, vc, lens, table):
        return ops.kv_cache_append(kc, vc, q, q, lens, table)

    sets = [(h(16, 8, 1, 128), *s[1:]) for s in decode(16, 1024, torch.float16, False)]
    out.append(("kv_cache_append B16", {}, sets, append_call))

    for m in (1, 16, 64):
        sets = [(h(m, 4096), *_int4(4096, 4096, g)) for _ in range(3)]
        out.append(
            (f"matmul_int4 M{m} 4096x4096", {}, sets, lambda ops, x, w, s: ops.matmul_int4(x, w, s))
        )
    for m in (1, 16):
        sets = []
        for _ in range(3):
            wq, sq = _int4(4096, 4096, g)
            wk, sk = _int4(4096, 1024, g)
            wv, sv = _int4(4096, 1024, g)
            sets.append((h(m, 4096), wq, wk, wv, sq, sk, sv))
        out.append((f"qkv_project_int4 M{m}", {}, sets, lambda ops, *a: ops.qkv_project_int4(*a)))
    for m in (16, 256):
        sets = []
        for _ in range(2):
            w = [
                torch.randint(-128, 127, (4096, n), dtype=torch.int8, device="cuda", generator=g)
                for n in (4096, 1024, 1024)
            ]
            sets.append((h(m, 4096), *w))
        out.append(
            (
                f"qkv_project_int8 M{m}",
                {},
                sets,
                lambda ops, x, a, b, c: ops.qkv_project_int8(x, a, b, c, 0.01, 0.01, 0.01),
            )
        )
    sets = [
        tuple(
            torch.randint(-128, 127, s, dtype=torch.int8, device="cuda", generator=g)
            for s in ((256, 4096), (4096, 4096))
        )
        for _ in range(2)
    ]
    out.append(
        (
            "matmul_int8 M256 (mma.sync)",
            {"KAIO_HOPPER_MATMUL": "0"},
            sets,
            lambda ops, a, b: ops.matmul_int8(a, b),
        )
    )
    mm = lambda ops, a, b: ops.matmul_tc_async(a, b)  # noqa: E731
    for m, n, k in ((4096, 4096, 4096), (16, 4096, 4096), (1, 4096, 4096)):
        sets = [(h(m, k), h(k, n)) for _ in range(2)]
        out.append(
            (f"matmul_tc_async {m}x{n}x{k} (mma.sync)", {"KAIO_HOPPER_MATMUL": "0"}, sets, mm)
        )
    sets = [(h(4096, 4096), h(4096, 4096)) for _ in range(2)]
    out.append(("matmul_tc_async 4096^3 (default: Hopper persistent)", {}, sets, mm))
    sets = [(h(2048, 2048), h(2048, 2048)) for _ in range(2)]
    out.append(
        (
            "matmul_tc 2048^3 (no cp.async)",
            {"KAIO_HOPPER_MATMUL": "0"},
            sets,
            lambda ops, a, b: ops.matmul_tc(a, b),
        )
    )
    lin = lambda ops, x, w, b, r: ops.linear(x, w, b, residual=r, activation="gelu")  # noqa: E731
    gate = lambda ops, x, w, b, r: ops.linear(x, w, b, activation="silu_gate")  # noqa: E731
    for m, env, tag in (
        (512, {}, "default route"),
        (512, {"KAIO_HOPPER_MATMUL": "0"}, "mma.sync"),
        (32, {"KAIO_HOPPER_MATMUL": "0"}, "mma.sync"),
    ):
        sets = [(h(m, 4096), h(4096, 4096), h(4096), h(m, 4096)) for _ in range(2)]
        out.append((f"linear gelu+bias+res M{m} 4096x4096 ({tag})", env, sets, lin))
    sets = [(h(2048, 4096), h(4096, 4096), h(4096), h(2048, 4096)) for _ in range(2)]
    out.append(("linear gelu+bias+res M2048 4096x4096 (default route)", {}, sets, lin))
    sets = [(h(256, 4096), h(2 * 7168, 4096), h(2 * 7168), None) for _ in range(2)]
    out.append(("linear silu_gate M256 F7168 (default route)", {}, sets, gate))
    sets = [
        (
            h(16, 4096, dt=torch.bfloat16),
            h(4096, 4096, dt=torch.bfloat16),
            h(4096, dt=torch.bfloat16),
            h(16, 4096, dt=torch.bfloat16),
        )
        for _ in range(2)
    ]
    out.append(
        ("linear bf16 M16 4096x4096 (mma.sync, K split)", {"KAIO_HOPPER_MATMUL": "0"}, sets, lin)
    )
    f32 = torch.float32
    sets = [tuple(h(2048, 128, dt=f32) for _ in range(3)) for _ in range(2)]
    fwd = lambda ops, *a: ops.attention_flash_causal(*a)  # noqa: E731
    out.append(("attention_flash_causal f32 S2048 D128 (SIMT)", {}, sets, fwd))
    bwd = [(h(2048, 128, dt=f32), q, k, v, *_stats(q, k, v)) for q, k, v in sets]
    back = lambda ops, *a: ops.attention_flash_bwd_causal(*a)  # noqa: E731
    out.append(("attention_flash_bwd_causal f32 S2048 D128 (SIMT)", {}, bwd, back))
    sets = [tuple(h(1, 32, 2048, 128) for _ in range(3)) for _ in range(2)]
    fa = lambda ops, q, k, v: ops.flash_attention(q, k, v, causal=True)  # noqa: E731
    out.append(("flash_attention f16 B1 H32 S2048 D128 causal", {}, sets, fa))
    return out


def _stats(q, k, v):
    """(out, lse) of causal f32 attention of q, k, v [S, D] in torch: the backward's inputs."""
    s = (q @ k.T) / q.shape[1] ** 0.5
    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, 1) @ v, torch.logsumexp(s, 1).contiguous()


def _setenv(env: dict, tree: Tree):
    for key in ("KAIO_HOPPER_MATMUL",):
        os.environ.pop(key, None)
    os.environ.update(env)
    tree.ops._plan.clear()  # plans keep the settings they were built with


def eager(fn, sets) -> float:
    """µs per call, host path included: events around CALLS back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(CALLS):
        fn(*sets[i % len(sets)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / CALLS


def graphed(fn, sets):
    """A CUDA graph of CALLS calls (kernel time), or None where capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in sets:
            fn(*a)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(CALLS):
                fn(*sets[i % len(sets)])
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:120]
    return graph


def replay(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / CALLS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", default=None)
    p.add_argument("--only", default=None, help="a substring of the case names to run")
    p.add_argument("--budget", type=float, default=None, help="seconds: start no case after")
    p.add_argument(
        "--warm",
        default=None,
        metavar="T:I/N",
        help="only compile: tree T (0 or 1) runs cases I, I + N, ... once (processes in "
        "parallel fill kaio's disk cache before the timed run)",
    )
    args = p.parse_args()
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    all_cases = cases(g)
    if args.warm:
        which, part = args.warm.split(":")
        i, n = map(int, part.split("/"))
        tree = Tree(args.trees[int(which)]).use()
        for name, env, sets, call in all_cases[i::n]:
            _setenv(env, tree)
            try:
                call(tree.ops, *sets[0])
            except Exception as e:  # noqa: BLE001  (the timed run reports it)
                print(f"warm {which} {name}: {type(e).__name__}: {e}"[:300], flush=True)
        torch.cuda.synchronize()
        return
    trees = [Tree(t) for t in args.trees]
    rows = []
    print(torch.cuda.get_device_name(), flush=True)
    began = time.monotonic()
    for name, env, sets, call in all_cases:
        if args.only and args.only not in name:
            continue
        if args.budget and time.monotonic() - began > args.budget:
            rows.append({"case": name, "error": "skipped: out of time"})
            continue
        per = {}
        try:
            fns, graphs = [], []
            for t in trees:
                t.use()
                _setenv(env, t)
                fn = functools.partial(call, t.ops)
                for a in sets:  # compile and warm
                    fn(*a)
                torch.cuda.synchronize()
                fns.append(fn)
                graphs.append(graphed(fn, sets))
                t.done()
            times = [[[], []] for _ in trees]
            for _ in range(args.reps):
                for i, t in enumerate(trees):
                    t.use()
                    _setenv(env, t)
                    times[i][0].append(eager(fns[i], sets))
                    if not isinstance(graphs[i], str):
                        times[i][1].append(replay(graphs[i]))
                    t.done()
            per = {
                "eager": [statistics.median(t[0]) for t in times],
                "graph": [statistics.median(t[1]) if t[1] else None for t in times],
                "noise": max(times[0][0]) / min(times[0][0]) - 1,
                "graph_noise": (max(times[0][1]) / min(times[0][1]) - 1) if times[0][1] else None,
                "graph_error": [x for x in graphs if isinstance(x, str)],
            }
        except Exception as e:  # noqa: BLE001
            per = {"error": f"{type(e).__name__}: {e}"[:300]}
        rows.append({"case": name, **per})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    head = ("eager A", "eager B", "B/A", "noise", "graph A", "graph B", "B/A")
    print(f"\n{'case':52s} " + " ".join(f"{x:>9s}" if "A" in x[-2:] else f"{x:>6s}" for x in head))
    for r in rows:
        if "error" in r:
            print(f"{r['case']:52s} {r['error'][:80]}")
            continue
        ea, eb = r["eager"]
        ga, gb = r["graph"]
        gr = f"{gb / ga:6.3f}" if ga and gb else "   n/a"
        gs = f"{ga:9.1f} {gb:9.1f}" if ga and gb else f"{'n/a':>9s} {'n/a':>9s}"
        print(f"{r['case']:52s} {ea:9.1f} {eb:9.1f} {eb / ea:6.3f} {r['noise']:6.1%} {gs} {gr}")


if __name__ == "__main__":
    main()
