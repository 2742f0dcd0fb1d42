"""Decode attention over a KV cache (``flash_attention_decode``) and the cache append
(``kv_cache_append``), contiguous or paged, with sequence lengths read on the GPU.

The kernels are DSL code in ``kaio_ops._decode``; this module checks the inputs, picks the
specialization and the grid, and launches. The grid depends on the shapes (the cache's
capacity) and the GPU's multiprocessor count, never on the lengths' values: the lengths stay
on the GPU, so a decode step captured once in a CUDA graph replays for any lengths up to the
capacity.

Lengths over the capacity (or negative) cannot be checked before the launch on a GPU without
a synchronization: the kernels clamp them to 0 .. capacity (the append skips positions
outside the cache). In the simulator, and on a GPU in debug mode (``KAIO_DEBUG=1``: the
lengths are copied to the host first, which a CUDA graph capture refuses), they raise a
``ValueError``; so do pages outside the pool that a sequence uses (on a GPU outside debug
mode the decode reads such a page as the pool's last one and the append skips it).
"""

from __future__ import annotations

import math

import numpy as np

from kaio.types import bf16, f16, f32, i32, u32
from kaio_ops import _arrays
from kaio_ops import _decode as dk
from kaio_ops._arrays import memory_bandwidth
from kaio_ops._plan import planned

__all__ = ["flash_attention_decode", "flash_attention_decode_with_stats", "kv_cache_append"]

DIMS = (64, 128, 256)  # the head dims of the decode kernel
MAX_NEW = 16  # the most new tokens per sequence (Sq)
MIN_PAGE = 16
BLOCK_SHARED = 163 * 1024  # the most dynamic shared memory of a block on an A100 (sm_80)
MAX_SPLITS = dk.MAX_SPLITS
# the split heuristic's costs, in the time a block takes for one key tile (about 1 us on an
# H200 for D = 128, measured with B = 1 to 64 and 1k to 32k keys): a block's fixed cost, the
# merge's tail (the fence, the count and the last block's merge, when there are several
# splits) and its cost per split
BLOCK_COST = 2
MERGE_TAIL = 2.5
SPLIT_COST = 0.3
FULL = 0.9  # blocks per multiprocessor from which a call takes no split
CLUSTER_MERGE = True  # merge the splits through a thread-block cluster (sm_90)
CLUSTERS = (2, 4, 8, 16)  # the cluster sizes (splits) of the cluster merge
CLUSTER_CHECK = True  # only clusters that all run at once (the driver's occupancy query)
# the cluster merge's blocks ask for this much shared memory at least: over half a
# multiprocessor's (228 KB on sm_90), so that a cluster's blocks take one each
SPREAD = 116 * 1024
CLUSTER_TILES = 64  # the most key tiles a split of the cluster merge takes (measured)
PAGED_CLUSTER_TILES = 16  # the same over a paged cache (measured: ``plan_grid``)
# splits of more than LONG_SPLIT key tiles go through a cluster only where its blocks, one
# a multiprocessor, each streaming SM_STREAM bytes/s, reach STREAM_SHARE of the memory's
# peak (``streams_fast``): on an H100 clusters of 8 at B = 1 (64 blocks) do, on an H200
# (46% more bandwidth, the same SMs) they would not. Off until measured on an H200 in the
# same run as the clusters it replaces: the rule rests on an older H200 run's figures
# (clusters of 8 from event to event against the global merge's kernel time), and on an
# H100 the global merge it would pick there is 3% slower than clusters of 8 at 32k keys.
CLUSTER_BANDWIDTH = False
LONG_SPLIT = 16
SM_STREAM = 48e9  # measured on an H100: B = 1 at 32k keys, clusters of 8 (48.2 us)
STREAM_SHARE = 0.85
PAGE_WINDOW = True  # paged: pages from a window of the block table across a warp's lanes
SPECULATE = True  # one split: the first K/V copies before the length is read (SPEC)
# several splits over a contiguous cache: the splits take every splits-th key tile, so a
# block's first tiles are known, and copied, before the length is read (SPEC). Off: on an
# H100 B1 L4096 took 10.40 us against 10.62 (inside the run-to-run spread) and a length of
# 0 in a 4k cache 6.82 against 4.67 (the wasted copies); docs/performance.md, sixth pass
SPLIT_SPEC = False

# paged: a block a (key split, sequence) over all K/V heads, reading whole pages
# (``decode_pages``), for the K/V head counts PAGE_HEADS, from PAGE_MIN_BATCH sequences on.
# Off: on an H100 it was no faster than the per-head kernel at any suite shape (the
# shuffled pages' cost is in the copy floor whichever way a page is read; the splits'
# merge adds 3 us), docs/performance.md, "Decode attention over pages, fourth pass"
WHOLE_PAGES = False
PAGE_HEADS = (4, 8)
PAGE_MIN_BATCH = 8
PAGE_SPEC = True  # decode_pages splits the capacity: its first copies need no length
# decode_fwd's tile loop (measured on an H100, kernel time, H32 / Hkv 8, D 128; the figures
# with the warps' merge of 4 columns a thread, docs/performance.md, "Decode attention,
# eighth pass"): the keys in the mma's M dimension (SWAP) for groups of at most 8 query rows,
# D up to 128 (B16 L4096 contiguous 89.0 us against 89.9, paged 92.1 against 93.4); one
# barrier a key tile (SYNC1) at 3 stages (B64 L1024 89.9 against 90.3, paged 91.7 against
# 92.1; at 4 stages no faster, at 2 slower); each warp on its own keys (OWN) over a paged
# cache in a grid of one split and at most a block a multiprocessor (B16 L4096 91.1 against
# 92.1, L32768 699.8 against 702.3; contiguous no faster, 685.4 against 680.8 at L32768)
KEYS_IN_M = True
SYNC1 = True
OWN_KEYS = True
# OWN also in the grids merged through a cluster whose splits take at most
# OWN_CLUSTER_TILES key tiles (measured on an H100, kernel time, two rounds: B = 1 at 1k
# keys, clusters of 8 with 2 tiles a split, paged 6.06 to 6.11 us against 6.21, contiguous
# 5.66 against 5.73 to 5.76; with 8 or more tiles a split no faster: B1 L4096 paged 10.11
# to 10.21 against 10.05 to 10.14, B4 L4096, B8 L1024 and B2 L8192 within 0.1 us either
# way; over the fused merge's 16 splits, paged at 32k keys, 50.8 against 50.2), dec, ninth
# pass
OWN_CLUSTER_TILES = 2
# one split over a paged cache of SORT_PAGE-token pages (SPEC) whose table holds at least
# SORT_MIN_PAGES pages: the table slots after the copies made before the length visited in
# pool order (``decode_fwd``'s SORT: the blocks sweep the pool together, reading
# neighbouring pages at once), up to SORT_MAX_PAGES of them. Measured on an H100 (kernel
# time, H32 / Hkv 8, D 128, the suite's shuffled pool; dec, tenth pass): B16 L4096 (256
# slots) 89.3 to 89.7 us against 91.0 to 92.0 (SDPA 90.2 to 90.4), as fast as tables
# sorted on the host; ragged (L/4 .. L) 68.2 to 71.2 against 68.5 to 71.9; B64 L4096 351.8
# to 353.0 against 353.1 to 353.4; B16 L1024 (128) 24.7 to 24.8 against 24.9 to 25.1, B64
# L1024 92.3 against 92.1 to 92.2 (not routed: 64 pages); B16 L32768 no faster (1024
# slots 699.1 to 700.8 against 699.4 to 701.6; all 2048 705.9 to 706.6: the sort no
# longer hides behind the first copies; its first 256 slots 0.4 to 0.9 faster, B64 not
# measured): tables of SORT_MAX_PAGES at most, sorted whole. A grid of one wave (a block a
# multiprocessor at most) sorts from SORT_ALONE_PAGES (B16 L1024, 64 pages: 24.7 to 24.8
# against 24.9 to 25.1 in the tenth pass, 24.69 to 24.72 against 24.93 to 25.02 in the
# thirteenth, round A; at B64 L1024, two waves, 92.3 against 92.1 to 92.2)
SORT_PAGE = 16
SORT_MIN_PAGES = 128
SORT_ALONE_PAGES = 64
SORT_MAX_PAGES = 256

