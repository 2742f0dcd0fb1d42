"""The simulator's engine: runs a typed IR ``Function`` for every thread at once, as NumPy
vectors in lockstep, with per-lane masks for structured control flow.

One *lane* is one thread. Blocks are run in batches (several small blocks side by side, so
that vectors are long); each block of a batch has its own shared memory, and lanes are ordered
block-major then by linear thread index, which fixes the order of atomics. Every ``Var`` holds
one vector of its type's dtype; an instruction's operands may be computed for every lane, but
only the active lanes' destination elements are written and only active lanes touch memory.

Control flow: ``If`` narrows the mask and restores it; ``Loop`` runs while any lane is active
(so each lane has its own trip count); ``Break``/``Continue`` park the active lanes until the
end of their target ``Loop``/``Region`` (or its step block); ``Return`` removes them for good.

Waits: an ``If`` whose two branches both have lanes runs the then branch, then the else
branch, unless one reaches a wait (``mbarrier_wait``) that nothing run so far satisfies: then
the other branch runs until it ends or waits, and they take turns (role-split loops, such as
a producer warp's and the consumers'). Execution steps are generators for this; a wait that
no branch can satisfy reaches ``Machine.run`` and is reported as a deadlock. A kernel that
waits on other blocks (``wait_eq``) runs one block (cluster) a batch, in linear order.
"""

from __future__ import annotations

import linecache
import math

import numpy as np

from kaio.errors import LaunchError, SimulationError
from kaio.ir import nodes
from kaio.ir.nodes import Array, Frag, Function, Instr, Var
from kaio.limits import check_dims, check_dynamic_shared, static_shared_bytes
from kaio.sim import memory
from kaio.sim.semantics import SEMANTICS
from kaio.sim.threads import Blocked

DEFAULT_BATCH_LANES = 1 << 15


