"""Every IR op has an entry in each backend's lowering table and in the simulator's."""

from kaio.ir.ops import OPS
from kaio.ptx.lowering import LOWERING


def test_every_op_has_ptx_lowering():
    assert sorted(set(OPS) - set(LOWERING)) == []
    assert sorted(set(LOWERING) - set(OPS)) == []


def test_every_op_has_sim_semantics():
    from kaio.sim.semantics import SEMANTICS

    assert sorted(set(OPS) - set(SEMANTICS)) == []
    assert sorted(set(SEMANTICS) - set(OPS)) == []


def test_every_op_has_llvm_lowering():
    import pytest

    pytest.importorskip("llvmlite")
    from kaio.llvm.lowering import LOWERING as LLVM_LOWERING

    assert sorted(set(OPS) - set(LLVM_LOWERING)) == []
    assert sorted(set(LLVM_LOWERING) - set(OPS)) == []


def test_every_special_op_declares_its_operands():
    from kaio.ir.ops import SIGNATURES

    special = {op for op, info in OPS.items() if info.rule == "special"}
    assert sorted(special - set(SIGNATURES)) == []
    assert sorted(set(SIGNATURES) - special) == []


def test_verifier_checks_declared_operands():
    """The Hopper matmul (TMA, mbarriers, wgmma, descriptors, fragments) verifies; an
    instruction that breaks its op's declared signature does not."""
    import pytest

    from kaio.ir.nodes import Const, Instr
    from kaio.ir.verifier import verify
    from kaio.types import bool_, f32, u32, u64
    from kaio_ops import _matmul_hopper

    kernel, constexprs = _matmul_hopper.specializations()[-1]
    fn = kernel.specialize(constexprs).function
    verify(fn)
    bad = [
        Instr("shfl", fn.params[-1].value, (Const(1.0, f32), Const(1, u64)), {"mode": "bfly"}),
        Instr("sync_threads", None, (Const(1, u32),), {}),
        Instr("ballot", None, (Const(True, bool_),), {}),  # no u32 result
    ]
    for instr in bad:
        fn.body.append(instr)
        with pytest.raises(ValueError, match=instr.op):
            verify(fn)
        fn.body.pop()


def test_op_table_refuses_unknown_and_repeated_ops():
    """A backend's table takes each op of the catalogue once, by name."""
    import pytest

    from kaio.ir.ops import OpTable

    table = OpTable()

    @table.register("add", "sub")
    def lower(backend, ins):
        """A lowering."""

    assert table == {"add": lower, "sub": lower}
    with pytest.raises(ValueError, match="'addd' is not an IR op"):
        table.register("addd")(lower)
    with pytest.raises(ValueError, match="'add' already has an entry"):
        table.add("add", lower)
    with pytest.raises(ValueError, match="'sub' already has an entry"):
        table.include({"mul": lower, "sub": lower})
