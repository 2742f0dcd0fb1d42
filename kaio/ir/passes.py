"""IR passes: unrolling, constant folding and propagation, copy propagation, dead code
elimination, strength reduction, loop-invariant code motion and loads issued before
divisions and square roots.

``optimize`` runs them in order; each pass rewrites ``Function.body`` in place. Folding and
hoisting are sound on this non-SSA IR because they only touch variables with exactly one
definition (every frontend temporary), whose definition dominates its uses; copy propagation
follows reassignments in program order.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np

from kaio import numerics
from kaio.ir import nodes
from kaio.ir.builder import const_convert
from kaio.ir.nodes import Array, Const, Function, Instr, Var, child_blocks, fresh_id, walk
from kaio.ir.ops import OPS
from kaio.types import bool_, u32


def optimize(fn: Function) -> None:
    """Run every pass: unroll, then fold, propagate copies and clean up until nothing
    changes, then reduce divisions by powers of two to shifts and masks, move constant
    terms of integer sums outward, hoist loop-invariant arithmetic out of loops and issue
    loads before the divisions and square roots in front of them."""
    unroll(fn)
    for _ in range(8):
        changed = fold(fn)
        changed |= propagate_copies(fn)
        changed |= eliminate_dead_code(fn)
        if not changed:
            break
    strength_reduce(fn)
    constants_outward(fn)
    hoist_invariants(fn)
    loads_before_slow_paths(fn)


def strength_reduce(fn: Function) -> None:
    """``x // 2**k`` becomes ``x >> k`` and ``x % 2**k`` becomes ``x & (2**k - 1)`` for
    integers. Exact for signed ones too, since ``//`` and ``%`` follow Python (floor): an
    arithmetic shift floors, and the mask gives the remainder's divisor sign. ptxas turns
    ``div.u32 x, 8`` into a full reciprocal-based division, so this matters in hot loops."""
    for s in walk(fn.body):
        if not isinstance(s, Instr) or s.op not in ("floordiv", "mod"):
            continue
        a, b = s.args
        if not isinstance(b, Const) or not b.type.is_int or b.value <= 0:
            continue
        k = int(b.value).bit_length() - 1
        if b.value != 1 << k:
            continue
        if s.op == "floordiv":
            s.op, s.args = "shr", (a, Const(k, u32))
        else:
            s.op, s.args = "and", (a, Const(b.value - 1, b.type))


# ---------------------------------------------------------------- helpers
def definitions(stmts: list) -> Counter:
    """How many times each Var is assigned in ``stmts``."""
    assigned = []  # every assignment, in order, counted at once (in C) at the end
    for s in walk(stmts):
        if s.__class__ is Instr:
            if s.dst is not None:
                assigned.append(s.dst)
        elif s.__class__ is nodes.StaticFor:
            assigned += (s.var, s.var)
    return Counter(assigned)


def uses(stmts: list) -> Counter:
    """How many times each Var is read in ``stmts`` (operands, conditions, array shapes)."""
    return Counter([a for a in _operands(stmts) if a.__class__ is Var])


def _operands(stmts: list) -> list:
    """The operands of every instruction and the condition of every If in ``stmts``, in
    order (Vars, Consts, Arrays, Frags)."""
    read = []
    for s in walk(stmts):
        if s.__class__ is Instr:
            read += s.args
        elif s.__class__ is nodes.If:
            read.append(s.cond)
    return read


def _replaced(args: tuple, mapping: dict) -> tuple | None:
    """``args`` with the Vars that ``mapping`` holds replaced, or None when it holds none."""
    for a in args:
        if a.__class__ is Var and a in mapping:
            return tuple(mapping.get(a, a) if a.__class__ is Var else a for a in args)
    return None


def _map_block(stmts: list, fn) -> list:
    """Rebuild a block with ``fn(stmt) -> list of stmts``, recursing into nested blocks first."""
    out = []
    for s in stmts:
        cls = s.__class__
        if cls is Instr:
            pass
        elif cls is nodes.If:
            s.then, s.orelse = _map_block(s.then, fn), _map_block(s.orelse, fn)
        elif cls is nodes.Loop:
            s.body, s.step = _map_block(s.body, fn), _map_block(s.step, fn)
        elif cls is nodes.StaticFor or cls is nodes.Region:
            s.body = _map_block(s.body, fn)
        out.extend(fn(s))
    return out


def _substitute(stmts: list, mapping: dict) -> None:
    """Replace Var operands per ``mapping`` (Var -> Var or Const) everywhere in ``stmts``."""
    for s in walk(stmts):
        if s.__class__ is Instr:
            args = _replaced(s.args, mapping)
            if args is not None:
                s.args = args
        elif s.__class__ is nodes.If and s.cond.__class__ is Var and s.cond in mapping:
            s.cond = mapping[s.cond]


# ---------------------------------------------------------------- unrolling
def unroll(fn: Function) -> None:
    """Replace each ``StaticFor`` by one ``Region`` per value (``continue`` leaves the copy,
    ``break`` the whole loop) with the loop variable a constant."""
    fn.body = _map_block(
        fn.body, lambda s: [_unroll_one(fn, s)] if isinstance(s, nodes.StaticFor) else [s]
    )


def _unroll_one(fn: Function, sf: nodes.StaticFor) -> nodes.Region:
    outer = nodes.Region(fresh_id(), [], loc=sf.loc)
    inner_defs = definitions(sf.body)
    all_defs = definitions(fn.body)
    outside_uses = uses(fn.body) - uses(sf.body)
    local = [v for v, n in inner_defs.items() if all_defs[v] == n == 1 and not outside_uses[v]]
    assigned_var = inner_defs[sf.var] > 0
    read_after = outside_uses[sf.var] > 0  # the variable keeps its last value after the loop
    shared = _shared_memo(fn)
    for k, value in enumerate(sf.values):
        iteration = nodes.Region(fresh_id(), [], loc=sf.loc)
        memo = dict(shared)  # (deepcopy adds the objects it copies)
        for v in local:
            memo[id(v)] = Var(f"{v.name}_{k}", v.type)
        body = copy.deepcopy(sf.body, memo)
        const = const_convert(value, sf.var.type)
        if not assigned_var:
            _substitute(body, {sf.var: const})
        if assigned_var or read_after:
            body.insert(0, Instr("mov", sf.var, (const,), {}, loc=sf.loc))
        iteration.body = _retarget(body, sf.id, outer.id, iteration.id)
        outer.body.append(iteration)
    return outer


def _shared_memo(fn: Function) -> dict:
    """A deepcopy memo that keeps Arrays and Vars shared between copies; the caller adds
    fresh Vars for the copied body's own temporaries."""
    memo: dict = {id(a): a for a in fn.arrays}
    for s in walk(fn.body):
        operands: list = []
        if isinstance(s, Instr):
            operands = [*s.args, s.dst]
        elif isinstance(s, nodes.If):
            operands = [s.cond]
        elif isinstance(s, nodes.StaticFor):
            operands = [s.var]
        for v in operands:
            if isinstance(v, Var | Array):
                memo[id(v)] = v
    for p in fn.params:
        memo[id(p.value)] = p.value
    return memo


