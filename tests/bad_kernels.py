"""Kernels outside the DSL, one per error case; an ERR comment marks the line to report."""

import kaio
from kaio import f32, i32, u32

NOT_A_CONSTANT = [1, 2]


def python_helper(x):
    return x + 1


@kaio.gpu_func
def recursive(n: i32) -> i32:
    if n <= 0:
        return 0
    return recursive(n - 1)  # ERR


@kaio.gpu_kernel
def closure(out: f32[:]):
    def inner(x):  # ERR
        return x

    out[0] = 1.0


@kaio.gpu_kernel
def klass(out: f32[:]):
    class A:  # ERR
        pass


@kaio.gpu_kernel
def recursion(out: i32[:]):
    out[0] = recursive(3)


@kaio.gpu_kernel
def generator(out: f32[:]):
    yield out[0]  # ERR


@kaio.gpu_kernel
def try_except(out: f32[:]):
    try:  # ERR
        out[0] = 1.0
    except Exception:
        pass


@kaio.gpu_kernel
def with_stmt(out: f32[:]):
    with open("x"):  # ERR
        pass


@kaio.gpu_kernel
def undefined_name(out: f32[:]):
    out[0] = missing_name  # ERR  # noqa: F821


@kaio.gpu_kernel
def python_call(out: i32[:]):
    out[0] = python_helper(1)  # ERR


@kaio.gpu_kernel
def untyped(out, n: u32):  # ERR
    pass


@kaio.gpu_kernel
def bad_promotion(out: f32[:], n: u32):
    x = 1.0
    x = f32(2.0) + kaio.f64(n)  # ERR


@kaio.gpu_kernel
def int_true_div(out: f32[:], n: u32):
    out[0] = n / 2  # ERR


@kaio.gpu_kernel
def runtime_in(out: f32[:], n: u32):
    if n in (1, 2):  # ERR
        out[0] = 1.0


@kaio.gpu_kernel
def wrong_arity(out: f32[:]):
    out[0] = kaio.fma(1.0, 2.0)  # ERR


@kaio.gpu_kernel
def write_scalar_param(out: f32[:], n: u32):
    n = n + 1  # ERR


@kaio.gpu_kernel
def shared_runtime_shape(out: f32[:], n: u32):
    buf = kaio.shared(f32, (n,))  # ERR
    out[0] = buf[0]


@kaio.gpu_kernel
def lambda_expr(out: f32[:]):
    f = lambda x: x  # ERR  # noqa: E731


@kaio.gpu_kernel
def bad_index_count(out: f32[:, :]):
    out[0] = 1.0  # ERR


@kaio.gpu_kernel
def float_index(out: f32[:]):
    out[1.5] = 1.0  # ERR


@kaio.gpu_kernel
def huge_index(out: f32[:, :]):
    out[0, 10**30] = 1.0  # ERR


@kaio.gpu_kernel
def return_value(out: f32[:]):
    return 1.0  # ERR


@kaio.gpu_kernel
def list_literal(out: f32[:]):
    xs = [1.0, 2.0]  # ERR


@kaio.gpu_kernel
def print_call(out: f32[:]):
    print(out[0])  # ERR


@kaio.gpu_kernel
def float_bitwise(out: f32[:]):
    out[0] = out[0] & 1.0  # ERR


@kaio.gpu_kernel
def static_range_runtime(out: f32[:], n: u32):
    for i in kaio.static_range(n):  # ERR
        out[i] = 0.0


@kaio.gpu_kernel
def global_list(out: f32[:]):
    out[0] = NOT_A_CONSTANT  # ERR


@kaio.gpu_kernel
def negative_unsigned_range(out: f32[:], n: u32):
    for i in range(n, 0, -1):  # ERR
        out[i] = 0.0


@kaio.gpu_kernel
def assert_stmt(out: f32[:], n: u32):
    assert n > 0  # ERR
