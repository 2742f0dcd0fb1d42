"""Random kernels for fuzzing the frontend: hypothesis draws Python source, mostly well-typed
DSL code (statements, expressions up to 6 deep and long operator chains, types, builtins,
shared and local arrays, loops, ``@kaio.gpu_func`` device functions returning scalars and
tuples, decorator options, int, float, bool and dtype constexprs) with bad constructs mixed in
(closures, lambdas, lists, strings, wrong arities, bad types and options, names that do not
exist, control flow outside loops...). ``check`` writes one to a module, imports it and
compiles it: the compiler must either give PTX that ptxas accepts, through both backends, or
raise ``kaio.CompileError``; a kernel that compiles must then run in the simulator on random
inputs, or raise ``kaio.LaunchError`` or ``kaio.SimulationError``; all within time limits.

``mutants`` draws real kernels (tests/catalog.py, examples/, the specializations kaio_ops
ships) with a few AST mutations each (operators swapped, constants replaced, statements
deleted or duplicated, annotations and type names changed); ``check_mutant`` requires PTX
that ptxas accepts or a ``CompileError`` of them, never another exception, never a hang.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import signal
import sys
import tempfile
import warnings
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import kaio
from kaio.ptx.ptxas import assemble

INTS = ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"]
FLOATS = ["f16", "bf16", "f32", "f64"]
SCALARS = INTS + FLOATS + ["bool_"]
ATOMIC_TYPES = ["i32", "u32", "i64", "u64", "f32", "f64"]
BINOPS = ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "@"]
CMPOPS = ["<", "<=", ">", ">=", "==", "!="]
UNARY_BUILTINS = [
    "kaio.abs",
    "kaio.sqrt",
    "kaio.exp",
    "kaio.log",
    "kaio.sin",
    "kaio.tanh",
    "kaio.floor",
    "kaio.rsqrt",
    "kaio.erf",
    "abs",
    "float",
    "int",
    "bool",
    "math.sqrt",
    "math.exp",
]
BINARY_BUILTINS = ["kaio.min", "kaio.max", "min", "max", "pow", "kaio.pow", "kaio.shfl_xor"]
NULLARY_BUILTINS = [
    "kaio.thread_idx_x",
    "kaio.thread_idx_y",
    "kaio.block_idx_x",
    "kaio.block_dim_x",
    "kaio.grid_dim_x",
    "kaio.lane_id",
    "kaio.warp_id",
]
# Bad statements and expressions: each must be a CompileError (or, for a few, fine).
BAD_STATEMENTS = [
    "def inner(q):\n    return q",
    "class C:\n    pass",
    "import math",
    "from math import sqrt",
    "global G",
    "assert {e}",
    "raise ValueError('x')",
    "del {v}",
    "try:\n    pass\nexcept Exception:\n    pass",
    "with {e}:\n    pass",
    "print({e})",
    "yield {e}",
    "lst = [1, 2, 3]",
    "d = {{1: 2}}",
    "s = 'text'",
    "t = f'{{1}}'",
    "fn = lambda q: q",
    "c = [q for q in range(3)]",
    "{v} = {v} @ {v}",
    "(w := 3)",
    "x, *y = (1, 2, 3)",
    "{e}",
    "{v}.attr = 1",
    "match 1:\n    case 1:\n        pass",
    "for q in [1, 2]:\n    pass",
    "for q in range(0, 10, 0):\n    pass",
    "while True:\n    pass\nelse:\n    pass",
    "undefined_name_here = nope + 1",
    "out0[1, 2, 3] = 1",
    "out0[-1] = 1",
    "out0[1.5] = 1",
    "sh = kaio.shared(f32, (n,))",
    "sh = kaio.shared(f32, (0,))",
    "sh = kaio.shared(f32, (-3,))",
    "lo = kaio.local(i32, (2, 'a'))",
    "kaio.sync_threads(1)",
    "kaio.atomic_add(out0, 0)",
    "q = kaio.bitcast({e}, f32)",
    "q = kaio.select({e}, 1, 2, 3)",
    "q = kaio.f32({e}, {e})",
    "q = kaio.static_range(3)",
    "q = range(3)",
    "q = len({e})",
    "q = kaio.thread_idx_x(1)",
    "q = n.shape[0]",
    "q = out0.shape[5]",
    "q = out0.strides",
    "q = 1 if {e} else out0",
    "q = (1, 2)[5]",
    "q = (1, 2)[{e}]",
    "q = 2 ** 100000",
    "q = 1 << 200",
    "q = 10 ** 30 + {e}",
    "q = 1.0e308 * 1.0e308 + {e}",
    "q = 1 // 0",
    "q = {e} if None else {e}",
    "q = None + 1",
    "q = -None",
    "q = not None",
    "for q in kaio.static_range(100000):\n    pass",
    "for q in range(1 << 62):\n    pass",
    "q = kaio.shfl_xor(out0, 1)",
    "q = kaio.ballot(out0)",
    "q = kaio.atomic_add(out0, 0, out0)",
    "q = kaio.exp({e}, {e})",
    "q = kaio.f16x2(1.0) * 2.0",
    "q = kaio.low({e})",
    "q = kaio.prmt({e}, 1, 2)",
    "kaio.cp_async(out0, 0, out0, 0, 16)",
    "kaio.load_vector(out0, out0, 0)",
    "kaio.mma_f16(out0, out0, out0, out0)",
]


class Timeout(Exception):
    """A compile took longer than the limit: the fuzzer treats it as a hang."""


@contextmanager
def time_limit(seconds: float):
    """Raise ``Timeout`` in the main thread after ``seconds`` (no limit elsewhere)."""
    if sys.platform == "win32" or not _main_thread():
        yield
        return

    def fire(signum, frame):
        raise Timeout(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# Decorator options: valid and bad values of each (a bad one is a kaio error at definition,
# at .ptx() or at launch).
BLOCK_SIZES = ["64", "(8, 4)", "32", "1", "96", "(32, 1, 1)", "(4, 4, 4)", "1024", "2048", "0"]
BLOCK_SIZES += ["-1", "256.0", "1e100", "True", "'32'", "(8, 4, 2, 1)", "(0, 4)", "(1024, 2)"]
BLOCK_SIZES += ["[64]", "None", "(64, 1, 128)"]
OPTIONS = {
    "arch": ["'sm_80'", "'sm_90'", "'sm_75'", "'sm_999'", "90", "None"],
    "debug": ["True", "False"],
    "backend": ["'ptx'", "'llvm'", "'cuda'", "None"],
    "fastmath": ["True", "False"],
}
# Constexpr values beyond ints: floats, bools, NumPy scalars, strings, None.
CONSTEXPR_VALUES = [0.5, -2.0, 1e30, 0.0, -0.0, True, False, np.int32(4), np.float32(1.5)]
CONSTEXPR_VALUES += ["reverse", None, 2**40]
DTYPE_CONSTEXPRS = ["f16", "f32", "bf16", "i32", "u8", "f64", "bool_"]


@dataclass
class Case:
    """One generated kernel: its module ``source``, constexpr values, and what the simulator
    run needs (each parameter's kind and type, the decorator's block)."""

    source: str
    constexprs: dict
    params: list = field(default_factory=list)  # (name, kind, type name, ndim)
    block: object = None  # the decorator's block_size, or None
    may_hang: bool = False  # a while loop or a huge range: a simulator timeout is no bug

    def __iter__(self):  # (source, constexprs), as the first fuzzer's pairs
        return iter((self.source, self.constexprs))


class Gen:
    """Draws one kernel: ``source()`` gives the module text and ``constexprs`` its values."""

    def __init__(self, draw, parent: Gen | None = None):
        self.d = draw
        self.arrays: dict[str, tuple[str, int]] = {}  # name -> (dtype, ndim)
        self.scalars: dict[str, str] = {}  # readable scalar names -> type
        self.locals: dict[str, str] = {}  # assignable variables -> type
        self.constexprs: dict = {}
        self.counter = 0
        self.loop_depth = 0
        self.shared: list[tuple[str, str, int]] = []  # name, dtype, size
        self.depth = draw(st.integers(1, 6))  # how deep expressions nest
        self.dtypes: list[str] = []  # dtype constexpr names (DT0...)
        self.funcs: list[tuple[str, int, int]] = []  # device functions: name, params, results
        self.params: list[tuple[str, str, str, int]] = []
        self.may_hang = False
        self.in_function = parent is not None
        if parent is not None:
            self.counter = parent.counter + 1000

    # ------------------------------------------------------------------ helpers
    def pick(self, options):
        return self.d(st.sampled_from(options))

    def chance(self, p: float) -> bool:
        return self.d(st.integers(0, 999)) < int(p * 1000)

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def type_name(self) -> str:
        """A scalar type for a conversion, a shared array or a bitcast: kaio's or a dtype
        constexpr."""
        if self.dtypes and self.chance(0.3):
            return self.pick(self.dtypes)
        return f"kaio.{self.pick(SCALARS)}"

    # ------------------------------------------------------------------ signature
    def signature(self) -> list[str]:
        params = ["out0: f32[:]"]
        self.arrays["out0"] = ("f32", 1)
        self.params.append(("out0", "array", "f32", 1))
        kinds = ["array", "array2", "scalar", "scalar", "constexpr", "constexpr2", "dtype", "bad"]
        drawn = [self.pick(kinds) for _ in range(self.d(st.integers(0, 4)))]
        for k, kind in enumerate(sorted(drawn, key=lambda kd: kd != "dtype")):
            name = f"p{k}"
            if kind == "dtype":
                name = f"DT{k}"
                params.append(f"{name}: kaio.constexpr")
                self.constexprs[name] = getattr(kaio, self.pick(DTYPE_CONSTEXPRS))
                self.dtypes.append(name)
                self.params.append((name, "constexpr", "", 0))
            elif kind.startswith("array"):
                t = self.pick(SCALARS + self.dtypes)
                ndim = 2 if kind == "array2" else 1
                params.append(f"{name}: {t}[{', '.join([':'] * ndim)}]")
                self.arrays[name] = (t, ndim)
                self.params.append((name, "array", t, ndim))
            elif kind == "scalar":
                t = self.pick(SCALARS)
                params.append(f"{name}: {t}")
                self.scalars[name] = t
                self.params.append((name, "scalar", t, 0))
            elif kind.startswith("constexpr"):
                params.append(f"{name}: kaio.constexpr")
                if kind == "constexpr":
                    self.constexprs[name] = self.d(st.integers(-3, 70))
                else:
                    self.constexprs[name] = self.pick(CONSTEXPR_VALUES)
                self.scalars[name] = "const"
                self.params.append((name, "constexpr", "", 0))
            else:
                params.append(self.pick([f"{name}", f"{name}: int", f"{name}: list", f"{name}=3"]))
                self.params.append((name, "bad", "", 0))
        params.append("n: u32")
        self.scalars["n"] = "u32"
        self.params.append(("n", "scalar", "u32", 0))
        return params

    # ------------------------------------------------------------------ expressions
    def literal(self) -> str:
        return self.pick(
            [
                "0",
                "1",
                "2",
                "7",
                "-1",
                "255",
                "65536",
                "2**31",
                "2**40",
                "-2**63",
                "0.5",
                "-1.25",
                "3.0",
                "1e30",
                "1e-30",
                "True",
                "False",
            ]
        )

    def name(self) -> str:
        names = list(self.scalars) + list(self.locals)
        return self.pick(names) if names else self.literal()

    def index(self, depth: int) -> str:
        kind = self.pick(["tid", "tid", "name", "lit", "expr"])
        if kind == "tid":
            return self.pick(["kaio.thread_idx_x()", "i", "i % n", "kaio.lane_id()"])
        if kind == "name":
            return self.name()
        if kind == "lit":
            return self.pick(["0", "1", "3", "31"])
        return self.expr(depth - 1)

    def element(self, depth: int) -> str:
        name = self.pick(sorted(self.arrays))
        _, ndim = self.arrays[name]
        idx = ", ".join(self.index(depth) for _ in range(ndim))
        return f"{name}[{idx}]"

    def call(self, depth: int, results: int) -> str | None:
        """A call of a device function with ``results`` results (None if there is none)."""
        funcs = [f for f in self.funcs if f[2] == results]
        if not funcs:
            return None
        fname, nparams, _ = self.pick(funcs)
        args = [self.expr(depth - 1) for _ in range(nparams)]
        if self.chance(0.05):
            args = args[:-1]  # a wrong arity
        return f"{fname}(out0, {', '.join(args + ['n'])})"

    def expr(self, depth: int | None = None) -> str:
        if depth is None:
            depth = self.depth
        if depth <= 0 or self.chance(0.25):
            kind = self.pick(["name", "name", "literal", "element", "call0", "shape"])
            if kind == "name":
                return self.name()
            if kind == "literal":
                return self.literal()
            if kind == "element":
                return self.element(1)
            if kind == "shape":
                name = self.pick(sorted(self.arrays))
                return self.pick([f"{name}.shape[0]", f"len({name})", f"{name}.ndim"])
            return f"{self.pick(NULLARY_BUILTINS)}()"
        kind = self.pick(
            [
                "bin",
                "bin",
                "bin",
                "cmp",
                "bool",
                "not",
                "neg",
                "ifexp",
                "call1",
                "call2",
                "convert",
                "select",
                "element",
                "tuple",
                "bitcast",
                "shared",
                "chain",
                "dcall",
                "dcall2",
            ]
        )
        e = self.expr
        if kind == "bin":
            return f"({e(depth - 1)} {self.pick(BINOPS)} {e(depth - 1)})"
        if kind == "chain":  # a long flat chain (deep in the AST)
            n = self.d(st.integers(2, 200))
            ops = self.pick([["+"], ["+", "-", "*"], BINOPS, ["and", "or"]])
            out = self.name()
            for _ in range(n):
                out += f" {self.pick(ops)} {self.pick([self.name(), self.literal()])}"
            return f"({out})"
        if kind == "cmp":
            chain = [e(depth - 1) for _ in range(self.d(st.integers(2, 3)))]
            out = chain[0]
            for c in chain[1:]:
                out += f" {self.pick(CMPOPS)} {c}"
            return f"({out})"
        if kind == "bool":
            return f"({e(depth - 1)} {self.pick(['and', 'or'])} {e(depth - 1)})"
        if kind == "not":
            return f"(not {e(depth - 1)})"
        if kind == "neg":
            return f"({self.pick(['-', '~', '+'])}{e(depth - 1)})"
        if kind == "ifexp":
            return f"({e(depth - 1)} if {e(depth - 1)} else {e(depth - 1)})"
        if kind == "call1":
            return f"{self.pick(UNARY_BUILTINS)}({e(depth - 1)})"
        if kind == "call2":
            return f"{self.pick(BINARY_BUILTINS)}({e(depth - 1)}, {e(depth - 1)})"
        if kind == "convert":
            return f"{self.type_name()}({e(depth - 1)})"
        if kind == "select":
            return f"kaio.select({e(depth - 1)}, {e(depth - 1)}, {e(depth - 1)})"
        if kind == "tuple":
            return f"({e(depth - 1)}, {e(depth - 1)})[{self.pick(['0', '1'])}]"
        if kind == "bitcast":
            return f"kaio.bitcast({e(depth - 1)}, {self.type_name()})"
        if kind == "shared" and self.shared:
            name, _, size = self.pick(self.shared)
            return f"{name}[{self.index(depth - 1)} % {size}]"
        if kind == "dcall":
            call = self.call(depth, 1)
            if call is not None:
                return call
        if kind == "dcall2":
            call = self.call(depth, 2)
            if call is not None:
                return f"{call}[{self.pick(['0', '1'])}]"
        return self.element(depth - 1)

    # ------------------------------------------------------------------ statements
    def block(self, depth: int, indent: str) -> list[str]:
        lines: list[str] = []
        for _ in range(self.d(st.integers(1, 4))):
            lines += self.statement(depth, indent)
        return lines

    def statement(self, depth: int, indent: str) -> list[str]:
        kinds = [
            "assign",
            "assign",
            "store",
            "aug",
            "ann",
            "if",
            "for",
            "static",
            "while",
            "builtin",
            "pass",
            "return",
            "shared",
            "local",
            "bad",
            "dcall",
        ]
        if self.loop_depth:
            kinds += ["break", "continue"]
        kind = self.pick(kinds)
        if depth <= 0 and kind in ("if", "for", "static", "while"):
            kind = "assign"
        e = self.expr
        if kind == "assign":
            if self.locals and self.chance(0.5):
                v = self.pick(sorted(self.locals))
            else:
                v = self.fresh()
                self.locals[v] = "?"
            return [f"{indent}{v} = {e()}"]
        if kind == "ann":
            v = self.fresh()
            self.locals[v] = self.pick(SCALARS)
            return [f"{indent}{v}: {self.locals[v]} = {e()}"]
        if kind == "store":
            return [f"{indent}{self.element(2)} = {e()}"]
        if kind == "aug":
            target = self.pick(sorted(self.locals)) if self.locals else self.element(2)
            if self.chance(0.3):
                target = self.element(2)
            return [f"{indent}{target} {self.pick(BINOPS)}= {e()}"]
        if kind == "if":
            lines = [f"{indent}if {e()}:"] + self.block(depth - 1, indent + "    ")
            if self.chance(0.3):
                lines += [f"{indent}elif {e()}:"] + self.block(depth - 1, indent + "    ")
            if self.chance(0.4):
                lines += [f"{indent}else:"] + self.block(depth - 1, indent + "    ")
            return lines
        if kind in ("for", "static", "while"):
            self.loop_depth += 1
            try:
                v = self.fresh()
                if kind == "for":
                    bounds = self.pick(["n", "4", "0, n", "n, 0, -1", "i32(n), -1, -1", "1, 9, 2"])
                    head = f"{indent}for {v} in range({bounds}):"
                    self.locals[v] = "loop"
                elif kind == "static":
                    bounds = self.pick(["3", "0, 4", "2, 8, 3", "1", "0", "5, 2"])
                    head = f"{indent}for {v} in kaio.static_range({bounds}):"
                    self.scalars[v] = "const"  # (read after the loop too: its last value)
                else:
                    head = f"{indent}while {e()}:"
                    self.may_hang = True
                body = self.block(depth - 1, indent + "    ")
            finally:
                self.loop_depth -= 1
            return [head] + body
        if kind == "builtin":
            arr = self.pick(sorted(self.arrays))
            dtype, ndim = self.arrays[arr]
            idx = ", ".join(self.index(1) for _ in range(ndim))
            idx = f"({idx})" if ndim > 1 else idx
            call = self.pick(
                [
                    "kaio.sync_threads()",
                    "kaio.sync_warp()",
                    "kaio.threadfence()",
                    f"kaio.atomic_add({arr}, {idx}, {e(1)})",
                    f"kaio.atomic_max({arr}, {idx}, {e(1)})",
                    f"kaio.atomic_exch({arr}, {idx}, {e(1)})",
                    f"kaio.atomic_cas({arr}, {idx}, {e(1)}, {e(1)})",
                    f"{self.fresh()} = kaio.shfl_down({e(1)}, 1)",
                    f"{self.fresh()} = kaio.vote_any({e(1)})",
                    f"{self.fresh()} = kaio.ballot({e(1)})",
                ]
            )
            return [f"{indent}{call}"]
        if kind == "shared":
            name = self.fresh()
            t = self.pick(ATOMIC_TYPES + ["f16", "u8", "bool_"] + self.dtypes)
            size = self.pick([1, 32, 64, 100])
            self.shared.append((name, t, size))
            return [
                f"{indent}{name} = kaio.shared({t}, ({size},))",
                f"{indent}{name}[kaio.thread_idx_x() % {size}] = {e(1)}",
            ]
        if kind == "local":
            name = self.fresh()
            t = self.pick(SCALARS + self.dtypes)
            return [
                f"{indent}{name} = kaio.local({t}, 4)",
                f"{indent}{name}[{self.pick(['0', '3', 'kaio.lane_id() % 4'])}] = {e(1)}",
                f"{indent}out0[0] = {name}[1]",
            ]
        if kind == "dcall":
            results = self.pick([0, 1, 2])
            call = self.call(self.depth, results)
            if call is None:
                return [f"{indent}pass"]
            if results == 2:
                a, b = self.fresh(), self.fresh()
                self.locals[a] = self.locals[b] = "?"
                return [f"{indent}{a}, {b} = {call}"]
            return [f"{indent}{call}"]
        if kind == "pass":
            return [f"{indent}pass"]
        if kind == "return":
            if self.in_function and self.results:
                values = ", ".join(e() for _ in range(self.results))
                return [f"{indent}return {values}"]
            return [f"{indent}return"]
        if kind in ("break", "continue"):
            return [f"{indent}{kind}"]
        bad = self.pick(BAD_STATEMENTS).format(e=e(1), v=self.name())
        if "while" in bad or "range(1 << 62)" in bad:
            self.may_hang = True
        return [indent + line for line in bad.splitlines()]

    # ------------------------------------------------------------------ device functions
    def device_function(self, index: int) -> list[str]:
        """A ``@kaio.gpu_func`` of 0 to 3 scalars (and ``out0``, ``n``) returning nothing, a
        scalar or a pair, with early returns; the kernel's calls follow its signature."""
        child = Gen(self.d, parent=self)
        child.dtypes = self.dtypes
        child.funcs = list(self.funcs)  # it may call the functions before it
        child.results = self.pick([0, 1, 1, 2])
        name = f"dev{index}"
        params = ["out0: f32[:]"]
        child.arrays["out0"] = ("f32", 1)
        nparams = self.d(st.integers(0, 3))
        for k in range(nparams):
            t = self.pick(SCALARS + ["", "kaio.constexpr"])
            params.append(f"a{k}: {t}" if t else f"a{k}")
            child.scalars[f"a{k}"] = t or "?"
        params.append("n: u32")
        child.scalars["n"] = "u32"
        ret = ""
        if child.results == 1 and self.chance(0.6):
            ret = f" -> {self.pick(SCALARS)}"
        elif child.results == 2 and self.chance(0.6):
            ret = f" -> tuple[{self.pick(SCALARS)}, {self.pick(SCALARS)}]"
        body = ["    i = kaio.thread_idx_x()"]
        child.locals["i"] = "u32"
        body += child.block(2, "    ")
        if child.results:
            body.append("    return " + ", ".join(child.expr() for _ in range(child.results)))
        self.may_hang |= child.may_hang
        self.funcs.append((name, nparams, child.results))
        return ["@kaio.gpu_func", f"def {name}({', '.join(params)}){ret}:", *body, "", ""]

    results = 0  # a device function's number of results (the kernel has none)

    def decorator(self) -> str:
        kind = self.pick(["plain", "block", "block", "options"])
        if kind == "plain":
            self.block_size = None
            return ""
        options = {}
        if kind == "block" or self.chance(0.7):
            options["block_size"] = self.pick(BLOCK_SIZES)
        if kind == "options":
            for key, values in OPTIONS.items():
                if self.chance(0.3):
                    options[key] = self.pick(values)
        try:
            self.block_size = eval(options.get("block_size", "None"))  # noqa: S307 (literals)
        except Exception:  # noqa: BLE001
            self.block_size = None
        return "(" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"

    def source(self) -> str:
        params = self.signature()
        functions: list[str] = []
        for k in range(self.pick([0, 0, 1, 2])):
            functions += self.device_function(k)
        body = ["    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()"]
        self.locals["i"] = "u32"
        body += self.block(3, "    ")
        decorator = self.decorator()
        future = "from __future__ import annotations\n\n" if self.chance(0.3) else ""
        return (
            future
            + "import math\n\nimport kaio\nfrom kaio import *\n\nG = 3\n\n\n"
            + "\n".join(functions)
            + f"\n@kaio.gpu_kernel{decorator}\ndef fuzzed({', '.join(params)}):\n"
            + "\n".join(body)
            + "\n"
        )