def _retarget(stmts: list, loop_id: int, break_to: int, continue_to: int) -> list:
    """In one unrolled copy: ``break`` leaves the whole loop, ``continue`` leaves the copy,
    and nested constructs get fresh ids."""
    renames = {}
    for s in walk(stmts):
        if isinstance(s, nodes.Loop | nodes.Region | nodes.StaticFor):
            renames[s.id] = s.id = fresh_id()

    def fix(s):
        if isinstance(s, nodes.Continue) and s.target == loop_id:
            return [nodes.Break(continue_to, loc=s.loc)]
        if isinstance(s, nodes.Break) and s.target == loop_id:
            s.target = break_to
        elif isinstance(s, nodes.Break | nodes.Continue) and s.target in renames:
            s.target = renames[s.target]
        return [s]

    return _map_block(stmts, fix)


# ---------------------------------------------------------------- folding
def _fold_int(op: str, t, args: tuple[Const, ...]) -> int | bool | None:
    """An integer or bool op on constants, computed as the simulator computes it
    (``kaio.numerics.integer_op``); None for a division by zero (unspecified on the GPU)."""
    if op in ("floordiv", "mod") and args[1].value == 0:
        return None
    with np.errstate(all="ignore"):
        r = numerics.integer_op(op, t, *(np.asarray(a.value, a.type.np_dtype) for a in args))
    return bool(r) if t.is_bool else int(r)


