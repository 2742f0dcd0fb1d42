"""Loads, stores and atomics in LLVM IR: element pointers and the memory instructions.

IR operands as in ``kaio.ptx.memory``: ``load dst, (array, *idx)``, ``store (array, *idx,
value)``, ``atomic dst, (array, *idx, value)`` or, for ``cas``, ``(array, *idx, expected,
new)``.

Addresses: one ``getelementptr inbounds`` per indexed dimension on the array's base (an
out-of-bounds access is undefined in kaio too), indices sign- or zero-extended by their type
to 64 bits (global and local arrays) or taken modulo 2^32 (shared memory, whose pointers are
32-bit as in the emitter); constant indices against constant strides fold into one offset.

Atomics are ``atomicrmw``/``cmpxchg`` with ``monotonic`` ordering at ``syncscope("device")``,
which is PTX's default ``atom`` (``.relaxed.gpu``). An atomic is one instruction where
``_RMW`` has one (as the emitter's ``kaio.ptx.memory.ATOMIC``) and, for f16/bf16,
``kaio.ir.legality.native`` says the arch has it; else a compare-and-swap loop. The arch
checks are the legality pass's, so both backends accept and refuse the same atomics.
"""

from __future__ import annotations

from llvmlite import ir

from kaio.ir.legality import native
from kaio.ir.nodes import Array, Const, Instr
from kaio.ir.ops import OpTable
from kaio.llvm.typemap import I32, I64, int_const, lltype, memtype
from kaio.ptx import memory as ptx
from kaio.types import ScalarType

ORDER = 'syncscope("device") monotonic'

# atomicrmw operation by kind and type class
_RMW = {
    "add": {"int": "add", "float": "fadd"},
    "max": {"uint": "umax", "int": "max"},
    "min": {"uint": "umin", "int": "min"},
    "exch": {"int": "xchg", "float": "xchg"},
}


def _index(g, i, ty: ir.IntType) -> ir.Value:
    """An index as an integer of the address width (extended by its signedness)."""
    if isinstance(i, Const):
        return int_const(ty, int(i.value))
    v = g.value(i)
    if i.type.bits > ty.width:
        return g.b.trunc(v, ty)
    if i.type.bits < ty.width:
        return g.b.sext(v, ty) if i.type.kind == "int" else g.b.zext(v, ty)
    return v


def address(g, arr: Array, idxs) -> ir.Value:
    """A pointer to ``arr[idxs]``."""
    elem = memtype(arr.dtype)
    ity = I32 if "shared" in arr.space else I64
    ptr, imm = g.array_base(arr), 0
    for i, s in zip(idxs, g.strides(arr), strict=True):
        if isinstance(i, Const) and isinstance(s, int):
            imm += int(i.value) * s
            continue
        term = _index(g, i, ity)
        if isinstance(s, int):
            if s != 1:
                term = g.b.mul(term, int_const(ity, s))
        else:
            term = g.b.mul(term, s if ity == I64 else g.b.trunc(s, ity))
        ptr = g.b.gep(ptr, [term], inbounds=True, source_etype=elem)
    if imm:
        ptr = g.b.gep(ptr, [int_const(ity, imm)], inbounds=True, source_etype=elem)
    return ptr


def element(g, arr: Array, idxs) -> ir.Value:
    """The pointer of ``arr[idxs]``: an element of a register-promoted local array (checked
    against its shape, as the emitter does), else an address in memory."""
    ptr = ptx.local_register(g, arr, idxs)
    return ptr if ptr is not None else address(g, arr, idxs)


def load(g, ptr: ir.Value, t: ScalarType) -> ir.Value:
    """The value of type ``t`` at ``ptr`` (bool: a nonzero byte)."""
    v = g.b.load(ptr, typ=memtype(t), align=t.itemsize)
    return g.b.icmp_unsigned("!=", v, ir.Constant(v.type, 0)) if t.is_bool else v


def store(g, ptr: ir.Value, t: ScalarType, v: ir.Value) -> None:
    """Write ``v`` of type ``t`` at ``ptr`` (bool: one byte, 0 or 1)."""
    if t.is_bool:
        v = g.b.zext(v, memtype(t))
    g.b.store(v, ptr, align=t.itemsize)


