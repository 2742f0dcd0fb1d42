"""Tensor-core attention (FlashAttention-2), forward and backward, written in the kaio DSL,
for f16/bf16 inputs (``DT``) with f32 accumulation and ``OT`` output (f32 for
``attention_tc``, the input type for ``flash_attention``). The host side is
``kaio_ops.attention``.

- A block of ``WARPS`` warps owns ``16 * WARPS`` query rows of one (batch, head); each warp
  owns 16 rows, as the A operand of ``mma.m16n8k16``. Q is loaded once (cp.async) and, for
  head dims up to 128, kept in registers as fragments; wider heads re-read it from shared
  memory with ``ldmatrix`` at each key tile.
- Keys advance ``BN`` at a time. K and V tiles are single-buffered in shared memory,
  XOR-swizzled (``kaio.swizzle``) for conflict-free ``ldmatrix``, and each is loaded with
  cp.async while the other is in use: K of tile t + 1 during the softmax and P @ V of tile
  t, V of tile t + 1 during Q @ K^T of tile t + 1.
- S = Q K^T: K rows are the B operand as they are (``ldmatrix`` without ``.trans`` gives the
  ``col`` layout). The online softmax runs on the accumulators in registers: each row's
  values sit in the 4 lanes of a lane group, reduced with two ``shfl_xor``.
- P @ V: the S accumulators of two adjacent 8-key tiles, packed to f16/bf16 pairs, are
  exactly the A fragment of the next mma (the m16n8k16 accumulator layout is the A layout);
  V is the B operand through ``ldmatrix_trans``.
- Head dims are padded to ``DP`` (a power of two, 16..256: whole swizzle rows), with zeros.
- Grouped-query attention: query head h reads K/V head h // group.
- The forward also writes each row's logsumexp (natural log), which the backward takes.

The backward (FlashAttention-2, D <= 256) is two kernels with no atomics: ``attention_bwd_dq``
(a block per 64 query rows: S = Q K^T and dP = dO V^T recomputed a key tile at a time,
dS = P * (dP - delta), dQ += dS K) and ``attention_bwd_dkdv`` (a block per 64 keys of a K/V
head, over the query tiles of every query head of its group: S^T = K Q^T, dP^T = V dO^T, then
dV += P^T dO and dK += dS^T Q). Each warp owns 16 rows (queries, resp. keys), so P and dS
(resp. P^T and dS^T) come out of the mma accumulators in the A layout of the next product.
The A operands of S and dP (Q and dO, resp. K and V) are read into fragments at most
``A_COLS`` = 128 columns at a time (``dot_shared_rows``), so that a head of 256 leaves the
registers to the accumulators: dQ's 128 per thread, or dK's or dV's (each 128: for DP = 256
they come from two launches, ``WITH_DK`` and ``WITH_DV``). ``delta`` = rowsum(dO * O) comes
from ``row_dot``. The backward's outputs are typed ``OT`` (the host passes ``DT``).

Each kernel's body is a device function over row bases and row strides and a causal
diagonal shift (``attend_rows``, ``dq_rows``, ``dkdv_rows``; tiles load through
``load_rows``): the kernels here pass a dense head's bases (rows D apart, causal j <= i), the
variable-length kernels of ``kaio_ops._attention_varlen`` a packed sequence's (rows H * D
apart, causal aligned bottom-right).
"""

# ruff: noqa: F821  (DT and OT in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import f16, f32, i32, u32
from kaio_ops._common import lanes_sum, warp_sum

NEG_INF = float("-inf")
POS_INF = float("inf")
LAZY_GROWTH = 8.0  # ``row_max``'s LAZY: the growth of a row max (base 2) left unrescaled
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
A_COLS = 128  # the backward reads A fragments at most this many columns at a time
BWD_THREADS = 128  # the threads of a backward block (4 warps)


@kaio.gpu_func
def load_tile(
    dst: DT[:, :], src: DT[:],
    base: u32, row0: u32, nrows: u32, ncols: u32, tid: u32,
    R: kaio.constexpr, C: kaio.constexpr, THREADS: kaio.constexpr, VEC: kaio.constexpr,
    DT: kaio.constexpr,
):  # fmt: skip
    """Rows row0 .. row0 + R of the row-major [nrows, ncols] matrix at src[base] into the
    swizzled R x C tile dst, zeros outside the matrix: 16-byte cp.async copies when VEC
    (ncols % 8 == 0 and src 16-byte aligned; the caller commits), else element by element."""
    load_rows(dst, src, base, row0, nrows, ncols, ncols, tid, R, C, THREADS, VEC, DT)


