"""The mma.sync GEMM behind ``kaio_ops.matmul`` and ``kaio_ops.linear``: ``C = epilogue(A @ B)``
with A [M, K] and B either [K, N] (``BT == 0``, ``matmul``) or [N, K] (``BT == 1``, the
``nn.Linear`` weight layout, read as it is), f16 or bf16 in, f32 accumulators, the result
rounded once to the output element type ``OUT`` (f16, bf16 or f32) in the epilogue. The
element types are dtype constexprs: ``DT`` (A, B and the bias), ``OUT`` (C) and ``RT`` (the
residual).

The tile machinery is that of ``kaio_ops._matmul_kernels`` (its ``load_tiles``, ``mma_step``
and ``tile_origin``: a ``BM x BN`` block tile of ``WARPS_M x WARPS_N`` warps, K advanced
``BK`` at a time through XOR-swizzled shared tiles, a ``STAGES``-deep cp.async pipeline when
``ASYNC``, 16-byte copies when ``VEC``). What is new here:

- B [N, K] tiles are stored N x K and read with ``ldmatrix`` (no transpose): K-contiguous
  rows are exactly the ``mma`` B operand's "col" layout.
- ``GATE`` (``linear(..., activation="silu_gate")``, w = [gate; up], [2F, K]): each block
  multiplies A by the gate rows *and* the up rows of its F columns, into two accumulator sets
  (two shared B tiles, two fragment sets), so that each thread holds gate and up of the same
  outputs and the epilogue returns ``silu(gate) * up``.
- The epilogue (``epilogue``), in f32: ``+ bias[col]`` (``BIAS``), the activation ``ACT``
  ("none", "gelu" (erf), "gelu_tanh", "silu", "silu_gate"), ``+ residual[row, col]``
  (``RES``), then one rounding to ``OUT``.
- ``SPLIT > 1`` (small M): block z multiplies K slice z and writes its raw f32 partial tile
  (gate columns then up columns for ``GATE``) to a workspace [slices * M, N or 2N]; then
  with ``FIXUP`` the last of a tile's blocks to finish (``last_arrival``: an atomic count
  per tile) sums the slices in order (``sum_tile``) and applies the epilogue, else
  ``gemm_reduce`` does, a second kernel (``SPLIT`` its slice count). Either way the sum's
  order is fixed: deterministic run to run, and the same bits both ways."""

# ruff: noqa: F821  (DT, OUT, RT, BD and RD in annotations are dtype constexpr parameters)
from __future__ import annotations

import kaio
from kaio import bool_, f32, i32, u32
from kaio_ops._common import store_cols
from kaio_ops._matmul_kernels import (
    k_range,
    load_tiles,
    mma_step,
    slice_sum,
    tile_col,
    tile_origin,
    tile_row,
    warp_place,
)
from kaio_ops.elementwise import apply

ACTIVATIONS = ("none", "gelu", "gelu_tanh", "silu", "silu_gate")


@kaio.gpu_func
def epilogue(
    g: f32, u: f32, row: u32, col: u32, N: u32,
    bias: BD[:], res: RD[:, :],
    BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr, BD: kaio.constexpr,
    RD: kaio.constexpr,
) -> f32:  # fmt: skip
    """The epilogue of output (row, col) from its f32 sum ``g`` (and for "silu_gate" the up
    sum ``u``): + bias (elements of type BD), activation, + residual (of type RD), all in
    f32."""
    b = f32(0.0)
    bu = f32(0.0)
    r = f32(0.0)
    if BIAS:
        b = f32(bias[col])
        if ACT == "silu_gate":
            bu = f32(bias[N + col])
    if RES:
        r = f32(res[row, col])
    return activate(g, u, b, bu, r, BIAS, ACT, RES)


