"""Call plans: a sequence of kernel launches prepared once, replayed with new array addresses.

A library call that launches kernels (a ``kaio_ops`` op, say) redoes the same work on every
call with the same argument signature: validate the arguments, pick the kernels and grids,
pack the kernel parameters. A *call plan* does it once. The first call runs inside
``recording()``: every ``kernel[config](...)`` launch it makes is validated and launched as
usual, and also handed to the recorder, which keeps a ``PreparedLaunch`` (the loaded
function, the launch configuration struct, the ``struct`` format of its parameters and their
values, and which parameters are array addresses). The caller then says where each address
comes from (its own inputs, its outputs, constants) and makes a ``CallPlan``: a generated
function ``run(pointers)`` that, per launch, packs the constant parameters and the new
addresses into a parameter buffer and calls ``cuLaunchKernelEx``
through ctypes, as the kernel launcher (``launcher.py``) does, with the same recovery (a new
thread without a context, another library's context current, arrays on another GPU than the
current one) and the same error reporting.

A plan is only as valid as the signature it was recorded for: shapes, dtypes, strides,
alignment, device, stream and every non-array argument. Keeping that key, and looking plans up
by it, is the caller's job (``kaio_ops._plan``). Launches that cannot be replayed with new
addresses raise ``PlanError`` while recording (a kernel compiled in debug mode, which checks an
error record after each launch); the caller then runs its calls unplanned. A tensor map holds
its array's address inside its 128 bytes: a plan re-encodes the map for each call's address
(``cuTensorMapEncodeTiled``), keeping the maps of the last addresses it met (weights keep
theirs; activations come back to a few addresses from torch's caching allocator).
"""

from __future__ import annotations

import ctypes
import importlib
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kaio.errors import LaunchError
from kaio.runtime import launcher
from kaio.runtime.device import current
from kaio.runtime.driver import cuda_error, last_launched_slot
from kaio.runtime.launcher import (
    bf16_bits,
    entry_offsets,
    launch_abi,
    launch_config,
    param_format,
    parameter_slot,
    validate_config,
)

__all__ = [
    "CallPlan",
    "PlanError",
    "PreparedLaunch",
    "Recorder",
    "compile_function",
    "prepare",
    "recording",
]

_CUDA_ERROR_INVALID_CONTEXT = 201
_CUDA_ERROR_INVALID_HANDLE = 400


class PlanError(Exception):
    """A launch that a call plan cannot replay (the caller runs the call unplanned)."""


class PreparedLaunch:
    """One launch of a loaded kernel with its parameters worked out: ``fmt`` (the ``struct``
    format of the parameter buffer) and ``values`` (one per entry), ``arrays`` (argument
    position -> index in ``values`` of that array's address), the ``CUlaunchConfig``
    (``config``) and the function handle, the GPU ordinal and the kernel's name."""

    __slots__ = ("name", "function", "config", "fmt", "size", "offsets", "values", "arrays")
    __slots__ += ("device", "stream", "_loaded", "maps")

    def __init__(self, loaded, fmt: str, size: int, values: list, arrays: dict, config_values):
        self.name = loaded.name
        self.function = loaded.handle
        self._loaded = loaded
        self.device = loaded.device
        self.fmt, self.size, self.values, self.arrays = fmt, size, values, arrays
        self.offsets = entry_offsets(fmt)
        grid, block, shared, stream = config_values
        self.stream = stream
        self.config = launch_config(grid, block, shared, stream, loaded.pdl)
        # argument position -> (index in values of its 128 bytes, the TensorMap)
        self.maps: dict = {}

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"PreparedLaunch({self.name}, grid={tuple(cfg.grid)}, block={tuple(cfg.block)}, "
            f"shared={cfg.shared}, arrays at {sorted(self.arrays)})"
        )


