"""Thread-block clusters (sm_90): ``kaio.cluster_dims``, ``cluster_rank``, ``cluster_sync``
and ``cluster_load`` (distributed shared memory). Each is checked in the simulator against
values computed here from the launch geometry, its PTX assembles for sm_90 through both
backends, other targets and misuse are errors, and (marked gpu) the GPU gives the
simulator's bits."""

from __future__ import annotations

import numpy as np
import pytest

import kaio
from kaio import f32, f64, u32
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio.sim.engine import simulate
from tests.test_hopper import _hopper_gpu, needs_hopper  # noqa: F401  (the skipif reads _hopper_gpu)

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
CLUSTER = 4
THREADS = 64


@kaio.gpu_kernel
def ring(x: f32[:], big: f64[:], out: f32[:], ranks: u32[:], wide: f64[:]):
    """Block b of a cluster publishes x[b] * 2 and big[b] in shared memory; every thread
    reads the next block's (rank + 1 mod 4) and the one two ranks on, and adds its rank."""
    kaio.cluster_dims(CLUSTER)
    s = kaio.shared(f32, (THREADS,))
    d = kaio.shared(f64, (2,))
    t = kaio.thread_idx_x()
    b = kaio.block_idx_x()
    r = kaio.cluster_rank()
    s[t] = x[b] * 2.0 + f32(t)
    if t == 0:
        d[1] = big[b]
    kaio.cluster_sync()
    v = kaio.cluster_load(s, (THREADS - 1 - t,), (r + 1) % CLUSTER)
    w = kaio.cluster_load(d, 1, (r + 2) % CLUSTER)
    kaio.cluster_sync()
    out[b * THREADS + t] = v + f32(r)
    ranks[b * THREADS + t] = r
    wide[b * THREADS + t] = w


def ring_expected(x: np.ndarray, big: np.ndarray):
    """What ``ring`` writes, from the launch geometry alone."""
    blocks = len(x)
    b = np.repeat(np.arange(blocks), THREADS)
    t = np.tile(np.arange(THREADS), blocks)
    rank = b % CLUSTER
    first = b - rank
    nxt = first + (rank + 1) % CLUSTER
    out = (x[nxt] * np.float32(2) + (THREADS - 1 - t).astype(np.float32)) + rank.astype(np.float32)
    return out.astype(np.float32), rank.astype(np.uint32), big[first + (rank + 2) % CLUSTER]


def _ring_inputs(blocks: int):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(blocks).astype(np.float32)
    big = rng.standard_normal(blocks)
    n = blocks * THREADS
    return x, big, np.full(n, np.nan, np.float32), np.full(n, 99, np.uint32), np.full(n, np.nan)


def test_ring_in_the_simulator():
    x, big, out, ranks, wide = _ring_inputs(12)
    ring.sim[12, THREADS](x, big, out, ranks, wide)
    want_out, want_ranks, want_wide = ring_expected(x, big)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(ranks, want_ranks)
    np.testing.assert_array_equal(wide, want_wide)


def test_simulator_batches_hold_whole_clusters():
    """With room for 6 blocks a batch, batches take 4 (whole clusters), not 6."""
    x, big, out, ranks, wide = _ring_inputs(8)
    fn = ring.specialize({}).function
    arrays = dict(zip(fn.param_arrays, (x, big, out, ranks, wide), strict=True))
    simulate(fn, 8, THREADS, arrays, {}, batch_lanes=6 * THREADS)
    np.testing.assert_array_equal(out, ring_expected(x, big)[0])


def test_grid_not_a_multiple_of_the_cluster_is_refused():
    x, big, out, ranks, wide = _ring_inputs(6)
    with pytest.raises(kaio.LaunchError, match="clusters of 4 blocks.*multiple of 4"):
        ring.sim[6, THREADS](x, big, out, ranks, wide)


@kaio.gpu_kernel
def far_rank(out: f32[:]):
    kaio.cluster_dims(2)
    s = kaio.shared(f32, (1,))
    if kaio.thread_idx_x() == 0:
        s[0] = 1.0
    kaio.cluster_sync()
    out[kaio.thread_idx_x()] = kaio.cluster_load(s, 0, kaio.cluster_rank() + 1)
    kaio.cluster_sync()


@kaio.gpu_kernel
def divergent_cluster_sync(out: f32[:]):
    kaio.cluster_dims(2)
    if kaio.block_idx_x() == 0:
        kaio.cluster_sync()
    out[0] = 1.0


@kaio.gpu_kernel
def unsynced_read(out: f32[:]):
    """Block 1 writes its element after the barrier, while block 0 reads it: a race."""
    kaio.cluster_dims(2)
    s = kaio.shared(f32, (1,))
    if kaio.thread_idx_x() == 0:
        s[0] = 1.0
    kaio.cluster_sync()
    if kaio.cluster_rank() == 0 and kaio.thread_idx_x() == 0:
        out[0] = kaio.cluster_load(s, 0, 1)
    if kaio.cluster_rank() == 1 and kaio.thread_idx_x() == 0:
        s[0] = 2.0


