"""Elementwise ops: ``silu_gate``, ``gelu``, ``add``, ``mul`` (with a broadcast row vector).

One kernel, ``_elementwise``, specialized per op (``OP``), element type and ``VEC``: a
grid-stride loop over chunks of ``VEC`` elements (one 16-byte access per operand and chunk),
then the ``n % VEC`` elements left over, one per thread. Values are computed in f32; the
exponentials and reciprocals are the one-instruction ``.ftz`` approximations
(``kaio.exp2_ftz``, ``kaio.rcp_ftz``): at 16-bit sizes these ops are close to the instruction
limit, and a value that only differs from a subnormal flushed to zero is far below any
tolerance of the ops.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import math

import kaio
from kaio import f32, u32
from kaio_ops import _arrays
from kaio_ops._common import load_f32, store_f32, vector_width, widths
from kaio_ops._plan import planned

__all__ = ["silu_gate", "gelu", "add", "mul"]

BLOCK = 256
MAX_BLOCKS = 1 << 20
SQRT_HALF = math.sqrt(0.5)
NEG_LOG2E = -1.4426950408889634  # exp(-x) = exp2(x * NEG_LOG2E)
# gelu tanh: 0.5 * a * (1 + tanh(u)) = a * sigmoid(2u) = a / (1 + exp2(a * (K0 + K1 * a * a)))
# with u = sqrt(2 / pi) * (a + 0.044715 * a**3)
GELU_K0 = 2.0 * math.sqrt(2.0 / math.pi) * NEG_LOG2E
GELU_K1 = GELU_K0 * 0.044715
# Abramowitz-Stegun 7.1.26: 1 - erf(z) = t * P(t) * exp(-z * z), t = 1 / (1 + 0.3275911 z)
ERF_P = 0.3275911
ERF_A5, ERF_A4, ERF_A3, ERF_A2, ERF_A1 = (
    1.061405429,
    -1.453152027,
    1.421413741,
    -0.284496736,
    0.254829592,
)
OPS = ("silu_gate", "add", "mul", "gelu_tanh", "gelu_erf")


@kaio.gpu_func
def apply(OP: kaio.constexpr, a: f32, b: f32) -> f32:
    """The op on one pair of values (``b`` unused by the unary ops)."""
    r = a
    if OP == "silu_gate":
        r = a * kaio.rcp_ftz(1.0 + kaio.exp2_ftz(a * NEG_LOG2E)) * b
    elif OP == "add":
        r = a + b
    elif OP == "mul":
        r = a * b
    elif OP == "gelu_tanh":
        r = a * kaio.rcp_ftz(1.0 + kaio.exp2_ftz(a * kaio.fma(a * a, GELU_K1, GELU_K0)))
    elif OP == "gelu_erf":
        # 0.5 * a * (1 + erf(a / sqrt(2))) with q = 0.5 * a * (1 - erf(|a| / sqrt(2))):
        # a - q for a >= 0, q below (no cancellation for large negative a)
        z = kaio.abs(a) * SQRT_HALF
        t = kaio.rcp_ftz(kaio.fma(z, ERF_P, 1.0))
        p = kaio.fma(
            kaio.fma(kaio.fma(kaio.fma(ERF_A5, t, ERF_A4), t, ERF_A3), t, ERF_A2), t, ERF_A1
        )
        q = 0.5 * a * (p * t) * kaio.exp2_ftz(z * z * NEG_LOG2E)
        r = kaio.select(a >= 0.0, a - q, q)
    return r


@kaio.gpu_func
def chunk(
    x: DT[:],
    y: DT[:],
    out: DT[:],
    i: u32,
    ny: u32,
    OP: kaio.constexpr,
    BCAST: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    """out[i : i + VEC] = OP(x[...], y[...]); y is read at (i % ny) when it is broadcast."""
    xv = kaio.local(f32, (VEC,))
    yv = kaio.local(f32, (VEC,))
    load_f32(xv, 0, x, i, VEC, DT)
    if OP != "gelu_tanh" and OP != "gelu_erf":  # a binary op
        load_f32(yv, 0, y, i % ny if BCAST else i, VEC, DT)
    for j in kaio.static_range(VEC):
        xv[j] = apply(OP, xv[j], yv[j])
    store_f32(out, i, xv, 0, VEC, DT)


@kaio.gpu_kernel
def _elementwise(
    x: DT[:],
    y: DT[:],
    out: DT[:],
    n: u32,
    ny: u32,
    OP: kaio.constexpr,
    BCAST: kaio.constexpr,
    VEC: kaio.constexpr,
    DT: kaio.constexpr,
):
    tid = kaio.block_idx_x() * kaio.block_dim_x() + kaio.thread_idx_x()
    stride = kaio.grid_dim_x() * kaio.block_dim_x()
    chunks = n // VEC
    c = tid
    while c < chunks:
        chunk(x, y, out, c * VEC, ny, OP, BCAST, VEC, DT)
        c += stride
    if VEC > 1:
        i = chunks * VEC + tid
        if i < n:
            chunk(x, y, out, i, ny, OP, BCAST, 1, DT)


def plan(x: _arrays.Operand, y: _arrays.Operand) -> tuple[bool, int]:
    """(BCAST, VEC) for ``x op y``: y broadcast as a row when it is smaller than x; 16-byte
    chunks when the arrays are aligned (and, broadcasting, the row holds whole chunks)."""
    bcast = y.size != x.size
    return bcast, vector_width(x, y, multiple_of=y.size if bcast else 0)


def _run(op: str, x: _arrays.Operand, y: _arrays.Operand | None = None):
    """Launch ``_elementwise`` for ``op`` on checked operands; returns the new output."""
    out = _arrays.output(x)
    n = x.size
    if n == 0:
        return out
    y = y if y is not None else x
    bcast, vec = plan(x, y)
    grid = max(1, min(MAX_BLOCKS, -(-(n // vec) // BLOCK)))
    _elementwise[grid, BLOCK, _arrays.stream_of(x)](
        x.arg(n),
        y.arg(y.size),
        _arrays.output_arg(x, out, (n,)),
        n,
        y.size,
        OP=op,
        BCAST=bcast,
        VEC=vec,
        DT=x.dtype,
    )
    return out


def _operand_and_row(op: str, x, y, yname: str):
    """Check (x, y) where y has x's shape or is a row vector [N] (N = x.shape[-1])."""
    inputs = _arrays.Inputs(op)
    a = inputs.array(x, "x", ndim=(1, 2, 3))
    b = inputs.array(y, yname, ndim=(1, 2, 3))
    if b.shape != a.shape and b.shape != a.shape[-1:]:
        raise inputs.error(
            yname, f"must have x's shape {a.shape} or be a row vector {a.shape[-1:]}, got {b.shape}"
        )
    return a, b


