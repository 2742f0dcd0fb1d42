"""Decode attention over a KV cache (flash-decoding) and the cache append, written in the kaio
DSL for f16/bf16 (the dtype constexpr ``DT``). The host side is ``kaio_ops.decode``.

``decode_fwd``: block (x, y) = (split, (batch b, K/V head, row chunk)). The query rows of a
K/V group, ``group`` heads times ``sq`` new tokens (contiguous in q: the heads of a group are
adjacent), are the M dimension of ``mma.m16n8k16``: 16 * MT rows a block, so each K/V tile is
read once per group, not once per query head. The block's 4 warps split each 64-key tile:
warp w owns the 16 rows of M-tile w % MT and keys (w // MT) * KW .. + KW of the tile
(KW = 64 * MT / 4). K and V tiles are buffered in ``STAGES`` (2 to 4) shared-memory stages
(16-byte cp.async, XOR-swizzled for ldmatrix): tiles t + 1 .. t + STAGES - 1 are in flight
while tile t is used. The scores and the online softmax are those of
``_attention_tc.attention_fwd`` (``frag_columns``, ``load_a``, ``start_rows``,
``dot_rows_at``, ``acc_rows_at``, ``online_softmax``); the warps' partial (max, sum, output)
then merge through shared memory (``merge_warps``, 4 columns a thread). A group of at most 8
rows (``SWAP``: the suite's 4 heads and one new token) swaps the roles instead: a warp's 16
keys are the M dimension and the query rows N (``key_scores``: S^T = K Q^T;
``key_values``: O^T += V^T P^T, P^T transposed across the lanes by ``probs_as_b``), half the
mma and half the accumulators of 16 query rows in M. The key tiles take two barriers of the
block each, one at 3 stages (``SYNC1``), or none where each warp copies and waits for its
own 16 keys (``OWN``, ``load_own``: two of the warp, one after the wait, one after its lanes'
reads, before their next copies over them).

Lengths are read on the GPU: ``seq_lens[b]`` (clamped to 0 .. capacity) fixes the key tiles,
split evenly over the grid's x blocks (in runs; with ``SPEC``, every splits-th tile a
block), so the grid depends only on the capacity and the GPU
(a CUDA graph replays for any lengths); blocks past a sequence's end do no K/V work. New
token i of the ``sq`` sits at position len - sq + i and sees keys up to its own. With one
split the block writes the output and the logsumexp. With several, the splits of a row
chunk are one thread-block cluster where ``CL`` > 1 (sm_90): each block keeps its normalized
partial output and base-2 logsumexp in shared memory and ``cluster_merge`` combines them
through distributed shared memory. Else each block writes them to global memory (f32), and
the last block of its row chunk to finish (``FUSED``: an atomic counter per chunk) or
``decode_merge`` combines them. Either way in split order (deterministic).

Cache layouts (``PAGED``): contiguous [B, Hkv, capacity, D], or vLLM/FlashInfer "NHD" pages
[num_pages, page_size, Hkv, D] with ``block_table`` [B, max_pages] (page_size = 1 << shift),
whose entries each warp holds 64 at a time across its lanes (``window_pages``).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import bool_, f32, i32, u32
from kaio_ops._attention_tc import (
    acc_rows_at,
    dot_rows_at,
    frag_columns,
    load_a,
    load_tile,
    mma,
    online_softmax,
    pack,
    start_rows,
)

NEG_INF = float("-inf")
LN2 = 0.6931471805599453
WARPS = 4
THREADS = 32 * WARPS
BN = 64  # keys per tile
# part_lse holds a row's logsumexp every LSE_STRIDE floats (128 bytes): a merging block loads
# whole L1 lines, which are not coherent across multiprocessors, so no line it reads may
# also hold values another block writes later (the rows of part are whole lines already)
LSE_STRIDE = 32
UNROLL = 8  # splits a merge step loads at once (16 bytes each)
PREFETCH = 16  # splits of a thread's first merge item loaded before the weights are known
MAX_SPLITS = 64  # the most key splits (the merge holds a weight per split and row)
PAD = 0xFFFFFFFF  # a sort key past every page (``sort_keys``)
# ``decode_folded``'s sort keys: a pool page above FOLD_BITS of table slot (a cache of u32
# element indices has under 2**22 pages of 16 rows of D >= 64)
FOLD_BITS = 10


@kaio.gpu_func
def cache_row(
    key: u32,
    b: u32,
    kvh: u32,
    block_table: i32[:],
    capacity: u32,
    max_pages: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    d: u32,
    PAGED: kaio.constexpr,
) -> u32:
    """The index of element 0 of cache row ``key`` of sequence b, K/V head kvh: contiguous
    [B, Hkv, capacity, D], or paged [pages, 1 << shift, Hkv, D] through block_table (a page
    outside the pool counts as the last one)."""
    if PAGED:
        page = u32(block_table[b * max_pages + (key >> shift)])
        return paged_row(page, key, kvh, kv_heads, shift, pages, d)
    return ((b * kv_heads + kvh) * capacity + key) * d


@kaio.gpu_func
def paged_row(page: u32, key: u32, kvh: u32, kv_heads: u32, shift: u32, pages: u32, d: u32) -> u32:
    """The index of element 0 of row ``key`` (of its sequence), K/V head kvh, in
    ``page`` of a paged cache [pages, 1 << shift, Hkv, D], clamped to the pool: a bad table
    reads wrong rows, never outside the cache."""
    slot = (kaio.min(page, pages - 1) << shift) + (key & ((u32(1) << shift) - 1))
    return (slot * kv_heads + kvh) * d


@kaio.gpu_func
def hint_at(arr: i32[:], index: u32) -> u32:
    """arr[index], read at L2 (``ld.global.cg``) as a hint before a programmatic dependent
    launch's wait: the kernel before may still write it, and a line left in L1 could serve
    a read after the wait a stale value."""
    got = kaio.local(i32, 1)
    kaio.load_vector(got, arr, index, 0, "cg")
    return u32(got[0])


@kaio.gpu_func
def prefetch_firsts(
    k: DT[:],
    v: DT[:],
    b: u32,
    kvh: u32,
    block_table: i32[:],
    capacity: u32,
    max_pages: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    KEYS: kaio.constexpr,
    DP: kaio.constexpr,
    DT: kaio.constexpr,
):
    """L2 prefetches of the K and V rows of sequence b's first KEYS keys (under the
    capacity), K/V head kvh, in a paged cache, a row a thread at a time (a head's rows of a
    page lie apart). Made before the wait of a programmatic dependent launch (PDL), while
    the kernel before may still write the cache, the table or the lengths: a prefetch is a
    hint that L2 (where that kernel's writes land) serves coherently, and a stale table
    entry only names another page of the pool (clamped); the table is read at L2
    (``hint_at``), no length at all (its load would stand before the wait). (A block's
    prefetch of one slice of each page, the blocks of a sequence's K/V heads bringing whole
    pages together, measured slower at B = 1.)"""
    for i in kaio.static_range(-(-KEYS // THREADS)):
        key = tid + i * THREADS
        if key < KEYS and key < capacity:
            page = hint_at(block_table, b * max_pages + (key >> shift))
            at = paged_row(page, key, kvh, kv_heads, shift, pages, DP)
            kaio.prefetch_l2(k, at, DP * 2)
            kaio.prefetch_l2(v, at, DP * 2)


@kaio.gpu_func
def page_ids(
    pg: u32[:, :],
    j: kaio.constexpr,
    key0: u32,
    kv_len: u32,
    b: u32,
    block_table: i32[:],
    max_pages: u32,
    shift: u32,
    tid: u32,
    DP: kaio.constexpr,
):
    """pg[j, i]: the block-table entry (as read, unchecked) of the page holding the i-th
    row this thread copies of the tile of keys key0 .. key0 + BN (``load_stage``'s rows;
    the first page past kv_len). Read a tile ahead of its copies, these loads are in flight
    while the block works on a tile instead of stalling the copies."""
    STEP = THREADS // (DP // 8)
    for i in kaio.static_range(BN // STEP):
        key = key0 + tid // (DP // 8) + i * STEP
        pg[j, i] = u32(block_table[b * max_pages + (kaio.select(key < kv_len, key, 0) >> shift)])


@kaio.gpu_func
def table_at(block_table: i32[:], b: u32, p: u32, max_pages: u32) -> u32:
    """Entry p of block_table row b (the row's last entry past its end: read, never used)."""
    return u32(block_table[b * max_pages + kaio.min(p, max_pages - 1)])


@kaio.gpu_func
def window_start(
    win: u32[:], key0: u32, b: u32, block_table: i32[:], max_pages: u32, shift: u32, lane: u32
):
    """``win`` = (first page index w, entry w + lane, entry w + 32 + lane) of block_table row
    b: the 64 table entries from the page of key ``key0`` on, one coalesced load per 32 held
    across a warp's lanes (``window_pages`` hands them out by shuffles)."""
    win[0] = key0 >> shift
    win[1] = table_at(block_table, b, win[0] + lane, max_pages)
    win[2] = table_at(block_table, b, win[0] + 32 + lane, max_pages)


@kaio.gpu_func
def window_pages(
    pg: u32[:, :],
    win: u32[:],
    key0: u32,
    b: u32,
    block_table: i32[:],
    max_pages: u32,
    shift: u32,
    tid: u32,
    lane: u32,
    DP: kaio.constexpr,
):
    """pg[0, i]: the page of the i-th row this thread copies of the tile of keys key0 ..
    key0 + BN (``load_stage``'s rows), from the warp's window ``win`` of the table
    (``window_start``). Tiles come in order: once a tile starts in the window's upper half
    the window moves on by 32 entries, whose load is then 7 or more tiles (pages of 16 keys
    or more) ahead of its first use (only a tile that reaches the upper half shuffles it).
    Rows of one 16-key block share a page (pages hold 16 or more, tiles start on multiples
    of BN), so a page is shuffled once per 16 rows. Every lane of the warp takes part (the
    callers' conditions are uniform over the block)."""
    if key0 >> shift >= win[0] + 32:
        win[0] += 32
        win[1] = win[2]
        win[2] = table_at(block_table, b, win[0] + 32 + lane, max_pages)
    STEP = THREADS // (DP // 8)
    DUP = 16 // STEP if STEP < 16 else 1  # rows i .. i + DUP - 1 of a thread share a page
    # only a tile reaching the upper half reads it (uniform over the block): the tiles
    # after a move do not wait for its load
    upper = (key0 + BN - 1) >> shift >= win[0] + 32
    for i in kaio.static_range(BN // STEP):
        if i % DUP == 0:
            at = ((key0 + tid // (DP // 8) + i * STEP) >> shift) - win[0]  # 0 .. 35
            pg[0, i] = kaio.shfl_idx(win[1], at % 32)
            if upper:
                high = kaio.shfl_idx(win[2], at % 32)
                pg[0, i] = kaio.select(at < 32, pg[0, i], high)
        else:
            pg[0, i] = pg[0, i - i % DUP]


@kaio.gpu_func
def copy_key(
    dst: DT[:, :],
    row0: u32,
    r: u32,
    srow: u32,
    col: u32,
    k: DT[:],
    v: DT[:],
    key: u32,
    kv_len: u32,
    b: u32,
    kvh: u32,
    page: u32,
    capacity: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    DP: kaio.constexpr,
    PAGED: kaio.constexpr,
    DT: kaio.constexpr,
):
    """The 16 bytes at column ``col`` of key ``key``'s K and V rows into rows row0 + r (K)
    and row0 + BN + r (V) of dst, swizzled as row ``srow``, by cp.async: zeros past kv_len
    (masked keys multiply finite values); a paged cache's key lies in ``page``."""
    inside = key < kv_len
    if PAGED:
        at = paged_row(page, key, kvh, kv_heads, shift, pages, DP)
    else:
        at = ((b * kv_heads + kvh) * capacity + key) * DP
    index = kaio.select(inside, at + col, 0)
    nbytes = kaio.select(inside, 16, 0)
    swizzled = kaio.swizzle(dst, srow, col)
    kaio.cp_async(dst, (row0 + r, swizzled), k, index, 16, nbytes)
    kaio.cp_async(dst, (row0 + BN + r, swizzled), v, index, 16, nbytes)


@kaio.gpu_func
def load_stage(
    dst: DT[:, :],
    row0: u32,
    k: DT[:],
    v: DT[:],
    key0: u32,
    kv_len: u32,
    b: u32,
    kvh: u32,
    pg: u32[:, :],
    j: kaio.constexpr,
    capacity: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    DP: kaio.constexpr,
    PAGED: kaio.constexpr,
    DT: kaio.constexpr,
):
    """The K rows of keys key0 .. key0 + BN into the swizzled rows row0 .. row0 + BN of dst
    and the V rows into the next BN rows (16-byte cp.async, one address computation for
    both; zeros past kv_len, so masked keys multiply finite values), one cp.async group
    (committed by the caller). A paged cache's pages are ``page_ids``' pg[j] (a page
    outside the pool counts as the last one)."""
    PIECES = DP // 8
    STEP = THREADS // PIECES
    r0 = tid // PIECES
    col = tid % PIECES * 8
    for i in kaio.static_range(BN // STEP):
        r = r0 + i * STEP
        copy_key(dst, row0, r, r0 + i * STEP % 8, col, k, v, key0 + r, kv_len, b, kvh, pg[j, i],
                 capacity, kv_heads, shift, pages, DP, PAGED, DT)  # fmt: skip


@kaio.gpu_func
def load_own(
    dst: DT[:, :],
    row0: u32,
    k: DT[:],
    v: DT[:],
    key0: u32,
    kv_len: u32,
    b: u32,
    kvh: u32,
    page: u32,
    capacity: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    warp: u32,
    lane: u32,
    DP: kaio.constexpr,
    PAGED: kaio.constexpr,
    DT: kaio.constexpr,
):
    """``load_stage`` of warp ``warp``'s own 16 keys key0 + 16 warp .. + 15 of the tile (rows
    16 warp .. of the stage, K then V BN rows on), by its lanes: one cp.async group of the
    warp. A paged cache's keys are one 16-key run of ``page``."""
    PIECES = DP // 8
    STEP = 32 // PIECES  # rows a pass of the warp
    r0 = lane // PIECES
    col = lane % PIECES * 8
    for i in kaio.static_range(16 // STEP):
        r = warp * 16 + r0 + i * STEP
        copy_key(dst, row0, r, r0 + i * STEP % 8, col, k, v, key0 + r, kv_len, b, kvh, page,
                 capacity, kv_heads, shift, pages, DP, PAGED, DT)  # fmt: skip


@kaio.gpu_func
def sorted_page(page: u32, slot: u32, sort_s: u32[:], lo: u32, hi: u32, N: kaio.constexpr) -> u32:
    """The page of table slot ``slot``: sort_s[slot - lo] for slots lo .. hi - 1 (the
    sorted ones, ``sort_keys``), else ``page`` (the table's)."""
    inside = slot >= lo and slot < hi
    return kaio.select(inside, sort_s[kaio.min(slot - lo, u32(N - 1))], page)


@kaio.gpu_func
def keep(x: u32, other: u32, low: bool_) -> u32:
    """The smaller of x and other where ``low``, else the larger."""
    return kaio.select(low, kaio.min(x, other), kaio.max(x, other))


@kaio.gpu_func
def sort_keys(key: u32[:], buf: u32[:], lane: u32, warp: u32, N: kaio.constexpr):
    """The block's N keys in ascending order into buf[0 .. N - 1] (a bitonic network;
    every thread of the block takes part): thread (warp, lane) holds key[r], element
    i = warp * 32 R + 32 r + lane (R = N / THREADS); elements closer than 32 meet by
    shuffles, up to 32 R apart within a thread, further through ``buf``."""
    R = N // THREADS
    WB = 32 * R  # elements a warp
    for kk in kaio.static_range(1, 16):  # sorted runs of 2^kk, alternately up and down
        if 1 << kk <= N:
            for jj in kaio.static_range(kk - 1, -1, -1):  # pairs 2^jj apart
                j = 1 << jj
                if j >= WB:  # partners in another warp
                    kaio.sync_threads()
                    for r in kaio.static_range(R):
                        buf[warp * WB + 32 * r + lane] = key[r]
                    kaio.sync_threads()
                for r in kaio.static_range(R):
                    i = warp * WB + 32 * r + lane
                    down = i >> kk & 1  # this run sorts downwards
                    low = (i >> jj & 1) == down  # this element keeps the smaller key
                    if j < 32:
                        key[r] = keep(key[r], kaio.shfl_xor(key[r], j), low)
                    elif j >= WB:
                        key[r] = keep(key[r], buf[i ^ j], low)
                    elif r & j // 32 == 0:  # the pair (r, r + j / 32) of this thread
                        small = kaio.min(key[r], key[r + j // 32])
                        large = kaio.max(key[r], key[r + j // 32])
                        key[r] = kaio.select(down == 0, small, large)
                        key[r + j // 32] = kaio.select(down == 0, large, small)
    kaio.sync_threads()
    for r in kaio.static_range(R):
        buf[warp * WB + 32 * r + lane] = key[r]


@kaio.gpu_func
def copy_tile(
    kv_s: DT[:, :],
    row0: u32,
    k: DT[:],
    v: DT[:],
    key0: u32,
    kv_len: u32,
    b: u32,
    kvh: u32,
    pg: u32[:, :],
    j: kaio.constexpr,
    win: u32[:],
    block_table: i32[:],
    capacity: u32,
    max_pages: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    sort_s: u32[:],
    lo: u32,
    hi: u32,
    DP: kaio.constexpr,
    PAGED: kaio.constexpr,
    PW: kaio.constexpr,
    OWN: kaio.constexpr,
    SORT: kaio.constexpr,
    DT: kaio.constexpr,
):
    """The copies of the key tile key0 .. key0 + BN into the stage at row row0 of kv_s:
    ``OWN``, this warp's 16 keys (``load_own``, a paged cache's page from the warp's window
    ``win``); else the block's share of the whole tile (``load_stage``; paged: its pages
    from the window (``PW``) or ``page_ids``' pg[j]). ``SORT``: the pages of slots lo ..
    hi - 1 from ``sort_s`` instead (``sorted_page``)."""
    lane = kaio.lane_id()
    if OWN:
        warp = tid // 32
        page = u32(0)
        if PAGED:
            page = window_page(win, key0 + warp * 16, b, block_table, max_pages, shift, lane)
            if SORT:
                page = sorted_page(page, key0 + warp * 16 >> shift, sort_s, lo, hi, SORT)
        load_own(
            kv_s, row0, k, v, key0, kv_len, b, kvh, page, capacity, kv_heads, shift, pages,
            warp, lane, DP, PAGED, DT,
        )  # fmt: skip
    else:
        if PAGED and PW:
            window_pages(pg, win, key0, b, block_table, max_pages, shift, tid, lane, DP)
            if SORT:
                STEP = THREADS // (DP // 8)
                for i in kaio.static_range(BN // STEP):
                    slot = key0 + tid // (DP // 8) + i * STEP >> shift
                    pg[0, i] = sorted_page(pg[0, i], slot, sort_s, lo, hi, SORT)
        load_stage(
            kv_s, row0, k, v, key0, kv_len, b, kvh, pg, 0 if PW else j, capacity, kv_heads,
            shift, pages, tid, DP, PAGED, DT,
        )  # fmt: skip


@kaio.gpu_func
def zero_rows(
    kv_s: DT[:, :], row0: u32, key0: u32, kv_len: u32, me: u32, N: kaio.constexpr,
    DP: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """Rows row0 + r of kv_s (r < BN, or < 16 where N = 32: one warp's) whose key
    key0 + r is at or past kv_len: zeros, by N threads (me = the thread's index)."""
    R = 16 if N == 32 else BN
    for idx in range(me, R * DP, N):
        if key0 + idx // DP >= kv_len:
            kv_s[row0 + idx // DP, idx % DP] = DT(0.0)


@kaio.gpu_func
def load_pages(
    dst: DT[:, :],
    row0: u32,
    k: DT[:],
    v: DT[:],
    page: u32,
    key0: u32,
    kv_len: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    NT: kaio.constexpr,
    HKV: kaio.constexpr,
    DP: kaio.constexpr,
    DT: kaio.constexpr,
):
    """Keys key0 .. key0 + 15 (key0 a multiple of 16) of every K/V head from ``page`` of a
    paged cache [pages, 1 << shift, HKV, DP] (16 * HKV * DP contiguous elements, read whole
    by NT threads, 16 bytes each: coalesced), K into rows row0 + 16 h + t of dst (head h,
    key key0 + t: a head's keys adjacent, swizzled, for ldmatrix) and V into the HKV * 16
    rows after; zeros past kv_len. One cp.async group (committed by the caller); a page
    outside the pool counts as the last one."""
    PIECES = DP // 8
    CH = 16 * HKV * PIECES  # 16-byte chunks of each of K and V
    base = ((kaio.min(page, pages - 1) << shift) + (key0 & ((u32(1) << shift) - 1))) * HKV * DP
    for i in kaio.static_range((CH + NT - 1) // NT):
        c = tid + i * NT
        if CH % NT == 0 or c < CH:
            t = c // (HKV * PIECES)
            r = c // PIECES % HKV * 16 + t
            col = c % PIECES * 8
            inside = key0 + t < kv_len
            index = kaio.select(inside, base + c * 8, 0)
            nbytes = kaio.select(inside, 16, 0)
            swizzled = kaio.swizzle(dst, r, col)
            kaio.cp_async(dst, (row0 + r, swizzled), k, index, 16, nbytes)
            kaio.cp_async(dst, (row0 + HKV * 16 + r, swizzled), v, index, 16, nbytes)


@kaio.gpu_kernel
def decode_fwd(
    q: DT[:],
    k: DT[:],
    v: DT[:],
    block_table: i32[:],
    seq_lens: i32[:],
    out: DT[:],
    lse: f32[:],
    part: f32[:],
    part_lse: f32[:],
    counters: u32[:],
    heads: u32,
    group: u32,
    sq: u32,
    kv_heads: u32,
    capacity: u32,
    max_pages: u32,
    shift: u32,
    pages: u32,
    chunks: u32,
    total_rows: u32,
    scale_log2: f32,
    DP: kaio.constexpr,
    MT: kaio.constexpr,
    PAGED: kaio.constexpr,
    DIRECT: kaio.constexpr,
    FUSED: kaio.constexpr,
    STAGES: kaio.constexpr,
    CL: kaio.constexpr,
    DT: kaio.constexpr,
    PW: kaio.constexpr,
    SPEC: kaio.constexpr,
    SWAP: kaio.constexpr,
    SYNC1: kaio.constexpr,
    OWN: kaio.constexpr,
    SORT: kaio.constexpr,
    PDL: kaio.constexpr,
):
    """Attention of the 16 * MT query rows (row chunk) of one K/V group over the key tiles
    of split ``block x``: out / lse (``DIRECT``, one split) or part / part_lse (row-major
    [splits, total_rows, DP] and [splits, total_rows, LSE_STRIDE], base-2 logsumexp).
    ``FUSED``: the last block of the row chunk to finish (``counters[block y]`` counts
    them, and is reset to 0 by that block) merges the splits into out / lse; else
    ``decode_merge`` does. ``CL`` > 1 (sm_90; the grid's x size is CL, the splits): the
    splits of a row chunk are one thread-block cluster, their partial results stay in
    shared memory and ``cluster_merge`` combines them (part, part_lse, counters unused).
    ``PW`` (paged): the pages come from a window of the block table held across each warp's
    lanes (``window_pages``), else from loads one tile ahead (``page_ids``). ``SPEC`` (one
    split, a paged cache with ``PW``; or several over a contiguous cache): split s takes
    key tiles s, s + splits, s + 2 splits, ... (with one split, every tile in order), so
    its first STAGES - 1 are copied before the length is read, their V rows past the length
    zeroed in shared memory once it is known (K's scores there are masked; a tile wholly
    past it is never used), and the first copies wait for no load of the length. Without
    it a split takes a run of the length's tiles. ``SWAP`` (MT 1, at most 8 query rows, DP up
    to 128): the tiles' products with the keys in the mma's M dimension and the query rows
    in N (``key_scores``, ``key_values``: half the mma of the query rows in M, whose 16 rows
    such a group fills at most half). ``SYNC1`` (STAGES >= 3): one barrier a key tile, the
    wait for tile i first, then the copies into the stage tile i - 1 used. ``OWN`` (MT 1; a
    paged cache with ``PW``): each warp copies, waits for and reads only its own 16 keys
    of each tile (``load_own``), so the key tiles need no barrier of the block. ``SORT``
    (one split with ``SPEC`` over a paged cache): the SORT table slots after those copied
    before the length are visited in pool order where every query row sees all their
    keys (``sort_keys``: the order of unmasked keys does not change the attention), so
    that the blocks, sweeping the pool together, read neighbouring pages at once. ``PDL``
    (sm_90; one split over a paged cache): launched with programmatic dependent launch: the
    wait for the kernel before it (``grid_dependency_wait``) before any load, then the next
    kernel let launch (``launch_dependents``): its blocks take the SMs that this grid's
    blocks leave while the others still run; PDL 1 first prefetches the block's first
    STAGES - 1 key tiles into L2 (``prefetch_firsts``), PDL 2 does not."""
    if CL > 1:
        kaio.cluster_dims(CL)
    KSPLIT = WARPS // MT  # warps sharing one M-tile, each on KW keys of a tile
    KW = BN // KSPLIT
    ROWS = 16 * MT
    QREG = DP <= 128  # Q fragments stay in registers
    kaio.launch_bounds(THREADS, 3 if DP <= 128 and MT == 1 else 2)  # <= 168 registers for D 128
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    warp = tid // 32
    g = lane // 4
    mtile = warp % MT
    kpart = warp // MT
    split = kaio.block_idx_x()
    splits = kaio.grid_dim_x()
    chunk = kaio.block_idx_y() % chunks
    bkv = kaio.block_idx_y() // chunks
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    nrows = group * sq  # the group's query rows, contiguous in q
    q_row0 = (b * heads + kvh * group) * sq
    row0 = chunk * ROWS
    kv_s = kaio.shared_dynamic(DT, (2 * STAGES * BN, DP), 0)  # K0, V0, K1, V1, ...
    q_s = kaio.shared_dynamic(DT, (ROWS, DP), 2 * STAGES * BN * DP * 2)
    red_o = kaio.shared_dynamic(f32, (WARPS * 16, DP), 0)  # after the loop, over kv_s
    red_ml = kaio.shared_dynamic(f32, (2, WARPS * 16), (2 * STAGES * BN + ROWS) * DP * 2)
    sort_at = (2 * STAGES * BN + ROWS) * DP * 2 + 2 * WARPS * 16 * 4 if SORT else 0
    sort_s = kaio.shared_dynamic(u32, (SORT if SORT else 1,), sort_at)  # SORT: sorted pages

    if PDL == 1:  # (one split over a paged cache: its first tiles are 0 ..)
        prefetch_firsts(
            k, v, b, kvh, block_table, capacity, max_pages, kv_heads, shift, pages, tid,
            (STAGES - 1) * BN, DP, DT,
        )  # fmt: skip
    if PDL:
        kaio.grid_dependency_wait()
        kaio.launch_dependents()  # (the next kernel's blocks may take the SMs left free)
    # Q first: its copies are in flight while the length is read (the K/V copies need it)
    load_tile(q_s, q, q_row0 * DP, row0, nrows, DP, tid, ROWS, DP, THREADS, True, DT)
    kaio.cp_async_commit()
    # a paged cache's pages of tiles t0 .. t0 + STAGES - 1 (loads all in flight at once)
    pg = kaio.local(u32, (STAGES, BN // (THREADS // (DP // 8))))
    win = kaio.local(u32, 3)
    if SPEC:  # tiles split, split + splits, ... whatever the length, read meanwhile
        if PAGED:  # (one split only: the window takes tiles in order)
            window_start(win, 0, b, block_table, max_pages, shift, lane)
        for j in kaio.static_range(STAGES - 1):
            key0 = (split + j * splits) * BN
            if key0 < capacity:
                copy_tile(
                    kv_s, j * 2 * BN, k, v, key0, capacity, b, kvh, pg, 0, win, block_table,
                    capacity, max_pages, kv_heads, shift, pages, tid, sort_s, 0, 0, DP, PAGED,
                    PW, OWN, 0, DT,
                )  # fmt: skip
            kaio.cp_async_commit()
    # SORT: the table slots from lo on (those after the copies above), this thread's
    lo = ((STAGES - 1) * BN + (u32(1) << shift) - 1) >> shift
    entry = kaio.local(u32, SORT // THREADS if SORT else 1)
    if SORT:
        for e in kaio.static_range(SORT // THREADS):
            at = lo + warp * (SORT // WARPS) + 32 * e + lane
            entry[e] = table_at(block_table, b, at, max_pages)
    kv_len = u32(kaio.min(kaio.max(seq_lens[b], 0), i32(capacity)))
    # SORT: slots lo .. hi - 1 hold keys every query row sees: in pool order
    hi = kaio.min(u32(kaio.max(i32(kv_len) - i32(sq) + 1, 0)) >> shift, lo + SORT)
    if SORT:
        for e in kaio.static_range(SORT // THREADS):
            at = lo + warp * (SORT // WARPS) + 32 * e + lane
            entry[e] = kaio.select(at < hi, entry[e], u32(PAD))
        sort_keys(entry, sort_s, lane, warp, SORT)  # (read after the barrier below)
    n_total = (kv_len + BN - 1) // BN
    # the block's tiles: t0 + i * step for i < count (SPEC: every splits-th from its own,
    # so that its first ones are known before the length; else a run of the length's)
    step = splits if SPEC else 1
    t0 = split
    count = kaio.select(n_total > split, (n_total - split + splits - 1) // splits, 0)
    if not SPEC:
        per = (n_total + splits - 1) // splits
        t0 = kaio.min(split * per, n_total)
        count = kaio.min(t0 + per, n_total) - t0
    if PAGED and not SPEC:
        if PW:
            window_start(win, t0 * BN, b, block_table, max_pages, shift, lane)
        else:
            for j in kaio.static_range(STAGES):
                page_ids(pg, j, (t0 + j) * BN, kv_len, b, block_table, max_pages, shift, tid, DP)
    for j in kaio.static_range(STAGES - 1):  # tiles t0 .. t0 + STAGES - 2 in flight
        if not SPEC:
            if j < count:
                copy_tile(
                    kv_s, j * 2 * BN, k, v, (t0 + j) * BN, kv_len, b, kvh, pg, j, win,
                    block_table, capacity, max_pages, kv_heads, shift, pages, tid, sort_s, 0,
                    0, DP, PAGED, PW, OWN, 0, DT,
                )  # fmt: skip
            kaio.cp_async_commit()
    kaio.cp_async_wait(STAGES - 1)  # Q has landed
    kaio.sync_threads()

    acol = kaio.local(u32, 4)
    bcol = kaio.local(u32, 4)
    qf = kaio.local(u32, (DP // 16, 4))
    m = kaio.local(f32, 2)  # SWAP: of this lane's query columns, else of its row halves
    l = kaio.local(f32, 2)
    o = kaio.local(f32, (DP // 16 if SWAP else DP // 8, 4))
    frag_columns(acol, bcol, q_s, lane, DT)
    qb = kaio.local(u32, (DP // 16, 2))  # SWAP: Q^T's B fragments (query rows 0 .. 7)
    if SWAP:
        load_b(qb, q_s, bcol, lane, DP, DT)
    elif QREG:
        load_a(qf, q_s, mtile * 16, acol, lane, 0, DP, DT)
    start_rows(m, l, o, DP // 2 if SWAP else DP)  # (zeroes DP / 8 tiles: SWAP's o has DP / 16)
    limit = kaio.local(i32, 2)  # keys < limit are visible to the row (causal)
    for h in kaio.static_range(2):
        row = row0 + mtile * 16 + g + 8 * h
        if SWAP:
            row = row0 + lane % 4 * 2 + h
        limit[h] = i32(kv_len) - i32(sq) + i32(row % sq) + 1
    s = kaio.local(f32, (KW // 8, 4))
    kf = kaio.local(u32, (DP // 16, 4))  # SWAP: K's A fragments
    pb = kaio.local(u32, (1, 2))  # SWAP: P^T's B fragment
    for i in range(count):
        t = t0 + i * step
        stage = i % STAGES * 2 * BN
        if SYNC1:
            kaio.cp_async_wait(STAGES - 2)  # tile t has landed
            kaio.sync_threads()  # (and every warp is past tile i - 1)
        if i + STAGES - 1 < count:  # into the stage tile i - 1 used
            key0 = (t + (STAGES - 1) * step) * BN
            copy_tile(
                kv_s, (i + STAGES - 1) % STAGES * 2 * BN, k, v, key0, kv_len, b, kvh, pg,
                STAGES - 1, win, block_table, capacity, max_pages, kv_heads, shift, pages, tid,
                sort_s, lo, hi, DP, PAGED, PW, OWN, SORT, DT,
            )  # fmt: skip
            if PAGED and not PW:  # the next tile's pages, used by the next iteration's copies
                page_ids(
                    pg, STAGES - 1, (t + STAGES) * BN, kv_len, b, block_table, max_pages, shift,
                    tid, DP,
                )  # fmt: skip
        kaio.cp_async_commit()
        if OWN:
            kaio.cp_async_wait(STAGES - 1)  # this warp's keys of tile t have landed
            kaio.sync_warp()
        elif not SYNC1:
            kaio.cp_async_wait(STAGES - 1)  # tile t has landed
            kaio.sync_threads()
        if SPEC:
            if i < STAGES - 1 and (t + 1) * BN > kv_len:  # copied before the length was known
                if OWN:  # V's rows of this warp's keys past it: zeros
                    zero_rows(
                        kv_s, stage + BN + warp * 16, t * BN + warp * 16, kv_len, lane, 32, DP, DT
                    )
                    kaio.sync_warp()
                else:  # V's rows past it: zeros
                    zero_rows(kv_s, stage + BN, t * BN, kv_len, tid, THREADS, DP, DT)
                    kaio.sync_threads()
        krow = stage + kpart * KW
        # the last tiles hold keys past the end or past a new token's position
        masked = i32((t + 1) * BN) + i32(sq) > i32(kv_len) + 1
        if SWAP:
            key_scores(s, kf, kv_s, krow, acol, qb, lane, DP, DT)  # S^T = K Q^T
            key_softmax(s, m, l, o, masked, t * BN + kpart * KW, limit, lane, scale_log2, DP)
            probs_as_b(pb, s, lane, DT)
            key_values(o, pb, kv_s, krow + BN, bcol, lane, DP, DT)  # O^T += V^T P^T
        else:
            if not QREG:
                load_a(qf, q_s, mtile * 16, acol, lane, 0, DP, DT)
            dot_rows_at(s, qf, kv_s, krow, bcol, lane, KW // 8, 0, DP, DT)  # S = Q K^T
            masked_softmax(s, m, l, o, masked, t * BN + kpart * KW, limit, lane, scale_log2, KW, DP)
            acc_rows_at(o, s, kv_s, krow + BN, acol, lane, KW // 8, DP, DT)  # O += P V
        if OWN:  # this warp's rows of the stage are free (its next copies into them may
            kaio.sync_warp()  # land as soon as issued: after every lane's reads of them)
        elif not SYNC1:
            kaio.sync_threads()  # this stage is free

    # the warps' partial results, relative to their own maxima, through shared memory (the
    # columns of row r XOR-ed with r % 4 * 8: a store's 8 rows x 4 column pairs fall on 16
    # banks, not 4)
    kaio.cp_async_wait_all()
    kaio.sync_threads()
    # (only the chunk's real rows: a K/V group of 4 heads and one new token fills 4 of 16)
    if SWAP:
        store_key_partials(red_o, red_ml, o, m, l, warp, lane, nrows - row0, DP)
    else:
        for h in kaio.static_range(2):
            r = warp * 16 + g + 8 * h
            total = l[h] + kaio.shfl_xor(l[h], 1)
            total += kaio.shfl_xor(total, 2)
            if row0 + mtile * 16 + g + 8 * h < nrows:
                if lane % 4 == 0:
                    red_ml[0, r] = m[h]
                    red_ml[1, r] = total
                for n in kaio.static_range(DP // 8):
                    for e in kaio.static_range(2):
                        red_o[r, (n * 8 + lane % 4 * 2 + e) ^ r % 4 * 8] = o[n, 2 * h + e]
    kaio.sync_threads()
    # CL > 1: this block's merged rows, read by the cluster (after red_o; over Q)
    mine_o = kaio.shared_dynamic(f32, (ROWS, DP), WARPS * 16 * DP * 4)
    mine_lse = kaio.shared_dynamic(f32, (ROWS,), 2 * STAGES * BN * DP * 2)
    items = kaio.min(ROWS, nrows - row0) * (DP // 4)  # the chunk's real rows, 4 columns each
    merge_warps(
        red_o, red_ml, out, lse, part, part_lse, mine_o, mine_lse, items, q_row0 + row0,
        split * total_rows, tid, DP, MT, DIRECT, CL, DT,
    )  # fmt: skip
    if CL > 1 and not DIRECT:
        kaio.cluster_sync()
        cluster_merge(
            mine_o, mine_lse, out, lse, q_row0 + row0, kaio.min(ROWS, nrows - row0), split,
            tid, DP, CL, DT,
        )  # fmt: skip
        kaio.cluster_sync()  # no block leaves while others read its shared memory
    if FUSED and not DIRECT and CL == 1:
        # the last block of this row chunk merges the splits (fence, then count: the
        # partial results of every block counted are visible to the one that counts last)
        kaio.threadfence()
        kaio.sync_threads()
        slot = kaio.block_idx_y()
        if tid == 0:
            last = kaio.atomic_add(counters, slot, u32(1)) == splits - 1
            if last:
                counters[slot] = u32(0)  # ready for the next call (or graph replay)
            red_ml[0, 0] = kaio.select(last, 1.0, 0.0)
        kaio.sync_threads()
        if red_ml[0, 0] == 1.0:
            kaio.threadfence()
            w_s = kaio.shared_dynamic(f32, (MAX_SPLITS, ROWS), 0)  # over kv_s, now free
            merge_chunk(
                part, part_lse, out, lse, w_s, q_row0 + row0, kaio.min(ROWS, nrows - row0),
                total_rows, splits, tid, DP, ROWS, DT,
            )  # fmt: skip


@kaio.gpu_func
def fold_length(lens: u32[:], f: u32, FOLD: kaio.constexpr) -> u32:
    """lens[f] (f < FOLD; a select chain, no indexed local memory)."""
    length = lens[0]
    for e in kaio.static_range(1, FOLD):
        length = kaio.select(f == e, lens[e], length)
    return length


@kaio.gpu_func
def pair_by_length(
    seqs: u32[:],
    seq_lens: i32[:],
    p: u32,
    batch: u32,
    capacity: u32,
    tid: u32,
    buf: u32[:],
    PAIR: kaio.constexpr,
):
    """seqs = the sequences of the p-th longest and the p-th shortest length (batch where
    there is none; ranks by length, ties by index: uniform lengths give p and batch - 1 -
    p): every thread ranks its sequences against all the lengths in ``buf`` (the block's
    threads all take part; ``buf`` free again on return)."""
    for j in kaio.static_range((PAIR + THREADS - 1) // THREADS):  # buf: the lengths
        i = tid + j * THREADS
        if i < PAIR:
            n = seq_lens[kaio.min(i, batch - 1)]
            buf[i] = u32(kaio.min(kaio.max(n, 0), i32(capacity)))
    kaio.sync_threads()
    for j in kaio.static_range((PAIR + THREADS - 1) // THREADS):  # buf[PAIR + rank]: its sequence
        i = tid + j * THREADS
        if i < batch:
            mine = buf[i]
            rank = u32(0)
            for other in kaio.static_range(PAIR):  # (unrolled: the loads overlap)
                x = buf[other]
                ahead = other < batch and (x > mine or x == mine and other < i)
                rank += kaio.select(ahead, u32(1), u32(0))
            buf[PAIR + rank] = i
    kaio.sync_threads()
    seqs[0] = buf[PAIR + p]
    seqs[1] = kaio.select(batch - 1 - p > p, buf[PAIR + batch - 1 - p], batch)
    kaio.sync_threads()  # (buf is the sort's next)


@kaio.gpu_func
def fold_loads(
    q_s: DT[:, :],
    entry: u32[:],
    q: DT[:],
    block_table: i32[:],
    seqs: u32[:],
    batch: u32,
    heads: u32,
    group: u32,
    sq: u32,
    kvh: u32,
    max_pages: u32,
    tid: u32,
    DP: kaio.constexpr,
    FOLD: kaio.constexpr,
    SORT: kaio.constexpr,
    DT: kaio.constexpr,
):
    """``decode_folded``'s first loads for sequences ``seqs``: the query tile (row f *
    nrows + r is row r of sequence seqs[f]'s group, zeros past; one cp.async group) and
    this thread's SORT / THREADS table slots of the FOLD table rows into ``entry``."""
    nrows = group * sq
    for j in kaio.static_range(16 * (DP // 8) // THREADS):
        piece = tid + j * THREADS
        r = piece // (DP // 8)
        col = piece % (DP // 8) * 8
        b = fold_length(seqs, r // nrows, FOLD)
        real = r < FOLD * nrows and b < batch
        at = ((b * heads + kvh * group) * sq + r % nrows) * DP + col
        index = kaio.select(real, at, 0)
        kaio.cp_async(q_s, (r, kaio.swizzle(q_s, r, col)), q, index, 16, kaio.select(real, 16, 0))
    kaio.cp_async_commit()
    R = SORT // THREADS
    lane = tid % 32
    for e in kaio.static_range(R):
        slot = tid // 32 * 32 * R + 32 * e + lane
        row = kaio.min(fold_length(seqs, slot // max_pages, FOLD), batch - 1)
        entry[e] = table_at(block_table, row, slot % max_pages, max_pages)


@kaio.gpu_func
def copy_folded(
    kv_s: DT[:, :],
    row0: u32,
    k: DT[:],
    v: DT[:],
    key0: u32,
    sort_s: u32[:],
    n_valid: u32,
    lens: u32[:],
    kvh: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    DP: kaio.constexpr,
    FOLD: kaio.constexpr,
    SORT: kaio.constexpr,
    DT: kaio.constexpr,
):
    """``load_stage`` of ``decode_folded``'s walk keys key0 .. key0 + BN into the stage at
    row row0: walk key w lies in the page of sorted entry w >> shift (a pool page above
    FOLD_BITS of sequence f << SB | table slot s), at position s << shift | w's offset;
    zeros past the n_valid entries or past lens[f] (a masked key multiplies finite
    values)."""
    SB = 9
    PIECES = DP // 8
    STEP = THREADS // PIECES
    r0 = tid // PIECES
    col = tid % PIECES * 8
    for i in kaio.static_range(BN // STEP):
        r = r0 + i * STEP
        w = key0 + r
        entry = sort_s[kaio.min(w >> shift, u32(SORT - 1))]
        pos = (entry & (u32(1) << SB) - 1) << shift | w & (u32(1) << shift) - 1
        seq = (entry & (u32(1) << FOLD_BITS) - 1) >> SB
        ok = w >> shift < n_valid and pos < fold_length(lens, seq, FOLD)
        at = paged_row(entry >> FOLD_BITS, w, kvh, kv_heads, shift, pages, DP)
        index = kaio.select(ok, at + col, 0)
        nbytes = kaio.select(ok, 16, 0)
        swizzled = kaio.swizzle(kv_s, r0 + i * STEP % 8, col)
        kaio.cp_async(kv_s, (row0 + r, swizzled), k, index, 16, nbytes)
        kaio.cp_async(kv_s, (row0 + BN + r, swizzled), v, index, 16, nbytes)


@kaio.gpu_func
def copy_firsts(
    kv_s: DT[:, :],
    k: DT[:],
    v: DT[:],
    block_table: i32[:],
    seqs: u32[:],
    lens: u32[:],
    batch: u32,
    kvh: u32,
    capacity: u32,
    max_pages: u32,
    kv_heads: u32,
    shift: u32,
    pages: u32,
    tid: u32,
    DP: kaio.constexpr,
    FOLD: kaio.constexpr,
    SPECT: kaio.constexpr,
    DT: kaio.constexpr,
):
    """``decode_folded``'s SPEC copies: tile j < SPECT (stage j, one cp.async group each)
    the keys (j // FOLD) * BN .. + BN of sequence seqs[j % FOLD] (zeros past its length)."""
    pg = kaio.local(u32, (1, BN // (THREADS // (DP // 8))))
    for j in kaio.static_range(SPECT):
        row = kaio.min(seqs[j % FOLD], batch - 1)
        key0 = u32(j // FOLD * BN)
        page_ids(pg, 0, key0, lens[j % FOLD], row, block_table, max_pages, shift, tid, DP)
        load_stage(
            kv_s, j * 2 * BN, k, v, key0, lens[j % FOLD], row, kvh, pg, 0, capacity, kv_heads,
            shift, pages, tid, DP, True, DT,
        )  # fmt: skip
        kaio.cp_async_commit()


@kaio.gpu_kernel
def decode_folded(
    q: DT[:],
    k: DT[:],
    v: DT[:],
    block_table: i32[:],
    seq_lens: i32[:],
    out: DT[:],
    lse: f32[:],
    batch: u32,
    heads: u32,
    group: u32,
    sq: u32,
    kv_heads: u32,
    capacity: u32,
    max_pages: u32,
    shift: u32,
    pages: u32,
    scale_log2: f32,
    DP: kaio.constexpr,
    STAGES: kaio.constexpr,
    FOLD: kaio.constexpr,
    SORT: kaio.constexpr,
    PAIR: kaio.constexpr,
    SPEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    """Attention of the 4 query rows of one K/V group (head ``block y % kv_heads``) of
    each of FOLD (2) sequences: 8 rows, the mma's N, the keys in M as ``decode_fwd``'s
    SWAP (D up to 128), over the union of their pages of a paged cache, walked in pool
    order (the FOLD table rows' used slots sorted by page, ``sort_keys``: SORT >= FOLD *
    max_pages keys, each a pool page above FOLD_BITS of f << SB | slot): a block's
    neighbouring pages lie FOLD times closer than one sequence's, and FOLD times fewer
    blocks take the batch (B = 64 with 8 K/V heads: one wave). A key is seen by its own
    sequence's rows up to their causal limit (a page is one warp's 16 keys of a tile: one
    sequence a warp); rows past a length are zeros in shared memory. One split: writes
    out / lse, no merge. STAGES K/V stages, one barrier a tile (``decode_fwd``'s SYNC1
    loop). PAIR (batch <= PAIR): block y // kv_heads = p takes the sequences of the p-th
    longest and p-th shortest length (ranks by length, ties by index, from all lengths in
    shared memory), so that ragged batches give every block about the same keys; else
    sequences 2p and 2p + 1. SPEC: the first SPECT tiles (the most of the first STAGES - 1
    that give each sequence as many) are each sequence's first keys in turn (tile j:
    sequence j % FOLD's keys (j // FOLD) * BN on), copied once the lengths are known but
    before the sort, so that the sort runs while they are in flight; the walk in pool
    order takes the other table slots."""
    kaio.launch_bounds(THREADS, 3)
    SPECT = (STAGES - 1) // FOLD * FOLD * SPEC  # tiles copied before the sort
    SB = 9  # a sort key's bits of table slot, under its sequence's
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    warp = tid // 32
    kvh = kaio.block_idx_y() % kv_heads
    nrows = group * sq  # 4 (the route's condition), a sequence's rows of the group
    kv_s = kaio.shared_dynamic(DT, (2 * STAGES * BN, DP), 0)  # K0, V0, K1, V1, ...
    q_s = kaio.shared_dynamic(DT, (16, DP), 2 * STAGES * BN * DP * 2)
    ml_at = (2 * STAGES * BN + 16) * DP * 2
    sort_s = kaio.shared_dynamic(u32, (SORT,), ml_at + 2 * WARPS * 16 * 4)
    # the block's sequences (batch: none): 2p and 2p + 1, or with PAIR p and batch - 1 - p
    # (uniform lengths' pairs by length, loaded at once) until the ranks tell
    p = kaio.block_idx_y() // kv_heads
    seqs = kaio.local(u32, FOLD)
    for f in kaio.static_range(FOLD):
        seqs[f] = kaio.min(p * FOLD + f, batch)
    if PAIR:
        seqs[0] = p
        seqs[1] = kaio.select(batch - 1 - p > p, batch - 1 - p, batch)
    R = SORT // THREADS
    entry = kaio.local(u32, R)  # this thread's table slots, then sort keys
    fold_loads(
        q_s, entry, q, block_table, seqs, batch, heads, group, sq, kvh, max_pages, tid, DP,
        FOLD, SORT, DT,
    )  # fmt: skip
    if PAIR:
        paired = kaio.local(u32, FOLD)
        pair_by_length(paired, seq_lens, p, batch, capacity, tid, sort_s, PAIR)
        if paired[0] != seqs[0] or paired[1] != seqs[1]:  # (uniform over the block)
            kaio.cp_async_wait_all()  # (this thread's query copies: the same pieces again)
            for f in kaio.static_range(FOLD):
                seqs[f] = paired[f]
            fold_loads(
                q_s, entry, q, block_table, seqs, batch, heads, group, sq, kvh, max_pages,
                tid, DP, FOLD, SORT, DT,
            )  # fmt: skip
    lens = kaio.local(u32, FOLD)
    n_valid = u32(0)  # the walk's table slots
    for f in kaio.static_range(FOLD):
        n = kaio.select(seqs[f] < batch, seq_lens[kaio.min(seqs[f], batch - 1)], 0)
        lens[f] = u32(kaio.min(kaio.max(n, 0), i32(capacity)))
        n_valid += lens[f] + (u32(1) << shift) - 1 >> shift
    spec_slots = u32(0)  # SPEC: a sequence's table slots in its first tiles
    if SPEC:
        spec_slots = u32(SPECT // FOLD * BN) >> shift
        n_valid = u32(0)
        for f in kaio.static_range(FOLD):
            need = lens[f] + (u32(1) << shift) - 1 >> shift
            n_valid += need - kaio.min(need, spec_slots)
        copy_firsts(
            kv_s, k, v, block_table, seqs, lens, batch, kvh, capacity, max_pages, kv_heads,
            shift, pages, tid, DP, FOLD, SPECT, DT,
        )  # fmt: skip
    for e in kaio.static_range(R):
        slot = warp * 32 * R + 32 * e + lane
        seq = slot // max_pages
        need = fold_length(lens, seq, FOLD) + (u32(1) << shift) - 1 >> shift
        used = seq < FOLD and slot % max_pages < need
        if SPEC:
            used = used and slot % max_pages >= spec_slots
        key = kaio.min(entry[e], pages - 1) << FOLD_BITS | seq << SB | slot % max_pages
        entry[e] = kaio.select(used, key, u32(PAD))
    sort_keys(entry, sort_s, lane, warp, SORT)
    kaio.sync_threads()  # the sorted keys, for every thread's copies
    count = ((n_valid << shift) + BN - 1) // BN  # the key tiles
    if SPEC:
        count += SPECT
    for j in kaio.static_range(SPECT, STAGES - 1):  # tiles 0 .. STAGES - 2 in flight
        if j < count:
            copy_folded(
                kv_s, j * 2 * BN, k, v, (j - SPECT) * BN, sort_s, n_valid, lens, kvh, kv_heads,
                shift, pages, tid, DP, FOLD, SORT, DT,
            )  # fmt: skip
        kaio.cp_async_commit()
    kaio.cp_async_wait(STAGES - 1)  # Q has landed
    kaio.sync_threads()

    acol = kaio.local(u32, 4)
    bcol = kaio.local(u32, 4)
    m = kaio.local(f32, 2)  # of this lane's query columns
    l = kaio.local(f32, 2)
    o = kaio.local(f32, (DP // 16, 4))
    frag_columns(acol, bcol, q_s, lane, DT)
    qb = kaio.local(u32, (DP // 16, 2))  # Q^T's B fragments (query rows 0 .. 7)
    load_b(qb, q_s, bcol, lane, DP, DT)
    start_rows(m, l, o, DP // 2)
    limit = kaio.local(i32, 2)  # a column's keys < limit are visible (causal) ...
    mine = kaio.local(u32, 2)  # ... of its sequence
    for e in kaio.static_range(2):
        c = lane % 4 * 2 + e
        mine[e] = c // nrows
        limit[e] = i32(fold_length(lens, mine[e], FOLD)) - i32(sq) + i32(c % nrows % sq) + 1
    lim = kaio.local(i32, 2)
    s = kaio.local(f32, (2, 4))
    kf = kaio.local(u32, (DP // 16, 4))  # SWAP: K's A fragments
    pb = kaio.local(u32, (1, 2))  # SWAP: P^T's B fragment
    for i in range(count):
        stage = i % STAGES * 2 * BN
        kaio.cp_async_wait(STAGES - 2)  # tile i has landed
        kaio.sync_threads()  # (and every warp is past tile i - 1)
        if i + STAGES - 1 < count:  # into the stage tile i - 1 used
            into = (i + STAGES - 1) % STAGES * 2 * BN
            walked = i + STAGES - 1  # the walk's tile (SPEC: after the first SPECT)
            if SPEC:
                walked -= SPECT
            copy_folded(
                kv_s, into, k, v, walked * BN, sort_s, n_valid, lens, kvh, kv_heads, shift,
                pages, tid, DP, FOLD, SORT, DT,
            )  # fmt: skip
        kaio.cp_async_commit()
        # this warp's 16 keys: one page, of sequence seq from position key0 on
        if SPEC:  # (the first tiles', then the walk's: at wraps there, its entry unused)
            at = (i - SPECT) * (BN >> shift) + warp
            got = sort_s[kaio.min(at, u32(SORT - 1))]
            first = i < SPECT
            seq = kaio.select(first, i % FOLD, (got & (u32(1) << FOLD_BITS) - 1) >> SB)
            key0 = (got & (u32(1) << SB) - 1) << shift
            key0 = kaio.select(first, i // FOLD * BN + warp * 16, key0)
            for e in kaio.static_range(2):
                ours = (first or at < n_valid) and seq == mine[e]
                lim[e] = kaio.select(ours, limit[e], i32(0))
        else:
            at = i * (BN >> shift) + warp
            got = sort_s[kaio.min(at, u32(SORT - 1))]
            for e in kaio.static_range(2):
                ours = at < n_valid and (got & (u32(1) << FOLD_BITS) - 1) >> SB == mine[e]
                lim[e] = kaio.select(ours, limit[e], i32(0))
        krow = stage + warp * 16
        if not SPEC:
            key0 = (got & (u32(1) << SB) - 1) << shift
        key_scores(s, kf, kv_s, krow, acol, qb, lane, DP, DT)  # S^T = K Q^T
        key_softmax(s, m, l, o, True, key0, lim, lane, scale_log2, DP)
        probs_as_b(pb, s, lane, DT)
        key_values(o, pb, kv_s, krow + BN, bcol, lane, DP, DT)  # O^T += V^T P^T

    kaio.cp_async_wait_all()
    kaio.sync_threads()
    red_o = kaio.shared_dynamic(f32, (WARPS * 16, DP), 0)  # over kv_s
    red_ml = kaio.shared_dynamic(f32, (2, WARPS * 16), ml_at)
    store_key_partials(red_o, red_ml, o, m, l, warp, lane, FOLD * nrows, DP)
    kaio.sync_threads()
    for f in kaio.static_range(FOLD):  # sequence f's rows: rows f * nrows on of the partials
        o_f = kaio.shared_dynamic(f32, (WARPS * 16, DP), f * 4 * DP * 4)
        ml_f = kaio.shared_dynamic(f32, (2, WARPS * 16), ml_at + f * 4 * 4)
        items = kaio.select(seqs[f] < batch, nrows * (DP // 4), 0)
        at0 = (seqs[f] * heads + kvh * group) * sq
        merge_warps(o_f, ml_f, out, lse, lse, lse, o_f, lse, items, at0, 0, tid, DP, 1, True, 1, DT)


@kaio.gpu_kernel
def decode_pages(
    q: DT[:],
    k: DT[:],
    v: DT[:],
    seq_lens: i32[:],
    block_table: i32[:],
    out: DT[:],
    lse: f32[:],
    part: f32[:],
    part_lse: f32[:],
    heads: u32,
    group: u32,
    sq: u32,
    max_pages: u32,
    shift: u32,
    pages: u32,
    total_rows: u32,
    scale_log2: f32,
    HKV: kaio.constexpr,
    DP: kaio.constexpr,
    STAGES: kaio.constexpr,
    DIRECT: kaio.constexpr,
    DT: kaio.constexpr,
    SPEC: kaio.constexpr,
):
    """``decode_fwd`` over a paged cache for a block that owns a (key split ``block x``,
    sequence ``block y``) and all HKV K/V heads of it: it reads whole 16-key runs of pages
    (``load_pages``: every head's rows, contiguous in a page), not one head's rows of each.
    Warp h is K/V head h, the ``group * sq`` (<= 16) query rows of its group the M rows of
    its m16n8k16 tiles, over 16 keys a stage (STAGES in flight). The split's 16-key tiles
    follow the length (read on the GPU), evenly; with ``SPEC`` the capacity's (a block past
    the length does nothing), so that its first pages and copies are in flight before the
    length is read (V's rows past the length zeroed in shared memory once it is known; K's
    scores there are masked). ``DIRECT`` (one split): out / lse; else part / part_lse,
    merged by ``decode_merge`` (a block a K/V group) in split order (deterministic). The
    pages of the first STAGES - 1 tiles are loaded at once, the later ones come from a
    window of the block table held across each warp's lanes (``window_page``). Not routed
    by default (``decode.WHOLE_PAGES``): measured no faster than ``decode_fwd``, see
    docs/performance.md, "Decode attention over pages, fourth pass"."""
    NT = 32 * HKV
    KV_ROWS = 2 * HKV * 16  # a stage: K rows of every head, then V rows
    kaio.launch_bounds(NT, 1)
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    warp = tid // 32
    g = lane // 4
    split = kaio.block_idx_x()
    splits = kaio.grid_dim_x()
    b = kaio.block_idx_y()
    nrows = group * sq
    kv_s = kaio.shared_dynamic(DT, (STAGES * KV_ROWS, DP), 0)
    # Q of every head (head h's rows at 16 h) over the last stage, which the prologue leaves
    q_row = (STAGES - 1) * KV_ROWS
    PIECES = DP // 8
    for i in kaio.static_range(HKV * 16 * PIECES // NT):
        c = tid + i * NT
        r = c // PIECES
        col = c % PIECES * 8
        inside = r % 16 < nrows
        at = ((b * heads + r // 16 * group) * sq + r % 16) * DP + col
        swizzled = kaio.swizzle(kv_s, r, col)
        kaio.cp_async(
            kv_s, (q_row + r, swizzled), q, kaio.select(inside, at, 0), 16,
            kaio.select(inside, 16, 0),
        )  # fmt: skip
    kaio.cp_async_commit()
    capacity = max_pages << shift
    row_b = b * max_pages
    pre = kaio.local(u32, STAGES - 1)  # the pages of the first tiles
    win = kaio.local(u32, 3)  # the block table from the next tile's page on (window_start)
    if SPEC:  # the capacity's tiles split evenly: the first copies need no length
        per = (capacity // 16 + splits - 1) // splits
        t0 = kaio.min(split * per, capacity // 16)
        first_pages(pre, t0, row_b, block_table, max_pages, shift, STAGES)
        window_start(win, (t0 + STAGES - 1) * 16, b, block_table, max_pages, shift, lane)
        for j in kaio.static_range(STAGES - 1):
            if t0 + j < kaio.min(t0 + per, capacity // 16):
                load_pages(
                    kv_s, j * KV_ROWS, k, v, pre[j], (t0 + j) * 16, capacity, shift, pages, tid,
                    NT, HKV, DP, DT,
                )  # fmt: skip
            kaio.cp_async_commit()
        kv_len = u32(kaio.min(kaio.max(seq_lens[b], 0), i32(capacity)))
        t1 = kaio.min(t0 + per, (kv_len + 15) // 16)  # under t0 past the length: no tile
    else:  # the length's tiles split evenly
        kv_len = u32(kaio.min(kaio.max(seq_lens[b], 0), i32(capacity)))
        n_total = (kv_len + 15) // 16
        per = (n_total + splits - 1) // splits
        t0 = kaio.min(split * per, n_total)
        t1 = kaio.min(t0 + per, n_total)
        first_pages(pre, t0, row_b, block_table, max_pages, shift, STAGES)
        window_start(win, (t0 + STAGES - 1) * 16, b, block_table, max_pages, shift, lane)
        for j in kaio.static_range(STAGES - 1):
            if t0 + j < t1:
                load_pages(
                    kv_s, j * KV_ROWS, k, v, pre[j], (t0 + j) * 16, kv_len, shift, pages, tid,
                    NT, HKV, DP, DT,
                )  # fmt: skip
            kaio.cp_async_commit()
    kaio.cp_async_wait(STAGES - 1)  # Q has landed
    kaio.sync_threads()
    m = kaio.local(f32, 2)  # the warp's rows' online softmax: max, sum, output
    l = kaio.local(f32, 2)
    o = kaio.local(f32, (DP // 8, 4))
    start_rows(m, l, o, DP)
    acol = kaio.local(u32, 4)
    bcol = kaio.local(u32, 4)
    frag_columns(acol, bcol, kv_s, lane, DT)
    qf = kaio.local(u32, (DP // 16, 4))
    load_a(qf, kv_s, q_row + warp * 16, acol, lane, 0, DP, DT)
    kaio.sync_threads()  # every warp has its Q: the last stage is free
    limit = kaio.local(i32, 2)  # keys < limit are visible to the row (causal)
    for h in kaio.static_range(2):
        limit[h] = i32(kv_len) - i32(sq) + i32((g + 8 * h) % sq) + 1
    s = kaio.local(f32, (2, 4))
    for t in range(t0, t1):
        stage = (t - t0) % STAGES * KV_ROWS
        if t + STAGES - 1 < t1:  # into the stage tile t - 1 used
            key0 = (t + STAGES - 1) * 16
            page = window_page(win, key0, b, block_table, max_pages, shift, lane)
            load_pages(
                kv_s, (t - t0 + STAGES - 1) % STAGES * KV_ROWS, k, v, page, key0, kv_len, shift,
                pages, tid, NT, HKV, DP, DT,
            )  # fmt: skip
        kaio.cp_async_commit()
        kaio.cp_async_wait(STAGES - 1)  # tile t has landed
        kaio.sync_threads()
        if SPEC:
            if t < t0 + STAGES - 1 and (t + 1) * 16 > kv_len:  # copied before the length
                for idx in range(tid, HKV * 16 * DP, NT):  # V's rows past it: zeros
                    if t * 16 + idx // DP % 16 >= kv_len:
                        kv_s[stage + HKV * 16 + idx // DP, idx % DP] = DT(0.0)
                kaio.sync_threads()
        krow = stage + warp * 16
        dot_rows_at(s, qf, kv_s, krow, bcol, lane, 2, 0, DP, DT)  # S = Q K^T
        masked = i32((t + 1) * 16) + i32(sq) > i32(kv_len) + 1
        masked_softmax(s, m, l, o, masked, t * 16, limit, lane, scale_log2, 16, DP)
        acc_rows_at(o, s, kv_s, krow + HKV * 16, acol, lane, 2, DP, DT)  # O += P V
        kaio.sync_threads()  # this stage is free
    kaio.cp_async_wait_all()
    q_row0 = (b * heads + warp * group) * sq  # this warp's first query row
    for h in kaio.static_range(2):
        total = l[h] + kaio.shfl_xor(l[h], 1)
        total += kaio.shfl_xor(total, 2)
        inv = kaio.select(total > 0.0, 1.0 / total, 0.0)
        best = kaio.select(total > 0.0, m[h] + kaio.log2(total), NEG_INF)
        rr = g + 8 * h
        if rr < nrows:
            at = q_row0 + rr
            if DIRECT:
                store_rows(out, at * DP, o, h, inv, lane, DP, DT)
                if lane % 4 == 0:
                    lse[at] = best * LN2
            else:
                store_rows(part, (split * total_rows + at) * DP, o, h, inv, lane, DP, f32)
                if lane % 4 == 0:
                    part_lse[(split * total_rows + at) * LSE_STRIDE] = best


@kaio.gpu_func
def load_b(qb: u32[:, :], q_s: DT[:, :], bcol: u32[:], lane: u32, DP: kaio.constexpr,
           DT: kaio.constexpr):  # fmt: skip
    """qb[kk] = the B fragment (k-step kk < DP / 16, n = rows 0 .. 7) of the swizzled tile
    q_s, rows as the ``col`` operand [n, k] (ldmatrix .x2 without .trans)."""
    for kk in kaio.static_range(DP // 16):
        row = lane // 16 * 8 + lane % 8
        kaio.ldmatrix(qb[kk], q_s, (row, kk // 4 * 64 + bcol[kk % 4]))


@kaio.gpu_func
def key_scores(
    st: f32[:, :], kf: u32[:, :], kv_s: DT[:, :], krow: u32, acol: u32[:], qb: u32[:, :],
    lane: u32, DP: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """st[0] = S^T = K Q^T for the 16 keys of rows krow .. krow + 15 of kv_s (M) and the 8
    query rows of qb (N): lane (g, t) holds keys g and g + 8, query rows 2t and 2t + 1."""
    load_a(kf, kv_s, krow, acol, lane, 0, DP, DT)
    for e in kaio.static_range(4):
        st[0, e] = 0.0
    for kk in kaio.static_range(DP // 16):
        mma(st, 0, kf, kk, qb, kk, DT)


@kaio.gpu_func
def key_softmax(
    st: f32[:, :], m: f32[:], l: f32[:], o: f32[:, :], masked: bool_, key0: u32,
    limit: i32[:], lane: u32, scale_log2: f32, DP: kaio.constexpr,
):  # fmt: skip
    """The online softmax step of this lane's query columns e (row 2t + e) over the 16 keys
    key0 .. key0 + 15 of S^T (``key_scores``), where ``masked`` the keys at or past a
    column's ``limit`` first set to -inf: a column's maximum over the lane groups (3
    shuffles), st replaced by the probabilities, l[e] this lane's part of the column's sum
    (its two keys; summed over the lanes at the end) and the accumulators O^T (``o``: d
    rows 16 mi + g, + 8) of the column rescaled."""
    for e in kaio.static_range(2):
        if masked:
            for h in kaio.static_range(2):
                ok = i32(key0 + lane // 4 + 8 * h) < limit[e]
                st[0, 2 * h + e] = kaio.select(ok, st[0, 2 * h + e], NEG_INF)
        top = kaio.max(st[0, e], st[0, 2 + e])
        for step in kaio.static_range(3):
            top = kaio.max(top, kaio.shfl_xor(top, 4 << step))
        m_new = kaio.max(m[e], top * scale_log2)
        base = kaio.select(m_new == NEG_INF, 0.0, m_new)
        alpha = kaio.exp2(m[e] - base)
        m[e] = m_new
        for h in kaio.static_range(2):
            st[0, 2 * h + e] = kaio.exp2(kaio.fma(st[0, 2 * h + e], scale_log2, -base))
        l[e] = l[e] * alpha + st[0, e] + st[0, 2 + e]
        for mi in kaio.static_range(DP // 16):
            for h in kaio.static_range(2):
                o[mi, 2 * h + e] = o[mi, 2 * h + e] * alpha


@kaio.gpu_func
def probs_as_b(pb: u32[:, :], st: f32[:, :], lane: u32, DT: kaio.constexpr):
    """pb[0] = P^T as the B fragment of the next mma (k = the 16 keys, n = the 8 query
    rows) from the probabilities st[0] in the accumulator layout (M = keys): each 8 x 8
    half transposed across the lanes. Lane (g, t) wants keys 2t, 2t + 1 (+ 8) of query row
    g, which lanes 8t + g // 2 and 8t + 4 + g // 2 hold in the half g % 2 of a DT pair."""
    src = lane % 4 * 8 + lane // 8
    halves = kaio.select(lane // 4 % 2 == 0, u32(0x5410), u32(0x7632))
    for h in kaio.static_range(2):
        pair = pack(st[0, 2 * h], st[0, 2 * h + 1], DT)  # key g (+ 8), rows 2t, 2t + 1
        lo = kaio.shfl_idx(pair, src)
        hi = kaio.shfl_idx(pair, src + 4)
        pb[0, h] = kaio.prmt(lo, hi, halves)


@kaio.gpu_func
def key_values(
    o: f32[:, :], pb: u32[:, :], kv_s: DT[:, :], vrow: u32, bcol: u32[:], lane: u32,
    DP: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """o[mi] += V^T P^T for the head-dim rows 16 mi .. 16 mi + 15 (M): A = the 16 value
    rows vrow .. vrow + 15 of kv_s read transposed (ldmatrix .trans), B = P^T (pb)."""
    va = kaio.local(u32, (1, 4))
    for mi in kaio.static_range(DP // 16):
        row = vrow + lane // 16 * 8 + lane % 8
        kaio.ldmatrix_trans(va[0], kv_s, (row, mi // 4 * 64 + bcol[mi % 4]))
        mma(o, mi, va, 0, pb, 0, DT)


@kaio.gpu_func
def store_key_partials(
    red_o: f32[:, :], red_ml: f32[:, :], o: f32[:, :], m: f32[:], l: f32[:], warp: u32,
    lane: u32, nreal: u32, DP: kaio.constexpr,
):  # fmt: skip
    """A ``SWAP`` warp's partial results (O^T in ``o``, relative to the maxima m) of its
    real query rows (< nreal) into rows warp * 16 + row of red_o (columns XOR-ed with the
    row % 4 * 8, as the merge reads them) and red_ml (max, sum over the lanes)."""
    for e in kaio.static_range(2):
        total = l[e] + kaio.shfl_xor(l[e], 4)
        total += kaio.shfl_xor(total, 8)
        total += kaio.shfl_xor(total, 16)
        q = lane % 4 * 2 + e
        r = warp * 16 + q
        if q < nreal:
            if lane < 4:
                red_ml[0, r] = m[e]
                red_ml[1, r] = total
            for mi in kaio.static_range(DP // 16):
                for h in kaio.static_range(2):
                    red_o[r, (mi * 16 + lane // 4 + 8 * h) ^ r % 4 * 8] = o[mi, 2 * h + e]


@kaio.gpu_func
def merge_warps(
    red_o: f32[:, :], red_ml: f32[:, :], out: DT[:], lse: f32[:], part: f32[:],
    part_lse: f32[:], mine_o: f32[:, :], mine_lse: f32[:], items: u32, at0: u32,
    part_row0: u32, tid: u32, DP: kaio.constexpr, MT: kaio.constexpr,
    DIRECT: kaio.constexpr, CL: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The warps' partial results (red_o, red_ml: rows (k-part * MT + M-tile) * 16 + row,
    each relative to its own maximum) of the chunk's rows merged, a thread 4 adjacent
    columns of a row an item (``items`` of them): the row's weights once, the partial
    rows in 16-byte loads; written as ``decode_fwd``'s merge writes them (out / lse,
    mine_o / mine_lse for the cluster, or part / part_lse at row part_row0 + row)."""
    KSPLIT = WARPS // MT
    w = kaio.local(f32, KSPLIT)
    buf = kaio.local(f32, 4)
    acc = kaio.local(f32, 4)
    res = kaio.local(DT, 4)
    for it in range(tid, items, THREADS):
        rr = it // (DP // 4)
        c = it % (DP // 4) * 4
        top = NEG_INF
        for kp in kaio.static_range(KSPLIT):
            top = kaio.max(top, red_ml[0, (kp * MT + rr // 16) * 16 + rr % 16])
        base = kaio.select(top == NEG_INF, 0.0, top)
        den = 0.0
        for kp in kaio.static_range(KSPLIT):
            r = (kp * MT + rr // 16) * 16 + rr % 16
            w[kp] = kaio.exp2(red_ml[0, r] - base)
            den += red_ml[1, r] * w[kp]
        for e in kaio.static_range(4):
            acc[e] = 0.0
        for kp in kaio.static_range(KSPLIT):
            r = (kp * MT + rr // 16) * 16 + rr % 16
            kaio.load_vector(buf, red_o, (r, c ^ r % 4 * 8))
            for e in kaio.static_range(4):
                acc[e] += buf[e] * w[kp]
        inv = kaio.select(den > 0.0, 1.0 / den, 0.0)
        best = kaio.select(den > 0.0, base + kaio.log2(den), NEG_INF)
        for e in kaio.static_range(4):
            acc[e] = acc[e] * inv
        if DIRECT:
            for e in kaio.static_range(4):
                res[e] = DT(acc[e])
            kaio.store_vector(out, (at0 + rr) * DP + c, res)
            if c == 0:
                lse[at0 + rr] = best * LN2
        elif CL > 1:
            kaio.store_vector(mine_o, (rr, c), acc)
            if c == 0:
                mine_lse[rr] = best
        else:
            kaio.store_vector(part, (part_row0 + at0 + rr) * DP + c, acc)
            if c == 0:
                part_lse[(part_row0 + at0 + rr) * LSE_STRIDE] = best


@kaio.gpu_func
def masked_softmax(
    s: f32[:, :],
    m: f32[:],
    l: f32[:],
    o: f32[:, :],
    masked: bool_,
    key0: u32,
    limit: i32[:],
    lane: u32,
    scale_log2: f32,
    KW: kaio.constexpr,
    DP: kaio.constexpr,
):
    """The online softmax step of a warp's scores s over its KW keys key0 .. key0 + KW
    (``online_softmax``, both row halves), where ``masked`` (a tile past the length or a new
    token's position) the keys at or past each row half's ``limit`` first set to -inf."""
    for h in kaio.static_range(2):
        if masked:
            for n in kaio.static_range(KW // 8):
                for e in kaio.static_range(2):
                    ok = i32(key0 + n * 8 + lane % 4 * 2 + e) < limit[h]
                    s[n, 2 * h + e] = kaio.select(ok, s[n, 2 * h + e], NEG_INF)
        online_softmax(s, m, l, o, h, scale_log2, KW // 8, DP)


@kaio.gpu_func
def window_page(
    win: u32[:], key0: u32, b: u32, block_table: i32[:], max_pages: u32, shift: u32, lane: u32
) -> u32:
    """The block-table entry of the page of key ``key0`` from the warp's window ``win``
    (``window_start``; keys come in order, a page at most per call): once the page passes
    the window's lower 32 entries the window moves on by 32, loading the entries 32 pages
    ahead of their first use, so the copies never wait for a table load. Every lane of the
    warp takes part (key0 is uniform over the block)."""
    if key0 >> shift >= win[0] + 32:
        win[0] += 32
        win[1] = win[2]
        win[2] = table_at(block_table, b, win[0] + 32 + lane, max_pages)
    return kaio.shfl_idx(win[1], (key0 >> shift) - win[0])


@kaio.gpu_func
def first_pages(
    pre: u32[:],
    t0: u32,
    row_b: u32,
    block_table: i32[:],
    max_pages: u32,
    shift: u32,
    STAGES: kaio.constexpr,
):
    """pre[j]: the block-table entry (row_b is the sequence's row) of the page of 16-key
    tile t0 + j, j < STAGES - 1 (the last entry past the table): loads in flight at once."""
    for j in kaio.static_range(STAGES - 1):
        pre[j] = u32(block_table[row_b + kaio.min((t0 + j) * 16 >> shift, max_pages - 1)])


@kaio.gpu_func
def store_rows(
    dst: OT[:], at: u32, o: f32[:, :], h: kaio.constexpr, factor: f32, lane: u32,
    DP: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """dst[at + col] = o * factor for this lane's columns of accumulator row half h (row
    g + 8h of the warp's 16), two at a time."""
    for n in kaio.static_range(DP // 8):
        pair = kaio.local(OT, 2)
        for e in kaio.static_range(2):
            pair[e] = OT(o[n, 2 * h + e] * factor)
        kaio.store_vector(dst, at + n * 8 + lane % 4 * 2, pair)


@kaio.gpu_func
def merge_chunk(
    part: f32[:],
    part_lse: f32[:],
    out: DT[:],
    lse: f32[:],
    w_s: f32[:, :],
    first: u32,
    nreal: u32,
    rows: u32,
    splits: u32,
    tid: u32,
    DP: kaio.constexpr,
    ROWS: kaio.constexpr,
    DT: kaio.constexpr,
):
    """out / lse of query rows first .. first + nreal (one row chunk, a block of THREADS):
    the splits' partial outputs ``part`` weighted by their share of each row's softmax
    (base-2 logsumexps ``part_lse``), summed in split order (deterministic); lse = the
    natural logsumexp (zeros and -inf for a row that saw no key). Three phases, each a
    handful of memory round trips whatever the split count: the logsumexps into ``w_s``
    [MAX_SPLITS, ROWS] (shared, independent loads), one warp a row turns them into
    normalized weights (lanes over the splits, shuffle reductions), then each thread sums
    4 adjacent columns of one row, UNROLL 16-byte loads in flight. A thread's first 4
    columns of its first PREFETCH splits are loaded before the logsumexps, in flight with
    them: up to 16 splits of a row chunk of up to 16 rows take one round trip, not two."""
    warp = tid // 32
    lane = kaio.lane_id()
    pre = kaio.local(f32, (PREFETCH, 4))
    mine = tid < nreal * (DP // 4)  # this thread has a first item (row, 4 columns)
    for j in kaio.static_range(PREFETCH):
        ok = j < splits and mine
        at = ((j * rows + first + tid // (DP // 4)) * DP) + tid % (DP // 4) * 4
        kaio.load_vector(pre[j], part, kaio.select(ok, at, 0))
    n = splits * nreal
    for i0 in range(tid, n, THREADS * 4):
        for j in kaio.static_range(4):
            i = i0 + j * THREADS
            ok = i < n
            x = part_lse[kaio.select(ok, (i // nreal * rows + first + i % nreal) * LSE_STRIDE, 0)]
            if ok:
                w_s[i // nreal, i % nreal] = x
    kaio.sync_threads()
    for r in range(warp, nreal, WARPS):
        xs = kaio.local(f32, MAX_SPLITS // 32)
        top = NEG_INF
        for j in kaio.static_range(MAX_SPLITS // 32):
            sp = lane + 32 * j
            xs[j] = NEG_INF
            if sp < splits:
                xs[j] = w_s[sp, r]
            top = kaio.max(top, xs[j])
        for step in kaio.static_range(5):
            top = kaio.max(top, kaio.shfl_xor(top, 16 >> step))
        base = kaio.select(top == NEG_INF, 0.0, top)
        den = 0.0
        for j in kaio.static_range(MAX_SPLITS // 32):
            xs[j] = kaio.exp2(xs[j] - base)  # 0 for -inf (no key, or no split)
            den += xs[j]
        for step in kaio.static_range(5):
            den += kaio.shfl_xor(den, 16 >> step)
        inv = kaio.select(den > 0.0, 1.0 / den, 0.0)
        for j in kaio.static_range(MAX_SPLITS // 32):
            sp = lane + 32 * j
            if sp < splits:
                w_s[sp, r] = xs[j] * inv
        if lane == 0:
            lse[first + r] = kaio.select(den > 0.0, (base + kaio.log2(den)) * LN2, NEG_INF)
    kaio.sync_threads()
    buf = kaio.local(f32, (UNROLL, 4))
    acc = kaio.local(f32, 4)
    res = kaio.local(DT, 4)
    for it in range(tid, nreal * (DP // 4), THREADS):
        r = it // (DP // 4)
        c = it % (DP // 4) * 4
        for e in kaio.static_range(4):
            acc[e] = 0.0
        start = u32(0)
        if it == tid:  # the splits prefetched
            for j in kaio.static_range(PREFETCH):
                ok = j < splits
                w = w_s[kaio.select(ok, j, 0), r]
                for e in kaio.static_range(4):
                    acc[e] += kaio.select(ok, w * pre[j, e], 0.0)
            start = PREFETCH
        for sp0 in range(start, splits, UNROLL):
            for j in kaio.static_range(UNROLL):
                ok = sp0 + j < splits
                at = kaio.select(ok, ((sp0 + j) * rows + first + r) * DP + c, 0)
                kaio.load_vector(buf[j], part, at)
            for j in kaio.static_range(UNROLL):
                ok = sp0 + j < splits
                w = w_s[kaio.select(ok, sp0 + j, 0), r]
                for e in kaio.static_range(4):
                    acc[e] += kaio.select(ok, w * buf[j, e], 0.0)
        for e in kaio.static_range(4):
            res[e] = DT(acc[e])
        kaio.store_vector(out, (first + r) * DP + c, res)


@kaio.gpu_func
def cluster_merge(
    mine_o: f32[:, :],
    mine_lse: f32[:],
    out: DT[:],
    lse: f32[:],
    first: u32,
    nreal: u32,
    rank: u32,
    tid: u32,
    DP: kaio.constexpr,
    CL: kaio.constexpr,
    DT: kaio.constexpr,
):
    """out / lse of query rows first .. first + nreal from the CL blocks of this cluster
    (rank = split): each block's normalized partial rows ``mine_o`` and base-2 logsumexps
    ``mine_lse`` in its shared memory, weighted by their share of each row's softmax and
    summed in rank order (deterministic). Block ``rank`` writes the rank-th CL-th of the
    rows' elements, a thread an element."""
    n = nreal * DP
    per = (n + CL - 1) // CL
    lo = rank * per
    xs = kaio.local(f32, CL)
    for i in range(lo + tid, kaio.min(lo + per, n), THREADS):
        r = i // DP
        c = i % DP
        top = NEG_INF
        for sp in kaio.static_range(CL):
            xs[sp] = kaio.cluster_load(mine_lse, r, sp)
            top = kaio.max(top, xs[sp])
        base = kaio.select(top == NEG_INF, 0.0, top)
        den = 0.0
        num = 0.0
        for sp in kaio.static_range(CL):
            w = kaio.exp2(xs[sp] - base)  # 0 for a split that saw no key
            den += w
            num += w * kaio.cluster_load(mine_o, (r, c), sp)
        inv = kaio.select(den > 0.0, 1.0 / den, 0.0)
        out[(first + r) * DP + c] = DT(num * inv)
        if c == 0:
            lse[first + r] = kaio.select(den > 0.0, (base + kaio.log2(den)) * LN2, NEG_INF)


@kaio.gpu_kernel(block_size=THREADS)
def decode_merge(
    part: f32[:],
    part_lse: f32[:],
    out: DT[:],
    lse: f32[:],
    heads: u32,
    group: u32,
    sq: u32,
    kv_heads: u32,
    chunks: u32,
    rows: u32,
    splits: u32,
    DP: kaio.constexpr,
    MT: kaio.constexpr,
    DT: kaio.constexpr,
):
    """``merge_chunk`` for the row chunk of block x (as ``decode_fwd``'s block y): the
    merge of ``decode_fwd`` launched without ``FUSED``."""
    ROWS = 16 * MT
    chunk = kaio.block_idx_x() % chunks
    bkv = kaio.block_idx_x() // chunks
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    row0 = chunk * ROWS
    w_s = kaio.shared_dynamic(f32, (MAX_SPLITS, ROWS), 0)
    merge_chunk(
        part, part_lse, out, lse, w_s, (b * heads + kvh * group) * sq + row0,
        kaio.min(ROWS, group * sq - row0), rows, splits, kaio.thread_idx_x(), DP, ROWS, DT,
    )  # fmt: skip


@kaio.gpu_func
def copy_chunk(dst: DT[:], at: u32, src: DT[:], i: u32, VEC: kaio.constexpr, DT: kaio.constexpr):
    """dst[at : at + VEC] = src[i : i + VEC] (one 16-byte vector when VEC = 8)."""
    buf = kaio.local(DT, VEC)
    if VEC == 1:
        buf[0] = src[i]
        dst[at] = buf[0]
    else:
        kaio.load_vector(buf, src, i)
        kaio.store_vector(dst, at, buf)


@kaio.gpu_kernel(block_size=256)
def kv_append(
    k_cache: DT[:],
    v_cache: DT[:],
    k: DT[:],
    v: DT[:],
    seq_lens: i32[:],
    block_table: i32[:],
    kv_heads: u32,
    sq: u32,
    d: u32,
    capacity: u32,
    max_pages: u32,
    shift: u32,
    pages: u32,
    chunks: u32,
    PAGED: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    """k_cache, v_cache at position seq_lens[b] - sq + j of sequence b, head h =
    k, v [b, h, j] ([B, Hkv, sq, d] flat), VEC elements a thread; positions outside
    0 .. capacity - 1 are skipped."""
    i = kaio.block_idx_x() * 256 + kaio.thread_idx_x()
    if i >= chunks:
        return
    e = i * VEC
    row = e // d
    c = e % d
    j = row % sq
    h = row // sq % kv_heads
    b = row // sq // kv_heads
    pos = seq_lens[b] - i32(sq) + i32(j)
    if pos < 0 or pos >= i32(capacity):
        return
    if PAGED:  # a page outside the pool (a bad table) is not written
        if u32(block_table[b * max_pages + (u32(pos) >> shift)]) >= pages:
            return
    at = cache_row(
        u32(pos), b, h, block_table, capacity, max_pages, kv_heads, shift, pages, d, PAGED
    )
    copy_chunk(k_cache, at + c, k, e, VEC, DT)
    copy_chunk(v_cache, at + c, v, e, VEC, DT)
