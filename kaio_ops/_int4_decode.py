"""The W4A16 decode kernel: ``out [M, N] (f32) = x [M, K] (f16) @ W`` for M <= 64, with the
int4 weights read from global memory straight into ``mma`` fragments.

At decode shapes the weights are the traffic (K N / 2 bytes) and the product is a sliver of
the tensor cores' rate, so the kernel is built around the weight stream:

- A block owns 32 output columns; its ``WARPS`` warps split K by scale groups (128 values,
  16 packed rows: group ``w``, ``w + WARPS``, ... for warp ``w``) and add their partial tiles
  in shared memory at the end, in a fixed order (results do not vary run to run).
- Lane ``(g, t)`` (``g = lane // 4``, ``t = lane % 4``) loads 16 bytes of weights: packed row
  ``4 u + t`` of a group, columns ``4 g .. 4 g + 3``. A warp's load is four 128-byte rows,
  and no thread waits for another's bytes: there is no shared-memory staging.
- The k order inside one ``mma.sync`` m16n8k16 is free as long as A and B agree. Lane
  ``(g, t)`` holds one word per column, nibbles ``k0 .. k0 + 7`` with ``k0 = 8 (4 u + t)``;
  its B registers must hold column ``g`` of an n8 tile, rows ``2 t + 8 r`` and ``+ 1``. So
  column ``4 g + i`` of the block goes to n8 tile ``i``, column ``g``; and logical rows
  ``2 t + 8 r``, ``+ 1`` of k-step ``h`` are nibbles ``j = 2 h + r`` and ``j + 4`` of the
  word: one ``lop3`` of ``w`` (or ``w >> 8``) with ``0x000F000F`` or ``0x00F000F0`` picks
  the pair (``weight_pair``). The A fragment takes the
  same permutation: elements ``j`` and ``j + 4`` of the lane's own 8 values of x (one 16-byte
  load per row), paired by ``prmt``.
- Past 16 rows a block holds ceil(M / 16) m16 tiles (``ROWS``, the 8-row slabs of x: 1, 2,
  then 4, 6, 8): each weight fragment is dequantized once and feeds one ``mma`` per tile, so
  the weights are read once per call whatever M. x's fragments of those tiles are loaded
  where they are used (L2-resident, shared by every block): double-buffering them too would
  take 32 registers per 8 rows. 8 tiles (M <= 128) spill on sm_90, hence ``MAX_M = 64``.
  What grows with M is x's traffic from L2: each of the N / 32 blocks reads all of x
  (2 M K bytes, M / 8 times the words' bytes), about 8x the weights at M = 64.
- Nibble to f16 by the magic number: ``pair ^ 0x64086408`` is ``1024 + 8 + q`` in each half,
  exact; minus 1032 gives ``q`` (a pair at bit 4: ``^ 0x64806480``, then one exact fma),
  times the group's scale gives ``f16(scale * q)`` rounded once, the weight of the op's
  contract.

Needs N % 4 == 0 and K % 128 == 0, x 16-byte aligned, the words 16-byte and the scales
8-byte aligned (``matmul_int4`` checks and otherwise takes the tiled kernel).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import f16, f16x2, f32, u32
from kaio_ops import _arrays

COLS = 32  # output columns per block: 8 lane groups x 4 adjacent columns
ROWS_PER_GROUP = 16  # packed word rows per scale group (128 values)
LOADS = ROWS_PER_GROUP // 4  # 16-byte loads per lane and group
PAIR_MASK = 0x000F000F  # nibbles 0 and 4 of a word (2 and 6 of the word shifted right by 8)
HIGH_PAIR_MASK = 0x00F000F0  # nibbles 1 and 5 (3 and 7 of the word shifted right by 8)
# XORed into a masked pair: the exponent of f16 1024 in each half, and the nibble's sign bit
# flipped (q + 8); read as an f16 pair, the same bits are 1032 = 1024 + 8, subtracted after.
MAGIC = 0x64086408
HIGH_MAGIC = 0x64806480  # the same for a nibble at bit 4: 1024 + 16 (q + 8) in each half
SIXTEENTH = 0x2C002C00  # f16 1 / 16 in both halves
HIGH_BIAS = 0xD480D480  # f16 -72 = -(1024 / 16 + 8) in both halves
AND_XOR = (0xF0 & 0xCC) ^ 0xAA  # the lop3 table of (a & b) ^ c
LOW_HALVES = 0x5410  # prmt selectors: the low 16 bits of a, then of b
HIGH_HALVES = 0x7632  # the high 16 bits of a, then of b
LOW_TWICE = 0x1010  # the low 16 bits of a in both halves
HIGH_TWICE = 0x3232  # the high 16 bits of a in both halves


@kaio.gpu_func
def load_group(
    words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :], xs: u32[:, :, :, :, :, :],
    BUF: kaio.constexpr, w: u32[:, :], x: f16[:, :], scales: f16[:, :], group: u32, col: u32,
    g: u32, t: u32, M: u32, ROWS: kaio.constexpr, XNOW: kaio.constexpr,
):  # fmt: skip
    """Buffer BUF = scale group ``group``'s operands of this lane: its 4 columns' scales (sc),
    the words of packed rows ``16 group + 4 u + t`` (words[u]) and, unless ``XNOW`` is 1 (x
    loaded when the group is multiplied, ``multiply_group``: always past one m16 tile, as
    buffering x would take 32 registers per 8 rows), the 8 halves of x those words
    multiply (XNOW 2: copied by ``cp.async`` into the lane's slot of ``xs``, not
    registers), rows g and g + 8 (xr[u, r]; rows past M read row M - 1 instead: their
    products land in rows that are never stored)."""
    kaio.load_vector(sc[BUF], scales, (group, col))
    for u in kaio.static_range(LOADS):
        row = group * ROWS_PER_GROUP + 4 * u + t
        kaio.load_vector(words[BUF, u], w, (row, col))
        for r in kaio.static_range(ROWS):
            if XNOW == 0:
                kaio.load_vector(xr[BUF, u, r], x, (kaio.min(g + 8 * r, M - 1), 8 * row))
            elif XNOW == 2:  # into this lane's own slot of the warp's shared buffer
                lane = g * 4 + t
                xi = (kaio.min(g + 8 * r, M - 1), 8 * row)
                kaio.cp_async(xs, (kaio.thread_idx_x() // 32, BUF, u, r, lane, 0), x, xi, 16)


@kaio.gpu_func
def advance(
    acc: f32[:, :, :], words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :],
    xs: u32[:, :, :, :, :, :], BUF: kaio.constexpr, w: u32[:, :], x: f16[:, :],
    scales: f16[:, :], i: u32, first: u32, step: u32, groups: u32, col: u32, g: u32, t: u32,
    M: u32, ROWS: kaio.constexpr, BUFS: kaio.constexpr, XNOW: kaio.constexpr,
):  # fmt: skip
    """The warp's ``i``-th scale group (``first + i step``), in buffer BUF of ``BUFS``: the
    loads of the group ``BUFS - 1`` ahead started into the buffer the previous group used,
    then this one multiplied (``BUFS - 1`` groups' loads in flight meanwhile)."""
    group = first + i * step
    ahead = group + (BUFS - 1) * step
    if ahead < groups:
        load_group(words, xr, sc, xs, (BUF + BUFS - 1) % BUFS, w, x, scales, ahead, col, g, t,
                   M, ROWS, XNOW)  # fmt: skip
    if XNOW == 2:
        kaio.cp_async_commit()  # one group an iteration, empty past the last
        kaio.cp_async_wait(BUFS - 1)
    multiply_group(acc, words, xr, sc, xs, BUF, x, group, g, t, M, ROWS, XNOW)


@kaio.gpu_func
def multiply_group(
    acc: f32[:, :, :], words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :],
    xs: u32[:, :, :, :, :, :], BUF: kaio.constexpr, x: f16[:, :], group: u32, g: u32, t: u32,
    M: u32, ROWS: kaio.constexpr, XNOW: kaio.constexpr,
):  # fmt: skip
    """acc[m] += the products of buffer BUF (scale group ``group``) for each m16 tile m of
    the ``ROWS`` 8-row slabs: 2 k-steps of 16 for each of the 4 loads, for each of the lane's
    4 columns (n8 tiles). Each weight fragment is dequantized once and feeds every tile. With
    ``XNOW`` x is loaded here: one m16 tile's all at the start (its latency under the
    dequantization), more tiles' where each is used."""
    a = kaio.local(u32, (2, 4))
    b = kaio.local(u32, (4, 2, 2))
    xt = kaio.local(u32, (2, 4))
    xg = kaio.local(u32, (LOADS, 2, 4))
    if XNOW > 0 and ROWS <= 2:
        for u in kaio.static_range(LOADS):
            k8 = group * ROWS_PER_GROUP + 4 * u + t
            for r in kaio.static_range(ROWS):
                if XNOW == 2:
                    kaio.load_vector(
                        xg[u, r], xs, (kaio.thread_idx_x() // 32, BUF, u, r, 4 * g + t, 0)
                    )
                else:
                    kaio.load_vector(xg[u, r], x, (kaio.min(g + 8 * r, M - 1), 8 * k8))
    for u in kaio.static_range(LOADS):
        for i in kaio.static_range(4):
            twice = LOW_TWICE if i % 2 == 0 else HIGH_TWICE
            scale = kaio.bitcast(kaio.prmt(sc[BUF, i // 2], sc[BUF, i // 2], twice), f16x2)
            for h in kaio.static_range(2):
                b[i, h, 0] = weight_pair(words[BUF, u, i], 2 * h, scale)
                b[i, h, 1] = weight_pair(words[BUF, u, i], 2 * h + 1, scale)
        for m in kaio.static_range((ROWS + 1) // 2):
            if ROWS > 2:
                k8 = group * ROWS_PER_GROUP + 4 * u + t
                for r in kaio.static_range(2):
                    kaio.load_vector(xt[r], x, (kaio.min(16 * m + g + 8 * r, M - 1), 8 * k8))
            for h in kaio.static_range(2):
                # A register ra: row 16 m + g + 8 (ra % 2), elements j and j + 4, j = 2 h + ra // 2
                for ra in kaio.static_range(4):
                    j = 2 * h + ra // 2
                    sel = LOW_HALVES if j % 2 == 0 else HIGH_HALVES
                    if 2 * m + ra % 2 >= ROWS:
                        a[h, ra] = 0
                    elif ROWS > 2:
                        a[h, ra] = kaio.prmt(xt[ra % 2, j // 2], xt[ra % 2, j // 2 + 2], sel)
                    elif XNOW > 0:
                        a[h, ra] = kaio.prmt(xg[u, ra % 2, j // 2], xg[u, ra % 2, j // 2 + 2], sel)
                    else:
                        a[h, ra] = kaio.prmt(
                            xr[BUF, u, ra % 2, j // 2], xr[BUF, u, ra % 2, j // 2 + 2], sel
                        )
            for i in kaio.static_range(4):
                for h in kaio.static_range(2):
                    kaio.mma_f16(acc[m, i], a[h], b[i, h], acc[m, i])


@kaio.gpu_func
def weight_pair(word: u32, j: kaio.constexpr, scale: f16x2) -> u32:
    """Nibbles ``j`` and ``j + 4`` of ``word`` as the f16 pair ``scale * q``: nibbles 0 and 4
    (and 2 and 6 of ``word >> 8``) land at bit 0 of each half, as ``1024 + (q ^ 8)``; nibbles
    1 and 5 (3 and 7) at bit 4, as ``1024 + 16 (q ^ 8)``, brought to ``q`` by one exact fma.
    One ``lop3`` picks a pair and sets its exponent; ``q`` is exact, times the scale rounded
    once (the shift by 8 is shared by the two pairs above it)."""
    src = word >> (8 * (j // 2))
    if j % 2 == 0:
        biased = kaio.bitcast(kaio.lop3(src, PAIR_MASK, MAGIC, AND_XOR), f16x2)
        q = biased - kaio.bitcast(u32(MAGIC), f16x2)
    else:
        biased = kaio.bitcast(kaio.lop3(src, HIGH_PAIR_MASK, HIGH_MAGIC, AND_XOR), f16x2)
        q = kaio.fma(
            biased, kaio.bitcast(u32(SIXTEENTH), f16x2), kaio.bitcast(u32(HIGH_BIAS), f16x2)
        )
    return kaio.bitcast(q * scale, u32)


@kaio.gpu_func
def decode_columns(
    x: f16[:, :], w: u32[:, :], scales: f16[:, :], out: DT[:, :], partial: f32[:, :, :],
    M: u32, N: u32, block: u32, WARPS: kaio.constexpr, ROWS: kaio.constexpr,
    DT: kaio.constexpr, SPLIT: kaio.constexpr, BUFS: kaio.constexpr, WIDE: kaio.constexpr,
    XNOW: kaio.constexpr, xs: u32[:, :, :, :, :, :],
):  # fmt: skip
    """out[:, 32 block .. 32 block + 31] = those columns of ``x @ W`` (W = scales * the
    nibbles of w, see the module docstring), rounded to DT (the output's element type), for
    the ``ROWS`` 8-row slabs of x (``_rows``: 1 when M <= 8, rows g + 8 of A are zero; else
    2 per m16 tile). Each warp's groups go through ``BUFS`` register buffers: the next
    ``BUFS - 1`` groups' loads are in flight while the current one is multiplied;
    ``partial`` [WARPS, 16, 32] (shared) adds the warps' tiles in a fixed order, one m16
    tile at a time. ``XNOW``: x is not buffered but loaded as each group is multiplied
    (fewer registers).

    With ``WIDE`` > 1 the block owns ``32 WIDE`` columns (``block`` counts such blocks):
    warp ``w`` takes column set ``w % WIDE`` and splits K with the other ``WARPS / WIDE``
    warps of that set, so that ``WIDE`` warps read the same x at about the same time (one L2
    read, the rest from L1). With ``SPLIT`` > 1 (one m16 tile, sm_90) the K groups are
    spread over the ``SPLIT`` blocks of a cluster too (the ``WARPS / WIDE`` warps of rank
    ``r`` come after those of ranks below): each block adds its warps' tiles, then the blocks
    add theirs through distributed shared memory, rank ``r`` storing the rows ``r`` modulo
    ``SPLIT``, in a fixed order too."""
    tid = kaio.thread_idx_x()
    warp = tid // 32
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    # Columns past N read column 0 instead: their products are never stored.
    col = (block * WIDE + warp % WIDE) * COLS + 4 * g
    col = kaio.select(col < N, col, 0)
    groups = u32(scales.shape[0])
    acc = kaio.local(f32, ((ROWS + 1) // 2, 4, 4))
    for m in kaio.static_range((ROWS + 1) // 2):
        for i in kaio.static_range(4):
            for e in kaio.static_range(4):
                acc[m, i, e] = 0.0
    words = kaio.local(u32, (BUFS, LOADS, 4))
    xr = kaio.local(u32, (BUFS, LOADS, 2, 4))
    sc = kaio.local(u32, (BUFS, 2))
    rank = u32(0)
    if SPLIT > 1:
        rank = kaio.cluster_rank()
    first = rank * (WARPS // WIDE) + warp // WIDE
    step = SPLIT * (WARPS // WIDE)  # the warps of a column set over the cluster's blocks
    xnow = (ROWS > 2) + XNOW * (ROWS < 3)  # past one m16 tile x is loaded at use
    for b in kaio.static_range(BUFS - 1):
        if first + b * step < groups:
            load_group(words, xr, sc, xs, b, w, x, scales, first + b * step, col, g, t, M, ROWS,
                       xnow)  # fmt: skip
        if XNOW == 2:
            kaio.cp_async_commit()
    mine = kaio.select(first < groups, (groups - first + step - 1) // step, 0)
    for n in range(0, mine, BUFS):
        for b in kaio.static_range(BUFS):
            if n + b < mine:
                advance(acc, words, xr, sc, xs, b, w, x, scales, n + b, first, step, groups, col,
                        g, t, M, ROWS, BUFS, xnow)  # fmt: skip
    for m in kaio.static_range((ROWS + 1) // 2):
        if m > 0:
            kaio.sync_threads()  # the previous tile's partial sums are all read
        for i in kaio.static_range(4):
            for e in kaio.static_range(4):
                partial[warp, g + 8 * (e // 2), 4 * (2 * t + e % 2) + i] = acc[m, i, e]
        kaio.sync_threads()
        # element o of the block's tile: row o // (32 WIDE), column set and column below
        for k in kaio.static_range(16 * COLS * WIDE // (WARPS * 32)):
            o = tid + k * WARPS * 32
            r = o // (COLS * WIDE)
            cs = o % (COLS * WIDE) // COLS
            total = partial[cs, r, o % COLS]
            for s in kaio.static_range(1, WARPS // WIDE):
                total += partial[s * WIDE + cs, r, o % COLS]
            c = block * COLS * WIDE + o % (COLS * WIDE)
            if SPLIT > 1:
                partial[cs, r, o % COLS] = total  # only this thread reads element o
            elif 16 * m + r < M and c < N:
                out[16 * m + r, c] = DT(total)
    if SPLIT > 1:
        split_sum(partial, out, M, N, block, rank, tid, WARPS, SPLIT, DT, WIDE)


@kaio.gpu_func
def split_sum(
    partial: f32[:, :, :], out: DT[:, :], M: u32, N: u32, block: u32, rank: u32, tid: u32,
    WARPS: kaio.constexpr, SPLIT: kaio.constexpr, DT: kaio.constexpr, WIDE: kaio.constexpr,
):  # fmt: skip
    """The sum of a cluster's K split (one m16 tile) once each block has added its warps'
    tiles into ``partial[:WIDE]``: rank ``r`` adds the blocks' sums of rows ``r`` modulo
    ``SPLIT`` in rank order (distributed shared memory) and stores them."""
    kaio.cluster_sync()
    for k in kaio.static_range(16 * COLS * WIDE // (WARPS * 32)):
        o = tid + k * WARPS * 32
        r = o // (COLS * WIDE)
        cs = o % (COLS * WIDE) // COLS
        c = block * COLS * WIDE + o % (COLS * WIDE)
        if r % SPLIT == rank and r < M and c < N:
            total = kaio.cluster_load(partial, (cs, r, o % COLS), 0)
            for q in kaio.static_range(1, SPLIT):
                total += kaio.cluster_load(partial, (cs, r, o % COLS), q)
            out[r, c] = DT(total)
    kaio.cluster_sync()  # no block leaves while another may still read its shared memory


@kaio.gpu_kernel
def int4_decode(
    x: f16[:, :], w: u32[:, :], scales: f16[:, :], out: DT[:, :],
    M: u32, N: u32,
    WARPS: kaio.constexpr, ROWS: kaio.constexpr, DT: kaio.constexpr, SPLIT: kaio.constexpr,
    BUFS: kaio.constexpr, WIDE: kaio.constexpr, XNOW: kaio.constexpr,
):  # fmt: skip
    """``out = x @ W`` (``decode_columns``), a block (a cluster of ``SPLIT``) per 32
    columns."""
    if SPLIT > 1:
        kaio.cluster_dims(SPLIT)
    if ROWS > 2:
        kaio.launch_bounds(WARPS * 32, 1)  # one block an SM: else ptxas may spill to fit 128
    else:
        kaio.launch_bounds(WARPS * 32)
    partial = kaio.shared(f32, (WARPS, 16, COLS))
    if XNOW == 2:  # x through shared memory: a slot a lane, buffer and load
        xs = kaio.shared(u32, (WARPS, BUFS, LOADS, 2, 32, 4))
    else:
        xs = kaio.shared(u32, (1, 1, 1, 1, 1, 4))  # not used
    block = kaio.block_idx_x() // SPLIT
    decode_columns(
        x, w, scales, out, partial, M, N, block, WARPS, ROWS, DT, SPLIT, BUFS, WIDE, XNOW, xs
    )


@kaio.gpu_kernel
def int4_decode_qkv(
    x: f16[:, :], wq: u32[:, :], wk: u32[:, :], wv: u32[:, :], sq: f16[:, :], sk: f16[:, :],
    sv: f16[:, :], q: DT[:, :], k: DT[:, :], v: DT[:, :],
    M: u32, NQ: u32, NK: u32,
    WARPS: kaio.constexpr, ROWS: kaio.constexpr, DT: kaio.constexpr, SPLIT: kaio.constexpr,
    BUFS: kaio.constexpr, WIDE: kaio.constexpr, XNOW: kaio.constexpr,
):  # fmt: skip
    """``q, k, v = x @ Wq, x @ Wk, x @ Wv`` in one launch: the blocks (clusters of
    ``SPLIT``) of q's columns, then k's, then v's (each exactly one of ``int4_decode``)."""
    if SPLIT > 1:
        kaio.cluster_dims(SPLIT)
    if ROWS > 2:
        kaio.launch_bounds(WARPS * 32, 1)  # one block an SM: else ptxas may spill to fit 128
    else:
        kaio.launch_bounds(WARPS * 32)
    partial = kaio.shared(f32, (WARPS, 16, COLS))
    if XNOW == 2:
        xs = kaio.shared(u32, (WARPS, BUFS, LOADS, 2, 32, 4))
    else:
        xs = kaio.shared(u32, (1, 1, 1, 1, 1, 4))  # not used
    bq = (NQ + COLS * WIDE - 1) // (COLS * WIDE)
    bk = (NK + COLS * WIDE - 1) // (COLS * WIDE)
    block = kaio.block_idx_x() // SPLIT
    if block < bq:
        decode_columns(
            x, wq, sq, q, partial, M, NQ, block, WARPS, ROWS, DT, SPLIT, BUFS, WIDE, XNOW, xs
        )
    elif block < bq + bk:
        decode_columns(
            x, wk, sk, k, partial, M, NK, block - bq, WARPS, ROWS, DT, SPLIT, BUFS, WIDE, XNOW, xs
        )
    else:
        nv = u32(v.shape[1])
        b = block - bq - bk
        decode_columns(
            x, wv, sv, v, partial, M, nv, b, WARPS, ROWS, DT, SPLIT, BUFS, WIDE, XNOW, xs
        )


WARPS = 8  # measured best on an H200 at K = N = 4096, M = 1 and 16 (against 4 and 16)
MAX_M = 64  # up to 4 m16 tiles per block; past this _prefill or the tiled kernel


def fits(x: _arrays.Operand, *weights: tuple) -> bool:
    """Whether the decode kernels take activations ``x`` [M, K] and these ``(words, scales)``
    pairs: M <= 64, each N a multiple of 4 (16-byte loads of 4 columns), x and the words
    16-byte aligned, the scales 8-byte aligned."""
    return x.shape[0] <= MAX_M and all(
        w.shape[1] % 4 == 0 and w.aligned(16) and s.aligned(8) for w, s in weights
    ) and x.aligned(16)  # fmt: skip


def _words(w: _arrays.Operand):
    """The packed words as a u32 kernel argument (int32 words are the same bytes)."""
    return w.arg(dtype=u32)


def plan_for(m: int, tiles: int = 0, sms: int = 132) -> tuple:
    """(WARPS, SPLIT, BUFS, WIDE, XNOW) of the decode kernel at M = ``m`` over ``tiles``
    32-column blocks on a GPU of ``sms`` multiprocessors (0 tiles: the default plan). An SM
    holds about 16 warps of this kernel at M <= 8 (116 registers) and 12 at M = 9-16 (150:
    three blocks of 4 warps, one of 8): blocks of 16 warps when the tiles are about one per
    SM, 8 up to two, past that 4 (finer blocks even out the SMs' shares). Measured on an H100
    (bench/int4_decode.py, docs/performance.md)."""
    if m > 16 or not tiles:
        return (WARPS, 1, 2, 1, 0)
    if tiles * 10 <= sms * 11:
        return (16 if m <= 8 else 8, 1, 2, 1, 0)
    if m <= 8 and tiles * 10 <= sms * 22:
        return (8, 1, 2, 1, 0)
    return (4, 1, 2, 1, 0)


def _launch(x: _arrays.Operand, widths: list, plan: tuple) -> tuple:
    """The launch configuration and constexprs of ``plan`` (``plan_for``'s tuple) over
    output column counts ``widths`` (one block, or cluster of SPLIT, per 32 WIDE columns of
    each)."""
    warps, split, bufs, wide, xnow = plan
    blocks = sum(-(-n // (COLS * wide)) for n in widths) * split
    consts = {"WARPS": warps, "ROWS": _rows(x.shape[0]), "SPLIT": split, "BUFS": bufs}
    config = (blocks, warps * 32, _arrays.stream_of(x), 0)
    return config, {**consts, "WIDE": wide, "XNOW": xnow}


def _rows(m: int) -> int:
    """ROWS, the 8-row slabs of x, for M rows: A's rows g + 8 hold data only past 8; past
    16, two per m16 tile."""
    return 1 if m <= 8 else 2 * -(-m // 16)


ALL_ROWS = tuple(sorted({_rows(m) for m in range(1, MAX_M + 1)}))  # (1, 2, 4, 6, 8)


def matmul(
    x: _arrays.Operand, words: _arrays.Operand, scales: _arrays.Operand, dtype=f32,
    plan: tuple | None = None,
):  # fmt: skip
    """``x @ W`` in ``dtype`` (f32, f16 or bf16) [M, N] (see ``fits``): one launch of
    ``plan`` (``plan_for``'s by default): a block of WARPS warps (a cluster of SPLIT blocks
    on sm_90, M <= 16) per 32 WIDE columns, BUFS groups' loads in registers a warp (x's
    too unless XNOW)."""
    m, n = x.shape[0], words.shape[1]
    out = _arrays.output(x, (m, n), dtype)
    config, consts = _launch(x, [n], plan or plan_for(m, -(-n // COLS), _arrays.multiprocessors(x)))
    int4_decode[config](
        x.arg(), _words(words), scales.arg(), _arrays.output_arg(x, out, (m, n), dtype), m, n,
        DT=dtype, **consts,
    )  # fmt: skip
    return out


def qkv(x: _arrays.Operand, weights: list[tuple]) -> tuple:
    """``(q, k, v)``, each ``f16(x @ W)`` for the three ``(words, scales)`` pairs of
    ``weights`` (see ``fits``): one launch of ``plan_for``'s plan (``matmul``'s: the same
    sums in the same order), the blocks of q's columns, then k's, then v's."""
    m = x.shape[0]
    widths = [w.shape[1] for w, _ in weights]
    outs = [_arrays.output(x, (m, n), f16) for n in widths]
    tiles = sum(-(-n // COLS) for n in widths)
    config, consts = _launch(x, widths, plan_for(m, tiles, _arrays.multiprocessors(x)))
    int4_decode_qkv[config](
        x.arg(), *(_words(w) for w, _ in weights), *(s.arg() for _, s in weights),
        *(_arrays.output_arg(x, o, (m, n)) for o, n in zip(outs, widths, strict=True)), m,
        widths[0], widths[1], DT=f16, **consts,
    )  # fmt: skip
    return tuple(outs)


def specializations() -> list:
    """(kernel, constexprs) of every specialization ``matmul`` (f32 out: matmul_int4) and
    ``qkv`` (f16 out: qkv_project_int4) launch."""
    plans = {(_rows(m), plan_for(m, t)) for m in range(1, MAX_M + 1) for t in (128, 256, 1024)}
    return [
        (
            kernel,
            {"WARPS": w, "ROWS": rows, "DT": dt, "SPLIT": sp, "BUFS": bu, "WIDE": wd, "XNOW": xn},
        )  # fmt: skip
        for kernel, dt in ((int4_decode, f32), (int4_decode_qkv, f16))
        for rows, (w, sp, bu, wd, xn) in sorted(plans)
    ]
