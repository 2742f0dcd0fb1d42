"""The GPU's approximate f32 math in the simulator: the SASS that ptxas emits for each PTX
instruction (sm_90), around the special function unit's ``MUFU`` operations.

=====================  =======================================================================
PTX                    SASS (ptxas 13.0 and the driver's JIT, sm_90)
=====================  =======================================================================
ex2.approx.ftz.f32     MUFU.EX2
ex2.approx.f32         x < -126: MUFU.EX2(x * 0.5) squared (FMUL, subnormal results kept)
lg2.approx.ftz.f32     MUFU.LG2
lg2.approx.f32         |x| < 2^-126: MUFU.LG2(x * 2^24) - 24 (FADD)
rsqrt.approx.ftz.f32   MUFU.RSQ
rsqrt.approx.f32       |x| < 2^-126: MUFU.RSQ(x * 2^24) * 2^12
rcp.approx.ftz.f32     MUFU.RCP
rcp.approx.f32         s = 2^24 if |x| < 2^-126, 0.25 if |x| > 2^126, else 1: s * MUFU.RCP(x * s)
sin/cos.approx(.ftz)   MUFU.SIN/COS(FMUL.RZ(x, 0.15915494)): the argument in turns, rounded to zero
div.full.ftz.f32       |b| > 2^126: a, b scaled by 0.25 (FMUL.FTZ); FMUL.FTZ(MUFU.RCP(b), a)
tanh.approx.f32        MUFU.TANH: not modelled (kaio.sim.arith rounds float64 tanh instead)
=====================  =======================================================================

``MUFU`` reads a subnormal input as zero of its sign and flushes a subnormal result to zero.
"""

from __future__ import annotations

import lzma
import math
import os
import threading
import zlib

import numpy as np

F32 = np.float32
F64 = np.float64
TINY = F32(2.0**-126)
BIG = F32(2.0**126)
TWO_PI_INV = F32(0.15915493667125701904)  # 1/(2 pi) rounded to f32, as ptxas emits it


def _f32(x) -> np.ndarray:
    return np.asarray(x, F32)


def ftz(x: np.ndarray) -> np.ndarray:
    """Subnormal f32 values replaced by zero of the same sign."""
    x = _f32(x)
    return np.where(np.abs(x) < TINY, np.copysign(F32(0), x), x).astype(F32)


