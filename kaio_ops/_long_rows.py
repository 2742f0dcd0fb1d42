"""Softmax over rows longer than one block's registers hold, on sm_90: one thread-block
cluster a row, the row read from memory once.

A row of ``n`` elements goes to a cluster of 8 or 16 blocks (``kaio.cluster_dims``; ``plan``
picks the size); each block takes its slice of the row and keeps it in shared memory as read:

1. load the slice (``unroll(vec)`` chunks a thread in flight, all loads before any use), store it
   to shared memory as is, and keep a running (max, sum of exp(x - max)) per thread;
2. reduce the pairs over the block, publish the block's pair in shared memory;
3. ``cluster_sync``; every thread merges the cluster's pairs, read from the other blocks'
   shared memory (``cluster_load``), then ``cluster_arrive``;
4. write ``exp(x - max) / sum`` for the slice, from shared memory; ``cluster_wait`` before
   exiting, so that no block exits while another may still read its pair (the arrival
   long done, the wait costs nothing).

The single-block path (``kaio_ops.rows``) reads a longer row twice (2.94 transfers a call at
262144 f32 elements: at most 68% of copy bandwidth); this one moves each byte once in and
once out. Rows whose slice would not fit in shared memory keep the two-pass path.
"""

from __future__ import annotations

from dataclasses import dataclass

import kaio
from kaio import f32, u32
from kaio_ops import _arrays
from kaio_ops._common import (
    DT,
    LOG2E,
    LOWEST,
    block_max_sum,
    fetch,
    merge_max_sum,
    store_f32,
)
from kaio_ops._typed import by_dtype

CLUSTERS = (8, 16)  # blocks a row: the portable size, then sm_90's largest (opted in)
IN_FLIGHT = 32  # elements each thread has in flight: UNROLL = 8 chunks of f32, 4 of f16
THREADS = 256
MIN_ROW = 16385  # shorter rows fit in one block's registers (kaio_ops.rows)
SLICE_BYTES = 64 * 1024  # a block's share of the row, when a cluster size gives it: 3 blocks an SM
MAX_SLICE_BYTES = 160 * 1024  # at most (longer rows are read twice, by kaio_ops.rows)
# Compared on an H100 (rows of 262144, one run; the script's times include the launch's host
# time, so only the ratios count): f32 16 x 256 threads (64 KB slices) fastest, 8 x 1024
# threads (128 KB, one block an SM) 3-8% slower, 16 x 512 15-40% slower; bf16 8 x 256
# fastest, 8 x 512 up to 30% slower, 4 x 512 16% slower. A persistent grid (each cluster
# taking several rows) lost: clusters that did not fit ran their rows last. Splitting the
# second cluster barrier (arrive after the reads, wait before exiting): 0-2%. In
# `python -m bench all` (f32 [256, 262144]): 86% of copy bandwidth, 65% before.
MAX, EXPSUM = 0, 1


@kaio.gpu_kernel
def _softmax_cluster(
    x: DT[:],
    out: DT[:],
    n: u32,
    CLUSTER: kaio.constexpr,
    THREADS: kaio.constexpr,
    VEC: kaio.constexpr,
    UNROLL: kaio.constexpr,
):
    """Softmax of row ``block_idx_x // CLUSTER`` of x [rows, n] (flat) into out."""
    kaio.cluster_dims(CLUSTER)
    kaio.launch_bounds(THREADS)
    cache = kaio.shared_dynamic(DT)
    pair = kaio.shared(f32, (2,))
    red0 = kaio.shared(f32, (32,))
    red1 = kaio.shared(f32, (32,))
    chunks = n // VEC
    per = (chunks + CLUSTER - 1) // CLUSTER
    first = kaio.cluster_rank() * per
    count = kaio.select(first < chunks, kaio.min(per, chunks - first), 0)
    base = kaio.block_idx_x() // CLUSTER * n + first * VEC
    one_row(x, out, base, count, cache, pair, red0, red1, CLUSTER, THREADS, VEC, UNROLL)