@kaio.gpu_func
def activate(
    g: f32, u: f32, b: f32, bu: f32, r: f32,
    BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr,
) -> f32:  # fmt: skip
    """``epilogue``'s arithmetic on loaded values: ``g`` (+ bias ``b``), the activation
    (for "silu_gate" of the up sum ``u`` + its bias ``bu``), + residual ``r``, in f32."""
    v = g
    if BIAS:
        v += b
    if ACT == "silu_gate":
        up = u
        if BIAS:
            up += bu
        v = apply("silu_gate", v, up)
    elif ACT == "silu":
        v = apply("silu_gate", v, 1.0)
    elif ACT == "gelu":
        v = apply("gelu_erf", v, 0.0)
    elif ACT == "gelu_tanh":
        v = apply("gelu_tanh", v, 0.0)
    if RES:
        v += r
    return v


@kaio.gpu_kernel
def gemm_kernel(
    a: DT[:], b: DT[:], c: OUT[:, :], ws: f32[:, :], bias: DT[:], res: RT[:, :],
    counters: i32[:], M: u32, N: u32, K: u32, k_slice: u32, BM: kaio.constexpr,
    BN: kaio.constexpr, BK: kaio.constexpr, WARPS_M: kaio.constexpr, WARPS_N: kaio.constexpr,
    STAGES: kaio.constexpr, ASYNC: kaio.constexpr, VEC: kaio.constexpr, BT: kaio.constexpr,
    SPLIT: kaio.constexpr, FIXUP: kaio.constexpr, BIAS: kaio.constexpr, ACT: kaio.constexpr,
    RES: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """C = epilogue(A @ B) (module docstring): block x computes C tile x (grouped order,
    ``tile_origin``), or with a K split (``SPLIT > 1``) block (x, z) the raw partial tile
    of K slice z into ``ws``. A comes flat [M, K]; B flat [K, N] (BT 0) or [N, K] (BT 1;
    [2N, K] for "silu_gate", gate rows then up rows)."""
    kaio.launch_bounds(WARPS_M * WARPS_N * 32)
    GATE = ACT == "silu_gate"
    THREADS = WARPS_M * WARPS_N * 32
    KSTEPS = BK // 16
    WTM = BM // WARPS_M
    WTN = BN // WARPS_N
    MI = WTM // 16
    NI = WTN // 8
    origin = tile_origin(kaio.block_idx_x(), (M + BM - 1) // BM, (N + BN - 1) // BN)
    m0 = tile_row(origin) * BM
    n0 = tile_col(origin) * BN
    tid, lane, wm, wn = warp_place(WARPS_N, WTM, WTN)
    k_begin, k_end, tiles = k_range(k_slice, K, BK)

    a_s = kaio.shared_dynamic(DT, (STAGES, BM, BK), 0)
    B_ROWS = BN if BT else BK
    B_COLS = BK if BT else BN
    b_s = kaio.shared_dynamic(DT, (STAGES, B_ROWS, B_COLS), STAGES * BM * BK * 2)
    # the up rows' tile ("silu_gate"; otherwise a one-element placeholder)
    u_s = kaio.shared_dynamic(
        DT,
        (STAGES, B_ROWS, B_COLS) if GATE else (1, 1, 8),
        STAGES * (BM + BN) * BK * 2,
    )
    arrived = kaio.shared_dynamic(
        u32, (4,), STAGES * (BM + BN) * BK * 2 + (STAGES * BN * BK * 2 if GATE else 16)
    )

    acc = kaio.local(f32, (MI, NI, 2, 2))
    acc_u = kaio.local(f32, (MI if GATE else 1, NI if GATE else 1, 2, 2))
    for mi in kaio.static_range(MI):
        for ni in kaio.static_range(NI):
            for e in kaio.static_range(4):
                acc[mi, ni, e // 2, e % 2] = 0
                if GATE:
                    acc_u[mi, ni, e // 2, e % 2] = 0
    a_frag = kaio.local(u32, (2, MI, 4))
    b_frag = kaio.local(u32, (2, NI // 2, 2, 2))
    u_frag = kaio.local(u32, (2, NI // 2 if GATE else 1, 2, 2))
    stage = u32(0)

    if ASYNC:
        # the pipeline of _matmul_kernels.matmul_tile: STAGES tiles in flight, fragments
        # double-buffered, a stage refilled right after its last fragments are read
        for s in kaio.static_range(STAGES):
            load_tiles(1, a_s, b_s, u_s, a, b, s, m0, n0, k_begin + s * BK, k_end, M, N, K, tid,
                       BM, BN, BK, THREADS, VEC, ASYNC, 0, DT, BT, GATE)  # fmt: skip
            kaio.cp_async_commit()
        kaio.cp_async_wait(STAGES - 1)
        kaio.sync_threads()
        fragments(a_frag, b_frag, u_frag, 0, a_s, b_s, u_s, stage, 0, wm, wn, lane, MI, NI, BT,
                  GATE, DT)  # fmt: skip
        for t in range(tiles):
            for ks in kaio.static_range(KSTEPS):
                if ks == KSTEPS - 1:
                    kaio.cp_async_wait(STAGES - 2)
                    kaio.sync_threads()
                    load_tiles(1, a_s, b_s, u_s, a, b, stage, m0, n0,
                               k_begin + (t + STAGES) * BK, k_end, M, N, K, tid, BM, BN, BK,
                               THREADS, VEC, ASYNC, 0, DT, BT, GATE)  # fmt: skip
                    kaio.cp_async_commit()
                    stage = kaio.select(stage == STAGES - 1, 0, stage + 1)
                    fragments(a_frag, b_frag, u_frag, (ks + 1) % 2, a_s, b_s, u_s, stage, 0, wm,
                              wn, lane, MI, NI, BT, GATE, DT)  # fmt: skip
                else:
                    fragments(a_frag, b_frag, u_frag, (ks + 1) % 2, a_s, b_s, u_s, stage,
                              (ks + 1) * 16, wm, wn, lane, MI, NI, BT, GATE, DT)  # fmt: skip
                mma_step(acc, a_frag, b_frag, ks % 2, MI, NI, DT, f32)
                if GATE:
                    mma_step(acc_u, a_frag, u_frag, ks % 2, MI, NI, DT, f32)
    else:
        # one stage through registers (GPUs without cp.async)
        for t in range(tiles):
            kaio.sync_threads()
            load_tiles(1, a_s, b_s, u_s, a, b, 0, m0, n0, k_begin + t * BK, k_end, M, N, K, tid,
                       BM, BN, BK, THREADS, VEC, ASYNC, 0, DT, BT, GATE)  # fmt: skip
            kaio.sync_threads()
            for ks in kaio.static_range(KSTEPS):
                fragments(a_frag, b_frag, u_frag, 0, a_s, b_s, u_s, 0, ks * 16, wm, wn, lane,
                          MI, NI, BT, GATE, DT)  # fmt: skip
                mma_step(acc, a_frag, b_frag, 0, MI, NI, DT, f32)
                if GATE:
                    mma_step(acc_u, a_frag, u_frag, 0, MI, NI, DT, f32)

    # Lane (g, t) holds columns 2t, 2t + 1 of n8 tile p, rows g and g + 8 of 16-row tile mi.
    for mi in kaio.static_range(MI):
        for p in kaio.static_range(NI):
            col = n0 + wn + p * 8 + lane % 4 * 2
            for h in kaio.static_range(2):
                row = m0 + wm + mi * 16 + lane // 4 + h * 8
                u0 = f32(0.0)
                u1 = f32(0.0)
                if GATE:
                    u0 = acc_u[mi, p, h, 0]
                    u1 = acc_u[mi, p, h, 1]
                store_pair(c, ws, bias, res, acc[mi, p, h, 0], acc[mi, p, h, 1], u0, u1, row, col,
                           M, N, SPLIT, BIAS, ACT, RES, DT, OUT, RT)  # fmt: skip
    if FIXUP:  # the last of the tile's grid.z blocks to finish sums the slices, in order
        if last_arrival(counters, kaio.block_idx_x(), kaio.grid_dim_z(), arrived, tid):
            sum_tile(c, ws, bias, res, m0, n0, M, N, kaio.grid_dim_z(), tid, THREADS, BM, BN,
                     BIAS, ACT, RES, DT, OUT, RT)  # fmt: skip


@kaio.gpu_func
def last_arrival(counters: i32[:], slot: u32, total: u32, arrived: u32[:], t: u32) -> bool_:
    """Called by every thread of a block once its partial sums are stored: counts the
    block's arrival at ``counters[slot]`` and returns whether it is the last of the ``total``
    blocks of that slot (then, with the others' stores visible to it, it resets the count
    to 0 for the next launch on the stream). ``arrived``: a shared u32 of scratch."""
    kaio.threadfence()
    kaio.sync_threads()
    if t == 0:
        arrived[0] = u32(kaio.atomic_add(counters, slot, 1))
    kaio.sync_threads()
    last = arrived[0] == total - 1
    if last:
        kaio.threadfence()
        if t == 0:
            counters[slot] = 0
    return last


@kaio.gpu_func
def sum_tile(
    c: OUT[:, :], ws: f32[:, :], bias: DT[:], res: RT[:, :],
    m0: u32, n0: u32, M: u32, N: u32, nz: u32, t: u32,
    THREADS: kaio.constexpr, BM: kaio.constexpr, BN: kaio.constexpr, BIAS: kaio.constexpr,
    ACT: kaio.constexpr, RES: kaio.constexpr, DT: kaio.constexpr, OUT: kaio.constexpr,
    RT: kaio.constexpr,
):  # fmt: skip
    """The K split's sum in the last block of tile (m0, n0), by every thread of the block:
    elements t, t + THREADS, ... of the tile's rows inside C (a row's columns adjacent, so
    the loads coalesce), each the sum of its ``nz`` slices in ``ws`` in slice order, through
    ``epilogue``: the same bits as ``gemm_reduce``. A thread takes ``E`` elements at a time
    and issues the loads of 4 slices of all of them before adding (``E * 4`` loads in
    flight: the sum is a chain of L2 round trips, one per 4 slices of ``E`` elements)."""
    GATE = ACT == "silu_gate"
    E = 4 if GATE else 8  # elements a thread sums at once
    count = kaio.min(M - m0, BM) * BN
    got = kaio.local(f32, (2 if GATE else 1, 4, E))
    sums = kaio.local(f32, (2, E))
    base = t
    while base < count:
        z0 = u32(0)
        while z0 < nz:
            for e in kaio.static_range(E):
                i = base + e * THREADS
                row = m0 + i // BN
                col = n0 + i % BN
                for zz in kaio.static_range(4):
                    got[0, zz, e] = f32(0.0)
                    if GATE:
                        got[1, zz, e] = f32(0.0)
                    if i < count and col < N and z0 + zz < nz:
                        got[0, zz, e] = ws[(z0 + zz) * M + row, col]
                        if GATE:
                            got[1, zz, e] = ws[(z0 + zz) * M + row, N + col]
            for e in kaio.static_range(E):
                for zz in kaio.static_range(4):
                    if zz == 0 and z0 == 0:
                        sums[0, e] = got[0, 0, e]
                        sums[1, e] = f32(0.0)
                        if GATE:
                            sums[1, e] = got[1, 0, e]
                    elif z0 + zz < nz:
                        sums[0, e] += got[0, zz, e]
                        if GATE:
                            sums[1, e] += got[1, zz, e]
            z0 += 4
        for e in kaio.static_range(E):
            i = base + e * THREADS
            row = m0 + i // BN
            col = n0 + i % BN
            if i < count and col < N:
                v = epilogue(sums[0, e], sums[1, e], row, col, N, bias, res, BIAS, ACT, RES, DT, RT)
                c[row, col] = OUT(v)
        base += THREADS * E


@kaio.gpu_func
def store_pair(
    c: OUT[:, :], ws: f32[:, :], bias: DT[:], res: RT[:, :],
    g0: f32, g1: f32, u0: f32, u1: f32, row: u32, col: u32, M: u32, N: u32,
    SPLIT: kaio.constexpr, BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr,
    DT: kaio.constexpr, OUT: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """Outputs (row, col) and (row, col + 1) (col even) from their f32 sums g0, g1 (and up
    sums u0, u1 for "silu_gate"), where inside C: with a K split (``SPLIT > 1``) the raw sums
    into this slice's rows of ``ws`` (up sums N columns right), else through ``epilogue``,
    rounded to OUT and stored (one 2-element store when N is even)."""
    if row < M:
        if SPLIT > 1:
            at = kaio.block_idx_z() * M + row
            if col < N:
                ws[at, col] = g0
                if ACT == "silu_gate":
                    ws[at, N + col] = u0
            if col + 1 < N:
                ws[at, col + 1] = g1
                if ACT == "silu_gate":
                    ws[at, N + col + 1] = u1
        else:
            pair = kaio.local(OUT, 2)
            pair[0] = OUT(epilogue(g0, u0, row, kaio.min(col, N - 1), N, bias, res, BIAS, ACT,
                                   RES, DT, RT))  # fmt: skip
            pair[1] = OUT(epilogue(g1, u1, row, kaio.min(col + 1, N - 1), N, bias, res, BIAS, ACT,
                                   RES, DT, RT))  # fmt: skip
            # N even: two adjacent columns, 2 * OUT.itemsize aligned
            store_cols(c, row, col, pair, N, N % 2 == 0, 2, OUT)


@kaio.gpu_func
def fragments(
    a_frag: u32[:, :, :], b_frag: u32[:, :, :, :], u_frag: u32[:, :, :, :], BUF: kaio.constexpr,
    a_s: DT[:, :, :], b_s: DT[:, :, :], u_s: DT[:, :, :], stage: u32, KK: kaio.constexpr,
    wm: u32, wn: u32, lane: u32, MI: kaio.constexpr, NI: kaio.constexpr, BT: kaio.constexpr,
    GATE: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """This warp's A and B (and up-row) fragments of the k16 step at KK of ``stage`` into
    buffer BUF: A and B [N, K] with ``ldmatrix`` (matrices (n 0-7, k lo), (n 0-7, k hi),
    (n 8-15, k lo), (n 8-15, k hi): the B registers of two n8 tiles), B [K, N] with
    ``ldmatrix_trans``."""
    for mi in kaio.static_range(MI):
        col = kaio.swizzle(a_s, lane % 16, KK + lane // 16 * 8)
        kaio.ldmatrix(a_frag[BUF, mi], a_s, (stage, wm + mi * 16 + lane % 16, col))
    for nj in kaio.static_range(NI // 2):
        if BT:
            col = kaio.swizzle(b_s, lane % 8, KK + lane // 8 % 2 * 8)
            row = wn + nj * 16 + lane // 16 * 8 + lane % 8
            kaio.ldmatrix(b_frag[BUF, nj], b_s, (stage, row, col))
            if GATE:
                kaio.ldmatrix(u_frag[BUF, nj], u_s, (stage, row, col))
        else:
            col = kaio.swizzle(b_s, lane % 16, wn + nj * 16 + lane // 16 * 8)
            kaio.ldmatrix_trans(b_frag[BUF, nj], b_s, (stage, KK + lane % 16, col))


@kaio.gpu_kernel
def gemm_reduce(
    ws: f32[:, :], c: OUT[:, :], bias: DT[:], res: RT[:, :],
    M: u32, N: u32,
    SPLIT: kaio.constexpr, BIAS: kaio.constexpr, ACT: kaio.constexpr, RES: kaio.constexpr,
    DT: kaio.constexpr, OUT: kaio.constexpr, RT: kaio.constexpr,
):  # fmt: skip
    """c = epilogue(the sum of the SPLIT partial products stacked in ws [SPLIT * M, N], or
    [SPLIT * M, 2N] gate then up for "silu_gate"), summed in slice order: one thread per
    element of c [M, N]."""
    i = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    if i < M * N:
        row = i // N
        col = i % N
        u = f32(0.0)
        if ACT == "silu_gate":
            u = slice_sum(ws, row, N + col, M, SPLIT)
        g = slice_sum(ws, row, col, M, SPLIT)
        c[row, col] = OUT(epilogue(g, u, row, col, N, bias, res, BIAS, ACT, RES, DT, RT))


GEMM = gemm_kernel  # the names the ops launch: kernels generic over DT, OUT and RT
REDUCE = gemm_reduce