_COMPARE = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _fold_instr(s: Instr):
    """The constant an instruction computes, or None when it cannot be folded exactly."""
    args = s.args
    if s.op == "mov" and args[0].__class__ is Const:
        return args[0]
    if s.op == "select" and args[0].__class__ is Const:
        chosen = args[1] if args[0].value else args[2]
        return chosen
    if not args or not _all_constant(args) or not OPS[s.op].pure:
        return None
    vals = [a.value for a in args]
    t = s.dst.type
    src = args[0].type
    if s.op == "cvt" and (src.is_int or src.is_bool):
        if not t.is_float or abs(int(vals[0])) < 2**53:  # exact through float64 first
            return const_convert(int(vals[0]), t)
    if s.op in _COMPARE and (src.is_int or src.is_bool):
        return Const(_COMPARE[s.op](*vals), bool_)
    if (t.is_int or t.is_bool) and s.op in numerics.INTEGER_OPS:
        r = _fold_int(s.op, t, args)
        return None if r is None else Const(r, t)
    return None


def _all_constant(args: tuple) -> bool:
    for a in args:
        if a.__class__ is not Const:
            return False
    return True


def fold(fn: Function) -> bool:
    """Fold instructions with constant operands and propagate single-definition constants
    and copies. Returns True if anything changed."""
    defs = definitions(fn.body)
    mapping: dict = {}
    params = {p.value for p in fn.params}
    for s in walk(fn.body):
        if s.__class__ is not Instr or s.dst is None or defs[s.dst] != 1:
            continue
        args = _replaced(s.args, mapping)
        if args is not None:
            s.args = args
        value = _fold_instr(s)
        if value is None and s.op == "mov" and s.args[0].__class__ is Var:
            src = s.args[0]
            if (defs[src] == 1 or src in params) and src.type == s.dst.type:
                value = src
        if value is not None and value is not s.dst:
            mapping[s.dst] = value
    if not mapping:
        return False
    _substitute(fn.body, mapping)
    return True


# ---------------------------------------------------------------- dead code
_TERMINATORS = frozenset((nodes.Break, nodes.Continue, nodes.Return))


def eliminate_dead_code(fn: Function) -> bool:
    """Remove unused pure instructions, decided branches, empty Ifs, unreachable statements
    and Regions nothing breaks out of. Returns True if anything changed.

    Each sweep goes backwards, so that an instruction it removes no longer counts as a read
    of its operands when their definitions, earlier in the block, are reached: a chain of
    dead temporaries goes in one sweep; so does a Region whose last Break the sweep
    removes."""
    changed = False
    while True:
        sweep = _Sweep(*_reads_and_targets(fn.body))
        fn.body = sweep.block(fn.body)
        if not sweep.changed:
            return changed
        changed = True


def _reads_and_targets(stmts: list) -> tuple[Counter, Counter]:
    """``uses(stmts)`` and how many Breaks in ``stmts`` leave each id, in one walk."""
    read, targets = [], []
    for s in walk(stmts):
        cls = s.__class__
        if cls is Instr:
            read += s.args
        elif cls is nodes.If:
            read.append(s.cond)
        elif cls is nodes.Break:
            targets.append(s.target)
    return Counter([a for a in read if a.__class__ is Var]), Counter(targets)


def _reachable(stmts: list) -> list:
    """``stmts`` up to and including the first Break, Continue or Return."""
    for i, s in enumerate(stmts):
        if s.__class__ in _TERMINATORS:
            return stmts[: i + 1]
    return stmts


