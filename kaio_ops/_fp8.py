"""FP8 ops: ``quantize_fp8`` and ``matmul_fp8`` (``torch._scaled_mm``'s contract).

Quantization (``quantize_fp8``), with torch's recipe (torchao's per-tensor and per-row
scaling)::

    amax  = x.abs().amax()                     # per tensor, or per row (last axis)
    scale = amax.float().clamp(min=1e-12) / fp8_max      # 448 (e4m3) or 57344 (e5m2)
    q     = (x.float() / scale).to(fp8)        # round to nearest even

as torch computes them on CUDA: there ``tensor / python_number`` is ``tensor * (1 / number)``
with the reciprocal rounded to f32 (``div_true_kernel_cuda``), so the scale is ``amax *
f32(1 / fp8_max)``, one rounded product (torch on the CPU divides, and differs in the last
bit for some amax); ``x.float() / scale`` (a tensor divisor) is a true division. Every step
is exact or one IEEE f32 operation (the |max| compared as bits, so a NaN wins as torch's
``amax`` lets it; ``mul.rn``, ``div.rn``), so ``q`` and ``scale`` are bit-identical to those
torch lines on a GPU for finite inputs (NaN inputs give NaN everywhere they reach, with the GPU's
canonical NaN). |x / scale| never passes fp8_max by more than a rounding, so the GPU's
saturating conversion and torch's (which overflows to infinity for e5m2) agree.

Kernels: ``_quantize_rows``, one block per row (amax, then scale and convert);
``_amax_partial`` (a grid of blocks, each the |max| bits of its slice), ``_tensor_scale``
(one block: the scale from the partials) and ``_quantize_flat`` for a per-tensor scale.

Matmul (``matmul_fp8``): ``out = (a @ b) * scale_a * scale_b (+ bias)`` with f32
accumulation, rounded once to ``out_dtype``. ``_mm_fp8`` is a tiled tensor-core GEMM on
``mma.sync.m16n8k32`` with e4m3/e5m2 operands (sm_89+; it is what sm_90 runs too): 128 x 128
output tiles, 8 warps of 64 x 32, k tiles of 64 bytes double-buffered through shared memory
with 16-byte ``cp.async``. Both operands are read K-major as 32-bit words (4 fp8 values, the
mma's register format): ``a`` [M, K] and ``b``'s transpose [N, K], which is what a
column-major ``b`` (``torch._scaled_mm``'s layout, ``w.t()`` of a row-major [N, K] weight)
already is; a row-major ``b`` is transposed first by ``_transpose_bytes``.
"""

# ruff: noqa: F821  (DT and FP8 in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import e4m3, e5m2, f32, u32

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
AMAX_FLOOR = 1e-12  # torchao's EPS: an all-zero row or tensor gets a tiny, finite scale
ROW_THREADS = 256
FLAT_THREADS = 256
PARTIAL_BLOCKS = 1024  # at most this many blocks write |max| partials (one block reduces them)

# matmul tiles
BM = BN = 128  # load_rows copies BM rows of either operand
BK = 64  # bytes: 16 words, two m16n8k32 k steps
BKW = BK // 4
PAD = 4  # words of padding per shared row: conflict-free fragment loads, 16-byte aligned rows
WARPS_M, WARPS_N = 2, 4
MI, NI = 4, 4  # m16 and n8 tiles per warp (64 x 32)
MM_THREADS = WARPS_M * WARPS_N * 32

FP8_TYPES = {"e4m3": e4m3, "e5m2": e5m2}


@kaio.gpu_func
def abs_bits(v: f32) -> u32:
    """|v| as its bits: ordered like the magnitudes, and a NaN above every number (so a max
    of bits propagates NaN, as torch's amax does, where max.f32 would drop it)."""
    return kaio.bitcast(kaio.abs(v), u32)


@kaio.gpu_func
def block_max_bits(v: u32, red: u32[:]) -> u32:
    """The max of ``v`` over the block, in every thread (``red``: shared u32[32])."""
    for k in kaio.static_range(5):
        v = kaio.max(v, kaio.shfl_xor(v, 16 >> k))
    if kaio.lane_id() == 0:
        red[kaio.warp_id()] = v
    kaio.sync_threads()
    lane = kaio.lane_id()
    v = red[lane] if lane < (kaio.block_dim_x() >> 5) else u32(0)
    for k in kaio.static_range(5):
        v = kaio.max(v, kaio.shfl_xor(v, 16 >> k))
    return v


@kaio.gpu_func
def scale_of(amax_bits: u32, LIMIT: kaio.constexpr) -> f32:
    """max(amax, 1e-12) * (1 / LIMIT), NaN kept (``amax < floor`` is false for NaN): torch's
    CUDA arithmetic for ``amax / fp8_max``, which multiplies by the divisor's f32 reciprocal
    when it is a Python number (a true division differs in the last bit for some amax)."""
    amax = kaio.bitcast(amax_bits, f32)
    floor = f32(AMAX_FLOOR)
    amax = floor if amax < floor else amax
    return amax * (f32(1.0) / f32(LIMIT))


