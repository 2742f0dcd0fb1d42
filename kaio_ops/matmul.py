"""The tensor-core matmul ops: ``matmul_tc``, ``matmul_tc_async`` (f16) and
``matmul_tc_bf16``, ``matmul_tc_bf16_async`` (bf16): ``C[M, N] = A[M, K] @ B[K, N]`` in f32.

The kernels are in ``kaio_ops._matmul_kernels`` (DSL). This module checks the inputs, picks a
tile configuration (a heuristic per shape and GPU, or the one ``kaio_ops.tune`` measured
fastest for this GPU and shape bucket) and launches. Skinny products (M <= 16, decode) split
K over extra blocks and sum the slices in a second, deterministic kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import kaio
from kaio.sim.mode import active as simulating
from kaio.types import bf16, f16, f32
from kaio_ops import _arrays
from kaio_ops._matmul_kernels import MATMUL, sum_slices

__all__ = [
    "CONFIGS",
    "MatmulConfig",
    "matmul_tc",
    "matmul_tc_async",
    "matmul_tc_bf16",
    "matmul_tc_bf16_async",
]

DEFAULT_SMS = 132  # H100/H200 SXM; used when there is no GPU to ask (the simulator)
SKINNY_M = 16


@dataclass(frozen=True)
class MatmulConfig:
    """A block tile ``bm x bn`` advanced ``bk`` at a time by ``warps_m x warps_n`` warps,
    with ``stages`` shared-memory buffers in the async pipeline."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def threads(self) -> int:
        """Threads per block."""
        return 32 * self.warps_m * self.warps_n

    def stages_for(self, pipelined: bool) -> int:
        """Shared-memory buffers: ``stages`` when pipelined, else 1."""
        return self.stages if pipelined else 1

    def shared_bytes(self, pipelined: bool) -> int:
        """Dynamic shared memory per block."""
        return self.stages_for(pipelined) * (self.bm * self.bk + self.bk * self.bn) * 2

    def constexprs(self, pipelined: bool, vec: bool) -> dict:
        """The kernel's constexpr arguments."""
        return {
            "BM": self.bm,
            "BN": self.bn,
            "BK": self.bk,
            "WARPS_M": self.warps_m,
            "WARPS_N": self.warps_n,
            "STAGES": self.stages_for(pipelined),
            "ASYNC": pipelined,
            "VEC": vec,
        }


# Measured on an H200 (bench/matmul.py --configs, docs/performance.md): BK = 32 with 4 stages
# beats BK = 64 with 3; more warps per block (64x32 warp tiles) and 2 blocks per SM lose.
CONFIGS: dict[str, MatmulConfig] = {
    "128x256": MatmulConfig(128, 256, 32, 2, 4, 4),
    "128x128": MatmulConfig(128, 128, 32, 2, 2, 4),
    "64x128": MatmulConfig(64, 128, 32, 2, 2, 4),
    "64x64": MatmulConfig(64, 64, 32, 2, 2, 4),
    "16x128": MatmulConfig(16, 128, 64, 1, 4, 4),
}
SKINNY = "16x128"


@dataclass(frozen=True)
class Plan:
    """How one call runs: the configuration and the number of K slices."""

    config: str
    split: int = 1


def _sms() -> int:
    if simulating() or not kaio.gpu_available():
        return DEFAULT_SMS
    return kaio.device().multiprocessor_count