def test_simulator_reports_misuse():
    with pytest.raises(
        kaio.SimulationError, match=r"race on 's_smem0'\[0\] of block \(1, 0, 0\)"
    ) as e:
        unsynced_read.sim[2, 32](np.zeros(1, np.float32))
    assert "thread (0, 0, 0) of block (0, 0, 0) read it" in str(e.value)
    assert "kaio.cluster_sync()" in str(e.value)
    with pytest.raises(kaio.SimulationError, match=r"block rank 2 in a cluster of 2"):
        far_rank.sim[2, 32](np.zeros(32, np.float32))
    with pytest.raises(kaio.SimulationError, match=r"cluster_sync\(\) \(cluster barrier\) in"):
        divergent_cluster_sync.sim[2, 32](np.zeros(1, np.float32))


def test_builtin_errors():
    def bad_size(out: f32[:]):
        kaio.cluster_dims(32)

    def bad_type(out: f32[:]):
        s = kaio.shared(kaio.f16, (2,))
        out[0] = f32(kaio.cluster_load(s, 0, 1))

    def not_shared(out: f32[:]):
        out[0] = kaio.cluster_load(out, 0, 1)

    for fn, match in (
        (bad_size, r"cluster_dims\(n\) must be a compile-time int in 1..16"),
        (bad_type, r"cluster_load\(\) reads 32- or 64-bit elements"),
        (not_shared, r"cluster_load\(\) needs a shared array"),
    ):
        with pytest.raises(kaio.CompileError, match=match):
            kaio.gpu_kernel(fn).ptx(arch="sm_90")


def test_other_targets_are_compile_errors():
    with pytest.raises(kaio.CompileError, match=r"cluster_dims\(\) needs sm_90 or newer.*sm_80"):
        ring.ptx(arch="sm_80")


@needs_ptxas
def test_ptx_assembles_for_sm_90():
    ptx = ring.ptx(arch="sm_90")
    for text in (".reqnctapercluster 4", "%cluster_ctarank", "barrier.cluster.wait", "mapa"):
        assert text in ptx
    assert ".target sm_90\n" in ptx and "ld.shared::cluster.f64" in ptx
    assemble(ptx, "sm_90")


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@needs_hopper
def test_gpu_ring_matches_simulator():
    for backend in ("ptx", "llvm"):
        if backend == "llvm":
            pytest.importorskip("llvmlite")
        x, big, out, ranks, wide = _ring_inputs(16)
        ring.sim[16, THREADS](x, big, out, ranks, wide)
        d = [kaio.to_device(a) for a in _ring_inputs(16)[2:]]
        kernel = kaio.gpu_kernel(ring.pyfunc, backend=backend)
        kernel[16, THREADS](kaio.to_device(x), kaio.to_device(big), *d)
        for got, want in zip(d, (out, ranks, wide), strict=True):
            np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.gpu
@needs_hopper
def test_gpu_grid_not_a_multiple_of_the_cluster_is_refused():
    x, big, out, ranks, wide = (kaio.to_device(a) for a in _ring_inputs(6))
    with pytest.raises(kaio.LaunchError, match="clusters of 4 blocks"):
        ring[6, THREADS](x, big, out, ranks, wide)


@kaio.gpu_kernel
def single_blocks(out: f32[:]):
    """A kernel without clusters."""
    out[kaio.thread_idx_x()] = 1.0


@pytest.mark.gpu
@needs_hopper
def test_gpu_max_active_clusters_is_a_grid_that_runs_at_once():
    """The driver's count of clusters that fit: more threads or shared memory a block fit
    fewer (never more), and a grid of that many clusters all run at the same time (every
    block waits at a cluster barrier, so the launch finishes)."""
    dev = kaio.device()
    small = ring.max_active_clusters(THREADS)
    assert 0 < small * CLUSTER <= dev.multiprocessor_count * 32
    big_shared = ring.max_active_clusters(THREADS, 100 * 1024)
    assert 0 < big_shared < small
    assert big_shared * CLUSTER <= dev.multiprocessor_count * 2  # 2 blocks of 100 KB an SM
    blocks = small * CLUSTER
    x, big, out, ranks, wide = _ring_inputs(blocks)
    d = [kaio.to_device(a) for a in (out, ranks, wide)]
    ring[blocks, THREADS](kaio.to_device(x), kaio.to_device(big), *d)
    np.testing.assert_array_equal(d[0].numpy(), ring_expected(x, big)[0])
    with pytest.raises(kaio.LaunchError, match="kernels with kaio.cluster_dims"):
        single_blocks.max_active_clusters(32)
