"""Decode attention: ``kaio_ops.flash_attention_decode`` against torch SDPA on the same cache,
gathered and contiguous, with each backend torch offers (and its default choice, the
baseline).

Cases: one new token (Sq = 1), H = 32 query heads over Hkv = 8 K/V heads, D = 128, f16; batch
B in {1, 16, 64}, cached lengths L in {1k, 4k, 32k}, uniform (every sequence L) or ragged
(lengths drawn in L/4 .. L, the cache's capacity L); the cache contiguous [B, Hkv, L, D] or in
16-token pages (shuffled). SDPA gets the contiguous cache [B, Hkv, L, D] (ragged: with a key
mask). Every call is one CUDA graph replay, so the times are the kernels' (and the gaps
between them), not the Python launch path. GB/s and % of copy count the K/V bytes of the
cached tokens read once (ragged: the sum of the lengths); the targets (80% of copy where a call
reads 64 MB or more, 2x SDPA at B = 1, L = 4096) are read off the table.

Usage: ``python bench/decode.py --out results.json [--quick] [--batches 1,16] [--lengths 4096]
[--cases uniform,paged]`` (quick: B in {1, 16}, L = 4k; ``--batches``, ``--lengths``: only these
sizes; ``--cases``: only these of uniform/ragged and contiguous/paged, e.g. one case with
``--quick --batches 1 --cases uniform,paged``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

H, HKV, D, PAGE = 32, 8, 128, 16
MATH_BYTES = 1 << 30  # SDPA's math backend only up to this much K/V (its graphs keep 4x it)
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def graphed(fn, args):
    """(replay, output): ``fn(*args)`` captured once in a CUDA graph; an exception (a backend
    that does not take these inputs) is returned in place of the replay and raised there.
    Python's cyclic garbage collection runs before the capture and not during it: an earlier
    case's graphs collected mid-capture would be destroyed inside it (CUDA refuses that and
    the capture fails: "operation not permitted when stream is capturing")."""
    gc.collect()
    gc.disable()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*args)
        return graph, out
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
    h.copy_bandwidth()
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
    print(summary(h.results))
    h.finish()


def summary(results) -> str:
    """One line a case: kaio's time against torch SDPA's default and its fastest backend on
    the same shape (the paged cases against their contiguous twin's backends), % of copy."""
    times: dict = {}
    for r in results:
        if r.op.startswith("flash_attention_decode") and r.ms:
            times.setdefault((r.op.endswith("paged"), r.case), {})[r.impl] = r
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


def case(h: Harness, b: int, length: int, ragged: bool, paged: bool) -> None:
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
        graphs = {"kaio": graphed(kaio_ops.flash_attention_decode, kaio_args)}
        graphs["torch SDPA"] = graphed(sdpa_on(None, ragged), (q, k, v, mask))
        if not paged:  # each backend once per shape (the paged cases share the baseline)
            for name, backend in BACKENDS.items():
                if name == "math" and kv_bytes > MATH_BYTES:
                    continue  # it repeats K and V for the grouped heads: 4x the cache
                graphs[f"torch SDPA {name}"] = graphed(sdpa_on(backend, ragged), (q, k, v, mask))
        # the graphs read these by address: they must live as long as the graphs (a cache
        # freed here would be reused by the next input set, and a replay read garbage pages)
        return q, k, v, graphs, (kaio_args, mask)

    names = ["kaio", "torch SDPA"]
    if not paged:
        names += [f"torch SDPA {n}" for n in BACKENDS if n != "math" or kv_bytes <= MATH_BYTES]
    h.case(
        "flash_attention_decode f16" + " paged" * paged,
        f"B{b} L{length}" + " ragged" * ragged + f" H{H}/{HKV} D{D}",
        make,
        {n: (lambda q, k, v, graphs, _alive, n=n: replay(graphs[n])) for n in names},
        reference=lambda q, k, v, graphs, _alive: reference(q, k, v, host_lens),
        tol=1e-3,
        nbytes=kv_bytes,
        baseline="torch SDPA",
        set_bytes=2 * b * HKV * length * D * 2 * (2 if paged else 1),
    )


if __name__ == "__main__":
    main()
