"""Hopper instructions: ``wgmma.mma_async`` and its fence/commit/wait, shared-memory matrix
descriptors, ``mbarrier``s, TMA (``cp.async.bulk.tensor``), ``fence.proxy.async`` and
``setmaxnreg``.

``wgmma`` and ``setmaxnreg`` exist only on ``sm_90a``: the target switches a ``sm_90`` module
to it; the rest needs ``sm_90`` (``mbarrier.init``/``arrive``: sm_80). ``kaio.ir.legality``
checks and versions all of them before the emitter runs.
A tensor-map parameter is read in place: its generic address (``cvta.param``) is the TMA
operand, computed once in the prologue (``Emitter.param_address``).
"""

from __future__ import annotations

from kaio.ir.nodes import Const, Instr
from kaio.ir.ops import OpTable
from kaio.lang_hopper import dynamic_tile_conflict
from kaio.ptx.memory import address, mem_type
from kaio.ptx.tensor import frag_registers
from kaio.types import f16, u32, u64

# Descriptor bits 62-63 per swizzle (bytes): PTX ISA "Matrix Descriptor Format".
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}

LOWERING = OpTable()


def _shared_address_register(e, arr, idxs) -> str:
    """A u32 register holding the shared-window address of ``arr[idxs]``."""
    base, _, imm = address(e, arr, idxs)[1:-1].partition("+")
    reg = e.tmp(u32)
    if base.startswith("%"):
        e.line(f"add.u32 {reg}, {base}, {imm or 0}")
    else:
        e.line(f"mov.u32 {reg}, {base}")
        if imm:
            e.line(f"add.u32 {reg}, {reg}, {imm}")
    return reg


def check_tile(e, arr, builtin: str) -> None:
    """A CompileError for a dynamic tile that cannot be 1024-byte aligned (static arrays)."""
    problem = dynamic_tile_conflict(arr, e.fn.arrays, builtin)
    if problem:
        e.fail(problem)


def split_index(ins: Instr, start: int):
    """(array, its indices, the operands after them) of ``ins.args[start:]``."""
    arr = ins.args[start]
    end = start + 1 + arr.ndim
    return arr, ins.args[start + 1 : end], ins.args[end:]


def wgmma_form(attrs: dict) -> tuple[str, str]:
    """(shape and types, the immediates after scale-d) of a ``wgmma`` op: ``m64n{n}k16`` with
    ``1, 1, trans_a, trans_b`` for f16/bf16; ``m64n{n}k32`` with ``1, 1`` for the 8-bit
    floats (e4m3, e5m2), which PTX allows only K-major (no transpose operands); ``m64n{n}k32``
    with s32 accumulators and no immediates for s8."""
    kind = attrs["kind"]
    if kind == "s8":  # integer wgmma: no scale-a/b immediates
        return f"m64n{attrs['n']}k32.s32.s8.s8", ""
    if kind in ("e4m3", "e5m2"):
        return f"m64n{attrs['n']}k32.f32.{kind}.{kind}", "1, 1"
    ta, tb = int(attrs["trans_a"]), int(attrs["trans_b"])
    return f"m64n{attrs['n']}k16.f32.{kind}.{kind}", f"1, 1, {ta}, {tb}"


@LOWERING.register("wgmma")
def lower_wgmma(e, ins: Instr) -> None:
    """``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {d}, a_desc, b_desc, p, 1, 1,
    trans_a, trans_b`` (k32 and no transposes for e4m3/e5m2: ``wgmma_form``)."""
    kind = ins.attrs["kind"]
    builtin = f"kaio.wgmma_{kind}()"
    acc, a_desc, b_desc, scale_d = ins.args
    regs = frag_registers(e, acc, builtin)
    shape, tail = wgmma_form(ins.attrs)
    d = "{" + ", ".join(regs) + "}"
    operands = f"{e.r(a_desc)}, {e.r(b_desc)}, {e.r(scale_d)}" + f", {tail}" * bool(tail)
    e.line(f"wgmma.mma_async.sync.aligned.{shape} {d}, {operands}")


