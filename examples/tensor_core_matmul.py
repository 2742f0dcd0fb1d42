"""A 64x64x64 f16 matmul on tensor cores, written in the kaio DSL: one block of 4 warps.

The three building blocks of every fast kaio op, in 40 lines:

1. ``kaio.cp_async`` copies the A and B tiles from global to shared memory, 16 bytes per
   thread per copy, without passing through registers; ``kaio.swizzle`` places each 16-byte
   chunk so that the reads below hit 8 different bank groups.
2. ``kaio.ldmatrix`` / ``kaio.ldmatrix_trans`` load 8x8 sub-matrices from shared memory
   straight into the register fragments the tensor cores expect.
3. ``kaio.mma_f16`` multiplies a 16x16 A fragment by a 16x8 B fragment into a 16x8 f32
   accumulator, per warp.

Each warp owns a 32x32 quarter of C: 2 x 4 tiles of 16x8. docs/tensor-cores.md draws which
thread holds which element. Runs on the GPU if there is one, else on the CPU simulator.
Run: python examples/tensor_core_matmul.py
"""

import numpy as np

import kaio
from kaio import f16, f32, u32

N = 64  # the matrices are N x N
THREADS = 128  # 4 warps, in a 2 x 2 grid of 32 x 32 warp tiles


@kaio.gpu_kernel(block_size=THREADS)
def matmul64(a: f16[:, :], b: f16[:, :], c: f32[:, :]):
    tid = kaio.thread_idx_x()
    lane = kaio.lane_id()
    warp = kaio.warp_id()
    wm = warp // 2 * 32  # this warp's first row and column of C
    wn = warp % 2 * 32

    # 1. global -> shared: 64 rows x 8 chunks of 16 bytes per matrix, 4 chunks per thread.
    a_s = kaio.shared(f16, (N, N))
    b_s = kaio.shared(f16, (N, N))
    for i in kaio.static_range(N * N // 8 // THREADS):
        chunk = tid + i * THREADS
        row = chunk // 8
        col = chunk % 8 * 8
        kaio.cp_async(a_s, (row, kaio.swizzle(a_s, row, col)), a, (row, col), 16)
        kaio.cp_async(b_s, (row, kaio.swizzle(b_s, row, col)), b, (row, col), 16)
    kaio.cp_async_wait_all()
    kaio.sync_threads()

    acc = kaio.local(f32, (2, 4, 4))  # [m tile, n tile, element]
    for mi in kaio.static_range(2):
        for ni in kaio.static_range(4):
            for e in kaio.static_range(4):
                acc[mi, ni, e] = 0.0
    a_frag = kaio.local(u32, (2, 4))  # two 16x16 A tiles
    b_frag = kaio.local(u32, (2, 2, 2))  # four 16x8 B tiles, loaded in pairs

    # 2 + 3. k in steps of 16: ldmatrix the fragments, then 2 x 4 mma per warp.
    for k in kaio.static_range(0, N, 16):
        for mi in kaio.static_range(2):
            row = wm + mi * 16 + lane % 16
            col = k + lane // 16 * 8
            kaio.ldmatrix(a_frag[mi], a_s, (row, kaio.swizzle(a_s, row, col)))
        for nj in kaio.static_range(2):
            row = k + lane % 16
            col = wn + nj * 16 + lane // 16 * 8
            kaio.ldmatrix_trans(b_frag[nj], b_s, (row, kaio.swizzle(b_s, row, col)))
        for mi in kaio.static_range(2):
            for ni in kaio.static_range(4):
                kaio.mma_f16(acc[mi, ni], a_frag[mi], b_frag[ni // 2, ni % 2], acc[mi, ni])

    # Accumulator element e of lane l: row l//4 + 8*(e//2), column 2*(l%4) + e%2.
    for mi in kaio.static_range(2):
        for ni in kaio.static_range(4):
            for e in kaio.static_range(4):
                row = wm + mi * 16 + lane // 4 + e // 2 * 8
                col = wn + ni * 8 + lane % 4 * 2 + e % 2
                c[row, col] = acc[mi, ni, e]


def main() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype(np.float16)
    b = rng.standard_normal((N, N)).astype(np.float16)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    ptx = matmul64.ptx(arch="sm_80")
    for instr in ("cp.async.cg", "ldmatrix.sync.aligned.m8n8.x4", "mma.sync.aligned.m16n8k16"):
        print(f"{instr:32s} x{ptx.count(instr)} in the PTX")

    if kaio.gpu_available():
        where = f"GPU ({kaio.device().name})"
        c = kaio.to_device(np.full((N, N), np.nan, np.float32))
        matmul64[1](kaio.to_device(a), kaio.to_device(b), c)
        result = c.numpy()
    else:
        where = "CPU simulator (no GPU found)"
        result = np.full((N, N), np.nan, np.float32)
        matmul64.sim[1](a, b, result)

    err = np.linalg.norm(result - expected) / np.linalg.norm(expected)
    print(f"64x64x64 f16 matmul on the {where}: relative error {err:.1e}")
    assert err < 1e-5, "result does not match NumPy"
    print("OK")


if __name__ == "__main__":
    main()
