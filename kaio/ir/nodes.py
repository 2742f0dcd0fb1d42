"""The typed IR: values, instructions and structured control flow.

The IR is what every backend consumes (PTX emitter, CPU simulator, LLVM). It is deliberately
small:

- Values are ``Var`` (a typed virtual register, mutable: user variables may be assigned more
  than once; every temporary the frontend creates is assigned exactly once) and ``Const``.
- Arrays are ``Array`` objects (global, shared, dynamic shared or local memory). They are not
  values: only ``load``, ``store`` and ``atomic`` instructions name them.
- ``Instr`` is the one instruction node: ``dst = op(args) {attrs}``. The op names, their
  operand types and their meaning are catalogued in ``kaio.ir.ops``; the PTX emitter and the
  simulator each have one table keyed by op name.
- Control flow is structured: ``If``, ``Loop`` (with a ``step`` block run after the body and on
  ``continue``), ``Region`` (a block that ``Break`` can leave: inlined device functions and
  unrolled loop iterations use it), ``Break``/``Continue`` naming their target by id, ``Return``
  (the thread exits) and ``StaticFor`` (removed by the unroll pass before any backend runs).

Structured control flow keeps the simulator's per-thread masks simple (each construct saves and
restores the mask) and lets the PTX emitter produce readable, predictable code. See
docs/architecture.md for the argument.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kaio.types import ScalarType

_ids = itertools.count(1)


def fresh_id() -> int:
    """A new id for loops and regions, unique in this process."""
    return next(_ids)


@dataclass(eq=False)
class Var:
    """A typed virtual register. Identity (not name) distinguishes variables."""

    name: str
    type: ScalarType

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class Const:
    """A typed constant. ``value`` is a Python int, float or bool, already in range for ``type``
    (integers are stored as the value the type represents: -1 for i32, 2**32-1 for u32)."""

    value: int | float | bool
    type: ScalarType

    def __repr__(self) -> str:
        return f"{self.value!r}:{self.type.name}"


Value = Var | Const


@dataclass(frozen=True)
class SourceLoc:
    """Where a node came from in the Python source (1-based line, 0-based column)."""

    filename: str
    lineno: int
    col: int


@dataclass(eq=False)
class Statement:
    """What every statement has: where it came from in the source (``loc``, None for code the
    compiler made up), given by keyword after the statement's own fields."""

    loc: SourceLoc | None = field(default=None, kw_only=True)


@dataclass(eq=False)
class Array:
    """An array the kernel can index.

    ``space`` is ``"global"`` (a kernel parameter), ``"shared"`` (static shared memory),
    ``"shared_dyn"`` (dynamic shared memory, sized at launch) or ``"local"`` (per-thread).

    ``shape`` holds one value per dimension: i64 ``Var`` parameters for global arrays, ``Const``
    for shared, local and shaped dynamic arrays; for a plain ``shared_dyn`` it is ``(None,)``
    (the size is known only at launch). ``strides`` are in elements: ``None`` means
    C-contiguous (computed from the shape), otherwise one i64 ``Var`` parameter per dimension.
    Indexing is row-major: ``offset = sum(index[d] * stride[d])`` with indices sign- or
    zero-extended to 64 bits.

    ``ptr`` is the u64 ``Var`` holding the base address of a global array (None otherwise).
    ``offset`` is where a ``shared_dyn`` array starts in the dynamic shared memory, in bytes:
    a shaped view (``kaio.shared_dynamic(dtype, shape, offset)``) has a constant shape.
    """

    name: str
    dtype: ScalarType
    space: str
    shape: tuple
    strides: tuple | None = None
    ptr: Var | None = None
    offset: int = 0

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def static_size(self) -> int:
        """Number of elements of a shared or local array (constant shape)."""
        n = 1
        for d in self.shape:
            n *= d.value
        return n

    def __repr__(self) -> str:
        return f"@{self.name}"


@dataclass(frozen=True, eq=False)
class Frag:
    """A run of ``size`` consecutive elements of a local ``array`` (row-major flat order) from
    ``start``: the register operand of a multi-register instruction (vector loads and stores,
    ``ldmatrix``, ``mma``). The elements are named by constants, so the array stays in
    registers; instructions read or write all of them."""

    array: Array
    start: int
    size: int

    def __repr__(self) -> str:
        return f"@{self.array.name}[{self.start}:{self.start + self.size}]"


@dataclass(eq=False)
class Instr(Statement):
    """``dst = op(args) {attrs}``; ``dst`` is None for instructions without a result.

    ``args`` holds ``Var``, ``Const`` and, for memory instructions, ``Array`` and ``Frag``
    operands.
    ``attrs`` holds compile-time details (a shuffle's mode, an atomic's kind, a special
    register's name); see ``kaio.ir.ops`` for each op.
    """

    op: str
    dst: Var | None
    args: tuple
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class If(Statement):
    """``if cond: then else: orelse``; ``cond`` is a bool_ value."""

    cond: Value
    then: list
    orelse: list


