"""Multi-register instructions in the simulator: vector loads and stores, ``ldmatrix``,
``mma.sync`` with the PTX ISA's fragment layouts, and ``cp.async`` with its groups.

A fragment (``kaio.ir.nodes.Frag``) is a run of one local array's elements, so its values are
a column slice of that array's per-lane storage. Vector accesses move bytes: ``k`` consecutive
elements of the memory array along its last dimension, reinterpreted as the fragment's type,
checked for bounds and for the alignment the hardware needs.

``cp.async`` is simulated as the hardware allows it to behave at its latest: the source is
read when the copy is issued, the destination is written only when a ``cp_async_wait`` of the
issuing thread completes the copy's group. Reading the destination earlier sees the old bytes
(poison in fresh shared memory). The race detector checks the write when the copy is issued
(on the GPU its bytes may land from then on: another thread's earlier access must be ordered
before the issue) and records it at the wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from kaio.errors import SimulationError
from kaio.ir.nodes import Frag, Instr
from kaio.ir.ops import MMA_KINDS
from kaio.sim import memory, threads

# --------------------------------------------------------------------------- fragments


def frag_view(m, frag: Frag) -> np.ndarray:
    """The (lanes, size) view of ``frag``'s elements in its array's storage."""
    data = m.storage(frag.array).data
    return data.reshape(m.n, -1)[:, frag.start : frag.start + frag.size]


def _write_frag(m, frag: Frag, values: np.ndarray, lanes) -> None:
    view = frag_view(m, frag)
    values = np.ascontiguousarray(values).view(view.dtype).reshape(-1, frag.size)
    if lanes is None:
        view[:] = values
    else:
        view[lanes] = values


def _read_frag(m, frag: Frag, lanes) -> np.ndarray:
    view = frag_view(m, frag)
    return np.ascontiguousarray(view if lanes is None else view[lanes])


# --------------------------------------------------------------------------- byte spans


def _span(
    m, ins: Instr, arr, idx_vals: list, nbytes: int, what: str, lanes=None, needed=None, align=0
):
    """The ``nbytes`` starting at ``arr[idx]`` for ``lanes`` (None: the active lanes), as
    ``(lanes, index, keys)``: a NumPy index of shape (lanes, k) into the storage, and the
    flat element keys for the race detector. Raises for elements out of bounds (only the
    first ``needed[lane]`` elements are checked when given) and for addresses that are not
    a multiple of ``align`` bytes (0: of nbytes)."""
    st = m.storage(arr)
    size = st.data.itemsize
    k = nbytes // size
    lanes, ix, key = memory.locate(m, ins, st, idx_vals, what, lanes)
    count = np.full(len(key), k, np.int64) if needed is None else needed
    last = ix[-1] + np.maximum(count, 1) - 1
    bad = last >= st.shape[-1]
    if bad.any():
        j = int(np.argmax(bad))
        lane = j if lanes is None else int(lanes[j])
        index = [int(i[j]) for i in ix[-len(st.shape) :]]
        index[-1] = int(last[j])
        memory.out_of_bounds(m, ins, st, index, lane, what)
    if st.scope == "grid":
        if k > 1 and st.data.strides[-1] != size:
            raise SimulationError(
                f"{m.where(ins)}: {what} of {nbytes} bytes needs array '{arr.name}' to be "
                f"contiguous in its last dimension (stride {st.data.strides[-1]} bytes)"
                f"{m.source(ins)}"
            )
        address = st.data.__array_interface__["data"][0] + sum(
            i * s for i, s in zip(ix, st.data.strides, strict=True)
        )
    else:
        lead = ix[0]
        address = (key - lead * st.size) * size
    misaligned = address % (align or nbytes) != 0
    if misaligned.any():
        j = int(np.argmax(misaligned))
        lane = j if lanes is None else int(lanes[j])
        index = ", ".join(str(int(i[j])) for i in ix[-len(st.shape) :])
        raise SimulationError(
            f"{m.where(ins)}: misaligned {nbytes}-byte {what} of {arr.space} array "
            f"'{arr.name}' at index [{index}] by {m.describe(lane)}: the address must be a "
            f"multiple of {align or nbytes} bytes{m.source(ins)}"
        )
    steps = np.arange(k)
    inside = steps[None, :] < count[:, None]
    cols = np.where(inside, ix[-1][:, None] + steps, ix[-1][:, None])
    index = (*(i[:, None] for i in ix[:-1]), cols)
    keys = np.where(inside, key[:, None] + steps, key[:, None])
    return lanes, index, keys


def _track(m, ins: Instr, arr, keys: np.ndarray, lanes, write: bool, record: bool = True) -> None:
    tracker = m.storage(arr).tracker
    if tracker is None:
        return
    cur = m.lane_index if lanes is None else lanes
    for j in range(keys.shape[1]):
        tracker.access(m, ins, keys[:, j], cur, write, record=record)


def _bytes_of(values: np.ndarray, nbytes: int) -> np.ndarray:
    return np.ascontiguousarray(values).view(np.uint8).reshape(-1, nbytes)


def ld_vec(m, ins: Instr, vals: list):
    """``frag[:] = the bytes at array[idx...]`` in one access."""
    frag, arr = ins.args[0], ins.args[1]
    nbytes = frag.size * frag.array.dtype.itemsize
    lanes, index, keys = _span(m, ins, arr, vals, nbytes, "vector load")
    _track(m, ins, arr, keys, lanes, write=False)
    data = m.storage(arr).data[index]
    _write_frag(m, frag, _bytes_of(data, nbytes), lanes)


def st_vec(m, ins: Instr, vals: list):
    """``array[idx...] = frag's bytes`` in one access."""
    arr, frag = ins.args[0], ins.args[-1]
    nbytes = frag.size * frag.array.dtype.itemsize
    lanes, index, keys = _span(m, ins, arr, vals, nbytes, "vector store")
    _track(m, ins, arr, keys, lanes, write=True)
    st = m.storage(arr)
    raw = _bytes_of(_read_frag(m, frag, lanes), nbytes)
    st.data[index] = raw.view(st.data.dtype).reshape(index[-1].shape)


