"""The Hopper builtins (sm_90 and sm_90a): warpgroup MMA (``wgmma``), shared-memory matrix
descriptors, ``mbarrier``s, TMA tile loads, bulk stores from shared to global memory,
``fence.proxy.async``, ``setmaxnreg``, and
thread-block clusters with distributed shared memory.

Each builtin is one ``kaio.lang`` table entry (``_define``) with its typing rule here; its PTX
lowering is ``kaio.ptx.hopper`` and its simulator meaning ``kaio.sim.hopper``. docs/hopper.md
is the user's side: fragment layouts, descriptor layouts, barrier phases, a worked example.
"""

from __future__ import annotations

import re

from kaio import types as T
from kaio.ir.nodes import Array, Const, Frag, Var
from kaio.lang import _define, _memory_array

_SHARED = ("shared", "shared_dyn")
WGMMA_N = tuple(range(8, 257, 8))
"""The N sizes of ``wgmma.mma_async.m64nNk16`` with f16/bf16 inputs and f32 accumulators."""


def _const_int(ctx, v, node, what: str, ok, expect: str) -> int:
    x = ctx.const_value(v, node, what)
    if isinstance(x, bool) or not isinstance(x, int) or not ok(x):
        ctx.error(f"{what} must be {expect}, got {x!r}", node)
    return x


def _const_bool(ctx, v, node, what: str) -> bool:
    x = ctx.const_value(v, node, what)
    if not isinstance(x, bool | int) or x not in (0, 1):
        ctx.error(f"{what} must be a compile-time True or False, got {x!r}", node)
    return bool(x)


def _u32(ctx, v, node, what: str):
    x = ctx.value(v, node, T.u32)
    if not x.type.is_int or x.type.bits > 32:
        ctx.error(f"{what} must be a 32-bit (or narrower) integer, got {x.type}", node)
    return ctx.convert(x, T.u32)


def _barrier(ctx, args, node, name: str) -> list:
    """``(bars, index)`` of an mbarrier builtin: a shared u64 array and its element's indices."""
    arr = _memory_array(ctx, args[0], node, name, _SHARED)
    if arr.dtype not in (T.u64, T.i64):
        ctx.error(
            f"kaio.{name}() needs mbarriers in a shared u64 array (kaio.shared(kaio.u64, n)); "
            f"{arr.name!r} holds {arr.dtype}",
            node,
        )
    return [arr, *ctx.indices(arr, args[1], node)]


def _source_name(arr) -> str:
    """The kernel's own name of a shared array (its IR name less the ``_smem0`` suffix)."""
    return re.sub(r"_d?smem\d+$", "", arr.name)


def dynamic_tile_conflict(arr, arrays, builtin: str) -> str | None:
    """Why ``builtin`` may not address the dynamic shared tile ``arr`` in a kernel whose
    shared arrays are ``arrays``, or None. The driver starts dynamic shared memory right after
    the static arrays, without the 1024-byte alignment that swizzled TMA tiles and wgmma
    descriptors need (on an H200 the first TMA copy then stopped with a misaligned shared
    address), so such a kernel keeps every shared array dynamic, barriers included."""
    if arr.space != "shared_dyn":
        return None
    static = [_source_name(a) for a in arrays if a.space == "shared"]
    if not static:
        return None
    return (
        f"{builtin} addresses the dynamic shared tile {_source_name(arr)!r}, which is 1024-byte "
        f"aligned only in a kernel with no static shared arrays; declare {', '.join(static)} with "
        "kaio.shared_dynamic too (the dynamic region starts right after static arrays)"
    )


# ---------------------------------------------------------------- wgmma


