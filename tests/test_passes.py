"""The optimizing passes that move code: copy propagation, constant terms moved outward,
loop-invariant code motion (``kaio.ir.passes``), and the PTX emitter's use of them in
addresses.

Each kernel is compiled twice: only unrolled (``plain``: the frontend's IR as written) and
through every pass (``optimized``, what the backends and ``kernel.sim`` get). Structural
tests look for where an instruction ended up; semantic tests run both versions in the
simulator, on loops that run zero, one and several times, against NumPy.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kaio
from kaio import f32, i32, u32
from kaio.frontend import compile_kernel
from kaio.ir import passes
from kaio.ir.nodes import Function, If, Instr, Loop, Var, walk
from kaio.ir.verifier import verify
from kaio.ptx import emit
from kaio.sim import simulate_ir

TRIPS = (0, 1, 5)  # loop trip counts every semantic test runs


# ---------------------------------------------------------------------------- helpers
def plain(kernel, **constexprs) -> Function:
    """The kernel's IR as the frontend wrote it, static loops unrolled (the simulator's
    minimum)."""
    fn = compile_kernel(kernel, constexprs, ("C",) * len(kernel.array_params()))
    passes.unroll(fn)
    return fn


def optimized(kernel, **constexprs) -> Function:
    """The kernel's IR after ``optimize``, verified."""
    fn = compile_kernel(kernel, constexprs, ("C",) * len(kernel.array_params()))
    passes.optimize(fn)
    verify(fn)
    return fn


def run(fn: Function, block: int, arrays: dict, scalars: dict) -> dict:
    """Simulate one block of ``fn`` on copies of ``arrays`` (by parameter name); the arrays
    after the launch."""
    out = {name: a.copy() for name, a in arrays.items()}
    by_name = {a.name: a for a in fn.param_arrays}
    by_source = {p.source: p.value for p in fn.params if p.role == "scalar"}
    simulate_ir(
        fn,
        1,
        block,
        {by_name[n]: a for n, a in out.items()},
        {by_source[n]: v for n, v in scalars.items()},
    )
    return out


def same_results(kernel, block: int, arrays: dict, scalars: dict) -> dict:
    """Run the plain and the optimized IR; assert equal outputs and return them."""
    before = run(plain(kernel), block, arrays, scalars)
    after = run(optimized(kernel), block, arrays, scalars)
    for name in arrays:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    return after


def param(fn: Function, name: str) -> Var:
    """The Var of scalar parameter ``name``."""
    return next(p.value for p in fn.params if p.source == name)


def loops(stmts: list) -> list[Loop]:
    """The loops of ``stmts``, outermost first."""
    return [s for s in walk(stmts) if isinstance(s, Loop)]


def finds(stmts: list, op: str, *args) -> list[Instr]:
    """The ``op`` instructions of ``stmts`` (nested blocks included) reading all of
    ``args``."""
    return [
        s
        for s in walk(stmts)
        if isinstance(s, Instr) and s.op == op and all(a in s.args for a in args)
    ]


def inside(loop: Loop, ins: Instr) -> bool:
    """Whether ``ins`` is in ``loop`` (its body, step or any block nested in them)."""
    return any(s is ins for s in walk([loop]))


# ---------------------------------------------------------------------------- kernels
@kaio.gpu_kernel
def invariant_product(out: i32[:], n: i32, a: i32, b: i32):
    """out[t] = sum over j < n of a * b + j * t (t read in the loop)."""
    total = 0
    for j in range(n):
        total += a * b + j * i32(kaio.thread_idx_x())
    out[kaio.thread_idx_x()] = total


@kaio.gpu_kernel
def memory_in_loop(x: f32[:], out: f32[:], counter: i32[:], n: i32):
    """Loads, stores, barriers, atomics and shuffles at loop-invariant indices."""
    t = kaio.thread_idx_x()
    tile = kaio.shared(f32, (32,))
    acc = f32(0.0)
    for _ in range(n):
        tile[t] = x[t]
        kaio.sync_threads()
        acc += tile[31 - t]
        kaio.sync_threads()
        x[t] = x[t] + 1.0
        kaio.atomic_add(counter, 0, 1)
        acc += kaio.shfl_xor(acc, 1)
    out[t] = acc


