"""Definite assignment (issue 29, item 1): a variable read after an ``if`` or a loop that assigns
it on some paths only is a located CompileError, as Python's UnboundLocalError would be; a
variable assigned on every path compiles and runs."""

import inspect

import numpy as np
import pytest

import kaio
from kaio import f32, i32, u32

ON = 1  # a module constant a compile-time if tests


@kaio.gpu_kernel(block_size=32)
def if_only(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    if i < n:
        v = x[i]
    out[i] = v + 1.0  # ERR


@kaio.gpu_kernel(block_size=32)
def if_only_constant(out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    if i < n:
        v = 2.0
    out[i] = v  # ERR


@kaio.gpu_kernel(block_size=32)
def elif_missing_else(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    if i < n:
        v = x[i]
    elif i < n + 4:
        v = 0.0
    out[i] = v  # ERR


@kaio.gpu_kernel(block_size=32)
def loop_body_only(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    for j in range(n):
        v = x[j]
    out[i] = v  # ERR


@kaio.gpu_kernel(block_size=32)
def while_break_before(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    j = u32(0)
    while True:
        if j >= n:
            break
        v = x[j]
        j += 1
        if v > 0.0:
            break
    out[i] = v  # ERR


@kaio.gpu_kernel(block_size=32)
def loop_variable_after(x: f32[:], out: i32[:], n: i32):
    i = kaio.thread_idx_x()
    for j in range(n):
        out[j] = j
    out[i] = j  # ERR


@kaio.gpu_func
def positive_part(x: f32) -> f32:
    if x > 0.0:
        return x


@kaio.gpu_kernel(block_size=32)
def falls_off_device_function(x: f32[:], out: f32[:]):
    i = kaio.thread_idx_x()
    out[i] = positive_part(x[i])  # ERR


@kaio.gpu_kernel(block_size=32)
def continue_skips(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x()
    acc = 0.0
    for j in range(n):
        if x[j] < 0.0:
            continue
        w = x[j]
        acc += w
    out[i] = acc + w  # ERR


ERRORS = {
    if_only: ("'v'", "the if at line"),
    if_only_constant: ("'v'", "the if at line"),
    elif_missing_else: ("'v'", "the if at line"),
    loop_body_only: ("'v'", "the loop at line"),
    while_break_before: ("'v'", "the loop at line"),
    loop_variable_after: ("'j'", "the loop at line"),
    falls_off_device_function: ("without returning a value", ""),
    continue_skips: ("'w'", "the loop at line"),
}


@pytest.mark.parametrize("kernel", ERRORS, ids=lambda k: k.__name__)
def test_read_of_a_partly_assigned_variable_is_a_located_error(kernel):
    with pytest.raises(kaio.CompileError) as info:
        kernel.ir()
    err = info.value
    name, where = ERRORS[kernel]
    assert name in err.message and where in err.message, err.message
    lines, start = inspect.getsourcelines(kernel.pyfunc)
    marked = start + next(i for i, line in enumerate(lines) if "# ERR" in line)
    assert err.filename.endswith("test_definite_assignment.py") and err.lineno == marked, str(err)
    if "'v'" in err.message and "if" in where:
        assert "assign 'v' before the if" in err.message


@kaio.gpu_kernel(block_size=32)
def assigned_on_every_path(x: f32[:], out: f32[:], n: u32, M: kaio.constexpr):
    i = kaio.thread_idx_x()
    if i < n:
        a = x[i]
    else:
        a = -1.0
    if i >= n + 100:
        return  # this path does not reach the read of b
    else:
        b = 2.0 * a
    while True:  # the only exit follows the assignment
        c = b + 1.0
        break
    for k in range(3):  # constant trips: the body runs
        d = c + f32(k)
    for _m in kaio.static_range(2):
        e = d * 2.0
    if M == 1:  # compile time: only the taken branch exists
        g = e
    if ON:
        h = g + 0.5
    out[i] = h


def test_variables_assigned_on_every_path_compile_and_run():
    rng = np.random.default_rng(29)
    x = rng.standard_normal(32).astype(np.float32)
    out = np.full(32, np.nan, np.float32)
    n = 20
    assigned_on_every_path.sim[1](x, out, n, M=1)
    a = np.where(np.arange(32) < n, x, np.float32(-1.0))
    one, two, half = np.float32(1.0), np.float32(2.0), np.float32(0.5)
    expected = (((two * a + one) + two) * two) + half  # f32 at each step
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(kaio.CompileError, match="'g' is not defined"):
        assigned_on_every_path.ir(M=2)


# A loop variable read after its loop (issue 29): Python's value, the last one taken (or the
# one a break left), in the simulator and in the PTX alike; an empty static_range leaves the
# name unassigned (a located error) or as it was.
@kaio.gpu_kernel(block_size=32)
def loop_variables_after(x: f32[:], out: i32[:], n: u32):
    i = kaio.thread_idx_x()
    for a in kaio.static_range(2, 9, 3):  # noqa: B007 (2, 5, 8: a stays a constant after it)
        pass
    sh = kaio.shared(i32, (a * 4,))  # (so it can size an array)
    sh[i] = i
    for b in kaio.static_range(4):  # a break: b is the value of the iteration it left
        if x[i * 4 + b] > 0.0:
            break
    for c in range(5):  # a runtime range() with constant trips (unrolled)
        if x[i * 4 + c] > 0.0:
            break
    for d in range(4):  # noqa: B007
        pass
    e = 9
    for e in kaio.static_range(0):  # noqa: B007 (empty: e keeps its value)
        pass
    f = i
    for f in kaio.static_range(3):  # noqa: B007 (f was a variable: it gets the last value)
        pass
    f = f + 10
    out[i * 6 + 0] = a
    out[i * 6 + 1] = b
    out[i * 6 + 2] = c
    out[i * 6 + 3] = d
    out[i * 6 + 4] = e
    out[i * 6 + 5] = f


@kaio.gpu_kernel(block_size=32)
def empty_static_range_variable(out: i32[:], n: u32):
    for j in kaio.static_range(3, 3):
        out[0] = j
    out[1] = j  # ERR


def _loop_variables_expected(x: np.ndarray) -> np.ndarray:
    """Python's own loop semantics, thread by thread."""
    rows = []
    for i in range(32):
        for b in range(4):
            if x[i * 4 + b] > 0:
                break
        for c in range(5):
            if x[i * 4 + c] > 0:
                break
        rows.append([8, b, c, 3, 9, 12])
    return np.array(rows, np.int32).ravel()


def test_a_loop_variable_read_after_its_loop_has_its_last_value():
    from kaio.ptx.ptxas import assemble, find_ptxas

    rng = np.random.default_rng(29)
    x = np.where(rng.random(32 * 4 + 4) < 0.3, 1.0, -1.0).astype(np.float32)
    out = np.full(32 * 6, -7, np.int32)
    loop_variables_after.sim[1](x, out, 32)
    np.testing.assert_array_equal(out, _loop_variables_expected(x))
    # The unoptimized IR (only unrolled) agrees: the unroll pass keeps the variable.
    from kaio.frontend import compile_kernel
    from kaio.ir.passes import unroll
    from kaio.sim.engine import simulate

    fn = compile_kernel(loop_variables_after, {}, ("C", "C"))
    unroll(fn)
    again = np.full(32 * 6, -7, np.int32)
    n = next(p.value for p in fn.params if p.source == "n")
    simulate(fn, (1,), (32,), dict(zip(fn.param_arrays, (x, again), strict=True)), {n: 32})
    np.testing.assert_array_equal(again, out)
    if find_ptxas() is not None:
        assemble(loop_variables_after.ptx("sm_90"), "sm_90")
    with pytest.raises(kaio.CompileError) as info:
        empty_static_range_variable.ir()
    err = info.value
    assert "'j' is not assigned" in err.message and "range is empty" in err.message, str(err)
    lines, start = inspect.getsourcelines(empty_static_range_variable.pyfunc)
    assert err.lineno == start + next(i for i, ln in enumerate(lines) if "# ERR" in ln)


@pytest.mark.gpu
def test_a_loop_variable_read_after_its_loop_on_the_gpu():
    """Both backends' code gives Python's values (the PTX read an unwritten register)."""
    rng = np.random.default_rng(29)
    x = np.where(rng.random(32 * 4 + 4) < 0.3, 1.0, -1.0).astype(np.float32)
    for backend in ("ptx", "llvm"):
        if backend == "llvm":
            pytest.importorskip("llvmlite")
        kernel = kaio.Kernel(loop_variables_after.pyfunc, block_size=32, backend=backend)
        out = kaio.to_device(np.full(32 * 6, -7, np.int32))
        kernel[1](kaio.to_device(x), out, 32)
        np.testing.assert_array_equal(out.numpy(), _loop_variables_expected(x), err_msg=backend)
