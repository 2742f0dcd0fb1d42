"""Hopper builtins (docs/hopper.md): TMA tile copies with their swizzles, mbarrier phases,
shared-memory descriptors, wgmma, and the Hopper matmul. Each kernel runs in the simulator
against an independent NumPy reference (the swizzle and accumulator layouts are written here
from the PTX ISA, not taken from the simulator), its PTX assembles for sm_90a, other targets
are CompileErrors, and on an sm_90 GPU it is bit-exact with the simulator (integer-valued
inputs make every f32 sum exact, whatever the hardware's order).
"""

from __future__ import annotations

import importlib
import re

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio import f16, f32, i32, u32, u64
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _matmul_hopper
from tests.harness import covered

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
RNG = np.random.default_rng(90)


def _hopper_gpu() -> bool:
    return kaio.gpu_available() and kaio.device().arch == "sm_90"


needs_hopper = pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")


# --------------------------------------------------------------------------- kernels

TMA_CORNERS = [(0, 0), (80, 152), (-5, -8)]
"""Box corners: inside, over the bottom-right edges, over the top-left edges (columns 16-byte
aligned, as TMA needs)."""


@kaio.gpu_func
def load_box(
    tile: f16[:, :], tmap: kaio.tensormap, row: i32, col: i32, bars: u64[:], R: kaio.constexpr
):
    """Arm the barrier and issue one R x 64 box (a device function taking a tensor map)."""
    kaio.mbarrier_arrive_expect_tx(bars, 0, R * 64 * 2)
    kaio.tma_load_2d(tile, (0, 0), tmap, row, col, bars, 0)


