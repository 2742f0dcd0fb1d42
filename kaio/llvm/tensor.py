"""Multi-register instructions in LLVM IR: vector loads and stores, ``ldmatrix``, ``mma.sync``,
``cp.async`` and ``cvt.rna.tf32.f32``.

``Frag`` operands are runs of a local array that SROA keeps in registers; their elements are
read and written through the pointers ``Codegen.local_registers`` gives (with the PTX
emitter's own check, ``kaio.ptx.tensor.frag_registers``, that the array is register-promoted).

Vector memory is an LLVM vector load or store (``<4 x i32>``, ``<8 x half>``...) aligned to
its size, which the NVPTX backend prints as one ``ld.v4.b32``-style access. ``ldmatrix``,
``mma.sync``, ``cp.async`` and ``cvt.rna.tf32.f32`` are inline PTX, the same instructions the
emitter prints: ``mma`` and the tf32 rounding pure (LLVM may move or merge them), ``mma`` and
``ldmatrix`` convergent (warp-collective), ``ldmatrix`` reading memory, the ``cp.async`` family
with side effects and a memory clobber, so that no shared-memory access crosses a wait.
Shared addresses are the 32-bit ``"r"`` operands the emitter uses, global ones 64-bit.
"""

from __future__ import annotations

from llvmlite import ir

from kaio.ir.nodes import Frag, Instr
from kaio.ir.ops import MMA_KINDS, OpTable
from kaio.llvm.memory import address
from kaio.llvm.typemap import (
    CONVERGENT,
    EFFECTS,
    FLOAT,
    I32,
    I64,
    PURE,
    READS,
    VOID,
    int_const,
    lltype,
)
from kaio.ptx.tensor import cp_async_operands, frag_registers
from kaio.types import f32

LOWERING = OpTable()


def read(g, frag: Frag, builtin: str) -> list[ir.Value]:
    """The values of ``frag``'s elements."""
    ty = lltype(frag.array.dtype)
    return [g.b.load(p, typ=ty) for p in frag_registers(g, frag, builtin)]


def write(g, frag: Frag, builtin: str, values: list) -> None:
    """Set ``frag``'s elements to ``values``."""
    for p, v in zip(frag_registers(g, frag, builtin), values, strict=True):
        g.b.store(v, p)


def _words(g, values: list) -> list:
    """32-bit register operands: f32 values (tf32 operands) as their bits."""
    return [g.b.bitcast(v, I32) if v.type == FLOAT else v for v in values]


def shared_address(g, arr, idxs) -> ir.Value:
    """The 32-bit shared-window address of ``arr[idxs]`` (an ``"r"`` operand)."""
    return g.b.ptrtoint(address(g, arr, idxs), I32)


def _vector_type(frag: Frag) -> ir.Type:
    ty = lltype(frag.array.dtype)
    return ty if frag.size == 1 else ir.VectorType(ty, frag.size)


@LOWERING.register("ld_vec")
def lower_ld_vec(g, ins: Instr) -> None:
    """One vector load of the fragment's bytes."""
    frag, arr, *idxs = ins.args
    builtin = "kaio.load_vector()"
    frag_registers(g, frag, builtin)  # check before computing the address
    size = frag.size * frag.array.dtype.itemsize
    if ins.attrs.get("l2") or ins.attrs.get("cache"):
        _ld_vec_l2(g, ins, frag, size)
        return
    vec = g.b.load(address(g, arr, idxs), typ=_vector_type(frag), align=size)
    if frag.size == 1:
        write(g, frag, builtin, [vec])
        return
    write(g, frag, builtin, [g.b.extract_element(vec, int_const(I32, k)) for k in range(frag.size)])


def _ld_vec_l2(g, ins: Instr, frag: Frag, size: int) -> None:
    """A global vector load with an L2 fetch size or a cache operator (inline PTX: LLVM has
    no such load)."""
    arr, idxs = ins.args[1], ins.args[2:]
    n, bits = size // 4, 32  # 4, 8 or 16 bytes: 1, 2 or 4 words
    ty = ir.IntType(bits)
    dst = ", ".join(f"${k}" for k in range(n))
    vec = f"{{{dst}}}" if n > 1 else dst
    suffix = f".v{n}" if n > 1 else ""
    cop = f".{ins.attrs['cache']}" if ins.attrs.get("cache") else ""
    l2 = f".L2::{ins.attrs['l2']}B" if ins.attrs.get("l2") else ""
    text = f"ld.global{cop}{l2}{suffix}.b{bits} {vec}, [${n}];"
    ret = ty if n == 1 else ir.LiteralStructType([ty] * n)
    ptr = g.b.ptrtoint(address(g, arr, idxs), I64)
    out = g.asm(text, ",".join(["=r"] * n + ["l", "~{memory}"]), ret, [ptr], EFFECTS, effects=True)
    words = members(g, out, n)
    raw = words[0] if n == 1 else ir.Constant(ir.VectorType(ty, n), ir.Undefined)
    if n > 1:
        for k, v in enumerate(words):
            raw = g.b.insert_element(raw, v, int_const(I32, k))
    vec = g.b.bitcast(raw, _vector_type(frag))
    if frag.size == 1:
        write(g, frag, "kaio.load_vector()", [vec])
        return
    elems = [g.b.extract_element(vec, int_const(I32, k)) for k in range(frag.size)]
    write(g, frag, "kaio.load_vector()", elems)


