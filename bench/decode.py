"""Decode attention: ``kaio_ops.flash_attention_decode`` against torch SDPA on the same cache,
gathered and contiguous, with each backend torch offers (and its default choice, the
baseline).

Cases: one new token (Sq = 1), H = 32 query heads over Hkv = 8 K/V heads, D = 128, f16; batch
B in {1, 16, 64}, cached lengths L in {1k, 4k, 32k}, uniform (every sequence L) or ragged
(lengths drawn in L/4 .. L, the cache's capacity L); the cache contiguous [B, Hkv, L, D] or in
16-token pages (shuffled). SDPA gets the contiguous cache [B, Hkv, L, D] (ragged: with a key
mask). Two timings of every implementation, both of CUDA graphs (the kernels, not the Python
launch path):

- kernel time (the op's name alone; issue 34's metric, the one bench/targets.py checks): one
  graph of ``CALLS`` calls or more (fewer where they would read over ``REPLAY_BYTES``) that
  take the input sets in turn (so no call finds its K/V in L2), the events around a replay,
  divided by the calls;
- one call a graph (", one call a graph"): a graph per input set, one call each, the events
  around each replay: per-call time in a graph as a user meets it, with the replay's own
  start-up (3 to 4 µs over the kernel time on an H100).

The copy bandwidth (the % of copy) stays torch's ``copy_`` with events around each call: a
graph of copies measured 2433 GB/s against 3001 on an H100 (captured, the copy is most likely
a memcpy node, which the copy engines run; not checked).

GB/s and % of copy count the K/V bytes of the cached tokens read once (ragged: the sum of the
lengths); the targets (80% of copy where a call reads 64 MB or more, 2x SDPA at B = 1, L =
4096, never slower than SDPA) are read off the kernel times.

Usage: ``python bench/decode.py --out results.json [--quick] [--batches 1,16] [--lengths 4096]
[--cases uniform,paged]`` (quick: B in {1, 16}, L = 4k; ``--batches``, ``--lengths``: only these
sizes; ``--cases``: only these of uniform/ragged and contiguous/paged, e.g. one case with
``--quick --batches 1 --cases uniform,paged``).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import L2_BYTES, Harness  # noqa: E402

H, HKV, D, PAGE = 32, 8, 128, 16
OP = "flash_attention_decode f16"
ONE_CALL = ", one call a graph"  # the op's suffix for the times of one call a graph
# calls in a kernel-time graph (a multiple of the input sets): CALLS, or fewer where they
# read over REPLAY_BYTES of K/V (B64 L4096, B16 and B64 L32768: a replay of 1.4 ms or more,
# whose start-up of 3 to 4 µs is under 0.3% of it), to keep the suite's time
CALLS = 8
REPLAY_BYTES = 4 << 30
MAX_SETS = 64  # input sets of a case, at most (B1 L1024 takes 38 of 4.2 MB)
MATH_BYTES = 1 << 30  # SDPA's math backend only up to this much K/V (its graphs keep 4x it)
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def graphed(fn, *arg_sets):
    """(replay, output): ``fn(*args)`` for each of ``arg_sets`` in turn, captured once in one
    CUDA graph (the output: the first call's); an exception (a backend that does not take
    these inputs) is returned in place of the replay and raised there.
    Python's cyclic garbage collection runs before the capture and not during it: an earlier
    case's graphs collected mid-capture would be destroyed inside it (CUDA refuses that and
    the capture fails: "operation not permitted when stream is capturing")."""
    gc.collect()
    gc.disable()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for args in arg_sets:
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [fn(*args) for args in arg_sets]
        return graph, outs[0]
    except Exception as e:  # noqa: BLE001  (reported as that implementation failing)
        torch.cuda.synchronize()
        return e, None
    finally:
        gc.enable()


def replay(entry):
    """Replay a captured graph; its output."""
    graph, out = entry
    if isinstance(graph, Exception):
        raise graph
    graph.replay()
    return out


def sdpa_on(backend, ragged: bool):
    """SDPA on the contiguous cache (grouped heads), restricted to ``backend`` (None: torch's
    choice); ragged lengths as a boolean key mask."""

    def run(q, k, v, mask):
        if backend is None:
            return sdpa(q, k, v, attn_mask=mask if ragged else None, enable_gqa=True)
        with sdpa_kernel(backend):
            return sdpa(q, k, v, attn_mask=mask if ragged else None, enable_gqa=True)

    return run


def reference(q, k, v, lens):
    """float64 attention of each sequence's query over its first lens[b] keys."""
    out = torch.zeros_like(q, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for b, n in enumerate(lens):
        kb, vb = (x[b, :, :n].double().repeat_interleave(group, 0) for x in (k, v))
        out[b] = sdpa(q[b].double(), kb, vb)
    return out


def paged_caches(k, v, page: int, gen=None) -> tuple:
    """(block_table, k_pages, v_pages): contiguous caches [B, Hkv, L, D] copied into
    shuffled pages [B * L / page, page, Hkv, D] ("NHD"), the same values."""
    b, hkv, length, d = k.shape
    per = length // page
    table = torch.randperm(b * per, device=k.device, generator=gen).to(torch.int32)
    table = table.reshape(b, per)
    caches = []
    for x in (k, v):
        pages = torch.empty(b * per, page, hkv, d, device=x.device, dtype=x.dtype)
        pages[table.long().flatten()] = (
            x.reshape(b, hkv, per, page, d).permute(0, 2, 3, 1, 4).reshape(-1, page, hkv, d)
        )
        caches.append(pages)
    return (table, *caches)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="B in {1, 16}, L = 4096 only")
    p.add_argument("--batches", default="", help="comma-separated batch sizes (default: all)")
    p.add_argument("--lengths", default="", help="comma-separated lengths (default: all)")
    p.add_argument(
        "--cases",
        default="",
        help="only these of uniform, ragged, contiguous, paged (e.g. 'uniform,paged')",
    )
    args, _ = p.parse_known_args()
    h = Harness.from_args("Decode attention", reps=30)
    h.copy_bandwidth()  # events around each call: a graph of copies measured slower
    batches, lengths = ((1, 16), (4096,)) if args.quick else ((1, 16, 64), (1024, 4096, 32768))
    if args.batches:
        batches = tuple(int(x) for x in args.batches.split(","))
    if args.lengths:
        lengths = tuple(int(x) for x in args.lengths.split(","))
    wanted = set(args.cases.split(",")) if args.cases else set()
    shapes = [
        r
        for r in (False, True)
        if not wanted & {"uniform", "ragged"} or ("ragged" if r else "uniform") in wanted
    ]
    layouts = [
        p
        for p in (False, True)
        if not wanted & {"contiguous", "paged"} or ("paged" if p else "contiguous") in wanted
    ]
    for b in batches:
        for length in lengths:
            for ragged in shapes:
                for paged in layouts:
                    case(h, b, length, ragged, paged)
    print(h.table())
    for one_call in (False, True):
        print(f"\n{'One call a graph' if one_call else 'Kernel time'}:")
        print(summary(h.results, one_call))
    h.finish()


