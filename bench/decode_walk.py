"""The long paged suite cases (dec, issue 34, eighteenth pass): kernel time as
bench/decode.py counts it (a CUDA graph of calls, the events around a replay / the calls)
of kaio's paged call over the suite's shuffled pool ("routed"; "main": main's route, the
long-table route off), over the same pool with each sequence's table sorted ascending (the
bound of a walk in pool order) and with the pool in order, of variants of the route
(SETTINGS: force()'s settings, bench/decode_probe.py, and decode's attributes), of the
contiguous call and of SDPA's default on the contiguous cache, all in one process; each
kaio call checked against f32 SDPA on the first sequences. PASSES passes (2), every other
one in reverse order.

    python3 bench/decode_walk.py warm            # compile in parallel processes
    python3 bench/decode_walk.py [SECONDS]       # time (CASES: BxL,...; VARIANTS: names)

A case "BxL=name+name" times only those variants, "BxLr" ragged lengths (L/4 .. L).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode_probe as P  # noqa: E402
import torch  # noqa: E402
from decode_probe import HKV, D, H  # noqa: E402

from kaio_ops import decode  # noqa: E402

PDL2 = {"PDL_KEYS": 1 << 30, "PDL_FAST_KEYS": 1 << 30}  # PDL without the prefetch, any length
# name: (table order, force() settings, decode attributes); order None: the contiguous cache
SETTINGS = {
    "routed": ("shuffled", {}, {}),
    "main": ("shuffled", {}, {"LONG_BANDWIDTH": float("inf")}),  # main's route on any GPU
    "sorted tables": ("sorted", {}, {}),
    "pool in order": ("in order", {}, {}),
    "contiguous": (None, {}, {}),
    "3 stages": ("shuffled", {"stages": 3}, {}),
    "2 stages": ("shuffled", {"stages": 2}, {}),
    "OWN": ("shuffled", {"own": 1}, {}),
    "PDL 2": ("shuffled", {}, PDL2),
    "PDL 2 two waves": ("shuffled", {}, {"pdls": lambda *a: 2}),
    "3 stages and PDL 2": ("shuffled", {"stages": 3}, PDL2),
    "whole pages": ("shuffled", {"pages": True}, {}),
    "whole pages 4 splits": ("shuffled", {"pages": True, "page_splits": 4}, {}),
    "whole pages 4 length splits": (
        "shuffled",
        {"pages": True, "page_splits": 4, "page_spec": False},
        {},
    ),
    "whole pages sorted tables": ("sorted", {"pages": True}, {}),
    "whole pages pool in order": ("in order", {"pages": True}, {}),
    "fold off": ("shuffled", {"fold": 0}, {}),
    "fold off no sort": ("shuffled", {"fold": 0, "sort": 0}, {}),
    "fold off no sort no spec": ("shuffled", {"fold": 0, "sort": 0, "spec": False}, {}),
    "fold off and PDL 2": ("shuffled", {"fold": 0}, {"pdls": lambda *a: 2}),
}
VARIANTS = os.environ.get("VARIANTS", "routed,sorted tables,contiguous").split(",")
CASES = os.environ.get("CASES", "16x32768,64x32768,64x4096")
REPLAY_BYTES = 8 << 30  # K/V bytes a timed graph reads at most (CALLS calls at least 2)
CALLS = 8
CHECKED = 4  # sequences checked against f32 SDPA
PASSES = int(os.environ.get("PASSES", "2"))


def parse(case: str) -> tuple:
    """(B, L, ragged, variant names) of a case "BxL" (or "BxLr": lengths drawn in L/4 .. L,
    the first L, as bench/decode.py's ragged cases) or "BxL=name+name"."""
    shape, _, names = case.partition("=")
    b, length = shape.split("x")
    ragged = length.endswith("r")
    return int(b), int(length.rstrip("r")), ragged, names.split("+") if names else VARIANTS


def caches(b: int, length: int, ragged: bool, orders) -> tuple:
    """(q, k, v, lens, {order: (table, k_pages, v_pages)}) of one input set."""
    q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.half)
    k, v = (torch.randn(b, HKV, length, D, device="cuda", dtype=torch.half) for _ in "kv")
    lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
    if ragged:
        gen = torch.Generator(device="cuda").manual_seed(b * length + 1)
        lens = torch.randint(length // 4, length + 1, (b,), generator=gen, device="cuda")
        lens = lens.to(torch.int32)
        lens[0] = length
    tables = P.page_orders(b, length)
    return q, k, v, lens, {o: P.layout_caches(k, v, tables[o]) for o in orders}


def call(name: str, q, k, v, lens, paged: dict):
    """kaio's call of variant ``name`` on one input set."""
    order, cfg, attrs = SETTINGS[name]
    P.force(**cfg)
    before = {a: getattr(decode, a) for a in attrs}
    for a, value in attrs.items():
        setattr(decode, a, value)
    try:
        if order is None:
            return decode._decode("walk", q, k, v, lens, None, None)[0]
        table, kc, vc = paged[order]
        return decode._decode("walk", q, kc, vc, lens, table, None)[0]
    finally:
        for a, value in before.items():
            setattr(decode, a, value)
        P.restore()


def reference(q, k, v, lens, n: int):
    """f32 SDPA of the first n sequences (over their lengths)."""
    mask = (torch.arange(k.shape[2], device="cuda")[None] < lens[:n, None])[:, None, None]
    return P.sdpa(q[:n].float(), k[:n].float(), v[:n].float(), attn_mask=mask, enable_gqa=True)


def time_case(case: str) -> None:
    b, length, ragged, names = parse(case)
    orders = {SETTINGS[n][0] for n in names} - {None}
    torch.cuda.empty_cache()
    q, k, v, lens, paged = caches(b, length, ragged, orders)
    label = f"B{b} L{length}{' ragged' * ragged} paged"
    ref = reference(q, k, v, lens, min(b, CHECKED))
    for n in names:
        out = call(n, q, k, v, lens, paged)[: ref.shape[0]].float()
        err = ((out - ref).norm() / ref.norm()).item()
        print(f"{label} {n}: error vs f32 SDPA {err:.2e}", flush=True)
    kv = 2 * b * HKV * length * D * 2
    calls = max(2, min(CALLS, REPLAY_BYTES // kv))
    fns = {n: [lambda n=n: call(n, q, k, v, lens, paged)] for n in names}
    mask = (torch.arange(length, device="cuda")[None] < lens[:, None])[:, None, None]
    fns["SDPA"] = [lambda: P.sdpa(q, k, v, attn_mask=mask if ragged else None, enable_gqa=True)]
    graphs = {n: P.graph_of_calls(f, calls) for n, f in fns.items()}
    for p in range(PASSES):  # every other pass in reverse order
        order = list(graphs)[:: -1 if p % 2 else 1]
        for n in order:
            us = P.graph_events(graphs[n], calls)
            print(f"{label} {n}: graph of {calls}: {us:.2f} us a call", flush=True)


def warm() -> None:
    """Each (case, variant)'s first call in a process of its own, all at once, on a pool of
    one page (the route depends on the table's shape, not the pool) or an uninitialized
    contiguous cache (the disk cache keeps what they compile)."""
    here = os.path.dirname(os.path.abspath(__file__))
    procs, seen = [], set()
    for case in CASES.split(","):
        b, length, _, names = parse(case)
        for name in names:
            order, cfg, attrs = SETTINGS[name]
            key = (case, order is None, tuple(sorted({**cfg, **attrs}.items())))
            if key in seen:
                continue
            seen.add(key)
            code = (
                "import decode_walk as W, torch; from decode_probe import H, HKV, D; "
                f"b, L = {b}, {length}; "
                "q = torch.zeros(b, H, 1, D, device='cuda', dtype=torch.half); "
                "lens = torch.full((b,), L, device='cuda', dtype=torch.int32); "
                "k = v = torch.empty(b, HKV, L, D, device='cuda', dtype=torch.half) "
                f"if {order is None} else None; "
                "pool = torch.zeros(1, 16, HKV, D, device='cuda', dtype=torch.half); "
                "t = torch.zeros(b, L // 16, device='cuda', dtype=torch.int32); "
                "paged = {o: (t, pool, pool) for o in ('shuffled', 'sorted', 'in order')}; "
                f"W.call('{name}', q, k, v, lens, paged); torch.cuda.synchronize()"
            )
            procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=here))
    for proc in procs:
        proc.wait()
    print(f"warm: {len(procs)} processes, {time.time() - P.T0:.1f}s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["warm"]:
        warm()
    else:
        budget = float(sys.argv[1]) if len(sys.argv) > 1 else 40
        print(torch.cuda.get_device_name(), flush=True)
        for case in CASES.split(","):
            if time.time() - P.T0 > budget:
                print(f"{case}: out of time")
                break
            time_case(case)