def fmul_ftz(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``FMUL.FTZ``: subnormal operands read as zero, the product rounded to nearest even, a
    subnormal product flushed."""
    with np.errstate(all="ignore"):
        return ftz(ftz(a) * ftz(b))


def fmul_rz(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``FMUL.RZ`` of f32 values: the exact product (float64 holds it) rounded toward zero."""
    with np.errstate(all="ignore"):
        return round_to_zero(_f32(a).astype(np.float64) * _f32(b).astype(np.float64))


def round_to_zero(v: np.ndarray) -> np.ndarray:
    """float64 values rounded toward zero to f32."""
    with np.errstate(all="ignore"):
        near = v.astype(F32)
        away = np.abs(near.astype(np.float64)) > np.abs(v)
        return np.where(away, np.nextafter(near, F32(0)), near).astype(F32)


def fadd(a: np.ndarray, b) -> np.ndarray:
    """``FADD``: f32 sum rounded to nearest even (subnormals kept)."""
    with np.errstate(all="ignore"):
        return (_f32(a) + F32(b)).astype(F32)


def fmul(a: np.ndarray, b) -> np.ndarray:
    """``FMUL``: f32 product rounded to nearest even (subnormals kept)."""
    with np.errstate(all="ignore"):
        return (_f32(a) * _f32(b)).astype(F32)


def _below(x: np.ndarray, limit) -> np.ndarray:
    """``!FSETP.GEU(|x|, limit)``: |x| < limit, false for NaN."""
    return np.abs(x) < limit


def _scaled_input(op: str, small, scale_in: float, fix):
    """A non-``.ftz`` form: where ``small(x)``, ``MUFU.op(x * scale_in)`` corrected by
    ``fix(y)``; elsewhere ``MUFU.op(x)``; the ``.ftz`` form is ``MUFU.op`` alone."""

    def run(x, ftz_: bool = True) -> np.ndarray:
        x = _f32(x)
        if ftz_:
            return MUFU[op](x)
        where = small(x)
        y = MUFU[op](np.where(where, fmul(x, scale_in), x))
        return np.where(where, fix(y), y).astype(F32)

    run.__doc__ = f"``{op}.approx(.ftz).f32`` (``ftz_=False``: the form without ``.ftz``)."
    return run


ex2 = _scaled_input("ex2", lambda x: x < F32(-126), 0.5, lambda y: fmul(y, y))
lg2 = _scaled_input("lg2", lambda x: _below(x, TINY), 2.0**24, lambda y: fadd(y, -24.0))
rsqrt = _scaled_input("rsqrt", lambda x: _below(x, TINY), 2.0**24, lambda y: fmul(y, 4096.0))


def rcp(x, ftz_: bool = True) -> np.ndarray:
    """``rcp.approx(.ftz).f32``."""
    x = _f32(x)
    if ftz_:
        return MUFU["rcp"](x)
    scale = np.where(_below(x, TINY), F32(2.0**24), F32(1))
    scale = np.where(np.abs(x) > BIG, F32(0.25), scale).astype(F32)
    return fmul(scale, MUFU["rcp"](fmul(x, scale)))


def sin(x) -> np.ndarray:
    """``sin.approx(.ftz).f32`` (the same SASS with or without ``.ftz``)."""
    return MUFU["sin"](fmul_rz(x, TWO_PI_INV))


def cos(x) -> np.ndarray:
    """``cos.approx(.ftz).f32`` (the same SASS with or without ``.ftz``)."""
    return MUFU["cos"](fmul_rz(x, TWO_PI_INV))


def div_full_ftz(a, b) -> np.ndarray:
    """``div.full.ftz.f32``: ``a * rcp(b)``, both scaled by 1/4 first when |b| > 2^126."""
    a, b = ftz(a), ftz(b)
    big = np.abs(b) > BIG
    a = np.where(big, fmul_ftz(a, 0.25), a)
    b = np.where(big, fmul_ftz(b, 0.25), b)
    return fmul_ftz(MUFU["rcp"](b), a)


MUFU = {}  # the MUFU operations by name (below, after their tables)


# ---------------------------------------------------------------------------------------------
# The MUFU tables: measured on an H100 (sm_90) over each operation's whole reduced domain by
# tools/mufu_probe.py, stored by tools/mufu_tables.py as the difference, in units in the last
# place, from a reference that NumPy computes the same way on every IEEE machine (only +, *, /
# and sqrt of float64), lzma-compressed (kaio/sim/data/mufu_*.npz).

DATA = os.path.join(os.path.dirname(__file__), "data")
N23 = 1 << 23
ESCAPE = -128  # a code for a difference that does not fit in int8: taken from ``wide``


def ordered(bits: np.ndarray) -> np.ndarray:
    """f32 bit patterns as int64 keys ordered like the values (-0 and +0 both 0)."""
    b = np.asarray(bits).astype(np.int64)
    mag = b & 0x7FFFFFFF
    return np.where(b >> 31 != 0, -mag, mag)


def unordered(keys: np.ndarray) -> np.ndarray:
    """The inverse of ``ordered`` (a zero key gives +0)."""
    k = np.asarray(keys, np.int64)
    return np.where(k < 0, (-k) | 0x80000000, k).astype(np.uint32)


def _horner(coefs, t: np.ndarray) -> np.ndarray:
    acc = np.full_like(t, coefs[0])
    for c in coefs[1:]:
        acc = acc * t + c
    return acc


def _exp_series(y: np.ndarray) -> np.ndarray:
    """e^y for |y| < 0.7 to about 1e-17: Taylor to degree 20."""
    return _horner([1.0 / math.factorial(n) for n in range(20, -1, -1)], y)


def _sin_series(t: np.ndarray) -> np.ndarray:
    """sin(t) for |t| <= pi/2: Taylor to degree 25 (Horner in t^2)."""
    return t * _horner([(-1.0) ** n / math.factorial(2 * n + 1) for n in range(12, -1, -1)], t * t)


def _cos_series(t: np.ndarray) -> np.ndarray:
    """cos(t) for |t| <= pi/2: Taylor to degree 24."""
    return _horner([(-1.0) ** n / math.factorial(2 * n) for n in range(12, -1, -1)], t * t)


def _log2_series(m: np.ndarray) -> np.ndarray:
    """log2(m) for m in [1, 2]: 2 atanh((m-1)/(m+1)) / ln 2, to degree 37."""
    s = (m - 1.0) / (m + 1.0)
    return 2.0 * s * _horner([1.0 / (2 * n + 1) for n in range(18, -1, -1)], s * s) / math.log(2)


_HI = np.arange(1 << 11, dtype=F64) * 2.0**-11  # a step i = hi 2^12 + lo: hi 2^-11 ...
_LO = np.arange(1 << 12, dtype=F64) * 2.0**-23  # ... plus lo 2^-23
_LN2 = math.log(2)


def _outer(fn, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fn(a[hi], b[lo]) for every step hi 2^12 + lo, in step order."""
    return fn(a[:, None], b[None, :]).reshape(-1)


def reference(name: str) -> np.ndarray:
    """The float64 values that table ``name`` is stored relative to, before rounding to f32:
    from IEEE-exact NumPy arithmetic only (+ - * / sqrt, in a fixed order), so the same on
    every machine; from series on 2^11 + 2^12 points combined by addition theorems, which
    is fast."""
    if name in ("rcp", "rsqrt"):
        m = np.arange(N23, dtype=F64) * 2.0**-23 + 1.0
        if name == "rcp":  # 1/m, m in [1, 2)
            return 1.0 / m
        return 1.0 / np.sqrt(np.concatenate([m, 2.0 * m]))  # x in [1, 4): parity, mantissa
    if name.startswith("ex2"):  # 2^f or 2^-f, f in [0, 1): 2^(hi + lo) = 2^hi 2^lo
        sign = 1.0 if name == "ex2_pos" else -1.0
        return _outer(np.multiply, _exp_series(sign * _LN2 * _HI), _exp_series(sign * _LN2 * _LO))
    if name.startswith("lg2"):  # log2(m) = log2(m_hi) + log2(1 + lo/m_hi), m = m_hi + lo
        m_hi = 1.0 + _HI
        s = _outer(lambda a, b: b / (2.0 * a + b), m_hi, _LO)  # atanh(s) = ln(1 + lo/m_hi)/2
        tail = 2.0 * s * _horner([1.0 / 7, 1.0 / 5, 1.0 / 3, 1.0], s * s) / _LN2
        lg = (_log2_series(m_hi)[:, None] + tail.reshape(len(_HI), len(_LO))).reshape(-1)
        return lg if name == "lg2_pos" else 1.0 - lg  # L(m) for x = m; 1 - L(m) for x = m/2
    if name == "sincos":  # sin, then cos, of the first quadrant in steps of 2^-25 turns
        a, b = _HI * (math.pi / 2), _LO * (math.pi / 2)
        sa, ca, sb, cb = _sin_series(a), _cos_series(a), _sin_series(b), _cos_series(b)
        sin = _outer(np.multiply, sa, cb) + _outer(np.multiply, ca, sb)
        cos = _outer(np.multiply, ca, cb) - _outer(np.multiply, sa, sb)
        return np.concatenate([sin, cos])
    raise KeyError(name)


def round_ref(name: str, ref: np.ndarray) -> np.ndarray:
    """The reference rounded to f32 bits as the hardware rounds it (to zero for lg2)."""
    return (round_to_zero(ref) if name.startswith("lg2") else ref.astype(F32)).view(np.uint32)


def _pack(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(lzma.compress(a.tobytes(), preset=9 | lzma.PRESET_EXTREME), np.uint8)


def _unpack(blob: np.ndarray, dtype) -> np.ndarray:
    return np.frombuffer(lzma.decompress(blob.tobytes()), dtype)


def encode(name: str, hw: np.ndarray) -> dict:
    """Table ``name`` (f32 bits) as arrays for ``np.savez``: int8 differences from the rounded
    reference, lzma-compressed, the wider ones apart, and the table's CRC-32."""
    diff = ordered(hw) - ordered(round_ref(name, reference(name)))
    wide = np.abs(diff) > 127
    codes = np.where(wide, ESCAPE, diff).astype(np.int8)
    return {
        "codes": _pack(codes),
        "wide": _pack(np.diff(diff[wide], prepend=0)),
        "crc": np.array(zlib.crc32(np.ascontiguousarray(hw, np.uint32).tobytes()), np.int64),
    }


def decode(name: str, arrays) -> np.ndarray:
    """The table's f32 bits from ``encode``'s arrays; its CRC-32 checked."""
    codes = _unpack(arrays["codes"], np.int8).astype(np.int32)
    codes[codes == ESCAPE] = np.cumsum(_unpack(arrays["wide"], np.int64))
    ref = round_ref(name, reference(name)).view(np.int32)
    if ref.min() >= 0:  # every table so far: non-negative values, whose keys are their bits
        ref += codes
        bits = ref.view(np.uint32)
    else:
        keys = np.where(ref < 0, -(ref & 0x7FFFFFFF), ref) + codes  # ``ordered`` in int32
        bits = np.where(keys < 0, -keys | np.int32(-(2**31)), keys).view(np.uint32)
    if zlib.crc32(bits.tobytes()) != int(arrays["crc"]):
        raise RuntimeError(
            f"kaio.sim.mufu: table {name} did not rebuild bit for bit from "
            f"{DATA}/mufu_{name}.npz (CRC mismatch): the file is damaged or this machine's "
            f"float64 arithmetic is not IEEE; reinstall kaio or report it"
        )
    return bits


_tables: dict[str, np.ndarray] = {}
_lock = threading.Lock()


def table(name: str) -> np.ndarray:
    """Table ``name`` as f32 bits (uint32), built on first use (a fraction of a second)."""
    t = _tables.get(name)
    if t is None:
        with _lock:
            t = _tables.get(name)
            if t is None:
                with np.load(os.path.join(DATA, f"mufu_{name}.npz")) as f:
                    t = _tables[name] = decode(name, f)
    return t


def _fields(x: np.ndarray):
    b = _f32(x).view(np.uint32).astype(np.int64)
    return b & 0x80000000, (b >> 23) & 0xFF, b & 0x7FFFFF


def _scaled(t: np.ndarray, shift: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Table bits ``t`` times 2^shift with sign bit ``sign``: zero below 2^-126, infinity
    above the f32 range."""
    e = ((t >> 23) & 0xFF) + shift
    out = sign | (np.clip(e, 0, 255) << 23) | (t & 0x7FFFFF)
    out = np.where(e <= 0, sign, out)
    return np.where(e >= 255, sign | 0x7F800000, out)


def _finish(out: np.ndarray, x: np.ndarray, specials) -> np.ndarray:
    """``out`` (int64 bits) with ``specials``: (condition, bits) pairs, first match wins."""
    for cond, bits in reversed(specials):
        out = np.where(cond, bits, out)
    return np.asarray(out, np.int64).astype(np.uint32).view(F32).reshape(np.shape(x))


NAN = 0x7FFFFFFF  # the canonical NaN


def mufu_rcp(x) -> np.ndarray:
    """``MUFU.RCP``: 1/x from the table of 1/m over the 2^23 mantissas m in [1, 2)."""
    x = _f32(x)
    s, e, m = _fields(x)
    out = _scaled(table("rcp")[m], 127 - e, s)
    inf = e == 255
    return _finish(out, x, [(e == 0, s | 0x7F800000), (inf & (m == 0), s), (inf, NAN)])


def mufu_rsqrt(x) -> np.ndarray:
    """``MUFU.RSQ``: 1/sqrt(x) from the table over x in [1, 4) (exponent parity, mantissa)."""
    x = _f32(x)
    s, e, m = _fields(x)
    odd = (e - 127) & 1
    out = _scaled(table("rsqrt")[(odd << 23) | m], -((e - 127 - odd) // 2), 0)
    inf = e == 255
    return _finish(
        out, x, [(e == 0, s | 0x7F800000), (inf & (m == 0) & (s == 0), 0), (inf | (s != 0), NAN)]
    )


def mufu_ex2(x) -> np.ndarray:
    """``MUFU.EX2``: |x| truncated to 23 fraction bits, n + f; 2^n times 2^f (x >= 0) or
    2^-n times 2^-f (x < 0), each from its table over the 2^23 fractions."""
    x = _f32(x)
    s, e, m = _fields(x)
    mag = np.abs(x).astype(F64)
    q = np.trunc(np.minimum(np.where(np.isnan(mag), 0, mag), 2.0**9) * 2.0**23).astype(np.int64)
    n, f = q >> 23, q & (N23 - 1)
    neg = s != 0
    t = np.where(neg, table("ex2_neg")[f], table("ex2_pos")[f])
    out = _scaled(t, np.where(neg, -n, n), 0)
    return _finish(out, x, [((e == 255) & (m != 0), NAN)])


def mufu_lg2(x) -> np.ndarray:
    """``MUFU.LG2``: log2(2^e m) = e + L(m), L in fixed point (2^-36), rounded to zero; from
    the tables of L(m) (e >= 0) and 1 - L(m) (e < 0), each already rounded to zero, whose
    sum with the integer part rounds to zero the same way."""
    x = _f32(x)
    s, e, m = _fields(x)
    e = e - 127
    with np.errstate(all="ignore"):
        pos = e.astype(F64) + table("lg2_pos")[m].view(F32)
        neg = -((-e - 1).astype(F64) + table("lg2_neg")[m].view(F32))
        v = np.where(e >= 0, pos, neg)
    out = round_to_zero(v).view(np.uint32).astype(np.int64)
    inf = e == 128
    return _finish(
        out,
        x,
        [
            (e == -127, 0xFF800000),
            (inf & (m == 0) & (s == 0), 0x7F800000),
            (inf | (s != 0), NAN),
        ],
    )


def _sincos(r, quarter: int) -> np.ndarray:
    """``MUFU.SIN`` (quarter 0) and ``MUFU.COS`` (quarter 1) of r turns: |r| truncated to 25
    fraction bits (the integer part dropped), a quadrant and 23 bits u; sin(2 pi u 2^-25) or
    cos(2 pi u 2^-25) from the table, negated in the lower half turn, and for sin the sign
    of r; both tables measured."""
    r = _f32(r)
    s, e, m = _fields(r)
    mag = np.where(e == 0, 0.0, np.abs(r).astype(F64))
    with np.errstate(invalid="ignore"):
        q = np.trunc(np.fmod(np.where(e == 255, 0.0, mag), 1.0) * 2.0**25).astype(np.int64)
    quad, u = ((q >> 23) + quarter) & 3, q & (N23 - 1)
    t = table("sincos")[np.where(quad & 1, N23 + u, u)]
    negate = (quad >= 2) ^ ((s != 0) & (quarter == 0))
    out = np.where(negate, t ^ 0x80000000, t)
    return _finish(out, r, [(e == 255, NAN)])


def mufu_sin(r) -> np.ndarray:
    """``MUFU.SIN``: sin(2 pi r)."""
    return _sincos(r, 0)


def mufu_cos(r) -> np.ndarray:
    """``MUFU.COS``: cos(2 pi r)."""
    return _sincos(r, 1)


MUFU.update(rcp=mufu_rcp, rsqrt=mufu_rsqrt, ex2=mufu_ex2, lg2=mufu_lg2)
MUFU.update(sin=mufu_sin, cos=mufu_cos)
