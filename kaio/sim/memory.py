"""Memory in the simulator: where each array lives, bounds-checked loads, stores and atomics,
and the shared-memory race detector.

Global arrays are the caller's NumPy arrays, indexed in place (non-contiguous views too).
Shared arrays get one copy per block of the batch (``data[block, *index]``), local arrays one
per lane (``data[lane, *index]``); both start filled with a poison value (NaN, all-ones
integers, True) so that reading memory nobody wrote shows.
"""

from __future__ import annotations

import numpy as np

from kaio.errors import SimulationError
from kaio.ir.nodes import Array, Instr
from kaio.sim import arith
from kaio.types import ScalarType


def poison(dtype: np.dtype):
    """The fill value of uninitialized shared and local memory."""
    if dtype.kind == "b":
        return True
    if dtype.kind in "iu":
        return np.array(-1).astype(dtype)
    return np.nan


class Storage:
    """The elements of one ``Array`` during a batch of blocks.

    ``scope`` says what the leading index of ``data`` is: ``"grid"`` (none: the caller's
    global array), ``"block"`` (the block within the batch) or ``"lane"``. ``shape`` is the
    array's shape as the kernel sees it; ``tracker`` is the race detector (shared memory).
    """

    def __init__(self, array: Array, data: np.ndarray, scope: str, tracker=None):
        self.array = array
        self.data = data
        self.scope = scope
        self.shape = data.shape if scope == "grid" else data.shape[1:]
        self.tracker = tracker
        self.size = int(np.prod(self.shape, dtype=np.int64))


def make_storages(m, arrays: dict, dynamic_shared_bytes: int, race_check: bool) -> dict:
    """The storage of every array of ``m.function`` for a batch of ``m.nb`` blocks."""
    out = {}
    dyn_views: dict = {}
    dyn_bytes = np.zeros((m.nb, dynamic_shared_bytes), np.uint8)
    dyn_bytes.fill(0xFF)  # all-ones: NaN for floats, -1 for integers
    for a in m.function.arrays:
        dtype = a.dtype.np_dtype
        if a.space == "global":
            out[a] = Storage(a, arrays[a], "grid")
            continue
        if a.space == "local":
            shape = tuple(int(d.value) for d in a.shape)
            out[a] = Storage(a, np.full((m.n, *shape), poison(dtype), dtype), "lane")
            continue
        if a.space == "shared_dyn" and a.shape != (None,):
            st = Storage(a, _shaped_view(m, a, dyn_bytes), "block")
            out[a] = st
        elif a.space == "shared_dyn":
            if dtype not in dyn_views:  # arrays of one dtype share elements and race state
                count = dynamic_shared_bytes // dtype.itemsize
                data = dyn_bytes[:, : count * dtype.itemsize].view(dtype)
                dyn_views[dtype] = Storage(a, data, "block")
            st = dyn_views[dtype]
            out[a] = st
        else:
            shape = tuple(int(d.value) for d in a.shape)
            st = Storage(a, np.full((m.nb, *shape), poison(dtype), dtype), "block")
            out[a] = st
        if race_check and st.tracker is None and a.space != "shared_dyn":
            st.tracker = RaceTracker(st, m.nb)
    if race_check:
        _track_dynamic(m, out, dynamic_shared_bytes)
    return out


def _byte_range(st: Storage) -> tuple[int, int]:
    """The bytes [start, end) of the dynamic shared region that a view's elements cover."""
    start = st.array.offset if st.array.shape != (None,) else 0
    return start, start + st.size * st.data.itemsize


