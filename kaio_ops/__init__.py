"""kaio_ops: LLM kernels written in the kaio DSL (``@kaio.gpu_kernel``), called like library
functions.

Every op takes CUDA arrays (torch tensors, CuPy arrays, ``kaio.DeviceArray``; contiguous,
row-major) and returns new arrays of the kind of its first input, on its device, launched on
the caller's current torch/CuPy stream. Inside ``with kaio.simulate():`` ops take NumPy arrays,
run on the CPU simulator and return NumPy arrays. A wrong dtype, rank, shape, device or a
non-contiguous input raises ``ValueError`` naming the argument and the form expected.
docs/ops.md gives each op's contract.

Tensor-core matmul (A [M, K] @ B [K, N] -> f32 [M, N]; ``kaio_ops.tune.matmul`` autotunes):

- ``matmul_tc(a, b)``, ``matmul_tc_async(a, b)``: f16 inputs
- ``matmul_tc_bf16(a, b)``, ``matmul_tc_bf16_async(a, b)``: bf16 inputs

Memory-bound ops (f32, f16, bf16; computed in f32; rows are the last axis):

- ``silu_gate(x, gate)``: ``x * sigmoid(x) * gate``
- ``gelu(x, approximate="tanh")``: GELU, tanh form or exact (``"none"``)
- ``add(x, y)``, ``mul(x, y)``: y of x's shape or a row vector [N]
- ``rms_norm(x, w, eps=1e-6)``, ``rms_norm_residual(x, residual, w, eps=1e-6)``
- ``layer_norm(x, w, b, eps=1e-5)``
- ``softmax(x)``: over the last axis, rows of any length
- ``rope(x, cos, sin, interleaved=False)``: rotary embedding, x [S, D] or [S, H, D]
"""

from kaio_ops import tune
from kaio_ops.elementwise import add, gelu, mul, silu_gate
from kaio_ops.matmul import matmul_tc, matmul_tc_async, matmul_tc_bf16, matmul_tc_bf16_async
from kaio_ops.rotary import rope
from kaio_ops.rows import layer_norm, rms_norm, rms_norm_residual, softmax

__all__ = [
    "add",
    "gelu",
    "layer_norm",
    "matmul_tc",
    "matmul_tc_async",
    "matmul_tc_bf16",
    "matmul_tc_bf16_async",
    "mul",
    "rms_norm",
    "rms_norm_residual",
    "rope",
    "silu_gate",
    "softmax",
    "tune",
]