class _Sweep:
    """One backward dead-code sweep, with the read counts it keeps up to date (and the
    Break counts, for the Breaks it pops off the end of their Region)."""

    def __init__(self, used: Counter, targets: Counter):
        self.used, self.targets, self.changed = used, targets, False

    def block(self, stmts: list) -> list:
        """The block cleaned, its nested blocks first, from its last statement up."""
        reachable = _reachable(stmts)
        changed = len(reachable) != len(stmts)
        out: list = []
        for s in reversed(reachable):
            if s.__class__ is Instr:  # most statements: inline, no list made
                if self._dead(s):
                    self._forget_reads(s.args)
                    changed = True
                else:
                    out.append(s)
                continue
            for block in child_blocks(s):
                block[:] = self.block(block)
            kept = self.stmt(s)
            changed |= len(kept) != 1 or kept[0] is not s
            out.extend(reversed(kept))
        out.reverse()
        self.changed |= changed
        return _reachable(out)  # an inlined branch may end in a Break

    def _dead(self, s: Instr) -> bool:
        """Whether instruction ``s`` goes: a pure one whose result nothing reads, or a
        copy of a variable to itself."""
        dst = s.dst
        if dst is not None and not self.used[dst] and OPS[s.op].pure:
            return True
        return s.op == "mov" and s.args[0] is dst

    def _forget_reads(self, operands) -> None:
        for a in operands:
            if a.__class__ is Var:
                self.used[a] -= 1

    def stmt(self, s) -> list:
        """What replaces ``s`` (not an instruction: ``block`` decides those): nothing,
        itself, or the statements of its decided branch or of a Region nothing breaks out
        of."""
        if s.__class__ is nodes.If:
            if s.cond.__class__ is Const:
                return s.then if s.cond.value else s.orelse
            if not s.then and not s.orelse:
                self._forget_reads((s.cond,))
                return []
            return [s]
        if s.__class__ is nodes.Region:
            body = s.body
            if body and body[-1].__class__ is nodes.Break and body[-1].target == s.id:
                body.pop()
                self.targets[s.id] -= 1
                self.changed = True
            if not self.targets[s.id]:
                return body
            return [s]
        return [s]


# ---------------------------------------------------------------- facts along a block
class _Facts:
    """What a forward scan knows about some variables (the value a copy holds, the
    instruction that computed a sum), each fact kept until one of the variables it depends
    on is reassigned."""

    def __init__(self, facts: dict | None = None, deps: dict | None = None):
        self.facts = facts if facts is not None else {}
        self.deps = deps if deps is not None else {}  # Var -> keys of the facts on it

    def get(self, key, default=None):
        """The fact about ``key``, or ``default``."""
        return self.facts.get(key, default)

    def add(self, key, value, deps) -> None:
        """Know ``value`` about ``key`` while none of the Vars among ``deps`` changes."""
        self.facts[key] = value
        for v in deps:
            if v.__class__ is Var:  # a new set: copies share the sets (``copy``)
                self.deps[v] = self.deps.get(v, frozenset()) | {key}

    def forget(self, assigned) -> None:
        """Drop the facts that depend on a variable of ``assigned`` (a fact added again
        since may go too: that only loses an opportunity)."""
        if not self.deps:
            return
        for v in assigned:
            for key in self.deps.pop(v, ()):
                self.facts.pop(key, None)

    def copy(self) -> _Facts:
        """An independent copy, for a nested block (the sets of keys are never changed in
        place, so the copies share them)."""
        return _Facts(dict(self.facts), dict(self.deps))


def assignments(stmts: list, table: dict | None = None) -> dict:
    """``{id(statement): the variables it may assign}`` for each compound statement of
    ``stmts`` (at any depth), in one walk; a pass that moves or rewrites operands but
    assigns nothing new may keep using it."""
    table = {} if table is None else table
    for s in stmts:
        if s.__class__ is Instr:
            continue
        inner = {s.var} if s.__class__ is nodes.StaticFor else set()
        for block in child_blocks(s):
            assignments(block, table)
            for t in block:
                if t.__class__ is not Instr:
                    inner |= table[id(t)]
                elif t.dst is not None:
                    inner.add(t.dst)
        table[id(s)] = inner
    return table


def _assigned(s, table: dict):
    """The variables statement ``s`` may assign (``table``: from ``assignments``), a
    collection to iterate."""
    if s.__class__ is Instr:
        return () if s.dst is None else (s.dst,)
    return table[id(s)]


# ---------------------------------------------------------------- copy propagation
def propagate_copies(fn: Function) -> bool:
    """Replace reads of ``x`` after ``x = mov y`` by ``y`` while neither is reassigned, for
    variables with several definitions too (a device function's locals inlined twice, a
    user variable reassigned): ``fold`` covers single definitions only. The copies then die,
    and the values they carried become plain temporaries that ``hoist_invariants`` can
    move. Returns True if any operand changed."""
    return _propagate_block(fn.body, _Facts(), assignments(fn.body))


