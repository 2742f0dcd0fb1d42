"""The legality table (kaio.ir.legality.TABLE) and its pass: every entry is enforced for every
arch (a located CompileError naming the arch it needs, its fallback, or the ``.version`` and
``.target`` it needs), and neither backend decides legality on its own any more."""

import types

import pytest

import kaio
from kaio import bf16, f16, f32, u32
from kaio.errors import CompileError
from kaio.ir import legality
from kaio.ir.legality import ARCHS, FEATURES, TABLE, Need
from kaio.ir.nodes import Const, Function, If, Instr, SourceLoc, Var
from kaio.types import FP8_TYPES, PACKED_TYPES, SCALAR_TYPES

_TYPES = {**SCALAR_TYPES, **FP8_TYPES, **PACKED_TYPES}
LOC = SourceLoc("kernel.py", 12, 4)


def _instr(op: str, key: str) -> Instr:
    """One instruction whose ``legality.key`` is ``key`` (operands only as the pass reads them)."""
    attrs, dst, args = {}, None, ()
    if op == "cvt":
        st, dt = key.split("->")
        dst, args = Var("d", _TYPES[dt]), (Var("a", _TYPES[st]),)
    elif op == "pack":
        dst, args = Var("d", _TYPES[key.split("->")[1]]), (Var("lo", f32), Var("hi", f32))
    elif op == "atomic":
        kind, name = key.split(".")
        attrs = {"kind": kind}
        args = (types.SimpleNamespace(dtype=_TYPES[name]), Const(0, u32), Var("v", _TYPES[name]))
    elif op in ("mma", "wgmma", "wgmma_rs"):
        attrs = {"kind": key}
    elif op == "ldmatrix":
        attrs = {"trans": key == "trans"}
    elif op == "bulk_wait":
        attrs = {"read": key == "read"}
    elif op == "bulk_store":
        attrs = {"reduce": key} if key else {}
    elif op == "ld_vec":
        attrs = {"l2": 256 if key == "l2" else 0}
        if key == "l1":
            attrs["cache"] = "L1::no_allocate"
    elif op == "prefetch_l2":
        attrs = {"bulk": 128 if key else 0}
    elif op == "sreg":
        attrs = {"name": "cluster_ctarank"}
    elif op == "mbarrier_arrive":
        args = (Const(0 if key == "" else 64, u32),)
    elif key:  # typed arithmetic and compares
        t = _TYPES[key]
        dst = Var("d", kaio.bool_ if op in ("lt", "le", "gt", "ge", "eq", "ne") else t)
        args = tuple(Var(f"a{i}", t) for i in range(3 if op == "fma" else 2))
    return Instr(op, dst, args, attrs, loc=LOC)


def _kernel(*body, **meta) -> Function:
    return Function("k", [], [], list(body), meta=meta)


def _lacks(feature: str, sm: int) -> bool:
    f = FEATURES[feature]
    return sm != f.sm if f.arch_specific else sm < f.sm


CASES = [(op, key, arch) for (op, key) in TABLE for arch in ARCHS]


def test_every_entry_names_known_features_and_entries():
    def items(need):
        for item in (*need.uses, *(need.fallback or ())):
            if isinstance(item, Need):
                yield from items(item)
            else:
                yield item

    for need in TABLE.values():
        for item in items(need):
            assert item in FEATURES or item in TABLE, item


def _resolve(need: Need, sm: int) -> list[str] | None:
    """The features ``need`` uses on an SM (its fallback's where it lacks one of its own
    form's); None when that is an error."""
    lacks = any(_lacks(u, sm) for u in need.uses if isinstance(u, str))
    fall = not need.own or (lacks and need.fallback is not None)
    out = []
    for item in need.fallback if fall else need.uses:
        if isinstance(item, str):
            if _lacks(item, sm):
                return None
            out.append(item)
        else:
            inner = _resolve(item if isinstance(item, Need) else TABLE[item], sm)
            if inner is None:
                return None
            out += inner
    return out


@pytest.mark.parametrize("op, key, arch", CASES, ids=lambda x: str(x))
def test_each_entry_is_enforced(op, key, arch):
    """An arch that has what the entry needs (its own form, else its fallback) gets the
    ``.version`` of those features (and ``sm_90a`` for Hopper-only ones), and the backends are
    told which form to emit; one that lacks it gets the located error naming the arch."""
    need = TABLE[op, key]
    ins = _instr(op, key)
    assert legality.key(ins) == key
    sm, base = ARCHS[arch]
    used = _resolve(need, sm)
    if used is None:
        with pytest.raises(CompileError) as info:
            legality.check(_kernel(ins), arch)
        message = str(info.value)
        assert message.startswith("kernel.py:12:5: error: ")
        assert "needs sm_" in message and f"the target is {arch}" in message
        return
    target = legality.check(_kernel(ins), arch)
    assert target.version == max([base, *(FEATURES[f].version for f in used)])
    specific = any(FEATURES[f].arch_specific for f in used)
    assert target.arch == (f"sm_{sm}a" if specific else arch)
    own = need.own and not any(_lacks(u, sm) for u in need.uses if isinstance(u, str))
    assert legality.native(op, key, target) == own


