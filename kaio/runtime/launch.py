"""``kernel[grid, block, stream, shared](*args)``: the ``Launch`` object and ``resources``.

A launch first tries the launchers already built for this kernel (see ``launcher.py``), most
recent first: a matching one packs and launches in a few microseconds. Otherwise the slow path
validates every argument (``LaunchError`` naming the parameter), picks the array layouts ('C'
contiguous, 'A' strided), specializes and loads the kernel, and builds a launcher for this
signature. Inside ``with kaio.simulate():`` launches go to the CPU simulator instead.
"""

from __future__ import annotations

from kaio.errors import LaunchError
from kaio.kernel import LaunchConfig, param_annotation_error
from kaio.runtime.arguments import check_array, check_device, check_scalar
from kaio.runtime.device import ensure_context
from kaio.runtime.launcher import build_launcher
from kaio.runtime.module import Resources, load, select_arch
from kaio.runtime.stream import stream_handle
from kaio.types import ArrayType, ScalarType

__all__ = ["Launch", "resources"]

# Kernel._launchers[_DISPATCH] is the runtime's list of launchers, most recently built first.
_DISPATCH = "runtime"
_MAX_LAUNCHERS = 8


def _resolve_simulation_active() -> bool:
    """Bind ``_sim_active`` to ``kaio.sim.mode.active`` (or to a constant False while the
    simulator is absent) on first use, then answer it."""
    global _sim_active
    try:
        from kaio.sim.mode import active
    except ImportError:

        def active() -> bool:
            return False

    _sim_active = active
    return active()


_sim_active = _resolve_simulation_active


class Launch:
    """A kernel bound to a launch configuration; calling it launches (or simulates) it."""

    __slots__ = ("kernel", "config", "_grid", "_block", "_shared", "_stream")

    def __init__(self, kernel, config: LaunchConfig):
        self.kernel = kernel
        self.config = config
        self._grid, self._block, self._shared = config.grid, config.block, config.shared_bytes
        try:
            self._stream = stream_handle(config.stream)
        except TypeError as e:
            raise LaunchError(f"{kernel.__name__}: {e}") from None

    def __call__(self, *args, **kwargs) -> None:
        if _sim_active():
            from kaio.sim.launcher import run_simulated

            return run_simulated(self.kernel, self.config, args, kwargs)
        kernel = self.kernel
        if kwargs:
            args = _positional(kernel, args, kwargs)
        launchers = kernel._launchers.get(_DISPATCH)
        if launchers:
            for launch in launchers:
                if launch(args, self._grid, self._block, self._shared, self._stream):
                    return None
        _launch_slow(kernel, self.config, args, self._stream)
        return None


def _positional(kernel, args: tuple, kwargs: dict) -> tuple:
    """All arguments in parameter order (constexprs included)."""
    values, constexprs = kernel.split_args(args, kwargs)
    runtime = iter(values)
    return tuple(
        constexprs[n] if n in kernel.constexpr_names else next(runtime) for n in kernel.param_names
    )


def _launch_slow(kernel, cfg: LaunchConfig, args: tuple, handle: int) -> None:
    values, constexprs = kernel.split_args(args, {})
    position = {name: i for i, name in enumerate(kernel.param_names)}
    infos = {}
    arrays = []
    for (name, annotation), value in zip(kernel.runtime_params(), values, strict=True):
        if isinstance(annotation, ArrayType):
            info = check_array(value, name, annotation, kernel.__name__)
            infos[position[name]] = info
            arrays.append((info, name, annotation))
        elif isinstance(annotation, ScalarType):
            check_scalar(value, name, annotation, kernel.__name__)
        else:
            raise LaunchError(f"{kernel.__name__}: {param_annotation_error(name, annotation)}")
    dev = ensure_context()
    for info, name, annotation in arrays:
        check_device(info, name, annotation, kernel.__name__, dev.ordinal)
    layouts = tuple(infos[position[name]].layout for name in kernel.array_params())
    spec = kernel.specialize(constexprs, layouts)
    loaded = load(spec, dev, select_arch(kernel.arch, dev))
    launch = build_launcher(kernel, spec, loaded, args, infos)
    launchers = kernel._launchers.setdefault(_DISPATCH, [])
    launchers.insert(0, launch)
    del launchers[_MAX_LAUNCHERS:]
    if not launch(args, cfg.grid, cfg.block, cfg.shared_bytes, handle):
        raise LaunchError(
            f"{kernel.__name__}: the arguments could not be packed for launch: {args!r}"
        )


def resources(kernel, arch: str | None, constexprs: dict) -> Resources:
    """Registers, local (spill) bytes, shared bytes, constant bytes and max threads per block
    of ``kernel`` (contiguous arrays) compiled for ``arch`` and loaded on the current GPU."""
    dev = ensure_context()
    spec = kernel.specialize(constexprs)
    return load(spec, dev, select_arch(arch or kernel.arch, dev)).resources()
