"""Flash attention in f32: forward (online softmax) and backward (FlashAttention-2),
written in the kaio DSL, on the SIMT cores or (up to DP 128, ``attention.f32_tc``) on the
tensor cores in 3xTF32. The host side is ``kaio_ops.attention``.

Every kernel runs blocks of ``NT`` = 256 threads as a 16 x 16 grid, thread ``(ty, tx)`` =
``(t // 16, t % 16)``, over tiles staged in shared memory with rows padded to ``DP + 4``
floats (``DP``: the head dim rounded up to 64, 128 or 256; the padding keeps the 16-byte
reads of 8 consecutive rows in 8 different bank groups). Two register-tiled products serve
every matmul of attention:

- ``dot_tile``: ``acc[r, c] = a_s[4ty + r, :] . b_s[tx + 16c, :]``, a 64 x 16C tile of
  row-by-row dot products (S = Q K^T, dP = dO V^T, and their transposes in the backward);
- ``acc_tile``: ``acc[r, c, e] += p_s[4ty + r, :] @ v_s[:, 4tx + 64c + e]``, a 64 x DP tile
  (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q).

So a thread owns rows ``4ty .. 4ty + 3`` of both kinds of tile, and a row's statistics (running
max, sum) are reduced over the 16 lanes ``tx`` with ``shfl_xor`` 8, 4, 2, 1.

On the tensor cores (``TC`` 1) ``mma_tile`` does both kinds of product from the same tiles:
f32 values split in two tf32 halves, ``hi hi + hi lo + lo hi`` on m16n8k8 mma's (3xTF32,
as CUTLASS's fast f32 and SDPA's memory-efficient f32 kernels), each 64 k's part summed in
f32 after; warp w owns rows ``16 (w % 4)`` .. and half the columns of a tile.

Scores are kept in the log2 domain: ``s2 = (q . k) * scale * log2(e)``, probabilities are
``exp2(s2 - m2)``; the stats (``lse``) are natural logarithms of the row sums.
"""

from __future__ import annotations

import kaio
from kaio import f32, i32, u32
from kaio_ops._common import lanes_max, lanes_sum, store_cols, thread_element

NT = 256  # threads per block
ROWS = 64  # rows of a block's row tile: 16 thread rows x 4
ROW_LANES = 16  # the lanes (tx) that share a tile row
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = float("-inf")
POS_INF = float("inf")


DIMS = (64, 128, 256)  # the padded head dims DP the kernels are specialized for


def padded_dim(d: int) -> int:
    """``DP``: the smallest of ``DIMS`` that holds head dim ``d``."""
    return next(dp for dp in DIMS if d <= dp)


def fwd_shared_bytes(dp: int) -> int:
    """Dynamic shared memory of ``flash_fwd``: Q, K, V tiles and the P tile."""
    return 3 * ROWS * (dp + 4) * 4 + ROWS * (64 + 4) * 4


def dq_shared_bytes(dp: int, c: int) -> int:
    """Dynamic shared memory of ``dq_tile``: Q, dO, K, V tiles and the dS tile."""
    return 2 * ROWS * (dp + 4) * 4 + 2 * 16 * c * (dp + 4) * 4 + ROWS * (16 * c + 4) * 4


def dkdv_shared_bytes(dp: int, c: int) -> int:
    """Dynamic shared memory of ``dkdv_tile``: K, V, Q, dO tiles and the P^T, dS^T tiles."""
    return 2 * ROWS * (dp + 4) * 4 + 2 * 16 * c * (dp + 4) * 4 + 2 * ROWS * (16 * c + 4) * 4


def bwd_cols(dp: int) -> int:
    """``C`` of the backward kernels: their column tiles have 16 * C rows (64 up to DP = 128,
    32 beyond, so that the tiles fit in shared memory)."""
    return 4 if dp <= 128 else 2


@kaio.gpu_func
def thread_grid():
    """``(tid, ty, tx)``: this thread's index in the block and its row and column in the
    block's 16-wide grid of threads (each owns 4 rows of a tile from row 4 ty)."""
    tid = kaio.thread_idx_x()
    return tid, tid // 16, tid % 16


