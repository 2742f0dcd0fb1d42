"""The PTX emitter: every op for every type it allows, control flow, memory spaces, targets.

Kernels are built by hand as IR and every result is assembled with ptxas (skipped only when
ptxas is not installed), so a malformed instruction fails the test.
"""

from __future__ import annotations

import re

import pytest

import kaio
from kaio.errors import CompileError
from kaio.ir.nodes import (
    Array,
    Break,
    Const,
    Continue,
    Function,
    If,
    Instr,
    Loop,
    Param,
    Region,
    Return,
    SourceLoc,
    Var,
)
from kaio.ir.ops import ATOMIC_KINDS, OPS, SHUFFLE_MODES, SPECIAL_REGISTERS
from kaio.ptx import emit
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio.types import SCALAR_TYPES, bf16, bool_, f16, f32, f64, i8, i16, i32, i64, u8, u32, u64

ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120")
MIN_VERSION = {
    "sm_75": "6.3",
    "sm_80": "7.0",
    "sm_86": "7.1",
    "sm_89": "7.8",
    "sm_90": "7.8",
    "sm_90a": "8.0",
    "sm_100": "8.6",
    "sm_120": "8.7",
}

INTS = [t for t in SCALAR_TYPES.values() if t.is_int]
FLOATS = [t for t in SCALAR_TYPES.values() if t.is_float]
TYPESETS = {
    "num": INTS + FLOATS,
    "int": INTS,
    "intbool": INTS + [bool_],
    "float": FLOATS,
    "float_exact": [f32, f64],
    "f32": [f32],
    "bool": [bool_],
    "any": list(SCALAR_TYPES.values()),
}


def check(ptx: str, *archs: str) -> None:
    """Assemble ``ptx`` with ptxas for each arch."""
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for arch in archs:
        assemble(ptx, arch)


def compile_and_check(fn: Function, archs=("sm_80", "sm_90")) -> dict[str, str]:
    """Emit ``fn`` for each arch and assemble it; returns the PTX per arch."""
    out = {}
    for arch in archs:
        out[arch] = emit(fn, arch)
        check(out[arch], arch)
    return out


class K:
    """A small IR builder for test kernels."""

    def __init__(self, name: str = "k"):
        self.name = name
        self.params: list[Param] = []
        self.arrays: list[Array] = []
        self.body: list = []
        self.n = 0

    def var(self, t, name: str = "t") -> Var:
        self.n += 1
        return Var(f"{name}{self.n}", t)

    def scalar(self, name: str, t) -> Var:
        v = Var(name, t)
        self.params.append(Param(name, v, "scalar", name))
        return v

    def global_array(self, name: str, t, ndim: int = 1, strided: bool = False) -> Array:
        ptr = Var(f"{name}_ptr", u64)
        shape = tuple(Var(f"{name}_shape{d}", i64) for d in range(ndim))
        strides = tuple(Var(f"{name}_stride{d}", i64) for d in range(ndim)) if strided else None
        arr = Array(name, t, "global", shape, strides, ptr)
        self.params.append(Param(f"{name}_ptr", ptr, "ptr", name, -1, arr))
        for d, s in enumerate(shape):
            self.params.append(Param(s.name, s, "shape", name, d, arr))
        for d, s in enumerate(strides or ()):
            self.params.append(Param(s.name, s, "stride", name, d, arr))
        self.arrays.append(arr)
        return arr

    def array(self, name: str, t, space: str, shape: tuple) -> Array:
        dims = (None,) if space == "shared_dyn" else tuple(Const(d, i32) for d in shape)
        arr = Array(name, t, space, dims)
        self.arrays.append(arr)
        return arr

    def emit(self, op: str, t, *args, **attrs) -> Var | None:
        dst = self.var(t) if t is not None else None
        self.body.append(Instr(op, dst, tuple(args), attrs))
        return dst

    def tid(self) -> Var:
        return self.emit("sreg", u32, name="tid.x")

    def fn(self, filename: str = "") -> Function:
        return Function(self.name, self.params, self.arrays, self.body, filename=filename)


def elementwise(op: str, in_types, out_type, attrs=None, const_last=False) -> Function:
    """out[tid] = op(in0[tid], in1[tid], ...), the last operand a constant if asked."""
    k = K(f"{op}_kernel")
    idx = k.tid()
    args = []
    for n, t in enumerate(in_types):
        if const_last and n == len(in_types) - 1:
            args.append(Const(True if t.is_bool else 3 if not t.is_float else 1.5, t))
        else:
            args.append(k.emit("load", t, k.global_array(f"in{n}", t), idx))
    r = k.emit(op, out_type, *args, **(attrs or {}))
    k.emit("store", None, k.global_array("out", out_type), idx, r)
    return k.fn()


