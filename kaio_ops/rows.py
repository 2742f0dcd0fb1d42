"""Row ops: ``rms_norm``, ``rms_norm_residual``, ``layer_norm``, ``softmax``.

One kernel, ``_rows``, specialized per op (``OP``), element type, ``VEC``, ``EDGES``,
``SHIFT``, ``WIDE`` and ``PACKED``; one block per row (rows: the last dimension).
``EDGES``: 16-byte chunks on rows that do not start or end on a 16-byte boundary in an
array that does (``layout``); ``SHIFT``: 16-byte chunks aligned with w and the outputs on
rows whose x starts SHIFT elements past a 16-byte boundary (x's vectors realigned in
registers); ``WIDE``: launched with MAX_BLOCK threads (under launch bounds,
``launch_flags``); ``PACKED``: 16-bit rows on MAX_BLOCK threads that keep the row in
registers as DT (``PACKED_OPS``). Each thread caches its part of the row in ``REGS`` f32
(or DT) registers, ``REGS // VEC`` chunks of ``VEC`` elements (one 16-byte access each
when ``VEC > 1``), so a row is read from memory once when it fits in the block's registers
(up to 16384 elements with MAX_BLOCK = 512 threads; 1024-thread blocks would cap the
kernels at 64 registers a thread, which the driver's compilation can exceed). Softmax
sends longer rows to a cluster of blocks on sm_90 (``kaio_ops._long_rows``). Otherwise
longer rows are walked in segments of that size; passes alternate direction, so each
starts with the segment the previous pass left in registers and reads the others again. The passes:

- pass 0 loads (rms_norm_residual adds the residual and stores the sum here; softmax and
  the rms norms issue all of a segment's loads before converting any, see ``LOADS_FIRST``)
  and accumulates:
  sum of squares (rms), sum (layer norm), running max and sum of exp(x - max) (softmax, which
  keeps exp(x - max of the segment) in the registers: one exp an element for rows that fit);
- a block reduction (warp shuffles, then shared memory across warps) gives the row's
  statistics; layer norm runs one more pass for the sum of squared deviations from the mean;
- the last pass writes the output (the rms norms with 16-byte chunks load the segment's
  weights before the first store, see ``WEIGHTS_FIRST``).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import bool_, f32, u32, u64
from kaio_ops import _arrays, _long_rows
from kaio_ops._common import (
    LOG2E,
    LOWEST,
    VECTOR_BYTES,
    block_max_sum,
    block_sum,
    fetch,
    load_f32,
    merge_max_sum,
    store_f32,
    vector_width,
    widths,
)
from kaio_ops._plan import planned

__all__ = ["rms_norm", "rms_norm_residual", "layer_norm", "softmax"]

REGS = 32  # f32 registers per thread that hold its part of a row
MIN_BLOCK, MAX_BLOCK = 64, 512
OPS = ("rms_norm", "rms_norm_residual", "layer_norm", "softmax")
# Ops whose segment loads all go out before any chunk is converted. Converted between the
# loads, a chunk's registers went to the next load's address in the driver's code, so that
# load waited for the first one's data: two memory latencies a row (H200, f16 and bf16:
# softmax 80% -> 92% of copy bandwidth, rms_norm 87% -> 95%). Layer norm issued its loads
# together either way and only gained registers (layer norm 91% -> 80%). The residual op
# stores each chunk's sum, and a load after a store cannot be moved above it (the arrays
# may alias): one memory latency a chunk (H100, f32 [16384, 4096]: 374 -> 364 µs; 507 -> 397
# with VEC = 1).
LOADS_FIRST = ("softmax", "rms_norm", "rms_norm_residual")
# Ops whose output pass loads a group of chunks' weights before the first store of the
# group, for the same reason: all of a segment's when VEC > 1 (H100: rms_norm_residual f32
# 364 -> 362 µs, rms_norm 185 -> 184); 8 chunks with VEC = 1 (all 32 cost 56 registers a
# thread, rms_norm f32 195 -> 215 µs; 8, against one a chunk, on rows one element past an
# allocation, H100: rms_norm f16 275 -> 253 µs, rms_norm_residual f16 498 -> 440, f32
# 407 -> 370); one with EDGES (all of a segment's, the scalar loads where w is not aligned
# with the chunks held 40 more registers, rms_norm f16 120, and took 247 µs against 201);
# one on PACKED rows (64 registers: H100, bf16 [8192, 16384] x +1 rms_norm 199 -> 189 µs).
WEIGHTS_FIRST = ("rms_norm", "rms_norm_residual")
SCALAR_WEIGHTS_GROUP = 8
EDGE_WEIGHTS_GROUP = 1
# Ops whose rows take 16-byte chunks even where a row does not start or end on a 16-byte
# boundary (``EDGES``: a row length that is not a multiple of the chunk): the chunks are
# aligned in memory, the row's elements before the first and after the last go one a
# thread to the first threads (``edge_fetch``).
EDGE_OPS = OPS
# Ops whose rows take 16-byte chunks aligned with w and the outputs where x (and the
# residual) start SHIFT elements past a 16-byte boundary (x one element past an
# allocation): each thread loads x's aligned vector around its chunk and takes the next
# vector's first SHIFT elements from the lane above (``fetch_shifted``, ``realign``); the
# row's first and last chunk go one element a thread to the first threads, which load
# their w and b with x (after the output pass, H100: layer_norm f16 [32768, 4096] +1
# 218 µs against 197, Triton 201). Measurements are noted here, not in the kernel: the PTX
# quotes its source lines, and ptxas takes ASCII only.
SHIFT_OPS = OPS
# The shifts at which an op's 16-bit SHIFT rows give a warp consecutive chunks, so that lane
# 31's next chunk is lane 0's next (a shuffle, not loads); f32 rows and PACKED rows: every
# op and shift. The others take a thread's chunks a block apart. Measured both ways (µs,
# warp / block apart): H100, x +1 [32768, 4096] f16 / f32 [16384, 4096]: f16 rms_norm 189 /
# 185, rms_norm_residual 366 / 368, layer_norm 220 / 197, softmax 209 / 201 (bf16 rms_norm
# 189 / 193, rms_norm_residual 366 / 369); f32 rms_norm_residual 366 / 372, layer_norm 190
# / 191, softmax 186 / 190; H200, f16 [32768, 4096] layer_norm +2 .. +7: 193 / 167, 166 /
# 182, 168 / 208, 170 / 208, 170 / 242, 184 / 251; softmax 184 / 179, 186 / 179, 163 / 180,
# 164 / 228, 165 / 213, 180 / 239; PACKED [8192, 16384] (H100): layer_norm bf16 +1 204 /
# 230, f16 +7 204 / 261, softmax f16 +7 195 / 236 (lane 31's loads only for its last chunk:
# fewer registers). ptxas orders the shuffles and the loads differently from kernel to
# kernel, hence the table.
WARP_CHUNK_SHIFTS = {
    "rms_norm": range(1, 8),
    "rms_norm_residual": range(1, 8),
    "layer_norm": range(3, 8),
    "softmax": range(4, 8),
}
WARP_CHUNKS = tuple((op, shift) for op, shifts in WARP_CHUNK_SHIFTS.items() for shift in shifts)
# The ops whose 16-bit rows on MAX_BLOCK threads keep their part of the row in registers as
# DT, two elements a register, not f32 (``PACKED``), under launch bounds of two blocks an
# SM (64 registers a thread, against 80 to 128: one block an SM), by the rows' layout
# (``kind``). Softmax then computes its exps again in the output pass. Measured on an H100
# (µs, f16 [8192, 16384], f32 in registers / DT, Triton): x +1 rms_norm 259 / 187, 195;
# layer_norm 301 / 208, 207; softmax 278 / 192, 201 (bf16 and x +7 likewise; layer_norm and
# softmax +7 spilled, see WARP_CHUNK_SHIFTS); aligned rms_norm 220 / 184, 183; softmax 235
# / 183, 183; rows of 16383 (EDGES) rms_norm 264 / 196, softmax 271 / 191; x +1 and 16383
# (VEC 1) layer_norm 302 / 275, softmax 361 / 246. Not packed where it did not pay:
# rms_norm_residual (+1: 372 / 434, spills), aligned layer_norm (185 / 186), EDGES
# layer_norm (228 / 243; H200 222 / 239), VEC 1 rms_norm (309 / 307; its weights a chunk
# at a time, H200: 276 / 582).
PACKED_OPS = {
    "shift": ("rms_norm", "layer_norm", "softmax"),
    "aligned": ("rms_norm", "softmax"),
    "edges": ("rms_norm", "softmax"),
    "scalar": ("layer_norm", "softmax"),
}


@kaio.gpu_func
def fetch_part(
    EDGES: kaio.constexpr,
    VEC: kaio.constexpr,
    raw: DT[:, :],
    k: kaio.constexpr,
    src: DT[:],
    i: u32,
    vector: bool_,
    DT: kaio.constexpr,
):
    """raw[k] = src[i : i + VEC] (``fetch``); with ``EDGES``, one 16-byte load only where
    ``vector`` (src 16-byte aligned at i), else a scalar load an element."""
    if EDGES and not vector:
        for j in kaio.static_range(VEC):
            raw[k, j] = src[u64(i) + j]
    else:
        fetch(VEC, raw, k, src, i, DT)


@kaio.gpu_func
def load_part(
    EDGES: kaio.constexpr,
    dst: f32[:],
    src: DT[:],
    i: u32,
    vector: bool_,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    """dst[:VEC] = src[i : i + VEC] in f32 (``load_f32``); with ``EDGES``, one 16-byte load
    only where ``vector`` (src 16-byte aligned at i), else a scalar load an element."""
    if EDGES and not vector:
        for j in kaio.static_range(VEC):
            dst[j] = f32(src[u64(i) + j])
    else:
        load_f32(dst, 0, src, i, VEC, DT)


@kaio.gpu_func
def fetch_shifted(
    OP: kaio.constexpr,
    SHIFT: kaio.constexpr,
    VEC: kaio.constexpr,
    raw: DT[:, :],
    edge: DT[:, :],
    k: kaio.constexpr,
    src: DT[:],
    base: u32,
    c: u32,
    chunks: u32,
    DT: kaio.constexpr,
    XT: kaio.constexpr,
):
    """For chunk c of a row whose chunks start at src[base], SHIFT elements past a 16-byte
    boundary: raw[k] = the 16-byte vector around the chunk's first element, src[i - SHIFT :
    i - SHIFT + VEC] (i = base + c VEC); on lane 31, edge[k] = the next vector's first SHIFT
    elements, src[i + VEC - SHIFT : i + VEC] (the lane above holds the next vector, see
    ``realign``; where a warp's chunks are consecutive, WARP_CHUNK_SHIFTS, lane 0 holds
    lane 31's, but for the thread's last chunk). Past ``chunks`` the vector after the last chunk
    is loaded (the row's last VEC elements are edges, so it lies in the row): no load is
    predicated on c, only lane 31's on one predicate (with a predicate a chunk, more than
    the SM's 7 held the loads back)."""
    kaio.load_vector(raw[k], src, base + kaio.min(c, chunks) * VEC - SHIFT)
    if k == REGS // VEC - 1 or not (VEC == 4 or XT != f32 or (OP, SHIFT) in WARP_CHUNKS):
        if kaio.lane_id() == 31:
            for j in kaio.static_range(SHIFT):
                edge[k, j] = src[base + kaio.min(c + 1, chunks) * VEC - SHIFT + j]


@kaio.gpu_func
def realign(
    OP: kaio.constexpr,
    SHIFT: kaio.constexpr,
    VEC: kaio.constexpr,
    raw: DT[:, :],
    edge: DT[:, :],
    k: kaio.constexpr,
    DT: kaio.constexpr,
    XT: kaio.constexpr,
):
    """raw[k] = the chunk's elements from what ``fetch_shifted`` loaded: its vector's last
    VEC - SHIFT elements and the next vector's first SHIFT, which the lane above loaded as
    its own (a warp shuffle; lane 31: edge). Every lane takes part."""
    lane = kaio.lane_id()
    up = kaio.local(DT, (SHIFT,))
    for j in kaio.static_range(SHIFT):
        if (VEC == 4 or XT != f32 or (OP, SHIFT) in WARP_CHUNKS) and k < REGS // VEC - 1:
            # lane 31's next chunk is lane 0's next one
            up[j] = kaio.shfl_idx(kaio.select(lane == 0, raw[k + 1, j], raw[k, j]), (lane + 1) % 32)
        else:
            up[j] = kaio.select(lane == 31, edge[k, j], kaio.shfl_down(raw[k, j], 1))
    for j in kaio.static_range(VEC - SHIFT):
        raw[k, j] = raw[k, j + SHIFT]
    for j in kaio.static_range(SHIFT):
        raw[k, VEC - SHIFT + j] = up[j]


@kaio.gpu_func
def take_chunk(
    PASS: kaio.constexpr,
    OP: kaio.constexpr,
    VEC: kaio.constexpr,
    xs: XT[:],
    raw: DT[:, :],
    rraw: DT[:, :],
    k: kaio.constexpr,
    res_out: DT[:],
    i: u32,
    DT: kaio.constexpr,
    XT: kaio.constexpr,
):
    """xs[k VEC : (k + 1) VEC] = the fetched chunk k in XT (for rms_norm_residual in pass 0:
    x + res, rounded to DT and stored to res_out at i)."""
    for j in kaio.static_range(VEC):
        xs[k * VEC + j] = XT(raw[k, j])
    if OP == "rms_norm_residual" and PASS == 0:
        rv = kaio.local(f32, (VEC,))
        for j in kaio.static_range(VEC):
            rv[j] = f32(xs[k * VEC + j]) + f32(rraw[k, j])
            xs[k * VEC + j] = XT(DT(rv[j]))  # normalize exactly what is stored
        store_f32(res_out, i, rv, 0, VEC, DT)


@kaio.gpu_func
def accumulate(
    PASS: kaio.constexpr,
    OP: kaio.constexpr,
    VEC: kaio.constexpr,
    xs: XT[:],
    at: kaio.constexpr,
    total: f32,
    shift: f32,
    XT: kaio.constexpr,
) -> f32:
    """``total`` plus pass PASS's sum over the chunk xs[at : at + VEC]: of x (layer norm's
    pass 0), x * x (rms norms), (x - shift)^2 (layer norm's pass 1: shift is the mean)."""
    for j in kaio.static_range(VEC):
        if PASS == 0 and OP == "layer_norm":
            total += f32(xs[at + j])
        elif PASS == 0:
            total += f32(xs[at + j]) * f32(xs[at + j])
        else:
            d = f32(xs[at + j]) - shift
            total += d * d
    return total


@kaio.gpu_func
def out_value(OP: kaio.constexpr, x: f32, shift: f32, scale: f32) -> f32:
    """The output of element x before the weights: (x - shift) * scale (layer norm: shift
    the mean, scale 1/std), x * scale (rms norms), exp(x - shift) * scale (softmax: shift the
    row's max, scale 1/sum; a segment whose exps xs holds is scaled by seg_scale instead)."""
    if OP == "softmax":
        return kaio.exp2_ftz((x - shift) * LOG2E) * scale
    elif OP == "layer_norm":
        return (x - shift) * scale
    return x * scale


@kaio.gpu_func
def write_chunk(
    OP: kaio.constexpr,
    VEC: kaio.constexpr,
    xs: XT[:],
    at: kaio.constexpr,
    w: DT[:],
    wraw: DT[:, :],
    k: kaio.constexpr,
    b: DT[:],
    out: DT[:],
    i: u32,
    col: u32,
    shift: f32,
    scale: f32,
    cached: bool_,
    seg_scale: f32,
    w_vector: bool_,
    EDGES: kaio.constexpr,
    DT: kaio.constexpr,
    XT: kaio.constexpr,
):
    """The output pass on the chunk xs[at : at + VEC] (row element col, array element i):
    ``out_value``, times w (rms norms; for the ops in WEIGHTS_FIRST wraw[k] holds the
    chunk's weights), times w plus b (layer norm, loaded by ``load_part`` with
    ``w_vector``)."""
    ov = kaio.local(f32, (VEC,))
    wv = kaio.local(f32, (VEC,))
    bv = kaio.local(f32, (VEC,))
    if OP == "layer_norm":
        load_part(EDGES, wv, w, col, w_vector, VEC, DT)
        load_part(EDGES, bv, b, col, w_vector, VEC, DT)
    elif OP in WEIGHTS_FIRST:
        for j in kaio.static_range(VEC):
            wv[j] = f32(wraw[k, j])
    elif OP != "softmax":
        load_f32(wv, 0, w, col, VEC, DT)
    if OP == "softmax" and XT == f32 and cached:
        for j in kaio.static_range(VEC):
            ov[j] = xs[at + j] * seg_scale
    else:
        for j in kaio.static_range(VEC):
            v = out_value(OP, f32(xs[at + j]), shift, scale)
            if OP == "layer_norm":
                ov[j] = v * wv[j] + bv[j]
            elif OP == "softmax":
                ov[j] = v
            else:
                ov[j] = v * wv[j]
    store_f32(out, i, ov, 0, VEC, DT)


@kaio.gpu_func
def exp_segment(
    VEC: kaio.constexpr,
    xs: XT[:],
    first: u32,
    step: u32,
    chunks: u32,
    top: f32,
    total: f32,
    XT: kaio.constexpr,
):
    """Softmax's pass 0 on the segment in xs (chunks first + k * step): seg_top = its max over
    this thread's chunks, xs = exp(xs - seg_top), and (seg_top, the sum of those) merged
    into the running pair (top, total). Returns ``(top, total, seg_top)``. One exp an
    element; the output pass scales the cached exps instead of computing them again."""
    seg_top = LOWEST  # finite, so a chunk of -inf gives exp(-inf) = 0, not NaN
    for k in kaio.static_range(REGS // VEC):
        if first + k * step < chunks:
            for j in kaio.static_range(VEC):
                seg_top = kaio.max(seg_top, f32(xs[k * VEC + j]))
    s = 0.0
    for k in kaio.static_range(REGS // VEC):
        if first + k * step < chunks:
            for j in kaio.static_range(VEC):
                e = kaio.exp2_ftz((f32(xs[k * VEC + j]) - seg_top) * LOG2E)
                if XT == f32:
                    xs[k * VEC + j] = e
                s += e
    top, total = merge_max_sum(top, total, seg_top, s)
    return top, total, seg_top


@kaio.gpu_func
def row_pass(
    PASS: kaio.constexpr,
    OP: kaio.constexpr,
    VEC: kaio.constexpr,
    xs: XT[:],
    x: DT[:],
    res: DT[:],
    res_out: DT[:],
    w: DT[:],
    b: DT[:],
    out: DT[:],
    base: u32,
    chunks: u32,
    shift: f32,
    scale: f32,
    seg_scale: f32,
    col0: u32,
    w_ok: bool_,
    EDGES: kaio.constexpr,
    SHIFT: kaio.constexpr,
    DT: kaio.constexpr,
    XT: kaio.constexpr,
):
    """One pass over this block's row (``chunks`` chunks of VEC from array element base, row
    element col0; with EDGES the weights' chunks are 16-byte aligned only when ``w_ok``): the
    accumulating passes (``accumulate``; softmax's pass 0: ``exp_segment``) return this
    thread's ``(total, top, seg_top)``: its sum, and for softmax its running max (total
    then the sum of exp(x - top)) and the max of the segment left in xs; the output pass
    (``write_chunk``, with the row's ``shift``, ``scale`` and ``seg_scale``) returns them
    unchanged. With SHIFT, x and res start SHIFT elements past a 16-byte boundary: their
    aligned vectors are loaded and realigned to the chunks (``fetch_shifted``, ``realign``).
    """
    t = kaio.thread_idx_x()
    nt = kaio.block_dim_x()
    per = nt * (REGS // VEC)
    segments = (chunks + per - 1) // per
    total = 0.0
    top = LOWEST
    seg_top = 0.0
    for s in range(segments):
        # Passes alternate direction, so each starts with the segment the last one left in xs
        seg = s if PASS % 2 == 0 else segments - 1 - s
        first = seg * per + t  # this thread's chunks: first + k step
        step = nt
        if SHIFT > 0 and (VEC == 4 or XT != f32 or (OP, SHIFT) in WARP_CHUNKS):  # consecutive
            first = seg * per + (t - kaio.lane_id()) * (REGS // VEC) + kaio.lane_id()
            step = u32(32)
        if PASS == 0 or s > 0:
            raw = kaio.local(DT, (REGS // VEC, VEC))
            rraw = kaio.local(DT, (REGS // VEC, VEC))  # res (rms_norm_residual, pass 0)
            edge = kaio.local(DT, (REGS // VEC, VEC))  # (fetch_shifted, the first SHIFT)
            redge = kaio.local(DT, (REGS // VEC, VEC))
            for k in kaio.static_range(REGS // VEC):
                c = first + k * step
                if SHIFT > 0 and (OP != "rms_norm_residual" or PASS == 0):
                    fetch_shifted(OP, SHIFT, VEC, raw, edge, k, x, base, c, chunks, DT, XT)
                if SHIFT > 0 and OP == "rms_norm_residual" and PASS == 0:
                    fetch_shifted(OP, SHIFT, VEC, rraw, redge, k, res, base, c, chunks, DT, XT)
                if c < chunks:
                    i = base + c * VEC
                    if OP == "rms_norm_residual" and PASS > 0:
                        fetch(VEC, raw, k, res_out, i, DT)
                    elif SHIFT == 0:
                        fetch(VEC, raw, k, x, i, DT)
                    if OP == "rms_norm_residual" and PASS == 0 and SHIFT == 0:
                        fetch(VEC, rraw, k, res, i, DT)
                    if OP not in LOADS_FIRST and SHIFT == 0:
                        take_chunk(PASS, OP, VEC, xs, raw, rraw, k, res_out, i, DT, XT)
            if SHIFT > 0:
                for k in kaio.static_range(REGS // VEC):
                    if OP != "rms_norm_residual" or PASS == 0:
                        realign(OP, SHIFT, VEC, raw, edge, k, DT, XT)
                    if OP == "rms_norm_residual" and PASS == 0:
                        realign(OP, SHIFT, VEC, rraw, redge, k, DT, XT)
            if OP in LOADS_FIRST or SHIFT > 0:
                for k in kaio.static_range(REGS // VEC):
                    c = first + k * step
                    if c < chunks:
                        take_chunk(PASS, OP, VEC, xs, raw, rraw, k, res_out, base + c * VEC, DT, XT)
        if PASS == 0 and OP == "softmax":
            top, total, seg_top = exp_segment(VEC, xs, first, step, chunks, top, total, XT)
        wraw = kaio.local(DT, (REGS // VEC, VEC))  # the output pass's weights (WEIGHTS_FIRST)
        per_group = (
            1
            if XT != f32
            else EDGE_WEIGHTS_GROUP
            if EDGES
            else REGS // VEC
            if VEC > 1
            else SCALAR_WEIGHTS_GROUP
        )
        for g in kaio.static_range(0, REGS // VEC, per_group):
            if PASS == 1 and OP in WEIGHTS_FIRST:
                for k in kaio.static_range(g, g + per_group):
                    c = first + k * step
                    if c < chunks:
                        fetch_part(EDGES, VEC, wraw, k, w, col0 + c * VEC, w_ok, DT)
            for k in kaio.static_range(g, g + per_group):
                c = first + k * step
                if c < chunks:
                    if PASS == 0 and OP == "softmax":
                        pass  # done a segment at a time by exp_segment
                    elif PASS == 0 or (PASS == 1 and OP == "layer_norm"):
                        total = accumulate(PASS, OP, VEC, xs, k * VEC, total, shift, XT)
                    else:
                        write_chunk(OP, VEC, xs, k * VEC, w, wraw, k, b, out, base + c * VEC,
                                    col0 + c * VEC, shift, scale, s == 0, seg_scale, w_ok, EDGES,
                                    DT, XT)  # fmt: skip
    return total, top, seg_top


@kaio.gpu_func
def edge_fetch(
    OP: kaio.constexpr,
    x: DT[:],
    res: DT[:],
    base: u32,
    n: u32,
    head: u32,
    body: u32,
    DT: kaio.constexpr,
) -> tuple[bool_, u32, u32, f32, f32]:
    """``(inside, at, col, x, res)``: the element of the edges of the row at array element
    base (its first ``head`` elements and those after the next ``body``) that this thread
    takes, one a thread from thread 0: whether there is one, its array element and column,
    and its x and residual (rms_norm_residual) in f32; zeros without one."""
    t = kaio.thread_idx_x()
    inside = t < n - body
    col = t if t < head else t + body
    ex = 0.0
    er = 0.0
    if inside:
        ex = f32(x[base + col])
        if OP == "rms_norm_residual":
            er = f32(res[base + col])
    return inside, base + col, col, ex, er


@kaio.gpu_kernel
def _rows(
    x: DT[:],
    res: DT[:],
    w: DT[:],
    b: DT[:],
    out: DT[:],
    res_out: DT[:],
    n: u32,
    eps: f32,
    w_lead: u32,
    OP: kaio.constexpr,
    VEC: kaio.constexpr,
    EDGES: kaio.constexpr,
    SHIFT: kaio.constexpr,
    WIDE: kaio.constexpr,
    PACKED: kaio.constexpr,
    DT: kaio.constexpr,
):
    if PACKED:
        kaio.launch_bounds(MAX_BLOCK, 2)  # two blocks an SM: at most 64 registers a thread
    elif WIDE and (VEC == 1 or EDGES):
        # at most 128 registers a thread, so that MAX_BLOCK threads fit (the scalar
        # rms_norm_residual f16 takes 162: its rows past 8192 elements failed to launch)
        kaio.launch_bounds(MAX_BLOCK)
    elif WIDE:
        # the same, asking for one block an SM: else ptxas aimed at two (64 registers) and
        # spilled (SHIFT layer_norm)
        kaio.launch_bounds(MAX_BLOCK, 1)
    red0 = kaio.shared(f32, (32,))
    red1 = kaio.shared(f32, (32,))
    XT = DT if PACKED else f32  # the type of the row in registers, see PACKED_OPS
    xs = kaio.local(XT, (REGS,))
    base = kaio.block_idx_x() * n
    chunks = n // VEC
    col0 = u32(0)  # the row element at array element base
    w_ok = True
    inside = False  # this thread has an element of the row's edges: array element at, column col
    at = u32(0)
    col = u32(0)
    ex = 0.0  # its x (rms_norm_residual: its x + res)
    er = 0.0  # its residual
    ew = 0.0  # its w and b (loaded with x, see SHIFT_OPS)
    eb = 0.0
    if EDGES or SHIFT > 0:
        # EDGES: the chunks are 16-byte aligned (the arrays start on a 16-byte boundary but
        # w, w_lead elements past one): they start col0 elements into the row. SHIFT: all
        # but the row's first and last, so that the x vectors around them
        # (``fetch_shifted``) lie in the row. The row's elements before the first chunk and
        # after the last go one a thread to the first threads (``edge_fetch``).
        if EDGES:
            col0 = kaio.min((VEC - base % VEC) % VEC, n)
            chunks = (n - col0) // VEC
        else:
            col0 = u32(VEC)
            chunks = n // VEC - 2
        w_ok = (w_lead + col0) % VEC == 0
        inside, at, col, ex, er = edge_fetch(OP, x, res, base, n, col0, chunks * VEC, DT)
        if OP != "softmax" and inside:  # its w and b with x (see SHIFT_OPS)
            ew = f32(w[col])
            if OP == "layer_norm":
                eb = f32(b[col])
        base = base + col0
    # pass 0: this thread's sum (softmax: its running max top and sum of exp(x - top), and
    # seg_top, the max of the segment whose exps xs keeps)
    total, top, seg_top = row_pass(0, OP, VEC, xs, x, res, res_out, w, b, out, base, chunks,
                                   shift=0.0, scale=0.0, seg_scale=0.0, col0=col0, w_ok=w_ok,
                                   EDGES=EDGES, SHIFT=SHIFT, DT=DT, XT=XT)  # fmt: skip
    if (EDGES or SHIFT > 0) and OP == "rms_norm_residual" and inside:
        ex = f32(DT(ex + er))  # normalize exactly what is stored
        res_out[at] = DT(ex)
    if (EDGES or SHIFT > 0) and OP == "softmax" and inside:
        top, total = merge_max_sum(top, total, ex, 1.0)
    elif (EDGES or SHIFT > 0) and OP == "layer_norm":
        total += ex
    elif EDGES or SHIFT > 0:
        total += ex * ex
    if OP == "softmax":
        top, total = block_max_sum(top, total, red0, red1)
        inv = 1.0 / total
        row_pass(1, OP, VEC, xs, x, res, res_out, w, b, out, base, chunks, shift=top, scale=inv,
                 seg_scale=kaio.exp(seg_top - top) * inv, col0=col0, w_ok=w_ok, EDGES=EDGES,
                 SHIFT=SHIFT, DT=DT, XT=XT)  # fmt: skip
        if (EDGES or SHIFT > 0) and inside:
            out[at] = DT(kaio.exp2_ftz((ex - top) * LOG2E) * inv)
    elif OP == "layer_norm":
        mean = block_sum(total, red0) / f32(n)
        sqdev, top, seg_top = row_pass(1, OP, VEC, xs, x, res, res_out, w, b, out, base, chunks,
                                       shift=mean, scale=0.0, seg_scale=0.0, col0=col0,
                                       w_ok=w_ok, EDGES=EDGES, SHIFT=SHIFT, DT=DT,
                                       XT=XT)  # fmt: skip
        if (EDGES or SHIFT > 0) and inside:
            sqdev += (ex - mean) * (ex - mean)
        scale = kaio.rsqrt(block_sum(sqdev, red1) / f32(n) + eps)
        row_pass(2, OP, VEC, xs, x, res, res_out, w, b, out, base, chunks, shift=mean,
                 scale=scale, seg_scale=0.0, col0=col0, w_ok=w_ok, EDGES=EDGES,
                 SHIFT=SHIFT, DT=DT, XT=XT)  # fmt: skip
        if (EDGES or SHIFT > 0) and inside:
            out[at] = DT((ex - mean) * scale * ew + eb)
    else:
        scale = kaio.rsqrt(block_sum(total, red0) / f32(n) + eps)
        row_pass(1, OP, VEC, xs, x, res, res_out, w, b, out, base, chunks, shift=0.0,
                 scale=scale, seg_scale=0.0, col0=col0, w_ok=w_ok, EDGES=EDGES,
                 SHIFT=SHIFT, DT=DT, XT=XT)  # fmt: skip
        if (EDGES or SHIFT > 0) and inside:
            out[at] = DT(ex * scale * ew)


def block_size(n: int, vec: int) -> int:
    """Threads per row: enough that each holds at most REGS elements, a power of two."""
    chunks_per_thread = REGS // vec
    threads = -(-(n // vec) // chunks_per_thread)
    return min(MAX_BLOCK, max(MIN_BLOCK, 1 << max(0, threads - 1).bit_length()))


def layout(op: str, n: int, x: _arrays.Operand, res=None, w=None, b=None):
    """``(VEC, EDGES, w_lead, SHIFT)`` for ``_rows`` on these operands: 16-byte chunks where
    every row and vector starts on a 16-byte boundary; else, for the ops in SHIFT_OPS when
    only x (and the residual, as far) start SHIFT elements past one and rows are whole chunks
    (two or more), chunks aligned with w and the outputs, x's realigned in registers
    (``fetch_shifted``); else, for the ops in EDGE_OPS when x (and the residual)
    start on one and b as far past one as w, chunks aligned in memory with the rows' edges
    apart (w_lead: w's elements past the boundary); else VEC 1."""
    vec = vector_width(*[a for a in (x, res, w, b) if a is not None], multiple_of=n)
    size = x.dtype.itemsize
    x_lead, res_lead, w_lead, b_lead = (
        a.ptr % VECTOR_BYTES if a is not None else None for a in (x, res, w, b)
    )
    full = VECTOR_BYTES // size
    if vec > 1:
        return vec, False, 0, 0
    if (
        op in SHIFT_OPS
        and n % full == 0
        and n >= 2 * full
        and x_lead % size == 0
        and res_lead in (None, x_lead)
        and not w_lead
        and not b_lead
    ):
        return full, False, 0, x_lead // size
    if op not in EDGE_OPS or x_lead or res_lead or (w_lead or 0) % size:
        return vec, False, 0, 0
    if b_lead not in (None, w_lead):
        return vec, False, 0, 0
    return full, True, (w_lead or 0) // size, 0


def launch_flags(op: str, vec: int, edges: bool, shift: int, size: int, threads: int):
    """``(WIDE, PACKED)`` for ``_rows``: launched with MAX_BLOCK threads under launch bounds
    (all but the aligned rows that keep f32 registers: there the bounds cost, H100, f32
    [4096, 16384] layer_norm 188 -> 216 µs); the row kept as DT (PACKED_OPS)."""
    kind = "scalar" if vec == 1 else "edges" if edges else "shift" if shift else "aligned"
    packed = threads == MAX_BLOCK and size == 2 and op in PACKED_OPS[kind]
    return threads == MAX_BLOCK and (kind != "aligned" or packed), packed


def _run(op: str, x: _arrays.Operand, res=None, w=None, b=None, eps: float = 0.0):
    """Launch ``_rows`` for ``op``; returns out (and the new residual for the residual op)."""
    out = _arrays.output(x)
    res_out = _arrays.output(x) if res is not None else None
    n = x.shape[-1]
    rows = x.size // n if n else 0
    if rows:
        vec, edges, w_lead, shift = layout(op, n, x, res, w, b)
        flat = x.arg(x.size)
        args = [a.arg(a.size) if a is not None else flat for a in (res, w, b)]
        outs = [
            _arrays.output_arg(x, o, (x.size,)) for o in (out, res_out if res is not None else out)
        ]
        wide, packed = launch_flags(op, vec, edges, shift, x.dtype.itemsize, block_size(n, vec))
        _rows[rows, block_size(n, vec), _arrays.stream_of(x)](
            flat, *args, *outs, n, eps, w_lead, OP=op, VEC=vec, EDGES=edges, SHIFT=shift,
            WIDE=wide, PACKED=packed, DT=x.dtype,
        )  # fmt: skip
    return out if res is None else (out, res_out)


def _row_inputs(op: str, x, *vectors):
    """Check x [..., N] and the named row vectors [N] given as (array, name) pairs."""
    inputs = _arrays.Inputs(op)
    a = inputs.array(x, "x", ndim=(1, 2, 3), form="[..., N]")
    n = a.shape[-1]
    return a, [inputs.array(v, name, ndim=1, shape=(n,), form="[N]") for v, name in vectors]


@planned("x", "w")
def rms_norm(x, w, eps: float = 1e-6):
    """RMS norm over the last axis: ``x / sqrt(mean(x**2) + eps) * w``, computed in f32.

    x: [..., N] (1-D to 3-D) f32, f16 or bf16; w: [N] of x's dtype. Returns a new array of
    x's shape, dtype and kind.
    """
    a, (wv,) = _row_inputs("rms_norm", x, (w, "w"))
    return _run("rms_norm", a, w=wv, eps=eps)


@planned("x", "residual", "w")
def rms_norm_residual(x, residual, w, eps: float = 1e-6):
    """The pre-norm transformer step in one pass: ``s = residual + x`` (rounded to the
    dtype), then ``(rms_norm(s, w, eps), s)``.

    x, residual: [..., N] of one shape and dtype (f32, f16, bf16); w: [N]. Returns the
    normalized output and the new residual, both new arrays of x's kind.
    """
    inputs = _arrays.Inputs("rms_norm_residual")
    a = inputs.array(x, "x", ndim=(1, 2, 3), form="[..., N]")
    r = inputs.array(residual, "residual", ndim=len(a.shape), shape=a.shape)
    wv = inputs.array(w, "w", ndim=1, shape=a.shape[-1:], form="[N]")
    return _run("rms_norm_residual", a, res=r, w=wv, eps=eps)


@planned("x", "w", "b")
def layer_norm(x, w, b, eps: float = 1e-5):
    """Layer norm over the last axis: ``(x - mean) / sqrt(var + eps) * w + b`` (biased
    variance, as torch), computed in f32 with the variance taken around the mean.

    x: [..., N] f32, f16 or bf16; w, b: [N] of x's dtype. Returns a new array like x.
    """
    a, (wv, bv) = _row_inputs("layer_norm", x, (w, "w"), (b, "b"))
    return _run("layer_norm", a, w=wv, b=bv, eps=eps)


@planned("x")
def softmax(x):
    """Softmax over the last axis, ``exp(x - max) / sum(exp(x - max))``, computed in f32;
    rows of any length. A row longer than a block's registers goes to a cluster of blocks
    on sm_90 (``kaio_ops._long_rows``: read once), else it is read twice.

    x: [..., N] (1-D to 3-D) f32, f16 or bf16. Returns a new array like x.
    """
    a, _ = _row_inputs("softmax", x)
    n = a.shape[-1]
    if n and a.size and _long_rows.available(a):
        vec = vector_width(a, multiple_of=n)
        plan = _long_rows.plan(n, a.dtype.itemsize, vec)
        if plan is not None:
            out = _arrays.output(a)
            _long_rows.softmax(a, out, plan)
            return out
    return _run("softmax", a)


def shipped():
    """(kernel, constexprs) of every specialization these ops launch (``_run``): each layout
    (VEC 1, aligned VEC > 1, EDGES, SHIFT 1 .. VEC - 1) on fewer than MAX_BLOCK threads and on
    MAX_BLOCK (``launch_flags``)."""
    for dtype in _arrays.FLOATS:
        full = widths(dtype)[-1]
        for op in OPS:
            kinds = [(1, False, 0), (full, False, 0)]
            if op in EDGE_OPS:
                kinds.append((full, True, 0))
            if op in SHIFT_OPS:
                kinds += [(full, False, shift) for shift in range(1, full)]
            for vec, edges, shift in kinds:
                flags = {
                    launch_flags(op, vec, edges, shift, dtype.itemsize, t) for t in (1, MAX_BLOCK)
                }
                for wide, packed in sorted(flags):
                    yield _rows, {
                        "OP": op, "VEC": vec, "EDGES": edges, "SHIFT": shift, "WIDE": wide,
                        "PACKED": packed, "DT": dtype,
                    }  # fmt: skip
