"""``kaio info``: the driver, the GPUs, the launch call and the cache directory, as text."""

from __future__ import annotations

from kaio.errors import CudaError
from kaio.runtime.cache import cache_dir

__all__ = ["info"]


def info() -> str:
    """A readable report of the CUDA driver (version, PTX ISA it loads), each GPU (name, arch,
    memory, SMs), how launches call the driver and kaio's kernel cache directory. Never
    raises: a machine without a driver or GPU says so."""
    from kaio.runtime.device import Device, device_count
    from kaio.runtime.driver import driver_version, format_version, max_ptx_isa

    lines = []
    try:
        version = driver_version()
        top = max_ptx_isa(version)
        lines.append(
            f"CUDA driver: {format_version(version)} (loads PTX ISA up to {top[0]}.{top[1]})"
        )
        count = device_count()
        if count == 0:
            lines.append("GPUs: none")
        for i in range(count):
            dev = Device(i)
            gib = dev.total_memory / 2**30
            lines.append(
                f"GPU {i}: {dev.name}, {dev.arch}, {gib:.1f} GiB, {dev.multiprocessor_count} SMs"
            )
        from kaio.runtime import native
        from kaio.runtime.launcher import raw_launch_kernel

        raw_launch_kernel()
        lines.append(f"launches call cuLaunchKernelEx through: {native.status()}")
    except CudaError as e:
        lines.append(f"CUDA driver: not usable ({e})")
        lines.append("GPUs: none usable; kernels can still run on the CPU simulator (kernel.sim)")
    lines.append(f"kernel cache: {cache_dir()}")
    return "\n".join(lines)
