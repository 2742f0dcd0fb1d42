"""W4A16 decode at M = 9-16 with x resident in shared memory: ``out [M, N] = x [M, K] @ W``.

The decode kernel (``_int4_decode``) gives each block one 32-column tile over all of K, so
every tile's block reads all of x (16 rows: twice the words' bytes at M = 16) through L1
from L2, and its grid of N / 32 tiles shares the SMs unevenly (10240 columns: 320 tiles,
2.4 an SM). Here the grid is one block an SM, each a part of K (``PER_WARP`` x 16 scale
groups: 4096 or 2048 values) and a set of tiles:

- Block ``b`` takes K part ``b % PARTS`` and the tiles ``c, c + C, c + 2 C, ...`` of
  column group ``c = b // PARTS`` (C = blocks / PARTS): every SM streams the same words
  within a tile, and the blocks at work read neighbouring tiles (the same DRAM pages).
- Its ``WARPS`` (16) warps split the part's groups, ``PER_WARP`` each (warp w: groups w,
  w + 16), and copy x's rows for those groups into shared memory once (``copy_x``, 64 KB a
  block per group a warp): the tiles then read x from there (``ld.shared``), and x crosses
  L2 once a block instead of once a tile.
- Each warp walks its groups of each tile in turn, the words of the next one loaded while
  one is multiplied (two register buffers; the swapped mma of
  ``_int4_decode.multiply_swapped``, DEQ 6). At a tile's end it leaves its tile in one of
  two buffers (``partial``) and adds its row of the tile before (``take_share``, the warps'
  tiles in warp order): the warps meet at mbarriers (the buffer whole, then read), never
  at a block barrier, so none waits for the slowest warp's words each tile (a block
  barrier a tile measured 1.6x slower than the decode kernel).
- With PARTS > 1 each block leaves its tiles' sums in ``ws[part, tile]``; the last block to
  finish a tile (``counters``) adds the parts in part order into ``out``: the same bits on
  every run.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import f16, f32, i32, u32, u64
from kaio_ops import _arrays
from kaio_ops._int4_decode import (
    COLS,
    LOADS,
    ROWS_PER_GROUP,
    _rows,
    _split_arrays,
    _words,
    load_group,
    partial_swapped,
    swapped_load,
)

WARPS = 16  # warps a block (one block an SM)
MAX_TILES = 64  # tiles a block at most (its arrival flags)
GROUP_HALVES = 128  # the halves of a row of x in one scale group


@kaio.gpu_func
def x_at(
    warp: u32, j: kaio.constexpr, row: u32, chunk: u32, ROWS: kaio.constexpr,
    PER_WARP: kaio.constexpr,
) -> u32:  # fmt: skip
    """The f16 index in the block's x of chunk ``chunk`` (8 halves) of ``row`` of warp
    ``warp``'s group ``j`` (x [WARPS, PER_WARP, 8 ROWS rows, 128 halves]); the chunks of
    odd rows swapped by halves of the row's 256 bytes (``chunk ^ 4``), so that the rows g,
    g + 1 of a read phase fall on the two halves of the banks."""
    at = ((warp * PER_WARP + j) * 8 * ROWS + row) * GROUP_HALVES
    return at + 8 * (chunk ^ (4 * (row % 2)))


@kaio.gpu_func
def copy_x(
    xs: f16[:], x: f16[:, :], group: u32, j: kaio.constexpr, warp: u32, lane: u32, M: u32,
    ROWS: kaio.constexpr, PER_WARP: kaio.constexpr,
):  # fmt: skip
    """Start the copies of x for scale group ``group``, the warp's group ``j``, into ``xs``
    (``x_at``): lane ``l`` copies chunk ``l % 16`` of rows ``l // 16 + 2 i`` (16 lanes a
    row: whole sectors); rows past M copy row M - 1 (their products are never stored)."""
    chunk = lane % 16
    for i in kaio.static_range(4 * ROWS):
        row = lane // 16 + 2 * i
        src = (kaio.min(row, M - 1), group * GROUP_HALVES + 8 * chunk)
        kaio.cp_async_cg(xs, (x_at(warp, j, row, chunk, ROWS, PER_WARP),), x, src, 16)


@kaio.gpu_func
def read_x(
    xr: u32[:, :, :, :], BUF: kaio.constexpr, j: kaio.constexpr, u: kaio.constexpr,
    xs: f16[:], warp: u32, g: u32, t: u32, ROWS: kaio.constexpr, PER_WARP: kaio.constexpr,
):  # fmt: skip
    """xr[BUF, u, r] = the 8 halves of x that load ``u`` of the warp's group ``j``
    multiplies, row ``g + 8 r`` (``load_x``'s fragments, from shared memory)."""
    for r in kaio.static_range(ROWS):
        at = x_at(warp, j, g + 8 * r, 4 * u + t, ROWS, PER_WARP)
        kaio.load_vector(xr[BUF, u, r], xs, (at,))


@kaio.gpu_func
def take_share(
    partial: f32[:, :, :], bars: u64[:], k: u32, out: DT[:, :], ws: f32[:, :, :], part: u32,
    tile: u32, warp: u32, lane: u32, M: u32, N: u32, PARTS: u32, DT: kaio.constexpr,
):  # fmt: skip
    """Warp ``warp``'s share of the block's ``k``-th tile (``tile``): once every warp's tile is
    in partial[k % 2] (``bars[k % 2]``), row ``warp``'s sums of the warps' tiles in warp
    order, into ``out`` (one part of K) or ``ws[part, tile]``; then the warp says it is done
    with the buffer (``bars[2 + k % 2]``)."""
    b = k % 2
    kaio.mbarrier_wait(bars, b, (k // 2) % 2)
    total = partial[b * WARPS, warp, lane]
    for s in kaio.static_range(1, WARPS):
        total += partial[b * WARPS + s, warp, lane]
    c = tile * COLS + lane
    if PARTS > 1:
        ws[part, tile, warp * COLS + lane] = total
    elif warp < M and c < N:
        out[warp, c] = DT(total)
    kaio.mbarrier_arrive(bars, 2 + b)


@kaio.gpu_func
def finish_parts(
    out: DT[:, :], ws: f32[:, :, :], counters: i32[:], flags: u32[:], first: u32, tiles: u32,
    step: u32, tid: u32, M: u32, N: u32, PARTS: u32, ROWS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """After every tile's sums are in ``ws``: for each of the block's ``tiles`` tiles
    ``first + i step`` the last of its PARTS blocks to arrive (``counters``, back to 0 after)
    adds the parts in order into ``out``, a warp a tile (fence, then count: the parts of every
    block counted are visible to the one that counts last)."""
    kaio.threadfence()
    kaio.sync_threads()
    if tid < tiles:
        last = kaio.atomic_add(counters, first + tid * step, i32(1)) == i32(PARTS) - 1
        if last:
            counters[first + tid * step] = i32(0)  # ready for the next call (or graph replay)
        flags[tid] = kaio.select(last, u32(1), u32(0))
    kaio.sync_threads()
    warp = tid // 32
    lane = tid % 32
    sums = kaio.local(f32, (16,))
    kaio.threadfence()
    for i in range(warp, tiles, WARPS):  # a warp a tile: the tiles' loads in flight together
        if flags[i] == 1:
            tile = first + i * step
            for r in kaio.static_range(8 * ROWS):
                sums[r] = ws[0, tile, r * COLS + lane]
            for s in range(1, PARTS):
                for r in kaio.static_range(8 * ROWS):
                    sums[r] += ws[s, tile, r * COLS + lane]
            c = tile * COLS + lane
            for r in kaio.static_range(8 * ROWS):
                if r < M and c < N:
                    out[r, c] = DT(sums[r])


@kaio.gpu_kernel
def int4_resident(
    x: f16[:, :], w: u32[:, :], scales: f16[:, :], out: DT[:, :], ws: f32[:, :, :],
    counters: i32[:], M: u32, N: u32, PARTS: u32,
    ROWS: kaio.constexpr, DT: kaio.constexpr, PER_WARP: kaio.constexpr, WBUF: kaio.constexpr,
    ABL: kaio.constexpr,
):  # fmt: skip
    """``out = x @ W`` (the module docstring): block ``b`` multiplies K part ``b % PARTS``
    (``PER_WARP`` groups a warp) of its column group's tiles, x's rows for its groups
    resident in shared memory (all of it dynamic: ``shared_bytes``)."""
    kaio.launch_bounds(WARPS * 32, 1)
    X_HALVES = WARPS * PER_WARP * 8 * ROWS * GROUP_HALVES  # x, then the flags, the tiles
    xs = kaio.shared_dynamic(f16, (X_HALVES,), 0)
    flags = kaio.shared_dynamic(u32, (MAX_TILES,), 2 * X_HALVES)
    bars = kaio.shared_dynamic(u64, (4,), 2 * X_HALVES + 4 * MAX_TILES)
    partial = kaio.shared_dynamic(f32, (2 * WARPS, 16, COLS), 2 * X_HALVES + 4 * MAX_TILES + 32)
    UNROLL = WBUF if PER_WARP % WBUF else 1  # tiles a step: each unit's buffer known
    tid = kaio.thread_idx_x()
    warp = tid // 32
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    part = kaio.block_idx_x() % PARTS
    step = kaio.grid_dim_x() // PARTS  # the column groups: tiles c, c + step, ...
    c = kaio.block_idx_x() // PARTS
    runs = ((N + COLS - 1) // COLS - c + step - 1) // step
    first = part * WARPS * PER_WARP + warp  # the warp's groups: first + j WARPS
    acc = kaio.local(f32, (1, 4, 4))
    words = kaio.local(u32, (WBUF, LOADS, 4))
    xr = kaio.local(u32, (WBUF, LOADS, 2, 4))
    sc = kaio.local(u32, (WBUF, 2))
    for j in kaio.static_range(PER_WARP):
        if ABL != 1:  # ABL 1 (ablation, wrong results): x never copied
            copy_x(xs, x, first + j * WARPS, j, warp, lane, M, ROWS, PER_WARP)
    kaio.cp_async_commit()
    for a in kaio.static_range(WBUF - 1):  # the first units' words (unit a: buffer a)
        if a // PER_WARP < runs:
            at = (c + (a // PER_WARP) * step) * COLS + 4 * g
            group = first + (a % PER_WARP) * WARPS
            col = kaio.select(at < N, at, 0)
            load_group(words, xr, sc, a, w, x, scales, group, col, g, t, M, ROWS, 0, 0, 0, 1)
    if tid < 4:  # bars[b]: partial[b] whole; bars[2 + b]: partial[b] added (read)
        kaio.mbarrier_init(bars, tid, WARPS * 32)
    kaio.cp_async_wait(0)
    kaio.sync_threads()  # the barriers made; every lane's copies of x landed
    for i0 in range(0, runs, UNROLL):
        for di in kaio.static_range(UNROLL):
            i = i0 + di
            if i < runs:
                tile = c + i * step
                for q in kaio.static_range(4):
                    for e in kaio.static_range(4):
                        acc[0, q, e] = 0.0
                for j in kaio.static_range(PER_WARP):
                    b = (di * PER_WARP + j) % WBUF  # the unit's buffer
                    a = j + WBUF - 1  # the unit WBUF - 1 ahead: group a % PER_WARP, tile + d
                    if i + a // PER_WARP < runs:
                        at = (tile + (a // PER_WARP) * step) * COLS + 4 * g
                        group = first + (a % PER_WARP) * WARPS
                        load_group(
                            words, xr, sc, (b + WBUF - 1) % WBUF, w, x, scales, group,
                            kaio.select(at < N, at, 0), g, t, M, ROWS, 0, 0, 0, 1,
                        )  # fmt: skip
                    for u in kaio.static_range(LOADS):
                        if ABL == 2:  # ablation (wrong results): the words, no x, no product
                            mix = words[b, u, 0] ^ words[b, u, 1] ^ words[b, u, 2] ^ sc[b, 0]
                            acc[0, u, 0] += kaio.bitcast((mix ^ words[b, u, 3]) & 0x3FFFFFFF, f32)
                        else:
                            read_x(xr, b, j, u, xs, warp, g, t, ROWS, PER_WARP)
                            swapped_load(acc, words, xr, sc, b, u, 6, ROWS)
                slot = i % 2
                if i >= 2:  # the tile two before added: its buffer free
                    kaio.mbarrier_wait(bars, 2 + slot, ((i - 2) // 2) % 2)
                partial_swapped(partial, slot * WARPS + warp, acc, g, t, ROWS)
                kaio.mbarrier_arrive(bars, slot)
                if i >= 1:  # the tile before: the warps have left it a tile ago
                    prev = tile - step
                    take_share(
                        partial, bars, i - 1, out, ws, part, prev, warp, lane, M, N, PARTS, DT
                    )  # fmt: skip
    if runs > 0:
        last = c + (runs - 1) * step
        take_share(partial, bars, runs - 1, out, ws, part, last, warp, lane, M, N, PARTS, DT)
    if PARTS > 1:
        finish_parts(out, ws, counters, flags, c, runs, step, tid, M, N, PARTS, ROWS, DT)


def shared_bytes(rows: int, per_warp: int) -> int:
    """The dynamic shared memory of ``int4_resident``: x's ``rows`` rows (16) of each warp's
    ``per_warp`` groups, the flags, the barriers and two buffers of the warps' tiles."""
    x = WARPS * per_warp * rows * GROUP_HALVES * 2
    return x + 4 * MAX_TILES + 32 + 2 * WARPS * 16 * COLS * 4


def grid(m: int, n: int, k: int, sms: int, per_warp: int = 2) -> tuple[int, int] | None:
    """``(parts, blocks)`` of ``int4_resident`` for x [m, k] and N = n on ``sms`` SMs: K in
    parts of ``WARPS * per_warp`` groups, ``sms // parts`` column groups of at least one tile
    and at most ``MAX_TILES``; None where it does not apply (m not 9-16, K not whole
    parts)."""
    group_values = 8 * ROWS_PER_GROUP
    if not 8 < m <= 16 or k % (WARPS * per_warp * group_values):
        return None
    parts = k // (WARPS * per_warp * group_values)
    column_groups = sms // parts
    tiles = -(-n // COLS)
    if column_groups == 0 or tiles < column_groups or tiles > MAX_TILES * column_groups:
        return None
    return parts, parts * column_groups


def matmul(
    x: _arrays.Operand, words: _arrays.Operand, scales: _arrays.Operand, dtype=f32,
    sms: int = 0, per_warp: int = 2, wbuf: int = 2, abl: int = 0,
):  # fmt: skip
    """``x @ W`` in ``dtype`` [M, N] by ``int4_resident`` on ``sms`` SMs (0: the GPU's;
    ``grid`` must apply; the operands as ``_int4_decode.fits`` takes them)."""
    m, k = x.shape
    n = words.shape[1]
    parts, blocks = grid(m, n, k, sms or _arrays.multiprocessors(x), per_warp)
    rows = _rows(m)
    out = _arrays.output(x, (m, n), dtype)
    config = (blocks, WARPS * 32, _arrays.stream_of(x), shared_bytes(8 * rows, per_warp))
    int4_resident[config](
        x.arg(), _words(words), scales.arg(), _arrays.output_arg(x, out, (m, n), dtype),
        **_split_arrays(x, -(-n // COLS), parts), M=m, N=n, PARTS=parts, ROWS=rows, DT=dtype,
        PER_WARP=per_warp, WBUF=wbuf, ABL=abl,
    )  # fmt: skip
    return out
