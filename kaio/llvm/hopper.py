"""The Hopper ops in LLVM IR: ``wgmma.mma_async`` and its fence/commit/wait, shared-memory
matrix descriptors, ``mbarrier``s, TMA (``cp.async.bulk.tensor``), ``fence.proxy.async`` and
``setmaxnreg``, and the tensor-map kernel parameter.

Each instruction is the PTX emitter's own (``kaio.ptx.hopper``) as inline assembly (arch
checks: ``kaio.ir.legality``, where ``wgmma`` and ``setmaxnreg`` switch the target to
``sm_90a``, which ``kaio.llvm.machine`` then compiles for), with the emitter's refusal of
dynamic tiles next to static shared arrays. Every statement has side effects and a memory
clobber (they order shared memory, and each other, for the TMA and wgmma proxies); the
``.sync.aligned`` ones (wgmma, setmaxnreg) are also convergent. NVVM has intrinsics for
several of these; the asm keeps the emitter's very instructions, whatever the LLVM version
(20 to 22).

- ``wgmma``: the accumulator fragment's f32 elements are ``"=f"`` outputs, each tied to an
  input (``"0"``, ``"1"``...: LLVM IR's form of C's ``"+f"``), up to 128 of them;
  ``accumulate`` is an ``i32`` made the predicate operand inside the asm. The accumulators
  pass through an empty asm before each ``wgmma_fence`` and after each ``wgmma_wait``
  (``_settle``), so that LLVM keeps their other writes and reads outside the async window.
- ``mbarrier_try_wait``: the predicate as a ``selp`` result; ``mbarrier_wait`` an LLVM loop
  around it.
- ``smem_desc``: integer arithmetic on the 32-bit shared address (no asm).
- Tensor maps: a ``kaio.tensormap`` parameter is ``ptr byval([128 x i8]) align 64``, which
  NVPTX declares as the emitter's ``.param .align 64 .b8 name[128]``, and ``grid_constant``
  (``nvvm.annotations``), so that its address is the parameter itself (``cvta.param``), not
  a local copy; that address is the parameter's u64 value, the TMA operand.
- Shared tiles that TMA or a descriptor addresses are 1024-byte aligned (``aligned_tiles``).
"""

from __future__ import annotations

from llvmlite import ir

from kaio.ir.nodes import Array, Const, Function, Instr, Param, walk
from kaio.ir.ops import OpTable
from kaio.llvm.memory import address
from kaio.llvm.tensor import members, operands, read, shared_address, write
from kaio.llvm.typemap import CONVERGENT, EFFECTS, FLOAT, I8, I16, I32, I64, VOID, int_const, lltype
from kaio.ptx.hopper import (
    ALIGNED_OPS,
    SWIZZLE_MODE,
    TMA_LOAD,
    bulk_store_instruction,
    bulk_store_operands,
    check_tile,
    split_index,
    tma_load_operands,
    wgmma_form,
)
from kaio.ptx.regs import mem_type
from kaio.ptx.tensor import frag_registers

TENSOR_MAP = ir.ArrayType(I8, 128)
"""A ``CUtensorMap`` as the kernel receives it: 128 bytes, 64-byte aligned."""

LOWERING = OpTable()


def aligned_tiles(fn: Function) -> set[Array]:
    """The shared arrays that TMA or a descriptor addresses: 1024-byte aligned, as the
    emitter declares them (a whole 128-byte-swizzle pattern)."""
    return {s.args[0] for s in walk(fn.body) if isinstance(s, Instr) and s.op in ALIGNED_OPS}


def declare_tensor_maps(module: ir.Module, func: ir.Function, params: list[Param]) -> None:
    """Make the tensor-map arguments of ``func`` 128-byte byval parameters, 64-byte aligned and
    ``grid_constant`` (read in place: TMA takes their address)."""
    indices = []
    for k, (p, arg) in enumerate(zip(params, func.args, strict=True)):
        if p.role == "tensormap":
            arg.attributes.add("byval")
            arg.attributes.align = 64
            indices.append(ir.Constant(I32, k + 1))
    if indices:
        module.add_named_metadata("nvvm.annotations", [func, "grid_constant", indices])


def _statement(g, text: str, constraints: list[str], args: list, collective: bool, ret=VOID):
    """Inline PTX ``text`` returning ``ret``, with side effects and a memory clobber
    (``collective``: a ``.sync.aligned`` instruction, also convergent)."""
    attrs = EFFECTS + CONVERGENT if collective else EFFECTS
    constraints = ",".join([*constraints, "~{memory}"])
    return g.asm(text, constraints, ret, args, attrs, effects=True)


