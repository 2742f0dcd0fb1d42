"""Hopper instructions in the simulator: ``wgmma`` through shared-memory matrix descriptors,
``mbarrier`` phases, TMA tile copies with their swizzle, bulk stores (done when issued), and
the fences (``fence_proxy_async`` is counted per thread for the proxy check below; the others
are no-ops).

Shared memory as the descriptors and TMA see it: each block's shared arrays lie in one
*window* of byte addresses, every static array and the dynamic region starting at a multiple
of 1024 (``window``), so the swizzle patterns, which XOR address bits 4-6 with bits 7-9, are
those of the GPU for tiles aligned as docs/hopper.md asks.

Barriers: each initialized ``mbarrier`` (a shared u64 element) has a ``Barrier`` state: its
phase parity, pending and expected arrivals, pending transaction bytes and the TMA copies in
flight. A phase completes when no arrival and no byte is pending; the copies then land in
shared memory (the latest the GPU may land them), so reading a tile before waiting on its
barrier sees the old bytes. A wait that nothing run so far satisfies returns ``Blocked``: the
engine then runs the other branch of the enclosing role split (``kaio.sim.engine``), and a
wait that no branch can satisfy is a deadlock; a ``mbarrier_try_wait`` loop that spins
without any barrier changing is stopped. A completed wait is a barrier for the race detector.

``wgmma`` is computed when issued (exact products summed in f64, rounded once to f32) and its
accumulators are written then. Its reads of shared memory, and ``bulk_store``'s, are checked
by the race detector as reads by the issuing thread (the warpgroup's first for wgmma), and a
TMA copy's writes (not multicast) as writes by the issuing thread, until a completed wait
(a barrier for the detector) orders them. Across
the proxies the detector checks the proxy fence: a ``wgmma`` or ``bulk_store`` that reads
shared elements last written by ordinary stores is reported unless each writer ran
``fence_proxy_async()`` after its write (``memory.RaceTracker.check_fenced``); so is a TMA
copy issued into such elements (the store could land after the copy), or into elements whose
ordinary read is unfenced. A landed TMA copy clears its elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from kaio.errors import SimulationError
from kaio.ir.nodes import Instr
from kaio.lang_hopper import dynamic_tile_conflict
from kaio.sim import memory
from kaio.sim.tensor import _read_frag, _write_frag
from kaio.sim.threads import Blocked

WINDOW_ALIGN = 1024
_SPIN_LIMIT = 10_000
_INPUTS = {
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,  # k32, K-major only: 16-bit units of two elements
    "e5m2": ml_dtypes.float8_e5m2,
    "s8": np.int8,  # k32 like the 8-bit floats; s32 sums (exact in f64 here), wrapping
}


# --------------------------------------------------------------------------- the window


def _align(x: int) -> int:
    return -(-x // WINDOW_ALIGN) * WINDOW_ALIGN


def window(m) -> list[tuple[int, int, memory.Storage, object]]:
    """``(base, nbytes, storage, array)`` of each shared array of the batch, by base. Static
    arrays come first, then the dynamic region (shaped views at their offsets)."""
    cached = getattr(m, "_hopper_window", None)
    if cached is not None:
        return cached
    out, top = [], 0
    dynamic = []
    for a in m.function.arrays:
        if a.space == "shared":
            st = m.storage(a)
            nbytes = st.size * st.data.itemsize
            out.append((top, nbytes, st, a))
            top = _align(top + nbytes)
        elif a.space == "shared_dyn":
            dynamic.append(a)
    for a in dynamic:
        st = m.storage(a)
        out.append((top + a.offset, st.size * st.data.itemsize, st, a))
    m._hopper_window = out = sorted(out, key=lambda w: w[0])
    return out


def address_of(m, ins: Instr, arr, idx_vals: list, lanes) -> np.ndarray:
    """The window addresses of ``arr[idx]`` for ``lanes`` (bounds-checked)."""
    st = m.storage(arr)
    _, ix, key = memory.locate(m, ins, st, idx_vals, "address", lanes)
    flat = key - ix[0] * st.size
    base = next(b for b, _, s, a in window(m) if a is arr)
    return base + flat * st.data.itemsize


def check_tile(m, ins: Instr, arr, builtin: str) -> None:
    """A SimulationError for a dynamic tile that cannot be 1024-byte aligned on the GPU (the
    kernel has static shared arrays; ``kaio.lang_hopper.dynamic_tile_conflict``)."""
    problem = dynamic_tile_conflict(arr, m.function.arrays, builtin)
    if problem:
        raise SimulationError(f"{m.where(ins)}: {problem}{m.source(ins)}")


def _block_bytes(st: memory.Storage, block: int) -> np.ndarray:
    return st.data[block].reshape(-1).view(np.uint8)


def _locate_bytes(m, ins: Instr, block: int, addrs: np.ndarray, what: str):
    """(storage, byte offsets) holding the window bytes ``addrs`` (one array for all)."""
    for base, nbytes, st, _ in window(m):
        if base <= addrs.min() and addrs.max() < base + nbytes:
            return st, addrs - base
    raise SimulationError(
        f"{m.where(ins)}: {what} reaches shared bytes [{int(addrs.min())}, {int(addrs.max())}] "
        f"that are not inside one shared array (the tile runs past its array, or the "
        f"descriptor's offsets are wrong){m.source(ins)}"
    )


def _element_keys(st: memory.Storage, block: int, offsets: np.ndarray) -> np.ndarray:
    """The race detector's keys of the elements holding bytes ``offsets`` of ``block``."""
    return block * st.size + np.unique(offsets // st.data.itemsize)


def swizzled(addrs: np.ndarray, swizzle: int) -> np.ndarray:
    """Where the GPU stores window byte ``addrs`` under a swizzle of ``swizzle`` bytes:
    16-byte chunk bits 4.. XORed with the 128-byte line bits 7.. (``swizzle // 16`` chunks)."""
    if not swizzle:
        return addrs
    mask = swizzle // 16 - 1
    return addrs ^ (((addrs >> 7) & mask) << 4)


# --------------------------------------------------------------------------- mbarriers


@dataclass
class Barrier:
    """One initialized mbarrier: ``phase`` is the parity of the phase in progress."""

    count: int
    pending: int
    phase: int = 0
    tx: int = 0
    copies: list = field(default_factory=list)  # (storage, block, byte offsets, bytes)


@dataclass
class HopperState:
    """The batch's barriers by (storage id, element key), and try_wait spin counts."""

    barriers: dict = field(default_factory=dict)
    version: int = 0
    spins: dict = field(default_factory=dict)


def _state(m) -> HopperState:
    state = getattr(m, "_hopper", None)
    if state is None:
        state = m._hopper = HopperState()
    return state


def _barrier_keys(m, ins: Instr, vals: list, arr=None):
    """(active lanes as indices, barrier keys) of the barrier ``arr[vals...]`` (by default
    the instruction's first operand)."""
    arr = ins.args[0] if arr is None else arr
    st = m.storage(arr)
    got, _, key = memory.locate(m, ins, st, vals[: arr.ndim], "mbarrier", m.active_lanes())
    lanes = np.arange(m.n) if got is None else got
    return lanes, [(id(st), int(k)) for k in key]


def _get(m, ins: Instr, key, lane: int) -> Barrier:
    bar = _state(m).barriers.get(key)
    if bar is None:
        raise SimulationError(
            f"{m.where(ins)}: mbarrier {ins.args[0].name}[...] used by {m.describe(lane)} before "
            f"kaio.mbarrier_init() (initialize it, then sync_threads()){m.source(ins)}"
        )
    return bar


def _advance(bar: Barrier) -> None:
    """Complete the phase when nothing is pending: land its copies, flip the parity."""
    if bar.pending or bar.tx:
        return
    for st, block, offsets, data in bar.copies:
        _block_bytes(st, block)[offsets] = data
        if st.tracker is not None:
            st.tracker.async_wrote(_element_keys(st, block, offsets))
    bar.copies = []
    bar.phase ^= 1
    bar.pending = bar.count


def mbarrier_init(m, ins: Instr, vals: list):
    """Initialize: ``count`` arrivals expected per phase, phase parity 0, nothing pending."""
    lanes, keys = _barrier_keys(m, ins, vals)
    counts = m.pick(vals[-1], m.active_lanes())
    state = _state(m)
    for lane, key, count in zip(lanes, keys, counts, strict=True):
        if not 1 <= int(count) < 1 << 20:
            raise SimulationError(
                f"{m.where(ins)}: mbarrier_init count {int(count)} by {m.describe(int(lane))} "
                f"must be 1..{(1 << 20) - 1}{m.source(ins)}"
            )
        state.barriers[key] = Barrier(int(count), int(count))
    state.version += 1


def mbarrier_arrive(m, ins: Instr, vals: list):
    """Each active lane adds its expected bytes (``expect_tx``) and arrives once."""
    _transaction(m, ins, vals, arrive=True)


def mbarrier_expect_tx(m, ins: Instr, vals: list):
    """Each active lane adds its expected bytes to the current phase."""
    _transaction(m, ins, vals, arrive=False)


def _transaction(m, ins: Instr, vals: list, arrive: bool):
    lanes, keys = _barrier_keys(m, ins, vals)
    tx = m.pick(vals[-1], m.active_lanes())
    for lane, key, nbytes in zip(lanes, keys, tx, strict=True):
        bar = _get(m, ins, key, int(lane))
        bar.tx += int(nbytes)
        if arrive:
            _arrive(m, ins, bar, int(lane))
        _advance(bar)
    _state(m).version += 1


def _arrive(m, ins: Instr, bar: Barrier, lane: int) -> None:
    if bar.pending == 0:
        raise SimulationError(
            f"{m.where(ins)}: {m.describe(lane)} arrives on an mbarrier whose phase has no "
            f"arrival left (more arrivals than its count){m.source(ins)}"
        )
    bar.pending -= 1


def _completed(m, ins: Instr, vals: list) -> np.ndarray:
    lanes, keys = _barrier_keys(m, ins, vals)
    parity = m.pick(vals[-1], m.active_lanes()).astype(np.int64) & 1
    done = np.array(
        [
            _get(m, ins, k, int(lane)).phase != p
            for lane, k, p in zip(lanes, keys, parity, strict=True)
        ],
        bool,
    )
    return done


def mbarrier_try_wait(m, ins: Instr, vals: list):
    """Whether the phase of the given parity has completed (the current phase's parity
    differs). Not yet, inside a role split: first let the other branch run. A loop that spins
    with no barrier changing is a deadlock."""
    done = _completed(m, ins, vals)
    state = _state(m)
    code = m.instr_code(ins)
    if done.all():
        state.spins.pop(code, None)
        _acquired(m)
    elif m.interleaving and not m.resumed:
        lane = _waiting_lane(m, done)
        return Blocked(lambda: _deadlock(m, ins, lane), soft=True)
    else:
        last_version, count = state.spins.get(code, (state.version, 0))
        count = count + 1 if last_version == state.version else 1
        state.spins[code] = (state.version, count)
        if count > _SPIN_LIMIT:
            raise _deadlock(m, ins, _waiting_lane(m, done))
    return m.scatter(done, m.active_lanes())


def mbarrier_wait(m, ins: Instr, vals: list):
    """Return when the phase has completed; until then, ``Blocked``."""
    done = _completed(m, ins, vals)
    if not done.all():
        lane = _waiting_lane(m, done)
        return Blocked(lambda: _deadlock(m, ins, lane))
    _acquired(m)


def _acquired(m) -> None:
    """A completed wait orders what the arriving threads did before it with what the waiting
    ones do after: the race detector forgets the waiting blocks' accesses, as at a barrier
    (so a race between two other threads of those blocks may go unreported)."""
    blocks = m.mask.reshape(m.nb, -1).any(axis=1)
    for tracker in m.trackers:
        tracker.reset(blocks)


def _waiting_lane(m, done: np.ndarray) -> int:
    """The first active lane whose wait is not done."""
    lanes = np.arange(m.n) if m.active_lanes() is None else m.active_lanes()
    return int(lanes[int(np.argmin(done))])


def _deadlock(m, ins: Instr, lane: int) -> SimulationError:
    return SimulationError(
        f"{m.where(ins)}: {m.describe(lane)} waits for an mbarrier phase that nothing run so "
        "far completes, nor anything the other branch of an if/else can run (the simulator "
        "runs warps in lockstep: the two branches of a role split, such as a producer warp's "
        "loop and the consumers', take turns when one waits; docs/hopper.md)" + m.source(ins)
    )


# --------------------------------------------------------------------------- TMA


def tma_load(m, ins: Instr, vals: list):
    """Read the box at [row, col] of the map's array (zeros outside), lay it out row after
    row from the destination address, swizzled, and attach it to the barrier's phase."""
    dst = ins.args[0]
    check_tile(m, ins, dst, "kaio.tma_load_2d()")
    nd = dst.ndim
    active = m.active_lanes()
    lanes = np.arange(m.n) if active is None else active
    dst_addr = address_of(m, ins, dst, vals[:nd], active)
    maps = m.pick(vals[nd], active)
    rows, cols = m.pick(vals[nd + 1], active), m.pick(vals[nd + 2], active)
    bar_arr = ins.args[nd + 4]
    bar_vals = vals[nd + 3 :]
    _, keys = _barrier_keys(m, ins, bar_vals, bar_arr)
    multicast = ins.op == "tma_load_multicast"
    masks = m.pick(vals[-1], active) if multicast else None
    for j, lane in enumerate(lanes):
        tm = m.tensor_maps[int(maps[j])]
        where = f"{m.where(ins)}: tma_load_2d by {m.describe(int(lane))}"
        align = max(8 * tm.swizzle, 128)  # the swizzle pattern's period
        if dst_addr[j] % align:
            raise SimulationError(
                f"{where}: the destination must be {align}-byte aligned (swizzle "
                f"{tm.swizzle}); it is {int(dst_addr[j]) % align} bytes past{m.source(ins)}"
            )
        skip = int(cols[j]) * tm.dtype.itemsize
        if skip % 16:
            raise SimulationError(
                f"{where}: the box's first column {int(cols[j])} is {skip} bytes into a row; "
                "TMA needs a multiple of 16 bytes (on an H200 the copy stops with an illegal "
                f"instruction){m.source(ins)}"
            )
        data = _box(tm, int(rows[j]), int(cols[j]))
        addrs = swizzled(dst_addr[j] + np.arange(data.size), tm.swizzle)
        own = int(m.lane_block[lane])
        targets = {own: keys[j]}
        if multicast:
            ranks = _cluster_ranks(m, ins, int(masks[j]), int(lane))
            targets = _remote(m, bar_arr, own, keys[j], ranks)
        for block, key in targets.items():
            st, offsets = _locate_bytes(m, ins, block, addrs, "tma_load_2d")
            if st.tracker is not None:  # the issuing thread's write until its phase completes
                elements = _element_keys(st, block, offsets)
                what = "kaio.tma_load_2d()"
                _async_access(m, ins, st, elements, int(lane), what, True, not multicast)
            bar = _get(m, ins, key, int(lane))
            bar.copies.append((st, block, offsets, data))
            bar.tx -= data.size
            _advance(bar)
    _state(m).version += 1


def _cluster_ranks(m, ins: Instr, mask: int, lane: int) -> list[int]:
    """The ranks of ``mask`` (a multicast's blocks), checked against the cluster's size."""
    if not 0 < mask < 1 << m.cluster:
        raise SimulationError(
            f"{m.where(ins)}: {m.describe(lane)} multicasts to block mask {mask:#x} in a "
            f"cluster of {m.cluster} blocks (kaio.cluster_dims): set bits 0..{m.cluster - 1} "
            f"only, at least one{m.source(ins)}"
        )
    return [r for r in range(m.cluster) if mask >> r & 1]


def _remote(m, bar_arr, own: int, key: tuple, ranks: list[int]) -> dict:
    """{block: barrier key} of the barrier ``key`` of block ``own`` in the blocks of its
    cluster with these ranks (the batch holds whole clusters)."""
    size = m.storage(bar_arr).size
    first = own - own % m.cluster
    return {first + r: (key[0], key[1] + (first + r - own) * size) for r in ranks}


def mbarrier_arrive_cluster(m, ins: Instr, vals: list):
    """Each active lane arrives once on the barrier at its address in block ``rank`` of its
    cluster."""
    lanes, keys = _barrier_keys(m, ins, vals)
    ranks = m.pick(vals[-1], m.active_lanes())
    for lane, key, rank in zip(lanes, keys, ranks, strict=True):
        if rank >= m.cluster:
            raise SimulationError(
                f"{m.where(ins)}: {m.describe(int(lane))} arrives on the barrier of block rank "
                f"{int(rank)} in a cluster of {m.cluster} blocks (kaio.cluster_dims){m.source(ins)}"
            )
        (remote,) = _remote(m, ins.args[0], int(m.lane_block[lane]), key, [int(rank)]).values()
        bar = _get(m, ins, remote, int(lane))
        _arrive(m, ins, bar, int(lane))
        _advance(bar)
    _state(m).version += 1


def bulk_store(m, ins: Instr, vals: list):
    """Copy (``bulk_reduce_add``: add) each active lane's ``nbytes`` from its block's shared
    source to the global destination, both taken as flat runs of elements, now (the GPU
    copies some time before the lane's ``bulk_wait``; the simulator does not see a source
    overwritten before ``bulk_wait_read``)."""
    dst = ins.args[0]
    src = ins.args[1 + dst.ndim]
    dst_st, src_st = m.storage(dst), m.storage(src)
    active = m.active_lanes()
    lanes = np.arange(m.n) if active is None else active
    nbytes = m.pick(vals[-1], active).astype(np.int64)
    _, _, dkeys = memory.locate(m, ins, dst_st, vals[: dst.ndim], "bulk_store write", active)
    src_vals = vals[dst.ndim : dst.ndim + src.ndim]
    _, six, skeys = memory.locate(m, ins, src_st, src_vals, "bulk_store read", active)
    src_addr = address_of(m, ins, src, src_vals, active)
    size = dst_st.data.itemsize
    if not dst_st.data.flags.c_contiguous:
        raise SimulationError(
            f"{m.where(ins)}: kaio.bulk_store() needs '{dst.name}' contiguous{m.source(ins)}"
        )
    flat_dst = dst_st.data.reshape(-1)
    for j, lane in enumerate(lanes):
        where = f"{m.where(ins)}: bulk_store by {m.describe(int(lane))}"
        n, dkey = int(nbytes[j]), int(dkeys[j])
        misaligned = (dst_st.data.ctypes.data + dkey * size) % 16 or int(src_addr[j]) % 16
        if n % 16 or misaligned:
            raise SimulationError(
                f"{where}: copies {n} bytes from shared byte {int(src_addr[j])} to element "
                f"{dkey} of '{dst.name}'; the size and both addresses must be multiples of 16 "
                f"bytes{m.source(ins)}"
            )
        count = n // size
        block = int(six[0][j])
        sflat = int(skeys[j]) - block * src_st.size
        if dkey + count > dst_st.size or sflat + count > src_st.size:
            raise SimulationError(
                f"{where}: {n} bytes run past the end of "
                f"'{dst.name if dkey + count > dst_st.size else src.name}'{m.source(ins)}"
            )
        if src_st.tracker is not None:
            keys = block * src_st.size + sflat + np.arange(count)
            _async_access(m, ins, src_st, keys, int(lane), "kaio.bulk_store()")
        data = src_st.data[block].reshape(-1)[sflat : sflat + count]
        if ins.attrs.get("reduce"):  # bulk_reduce_add
            flat_dst[dkey : dkey + count] += data
        else:
            flat_dst[dkey : dkey + count] = data


def _async_access(
    m, ins: Instr, st, keys: np.ndarray, lane: int, what: str, writes: bool = False,
    race: bool = True,
) -> None:  # fmt: skip
    """Shared elements ``keys`` read (or with ``writes``, written) by the asynchronous proxy
    for lane ``lane``: with ``race``, a race with ordinary accesses of other threads in the
    same barrier interval is reported; so is a missing proxy fence after an ordinary access
    (``RaceTracker.check_fenced``)."""
    unique = np.unique(keys)
    if race:
        st.tracker.access(m, ins, unique, np.full(len(unique), lane), writes, generic=False)
    st.tracker.check_fenced(m, ins, unique, what, writes)


def _box(tm, row: int, col: int) -> np.ndarray:
    """The bytes of the box at [row, col] of ``tm.array``, zeros outside the array."""
    rows, cols = tm.box
    src = tm.array
    out = np.zeros((rows, cols), src.dtype)
    r0, r1 = max(row, 0), min(row + rows, src.shape[0])
    c0, c1 = max(col, 0), min(col + cols, src.shape[1])
    if r0 < r1 and c0 < c1:
        out[r0 - row : r1 - row, c0 - col : c1 - col] = src[r0:r1, c0:c1]
    return out.reshape(-1).view(np.uint8)


# --------------------------------------------------------------------------- wgmma

_SWIZZLE_OF_MODE = {0: 0, 1: 128, 2: 64, 3: 32}


def decode_descriptor(desc: int) -> tuple[int, int, int, int]:
    """(start address, leading byte offset, stride byte offset, swizzle bytes)."""
    start = (desc & 0x3FFF) << 4
    lbo = (desc >> 16 & 0x3FFF) << 4
    sbo = (desc >> 32 & 0x3FFF) << 4
    return start, lbo, sbo, _SWIZZLE_OF_MODE[desc >> 62 & 3]


def operand_addresses(desc: int, mn: int, mn_major: bool, k: int = 16) -> np.ndarray:
    """The window byte address of each 16-bit element [i, kk] (i < mn, kk < k) of a wgmma
    operand described by ``desc``, in the canonical layouts (PTX ISA "Shared Memory Matrix
    Layout"; docs/hopper.md): 8x16-byte core matrices, or rows of ``swizzle`` bytes."""
    start, lbo, sbo, sw = decode_descriptor(desc)
    i = np.arange(mn)[:, None]
    kk = np.arange(k)[None, :]
    if not mn_major:  # K-major: a row of the tile is one i, its k contiguous
        if sw:
            offset = (i % 8) * sw + (i // 8) * sbo + kk * 2
        else:
            offset = (i % 8) * 16 + (i // 8) * sbo + (kk % 8) * 2 + (kk // 8) * lbo
    elif sw:  # MN-major: a row is one k, the i contiguous
        per_row = sw // 2
        offset = (i % per_row) * 2 + (i // per_row) * lbo + (kk % 8) * sw + (kk // 8) * sbo
    else:
        offset = (i % 8) * 2 + (i // 8) * sbo + (kk % 8) * 16 + (kk // 8) * lbo
    return swizzled(start + offset, sw)


def accumulator_layout(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of accumulator register r of warpgroup thread t, each of shape (128, n/2):
    warp w = t // 32 holds rows 16w..16w+15 as mma.m16n8's C fragment, one n8 tile per 4
    registers."""
    t = np.arange(128)[:, None]
    r = np.arange(n // 2)[None, :]
    lane = t % 32
    e = r % 4
    row = 16 * (t // 32) + lane // 4 + 8 * (e // 2)
    col = 8 * (r // 4) + 2 * (lane % 4) + e % 2
    return row, col


def _operand(
    m, ins, block: int, desc: int, mn: int, mn_major: bool, dtype, reader: int
) -> np.ndarray:
    """A wgmma operand tile from shared memory, read on behalf of lane ``reader`` (the
    warpgroup's first)."""
    addrs = operand_addresses(desc, mn, mn_major)
    st, offsets = _locate_bytes(m, ins, block, addrs, "wgmma operand")
    if st.tracker is not None:
        _async_access(m, ins, st, _element_keys(st, block, offsets), reader, "wgmma")
    raw = _block_bytes(st, block)
    lo, hi = raw[offsets], raw[offsets + 1]
    if np.dtype(dtype).itemsize == 1:  # 8-bit floats: element 2u in the low byte of unit u
        pairs = np.stack([lo, hi], axis=-1).reshape(lo.shape[0], -1)
        return pairs.view(dtype).astype(np.float64)
    bits = lo.astype(np.uint16) | hi.astype(np.uint16) << 8
    return bits.view(dtype).astype(np.float64)


def _warpgroups(m, ins: Instr) -> np.ndarray:
    """The first lane of each active warpgroup, after checking they are whole."""
    mask = m.mask.reshape(m.nb, -1)
    whole = m.tpb // 128
    if mask[:, whole * 128 :].any():
        raise SimulationError(
            f"{m.where(ins)}: wgmma by threads of warpgroup {whole}, which has only "
            f"{m.tpb % 128} threads in a block of {m.tpb} (a warpgroup that runs wgmma needs "
            f"4 whole warps){m.source(ins)}"
        )
    groups = mask[:, : whole * 128].reshape(m.nb, whole, 128)
    some, every = groups.any(axis=2), groups.all(axis=2)
    if (some & ~every).any():
        b, g = np.argwhere(some & ~every)[0]
        raise SimulationError(
            f"{m.where(ins)}: wgmma needs all 128 threads of warpgroup {int(g)} (warps "
            f"{4 * int(g)}..{4 * int(g) + 3}) of block {int(b)}, but only some run it (keep "
            f"warpgroups converged){m.source(ins)}"
        )
    blocks, group = np.nonzero(every)
    return blocks * m.tpb + group * 128


def _uniform(m, ins: Instr, lanes: np.ndarray, *values) -> list[int]:
    """The warpgroup's value of each descriptor in ``values``, after checking it is uniform."""
    out = []
    for v in values:
        d = np.broadcast_to(np.asarray(v), (m.n,))[lanes]
        if (d != d[0]).any():
            raise SimulationError(
                f"{m.where(ins)}: the wgmma descriptors differ between threads of one "
                f"warpgroup ({m.describe(int(lanes[0]))}'s); they must be uniform{m.source(ins)}"
            )
        out.append(int(d[0]))
    return out


def register_a(m, frag, lanes: np.ndarray, dtype) -> np.ndarray:
    """The 64 x 16 A operand held by the warpgroup's ``lanes`` in 4 32-bit registers each:
    per warp ``w``, lane (g, q) holds rows 16w + g (registers 0, 2) and 16w + g + 8 (1, 3),
    columns 2q, 2q + 1 (registers 0, 1) and 2q + 8, 2q + 9 (2, 3), the low half first."""
    halves = _read_frag(m, frag, lanes).view(np.uint16).reshape(128, 4, 2)
    t = np.arange(128)[:, None, None]
    r = np.arange(4)[None, :, None]
    h = np.arange(2)[None, None, :]
    lane = t % 32
    row = 16 * (t // 32) + lane // 4 + 8 * (r % 2)
    col = 2 * (lane % 4) + 8 * (r // 2) + h
    a = np.zeros((64, 16), np.uint16)
    a[np.broadcast_to(row, halves.shape), np.broadcast_to(col, halves.shape)] = halves
    return a.view(dtype).astype(np.float64)


def wgmma(m, ins: Instr, vals: list):
    """Warpgroup-wide ``acc = A @ B (+ acc)`` of m64nNk16 (m64nNk32 for the 8-bit floats:
    the same 32 bytes of K) with A and B read from shared memory through their descriptors
    (``wgmma``), or A from registers (``wgmma_rs``: ``register_a``); the accumulator layout
    of ``accumulator_layout``."""
    acc = ins.args[0]
    n = ins.attrs["n"]
    dtype = _INPUTS[ins.attrs["kind"]]
    rs = ins.op == "wgmma_rs"
    a_in, b_desc, scale_d = vals[-3:] if not rs else (None, *vals[-2:])
    row, col = accumulator_layout(n)
    for first in _warpgroups(m, ins):
        lanes = np.arange(first, first + 128)
        block = int(m.lane_block[first])
        if rs:
            (db,) = _uniform(m, ins, lanes, b_desc)
            a = register_a(m, ins.args[1], lanes, dtype)
        else:
            da, db = _uniform(m, ins, lanes, a_in, b_desc)
            a = _operand(m, ins, block, da, 64, ins.attrs["trans_a"], dtype, int(first))
        b = _operand(m, ins, block, db, n, ins.attrs["trans_b"], dtype, int(first)).T
        d = a @ b
        if np.broadcast_to(scale_d, (m.n,))[first]:
            old = _read_frag(m, acc, lanes).astype(np.float64)
            prev = np.zeros((64, n))
            prev[row, col] = old
            d = d + prev
        if ins.attrs["kind"] == "s8":  # |d| < 2**53: exact; s32 wraps
            result = d.astype(np.int64).astype(np.int32)
        else:
            result = d.astype(np.float32)
            nan = np.isnan(result)
            if nan.any():
                result.view(np.uint32)[nan] = 0x7FFFFFFF
        _write_frag(m, acc, result[row, col], lanes)


def smem_desc(m, ins: Instr, vals: list):
    """The descriptor of the tile at ``smem[idx]``: its window address, offsets, swizzle."""
    arr = ins.args[0]
    check_tile(m, ins, arr, "kaio.smem_descriptor()")
    active = m.active_lanes()
    addr = address_of(m, ins, arr, vals, active).astype(np.uint64)
    mode = {0: 0, 128: 1, 64: 2, 32: 3}[ins.attrs["swizzle"]]
    desc = (
        (addr >> np.uint64(4)) & np.uint64(0x3FFF)
        | np.uint64((ins.attrs["lbo"] >> 4) << 16)
        | np.uint64((ins.attrs["sbo"] >> 4) << 32)
        | np.uint64(mode << 62)
    )
    return m.scatter(desc, active)


def fence_proxy_async(m, ins: Instr, vals: list):
    """Count the fence for each active lane: its ordinary shared writes before it are now
    visible to the asynchronous proxy (``memory.RaceTracker.check_fenced``)."""
    active = m.active_lanes()
    if active is None:
        m.proxy_fences += 1
    else:
        m.proxy_fences[active] += 1


def no_op(m, ins: Instr, vals: list):
    """Fences, wgmma and bulk commit/wait, setmaxnreg, the grid dependency controls (the
    simulator runs launches one after another): nothing to do in lockstep order."""


def dsmem_load(m, ins: Instr, vals: list):
    """``arr[idx]`` of block ``rank`` of the lane's cluster (the batch holds whole clusters,
    so that block is in it). The race detector sees the read as one of the other block's
    element: a write there with no cluster barrier in between is reported."""
    st = m.storage(ins.args[0])
    *idx_vals, rank = vals
    lanes, ix, key = memory.locate(m, ins, st, idx_vals, "cluster_load")
    rank = np.asarray(m.pick(rank, lanes)).astype(np.int64)
    if (rank >= m.cluster).any():
        lane = int(np.argmax(rank >= m.cluster))
        lane = lane if lanes is None else int(lanes[lane])
        raise SimulationError(
            f"{m.where(ins)}: kaio.cluster_load() of block rank {int(rank.max())} in a "
            f"cluster of {m.cluster} blocks by {m.describe(lane)}{m.source(ins)}"
        )
    own = ix[0]
    target = own - own % m.cluster + rank
    if st.tracker is not None:
        st.tracker.access(m, ins, key + (target - own) * st.size, lanes, write=False)
    return m.scatter(st.data[(target, *ix[1:])], lanes)


SEMANTICS = {
    "wgmma": wgmma,
    "wgmma_rs": wgmma,
    "wgmma_fence": no_op,
    "wgmma_commit": no_op,
    "wgmma_wait": no_op,
    "smem_desc": smem_desc,
    "mbarrier_init": mbarrier_init,
    "mbarrier_arrive": mbarrier_arrive,
    "mbarrier_expect_tx": mbarrier_expect_tx,
    "mbarrier_try_wait": mbarrier_try_wait,
    "mbarrier_wait": mbarrier_wait,
    "tma_load": tma_load,
    "tma_load_multicast": tma_load,
    "mbarrier_arrive_cluster": mbarrier_arrive_cluster,
    "fence_proxy_async": fence_proxy_async,
    "bulk_store": bulk_store,
    "bulk_prefetch": no_op,
    "bulk_commit": no_op,
    "bulk_wait": no_op,
    "setmaxnreg": no_op,
    "griddep_wait": no_op,
    "griddep_launch": no_op,
    "dsmem_load": dsmem_load,
}
