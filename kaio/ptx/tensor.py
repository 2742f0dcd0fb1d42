"""Multi-register instructions: vector loads and stores, ``ldmatrix``, ``mma.sync`` and
``cp.async``.

Their register operands are ``Frag`` runs of a register-promoted local array (see
``kaio.ir.nodes.Frag``): the emitter gives each element its own register, and these
instructions name the run as a PTX vector operand ``{%r1, %r2, ...}``. 16-bit elements travel
in pairs through 32-bit registers (``mov.b32 {%h1, %h2}, %r1``), as the hardware moves words.
"""

from __future__ import annotations

from kaio.ir.nodes import Frag, Instr
from kaio.ir.ops import MMA_KINDS, OpTable
from kaio.ptx.memory import SPACE, address
from kaio.types import f32, u32

LOWERING = OpTable()


def frag_registers(e, frag: Frag, builtin: str) -> list[str]:
    """The registers of ``frag``'s elements."""
    regs = e.local_registers(frag.array)
    if regs is None:
        e.fail(
            f"{builtin} keeps local array {frag.array.name!r} in registers, but it is also "
            "indexed with a runtime index (or atomically) elsewhere: index it only with "
            "compile-time constants (kaio.static_range loops)"
        )
    return regs[frag.start : frag.start + frag.size]


def _vector(regs: list[str]) -> str:
    return regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"


