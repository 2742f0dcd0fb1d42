"""A NumPy port of ggml's reference GGUF quantizers (ggml-quants.c: ``quantize_row_q8_0_ref``,
``quantize_row_q6_K_ref`` with ``make_qx_quants``, ``nearest_int``) and their dequantizers,
written from the published algorithm as an independent check of kaio_ops.gguf.

Every step is the C code's float32 operation, in its order, rounded once as C rounds it
(IEEE binary32, no contraction into FMAs): ``nearest_int`` is the 12582912 magic-number trick
on the bits, sums run sequentially over the 16 values of a sub-block, and the fp16 scale is
a round-to-nearest-even conversion. The loops over candidate scales are vectorized over all
the sub-blocks of a tensor at once, so a 4096 x 4096 tensor takes seconds, not hours.

The block layouts (little-endian, packed):

- Q8_0, 34 bytes per 32 values: ``d`` (fp16), then ``qs[32]`` (int8); value = qs * d.
- Q6_K, 210 bytes per 256 values: ``ql[128]`` (low 4 bits), ``qh[64]`` (high 2 bits),
  ``scales[16]`` (int8, one per 16 values), ``d`` (fp16); value = d * scale * (q - 32).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
QK8_0 = 32
QK_K = 256
Q8_0_BYTES = 34
Q6_K_BYTES = 210
GROUP_MAX_EPS = F32(1e-15)
MAGIC = F32(12582912.0)  # 1.5 * 2**23


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: the low mantissa bits of v + 12582912 (int32)."""
    bits = (np.asarray(v, F32) + MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf (halves away from zero), exactly, on float32."""
    t = np.trunc(v)
    frac = np.abs(v - t)  # exact
    return (t + np.where(frac >= F32(0.5), np.sign(v), F32(0))).astype(F32)


def _f32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=F32)


# ---------------------------------------------------------------------------- Q8_0
def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref on each row of x [R, C] (C % 32 == 0): uint8 [R, C/32*34]."""
    x = _f32(x)
    rows, cols = x.shape
    blocks = x.reshape(-1, QK8_0)
    amax = np.abs(blocks).max(axis=1)
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    qs = roundf(blocks * inv[:, None]).astype(np.int8)
    out = np.empty((blocks.shape[0], Q8_0_BYTES), np.uint8)
    out[:, :2] = d.astype(np.float16)[:, None].view(np.uint8)
    out[:, 2:] = qs.view(np.uint8)
    return out.reshape(rows, cols // QK8_0 * Q8_0_BYTES)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """dequantize_row_q8_0 on each row of uint8 [R, n*34]: f32 [R, n*32]."""
    rows = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(-1, Q8_0_BYTES)
    d = b[:, :2].copy().view(np.float16).astype(F32)
    q = b[:, 2:].view(np.int8).astype(F32)
    return (q * d).reshape(rows, -1)


# ---------------------------------------------------------------------------- Q6_K
def _sums(xt: np.ndarray, wt: np.ndarray, wxt: np.ndarray, lt: np.ndarray):
    """(sumlx, suml2) of make_qx_quants with rmse_type 1 (w = x*x), summed in order over the
    n values; arrays are [n, N] (one column per group, so each row is contiguous)."""
    lf = lt.astype(F32)
    sumlx = np.zeros(xt.shape[1], F32)
    suml2 = np.zeros(xt.shape[1], F32)
    for i in range(xt.shape[0]):
        sumlx = sumlx + wxt[i] * lf[i]
        suml2 = suml2 + (wt[i] * lf[i]) * lf[i]
    return sumlx, suml2


def make_qx_quants(x: np.ndarray, nmax: int = 32):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL) on each row of x [N, n]:
    (scale f32 [N], L int32 [N, n] in 0 .. 2*nmax-1)."""
    ax = np.abs(x)
    first = np.argmax(ax, axis=1)  # the first index of the largest |x|, as the C loop
    rows = np.arange(x.shape[0])
    amax, mx = ax[rows, first], x[rows, first]
    zero = amax < GROUP_MAX_EPS
    mx = np.where(zero, F32(1), mx)  # no division by zero below (those rows give 0, L = 0)
    xt = np.ascontiguousarray(x.T)
    wt = xt * xt
    wxt = wt * xt

    def quants(iscale):
        return np.clip(nearest_int(iscale[None, :] * xt), -nmax, nmax - 1)

    lt = quants(F32(-nmax) / mx)
    sumlx, suml2 = _sums(xt, wt, wxt, lt)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
        cand = quants(iscale)
        sumlx, suml2 = _sums(xt, wt, wxt, cand)
        take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        lt = np.where(take[None, :], cand, lt)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(take, sumlx / suml2, scale).astype(F32)
        best = np.where(take, scale * sumlx, best).astype(F32)
    scale = np.where(zero, F32(0), scale)
    lv = np.where(zero[:, None], 0, lt.T + nmax)
    return scale, lv.astype(np.int32)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref on each row of x [R, C] (C % 256 == 0): uint8 [R, C/256*210]."""
    x = _f32(x)
    rows, cols = x.shape
    nb = x.size // QK_K
    sub = x.reshape(nb * 16, 16)
    scales, lv = make_qx_quants(sub)
    scales, lv = scales.reshape(nb, 16), lv.reshape(nb, 16, 16)

    first = np.argmax(np.abs(scales), axis=1)
    max_scale = scales[np.arange(nb), first]
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    max_scale = np.where(zero, F32(1), max_scale)
    iscale = F32(-128) / max_scale
    d16 = (F32(1) / iscale).astype(np.float16)
    sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
    dsub = d16.astype(F32)[:, None] * sc.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(nearest_int(sub.reshape(nb, 16, 16) / dsub[:, :, None]), -32, 31) + 32
    lv = np.where((dsub != 0)[:, :, None], requant, lv).reshape(nb, QK_K)

    out = np.zeros((nb, Q6_K_BYTES), np.uint8)
    for half in range(2):
        lh = lv[:, 128 * half : 128 * (half + 1)]
        q = [lh[:, 32 * k : 32 * (k + 1)] for k in range(4)]
        out[:, 64 * half : 64 * half + 32] = (q[0] & 0xF) | ((q[2] & 0xF) << 4)
        out[:, 64 * half + 32 : 64 * half + 64] = (q[1] & 0xF) | ((q[3] & 0xF) << 4)
        out[:, 128 + 32 * half : 128 + 32 * (half + 1)] = (
            (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6)
        )
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d16[:, None].view(np.uint8)
    out[zero] = 0
    return out.reshape(rows, cols // QK_K * Q6_K_BYTES)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """dequantize_row_q6_K on each row of uint8 [R, n*210]: f32 [R, n*256], each value
    ``d * scale * q`` evaluated left to right in f32."""
    rows = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(-1, Q6_K_BYTES)
    nb = b.shape[0]
    ql, qh = b[:, :128].astype(np.int32), b[:, 128:192].astype(np.int32)
    sc = b[:, 192:208].view(np.int8).astype(F32)
    d = b[:, 208:210].copy().view(np.float16).astype(F32)
    y = np.empty((nb, QK_K), F32)
    for half in range(2):
        for k in range(4):  # the four 32-value quarters of each 128-value half
            low = ql[:, 64 * half + 32 * (k & 1) : 64 * half + 32 * (k & 1) + 32]
            low = (low >> (4 * (k >> 1))) & 0xF
            high = (qh[:, 32 * half : 32 * half + 32] >> (2 * k)) & 3
            q = ((low | (high << 4)) - 32).astype(F32)
            for part in range(2):  # 16 values per scale
                s = sc[:, 8 * half + 2 * k + part]
                at = 128 * half + 32 * k + 16 * part
                y[:, at : at + 16] = (d[:, 0] * s)[:, None] * q[:, 16 * part : 16 * part + 16]
    return y.reshape(rows, -1)
