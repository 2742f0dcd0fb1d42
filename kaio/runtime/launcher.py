"""The fast launch path: generated Python, one launcher per argument signature, bound once to
each launch configuration.

A *signature* is what a launch must know about its arguments to pick a compiled kernel and trust
the packing: each argument's Python type; each array's dtype, rank, layout ('C' contiguous or
'A' strided) and device; the constexpr values. The first launch with a new signature takes the
slow path (``launch.py``), which validates everything and calls ``build_launcher``. That returns
``bind(grid, block, shared, stream)``; a ``Launch`` (``kernel[grid, block, ...]``) binds each
launcher once and then calls ``launch(args) -> bool``, which returns False, having launched
nothing, when ``args`` do not have its signature (the caller then tries the next launcher, and
last the slow path, which raises ``LaunchError`` for wrong arguments). Per launch it:

- checks each array through its own cheap attributes against values cached when the launcher
  was built: a ``DeviceArray``'s interned signature; a ``RawArray``'s dtype (by identity),
  device and rank; a torch tensor's ``dtype`` (by identity),
  ``get_device()``, rank and ``is_contiguous()``; a contiguous CuPy array's ``dtype.char``,
  ``ndim``, ``flags.c_contiguous`` and ``data.device_id``. Other CUDA arrays (any
  ``__cuda_array_interface__`` or DLPack producer, strided CuPy arrays) are described in full;
- writes all kernel parameters with one ``struct.pack_into`` into a preallocated ctypes
  buffer: a ``DeviceArray``'s pointer and shape (and strides) as the bytes its ``ArgInfo``
  packed when it was made, a tensor map's 128 encoded bytes, other values one by one (a scalar
  out of its type's range fails here, and the slow path explains it);
- calls libcuda's ``cuLaunchKernelEx`` (``raw_launch_kernel``: a builtin made by
  ``kaio.runtime.native`` where it can be, else ctypes with no ``argtypes``, whose
  per-argument ``from_param`` conversions would cost more than the rest of the launch) with
  four arguments made once per binding: a ``CUlaunchConfig`` struct (grid, block, shared
  bytes, stream), the function, the ``kernelParams`` array of pointers to each parameter
  inside the buffer, and NULL ``extra``; the first three as ``byref`` objects (the function
  handle's through ``pointer_argument``), which both calls pass as they are, where a
  ``c_void_p`` or an array argument makes a new argument object on each ctypes call. On an
  H200 host this call
  cost 0.1 to 0.4 µs less than ``cuLaunchKernel`` with its eleven arguments, and
  ``kernelParams`` no more than handing the whole buffer over as ``extra``
  (``CU_LAUNCH_PARAM_BUFFER_POINTER``; bench/launch_overhead.py, docs/performance.md).
  ``extra`` is not used because the driver copies that buffer verbatim: a TMA tensor map (a
  ``.param .align 64`` parameter) then lands where the kernel does not expect it, and the
  TMA load faults with an illegal instruction (seen on an H200), while ``kernelParams`` lets
  the driver lay the parameters out itself.

A launcher belongs to one GPU, the one its signature's arrays are on. When that is not the
current device, the launch makes the GPU's primary context current for the driver call and the
thread's own context current again after (``launcher_elsewhere``: three more ctypes calls,
one when that context is already the thread's, as torch makes it in a process per GPU); a
kernel without arrays launches only on the current device.

Each launch takes a parameter buffer off the launcher's free list and puts it back after the
driver call, so threads launching the same signature at once never overwrite each other's
parameters; a thread that finds the list empty makes another buffer. The driver call keeps the
GIL (a ``PYFUNCTYPE`` prototype). The grid and block are validated against the device and the
kernel once per binding.
When every array is a ``DeviceArray`` (and no argument is a tensor map), a parameter buffer
also remembers the arguments it was last packed for (each array's ``ArgInfo``, which fixes its
address, shape and strides, by identity; an integer parameter by value; a float, a constexpr by
identity), and a launch whose arguments are those skips the checks and the packing: the
launch is the free list's pop, those comparisons, the driver call and the push
(``reuse_lines``; ``KAIO_REUSE_PACKED=0`` turns it off). Such a launcher has two buffers,
taken in turn, so that launches whose arguments take turns (x -> y, then y -> x) each find
the buffer packed for theirs. Torch tensors are read on every launch: the same tensor
object can point elsewhere or change shape (``x.data = y``, ``set_``, ``resize_``, in-place
view ops, its storage's ``resize_``; ``.data =`` and the storage's resize leave ``_version``
alone), and a remembered tensor would keep its memory.
The bound ``launch`` also has ``make_direct(fallback)``: the same launch as a function of the
arguments themselves (``direct(a0, a1, ...)``, what ``kernel[config]`` hands out once a
launcher is bound: one parameter per kernel parameter, so no tuple is made and unpacked per
call), which passes keywords, a missing or an extra argument, simulated launches, recorded
ones and arguments of another signature to ``fallback`` (the ``Launch``'s own function). A
launcher that reuses its parameters, and one of torch tensors tested by a guard, hands out
a native front of ``direct`` instead (``front_setup``), on any GPU: a launch like the last
one made again from C (for torch tensors: the guard's check and each tensor's address read
from C too), every other call to ``direct``.
A kernel compiled in debug mode also passes its error record's address as the last parameter
and, after each launch, synchronizes the stream and raises ``kaio.OutOfBoundsError`` when a
thread failed a bounds check (``kaio.runtime.debug``).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import re
import struct
from collections.abc import Callable

import ml_dtypes
import numpy as np

from kaio.errors import CudaError, LaunchError
from kaio.kernel import constexpr_value_key, same_constexpr
from kaio.runtime import native
from kaio.runtime.arginfo import ArgInfo, RawArray
from kaio.runtime.arguments import describe, is_cupy, is_torch, tensor_check
from kaio.runtime.device import Device, current, moved, visiting
from kaio.runtime.driver import cuda_error, last_launched_slot, libcuda
from kaio.runtime.memory import DeviceArray
from kaio.tensormap import TensorMap
from kaio.types import ArrayType

__all__ = ["param_format", "launch_abi", "build_launcher", "validate_config"]

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
_CUDA_ERROR_INVALID_HANDLE = 400


def param_format(params) -> tuple[str, int]:
    """The ``struct`` format of the parameter buffer (``=`` sizes, explicit padding so every
    entry sits at its natural alignment) and its size in bytes: exactly the end of the last
    entry, with no tail padding, since the driver checks it against the kernel's own size."""
    fmt, offset = "=", 0
    for p in params:
        if p.role == "tensormap":  # 128 bytes by value, 64-byte aligned
            code, size, align = "128s", 128, 64
        else:
            code = _CODES[p.value.type.name]
            size = align = struct.calcsize("=" + code)
        pad = -offset % align
        fmt += "x" * pad + code
        offset += pad + size
    return fmt, offset