def _wgmma(kind: str):
    name = f"wgmma_{kind}"

    def lower(ctx, args, node):
        if len(args) not in (4, 6):
            ctx.error(
                f"kaio.{name}() takes (acc, a_desc, b_desc, accumulate[, trans_a, trans_b])", node
            )
        acc = ctx.fragment(args[0], node, f"kaio.{name}()")
        n = 2 * acc.size
        want = T.i32 if kind == "s8" else T.f32  # s8: exact s32 sums
        if acc.array.dtype != want or n not in WGMMA_N:
            ctx.error(
                f"kaio.{name}(): acc holds the m64nNk16 {want} accumulator, N/2 {want} registers "
                f"per thread (N = 8, 16, ..., 256); {acc!r} is {acc.size} x {acc.array.dtype}",
                node,
            )
        if _register_operand(args[1]):  # A from registers: wgmma_rs
            _wgmma_rs(ctx, args, node, name, kind, acc, n)
            return
        descs = []
        for v, which in ((args[1], "a_desc"), (args[2], "b_desc")):
            d = ctx.value(v, node, T.u64)
            if d.type != T.u64:
                ctx.error(
                    f"kaio.{name}(): {which} must be a u64 kaio.smem_descriptor(), got {d.type}",
                    node,
                )
            descs.append(d)
        scale_d = ctx.truth(args[3], node)
        trans = [False, False]
        if len(args) == 6:
            trans = [_const_bool(ctx, a, node, f"kaio.{name}(): trans") for a in args[4:]]
        ctx.b.emit(
            "wgmma",
            None,
            (acc, *descs, scale_d),
            kind=kind,
            n=n,
            trans_a=trans[0],
            trans_b=trans[1],
        )

    return lower


def _register_operand(v) -> bool:
    """Whether a wgmma A argument names registers (a local array or a part of one)."""
    return isinstance(v, Frag) or (isinstance(v, Array) and v.space == "local")


def _wgmma_rs(ctx, args, node, name: str, kind: str, acc, n: int) -> None:
    """``wgmma_{kind}(acc, a_frag, b_desc, accumulate[, trans_a, trans_b])`` with A in 4
    32-bit registers a thread (16-bit pairs, mma.m16n8k16's A fragment per warp)."""
    if kind not in ("f16", "bf16"):
        ctx.error(f"kaio.{name}() takes A from shared memory only (a u64 descriptor)", node)
    a = ctx.fragment(args[1], node, f"kaio.{name}()")
    t = a.array.dtype
    if t.bits != 32 or t.is_bool or t == T.f32 or a.size != 4:
        ctx.error(
            f"kaio.{name}(): A in registers is 4 x u32 a thread ({kind} pairs, the mma.m16n8k16 "
            f"A fragment of the warp's 16 rows); {a!r} is {a.size} x {t}",
            node,
        )
    b = ctx.value(args[2], node, T.u64)
    if b.type != T.u64:
        ctx.error(f"kaio.{name}(): b_desc must be a u64 kaio.smem_descriptor(), got {b.type}", node)
    scale_d = ctx.truth(args[3], node)
    trans = [False, False]
    if len(args) == 6:
        trans = [_const_bool(ctx, x, node, f"kaio.{name}(): trans") for x in args[4:]]
    if trans[0]:
        ctx.error(f"kaio.{name}(): A in registers has no transposed form (trans_a=False)", node)
    ctx.b.emit("wgmma_rs", None, (acc, a, b, scale_d), kind=kind, n=n, trans_b=trans[1])


for _kind in ("f16", "bf16"):
    _define(
        f"wgmma_{_kind}",
        f"wgmma_{_kind}(acc, a, b_desc, accumulate[, trans_a, trans_b]): warpgroup-wide "
        f"(128 threads) acc = A @ B (+ acc when accumulate) with {_kind} A (64x16) and B "
        "(16xN) in shared memory named by kaio.smem_descriptor(), f32 accumulators (N = "
        "2*len(acc)); trans_a/trans_b: A stored M-major, B stored N-major (default: both "
        "K-major). A is a u64 descriptor, or a u32[4] local fragment (A from registers: "
        "each warp's 16 rows as mma.m16n8k16's A; no trans_a). Asynchronous: wgmma_fence() "
        "before, wgmma_commit() + wgmma_wait(n) after. sm_90a.",
        _wgmma(_kind),
    )