@LOWERING.register("wgmma_rs")
def lower_wgmma_rs(e, ins: Instr) -> None:
    """``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {d}, {a0, a1, a2, a3}, b_desc, p,
    1, 1, trans_b``: A from registers (no trans_a immediate)."""
    kind = ins.attrs["kind"]
    builtin = f"kaio.wgmma_{kind}()"
    acc, a, b_desc, scale_d = ins.args
    d = "{" + ", ".join(frag_registers(e, acc, builtin)) + "}"
    regs = "{" + ", ".join(frag_registers(e, a, builtin)) + "}"
    shape = f"m64n{ins.attrs['n']}k16.f32.{kind}.{kind}"
    tail = f"1, 1, {int(ins.attrs['trans_b'])}"
    e.line(
        f"wgmma.mma_async.sync.aligned.{shape} {d}, {regs}, {e.r(b_desc)}, {e.r(scale_d)}, {tail}"
    )


def _fixed(text: str):
    def lower(e, ins: Instr) -> None:
        e.line(text.format(**ins.attrs))

    lower.__doc__ = f"``{text}``."
    return lower


@LOWERING.register("smem_desc")
def lower_smem_desc(e, ins: Instr) -> None:
    """The 64-bit descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4
    (16-29), stride byte offset >> 4 (32-45), swizzle mode (62-63)."""
    arr, idxs, _ = split_index(ins, 0)
    check_tile(e, arr, "kaio.smem_descriptor()")
    lbo = ins.attrs["lbo"] >> 4
    lo, hi = e.tmp(u32), e.tmp(u32)
    base, _, imm = address(e, arr, idxs)[1:-1].partition("+")
    if int(imm or 0) % 16 == 0:
        # ((base + imm) >> 4) & 0x3FFF as ((base >> 4) & 0x3FFF) + imm / 16: one shift and
        # mask a base, which ptxas shares between the descriptors of a tile's steps, and an
        # addition each. The mask stays: a block of a cluster sees its shared addresses with
        # bits above the 18 of its own window (the multicast pairs computed wrong products
        # without it); the addition cannot carry out of the field for an address inside it.
        shifted = e.tmp(u32)
        if base.startswith("%"):
            e.line(f"bfe.u32 {shifted}, {base}, 4, 14")
        else:
            e.line(f"mov.u32 {shifted}, {base}")
            e.line(f"bfe.u32 {shifted}, {shifted}, 4, 14")
        e.line(f"add.u32 {lo}, {shifted}, {((int(imm or 0) >> 4) + (lbo << 16)) % 2**32}")
    else:
        addr = _shared_address_register(e, arr, idxs)
        e.line(f"bfe.u32 {lo}, {addr}, 4, 14")
        if lbo:
            e.line(f"or.b32 {lo}, {lo}, {lbo << 16}")
    high = (ins.attrs["sbo"] >> 4) | SWIZZLE_MODE[ins.attrs["swizzle"]] << 30
    e.line(f"mov.u32 {hi}, {high}")
    e.line(f"mov.b64 {e.dst(ins)}, {{{lo}, {hi}}}")


@LOWERING.register("mbarrier_init")
def lower_mbarrier_init(e, ins: Instr) -> None:
    """``mbarrier.init.shared.b64 [bar], count``."""
    arr, idxs, (count,) = split_index(ins, 0)
    e.line(f"mbarrier.init.shared.b64 {address(e, arr, idxs)}, {e.o(count)}")


@LOWERING.register("mbarrier_arrive")
def lower_mbarrier_arrive(e, ins: Instr) -> None:
    """``mbarrier.arrive.shared.b64``, or ``.expect_tx`` with a byte count first."""
    arr, idxs, (tx,) = split_index(ins, 0)
    state = e.tmp(u64)
    if isinstance(tx, Const) and tx.value == 0:
        e.line(f"mbarrier.arrive.shared.b64 {state}, {address(e, arr, idxs)}")
        return
    addr = address(e, arr, idxs)
    e.line(f"mbarrier.arrive.expect_tx.shared::cta.b64 {state}, {addr}, {e.o(tx)}")