@kaio.gpu_func
def load_rows(
    dst: DT[:, :],
    src: DT[:],
    base: u32,
    row0: u32,
    nrows: u32,
    ncols: u32,
    stride: u32,
    tid: u32,
    R: kaio.constexpr,
    C: kaio.constexpr,
    THREADS: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    """``load_tile`` of a matrix whose rows start ``stride`` elements apart (a head of a
    packed [tokens, heads, D] array: stride = heads * D; VEC also needs stride % 8 == 0)."""
    if VEC:
        # thread tid copies chunk tid % PIECES of rows tid // PIECES + STEP * i: the swizzle
        # phase repeats every 8 rows, and the source address advances by STEP rows
        PIECES = C // 8
        STEP = THREADS // PIECES
        r0 = tid // PIECES
        col = tid % PIECES * 8
        at0 = base + (row0 + r0) * stride + col
        for i in kaio.static_range((R + STEP - 1) // STEP):
            r = r0 + i * STEP
            if R % STEP == 0 or r < R:
                inside = row0 + r < nrows and col < ncols
                at = (r, kaio.swizzle(dst, r0 + i * STEP % 8, col))
                index = kaio.select(inside, at0 + i * STEP * stride, 0)
                kaio.cp_async(dst, at, src, index, 16, kaio.select(inside, 16, 0))
    else:
        piece = tid
        while piece < R * C:  # a runtime loop: the slow path stays small
            r = piece // C
            col = piece % C
            inside = row0 + r < nrows and col < ncols
            x = src[kaio.select(inside, base + (row0 + r) * stride + col, 0)]
            dst[r, kaio.swizzle(dst, r, col)] = kaio.select(inside, x, DT(0.0))
            piece += THREADS


@kaio.gpu_func
def load_pair(
    x_s: DT[:, :], y_s: DT[:, :], x: DT[:], y: DT[:],
    base: u32, row0: u32, nrows: u32, ncols: u32, stride: u32, tid: u32,
    R: kaio.constexpr, DP: kaio.constexpr, WITH_Y: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The backward's tile loads: rows row0 .. row0 + R of x and y, two matrices with the same
    rows (Q and dO, or K and V), into x_s and y_s (y only where ``WITH_Y``) by a backward
    block's threads (``load_rows``, 16-byte copies), waited for, then the block synchronized."""
    load_rows(x_s, x, base, row0, nrows, ncols, stride, tid, R, DP, BWD_THREADS, True, DT)
    if WITH_Y:
        load_rows(y_s, y, base, row0, nrows, ncols, stride, tid, R, DP, BWD_THREADS, True, DT)
    kaio.cp_async_wait_all()
    kaio.sync_threads()


@kaio.gpu_func
def pack(lo: f32, hi: f32, DT: kaio.constexpr) -> u32:
    """Two f32 values rounded to a DT pair (lo in the low half), as a 32-bit fragment register."""
    if DT == f16:
        return kaio.bitcast(kaio.f16x2(lo, hi), u32)
    return kaio.bitcast(kaio.bf16x2(lo, hi), u32)


@kaio.gpu_func
def mma(
    acc: f32[:, :], n: kaio.constexpr, a: u32[:, :], ka: kaio.constexpr, b: u32[:, :],
    kb: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """acc[n] += a[ka] @ b[kb]: one m16n8k16 with DT inputs (device functions take whole
    local arrays, so the fragments are named by their constant indices)."""
    if DT == f16:
        kaio.mma_f16(acc[n], a[ka], b[kb], acc[n])
    else:
        kaio.mma_bf16(acc[n], a[ka], b[kb], acc[n])


@kaio.gpu_func
def frag_columns(
    acol: u32[:],
    bcol: u32[:],
    s: DT[:, :],
    lane: u32,
    DT: kaio.constexpr,
):
    """The ldmatrix columns of this lane in a swizzled tile with rows like ``s``'s: ``acol``
    for A fragments and ``.trans`` B fragments (row lane % 16, column lane // 16 * 8),
    ``bcol`` for B fragments of row-major [n, k] tiles (row lane // 16 * 8 + lane % 8, column
    lane // 8 % 2 * 8), each for the 16-column steps b = 0..3. The swizzle permutes 16-byte
    chunks within 128-byte groups with a phase that repeats every 8 rows, so logical column
    64a + 16b + c sits at 64a + (that of 16b + c): the rest of every address is a constant."""
    for b in kaio.static_range(4):
        acol[b] = kaio.swizzle(s, lane % 16, 16 * b + lane // 16 * 8)
        bcol[b] = kaio.swizzle(s, lane // 16 * 8 + lane % 8, 16 * b + lane // 8 % 2 * 8)


@kaio.gpu_func
def load_a(
    af: u32[:, :], a_s: DT[:, :],
    row0: u32,
    acol: u32[:],
    lane: u32,
    K0: kaio.constexpr, K: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """af[kk] = the A fragments of rows row0 .. row0 + 15 of a_s, columns K0 + 16 kk for the
    k-steps kk < K / 16 (K0 a multiple of 64)."""
    for kk in kaio.static_range(K // 16):
        kaio.ldmatrix(af[kk], a_s, (row0 + lane % 16, K0 + kk // 4 * 64 + acol[kk % 4]))


@kaio.gpu_func
def dot_rows(
    acc: f32[:, :], af: u32[:, :], b_s: DT[:, :], bcol: u32[:],
    lane: u32,
    NB: kaio.constexpr, K0: kaio.constexpr, K: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """acc[n] = A @ B^T for the n-tiles n < NB over the columns K0 .. K0 + K (acc[n] +=
    where K0 > 0: the first column block starts the sum): A the warp's 16 rows in fragments
    ``af`` (k-steps of 16), B rows 0 .. 8 NB of the shared tile b_s (the ``col`` B operand as
    stored: ldmatrix without .trans)."""
    dot_rows_at(acc, af, b_s, 0, bcol, lane, NB, K0, K, DT)


@kaio.gpu_func
def dot_rows_at(
    acc: f32[:, :], af: u32[:, :], b_s: DT[:, :],
    b_row0: u32,
    bcol: u32[:],
    lane: u32,
    NB: kaio.constexpr, K0: kaio.constexpr, K: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``dot_rows`` with B rows b_row0 .. b_row0 + 8 NB of b_s (b_row0 a multiple of 8)."""
    bf = kaio.local(u32, (2, 2))
    if K0 == 0:
        for n in kaio.static_range(NB):
            for e in kaio.static_range(4):
                acc[n, e] = 0.0
    for kk in kaio.static_range(K // 16):
        for nj in kaio.static_range(NB // 2):
            row = b_row0 + nj * 16 + lane // 16 * 8 + lane % 8
            kaio.ldmatrix(bf, b_s, (row, K0 + kk // 4 * 64 + bcol[kk % 4]))
            for i in kaio.static_range(2):
                mma(acc, 2 * nj + i, af, kk, bf, i, DT)


@kaio.gpu_func
def dot_shared_rows(
    acc: f32[:, :], af: u32[:, :], a_s: DT[:, :],
    row0: u32,
    b_s: DT[:, :], acol: u32[:], bcol: u32[:],
    lane: u32,
    NB: kaio.constexpr, DP: kaio.constexpr, KC: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """acc[n] = A @ B^T for the n-tiles n < NB over DP columns, A rows row0 .. row0 + 15 of
    the shared tile a_s, read into the fragments ``af`` (KC / 16 k-steps) KC columns at a
    time: KC < DP keeps wide heads' A fragments to KC / 4 registers."""
    for c in kaio.static_range(DP // KC):
        load_a(af, a_s, row0, acol, lane, c * KC, KC, DT)
        dot_rows(acc, af, b_s, bcol, lane, NB, c * KC, KC, DT)


@kaio.gpu_func
def acc_rows(
    acc: f32[:, :], p: f32[:, :], v_s: DT[:, :], acol: u32[:],
    lane: u32,
    KB: kaio.constexpr, DP: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """acc[n] += P @ V over DP / 8 n-tiles: P the warp's 16 x 8 KB accumulators ``p`` (the
    accumulators of n-tiles 2kk, 2kk + 1, packed to DT pairs, are the A fragment of k-step
    kk), V rows 0 .. 8 KB of the shared tile v_s (ldmatrix .trans)."""
    acc_rows_at(acc, p, v_s, 0, acol, lane, KB, DP, DT)


@kaio.gpu_func
def acc_rows_at(
    acc: f32[:, :], p: f32[:, :], v_s: DT[:, :],
    v_row0: u32,
    acol: u32[:],
    lane: u32,
    KB: kaio.constexpr, DP: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``acc_rows`` with V rows v_row0 .. v_row0 + 8 KB of v_s (v_row0 a multiple of 8)."""
    pf = kaio.local(u32, (1, 4))
    vf = kaio.local(u32, (2, 2))
    for kk in kaio.static_range(KB // 2):
        pf[0, 0] = pack(p[2 * kk, 0], p[2 * kk, 1], DT)
        pf[0, 1] = pack(p[2 * kk, 2], p[2 * kk, 3], DT)
        pf[0, 2] = pack(p[2 * kk + 1, 0], p[2 * kk + 1, 1], DT)
        pf[0, 3] = pack(p[2 * kk + 1, 2], p[2 * kk + 1, 3], DT)
        for nj in kaio.static_range(DP // 16):
            row = v_row0 + kk * 16 + lane % 16
            kaio.ldmatrix_trans(vf, v_s, (row, nj // 4 * 64 + acol[nj % 4]))
            for i in kaio.static_range(2):
                mma(acc, 2 * nj + i, pf, 0, vf, i, DT)


@kaio.gpu_func
def softmax_step(
    s: f32[:, :], m: f32[:], l: f32[:],
    h: kaio.constexpr,
    scale_log2: f32,
    NB: kaio.constexpr,
    SUMS: kaio.constexpr = 1,
    PAIRS: kaio.constexpr = 0,
    DT: kaio.constexpr = kaio.f16,
    LAZY: kaio.constexpr = 0,
) -> f32:  # fmt: skip
    """One online-softmax step of this lane's row half h (row g + 8h of the warp's 16) over
    the scores s of NB n-tiles (masked ones -inf): the running max m[h] (base 2, scaled) and
    sum l[h] (this lane's part) updated and s replaced by the probabilities; returns the
    factor by which the row's earlier accumulators must be rescaled. A row's values sit in
    the 4 lanes of its lane group. ``SUMS`` 0: l is left alone (the caller sums the
    probabilities elsewhere, e.g. on the tensor cores). ``PAIRS`` 1 (with SUMS 0): the
    exponentials of each pair of columns in one ``ex2.approx`` of a DT pair (f16x2: one
    MUFU.EX2 for two probabilities, max rel. error 2^-9.9 and the exponent rounded to f16),
    whose bits go to s[n, 2h] (s[n, 2h + 1] is left as it was). ``row_max`` (``LAZY``:
    its) then ``exponentials``."""
    base, alpha = row_max(s, m, h, scale_log2, NB, LAZY)
    exponentials(s, l, h, base, alpha, scale_log2, NB, SUMS, PAIRS, DT)
    return alpha


@kaio.gpu_func
def row_max(
    s: f32[:, :], m: f32[:], h: kaio.constexpr, scale_log2: f32, NB: kaio.constexpr,
    LAZY: kaio.constexpr = 0,
) -> tuple[f32, f32]:  # fmt: skip
    """``softmax_step``'s first half: row half h's running max m[h] updated with the scores
    s; returns ``(base, alpha)``: the max the exponentials subtract (0 for a row with no
    score yet) and the factor of the earlier accumulators. ``LAZY`` 1 (FlashAttention-4's
    conditional rescale): the max kept where the scores exceed it by at most LAZY_GROWTH
    (probabilities up to 2^LAZY_GROWTH, exact once the output is divided by the row's sum):
    alpha stays 1, and the accumulators need no rescale in most key tiles."""
    top = NEG_INF
    for n in kaio.static_range(NB):
        for e in kaio.static_range(2):
            top = kaio.max(top, s[n, 2 * h + e])
    top = kaio.max(top, kaio.shfl_xor(top, 1))
    top = kaio.max(top, kaio.shfl_xor(top, 2))
    m_new = kaio.max(m[h], top * scale_log2)
    if LAZY:  # (m[h] -inf: any finite score is past it)
        m_new = kaio.select(m_new > m[h] + LAZY_GROWTH, m_new, m[h])
    base = kaio.select(m_new == NEG_INF, 0.0, m_new)
    alpha = kaio.exp2(m[h] - base)
    m[h] = m_new
    return base, alpha


@kaio.gpu_func
def exponentials(
    s: f32[:, :], l: f32[:], h: kaio.constexpr, base: f32, alpha: f32, scale_log2: f32,
    NB: kaio.constexpr, SUMS: kaio.constexpr = 1, PAIRS: kaio.constexpr = 0,
    DT: kaio.constexpr = kaio.f16,
):  # fmt: skip
    """``softmax_step``'s second half: s replaced by 2^(s scale_log2 - base) (``PAIRS``:
    its), and with ``SUMS`` the sum l[h] rescaled by alpha and grown by them."""
    total = 0.0
    for n in kaio.static_range(NB):
        if PAIRS:
            x0 = kaio.fma(s[n, 2 * h], scale_log2, -base)
            x1 = kaio.fma(s[n, 2 * h + 1], scale_log2, -base)
            if DT == kaio.bf16:
                s[n, 2 * h] = kaio.bitcast(kaio.exp2(kaio.bf16x2(x0, x1)), f32)
            else:
                s[n, 2 * h] = kaio.bitcast(kaio.exp2(kaio.f16x2(x0, x1)), f32)
        else:
            for e in kaio.static_range(2):
                p = kaio.exp2(kaio.fma(s[n, 2 * h + e], scale_log2, -base))
                s[n, 2 * h + e] = p
                if SUMS:
                    total += p
    if SUMS:
        l[h] = l[h] * alpha + total


@kaio.gpu_func
def rescale(o: f32[:, :], h: kaio.constexpr, alpha: f32, DP: kaio.constexpr):
    """Row half h of the accumulators o (DP / 8 n-tiles) times alpha."""
    for n in kaio.static_range(DP // 8):
        for e in kaio.static_range(2):
            o[n, 2 * h + e] = o[n, 2 * h + e] * alpha


@kaio.gpu_func
def start_rows(m: f32[:], l: f32[:], o: f32[:, :], DP: kaio.constexpr):
    """The online softmax's start for this lane's two row halves: no max yet (-inf), a zero
    sum, zero accumulators o (DP / 8 n-tiles)."""
    for h in kaio.static_range(2):
        m[h] = NEG_INF
        l[h] = 0.0
    for n in kaio.static_range(DP // 8):
        for e in kaio.static_range(4):
            o[n, e] = 0.0


@kaio.gpu_func
def online_softmax(
    s: f32[:, :], m: f32[:], l: f32[:], o: f32[:, :],
    h: kaio.constexpr,
    scale_log2: f32,
    NB: kaio.constexpr, DP: kaio.constexpr,
):  # fmt: skip
    """``softmax_step`` of row half h, then the accumulators o (DP / 8 n-tiles) rescaled."""
    rescale(o, h, softmax_step(s, m, l, h, scale_log2, NB), DP)


@kaio.gpu_func
def store_out(
    out: OT[:], at: u32, acc: f32[:, :], h: kaio.constexpr, factor: f32, lane: u32, cols: u32,
    DP: kaio.constexpr, VEC: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """out[at + col] = acc * factor for this lane's columns col < cols of accumulator row
    half h (row g + 8h of the warp's 16), two at a time when VEC."""
    for n in kaio.static_range(DP // 8):
        col = n * 8 + lane % 4 * 2
        pair = kaio.local(OT, 2)
        for e in kaio.static_range(2):
            pair[e] = acc[n, 2 * h + e] * factor
        if VEC:
            if col < cols:
                kaio.store_vector(out, at + col, pair)
        else:
            for e in kaio.static_range(2):
                if col + e < cols:
                    out[at + col + e] = pair[e]


@kaio.gpu_func
def thread_place() -> tuple[u32, u32, u32, u32]:
    """``(tid, lane, warp, g)``: this thread's index in the block, its lane, its warp and its
    lane group (``lane // 4``: it holds fragment rows g and g + 8 of its warp's 16)."""
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    return tid, lane, tid // 32, lane // 4


@kaio.gpu_func
def kv_head(bh: u32, heads: u32, group: u32) -> u32:
    """The K/V head that query head ``bh`` (batch * heads + head) reads: each ``group``
    query heads of a batch share one (grouped-query attention)."""
    return bh // heads * (heads // group) + bh % heads // group


@kaio.gpu_func
def lse_log2(x: f32) -> f32:
    """A natural-log row logsumexp as the base-2 offset of the backward's probabilities,
    +inf for a row with no valid key (its probabilities are then exp2(-inf) = 0)."""
    return kaio.select(x == NEG_INF, POS_INF, x * LOG2E)


@kaio.gpu_kernel
def attention_fwd(
    q: DT[:], k: DT[:], v: DT[:], out: OT[:], lse: f32[:],
    sq: u32, sk: u32, d: u32, dv: u32, heads: u32, group: u32, scale_log2: f32, causal: u32,
    DP: kaio.constexpr, WARPS: kaio.constexpr, BN: kaio.constexpr, MIN_BLOCKS: kaio.constexpr,
    VEC: kaio.constexpr, DT: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """out[bh, row] = softmax(q[bh, row] k[kv]^T * scale) v[kv] and lse[bh, row] = the row's
    logsumexp, for the 16 * WARPS query rows of block x (heaviest causal tiles first) and
    (batch, head) ``bh`` = block y; q [.., sq, d], k [.., sk, d], v [.., sk, dv],
    out [.., sq, dv], lse [.., sq], all flat; kv = the K/V head of ``bh``. Causal: row i
    sees keys j <= i (torch's is_causal)."""
    BM = 16 * WARPS
    kaio.launch_bounds(32 * WARPS, MIN_BLOCKS)
    bh = kaio.block_idx_y()
    kvh = kv_head(bh, heads, group)
    q0 = (kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * BM
    attend_rows(
        q, k, v, out, lse,
        q_base=bh * sq * d, q_stride=d,
        k_base=kvh * sk * d, k_stride=d,
        v_base=kvh * sk * dv, v_stride=dv,
        o_base=bh * sq * dv, o_stride=dv,
        lse_base=bh * sq,
        sq=sq, sk=sk, d=d, dv=dv, q0=q0, causal=causal, shift_q=0, shift_k=0,
        scale_log2=scale_log2, DP=DP, WARPS=WARPS, BN=BN, VEC=VEC, DT=DT, OT=OT,
    )  # fmt: skip


@kaio.gpu_func
def attend_rows(
    q: DT[:],
    k: DT[:],
    v: DT[:],
    out: OT[:],
    lse: f32[:],
    q_base: u32,
    q_stride: u32,
    k_base: u32,
    k_stride: u32,
    v_base: u32,
    v_stride: u32,
    o_base: u32,
    o_stride: u32,
    lse_base: u32,
    sq: u32,
    sk: u32,
    d: u32,
    dv: u32,
    q0: u32,
    causal: u32,
    shift_q: u32,
    shift_k: u32,
    scale_log2: f32,
    DP: kaio.constexpr,
    WARPS: kaio.constexpr,
    BN: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
    OT: kaio.constexpr,
):
    """The body of ``attention_fwd`` (and of ``_attention_varlen.varlen_fwd``): the query
    rows q0 .. q0 + 16 * WARPS of one head against its sk keys. Row i of Q starts at
    q[q_base + i * q_stride] (d columns), key j of K and V at k[k_base + j * k_stride] and
    v[v_base + j * v_stride] (dv columns), output row i at out[o_base + i * o_stride], its
    logsumexp at lse[lse_base + i]. Causal: row i sees keys j with j + shift_q <= i + shift_k
    (0, 0: torch's is_causal; sq, sk: aligned bottom-right, as FlashAttention's); a row that
    sees no key gets zeros and a logsumexp of -inf."""
    BM = 16 * WARPS
    THREADS = 32 * WARPS
    QREG = DP <= 128  # Q fragments stay in registers
    tid, lane, warp, g = thread_place()
    q_s = kaio.shared_dynamic(DT, (BM, DP), 0)
    k_s = kaio.shared_dynamic(DT, (BN, DP), BM * DP * 2)
    v_s = kaio.shared_dynamic(DT, (BN, DP), (BM + BN) * DP * 2)

    n_tiles = (sk + BN - 1) // BN
    if causal != 0:  # the keys up to the last row's diagonal (none: no tile)
        last = q0 + BM + shift_k
        seen = kaio.select(last > shift_q, last - shift_q, 0)
        n_tiles = kaio.min(n_tiles, (seen + BN - 1) // BN)
    load_rows(q_s, q, q_base, q0, sq, d, q_stride, tid, BM, DP, THREADS, VEC, DT)
    load_rows(k_s, k, k_base, 0, sk, d, k_stride, tid, BN, DP, THREADS, VEC, DT)
    kaio.cp_async_commit()
    load_rows(v_s, v, v_base, 0, sk, dv, v_stride, tid, BN, DP, THREADS, VEC, DT)
    kaio.cp_async_commit()
    kaio.cp_async_wait(1)
    kaio.sync_threads()

    acol = kaio.local(u32, 4)
    bcol = kaio.local(u32, 4)
    frag_columns(acol, bcol, q_s, lane, DT)
    qf = kaio.local(u32, (DP // 16, 4))
    if QREG:
        load_a(qf, q_s, warp * 16, acol, lane, 0, DP, DT)
    m = kaio.local(f32, 2)
    l = kaio.local(f32, 2)
    o = kaio.local(f32, (DP // 8, 4))
    start_rows(m, l, o, DP)
    s = kaio.local(f32, (BN // 8, 4))
    for t in range(n_tiles):
        if not QREG:
            load_a(qf, q_s, warp * 16, acol, lane, 0, DP, DT)
        dot_rows(s, qf, k_s, bcol, lane, BN // 8, 0, DP, DT)  # S = Q K^T
        kaio.sync_threads()  # k_s is free
        if t + 1 < n_tiles:
            load_rows(k_s, k, k_base, (t + 1) * BN, sk, d, k_stride, tid, BN, DP, THREADS, VEC,
                      DT)  # fmt: skip
        kaio.cp_async_commit()

        # online softmax; this lane holds rows g (h = 0) and g + 8 (h = 1)
        # (a tile of keys all valid for every row of the block needs no mask)
        masked = (t + 1) * BN > sk or (causal != 0 and (t + 1) * BN + shift_q > q0 + 1 + shift_k)
        for h in kaio.static_range(2):
            if masked:
                row = q0 + warp * 16 + g + 8 * h
                for n in kaio.static_range(BN // 8):
                    for e in kaio.static_range(2):
                        key = t * BN + n * 8 + lane % 4 * 2 + e
                        ok = key < sk and (causal == 0 or key + shift_q <= row + shift_k)
                        s[n, 2 * h + e] = kaio.select(ok, s[n, 2 * h + e], NEG_INF)
            online_softmax(s, m, l, o, h, scale_log2, BN // 8, DP)
        kaio.cp_async_wait(1)  # V of tile t has landed
        kaio.sync_threads()
        acc_rows(o, s, v_s, acol, lane, BN // 8, DP, DT)  # O += P V
        kaio.sync_threads()  # v_s is free
        if t + 1 < n_tiles:
            load_rows(v_s, v, v_base, (t + 1) * BN, sk, dv, v_stride, tid, BN, DP, THREADS, VEC,
                      DT)  # fmt: skip
        kaio.cp_async_commit()
        kaio.cp_async_wait(1)  # K of tile t + 1 has landed
        kaio.sync_threads()
    kaio.cp_async_wait_all()  # no copy outlives the block (none: the prologue's)

    for h in kaio.static_range(2):
        total = l[h] + kaio.shfl_xor(l[h], 1)
        total += kaio.shfl_xor(total, 2)
        row = q0 + warp * 16 + g + 8 * h
        if row < sq:
            inv = kaio.select(total > 0.0, 1.0 / total, 0.0)
            store_out(out, o_base + row * o_stride, o, h, inv, lane, dv, DP, VEC, OT)
            if lane % 4 == 0:
                lse[lse_base + row] = kaio.select(
                    total > 0.0, (m[h] + kaio.log2(total)) * LN2, NEG_INF
                )


@kaio.gpu_kernel(block_size=256)
def row_dot(o: DT[:], do: DT[:], delta: f32[:], rows: u32, d: u32, DT: kaio.constexpr):
    """delta[row] = sum(o[row] * do[row]) in f32 for the flat [rows, d] arrays, a warp a
    row: the backward's rowsum(dO * O) (the f32 SIMT backward's too)."""
    row = kaio.block_idx_x() * 8 + kaio.warp_id()
    if row < rows:
        acc = 0.0
        for col in range(kaio.lane_id(), d, 32):
            acc += f32(o[row * d + col]) * f32(do[row * d + col])
        acc = warp_sum(acc)
        if kaio.lane_id() == 0:
            delta[row] = acc


@kaio.gpu_kernel(block_size=256)
def row_dot_vec(o: DT[:], do: DT[:], delta: f32[:], rows: i32, d: i32, L: kaio.constexpr,
                DT: kaio.constexpr):  # fmt: skip
    """``row_dot`` for rows of 16 bytes' multiples (d a multiple of 8, both arrays 16-byte
    aligned): ``L`` lanes a row (``row_lanes``), each adding 8 elements of a row a step from
    one 16-byte load of o and of do, 256 / L rows a block (a warp a row's 2-byte loads keep
    a quarter as many bytes in flight)."""
    t = i32(kaio.block_idx_x() * 256 + kaio.thread_idx_x())
    row = t // L
    acc = 0.0
    if row < rows:
        a = kaio.local(DT, 8)
        b = kaio.local(DT, 8)
        for c in range(t % L, d // 8, L):
            kaio.load_vector(a, o, row * d + 8 * c)
            kaio.load_vector(b, do, row * d + 8 * c)
            for e in kaio.static_range(8):
                acc += f32(a[e]) * f32(b[e])
    acc = lanes_sum(acc, L)  # (every lane: a row's L lanes are aligned in the warp)
    if row < rows and t % L == 0:
        delta[row] = acc


def row_lanes(d: int) -> int:
    """``row_dot_vec``'s lanes a row for head dim d: d / 8 rounded up to a power of two, at
    most 32 (one 16-byte load of each array a lane, or a few where d > 256)."""
    return min(32, 1 << max(d // 8 - 1, 0).bit_length())


def fill_delta(oa, da, delta, rows: int, d: int) -> None:
    """delta[row] = rowsum(o * do) (``row_dot_vec``) of the checked operands ``oa``, ``da``
    ([rows, d], 16-byte rows) on ``da``'s stream: the backward's delta."""
    from kaio_ops import _arrays

    lanes = row_lanes(d)
    row_dot_vec[-(-rows * lanes // 256), 256, _arrays.stream_of(da), 0](
        oa.arg(oa.size), da.arg(da.size), delta, rows, d, L=lanes, DT=da.dtype
    )


@kaio.gpu_kernel
def attention_bwd_dq(
    q: DT[:], k: DT[:], v: DT[:], do: DT[:], lse: f32[:], delta: f32[:], dq: OT[:],
    sq: u32, sk: u32, d: u32, heads: u32, group: u32, scale_log2: f32, scale: f32, causal: u32,
    DP: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """dQ of the 64 query rows of block x and head ``bh`` = block y: over the key tiles (BN
    keys) they see, P = exp2(S * scale_log2 - lse2) and dP = dO V^T from the tiles, then
    dS = P * (dP - delta) and dQ += dS K; finally dQ *= scale. Q, dO: [.., sq, d], K, V:
    [.., sk, d] (16-byte rows), all flat. The A fragments of Q and dO are re-read from
    shared memory KC = min(DP, 128) columns at a time, so that dQ's DP / 2 accumulator
    registers fit beside them up to DP = 256."""
    kaio.launch_bounds(128, 1)
    bh = kaio.block_idx_y()
    kvh = kv_head(bh, heads, group)
    q0 = (kaio.grid_dim_x() - 1 - kaio.block_idx_x()) * 64
    dq_rows(
        q, k, v, do, lse, delta, dq,
        q_base=bh * sq * d, q_stride=d,
        k_base=kvh * sk * d, k_stride=d,
        lse_base=bh * sq, delta_base=bh * sq, delta_stride=1,
        sq=sq, sk=sk, d=d, q0=q0, causal=causal, shift_q=0, shift_k=0,
        scale_log2=scale_log2, scale=scale, DP=DP, BN=BN, DT=DT, OT=OT,
    )  # fmt: skip


@kaio.gpu_func
def dq_rows(
    q: DT[:], k: DT[:], v: DT[:], do: DT[:], lse: f32[:], delta: f32[:], dq: OT[:],
    q_base: u32, q_stride: u32, k_base: u32, k_stride: u32,
    lse_base: u32, delta_base: u32, delta_stride: u32,
    sq: u32, sk: u32, d: u32, q0: u32, causal: u32, shift_q: u32, shift_k: u32,
    scale_log2: f32, scale: f32,
    DP: kaio.constexpr, BN: kaio.constexpr, DT: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """The body of ``attention_bwd_dq`` (and of ``_attention_varlen.varlen_bwd_dq``): dQ of
    the query rows q0 .. q0 + 64 of one head. Rows i of Q, dO and dQ start at
    q_base + i * q_stride, keys j of K and V at k_base + j * k_stride; row i's logsumexp is
    lse[lse_base + i], its delta delta[delta_base + i * delta_stride]. Causal: row i sees
    keys j with j + shift_q <= i + shift_k (see ``attend_rows``)."""
    tid, lane, warp, g = thread_place()
    q_s = kaio.shared_dynamic(DT, (64, DP), 0)
    do_s = kaio.shared_dynamic(DT, (64, DP), 64 * DP * 2)
    k_s = kaio.shared_dynamic(DT, (BN, DP), 128 * DP * 2)
    v_s = kaio.shared_dynamic(DT, (BN, DP), (128 + BN) * DP * 2)
    load_rows(q_s, q, q_base, q0, sq, d, q_stride, tid, 64, DP, BWD_THREADS, True, DT)
    load_rows(do_s, do, q_base, q0, sq, d, q_stride, tid, 64, DP, BWD_THREADS, True, DT)
    kaio.cp_async_commit()

    acol = kaio.local(u32, 4)
    bcol = kaio.local(u32, 4)
    frag_columns(acol, bcol, q_s, lane, DT)
    lse2 = kaio.local(f32, 2)
    dlt = kaio.local(f32, 2)
    for h in kaio.static_range(2):
        row = q0 + warp * 16 + g + 8 * h
        at = kaio.select(row < sq, row, 0)
        lse2[h] = kaio.select(row < sq, lse_log2(lse[lse_base + at]), POS_INF)
        dlt[h] = delta[delta_base + at * delta_stride]
    n_tiles = (sk + BN - 1) // BN
    if causal != 0:  # the keys up to the last row's diagonal (none: no tile)
        last = q0 + 64 + shift_k
        seen = kaio.select(last > shift_q, last - shift_q, 0)
        n_tiles = kaio.min(n_tiles, (seen + BN - 1) // BN)
    acc = kaio.local(f32, (DP // 8, 4))
    for n in kaio.static_range(DP // 8):
        for e in kaio.static_range(4):
            acc[n, e] = 0.0
    KC = DP if DP <= A_COLS else A_COLS  # the A fragments' columns read at a time
    af = kaio.local(u32, (KC // 16, 4))
    s = kaio.local(f32, (BN // 8, 4))
    dp = kaio.local(f32, (BN // 8, 4))
    for t in range(n_tiles):
        kaio.sync_threads()  # the last tile's k_s, v_s are free
        load_pair(k_s, v_s, k, v, k_base, t * BN, sk, d, k_stride, tid, BN, DP, True, DT)
        # S = Q K^T, dP = dO V^T
        dot_shared_rows(s, af, q_s, warp * 16, k_s, acol, bcol, lane, BN // 8, DP, KC, DT)
        dot_shared_rows(dp, af, do_s, warp * 16, v_s, acol, bcol, lane, BN // 8, DP, KC, DT)
        for h in kaio.static_range(2):
            row = q0 + warp * 16 + g + 8 * h
            for n in kaio.static_range(BN // 8):
                for e in kaio.static_range(2):
                    key = t * BN + n * 8 + lane % 4 * 2 + e
                    ok = key < sk and (causal == 0 or key + shift_q <= row + shift_k)
                    x = kaio.exp2(kaio.fma(s[n, 2 * h + e], scale_log2, -lse2[h]))
                    p = kaio.select(ok, x, 0.0)
                    s[n, 2 * h + e] = p * (dp[n, 2 * h + e] - dlt[h])  # dS
        acc_rows(acc, s, k_s, acol, lane, BN // 8, DP, DT)  # dQ += dS K
    kaio.cp_async_wait_all()  # no copy outlives the block (none: the prologue's)
    for h in kaio.static_range(2):
        row = q0 + warp * 16 + g + 8 * h
        if row < sq:
            store_out(dq, q_base + row * q_stride, acc, h, scale, lane, d, DP, True, OT)


@kaio.gpu_kernel
def attention_bwd_dkdv(
    q: DT[:], k: DT[:], v: DT[:], do: DT[:], lse: f32[:], delta: f32[:], dk: OT[:], dv: OT[:],
    sq: u32, sk: u32, d: u32, heads: u32, group: u32, scale_log2: f32, scale: f32, causal: u32,
    DP: kaio.constexpr, BQ: kaio.constexpr, WITH_DK: kaio.constexpr, WITH_DV: kaio.constexpr,
    DT: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """dK and dV of the 64 keys of block x and K/V head ``kvh`` = block y, summed over the
    ``group`` query heads that read it and their query tiles (BQ rows) that see these keys:
    P^T = exp2(K Q^T * scale_log2 - lse2), dP^T = V dO^T, dV += P^T dO,
    dK += dS^T Q with dS^T = P^T * (dP^T - delta); finally dK *= scale. dK only where
    ``WITH_DK``, dV only where ``WITH_DV``: heads wider than 128, whose two accumulators do
    not both fit in the registers, take one launch for each (the dV one skips V, dP^T and
    delta). Above DP = 64 the A fragments of K and V are re-read from shared memory at each
    tile, A_COLS columns at a time."""
    kaio.launch_bounds(128, 1)
    kvh = kaio.block_idx_y()
    kv_heads = heads // group
    first_head = kvh // kv_heads * heads + kvh % kv_heads * group
    dkdv_rows(
        q, k, v, do, lse, delta, dk, dv,
        q_base=first_head * sq * d, q_head=sq * d, q_stride=d,
        k_base=kvh * sk * d, k_stride=d,
        lse_base=first_head * sq, lse_head=sq,
        delta_base=first_head * sq, delta_head=sq, delta_stride=1,
        group=group, sq=sq, sk=sk, d=d, k0=kaio.block_idx_x() * 64, causal=causal,
        shift_q=0, shift_k=0, scale_log2=scale_log2, scale=scale,
        DP=DP, BQ=BQ, WITH_DK=WITH_DK, WITH_DV=WITH_DV, DT=DT, OT=OT,
    )  # fmt: skip


@kaio.gpu_func
def dkdv_rows(
    q: DT[:], k: DT[:], v: DT[:], do: DT[:], lse: f32[:], delta: f32[:], dk: OT[:], dv: OT[:],
    q_base: u32, q_head: u32, q_stride: u32, k_base: u32, k_stride: u32,
    lse_base: u32, lse_head: u32, delta_base: u32, delta_head: u32, delta_stride: u32,
    group: u32, sq: u32, sk: u32, d: u32, k0: u32, causal: u32, shift_q: u32, shift_k: u32,
    scale_log2: f32, scale: f32,
    DP: kaio.constexpr, BQ: kaio.constexpr, WITH_DK: kaio.constexpr, WITH_DV: kaio.constexpr,
    DT: kaio.constexpr, OT: kaio.constexpr,
):  # fmt: skip
    """The body of ``attention_bwd_dkdv`` (and of ``_attention_varlen.varlen_bwd_dkdv``): dK
    and dV of the keys k0 .. k0 + 64 of one K/V head, summed over the ``group`` query heads
    j that read it. Keys i of K, V, dK and dV start at k_base + i * k_stride; query row r
    of head j of Q and dO at q_base + j * q_head + r * q_stride, its logsumexp at
    lse[lse_base + j * lse_head + r], its delta at
    delta[delta_base + j * delta_head + r * delta_stride]. Causal: row r sees keys i with
    i + shift_q <= r + shift_k (see ``attend_rows``); a key no row sees gets zeros."""
    tid, lane, warp, g = thread_place()
    k_s = kaio.shared_dynamic(DT, (64, DP), 0)
    v_s = kaio.shared_dynamic(DT, (64, DP), 64 * DP * 2)
    q_s = kaio.shared_dynamic(DT, (BQ, DP), 128 * DP * 2)
    do_s = kaio.shared_dynamic(DT, (BQ, DP), (128 + BQ) * DP * 2)
    load_pair(k_s, v_s, k, v, k_base, k0, sk, d, k_stride, tid, 64, DP, WITH_DK, DT)

    acol = kaio.local(u32, 4)
    bcol = kaio.local(u32, 4)
    frag_columns(acol, bcol, k_s, lane, DT)
    KVREG = DP <= 64  # K and V fragments stay in registers (else: re-read each tile)
    KC = DP if DP <= A_COLS else A_COLS  # the A fragments' columns read at a time
    kf = kaio.local(u32, (KC // 16, 4))
    vf = kaio.local(u32, (KC // 16, 4))
    if KVREG:
        load_a(kf, k_s, warp * 16, acol, lane, 0, DP, DT)
        if WITH_DK:
            load_a(vf, v_s, warp * 16, acol, lane, 0, DP, DT)
    dka = kaio.local(f32, (DP // 8, 4))
    dva = kaio.local(f32, (DP // 8, 4))
    for n in kaio.static_range(DP // 8):
        for e in kaio.static_range(4):
            if WITH_DK:
                dka[n, e] = 0.0
            if WITH_DV:
                dva[n, e] = 0.0
    first = u32(0)
    if causal != 0:  # rows before k0 + shift_q - shift_k see none of these keys
        top = k0 + shift_q
        first = kaio.select(top > shift_k, (top - shift_k) // BQ, 0)
    n_tiles = (sq + BQ - 1) // BQ
    st = kaio.local(f32, (BQ // 8, 4))
    dpt = kaio.local(f32, (BQ // 8, 4))
    for j in range(group):
        q_at = q_base + j * q_head
        lse_at = lse_base + j * lse_head
        delta_at = delta_base + j * delta_head
        for t in range(first, n_tiles):
            kaio.sync_threads()  # the last tile's q_s, do_s are free
            load_pair(q_s, do_s, q, do, q_at, t * BQ, sq, d, q_stride, tid, BQ, DP, True, DT)
            if KVREG:
                dot_rows(st, kf, q_s, bcol, lane, BQ // 8, 0, DP, DT)  # S^T = K Q^T
                if WITH_DK:
                    dot_rows(dpt, vf, do_s, bcol, lane, BQ // 8, 0, DP, DT)  # dP^T = V dO^T
            else:
                dot_shared_rows(st, kf, k_s, warp * 16, q_s, acol, bcol, lane, BQ // 8, DP, KC, DT)
                if WITH_DK:
                    dot_shared_rows(
                        dpt, kf, v_s, warp * 16, do_s, acol, bcol, lane, BQ // 8, DP, KC, DT
                    )
            for n in kaio.static_range(BQ // 8):
                for e in kaio.static_range(2):
                    query = t * BQ + n * 8 + lane % 4 * 2 + e
                    at = kaio.select(query < sq, query, 0)
                    l2 = kaio.select(query < sq, lse_log2(lse[lse_at + at]), POS_INF)
                    if WITH_DK:
                        dl = delta[delta_at + at * delta_stride]
                    for h in kaio.static_range(2):
                        key = k0 + warp * 16 + g + 8 * h
                        x = kaio.exp2(kaio.fma(st[n, 2 * h + e], scale_log2, -l2))
                        p = kaio.select(causal == 0 or key + shift_q <= query + shift_k, x, 0.0)
                        st[n, 2 * h + e] = p
                        if WITH_DK:
                            dpt[n, 2 * h + e] = p * (dpt[n, 2 * h + e] - dl)  # dS^T
            if WITH_DV:
                acc_rows(dva, st, do_s, acol, lane, BQ // 8, DP, DT)  # dV += P^T dO
            if WITH_DK:
                acc_rows(dka, dpt, q_s, acol, lane, BQ // 8, DP, DT)  # dK += dS^T Q
    for h in kaio.static_range(2):
        key = k0 + warp * 16 + g + 8 * h
        if key < sk:
            if WITH_DK:
                store_out(dk, k_base + key * k_stride, dka, h, scale, lane, d, DP, True, OT)
            if WITH_DV:
                store_out(dv, k_base + key * k_stride, dva, h, 1.0, lane, d, DP, True, OT)
