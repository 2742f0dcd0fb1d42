"""``kernel[grid, block, stream, shared](*args)``: the ``Launch`` object and ``resources``.

A ``Launch`` holds the kernel's launchers (see ``launcher.py``) bound to its configuration, most
recent first (``kernel[config]`` hands out its ``call``, a plain function, which the host calls
faster than the object; once a launcher is bound, the first one's ``direct`` function, or its
native front (``launcher.front_setup``): that launch with the ``Launch``'s checks in front and
no call in between, which hands any call it does not take to ``_rest``; ``call`` calls it too):
a call whose arguments one of them takes packs and launches in a few microseconds. Otherwise it
binds the launchers other configurations built since, and failing those takes the slow path
(``_build``): validate every argument (``LaunchError`` naming the parameter), pick the array
layouts ('C' contiguous, 'A' strided), specialize the kernel and load it on the GPU its arrays
are on (all on one; the current device for a kernel without arrays), and build a launcher for
this signature. Inside ``with kaio.simulate():`` launches go to the CPU simulator instead. While
the calling thread records a call plan (``kaio.runtime.plan.recording``; ``recordings`` counts
them process-wide, so other launches pay one global read), each launch goes to its recorder,
which prepares it and launches it as above.
"""

from __future__ import annotations

from kaio.errors import LaunchError
from kaio.kernel import LaunchConfig, param_annotation_error
from kaio.runtime.arguments import check_array, check_scalar
from kaio.runtime.device import Device, current, ensure_context, visiting
from kaio.runtime.launcher import build_launcher
from kaio.runtime.module import Resources, load, select_arch
from kaio.runtime.stream import stream_handle
from kaio.sim.mode import anywhere as SIMULATING
from kaio.tensormap import TensorMap
from kaio.types import ArrayType, ScalarType, TensorMapType

__all__ = ["Launch", "max_active_clusters", "resources"]

# Kernel._launchers[_DISPATCH] is the runtime's list of launchers, most recently built first.
_DISPATCH = "runtime"
_MAX_LAUNCHERS = 8
# Threads recording a call plan (kaio.runtime.plan.recording): while none is, a launch reads
# this module global instead of the thread-local recorder (a thread-local read costs more)
recordings = [0]


class Launch:
    """A kernel bound to a launch configuration; calling it launches (or simulates) it."""

    __slots__ = ("kernel", "config", "_stream", "_bound", "_bindings", "_first", "_entry", "call")

    def __init__(self, kernel, config: LaunchConfig):
        self.kernel = kernel
        self.config = config
        try:
            self._stream = stream_handle(config.stream)
        except TypeError as e:
            raise LaunchError(f"{kernel.__name__}: {e}") from None
        self._bindings: dict = {}  # launcher -> its launch function bound to this config
        self._bound: list = []  # those functions, in the kernel's launcher order
        self._first = _declines  # _bound[0]: the call that launches most often, tried alone
        self._entry = self.__call__  # what ``call`` calls: _bound[0]'s direct function, if any
        self.call = _call_of(self)

    def __call__(self, *args, **kwargs) -> None:
        # simulate() blocks open in any thread (a global read; the thread's own count, a
        # thread-local read, is looked at only then)
        if kwargs or SIMULATING[0] or recordings[0]:
            return self._call_with_keywords(args, kwargs)
        if not self._first(args):
            self._launch_others(args)
        return None

    def _call_with_keywords(self, args: tuple, kwargs: dict) -> None:
        """A call with keyword arguments, or any call inside ``kaio.simulate()``."""
        if current.simulating:
            from kaio.sim.launcher import run_simulated

            return run_simulated(self.kernel, self.config, args, kwargs)
        args = _positional(self.kernel, args, kwargs)
        if recordings[0] and current.recorder is not None:  # a call plan is being built
            return current.recorder.launch(self, args)
        if not self._first(args):
            self._launch_others(args)
        return None

    def _rest(self, *args, **kwargs) -> None:
        """A call the first bound launcher's direct function does not take: keywords, a
        ``simulate()`` block, a recording, another signature."""
        if kwargs or SIMULATING[0] or recordings[0]:
            return self._call_with_keywords(args, kwargs)
        self._launch_others(args)
        return None

    def _launch_others(self, args: tuple) -> None:
        """The first bound launcher declined ``args``: try the others, then the slow path."""
        for launch in self._bound[1:]:
            if launch(args):
                return
        self._launch_unbound(args)

    def _launch_unbound(self, args: tuple) -> None:
        """Try the kernel's launchers not bound here yet, else build one for ``args``."""
        launchers = self.kernel._launchers.setdefault(_DISPATCH, [])
        fresh = [self._bind(b) for b in launchers if b not in self._bindings]
        self._sync_bound()
        if any(launch(args) for launch in fresh):
            return
        launch = self._bind(_build(self.kernel, args))
        self._sync_bound()
        if not launch(args):
            raise LaunchError(
                f"{self.kernel.__name__}: the arguments could not be packed for launch: {args!r}"
            )

    def _bind(self, bind):
        cfg = self.config
        launch = self._bindings[bind] = bind(cfg.grid, cfg.block, cfg.shared_bytes, self._stream)
        return launch

    def _sync_bound(self) -> None:
        """Follow the kernel's launcher list: its order, and the launchers it dropped; what
        ``kernel[config]`` hands out next is the first launcher's ``direct`` function."""
        launchers = self.kernel._launchers[_DISPATCH]
        self._bindings = {b: self._bindings[b] for b in launchers if b in self._bindings}
        self._bound = list(self._bindings.values())
        self._first = self._bound[0] if self._bound else _declines
        make_direct = getattr(self._first, "make_direct", None)
        if make_direct is None:
            entry, self._entry = self.call, self.__call__
        else:
            entry = self._entry = make_direct(self._rest)
            entry.launch, entry.kernel, entry.config = self, self.kernel, self.config
        subscripts = getattr(self.kernel, "_launches", {})
        for key in [k for k, f in subscripts.items() if getattr(f, "launch", None) is self]:
            subscripts[key] = entry