def prepare(launch, args: tuple) -> PreparedLaunch:
    """``launch`` (a ``kernel[config]``) with ``args`` (all parameters, in order) validated,
    specialized, loaded and packed, as its first launch would: raises ``LaunchError`` for
    wrong arguments and ``PlanError`` for a launch a plan cannot replay."""
    from kaio.runtime.launch import loaded_for

    launch = getattr(launch, "launch", launch)  # kernel[config] is the Launch's call
    kernel, cfg = launch.kernel, launch.config
    spec, loaded, infos = loaded_for(kernel, args)
    if loaded.debug is not None:
        raise PlanError(f"{loaded.name} is compiled in debug mode")
    fmt, size = param_format(loaded.params)
    values: list = []
    arrays: dict = {}
    maps: dict = {}
    for k, kind in launch_abi(kernel, spec.layouts, loaded.params):
        if kind in ("C", "A"):
            info = infos[k]
            arrays[k] = len(values)
            values += [info.ptr, *info.shape, *(info.strides if kind == "A" else ())]
        elif kind == "tensormap":
            maps[k] = (len(values), args[k])
            values.append(args[k].encoded())
        else:
            values.append(bf16_bits(args[k]) if kind == "bf16" else args[k])
    try:
        struct.pack(fmt, *values)
    except (struct.error, TypeError, OverflowError, ValueError) as e:
        raise LaunchError(f"{loaded.name}: the arguments could not be packed: {e}") from None
    with launcher.visiting(loaded.device):  # opting in to shared memory sets a function attribute
        validate_config(cfg.grid, cfg.block, cfg.shared_bytes, loaded, kernel.block_size)
    config = (cfg.grid, cfg.block, cfg.shared_bytes, launch._stream)
    prepared = PreparedLaunch(loaded, fmt, size, values, arrays, config)
    prepared.maps = maps
    return prepared


