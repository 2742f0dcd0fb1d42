"""Programmatic dependent launch for the decode kernels (dec, issue 34, fifteenth to
seventeenth passes): kernel time as bench/decode.py counts it (a CUDA graph of calls over
input sets in turn, the events around a replay / the calls) of the routed call
(``decode.pdls``: in a grid of one split over a paged cache of up to PDL_KEYS keys, one
wave, or several on a GPU of memory under PDL_WAVES_BANDWIDTH; the wait for the kernel
before, the next kernel let launch, each block's first key tiles prefetched into L2 before
the wait on a GPU of memory under PDL_PREFETCH_BANDWIDTH) and of its variants (SETTINGS:
main's route, no PDL, PDL without the prefetch...), beside SDPA's default on the
contiguous cache; each checked against f32 SDPA and called twice (the same bits). Two
passes, the second in reverse order.

    python3 bench/decode_pdl.py warm              # compile in parallel processes
    python3 bench/decode_pdl.py [SECONDS]         # time (CASES: BxL[p],...)

VARIANTS (names of SETTINGS, comma-separated) picks what is timed beside SDPA, each only
where it changes a call; a name + AFTER (" after a kernel", also "SDPA after a kernel")
times the calls each right behind a small torch kernel; ONE_CALL=1 also times one call a
graph (bench/decode.py's ", one call a graph": a graph per input set, the events around
each replay).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decode_probe as P  # noqa: E402
import torch  # noqa: E402
from decode_probe import HKV  # noqa: E402

from kaio_ops import decode  # noqa: E402

# name: the decode settings it changes (VARIANTS picks them; the first is the baseline)
SETTINGS = {
    "routed": {},
    "main": {"PDL_PREFETCH_BANDWIDTH": 1e30},  # (main's route, ce69559: PDL 1 on any GPU)
    "no PDL": {"PDL": False},
    "PDL no prefetch": {"PDL_PREFETCH_BANDWIDTH": 0, "PDL_FAST_KEYS": 1 << 30},  # (PDL 2)
    "PDL two waves": {"PDL_WAVES_BANDWIDTH": 1e30},  # (on any GPU)
}
# a variant's name with this suffix (also "SDPA" + AFTER): each call right behind a small
# torch kernel, in its graph too (as a decode call follows other kernels in a model's step)
AFTER = " after a kernel"
VARIANTS = os.environ.get("VARIANTS", "routed,no PDL").split(",")
CASES = os.environ.get("CASES", "16x1024p,16x4096p,16x2048p")
CALLS = 8
ONE_CALL = bool(os.environ.get("ONE_CALL"))  # also time one call a graph


def parse(case: str) -> tuple:
    """(B, L, paged) of a case "BxL" (contiguous) or "BxLp" (paged)."""
    b, rest = case.split("x")
    return int(b), int(rest.rstrip("p")), rest.endswith("p")


SCRATCH = []  # pre_kernel's tensor


def pre_kernel() -> None:
    """A small torch kernel (AFTER: the call's predecessor in its stream and graph)."""
    if not SCRATCH:
        SCRATCH.append(torch.zeros(1024, device="cuda"))
    SCRATCH[0].add_(1)


def kaio_call(paged: bool, lens, name: str, q, k, v, kc, vc, table):
    """The routed call with variant ``name``'s settings on one input set."""
    if name.endswith(AFTER):
        pre_kernel()
    settings = SETTINGS[name.removesuffix(AFTER)]
    before = {key: getattr(decode, key) for key in settings}
    for key, value in settings.items():
        setattr(decode, key, value)
    try:
        if paged:
            return decode._decode("pdl", q, kc, vc, lens, table, None)[0]
        return decode._decode("pdl", q, k, v, lens, None, None)[0]
    finally:
        for key, value in before.items():
            setattr(decode, key, value)


def sdpa_call(pre: bool, q, k, v, *_):
    """SDPA's default on the contiguous cache (right behind ``pre_kernel`` where ``pre``)."""
    if pre:
        pre_kernel()
    return P.sdpa(q, k, v, enable_gqa=True)


def variants(b: int, length: int, paged: bool) -> list:
    """VARIANTS of kaio's call of ``b`` sequences of ``length`` keys: "routed", and the PDL
    settings where the call can take PDL (decode_fwd, one
    split, over a paged cache of up to PDL_KEYS; the suite's pages of 16 and one new token:
    decode_folded from FOLD_MIN_PAGES pages a sequence where the grid takes more than two
    waves), "PDL two waves" where that grid has more blocks than multiprocessors (PDL there
    whatever the GPU's memory); each also behind a kernel (AFTER)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    folded = b * HKV > 2 * sms and length // 16 >= decode.FOLD_MIN_PAGES
    split = b * HKV < decode.FULL * sms  # (several splits: B1 .. B8)
    pdl = paged and length <= decode.PDL_KEYS and not (folded or split)
    applies = {n: pdl for n in SETTINGS}
    applies |= {"routed": True, "PDL two waves": pdl and b * HKV > sms}
    return [n for n in VARIANTS if applies.get(n.removesuffix(AFTER), False)]


def reference(inputs, lens):
    """f32 SDPA over the contiguous cache of one input set, a few sequences at a time."""
    q, k, v = inputs[:3]
    mask = torch.arange(k.shape[2], device="cuda")[None] < lens[:, None]
    step = max(1, (1 << 28) // (k[0].numel() * q.shape[1] // HKV))
    return torch.cat([
        P.sdpa(q[i:i + step].float(), k[i:i + step].float(), v[i:i + step].float(),
               attn_mask=mask[i:i + step, None, None], enable_gqa=True)
        for i in range(0, q.shape[0], step)
    ])  # fmt: skip


def time_case(case: str) -> None:
    b, length, paged = parse(case)
    sets = P.make_sets(b, length, paged=paged)
    lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
    label = f"B{b} L{length}{' paged' if paged else ''}"
    names = variants(b, length, paged)
    outs = {n: kaio_call(paged, lens, n, *sets[0]).clone() for n in names}
    again = {n: kaio_call(paged, lens, n, *sets[0]) for n in names}
    ref = reference(sets[0], lens)
    for n in names:
        err = ((outs[n].float() - ref).norm() / ref.norm()).item()
        same = bool(torch.equal(outs[n], again[n]))
        print(f"{label} {n}: error vs f32 SDPA {err:.2e}, the same bits twice: {same}")
    calls = len(sets) * -(-CALLS // len(sets))
    call = functools.partial(kaio_call, paged, lens)
    fns = {n: [functools.partial(call, n, *s) for s in sets] for n in names}
    fns["SDPA"] = [functools.partial(sdpa_call, False, *s) for s in sets]
    if "SDPA" + AFTER in VARIANTS:
        fns["SDPA" + AFTER] = [functools.partial(sdpa_call, True, *s) for s in sets]
    graphs = {n: P.graph_of_calls(f, calls) for n, f in fns.items()}
    ones = {n: [P.captured(c) for c in f] for n, f in fns.items()} if ONE_CALL else {}
    for order in (list(graphs), list(graphs)[::-1]):
        for n in order:
            us = P.graph_events(graphs[n], calls)
            one = f"; one call a graph: {one_call(ones[n]):.2f} us" if ones else ""
            print(f"{label} {n}: graph of {calls}: {us:.2f} us a call{one}", flush=True)


def one_call(graphs: list, n: int = 24) -> float:
    """Median µs from event to event around each replay of ``graphs`` (a call's graph per
    input set, in turn: bench/decode.py's "one call a graph"), queued behind a GPU spin."""
    torch.cuda.synchronize()
    times = []
    torch.cuda._sleep(int(3e-3 * 2e9))
    for i in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs[i % len(graphs)].replay()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return 1e3 * P.statistics.median(a.elapsed_time(z) for a, z in times)


def warm() -> None:
    """Each (case, variant)'s first call in a process of its own, all at once (the disk
    cache keeps what they compile)."""
    here = os.path.dirname(os.path.abspath(__file__))
    procs, seen = [], set()
    for case in CASES.split(","):
        b, length, paged = parse(case)
        for name in variants(b, length, paged):
            if (case, name.removesuffix(AFTER)) in seen:  # (the same kernels)
                continue
            seen.add((case, name.removesuffix(AFTER)))
            code = (
                "import decode_pdl as D, torch; "
                f"b, L, paged = D.parse('{case}'); s = D.P.make_sets(b, L, paged=paged)[0]; "
                "lens = torch.full((b,), L, device='cuda', dtype=torch.int32); "
                f"D.kaio_call(paged, lens, '{name}', *s); torch.cuda.synchronize()"
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