def _cases(rule: str):
    return [
        (op, t)
        for op, info in OPS.items()
        if info.rule == rule
        for t in TYPESETS[info.types]
        if not (op == "not" and not t.is_bool)
    ]


@pytest.mark.parametrize("op,t", _cases("binary"), ids=str)
@pytest.mark.parametrize("const", [False, True], ids=["reg", "imm"])
def test_binary(op, t, const):
    compile_and_check(elementwise(op, [t, t], t, const_last=const))


@pytest.mark.parametrize("op,t", _cases("shift"), ids=str)
@pytest.mark.parametrize("const", [False, True], ids=["reg", "imm"])
def test_shift(op, t, const):
    compile_and_check(elementwise(op, [t, u32], t, const_last=const))


@pytest.mark.parametrize("op,t", _cases("unary"), ids=str)
def test_unary(op, t):
    compile_and_check(elementwise(op, [t], t))


@pytest.mark.parametrize("op,t", _cases("compare"), ids=str)
@pytest.mark.parametrize("const", [False, True], ids=["reg", "imm"])
def test_compare(op, t, const):
    compile_and_check(elementwise(op, [t, t], bool_, const_last=const))


@pytest.mark.parametrize("op,t", _cases("ternary"), ids=str)
def test_ternary(op, t):
    compile_and_check(elementwise(op, [t, t, t], t))


@pytest.mark.parametrize("t", TYPESETS["any"], ids=str)
@pytest.mark.parametrize("const", [False, True], ids=["reg", "imm"])
def test_select(t, const):
    compile_and_check(elementwise("select", [bool_, t, t], t, const_last=const))


@pytest.mark.parametrize("src", TYPESETS["any"], ids=str)
@pytest.mark.parametrize("dst", TYPESETS["any"], ids=str)
def test_cvt(src, dst):
    fn = elementwise("cvt", [src], dst)
    archs = ("sm_75", "sm_80", "sm_90")
    if "bf16" in (src.name, dst.name) and src != dst and bool_ not in (src, dst):
        with pytest.raises(CompileError, match="sm_80"):
            emit(fn, "sm_75")
        archs = ("sm_80", "sm_90")
    compile_and_check(fn, archs)


@pytest.mark.parametrize(
    "src,dst",
    [
        (s, d)
        for s in SCALAR_TYPES.values()
        for d in SCALAR_TYPES.values()
        if s.bits == d.bits and not (s.is_bool or d.is_bool)
    ],
    ids=str,
)
def test_bitcast(src, dst):
    compile_and_check(elementwise("bitcast", [src], dst))


def test_bitcast_f32_is_a_move():
    ptx = emit(elementwise("bitcast", [f32], u32), "sm_80")
    assert "mov.b32" in ptx


@pytest.mark.parametrize("name", SPECIAL_REGISTERS)
def test_sreg(name):
    k = K()
    v = k.emit("sreg", u32, name=name)
    k.emit("store", None, k.global_array("out", u32), k.tid(), v)
    arch = "sm_90" if name.startswith("cluster") else "sm_80"  # clusters came with sm_90
    ptx = compile_and_check(k.fn(), (arch,))[arch]
    assert f"%{name}" in ptx


@pytest.mark.parametrize("mode", SHUFFLE_MODES)
@pytest.mark.parametrize("t", TYPESETS["any"], ids=str)
def test_shfl(mode, t):
    k = K()
    idx = k.tid()
    v = k.emit("load", t, k.global_array("a", t), idx)
    r = k.emit("shfl", t, v, Const(1, u32), mode=mode)
    k.emit("store", None, k.global_array("out", t), idx, r)
    ptx = compile_and_check(k.fn())["sm_80"]
    assert f"shfl.sync.{mode}.b32" in ptx
    assert (", 0, 0xffffffff" if mode == "up" else ", 0x1f, 0xffffffff") in ptx


def test_shfl_64_bit_is_two_shuffles():
    ptx = emit(elementwise("shfl", [f64, u32], f64, {"mode": "bfly"}), "sm_80")
    assert ptx.count("shfl.sync.bfly.b32") == 2