def summary(results, one_call: bool) -> str:
    """One line a case of one timing (kernel time, or one call a graph): kaio's time against
    torch SDPA's default and its fastest backend on the same shape (the paged cases against
    their contiguous twin's backends), % of copy."""
    times: dict = {}
    for r in results:
        paged, is_one_call = op_kind(r.op)
        if r.op.startswith(OP) and r.ms and is_one_call == one_call:
            times.setdefault((paged, r.case), {})[r.impl] = r
    lines = [
        "| case | kaio µs | % copy | SDPA default µs | fastest SDPA µs | kaio vs fastest |",
        "|---|---|---|---|---|---|",
    ]
    for (paged, label), impls in times.items():
        if "kaio" not in impls:
            continue
        peers = {n: r.ms for n, r in {**times.get((False, label), {}), **impls}.items()}
        peers = {n: ms for n, ms in peers.items() if n.startswith("torch SDPA")}
        if not peers:
            continue
        best = min(peers, key=peers.get)
        kaio = impls["kaio"]
        ratio = peers[best] / kaio.ms
        lines.append(
            f"| {label}{' paged' * paged} | {kaio.ms * 1e3:.1f} | {kaio.pct_copy or 0:.0f} | "
            f"{peers.get('torch SDPA', 0) * 1e3:.1f} | {peers[best] * 1e3:.1f} "
            f"({best[len('torch SDPA') :].strip() or 'default'}) | "
            f"{ratio:.2f}{' <' if ratio < 1 else ''} |"
        )
    return "\n".join(lines)