@kaio.gpu_func
def zero_tile(dst: f32[:, :], R: kaio.constexpr, W: kaio.constexpr):
    """dst[0:R, 0:W] = 0 (W a multiple of 4), 16 bytes a store."""
    tid = kaio.thread_idx_x()
    z = kaio.local(f32, 4)
    for e in kaio.static_range(4):
        z[e] = 0.0
    CHUNKS = W // 4
    piece = tid
    while piece < R * CHUNKS:
        kaio.store_vector(dst, (piece // CHUNKS, piece % CHUNKS * 4), z)
        piece += NT


@kaio.gpu_func
def load_rows(
    dst: f32[:, :], src: f32[:, :],
    row0: u32, vec: u32,
    R: kaio.constexpr, DP: kaio.constexpr,
):  # fmt: skip
    """src[row0 : row0 + R, 0:D] into dst[0:R, 0:D] (D = src.shape[1] <= DP), rows past the
    end of src as zeros. vec != 0: 16-byte cp.async copies (D % 4 == 0, src 16-byte aligned; the
    caller commits and waits), else element loads through registers (any D). Columns D..DP of
    dst are not written: the kernels zero them once."""
    D = u32(src.shape[1])
    S = u32(src.shape[0])
    tid = kaio.thread_idx_x()
    if vec != 0:
        CHUNKS = DP // 4
        for i in kaio.static_range((R * CHUNKS + NT - 1) // NT):
            piece = tid + i * NT
            if R * CHUNKS % NT == 0 or piece < R * CHUNKS:
                r = piece // CHUNKS
                col = piece % CHUNKS * 4
                if col < D:
                    inside = row0 + r < S
                    row = kaio.select(inside, row0 + r, 0)
                    kaio.cp_async(dst, (r, col), src, (row, col), 16, kaio.select(inside, 16, 0))
    else:
        piece = tid
        while piece < R * DP:  # a runtime loop: the slow path stays small
            r = piece // DP
            col = piece % DP
            if col < D:
                inside = row0 + r < S
                x = src[kaio.select(inside, row0 + r, 0), col]
                dst[r, col] = kaio.select(inside, x, 0.0)
            piece += NT


@kaio.gpu_func
def store_rows(
    dst: f32[:, :], row0: u32, acc: f32[:, :, :], r: kaio.constexpr, row: u32, factor: f32,
    tx: u32, vec: u32, DP: kaio.constexpr,
):  # fmt: skip
    """dst[row0 + row, 4tx + 64c + e] = acc[r, c, e] * factor for the columns below D (one
    16-byte store a chunk when vec != 0)."""
    D = u32(dst.shape[1])
    v = kaio.local(f32, 4)
    for c in kaio.static_range(DP // 64):
        col = 4 * tx + 64 * c
        for e in kaio.static_range(4):
            v[e] = acc[r, c, e] * factor
        store_cols(dst, row0 + row, col, v, D, vec != 0, 4, f32)


@kaio.gpu_func
def dot_tile(
    acc: f32[:, :], a_s: f32[:, :], b_s: f32[:, :],
    ty: u32, tx: u32,
    DP: kaio.constexpr, C: kaio.constexpr,
):  # fmt: skip
    """acc[r, c] = sum over d < DP of a_s[4ty + r, d] * b_s[tx + 16c, d]."""
    a = kaio.local(f32, (4, 4))
    b = kaio.local(f32, (C, 4))
    for r in kaio.static_range(4):
        for c in kaio.static_range(C):
            acc[r, c] = 0.0
    d0 = u32(0)
    while d0 < DP:  # a while loop is never unrolled: keeps the kernels small
        for dd in kaio.static_range(0, 8, 4):
            for r in kaio.static_range(4):
                kaio.load_vector(a[r], a_s, (4 * ty + r, d0 + dd))
            for c in kaio.static_range(C):
                kaio.load_vector(b[c], b_s, (tx + 16 * c, d0 + dd))
            for k in kaio.static_range(4):
                for r in kaio.static_range(4):
                    for c in kaio.static_range(C):
                        acc[r, c] = kaio.fma(a[r, k], b[c, k], acc[r, c])
        d0 += 8


@kaio.gpu_func
def acc_tile(
    acc: f32[:, :, :], p_s: f32[:, :], v_s: f32[:, :],
    ty: u32, tx: u32,
    J: kaio.constexpr, DP: kaio.constexpr,
):  # fmt: skip
    """acc[r, c, e] += sum over j < J of p_s[4ty + r, j] * v_s[j, 4tx + 64c + e]."""
    p = kaio.local(f32, (4, 4))
    w = kaio.local(f32, (DP // 64, 4))
    j = u32(0)
    while j < J:
        for r in kaio.static_range(4):
            kaio.load_vector(p[r], p_s, (4 * ty + r, j))
        for k in kaio.static_range(4):
            for c in kaio.static_range(DP // 64):
                kaio.load_vector(w[c], v_s, (j + k, 4 * tx + 64 * c))
            for r in kaio.static_range(4):
                for c in kaio.static_range(DP // 64):
                    for e in kaio.static_range(4):
                        acc[r, c, e] = kaio.fma(p[r, k], w[c, e], acc[r, c, e])
        j += 4


@kaio.gpu_func
def zero_acc(acc: f32[:, :, :], DP: kaio.constexpr):
    """acc[4, DP // 64, 4] = 0."""
    for r in kaio.static_range(4):
        for c in kaio.static_range(DP // 64):
            for e in kaio.static_range(4):
                acc[r, c, e] = 0.0


@kaio.gpu_func
def lse_log2(x: f32) -> f32:
    """A natural-log row logsumexp as the base-2 offset of the backward's probabilities:
    ``x * log2(e)``, and +inf for a row with no valid key (so that its exp2 is 0)."""
    return kaio.select(x == NEG_INF, POS_INF, x * LOG2E)


@kaio.gpu_func
def row_stats(lse: f32[:], delta: f32[:], row: u32, rows: u32) -> tuple[f32, f32]:
    """``(lse2, delta)`` of a query row for the backward: its ``lse_log2`` and its delta,
    +inf and delta[0] for a row past ``rows`` (its probabilities are then 0)."""
    inside = row < rows
    at = kaio.select(inside, row, 0)
    return kaio.select(inside, lse_log2(lse[at]), POS_INF), delta[at]


@kaio.gpu_func
def next_tiles(
    x_s: f32[:, :], y_s: f32[:, :], x: f32[:, :], y: f32[:, :], row0: u32, vec: u32,
    R: kaio.constexpr, DP: kaio.constexpr,
):  # fmt: skip
    """The backward's tile pairs: once every thread is done with x_s and y_s (a barrier:
    done reading the last tiles, or writing zeros), rows row0 .. row0 + R of x and y into
    them (``load_rows``) and this thread's copies waited for (the caller synchronizes
    before reading them)."""
    kaio.sync_threads()
    load_rows(x_s, x, row0, vec, R, DP)
    load_rows(y_s, y, row0, vec, R, DP)
    kaio.cp_async_wait_all()


@kaio.gpu_func
def first_tiles(
    q_s: f32[:, :], k_s: f32[:, :], v_s: f32[:, :], q: f32[:, :], k: f32[:, :], v: f32[:, :],
    q0: u32, split: u32, Sk: u32, tiles_per_split: u32, causal: u32, vec: u32,
    WK: kaio.constexpr, WV: kaio.constexpr, DP: kaio.constexpr,
) -> tuple[u32, u32]:  # fmt: skip
    """The forward kernels' start: the Q, K (rows of WK) and V (rows of WV) tiles zeroed,
    then query rows q0 .. q0 + ROWS and the first key tile of split ``split`` copied in
    (``load_rows``), Q and K waited for and V in flight; returns the split's key tiles
    (t_begin, t_end), with ``causal`` none past the query tile's last row."""
    zero_tile(q_s, ROWS, WK)
    zero_tile(k_s, 64, WK)
    zero_tile(v_s, 64, WV)
    kaio.sync_threads()

    n_tiles = (Sk + 63) // 64
    if causal != 0:
        n_tiles = kaio.min(n_tiles, (q0 + ROWS + 63) // 64)
    t_begin = split * tiles_per_split
    t_end = kaio.min(t_begin + tiles_per_split, n_tiles)
    load_rows(q_s, q, q0, vec, ROWS, DP)
    load_rows(k_s, k, t_begin * 64, vec, 64, DP)
    kaio.cp_async_commit()
    load_rows(v_s, v, t_begin * 64, vec, 64, DP)
    kaio.cp_async_commit()
    kaio.cp_async_wait(1)
    kaio.sync_threads()
    return t_begin, t_end


@kaio.gpu_kernel(block_size=NT)
def flash_fwd(
    q: f32[:, :], k: f32[:, :], v: f32[:, :], out: f32[:, :], lse: f32[:],
    scale_log2: f32, tiles_per_split: u32, causal: u32, vec: u32,
    DP: kaio.constexpr,
):  # fmt: skip
    """One 64-row query tile (block x, heaviest causal tiles first) against the key tiles of
    split ``block_idx_y`` (``tiles_per_split`` tiles of 64 keys each): out[split * Sq + row]
    = softmax-weighted V of those keys, lse[split * Sq + row] = their logsumexp (-inf and a
    zero row where the split holds no valid key). K and V are single-buffered, each loaded
    with cp.async while the other is in use."""
    W = DP + 4
    Sq = u32(q.shape[0])
    Sk = u32(k.shape[0])
    tid, ty, tx = thread_grid()
    q0 = (kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * ROWS
    split = kaio.block_idx_y()
    q_s = kaio.shared_dynamic(f32, (ROWS, W), 0)
    k_s = kaio.shared_dynamic(f32, (64, W), ROWS * W * 4)
    v_s = kaio.shared_dynamic(f32, (64, W), (ROWS + 64) * W * 4)
    p_s = kaio.shared_dynamic(f32, (ROWS, 68), (ROWS + 128) * W * 4)
    t_begin, t_end = first_tiles(q_s, k_s, v_s, q, k, v, q0, split, Sk, tiles_per_split, causal,
                                 vec, W, W, DP)  # fmt: skip

    m = kaio.local(f32, 4)
    l = kaio.local(f32, 4)
    for r in kaio.static_range(4):
        m[r] = NEG_INF
        l[r] = 0.0
    o = kaio.local(f32, (4, DP // 64, 4))
    zero_acc(o, DP)
    s = kaio.local(f32, (4, 4))
    for t in range(t_begin, t_end):
        dot_tile(s, q_s, k_s, ty, tx, DP, 4)
        kaio.sync_threads()  # k_s is free
        if t + 1 < t_end:
            load_rows(k_s, k, (t + 1) * 64, vec, 64, DP)
        kaio.cp_async_commit()
        for r in kaio.static_range(4):
            row = q0 + 4 * ty + r
            top = NEG_INF
            for c in kaio.static_range(4):
                key = t * 64 + tx + 16 * c
                ok = key < Sk and (causal == 0 or key <= row)
                s[r, c] = kaio.select(ok, s[r, c] * scale_log2, NEG_INF)
                top = kaio.max(top, s[r, c])
            m_new = kaio.max(m[r], lanes_max(top, ROW_LANES))
            base = kaio.select(m_new == NEG_INF, 0.0, m_new)
            alpha = kaio.exp2(m[r] - base)
            m[r] = m_new
            total = 0.0
            for c in kaio.static_range(4):
                p = kaio.exp2(s[r, c] - base)
                p_s[4 * ty + r, tx + 16 * c] = p
                total += p
            l[r] = l[r] * alpha + total
            for c in kaio.static_range(DP // 64):
                for e in kaio.static_range(4):
                    o[r, c, e] = o[r, c, e] * alpha
        kaio.cp_async_wait(1)  # V of tile t has landed
        kaio.sync_threads()
        acc_tile(o, p_s, v_s, ty, tx, 64, DP)
        kaio.sync_threads()  # v_s and p_s are free
        if t + 1 < t_end:
            load_rows(v_s, v, (t + 1) * 64, vec, 64, DP)
        kaio.cp_async_commit()
        kaio.cp_async_wait(1)  # K of tile t + 1 has landed
        kaio.sync_threads()

    row0 = split * Sq
    for r in kaio.static_range(4):
        total = lanes_sum(l[r], ROW_LANES)
        row = q0 + 4 * ty + r
        if row < Sq:
            store_rows(out, row0, o, r, row, kaio.select(total > 0.0, 1.0 / total, 0.0), tx,
                       vec, DP)  # fmt: skip
            if tx == 0:
                lse[row0 + row] = kaio.select(total > 0.0, (m[r] + kaio.log2(total)) * LN2, NEG_INF)


def fwd_mma_shared_bytes(dp: int) -> int:
    """Dynamic shared memory of ``flash_fwd_mma``: Q, K, V (rows of DP + 8) tiles, the P
    tile, the row maxima of each half of the key tile."""
    return (2 * ROWS * (dp + 4) + 64 * (dp + 8) + ROWS * 68 + 2 * ROWS) * 4


@kaio.gpu_kernel(block_size=NT)
def flash_fwd_mma(
    q: f32[:, :], k: f32[:, :], v: f32[:, :], out: f32[:, :], lse: f32[:],
    scale_log2: f32, tiles_per_split: u32, causal: u32, vec: u32,
    DP: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """``flash_fwd`` (the same contract, grid and copies) with its products on the tensor
    cores in 3xTF32 (``mma_tile``'s ``TC``): warps w and w + 4 hold query rows 16 (w % 4) .. + 15,
    each for half the keys of a tile (S) and half the columns of O; the row maxima of the
    halves meet in shared memory, the row sums at the end."""
    WK = DP + 4
    WV = DP + 8  # (mma_tile's B rows: conflict-free)
    Sq = u32(q.shape[0])
    Sk = u32(k.shape[0])
    D = u32(out.shape[1])
    lane = kaio.lane_id()
    t4 = lane % 4
    m0 = 16 * (kaio.warp_id() % 4) + lane // 4  # this thread's rows m0, m0 + 8
    half = kaio.warp_id() // 4
    n0 = 32 * half + 2 * t4  # its columns of S: n0 + 8 j + h
    q0 = (kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * ROWS
    split = kaio.block_idx_y()
    q_s = kaio.shared_dynamic(f32, (ROWS, WK), 0)
    k_s = kaio.shared_dynamic(f32, (64, WK), ROWS * WK * 4)
    v_s = kaio.shared_dynamic(f32, (64, WV), (ROWS + 64) * WK * 4)
    p_s = kaio.shared_dynamic(f32, (ROWS, 68), (ROWS + 64) * WK * 4 + 64 * WV * 4)
    top_s = kaio.shared_dynamic(f32, (2, ROWS), (ROWS + 64) * WK * 4 + (64 * WV + ROWS * 68) * 4)
    t_begin, t_end = first_tiles(q_s, k_s, v_s, q, k, v, q0, split, Sk, tiles_per_split, causal,
                                 vec, WK, WV, DP)  # fmt: skip

    m = kaio.local(f32, 2)
    l = kaio.local(f32, 2)  # this thread's part of its rows' sums
    for r in kaio.static_range(2):
        m[r] = NEG_INF
        l[r] = 0.0
    o = kaio.local(f32, (4, DP // 64, 4))
    zero_acc(o, DP)
    s = kaio.local(f32, (4, 1, 4))
    for t in range(t_begin, t_end):
        zero_acc(s, 64)
        mma_tile(s, q_s, k_s, DP, 64, 1, TC)
        kaio.sync_threads()  # k_s is free
        if t + 1 < t_end:
            load_rows(k_s, k, (t + 1) * 64, vec, 64, DP)
        kaio.cp_async_commit()
        for r in kaio.static_range(2):
            row = q0 + m0 + 8 * r
            top = NEG_INF
            for j in kaio.static_range(4):
                for h in kaio.static_range(2):
                    key = t * 64 + n0 + 8 * j + h
                    ok = key < Sk and (causal == 0 or key <= row)
                    s[j, 0, 2 * r + h] = kaio.select(ok, s[j, 0, 2 * r + h] * scale_log2, NEG_INF)
                    top = kaio.max(top, s[j, 0, 2 * r + h])
            top = lanes_max(top, 4)
            if t4 == 0:
                top_s[half, m0 + 8 * r] = top
        kaio.sync_threads()
        for r in kaio.static_range(2):
            m_new = kaio.max(m[r], kaio.max(top_s[0, m0 + 8 * r], top_s[1, m0 + 8 * r]))
            base = kaio.select(m_new == NEG_INF, 0.0, m_new)
            alpha = kaio.exp2(m[r] - base)
            m[r] = m_new
            total = 0.0
            for j in kaio.static_range(4):
                for h in kaio.static_range(2):
                    p = kaio.exp2(s[j, 0, 2 * r + h] - base)
                    p_s[m0 + 8 * r, n0 + 8 * j + h] = p
                    total += p
            l[r] = l[r] * alpha + total
            for j in kaio.static_range(DP // 16):
                for h in kaio.static_range(2):
                    o[j // (DP // 64), j % (DP // 64), 2 * r + h] *= alpha
        kaio.cp_async_wait(1)  # V of tile t has landed
        kaio.sync_threads()
        mma_tile(o, p_s, v_s, 64, DP, 0, TC)
        kaio.sync_threads()  # v_s, p_s and top_s are free
        if t + 1 < t_end:
            load_rows(v_s, v, (t + 1) * 64, vec, 64, DP)
        kaio.cp_async_commit()
        kaio.cp_async_wait(1)  # K of tile t + 1 has landed
        kaio.sync_threads()

    for r in kaio.static_range(2):
        total = lanes_sum(l[r], 4)
        if t4 == 0:
            top_s[half, m0 + 8 * r] = total
    kaio.sync_threads()
    row0 = split * Sq
    for r in kaio.static_range(2):
        total = top_s[0, m0 + 8 * r] + top_s[1, m0 + 8 * r]
        row = q0 + m0 + 8 * r
        inv = kaio.select(total > 0.0, 1.0 / total, 0.0)
        if row < Sq:
            for j in kaio.static_range(DP // 16):
                for h in kaio.static_range(2):
                    col = DP // 2 * half + 8 * j + 2 * t4 + h
                    if col < D:
                        out[row0 + row, col] = o[j // (DP // 64), j % (DP // 64), 2 * r + h] * inv
            if half == 0 and t4 == 0:
                lse[row0 + row] = kaio.select(total > 0.0, (m[r] + kaio.log2(total)) * LN2, NEG_INF)


@kaio.gpu_kernel(block_size=256)
def combine_splits(part: f32[:, :], part_lse: f32[:], out: f32[:, :], lse: f32[:], splits: u32):
    """out[row] = the softmax-weighted mean of the ``splits`` partial rows part[s * Sq + row]
    (weights exp(part_lse)), lse[row] = the logsumexp of their lse; zeros and -inf where no
    split saw a valid key. One thread per output element."""
    Sq = u32(out.shape[0])
    inside, row, col = thread_element(Sq, u32(out.shape[1]))
    if inside:
        top = NEG_INF
        for s in range(splits):
            top = kaio.max(top, part_lse[s * Sq + row])
        base = kaio.select(top == NEG_INF, 0.0, top)
        total = 0.0
        acc = 0.0
        for s in range(splits):
            w = kaio.exp(part_lse[s * Sq + row] - base)
            total += w
            acc += w * part[s * Sq + row, col]
        out[row, col] = kaio.select(total > 0.0, acc / total, 0.0)
        if col == 0:
            lse[row] = kaio.select(total > 0.0, base + kaio.log(total), NEG_INF)


@kaio.gpu_func
def start_tiles(
    x_s: f32[:, :], y_s: f32[:, :], u_s: f32[:, :], v_s: f32[:, :], x: f32[:, :], y: f32[:, :],
    row0: u32, vec: u32, R: kaio.constexpr, RU: kaio.constexpr, W: kaio.constexpr,
    DP: kaio.constexpr,
):  # fmt: skip
    """A backward block's start: zero its shared tiles (x_s, y_s of R rows, u_s, v_s of RU
    rows, W columns), then copy rows row0 .. row0 + R of x and y into x_s and y_s
    (``load_rows``) and wait for the copies."""
    zero_tile(x_s, R, W)
    zero_tile(y_s, R, W)
    zero_tile(u_s, RU, W)
    zero_tile(v_s, RU, W)
    next_tiles(x_s, y_s, x, y, row0, vec, R, DP)


@kaio.gpu_kernel(block_size=NT)
def flash_bwd_shares(
    q: f32[:, :], k: f32[:, :], v: f32[:, :], do: f32[:, :], lse: f32[:], delta: f32[:],
    items: i32[:, :], ws: f32[:, :], dsw: f32[:, :],
    scale_log2: f32, causal: u32, vec: u32, per_block: i32, dv_slots: i32,
    DP: kaio.constexpr, C: kaio.constexpr, DS: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """Block x's share of the backward (``bwd_shares``: every block the same work; ``DS``
    1: of the dK/dV part, each dS tile also stored to ``dsw`` for ``flash_bwd_dq_ds``): its
    ``per_block`` items, rows x per_block .. of ``items``, each ``(kind, tile, t0, t1,
    slot)`` (kind -1: none): kind 0 the dK and dV of 64-row key tile ``tile`` over the
    16C-query tiles t0 .. t1 - 1, into the 64-row slots ``slot`` and ``slot + dv_slots`` of
    the workspace ``ws``; kind 1 the dQ of query tile ``tile`` over key tiles t0 .. t1 - 1
    into slot ``slot``. Unscaled: ``add_pieces`` sums each tile's pieces in order. ``TC``
    1 (C = 4): the products on the tensor cores (``mma_tile``, 3xTF32)."""
    for j in range(per_block):
        at = i32(kaio.block_idx_x()) * per_block + j
        kind = items[at, 0]
        tile = u32(items[at, 1])
        t0 = u32(items[at, 2])
        t1 = u32(items[at, 3])
        slot = u32(items[at, 4])
        kaio.sync_threads()  # the last item's shared tiles are free
        if kind == 0:
            dkdv_tile(q, k, v, do, lse, delta, ws, ws, dsw, scale_log2, causal, vec, tile, t0,
                      t1, slot * ROWS, (slot + u32(dv_slots)) * ROWS, DP, C, DS, TC)  # fmt: skip
        elif kind == 1:
            dq_tile(q, k, v, do, lse, delta, ws, scale_log2, causal, vec, tile, t0, t1,
                    slot * ROWS, DP, C, TC)  # fmt: skip


@kaio.gpu_kernel(block_size=256)
def add_pieces(
    ws: f32[:, :], starts: i32[:], dq: f32[:, :], dk: f32[:, :], dv: f32[:, :],
    dv_slots: i32, scale: f32,
):  # fmt: skip
    """dq (block row y 0), dk (1), dv (2) = the sum of their 64-row tile's pieces in
    ``flash_bwd_items``' workspace, in order (deterministic), times scale (dv: 1). A query
    tile's slots are ``starts[tile] .. starts[tile + 1] - 1``, a key tile's dK slots
    ``starts[n + 1 + tile]`` .. (n tiles), its dV's ``dv_slots`` further. One thread per
    element of the [S, D] outputs."""
    S = u32(dq.shape[0])
    inside, row, col = thread_element(S, u32(dq.shape[1]))
    which = kaio.block_idx_y()
    if inside:
        at = row // ROWS + kaio.select(which == 0, 0, (S + ROWS - 1) // ROWS + 1)
        shift = kaio.select(which == 2, dv_slots, 0)
        total = 0.0
        for slot in range(starts[at], starts[at + 1]):
            total += ws[u32(slot + shift) * ROWS + row % ROWS, col]
        if which == 0:
            dq[row, col] = total * scale
        elif which == 1:
            dk[row, col] = total * scale
        else:
            dv[row, col] = total


@kaio.gpu_func
def split_tf32(x: f32) -> tuple[f32, f32]:
    """``(hi, lo)``: 3xTF32's operands, hi = x rounded to tf32 and lo = x - hi exactly, of
    which the tensor core reads the top 11 bits (x = hi + lo's top bits + O(2^-22 |x|))."""
    hi = kaio.to_tf32(x)
    return hi, x - hi


@kaio.gpu_func
def mma_tile(
    acc: f32[:, :, :], a_s: f32[:, :], b_s: f32[:, :], J: kaio.constexpr, N: kaio.constexpr,
    BT: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """acc += A B on the tensor cores, each product in 3xTF32 (hi hi + hi lo + lo hi of
    ``split_tf32``'s halves), for warp w's 16 x N / 2 part of a 64 x N tile: A = a_s[m0 :
    m0 + 16, 0:J], B = b_s[0:J, n0 : n0 + N / 2] (``BT`` 0) or b_s[n0 : n0 + N / 2, 0:J]^T
    (``BT`` 1), m0 = 16 (w % 4), n0 = N / 2 (w // 4); n-tile j (8 columns) in the m16n8k8
    accumulator acc[j // (N / 64), j % (N / 64)]. J a multiple of 64: each 64 k's sum is
    made on the tensor cores from zero and added to acc in f32 (the tensor cores' own sums
    round towards zero: over thousands of k that drifts to 1e-5). ``TC`` 2: every k a
    constant (the 64-k parts unrolled too)."""
    part = kaio.local(f32, (4, N // 64, 4))
    if TC == 2:
        for kc in kaio.static_range(0, J, 64):
            mma_part(acc, part, a_s, b_s, u32(kc), N, BT)
    else:
        kc = u32(0)
        while kc < J:
            mma_part(acc, part, a_s, b_s, kc, N, BT)
            kc += 64


@kaio.gpu_func
def mma_part(
    acc: f32[:, :, :], part: f32[:, :, :], a_s: f32[:, :], b_s: f32[:, :], kc: u32,
    N: kaio.constexpr, BT: kaio.constexpr,
):  # fmt: skip
    """``mma_tile``'s k's kc .. kc + 63: their sum in part (from zero, the mma's of a k step
    one per n-tile in turn: independent chains), then acc += part in f32."""
    lane = kaio.lane_id()
    g = lane // 4
    t = lane % 4
    m0 = 16 * (kaio.warp_id() % 4)
    n0 = N // 2 * (kaio.warp_id() // 4)
    NJ = N // 16  # n-tiles a warp
    ah = kaio.local(f32, 4)
    al = kaio.local(f32, 4)
    bh = kaio.local(f32, (NJ, 2))
    bl = kaio.local(f32, (NJ, 2))
    zero_acc(part, N)
    for kk in kaio.static_range(8):
        k0 = kc + 8 * kk
        for i in kaio.static_range(4):
            ah[i], al[i] = split_tf32(a_s[m0 + g + 8 * (i % 2), k0 + t + 4 * (i // 2)])
        for j in kaio.static_range(NJ):
            for i in kaio.static_range(2):
                if BT:
                    bh[j, i], bl[j, i] = split_tf32(b_s[n0 + 8 * j + g, k0 + t + 4 * i])
                else:
                    bh[j, i], bl[j, i] = split_tf32(b_s[k0 + t + 4 * i, n0 + 8 * j + g])
        for j in kaio.static_range(NJ):  # the small terms first
            kaio.mma_tf32(part[j // (N // 64), j % (N // 64)], al, bh[j],
                          part[j // (N // 64), j % (N // 64)])  # fmt: skip
        for j in kaio.static_range(NJ):
            kaio.mma_tf32(part[j // (N // 64), j % (N // 64)], ah, bl[j],
                          part[j // (N // 64), j % (N // 64)])  # fmt: skip
        for j in kaio.static_range(NJ):
            kaio.mma_tf32(part[j // (N // 64), j % (N // 64)], ah, bh[j],
                          part[j // (N // 64), j % (N // 64)])  # fmt: skip
    for r in kaio.static_range(4):
        for c in kaio.static_range(N // 64):
            for e in kaio.static_range(4):
                acc[r, c, e] += part[r, c, e]


@kaio.gpu_func
def acc_product(
    acc: f32[:, :, :], p_s: f32[:, :], v_s: f32[:, :], ty: u32, tx: u32, J: kaio.constexpr,
    DP: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """acc += p_s[:, 0:J] v_s[0:J, :]: ``mma_tile`` (TC 1 or 2, its accumulator layout) or
    ``acc_tile``."""
    if TC:
        mma_tile(acc, p_s, v_s, J, DP, 0, TC)
    else:
        acc_tile(acc, p_s, v_s, ty, tx, J, DP)


@kaio.gpu_func
def store_mma(dst: f32[:, :], row0: u32, acc: f32[:, :, :], DP: kaio.constexpr):
    """dst[row0 + m, n] = ``mma_tile``'s accumulators for the columns n below D."""
    D = u32(dst.shape[1])
    lane = kaio.lane_id()
    m0 = 16 * (kaio.warp_id() % 4) + lane // 4
    n0 = DP // 2 * (kaio.warp_id() // 4) + 2 * (lane % 4)
    for j in kaio.static_range(DP // 16):
        for i in kaio.static_range(4):
            col = n0 + 8 * j + i % 2
            if col < D:
                dst[row0 + m0 + 8 * (i // 2), col] = acc[j // (DP // 64), j % (DP // 64), i]


@kaio.gpu_func
def dq_tile(
    q: f32[:, :], k: f32[:, :], v: f32[:, :], do: f32[:, :], lse: f32[:], delta: f32[:],
    out: f32[:, :], scale_log2: f32, causal: u32, vec: u32, x: u32, t0: u32, t1: u32,
    row0: u32, DP: kaio.constexpr, C: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """dQ of 64-row query tile x over key tiles (16C keys) t0 .. t1 - 1, unscaled: recompute
    P = exp2(S * scale_log2 - lse2) and dP = dO V^T, then dS = P * (dP - delta) and
    dQ += dS K; finally out[row0 + i] = dQ[i] for the tile's rows i below Sq. ``TC`` 1
    (C = 4): the products on the tensor cores (``mma_tile``, 3xTF32)."""
    W = DP + 4
    KT = 16 * C
    Sq = u32(q.shape[0])
    Sk = u32(k.shape[0])
    tid, ty, tx = thread_grid()
    q0 = x * ROWS
    q_s = kaio.shared_dynamic(f32, (ROWS, W), 0)
    do_s = kaio.shared_dynamic(f32, (ROWS, W), ROWS * W * 4)
    k_s = kaio.shared_dynamic(f32, (KT, W), 2 * ROWS * W * 4)
    v_s = kaio.shared_dynamic(f32, (KT, W), (2 * ROWS + KT) * W * 4)
    ds_s = kaio.shared_dynamic(f32, (ROWS, KT + 4), (2 * ROWS + 2 * KT) * W * 4)
    start_tiles(q_s, do_s, k_s, v_s, q, do, q0, vec, ROWS, KT, W, DP)

    lse2 = kaio.local(f32, 4)
    dlt = kaio.local(f32, 4)
    for r in kaio.static_range(4):
        l2, dl = row_stats(lse, delta, q0 + 4 * ty + r, Sq)
        lse2[r] = l2
        dlt[r] = dl
    acc = kaio.local(f32, (4, DP // 64, 4))
    zero_acc(acc, DP)
    s = kaio.local(f32, (4, C))
    dp = kaio.local(f32, (4, C))
    s_m = kaio.local(f32, (4, 1, 4))  # (TC: mma_tile's 64 x 64 accumulators)
    dp_m = kaio.local(f32, (4, 1, 4))
    for t in range(t0, t1):
        next_tiles(k_s, v_s, k, v, t * KT, vec, KT, DP)  # (ds_s is free too)
        kaio.sync_threads()
        score_product(s, s_m, q_s, k_s, ty, tx, DP, C, TC)
        score_product(dp, dp_m, do_s, v_s, ty, tx, DP, C, TC)
        if TC:
            mma_probs(ds_s, ds_s, s_m, dp_m, lse, delta, scale_log2, causal, q0, t * KT, Sq, Sk,
                      0)  # fmt: skip
        else:
            for r in kaio.static_range(4):
                row = q0 + 4 * ty + r
                for c in kaio.static_range(C):
                    key = t * KT + tx + 16 * c
                    ok = key < Sk and (causal == 0 or key <= row)
                    p = kaio.select(ok, kaio.exp2(s[r, c] * scale_log2 - lse2[r]), 0.0)
                    ds_s[4 * ty + r, tx + 16 * c] = p * (dp[r, c] - dlt[r])
        kaio.sync_threads()
        acc_product(acc, ds_s, k_s, ty, tx, KT, DP, TC)
    if TC:  # (all 64 rows: the workspace's slots have them)
        store_mma(out, row0, acc, DP)
    else:
        for r in kaio.static_range(4):
            if q0 + 4 * ty + r < Sq:
                store_rows(out, row0, acc, r, 4 * ty + r, 1.0, tx, vec, DP)


@kaio.gpu_func
def dkdv_tile(
    q: f32[:, :], k: f32[:, :], v: f32[:, :], do: f32[:, :], lse: f32[:], delta: f32[:],
    dk: f32[:, :], dv: f32[:, :], dsw: f32[:, :], scale_log2: f32, causal: u32, vec: u32,
    x: u32, t0: u32, t1: u32, dk_row0: u32, dv_row0: u32, DP: kaio.constexpr,
    C: kaio.constexpr, DS: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """dK and dV of 64-row key tile x over query tiles (16C queries) t0 .. t1 - 1, unscaled:
    recompute P^T = exp2(K Q^T * scale_log2 - lse2) and dP^T = V dO^T, then dV += P^T dO and
    dK += dS^T Q with dS^T = P^T * (dP^T - delta); finally dk[dk_row0 + i] = dK[i],
    dv[dv_row0 + i] = dV[i] for the tile's rows i below Sk. ``DS`` 1: each dS tile also
    stored to ``dsw`` (``store_ds``). ``TC`` 1 (C = 4): the products on the tensor cores
    (``mma_tile``, 3xTF32). A step's dO tile is copied over the last step's dK product and
    its Q tile over its own dP^T product."""
    W = DP + 4
    QT = 16 * C
    Sq = u32(q.shape[0])
    Sk = u32(k.shape[0])
    tid, ty, tx = thread_grid()
    k0 = x * ROWS
    k_s = kaio.shared_dynamic(f32, (ROWS, W), 0)
    v_s = kaio.shared_dynamic(f32, (ROWS, W), ROWS * W * 4)
    q_s = kaio.shared_dynamic(f32, (QT, W), 2 * ROWS * W * 4)
    do_s = kaio.shared_dynamic(f32, (QT, W), (2 * ROWS + QT) * W * 4)
    pt_s = kaio.shared_dynamic(f32, (ROWS, QT + 4), (2 * ROWS + 2 * QT) * W * 4)
    dst_s = kaio.shared_dynamic(
        f32, (ROWS, QT + 4), (2 * ROWS + 2 * QT) * W * 4 + ROWS * (QT + 4) * 4
    )
    zero_tile(k_s, ROWS, W)
    zero_tile(v_s, ROWS, W)
    zero_tile(q_s, QT, W)
    zero_tile(do_s, QT, W)
    kaio.sync_threads()
    load_rows(k_s, k, k0, vec, ROWS, DP)
    load_rows(v_s, v, k0, vec, ROWS, DP)
    load_rows(do_s, do, t0 * QT, vec, QT, DP)
    kaio.cp_async_commit()
    load_rows(q_s, q, t0 * QT, vec, QT, DP)
    kaio.cp_async_commit()

    dk_acc = kaio.local(f32, (4, DP // 64, 4))
    dv_acc = kaio.local(f32, (4, DP // 64, 4))
    zero_acc(dk_acc, DP)
    zero_acc(dv_acc, DP)
    st = kaio.local(f32, (4, C))
    dpt = kaio.local(f32, (4, C))
    st_m = kaio.local(f32, (4, 1, 4))  # (TC: mma_tile's 64 x 64 accumulators)
    dpt_m = kaio.local(f32, (4, 1, 4))
    lse2 = kaio.local(f32, C)
    dlt = kaio.local(f32, C)
    for t in range(t0, t1):
        if not TC:
            for c in kaio.static_range(C):
                l2, dl = row_stats(lse, delta, t * QT + tx + 16 * c, Sq)
                lse2[c] = l2
                dlt[c] = dl
        kaio.cp_async_wait(1)  # dO of step t in first (dP^T while Q lands), then Q
        kaio.sync_threads()
        score_product(dpt, dpt_m, v_s, do_s, ty, tx, DP, C, TC)
        kaio.cp_async_wait_all()
        kaio.sync_threads()
        score_product(st, st_m, k_s, q_s, ty, tx, DP, C, TC)
        if TC:
            mma_probs(pt_s, dst_s, st_m, dpt_m, lse, delta, scale_log2, causal, k0, t * QT, Sq,
                      Sk, 1)  # fmt: skip
        else:
            for r in kaio.static_range(4):
                key = k0 + 4 * ty + r
                for c in kaio.static_range(C):
                    p = kaio.exp2(st[r, c] * scale_log2 - lse2[c])
                    p = kaio.select(causal == 0 or key <= t * QT + tx + 16 * c, p, 0.0)
                    pt_s[4 * ty + r, tx + 16 * c] = p
                    dst_s[4 * ty + r, tx + 16 * c] = p * (dpt[r, c] - dlt[c])
        kaio.sync_threads()
        if DS:
            store_ds(dsw, dst_s, t * QT, x, (Sq + ROWS - 1) // ROWS, causal, QT)
        acc_product(dv_acc, pt_s, do_s, ty, tx, QT, DP, TC)
        kaio.sync_threads()  # the next step's dO over dK's product, its Q over the next dP^T
        if t + 1 < t1:
            load_rows(do_s, do, (t + 1) * QT, vec, QT, DP)
        kaio.cp_async_commit()
        acc_product(dk_acc, dst_s, q_s, ty, tx, QT, DP, TC)
        kaio.sync_threads()
        if t + 1 < t1:
            load_rows(q_s, q, (t + 1) * QT, vec, QT, DP)
        kaio.cp_async_commit()
    if TC:  # (all 64 rows: the workspace's slots have them)
        store_mma(dk, dk_row0, dk_acc, DP)
        store_mma(dv, dv_row0, dv_acc, DP)
    else:
        for r in kaio.static_range(4):
            if k0 + 4 * ty + r < Sk:
                store_rows(dk, dk_row0, dk_acc, r, 4 * ty + r, 1.0, tx, vec, DP)
                store_rows(dv, dv_row0, dv_acc, r, 4 * ty + r, 1.0, tx, vec, DP)


@kaio.gpu_func
def score_product(
    s: f32[:, :], s_m: f32[:, :, :], a_s: f32[:, :], b_s: f32[:, :], ty: u32, tx: u32,
    DP: kaio.constexpr, C: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """A 64 x 16C tile of row-by-row dot products A B^T (S^T = K Q^T, dP^T = V dO^T): into
    s_m by ``mma_tile`` (TC 1, C = 4), else into s by ``dot_tile``."""
    if TC:
        zero_acc(s_m, 64)
        mma_tile(s_m, a_s, b_s, DP, 64, 1, TC)
    else:
        dot_tile(s, a_s, b_s, ty, tx, DP, C)


@kaio.gpu_func
def mma_probs(
    p_s: f32[:, :], ds_s: f32[:, :], s: f32[:, :, :], dp: f32[:, :, :], lse: f32[:],
    delta: f32[:], scale_log2: f32, causal: u32, r0: u32, c0: u32, Sq: u32, Sk: u32,
    KEYS: kaio.constexpr,
):  # fmt: skip
    """P and dS = P (dP - delta) of a 64 x 64 tile from ``mma_tile``'s accumulators of S and
    dP (``score_product``) into p_s (``KEYS`` 1 only) and ds_s: ``KEYS`` 1 the transposes
    (rows keys r0 .., columns queries c0 ..: dK/dV's P^T, dS^T), else rows queries r0 ..,
    columns keys c0 .. (dQ's dS, keys past Sk masked)."""
    lane = kaio.lane_id()
    m0 = 16 * (kaio.warp_id() % 4) + lane // 4
    n0 = 32 * (kaio.warp_id() // 4) + 2 * (lane % 4)
    lse2 = kaio.local(f32, 2)  # a query's stats: of rows m0, m0 + 8, or of a column
    dlt = kaio.local(f32, 2)
    if not KEYS:
        for half in kaio.static_range(2):
            lse2[half], dlt[half] = row_stats(lse, delta, r0 + m0 + 8 * half, Sq)
    for j in kaio.static_range(4):
        for h in kaio.static_range(2):
            col = n0 + 8 * j + h
            if KEYS:
                lse2[0], dlt[0] = row_stats(lse, delta, c0 + col, Sq)
            for half in kaio.static_range(2):
                row = m0 + 8 * half
                at = 0 if KEYS else half
                if KEYS:
                    ok = causal == 0 or r0 + row <= c0 + col
                else:
                    ok = c0 + col < Sk and (causal == 0 or c0 + col <= r0 + row)
                i = 2 * half + h
                p = kaio.select(ok, kaio.exp2(s[j, 0, i] * scale_log2 - lse2[at]), 0.0)
                if KEYS:
                    p_s[row, col] = p
                ds_s[row, col] = p * (dp[j, 0, i] - dlt[at])


@kaio.gpu_func
def ds_block(y: u32, x: u32, tiles: u32, causal: u32) -> u32:
    """The 64 x 64 block of dS (query tile y, key tile x) in ``flash_bwd_dq_ds``' workspace:
    row-major over the ``tiles`` x ``tiles`` blocks, causal only those with x <= y (the
    lower triangle). (Plain arithmetic: the host sizes the workspace with it.)"""
    return y * (y + 1) // 2 + x if causal != 0 else y * tiles + x


@kaio.gpu_func
def store_ds(
    dsw: f32[:, :], dst_s: f32[:, :], q0: u32, x: u32, tiles: u32, causal: u32,
    QT: kaio.constexpr,
):  # fmt: skip
    """dS of queries q0 .. q0 + QT - 1 and 64-row key tile x, from ``dkdv_tile``'s dS^T
    tile ``dst_s`` [keys, queries], to its place in dS's block (``ds_block``): rows of 64
    keys, one key a thread in turn (stores 256 bytes a row together)."""
    row0 = ds_block(q0 // ROWS, x, tiles, causal) * ROWS + q0 % ROWS
    tid = kaio.thread_idx_x()
    for i in kaio.static_range(ROWS * QT // NT):
        e = tid + i * NT
        dsw[row0 + e // ROWS, e % ROWS] = dst_s[e % ROWS, e // ROWS]


def dq_ds_width(dp: int, tc: int) -> int:
    """Floats a row of ``flash_bwd_dq_ds``' K tiles: DP + 4 for ``acc_tile``'s 16-byte reads,
    DP + 8 for ``mma_tile``'s (its B fragments' 4 rows x 8 columns in 32 different banks)."""
    return dp + (8 if tc else 4)


def dq_ds_shared_bytes(dp: int, bufs: int, tc: int) -> int:
    """Dynamic shared memory of ``flash_bwd_dq_ds``: ``bufs`` pairs of a K tile, a dS tile."""
    return bufs * (ROWS * dq_ds_width(dp, tc) * 4 + ROWS * (ROWS + 4) * 4)


@kaio.gpu_func
def dq_ds_load(
    k_s: f32[:, :], ds_s: f32[:, :], k: f32[:, :], dsw: f32[:, :], y: u32, x: u32, tiles: u32,
    causal: u32, vec: u32, DP: kaio.constexpr,
):  # fmt: skip
    """Key tile x of k into k_s and dS block (y, x) of dsw into ds_s, by cp.async (the caller
    commits and waits)."""
    load_rows(k_s, k, x * ROWS, vec, ROWS, DP)
    load_rows(ds_s, dsw, ds_block(y, x, tiles, causal) * ROWS, 1, ROWS, ROWS)


@kaio.gpu_func
def dq_ds_step(
    acc: f32[:, :, :], k_s: f32[:, :], ds_s: f32[:, :], k_n: f32[:, :], ds_n: f32[:, :],
    k: f32[:, :], dsw: f32[:, :], y: u32, x: u32, x1: u32, tiles: u32, causal: u32, vec: u32,
    ty: u32, tx: u32, DP: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """acc += dS block (y, x) K tile x, from k_s and ds_s (their copies the last group
    committed), once key tile x + 1's copies into k_n and ds_n are under way."""
    kaio.sync_threads()  # done with k_n and ds_n (the step before)
    if x + 1 < x1:
        dq_ds_load(k_n, ds_n, k, dsw, y, x + 1, tiles, causal, vec, DP)
    kaio.cp_async_commit()
    kaio.cp_async_wait(1)
    kaio.sync_threads()
    acc_product(acc, ds_s, k_s, ty, tx, ROWS, DP, TC)


@kaio.gpu_kernel(block_size=NT)
def flash_bwd_dq_ds(
    k: f32[:, :], dsw: f32[:, :], items: i32[:, :], ws: f32[:, :], causal: u32, vec: u32,
    per_block: i32, DP: kaio.constexpr, BUFS: kaio.constexpr, TC: kaio.constexpr,
):  # fmt: skip
    """Block x's share of dQ = dS K (``bwd_shares``, from the dS that ``flash_bwd_shares``
    stored with ``DS`` 1): its ``per_block`` items, rows x per_block .. of ``items``, each
    ``(1, tile, t0, t1, slot)`` (kind -1: none): the dQ of 64-row query tile ``tile`` over
    64-row key tiles t0 .. t1 - 1 into the 64-row slot ``slot`` of ``ws``, unscaled (a
    plain product: one a tile instead of three). ``BUFS`` 2: the next tiles' copies over
    each product (two buffers). ``TC`` 1: the products on the tensor cores (``mma_tile``)."""
    W = DP + 8 if TC else DP + 4  # (dq_ds_width)
    PAIR = ROWS * W * 4 + ROWS * (ROWS + 4) * 4
    tiles = (u32(k.shape[0]) + ROWS - 1) // ROWS
    tid, ty, tx = thread_grid()
    k_s = kaio.shared_dynamic(f32, (ROWS, W), 0)
    ds_s = kaio.shared_dynamic(f32, (ROWS, ROWS + 4), ROWS * W * 4)
    k_n = kaio.shared_dynamic(f32, (ROWS, W), PAIR * (BUFS - 1))
    ds_n = kaio.shared_dynamic(f32, (ROWS, ROWS + 4), PAIR * (BUFS - 1) + ROWS * W * 4)
    zero_tile(k_s, ROWS, W)
    if BUFS == 2:
        zero_tile(k_n, ROWS, W)
    acc = kaio.local(f32, (4, DP // 64, 4))
    for j in range(per_block):
        at = i32(kaio.block_idx_x()) * per_block + j
        if items[at, 0] == 1:
            y = u32(items[at, 1])
            x1 = u32(items[at, 3])
            zero_acc(acc, DP)
            if BUFS == 2:
                x = u32(items[at, 2])
                kaio.sync_threads()  # done with the last item's tiles
                dq_ds_load(k_s, ds_s, k, dsw, y, x, tiles, causal, vec, DP)
                kaio.cp_async_commit()
                while x < x1:
                    dq_ds_step(acc, k_s, ds_s, k_n, ds_n, k, dsw, y, x, x1, tiles, causal, vec,
                               ty, tx, DP, TC)  # fmt: skip
                    x += 1
                    if x < x1:
                        dq_ds_step(acc, k_n, ds_n, k_s, ds_s, k, dsw, y, x, x1, tiles, causal,
                                   vec, ty, tx, DP, TC)  # fmt: skip
                        x += 1
            else:
                for x in range(u32(items[at, 2]), x1):
                    kaio.sync_threads()  # done with the last tiles
                    dq_ds_load(k_s, ds_s, k, dsw, y, x, tiles, causal, vec, DP)
                    kaio.cp_async_wait_all()
                    kaio.sync_threads()
                    acc_product(acc, ds_s, k_s, ty, tx, ROWS, DP, TC)
            row0 = u32(items[at, 4]) * ROWS
            if TC:
                store_mma(ws, row0, acc, DP)
            else:
                for r in kaio.static_range(4):
                    store_rows(ws, row0, acc, r, 4 * ty + r, 1.0, tx, vec, DP)
