"""Random valid kernels (tests/kernelgen.py): the simulator agrees with itself on unoptimized IR,
both backends' PTX assembles, and (marked gpu) the GPU agrees with the simulator bit for bit.

CPU: ``KAIO_FUZZ_KERNELS`` kernels (default 3, a few seconds); ``KAIO_FUZZ_KERNELS=500`` for a
long run. GPU: kernels from seed ``KAIO_GPU_FUZZ_SEED`` (default 29) on until
``KAIO_GPU_FUZZ_SECONDS`` (default 60) have passed; the test prints how many it ran
(run with ``-s``)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import kaio
from tests import kernelgen

KERNELS = int(os.environ.get("KAIO_FUZZ_KERNELS", 3))
GPU_SECONDS = float(os.environ.get("KAIO_GPU_FUZZ_SECONDS", 60))
GPU_SEED = int(os.environ.get("KAIO_GPU_FUZZ_SEED", 29))


def _simulated(seed: int):
    """The kernel of ``seed``, its inputs, and its outputs from the simulator."""
    source, block, ni, nf = kernelgen.generate(seed)
    kernel = kernelgen.load(source, f"kernelgen_{seed}")
    args = kernelgen.inputs(seed, block, ni, nf)
    kernel.sim[kernelgen.GRID](*args)
    return kernel, source, block, (ni, nf), args


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint64), b.view(np.uint64))


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    i = int(np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))[0])
    return f"element {i}: {got[i]!r} vs {want[i]!r}"


@pytest.mark.parametrize("seed", range(KERNELS))
def test_random_kernel_simulates_compiles_and_passes_agree(seed):
    kernel, source, block, (ni, nf), args = _simulated(seed)
    unoptimized = kernelgen.inputs(seed, block, ni, nf)
    kernelgen.simulate_unoptimized(kernel, block, unoptimized)
    for name, got, want in zip(("oi", "of"), args[3:], unoptimized[3:], strict=True):
        assert _same_bits(got, want), (
            f"seed {seed}: {name} differs between the optimized and the unoptimized IR, "
            f"{_first_difference(got, want)}\n{source}"
        )
    assert not np.any(args[3] == 0xDEADBEEFDEADBEEF) or ni == 0, "an output was not written"
    kernelgen.check_compiles(kernel)


def test_generated_kernels_use_the_constructs_they_should():
    """The generator is not degenerate: over a few seeds it writes loops, break/continue,
    calls of a device function with an early return,
    if/else with variables assigned in both branches, shuffles, barriers, mixed widths."""
    text = "\n".join(kernelgen.generate(s)[0] for s in range(20))
    for construct in (
        "for ",
        "break",
        "continue",
        "else:",
        "    w",
        "shfl_",
        "sync_threads",
        "u8(",
        "i64(",
        "//",
        "<<",
        "kaio.fma",
        "/ ",
        "(helper(",
    ):
        assert construct in text, construct


@pytest.mark.gpu
def test_random_kernels_gpu_matches_simulator():
    start = time.monotonic()
    ran = 0
    seed = GPU_SEED * 100_000
    while time.monotonic() - start < GPU_SECONDS:
        kernel, source, block, (ni, nf), expected = _simulated(seed)
        host = kernelgen.inputs(seed, block, ni, nf)
        device = [kaio.to_device(a) for a in host]
        kernel[kernelgen.GRID](*device)
        for name, d, want in zip(("oi", "of"), device[3:], expected[3:], strict=True):
            got = d.numpy()
            assert _same_bits(got, want), (
                f"seed {seed}: {name} differs between the GPU and the simulator, "
                f"{_first_difference(got, want)}\n{source}"
            )
        ran += 1
        seed += 1
    print(f"\nkernelgen: {ran} random kernels agreed bit for bit on the GPU and the simulator")
    assert ran > 0
