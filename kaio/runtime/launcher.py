"""The fast launch path: one generated Python function per argument signature.

Each launcher owns one ctypes parameter buffer laid out like the kernel's parameters (each
entry at its natural alignment), packed in place by one ``struct.pack_into`` and handed to
libcuda's ``cuLaunchKernel`` through ``CU_LAUNCH_PARAM_BUFFER_POINTER`` (as tinygrad does). A
launcher first checks, cheaply, that the arguments still have the signature it was built for
(Python type, then interned dtype/rank/layout/device of each array, constexpr values) and returns
False when they do not, so that the caller can take the slow path, which validates everything
and builds the right launcher.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable

import ml_dtypes
import numpy as np

from kaio.errors import LaunchError
from kaio.runtime.arguments import describe
from kaio.runtime.device import Device, current
from kaio.runtime.driver import cuda_error, last_launched, libcuda
from kaio.runtime.memory import DeviceArray
from kaio.types import ArrayType

__all__ = ["param_format", "build_launcher", "validate_config"]

_CODES = {
    "i8": "b",
    "u8": "B",
    "i16": "h",
    "u16": "H",
    "i32": "i",
    "u32": "I",
    "i64": "q",
    "u64": "Q",
    "f16": "e",
    "bf16": "H",
    "f32": "f",
    "f64": "d",
    "bool_": "?",
}
_CUDA_ERROR_INVALID_CONTEXT = 201


def param_format(params) -> tuple[str, int]:
    """The ``struct`` format of the parameter buffer (``=`` sizes, explicit padding so every
    entry sits at its natural alignment) and its size in bytes: exactly the end of the last
    entry, with no tail padding, since the driver checks it against the kernel's own size."""
    fmt, offset = "=", 0
    for p in params:
        code = _CODES[p.value.type.name]
        size = struct.calcsize("=" + code)
        pad = -offset % size
        fmt += "x" * pad + code
        offset += pad + size
    return fmt, offset


def bf16_bits(value) -> int:
    """The 16-bit pattern of ``value`` rounded to bfloat16."""
    return int(np.array(value, ml_dtypes.bfloat16).view(np.uint16))


def _describe_quiet(obj):
    try:
        return describe(obj)
    except LaunchError:
        return None


def validate_config(grid: tuple, block: tuple, shared: int, loaded, declared_block) -> None:
    """Refuse a grid, block or dynamic shared size the device or kernel cannot take; opt in
    to more than 48 KB of dynamic shared memory when asked."""
    dev: Device = loaded.device
    name = loaded.name
    threads = block[0] * block[1] * block[2]
    for axis, n, top in zip("xyz", block, dev.max_block_dim, strict=True):
        if n > top:
            raise LaunchError(f"{name}: block {block} has {n} threads in {axis}; the max is {top}")
    if threads > dev.max_threads_per_block:
        raise LaunchError(
            f"{name}: block {block} has {threads} threads; {dev.name} allows "
            f"{dev.max_threads_per_block} per block"
        )
    for axis, n, top in zip("xyz", grid, dev.max_grid_dim, strict=True):
        if n > top:
            raise LaunchError(f"{name}: grid {grid} has {n} blocks in {axis}; the max is {top}")
    origin = f" (@kaio.gpu_kernel(block_size={declared_block}))" if declared_block else ""
    if loaded.reqntid is not None and tuple(block) != loaded.reqntid:
        raise LaunchError(
            f"{name}: compiled for blocks of exactly {loaded.reqntid}{origin}, launched with "
            f"{block}: launch with that block, or change block_size"
        )
    if loaded.maxntid is not None and threads > loaded.maxntid:
        raise LaunchError(
            f"{name}: compiled for at most {loaded.maxntid} threads per block{origin}, "
            f"launched with {block} ({threads} threads)"
        )
    fits = loaded.attribute("MAX_THREADS_PER_BLOCK")
    if threads > fits:
        raise LaunchError(
            f"{name}: block of {threads} threads, but with {loaded.attribute('NUM_REGS')} "
            f"registers per thread at most {fits} fit on {dev.arch}: use a smaller block"
        )
    loaded.allow_dynamic_shared(shared)