def op_name(paged: bool, one_call: bool) -> str:
    """The op a case's results are recorded under."""
    return OP + " paged" * paged + ONE_CALL * one_call


def op_kind(op: str) -> tuple[bool, bool]:
    """(paged, one call a graph) of an op name made by ``op_name``."""
    one_call = op.endswith(ONE_CALL)
    return op.removesuffix(ONE_CALL).endswith(" paged"), one_call


def case(h: Harness, b: int, length: int, ragged: bool, paged: bool) -> None:
    """One shape: kernel time (one graph of several calls over the input sets), then one call
    a graph (a graph per input set)."""
    gen = torch.Generator(device="cuda").manual_seed(b * length + ragged)
    if ragged:
        lens = torch.randint(length // 4, length + 1, (b,), generator=gen, device="cuda")
        lens[0] = length
    else:
        lens = torch.full((b,), length, device="cuda")
    lens = lens.to(torch.int32)
    host_lens = lens.tolist()
    kv_bytes = 2 * sum(host_lens) * HKV * D * 2

    def make():
        """One input set: {"kaio": kaio's arguments, "sdpa": SDPA's (and the reference's)}."""
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.half, generator=gen)
        k, v = (
            torch.randn(b, HKV, length, D, device="cuda", dtype=torch.half, generator=gen)
            for _ in "kv"
        )
        mask = (torch.arange(length, device="cuda")[None] < lens[:, None])[:, None, None]
        if paged:  # the same values in shuffled 16-token pages
            table, *caches = paged_caches(k, v, PAGE, gen)
            kaio_args = (q, *caches, lens, table)
        else:
            kaio_args = (q, k, v, lens, None)
        return {"kaio": kaio_args, "sdpa": (q, k, v, mask)}

    impls = {"kaio": ("kaio", kaio_ops.flash_attention_decode)}
    impls["torch SDPA"] = ("sdpa", sdpa_on(None, ragged))
    if not paged:  # each backend once per shape (the paged cases share the baseline)
        for name, backend in BACKENDS.items():
            if name != "math" or kv_bytes <= MATH_BYTES:  # math repeats K/V: 4x the cache
                impls[f"torch SDPA {name}"] = ("sdpa", sdpa_on(backend, ragged))
    # the sets counted on the K/V bytes a call reads, so that 3x the L2 cache is read between
    # two calls on one set (the harness rotates over MAX_SETS of them at most); the graphs read
    # the sets by address: they must live as long as the graphs (a cache freed here would be
    # reused by the next set, and a replay read garbage pages)
    sets = [make() for _ in range(min(MAX_SETS, -(-3 * L2_BYTES // kv_bytes)))]
    calls = len(sets) * -(-min(CALLS, -(-REPLAY_BYTES // kv_bytes)) // len(sets))
    rotation = [sets[i % len(sets)] for i in range(calls)]
    label = f"B{b} L{length}" + " ragged" * ragged + f" H{H}/{HKV} D{D}"
    for one_call in (False, True):
        if one_call:  # a graph per set, the harness rotating over (its count of) the sets
            used = sets[: h.sets_for(kv_bytes)]
            inputs = [{n: graphed(fn, s[a]) for n, (a, fn) in impls.items()} for s in used]
        else:  # one graph of every call, the sets in turn
            inputs = [{n: graphed(fn, *(s[a] for s in rotation)) for n, (a, fn) in impls.items()}]
        h.case(
            op_name(paged, one_call),
            label,
            itertools.cycle([(graphs,) for graphs in inputs]).__next__,
            {n: (lambda graphs, n=n: replay(graphs[n])) for n in impls},
            reference=lambda _graphs: reference(*sets[0]["sdpa"][:3], host_lens),
            tol=1e-3,
            nbytes=kv_bytes,
            baseline="torch SDPA",
            calls=1 if one_call else calls,
        )
        del inputs


if __name__ == "__main__":
    main()
