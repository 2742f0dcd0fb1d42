"""Where ``flash_attention_decode``'s time goes: kernel times (CUPTI durations through the
torch profiler, median per kernel, summed over a call's kernels) of its variants (split
count, K/V stages, the fused, separate or cluster merge, lengths under the capacity), of
floors (a DSL kernel that only streams the same bytes; torch reductions and copies) and of
torch SDPA, all in one profiler session per group, calls rotating over input sets of more
than the L2 cache.

    python3 bench/decode_probe.py [warm | b | ncu | s | w | x | a | h | bn | c | p | q | r [SEC]]
    python3 bench/decode_probe.py t | v [SECONDS]  # page orders (dec34)
    python3 bench/decode_probe.py warm_d | warm_e | warm_f [SECONDS]; then d | e | f  # dec34
    python3 bench/decode_probe.py warm_g4 10; then g4 29  # dec, copies of decode_fwd (also g..g3)
    python3 bench/decode_probe.py warm_k 8; then k 17  # dec, the tile loop's switches off and on
    python3 bench/decode_probe.py warm_kf 9; then kf 8  # dec, the shipped kernel over its floors
    python3 bench/decode_probe.py warm_pc 14; then pc 28  # dec, pool-chunk floors at 32k keys
    python3 bench/decode_probe.py warm_fs 9; then fs 13  # dec, decode_folded's SPEC on and off
    python3 bench/decode_probe.py warm_fb 11; then fb 22  # dec, two barriers a tile
    python3 bench/decode_probe.py warm_gg 7; then gg  # dec, a graph replay over the kernel time
    python3 bench/decode_probe.py warm_sp 14; then sp 26  # dec, the suite's time split
    python3 bench/decode_probe.py warm_ws 8; then ws 12  # dec, the table window with the length
    python3 bench/decode_probe.py warm_fg 7; then fg 10  # dec, the floors in the suite's timing
    python3 bench/decode_probe.py warm_kt 7; then kt 30  # dec, kernel time three ways
    PROBE_BASE=1 PYTHONPATH=/main/checkout python3 bench/decode_probe.py f  # main's defaults
    python3 bench/decode_probe.py warm_p [SECONDS]  # the kernels of p and r
    python3 bench/decode_probe.py warm_t | warm_v [SECONDS]  # the kernels of t / v
    python3 bench/decode_probe.py warm_few | warm_c [SECONDS]  # the kernels of a, h / c
    PROBE_BASE=1 PYTHONPATH=/other/checkout python3 bench/decode_probe.py base_b
    PROBE_L2HINT=256 KAIO_CACHE_DIR=/tmp/other python3 bench/decode_probe.py h
    PROBE_BN=128 KAIO_CACHE_DIR=/tmp/other python3 bench/decode_probe.py bn

No argument: B = 1, 4k keys, taken apart (splits, stages, merges, lengths 0 .. 4k, floors).
``warm [SECONDS]`` compiles the kernels in 16 processes first (the disk cache keeps them;
D 128 f16 first, what is not started within SECONDS left out); ``b`` is the
suite's shapes, default against the global merge and SDPA; ``ncu`` makes the calls for
``ncu --kernel-name regex:decode_fwd``; ``base_b`` the default of another checkout's
kaio_ops (PROBE_BASE: its packages first on the path); ``s`` split counts and stages at the
shapes where kaio is near SDPA, for SECONDS at most; ``w`` the paged layout against the
contiguous one (the block-table window or a load per row, stages, kaio's copies alone as a
floor in both layouts); ``x`` the copies before the length on and off, the window on and
off, one split's stages and B = 1 at 32k keys paged over more splits; ``a`` 5 and 6 K/V
stages, B = 1 at 32k keys through clusters of 8 with them, copy floors; ``h`` the suite's
large shapes, for a run with PROBE_L2HINT (every 16-byte cp.async with that L2 prefetch
size, the PTX edited before the JIT) beside one without; ``bn`` key tiles of PROBE_BN keys;
``c`` each shape's default called twice (the same bits) and B = 1 at 32k keys through
clusters of 16 at two blocks a multiprocessor. head_stream's LOCK (the floor with a
sequence's K/V heads a cluster in lockstep) is what rounds of 2026-11-26 measured. ``p``
and ``r`` time ``decode_pages`` (a block a key split and sequence over all K/V heads, whole
pages; ``decode.WHOLE_PAGES``) against the per-head kernel and SDPA, with the copy floors of
whole-page reading (``page_stream``), of pages in order (``sequential_pages``) and with the
translations of pages ahead touched (``head_stream``'s TOUCH); ``q`` the paged suite shapes
with ragged lengths and determinism. ``t`` and ``v`` (dec34) read one pool with its
pages in several orders (``page_orders``: shuffled, each sequence's table ascending, sorted
within 32 entries, shuffled within 2 MB, 2 MB chunks shuffled, in order): kaio's paged
kernel and its copy floor on each, beside SDPA and the contiguous cache. ``d`` (dec34,
2026-11-27): B = 1 through clusters of 8, 12, 14 and 16 (the driver's residency for each),
the global merge's split counts, the splits' first copies before the length (SPLIT_SPEC)
and lengths 0 and 64 in the same grids (the fixed cost); ``e``: the memory-speed rule
(``decode.streams_fast``) at B = 1 from 1k to 32k keys and B = 4; ``f``: each suite
shape's default, both layouts, against SDPA (with PROBE_BASE: main's).
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from torch.profiler import ProfilerActivity, profile

if not os.environ.get("PROBE_BASE"):  # else kaio_ops from PYTHONPATH (main's, the baseline)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio  # noqa: E402
from kaio import f16, f32, i32, u32, u64  # noqa: E402
from kaio_ops import _decode as dk  # noqa: E402
from kaio_ops import decode  # noqa: E402


def _paged_caches():
    """bench/decode.py's ``paged_caches``, from this folder's file (with PROBE_BASE the
    packages on the path are main's)."""
    import importlib.util

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode.py")
    spec = importlib.util.spec_from_file_location("decode_suite", here)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.paged_caches


paged_caches = _paged_caches()

H, HKV, D = 32, 8, 128
ORIG = {
    n: getattr(decode, n)
    for n in (
        "splits_for",
        "deep_stages",
        "stages_for",
        "_counters",
        "one_split_stages",
        "plan_grid",
        "owns",
        "sorts",
        "DECODE",
        "FOLDED",
        "stage_syncs",
        "speculates",
    )
    if hasattr(decode, n)
}
ORIG_SPEC = getattr(decode, "SPECULATE", False)
ORIG_OWN_TILES = getattr(decode, "OWN_CLUSTER_TILES", 0)
ORIG_SPLIT_SPEC = getattr(decode, "SPLIT_SPEC", False)
ORIG_CLUSTER = getattr(decode, "CLUSTER_MERGE", False)
ORIG_TILES = getattr(decode, "CLUSTER_TILES", 8)
ORIG_PAGED_TILES = getattr(decode, "PAGED_CLUSTER_TILES", 8)
ORIG_WINDOW = getattr(decode, "PAGE_WINDOW", False)
ORIG_SPREAD = getattr(decode, "SPREAD", 0)
ORIG_CLUSTERS = getattr(decode, "CLUSTERS", (2, 4, 8, 16))
ORIG_PAGES = getattr(decode, "WHOLE_PAGES", False)
ORIG_MIN_BATCH = getattr(decode, "PAGE_MIN_BATCH", 0)
ORIG_PAGE_SPEC = getattr(decode, "PAGE_SPEC", False)
ORIG_FOLD = getattr(decode, "FOLD_SEQS", 0)
ORIG_PAIR = getattr(decode, "FOLD_PAIR", 0)
ORIG_FOLD_SPEC = getattr(decode, "FOLD_SPEC", 0)
ORIG_PDL = getattr(decode, "PDL", 0)
ORIG_BANDWIDTH = getattr(decode, "CLUSTER_BANDWIDTH", False)
ORIG_PAGE_FNS = {
    n: getattr(decode, n) for n in ("page_splits", "page_stages") if hasattr(decode, n)
}
T0 = time.time()
if os.environ.get("PROBE_BN"):  # key tiles of this many keys (run with its own KAIO_CACHE_DIR)
    dk.BN = int(os.environ["PROBE_BN"])
if os.environ.get("PROBE_L2HINT"):  # every kernel's 16-byte cp.async with this L2 prefetch
    from kaio.runtime import module as _module

    _build = _module.build_image
    _hint = f"cp.async.cg.shared.global.L2::{os.environ['PROBE_L2HINT']}B "
    _module.build_image = lambda ptx, *a: _build(
        ptx.replace("cp.async.cg.shared.global ", _hint), *a
    )


def restore():
    for n, f in ORIG.items():
        setattr(decode, n, f)
    decode.CLUSTER_MERGE = ORIG_CLUSTER
    decode.CLUSTER_CHECK = True
    decode.CLUSTER_BANDWIDTH = ORIG_BANDWIDTH
    decode.CLUSTER_TILES = ORIG_TILES
    decode.PAGED_CLUSTER_TILES = ORIG_PAGED_TILES
    decode.PAGE_WINDOW = ORIG_WINDOW
    decode.SPECULATE = ORIG_SPEC
    decode.OWN_CLUSTER_TILES = ORIG_OWN_TILES
    decode.SPLIT_SPEC = ORIG_SPLIT_SPEC
    decode.SPREAD = ORIG_SPREAD
    decode.CLUSTERS = ORIG_CLUSTERS
    decode.WHOLE_PAGES = ORIG_PAGES
    decode.PAGE_MIN_BATCH = ORIG_MIN_BATCH
    decode.PAGE_SPEC = ORIG_PAGE_SPEC
    decode.FOLD_SEQS = ORIG_FOLD
    decode.FOLD_PAIR = ORIG_PAIR
    decode.FOLD_SPEC = ORIG_FOLD_SPEC
    decode.PDL = ORIG_PDL
    for n, f in ORIG_PAGE_FNS.items():
        setattr(decode, n, f)


PENDING: list = []  # (label, fn, sets) to time in the next profiler session


@kaio.gpu_kernel(block_size=32)
def probe_mark(x: f32[:]):
    """A marker between timed calls in the profiler's timeline."""
    x[kaio.thread_idx_x()] = 1.0


MARK = None


def kernel_times(fn, sets, n=24):
    """A job for flush(): n calls rotating over sets."""
    return (fn, sets, n)


def show(label, job):
    PENDING.append((label, *job))


def sdpa_again(label, sets):
    """SDPA's time once more, last in the session (against drift between first and last)."""
    show(
        f"{label} SDPA again",
        kernel_times(lambda q, k, v, *_: sdpa(q, k, v, enable_gqa=True), sets),
    )


def both_passes(label, jobs, sets, inputs=None, n=24):
    """Each (name, fn) of ``jobs`` timed in order, then again in reverse order (over
    ``inputs``, ``sets`` by default), then SDPA again over ``sets``."""
    for order in (jobs, jobs[::-1]):
        for name, fn in order:
            show(f"{label} {name}", kernel_times(fn, sets if inputs is None else inputs, n))
    sdpa_again(label, sets)


def flush():
    """Time the pending jobs in one profiler session: {kernel: median us} per job, printed."""
    global MARK
    if MARK is None:
        MARK = torch.zeros(32, device="cuda")
    jobs = list(PENDING)
    PENDING.clear()
    if not jobs:
        return
    ok = []
    for job in jobs:  # compile and warm outside the session
        try:
            job[1](*job[2][0])
            torch.cuda.synchronize()
            ok.append(job)
        except Exception as e:  # noqa: BLE001
            print(f"{job[0]}: failed: {type(e).__name__}: {e}"[:300], flush=True)
    jobs = ok
    probe_mark[1, 32](MARK)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _, fn, sets, n in jobs:
            for i in range(3):
                fn(*sets[i % len(sets)])
            probe_mark[1, 32](MARK)
            for i in range(n):
                fn(*sets[(i + 3) % len(sets)])
            probe_mark[1, 32](MARK)
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    segments, inside, cur = [], False, None
    for e in evs:
        if "probe_mark" in e.name:
            if inside:
                segments.append(cur)
            else:
                cur = collections.defaultdict(list)
            inside = not inside
        elif inside:
            cur[e.name[:28]].append(e.device_time)
    for (label, _, _, n), seg in zip(jobs, segments, strict=False):
        # a kernel launched several times a call counts that many times
        times = {k: statistics.median(v) * len(v) / n for k, v in seg.items()}
        total = sum(times.values())
        parts = " + ".join(f"{k}={v:.2f}" for k, v in times.items()) if len(times) > 1 else ""
        print(f"{label:44s} {total:8.2f} us  {parts}", flush=True)
    if len(segments) != len(jobs):
        print(f"(marker mismatch: {len(segments)} segments for {len(jobs)} jobs)", flush=True)
    print(f"[{time.time() - T0:.0f}s]", flush=True)


def make_sets(b, length, paged=False, page=16):
    kv = 2 * b * HKV * length * D * 2
    nsets = max(1, min(32, (200 << 20) // kv + 1))
    sets = []
    for _ in range(nsets):
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.half)
        k, v = (torch.randn(b, HKV, length, D, device="cuda", dtype=torch.half) for _ in "kv")
        table = None
        kc, vc = k, v
        if paged:
            table, kc, vc = paged_caches(k, v, page)
        sets.append((q, k, v, kc, vc, table))
    return sets


def run_kaio(lens, contiguous=False, **cfg):
    """A job's call: kaio on the set's paged cache (where it has one), or on its contiguous
    cache, with ``force(**cfg)``'s settings."""

    def f(q, k, v, kc, vc, table):
        force(**cfg)
        if contiguous:
            return decode._decode("probe", q, k, v, lens, None, None)
        return decode._decode("probe", q, kc, vc, lens, table, None)

    return f


def check(sets, lens, contiguous=False, **cfg):
    """kaio's relative error against f32 SDPA on the contiguous cache (the reference a few
    sequences at a time: B64 L32768's grouped f32 heads would not fit)."""
    force(**cfg)
    q, k, v, kc, vc, table = sets[0]
    if contiguous:
        kc, vc, table = k, v, None
    out = decode._decode("probe", q, kc, vc, lens, table, None)[0]
    mask = torch.arange(k.shape[2], device="cuda")[None] < lens[:, None]
    step = max(1, (1 << 28) // (k[0].numel() * H // HKV))
    ref = torch.cat([
        sdpa(q[i:i + step].float(), k[i:i + step].float(), v[i:i + step].float(),
             attn_mask=mask[i:i + step, None, None], enable_gqa=True)
        for i in range(0, q.shape[0], step)
    ])  # fmt: skip
    err = ((out.float() - ref).norm() / ref.norm()).item()
    restore()
    return err


def force(
    splits=None,
    stages=None,
    unfused=False,
    cluster=None,
    window=None,
    spec=None,
    spread=None,
    pages=None,
    page_splits=None,
    page_stages=None,
    page_spec=None,
    cl=None,
    split_spec=None,
    plan=None,
    kernel=None,
    folded=None,
    sync1=None,
    own=None,
    own_tiles=None,
    sort=None,
    fold=None,
    pair=None,
    fold_spec=None,
    spec_all=None,
):
    """Module defaults but for what is named (cl: clusters of exactly this size, forced,
    with cluster=True) (cluster: None = the module's choice; window:
    the paged block-table window on or off; spread: the cluster merge's least shared
    memory a block, SPREAD)."""
    restore()
    if fold is not None:  # so many sequences a block (decode_folded) where it applies (0:
        decode.FOLD_SEQS = fold  # never)
    if pair is not None:  # decode_folded pairs the longest with the shortest (batch <= pair)
        decode.FOLD_PAIR = pair
    if fold_spec is not None:  # decode_folded's first tiles copied before its sort (SPEC)
        decode.FOLD_SPEC = fold_spec
    if spec_all is not None:  # one split's first copies before the length, either layout
        decode.speculates = lambda paged, splits=1, v=int(spec_all): v if splits == 1 else 0
    if sort is not None:  # one split over a paged cache: this many table slots sorted (SORT)
        decode.sorts = lambda paged, splits, *a, n=sort: n if paged and splits == 1 else 0
    if own_tiles is not None:  # OWN in cluster-merge grids of splits up to so many tiles
        decode.OWN_CLUSTER_TILES = own_tiles
    if own is not None:  # each warp on its own keys (OWN) in every grid, or in none
        decode.owns = lambda *a, o=int(own): o
    if pages is not None:  # whole-page blocks (decode_pages) on or off
        decode.WHOLE_PAGES = pages
        decode.PAGE_MIN_BATCH = 1
    if page_splits is not None:
        decode.page_splits = lambda *a, s=page_splits: s
    if page_stages is not None:
        decode.page_stages = lambda *a, s=page_stages: s
    if page_spec is not None:
        decode.PAGE_SPEC = page_spec
    if spread is not None:
        decode.SPREAD = spread
    if window is not None:
        decode.PAGE_WINDOW = window
    if spec is not None:
        decode.SPECULATE = spec
    if cluster is not None:
        decode.CLUSTER_MERGE = cluster
        decode.CLUSTER_CHECK = not cluster  # forced: measured even where clusters would queue
        decode.CLUSTER_BANDWIDTH = not cluster
        decode.CLUSTER_TILES = 1 << 30 if cluster else ORIG_TILES
        decode.PAGED_CLUSTER_TILES = 1 << 30 if cluster else ORIG_PAGED_TILES
    if cl is not None:
        decode.CLUSTERS = (cl,)
    if split_spec is not None:
        decode.SPLIT_SPEC = split_spec
    if splits is not None:
        decode.splits_for = lambda *a, s=splits: s
    if stages is not None:
        decode.deep_stages = lambda *a, s=stages: s
        decode.stages_for = lambda *a, s=stages: s
        decode.one_split_stages = lambda *a, s=stages: s
    if unfused:
        decode._counters = lambda *a: None
    if sync1 is not None:  # decode_fwd's one barrier a tile (SYNC1) on or off
        decode.stage_syncs = lambda *a, v=int(sync1): v
    if folded is not None:  # a probe variant of decode_folded (decode_variant)
        decode.FOLDED = folded
    if kernel is not None:  # a probe variant of decode_fwd (decode_variant)
        decode.DECODE = kernel
    if plan is not None:  # (splits, STAGES, CL): plan_grid's answer, whatever the grid
        decode.plan_grid = lambda like, kernel, blocks, tiles, dp, mt, paged, swap=0, p=plan: (
            *p,
            decode.shared_bytes(dp, mt, p[1]),
        )


@kaio.gpu_kernel(block_size=128)
def stream(src: f16[:], out: f32[:], per_block: u32, U: kaio.constexpr):
    """Floor: each block reads per_block elements (16-byte loads, U in flight a thread)."""
    tid = kaio.thread_idx_x()
    base = kaio.block_idx_x() * per_block
    buf = kaio.local(f16, (U, 8))
    acc = 0.0
    for i0 in range(tid * 8, per_block, 128 * 8 * U):
        for j in kaio.static_range(U):
            i = i0 + j * 128 * 8
            kaio.load_vector(buf[j], src, base + kaio.select(i < per_block, i, 0))
        for j in kaio.static_range(U):
            acc += f32(buf[j, 0]) + f32(buf[j, 7])
    out[kaio.block_idx_x() * 128 + tid] = acc


@kaio.gpu_kernel(block_size=128)
def head_stream(
    k: f16[:],
    v: f16[:],
    table: i32[:],
    out: f32[:],
    kv_heads: u32,
    length: u32,
    max_pages: u32,
    pages: u32,
    PAGED: kaio.constexpr,
    STAGES: kaio.constexpr,
    DP: kaio.constexpr,
    LOCK: kaio.constexpr,
    TOUCH: kaio.constexpr,
    CO: kaio.constexpr,
):
    """Floor of kaio's grid and copies: block (b, kvh) brings the K and V tiles of its
    sequence and head into shared memory as decode_fwd does (``load_stage``'s cp.async,
    STAGES in flight, the paged pages of 16 keys through ``window_pages``), with no
    arithmetic. DP 256 over a cache of D 128 (kv_heads halved): a block reads two heads,
    whose rows are adjacent in a page (512 bytes a token). LOCK > 1: the blocks of LOCK
    K/V heads of a sequence are one cluster, kept within a tile of each other (a cluster
    barrier a tile, arrive after the copies, wait before the next ones), so that they read
    each page together. TOUCH > 0 (paged): lane 0 of warp w also copies 16 bytes of K and
    of V from page w of the tile TOUCH tiles past the newest copied (its table entry
    loaded a tile earlier), so that its address translation is warm before its rows are
    read. CO > 1 (dec, ninth pass): the blocks of CO K/V heads of a sequence are one
    cluster with no barrier (on one GPC, free-running)."""
    if LOCK > 1:
        kaio.cluster_dims(LOCK)
    if CO > 1:
        kaio.cluster_dims(CO)
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    bkv = kaio.block_idx_x()
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    kv_s = kaio.shared_dynamic(f16, (2 * STAGES * dk.BN, DP), 0)
    pg = kaio.local(u32, (1, dk.BN // (128 // (DP // 8))))
    win = kaio.local(u32, 3)
    n = length // dk.BN
    if PAGED:
        dk.window_start(win, 0, b, table, max_pages, 4, lane)
    for j in kaio.static_range(STAGES - 1):
        if PAGED:
            dk.window_pages(pg, win, j * dk.BN, b, table, max_pages, 4, tid, lane, DP)
        dk.load_stage(
            kv_s, j * 2 * dk.BN, k, v, j * dk.BN, length, b, kvh, pg, 0, length, kv_heads, 4,
            pages, tid, DP, PAGED, f16,
        )  # fmt: skip
        kaio.cp_async_commit()
    acc = 0.0
    touch = kaio.shared(f16, (8, 8))
    warp = tid // 32
    ahead = ((STAGES - 1 + TOUCH) * dk.BN >> 4) + warp  # the page (of 16 keys) touched at t
    tp = u32(table[b * max_pages + kaio.min(ahead, max_pages - 1)])
    for t in range(n):
        if LOCK > 1:
            if t > 0:
                kaio.cluster_wait()
        if t + STAGES - 1 < n:
            key0 = (t + STAGES - 1) * dk.BN
            if PAGED:
                dk.window_pages(pg, win, key0, b, table, max_pages, 4, tid, lane, DP)
            dk.load_stage(
                kv_s, (t + STAGES - 1) % STAGES * 2 * dk.BN, k, v, key0, length, b, kvh, pg, 0,
                length, kv_heads, 4, pages, tid, DP, PAGED, f16,
            )  # fmt: skip
            if TOUCH > 0:
                if lane == 0:
                    at = dk.paged_row(tp, 0, kvh, kv_heads, 4, pages, DP)
                    kaio.cp_async(touch, (warp, 0), k, at, 16, 16)
                    kaio.cp_async(touch, (4 + warp, 0), v, at, 16, 16)
                    nxt = kaio.min(ahead + (t + 1) * (dk.BN >> 4), max_pages - 1)
                    tp = u32(table[b * max_pages + nxt])
        kaio.cp_async_commit()
        if LOCK > 1:
            kaio.cluster_arrive()
        kaio.cp_async_wait(STAGES - 1)
        kaio.sync_threads()
        acc += f32(kv_s[t % STAGES * 2 * dk.BN + tid % 64, tid // 64])
        kaio.sync_threads()
    if LOCK > 1:
        if n > 0:
            kaio.cluster_wait()
    kaio.cp_async_wait_all()
    out[bkv * 128 + tid] = acc


@kaio.gpu_kernel(block_size=128)
def items_stream(
    k: f16[:],
    v: f16[:],
    table: i32[:],
    out: f32[:],
    kv_heads: u32,
    length: u32,
    max_pages: u32,
    pages: u32,
    STAGES: kaio.constexpr,
    ITEMS: kaio.constexpr,
):
    """Floor of a persistent per-head grid over a paged cache (dec, twelfth pass): block x
    takes the (sequence, K/V head) items x and x + grid (ITEMS 2; 1: x alone) as one
    stream of key tiles, the second item's first copies in flight under the first's last
    tiles (its table window loaded at the start), kaio's copies (``load_stage`` through
    the block-table window, STAGES in flight), no arithmetic."""
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    x = kaio.block_idx_x()
    n = length // dk.BN  # an item's key tiles
    total = n * ITEMS
    kv_s = kaio.shared_dynamic(f16, (2 * STAGES * dk.BN, 128), 0)
    pg = kaio.local(u32, (1, dk.BN // 8))
    win = kaio.local(u32, 3)
    nxt = kaio.local(u32, 3)  # the second item's window
    dk.window_start(win, 0, x // kv_heads, table, max_pages, 4, lane)
    if ITEMS > 1:
        dk.window_start(nxt, 0, (x + kaio.grid_dim_x()) // kv_heads, table, max_pages, 4, lane)
    acc = 0.0
    for t in range(total + STAGES - 1):
        if t < total:  # tile t's copies (t < STAGES - 1: before the loop's first wait)
            item = t // n
            key0 = (t - item * n) * dk.BN
            bkv = x + item * kaio.grid_dim_x()
            if ITEMS > 1:
                if t == n:
                    for e in kaio.static_range(3):
                        win[e] = nxt[e]
            dk.window_pages(pg, win, key0, bkv // kv_heads, table, max_pages, 4, tid, lane, 128)
            dk.load_stage(
                kv_s, t % STAGES * 2 * dk.BN, k, v, key0, length, bkv // kv_heads,
                bkv % kv_heads, pg, 0, length, kv_heads, 4, pages, tid, 128, True, f16,
            )  # fmt: skip
        kaio.cp_async_commit()
        if t >= STAGES - 1:  # tile t - STAGES + 1 has landed
            kaio.cp_async_wait(STAGES - 1)
            kaio.sync_threads()
            u = t - (STAGES - 1)
            acc += f32(kv_s[u % STAGES * 2 * dk.BN + tid % 64, tid // 64])
            kaio.sync_threads()
    kaio.cp_async_wait_all()
    out[x * 128 + tid] = acc


def items_floor(b, length, kc, vc, table, items, stages=3):
    """items_stream over a paged pool with ``table`` [B, pages]: B * Hkv / items blocks."""
    blocks = b * HKV // items
    o = torch.empty(blocks * 128, device="cuda")
    pages = kc.numel() // (16 * HKV * 128)
    t = table.reshape(-1)

    def floor(*_):
        items_stream[blocks, 128, None, 2 * stages * 64 * 128 * 2](
            kc.view(-1), vc.view(-1), t, o, HKV, length, table.shape[1], pages,
            STAGES=stages, ITEMS=items,
        )  # fmt: skip

    return floor


@kaio.gpu_kernel
def page_stream(
    k: f16[:],
    v: f16[:],
    table: i32[:],
    out: f32[:],
    length: u32,
    max_pages: u32,
    per: u32,
    pages: u32,
    NT: kaio.constexpr,
    STAGES: kaio.constexpr,
    HKV: kaio.constexpr,
):
    """Floor of a grid of (key split, sequence) blocks that read whole pages of 16 keys
    (all HKV heads: 32 KB each of K and V at Hkv 8, D 128) through ``load_pages``, STAGES
    in flight, no arithmetic; split x of sequence y takes keys x * per .. + per (per a
    multiple of 16). The pages come from a window of the block table across each warp's
    lanes (``window_page``), as decode_pages' do."""
    kaio.launch_bounds(NT, 1)
    tid = kaio.thread_idx_x()
    b = kaio.block_idx_y()
    lo = kaio.min(kaio.block_idx_x() * per, length)
    n = (kaio.min(lo + per, length) - lo) // 16
    rows = 2 * HKV * 16
    kv_s = kaio.shared_dynamic(f16, (STAGES * rows, 128), 0)
    win = kaio.local(u32, 3)
    dk.window_start(win, lo, b, table, max_pages, 4, kaio.lane_id())
    for j in kaio.static_range(STAGES - 1):
        if j < n:
            pg = dk.window_page(win, lo + 16 * j, b, table, max_pages, 4, kaio.lane_id())
            dk.load_pages(
                kv_s, j * rows, k, v, pg, lo + 16 * j, length, 4, pages, tid, NT, HKV, 128, f16
            )
        kaio.cp_async_commit()
    acc = 0.0
    for t in range(n):
        if t + STAGES - 1 < n:
            key0 = lo + (t + STAGES - 1) * 16
            pg = dk.window_page(win, key0, b, table, max_pages, 4, kaio.lane_id())
            dk.load_pages(
                kv_s, (t + STAGES - 1) % STAGES * rows, k, v, pg, key0, length, 4, pages, tid,
                NT, HKV, 128, f16,
            )  # fmt: skip
        kaio.cp_async_commit()
        kaio.cp_async_wait(STAGES - 1)
        kaio.sync_threads()
        acc += f32(kv_s[t % STAGES * rows + tid % rows, tid // rows])
        kaio.sync_threads()
    kaio.cp_async_wait_all()
    out[(b * kaio.grid_dim_x() + kaio.block_idx_x()) * NT + tid] = acc


def page_floor_jobs(b, length, label, sets, variants):
    """page_stream floors for (splits, NT, STAGES) of ``variants`` and head_stream's (kaio's
    per-head grid) in both layouts, 4 stages."""
    floor_jobs(b, length, label, sets, ((False, 4, 1), (True, 4, 1)))
    for splits, nt, st in variants:
        per = -(-length // (16 * splits)) * 16
        o = torch.empty(b * splits * nt, device="cuda")

        def floor(q, k, v, kc, vc, table, splits=splits, nt=nt, st=st, o=o, per=per):
            page_stream[(splits, b), nt, None, st * 2 * HKV * 16 * 128 * 2](
                kc.view(-1), vc.view(-1), table.view(-1), o, length, length // 16, per,
                kc.shape[0], NT=nt, STAGES=st, HKV=HKV,
            )  # fmt: skip

        show(
            f"{label} floor whole pages splits={splits} NT={nt} st={st}",
            kernel_times(floor, sets),
        )


def pages_no_merge(lens, splits, stages=3, spec=1):
    """A job's call: decode_pages with every split writing the output itself (DIRECT over
    several splits: wrong values, each split's own; timing only), so the time without the
    merge's tail."""

    def f(q, k, v, kc, vc, table):
        b, h, sq, d = q.shape
        out = torch.empty_like(q)
        lse = torch.empty(b * h * sq, device="cuda")
        decode.PAGES[(splits, b), 32 * HKV, None, decode.page_shared(HKV, d, stages)](
            q.view(-1), kc.view(-1), vc.view(-1), lens, table.view(-1), out.view(-1), lse,
            lse, lse, h, h // HKV, sq, table.shape[1], 4, kc.shape[0], b * h * sq,
            1.4426950408889634 / d**0.5, HKV=HKV, DP=d, STAGES=stages, DIRECT=True, DT=f16,
            SPEC=spec,
        )  # fmt: skip
        return out

    return f


def round_p(budget: float):
    """Whole-page reading (page_stream: a block a (split, sequence), all K/V heads, whole
    pages) against kaio's per-head grid (head_stream) in both layouts and SDPA on the
    contiguous cache: the copy floors of the paged layout (kernel times)."""
    cases = (
        (16, 4096, ((8, 256, 3), (8, 256, 2))),
        (64, 4096, ((2, 256, 3), (4, 256, 2))),
        (16, 1024, ((8, 256, 3),)),
        (64, 1024, ((2, 256, 3),)),
        (16, 32768, ((8, 256, 3),)),
        (1, 32768, ((128, 256, 3), (64, 256, 3))),
    )
    for b, length, (variants,), sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged per-head", kernel_times(run_kaio(lens, pages=False), sets))
        if b == 1:  # the whole-page kernel's merge of 64 splits is one block's: floors only
            page_floor_jobs(b, length, label, sets, variants)
            continue
        print(f"{label} whole pages rel err {check(sets, lens, pages=True):.1e}", flush=True)
        show(f"{label} kaio paged whole pages", kernel_times(run_kaio(lens, pages=True), sets))
        show(
            f"{label} kaio paged whole pages st2",
            kernel_times(run_kaio(lens, pages=True, page_stages=2), sets),
        )
        show(
            f"{label} kaio paged whole pages spec off",
            kernel_times(run_kaio(lens, pages=True, page_spec=False), sets),
        )
        sp = decode.page_splits(b, length // 16, 132)
        show(
            f"{label} whole pages splits={sp} NO MERGE (timing only)",
            kernel_times(pages_no_merge(lens, sp), sets),
        )
        if sp > 1:  # half the blocks (B = 64: one split, no merge)
            show(
                f"{label} kaio paged whole pages splits={sp // 2}",
                kernel_times(run_kaio(lens, pages=True, page_splits=sp // 2), sets),
            )
        page_floor_jobs(b, length, label, sets, variants)


def round_q(budget: float):
    """The uniform paged suite shapes: kaio's default (whole pages from B = 8), the per-head
    kernel, the contiguous cache and SDPA on it, each default called twice (the same bits),
    plus ragged lengths (L/4 .. L, SDPA with a key mask) at B = 16 (kernel times)."""
    cases = ((16, 4096), (16, 1024), (64, 4096), (64, 1024), (16, 32768), (1, 32768))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        q, k, v, kc, vc, table = sets[0]
        one = decode._decode("probe", q, kc, vc, lens, table, None)
        two = decode._decode("probe", q, kc, vc, lens, table, None)
        same = all(torch.equal(x, y) for x, y in zip(one, two, strict=True))
        print(f"{label} paged deterministic (two calls, same bits): {same}", flush=True)
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged per-head", kernel_times(run_kaio(lens, pages=False), sets))
        show(f"{label} kaio paged default", kernel_times(run_kaio(lens), sets))
        if b == 16 and length <= 4096:
            gen = torch.Generator(device="cuda").manual_seed(b * length)
            rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
            rl = rl.to(torch.int32)
            mask = torch.arange(length, device="cuda")[None] < rl[:, None]
            mask = mask[:, None, None, :]
            print(f"{label} ragged default rel err {check(sets, rl):.1e}", flush=True)
            show(f"{label} ragged kaio paged default", kernel_times(run_kaio(rl), sets))
            show(
                f"{label} ragged kaio paged per-head",
                kernel_times(run_kaio(rl, pages=False), sets),
            )
            show(
                f"{label} ragged SDPA default (key mask)",
                kernel_times(
                    lambda q, k, v, *_, m=mask: sdpa(q, k, v, attn_mask=m, enable_gqa=True), sets
                ),
            )


def sequential_pages(k, v):
    """(block_table, k_pages, v_pages): the contiguous caches in 16-token pages in order
    (sequence b's pages b * L / 16 ..), the paged layout without the shuffle."""
    b, hkv, length, d = k.shape
    per = length // 16
    table = torch.arange(b * per, device="cuda", dtype=torch.int32).reshape(b, per)
    caches = [
        x.reshape(b, hkv, per, 16, d).permute(0, 2, 3, 1, 4).reshape(-1, 16, hkv, d).contiguous()
        for x in (k, v)
    ]
    return (table, *caches)


def round_r(budget: float):
    """decode_pages merged by decode_merge (the default), by its last block, and without a
    merge; the per-head kernel; SDPA; the copy floors over shuffled pages, pages in order
    and with the next pages' translations touched ahead (kernel times)."""
    cases = ((16, 4096), (64, 4096), (16, 1024), (64, 1024), (1, 32768))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged per-head", kernel_times(run_kaio(lens, pages=False), sets))
        print(f"{label} whole pages rel err {check(sets, lens, pages=True):.1e}", flush=True)
        show(f"{label} whole pages (merge kernel)", kernel_times(run_kaio(lens, pages=True), sets))
        sp = decode.page_splits(b, length // 16, 132)
        show(
            f"{label} whole pages splits={sp} NO MERGE (timing only)",
            kernel_times(pages_no_merge(lens, sp), sets),
        )
        if b == 1:
            continue
        q, k, v, *_ = sets[0]
        seq = [(q, k, v, *sequential_pages(k, v))]
        seq = [(q, k, v, kc, vc, table) for q, k, v, table, kc, vc in seq]
        show(
            f"{label} kaio paged per-head, pages in order",
            kernel_times(run_kaio(lens, pages=False), seq),
        )
        o = torch.empty(b * HKV * 128, device="cuda")
        for paged, touch, on in ((False, 0, sets), (True, 0, sets), (True, 0, seq), (True, 2, sets),
                                 (True, 4, sets)):  # fmt: skip

            def floor(q, k, v, kc, vc, table, paged=paged, touch=touch, b=b, o=o, n=length):
                src = (x.view(-1) for x in ((kc, vc) if paged else (k, v)))
                head_stream[b * HKV, 128, None, 2 * 4 * 64 * 128 * 2](
                    *src, table.view(-1), o, HKV, n, n // 16, kc.shape[0],
                    PAGED=paged, STAGES=4, DP=128, LOCK=1, TOUCH=touch, CO=0,
                )  # fmt: skip

            tag = "pages in order" if on is seq else f"touch={touch}"
            show(f"{label} floor per-head paged={paged} {tag}", kernel_times(floor, on))
        del seq


def layout_caches(k, v, table):
    """(block_table, k_pages, v_pages): the contiguous caches [B, Hkv, L, D] in 16-token
    pages at the pool slots of ``table`` [B, L / 16] (distinct entries)."""
    b, hkv, length, d = k.shape
    caches = []
    for x in (k, v):
        pages = torch.empty(table.numel(), 16, hkv, d, device=x.device, dtype=x.dtype)
        pages[table.long().flatten()] = (
            x.reshape(b, hkv, length // 16, 16, d).permute(0, 2, 3, 1, 4).reshape(-1, 16, hkv, d)
        )
        caches.append(pages)
    return (table, *caches)


def page_orders(b, length, group=64):
    """Block tables [B, L / 16] of one pool of B * L / 16 pages of 16 keys: "shuffled" (a
    random permutation, the suite's), "sorted" (the same pages, each sequence's ascending:
    every sequence sweeps the pool upwards), "sorted by 32" (ascending within each 32
    entries: what a warp's window of the table could sort), "2MB-local" (pages in order but shuffled
    within aligned groups of ``group`` pages: 2 MB at 32 KB a page), "2MB-chunks" (groups
    of ``group`` pages in order inside, the groups shuffled) and "in order"."""
    per = length // 16
    n = b * per
    gen = torch.Generator(device="cuda").manual_seed(n)
    perm = torch.randperm(n, device="cuda", generator=gen).to(torch.int32)
    ordered = torch.arange(n, device="cuda", dtype=torch.int32)
    g = min(group, n)
    local = ordered.reshape(-1, g)
    local = torch.gather(local, 1, torch.argsort(torch.rand(local.shape, device="cuda"), 1))
    chunks = ordered.reshape(-1, g)[torch.randperm(n // g, device="cuda")]
    return {
        "shuffled": perm.reshape(b, per),
        "sorted": perm.reshape(b, per).sort(dim=1).values,
        "sorted by 32": perm.reshape(-1, 32).sort(dim=1).values.reshape(b, per),
        "2MB-local": local.reshape(b, per).contiguous(),
        "2MB-chunks": chunks.reshape(b, per).contiguous(),
        "in order": ordered.reshape(b, per),
    }


def orders_round(budget: float, cases, orders, again: bool):
    """For each (b, length) of ``cases``: SDPA, kaio on the contiguous cache and its floor
    (head_stream: kaio's per-head grid and copies, 4 stages), then kaio's paged kernel and
    the paged floor over each layout of ``orders(k, v)`` ({name: (table, k_pages,
    v_pages)}, "shuffled" first), each checked against SDPA; ``again``: SDPA once more at
    the end of the shape's session (kernel times). PROBE_CASES="16x1024,..." runs only
    those shapes."""
    print(torch.cuda.get_device_name(), flush=True)
    if os.environ.get("PROBE_CASES"):  # only these, e.g. "16x1024,64x4096"
        cases = [tuple(int(n) for n in c.split("x")) for c in os.environ["PROBE_CASES"].split(",")]
    for b, length in cases:
        if time.time() - T0 > budget:
            print("(time budget: stopping)", flush=True)
            break
        torch.cuda.empty_cache()
        q = torch.randn(b, H, 1, D, device="cuda", dtype=torch.half)
        k, v = (torch.randn(b, HKV, length, D, device="cuda", dtype=torch.half) for _ in "kv")
        lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
        label = f"B{b} L{length}"
        sets = {name: [(q, k, v, kc, vc, t)] for name, (t, kc, vc) in orders(k, v).items()}
        one = sets["shuffled"]
        sdpa_job = kernel_times(lambda q, k, v, *_: sdpa(q, k, v, enable_gqa=True), one)
        show(f"{label} SDPA default", sdpa_job)
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), one))
        o = torch.empty(b * HKV * 128, device="cuda")

        def floor(q, k, v, kc, vc, table, paged=True, b=b, o=o, n=length):
            src = (x.view(-1) for x in ((kc, vc) if paged else (k, v)))
            head_stream[b * HKV, 128, None, 2 * 4 * 64 * 128 * 2](
                *src, table.view(-1), o, HKV, n, n // 16, kc.shape[0],
                PAGED=paged, STAGES=4, DP=128, LOCK=1, TOUCH=0, CO=0,
            )  # fmt: skip

        show(f"{label} floor contiguous", kernel_times(lambda *a: floor(*a, paged=False), one))
        for name, st in sets.items():
            print(f"{label} {name} rel err {check(st, lens):.1e}", flush=True)
            show(f"{label} kaio paged, {name}", kernel_times(run_kaio(lens), st))
            show(f"{label} floor paged, {name}", kernel_times(floor, st))
        if again:
            show(f"{label} SDPA default (again)", sdpa_job)
        flush()
        del sets, one, k, v


def round_t(budget: float):
    """Where the paged layout's cost comes from: kaio's paged kernel and its copy floor
    (head_stream, kaio's grid and copies) over the same pool with the pages in different
    orders (``page_orders``: shuffled, each sequence's table ascending, shuffled only within
    2 MB, 2 MB chunks shuffled, in order), beside the contiguous cache and SDPA on it; plus
    B = 16 at 256 keys (the fixed cost: kernel time at a small length) (kernel times)."""

    def orders(k, v):
        b, _, length, _ = k.shape
        if length < 1024:
            return {"shuffled": paged_caches(k, v, 16)}
        return {name: layout_caches(k, v, t) for name, t in page_orders(b, length).items()}

    orders_round(budget, ((16, 4096), (64, 1024), (16, 1024), (16, 256)), orders, False)


def warm_t():
    """What round t launches: the per-head defaults of its shapes, the floors."""
    out = [(probe_mark, {})]
    out += [(head_stream, {"PAGED": p, "STAGES": 4, "DP": 128, "LOCK": 1, "TOUCH": 0, "CO": 0})
            for p in (False, True)]  # fmt: skip
    c = {"DP": 128, "MT": 1, "DT": f16, "CL": 1, "DIRECT": True, "FUSED": False}
    for paged in (False, True):
        for st in (2, 3, 4):
            spec = decode.speculates(paged)
            out.append((decode.DECODE, {**c, "PAGED": paged, "STAGES": st, "PW": int(paged),
                                        "SPEC": spec}))  # fmt: skip
    return out


def round_v(budget: float):
    """The paged layout's floors against SDPA: kaio's per-head grid and copies (head_stream)
    over the suite's shuffled pool, the same pool read in each sequence's ascending order
    (host-sorted tables: the best order a kernel could choose) and pages in order, the
    contiguous cache; kaio's kernel on each; SDPA on the contiguous cache timed first and
    last (kernel times)."""

    def orders(k, v):
        table, kc, vc = paged_caches(k, v, 16)
        ordered = torch.arange(table.numel(), device="cuda", dtype=torch.int32)
        out = {"shuffled": (table, kc, vc)}
        for name, t in (("host-sorted", table.sort(dim=1).values), ("in order", ordered)):
            out[name] = layout_caches(k, v, t.reshape(table.shape).contiguous())
        return out

    cases = ((16, 32768), (16, 4096), (64, 1024), (16, 1024), (64, 4096))
    orders_round(budget, cases, orders, True)


def warm_v():
    """What round v launches: the per-head defaults of its shapes (one split), the floors."""
    out = [(probe_mark, {})]
    out += [(head_stream, {"PAGED": p, "STAGES": 4, "DP": 128, "LOCK": 1, "TOUCH": 0, "CO": 0})
            for p in (False, True)]  # fmt: skip
    for k, c in decode.shipped():
        if k is decode.DECODE and c["DP"] == 128 and c["MT"] == 1 and c["DT"] == f16:
            if c["DIRECT"]:
                out.append((k, c))
    return out


def round_w(budget: float):
    """The paged layout against the contiguous one at the shapes where it trailed SDPA:
    kaio with the block-table window and without, the floors of kaio's grid (head_stream)
    in both layouts, SDPA on the contiguous cache (kernel times, one profiler session a
    shape; stops after ``budget`` seconds of the process)."""
    cases = (
        (16, 4096, (2, 3)),
        (64, 4096, (2,)),
        (1, 4096, ()),
        (16, 1024, (2, 3)),
        (64, 1024, (2,)),
        (1, 32768, ()),
        (16, 32768, (2, 3)),
    )
    for b, length, (stages,), sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged window", kernel_times(run_kaio(lens, window=True), sets))
        show(f"{label} kaio paged per-row", kernel_times(run_kaio(lens, window=False), sets))
        for st in stages:
            show(
                f"{label} kaio contiguous stages={st}",
                kernel_times(run_kaio_contig(lens, stages=st), sets),
            )
            show(
                f"{label} kaio paged window stages={st}",
                kernel_times(run_kaio(lens, window=True, stages=st), sets),
            )
        if b == 1 and length == 32768:
            for sp, cl in ((16, False), (32, False), (16, True), (4, True)):
                show(
                    f"{label} kaio contiguous splits={sp} cluster={cl}",
                    kernel_times(run_kaio_contig(lens, splits=sp, cluster=cl), sets),
                )
        if b >= 16:
            o = torch.empty(b * HKV * 128, device="cuda")
            for paged, st, dp in (
                (False, 3, 128), (False, 4, 128), (True, 3, 128), (True, 4, 128),
                (False, 3, 256), (True, 3, 256),
            ):  # fmt: skip

                def floor(q, k, v, kc, vc, table, paged=paged, st=st, o=o, n=length, dp=dp, b=b):
                    src = (x.view(-1) for x in ((kc, vc) if paged else (k, v)))
                    hk = HKV * 128 // dp
                    head_stream[b * hk, 128, None, 2 * st * 64 * dp * 2](
                        *src, table.view(-1), o, hk, n, n // 16, kc.shape[0], PAGED=paged,
                        STAGES=st, DP=dp, LOCK=0, TOUCH=0, CO=0,
                    )  # fmt: skip

                show(
                    f"{label} floor copies paged={paged} st={st} heads/block={dp // 128}",
                    kernel_times(floor, sets),
                )


def round_x(budget: float):
    """The copies before the length (SPEC) on and off, the block-table window on and off,
    the stages of one split, B = 1 at 32k keys paged over more splits, against SDPA on the
    contiguous cache (kernel times, one profiler session a shape; stops after ``budget``
    seconds of the process)."""
    cases = (
        (16, 1024), (16, 4096), (64, 1024), (64, 4096), (1, 32768), (16, 32768), (1, 4096),
        (1, 1024),
    )  # fmt: skip
    for b, length, _, sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(
            f"{label} kaio contiguous spec off",
            kernel_times(run_kaio_contig(lens, spec=False), sets),
        )
        if b == 16:
            show(
                f"{label} kaio contiguous stages=4",
                kernel_times(run_kaio_contig(lens, stages=4), sets),
            )
        show(f"{label} kaio paged", kernel_times(run_kaio(lens), sets))
        show(f"{label} kaio paged spec off", kernel_times(run_kaio(lens, spec=False), sets))
        show(f"{label} kaio paged per-row", kernel_times(run_kaio(lens, window=False), sets))
        if b == 1 and length == 32768:
            for sp, cl in ((16, False), (32, False), (16, True)):
                show(
                    f"{label} kaio paged splits={sp} cluster={cl}",
                    kernel_times(run_kaio(lens, splits=sp, cluster=cl), sets),
                )


def round_a(budget: float):
    """Deeper K/V pipelines (5 and 6 stages: over A100's shared memory, within H100's) and
    B = 1 at 32k keys through clusters of 8 with them, paged and contiguous, against SDPA on
    the contiguous cache (kernel times, one profiler session a shape; stops after
    ``budget`` seconds of the process)."""
    cases = (
        (16, 4096, ((5, None, None), (6, None, None))),
        (64, 4096, ((4, None, None), (6, None, None))),
        (1, 32768, ((4, 8, True), (6, 8, True), (6, 16, False), (5, 8, True))),
        (16, 1024, ((6, None, None),)),
        (64, 1024, ((4, None, None),)),
        (1, 4096, ((6, None, None),)),
        (16, 32768, ((6, None, None),)),
    )
    for b, length, (variants,), sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged", kernel_times(run_kaio(lens), sets))
        for st, sp, cl in variants:
            tag = f"stages={st}" + (f" splits={sp} cluster={cl}" if sp else "")
            show(
                f"{label} kaio paged {tag}",
                kernel_times(run_kaio(lens, stages=st, splits=sp, cluster=cl), sets),
            )
            if b == 1 and sp == 8 and st == 6:
                show(
                    f"{label} kaio contiguous {tag}",
                    kernel_times(run_kaio_contig(lens, stages=st, splits=sp, cluster=cl), sets),
                )
        if b in (16, 64) and length == 4096:
            floor_jobs(b, length, label, sets, ((False, 4, 1), (True, 4, 1), (True, 4, 8)))
    resident()


def floor_jobs(b, length, label, sets, variants):
    """head_stream floors (kaio's grid and copies, no arithmetic) for (paged, STAGES, LOCK)
    or (paged, STAGES, LOCK, CO) of ``variants``."""
    o = torch.empty(b * HKV * 128, device="cuda")
    for paged, st, lock, *co in variants:
        co = co[0] if co else 0

        def floor(q, k, v, kc, vc, table, paged=paged, st=st, lock=lock, co=co):
            src = (x.view(-1) for x in ((kc, vc) if paged else (k, v)))
            head_stream[b * HKV, 128, None, 2 * st * 64 * 128 * 2](
                *src, table.view(-1), o, HKV, length, length // 16, kc.shape[0], PAGED=paged,
                STAGES=st, DP=128, LOCK=lock, TOUCH=0, CO=co,
            )  # fmt: skip

        co_tag = f" co={co}" if co else ""
        show(
            f"{label} floor copies paged={paged} st={st} lock={lock}{co_tag}",
            kernel_times(floor, sets),
        )


def round_bn(budget: float):
    """Key tiles of PROBE_BN keys (128: half the tiles, so half the per-tile costs, for the
    same bytes in flight): both layouts, the default stages and 3, against SDPA."""
    cases = ((16, 1024), (16, 4096), (64, 1024), (64, 4096), (1, 32768), (1, 4096))
    for b, _length, _, sets, lens, label in shapes(cases, budget):
        show(f"{label} BN{dk.BN} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} BN{dk.BN} kaio paged", kernel_times(run_kaio(lens), sets))
        if b > 1:
            show(
                f"{label} BN{dk.BN} kaio contiguous stages=3",
                kernel_times(run_kaio_contig(lens, stages=3), sets),
            )
            show(
                f"{label} BN{dk.BN} kaio paged stages=3",
                kernel_times(run_kaio(lens, stages=3), sets),
            )


def resident():
    """The cluster residency the plans asked the driver for (decode._RESIDENT)."""
    for key, have in decode._RESIDENT.items():
        consts = dict(key[1])
        print(f"resident clusters {have}: LOCK {consts.get('LOCK')} CL {consts.get('CL')} "
              f"STAGES {consts.get('STAGES')} shared {key[2]}")  # fmt: skip


def round_c(budget: float):
    """Each suite shape's default twice (the same bits: deterministic), B = 1 at 32k keys
    through clusters of 16 two blocks a multiprocessor (3 stages, no SPREAD), against SDPA
    (kernel times; stops after ``budget`` seconds of the process)."""
    cases = ((1, 32768), (1, 4096), (1, 1024), (16, 4096), (64, 1024), (16, 32768))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        q, k, v, kc, vc, table = sets[0]
        for name, args in (
            ("contiguous", (q, k, v, lens, None)),
            ("paged", (q, kc, vc, lens, table)),
        ):
            one = decode._decode("probe", *args, None)
            two = decode._decode("probe", *args, None)
            same = all(torch.equal(x, y) for x, y in zip(one, two, strict=True))
            print(f"{label} {name} deterministic (two calls, same bits): {same}", flush=True)
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged", kernel_times(run_kaio(lens), sets))
        if b == 1 and length == 32768:
            for st in (3, 2):
                cfg = {"splits": 16, "cluster": True, "stages": st, "spread": 0}
                show(
                    f"{label} kaio contiguous CL16 st{st} 2/SM",
                    kernel_times(run_kaio_contig(lens, **cfg), sets),
                )
                show(
                    f"{label} kaio paged CL16 st{st} 2/SM",
                    kernel_times(run_kaio(lens, **cfg), sets),
                )
            for sp, st in ((16, 3), (20, 3), (24, 3)):
                cfg = {"splits": sp, "cluster": False, "stages": st}
                show(
                    f"{label} kaio paged splits={sp} st{st}",
                    kernel_times(run_kaio(lens, **cfg), sets),
                )
        if b == 64:
            show(
                f"{label} kaio contiguous st2", kernel_times(run_kaio_contig(lens, stages=2), sets)
            )
            show(f"{label} kaio paged st2", kernel_times(run_kaio(lens, stages=2), sets))
    resident()


def warm_c():
    """What round c and the GPU tests of tests/test_ops_decode.py's CUDA graph and
    no-synchronization cases launch: decode.shipped() at D 128, one M-tile; clusters of 16
    at 2 and 3 stages."""
    out = [(probe_mark, {})]
    out += [(k, c) for k, c in decode.shipped() if c.get("DP", 128) == 128 and c.get("MT", 1) == 1]
    for st in (2, 3):  # B = 64 at 2 stages, B = 1 over 20 or 24 splits at 3
        c = {"DP": 128, "MT": 1, "PAGED": True, "STAGES": st, "DT": f16, "CL": 1, "PW": 1}
        out.append((decode.DECODE, {**c, "DIRECT": True, "FUSED": False, "SPEC": 1}))
        out.append((decode.DECODE, {**c, "DIRECT": False, "FUSED": True, "SPEC": 0}))
    for paged in (False, True):
        for st in (2, 3):
            c = {"DP": 128, "MT": 1, "PAGED": paged, "STAGES": st, "DT": f16, "CL": 16}
            out.append(
                (decode.DECODE, {**c, "DIRECT": False, "FUSED": False, "PW": int(paged), "SPEC": 0})
            )
    return out


def round_h(budget: float):
    """kaio paged and contiguous against SDPA at the suite's large shapes, for a run with
    PROBE_L2HINT set (the L2 prefetch size of the 16-byte copies, 128 or 256; with its own
    KAIO_CACHE_DIR) and one without: compare the ratios to SDPA of the two processes."""
    cases = ((16, 4096, ()), (64, 4096, ()), (1, 32768, ()), (16, 1024, ()))
    for _b, _length, _, sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged", kernel_times(run_kaio(lens), sets))


def shapes(cases, budget: float):
    """(b, length, the rest of the case, paged sets, lengths, label) of each (b, length,
    ...) of ``cases`` in turn, the default's error printed first and the jobs queued by
    the caller timed after it; stops after ``budget`` seconds of the process."""
    print(torch.cuda.get_device_name(), flush=True)
    for b, length, *rest in cases:
        if time.time() - T0 > budget:
            print("(time budget: stopping)", flush=True)
            break
        torch.cuda.empty_cache()
        sets = make_sets(b, length, paged=True)
        lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
        label = f"B{b} L{length}"
        print(f"{label} paged rel err {check(sets, lens):.1e}", flush=True)
        show(
            f"{label} SDPA default",
            kernel_times(lambda q, k, v, *_: sdpa(q, k, v, enable_gqa=True), sets),
        )
        yield b, length, rest, sets, lens, label
        flush()
        del sets


def run_kaio_contig(lens, **cfg):
    return run_kaio(lens, contiguous=True, **cfg)


def floors(nbytes):
    n = nbytes // 2
    srcs = [torch.randn(n, device="cuda").half() for _ in range(8)]
    for blocks in (128, 256, 512, 1024):
        for u in (8, 16):
            out = torch.empty(blocks * 128, device="cuda")
            per = n // blocks
            t = kernel_times(
                lambda s, out=out, per=per, blocks=blocks, u=u: stream[blocks, 128](
                    s, out, per, U=u
                ),
                [(s,) for s in srcs],
            )
            show(f"floor stream {blocks} blocks x128 U{u}", t)
    t = kernel_times(lambda s: s.view(-1, 4096).sum(1, dtype=torch.float32), [(s,) for s in srcs])
    show("floor torch rowsum", t)
    dst = [torch.empty_like(s) for s in srcs]
    t = kernel_times(lambda s, d: d.copy_(s), list(zip(srcs, dst, strict=True)))
    show("floor torch copy (read+write 2x)", t)
    tiny = torch.zeros(1, device="cuda")
    t = kernel_times(lambda x: x.add_(1), [(tiny,)])
    show("floor empty-ish torch kernel", t)


def sdpa_variants(sets, label):
    for name, backend in (
        ("default", None),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ):

        def f(q, k, v, kc, vc, table, backend=backend):
            if backend is None:
                return sdpa(q, k, v, enable_gqa=True)
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=True)

        try:
            show(f"{label} SDPA {name}", kernel_times(f, sets))
        except Exception as e:  # noqa: BLE001
            print(f"{label} SDPA {name}: {type(e).__name__}", flush=True)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    b, length = 1, 4096
    sets = make_sets(b, length)
    lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
    print(f"B1 L4096 rel err vs f32 SDPA: {check(sets, lens):.2e}", flush=True)
    k = decode.DECODE
    for cl, st in ((16, 4), (16, 3), (16, 2), (8, 4)):
        try:
            n = k.max_active_clusters(
                128, decode.shared_bytes(128, 1, st), DP=128, MT=1, PAGED=False, DIRECT=False,
                FUSED=False, STAGES=st, CL=cl, DT=f16,
            )  # fmt: skip
            print(f"max_active_clusters CL={cl} stages={st}: {n}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"max_active_clusters CL={cl}: {type(e).__name__}: {e}"[:200], flush=True)
    for s, st in ((16, None), (8, None), (16, 2)):
        force(splits=s, stages=st, cluster=True)
        print(f"  cluster s={s} st={st} err {check(sets, lens):.1e}", flush=True)
    restore()
    if hasattr(decode, "plan_grid"):
        for b_, hk, tiles, paged in (
            (1, 8, 64, False),
            (1, 8, 16, False),
            (1, 8, 512, False),
            (4, 8, 64, False),
            (16, 8, 64, False),
            (1, 8, 64, True),
        ):
            try:
                qa = decode._arrays.Inputs("probe").array(
                    sets[0][0], "q", ndim=4, dtypes=(f16,), form="q"
                )
                got = decode.plan_grid(qa, k, b_ * hk, tiles, 128, 1, paged)
            except Exception as e:  # noqa: BLE001
                got = f"{type(e).__name__}: {e}"[:200]
            print(f"plan_grid B{b_} tiles={tiles} paged={paged}: (splits, stages, CL) = {got}")
    show("B1 L4096 kaio default", kernel_times(run_kaio(lens), sets))
    sdpa_variants(sets, "B1 L4096")
    for s, st in ((16, None), (8, None), (16, 3), (16, 2), (4, None), (2, None)):
        show(
            f"B1 L4096 CLUSTER splits={s} stages={st}",
            kernel_times(run_kaio(lens, splits=s, stages=st, cluster=True), sets),
        )
    show("B1 L4096 kaio global merge", kernel_times(run_kaio(lens, cluster=False), sets))
    for s in (1, 4, 8, 12, 16, 24, 32, 64):
        show(f"B1 L4096 splits={s}", kernel_times(run_kaio(lens, splits=s, cluster=False), sets))
    for st in (2, 3):
        show(
            f"B1 L4096 splits=16 stages={st}",
            kernel_times(run_kaio(lens, splits=16, stages=st, cluster=False), sets),
        )
    show(
        "B1 L4096 splits=32 stages=2",
        kernel_times(run_kaio(lens, splits=32, stages=2, cluster=False), sets),
    )
    for s in (8, 16, 32):
        show(
            f"B1 L4096 splits={s} unfused",
            kernel_times(run_kaio(lens, splits=s, unfused=True, cluster=False), sets),
        )
    flush()
    for n in (0, 64, 1024, 2048):
        short = torch.full((b,), n, device="cuda", dtype=torch.int32)
        for s in (1, 16):
            show(
                f"B1 cap4096 len={n} splits={s}",
                kernel_times(run_kaio(short, splits=s, cluster=False), sets),
            )
        show(
            f"B1 cap4096 len={n} CLUSTER splits=16",
            kernel_times(run_kaio(short, splits=16, cluster=True), sets),
        )
    floors(2 * b * HKV * length * D * 2)
    flush()
    del sets


def warm_list():
    """Every specialization the decode ops ship (``decode.shipped()``: what the suite, the
    probe and the GPU tests launch) and the probe's own kernels, for ``warm``."""
    out = list(decode.shipped())
    out += [(probe_mark, {})] + [(stream, {"U": u}) for u in (8, 16)]
    out += [
        (head_stream, {"PAGED": p, "STAGES": st, "DP": dp, "LOCK": 0, "TOUCH": 0, "CO": 0})
        for p in (False, True)
        for st, dp in ((3, 128), (4, 128), (3, 256))
    ]
    for paged in (False, True):  # the probe's forced variants: global merges, the old pages
        for st in (2, 3, 4):
            for direct, fused in ((False, True), (True, False), (False, False)):
                c = {"DP": 128, "MT": 1, "PAGED": paged, "STAGES": st, "DT": f16, "CL": 1}
                for pw in (0, 1) if paged else (0,):
                    for spec in (0, 1) if direct and (pw or not paged) else (0,):
                        flags = {"DIRECT": direct, "FUSED": fused, "PW": pw}
                        out.append((decode.DECODE, {**c, **flags, "SPEC": spec}))
    seen, unique = set(), []
    for kernel, c in out:
        key = (kernel.pyfunc.__name__, tuple(sorted(c.items(), key=str)))
        if key not in seen:
            seen.add(key)
            unique.append((kernel, c))
    return unique


def warm_few():
    """D 128 f16 decode_fwd for one M-tile: both layouts, 2 to 6 stages, one split, the
    fused merge and clusters of 8 and 16 (what the suite and rounds a and h launch)."""
    out = [(probe_mark, {})]
    flags = {"STAGES": 4, "DP": 128, "TOUCH": 0, "CO": 0}
    out += [(head_stream, {**flags, "PAGED": p, "LOCK": lk}) for p, lk in
            ((False, 1), (True, 1), (True, 8))]  # fmt: skip
    for paged in (False, True):
        for st in (2, 3, 4, 5, 6):
            for direct, fused, cl in ((True, False, 1), (False, True, 1), (False, False, 8),
                                      (False, False, 16)):  # fmt: skip
                c = {"DP": 128, "MT": 1, "PAGED": paged, "STAGES": st, "DT": f16, "CL": cl}
                spec = decode.speculates(paged) if direct else 0
                c |= {"DIRECT": direct, "FUSED": fused, "PW": int(paged), "SPEC": spec}
                out.append((decode.DECODE, c))
    return out


def warm_p():
    """What round p launches: decode_pages at 2 and 3 stages, the per-head defaults of the
    suite's shapes (paged and contiguous), the floors."""
    out = [(probe_mark, {})]
    for direct in (False, True):
        c = {"HKV": 8, "DP": 128, "STAGES": 3, "DIRECT": direct, "DT": f16, "SPEC": 1}
        out.append((decode.PAGES, c))
    out.append((decode.MERGE, {"DP": 128, "MT": 1, "DT": f16}))
    c = {"DP": 128, "MT": 1, "DT": f16, "CL": 1}
    out.append((decode.DECODE, {**c, "PAGED": False, "STAGES": 2, "DIRECT": True,
                                "FUSED": False, "PW": 0, "SPEC": 0}))  # fmt: skip
    out.append((decode.DECODE, {**c, "PAGED": True, "STAGES": 4, "DIRECT": True,
                                "FUSED": False, "PW": 1, "SPEC": 1}))  # fmt: skip
    out.append((decode.DECODE, {**c, "PAGED": True, "STAGES": 4, "DIRECT": False,
                                "FUSED": True, "PW": 1, "SPEC": 0}))  # fmt: skip
    out.append((decode.DECODE, {**c, "PAGED": False, "STAGES": 4, "DIRECT": False,
                                "FUSED": False, "PW": 0, "SPEC": 0, "CL": 8}))  # fmt: skip
    out += [
        (head_stream, {"PAGED": p, "STAGES": 4, "DP": 128, "LOCK": 1, "TOUCH": t, "CO": 0})
        for p, t in ((False, 0), (True, 0), (True, 2), (True, 4))
    ]
    out += [(page_stream, {"NT": nt, "STAGES": st, "HKV": 8}) for nt, st in
            ((256, 3), (256, 2), (512, 3))]  # fmt: skip
    return out


WARM_LIST = warm_list


def warm_one(i):
    kernel, c = WARM_LIST()[i]
    if kernel is decode.DECODE:  # (lists made before decode_fwd had SORT and PDL)
        c = {"SORT": 0, "PDL": 0, **c}
    try:
        kernel.resources(**c)  # compiled, loaded, its cubin in the disk cache
    except Exception as e:  # noqa: BLE001
        return f"{kernel.pyfunc.__name__} {c}: {type(e).__name__}: {e}"[:200]
    return None


def warm(budget: float = 1e9):
    """Compile the kernels of ``warm_list`` in parallel processes (the disk cache keeps
    them), D = 128 f16 first (the suite's and the probe's); those not started within
    ``budget`` seconds are left out."""
    from concurrent.futures import ProcessPoolExecutor

    kernels = WARM_LIST()
    todo = list(range(len(kernels)))
    first = [i for i in todo if kernels[i][1].get("DP", 128) == 128]
    first = [i for i in first if kernels[i][1].get("DT", f16) == f16]
    order = first + [i for i in todo if i not in first]
    pool = ProcessPoolExecutor(16)
    futures = [pool.submit(warm_one, i) for i in order]
    done = 0
    for f in futures:
        left = budget - (time.time() - T0)
        if left <= 0:
            break
        try:
            err = f.result(timeout=left)
        except Exception:  # noqa: BLE001  (the time is up)
            break
        done += 1
        if err:
            print(err, flush=True)
    pool.shutdown(wait=True, cancel_futures=True)
    print(f"warm: {done} of {len(order)} kernels in {time.time() - T0:.1f}s", flush=True)


def round_b(base: bool):
    """Default vs the global merge vs SDPA over the suite's shapes (base: main's kaio_ops,
    default only)."""
    tag = "BASE " if base else ""
    print(f"{tag}kaio_ops from {os.path.dirname(decode.__file__)}", flush=True)
    for b, length, paged, extra in (
        (1, 4096, False, ("c8", "c16")),
        (1, 1024, False, ("c8",)),
        (1, 4096, True, ()),
        (1, 32768, False, ("c8", "c16")),
        (4, 4096, False, ("c4", "c2")),
        (16, 4096, False, ()),
        (16, 4096, True, ()),
        (64, 4096, True, ()),
        (64, 1024, False, ()),
    ):
        if time.time() - T0 > (11 if base else 17):
            print("(time budget: stopping)", flush=True)
            break
        torch.cuda.empty_cache()
        sets = make_sets(b, length, paged)
        lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
        label = f"{tag}B{b} L{length}" + " paged" * paged
        show(f"{label} kaio default", kernel_times(run_kaio(lens), sets))
        if not base:
            show(f"{label} kaio global merge", kernel_times(run_kaio(lens, cluster=False), sets))
            for c in extra:
                show(
                    f"{label} CLUSTER splits={c[1:]}",
                    kernel_times(run_kaio(lens, splits=int(c[1:]), cluster=True), sets),
                )
        show(
            f"{label} SDPA default",
            kernel_times(lambda q, k, v, *_: sdpa(q, k, v, enable_gqa=True), sets),
        )
        if not base and not paged and b in (1, 16) and length == 4096:
            n = b * HKV * length * D
            out = torch.empty(1024 * 128, device="cuda")

            def floor(q, k, v, *_, n=n, out=out):  # K then V: the bytes, read once
                stream[1024, 128](k.view(-1), out, n // 1024, U=16)
                stream[1024, 128](v.view(-1), out, n // 1024, U=16)

            show(f"{label} floor: stream K and V", kernel_times(floor, sets))
        if b == 1 and length == 4096 and not paged:

            def flash(q, k, v, *_):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(q, k, v, enable_gqa=True)

            show(f"{label} SDPA flash", kernel_times(flash, sets))
        flush()
        del sets


def round_s(budget: float):
    """Split counts and K/V stages at the suite's shapes where kaio is near or under SDPA
    (kernel times; stops after ``budget`` seconds of the process)."""
    for b, length, paged, variants in (
        (16, 4096, True, ((2, None), (1, 2), (1, 3))),
        (16, 4096, False, ((2, None), (1, 3))),
        (64, 4096, False, ((2, None),)),
        (64, 1024, False, ((2, None), (4, None))),
        (16, 1024, False, ((2, None), (4, None))),
        (1, 1024, False, ((4, None), (16, None))),
        (16, 32768, False, ((2, None),)),
    ):
        if time.time() - T0 > budget:
            print("(time budget: stopping)", flush=True)
            break
        torch.cuda.empty_cache()
        sets = make_sets(b, length, paged)
        lens = torch.full((b,), length, device="cuda", dtype=torch.int32)
        label = f"B{b} L{length}" + " paged" * paged
        show(f"{label} kaio default", kernel_times(run_kaio(lens), sets))
        for splits, stages in variants:
            show(
                f"{label} kaio splits={splits} stages={stages}",
                kernel_times(run_kaio(lens, splits=splits, stages=stages, cluster=False), sets),
            )
        show(
            f"{label} SDPA default",
            kernel_times(lambda q, k, v, *_: sdpa(q, k, v, enable_gqa=True), sets),
        )
        flush()
        del sets


CL_SIZES = (8, 12, 14, 16)  # round d's cluster sizes (any 2 .. 16: the splits of a head)


def cluster_residency():
    """max_active_clusters of decode_fwd (D 128, one M-tile, SPREAD shared memory: a block
    a multiprocessor) for round d's sizes, both layouts."""
    for paged in (False, True):
        for cl in CL_SIZES:
            st = decode.deep_stages(128, 1)
            shared = max(decode.shared_bytes(128, 1, st), decode.SPREAD)
            try:
                n = decode.DECODE.max_active_clusters(
                    dk.THREADS, shared, DP=128, MT=1, PAGED=paged, DIRECT=False, FUSED=False,
                    STAGES=st, CL=cl, DT=f16, PW=int(paged), SPEC=0,
                )  # fmt: skip
            except Exception as e:  # noqa: BLE001
                n = f"{type(e).__name__}: {e}"[:120]
            print(f"resident clusters of {cl} (paged={paged}, {shared} B shared): {n}")


def round_d(budget: float):
    """B = 1 (dec34, round A of 2026-11-27): clusters of 8, 12, 14 and 16 splits (a block a
    multiprocessor: how many SMs the grid covers against the merge's cost), the fused global
    merge over 12 to 32 splits, its forward alone (the separate merge kernel's split), against
    SDPA and the default; B16 at 1k keys and paged at 4k over 2 splits (kernel times)."""
    cluster_residency()
    cases = (
        (
            1,
            4096,
            (
                "c8",
                "c12",
                "c14",
                "c16",
                "c14s5",
                "g16",
                "g16s3",
                "g12",
                "g24s3",
                "u16",
                "c8x",
                "c14x",
                "c16x",
                "g16x",
            ),
        ),  # fmt: skip
        (1, 32768, ("c8", "c12", "c14", "c16", "g16", "g16s3", "g24s3", "g32s2", "u16")),
        (1, 1024, ("c8", "c12", "c14", "c16", "g16", "c8x", "c14x")),
        (16, 1024, ("g2s3",)),
        (16, 4096, ("g2s3",)),
    )
    for b, length, (variants,), sets, lens, label in shapes(cases, budget):
        for var in (v for v in variants if v.endswith("x")):  # the new path's error
            q, k, v, *_ = sets[0]
            out = run_kaio_contig(lens, **variant(var))(*sets[0])[0]
            ref = sdpa(q.float(), k.float(), v.float(), enable_gqa=True)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            print(f"{label} contiguous {var} rel err {err:.1e}", flush=True)
            restore()
        show(f"{label} kaio contiguous default", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged default", kernel_times(run_kaio(lens), sets))
        for var in variants:
            cfg = variant(var)
            show(f"{label} kaio contiguous {var}", kernel_times(run_kaio_contig(lens, **cfg), sets))
            if b > 1 or var in ("c12", "c14", "c16", "g16", "g24s3"):
                show(f"{label} kaio paged {var}", kernel_times(run_kaio(lens, **cfg), sets))
        if b == 1 and length == 4096:  # the fixed cost: lengths 0 and 64 in the same grids
            for n in (0, 64):
                short = torch.full((b,), n, device="cuda", dtype=torch.int32)
                for var in ("c8", "c14", "g16"):
                    show(
                        f"{label} len={n} kaio contiguous {var}",
                        kernel_times(run_kaio_contig(short, **variant(var)), sets),
                    )
            tiny = torch.zeros(1, device="cuda")
            show("floor empty-ish torch kernel", kernel_times(lambda *_, t=tiny: t.add_(1), sets))


def round_e(budget: float):
    """dec34 round B of 2026-11-27: the plan's memory-speed rule (``decode.streams_fast``)
    on this GPU, B = 1 at 1k to 32k keys and B = 4 at 4k: the default against clusters of
    8 (main's plan), the global merge over 16 splits, each with SPLIT_SPEC (x), SDPA; the
    fixed cost (length 0) of one split, clusters of 8 and the global merge."""
    like = decode._arrays.Inputs("probe").array(torch.zeros(1, 1, device="cuda").half(), "x")
    peak = decode.memory_bandwidth(like)
    print(f"memory bandwidth {peak}, 64 blocks stream fast: {decode.streams_fast(like, 64)}")
    cases = (
        (1, 32768, ("c8", "g16", "c8x", "g16x")),
        (1, 4096, ("c8", "c8x", "g16", "g16x")),
        (1, 16384, ("c8", "g16")),
        (1, 8192, ("c8", "g16")),
        (1, 1024, ("c8", "c8x")),
        (4, 4096, ("c4", "c4x", "g4")),
    )
    for b, length, (variants,), sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous default", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged default", kernel_times(run_kaio(lens), sets))
        for var in variants:
            cfg = variant(var)
            show(f"{label} kaio contiguous {var}", kernel_times(run_kaio_contig(lens, **cfg), sets))
            if var in ("c8", "g16") and length >= 16384:
                show(f"{label} kaio paged {var}", kernel_times(run_kaio(lens, **cfg), sets))
        if b == 1 and length == 4096:  # the fixed cost: length 0 in the same grids
            zero = torch.zeros((b,), device="cuda", dtype=torch.int32)
            for var in ("c8", "c8x", "g16", "g1"):
                show(
                    f"{label} len=0 kaio contiguous {var}",
                    kernel_times(run_kaio_contig(zero, **variant(var)), sets),
                )


def round_f(budget: float):
    """dec34 round D of 2026-11-27: each suite shape's default, both layouts, against SDPA
    (kernel times); run once with PROBE_BASE (main's kaio_ops) and once without, the same
    GPU one after the other (without: also B1 L32768 through clusters of 8 and the global
    merge over 16 splits, the memory-speed rule's two plans)."""
    tag = "BASE " if os.environ.get("PROBE_BASE") else ""
    print(f"{tag}kaio_ops from {os.path.dirname(decode.__file__)}", flush=True)
    cases = ((1, 4096), (1, 32768), (16, 1024), (16, 4096), (64, 1024), (1, 1024))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        show(f"{tag}{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{tag}{label} kaio paged", kernel_times(run_kaio(lens), sets))
        if not tag and b == 1 and length == 32768:  # the memory-speed rule's two plans
            for var in ("c8", "g16"):
                cfg = variant(var)
                show(
                    f"{label} kaio contiguous {var}",
                    kernel_times(run_kaio_contig(lens, **cfg), sets),
                )


def decode_variant(name: str, edits: dict, kernel: str = "decode_fwd"):
    """``kernel`` (``decode_fwd``) of a copy of kaio_ops/_decode.py with ``edits`` made
    (old text: new, each old text found once): a probe-only kernel, its own module (in the
    temporary folder) and disk-cache key."""
    import importlib.util
    import tempfile

    with open(dk.__file__) as f:
        src = f.read()
    for old, new in edits.items() if isinstance(edits, dict) else edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    mod_name = f"decode_variant_{name}"
    path = os.path.join(tempfile.gettempdir(), mod_name + ".py")
    if not os.path.exists(path) or open(path).read() != src:
        with open(path, "w") as f:
            f.write(src)
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    return getattr(sys.modules[mod_name], kernel)


_TILE_MATH = """        dot_rows_at(s, qf, kv_s, krow, bcol, lane, KW // 8, 0, DP, DT)  # S = Q K^T
        # the last tiles hold keys past the end or past a new token's position
        masked = i32((t + 1) * BN) + i32(sq) > i32(kv_len) + 1
        masked_softmax(s, m, l, o, masked, t * BN + kpart * KW, limit, lane, scale_log2, KW, DP)
        acc_rows_at(o, s, kv_s, krow + BN, acol, lane, KW // 8, DP, DT)  # O += P V
"""
_QK = "        dot_rows_at(s, qf, kv_s, krow, bcol, lane, KW // 8, 0, DP, DT)  # S = Q K^T\n"
_SOFTMAX = """        # the last tiles hold keys past the end or past a new token's position
        masked = i32((t + 1) * BN) + i32(sq) > i32(kv_len) + 1
        masked_softmax(s, m, l, o, masked, t * BN + kpart * KW, limit, lane, scale_log2, KW, DP)
"""
_PV = "        acc_rows_at(o, s, kv_s, krow + BN, acol, lane, KW // 8, DP, DT)  # O += P V\n"
# diagnostics (wrong results by design): the key tiles' arithmetic, or a part of it, left
# out (the tile still read from shared memory), or done twice
G_VARIANTS = {
    "nomath": {_TILE_MATH: "        o[0, 0] += f32(kv_s[krow + lane % 16, lane])\n"},
    "math2": {_TILE_MATH: _TILE_MATH + _TILE_MATH},
    "noqk": {
        _QK: """        for n in kaio.static_range(KW // 8):
            for e in kaio.static_range(4):
                s[n, e] = f32(kv_s[krow + n * 8 + lane % 8, lane * 4 + e])
"""
    },
    "nosoftmax": {_SOFTMAX: ""},
    "nopv": {_PV: "        o[0, 0] += s[0, 0] + f32(kv_s[krow + BN + lane % 16, lane])\n"},
}


_IMPORTS = "from kaio_ops._attention_tc import (\n"
# candidates (exact results): the accumulators rescaled only where a row's maximum moved
# (a warp-uniform test: most tiles after the first move none); the scores' sum over the
# head dim in two interleaved chains of mma (half the dependent latency)
G_CANDIDATES = {
    "lazy": {
        _IMPORTS: _IMPORTS + "    rescale,\n    softmax_step,\n",
        "        online_softmax(s, m, l, o, h, scale_log2, KW // 8, DP)\n": """\
        alpha = softmax_step(s, m, l, h, scale_log2, KW // 8)
        if not kaio.vote_all(alpha == 1.0):
            rescale(o, h, alpha, DP)
""",
    },
    "qk2": {
        _IMPORTS: _IMPORTS + "    mma,\n",
        _QK: "        dot_two_chains(s, qf, kv_s, krow, bcol, lane, KW // 8, DP, DT)\n",
        "@kaio.gpu_func\ndef masked_softmax(": """\
@kaio.gpu_func
def dot_two_chains(
    acc: f32[:, :], af: u32[:, :], b_s: DT[:, :], b_row0: u32, bcol: u32[:], lane: u32,
    NB: kaio.constexpr, K: kaio.constexpr, DT: kaio.constexpr,
):
    acc2 = kaio.local(f32, (NB, 4))
    bf = kaio.local(u32, (2, 2))
    for n in kaio.static_range(NB):
        for e in kaio.static_range(4):
            acc[n, e] = 0.0
            acc2[n, e] = 0.0
    for kk in kaio.static_range(K // 16):
        for nj in kaio.static_range(NB // 2):
            row = b_row0 + nj * 16 + lane // 16 * 8 + lane % 8
            kaio.ldmatrix(bf, b_s, (row, kk // 4 * 64 + bcol[kk % 4]))
            for i in kaio.static_range(2):
                if kk % 2 == 0:
                    mma(acc, 2 * nj + i, af, kk, bf, i, DT)
                else:
                    mma(acc2, 2 * nj + i, af, kk, bf, i, DT)
    for n in kaio.static_range(NB):
        for e in kaio.static_range(4):
            acc[n, e] += acc2[n, e]


@kaio.gpu_func
def masked_softmax(""",
    },
}


# round g3's kernels, all copies of _decode.py (an unedited one the baseline), the original
# timed before any copy is launched: in round B of 2026-11-27, after the diagnostic copies
# (G_VARIANTS) had run, the original's launches gave their output (relative error 1.0 at
# the second shape) and their times; not seen in round C (exact copies), not explained
G3 = {
    "same": [],
    "lazy": list(G_CANDIDATES["lazy"].items()),
    "qk2": list(G_CANDIDATES["qk2"].items()),
    "lazyqk2": list(G_CANDIDATES["lazy"].items()) + list(G_CANDIDATES["qk2"].items()),
}


_WAIT_TOP = """        stage = i % STAGES * 2 * BN
        if i + STAGES - 1 < count:  # into the stage tile i - 1 used
"""
_WAIT_MID = """        kaio.cp_async_commit()
        kaio.cp_async_wait(STAGES - 1)  # tile t has landed
        kaio.sync_threads()
        if SPEC:
            if i < STAGES - 1"""
_END_SYNC = """        acc_rows_at(o, s, kv_s, krow + BN, acol, lane, KW // 8, DP, DT)  # O += P V
        kaio.sync_threads()  # this stage is free
"""
_BOUNDS = "    kaio.launch_bounds(THREADS, 3 if DP <= 128 and MT == 1 else 2)"
# round g4's candidates: one barrier a key tile (the wait and the barrier first, then the
# copies into the stage that tile i - 1 used: every warp is past it; STAGES - 2 tiles in
# flight during the wait instead of STAGES - 1), and the register cap lifted (a block a
# multiprocessor needs none: ptxas gives 165 of 168 now)
ONE_SYNC = [
    (
        _WAIT_TOP,
        """        stage = i % STAGES * 2 * BN
        kaio.cp_async_wait(STAGES - 2)  # tile t has landed
        kaio.sync_threads()  # (and every warp is done with the stage of tile i - 1)
        if i + STAGES - 1 < count:  # into the stage tile i - 1 used
""",
    ),
    (_WAIT_MID, "        kaio.cp_async_commit()\n        if SPEC:\n            if i < STAGES - 1"),
    (_END_SYNC, _END_SYNC.split("\n")[0] + "\n"),
]
LB1 = [(_BOUNDS, "    kaio.launch_bounds(THREADS, 1)")]
G4 = {"same": [], "1sync": ONE_SYNC, "lb1": LB1, "1sync_lb1": ONE_SYNC + LB1}


def round_g4(budget: float):
    """dec, round D of 2026-11-27: G4's candidates (one barrier a key tile, the register cap
    lifted, both) against an unedited copy of decode_fwd, as round g3 (the original first;
    the one-barrier loop wants 3 stages or more: at the contiguous B = 16 default's 2 it
    waits with no tile in flight)."""
    g3_like(budget, G4)


def round_g3(budget: float):
    """dec, round C of 2026-11-27: the exact candidates (G_CANDIDATES: the lazy rescale, the
    scores in two mma chains, both) against an unedited copy of decode_fwd in one process,
    two passes (the second reversed), both layouts, each checked against SDPA first; the
    original default timed before them."""
    g3_like(budget, G3)


def g3_like(budget: float, kernels: dict):
    """Copies of decode_fwd (``kernels``: name -> edits) against the first (an unedited
    copy) in two passes, both layouts, checked first, after the original's default."""
    cases = ((16, 4096), (64, 1024), (16, 1024))
    for _, _, _, sets, lens, label in shapes(cases, budget):
        show(f"{label} ORIGINAL contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} ORIGINAL paged", kernel_times(run_kaio(lens), sets))
        flush()
        jobs = []
        for name, edits in kernels.items():
            kern = decode_variant(name, edits)
            err = check(sets, lens, kernel=kern)
            print(f"{label} paged {name} rel err {err:.1e}", flush=True)
            jobs.append((name, kern))
        for order in (jobs, jobs[::-1]):
            for name, kern in order:
                cfg = {"kernel": kern}
                show(f"{label} contiguous {name}", kernel_times(run_kaio_contig(lens, **cfg), sets))
                show(f"{label} paged {name}", kernel_times(run_kaio(lens, **cfg), sets))
        sdpa_again(label, sets)


def warm_g4():
    """What round g4 launches."""
    return warm_g3(G4)


def warm_g3(kernels=None):
    """What round g3 launches: the defaults of its shapes and G3's copies."""
    kernels = G3 if kernels is None else kernels
    out = [(probe_mark, {})]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged)}
        flags = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "CL": 1}
        for st in {decode.one_split_stages(128, 1, paged), decode.stages_for(128, 1)}:
            out.append((decode.DECODE, {**c, **flags, "STAGES": st}))
            for name, edits in kernels.items():
                out.append((decode_variant(name, edits), {**c, **flags, "STAGES": st}))
    return out


G_PLANS = {"c2s3": (2, 3, 2), "c2s2": (2, 2, 2)}  # round g's plans: (splits, STAGES, CL)


def round_g(budget: float):
    """dec, round A of 2026-11-27 (issue 34): the uniform B = 16 shapes where the paged
    cache trails SDPA, a K/V head's keys in two splits merged through a cluster of 2 (two
    or three blocks a multiprocessor: G_PLANS) against the default's one split (a block a
    multiprocessor), both layouts; B64 L1024's default."""
    cases = ((16, 4096), (16, 1024), (64, 1024))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        show(f"{label} kaio contiguous", kernel_times(run_kaio_contig(lens), sets))
        show(f"{label} kaio paged", kernel_times(run_kaio(lens), sets))
        if b > 16:
            continue
        floor_jobs(b, length, label, sets, ((False, 2, 0), (True, 4, 0)))
        for name, plan in G_PLANS.items():
            print(f"{label} paged {name} rel err {check(sets, lens, plan=plan):.1e}", flush=True)
            show(f"{label} kaio paged {name}", kernel_times(run_kaio(lens, plan=plan), sets))
            show(
                f"{label} kaio contiguous {name}",
                kernel_times(run_kaio_contig(lens, plan=plan), sets),
            )
        for name, edits in G_VARIANTS.items():  # diagnostics: where the fixed cost is
            kern = decode_variant(name, edits)
            show(f"{label} kaio paged {name}", kernel_times(run_kaio(lens, kernel=kern), sets))
            show(
                f"{label} kaio contiguous {name}",
                kernel_times(run_kaio_contig(lens, kernel=kern), sets),
            )


def round_g2(budget: float):
    """dec, round B of 2026-11-27: where decode_fwd's time over its copy floor goes, at the
    B = 16 and 64 shapes: the default and the G_VARIANTS diagnostics in two passes (the
    second in reverse order: a drift shows as a difference between the passes), the floors
    and SDPA first and last."""
    cases = ((16, 4096), (64, 1024), (16, 1024))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        floor_jobs(b, length, label, sets, ((False, 2, 0), (True, 4, 0)))
        jobs = [("default", None)] + [(n, decode_variant(n, e)) for n, e in G_VARIANTS.items()]
        for name, edits in G_CANDIDATES.items():  # exact: checked first
            kern = decode_variant(name, edits)
            print(f"{label} paged {name} rel err {check(sets, lens, kernel=kern):.1e}", flush=True)
            jobs.append((name, kern))
        for order in (jobs, jobs[::-1]):
            for name, kern in order:
                cfg = {} if kern is None else {"kernel": kern}
                show(f"{label} contiguous {name}", kernel_times(run_kaio_contig(lens, **cfg), sets))
                show(f"{label} paged {name}", kernel_times(run_kaio(lens, **cfg), sets))
        sdpa_again(label, sets)
        floor_jobs(b, length, label, sets, ((False, 2, 0), (True, 4, 0)))


def warm_g2():
    """What round g2 launches: the defaults of its shapes and the G_VARIANTS diagnostics
    (one split at 2 and 3 stages contiguous, 4 and 3 paged), the floors."""
    out = warm_g3({**G_VARIANTS, **G_CANDIDATES})
    for paged in (False, True):
        st = decode.one_split_stages(128, 1, paged)
        out.append(
            (head_stream, {"PAGED": paged, "STAGES": st, "DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0})
        )
    return out


def warm_g():
    """What round g launches: the defaults of its shapes and G_PLANS' cluster grids."""
    out = [(probe_mark, {})]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged)}
        for st in {decode.one_split_stages(128, 1, paged), decode.stages_for(128, 1)}:
            flags = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "CL": 1}
            out.append((decode.DECODE, {**c, **flags, "STAGES": st}))
        for _, st, cl in G_PLANS.values():
            flags = {"DIRECT": False, "FUSED": False, "SPEC": 0, "CL": cl, "STAGES": st}
            out.append((decode.DECODE, {**c, **flags}))
        st = decode.one_split_stages(128, 1, paged)
        flags = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "CL": 1}
        for name, edits in G_VARIANTS.items():
            out.append((decode_variant(name, edits), {**c, **flags, "STAGES": st}))
        flags = {"PAGED": paged, "STAGES": st, "DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0}
        out.append((head_stream, flags))
    return out


def warm_f():
    """What round f launches: the defaults of its shapes (D 128 f16, one M-tile)."""
    out = [(probe_mark, {})]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged)}
        out.append((decode.DECODE, {**c, "DIRECT": False, "FUSED": False, "SPEC": 0, "CL": 8,
                                    "STAGES": 4}))  # fmt: skip
        out.append((decode.DECODE, {**c, "DIRECT": False, "FUSED": True, "SPEC": 0, "CL": 1,
                                    "STAGES": 4}))  # fmt: skip
        for st in {decode.one_split_stages(128, 1, paged), decode.stages_for(128, 1)}:
            flags = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "CL": 1}
            out.append((decode.DECODE, {**c, **flags, "STAGES": st}))
    return out


def variant(name: str) -> dict:
    """force()'s settings for a round d variant: cN clusters of N (4 stages), gN[sS] N splits
    through the fused global merge (S stages), uN the same through the merge kernel; a
    trailing "x": SPLIT_SPEC (round-robin tiles, the first copies before the length)."""
    spec = name.endswith("x")
    name = name.rstrip("x")
    n, _, st = name[1:].partition("s")
    stages = int(st) if st else None
    if name[0] == "c":
        return {"splits": int(n), "cluster": True, "cl": int(n), "stages": stages,
                "split_spec": spec}  # fmt: skip
    cfg = {"splits": int(n), "cluster": False, "stages": stages, "split_spec": spec}
    if name[0] == "u":
        cfg["unfused"] = True
    return cfg


def warm_e():
    """What round e launches (and bench/decode.py's B = 1 defaults): decode_fwd at D 128
    f16, one M-tile: clusters of 4 and 8 with SPEC on and off, the fused merge at 4 stages
    on and off, one split, both layouts."""
    out = [(probe_mark, {})]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged), "STAGES": 4}
        for spec in (0, 1) if not paged else (0,):
            for cl in (4, 8):
                out.append((decode.DECODE, {**c, "DIRECT": False, "FUSED": False, "SPEC": spec,
                                            "CL": cl}))  # fmt: skip
            out.append((decode.DECODE, {**c, "DIRECT": False, "FUSED": True, "SPEC": spec,
                                        "CL": 1}))  # fmt: skip
        one = decode.one_split_stages(128, 1, paged)
        flags = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "CL": 1}
        out.append((decode.DECODE, {**c, **flags, "STAGES": one}))
    return out


def warm_d():
    """What round d launches: decode_fwd at D 128 f16, one M-tile, both layouts: clusters of
    CL_SIZES at 4 stages, the fused merge at 2, 3 and 4, the separate merge, one split."""
    out = [(probe_mark, {}), (decode.MERGE, {"DP": 128, "MT": 1, "DT": f16})]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged)}
        for cl in CL_SIZES:
            flags = {"DIRECT": False, "FUSED": False, "SPEC": 0, "CL": cl, "STAGES": 4}
            out.append((decode.DECODE, {**c, **flags}))
        if not paged:
            flags = {"DIRECT": False, "FUSED": False, "SPEC": 0, "CL": 14, "STAGES": 5}
            out.append((decode.DECODE, {**c, **flags}))
            for cl in (8, 14, 16):  # SPLIT_SPEC
                flags = {"DIRECT": False, "FUSED": False, "SPEC": 1, "CL": cl, "STAGES": 4}
                out.append((decode.DECODE, {**c, **flags}))
            flags = {"DIRECT": False, "FUSED": True, "SPEC": 1, "CL": 1, "STAGES": 4}
            out.append((decode.DECODE, {**c, **flags}))
        for st in (2, 3, 4):
            flags = {"DIRECT": False, "FUSED": True, "SPEC": 0, "CL": 1, "STAGES": st}
            out.append((decode.DECODE, {**c, **flags}))
        out.append((decode.DECODE, {**c, "DIRECT": False, "FUSED": False, "SPEC": 0, "CL": 1,
                                    "STAGES": 4}))  # fmt: skip
        one = decode.one_split_stages(128, 1, paged)
        flags = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "CL": 1}
        out.append((decode.DECODE, {**c, **flags, "STAGES": one}))
    return out


# round k (dec, this session's issue 34 pass): decode_fwd's tile-loop switches, each off
# against the shipped setting (all on): KEYS_IN_M (the keys in the mma's M dimension, SWAP),
# SYNC1 (one barrier a key tile at 3 stages), OWN_KEYS (each warp on its own keys, OWN:
# paged, one split, a block a multiprocessor)
K_FLAGS = ("KEYS_IN_M", "SYNC1", "OWN_KEYS")
K_VARIANTS = {
    "shipped": (),
    "no own": ("OWN_KEYS",),
    "no sync1": ("SYNC1",),
    "none": K_FLAGS,
}
K_CASES = ((16, 4096), (64, 1024), (16, 1024), (1, 4096), (64, 4096), (1, 32768), (16, 32768))
K_ON = {name: getattr(decode, name) for name in K_FLAGS}


def with_flags(fn, off):
    """``fn`` called with decode's switches ``off`` (names of K_FLAGS) off, the others as
    shipped (all as shipped after)."""

    def f(*args, **kwargs):
        for name in K_FLAGS:
            setattr(decode, name, K_ON[name] and name not in off)
        try:
            return fn(*args, **kwargs)
        finally:
            for name in K_FLAGS:
                setattr(decode, name, K_ON[name])

    return f


def round_k(budget: float, variants=None, cases=K_CASES):
    """``variants`` (name -> (switches off, force()'s settings) or the switches alone;
    K_VARIANTS) at ``cases``, both layouts, two passes (the second reversed), each variant
    checked against f32 SDPA first (both layouts); SDPA first and last."""
    variants = {
        n: v if isinstance(v, list) else [v, {}] for n, v in (variants or K_VARIANTS).items()
    }
    for _, _, _, sets, lens, label in shapes(cases, budget):
        for name, (off, cfg) in variants.items():
            err = with_flags(check, off)(sets, lens, **cfg)
            again = with_flags(check, off)(sets, lens, contiguous=True, **cfg)
            print(f"{label} {name} rel err paged {err:.1e} contiguous {again:.1e}", flush=True)
        jobs = list(variants.items())
        for order in (jobs, jobs[::-1]):
            for name, (off, cfg) in order:
                for contiguous in (True, False):
                    fn = with_flags(run_kaio(lens, contiguous=contiguous, **cfg), off)
                    layout = "contiguous" if contiguous else "paged"
                    show(f"{label} {layout} {name}", kernel_times(fn, sets))
        sdpa_again(label, sets)


def warm_k():
    """What round k launches: decode_fwd (D 128 f16, one M-tile, a group of 4 query rows)
    as its shapes' plans have it (one split at their stages; B = 1 through clusters of 8,
    and of 16 for the residency query, and, paged at 32k keys, 16 splits through the fused
    merge, 4 stages) under each K_VARIANTS step."""
    out = [(probe_mark, {})]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged), "CL": 1}
        one = {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged)}
        # (clusters of 16 too: the plans ask the driver whether theirs run at once)
        grids = [
            ({**c, "DIRECT": False, "FUSED": False, "SPEC": 0, "CL": n}, 4, False) for n in (8, 16)
        ]
        if paged:
            grids.append(({**c, "DIRECT": False, "FUSED": True, "SPEC": 0}, 4, False))
        alone = decode.one_split_stages(128, 1, paged)
        for st in {alone, decode.stages_for(128, 1)}:
            grids.append(({**c, **one}, st, st == alone))
        for grid, st, single in grids:
            for off in K_VARIANTS.values():
                own = int("OWN_KEYS" not in off and decode.owns(1, paged, single))
                sync1 = int("SYNC1" not in off and decode.stage_syncs(st, own))
                swap = int("KEYS_IN_M" not in off)
                item = (decode.DECODE, {**grid, "STAGES": st, "SWAP": swap, "SYNC1": sync1,
                                        "OWN": own})  # fmt: skip
                if item not in out:
                    out.append(item)
    return out


def round_kf(budget: float):
    """The shipped kernel over its copy floors (head_stream: the same one-split grid and
    stages, copies only) and SDPA, both layouts, two passes (the second reversed), at the
    B >= 16 shapes of round k."""
    for b, length, _, sets, lens, label in shapes(((16, 4096), (64, 1024), (16, 1024)), budget):
        stages = {p: decode.one_split_stages(128, 1, p) if b * HKV <= 132 else 3 for p in (0, 1)}
        for rev in (False, True):
            for paged in (True, False) if rev else (False, True):
                layout = "paged" if paged else "contiguous"
                job = kernel_times(run_kaio(lens, contiguous=not paged), sets)
                show(f"{label} {layout} shipped", job)
                floor_jobs(b, length, label, sets, ((paged, stages[paged], 0),))
        sdpa_again(label, sets)


def warm_kf():
    """What round kf launches: round k's kernels and the copy floors at 2, 3 and 4 stages."""
    out = warm_k()
    for paged in (False, True):
        for st in (2, 3, 4):
            flags = {"PAGED": paged, "STAGES": st, "DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0}
            out.append((head_stream, flags))
    return out


@kaio.gpu_kernel(block_size=128)
def tma_stream(
    tk: kaio.tensormap,
    tv: kaio.tensormap,
    table: i32[:],
    out: f32[:],
    kv_heads: u32,
    length: u32,
    max_pages: u32,
    PAGED: kaio.constexpr,
    STAGES: kaio.constexpr,
):
    """Floor of kaio's per-head grid (block (b, kvh)) with the K/V copies by TMA (dec,
    ninth pass): each 16-key page of a tile as two boxes of 16 rows x 64 columns (its
    head's 256-byte rows, 2 KB apart in an NHD page) of K and two of V, issued by lanes 0 to
    3 of warp 0 (a page each, from the block-table window), one mbarrier a stage, STAGES
    tiles in flight, no arithmetic. A stage holds K's column halves then V's, 64 rows of
    128 bytes each (the TMA's 128-byte swizzle). Contiguous: the same boxes of [B * Hkv *
    L, D]."""
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    bkv = kaio.block_idx_x()
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    BN = dk.BN
    kv_s = kaio.shared_dynamic(f16, (STAGES * 4 * BN, 64), 0)
    bars = kaio.shared_dynamic(u64, (STAGES,), STAGES * 4 * BN * 128)
    if tid == 0:
        for s in kaio.static_range(STAGES):
            kaio.mbarrier_init(bars, s, 1)
        kaio.fence_proxy_async()
    kaio.sync_threads()
    win = kaio.local(u32, 3)
    n = length // BN
    if tid < 32:
        if PAGED:
            dk.window_start(win, 0, b, table, max_pages, 4, lane)
        for j in kaio.static_range(STAGES - 1):
            if j < n:
                tma_tile(kv_s, bars, j, tk, tv, win, table, b, kvh, kv_heads, length,
                         max_pages, lane, PAGED, STAGES)  # fmt: skip
    acc = 0.0
    for t in range(n):
        if tid < 32:
            if t + STAGES - 1 < n:  # into the stage tile t - 1 used (all past it)
                tma_tile(kv_s, bars, t + STAGES - 1, tk, tv, win, table, b, kvh, kv_heads,
                         length, max_pages, lane, PAGED, STAGES)  # fmt: skip
        kaio.mbarrier_wait(bars, t % STAGES, u32(t // STAGES) & 1)
        acc += f32(kv_s[t % STAGES * 4 * BN + tid % 64, tid // 64])
        kaio.sync_threads()
    out[bkv * 128 + tid] = acc


@kaio.gpu_func
def tma_tile(
    kv_s: f16[:, :],
    bars: u64[:],
    t: u32,
    tk: kaio.tensormap,
    tv: kaio.tensormap,
    win: u32[:],
    table: i32[:],
    b: u32,
    kvh: u32,
    kv_heads: u32,
    length: u32,
    max_pages: u32,
    lane: u32,
    PAGED: kaio.constexpr,
    STAGES: kaio.constexpr,
):
    """Warp 0's TMA copies of key tile t (``tma_stream``) into stage t % STAGES: lane p < 4
    copies page p of the tile (16 keys), K and V, both column halves."""
    BN = dk.BN
    st = t % STAGES
    key0 = t * BN
    row = i32(0)
    col = i32(0)
    if PAGED:
        dk.window_page(win, key0, b, table, max_pages, 4, lane)  # (moves the window)
        page = kaio.shfl_idx(win[1], (key0 >> 4) - win[0] + lane % 4)
        row = i32(page * 16)
        col = i32(kvh * 128)
    else:
        row = i32((b * kv_heads + kvh) * length + key0 + lane % 4 * 16)
    if lane == 0:
        kaio.mbarrier_arrive_expect_tx(bars, st, u32(2 * BN * 128 * 2))
    kaio.sync_warp()
    if lane < 4:
        base = st * 4 * BN + lane * 16
        for h in kaio.static_range(2):
            kaio.tma_load_2d(kv_s, (base + h * BN, 0), tk, row, col + h * 64, bars, st)
            kaio.tma_load_2d(kv_s, (base + (2 + h) * BN, 0), tv, row, col + h * 64, bars, st)


@kaio.gpu_kernel(block_size=128)
def prefetch_stream(
    k: f16[:],
    v: f16[:],
    table: i32[:],
    out: f32[:],
    kv_heads: u32,
    length: u32,
    max_pages: u32,
    pages: u32,
    STAGES: kaio.constexpr,
    AHEAD: kaio.constexpr,
):
    """``head_stream`` over a paged cache (4 stages' worth of cp.async, the window) with
    an L2 prefetch of the pages AHEAD tiles past the newest copied: block (b, kvh) asks
    for the kvh-th 1/Hkv of each such page (4 KB contiguous at Hkv 8, D 128: two keys of
    every head) by cp.async.bulk.prefetch.L2, so the sequence's blocks together bring
    each page to L2 in whole runs before their 256-byte rows are read."""
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    bkv = kaio.block_idx_x()
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    BN = dk.BN
    kv_s = kaio.shared_dynamic(f16, (2 * STAGES * BN, 128), 0)
    pg = kaio.local(u32, (1, BN // 8))  # (load_stage: 8 rows a thread)
    win = kaio.local(u32, 3)
    n = length // BN
    PAGE = 16 * 128 * 8  # elements of a page (Hkv 8, D 128)
    dk.window_start(win, 0, b, table, max_pages, 4, lane)
    for j in kaio.static_range(STAGES - 1):
        dk.window_pages(pg, win, j * BN, b, table, max_pages, 4, tid, lane, 128)
        dk.load_stage(
            kv_s, j * 2 * BN, k, v, j * BN, length, b, kvh, pg, 0, length, kv_heads, 4,
            pages, tid, 128, True, f16,
        )  # fmt: skip
        kaio.cp_async_commit()
    ahead = kaio.local(u32, 1)
    pf = (STAGES - 1 + AHEAD) * (BN // 16)  # the first page prefetched in the loop
    ahead[0] = u32(table[b * max_pages + kaio.min(pf + tid % 4, max_pages - 1)])
    acc = 0.0
    for t in range(n):
        if t + STAGES - 1 < n:
            key0 = (t + STAGES - 1) * BN
            dk.window_pages(pg, win, key0, b, table, max_pages, 4, tid, lane, 128)
            dk.load_stage(
                kv_s, (t + STAGES - 1) % STAGES * 2 * BN, k, v, key0, length, b, kvh, pg, 0,
                length, kv_heads, 4, pages, tid, 128, True, f16,
            )  # fmt: skip
            if tid < 4:
                if pf + t * 4 + tid < max_pages:
                    at = kaio.min(ahead[0], pages - 1) * PAGE + kvh * (PAGE // 8)
                    kaio.prefetch_l2(k, at, 4096)
                    kaio.prefetch_l2(v, at, 4096)
                nxt = kaio.min(pf + (t + 1) * 4 + tid, max_pages - 1)
                ahead[0] = u32(table[b * max_pages + nxt])
        kaio.cp_async_commit()
        kaio.cp_async_wait(STAGES - 1)
        kaio.sync_threads()
        acc += f32(kv_s[t % STAGES * 2 * BN + tid % 64, tid // 64])
        kaio.sync_threads()
    kaio.cp_async_wait_all()
    out[bkv * 128 + tid] = acc


def tma_maps(k, v, paged):
    """The K and V tensor maps of ``tma_stream``: boxes of 16 rows x 64 columns, swizzled
    128 bytes, over the pool as [pages * 16, Hkv * D] or the cache as [B * Hkv * L, D]."""
    cols = k.shape[2] * k.shape[3] if paged else k.shape[3]
    return [kaio.tensor_map_2d(x.view(-1, cols), (16, 64), 128) for x in (k, v)]


M_CASES = ((16, 4096), (16, 32768), (64, 4096))


def m_jobs(b, length, sets, lens):
    """(name, call) of round m's kernels at one shape: the shipped kernel in both layouts,
    ``tma_stream`` and ``prefetch_stream``."""
    o = torch.empty(b * HKV * 128, device="cuda")
    maps = {id(s[0]): {True: tma_maps(s[3], s[4], True), False: tma_maps(s[1], s[2], False)}
            for s in sets}  # fmt: skip

    def tma(paged, st):
        def f(q, k, v, kc, vc, table):
            tk, tv = maps[id(q)][paged]
            tma_stream[b * HKV, 128, None, st * 4 * 64 * 128 + 8 * st](
                tk, tv, table.view(-1), o, HKV, length, length // 16, PAGED=paged, STAGES=st,
            )  # fmt: skip

        return f

    def pref(ahead, st=4):
        def f(q, k, v, kc, vc, table):
            prefetch_stream[b * HKV, 128, None, 2 * st * 64 * 128 * 2](
                kc.view(-1), vc.view(-1), table.view(-1), o, HKV, length, length // 16,
                kc.shape[0], STAGES=st, AHEAD=ahead,
            )  # fmt: skip

        return f

    return [
        ("kaio paged", run_kaio(lens)),
        ("kaio contiguous", run_kaio(lens, contiguous=True)),
        ("tma paged st4", tma(True, 4)),
        ("tma paged st6", tma(True, 6)),
        ("tma contiguous st4", tma(False, 4)),
        ("prefetch paged ahead2", pref(2)),
        ("prefetch paged ahead6", pref(6)),
        ("co", None),
    ]


def round_m(budget: float):
    """(dec, ninth pass) Copy floors over the shuffled pool against the contiguous cache:
    head_stream (cp.async, kaio's per-head grid), tma_stream (the same grid, TMA boxes of
    a page's 16 rows, STAGES 4 and 6) and prefetch_stream (head_stream with an L2 bulk
    prefetch of the pages 2 or 6 tiles ahead), beside the shipped kernel and SDPA; two
    passes, the second reversed; SDPA first and last."""
    for b, length, _, sets, lens, label in shapes(M_CASES, budget):
        jobs = m_jobs(b, length, sets, lens)
        for order in (jobs, jobs[::-1]):
            floor_jobs(b, length, label, sets, ((True, 4, 0), (False, 2, 0)))
            for name, fn in order:
                if name == "co":  # a sequence's K/V heads one cluster (co-located, no barrier)
                    floor_jobs(
                        b,
                        length,
                        label,
                        sets,
                        ((True, 4, 0, 2), (True, 3, 0), (True, 3, 0, 4), (True, 3, 0, 8)),
                    )
                    continue
                show(f"{label} {name}", kernel_times(fn, sets))
        sdpa_again(label, sets)


def warm_m():
    """What round m launches."""
    out = warm_k()[:1]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged), "CL": 1}
        c |= {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "SWAP": 1}
        st = decode.one_split_stages(128, 1, paged)
        own = decode.owns(1, paged, True)
        out.append((decode.DECODE, {**c, "STAGES": st, "OWN": own,
                                    "SYNC1": decode.stage_syncs(st, own)}))  # fmt: skip
        c3 = {**c, "STAGES": 3, "OWN": 0, "SYNC1": decode.stage_syncs(3)}
        out.append((decode.DECODE, c3))

        out.append((tma_stream, {"PAGED": paged, "STAGES": 4}))
    out.append((tma_stream, {"PAGED": True, "STAGES": 6}))
    for ahead in (2, 6):
        out.append((prefetch_stream, {"STAGES": 4, "AHEAD": ahead}))
    for paged, st, co in ((True, 4, 0), (False, 2, 0), (True, 4, 2), (True, 3, 0), (True, 3, 4),
                          (True, 3, 8)):  # fmt: skip
        out.append((head_stream, {"PAGED": paged, "STAGES": st, "DP": 128, "LOCK": 0,
                                  "TOUCH": 0, "CO": co}))  # fmt: skip
    return out


def variants_round(cases, variants: dict, budget: float):
    """kaio under each of ``variants`` (name -> force()'s settings) against the shipped
    defaults at ``cases``, both layouts, each variant checked against f32 SDPA first; two
    passes, the second reversed; SDPA first and last."""
    variants = {"shipped": {}, **variants}
    for _, _, _, sets, lens, label in shapes(cases, budget):
        for name, cfg in list(variants.items())[1:]:
            for contiguous in (False, True):
                err = check(sets, lens, contiguous=contiguous, **cfg)
                print(f"{label} {name} contiguous={contiguous} rel err {err:.1e}", flush=True)
        jobs = [
            (f"{'contiguous' if c else 'paged'} {name}", run_kaio(lens, contiguous=c, **cfg))
            for name, cfg in variants.items()
            for c in (False, True)
        ]
        both_passes(label, jobs, sets)


def round_o(budget: float):
    """(dec, ninth pass) each warp on its own keys (OWN) in every grid, at B = 1 (clusters
    of 8, or 16 splits through the fused merge over a paged cache at 32k keys)."""
    variants_round(((1, 4096), (1, 32768), (1, 1024)), {"own": {"own": True}}, budget)


def warm_o():
    """What round o launches: B = 1's grids (clusters of 8 and, for the residency query,
    of 16; paged at 32k keys 16 splits through the fused merge; 4 stages) with OWN 0 and
    1."""
    out = warm_k()[:1]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged), "SWAP": 1}
        c |= {"DIRECT": False, "STAGES": 4, "SPEC": 0, "SYNC1": 0}
        grids = [{"FUSED": False, "CL": n} for n in (8, 16)]
        grids += [{"FUSED": True, "CL": 1}] if paged else []
        for grid in grids:
            for own in (0, 1):
                out.append((decode.DECODE, {**c, **grid, "OWN": own}))
    return out


def round_p2(budget: float):
    """(dec, ninth pass) the cluster-merge grids with OWN against them without, at B = 1,
    2, 4 and 8 (round D: OWN in every cluster grid, since routed only for splits of at
    most decode.OWN_CLUSTER_TILES key tiles)."""
    cases = ((1, 1024), (4, 4096), (1, 4096), (8, 1024), (2, 8192))
    variants_round(cases, {"no own in clusters": {"own_tiles": 0}}, budget)


def warm_p2():
    """What round p2 launches: the cluster-merge grids (clusters of 2, 4, 8 and, for the
    residency query, 16; 4 stages) with OWN 0 and 1, both layouts."""
    out = warm_k()[:1]
    for paged in (False, True):
        c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged), "SWAP": 1}
        c |= {"DIRECT": False, "FUSED": False, "STAGES": 4, "SPEC": 0, "SYNC1": 0}
        for cl in (8, 4, 2, 16):
            for own in (1, 0):
                out.append((decode.DECODE, {**c, "CL": cl, "OWN": own}))
    return out


def walk_tables(table, kv_heads, splits=1, interleave=False):
    """Block tables that make head_stream's (sequence, K/V head) blocks walk the pool
    differently, over the same pool memory (a floor reads bytes, not values): ``table``
    [B, P] (one row a sequence, P pages) as rows of ``splits`` splits a sequence, each a
    sequence of its own reading P / splits pages (the halves of the row, or with
    ``interleave`` every splits-th run of 4 pages, a key tile's)."""
    b, p = table.shape
    if splits == 1:
        return table
    if interleave:  # split s takes tiles s, s + splits, ... (runs of 4 pages)
        t = table.reshape(b, p // (4 * splits), splits, 4).permute(0, 2, 1, 3)
        return t.reshape(b * splits, p // splits).contiguous()
    return table.reshape(b * splits, p // splits).contiguous()


def head_tables(table, kv_heads, shuffle=False):
    """A table [B * Hkv, P] of the pool seen as Hkv times as many pages of one head
    ([pages * Hkv, 16, 1, D], "HND": each (page, head) 16 contiguous rows, 4 KB at D 128):
    head h of page x is sub-page x * Hkv + h, so block (b, h) reads its 16 keys of a page
    as one 4 KB run at the suite's page order; ``shuffle``: every (page, head) placed at
    random on its own (4 KB pieces, no two heads of a token together)."""
    b, p = table.shape
    sub = table[:, None, :] * kv_heads + torch.arange(kv_heads, device="cuda")[None, :, None]
    if shuffle:
        n = b * kv_heads * p
        gen = torch.Generator(device="cuda").manual_seed(n + 1)
        return torch.randperm(n, device="cuda", generator=gen).to(torch.int32).reshape(-1, p)
    return sub.reshape(b * kv_heads, p).to(torch.int32).contiguous()


def walk_floor(b, length, kc, vc, table, kv_heads, stages=4, dp=128, rows=None):
    """head_stream over a paged pool with ``table`` [rows, pages a row]: rows * kv_heads
    blocks, each a (row, head) walking its row of the table, ``length`` keys."""
    rows = table.shape[0]
    o = torch.empty(rows * kv_heads * 128, device="cuda")
    pages = kc.numel() // (16 * kv_heads * dp)
    n = table.shape[1] * 16
    t = table.reshape(-1)

    def floor(*_):
        head_stream[rows * kv_heads, 128, None, 2 * stages * 64 * dp * 2](
            kc.view(-1), vc.view(-1), t, o, kv_heads, n, table.shape[1], pages,
            PAGED=True, STAGES=stages, DP=dp, LOCK=0, TOUCH=0, CO=0,
        )  # fmt: skip

    return floor


def whole_page_floor(b, length, kc, vc, table, stages=2, nt=256):
    """page_stream (a block a key split and sequence reading whole 32 KB pages, all K/V
    heads) over ``table``, the splits filling 128 blocks."""
    splits = max(1, 128 // b)
    per = -(-length // (16 * splits)) * 16
    o = torch.empty(b * splits * nt, device="cuda")
    t = table.reshape(-1)

    def floor(*_):
        page_stream[(splits, b), nt, None, stages * 2 * HKV * 16 * 128 * 2](
            kc.view(-1), vc.view(-1), t, o, length, length // 16, per, kc.shape[0],
            NT=nt, STAGES=stages, HKV=HKV,
        )  # fmt: skip

    return floor


Y_CASES = ((16, 32768), (16, 4096), (64, 4096))


def round_y(budget: float):
    """(dec, tenth pass, round A) The DRAM side of the shuffled walk: head_stream floors
    over one pool (the suite's shuffled pages) read as NHD per head (the shipped copies),
    in each sequence's ascending order, in order, as HND 4 KB runs of a head (the same page
    order), as 4 KB pieces each placed at random, with 2 splits a (sequence, head) (halves
    or interleaved tiles, 2 stages: two blocks a multiprocessor) and with two heads a
    block (512 bytes a token) in 2 splits; the shipped kernel, SDPA first and last; two
    passes, the second reversed (kernel times)."""
    for b, length, _, sets, lens, label in shapes(Y_CASES, budget):
        q, k, v, kc, vc, table = sets[0]
        one = [sets[0]]
        p = table.shape[1]
        order = torch.arange(table.numel(), device="cuda", dtype=torch.int32).reshape(b, p)
        srt = table.sort(dim=1).values.contiguous()
        kaio_sorted = run_kaio(lens)
        err = check([(q, k, v, kc, vc, srt)], lens)
        print(f"{label} kaio paged, host-sorted table rel err {err:.1e}", flush=True)
        sorts = (256, 2048) if length >= 32768 else (256,)
        for n in sorts:
            err = check(one, lens, sort=n)
            print(f"{label} kaio paged SORT {n} rel err {err:.1e}", flush=True)
        jobs = [
            ("kaio paged (shipped)", run_kaio(lens)),
            *((f"kaio paged SORT {n}", run_kaio(lens, sort=n)) for n in sorts),
            ("kaio paged, host-sorted table", lambda *a, f=kaio_sorted, t=srt: f(*a[:5], t)),
            ("kaio contiguous (shipped)", run_kaio_contig(lens)),
            ("floor NHD shuffled st4", walk_floor(b, length, kc, vc, table, HKV)),
            ("floor NHD shuffled st3", walk_floor(b, length, kc, vc, table, HKV, 3)),
            ("floor NHD host-sorted st4", walk_floor(b, length, kc, vc, srt, HKV)),
            ("floor NHD in order st4", walk_floor(b, length, kc, vc, order, HKV)),
            ("floor HND shuffled st4", walk_floor(b, length, kc, vc, head_tables(table, HKV), 1)),
            ("floor 4KB random st4",
             walk_floor(b, length, kc, vc, head_tables(table, HKV, True), 1)),
            ("floor NHD 2 splits halves st2",
             walk_floor(b, length, kc, vc, walk_tables(table, HKV, 2), HKV, 2)),
            ("floor NHD 2 splits interleaved st2",
             walk_floor(b, length, kc, vc, walk_tables(table, HKV, 2, True), HKV, 2)),
            ("floor 2 heads a block, 2 splits st3",
             walk_floor(b, length, kc, vc, walk_tables(table, HKV, 2), HKV // 2, 3, 256)),
            ("floor whole pages shuffled st2", whole_page_floor(b, length, kc, vc, table)),
            ("floor whole pages shuffled st3", whole_page_floor(b, length, kc, vc, table, 3)),
            ("floor whole pages host-sorted st2", whole_page_floor(b, length, kc, vc, srt)),
            ("floor whole pages in order st2", whole_page_floor(b, length, kc, vc, order)),
        ]  # fmt: skip
        floor_jobs(b, length, label, sets, ((False, 2, 0),))
        both_passes(label, jobs, sets, inputs=one)


def warm_y():
    """What round y launches: round m's kernels and the floors' head_stream variants."""
    out = [x for x in warm_m() if x[0] is not head_stream or x[1]["CO"] == 0]
    out = [x for x in out if x[0] in (probe_mark, decode.DECODE, head_stream)]
    for st, dp in ((2, 128), (3, 256)):
        out.append((head_stream, {"PAGED": True, "STAGES": st, "DP": dp, "LOCK": 0,
                                  "TOUCH": 0, "CO": 0}))  # fmt: skip
    out += [(page_stream, {"NT": 256, "STAGES": st, "HKV": HKV}) for st in (2, 3)]
    paged = [c for k, c in out if k is decode.DECODE and c["PAGED"]]
    out += [(decode.DECODE, {**c, "SORT": 256}) for c in paged]
    out += [(decode.DECODE, {**c, "SORT": 2048}) for c in paged if c["OWN"]]
    return [(k, {"SORT": 0, **c}) if k is decode.DECODE else (k, c) for k, c in out]


Z_CASES = ((16, 4096, (256,)), (64, 4096, (256,)), (16, 1024, (128,)), (64, 1024, (128,)),
           (16, 32768, (256, 512, 1024)))  # fmt: skip


def round_z(budget: float):
    """(dec, tenth pass, round B) SORT (one split over a paged cache: the table slots after
    the first copies visited in pool order) of each size against the shipped kernel, each
    checked against f32 SDPA first; B16 L4096 also with ragged lengths (L/4 .. L); two
    passes, the second reversed; SDPA first and last (kernel times)."""
    for b, length, rest, sets, lens, label in shapes(Z_CASES, budget):
        for n in rest[0]:
            print(f"{label} SORT {n} rel err {check(sets, lens, sort=n):.1e}", flush=True)
        jobs = [("paged shipped", run_kaio(lens))]
        jobs += [(f"paged SORT {n}", run_kaio(lens, sort=n)) for n in rest[0]]
        if length == 4096 and b == 16:
            gen = torch.Generator(device="cuda").manual_seed(b)
            rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
            rl = rl.to(torch.int32)
            print(f"{label} ragged SORT rel err {check(sets, rl, sort=256):.1e}", flush=True)
            jobs += [
                ("ragged paged shipped", run_kaio(rl)),
                ("ragged SORT 256", run_kaio(rl, sort=256)),
            ]
        both_passes(label, jobs, sets)


def warm_z():
    """What round z launches: the shipped paged one-split kernels (4 stages OWN, 3 stages
    SYNC1) without and with each SORT size."""
    out = [(probe_mark, {})]
    c = {"DP": 128, "MT": 1, "PAGED": True, "DT": f16, "PW": 1, "CL": 1, "DIRECT": True}
    c |= {"FUSED": False, "SPEC": 1, "SWAP": 1}
    for st, own, sizes in ((4, 1, (0, 128, 256, 512, 1024)), (3, 0, (0, 128, 256))):
        for n in sizes:
            out.append(
                (decode.DECODE, {**c, "STAGES": st, "OWN": own, "SYNC1": 1 - own, "SORT": n})
            )
    return out


def round_z2(budget: float):
    """(dec, tenth pass, round C) the routed SORT (``decode.sorts``) against it off, B64
    also with OWN, B16 L4096 also with ragged lengths (L/4 .. L); each checked against f32
    SDPA first; two passes, the second reversed; SDPA first and last (kernel times)."""
    cases = ((16, 4096), (64, 4096), (16, 32768))
    for b, length, _, sets, lens, label in shapes(cases, budget):
        q, k, v, kc, vc, table = sets[0]
        n = decode.sorts(True, 1, table.shape[1], 16)
        print(f"{label} routed SORT {n}", flush=True)
        jobs = [("paged shipped", run_kaio(lens)), ("paged SORT off", run_kaio(lens, sort=0))]
        if b == 64:
            print(f"{label} SORT+OWN rel err {check(sets, lens, own=True):.1e}", flush=True)
            jobs.append(("paged SORT + OWN", run_kaio(lens, own=True)))
        if b == 16 and length == 4096:
            gen = torch.Generator(device="cuda").manual_seed(b)
            rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
            rl = rl.to(torch.int32)
            print(f"{label} ragged rel err {check(sets, rl):.1e}", flush=True)
            jobs += [("ragged shipped", run_kaio(rl)), ("ragged SORT off", run_kaio(rl, sort=0))]
        both_passes(label, jobs, sets)


def warm_z2():
    """What round z2 launches: round z's kernels at the routed sizes, OWN at 3 stages."""
    out = [x for x in warm_z() if x[1].get("SORT", 0) in (0, 256)]
    c = {"DP": 128, "MT": 1, "PAGED": True, "DT": f16, "PW": 1, "CL": 1, "DIRECT": True}
    c |= {"FUSED": False, "SPEC": 1, "SWAP": 1, "STAGES": 3, "OWN": 1, "SYNC1": 0}
    out += [(decode.DECODE, {**c, "SORT": 256})]
    c["STAGES"] = 4
    out += [(decode.DECODE, {**c, "SORT": 1024})]
    return out


def round_z3(budget: float):
    """(dec, tenth pass, round D) the routed SORT (``decode.sorts``: up to 256 slots)
    against it off at 2k keys (128 pages: the smallest table it takes) and 32k keys (the
    first 256 of 2048 slots); each checked against f32 SDPA first; two passes, the second
    reversed; SDPA first and last (kernel times). PROBE_CASES="64x32768,..." runs only
    those shapes."""
    cases = ((16, 2048), (64, 2048), (16, 32768))
    if os.environ.get("PROBE_CASES"):
        cases = [tuple(int(n) for n in c.split("x")) for c in os.environ["PROBE_CASES"].split(",")]
    for _, _, _, sets, lens, label in shapes(cases, budget):
        n = decode.sorts(True, 1, sets[0][5].shape[1], 16)
        print(f"{label} routed SORT {n}", flush=True)
        jobs = [("paged shipped", run_kaio(lens)), ("paged SORT off", run_kaio(lens, sort=0))]
        both_passes(label, jobs, sets)


def sdpa_grids(sets, label):
    """The kernels torch SDPA's default launches for the decode step on the contiguous
    cache: median time, grid, block, registers and shared memory (the profiler's trace)."""
    import json
    import tempfile

    q, k, v = sets[0][:3]
    for _ in range(3):
        sdpa(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(6):
            sdpa(*sets[i % len(sets)][:3], enable_gqa=True)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    seen = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel":
            a = e.get("args", {})
            key = (e["name"][:90], str(a.get("grid")), str(a.get("block")),
                   a.get("registers per thread"), a.get("shared memory"))  # fmt: skip
            seen[key].append(e["dur"])
    for (name, grid, block, regs, smem), durs in seen.items():
        print(f"{label} SDPA kernel x{len(durs)} {statistics.median(durs):.2f} us grid {grid} "
              f"block {block} regs {regs} smem {smem}: {name}", flush=True)  # fmt: skip


W64_CASES = ((64, 4096), (64, 1024), (64, 32768), (16, 32768))
W64_VARIANTS = {  # name: force()'s settings
    "paged SORT off": {"sort": 0},
    "paged 2 stages": {"stages": 2},
    "paged 4 stages": {"stages": 4},
    "paged 4 stages OWN": {"stages": 4, "own": True},
}


def round_w64(budget: float):
    """(dec, eleventh pass, round A) B = 64 paged (one split, two waves of blocks): the
    shipped kernel (3 stages, two blocks a multiprocessor; SORT at 2k-4k keys) against 2
    stages (three a multiprocessor), 4 (one) with and without OWN, SORT off; B64 L32768
    and B16 L32768 the shipped kernel only; every case also contiguous; SDPA's kernels
    listed; each variant checked against f32 SDPA first; two passes, the second reversed;
    SDPA first and last. (Round A also timed NEXT, commit 478b305: each block's last tiles
    bringing the table row, query rows and first key tiles of the block that takes its
    place into L2; slower, removed.)"""
    for b, length, _, sets, lens, label in shapes(W64_CASES, budget):
        sdpa_grids(sets, label)
        print(f"{label} routed SORT {decode.sorts(True, 1, sets[0][5].shape[1], 16)}")
        jobs = [("paged shipped", run_kaio(lens)), ("contiguous shipped", run_kaio_contig(lens))]
        if b == 64 and length < 32768:
            for name, cfg in W64_VARIANTS.items():
                print(f"{label} {name} rel err {check(sets, lens, **cfg):.1e}", flush=True)
                jobs.append((name, run_kaio(lens, **cfg)))
        both_passes(label, jobs, sets, n=12 if length > 8192 else 24)


def one_split(stages: int, own: int = 0, sort: int = 0, paged: bool = True) -> dict:
    """decode_fwd's constexprs for a one-split grid at D 128, f16, 4 query rows a group."""
    c = {"DP": 128, "MT": 1, "PAGED": paged, "DT": f16, "PW": int(paged), "CL": 1}
    c |= {"DIRECT": True, "FUSED": False, "SPEC": decode.speculates(paged), "SWAP": 1}
    c |= {"STAGES": stages, "OWN": own, "SYNC1": decode.stage_syncs(stages, own)}
    return c | {"SORT": sort}


def warm_w64():
    """What round w64 launches: the one-split paged kernels at 2, 3 and 4 stages (4 also
    with OWN), with SORT 256 and without; the contiguous ones at 3 and 2 stages."""
    out = [(probe_mark, {})]
    for st, own in ((3, 0), (2, 0), (4, 0), (4, 1)):
        out += [(decode.DECODE, one_split(st, own, n)) for n in (256, 0)]
    return out + [(decode.DECODE, one_split(st, paged=False)) for st in (3, 2)]


def folded_tables(table, fold: int, sort: bool = True):
    """Block tables of ``fold`` sequences walked as one: row i the pages of sequences
    i * fold .. i * fold + fold - 1 (``table`` [B, P] -> [B / fold, fold P]), in ascending
    pool order with ``sort`` (the union's pages then lie fold times closer)."""
    b, p = table.shape
    t = table.reshape(b // fold, fold * p)
    return (t.sort(dim=1).values if sort else t).contiguous()


PF_CASES = ((64, 4096), (64, 32768))


def round_pf(budget: float):
    """(dec, eleventh pass, round B) Floors (head_stream: kaio's copies, no arithmetic) of
    walks that fold 2 or 4 sequences of a K/V head into one block (the union of their
    pages in pool order: fewer blocks, one wave, neighbouring pages fold times closer)
    against the kernel's own walk (a block a sequence and head, shuffled or sorted, 3
    stages: two blocks a multiprocessor) and the pool in order; the shipped kernel,
    contiguous, SORT over more slots at 32k keys; SDPA first and last; two passes, the
    second reversed."""
    for b, length, _, sets, lens, label in shapes(PF_CASES, budget):
        q, k, v, kc, vc, table = sets[0]
        one = [sets[0]]
        order = torch.arange(table.numel(), device="cuda", dtype=torch.int32)
        order = order.reshape(table.shape)
        sorts = (1024, 2048) if length >= 32768 else ()
        for n in sorts:
            print(f"{label} paged SORT {n} rel err {check(sets, lens, sort=n):.1e}", flush=True)
        jobs = [
            ("kaio paged shipped", run_kaio(lens)),
            ("kaio contiguous shipped", run_kaio_contig(lens)),
            *((f"kaio paged SORT {n}", run_kaio(lens, sort=n)) for n in sorts),
            ("floor per head shuffled st3", walk_floor(b, length, kc, vc, table, HKV, 3)),
            ("floor per head sorted st3",
             walk_floor(b, length, kc, vc, folded_tables(table, 1), HKV, 3)),
            ("floor per head in order st3", walk_floor(b, length, kc, vc, order, HKV, 3)),
            ("floor pairs shuffled st3",
             walk_floor(b, length, kc, vc, folded_tables(table, 2, False), HKV, 3)),
            ("floor pairs sorted st3",
             walk_floor(b, length, kc, vc, folded_tables(table, 2), HKV, 3)),
            ("floor pairs sorted st4",
             walk_floor(b, length, kc, vc, folded_tables(table, 2), HKV, 4)),
            ("floor quads sorted st4",
             walk_floor(b, length, kc, vc, folded_tables(table, 4), HKV, 4)),
        ]  # fmt: skip
        both_passes(label, jobs, sets, inputs=one, n=12 if length > 8192 else 24)


def warm_pf():
    """What round pf launches: head_stream paged at 3 and 4 stages, the B64 kernels (SORT
    0, 256, 1024, 2048), the contiguous one."""
    out = [(probe_mark, {}), (decode.DECODE, one_split(3, paged=False))]
    out += [(decode.DECODE, one_split(3, sort=n)) for n in (256, 0, 1024, 2048)]
    flags = {"PAGED": True, "DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0}
    return out + [(head_stream, {**flags, "STAGES": st}) for st in (3, 4)]


FOLD_CASES = ((64, 4096), (64, 1024), (64, 2048), (64, 8192))
FOLD_VARIANTS = {"fold 2": {"fold": 2, "pair": 0}, "fold 2 pairs": {"fold": 2, "pair": 256}}


def round_fold(budget: float):
    """(dec, eleventh pass, rounds C and D) ``decode_folded`` (2 sequences a block, the
    union of their pages in pool order: 256 blocks at B64, one wave; sequences 2p and 2p +
    1, or with "pairs" the p-th longest and the p-th shortest) against the shipped kernel
    (a block a sequence and head: 512 blocks, two waves) over the suite's shuffled pool,
    uniform and ragged (L/4 .. L) lengths; the contiguous kernel; each checked against f32
    SDPA first; two passes, the second reversed; SDPA first and last. (Round C also timed 4
    sequences a block, 16 query rows in M: slower at every length.)"""
    for b, length, _, sets, lens, label in shapes(FOLD_CASES, budget):
        gen = torch.Generator(device="cuda").manual_seed(b)
        rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
        rl = rl.to(torch.int32)
        jobs = [("paged shipped", run_kaio(lens)), ("contiguous shipped", run_kaio_contig(lens))]
        if decode.FOLD_SEQS:  # (routed: against it off)
            jobs.append(("paged fold off", run_kaio(lens, fold=0)))
            jobs.append(("ragged fold off", run_kaio(rl, fold=0)))
        jobs.append(("ragged shipped", run_kaio(rl)))
        for name, cfg in FOLD_VARIANTS.items():
            print(f"{label} {name} rel err {check(sets, lens, **cfg):.1e}", flush=True)
            print(f"{label} ragged {name} rel err {check(sets, rl, **cfg):.1e}", flush=True)
            jobs += [
                (f"paged {name}", run_kaio(lens, **cfg)),
                (f"ragged {name}", run_kaio(rl, **cfg)),
            ]
        both_passes(label, jobs, sets)


def warm_fold():
    """What round fold launches: decode_folded (2 sequences a block at 3 stages, 128 to
    1024 slots, paired by length or not), the B64 kernels (SORT 0, 128, 256), the
    contiguous one."""
    out = [(probe_mark, {}), (decode.DECODE, one_split(3, paged=False))]
    out += [(decode.DECODE, one_split(3, sort=n)) for n in (256, 128, 0)]
    for pair in (64, 0):
        for n in (512, 128, 256, 1024):
            c = {"STAGES": 3, "FOLD": 2, "SORT": n, "PAIR": pair, "DP": 128, "DT": f16}
            out.append((decode.FOLDED, {**c, "SPEC": decode.FOLD_SPEC}))
    return out


PC_CASES = ((16, 32768), (64, 32768))


def with_partials(floor, chunks: int, rows: int):
    """A job's call: ``floor`` (a walk of the pool in chunks) and then what the pool-chunk
    kernel's partial results would cost: ``chunks`` partials of ``rows`` query rows (every
    sequence a chunk meets: (m, l, O) a row, D + 2 f32) written, then read once by a merge
    (torch's fill and sum: the bytes, not the arithmetic)."""
    part = torch.empty(chunks, rows * (D + 2), device="cuda")

    def f(*a):
        floor(*a)
        part.fill_(1.0)
        return part.sum(0)

    return f


def round_pc(budget: float):
    """(dec, twelfth pass, round A) The floor of blocks taking contiguous chunks of the page
    pool (not of a sequence): a block walking a run of pool pages in pool order reads as
    the pool in order does (head_stream per K/V head, or page_stream's whole pages, over
    the identity table: block (b, h) reads pool pages b * P .. b * P + P - 1); over the
    suite's shuffled pool each chunk meets every sequence, so each block leaves a partial
    (m, l, O) per sequence it meets, merged after (``with_partials``: their bytes written
    and read). Against the kernel's own walk (shuffled), the shipped kernels and SDPA;
    B16 L32768's shipped 4 stages (OWN, one block a multiprocessor) against 2 and 3. Two
    passes, the second reversed; SDPA first and last."""
    for b, length, _, sets, lens, label in shapes(PC_CASES, budget):
        q, k, v, kc, vc, table = sets[0]
        one = [sets[0]]
        order = torch.arange(table.numel(), device="cuda", dtype=torch.int32)
        order = order.reshape(table.shape)
        head_chunks = walk_floor(b, length, kc, vc, order, HKV, 3)
        page_chunks = whole_page_floor(b, length, kc, vc, order)
        page_blocks = max(1, 128 // b) * b
        jobs = [
            ("kaio paged shipped", run_kaio(lens)),
            ("kaio contiguous shipped", run_kaio_contig(lens)),
            ("floor per head shuffled st3", walk_floor(b, length, kc, vc, table, HKV, 3)),
            ("floor per head pool chunks st3", head_chunks),
            ("floor whole pages pool chunks st2", page_chunks),
            ("floor per head pool chunks + partials",
             with_partials(head_chunks, b * HKV, b * (H // HKV))),
            ("floor whole pages pool chunks + partials",
             with_partials(page_chunks, page_blocks, b * H)),
        ]  # fmt: skip
        if b == 16 and length == 32768:
            for st in (2, 3):
                print(f"{label} paged {st} stages rel err "
                      f"{check(sets, lens, stages=st):.1e}", flush=True)  # fmt: skip
                jobs.append((f"kaio paged {st} stages", run_kaio(lens, stages=st)))
        both_passes(label, jobs, sets, inputs=one, n=12 if length > 8192 else 24)


def warm_pc():
    """What round pc launches: the shipped kernels of its shapes (B16 L32768 paged: 4
    stages with OWN, also 2 and 3; B64 L32768: 3 stages), the contiguous ones (2 and 3
    stages), head_stream at 3 stages, page_stream at 2."""
    out = [(probe_mark, {})]
    out += [(decode.DECODE, one_split(st, own=1)) for st in (4, 2, 3)]
    out += [(decode.DECODE, one_split(3)), (decode.DECODE, one_split(3, paged=False))]
    out.append((decode.DECODE, one_split(2, paged=False)))
    flags = {"PAGED": True, "DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0}
    out.append((head_stream, {**flags, "STAGES": 3}))
    return out + [(page_stream, {"NT": 256, "STAGES": 2, "HKV": HKV})]


FS_CASES = ((64, 4096), (64, 8192), (64, 2048))
FS_FLOORS = True


def round_fs(budget: float):
    """(dec, twelfth pass, rounds A and B) ``decode_folded``'s SPEC (each sequence's first
    tile copied before the sort, the sort under those copies) against it off (main's
    folded kernel: the same PTX) and against decode_fwd (fold off), uniform and ragged
    (L/4 .. L) lengths over the suite's shuffled pool; the contiguous kernel; each
    checked against f32 SDPA first; two passes, the second reversed; SDPA first and
    last. Round B also the floors of the two walks (head_stream over each sequence's
    table sorted, and over the pairs' union sorted: ``folded_tables``) and of a
    persistent per-head grid of two (sequence, head) items a block (``items_stream``,
    against one item a block), on the first set's pool."""
    for b, length, _, sets, lens, label in shapes(FS_CASES, budget):
        gen = torch.Generator(device="cuda").manual_seed(b)
        rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
        rl = rl.to(torch.int32)
        for spec in (1, 0):
            for name, ls in (("", lens), ("ragged ", rl)):
                err = check(sets, ls, fold_spec=spec)
                print(f"{label} {name}fold SPEC {spec} rel err {err:.1e}", flush=True)
        jobs = [
            ("paged SPEC", run_kaio(lens, fold_spec=1)),
            ("paged SPEC off", run_kaio(lens, fold_spec=0)),
            ("paged fold off", run_kaio(lens, fold=0)),
            ("ragged SPEC", run_kaio(rl, fold_spec=1)),
            ("ragged SPEC off", run_kaio(rl, fold_spec=0)),
            ("ragged fold off", run_kaio(rl, fold=0)),
            ("contiguous shipped", run_kaio_contig(lens)),
        ]
        if FS_FLOORS:  # (round B on: the walks' floors, on the first set's pool)
            kc, vc, table = sets[0][3:]
            jobs += [
                ("floor per head sorted st3",
                 walk_floor(b, length, kc, vc, folded_tables(table, 1), HKV, 3)),
                ("floor pairs sorted st3",
                 walk_floor(b, length, kc, vc, folded_tables(table, 2), HKV, 3)),
                ("floor items 1 sorted st3",
                 items_floor(b, length, kc, vc, folded_tables(table, 1), 1)),
                ("floor items 2 sorted st3",
                 items_floor(b, length, kc, vc, folded_tables(table, 1), 2)),
            ]  # fmt: skip
        both_passes(label, jobs, sets)


def warm_fs():
    """What round fs launches: decode_folded (3 stages, PAIR 64, 256 to 1024 slots) with
    SPEC and without, decode_fwd's B64 kernels (SORT 128, 256, 0), the contiguous one."""
    out = [(probe_mark, {}), (decode.DECODE, one_split(3, paged=False))]
    out += [(decode.DECODE, one_split(3, sort=n)) for n in (256, 128, 0)]
    for spec in (1, 0):
        for n in (512, 256, 1024):
            c = {"STAGES": 3, "FOLD": 2, "SORT": n, "PAIR": 64, "DP": 128, "DT": f16}
            out.append((decode.FOLDED, {**c, "SPEC": spec}))
    flags = {"PAGED": True, "DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0}
    out += [(items_stream, {"STAGES": 3, "ITEMS": n}) for n in (1, 2)]
    return out + [(head_stream, {**flags, "STAGES": 3})]


def unique(kernels: list) -> list:
    """``kernels`` (a warm list) without repeats."""
    seen = set()
    out = []
    for kernel, c in kernels:
        key = (kernel.pyfunc.__module__, kernel.pyfunc.__name__, tuple(sorted(c.items(), key=str)))
        if key not in seen:
            seen.add(key)
            out.append((kernel, c))
    return out


@kaio.gpu_kernel(block_size=128)
def idle_blocks(out: f32[:], SHARED: kaio.constexpr):
    """A kernel that does nothing but start its blocks (each asks for SHARED bytes of
    dynamic shared memory, one value written a block): the graph's launch and block
    start-up alone."""
    buf = kaio.shared_dynamic(f32, (SHARED // 4,), 0)
    if kaio.thread_idx_x() == 0:
        buf[0] = 1.0
        out[kaio.block_idx_x()] = buf[0]


def graph_of(fn):
    """``fn()`` captured once in a CUDA graph (after a warm call on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_graphs(label, kind, graphs, sets, events):
    """Each graph's event-to-event median (``events``), its replays' kernel time (row
    ``{label} {name} {kind}``), then the event medians again in reverse order, so that a
    drift of the host or the clocks shows as a difference between the two passes."""
    for name, graph in graphs.items():
        print(f"{label} {name} event to event {events(graph):.2f} us", flush=True)
    for name, graph in graphs.items():
        show(f"{label} {name} {kind}", kernel_times(lambda *_, g=graph: g.replay(), sets))
    flush()
    for name, graph in list(graphs.items())[::-1]:
        print(f"{label} {name} event to event {events(graph):.2f} us", flush=True)


def event_median(graph, n=30, spin_s=0.0):
    """Median µs from event to event around each of n replays of ``graph`` (as
    bench/decode.py's suite times a call); with ``spin_s``, queued behind a GPU spin of that
    many seconds as bench/harness.py times a call (the host never makes the GPU wait)."""
    for _ in range(3):
        graph.replay()
    if spin_s:
        torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    if spin_s:
        torch.cuda._sleep(int(spin_s * 2e9))
    for a, z in zip(starts, ends, strict=True):
        a.record()
        graph.replay()
        z.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(a.elapsed_time(z) for a, z in zip(starts, ends, strict=True))


IDLE_SHARED = (16, 105 << 10, 86 << 10)


def gap_graphs(q, k, v, kc, vc, table, lens) -> dict:
    """{name: CUDA graph}: kaio's routed decode step over the paged cache, SDPA's default on
    the contiguous one, and ``idle_blocks`` grids (256 blocks with 0 or 105 KB of dynamic
    shared memory, 512 with 86 KB: SDPA's grid and shared memory)."""
    o = torch.empty(1024, device="cuda")
    idle = {"idle 256 blocks, 0 KB": (256, 16), "idle 256 blocks, 105 KB": (256, 105 << 10)}
    idle["idle 512 blocks, 86 KB"] = (512, 86 << 10)
    graphs = {
        "kaio paged (route)": graph_of(lambda: decode._decode("g", q, kc, vc, lens, table, None)),
        "SDPA default": graph_of(lambda: sdpa(q, k, v, enable_gqa=True)),
    }
    for name, (blocks, nbytes) in idle.items():
        launch = idle_blocks[blocks, 128, None, nbytes]
        graphs[name] = graph_of(lambda f=launch, n=nbytes: f(o, SHARED=n))
    return graphs


def round_gg(budget: float):
    """(dec, twelfth pass, round D) What a CUDA graph's replay adds to the kernel time (the
    suite's events against the profiler's kernel time) at B64 L4096 paged: kaio's routed
    decode step against SDPA's, and kernels that only start their blocks
    (``gap_graphs``): each graph's event median, its kernel time, the event median again
    in reverse order. (``budget`` unused: one shape.)"""
    print(torch.cuda.get_device_name(), flush=True)
    sets = make_sets(64, 4096, paged=True)
    lens = torch.full((64,), 4096, device="cuda", dtype=torch.int32)
    print(f"B64 L4096 paged rel err {check(sets, lens):.1e}", flush=True)
    time_graphs("B64 L4096", "kernel", gap_graphs(*sets[0], lens), sets, event_median)


def warm_gg():
    """What round gg launches: the routed B64 L4096 paged kernel (decode_folded, SPEC, 512
    slots, PAIR 64) and ``idle_blocks``."""
    c = {"STAGES": 3, "FOLD": 2, "SORT": 512, "PAIR": 64, "DP": 128, "DT": f16}
    out = [(probe_mark, {}), (decode.FOLDED, {**c, "SPEC": decode.FOLD_SPEC})]
    return out + [(idle_blocks, {"SHARED": n}) for n in IDLE_SHARED]


_FB_LOOP = "        if i + STAGES - 1 < count:  # into the stage tile i - 1 used\n"
_FB_NOTE = "        # this warp's 16 keys: one page, of sequence seq from position key0 on\n"
FB_EDITS = {  # decode_folded with two barriers a tile: the copies before the wait (3 in flight)
    "        kaio.cp_async_wait(STAGES - 2)  # tile i has landed\n"
    "        kaio.sync_threads()  # (and every warp is past tile i - 1)\n" + _FB_LOOP: (
        "        kaio.sync_threads()  # every warp is past tile i - 1\n" + _FB_LOOP
    ),
    "        kaio.cp_async_commit()\n" + _FB_NOTE: (
        "        kaio.cp_async_commit()\n"
        "        kaio.cp_async_wait(STAGES - 1)  # tile i has landed\n"
        "        kaio.sync_threads()\n" + _FB_NOTE
    ),
}


def round_fb(budget: float):
    """(dec, twelfth pass, round E) decode_folded with two barriers a key tile (the next
    copies issued before the wait for the current tile: three tiles in flight, as the copy
    floors have, against two with one barrier: ``FB_EDITS``, a probe-only copy of the
    kernel) against the routed kernel, uniform and ragged lengths; decode_fwd (fold off)
    with one barrier a tile (SYNC1, its default at 3 stages) and two; each checked
    against f32 SDPA first; two passes, the second reversed; SDPA first and last."""
    two = decode_variant("fold_two_barriers", FB_EDITS, "decode_folded")
    for b, length, _, sets, lens, label in shapes(FS_CASES, budget):
        gen = torch.Generator(device="cuda").manual_seed(b)
        rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
        rl = rl.to(torch.int32)
        for name, ls in (("", lens), ("ragged ", rl)):
            err = check(sets, ls, folded=two)
            print(f"{label} {name}fold two barriers rel err {err:.1e}", flush=True)
        err = check(sets, lens, fold=0, sync1=0)
        print(f"{label} fold off, two barriers rel err {err:.1e}", flush=True)
        jobs = [
            ("paged shipped", run_kaio(lens)),
            ("paged two barriers", run_kaio(lens, folded=two)),
            ("paged fold off", run_kaio(lens, fold=0)),
            ("paged fold off, two barriers", run_kaio(lens, fold=0, sync1=0)),
            ("ragged shipped", run_kaio(rl)),
            ("ragged two barriers", run_kaio(rl, folded=two)),
        ]
        both_passes(label, jobs, sets)


def warm_fb():
    """What round fb launches: decode_folded (SPEC, 3 stages, PAIR 64, 256 to 1024 slots)
    with one barrier a tile and two, decode_fwd's B64 kernels (SORT 256, 128)."""
    two = decode_variant("fold_two_barriers", FB_EDITS, "decode_folded")
    out = [(probe_mark, {})] + [(decode.DECODE, one_split(3, sort=n)) for n in (256, 128)]
    out += [(decode.DECODE, {**one_split(3, sort=n), "SYNC1": 0}) for n in (256, 128)]
    for n in (512, 256, 1024):
        c = {"STAGES": 3, "FOLD": 2, "SORT": n, "PAIR": 64, "DP": 128, "DT": f16, "SPEC": 1}
        out += [(decode.FOLDED, c), (two, c)]
    return out


SP_CASES = ((16, 1024), (1, 32768))
SP_SHARED = {2: 70144, 4: 135680}  # decode_fwd's dynamic shared memory at 2 and 4 stages


def spin_events(graph, n=20):
    """``event_median`` of n replays queued behind a 3 ms GPU spin."""
    return event_median(graph, n, spin_s=3e-3)


def captured(fn):
    """``fn()`` captured in a CUDA graph on a new stream, warmed first on another new
    stream (as bench/decode.py's suite does: state kept per stream is first made there)."""
    cap, warm = torch.cuda.Stream(), torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=cap):
        fn()
    torch.cuda.synchronize()
    return graph


def zeroed_in_capture(fn):
    """``fn()`` captured as main's decode op did it: a stream first seen capturing got its
    fused merge's counters zeroed inside the capture (no rows zeroed ahead)."""
    spare, rows = dict(decode._SPARE), decode.SPARE_ROWS
    decode._SPARE.clear()
    decode.SPARE_ROWS = 0
    try:
        return captured(fn)
    finally:
        decode._SPARE.update(spare)
        decode.SPARE_ROWS = rows


def sp_graphs(q, k, v, kc, vc, table, lens) -> dict:
    """{name: CUDA graph} of a case, each captured on a new stream after a call on another
    (as the suite does): kaio routed over both layouts (paged also as main captured it,
    ``zeroed_in_capture``), SDPA's default, and kernels that only start their blocks."""
    o = torch.empty(1024, device="cuda")

    def paged():
        return decode.flash_attention_decode(q, kc, vc, lens, table)

    graphs = {
        "kaio contiguous": captured(lambda: decode.flash_attention_decode(q, k, v, lens)),
        "kaio paged": captured(paged),
        "kaio paged, counters zeroed in the capture": zeroed_in_capture(paged),
        "SDPA default": captured(lambda: sdpa(q, k, v, enable_gqa=True)),
    }
    for blocks, st in ((1, 0), (128, 2), (128, 4)):
        nbytes = SP_SHARED.get(st, 16)

        def idle(n=blocks, nbytes=nbytes):  # on the current (capturing) stream
            stream = torch.cuda.current_stream().cuda_stream
            idle_blocks[n, 128, stream, nbytes](o, SHARED=nbytes)

        graphs[f"idle {blocks} blocks {nbytes >> 10} KB"] = captured(idle)
    return graphs


def round_sp(budget: float):
    """(dec, thirteenth pass, round A) Where the suite's time goes at B16 L1024 and B1 L32768:
    kaio's routed kernels (both layouts) against SDPA, head_stream's copy floors (B16) and a
    plain stream of the same bytes (128 blocks), one split's first copies before the length
    over a contiguous cache (SPEC) and its stages, SORT over 64 pages; then each graph's
    event-to-event time (the suite's way), its replay's kernels in the profiler, the events
    again (reverse order)."""
    for b, length, _, sets, lens, label in shapes(SP_CASES, budget):
        print(f"{label} contiguous rel err {check(sets, lens, contiguous=True):.1e}", flush=True)
        jobs = [
            ("contiguous routed", run_kaio_contig(lens)),
            ("paged routed", run_kaio(lens)),
        ]
        if b == 16:
            for name, cfg in (("SPEC", {"spec_all": 1}), ("3 stages", {"stages": 3})):
                err = check(sets, lens, contiguous=True, **cfg)
                print(f"{label} contiguous {name} rel err {err:.1e}", flush=True)
                jobs.append((f"contiguous {name}", run_kaio_contig(lens, **cfg)))
            print(f"{label} paged SORT 128 rel err {check(sets, lens, sort=128):.1e}", flush=True)
            jobs.append(("paged SORT 128", run_kaio(lens, sort=128)))
            floor_jobs(b, length, label, sets, [(False, 2, 0), (True, 4, 0)])
        n = b * HKV * length * D
        out = torch.empty(128 * 128, device="cuda")
        per = 2 * n // 128
        flat = [(torch.cat([s[1].view(-1), s[2].view(-1)]),) for s in sets[:1]]
        show(
            f"{label} floor stream 128 blocks",
            kernel_times(lambda x, o=out, n=per: stream[128, 128](x, o, n, U=8), flat),
        )
        both_passes(label, jobs, sets)
        flush()
        restore()
        time_graphs(label, "replay", sp_graphs(*sets[0], lens), sets, spin_events)
        del flat


def warm_sp():
    """What round sp launches."""
    c = {"DP": 128, "MT": 1, "DT": f16, "CL": 1, "SWAP": 1, "SORT": 0}
    contig = {**c, "PAGED": False, "PW": 0, "DIRECT": True, "FUSED": False, "OWN": 0}
    out = [(probe_mark, {}), (stream, {"U": 8})]
    out += [(decode.DECODE, {**contig, "STAGES": 2, "SYNC1": 0, "SPEC": s}) for s in (0, 1)]
    out += [(decode.DECODE, {**contig, "STAGES": 3, "SYNC1": 1, "SPEC": 0})]
    paged = {**c, "PAGED": True, "PW": 1, "DIRECT": True, "FUSED": False, "SPEC": 1}
    paged |= {"STAGES": 4, "SYNC1": 0, "OWN": 1}
    out += [(decode.DECODE, {**paged, "SORT": s}) for s in (0, 128)]
    split = {**c, "DIRECT": False, "STAGES": 4, "SYNC1": 0, "OWN": 0, "SPEC": 0}
    out += [
        (decode.DECODE, {**split, "PAGED": False, "PW": 0, "FUSED": False, "CL": cl})
        for cl in (8, 16)
    ]
    out += [(decode.DECODE, {**split, "PAGED": True, "PW": 1, "FUSED": True})]
    flags = {"DP": 128, "LOCK": 0, "TOUCH": 0, "CO": 0}
    out += [(head_stream, {**flags, "PAGED": p, "STAGES": st}) for p, st in ((False, 2), (True, 4))]
    return out + [(idle_blocks, {"SHARED": n}) for n in (16, *SP_SHARED.values())]


WS_EDITS = {  # decode_fwd: a paged split grid's window of the table loaded with the length
    "            entry[e] = table_at(block_table, b, at, max_pages)\n"
    "    kv_len = u32(kaio.min(kaio.max(seq_lens[b], 0), i32(capacity)))\n": (
        "            entry[e] = table_at(block_table, b, at, max_pages)\n"
        "    if PAGED and PW and not SPEC:  # a full-length split's window, with the length\n"
        "        cap_per = ((capacity + BN - 1) // BN + splits - 1) // splits\n"
        "        window_start(win, split * cap_per * BN, b, block_table, max_pages, shift, lane)\n"
        "    kv_len = u32(kaio.min(kaio.max(seq_lens[b], 0), i32(capacity)))\n"
    ),
    "            window_start(win, t0 * BN, b, block_table, max_pages, shift, lane)\n": (
        "            if (t0 * BN) >> shift != win[0]:  # not the full-length split's\n"
        "                window_start(win, t0 * BN, b, block_table, max_pages, shift, lane)\n"
    ),
}
WS_CASES = ((1, 32768), (1, 4096))
WS_ROUNDS = 2  # both_passes of round ws a shape (round C of the thirteenth pass: 1)


def round_ws(budget: float):
    """(dec, thirteenth pass) A paged split grid's table window loaded with the length
    (``WS_EDITS``: the window of the split's run at full length, loaded again only where
    the length moves the run) against the routed kernel, uniform and ragged lengths (L/4
    .. L), each checked against f32 SDPA first; WS_ROUNDS times two passes."""
    ws = decode_variant("window_spec", WS_EDITS)
    for b, length, _, sets, lens, label in shapes(WS_CASES, budget):
        gen = torch.Generator(device="cuda").manual_seed(b)
        rl = torch.randint(length // 4, length + 1, (b,), device="cuda", generator=gen)
        rl = rl.to(torch.int32)
        show(f"{label} paged routed", kernel_times(run_kaio(lens), sets))
        flush()
        for name, ls in (("", lens), ("ragged ", rl)):
            err = check(sets, ls, kernel=ws)
            print(f"{label} {name}paged window spec rel err {err:.1e}", flush=True)
        print(f"{label} paged routed rel err after the copy {check(sets, lens):.1e}")
        jobs = [
            ("paged routed", run_kaio(lens)),
            ("paged window spec", run_kaio(lens, kernel=ws)),
            ("ragged routed", run_kaio(rl)),
            ("ragged window spec", run_kaio(rl, kernel=ws)),
        ]
        for _ in range(WS_ROUNDS):
            both_passes(label, jobs, sets)


def warm_ws():
    """What round ws launches: the paged split grids of its shapes (clusters of 8, 16
    splits through the fused merge), original and copies."""
    c = {"DP": 128, "MT": 1, "DT": f16, "SWAP": 1, "SORT": 0, "PAGED": True, "PW": 1}
    c |= {"DIRECT": False, "STAGES": 4, "SYNC1": 0, "SPEC": 0}
    grids = [{"FUSED": True, "CL": 1, "OWN": 0}]
    grids += [{"FUSED": False, "CL": cl, "OWN": 0} for cl in (8, 16)]
    kernels = [decode.DECODE, decode_variant("window_spec", WS_EDITS)]
    return [(probe_mark, {})] + [(k, {**c, **g}) for k in kernels for g in grids]


def fg_calls(length, q, k, v, kc, vc, table, lens) -> dict:
    """{name: call} of round fg: kaio routed over both layouts, ``head_stream`` as the
    kernel's grid and stages take them (contiguous 2, paged 4), SDPA's default."""
    b = q.shape[0]
    o = torch.empty(b * HKV * 128, device="cuda")

    def floor(paged, st):
        def run():
            src = (x.view(-1) for x in ((kc, vc) if paged else (k, v)))
            stream = torch.cuda.current_stream().cuda_stream
            head_stream[b * HKV, 128, stream, 2 * st * 64 * 128 * 2](
                *src, table.view(-1), o, HKV, length, length // 16, kc.shape[0],
                PAGED=paged, STAGES=st, DP=128, LOCK=0, TOUCH=0, CO=0,
            )  # fmt: skip

        return run

    return {
        "kaio contiguous": lambda: decode.flash_attention_decode(q, k, v, lens),
        "kaio paged": lambda: decode.flash_attention_decode(q, kc, vc, lens, table),
        "floor contiguous": floor(False, 2),
        "floor paged": floor(True, 4),
        "SDPA default": lambda: sdpa(q, k, v, enable_gqa=True),
    }


def fg_graphs(length, *inputs) -> dict:
    """{name: CUDA graph of one call} of round fg (``fg_calls``)."""
    return {name: captured(fn) for name, fn in fg_calls(length, *inputs).items()}


def round_fg(budget: float):
    """(dec, thirteenth pass) The suite's timing of the copy floors at B16 L1024: CUDA graphs
    of ``head_stream`` (kaio's grid and copies, no arithmetic) beside kaio's routed calls
    and SDPA's (``fg_graphs``), each from event to event (``spin_events``) in two passes,
    the second in reverse order, then their replays' kernel times."""
    for _, length, _, sets, lens, label in shapes(((16, 1024),), budget):
        restore()
        graphs = fg_graphs(length, *sets[0], lens)
        names = list(graphs)
        for order in (names, names[::-1]):
            for name in order:
                print(f"{label} {name} event to event {spin_events(graphs[name]):.2f} us")
        for name, graph in graphs.items():
            show(f"{label} {name} replay", kernel_times(lambda *_, g=graph: g.replay(), sets))


def warm_fg():
    """What round fg launches."""
    return [warm_sp()[i] for i in (0, 2, 6, 10, 11)]


KT_CASES = ((16, 1024), (1, 4096))
KT_CALLS = 8  # calls in a graph, at least (a multiple of the input sets), as bench/decode.py


def kt_calls(length, q, k, v, kc, vc, table, lens) -> dict:
    """{name: call} of round kt: round fg's (``fg_calls``); at B < 16 (a split grid, where
    head_stream's B * Hkv blocks are no floor) a 128-block ``stream`` of the K/V bytes (a copy
    of both caches in one buffer) in place of head_stream."""
    calls = fg_calls(length, q, k, v, kc, vc, table, lens)
    if q.shape[0] >= 16:
        return calls
    calls = {n: fn for n, fn in calls.items() if not n.startswith("floor")}
    kv = torch.cat([k.view(-1), v.view(-1)])
    out = torch.empty(128 * 128, device="cuda")

    def stream_kv():
        s = torch.cuda.current_stream().cuda_stream
        stream[128, 128, s](kv, out, kv.numel() // 128, U=8)

    return {**calls, "floor stream 128 blocks": stream_kv}


def graph_of_calls(fns: list, calls: int):
    """One CUDA graph of ``calls`` calls of ``fns`` (one a set) in turn."""

    def run():
        for i in range(calls):
            fns[i % len(fns)]()

    return captured(run)


def graph_events(graph, calls: int) -> float:
    """µs a call: ``spin_events`` of a graph of ``calls`` calls, divided by them."""
    return spin_events(graph, n=6) / calls


def round_kt(budget: float):
    """(dec, fourteenth pass) Kernel time three ways: a CUDA graph of KT_CALLS or more calls
    over the input sets in turn, the events around a replay divided by the calls
    (bench/decode.py's kernel time); the same graphs' kernels in the profiler; one call a
    graph from event to event (the suite's earlier timing): kaio routed over both layouts,
    SDPA's default, and head_stream's copy floors (``kt_calls``). Two passes, the second in
    reverse order."""
    for _, length, _, sets, lens, label in shapes(KT_CASES, budget):
        restore()
        per_set = [kt_calls(length, *s, lens) for s in sets]
        names = list(per_set[0])
        calls = len(sets) * -(-KT_CALLS // len(sets))

        graphs = {
            n: (graph_of_calls([c[n] for c in per_set], calls), captured(per_set[0][n]))
            for n in names
        }
        for order in (names, names[::-1]):
            for n in order:
                g, one = graphs[n]
                print(
                    f"{label} {n}: graph of {calls} {graph_events(g, calls):.2f} us a call; "
                    f"one call a graph {spin_events(one):.2f} us",
                    flush=True,
                )
        for n in names:
            job = kernel_times(lambda *_, g=graphs[n][0]: g.replay(), sets, 4)
            show(f"{label} {n} graph of {calls}, a replay", job)
        flush()
        del graphs, per_set


ROUNDS = {  # argument: (round, its default time budget in seconds)
    "p": (round_p, 30),
    "t": (round_t, 30),
    "v": (round_v, 30),
    "q": (round_q, 30),
    "r": (round_r, 30),
    "x": (round_x, 25),
    "w": (round_w, 25),
    "s": (round_s, 20),
    "a": (round_a, 25),
    "h": (round_h, 25),
    "bn": (round_bn, 25),
    "c": (round_c, 25),
    "d": (round_d, 30),
    "e": (round_e, 25),
    "f": (round_f, 25),
    "g": (round_g, 25),
    "g2": (round_g2, 25),
    "g3": (round_g3, 25),
    "g4": (round_g4, 25),
    "k": (round_k, 30),
    "kf": (round_kf, 15),
    "m": (round_m, 40),
    "o": (round_o, 40),
    "p2": (round_p2, 40),
    "y": (round_y, 40),
    "z": (round_z, 40),
    "z2": (round_z2, 40),
    "z3": (round_z3, 40),
    "w64": (round_w64, 40),
    "pf": (round_pf, 40),
    "fold": (round_fold, 40),
    "pc": (round_pc, 40),
    "fs": (round_fs, 40),
    "gg": (round_gg, 40),
    "fb": (round_fb, 40),
    "sp": (round_sp, 40),
    "ws": (round_ws, 40),
    "fg": (round_fg, 40),
    "kt": (round_kt, 40),
}
WARMS = {
    "warm": warm_list,
    "warm_few": warm_few,
    "warm_c": warm_c,
    "warm_d": warm_d,
    "warm_e": warm_e,
    "warm_f": warm_f,
    "warm_g": warm_g,
    "warm_g2": warm_g2,
    "warm_g3": warm_g3,
    "warm_g4": warm_g4,
    "warm_k": warm_k,
    "warm_kf": warm_kf,
    "warm_m": warm_m,
    "warm_o": warm_o,
    "warm_p2": warm_p2,
    "warm_y": warm_y,
    "warm_z": warm_z,
    "warm_z2": warm_z2,
    "warm_z3": warm_z,
    "warm_w64": warm_w64,
    "warm_pf": warm_pf,
    "warm_fold": warm_fold,
    "warm_pc": warm_pc,
    "warm_fs": warm_fs,
    "warm_gg": warm_gg,
    "warm_fb": warm_fb,
    "warm_sp": warm_sp,
    "warm_ws": warm_ws,
    "warm_fg": warm_fg,
    "warm_kt": lambda: warm_fg() + [(stream, {"U": 8})],  # round kt's kernels
    "warm_spws": lambda: unique(warm_sp() + warm_ws()),
    "warm_b16ws": lambda: unique(warm_ws() + warm_sp()[2:3] + warm_sp()[6:10]),
    "warm_pcfs": lambda: unique(warm_pc() + warm_fs()),
    "warm_p": warm_p,
    "warm_t": warm_t,
    "warm_v": warm_v,
}

if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else ""
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else None
    if arg == "ncu_pages":  # for ncu --kernel-name regex:decode_pages
        sets = make_sets(16, 4096, paged=True)
        lens = torch.full((16,), 4096, device="cuda", dtype=torch.int32)
        for i in range(3):
            run_kaio(lens)(*sets[i % len(sets)])
        torch.cuda.synchronize()
    elif arg == "ncu":
        sets = make_sets(1, 4096)
        lens = torch.full((1,), 4096, device="cuda", dtype=torch.int32)
        for i in range(3):
            run_kaio(lens, cluster=False)(*sets[i % len(sets)])
        for i in range(3):
            run_kaio(lens, splits=16, cluster=True)(*sets[i % len(sets)])
        torch.cuda.synchronize()
    elif arg in WARMS:
        WARM_LIST = WARMS[arg]
        warm(seconds or 1e9)
    elif arg in ROUNDS:
        fn, default = ROUNDS[arg]
        fn(seconds or default)
    elif arg in ("b", "base_b"):
        round_b(arg == "base_b")
    else:
        main()