@st.composite
def kernels(draw) -> Case:
    """One random kernel (a ``Case``; it unpacks as ``(source, constexprs)``)."""
    gen = Gen(draw)
    source = gen.source()
    return Case(source, gen.constexprs, gen.params, gen.block_size, gen.may_hang)


def load(source: str):
    """The kernel of a generated module (None when Python itself rejects the source:
    a SyntaxError, or an error evaluating the signature, which is not kaio's business)."""
    fd, path = tempfile.mkstemp(suffix=".py", prefix="kaio_fuzz_")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    try:
        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except SyntaxError:
            return None, path
        except NameError as e:  # Python evaluating an annotation (DT[:] before 3.14 without
            tb = e.__traceback__  # `from __future__ import annotations`), not kaio
            while tb.tb_next is not None:
                tb = tb.tb_next
            if tb.tb_frame.f_code.co_filename != path:
                raise
            return None, path
        return module.fuzzed, path
    except BaseException:
        os.unlink(path)
        raise


def _llvm() -> bool:
    try:
        import llvmlite  # noqa: F401
    except ImportError:
        return False
    return True


def _ptx(kernel, arch: str, constexprs: dict, backend: str | None = None) -> str | None:
    """The kernel's PTX, or None for a CompileError (ptxas runs outside the time limit, which
    is kaio's: a big kernel's ptxas may be slow on a loaded machine)."""
    try:
        return kernel.ptx(arch, backend=backend, **constexprs)
    except kaio.CompileError:
        return None