_WGMMA_KINDS = {T.f16: "f16", T.bf16: "bf16"}


def _wgmma_typed(ctx, args, node):
    """``wgmma(dtype, ...)``: ``wgmma_f16(...)`` or ``wgmma_bf16(...)`` by ``dtype``."""
    dtype = ctx.dtype_arg(args[0], node)
    if dtype not in _WGMMA_KINDS:
        ctx.error(f"kaio.wgmma(): dtype must be kaio.f16 or kaio.bf16, got {dtype}", node)
    _wgmma(_WGMMA_KINDS[dtype])(ctx, args[1:], node)


_define(
    "wgmma",
    "wgmma(dtype, acc, a, b_desc, accumulate[, trans_a, trans_b]): kaio.wgmma_f16 or "
    "kaio.wgmma_bf16 by dtype (kaio.f16 or kaio.bf16, known at compile time: a generic "
    "kernel's DT), with the same arguments; one spelling for a kernel generic over the two.",
    _wgmma_typed,
)


_define(
    "wgmma_s8",
    "wgmma_s8(acc, a_desc, b_desc, accumulate): warpgroup-wide (128 threads) acc = A @ B (+ acc "
    "when accumulate) with s8 A (64x32) and B (32xN), both K-major in shared memory (32 bytes "
    "of K, as wgmma_f16's 16 elements: the same descriptors), exact s32 accumulators that wrap "
    "(N = 2*len(acc), acc an i32 array); wgmma.mma_async.m64nNk32.s32.s8.s8; no transpose "
    "arguments (PTX has none for 8-bit operands: store B as [N, K]). sm_90a.",
    _wgmma("s8"),
)


def _fixed(op: str, name: str):
    def lower(ctx, args, node):
        ctx.b.emit(op, None, ())

    return lower


def _wgmma_wait(ctx, args, node):
    n = _const_int(
        ctx, args[0], node, "kaio.wgmma_wait(n)", lambda x: 0 <= x <= 7, "a compile-time 0..7"
    )
    ctx.b.emit("wgmma_wait", None, (), pending=n)


_define(
    "wgmma_fence",
    "wgmma_fence(): order this warpgroup's accumulator register accesses before the wgmmas "
    "that follow (wgmma.fence). sm_90a.",
    _fixed("wgmma_fence", "wgmma_fence"),
)
_define(
    "wgmma_commit",
    "wgmma_commit(): close this warpgroup's group of issued wgmmas (wgmma.commit_group). sm_90a.",
    _fixed("wgmma_commit", "wgmma_commit"),
)
_define(
    "wgmma_wait",
    "wgmma_wait(n): wait until at most n of this warpgroup's committed wgmma groups are "
    "pending; their accumulators are then readable (wgmma.wait_group). sm_90a.",
    _wgmma_wait,
)


def _smem_descriptor(ctx, args, node):
    arr = _memory_array(ctx, args[0], node, "smem_descriptor", _SHARED)
    idx = ctx.indices(arr, args[1], node)
    swizzle = _const_int(
        ctx,
        args[2],
        node,
        "the swizzle of kaio.smem_descriptor()",
        lambda x: x in (0, 32, 64, 128),
        "0, 32, 64 or 128 (bytes)",
    )
    offsets = [
        _const_int(
            ctx,
            a,
            node,
            f"the {what} byte offset of kaio.smem_descriptor()",
            lambda x: 0 <= x < 1 << 18 and x % 16 == 0,
            "a compile-time multiple of 16 below 262144",
        )
        for a, what in ((args[3], "leading"), (args[4], "stride"))
    ]
    return ctx.b.emit(
        "smem_desc", T.u64, (arr, *idx), swizzle=swizzle, lbo=offsets[0], sbo=offsets[1]
    )


