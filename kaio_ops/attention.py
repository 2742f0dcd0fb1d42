"""Attention ops: f32 flash attention (forward with stats, backward; on the SIMT cores, or
the tensor cores in 3xTF32 up to head dim 128), and
tensor-core attention for f16/bf16 (single-head ``attention_tc`` with f32 output, multi-head
grouped-query ``flash_attention``).

The kernels are DSL code in ``kaio_ops._attention_simt`` and ``kaio_ops._attention_tc``;
on an sm_90 GPU (H100, H200) ``flash_attention``'s forward runs ``kaio_ops._attention_hopper``
(TMA, wgmma, warp specialization) where it measured faster (``hopper_takes``;
``KAIO_HOPPER_ATTENTION=0`` opts out): the same contract and outputs (lse included), to the
rounding of P; its backward likewise runs ``kaio_ops._attention_hopper_bwd`` (two wgmma
kernels, deterministic). This module checks the inputs, picks
the specialization and the grid, and launches. Scores are
scaled by ``1/sqrt(D)`` (``scale`` where given); causal attention masks key ``j > i`` (query
``i``, both counted from 0, as torch's ``is_causal``). A row with no valid key gets zeros
(and a logsumexp of -inf), never NaN.
"""

from __future__ import annotations

import functools
import heapq
import math
import os
from typing import NamedTuple

from kaio.sim import active as simulating
from kaio.types import bf16, f16, f32
from kaio_ops import _arrays
from kaio_ops import _attention_hopper as hopper
from kaio_ops import _attention_hopper_bwd as hopper_bwd
from kaio_ops import _attention_hopper_bwd256 as hopper_bwd256
from kaio_ops import _attention_simt as simt
from kaio_ops import _attention_tc as tc
from kaio_ops._plan import planned

__all__ = [
    "attention_tc",
    "attention_tc_causal",
    "flash_attention",
    "flash_attention_bwd",
    "flash_attention_with_stats",
    "attention_flash",
    "attention_flash_bwd",
    "attention_flash_bwd_causal",
    "attention_flash_causal",
    "attention_flash_with_stats",
]

SM_SHARED = 228 * 1024  # shared memory of one H100/H200 multiprocessor
MAX_SPLITS = 16
MAX_HEAD_DIM = 256


def _vec(d: int, *operands: _arrays.Operand) -> bool:
    """16-byte copies: rows of whole 16-byte chunks and every array 16-byte aligned."""
    return d % 4 == 0 and all(a.aligned(16) for a in operands)


def splits_for(q_tiles: int, k_tiles: int, blocks_per_sm: int, sms: int) -> int:
    """Key splits for ``q_tiles`` query tiles over ``k_tiles`` key tiles: none when the query
    tiles alone fill every multiprocessor slot, else the count that minimizes waves x tiles
    per block (the fewest on ties), so that short sequences still fill the GPU."""
    slots = max(1, blocks_per_sm) * sms
    if q_tiles >= slots:
        return 1
    best, best_cost = 1, math.inf
    for s in range(1, min(MAX_SPLITS, k_tiles) + 1):
        cost = math.ceil(q_tiles * s / slots) * math.ceil(k_tiles / s)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


