"""Programmatic dependent launch for the decode kernels (dec, issue 34, fifteenth pass):
kernel time as bench/decode.py counts it (a CUDA graph of calls over input sets in turn,
the events around a replay / the calls) of ``decode.PDL`` 0 (the kernels before it) and 2
(each block's first key tiles prefetched into L2, then the wait for the kernel before;
the trigger after the key loop) and of copies of the kernels with PDL 2 otherwise (the
trigger before the wait, 8 tiles prefetched, line prefetches in place of the bulk ones:
``VARIANTS``), beside SDPA's default on the contiguous cache; each checked against the
first variant (the same bits) and f32 SDPA.

    python3 bench/decode_pdl.py warm [SECONDS]   # compile in parallel processes
    python3 bench/decode_pdl.py [SECONDS]        # time (CASES: BxL[p],...; PDL_VARIANTS)
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode_probe as P  # noqa: E402
import torch  # noqa: E402

from kaio_ops import decode  # noqa: E402

_TRIGGER = (
    "    if PDL:\n"
    "        kaio.launch_dependents()  # (the next kernel's blocks may take the SMs this one "
    "leaves)\n"
)
_WAIT = "    if PDL:\n        kaio.grid_dependency_wait()\n"
_FWD_KEYS = "tid, split, splits, (STAGES - 1) * BN, DP, PAGED, DT,"
_BULK = "            kaio.prefetch_l2(k, at, DP * 2)\n            kaio.prefetch_l2(v, at, DP * 2)\n"
_LINES = "".join(  # prefetch.global.L2 of each 128-byte line of the 256-byte rows (D 128)
    f"            kaio.prefetch_l2({a}, at{off})\n" for a in "kv" for off in ("", " + 64")
)
# variant: (decode.PDL, edits of kaio_ops/_decode.py or None: the shipped kernels)
VARIANTS = {
    "PDL 0": (0, None),
    "PDL 2": (2, None),
    "PDL 2, trigger first": (
        2,
        [(_TRIGGER, ""), (_TRIGGER, ""), (_WAIT, "@W@"), (_WAIT, "@W@")]
        + [("@W@", _TRIGGER + _WAIT)] * 2,
    ),
    "PDL 2, 8 tiles": (2, [(_FWD_KEYS, _FWD_KEYS.replace("(STAGES - 1) * BN", "8 * BN"))]),
    "PDL 2, lines": (2, [(_BULK, _LINES)]),
}
_AT_WAIT = [(_TRIGGER, ""), (_TRIGGER, ""), (_WAIT, "@W@"), (_WAIT, "@W@")]
_AT_WAIT += [("@W@", _WAIT + _TRIGGER)] * 2  # the trigger right after the wait
VARIANTS["PDL 2, trigger at wait"] = (2, _AT_WAIT)
VARIANTS["PDL 2, trigger at wait, 8 tiles"] = (2, _AT_WAIT + VARIANTS["PDL 2, 8 tiles"][1])
if os.environ.get("PDL_VARIANTS"):  # only these (names separated by ";")
    VARIANTS = {n: VARIANTS[n] for n in os.environ["PDL_VARIANTS"].split(";")}
CASES = os.environ.get("CASES", "1x4096,64x4096p,1x4096p,16x1024p")
CALLS = 8


def edited(edits: list) -> str:
    """kaio_ops/_decode.py with ``edits`` (old, new) made in turn, each old text's first
    place (replaced, so the next alike is the next place)."""
    with open(decode.dk.__file__) as f:
        src = f.read()
    for old, new in edits:
        assert old in src, old
        src = src.replace(old, new, 1)
    return src


def kernels(name: str) -> dict:
    """{DECODE, FOLDED}: the shipped kernels, or the variant's copies."""
    edits = VARIANTS[name][1]
    if edits is None:
        return {"DECODE": P.ORIG["DECODE"], "FOLDED": P.ORIG["FOLDED"]}
    tag = "v" + str(sorted(VARIANTS).index(name))
    whole = [(edited([]), edited(edits))]  # (P.decode_variant: the file's text replaced)
    return {
        "DECODE": P.decode_variant(tag, whole, "decode_fwd"),
        "FOLDED": P.decode_variant(tag, whole, "decode_folded"),
    }


def use(name: str) -> None:
    decode.PDL = VARIANTS[name][0]
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
    names = list(VARIANTS)
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
        same = {n: bool(torch.equal(outs[n], outs[names[0]])) for n in names}
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
        use("PDL 2")
        del graphs, fns, sets


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "warm":
        # one process a (case, variant): their first calls compile (the disk cache keeps
        # them); the variants' module files made here first
        import subprocess

        for name in VARIANTS:
            kernels(name)
        procs = []
        for case in CASES.split(","):
            for name in VARIANTS:
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