def _in_place(n: int, integer: bool = False) -> tuple[list[str], list[str], ir.Type]:
    """``n`` f32 (``integer``: i32) registers read and written in place (C's ``"+f"``): the
    output constraints, the constraints of the inputs tied to them (listed after any other
    input) and the asm's result type."""
    kind, typ = ("r", I32) if integer else ("f", FLOAT)
    return [f"={kind}"] * n, [str(k) for k in range(n)], ir.LiteralStructType([typ] * n)


# op: (PTX text with the op's attributes as {fields}, .sync.aligned)
_FIXED = {
    "wgmma_fence": ("wgmma.fence.sync.aligned;", True),
    "wgmma_commit": ("wgmma.commit_group.sync.aligned;", True),
    "wgmma_wait": ("wgmma.wait_group.sync.aligned {pending};", True),
    "fence_proxy_async": ("fence.proxy.async.shared::cta;", False),
    "setmaxnreg": ("setmaxnreg.{action}.sync.aligned.u32 {count};", True),
    "cluster_sync": ("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;", True),
    "cluster_arrive": ("barrier.cluster.arrive.aligned;", True),
    "cluster_wait": ("barrier.cluster.wait.aligned;", True),
    "bulk_commit": ("cp.async.bulk.commit_group;", False),
    "griddep_wait": ("griddepcontrol.wait;", False),
    "griddep_launch": ("griddepcontrol.launch_dependents;", False),
}


@LOWERING.register(*_FIXED)
def _lower_fixed(g, ins: Instr) -> None:
    """One ``_FIXED`` statement; the wgmma accumulators settle before a fence, after a wait."""
    text, collective = _FIXED[ins.op]
    if ins.op == "wgmma_fence":
        _settle(g)
    _statement(g, text.format(**ins.attrs), [], [], collective)
    if ins.op == "wgmma_wait":
        _settle(g)


# ----------------------------------------------------------------------------- wgmma


@LOWERING.register("wgmma", "wgmma_rs")
def lower_wgmma(g, ins: Instr) -> None:
    """``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {d}, a_desc, b_desc, p, 1, 1,
    trans_a, trans_b`` with ``p = accumulate != 0``; for ``wgmma_rs`` (A from registers)
    ``{d}, {a0, a1, a2, a3}, b_desc, p, 1, 1, trans_b``, A as 4 ``"r"`` operands."""
    kind = ins.attrs["kind"]
    builtin = f"kaio.wgmma_{kind}()"
    acc, a, b_desc, scale_d = ins.args
    n = len(frag_registers(g, acc, builtin))
    if ins.op == "wgmma_rs":
        a_vals = [v if v.type == I32 else g.b.bitcast(v, I32) for v in read(g, a, builtin)]
        a_text, a_kinds = operands(n, 4), ["r"] * 4
        shape = f"m64n{ins.attrs['n']}k16.f32.{kind}.{kind}"
        tail = f"1, 1, {int(ins.attrs['trans_b'])}"
    else:
        a_vals, a_text, a_kinds = [g.value(a)], f"${n}", ["l"]
        shape, tail = wgmma_form(ins.attrs)
    b = n + len(a_vals)
    text = (
        f"{{ .reg .pred scale_d; setp.ne.b32 scale_d, ${b + 1}, 0; "
        f"wgmma.mma_async.sync.aligned.{shape} {operands(0, n)}, {a_text}, ${b}, scale_d"
        f"{f', {tail}' * bool(tail)}; }}"
    )
    outputs, tied, ret = _in_place(n, kind == "s8")
    scale = g.b.zext(g.value(scale_d), I32)
    args = [*a_vals, g.value(b_desc), scale, *read(g, acc, builtin)]
    result = _statement(g, text, [*outputs, *a_kinds, "l", "r", *tied], args, True, ret)
    write(g, acc, builtin, members(g, result, n))


