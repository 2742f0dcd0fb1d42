"""A decode step's rotary embedding and KV cache append in one launch:
``kv_cache_append_rope(k_cache, v_cache, qkv, cos, sin, seq_lens, heads)``.

A Llama-family attention block computes Q, K and V in one projection; this op takes that
projection's output ``qkv`` [B, Sq, (H + 2 Hkv) D] as it comes (token-major, the heads of each
token side by side: H query heads, then Hkv key heads, then Hkv value heads), rotates q and k
(``rope``'s half-split pairs ``(x[j], x[j + D/2])``, computed in f32) at each new token's
position ``seq_lens[b] - Sq + j`` (cos/sin read from position tables [P, D/2] on the GPU: no
per-step table on the host), writes the rotated keys and the values into the cache in place
(``kv_cache_append``'s positions and layouts: contiguous [B, Hkv, capacity, D] or paged
[num_pages, page_size, Hkv, D] with ``block_table``) and returns the rotated queries
[B, H, Sq, D] for ``flash_attention_decode``. One launch replaces a ``rope`` over q and k, two
cache writes and the views between them; nothing depends on the lengths' values on the host,
so a CUDA graph captured once replays for any lengths.

The kernel is one thread per ``VEC`` pairs of one head row (VEC 8: 16-byte accesses).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import bf16, f16, f32, i32, u32
from kaio_ops import _arrays
from kaio_ops._common import load_f32, store_f32, widths
from kaio_ops._decode import cache_row
from kaio_ops._plan import planned
from kaio_ops.decode import _Cache, _host_check, _lengths

__all__ = ["kv_cache_append_rope"]

BLOCK = 256


@kaio.gpu_func
def rotate_pairs(xv: f32[:], cv: f32[:], sv: f32[:], VEC: kaio.constexpr):
    """(xv[p], xv[VEC + p]) = (a cos - b sin, b cos + a sin) for each of the VEC pairs."""
    for p in kaio.static_range(VEC):
        a = xv[p]
        b = xv[VEC + p]
        xv[p] = a * cv[p] - b * sv[p]
        xv[VEC + p] = b * cv[p] + a * sv[p]


@kaio.gpu_kernel(block_size=BLOCK)
def _rope_append(
    qkv: DT[:],
    cos: DT[:],
    sin: DT[:],
    q: DT[:],
    k_cache: DT[:],
    v_cache: DT[:],
    seq_lens: i32[:],
    block_table: i32[:],
    heads: u32,
    kv_heads: u32,
    sq: u32,
    half: u32,
    positions: u32,
    capacity: u32,
    max_pages: u32,
    shift: u32,
    pages: u32,
    units: u32,
    PAGED: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    """Unit u: pairs j .. j + VEC of head row ``row`` of qkv ([B, Sq, H + 2 Hkv, D] flat);
    a query head is rotated into q [B, H, Sq, D], a key head rotated into the cache, a value
    head copied into it (cache positions outside 0 .. capacity - 1 are skipped)."""
    u = kaio.block_idx_x() * BLOCK + kaio.thread_idx_x()
    if u >= units:
        return
    per_row = half // VEC
    row = u // per_row
    j = (u - row * per_row) * VEC
    width = heads + 2 * kv_heads
    hh = row % width
    t = row // width  # the token: b * sq + i
    i = t % sq
    b = t // sq
    pos = seq_lens[b] - i32(sq) + i32(i)
    first = row * 2 * half + j
    xv = kaio.local(f32, (2 * VEC,))
    load_f32(xv, 0, qkv, first, VEC, DT)
    load_f32(xv, VEC, qkv, first + half, VEC, DT)
    if hh < heads + kv_heads:
        cv = kaio.local(f32, (VEC,))
        sv = kaio.local(f32, (VEC,))
        p = u32(kaio.min(kaio.max(pos, i32(0)), i32(positions) - 1))
        load_f32(cv, 0, cos, p * half + j, VEC, DT)
        load_f32(sv, 0, sin, p * half + j, VEC, DT)
        rotate_pairs(xv, cv, sv, VEC)
    if hh < heads:
        at = ((b * heads + hh) * sq + i) * 2 * half + j
        store_f32(q, at, xv, 0, VEC, DT)
        store_f32(q, at + half, xv, VEC, VEC, DT)
        return
    if pos < 0 or pos >= i32(capacity):
        return
    if PAGED:  # a page outside the pool (a bad table) is not written
        if u32(block_table[b * max_pages + (u32(pos) >> shift)]) >= pages:
            return
    kvh = hh - heads
    if kvh >= kv_heads:
        kvh -= kv_heads
    at = cache_row(
        u32(pos), b, kvh, block_table, capacity, max_pages, kv_heads, shift, pages, 2 * half, PAGED
    )
    if hh < heads + kv_heads:
        store_f32(k_cache, at + j, xv, 0, VEC, DT)
        store_f32(k_cache, at + j + half, xv, VEC, VEC, DT)
    else:
        store_f32(v_cache, at + j, xv, 0, VEC, DT)
        store_f32(v_cache, at + j + half, xv, VEC, VEC, DT)


@planned("k_cache", "v_cache", "qkv", "cos", "sin", "seq_lens", "block_table")
def kv_cache_append_rope(k_cache, v_cache, qkv, cos, sin, seq_lens, heads: int, block_table=None):
    """Rotate a decode step's queries and keys and append its keys and values to the cache
    (module docstring); returns the rotated queries.

    ``qkv`` [B, Sq, (heads + 2 Hkv) * D] f16 or bf16 (Hkv: the cache's K/V heads; D even),
    ``cos``, ``sin`` [P, D/2] of qkv's dtype (row p: position p's angles, as ``rope`` takes
    them; P covers every position the step uses: positions past P - 1 read row P - 1),
    the cache as ``kv_cache_append`` takes it (``seq_lens`` int32 [B]: the lengths with the
    Sq new tokens; ``block_table`` for a paged cache). Returns q [B, heads, Sq, D] of qkv's
    dtype, rotated; the keys (rotated) and values are written at positions
    seq_lens[b] - Sq .. seq_lens[b] - 1 of sequence b (outside the cache: skipped)."""
    op = "kv_cache_append_rope"
    inputs = _arrays.Inputs(op)
    xa = inputs.array(qkv, "qkv", ndim=3, dtypes=(f16, bf16), form="[B, Sq, (H + 2 Hkv) * D]")
    batch, sq, width = xa.shape
    ka = inputs.array(k_cache, "k_cache", ndim=4, dtypes=(xa.dtype,))
    d = ka.shape[-1]
    if d % 2 or d == 0:
        raise inputs.error("k_cache", f"needs an even head dim D, got shape {ka.shape}")
    cache = _Cache(inputs, k_cache, v_cache, block_table, batch, d, xa.dtype)
    if not isinstance(heads, int) or heads < 1 or width != (heads + 2 * cache.kv_heads) * d:
        raise inputs.error(
            "qkv",
            f"has width {width}; with heads = {heads!r} query heads, the cache's "
            f"Hkv = {cache.kv_heads} and D = {d} it must be (heads + 2 Hkv) * D = "
            f"{(heads + 2 * cache.kv_heads) * d if isinstance(heads, int) else '?'}",
        )
    if 0 in xa.shape:
        raise inputs.error("qkv", f"has an empty dimension: shape {xa.shape}")
    half = d // 2
    c = inputs.array(cos, "cos", ndim=2, dtypes=(xa.dtype,), form="[P, D/2]")
    if c.shape[1] != half or c.shape[0] == 0:
        raise inputs.error("cos", f"must have shape [P >= 1, D/2 = {half}], got {c.shape}")
    s = inputs.array(sin, "sin", ndim=2, shape=c.shape, dtypes=(xa.dtype,), form="[P, D/2]")
    lens = _lengths(inputs, seq_lens, batch)
    _host_check(inputs, lens, cache, _rope_append.debug)
    out = _arrays.output(xa, (batch, heads, sq, d))
    aligned = all(a.aligned(16) for a in (xa, c, s, cache.k, cache.v))
    vec = 8 if half % 8 == 0 and aligned else 1
    units = xa.size // 2 // vec
    q = _arrays.output_arg(xa, out, (batch * heads * sq * d,))
    _rope_append[-(-units // BLOCK), BLOCK, _arrays.stream_of(xa), 0](
        xa.arg(xa.size), c.arg(c.size), s.arg(s.size), q,
        cache.k.arg(cache.k.size), cache.v.arg(cache.v.size), lens.arg(batch),
        cache.table_arg(xa), heads, cache.kv_heads, sq, half, c.shape[0], *cache.geometry(),
        units, PAGED=cache.paged, VEC=vec, DT=xa.dtype,
    )  # fmt: skip
    return out


def shipped():
    """(kernel, constexprs) of every specialization ``kv_cache_append_rope`` launches."""
    for dtype in (f16, bf16):
        for paged in (False, True):
            for vec in widths(dtype):
                yield _rope_append, {"PAGED": paged, "VEC": vec, "DT": dtype}