def compile_source(source: str, constexprs: dict, arch: str = "sm_90", limit: float = 20.0):
    """Compile a generated kernel: ``"python"`` (Python rejected it), ``"error"`` (a
    CompileError, or a kaio error for a bad decorator option) or ``"ptx"`` (PTX that ptxas
    accepted; needs ptxas). Anything else propagates: an exception of another type, ptxas
    rejecting the PTX (RuntimeError), or ``Timeout``."""
    return check(Case(source, constexprs), arch, limit, llvm=False, simulate=False)


def check(
    case: Case, arch: str = "sm_90", limit: float = 20.0, llvm: bool = True, simulate: bool = True
) -> str:
    """``compile_source``'s outcome for ``case``; when it is ``"ptx"``, the LLVM backend's
    PTX (where llvmlite is installed) must assemble too or be a CompileError, and the
    simulator must run the kernel on random inputs (``"sim"``) or refuse it with a
    LaunchError or SimulationError (``"sim-error"``; a timeout only where the kernel has a
    loop that may not end, ``"sim-timeout"``). NumPy warnings from the simulator fail."""
    path = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kaio.KaioWarning)
            with time_limit(limit):
                try:
                    kernel, path = load(source=case.source)
                except (kaio.CompileError, kaio.LaunchError):
                    return "error"
                except ValueError as e:  # the decorator's backend option
                    if "backend must be" not in str(e):
                        raise
                    return "error"
                if kernel is None:
                    return "python"
                ptx = _ptx(kernel, arch, case.constexprs)
                if ptx is None:
                    return "error"
                llvm_ptx = _ptx(kernel, arch, case.constexprs, "llvm") if llvm and _llvm() else None
            assemble(ptx, arch)
            if llvm_ptx is not None:
                assemble(llvm_ptx, arch)
            if not simulate:
                return "ptx"
            return _simulate(kernel, case, limit)
    finally:
        if path is not None:
            os.unlink(path)


