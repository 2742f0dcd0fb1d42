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


@kaio.gpu_kernel(block_size=256)
def fused_silu_gate_x4(x: f32[:], gate: f32[:], out: f32[:], n: u32):
    """The same, four elements a thread: one 16-byte load of x and of gate and one 16-byte
    store (the arrays 16-byte aligned, as kaio's and torch's allocations are), so each
    thread has four times the bytes in flight. Launch n / 1024 blocks, rounded up."""
    i = (kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()) * 4
    if i + 4 <= n:
        xv = kaio.local(f32, 4)
        gv = kaio.local(f32, 4)
        kaio.load_vector(xv, x, i)
        kaio.load_vector(gv, gate, i)
        for j in kaio.static_range(4):
            sig = 1.0 / (1.0 + kaio.exp(-xv[j]))
            xv[j] = xv[j] * sig * gv[j]
        kaio.store_vector(out, i, xv)
    else:
        for j in range(i, n):  # the last 1-3 elements when n is not a multiple of 4
            sig = 1.0 / (1.0 + kaio.exp(-x[j]))
            out[j] = x[j] * sig * gate[j]


def run(kernel, per_thread: int, x: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """out = kernel(x, gate) on the GPU when there is one, else on the CPU simulator."""
    n = len(x)
    grid = -(-n // (256 * per_thread))
    if kaio.gpu_available():
        out = kaio.empty(n, f32)
        kernel[grid](kaio.to_device(x), kaio.to_device(gate), out, n)
        return out.numpy()
    out = np.full(n, np.nan, np.float32)
    kernel.sim[grid](x, gate, out, n)
    return out


def main() -> None:
    print("PTX for sm_90 (first 25 lines):")
    print("\n".join(fused_silu_gate.ptx(arch="sm_90").splitlines()[:25]))
    print("...")

    if kaio.gpu_available():
        where, n = f"GPU ({kaio.device().name})", 1_000_003
    else:  # the simulator runs every thread on NumPy: keep the example quick
        where, n = "CPU simulator (no GPU found)", 4099
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    gate = rng.standard_normal(n, dtype=np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / (1.0 + np.exp(-x64)) * gate
    for kernel, per_thread in ((fused_silu_gate, 1), (fused_silu_gate_x4, 4)):
        result = run(kernel, per_thread, x, gate)
        err = np.abs(result - expected).max() / np.abs(expected).max()
        print(f"{kernel.__name__}: {n} elements on the {where}; max relative error {err:.2e}")
        assert err < 1e-5, "result does not match NumPy"
    print("OK")


if __name__ == "__main__":
    main()