def test_kernel_meta_and_dead_branches():
    """``cluster_dims`` (a kernel property) is checked first; a branch that a constant
    condition never takes is not (the backends do not emit it either)."""
    with pytest.raises(CompileError, match=r"^error: kaio.cluster_dims\(\) needs sm_90"):
        legality.check(_kernel(_instr("tanh", "f32"), cluster=2), "sm_80")
    dead = If(Const(False, kaio.bool_), [_instr("wgmma_fence", "")], [])
    assert legality.check(_kernel(dead), "sm_80").version == (7, 0)
    live = If(Var("c", kaio.bool_), [], [_instr("wgmma_fence", "")])
    with pytest.raises(CompileError, match=r"kaio.wgmma_fence\(\) needs sm_90a"):
        legality.check(_kernel(live), "sm_80")


def test_the_first_illegal_instruction_is_reported():
    first = Instr("cp_async_commit", None, (), {}, loc=SourceLoc("a.py", 3, 0))
    second = Instr("tma_load", None, (), {}, loc=SourceLoc("a.py", 9, 0))
    with pytest.raises(CompileError, match=r"^a.py:3:1: .*cp_async_commit"):
        legality.check(_kernel(first, second), "sm_75")


@kaio.gpu_kernel
def _mixed(x: bf16[:], y: f16[:], out: f32[:]):
    i = kaio.thread_idx_x()
    a = x[i] * x[i] + x[i]
    b = kaio.max(y[i], y[i + 1])
    kaio.atomic_add(out, 0, f32(a) + f32(b) + kaio.tanh(f32(i)))
    if a < x[i + 1]:
        kaio.atomic_add(x, 0, a)


BACKENDS = ["ptx"]
try:
    import llvmlite  # noqa: F401

    BACKENDS.append("llvm")
except ImportError:
    pass


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_backends_only_translate(monkeypatch, backend, arch):
    """Every feature use is recorded by ``legality.check``, none by a backend; and the PTX
    template picker is not called by the LLVM lowering (it called it for its side effects)."""
    inside = []
    check, use = legality.check, legality.Target.use

    def checking(fn, a):
        inside.append(True)
        try:
            return check(fn, a)
        finally:
            inside.pop()

    def recording(self, feature, what, loc=None):
        assert inside, f"a backend decided the legality of {what} ({feature})"
        use(self, feature, what, loc)

    monkeypatch.setattr(legality, "check", checking)
    monkeypatch.setattr(legality.Target, "use", recording)
    for module in ("kaio.ptx", "kaio.llvm.machine"):
        if module in __import__("sys").modules:
            monkeypatch.setattr(module + ".check", checking, raising=False)
    if backend == "llvm":
        import kaio.ptx.templates

        def no_pick(*args):
            raise AssertionError("the LLVM lowering called the PTX template picker")

        monkeypatch.setattr(kaio.ptx.templates, "pick", no_pick)
        for name in ("lowering", "memory"):
            module = __import__(f"kaio.ptx.{name}", fromlist=["pick"])
            monkeypatch.setattr(module, "pick", no_pick)
    text = _mixed.ptx(arch=arch, backend=backend)
    assert (".version 7.1" if arch == "sm_80" else ".version 7.8") in text


@kaio.gpu_kernel(block_size=32)
def _atomic_on_local(out: u32[:]):
    buf = kaio.local(u32, 4)
    buf[0] = u32(0)
    kaio.atomic_add(buf, 0, u32(1))
    out[0] = buf[0]


@kaio.gpu_kernel(block_size=32)
def _atomic_on_u8(out: kaio.u8[:]):
    kaio.atomic_add(out, 0, kaio.u8(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "kernel, message",
    [
        (_atomic_on_local, "works on global or shared arrays, not local ones"),
        (_atomic_on_u8, "does not support u8 arrays"),
    ],
)
def test_atomics_no_arch_has_are_refused_before_either_backend(kernel, message, backend):
    """The frontend refuses them at the call, whatever the backend (IR built otherwise:
    the legality pass, test_ptx_emitter's test_atomic_on_narrow_types_is_an_error)."""
    with pytest.raises(CompileError, match=message) as err:
        kernel.ptx(arch="sm_90", backend=backend)
    assert "test_legality.py" in str(err.value)
