"""Python AST to typed IR: one ``ast.NodeVisitor``-style lowering with source-carrying errors.

Values flowing through the lowering are IR values (``Var``, ``Const``), ``Array``s, or ``Py``
(a compile-time Python object: a literal, a constexpr, a module constant, a type, a builtin, a
tuple). Arithmetic on two ``Py`` numbers happens at compile time, so constexpr expressions
fold before any IR exists.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import inspect
import math
import operator
import types as pytypes
import warnings
from dataclasses import dataclass, field

import numpy as np

import kaio
from kaio import lang, lang_fp8
from kaio import types as T
from kaio.errors import CompileError, UnsignedComparisonWarning
from kaio.frontend import definite
from kaio.frontend.resolve import MISSING, lookup_global, parse
from kaio.frontend.resolve import signature as resolve_signature
from kaio.ir import nodes
from kaio.ir.builder import Builder, const_convert
from kaio.ir.nodes import Array, Const, Frag, Function, Instr, Param, SourceLoc, Var, fresh_id
from kaio.ir.ops import FASTMATH, OPS
from kaio.types import ArrayType, ScalarType

UNROLL_LIMIT = 8  # runtime range() loops with constant bounds and at most this many trips unroll
STATIC_RANGE_LIMIT = 16384  # kaio.static_range copies its body at most this many times
CONST_BITS_LIMIT = 4096  # compile-time ints from ** and << stay below this many bits


@dataclass(frozen=True)
class Py:
    """A compile-time Python value."""

    value: object


@dataclass
class LoopTarget:
    """Where ``break`` and ``continue`` go in the innermost loop."""

    break_id: int
    continue_id: int
    continue_is_break: bool  # unrolled copies: continue leaves the copy's Region


@dataclass
class Scope:
    """Names of one function body being lowered (a kernel, or one inlined device function)."""

    pyfunc: object
    filename: str
    names: dict = field(default_factory=dict)
    multi_assigned: frozenset = frozenset()
    readonly: set = field(default_factory=set)
    loops: list = field(default_factory=list)
    region_id: int | None = None  # device functions: `return` leaves this Region
    result: Var | tuple | None = None  # a tuple of Vars for a device function returning one
    result_type: ScalarType | tuple | None = None
    unbound: dict = field(default_factory=dict)  # name -> (construct, line): bound on some paths
    loop_only: frozenset = frozenset()  # names assigned only as for-loop targets


_PY_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_PY_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
# membership tests, between compile-time values only (a constexpr in a module's tuple)
_PY_MEMBERSHIP = {ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_IR_CMP = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_IR_ARITH = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul"}
_IR_BITS = {ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor"}
_OP_SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.MatMult: "@",
}
_UNSUPPORTED_STMTS = {
    ast.FunctionDef: "nested functions (closures) are not supported in kernels; define a "
    "module-level @kaio.gpu_func instead",
    ast.AsyncFunctionDef: "async functions are not supported in kernels",
    ast.ClassDef: "classes cannot be defined in kernels",
    ast.Try: "try/except is not supported in kernels",
    ast.With: "'with' is not supported in kernels",
    ast.AsyncWith: "'with' is not supported in kernels",
    ast.Raise: "'raise' is not supported in kernels; use an early 'return'",
    ast.Import: "imports are not allowed in kernels; import at module level",
    ast.ImportFrom: "imports are not allowed in kernels; import at module level",
    ast.Global: "'global' is not supported in kernels",
    ast.Nonlocal: "'nonlocal' is not supported in kernels",
    ast.Delete: "'del' is not supported in kernels",
    ast.Assert: "'assert' is not supported in kernels; use 'if ...: return'",
    ast.Match: "'match' is not supported in kernels; use if/elif",
    ast.AsyncFor: "'async for' is not supported in kernels",
}
_UNSUPPORTED_EXPRS = {
    ast.Lambda: "lambda is not supported in kernels; define a @kaio.gpu_func",
    ast.ListComp: "list comprehensions are not supported in kernels",
    ast.SetComp: "set comprehensions are not supported in kernels",
    ast.DictComp: "dict comprehensions are not supported in kernels",
    ast.GeneratorExp: "generator expressions are not supported in kernels",
    ast.Yield: "generators (yield) are not supported in kernels",
    ast.YieldFrom: "generators (yield) are not supported in kernels",
    ast.Await: "await is not supported in kernels",
    ast.List: "lists are not supported in kernels; use kaio.local(dtype, shape) for arrays",
    ast.Dict: "dicts are not supported in kernels",
    ast.Set: "sets are not supported in kernels",
    ast.JoinedStr: "strings are not supported in kernels",
    ast.Starred: "*args unpacking is not supported in kernels",
    ast.NamedExpr: "the walrus operator := is not supported in kernels",
    ast.Slice: "slices are not supported in kernels; index single elements",
}


def _assigned_names(stmts: list) -> dict[str, int]:
    """How many assignments each name gets in a function body (loop targets count twice)."""
    counts: dict[str, int] = {}

    def add(target, n=1):
        if isinstance(target, ast.Name):
            counts[target.id] = counts.get(target.id, 0) + n
        elif isinstance(target, ast.Tuple):
            for t in target.elts:
                add(t, n)

    for node in ast.walk(ast.Module(body=stmts, type_ignores=[])):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                add(t)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            add(node.target, 2 if isinstance(node, ast.AugAssign) else 1)
        elif isinstance(node, ast.For):
            add(node.target, 2)
    return counts


def _loop_only_names(stmts: list) -> frozenset:
    """Names a function body assigns only as for-loop targets: after a ``kaio.static_range``
    loop such a name can stay a compile-time constant (its last value)."""
    loops = _assigned_names([n for n in ast.walk(ast.Module(stmts, [])) if isinstance(n, ast.For)])
    return frozenset(n for n, c in _assigned_names(stmts).items() if c == loops.get(n))


def _breaks_out(stmts: list) -> bool:
    """Whether a loop body has a ``break`` of its own (not one of a nested loop)."""
    for s in stmts:
        if isinstance(s, ast.Break):
            return True
        if isinstance(s, ast.For | ast.While | ast.FunctionDef | ast.ClassDef):
            continue
        for field_name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(s, field_name, None)
            if isinstance(block, list) and _breaks_out(block):
                return True
    return False


@functools.cache
def _function_assignments(pyfunc) -> pytypes.MappingProxyType:
    """``_assigned_names`` of a kernel's or device function's (cached) parsed body, computed
    once per function rather than at each specialization or inlining (read-only: it is
    shared)."""
    return pytypes.MappingProxyType(_assigned_names(parse(pyfunc).tree.body))


@functools.cache
def _multi_assigned(pyfunc) -> frozenset:
    """The names a kernel or device function assigns more than once."""
    return frozenset(n for n, c in _function_assignments(pyfunc).items() if c > 1)


@functools.cache
def _function_loop_only(pyfunc) -> frozenset:
    """``_loop_only_names`` of a kernel or device function, computed once per function."""
    return _loop_only_names(parse(pyfunc).tree.body)


@functools.cache
def _python_signature(pyfunc) -> inspect.Signature:
    """``inspect.signature`` of a device function, computed once (it binds each call)."""
    return inspect.signature(pyfunc)


class Lowerer:
    """Lowers one kernel specialization to an IR ``Function``; also the ``ctx`` of builtins."""

    def __init__(self, kernel, constexprs: dict, layouts: tuple):
        self.meta: dict = {}  # kernel-level facts builtins record (launch bounds)
        self.kernel = kernel
        self.constexprs = constexprs
        self.layouts = layouts
        self.b = Builder()
        if getattr(kernel, "fastmath", False):
            self.b.substitute = FASTMATH  # approximate f32 math (docs/dsl-reference.md)
            self.meta["fastmath"] = True
        self.arrays: list[Array] = []
        self.params: list[Param] = []
        self.inline_stack: list = []
        self._globals: dict = {}  # (function, name) -> Py: module globals read while lowering
        self._locs: dict = {}  # AST statement -> its SourceLoc
        self.scope: Scope | None = None
        self.node: ast.AST | None = None

    # ------------------------------------------------------------------ errors
    def error(self, message: str, node=None):
        """Raise ``CompileError`` at ``node`` (or the statement being lowered)."""
        node = node or self.node
        filename = self.scope.filename if self.scope else ""
        lineno = getattr(node, "lineno", 0)
        col = getattr(node, "col_offset", 0)
        raise CompileError(message, filename, lineno, col)

    # ------------------------------------------------------------------ entry
    def lower_kernel(self) -> Function:
        """Lower the kernel's body to a ``Function``."""
        pyfunc = self.kernel.pyfunc
        parsed = parse(pyfunc)
        tree = parsed.tree
        self.scope = Scope(pyfunc, parsed.filename)
        self._check_signature(tree)
        self.scope.multi_assigned = _multi_assigned(pyfunc)
        self.scope.loop_only = _function_loop_only(pyfunc)
        layouts = iter(self.layouts)
        annotations = self.kernel.annotations(self.constexprs)
        for arg in tree.args.args:
            name = arg.arg
            ann = annotations[name]
            self.node = arg
            if name in self.kernel.constexpr_names:
                self.scope.names[name] = Py(_python_scalar(self.constexprs[name]))
            elif isinstance(ann, ArrayType):
                self.scope.names[name] = self._array_param(name, ann, next(layouts, "C"))
            elif isinstance(ann, ScalarType):
                var = Var(name, ann)
                self.params.append(Param(name, var, "scalar", name))
                self.scope.names[name] = var
                self.scope.readonly.add(name)
            elif isinstance(ann, T.TensorMapType):
                var = Var(name, T.u64)  # stands for the map's address (kaio.tma_load_2d)
                self.params.append(Param(name, var, "tensormap", name))
                self.scope.names[name] = var
                self.scope.readonly.add(name)
            else:
                self.error(
                    f"parameter {name!r} has no type annotation; write e.g. '{name}: kaio.f32' "
                    f"or '{name}: kaio.f32[:]'"
                    if ann is inspect.Parameter.empty
                    else f"parameter {name!r} needs a kaio type annotation (f32, u32, f16[:], "
                    f"kaio.constexpr, ...), got {ann!r}",
                    arg,
                )
        if tree.returns is not None:
            self.error("kernels return nothing; remove the return annotation", tree.returns)
        self.lower_block(tree.body)
        block = self.kernel.block_size
        if isinstance(block, int):
            block = (block,)
        return Function(
            name=pyfunc.__name__,
            params=self.params,
            arrays=self.arrays,
            body=self.b.body,
            block_size=tuple(block) if block else None,
            filename=parsed.filename,
            meta={"constexprs": dict(self.constexprs), "layouts": self.layouts, **self.meta},
        )

    def _check_signature(self, tree: ast.FunctionDef):
        a = tree.args
        for what, bad in (
            ("*args", a.vararg),
            ("**kwargs", a.kwarg),
            ("keyword-only parameters", a.kwonlyargs),
            ("positional-only parameters", a.posonlyargs),
            ("default values", a.defaults or a.kw_defaults),
        ):
            if bad:
                self.error(f"kernel parameters cannot use {what}", tree)
        if tree.decorator_list and len(tree.decorator_list) > 1:
            self.error("a kernel takes only the @kaio.gpu_kernel decorator", tree.decorator_list[0])

    def _array_param(self, name: str, ann: ArrayType, layout: str) -> Array:
        ptr = Var(name, T.u64)
        shape = tuple(Var(f"{name}_shape{d}", T.i64) for d in range(ann.ndim))
        strides = (
            tuple(Var(f"{name}_stride{d}", T.i64) for d in range(ann.ndim))
            if layout == "A"
            else None
        )
        arr = Array(name, ann.dtype, "global", shape, strides, ptr)
        self.arrays.append(arr)
        self.params.append(Param(name, ptr, "ptr", name, array=arr))
        for d, v in enumerate(shape):
            self.params.append(Param(v.name, v, "shape", name, d, arr))
        for d, v in enumerate(strides or ()):
            self.params.append(Param(v.name, v, "stride", name, d, arr))
        self.scope.readonly.add(name)
        return arr

    # ------------------------------------------------------------------ statements
    def lower_block(self, stmts: list) -> None:
        """Lower a list of statements into the current IR block."""
        for stmt in stmts:
            self.node = stmt
            self.b.loc = self._loc(stmt)
            method = _STMT_METHODS.get(type(stmt))
            if method is None:
                msg = _UNSUPPORTED_STMTS.get(
                    type(stmt), f"{type(stmt).__name__} statements are not supported in kernels"
                )
                self.error(msg, stmt)
            try:
                method(self, stmt)
            except RecursionError:
                self.error(
                    "this statement nests too deeply to compile (Python's recursion limit); "
                    "split it into several assignments or fewer nested blocks",
                    stmt,
                )

    def _loc(self, stmt) -> SourceLoc:
        """The source location of a statement, made once per statement (an unrolled loop's
        body and an inlined function are lowered again and again)."""
        loc = self._locs.get(stmt)
        if loc is None:
            loc = self._locs[stmt] = SourceLoc(self.scope.filename, stmt.lineno, stmt.col_offset)
        return loc

    def stmt_Pass(self, node):
        pass

    def stmt_Expr(self, node):
        if isinstance(node.value, ast.Constant):  # docstrings and `...`
            return
        if not isinstance(node.value, ast.Call):
            self.expr(node.value)  # reports unsupported expressions (yield, lambda...) first
            self.error("this expression has no effect; did you mean an assignment?", node)
        self.expr(node.value)

    def stmt_Assign(self, node):
        value = self.expr(node.value)
        if len(node.targets) > 1 and isinstance(value, Var):
            value = self._snapshot(value)
        for target in node.targets:
            self.assign(target, value, node)

    def stmt_AnnAssign(self, node):
        if not isinstance(node.target, ast.Name):
            self.error("annotated assignment needs a plain name", node.target)
        t = self.static(node.annotation)
        if not isinstance(t, ScalarType):
            self.error(
                f"variable annotations must be scalar kaio types, got {t!r}", node.annotation
            )
        name = node.target.id
        var = self.scope.names.get(name)
        if var is None:
            var = self.b.var(t, name + "_")
            self.scope.names[name] = var
        elif not isinstance(var, Var) or var.type != t:
            self.error(f"{name!r} was already defined with another type", node.target)
        if node.value is not None:
            self.b.assign(var, self.convert(self.value(self.expr(node.value), node.value, t), t))

    def stmt_AugAssign(self, node):
        target = node.target
        if isinstance(target, ast.Subscript):
            arr, idx = self._subscript_target(target)
            old = self.b.emit("load", arr.dtype, (arr, *idx))
            new = self.binop(node.op, old, self.expr(node.value), node)
            self.b.emit("store", None, (arr, *idx, self.store_value(new, arr.dtype, node)))
            return
        if not isinstance(target, ast.Name):
            self.error("augmented assignment needs a name or an array element", target)
        current = self.load_name(target.id, target)
        self.assign(target, self.binop(node.op, current, self.expr(node.value), node), node)

    def _snapshot(self, v):
        if isinstance(v, Var):
            copy = self.b.var(v.type)
            self.b.assign(copy, v)
            return copy
        return v

    def assign(self, target, value, node):
        """Bind or store ``value`` to an assignment target."""
        if isinstance(target, _SEQUENCE_TARGETS):
            if not isinstance(value, Py) or not isinstance(value.value, tuple):
                self.error("tuple unpacking needs a tuple on the right-hand side", node)
            items = value.value
            if len(items) != len(target.elts):
                self.error(f"cannot unpack {len(items)} values into {len(target.elts)} names", node)
            items = [self._snapshot(v) for v in items]
            for t, v in zip(target.elts, items, strict=True):
                self.assign(t, v, node)
            return
        if isinstance(target, ast.Subscript):
            arr, idx = self._subscript_target(target)
            self.b.emit("store", None, (arr, *idx, self.store_value(value, arr.dtype, node)))
            return
        if isinstance(target, ast.Attribute):
            self.error("cannot assign to an attribute in a kernel", target)
        if not isinstance(target, ast.Name):
            self.error("unsupported assignment target", target)
        name = target.id
        if name in self.scope.readonly:
            self.error(
                f"cannot assign to parameter {name!r}: parameters are read-only in kernels; "
                f"copy it first ({name}2 = {name})",
                target,
            )
        current = self.scope.names.get(name)
        if isinstance(current, Var):
            self.b.assign(current, self._coerce_assignment(name, current.type, value, target))
            return
        if isinstance(current, _COMPILE_TIME) and name in self.scope.multi_assigned:
            self.error(f"{name!r} is assigned more than once but is not a scalar variable", target)
        if isinstance(value, _ARRAYS):  # a name for an array or a part of a local one
            self.scope.names[name] = value
        elif isinstance(value, Py) and name not in self.scope.multi_assigned:
            self.scope.names[name] = value  # a compile-time constant
        else:
            v = self.value(value, node)
            var = self.b.var(v.type, name + "_")
            self.b.assign(var, v)
            self.scope.names[name] = var

    def _coerce_assignment(self, name, t: ScalarType, value, node, fix: str = ""):
        """``value`` converted to ``t`` for an assignment (or a device function's argument:
        the same rule): only conversions that lose nothing are implicit."""
        v = self.value(value, node, t)
        if v.type != t:
            if T.promote(t, v.type) != t or (
                t.is_int
                and v.type.is_int
                and t.is_signed != v.type.is_signed
                and v.type.bits == t.bits
            ):
                if not (isinstance(value, Py) and isinstance(value.value, int | bool)):
                    fix = fix or f"give {name!r} that type where it is first assigned"
                    self.error(
                        f"{name!r} is {t} but this value is {v.type}; convert explicitly "
                        f"({t.name}(...)) or {fix}",
                        node,
                    )
            v = self.convert(v, t)
        return v

    def store_value(self, value, t: ScalarType, node):
        """A value converted to an array's element type for a store (implicit, like C)."""
        v = self.value(value, node, t)
        if v.type.is_bool != t.is_bool and t.is_bool:
            return self.truth(v, node)
        return self.convert(v, t)

    def stmt_If(self, node):
        cond = self.truth(self.expr(node.test), node.test)
        if isinstance(cond, Const):
            self.lower_block(node.body if cond.value else node.orelse)
            return
        with self.b.block() as then, self._some_paths("if", node):
            self.lower_block(node.body)
        with self.b.block() as orelse, self._some_paths("if", node):
            self.lower_block(node.orelse)
        self.b.loc = self._loc(node)
        self.b.append(nodes.If(cond, then, orelse))

    @contextlib.contextmanager
    def _some_paths(self, construct: str, node):
        """Names first bound to compile-time values (constants, arrays, tuples) inside a
        run-time branch or loop body are unbound after it: a thread that skipped it would read
        them (variables are checked on the IR: kaio/frontend/definite.py)."""
        before = set(self.scope.names)
        yield
        for name in set(self.scope.names) - before:
            if not isinstance(self.scope.names[name], Var):
                del self.scope.names[name]
                self.scope.unbound[name] = (construct, node.lineno)

    def stmt_While(self, node):
        if node.orelse:
            self.error("while/else is not supported in kernels", node)
        loop = nodes.Loop(fresh_id(), [], [])
        loc = self.b.loc
        with self.b.block() as body:
            self.b.loc = loc
            cond = self.truth(self.expr(node.test), node.test)
            self._break_unless(cond, loop.id)
            with self._some_paths("loop", node):
                self._loop_body(node.body, LoopTarget(loop.id, loop.id, False))
        loop.body = body
        self.b.loc = loc
        self.b.append(loop)

    def _break_unless(self, cond, loop_id: int):
        if isinstance(cond, Const):
            if not cond.value:
                self.b.append(nodes.Break(loop_id))
            return
        notc = self.b.emit("not", T.bool_, (cond,))
        self.b.append(nodes.If(notc, [nodes.Break(loop_id, loc=self.b.loc)], []))

    def _loop_body(self, stmts, target: LoopTarget):
        self.scope.loops.append(target)
        try:
            self.lower_block(stmts)
        finally:
            self.scope.loops.pop()

    def stmt_For(self, node):
        if node.orelse:
            self.error("for/else is not supported in kernels", node)
        it = node.iter
        if not isinstance(it, ast.Call):
            self.error("kernels loop over range(...) or kaio.static_range(...) only", it)
        fn = self.static(it.func)
        if it.keywords:
            self.error("range() takes no keyword arguments", it)
        args = [self.expr(a) for a in it.args]
        if not 1 <= len(args) <= 3:
            self.error("range() takes 1 to 3 arguments", it)
        if fn is lang.static_range:
            bounds = [self.const_value(a, it, "kaio.static_range bounds") for a in args]
            if not all(isinstance(v, int) for v in bounds):
                self.error("kaio.static_range() needs compile-time int bounds", it)
            if len(bounds) == 3 and bounds[2] == 0:
                self.error("kaio.static_range() step must not be zero", it)
            trips = range(*bounds)
            if trips[STATIC_RANGE_LIMIT:]:  # (no len(): it overflows for huge ranges)
                self.error(
                    f"kaio.static_range() unrolls at most {STATIC_RANGE_LIMIT} iterations; "
                    "use range() for a runtime loop",
                    it,
                )
            self._static_loop(node, list(trips))
            return
        if fn is not builtins.range:
            self.error("kernels loop over range(...) or kaio.static_range(...) only", it)
        if len(args) == 1:
            args = [Py(0), args[0]]
        start, stop = args[0], args[1]
        step = args[2] if len(args) == 3 else Py(1)
        if not isinstance(step, Py) or not isinstance(step.value, int) or step.value == 0:
            self.error("range() step must be a non-zero compile-time int", it)
        if all(isinstance(v, Py) and isinstance(v.value, int) for v in (start, stop)):
            trips = range(start.value, stop.value, step.value)
            if not trips[UNROLL_LIMIT:] and isinstance(node.target, ast.Name):
                self._runtime_static_for(node, list(trips))
                return
        self._range_loop(node, start, stop, step.value)

    def _runtime_static_for(self, node, values):
        """A range() loop with few constant trips: a StaticFor the unroll pass expands."""
        t = T.i32 if all(-(2**31) <= v < 2**31 for v in values) else T.i64
        var = self._loop_var(node.target, t)
        sf = nodes.StaticFor(fresh_id(), var, tuple(values), [])
        loc = self.b.loc
        with self.b.block() as body:
            self._loop_body(node.body, LoopTarget(sf.id, sf.id, False))
        sf.body = body
        self.b.loc = loc
        self.b.append(sf)

    def _loop_var(self, target, t: ScalarType) -> Var:
        if not isinstance(target, ast.Name):
            self.error("the loop variable must be a single name", target)
        name = target.id
        if name in self.scope.readonly:
            self.error(f"cannot use parameter {name!r} as a loop variable", target)
        current = self.scope.names.get(name)
        if isinstance(current, Var):
            if current.type != t:
                self.error(f"loop variable {name!r} was {current.type} before, now {t}", target)
            return current
        var = self.b.var(t, name + "_")
        self.scope.names[name] = var
        return var

    def _range_loop(self, node, start, stop, step: int):
        start_v, stop_v = self.unify(start, stop, node.iter)
        t = start_v.type
        if not t.is_int:
            self.error(f"range() needs integer bounds, got {t}", node.iter)
        if step < 0 and t.kind == "uint":
            self.error(
                f"range() with a negative step over unsigned {t} bounds would wrap; convert the "
                "bounds to a signed type, e.g. range(i32(n) - 1, -1, -1)",
                node.iter,
            )
        step_c = const_convert(step, t)
        var = self._loop_var(node.target, t)
        counter = self.b.var(t, "i")
        self.b.assign(counter, start_v)
        if self._is_user_variable(stop_v):
            stop_v = self._snapshot(stop_v)  # range() evaluates its bounds once
        loop = nodes.Loop(fresh_id(), [], [])
        loc = self.b.loc
        with self.b.block() as body:
            cond = self.b.emit("lt" if step > 0 else "gt", T.bool_, (counter, stop_v))
            self._break_unless(cond, loop.id)
            self.b.assign(var, counter)
            with self._some_paths("loop", node):
                self._loop_body(node.body, LoopTarget(loop.id, loop.id, False))
        with self.b.block() as stepblock:
            self.b.loc = loc
            self.b.append(_instr_add(counter, step_c, loc))
        loop.body, loop.step = body, stepblock
        self.b.loc = loc
        self.b.append(loop)

    def _is_user_variable(self, v) -> bool:
        return isinstance(v, Var) and any(
            self.scope.names.get(n) is v for n in self.scope.multi_assigned
        )

    def _static_loop(self, node, values):
        """kaio.static_range: the body is lowered once per value, the variable a constant.
        After the loop the name holds its last value, as in Python: the value of the
        iteration a ``break`` left, or else the last one. It stays a compile-time constant
        when no ``break`` can leave the loop and the name is assigned nowhere else; otherwise
        it is a variable. An empty range leaves the name as it was (unbound if it was)."""
        if not isinstance(node.target, ast.Name):
            self.error("the loop variable must be a single name", node.target)
        name = node.target.id
        if name in self.scope.readonly:
            self.error(f"cannot use parameter {name!r} as a loop variable", node.target)
        outer = nodes.Region(fresh_id(), [])
        loc = self.b.loc
        saved = self.scope.names.get(name, MISSING)
        breaks = _breaks_out(node.body)
        after = None  # the variable that holds the name's value after the loop
        if values and (breaks or isinstance(saved, Var) or name not in self.scope.loop_only):
            t = T.i32 if all(-(2**31) <= v < 2**31 for v in values) else T.i64
            after = saved if isinstance(saved, Var) else self.b.var(t, name + "_")
        with self.b.block() as copies:
            for v in values:
                self.scope.names[name] = Py(v)
                iteration = nodes.Region(fresh_id(), [])
                with self.b.block() as body:
                    if after is not None and breaks:
                        self.b.assign(after, self._coerce_assignment(name, after.type, Py(v), node))
                    self._loop_body(node.body, LoopTarget(outer.id, iteration.id, True))
                iteration.body = body
                self.b.loc = loc
                self.b.append(iteration)
        outer.body = copies
        self.b.loc = loc
        self.b.append(outer)
        if after is not None:
            if not breaks:
                self.b.assign(
                    after, self._coerce_assignment(name, after.type, Py(values[-1]), node)
                )
            self.scope.names[name] = after
        elif values:
            self.scope.names[name] = Py(values[-1])
        elif saved is not MISSING:
            self.scope.names[name] = saved
        else:
            self.scope.names.pop(name, None)
            self.scope.unbound[name] = ("empty static_range", node.lineno)

    def stmt_Break(self, node):
        if not self.scope.loops:
            self.error("'break' outside a loop", node)
        self.b.append(nodes.Break(self.scope.loops[-1].break_id))

    def stmt_Continue(self, node):
        if not self.scope.loops:
            self.error("'continue' outside a loop", node)
        target = self.scope.loops[-1]
        if target.continue_is_break:
            self.b.append(nodes.Break(target.continue_id))
        else:
            self.b.append(nodes.Continue(target.continue_id))

    def stmt_Return(self, node):
        scope = self.scope
        if scope.region_id is None:
            if node.value is not None:
                self.error("kernels cannot return a value; write results to an array", node.value)
            self.b.append(nodes.Return())
            return
        if node.value is None:
            if scope.result_type is not None:
                self.error("this device function returns a value on other paths", node)
        else:
            self._set_result(scope, self.expr(node.value), node.value)
        self.b.append(nodes.Break(scope.region_id))

    def _set_result(self, scope: Scope, value, node) -> None:
        """Assign a device function's return value (a scalar or a tuple of scalars) to its
        result variables, made by the first ``return``."""
        want = scope.result_type
        if isinstance(value, Py) and isinstance(value.value, tuple):
            items = value.value
            if want is not None and (not isinstance(want, tuple) or len(want) != len(items)):
                self.error(
                    f"this returns {len(items)} values; the function returns "
                    f"{_type_text(want)} elsewhere or in its annotation",
                    node,
                )
            hints = want or (None,) * len(items)
            values = [self.value(v, node, h) for v, h in zip(items, hints, strict=True)]
            if scope.result is None:
                types = want or tuple(v.type for v in values)
                scope.result = tuple(self.b.var(t, f"ret{i}") for i, t in enumerate(types))
                scope.result_type = types
            targets = scope.result
        else:
            if isinstance(want, tuple):
                self.error(f"this function returns a tuple {_type_text(want)} elsewhere", node)
            values = [self.value(value, node, want)]
            if scope.result is None:
                t = want or values[0].type
                scope.result = self.b.var(t, "ret")
                scope.result_type = t
            targets = (scope.result,)
        for target, v in zip(targets, values, strict=True):
            self.b.assign(target, self._coerce_assignment("the return value", target.type, v, node))

    # ------------------------------------------------------------------ expressions
    def expr(self, node):
        """Lower an expression; returns Var, Const, Array or Py."""
        method = _EXPR_METHODS.get(type(node))
        if method is None:
            msg = _UNSUPPORTED_EXPRS.get(
                type(node), f"{type(node).__name__} is not supported in kernels"
            )
            self.error(msg, node)
        return method(self, node)

    def static(self, node):
        """Evaluate an expression that must be known at compile time (annotations, types)."""
        v = self.expr(node)
        if not isinstance(v, Py):
            self.error("this must be a compile-time value", node)
        return v.value

    def expr_Constant(self, node):
        if isinstance(node.value, _PY_CONSTANTS) or node.value is None:
            return Py(node.value)  # strings only compare with constexprs at compile time
        self.error(f"{type(node.value).__name__} constants are not supported in kernels", node)

    def expr_Name(self, node):
        return self.load_name(node.id, node)

    def load_name(self, name: str, node):
        """The value a name refers to: a local binding, then the function's globals."""
        bound = self.scope.names.get(name, MISSING)
        if bound is not MISSING:
            return bound
        if name in self.scope.unbound:
            construct, line = self.scope.unbound[name]
            if construct == "empty static_range":
                self.error(
                    f"{name!r} is not assigned: it is the variable of the kaio.static_range at "
                    f"line {line}, whose range is empty, so the loop never assigns it (Python "
                    f"raises UnboundLocalError here); assign {name!r} before the loop",
                    node,
                )
            self.error(definite.unassigned_message(name, None, construct, line), node)
        key = (self.scope.pyfunc, name)
        found = self._globals.get(key)
        if found is not None:
            return found
        try:
            value = lookup_global(self.scope.pyfunc, name)
        except LookupError:
            self.error(
                f"{name!r} is a closure variable; kernels can read module-level constants and "
                "constexpr parameters, not variables of an enclosing function",
                node,
            )
        if value is MISSING:
            self.error(f"name {name!r} is not defined", node)
        found = self._globals[key] = Py(value)
        return found

    def expr_Tuple(self, node):
        return Py(tuple(self.expr(e) for e in node.elts))

    def expr_Attribute(self, node):
        base = self.expr(node.value)
        if isinstance(base, Array):
            if node.attr == "shape":
                return Py(tuple(Py(d.value) if isinstance(d, Const) else d for d in base.shape))
            if node.attr == "ndim":
                return Py(base.ndim)
            self.error(f"arrays have .shape and .ndim in kernels, not .{node.attr}", node)
        if isinstance(base, Py):
            try:
                return Py(getattr(base.value, node.attr))
            except AttributeError:
                self.error(f"{base.value!r} has no attribute {node.attr!r}", node)
        self.error(f"scalar values have no attribute {node.attr!r}", node)

    def expr_Subscript(self, node):
        base = self.expr(node.value)
        if isinstance(base, Array):
            index = self.expr(node.slice)
            part = self._fragment_of(base, index, node.slice)
            if part is not None:
                return part
            idx = self.indices(base, index, node.slice)
            return self.b.emit("load", base.dtype, (base, *idx))
        if isinstance(base, Py) and isinstance(base.value, tuple):
            i = self.const_value(self.expr(node.slice), node.slice, "a tuple index")
            if not isinstance(i, int):
                self.error("tuples are indexed by compile-time ints", node.slice)
            try:
                return base.value[i]
            except IndexError:
                self.error(f"tuple index {i} out of range", node.slice)
        if isinstance(base, Py) and isinstance(base.value, ScalarType | T.ArrayType):
            self.error("array types are only used as annotations", node)
        self.error("only arrays and tuples can be indexed", node)

    def _fragment_of(self, arr: Array, index, node) -> Frag | None:
        """``arr[i, ...]`` with fewer constant indices than ``arr`` has dimensions, on a local
        array: the run of elements it names (a fragment operand for builtins), else None."""
        items = index.value if isinstance(index, Py) and isinstance(index.value, tuple) else None
        items = (index,) if items is None else items
        if arr.space != "local" or len(items) >= arr.ndim:
            return None
        dims = [int(d.value) for d in arr.shape]
        start = 0
        for item, n in zip(items, dims, strict=False):
            i = self.const_value(item, node, "the index of a part of a local array")
            if not isinstance(i, int) or not 0 <= i < n:
                self.error(f"index {i!r} is out of bounds for dimension of size {n}", node)
            start = start * n + i
        size = math.prod(dims[len(items) :])
        return Frag(arr, start * size, size)

    def fragment(self, v, node, what: str) -> Frag:
        """A register-fragment argument of a builtin: a whole local array, or a part of one
        named by leading constant indices (``acc[i, j]`` of a 3-D ``acc``)."""
        if isinstance(v, Frag):
            return v
        if isinstance(v, Array) and v.space == "local":
            return Frag(v, 0, v.static_size)
        self.error(
            f"{what} needs a kaio.local array (or a part of one, like acc[i]) to hold its "
            "registers",
            node,
        )

    def _subscript_target(self, node):
        arr = self.expr(node.value)
        if not isinstance(arr, Array):
            self.error("only array elements can be assigned through [...]", node)
        return arr, self.indices(arr, self.expr(node.slice), node.slice)

    def indices(self, arr: Array, index, node) -> list:
        """Index values for ``arr``: one integer per dimension."""
        items = (
            index.value if isinstance(index, Py) and isinstance(index.value, tuple) else (index,)
        )
        if len(items) != arr.ndim:
            self.error(
                f"{arr.name!r} has {arr.ndim} dimension{'s' * (arr.ndim != 1)}, indexed with "
                f"{len(items)} index{'es' * (len(items) != 1)}",
                node,
            )
        out = []
        for item in items:
            if isinstance(item, Py):
                if isinstance(item.value, Py):
                    item = item.value
                if not isinstance(item.value, int) or isinstance(item.value, bool):
                    self.error(f"array indices must be integers, got {item.value!r}", node)
                if item.value < 0:
                    self.error(
                        "negative indices are not supported in kernels (no wrap-around)", node
                    )
                if item.value >= 2**63:
                    self.error(f"the index {item.value} does not fit in i64", node)
                out.append(Const(item.value, T.i32 if item.value < 2**31 else T.i64))
                continue
            if isinstance(item, Array):
                self.error("an array cannot be used as an index", node)
            if not item.type.is_int:
                self.error(f"array indices must be integers, got {item.type}", node)
            out.append(item)
        return out

    def expr_BinOp(self, node):
        # a left-leaning chain (a + b + c + ...) is lowered in a loop, not by recursion, so
        # its length is not limited by Python's recursion limit; the order is the same
        spine = []
        while isinstance(node, ast.BinOp):
            spine.append(node)
            node = node.left
        value = self.expr(node)
        for n in reversed(spine):
            value = self.binop(n.op, value, self.expr(n.right), n)
        return value

    def binop(self, op, left, right, node):
        """``left op right`` with compile-time folding of Python values and type promotion."""
        opt = type(op)
        if opt is ast.MatMult:
            self.error("'@' is not supported in kernels", node)
        if isinstance(left, Py) and isinstance(right, Py):
            return self._py_binop(op, left.value, right.value, node)
        if opt is ast.Pow:
            return self.power(left, right, node)
        if opt in (ast.LShift, ast.RShift):
            return self._shift(opt, left, right, node)
        a, b = self.unify(left, right, node)
        t = a.type
        sym = _OP_SYMBOL[opt]
        if t.is_packed:
            return lang.packed_operator(self, sym, a, b, node)
        if opt in _IR_BITS:
            if t.is_float:
                self.error(f"'{sym}' needs integers or bools, got {t}", node)
            return self.b.emit(_IR_BITS[opt], t, (a, b))
        if t.is_bool:
            self.error(f"'{sym}' on bools; convert to an integer type first (i32(x))", node)
        if opt in _IR_ARITH:
            return self.b.emit(_IR_ARITH[opt], t, (a, b))
        if opt is ast.Div:
            if t.is_int:
                self.error(
                    f"'/' on integers ({a.type}); use '//' for integer division, or convert "
                    "an operand to a float type (f32(x) / y)",
                    node,
                )
            return self.b.emit("div", t, (a, b))
        if opt is ast.FloorDiv:
            if t.is_int:
                return self.b.emit("floordiv", t, (a, b))
            return self._float_compute(
                t, lambda c, x, y: c.emit("floor", x.type, (c.emit("div", x.type, (x, y)),)), a, b
            )
        if opt is ast.Mod:
            if t.is_int:
                return self.b.emit("mod", t, (a, b))

            def fmod(c, x, y):
                q = c.emit("floor", x.type, (c.emit("div", x.type, (x, y)),))
                return c.emit("sub", x.type, (x, c.emit("mul", x.type, (q, y))))

            return self._float_compute(t, fmod, a, b)
        self.error(f"operator '{sym}' is not supported", node)

    def _float_compute(self, t, build, *vals):
        compute = T.f32 if t.bits < 32 else t
        return self.convert(build(self.b, *[self.convert(v, compute) for v in vals]), t)

    def _shift(self, opt, left, right, node):
        if isinstance(left, Py):
            rv = self.value(right, node)
            left = self.value(left, node, rv.type if rv.type.is_int else None)
        lv = self.value(left, node)
        if not lv.type.is_int:
            self.error(f"shifts need an integer left operand, got {lv.type}", node)
        amount = self.value(right, node, T.u32)
        if not amount.type.is_int:
            self.error(f"shift amounts must be integers, got {amount.type}", node)
        if amount.type.bits == 64:  # clamp before the u32 conversion truncates 2**32 to 0
            amount = self.convert(amount, T.u64)
            amount = self.b.emit("min", T.u64, (amount, Const(64, T.u64)))
        amount = self.convert(amount, T.u32)
        return self.b.emit("shl" if opt is ast.LShift else "shr", lv.type, (lv, amount))

    def _py_binop(self, op, a, b, node):
        opt = type(op)
        if not (isinstance(a, _PY_NUMBERS) and isinstance(b, _PY_NUMBERS)):
            self.error(f"cannot apply '{_OP_SYMBOL[opt]}' to {a!r} and {b!r}", node)
        if opt is ast.Div and isinstance(a, int) and isinstance(b, int):
            self.error("'/' on integers; use '//' for integer division", node)
        if opt in (ast.Pow, ast.LShift) and isinstance(a, int) and isinstance(b, int):
            grows = abs(a) > 1 and b > 0
            bits = b if opt is ast.LShift else b * abs(a).bit_length() if grows else 0
            if a and bits > CONST_BITS_LIMIT:
                self.error(
                    f"compile-time integer too large: '{_OP_SYMBOL[opt]}' would give about "
                    f"{bits} bits (at most {CONST_BITS_LIMIT})",
                    node,
                )
        try:
            return Py(_PY_BINOPS[opt](a, b))
        except ZeroDivisionError:
            self.error("division by zero in a compile-time expression", node)
        except (OverflowError, ValueError) as e:
            self.error(f"compile-time arithmetic failed: {e}", node)
        except TypeError:  # e.g. bitwise operators and shifts on floats
            self.error(f"cannot apply '{_OP_SYMBOL[opt]}' to {a!r} and {b!r}", node)

    def power(self, base, exponent, node):
        """``base ** exponent``: exact multiplication for small constant integer exponents,
        ``sqrt`` for 0.5, otherwise ``exp2(y * log2(x))``."""
        if isinstance(base, Py) and isinstance(exponent, Py):
            return self._py_binop(ast.Pow(), base.value, exponent.value, node)
        if (
            isinstance(exponent, Py)
            and isinstance(exponent.value, int)
            and 0 <= exponent.value <= 32
        ):
            x = self.value(base, node)
            if x.type.is_bool:
                self.error("'**' on a bool", node)
            result = None
            power = x
            n = exponent.value
            if n == 0:
                return const_convert(1, x.type)
            while n:
                if n & 1:
                    result = (
                        power if result is None else self.b.emit("mul", x.type, (result, power))
                    )
                n >>= 1
                if n:
                    power = self.b.emit("mul", x.type, (power, power))
            return result
        a, b = self.unify(base, exponent, node)
        if a.type.is_int:
            self.error(
                "integer '**' needs a constant exponent in 0..32; convert to f32 for a "
                "general power",
                node,
            )
        if isinstance(exponent, Py) and exponent.value == 0.5:
            return self._float_compute(a.type, lambda c, x: c.emit("sqrt", x.type, (x,)), a)
        if a.type == T.f64:
            self.error("'**' with a non-integer exponent has no f64 version; use f32", node)

        def general(c, x, y):
            return c.emit("exp2", T.f32, (c.emit("mul", T.f32, (y, c.emit("log2", T.f32, (x,)))),))

        return self._float_compute(a.type, general, a, b)

    def expr_UnaryOp(self, node):
        v = self.expr(node.operand)
        opt = type(node.op)
        if isinstance(v, Py):
            fn = {
                ast.USub: operator.neg,
                ast.UAdd: operator.pos,
                ast.Not: operator.not_,
                ast.Invert: operator.invert,
            }[opt]
            try:
                return Py(fn(v.value))
            except TypeError:
                self.error(f"cannot apply this operator to {v.value!r}", node)
        if opt is ast.Not:
            return self.b.emit("not", T.bool_, (self.truth(v, node),))
        x = self.value(v, node)
        if opt is ast.UAdd:
            return x
        lang_fp8.require_arith(self, x, node)
        if x.type.is_bool:
            self.error("'-' and '~' need numbers, got a bool", node)
        if opt is ast.Invert:
            if not x.type.is_int:
                self.error(f"'~' needs an integer, got {x.type}", node)
            return self.b.emit("invert", x.type, (x,))
        return self.b.emit("neg", x.type, (x,))

    def expr_BoolOp(self, node):
        """``and``/``or`` short-circuit: the right operand runs only when needed."""
        is_and = isinstance(node.op, ast.And)
        result = None  # a bool Var holding the value so far, once one is not constant
        for operand in node.values:
            if result is None:
                v = self.truth(self.expr(operand), operand)
                if isinstance(v, Const):
                    if v.value != is_and:  # False in an 'and', True in an 'or': decided
                        return v
                    continue
                result = self.b.var(T.bool_, "c")
                self.b.assign(result, v)
                continue
            with self.b.block() as rest:
                v = self.truth(self.expr(operand), operand)
                self.b.assign(result, v)
            if isinstance(v, Const) and v.value == is_and and len(rest) == 1:
                continue  # 'x and True' is x
            if all(isinstance(st, Instr) and OPS[st.op].pure for st in rest):
                # Nothing to skip that could fault or write: evaluate it, combine without a
                # branch (straight-line code schedules better, and the result is the same).
                for st in rest[:-1]:
                    self.b.append(st)
                combined = self.b.emit("and" if is_and else "or", T.bool_, (result, v))
                self.b.assign(result, combined)
                continue
            cond = result if is_and else self.b.emit("not", T.bool_, (result,))
            self.b.append(nodes.If(cond, rest, []))
        return result if result is not None else Const(is_and, T.bool_)

    def expr_Compare(self, node):
        left = self.expr(node.left)
        result = None
        for i, (op, comp) in enumerate(zip(node.ops, node.comparators, strict=True)):
            right = self.expr(comp)
            if type(op) in _PY_MEMBERSHIP:
                a, b = self._plain(left, node), self._plain(right, node)
                try:
                    c = Py(bool(_PY_MEMBERSHIP[type(op)](a, b)))
                except TypeError:
                    self.error(f"cannot test {a!r} in {b!r}", node)
            elif type(op) not in _PY_CMPOPS:
                self.error(
                    "only < <= > >= == != comparisons (and 'in' between compile-time values) "
                    "are supported in kernels",
                    node,
                )
            elif isinstance(left, Py) and isinstance(right, Py):
                try:
                    c = Py(_PY_CMPOPS[type(op)](left.value, right.value))
                except TypeError:
                    self.error(f"cannot compare {left.value!r} and {right.value!r}", node)
            else:
                self._warn_unsigned_negative(left, right, node)
                a, b = self.unify(left, right, node)
                lang.require_scalar(self, a, node, "a comparison")
                c = self.b.emit(_IR_CMP[type(op)], T.bool_, (a, b))
            if i + 1 < len(node.ops) and isinstance(right, Var):
                right = self._snapshot(right)
            result = c if result is None else self._and(result, c, node)
            left = right
        return result

    def _warn_unsigned_negative(self, left, right, node):
        """Warn (``kaio.UnsignedComparisonWarning``) when an unsigned value is compared with a
        negative literal: the literal wraps to a huge unsigned number (``n > -1`` is false)."""
        for lit, other in ((left, right), (right, left)):
            x = lit.value if isinstance(lit, Py) else None
            if (
                isinstance(x, _INTEGERS)
                and not isinstance(x, bool)
                and x < 0
                and isinstance(other, _SCALAR_VALUES)
                and other.type.kind == "uint"
            ):
                t = other.type
                where = f"{self.scope.filename}:{node.lineno}:{node.col_offset + 1}"
                warnings.warn_explicit(
                    f"{where}: warning: comparing unsigned {t} with the negative literal {x}: "
                    f"the literal becomes {x % 2**t.bits} as {t}, so the comparison is the same "
                    "for every value; convert the unsigned operand to a signed type first "
                    f"(i{64 if t.bits == 64 else 32}(...)) or compare with 0",
                    UnsignedComparisonWarning,
                    self.scope.filename,
                    node.lineno,
                )
                return

    def _plain(self, v, node):
        """The Python value of compile-time ``v``, tuples element by element (for ``in``);
        a CompileError when any part of it is known only at run time."""
        if isinstance(v, Const):
            return v.value
        if isinstance(v, Var | Array):
            self.error(
                "'in' and 'not in' test compile-time values only (constexprs, module "
                "constants); compare run-time values with == and !=",
                node,
            )
        x = v.value if isinstance(v, Py) else v
        return tuple(self._plain(e, node) for e in x) if isinstance(x, tuple) else x

    def _and(self, a, b, node):
        if isinstance(a, Py) and isinstance(b, Py):
            return Py(a.value and b.value)
        return self.b.emit("and", T.bool_, (self.truth(a, node), self.truth(b, node)))

    def expr_IfExp(self, node):
        cond = self.truth(self.expr(node.test), node.test)
        if isinstance(cond, Const):
            return self.expr(node.body if cond.value else node.orelse)
        with self.b.block() as then:
            a = self.expr(node.body)
        with self.b.block() as orelse:
            b = self.expr(node.orelse)
        va, vb = (self.value(x, node) for x in (a, b))
        t = T.promote(va.type, vb.type) if not (isinstance(a, Py) or isinstance(b, Py)) else None
        if t is None:
            ta, tb = self.unify(a, b, node)
            t = ta.type
        result = self.b.var(t, "sel")
        for block, v in ((then, a), (orelse, b)):
            with self._into(block):
                self.b.assign(result, self.convert(self.value(v, node, t), t))
        self.b.append(nodes.If(cond, then, orelse))
        return result

    @contextlib.contextmanager
    def _into(self, block):
        self.b._blocks.append(block)
        try:
            yield
        finally:
            self.b._blocks.pop()

    def expr_Call(self, node):
        fn = self.expr(node.func)
        if not isinstance(fn, Py):
            self.error("only builtins, types and @kaio.gpu_func functions can be called", node)
        fn = fn.value
        args = [self.expr(a) for a in node.args]
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                self.error("**kwargs unpacking is not supported in kernels", k)
            kwargs[k.arg] = self.expr(k.value)
        return self.call(fn, args, node, kwargs)

    def call(self, fn, args, node, kwargs: dict | None = None):
        """Call a builtin, a type (conversion) or a device function; keyword arguments bind
        to the builtin's or device function's parameters as in Python."""
        from kaio.decorators import DeviceFunction
        from kaio.kernel import Kernel

        fn = lang.PYTHON_BUILTINS.get(fn, lang.MATH_MODULE.get(fn, fn)) if _hashable(fn) else fn
        builtin = lang.BUILTINS.get(fn) if _hashable(fn) else None
        if builtin is not None:
            return builtin.lower(self, builtin.bind(self, args, kwargs or {}, node), node)
        if isinstance(fn, DeviceFunction):
            return self.inline(fn, args, node, kwargs or {})
        if kwargs and (isinstance(fn, ScalarType) or fn in _CONVERSIONS_AND_LEN):
            name = fn.name if isinstance(fn, ScalarType) else fn.__name__
            self.error(f"{name}() takes no keyword arguments in kernels", node)
        if isinstance(fn, ScalarType):
            return self._type_call(fn, args, node)
        if fn in (builtins.float, builtins.int, builtins.bool):
            return self._type_call(
                {builtins.float: T.f32, builtins.int: T.i32, builtins.bool: T.bool_}[fn], args, node
            )
        if fn is builtins.len:
            if len(args) != 1 or not isinstance(args[0], Array):
                self.error("len() takes one array", node)
            d = args[0].shape[0]
            return Py(d.value) if isinstance(d, Const) else d
        if isinstance(fn, Kernel):
            self.error(
                f"{fn.__name__} is a kernel and cannot be called from a kernel; make "
                "the shared code a @kaio.gpu_func",
                node,
            )
        if fn is builtins.range or fn is lang.static_range:
            self.error("range() is only allowed as a for-loop iterator", node)
        if fn is builtins.print:
            self.error(
                "print() is not supported in kernels; write values to an output array "
                "(or run kernel.sim[...] and inspect arrays)",
                node,
            )
        name = getattr(fn, "__name__", repr(fn))
        if isinstance(fn, pytypes.FunctionType):
            self.error(
                f"{name!r} is a Python function; kernels can only call @kaio.gpu_func "
                "functions and kaio builtins (decorate it with @kaio.gpu_func)",
                node,
            )
        self.error(f"{name!r} cannot be called in a kernel", node)

    def _type_call(self, t: ScalarType, args, node):
        if t.is_packed:
            return lang.pack(self, t, args, node)
        if len(args) != 1:
            self.error(f"{t.name}() takes one value to convert", node)
        v = args[0]
        if isinstance(v, Py):
            if not isinstance(v.value, int | float | bool | np.number):
                self.error(f"cannot convert {v.value!r} to {t.name}", node)
            return const_convert(v.value, t)
        x = self.value(v, node)
        if t.is_bool:
            return self.truth(x, node)
        return self.convert(x, t)

    def inline(self, df, args, node, kwargs: dict | None = None):
        """Inline a device function call: a new scope whose ``return``s leave a Region."""
        if df.pyfunc in self.inline_stack:
            chain = " -> ".join(f.__name__ for f in (*self.inline_stack, df.pyfunc))
            self.error(f"recursion is not supported in kernels ({chain})", node)
        parsed = parse(df.pyfunc)
        tree = parsed.tree
        if tree.args.vararg or tree.args.kwarg:
            self.error(f"{df.__name__}: device functions cannot take *args or **kwargs", node)
        bound = self._bind_device_call(df, args, kwargs or {}, node)
        sig = resolve_signature(df.pyfunc)
        for name in sig.constexprs:
            if not isinstance(bound[name], Py):
                self.error(
                    f"{df.__name__}: {name!r} is constexpr and needs a compile-time value", node
                )
        annotations = sig.resolve({n: bound[n].value for n in sig.generic}, self.error)
        scope = Scope(df.pyfunc, parsed.filename, region_id=fresh_id())
        counts = _function_assignments(df.pyfunc)
        scope.multi_assigned = _multi_assigned(df.pyfunc)
        scope.loop_only = _function_loop_only(df.pyfunc)
        ret = annotations.get("return")
        if ret is not None and ret is not type(None):
            scope.result_type = self._return_type(df, ret, node)
        for pname, a in bound.items():
            ann = annotations.get(pname)
            if ann is None:
                self.error(f"{df.__name__}: parameter {pname!r} has no type annotation", node)
            if ann is kaio.constexpr:
                scope.names[pname] = a
            elif isinstance(ann, ArrayType):
                if not isinstance(a, Array) or a.dtype != ann.dtype or a.ndim != ann.ndim:
                    self.error(f"{df.__name__}: {pname!r} expects a {ann} array", node)
                scope.names[pname] = a
                scope.readonly.add(pname)
            elif isinstance(ann, ScalarType):
                v = self._coerce_assignment(
                    pname, ann, a, node, f"change the annotation of {df.__name__}'s parameter"
                )
                if pname in counts or isinstance(v, Var):
                    var = self.b.var(ann, pname + "_")
                    self.b.assign(var, v)
                    v = var
                scope.names[pname] = v
            elif isinstance(ann, T.TensorMapType):
                if not any(q.value is a and q.role == "tensormap" for q in self.params):
                    self.error(
                        f"{df.__name__}: {pname!r} expects a kaio.tensormap kernel parameter",
                        node,
                    )
                scope.names[pname] = a
                scope.readonly.add(pname)
            else:
                detail = ann.message if isinstance(ann, T.InvalidAnnotation) else None
                self.error(
                    f"{df.__name__}: parameter {pname!r}: "
                    f"{detail or 'needs a kaio type annotation'}",
                    node,
                )
        saved_scope, saved_node, saved_loc = self.scope, self.node, self.b.loc
        self.inline_stack.append(df.pyfunc)
        self.scope = scope
        region = nodes.Region(scope.region_id, [])
        try:
            with self.b.block() as body:
                self.lower_block(tree.body)
        finally:
            self.inline_stack.pop()
            self.scope, self.node = saved_scope, saved_node
            self.b.loc = saved_loc
        region.body = body
        self.b.append(region)
        if scope.result_type is not None and scope.result is None:
            self.error(
                f"{df.__name__} is annotated to return {_type_text(scope.result_type)} but "
                "never returns a value",
                node,
            )
        if isinstance(scope.result, tuple):
            return Py(scope.result)
        return scope.result if scope.result is not None else Py(None)

    def _bind_device_call(self, df, args: list, kwargs: dict, node) -> dict:
        """A device function call's arguments by parameter name, bound as Python binds them
        (defaults are compile-time values)."""
        signature = _python_signature(df.pyfunc)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            self.error(f"{df.__name__}{_plain_signature(signature)}: {e}", node)
        bound.apply_defaults()
        return {
            n: v if isinstance(v, Var | Const | Array | Frag | Py) else Py(v)
            for n, v in bound.arguments.items()
        }

    def _return_type(self, df, ret, node):
        """A device function's return annotation: a scalar type, or a tuple of them
        (``tuple[f32, f32]``)."""
        if isinstance(ret, ScalarType):
            return ret
        items = (
            getattr(ret, "__args__", None) if getattr(ret, "__origin__", None) is tuple else None
        )
        if items and all(isinstance(t, ScalarType) for t in items):
            return tuple(items)
        self.error(
            f"{df.__name__}: the return annotation must be a scalar kaio type or a tuple of "
            f"them (tuple[kaio.f32, kaio.u32]), got {ret!r}",
            node,
        )

    # ------------------------------------------------------------------ the ctx API of builtins
    def value(self, v, node, hint: ScalarType | None = None):
        """An IR value for ``v``; Python literals become constants (their type follows
        ``hint``, the other operand's type, per the literal rules)."""
        if v.__class__ is Var or v.__class__ is Const:
            return v
        if hint is not None and hint.is_packed:
            hint = None  # a literal is never a pair: kaio.f16x2(x) packs it
        if isinstance(v, Array):
            self.error(f"array {v.name!r} used where a scalar value is expected", node)
        if isinstance(v, Frag):
            self.error(
                f"{v.array.name}[...] with fewer indices than dimensions is a part of the array "
                "(for builtins such as kaio.mma_f16); index every dimension to read a value",
                node,
            )
        if isinstance(v, Py):
            x = v.value
            if isinstance(x, _BOOLS):
                return (
                    Const(bool(x), T.bool_)
                    if hint is None or hint.is_bool
                    else const_convert(int(x), hint)
                )
            if isinstance(x, _INTEGERS):
                if isinstance(x, np.integer):
                    return const_convert(int(x), T.from_numpy_dtype(np.asarray(x).dtype))
                t = hint if hint is not None and not hint.is_bool else T.literal_type(x)
                if t.is_int and not T.int_fits(x, t):
                    self.error(f"the constant {x} does not fit in {t}", node)
                return const_convert(x, t)
            if isinstance(x, _FLOATS):
                if isinstance(x, np.floating):
                    return const_convert(float(x), T.from_numpy_dtype(np.asarray(x).dtype))
                return const_convert(x, T.f64 if hint == T.f64 else T.f32)
            if x is None:
                self.error(
                    "None has no value in a kernel (a device function without a return?)", node
                )
            self.error(f"{x!r} cannot be used as a value in a kernel", node)
        self.error(f"unexpected value {v!r}", node)

    def convert(self, v, t: ScalarType):
        """``v`` converted to ``t``."""
        if v.type == t:  # (every conversion below returns such a value as it is)
            return v
        message = lang.packed_conversion(v.type, t)
        if message:
            self.error(message)
        if v.type.is_fp8 or t.is_fp8:
            return lang_fp8.convert(self, v, t)
        return self.b.convert(v, t)

    def unify(self, a, b, node):
        """Two operands converted to their common type (API.md promotion rules)."""
        if isinstance(a, Py) and not isinstance(b, Py):
            vb = self.value(b, node)
            va = self.value(a, node, vb.type)
        elif isinstance(b, Py) and not isinstance(a, Py):
            va = self.value(a, node)
            vb = self.value(b, node, va.type)
        else:
            va, vb = self.value(a, node), self.value(b, node)
        t = T.promote(va.type, vb.type)
        if t is None:
            message = lang.packed_mix(va.type, vb.type) or lang_fp8.mix_message(va.type, vb.type)
            self.error(message or f"cannot combine {va.type} and {vb.type}", node)
        return self.convert(va, t), self.convert(vb, t)

    def truth(self, v, node):
        """``v`` as a bool_ value (``!= 0`` for numbers)."""
        if isinstance(v, Py):
            if not isinstance(v.value, int | float | bool | np.number):
                self.error(f"{v.value!r} has no truth value in a kernel", node)
            return Const(bool(v.value), T.bool_)
        x = self.value(v, node)
        if x.type.is_bool:
            return x
        lang.require_scalar(self, x, node, "a truth value")
        return self.b.emit("ne", T.bool_, (x, const_convert(0, x.type)))

    def const_value(self, v, node, what: str):
        """The compile-time Python value of ``v``, or a CompileError naming ``what``."""
        if isinstance(v, Py):
            x = v.value
            if isinstance(x, tuple):
                return tuple(self.const_value(i, node, what) for i in x)
            return x
        if isinstance(v, Const):
            return v.value
        if not isinstance(v, Var | Array | Frag):
            return v  # an element of a module-level tuple (SHAPE = (2, 2)): a Python value
        self.error(
            f"{what} must be known at compile time (a literal, a constexpr parameter or a "
            "module-level constant)",
            node,
        )

    def dtype_arg(self, v, node) -> ScalarType:
        """A scalar type given as a builtin argument."""
        t = v.value if isinstance(v, Py) else None
        if not isinstance(t, ScalarType):
            self.error(f"expected a kaio scalar type (kaio.f32, kaio.u32, ...), got {t!r}", node)
        return t

    def array_arg(self, v, node, what: str) -> Array:
        """An array given as a builtin argument."""
        if not isinstance(v, Array):
            self.error(f"kaio.{what}() needs an array as its first argument", node)
        return v

    def new_array(self, space: str, dtype: ScalarType, shape: tuple, node) -> Array:
        """Declare a shared, dynamic shared or local array."""
        n = sum(1 for a in self.arrays if a.space == space)
        name = {"shared": "smem", "shared_dyn": "dsmem", "local": "lmem"}[space] + str(n)
        if isinstance(node, ast.AST) and isinstance(self.node, ast.Assign):
            targets = self.node.targets
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                name = f"{targets[0].id}_{name}"
        dims = (None,) if shape == (None,) else tuple(Const(d, T.i64) for d in shape)
        arr = Array(name, dtype, space, dims)
        self.arrays.append(arr)
        return arr


