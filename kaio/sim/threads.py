"""Ops that involve several threads or the thread's identity: special registers, barriers,
warp shuffles and votes.

A warp is 32 consecutive linear thread indices of a block (linear = x + y*bx + z*bx*by); the
last warp of a block whose size is not a multiple of 32 is partial. Shuffles, votes and
barriers must be reached by every thread of their warp (block) that has not returned: the
simulator runs threads in lockstep and cannot reproduce what divergent code would do on a
GPU, so it reports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kaio.errors import SimulationError
from kaio.ir.nodes import Instr


@dataclass(frozen=True)
class Blocked:
    """What a wait returns when nothing run so far satisfies it: the engine lets the other
    branch of a role split run (``kaio.sim.engine``), then asks again. ``soft``: a try-wait,
    whose answer may also be no (only a hard wait that nothing can satisfy is a deadlock);
    ``error`` makes the deadlock's SimulationError."""

    error: Callable[[], SimulationError]
    soft: bool = False


def sreg(m, ins: Instr, vals: list):
    """A special register (``tid.x``, ``ctaid.y``, ``laneid``, ``dynamic_smem_size``...)."""
    return m.sreg[ins.attrs["name"]]


def threadfence(m, ins: Instr, vals: list):
    """A memory fence: lockstep execution already orders every access."""


def _lanes_text(m, lanes: np.ndarray) -> str:
    shown = ", ".join(str(m.thread_coords(int(x))) for x in lanes[:4])
    return shown + (f" and {len(lanes) - 4} more" if len(lanes) > 4 else "")


def _divergence_error(m, ins: Instr, what: str, group: np.ndarray, unit: str, hint: str):
    """Raise for ``group`` (lane indices of one warp or block) being partly active."""
    block = m.block_coords(int(group[0]))
    reached = _lanes_text(m, group[m.mask[group]])
    missing = _lanes_text(m, group[m.alive[group] & ~m.mask[group]])
    raise SimulationError(
        f"{m.where(ins)}: {what} in divergent code: in {unit}block {block}, threads {reached} "
        f"reached it but threads {missing} did not (they took another branch, left a loop early "
        f"or are in another iteration){m.source(ins)}\n{hint}"
    )


def require_converged_warps(m, ins: Instr, what: str) -> None:
    """Error unless every warp with an active lane has all its live lanes active."""
    if m.all_active:
        return
    active = np.add.reduceat(m.mask, m.warp_starts)
    diverged = np.add.reduceat(m.mask != m.alive, m.warp_starts)
    bad = np.flatnonzero((active > 0) & (diverged > 0))
    if len(bad):
        w = int(bad[0])
        group = np.flatnonzero(m.warp_of_lane == w)
        _divergence_error(
            m,
            ins,
            what,
            group,
            f"warp {int(m.lane_thread[group[0]]) // 32} of ",
            "move it out of the branch so that the whole warp executes it",
        )


def _group_barrier(
    m, ins: Instr, blocks: int, what: str, unit: str, hint: str, ends_interval: bool = True
) -> None:
    """A barrier over groups of ``blocks`` consecutive blocks (1: a block, a cluster's size:
    a cluster): every live thread of each participating group must be active. Ends the race
    detector's interval for those blocks (unless ``ends_interval`` is false: an arrival)."""
    size = blocks * m.tpb
    active = m.mask.reshape(-1, size)
    groups = active.any(axis=1)
    if not m.all_active:
        bad = np.flatnonzero(groups & (active != m.alive.reshape(-1, size)).any(axis=1))
        if len(bad):
            g = int(bad[0])
            _divergence_error(m, ins, what, np.arange(g * size, (g + 1) * size), unit, hint)
    if ends_interval:
        for tracker in m.trackers:
            tracker.reset(np.repeat(groups, blocks))


def sync_threads(m, ins: Instr, vals: list):
    """Block-wide barrier: every live thread of each participating block must be active.
    Ends the race detector's interval for those blocks."""
    _group_barrier(
        m,
        ins,
        1,
        "sync_threads() (barrier)",
        "",
        "every thread of the block must reach the same sync_threads() (threads that "
        "returned are not waited for)",
    )


def _cluster_barrier(name: str, ends_interval: bool):
    def run(m, ins: Instr, vals: list):
        _group_barrier(
            m,
            ins,
            m.cluster,
            f"{name}() (cluster barrier)",
            "the cluster of ",
            f"every thread of every block of the cluster must reach the same {name}()",
            ends_interval,
        )

    run.__doc__ = f"``kaio.{name}``: as ``sync_threads``, over every block of each cluster."
    return run


# In lockstep every thread arrives and waits together; an arrival orders nothing yet.
cluster_sync = _cluster_barrier("cluster_sync", True)
cluster_arrive = _cluster_barrier("cluster_arrive", False)
cluster_wait = _cluster_barrier("cluster_wait", True)


def sync_warp(m, ins: Instr, vals: list):
    """Warp-wide barrier: orders the shared-memory accesses of the lanes of each warp."""
    require_converged_warps(m, ins, "sync_warp()")
    warps = np.unique(m.warp_of_lane[m.mask])
    m.warp_epoch[warps] += 1


def shfl(m, ins: Instr, vals: list):
    """Warp shuffle (``bfly``, ``down``, ``up``, ``idx``) with PTX's source-lane rule: an
    out-of-range source lane gives the lane its own value (as does a lane that does not
    exist in a partial warp, or has returned: undefined on the GPU)."""
    require_converged_warps(m, ins, "a warp shuffle")
    v = m.pick(vals[0], None)
    b = m.pick(vals[1], None).astype(np.int64)
    lane = m.laneid
    mode = ins.attrs["mode"]
    if mode == "bfly":
        j = lane ^ b
    elif mode == "down":
        j = lane + b
    elif mode == "up":
        j = lane - b
    else:
        j = b & 31
    ok = (j >= 0) & (j < m.warp_size_of_lane)
    src = np.where(ok, m.lane_index - lane + j, m.lane_index)
    src = np.where(m.alive[src], src, m.lane_index)
    return v[src]


def _per_warp(m, ins: Instr, what: str, values: np.ndarray, ufunc) -> np.ndarray:
    require_converged_warps(m, ins, what)
    return ufunc.reduceat(values, m.warp_starts)[m.warp_of_lane]


def vote_any(m, ins: Instr, vals: list):
    """True in every lane of a warp where some active lane has ``p``."""
    return _per_warp(m, ins, "vote_any()", m.pick(vals[0], None) & m.mask, np.logical_or)


def vote_all(m, ins: Instr, vals: list):
    """True in every lane of a warp where all active lanes have ``p``."""
    return _per_warp(m, ins, "vote_all()", m.pick(vals[0], None) | ~m.mask, np.logical_and)


def ballot(m, ins: Instr, vals: list):
    """The u32 mask of the active lanes of the warp that have ``p`` (bit = lane id)."""
    p = m.pick(vals[0], None) & m.mask
    bits = np.where(p, np.left_shift(np.uint64(1), m.laneid.astype(np.uint64)), np.uint64(0))
    return _per_warp(m, ins, "ballot()", bits, np.bitwise_or).astype(np.uint32)
