"""GGUF quantizers: ``quantize_q8_0``, ``quantize_q6_k`` and their dequantizers.

The bytes are llama.cpp's (ggml's) block formats, which candle and mistral.rs read as well:

- **Q8_0**, 34 bytes per 32 values: ``d`` (fp16), then ``qs[32]`` (int8); value = qs * d.
- **Q6_K**, 210 bytes per super-block of 256 values: ``ql[128]`` (low 4 bits of each 6-bit
  quant), ``qh[64]`` (high 2 bits), ``scales[16]`` (int8, one per 16-value sub-block), ``d``
  (fp16); value = d * scale * (q - 32).

The quantizers reproduce ggml's reference encoders (``quantize_row_q8_0_ref``,
``quantize_row_q6_K_ref``) bit for bit: every f32 operation of the C code, in its order and
rounded as it rounds (divisions are IEEE ``div.rn``, products and sums are never fused),
``nearest_int`` with its 12582912 magic number, and the fp16 scales rounded to nearest even.

Kernels:

- ``_q8_0``: each lane quantizes ``E`` consecutive values (one 16-byte load when aligned);
  the 32 / E lanes of a block combine their |max| with shuffles.
- ``_q6_k``: one lane per 16-value sub-block, so 16 lanes per super-block and two
  super-blocks per warp. Each lane runs ggml's ``make_qx_quants(16, 32, x, L, 1, NULL)``: 19
  candidate scales, each a full weighted least-squares pass over its 16 values. That search
  is the whole cost (about 9 instructions per value and candidate), so the loop works on
  magnitudes: with t = iscale * x, |t| = |iscale| * |x| and round-to-nearest is symmetric, so
  the quant is sign(t) * min(rint(|t|), B) with B = 32 where t < 0 and 31 where t > 0, and
  every term of both sums has one sign (that of -max). This gives the reference's sums up to
  that common sign, with one clamp instead of two. The lanes of a super-block then find the
  largest scale with shuffles, quantize the 16 scales to int8 and re-quantize their values
  against them; the 6-bit quants go through shared memory, from which each lane assembles
  whole 4-byte groups of ql and qh.
- ``_dq8_0``, ``_dq6_k``: one thread per 4 outputs (one 16-byte store).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import f16, f32, i8, i32, u8, u16, u32
from kaio_ops import _arrays
from kaio_ops._common import load_f32, vector_width
from kaio_ops._plan import planned

__all__ = ["quantize_q8_0", "quantize_q6_k", "dequantize_q8_0", "dequantize_q6_k"]

QK8_0, Q8_0_BYTES = 32, 34
QK_K, Q6_K_BYTES = 256, 210
MAGIC = 12582912.0  # 1.5 * 2**23: x + MAGIC has round-to-nearest-even(x) in its low bits
GROUP_MAX_EPS = 1e-15  # ggml: a group whose |max| is below this quantizes to zeros
BLOCK = 256  # threads per block of the Q8_0 and dequantization kernels
Q6_WARPS = 4  # warps per block of _q6_k (two super-blocks a warp)
DQ_PER_THREAD = 4  # outputs per thread of the dequantizers


@kaio.gpu_func
def nearest_int(v: f32) -> i32:
    """ggml's nearest_int(v): the low mantissa bits of v + 12582912 (round to nearest even
    for |v| < 2**22, and the same bits as the C code for any finite v)."""
    return (kaio.bitcast(v + MAGIC, i32) & 0x007FFFFF) - 0x00400000


@kaio.gpu_func
def roundf(v: f32) -> i32:
    """C's roundf (halves away from zero) for |v| < 2**22, as an i32; no conversion
    instructions: v + 12582912 rounds to nearest even, and a half that went toward zero steps
    one away."""
    m = v + MAGIC
    r = m - MAGIC  # exact
    toward_zero = kaio.abs(v - r) == 0.5 and kaio.abs(r) < kaio.abs(v)
    q = kaio.bitcast(m, i32) - 0x4B400000
    return q + kaio.select(toward_zero, kaio.select(v < 0.0, -1, 1), 0)


@kaio.gpu_func
def store_f16(out: u8[:], at: u32, h: f16):
    """out[at : at + 2] = the bytes of h, little-endian."""
    bits = u32(kaio.bitcast(h, u16))
    out[at] = bits & 0xFF
    out[at + 1] = bits >> 8


@kaio.gpu_func
def load_f16(src: u8[:], at: u32) -> f32:
    """The little-endian fp16 at src[at : at + 2], as f32 (exact)."""
    bits = u16(u32(src[at]) | (u32(src[at + 1]) << 8))
    return f32(kaio.bitcast(bits, f16))


# ---------------------------------------------------------------------------- Q8_0
@kaio.gpu_kernel
def _q8_0(
    x: DT[:], out: u8[:], nblocks: u32, E: kaio.constexpr, VEC: kaio.constexpr, DT: kaio.constexpr
):
    """Lane group of 32 / E lanes per block of 32 values; E values per lane."""
    t = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    lanes = QK8_0 // E
    blk = t // lanes
    part = t % lanes
    v = kaio.local(f32, (E,))
    amax = 0.0
    if blk < nblocks:
        at = blk * QK8_0 + part * E
        for j in kaio.static_range(E // VEC):
            load_f32(v, j * VEC, x, at + j * VEC, VEC, DT)
        for j in kaio.static_range(E):
            amax = kaio.max(amax, kaio.abs(v[j]))
    for s in kaio.static_range(5):  # every lane of the warp takes part (blocks are whole warps)
        if (16 >> s) < lanes:
            amax = kaio.max(amax, kaio.shfl_xor(amax, 16 >> s))
    if blk < nblocks:
        d = amax / 127.0
        inv = 1.0 / d if d != 0.0 else 0.0
        base = blk * Q8_0_BYTES
        if part == 0:
            store_f16(out, base, f16(d))
        for j in kaio.static_range(E):
            out[base + 2 + part * E + j] = roundf(v[j] * inv)


# ---------------------------------------------------------------------------- Q6_K
@kaio.gpu_func
def make_qx_quants(xs: f32[:], ax: f32[:], lq: u32[:]) -> f32:
    """ggml's make_qx_quants(16, 32, xs, L, rmse_type=1, qw=NULL): returns the scale and
    writes L (0..63) to lq. Works on magnitudes (see the module docstring)."""
    w = kaio.local(f32, (16,))  # x * x, the weights
    wxa = kaio.local(f32, (16,))  # |w * x|
    bound = kaio.local(f32, (16,))  # MAGIC + the largest |quant| allowed: 32 if t < 0, 31 if t > 0
    amax = 0.0
    mx = 0.0
    for i in kaio.static_range(16):
        ax[i] = kaio.abs(xs[i])
        bigger = ax[i] > amax  # the first largest |x|, as the C loop
        amax = kaio.select(bigger, ax[i], amax)
        mx = kaio.select(bigger, xs[i], mx)
    zero = amax < GROUP_MAX_EPS
    amax = kaio.select(zero, 1.0, amax)  # keeps the (unused) arithmetic of a zero group finite
    for i in kaio.static_range(16):
        w[i] = xs[i] * xs[i]
        wxa[i] = w[i] * ax[i]
        same = (xs[i] > 0.0) == (mx > 0.0)  # t = iscale * x < 0, as iscale has -max's sign
        bound[i] = kaio.select(same, MAGIC + 32.0, MAGIC + 31.0)
    # candidate 0 (iscale = -32 / max), then is = -9 .. 9 without 0: iscale = -(32 + 0.1 is) / max
    scale = 0.0
    best = 0.0
    win = 0.0  # |iscale| of the best candidate so far
    for j in range(19):
        step = i32(j) - 10
        step = kaio.select(step >= 0, step + 1, step)
        a = 32.0 + 0.1 * f32(step)
        if j == 0:
            a = 32.0
        ia = a / amax
        sx = 0.0  # |sumlx|
        s2 = 0.0  # suml2
        for i in kaio.static_range(16):
            la = kaio.min(ia * ax[i] + MAGIC, bound[i]) - MAGIC
            if i == 0:  # 0 + p == p for the p >= 0 here: one addition fewer
                sx = wxa[i] * la
                s2 = (w[i] * la) * la
            else:
                sx = sx + wxa[i] * la
                s2 = s2 + (w[i] * la) * la
        if j == 0:
            scale = sx / s2 if s2 != 0.0 else 0.0
            best = scale * sx
            win = ia
        elif s2 > 0.0 and sx * sx > best * s2:
            scale = sx / s2
            best = scale * sx
            win = ia
    for i in kaio.static_range(16):
        la = kaio.min(win * ax[i] + MAGIC, bound[i]) - MAGIC
        neg = (xs[i] > 0.0) == (mx > 0.0)
        lq[i] = u32(i32(kaio.select(neg, -la, la)) + 32)
        if zero:
            lq[i] = 0
    scale = kaio.select(mx > 0.0, -scale, scale)  # the sign of sumlx: that of -max
    return kaio.select(zero, 0.0, scale)


@kaio.gpu_kernel
def _q6_k(x: DT[:], out: u8[:], nsb: u32, VEC: kaio.constexpr, DT: kaio.constexpr):
    """One lane per sub-block: lanes 16s .. 16s + 15 of a warp hold super-block s (0, 1)."""
    lq_all = kaio.shared(u32, (Q6_WARPS * 2 * 64,))  # each super-block's 256 quants, 4 a word
    lane = kaio.lane_id()
    k = lane & 15  # this lane's sub-block
    warp_sb = (kaio.block_idx_x() * Q6_WARPS + kaio.warp_id()) * 2
    sb = warp_sb + (lane >> 4)
    live = sb < nsb
    src = kaio.min(sb, nsb - 1)  # lanes past the end work on a copy of the last super-block
    xs = kaio.local(f32, (16,))
    ax = kaio.local(f32, (16,))
    lq = kaio.local(u32, (16,))
    for j in kaio.static_range(16 // VEC):
        load_f32(xs, j * VEC, x, src * QK_K + k * 16 + j * VEC, VEC, DT)
    scale = make_qx_quants(xs, ax, lq)

    # the super-block's scale of largest magnitude (the first one, as the C loop)
    top = kaio.abs(scale)
    top_k = k
    top_scale = scale
    for m in kaio.static_range(4):
        o = kaio.shfl_xor(top, 8 >> m)
        o_k = kaio.shfl_xor(top_k, 8 >> m)
        o_scale = kaio.shfl_xor(top_scale, 8 >> m)
        take = o > top or (o == top and o_k < top_k)
        top = kaio.select(take, o, top)
        top_k = kaio.select(take, o_k, top_k)
        top_scale = kaio.select(take, o_scale, top_scale)
    zero = top < GROUP_MAX_EPS
    top_scale = kaio.select(zero, 1.0, top_scale)
    iscale = -128.0 / top_scale
    dh = f16(1.0 / iscale)
    sc = kaio.min(127, nearest_int(iscale * scale))
    dsub = f32(dh) * f32(sc)
    if dsub != 0.0:
        for i in kaio.static_range(16):
            lq[i] = u32(kaio.max(-32, kaio.min(31, nearest_int(xs[i] / dsub))) + 32)
    if zero:  # ggml writes a block of zeros
        sc = 0
        dh = f16(0.0)
        for i in kaio.static_range(16):
            lq[i] = 0

    # the quants to shared memory, 4 a word (element 16k + i is byte i % 4 of word 4k + i // 4)
    words = (kaio.warp_id() * 2 + (lane >> 4)) * 64
    for j in kaio.static_range(4):
        lq_all[words + 4 * k + j] = (
            lq[4 * j] | (lq[4 * j + 1] << 8) | (lq[4 * j + 2] << 16) | (lq[4 * j + 3] << 24)
        )
    kaio.sync_warp()
    if live:
        base = sb * Q6_K_BYTES
        # ql: byte 64h + r (r < 64) = quant 128h + r (low nibble) | quant 128h + r + 64 (high)
        for g in kaio.static_range(2):
            jw = k + 16 * g  # ql word jw: bytes 4jw .. 4jw + 3
            h = jw >> 4
            w0 = lq_all[words + 32 * h + (jw & 15)]
            w1 = lq_all[words + 32 * h + (jw & 15) + 16]
            ql = (w0 & 0x0F0F0F0F) | ((w1 & 0x0F0F0F0F) << 4)
            for b in kaio.static_range(4):
                out[base + 4 * jw + b] = (ql >> (8 * b)) & 0xFF
        # qh: byte 32h + l = the high 2 bits of quants 128h + l + 32q, q = 0..3, at bits 2q
        h = k >> 3
        at = words + 32 * h + (k & 7)
        qh = u32(0)
        for q in kaio.static_range(4):
            qh = qh | (((lq_all[at + 8 * q] >> 4) & 0x03030303) << (2 * q))
        for b in kaio.static_range(4):
            out[base + 128 + 4 * k + b] = (qh >> (8 * b)) & 0xFF
        out[base + 192 + k] = u32(sc) & 0xFF
        if k == 0:
            store_f16(out, base + 208, dh)


# ---------------------------------------------------------------------------- dequantizers
@kaio.gpu_kernel
def _dq8_0(blocks: u8[:], out: f32[:], n: u32):
    """out[4t : 4t + 4] from block (4t) // 32."""
    e = (kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()) * DQ_PER_THREAD
    if e < n:
        base = (e // QK8_0) * Q8_0_BYTES
        d = load_f16(blocks, base)
        v = kaio.local(f32, (DQ_PER_THREAD,))
        for j in kaio.static_range(DQ_PER_THREAD):
            v[j] = f32(i8(blocks[base + 2 + e % QK8_0 + j])) * d
        kaio.store_vector(out, e, v)


@kaio.gpu_kernel
def _dq6_k(blocks: u8[:], out: f32[:], n: u32):
    """out[4t : 4t + 4] from super-block (4t) // 256: d * scale * (q - 32), left to right."""
    e = (kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()) * DQ_PER_THREAD
    if e < n:
        base = (e // QK_K) * Q6_K_BYTES
        p = e % QK_K
        h = p >> 7  # half
        q = (p >> 5) & 3  # quarter of the half
        l = p & 31
        ds = load_f16(blocks, base + 208) * f32(i8(blocks[base + 192 + 8 * h + 2 * q + (l >> 4)]))
        v = kaio.local(f32, (DQ_PER_THREAD,))
        for j in kaio.static_range(DQ_PER_THREAD):
            low = (u32(blocks[base + 64 * h + 32 * (q & 1) + l + j]) >> (4 * (q >> 1))) & 0xF
            high = (u32(blocks[base + 128 + 32 * h + l + j]) >> (2 * q)) & 3
            v[j] = ds * f32(i32(low | (high << 4)) - 32)
        kaio.store_vector(out, e, v)


# ---------------------------------------------------------------------------- host side
def _quantize_input(op: str, x, group: int, nbytes: int) -> tuple:
    """``(a, out, shape, groups)``: x checked as f32/f16/bf16 [R, C] with C % group == 0,
    and its new uint8 output ``out`` of ``shape`` [R, C / group * nbytes], ``groups`` groups
    of ``group`` values (``nbytes`` bytes each) in all."""
    inputs = _arrays.Inputs(op)
    a = inputs.array(x, "x", ndim=2, form=f"[R, C] with C % {group} == 0")
    if a.shape[1] % group:
        raise inputs.error("x", f"must have a multiple of {group} columns, got shape {a.shape}")
    rows, cols = a.shape
    shape = (rows, cols // group * nbytes)
    return a, _arrays.output(a, shape, u8), shape, a.size // group


def _blocks_input(op: str, blocks, nbytes: int) -> _arrays.Operand:
    """blocks checked as uint8 [R, n * nbytes]."""
    inputs = _arrays.Inputs(op)
    form = f"[R, n * {nbytes}] (the block bytes)"
    a = inputs.array(blocks, "blocks", ndim=2, dtypes=(u8,), form=form)
    if a.shape[1] % nbytes:
        raise inputs.error(
            "blocks", f"must have a multiple of {nbytes} bytes a row, got shape {a.shape}"
        )
    return a


def _flat(a: _arrays.Operand, out=None, shape: tuple = (), dtype=None):
    """``a``, or its output ``out`` of ``shape`` and ``dtype``, as a 1-D kernel argument."""
    if out is None:
        return a.arg(a.size)
    return _arrays.output_arg(a, out, (shape[0] * shape[1],), dtype)


def _elements_per_lane(dtype) -> int:
    """Values per lane of _q8_0: one 16-byte load's worth."""
    return 16 // dtype.itemsize


@planned("x")
def quantize_q8_0(x):
    """GGUF Q8_0: each group of 32 values of a row becomes fp16 ``d = max|x| / 127`` and 32
    int8 ``round(x / d)`` (halves away from zero), 34 bytes; byte-identical to ggml's
    ``quantize_row_q8_0_ref``.

    x: f32, f16 or bf16 [R, C], C a multiple of 32. Returns uint8 [R, C / 32 * 34] of x's kind.
    """
    a, out, shape, nblocks = _quantize_input("quantize_q8_0", x, QK8_0, Q8_0_BYTES)
    if nblocks:
        e = _elements_per_lane(a.dtype)
        vec = vector_width(a, multiple_of=QK8_0)
        threads = nblocks * (QK8_0 // e)
        grid = (threads + BLOCK - 1) // BLOCK
        _q8_0[grid, BLOCK, _arrays.stream_of(a)](
            _flat(a), _flat(a, out, shape, u8), nblocks, E=e, VEC=vec, DT=a.dtype
        )
    return out


@planned("x")
def quantize_q6_k(x):
    """GGUF Q6_K: each super-block of 256 values of a row becomes 16 int8 sub-block scales
    under one fp16 ``d`` and 256 6-bit quants, 210 bytes; byte-identical to ggml's
    ``quantize_row_q6_K_ref``, whose ``make_qx_quants`` searches 19 candidate scales per
    16-value sub-block for the best weighted (x^2) least-squares fit.

    x: f32, f16 or bf16 [R, C], C a multiple of 256. Returns uint8 [R, C / 256 * 210] of x's
    kind.
    """
    a, out, shape, nsb = _quantize_input("quantize_q6_k", x, QK_K, Q6_K_BYTES)
    if nsb:
        vec = vector_width(a, multiple_of=16)
        per_block = Q6_WARPS * 2
        grid = (nsb + per_block - 1) // per_block
        _q6_k[grid, Q6_WARPS * 32, _arrays.stream_of(a)](
            _flat(a), _flat(a, out, shape, u8), nsb, VEC=vec, DT=a.dtype
        )
    return out


def _dequantize(op: str, kernel, blocks, group: int, nbytes: int):
    a = _blocks_input(op, blocks, nbytes)
    rows, width = a.shape
    shape = (rows, width // nbytes * group)
    out = _arrays.output(a, shape, f32)
    n = a.size // nbytes * group
    if n:
        threads = n // DQ_PER_THREAD
        grid = (threads + BLOCK - 1) // BLOCK
        kernel[grid, BLOCK, _arrays.stream_of(a)](_flat(a), _flat(a, out, shape, f32), n)
    return out


@planned("blocks")
def dequantize_q8_0(blocks):
    """Decode GGUF Q8_0 blocks: ``qs * d`` in f32 (ggml's ``dequantize_row_q8_0``).

    blocks: uint8 [R, n * 34]. Returns f32 [R, n * 32] of blocks' kind.
    """
    return _dequantize("dequantize_q8_0", _dq8_0, blocks, QK8_0, Q8_0_BYTES)


@planned("blocks")
def dequantize_q6_k(blocks):
    """Decode GGUF Q6_K super-blocks: ``d * scale * (q - 32)`` in f32, evaluated left to
    right (ggml's ``dequantize_row_q6_K``).

    blocks: uint8 [R, n * 210]. Returns f32 [R, n * 256] of blocks' kind.
    """
    return _dequantize("dequantize_q6_k", _dq6_k, blocks, QK_K, Q6_K_BYTES)


def shipped():
    """(kernel, constexprs) of every specialization these ops launch."""
    for dtype in _arrays.FLOATS:
        e = _elements_per_lane(dtype)
        for vec in (1, e):
            yield _q8_0, {"E": e, "VEC": vec, "DT": dtype}
        for vec in (1, 16 // dtype.itemsize):
            yield _q6_k, {"VEC": vec, "DT": dtype}
    yield _dq8_0, {}
    yield _dq6_k, {}