@kaio.gpu_kernel
def divisions(out: i32[:], n: i32, a: i32, d: i32):
    """A division by a parameter (zero when the loop does not run) and one by 3."""
    t = i32(kaio.thread_idx_x())
    total = 0
    for j in range(n):
        total += a // d + a // 3 + j
    out[t] = total


@kaio.gpu_kernel
def nested(out: i32[:], n: i32, a: i32, b: i32, c: i32):
    """Invariant in both loops (a * b), in the inner one only (i * c), in neither."""
    t = i32(kaio.thread_idx_x())
    total = 0
    for i in range(n):
        for j in range(n):
            total += a * b + i * c + j * t
    out[t] = total


@kaio.gpu_kernel
def conditional(out: i32[:], n: i32, a: i32, b: i32):
    """An invariant product under a branch in the loop."""
    t = i32(kaio.thread_idx_x())
    total = 0
    for _ in range(n):
        if t < 4:
            total += a * b
    out[t] = total


@kaio.gpu_kernel
def reassigned(out: i32[:], n: i32, a: i32, b: i32):
    """x is assigned before and in the loop and read before its assignment in the loop."""
    t = i32(kaio.thread_idx_x())
    total = 0
    x = t
    for _ in range(n):
        total += x
        x = a * b
    out[t] = total


@kaio.gpu_kernel
def sums(out: i32[:], n: i32, a: i32, b: i32):
    """(j + a) + b: the invariant a + b once outside the loop."""
    t = i32(kaio.thread_idx_x())
    total = 0
    for j in range(n):
        total += (j + a) + b
    out[t] = total + t


@kaio.gpu_kernel
def copies(out: i32[:], n: i32, a: i32, b: i32):
    """Copies of variables that are reassigned later, in branches and in a loop."""
    t = i32(kaio.thread_idx_x())
    x = a
    y = x
    x = b
    z = x
    if t < 2:
        z = a
    w = x
    total = 0
    for _ in range(n):
        total += w
        w = w + 1
    out[t] = y * 1000 + z * 100 + total


@kaio.gpu_kernel
def shifted(out: f32[:]):
    """A shared-array index with a constant term: (t + 1) + t % 2."""
    t = kaio.thread_idx_x()
    tile = kaio.shared(f32, (64,))
    tile[t] = f32(t)
    tile[t + 32] = f32(t + 32)
    kaio.sync_threads()
    out[t] = tile[t + 1 + t % 2]


@kaio.gpu_kernel
def staged(out: f32[:], n: i32):
    """A 2-D shared tile read at [loop-varying stage, invariant column]."""
    t = kaio.thread_idx_x()
    tile = kaio.shared(f32, (2, 32))
    tile[0, t] = f32(t)
    tile[1, t] = f32(2 * t)
    kaio.sync_threads()
    acc = f32(0.0)
    for j in range(n):
        acc += tile[j % 2, 31 - t]
    out[t] = acc


@kaio.gpu_kernel
def many_invariants(x: i32[:], out: i32[:], n: i32, a: i32, COUNT: kaio.constexpr):
    """COUNT invariant values a * i + 1, each read in the loop next to a load."""
    t = kaio.thread_idx_x()
    total = 0
    for _ in range(n):
        for i in kaio.static_range(COUNT):
            total += x[i] * (a * i + 1)
    out[t] = total


def ints(block: int = 8) -> dict:
    return {"out": np.zeros(block, np.int32)}


# ---------------------------------------------------------------------------- motion
def test_invariant_arithmetic_leaves_the_loop_and_varying_stays():
    fn = optimized(invariant_product)
    (loop,) = loops(fn.body)
    (ab,) = finds(fn.body, "mul", param(fn, "a"), param(fn, "b"))
    assert not inside(loop, ab)
    (jt,) = finds(fn.body, "mul", next(v for v in _loop_counters(loop)))
    assert inside(loop, jt)


def _loop_counters(loop: Loop) -> list[Var]:
    """The variables the loop's step assigns."""
    return [s.dst for s in loop.step if isinstance(s, Instr)]


