"""Device functions that the Hopper (sm_90a) attention kernels share, the forward
(``kaio_ops._attention_hopper``) and the backward (``kaio_ops._attention_hopper_bwd``): the
threads' roles in a warp-specialized block, the query tile of a block and the key tiles its
rows see, the walk over the tiles of several heads, and the stores of accumulator rows as
16-bit pairs (the ring's stage counter is ``_matmul_hopper.next_stage``)."""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import f32, i32, u32


@kaio.gpu_func
def thread_roles(WG: kaio.constexpr) -> tuple[u32, u32, u32]:
    """The warp-specialized block of ``WG`` consumer warpgroups and a producer warpgroup (the
    last): its launch bounds (128 (WG + 1) threads, one block a multiprocessor), and
    ``(t, wg, lt)``: this thread's index in the block, its warpgroup (warp-uniform as ptxas
    sees it) and its index in its warpgroup."""
    kaio.launch_bounds(WG * 128 + 128, 1)
    t = kaio.thread_idx_x()
    wg = kaio.shfl_idx(t // 128, 0)
    return t, wg, t % 128


@kaio.gpu_func
def query_block(
    heads: i32, group: i32, sk: i32, causal: i32, BM: kaio.constexpr, BN: kaio.constexpr
) -> tuple[i32, i32, i32, i32]:
    """``(bh, kvh, q0, n_tiles)`` of a block that owns ``BM`` query rows: its (batch, head)
    ``bh`` = block y, the K/V head ``kvh`` that it reads (grouped-query attention: each
    ``group`` query heads of a batch share one), its first row ``q0`` (block x counted from
    the last: the heaviest causal tiles start first) and the number of ``BN``-key tiles its
    rows see (causal: up to the diagonal)."""
    bh = i32(kaio.block_idx_y())
    q0 = i32(kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * BM
    kvh, n_tiles = kv_head_and_tiles(bh, q0, heads, group, sk, causal, BM, BN)
    return bh, kvh, q0, n_tiles


@kaio.gpu_func
def kv_head_and_tiles(
    bh: i32, q0: i32, heads: i32, group: i32, sk: i32, causal: i32, BM: kaio.constexpr,
    BN: kaio.constexpr,
) -> tuple[i32, i32]:  # fmt: skip
    """``(kvh, n_tiles)`` of the ``BM`` query rows from ``q0`` of (batch, head) ``bh``: the
    K/V head they read (grouped-query attention: each ``group`` query heads of a batch share
    one) and the number of ``BN``-key tiles they see (causal: up to the diagonal)."""
    kvh = bh // heads * (heads // group) + bh % heads // group
    n_tiles = (sk + BN - 1) // BN
    if causal != 0:
        n_tiles = kaio.min(n_tiles, (q0 + BM + BN - 1) // BN)
    return kvh, n_tiles


@kaio.gpu_func
def key_block_queries(
    kvh: i32, k0: i32, heads: i32, group: i32, sq: i32, causal: i32, BM: kaio.constexpr
) -> tuple[i32, i32, i32]:
    """``(first_head, first, n_tiles)`` of a backward block that owns the keys from ``k0`` of
    K/V head ``kvh`` (block y): the first of the ``group`` query heads that read them, the
    first ``BM``-row query tile that sees them (causal: the queries before k0 see none) and
    the number of query tiles."""
    first_head = kvh // (heads // group) * heads + kvh % (heads // group) * group
    first = i32(0)
    if causal != 0:
        first = k0 // BM
    return first_head, first, (sq + BM - 1) // BM


@kaio.gpu_func
def store_pairs(
    out: DT[:], at0: i32, acc: f32[:, :], h: kaio.constexpr, factor: f32, lane: u32,
    D: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """out[at0 + col] = acc * factor, rounded to DT, for this lane's columns col = 8n + 2
    (lane % 4) + e (n < D / 8, e < 2) of accumulator row half h (the m64nNk16 and m16n8k16
    accumulator layout), the two columns of a pair stored together."""
    at = at0 + i32(lane % 4) * 2
    for n in kaio.static_range(D // 8):
        pair = kaio.local(DT, 2)
        for e in kaio.static_range(2):
            pair[e] = DT(acc[n, 2 * h + e] * factor)
        kaio.store_vector(out, at + n * 8, pair)


@kaio.gpu_func
def next_tile(t: i32, at: i32, first: i32, n_tiles: i32, head: i32) -> tuple[i32, i32]:
    """``(t, at)`` of the next tile of a loop over the tiles ``first`` .. ``n_tiles`` of each
    head in turn: tile ``t`` + 1, back to ``first`` past the last, where ``at`` (where the
    head's rows start) moves to the next head's, ``head`` further."""
    t += 1
    if t == n_tiles:
        t = first
        at += head
    return t, at
