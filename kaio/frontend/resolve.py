"""Source and name resolution for kernels and device functions."""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import textwrap
from dataclasses import dataclass

from kaio.errors import CompileError
from kaio.types import ScalarType


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


def annotations(pyfunc) -> dict:
    """A function's annotations with string annotations (``from __future__ import
    annotations``) evaluated in its module."""
    try:
        return inspect.get_annotations(pyfunc, eval_str=True)
    except Exception as e:  # noqa: BLE001  (any failure evaluating user annotations)
        code = pyfunc.__code__
        raise CompileError(
            f"cannot evaluate the annotations of {pyfunc.__name__!r}: {e}",
            code.co_filename,
            code.co_firstlineno,
            0,
        ) from None


def check_definition(pyfunc, annotations: dict, what: str) -> None:
    """Refuse at decoration what a kernel or device function can never compile: default values
    (``a: f32 = 1.0``: launches pass every argument) and malformed annotations (``f32[0]``),
    as a CompileError located at the parameter. ``annotations`` maps names to resolved
    annotations (strings are skipped: a device function's are resolved when it is inlined)."""
    from kaio.types import InvalidAnnotation

    code = pyfunc.__code__
    problem = None
    defaults = pyfunc.__defaults__ or ()
    names = code.co_varnames[: code.co_argcount]
    if defaults:
        name = names[len(names) - len(defaults)]
        problem = (
            name,
            f"parameter {name!r} has a default value; {what} parameters cannot have defaults "
            "(every argument is passed at each call): remove '= ...' and pass the value, or "
            "make it a module-level constant",
        )
    if pyfunc.__kwdefaults__:
        name = next(iter(pyfunc.__kwdefaults__))
        problem = (name, f"{what} parameters cannot be keyword-only or have defaults")
    for name, ann in annotations.items():
        if isinstance(ann, InvalidAnnotation) and problem is None:
            problem = (name, f"parameter {name!r}: {ann.message}")
    if problem is None:
        return
    name, message = problem
    filename, lineno, col = code.co_filename, code.co_firstlineno, 0
    try:
        parsed = parse(pyfunc)
    except CompileError:  # no source (a prompt): the function's first line
        pass
    else:
        filename = parsed.filename
        args = parsed.tree.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            if arg.arg == name:
                lineno, col = arg.lineno, arg.col_offset
    raise CompileError(message, filename, lineno, col)


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