@kaio.gpu_kernel
def _quantize_rows(
    x: DT[:, :],
    q: FP8[:, :],
    scale: f32[:],
    LIMIT: kaio.constexpr,
    DT: kaio.constexpr,
    FP8: kaio.constexpr,
):
    """Row block_idx_x: its |max|, its scale, then q = fp8(x / scale)."""
    row = kaio.block_idx_x()
    k = u32(x.shape[1])
    tid = kaio.thread_idx_x()
    red = kaio.shared(u32, (32,))
    m = u32(0)
    for j in range(tid, k, ROW_THREADS):
        m = kaio.max(m, abs_bits(f32(x[row, j])))
    s = scale_of(block_max_bits(m, red), LIMIT)
    if tid == 0:
        scale[row] = s
    for j in range(tid, k, ROW_THREADS):
        q[row, j] = FP8(f32(x[row, j]) / s)


@kaio.gpu_kernel
def _amax_partial(x: DT[:], partial: u32[:], n: u32, DT: kaio.constexpr):
    """partial[block] = the |max| bits of the block's grid-stride slice of x."""
    red = kaio.shared(u32, (32,))
    m = u32(0)
    step = kaio.grid_dim_x() * FLAT_THREADS
    i = kaio.block_idx_x() * FLAT_THREADS + kaio.thread_idx_x()
    while i < n:
        m = kaio.max(m, abs_bits(f32(x[i])))
        i += step
    m = block_max_bits(m, red)
    if kaio.thread_idx_x() == 0:
        partial[kaio.block_idx_x()] = m


@kaio.gpu_kernel
def _tensor_scale(partial: u32[:], scale: f32[:], LIMIT: kaio.constexpr):
    """scale[0] from the partial |max| bits (one block)."""
    red = kaio.shared(u32, (32,))
    m = u32(0)
    for i in range(kaio.thread_idx_x(), u32(partial.shape[0]), FLAT_THREADS):
        m = kaio.max(m, partial[i])
    s = scale_of(block_max_bits(m, red), LIMIT)
    if kaio.thread_idx_x() == 0:
        scale[0] = s


@kaio.gpu_kernel
def _quantize_flat(
    x: DT[:], q: FP8[:], scale: f32[:], n: u32, DT: kaio.constexpr, FP8: kaio.constexpr
):
    """q[i] = fp8(x[i] / scale[0]), grid-stride."""
    s = scale[0]
    step = kaio.grid_dim_x() * FLAT_THREADS
    i = kaio.block_idx_x() * FLAT_THREADS + kaio.thread_idx_x()
    while i < n:
        q[i] = FP8(f32(x[i]) / s)
        i += step


