"""The IR verifier: checks operand types, variable definitions and control-flow targets.

Tests run it after every pass; a failure is a compiler bug, reported as ``ValueError``.
"""

from __future__ import annotations

from kaio.ir import nodes
from kaio.ir.nodes import Array, Const, Frag, Function, Instr, Var
from kaio.ir.ops import OPS, PACKED_OPS, REQUIRED_ATTRS, SIGNATURES
from kaio.types import PACKED_TYPES, SCALAR_TYPES, bool_, f32, u32

_TYPE_CLASSES = {
    "num": lambda t: t.is_int or t.is_float,
    "int": lambda t: t.is_int,
    "intbool": lambda t: t.is_int or t.is_bool,
    "bool": lambda t: t.is_bool,
    "float": lambda t: t.is_float,
    "float_exact": lambda t: t.is_float and t.bits >= 32,
    "f32": lambda t: t.name == "f32",
    "any": lambda t: True,
    "u32": lambda t: t == u32,
    "none": lambda t: True,
}


class _Verifier:
    def __init__(self, fn: Function):
        self.fn = fn
        self.defined = {p.value for p in fn.params}
        self.arrays = set(fn.arrays)
        for s in _all(fn.body):
            if isinstance(s, Instr) and s.dst is not None:
                self.defined.add(s.dst)
            elif isinstance(s, nodes.StaticFor):
                self.defined.add(s.var)

    def fail(self, s, msg):
        where = f" at line {s.loc.lineno}" if getattr(s, "loc", None) else ""
        raise ValueError(f"IR verification failed in {self.fn.name}{where}: {msg}")

    def operand(self, s, v):
        if isinstance(v, Var):
            if v not in self.defined:
                self.fail(s, f"%{v.name} is used but never defined")
        elif isinstance(v, Array):
            if v not in self.arrays:
                self.fail(s, f"array @{v.name} is not declared in the function")
        elif isinstance(v, Frag):
            self.operand(s, v.array)
            a = v.array
            if a.space != "local" or not 0 <= v.start < v.start + v.size <= a.static_size:
                self.fail(s, f"fragment {v!r} is not a run of elements of a local array")
        elif not isinstance(v, Const):
            self.fail(s, f"bad operand {v!r}")

    def instr(self, s: Instr):
        info = OPS.get(s.op)
        if info is None:
            self.fail(s, f"unknown op {s.op!r}")
        for a in s.args:
            self.operand(s, a)
        for key, allowed in REQUIRED_ATTRS.get(s.op, {}).items():
            if s.attrs.get(key) not in allowed:
                self.fail(s, f"{s.op} needs attrs[{key!r}] in {allowed}")
        scalars = [a for a in s.args if not isinstance(a, Array | Frag)]
        ok = _TYPE_CLASSES[info.types]
        rule = info.rule
        dst_t = s.dst.type if s.dst is not None else None
        if dst_t is not None and dst_t.is_packed and s.op in PACKED_OPS:
            ok = _TYPE_CLASSES["any"]  # f16x2/bf16x2, per half
        if rule in ("binary", "unary", "ternary"):
            n = {"binary": 2, "unary": 1, "ternary": 3}[rule]
            if len(scalars) != n or any(a.type != dst_t for a in scalars):
                self.fail(s, f"{s.op} needs {n} operand(s) of the result type {dst_t}")
            if not ok(dst_t):
                self.fail(s, f"{s.op} does not accept {dst_t}")
        elif rule == "shift":
            if len(scalars) != 2 or scalars[0].type != dst_t or scalars[1].type != u32:
                self.fail(s, f"{s.op} needs ({dst_t}, u32)")
        elif rule == "compare":
            if dst_t != bool_ or len(scalars) != 2 or scalars[0].type != scalars[1].type:
                self.fail(s, f"{s.op} compares two operands of one type into a bool")
            if not ok(scalars[0].type):
                self.fail(s, f"{s.op} does not accept {scalars[0].type}")
        elif rule == "select":
            if (
                len(scalars) != 3
                or scalars[0].type != bool_
                or {
                    scalars[1].type,
                    scalars[2].type,
                }
                != {dst_t}
            ):
                self.fail(s, "select needs (bool, T, T) -> T")
        elif rule == "convert":
            if len(scalars) != 1 or dst_t is None:
                self.fail(s, f"{s.op} converts one operand")
            if s.op == "bitcast" and scalars[0].type.bits != dst_t.bits:
                self.fail(s, "bitcast needs types of the same width")
            src_t = scalars[0].type
            if s.op == "cvt" and (src_t.is_packed or dst_t.is_packed):
                self.fail(s, "cvt does not take packed pairs (pack, unpack_lo/hi do)")
            if s.op in ("unpack_lo", "unpack_hi") and not (
                src_t.is_packed and dst_t == src_t.element
            ):
                self.fail(s, f"{s.op} takes a packed pair to its element type")
        elif s.op == "pack":
            kinds = {a.type for a in scalars}
            if not (dst_t is not None and dst_t.is_packed and len(scalars) == 2) or kinds not in (
                {dst_t.element},
                {f32},
            ):
                self.fail(s, "pack needs two operands of the pair's element type, or two f32")
        elif s.op in ("prmt", "lop3"):
            if dst_t != u32 or len(scalars) != 3 or any(a.type != u32 for a in scalars):
                self.fail(s, f"{s.op} needs (u32, u32, u32) -> u32")
        elif s.op in ("load", "store", "atomic"):
            arr = s.args[0]
            if not isinstance(arr, Array):
                self.fail(s, f"{s.op} needs an array first")
            n_vals = {"load": 0, "store": 1}.get(s.op, 2 if s.attrs.get("kind") == "cas" else 1)
            idx = s.args[1 : len(s.args) - n_vals]
            if len(idx) != arr.ndim or any(not i.type.is_int for i in idx):
                self.fail(s, f"{s.op} of @{arr.name} needs {arr.ndim} integer indices")
            vals = s.args[len(s.args) - n_vals :]
            if any(v.type != arr.dtype for v in vals):
                self.fail(s, f"{s.op} value type differs from @{arr.name}'s {arr.dtype}")
            if s.op != "store" and dst_t != arr.dtype:
                self.fail(s, f"{s.op} result must be {arr.dtype}")
        if rule == "special":
            self.signature(s)

    def signature(self, s: Instr) -> None:
        """Check a special op's operands and result against ``ops.SIGNATURES``."""
        declared = SIGNATURES.get(s.op)
        if declared is None:
            self.fail(s, f"{s.op} has no operand signature in kaio.ir.ops.SIGNATURES")
        kinds, result = declared
        dst_t = s.dst.type if s.dst is not None else None
        args, array, first = list(s.args), None, None
        want = kinds.split()
        for n, kind in enumerate(want):
            optional = kind.endswith("?")
            kind = kind.rstrip("?")
            if kind == "idx":
                count = array.ndim if array is not None else -1
                taken, args = args[:count], args[count:]
                if count < 0 or len(taken) != count or not all(_is_int(a) for a in taken):
                    self.fail(s, f"{s.op} needs {count} integer indices ({kinds} -> {result})")
                continue
            if not args:
                if optional:
                    continue
                self.fail(s, f"{s.op} has too few operands ({kinds} -> {result})")
            a = args.pop(0)
            if not _kind_ok(kind, a, dst_t, array):
                self.fail(s, f"{s.op} operand {n} is not {kind} ({kinds} -> {result})")
            if isinstance(a, Array):
                array = a
                first = first or a
        if args:
            self.fail(s, f"{s.op} has too many operands ({kinds} -> {result})")
        expected = {"none": None, "T": dst_t, "elem": first.dtype if first else None}.get(
            result, SCALAR_BY_NAME.get(result)
        )
        if dst_t != expected or (result == "T" and dst_t is None):
            self.fail(s, f"{s.op} gives {result}, not {dst_t}")

    def block(self, stmts, targets: dict):
        for s in stmts:
            if isinstance(s, Instr):
                self.instr(s)
            elif isinstance(s, nodes.If):
                self.operand(s, s.cond)
                if s.cond.type != bool_:
                    self.fail(s, "if condition must be bool_")
                self.block(s.then, targets)
                self.block(s.orelse, targets)
            elif isinstance(s, nodes.Loop):
                inner = {**targets, s.id: "loop"}
                self.block(s.body, inner)
                self.block(s.step, targets)
            elif isinstance(s, nodes.StaticFor):
                self.block(s.body, {**targets, s.id: "loop"})
            elif isinstance(s, nodes.Region):
                self.block(s.body, {**targets, s.id: "region"})
            elif isinstance(s, nodes.Break):
                if s.target not in targets:
                    self.fail(s, f"break to {s.target}, which does not enclose it")
            elif isinstance(s, nodes.Continue):
                if targets.get(s.target) != "loop":
                    self.fail(s, f"continue to {s.target}, which is not an enclosing loop")
            elif not isinstance(s, nodes.Return):
                self.fail(s, f"unknown statement {s!r}")


SCALAR_BY_NAME = {**SCALAR_TYPES, **PACKED_TYPES}


def _is_int(v) -> bool:
    return isinstance(v, Var | Const) and v.type.is_int


def _kind_ok(kind: str, a, dst_t, array) -> bool:
    """Whether operand ``a`` is of signature kind ``kind`` (see ``ops.SIGNATURES``)."""
    if kind == "A":
        return isinstance(a, Array)
    if kind == "F":
        return isinstance(a, Frag)
    if not isinstance(a, Var | Const):
        return False
    if kind == "S":
        return True
    if kind == "I":
        return a.type.is_int
    if kind == "T":
        return a.type == dst_t
    if kind == "E":
        return array is not None and a.type == array.dtype
    return a.type == SCALAR_BY_NAME[kind]


def _all(stmts):
    from kaio.ir.nodes import walk

    return walk(stmts)


def verify(fn: Function) -> None:
    """Raise ``ValueError`` if ``fn`` breaks an IR invariant."""
    _Verifier(fn).block(fn.body, {})