def _words(e, frag: Frag, builtin: str, load: bool) -> tuple[list[str], int]:
    """The fragment as the machine words a vector access moves, and their width in bits.
    For 16-bit elements, fresh 32-bit registers are paired with the elements (unpacked after
    a load, packed before a store)."""
    t = frag.array.dtype
    regs = frag_registers(e, frag, builtin)
    if t.bits >= 32:
        return regs, t.bits
    words = [e.tmp(u32) for _ in range(len(regs) // 2)]
    if not load:
        for w, lo, hi in zip(words, regs[::2], regs[1::2], strict=True):
            e.line(f"mov.b32 {w}, {{{lo}, {hi}}}")
    return words, 32


def _unpack(e, frag: Frag, words: list[str]) -> None:
    if frag.array.dtype.bits >= 32:
        return
    regs = frag_registers(e, frag, "kaio.load_vector()")
    for w, lo, hi in zip(words, regs[::2], regs[1::2], strict=True):
        e.line(f"mov.b32 {{{lo}, {hi}}}, {w}")


def _vec_suffix(n: int) -> str:
    return "" if n == 1 else f".v{n}"


@LOWERING.register("ld_vec")
def lower_ld_vec(e, ins: Instr) -> None:
    """``ld.{space}[.cop][.L2::size].v{n}.b{w} {regs}, [addr]``."""
    frag, arr, *idxs = ins.args
    words, w = _words(e, frag, "kaio.load_vector()", load=True)
    addr = address(e, arr, idxs)
    l2 = f".L2::{ins.attrs['l2']}B" if ins.attrs.get("l2") else ""
    cop = f".{ins.attrs['cache']}" if ins.attrs.get("cache") else ""
    e.line(f"ld.{SPACE[arr.space]}{cop}{l2}{_vec_suffix(len(words))}.b{w} {_vector(words)}, {addr}")
    _unpack(e, frag, words)


@LOWERING.register("st_vec")
def lower_st_vec(e, ins: Instr) -> None:
    """``st.{space}.v{n}.b{w} [addr], {regs}``."""
    arr, *idxs, frag = ins.args
    words, w = _words(e, frag, "kaio.store_vector()", load=False)
    addr = address(e, arr, idxs)
    e.line(f"st.{SPACE[arr.space]}{_vec_suffix(len(words))}.b{w} {addr}, {_vector(words)}")


@LOWERING.register("prefetch_l2")
def lower_prefetch_l2(e, ins: Instr) -> None:
    """``prefetch.global.L2 [addr]``, or ``cp.async.bulk.prefetch.L2.global [addr], n``."""
    arr, *idxs = ins.args
    if ins.attrs.get("bulk"):
        e.line(f"cp.async.bulk.prefetch.L2.global {address(e, arr, idxs)}, {ins.attrs['bulk']}")
    else:
        e.line(f"prefetch.global.L2 {address(e, arr, idxs)}")


@LOWERING.register("ldmatrix")
def lower_ldmatrix(e, ins: Instr) -> None:
    """``ldmatrix.sync.aligned.m8n8.x{n}[.trans].shared.b16``."""
    frag, arr, *idxs = ins.args
    builtin = "kaio.ldmatrix_trans()" if ins.attrs["trans"] else "kaio.ldmatrix()"
    regs = frag_registers(e, frag, builtin)
    trans = ".trans" if ins.attrs["trans"] else ""
    addr = address(e, arr, idxs)
    dst = "{" + ", ".join(regs) + "}"  # a vector operand even for x1
    e.line(f"ldmatrix.sync.aligned.m8n8.x{len(regs)}{trans}.shared.b16 {dst}, {addr}")


def _as_b32(e, regs: list[str], frag: Frag) -> list[str]:
    """f32 registers moved into .b32 ones (tf32 operands are bit patterns)."""
    if frag.array.dtype != f32:
        return regs
    out = [e.tmp(u32) for _ in regs]
    for o, r in zip(out, regs, strict=True):
        e.line(f"mov.b32 {o}, {r}")
    return out


@LOWERING.register("mma")
def lower_mma(e, ins: Instr) -> None:
    """``mma.sync.aligned.{shape}.row.col.{acc}.{in}.{in}.{acc} d, a, b, c``."""
    kind = MMA_KINDS[ins.attrs["kind"]]
    builtin = f"kaio.mma_{ins.attrs['kind']}()"
    d, a, b, c = (frag_registers(e, f, builtin) for f in ins.args)
    a = _as_b32(e, a, ins.args[1])
    b = _as_b32(e, b, ins.args[2])
    types = f"{kind.acc}.{kind.input}.{kind.input}.{kind.acc}"
    operands = ", ".join(_vector(r) for r in (d, a, b, c))
    e.line(f"mma.sync.aligned.{kind.ptx_shape}.row.col.{types} {operands}")


@LOWERING.register("to_tf32")
def lower_to_tf32(e, ins: Instr) -> None:
    """``cvt.rna.tf32.f32`` (its result is a .b32 bit pattern, moved back to f32)."""
    bits = e.tmp(u32)
    e.line(f"cvt.rna.tf32.f32 {bits}, {e.r(ins.args[0])}")
    e.line(f"mov.b32 {e.dst(ins)}, {bits}")


def cp_async_operands(ins: Instr) -> tuple:
    """``(dst, dst_idx, src, src_idx, src_bytes, nbytes, cache)`` of a ``cp_async``
    instruction (args: dst, its indices, src, its indices, the source byte count)."""
    dst = ins.args[0]
    src_at = 1 + dst.ndim
    src = ins.args[src_at]
    dst_idx, src_idx = ins.args[1:src_at], ins.args[src_at + 1 : src_at + 1 + src.ndim]
    return dst, dst_idx, src, src_idx, ins.args[-1], ins.attrs["bytes"], ins.attrs["cache"]


@LOWERING.register("cp_async")
def lower_cp_async(e, ins: Instr) -> None:
    """``cp.async.{ca,cg}.shared.global [dst], [src], bytes[, src_bytes]``."""
    dst, dst_idx, src, src_idx, size, nbytes, cache = cp_async_operands(ins)
    d, s = address(e, dst, dst_idx), address(e, src, src_idx)
    full = getattr(size, "value", None) == nbytes
    tail = "" if full else f", {e.o(size)}"
    e.line(f"cp.async.{cache}.shared.global {d}, {s}, {nbytes}{tail}")


@LOWERING.register("cp_async_commit")
def lower_cp_async_commit(e, ins: Instr) -> None:
    """``cp.async.commit_group``."""
    e.line("cp.async.commit_group")


@LOWERING.register("cp_async_wait")
def lower_cp_async_wait(e, ins: Instr) -> None:
    """``cp.async.wait_group n``."""
    e.line(f"cp.async.wait_group {ins.attrs['pending']}")
