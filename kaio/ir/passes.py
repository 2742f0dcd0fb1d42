"""IR passes: unrolling, constant folding and propagation, dead code elimination.

``optimize`` runs them in order; each pass rewrites ``Function.body`` in place. Folding is
sound on this non-SSA IR because it only touches variables with exactly one definition (every
frontend temporary), whose definition dominates its uses.
"""

from __future__ import annotations

import copy
from collections import Counter

from kaio.ir.builder import const_convert, wrap_int
from kaio.ir.nodes import (
    Array,
    Break,
    Const,
    Continue,
    Function,
    If,
    Instr,
    Loop,
    Region,
    Return,
    StaticFor,
    Var,
    child_blocks,
    fresh_id,
    walk,
)
from kaio.ir.ops import OPS
from kaio.types import bool_, u32


def optimize(fn: Function) -> None:
    """Run every pass: unroll, then fold and clean up until nothing changes, then reduce
    divisions by powers of two to shifts and masks."""
    unroll(fn)
    for _ in range(8):
        changed = fold(fn)
        changed |= eliminate_dead_code(fn)
        if not changed:
            break
    strength_reduce(fn)


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
    counts: Counter = Counter()
    for s in walk(stmts):
        if isinstance(s, Instr) and s.dst is not None:
            counts[s.dst] += 1
        elif isinstance(s, StaticFor):
            counts[s.var] += 2
    return counts


def uses(stmts: list) -> Counter:
    """How many times each Var is read in ``stmts`` (operands, conditions, array shapes)."""
    counts: Counter = Counter()
    for s in walk(stmts):
        if isinstance(s, Instr):
            for a in s.args:
                if isinstance(a, Var):
                    counts[a] += 1
        elif isinstance(s, If) and isinstance(s.cond, Var):
            counts[s.cond] += 1
    return counts


def _map_block(stmts: list, fn) -> list:
    """Rebuild a block with ``fn(stmt) -> list of stmts``, recursing into nested blocks first."""
    out = []
    for s in stmts:
        if isinstance(s, If):
            s.then, s.orelse = _map_block(s.then, fn), _map_block(s.orelse, fn)
        elif isinstance(s, Loop):
            s.body, s.step = _map_block(s.body, fn), _map_block(s.step, fn)
        elif isinstance(s, StaticFor | Region):
            s.body = _map_block(s.body, fn)
        out.extend(fn(s))
    return out


def _substitute(stmts: list, mapping: dict) -> None:
    """Replace Var operands per ``mapping`` (Var -> Var or Const) everywhere in ``stmts``."""
    for s in walk(stmts):
        if isinstance(s, Instr):
            if any(isinstance(a, Var) and a in mapping for a in s.args):
                s.args = tuple(mapping.get(a, a) if isinstance(a, Var) else a for a in s.args)
        elif isinstance(s, If) and isinstance(s.cond, Var) and s.cond in mapping:
            s.cond = mapping[s.cond]


# ---------------------------------------------------------------- unrolling
def unroll(fn: Function) -> None:
    """Replace each ``StaticFor`` by one ``Region`` per value (``continue`` leaves the copy,
    ``break`` the whole loop) with the loop variable a constant."""
    fn.body = _map_block(
        fn.body, lambda s: [_unroll_one(fn, s)] if isinstance(s, StaticFor) else [s]
    )


def _unroll_one(fn: Function, sf: StaticFor) -> Region:
    outer = Region(fresh_id(), [], sf.loc)
    inner_defs = definitions(sf.body)
    all_defs = definitions(fn.body)
    outside_uses = uses(fn.body) - uses(sf.body)
    local = [v for v, n in inner_defs.items() if all_defs[v] == n == 1 and not outside_uses[v]]
    assigned_var = inner_defs[sf.var] > 0
    for k, value in enumerate(sf.values):
        iteration = Region(fresh_id(), [], sf.loc)
        memo = _shared_memo(fn)
        for v in local:
            memo[id(v)] = Var(f"{v.name}_{k}", v.type)
        body = copy.deepcopy(sf.body, memo)
        const = const_convert(value, sf.var.type)
        if assigned_var:
            body.insert(0, Instr("mov", sf.var, (const,), {}, sf.loc))
        else:
            _substitute(body, {sf.var: const})
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
        elif isinstance(s, If):
            operands = [s.cond]
        elif isinstance(s, StaticFor):
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
        if isinstance(s, Loop | Region | StaticFor):
            renames[s.id] = s.id = fresh_id()

    def fix(s):
        if isinstance(s, Continue) and s.target == loop_id:
            return [Break(continue_to, s.loc)]
        if isinstance(s, Break) and s.target == loop_id:
            s.target = break_to
        elif isinstance(s, Break | Continue) and s.target in renames:
            s.target = renames[s.target]
        return [s]

    return _map_block(stmts, fix)