def _propagate_block(stmts: list, copies: _Facts, table: dict) -> bool:
    """Propagate ``copies`` (Var -> the Var or Const it holds) through ``stmts`` in program
    order, updating them as copies are made and variables reassigned."""
    changed = False
    held, deps = copies.facts, copies.deps  # (``copies.forget`` inlined for instructions)
    for s in stmts:
        cls = s.__class__
        if cls is Instr:
            args = _replaced(s.args, held)
            if args is not None:
                s.args, changed = args, True
            dst = s.dst
            if dst in deps:
                for key in deps.pop(dst):
                    held.pop(key, None)
            src = s.args[0] if s.op == "mov" else None
            if (src.__class__ is Var or src.__class__ is Const) and src is not dst:
                if src.type == dst.type:
                    copies.add(dst, src, (dst, src))
        elif cls is nodes.If:
            if s.cond.__class__ is Var and copies.get(s.cond) is not None:
                s.cond, changed = copies.get(s.cond), True
            for block in child_blocks(s):
                changed |= _propagate_block(block, copies.copy(), table)
            copies.forget(_assigned(s, table))
        elif cls is nodes.Region:  # entered at the top, left at the end or by a break
            changed |= _propagate_block(s.body, copies.copy(), table)
            copies.forget(_assigned(s, table))
        else:  # loops: a copy holds inside only if nothing in the loop reassigns either side
            copies.forget(_assigned(s, table))
            for block in child_blocks(s):
                changed |= _propagate_block(block, copies.copy(), table)
    return changed


# ---------------------------------------------------------------- constant terms
def constants_outward(fn: Function) -> None:
    """Rewrite ``p = x + c; ...; d = p + y`` (integers, ``c`` a constant, ``p`` assigned once
    and read only by ``d``, ``x`` not reassigned in between) into ``...; p = x + y;
    d = p + c``: the constant is added last, where the PTX emitter folds it into an
    address's immediate offset (``s[x + y + 1]`` reads ``[x+y]`` plus the element size) and
    ptxas shares ``x + y`` between accesses at different constant offsets. Exact: integers
    wrap."""
    tables = (definitions(fn.body), uses(fn.body), assignments(fn.body))
    fn.body = _constants_outward_block(fn.body, *tables)


def _constants_outward_block(stmts: list, defs: Counter, read: Counter, table: dict) -> list:
    """``constants_outward`` in ``stmts`` and the blocks nested in it."""
    out: list = []
    sums = _Facts()  # p -> its instruction p = x + c, while x keeps its value
    for s in stmts:
        for block in child_blocks(s):
            block[:] = _constants_outward_block(block, defs, read, table)
        moved = _constant_last(s, sums, read)
        if moved is not None:
            out.remove(moved)
            out.append(moved)
        out.append(s)
        sums.forget(_assigned(s, table))
        if constant_term(s) is not None and defs[s.dst] == 1:
            sums.add(s.dst, s, s.args)
    return out


def _constant_last(d, sums: _Facts, read: Counter) -> Instr | None:
    """If ``d = p + y`` with ``p = x + c`` one of ``sums``: rewrite both (``p = x + y``, to be
    moved just before ``d``, and ``d = p + c``) and return ``p``'s instruction."""
    if not _int_sum(d):
        return None
    for p, y in (d.args, d.args[::-1]):
        inner = sums.get(p)
        if inner is not None and read[p] == 1 and not isinstance(y, Const):
            x, c = constant_term(inner)
            inner.args, d.args = (x, y), (p, c)
            return inner
    return None


def _int_sum(s) -> bool:
    """Whether ``s`` is an integer ``add``."""
    return isinstance(s, Instr) and s.op == "add" and s.dst.type.is_int


def constant_term(s) -> tuple | None:
    """``(x, c)`` if ``s`` is the integer sum of a variable ``x`` and a constant ``c``."""
    if not _int_sum(s):
        return None
    a, b = s.args
    if isinstance(a, Var) and isinstance(b, Const):
        return a, b
    if isinstance(a, Const) and isinstance(b, Var):
        return b, a
    return None


# ---------------------------------------------------------------- loop-invariant code motion
# The special registers whose value a thread sees never change (a clock would not be one).
THREAD_CONSTANT_REGISTERS = frozenset(
    "tid.x tid.y tid.z ntid.x ntid.y ntid.z ctaid.x ctaid.y ctaid.z "
    "nctaid.x nctaid.y nctaid.z laneid dynamic_smem_size cluster_ctarank".split()
)
# A loop whose invariants would keep more than this many 32-bit registers live across it is
# left to ptxas: hoisting them all would spill (an element-by-element tile copy has a few
# per element), and ptxas hoists what its register budget allows.
MAX_LIVE_INVARIANTS = 96


