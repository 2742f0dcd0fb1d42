"""FP8 (e4m3, e5m2) quantization and scaled matmul: ``quantize_fp8`` and ``matmul_fp8``.

``matmul_fp8`` has ``torch._scaled_mm``'s contract; the kernels, their numerics and the
layout rules are in ``kaio_ops._fp8``'s docstring and docs/ops.md.
"""

from __future__ import annotations

import math

import numpy as np

from kaio import bf16, e4m3, e5m2, f16, f32, u32
from kaio.types import ScalarType
from kaio_ops import _arrays, _fp8_decode
from kaio_ops import _fp8 as K
from kaio_ops import _fp8_hopper as H
from kaio_ops._plan import planned

__all__ = ["quantize_fp8", "matmul_fp8"]

_FORMATS = {"e4m3": e4m3, "e5m2": e5m2}
_OUT_TYPES = {"bf16": bf16, "f16": f16, "f32": f32}
_TORCH_NAMES = {  # str(torch dtype) -> kaio type name
    "torch.float8_e4m3fn": "e4m3",
    "torch.float8_e5m2": "e5m2",
    "torch.bfloat16": "bf16",
    "torch.float16": "f16",
    "torch.float32": "f32",
}


def _type_name(value, allowed: dict, op: str, what: str) -> str:
    """The kaio type name of ``value`` (a name, a kaio type or a torch dtype) in ``allowed``."""
    name = value.name if isinstance(value, ScalarType) else _TORCH_NAMES.get(str(value), value)
    if name not in allowed:
        names = ", ".join(repr(n) for n in allowed)
        raise ValueError(f"{op}: {what} must be one of {names} (or the torch dtype), got {value!r}")
    return name