_define(
    "smem_descriptor",
    "smem_descriptor(smem, index, swizzle, lbo, sbo): u64 wgmma matrix descriptor of the tile "
    "that starts at smem[index] (16-byte aligned; 1024 with a swizzle), laid out in 8-row "
    "core matrices swizzled by 0/32/64/128 bytes, lbo/sbo the leading/stride byte offsets "
    "(compile-time; docs/hopper.md gives them per layout).",
    _smem_descriptor,
)


# ---------------------------------------------------------------- mbarrier


def _mbarrier_init(ctx, args, node):
    bar = _barrier(ctx, args, node, "mbarrier_init")
    ctx.b.emit("mbarrier_init", None, (*bar, _u32(ctx, args[2], node, "the arrival count")))


def _mbarrier_arrive(ctx, args, node):
    bar = _barrier(ctx, args, node, "mbarrier_arrive")
    ctx.b.emit("mbarrier_arrive", None, (*bar, Const(0, T.u32)))


def _tx(op: str, name: str):
    def lower(ctx, args, node):
        bar = _barrier(ctx, args, node, name)
        ctx.b.emit(op, None, (*bar, _u32(ctx, args[2], node, f"the bytes of kaio.{name}()")))

    return lower


def _wait(op: str, name: str, result):
    def lower(ctx, args, node):
        bar = _barrier(ctx, args, node, name)
        parity = _u32(ctx, args[2], node, f"the phase parity of kaio.{name}()")
        return ctx.b.emit(op, result, (*bar, parity))

    return lower


_define(
    "mbarrier_init",
    "mbarrier_init(bars, i, count): make bars[i] (a shared u64) a barrier whose phase "
    "completes after count arrivals and the bytes it expects; its first phase has parity 0. "
    "One thread initializes; sync_threads() before others use it. sm_80+.",
    _mbarrier_init,
)
_define(
    "mbarrier_arrive",
    "mbarrier_arrive(bars, i): this thread arrives once on bars[i] (mbarrier.arrive). sm_80+.",
    _mbarrier_arrive,
)


def _mbarrier_arrive_cluster(ctx, args, node):
    bar = _barrier(ctx, args, node, "mbarrier_arrive_cluster")
    rank = _u32(ctx, args[2], node, "the rank of kaio.mbarrier_arrive_cluster()")
    ctx.b.emit("mbarrier_arrive_cluster", None, (*bar, rank))


_define(
    "mbarrier_arrive_cluster",
    "mbarrier_arrive_cluster(bars, i, rank): this thread arrives once on bars[i] of block "
    "rank of its cluster (mapa, mbarrier.arrive.shared::cluster); with "
    "tma_load_2d_multicast, how a block tells its cluster that a stage is free. sm_90.",
    _mbarrier_arrive_cluster,
)
_define(
    "mbarrier_arrive_expect_tx",
    "mbarrier_arrive_expect_tx(bars, i, nbytes): bars[i]'s current phase also waits for "
    "nbytes of TMA copies, and this thread arrives (mbarrier.arrive.expect_tx). sm_90.",
    _tx("mbarrier_arrive", "mbarrier_arrive_expect_tx"),
)
_define(
    "mbarrier_expect_tx",
    "mbarrier_expect_tx(bars, i, nbytes): bars[i]'s current phase also waits for nbytes of "
    "TMA copies, without arriving (mbarrier.expect_tx). sm_90.",
    _tx("mbarrier_expect_tx", "mbarrier_expect_tx"),
)
_define(
    "mbarrier_try_wait",
    "mbarrier_try_wait(bars, i, parity) -> bool: whether the phase of bars[i] with that "
    "parity (0 or 1) has completed; its writes are then visible (mbarrier.try_wait.parity). "
    "sm_90.",
    _wait("mbarrier_try_wait", "mbarrier_try_wait", T.bool_),
)
_define(
    "mbarrier_wait",
    "mbarrier_wait(bars, i, parity): spin on mbarrier_try_wait until the phase of bars[i] "
    "with that parity has completed. sm_90.",
    _wait("mbarrier_wait", "mbarrier_wait", None),
)