def prefetch_l2(m, ins: Instr, vals: list):
    """A hint with no effect on values: only the bounds of ``array[idx...]`` are checked, and
    a bulk prefetch's 16-byte alignment (cp.async.bulk.prefetch.L2)."""
    arr = ins.args[0]
    bulk = ins.attrs.get("bulk")
    nbytes = bulk or m.storage(arr).data.itemsize
    _span(m, ins, arr, vals, nbytes, "L2 prefetch", align=16 if bulk else 0)


# --------------------------------------------------------------------------- warp-wide


def _full_warps(m, ins: Instr, what: str) -> np.ndarray:
    """The active lanes, after checking that they form whole 32-lane warps."""
    threads.require_converged_warps(m, ins, what)
    counts = np.add.reduceat(m.mask.astype(np.int64), m.warp_starts)
    bad = np.flatnonzero((counts > 0) & (counts != 32))
    if len(bad):
        lane = int(m.warp_starts[bad[0]])
        raise SimulationError(
            f"{m.where(ins)}: {what} needs all 32 lanes of the warp, but warp "
            f"{int(m.lane_thread[lane]) // 32} of block {m.block_coords(lane)} has "
            f"{int(counts[bad[0]])} (make the block size a multiple of 32 and keep every lane "
            f"of the warp running){m.source(ins)}"
        )
    return np.flatnonzero(m.mask)


