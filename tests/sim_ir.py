"""Hand-built IR kernels for the simulator tests (no frontend needed)."""

from __future__ import annotations

import inspect

import numpy as np

from kaio.ir.builder import Builder
from kaio.ir.nodes import Array, Const, Function, Param, SourceLoc, Var
from kaio.sim import simulate_ir
from kaio.types import ScalarType, i64, u32, u64


def here() -> SourceLoc:
    """The caller's source location (for error-message tests)."""
    frame = inspect.currentframe().f_back
    return SourceLoc(frame.f_code.co_filename, frame.f_lineno, 0)


class KernelIR:
    """A kernel built instruction by instruction: ``k.load``, ``k.store``, ``k.op``..."""

    def __init__(self, name: str = "k"):
        self.b = Builder()
        self.params: list[Param] = []
        self.arrays: list[Array] = []
        self.name = name

    def global_array(self, name: str, t: ScalarType, ndim: int = 1) -> Array:
        ptr = Var(f"{name}_ptr", u64)
        shape = tuple(Var(f"{name}_n{d}", i64) for d in range(ndim))
        a = Array(name, t, "global", shape, None, ptr)
        self.params.append(Param(ptr.name, ptr, "ptr", name, -1, a))
        for d, v in enumerate(shape):
            self.params.append(Param(v.name, v, "shape", name, d, a))
        self.arrays.append(a)
        return a

    def shared(self, name: str, t: ScalarType, shape: tuple, space: str = "shared") -> Array:
        dims = (None,) if space == "shared_dyn" else tuple(Const(s, i64) for s in shape)
        a = Array(name, t, space, dims)
        self.arrays.append(a)
        return a

    def scalar(self, name: str, t: ScalarType) -> Var:
        v = Var(name, t)
        self.params.append(Param(name, v, "scalar", name))
        return v

    def op(self, op: str, t, *args, **attrs):
        """``dst = op(args)``; ``t`` None for no result."""
        return self.b.emit(op, t, args, **attrs)

    def sreg(self, name: str) -> Var:
        return self.op("sreg", u32, name=name)

    def global_id(self) -> Var:
        """blockIdx.x * blockDim.x + threadIdx.x (u32)."""
        prod = self.op("mul", u32, self.sreg("ctaid.x"), self.sreg("ntid.x"))
        return self.op("add", u32, prod, self.sreg("tid.x"))

    def load(self, a: Array, *idx) -> Var:
        return self.op("load", a.dtype, a, *idx)

    def store(self, a: Array, *idx_and_value) -> None:
        self.op("store", None, a, *idx_and_value)

    def function(self) -> Function:
        return Function(self.name, self.params, self.arrays, self.b.body)

    def run(self, grid, block, arrays: dict, scalars: dict | None = None, **kw) -> None:
        by_name = {a.name: a for a in self.arrays}
        by_var = {p.name: p.value for p in self.params if p.role == "scalar"}
        simulate_ir(
            self.function(),
            grid,
            block,
            {by_name[k]: v for k, v in arrays.items()},
            {by_var[k]: v for k, v in (scalars or {}).items()},
            **kw,
        )


def poisoned(shape, dtype) -> np.ndarray:
    """An output array filled with a recognizable non-result."""
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = 0xA5
    return out