@kaio.gpu_kernel(block_size=128)
def tma_tile(tmap: kaio.tensormap, out: f16[:, :], row: i32, col: i32, R: kaio.constexpr):
    """One TMA box into a shared tile, then every thread copies the raw tile out."""
    tile = kaio.shared(f16, (R, 64))
    bars = kaio.shared(u64, (1,))
    t = kaio.thread_idx_x()
    if t == 0:
        kaio.mbarrier_init(bars, 0, 1)
    kaio.sync_threads()
    if t == 0:
        load_box(tile, tmap, row, col, bars, R)
    kaio.mbarrier_wait(bars, 0, 0)
    for i in range(t, R * 64, 128):
        out[i // 64, i % 64] = tile[i // 64, i % 64]


@kaio.gpu_kernel(block_size=64)
def multicast_halves(
    tmap: kaio.tensormap, out: f16[:, :, :], done: u32[:], row: i32, col: i32, ctas: u32
):
    """A cluster of 2: block r loads rows 32 r.. of a 64 x 64 box into both blocks' tiles
    (multicast); each copies its whole tile to out[r]. Then thread 0 of both blocks arrives on
    bars[1] of rank 1 (count 2): done[r] says whether block r's barrier completed (1: rank 1's,
    with one arrival from the other block; 0: rank 0's, which nothing arrived on)."""
    kaio.cluster_dims(2)
    tile = kaio.shared(f16, (64, 64))
    bars = kaio.shared(u64, (2,))
    t = kaio.thread_idx_x()
    rank = kaio.cluster_rank()
    if t == 0:
        kaio.mbarrier_init(bars, 0, 1)
        kaio.mbarrier_init(bars, 1, 2)
        kaio.fence_proxy_async()
    kaio.cluster_sync()
    if t == 0:
        kaio.mbarrier_arrive_expect_tx(bars, 0, 64 * 64 * 2)
        r = i32(rank) * 32
        kaio.tma_load_2d_multicast(tile, (r, 0), tmap, row + r, col, bars, 0, ctas)
    kaio.mbarrier_wait(bars, 0, 0)
    for i in range(t, 64 * 64, 64):
        out[rank, i // 64, i % 64] = tile[i // 64, i % 64]
    if t == 0:
        kaio.mbarrier_arrive_cluster(bars, 1, 1)
    kaio.cluster_sync()
    if t == 0:
        done[rank] = u32(kaio.mbarrier_try_wait(bars, 1, 0))
    kaio.cluster_sync()


@kaio.gpu_kernel(block_size=32)
def arrive_far(out: u32[:], rank: u32):
    """Arrive on the barrier of block ``rank`` of a cluster of 2."""
    kaio.cluster_dims(2)
    bars = kaio.shared(u64, (1,))
    if kaio.thread_idx_x() == 0:
        kaio.mbarrier_init(bars, 0, 1)
    kaio.cluster_sync()
    if kaio.thread_idx_x() == 0:
        kaio.mbarrier_arrive_cluster(bars, 0, rank)
    kaio.cluster_sync()
    out[kaio.block_idx_x()] = 1


@kaio.gpu_kernel(block_size=128)
def tma_func_without_map(out: f16[:, :], addr: u64):
    tile = kaio.shared(f16, (32, 64))
    bars = kaio.shared(u64, (1,))
    load_box(tile, addr, 0, 0, bars, 32)


@kaio.gpu_kernel(block_size=64)
def bulk_rows(src: f32[:, :], out: f32[:, :], n: u32):
    """Each thread stages row t of src (times 2) in shared memory, then bulk-stores its
    first n values to row t of out: two copies, the second of the row's last 8 values."""
    rows = kaio.shared(f32, (64, 36))  # 144-byte rows: 16-byte aligned
    t = kaio.thread_idx_x()
    for c in range(32):
        rows[t, c] = src[t, c] * 2.0
    kaio.fence_proxy_async()
    kaio.bulk_store(out, (t, 0), rows, (t, 0), (n - 8) * 4)
    kaio.bulk_store(out, (t, n - 8), rows, (t, n - 8), 32)
    kaio.bulk_commit()
    kaio.bulk_wait_read(0)
    kaio.bulk_wait(0)


@kaio.gpu_kernel(block_size=64)
def bulk_add_rows(src: f32[:, :], out: f32[:, :]):
    """Block b stages src times b + 1 in shared memory and adds row t to row t of out
    (bulk_reduce_add): two blocks add to the same rows."""
    rows = kaio.shared(f32, (64, 36))
    t = kaio.thread_idx_x()
    for c in range(32):
        rows[t, c] = src[t, c] * f32(kaio.block_idx_x() + 1)
    kaio.fence_proxy_async()
    kaio.bulk_reduce_add(out, (t, 0), rows, (t, 0), 32 * 4)
    kaio.bulk_commit()
    kaio.bulk_wait(0)


@kaio.gpu_kernel(block_size=64)
def prefetched_copy(src: f32[:, :], out: f32[:, :]):
    """Thread t asks for row t of src in L2 (a hint, its size known at run time), then copies
    it to out."""
    t = kaio.thread_idx_x()
    kaio.prefetch_l2(src, (t, 0), u32(src.shape[1]) * 4)
    for c in range(32):
        out[t, c] = src[t, c]


@kaio.gpu_kernel(block_size=32)
def prefetched_runs(src: f32[:], out: f32[:], at: u32):
    """Thread t asks for the 64 bytes of src from element at + 16 t in L2 (a compile-time
    size: cp.async.bulk.prefetch.L2), then copies element at + t to out."""
    t = kaio.thread_idx_x()
    kaio.prefetch_l2(src, at + 16 * t, 64)
    out[t] = src[at + t]


@kaio.gpu_kernel(block_size=128)
def dependent_step(src: f32[:], out: f32[:], n: u32):
    """out = src + 1, launched while the kernel before it may still run (programmatic
    dependent launch): the next kernel let launch at once, src read only after the wait."""
    kaio.launch_dependents()
    kaio.grid_dependency_wait()
    i = kaio.block_idx_x() * 128 + kaio.thread_idx_x()
    if i < n:
        out[i] = src[i] + 1.0


@kaio.gpu_kernel(block_size=32)
def bulk_misaligned(out: f32[:, :], nbytes: u32):
    rows = kaio.shared(f32, (4, 8))
    kaio.bulk_store(out, (0, 1), rows, (0, 0), nbytes)


@kaio.gpu_kernel(block_size=64)
def barrier_phases(out: u32[:]):
    """A barrier of count 64 through three phases: try_wait before and after each."""
    bars = kaio.shared(u64, (1,))
    t = kaio.thread_idx_x()
    if t == 0:
        kaio.mbarrier_init(bars, 0, 64)
    kaio.sync_threads()
    for p in kaio.static_range(3):
        before = kaio.mbarrier_try_wait(bars, 0, p % 2)
        if t == 0:
            kaio.mbarrier_expect_tx(bars, 0, 0)
        kaio.mbarrier_arrive(bars, 0)
        kaio.mbarrier_wait(bars, 0, p % 2)
        after = kaio.mbarrier_try_wait(bars, 0, p % 2)
        older = kaio.mbarrier_try_wait(bars, 0, (p + 1) % 2)
        out[t * 9 + p * 3] = u32(before)
        out[t * 9 + p * 3 + 1] = u32(after)
        out[t * 9 + p * 3 + 2] = u32(older)
        kaio.sync_threads()


@kaio.gpu_kernel(block_size=64)
def role_split(x: f32[:], out: f32[:], n: u32, SPIN: kaio.constexpr):
    """Warp 1 produces items 0..n-1 into a ring of 2 shared slots, warp 0 consumes them:
    each role in a loop of its own, in the two branches of one if (a role split). The
    consumer waits with mbarrier_wait (SPIN 0), spins on mbarrier_try_wait (1), or lets
    lane 0 spin on it inside an if of its own and then syncs the warp (2)."""
    ring = kaio.shared(f32, (2, 32))
    bars = kaio.shared(u64, (2, 2))  # [0, s]: slot s full, [1, s]: slot s free again
    t = kaio.thread_idx_x()
    lane = t % 32
    if t < 2:
        kaio.mbarrier_init(bars, (0, t), 32)
        kaio.mbarrier_init(bars, (1, t), 32)
    kaio.sync_threads()
    if t < 32:  # the consumer
        for i in range(n):
            if SPIN == 1:
                while not kaio.mbarrier_try_wait(bars, (0, i % 2), (i // 2) % 2):
                    pass
            elif SPIN == 2:
                if lane == 0:
                    while not kaio.mbarrier_try_wait(bars, (0, i % 2), (i // 2) % 2):
                        pass
                kaio.sync_warp()
            else:
                kaio.mbarrier_wait(bars, (0, i % 2), (i // 2) % 2)
            out[i * 32 + lane] = ring[i % 2, lane] * 2.0
            kaio.mbarrier_arrive(bars, (1, i % 2))
    else:  # the producer
        for i in range(n):
            if i >= 2:  # the slot held item i - 2
                kaio.mbarrier_wait(bars, (1, i % 2), (i // 2 - 1) % 2)
            ring[i % 2, lane] = x[i * 32 + lane]
            kaio.mbarrier_arrive(bars, (0, i % 2))


@kaio.gpu_kernel(block_size=64)
def waits_for_each_other(out: u32[:]):
    """Each role waits for the other's first arrival before making its own: a deadlock."""
    bars = kaio.shared(u64, (2,))
    t = kaio.thread_idx_x()
    if t < 2:
        kaio.mbarrier_init(bars, t, 32)
    kaio.sync_threads()
    if t < 32:
        kaio.mbarrier_wait(bars, 0, 0)
        kaio.mbarrier_arrive(bars, 1)
    else:
        kaio.mbarrier_wait(bars, 1, 0)
        kaio.mbarrier_arrive(bars, 0)
    out[t] = 1


@kaio.gpu_kernel(block_size=32)
def never_arrives(out: u32[:]):
    bars = kaio.shared(u64, (1,))
    if kaio.thread_idx_x() == 0:
        kaio.mbarrier_init(bars, 0, 1)
    kaio.sync_threads()
    kaio.mbarrier_wait(bars, 0, 0)
    out[0] = 1


@kaio.gpu_kernel(block_size=128)
def dynamic_tile(tmap: kaio.tensormap):
    """A TMA copy into a dynamic tile of a kernel with a static array: refused."""
    tile = kaio.shared_dynamic(f16, (64, 64), 0)
    bars = kaio.shared(u64, (1,))
    if kaio.thread_idx_x() == 0:
        kaio.mbarrier_init(bars, 0, 1)
        kaio.mbarrier_arrive_expect_tx(bars, 0, 8192)
        kaio.tma_load_2d(tile, (0, 0), tmap, 0, 0, bars, 0)


@kaio.gpu_kernel(block_size=32)
def descriptor_bits(out: u64[:]):
    tile = kaio.shared(f16, (4, 64, 64))
    out[0] = kaio.smem_descriptor(tile, (1, 8, 16), 128, 8192, 1024)
    out[1] = kaio.smem_descriptor(tile, (0, 0, 0), 0, 16, 128)


@kaio.gpu_kernel(block_size=128)
def wgmma_tile(
    ta: kaio.tensormap,
    tb: kaio.tensormap,
    out: f32[:, :],
    K: kaio.constexpr,
    N: kaio.constexpr,
    SW: kaio.constexpr,
    B_NMAJOR: kaio.constexpr,
    BF16: kaio.constexpr,
):
    """A (64 x K, K-major) and B (K x N, N-major or K-major) loaded by TMA with swizzle SW,
    multiplied by K/16 wgmmas, the accumulators stored by the documented layout."""
    CE = SW // 2 if SW else 8  # elements per row of a TMA box
    sa = kaio.shared(f16, (K // CE, 64, CE))
    if B_NMAJOR:
        sb = kaio.shared(f16, (N // CE, K, CE))
    else:
        sb = kaio.shared(f16, (K // CE, N, CE))
    bars = kaio.shared(u64, (1,))
    t = kaio.thread_idx_x()
    if t == 0:
        kaio.mbarrier_init(bars, 0, 1)
    kaio.sync_threads()
    if t == 0:
        kaio.mbarrier_arrive_expect_tx(bars, 0, (64 * K + K * N) * 2)
        for c in kaio.static_range(K // CE):
            kaio.tma_load_2d(sa, (c, 0, 0), ta, 0, c * CE, bars, 0)
        for c in kaio.static_range((N if B_NMAJOR else K) // CE):
            kaio.tma_load_2d(sb, (c, 0, 0), tb, 0, c * CE, bars, 0)
    kaio.mbarrier_wait(bars, 0, 0)
    acc = kaio.local(f32, (N // 2,))
    kaio.wgmma_fence()
    for kk in kaio.static_range(K // 16):
        ca, wa = kk * 16 // CE, kk * 16 % CE
        if SW:
            da = kaio.smem_descriptor(sa, (ca, 0, wa), SW, 16, 8 * SW)
        else:
            da = kaio.smem_descriptor(sa, (ca, 0, 0), 0, 64 * 16, 128)
        if B_NMAJOR and SW:
            db = kaio.smem_descriptor(sb, (0, kk * 16, 0), SW, K * SW, 8 * SW)
        elif B_NMAJOR:
            db = kaio.smem_descriptor(sb, (0, kk * 16, 0), 0, 128, K * 16)
        elif SW:
            db = kaio.smem_descriptor(sb, (ca, 0, wa), SW, 16, 8 * SW)
        else:
            db = kaio.smem_descriptor(sb, (ca, 0, 0), 0, N * 16, 128)
        if BF16:
            kaio.wgmma_bf16(acc, da, db, kk > 0, False, B_NMAJOR)
        else:
            kaio.wgmma_f16(acc, da, db, kk > 0, False, B_NMAJOR)
    kaio.wgmma_commit()
    kaio.wgmma_wait(0)
    w, lane = t // 32, t % 32
    for r in kaio.static_range(N // 2):
        out[16 * w + lane // 4 + 8 * (r % 4 // 2), 8 * (r // 4) + 2 * (lane % 4) + r % 2] = acc[r]


@kaio.gpu_kernel(block_size=128)
def wgmma_stored(
    a: f16[:, :], b: f16[:, :], out: f32[:, :], FENCE: kaio.constexpr, SYNC: kaio.constexpr
):
    """A (64 x 16) and B (16 x 8) written to shared memory by ordinary stores in the
    non-swizzled K-major core-matrix layout, made visible to the asynchronous proxy when
    FENCE, a barrier when SYNC, then one wgmma m64n8k16."""
    sa = kaio.shared(f16, (2, 64, 8))  # sa[c, r, e] = A[r, 8c + e]
    sb = kaio.shared(f16, (2, 8, 8))  # sb[c, n, e] = B[8c + e, n]
    t = kaio.thread_idx_x()
    for c in kaio.static_range(2):
        for e in kaio.static_range(8):
            if t < 64:
                sa[c, t, e] = a[t, 8 * c + e]
            elif t < 72:
                sb[c, t - 64, e] = b[8 * c + e, t - 64]
    if FENCE:
        kaio.fence_proxy_async()
    if SYNC:
        kaio.sync_threads()
    acc = kaio.local(f32, (4,))
    kaio.wgmma_fence()
    da = kaio.smem_descriptor(sa, (0, 0, 0), 0, 64 * 16, 128)
    db = kaio.smem_descriptor(sb, (0, 0, 0), 0, 8 * 16, 128)
    kaio.wgmma_f16(acc, da, db, False, False, False)
    kaio.wgmma_commit()
    kaio.wgmma_wait(0)
    w, lane = t // 32, t % 32
    for r in kaio.static_range(4):
        out[16 * w + lane // 4 + 8 * (r // 2), 2 * (lane % 4) + r % 2] = acc[r]


@kaio.gpu_kernel(block_size=128)
def wgmma_registers(
    a: f16[:, :], tb: kaio.tensormap, out: f32[:, :], K: kaio.constexpr, N: kaio.constexpr,
    BF16: kaio.constexpr,
):  # fmt: skip
    """A (64 x K) read from global memory into registers by the m16n8k16 A layout (written
    here from the PTX ISA), B (K x N, N-major, 128-byte swizzle, N <= 64) loaded by TMA, then
    K/16 wgmmas with A from registers."""
    sb = kaio.shared(f16, (K, 64))
    bars = kaio.shared(u64, (1,))
    t = kaio.thread_idx_x()
    init_barrier(bars)
    if t == 0:
        load_box(sb, tb, 0, 0, bars, K)
    w, lane = t // 32, t % 32
    frag = kaio.local(u32, (K // 16, 4))
    for kk in kaio.static_range(K // 16):
        for r in kaio.static_range(4):
            row = 16 * w + lane // 4 + 8 * (r % 2)
            col = 16 * kk + 2 * (lane % 4) + 8 * (r // 2)
            lo = kaio.bitcast(a[row, col], kaio.u16)
            hi = kaio.bitcast(a[row, col + 1], kaio.u16)
            frag[kk, r] = u32(lo) | u32(hi) << 16
    kaio.mbarrier_wait(bars, 0, 0)
    acc = kaio.local(f32, (N // 2,))
    kaio.wgmma_fence()
    for kk in kaio.static_range(K // 16):
        db = kaio.smem_descriptor(sb, (kk * 16, 0), 128, 8192, 1024)
        if BF16:
            kaio.wgmma_bf16(acc, frag[kk], db, kk > 0, False, True)
        else:
            kaio.wgmma_f16(acc, frag[kk], db, kk > 0, False, True)
    kaio.wgmma_commit()
    kaio.wgmma_wait(0)
    for r in kaio.static_range(N // 2):
        out[16 * w + lane // 4 + 8 * (r % 4 // 2), 8 * (r // 4) + 2 * (lane % 4) + r % 2] = acc[r]


@kaio.gpu_func
def write_rows(rows: f32[:, :], t: u32):
    """Thread t writes row t of 4 (the values 4 t .. 4 t + 3) and fences."""
    for c in kaio.static_range(4):
        rows[t, c] = f32(t * 4 + c)
    kaio.fence_proxy_async()


@kaio.gpu_kernel(block_size=32)
def bulk_of_all_rows(out: f32[:, :], SYNC: kaio.constexpr):
    """Each thread writes and fences its row of 4; then (after a barrier when SYNC) thread 0
    bulk-stores all 32 rows, written by the others."""
    rows = kaio.shared(f32, (32, 4))
    t = kaio.thread_idx_x()
    write_rows(rows, t)
    if SYNC:
        kaio.sync_threads()
    if t == 0:
        kaio.bulk_store(out, (0, 0), rows, (0, 0), 32 * 4 * 4)
        kaio.bulk_commit()
        kaio.bulk_wait(0)


@kaio.gpu_kernel(block_size=32)
def bulk_after_write(out: f32[:, :], LATE: kaio.constexpr):
    """Each thread writes its row of 4, fences, then (LATE) writes one value again before its
    bulk_store of the row."""
    rows = kaio.shared(f32, (32, 4))
    t = kaio.thread_idx_x()
    write_rows(rows, t)
    if LATE:
        rows[t, 3] = 0.5
    kaio.bulk_store(out, (t, 0), rows, (t, 0), 16)
    kaio.bulk_commit()
    kaio.bulk_wait(0)


@kaio.gpu_func
def init_barrier(bars: u64[:]):
    """mbarrier 0 of ``bars`` expects one arrival: initialized by thread 0, then a barrier
    so that every thread sees it."""
    if kaio.thread_idx_x() == 0:
        kaio.mbarrier_init(bars, 0, 1)
    kaio.sync_threads()


@kaio.gpu_func
def land_and_copy(
    tile: f16[:, :], tmap: kaio.tensormap, row: i32, bars: u64[:], phase: u32, out: f16[:, :]
):
    """Thread 0 loads the 32 x 64 box at [row, 0] into ``tile``; once barrier phase ``phase``
    completes, every thread (128) copies its part of the tile to ``out`` with ordinary loads."""
    t = kaio.thread_idx_x()
    if t == 0:
        load_box(tile, tmap, row, 0, bars, 32)
    kaio.mbarrier_wait(bars, 0, phase)
    for i in range(t, 32 * 64, 128):
        out[i // 64, i % 64] = tile[i // 64, i % 64]


@kaio.gpu_kernel(block_size=128)
def tma_over_stores(
    tmap: kaio.tensormap, out: f16[:, :], FENCE: kaio.constexpr, SYNC: kaio.constexpr
):
    """Every thread fills its part of a shared tile with ordinary stores (made visible to the
    asynchronous proxy when FENCE; a barrier after them when SYNC), then thread 0 has one
    32 x 64 TMA box land over the whole tile."""
    tile = kaio.shared(f16, (32, 64))
    bars = kaio.shared(u64, (1,))
    init_barrier(bars)
    t = kaio.thread_idx_x()
    for i in range(t, 32 * 64, 128):
        tile[i // 64, i % 64] = f16(-1.0)
    if FENCE:
        kaio.fence_proxy_async()
    if SYNC:
        kaio.sync_threads()
    land_and_copy(tile, tmap, 0, bars, 0, out)


@kaio.gpu_kernel(block_size=128)
def tma_after_reads(
    tmap: kaio.tensormap,
    first: f16[:, :],
    second: f16[:, :],
    FENCE: kaio.constexpr,
    REREAD: kaio.constexpr,
):
    """A TMA box lands in a shared tile and every thread copies it out with ordinary loads,
    then fences when FENCE (with REREAD, thread 0 then reads element (0, 0) again, unfenced,
    and thread 5 after it, fenced); a second box then lands over the same tile, copied out
    too."""
    tile = kaio.shared(f16, (32, 64))
    bars = kaio.shared(u64, (1,))
    init_barrier(bars)
    t = kaio.thread_idx_x()
    land_and_copy(tile, tmap, 0, bars, 0, first)
    if FENCE:
        kaio.fence_proxy_async()
    if REREAD and t == 0:
        first[0, 0] = tile[0, 0]
    if REREAD and t == 5:
        first[0, 0] = tile[0, 0]
        kaio.fence_proxy_async()
    kaio.sync_threads()
    land_and_copy(tile, tmap, 8, bars, 1, second)


@kaio.gpu_kernel(block_size=32)
def bulk_through_alias(out: f32[:, :], FENCE: kaio.constexpr):
    """Each thread stores its row of 4 as u32 bits through one view of the dynamic region,
    fences when FENCE, then bulk-stores the row through an f32 view of the same bytes."""
    words = kaio.shared_dynamic(u32, (32, 4), 0)
    rows = kaio.shared_dynamic(f32, (32, 4), 0)
    t = kaio.thread_idx_x()
    for c in kaio.static_range(4):
        words[t, c] = kaio.bitcast(f32(t * 4 + c), u32)
    if FENCE:
        kaio.fence_proxy_async()
    kaio.bulk_store(out, (t, 0), rows, (t, 0), 16)
    kaio.bulk_commit()
    kaio.bulk_wait(0)


@kaio.gpu_kernel(block_size=128)
def regs_and_fences(out: u32[:]):
    kaio.launch_bounds(128, 1)
    kaio.setmaxnreg_inc(232)
    kaio.fence_proxy_async()
    kaio.setmaxnreg_dec(40)
    out[kaio.thread_idx_x()] = 7


# --------------------------------------------------------------------------- references


def swizzle_tile(tile: np.ndarray, swizzle: int) -> np.ndarray:
    """A row-major tile as it lies in shared memory under ``swizzle``: 16-byte chunk c of
    128-byte line L moves to chunk c ^ (L % (swizzle / 16)) (the tile starts aligned)."""
    raw = np.ascontiguousarray(tile).reshape(-1).view(np.uint8).reshape(-1, 128 // 16, 16)
    if not swizzle:
        return tile
    out = np.empty_like(raw)
    for line in range(raw.shape[0]):
        for c in range(8):
            out[line, c ^ (line % (swizzle // 16))] = raw[line, c]
    return out.reshape(-1).view(tile.dtype).reshape(tile.shape)


def box_of(a: np.ndarray, row: int, col: int, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), a.dtype)
    for i in range(rows):
        for j in range(cols):
            if 0 <= row + i < a.shape[0] and 0 <= col + j < a.shape[1]:
                out[i, j] = a[row + i, col + j]
    return out


def _inputs(shape, bf16: bool, integers: bool):
    dt = ml_dtypes.bfloat16 if bf16 else np.float16
    x = RNG.integers(-3, 4, shape) if integers else RNG.standard_normal(shape)
    return x.astype(dt)


def run_wgmma(runner, K, N, SW, nmajor, bf16=False, integers=False):
    """(result, exact reference) of ``wgmma_tile`` through ``runner(kernel, *args)``."""
    a, b = _inputs((64, K), bf16, integers), _inputs((K, N), bf16, integers)
    ce = SW // 2 if SW else 8
    src_b = b if nmajor else np.ascontiguousarray(b.T)
    out = np.full((64, N), np.nan, np.float32)
    maps = (a.view(np.float16), (64, ce)), (src_b.view(np.float16), (src_b.shape[0], ce))
    got = runner(wgmma_tile, maps, SW, out, K, N, SW, nmajor, bf16)
    return got, a.astype(np.float64) @ b.astype(np.float64)


def sim_runner(kernel, maps, swizzle, out, *args):
    tms = [kaio.tensor_map_2d(x, box, swizzle) for x, box in maps]
    kernel.sim[1](*tms, out, *args)
    return out


def gpu_runner(kernel, maps, swizzle, out, *args):
    dev = [kaio.to_device(x) for x, _ in maps]
    tms = [kaio.tensor_map_2d(d, box, swizzle) for d, (_, box) in zip(dev, maps, strict=True)]
    d_out = kaio.to_device(out)
    kernel[1](*tms, d_out, *args)
    return d_out.numpy()


WGMMA_CASES = [
    (64, 128, 128, 1),
    (64, 128, 128, 0),
    (32, 64, 64, 1),
    (32, 64, 64, 0),
    (16, 32, 32, 1),
    (16, 32, 32, 0),
    (32, 16, 0, 1),
    (32, 16, 0, 0),
    (64, 256, 128, 1),
    (16, 8, 0, 0),
]


# --------------------------------------------------------------------------- simulator


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_copies_a_box_with_its_swizzle(swizzle):
    a = RNG.standard_normal((100, 200)).astype(np.float16)
    cols = 64 if swizzle in (0, 128) else swizzle // 2
    rows = 32
    for row, col in TMA_CORNERS:
        out = np.full((rows, 64), np.nan, np.float16)
        tm = kaio.tensor_map_2d(a, (rows * 64 // cols, cols), swizzle)
        tma_tile.sim[1](tm, out, row, col, rows)
        box = box_of(a, row, col, rows * 64 // cols, cols)
        want = swizzle_tile(box.reshape(rows, 64), swizzle)
        np.testing.assert_array_equal(out, want)


def test_multicast_fills_every_block_and_remote_arrivals_count():
    a = RNG.standard_normal((100, 200)).astype(np.float16)
    for row, col in TMA_CORNERS:
        out = np.full((2, 64, 64), np.nan, np.float16)
        done = np.full(2, 7, np.uint32)
        multicast_halves.sim[2](kaio.tensor_map_2d(a, (32, 64), 0), out, done, row, col, 3)
        want = box_of(a, row, col, 64, 64)
        np.testing.assert_array_equal(out, np.stack([want, want]))
        np.testing.assert_array_equal(done, [0, 1])


def test_multicast_misuse_is_reported():
    a = RNG.standard_normal((64, 64)).astype(np.float16)
    out, done = np.zeros((2, 64, 64), np.float16), np.zeros(2, np.uint32)
    with pytest.raises(kaio.SimulationError, match=r"block mask 0x4 in a cluster of 2 blocks"):
        multicast_halves.sim[2](kaio.tensor_map_2d(a, (32, 64), 0), out, done, 0, 0, 4)
    with pytest.raises(kaio.SimulationError, match=r"block rank 2 in a cluster of 2 blocks"):
        arrive_far.sim[2](np.zeros(2, np.uint32), 2)
    # a mask of one block: the other's tile misses half its rows, and its wait never completes
    with pytest.raises(kaio.SimulationError, match="waits for an mbarrier phase"):
        multicast_halves.sim[2](kaio.tensor_map_2d(a, (32, 64), 0), out, done, 0, 0, 1)


def test_device_functions_take_only_tensor_maps_as_maps():
    # tma_tile passes its map to load_box (the TMA tests check the copies it makes)
    with pytest.raises(kaio.CompileError, match="load_box: 'tmap' expects a kaio.tensormap"):
        tma_func_without_map.ptx(arch="sm_90")


def test_tma_box_columns_start_16_byte_aligned():
    """The GPU stops with an illegal instruction when a box's first column is not a multiple
    of 16 bytes into the row (seen on an H200 for columns 4 and 150 of f16); the simulator
    refuses it."""
    a = np.zeros((100, 200), np.float16)
    with pytest.raises(kaio.SimulationError, match="multiple of 16 bytes"):
        tma_tile.sim[1](kaio.tensor_map_2d(a, (32, 64), 0), np.zeros((32, 64), a.dtype), 3, 4, 32)


def test_dynamic_tiles_in_kernels_with_static_shared_arrays_are_refused():
    """After static shared arrays the dynamic region is not 1024-byte aligned on the GPU (a
    misaligned shared address on an H200): PTX and simulator refuse TMA and descriptors."""
    with pytest.raises(kaio.CompileError, match="declare bars with kaio.shared_dynamic"):
        dynamic_tile.ptx(arch="sm_90")
    a = np.zeros((64, 64), np.float16)
    with pytest.raises(kaio.SimulationError, match="no static shared arrays"):
        dynamic_tile.sim[1, 128, 0, 8192](kaio.tensor_map_2d(a, (64, 64), 128))


def test_barrier_phases_flip_after_count_arrivals():
    out = np.zeros(64 * 9, np.uint32)
    barrier_phases.sim[1](out)
    want = np.tile([0, 1, 0], 3 * 64).reshape(64, 3, 3)
    np.testing.assert_array_equal(out.reshape(64, 3, 3), want)


def test_a_wait_nothing_completes_is_reported():
    with pytest.raises(kaio.SimulationError, match="waits for an mbarrier phase"):
        never_arrives.sim[1](np.zeros(1, np.uint32))


@pytest.mark.parametrize("spin", [0, 1, 2])
def test_role_split_loops_take_turns(spin):
    # in program order the consumer's loop would wait forever for the producer's, which
    # comes after it: the simulator runs the producer's branch while the consumer waits
    x = RNG.standard_normal(7 * 32).astype(np.float32)
    out = np.full(7 * 32, np.nan, np.float32)
    role_split.sim[3](x, out, 7, spin)
    np.testing.assert_array_equal(out, x * 2)


def test_a_role_split_that_waits_for_itself_is_reported():
    with pytest.raises(kaio.SimulationError, match="nor anything the other branch"):
        waits_for_each_other.sim[1](np.zeros(64, np.uint32))


def test_descriptor_fields():
    out = np.zeros(2, np.uint64)
    descriptor_bits.sim[1](out)
    start = (64 * 64 + 8 * 64 + 16) * 2  # the tile is the window's first array
    d = int(out[0])
    assert d & 0x3FFF == start >> 4
    assert (d >> 16) & 0x3FFF == 8192 >> 4 and (d >> 32) & 0x3FFF == 1024 >> 4
    assert d >> 62 == 1 and (d >> 46) & 0xFFFF == 0
    assert int(out[1]) == (16 >> 4) << 16 | (128 >> 4) << 32  # no swizzle: mode 0


def test_descriptor_start_is_a_masked_base_and_an_addition():
    """The start field as ((base >> 4) & 0x3FFF) + offset / 16 (the offset a multiple of 16):
    one ``bfe`` of the tile's base, which ptxas shares between a tile's descriptors, and an
    addition each (five uniform instructions a descriptor before). The mask stays on the
    base: a block of a cluster sees shared addresses with bits above its own window's 18
    (without it the multicast pairs computed wrong products on an H100)."""
    ptx = descriptor_bits.ptx(arch="sm_90")
    assert re.search(r"bfe\.u32 %r\d+, %r\d+, 4, 14;", ptx) and "shr.u32" not in ptx
    assert f"{(64 * 64 + 8 * 64 + 16) * 2 // 16 + (8192 >> 4 << 16)}" in ptx


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("case", WGMMA_CASES)
def test_wgmma_layouts(case, bf16):
    got, ref = run_wgmma(sim_runner, *case, bf16=bf16)
    k = case[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=k * 2.0**-20 * np.abs(ref).max() + 1e-6)


def run_wgmma_registers(on_gpu: bool, K: int, N: int, bf16: bool, integers: bool = False):
    """(result, exact reference) of ``wgmma_registers`` in the simulator or on the GPU."""
    a, b = _inputs((64, K), bf16, integers), _inputs((K, 64), bf16, integers)
    out = np.full((64, N), np.nan, np.float32)
    maps = ((b.view(np.float16), (K, 64)),)
    args = (a.view(np.float16),)
    if on_gpu:
        args = (kaio.to_device(args[0]),)
        dev = kaio.to_device(maps[0][0])
        d_out = kaio.to_device(out)
        wgmma_registers[1](*args, kaio.tensor_map_2d(dev, (K, 64), 128), d_out, K, N, bf16)
        got = d_out.numpy()
    else:
        wgmma_registers.sim[1](*args, kaio.tensor_map_2d(maps[0][0], (K, 64), 128), out, K, N,
                               bf16)  # fmt: skip
        got = out
    return got, a.astype(np.float64) @ b.astype(np.float64)[:, :N]


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("k, n", [(16, 8), (32, 64), (64, 32)])
def test_wgmma_with_a_in_registers(k, n, bf16):
    got, ref = run_wgmma_registers(False, k, n, bf16)
    np.testing.assert_allclose(got, ref, rtol=0, atol=k * 2.0**-20 * np.abs(ref).max() + 1e-6)


def test_wgmma_register_a_misuse_is_a_compile_error():
    @kaio.gpu_kernel(block_size=128)
    def three_regs(out: f32[:]):
        frag = kaio.local(u32, (3,))
        acc = kaio.local(f32, (4,))
        for i in kaio.static_range(3):
            frag[i] = u32(0)
        kaio.wgmma_f16(acc, frag, u64(0), False)

    with pytest.raises(kaio.CompileError, match=r"A in registers is 4 x u32"):
        three_regs.ptx(arch="sm_90")

    @kaio.gpu_kernel(block_size=128)
    def transposed(out: f32[:]):
        frag = kaio.local(u32, (4,))
        acc = kaio.local(f32, (4,))
        for i in kaio.static_range(4):
            frag[i] = u32(0)
        kaio.wgmma_f16(acc, frag, u64(0), False, True, False)

    with pytest.raises(kaio.CompileError, match=r"no transposed form"):
        transposed.ptx(arch="sm_90")


def test_wgmma_by_dtype_is_the_builtin_of_that_dtype():
    """``kaio.wgmma(DT, ...)`` (``TYPED``) emits what ``wgmma_f16`` / ``wgmma_bf16`` emit for
    the same arguments (descriptors and A in registers), and refuses a dtype that has
    neither."""

    @kaio.gpu_kernel(block_size=128)
    def spelled(out: f32[:], DT: kaio.constexpr, REGS: kaio.constexpr, TYPED: kaio.constexpr):
        frag = kaio.local(u32, (4,))
        acc = kaio.local(f32, (8,))
        for i in kaio.static_range(4):
            frag[i] = u32(i)
        db = u64(out[0])
        if TYPED and REGS:
            kaio.wgmma(DT, acc, frag, db, True, False, True)
        elif TYPED:
            kaio.wgmma(DT, acc, u64(out[1]), db, False)
        elif REGS and DT == kaio.bf16:
            kaio.wgmma_bf16(acc, frag, db, True, False, True)
        elif REGS:
            kaio.wgmma_f16(acc, frag, db, True, False, True)
        elif DT == kaio.bf16:
            kaio.wgmma_bf16(acc, u64(out[1]), db, False)
        else:
            kaio.wgmma_f16(acc, u64(out[1]), db, False)
        kaio.wgmma_commit()
        kaio.wgmma_wait(0)
        out[kaio.thread_idx_x()] = acc[3]

    def body(ptx: str) -> list[str]:  # the instructions, without source lines and comments
        lines = ptx[ptx.index("{") :].splitlines()
        return [line for line in lines if not line.lstrip().startswith(("//", ".loc"))]

    for dt in (f16, kaio.bf16):
        for regs in (False, True):
            typed = spelled.ptx(arch="sm_90", DT=dt, REGS=regs, TYPED=True)
            assert f"m64n16k16.f32.{dt}.{dt}" in typed
            assert body(typed) == body(spelled.ptx(arch="sm_90", DT=dt, REGS=regs, TYPED=False))
    with pytest.raises(kaio.CompileError, match=r"dtype must be kaio.f16 or kaio.bf16, got f32"):
        spelled.ptx(arch="sm_90", DT=f32, REGS=False, TYPED=True)


def test_wgmma_accumulator_layout_is_the_documented_one():
    got, ref = run_wgmma(sim_runner, 16, 8, 0, 0, integers=True)
    np.testing.assert_array_equal(got, ref.astype(np.float32))


@pytest.mark.parametrize(
    "bf16, blocks, group, stages", [(0, 3, 2, 3), (1, 2, 1, 3), (0, 1, 8, 4), (1, 2, 8, 5)]
)
def test_hopper_matmul_in_the_simulator(bf16, blocks, group, stages):
    # 2 x 2 tiles of C on a persistent grid of 1 to 3 blocks: a block takes tiles b, b +
    # blocks, ... in the grouped order, and its producer loads the next tile's first slices
    # (4 K slices a tile, 3 to 5 stages) before this tile's epilogue
    m, n, k, bn = 130, 136, 200, 128
    a, b = _inputs((m, k), bf16, False), _inputs((k, n), bf16, False)
    c = np.full((m, n), np.nan, np.float32)
    ta = kaio.tensor_map_2d(a, (128, 64), 128)
    tb = kaio.tensor_map_2d(b, (64, 64), 128)
    shared = _matmul_hopper.shared_bytes(bn, stages)
    _matmul_hopper.matmul_wgmma.sim[blocks, _matmul_hopper.THREADS, 0, shared](
        ta, tb, c, c, c, a[0], c, m, n, n, 0, k, 1.0, 1.0, 1.0, bn, stages,
        (f16, kaio.bf16)[bf16], group, f32, 0, 1 + 2 * bf16,  # one output (f16 inputs), or
        0, 0, 0, "none", 0, f32, 4,  # the general epilogue; no bias, activation or residual
    )  # fmt: skip
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=0, atol=1e-4)


def test_hopper_matmul_into_three_f16_outputs_in_the_simulator():
    # the QKV epilogue: C's columns split 40 / 24 / 72 over three f16 arrays, one boundary
    # inside an 8-column group of the accumulator layout, each scaled by its own factor
    m, k, widths, scales = 130, 136, (40, 24, 72), (0.5, 3.0, -0.25)
    n = sum(widths)
    a, b = _inputs((m, k), 0, False), _inputs((k, n), 0, False)
    outs = [np.full((m, w), np.nan, np.float16) for w in widths]
    ta = kaio.tensor_map_2d(a, (128, 64), 128)
    tb = kaio.tensor_map_2d(b, (64, 64), 128)
    shared = _matmul_hopper.shared_bytes(128, 3)
    _matmul_hopper.matmul_wgmma.sim[2, _matmul_hopper.THREADS, 0, shared](
        ta, tb, *outs, a[0], outs[0], m, n, *widths[:2], k, *scales, 128, 3, f16, 8, f16, 0, 3,
        0, 0, 0, "none", 0, f16, 4,
    )  # fmt: skip
    ref = a.astype(np.float64) @ b.astype(np.float64)
    parts = np.split(ref, np.cumsum(widths)[:2], axis=1)
    for got, want in zip(outs, [p * f for p, f in zip(parts, scales, strict=True)], strict=True):
        # f32 sums (rounded after each wgmma) rounded to f16: within one f16 rounding
        np.testing.assert_allclose(got, want, rtol=2**-10, atol=2**-14)


def test_bulk_store_copies_shared_runs_to_global():
    src = RNG.standard_normal((64, 32)).astype(np.float32)
    out = np.full((64, 32), np.nan, np.float32)
    bulk_rows.sim[1](src, out, 28)
    np.testing.assert_array_equal(out[:, :28], src[:, :28] * 2)
    assert np.isnan(out[:, 28:]).all()


def test_bulk_reduce_add_adds_every_block_rows():
    src = RNG.standard_normal((64, 32)).astype(np.float32)
    out = RNG.standard_normal((64, 32)).astype(np.float32)
    want = out + src + src * 2  # blocks 0 and 1 (in some order: f32 roundings)
    bulk_add_rows.sim[2](src, out)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in bulk_add_rows.ptx(
        arch="sm_90"
    )
    with pytest.raises(kaio.CompileError, match="adds f32 elements"):
        bulk_typed.ptx(arch="sm_90", DT=f16, RT=f16, REDUCE=True)


@kaio.gpu_kernel(block_size=32)
def bulk_typed(out: DT[:], DT: kaio.constexpr, RT: kaio.constexpr, REDUCE: kaio.constexpr):  # noqa: F821
    """A bulk copy (``REDUCE``: addition) of 16 bytes of RT elements to out."""
    rows = kaio.shared(RT, (8,))
    if REDUCE:
        kaio.bulk_reduce_add(out, 0, rows, 0, 16)
    else:
        kaio.bulk_store(out, 0, rows, 0, 16)


def test_bulk_prefetch_is_a_hint():
    """``prefetch_l2`` of a run-time size changes no value (the simulator runs it as
    nothing), lowers to cp.async.bulk.prefetch.L2 by both backends, and needs sm_90."""
    src = RNG.standard_normal((64, 32)).astype(np.float32)
    out = np.full((64, 32), np.nan, np.float32)
    prefetched_copy.sim[1](src, out)
    np.testing.assert_array_equal(out, src)
    assert "cp.async.bulk.prefetch.L2.global [" in prefetched_copy.ptx(arch="sm_90")
    assert "cp.async.bulk.prefetch.L2.global [" in prefetched_copy.ptx(arch="sm_90", backend="llvm")
    with pytest.raises(kaio.CompileError, match=r"prefetch_l2\(\) needs sm_90"):
        prefetched_copy.ptx(arch="sm_80")


def test_bulk_prefetch_needs_16_byte_alignment():
    """A bulk L2 prefetch of a compile-time size needs a 16-byte aligned address (not one
    aligned to its size), in bounds."""
    buf = np.zeros(1024, np.float32)
    src = buf[(-buf.ctypes.data % 64) // 4 :][:600]  # starts on 64 bytes
    out = np.full(32, np.nan, np.float32)
    prefetched_runs.sim[1](src, out, np.uint32(4))  # 16 bytes past 64-byte boundaries
    np.testing.assert_array_equal(out, src[4:36])
    with pytest.raises(kaio.SimulationError, match="multiple of 16 bytes"):
        prefetched_runs.sim[1](src, out, np.uint32(2))
    with pytest.raises(kaio.SimulationError, match="out-of-bounds L2 prefetch"):
        prefetched_runs.sim[1](src[:500], out, np.uint32(4))


def test_grid_dependency_controls():
    """``launch_dependents`` and ``grid_dependency_wait`` lower to griddepcontrol by both
    backends (a kernel that waits is launched with programmatic stream serialization: the
    runtime reads the wait in its PTX), run as nothing in the simulator and need sm_90."""
    from kaio.runtime.module import _GRID_WAIT

    for backend in ("ptx", "llvm"):
        ptx = dependent_step.ptx(arch="sm_90", backend=backend)
        assert "griddepcontrol.launch_dependents;" in ptx and _GRID_WAIT.search(ptx)
    assert not _GRID_WAIT.search(prefetched_copy.ptx(arch="sm_90"))
    src = RNG.standard_normal(300).astype(np.float32)
    out = np.full(300, np.nan, np.float32)
    dependent_step.sim[3](src, out, 300)
    np.testing.assert_array_equal(out, src + 1)
    with pytest.raises(kaio.CompileError, match=r"launch_dependents\(\) needs sm_90"):
        dependent_step.ptx(arch="sm_80")


def test_bulk_store_misuse_is_reported():
    with pytest.raises(kaio.SimulationError, match="multiples of 16"):
        bulk_misaligned.sim[1](np.zeros((4, 8), np.float32), 16)  # element 1: 4 bytes in
    with pytest.raises(kaio.SimulationError, match="multiples of 16"):
        bulk_misaligned.sim[1](np.zeros((4, 9), np.float32), 24)
    with pytest.raises(kaio.CompileError, match="one element type"):
        bulk_typed.ptx(arch="sm_90", DT=f16, RT=f32, REDUCE=False)


ROWS = np.arange(128, dtype=np.float32).reshape(32, 4)
"""What the row kernels store (``write_rows``): 4 t + c at [t, c]."""


def _check_rows(run, on_gpu: bool = False) -> np.ndarray:
    """``run(rows)`` on NaN-poisoned rows [32, 4] (a DeviceArray when ``on_gpu``), which must
    then hold ROWS; returns them (as given to ``run``)."""
    rows = np.full((32, 4), np.nan, np.float32)
    rows = kaio.to_device(rows) if on_gpu else rows
    run(rows)
    np.testing.assert_array_equal(rows.numpy() if on_gpu else rows, ROWS)
    return rows


def _stored_operands():
    a = RNG.integers(-8, 8, (64, 16)).astype(np.float16)
    b = RNG.integers(-8, 8, (16, 8)).astype(np.float16)
    return a, b, np.full((64, 8), np.nan, np.float32)


def test_wgmma_reads_fenced_ordinary_stores():
    a, b, out = _stored_operands()
    wgmma_stored.sim[1](a, b, out, FENCE=True, SYNC=True)
    np.testing.assert_array_equal(out, a.astype(np.float64) @ b.astype(np.float64))


def test_wgmma_of_unfenced_stores_is_reported():
    a, b, out = _stored_operands()
    match = r"(?s)wgmma reads 'sa_smem0'.*wrote it.*fence_proxy_async"
    with pytest.raises(kaio.SimulationError, match=match):
        wgmma_stored.sim[1](a, b, out, FENCE=False, SYNC=True)


def test_bulk_store_of_a_write_after_the_fence_is_reported():
    out = _check_rows(lambda rows: bulk_after_write.sim[1](rows, LATE=False))
    with pytest.raises(kaio.SimulationError, match=r"(?s)reads 'rows_smem0'\[0, 3\].*wrote it at"):
        bulk_after_write.sim[1](out, LATE=True)


def test_tma_over_fenced_stores_lands():
    a = RNG.standard_normal((40, 64)).astype(np.float16)
    out = np.full((32, 64), np.nan, np.float16)
    tma_over_stores.sim[1](kaio.tensor_map_2d(a, (32, 64), 0), out, FENCE=True, SYNC=True)
    np.testing.assert_array_equal(out, a[:32])


def test_tma_over_unfenced_stores_is_reported():
    """A TMA copy issued over elements last written by ordinary stores, with no proxy fence
    between: on the GPU the stores may land after the copy."""
    a = RNG.standard_normal((40, 64)).astype(np.float16)
    out = np.full((32, 64), np.nan, np.float16)
    match = r"(?s)tma_load_2d\(\) writes 'tile_smem0'.*wrote it at.*land after the copy"
    with pytest.raises(kaio.SimulationError, match=match):
        tma_over_stores.sim[1](kaio.tensor_map_2d(a, (32, 64), 0), out, FENCE=False, SYNC=True)
    # fenced, but the other threads' stores are not ordered before thread 0's copy
    with pytest.raises(kaio.SimulationError, match=r"(?s)race on 'tile_smem0'\[0, 1\]"):
        tma_over_stores.sim[1](kaio.tensor_map_2d(a, (32, 64), 0), out, FENCE=True, SYNC=False)


def test_tma_over_unfenced_reads_is_reported():
    """A TMA copy issued over elements whose last ordinary read was not followed by a proxy
    fence: on the GPU the read may see the copy's bytes."""
    a = RNG.standard_normal((40, 64)).astype(np.float16)
    first, second = (np.full((32, 64), np.nan, np.float16) for _ in range(2))
    tmap = kaio.tensor_map_2d(a, (32, 64), 0)
    tma_after_reads.sim[1](tmap, first, second, FENCE=True, REREAD=False)
    np.testing.assert_array_equal(first, a[:32])
    np.testing.assert_array_equal(second, a[8:40])
    match = r"(?s)tma_load_2d\(\) writes 'tile_smem0'\[0, 0\].*read it at.*see the copy"
    with pytest.raises(kaio.SimulationError, match=match):
        tma_after_reads.sim[1](tmap, first, second, FENCE=False, REREAD=False)
    # thread 0's unfenced read stays on record though thread 5 reads (0, 0) later and fences
    match = r"(?s)writes 'tile_smem0'\[0, 0\].*thread \(0, 0, 0\) read it at"
    with pytest.raises(kaio.SimulationError, match=match):
        tma_after_reads.sim[1](tmap, first, second, FENCE=True, REREAD=True)


def test_bulk_store_through_an_alias_of_unfenced_stores_is_reported():
    out = _check_rows(lambda rows: bulk_through_alias.sim[1, 32, 0, 512](rows, FENCE=True))
    match = r"(?s)bulk_store\(\) reads 'rows_dsmem1'\[0, 0\].*wrote it at"
    with pytest.raises(kaio.SimulationError, match=match):
        bulk_through_alias.sim[1, 32, 0, 512](out, FENCE=False)


def test_async_reads_race_with_other_threads_stores():
    """A wgmma or bulk_store reads for the thread that issues it: another thread's store to
    those elements with no barrier in between is a race, fenced or not."""
    a, b, out = _stored_operands()
    with pytest.raises(kaio.SimulationError, match=r"(?s)race on 'sa_smem0'.*wgmma_f16"):
        wgmma_stored.sim[1](a, b, out, FENCE=True, SYNC=False)
    rows = _check_rows(lambda rows: bulk_of_all_rows.sim[1](rows, SYNC=True))
    with pytest.raises(kaio.SimulationError, match=r"(?s)race on 'rows_smem0'\[1, 0\]"):
        bulk_of_all_rows.sim[1](rows, SYNC=False)


def test_tensor_map_checks():
    a = np.zeros((64, 100), np.float16)  # rows 200 bytes apart
    with pytest.raises(ValueError, match="multiple of 16"):
        kaio.tensor_map_2d(a, (8, 8), 0)
    with pytest.raises(ValueError, match="at most 64 bytes"):
        kaio.tensor_map_2d(np.zeros((64, 64), np.float16), (8, 64), 64)
    with pytest.raises(kaio.LaunchError, match="tensor_map_2d"):
        tma_tile.sim[1](a, np.zeros((32, 64), np.float16), 0, 0, 32)
    with pytest.raises(ValueError, match="l2_promotion must be one of"):
        kaio.tensor_map_2d(np.zeros((64, 64), np.float16), (8, 64), 128, 32)


def test_tensor_map_l2_promotion_kept_apart(monkeypatch):
    """Maps that differ only in their L2 promotion are encoded apart (the kept encodings'
    key holds it), and a call plan's copy of a map's layout keeps it."""
    from kaio.runtime.plan import _layout

    tensormap = importlib.import_module("kaio.tensormap")  # (kaio.tensormap: the annotation)

    made = []

    def encode(tm, address=None):
        made.append(tm.l2_promotion)
        return bytes([tensormap.L2_PROMOTIONS[tm.l2_promotion]]) * 128

    monkeypatch.setattr(tensormap, "_encode", encode)
    monkeypatch.setattr(tensormap, "_KEPT", {})

    def layout(promotion):
        return tensormap.TensorMap(None, f16, (64, 64), 64, (8, 64), 128, 1 << 20, promotion)

    got = [layout(p).encoded()[0] for p in (128, 256, 128, 0)]
    assert got == [2, 3, 2, 0] and made == [128, 256, 0]
    assert _layout(layout(64)).l2_promotion == 64


# --------------------------------------------------------------------------- PTX


@needs_ptxas
def test_ptx_assembles_for_sm_90a():
    texts = [
        tma_tile.ptx(arch="sm_90", R=32),
        multicast_halves.ptx(arch="sm_90"),
        role_split.ptx(arch="sm_90", SPIN=1),
        barrier_phases.ptx(arch="sm_90"),
        bulk_rows.ptx(arch="sm_90"),
        bulk_add_rows.ptx(arch="sm_90"),
        prefetched_copy.ptx(arch="sm_90"),
        descriptor_bits.ptx(arch="sm_90"),
        regs_and_fences.ptx(arch="sm_90"),
        wgmma_stored.ptx(arch="sm_90", FENCE=True, SYNC=True),
        bulk_after_write.ptx(arch="sm_90", LATE=False),
        bulk_of_all_rows.ptx(arch="sm_90", SYNC=True),
        tma_over_stores.ptx(arch="sm_90", FENCE=True, SYNC=True),
        bulk_through_alias.ptx(arch="sm_90", FENCE=True),
        tma_after_reads.ptx(arch="sm_90", FENCE=True, REREAD=False),
        *(
            wgmma_tile.ptx(arch="sm_90", K=c[0], N=c[1], SW=c[2], B_NMAJOR=c[3], BF16=bf)
            for c, bf in ((WGMMA_CASES[0], 0), (WGMMA_CASES[5], 1), (WGMMA_CASES[8], 0))
        ),
        *(k.ptx(arch="sm_90", **c) for k, c in covered(_matmul_hopper.specializations())),
        wgmma_registers.ptx(arch="sm_90", K=32, N=64, BF16=False),
        wgmma_registers.ptx(arch="sm_90", K=64, N=32, BF16=True),
    ]
    for ptx in texts:
        report = assemble(ptx, "sm_90a")
        assert "C7518" not in report and "C7508" not in report, report
    assert ".target sm_90a" in texts[-1] and ".target sm_90\n" in texts[0]


def test_hopper_builtins_on_other_targets_are_compile_errors():
    with pytest.raises(kaio.CompileError, match=r"kaio.smem_descriptor\(\) needs sm_90a.*sm_80"):
        descriptor_bits.ptx(arch="sm_80")
    with pytest.raises(kaio.CompileError, match=r"needs sm_90a.*sm_100"):
        regs_and_fences.ptx(arch="sm_100")
    with pytest.raises(kaio.CompileError, match=r"expect_tx\(\) needs sm_90 or newer"):
        tma_tile.ptx(arch="sm_80", R=32)
    with pytest.raises(kaio.CompileError, match=r"mbarrier_try_wait\(\) needs sm_90"):
        barrier_phases.ptx(arch="sm_89")


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_gpu_tma_matches_simulator(swizzle):
    a = RNG.standard_normal((100, 200)).astype(np.float16)
    cols = 64 if swizzle in (0, 128) else swizzle // 2
    box = (32 * 64 // cols, cols)
    for row, col in TMA_CORNERS:
        sim_out = np.zeros((32, 64), np.float16)
        tma_tile.sim[1](kaio.tensor_map_2d(a, box, swizzle), sim_out, row, col, 32)
        d_out = kaio.to_device(np.zeros((32, 64), np.float16))
        tma_tile[1](kaio.tensor_map_2d(kaio.to_device(a), box, swizzle), d_out, row, col, 32)
        np.testing.assert_array_equal(d_out.numpy(), sim_out)


def _on_backend(kernel, block_size: int, backend: str):
    """``kernel`` compiled by ``backend`` (skipped without llvmlite for "llvm")."""
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    return kaio.gpu_kernel(kernel.pyfunc, block_size=block_size, backend=backend)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_gpu_dependent_launches_see_the_writes_before(backend):
    """A chain of 40 programmatically dependent launches, each reading what the one before
    wrote (out = src + 1, ping-ponging two arrays of 2**20 elements) after its
    grid_dependency_wait, counts up exactly; so does a chain replayed from a call plan."""
    from kaio.runtime import plan as call_plans

    kernel = _on_backend(dependent_step, 128, backend)
    n = 1 << 20
    a = kaio.to_device(np.zeros(n, np.float32))
    b = kaio.to_device(np.full(n, np.nan, np.float32))
    grid = n // 128
    for _ in range(20):
        kernel[grid](a, b, n)
        kernel[grid](b, a, n)
    np.testing.assert_array_equal(a.numpy(), np.full(n, 40, np.float32))
    with call_plans.recording() as rec:  # (the two launches run: 42)
        kernel[grid](a, b, n)
        kernel[grid](b, a, n)
    replay = call_plans.CallPlan([(prepared, {}) for prepared, _ in rec.launches]).run
    for _ in range(10):
        replay([])
    np.testing.assert_array_equal(a.numpy(), np.full(n, 62, np.float32))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("spin", [0, 1, 2])
def test_gpu_role_split(spin):
    x = RNG.standard_normal(7 * 32).astype(np.float32)
    out = kaio.to_device(np.full(7 * 32, np.nan, np.float32))
    role_split[3](kaio.to_device(x), out, 7, spin)
    np.testing.assert_array_equal(out.numpy(), x * 2)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_gpu_multicast_matches_simulator(backend):
    a = RNG.standard_normal((100, 200)).astype(np.float16)
    kernel = _on_backend(multicast_halves, 64, backend)
    for row, col in TMA_CORNERS:
        want, want_done = np.zeros((2, 64, 64), np.float16), np.zeros(2, np.uint32)
        multicast_halves.sim[2](kaio.tensor_map_2d(a, (32, 64), 0), want, want_done, row, col, 3)
        got = kaio.to_device(np.full((2, 64, 64), np.nan, np.float16))
        done = kaio.to_device(np.full(2, 7, np.uint32))
        kernel[2](kaio.tensor_map_2d(kaio.to_device(a), (32, 64), 0), got, done, row, col, 3)
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(done.numpy(), want_done)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_gpu_bulk_store_matches_simulator(backend):
    src = RNG.standard_normal((64, 32)).astype(np.float32)
    want = np.full((64, 32), -1.0, np.float32)
    bulk_rows.sim[1](src, want, 28)
    got = kaio.to_device(np.full((64, 32), -1.0, np.float32))
    _on_backend(bulk_rows, 64, backend)[1](kaio.to_device(src), got, 28)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_gpu_bulk_reduce_add_matches_simulator(backend):
    src = RNG.standard_normal((64, 32)).astype(np.float32)
    base = RNG.standard_normal((64, 32)).astype(np.float32)
    want = base.copy()
    bulk_add_rows.sim[2](src, want)
    got = kaio.to_device(base)
    _on_backend(bulk_add_rows, 64, backend)[2](kaio.to_device(src), got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("backend", ["ptx", "llvm"])
def test_gpu_async_proxy_after_fenced_stores(backend):
    a, b, out = _stored_operands()
    got = kaio.to_device(out)
    kernel = _on_backend(wgmma_stored, 128, backend)
    kernel[1](kaio.to_device(a), kaio.to_device(b), got, FENCE=True, SYNC=True)
    np.testing.assert_array_equal(got.numpy(), a.astype(np.float64) @ b.astype(np.float64))
    _check_rows(lambda rows: _on_backend(bulk_after_write, 32, backend)[1](rows, LATE=False), True)
    _check_rows(lambda rows: _on_backend(bulk_of_all_rows, 32, backend)[1](rows, SYNC=True), True)
    a = RNG.standard_normal((40, 64)).astype(np.float16)
    tile = kaio.to_device(np.full((32, 64), np.nan, np.float16))
    tmap = kaio.tensor_map_2d(kaio.to_device(a), (32, 64), 0)
    _on_backend(tma_over_stores, 128, backend)[1](tmap, tile, FENCE=True, SYNC=True)
    np.testing.assert_array_equal(tile.numpy(), a[:32])
    alias = _on_backend(bulk_through_alias, 32, backend)
    _check_rows(lambda rows: alias[1, 32, 0, 512](rows, FENCE=True), True)
    first, second = (kaio.to_device(np.full((32, 64), np.nan, np.float16)) for _ in range(2))
    _on_backend(tma_after_reads, 128, backend)[1](tmap, first, second, FENCE=True, REREAD=False)
    np.testing.assert_array_equal(first.numpy(), a[:32])
    np.testing.assert_array_equal(second.numpy(), a[8:40])


@pytest.mark.gpu
@needs_hopper
def test_gpu_barrier_phases():
    """The "after" and "older" flags match the simulator's. The "before" flag (a try_wait
    ahead of the thread's own arrival) is not compared: try_wait may wait a while for the
    phase, which the thread's own arrival then completes (on an H200 every thread saw 1 where
    the simulator, running in program order, says 0)."""
    d = kaio.to_device(np.zeros(64 * 9, np.uint32))
    barrier_phases[1](d)
    sim = np.zeros(64 * 9, np.uint32)
    barrier_phases.sim[1](sim)
    got, want = d.numpy().reshape(64, 3, 3), sim.reshape(64, 3, 3)
    np.testing.assert_array_equal(got[:, :, 1:], want[:, :, 1:])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("case", WGMMA_CASES)
def test_gpu_wgmma_bit_exact_with_simulator(case, bf16):
    rng_state = RNG.bit_generator.state
    got, ref = run_wgmma(gpu_runner, *case, bf16=bf16, integers=True)
    RNG.bit_generator.state = rng_state
    sim, _ = run_wgmma(sim_runner, *case, bf16=bf16, integers=True)
    np.testing.assert_array_equal(got, sim)
    np.testing.assert_array_equal(got, ref.astype(np.float32))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("bf16", [False, True])
def test_gpu_wgmma_with_a_in_registers_bit_exact(bf16):
    rng_state = RNG.bit_generator.state
    got, ref = run_wgmma_registers(True, 64, 64, bf16, integers=True)
    RNG.bit_generator.state = rng_state
    sim, _ = run_wgmma_registers(False, 64, 64, bf16, integers=True)
    np.testing.assert_array_equal(got, sim)
    np.testing.assert_array_equal(got, ref.astype(np.float32))


def test_hopper_matmul_only_for_enough_tiles():
    """The quantized prefill path (``_prefill.fits``) takes the persistent kernel from two
    128 x 128 tiles per multiprocessor (measured: it lost to mma.sync at 2048^3 on 132 SMs
    and won at 4096^3)."""
    assert not _matmul_hopper.worthwhile(2048, 2048, 132)
    assert _matmul_hopper.worthwhile(4096, 4096, 132)
    assert _matmul_hopper.worthwhile(2048, 2048, 64)
    assert not _matmul_hopper.worthwhile(16384, 128, 132)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    # the last: several tiles a block on the persistent grid, edges on both sides
    "mnk, persistent",
    [((130, 136, 200), False), ((512, 1024, 768), False), ((2048, 2048, 4096), True),
     ((2900, 4104, 520), True)],
)  # fmt: skip
def test_gpu_matmul_runs_the_gemm_planner_and_is_correct(dtype, mnk, persistent, monkeypatch):
    """On sm_90 the ops are ``kaio_ops.matmul`` with f32 output (its planner's kernels: the
    Hopper GEMM, or the ``persistent`` kernel from a wave of 128 x 128 tiles): the same bits,
    relative error (Frobenius, against float64) within 1e-3 for f16 and 1e-2 for bf16, the
    same bits on a second run."""
    import torch

    import kaio_ops

    monkeypatch.delenv("KAIO_HOPPER_MATMUL", raising=False)
    launches = []
    real_launch = _matmul_hopper.launch
    monkeypatch.setattr(
        _matmul_hopper, "launch", lambda *a, **k: launches.append(a[2:5]) or real_launch(*a, **k)
    )
    m, n, k = mnk
    t = getattr(torch, dtype)
    a = torch.randn(m, k, device="cuda", dtype=t)
    b = torch.randn(k, n, device="cuda", dtype=t)
    op = kaio_ops.matmul_tc if dtype == "float16" else kaio_ops.matmul_tc_bf16
    c = op(a, b)
    assert launches == ([mnk] if persistent else [])
    assert torch.equal(kaio_ops.matmul(a, b, out_dtype=torch.float32), c)
    ref = a.double() @ b.double()
    rel = ((c.double() - ref).norm() / ref.norm()).item()
    assert rel <= (1e-3 if dtype == "float16" else 1e-2), rel
    assert torch.equal(op(a, b), c)
