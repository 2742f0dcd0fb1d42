"""Building IR: a block stack, fresh temporaries and the conversions promotion needs."""

from __future__ import annotations

import itertools

from kaio.ir.nodes import Const, Instr, SourceLoc, Var
from kaio.types import ScalarType, f32, int_range


def wrap_int(value: int, t: ScalarType) -> int:
    """``value`` wrapped to the range of integer type ``t`` (two's complement)."""
    mask = (1 << t.bits) - 1
    value &= mask
    if t.kind == "int" and value >= 1 << (t.bits - 1):
        value -= 1 << t.bits
    return value


class Builder:
    """Appends instructions to the innermost open block; every temporary is a fresh ``Var``
    assigned exactly once."""

    def __init__(self):
        self._blocks: list[list] = [[]]
        self._names = itertools.count()
        self.loc: SourceLoc | None = None
        self.substitute: dict[str, str] = {}  # f32 ops emitted as others (ops.FASTMATH)

    @property
    def body(self) -> list:
        """The outermost block (the function body)."""
        return self._blocks[0]

    def append(self, stmt) -> None:
        """Add a statement to the current block (with the current location if it has none)."""
        if stmt.loc is None:
            stmt.loc = self.loc
        self._blocks[-1].append(stmt)

    def block(self) -> _OpenBlock:
        """Open a new block (``with builder.block() as stmts``); statements appended inside
        go to ``stmts``."""
        return _OpenBlock(self._blocks)

    def var(self, t: ScalarType, hint: str = "t") -> Var:
        """A fresh virtual register of type ``t``."""
        return Var(f"{hint}{next(self._names)}", t)

    def emit(self, op: str, t: ScalarType | None, args: tuple, **attrs) -> Var | None:
        """Append ``dst = op(args)`` with a fresh ``dst`` of type ``t`` (None: no result)."""
        dst = self.var(t) if t is not None else None
        if self.substitute and t == f32:
            op = self.substitute.get(op, op)
        self._blocks[-1].append(Instr(op, dst, tuple(args), attrs, loc=self.loc))
        return dst

    def assign(self, dst: Var, value) -> None:
        """``dst = value`` (same type)."""
        self._blocks[-1].append(Instr("mov", dst, (value,), {}, loc=self.loc))

    def convert(self, value, t: ScalarType):
        """``value`` converted to ``t``; constants are converted at compile time."""
        if value.type == t:
            return value
        if isinstance(value, Const):
            return const_convert(value.value, t)
        return self.emit("cvt", t, (value,))


class _OpenBlock:
    """The context manager of ``Builder.block`` (a class, not a generator: the frontend
    opens one for every branch, loop body, inlined call and unrolled iteration)."""

    __slots__ = ("blocks", "stmts")

    def __init__(self, blocks: list):
        self.blocks, self.stmts = blocks, []

    def __enter__(self) -> list:
        self.blocks.append(self.stmts)
        return self.stmts

    def __exit__(self, *exc) -> None:
        self.blocks.pop()


def const_convert(value, t: ScalarType) -> Const:
    """A Python number as a ``Const`` of type ``t`` with the conversion rules of ``cvt``
    (only used for literals and constant operands, whose values are exact)."""
    if t.is_bool:
        return Const(bool(value), t)
    if t.is_packed:  # both halves (kaio.f16x2(v)), as bits
        from kaio.types import pack_host

        return Const(int(pack_host(t, value)), t)
    if t.is_fp8:  # the value it rounds to (saturating), as a Python float
        return Const(float(t(float(value))), t)
    if t.is_float:
        import math

        import numpy as np

        try:
            x = float(value)
        except OverflowError:  # an int beyond the f64 range rounds to infinity
            x = math.inf if value > 0 else -math.inf
        with np.errstate(over="ignore"):  # out of the type's range: infinity, as cvt gives
            return Const(float(np.asarray(x).astype(t.np_dtype)), t)
    if isinstance(value, float):
        import math

        if math.isnan(value):
            return Const(0, t)
        lo, hi = int_range(t)
        if math.isinf(value):  # saturates, as cvt does
            return Const(hi if value > 0 else lo, t)
        return Const(max(lo, min(hi, int(value))), t)
    return Const(wrap_int(int(value), t), t)