@dataclass(eq=False)
class Loop(Statement):
    """Repeat ``body`` then ``step`` until a ``Break(id)``. ``Continue(id)`` jumps to ``step``.

    ``for`` and ``while`` loops both lower to this: the loop test is an ``If`` with a
    ``Break`` at the top of ``body``.
    """

    id: int
    body: list
    step: list


@dataclass(eq=False)
class StaticFor(Statement):
    """A loop over compile-time ``values`` that the unroll pass replaces by copies of ``body``
    with ``var`` bound to each value (``kaio.static_range``). ``id`` is the target of the
    ``Break``/``Continue`` statements inside."""

    id: int
    var: Var
    values: tuple
    body: list


@dataclass(eq=False)
class Region(Statement):
    """A block that ``Break(id)`` leaves early (inlined device functions, unrolled bodies)."""

    id: int
    body: list


@dataclass(eq=False)
class Break(Statement):
    """Leave the enclosing ``Loop``, ``StaticFor`` or ``Region`` with this ``target`` id."""

    target: int


@dataclass(eq=False)
class Continue(Statement):
    """Go to the ``step`` block of the enclosing ``Loop`` (or next ``StaticFor`` value)."""

    target: int


@dataclass(eq=False)
class Return(Statement):
    """The thread exits the kernel."""


Stmt = Instr | If | Loop | StaticFor | Region | Break | Continue | Return


@dataclass(frozen=True)
class Param:
    """A kernel parameter as the launch ABI sees it.

    Scalars are one entry (``value`` a Var). A global array ``a`` becomes several entries in
    order: its pointer (u64), then ``ndim`` i64 shape entries, then (non-contiguous layout only)
    ``ndim`` i64 stride entries in elements. ``role`` is ``"scalar"``, ``"ptr"``, ``"shape"``,
    ``"stride"`` or ``"tensormap"`` (a 128-byte TMA tensor map passed by value; its u64
    ``value`` stands for the map's address); ``source`` is the Python parameter name, ``dim``
    the dimension and ``array`` the ``Array`` the entry belongs to (None for scalars). A bool
    scalar travels as one byte (``.u8`` in PTX).
    """

    name: str
    value: Var
    role: str
    source: str
    dim: int = -1
    array: Array | None = None


@dataclass(eq=False)
class Function:
    """A specialized kernel: its launch parameters, arrays and body."""

    name: str
    params: list[Param]
    arrays: list[Array]
    body: list
    block_size: tuple | None = None
    filename: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def param_arrays(self) -> list[Array]:
        """Global arrays, in parameter order."""
        return [a for a in self.arrays if a.space == "global"]


def walk(stmts: list):
    """Yield every statement of ``stmts`` and of the blocks nested in it, depth first (each
    statement before its nested blocks, which are read after it is yielded). Iterative, with
    a stack of list iterators: the passes walk the IR many times per compile, and a recursive
    generator costs a frame per nesting level for every statement yielded."""
    stack = [iter(stmts)]
    while stack:
        for s in stack[-1]:
            yield s
            if s.__class__ is Instr:  # most statements: no nested blocks
                continue
            blocks = child_blocks(s)
            if blocks:
                stack.extend(map(iter, reversed(blocks)))
                break
        else:
            stack.pop()


def child_blocks(s) -> list[list]:
    """The nested statement lists of one statement."""
    blocks = _CHILD_BLOCKS.get(s.__class__)
    return blocks(s) if blocks is not None else []


# Statement class -> its nested blocks: a table, as the passes ask for every statement.
_CHILD_BLOCKS = {
    If: lambda s: [s.then, s.orelse],
    Loop: lambda s: [s.body, s.step],
    StaticFor: lambda s: [s.body],
    Region: lambda s: [s.body],
}


class BlockLowering:
    """The statement dispatch that the PTX emitter and the LLVM walker share: ``block`` lowers
    a statement list in order, each statement by the method for its kind (``_instr``, ``_if``,
    ``_loop``, ``_region``, and ``_jump`` for ``Break``, ``Continue`` and ``Return``), after
    ``_set_loc`` has taken its source location. ``StaticFor`` is gone by then (the unroll
    pass); any other statement is a compiler bug."""

    what = "this backend"  # who cannot lower a statement, in the error

    def block(self, stmts: list) -> None:
        """Lower a statement list at the current position."""
        for s in stmts:
            self._set_loc(s.loc)
            if isinstance(s, Instr):
                self._instr(s)
            elif isinstance(s, If):
                self._if(s)
            elif isinstance(s, Loop):
                self._loop(s)
            elif isinstance(s, Region):
                self._region(s)
            elif isinstance(s, Break | Continue | Return):
                self._jump(s)
            else:
                raise TypeError(f"{self.what} cannot lower {type(s).__name__} (run the passes)")
