"""The tensor-core matmul ops: ``matmul_tc``, ``matmul_tc_async`` (f16) and
``matmul_tc_bf16``, ``matmul_tc_bf16_async`` (bf16): ``C[M, N] = A[M, K] @ B[K, N]`` in f32.

On an sm_90 GPU (H100, H200) the ops without an explicit plan are ``kaio_ops.matmul`` with f32
output: its planner (``linear.route``) picks the kernel and plan of each shape (the Hopper
kernels ``_gemm_hopper``, ``_gemm_streamk`` and ``_matmul_hopper``'s persistent one, and for a
few rows the skinny mma.sync tiles), so the sync and async variants run alike there
(``KAIO_HOPPER_MATMUL=0`` opts out of the Hopper kernels). Elsewhere, and with an explicit
plan, the kernels are those of ``kaio_ops._matmul_kernels`` (DSL, mma.sync): this module
checks the inputs, picks a tile configuration (a heuristic per shape and GPU, or the one
``kaio_ops.tune`` measured fastest for this GPU and shape bucket) and launches. Skinny
products (M <= 16, decode) split K over extra blocks and sum the slices in a fixed order.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from kaio.sim import active as simulating
from kaio.types import bf16, f16, f32
from kaio_ops import _arrays, _matmul_hopper
from kaio_ops._matmul_kernels import matmul_kernel, sum_slices
from kaio_ops._plan import planned

__all__ = [
    "CONFIGS",
    "MatmulConfig",
    "matmul_tc",
    "matmul_tc_async",
    "matmul_tc_bf16",
    "matmul_tc_bf16_async",
]

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

    def shared_bytes(self, pipelined: bool, itemsize: int = 2) -> int:
        """Dynamic shared memory per block."""
        tiles = self.bm * self.bk + self.bk * self.bn
        return self.stages_for(pipelined) * tiles * itemsize

    def for_itemsize(self, itemsize: int) -> MatmulConfig:
        """The same tiles for elements of ``itemsize`` bytes: BK counts elements and a
        tensor-core k step is 32 bytes, so 8-bit types take twice the 16-bit BK."""
        return self if itemsize == 2 else replace(self, bk=self.bk * 2 // itemsize)

    def constexprs(self, pipelined: bool, vec: bool, quant: int = 0) -> dict:
        """The kernel's constexpr arguments (``quant``: 4 for int4 weights)."""
        return {
            "BM": self.bm,
            "BN": self.bn,
            "BK": self.bk,
            "WARPS_M": self.warps_m,
            "WARPS_N": self.warps_n,
            "STAGES": self.stages_for(pipelined),
            "ASYNC": pipelined,
            "VEC": vec,
            "QUANT": quant,
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


def heuristic(m: int, n: int, k: int, sms: int = _arrays.DEFAULT_SMS) -> Plan:
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


def plan_for(like: _arrays.Operand, m: int, n: int, k: int, variant: str) -> Plan:
    """The tuned plan for the GPU of ``like`` (an ``Operand``) and this shape bucket if
    ``kaio_ops.tune`` stored one, else the heuristic."""
    from kaio_ops import tune

    stored = tune.lookup(like, variant, m, n, k)
    return stored if stored is not None else heuristic(m, n, k, _arrays.multiprocessors(like))


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
    """``a @ b`` in f32 with ``plan`` (None: on sm_90 ``kaio_ops.linear``'s GEMM planner,
    elsewhere ``plan_for``); the body of the four ops."""
    a, b = _check(op, a, b, dtype)
    m, k = a.shape
    n = b.shape[1]
    if plan is None and _hopper(a):
        return _gemm(op, a, b, (m, n, k), None)
    variant = f"{dtype.name}_{'async' if pipelined else 'sync'}"
    if plan is None and m <= SKINNY_M:
        return _gemm(op, a, b, (m, n, k), plan_for(a, m, n, k, variant))
    plan = plan or plan_for(a, m, n, k, variant)
    return launch(a, b.arg(k * n), (m, n, k), pipelined, plan, aligned=b.aligned(16))


def _gemm(op: str, a, b, mnk: tuple, plan: Plan | None):
    """``a @ b`` in f32 by the GEMM of ``kaio_ops.matmul`` and ``kaio_ops.linear``
    (``linear.gemm``): with ``plan`` None its own choice of kernel and plan per shape
    (``linear.route``: on sm_90 the Hopper kernels, 0.97-1.05x cuBLAS with f32 output on an
    H100 from 256^3 to 8192^3, and for a few rows the skinny kernels); with an mma.sync
    ``plan`` (up to ``SKINNY_M`` rows elsewhere) that plan's tiles and K split in one launch,
    the last block of a tile summing the K slices itself (``linear.mma_fixup``) where
    ``launch`` would launch ``sum_slices`` after it: half the host time of a call at these
    sizes."""
    from kaio_ops.linear import gemm  # linear imports this module

    m, n, _ = mnk
    return gemm(op, a, b, (m, n), mnk, f32, transposed=False, chosen=plan)


def hopper_takes(a, b, m: int, n: int, k: int) -> bool:
    """Whether ``a @ b`` (``Operand``s; ``b`` None for a fresh, aligned array) would run
    ``_matmul_hopper``'s persistent kernel well (the quantized prefill path,
    ``kaio_ops._prefill``): an sm_90 GPU, M > 16, operands TMA can read and enough tiles of
    C."""
    return (
        m > SKINNY_M
        and _hopper(a)
        and _matmul_hopper.eligible(a, b, m, n, k)
        and _matmul_hopper.worthwhile(m, n, _arrays.multiprocessors(a))
    )


def _hopper(a: _arrays.Operand) -> bool:
    """Whether ``_matmul_hopper``'s TMA and wgmma kernel replaces the mma.sync one: ``a``
    (an ``Operand``) is on an sm_90 GPU (H100/H200), unless ``KAIO_HOPPER_MATMUL=0``. Never
    under the simulator (its tests launch the kernel directly)."""
    if os.environ.get("KAIO_HOPPER_MATMUL") == "0" or simulating():
        return False
    dev = _arrays.gpu(a)
    return dev is not None and dev.arch == "sm_90"


def launch(
    a, b_flat, mnk: tuple, pipelined: bool, plan: Plan, alpha=1.0, aligned=True, scales=None
):
    """``alpha * a @ b`` in f32 with ``plan``: ``a`` an ``Operand`` [M, K], ``b_flat`` the
    flat K x N matrix (N x K for 8-bit types; with ``scales``, the int4 words as K/8 x 2N
    halves) and ``aligned`` whether it starts on a 16-byte boundary. The launch shared by
    the 16-bit and the quantized matmuls."""
    m, n, k = mnk
    dtype = a.dtype
    cfg = CONFIGS[plan.config].for_itemsize(dtype.itemsize)
    per = 16 // dtype.itemsize  # elements per 16-byte copy
    b_row = k if dtype.itemsize == 1 else (2 * n if scales is not None else n)
    # VEC: 16-byte copies of a's rows (K) and b's (b_row), and 2-element stores of c's rows
    # (N even): every array the path touches
    vec = k % per == 0 and b_row % per == 0 and n % 2 == 0 and a.aligned(16) and aligned
    quant = 0 if scales is None else 4
    if scales is None:
        scales = _no_scales(a)
    c = _arrays.output(a, (m, n), f32)
    # 8-bit products are exact integers; f32 partial sums of a K split would round them
    split, k_slice = k_slices(k, plan.split if dtype.itemsize > 1 else 1, cfg.bk)
    target = c if split == 1 else _arrays.output(a, (split * m, n), f32)
    tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
    stream = _arrays.stream_of(a)
    config = ((tiles, 1, split), cfg.threads, stream, cfg.shared_bytes(pipelined, dtype.itemsize))
    matmul_kernel[config](
        a.arg(m * k),
        b_flat,
        target,
        scales,
        m,
        n,
        k,
        k_slice,
        alpha,
        **cfg.constexprs(pipelined, vec, quant),
        DT=dtype,
    )
    if split > 1:
        sum_slices[(math.ceil(m * n / 256), 256, stream, 0)](target, c, SPLIT=split)
    return c


def k_slices(k: int, split: int, bk: int) -> tuple[int, int]:
    """How a plan's K ``split`` cuts K: (number of slices, slice length), each slice a whole
    number of ``bk`` steps; K shorter than ``split`` steps is not split."""
    split = split if k >= split * bk else 1
    k_slice = math.ceil(math.ceil(k / split) / bk) * bk
    return math.ceil(k / k_slice), k_slice


_NO_SCALES: dict = {}


def _no_scales(like):
    """A 1 x 1 f16 array of ``like``'s kind and device for the unused ``scales`` parameter
    (made once per kind and device)."""
    key = (like.kind, like.device)
    if key not in _NO_SCALES:
        _NO_SCALES[key] = _arrays.constant(_arrays.output(like, (1, 1), f16))
    return _NO_SCALES[key]


@planned("a", "b")
def matmul_tc(a, b):
    """``a @ b`` for f16 ``a`` [M, K] and ``b`` [K, N] on tensor cores, in f32 [M, N].
    Shared-memory tiles are loaded through registers (no cp.async): the baseline."""
    return run(a, b, f16, False, op="matmul_tc")


@planned("a", "b")
def matmul_tc_async(a, b):
    """``a @ b`` for f16 inputs in f32, with a multi-stage cp.async pipeline (sm_80+)."""
    return run(a, b, f16, True, op="matmul_tc_async")


@planned("a", "b")
def matmul_tc_bf16(a, b):
    """``a @ b`` for bf16 ``a`` [M, K] and ``b`` [K, N] on tensor cores, in f32 [M, N]."""
    return run(a, b, bf16, False, op="matmul_tc_bf16")


@planned("a", "b")
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
                    out.append((matmul_kernel, {**cfg.constexprs(pipelined, vec), "DT": dtype}))
    out += [(sum_slices, {"SPLIT": s}) for s in (2, 16)]
    return out
