"""Launching a ``Kernel`` on the simulator: ``kernel.sim[grid, block](*args)`` and the launches
that ``with kaio.simulate():`` redirects (``run_simulated``)."""

from __future__ import annotations

import os

import numpy as np

from kaio.errors import LaunchError
from kaio.ir.nodes import Instr, walk
from kaio.kernel import DEFAULT_ARCH, LaunchConfig, parse_launch_config
from kaio.numerics import round_f64
from kaio.sim.engine import simulate
from kaio.tensormap import TensorMap
from kaio.types import ArrayType, ScalarType, int_range


class SimLauncher:
    """``kernel.sim``: subscript it with ``[grid]``, ``[grid, block]`` or ``[grid, block,
    stream, shared_bytes]`` (the stream is ignored) and call the result with the kernel's
    arguments, NumPy arrays being modified in place. ``kernel.sim(race_check=False)[...]``
    runs without the shared-memory race detector."""

    def __init__(self, kernel, race_check: bool = True):
        self.kernel = kernel
        self.race_check = race_check

    def __call__(self, *, race_check: bool = True) -> SimLauncher:
        """The simulator with options: ``race_check=False`` turns the shared-memory race
        detector off (it is on by default)."""
        return SimLauncher(self.kernel, race_check=bool(race_check))

    def __getitem__(self, config):
        kernel, race_check = self.kernel, self.race_check
        cfg = parse_launch_config(config, kernel.block_size, kernel.__name__)
        return lambda *args, **kwargs: run_simulated(kernel, cfg, args, kwargs, race_check)


# The ops that write their first argument (an array); a read-only NumPy array may be read only.
_WRITES = frozenset({"store", "st_vec", "atomic", "bulk_store"})


def run_simulated(
    kernel, config: LaunchConfig, args: tuple, kwargs: dict, race_check: bool = True
) -> None:
    """Run ``kernel`` with launch configuration ``config`` on the simulator."""
    values, constexprs = kernel.split_args(args, kwargs)
    params = kernel.runtime_params(constexprs)
    by_name = dict(zip((n for n, _ in params), values, strict=True))
    layouts = []
    for name, ann in params:
        if isinstance(ann, ArrayType):
            arr = _check_array(kernel, name, ann, by_name[name])
            layouts.append("C" if arr.flags.c_contiguous else "A")
    spec = kernel.specialize(constexprs, tuple(layouts))
    fn = spec.function
    arch = kernel.arch or DEFAULT_ARCH
    if os.environ.get("KAIO_DUMP_DIR"):
        spec.ptx(arch)  # writes the IR and the PTX there, as a GPU launch does
    arrays, scalars, tensor_maps = {}, {}, []
    for p in fn.params:
        v = by_name[p.source]
        if p.role == "scalar":
            scalars[p.value] = _scalar(kernel, p.source, p.value.type, v)
            continue
        if p.role == "tensormap":
            scalars[p.value] = np.uint64(len(tensor_maps))
            tensor_maps.append(_tensor_map(kernel, p.source, v))
            continue
        arrays[p.array] = v
        if p.role == "stride" and v.strides[p.dim] % v.itemsize:
            raise LaunchError(
                f"{kernel.__name__}: array {p.source!r} has a stride of {v.strides[p.dim]} bytes, "
                f"not a multiple of its {v.itemsize}-byte elements"
            )
    if not all(v.flags.writeable for v in arrays.values()):
        _check_read_only(kernel, fn, arrays)
    simulate(
        fn,
        config.grid,
        config.block,
        arrays,
        scalars,
        config.shared_bytes,
        race_check=race_check,
        tensor_maps=tuple(tensor_maps),
        arch=arch,
    )


def _check_read_only(kernel, fn, arrays: dict) -> None:
    """Refuse a read-only NumPy array for a parameter the kernel writes (stores, atomics)."""
    for s in walk(fn.body):
        if isinstance(s, Instr) and s.op in _WRITES and s.args:
            arr = s.args[0]
            v = arrays.get(arr)
            if v is not None and not v.flags.writeable:
                source = next(p.source for p in fn.params if p.array is arr)
                raise LaunchError(
                    f"{kernel.__name__}: argument {source!r} is a read-only NumPy array, but "
                    "the kernel writes it: pass a writable array (np.array(x) or x.copy())"
                )


def _tensor_map(kernel, name: str, v) -> TensorMap:
    if not isinstance(v, TensorMap) or not isinstance(v.array, np.ndarray):
        raise LaunchError(
            f"{kernel.__name__}: argument {name!r} (kaio.tensormap) must be a "
            f"kaio.tensor_map_2d() over a NumPy array for the simulator, got {v!r}"
        )
    return v


def _check_array(kernel, name: str, ann: ArrayType, v) -> np.ndarray:
    if not isinstance(v, np.ndarray):
        raise LaunchError(
            f"{kernel.__name__}: argument {name!r} must be a NumPy array ({ann}) for the "
            f"simulator, got {type(v).__name__}"
        )
    if v.dtype != ann.dtype.np_dtype or v.ndim != ann.ndim:
        raise LaunchError(
            f"{kernel.__name__}: argument {name!r} is declared {ann} but got a {v.ndim}-d "
            f"array of {v.dtype} (convert it with .astype, or reshape it)"
        )
    return v


def _scalar(kernel, name: str, t: ScalarType, v):
    """A launch argument converted to scalar type ``t``; out-of-range integers are refused."""
    where = f"{kernel.__name__}: argument {name!r} ({t})"
    if t.is_float:
        if not isinstance(v, int | float | np.integer | np.floating):
            raise LaunchError(f"{where} must be a number, got {type(v).__name__}")
        return round_f64(np.asarray(float(v)), t.np_dtype)
    if not isinstance(v, int | np.integer | np.bool_):
        raise LaunchError(f"{where} must be an integer, got {type(v).__name__}")
    v = int(v)
    lo, hi = int_range(t)
    if not lo <= v <= hi:
        raise LaunchError(f"{where} is {v}, outside the type's range [{lo}, {hi}]")
    return np.asarray(v).astype(t.np_dtype)
