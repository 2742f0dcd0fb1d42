"""Every IR op has an entry in each backend's lowering table."""

from kaio.ir.ops import OPS
from kaio.ptx.lowering import LOWERING


def test_every_op_has_ptx_lowering():
    assert sorted(set(OPS) - set(LOWERING)) == []
    assert sorted(set(LOWERING) - set(OPS)) == []


def test_every_op_has_sim_semantics():
    from kaio.sim.semantics import SEMANTICS

    assert sorted(set(OPS) - set(SEMANTICS)) == []
    assert sorted(set(SEMANTICS) - set(OPS)) == []