@kaio.gpu_func
def store_scaled(
    out: DT[:, :], row: u32, col: u32, v0: f32, v1: f32, sa: f32[:], sb: f32[:], bias: DT[:],
    ROW_A: kaio.constexpr, COL_B: kaio.constexpr, BIAS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """out[row, col : col + 2] = (v0, v1) * (scale_a * scale_b) (+ bias), each rounded once
    to DT, in one 4- or 8-byte store (col is even and N a multiple of 16); the scales per
    tensor (element 0) or per row of a / column of b (ROW_A, COL_B)."""
    s_a = sa[0]
    if ROW_A:
        s_a = sa[row]
    store_scaled_by(out, row, col, v0, v1, s_a, sb[0], sb, bias, COL_B, BIAS, DT)


@kaio.gpu_func
def store_scaled_by(
    out: DT[:, :], row: u32, col: u32, v0: f32, v1: f32, s_a: f32, s_b0: f32, sb: f32[:],
    bias: DT[:], COL_B: kaio.constexpr, BIAS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``store_scaled`` with row ``row``'s scale ``s_a`` given, and b's per-tensor scale
    ``s_b0`` (loaded once by the caller; ``sb[col]`` instead with COL_B)."""
    vals = kaio.local(f32, (2,))
    vals[0] = v0
    vals[1] = v1
    pair = kaio.local(DT, (2,))
    for e in kaio.static_range(2):
        s_b = s_b0
        if COL_B:
            s_b = sb[col + e]
        v = vals[e] * (s_a * s_b)
        if BIAS:
            v += f32(bias[col + e])
        pair[e] = DT(v)
    kaio.store_vector(out, (row, col), pair)


@kaio.gpu_kernel
def _transpose_bytes(b: u32[:, :], bt: u32[:, :]):
    """bt [N, K/4] words = the K x N bytes of ``b`` (as [K, N/4] words) transposed: one
    thread per output word (4 bytes of a column of b)."""
    n = kaio.block_idx_y()
    kw = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    if kw < u32(bt.shape[1]):
        word = n >> 2
        shift = (n & 3) * 8
        v = u32(0)
        for j in kaio.static_range(4):
            v |= ((b[kw * 4 + j, word] >> shift) & 0xFF) << (8 * j)
        bt[n, kw] = v


@kaio.gpu_func
def load_rows(dst: u32[:, :, :], stage: u32, src: u32[:, :], r0: u32, rows: u32, k0w: u32):
    """cp.async rows r0.. (BM of them), words k0w.. (BKW) of ``src`` into ``dst[stage]``;
    16-byte chunks past the last row or word are zero-filled (the address kept in bounds)."""
    kw_total = u32(src.shape[1])
    for c in kaio.static_range(BM * BKW // 4 // MM_THREADS):
        chunk = kaio.thread_idx_x() + c * MM_THREADS
        r = chunk // (BKW // 4)
        cw = (chunk % (BKW // 4)) * 4
        ok = r0 + r < rows and k0w + cw < kw_total
        row = r0 + r if ok else u32(0)
        word = k0w + cw if ok else u32(0)
        kaio.cp_async(dst, (stage, r, cw), src, (row, word), 16, 16 if ok else 0)


@kaio.gpu_kernel
def _mm_fp8(
    a: u32[:, :],
    bt: u32[:, :],
    out: DT[:, :],
    sa: f32[:],
    sb: f32[:],
    bias: DT[:],
    ROW_A: kaio.constexpr,
    COL_B: kaio.constexpr,
    BIAS: kaio.constexpr,
    DT: kaio.constexpr,
    FP8: kaio.constexpr,
):
    """out[m, n] = (sum_k a[m, k] b[k, n]) * sa * sb (+ bias[n]); a [M, K/4] and bt [N, K/4]
    words of 4 fp8 values (FP8), one 128 x 128 tile of out per block."""
    M = u32(a.shape[0])
    N = u32(bt.shape[0])
    KW = u32(a.shape[1])
    m0 = kaio.block_idx_y() * BM
    n0 = kaio.block_idx_x() * BN
    a_s = kaio.shared(u32, (2, BM, BKW + PAD))
    b_s = kaio.shared(u32, (2, BN, BKW + PAD))
    acc = kaio.local(f32, (MI, NI, 4))
    for i in kaio.static_range(MI):
        for j in kaio.static_range(NI):
            for e in kaio.static_range(4):
                acc[i, j, e] = 0.0
    af = kaio.local(u32, (MI, 4))
    bf = kaio.local(u32, (NI, 2))
    warp = kaio.warp_id()
    lane = kaio.lane_id()
    g = lane >> 2
    t = lane & 3
    wm = (warp // WARPS_N) * (MI * 16)
    wn = (warp % WARPS_N) * (NI * 8)
    nk = (KW + BKW - 1) // BKW
    load_rows(a_s, 0, a, m0, M, 0)
    load_rows(b_s, 0, bt, n0, N, 0)
    kaio.cp_async_commit()
    for kt in range(nk):
        stage = kt & 1
        if kt + 1 < nk:
            load_rows(a_s, stage ^ 1, a, m0, M, (kt + 1) * BKW)
            load_rows(b_s, stage ^ 1, bt, n0, N, (kt + 1) * BKW)
        kaio.cp_async_commit()
        kaio.cp_async_wait(1)
        kaio.sync_threads()
        for ks in kaio.static_range(BKW // 8):
            kw = ks * 8 + t
            for i in kaio.static_range(MI):
                r = wm + i * 16 + g
                af[i, 0] = a_s[stage, r, kw]
                af[i, 1] = a_s[stage, r + 8, kw]
                af[i, 2] = a_s[stage, r, kw + 4]
                af[i, 3] = a_s[stage, r + 8, kw + 4]
            for j in kaio.static_range(NI):
                c = wn + j * 8 + g
                bf[j, 0] = b_s[stage, c, kw]
                bf[j, 1] = b_s[stage, c, kw + 4]
            for i in kaio.static_range(MI):
                for j in kaio.static_range(NI):
                    if FP8 == e4m3:
                        kaio.mma_e4m3(acc[i, j], af[i], bf[j], acc[i, j])
                    else:
                        kaio.mma_e5m2(acc[i, j], af[i], bf[j], acc[i, j])
        kaio.sync_threads()
    for i in kaio.static_range(MI):
        for h in kaio.static_range(2):
            row = m0 + wm + i * 16 + g + h * 8
            if row < M:
                for j in kaio.static_range(NI):
                    col = n0 + wn + j * 8 + 2 * t
                    if col < N:
                        store_scaled(out, row, col, acc[i, j, h * 2], acc[i, j, h * 2 + 1], sa,
                                     sb, bias, ROW_A, COL_B, BIAS, DT)  # fmt: skip


def shipped():
    """(kernel, constexprs) of every specialization the fp8 ops launch."""
    from kaio import bf16, f16

    for name, fp8 in FP8_TYPES.items():
        for dt in (f32, f16, bf16):
            types = {"DT": dt, "FP8": fp8}
            yield _quantize_rows, {"LIMIT": FP8_MAX[name], **types}
            yield _quantize_flat, types
            for row_a in (0, 1):
                for col_b in (0, 1):
                    for has_bias in (0, 1):
                        flags = {"ROW_A": row_a, "COL_B": col_b, "BIAS": has_bias}
                        yield _mm_fp8, {**flags, **types}
        yield _tensor_scale, {"LIMIT": FP8_MAX[name]}
    for dt in (f32, f16, bf16):
        yield _amax_partial, {"DT": dt}
    yield _transpose_bytes, {}