@kaio.gpu_func
def one_row(
    x: DT[:],
    out: DT[:],
    base: u32,
    count: u32,
    cache: DT[:],
    pair: f32[:],
    red0: f32[:],
    red1: f32[:],
    CLUSTER: kaio.constexpr,
    THREADS: kaio.constexpr,
    VEC: kaio.constexpr,
    UNROLL: kaio.constexpr,
):
    """This block's ``count`` chunks of its row, from element ``base`` (steps 1 to 4 of the
    module's description). Each thread reads back only the cache entries it wrote itself:
    no block barrier between the passes."""
    t = kaio.thread_idx_x()
    nt = THREADS
    acc = kaio.local(f32, (2,))
    acc[MAX] = LOWEST
    acc[EXPSUM] = 0.0
    raw = kaio.local(DT, (UNROLL, VEC))
    for c in range(t, count, THREADS * UNROLL):
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                fetch(VEC, raw, u, x, base + (c + u * nt) * VEC)
        top = LOWEST  # finite, so a chunk of -inf gives exp(-inf) = 0, not NaN
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                for j in kaio.static_range(VEC):
                    top = kaio.max(top, f32(raw[u, j]))
        s = 0.0
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                keep(VEC, cache, (c + u * nt) * VEC, raw, u)
                for j in kaio.static_range(VEC):
                    s += kaio.exp2_ftz((f32(raw[u, j]) - top) * LOG2E)
        merge_max_sum(top, s, acc)
    block_max_sum(acc, red0, red1)
    if t == 0:
        pair[MAX] = acc[MAX]
        pair[EXPSUM] = acc[EXPSUM]
    kaio.cluster_sync()
    acc[MAX] = LOWEST
    acc[EXPSUM] = 0.0
    for r in kaio.static_range(CLUSTER):
        merge_max_sum(kaio.cluster_load(pair, MAX, r), kaio.cluster_load(pair, EXPSUM, r), acc)
    kaio.cluster_arrive()  # this block has read the others' pairs
    inv = 1.0 / acc[EXPSUM]
    ov = kaio.local(f32, (VEC,))
    for c in range(t, count, THREADS * UNROLL):
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                fetch(VEC, raw, u, cache, (c + u * nt) * VEC)
        for u in kaio.static_range(UNROLL):
            if c + u * nt < count:
                for j in kaio.static_range(VEC):
                    ov[j] = kaio.exp2_ftz((f32(raw[u, j]) - acc[MAX]) * LOG2E) * inv
                store_f32(out, base + (c + u * nt) * VEC, ov, 0, VEC)
    kaio.cluster_wait()  # no block exits while another may still read its pair


@kaio.gpu_func
def keep(VEC: kaio.constexpr, dst: DT[:], i: u32, raw: DT[:, :], u: kaio.constexpr):
    """dst[i : i + VEC] = raw[u] (one vector store when VEC > 1)."""
    if VEC == 1:
        dst[i] = raw[u, 0]
    else:
        kaio.store_vector(dst, i, raw[u])


_KERNEL = by_dtype(_softmax_cluster)


@dataclass(frozen=True)
class Plan:
    """How the cluster path runs rows of one length: blocks a row (``cluster``), threads a
    block and each block's slice in shared memory (bytes)."""

    cluster: int
    threads: int
    shared_bytes: int


def plan(n: int, itemsize: int, vec: int, cluster: int = 0, threads: int = THREADS):
    """The ``Plan`` for rows of ``n`` elements in chunks of ``vec``: the smallest cluster
    (of ``CLUSTERS``, or ``cluster``) whose slices take at most SLICE_BYTES, else the
    largest; None when the row fits one block's registers or a slice would pass
    MAX_SLICE_BYTES."""
    if n < MIN_ROW:
        return None
    for size in (cluster,) if cluster else CLUSTERS:
        per = -(-(n // vec) // size)  # chunks a block
        nbytes = per * vec * itemsize
        if nbytes <= SLICE_BYTES:
            break
    return Plan(size, threads, nbytes) if nbytes <= MAX_SLICE_BYTES else None


def unroll(vec: int) -> int:
    """Chunks of ``vec`` elements a thread loads before using any (at most 8 scalars).
    Measured on an H100: f32 8 chunks 1-3% faster than 4, f16 and bf16 4 chunks 5-9%
    faster than 8."""
    return min(8, IN_FLIGHT // vec)


def available(x: _arrays.Operand) -> bool:
    """Whether launches on ``x`` can use clusters: on the simulator, or a GPU of sm_90 or
    newer."""
    dev = _arrays.gpu(x)
    return dev is None or int(dev.arch[3:].rstrip("a")) >= 90


def softmax(x: _arrays.Operand, out, vec: int, p: Plan) -> None:
    """Launch the cluster kernel over the rows of x [..., n] into ``out`` (x's kind), with
    ``vec`` elements a chunk, as ``p`` says."""
    n = x.shape[-1]
    rows = x.size // n
    flat = _arrays.output_arg(x, out, (x.size,))
    config = (rows * p.cluster, p.threads, _arrays.stream_of(x), p.shared_bytes)
    _KERNEL[x.dtype][config](
        x.arg(x.size), flat, n, CLUSTER=p.cluster, THREADS=p.threads, VEC=vec, UNROLL=unroll(vec)
    )


def shipped():
    """(kernel, constexprs) of every specialization the cluster path launches."""
    for dtype in _arrays.FLOATS:
        for vec in (1, 16 // dtype.itemsize):
            for cluster in CLUSTERS:
                yield (
                    _KERNEL[dtype],
                    {
                        "CLUSTER": cluster,
                        "THREADS": THREADS,
                        "VEC": vec,
                        "UNROLL": unroll(vec),
                    },
                )