def ldmatrix(m, ins: Instr, vals: list):
    """Warp-wide load of 1, 2 or 4 8x8 matrices of 16-bit elements (PTX ``ldmatrix``)."""
    frag, arr = ins.args[0], ins.args[1]
    lanes = _full_warps(m, ins, "ldmatrix")
    count = frag.size
    readers = lanes[m.laneid[lanes] < 8 * count]
    _, index, keys = _span(m, ins, arr, vals, 16, "ldmatrix row read", lanes=readers)
    _track(m, ins, arr, keys, readers, write=False)
    rows = np.zeros((m.n, 16), np.uint8)
    rows[readers] = _bytes_of(m.storage(arr).data[index], 16)
    lid = m.laneid[lanes]
    base = lanes - lid
    out = np.empty((len(lanes), count), np.uint32)
    if ins.attrs["trans"]:
        halves = rows.view(np.uint16).astype(np.uint32)
        for i in range(count):
            row = base + 8 * i + 2 * (lid % 4)
            out[:, i] = halves[row, lid // 4] | (halves[row + 1, lid // 4] << 16)
    else:
        words = rows.view(np.uint32)
        for i in range(count):
            out[:, i] = words[base + 8 * i + lid // 4, lid % 4]
    _write_frag(m, frag, out, lanes)


def _layout(count: int, position) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) arrays of shape (32, count): element e of lane t sits at position(g, t, e)
    with g = t // 4 (the group) and t % 4 (the thread in the group)."""
    rows = np.empty((32, count), np.int64)
    cols = np.empty((32, count), np.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for e in range(count):
            rows[lane, e], cols[lane, e] = position(g, t, e)
    return rows, cols


def _acc_position(g, t, e):
    return g + 8 * (e // 2), 2 * t + e % 2


# Per kind: element layouts of A (M x K), B (K x N) and C/D (M x N), in elements per lane
# (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k32 / m16n8k8").
LAYOUTS = {
    "f16": (
        _layout(8, lambda g, t, e: (g + 8 * (e // 2 % 2), 2 * t + e % 2 + 8 * (e // 4))),
        _layout(4, lambda g, t, e: (2 * t + e % 2 + 8 * (e // 2), g)),
        _layout(4, _acc_position),
    ),
    "s8": (
        _layout(16, lambda g, t, e: (g + 8 * (e // 4 % 2), 4 * t + e % 4 + 16 * (e // 8))),
        _layout(8, lambda g, t, e: (4 * t + e % 4 + 16 * (e // 4), g)),
        _layout(4, _acc_position),
    ),
    "tf32": (
        _layout(4, lambda g, t, e: (g + 8 * (e % 2), t + 4 * (e // 2))),
        _layout(2, lambda g, t, e: (t + 4 * e, g)),
        _layout(4, _acc_position),
    ),
}
LAYOUTS["bf16"] = LAYOUTS["f16"]
LAYOUTS["e4m3"] = LAYOUTS["e5m2"] = LAYOUTS["s8"]  # every 8-bit input has s8's fragments

_ELEMENTS = {
    "f16": lambda w: w.view(np.float16).astype(np.float64),
    "bf16": lambda w: w.view(ml_dtypes.bfloat16).astype(np.float64),
    "s8": lambda w: w.view(np.int8).astype(np.int64),
    "e4m3": lambda w: w.view(ml_dtypes.float8_e4m3fn).astype(np.float64),
    "e5m2": lambda w: w.view(ml_dtypes.float8_e5m2).astype(np.float64),
    # tf32: the tensor core reads the sign, exponent and top 10 mantissa bits.
    "tf32": lambda w: (w & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64),
}


def _matrix(values: np.ndarray, layout, shape) -> np.ndarray:
    rows, cols = layout
    warps = values.reshape(-1, 32, rows.shape[1])
    out = np.zeros((warps.shape[0], *shape), values.dtype)
    out[:, rows, cols] = warps
    return out


def mma(m, ins: Instr, vals: list):
    """Warp-wide ``d = a @ b + c`` with the fragment layouts of ``LAYOUTS``. Floats: the exact
    products summed in f64 and rounded once to f32 (the hardware's order and rounding differ
    by at most a few ulps); s8: exact, wrapped to s32."""
    name = ins.attrs["kind"]
    kind = MMA_KINDS[name]
    lanes = _full_warps(m, ins, f"mma_{name}")
    d, a, b, c = ins.args
    mdim, ndim, kdim = kind.shape
    la, lb, lc = LAYOUTS[name]
    elements = _ELEMENTS[name]
    amat = _matrix(elements(_read_frag(m, a, lanes).view(np.uint32)), la, (mdim, kdim))
    bmat = _matrix(elements(_read_frag(m, b, lanes).view(np.uint32)), lb, (kdim, ndim))
    cvals = _read_frag(m, c, lanes)
    if kind.acc == "s32":
        cmat = _matrix(cvals.astype(np.int64), lc, (mdim, ndim))
        result = (amat @ bmat + cmat).astype(np.int32)
    else:
        cmat = _matrix(cvals.astype(np.float64), lc, (mdim, ndim))
        result = (amat @ bmat + cmat).astype(np.float32)
        nan = np.isnan(result)
        if nan.any():
            result.view(np.uint32)[nan] = 0x7FFFFFFF
    rows, cols = lc
    _write_frag(m, d, result[:, rows, cols], lanes)


def to_tf32(t, x):
    """Round f32 to tf32 (nearest, ties away from zero), kept in f32 format."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


# --------------------------------------------------------------------------- cp.async


@dataclass
class _Copy:
    """The copies one ``cp_async`` issued: per lane its group, destination and bytes."""

    lanes: np.ndarray
    group: np.ndarray
    array: object
    index: tuple
    keys: np.ndarray
    data: np.ndarray

    def subset(self, which: np.ndarray) -> _Copy:
        """The copies of the lanes selected by the boolean mask ``which``."""
        return _Copy(
            self.lanes[which],
            self.group[which],
            self.array,
            tuple(i[which] for i in self.index),
            self.keys[which],
            self.data[which],
        )


class AsyncCopies:
    """The issued, not yet completed ``cp.async`` copies of a batch of blocks, and how many
    groups each lane has committed (a copy belongs to its lane's open group)."""

    def __init__(self, n: int):
        self.committed = np.zeros(n, np.int64)
        self.pending: list[_Copy] = []


def _async_state(m) -> AsyncCopies:
    if m.async_copies is None:
        m.async_copies = AsyncCopies(m.n)
    return m.async_copies


def cp_async(m, ins: Instr, vals: list):
    """Issue ``nbytes`` from global to shared: the source is read now (only its first
    ``src_bytes``; the rest is zeros), the destination is written at the completing wait
    (and checked for races now)."""
    dst = ins.args[0]
    src = ins.args[1 + dst.ndim]
    nbytes = ins.attrs["bytes"]
    dst_vals, src_vals = vals[: dst.ndim], vals[dst.ndim : dst.ndim + src.ndim]
    active = m.active_lanes()
    lanes = np.arange(m.n) if active is None else active
    src_bytes = m.pick(vals[-1], active).astype(np.int64)
    if (src_bytes > nbytes).any():
        lane = int(lanes[int(np.argmax(src_bytes > nbytes))])
        raise SimulationError(
            f"{m.where(ins)}: cp_async src_bytes {int(src_bytes.max())} is more than the "
            f"{nbytes} bytes copied, by {m.describe(lane)}{m.source(ins)}"
        )
    data = np.zeros((len(lanes), nbytes), np.uint8)
    reading = src_bytes > 0
    if reading.any():
        st = m.storage(src)
        needed = -(-src_bytes[reading] // st.data.itemsize)
        _, index, _ = _span(
            m, ins, src, src_vals, nbytes, "cp_async read", lanes=lanes[reading], needed=needed
        )
        raw = _bytes_of(st.data[index], nbytes)
        keep = np.arange(nbytes)[None, :] < src_bytes[reading][:, None]
        data[reading] = np.where(keep, raw, 0)
    _, index, keys = _span(m, ins, dst, dst_vals, nbytes, "cp_async write", lanes=lanes)
    _track(m, ins, dst, keys, lanes, write=True, record=False)  # (recorded at the wait)
    state = _async_state(m)
    group = state.committed[lanes].copy()
    state.pending.append(_Copy(lanes, group, dst, index, keys, data))


def cp_async_commit(m, ins: Instr, vals: list):
    """Close the active lanes' open copy group."""
    state = _async_state(m)
    active = m.active_lanes()
    state.committed[slice(None) if active is None else active] += 1


def cp_async_wait(m, ins: Instr, vals: list):
    """Complete, for the active lanes, every copy of a group older than their newest
    ``pending`` committed groups."""
    state = _async_state(m)
    still = []
    for copy in state.pending:
        lanes = copy.lanes
        done = m.mask[lanes] & (copy.group < state.committed[lanes] - ins.attrs["pending"])
        if done.any():
            landed = copy.subset(done)
            st = m.storage(copy.array)
            _track(m, ins, copy.array, landed.keys, landed.lanes, write=True)
            st.data[landed.index] = landed.data.view(st.data.dtype).reshape(landed.index[-1].shape)
        if not done.all():
            still.append(copy.subset(~done))
    state.pending = still