@LOWERING.register("mbarrier_expect_tx")
def lower_mbarrier_expect_tx(e, ins: Instr) -> None:
    """``mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], bytes``."""
    arr, idxs, (tx,) = split_index(ins, 0)
    addr = address(e, arr, idxs)
    e.line(f"mbarrier.expect_tx.relaxed.cta.shared::cta.b64 {addr}, {e.o(tx)}")


def _try_wait(e, ins: Instr, p: str) -> str:
    arr, idxs, (parity,) = split_index(ins, 0)
    addr = address(e, arr, idxs)
    return f"mbarrier.try_wait.parity.shared::cta.b64 {p}, {addr}, {e.o(parity)}"


@LOWERING.register("mbarrier_try_wait")
def lower_mbarrier_try_wait(e, ins: Instr) -> None:
    """``mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity``."""
    e.line(_try_wait(e, ins, e.dst(ins)))


@LOWERING.register("mbarrier_wait")
def lower_mbarrier_wait(e, ins: Instr) -> None:
    """A ``try_wait.parity`` loop."""
    p = e.tmp_pred()
    text = _try_wait(e, ins, p)
    again = e.new_label("mbarrier_wait")
    e.place(again)
    e.line(text)
    e.line(f"@!{p} bra {again}")


def tma_load_operands(e, ins: Instr) -> tuple:
    """``(dst, dst_idx, map, row, col, bar, bar_idx)`` of a ``tma_load`` (args: the shared
    tile, its indices, the map, the row and column, the barrier, its indices), after checking
    the tile's alignment. ``e`` is either backend's lowering context (``fn``, ``fail``)."""
    dst, dst_idx, rest = split_index(ins, 0)
    check_tile(e, dst, "kaio.tma_load_2d()")
    tmap, row, col = rest[:3]
    bar, bar_idx, _ = split_index(ins, len(ins.args) - len(rest) + 3)
    return dst, dst_idx, tmap, row, col, bar, bar_idx


TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"


@LOWERING.register("tma_load", "tma_load_multicast")
def lower_tma_load(e, ins: Instr) -> None:
    """``cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst],
    [map, {col, row}], [bar]``; ``tma_load_multicast`` adds ``.multicast::cluster`` and the
    16-bit block mask."""
    dst, dst_idx, tmap, row, col, bar, bar_idx = tma_load_operands(e, ins)
    d = address(e, dst, dst_idx)
    b = address(e, bar, bar_idx)
    src = f"[{e.param_address(tmap)}, {{{e.r(col)}, {e.r(row)}}}]"
    if ins.op == "tma_load":
        e.line(f"{TMA_LOAD} {d}, {src}, {b}")
        return
    mask = e.tmp(f16)  # a 16-bit register
    e.line(f"cvt.u16.u32 {mask}, {e.o(ins.args[-1])}")
    e.line(f"{TMA_LOAD}.multicast::cluster {d}, {src}, {b}, {mask}")


@LOWERING.register("mbarrier_arrive_cluster")
def lower_mbarrier_arrive_cluster(e, ins: Instr) -> None:
    """``mapa`` of the barrier's address to block ``rank``'s, then
    ``mbarrier.arrive.shared::cluster.b64 _, [remote]`` (release at CTA scope, as CUTLASS's:
    with ``.release.cluster`` the Hopper matmul's pipeline ran at half speed)."""
    e.line(f"mbarrier.arrive.shared::cluster.b64 _, [{_remote_address(e, ins)}]")


def _remote_address(e, ins: Instr) -> str:
    """A u32 register holding block ``rank``'s shared::cluster address of the element that
    ``ins`` names (its operands: the shared array, its indices, the rank), by ``mapa``."""
    arr, idxs, (rank,) = split_index(ins, 0)
    local = _shared_address_register(e, arr, idxs)
    remote = e.tmp(u32)
    e.line(f"mapa.shared::cluster.u32 {remote}, {local}, {e.o(rank)}")
    return remote