def _inputs(case: Case, rng: np.random.Generator) -> list:
    """Random arguments for ``case``'s parameters (arrays of 64 elements or 8 x 8), the
    constexprs' values in their places."""
    args = []
    for name, kind, t, ndim in case.params:
        if kind == "constexpr":
            args.append(case.constexprs[name])  # in its place: positional, as a user may
            continue
        dtype = case.constexprs.get(t) or getattr(kaio, t)
        np_dtype = np.dtype(dtype.np_dtype)
        shape = (64,) if ndim == 1 else (8, 8) if ndim == 2 else ()
        if np_dtype.kind in "iu":
            values = rng.integers(0, 40, shape)
        elif np_dtype.kind == "b":
            values = rng.random(shape) < 0.5
        else:
            values = rng.standard_normal(shape) * 4
        if name == "n":
            values = rng.integers(0, 7)
        value = np.asarray(values).astype(np_dtype)
        args.append(value if ndim else value.item() if np_dtype.kind in "iub" else value[()])
    return args


def _simulate(kernel, case: Case, limit: float) -> str:
    rng = np.random.default_rng(zlib.crc32(case.source.encode()))
    try:
        args = _inputs(case, rng)
    except (AttributeError, TypeError):  # a parameter Python accepted, kaio refused
        return "error"
    grid = int(rng.integers(1, 3))
    inputs = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    try:
        launch = kernel.sim[grid] if case.block is not None else kernel.sim[grid, 32]
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # NumPy's overflow, invalid...
            with time_limit(limit):
                launch(*args)
    except (kaio.LaunchError, kaio.SimulationError):
        return "sim-error"
    except Timeout:
        if case.may_hang:
            return "sim-timeout"
        raise
    _same_unoptimized(kernel, case, grid, inputs, args, limit)
    return "sim"


