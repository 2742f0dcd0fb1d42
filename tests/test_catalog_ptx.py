"""Every catalog kernel's PTX assembles with ptxas: all for sm_80 and sm_90, a representative
set for the other targets."""

import pytest

from kaio.ptx.ptxas import assemble, find_ptxas
from tests.catalog import CASES

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
REPRESENTATIVE = {
    "silu_gate",
    "int_arith",
    "loops",
    "shared_reduce",
    "warp_ops",
    "atomics",
    "math_builtins",
    "local_arrays",
}


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_ptx_assembles(case, arch):
    assemble(case.kernel.ptx(arch=arch, **case.constexprs), arch)


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_75", "sm_86", "sm_89", "sm_100", "sm_120"])
@pytest.mark.parametrize(
    "case", [c for c in CASES if c.name in REPRESENTATIVE], ids=lambda c: c.name
)
def test_ptx_assembles_other_targets(case, arch):
    assemble(case.kernel.ptx(arch=arch, **case.constexprs), arch)