def hoist_invariants(fn: Function) -> None:
    """Move loop-invariant computations in front of their loop, innermost loops first (so
    an inner loop's invariants can leave the outer loop too).

    An instruction moves when it is pure and cannot trap (``_hoistable``), assigns a
    variable nothing else assigns, and reads only constants and variables the loop does not
    assign. Only the loop's own straight-line code is searched (its body, its step and the
    Regions in them), not the branches of an ``If``: a hoisted instruction runs once even if
    the loop runs zero times, which pure arithmetic allows, but work that a branch skips
    should stay skipped. Loads, stores, barriers, atomics, shuffles and votes never move.

    Integer additions are reassociated so that invariant terms meet first:
    ``(v + a) + b`` with only ``v`` varying becomes ``(a + b) + v``, and ``a + b`` leaves
    the loop (exact: integers wrap). Array indices keep their form; the PTX emitter orders
    the terms of each address so that the invariant ones are summed first.

    A loop whose hoisted values would hold more than ``MAX_LIVE_INVARIANTS`` registers
    across it (``_pressure``) is left as it is."""
    defs, read = definitions(fn.body), uses(fn.body)  # moving code changes neither

    def visit(s) -> list:
        return _hoist_loop(s, defs, read) if isinstance(s, nodes.Loop) else [s]

    fn.body = _map_block(fn.body, visit)


def _hoist_loop(loop: nodes.Loop, defs: Counter, read: Counter) -> list:
    """The instructions hoisted out of ``loop``, followed by the loop. Each reassociation
    makes one more instruction invariant, so the rounds end."""
    variant = set(definitions([loop]))
    if _pressure(loop, variant, defs) > MAX_LIVE_INVARIANTS:
        return [loop]
    hoisted: list = []
    while True:
        for block in child_blocks(loop):
            block[:] = _hoist_block(block, variant, defs, hoisted)
        if not _reassociate(loop, variant, defs, read):
            return [*hoisted, loop]


def _hoist_block(stmts: list, variant: set, defs: Counter, hoisted: list) -> list:
    """``stmts`` without its invariant instructions, which go to ``hoisted`` in order (their
    results leave ``variant``); Regions are searched too."""
    out = []
    for s in stmts:
        if isinstance(s, Instr) and _hoistable(s, defs) and not _reads(s, variant):
            hoisted.append(s)
            variant.discard(s.dst)
            continue
        if isinstance(s, nodes.Region):
            s.body = _hoist_block(s.body, variant, defs, hoisted)
        out.append(s)
    return out


def _pressure(loop: nodes.Loop, variant: set, defs: Counter) -> int:
    """The registers (64-bit values count two) that the loop's invariant instructions would
    keep live across it once hoisted: their results that code staying in the loop reads."""
    variant, moved = set(variant), set()
    for s in _straight_line(loop):
        if _hoistable(s, defs) and not _reads(s, variant):
            moved.add(s.dst)
            variant.discard(s.dst)
    live = set()
    for s in walk([loop]):
        if isinstance(s, Instr) and s.dst not in moved:
            live |= {a for a in s.args if isinstance(a, Var) and a in moved}
        elif isinstance(s, nodes.If) and s.cond in moved:
            live.add(s.cond)
    return sum(2 if v.type.bits == 64 else 1 for v in live)


def _straight_line(loop: nodes.Loop):
    """The instructions of the loop's body and step and of the Regions in them, in order."""

    def visit(stmts):
        for s in stmts:
            if isinstance(s, Instr):
                yield s
            elif isinstance(s, nodes.Region):
                yield from visit(s.body)

    for block in child_blocks(loop):
        yield from visit(block)


def _hoistable(s: Instr, defs: Counter) -> bool:
    """Pure, unable to trap, and the only assignment of its result; special registers only
    of ``THREAD_CONSTANT_REGISTERS``. Integer division by zero does not trap on the GPU, but
    it is kept in place unless the divisor is a nonzero constant, so that no division runs
    where the program did not ask for one."""
    if s.dst is None or defs[s.dst] != 1 or not OPS[s.op].pure:
        return False
    if s.op == "sreg":
        return s.attrs["name"] in THREAD_CONSTANT_REGISTERS
    if s.op in ("floordiv", "mod"):
        divisor = s.args[1]
        return isinstance(divisor, Const) and divisor.value != 0
    return True