def entry_offsets(fmt: str) -> list[int]:
    """The byte offset of each entry of a ``param_format`` format (pad bytes skipped)."""
    offsets, at = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt):
        size = struct.calcsize(f"={count}{code}")
        if code != "x":
            offsets.append(at)
        at += size
    return offsets


def merge_entries(fmt: str, runs: dict[int, int]) -> str:
    """``fmt`` (a ``param_format``) with each run of ``runs[i]`` entries from entry ``i`` on
    (an array's pointer, shape and strides: 8-byte entries with no padding between them) made
    one bytes entry, ``"{8 * runs[i]}s"``, which a launch fills from ``ArgInfo.abi_c`` or
    ``abi_a`` in one copy."""
    out, entry, skip = "=", 0, 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt):
        if code == "x":
            if skip:
                raise ValueError(f"padding inside a merged run of entries in {fmt!r}")
            out += count + code
            continue
        if skip:
            skip -= 1
        elif entry in runs:
            out += f"{8 * runs[entry]}s"
            skip = runs[entry] - 1
        else:
            out += count + code
        entry += 1
    return out


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
            raise LaunchError(
                f"{name}: block {block} has {n} threads in {axis}; {dev.name} allows at most {top}"
            )
    if threads > dev.max_threads_per_block:
        raise LaunchError(
            f"{name}: block {block} has {threads} threads; {dev.name} allows "
            f"{dev.max_threads_per_block} per block"
        )
    for axis, n, top in zip("xyz", grid, dev.max_grid_dim, strict=True):
        if n > top:
            raise LaunchError(
                f"{name}: grid {grid} has {n} blocks in {axis}; {dev.name} allows at most {top} "
                f"(max grid {tuple(dev.max_grid_dim)}): put more work in each block, or move "
                "blocks to another axis"
            )
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
    if loaded.cluster and grid[0] % loaded.cluster:
        raise LaunchError(
            f"{name}: runs in clusters of {loaded.cluster} blocks (kaio.cluster_dims), launched "
            f"with {grid[0]} blocks along x: use a multiple of {loaded.cluster}"
        )
    fits = loaded.attribute("MAX_THREADS_PER_BLOCK")
    if threads > fits:
        regs = loaded.attribute("NUM_REGS")
        raise LaunchError(
            f"{name}: block {block} has {threads} threads, but the kernel uses {regs} registers "
            f"per thread ({regs * threads} for the block), so at most {fits} threads per block "
            f"fit on {dev.name} ({dev.arch}): use a smaller block, or kaio.launch_bounds() to "
            "make the compiler use fewer registers"
        )
    loaded.allow_dynamic_shared(shared)


def launch_abi(kernel, layouts: tuple, params: list) -> list[tuple[int, str]]:
    """``(argument position, kind)`` of each runtime parameter with launch entries (``params``:
    the compiled kernel's, for array ``layouts``), in order:
    the layout ('C' or 'A') for arrays, checked against the documented launch ABI (pointer,
    shape, and for 'A' the strides), ``"tensormap"`` for tensor maps, else the scalar type's
    name."""
    by_source: dict[str, list] = {}
    for p in params:
        by_source.setdefault(p.source, []).append(p)
    abi: list[tuple[int, str]] = []
    array_index = 0
    position = {name: i for i, name in enumerate(kernel.param_names)}
    for name, annotation in kernel.runtime_params():
        entries = by_source.get(name, [])
        k = position[name]
        if isinstance(annotation, ArrayType):
            layout = layouts[array_index]
            array_index += 1
            n = annotation.ndim
            expected = ["ptr"] + ["shape"] * n + (["stride"] * n if layout == "A" else [])
            if [p.role for p in entries] != expected:
                raise LaunchError(
                    f"{kernel.__name__}: internal error: parameter {name!r} has launch entries "
                    f"{[p.role for p in entries]}, expected {expected}"
                )
            abi.append((k, layout))
        elif entries and entries[0].role == "tensormap":
            abi.append((k, "tensormap"))
        elif entries:
            abi.append((k, entries[0].value.type.name))
    return abi


