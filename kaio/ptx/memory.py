"""Loads, stores and atomics: address computation and the memory instructions.

IR operands: ``load dst, (array, *idx)``, ``store (array, *idx, value)``,
``atomic dst, (array, *idx, value)`` or, for ``cas``, ``(array, *idx, expected, new)``; one
index per dimension.

Addresses: ``base + sum(idx[d] * stride_bytes[d]) + constant``, the indices that vary in the
innermost loops added last (``Emitter.loop_depth``). Global and local arrays use
64-bit arithmetic (a 32-bit index times a constant stride is one ``mul.wide``); shared arrays
use 32-bit arithmetic on the shared window. Constant indices against constant strides fold
into the ``[reg+imm]`` immediate, and so do the constant terms of shared-array indices
(``Emitter.constant_offset``). Base registers and strides are computed once, in the
kernel's prologue (``Emitter.array_base``, ``Emitter.byte_strides``).
"""

from __future__ import annotations

from kaio.ir.legality import native
from kaio.ir.nodes import Array, Const, Instr
from kaio.ir.ops import OpTable
from kaio.ptx.regs import bty, immediate, mem_type
from kaio.ptx.templates import fmt, pick
from kaio.types import ScalarType, u32

# Shared arrays (32-bit addresses): an index ``x + c`` adds ``c * stride`` to the immediate
# offset when that is below this many bytes (any shared window is smaller).
_MAX_FOLDED = 1 << 20

SPACE = {"global": "global", "shared": "shared", "shared_dyn": "shared", "local": "local"}

# Atomics the hardware does in one instruction, by kind and type class; the others (float
# max/min, 16-bit exch and add where absent) run a compare-and-swap loop.
ATOMIC = {
    "add": {
        "int": "atom.{sp}.add.u{w} {d}, {addr}, {a}",
        "float": "atom.{sp}.add.{ty} {d}, {addr}, {a}",
        "half": "atom.{sp}.add.noftz.{ty} {d}, {addr}, {a}",
    },
    "max": {"int": "atom.{sp}.max.{ty} {d}, {addr}, {a}"},
    "min": {"int": "atom.{sp}.min.{ty} {d}, {addr}, {a}"},
    "exch": {
        "int": "atom.{sp}.exch.{bt} {d}, {addr}, {a}",
        "float": "atom.{sp}.exch.{bt} {d}, {addr}, {a}",
    },
    "cas": {
        "half": "atom.{sp}.cas.b16 {d}, {addr}, {a}, {b}",
        "any": "atom.{sp}.cas.{bt} {d}, {addr}, {a}, {b}",
    },
}


def _offset(imm: int) -> str:
    """The ``+imm`` of an address, wrapped as address arithmetic wraps (a constant index far
    out of bounds must not make ptxas refuse the PTX: "Constant overflow")."""
    imm %= 2**64
    return f"+{imm}" if imm else ""


def address(e, arr: Array, idxs) -> str:
    """The ``[...]`` address operand of ``arr[idxs]`` (bounds-checked first in debug mode)."""
    if e.debug:
        e.debug.check(arr, idxs)
    wide = arr.space in ("global", "local")
    imm, terms = arr.offset, []
    for i, s in zip(idxs, e.byte_strides(arr), strict=True):
        if isinstance(i, Const) and isinstance(s, int):
            imm += int(i.value) * s
            continue
        if not wide:
            x, c = e.constant_offset(i)
            if c is not None and 0 <= c.value * s < _MAX_FOLDED:
                i, imm = x, imm + c.value * s
        terms.append((i, s))
    terms.sort(key=lambda term: e.loop_depth(term[0]))  # invariant terms first
    if not terms and arr.space != "global":
        return f"[{e.symbol(arr)}{_offset(imm)}]"
    base = e.array_base(arr)
    for i, s in terms:
        acc = e.tmp_addr(wide)
        if not wide:
            e.line(f"mad.lo.s32 {acc}, {_index32(e, i)}, {s}, {base}")
        elif isinstance(i, Const):
            e.line(f"mad.lo.s64 {acc}, {s}, {immediate(i)}, {base}")
        elif i.type.bits < 64 and isinstance(s, int):
            prod = e.tmp_addr(True)
            e.line(f"mul.wide.{'s' if i.type.kind == 'int' else 'u'}32 {prod}, {e.r(i)}, {s}")
            e.line(f"add.s64 {acc}, {base}, {prod}")
        else:
            e.line(f"mad.lo.s64 {acc}, {_index64(e, i)}, {s}, {base}")
        base = acc
    return f"[{base}{_offset(imm)}]"


def _index32(e, i) -> str:
    if isinstance(i, Const) or i.type.bits < 64:
        return e.o(i)
    low = e.tmp(u32)
    e.line(f"cvt.u32.u64 {low}, {e.r(i)}")
    return low


def _index64(e, i) -> str:
    if i.type.bits == 64:
        return e.r(i)
    wide = e.tmp_addr(True)
    e.line(f"cvt.{'s' if i.type.kind == 'int' else 'u'}64.{i.type.ptx[0]}32 {wide}, {e.r(i)}")
    return wide