def _settle(g) -> None:
    """Pass every wgmma accumulator register through an empty asm, which stays in order with
    the fence and wait statements (all three have side effects): before ``wgmma_fence``, so
    that writes of the accumulators (zeroing) happen before the fence, as PTX requires, and
    after ``wgmma_wait``, so that no read of them (a move, arithmetic, a store) is scheduled
    before the wait, while the wgmmas may still write them. The asm is empty and each
    register its own output: the PTX has no instruction more."""
    by_type: dict = {False: {}, True: {}}  # f32 and (s8 wgmma) i32 accumulators
    for s in walk(g.fn.body):
        if isinstance(s, Instr) and s.op in ("wgmma", "wgmma_rs"):
            frag = s.args[0]
            regs = g.local_registers(frag.array)  # None: the wgmma itself reports it
            if regs is not None:
                ptrs = by_type[s.attrs["kind"] == "s8"]
                ptrs.update(dict.fromkeys(regs[frag.start : frag.start + frag.size]))
    for integer, ptrs in by_type.items():
        if not ptrs:
            continue
        outputs, tied, ret = _in_place(len(ptrs), integer)
        values = [g.b.load(p, typ=I32 if integer else FLOAT) for p in ptrs]
        result = g.asm("", ",".join(outputs + tied), ret, values, EFFECTS, effects=True)
        for p, v in zip(ptrs, members(g, result, len(ptrs)), strict=True):
            g.b.store(v, p)


@LOWERING.register("smem_desc")
def lower_smem_desc(g, ins: Instr) -> None:
    """The 64-bit descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4
    (16-29), stride byte offset >> 4 (32-45), swizzle mode (62-63)."""
    arr, idxs, _ = split_index(ins, 0)
    check_tile(g, arr, "kaio.smem_descriptor()")
    b = g.b
    start = b.and_(b.lshr(shared_address(g, arr, idxs), int_const(I32, 4)), int_const(I32, 0x3FFF))
    low = b.or_(b.zext(start, I64), int_const(I64, (ins.attrs["lbo"] >> 4) << 16))
    high = (ins.attrs["sbo"] >> 4) | SWIZZLE_MODE[ins.attrs["swizzle"]] << 30
    g.set(ins.dst, b.or_(low, int_const(I64, high << 32)))


# ----------------------------------------------------------------------------- mbarriers

# form: PTX text, $0 the barrier's address and $1 the u32 operand
_BARRIER = {
    "init": "mbarrier.init.shared.b64 [$0], $1;",
    "arrive": "{ .reg .b64 state; mbarrier.arrive.shared.b64 state, [$0]; }",
    "arrive_expect_tx": (
        "{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [$0], $1; }"
    ),
    "expect_tx": "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$0], $1;",
}


def _barrier(g, ins: Instr, form: str) -> None:
    """One ``_BARRIER`` statement on the barrier ``ins`` names, with its u32 operand."""
    text = _BARRIER[form]
    arr, idxs, (value,) = split_index(ins, 0)
    args = [shared_address(g, arr, idxs)]
    if form != "arrive":  # the others take the u32 operand
        args.append(g.value(value))
    _statement(g, text, ["r"] * len(args), args, collective=False)


LOWERING.add("mbarrier_init", lambda g, ins: _barrier(g, ins, "init"))
LOWERING.add("mbarrier_expect_tx", lambda g, ins: _barrier(g, ins, "expect_tx"))


@LOWERING.register("mbarrier_arrive")
def lower_mbarrier_arrive(g, ins: Instr) -> None:
    """``mbarrier.arrive``, or ``.expect_tx`` with a byte count first."""
    tx = ins.args[-1]
    plain = isinstance(tx, Const) and tx.value == 0
    _barrier(g, ins, "arrive" if plain else "arrive_expect_tx")


def _try_wait(g, ins: Instr) -> ir.Value:
    """``mbarrier.try_wait.parity.shared::cta.b64``: whether the phase completed (i1)."""
    arr, idxs, (parity,) = split_index(ins, 0)
    text = (
        "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; "
        "selp.u32 $0, 1, 0, done; }"
    )
    args = [shared_address(g, arr, idxs), g.value(parity)]
    done = _statement(g, text, ["=r", "r", "r"], args, collective=False, ret=I32)
    return g.b.icmp_unsigned("!=", done, int_const(I32, 0))


@LOWERING.register("mbarrier_try_wait")
def lower_mbarrier_try_wait(g, ins: Instr) -> None:
    """``dst = mbarrier.try_wait.parity``."""
    g.set(ins.dst, _try_wait(g, ins))


@LOWERING.register("mbarrier_wait")
def lower_mbarrier_wait(g, ins: Instr) -> None:
    """A ``try_wait.parity`` loop."""
    again = g.func.append_basic_block("mbarrier_wait")
    done = g.func.append_basic_block("mbarrier_wait_done")
    g.b.branch(again)
    g.b.position_at_end(again)
    g.b.cbranch(_try_wait(g, ins), done, again)
    g.b.position_at_end(done)


