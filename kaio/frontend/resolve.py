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
import weakref
from dataclasses import dataclass, field

from kaio.errors import CompileError
from kaio.kernel import value_key
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


def check_definition(pyfunc, annotations: dict, what: str, defaults_allowed: bool = False) -> None:
    """Refuse at decoration what a kernel or device function can never compile: default values
    of a kernel (``a: f32 = 1.0``: launches pass every argument; device functions bind theirs
    as Python does, ``defaults_allowed``) and malformed annotations (``f32[0]``), as a
    CompileError located at the parameter. ``annotations`` maps names to resolved annotations
    (strings are skipped: a device function's are resolved when it is inlined)."""
    from kaio.types import InvalidAnnotation

    code = pyfunc.__code__
    problem = None
    defaults = () if defaults_allowed else pyfunc.__defaults__ or ()
    names = code.co_varnames[: code.co_argcount]
    if defaults:
        name = names[len(names) - len(defaults)]
        problem = (
            name,
            f"parameter {name!r} has a default value; {what} parameters cannot have defaults "
            "(every argument is passed at each call): remove '= ...' and pass the value, or "
            "make it a module-level constant",
        )
    if pyfunc.__kwdefaults__ and not defaults_allowed:
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
    # dtype values -> annotations: a device function is inlined many times per kernel
    _resolved: dict = field(default_factory=dict, compare=False, repr=False)

    def resolve(self, values: dict, error) -> dict:
        """The annotations for these constexpr ``values`` (shared: read them only);
        ``error(message)`` raises when a dtype parameter's value is not a kaio scalar type."""
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
        key = tuple(values[n] for n in self.generic)
        found = self._resolved.get(key)
        if found is None:
            bindings = dict(zip(self.generic, key, strict=True))
            found = self._resolved[key] = annotations(self.pyfunc, bindings)
        return found


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