def _same_unoptimized(kernel, case: Case, grid: int, inputs: list, outputs: list, limit: float):
    """The IR straight from the frontend (only unrolled: no folding, propagation or motion)
    gives the optimized IR's outputs bit for bit in the simulator (NaNs equal to NaNs): the
    passes keep the simulator's semantics. Skipped where only the unoptimized run fails (a
    pass may drop a dead out-of-bounds load)."""
    from kaio.frontend import compile_kernel
    from kaio.ir.passes import unroll
    from kaio.sim.engine import simulate

    arrays = [a for a in inputs if isinstance(a, np.ndarray)]
    fn = compile_kernel(kernel, case.constexprs, ("C",) * len(arrays))
    unroll(fn)
    values = dict(zip([p[0] for p in case.params], inputs, strict=True))
    scalars = {p.value: values[p.source] for p in fn.params if p.role == "scalar"}
    block = kernel.block_size if case.block is not None else 32
    block = (block,) if isinstance(block, int) else tuple(block)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with time_limit(limit):
                by_array = dict(zip(fn.param_arrays, arrays, strict=True))
                simulate(fn, (grid,), block, by_array, scalars)
    except (kaio.LaunchError, kaio.SimulationError, Timeout):
        return
    got = [a for a in outputs if isinstance(a, np.ndarray)]
    for index, (a, b) in enumerate(zip(got, arrays, strict=True)):
        bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        differ = a.view(bits) != b.view(bits)
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            differ &= ~(np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))
        if differ.any():
            where = tuple(int(k) for k in np.argwhere(differ)[0])
            raise AssertionError(
                f"array {index} differs between the optimized and the unoptimized IR at "
                f"{where}: {a[where]!r} vs {b[where]!r}"
            )