def array_code(k: int, arg, info: ArgInfo, layout: str, env: dict) -> tuple[str, str, bool]:
    """For array argument ``k`` (built from ``arg``, described by ``info``): the condition
    under which a later argument does NOT have this signature, its pack_into entries, and
    whether those are the ``ArgInfo``'s pre-packed bytes (one bytes entry) rather than one
    value per parameter. Stores the values the condition compares with in ``env``."""
    a, ndim = f"a{k}", len(info.shape)
    env[f"T{k}"] = type(arg)
    if type(arg) is DeviceArray:
        env[f"S{k}"] = info.sig
        return (
            f"type({a}) is not T{k} or (i{k} := {a}._info).sig is not S{k}",
            f"i{k}.abi_{layout.lower()}",
            True,
        )
    # the shape's entries one by one (the condition checked the rank): a call without a
    # starred argument costs less
    dims = "".join(f", s{k}[{d}]" for d in range(ndim))
    if type(arg) is RawArray:  # contiguous by definition
        env[f"D{k}"] = info.dtype
        return (
            f"type({a}) is not T{k} or {a}.dtype is not D{k} or {a}.device != DEV or "
            f"len(s{k} := {a}.shape) != {ndim}",
            f"{a}.ptr{dims}",
            False,
        )
    if is_torch(arg):
        env[f"D{k}"] = arg.dtype
        strided = layout == "A"
        return (
            f"type({a}) is not T{k} or {a}.dtype is not D{k} or {a}.get_device() != DEV or "
            f"len(s{k} := {a}.shape) != {ndim} or {'' if strided else 'not '}{a}.is_contiguous()",
            f"{a}.data_ptr(){dims}" + (f", *{a}.stride()" if strided else ""),
            False,
        )
    if is_cupy(arg) and layout == "C":
        env[f"D{k}"] = arg.dtype.char
        return (
            f"type({a}) is not T{k} or {a}.dtype.char != D{k} or {a}.ndim != {ndim} or "
            f"not {a}.flags.c_contiguous or (d{k} := {a}.data).device_id != DEV",
            f"d{k}.ptr, *{a}.shape",
            False,
        )
    env[f"S{k}"] = info.sig
    return (
        f"type({a}) is not T{k} or (i{k} := describe({a})) is None or i{k}.sig is not S{k}",
        f"i{k}.abi_{layout.lower()}",
        True,
    )


# A launch whose arguments are the ones its parameter buffer was last packed for launches from
# that buffer as it is (``reuse_lines``); KAIO_REUSE_PACKED=0 turns it off
REUSE_PACKED = os.environ.get("KAIO_REUSE_PACKED", "1") != "0"
REUSED_BUFFERS = 2  # the parameter buffers a launcher that reuses them takes in turn
# A launcher that reuses its parameters gets a native front where it can (``front_setup``);
# bench/launch_overhead.py turns it off for its A/B
LAUNCH_FRONTS = True
# A launcher of torch tensors tests them with one check of the last launch's shapes where
# torch has it (``guard_setup``); bench/launch_overhead.py turns it off for its A/B
TORCH_GUARDS = True
# Such a guarded launcher gets a native front where it can (``front_setup``): the guard's
# check and each tensor's address from C; bench/launch_overhead.py turns it off for its A/B
TORCH_FRONTS = True
_WRAPPER = (DeviceArray, "_info", ArgInfo)  # a DeviceArray stands for its ArgInfo
_INT_KINDS = frozenset(("i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"))


def reusable(abi: list, args: tuple, record) -> bool:
    """Whether a launcher's arguments (``abi``: ``launch_abi``'s entries) can be known to be
    the last launch's by identity: every array a ``DeviceArray`` (its address, shape and
    strides never change; its ``ArgInfo``, which holds no memory, stands for it), no tensor
    map, no debug record. A torch tensor cannot be: the same object can point elsewhere or
    change shape (``set_``, ``resize_``, ``.data =``, ``t_()``, its storage's ``resize_``),
    so its accessors are read on every launch; and a key holding it would keep its memory."""
    if record is not None:
        return False
    for k, kind in abi:
        if kind == "tensormap" or kind in ("C", "A") and type(args[k]) is not DeviceArray:
            return False
    return True


def reuse_keys(abi: list, constexprs: list) -> list[tuple[str, str]]:
    """For a ``reusable`` launcher: per value a parameter buffer remembers, the test that
    the argument is the one remembered (``{key}`` standing for it) and what the buffer
    remembers once packed: an array's ``ArgInfo``, by identity (it fixes the address, shape
    and strides: any object holding that very ``ArgInfo`` packs the same bytes; an object
    without ``_info`` is a miss, ``reuse_lines``); an integer parameter's value (an ``int``
    equal to it packs the same bytes); any other scalar (a float: 0.0 and -0.0 are equal,
    their bits are not) and a constexpr by identity."""
    keys = []
    for k, kind in abi:
        if kind in ("C", "A"):
            keys.append((f"a{k}._info is {{key}}", f"i{k}"))
        elif kind in _INT_KINDS:
            keys.append(
                (f"((r{k} := {{key}}) is a{k} or type(a{k}) is int and a{k} == r{k})", f"a{k}")
            )
        else:
            keys.append((f"a{k} is {{key}}", f"a{k}"))
    return keys + [(f"a{k} is {{key}}", f"a{k}") for k in constexprs]