@LOWERING.register("st_vec")
def lower_st_vec(g, ins: Instr) -> None:
    """One vector store of the fragment's bytes."""
    arr, *idxs, frag = ins.args
    values = read(g, frag, "kaio.store_vector()")
    vec = values[0]
    if frag.size > 1:
        vec = ir.Constant(_vector_type(frag), ir.Undefined)
        for k, v in enumerate(values):
            vec = g.b.insert_element(vec, v, int_const(I32, k))
    size = frag.size * frag.array.dtype.itemsize
    g.b.store(vec, g.pointer_to(address(g, arr, idxs), vec.type), align=size)


@LOWERING.register("prefetch_l2")
def lower_prefetch_l2(g, ins: Instr) -> None:
    """``prefetch.global.L2 [addr]`` or ``cp.async.bulk.prefetch.L2.global`` (inline PTX)."""
    arr, *idxs = ins.args
    ptr = g.b.ptrtoint(address(g, arr, idxs), I64)
    bulk = ins.attrs.get("bulk")
    text = f"cp.async.bulk.prefetch.L2.global [$0], {bulk};" if bulk else "prefetch.global.L2 [$0];"
    g.asm(text, "l,~{memory}", VOID, [ptr], EFFECTS, effects=True)


def members(g, result, n: int) -> list:
    """The ``n`` values an inline-asm call returns (one value, or a struct of ``n``)."""
    return [result] if n == 1 else [g.b.extract_value(result, k) for k in range(n)]


def operands(first: int, count: int) -> str:
    """``{$first, ..., $(first + count - 1)}``: a vector of inline-asm operands."""
    return "{" + ", ".join(f"${k}" for k in range(first, first + count)) + "}"


@LOWERING.register("ldmatrix")
def lower_ldmatrix(g, ins: Instr) -> None:
    """``ldmatrix.sync.aligned.m8n8.x{n}[.trans].shared.b16``."""
    frag, arr, *idxs = ins.args
    builtin = "kaio.ldmatrix_trans()" if ins.attrs["trans"] else "kaio.ldmatrix()"
    n = len(frag_registers(g, frag, builtin))
    trans = ".trans" if ins.attrs["trans"] else ""
    text = f"ldmatrix.sync.aligned.m8n8.x{n}{trans}.shared.b16 {operands(0, n)}, [${n}];"
    constraints = ",".join(["=r"] * n + ["r", "~{memory}"])
    ret = I32 if n == 1 else ir.LiteralStructType([I32] * n)
    result = g.asm(text, constraints, ret, [shared_address(g, arr, idxs)], READS + CONVERGENT)
    write(g, frag, builtin, members(g, result, n))


@LOWERING.register("mma")
def lower_mma(g, ins: Instr) -> None:
    """``mma.sync.aligned.{shape}.row.col.{acc}.{in}.{in}.{acc} d, a, b, c``."""
    kind = MMA_KINDS[ins.attrs["kind"]]
    builtin = f"kaio.mma_{ins.attrs['kind']}()"
    d, a, b, c = ins.args
    a_vals, b_vals = _words(g, read(g, a, builtin)), _words(g, read(g, b, builtin))
    c_vals = read(g, c, builtin)
    n = d.size
    acc = "f" if d.array.dtype == f32 else "r"
    types = f"{kind.acc}.{kind.input}.{kind.input}.{kind.acc}"
    parts = [operands(0, n), operands(n, len(a_vals))]
    parts.append(operands(n + len(a_vals), len(b_vals)))
    parts.append(operands(n + len(a_vals) + len(b_vals), len(c_vals)))
    text = f"mma.sync.aligned.{kind.ptx_shape}.row.col.{types} {', '.join(parts)};"
    constraints = [f"={acc}"] * n + ["r"] * (len(a_vals) + len(b_vals)) + [acc] * len(c_vals)
    ret = ir.LiteralStructType([lltype(d.array.dtype)] * n)
    args = a_vals + b_vals + c_vals
    result = g.asm(text, ",".join(constraints), ret, args, PURE + CONVERGENT)
    write(g, d, builtin, members(g, result, n))


@LOWERING.register("to_tf32")
def lower_to_tf32(g, ins: Instr) -> None:
    """``cvt.rna.tf32.f32`` (its result is a .b32 bit pattern, read back as f32)."""
    bits = g.asm("cvt.rna.tf32.f32 $0, $1;", "=r,f", I32, [g.value(ins.args[0])], PURE)
    g.set(ins.dst, g.b.bitcast(bits, FLOAT))


@LOWERING.register("cp_async")
def lower_cp_async(g, ins: Instr) -> None:
    """``cp.async.{ca,cg}.shared.global [dst], [src], bytes[, src_bytes]``."""
    dst, dst_idx, src, src_idx, size, nbytes, cache = cp_async_operands(ins)
    args = [shared_address(g, dst, dst_idx), g.b.ptrtoint(address(g, src, src_idx), I64)]
    constraints = ["r", "l"]
    tail = ""
    if getattr(size, "value", None) != nbytes:
        args.append(g.value(size))
        constraints.append("r")
        tail = ", $2"
    text = f"cp.async.{cache}.shared.global [$0], [$1], {nbytes}{tail};"
    g.asm(text, ",".join([*constraints, "~{memory}"]), VOID, args, EFFECTS, effects=True)


def _fixed(text: str):
    def lower(g, ins: Instr) -> None:
        g.asm(text.format(**ins.attrs), "~{memory}", VOID, [], EFFECTS, effects=True)

    return lower


LOWERING.add("cp_async_commit", _fixed("cp.async.commit_group;"))
LOWERING.add("cp_async_wait", _fixed("cp.async.wait_group {pending};"))