# ---------------------------------------------------------------------- mutations
_BINOPS = [ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift]
_BINOPS += [ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor, ast.MatMult]
_CMPOPS = [ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq, ast.Is, ast.In]
_UNARY = [ast.USub, ast.UAdd, ast.Not, ast.Invert]
_CONSTANTS = [0, 1, -1, 2, 3, 31, 32, 255, 2**31, 2**40, -(2**63), 10**30, 0.5, -0.0, 1e30]
_CONSTANTS += [True, False, None, "x"]
_ANNOTATIONS = ["f32[:]", "i32[:]", "f16[:, :]", "u8", "f64", "kaio.constexpr", "bf16x2[:]"]
_ANNOTATIONS += ["f32[0]", "int", "u32", "bool_", "i64[:, :, :]", "kaio.f16x2"]
MUTATIONS = ["binop", "cmpop", "boolop", "unary", "constant", "delete", "duplicate"]
MUTATIONS += ["annotation", "typename", "name"]


@dataclass
class Mutant:
    """A real kernel's function with a few AST mutations: ``source`` (the mutated ``def``,
    no decorator), the original ``kernel`` (its globals and options) and ``constexprs``;
    ``make`` (a catalog case's argument maker) lets the simulator run it too."""

    source: str
    kernel: object
    constexprs: dict
    mutations: list
    make: object = None


