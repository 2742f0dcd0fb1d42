"""``matmul`` and ``linear``: GEMMs with torch's conventions (``torch.matmul``,
``torch.nn.functional.linear``): f16 or bf16 inputs, f32 accumulation, the result in the
inputs' dtype unless ``out_dtype`` says f16, bf16 or f32, written by the GEMM's epilogue (no
cast kernel), and for ``linear`` the weight in ``nn.Linear``'s [N, K] layout read as it is
(no transpose copy), with a bias, an activation and a residual fused into the epilogue.

The kernels are ``kaio_ops._gemm`` (mma.sync, every GPU kaio runs on, sm_90 included). This
module checks the inputs, plans the tiles (``matmul.heuristic``: the block tile per shape and
GPU, and for small M a K split whose slices are summed in a fixed order by a second kernel)
and launches.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kaio.types import ScalarType, bf16, f16, f32, i32
from kaio_ops import _arrays, _gemm_hopper, _gemm_streamk, _gemv, _matmul_hopper
from kaio_ops._gemm import ACTIVATIONS, GEMM, REDUCE
from kaio_ops._plan import planned
from kaio_ops.matmul import CONFIGS, MatmulConfig, Plan, _hopper, heuristic, k_slices, plan_for

__all__ = ["linear", "matmul"]

HALVES = (f16, bf16)
_DTYPE_NAMES = {
    "f16": f16,
    "float16": f16,
    "half": f16,
    "bf16": bf16,
    "bfloat16": bf16,
    "f32": f32,
    "float32": f32,
    "float": f32,
}
# "silu_gate" keeps two accumulator sets: the large tiles' registers would spill
GATE_CONFIG = {
    "128x256": "64x128",
    "128x128": "64x128",
    "16x128s8": "16x64s8",
    "32x128s8": "32x64s8",
}
# skinny tiles of the mma.sync kernel besides matmul.CONFIGS, with deeper cp.async rings
# (more of B in flight at small M, where the product streams B): a Plan may name them
SKINNY_CONFIGS = {
    "16x128s6": MatmulConfig(16, 128, 64, 1, 4, 6),  # two blocks an SM (the H200's, M <= 16)
    "16x128s8": MatmulConfig(16, 128, 64, 1, 4, 8),
    "16x64s8": MatmulConfig(16, 64, 64, 1, 4, 8),
    "32x64s8": MatmulConfig(32, 64, 64, 1, 4, 8),
    "32x128s8": MatmulConfig(32, 128, 64, 1, 4, 8),
    "32x128s4": MatmulConfig(32, 128, 64, 1, 4, 4),
}


def mma_config(name: str) -> MatmulConfig:
    """The tile configuration an mma.sync ``Plan`` names: ``matmul.CONFIGS`` or
    ``SKINNY_CONFIGS``."""
    return CONFIGS[name] if name in CONFIGS else SKINNY_CONFIGS[name]


def out_type(op: str, out_dtype, default: ScalarType) -> ScalarType:
    """The kaio type of an ``out_dtype`` argument (None: ``default``): a kaio type, a torch
    dtype, a NumPy dtype (or ml_dtypes.bfloat16) or its name; f16, bf16 or f32."""
    if out_dtype is None:
        return default
    if isinstance(out_dtype, ScalarType):
        name = out_dtype.name
    elif isinstance(out_dtype, str):
        name = out_dtype
    elif type(out_dtype).__module__.startswith("torch"):
        name = str(out_dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(out_dtype).name
        except TypeError:
            name = repr(out_dtype)
    found = _DTYPE_NAMES.get(name)
    if found is None:
        raise ValueError(
            f"{op}: argument 'out_dtype' must be float16, bfloat16 or float32 (a torch, NumPy "
            f"or kaio dtype) or None for the inputs' dtype, got {out_dtype!r}"
        )
    return found


class Persistent(NamedTuple):
    """A ``gemm`` choice: ``_matmul_hopper``'s persistent kernel (sm_90; B [K, N], or [N, K]
    with N a multiple of 8; every epilogue but "silu_gate") with ``128 x bn`` tiles (``bn``
    a multiple of 16 up to 320) taken ``group`` tile rows at a time, where the string
    ``"persistent"`` takes the width of ``persistent_width`` and groups of
    ``_matmul_hopper.GROUP_ROWS``; ``pair`` 1: blocks in clusters of two sharing the B
    slice; ``skew``: the second consumer warpgroup that many K slices behind the first
    (``_matmul_hopper.launch``)."""

    bn: int
    group: int = _matmul_hopper.GROUP_ROWS
    pair: int = 0
    skew: int = 0


_PLACEHOLDERS: dict = {}


def _placeholder(like: _arrays.Operand, dtype: ScalarType, ndim: int):
    """A small array of ``like``'s kind and device for an unused bias or residual
    parameter (made once per kind, device, dtype and rank)."""
    key = (like.kind, like.device, dtype, ndim)
    if key not in _PLACEHOLDERS:  # a constant: call plans pass it as it is
        _PLACEHOLDERS[key] = _arrays.constant(_arrays.output(like, (1,) * ndim, dtype))
    return _PLACEHOLDERS[key]


def _pipelined(like: _arrays.Operand) -> bool:
    """Whether the GPU of ``like`` has cp.async (sm_80+); the simulator runs the pipeline."""
    dev = _arrays.gpu(like)
    return dev is None or int(dev.arch[3:].rstrip("a")) >= 80


def plan(m: int, n: int, k: int, sms: int, gate: bool = False) -> Plan:
    """The tile plan of an ``m x n x k`` GEMM (``n`` output columns) on ``sms``
    multiprocessors: ``matmul.heuristic``, with a smaller tile for "silu_gate"."""
    return _capped(heuristic(m, n * (2 if gate else 1), k, sms), gate)


def _capped(chosen: Plan, gate: bool) -> Plan:
    """``chosen`` with its tile capped for "silu_gate" (two accumulator sets and two B rings:
    64x128, or 16x64 for the deep skinny ring, whose 16x128 form would need 272 KB)."""
    if gate and chosen.config in GATE_CONFIG:
        return Plan(GATE_CONFIG[chosen.config], chosen.split)
    return chosen


def tuned_plan(a: _arrays.Operand, m: int, n: int, k: int, gate: bool = False) -> Plan:
    """The mma.sync plan of a call: the plan ``kaio_ops.tune.matmul`` stored for this GPU,
    dtype and shape bucket (the same tile kernel family, so its measured best carries over),
    else ``plan``'s heuristic; "silu_gate" caps the tile as ``plan`` does."""
    return _capped(plan_for(a, m, n * (2 if gate else 1), k, f"{a.dtype.name}_async"), gate)


