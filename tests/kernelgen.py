"""Random valid kernels for differential testing (issue 29): every kernel ``generate`` writes is
well-typed, assigns each variable on every path before reading it, never divides by zero,
shifts by less than the width and keeps barriers and shuffles in code all threads run, so its
result is defined: the simulator, the GPU (either backend) and the unoptimized IR must agree
on it bit for bit.

A kernel has 3 inputs (f32, i32, u32 arrays) and 2 outputs: every integer variable is stored
as u64 to ``oi[g * NI + k]``, every float one as f64 to ``of[g * NF + k]`` (exact widenings).
The body mixes integer widths and signedness (explicit conversions), float arithmetic that
rounds the same everywhere (``+ - * /``, ``sqrt``, ``fma``, ``min``/``max``, conversions), ``if``/
``else`` (with variables first assigned in both branches), ``range()`` loops with run-time
and constant bounds, ``break`` and ``continue``, warp shuffles and shared memory with
barriers. Approximate math (``exp``, ``sin``...) is left out: the GPU's approximations are not
the simulator's bit for bit.

``run_case`` runs one kernel in the simulator twice (the optimized IR, and the IR straight
from the frontend with only the unroll pass) and returns the outputs; ``check_compiles`` makes
its PTX with both backends and assembles it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import numpy as np

INT_TYPES = ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"]
FLOAT_TYPES = ["f32", "f64"]
BITS = {"i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64}


class _Gen:
    def __init__(self, rng: np.random.Generator, block: int):
        self.rng = rng
        self.threads = block
        self.vars: list[tuple[str, str]] = []  # (name, type) assigned on every path so far
        self.fixed = {"tid", "g"}  # read, never assigned (loop variables join while in loops)
        self.lines: list[str] = []
        self.loop_depth = 0
        self.fresh = 0
        self.helper: tuple[str, str] | None = None  # the device function's parameter types

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def emit(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    # ------------------------------------------------------------------ expressions
    def leaf(self, t: str) -> str:
        same = [n for n, vt in self.vars if vt == t]
        if same and self.chance(0.6):
            return self.choice(same)
        if self.chance(0.3):
            if t in FLOAT_TYPES:
                return f"{t}({self.choice(['0.5', '1.25', '-3.0', '7.0', '1e-3', '100.0'])})"
            return f"{t}({int(self.rng.integers(0, 100))})"
        name, _ = self.choice(self.vars)
        return f"{t}({name})"

    def expr(self, t: str, depth: int) -> str:
        if depth <= 0 or self.chance(0.3):
            return self.leaf(t)
        a, b = self.expr(t, depth - 1), self.expr(t, depth - 1)
        if t in FLOAT_TYPES:
            k = int(self.rng.integers(9))
            if k < 3:
                return f"({a} {'+-*'[k]} {b})"
            if k == 3:
                return f"({a} / {b})"
            if k == 4:
                return f"kaio.sqrt(kaio.abs({a}))"
            if k == 5:
                return f"kaio.fma({a}, {b}, {self.expr(t, depth - 1)})"
            if k == 6:
                return f"kaio.{self.choice(['min', 'max'])}({a}, {b})"
            if k == 7:
                return f"({a} if {self.cond(depth - 1)} else {b})"
            return f"{t}({self.expr(self.choice(INT_TYPES), depth - 1)})"
        k = int(self.rng.integers(10))
        if k < 6:
            return f"({a} {self.choice(['+', '-', '*', '&', '|', '^'])} {b})"
        if k == 6:
            width = BITS[t]
            return f"({a} {self.choice(['<<', '>>'])} (u32({b}) & {width - 1}))"
        if k == 7:
            return f"({a} {self.choice(['//', '%'])} (({b} & {t}(15)) + {t}(1)))"
        if k == 8:
            return f"({a} if {self.cond(depth - 1)} else {b})"
        if self.chance(0.5):
            return f"{t}({self.expr(self.choice(FLOAT_TYPES), depth - 1)})"
        return f"{t}({self.expr(self.choice(INT_TYPES), depth - 1)})"

    def cond(self, depth: int) -> str:
        t = self.choice(INT_TYPES + FLOAT_TYPES)
        c = f"{self.expr(t, max(depth, 0))} {self.choice(['<', '<=', '>', '>=', '==', '!='])} "
        c += self.expr(t, max(depth, 0))
        if self.chance(0.2) and ("tid", "u32") in self.vars:
            c = f"({c}) {self.choice(['and', 'or'])} (tid {self.choice(['<', '>='])} u32(16))"
        return c

    # ------------------------------------------------------------------ statements
    def assignable(self) -> list[tuple[str, str]]:
        return [(n, t) for n, t in self.vars if n not in self.fixed]

    def assign(self, indent: int) -> None:
        name, t = self.choice(self.assignable())
        if self.helper and self.chance(0.15):
            ta, tb = self.helper
            call = f"helper({ta}({self.expr(ta, 1)}), {tb}({self.expr(tb, 1)}))"
            self.emit(indent, f"{name} = {t}({call})")
        elif self.chance(0.3) and t in INT_TYPES:
            op = self.choice(["+=", "-=", "^=", "|="])
            self.emit(indent, f"{name} {op} {self.expr(t, 2)}")
        else:
            self.emit(indent, f"{name} = {t}({self.expr(t, 3)})")

    def block(self, indent: int, n: int, depth: int, uniform: bool) -> None:
        for _ in range(n):
            self.statement(indent, depth, uniform)

    def statement(self, indent: int, depth: int, uniform: bool) -> None:
        k = int(self.rng.integers(12))
        if depth <= 0 or k < 4:
            self.assign(indent)
        elif k < 6:  # if/else, maybe a new variable first assigned in both branches
            new = None
            if self.chance(0.5):
                self.fresh += 1
                new = (f"w{self.fresh}", self.choice(INT_TYPES + FLOAT_TYPES))
            self.emit(indent, f"if {self.cond(2)}:")
            saved = list(self.vars)
            self.block(indent + 1, int(self.rng.integers(1, 3)), depth - 1, False)
            if new:
                self.emit(indent + 1, f"{new[0]} = {new[1]}({self.expr(new[1], 2)})")
            self.vars = list(saved)
            self.emit(indent, "else:")
            self.block(indent + 1, int(self.rng.integers(1, 3)), depth - 1, False)
            if new:
                self.emit(indent + 1, f"{new[0]} = {new[1]}({self.expr(new[1], 2)})")
            self.vars = saved + ([new] if new else [])
        elif k < 8:  # a loop, maybe with break and continue
            self.fresh += 1
            j = f"j{self.fresh}"
            if self.chance(0.5):
                bound = f"range({int(self.rng.integers(1, 5))})"
            else:
                bound = f"range(u32({self.leaf('u32')}) & u32(7))"
            self.emit(indent, f"for {j} in {bound}:")
            saved = list(self.vars)
            if self.chance(0.4):
                self.emit(indent + 1, f"if {self.cond(1)}:")
                self.emit(indent + 2, self.choice(["break", "continue"]))
            self.vars = self.vars + [(j, "i32" if "range(u32" not in bound else "u32")]
            self.fixed.add(j)
            self.loop_depth += 1
            self.block(indent + 1, int(self.rng.integers(1, 3)), depth - 1, False)
            self.loop_depth -= 1
            if self.chance(0.3):
                self.emit(indent + 1, f"if {self.cond(1)}:")
                self.emit(indent + 2, self.choice(["break", "continue"]))
            self.vars = saved
        elif k < 10 and uniform and any(t in ("i32", "u32", "f32") for _, t in self.assignable()):
            # a warp shuffle, all lanes present
            name, t = self.choice(
                [(n, t) for n, t in self.assignable() if t in ("i32", "u32", "f32")]
            )
            fn = self.choice(["shfl_xor", "shfl_down", "shfl_up", "shfl_idx"])
            arg = int(self.rng.integers(0, 32 if fn == "shfl_idx" else 16))
            self.emit(indent, f"{name} = kaio.{fn}({name}, {arg})")
        elif uniform:  # shared memory through barriers
            name, t = self.choice(self.assignable())
            shift = int(self.rng.integers(1, self.threads))
            self.emit(indent, f"sm[tid] = i32({self.expr(t, 2)})")
            self.emit(indent, "kaio.sync_threads()")
            self.emit(indent, f"{name} = {t}(sm[(tid + u32({shift})) % u32({self.threads})])")
            self.emit(indent, "kaio.sync_threads()")
        else:
            self.assign(indent)


def generate(seed: int) -> tuple[str, int, int, int]:
    """Python source of one random valid kernel ``fuzzed`` and its block size and numbers of
    integer and float variables: ``(source, block, ni, nf)``."""
    rng = np.random.default_rng(seed)
    block = int(rng.choice([32, 64]))
    g = _Gen(rng, block)
    head = [
        "import kaio",
        "from kaio import f32, f64, i8, u8, i16, u16, i32, u32, i64, u64",
        "",
        "",
        f"@kaio.gpu_kernel(block_size={block})",
        "def fuzzed(xf: f32[:], xi: i32[:], xu: u32[:], oi: u64[:], of: f64[:]):",
        "    tid = kaio.thread_idx_x()",
        "    g = tid + kaio.block_idx_x() * kaio.block_dim_x()",
        f"    sm = kaio.shared(i32, ({block},))",
    ]
    ta, tb = g.choice(INT_TYPES + FLOAT_TYPES), g.choice(INT_TYPES + FLOAT_TYPES)
    h = _Gen(rng, block)  # a device function with an early return
    h.vars = [("a", ta), ("b", tb)]
    helper = [
        "@kaio.gpu_func",
        f"def helper(a: {ta}, b: {tb}) -> {ta}:",
        f"    if {h.cond(1)}:",
        f"        return {ta}({h.expr(ta, 2)})",
        f"    return {ta}({h.expr(ta, 2)})",
        "",
        "",
    ]
    head[4:4] = helper
    g.helper = (ta, tb)
    g.vars = [("tid", "u32"), ("g", "u32")]
    for k in range(int(rng.integers(4, 8))):
        t = g.choice(INT_TYPES + FLOAT_TYPES)
        source = g.choice(["xf[g]", "xi[g]", "xu[g]", f"xi[(g + u32({k})) % u32({block})]"])
        name = f"v{k}"
        g.emit(1, f"{name}: {t} = {t}({source})")
        g.vars.append((name, t))
    g.block(1, int(rng.integers(4, 10)), 3, True)
    ints = [n for n, t in g.vars if t in INT_TYPES]
    floats = [n for n, t in g.vars if t in FLOAT_TYPES]
    for k, n in enumerate(ints):
        g.emit(1, f"oi[g * u32({len(ints)}) + u32({k})] = u64({n})")
    for k, n in enumerate(floats):
        g.emit(1, f"of[g * u32({max(len(floats), 1)}) + u32({k})] = f64({n})")
    return "\n".join(head + g.lines) + "\n", block, len(ints), len(floats)


_DIR = tempfile.mkdtemp(prefix="kaio_kernelgen_")


def load(source: str, name: str):
    """Import ``source`` from a file (kernels need their source on disk); its ``fuzzed``."""
    path = os.path.join(_DIR, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.fuzzed


GRID = 2


def inputs(seed: int, block: int, ni: int, nf: int) -> tuple:
    """Random inputs and poisoned outputs for one kernel."""
    rng = np.random.default_rng(seed + 1_000_003)
    n = GRID * block
    xf = (rng.standard_normal(n) * 50).astype(np.float32)
    xi = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    xi[::3] = rng.integers(-100, 100, len(xi[::3]))  # small values too
    xu = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    oi = np.full(n * max(ni, 1), 0xDEADBEEFDEADBEEF, np.uint64)
    of = np.full(n * max(nf, 1), np.nan, np.float64)
    return xf, xi, xu, oi, of


def simulate_unoptimized(kernel, block: int, args: tuple) -> None:
    """Run the frontend's IR (only unrolled: no folding, propagation or motion) in the
    simulator: a differential check of the optimization passes against the simulator."""
    from kaio.frontend import compile_kernel
    from kaio.ir.passes import unroll
    from kaio.sim.engine import simulate

    fn = compile_kernel(kernel, {}, ("C",) * 5)
    unroll(fn)
    arrays = dict(zip(fn.param_arrays, args, strict=True))
    simulate(fn, (GRID,), (block,), arrays, {})


def check_compiles(kernel, archs=("sm_80", "sm_90"), llvm: bool = True) -> None:
    """PTX from the emitter (and LLVM where llvmlite is installed) assembles for ``archs``."""
    from kaio.ptx.ptxas import assemble, find_ptxas

    backends = ["ptx"]
    if llvm:
        try:
            import llvmlite  # noqa: F401

            backends.append("llvm")
        except ImportError:
            pass
    for backend in backends:
        for arch in archs:
            text = kernel.ptx(arch=arch, backend=backend)
            if find_ptxas() is not None:
                assemble(text, arch)