# ----------------------------------------------------------------------------- TMA


@LOWERING.register("tma_load", "tma_load_multicast")
def lower_tma_load(g, ins: Instr) -> None:
    """``cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst],
    [map, {col, row}], [bar]``; ``tma_load_multicast`` adds ``.multicast::cluster`` and the
    16-bit block mask."""
    dst, dst_idx, tmap, row, col, bar, bar_idx = tma_load_operands(g, ins)
    args = [shared_address(g, dst, dst_idx), g.value(tmap), g.value(col), g.value(row)]
    args.append(shared_address(g, bar, bar_idx))
    if ins.op == "tma_load":
        text = f"{TMA_LOAD} [$0], [$1, {{$2, $3}}], [$4];"
        _statement(g, text, ["r", "l", "r", "r", "r"], args, collective=False)
        return
    args.append(g.b.trunc(g.value(ins.args[-1]), I16))
    text = f"{TMA_LOAD}.multicast::cluster [$0], [$1, {{$2, $3}}], [$4], $5;"
    _statement(g, text, ["r", "l", "r", "r", "r", "h"], args, collective=False)


@LOWERING.register("mbarrier_arrive_cluster")
def lower_mbarrier_arrive_cluster(g, ins: Instr) -> None:
    """``mapa`` of the barrier's address to block ``rank``'s, then
    ``mbarrier.arrive.shared::cluster.b64 _, [remote]`` (release at CTA scope, as CUTLASS's:
    with ``.release.cluster`` the Hopper matmul's pipeline ran at half speed)."""
    arr, idxs, (rank,) = split_index(ins, 0)
    text = (
        "{ .reg .b32 %remote; mapa.shared::cluster.u32 %remote, $0, $1; "
        "mbarrier.arrive.shared::cluster.b64 _, [%remote]; }"
    )
    args = [shared_address(g, arr, idxs), g.value(rank)]
    _statement(g, text, ["r", "r"], args, collective=False)


@LOWERING.register("bulk_store")
def lower_bulk_store(g, ins: Instr) -> None:
    """``cp{.reduce}.async.bulk.global.shared::cta.bulk_group{.add.f32} [dst], [src], n``."""
    dst, dst_idx, src, src_idx, nbytes = bulk_store_operands(ins)
    args = [g.b.ptrtoint(address(g, dst, dst_idx), I64), shared_address(g, src, src_idx)]
    text = f"{bulk_store_instruction(ins)} [$0], [$1], $2;"
    _statement(g, text, ["l", "r", "r"], [*args, g.value(nbytes)], collective=False)


@LOWERING.register("bulk_prefetch")
def lower_bulk_prefetch(g, ins: Instr) -> None:
    """``cp.async.bulk.prefetch.L2.global [addr], n``."""
    arr, n = ins.args[0], ins.args[-1]
    at = g.b.ptrtoint(address(g, arr, ins.args[1:-1]), I64)
    _statement(g, "cp.async.bulk.prefetch.L2.global [$0], $1;", ["l", "r"], [at, g.value(n)],
               collective=False)  # fmt: skip


@LOWERING.register("bulk_wait")
def lower_bulk_wait(g, ins: Instr) -> None:
    """``cp.async.bulk.wait_group[.read] n``."""
    read = ins.attrs["read"]
    text = f"cp.async.bulk.wait_group{'.read' if read else ''} {ins.attrs['pending']};"
    _statement(g, text, [], [], collective=False)


_REGISTER = {("float", 32): "f", ("float", 64): "d", 32: "r", 64: "l"}  # asm constraints


@LOWERING.register("dsmem_load")
def lower_dsmem_load(g, ins: Instr) -> None:
    """``mapa.shared::cluster`` of this block's address of the element to block ``rank``'s,
    then ``ld.shared::cluster`` (ordered like the cluster barriers: side effects, memory)."""
    arr, *idxs, rank = ins.args
    t = arr.dtype
    reg = _REGISTER[("float", t.bits) if t.is_float else t.bits]
    text = (
        "{ .reg .b32 %remote; mapa.shared::cluster.u32 %remote, $1, $2; "
        f"ld.shared::cluster.{mem_type(t)} $0, [%remote]; }}"
    )
    args = [shared_address(g, arr, idxs), g.value(rank)]
    g.set(ins.dst, _statement(g, text, [f"={reg}", "r", "r"], args, False, lltype(t)))