def _expressions(kernel, spec) -> list[str]:
    """The pack_into argument expressions, checked against the documented launch ABI."""
    by_source: dict[str, list] = {}
    for p in spec.function.params:
        by_source.setdefault(p.source, []).append(p)
    exprs: list[str] = []
    array_index = 0
    position = {name: i for i, name in enumerate(kernel.param_names)}
    for name, annotation in kernel.runtime_params():
        entries = by_source.get(name, [])
        k = position[name]
        if isinstance(annotation, ArrayType):
            layout = spec.layouts[array_index]
            array_index += 1
            n = annotation.ndim
            expected = ["ptr"] + ["shape"] * n + (["stride"] * n if layout == "A" else [])
            if [p.role for p in entries] != expected:
                raise LaunchError(
                    f"{kernel.__name__}: internal error: parameter {name!r} has launch entries "
                    f"{[p.role for p in entries]}, expected {expected}"
                )
            exprs.append(f"*i{k}.abi_{'c' if layout == 'C' else 'a'}")
        elif entries:
            scalar = entries[0].value.type.name
            exprs.append(f"bf16_bits(a{k})" if scalar == "bf16" else f"a{k}")
    return exprs


_LAUNCH_PROTOTYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    *[ctypes.c_uint] * 7,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
)
_raw_launch = None


def raw_launch_kernel():
    """libcuda's ``cuLaunchKernel`` called with plain Python ints (pointers as ints): about
    2 µs cheaper per call than ctypes' ``argtypes`` conversions (measured on an H200)."""
    global _raw_launch
    if _raw_launch is None:
        _raw_launch = _LAUNCH_PROTOTYPE(("cuLaunchKernel", libcuda()))
    return _raw_launch


def build_launcher(kernel, spec, loaded, args: tuple, infos: dict) -> Callable:
    """A launcher ``(args, grid, block, shared, stream) -> bool`` for arguments shaped like
    ``args`` (all parameters, in order); ``infos`` maps array positions to their ``ArgInfo``."""
    fmt, size = param_format(spec.function.params)
    buf = (ctypes.c_uint8 * max(size, 8))()
    buf_size = ctypes.c_size_t(size)
    extra_array = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(buf_size), 0)
    extra = ctypes.addressof(extra_array)
    env = {
        "pack": struct.Struct(fmt).pack_into,
        "buf": buf,
        "extra": extra,
        "keep": (buf_size, extra_array),
        "launch_kernel": raw_launch_kernel(),
        "func": loaded.handle,
        "current": current,
        "DeviceArray": DeviceArray,
        "describe": _describe_quiet,
        "bf16_bits": bf16_bits,
        "last": last_launched,
        "checked": set(),
        "NAME": loaded.name,
        "DEV": loaded.device.ordinal,
    }
    declared = kernel.block_size

    def admit(grid, block, shared):
        validate_config(grid, block, shared, loaded, declared)
        env["checked"].add((grid, block, shared))

    def fail(rc, stream):
        raise cuda_error(rc, f"launching {loaded.name}", stream)

    def recover():
        Device(loaded.device.ordinal).set_current()

    env.update(admit=admit, fail=fail, recover=recover)
    names = [f"a{i}" for i in range(len(args))]
    lines = [f"if len(args) != {len(args)} or current.ordinal != DEV:", "    return False"]
    if names:
        lines.append(f"{', '.join(names)}, = args")
    for k, info in infos.items():
        env[f"S{k}"] = info.sig
        if type(args[k]) is DeviceArray:
            lines += [
                f"if type(a{k}) is not DeviceArray:",
                "    return False",
                f"i{k} = a{k}._info",
            ]
        else:
            env[f"T{k}"] = type(args[k])
            lines += [f"if type(a{k}) is not T{k}:", "    return False", f"i{k} = describe(a{k})"]
        lines += [f"if i{k} is None or i{k}.sig is not S{k}:", "    return False"]
    for k, name in enumerate(kernel.param_names):
        if name in kernel.constexpr_names:
            env[f"C{k}"] = args[k]
            lines += [f"if a{k} != C{k}:", "    return False"]
    call = (
        "launch_kernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], "
        "shared, stream, None, extra)"
    )
    lines += [
        "if (grid, block, shared) not in checked:",
        "    admit(grid, block, shared)",
        "try:",
        f"    pack(buf, 0, {', '.join(_expressions(kernel, spec))})",
        "except (struct_error, TypeError, OverflowError, ValueError):",
        "    return False",
        f"rc = {call}",
        f"if rc == {_CUDA_ERROR_INVALID_CONTEXT}:",
        "    recover()",
        f"    rc = {call}",
        "if rc:",
        "    fail(rc, stream)",
        "last[stream] = NAME",
        "return True",
    ]
    env["struct_error"] = struct.error
    source = "def launch(args, grid, block, shared, stream):\n" + "".join(
        f"    {line}\n" for line in lines
    )
    exec(compile(source, f"<kaio launcher {loaded.name}>", "exec"), env)
    launch = env["launch"]
    launch.source = source
    return launch