# paged, pages of 16, 4 query rows a K/V group (H32 / Hkv 8 at Sq 1), D 128 and more blocks
# than run at once (two waves of decode_fwd): FOLD_SEQS (2) sequences a block, their pages'
# union walked in pool order (``decode_folded``, FOLD_STAGES K/V stages: two blocks a
# multiprocessor), two tables of up to FOLD_SORT slots in all; for batches up to FOLD_PAIR
# the p-th longest sequence with the p-th shortest (ragged batches balance). Measured on an
# H100 (kernel time, H32 / Hkv 8, D 128, f16, the suite's shuffled pool; dec, eleventh
# pass, round E), against decode_fwd: B64 L4096 352.5 to 352.6 us against 353.9 to 354.1
# (SDPA 351.6 to 352.2), ragged (L/4 .. L) 229.1 to 229.6 against 239.4 to 239.8; L1024
# 91.7 to 91.9 against 91.7 to 91.9 (SDPA 92.0 to 92.1), ragged 59.3 to 59.4 against 59.8
# to 60.0; L2048 178.6 to 179.0 against 179.0 to 179.1, ragged 116.5 against 119.9 to
# 120.3; L8192 701.2 to 701.6 against 704.5 to 705.4, ragged 447.0 to 447.3 against 458.6
# to 462.0. Round F (the route against decode_fwd): L4096 351.9 to 352.6 against 352.0 to
# 352.1, ragged 228.5 to 228.7 against 239.8 to 241.1; L2048 178.6 to 178.9 against 178.6
# to 178.8, ragged 117.4 to 117.7 against 120.6 to 120.8; L8192 699.5 to 700.2 against
# 700.9 to 702.0, ragged 446.1 to 446.7 against 461.4 to 462.4; L1024 92.1 to 92.2 against
# 91.8 to 91.9 (ragged 58.6 to 59.3 against 60.3 to 60.4): from FOLD_MIN_PAGES pages a
# sequence (2k keys). Without the pairing ragged batches were 1% to 3% slower (one wave:
# the longest pairs end alone); 4 sequences a block (16 query rows in M) slower at every
# length.
FOLD_SEQS = 2
FOLD_SORT = 1024
FOLD_MIN_PAGES = 128
FOLD_STAGES = 3
# decode_folded pairs the p-th longest with the p-th shortest sequence (PAIR) for batches up
# to FOLD_PAIR (its ranks by length over all of them in shared memory; 0: off)
FOLD_PAIR = 256
# decode_folded's first tiles (each sequence's first 64 keys) copied once the pair and the
# lengths are known, before its sort (SPEC), so that the sort runs under them. Measured on an
# H100 (kernel time, H32 / Hkv 8, D 128, f16, the suite's shuffled pool; dec, twelfth pass,
# rounds A, B and F) against it off (main's kernel): faster in 26 of 28 passes, B64 L4096
# 351.5 to 355.4 us against 352.0 to 355.9, ragged (L/4 .. L) 227.9 to 229.7 against 228.8
# to 230.4; L8192 700.5 to 707.4 against 700.8 to 707.7; L2048 178.4 to 179.6 against
# 178.8 to 180.0
FOLD_SPEC = 1
# programmatic dependent launch of decode_fwd (sm_90) in a grid of one split (one wave;
# several on a GPU of memory under PDL_WAVES_BANDWIDTH) over a paged cache of up to
# PDL_KEYS keys (``pdls``): each block prefetches its first key tiles into L2 (PDL 1; not
# on fast memory: PDL_PREFETCH_BANDWIDTH), waits for the kernel before it in the stream
# before any load, then lets the next one launch, so that the next call's blocks take
# the SMs this one's blocks leave while the others still run. Measured on an H100
# (kernel time: a CUDA graph of calls, against none; dec, sixteenth pass, rounds A to C,
# two processes each): B16 paged at 1k keys 25.0 to 25.2 us
# against 25.8 to 25.9 (SDPA 26.3 to 26.5), 1.5k 36.2 to 36.3 against 36.4 to 36.6, 3k
# 68.4 to 68.6 against 68.6 to 69.0, 4k 90.0 to 90.1 against 90.0 to 90.3 (fifteenth pass
# 90.1 against 90.6), 2k 47.2 to 47.6 against 47.1 to 47.6 (the one length where it is no
# faster: on average 0.04 to 0.24 us slower in 6 of 8 processes, 0.03 to 0.05 faster in 2;
# SDPA 47.4 to 47.9); B64 L1024 paged (two waves) 91.7 to 92.5 against 92.4 to 92.8 (SDPA
# 92.2 to 92.7). Without the prefetches slower (B16 L1024 25.4 to 25.5, B64 L1024 92.1 to
# 92.3). Slower elsewhere: B16 L32768 paged 703.9 to 704.1 against 699.8 (fifteenth pass,
# round E: the blocks of a sequence's K/V heads no longer start together, most likely),
# B16 L1024 contiguous 25.8 against 25.6 (B16 L4096 contiguous 88.3 against 88.9: not
# routed, the two disagree); with the next kernel let launch after the key loop (fifteenth
# pass, round D) B1 L4096 (clusters) 10.2 to 10.5 against 9.9, paged 11.2 to 11.6 against
# 10.8, B64 L4096 paged (decode_folded) 353.6 to 354.0 against 352.6 to 352.8, B16 L1024
# paged 27.1. On an H200 (round E) B16 L1024 paged ties (19.1 to 19.2 against 19.1 to
# 19.3), and one call a graph (a graph of one call, events around its replay) takes 2.0 to
# 3.0 us more with PDL than without (B16 L1024 paged 24.3 to 24.5 against 22.2, SDPA 23.1
# to 23.3; B64 L1024 paged 71.3 to 71.5 against 68.5 to 68.6, SDPA 68.8 to 68.9)
PDL = True
PDL_KEYS = 4096
# the L2 prefetch before the wait (PDL 1) only on GPUs whose memory peak is under this
# (bytes/s); on the others a one-wave grid takes PDL without it (PDL 2) up to
# PDL_FAST_KEYS keys, and none over them. The prefetch brings a block's first 3 key tiles
# in before the wait: hidden behind a decode call before it that lets this one launch
# early, it costs 1.8 to 2.1 us a call wherever nothing is (a graph of one call, a call
# behind any other kernel). Measured on an H200 (4.8 TB/s; dec, seventeenth pass, round
# C, B16 paged, µs in a graph of 8 calls / one call a graph / behind a small kernel in a
# graph of one): at 1k keys PDL 2 18.5 / 22.4 / 24.0, PDL 1 19.1 / 24.0 / 25.7, none
# 19.2 / 22.2 / 24.0, SDPA 20.0 / 22.8 / 24.9; 2k PDL 2 33.5 / 37.1 / 38.9, PDL 1 34.4 /
# 39.0 / 40.9, none 33.8 / 37.0 / 39.0, SDPA 34.5 / 37.7 / 39.3; 3k PDL 2 48.5 to 48.8,
# none 48.4 to 48.5; 4k none 62.9 to 63.2 / 66.3 to 66.6 / 68.4 to 68.7, PDL 2 63.3 to
# 63.4, PDL 1 62.8 to 63.0 / 68.8 to 69.0 / 70.6 to 70.7, SDPA 63.4 / 66.9 / 68.9 to 69.1.
# The H100 keeps PDL 1 (kernel time at 1k 25.0 to 25.2 against 25.4 to 25.5 without the
# prefetch, sixteenth pass)
PDL_PREFETCH_BANDWIDTH = 4e12
PDL_FAST_KEYS = 2048
# PDL in a one-split grid of several waves (B64 L1024 paged) only on GPUs whose memory peak
# is under this (bytes/s): on an H100 (3.35 TB/s) 91.7 to 92.5 us against 92.4 to 92.8 in
# four processes, on an H200 (4.8 TB/s) 65.4 to 65.5 against 64.8 to 64.9 (SDPA 65.1 to
# 65.4; dec, sixteenth pass, round E)
PDL_WAVES_BANDWIDTH = 4e12