@functools.cache
def causal_splits(q_tiles: int, k_tiles: int, slots: int) -> int:
    """Key splits for causal attention over ``q_tiles`` query tiles (block x the tile
    q_tiles - 1 - x: the heaviest first) and ``k_tiles`` key tiles of the same 64 rows: the
    count whose blocks, in launch order each to the first slot free, finish first (the
    fewest on ties); a block costs its key tiles and one more (its query tile, its rows
    out)."""
    if q_tiles >= 2 * slots:  # (the heaviest tiles first fill two waves evenly)
        return 1
    best, best_cost = 1, math.inf
    for s in range(1, min(MAX_SPLITS, k_tiles) + 1):
        per = -(-k_tiles // s)
        free = [0] * slots
        for y in range(-(-k_tiles // per)):
            for x in range(q_tiles):
                work = max(0, min(per, min(k_tiles, q_tiles - x) - y * per))
                heapq.heappush(free, heapq.heappop(free) + (work + 1 if work else 0))
        if max(free) < best_cost:
            best, best_cost = s, max(free)
    return best


# --------------------------------------------------------------------------- f32 flash


def _check_f32(op: str, arrays: list[tuple[object, str]]) -> tuple:
    """Check f32 [S, D] arrays of one shape (the first fixes it), D <= 256; returns the
    ``Inputs`` (to check more arguments) and the operands."""
    inputs = _arrays.Inputs(op)
    first = inputs.array(arrays[0][0], arrays[0][1], ndim=2, dtypes=(f32,), form="[S, D]")
    s, d = first.shape
    if s == 0 or d == 0:
        raise inputs.error(arrays[0][1], f"has an empty dimension: shape {first.shape}")
    if d > MAX_HEAD_DIM:
        raise inputs.error(arrays[0][1], f"has head dim D = {d}; {op} takes D <= {MAX_HEAD_DIM}")
    out = [first]
    for obj, name in arrays[1:]:
        out.append(inputs.array(obj, name, ndim=2, shape=first.shape, dtypes=(f32,), form="[S, D]"))
    return inputs, out


def flash_forward(op: str, q, k, v, causal: bool, splits: int | None = None):
    """(out, lse) of f32 flash attention; ``splits``: key splits (None: ``splits_for``)."""
    _, (qa, ka, va) = _check_f32(op, [(q, "q"), (k, "k"), (v, "v")])
    s, d = qa.shape
    dp = simt.padded_dim(d)
    on_tc = f32_tc(dp)
    kernel = simt.flash_fwd_mma if on_tc else simt.flash_fwd
    smem = simt.fwd_mma_shared_bytes(dp) if on_tc else simt.fwd_shared_bytes(dp)
    q_tiles = -(-s // simt.ROWS)
    k_tiles = -(-s // 64)
    if splits is None:
        fits = SM_SHARED // (smem + 1024)
        sms = _arrays.multiprocessors(qa)
        if causal:
            splits = causal_splits(q_tiles, k_tiles, max(1, fits) * sms)
        else:
            splits = splits_for(q_tiles, k_tiles, fits, sms)
    per_split = -(-k_tiles // splits)
    splits = -(-k_tiles // per_split)
    out = _arrays.output(qa, (s, d), f32)
    lse = _arrays.output(qa, (s,), f32)
    vec = _vec(d, qa, ka, va)
    stream = _arrays.stream_of(qa)
    part, part_lse = out, lse
    if splits > 1:
        part = _arrays.output(qa, (splits * s, d), f32)
        part_lse = _arrays.output(qa, (splits * s,), f32)
    kernel[(q_tiles, splits), simt.NT, stream, smem](
        q, k, v, part, part_lse, math.log2(math.e) / math.sqrt(d), per_split, causal, vec,
        DP=dp, **({"TC": on_tc} if on_tc else {}),
    )  # fmt: skip
    if splits > 1:
        simt.combine_splits[-(-s * d // 256), 256, stream, 0](part, part_lse, out, lse, splits)
    return out, lse


# The f32 kernels' products by padded head dim (``TC``): on the tensor cores in 3xTF32
# (``simt.mma_tile``: ``flash_fwd_mma``, ``flash_bwd_shares``, ``flash_bwd_dq_ds``), 2 with
# every k a constant (the 64-k parts unrolled), 1 in a loop; absent (D 256): on the SIMT
# cores. Measured on an H100, kernel time, GPU rounds B and C of 2026-11-28 (µs, SIMT ->
# TC 1 -> TC 2): backward S8192 D128 2675 -> 1969 -> 1934 (SDPA efficient 2392), S4096 D128
# 719 -> 557 -> 587, S8192 D64 1522 -> 1188 -> 1146, S4096 D64 411 -> 345 -> 336; forward
# S8192 D64 599 -> 449 -> 434, S4096 D64 causal 124 -> 101 -> 86; as accurate as the SIMT
# kernels against float64.
F32_TC = {64: 2, 128: 1}


def f32_tc(dp: int) -> int:
    """``TC`` of the f32 kernels of padded head dim ``dp`` (``F32_TC``; 0: the SIMT cores)."""
    return F32_TC.get(dp, 0)


@planned("q", "k", "v")
def attention_flash(q, k, v):
    """Attention ``softmax(q k^T / sqrt(D)) v`` for f32 q, k, v [S, D] (D <= 256), on the
    SIMT cores with an online softmax (its products on the tensor cores in 3xTF32 up to
    D = 128: as accurate as f32 FMAs); no S x S matrix is formed. Returns f32 [S, D]."""
    return flash_forward("attention_flash", q, k, v, False)[0]


@planned("q", "k", "v")
def attention_flash_causal(q, k, v):
    """``attention_flash`` with the causal mask: query i sees keys j <= i."""
    return flash_forward("attention_flash_causal", q, k, v, True)[0]


@planned("q", "k", "v")
def attention_flash_with_stats(q, k, v, causal: bool = False):
    """``(out, lse)``: ``attention_flash`` (or the causal one) and the natural logsumexp of
    each row's scaled scores, f32 [S], which ``attention_flash_bwd`` takes."""
    return flash_forward("attention_flash_with_stats", q, k, v, bool(causal))


def flash_backward(op: str, do, q, k, v, o, lse, causal: bool):
    """(dq, dk, dv) of f32 flash attention: FlashAttention-2's backward (delta = rowsum(dO O),
    then each key tile's dK/dV steps over its query tiles and each query tile's dQ steps)
    with one block a multiprocessor, each the same share of the steps (``bwd_shares``,
    ``simt.flash_bwd_shares``), each tile's pieces added in order after (``add_pieces``).
    Where dS fits ``F32_DS_BYTES`` the dK/dV steps store it and dQ = dS K is a product of
    its own (``simt.flash_bwd_dq_ds``), else the dQ steps recompute P and dP."""
    inputs, (da, qa, ka, va, oa) = _check_f32(
        op, [(do, "do"), (q, "q"), (k, "k"), (v, "v"), (o, "o")]
    )
    s, d = qa.shape
    inputs.array(lse, "lse", ndim=1, shape=(s,), dtypes=(f32,), form="[S]")
    dp = simt.padded_dim(d)
    c = simt.bwd_cols(dp)
    vec = _vec(d, da, qa, ka, va, oa)
    stream = _arrays.stream_of(da)
    delta = _arrays.output(da, (s,), f32)
    outs = tuple(_arrays.output(da, (s, d), f32) for _ in range(3))  # dq, dk, dv
    scale = 1.0 / math.sqrt(d)
    tc.row_dot[-(-s // 8), 256, stream, 0](oa.arg(s * d), da.arg(s * d), delta, s, d, DT=f32)
    tiles = -(-s // simt.ROWS)
    ds_rows = (simt.ds_block.__wrapped__(tiles - 1, tiles - 1, tiles, causal) + 1) * simt.ROWS
    ds = ds_rows * simt.ROWS * 4 <= F32_DS_BYTES
    sms = _arrays.multiprocessors(da)
    key = ("f32 bwd", s, dp, bool(causal), sms, ds, DQ_DS_BLOCKS, F32_STEP_COST)
    plan = _SHARES.get(key)
    if plan is None:  # (Python loops over the steps: once a shape)
        plan = _SHARES[key] = bwd_shares(s, dp, bool(causal), sms, ds)
    starts = hopper.planned_tiles(da, (*key, "starts"), lambda: plan.starts)
    tables = [hopper.planned_tiles(da, (*key, i), lambda t=t: t) for i, t in enumerate(plan.tables)]
    ws = _arrays.output(da, (plan.slots * simt.ROWS, d), f32)
    dsw = _arrays.output(da, (ds_rows if ds else 1, simt.ROWS), f32)
    smem = max(simt.dq_shared_bytes(dp, c), simt.dkdv_shared_bytes(dp, c))
    on_tc = f32_tc(dp)
    simt.flash_bwd_shares[len(tables[0]) // plan.per_block[0], simt.NT, stream, smem](
        q, k, v, do, lse, delta, tables[0], ws, dsw, math.log2(math.e) * scale, causal, vec,
        plan.per_block[0], plan.dk_slots, DP=dp, C=c, DS=int(ds), TC=on_tc,
    )  # fmt: skip
    if ds:
        bufs = dq_ds_bufs(dp, on_tc)
        simt.flash_bwd_dq_ds[len(tables[1]) // plan.per_block[1], simt.NT, stream,
                             simt.dq_ds_shared_bytes(dp, bufs, on_tc)](
            k, dsw, tables[1], ws, causal, vec, plan.per_block[1], DP=dp, BUFS=bufs, TC=on_tc
        )  # fmt: skip
    simt.add_pieces[(-(-s * d // 256), 3), 256, stream, 0](ws, starts, *outs, plan.dk_slots, scale)
    return outs


# The most bytes of dS that the f32 backward stores for its dQ product (``flash_backward``;
# beyond, its dQ steps recompute P and dP: three products a tile instead of one). 1 GiB:
# S 16384 (23104 causal) at most. Measured on an H100, S16384 D128, kernel time, GPU round F
# of 2026-11-28 (µs, plain / causal): stored 7646 / 3996, recomputed (the bound at 256
# MiB) 11281 / 6019, SDPA efficient 9705 / 5150.
F32_DS_BYTES = 1 << 30

# The cost of a tile step (``bwd_shares``): dK and dV (4 products), dQ (3), dQ from dS (1).
# (The kernels of a dQ and a dK/dV block per 64 rows, alone: 860 and 1087 µs at S4096 D128.)
F32_STEP_COST = (4, 3, 1)

# Blocks a multiprocessor of ``simt.flash_bwd_dq_ds`` (``bwd_shares``).
DQ_DS_BLOCKS = 2


def dq_ds_bufs(dp: int, tc: int) -> int:
    """``simt.flash_bwd_dq_ds``' tile buffers: 2 (the next tiles' copies over each product)
    where ``DQ_DS_BLOCKS`` blocks of them fit a multiprocessor, else 1."""
    fits = DQ_DS_BLOCKS * (simt.dq_ds_shared_bytes(dp, 2, tc) + 1024) <= SM_SHARED
    return 2 if fits else 1


_SHARES: dict = {}  # flash_backward's plans, made once a shape


class Shares(NamedTuple):
    """``bwd_shares``' plan: ``tables`` int32 [blocks x per_block, 5] of items (kind, tile,
    t0, t1, slot; kind -1 pads) for ``flash_bwd_shares`` (and ``flash_bwd_dq_ds``),
    ``per_block`` the items a block of each; ``starts`` int32 [2 (tiles + 1)]: the first
    workspace slot of each query tile's dQ pieces, then of each key tile's dK pieces (its
    dV pieces ``dk_slots`` further); ``slots`` in all."""

    tables: tuple
    per_block: tuple
    starts: object
    dk_slots: int
    slots: int


def share_runs(runs: list, blocks: int) -> list:
    """The items of each of ``blocks`` blocks (fewer where there are fewer steps) whose
    shares of ``runs`` (kind, tile, t0, t1, cost of a step), their steps in order, cost the
    same: each step to the block whose share holds its middle, a block's steps of one tile
    one item [kind, tile, t0, t1, slot (0 for now)]."""
    total = sum((t1 - t0) * cost for _, _, t0, t1, cost in runs)
    share = [[] for _ in range(max(1, min(blocks, sum(t1 - t0 for _, _, t0, t1, _ in runs))))]
    done = 0
    for kind, tile, t0, t1, cost in runs:
        for t in range(t0, t1):
            b = min(len(share) - 1, int((done + cost / 2) * len(share) // total))
            done += cost
            if share[b] and share[b][-1][:2] == [kind, tile]:
                share[b][-1][3] = t + 1
            else:
                share[b].append([kind, tile, t, t + 1, 0])
    return share


def item_table(share: list) -> tuple:
    """(int32 [blocks x per_block, 5], per_block): ``share_runs``' items, kind -1 pads."""
    import numpy as np

    per_block = max(len(items) for items in share)
    table = np.full((len(share) * per_block, 5), -1, np.int32)
    for b, items in enumerate(share):
        if items:  # (a share may be empty where a step costs more than a share)
            table[b * per_block : b * per_block + len(items)] = items
    return table, per_block


def bwd_shares(s: int, dp: int, causal: bool, blocks: int, ds: bool = False) -> Shares:
    """The f32 backward's plan (``Shares``) for S = ``s``, padded head dim ``dp`` on
    ``blocks`` multiprocessors: each key tile's dK/dV steps over its query tiles, then each
    query tile's dQ steps over its key tiles (``F32_STEP_COST``), in equal shares
    (``share_runs``); ``ds``: the dQ steps (from dS, a 64-key tile each) a second plan, of
    ``DQ_DS_BLOCKS`` blocks a multiprocessor."""
    import numpy as np

    rows = 16 * simt.bwd_cols(dp)  # of the dK/dV steps' query tiles, of the dQ steps' key tiles
    inner = -(-s // rows)
    tiles = -(-s // simt.ROWS)
    # causal: the queries before a key tile see none of it, a query tile no key past its own
    dkdv = [(0, x, x * simt.ROWS // rows if causal else 0, inner, F32_STEP_COST[0])
            for x in range(tiles)]  # fmt: skip
    if ds:
        dq = [(1, y, 0, min(tiles, y + 1) if causal else tiles, F32_STEP_COST[2])
              for y in range(tiles)]  # fmt: skip
        shares = [share_runs(dkdv, blocks), share_runs(dq, DQ_DS_BLOCKS * blocks)]
    else:
        dq = [(1, y, 0, min(inner, -(-(y + 1) * simt.ROWS // rows)) if causal else inner,
               F32_STEP_COST[1]) for y in range(tiles)]  # fmt: skip
        shares = [share_runs(dkdv + dq, blocks)]
    pieces = [[[] for _ in range(tiles)] for _ in range(2)]
    for share in shares:
        for items in share:
            for item in items:
                pieces[item[0]][item[1]].append(item)
    dk_slots = sum(len(p) for p in pieces[0])
    starts = np.zeros(2 * (tiles + 1), np.int32)
    for kind, at, slot in ((1, 0, 2 * dk_slots), (0, tiles + 1, 0)):  # [dK | dV | dQ]
        for tile in range(tiles):
            starts[at + tile] = slot
            for item in pieces[kind][tile]:
                item[4] = slot
                slot += 1
        starts[at + tiles] = slot
    tables = [item_table(share) for share in shares]
    return Shares(
        tuple(t for t, _ in tables),
        tuple(n for _, n in tables),
        starts,
        dk_slots,
        2 * dk_slots + sum(len(p) for p in pieces[1]),
    )


@planned("do", "q", "k", "v", "o", "lse")
def attention_flash_bwd(do, q, k, v, o, lse):
    """Gradients ``(dq, dk, dv)`` of ``attention_flash`` from the output gradient ``do``, the
    inputs, the output ``o`` and the stats ``lse`` of ``attention_flash_with_stats``: all f32
    [S, D], D <= 256 (lse [S]). FlashAttention-2's backward, P recomputed a tile at a time, the
    work in equal shares over the multiprocessors (``flash_backward``), dQ from a stored dS
    where it fits ``F32_DS_BYTES``; no atomics (each tile's pieces added in a fixed order:
    deterministic)."""
    return flash_backward("attention_flash_bwd", do, q, k, v, o, lse, False)


@planned("do", "q", "k", "v", "o", "lse")
def attention_flash_bwd_causal(do, q, k, v, o, lse):
    """``attention_flash_bwd`` for ``attention_flash_causal``."""
    return flash_backward("attention_flash_bwd_causal", do, q, k, v, o, lse, True)


# --------------------------------------------------------------------------- tensor cores


TC_DIMS = (16, 32, 64, 128, 256)  # the padded head dims of the tensor-core kernel
FLASH_DIMS = (64, 128, 256)  # those flash_attention and its backward use
FUSED_DKDV_DIM = 128  # up to this DP, one block accumulates both dK and dV in registers


def dkdv_passes(dp: int) -> tuple:
    """``(WITH_DK, WITH_DV)`` of each launch of the dK/dV kernel for padded head dim ``dp``:
    one launch for both up to ``FUSED_DKDV_DIM``, then one each (dK first)."""
    return ((True, True),) if dp <= FUSED_DKDV_DIM else ((True, False), (False, True))


def _pow2_dim(d: int, dims: tuple = TC_DIMS) -> int:
    """``DP`` of the tensor-core kernels: the smallest of ``dims`` holding ``d``."""
    return next(dp for dp in dims if d <= dp)


def tc_config(dp: int) -> dict:
    """Warps, keys per tile and blocks per multiprocessor of the tensor-core forward for
    padded head dim ``dp`` (4 warps: 64 query rows a block)."""
    if dp > 128:
        return {"WARPS": 4, "BN": 32, "MIN_BLOCKS": 2}
    return {"WARPS": 4, "BN": 64, "MIN_BLOCKS": 2 if dp == 128 else 4}


def tc_shared_bytes(dp: int, warps: int, bn: int) -> int:
    """Dynamic shared memory of ``attention_fwd``: the Q, K and V tiles."""
    return (16 * warps + 2 * bn) * dp * 2


def bwd_tile(dp: int) -> int:
    """Keys (dQ kernel) and queries (dK/dV kernel) per tile of the backward."""
    return 64 if dp <= 64 else 32


def tc_forward(qa, ka, va, out_type, out_shape: tuple, dims: tuple, causal: bool, scale: float,
               dp: int, config: dict | None = None):  # fmt: skip
    """Launch the tensor-core forward on checked operands q, k, v of one 16-bit type; returns
    its new ``out_type`` output of ``out_shape`` and the f32 row logsumexp (``out_shape``
    without its last axis: [batch, heads, sq] or [sq]).
    ``dims``: (batch * heads, heads, group, sq, sk, d, dv); ``dp``: the padded head dim;
    ``config``: WARPS, BN and MIN_BLOCKS (default ``tc_config``)."""
    bh, heads, group, sq, sk, d, dv = dims
    cfg = dict(config or tc_config(dp))
    vec = d % 8 == 0 and dv % 8 == 0 and all(a.aligned(16) for a in (qa, ka, va))
    out = _arrays.output(qa, out_shape, out_type)
    lse = _arrays.output(qa, out_shape[:-1], f32)
    rows = 16 * cfg["WARPS"]
    smem = tc_shared_bytes(dp, cfg["WARPS"], cfg["BN"])
    flat = [a.arg(a.size) for a in (qa, ka, va)]
    out_flat = _arrays.output_arg(qa, out, (bh * sq * dv,), out_type)
    lse_flat = _arrays.output_arg(qa, lse, (bh * sq,), f32)
    tc.attention_fwd[(-(-sq // rows), bh), 32 * cfg["WARPS"], _arrays.stream_of(qa), smem](
        *flat, out_flat, lse_flat, sq, sk, d, dv, heads, group, math.log2(math.e) * scale, causal,
        DP=dp, VEC=vec, **cfg, DT=qa.dtype, OT=out_type,
    )  # fmt: skip
    return out, lse


def _check_tc(op: str, q, k, v) -> tuple:
    """Check attention_tc's f16 q [Sq, D], k [Sk, D], v [Sk, Dv]."""
    inputs = _arrays.Inputs(op)
    qa = inputs.array(q, "q", ndim=2, dtypes=(f16,), form="[Sq, D]")
    ka = inputs.array(k, "k", ndim=2, dtypes=(f16,), form="[Sk, D]")
    va = inputs.array(v, "v", ndim=2, dtypes=(f16,), form="[Sk, Dv]")
    d, (sk, dk), (sv, dv) = qa.shape[1], ka.shape, va.shape
    if dk != d:
        raise inputs.error("k", f"must have D = {d} columns like q, got shape {ka.shape}")
    if sv != sk:
        raise inputs.error("v", f"must have Sk = {sk} rows like k, got shape {va.shape}")
    for a in (qa, ka, va):
        if 0 in a.shape:
            raise inputs.error(a.name, f"has an empty dimension: shape {a.shape}")
    for name, n in (("q", d), ("v", dv)):
        if n > MAX_HEAD_DIM:
            raise inputs.error(name, f"has {n} columns; {op} takes head dims up to {MAX_HEAD_DIM}")
    return qa, ka, va


def _attention_tc(op: str, q, k, v, causal: bool):
    qa, ka, va = _check_tc(op, q, k, v)
    (sq, d), (sk, dv) = qa.shape, va.shape
    dims = (1, 1, 1, sq, sk, d, dv)
    dp = _pow2_dim(max(d, dv))
    return tc_forward(qa, ka, va, f32, (sq, dv), dims, causal, 1.0 / math.sqrt(d), dp)[0]


@planned("q", "k", "v")
def attention_tc(q, k, v):
    """Attention ``softmax(q k^T / sqrt(D)) v`` on tensor cores: f16 q [Sq, D], k [Sk, D],
    v [Sk, Dv] (D, Dv <= 256; any Sq, Sk), f32 accumulation, an online softmax over key tiles
    (no Sq x Sk matrix). Returns f32 [Sq, Dv]."""
    return _attention_tc("attention_tc", q, k, v, False)


@planned("q", "k", "v")
def attention_tc_causal(q, k, v):
    """``attention_tc`` with the causal mask: query i sees keys j <= i."""
    return _attention_tc("attention_tc_causal", q, k, v, True)


def check_heads(inputs, arrays: tuple, h: int, hkv: int, d: int, kd: int, scale) -> float:
    """The checks ``flash_attention`` and ``flash_attention_varlen`` share: k's head dim
    ``kd`` equal to q's ``d`` (a multiple of 8 up to 256), ``hkv`` dividing ``h``, the arrays
    (q, k, v) 16-byte aligned and ``scale`` positive and finite; returns the scale (default
    1/sqrt(D))."""
    op = inputs.op
    if kd != d:
        raise inputs.error("k", f"must have head dim D = {d} like q, got shape {arrays[1].shape}")
    if hkv == 0 or h % hkv:
        raise inputs.error(
            "k", f"has Hkv = {hkv} heads, which must divide q's H = {h} (grouped-query)"
        )
    if d % 8 or d > MAX_HEAD_DIM:
        raise inputs.error(
            "q", f"has head dim D = {d}; {op} takes multiples of 8 up to {MAX_HEAD_DIM}"
        )
    for a in arrays:
        if not a.aligned(16):
            raise inputs.error(a.name, "must start on a 16-byte boundary (16-byte copies)")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{op}: scale must be a positive finite number, got {scale!r}")
    return float(scale)


def _check_flash(op: str, q, k, v, scale, inputs=None):
    """Check flash_attention's q [B, H, S, D], k, v [B, Hkv, Sk, D] (f16 or bf16, 16-byte
    aligned); returns the operands, dims (B * H, H, group, S, Sk, D, D) and the scale."""
    inputs = inputs or _arrays.Inputs(op)
    qa = inputs.array(q, "q", ndim=4, dtypes=(f16, bf16), form="[B, H, S, D]")
    ka = inputs.array(k, "k", ndim=4, form="[B, Hkv, Sk, D]")
    va = inputs.array(v, "v", ndim=4, shape=ka.shape, form="[B, Hkv, Sk, D]")
    b, h, sq, d = qa.shape
    kb, hkv, sk, kd = ka.shape
    if 0 in qa.shape or 0 in ka.shape:
        raise inputs.error("q" if 0 in qa.shape else "k", "has an empty dimension")
    if kb != b:
        raise inputs.error("k", f"must have batch B = {b} like q, got shape {ka.shape}")
    scale = check_heads(inputs, (qa, ka, va), h, hkv, d, kd, scale)
    return (qa, ka, va), (b * h, h, h // hkv, sq, sk, d, d), float(scale)


def hopper_takes(qa, dims: tuple, module=hopper) -> bool:
    """Whether ``flash_attention`` runs ``kaio_ops._attention_hopper`` (TMA, wgmma) rather
    than the mma.sync kernel (``module``: ``_attention_hopper_bwd`` for
    ``flash_attention_bwd``): an sm_90 GPU (never under the simulator, whose tests launch the
    kernels directly; ``KAIO_HOPPER_ATTENTION=0`` opts out), a head dim the kernel takes
    (``module.eligible``) and a case where it measured faster (``module.worthwhile``)."""
    if not hopper_gpu(qa):
        return False
    bh, _, _, sq, sk, d, _ = dims
    return module.eligible(d) and module.worthwhile(bh, sq, sk, d, _arrays.multiprocessors(qa))


def hopper_gpu(qa) -> bool:
    """Whether ``qa`` lives on an sm_90 GPU whose Hopper attention kernels may run: never
    under the simulator (its tests launch those kernels directly), and not with
    ``KAIO_HOPPER_ATTENTION=0`` (the opt-out)."""
    if os.environ.get("KAIO_HOPPER_ATTENTION") == "0" or simulating():
        return False
    dev = _arrays.gpu(qa)
    return dev is not None and dev.arch == "sm_90"


def _flash(op: str, q, k, v, causal, scale):
    (qa, ka, va), dims, scale = _check_flash(op, q, k, v, scale)
    if hopper_takes(qa, dims):
        return hopper.launch(qa, ka, va, dims, bool(causal), scale)
    dp = _pow2_dim(dims[5], FLASH_DIMS)
    out, lse = tc_forward(qa, ka, va, qa.dtype, qa.shape, dims, bool(causal), scale, dp)
    return out, lse


@planned("q", "k", "v")
def flash_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """Multi-head attention on tensor cores (FlashAttention-2 forward): q [B, H, S, D], k and v
    [B, Hkv, Sk, D] of f16 or bf16, H a multiple of Hkv (grouped-query: query head h reads
    K/V head h // (H // Hkv)), D a multiple of 8 up to 256, arrays 16-byte aligned. Scores are
    scaled by ``scale`` (default 1/sqrt(D)); ``causal`` masks key j > i (torch's is_causal,
    aligned top-left; ``flash_attention_varlen`` aligns bottom-right as FlashAttention: the
    same when Sq == Sk). Returns [B, H, S, D] of q's dtype."""
    return _flash("flash_attention", q, k, v, causal, scale)[0]


@planned("q", "k", "v")
def flash_attention_with_stats(q, k, v, causal: bool = False, scale: float | None = None):
    """``(out, lse)``: ``flash_attention`` and the natural logsumexp of each row's scaled
    scores, f32 [B, H, S], which ``flash_attention_bwd`` takes."""
    return _flash("flash_attention_with_stats", q, k, v, causal, scale)


@planned("do", "q", "k", "v", "o", "lse")
def flash_attention_bwd(
    do, q, k, v, o, lse, causal: bool = False, scale: float | None = None,
    deterministic: bool = False,
):  # fmt: skip
    """Gradients ``(dq, dk, dv)`` of ``flash_attention`` (FlashAttention-2 backward on tensor
    cores) from the output gradient ``do`` and ``o`` [B, H, S, D], the inputs q, k, v and the
    stats ``lse`` [B, H, S] (f32) of ``flash_attention_with_stats``, with the same ``causal``
    and ``scale``. D a multiple of 8 up to 256. dK and dV of a K/V head sum over the query
    heads of its group. P is recomputed a tile at a time (no S x S matrix), dQ and dK/dV come
    from two kernels (for D > 128, dK and dV from one launch each), without atomics:
    deterministic. On sm_90 for D 64 and 128 (``hopper_takes``) the wgmma kernels run
    instead: by default (``_attention_hopper_bwd_fused.ORDERED``) one kernel for dK, dV and
    dQ whose key blocks add each query tile's dQ in f32 in a fixed order (semaphores): the
    same bits every run; else ``kaio_ops._attention_hopper_bwd``'s deterministic pair, or
    where ``_attention_hopper_bwd.FUSED`` says so (nowhere by default) its fused kernel whose
    dQ additions come in a varying order. ``deterministic=True`` (or
    ``KAIO_ATTENTION_DETERMINISTIC=1``) never takes that one: the same bits every run. At
    D 256 on sm_90 (whole 64-row tiles, S >= 1024) ``kaio_ops._attention_hopper_bwd256``'s
    wgmma kernels run (no atomics: the same bits every run); there the dK/dV kernel also
    writes dS, rounded to the input type, to a workspace of at most
    ``_attention_hopper_bwd256.DS_BYTES`` (K/V heads in turn where all of them do not fit)
    from which one product makes dQ."""
    op = "flash_attention_bwd"
    inputs = _arrays.Inputs(op)
    da = inputs.array(do, "do", ndim=4, dtypes=(f16, bf16), form="[B, H, S, D]")
    (qa, ka, va), dims, scale = _check_flash(op, q, k, v, scale, inputs=inputs)
    if da.shape != qa.shape or da.dtype != qa.dtype:
        raise inputs.error("do", f"must be like q: {qa.dtype.name} {qa.shape}, got {da.shape}")
    oa = inputs.array(o, "o", ndim=4, shape=qa.shape, form="[B, H, S, D]")
    la = inputs.array(lse, "lse", ndim=3, shape=qa.shape[:3], dtypes=(f32,), form="[B, H, S]")
    for a in (da, oa):
        if not a.aligned(16):
            raise inputs.error(a.name, "must start on a 16-byte boundary (16-byte copies)")
    bh, heads, group, sq, sk, d, _ = dims
    dp = _pow2_dim(d, FLASH_DIMS)
    tile = bwd_tile(dp)
    delta = _arrays.output(da, (bh * sq,), f32)  # rowsum(dO * O), written by the launch
    if hopper_takes(qa, dims, hopper_bwd):  # sm_90: the wgmma kernels
        fixed = deterministic or os.environ.get("KAIO_ATTENTION_DETERMINISTIC") == "1"
        return hopper_bwd.launch(
            qa, ka, va, da, la, delta, dims, bool(causal), scale, deterministic=fixed, o=oa
        )
    tc.fill_delta(oa, da, delta, bh * sq, d)
    if hopper_takes(qa, dims, hopper_bwd256):  # sm_90, D 256: its wgmma kernels
        return hopper_bwd256.launch(qa, ka, va, da, la, delta, dims, bool(causal), scale)
    stream = _arrays.stream_of(da)
    flat = [a.arg(a.size) for a in (qa, ka, va, da)]
    dq = _arrays.output(da, qa.shape)
    dk, dv = (_arrays.output(da, ka.shape) for _ in range(2))
    out_flat = [_arrays.output_arg(da, x, (x_size,)) for x, x_size in
                ((dq, qa.size), (dk, ka.size), (dv, ka.size))]  # fmt: skip
    lse_flat = la.arg(bh * sq)
    args = (sq, sk, d, heads, group, math.log2(math.e) * scale, scale, bool(causal))
    smem = (128 + 2 * tile) * dp * 2
    types = {"DT": qa.dtype, "OT": qa.dtype}
    tc.attention_bwd_dq[(-(-sq // 64), bh), 128, stream, smem](
        *flat, lse_flat, delta, out_flat[0], *args, DP=dp, BN=tile, **types
    )
    for with_dk, with_dv in dkdv_passes(dp):
        tc.attention_bwd_dkdv[(-(-sk // 64), bh // group), 128, stream, smem](
            *flat, lse_flat, delta, out_flat[1], out_flat[2], *args,
            DP=dp, BQ=tile, WITH_DK=with_dk, WITH_DV=with_dv, **types,
        )  # fmt: skip
    return dq, dk, dv


def shipped():
    """(kernel, constexprs) of every specialization these ops launch."""
    for dp in simt.DIMS:
        on_tc = f32_tc(dp)
        if on_tc:
            yield simt.flash_fwd_mma, {"DP": dp, "TC": on_tc}
        else:
            yield simt.flash_fwd, {"DP": dp}
        for ds in (0, 1):
            cols = simt.bwd_cols(dp)
            yield simt.flash_bwd_shares, {"DP": dp, "C": cols, "DS": ds, "TC": on_tc}
        yield simt.flash_bwd_dq_ds, {"DP": dp, "BUFS": dq_ds_bufs(dp, on_tc), "TC": on_tc}
    yield simt.add_pieces, {}
    yield simt.combine_splits, {}
    for dp in TC_DIMS:
        for vec in (False, True):  # attention_tc: any D
            yield tc.attention_fwd, {"DP": dp, "VEC": vec, **tc_config(dp), "DT": f16, "OT": f32}
    for dtype in (f16, bf16):
        types = {"DT": dtype, "OT": dtype}
        for dp in FLASH_DIMS:  # flash_attention: 16-byte rows
            yield tc.attention_fwd, {"DP": dp, "VEC": True, **tc_config(dp), **types}
            yield tc.attention_bwd_dq, {"DP": dp, "BN": bwd_tile(dp), **types}
            for with_dk, with_dv in dkdv_passes(dp):
                flags = {"WITH_DK": with_dk, "WITH_DV": with_dv}
                yield tc.attention_bwd_dkdv, {"DP": dp, "BQ": bwd_tile(dp), **flags, **types}
    for dtype in (f32, f16, bf16):
        yield tc.row_dot, {"DT": dtype}
    for dtype in (f16, bf16):  # flash_attention_bwd's: D a multiple of 8 up to 256
        for lanes in (1, 2, 4, 8, 16, 32):
            yield tc.row_dot_vec, {"L": lanes, "DT": dtype}
    yield hopper_bwd.dq_zero, {}  # the fused Hopper backward's dQ (f32 sums: SIMT kernels)
    for dtype in (f16, bf16):
        yield hopper_bwd.dq_convert, {"DT": dtype}
        for d in (64, 128):  # its dQ in whole tiles (DQ 5)
            yield hopper_bwd.dq_convert_tiles, {"D": d, "DT": dtype}