def mutation_targets(full: bool = False) -> list[tuple]:
    """(kernel, constexprs, make) of real kernels: the catalog's cases and the examples'
    kernels; ``full`` adds every specialization kaio_ops ships (a few seconds to list)."""
    key = ("full" if full else "fast",)
    if key in _TARGETS:
        return _TARGETS[key]
    from tests.catalog import CASES

    targets = [(c.kernel, c.constexprs, c.make) for c in CASES]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("quickstart", "tensor_core_matmul"):
        path = os.path.join(root, "examples", f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"kaio_fuzz_example_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        targets += [
            (k, {}, None)
            for k in vars(module).values()
            if isinstance(k, kaio.Kernel) and not k.constexpr_names
        ]
    if full:
        from bench.backends import kaio_ops_specializations

        smallest: dict = {}  # one specialization of each kernel object, its smallest tiles
        for _, kernel, consts in kaio_ops_specializations():
            size = sum(v for v in consts.values() if isinstance(v, int))
            if id(kernel) not in smallest or size < smallest[id(kernel)][0]:
                smallest[id(kernel)] = (size, kernel, consts)
        targets += [(kernel, consts, None) for _, kernel, consts in smallest.values()]
    targets = [t for t in targets if t[0].pyfunc.__closure__ is None]
    _TARGETS[key] = targets
    return targets


_TARGETS: dict = {}


def _statement_lists(tree) -> list[list]:
    return [
        block
        for node in ast.walk(tree)
        for block in (getattr(node, f, None) for f in ("body", "orelse"))
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt)
    ]


def _mutate(tree, kind: str, pick) -> bool:
    """Apply one mutation of ``kind`` to ``tree`` in place (False: nothing to mutate)."""
    nodes = list(ast.walk(tree))
    if kind == "binop":
        found = [n for n in nodes if isinstance(n, ast.BinOp | ast.AugAssign)]
        if found:
            pick(found).op = pick(_BINOPS)()
    elif kind == "cmpop":
        found = [n for n in nodes if isinstance(n, ast.Compare)]
        if found:
            node = pick(found)
            node.ops = [pick(_CMPOPS)() for _ in node.ops]
    elif kind == "boolop":
        found = [n for n in nodes if isinstance(n, ast.BoolOp)]
        if found:
            node = pick(found)
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "unary":
        found = [n for n in nodes if isinstance(n, ast.UnaryOp)]
        if found:
            pick(found).op = pick(_UNARY)()
        else:
            found = [n for n in nodes if isinstance(n, ast.Return | ast.Assign) and n.value]
            if found:
                node = pick(found)
                node.value = ast.UnaryOp(pick(_UNARY)(), node.value)
    elif kind == "constant":
        found = [n for n in nodes if isinstance(n, ast.Constant) and not isinstance(n.value, str)]
        if found:
            pick(found).value = pick(_CONSTANTS)
    elif kind in ("delete", "duplicate"):
        blocks = _statement_lists(tree)
        block = pick(blocks)
        k = pick(range(len(block)))
        if kind == "delete":
            del block[k]
            if not block:
                block.append(ast.Pass())
        else:
            block.insert(k, block[k])
    elif kind == "annotation":
        found = [a for a in tree.args.args] + [n for n in nodes if isinstance(n, ast.AnnAssign)]
        if found:
            node = pick(found)
            text = pick(_ANNOTATIONS)
            node.annotation = ast.parse(text, mode="eval").body
    elif kind == "typename":
        found = [
            n
            for n in nodes
            if (isinstance(n, ast.Name) and n.id in SCALARS)
            or (isinstance(n, ast.Attribute) and n.attr in SCALARS)
        ]
        if found:
            node = pick(found)
            setattr(node, "id" if isinstance(node, ast.Name) else "attr", pick(SCALARS))
    else:
        found = [n for n in nodes if isinstance(n, ast.Name)]
        names = sorted({n.id for n in found})
        if found:
            pick(found).id = pick(names)
    return True