# long tables on fast memory (``long_walk``): a one-split grid over a paged cache of at
# least LONG_KEYS keys, on a GPU whose memory peak is at least LONG_BANDWIDTH (bytes/s: the
# H200's 4.8 TB/s; the H100's 3.35 keeps 4 stages, 706 to 707 us against 710 with 3 at B16
# L32768, dec, twelfth pass), takes LONG_STAGES K/V stages in its one wave (B16 with Hkv 8)
# and each warp on its own keys (OWN) in its waves of two blocks a multiprocessor (B64).
# Measured on an H200 (kernel time, H32 / Hkv 8, D 128, the suite's shuffled pool; dec,
# eighteenth pass, four passes a round): B16 L32768 3 stages 468.6 to 468.9 us against
# 471.0 to 471.3 (round D; SDPA 464.8 to 465.5), 479.8 to 480.6 against 481.6 to 482.7
# (C), 1.1 to 1.2 faster in A and A2; B64 L32768 OWN 1871.3 to 1877.4 against 1882.4 to
# 1886.9 (D; SDPA 1841.4 to 1851.9), 1916.4 to 1924.6 against 1926.0 to 1939.2 (C), its
# ragged lengths (L/4 .. L) 1258.9 to 1280.7 against 1286.2 to 1294.5 (D)
LONG_KEYS = 32768
LONG_BANDWIDTH = 4e12
LONG_STAGES = 3

DECODE = dk.decode_fwd  # the kernels, each generic over its element type (DT)
MERGE = dk.decode_merge
FOLDED = dk.decode_folded
PAGES = dk.decode_pages
APPEND = dk.kv_append


def row_tiles(rows: int) -> int:
    """``MT``: the 16-row M-tiles of a block for a K/V group of ``rows`` query rows (heads of
    the group times new tokens): 1, 2 or 4 (groups of more than 64 rows take several
    blocks)."""
    return 1 if rows <= 16 else 2 if rows <= 32 else 4


def swaps(rows: int, dp: int) -> int:
    """``decode_fwd``'s SWAP for a K/V group of ``rows`` query rows (KEYS_IN_M): the keys in
    the mma's M dimension where the rows fit its N (8) and Q's fragments stay in registers."""
    return int(KEYS_IN_M and rows <= 8 and dp <= 128)


def owns(mt: int, paged: bool, alone: bool, cl: int = 1, per: int = 0, long: bool = False) -> int:
    """``decode_fwd``'s OWN (OWN_KEYS): each warp on its own 16 keys of a tile, one M-tile
    (a paged cache read through the block-table window), in a grid of one split and at
    most a block a multiprocessor over a paged cache (``alone``), or of one split over a
    long table on fast memory (``long``: ``long_walk``), or one whose splits of ``per`` key
    tiles merge through clusters of ``cl`` > 1 blocks (per up to OWN_CLUSTER_TILES)."""
    if not (OWN_KEYS and mt == 1) or paged and not PAGE_WINDOW:
        return 0
    return int(paged and (alone or long) or cl > 1 and per <= OWN_CLUSTER_TILES)


def long_walk(like, paged: bool, capacity: int, dp: int, mt: int) -> bool:
    """Whether a one-split grid over a cache of ``capacity`` keys on ``like``'s GPU takes
    the long-table route (LONG_STAGES in one wave, OWN in several): paged, at least
    LONG_KEYS keys, D 128 and one M-tile (measured), a memory peak of at least
    LONG_BANDWIDTH (not in the simulator, which plans as for an H100)."""
    if not (paged and capacity >= LONG_KEYS and dp == 128 and mt == 1):
        return False
    peak = memory_bandwidth(like)  # (asked last: it reads the driver's attributes)
    return peak is not None and peak >= LONG_BANDWIDTH


def stage_syncs(stages: int, own: int = 0) -> int:
    """``decode_fwd``'s SYNC1 (one barrier a key tile) for a pipeline of ``stages``: at 3
    (at 2 the wait before the copies would leave no tile in flight; at 4 it measured no
    faster), and not where the warps own their keys (``own``: no barrier a tile)."""
    return int(SYNC1 and stages == 3 and not own)


def stages_for(dp: int, mt: int) -> int:
    """K/V pipeline stages of ``decode_fwd``: 3 where they fit a block's shared memory on
    every GPU it runs on (A100's 163 KiB: D up to 128), else 2 (measured on an H200: 3 are
    as fast or faster than 2 with the splits chosen for them, although D = 128 then has 2
    blocks a multiprocessor, not 3)."""
    return 3 if shared_bytes(dp, mt, 3) <= BLOCK_SHARED else 2


def deep_stages(dp: int, mt: int) -> int:
    """K/V pipeline stages of ``decode_fwd`` when the grid has at most one block a
    multiprocessor (occupancy costs nothing then): 4 where they fit (D up to 128: a block of
    4 tiles, the split of one sequence of 4k keys, has all its tiles in flight at once),
    else ``stages_for``'s."""
    return 4 if shared_bytes(dp, mt, 4) <= BLOCK_SHARED else stages_for(dp, mt)


def one_split_stages(dp: int, mt: int, paged: bool) -> int:
    """K/V pipeline stages of ``decode_fwd`` for a grid of one split and at most a block a
    multiprocessor (B = 16 with 8 K/V heads): 2 for a contiguous cache, each block's
    stream of 64-key tiles (measured on an H100, kernel time, B = 16 at 1k, 4k and 32k keys:
    25.3, 90.0 and 683 us with 2 stages, 25.5, 90.2 and 691 with 4), else ``deep_stages``'s
    (paged: 92.4 us with 4 at 4k, 93.2 with 2)."""
    return 2 if not paged else deep_stages(dp, mt)