# ---------------------------------------------------------------- folding
def _fold_int(op: str, t, a, b=None):
    if op in ("add", "sub", "mul", "and", "or", "xor"):
        py = {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "and": lambda: a & b,
            "or": lambda: a | b,
            "xor": lambda: a ^ b,
        }[op]()
        return py if t == bool_ else wrap_int(py, t)
    if op in ("floordiv", "mod"):
        if b == 0:
            return None
        return wrap_int(a // b if op == "floordiv" else a % b, t)
    if op == "shl":
        return 0 if b >= t.bits else wrap_int(a << b, t)
    if op == "shr":
        if b >= t.bits:
            return -1 if a < 0 else 0
        return a >> b
    if op in ("min", "max"):
        return min(a, b) if op == "min" else max(a, b)
    if op == "neg":
        return wrap_int(-a, t)
    if op == "invert":
        return wrap_int(~a, t)
    if op == "not":
        return not a
    return None


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
    if s.op == "mov" and isinstance(args[0], Const):
        return args[0]
    if s.op == "select" and isinstance(args[0], Const):
        chosen = args[1] if args[0].value else args[2]
        return chosen
    if not all(isinstance(a, Const) for a in args) or not OPS[s.op].pure or not args:
        return None
    vals = [a.value for a in args]
    t = s.dst.type
    src = args[0].type
    if s.op == "cvt" and (src.is_int or src.is_bool):
        if not t.is_float or abs(int(vals[0])) < 2**53:  # exact through float64 first
            return const_convert(int(vals[0]), t)
    if s.op in _COMPARE and (src.is_int or src.is_bool):
        return Const(_COMPARE[s.op](*vals), bool_)
    if (t.is_int or t.is_bool) and s.op in (
        "add sub mul and or xor floordiv mod shl shr min max neg invert not".split()
    ):
        r = _fold_int(s.op, t, *vals)
        return None if r is None else Const(bool(r) if t.is_bool else r, t)
    return None


def fold(fn: Function) -> bool:
    """Fold instructions with constant operands and propagate single-definition constants
    and copies. Returns True if anything changed."""
    defs = definitions(fn.body)
    mapping: dict = {}
    params = {p.value for p in fn.params}
    for s in walk(fn.body):
        if not isinstance(s, Instr) or s.dst is None or defs[s.dst] != 1:
            continue
        if any(isinstance(a, Var) and a in mapping for a in s.args):
            s.args = tuple(mapping.get(a, a) if isinstance(a, Var) else a for a in s.args)
        value = _fold_instr(s)
        if value is None and s.op == "mov" and isinstance(s.args[0], Var):
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
_TERMINATORS = (Break, Continue, Return)


def _size(stmts: list) -> int:
    return sum(1 for _ in walk(stmts))


def eliminate_dead_code(fn: Function) -> bool:
    """Remove unused pure instructions, decided branches, empty Ifs, unreachable statements
    and Regions nothing breaks out of. Returns True if anything changed."""
    start = size = _size(fn.body)
    while True:
        used = uses(fn.body)
        targets = {s.target for s in walk(fn.body) if isinstance(s, Break)}
        fn.body = _clean_block(fn.body, used, targets)
        new_size = _size(fn.body)
        if new_size == size:
            return new_size != start
        size = new_size


def _clean_block(stmts: list, used: Counter, targets: set) -> list:
    out: list = []
    for s in stmts:
        for block in child_blocks(s):
            block[:] = _clean_block(block, used, targets)
        replacement = _clean_stmt(s, used, targets)
        out.extend(replacement)
        if out and isinstance(out[-1], _TERMINATORS):
            break
    return out


def _clean_stmt(s, used: Counter, targets: set) -> list:
    if isinstance(s, Instr):
        if s.dst is not None and OPS[s.op].pure and not used[s.dst]:
            return []
        if s.op == "mov" and s.args[0] is s.dst:
            return []
        return [s]
    if isinstance(s, If):
        if isinstance(s.cond, Const):
            return s.then if s.cond.value else s.orelse
        if not s.then and not s.orelse:
            return []
        return [s]
    if isinstance(s, Region):
        if s.body and isinstance(s.body[-1], Break) and s.body[-1].target == s.id:
            s.body.pop()
        if s.id not in targets:
            return s.body
        return [s]
    return [s]
