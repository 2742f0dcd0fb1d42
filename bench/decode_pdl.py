"""Programmatic dependent launch for the decode kernels (dec, issue 34, fifteenth pass):
kernel time as bench/decode.py counts it (a CUDA graph of calls over input sets in turn,
the events around a replay / the calls) of the routed call with ``decode.PDL`` 0 (the
kernels before PDL), 1 (each block's first key tiles prefetched into L2, the wait for the
kernel before, the next kernel let launch after the key loop) and 2 (the same, the next
kernel let launch right after the wait), beside SDPA's default on the contiguous cache;
each checked against PDL 0 (the same bits) and f32 SDPA. Two passes, the second in
reverse order.

    python3 bench/decode_pdl.py warm              # compile in parallel processes
    python3 bench/decode_pdl.py [SECONDS]         # time (CASES: BxL[p],...; PDLS: 0,1,2)
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode_probe as P  # noqa: E402
import torch  # noqa: E402

from kaio_ops import decode  # noqa: E402

PDLS = [int(p) for p in os.environ.get("PDLS", "0,1,2").split(",")]  # decode.PDL values
CASES = os.environ.get("CASES", "1x4096,64x4096p,1x4096p,16x1024p")
CALLS = 8


def parse(case: str) -> tuple:
    """(B, L, paged) of a case "BxL" (contiguous) or "BxLp" (paged)."""
    b, rest = case.split("x")
    return int(b), int(rest.rstrip("p")), rest.endswith("p")


def kaio_call(paged: bool, lens, pdl: int, q, k, v, kc, vc, table):
    """The routed call with ``decode.PDL = pdl`` on one input set."""
    decode.PDL = pdl
    if paged:
        return decode._decode("pdl", q, kc, vc, lens, table, None)[0]
    return decode._decode("pdl", q, k, v, lens, None, None)[0]


def time_case(case: str) -> None:
    b, length, paged = parse(case)
    sets = P.make_sets(b, length, paged=paged)
    lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
    label = f"B{b} L{length}{' paged' if paged else ''}"
    outs = {p: kaio_call(paged, lens, p, *sets[0]).clone() for p in PDLS}
    err = P.check(sets, lens, contiguous=not paged)
    same = {p: bool(torch.equal(outs[p], outs[PDLS[0]])) for p in PDLS}
    print(f"{label}: error vs f32 SDPA {err:.2e}; the same bits as PDL {PDLS[0]}: {same}")
    calls = len(sets) * -(-CALLS // len(sets))
    fns = {
        f"PDL {p}": [functools.partial(kaio_call, paged, lens, p, *s) for s in sets] for p in PDLS
    }
    fns["SDPA"] = [functools.partial(P.sdpa, s[0], s[1], s[2], enable_gqa=True) for s in sets]
    graphs = {n: P.graph_of_calls(f, calls) for n, f in fns.items()}
    for order in (list(graphs), list(graphs)[::-1]):
        for n in order:
            us = P.graph_events(graphs[n], calls)
            print(f"{label} {n}: graph of {calls}: {us:.2f} us a call", flush=True)
    decode.PDL = P.ORIG_PDL


def warm() -> None:
    """Each (case, PDL)'s first call in a process of its own, all at once (the disk cache
    keeps what they compile)."""
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for case in CASES.split(","):
        for p in PDLS:
            code = (
                "import decode_pdl as D, torch; "
                f"b, L, paged = D.parse('{case}'); s = D.P.make_sets(b, L, paged=paged)[0]; "
                "lens = torch.full((b,), L, device='cuda', dtype=torch.int32); "
                f"D.kaio_call(paged, lens, {p}, *s); torch.cuda.synchronize()"
            )
            procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=here))
    for proc in procs:
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["warm"]:
        warm()
    else:
        budget = float(sys.argv[1]) if len(sys.argv) > 1 else 40
        for case in CASES.split(","):
            if P.time.time() - P.T0 > budget:
                print(f"{case}: out of time")
                break
            time_case(case)