def shared_bytes(dp: int, mt: int, stages: int = 2) -> int:
    """Dynamic shared memory of ``decode_fwd``: the K/V stages, the Q rows, the warps'
    maxima and sums (the warps' partial outputs reuse the K/V stages); SORT's sorted
    pages come after them (4 bytes each)."""
    return (2 * stages * dk.BN + 16 * mt) * dp * 2 + 2 * dk.WARPS * 16 * 4


def sorts(paged: bool, splits: int, max_pages: int = 0, page: int = 0, alone: bool = False) -> int:
    """``decode_fwd``'s SORT for a grid of ``splits`` key splits over a cache of ``page``-token
    pages, ``max_pages`` a sequence: for one split over a paged cache (whose first copies
    precede the length, ``speculates``) of SORT_PAGE-token pages and SORT_MIN_PAGES
    (SORT_ALONE_PAGES in a grid of one wave, ``alone``) to SORT_MAX_PAGES a sequence (the
    whole table sorted), the next power of two (from 128, a key a thread) over max_pages;
    else 0."""
    one = paged and splits == 1 and speculates(paged) and page == SORT_PAGE
    least = SORT_ALONE_PAGES if alone else SORT_MIN_PAGES
    if not (one and least <= max_pages <= SORT_MAX_PAGES):
        return 0
    return max(128, 1 << (max_pages - 1).bit_length())


def sort_sizes(paged: bool, direct: bool) -> tuple:
    """Every SORT ``sorts`` gives a grid of one split (``direct``) or several."""
    if not (paged and direct and speculates(paged)):
        return (0,)
    return (0, *(n for n in (128, 256, 512, 1024, 2048) if n <= SORT_MAX_PAGES))


def folds(cache, batch: int, rows: int, d: int, sms: int) -> int:
    """``decode_folded``'s FOLD for a call of ``batch`` sequences with ``rows`` query rows a
    K/V group (heads of the group times new tokens), head dim ``d``: FOLD_SEQS where the
    cache is paged in SORT_PAGE-token pages, rows is 4 (two groups fill the mma's N of 8),
    d is 128 (measured), decode_fwd's grid would take more than two blocks a
    multiprocessor and a table holds FOLD_MIN_PAGES pages or more, FOLD of them FOLD_SORT
    slots at most; else 0."""
    if not (FOLD_SEQS and cache.paged and cache.page_size == SORT_PAGE and rows == 4):
        return 0
    pages = FOLD_MIN_PAGES <= cache.max_pages <= FOLD_SORT // FOLD_SEQS
    fits = d == 128 and pages
    return FOLD_SEQS if fits and batch * cache.kv_heads > 2 * sms else 0


def folded_shared(dp: int, sort: int) -> int:
    """Dynamic shared memory of ``decode_folded``: ``shared_bytes``' and its sorted keys."""
    return shared_bytes(dp, 1, FOLD_STAGES) + 4 * sort


def merge_shared(mt: int) -> int:
    """Dynamic shared memory of ``decode_merge``: a weight per split and row."""
    return dk.MAX_SPLITS * 16 * mt * 4


