"""Using kaio_ops' tensor-core matmul: from torch on a GPU, from NumPy on the simulator.

The kernel behind these calls is ordinary kaio DSL code (kaio_ops/_matmul_kernels.py): the
building blocks of examples/tensor_core_matmul.py (cp.async, swizzled shared tiles, ldmatrix,
mma_f16) grown into a pipelined, multi-warp, any-shape kernel. This script prints the plan the
heuristic picks for a few shapes, the instructions in the compiled kernel, then runs one
product and checks it against float64. Run: python examples/matmul_ops.py
"""

import numpy as np

import kaio
import kaio_ops
from kaio_ops._matmul_kernels import matmul_kernel
from kaio_ops.matmul import CONFIGS, heuristic


def main() -> None:
    for m, n, k in [(4096, 4096, 4096), (1024, 1024, 1024), (1, 4096, 4096)]:
        plan = heuristic(m, n, k)
        cfg = CONFIGS[plan.config]
        print(
            f"{m}x{n}x{k}: {plan.config} tiles, {cfg.threads} threads, "
            f"{cfg.stages}-stage pipeline, K split {plan.split}"
        )
    ptx = matmul_kernel.ptx(arch="sm_90", DT=kaio.f16, **CONFIGS["128x256"].constexprs(True, True))
    for instr in ("cp.async.cg", "ldmatrix", "mma.sync.aligned.m16n8k16"):
        print(f"  {instr:28s} x{ptx.count(instr)} in the 128x256 kernel's PTX")

    rng = np.random.default_rng(0)
    m, n, k = 300, 260, 200  # edge tiles in every dimension
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    if kaio.gpu_available():
        import torch

        where = f"GPU ({kaio.device().name})"
        c = kaio_ops.matmul_tc_async(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda())
        c = c.cpu().numpy()
    else:
        where = "CPU simulator"
        with kaio.simulate():
            c = kaio_ops.matmul_tc_async(a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.linalg.norm(c - ref) / np.linalg.norm(ref)
    print(f"{m}x{n}x{k} f16 matmul on the {where}: relative error {err:.1e}")
    assert err < 1e-5
    print("OK")


if __name__ == "__main__":
    main()