@pytest.mark.parametrize("n", TRIPS)
def test_invariant_arithmetic_keeps_results(n):
    out = same_results(invariant_product, 8, ints(), {"n": n, "a": 3, "b": 5})["out"]
    t = np.arange(8)
    assert out.tolist() == (n * 15 + t * (n * (n - 1) // 2)).tolist()


def test_memory_barriers_atomics_and_shuffles_stay_in_the_loop():
    fn = optimized(memory_in_loop)
    (loop,) = loops(fn.body)
    kept = ("load", "store", "sync_threads", "atomic", "shfl")
    for s in walk(fn.body):
        if isinstance(s, Instr) and s.op in kept:
            assert inside(loop, s) or s.op == "store" and s.args[0].name == "out", s
    (flipped,) = finds(fn.body, "sub")  # 31 - t: pure index arithmetic moves
    assert not inside(loop, flipped)


@pytest.mark.parametrize("n", TRIPS)
def test_memory_in_loop_keeps_results(n):
    x = np.arange(32, dtype=np.float32)
    arrays = {"x": x, "out": np.zeros(32, np.float32), "counter": np.zeros(1, np.int32)}
    got = same_results(memory_in_loop, 32, arrays, {"n": n})
    assert got["counter"][0] == 32 * n
    assert got["x"].tolist() == (x + n).tolist()


def test_division_by_a_variable_stays_and_by_a_constant_moves():
    fn = optimized(divisions)
    (loop,) = loops(fn.body)
    (by_d,) = finds(fn.body, "floordiv", param(fn, "d"))
    assert inside(loop, by_d)
    (by_3,) = [s for s in finds(fn.body, "floordiv", param(fn, "a")) if s is not by_d]
    assert not inside(loop, by_3)


@pytest.mark.parametrize("n", TRIPS)
def test_divisions_keep_results_even_by_zero_when_the_loop_does_not_run(n):
    d = 0 if n == 0 else 4
    out = same_results(divisions, 8, ints(), {"n": n, "a": 17, "d": d})["out"]
    expected = n * (17 // d + 17 // 3) + n * (n - 1) // 2 if n else 0
    assert out.tolist() == [expected] * 8


def test_nested_loops_hoist_each_value_as_far_as_it_is_invariant():
    fn = optimized(nested)
    outer, inner = loops(fn.body)
    (ab,) = finds(fn.body, "mul", param(fn, "a"), param(fn, "b"))
    assert not inside(outer, ab)
    (ic,) = finds(fn.body, "mul", param(fn, "c"))
    assert inside(outer, ic) and not inside(inner, ic)


@pytest.mark.parametrize("n", TRIPS)
def test_nested_loops_keep_results(n):
    out = same_results(nested, 8, ints(), {"n": n, "a": 3, "b": 5, "c": 7})["out"]
    t = np.arange(8)
    tri = n * (n - 1) // 2
    assert out.tolist() == (n * n * 15 + n * tri * 7 + n * tri * t).tolist()


def test_conditional_code_is_not_hoisted():
    fn = optimized(conditional)
    (loop,) = loops(fn.body)
    (ab,) = finds(fn.body, "mul", param(fn, "a"), param(fn, "b"))
    assert inside(loop, ab)
    branches = [s for s in walk(loop.body) if isinstance(s, If)]
    assert any(s is ab for b in branches for s in walk(b.then))


@pytest.mark.parametrize("n", TRIPS)
def test_conditional_code_keeps_results(n):
    out = same_results(conditional, 8, ints(), {"n": n, "a": 3, "b": 5})["out"]
    assert out.tolist() == [n * 15 if t < 4 else 0 for t in range(8)]


def test_a_reassigned_variable_keeps_its_assignment_in_the_loop():
    fn = optimized(reassigned)
    (loop,) = loops(fn.body)
    (ab,) = finds(fn.body, "mul", param(fn, "a"), param(fn, "b"))
    assert not inside(loop, ab)  # the value moves, the assignment of x stays
    assert any(s.op == "mov" and ab.dst in s.args for s in walk(loop.body) if isinstance(s, Instr))


@pytest.mark.parametrize("n", TRIPS)
def test_a_reassigned_variable_keeps_results(n):
    out = same_results(reassigned, 8, ints(), {"n": n, "a": 3, "b": 5})["out"]
    t = np.arange(8)
    assert out.tolist() == (np.where(n > 0, t + 15 * (n - 1), 0)).tolist()


def test_sums_are_reassociated_so_the_invariant_part_leaves_the_loop():
    fn = optimized(sums)
    (loop,) = loops(fn.body)
    (ab,) = finds(fn.body, "add", param(fn, "a"), param(fn, "b"))
    assert not inside(loop, ab)
    assert [s for s in finds(loop.body, "add", ab.dst)]  # j + (a + b)


@pytest.mark.parametrize("n", TRIPS)
def test_reassociated_sums_keep_results(n):
    out = same_results(sums, 8, ints(), {"n": n, "a": 3, "b": 2**31 - 1})["out"]
    t = np.arange(8, dtype=np.int64)
    total = n * (3 + 2**31 - 1) + n * (n - 1) // 2 + t
    assert out.tolist() == ((total + 2**31) % 2**32 - 2**31).tolist()  # wraps like i32


@pytest.mark.parametrize("n", TRIPS)
def test_copies_of_reassigned_variables_keep_results(n):
    out = same_results(copies, 8, ints(), {"n": n, "a": 3, "b": 5})["out"]
    total = n * 5 + n * (n - 1) // 2
    assert out.tolist() == [3000 + (3 if t < 2 else 5) * 100 + total for t in range(8)]


def test_copies_of_variables_that_are_reassigned_later_disappear():
    fn = optimized(copies)
    named = {a.name for s in walk(fn.body) if isinstance(s, Instr) for a in (s.dst, *s.args)
             if isinstance(a, Var)}  # fmt: skip
    assert not [n for n in named if n.startswith(("x_", "y_"))], named
    assert [n for n in named if n.startswith(("z_", "w_"))]  # reassigned in a branch, a loop


def test_special_register_reads_and_conversions_move_too():
    (loop,) = loops(plain(invariant_product).body)
    assert [s for s in walk([loop]) if isinstance(s, Instr) and s.op == "sreg"]
    (loop,) = loops(optimized(invariant_product).body)
    assert not [s for s in walk([loop]) if isinstance(s, Instr) and s.op in ("sreg", "cvt")]


@pytest.mark.parametrize("count", [8, passes.MAX_LIVE_INVARIANTS + 1])
def test_a_loop_with_more_invariants_than_registers_is_left_alone(count):
    fn = optimized(many_invariants, COUNT=count)
    (loop,) = loops(fn.body)
    products = finds(fn.body, "mul", param(fn, "a"))
    assert len(products) == count
    moved = [not inside(loop, p) for p in products]
    assert all(moved) if count <= passes.MAX_LIVE_INVARIANTS else not any(moved)


# ---------------------------------------------------------------------------- addresses
def test_constant_terms_of_shared_indices_become_immediate_offsets():
    ptx = emit(optimized(shifted), "sm_90")
    assert re.search(r"ld\.shared\.f32 %f\d+, \[%r\d+\+4\]", ptx), ptx
    out = same_results(shifted, 32, {"out": np.zeros(32, np.float32)}, {})["out"]
    t = np.arange(32)
    assert out.tolist() == (t + 1 + t % 2).tolist()


def test_addresses_add_loop_varying_indices_last():
    ptx = emit(optimized(staged), "sm_90")
    label = re.search(r"^(\$L__loop\d+):$", ptx, re.M).group(1)
    loop = ptx[ptx.index(label) : ptx.index(f"bra {label};")]
    invariant = re.search(r"mad\.lo\.s32 (%r\d+), %r\d+, 4, %r\d+;", loop)
    assert invariant, loop  # the column first, then the stage: base + 4 * col + 128 * stage
    assert re.search(rf"mad\.lo\.s32 %r\d+, %r\d+, 128, {invariant.group(1)};", loop), loop


@pytest.mark.parametrize("n", TRIPS)
def test_staged_reads_keep_results(n):
    out = same_results(staged, 32, {"out": np.zeros(32, np.float32)}, {"n": n})["out"]
    col = 31 - np.arange(32)
    assert out.tolist() == (col * sum(1 + j % 2 for j in range(n))).tolist()


# ---------------------------------------------------------------- loads before slow paths
@kaio.gpu_kernel
def silu_gate(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    """API.md's kernel: gate's load is written after the IEEE division."""
    i = kaio.thread_idx_x()
    if i < n:
        xi = x[i]
        sig = 1.0 / (1.0 + kaio.exp(-xi))
        out[i] = xi * sig * gate[i]


@kaio.gpu_kernel
def loads_that_stay(x: f32[:], y: f32[:], out: f32[:]):
    """Loads after a division or square root that must not cross it: behind a store, and
    indexed by a value computed from the square root."""
    i = kaio.thread_idx_x()
    v = x[i]
    q = 1.0 / (v + 2.0)
    out[i] = q
    a = y[i]  # behind the store
    r = kaio.sqrt(a * a + 1.0)
    j = u32(r) % 32
    b = y[j]  # its index comes from the square root
    out[i] = a + b + q + r


@kaio.gpu_kernel(fastmath=True)
def silu_gate_fast(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    if i < n:
        xi = x[i]
        out[i] = xi / (1.0 + kaio.exp(-xi)) * gate[i]


def order(fn: Function, ops: tuple) -> list[str]:
    """The ops of ``ops`` in program order, loads named by their array."""
    return [
        f"load {s.args[0].name}" if s.op == "load" else s.op
        for s in walk(fn.body)
        if isinstance(s, Instr) and s.op in ops
    ]


def test_a_load_written_after_a_division_is_issued_before_it():
    assert order(plain(silu_gate), ("load", "div")) == ["load x", "div", "load gate"]
    assert order(optimized(silu_gate), ("load", "div")) == ["load x", "load gate", "div"]
    ptx = silu_gate.ptx(arch="sm_90")
    assert ptx.index("div.rn.f32") > ptx.rindex("ld.global.f32")


def test_loads_stay_behind_stores_and_their_operands():
    ops = ("load", "store", "div", "sqrt")
    assert order(optimized(loads_that_stay), ops) == order(plain(loads_that_stay), ops)


def test_fast_division_has_no_slow_path_to_cross():
    ops = ("load", "div_ftz")
    assert order(optimized(silu_gate_fast), ops) == order(plain(silu_gate_fast), ops)


def test_loads_before_slow_paths_keep_results():
    rng = np.random.default_rng(7)
    x, y = (rng.standard_normal(32).astype(np.float32) for _ in range(2))
    arrays = {"x": x, "y": y, "out": np.full(32, np.nan, np.float32)}
    out = same_results(loads_that_stay, 32, arrays, {})["out"]
    assert np.isfinite(out).all()
    arrays = {"x": x, "gate": y, "out": np.full(32, np.nan, np.float32)}
    out = same_results(silu_gate, 32, arrays, {"n": 32})["out"]
    ref = x / (1.0 + np.exp(-x.astype(np.float64))) * y
    np.testing.assert_allclose(out, ref, rtol=1e-6)


# ---------------------------------------------------------------- constant folding of integers
@pytest.mark.parametrize("name", ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"])
def test_folded_integer_ops_wrap_floor_and_clamp_as_the_catalogue_says(name):
    """The folder (which computes as the simulator does, kaio.numerics.integer_op) against
    Python integers wrapped by hand, at the edges of each type."""
    from kaio.ir.nodes import Const
    from kaio.types import u32
    from tests.test_sim_engine import INT_BINARY, wrap

    t = getattr(kaio, name)
    bits, signed = t.bits, t.kind == "int"
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    values = sorted({lo, lo + 1, -7 if signed else 7, -1 if signed else 1, 0, 3, hi - 1, hi})
    python = {**INT_BINARY, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b}

    def fold(op, *args):
        return passes._fold_instr(Instr(op, Var("d", t), args)).value

    for a in values:
        for b in values:
            for op, py in python.items():
                if op in ("floordiv", "mod") and (b == 0 or (a, b) == (lo, -1)):
                    continue  # unspecified on the GPU
                assert fold(op, Const(a, t), Const(b, t)) == wrap(py(a, b), t), (op, a, b)
        assert fold("neg", Const(a, t)) == wrap(-a, t)
        assert fold("invert", Const(a, t)) == wrap(~a, t)
        for n in (0, 1, bits - 1, bits, bits + 9):
            shl = 0 if n >= bits else wrap(a << n, t)
            shr = (-1 if a < 0 else 0) if n >= bits else a >> n
            assert fold("shl", Const(a, t), Const(n, u32)) == shl, ("shl", a, n)
            assert fold("shr", Const(a, t), Const(n, u32)) == shr, ("shr", a, n)
