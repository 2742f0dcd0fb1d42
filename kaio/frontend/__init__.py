"""The frontend: Python source of a kernel to typed IR."""

from __future__ import annotations

from kaio.frontend import definite
from kaio.frontend.lower import Lowerer
from kaio.ir.nodes import Function


def compile_kernel(kernel, constexprs: dict, layouts: tuple) -> Function:
    """Lower one specialization of ``kernel`` (constexpr values, array layouts) to IR."""
    function = Lowerer(kernel, constexprs, layouts).lower_kernel()
    definite.check(function)
    return function
