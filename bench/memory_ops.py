"""kaio_ops memory-bound ops against torch eager and Triton, with the device-to-device copy
bandwidth measured in the same run (python bench/memory_ops.py --out results.json).

Every op runs at a large size in f32, f16 and bf16: 256 MiB an input array (512 MiB to
1.1 GB moved a call). The Triton
peers are small kernels written here for exactly the same op (one program per row for the
row ops, 1024 elements a program for the elementwise ones), computing in f32 as kaio does.
GB/s counts the fewest bytes the op must move (inputs read once, outputs written once).
The row ops also run on rows that do not start or end on a 16-byte boundary ("unaligned":
x and the residual one element past an allocation, and rows of 4095 elements).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kaio_ops  # noqa: E402
from bench.harness import Harness  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# ---------------------------------------------------------------------------- Triton peers
@triton.jit
def _tri_elementwise(
    x_ptr, y_ptr, o_ptr, n, ny, OP: tl.constexpr, BCAST: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if OP == "gelu_tanh":
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        r = x * tl.sigmoid(2.0 * u)
    elif OP == "gelu_erf":
        r = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    else:
        y = tl.load(y_ptr + (offs % ny if BCAST else offs), mask=mask).to(tl.float32)
        if OP == "silu_gate":
            r = x * tl.sigmoid(x) * y
        elif OP == "add":
            r = x + y
        else:
            r = x * y
    tl.store(o_ptr + offs, r.to(o_ptr.dtype.element_ty), mask=mask)


def tri_elementwise(op: str, x, y=None):
    out = torch.empty_like(x)
    n = x.numel()
    y = x if y is None else y
    grid = (triton.cdiv(n, 1024),)
    _tri_elementwise[grid](x, y, out, n, y.numel(), OP=op, BCAST=y.numel() != n, BLOCK=1024)
    return out


@triton.jit
def _tri_rows(
    x_ptr, r_ptr, w_ptr, b_ptr, o_ptr, ro_ptr, n, eps, OP: tl.constexpr, BLOCK_N: tl.constexpr
):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n
    at = tl.program_id(0).to(tl.int64) * n + cols
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    if OP == "rms_norm_residual":
        s = (x + tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(
            ro_ptr.dtype.element_ty
        )
        tl.store(ro_ptr + at, s, mask=mask)
        x = s.to(tl.float32)
    if OP == "softmax":
        x = tl.where(mask, x, -float("inf"))
        e = tl.exp(x - tl.max(x, 0))
        out = e / tl.sum(e, 0)
    elif OP == "layer_norm":
        d = tl.where(mask, x - tl.sum(x, 0) / n, 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, 0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask).to(tl.float32)
        out = d * rstd * w + b
    else:
        w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        out = x * tl.rsqrt(tl.sum(x * x, 0) / n + eps) * w
    tl.store(o_ptr + at, out.to(o_ptr.dtype.element_ty), mask=mask)


def tri_rows(op: str, x, r=None, w=None, b=None, eps=1e-6):
    n = x.shape[-1]
    out = torch.empty_like(x)
    r_out = torch.empty_like(x) if r is not None else out
    block = triton.next_power_of_2(n)
    _tri_rows[(x.numel() // n,)](
        x,
        x if r is None else r,
        x if w is None else w,
        x if b is None else b,
        out,
        r_out,
        n,
        eps,
        OP=op,
        BLOCK_N=block,
        num_warps=min(max(block // 256, 1), 16),
    )
    return (out, r_out) if r is not None else out


@triton.jit
def _tri_rope(
    x_ptr,
    c_ptr,
    s_ptr,
    o_ptr,
    rows,
    heads,
    HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    j = tl.arange(0, HALF)[None, :]
    mask = r < rows
    cs = (r // heads) * HALF + j
    c = tl.load(c_ptr + cs, mask=mask).to(tl.float32)
    s = tl.load(s_ptr + cs, mask=mask).to(tl.float32)
    base = r.to(tl.int64) * (2 * HALF)
    ia = base + (2 * j if INTERLEAVED else j)
    ib = ia + (1 if INTERLEAVED else HALF)
    a = tl.load(x_ptr + ia, mask=mask).to(tl.float32)
    b = tl.load(x_ptr + ib, mask=mask).to(tl.float32)
    ty = o_ptr.dtype.element_ty
    tl.store(o_ptr + ia, (a * c - b * s).to(ty), mask=mask)
    tl.store(o_ptr + ib, (b * c + a * s).to(ty), mask=mask)


def tri_rope(x, cos, sin, interleaved):
    out = torch.empty_like(x)
    rows = x.numel() // x.shape[-1]
    heads = x.shape[1] if x.dim() == 3 else 1
    grid = (triton.cdiv(rows, 16),)
    _tri_rope[grid](
        x, cos, sin, out, rows, heads, HALF=x.shape[-1] // 2, INTERLEAVED=interleaved, BLOCK_R=16
    )
    return out


# ---------------------------------------------------------------------------- torch eager
def torch_rope(x, cos, sin, interleaved):
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)


def torch_rms(x, w, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def torch_rms_residual(x, r, w, eps=1e-6):
    s = r + x
    return torch_rms(s, w, eps), s


# ---------------------------------------------------------------------------- cases
def _randn(shape, dt, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=torch.float32) * scale).to(dt)


def elementwise_cases(h: Harness, dt, name: str, shape=(8192, 8192)):
    n, size = math.prod(shape), torch.tensor([], dtype=dt).element_size()
    label = f"{name} {list(shape)}"

    def xy():
        return _randn(shape, dt, 3), _randn(shape, dt)

    def x_row():
        return _randn(shape, dt), _randn(shape[-1:], dt)

    def x1():
        return (_randn(shape, dt, 3),)

    common = {"tol": TOL[dt], "baseline": "triton"}
    h.case(
        "silu_gate",
        label,
        xy,
        {
            "kaio": kaio_ops.silu_gate,
            "triton": lambda x, g: tri_elementwise("silu_gate", x, g),
            "torch": lambda x, g: F.silu(x) * g,
        },
        reference=lambda x, g: F.silu(x.double()) * g.double(),
        nbytes=3 * n * size,
        **common,
    )
    for form, op in (("tanh", "gelu_tanh"), ("none", "gelu_erf")):
        h.case(
            f"gelu {form}",
            label,
            x1,
            {
                "kaio": lambda x, form=form: kaio_ops.gelu(x, approximate=form),
                "triton": lambda x, op=op: tri_elementwise(op, x),
                "torch": lambda x, form=form: F.gelu(x, approximate=form),
            },
            reference=lambda x, form=form: F.gelu(x.double(), approximate=form),
            nbytes=2 * n * size,
            **common,
        )
    for op, fn in (("add", torch.add), ("mul", torch.mul)):
        kaio_fn = getattr(kaio_ops, op)
        impls = {
            "kaio": kaio_fn,
            "triton": lambda x, y, op=op: tri_elementwise(op, x, y),
            "torch": fn,
        }
        ref = lambda x, y, fn=fn: fn(x.double(), y.double())  # noqa: E731
        h.case(op, label, xy, impls, reference=ref, nbytes=3 * n * size, **common)
        h.case(
            f"{op} row",
            label,
            x_row,
            impls,
            reference=ref,
            nbytes=(2 * n + shape[-1]) * size,
            **common,
        )


def row_cases(h: Harness, dt, name: str, shape=(16384, 4096), offset=0, suffix=""):
    """The row ops on x and the residual of ``shape`` that start ``offset`` elements past an
    allocation; ``suffix`` to the op's name."""
    n_row = shape[-1]
    n, size = math.prod(shape), torch.tensor([], dtype=dt).element_size()
    label = f"{name} {list(shape)}" + (f" +{offset}" if offset else "")
    common = {"tol": TOL[dt], "baseline": "triton"}

    def inputs():
        x, r = (_randn(n + offset, dt)[offset:].view(shape) for _ in range(2))
        return x, r, _randn(n_row, dt), _randn(n_row, dt)

    def residual(x, r):
        return (x.float() + r.float()).to(dt)

    # op: (kaio, triton, torch eager, float64 reference, elements moved); each fn(x, r, w, b)
    table = {
        "rms_norm": (
            lambda x, r, w, b: kaio_ops.rms_norm(x, w),
            lambda x, r, w, b: tri_rows("rms_norm", x, w=w),
            lambda x, r, w, b: torch_rms(x, w),
            lambda x, r, w, b: torch_rms(x.double(), w.double()),
            2 * n + n_row,
        ),
        "rms_norm_residual": (
            lambda x, r, w, b: kaio_ops.rms_norm_residual(x, r, w),
            lambda x, r, w, b: tri_rows("rms_norm_residual", x, r=r, w=w),
            lambda x, r, w, b: torch_rms_residual(x, r, w),
            lambda x, r, w, b: (torch_rms(residual(x, r).double(), w.double()), residual(x, r)),
            4 * n + n_row,
        ),
        "layer_norm": (
            lambda x, r, w, b: kaio_ops.layer_norm(x, w, b),
            lambda x, r, w, b: tri_rows("layer_norm", x, w=w, b=b, eps=1e-5),
            lambda x, r, w, b: F.layer_norm(x, (n_row,), w, b, 1e-5),
            lambda x, r, w, b: F.layer_norm(x.double(), (n_row,), w.double(), b.double(), 1e-5),
            2 * n + 2 * n_row,
        ),
        "softmax": (
            lambda x, r, w, b: kaio_ops.softmax(x),
            lambda x, r, w, b: tri_rows("softmax", x),
            lambda x, r, w, b: torch.softmax(x, -1),
            lambda x, r, w, b: torch.softmax(x.double(), -1),
            2 * n,
        ),
    }
    for op in table:
        kaio_fn, triton_fn, torch_fn, reference, elements = table[op]
        impls = {"kaio": kaio_fn, "triton": triton_fn, "torch": torch_fn}
        h.case(
            op + suffix, label, inputs, impls, reference=reference, nbytes=elements * size, **common
        )