class Recorder:
    """Collects the launches of one call made inside ``recording()``: ``launches`` holds
    ``(PreparedLaunch, args)`` pairs in launch order; ``failed`` says why the call cannot be
    planned (None when it can). Each launch also runs, through the kernel's own launchers."""

    def __init__(self):
        self.launches: list[tuple[PreparedLaunch, tuple]] = []
        self.failed: str | None = None
        self.allocated: list = []  # arrays the call made, noted by the caller's allocator

    def launch(self, launch, args: tuple) -> None:
        """Prepare and record one launch, then launch it as usual."""
        if self.failed is None:
            try:
                self.launches.append((prepare(launch, args), args))
            except PlanError as e:
                self.failed = str(e)
        saved, current.recorder = current.recorder, None
        try:
            if not launch._first(args):
                launch._launch_others(args)
        finally:
            current.recorder = saved


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record the kernel launches the calling thread makes in the block (they still run)."""
    from kaio.runtime.launch import recordings

    recorder = Recorder()
    saved, current.recorder = current.recorder, recorder
    with _COUNT:
        recordings[0] += 1
    try:
        yield recorder
    finally:
        current.recorder = saved
        with _COUNT:
            recordings[0] -= 1


_COUNT = threading.Lock()  # guards kaio.runtime.launch.recordings


class CallPlan:
    """Replays prepared launches with new addresses: ``run(pointers)``.

    ``steps``: ``(PreparedLaunch, {argument position: (source, byte offset)})`` per launch,
    where ``pointers[source] + byte offset`` is the new address of that array argument (of
    the array under a tensor map, for the positions in ``PreparedLaunch.maps``: the map is
    encoded again for that address, ``map_encoder``); arrays not named keep the address they
    were recorded with (constants), maps not named their bytes. The generated
    ``run`` packs each launch's parameters in one ``pack_into`` into a buffer taken off a free
    list (threads replaying one plan at once never share a buffer) and launches it.
    """

    def __init__(self, steps: list[tuple[PreparedLaunch, dict]]):
        self.steps = steps
        for prepared, _ in steps:  # keep the maps' layouts, not the recorded arrays
            prepared.maps = {k: (e, _layout(tm)) for k, (e, tm) in prepared.maps.items()}
        env: dict = {}
        lines = ["def run(p):", *self.code(env, lambda source: f"p[{source}]")]
        self.run = compile_function(lines, env, "run", "<kaio call plan>")

    def code(
        self, env: dict, address: Callable[[int], str], constants: dict | None = None
    ) -> list[str]:
        """The lines (indented for a function body) that launch every step, for a caller
        that generates its own function around them (``kaio_ops._plan`` inlines them in an
        op's replay): ``address(source)`` spells the expression of pointer ``source`` (a
        local name, ``p[0]``...); the names the lines use are added to ``env``. Each call
        of ``code`` makes its own parameter buffers. ``constants``: source -> the pointer
        it is for the life of the lines (a workspace the caller owns), packed into the
        buffers when they are made instead of written by each call (a map over it is
        encoded by the calls, as any)."""
        constants = constants or {}
        env["current"] = current
        env["launch_kernel"] = launcher.raw_launch_kernel()
        lines = []
        devices = {prepared.device.ordinal for prepared, _ in self.steps}
        one_device = len(devices) == 1
        if one_device:
            env["DEV"] = devices.pop()
            lines.append(f"home = {launcher.home_test(env['DEV'], 'DEV', env)}")
        for i, (prepared, sources) in enumerate(self.steps):
            # a parameter buffer holds every constant entry from when it is made: a call
            # writes only the addresses of its arrays and the maps over them (128 bytes at
            # 64-byte offsets), not the whole format. Each distinct address (a source and
            # an offset into it) is one word after the packed parameters, which the
            # kernelParams entry of every parameter holding that address points to: a call
            # writes it once (rms_norm passes x three times, decode q twice)
            # a map is encoded again only where its buffer holds another address's map
            # (``mapped``: the address each map of the buffer was last encoded for)
            writes, maps = [], 0
            offsets, values = list(prepared.offsets), list(prepared.values)
            packed = -(-struct.calcsize(prepared.fmt) // 8)  # words the parameters take
            words: dict = {}  # (source, offset) -> its word
            for k, (source, add) in sources.items():
                if source in constants and k not in prepared.maps:
                    values[prepared.arrays[k]] = constants[source] + add
                    continue
                where = address(source)
                where = f"{where} + {add}" if add else where
                if k in prepared.maps:
                    e, tm = prepared.maps[k]
                    env[f"MAP{i}_{e}"] = map_encoder(tm)
                    at = offsets[e]
                    writes += [
                        f"at = {where}",
                        f"if mapped[{maps}] != at:",
                        f"    buf[{at}:{at + 128}] = MAP{i}_{e}(at)",
                        f"    mapped[{maps}] = at",
                    ]
                    maps += 1
                    continue
                word = words.get((source, add))
                if word is None:
                    word = words[source, add] = packed + len(words)
                    writes.append(f"words[{word}] = {where}")
                offsets[prepared.arrays[k]] = 8 * word
            filled = struct.pack(prepared.fmt, *values)
            size = 8 * (packed + len(words))

            def new(filled=filled, offsets=offsets, size=size, maps=maps) -> tuple:
                slot = _filled_slot(filled, offsets, size)
                return (*slot, [None] * maps) if maps else slot

            free = env[f"free{i}"] = [new()]
            env[f"take{i}"], env[f"give{i}"] = free.pop, free.append  # bound once
            env[f"new{i}"] = new
            env[f"CONFIG{i}"] = ctypes.byref(prepared.config)  # its _obj keeps the struct
            env[f"FUNC{i}"] = launcher.pointer_argument(prepared.function)
            env[f"elsewhere{i}"] = launcher.launcher_elsewhere(prepared.device)
            env[f"LAST{i}"] = last_launched_slot(prepared.stream)
            env[f"NAME{i}"] = prepared.name
            env[f"fail{i}"] = _failure(prepared)
            env[f"recover{i}"] = _recovery(prepared)
            call = f"launch_kernel(CONFIG{i}, FUNC{i}, params, None)"
            elsewhere = f"elsewhere{i}(CONFIG{i}, FUNC{i}, params)"
            if not one_device:
                env[f"DEV{i}"] = prepared.device.ordinal
                home = launcher.home_test(prepared.device.ordinal, f"DEV{i}", env)
                lines.append(f"home = {home}")
            unpack = "buf, words, params, mapped" if maps else "buf, words, params"
            lines += [
                "try:",
                f"    {unpack} = slot = take{i}()",
                "except IndexError:",
                f"    {unpack} = slot = new{i}()",
                *writes,
                "if home:",
                f"    rc = {call}",
                "    if rc:  # the success path tests rc once",
                f"        if rc == {_CUDA_ERROR_INVALID_CONTEXT}:  # a new thread: no context yet",
                f"            recover{i}()",
                f"            rc = {call}",
                f"        elif rc == {_CUDA_ERROR_INVALID_HANDLE}:  # another library's context",
                f"            rc = {elsewhere}",
                "else:",
                f"    rc = {elsewhere}",
                f"give{i}(slot)",
                "if rc:",
                f"    fail{i}(rc)",
                f"LAST{i}[0] = NAME{i}",
            ]
        return ["    " + line for line in lines]


def _filled_slot(filled: bytes, offsets: list[int], size: int) -> tuple:
    """A parameter buffer of ``size`` bytes (whole words) starting with ``filled`` (the
    packed parameters), as ``(bytes view, the same as 8-byte words, the kernelParams
    argument)``: kernelParams points to each parameter at its offset in ``offsets`` (the
    driver reads each there, nothing else)."""
    view, params = parameter_slot(size, offsets)
    buf = view.cast("B")  # ctypes' "<B" takes no slice assignment
    buf[: len(filled)] = filled
    return buf, buf.cast("Q"), params


def compile_function(lines: list[str], env: dict, name: str, filename: str) -> Callable:
    """The function ``name`` defined by ``lines`` in ``env``, its source kept as ``.source``."""
    source = "\n".join(lines) + "\n"
    exec(compile(source, filename, "exec"), env)
    fn = env[name]
    fn.source = source
    return fn


# encoded maps a plan step keeps per tensor-map argument, by address: a model's layers share
# one plan per shape, so each layer's weight is one address here, and activations cycle
# through a few addresses of torch's caching allocator
MAPS_KEPT = 1024


def map_encoder(tm) -> object:
    """``encode(address)``: the 128 bytes of the tensor map ``tm`` (its shape, strides, box
    and swizzle) over the array at ``address``; the bytes of the last MAPS_KEPT addresses met
    are kept (the map depends on nothing else the plan does not fix)."""
    # the module (``kaio.tensormap`` is also the parameter annotation); looked up per
    # encoding, so that tests can stand in for the driver
    tensormap = importlib.import_module("kaio.tensormap")
    kept: dict = {}

    def encode(address: int) -> bytes:
        try:
            return kept[address]
        except KeyError:
            pass
        if len(kept) >= MAPS_KEPT:
            del kept[next(iter(kept))]  # the oldest
        made = kept[address] = tensormap._encode(tm, address)
        return made

    return encode


def _layout(tm):
    """``tm`` without its array (a plan must not keep the recorded call's arrays alive)."""
    return type(tm)(
        None, tm.dtype, tm.shape, tm.row_stride, tm.box, tm.swizzle, None, tm.l2_promotion
    )


def _failure(prepared: PreparedLaunch):
    def fail(rc: int):
        raise cuda_error(rc, f"launching {prepared.name}", prepared.stream)

    return fail


def _recovery(prepared: PreparedLaunch):
    def recover():
        from kaio.runtime.device import Device

        Device(prepared.device.ordinal).set_current()

    return recover
