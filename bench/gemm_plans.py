"""Search the Hopper GEMM's launch plans by measurement: for each shape, ``kaio_ops.matmul``'s
kernel (``_gemm_hopper.gemm_wgmma``, f16 in and out) under every plausible ``Plan`` (64- or
128-row tiles, N tiles of 64/128/256, K splits summed in the kernel or by the reduction
kernel, ring depth) against cuBLAS (``torch.matmul``), per-call kernel time with L2 rotated
(bench/harness.py). The best plan of each shape is what ``_gemm_hopper.plan``'s table is
checked against.

Usage: ``python bench/gemm_plans.py --out plans.json [--budget 70] [--set small,mid,...]``
(``linear``: B [N, K] shapes; ``epi``: fused ``linear`` epilogues against the torch ops);
stops starting shapes after ``--budget`` seconds (the JSON keeps what finished). Prints, per
shape, cuBLAS, the op's own plan (``linear.route``) and the best plan found (µs), then a summary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import NamedTuple

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import Harness  # noqa: E402
from kaio_ops import _arrays, _gemm_hopper, _gemm_streamk, _gemv, _matmul_hopper  # noqa: E402
from kaio_ops.linear import gemm  # noqa: E402
from kaio_ops.matmul import SKINNY  # noqa: E402
from kaio_ops.matmul import Plan as MmaPlan  # noqa: E402

linear_mod = importlib.import_module("kaio_ops.linear")

LLAMA8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LLAMA70B = [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
SETS = {
    "small": [(m, n, k) for m in (1, 16, 64) for n, k in LLAMA8B],
    "mid": [(1024, 1024, 1024), (2048, 2048, 2048)]
    + [(m, n, k) for m in (128, 256, 1024) for n, k in LLAMA8B],
    "more": [(m, n, k) for m in (4, 32, 512, 2048) for n, k in LLAMA8B]
    + [(m, n, k) for m in (1, 16, 128, 1024) for n, k in LLAMA70B],
}
SETS["all"] = SETS["small"] + SETS["mid"] + SETS["more"]
# M values of the sweep no set above measured (the table's ranges and rules cover them)
SETS["check"] = [(m, n, k) for m in (2, 8, 4096) for n, k in LLAMA8B]
# where a K split pays: its sum in the kernel against gemm_reduce
SETS["fixup"] = [(m, n, k) for m in (1, 16, 64) for n, k in ((4096, 4096), (4096, 14336))]
SETS["fixup"] += [(16, 6144, 4096), (4, 4096, 4096)]
# B [N, K] (``linear``, nn.Linear's weight), marked by a negative K
SETS["linear"] = [(m, n, -k) for m in (1, 4, 16, 128) for n, k in ((4096, 4096), (4096, 14336))]


# the sweep's worst cases on an H100 (bench/gemm_sweep.py, round of 2026-11-26: 0.66-0.89x
# cuBLAS), and the fused gelu epilogue at M = 256 (0.46x the torch ops)
SETS["worst"] = [
    (32, 8192, 8192), (64, 8192, 8192), (32, 10240, 8192), (64, 10240, 8192),
    (256, 10240, 8192), (512, 10240, 8192), (512, 6144, 4096), (16, 6144, 4096),
    (4, 4096, 4096), (1, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096),
    (256, 57344, 8192), (1024, 1024, 1024), (2048, 2048, 2048),
    (256, 4096, 14336, "gelu"), (1024, 4096, 14336, "gelu"), (128, 4096, 14336, "gelu"),
    (2, 4096, 4096), (8, 4096, 4096), (4, 6144, 4096), (1, 6144, 4096),
]  # fmt: skip
# the cases still below 0.9x cuBLAS (f16 or bf16) and the squares after the round of
# 2026-11-26 (docs/performance.md), and the next worst at the same M (issue 33's second pass)
SETS["w33"] = [
    (512, 6144, 4096), (256, 10240, 8192), (512, 10240, 8192), (1024, 1024, 1024),
    (2048, 2048, 2048), (32, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096),
    (8, 4096, 4096), (4, 4096, 4096), (8, 6144, 4096), (1024, 57344, 8192), (512, 28672, 4096),
    (256, 4096, 14336), (1024, 4096, 4096), (256, 57344, 8192), (512, 57344, 8192),
    (128, 6144, 4096), (128, 10240, 8192), (1024, 10240, 8192), (1024, 6144, 4096),
    (512, 8192, 8192), (256, 28672, 4096), (128, 57344, 8192), (512, 8192, 28672),
]  # fmt: skip
# issue 33's second pass: small M on every sweep shape (--deep: rings of 6 stages against
# as many as fit), and where pairs of blocks sharing A or B may pay (--pairs only)
SETS["deep"] = [(m, n, k) for m in (32, 64, 128, 256) for n, k in LLAMA8B + LLAMA70B]
SETS["pairs"] = [
    (1024, 1024, 1024), (2048, 2048, 2048), (512, 6144, 4096), (256, 10240, 8192),
    (64, 4096, 4096), (1024, 4096, 4096), (512, 57344, 8192), (4096, 6144, 4096),
    (4096, 8192, 8192), (512, 10240, 8192), (128, 4096, 4096), (1024, 6144, 4096),
]  # fmt: skip
# tile widths besides 64, 128 and 256 that fill the waves of some shapes (132 SMs: 6144 /
# 192 = 32 column tiles, 10240 / 160 = 64, 28672 / 224 = 128)
WIDE = (160, 192, 224)
# fused linear epilogues (B [N, K], bias, activation, residual) against the separate torch
# ops: (M, N (the output's columns), K, activation)
EPILOGUES = [
    (m, n, k, act)
    for m in (1, 16, 4096)
    for n, k, act in ((4096, 14336, "gelu"), (14336, 4096, "silu_gate"))
]


WAVES = False  # also the tile widths that make one or two whole waves (--waves)


def candidates(m: int, n: int, k: int, sms: int, gate: bool = False) -> list[_gemm_hopper.Plan]:
    """The plans worth timing for one shape: every tile shape whose grid, times a K split
    of whole 64-deep steps (at least 2 a slice), gives between sms / 2 and 4 * sms blocks
    (or the one split nearest that), the split summed both ways, and from M = 128 the widths
    of ``WIDE`` unsplit. ``gate``: "silu_gate"
    (N tiles of at most 128)."""
    out = []
    for wg in (1,) if m <= 64 else (1, 2) if m <= 2048 else (2,):
        rows = math.ceil(m / (64 * wg))
        for bn in (64, 128) if gate else (64, 128, 256):
            tiles = rows * math.ceil(n / bn)
            stages = _gemm_hopper.stages_for(wg, bn, gate)
            for split in (1, 2, 3, 4, 6, 8, 12, 16):
                if split > 1 and k // split < 2 * _gemm_hopper.BK:
                    continue
                blocks = tiles * split
                if split > 1 and blocks > 4 * sms or split == 1 and tiles > 64 * sms:
                    continue
                if blocks < sms // 2 and tiles * 2 * split <= 4 * sms and split < 16:
                    continue  # a larger split fills the GPU better
                out.append(_gemm_hopper.Plan(wg, bn, stages, split, False))
                if split > 1:  # the split summed in the kernel too
                    out.append(_gemm_hopper.Plan(wg, bn, stages, split, True))
    if m <= 128:  # memory bound: 32-column tiles (half of each 64-column box read), deep rings
        for bn in (32, 64):
            tiles = math.ceil(m / 64) * math.ceil(n / bn)
            for split in (1, 2, 4):
                if tiles * split <= 2 * sms and k // split >= 4 * _gemm_hopper.BK:
                    deep = _gemm_hopper.stages_for(1, bn, gate, most=12)
                    out.append(_gemm_hopper.Plan(1, bn, deep, split, split > 1))
                    if bn == 32:
                        out.append(_gemm_hopper.Plan(1, bn, 6, split, split > 1))
    if WAVES:  # widths (multiples of 16) whose tiles make one or two whole waves, unsplit
        for wg in (1,) if m <= 64 else (1, 2):
            rows = math.ceil(m / (64 * wg))
            for waves in (1, 2):
                bn = next((w for w in range(32, 257, 16) if rows * math.ceil(n / w) <= waves * sms),
                          None)  # fmt: skip
                if bn is None or bn in (64, 128, 256) or gate and bn > 128:
                    continue
                for most in (6, 12):
                    stages = _gemm_hopper.stages_for(wg, bn, gate, most=most)
                    out.append(_gemm_hopper.Plan(wg, bn, stages, 1, False, 0, int(not gate)))
    if m >= 128 and not gate:  # the other widths, one slice, where they make a wave or more
        for wg in (1, 2) if m <= 512 else (2,):
            for bn in WIDE:
                if math.ceil(m / (64 * wg)) * math.ceil(n / bn) >= sms // 2:
                    out.append(_gemm_hopper.Plan(wg, bn, _gemm_hopper.stages_for(wg, bn, gate), 1,
                                                 False))  # fmt: skip
    return out


def streamk_candidates(m: int, n: int, sms: int, gate: bool) -> list:
    """The stream-K plans worth timing at ``m x n``: where 128 x 128 tiles make fewer than
    three waves, 64-row tiles (N 64 and 128) up to M = 256, 128-row ones from M = 128, and
    from M = 512 also with only the last partial wave shared."""
    if math.ceil(m / 128) * math.ceil(n / 128) >= 3 * sms:
        return []
    shapes = ([(1, 64), (1, 128)] if m <= 256 else []) + ([(2, 128)] if m >= 128 else [])
    plans = [
        _gemm_streamk.Plan(wg, bn, _gemm_streamk.stages_for(wg, bn, gate)) for wg, bn in shapes
    ]
    if m >= 512:
        plans.append(_gemm_streamk.Plan(2, 128, _gemm_streamk.stages_for(2, 128, gate), 0, 0))
    return plans


def choice_of(name: list):
    """A timed plan's JSON name (``_name``) as a ``linear.MEASURED`` choice, or None for one
    the table does not name (the mma.sync kernel's own plan, whose K split summed in the
    kernel is a global switch; the Hopper kernel's own plan)."""
    if name[0] == "sk":
        return _gemm_streamk.Plan(*name[1:])
    if name[0] == "gemv":
        return _gemv.Plan(name[1])
    if name[0] == "persistent":
        return linear_mod.Persistent(*name[1:]) if len(name) > 1 else "persistent"
    if name[0] in linear_mod.CONFIGS or name[0] in linear_mod.SKINNY_CONFIGS:
        return MmaPlan(*name)
    if name[0] == "mma":  # summed in the kernel: the table's plan up to FIXUP_ROWS rows
        return MmaPlan(name[3], name[1]) if name[2] == "fixup" else None
    if isinstance(name[0], int):
        return _gemm_hopper.Plan(*name)
    return None  # "mma.sync fixup" / "reduce" (the mma.sync kernel's own plan), "hopper"


def wins(rows: list[dict], margin: float = 0.02) -> dict:
    """{(N, K, layout): {M: choice}} of the searched shapes whose best plan beats the op's
    own choice (``route``) by ``margin``."""
    found: dict = {}
    for r in rows:
        best, own = r.get("best"), r.get("route")
        if not best or not own or best["us"] >= (1 - margin) * own["us"]:
            continue
        choice = choice_of(best["plan"])
        if choice is None:
            continue
        layout = ("gate" if r["act"] == "silu_gate" else "nk") if r["transposed"] else "kn"
        found.setdefault((r["n"], r["k"], layout), {})[r["m"]] = choice
    return found


def route_steps(old: list, points, choose) -> list:
    """A ``linear.MEASURED`` entry list over the sorted ``points``: ``choose(m, before)`` the
    choice at M = m (``before(m)``: the one ``old`` gives, else "rules"), runs of one choice
    merged into their last M, trailing "rules" dropped."""

    def before(m):
        return next((c for most, c in old if m <= most), "rules")

    entries: list = []
    for p in sorted(points):
        choice = choose(p, before)
        if entries and entries[-1][1] == choice:
            entries[-1] = (p, choice)
        else:
            entries.append((p, choice))
    while entries and entries[-1][1] == "rules":
        entries.pop()
    return entries


def measured_with(found: dict, table: dict | None = None) -> dict:
    """``linear.MEASURED`` (or ``table``) with the choices of ``found`` (``wins``) put in at
    their M, each for M in (M / 2, M]: the entries below and above keep their choice (or
    "rules": ``route``'s rules)."""
    table = dict(linear_mod.MEASURED if table is None else table)
    for key, at in found.items():
        old = table.get(key, [])
        points = {most for most, _ in old} | set(at) | {m // 2 for m in at if m > 1}
        table[key] = route_steps(old, points, lambda p, before, at=at: at.get(p, before(p)))
    return table


def choice_source(choice) -> str:
    """A ``linear.MEASURED`` choice as the table's source writes it."""
    if isinstance(choice, str):
        return f'"{choice}"'
    if isinstance(choice, MmaPlan):
        return f'Plan("{choice.config}", {choice.split})'
    if isinstance(choice, linear_mod.Persistent):
        return f"Persistent{tuple(choice)}"
    names = {_gemm_hopper.Plan: "_P", _gemm_streamk.Plan: "_S"}
    name = names.get(type(choice), "_gemv.Plan")
    fields = tuple(choice)
    while isinstance(choice, _gemm_hopper.Plan) and len(fields) > 5 and not fields[-1]:
        fields = fields[:-1]  # unpaired, pair-wise stores: the table's five fields
    return f"{name}{fields}".replace(",)", ")")


def table_source(table: dict) -> str:
    """``table`` (a ``linear.MEASURED``) as the Python source of its entries."""
    return "\n".join(
        f"    {key}: [{', '.join(f'({m}, {choice_source(c)})' for m, c in entries)}],".replace(
            "'", '"'
        )
        for key, entries in table.items()
    )


def _torch_linear(x, w, bias, res, act):
    """What the fused epilogue replaces: F.linear, the activation, the residual add."""
    F = torch.nn.functional
    z = F.linear(x, w, bias)
    if act == "silu_gate":
        g, u = z.chunk(2, -1)
        return F.silu(g) * u + res
    if act == "gelu":
        z = F.gelu(z)
    return z if res is None else z + res


def run_plan(plan, ops: list, m: int, n: int, k: int, sms: int, transposed: bool, act: str):
    """``linear.gemm`` with ``plan`` on ``ops`` (Operands: a, b, and bias, residual for an
    epilogue); "mma.sync fixup" / "mma.sync reduce": the mma.sync kernel's own plan with
    its K split summed in the kernel / by the reduction kernel."""
    fixup = plan == "mma.sync fixup"
    rows = linear_mod.FIXUP_ROWS
    if plan in ("mma.sync fixup", "mma.sync reduce"):
        plan = linear_mod.plan(m, n, k, sms, act == "silu_gate")
    elif isinstance(plan, MmaSplit):
        fixup, rows = plan.fixup, 0
        plan = MmaPlan(plan.config, plan.split)
    ia, ib, *rest = ops
    bias, res = rest or (None, None)
    before = linear_mod.MMA_FIXUP, linear_mod.FIXUP_ROWS
    linear_mod.MMA_FIXUP, linear_mod.FIXUP_ROWS = fixup, rows
    try:
        return gemm("matmul", ia, ib, (m, n), (m, n, k), ia.dtype, transposed, bias, res, act,
                    chosen=plan)  # fmt: skip
    finally:
        linear_mod.MMA_FIXUP, linear_mod.FIXUP_ROWS = before


def warm(shapes: list, sms: int, shard: int, shards: int) -> None:
    """Compile shard ``shard`` of ``shards`` of the distinct kernels the search of
    ``shapes`` times (each plan once, on uninitialized inputs of a shape it is timed at),
    into kaio's disk cache: processes started side by side share the compiling."""
    jobs: dict = {}
    for m, n, k, act in shapes:
        transposed, k, gate = k < 0 or act != "none", abs(k), act == "silu_gate"
        rows = 2 * n if gate else n
        made = [torch.empty(m, k, device="cuda", dtype=torch.half)]
        made.append(torch.empty(*((rows, k) if transposed else (k, n)), device="cuda").half())
        if act != "none":
            made += [
                torch.empty(rows, device="cuda").half(),
                torch.empty(m, n, device="cuda").half(),
            ]
        inputs = _arrays.Inputs("matmul")
        ops = [inputs.array(t, f"t{i}", ndim=(1, 2)) for i, t in enumerate(made)]
        route = linear_mod.route(ops[0], ops[1], (m, n, k), transposed, act == "none", gate)
        for plan in plans_of(m, n, k, sms, transposed, act, route)[0]:
            job = (plan, ops, m, n, k, transposed, act)
            rows = m if isinstance(plan, _gemv.Plan) else 0  # the skinny kernels: M a constexpr
            jobs.setdefault((str(_name(plan)), transposed, act, rows), job)
    for i, (plan, ops, m, n, k, transposed, act) in enumerate(jobs.values()):
        if i % shards == shard:
            try:
                run_plan(plan, ops, m, n, k, sms, transposed, act)
            except Exception as e:  # noqa: BLE001  (the timed search reports it)
                print(f"warm {plan}: {type(e).__name__}: {e}"[:200], flush=True)
    torch.cuda.synchronize()


PAIRS = "no"  # paired plans: "no", "also" or "only" (--pairs)
DEEP = False  # only the op's plan and a few tiles with 6-stage and deep rings (--deep)
DEEP_TILES = ((1, 64, 1), (1, 64, 2), (1, 128, 1), (2, 64, 1), (2, 128, 1))  # wg, bn, split


ALL_SPLITS = False  # also the mma.sync skinny tile at every K split, both sums (--splits)
OCC = False  # only short rings, two to four blocks a multiprocessor (--occ)
SETS["occ"] = [(1024, 1024, 1024), (2048, 2048, 2048), (1024, 4096, 4096), (512, 6144, 4096)]
# issue 33's third pass: the cases left below 0.9x cuBLAS (small M of the 8b attention
# shapes) and the squares, re-measured under the whole-program JIT
SETS["a33"] = [
    (8, 4096, 4096), (1024, 1024, 1024), (4, 4096, 4096), (2, 4096, 4096), (8, 6144, 4096),
    (32, 4096, 4096), (2048, 2048, 2048), (4, 6144, 4096), (16, 6144, 4096), (2, 6144, 4096),
    (16, 4096, 4096), (1, 6144, 4096), (1, 4096, 4096), (32, 6144, 4096),
]  # fmt: skip
MMA_SPLITS = (1, 2, 3, 4, 6, 8)  # the K splits of ``MmaSplit`` timed up to M = 64
# the second pass of a33 after the in-kernel sum got fast (sum_tile): the same cases, the
# other shapes at a few small M, M = 64 and 1024^3 (Hopper K splits summed in the kernel)
SETS["b33"] = [(m, n, 4096) for m in (8, 2, 4, 16, 1, 32) for n in (4096, 6144)]
SETS["b33"] += [(64, 4096, 4096), (64, 6144, 4096), (1024, 1024, 1024)]
SETS["b33"] += [(m, n, k) for m in (8, 2, 16) for n, k in LLAMA8B[2:] + LLAMA70B]
# the third pass: where the unsplit deep 16 x 64 tiles may also pay (M = 32-64)
SETS["c33"] = [(32, n, k) for n, k in ((8192, 8192), (4096, 14336), (8192, 28672), (28672, 4096))]
SETS["c33"] += [(64, n, k) for n, k in ((4096, 4096), (6144, 4096), (8192, 8192))]


# issue 33's fourth pass: the squares under the Hopper kernel's wide stores (``Plan.vec``: 4
# adjacent columns a store, or each warp's rows through shared memory and bulk copies), and
# ``linear`` (B [N, K]) at M <= 32 on the deep skinny tiles (--epi33)
SETS["d33"] = [(1024, 1024, 1024), (2048, 2048, 2048)]
SETS["d33"] += [(m, n, -k) for m in (1, 4, 16, 32) for n, k in LLAMA8B[:2] + LLAMA8B[3:]]
SETS["d33"] += [(m, 28672, -4096) for m in (4, 16)] + [(8192, 28672, 4096)]
# issue 33 on the H200 (M <= 16): the shapes below 1.0x cuBLAS there at M = 1-16 (4096 x
# 14336 at 0.89-0.91x, 57344 x 8192 at 0.89-0.95x, 10240 x 8192), the fused gelu linear of
# 4096 x 14336 at M = 1 (0.99x the torch ops) and 16, and plain linear at M = 1
SETS["h33"] = [(m, 4096, 14336) for m in (1, 16, 4, 2, 8)]
SETS["h33"] += [(1, 4096, 14336, "gelu"), (16, 4096, 14336, "gelu"), (1, 4096, -14336)]
SETS["h33"] += [(m, 57344, 8192) for m in (1, 16, 8, 2, 4)] + [(1, 10240, 8192), (16, 10240, 8192)]
SETS["h33"] += [(1, 4096, 4096), (16, 4096, 4096)]  # at 1.02-1.10x: whether a K split costs
# the other shapes at M <= 16 (at 0.97-1.13x cuBLAS on the H200): whether the H200's skinny
# plans pay there too
SETS["h33b"] = [
    (m, n, k)
    for m in (1, 16, 4)
    for n, k in ((6144, 4096), (28672, 4096), (8192, 8192), (8192, 28672))
]
EPI33 = False  # only the plans of ``epi33_plans`` (--epi33)


def epi33_plans(m: int, n: int, k: int, transposed: bool) -> list:
    """``--epi33``'s plans: for B [K, N] the Hopper tiles of the squares with each store
    width (``vec`` 0, 1, 2; a stage fewer where the warps' buffers need it; at 1024^3 also
    in pairs sharing A) and the persistent kernel; for B [N, K] the mma.sync kernel's
    16-row tiles unsplit (4- and 8-stage rings)."""
    if transposed:
        return [MmaPlan(c, 1) for c in ("16x64s8", "16x128s8", "16x128")]
    plans: list = ["persistent"]
    for wg, bn in ((2, 64), (1, 128), (2, 128), (2, 256)):
        if math.ceil(m / (64 * wg)) * math.ceil(n / bn) < 100:
            continue
        for vec in (0, 1, 2):
            stages = _gemm_hopper.stages_for(wg, bn, False, 8, vec)
            plans.append(_gemm_hopper.Plan(wg, bn, stages, 1, False, 0, vec))
            if m == n == k <= 1024 and (wg, bn) == (2, 64):  # in pairs sharing A (cuBLAS's)
                plans.append(_gemm_hopper.Plan(wg, bn, stages, 1, False, 2, vec))
    return plans


class MmaSplit(NamedTuple):
    """A searched plan: the mma.sync kernel's skinny tile ``config`` (``matmul.SKINNY`` or
    one of ``linear.SKINNY_CONFIGS``) with ``split`` K slices summed in the kernel
    (``fixup``: the last block of a tile adds them) or by ``gemm_reduce``, whatever
    ``linear.FIXUP_ROWS`` says."""

    split: int
    fixup: bool
    config: str = SKINNY


def occupancy_plans(m: int, n: int, sms: int, gate: bool) -> list:
    """``--occ``'s plans: unsplit tiles with rings of 2 to 4 stages, so that two or more
    blocks share a multiprocessor (one's epilogue beside another's loop), where the tiles
    make half a wave or more."""
    return [
        _gemm_hopper.Plan(wg, bn, stages, 1, False)
        for wg, bn in ((1, 64), (2, 64), (1, 128), (2, 128), (2, 256))
        for stages in (2, 3, 4)
        if _gemm_hopper.grid_tiles(m, n, wg, bn, 0) >= sms // 2
        and stages < _gemm_hopper.stages_for(wg, bn, gate)
    ]


def deep_plans(m: int, n: int, k: int, gate: bool, route) -> list:
    """``--deep``'s plans: ``DEEP_TILES`` (two warpgroups from M = 128) with rings of 6
    stages and of as many as fit (up to 12), and the op's own Hopper plan with the deep
    ring."""
    plans = []
    for wg, bn, split in DEEP_TILES:
        if wg == 2 and m < 128:
            continue
        for most in (6, 12):
            stages = _gemm_hopper.stages_for(wg, bn, gate, most=most)
            plans.append(_gemm_hopper.Plan(wg, bn, stages, split, False))
    if isinstance(route, _gemm_hopper.Plan):
        plans.append(route._replace(stages=_gemm_hopper.stages_for(route.wg, route.bn, gate, 12)))
    return list(dict.fromkeys(plans))


VEC_ONLY = False  # only the unsplit Hopper plans with wide stores and the persistent kernel (--vec)


def vec_plans(m: int, n: int, k: int, sms: int) -> list:
    """``--vec``'s plans (B [K, N], no epilogue): each unsplit Hopper tile of ``candidates``
    whose tiles make half a wave to two waves, with 4 adjacent columns a store (``vec`` 1)
    and rings of 6 stages and of as many as fit, and the persistent kernel at each width of
    ``linear.WIDTHS`` that makes half a wave or more."""
    plans: list = []
    for p in candidates(m, n, k, sms):
        tiles = _gemm_hopper.grid_tiles(m, n, p.wg, p.bn, 0)
        if p.split == 1 and sms // 2 <= tiles <= 2 * sms:
            for most in (6, 12):
                stages = _gemm_hopper.stages_for(p.wg, p.bn, False, most=most)
                plans.append(p._replace(stages=stages, fixup=False, vec=1))
    if m >= 128:
        plans.append("persistent")
        for bn in linear_mod.WIDTHS:
            if math.ceil(m / 128) * math.ceil(n / bn) >= sms // 2:
                plans.append(linear_mod.Persistent(bn))
    return list(dict.fromkeys(plans))


# issue 33 on the H200 (gmid): the M = 32 and 64 cases below 0.95x cuBLAS there (main
# ce69559), and the other shapes at M = 32
SETS["m32"] = [(32, n, k) for n, k in LLAMA70B[1:2] + LLAMA8B[:1] + LLAMA70B[3:] + LLAMA8B[2:]]
SETS["m32"] += [(32, 57344, 8192), (32, 10240, 8192), (32, 4096, 4096)]
SETS["m32"] += [(64, 6144, 4096), (64, 8192, 8192), (64, 28672, 4096), (64, 4096, 4096)]
# the fused gelu linear at M = 256 (w [4096, 14336]), 59.0 µs against the torch ops' 57.6 there,
# and the plain linear of that shape, which takes the same plans
SETS["g256"] = [(256, 4096, 14336, "gelu"), (256, 4096, -14336)]
SKINNY_ONLY = False  # at M <= 64 only the skinny tiles of ``skinny_plans`` (--skinny)


def skinny_plans(m: int, n: int, k: int, sms: int) -> list:
    """``--skinny``'s plans (memory-bound M = 17-64): the mma.sync kernel's deep skinny tiles
    (``linear.SKINNY_CONFIGS``, 16 and 32 rows) and the Hopper kernel's 64-row tiles with
    deep rings, each unsplit (wide stores on the Hopper kernel) and in K splits summed in the
    kernel whose blocks make half a wave to 2.5 waves."""
    plans: list = []

    def splits(tiles: int, depth: int):
        yield 1
        for split in (2, 3, 4, 6, 8):
            if k // split >= 4 * depth and sms / 2 <= tiles * split <= 2.5 * sms:
                yield split

    for config, cfg in linear_mod.SKINNY_CONFIGS.items():
        tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
        plans += [MmaSplit(s, True, config) for s in splits(tiles, cfg.bk)]
    for bn in (64, 128, 256):
        stages = _gemm_hopper.stages_for(1, bn, False, most=12)
        for s in splits(math.ceil(m / 64) * math.ceil(n / bn), _gemm_hopper.BK):
            if s == 1 or _gemm_hopper.fixup_ok(n):
                plans.append(_gemm_hopper.Plan(1, bn, stages, s, s > 1, 0, int(s == 1)))
    return plans


def plans_of(m: int, n: int, k: int, sms: int, transposed: bool, act: str, route) -> tuple:
    """(the plans timed for one shape, the Hopper kernel's own plan): the op's choice
    ``route`` first, then ``candidates``, the skinny kernels, the mma.sync kernel's plan and
    K splits around it, the persistent kernel and the stream-K plans, as each applies."""
    gate = act == "silu_gate"
    default = _gemm_hopper.plan(m, n, k, sms, gate)
    if EPI33:
        return [route, *epi33_plans(m, n, k, transposed)], default
    if SKINNY_ONLY and m <= 64:
        return [route, *skinny_plans(m, n, k, sms)], default
    if VEC_ONLY and not transposed and act == "none":
        return [route, *vec_plans(m, n, k, sms)], default
    if DEEP:
        return [route, *deep_plans(m, n, k, gate, route)], default
    if OCC:
        return [route, *occupancy_plans(m, n, sms, gate)], default
    plans = candidates(m, n, k, sms, gate)
    if default not in plans:
        plans.insert(0, default)
    if default.split > 1:
        plans.append(default._replace(fixup=False))
    if _gemv.MAX_M >= m and not transposed:  # the skinny kernel, K splits around its own choice
        mine = _gemv.split_for(m, n, k, sms)
        plans += sorted({_gemv.Plan(max(1, s)) for s in (mine // 4, mine // 2, mine, 2 * mine)})
    if _gemv.MAX_M_NK >= m and transposed:
        plans.append(_gemv.Plan(1))
    if m <= 64:
        plans += ["mma.sync fixup", "mma.sync reduce"]
        mine = linear_mod.plan(m, n, k, sms, gate)
        if mine.split > 1:  # its K split halved and doubled
            plans += [replace(mine, split=mine.split // 2), replace(mine, split=2 * mine.split)]
    if m <= 64 and ALL_SPLITS:  # the skinny tile, each K split summed both ways; Hopper
        # tiles of 64 columns at most (the wider ones lost at these M: docs/performance.md),
        # and K splits summed in the kernel (one launch)
        plans = [
            p
            for p in plans
            if not isinstance(p, _gemm_hopper.Plan) or p.bn <= 64 and (p.split == 1 or p.fixup)
        ]
        for config in (SKINNY, *linear_mod.SKINNY_CONFIGS):  # summed in the kernel
            plans += [MmaSplit(s, True, config) for s in MMA_SPLITS if k // s >= 256]
        plans += [MmaSplit(s, False) for s in MMA_SPLITS[1:4] if k // s >= 256]  # gemm_reduce
    if m == n == k and m <= 1024 and ALL_SPLITS:  # 128 x 64 tiles (cuBLAS's at 1024^3 on an
        # H100: 8 stages, clusters of two sharing A) with deeper rings, alone and paired
        for wg, bn, pair in ((2, 64, 0), (2, 64, 2), (1, 128, 0), (1, 128, 1)):
            plans += [_gemm_hopper.Plan(wg, bn, st, 1, False, pair) for st in (8, 9)]
    if m >= 128 and not transposed and act == "none":
        plans.append("persistent")  # _matmul_hopper's kernel (128 x 128 or 128 x 256 tiles)
        for bn in (128, *WIDE, 256):  # and each width, where the tiles make a wave or more
            if math.ceil(m / 128) * math.ceil(n / bn) >= sms // 2:
                plans.append(linear_mod.Persistent(bn))
        if m >= 1024:  # the rule's width in groups of 4 and 16 tile rows
            bn = linear_mod.persistent_width(m, n, sms)
            plans += [linear_mod.Persistent(bn, 4), linear_mod.Persistent(bn, 16)]
    plans += streamk_candidates(m, n, sms, gate)
    if PAIRS != "no":  # clusters of two blocks sharing A or B: the unsplit Hopper plans paired
        paired = [
            p._replace(pair=pair)
            for p in plans
            if isinstance(p, _gemm_hopper.Plan) and p.split == 1 and not p.pair and p.stages <= 6
            for pair, tiles in ((1, math.ceil(m / (64 * p.wg))), (2, math.ceil(n / p.bn)))
            if tiles >= 2 and _gemm_hopper.grid_tiles(m, n, p.wg, p.bn, 0) >= sms // 2
        ]
        if m >= 256 and not transposed and act == "none":  # the persistent kernel in pairs
            for bn in sorted({128, linear_mod.persistent_width(m, n, sms), 256}):
                if math.ceil(m / 128) * math.ceil(n / bn) >= sms // 2:
                    paired.append(linear_mod.Persistent(bn, _matmul_hopper.GROUP_ROWS, 1))
        plans = paired if PAIRS == "only" else plans + paired
    return [route, *dict.fromkeys(plans)], default


def search(
    h: Harness, m: int, n: int, k: int, sms: int, transposed: bool = False, act: str = "none"
) -> dict:
    """Time the peer and each candidate plan of one shape (checked against an f32
    reference, and a split's result the same bits twice): the row of the JSON.
    ``transposed``: B is [N, K] (``linear``; cuBLAS through ``F.linear``); ``act`` other than
    "none": ``linear`` with bias, that activation and a residual, against the torch ops."""
    gate = act == "silu_gate"
    epi = act != "none"
    transposed = transposed or epi
    rows = 2 * n if gate else n
    nbytes = (m * k + k * rows + m * n * (2 if epi else 1)) * 2
    sets = []
    for _ in range(h.sets_for(nbytes)):
        a = torch.randn(m, k, device="cuda").half()
        shape = (rows, k) if transposed else (k, n)
        b = (torch.randn(*shape, device="cuda") * k**-0.5).half()
        extra = ()
        if epi:
            bias = torch.randn(rows, device="cuda").half()
            extra = (bias, torch.randn(m, n, device="cuda").half())
        sets.append((a, b, *extra))
    if epi:
        ref = _torch_linear(*[t.float() for t in sets[0]], act)
    else:
        ref = sets[0][0].float() @ (sets[0][1].float().T if transposed else sets[0][1].float())
    ops = {}
    for operands in sets:
        inputs = _arrays.Inputs("matmul")
        names = ("a", "b", "bias", "res")
        ops[operands[0].data_ptr()] = [
            inputs.array(t, nm, ndim=(1, 2)) for t, nm in zip(operands, names, strict=False)
        ]

    def kaio_fn(plan):
        def fn(a, *_):
            return run_plan(plan, ops[a.data_ptr()], m, n, k, sms, transposed, act)

        return fn

    def med(fn):
        return statistics.median(h.time(fn, sets)) * 1e3

    if epi:
        peer = med(lambda *t: _torch_linear(*t, act))
    else:
        peer = med(torch.nn.functional.linear if transposed else torch.matmul)
    route = linear_mod.route(*ops[sets[0][0].data_ptr()][:2], (m, n, k), transposed, not epi,
                             gate)  # fmt: skip
    plans, default = plans_of(m, n, k, sms, transposed, act, route)
    timed = []
    for plan in plans:
        fn = kaio_fn(plan)
        try:
            got = fn(*sets[0])
            err = ((got.float() - ref).norm() / ref.norm()).item()
            same = torch.equal(got, fn(*sets[0]))  # a split's sum: same bits each run
            us = med(fn)
        except Exception as e:  # noqa: BLE001  (a plan failing must not stop the search)
            print(f"  {plan}: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        ok = err < 3e-3 and same
        row = {"plan": _name(plan), "us": us, "err": err, "same": same, "ok": ok}
        if plan is route and not any(t.get("route") for t in timed):
            row["route"] = True
        timed.append(row)
    good = [t for t in timed if t["ok"]]
    best = min(good, key=lambda t: t["us"]) if good else None
    dflt = next((t for t in timed if t["plan"] == _name(default)), None)
    chosen = next((t for t in timed if t.get("route")), None)
    return {
        "route": chosen,
        "m": m,
        "n": n,
        "k": k,
        "transposed": transposed,
        "act": act,
        "cublas_us": peer,
        "default": dflt,
        "best": best,
        "all": timed,
    }


def main(argv: list[str] | None = None) -> None:
    """Time each shape's candidate plans; write the JSON (--out) as shapes finish."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="all", help=f"comma-separated, of {sorted(SETS)}")
    p.add_argument("--budget", type=float, default=70.0, help="seconds to start shapes in")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warm", help="R/J: compile shard R of J of the search's kernels, time nothing")
    p.add_argument("--pairs", choices=("no", "also", "only"), default="no",
                   help="also (or only) time the Hopper plans in clusters of two")  # fmt: skip
    p.add_argument("--deep", action="store_true", help="only deep rings against 6 stages")
    p.add_argument("--occ", action="store_true", help="only short rings, blocks side by side")
    p.add_argument("--epi33", action="store_true", help="only the store widths and B [N, K] tiles")
    p.add_argument(
        "--splits",
        action="store_true",
        help="also the mma.sync skinny tile at every K split, both sums (M <= 64)",
    )
    p.add_argument("--waves", action="store_true", help="also widths that fill whole waves")
    p.add_argument("--skinny", action="store_true", help="at M <= 64 only the skinny tiles")
    p.add_argument("--vec", action="store_true", help="only unsplit wide-store and persistent")
    p.add_argument("--cases", help="M:N:K,... (K < 0: B [N, K]) instead of --set")
    args, rest = p.parse_known_args(argv)
    global PAIRS, DEEP, OCC, ALL_SPLITS, EPI33, WAVES, VEC_ONLY, SKINNY_ONLY
    PAIRS, DEEP, OCC, ALL_SPLITS = args.pairs, args.deep, args.occ, args.splits
    EPI33, WAVES, VEC_ONLY, SKINNY_ONLY = args.epi33, args.waves, args.vec, args.skinny
    h = Harness.from_args("Hopper GEMM plan search", rest, reps=args.reps)
    start = time.perf_counter()
    sms = h.meta["sms"]
    rows = []
    shapes = [
        (*shape, "none") if len(shape) == 3 else shape
        for name in args.set.split(",")
        for shape in (EPILOGUES if name == "epi" else SETS[name])
    ]
    if args.cases:
        shapes = [(*(int(v) for v in c.split(":")), "none") for c in args.cases.split(",")]
    if args.warm:
        warm(shapes, sms, *(int(v) for v in args.warm.split("/")))
        return
    for m, n, k, act in shapes:
        if time.perf_counter() - start > args.budget:
            print(f"budget spent: stopped before {m}x{n}x{k} {act}", flush=True)
            break
        row = search(h, m, n, abs(k), sms, transposed=k < 0, act=act)
        k = abs(k)
        rows.append(row)
        bad = [t["plan"] for t in row["all"] if not t["ok"]]
        cu = row["cublas_us"]
        print(
            f"M={m:5d} {_shape(row)} cuBLAS {cu:7.1f}us  route {_fmt(row['route'], cu)}  "
            f"best {_fmt(row['best'], cu)}" + (f"  WRONG {bad}" if bad else ""),
            flush=True,
        )
        if h.out:
            with open(h.out, "w") as fh:
                json.dump({"meta": h.meta, "rows": rows}, fh)
        torch.cuda.empty_cache()
    print(f"\nHopper GEMM plans on {h.meta['gpu']} ({sms} SMs), f16, B [K, N]; x = cuBLAS/kaio")
    print("| M | N x K | cuBLAS µs | route's plan | x | best plan | x |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        d, b, cu = r["route"], r["best"], r["cublas_us"]
        print(
            f"| {r['m']} | {_shape(r)} | {cu:.1f} | {_fmt(d, cu, ' | ')} | {_fmt(b, cu, ' | ')} |"
        )


def _shape(row: dict) -> str:
    """ "NxK" of a row, marked " [N,K]" for B in nn.Linear's layout, and its epilogue (whose
    peer is the torch ops, not cuBLAS alone)."""
    text = f"{row['n']}x{row['k']}" + (" [N,K]" if row["transposed"] else "")
    return text + (f" {row['act']}+bias+res vs torch" if row["act"] != "none" else "")


def _name(plan) -> list:
    """A plan as JSON: ``[wg, bn, stages, split, fixup]``, ``["gemv", split]``,
    ``[config, split]`` (mma.sync), ``["sk", wg, bn, stages, blocks, spread]`` (stream-K)
    or ``["persistent"]`` (``["persistent", bn, group]``: a ``linear.Persistent``)."""
    if isinstance(plan, str):
        return [plan]
    if isinstance(plan, linear_mod.Persistent):
        return ["persistent", *plan]
    if isinstance(plan, _gemm_streamk.Plan):
        return ["sk", *plan]
    if isinstance(plan, MmaPlan):
        return [plan.config, plan.split]
    if isinstance(plan, MmaSplit):
        return ["mma", plan.split, "fixup" if plan.fixup else "reduce", plan.config]
    return ["gemv", plan.split] if isinstance(plan, _gemv.Plan) else list(plan)


def _fmt(t: dict | None, cublas: float, sep: str = " ") -> str:
    """A timed plan as "[plan] µs (x cuBLAS)", or "-" when none ran."""
    if t is None:
        return "-"
    if sep == " ":
        return f"{t['plan']} {t['us']:.1f}us ({cublas / t['us']:.2f}x)"
    return f"{t['plan']}{sep}{cublas / t['us']:.2f}"


if __name__ == "__main__":
    main()
