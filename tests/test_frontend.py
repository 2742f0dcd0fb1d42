"""The frontend and IR passes on every catalog kernel: lowering succeeds, the IR verifies
after every pass, and the printer shows it."""

import pytest

from kaio.frontend import compile_kernel
from kaio.ir import passes
from kaio.ir.printer import format_function
from kaio.ir.verifier import verify
from tests.catalog import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_ir_verifies_after_every_pass(case):
    kernel = case.kernel
    layouts = ("C",) * len(kernel.array_params())
    fn = compile_kernel(kernel, case.constexprs, layouts)
    verify(fn)
    passes.unroll(fn)
    verify(fn)
    for _ in range(4):
        passes.fold(fn)
        verify(fn)
        passes.propagate_copies(fn)
        verify(fn)
        passes.eliminate_dead_code(fn)
        verify(fn)
    for late in (passes.strength_reduce, passes.constants_outward, passes.hoist_invariants):
        late(fn)
        verify(fn)
    text = format_function(fn)
    assert text.startswith(f"kernel {kernel.__name__}(")
    assert "static_for" not in text


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_ir_printer_via_kernel(case):
    text = case.kernel.ir(**case.constexprs)
    assert kernel_name(case) in text


def kernel_name(case):
    return case.kernel.__name__
