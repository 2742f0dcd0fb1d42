"""The 8-bit floats ``kaio.e4m3`` and ``kaio.e5m2`` (sm_89+): their conversions and their
``mma.sync`` forms, registered in ``kaio.lang.BUILTINS`` like every builtin.

An fp8 value is storage: arrays hold it, ``kaio.f32(x)`` / ``kaio.f16(x)`` / ``kaio.bf16(x)``
read it (exactly), ``kaio.e4m3(v)`` / ``kaio.e5m2(v)`` write it (round to nearest even,
saturating to the largest finite value, NaN to the canonical NaN ``0x7F``: PTX's
``cvt.rn.satfinite``). There is no arithmetic on fp8 and no promotion: convert to f32 first.
The IR's ``cvt`` touches fp8 only between an fp8 type and f16, bf16 or f32; the frontend
routes every other conversion through f32 (exact from fp8; to fp8, the one rounding of the
f32 to fp8 step decides the result, since integers beyond f32's 24 bits saturate anyway).
f64 to fp8 would round twice and is refused. PTX lowering: ``kaio.ptx.fp8``; simulator:
``kaio.sim.fp8``; docs/dsl-reference.md, "8-bit floats".
"""

from __future__ import annotations

from kaio import types as T
from kaio.lang import _define, _mma
from kaio.lang_hopper import _wgmma

# The types an IR cvt connects directly with an fp8 type.
DIRECT = ("f16", "bf16", "f32")


def mix_message(a: T.ScalarType, b: T.ScalarType) -> str | None:
    """The error message for an operator between ``a`` and ``b`` when one is fp8."""
    if not (a.is_fp8 or b.is_fp8):
        return None
    p = a if a.is_fp8 else b
    return (
        f"no arithmetic on {p} (an 8-bit storage type): convert it first, "
        f"kaio.f32(x), compute in f32, and convert back with kaio.{p.name}(y)"
    )


def require_arith(ctx, v, node) -> None:
    """CompileError when the IR value ``v`` is fp8 (operators need a number type)."""
    message = mix_message(v.type, v.type)
    if message:
        ctx.error(message, node)


def convert(ctx, v, t: T.ScalarType):
    """``v`` converted to ``t`` where either is an fp8 type (see the module docstring)."""
    b = ctx.b
    src = v.type
    if src == t:
        return v
    if src.is_fp8:
        if t.is_fp8:  # e4m3 <-> e5m2: exact to f16, then one rounding
            return b.convert(b.convert(v, T.f16), t)
        if t.name in DIRECT:
            return b.convert(v, t)
        if t.is_bool:
            ctx.error(f"cannot convert {src} to bool_: compare kaio.f32(x) != 0.0")
        return b.convert(b.convert(v, T.f32), t)  # exact, then f32's own conversion
    if src.is_packed:
        ctx.error(f"cannot convert {src} to {t}: take a half with kaio.low()/kaio.high() first")
    if src.name in DIRECT:
        return b.convert(v, t)
    if src.is_int or src.is_bool:
        return b.convert(b.convert(v, T.f32), t)
    ctx.error(
        f"cannot convert {src} to {t} directly (it would round twice): convert to f32 first, "
        f"kaio.{t.name}(kaio.f32(x)), or to f16/bf16"
    )


for _kind, _what in (
    ("e4m3", "e4m3 inputs (4 per u32, low byte first), f32 accumulators, m16n8k32"),
    ("e5m2", "e5m2 inputs (4 per u32, low byte first), f32 accumulators, m16n8k32"),
):
    _define(
        f"mma_{_kind}",
        f"mma_{_kind}(d, a, b, c): warp-wide tensor-core d = a @ b + c (mma.sync.aligned, "
        f"{_what}); fragments as mma_s8's (docs/tensor-cores.md). sm_89+, PTX 8.4.",
        _mma(_kind),
    )


for _kind in ("e4m3", "e5m2"):
    _define(
        f"wgmma_{_kind}",
        f"wgmma_{_kind}(acc, a_desc, b_desc, accumulate): warpgroup-wide (128 threads) acc = "
        f"A @ B (+ acc when accumulate) with {_kind} A (64x32) and B (32xN), both K-major in "
        "shared memory (32 bytes of K, as wgmma_f16's 16 elements: the same descriptors), "
        "f32 accumulators (N = 2*len(acc)); wgmma.mma_async.m64nNk32; no transpose arguments "
        "(PTX has none for 8-bit operands: store B as [N, K]). sm_90a.",
        _wgmma(_kind),
    )