def splits_for(blocks: int, tiles: int, sms: int) -> int:
    """Key splits for ``blocks`` (batch x K/V heads x row chunks) over a capacity of
    ``tiles`` key tiles on a GPU of ``sms`` multiprocessors. None (1) once the blocks cover
    the multiprocessors (FULL of them: a block each streams the cache at the memory's speed,
    and a merge only adds to it); else at most a block a multiprocessor (two are slower,
    and a block then takes ``deep_stages``), the count minimizing tiles per block +
    BLOCK_COST + the merge (MERGE_TAIL + SPLIT_COST x splits), the fewest on ties. Measured
    on an H200 (kernel time, D = 128, Hkv = 8): B = 1 at 1k, 4k and 32k keys takes 8, 16 and
    16 splits (32k: 37.2 us, 39.2 with 32 splits), B = 4 at 4k 4 (22.0 us, 23.0 with 8),
    B = 8 at 4k 2 (36.8 us, 37.6 with 4), B >= 16 none."""
    if blocks >= FULL * sms:
        return 1
    best, best_cost = 1, math.inf
    for s in range(1, min(MAX_SPLITS, max(1, tiles), max(1, sms // blocks)) + 1):
        cost = math.ceil(tiles / s) + BLOCK_COST
        cost += MERGE_TAIL + SPLIT_COST * s if s > 1 else 0
        if cost < best_cost:
            best, best_cost = s, cost
    return best


_RESIDENT: dict = {}  # (device, constexprs, shared bytes) -> clusters that run at once


def _hopper(like) -> bool:
    """Whether ``like``'s launches can take clusters: sm_90, or the simulator."""
    dev = _arrays.gpu(like)
    return dev is None or int(dev.arch[3:].rstrip("a")) >= 90


def streams_fast(like, sms_used: int) -> bool:
    """Whether ``sms_used`` blocks, one a multiprocessor, stream the cache at the memory's
    speed (STREAM_SHARE of its peak at SM_STREAM bytes/s each); True where the peak is
    unknown (the simulator plans as for an H100). H100 (3.35 TB/s): 64 blocks do (3.07
    TB/s); H200 (4.8 TB/s): they do not."""
    peak = memory_bandwidth(like)
    return peak is None or sms_used * SM_STREAM >= STREAM_SHARE * peak


def plan_grid(
    like, kernel, blocks: int, tiles: int, dp: int, mt: int, paged: bool, swap: int = 0
) -> tuple:
    """(splits, STAGES, CL, shared bytes) of ``decode_fwd`` for ``blocks`` (batch x K/V
    heads x row chunks) over a capacity of ``tiles`` key tiles. The splits are
    ``splits_for``'s, merged by the last block to finish (``CL`` = 1); on sm_90 (and in the
    simulator) they merge through a thread-block cluster's shared memory instead (``CL`` =
    splits) where the grid is one block a multiprocessor: the largest size in CLUSTERS up
    to those splits whose clusters all run at once, each block asking for enough shared
    memory that no two share a multiprocessor (two of a cluster on one would leave others
    idle; a cluster that waited for another would double the time), and splits of at most
    CLUSTER_TILES key tiles. Measured on an H100 (kernel time), Hkv = 8, D = 128: B = 1
    through clusters of 8 (of 16 only 7 of 8 run at once) at 1k, 4k and 32k keys 7.0, 11.1
    and 48.1 us against 7.5, 11.6 and 49.8 with the global merge; B = 4 at 4k through
    clusters of 2, 27.5 against 28.0. A paged cache takes splits of at most
    PAGED_CLUSTER_TILES through a cluster (B = 1 at 32k keys: clusters of 8, 64 tiles a
    split, 56.4 us; 16 splits and the global merge 51.7; 32 splits 53.0). Splits of more
    than LONG_SPLIT tiles take a cluster only where its blocks stream at the memory's speed
    (``streams_fast``; CLUSTER_BANDWIDTH): on an H200, B = 1 at 32k keys through clusters of
    8 (64 SMs) took 48.7 us from event to event (docs/performance.md's suite page; about
    44 of kernel time, if a graph's launch adds the 4 to 4.4 us measured on an H100), 16
    splits through the global merge 37.2 of kernel time (``splits_for``); on an H100 the
    same 48.2 and 49.4 (dec34, 2026-11-27)."""
    sms = _arrays.multiprocessors(like)
    splits = splits_for(blocks, tiles, sms)
    stages = deep_stages(dp, mt) if blocks * splits <= sms else stages_for(dp, mt)
    if splits == 1 and blocks <= sms:
        stages = one_split_stages(dp, mt, paged)
        if long_walk(like, paged, tiles * dk.BN, dp, mt):
            stages = LONG_STAGES
    plain = (splits, stages, 1, shared_bytes(dp, mt, stages))
    if not CLUSTER_MERGE or splits == 1 or blocks * splits > sms or not _hopper(like):
        return plain
    dev = _arrays.gpu(like)
    stages = deep_stages(dp, mt)
    shared = max(shared_bytes(dp, mt, stages), SPREAD)
    for cl in sorted((c for c in CLUSTERS if c <= splits), reverse=True):
        per = -(-tiles // cl)
        if per > (PAGED_CLUSTER_TILES if paged else CLUSTER_TILES):
            break  # long splits: the merge's cost matters little, the spread over the SMs more
        if CLUSTER_BANDWIDTH and per > LONG_SPLIT and not streams_fast(like, blocks * cl):
            break  # (fewer splits: fewer SMs still)
        consts = {"DP": dp, "MT": mt, "PAGED": paged, "STAGES": stages, "CL": cl, "DT": like.dtype}
        own = owns(mt, paged, False, cl, per)
        consts |= {"SWAP": swap, "SYNC1": stage_syncs(stages, own), "OWN": own, "SORT": 0}
        if dev is None or not CLUSTER_CHECK:
            return cl, stages, cl, shared
        consts |= {"PW": int(PAGE_WINDOW and paged), "SPEC": speculates(paged, cl)}
        consts["PDL"] = 0  # (several splits)
        key = (like.device, tuple(sorted(consts.items())), shared)
        have = _RESIDENT.get(key)
        if have is None:
            have = _RESIDENT[key] = kernel.max_active_clusters(
                dk.THREADS, shared, device=dev, DIRECT=False, FUSED=False, **consts
            )
        if have >= blocks:
            return cl, stages, cl, shared
    return plain


def pdls(like, cache: _Cache, direct: bool, alone: bool) -> int:
    """``decode_fwd``'s PDL for a call on ``like``'s GPU over ``cache``, in a grid of one
    split (``direct``) over a paged cache of up to PDL_KEYS keys, on sm_90 and in the
    simulator (where the wait, the trigger and the prefetches do nothing; it plans as for
    an H100): where the grid has at most a block a multiprocessor (``alone``), 1 (the L2
    prefetch, the wait, the trigger) on a GPU whose memory peak is under
    PDL_PREFETCH_BANDWIDTH, else 2 (no prefetch) up to PDL_FAST_KEYS keys; in a grid of
    several waves, 1 where the peak is under PDL_WAVES_BANDWIDTH; else 0 (griddepcontrol
    is sm_90's)."""
    if not (PDL and cache.paged and cache.capacity <= PDL_KEYS and _hopper(like)):
        return 0
    peak = memory_bandwidth(like)  # asked last: it reads the driver's attributes
    if alone:
        if peak is None or peak < PDL_PREFETCH_BANDWIDTH:
            return 1
        return 2 if cache.capacity <= PDL_FAST_KEYS else 0
    return int(direct and (peak is None or peak < PDL_WAVES_BANDWIDTH))


def speculates(paged: bool, splits: int = 1) -> int:
    """``decode_fwd``'s SPEC for a grid of ``splits`` key splits. One split (SPECULATE):
    over a paged cache read through the block-table window (PAGE_WINDOW), the length and
    the window's load then in flight together. Measured on an H100 (kernel time, paged, on /
    off): B = 16 at 1k, 4k and 32k keys 26.2 / 26.4, 92.8 / 92.9 and 706.7 / 707.6 us, B =
    64 at 1k 93.7 / 94.4; contiguous it was no faster (25.9 / 25.4 us at B = 16, 1k keys).
    Several splits (SPLIT_SPEC): over a contiguous cache only (the window takes tiles in
    order), split s then takes key tiles s, s + splits, ... (its first ones copied before
    the length is read)."""
    if splits > 1:
        return int(SPLIT_SPEC and not paged)
    return int(SPECULATE and PAGE_WINDOW and paged)


def page_shared(hkv: int, dp: int, stages: int) -> int:
    """Dynamic shared memory of ``decode_pages``: STAGES stages of 16 keys of every K/V
    head, K and V (Q and the merge's weights reuse them)."""
    return stages * 2 * hkv * 16 * dp * 2


def page_stages(like, hkv: int, dp: int) -> int:
    """``decode_pages``' stages: 3 where a block's shared memory holds them (H100, H200: 192
    KB at Hkv 8, D 128), else 2 (A100's 163 KB; the simulator plans as for an H100)."""
    dev = _arrays.gpu(like)
    limit = 227 * 1024 if dev is None else dev.max_shared_per_block_optin
    return 3 if page_shared(hkv, dp, 3) <= limit else 2


def page_splits(batch: int, tiles: int, sms: int) -> int:
    """``decode_pages``' key splits of each sequence (``tiles`` 16-key tiles of capacity):
    a block a multiprocessor over the batch, at most MAX_SPLITS, at least 4 tiles a split."""
    return max(1, min(MAX_SPLITS, sms // batch, tiles // 4))


def uses_pages(cache, batch: int, group: int, sq: int, d: int) -> bool:
    """Whether a decode call runs ``decode_pages`` (WHOLE_PAGES): a paged cache of
    PAGE_HEADS K/V heads, D up to 128 (Q in registers), a group's query rows in one M-tile,
    from PAGE_MIN_BATCH sequences on."""
    return (
        WHOLE_PAGES
        and cache.paged
        and cache.kv_heads in PAGE_HEADS
        and d <= 128
        and group * sq <= 16
        and batch >= PAGE_MIN_BATCH
    )


class _Cache:
    """The checked cache of a decode call: operands and geometry."""

    def __init__(self, inputs, k_cache, v_cache, block_table, batch: int, d: int, dtype):
        self.paged = block_table is not None
        form = "[num_pages, page_size, Hkv, D]" if self.paged else "[B, Hkv, Smax, D]"
        # the kernels address the caches with u32 arithmetic only: up to 2**32 - 1 elements
        big = _arrays.MAX_ELEMENTS_UNSIGNED
        self.k = inputs.array(
            k_cache, "k_cache", ndim=4, dtypes=(dtype,), form=form, max_elements=big
        )
        self.v = inputs.array(
            v_cache,
            "v_cache",
            ndim=4,
            shape=self.k.shape,
            dtypes=(dtype,),
            form=form,
            max_elements=big,
        )
        shape = self.k.shape
        if shape[-1] != d:
            raise inputs.error("k_cache", f"must have head dim D = {d} like q, got shape {shape}")
        if self.paged:
            self.pages, self.page_size, self.kv_heads = shape[0], shape[1], shape[2]
            ps = self.page_size
            if ps < MIN_PAGE or ps & (ps - 1):
                raise inputs.error(
                    "k_cache",
                    f"has page_size {ps} (shape {shape}); pages hold a power of two of at "
                    f"least {MIN_PAGE} tokens",
                )
            self.table = inputs.array(
                block_table, "block_table", ndim=2, dtypes=(i32,), form="[B, max_pages]"
            )
            if self.table.shape[0] != batch or self.table.shape[1] == 0:
                raise inputs.error(
                    "block_table",
                    f"must have shape [B = {batch}, max_pages >= 1], got {self.table.shape}",
                )
            self.max_pages = self.table.shape[1]
            self.capacity = self.max_pages * ps
            self.shift = ps.bit_length() - 1
        else:
            if shape[0] != batch:
                raise inputs.error(
                    "k_cache", f"must have batch B = {batch} like q, got shape {shape}"
                )
            self.kv_heads, self.capacity = shape[1], shape[2]
            self.table, self.max_pages, self.shift, self.pages = None, 1, 0, 0
        if 0 in shape:
            raise inputs.error("k_cache", f"has an empty dimension: shape {shape}")
        for a in (self.k, self.v):
            if not a.aligned(16):
                raise inputs.error(a.name, "must start on a 16-byte boundary (16-byte copies)")

    def table_arg(self, like):
        """block_table as the kernels' i32 argument (a one-element stand-in when contiguous)."""
        if self.table is not None:
            return self.table.arg(self.table.size)
        if like.kind == "numpy":
            return np.zeros(1, np.int32)
        return self.k.arg(1, dtype=i32)  # never read: PAGED is off

    def geometry(self) -> tuple:
        """(capacity, max_pages, shift, pages): the kernels' cache arguments."""
        return self.capacity, self.max_pages, self.shift, max(self.pages, 1)


_COUNTERS: dict = {}  # (device, stream) -> torch int32 zeros: decode_fwd's arrival counters
COUNTER_ROWS = 1024  # the counters of a stream (at least; a split grid has fewer blocks)
SPARE_ROWS = 8  # rows of counters zeroed ahead, outside any CUDA graph capture
_SPARE: dict = {}  # torch device -> rows zeroed ahead, for streams first seen capturing


def _counters(like, stream, blocks: int):
    """Zeroed u32 counters (at least ``blocks``) for the fused merge, or None where the
    separate merge kernel runs instead (arrays other than torch's). They stay allocated per
    GPU and stream, so that kernels on concurrent streams never share them; each call's last
    blocks reset theirs to 0. A stream first seen capturing a CUDA graph takes a row zeroed
    ahead (``zeroed_row``)."""
    if like.kind == "numpy":
        return np.zeros(blocks, np.uint32)
    if like.kind != "torch":
        return None
    key = (like.device, stream)
    have = _COUNTERS.get(key)
    if have is None or have.numel() < blocks:
        have = _COUNTERS[key] = zeroed_row(like.obj.device, max(blocks, COUNTER_ROWS))
        # a constant for call plans (kaio_ops._plan): a plan is keyed by its stream and
        # replays with these counters; kept alive by the registry if outgrown here
        _arrays.constant(have)
    return _arrays.arg(have, "torch", (have.numel(),), u32, like.device)


def zeroed_row(device, n: int):
    """``n`` zeroed torch int32 counters on ``device``. While its current stream captures a
    CUDA graph: one of the SPARE_ROWS rows that a call outside any capture zeroed ahead
    (torch.cuda.graph synchronizes before it captures, so their zeros are in place), else
    torch.zeros, whose fill the graph would then run before the decode kernel at every
    replay (a second node: the GPU's time between the two kernels). Outside a capture:
    torch.zeros, in stream order (and the spare rows made where there are none)."""
    import torch

    with torch.cuda.device(device):
        capturing = torch.cuda.is_current_stream_capturing()
    spare = _SPARE.setdefault(device, [])
    if capturing and spare and n <= COUNTER_ROWS:
        return spare.pop()
    if not (capturing or spare):
        rows = torch.zeros(SPARE_ROWS, COUNTER_ROWS, dtype=torch.int32, device=device)
        spare.extend(rows.unbind(0))
    return torch.zeros(n, dtype=torch.int32, device=device)


def _lengths(inputs, seq_lens, batch: int):
    """Check seq_lens: int32 [B]."""
    return inputs.array(seq_lens, "seq_lens", ndim=1, shape=(batch,), dtypes=(i32,), form="[B]")


def _host_check(inputs, lens, cache: _Cache, debug: bool) -> None:
    """Lengths within 0 .. capacity and the pages they use within the pool, where the values
    are on the host (the simulator) or in debug mode (copied from the GPU)."""
    if lens.kind == "numpy":
        values = lens.obj
    elif debug:
        values = _to_host(lens.obj, lens.kind)
    else:
        return
    values = np.asarray(values, np.int64).reshape(-1)
    bad = np.flatnonzero((values < 0) | (values > cache.capacity))
    if bad.size:
        i = int(bad[0])
        raise inputs.error(
            "seq_lens",
            f"has seq_lens[{i}] = {values[i]}, outside 0 .. {cache.capacity} (the cache's "
            "capacity); grow the cache or its block table",
        )
    if cache.paged:
        table = cache.table.obj
        table = np.asarray(
            table if cache.table.kind == "numpy" else _to_host(table, cache.table.kind)
        )
        for b, n in enumerate(values):
            used = table[b, : -(-int(n) // cache.page_size)]
            if ((used < 0) | (used >= cache.pages)).any():
                raise inputs.error(
                    "block_table",
                    f"row {b} names pages outside 0 .. {cache.pages - 1} among the "
                    f"{used.size} that seq_lens[{b}] = {n} uses",
                )


def _to_host(obj, kind: str) -> np.ndarray:
    """A GPU array's values on the host (synchronizes)."""
    if kind == "torch":
        return obj.cpu().numpy()
    if kind == "cupy":
        return obj.get()
    return obj.numpy()


def _outputs(qa, splits: int) -> tuple:
    """(out, lse, out_flat, lse_flat, part, part_lse) of a decode call on q ``qa``
    [B, H, Sq, D]: the outputs and their flat kernel arguments, and the splits' partial
    outputs and base-2 logsumexps (f32 [splits, B * H * Sq, D] and [.., LSE_STRIDE]; with
    one split, stand-ins never written)."""
    batch, heads, sq, d = qa.shape
    rows = batch * heads * sq
    out = _arrays.output(qa, qa.shape)
    lse = _arrays.output(qa, (batch, heads, sq), f32)
    out_flat = _arrays.output_arg(qa, out, (qa.size,))
    lse_flat = _arrays.output_arg(qa, lse, (rows,), f32)
    if splits == 1:
        return out, lse, out_flat, lse_flat, lse_flat, lse_flat
    part = _arrays.output(qa, (splits * rows * d,), f32)
    part_lse = _arrays.output(qa, (splits * rows * dk.LSE_STRIDE,), f32)
    return out, lse, out_flat, lse_flat, part, part_lse


def _decode(op: str, q, k_cache, v_cache, seq_lens, block_table, scale):
    inputs = _arrays.Inputs(op)
    qa = inputs.array(q, "q", ndim=4, dtypes=(f16, bf16), form="[B, H, Sq, D]")
    batch, heads, sq, d = qa.shape
    if not 1 <= sq <= MAX_NEW:
        raise inputs.error(
            "q", f"has Sq = {sq} new tokens (shape {qa.shape}); takes 1 .. {MAX_NEW}"
        )
    if d not in DIMS:
        raise inputs.error("q", f"has head dim D = {d}; {op} takes D in {DIMS}")
    if 0 in qa.shape:
        raise inputs.error("q", f"has an empty dimension: shape {qa.shape}")
    if not qa.aligned(16):
        raise inputs.error("q", "must start on a 16-byte boundary (16-byte copies)")
    cache = _Cache(inputs, k_cache, v_cache, block_table, batch, d, qa.dtype)
    if heads % cache.kv_heads:
        raise inputs.error(
            "k_cache",
            f"has Hkv = {cache.kv_heads} heads, which must divide q's H = {heads} (grouped-query)",
        )
    lens = _lengths(inputs, seq_lens, batch)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{op}: scale must be a positive finite number, got {scale!r}")
    _host_check(inputs, lens, cache, DECODE.debug)

    group = heads // cache.kv_heads
    if uses_pages(cache, batch, group, sq, d):
        return _decode_pages(qa, cache, lens, batch, heads, group, sq, d, scale)
    fold = folds(cache, batch, group * sq, d, _arrays.multiprocessors(qa))
    if fold:
        return _decode_folded(qa, cache, lens, batch, heads, group, sq, d, scale, fold)
    mt = row_tiles(group * sq)
    chunks = -(-group * sq // (16 * mt))
    blocks = batch * cache.kv_heads * chunks
    tiles = -(-cache.capacity // dk.BN)
    swap = swaps(group * sq, d)
    splits, stages, cl, shared = plan_grid(qa, DECODE, blocks, tiles, d, mt, cache.paged, swap)
    alone = splits == 1 and blocks <= _arrays.multiprocessors(qa)
    long = splits == 1 and long_walk(qa, cache.paged, cache.capacity, d, mt)
    own = owns(mt, cache.paged, alone, cl, -(-tiles // splits), long)
    rows = batch * heads * sq
    stream = _arrays.stream_of(qa)
    direct = splits == 1
    page = cache.page_size if cache.paged else 0
    sort = sorts(cache.paged, splits, cache.max_pages, page, alone)
    out, lse, out_flat, lse_flat, part, part_lse = _outputs(qa, 1 if cl > 1 else splits)
    counters = None
    if not (direct or cl > 1):
        counters = _counters(qa, stream, blocks)
    fused = counters is not None
    flat = [a.arg(a.size) for a in (qa, cache.k, cache.v)]
    if counters is None:  # a stand-in, never read
        counters = np.zeros(1, np.uint32) if qa.kind == "numpy" else qa.arg(1, dtype=u32)
    DECODE[(splits, blocks), dk.THREADS, stream, shared + 4 * sort](
        *flat, cache.table_arg(qa), lens.arg(batch), out_flat, lse_flat, part, part_lse,
        counters, heads, group, sq, cache.kv_heads, *cache.geometry(), chunks, rows,
        math.log2(math.e) * float(scale),
        DP=d, MT=mt, PAGED=cache.paged, STAGES=stages, DIRECT=direct, FUSED=fused, CL=cl,
        DT=qa.dtype, PW=int(PAGE_WINDOW and cache.paged),
        SPEC=speculates(cache.paged, splits), SWAP=swap, SYNC1=stage_syncs(stages, own),
        OWN=own, SORT=sort, PDL=pdls(qa, cache, direct, alone),
    )  # fmt: skip
    if not (direct or fused or cl > 1):
        MERGE[blocks, dk.THREADS, stream, merge_shared(mt)](
            part, part_lse, out_flat, lse_flat, heads, group, sq, cache.kv_heads, chunks, rows,
            splits, DP=d, MT=mt, DT=qa.dtype,
        )  # fmt: skip
    return out, lse


def _decode_pages(qa, cache, lens, batch, heads, group, sq, d, scale) -> tuple:
    """``decode_pages`` over the paged ``cache``: (out, lse)."""
    hkv = cache.kv_heads
    tiles = -(-cache.capacity // 16)
    splits = page_splits(batch, tiles, _arrays.multiprocessors(qa))
    stages = page_stages(qa, hkv, d)
    rows = batch * heads * sq
    stream = _arrays.stream_of(qa)
    direct = splits == 1
    out, lse, out_flat, lse_flat, part, part_lse = _outputs(qa, splits)
    flat = [a.arg(a.size) for a in (qa, cache.k, cache.v)]
    PAGES[(splits, batch), 32 * hkv, stream, page_shared(hkv, d, stages)](
        *flat, lens.arg(batch), cache.table_arg(qa), out_flat, lse_flat, part, part_lse,
        heads, group, sq, cache.max_pages, cache.shift, max(cache.pages, 1), rows,
        math.log2(math.e) * float(scale),
        HKV=hkv, DP=d, STAGES=stages, DIRECT=direct, DT=qa.dtype, SPEC=int(PAGE_SPEC),
    )  # fmt: skip
    if not direct:  # a block a K/V group (one M-tile: group * Sq <= 16 rows)
        MERGE[batch * hkv, dk.THREADS, stream, merge_shared(1)](
            part, part_lse, out_flat, lse_flat, heads, group, sq, hkv, 1, rows, splits,
            DP=d, MT=1, DT=qa.dtype,
        )  # fmt: skip
    return out, lse


def _decode_folded(qa, cache, lens, batch, heads, group, sq, d, scale, fold) -> tuple:
    """``decode_folded`` over the paged ``cache``, ``fold`` sequences a block: (out, lse)."""
    pair = max(64, 1 << (batch - 1).bit_length()) if batch <= FOLD_PAIR else 0
    sort = max(128, 2 * pair, 1 << (fold * cache.max_pages - 1).bit_length())
    out, lse, out_flat, lse_flat, _, _ = _outputs(qa, 1)
    flat = [a.arg(a.size) for a in (qa, cache.k, cache.v)]
    blocks = -(-batch // fold) * cache.kv_heads
    FOLDED[(1, blocks), dk.THREADS, _arrays.stream_of(qa), folded_shared(d, sort)](
        *flat, cache.table_arg(qa), lens.arg(batch), out_flat, lse_flat, batch, heads, group,
        sq, cache.kv_heads, *cache.geometry(), math.log2(math.e) * float(scale),
        DP=d, STAGES=FOLD_STAGES, FOLD=fold, SORT=sort, PAIR=pair, SPEC=FOLD_SPEC,
        DT=qa.dtype,
    )  # fmt: skip
    return out, lse


@planned("q", "k_cache", "v_cache", "seq_lens", "block_table")
def flash_attention_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None):
    """Attention of the ``Sq`` newest tokens of each sequence over its KV cache (a decode
    step; ``Sq`` up to 16 for speculative or chunked verification).

    ``q`` [B, H, Sq, D] f16 or bf16, D in (64, 128, 256); the cache ``k_cache``, ``v_cache``
    (q's dtype) either contiguous [B, Hkv, Smax, D] or paged [num_pages, page_size, Hkv, D]
    (vLLM/FlashInfer "NHD"; page_size a power of two >= 16) with ``block_table`` int32
    [B, max_pages] naming sequence b's pages in order; H a multiple of Hkv (query head h
    reads K/V head h // (H // Hkv)). ``seq_lens`` int32 [B] on the GPU: each sequence's
    cached length, its Sq new tokens included (write them first with ``kv_cache_append``);
    new token i of sequence b sits at position seq_lens[b] - Sq + i and sees the keys up to
    and including its own. A token that sees no key (length 0) gets zeros. Scores are scaled
    by ``scale`` (default 1/sqrt(D)). Returns [B, H, Sq, D] of q's dtype.

    The keys are split over blocks (flash-decoding) and merged by logsumexp in a fixed order
    (deterministic); the grid depends on the capacity, not the lengths, so a CUDA graph
    captured once replays for any lengths. Lengths are not checked on a GPU outside debug
    mode (module docstring)."""
    return _decode("flash_attention_decode", q, k_cache, v_cache, seq_lens, block_table, scale)[0]


@planned("q", "k_cache", "v_cache", "seq_lens", "block_table")
def flash_attention_decode_with_stats(q, k_cache, v_cache, seq_lens, block_table=None, scale=None):
    """``(out, lse)``: ``flash_attention_decode`` and each query row's natural logsumexp of
    its scaled scores, f32 [B, H, Sq] (-inf for a row that sees no key)."""
    return _decode(
        "flash_attention_decode_with_stats", q, k_cache, v_cache, seq_lens, block_table, scale
    )


@planned("k_cache", "v_cache", "k", "v", "seq_lens", "block_table")
def kv_cache_append(k_cache, v_cache, k, v, seq_lens, block_table=None) -> None:
    """Write the new keys and values ``k``, ``v`` [B, Hkv, Sq, D] into the cache in place, at
    positions seq_lens[b] - Sq .. seq_lens[b] - 1 of sequence b (``seq_lens`` int32 [B], the
    lengths with the new tokens, as ``flash_attention_decode`` takes them). The cache is
    contiguous [B, Hkv, Smax, D] or paged [num_pages, page_size, Hkv, D] with
    ``block_table`` int32 [B, max_pages]; f16 or bf16, any D. Positions outside the cache
    (a length under Sq, or over the capacity on a GPU outside debug mode) are skipped."""
    op = "kv_cache_append"
    inputs = _arrays.Inputs(op)
    ka = inputs.array(k, "k", ndim=4, dtypes=(f16, bf16), form="[B, Hkv, Sq, D]")
    va = inputs.array(v, "v", ndim=4, shape=ka.shape, form="[B, Hkv, Sq, D]")
    batch, kv_heads, sq, d = ka.shape
    if 0 in ka.shape:
        raise inputs.error("k", f"has an empty dimension: shape {ka.shape}")
    cache = _Cache(inputs, k_cache, v_cache, block_table, batch, d, ka.dtype)
    if cache.kv_heads != kv_heads:
        raise inputs.error(
            "k_cache", f"has Hkv = {cache.kv_heads} heads; k has {kv_heads} (shape {ka.shape})"
        )
    lens = _lengths(inputs, seq_lens, batch)
    _host_check(inputs, lens, cache, APPEND.debug)
    vec = 8 if d % 8 == 0 and all(a.aligned(16) for a in (ka, va)) else 1
    chunks = ka.size // vec
    APPEND[-(-chunks // 256), 256, _arrays.stream_of(ka), 0](
        cache.k.arg(cache.k.size), cache.v.arg(cache.v.size), ka.arg(ka.size), va.arg(va.size),
        lens.arg(batch), cache.table_arg(ka), kv_heads, sq, d, *cache.geometry(), chunks,
        PAGED=cache.paged, VEC=vec, DT=ka.dtype,
    )  # fmt: skip


def _shipped_fwd(dtype, dp: int, mt: int, paged: bool, swap: int):
    """(DECODE, constexprs) of each stage count and merge of one family of ``decode_fwd``
    (the one-split grid at its stages with and without OWN, which depends on the grid)."""
    base = {"DP": dp, "MT": mt, "PAGED": paged, "DT": dtype, "SWAP": swap, "OWN": 0, "SORT": 0}
    base["PW"] = int(PAGE_WINDOW and paged)
    one = one_split_stages(dp, mt, paged)
    for direct, fused in ((True, False), (False, False), (False, True)):
        flags = {**base, "DIRECT": direct, "FUSED": fused, "CL": 1}
        flags["SPEC"] = speculates(paged, 1 if direct else 2)
        for stages in sorted({stages_for(dp, mt), deep_stages(dp, mt), one}):
            for sort in sort_sizes(paged, direct):
                tile = {**flags, "STAGES": stages, "SORT": sort}
                yield DECODE, {**tile, "SYNC1": stage_syncs(stages)}
                if direct and stages in (one, LONG_STAGES) and owns(mt, paged, True):
                    yield DECODE, {**tile, "SYNC1": 0, "OWN": 1}
    # merged through a cluster (sm_90), a block a multiprocessor
    flags = {**base, "DIRECT": False, "FUSED": False, "SPEC": speculates(paged, 2)}
    stages = deep_stages(dp, mt)
    for cl in CLUSTERS:
        for own in sorted({0, owns(mt, paged, False, cl)}):  # (OWN: splits of few tiles)
            sync1 = stage_syncs(stages, own)
            yield DECODE, {**flags, "STAGES": stages, "CL": cl, "SYNC1": sync1, "OWN": own}


def _with_pdl(pairs):
    """Each (kernel, constexprs) of ``pairs`` with every PDL ``pdls`` may give it: 0, and 1
    and 2 for a grid of one split (DIRECT, CL 1) over a paged cache."""
    for kernel, constexprs in pairs:
        direct = constexprs["DIRECT"] and constexprs["CL"] == 1 and constexprs["PAGED"]
        for pdl in (0, 1, 2) if direct else (0,):
            yield kernel, {**constexprs, "PDL": pdl}


def shipped():
    """(kernel, constexprs) of every specialization these ops launch."""
    for dtype in (f16, bf16):
        for dp in DIMS:
            for mt in (1, 2, 4):
                for paged in (False, True):
                    for swap in sorted({0, swaps(8 if mt == 1 else 16, dp)}):
                        yield from _with_pdl(_shipped_fwd(dtype, dp, mt, paged, swap))
        for dp in DIMS:
            for mt in (1, 2, 4):
                yield MERGE, {"DP": dp, "MT": mt, "DT": dtype}
        for hkv in PAGE_HEADS if WHOLE_PAGES else ():  # whole-page blocks, D up to 128
            for dp in (64, 128):
                for stages in (2, 3):  # A100 / H100, H200
                    for direct in (False, True):
                        flags = {"HKV": hkv, "DP": dp, "STAGES": stages, "DIRECT": direct}
                        yield PAGES, {**flags, "DT": dtype, "SPEC": int(PAGE_SPEC)}
        for dp in (128,) if FOLD_SEQS else ():  # two sequences a block
            for sort in (256, 512, 1024):  # (FOLD_MIN_PAGES to FOLD_SORT)
                for pair in (0, 64, 128, 256):
                    if pair <= FOLD_PAIR and 2 * pair <= sort:
                        flags = {"DP": dp, "STAGES": FOLD_STAGES, "FOLD": FOLD_SEQS, "SORT": sort}
                        yield FOLDED, {**flags, "PAIR": pair, "SPEC": FOLD_SPEC, "DT": dtype}
        for paged in (False, True):
            for vec in (1, 8):
                yield APPEND, {"PAGED": paged, "VEC": vec, "DT": dtype}
