"""Programmatic dependent launch for the decode kernels (dec, issue 34, fifteenth pass):
kernel time as bench/decode.py counts it (a CUDA graph of calls over input sets in turn,
the events around a replay / the calls) of the routed call against copies of its kernels
with ``kaio.grid_dependency_wait()`` first and ``kaio.launch_dependents()`` after the key
loop (pdl2), with L2 prefetches of the first tiles before the wait (pdl3), with the trigger
first and up to PF_TILES tiles prefetched (pdl4), beside SDPA's default on the contiguous
cache; each variant checked against the routed call first (the same bits).

    python3 bench/decode_pdl.py warm [SECONDS]   # compile in parallel processes
    python3 bench/decode_pdl.py [SECONDS]        # time (CASES: BxL[p],...)
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode_probe as P  # noqa: E402
import torch  # noqa: E402

from kaio_ops import decode  # noqa: E402

_FWD_START = (
    "    # Q first: its copies are in flight while the length is read (the K/V copies need it)\n"
)
_FWD_LOOP_END = (
    "    # the warps' partial results, relative to their own maxima, through shared memory (the\n"
)
_FOLD_START = "    SPECT = (STAGES - 1) // FOLD * FOLD * SPEC  # tiles copied before the sort\n"
_FOLD_LOOP_END = "    red_o = kaio.shared_dynamic(f32, (WARPS * 16, DP), 0)  # over kv_s\n"
WAIT = "    kaio.grid_dependency_wait()\n"
TRIGGER = "    kaio.launch_dependents()\n"
_FWD_DEF = "@kaio.gpu_kernel\ndef decode_fwd(\n"
PREFETCH_FN = '''@kaio.gpu_func
def prefetch_firsts(
    k: DT[:],
    v: DT[:],
    key0: u32,
    end: u32,
    keys: kaio.constexpr,
    b: u32,
    kvh: u32,
    block_table: i32[:],
    capacity: u32,
    max_pages: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    DP: kaio.constexpr,
    PAGED: kaio.constexpr,
    DT: kaio.constexpr,
):
    """L2 prefetches of the K and V rows of keys key0 .. key0 + keys (those under end) of
    sequence b, head kvh (a hint, before the wait: the table may be stale, its pages
    clamped to the pool)."""
    for i in kaio.static_range(keys // THREADS):
        key = key0 + tid + i * THREADS
        if key < end:
            at = cache_row(
                key, b, kvh, block_table, capacity, max_pages, kv_heads, shift, pages, DP, PAGED
            )
            kaio.prefetch_l2(k, at, DP * 2)
            kaio.prefetch_l2(v, at, DP * 2)


'''
# decode_fwd's first tiles (one split: 0 ..; several: the capacity's run of split x), and
# decode_folded's two sequences' first tiles as uniform lengths pair them (p, batch - 1 - p)
FWD_PREFETCH = """    if SPEC:
        first = kaio.block_idx_x() * BN
    else:
        run = ((capacity + BN - 1) // BN + kaio.grid_dim_x() - 1) // kaio.grid_dim_x()
        first = kaio.block_idx_x() * run * BN
    prefetch_firsts(
        k, v, first, capacity, (STAGES - 1) * BN, kaio.block_idx_y() // chunks // kv_heads,
        kaio.block_idx_y() // chunks % kv_heads, block_table, capacity, max_pages, kv_heads,
        shift, pages, kaio.thread_idx_x(), DP, PAGED, DT,
    )  # fmt: skip
"""
FOLD_PREFETCH = """    for f in kaio.static_range(2):
        pseq = kaio.block_idx_y() // kv_heads
        other = kaio.select(batch - 1 - pseq > pseq, batch - 1 - pseq, pseq)
        pseq = kaio.select(f == 0, pseq, other)
        prefetch_firsts(
            k, v, 0, capacity, BN, pseq, kaio.block_idx_y() % kv_heads, block_table, capacity,
            max_pages,
            kv_heads, shift, pages, kaio.thread_idx_x(), DP, True, DT,
        )  # fmt: skip
"""
# pdl4: decode_fwd's first PF_TILES tiles of its run by the length (read as a hint)
PF_TILES = 8
FWD_PREFETCH_RUN = f"""    hint_b = kaio.block_idx_y() // chunks // kv_heads
    hint = u32(kaio.min(kaio.max(seq_lens[hint_b], 0), i32(capacity)))
    first = u32(0)
    end = hint
    if not SPEC:
        run = ((hint + BN - 1) // BN + kaio.grid_dim_x() - 1) // kaio.grid_dim_x()
        first = kaio.block_idx_x() * run * BN
        end = kaio.min(first + run * BN, hint)
    prefetch_firsts(
        k, v, first, end, {PF_TILES} * BN, hint_b, kaio.block_idx_y() // chunks % kv_heads,
        block_table, capacity, max_pages, kv_heads, shift, pages, kaio.thread_idx_x(), DP,
        PAGED, DT,
    )  # fmt: skip
"""
EDITS = {  # variant: edits of kaio_ops/_decode.py (both kernels)
    "pdl2": {
        _FWD_START: WAIT + _FWD_START,
        _FOLD_START: _FOLD_START + WAIT,
        _FWD_LOOP_END: TRIGGER + _FWD_LOOP_END,
        _FOLD_LOOP_END: TRIGGER + _FOLD_LOOP_END,
    },
    "pdl3": {
        _FWD_DEF: PREFETCH_FN + _FWD_DEF,
        _FWD_START: FWD_PREFETCH + WAIT + _FWD_START,
        _FOLD_START: _FOLD_START + FOLD_PREFETCH + WAIT,
        _FWD_LOOP_END: TRIGGER + _FWD_LOOP_END,
        _FOLD_LOOP_END: TRIGGER + _FOLD_LOOP_END,
    },
    "pdl4": {  # the trigger first, more prefetched
        _FWD_DEF: PREFETCH_FN + _FWD_DEF,
        _FWD_START: FWD_PREFETCH_RUN + TRIGGER + WAIT + _FWD_START,
        _FOLD_START: _FOLD_START + FOLD_PREFETCH + TRIGGER + WAIT,
    },
}
CASES = os.environ.get("CASES", "1x4096,64x4096p,1x4096p,16x4096p")
CALLS = 8


def kernels(name: str) -> dict:
    """{DECODE, FOLDED}: the variant's copies (``decode_probe.decode_variant``)."""
    if name == "routed":
        return {"DECODE": P.ORIG["DECODE"], "FOLDED": P.ORIG["FOLDED"]}
    edits = EDITS[name]
    return {
        "DECODE": P.decode_variant(name, edits, "decode_fwd"),
        "FOLDED": P.decode_variant(name, edits, "decode_folded"),
    }


def use(name: str) -> None:
    for attr, kernel in kernels(name).items():
        setattr(decode, attr, kernel)


def case_calls(paged: bool, lens, name: str):
    """One call a set of kaio with variant ``name``."""

    def call(q, k, v, kc, vc, table):
        use(name)
        if paged:
            return decode._decode("pdl", q, kc, vc, lens, table, None)[0]
        return decode._decode("pdl", q, k, v, lens, None, None)[0]

    return call


def parse(case: str) -> tuple:
    b, rest = case.split("x")
    paged = rest.endswith("p")
    return int(b), int(rest.rstrip("p")), paged


def run(budget: float) -> None:
    names = ["routed", *EDITS]
    for case in CASES.split(","):
        if P.time.time() - P.T0 > budget:
            print(f"{case}: out of time", flush=True)
            break
        b, length, paged = parse(case)
        sets = P.make_sets(b, length, paged=paged)
        lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
        label = f"B{b} L{length}{' paged' if paged else ''}"
        outs = {n: case_calls(paged, lens, n)(*sets[0]).clone() for n in names}
        ref = P.check(sets, lens, contiguous=not paged)
        same = {n: bool(torch.equal(outs[n], outs["routed"])) for n in names}
        print(f"{label}: routed error vs f32 SDPA {ref:.2e}; same bits {same}", flush=True)
        calls = len(sets) * -(-CALLS // len(sets))
        fns = {n: [functools.partial(case_calls(paged, lens, n), *s) for s in sets] for n in names}
        fns["SDPA"] = [
            lambda s=s: P.sdpa(s[0], s[1], s[2], enable_gqa=True) for s in sets
        ]  # fmt: skip
        graphs = {n: P.graph_of_calls(f, calls) for n, f in fns.items()}
        for order in (list(graphs), list(graphs)[::-1]):
            for n in order:
                us = P.graph_events(graphs[n], calls)
                print(f"{label} {n}: graph of {calls}: {us:.2f} us a call", flush=True)
        use("routed")
        del graphs, fns, sets


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "warm":
        # one process a (case, variant): their first calls compile (the disk cache keeps
        # them); the variants' module files made here first
        import subprocess

        for name in EDITS:
            kernels(name)
        procs = []
        for case in CASES.split(","):
            for name in ["routed", *EDITS]:
                code = (
                    "import decode_pdl as D, torch; "
                    f"b, L, p = D.parse('{case}'); s = D.P.make_sets(b, L, paged=p)[0]; "
                    "lens = torch.full((b,), L, device='cuda', dtype=torch.int32); "
                    f"D.case_calls(p, lens, '{name}')(*s); torch.cuda.synchronize()"
                )
                here = os.path.dirname(os.path.abspath(__file__))
                procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=here))
        for p in procs:
            p.wait()
    else:
        run(float(args[0]) if args else 40)