def reuse_lines(keys: list, conditions: list[str], entries: list[str], fronted: bool) -> list[str]:
    """The lines of a ``reusable`` launch from taking its parameter buffer (``slot``: the
    bytes, the ``kernelParams`` argument, and ``k``, what the bytes were packed for) to
    ``params``: when every argument is the one the buffer remembers (``keys``), nothing else;
    otherwise the signature's ``conditions`` (MISMATCH, the buffer given back), the packing
    of ``entries`` (a failure forgets what the buffer held: ``FORGOTTEN``) and what the
    buffer now holds remembered. A buffer is written and read only by the thread that took
    it off the free list. ``fronted`` (the launcher has a native front, ``front_setup``):
    ``k`` also holds ``params`` and the binding's ``CONFIG``, and the buffer's memo ``m``
    (the front's, for the launcher's first buffers) forgets it before it is packed again."""
    same = " and ".join(test.format(key=f"k[{j}]") for j, (test, _) in enumerate(keys))
    taken = "buf, params, k, m" if fronted else "buf, params, k"
    lines = [
        "try:",
        f"    {taken} = slot = take()",
        "except IndexError:",
        f"    {taken} = slot = new_slot()",
        "try:",
        f"    same = {same}",
        "except AttributeError:  # an array of another kind",
        "    same = False",
        "if not same:",
    ]
    for condition in conditions:
        lines += [f"    if {condition}:", "        give(slot)", "        MISMATCH"]
    if fronted:  # no front launches from this buffer while it changes
        lines += ["    m[0] = UNKNOWN"]
    stored = "".join(stored + ", " for _, stored in keys) + ("params, CONFIG" if fronted else "")
    return lines + [
        "    try:",
        f"        pack(buf, 0, {', '.join(entries)})",
        "    except PACK_ERRORS:",
        "        slot[2] = FORGOTTEN",
        "        give(slot)",
        "        MISMATCH",
        f"    slot[2] = k = ({stored})",
    ]


def front_target(launch_kernel) -> int | None:
    """The address of the C function ``launch_kernel`` calls, for a launcher's native front
    (``native.launch_front``): libcuda's ``cuLaunchKernelEx`` behind kaio's native builtin,
    a ctypes function pointer's own (a C stand-in in tests); None for anything else."""
    if launch_kernel is _raw_launch and _raw_target is not None:
        return _raw_target
    if isinstance(launch_kernel, ctypes._CFuncPtr):
        return ctypes.cast(launch_kernel, ctypes.c_void_p).value
    return None


MISSING = object()  # a parameter of a launcher's ``direct`` function the call did not pass


def given(values: tuple, more: tuple) -> tuple:
    """The positional arguments of a call of ``direct``: ``values`` up to the first
    ``MISSING``, then ``more``."""
    for n, value in enumerate(values):
        if value is MISSING:
            return values[:n]
    return values + more


class LaunchConfigStruct(ctypes.Structure):
    """The driver's ``CUlaunchConfig``: grid, block, dynamic shared bytes, stream, attributes."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


class LaunchAttributeStruct(ctypes.Structure):
    """The driver's ``CUlaunchAttribute``: an attribute's id, padding, its 64-byte value."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_int * 16)]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def launch_config(grid, block, shared: int, stream, pdl: bool = False) -> LaunchConfigStruct:
    """The ``CUlaunchConfig`` of a launch; ``pdl`` (a kernel that calls
    ``kaio.grid_dependency_wait()``): with programmatic stream serialization allowed, so that
    the kernel may launch before the one before it in the stream has finished (its wait
    then holds it until that kernel's writes are visible). The attribute array lives as
    long as the struct."""
    if not pdl:
        return LaunchConfigStruct(grid, block, shared, stream, None, 0)
    attrs = (LaunchAttributeStruct * 1)()
    attrs[0].id = PROGRAMMATIC_STREAM_SERIALIZATION
    attrs[0].value[0] = 1  # programmaticStreamSerializationAllowed
    config = LaunchConfigStruct(grid, block, shared, stream, ctypes.addressof(attrs), 1)
    config._attrs = attrs
    return config


_raw_launch = None
_raw_target = None  # cuLaunchKernelEx's address, once _raw_launch is the native builtin


def raw_launch_kernel():
    """libcuda's ``cuLaunchKernelEx(config, function, kernelParams, extra)`` as the launches
    call it: each argument a ctypes ``byref`` (made once) or None (NULL); the GIL kept, as
    PyTorch's and CuPy's launches do, since releasing and taking it back costs more than
    the driver takes to enqueue. Four arguments instead of ``cuLaunchKernel``'s eleven: the
    configuration is a struct filled once. The call is a builtin made by
    ``kaio.runtime.native`` where it can be (a call through ctypes costs more than the rest
    of a launch's Python), else ``ctypes_launch_kernel()``."""
    global _raw_launch, _raw_target
    if _raw_launch is None:
        ctypes_call = ctypes_launch_kernel()
        address = ctypes.cast(ctypes_call, ctypes.c_void_p).value
        native_call = native.trampoline(address, "cuLaunchKernelEx")
        _raw_launch, _raw_target = (native_call, address) if native_call else (ctypes_call, None)
    return _raw_launch


