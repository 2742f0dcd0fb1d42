"""Rotary position embedding: ``rope(x, cos, sin, interleaved=False)``.

x is ``[S, D]`` or ``[S, H, D]`` (positions, heads, head dim; D even); ``cos`` and ``sin`` are
``[S, D/2]``: the angle of frequency pair j at position s is theta[s, j], and
``cos[s, j] = cos(theta[s, j])``. Each pair (a, b) of a row becomes
``(a * cos - b * sin, b * cos + a * sin)``. The pairs are ``(x[2j], x[2j+1])`` when
``interleaved`` (GPT-J, Meta's original Llama) and ``(x[j], x[j + D/2])`` otherwise (the
half-split layout of GPT-NeoX and Hugging Face Llama).

The kernel is a grid-stride loop over units of one row. Interleaved, a unit is one 16-byte
chunk of x (``VEC`` elements, ``VEC / 2`` pairs) with 8-byte reads of cos and sin, so each
warp access covers whole 32-byte sectors (two chunks of a unit, stored apart in time, left
half-written sectors behind: docs/llvm-backend.md).
Half-split, a unit is ``VEC`` pairs: one 16-byte access per operand, two for x. On the scalar
path (``VEC == 1``) every access is one element.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import f32, u32
from kaio_ops import _arrays
from kaio_ops._common import load_f32, store_f32, vector_width, widths
from kaio_ops._plan import planned

__all__ = ["rope"]

BLOCK = 256
MAX_BLOCKS = 1 << 20


@kaio.gpu_func
def rotate(xv: f32[:], ia: kaio.constexpr, ib: kaio.constexpr, c: f32, s: f32):
    """(xv[ia], xv[ib]) = (a cos - b sin, b cos + a sin)."""
    a = xv[ia]
    b = xv[ib]
    xv[ia] = a * c - b * s
    xv[ib] = b * c + a * s


@kaio.gpu_kernel
def _rope(
    x: DT[:],
    cos: DT[:],
    sin: DT[:],
    out: DT[:],
    units: u32,
    half: u32,
    heads: u32,
    INTERLEAVED: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    NP = VEC // 2 if INTERLEAVED and VEC > 1 else VEC  # pairs a unit (pairs_per_unit)
    per_row = half // NP
    stride = kaio.grid_dim_x() * kaio.block_dim_x()
    u = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    while u < units:
        row = u // per_row
        j = (u - row * per_row) * NP  # the unit's first pair
        cv = kaio.local(f32, (NP,))
        sv = kaio.local(f32, (NP,))
        xv = kaio.local(f32, (2 * NP,))
        at = (row // heads) * half + j
        load_f32(cv, 0, cos, at, NP, DT)
        load_f32(sv, 0, sin, at, NP, DT)
        if INTERLEAVED:
            # pairs (x[2j], x[2j+1]): one chunk, or two elements on the scalar path
            first = row * 2 * half + 2 * j
            for c in kaio.static_range(2 * NP // VEC):
                load_f32(xv, c * VEC, x, first + c * VEC, VEC, DT)
            for p in kaio.static_range(NP):
                rotate(xv, 2 * p, 2 * p + 1, cv[p], sv[p])
            for c in kaio.static_range(2 * NP // VEC):
                store_f32(out, first + c * VEC, xv, c * VEC, VEC, DT)
        else:
            # pairs (x[j], x[j + half]) from two chunks
            first = row * 2 * half + j
            load_f32(xv, 0, x, first, VEC, DT)
            load_f32(xv, VEC, x, first + half, VEC, DT)
            for p in kaio.static_range(VEC):
                rotate(xv, p, VEC + p, cv[p], sv[p])
            store_f32(out, first, xv, 0, VEC, DT)
            store_f32(out, first + half, xv, VEC, VEC, DT)
        u += stride


def pairs_per_unit(interleaved: bool, vec: int) -> int:
    """The pairs one thread rotates a unit (the kernel's ``NP``)."""
    return vec // 2 if interleaved and vec > 1 else vec


@planned("x", "cos", "sin")
def rope(x, cos, sin, interleaved: bool = False):
    """Rotary position embedding, computed in f32 (see the module docstring for the layouts).

    x: [S, D] or [S, H, D] f32, f16 or bf16 with D even; cos, sin: [S, D/2] of x's dtype.
    Returns a new array like x.
    """
    inputs = _arrays.Inputs("rope")
    a = inputs.array(x, "x", ndim=(2, 3), form="[S, D] or [S, H, D]")
    d = a.shape[-1]
    if d % 2:
        raise inputs.error("x", f"needs an even last dimension (head dim D), got shape {a.shape}")
    half = d // 2
    table = (a.shape[0], half)
    c = inputs.array(cos, "cos", ndim=2, shape=table, form="[S, D/2]")
    s = inputs.array(sin, "sin", ndim=2, shape=table, form="[S, D/2]")
    out = _arrays.output(a)
    if a.size == 0:
        return out
    vec = vector_width(a, c, s, multiple_of=half)
    units = a.size // 2 // pairs_per_unit(interleaved, vec)
    heads = a.shape[1] if len(a.shape) == 3 else 1
    grid = max(1, min(MAX_BLOCKS, -(-units // BLOCK)))
    _rope[grid, BLOCK, _arrays.stream_of(a)](
        a.arg(a.size),
        c.arg(c.size),
        s.arg(s.size),
        _arrays.output_arg(a, out, (a.size,)),
        units,
        half,
        heads,
        INTERLEAVED=bool(interleaved),
        VEC=vec,
        DT=a.dtype,
    )
    return out


def shipped():
    """(kernel, constexprs) of every specialization rope launches."""
    for dtype in _arrays.FLOATS:
        for interleaved in (False, True):
            for vec in widths(dtype):
                yield _rope, {"INTERLEAVED": interleaved, "VEC": vec, "DT": dtype}
