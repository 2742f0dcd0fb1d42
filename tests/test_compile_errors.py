"""Everything outside the subset raises CompileError at the right file, line and column."""

import inspect

import numpy as np
import pytest

import kaio
from kaio import f32
from tests import bad_kernels

CASES = {
    "closure": "closures",
    "klass": "classes",
    "recursion": "recursion",
    "generator": "generators",
    "try_except": "try/except",
    "with_stmt": "'with'",
    "undefined_name": "not defined",
    "python_call": "Python function",
    "untyped": "no type annotation",
    "bad_promotion": "convert explicitly",
    "int_true_div": "use '//'",
    "wrong_arity": "missing a required argument: 'c'",
    "write_scalar_param": "read-only",
    "shared_runtime_shape": "compile time",
    "lambda_expr": "lambda",
    "bad_index_count": "2 dimensions",
    "float_index": "integers",
    "huge_index": "does not fit in i64",
    "return_value": "cannot return a value",
    "list_literal": "lists are not supported",
    "print_call": "print()",
    "float_bitwise": "needs integers",
    "static_range_runtime": "compile time",
    "global_list": "cannot be used as a value",
    "negative_unsigned_range": "negative step",
    "assert_stmt": "'assert'",
    "runtime_in": "compile-time values only",
}


def _marked_line(kernel) -> int:
    """The line marked ``# ERR`` in the kernel or the device functions it calls."""
    source = inspect.getsource(bad_kernels).splitlines()
    lines, start = inspect.getsourcelines(kernel.pyfunc)
    for offset, line in enumerate(lines):
        if "# ERR" in line:
            return start + offset
    # the error is inside a device function defined earlier in the file
    return next(i + 1 for i, line in enumerate(source) if "# ERR" in line)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_error_location_and_message(name):
    kernel = getattr(bad_kernels, name)
    with pytest.raises(kaio.CompileError) as info:
        kernel.ir()
    err = info.value
    assert CASES[name] in err.message, err.message
    assert err.filename.endswith("bad_kernels.py")
    assert err.lineno == _marked_line(kernel), str(err)
    text = str(err)
    assert text.startswith(f"{err.filename}:{err.lineno}:{err.col + 1}: error: ")
    lines = text.splitlines()
    assert lines[-1].strip() == "^" and len(lines[-1]) - 5 == err.col  # caret under the column


def test_at_least_fifteen_distinct_cases():
    assert len(CASES) >= 15


def test_calling_a_kernel_directly_is_an_error():
    with pytest.raises(kaio.LaunchError, match=r"\[grid, block\]"):
        bad_kernels.closure(None)


def test_builtins_outside_kernels_raise():
    with pytest.raises(RuntimeError, match="inside a @kaio.gpu_kernel"):
        kaio.thread_idx_x()


OPS_WITH_FAST_PATH = ("scale", "shift")


@kaio.gpu_kernel
def _membership(out: f32[:], OP: kaio.constexpr):
    if OP in OPS_WITH_FAST_PATH and OP not in ("shift",):
        out[0] = 1.0
    else:
        out[0] = 2.0


@pytest.mark.parametrize("op, expected", [("scale", 1.0), ("shift", 2.0), ("other", 2.0)])
def test_in_between_compile_time_values_is_decided_at_compile_time(op, expected):
    out = np.full(1, np.nan, np.float32)
    with kaio.simulate():
        _membership[1, 1](out, OP=op)
    assert out[0] == expected
    assert _membership.ir(OP=op).count("store") == 1  # decided while compiling: no branch


@pytest.mark.parametrize("option", ["debug", "fastmath"])
@pytest.mark.parametrize("value", ["no", "yes", None, 2, 1.0])
def test_yes_no_decorator_options_take_bools(option, value):
    """``debug="no"`` was taken as true: a yes/no option that is not a bool (or 0/1) is a
    CompileError at definition naming the option and the kernel."""
    with pytest.raises(kaio.CompileError, match=rf"{option}={value!r}\) of k: {option} takes"):

        @kaio.gpu_kernel(**{option: value})
        def k(x: kaio.f32[:]):
            x[0] = 1.0


@pytest.mark.parametrize("value", [True, False, 0, 1])
def test_yes_no_decorator_options_accept_bools(value):
    @kaio.gpu_kernel(debug=value, fastmath=value)
    def k(x: kaio.f32[:]):
        x[0] = 1.0

    assert k.fastmath is bool(value)