def heuristic(m: int, n: int, k: int, sms: int = DEFAULT_SMS) -> Plan:
    """The default plan for an ``m x n x k`` product on a GPU with ``sms`` multiprocessors:
    the largest tile that still gives every multiprocessor a block, and for skinny ``m`` a K
    split that gives each about one (measured best on an H200 for K = N = 4096)."""
    if m <= SKINNY_M:
        cfg = CONFIGS[SKINNY]
        tiles = math.ceil(n / cfg.bn)
        split = max(1, min(round(sms / tiles), k // (4 * cfg.bk), 16))
        return Plan(SKINNY, split)
    for name in ("128x256", "128x128", "64x128"):  # 64x64 when none fills the GPU
        cfg = CONFIGS[name]
        if math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn) >= sms:
            return Plan(name)
    return Plan("64x64")


def plan_for(m: int, n: int, k: int, variant: str) -> Plan:
    """The tuned plan for this GPU and shape bucket if ``kaio_ops.tune`` stored one, else the
    heuristic."""
    from kaio_ops import tune

    stored = tune.lookup(variant, m, n, k)
    return stored if stored is not None else heuristic(m, n, k, _sms())


def _check(op: str, a, b, dtype) -> tuple:
    inputs = _arrays.Inputs(op)
    form = "[M, K]"
    a = inputs.array(a, "a", ndim=2, dtypes=(dtype,), form=form)
    b = inputs.array(b, "b", ndim=2, dtypes=(dtype,), form="[K, N]")
    m, k = a.shape
    if b.shape[0] != k:
        raise inputs.error("b", f"must have K = {k} rows (a is {a.shape}), got shape {b.shape}")
    if 0 in (m, k, b.shape[1]):
        raise inputs.error("a" if 0 in a.shape else "b", "has an empty dimension")
    return a, b


def run(a, b, dtype, pipelined: bool, plan: Plan | None = None, op: str = "matmul"):
    """``a @ b`` in f32 with ``plan`` (None: ``plan_for``); the body of the four ops."""
    a, b = _check(op, a, b, dtype)
    m, k = a.shape
    n = b.shape[1]
    variant = f"{dtype.name}_{'async' if pipelined else 'sync'}"
    plan = plan or plan_for(m, n, k, variant)
    cfg = CONFIGS[plan.config]
    vec = k % 8 == 0 and n % 8 == 0 and a.aligned(16) and b.aligned(16)
    c = _arrays.output(a, (m, n), f32)
    split = plan.split if k >= plan.split * cfg.bk else 1
    k_slice = math.ceil(math.ceil(k / split) / cfg.bk) * cfg.bk
    split = math.ceil(k / k_slice)
    target = c if split == 1 else _arrays.output(a, (split * m, n), f32)
    tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
    stream = _arrays.stream_of(a)
    launch = ((tiles, 1, split), cfg.threads, stream, cfg.shared_bytes(pipelined))
    flat_a, flat_b = a.view(m * k), b.view(k * n)
    MATMUL[dtype][launch](
        flat_a, flat_b, target, m, n, k, k_slice, **cfg.constexprs(pipelined, vec)
    )
    if split > 1:
        sum_slices[(math.ceil(m * n / 256), 256, stream, 0)](target, c, SPLIT=split)
    return c


def matmul_tc(a, b):
    """``a @ b`` for f16 ``a`` [M, K] and ``b`` [K, N] on tensor cores, in f32 [M, N].
    Shared-memory tiles are loaded through registers (no cp.async): the baseline."""
    return run(a, b, f16, False, op="matmul_tc")


def matmul_tc_async(a, b):
    """``a @ b`` for f16 inputs in f32, with a multi-stage cp.async pipeline (sm_80+)."""
    return run(a, b, f16, True, op="matmul_tc_async")


def matmul_tc_bf16(a, b):
    """``a @ b`` for bf16 ``a`` [M, K] and ``b`` [K, N] on tensor cores, in f32 [M, N]."""
    return run(a, b, bf16, False, op="matmul_tc_bf16")


def matmul_tc_bf16_async(a, b):
    """``a @ b`` for bf16 inputs in f32, with a multi-stage cp.async pipeline (sm_80+)."""
    return run(a, b, bf16, True, op="matmul_tc_bf16_async")


def specializations():
    """(kernel, constexprs) of every specialization the matmul ops launch (for PTX checks)."""
    out = []
    for dtype in (f16, bf16):
        for cfg in CONFIGS.values():
            for pipelined in (False, True):
                for vec in (False, True):
                    out.append((MATMUL[dtype], cfg.constexprs(pipelined, vec)))
    out += [(sum_slices, {"SPLIT": s}) for s in (2, 16)]
    return out