def local_register(e, arr: Array, idxs) -> str | None:
    """The register holding a register-promoted local element, or None."""
    regs = e.local_registers(arr)
    if regs is None:
        return None
    flat = 0
    for i, n in zip(idxs, arr.shape, strict=True):
        if not 0 <= i.value < n.value:
            e.fail(
                f"index {i.value} is out of bounds for local array {arr.name} of shape "
                f"{tuple(d.value for d in arr.shape)}"
            )
        flat = flat * n.value + i.value
    return regs[flat]


def _mov(t: ScalarType, d: str, a: str) -> str:
    return f"mov.{bty(t)} {d}, {a}"


# The instructions of a load and of a store: for an element of a local array kept in registers
# ({x} its register), for one in memory ({x} its address), and for a bool in memory (one byte,
# 0 or 1, through the u32 register {byte}); {v} is the value loaded or stored.
ACCESS = {
    "load": {
        "register": ("mov.{bt} {v}, {x}",),
        "memory": ("ld.{sp}.{mt} {v}, {x}",),
        "bool": ("ld.{sp}.u8 {byte}, {x}", "setp.ne.u32 {v}, {byte}, 0"),
    },
    "store": {
        "register": ("mov.{bt} {x}, {v}",),
        "memory": ("st.{sp}.{mt} {x}, {v}",),
        "bool": ("selp.u32 {byte}, 1, 0, {v}", "st.{sp}.u8 {x}, {byte}"),
    },
}


# Loads and stores; the backend's LOWERING adds atomics (they combine values with its arithmetic).
LOWERING = OpTable()


@LOWERING.register("load", "store")
def lower_access(e, ins: Instr) -> None:
    """``dst = array[idx...]`` (``load``) and ``array[idx...] = value`` (``store``), by
    ``ACCESS``."""
    arr = ins.args[0]
    idxs, t = ins.args[1 : 1 + arr.ndim], arr.dtype
    v = e.dst(ins) if ins.op == "load" else None
    x = local_register(e, arr, idxs)
    form = "register" if x is not None else "bool" if t.is_bool else "memory"
    if x is None:
        x = address(e, arr, idxs)
    byte = e.tmp(u32) if form == "bool" else None
    if v is None:  # a store: selp takes a register, mov and st also an immediate
        v = (e.r if form == "bool" else e.o)(ins.args[-1])
    fields = {"bt": bty(t), "sp": SPACE[arr.space], "mt": mem_type(t)}
    for template in ACCESS[ins.op][form]:
        e.line(template.format(v=v, x=x, byte=byte, **fields))


@LOWERING.register("wait_eq")
def lower_wait_eq(e, ins: Instr) -> None:
    """``wait_eq``: a loop of ``ld.acquire.gpu.global`` until the element equals the value."""
    arr = ins.args[0]
    t = arr.dtype
    addr = address(e, arr, ins.args[1 : 1 + arr.ndim])
    seen, again = e.tmp(t), e.tmp_pred()
    loop = e.new_label("wait_eq")
    e.place(loop)
    e.line(f"ld.acquire.gpu.global.{bty(t)} {seen}, {addr}")
    e.line(f"setp.ne.{bty(t)} {again}, {seen}, {e.o(ins.args[-1])}")
    e.line(f"@{again} bra {loop}")


def lower_atomic(e, ins: Instr, combine) -> None:
    """``old = array[idx]; array[idx] = f(old, value...)``, returning ``old``. ``combine`` is
    ``lowering.binary``: it computes ``f`` inside compare-and-swap loops."""
    arr = ins.args[0]
    idxs, values = ins.args[1 : 1 + arr.ndim], ins.args[1 + arr.ndim :]
    kind, t = ins.attrs["kind"], arr.dtype
    d = e.dst(ins) if ins.dst is not None else e.tmp(t)
    regs = [e.r(v) for v in values]
    addr, sp = address(e, arr, idxs), SPACE[arr.space]
    template = atomic_instruction(kind, t, e.target)
    if template is not None:
        b = regs[1] if len(regs) > 1 else ""
        e.line(fmt(template, t, d=d, addr=addr, a=regs[0], b=b, sp=sp, w=str(t.bits)))
        return
    _cas_loop(e, kind, t, sp, d, addr, regs[0], combine)


def atomic_instruction(kind: str, t: ScalarType, target) -> str | None:
    """The one instruction of atomic ``kind`` on ``t`` for ``target`` (``ATOMIC``), or None
    where it runs a compare-and-swap loop (``kaio.ir.legality`` decides for f16/bf16)."""
    return pick(ATOMIC[kind], t) if native("atomic", f"{kind}.{t}", target) else None


def _cas_loop(e, kind: str, t: ScalarType, sp: str, d: str, addr: str, v: str, combine) -> None:
    """An atomic read-modify-write as a compare-and-swap loop on the element's bits."""
    bt = bty(t)
    old, new, seen = e.tmp(t), e.tmp(t), e.tmp(t)
    retry = e.tmp_pred()
    loop = e.new_label("cas")
    e.line(f"ld.{sp}.{mem_type(t)} {old}, {addr}")
    e.place(loop)
    if kind == "exch":
        e.line(_mov(t, new, v))
    else:
        combine(e, kind, t, new, old, v)
    e.line(f"atom.{sp}.cas.{bt} {seen}, {addr}, {old}, {new}")
    e.line(f"setp.ne.{bt} {retry}, {seen}, {old}")
    e.line(_mov(t, old, seen))
    e.line(f"@{retry} bra {loop}")
    e.line(_mov(t, d, old))
