"""Tensor-core matmul kernels: ``C[M, N] (f32) = A[M, K] @ B[K, N]``, A and B f16 or bf16.

One tile routine (``matmul_tile``), written in the kaio DSL, specialized by constexprs, and two
kernels around it: ``matmul_kernel`` (one product) and ``qkv_kernel`` (up to three products
that share A, one launch: the grid covers their output columns one after the other and each
block multiplies its tile of the product its column tile falls in).

- A block computes a ``BM x BN`` tile of C with ``WARPS_M x WARPS_N`` warps; each warp owns a
  ``BM/WARPS_M x BN/WARPS_N`` sub-tile as 16x8 ``mma`` accumulators in registers.
- K advances ``BK`` at a time through shared memory, tiles stored XOR-swizzled
  (``kaio.swizzle``) so that ``ldmatrix`` (A) and ``ldmatrix_trans`` (B) read without bank
  conflicts.
- ``ASYNC``: ``STAGES``-deep ``cp.async`` pipeline (``STAGES - 1`` tiles in flight while one
  is multiplied). Otherwise tiles go through registers with 16-byte vector loads and stores,
  one at a time: the baseline, and the path that needs no sm_80 copy engine.
- ``VEC``: 16-byte copies need K and N multiples of 8 and 16-byte aligned inputs; without
  them (``VEC == 0``) tiles are loaded element by element (correct for any shape, slower).
- Edge tiles are zero-filled in shared memory (``src_bytes = 0``) and masked on store.
- Blocks run in groups of ``GROUP_M`` tile rows, so that consecutive blocks share A and B
  tiles in L2.
- ``SPLIT > 1`` (skinny shapes): block z multiplies one K slice and writes its partial tile
  to a workspace; a second kernel sums the slices in a fixed order (deterministic).
- ``QUANT``: B holds quantized weights, made f16 in registers right before the f16 ``mma``:
  4 for int4 (packed words and group scales), 8 for int8 bytes (scaled in the epilogue).
- Element types are dtype constexprs: ``DT`` the inputs' (f16, bf16, or 8-bit for the
  int8 matmul, whose accumulators are then i32: ``ACC``, derived in ``matmul_tile``), ``OUT``
  the output's: f32, or f16 for the QKV projections, rounded once from ``alpha * acc``.
"""

# ruff: noqa: F821  (DT, ACC and OUT in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import bf16, f16, f16x2, f32, i32, u32, u64
from kaio_ops._common import thread_element

GROUP_M = 8


@kaio.gpu_func
def tile_origin(pid: u32, grid_m: u32, grid_n: u32) -> u64:
    """The (row, column) of block ``pid``'s tile in a grid_m x grid_n grid of C tiles,
    packed as row * 2**32 + column tile indices (``tile_row``, ``tile_col``), blocks grouped
    GROUP_M tile rows at a time for L2 reuse. Either index may pass 65535 (M or N past
    65536 tiles; ops take up to 2**31 - 1 elements, so grid_n < 2**27 and GROUP_M * grid_n,
    even over the three products of qkv_kernel, fits in u32)."""
    width = GROUP_M * grid_n
    first_m = pid // width * GROUP_M
    group_m = kaio.min(grid_m - first_m, GROUP_M)
    pid_m = first_m + pid % width % group_m
    pid_n = pid % width // group_m
    return u64(pid_m) << 32 | u64(pid_n)


@kaio.gpu_func
def tile_row(origin: u64) -> u32:
    """The tile row index of a ``tile_origin``."""
    return u32(origin >> 32)


@kaio.gpu_func
def tile_col(origin: u64) -> u32:
    """The tile column index of a ``tile_origin``."""
    return u32(origin & 0xFFFFFFFF)


@kaio.gpu_func
def warp_place(WARPS_N: kaio.constexpr, WTM: kaio.constexpr, WTN: kaio.constexpr):
    """``(tid, lane, wm, wn)``: this thread's index in the block and in its warp, and the
    row and column of its warp's WTM x WTN sub-tile of the block tile (warps row-major,
    WARPS_N a row)."""
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    warp = tid // 32
    return tid, lane, warp // WARPS_N * WTM, warp % WARPS_N * WTN


