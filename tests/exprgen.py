"""Random typed expression kernels for property tests, with an independent evaluator.

An expression tree over three input arrays ``a``, ``b``, ``c`` (random scalar types) is
rendered as a kernel ``out[i] = <expr>``; ``evaluate`` computes the same expression element by
element with Python integers and NumPy scalars, following API.md's rules (written again here,
independently of kaio's implementation).
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

INTS = ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"]
FLOATS = ["f16", "bf16", "f32", "f64"]
BITS = {
    "i8": 8,
    "u8": 8,
    "i16": 16,
    "u16": 16,
    "i32": 32,
    "u32": 32,
    "i64": 64,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "bool_": 8,
}
NP = {
    "i8": np.int8,
    "u8": np.uint8,
    "i16": np.int16,
    "u16": np.uint16,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
    "u64": np.uint64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "f32": np.float32,
    "f64": np.float64,
    "bool_": np.bool_,
}


def is_float(t):
    return t in FLOATS


def promote(a, b):
    """API.md section 1, re-derived: the common type of two typed operands."""
    if a == b:
        return a
    if a == "bool_":
        return b
    if b == "bool_":
        return a
    if is_float(a) and is_float(b):
        if BITS[a] == BITS[b]:
            return "f32"
        w = a if BITS[a] > BITS[b] else b
        return w if BITS[w] >= 32 else "f32"
    if is_float(a):
        return a
    if is_float(b):
        return b
    if BITS[a] != BITS[b]:
        return a if BITS[a] > BITS[b] else b
    return a if a.startswith("u") else b


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple = ()
    value: object = None  # leaves: variable name or literal


def wrap(v: int, t: str) -> int:
    bits = BITS[t]
    v &= (1 << bits) - 1
    if t.startswith("i") and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


MANTISSA = {"f16": 11, "bf16": 8, "f32": 24}


def int_to_float(v: int, dst: str):
    """An integer rounded once, to nearest even, to float type dst (exact integer math)."""
    if dst == "f64":
        return np.float64(float(v))  # Python's int -> float is correctly rounded
    m = MANTISSA[dst]
    sign, a = (-1 if v < 0 else 1), abs(v)
    e = a.bit_length() - m
    if e > 0:
        q, r = divmod(a, 1 << e)
        half = 1 << (e - 1)
        if r > half or (r == half and q & 1):
            q += 1
        a = q << e
    with np.errstate(over="ignore"):
        return NP[dst](np.float64(sign * a))  # exact in float64; overflows to inf


def to_type(v, src: str, dst: str):
    """Convert a value of type src (Python int, bool or NumPy float) to dst, PTX's rules."""
    if dst == "bool_":
        return bool(v != 0)
    if src == "bool_":
        v = int(v)
    if is_float(dst):
        if not is_float(src):
            return int_to_float(int(v), dst)
        with np.errstate(over="ignore"):
            return NP[dst](np.float64(v))  # float64 holds every narrower value exactly
    if is_float(src):
        x = float(v)
        bits = BITS[dst]
        lo, hi = (
            (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if dst.startswith("i") else (0, 2**bits - 1)
        )
        if math.isnan(x):
            return 0
        if math.isinf(x):
            return hi if x > 0 else lo
        return max(lo, min(hi, math.trunc(x)))
    return wrap(int(v), dst)


class Gen:
    """Builds a random typed expression over typed inputs a, b, c."""

    def __init__(self, draw, types):
        self.draw = draw
        self.types = types  # name -> type

    def expr(self, depth):
        """(node, type) of a random expression."""
        d = self.draw
        if depth == 0 or d(st.integers(0, 3)) == 0:
            name = d(st.sampled_from(sorted(self.types)))
            return Node("var", value=name), self.types[name]
        kind = d(
            st.sampled_from(
                [
                    "arith",
                    "arith",
                    "bits",
                    "shift",
                    "div",
                    "cmp_select",
                    "convert",
                    "minmax",
                    "unary",
                    "literal",
                ]
            )
        )
        a, ta = self.expr(depth - 1)
        if kind == "convert":
            t = d(st.sampled_from(INTS + FLOATS))
            if ta == "bf16" or t == "bf16":
                t = "f32" if t == "bf16" else t
            return Node("cvt", (a,), t), t
        if kind == "unary":
            if is_float(ta):
                return Node(d(st.sampled_from(["neg", "abs"])), (a,)), ta
            return Node(d(st.sampled_from(["neg", "invert"])), (a,)), ta
        if kind == "literal":
            if is_float(ta):
                lit = d(st.sampled_from([0.5, -1.25, 3.0, 1e-3]))
                t = promote(ta, "f64" if ta == "f64" else "f32")
            else:
                bits = BITS[ta]
                lit = (
                    d(st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))
                    if ta.startswith("i")
                    else d(st.integers(0, 2**bits - 1))
                )
                t = ta
            return Node("add_lit", (a,), lit), t
        b, tb = self.expr(depth - 1)
        t = promote(ta, tb)
        if kind == "arith":
            return Node(d(st.sampled_from(["add", "sub", "mul"])), (a, b)), t
        if kind == "minmax":
            return Node(d(st.sampled_from(["min", "max"])), (a, b)), t
        if kind == "cmp_select":
            c, tc = self.expr(depth - 1)
            t2 = promote(tb, tc)
            return Node(d(st.sampled_from(["lt", "le", "eq", "ne"])), (a, b, c)), t2
        if is_float(t):
            return Node(d(st.sampled_from(["add", "mul", "truediv"])), (a, b)), t
        if kind == "bits":
            return Node(d(st.sampled_from(["and", "or", "xor"])), (a, b)), t
        if kind == "shift":
            return Node(d(st.sampled_from(["shl", "shr"])), (a, b)), ta
        return Node(d(st.sampled_from(["floordiv", "mod"])), (a, b)), t


