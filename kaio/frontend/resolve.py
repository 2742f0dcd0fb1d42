"""Source and name resolution for kernels and device functions."""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import textwrap
import weakref
from dataclasses import dataclass

from kaio.errors import CompileError
from kaio.types import ArrayType, ScalarType


@dataclass(frozen=True)
class ParsedFunction:
    """A function's AST with line numbers matching its file."""

    tree: ast.FunctionDef
    filename: str
    source: str


@functools.cache
def parse(pyfunc) -> ParsedFunction:
    """Parse a Python function's source (``inspect.getsource`` + ``ast``)."""
    filename = inspect.getsourcefile(pyfunc) or "<unknown>"
    try:
        lines, first = inspect.getsourcelines(pyfunc)
    except (OSError, TypeError) as e:
        raise CompileError(
            f"cannot read the source of {pyfunc.__name__!r} ({e}); kernels must be defined in a "
            "file, not typed into an interactive prompt"
        ) from None
    source = textwrap.dedent("".join(lines))
    module = ast.parse(source)
    ast.increment_lineno(module, first - 1)
    indent = len(lines[0]) - len(lines[0].lstrip())
    if indent:
        for node in ast.walk(module):
            if hasattr(node, "col_offset"):
                node.col_offset += indent
                if getattr(node, "end_col_offset", None) is not None:
                    node.end_col_offset += indent
    tree = module.body[0]
    if not isinstance(tree, ast.FunctionDef):
        raise CompileError(f"{pyfunc.__name__!r} is not a plain function", filename, first, 0)
    return ParsedFunction(tree, filename, source)


_MISSING = object()


def lookup_global(pyfunc, name: str):
    """The value of a free name in a function: its module globals, then Python builtins.

    Returns ``_MISSING`` for an undefined name; raises ``LookupError`` for a closure variable.
    """
    if name in pyfunc.__code__.co_freevars:
        raise LookupError(name)
    value = pyfunc.__globals__.get(name, _MISSING)
    if value is _MISSING:
        value = getattr(builtins, name, _MISSING)
    return value


MISSING = _MISSING


def annotations(pyfunc, bindings: dict | None = None) -> dict:
    """A function's annotations with string annotations (``from __future__ import
    annotations``, or one quoted annotation) evaluated in its module, where ``bindings`` (the
    values of constexpr parameters: ``x: DT[:]`` with ``DT: kaio.constexpr``) hide globals."""
    raw = inspect.get_annotations(pyfunc)
    return {name: _evaluate(pyfunc, name, a, bindings or {}) for name, a in raw.items()}


def _evaluate(pyfunc, name: str, annotation, bindings: dict):
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, pyfunc.__globals__, dict(bindings))  # noqa: S307  (user code)
    except Exception as e:  # noqa: BLE001  (any failure evaluating user annotations)
        code = pyfunc.__code__
        hint = ""
        if isinstance(e, NameError):
            hint = (
                "; a dtype parameter used in annotations is declared as "
                "'DT: kaio.constexpr' and given a kaio scalar type (kaio.f16) at launch"
            )
        raise CompileError(
            f"cannot evaluate the annotation {annotation!r} of {name!r} in "
            f"{pyfunc.__name__!r}: {e}{hint}",
            code.co_filename,
            code.co_firstlineno,
            0,
        ) from None


class TypeParam:
    """A dtype constexpr parameter (``DT: kaio.constexpr``) in annotations before its value is
    known: ``DT[:]`` is an array annotation of its dimensions, the element type decided per
    specialization."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, dims) -> ArrayType:
        ndim = len(dims) if isinstance(dims, tuple) else 1
        return ArrayType(self, ndim)  # type: ignore[arg-type]  (a placeholder element type)

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Signature:
    """The annotations of a kernel's or device function's parameters.

    ``constexprs``: the parameters annotated ``kaio.constexpr``; ``generic``: those of them
    that other annotations name (dtype parameters); ``template``: the annotations with each
    generic name a ``TypeParam`` (array-ness and rank known before any value)."""

    pyfunc: object
    constexprs: tuple
    generic: tuple
    template: dict

    def resolve(self, values: dict, error) -> dict:
        """The annotations for these constexpr ``values``; ``error(message)`` raises when a
        dtype parameter's value is not a kaio scalar type."""
        if not self.generic:
            return self.template
        for name in self.generic:
            v = values.get(name)
            if not isinstance(v, ScalarType):
                error(
                    f"{self.pyfunc.__name__}: constexpr {name!r} is used in annotations as an "
                    f"element type and must be a kaio scalar type (kaio.f16, kaio.f32, ...), "
                    f"got {v!r}"
                )
        return annotations(self.pyfunc, {n: values[n] for n in self.generic})


def signature(pyfunc) -> Signature:
    """The ``Signature`` of a kernel or device function (cached per function)."""
    found = _SIGNATURES.get(pyfunc)
    if found is None:
        found = _SIGNATURES[pyfunc] = _signature(pyfunc)
    return found


_SIGNATURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(pyfunc) -> Signature:
    from kaio.kernel import constexpr

    raw = inspect.get_annotations(pyfunc)
    constexprs = []
    for name, a in raw.items():
        if a is constexpr or (isinstance(a, str) and _quiet_eval(pyfunc, a) is constexpr):
            constexprs.append(name)
    generic = set()
    for name, a in raw.items():
        if isinstance(a, str) and name not in constexprs:
            try:
                used = {
                    n.id for n in ast.walk(ast.parse(a, mode="eval")) if isinstance(n, ast.Name)
                }
            except SyntaxError:
                continue  # reported by annotations() below
            generic |= used & set(constexprs)
    generic = tuple(n for n in constexprs if n in generic)
    template = annotations(pyfunc, {n: TypeParam(n) for n in generic})
    return Signature(pyfunc, tuple(constexprs), generic, template)


def _quiet_eval(pyfunc, text: str):
    try:
        return eval(text, pyfunc.__globals__, {})  # noqa: S307  (user code)
    except Exception:  # noqa: BLE001  (annotations() reports it)
        return None


def dependency_sources(pyfunc) -> list[str]:
    """The source of a function and of every device function and plain constant it refers
    to, transitively: what a compiled kernel depends on (for cache keys)."""
    from kaio.decorators import DeviceFunction

    out: list[str] = []
    seen: set = set()

    def visit(f):
        if f in seen:
            return
        seen.add(f)
        out.append(parse(f).source)
        for node in ast.walk(parse(f).tree):
            if isinstance(node, ast.Name):
                try:
                    value = lookup_global(f, node.id)
                except LookupError:
                    continue
                if isinstance(value, DeviceFunction):
                    visit(value.pyfunc)
                elif isinstance(value, int | float | bool | str | tuple | ScalarType):
                    out.append(f"{node.id}={value!r}")

    visit(pyfunc)
    return out
