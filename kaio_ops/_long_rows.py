"""Softmax over rows longer than one block's registers hold, on sm_90: a thread-block
cluster a row, each row read from memory once.

A row of ``n`` elements goes to a cluster of 8 or 16 blocks (``kaio.cluster_dims``; ``plan``
picks the size); each block keeps its slice of the row in shared memory, reduces it to a
(max, sum of exp(x - max)) pair, and the blocks merge their pairs through distributed shared
memory (``cluster_max_sum``) before each writes ``exp(x - max) / sum`` for its slice. Each
thread reads back only the chunks it stored itself: no block barrier between the passes.

- ``_softmax_f32``, for f32 rows that need clusters of 16: a persistent grid, as many
  clusters as the GPU runs at once (``max_active_clusters``), cluster ``c`` taking rows ``c``,
  ``c + clusters``, and so on. The slice comes by ``cp.async`` (16 bytes a chunk, ``GROUPS``
  groups of ``UNROLL`` chunks a thread, waited for group by group); the first pass stores
  ``exp(x - m)`` over its group's max ``m`` in place, so the second pass is one
  multiplication a value, by ``exp(m - max) / sum``; as each thread reads a chunk in the
  second pass it starts the copy of the next row's chunk into its place, so the next row's
  loads fly while this one is written. f32 [256, 262144] on an H200: 72% -> 78% of copy
  bandwidth (equal on an H100).
- ``_softmax_rows``, for f16 and bf16 (whose slices cannot hold f32 exponentials in place)
  and for shorter f32 rows (clusters of 8, where it measured faster on an H100): a cluster a
  row, loads into registers (``IN_FLIGHT`` elements a thread in flight), both passes
  computing the exponential.

The single-block path (``kaio_ops.rows``) reads a longer row twice (2.94 transfers a call at
262144 f32 elements: at most 68% of copy bandwidth). Rows whose slice would not fit in shared
memory keep that path.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

from dataclasses import dataclass

import kaio
from kaio import f32, u32
from kaio_ops import _arrays
from kaio_ops._common import (
    LOG2E,
    LOWEST,
    block_max_sum,
    fetch,
    merge_max_sum,
    store_f32,
)

CLUSTERS = (8, 16)  # blocks a row: the portable size, then sm_90's largest (opted in)
IN_FLIGHT = 32  # elements a thread of _softmax_rows loads before using any
GROUP = 16  # elements a thread of _softmax_f32 copies in one cp.async group
THREADS = 256
MIN_ROW = 16385  # shorter rows fit in one block's registers (kaio_ops.rows)
SLICE_BYTES = 64 * 1024  # a block's share of the row, when a cluster size gives it: 3 blocks an SM
MAX_SLICE_BYTES = 160 * 1024  # at most (longer rows are read twice, by kaio_ops.rows)
SM_SHARED = 227 * 1024  # shared memory an sm_90 multiprocessor gives its blocks
BLOCK_RESERVED = 1024  # shared memory the hardware keeps per block
MAX_BLOCKS = 4  # blocks an SM the register cap aims for at most (launch_bounds): 64 registers
MAX_PENDING = 7  # cp.async groups a wait may leave pending (kaio.cp_async_wait)
SIM_CLUSTERS = 2  # the persistent grid in the simulator: a cluster takes several rows
# Compared on an H200 (f32, 2026-11-26; 4 calls between a pair of events, so the host's
# time per call is hidden): rows of 262144, _softmax_f32 with 16 x 256 threads, 64 KB slices,
# 3 blocks an SM, 72 registers, 21 clusters at once: 77.7% of copy against 71.7% for
# _softmax_rows; with an exponential in both passes 56-60% (80 registers) and 51-53% (101
# registers, 2 blocks an SM, 14 clusters); 16 x 128 threads 75-77%; 8 x 512 and 8 x 1024
# (128 KB slices) 66-70%; 16 x 512 42%; with no cluster exchange at all (a wrong result, to
# see its cost) 80-82%; one cluster a row with the same cp.async loads 75%; each slice stored
# by one bulk copy (cp.async.bulk) 60%; 2 or 8 chunks a group, or each group's next-row
# copies started before its stores, 76-79% (another run). On an H100 the first run gave 84.7%
# and 85.4%: equal.
# Rows of 65536 (clusters of 8, 32 KB slices): _softmax_f32 76.9% against 76.4% on the H200
# (registers capped for 4 blocks an SM; for 3 68.5%, for 6 74.3%) but 80.5% against 87.5%
# on the H100, so it takes only rows that need clusters of 16. bf16 rows of 262144: the
# persistent grid with both exponentials 57%, _softmax_rows 61%. _softmax_rows on an H100:
# 16 x 256 threads best for f32, 8 x 1024 3-8% slower, 16 x 512 15-40% slower; bf16 8 x 256
# fastest, 8 x 512 up to 30% slower, 4 x 512 16% slower.
MAX, EXPSUM = 0, 1  # a block's pair in shared memory (``cluster_max_sum``)


@kaio.gpu_kernel
def _softmax_f32(
    x: f32[:],
    out: f32[:],
    n: u32,
    rows: u32,
    CLUSTER: kaio.constexpr,
    THREADS: kaio.constexpr,
    BLOCKS: kaio.constexpr,
    VEC: kaio.constexpr,
    UNROLL: kaio.constexpr,
    GROUPS: kaio.constexpr,
):
    """Softmax of rows ``c``, ``c + clusters``, ... of x [rows, n] (flat) into out, for
    cluster ``c`` of the grid's ``clusters``."""
    kaio.cluster_dims(CLUSTER)
    kaio.launch_bounds(THREADS, BLOCKS)
    cache = kaio.shared_dynamic(f32)
    first, count = block_slice(n, VEC, CLUSTER)
    clusters = kaio.grid_dim_x() // CLUSTER
    start = kaio.block_idx_x() // CLUSTER
    rounds = kaio.select(start < rows, (rows - start + clusters - 1) // clusters, 0)
    t = kaio.thread_idx_x()
    if rounds > 0:
        for g in kaio.static_range(GROUPS):
            for u in kaio.static_range(UNROLL):
                c = t + (g * UNROLL + u) * THREADS
                if c < count:
                    fill(VEC, cache, c * VEC, x, start * n + (first + c) * VEC)
            kaio.cp_async_commit()
    tops = kaio.local(f32, (GROUPS,))  # each group's max
    raw = kaio.local(f32, (UNROLL, VEC))
    ov = kaio.local(f32, (VEC,))
    for k in range(rounds):
        top = LOWEST  # the running max and sum of exp(x - top) of this thread's part of the row
        total = 0.0
        for g in kaio.static_range(GROUPS):
            if GROUPS - 1 - g > MAX_PENDING:
                kaio.cp_async_wait(MAX_PENDING)  # waiting for more groups than needed is safe
            else:
                kaio.cp_async_wait(GROUPS - 1 - g)
            group_top = LOWEST  # finite, so a chunk of -inf gives exp(-inf) = 0, not NaN
            for u in kaio.static_range(UNROLL):
                c = t + (g * UNROLL + u) * THREADS
                if c < count:
                    fetch(VEC, raw, u, cache, c * VEC, f32)
                    for j in kaio.static_range(VEC):
                        group_top = kaio.max(group_top, raw[u, j])
            tops[g] = group_top
            s = 0.0
            for u in kaio.static_range(UNROLL):
                c = t + (g * UNROLL + u) * THREADS
                if c < count:
                    for j in kaio.static_range(VEC):
                        ov[j] = kaio.exp2_ftz((raw[u, j] - group_top) * LOG2E)
                        s += ov[j]
                    store_f32(cache, c * VEC, ov, 0, VEC, f32)
            top, total = merge_max_sum(top, total, group_top, s)
        if k > 0:
            kaio.cluster_wait()  # every block has read the previous row's pair
        top, total = cluster_max_sum(top, total, CLUSTER)
        inv = 1.0 / total
        base = (start + k * clusters) * n + first * VEC
        following = base + clusters * n  # the same slice of the cluster's next row
        for g in kaio.static_range(GROUPS):
            scale = kaio.exp2_ftz((tops[g] - top) * LOG2E) * inv
            for u in kaio.static_range(UNROLL):
                c = t + (g * UNROLL + u) * THREADS
                if c < count:
                    fetch(VEC, raw, u, cache, c * VEC, f32)
                    for j in kaio.static_range(VEC):
                        ov[j] = raw[u, j] * scale
                    store_f32(out, base + c * VEC, ov, 0, VEC, f32)
                    if k + 1 < rounds:
                        fill(VEC, cache, c * VEC, x, following + c * VEC)
            kaio.cp_async_commit()
    if rounds > 0:
        kaio.cluster_wait()  # no block exits while another may still read its pair


@kaio.gpu_func
def block_slice(n: u32, VEC: kaio.constexpr, CLUSTER: kaio.constexpr) -> tuple[u32, u32]:
    """``(first, count)``: the first chunk and the number of chunks of this block's slice of
    a row of ``n`` elements in chunks of VEC (the last blocks' may be shorter or empty)."""
    chunks = n // VEC
    per = (chunks + CLUSTER - 1) // CLUSTER
    first = kaio.cluster_rank() * per
    return first, kaio.select(first < chunks, kaio.min(per, chunks - first), 0)


@kaio.gpu_func
def fill(VEC: kaio.constexpr, cache: f32[:], i: u32, src: f32[:], j: u32):
    """Start copying chunk src[j : j + VEC] to cache[i : i + VEC]: by cp.async when the
    chunk is 16 bytes, else (one element) by a load and a store."""
    if VEC == 1:
        cache[i] = src[j]
    else:
        kaio.cp_async_cg(cache, i, src, j, 16)


@kaio.gpu_func
def cluster_max_sum(m: f32, s: f32, CLUSTER: kaio.constexpr) -> tuple[f32, f32]:
    """Every thread's ``(max, sum of exp(v - max))`` pair ``(m, s)`` merged over the cluster:
    over the block, then the blocks' pairs published in shared ``pair`` and read from each
    block's shared memory; every thread gets the row's pair. Ends with ``cluster_arrive``:
    the block must ``cluster_wait`` before it calls this again or exits."""
    pair = kaio.shared(f32, (2,))
    red0 = kaio.shared(f32, (32,))
    red1 = kaio.shared(f32, (32,))
    m, s = block_max_sum(m, s, red0, red1)
    if kaio.thread_idx_x() == 0:
        pair[MAX] = m
        pair[EXPSUM] = s
    kaio.cluster_sync()
    m = LOWEST
    s = 0.0
    for r in kaio.static_range(CLUSTER):
        m, s = merge_max_sum(
            m, s, kaio.cluster_load(pair, MAX, r), kaio.cluster_load(pair, EXPSUM, r)
        )
    kaio.cluster_arrive()  # this block has read the others' pairs
    return m, s


@kaio.gpu_kernel
def _softmax_rows(
    x: DT[:],
    out: DT[:],
    n: u32,
    CLUSTER: kaio.constexpr,
    THREADS: kaio.constexpr,
    VEC: kaio.constexpr,
    UNROLL: kaio.constexpr,
    DT: kaio.constexpr,
):
    """Softmax of row ``block_idx_x // CLUSTER`` of x [rows, n] (flat) into out."""
    kaio.cluster_dims(CLUSTER)
    kaio.launch_bounds(THREADS)
    cache = kaio.shared_dynamic(DT)
    first, count = block_slice(n, VEC, CLUSTER)
    base = kaio.block_idx_x() // CLUSTER * n + first * VEC
    t = kaio.thread_idx_x()
    nt = THREADS
    top = LOWEST  # the running max and sum of exp(x - top) of this thread's part of the row
    total = 0.0
    raw = kaio.local(DT, (UNROLL, VEC))
    for c in range(t, count, THREADS * UNROLL):
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                fetch(VEC, raw, u, x, base + (c + u * nt) * VEC, DT)
        chunk_top = LOWEST
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                for j in kaio.static_range(VEC):
                    chunk_top = kaio.max(chunk_top, f32(raw[u, j]))
        s = 0.0
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                keep(VEC, cache, (c + u * nt) * VEC, raw, u, DT)
                for j in kaio.static_range(VEC):
                    s += kaio.exp2_ftz((f32(raw[u, j]) - chunk_top) * LOG2E)
        top, total = merge_max_sum(top, total, chunk_top, s)
    top, total = cluster_max_sum(top, total, CLUSTER)
    inv = 1.0 / total
    ov = kaio.local(f32, (VEC,))
    for c in range(t, count, THREADS * UNROLL):
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                fetch(VEC, raw, u, cache, (c + u * nt) * VEC, DT)
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                for j in kaio.static_range(VEC):
                    ov[j] = kaio.exp2_ftz((f32(raw[u, j]) - top) * LOG2E) * inv
                store_f32(out, base + (c + u * nt) * VEC, ov, 0, VEC, DT)
    kaio.cluster_wait()  # no block exits while another may still read its pair


@kaio.gpu_func
def keep(
    VEC: kaio.constexpr, dst: DT[:], i: u32, raw: DT[:, :], u: kaio.constexpr, DT: kaio.constexpr
):
    """dst[i : i + VEC] = raw[u] (one vector store when VEC > 1)."""
    if VEC == 1:
        dst[i] = raw[u, 0]
    else:
        kaio.store_vector(dst, i, raw[u])


@dataclass(frozen=True)
class Plan:
    """How the cluster path runs rows of one length in chunks of ``vec`` elements: blocks a
    row (``cluster``), threads a block, each block's slice in shared memory (bytes), chunks a
    thread handles at a time (``unroll``); for f32 (``persistent``), the cp.async groups a
    thread and the blocks an SM the registers are capped for."""

    cluster: int
    threads: int
    shared_bytes: int
    vec: int
    unroll: int
    persistent: bool
    groups: int = 0
    blocks: int = 0

    def constexprs(self) -> dict:
        """The kernel's compile-time arguments."""
        common = {"CLUSTER": self.cluster, "THREADS": self.threads, "VEC": self.vec}
        if not self.persistent:
            return {**common, "UNROLL": self.unroll}
        return {**common, "BLOCKS": self.blocks, "UNROLL": self.unroll, "GROUPS": self.groups}


def plan(n: int, itemsize: int, vec: int, cluster: int = 0, threads: int = THREADS):
    """The ``Plan`` for rows of ``n`` elements of ``itemsize`` bytes in chunks of ``vec``: the
    smallest cluster (of ``CLUSTERS``, or ``cluster``) whose slices take at most
    SLICE_BYTES, else the largest; None when the row fits one block's registers or a slice
    would pass MAX_SLICE_BYTES."""
    if n < MIN_ROW:
        return None
    for size in (cluster,) if cluster else CLUSTERS:
        per = -(-(n // vec) // size)  # chunks a block
        nbytes = per * vec * itemsize
        if nbytes <= SLICE_BYTES:
            break
    if nbytes > MAX_SLICE_BYTES:
        return None
    if itemsize != 4 or size != CLUSTERS[-1]:
        return Plan(size, threads, nbytes, vec, min(8, IN_FLIGHT // vec), persistent=False)
    unroll = min(8, GROUP // vec)
    groups = -(-per // (threads * unroll))
    blocks = max(1, min(MAX_BLOCKS, SM_SHARED // (nbytes + 2 * BLOCK_RESERVED)))
    return Plan(size, threads, nbytes, vec, unroll, True, groups, blocks)


def available(x: _arrays.Operand) -> bool:
    """Whether launches on ``x`` can use clusters: on the simulator, or a GPU of sm_90 or
    newer."""
    dev = _arrays.gpu(x)
    return dev is None or int(dev.arch[3:].rstrip("a")) >= 90


_FIT: dict = {}  # (device ordinal, plan) -> max_active_clusters


def clusters(x: _arrays.Operand, p: Plan, rows: int) -> int:
    """The persistent grid's clusters for ``rows`` rows of ``x``: as many as its GPU runs at
    once (asked once per GPU and plan), SIM_CLUSTERS in the simulator, at most one a row."""
    dev = _arrays.gpu(x)
    if dev is None:
        return min(rows, SIM_CLUSTERS)
    key = (dev.ordinal, p)
    fit = _FIT.get(key)
    if fit is None:
        fit = _FIT[key] = _softmax_f32.max_active_clusters(
            p.threads, p.shared_bytes, device=dev, **p.constexprs()
        )
    return max(1, min(rows, fit))


def softmax(x: _arrays.Operand, out, p: Plan) -> None:
    """Launch the cluster kernel over the rows of x [..., n] into ``out`` (x's kind), as
    ``p`` says."""
    n = x.shape[-1]
    rows = x.size // n
    flat = _arrays.output_arg(x, out, (x.size,))
    stream = _arrays.stream_of(x)
    if p.persistent:
        config = (clusters(x, p, rows) * p.cluster, p.threads, stream, p.shared_bytes)
        _softmax_f32[config](x.arg(x.size), flat, n, rows, **p.constexprs())
    else:
        config = (rows * p.cluster, p.threads, stream, p.shared_bytes)
        _softmax_rows[config](x.arg(x.size), flat, n, **p.constexprs(), DT=x.dtype)


def shipped():
    """(kernel, constexprs) of every specialization the cluster path launches for rows of
    262144 elements (the benchmark's; other lengths change only f32's GROUPS)."""
    for dtype in _arrays.FLOATS:
        for vec in (1, 16 // dtype.itemsize):
            for cluster in CLUSTERS:
                p = plan(262144, dtype.itemsize, vec, cluster)
                if p is not None:
                    if p.persistent:
                        yield _softmax_f32, p.constexprs()
                    else:
                        yield _softmax_rows, {**p.constexprs(), "DT": dtype}
