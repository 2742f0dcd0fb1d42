"""The Hopper (sm_90a) forward of ``kaio_ops.flash_attention_varlen``: the dense Hopper
kernel's producer and consumers (``kaio_ops._attention_hopper``: TMA, an mbarrier ring,
warp specialization, ``wgmma``) over a packed batch of variable-length sequences.

The packed q [total_q, H, D] and k, v [total_k, Hkv, D] are seen by the tensor maps as
2-D arrays [total, H * D] (Hkv * D): a head of a sequence is the box of rows from the
sequence's start (``cu_seqlens``, read on the GPU: no synchronization with the host) and
columns from h * D. Block (x, y, z) owns the query tile x (counted from the last: the
heaviest causal tiles start first) of ``64 * WG`` rows, head y, sequence z; a tile past its
sequence's end returns at once (the grid covers the longest sequence, ``max_seqlen_q``).
With ``PERSIST`` 1 a block a multiprocessor walks the same work tiles (``varlen_tile``),
the ring carried from tile to tile as in the dense kernel's persistent blocks (measured
slower on an H100: not the default). ``flash_attention_varlen`` takes this kernel where the
mean lengths reach ``MIN_MEAN`` (``worthwhile``), the mma.sync one below.
Rows past the sequence's end are those of the next sequence (or TMA's zeros past the
array): keys there are masked and their V rows zeroed (``_attention_hopper.zero_tail``),
as the dense kernel does past a head's keys; queries there are computed but never stored
(each consumer thread stores its own rows, below the sequence's length, so a tile never
writes into the next sequence).

Causal attention is aligned bottom-right, as FlashAttention's varlen (and the mma.sync
``_attention_varlen``): query i of a sequence of sq queries and sk keys sees keys
j <= i + sk - sq. The consumers see query rows shifted by sk - sq (the dense kernel's mask,
key <= row, is then this one), and the stores are shifted back (``consume``'s ``o_at``,
``l_at``). A tile whose rows see no key (sk = 0, or every row before the first key) writes
zeros and a logsumexp of -inf without touching the pipeline, as does a row of a tile that
sees no key.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import math

import kaio
from kaio import f32, i32, u32, u64
from kaio_ops import _attention_hopper as hopper
from kaio_ops._attention_hopper import (
    SW,
    consume,
    init_barriers,
    produce,
    producer_start,
    store_rows,
    zero_tail,
)
from kaio_ops._attention_hopper_common import kv_head_and_tiles, thread_roles
from kaio_ops._attention_tc import start_rows
from kaio_ops._attention_varlen import sequence


@kaio.gpu_func
def varlen_tile(
    w: i32, n_qt: i32, cu_q: i32[:], cu_k: i32[:], heads: i32, group: i32, causal: i32,
    BM: kaio.constexpr, BN: kaio.constexpr,
) -> tuple[i32, i32, i32, i32, i32, i32, i32, i32]:  # fmt: skip
    """Work tile ``w`` = x + n_qt (h + heads b): query tile x (counted from the last: the
    heaviest causal tiles first) of head h of sequence b, as ``(h, q0, sq, sk, start_q,
    start_k, shift, n_tiles)``: its first row q0 (at or past sq: no tile), the sequence's
    lengths and starts, the causal shift sk - sq (0 without the mask) and the number of
    ``BN``-key tiles its rows see (at most 0: none)."""
    h = w // n_qt % heads
    start_q, sq, start_k, sk = sequence(cu_q, cu_k, u32(w // n_qt // heads))
    q0 = (n_qt - 1 - w % n_qt) * BM
    shift = i32(0)  # the bottom-right causal mask: rows seen as i + sk - sq
    if causal != 0:
        shift = i32(sk) - i32(sq)
    _, n_tiles = kv_head_and_tiles(h, q0 + shift, heads, group, i32(sk), causal, BM, BN)
    return h, q0, i32(sq), i32(sk), i32(start_q), i32(start_k), shift, n_tiles


@kaio.gpu_func
def store_empty(
    out: DT[:], lse: f32[:], o_at: i32, o_stride: i32, l_at: i32, row0: i32, sq: i32,
    lane: u32, D: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """Zeros and a logsumexp of -inf for this lane's rows of a tile that sees no key."""
    m = kaio.local(f32, 2)
    l = kaio.local(f32, 2)
    o = kaio.local(f32, (D // 8, 4))
    start_rows(m, l, o, D)
    store_rows(out, lse, o, m, l, o_at, o_stride, l_at, row0, row0, sq, lane, D, DT)


@kaio.gpu_kernel(fastmath=True)  # ex2.approx.ftz: one instruction an exponential
def varlen_fwd_wgmma(
    tq: kaio.tensormap, tk: kaio.tensormap, tv: kaio.tensormap, out: DT[:], lse: f32[:],
    cu_q: i32[:], cu_k: i32[:], total_q: i32, heads: i32, group: i32, scale_log2: f32,
    causal: i32, n_qt: i32, n_work: i32, D: kaio.constexpr, BN: kaio.constexpr,
    WG: kaio.constexpr, STAGES: kaio.constexpr, PIPE: kaio.constexpr, REGS: kaio.constexpr,
    PERSIST: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """out and lse of the work tiles (``varlen_tile``) of ``64 * WG`` query rows: block
    (x, y, z)'s, query tile x of head y of sequence z, or with ``PERSIST`` block x's tiles
    x, x + grid x, ... of the ``n_work`` = ``n_qt`` H B (the ring, the Q buffer and their
    phases carried from tile to tile as in the dense kernel's persistent blocks). ``tq``: q
    as [total_q, heads * D] in boxes of (64 * WG, 64), ``tk``, ``tv``: k, v as [total_k,
    heads / group * D] in boxes of (BN, 64); ``out`` [total_q * heads * D] and ``lse``
    [heads * total_q] flat; ``cu_q``, ``cu_k``: the sequences' offsets; ``scale_log2``: the
    scale times log2(e) (module docstring)."""
    BM = 64 * WG
    C = D // 64  # 64-column blocks of a row
    KV_BYTES = BN * D * 2
    t, wg, lt = thread_roles(WG)
    first = i32(kaio.block_idx_x())
    step = i32(kaio.grid_dim_x())
    if PERSIST == 0:  # a tile a block: one whose rows are past its sequence returns at once
        first += n_qt * i32(kaio.block_idx_y() + heads * kaio.block_idx_z())
        step = n_work
        _, q0, sq, _, _, _, _, _ = varlen_tile(first, n_qt, cu_q, cu_k, heads, group, causal,
                                               BM, BN)  # fmt: skip
        if q0 >= sq:
            return
    rounds = (n_work - first + step - 1) // step  # the block's tiles
    q_s = kaio.shared_dynamic(DT, (C, BM, 64), 0)
    k_s = kaio.shared_dynamic(DT, (STAGES, C, BN, 64), BM * D * 2)
    v_s = kaio.shared_dynamic(DT, (STAGES, C, BN, 64), BM * D * 2 + STAGES * KV_BYTES)
    # the dense kernel's barriers (``_attention_hopper.attention_fwd_wgmma``)
    bars = kaio.shared_dynamic(u64, (4, STAGES), BM * D * 2 + 2 * STAGES * KV_BYTES)
    turn = kaio.shared_dynamic(u64, (8,), BM * D * 2 + 2 * STAGES * KV_BYTES + 32 * STAGES)
    init_barriers(bars, turn, t, WG, STAGES)
    if wg < WG:  # the consumers
        if REGS:
            kaio.setmaxnreg_inc(REGS)
        lane = lt % 32
        pos = kaio.local(i32, 4)
        for e in kaio.static_range(4):
            pos[e] = 0
        for k in range(rounds):
            w = first + k * step
            h, q0, sq, sk, start_q, _, shift, n_tiles = varlen_tile(
                w, n_qt, cu_q, cu_k, heads, group, causal, BM, BN
            )
            if q0 < sq:
                o_stride = heads * D  # a token's row of out; rows shifted back by shift
                o_at = (start_q * heads + h) * D - shift * o_stride
                l_at = h * total_q + start_q - shift
                if n_tiles <= 0:  # no row of the tile sees a key: zeros, and -inf
                    row0 = q0 + shift + 64 * i32(wg) + 16 * i32(lt // 32) + i32(lane // 4)
                    store_empty(out, lse, o_at, o_stride, l_at, row0, sq + shift, lane, D, DT)
                else:
                    consume(q_s, k_s, v_s, bars, turn, out, lse, wg, lt, o_at, o_stride, l_at,
                            q0 + shift, n_tiles, sq + shift, sk, causal, scale_log2, pos, D,
                            BN, STAGES, PIPE, DT)  # fmt: skip
    else:  # the producer warpgroup: its first thread loads
        cnt, it, tails = producer_start(REGS)
        for k in range(rounds):
            w = first + k * step
            h, q0, sq, sk, start_q, start_k, _, n_tiles = varlen_tile(
                w, n_qt, cu_q, cu_k, heads, group, causal, BM, BN
            )
            if q0 < sq and n_tiles > 0:
                tail = n_tiles * BN > sk  # the last key tile reaches past the keys
                if lt == 0:
                    produce(q_s, k_s, v_s, bars, turn, tq, tk, tv, start_q + q0, start_k,
                            h * D, h // group * D, n_tiles, it, cnt, tail, D, BN, WG, STAGES,
                            DT)  # fmt: skip
                cnt += n_tiles
                it += 1
                if lt < 32 and tail:
                    kaio.sync_warp()  # (after the copies were issued: _attention_hopper)
                    zero_tail(v_s, bars, turn, n_tiles - 1, cnt - 1, tails, sk, lt, D, BN,
                              STAGES, DT)  # fmt: skip
                    tails += 1


def config(d: int, causal: bool = False) -> dict:
    """The constexprs of ``varlen_fwd_wgmma`` for head dim ``d``: the dense kernel's
    (``_attention_hopper.config``) with a block a tile (``PERSIST`` 0)."""
    return {**hopper.config(d, causal), "PERSIST": 0}


def eligible(d: int) -> bool:
    """Whether the kernel takes head dim ``d``: the dense kernel's (64, 128, 256)."""
    return hopper.eligible(d)


# The shortest mean sequence length (queries and keys, tokens) from which the kernel beat
# the mma.sync varlen kernel, by head dim and mask: measured on an H100 (2026-11-26, lengths
# uniform in [max / 8, max], H16; µs Hopper / mma.sync): D 64 causal mean 303 154 / 104,
# 604 177 / 157, 1240 233 / 269; not causal 303 171 / 152, 604 223 / 246; D 128 causal 150
# 197 / 150, 271 184 / 165, 682 267 / 326; not causal 150 213 / 189, 271 219 / 241 (at
# D 256 the mma.sync kernel is 2.5x slower at mean 3336; D 128's thresholds kept). Short
# sequences leave the 128-row (192 at D 64) query tiles and the causal diagonal's tiles
# mostly empty; the mma.sync kernel's tiles are 64 rows.
MIN_MEAN = {(64, False): 448, (64, True): 896, (128, False): 200, (128, True): 448}


def worthwhile(mean_q: float, mean_k: float, d: int, causal: bool) -> bool:
    """Whether the kernel measured faster than the mma.sync varlen kernel for sequences of
    ``mean_q`` queries and ``mean_k`` keys on average (``MIN_MEAN``), head dim ``d``."""
    return eligible(d) and min(mean_q, mean_k) >= MIN_MEAN[(min(d, 128), bool(causal))]


def launch(qa, ka, va, cqa, cka, dims: tuple, causal: bool, scale: float,
           cfg: dict | None = None, ctas: int | None = None):  # fmt: skip
    """Run ``varlen_fwd_wgmma`` on checked operands (``_arrays.Operand``s q [total_q, H, D],
    k, v [total_k, Hkv, D] of one 16-bit type, total_k > 0, D 64, 128 or 256, and the int32
    offsets [B + 1]); ``dims``: ``attention_varlen._check``'s (B, H, group, total_q, D,
    max_q, max_k); ``cfg``: the constexprs (default ``config(d, causal)``); ``ctas``: the
    blocks of a persistent launch (default: one a multiprocessor). Returns (out
    [total_q, H, D] of q's type, lse [H, total_q] f32)."""
    from kaio_ops import _arrays

    batch, heads, group, total_q, d, max_q, _ = dims
    cfg = dict(cfg or config(d, causal))
    if cfg["PIPE"] in (2, 4):
        raise ValueError(
            f"varlen_fwd_wgmma: no ping-pong between warpgroups (PIPE {cfg['PIPE']}, measured "
            f"slower in the dense kernel): use PIPE 0, 1 or 3"
        )
    bm = 64 * cfg["WG"]
    out = _arrays.output(qa, qa.shape)
    lse = _arrays.output(qa, (heads, total_q), f32)
    if max_q == 0:
        return out, lse
    total_k, hkv = ka.shape[0], ka.shape[1]
    tq = kaio.tensor_map_2d(qa.arg(total_q, heads * d), (bm, 64), SW)
    tk = kaio.tensor_map_2d(ka.arg(total_k, hkv * d), (cfg["BN"], 64), SW)
    tv = kaio.tensor_map_2d(va.arg(total_k, hkv * d), (cfg["BN"], 64), SW)
    smem = hopper.shared_bytes(d, cfg["BN"], cfg["WG"], cfg["STAGES"])
    n_qt = -(-max_q // bm)
    grid = (n_qt, heads, batch)
    if cfg["PERSIST"]:
        grid = (min(n_qt * heads * batch, ctas or _arrays.multiprocessors(qa)), 1, 1)
    varlen_fwd_wgmma[grid, 128 * cfg["WG"] + 128, _arrays.stream_of(qa), smem](
        tq, tk, tv, _arrays.output_arg(qa, out, (qa.size,)),
        _arrays.output_arg(qa, lse, (heads * total_q,), f32), cqa.arg(), cka.arg(), total_q,
        heads, group, math.log2(math.e) * scale, int(causal), n_qt, n_qt * heads * batch,
        D=d, DT=qa.dtype, **cfg,
    )  # fmt: skip
    return out, lse


def specializations():
    """(kernel, constexprs) of the specializations the op launches (for PTX checks): the
    dense kernel's, less their schedules and the dense-only options (``EXTRAS_OFF``'s), each
    once."""
    seen = {}
    for _, constexprs in hopper.specializations():
        cfg = {k: v for k, v in constexprs.items() if k not in hopper.EXTRAS_OFF}
        cfg["PERSIST"] = 0
        seen.setdefault(tuple(cfg.items()), cfg)
    for cfg in seen.values():
        yield varlen_fwd_wgmma, cfg