# ---------------------------------------------------------------- TMA, fences, registers


def _tensor_map(ctx, v, node) -> Var:
    if isinstance(v, Var) and any(p.value is v and p.role == "tensormap" for p in ctx.params):
        return v
    ctx.error(
        "kaio.tma_load_2d() needs a tensor map: a kernel parameter annotated kaio.tensormap "
        "(pass a kaio.tensor_map_2d(array, box, swizzle) at launch)",
        node,
    )


def _tma_load_2d(ctx, args, node, name: str = "tma_load_2d"):
    multicast = name == "tma_load_2d_multicast"
    dst = _memory_array(ctx, args[0], node, name, _SHARED)
    dst_idx = ctx.indices(dst, args[1], node)
    tmap = _tensor_map(ctx, args[2], node)
    coords = []
    for v, what in ((args[3], "row"), (args[4], "column")):
        c = ctx.value(v, node, T.i32)
        if not c.type.is_int or c.type.bits > 32:
            ctx.error(f"kaio.{name}(): the {what} must be a 32-bit integer, got {c.type}", node)
        coords.append(ctx.convert(c, T.i32))
    bar = _barrier(ctx, args[5:7], node, name)
    if not multicast:
        ctx.b.emit("tma_load", None, (dst, *dst_idx, tmap, *coords, *bar))
        return
    ctas = _u32(ctx, args[7], node, "the block mask of kaio.tma_load_2d_multicast()")
    ctx.b.emit("tma_load_multicast", None, (dst, *dst_idx, tmap, *coords, *bar, ctas))


_define(
    "tma_load_2d",
    "tma_load_2d(dst, dst_index, tmap, row, col, bars, i): one thread starts a TMA copy of the "
    "box at [row, col] of tmap's array (elements outside read 0) into shared dst from "
    "dst[dst_index] (128-byte aligned; 1024 when swizzled), swizzled as the map says; the "
    "copy completes its bytes on bars[i] (cp.async.bulk.tensor.2d). sm_90.",
    _tma_load_2d,
)
_define(
    "tma_load_2d_multicast",
    "tma_load_2d_multicast(dst, dst_index, tmap, row, col, bars, i, ctas): tma_load_2d into "
    "the same shared address of every block of the cluster whose rank's bit is set in ctas "
    "(a 16-bit mask), completing the bytes on each one's bars[i] (.multicast::cluster). The "
    "blocks fetch the box from L2 once. sm_90.",
    lambda ctx, args, node: _tma_load_2d(ctx, args, node, "tma_load_2d_multicast"),
)


def _bulk_copy(name: str):
    """``bulk_store`` and ``bulk_reduce_add`` (the same op, ``reduce="add"``: f32 only)."""

    def lower(ctx, args, node):
        dst = _memory_array(ctx, args[0], node, name, ("global",))
        src = _memory_array(ctx, args[2], node, name, _SHARED)
        if dst.dtype != src.dtype:
            ctx.error(
                f"kaio.{name}() copies between arrays of one element type; {dst.name!r} holds "
                f"{dst.dtype} and {src.name!r} {src.dtype}",
                node,
            )
        if name == "bulk_reduce_add" and dst.dtype != T.f32:
            ctx.error(
                f"kaio.bulk_reduce_add() adds f32 elements; {dst.name!r} holds {dst.dtype}: "
                "accumulate in an f32 array and convert it afterwards",
                node,
            )
        operands = (
            dst,
            *ctx.indices(dst, args[1], node),
            src,
            *ctx.indices(src, args[3], node),
            _u32(ctx, args[4], node, f"the byte count of kaio.{name}()"),
        )
        attrs = {"reduce": "add"} if name == "bulk_reduce_add" else {}
        ctx.b.emit("bulk_store", None, operands, **attrs)

    return lower