@kaio.gpu_func
def k_range(k_slice: u32, K: u32, BK: kaio.constexpr):
    """``(k_begin, k_end, tiles)``: the K range of this block's slice (block z of a K split
    in slices of ``k_slice``; the whole K without one) and its number of BK steps."""
    k_begin = kaio.block_idx_z() * k_slice
    k_end = kaio.min(k_begin + k_slice, K)
    return k_begin, k_end, (k_end - k_begin + BK - 1) // BK


@kaio.gpu_kernel
def matmul_kernel(
    a: DT[:], b: DT[:], c: f32[:, :], scales: f16[:, :],
    M: u32, N: u32, K: u32, k_slice: u32, alpha: f32,
    BM: kaio.constexpr, BN: kaio.constexpr, BK: kaio.constexpr, WARPS_M: kaio.constexpr,
    WARPS_N: kaio.constexpr, STAGES: kaio.constexpr, ASYNC: kaio.constexpr, VEC: kaio.constexpr,
    QUANT: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """C = alpha * A @ B: block (x, z) computes C tile x, or with a K split the partial tile
    of K slice z (``matmul_tile``)."""
    kaio.launch_bounds(WARPS_M * WARPS_N * 32)
    origin = tile_origin(kaio.block_idx_x(), (M + BM - 1) // BM, (N + BN - 1) // BN)
    matmul_tile(a, b, c, scales, tile_row(origin) * BM, tile_col(origin) * BN, M, N, K, k_slice,
                alpha, BM, BN, BK, WARPS_M, WARPS_N, STAGES, ASYNC, VEC, QUANT, DT,
                f32)  # fmt: skip


@kaio.gpu_kernel
def qkv_kernel(
    a: f16[:], b0: f16[:], b1: f16[:], b2: f16[:], c0: OUT[:, :], c1: OUT[:, :], c2: OUT[:, :],
    s0: f16[:, :], s1: f16[:, :], s2: f16[:, :], M: u32, N0: u32, N1: u32, N2: u32, K: u32,
    k_slice: u32, alpha0: f32, alpha1: f32, alpha2: f32, BM: kaio.constexpr, BN: kaio.constexpr,
    BK: kaio.constexpr, WARPS_M: kaio.constexpr, WARPS_N: kaio.constexpr,
    STAGES: kaio.constexpr, ASYNC: kaio.constexpr, VEC: kaio.constexpr, QUANT: kaio.constexpr,
    OUT: kaio.constexpr,
):  # fmt: skip
    """C_p = alpha_p * A @ B_p for three products p that share A (the Q, K and V
    projections), in one launch. The grid's column tiles are those of C_0, then C_1, then
    C_2 (a product of width N_p = 0 has none, and its arrays are not read), and blocks are
    grouped GROUP_M tile rows at a time across all three, so that a row panel of A is read
    from memory once for the three. Each block runs ``matmul_tile`` on the arrays of the
    product its column tile belongs to: the per-tile work of ``matmul_kernel``, exactly.
    ``OUT``: f16, or f32 partial products when K is split (summed by ``sum_qkv_slices``)."""
    kaio.launch_bounds(WARPS_M * WARPS_N * 32)
    t0 = (N0 + BN - 1) // BN
    t01 = t0 + (N1 + BN - 1) // BN
    origin = tile_origin(kaio.block_idx_x(), (M + BM - 1) // BM, t01 + (N2 + BN - 1) // BN)
    m0 = tile_row(origin) * BM
    j = tile_col(origin)  # the block's column tile, counted over the three products
    if j < t0:
        matmul_tile(a, b0, c0, s0, m0, j * BN, M, N0, K, k_slice, alpha0,
                    BM, BN, BK, WARPS_M, WARPS_N, STAGES, ASYNC, VEC, QUANT, f16, OUT)  # fmt: skip
    elif j < t01:
        matmul_tile(a, b1, c1, s1, m0, (j - t0) * BN, M, N1, K, k_slice, alpha1,
                    BM, BN, BK, WARPS_M, WARPS_N, STAGES, ASYNC, VEC, QUANT, f16, OUT)  # fmt: skip
    else:
        matmul_tile(a, b2, c2, s2, m0, (j - t01) * BN, M, N2, K, k_slice, alpha2,
                    BM, BN, BK, WARPS_M, WARPS_N, STAGES, ASYNC, VEC, QUANT, f16, OUT)  # fmt: skip


@kaio.gpu_func
def matmul_tile(
    a: DT[:], b: DT[:], c: OUT[:, :], scales: f16[:, :],
    m0: u32, n0: u32, M: u32, N: u32, K: u32, k_slice: u32, alpha: f32,
    BM: kaio.constexpr, BN: kaio.constexpr, BK: kaio.constexpr, WARPS_M: kaio.constexpr,
    WARPS_N: kaio.constexpr, STAGES: kaio.constexpr, ASYNC: kaio.constexpr, VEC: kaio.constexpr,
    QUANT: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr,
):  # fmt: skip
    """The C tile at (m0, n0) (or, with a K split, the partial tile of K slice
    ``block_idx_z``) of alpha * A @ B, rounded once to OUT. A and B come flat: row-major
    M x K and K x N for 16-bit types; for 8-bit ones (s8 mma, bytes read as int8 whatever DT
    says) B comes transposed, N x K, because ldmatrix can only transpose 16-bit elements.
    With QUANT == 4 (DT f16), B is int4: the K/8 x N words of 8 signed nibbles (low first),
    passed as K/8 x 2N halves, dequantized in registers as ``scales[k // 128, n] * q``. With
    QUANT == 8 (DT f16), B is int8: the K x N bytes (N even), passed as K x N/2 halves,
    made f16 in registers (exactly; alpha is the scale). Flat indices are linear in k, so
    the per-thread part of every copy address is computed once, outside the K loop."""
    THREADS = WARPS_M * WARPS_N * 32
    ITEM = DT.itemsize
    ACC = i32 if ITEM == 1 else f32  # the accumulators: s8 mma for 8-bit types
    KSTEP = 32 // ITEM  # elements per mma k step: 16 (f16, bf16) or 32 (s8)
    KSTEPS = BK // KSTEP  # an even number: fragments are double-buffered
    WTM = BM // WARPS_M
    WTN = BN // WARPS_N
    MI = WTM // 16
    NI = WTN // 8
    tid, lane, wm, wn = warp_place(WARPS_N, WTM, WTN)
    k_begin, k_end, tiles = k_range(k_slice, K, BK)
    row0 = kaio.block_idx_z() * M  # this K slice's rows in c (the workspace when split)

    a_s = kaio.shared_dynamic(DT, (STAGES, BM, BK), 0)
    # B's tile: K x N, N x K for 8-bit types, the K/8 x N packed words (as halves) for int4,
    # the K x N bytes (as halves) for int8 weights
    b_rows = (
        (BK // 8, 2 * BN)
        if QUANT == 4
        else (BK, BN // 2)
        if QUANT == 8
        else (BN, BK)
        if ITEM == 1
        else (BK, BN)
    )
    b_s = kaio.shared_dynamic(DT, (STAGES, b_rows[0], b_rows[1]), STAGES * BM * BK * ITEM)

    acc = kaio.local(ACC, (MI, NI, 2, 2))
    for mi in kaio.static_range(MI):
        for ni in kaio.static_range(NI):
            for e in kaio.static_range(4):
                acc[mi, ni, e // 2, e % 2] = 0
    # Fragments are double-buffered: step ks multiplies buffer ks % 2 while the next step's
    # fragments load into the other one.
    a_frag = kaio.local(u32, (2, MI, 4))
    b_frag = kaio.local(u32, (2, NI // 2, 2, 2))
    stage = u32(0)

    if ASYNC:
        # All STAGES buffers in flight; tile t's buffer is refilled (with tile t + STAGES)
        # as soon as its last fragments are in registers, and the barrier that allows it
        # also makes tile t + 1 visible: it overlaps the last step's mma.
        for s in kaio.static_range(STAGES):
            load_tiles(1, a_s, b_s, b_s, a, b, s, m0, n0, k_begin + s * BK, k_end, M, N, K, tid,
                       BM, BN, BK, THREADS, VEC, ASYNC, QUANT, DT)  # fmt: skip
            kaio.cp_async_commit()
        kaio.cp_async_wait(STAGES - 1)
        kaio.sync_threads()
        load_fragments(a_frag, b_frag, 0, a_s, b_s, stage, 0, wm, wn, lane, MI, NI,
                       scales, k_begin, n0, N, QUANT, DT)  # fmt: skip
        for t in range(tiles):
            for ks in kaio.static_range(KSTEPS):
                if ks == KSTEPS - 1:
                    kaio.cp_async_wait(STAGES - 2)
                    kaio.sync_threads()
                    # Past the last tile the copies read nothing and zero-fill a buffer no
                    # one reads: cheaper than a branch that would split the loop body.
                    k_refill = k_begin + (t + STAGES) * BK
                    load_tiles(1, a_s, b_s, b_s, a, b, stage, m0, n0, k_refill, k_end, M, N, K, tid,
                               BM, BN, BK, THREADS, VEC, ASYNC, QUANT, DT)  # fmt: skip
                    kaio.cp_async_commit()
                    stage = kaio.select(stage == STAGES - 1, 0, stage + 1)
                    load_fragments(a_frag, b_frag, (ks + 1) % 2, a_s, b_s, stage, 0, wm, wn,
                                   lane, MI, NI, scales, k_begin + (t + 1) * BK, n0, N,
                                   QUANT, DT)  # fmt: skip
                else:
                    load_fragments(a_frag, b_frag, (ks + 1) % 2, a_s, b_s, stage,
                                   (ks + 1) * KSTEP, wm, wn, lane, MI, NI, scales,
                                   k_begin + t * BK + (ks + 1) * KSTEP, n0, N, QUANT,
                                   DT)  # fmt: skip
                mma_step(acc, a_frag, b_frag, ks % 2, MI, NI, DT, ACC)
    else:
        # Blocks inside the matrices along M and N copy their whole K tiles without bounds
        # checks (load_tiles), in a loop of their own; the rest, and a last partial K tile,
        # take the checked one.
        unchecked = kaio.select(m0 + BM <= M and n0 + BN <= N, (k_end - k_begin) // BK, 0)
        for edges in kaio.static_range(2):
            for t in range(0 if edges == 0 else unchecked, unchecked if edges == 0 else tiles):
                sync_step(edges, t, acc, a_frag, b_frag, a_s, b_s, a, b, scales, m0, n0,
                          k_begin, k_end, M, N, K, tid, wm, wn, lane, BM, BN, BK, THREADS, VEC,
                          QUANT, MI, NI, DT, ACC)  # fmt: skip

    # Lane (g, t) holds two adjacent columns of C per column pair p and row half h of each
    # 16-row tile mi: elements 0 and 1 of n8 tile p, or with int8 weights, whose n8 tiles
    # alternate even and odd columns (widen_int8), element p % 2 of tiles p // 2 * 2 and + 1.
    W8A16 = QUANT == 8
    pair = kaio.local(OUT, 2)
    for mi in kaio.static_range(MI):
        for p in kaio.static_range(NI):
            tile_a = p // 2 * 2 if W8A16 else p
            tile_b = tile_a + 1 if W8A16 else p
            elem_a = p % 2 if W8A16 else 0
            elem_b = p % 2 if W8A16 else 1
            col = n0 + wn + (p // 2 * 16 + p % 2 * 2 + lane % 4 * 4 if W8A16 else
                             p * 8 + lane % 4 * 2)  # fmt: skip
            for h in kaio.static_range(2):
                row = m0 + wm + mi * 16 + lane // 4 + h * 8
                pair[0] = OUT(f32(acc[mi, tile_a, h, elem_a]) * alpha)
                pair[1] = OUT(f32(acc[mi, tile_b, h, elem_b]) * alpha)
                if row < M:  # _common.store_cols, inline: the row is computed in each branch
                    if VEC:
                        if col < N:
                            kaio.store_vector(c, (row0 + row, col), pair)
                    else:
                        for e in kaio.static_range(2):
                            if col + e < N:
                                c[row0 + row, col + e] = pair[e]


@kaio.gpu_func
def sync_step(
    EDGES: kaio.constexpr, t: u32, acc: ACC[:, :, :, :], a_frag: u32[:, :, :],
    b_frag: u32[:, :, :, :], a_s: DT[:, :, :], b_s: DT[:, :, :], a: DT[:], b: DT[:],
    scales: f16[:, :], m0: u32, n0: u32, k_begin: u32, k_end: u32, M: u32, N: u32, K: u32,
    tid: u32, wm: u32, wn: u32, lane: u32, BM: kaio.constexpr, BN: kaio.constexpr,
    BK: kaio.constexpr, THREADS: kaio.constexpr, VEC: kaio.constexpr, QUANT: kaio.constexpr,
    MI: kaio.constexpr, NI: kaio.constexpr, DT: kaio.constexpr, ACC: kaio.constexpr,
):  # fmt: skip
    """K tile t of the pipeline-free path (no cp.async): copy both tiles to shared memory
    through registers (``load_tiles``, with bounds checks if EDGES), then multiply them."""
    KSTEP = 32 // DT.itemsize
    kaio.sync_threads()
    load_tiles(EDGES, a_s, b_s, b_s, a, b, 0, m0, n0, k_begin + t * BK, k_end, M, N, K, tid,
               BM, BN, BK, THREADS, VEC, False, QUANT, DT)  # fmt: skip
    kaio.sync_threads()
    for ks in kaio.static_range(BK // KSTEP):
        load_fragments(a_frag, b_frag, 0, a_s, b_s, 0, ks * KSTEP, wm, wn, lane, MI, NI, scales,
                       k_begin + t * BK + ks * KSTEP, n0, N, QUANT, DT)  # fmt: skip
        mma_step(acc, a_frag, b_frag, 0, MI, NI, DT, ACC)


@kaio.gpu_func
def load_fragments(
    a_frag: u32[:, :, :], b_frag: u32[:, :, :, :], BUF: kaio.constexpr, a_s: DT[:, :, :],
    b_s: DT[:, :, :], stage: u32, KK: kaio.constexpr, wm: u32, wn: u32, lane: u32,
    MI: kaio.constexpr, NI: kaio.constexpr, scales: f16[:, :], k_at: u32, n0: u32, N: u32,
    QUANT: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """This warp's A (MI x 16 rows x 32 bytes) and B (NI x 32 bytes x 8 columns) fragments
    of the k step at KK of ``stage`` (k_at in the whole matrix) into buffer BUF. Swizzle
    phases repeat every 8 rows and the warp's rows start at multiples of 16, so the lane
    gives the phase: the column offsets stay loop-invariant registers."""
    HALF = 16 // DT.itemsize  # elements in the 16 bytes of one ldmatrix row
    for mi in kaio.static_range(MI):
        col = kaio.swizzle(a_s, lane % 16, KK + lane // 16 * HALF)
        kaio.ldmatrix(a_frag[BUF, mi], a_s, (stage, wm + mi * 16 + lane % 16, col))
    if QUANT == 4:
        dequantize_b(b_frag, BUF, b_s, stage, KK, wn, lane, NI, scales, k_at, n0, N, DT)
    elif QUANT == 8:
        widen_int8(b_frag, BUF, b_s, stage, KK, wn, lane, NI, DT)
    else:
        for nj in kaio.static_range(NI // 2):
            if DT.itemsize == 1:
                # B^T (N x K): matrices (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi)
                col = kaio.swizzle(b_s, lane % 8, KK + lane // 8 % 2 * HALF)
                row = wn + nj * 16 + lane // 16 * 8 + lane % 8
                kaio.ldmatrix(b_frag[BUF, nj], b_s, (stage, row, col))
            else:
                col = kaio.swizzle(b_s, lane % 16, wn + nj * 16 + lane // 16 * HALF)
                kaio.ldmatrix_trans(b_frag[BUF, nj], b_s, (stage, KK + lane % 16, col))


INT4_MAGIC = 0x64006400  # f16 1024.0 in both halves: OR-ing a nibble in gives 1024 + nibble
INT4_BIAS = 0x64086408  # f16 1032.0 = 1024 + 8, in both halves


@kaio.gpu_func
def dequantize_b(
    b_frag: u32[:, :, :, :], BUF: kaio.constexpr, b_s: DT[:, :, :], stage: u32,
    KK: kaio.constexpr, wn: u32, lane: u32, NI: kaio.constexpr, scales: f16[:, :], k_at: u32,
    n0: u32, N: u32, DT: kaio.constexpr,
):  # fmt: skip
    """B fragments of the 16-value k step at KK from packed int4 words: lane (g, t) needs
    k = 2t, 2t+1 (register 0) and 2t+8, 2t+9 (register 1) of column g, i.e. nibbles 2t and
    2t+1 of two words. Each pair becomes an f16x2 with the magic-number trick
    (``((q + 8) | 0x6400) - 1032`` per half, exact), times the group's scale (one
    rounding, like f16 ``scale * q``)."""
    g = lane // 4
    shift = lane % 4 * 8
    group = kaio.min(k_at // 128, u32(scales.shape[0]) - 1)  # past K: the tile is unused
    word = kaio.local(u32, 1)
    for ni in kaio.static_range(NI):
        n = wn + ni * 8 + g
        s = scales[group, kaio.select(n0 + n < N, n0 + n, 0)]
        scale2 = kaio.f16x2(s, s)
        for r in kaio.static_range(2):
            row = KK // 8 + r
            kaio.load_vector(word, b_s, (stage, row, kaio.swizzle(b_s, row, 2 * n)))
            x = word[0] >> shift
            q = (((x & 0xF) | ((x << 12) & 0xF0000)) ^ 0x80008) | INT4_MAGIC
            v = (kaio.bitcast(q, f16x2) - kaio.bitcast(u32(INT4_BIAS), f16x2)) * scale2
            b_frag[BUF, ni // 2, ni % 2, r] = kaio.bitcast(v, u32)


INT8_MAGIC = 0x64646464  # f16 1024.0's high byte in every byte: prmt puts it above a byte
INT8_BIAS = 0x64806480  # f16 1152.0 = 1024 + 128, in both halves


@kaio.gpu_func
def widen_int8(
    b_frag: u32[:, :, :, :], BUF: kaio.constexpr, b_s: DT[:, :, :], stage: u32,
    KK: kaio.constexpr, wn: u32, lane: u32, NI: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """B fragments of the 16-value k step at KK from int8 weights: the K x N bytes of the
    tile read as K x N/2 halves. ``ldmatrix_trans`` of an 8 x 8 block of halves gives lane
    (g, t) the word of bytes (k, n), (k, n + 1), (k + 1, n), (k + 1, n + 1) with k = 2t
    (+ 8 for the second block) and n = 2g: bytes 0 and 2 are the B register of column g of
    an n8 tile of the even columns, bytes 1 and 3 that of the tile of the odd columns after
    it (the epilogue stores them interleaved). Each pair becomes an f16x2 with the
    magic-number trick (``prmt`` puts byte ``q ^ 0x80`` under 0x64: f16 1152 + q, minus
    1152, exact)."""
    words = kaio.local(u32, 4)
    for nq in kaio.static_range(NI // 4):  # 32 columns: 4 n8 tiles from one ldmatrix x4
        col = kaio.swizzle(b_s, lane % 16, wn // 2 + nq * 16 + lane // 16 * 8)
        kaio.ldmatrix_trans(words, b_s, (stage, KK + lane % 16, col))
        for i in kaio.static_range(4):  # (k lo, bytes 0-15), (k hi, 0-15), (k lo, 16-31)...
            biased = words[i] ^ 0x80808080
            for odd in kaio.static_range(2):
                q = kaio.prmt(biased, INT8_MAGIC, 0x4240 + odd * 0x101)
                v = kaio.bitcast(q, f16x2) - kaio.bitcast(u32(INT8_BIAS), f16x2)
                b_frag[BUF, nq * 2 + i // 2, odd, i % 2] = kaio.bitcast(v, u32)


@kaio.gpu_func
def mma_step(
    acc: ACC[:, :, :, :], a_frag: u32[:, :, :], b_frag: u32[:, :, :, :],
    BUF: kaio.constexpr, MI: kaio.constexpr, NI: kaio.constexpr, DT: kaio.constexpr,
    ACC: kaio.constexpr,
):  # fmt: skip
    """acc += the MI x NI tensor-core products of fragment buffer BUF (``DT`` inputs: f16,
    bf16 or 8-bit, read as int8; ``ACC`` accumulators: f32, i32 for 8-bit)."""
    for mi in kaio.static_range(MI):
        for ni in kaio.static_range(NI):
            a = a_frag[BUF, mi]
            b = b_frag[BUF, ni // 2, ni % 2]
            if DT == f16:
                kaio.mma_f16(acc[mi, ni], a, b, acc[mi, ni])
            elif DT == bf16:
                kaio.mma_bf16(acc[mi, ni], a, b, acc[mi, ni])
            else:  # 8-bit: the bytes are read as int8
                kaio.mma_s8(acc[mi, ni], a, b, acc[mi, ni])


@kaio.gpu_func
def load_tiles(
    EDGES: kaio.constexpr, a_s: DT[:, :, :], b_s: DT[:, :, :], u_s: DT[:, :, :], a: DT[:],
    b: DT[:], stage: u32, m0: u32, n0: u32, k0: u32, k_end: u32, M: u32, N: u32, K: u32,
    tid: u32, BM: kaio.constexpr, BN: kaio.constexpr, BK: kaio.constexpr,
    THREADS: kaio.constexpr, VEC: kaio.constexpr, ASYNC: kaio.constexpr, QUANT: kaio.constexpr,
    DT: kaio.constexpr, BT: kaio.constexpr = 0, GATE: kaio.constexpr = 0,
):  # fmt: skip
    """A[m0:m0+BM, k0:k0+BK] and B[k0:k0+BK, n0:n0+BN] (B^T's [n0:n0+BN, k0:k0+BK] for
    8-bit types and for ``BT`` (B given [N, K], ``_gemm``), the packed words
    [k0/8:(k0+BK)/8, n0:n0+BN] for int4, the bytes as halves [k0:k0+BK, n0/2:(n0+BN)/2] for
    int8 weights) into ``stage`` of the shared tiles, swizzled, zeros outside the matrices
    (and past k_end); ``EDGES == 0`` promises that both tiles lie inside them. ``GATE``
    (with BT): rows N + n0:+BN of B [2N, K] too, into ``u_s`` (otherwise unused: pass
    b_s). Copies through registers issue every load of the tiles before the first store."""
    # Each tile holds at most BK x max(BM, BN) elements: 16-byte copies per thread, at most
    COPIES = (BK * (BM if BM > BN else BN) // (16 // DT.itemsize) + THREADS - 1) // THREADS
    ra = kaio.local(u32, (COPIES, 4))
    rb = kaio.local(u32, (COPIES, 4))
    ru = kaio.local(u32, (COPIES if GATE else 1, 4))
    for phase in kaio.static_range(2 if VEC and not ASYNC else 1):
        load_tile(phase, EDGES, a_s, a, ra, stage, m0, k0, M, k_end, K, tid, BM, BK, THREADS,
                  VEC, ASYNC, DT)  # fmt: skip
        if QUANT == 4:
            load_tile(phase, EDGES, b_s, b, rb, stage, k0 // 8, 2 * n0, k_end // 8, 2 * N,
                      2 * N, tid, BK // 8, 2 * BN, THREADS, VEC, ASYNC, DT)  # fmt: skip
        elif QUANT == 8:
            load_tile(phase, EDGES, b_s, b, rb, stage, k0, n0 // 2, k_end, N // 2, N // 2, tid,
                      BK, BN // 2, THREADS, VEC, ASYNC, DT)  # fmt: skip
        elif DT.itemsize == 1 or BT:
            load_tile(phase, EDGES, b_s, b, rb, stage, n0, k0, N, k_end, K, tid, BN, BK, THREADS,
                      VEC, ASYNC, DT)  # fmt: skip
            if GATE:
                load_tile(phase, EDGES, u_s, b, ru, stage, N + n0, k0, 2 * N, k_end, K, tid, BN,
                          BK, THREADS, VEC, ASYNC, DT)  # fmt: skip
        else:
            load_tile(phase, EDGES, b_s, b, rb, stage, k0, n0, k_end, N, N, tid, BK, BN, THREADS,
                      VEC, ASYNC, DT)  # fmt: skip


@kaio.gpu_func
def load_tile(
    PHASE: kaio.constexpr, EDGES: kaio.constexpr,
    dst: DT[:, :, :], src: DT[:], regs: u32[:, :],
    stage: u32, r0: u32, c0: u32, rows: u32, cols: u32, ld: u32, tid: u32,
    R: kaio.constexpr, C: kaio.constexpr, THREADS: kaio.constexpr, VEC: kaio.constexpr,
    ASYNC: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The R x C tile at (r0, c0) of the flat row-major matrix ``src`` (row length ``ld``)
    into dst[stage], zeros past rows x cols: 16-byte chunks (cp.async when ASYNC, else
    vector loads into ``regs``) when VEC, else element by element. Through registers,
    PHASE 0 issues the loads and PHASE 1 stores them (see ``load_tiles``). ``EDGES == 0``
    promises that the tile lies inside rows x cols: no bounds checks."""
    PER = 16 // DT.itemsize if VEC else 1  # elements per copy
    PIECES = C // PER
    COPIES = (R * PIECES + THREADS - 1) // THREADS
    for i in kaio.static_range(COPIES):
        piece = tid + i * THREADS
        if R * PIECES % THREADS == 0 or piece < R * PIECES:
            r = piece // PIECES
            col = piece % PIECES * PER
            inside = True
            if EDGES:
                inside = r0 + r < rows and c0 + col < cols
            at = (stage, r, kaio.swizzle(dst, r, col))
            if PHASE == 1:
                for j in kaio.static_range(4):
                    regs[i, j] = kaio.select(inside, regs[i, j], 0)
                kaio.store_vector(dst, at, regs[i])
            else:
                index = kaio.select(inside, (r0 + r) * ld + c0 + col, 0)
                if not VEC:
                    v = src[index]
                    dst[at] = kaio.select(inside, v, DT(0.0))
                elif ASYNC:
                    kaio.cp_async(dst, at, src, index, 16, kaio.select(inside, 16, 0))
                else:
                    kaio.load_vector(regs[i], src, index)


@kaio.gpu_func
def slice_sum(ws: f32[:, :], row: u32, col: u32, M: u32, SPLIT: kaio.constexpr) -> f32:
    """The sum of the SPLIT partial products of C[row, col] stacked in ws [SPLIT * M, N],
    in order."""
    total = ws[row, col]
    for s in kaio.static_range(1, SPLIT):
        total += ws[s * M + row, col]
    return total


@kaio.gpu_kernel
def sum_slices(ws: f32[:, :], c: f32[:, :], SPLIT: kaio.constexpr):
    """c = the sum of the SPLIT partial products stacked in ws [SPLIT * M, N], in order."""
    M = u32(c.shape[0])
    inside, row, col = thread_element(M, u32(c.shape[1]))
    if inside:
        c[row, col] = slice_sum(ws, row, col, M, SPLIT)


@kaio.gpu_func
def store_sum(ws: f32[:, :], c: f16[:, :], i: u32, M: u32, N: u32, alpha: f32,
              SPLIT: kaio.constexpr):  # fmt: skip
    """Element i (row-major) of the M x N product c = f16(alpha * the sum of its slices)."""
    row = i // N
    col = i % N
    c[row, col] = f16(slice_sum(ws, row, col, M, SPLIT) * alpha)


@kaio.gpu_kernel
def sum_qkv_slices(
    ws0: f32[:, :], ws1: f32[:, :], ws2: f32[:, :], c0: f16[:, :], c1: f16[:, :], c2: f16[:, :],
    M: u32, N0: u32, N1: u32, N2: u32, alpha0: f32, alpha1: f32, alpha2: f32,
    SPLIT: kaio.constexpr,
):  # fmt: skip
    """c_p = f16(alpha_p * the sum of the SPLIT partial products stacked in ws_p), for the
    three products of ``qkv_kernel`` (widths N_p, 0 for none) in one launch: one thread per
    element, the elements of c_0, then c_1, then c_2."""
    i = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    n01 = M * (N0 + N1)
    if i < M * N0:
        store_sum(ws0, c0, i, M, N0, alpha0, SPLIT)
    elif i < n01:
        store_sum(ws1, c1, i - M * N0, M, N1, alpha1, SPLIT)
    elif i < n01 + M * N2:
        store_sum(ws2, c2, i - n01, M, N2, alpha2, SPLIT)