def bulk_store_operands(ins: Instr) -> tuple:
    """``(dst, dst_idx, src, src_idx, nbytes)`` of a ``bulk_store``."""
    dst = ins.args[0]
    src_at = 1 + dst.ndim
    src = ins.args[src_at]
    return dst, ins.args[1:src_at], src, ins.args[src_at + 1 : -1], ins.args[-1]


def bulk_store_instruction(ins: Instr) -> str:
    """``cp.async.bulk.global.shared::cta.bulk_group``, or for ``bulk_reduce_add`` (attrs
    ``reduce``) ``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32``."""
    if ins.attrs.get("reduce"):
        return "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    return "cp.async.bulk.global.shared::cta.bulk_group"


@LOWERING.register("bulk_store")
def lower_bulk_store(e, ins: Instr) -> None:
    """``cp{.reduce}.async.bulk.global.shared::cta.bulk_group{.add.f32} [dst], [src], n``."""
    dst, dst_idx, src, src_idx, nbytes = bulk_store_operands(ins)
    d, s = address(e, dst, dst_idx), address(e, src, src_idx)
    e.line(f"{bulk_store_instruction(ins)} {d}, {s}, {e.o(nbytes)}")


@LOWERING.register("bulk_prefetch")
def lower_bulk_prefetch(e, ins: Instr) -> None:
    """``cp.async.bulk.prefetch.L2.global [addr], n``."""
    arr, n = ins.args[0], ins.args[-1]
    e.line(f"cp.async.bulk.prefetch.L2.global {address(e, arr, ins.args[1:-1])}, {e.o(n)}")


@LOWERING.register("bulk_wait")
def lower_bulk_wait(e, ins: Instr) -> None:
    """``cp.async.bulk.wait_group[.read] n``."""
    read = ".read" if ins.attrs["read"] else ""
    e.line(f"cp.async.bulk.wait_group{read} {ins.attrs['pending']}")


@LOWERING.register("cluster_sync")
def lower_cluster_sync(e, ins: Instr) -> None:
    """``barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned`` (release, then
    acquire: shared-memory writes before it are visible to the cluster's blocks after it)."""
    e.line("barrier.cluster.arrive.aligned")
    e.line("barrier.cluster.wait.aligned")


@LOWERING.register("dsmem_load")
def lower_dsmem_load(e, ins: Instr) -> None:
    """``mapa.shared::cluster`` of this block's address of the element to block ``rank``'s,
    then ``ld.shared::cluster``."""
    remote = _remote_address(e, ins)
    e.line(f"ld.shared::cluster.{mem_type(ins.args[0].dtype)} {e.dst(ins)}, [{remote}]")


# op: its one instruction, the op's attributes as {fields}
_FIXED = {
    "wgmma_fence": "wgmma.fence.sync.aligned",
    "wgmma_commit": "wgmma.commit_group.sync.aligned",
    "wgmma_wait": "wgmma.wait_group.sync.aligned {pending}",
    "bulk_commit": "cp.async.bulk.commit_group",
    "fence_proxy_async": "fence.proxy.async.shared::cta",
    "setmaxnreg": "setmaxnreg.{action}.sync.aligned.u32 {count}",
    "cluster_arrive": "barrier.cluster.arrive.aligned",
    "cluster_wait": "barrier.cluster.wait.aligned",
    "griddep_wait": "griddepcontrol.wait",
    "griddep_launch": "griddepcontrol.launch_dependents",
}
for _op, _text in _FIXED.items():
    LOWERING.add(_op, _fixed(_text))

ALIGNED_OPS = ("tma_load", "tma_load_multicast", "smem_desc")
"""Ops whose first operand is a shared tile that the emitter aligns to 1024 bytes (a whole
128-byte-swizzle pattern), so that swizzled layouts are those of docs/hopper.md."""