def gemm(
    op: str,
    a: _arrays.Operand,
    b: _arrays.Operand,
    out_shape: tuple,
    mnk: tuple,
    out: ScalarType,
    transposed: bool,
    bias: _arrays.Operand | None = None,
    residual: _arrays.Operand | None = None,
    activation: str = "none",
    chosen: Plan | str | None = None,
):
    """The launch shared by ``matmul`` and ``linear``: ``epilogue(a @ b)`` (b [K, N], or
    [N, K] when ``transposed``) in a new array of ``out_shape`` and type ``out``.
    ``chosen``: an mma.sync tile plan, or ``"hopper"`` for the sm_90 kernel with its own
    plan (``_gemm_hopper.plan``; the tests run it in the simulator), or a
    ``_gemm_hopper.Plan``, or ``"gemv"`` or a ``_gemv.Plan`` for a skinny kernel (``_gemv``),
    or ``"persistent"`` for ``_matmul_hopper``'s persistent kernel (sm_90, B [K, N], no
    epilogue), or a ``_gemm_streamk.Plan`` or ``"streamk"`` for the stream-K schedule of the
    Hopper kernel (sm_90, every epilogue), or None: ``route``'s choice."""
    m, n, k = mnk
    gate = activation == "silu_gate"
    dtype = a.dtype
    sms = _arrays.multiprocessors(a)
    plain = bias is None and residual is None and activation == "none"
    if chosen is None:
        chosen = route(a, b, mnk, transposed, plain, gate)
    if chosen == "gemv":
        chosen = _gemv.Plan(1 if transposed else _gemv.split_for(m, n, k, sms))
    if isinstance(chosen, _gemv.Plan) and transposed:
        c = _arrays.output(a, out_shape, out)
        rt = out if residual is None else residual.dtype
        _gemv.gemv_nk[(math.ceil(n / 8), 1, 1), _gemv.THREADS, _arrays.stream_of(a), 0](
            a.arg(m, k),
            b.arg(*b.shape),
            _arrays.output_arg(a, c, (m, n), out),
            bias.arg(bias.size) if bias is not None else _placeholder(a, dtype, 1),
            residual.arg(m, n) if residual is not None else _placeholder(a, rt, 2),
            n,
            k,
            MR=m, DT=dtype, OUT=out, RT=rt,
            BIAS=int(bias is not None), ACT=activation, RES=int(residual is not None),
        )  # fmt: skip
        return c
    if isinstance(chosen, _gemv.Plan):
        return _skinny(a, b, out_shape, mnk, out, chosen.split)
    if (chosen == "persistent" or isinstance(chosen, Persistent)) and (
        gate or transposed and n % 8
    ):  # the persistent kernel stores 4 columns at a time and keeps one accumulator set
        chosen = "hopper"
    if chosen == "persistent" or isinstance(chosen, Persistent):
        if not isinstance(chosen, Persistent):
            chosen = Persistent(persistent_width(m, n, sms))
        bn, group, pair, skew = chosen
        if out == f32 and plain and not transposed:
            return _matmul_hopper.launch(a, b, m, n, k, sms, dtype == bf16, group=group, bn=bn,
                                         pair=pair, skew=skew)  # fmt: skip
        c = _arrays.output(a, out_shape, out)
        c2 = c if len(out_shape) == 2 else _arrays.view(c, a.kind, (m, n))
        _matmul_hopper.launch(a, b, m, n, k, sms, dtype == bf16, [c2], group=group, out_type=out,
                              bn=bn, pair=pair, skew=skew, bt=transposed, bias=bias,
                              residual=residual, act=activation,
                              chunk=_gemm_hopper.EPI_CHUNK)  # fmt: skip
        return c
    if isinstance(chosen, _gemm_streamk.Plan) or chosen == "streamk":
        return _streamk(op, a, b, out_shape, mnk, out, transposed, bias, residual, activation,
                        chosen)  # fmt: skip
    hopper = isinstance(chosen, _gemm_hopper.Plan) or chosen == "hopper"
    if hopper:
        if not isinstance(chosen, _gemm_hopper.Plan):
            chosen = _gemm_hopper.plan(m, n, k, sms, gate)
        wg, bn, stages, split, fixup, pair, vec = chosen
        split, k_slice = k_slices(k, split, _gemm_hopper.BK)
        fixup = fixup and split > 1 and _gemm_hopper.fixup_ok(n)
        if vec == 0 and not plain and split == 1:  # the fused epilogue's loads first
            vec = _gemm_hopper.FUSED_VEC
        if not _gemm_hopper.vec_ok(n, split, plain, vec):
            vec = 0
    else:
        chosen = chosen or tuned_plan(a, m, n, k, gate)
        cfg = mma_config(chosen.config)
        split, k_slice = k_slices(k, chosen.split, cfg.bk)
        fixup = mma_fixup(m, n, split)
    c = _arrays.output(a, out_shape, out)
    c_arg = _arrays.output_arg(a, c, (m, n), out)
    bias_arg = bias.arg(bias.size) if bias is not None else _placeholder(a, dtype, 1)
    rt = out if residual is None else residual.dtype
    res_arg = residual.arg(m, n) if residual is not None else _placeholder(a, out, 2)
    width = 2 * n if gate else n
    ws = _arrays.output(a, (split * m, width), f32) if split > 1 else _placeholder(a, f32, 2)
    epilogue = {"BIAS": int(bias is not None), "ACT": activation, "RES": int(residual is not None)}
    types = {"DT": dtype, "OUT": out, "RT": rt}
    stream = _arrays.stream_of(a)
    args = (c_arg, ws, bias_arg, res_arg, m, n, k, k_slice)
    if hopper:
        tiles = _gemm_hopper.grid_tiles(m, n, wg, bn, pair)
        maps = _gemm_hopper.tensor_maps(a, b, m, k, wg, transposed, 64 if pair == 2 else 0)
        shared = _gemm_hopper.shared_bytes(wg, bn, stages, gate, vec, out.itemsize)
        counters = _counters(a, tiles) if fixup else _placeholder(a, i32, 1)
        _gemm_hopper.gemm_wgmma[(tiles, 1, split), 128 * wg + 32, stream, shared](
            *maps, *args[:4], counters, *args[4:], WG=wg, BN=bn, STAGES=stages,
            BT=int(transposed), SPLIT=min(split, 2), FIXUP=int(fixup), PAIR=pair, **epilogue,
            VEC=vec, CH=_gemm_hopper.EPI_CHUNK, **types,
        )  # fmt: skip
    else:
        pipelined = _pipelined(a)
        vec = (
            k % 8 == 0 and (transposed or n % 8 == 0) and a.aligned(16) and b.aligned(16)
        )  # 16-byte copies of A and B rows
        stages = cfg.stages_for(pipelined)
        shared = stages * (cfg.bm + (2 if gate else 1) * cfg.bn) * cfg.bk * 2 + 32
        tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
        counters = _counters(a, tiles) if fixup else _placeholder(a, i32, 1)
        GEMM[(tiles, 1, split), cfg.threads, stream, shared](
            a.arg(m * k),
            b.arg(b.size),
            *args[:4],
            counters,
            *args[4:],
            **_tile_constexprs(cfg, pipelined, vec),
            BT=int(transposed),
            SPLIT=min(split, 2),
            FIXUP=int(fixup),
            **epilogue,
            **types,
        )
    if split > 1 and not fixup:
        REDUCE[(math.ceil(m * n / 256), 256, stream, 0)](
            ws, c_arg, bias_arg, res_arg, m, n, SPLIT=split, **epilogue, **types
        )
    return c