@st.composite
def mutants(draw, full: bool = False) -> Mutant:
    """A real kernel with 1 to 3 random mutations (see ``mutation_targets``)."""
    from kaio.frontend.resolve import parse

    kernel, constexprs, make = draw(st.sampled_from(mutation_targets(full)))
    tree = parse(kernel.pyfunc).tree
    import copy

    tree = copy.deepcopy(tree)
    tree.decorator_list = []
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(MUTATIONS))
        kinds.append(kind)
        _mutate(tree, kind, lambda options: draw(st.sampled_from(list(options))))
    ast.fix_missing_locations(tree)
    return Mutant(ast.unparse(tree) + "\n", kernel, dict(constexprs), kinds, make)


def _define(mutant: Mutant, path: str):
    """The mutated function, defined from ``path`` in a copy of the original's globals, and
    made a kernel with the original's options."""
    import __future__

    original = mutant.kernel
    flags = original.pyfunc.__code__.co_flags & __future__.annotations.compiler_flag
    code = compile(mutant.source, path, "exec", flags=flags, dont_inherit=True)
    scope = dict(original.pyfunc.__globals__)
    try:
        exec(code, scope)  # noqa: S102 (the fuzzer's own source)
    except NameError:  # an annotation naming what the module does not import: Python's
        return None
    fn = scope[original.pyfunc.__name__]
    return kaio.Kernel(
        fn,
        block_size=original.block_size,
        arch=original.arch,
        debug=original.debug,
        backend=original.backend,
        fastmath=original.fastmath,
    )


def _grown(kernel, mutant: Mutant, limit: float) -> bool:
    """Whether a mutant whose compile ran past the time limit is slow rather than hung: over
    10 times the original's size in the frontend's IR (a mutated tile count can unroll into
    tens of thousands of instructions, which the passes take minutes over), or of a size with
    the original's and the original itself takes over a tenth of the limit to lower and
    optimize (kaio_ops' largest kernels take seconds; a loaded machine, many more)."""
    import time

    from kaio.frontend import compile_kernel
    from kaio.ir.passes import optimize, walk

    def lowered(k):
        return compile_kernel(k, mutant.constexprs, ("C",) * len(k.param_names))

    with time_limit(10 * limit):  # (the frontend alone takes a while over such a mutant)
        original = lowered(mutant.kernel)
        if sum(1 for _ in walk(lowered(kernel).body)) > 10 * sum(1 for _ in walk(original.body)):
            return True
        start = time.perf_counter()
        optimize(lowered(mutant.kernel))
        return time.perf_counter() - start > limit / 10


def check_mutant(mutant: Mutant, arch: str = "sm_90a", limit: float = 30.0) -> str:
    """``"python"`` (Python rejected the mutant), ``"error"`` (a CompileError, or a
    constexpr the mutant no longer takes or newly needs: ``"skip"``) or ``"ptx"`` (ptxas
    accepted it; ``"big"``: the compile ran past the limit, and ``_grown`` says it is slow,
    not hung); for a catalog case, the simulator then runs it on the case's
    arguments (``"sim"``) or refuses it with a LaunchError or SimulationError or a timeout (a
    mutated loop may not end). Anything else propagates."""
    fd, path = tempfile.mkstemp(suffix=".py", prefix="kaio_mutant_")
    with os.fdopen(fd, "w") as f:
        f.write(mutant.source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kaio.KaioWarning)
            with time_limit(limit):
                try:
                    kernel = _define(mutant, path)
                except kaio.CompileError:
                    return "error"
                except SyntaxError:
                    return "python"
                if kernel is None:
                    return "python"
                if set(kernel.constexpr_names) != set(mutant.constexprs):
                    return "skip"
            try:
                with time_limit(limit):
                    ptx = _ptx(kernel, arch, mutant.constexprs)
            except Timeout:
                if _grown(kernel, mutant, limit):
                    return "big"
                raise
            except kaio.LaunchError:  # a constexpr value the mutant's annotations refuse
                return "error"
            if ptx is None:
                return "error"
            assemble(ptx, arch)
            if mutant.make is None:
                return "ptx"
            args, grid, block, shared = mutant.make(np.random.default_rng(29))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", RuntimeWarning)
                    with time_limit(min(limit, 5.0)):
                        kernel.sim[grid, block, None, shared](*args, **mutant.constexprs)
            except (kaio.LaunchError, kaio.SimulationError, Timeout):
                return "sim-error"
            return "sim"
    finally:
        os.unlink(path)