def _bulk_wait(read: bool):
    name = "bulk_wait_read" if read else "bulk_wait"

    def lower(ctx, args, node):
        n = _const_int(
            ctx, args[0], node, f"kaio.{name}(n)", lambda x: 0 <= x <= 63, "a compile-time 0..63"
        )
        ctx.b.emit("bulk_wait", None, (), pending=n, read=read)

    return lower


_define(
    "bulk_store",
    "bulk_store(dst, dst_index, src, src_index, nbytes): one thread starts an asynchronous "
    "copy of nbytes (a multiple of 16) from shared src[src_index...] to global "
    "dst[dst_index...] (both addresses 16-byte aligned, one element type) in its open bulk "
    "group (cp.async.bulk.global.shared::cta.bulk_group). Make the shared writes it reads "
    "visible first with fence_proxy_async() (and sync_threads() if other threads wrote "
    "them); close the group with bulk_commit(). sm_90.",
    _bulk_copy("bulk_store"),
)
_define(
    "bulk_reduce_add",
    "bulk_reduce_add(dst, dst_index, src, src_index, nbytes): as bulk_store(), but adds the "
    "nbytes of f32 elements from shared src[src_index...] to global dst[dst_index...] "
    "element by element, each addition atomic (cp.reduce.async.bulk.global.shared::cta."
    "bulk_group.add.f32): several blocks may add to the same elements, in no fixed order. "
    "sm_90.",
    _bulk_copy("bulk_reduce_add"),
)
_define(
    "bulk_commit",
    "bulk_commit(): close this thread's group of bulk_store() copies "
    "(cp.async.bulk.commit_group). sm_90.",
    _fixed("bulk_commit", "bulk_commit"),
)
_define(
    "bulk_wait_read",
    "bulk_wait_read(n): wait until at most n of this thread's committed bulk groups are still "
    "reading shared memory: the others' sources may be overwritten "
    "(cp.async.bulk.wait_group.read). sm_90.",
    _bulk_wait(True),
)
_define(
    "bulk_wait",
    "bulk_wait(n): wait until at most n of this thread's committed bulk groups are pending: "
    "the others' writes are done (cp.async.bulk.wait_group). sm_90.",
    _bulk_wait(False),
)


_define(
    "fence_proxy_async",
    "fence_proxy_async(): order this thread's ordinary shared-memory accesses with the "
    "asynchronous proxy's (TMA, wgmma) (fence.proxy.async.shared::cta). sm_90.",
    _fixed("fence_proxy_async", "fence_proxy_async"),
)


def _setmaxnreg(action: str):
    name = f"setmaxnreg_{action}"

    def lower(ctx, args, node):
        count = _const_int(
            ctx,
            args[0],
            node,
            f"kaio.{name}(n)",
            lambda x: 24 <= x <= 256 and x % 8 == 0,
            "a compile-time multiple of 8 in 24..256",
        )
        ctx.b.emit("setmaxnreg", None, (), action=action, count=count)

    return lower


_define(
    "setmaxnreg_inc",
    "setmaxnreg_inc(n): raise this warpgroup's registers per thread to n (warpgroup-wide; the "
    "kernel needs kaio.launch_bounds(threads, 1)). sm_90a.",
    _setmaxnreg("inc"),
)
_define(
    "setmaxnreg_dec",
    "setmaxnreg_dec(n): lower this warpgroup's registers per thread to n, giving them to "
    "other warpgroups (warpgroup-wide). sm_90a.",
    _setmaxnreg("dec"),
)


# ---------------------------------------------------------------- thread-block clusters
MAX_CLUSTER = 16  # sm_90's largest; above 8 (the portable size) the runtime opts in per kernel