@pytest.mark.parametrize("op", ["vote_any", "vote_all", "ballot"])
def test_votes(op):
    out = u32 if op == "ballot" else bool_
    ptx = compile_and_check(elementwise(op, [bool_], out))["sm_80"]
    assert "vote.sync." in ptx


@pytest.mark.parametrize(
    "op,text",
    [
        ("sync_threads", "bar.sync 0;"),
        ("sync_warp", "bar.warp.sync 0xffffffff;"),
        ("threadfence", "membar.gl;"),
    ],
)
def test_barriers(op, text):
    k = K()
    k.emit(op, None)
    assert text in compile_and_check(k.fn())["sm_80"]


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("t", TYPESETS["any"], ids=str)
@pytest.mark.parametrize("space", ["global", "shared", "shared_dyn", "local"])
def test_load_store(t, space):
    k = K()
    idx = k.tid()
    src = k.global_array("src", t)
    arr = k.global_array("a", t) if space == "global" else k.array("a", t, space, (64,))
    v = k.emit("load", t, src, idx)
    k.emit("store", None, arr, idx, v)
    w = k.emit("load", t, arr, Const(3, i32))
    k.emit("store", None, src, idx, w)
    ptx = compile_and_check(k.fn())["sm_80"]
    assert f"st.{'shared' if 'shared' in space else space}." in ptx


def test_global_2d_contiguous_and_strided():
    k = K()
    i, j = k.tid(), k.emit("sreg", u32, name="ctaid.x")
    a = k.global_array("a", f32, 2)
    b = k.global_array("b", f32, 2, strided=True)
    c = k.global_array("c", f64, 3)
    j64 = k.emit("cvt", i64, j)
    v = k.emit("load", f32, a, i, j64)
    w = k.emit("load", f32, b, j, Const(2, i32))
    x = k.emit("add", f32, v, w)
    k.emit("store", None, b, i, j, x)
    y = k.emit("cvt", f64, x)
    k.emit("store", None, c, Const(1, i32), i, j, y)
    k.emit("store", None, c, i, j, Const(0, i32), y)
    ptx = compile_and_check(k.fn())["sm_80"]
    assert ptx.count("cvta.to.global.u64") == 3  # once per array, not per access


def test_global_1d_uses_mul_wide():
    ptx = emit(elementwise("add", [f32, f32], f32), "sm_80")
    assert "mul.wide.u32" in ptx
    assert ptx.count("cvta.to.global.u64") == 3


def test_shared_2d_and_dynamic_declarations():
    k = K()
    i = k.tid()
    s = k.array("tile", f32, "shared", (16, 17))
    d = k.array("dyn", f16, "shared_dyn", None)
    v = k.emit("load", f16, d, i)
    f = k.emit("cvt", f32, v)
    k.emit("store", None, s, i, Const(4, i32), f)
    k.emit("sync_threads", None)
    w = k.emit("load", f32, s, Const(1, i32), Const(2, i32))
    n = k.emit("sreg", u32, name="dynamic_smem_size")
    k.emit("store", None, k.global_array("out", f32), n, w)
    ptx = compile_and_check(k.fn())["sm_80"]
    assert ".shared .align 16 .b8 s_tile[1088];" in ptx
    assert ".extern .shared .align 16 .b8 s_dyn[];" in ptx
    assert "[s_tile+76]" in ptx  # constant indices fold into the address