def ctypes_launch_kernel():
    """libcuda's ``cuLaunchKernelEx`` through a ctypes prototype with no ``argtypes``: each
    argument must already be a ctypes pointer (``c_void_p``, ``byref``) or None (NULL), so the
    call converts nothing. A ``PYFUNCTYPE`` prototype: the call keeps the GIL."""
    lib = libcuda()
    if not hasattr(lib, "cuLaunchKernelEx"):
        raise CudaError(
            "this NVIDIA driver has no cuLaunchKernelEx: kaio needs a driver for CUDA 12.0 "
            "or newer",
            "CUDA_ERROR_NOT_SUPPORTED",
            801,
        )
    return ctypes.PYFUNCTYPE(ctypes.c_int)(("cuLaunchKernelEx", lib))


_raw_context_calls = None


def launcher_elsewhere(device: Device) -> Callable:
    """``elsewhere(config, function, params) -> CUresult``: ``cuLaunchKernelEx`` with
    ``device``'s primary context made current for the call and the thread's previous one
    (kaio's, another library's, or none) current again after, for a launch whose arrays are
    on another GPU than the current one: the driver refuses a function of one context while
    another is current (CUDA_ERROR_INVALID_HANDLE). ``cuCtxGetCurrent`` and
    ``cuCtxSetCurrent`` through ctypes prototypes like ``raw_launch_kernel``'s."""
    global _raw_context_calls
    if _raw_context_calls is None:
        lib = libcuda()
        proto = ctypes.PYFUNCTYPE(ctypes.c_int)
        _raw_context_calls = proto(("cuCtxGetCurrent", lib)), proto(("cuCtxSetCurrent", lib))
    get_context, set_context = _raw_context_calls
    launch_kernel = raw_launch_kernel()
    target = ctypes.c_void_p(int(device.context))

    def elsewhere(config, function, params) -> int:
        previous = ctypes.c_void_p()
        rc = get_context(ctypes.byref(previous))
        if rc:
            return rc
        if previous.value == target.value:  # already current (torch's, say): no switch
            return launch_kernel(config, function, params, None)
        rc = set_context(target)
        if rc:
            return rc
        try:
            return launch_kernel(config, function, params, None)
        finally:
            set_context(previous)

    return elsewhere


def home_test(ordinal: int, name: str, env: dict) -> str:
    """The expression a generated launch tests to know whether GPU ``ordinal`` (its value in
    ``env[name]``) is the calling thread's current device: for GPU 0, while no thread has
    made another device current (``device.moved``), that is known without reading the
    thread-local ``current.ordinal``."""
    env["current"], env["MOVED"] = current, moved
    if ordinal == 0:
        return f"not MOVED[0] or current.ordinal == {name}"
    return f"current.ordinal == {name}"


def parameter_slot(size: int, offsets: list[int]) -> tuple:
    """A parameter buffer of ``size`` bytes (as a writable memoryview, which ``pack_into``
    takes faster than the ctypes array it views) and the ``kernelParams`` argument: a
    ``byref`` of the array of pointers to the buffer's entries at ``offsets`` (None when the
    kernel has no parameters), which ctypes passes without converting anything."""
    buf = (ctypes.c_uint8 * max(size, 8))()
    base = ctypes.addressof(buf)
    if not offsets:
        return memoryview(buf), None
    pointers = (ctypes.c_void_p * len(offsets))(*(base + o for o in offsets))
    return memoryview(buf), ctypes.byref(pointers)


_ANCHOR = ctypes.c_char()  # the object pointer_argument's byref offsets are taken from


def pointer_argument(address: int) -> object:
    """``address`` as an argument of a ctypes call that has no ``argtypes``, made once:
    a ``byref`` whose pointer is ``address`` (``byref(obj, offset)`` passes the address of
    ``obj`` plus ``offset``). ctypes passes a ``byref`` as it is, while a ``c_void_p``
    argument makes a new argument object on every call. ``ctypes.cast(arg, c_void_p).value``
    reads the address back."""
    return ctypes.byref(_ANCHOR, address - ctypes.addressof(_ANCHOR))


def argument_values(function, params) -> tuple[int, list[int]]:
    """The function handle and the ``kernelParams`` pointers of a launch's arguments, as
    ``raw_launch_kernel`` gets them (for fakes of the driver in tests)."""
    handle = ctypes.cast(function, ctypes.c_void_p).value
    return handle, [] if params is None else list(params._obj)


def guard_setup(env: dict, tensors: list, args: tuple, abi: list) -> bool:
    """Whether a launcher that packs on every launch, all of whose arrays are torch tensors
    (``tensors``: their positions and layouts), tests them with one check of the last
    launch's shapes (``guard_tests``), and if so what its code needs in ``env``:
    ``GUARD[0]``, ``(check, the dims of each tensor...)`` (its shape, and its strides for
    an 'A' layout: what the check has them be); ``SEEN[0]``, the shapes of the last launch
    the guard refused; ``guard(*tensors)``, a new guard (``arguments.tensor_check``)."""
    arrays = [k for k, kind in abi if kind in ("C", "A")]
    if not TORCH_GUARDS or not tensors or [k for k, _ in tensors] != arrays:
        return False

    def guard(*given):
        dims = [tuple(t.shape) + (tuple(t.stride()) if kind == "A" else ())
                for t, (_, kind) in zip(given, tensors, strict=True)]  # fmt: skip
        return (tensor_check(list(given)) or _refuses, *dims)

    first = guard(*(args[k] for k, _ in tensors))
    if first[0] is _refuses:  # no such check in this torch
        return False
    env["GUARD"], env["SEEN"], env["guard"] = [first], [None], guard
    return True