def _methods(prefix: str) -> dict:
    """The AST node class -> ``Lowerer`` method table of the methods named ``prefix`` + the
    class's name (``stmt_If``, ``expr_Name``): the lowering dispatches on every node."""
    return {
        getattr(ast, name.removeprefix(prefix)): method
        for name, method in vars(Lowerer).items()
        if name.startswith(prefix)
    }


_STMT_METHODS = _methods("stmt_")
_EXPR_METHODS = _methods("expr_")
# isinstance tuples of the hot paths (a ``X | Y`` written in a call is built at each call)
_PY_NUMBERS = (int, float, bool, np.number)  # what compile-time arithmetic takes
_PY_CONSTANTS = (bool, int, float, str)  # the literals a kernel may hold (and None)
_BOOLS, _INTEGERS, _FLOATS = (bool, np.bool_), (int, np.integer), (float, np.floating)
_SEQUENCE_TARGETS = (ast.Tuple, ast.List)
_SCALAR_VALUES = (Var, Const)
_ARRAYS = (Array, Frag)  # a whole array, or a part of a local one
_COMPILE_TIME = (Array, Frag, Py)
_CONVERSIONS_AND_LEN = (builtins.float, builtins.int, builtins.bool, builtins.len)


def _type_text(t) -> str:
    """A return type as the user writes it."""
    if isinstance(t, tuple):
        return f"tuple[{', '.join(map(str, t))}]"
    return str(t)


def _plain_signature(signature: inspect.Signature) -> str:
    """``(a, b)``: a signature's parameter names, annotations left out."""
    return str(
        signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
    )


def _instr_add(counter: Var, step: Const, loc):
    return Instr("add", counter, (counter, step), {}, loc=loc)


def _python_scalar(x):
    """A NumPy integer or bool constexpr (``np.int32(4)``) as the Python int or bool it
    holds, so it is used wherever a literal is (``static_range`` bounds, shapes, range steps).
    NumPy floats keep their type (an ``np.float16`` constexpr is an f16 constant)."""
    return x.item() if isinstance(x, np.integer | np.bool_) else x


def _hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True
