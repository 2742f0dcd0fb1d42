"""Matmul tile numbering at the largest shapes the ops accept (issue 30.3): the tile
``tile_origin`` gives block ``pid`` was packed as ``row * 65536 + column`` in u32, so a tile
row or column index past 65535 took another block's tile (M = 8,388,736 with N = 8: block
65536 computed tile (0, 0)). The helper runs here as a small kernel in the simulator on the
boundary blocks, against a Python reference of the grouped order."""

from __future__ import annotations

import numpy as np
import pytest

import kaio
from kaio import u32
from kaio_ops._arrays import MAX_ELEMENTS
from kaio_ops._matmul_kernels import GROUP_M, tile_col, tile_origin, tile_row
from kaio_ops.matmul import CONFIGS


@kaio.gpu_kernel(block_size=32)
def origins(pids: u32[:], rows: u32[:], cols: u32[:], grid_m: u32, grid_n: u32, n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 32
    if i < n:
        origin = tile_origin(pids[i], grid_m, grid_n)
        rows[i] = tile_row(origin)
        cols[i] = tile_col(origin)


def reference(pid: int, grid_m: int, grid_n: int) -> tuple[int, int]:
    """The grouped tile order: GROUP_M tile rows at a time, down the columns."""
    width = GROUP_M * grid_n
    first_m = pid // width * GROUP_M
    group_m = min(grid_m - first_m, GROUP_M)
    return first_m + pid % width % group_m, pid % width // group_m


def boundary_pids(grid_m: int, grid_n: int) -> list[int]:
    """The first and last blocks, and those around each multiple of 65536 and each group."""
    tiles = grid_m * grid_n
    pids = {0, 1, tiles - 2, tiles - 1}
    for edge in (65535, 65536, 65537, GROUP_M * grid_n, tiles - GROUP_M * grid_n):
        for step in (1, grid_n, GROUP_M * grid_n):
            for p in (edge - 1, edge, edge + 1, edge * step // grid_n if grid_n else 0):
                pids.add(p)
    pids |= {p * 65536 + d for p in range(1, tiles // 65536 + 1) for d in (-1, 0, 1)}
    return sorted(p for p in pids if 0 <= p < tiles)[:2048]


def largest_grids() -> list[tuple[int, int, str]]:
    """(grid_m, grid_n) of the largest C the input checks accept, tall and wide, for the
    smallest tiles (the most tiles), and the issue's two shapes."""
    grids = []
    for name in ("64x64", "16x128", "128x256"):
        cfg = CONFIGS[name]
        grids.append((-(-MAX_ELEMENTS // 8 // cfg.bm), 1, f"{name} tall"))  # M x 8
        grids.append((1, -(-MAX_ELEMENTS // cfg.bn), f"{name} wide"))  # 1 x N
    grids.append((-(-8_388_736 // 128), 1, "M=8388736 N=8, 128x256"))
    grids.append((1, -(-16_777_472 // 64), "N=16777472, 64x64"))
    grids.append((70001, 70001 // 7, "both indices past 65535, beyond the ops limits"))
    return grids


@pytest.mark.parametrize("grid_m, grid_n, what", largest_grids(), ids=lambda x: str(x))
def test_tile_origin_at_the_largest_grids(grid_m, grid_n, what):
    pids = np.array(boundary_pids(grid_m, grid_n), np.uint32)
    rows = np.full(pids.size, 0xDEADBEEF, np.uint32)
    cols = np.full(pids.size, 0xDEADBEEF, np.uint32)
    origins.sim[-(-pids.size // 32), 32](pids, rows, cols, grid_m, grid_n, pids.size)
    want = [reference(int(p), grid_m, grid_n) for p in pids]
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == want, what
    assert all(r < grid_m and c < grid_n for r, c in want)


def test_tile_origin_is_a_bijection_on_small_grids():
    """Every tile exactly once, for grids with partial groups."""
    for grid_m, grid_n in ((1, 1), (9, 3), (17, 5), (8, 8)):
        pids = np.arange(grid_m * grid_n, dtype=np.uint32)
        rows = np.zeros(pids.size, np.uint32)
        cols = np.zeros(pids.size, np.uint32)
        origins.sim[-(-pids.size // 32), 32](pids, rows, cols, grid_m, grid_n, pids.size)
        assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [
            (r, c) for r in range(grid_m) for c in range(grid_n)
        ]
