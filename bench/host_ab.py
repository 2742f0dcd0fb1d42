"""Host time per ``kaio_ops`` call at decode size from two source trees in one process, in
interleaved rounds behind a GPU spinner (``bench/launch_overhead.py``'s method and shapes),
beside torch eager doing the same work: an A/B of a change to the op-call path.

    python bench/host_ab.py BASE_TREE NEW_TREE --ops rms_norm matmul_fp8 [--batches 10] [--cpu-time]
    python bench/host_ab.py BASE_TREE NEW_TREE --ops rms_norm --python-only
    python bench/host_ab.py BASE_TREE NEW_TREE --launch

``--python-only``: the ops' Python side alone, each plan's driver call swapped for a native
call of a C function that does nothing while its batches run (``host_parts.Swapped``): the
part of a call a change to the op-call path changes, without the driver's time and noise.

``--launch``: the bare launch of ``launch_overhead``'s 4-argument ``add`` instead, each tree
compiling its own copy: the subscript spelled each call and the launch taken after a first
launch, with ``DeviceArray``s and with torch tensors, each checked first on a poisoned output.

Each tree is a folder holding ``kaio`` and ``kaio_ops`` (``bench/ab_trees.py``'s ``Tree``:
both imported side by side, ``sys.modules`` switched to a tree while its calls are set up).
Before timing, each op of each tree is called ``CHECKS`` times, its first input (when a
float one) redrawn in place before each call, and every result compared with torch's on the
same inputs (the first call builds the plan, the next replay it, and the later ones take
whatever path a call made again and again takes). A tree whose op fails the check is
reported, not timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench.ab_trees import Tree

CHECKS = 5
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _redraw(args: tuple) -> None:
    """New random values, in place, in the first argument when it is a float tensor (the
    others may be tied to what the peer reads: int4's scales to its f16 weights)."""
    if args[0].dtype in FLOATS:
        args[0].copy_(torch.randn_like(args[0]))


def _check(label: str, op, args: tuple, torch_call) -> None:
    """Raise unless CHECKS calls of ``op``, each on redrawn inputs, match torch's result."""
    for _ in range(CHECKS):
        _redraw(args)
        got = op(*args)
        if op.__name__ == "matmul_int8":  # the peer multiplies other (f16) weights
            want = args[0].double() @ args[1].double()
        else:
            want = torch_call()
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=False):
            g, w = g.double(), w.double()
            error = (torch.linalg.norm(g - w) / torch.linalg.norm(w)).item()
            if not error < 1e-2:
                raise AssertionError(f"{label}: relative error {error:.2e} against torch")


def _turns():
    """``launch_overhead.op_pairs``'s form of ``linear`` over two weights of other shapes
    taking turns, as a layer's projections do (``linear_turns``: two calls a call of the
    row)."""
    import torch.nn.functional as F

    import kaio_ops

    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    w1, w2 = (torch.randn(n, 4096, device="cuda", dtype=torch.float16) for n in (4096, 1024))

    def linear_turns(x, w1, w2):
        return kaio_ops.linear(x, w1), kaio_ops.linear(x, w2)

    label = "linear [1, 4096] x [4096, 4096]^T, then x [1024, 4096]^T (2 calls)"
    return (
        label,
        linear_turns,
        (x, w1, w2),
        "F.linear, twice",
        lambda: (F.linear(x, w1), F.linear(x, w2)),
    )


def _chain():
    """``launch_overhead.op_pairs``'s form of ``add`` in a chain, ``h = add(h, r)``, as a
    residual stream runs (``add_chain``: each call's input is the last call's output)."""
    import kaio_ops

    r = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    h, last = [torch.randn(1, 4096, device="cuda", dtype=torch.float16)], [None]

    def add_chain(first, r):
        last[0] = h[0]  # (the input, for the check's torch call)
        h[0] = kaio_ops.add(h[0], r)
        return h[0]

    label = "add [1, 4096] f16, in a chain h = add(h, r)"
    return label, add_chain, (h[0], r), "h + r", lambda: last[0] + r


ADD_SOURCE = """
import kaio
from kaio import f32, u32


@kaio.gpu_kernel(block_size=256)
def add(x: f32[:], y: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[i] + y[i]
"""