@pytest.mark.parametrize("t", TYPESETS["any"], ids=str)
def test_local_constant_indices_live_in_registers(t):
    k = K()
    i = k.tid()
    acc = k.array("acc", t, "local", (2, 2))
    src = k.global_array("src", t)
    for n in range(4):
        v = k.emit("load", t, src, Const(n, i32))
        k.emit("store", None, acc, Const(n // 2, i32), Const(n % 2, i32), v)
    k.emit("store", None, acc, Const(0, i32), Const(0, i32), Const(1, t))
    x = k.emit("load", t, acc, Const(1, i32), Const(1, i32))
    k.emit("store", None, src, i, x)
    ptx = compile_and_check(k.fn())["sm_80"]
    assert ".local" not in ptx and "ld.local" not in ptx


def test_local_dynamic_index_uses_local_memory():
    k = K()
    i = k.tid()
    buf = k.array("buf", i32, "local", (8,))
    k.emit("store", None, buf, i, Const(5, i32))
    x = k.emit("load", i32, buf, Const(2, i32))
    k.emit("store", None, k.global_array("out", i32), i, x)
    ptx = compile_and_check(k.fn())["sm_80"]
    assert ".local .align 16 .b8 l_buf[32];" in ptx


ATOMIC_TYPES = [i32, u32, i64, u64, f32, f64, f16, bf16]


@pytest.mark.parametrize("kind", ATOMIC_KINDS)
@pytest.mark.parametrize("t", ATOMIC_TYPES, ids=str)
@pytest.mark.parametrize("space", ["global", "shared"])
def test_atomic(kind, t, space):
    k = K()
    idx = k.tid()
    arr = k.global_array("a", t) if space == "global" else k.array("a", t, space, (32,))
    v = k.emit("load", t, k.global_array("v", t), idx)
    extra = (v,) if kind == "cas" else ()
    old = k.emit("atomic", t, arr, idx, v, *extra, kind=kind)
    k.emit("store", None, k.global_array("out", t), idx, old)
    k.emit("atomic", None, arr, Const(0, i32), v, *extra, kind=kind)
    archs = ("sm_80", "sm_90") if t.name != "bf16" else ("sm_90",)
    ptx = compile_and_check(k.fn(), archs)
    assert f"atom.{space}." in ptx[archs[0]]


def test_atomic_native_forms():
    def ptx(kind, t, arch="sm_80"):
        k = K()
        a = k.global_array("a", t)
        k.emit("atomic", t, a, k.tid(), Const(1, t), kind=kind)
        return compile_and_check(k.fn(), (arch,))[arch]

    assert "atom.global.add.f32" in ptx("add", f32)
    assert "atom.global.add.noftz.f16" in ptx("add", f16)
    assert "atom.global.add.noftz.bf16" in ptx("add", bf16, "sm_90")
    assert "atom.global.cas.b32" in ptx("max", f32)  # CAS loop
    assert "atom.global.max.s64" in ptx("max", i64)
    assert "atom.global.cas.b16" in ptx("add", bf16)  # CAS loop below sm_90


@pytest.mark.parametrize("t", [i8, u8, i16, bool_], ids=str)
def test_atomic_on_narrow_types_is_an_error(t):
    k = K()
    k.emit("atomic", t, k.global_array("a", t), k.tid(), Const(1, t), kind="add")
    with pytest.raises(CompileError, match="atomic_add"):
        emit(k.fn(), "sm_80")


# ----------------------------------------------------------------------------- control flow


def control_flow_kernel() -> Function:
    """A loop with continue and break, an if/else, a region left early and a return."""
    k = K("control")
    i = k.tid()
    n = k.scalar("n", u32)
    flag = k.scalar("flag", bool_)
    out = k.global_array("out", i32)
    acc = Var("acc", i32)
    j = Var("j", u32)
    k.body.append(Instr("mov", acc, (Const(0, i32),)))
    k.body.append(Instr("mov", j, (Const(0, u32),)))
    loop_id, region_id = 1, 2
    done = Var("done", bool_)
    odd, bit = Var("odd", bool_), Var("bit", u32)
    ji = Var("ji", i32)
    body = [
        Instr("ge", done, (j, n)),
        If(done, [Break(loop_id)], []),
        Instr("and", bit, (j, Const(1, u32))),
        Instr("ne", odd, (bit, Const(0, u32))),
        If(odd, [Continue(loop_id)], []),
        Instr("cvt", ji, (j,)),
        If(flag, [Instr("add", acc, (acc, ji))], [Instr("sub", acc, (acc, ji))]),
    ]
    step = [Instr("add", j, (j, Const(1, u32)))]
    k.body.append(Loop(loop_id, body, step))
    neg = Var("neg", bool_)
    k.body.append(
        Region(
            region_id,
            [
                Instr("lt", neg, (acc, Const(0, i32))),
                If(neg, [Break(region_id)], []),
                Instr("mul", acc, (acc, Const(2, i32))),
            ],
        )
    )
    big = Var("big", bool_)
    k.body.append(Instr("gt", big, (i, Const(1000, u32))))
    k.body.append(If(big, [Return()], []))
    k.body.append(If(Const(True, bool_), [Instr("store", None, (out, i, acc))], []))
    return k.fn()


def test_control_flow():
    ptx = compile_and_check(control_flow_kernel())["sm_80"]
    assert re.search(r"@%p\d+ ret;", ptx)  # an if holding only a jump: one predicated ret
    assert re.search(r"\$L__loop\d+_step:", ptx)
    assert ".param .u8 flag" in ptx
    assert "setp.ne.u32" in ptx


def test_representative_kernel_on_every_arch():
    fn = control_flow_kernel()
    for arch in ARCHS:
        ptx = emit(fn, arch)
        assert f".target {arch}" in ptx
        check(ptx, arch)


# ----------------------------------------------------------------------------- targets


@pytest.mark.parametrize("arch", ARCHS)
def test_version_is_minimal(arch):
    ptx = emit(elementwise("add", [f32, f32], f32), arch)
    assert f".version {MIN_VERSION[arch]}\n" in ptx
    assert ".address_size 64" in ptx


def test_version_raised_by_instructions():
    assert ".version 7.0" in emit(elementwise("tanh", [f32], f32), "sm_75")
    assert ".version 7.1" in emit(elementwise("cvt", [bf16], f32), "sm_80")
    assert ".version 7.0" in emit(elementwise("cvt", [f32], bf16), "sm_80")
    assert ".version 7.8" in emit(elementwise("cvt", [i32], bf16), "sm_90")


def test_unknown_arch():
    with pytest.raises(CompileError, match="unknown GPU architecture 'sm_70'"):
        emit(elementwise("add", [f32, f32], f32), "sm_70")


def test_unsupported_feature_names_builtin_and_arch():
    fn = elementwise("add", [bf16, bf16], bf16)
    fn.body[-2].loc = SourceLoc("kern.py", 7, 4)
    with pytest.raises(CompileError, match=r"bf16 conversion needs sm_80") as info:
        emit(fn, "sm_75")
    assert info.value.lineno == 7


def test_bf16_arithmetic_native_on_sm90_via_f32_below():
    fn = elementwise("mul", [bf16, bf16], bf16)
    assert "mul.rn.bf16" in emit(fn, "sm_90")
    below = emit(fn, "sm_80")
    assert "mul.rn.f32" in below and "cvt.rn.bf16.f32" in below


def test_integer_sequences():
    floordiv = emit(elementwise("floordiv", [i32, i32], i32), "sm_80")
    assert "div.s32" in floordiv and "rem.s32" in floordiv and "sub.s32" in floordiv
    assert "rem.u32" in emit(elementwise("mod", [u32, u32], u32), "sm_80")
    narrow = emit(elementwise("add", [i8, i8], i8), "sm_80")
    assert "ld.global.s8" in narrow and "cvt.s32.s8" in narrow and "st.global.s8" in narrow


def test_float_constants_are_exact_hex():
    ptx = emit(elementwise("mul", [f32, f32], f32, const_last=True), "sm_80")
    assert "0f3FC00000" in ptx
    ptx = emit(elementwise("mul", [f64, f64], f64, const_last=True), "sm_80")
    assert "0d3FF8000000000000" in ptx


def test_float_ne_is_unordered_and_unsigned_compares():
    assert "setp.neu.f32" in emit(elementwise("ne", [f32, f32], bool_), "sm_80")
    assert "setp.lo.u32" in emit(elementwise("lt", [u32, u32], bool_), "sm_80")
    assert "setp.lt.s32" in emit(elementwise("lt", [i32, i32], bool_), "sm_80")


def test_line_info(tmp_path):
    src = tmp_path / "kern.py"
    src.write_text("def k():\n    x = a + b\n    y = x * 2\n")
    fn = elementwise("add", [f32, f32], f32)
    for n, s in enumerate(fn.body):
        s.loc = SourceLoc(str(src), 2 + n % 2, 4)
    ptx = compile_and_check(fn)["sm_80"]
    assert f'.file 1 "{src}"' in ptx
    assert ".loc 1 2 5" in ptx and ".loc 1 3 5" in ptx
    assert "// kern.py:2  x = a + b" in ptx


@kaio.gpu_kernel
def _far_index(a: i32[:], out: i32[:, :]):
    i = kaio.thread_idx_x()
    out[i, 2**63 - 1] = a[i]


def test_a_constant_index_far_out_of_bounds_still_assembles():
    """The immediate of ``out[i, 2**63 - 1]`` (4 * (2**63 - 1) bytes: past 64 bits) wraps as
    the address arithmetic does, so ptxas takes the PTX (it refused "Constant overflow";
    found by the frontend fuzzer)."""
    for arch in ("sm_80", "sm_90"):
        ptx = _far_index.ptx(arch=arch)
        assert f"+{(4 * (2**63 - 1)) % 2**64}]" in ptx
        check(ptx, arch)