def _reassociate(loop: nodes.Loop, variant: set, defs: Counter, read: Counter) -> bool:
    """Rewrite ``p = a + b; ...; d = p + q`` (integers, one block of the loop's straight-line
    code; ``p`` read only by ``d``; ``q`` and exactly one of ``a, b`` invariant; neither
    reassigned in between) into ``p = inv + q; ...; d = p + var``. ``p`` then reads only
    invariants; the caller hoists it. True if anything changed."""
    changed, table = False, assignments([loop])
    for block in child_blocks(loop):
        changed |= _reassociate_block(block, variant, defs, read, table)
    return changed


def _reassociate_block(
    stmts: list, variant: set, defs: Counter, read: Counter, table: dict
) -> bool:
    """``_reassociate`` in one block, in program order; Regions are blocks of their own."""
    sums = _Facts()  # p -> its instruction, while its operands keep their values
    changed = False
    for s in stmts:
        if isinstance(s, nodes.Region):
            changed |= _reassociate_block(s.body, variant, defs, read, table)
        if _int_sum(s):
            changed |= _reassociate_pair(s, sums, variant, read)
        sums.forget(_assigned(s, table))
        if _int_sum(s) and defs[s.dst] == 1:
            sums.add(s.dst, s, s.args)
    return changed


def _reassociate_pair(d: Instr, sums: _Facts, variant: set, read: Counter) -> bool:
    """Rewrite ``d = p + q`` with ``p`` one of ``sums`` (see ``_reassociate``)."""
    for p, q in (d.args, d.args[::-1]):
        inner = sums.get(p)
        if inner is None or read[p] != 1 or _varies(q, variant):
            continue
        a, b = inner.args
        if _varies(a, variant) == _varies(b, variant):
            continue
        inv, var = (b, a) if _varies(a, variant) else (a, b)
        inner.args, d.args = (inv, q), (p, var)
        return True
    return False


def _reads(s: Instr, variables: set) -> bool:
    """Whether ``s`` reads one of ``variables``."""
    return any(isinstance(a, Var) and a in variables for a in s.args)


def _varies(v, variant: set) -> bool:
    """Whether operand ``v`` is a variable the loop assigns."""
    return isinstance(v, Var) and v in variant


# Ops that ptxas expands into a fast path and a branch to a slow-path subroutine (IEEE f32
# and f64 division and square root). ptxas schedules within its basic blocks, so a load
# written after one of these waits for it: the load goes out only once the division's
# operands have arrived, a second memory latency where one would do.
SLOW_PATH_OPS = ("div", "sqrt")


def loads_before_slow_paths(fn: Function) -> None:
    """Move each scalar ``load`` of a global array up above the slow-path arithmetic
    (``SLOW_PATH_OPS`` on floats) that stands between it and the point where its operands
    are ready, in the same straight-line list of statements.

    A load crosses only pure instructions that neither assign its operands nor read or
    assign its result; it stops at any other statement (memory accesses, barriers,
    branches, loops), so loads, stores and everything with an effect keep their order.
    It moves to just above the first slow-path instruction in that stretch, and only
    when there is one: elsewhere ptxas schedules the straight-line code itself."""
    for s in walk(fn.body):
        for block in child_blocks(s):
            block[:] = _loads_first_in(block)
    fn.body = _loads_first_in(fn.body)


def _loads_first_in(stmts: list) -> list:
    out: list = []
    for s in stmts:
        at = _slow_path_above(out, s) if _global_load(s) else None
        if at is None:
            out.append(s)
        else:
            out.insert(at, s)
    return out


def _global_load(s) -> bool:
    return isinstance(s, Instr) and s.op == "load" and s.args[0].space == "global"


def _slow_path_above(stmts: list, load: Instr) -> int | None:
    """The index in ``stmts`` (the code before ``load``) of the earliest slow-path
    instruction that ``load`` may move above, or None."""
    operands = {a for a in load.args if isinstance(a, Var)}
    at = None
    for i in range(len(stmts) - 1, -1, -1):
        s = stmts[i]
        if not isinstance(s, Instr) or not OPS[s.op].pure or s.dst in operands:
            break
        if s.dst is load.dst or any(a is load.dst for a in s.args):
            break
        if s.op in SLOW_PATH_OPS and s.dst is not None and s.dst.type.is_float:
            at = i
    return at