def _streamk(op, a, b, out_shape, mnk, out, transposed, bias, residual, activation, chosen):
    """``gemm`` on ``_gemm_streamk``'s schedule (``chosen``: its ``Plan``, or
    ``"streamk"`` for ``_gemm_streamk.plan``)."""
    m, n, k = mnk
    gate = activation == "silu_gate"
    sms = _arrays.multiprocessors(a)
    if not isinstance(chosen, _gemm_streamk.Plan):
        chosen = _gemm_streamk.plan(m, n, k, sms, gate)
    if chosen.bn not in (64, 128):
        raise ValueError(f"{op}: a stream-K plan has 64 or 128 columns a tile, got {chosen}")
    sched = _gemm_streamk.schedule(m, n, k, chosen, sms)
    if not sched.fits:  # step numbers past 32 bits (K of millions): the split-K kernel
        return gemm(op, a, b, out_shape, mnk, out, transposed, bias, residual, activation, "hopper")
    c = _arrays.output(a, out_shape, out)
    rt = out if residual is None else residual.dtype
    bm = 64 * chosen.wg
    rows = sched.slots * -(-m // bm) * bm
    ws = _placeholder(a, f32, 2)  # none when every tile is data parallel
    if sched.sk_tiles:
        ws = _arrays.output(a, (rows, sched.wcols * (2 if gate else 1)), f32)
    maps = _gemm_hopper.tensor_maps(a, b, m, k, chosen.wg, transposed)
    launch = _gemm_streamk.gemm_streamk[
        sched.grid,
        128 * chosen.wg + 32,
        _arrays.stream_of(a),
        _gemm_streamk.shared_bytes(chosen.wg, chosen.bn, chosen.stages, gate),
    ]
    launch(
        *maps,
        _arrays.output_arg(a, c, (m, n), out),
        ws,
        bias.arg(bias.size) if bias is not None else _placeholder(a, a.dtype, 1),
        residual.arg(m, n) if residual is not None else _placeholder(a, rt, 2),
        _counters(a, sched.sk_tiles * 4 * chosen.wg),
        m, n, k, sched.dp_tiles, sched.wcols,
        WG=chosen.wg, BN=chosen.bn, STAGES=chosen.stages, BT=int(transposed),
        BIAS=int(bias is not None), ACT=activation, RES=int(residual is not None),
        DT=a.dtype, OUT=out, RT=rt,
    )  # fmt: skip
    return c


def _skinny(a, b, out_shape: tuple, mnk: tuple, out: ScalarType, split: int):
    """``a @ b`` by ``_gemv.gemv_kn`` (M <= 8, B [K, N], no epilogue), K cut in up to
    ``split`` slices."""
    m, n, k = mnk
    split, k_slice = _gemv.slices(k, split)
    c = _arrays.output(a, out_shape, out)
    # rows of whole 128-byte lines: no line holds two column blocks' sums (_gemm_hopper.fixup_ok)
    width = -(-n // 32) * 32
    ws = _arrays.output(a, (split * m, width), f32) if split > 1 else _placeholder(a, f32, 2)
    blocks = math.ceil(n / _gemv.COLS)
    counters = _counters(a, blocks) if split > 1 else _placeholder(a, i32, 1)
    c_arg = _arrays.output_arg(a, c, (m, n), out)
    _gemv.launch(a, b, c_arg, out, ws, counters, mnk, k_slice, _arrays.stream_of(a))
    return c


_COUNTERS: dict = {}
# the mma.sync kernel sums its K split in the kernel (else gemm_reduce) up to FIXUP_ROWS rows
# (MMA_FIXUP: at every M). For one row: [1, 4096] x [4096, 4096] took 9.06 µs of GPU time
# and 6.6 µs of host time summed in the kernel against 9.57 and 11.2 with the second launch
# (bench/host_parts.py --only gemv, H100, 2026-11-26). More rows lost while the last block
# summed one element at a time (_gemm.sum_tile: M = 8 of 4096 x 4096, 19.97 µs against
# 15.30 µs + 3.07 µs of gemm_reduce, ncu on an H100); it now sums 8 at a time.
MMA_FIXUP = False
FIXUP_ROWS = 32


def mma_fixup(m: int, n: int, split: int) -> bool:
    """Whether the mma.sync kernel sums its ``split``-way K split of an ``m x n`` product
    itself (the last block of a tile adds the slices) rather than through ``gemm_reduce``:
    for at most ``FIXUP_ROWS`` rows, or everywhere with ``MMA_FIXUP``, where the workspace
    lines allow it (``_gemm_hopper.fixup_ok``)."""
    return (MMA_FIXUP or m <= FIXUP_ROWS) and split > 1 and _gemm_hopper.fixup_ok(n)


def _counters(like: _arrays.Operand, tiles: int):
    """The zeroed i32 arrival counts (one a tile, at least ``tiles``) of the Hopper
    kernel's K-split fixup for ``like``'s kind, device and stream: a launch leaves them zero
    again, so launches in stream order share them; kept for good (call plans pass them as
    they are)."""
    key = (like.kind, like.device, _arrays.stream_of(like))
    found = _COUNTERS.get(key)
    if found is None or found.shape[0] < tiles:
        size = max(tiles, 1024)
        if like.kind == "torch":
            import torch

            found = torch.zeros(size, dtype=torch.int32, device=like.obj.device)
        elif like.kind == "cupy":
            import cupy

            with cupy.cuda.Device(like.device):
                found = cupy.zeros(size, dtype=np.int32)
        elif like.kind == "kaio":
            found = _arrays.new_array("kaio", like.device, like.obj, (size,), i32)
            found.copy_from_host(np.zeros(size, np.int32))
        else:
            found = np.zeros(size, np.int32)
        _COUNTERS[key] = _arrays.constant(found)
    return found


# The kernel each LLM GEMM shape runs best with on sm_90 (H100/H200, measured with
# bench/gemm_plans.py): (N, K, B layout: "kn" matmul, "nk" linear, "gate" linear with
# "silu_gate", N its output columns) -> [(largest M, choice)] in increasing M; a choice is
# a _gemm_hopper.Plan, a _gemm_streamk.Plan (the stream-K schedule), "gemv" or a
# _gemv.Plan, "mma.sync" (its own plan, ``tuned_plan``) or a matmul.Plan (an mma.sync
# plan), "persistent" or a Persistent (its tile width), or "rules" (``route``'s rules below).
# Shapes and M ranges not listed take the rules of ``route``. Measured on an H100 SXM (132
# SMs), f16, L2 rotated: the fastest correct plan of each shape (bench/gemm_plans.py; the
# sweep's worst cases re-searched with --set worst on 2026-11-26, then with --set w33: the
# persistent kernel's widths, "persistent_width", at M = 256-512 of 10240 and 57344 columns,
# and 12-stage rings for M = 32-128 at 4096 x 4096; then --set deep --deep: rings as deep as
# fit at small M where they won by more than the noise, 3-4%. Pairs of blocks sharing A or
# B, --set pairs, won nowhere by more than the noise: the table names none). Issue 33's fourth
# pass (--set d33 --epi33, H100): the squares on the Hopper kernel with 4 adjacent columns a
# store (Plan.vec 1; 1024^3 0.997x cuBLAS against 0.901x with pairs of columns, 2048^3 on
# 128 x 256 tiles 0.969x against the persistent kernel's 0.944x), and B [N, K] ("nk") up to
# M = 32 on the unsplit deep 16 x 64 tiles (0.96-1.06x against 0.67-1.00x). Issue 33's fifth
# pass (H100; bench/gemm_sweep.py --alt, and cuBLAS's own kernels by name: 128 x 320 tiles,
# clusters of two along M, at M = 512-4096 of 10240 and 28672 columns and 57344): every
# unsplit Hopper plan of B [K, N] with 4-column stores (vec 1: 1-7% faster at each of 13
# Llama-3-8B cases), and the persistent kernel's 128 x 320 tiles (one wave of 128 tiles at M =
# 512 of 10240 columns: 1.006x cuBLAS against 0.87-0.94x for 128 x 160; M = 1024 of 10240
# 1.011x, of 57344 0.994x against 0.915x; in pairs sharing B at M = 2048 of 57344 0.999x against
# 0.971x, M = 2048-4096 of 28672 x 4096 0.950-0.981x against 0.931-0.957x), pairs of 128 x 256
# at M = 8192 of 8192 x 28672 (1.052x against 1.017x). Issue 33's seventh pass (H100,
# bench/gemm_plans.py --waves / --vec): 64 x 192 tiles with wide stores and a 7-stage ring
# at M = 129-256 of 6144 x 4096 (4 x 32 = 128 tiles, one wave: 1.056x cuBLAS against the
# persistent kernel's 0.940x, which made 96 tiles of 128 x 128); the Hopper kernel's unsplit
# 128 x 128 tiles with wide stores where they make one wave or a little more, in place of the
# persistent kernel's tiles of the same size: M = 129-256 of 8192 x 8192 (0.995x against
# 0.942-0.952x) and of 8192 x 28672 (0.992x against 0.946-0.955x), M = 257-512 of 4096 x
# 4096 (0.994x against 0.958-0.972x); 128 x 192 at M = 129-256 of 10240 x 8192 (0.990x
# against 0.957-0.965x); the persistent kernel's 128 x 256 tiles at M = 65-128 of 57344 x
# 8192 (1.026x against the Hopper kernel's 128 x 128, 0.968x). Issue 33's eighth pass (gemm,
# H100, the matmul_tc ops on this planner with f32 output): the small squares on unsplit
# 64-row tiles with wide stores, 256^3 on 64 x 32 (6.59 µs, 1.01x cuBLAS f32 out, against
# 7.42 for the rules' 64 x 64 with pairs of columns), 512^3 on 64 x 64 (7.30 µs, 1.01x,
# against 11.41 for the rules' K split in 2 and 8.35 for the mma.sync kernel); the same
# plans writing f16, 0.99-1.01x cuBLAS. Issue 33 on the H200 (gmid; bench/gemm_plans.py
# --set m32 --skinny and --set g256 --deep, then bench/gemm_sweep.py --other-memory against
# the H100's choices in the same process, two rounds): the ``ByMemory`` entries, whose
# ``slow`` choice is the H100's as before. At M = 17-32 the mma.sync kernel's 32-row deep
# tiles (one row tile: B streamed once): 32 x 64 (8 stages) at 6144 x 4096, 8192 x 8192 and
# 8192 x 28672 (0.98-1.02x cuBLAS against 0.83-0.91x), 32 x 128 at 10240 x 8192 (1.13-1.17x
# against 0.99-1.06x), 32 x 128 with 4 stages (two blocks an SM) at 28672 x 4096 and 57344 x
# 8192 (0.97-1.01x against 0.90-0.94x); 16 x 64 in 2 K slices at 4096 x 14336 (0.96-0.98x
# against 0.90-0.92x). Deeper Hopper rings: 64 x 64 tiles with 12 stages at M = 33-64 of 6144
# x 4096 and 8192 x 8192 (0.92-1.00x against 0.90-0.97x; at M = 128 of 6144 x 4096 the 12
# stages ran 0.74x against 0.89x: one block an SM, 1.45 waves), 128 x 64 with 9 at M = 65-128
# of 8192 x 8192 (0.95-0.96x against 0.92-0.93x), and for ``linear`` (B [N, K]) at M = 129-256 of
# 4096 x 14336 (gelu + bias + residual 1.09-1.15x the torch ops against 0.97-0.99x, plain
# 1.02-1.06x F.linear against 0.91x). 7 stages for 128 x 128 at M = 128 of 10240 x 8192 lost
# (0.92x against 0.95x).
# GPUs with the faster memory (``_arrays.fast_memory``: an H200) take the ``fast`` choice of a
# ``ByMemory`` entry
FAST_MEMORY = _arrays.FAST_MEMORY


class ByMemory(NamedTuple):
    """A ``MEASURED`` choice that the GPU's memory decides: ``fast`` where its peak bandwidth
    (``_arrays.memory_bandwidth``) is at least ``FAST_MEMORY`` (H200), else ``slow`` (H100,
    and the simulator or a driver that does not tell)."""

    slow: object
    fast: object


def for_memory(choice, like: _arrays.Operand):
    """``choice`` (a ``MEASURED`` choice) for the GPU of ``like``: a ``ByMemory``'s ``fast``
    or ``slow`` choice, anything else as it is."""
    if not isinstance(choice, ByMemory):
        return choice
    return choice.fast if _arrays.fast_memory(like) else choice.slow


def _deeper(plan: _gemm_hopper.Plan, stages: int) -> ByMemory:
    """A Hopper ``plan`` as measured on an H100, with a ring of ``stages`` on the faster
    memory (more bytes in flight an SM)."""
    return ByMemory(plan, plan._replace(stages=stages))


_P = _gemm_hopper.Plan
_S = _gemm_streamk.Plan
_D = Plan("16x64s8", 1)  # the deep skinny tile, unsplit (SKINNY_CONFIGS)
_D32 = Plan("32x64s8", 1)  # its 32-row form
# 64 x 64 Hopper tiles with wide stores: a 6-stage ring, or 12 on the faster memory
_RING64 = _deeper(_P(1, 64, 6, 1, False, 0, 1), 12)
# issue 33 on the H200 (gsm, 2026-11-28: bench/gemm_plans.py --set h33 --splits, then
# bench/gemm_sweep.py --ms 1,2,4,8,16 --other-memory): at M <= 16 the H100's skinny plans
# leave the faster memory part idle. 4096 x 14336 (both layouts): the deep 16 x 64 tiles in 2 K
# slices (128 blocks, not 64), 34.3-35.1 µs at M = 1-16 against 37.6-38.2 unsplit, f16 and
# bf16 (cuBLAS 33.4-37.2); the fused gelu linear at M = 1 36.2 µs (the torch ops 40.1).
# 10240 x 8192 and 57344 x 8192: unsplit 16 x 128 tiles with 6-stage rings, two blocks an SM
# (_W): 43.7-45.0 µs against 49.0-50.0 (4 stages) at 10240 columns, 214.9-223.9 against
# 218.4-238.6 (gemv at M = 1, 4 K slices at 2-8, unsplit at 9-16) at 57344. A K split lost at
# 4096 x 4096 (16.2 against 15.3 µs), the 6-stage ring at 28672 x 4096 (60.6 against 58.7).
_D2 = ByMemory(_D, Plan("16x64s8", 2))  # _D, in 2 K slices on the faster memory
_W = Plan("16x128s6", 1)  # 16 x 128 tiles, 6-stage rings, unsplit
MEASURED: dict[tuple, list] = {
    (256, 256, "kn"): [(256, _P(1, 32, 12, 1, False, 0, 1))],
    (512, 512, "kn"): [(512, _P(1, 64, 12, 1, False, 0, 1))],
    (1024, 1024, "kn"): [(1024, _P(2, 64, 8, 1, False, 0, 1))],
    (2048, 2048, "kn"): [(2048, _P(2, 256, 4, 1, False, 0, 1))],
    (4096, 4096, "kn"): [(32, _D), (128, _P(1, 64, 12, 1, False, 0, 1)),
                         (256, _P(2, 64, 9, 1, False, 0, 1)), (512, _P(2, 128, 6, 1, False, 0, 1)),
                         (2048, "persistent")],
    (4096, 4096, "nk"): [(32, _D), (128, _P(1, 64, 6, 1, False))],
    (4096, 14336, "kn"): [(32, _D2), (128, _P(1, 64, 12, 1, False, 0, 1)),
                          (256, _P(1, 128, 9, 1, False, 0, 1)), (512, "persistent"),
                          (1024, _P(2, 256, 4, 1, False, 0, 1)), (2048, "persistent")],
    (4096, 14336, "nk"): [(16, _D2), (32, _D), (64, _P(2, 64, 6, 2, False)),
                          (128, _P(1, 64, 6, 2, False)),
                          (256, _deeper(_P(2, 64, 6, 1, False), 9)),
                          (4096, _P(2, 256, 4, 1, False))],
    (6144, 4096, "kn"): [(16, _D), (32, ByMemory(_D, _D32)),
                         (64, _RING64), (128, _P(1, 64, 6, 1, False, 0, 1)),
                         (256, _P(1, 192, 7, 1, False, 0, 1)), (2048, "persistent")],
    (6144, 4096, "nk"): [(16, _D), (32, Plan("16x128s8", 1))],
    (8192, 8192, "kn"): [(16, _D), (32, ByMemory(Plan("16x128s8", 1), _D32)),
                         (64, _RING64),
                         (128, _deeper(_P(2, 64, 6, 1, False, 0, 1), 9)),
                         (256, _P(2, 128, 6, 1, False, 0, 1)), (1024, "persistent")],
    (8192, 28672, "kn"): [(1, "mma.sync"), (16, _D),
                          (32, ByMemory(_P(1, 128, 6, 1, False, 0, 1), _D32)),
                          (128, _P(1, 128, 6, 1, False, 0, 1)),
                          (256, _P(2, 128, 6, 1, False, 0, 1)), (4096, "persistent"),
                          (8192, Persistent(256, 8, 1))],
    (10240, 8192, "kn"): [(16, ByMemory(Plan("16x128", 1), _W)),
                          (32, ByMemory(_P(1, 128, 6, 1, False, 0, 1), Plan("32x128s8", 1))),
                          (64, _P(1, 128, 6, 1, False, 0, 1)),
                          (128, _P(2, 128, 6, 1, False, 0, 1)),
                          (256, _P(2, 192, 5, 1, False, 0, 1)), (1024, Persistent(320))],
    (14336, 4096, "gate"): [(1, "gemv"), (16, "mma.sync"), (4096, _P(2, 128, 4, 1, False))],
    (28672, 4096, "nk"): [(16, _D)],
    (28672, 4096, "kn"): [(16, "mma.sync"),
                          (32, ByMemory(_P(1, 256, 5, 1, False, 0, 1), Plan("32x128s4", 1))),
                          (64, _P(1, 256, 5, 1, False, 0, 1)),
                          (128, _P(2, 256, 4, 1, False, 0, 1)), (1024, "persistent"),
                          (4096, Persistent(320, 8, 1))],
    (57344, 8192, "kn"): [(1, ByMemory("gemv", _W)), (8, ByMemory(Plan("16x128", 4), _W)),
                          (16, ByMemory("mma.sync", _W)),
                          (32, ByMemory(_P(1, 128, 9, 1, False, 0, 1), Plan("32x128s4", 1))),
                          (64, _P(1, 128, 9, 1, False, 0, 1)), (128, Persistent(256)),
                          (512, "persistent"),
                          (1024, Persistent(320)), (2048, Persistent(320, 8, 1)),
                          (8192, Persistent(256, 8, 0, 2))],
}  # fmt: skip
# issue 33's sixth pass (H100, bench/gemm_sweep.py --skew 2, two rounds): the persistent
# kernel's second consumer warpgroup 2 K slices behind the first at M = 4096-8192 of 57344 x
# 8192 (5639 against 5924 µs and 11562 against 11787 in one round, 11105 against 11719 at
# M = 8192 in the other; elsewhere it lost 0-10%). Plain ``linear`` (B [N, K]) from
# PERSISTENT_NK_M rows on the persistent kernel with B [N, K] (bench/gemm_epilogue.py --acts
# plain): 128 x 256 tiles against the Hopper kernel's routed plans at M = 1024-4096 of the
# Llama-3-8B shapes, faster at all 12 (M = 1024 of 6144 x 4096 91.5 against 100.6 µs, M =
# 4096 of 4096 x 14336 640.4 against 660.1), and where the B [K, N] table names 320-column
# tiles, those (M = 2048-4096 of 28672 x 4096 in pairs: 1364.6 against 1547.3 µs at 4096).
PERSISTENT_NK_M = 1024
SKINNY_M = 16  # rows up to which the mma.sync kernel (16-row tiles, K split) wins on sm_90


def nk_persistent(m: int, n: int, k: int) -> Persistent:
    """The persistent plan of a plain ``linear`` (B [N, K]) of ``m`` rows (from
    ``PERSISTENT_NK_M``): the B [K, N] table's plan where it names 320-column tiles, else
    128 x 256 tiles."""
    for most, choice in MEASURED.get((n, k, "kn"), ()):
        if m <= most:
            if isinstance(choice, Persistent) and choice.bn > 256:
                return choice
            break
    return Persistent(256)


def skinny_plan(a, m: int, n: int, k: int, gate: bool, transposed: bool) -> Plan:
    """The mma.sync plan of a product of at most ``SKINNY_M`` rows on sm_90 that the table
    does not list: for B [K, N] without a stored ``kaio_ops.tune`` plan, one block a
    16-row tile, unsplit: ``16x64s8`` tiles (8-stage rings) where they make between 1/2.2
    and 1 wave, else ``16x128`` ones where those make 1/2.2 wave or more (measured on an
    H100, bench/gemm_plans.py --set b33: unsplit 16x64s8 tiles ran at 0.98-1.11x cuBLAS at
    M = 1-32 of N = 4096-8192 against 0.87-0.96x with 16x128 tiles in 2-4 K slices;
    16x128 tiles at N = 10240, 1.01-1.02x); for B [N, K] (not "silu_gate") ``16x64s8``
    tiles from half a wave (--set d33 --epi33: 0.96-1.06x cuBLAS at M = 1-16 of N = 4096 to
    28672, where the K split of 16x128 tiles ran at 0.84-1.00x); otherwise ``tuned_plan``."""
    from kaio_ops import tune

    stored = tune.lookup(a, f"{a.dtype.name}_async", m, n, k)
    if gate or stored is not None:
        return tuned_plan(a, m, n, k, gate)
    sms = _arrays.multiprocessors(a)
    rows = math.ceil(m / 16)
    if transposed:  # B [N, K]: 16x64s8 from half a wave (no wave cap: at N = 28672 too)
        if rows * math.ceil(n / 64) >= sms / 2.2:
            return Plan("16x64s8", 1)
        return tuned_plan(a, m, n, k, gate)
    if sms / 2.2 <= rows * math.ceil(n / 64) <= sms:
        return Plan("16x64s8", 1)
    if rows * math.ceil(n / 128) >= sms / 2.2:
        return Plan("16x128", 1)
    return tuned_plan(a, m, n, k, gate)


def route(a, b, mnk: tuple, transposed: bool, plain: bool, gate: bool):
    """The kernel of a call (a ``gemm`` ``chosen``): on sm_90 for plain ``linear`` from
    ``PERSISTENT_NK_M`` rows the persistent kernel (``nk_persistent``), else the measured
    choice of the shape (``MEASURED``) where it can run, else a skinny kernel where
    ``_gemv.preferred``;
    then on sm_90 (measured there): the mma.sync kernel up to ``SKINNY_M`` rows
    (``skinny_plan``), the persistent kernel for plain ``matmul`` from 128 rows when its
    128 x 128 tiles fill the GPU, else the Hopper kernel with ``_gemm_hopper.plan``;
    elsewhere the mma.sync kernel with ``tuned_plan``."""
    m, n, k = mnk
    hopper = hopper_takes(a, b, n, k, transposed)
    persistent = plain and not transposed and hopper and a.dtype == b.dtype
    measured_persistent = hopper and a.dtype == b.dtype and not gate  # any epilogue, B [N, K]
    if plain and transposed and measured_persistent and m >= PERSISTENT_NK_M and n % 8 == 0:
        return nk_persistent(m, n, k)
    if hopper:
        layout = ("gate" if gate else "nk") if transposed else "kn"
        for most, choice in MEASURED.get((n, k, layout), ()):
            if m <= most:
                choice = for_memory(choice, a)
                if choice == "gemv" or isinstance(choice, _gemv.Plan):
                    if _gemv.takes(a, b, mnk, transposed, plain):
                        return choice
                if (choice == "persistent" or isinstance(choice, Persistent)) and (
                    measured_persistent
                ):
                    return choice
                if isinstance(choice, _gemm_hopper.Plan | _gemm_streamk.Plan):
                    return choice
                if choice == "mma.sync":
                    return tuned_plan(a, m, n, k, gate)
                if isinstance(choice, Plan):  # a measured mma.sync plan
                    return _capped(choice, gate)
                break
    if _gemv.preferred(a, b, mnk, transposed, plain):
        return "gemv"
    if hopper and m <= SKINNY_M:
        return skinny_plan(a, m, n, k, gate, transposed)
    sms = _arrays.multiprocessors(a)
    if persistent and m >= 128 and math.ceil(m / 128) * math.ceil(n / 128) >= 0.9 * sms:
        return "persistent"  # a wave of 128 x 128 tiles or more: the persistent kernel
    if hopper:
        return "hopper"
    return tuned_plan(a, m, n, k, gate)


# tile widths of the persistent kernel, and the cost of a tile besides its columns (in
# columns: A's rows, the epilogue), fitted to bench/gemm_plans.py's timings (H100)
WIDTHS = (128, 160, 192, 224, 256)
TILE_COST = 64


def persistent_width(m: int, n: int, sms: int) -> int:
    """The tile width of the persistent kernel for ``m x n`` on ``sms`` multiprocessors:
    of ``WIDTHS``, the one whose waves of 128-row tiles cost least, a wave costing its width
    plus ``TILE_COST`` (the last wave counts whole: at M = 512, N = 6144 on 132 SMs, 128 x
    192 tiles make one wave of 128 where 128 x 128 ones make 1.45 waves)."""

    def cost(bn: int) -> tuple:
        waves = math.ceil(math.ceil(m / 128) * math.ceil(n / bn) / sms)
        return waves * (bn + TILE_COST), -bn

    return min(WIDTHS, key=cost)


def hopper_takes(a: _arrays.Operand, b: _arrays.Operand, n: int, k: int, transposed: bool) -> bool:
    """Whether the GEMM runs ``_gemm_hopper`` (TMA + wgmma): ``a`` on an sm_90 GPU (not the
    simulator; ``KAIO_HOPPER_MATMUL=0`` opts out, as for the matmul_tc ops) and operands TMA
    can read."""
    return _hopper(a) and _gemm_hopper.eligible(a, b, n, k, transposed)


def _tile_constexprs(cfg, pipelined: bool, vec: bool) -> dict:
    """The tile constexprs of ``gemm_kernel`` for ``cfg`` (a ``MatmulConfig``)."""
    consts = cfg.constexprs(pipelined, vec)
    del consts["QUANT"]
    return consts


@planned("a", "b")
def matmul(a, b, *, out_dtype=None):
    """``a @ b`` as ``torch.matmul`` computes it: f16 or bf16 ``a`` [M, K] and ``b`` [K, N]
    (the same dtype), f32 accumulation, the result [M, N] rounded once to ``out_dtype``
    (default: the inputs' dtype; f16, bf16 or f32) by the GEMM's epilogue."""
    inputs = _arrays.Inputs("matmul")
    a = inputs.array(a, "a", ndim=2, dtypes=HALVES, form="[M, K]")
    b = inputs.array(b, "b", ndim=2, form="[K, N]")
    m, k = a.shape
    if b.shape[0] != k:
        raise inputs.error("b", f"must have K = {k} rows (a is {a.shape}), got shape {b.shape}")
    n = b.shape[1]
    if 0 in (m, k, n):
        raise inputs.error("a" if 0 in a.shape else "b", "has an empty dimension")
    out = out_type("matmul", out_dtype, a.dtype)
    return gemm("matmul", a, b, (m, n), (m, n, k), out, transposed=False)


@planned("x", "w", "bias", "residual")
def linear(x, w, bias=None, *, residual=None, activation: str | None = None, out_dtype=None):
    """``torch.nn.functional.linear(x, w, bias)`` with a fused epilogue: f16 or bf16 ``x``
    [..., K] (any leading batch dimensions) and ``w`` [N, K] (``nn.Linear.weight``, read in
    place), f32 accumulation, then ``+ bias`` [N], then ``activation`` (None, "gelu" (erf),
    "gelu_tanh", "silu", or "silu_gate": ``w`` holds the gate rows then the up rows, [2F, K],
    ``bias`` [2F], and the result is ``silu(gate) * up`` [..., F]), then ``+ residual``
    (shaped like the result; f16, bf16 or f32), all in f32 before one rounding to
    ``out_dtype`` (default: x's dtype; f16, bf16 or f32)."""
    inputs = _arrays.Inputs("linear")
    x = inputs.array(x, "x", ndim=tuple(range(1, 9)), dtypes=HALVES, form="[..., K]")
    w = inputs.array(w, "w", ndim=2, form="[N, K]")
    act = "none" if activation is None else activation
    if act not in ACTIVATIONS or act == "none" and activation is not None:
        raise ValueError(
            f"linear: argument 'activation' must be None, 'gelu', 'gelu_tanh', 'silu' or "
            f"'silu_gate', got {activation!r}"
        )
    k = x.shape[-1]
    if w.shape[1] != k:
        raise inputs.error("w", f"must be [N, K] with K = {k} (x is {x.shape}), got {w.shape}")
    rows = w.shape[0]
    gate = act == "silu_gate"
    if gate and rows % 2:
        raise inputs.error(
            "w", f"must hold the gate rows then the up rows ([2F, K]) for 'silu_gate', got "
            f"{rows} rows (odd)"
        )  # fmt: skip
    n = rows // 2 if gate else rows
    m = x.size // k if k else 0
    if 0 in (m, k, n):
        raise inputs.error("x" if 0 in x.shape else "w", "has an empty dimension")
    out = out_type("linear", out_dtype, x.dtype)
    out_shape = (*x.shape[:-1], n)
    b = None
    if bias is not None:
        b = inputs.array(bias, "bias", ndim=1, shape=(rows,), form="[N]")
    r = None
    if residual is not None:
        r = inputs.array(residual, "residual", ndim=len(out_shape), shape=out_shape,
                         dtypes=_arrays.FLOATS, form="shaped like the result")  # fmt: skip
    return gemm("linear", x, w, out_shape, (m, n, k), out, True, b, r, act)


def specializations() -> list:
    """(kernel, constexprs) of the GEMM specializations to check (PTX through ptxas): every
    tile configuration with both B layouts (and the deep skinny tiles, ``SKINNY_CONFIGS``),
    each activation with bias and residual, each output type, the K split, the
    pipeline-free variant, the split-K reduction, and the skinny kernels (``_gemv``)."""
    out = []

    def add(dt, ot, name, bt=1, act="none", epi=1, split=1, pipelined=True):
        consts = _tile_constexprs(mma_config(name), pipelined, True)
        extra = {"BT": bt, "SPLIT": min(split, 2), "FIXUP": int(split > 2), "BIAS": epi}
        extra |= {"ACT": act, "RES": epi}
        out.append((GEMM, {**consts, **extra, "DT": dt, "OUT": ot, "RT": ot}))

    for name in CONFIGS:
        for bt in (0, 1):
            add(f16, f16, name, bt, epi=bt)
    for act in ACTIVATIONS:
        add(bf16, bf16, "64x128", act=act)
    for name in SKINNY_CONFIGS:  # deep rings, K split summed in the kernel
        add(f16, f16, name, 0, epi=0, split=4)
        add(bf16, f32, name, 1, act="silu_gate", split=3)
    add(f16, f32, "128x128")
    add(f16, bf16, "128x256", pipelined=False)
    for act in ("none", "silu_gate"):
        add(bf16, f16, "16x128", act=act, split=4)  # summed in the kernel
        add(f16, f32, "16x128", act=act, split=2)  # summed by gemm_reduce
        for dt, ot in ((f16, f16), (bf16, f32)):
            epi = {"SPLIT": 4, "BIAS": 1, "ACT": act, "RES": 1}
            out.append((REDUCE, {**epi, "DT": dt, "OUT": ot, "RT": ot}))
    for mr, dt, ot in ((1, f16, f16), (5, bf16, f32), (8, bf16, bf16)):
        out.append((_gemv.gemv_kn, {"MR": mr, "DT": dt, "OUT": ot}))
    for mr, dt, ot, act in (
        (1, f16, f16, "none"),
        (2, bf16, f32, "silu_gate"),
        (4, f16, bf16, "gelu"),
    ):
        epi = {"BIAS": 1, "ACT": act, "RES": 1}
        out.append((_gemv.gemv_nk, {"MR": mr, "DT": dt, "OUT": ot, "RT": ot, **epi}))
    return out
