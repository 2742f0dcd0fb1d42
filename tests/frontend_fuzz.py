"""Random kernels for fuzzing the frontend: hypothesis draws Python source, mostly well-typed
DSL code (statements, expressions, types, builtins, shared and local arrays, loops) with bad
constructs mixed in (closures, lambdas, lists, strings, wrong arities, bad types, names that do
not exist, control flow outside loops...). ``compile_source`` writes one to a module, imports
it and compiles it to PTX: the compiler must either give PTX that ptxas accepts or raise
``kaio.CompileError``, and must do so within a time limit.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import tempfile
from contextlib import contextmanager

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
        raise Timeout(f"compiling took more than {seconds} s")

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


class Gen:
    """Draws one kernel: ``source()`` gives the module text and ``constexprs`` its values."""

    def __init__(self, draw):
        self.d = draw
        self.arrays: dict[str, tuple[str, int]] = {}  # name -> (dtype, ndim)
        self.scalars: dict[str, str] = {}  # readable scalar names -> type
        self.locals: dict[str, str] = {}  # assignable variables -> type
        self.constexprs: dict[str, int] = {}
        self.counter = 0
        self.loop_depth = 0
        self.shared: list[tuple[str, str, int]] = []  # name, dtype, size

    # ------------------------------------------------------------------ helpers
    def pick(self, options):
        return self.d(st.sampled_from(options))

    def chance(self, p: float) -> bool:
        return self.d(st.integers(0, 999)) < int(p * 1000)

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    # ------------------------------------------------------------------ signature
    def signature(self) -> list[str]:
        params = ["out0: f32[:]"]
        self.arrays["out0"] = ("f32", 1)
        for k in range(self.d(st.integers(0, 4))):
            kind = self.pick(["array", "array2", "scalar", "scalar", "constexpr", "bad"])
            name = f"p{k}"
            if kind.startswith("array"):
                t = self.pick(SCALARS)
                ndim = 2 if kind == "array2" else 1
                params.append(f"{name}: {t}[{', '.join([':'] * ndim)}]")
                self.arrays[name] = (t, ndim)
            elif kind == "scalar":
                t = self.pick(SCALARS)
                params.append(f"{name}: {t}")
                self.scalars[name] = t
            elif kind == "constexpr":
                params.append(f"{name}: kaio.constexpr")
                self.constexprs[name] = self.d(st.integers(-3, 70))
                self.scalars[name] = "const"
            else:
                params.append(self.pick([f"{name}", f"{name}: int", f"{name}: list", f"{name}=3"]))
        params.append("n: u32")
        self.scalars["n"] = "u32"
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

    def expr(self, depth: int = 3) -> str:
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
            ]
        )
        e = self.expr
        if kind == "bin":
            return f"({e(depth - 1)} {self.pick(BINOPS)} {e(depth - 1)})"
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
            return f"kaio.{self.pick(SCALARS)}({e(depth - 1)})"
        if kind == "select":
            return f"kaio.select({e(depth - 1)}, {e(depth - 1)}, {e(depth - 1)})"
        if kind == "tuple":
            return f"({e(depth - 1)}, {e(depth - 1)})[{self.pick(['0', '1'])}]"
        if kind == "bitcast":
            return f"kaio.bitcast({e(depth - 1)}, {self.pick(SCALARS)})"
        if kind == "shared" and self.shared:
            name, _, size = self.pick(self.shared)
            return f"{name}[{self.index(depth - 1)} % {size}]"
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
                    bounds = self.pick(["3", "0, 4", "2, 8, 3", "1"])
                    head = f"{indent}for {v} in kaio.static_range({bounds}):"
                    self.scalars[v] = "const"
                else:
                    head = f"{indent}while {e()}:"
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
            t = self.pick(ATOMIC_TYPES + ["f16", "u8", "bool_"])
            size = self.pick([1, 32, 64, 100])
            self.shared.append((name, t, size))
            return [
                f"{indent}{name} = kaio.shared({t}, ({size},))",
                f"{indent}{name}[kaio.thread_idx_x() % {size}] = {e(1)}",
            ]
        if kind == "local":
            name = self.fresh()
            t = self.pick(SCALARS)
            return [
                f"{indent}{name} = kaio.local({t}, 4)",
                f"{indent}{name}[{self.pick(['0', '3', 'kaio.lane_id() % 4'])}] = {e(1)}",
                f"{indent}out0[0] = {name}[1]",
            ]
        if kind == "pass":
            return [f"{indent}pass"]
        if kind == "return":
            return [f"{indent}return"]
        if kind in ("break", "continue"):
            return [f"{indent}{kind}"]
        bad = self.pick(BAD_STATEMENTS).format(e=e(1), v=self.name())
        return [indent + line for line in bad.splitlines()]

    def source(self) -> str:
        params = self.signature()
        body = ["    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()"]
        self.locals["i"] = "u32"
        body += self.block(3, "    ")
        block = self.pick(["", "(block_size=64)", "(block_size=(8, 4))"])
        return (
            "import math\n\nimport kaio\nfrom kaio import *\n\nG = 3\n\n\n"
            f"@kaio.gpu_kernel{block}\ndef fuzzed({', '.join(params)}):\n" + "\n".join(body) + "\n"
        )


@st.composite
def kernels(draw) -> tuple[str, dict]:
    """(module source, constexpr values) of one random kernel."""
    gen = Gen(draw)
    return gen.source(), gen.constexprs


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
        return module.fuzzed, path
    except BaseException:
        os.unlink(path)
        raise


def compile_source(source: str, constexprs: dict, arch: str = "sm_90", limit: float = 20.0):
    """Compile a generated kernel: ``"python"`` (Python rejected it), ``"error"`` (a
    CompileError) or ``"ptx"`` (PTX that ptxas accepted; needs ptxas). Anything else
    propagates: an exception of another type, ptxas rejecting the PTX (RuntimeError), or
    ``Timeout``."""
    kernel, path = None, None
    try:
        with time_limit(limit):
            try:
                kernel, path = load(source)
            except kaio.CompileError:
                return "error"
            if kernel is None:
                return "python"
            try:
                ptx = kernel.ptx(arch, **constexprs)
            except kaio.CompileError:
                return "error"
        assemble(ptx, arch)
        return "ptx"
    finally:
        if path is not None:
            os.unlink(path)