def quantize_fp8(x, *, dtype: str = "e4m3", per: str = "tensor"):
    """``(q, scale)``: ``x`` scaled into the fp8 range and converted, as torch's recipe::

        scale = x.abs().amax().float().clamp(min=1e-12) / fp8_max   # per tensor or row
        q = (x.float() / scale).to(fp8)

    x: f32, f16 or bf16 [..., K]; dtype: ``"e4m3"`` (fp8_max 448) or ``"e5m2"`` (57344), or
    the kaio/torch type; per: ``"tensor"`` (``scale`` f32 [1]) or ``"row"`` (``scale`` f32
    [..., 1], one per row of the last axis: ``scale_a`` of ``torch._scaled_mm`` for a 2-D
    x). ``q`` has x's shape. Bit-identical to those torch lines for finite inputs.
    """
    op = "quantize_fp8"
    name = _type_name(dtype, _FORMATS, op, "dtype")
    if per not in ("tensor", "row"):
        raise ValueError(f"{op}: per must be 'tensor' or 'row', got {per!r}")
    inputs = _arrays.Inputs(op)
    a = inputs.array(x, "x", ndim=tuple(range(1, 9)), form="[..., K]")
    if a.size == 0:
        raise inputs.error("x", f"has no elements (shape {a.shape}): there is no amax to scale by")
    fmt = _FORMATS[name]
    q = _arrays.output(a, a.shape, fmt)
    stream = _arrays.stream_of(a)
    limit = K.FP8_MAX[name]
    if per == "row":
        k = a.shape[-1]
        rows = a.size // k
        scale = _arrays.output(a, (*a.shape[:-1], 1), f32)
        K._quantize_rows[rows, K.ROW_THREADS, stream](
            a.arg(rows, k),
            _arrays.output_arg(a, q, (rows, k), fmt),
            _arrays.output_arg(a, scale, (rows,), f32),
            LIMIT=limit,
            DT=a.dtype,
            FP8=fmt,
        )
        return q, scale
    n = a.size
    blocks = min(K.PARTIAL_BLOCKS, -(-n // K.FLAT_THREADS))
    partial = _arrays.output(a, (blocks,), u32)
    scale = _arrays.output(a, (1,), f32)
    K._amax_partial[blocks, K.FLAT_THREADS, stream](a.arg(n), partial, n, DT=a.dtype)
    K._tensor_scale[1, K.FLAT_THREADS, stream](partial, scale, LIMIT=limit)
    K._quantize_flat[blocks, K.FLAT_THREADS, stream](
        a.arg(n), _arrays.output_arg(a, q, (n,), fmt), scale, n, DT=a.dtype, FP8=fmt
    )
    return q, scale


def _k_major(b):
    """``(obj, column_major)``: a column-major [K, N] ``b`` as its row-major transpose [N, K]
    (no copy), anything else as it is."""
    if hasattr(b, "is_contiguous") and hasattr(b, "t") and b.dim() == 2:  # torch
        if not b.is_contiguous() and b.t().is_contiguous():
            return b.t(), True
    elif hasattr(b, "flags") and getattr(b, "ndim", 0) == 2:  # NumPy, CuPy
        if not b.flags.c_contiguous and b.T.flags.c_contiguous:
            return b.T, True
    return b, False


def _scale_vector(inputs, s, name: str, n: int, shapes: str) -> tuple:
    """``(operand, per_element)`` of an f32 scale with 1 or ``n`` elements."""
    v = inputs.array(s, name, ndim=(0, 1, 2), dtypes=(f32,), form=shapes)
    if v.size == 1:
        return v.arg(1), False
    if v.size == n and max(v.shape) == n:
        return v.arg(n), True
    raise inputs.error(name, f"must have 1 element (per tensor) or {shapes}, got {v.shape}")


HOPPER_IN_SIMULATOR = False  # tests set it to run the sm_90 kernel on the simulator


def _uses_wgmma(a: _arrays.Operand) -> bool:
    """Whether ``a``'s GPU is an sm_90 (Hopper: the wgmma kernel), or, in the simulator,
    whether ``HOPPER_IN_SIMULATOR`` asks for that kernel."""
    dev = _arrays.gpu(a)
    if dev is None:
        return HOPPER_IN_SIMULATOR
    return dev.compute_capability == (9, 0)


def _units(obj, kind: str):
    """A contiguous fp8 array seen as 16-bit units (pairs of values): the TMA maps' view."""
    if kind == "torch":
        import torch

        return obj.view(torch.float16)
    return obj.view(np.float16)


def _require_fp8_gpu(a: _arrays.Operand) -> None:
    dev = _arrays.gpu(a)
    if dev is not None and dev.compute_capability < (8, 9):
        raise ValueError(
            f"matmul_fp8: fp8 tensor cores need sm_89 or newer (Ada, Hopper, Blackwell); GPU "
            f"{a.device} is {dev.arch}: dequantize to f16/bf16 and use kaio_ops.matmul_tc "
            "there"
        )


_CONFIG = H.config  # the tile choice; tests and bench/fp8_plans.py replace it to force one


# plans serve the shipped tile choice (a plan keeps the kernel it was recorded with)
@planned("a", "b", "scale_a", "scale_b", "bias", when=lambda: H.config is _CONFIG)
def matmul_fp8(a, b, scale_a, scale_b, *, out_dtype=None, bias=None):
    """``(a @ b) * scale_a * scale_b (+ bias)``, ``torch._scaled_mm``'s contract: f32
    accumulation, one rounding to ``out_dtype``.

    a: e4m3 or e5m2 [M, K] row-major; b: the same type [K, N], column-major (``w.t()`` of a
    row-major [N, K] weight, as torch requires) or row-major (transposed first: a copy of
    b); K and N multiples of 16. scale_a: f32, 1 element or one per row of a ([M, 1]);
    scale_b: f32, 1 element or one per column of b ([1, N]). out_dtype: bf16 (default), f16
    or f32 (a torch dtype or a name); bias: [N] of out_dtype. Returns [M, N] of a's kind.
    sm_90: ``wgmma`` (``kaio_ops._fp8_hopper``); sm_89 and later others: ``mma.sync``.
    """
    op = "matmul_fp8"
    out_name = _type_name(bf16 if out_dtype is None else out_dtype, _OUT_TYPES, op, "out_dtype")
    dt = _OUT_TYPES[out_name]
    inputs = _arrays.Inputs(op)
    a = inputs.array(a, "a", ndim=2, dtypes=(e4m3, e5m2), form="[M, K]")
    m, k = a.shape
    b_obj, col_major = _k_major(b)
    bo = inputs.array(b_obj, "b", ndim=2, dtypes=(a.dtype,), form="[K, N]")
    n = bo.shape[0] if col_major else bo.shape[1]
    if (bo.shape[1] if col_major else bo.shape[0]) != k:
        shape = (bo.shape[1], bo.shape[0]) if col_major else bo.shape
        raise inputs.error("b", f"must have K = {k} rows (a is {a.shape}), got shape {shape}")
    if 0 in (m, k, n):
        raise inputs.error("a" if 0 in (m, k) else "b", "has an empty dimension")
    if k % 16 or n % 16:
        raise inputs.error(
            "b", f"needs K and N multiples of 16 (as torch._scaled_mm), got {k}, {n}"
        )
    for x in (a, bo):
        if not x.aligned(16):
            raise inputs.error(x.name, "must start on a 16-byte boundary (a fresh tensor does)")
    sa, row_a = _scale_vector(inputs, scale_a, "scale_a", m, f"[M, 1] = [{m}, 1]")
    sb, col_b = _scale_vector(inputs, scale_b, "scale_b", n, f"[1, N] = [1, {n}]")
    _require_fp8_gpu(a)
    out = _arrays.output(a, (m, n), dt)
    out_arg = _arrays.output_arg(a, out, (m, n), dt)
    if bias is not None:
        bias_arg = inputs.array(bias, "bias", ndim=1, shape=(n,), dtypes=(dt,), form="[N]").arg(n)
    else:
        bias_arg = _arrays.output_arg(a, out, (m * n,), dt)  # not read
    stream = _arrays.stream_of(a)
    if col_major:
        bt_obj = bo.obj
        bt = bo.arg(n, k // 4, dtype=u32)
    else:
        bt_obj = _arrays.output(a, (n, k), a.dtype)
        bt = _arrays.output_arg(a, bt_obj, (n, k // 4), u32)
        K._transpose_bytes[(math.ceil(k / 4 / 128), n), 128, stream](
            bo.arg(k, n // 4, dtype=u32), bt
        )
    flags = {"ROW_A": int(row_a), "COL_B": int(col_b), "BIAS": int(bias is not None)}
    wgmma = _uses_wgmma(a)
    if _fp8_decode.fits(m, wgmma):  # decode: one launch for a column-major b
        _fp8_decode.launch(a, bt, out_arg, sa, sb, bias_arg, m, n, k, flags, dt, a.dtype, stream)
        return out
    if wgmma:
        H.launch(
            _units(a.obj, a.kind), _units(bt_obj, a.kind), out_arg, sa, sb, bias_arg,
            m, n, k, a.dtype.name, dt, flags, _arrays.multiprocessors(a), stream, like=a,
        )  # fmt: skip
        return out
    grid = (math.ceil(n / K.BN), math.ceil(m / K.BM))
    K._mm_fp8[grid, K.MM_THREADS, stream](
        a.arg(m, k // 4, dtype=u32), bt, out_arg, sa, sb, bias_arg, **flags, DT=dt, FP8=a.dtype
    )
    return out