@planned("x", "gate")
def silu_gate(x, gate):
    """SwiGLU's gate: ``x * sigmoid(x) * gate``, elementwise, computed in f32.

    x, gate: f32, f16 or bf16 arrays of one shape (1-D to 3-D). Returns a new array of that
    shape and dtype, of the same kind as ``x``.
    """
    inputs = _arrays.Inputs("silu_gate")
    a = inputs.array(x, "x", ndim=(1, 2, 3))
    return _run("silu_gate", a, inputs.array(gate, "gate", ndim=len(a.shape), shape=a.shape))


@planned("x")
def gelu(x, approximate: str = "tanh"):
    """GELU, elementwise, computed in f32: ``approximate="tanh"`` is
    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, ``"none"`` the exact
    ``0.5 * x * (1 + erf(x / sqrt(2)))`` (as in torch.nn.functional.gelu; erf to 1.5e-7,
    Abramowitz-Stegun 7.1.26).

    x: f32, f16 or bf16 (1-D to 3-D). Returns a new array of x's shape, dtype and kind.
    """
    forms = {"tanh": "gelu_tanh", "none": "gelu_erf"}
    if approximate not in forms:
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    return _run(forms[approximate], _arrays.Inputs("gelu").array(x, "x", ndim=(1, 2, 3)))


@planned("x", "y")
def add(x, y):
    """``x + y`` computed in f32; ``y`` has x's shape or is a row vector ``[N]`` added to
    every row (N = x.shape[-1]). Same dtype for both (f32, f16 or bf16)."""
    return _run("add", *_operand_and_row("add", x, y, "y"))


@planned("x", "y")
def mul(x, y):
    """``x * y`` computed in f32; ``y`` has x's shape or is a row vector ``[N]`` that
    multiplies every row (N = x.shape[-1]). Same dtype for both (f32, f16 or bf16)."""
    return _run("mul", *_operand_and_row("mul", x, y, "y"))


def shipped():
    """(kernel, constexprs) of every specialization these ops launch."""
    for dtype in _arrays.FLOATS:
        for op in OPS:
            for bcast in (False, True) if op in ("add", "mul") else (False,):
                for vec in widths(dtype):
                    yield _elementwise, {"OP": op, "BCAST": bcast, "VEC": vec, "DT": dtype}