def simulate(
    fn: Function,
    grid: tuple,
    block: tuple,
    arrays: dict,
    scalars: dict,
    dynamic_shared_bytes: int = 0,
    race_check: bool = True,
    batch_lanes: int = DEFAULT_BATCH_LANES,
    tensor_maps: tuple = (),
    arch: str = "sm_90",
) -> None:
    """Run ``fn`` over ``grid`` x ``block`` threads on the CPU.

    ``arrays`` maps each global ``Array`` of ``fn`` to a NumPy array (modified in place);
    ``scalars`` maps parameter ``Var``s to values (pointer, shape and stride parameters that
    are missing are derived from the arrays). ``race_check`` turns the shared-memory race
    detector on; ``batch_lanes`` bounds how many threads run side by side. ``tensor_maps``
    are the ``kaio.TensorMap``s that tensor-map parameters (given in ``scalars`` as indices
    into it) name. ``arch`` picks the dynamic shared memory limit (``kaio.limits``).
    Raises ``kaio.SimulationError`` for out-of-bounds accesses, divergent barriers, shuffles
    or votes, and shared-memory races.
    """
    grid, block = _dim3(grid), _dim3(block)
    tpb = math.prod(block)
    check_dims(fn.name, grid, block)  # the GPU's limits, so nothing it refuses runs here
    static = sum(n for _, n in static_shared_bytes(fn))
    check_dynamic_shared(fn.name, dynamic_shared_bytes, static, arch)
    bound = fn.meta.get("max_threads")
    if bound is not None and tpb > bound:
        raise LaunchError(
            f"{fn.name} declares kaio.launch_bounds({bound}) but was launched with {tpb} "
            "threads per block"
        )
    params = _param_values(fn, arrays, scalars)
    nblocks = math.prod(grid)
    cluster = fn.meta.get("cluster", 1)
    if grid[0] % cluster:
        raise LaunchError(
            f"{fn.name} runs in clusters of {cluster} blocks (kaio.cluster_dims) but was "
            f"launched with {grid[0]} blocks along x: use a multiple of {cluster}"
        )
    per_batch = max(1, min(nblocks, batch_lanes // tpb)) // cluster * cluster or cluster
    if any(isinstance(s, Instr) and s.op == "wait_eq" for s in nodes.walk(fn.body)):
        per_batch = cluster  # blocks that take turns: one (cluster) at a time, in order
    with np.errstate(all="ignore"):
        for start in range(0, nblocks, per_batch):
            nb = min(per_batch, nblocks - start)
            m = Machine(fn, grid, block, start, nb, params, dynamic_shared_bytes)
            m.storages = memory.make_storages(m, arrays, dynamic_shared_bytes, race_check)
            m.tensor_maps = tensor_maps
            m.run()


def _dim3(d) -> tuple:
    d = (d,) if isinstance(d, int) else tuple(int(x) for x in d)
    return d + (1,) * (3 - len(d))


def _param_values(fn: Function, arrays: dict, scalars: dict) -> dict:
    """Each parameter Var's value as a 0-d array of its dtype."""
    for a in fn.param_arrays:
        arr = arrays.get(a)
        if not isinstance(arr, np.ndarray) or arr.dtype != a.dtype.np_dtype or arr.ndim != a.ndim:
            raise LaunchError(f"array '{a.name}' needs a {a.ndim}-d NumPy array of {a.dtype}")
    out = {}
    for p in fn.params:
        if p.value in scalars:
            v = scalars[p.value]
        elif p.role == "ptr":
            v = arrays[p.array].__array_interface__["data"][0]
        elif p.role == "shape":
            v = arrays[p.array].shape[p.dim]
        elif p.role == "stride":
            arr = arrays[p.array]
            v = arr.strides[p.dim] // arr.itemsize
        else:
            raise LaunchError(f"no value for parameter {p.source!r}")
        out[p.value] = np.asarray(v, dtype=p.value.type.np_dtype)
    return out


class Machine:
    """The state of one batch of ``nb`` blocks: variables, masks, memory and geometry.

    The ops' handlers (``kaio.sim.semantics``) read it: ``mask``/``alive`` (active and not
    yet returned lanes), ``pick``/``scatter`` (operands for the active lanes and results
    back), the lane geometry (``lane_block``, ``lane_thread``, ``laneid``, ``warp_of_lane``,
    ``warp_starts``...) and the error helpers ``where``, ``source`` and ``describe``.
    """

    def __init__(self, fn, grid, block, start, nb, params, dynamic_shared_bytes):
        self.function = fn
        self.grid, self.block, self.start, self.nb = grid, block, start, nb
        self.tpb = math.prod(block)
        self.cluster = fn.meta.get("cluster", 1)  # blocks per cluster; batches hold whole ones
        self.n = n = nb * self.tpb
        self.lane_index = np.arange(n, dtype=np.int64)
        self.lane_block = self.lane_index // self.tpb
        self.lane_thread = self.lane_index % self.tpb
        self.laneid = self.lane_thread % 32
        warps_per_block = -(-self.tpb // 32)
        warp_in_block = self.lane_thread // 32
        self.warp_of_lane = self.lane_block * warps_per_block + warp_in_block
        self.warp_starts = np.flatnonzero(self.laneid == 0)
        self.warp_size_of_lane = np.minimum(32, self.tpb - warp_in_block * 32)
        self.warp_epoch = np.zeros(nb * warps_per_block, np.int64)
        self.proxy_fences = np.zeros(n, np.int64)  # fence_proxy_async() run by each lane
        self.sreg = self._special_registers(dynamic_shared_bytes)
        self.env = {v: np.broadcast_to(x, (n,)) for v, x in params.items()}
        self.storages: dict = {}
        self.async_copies = None  # kaio.sim.tensor.AsyncCopies, made by the first cp_async
        self.tensor_maps: tuple = ()  # kaio.TensorMap by index (tensor-map parameters)
        self.alive = np.ones(n, bool)
        self.off = np.zeros(n, bool)  # lanes parked by break/continue/return
        self.pending = {}  # (kind, target id) -> lanes parked for that construct
        self.interleaving = 0  # role splits (ifs whose branches take turns) being run
        self.resumed = False  # a wait is asked again after the other branch ran
        self._consts: dict = {}
        self._codes: dict = {}
        self._instrs: list = []
        self._set_mask(np.ones(n, bool))

    # ------------------------------------------------------------------ geometry
    def _special_registers(self, dynamic_shared_bytes: int) -> dict:
        bx, by, bz = self.block
        gx, gy, gz = self.grid
        t, b = self.lane_thread, self.lane_block + self.start
        u32 = np.uint32
        regs = {
            "tid.x": t % bx,
            "tid.y": t // bx % by,
            "tid.z": t // (bx * by),
            "ctaid.x": b % gx,
            "ctaid.y": b // gx % gy,
            "ctaid.z": b // (gx * gy),
            "laneid": self.laneid,
            "cluster_ctarank": b % gx % self.cluster,
        }
        regs = {k: v.astype(u32) for k, v in regs.items()}
        uniform = {"ntid": self.block, "nctaid": self.grid}
        for name, dims in uniform.items():
            for axis, d in zip("xyz", dims, strict=True):
                regs[f"{name}.{axis}"] = np.broadcast_to(u32(d), (self.n,))
        regs["dynamic_smem_size"] = np.broadcast_to(u32(dynamic_shared_bytes), (self.n,))
        return regs

    def thread_coords(self, lane: int) -> tuple:
        """(x, y, z) of the thread running ``lane``, within its block."""
        return tuple(int(self.sreg[f"tid.{a}"][lane]) for a in "xyz")

    def block_coords(self, lane: int) -> tuple:
        """(x, y, z) of the block of ``lane``."""
        return tuple(int(self.sreg[f"ctaid.{a}"][lane]) for a in "xyz")

    def describe(self, lane: int) -> str:
        """``thread (x, y, z) of block (x, y, z)``."""
        return f"thread {self.thread_coords(lane)} of block {self.block_coords(lane)}"

    def where(self, ins) -> str:
        """``file.py:LINE`` of an instruction (the kernel's name when unknown)."""
        loc = getattr(ins, "loc", None)
        return f"{loc.filename}:{loc.lineno}" if loc else f"kernel {self.function.name}"

    @staticmethod
    def source(ins) -> str:
        """The instruction's source line, indented on a line of its own (or nothing)."""
        loc = getattr(ins, "loc", None)
        line = linecache.getline(loc.filename, loc.lineno).strip() if loc else ""
        return f"\n    {line}" if line else ""

    def instr_code(self, ins: Instr) -> int:
        """A small int naming ``ins`` (the race detector stores these)."""
        code = self._codes.get(id(ins))
        if code is None:
            code = self._codes[id(ins)] = len(self._instrs)
            self._instrs.append(ins)
        return code

    def instr_by_code(self, code: int) -> Instr:
        """The instruction ``instr_code`` gave ``code`` to."""
        return self._instrs[code]

    # ------------------------------------------------------------------ lanes
    def _set_mask(self, mask: np.ndarray) -> None:
        self.mask = mask
        count = int(np.count_nonzero(mask))
        self.any_active = count > 0
        self.all_active = count == self.n
        self._lanes = None if self.all_active else np.flatnonzero(mask)

    def active_lanes(self):
        """Indices of the active lanes, or None when every lane is active."""
        return self._lanes

    def pick(self, v, lanes):
        """Operand ``v`` (a vector or a 0-d constant) for ``lanes`` (None: every lane)."""
        v = np.asarray(v)
        if v.ndim == 0:
            return np.broadcast_to(v, (self.n if lanes is None else len(lanes),))
        return v if lanes is None else v[lanes]

    def scatter(self, values: np.ndarray, lanes) -> np.ndarray:
        """A full-width vector holding ``values`` at ``lanes`` (None: every lane)."""
        if lanes is None:
            return values
        out = np.zeros(self.n, values.dtype)
        out[lanes] = values
        return out

    @property
    def trackers(self) -> list:
        """The race detectors of the shared arrays (one per distinct storage; one for all
        views of the dynamic region when they overlap)."""
        found = {id(s.tracker.core): s.tracker.core for s in self.storages.values() if s.tracker}
        return list(found.values())

    def storage(self, array: Array) -> memory.Storage:
        """Where ``array``'s elements live."""
        try:
            return self.storages[array]
        except KeyError:
            raise SimulationError(f"array {array.name!r} is not in the function's arrays") from None

    # ------------------------------------------------------------------ execution
    # Every execution step is a generator: a wait that nothing run so far satisfies yields
    # its ``Blocked`` up to the nearest ``If`` whose two branches both have lanes, which then
    # runs the other branch until that one waits too (role-split loops: a producer warp and
    # consumer warps). A ``Blocked`` that reaches ``run`` is a deadlock in any order.
    def run(self) -> None:
        """Execute the function body for every lane of the batch."""
        for blocked in self._block(self.function.body):
            if not blocked.soft:  # a try-wait is asked again; a wait nothing can satisfy
                raise blocked.error()

    def _block(self, stmts: list):
        for s in stmts:
            if not self.any_active:
                return
            run = self._EXEC.get(type(s))
            if run is None:
                raise SimulationError(
                    f"{self.where(s)}: {type(s).__name__} cannot be simulated (run the IR "
                    "passes first: static loops must be unrolled)"
                )
            yield from run(self, s)

    def _value(self, v):
        if isinstance(v, Var):
            try:
                return self.env[v]
            except KeyError:
                raise SimulationError(f"variable %{v.name} is read before it is assigned") from None
        c = self._consts.get(id(v))
        if c is None:
            c = self._consts[id(v)] = (v, np.asarray(v.value).astype(v.type.np_dtype))
        return c[1]

    def _instr(self, ins: Instr):
        vals = [self._value(a) for a in ins.args if not isinstance(a, Array | Frag)]
        try:
            handler = SEMANTICS[ins.op]
        except KeyError:
            raise SimulationError(f"{self.where(ins)}: unknown IR op {ins.op!r}") from None
        result = handler(self, ins, vals)
        while isinstance(result, Blocked):
            yield result
            self.resumed = True  # a wait that let the other branch run gives its answer now
            result = handler(self, ins, vals)
            self.resumed = False
        if ins.dst is not None:
            self._write(ins.dst, result)

    def _write(self, dst: Var, value) -> None:
        value = np.asarray(value)
        dtype = dst.type.np_dtype
        if value.dtype != dtype:
            raise SimulationError(f"internal: {value.dtype} value for %{dst.name}: {dst.type}")
        if value.ndim == 0:
            value = np.broadcast_to(value, (self.n,))
        if self.all_active:
            self.env[dst] = value
            return
        old = self.env.get(dst)
        self.env[dst] = np.where(self.mask, value, np.zeros((), dtype) if old is None else old)

    def _if(self, s: nodes.If):
        saved = self.mask
        cond = self.pick(self._value(s.cond), None)
        then, orelse = saved & cond, saved & ~cond
        if not orelse.any() or not then.any():  # one branch: nothing to interleave
            self._set_mask(then if then.any() else orelse)
            yield from self._block(s.then if then.any() else s.orelse)
        else:
            self.interleaving += 1
            turns = [[self._block(s.then), then], [self._block(s.orelse), orelse]]
            yield from self._take_turns(turns)
            self.interleaving -= 1
        self._set_mask(saved & ~self.off)

    def _take_turns(self, branches: list):
        """Run the branches (each [generator, its mask]) in turns, then branch first: each
        until it ends or waits. A round after which branches still wait and nothing changed
        is passed up as a wait (a hard one if any), so that an enclosing role split can run
        its other branch."""
        while branches:
            start, waits = self.progress(), []
            for branch in list(branches):
                self._set_mask(branch[1])
                step = next(branch[0], None)
                branch[1] = self.mask
                if step is None:
                    branches.remove(branch)
                else:
                    waits.append(step)
            if branches and self.progress() == start:
                yield min(waits, key=lambda w: w.soft)

    def progress(self) -> int:
        """A count that changes whenever a barrier that a wait may need changes."""
        hopper = getattr(self, "_hopper", None)
        return 0 if hopper is None else hopper.version

    def _park(self, kind: str, target: int):
        key = (kind, target)
        self.pending[key] = self.pending.get(key, False) | self.mask
        self.off = self.off | self.mask
        self._set_mask(np.zeros(self.n, bool))
        yield from ()

    def _unpark(self, kind: str, target: int) -> np.ndarray:
        lanes = self.pending.pop((kind, target), None)
        if lanes is None:
            return np.zeros(self.n, bool)
        self.off = self.off & ~lanes
        return lanes

    def _loop(self, s: nodes.Loop):
        saved = self.mask
        while self.any_active:
            yield from self._block(s.body)
            self._set_mask(self.mask | self._unpark("continue", s.id))
            yield from self._block(s.step)
        self._unpark("break", s.id)
        self._set_mask(saved & ~self.off)

    def _region(self, s: nodes.Region):
        saved = self.mask
        yield from self._block(s.body)
        self._unpark("break", s.id)
        self._set_mask(saved & ~self.off)

    def _return(self, s: nodes.Return):
        self.alive = self.alive & ~self.mask
        self.off = self.off | self.mask
        self._set_mask(np.zeros(self.n, bool))
        yield from ()

    _EXEC = {
        Instr: _instr,
        nodes.If: _if,
        nodes.Loop: _loop,
        nodes.Region: _region,
        nodes.Break: lambda m, s: m._park("break", s.target),
        nodes.Continue: lambda m, s: m._park("continue", s.target),
        nodes.Return: _return,
    }
