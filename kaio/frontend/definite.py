"""Definite assignment: every variable a kernel reads was assigned on every path to the read.

Python raises ``UnboundLocalError`` when a thread reads a variable that its path never assigned
(``if i < n: v = x[i]`` then ``out[i] = v``); on a GPU the same read takes whatever the register
holds, and the simulator would give 0, so the two would disagree silently. kaio refuses such a
kernel at compile time instead: ``check`` walks the structured IR the frontend made (before any
optimization) with the set of variables assigned on every path so far.

- An ``If`` joins its branches: after it, a variable is assigned when both branches assigned it
  (or one of them does not fall through: ``return``, ``break``, ``continue``).
- A ``Loop`` (``while``, ``range()`` with run-time bounds) may stop at any of its ``break``s
  (the loop test is one, before the first iteration): after it, only what every ``break``
  had assigned counts. A ``range()`` whose bounds are compile-time constants runs its body at
  least once when it is not empty (``StaticFor``), as ``kaio.static_range`` does (the frontend
  unrolls those itself).
- A ``Region`` (an inlined device function, one unrolled iteration) ends at its end or at one
  of its ``break``s (a ``return`` of the device function).

The rule is decided after compile-time evaluation: an ``if`` on a constexpr keeps only its
taken branch, so ``if BM == 64: v = ...`` assigns ``v`` for the specializations where the
test holds. Compile-time values (constants, arrays, tuples) bound inside a run-time branch are
checked by the frontend itself (``Lowerer``: the name is unbound after the branch).
"""

from __future__ import annotations

import functools
import re

from kaio import types as T
from kaio.errors import CompileError
from kaio.ir.nodes import Break, Continue, Function, If, Instr, Loop, Region, Return, StaticFor, Var

_USER_VAR = re.compile(r"(.+)_\d+")  # the frontend names a user variable v as v_<n>
_RESULT_VAR = re.compile(r"ret\d+")  # the result of an inlined device function


def _meet(a: set | None, b: set | None) -> set | None:
    """Paths joining: None is 'no path arrives' (after return/break), the identity."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def _tracked(v) -> bool:
    """User variables and device-function results: the frontend assigns every other
    temporary once, before its uses, on the same path."""
    return v.__class__ is Var and _tracked_name(v.name)


@functools.lru_cache(maxsize=1 << 16)  # (the frontend's names repeat in every kernel)
def _tracked_name(name: str) -> bool:
    return bool(_USER_VAR.fullmatch(name) or _RESULT_VAR.fullmatch(name))


def initial_value(t: T.ScalarType) -> str:
    """A literal of type ``t`` for a hint (``0.0``, ``0``, ``f16(0)``)."""
    if t == T.f32:
        return "0.0"
    if t == T.i32:
        return "0"
    if t.is_bool:
        return "False"
    return f"{t.name}(0)"


def unassigned_message(name: str, t: T.ScalarType | None, construct: str, line: int) -> str:
    """The error for reading ``name``, assigned only on some paths of ``construct`` (``"if"``,
    ``"loop"``) at ``line``: what is wrong and what to write instead."""
    where = f"the {construct} at line {line}" if line else f"an {construct}"
    why = (
        "threads that skip that branch"
        if construct == "if"
        else "threads for which the loop runs no iteration (or leaves it early)"
    )
    example = f" (e.g. {name} = {initial_value(t)})" if t is not None else ""
    return (
        f"{name!r} may be read before it is assigned: it is assigned only inside {where}, so "
        f"{why} would read an undefined value (Python raises UnboundLocalError here); "
        f"assign {name!r} before the {construct}{example}"
        + (", or in every branch" if construct == "if" else "")
    )


class _Checker:
    def __init__(self, function: Function):
        self.function = function
        self.breaks: dict[tuple, list] = {}  # (target id, kind) -> states at the jumps
        self.why: dict[Var, tuple[str, int]] = {}  # var -> (construct, line) that lost it

    def lost(self, before: set | None, after: set | None, construct, loc) -> None:
        """Remember which construct made variables of ``before`` not assigned ``after``."""
        if before is None or before is after:
            return
        for v in before - (after or set()):
            self.why[v] = (construct, loc.lineno if loc else 0)

    def use(self, v, state: set, stmt) -> None:
        if not _tracked(v) or v in state:
            return
        loc = stmt.loc
        construct, line = self.why.get(v, ("if", 0))
        m = _USER_VAR.fullmatch(v.name)
        if m is None:
            message = (
                "the device function called here may end without returning a value; return "
                "a value on every path (or assign the result before an if and return it once)"
            )
        else:
            message = unassigned_message(m.group(1), v.type, construct, line)
        raise CompileError(
            message,
            loc.filename if loc else self.function.filename,
            loc.lineno if loc else 0,
            loc.col if loc else 0,
        )

    def block(self, stmts: list, state: set | None) -> set | None:
        """The variables assigned after ``stmts`` on every path that falls through (None: no
        path does). ``state`` is updated in place; branches work on copies."""
        for s in stmts:
            if state is None:
                return None  # unreachable code after break/continue/return
            state = self.stmt(s, state)
        return state

    def stmt(self, s, state: set) -> set | None:
        if s.__class__ is Instr:
            for a in s.args:
                if a.__class__ is Var and a not in state:
                    self.use(a, state, s)
            if s.dst is not None and _tracked(s.dst):
                state.add(s.dst)
            return state
        if isinstance(s, If):
            self.use(s.cond, state, s)
            then = self.block(s.then, set(state))
            orelse = self.block(s.orelse, set(state))
            after = _meet(then, orelse)
            for branch in (then, orelse):
                self.lost(branch, after, "if", s.loc)
            return after
        if isinstance(s, Break | Continue):
            kind = "break" if isinstance(s, Break) else "continue"
            self.breaks.setdefault((s.target, kind), []).append(set(state))
            return None
        if isinstance(s, Return):
            return None
        if isinstance(s, Loop):
            end = self.block(s.body, set(state))
            step_in = _meet(end, self._take(s.id, "continue"))
            exits = self._take(s.id, "break")
            if step_in is not None:
                self.block(s.step, set(step_in))
            self.lost(end, exits, "loop", s.loc)
            return exits
        if isinstance(s, StaticFor):
            if not s.values:
                return state
            end = self.block(s.body, state | {s.var})
            end = _meet(end, self._take(s.id, "continue"))
            return _meet(end, self._take(s.id, "break"))
        if isinstance(s, Region):  # (``state`` is this statement's to change: no copy)
            end = self.block(s.body, state)
            exits = _meet(end, self._take(s.id, "break"))
            self.lost(end, exits, "loop", s.loc)  # a static_range copy left by continue
            return exits
        return state

    def _take(self, target: int, kind: str) -> set | None:
        """The meet of the states at the ``kind`` jumps (``"break"``, ``"continue"``) to
        ``target`` recorded so far (a Loop's id is the target of both kinds)."""
        result = None
        for st in self.breaks.pop((target, kind), []):
            result = _meet(result, st)
        return result


def check(function: Function) -> None:
    """Raise a located ``CompileError`` when ``function`` reads a variable that is not
    assigned on every path to the read (see the module docstring for the rule)."""
    _Checker(function).block(function.body, {p.value for p in function.params})