def _track_dynamic(m, storages: dict, region: int) -> None:
    """Race detectors for the views of the dynamic shared region: one per view, unless two
    views overlap; then every view shares one detector over the region's bytes
    (``AliasedView``), so that a store through one view and a load through another meet."""
    views = list({id(st): st for a, st in storages.items() if a.space == "shared_dyn"}.values())
    spans = sorted(_byte_range(st) for st in views)
    overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    if not overlap:
        for st in views:
            st.tracker = RaceTracker(st, m.nb)
        return
    unit = min(st.data.itemsize for st in views)  # every view's offset and itemsize divide by it
    core = RaceTracker(None, m.nb, size=region // unit)
    for st in views:
        st.tracker = AliasedView(core, st, _byte_range(st)[0] // unit, st.data.itemsize // unit)


def _shaped_view(m, a: Array, dyn_bytes: np.ndarray) -> np.ndarray:
    """The elements of a shaped dynamic-shared view: bytes [offset, offset + size)."""
    shape = tuple(int(d.value) for d in a.shape)
    end = a.offset + int(np.prod(shape)) * a.dtype.itemsize
    if end > dyn_bytes.shape[1]:
        raise SimulationError(
            f"dynamic shared array '{a.name}' ends at byte {end}, but the launch gave "
            f"{dyn_bytes.shape[1]} bytes of dynamic shared memory: pass at least {end} as "
            "shared_bytes (kernel[grid, block, stream, shared_bytes])"
        )
    return dyn_bytes[:, a.offset : end].view(a.dtype.np_dtype).reshape(m.nb, *shape)


# ----------------------------------------------------------------------------- addressing
def locate(m, ins: Instr, st: Storage, idx_vals: list, what: str, lanes=None, key=True):
    """Bounds-check the indices of ``lanes`` (None: the active lanes); return (lanes, NumPy
    index tuple, flat key).

    The returned ``lanes`` is None when every lane is active. The flat key identifies the
    element across the batch (block included), for the race detector and for atomics; with
    ``key=False`` it is not computed (None).
    """
    if lanes is None:
        lanes = m.active_lanes()
    count = m.n if lanes is None else len(lanes)
    idx = []
    inside = True
    for v, n in zip(idx_vals, st.shape, strict=True):
        v = np.asarray(v)
        if v.ndim == 0:  # a uniform index: checked once
            inside &= 0 <= int(v) < n
            idx.append(np.full(count, v.astype(np.int64), np.int64))
        else:
            i = (v if lanes is None else v[lanes]).astype(np.int64, copy=False)
            # one pass: a negative index reads as a huge unsigned one
            inside &= not len(i) or int(i.view(np.uint64).max()) < n
            idx.append(i)
    if not inside:
        bad = np.logical_or.reduce([(i < 0) | (i >= n) for i, n in zip(idx, st.shape, strict=True)])
        k = int(np.argmax(bad))
        lane = k if lanes is None else int(lanes[k])
        out_of_bounds(m, ins, st, [m.pick(v, None)[lane] for v in idx_vals], lane, what)
    flat = None
    if key:
        flat = idx[0] if idx else np.zeros(count, np.int64)
        for i, size in zip(idx[1:], st.shape[1:], strict=True):
            flat = flat * size + i
    if st.scope == "grid":
        return lanes, tuple(idx), flat
    lead = m.lane_block if st.scope == "block" else m.lane_index
    lead = lead if lanes is None else lead[lanes]
    return lanes, (lead, *idx), None if flat is None else lead * st.size + flat


def out_of_bounds(m, ins, st: Storage, index: list, lane: int, what: str):
    shown = ", ".join(str(int(v)) for v in index)
    raise SimulationError(
        f"{m.where(ins)}: out-of-bounds {what} of {st.array.space} array "
        f"'{st.array.name}' (shape {tuple(int(s) for s in st.shape)}) at index [{shown}] "
        f"by {m.describe(lane)}{m.source(ins)}"
    )


# ----------------------------------------------------------------------------- load, store
def load(m, ins: Instr, vals: list):
    """``dst = array[index...]``."""
    st = m.storage(ins.args[0])
    lanes, ix, key = locate(m, ins, st, vals, "load", key=st.tracker is not None)
    if st.tracker is not None:
        st.tracker.access(m, ins, key, lanes, write=False)
    return m.scatter(st.data[ix], lanes)


def store(m, ins: Instr, vals: list):
    """``array[index...] = value``."""
    st = m.storage(ins.args[0])
    lanes, ix, key = locate(m, ins, st, vals[:-1], "store", key=st.tracker is not None)
    if st.tracker is not None:
        st.tracker.access(m, ins, key, lanes, write=True)
    st.data[ix] = m.pick(vals[-1], lanes)


# ----------------------------------------------------------------------------- atomics
def _bits(t: ScalarType, v):
    return v.view(f"u{t.itemsize}") if t.is_float else v


def _combine(t: ScalarType, kind: str, old, ops: list):
    if kind == "add":
        return arith.add(t, old, ops[0])
    if kind == "max":
        return arith.max_(t, old, ops[0])
    if kind == "min":
        return arith.min_(t, old, ops[0])
    if kind == "exch":
        return ops[0]
    return np.where(_bits(t, old) == _bits(t, ops[0]), ops[1], old)  # cas


def _accumulator(t: ScalarType, kind: str):
    """The ufunc whose ``accumulate`` applies ``kind`` sequentially, exactly like
    ``_combine`` (None where only element-by-element application is exact)."""
    if kind == "cas" or (t.is_float and t.bits == 16):
        return None
    return {
        "add": np.add,
        "max": np.fmax if t.is_float else np.maximum,
        "min": np.fmin if t.is_float else np.minimum,
        "exch": None,
    }[kind]


def wait_eq(m, ins: Instr, vals: list):
    """``wait_eq``: the element must already hold the value. A kernel that waits on other
    blocks runs one block at a time in linear order (``engine.simulate``), so a wait is met
    only by what the blocks before it (and its own threads) stored; a wait they did not
    satisfy would spin forever on the GPU too, or wait for a later block: reported."""
    st = m.storage(ins.args[0])
    nd = len(st.shape)
    lanes, ix, _ = locate(m, ins, st, vals[:nd], "wait_eq", key=False)
    want = np.asarray(m.pick(vals[nd], lanes))
    seen = st.data[ix]
    bad = np.flatnonzero(seen != want)
    if len(bad):
        lane = int(lanes[bad[0]]) if lanes is not None else int(bad[0])
        raise SimulationError(
            f"{m.where(ins)}: kaio.wait_eq() by {m.describe(lane)} waits for "
            f"{ins.args[0].name}[...] == {want[bad[0]]}, but it holds {seen[bad[0]]} after the "
            "blocks of lower linear index ran (the simulator runs such a kernel one block at a "
            "time, in that order): the wait would never end, or waits for a block that starts "
            f"later (order the blocks' turns by their linear index){m.source(ins)}"
        )


def atomic(m, ins: Instr, vals: list):
    """``old = array[index]; array[index] = f(old, operands...)``, applied lane by lane in
    lane order (block-major, then thread order): the results are deterministic."""
    st = m.storage(ins.args[0])
    t, kind = st.array.dtype, ins.attrs["kind"]
    nd = len(st.shape)
    lanes, ix, key = locate(m, ins, st, vals[:nd], "atomic")
    ops = [np.asarray(m.pick(v, lanes)) for v in vals[nd:]]
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    sizes = np.diff(np.r_[starts, len(sk)])
    if len(starts) == len(sk):  # every lane has its own element
        old = st.data[ix]
        st.data[ix] = _combine(t, kind, old, ops)
        return m.scatter(old, lanes)
    old = np.empty(len(sk), t.np_dtype)
    single = sizes == 1
    if single.any():
        sel = order[starts[single]]
        sub = tuple(i[sel] for i in ix)
        old[sel] = st.data[sub]
        st.data[sub] = _combine(t, kind, old[sel], [op[sel] for op in ops])
    starts, sizes = starts[~single], sizes[~single]
    ufunc = _accumulator(t, kind)
    if (kind == "exch" or ufunc is not None) and len(starts) < sizes.max():
        for s, size in zip(starts, sizes, strict=True):  # few elements, many lanes each
            sel = order[s : s + size]
            elem = tuple(i[sel[0]] for i in ix)
            seq = np.concatenate([st.data[elem][None], ops[0][sel]]).astype(t.np_dtype)
            acc = seq if ufunc is None else ufunc.accumulate(seq, dtype=t.np_dtype)
            old[sel] = acc[:-1]
            st.data[elem] = acc[-1]
    else:
        for r in range(int(sizes.max())):  # round r: the r-th lane of every element
            sel = order[starts[sizes > r] + r]
            sub = tuple(i[sel] for i in ix)
            old[sel] = st.data[sub]
            st.data[sub] = _combine(t, kind, old[sel], [op[sel] for op in ops])
    return m.scatter(old, lanes)


# ----------------------------------------------------------------------------- races
class RaceTracker:
    """Per element of a shared array, for the current barrier interval: the last writer and
    up to two readers (lane, warp epoch, instruction). Two accesses conflict when they are
    by different threads, at least one writes, and no ``sync_threads`` (or, within a warp,
    ``sync_warp``) separates them. Atomics are not tracked.

    Across barriers, per element: the last ordinary (generic-proxy) write, with its writer's
    count of ``fence_proxy_async()`` at the time, and the same of one ordinary read (the
    oldest whose reader has not fenced since, else the last). An
    asynchronous-proxy read (``wgmma``, ``bulk_store``) of an element whose writer has not
    fenced since is reported (``check_fenced``): on the GPU it may read the old bytes; so is a
    TMA copy issued into such an element, or into one whose recorded reader has not fenced since
    (the store may land after the copy; the read may see the copy's bytes).

    Without a storage (``st`` None, ``size`` keys a block), the keys are units of the dynamic
    shared region, checked for every ``AliasedView`` of it."""

    _SLOTS = ("w", "r1", "r2")

    def __init__(self, st: Storage | None, nb: int, size: int | None = None):
        self.storage = st
        self.nb = nb
        self.size = st.size if size is None else size  # keys a block
        self.view = None  # with AliasedView: the view of the access being checked
        self.core = self
        total = nb * self.size
        self.lane = {s: np.full(total, -1, np.int64) for s in self._SLOTS}
        self.epoch = {s: np.zeros(total, np.int64) for s in self._SLOTS}
        self.at = {s: np.zeros(total, np.int64) for s in self._SLOTS}
        # across barriers, for "wrote" and "read": the last generic access's lane (or -1),
        # its fence_proxy_async() count then and its instruction
        self.generic = {
            kind: (
                np.full(total, -1, np.int64),
                np.zeros(total, np.int64),
                np.zeros(total, np.int64),
            )
            for kind in ("wrote", "read")
        }

    def reset(self, blocks: np.ndarray) -> None:
        """Forget the accesses of the blocks in ``blocks`` (a barrier)."""
        for lane in self.lane.values():
            lane.reshape(self.nb, -1)[blocks] = -1

    def _element(self, key: int) -> tuple[str, str, int]:
        """The array name, element index and block of ``key``, as the kernel wrote them (for
        an aliased view: in the view of the access being checked)."""
        if self.view is None:
            st, block, flat = self.storage, key // self.size, key % self.size
        else:
            st, block = self.view.storage, key // self.size
            flat = (key % self.size - self.view.base) // self.view.per
        elem = np.unravel_index(flat, st.shape) if st.size else ()
        return st.array.name, ", ".join(str(int(i)) for i in elem), block

    def _conflict(self, m, slot: str, key, cur):
        prev = self.lane[slot][key]
        hit = (prev >= 0) & (prev != cur)
        if hit.any():
            cur_warp = m.warp_of_lane[cur]
            same_warp = m.warp_of_lane[np.maximum(prev, 0)] == cur_warp
            hit &= ~(same_warp & (m.warp_epoch[cur_warp] != self.epoch[slot][key]))
        return hit

    def _record(self, m, slot: str, key, cur, code: int, which=None):
        if which is not None:
            key, cur = key[which], cur[which]
        self.lane[slot][key] = cur
        self.epoch[slot][key] = m.warp_epoch[m.warp_of_lane[cur]]
        self.at[slot][key] = code

    def access(
        self, m, ins: Instr, key, lanes, write: bool, generic: bool = True, record: bool = True
    ) -> None:
        """Check and record one load or store by the active lanes (``lanes``: their lane
        indices, None for all active). ``generic=False``: an access by the asynchronous proxy
        on behalf of ``lanes`` (a ``wgmma`` or ``bulk_store`` read, a TMA copy's write),
        checked for races with ordinary accesses but not recorded as an ordinary access for
        the proxy-fence check. ``record=False``: checked only (a ``cp_async``'s write when
        issued: its bytes may land from then on, so the accesses before it must be ordered
        before the issue; it is recorded at the wait that completes it)."""
        cur = m.lane_index if lanes is None else lanes
        for slot in ("w", "r1", "r2") if write else ("w",):
            hit = self._conflict(m, slot, key, cur)
            if hit.any():
                k = int(np.argmax(hit))
                prev = int(self.lane[slot][key[k]])
                self._report(m, ins, int(key[k]), int(cur[k]), write, prev, slot)
        if not record:
            return
        code = m.instr_code(ins)
        if write:
            order = np.argsort(key, kind="stable")
            dup = np.flatnonzero(key[order][1:] == key[order][:-1])
            if len(dup):
                a, b = order[dup[0]], order[dup[0] + 1]
                self._record(m, "w", key[a : a + 1], cur[a : a + 1], code)
                self._report(m, ins, int(key[b]), int(cur[b]), True, int(cur[a]), "w")
            self._record(m, "w", key, cur, code)
            if generic:
                self._generic(m, "wrote", key, cur, code)
            return
        if generic:
            self._generic(m, "read", key, cur, code)
        self._record(m, "r1", key, cur, code, self.lane["r1"][key] < 0)
        second = (self.lane["r1"][key] != cur) & (self.lane["r2"][key] < 0)
        self._record(m, "r2", key, cur, code, second)

    def _generic(self, m, kind: str, key, cur, code: int) -> None:
        """Record an ordinary access. A read replaces the element's recorded read only where
        that reader has fenced since (or none is recorded), so an unfenced read stays on
        record until a TMA copy lands over it."""
        lanes, fences, at = self.generic[kind]
        if kind == "read":
            held = lanes[key]
            free = (held < 0) | (m.proxy_fences[np.maximum(held, 0)] != fences[key])
            key, cur = key[free], cur[free]
        lanes[key] = cur
        fences[key] = m.proxy_fences[cur]
        at[key] = code

    def check_fenced(
        self, m, ins: Instr, keys: np.ndarray, what: str, writes: bool = False
    ) -> None:
        """Raise if an element of ``keys``, read now by the asynchronous proxy (``what``), was
        last written by an ordinary store whose thread has run no ``fence_proxy_async()``
        since; with ``writes`` (a TMA copy issued into them), also if its recorded ordinary read
        is unfenced so."""
        for kind in ("wrote", "read") if writes else ("wrote",):
            lanes, fences, at = self.generic[kind]
            lane = lanes[keys]
            stale = (lane >= 0) & (m.proxy_fences[np.maximum(lane, 0)] == fences[keys])
            if stale.any():
                key = int(keys[np.argmax(stale)])
                self._unfenced(m, ins, key, what, writes, kind, int(lanes[key]), int(at[key]))

    def _unfenced(self, m, ins, key: int, what: str, writes: bool, kind: str, lane: int, at: int):
        name, index, block = self._element(key)
        other = m.instr_by_code(at)
        if kind == "read":
            risk, after = "the read may see the copy's bytes", "the reads"
        elif writes:
            risk, after = "the store may land after the copy and overwrite it", "the stores"
        else:
            risk, after = "the GPU may read the old bytes", "the stores"
        raise SimulationError(
            f"{m.where(ins)}: {what} {'writes' if writes else 'reads'} '{name}'[{index}] of "
            f"block {m.block_coords(block * m.tpb)} through the asynchronous proxy"
            f"{m.source(ins)}\nbut thread {m.thread_coords(lane)} {kind} it at {m.where(other)}"
            f"{m.source(other)}\nwith no kaio.fence_proxy_async() after, so {risk}: call "
            f"kaio.fence_proxy_async() after {after} (then kaio.sync_threads() if other threads "
            f"issue the {'copy' if writes else 'read'})"
        )

    def async_wrote(self, keys: np.ndarray) -> None:
        """The elements ``keys`` were written by the asynchronous proxy (a TMA copy landed)."""
        for lanes, _, _ in self.generic.values():
            lanes[keys] = -1

    def _report(self, m, ins, key: int, lane: int, write: bool, prev: int, slot: str):
        name, index, block = self._element(key)
        other = m.instr_by_code(int(self.at[slot][key]))
        verb, prev_verb = ("writes" if write else "reads"), ("wrote" if slot == "w" else "read")
        owner = m.block_coords(block * m.tpb)  # the block whose element it is
        if m.lane_block[lane] == m.lane_block[prev]:
            who, whom = f"thread {m.thread_coords(lane)}", f"thread {m.thread_coords(prev)}"
            barrier = "kaio.sync_threads() (or kaio.sync_warp() when both threads are in one warp)"
        else:  # a kaio.cluster_load() of another block's element
            who, whom = (f"{m.describe(x)}" for x in (lane, prev))
            barrier = "kaio.cluster_sync() (or cluster_arrive() and cluster_wait())"
        raise SimulationError(
            f"{m.where(ins)}: shared-memory race on '{name}'[{index}] of block "
            f"{owner}: {who} {verb} it here{m.source(ins)}\nand {whom} {prev_verb} it at "
            f"{m.where(other)}{m.source(other)}\nwith no {barrier} in between"
        )


class AliasedView:
    """The race detector of one view of the dynamic shared region when views overlap: its
    element keys become the keys of the bytes they cover (in units of the smallest element
    size of the views), checked by one ``RaceTracker`` shared by every view (``core``)."""

    def __init__(self, core: RaceTracker, st: Storage, base: int, per: int):
        self.core = core
        self.storage = st
        self.base = base  # the view's first unit in the region
        self.per = per  # units an element

    def _units(self, keys: np.ndarray) -> np.ndarray:
        block, flat = np.divmod(np.asarray(keys, np.int64), self.storage.size)
        first = block * self.core.size + self.base + flat * self.per
        return (first[:, None] + np.arange(self.per)).reshape(-1)

    def access(
        self, m, ins: Instr, key, lanes, write: bool, generic: bool = True, record: bool = True
    ) -> None:
        """``RaceTracker.access`` of the bytes of elements ``key``."""
        cur = m.lane_index if lanes is None else lanes
        self.core.view = self
        units = self._units(key)
        self.core.access(m, ins, units, np.repeat(cur, self.per), write, generic, record)

    def check_fenced(
        self, m, ins: Instr, keys: np.ndarray, what: str, writes: bool = False
    ) -> None:
        """``RaceTracker.check_fenced`` of the bytes of elements ``keys``."""
        self.core.view = self
        self.core.check_fenced(m, ins, self._units(keys), what, writes)

    def async_wrote(self, keys: np.ndarray) -> None:
        """``RaceTracker.async_wrote`` of the bytes of elements ``keys``."""
        self.core.async_wrote(self._units(keys))

    def reset(self, blocks: np.ndarray) -> None:
        """``RaceTracker.reset``."""
        self.core.reset(blocks)