def _call_of(launch: Launch):
    """``launch(*args)`` as a plain function (what ``kernel[config]`` returns before a
    launcher is bound): calling a function costs the host less than calling an object's
    ``__call__``. It calls the first bound launcher's direct function (a native front where
    it has one) once there is one, so a ``kernel[config]`` kept from before the first launch
    launches the way a new subscript does. It carries ``launch`` (the ``Launch``),
    ``kernel`` and ``config``."""

    def call(*args, **kwargs) -> None:
        return launch._entry(*args, **kwargs)

    call.launch, call.kernel, call.config = launch, launch.kernel, launch.config
    return call


def _declines(args: tuple) -> bool:
    """The first launcher of a ``Launch`` that has none bound yet."""
    return False


def _positional(kernel, args: tuple, kwargs: dict) -> tuple:
    """All arguments in parameter order (constexprs included)."""
    names = kernel.param_names
    if len(args) + len(kwargs) == len(names):
        # The common call, trailing parameters by keyword: no signature binding (tens of
        # microseconds). A name that is not a trailing parameter misses below and falls back.
        try:
            return args + tuple([kwargs[n] for n in names[len(args) :]])
        except KeyError:
            pass
    values, constexprs = kernel.split_args(args, kwargs)
    runtime = iter(values)
    return tuple(
        constexprs[n] if n in kernel.constexpr_names else next(runtime) for n in kernel.param_names
    )


def _build(kernel, args: tuple):
    """The slow path: validate ``args`` (all parameters, in order), specialize and load the
    kernel for them, and add a launcher for their signature to the kernel's list (returned)."""
    spec, loaded, infos = loaded_for(kernel, args)
    bind = build_launcher(kernel, spec, loaded, args, infos)
    launchers = kernel._launchers.setdefault(_DISPATCH, [])
    launchers.insert(0, bind)
    del launchers[_MAX_LAUNCHERS:]
    return bind


def loaded_for(kernel, args: tuple) -> tuple:
    """Validate ``args`` (all parameters, in order; ``LaunchError`` naming the parameter),
    specialize the kernel for their layouts and constexprs and load it on their GPU:
    ``(spec, loaded kernel, {array position: ArgInfo})``."""
    values, constexprs = kernel.split_args(args, {})
    position = {name: i for i, name in enumerate(kernel.param_names)}
    infos = {}
    arrays = []
    for (name, annotation), value in zip(kernel.runtime_params(constexprs), values, strict=True):
        if isinstance(annotation, ArrayType):
            info = check_array(value, name, annotation, kernel.__name__)
            infos[position[name]] = info
            arrays.append((info, name, annotation))
        elif isinstance(annotation, ScalarType):
            check_scalar(value, name, annotation, kernel.__name__)
        elif isinstance(annotation, TensorMapType):
            if not isinstance(value, TensorMap):
                raise LaunchError(
                    f"{kernel.__name__}: argument {name!r} (kaio.tensormap) must be a "
                    f"kaio.tensor_map_2d(...), got {type(value).__name__}"
                )
            value.encoded()  # encoding errors surface here, not as a packing failure
        else:
            raise LaunchError(f"{kernel.__name__}: {param_annotation_error(name, annotation)}")
    dev = _device(kernel, arrays)
    layouts = tuple(infos[position[name]].layout for name in kernel.array_params())
    spec = kernel.specialize(constexprs, layouts)
    with visiting(dev):
        loaded = load(spec, dev, select_arch(kernel.arch, dev))
    return spec, loaded, infos


def _device(kernel, arrays: list) -> Device:
    """The GPU a launch runs on: the one its arrays (``(ArgInfo, name, annotation)``) are
    on, all on one; for a kernel without arrays, the current device."""
    if not arrays:
        return ensure_context()
    first, first_name, _ = arrays[0]
    for info, name, annotation in arrays[1:]:
        if info.device != first.device:
            raise LaunchError(
                f"{kernel.__name__}: argument {name!r} (expects {annotation}) is on GPU "
                f"{info.device} but {first_name!r} is on GPU {first.device}; a kernel runs on "
                "one GPU: copy the arrays to one device"
            )
    return Device(first.device)


def resources(kernel, arch: str | None, constexprs: dict) -> Resources:
    """Registers, local (spill) bytes, shared bytes, constant bytes and max threads per block
    of ``kernel`` (contiguous arrays) compiled for ``arch`` and loaded on the current GPU."""
    dev = ensure_context()
    spec = kernel.specialize(constexprs)
    return load(spec, dev, select_arch(arch or kernel.arch, dev)).resources()


def max_active_clusters(
    kernel, arch: str | None, constexprs: dict, threads: int, shared_bytes: int, device=None
) -> int:
    """``LoadedKernel.max_active_clusters`` of ``kernel`` compiled for ``arch`` and loaded on
    ``device`` (default: the current GPU)."""
    dev = device or ensure_context()
    spec = kernel.specialize(constexprs)
    with visiting(dev):
        loaded = load(spec, dev, select_arch(arch or kernel.arch, dev))
    return loaded.max_active_clusters(threads, shared_bytes)
