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
            f"cannot read the source of {pyfunc.__name__!r} ({e}): kaio compiles a kernel "
            "from its source text, so kernels and device functions must be defined in a .py "
            "file (a module or a script), not typed at an interactive prompt, given to "
            "`python -c` or built with exec(); put it in a file and import or run that"
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