def _tree_add(tree: Tree, folder: str, which: str):
    """``add`` compiled by ``tree``'s kaio (a module of its own, importing that kaio)."""
    import importlib.util
    import os

    path = os.path.join(folder, f"add_{which}.py")
    with open(path, "w") as f:
        f.write(ADD_SOURCE)
    spec = importlib.util.spec_from_file_location(f"host_ab_add_{which}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.add


def launch_rows(bench, L, trees: list) -> list[str]:
    """The bare launch rows of each tree (``--launch``), and the new tree's floor rows
    (``launch_overhead.floor_rows``); returns the launch rows' names without the tree."""
    import tempfile

    import numpy as np

    n, grid = L.N, L.GRID
    hx, hy = (np.random.default_rng(s).standard_normal(n).astype(np.float32) for s in (0, 1))
    tx, ty = torch.from_numpy(hx).cuda(), torch.from_numpy(hy).cuda()
    tout = torch.empty(n, device="cuda")
    folder = tempfile.mkdtemp()
    names = []
    for which, tree in zip(("base", "new"), trees, strict=True):
        tree.use()
        kaio = tree.kaio
        x, y, out = kaio.to_device(hx), kaio.to_device(hy), kaio.empty((n,), kaio.f32)
        for kind, args in (("DeviceArray", (x, y, out, n)), ("torch", (tx, ty, tout, n))):
            spelled, later = _tree_add(tree, folder, which), _tree_add(tree, folder, which)
            later[grid, 256](*args)
            direct = later[grid, 256]
            for label, call in (
                (f"add[grid, 256](...), {kind}", lambda k=spelled, a=args: k[grid, 256](*a)),
                (f"launch taken after a first launch, {kind}", lambda d=direct, a=args: d(*a)),
            ):
                nan = np.full(n, np.nan, np.float32)
                if kind == "torch":
                    tout.copy_(torch.from_numpy(nan))
                else:
                    out.copy_from_host(nan)
                call()
                kaio.synchronize()
                got = tout.cpu().numpy() if kind == "torch" else out.numpy()
                if not np.array_equal(got, hx + hy):
                    raise AssertionError(f"{which} {label}: a wrong result")
                bench.row(f"{which} {label}", call)
                if which == "base":
                    names.append(label)
        if which == "new":  # the floor: the same launch's driver call alone, made once
            L.floor_rows(bench, x, y, out)
        tree.done()
    return names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs=2, help="BASE_TREE NEW_TREE")
    p.add_argument("--launch", action="store_true", help="the bare launch rows instead of ops")
    p.add_argument(
        "--ops",
        nargs="+",
        default=[],
        help="kaio_ops names (launch_overhead's), linear_turns (linear over two weights taking "
        "turns), add_chain (h = add(h, r))",
    )
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--spin-ms", type=float, default=4.0)
    p.add_argument("--json", default=None)
    p.add_argument(
        "--python-only",
        action="store_true",
        help="the ops' Python side alone: each plan's driver call swapped for a native no-op "
        "(bench/host_parts.py's), no torch rows",
    )
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the batches by the thread's CPU time (a busy host's waits for a core left out)",
    )
    args = p.parse_args()
    trees = [Tree(t) for t in args.trees]
    trees[1].use()  # the bench's own kaio (spinner, synchronize): the new tree's
    from bench import launch_overhead as L

    L.BATCHES, L.SPIN_MS = args.batches, args.spin_ms
    if args.cpu_time:
        L.CLOCK = time.thread_time
    bench = L.Bench(L.OP_BATCH, L.OP_SPIN_MS * L.SPIN_MS)
    trees[1].done()
    if args.launch:
        bench.batch_size = L.BATCH
        launched = launch_rows(bench, L, trees)
        times = bench.run()
        print(
            f"\n{torch.cuda.get_device_name()}: host µs a launch, median of {args.batches} batches"
        )
        print(f"{'launch of add':<52} {'base':>7} {'new':>7} {'new/base':>8}")
        for label in launched:
            base, new = (times[f"{w} {label}"]["host_us"] for w in ("base", "new"))
            print(f"{label:<52} {base:7.2f} {new:7.2f} {new / base:8.3f}")
        for name, row in times.items():
            if not name.startswith(("base ", "new ")):
                print(f"{name:<52} {row['host_us']:7.2f}")
        print(f"batches that outlasted the spinner: {bench.late}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": times}, f, indent=1)
        return
    rows, failed = [], {}
    if args.python_only:
        trees[1].use()  # (host_parts imports kaio: the new tree's)
        from bench.host_parts import Swapped, native_no_op

        nothing = native_no_op()
        trees[1].done()
        if nothing is None:
            raise SystemExit("--python-only: no native no-op call on this host")
    for which, tree in zip(("base", "new"), trees, strict=True):
        tree.use()
        extra = {"linear_turns": _turns, "add_chain": _chain}
        pairs = L.op_pairs() + [made() for name, made in extra.items() if name in args.ops]
        for label, op, op_args, spelled, torch_call in pairs:
            if op.__name__ not in args.ops:
                continue
            try:
                _check(label, op, op_args, torch_call)
            except Exception as e:  # noqa: BLE001 (reported; the other rows go on)
                failed[f"{which} {label}"] = f"{type(e).__name__}: {e}"[:300]
                print(f"  {which} {label}: failed: {failed[f'{which} {label}']}", flush=True)
                continue
            around = Swapped(op, nothing) if args.python_only else None
            bench.row(f"{which} {label}", lambda op=op, a=op_args: op(*a), around=around)
            if which == "new":
                if not args.python_only:
                    bench.row(f"torch {spelled} [{label}]", torch_call)
                rows.append((label, spelled))
        tree.done()
    clock = "the thread's CPU time" if args.cpu_time else "wall time"
    clock += ", the Python side alone" if args.python_only else ""
    print(f"{torch.cuda.get_device_name()}: host µs a call ({clock}), median of {args.batches} "
          "batches")  # fmt: skip
    times = bench.run()
    report = []
    print(f"\n{'op':<64} {'base':>7} {'new':>7} {'new/base':>8} {'torch':>7} {'torch/new':>9}")
    for label, spelled in rows:
        base = times.get(f"base {label}", {}).get("host_us")
        new = times[f"new {label}"]["host_us"]
        eager = times.get(f"torch {spelled} [{label}]", {}).get("host_us", 0.0)
        report.append({"op": label, "base_us": base, "new_us": new, "torch_us": eager})
        ratio = f"{new / base:8.3f}" if base else f"{'-':>8}"
        peer = f"{eager:7.2f} {eager / new:9.2f}" if eager else ""
        print(f"{label:<64} {base or 0:7.2f} {new:7.2f} {ratio} {peer}")
    print(f"batches that outlasted the spinner: {bench.late}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": report,
                       "failed": failed, "late": bench.late}, f, indent=1)  # fmt: skip
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