def rope_cases(h: Harness, dt, name: str, shape=(16384, 32, 128)):
    n, size = math.prod(shape), torch.tensor([], dtype=dt).element_size()
    half = shape[-1] // 2

    def inputs():
        theta = torch.rand(shape[0], half, device="cuda") * 6
        return _randn(shape, dt), theta.cos().to(dt), theta.sin().to(dt)

    for interleaved in (False, True):
        h.case(
            "rope " + ("interleaved" if interleaved else "half-split"),
            f"{name} {list(shape)}",
            inputs,
            {
                "kaio": lambda x, c, s, i=interleaved: kaio_ops.rope(x, c, s, interleaved=i),
                "triton": lambda x, c, s, i=interleaved: tri_rope(x, c, s, i),
                "torch": lambda x, c, s, i=interleaved: torch_rope(x, c, s, i),
            },
            reference=lambda x, c, s, i=interleaved: torch_rope(
                x.double(), c.double(), s.double(), i
            ),
            nbytes=(2 * n + 2 * shape[0] * half) * size,
            tol=TOL[dt],
            baseline="triton",
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default=",".join(DTYPES), help="e.g. f16 (default: all three)")
    args, _ = p.parse_known_args()
    h = Harness.from_args("kaio_ops memory-bound ops vs torch eager and Triton")
    print(f"GPU: {h.meta['gpu']}; copy bandwidth {h.copy_bandwidth():.0f} GB/s", flush=True)
    for name in args.dtypes.split(","):
        dt = DTYPES[name]
        rows = 16384 if dt == torch.float32 else 32768  # 256 MiB an array in every dtype
        elementwise_cases(h, dt, name, (rows // 2, 8192))
        row_cases(h, dt, name, (rows, 4096))
        # rows that do not start or end on a 16-byte boundary: x and the residual one element
        # past an allocation, and an odd row length
        for shape, offset in (((rows, 4096), 1), ((rows, 4095), 0)):
            row_cases(h, dt, name, shape, offset, suffix=" unaligned")
        rope_cases(h, dt, name, (rows, 32, 128))
    # rows longer than a block's registers hold (kaio: a thread-block cluster a row on sm_90,
    # else read twice); Triton's one-program row kernel cannot hold them, so torch is the peer
    shape = (256, 262144)
    h.case(
        "softmax long rows",
        f"f32 {list(shape)}",
        lambda: (_randn(shape, torch.float32),),
        {
            "kaio": kaio_ops.softmax,
            "torch": lambda x: torch.softmax(x, -1),
        },
        reference=lambda x: torch.softmax(x.double(), -1),
        nbytes=2 * math.prod(shape) * 4,
        tol=1e-5,
        baseline="torch",
    )
    h.copy_bandwidth()  # again at the end: the GPU's state may drift in a shared machine
    h.finish()


if __name__ == "__main__":
    main()