def _refuses(*tensors) -> bool:
    """The guard of a launcher whose check could not be made: it refuses everything."""
    return False


def guard_tests(tensors: list, conditions: list[str]) -> list[str]:
    """The lines of a guarded launch (``guard_setup``) up to its packing: ``hit`` when the
    tensors pass the guard's check, else their own conditions; the other ``conditions``
    (constexprs) either way."""
    checked = ", ".join(f"a{k}" for k, _ in tensors)
    own = [c for c in conditions if c.startswith(tuple(f"type(a{k}) " for k, _ in tensors))]
    lines = ["g = GUARD[0]", f"hit = g[0]({checked})", "if not hit:"]
    for condition in own:
        lines += [f"    if {condition}:", "        MISMATCH"]
    for condition in conditions:
        if condition not in own:
            lines += [f"if {condition}:", "    MISMATCH"]
    return lines


def guard_packing(tensors: list, abi: list, entries: list[str]) -> list[str]:
    """The packing of a guarded launch: on a ``hit`` each tensor's dims come from the guard
    (its address alone is read), else ``entries`` as they are."""
    hit = list(entries)
    guarded = {k: j for j, (k, _) in enumerate(tensors, 1)}
    for i, (k, _) in enumerate(abi):
        if k in guarded:
            hit[i] = f"a{k}.data_ptr(), *g[{guarded[k]}]"
    return [
        "if hit:",
        f"    pack(buf, 0, {', '.join(hit)})",
        "else:",
        f"    pack(buf, 0, {', '.join(entries)})",
    ]


def guard_renewal(tensors: list) -> list[str]:
    """After a guarded launch's packing missed the guard: a second miss in a row with the
    same shapes (and strides) makes a guard of them, so a launch whose shapes change every
    time makes none."""
    key = ", ".join(f"s{k}" + (f", a{k}.stride()" if kind == "A" else "") for k, kind in tensors)
    return [
        "if not hit:",
        f"    key = ({key},)",
        "    if key == SEEN[0]:",
        f"        GUARD[0] = guard({', '.join(f'a{k}' for k, _ in tensors)})",
        "    else:",
        "        SEEN[0] = key",
    ]


def context_getter() -> int:
    """The address of libcuda's ``cuCtxGetCurrent``, which a native front calls to test
    that the thread's current context is its launcher's."""
    return ctypes.cast(libcuda().cuCtxGetCurrent, ctypes.c_void_p).value


def front_setup(env: dict, loaded, count: int, has_arrays: bool, places: list | None) -> bool:
    """Whether a launcher of ``loaded`` gets a native front, and if so what its generated
    code needs in ``env``: ``front(direct, CONFIG, LAST)``, the front of a binding's
    ``direct`` (``native.launch_front``) as a ``functools.partial`` (which takes
    attributes), reading ``MEMOS`` (set by the caller once the buffers are made: the memo of
    each of the launcher's first buffers, a one-item list of what it was last launched with
    and the ``CONFIG`` of the binding that did, which its bindings share with the buffers);
    ``UNKNOWN``, a memo that matches no call. Two kinds of launcher have one: one that
    reuses its parameters (``count`` keys, ``places`` None), and one of torch tensors
    tested by a guard (``guard_setup``; ``places``, each tensor's position and the index of
    its address's ``kernelParams`` entry; ``count`` its arguments), whose memos also hold
    the guard's tuple and ``TENSOR`` in each tensor's place. A front launches only where the
    thread's current CUDA context is its GPU's (the launch as the Python one makes it,
    whether through ``home`` or ``elsewhere``); one without arrays, which launches on
    kaio's current device, only on GPU 0 while no thread has moved off it
    (``device.moved``). The other guards: no ``simulate()`` block and no call plan being
    recorded."""
    target = front_target(env["launch_kernel"])
    wanted = LAUNCH_FRONTS if places is None else TORCH_FRONTS
    if not wanted or target is None or not has_arrays and loaded.device.ordinal != 0:
        return False
    from kaio.runtime.launch import recordings
    from kaio.sim.mode import anywhere

    guards = ((anywhere, 0), (recordings, 0), *(() if has_arrays else ((moved, False),)))
    if not native.fronts(len(guards), _WRAPPER, tensors=places is not None):
        return False
    env["UNKNOWN"] = (MISSING,) * count + (None, None)
    env["TENSOR"] = native.TENSOR_KEY
    function, name = env["FUNC"], loaded.name
    context = (context_getter(), int(loaded.device.context))

    def front(direct, config, last):
        made = native.launch_front(target, direct, env["MEMOS"], config, function, last, name,
                                   guards, _WRAPPER, context, places)  # fmt: skip
        return direct if made is None else functools.partial(made)

    env["front"] = front
    return True


