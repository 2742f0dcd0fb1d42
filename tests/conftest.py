"""Shared test setup: tests marked ``gpu`` run only where a CUDA driver and a GPU are usable."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when cuInit succeeds and at least one GPU is visible, else why not (never raises:
    machines without libcuda or cuda-bindings get a reason)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu
        except ImportError:
            return "cuda-bindings is not installed"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {err.name}"
        err, count = cu.cuDeviceGetCount()
    except Exception as e:  # libcuda missing: the bindings raise instead of returning a code
        return f"no NVIDIA driver: {e}"
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA GPU visible"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is not None:
        skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
        for item in gpu_items:
            item.add_marker(skip)
