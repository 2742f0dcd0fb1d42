"""The GPU's approximate math against kaio.sim.mufu, bit for bit, through kaio kernels (the
real compile and JIT path): ``PYTHONPATH=. python3 tools/mufu_verify.py [LOG2_N]``."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import kaio
from kaio import f32, u32
from kaio.sim import mufu

T0 = time.time()
SIM = bool(os.environ.get("MUFU_SIM"))  # a dry run: the simulator plays the GPU
SINCOS = os.path.join(mufu.DATA, "mufu_sincos.npz")


@kaio.gpu_kernel(block_size=256)
def precise(x: f32[:], y: f32[:], out: f32[:, :], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        v = x[i]
        out[0, i] = kaio.exp2(v)
        out[1, i] = kaio.log2(v)
        out[2, i] = kaio.rsqrt(v)
        out[3, i] = kaio.exp2_ftz(v)
        out[4, i] = kaio.rcp_ftz(v)
        out[5, i] = kaio.sin(v)
        out[6, i] = kaio.cos(v)


@kaio.gpu_kernel(block_size=256, fastmath=True)
def fast(x: f32[:], y: f32[:], out: f32[:, :], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        v = x[i]
        out[0, i] = kaio.exp2(v)
        out[1, i] = kaio.log2(v)
        out[2, i] = kaio.rsqrt(v)
        out[3, i] = v / y[i]
        out[4, i] = kaio.sin(v)
        out[5, i] = kaio.cos(v)


MODELS = {
    "precise": [
        ("ex2.approx.f32", lambda x, y: mufu.ex2(x, False)),
        ("lg2.approx.f32", lambda x, y: mufu.lg2(x, False)),
        ("rsqrt.approx.f32", lambda x, y: mufu.rsqrt(x, False)),
        ("ex2.approx.ftz.f32", lambda x, y: mufu.ex2(x)),
        ("rcp.approx.ftz.f32", lambda x, y: mufu.rcp(x)),
        ("sin.approx.f32", lambda x, y: mufu.sin(x)),
        ("cos.approx.f32", lambda x, y: mufu.cos(x)),
    ],
    "fast": [
        ("ex2.approx.ftz.f32", lambda x, y: mufu.ex2(x)),
        ("lg2.approx.ftz.f32", lambda x, y: mufu.lg2(x)),
        ("rsqrt.approx.ftz.f32", lambda x, y: mufu.rsqrt(x)),
        ("div.full.ftz.f32", lambda x, y: mufu.div_full_ftz(x, y)),
        ("sin.approx.ftz.f32", lambda x, y: mufu.sin(x)),
        ("cos.approx.ftz.f32", lambda x, y: mufu.cos(x)),
    ],
}


def inputs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random bit patterns, moderate magnitudes of both signs and the special values."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32)
    mid = (rng.choice([-1, 1], n // 2) * 2.0 ** rng.uniform(-40, 40, n // 2)).astype(np.float32)
    special = np.array(
        [
            0,
            0x80000000,
            1,
            0x807FFFFF,
            0x00800000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x7F7FFFFF,
            0x3F800000,
            0xBF800000,
            0x43000000,
            0xC3000000,
            0xC2FC0000,
            0x42FE0000,
        ],
        np.uint32,
    )
    x = np.concatenate([special, bits, mid.view(np.uint32)])[:n].view(np.float32)
    y = np.roll(x, 7)
    return x, y


def main() -> None:
    n = 1 << (int(sys.argv[1]) if len(sys.argv) > 1 else 22)
    x, y = inputs(n, 32)
    if not SIM:
        dx, dy = kaio.to_device(x), kaio.to_device(y)
    bad_total = 0
    rows = []
    for label, models in MODELS.items():
        kernel = {"precise": precise, "fast": fast}[label]
        if SIM:
            got = np.full((len(models), n), np.nan, np.float32)
            kernel.sim[((n + 255) // 256,)](x, y, got, n)
            got = got.view(np.uint32)
        else:
            out = kaio.to_device(np.full((len(models), n), np.nan, np.float32))
            kernel[((n + 255) // 256,)](dx, dy, out, n)
            got = out.numpy().view(np.uint32)
        for row, (name, model) in enumerate(models):
            if name.startswith(("sin", "cos")) and not os.path.exists(SINCOS):
                rows.append((name, label, -1))
                continue
            want = model(x, y).view(np.uint32)
            want = np.where(np.isnan(want.view(np.float32)), np.uint32(0x7FFFFFFF), want)
            bad = np.nonzero(got[row] != want)[0]
            bad_total += len(bad)
            rows.append((name, label, len(bad)))
            for i in bad[:5]:
                print(
                    f"  {name}: x={x[i]!r} ({x.view(np.uint32)[i]:#010x}) y={y[i]!r} "
                    f"gpu {got[row, i]:#010x} model {want[i]:#010x}"
                )
    where = "simulator" if SIM else kaio.Device(0).name
    print(f"{'instruction':22} {'kernel':8} mismatches of {n}  ({where})")
    for name, kern, bad in rows:
        print(f"{name:22} {kern:8} {bad if bad >= 0 else 'not modelled'}")
    print(f"total mismatches {bad_total}, {time.time() - T0:.1f}s")


if __name__ == "__main__":
    main()
