"""Source and name resolution for kernels and device functions."""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import inspect
import os
import textwrap
import types
from dataclasses import dataclass

from kaio.errors import CompileError
from kaio.kernel import value_key


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


def _fingerprint(value) -> str:
    """A stable text for a module-level value a kernel reads: its ``value_key`` where it has
    one that does not print an address, else its type (functions and modules by name)."""
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, type | types.FunctionType | types.BuiltinFunctionType):
        return f"{type(value).__name__} {value.__module__}.{value.__qualname__}"
    try:
        text = repr(value_key(value))
    except Exception:  # noqa: BLE001  (unhashable or a failing __repr__: the type stands)
        text = ""
    if " at 0x" in text or not text:
        t = type(value)
        return f"object of {t.__module__}.{t.__qualname__}"
    return text


def _dotted(node) -> list[str] | None:
    """``["cfg", "sub", "N"]`` for the expression ``cfg.sub.N``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


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
    """The source of a function and of every device function and module-level value it
    refers to, transitively: what a compiled kernel depends on beside the compiler itself
    (for cache keys). Names and attribute chains of them (``cfg.N``, ``C.N``,
    ``helpers.f``) are resolved as the compiler resolves them; each value enters by type and
    value (``value_key``): constants of any kind, NumPy scalars, dtypes and array types used
    as annotations; device functions by their own dependencies."""
    from kaio.decorators import DeviceFunction

    out: list[str] = []
    seen: set = set()

    def visit(f):
        if f in seen:
            return
        seen.add(f)
        out.append(parse(f).source)
        for node in ast.walk(parse(f).tree):
            chain = _dotted(node) if isinstance(node, ast.Name | ast.Attribute) else None
            if chain is None:
                continue
            try:
                value = lookup_global(f, chain[0])
            except LookupError:
                continue
            if value is _MISSING:
                continue
            for attr in chain[1:]:
                try:
                    value = getattr(value, attr)
                except Exception:  # noqa: BLE001  (the compiler reports it, located)
                    value = _MISSING
                    break
            name = ".".join(chain)
            if isinstance(value, DeviceFunction):
                out.append(f"{name}=device function {value.pyfunc.__qualname__}")
                visit(value.pyfunc)
            elif value is not _MISSING:
                out.append(f"{name}={_fingerprint(value)}")

    visit(pyfunc)
    return out


_COMPILER_SKIPS = ("sim", "runtime")  # code that never shapes PTX or what the cache holds
_COMPILER_KEEPS = (os.path.join("runtime", "module.py"),)  # writes the cache's metadata


@functools.cache
def compiler_fingerprint() -> str:
    """A SHA-256 of kaio's own compiler sources (every ``.py`` file of the package but the
    simulator's and the runtime's, save ``runtime/module.py``, which writes the cached
    metadata): computed once per process, part of every disk-cache key, so a changed
    frontend, IR pass or emitter never loads a cubin an older compiler built."""
    import kaio

    root = os.path.dirname(os.path.abspath(kaio.__file__))
    h = hashlib.sha256(kaio.__version__.encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel.split(os.sep)[0] in _COMPILER_SKIPS and rel not in _COMPILER_KEEPS:
                continue
            with open(path, "rb") as f:
                h.update(rel.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()