def _cluster_dims(ctx, args, node):
    ctx.meta["cluster"] = _const_int(
        ctx,
        args[0],
        node,
        "kaio.cluster_dims(n)",
        lambda x: 1 <= x <= MAX_CLUSTER,
        f"a compile-time int in 1..{MAX_CLUSTER}",
    )


def _cluster_rank(ctx, args, node):
    return ctx.b.emit("sreg", T.u32, (), name="cluster_ctarank")


def _cluster_load(ctx, args, node):
    arr = _memory_array(ctx, args[0], node, "cluster_load", _SHARED)
    t = arr.dtype
    if t.is_bool or t.bits < 32:
        ctx.error(f"kaio.cluster_load() reads 32- or 64-bit elements; {arr.name!r} holds {t}", node)
    idx = ctx.indices(arr, args[1], node)
    rank = _u32(ctx, args[2], node, "the rank of kaio.cluster_load()")
    return ctx.b.emit("dsmem_load", t, (arr, *idx, rank))


_define(
    "cluster_dims",
    "cluster_dims(n): launch the kernel's blocks in clusters of n consecutive blocks along x "
    f"(1..{MAX_CLUSTER}; PTX .reqnctapercluster; above 8, the non-portable sizes, the runtime "
    "opts the kernel in): the grid's x size must be a multiple of n, "
    "a cluster's blocks run at the same time, and they can read each other's shared memory "
    "(kaio.cluster_load). sm_90.",
    _cluster_dims,
)
_define(
    "cluster_rank",
    "u32: this block's rank in its cluster, 0..n-1 (block_idx_x() % n; %cluster_ctarank). sm_90.",
    _cluster_rank,
)
_define(
    "grid_dependency_wait",
    "grid_dependency_wait(): wait until the grids this kernel's launch depends on (the "
    "kernel before it in the stream) have completed and their memory writes are visible "
    "(griddepcontrol.wait). A kernel that calls it is launched with programmatic stream "
    "serialization: it may start, and run what comes before this call, while the kernel "
    "before it finishes, so nothing before the call may read what that kernel writes or "
    "write what it reads. sm_90.",
    _fixed("griddep_wait", "grid_dependency_wait"),
)
_define(
    "launch_dependents",
    "launch_dependents(): let the kernel after this one in the stream, when it calls "
    "grid_dependency_wait(), launch once every block of this grid has called this or "
    "exited (griddepcontrol.launch_dependents; without it, once every block has exited). "
    "Its wait still waits for this whole grid. sm_90.",
    _fixed("griddep_launch", "launch_dependents"),
)
_define(
    "cluster_sync",
    "cluster_sync(): barrier for every thread of every block of the cluster; shared-memory "
    "writes before it are visible to cluster_load() after it (barrier.cluster.arrive and "
    "wait). A block must not exit while others may still read its shared memory: end with "
    "a cluster_sync() after the last cluster_load(). sm_90.",
    _fixed("cluster_sync", "cluster_sync"),
)
_define(
    "cluster_arrive",
    "cluster_arrive(): the first half of cluster_sync(): this thread arrives at the cluster "
    "barrier (its shared-memory writes so far are released) and goes on; pair it with one "
    "cluster_wait(). sm_90.",
    _fixed("cluster_arrive", "cluster_arrive"),
)
_define(
    "cluster_wait",
    "cluster_wait(): the second half of cluster_sync(): wait until every thread of the "
    "cluster has arrived (cluster_arrive). Work between the two overlaps the wait; a block "
    "ending with cluster_arrive() after its last cluster_load() and cluster_wait() just "
    "before it exits lets the others finish reading its shared memory. sm_90.",
    _fixed("cluster_wait", "cluster_wait"),
)
_define(
    "cluster_load",
    "cluster_load(arr, index, rank): element arr[index] of the shared array arr of block "
    "rank of this cluster (distributed shared memory: mapa, ld.shared::cluster); 32- or "
    "64-bit elements. sm_90.",
    _cluster_load,
)
