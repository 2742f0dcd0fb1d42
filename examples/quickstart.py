"""kaio quick start: write a kernel in Python, read its PTX, run it and check the result.

Runs on the GPU when an NVIDIA driver and GPU are present, otherwise on kaio's CPU simulator
(same kernel, same semantics). Run: python examples/quickstart.py
"""

import numpy as np

import kaio
from kaio import f32, u32


@kaio.gpu_kernel(block_size=256)
def fused_silu_gate(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    idx = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if idx < n:
        xi = x[idx]
        sig = 1.0 / (1.0 + kaio.exp(-xi))
        out[idx] = xi * sig * gate[idx]


def main() -> None:
    n = 1_000_000
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    gate = rng.standard_normal(n, dtype=np.float32)
    grid = (n + 255) // 256

    print("PTX for sm_90 (first 25 lines):")
    print("\n".join(fused_silu_gate.ptx(arch="sm_90").splitlines()[:25]))
    print("...")

    if kaio.gpu_available():
        where = f"GPU ({kaio.device().name})"
        out = kaio.empty(n, f32)
        fused_silu_gate[grid](kaio.to_device(x), kaio.to_device(gate), out, n)
        result = out.numpy()
    else:
        where = "CPU simulator (no GPU found)"
        n = 4096  # the simulator runs every thread on NumPy: keep the example quick
        x, gate, grid = x[:n], gate[:n], (n + 255) // 256
        result = np.full(n, np.nan, np.float32)
        fused_silu_gate.sim[grid](x, gate, result, n)

    x64 = x.astype(np.float64)
    expected = x64 / (1.0 + np.exp(-x64)) * gate
    err = np.abs(result - expected).max() / np.abs(expected).max()
    print(f"ran {n} elements on the {where}; max relative error {err:.2e}")
    assert err < 1e-5, "result does not match NumPy"
    print("OK")


if __name__ == "__main__":
    main()