# Loads and stores; the backend's LOWERING adds atomics (they combine values with its arithmetic).
LOWERING = OpTable()


@LOWERING.register("load")
def lower_load(g, ins: Instr) -> None:
    """``dst = array[idx...]``."""
    arr, *idxs = ins.args
    g.set(ins.dst, load(g, element(g, arr, idxs), arr.dtype))


@LOWERING.register("store")
def lower_store(g, ins: Instr) -> None:
    """``array[idx...] = value``."""
    arr, *idxs, value = ins.args
    store(g, element(g, arr, idxs), arr.dtype, g.value(value))


def _bits(g, v: ir.Value, t: ScalarType) -> ir.Value:
    return g.b.bitcast(v, ir.IntType(t.bits)) if t.is_float else v


def lower_atomic(g, ins: Instr, combine) -> None:
    """``old = array[idx]; array[idx] = f(old, value...)``, giving ``old``. ``combine`` is
    ``lowering.binary``: it computes ``f`` inside compare-and-swap loops."""
    arr = ins.args[0]
    idxs, values = ins.args[1 : 1 + arr.ndim], ins.args[1 + arr.ndim :]
    kind, t = ins.attrs["kind"], arr.dtype
    vals = [g.value(v) for v in values]
    ptr = address(g, arr, idxs)
    rmw = _RMW.get(kind, {})
    rmw = rmw.get("uint" if t.kind == "uint" and "uint" in rmw else _class(t))
    if not native("atomic", f"{kind}.{t}", g.target) or (kind != "cas" and rmw is None):
        old = _cas_loop(g, kind, t, ptr, vals[0], combine)
    elif kind == "cas":
        pair = g.b.cmpxchg(ptr, _bits(g, vals[0], t), _bits(g, vals[1], t), ORDER, "monotonic")
        old = g.b.extract_value(pair, 0)
        old = g.b.bitcast(old, lltype(t)) if t.is_float else old
    else:
        old = g.b.atomic_rmw(rmw, ptr, vals[0], ORDER)
    if ins.dst is not None:
        g.set(ins.dst, old)


@LOWERING.register("wait_eq")
def lower_wait_eq(g, ins: Instr) -> None:
    """``wait_eq``: a loop of ``ld.acquire.gpu.global`` (inline PTX) until the element equals
    the value."""
    arr = ins.args[0]
    ptr = address(g, arr, ins.args[1 : 1 + arr.ndim])
    want = g.value(ins.args[-1])
    loop = g.func.append_basic_block("wait_eq")
    done = g.func.append_basic_block("wait_eq_done")
    g.b.branch(loop)
    g.b.position_at_end(loop)
    text = f"ld.acquire.gpu.global.b{arr.dtype.bits} $0, [$1];"
    seen = g.asm(text, "=r,l,~{memory}", I32, [ptr], ("nounwind",), effects=True)
    g.b.cbranch(g.b.icmp_unsigned("==", seen, want), done, loop)
    g.b.position_at_end(done)


def _class(t: ScalarType) -> str:
    return "float" if t.is_float else "int"


def _cas_loop(g, kind: str, t: ScalarType, ptr, v, combine) -> ir.Value:
    """An atomic read-modify-write as a compare-and-swap loop on the element's bits."""
    b = g.b
    first = b.load_atomic(ptr, ORDER, t.itemsize, typ=lltype(t))
    before = b.block
    loop = g.func.append_basic_block("cas")
    done = g.func.append_basic_block("cas_done")
    b.branch(loop)
    b.position_at_end(loop)
    old = b.phi(lltype(t))
    old.add_incoming(first, before)
    new = v if kind == "exch" else combine(g, kind, t, old, v)
    pair = b.cmpxchg(ptr, _bits(g, old, t), _bits(g, new, t), ORDER, "monotonic")
    seen = b.extract_value(pair, 0)
    old.add_incoming(b.bitcast(seen, lltype(t)) if t.is_float else seen, b.block)
    b.cbranch(b.extract_value(pair, 1), done, loop)
    b.position_at_end(done)
    return old