def front_memo(reused: bool, fronted: bool, count: int, tensors: list) -> list[str]:
    """The line of a launch with a native front (``front_setup``) that, after the driver
    call, leaves its buffer's memo: a reusing launch, its keys with the binding's
    ``CONFIG``; a guarded launch of torch tensors (``count`` arguments) that packed the
    guard's dims, each argument (``TENSOR`` for a tensor), ``params``, ``CONFIG`` and the
    guard's tuple ``g``."""
    if not fronted:
        return []
    if reused:
        return ["m[0] = k if k[-1] is CONFIG else (*k[:-1], CONFIG)"]
    places = {k for k, _ in tensors}
    keys = "".join("TENSOR, " if k in places else f"a{k}, " for k in range(count))
    return ["if hit:", f"    m[0] = ({keys}params, CONFIG, g)"]


def build_launcher(kernel, spec, loaded, args: tuple, infos: dict) -> Callable:
    """``bind(grid, block, shared, stream) -> launch(args) -> bool`` for arguments with the
    signature of ``args`` (all parameters, in order), launching ``spec`` as ``loaded``;
    ``infos`` maps array positions to their ``ArgInfo``."""
    fmt, size = param_format(loaded.params)
    record = loaded.debug  # debug mode: the error record's address is the last parameter
    if record is not None:
        fmt, size = record.extend_format(fmt, size)
    offsets = entry_offsets(fmt)
    declared = kernel.block_size

    def admit(grid, block, shared):
        with visiting(loaded.device):  # opting in to shared memory sets a function attribute
            validate_config(grid, block, shared, loaded, declared)

    def fail(rc, stream):
        raise cuda_error(rc, f"launching {loaded.name}", stream)

    def recover():
        Device(loaded.device.ordinal).set_current()

    env = {
        "PACK_ERRORS": (struct.error, TypeError, OverflowError, ValueError),
        "FUNC": pointer_argument(loaded.handle),
        "config_struct": launch_config,
        "PDL": loaded.pdl,
        "byref": ctypes.byref,
        "launch_kernel": raw_launch_kernel(),
        "current": current,
        "describe": _describe_quiet,
        "bf16_bits": bf16_bits,
        "last_slot": last_launched_slot,
        "NAME": loaded.name,
        "DEV": loaded.device.ordinal,
        "admit": admit,
        "fail": fail,
        "recover": recover,
        "elsewhere": launcher_elsewhere(loaded.device),
    }
    conditions, entries = [], []
    tensors: list[tuple[int, str]] = []  # torch arrays: (position, layout)
    runs: dict[int, int] = {}  # first entry -> entries packed as one ArgInfo bytes entry
    pointer_entries: dict[int, int] = {}  # array position -> its address's entry
    entry = 0
    abi = launch_abi(kernel, spec.layouts, loaded.params)
    for k, kind in abi:
        count = 1
        if kind in ("C", "A"):
            condition, values, whole = array_code(k, args[k], infos[k], kind, env)
            conditions.append(condition)
            entries.append(values)
            if is_torch(args[k]):
                tensors.append((k, kind))
            pointer_entries[k] = entry
            count = 1 + len(infos[k].shape) * (2 if kind == "A" else 1)
            if whole:
                runs[entry] = count
        elif kind == "tensormap":  # the map's 128 bytes, encoded once per TensorMap
            env["TensorMap"] = TensorMap
            conditions.append(f"type(a{k}) is not TensorMap")
            entries.append(f"a{k}.encoded()")
        else:
            entries.append(f"bf16_bits(a{k})" if kind == "bf16" else f"a{k}")
        entry += count
    constexprs = []
    for k, name in enumerate(kernel.param_names):
        if name in kernel.constexpr_names:  # by type and value: 1, 1.0 and True differ
            env[f"C{k}"], env[f"K{k}"] = args[k], constexpr_value_key(args[k])
            env["same_constexpr"] = same_constexpr
            conditions.append(f"a{k} is not C{k} and not same_constexpr(a{k}, K{k})")
            constexprs.append(k)
    if record is not None:

        def debug_check(stream):  # the default stream is the current context's
            with visiting(loaded.device):
                record.check(stream)

        def refuse_capture(stream):  # no debug kernel in a CUDA graph
            with visiting(loaded.device):
                record.refuse_capture(stream)

        env["RECORD"], env["debug_check"] = record.pointer, debug_check
        env["refuse_capture"] = refuse_capture
        entries.append("RECORD")
    env["pack"] = struct.Struct(merge_entries(fmt, runs)).pack_into
    # Free parameter buffers: a launch pops one (list.pop is atomic), packs and launches from
    # it, and puts it back, so threads launching this signature at once never share a buffer.
    # Only such a collision allocates another. With ``reused``, a buffer also holds the
    # arguments it was last packed for (slot[2]), and a launch with the same ones skips
    # the checks and the packing; there are REUSED_BUFFERS of them, taken in turn (a deque:
    # popleft and append are atomic too), so that launches whose arguments take turns
    # (x -> y, then y -> x) each find the buffer packed for theirs.
    keys = reuse_keys(abi, constexprs) if REUSE_PACKED and reusable(abi, args, record) else []
    reused = bool(keys)

    env["FORGOTTEN"] = (MISSING,) * len(keys)  # what a new buffer was packed for: nothing
    has_arrays = any(kind in ("C", "A") for _, kind in abi)
    guarded = not reused and record is None and guard_setup(env, tensors, args, abi)
    if reused:
        fronted = front_setup(env, loaded, len(keys), has_arrays, None)
    else:  # a guarded launcher of tensors alone (and scalars, constexprs)
        places = [(k, pointer_entries[k]) for k, _ in tensors]
        plain = guarded and all(kind != "tensormap" for _, kind in abi)
        fronted = plain and front_setup(env, loaded, len(args), has_arrays, places)

    def new_slot():
        slot = [*parameter_slot(size, offsets), *([env["FORGOTTEN"]] if keys else [])]
        return slot + [[env["UNKNOWN"]]] if fronted else slot

    if reused:
        free = env["free"] = collections.deque(new_slot() for _ in range(REUSED_BUFFERS))
        env["take"], env["give"] = free.popleft, free.append  # bound once
    else:
        free = env["free"] = [new_slot()]
        env["take"], env["give"] = free.pop, free.append
    env["new_slot"] = new_slot
    if fronted:  # the memos of the first buffers are the front's
        env["MEMOS"] = tuple(slot[-1] for slot in free)
    call = "launch_kernel(CONFIG, FUNC, params, None)"
    elsewhere = "elsewhere(CONFIG, FUNC, params)"
    # the body of a launch, written once for ``launch(args) -> bool`` and for ``direct``;
    # MISMATCH and DONE stand for what each returns
    if args:
        unpack = [
            "try:",
            f"    {', '.join(f'a{i}' for i in range(len(args)))}, = args",
            "except ValueError:",
            "    MISMATCH",
        ]
    else:
        unpack = ["if args:", "    MISMATCH"]
    body = [
        *unpack,
        f"home = {home_test(loaded.device.ordinal, 'DEV', env)}",
        # a kernel with arrays runs on their GPU (the conditions check it), one without on the
        # current device
        *([] if has_arrays else ["if not home:", "    MISMATCH"]),
    ]
    if reused:
        body += reuse_lines(keys, conditions, entries, fronted)
    elif guarded:
        body += guard_tests(tensors, conditions)
    else:
        for condition in conditions:
            body += [f"if {condition}:", "    MISMATCH"]
    body += [
        "if not admitted:",
        "    admit(grid, block, shared)",
        "    admitted = True",
        *(["refuse_capture(stream)"] if record is not None else []),
    ]
    if not reused:
        packing = [f"pack(buf, 0, {', '.join(entries)})"]
        if guarded:
            packing = guard_packing(tensors, abi, entries)
        taken = "buf, params, m" if fronted else "buf, params"
        # no front launches from this buffer while it changes
        forget = ["m[0] = UNKNOWN"] if fronted else []
        body += [
            "try:",
            f"    {taken} = slot = take()",
            "except IndexError:",
            f"    {taken} = slot = new_slot()",
            *forget,
            "try:",
            *("    " + line for line in packing),
            "except PACK_ERRORS:",
            "    give(slot)",
            "    MISMATCH",
            *(guard_renewal(tensors) if guarded else []),
        ]
    body += [
        "if home:",
        f"    rc = {call}",
        "    if rc:  # the success path tests rc once",
        f"        if rc == {_CUDA_ERROR_INVALID_CONTEXT}:  # a new thread: no context yet",
        "            recover()",
        f"            rc = {call}",
        f"        elif rc == {_CUDA_ERROR_INVALID_HANDLE}:  # another library's context",
        f"            rc = {elsewhere}",
        "else:",
        f"    rc = {elsewhere}",
        *front_memo(reused, fronted, len(args), tensors),
        "give(slot)",
        "if rc:",
        "    fail(rc, stream)",
        "LAST[0] = NAME",
        *(["debug_check(stream)"] if record is not None else []),
        "DONE",
    ]

    def spelled(indent: str, mismatch: str, done: str, lines: list = body) -> list[str]:
        return [indent + line.replace("MISMATCH", mismatch).replace("DONE", done) for line in lines]

    # ``direct`` takes the arguments as parameters (no tuple made and unpacked per call);
    # one missing (MISSING, the default), more than the kernel has, or keywords go to the
    # fallback, which binds them by name
    named = "".join(f"a{i}, " for i in range(len(args)))
    direct_params = "".join(f"a{i}=MISSING, " for i in range(len(args))) + "*more, **kwargs"
    last_missing = f" or a{len(args) - 1} is MISSING" if args else ""
    env["MISSING"], env["given"] = MISSING, given

    def spelled_direct(indent: str, mismatch: str, done: str) -> list[str]:
        return spelled(indent, mismatch, done, body[len(unpack) :])

    from kaio.runtime.launch import recordings
    from kaio.sim.mode import anywhere

    env["SIMULATING"], env["recordings"] = anywhere, recordings
    lines = [
        "def bind(grid, block, shared, stream):",
        "    CONFIG = byref(config_struct(grid, block, shared, stream, PDL))",
        "    LAST = last_slot(stream)",
        "    admitted = False",
        "",
        "    def launch(args):",
        "        nonlocal admitted",
        *spelled("        ", "return False", "return True"),
        "",
        "    def make_direct(fallback):",
        f"        def direct({direct_params}):",
        "            nonlocal admitted",
        f"            if kwargs or more{last_missing} or SIMULATING[0] or recordings[0]:",
        f"                return fallback(*given(({named}), more), **kwargs)",
        *spelled_direct("            ", f"return fallback({named})", "return None"),
        "",
        f"        return {'front(direct, CONFIG, LAST)' if fronted else 'direct'}",
        "",
        "    launch.make_direct = make_direct",
        "    return launch",
    ]
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<kaio launcher {loaded.name}>", "exec"), env)
    bind = env["bind"]
    bind.source = source
    return bind