_SYM = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "and": "&",
    "or": "|",
    "xor": "^",
    "lt": "<",
    "le": "<=",
    "eq": "==",
    "ne": "!=",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "shl": "<<",
    "shr": ">>",
}


def render(node: Node, types) -> str:
    """Python source of the expression (inputs read as a[i], b[i], c[i])."""
    op, args = node.op, node.args
    r = [render(x, types) for x in args]
    if op == "var":
        return f"{node.value}[i]"
    if op == "cvt":
        return f"kaio.{node.value}({r[0]})"
    if op == "neg":
        return f"(-{r[0]})"
    if op == "invert":
        return f"(~{r[0]})"
    if op == "abs":
        return f"kaio.abs({r[0]})"
    if op == "add_lit":
        return f"({r[0]} + {node.value!r})"
    if op in ("min", "max"):
        return f"kaio.{op}({r[0]}, {r[1]})"
    if op in ("lt", "le", "eq", "ne"):
        return f"({r[1]} if {r[0]} {_SYM[op]} {r[1]} else {r[2]})"
    if op in ("floordiv", "mod"):
        return f"({r[0]} {_SYM[op]} (({r[1]} & 127) | 1))"
    if op == "shl" or op == "shr":
        return f"({r[0]} {_SYM[op]} kaio.u32({r[1]}))"
    return f"({r[0]} {_SYM[op]} {r[1]})"


def evaluate(node: Node, types: dict, row: dict):
    """(value, type) of the expression for one element; ints are Python ints, floats NumPy."""
    op, args = node.op, node.args
    if op == "var":
        t = types[node.value]
        v = row[node.value]
        return (int(v) if not is_float(t) else v), t
    vals = [evaluate(x, types, row) for x in args]
    if op == "cvt":
        ((v, t),) = vals
        return to_type(v, t, node.value), node.value
    if op in ("neg", "abs", "invert"):
        ((v, t),) = vals
        if is_float(t):
            return (-v if op == "neg" else abs(v)), t
        return wrap(-v if op == "neg" else ~v, t), t
    if op == "add_lit":
        ((v, t),) = vals
        if is_float(t):
            rt = promote(t, "f64" if t == "f64" else "f32")
            return _farith("add", to_type(v, t, rt), NP[rt](node.value), rt), rt
        return wrap(v + node.value, t), t
    if op in ("lt", "le", "eq", "ne"):
        (a, ta), (b, tb), (c, tc) = vals
        t = promote(ta, tb)
        x, y = to_type(a, ta, t), to_type(b, tb, t)
        cond = {"lt": x < y, "le": x <= y, "eq": x == y, "ne": x != y}[op]
        rt = promote(tb, tc)
        return (to_type(b, tb, rt) if cond else to_type(c, tc, rt)), rt
    (a, ta), (b, tb) = vals
    if op in ("shl", "shr"):
        amount = to_type(b, tb, "u32")
        bits = BITS[ta]
        if op == "shl":
            return (0 if amount >= bits else wrap(a << amount, ta)), ta
        if amount >= bits:
            return (-1 if a < 0 else 0), ta
        return a >> amount, ta
    t = promote(ta, tb)
    x, y = to_type(a, ta, t), to_type(b, tb, t)
    if is_float(t):
        if op in ("min", "max"):
            if x == 0 and y == 0:  # PTX orders -0 below +0
                neg = (
                    (np.signbit(x) or np.signbit(y))
                    if op == "min"
                    else (np.signbit(x) and np.signbit(y))
                )
                return NP[t](-0.0 if neg else 0.0), t
            return (np.fmin if op == "min" else np.fmax)(x, y), t
        return _farith(op, x, y, t), t
    if op in ("floordiv", "mod"):
        d = (y & 127) | 1
        return wrap(x // d if op == "floordiv" else x % d, t), t
    if op == "min":
        return min(x, y), t
    if op == "max":
        return max(x, y), t
    py = {"add": x + y, "sub": x - y, "mul": x * y, "and": x & y, "or": x | y, "xor": x ^ y}[op]
    return wrap(py, t), t


def _farith(op, x, y, t):
    """One correctly rounded float operation in type t: computed in float64 and rounded once,
    which is exact for f16/bf16/f32 (53 >= 2p + 2 bits), native for f64."""
    with np.errstate(all="ignore"):
        xd, yd = np.float64(x), np.float64(y)
        r = {"add": xd + yd, "sub": xd - yd, "mul": xd * yd, "truediv": xd / yd}[op]
        return r if t == "f64" else NP[t](r)


KERNEL_TEMPLATE = """
import kaio
from kaio import *

@kaio.gpu_kernel(block_size=64)
def expr_kernel(a: {ta}[:], b: {tb}[:], c: {tc}[:], out: {tout}[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    if i < n:
        out[i] = {expr}
"""


def build_kernel(expr_src: str, types: dict, tout: str):
    """Write the kernel to a temporary module (kaio reads kernel source from files)."""
    src = KERNEL_TEMPLATE.format(
        ta=types["a"], tb=types["b"], tc=types["c"], tout=tout, expr=expr_src
    )
    fd, path = tempfile.mkstemp(suffix=".py", prefix="kaio_expr_")
    with os.fdopen(fd, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.expr_kernel, path


def random_inputs(rng, t: str, n: int):
    """Random values over the whole range for ints; mixed magnitudes and specials for floats."""
    if is_float(t):
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
        v[: min(n, 3)] = [0.0, -0.0, np.inf][: min(n, 3)]
        return v.astype(NP[t])
    info = np.iinfo(NP[t])
    return rng.integers(info.min, info.max, size=n, dtype=NP[t], endpoint=True)
