"""``Kernel``: the object ``@kaio.gpu_kernel`` returns.

It owns the specialization cache (one compiled IR per constexpr values and array layouts, one
PTX text per arch) and the entry points ``.ptx()``, ``.ir()``, ``.resources()``, ``.sim[...]``
and ``kernel[grid, block, stream, shared_bytes](...)``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from kaio.errors import CompileError, LaunchError
from kaio.limits import check_dims
from kaio.types import ArrayType, ScalarType

DEFAULT_ARCH = "sm_90"
BACKENDS = ("ptx", "llvm")  # kaio.ptx (the default), kaio.llvm (LLVM's NVPTX, needs llvmlite)


class _Constexpr:
    """Annotation marker for compile-time parameters (``BM: kaio.constexpr``)."""

    def __repr__(self) -> str:
        return "kaio.constexpr"


constexpr = _Constexpr()


@dataclass
class LaunchConfig:
    """A parsed ``[grid, block, stream, shared_bytes]`` subscript; grid and block are 3-tuples
    (block None when the decorator's block_size applies)."""

    grid: tuple
    block: tuple | None
    stream: object = None
    shared_bytes: int = 0


def _dim3(value, what: str) -> tuple:
    if isinstance(value, int):
        value = (value,)
    if not isinstance(value, tuple | list) or not 1 <= len(value) <= 3:
        raise LaunchError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = []
    for v in value:
        if isinstance(v, bool):  # an int to Python, but never a dimension
            raise LaunchError(f"{what} must hold ints, got {value!r} (a bool)")
        if not isinstance(v, int):
            try:
                v = int(v.__index__())
            except AttributeError:
                raise LaunchError(f"{what} must hold ints, got {value!r}") from None
        if v < 1:
            raise LaunchError(f"{what} dimensions must be >= 1, got {tuple(value)}")
        dims.append(v)
    return tuple(dims) + (1,) * (3 - len(dims))


def parse_launch_config(config, default_block, name: str = "kernel") -> LaunchConfig:
    """Parse the launch subscript ``kernel[grid]``, ``[grid, block]`` or ``[grid, block,
    stream, shared_bytes]``, the same for the GPU and the simulator (``kernel.sim[...]``).

    The subscript is always read by position: Python passes ``kernel[(gx, gy)]`` as
    ``kernel[gx, gy]``, so that is grid ``gx`` with block ``gy``; a 2-D or 3-D grid alone is
    written ``kernel[(gx, gy),]`` (or ``kernel[(gx, gy), block]``). A block that contradicts
    the kernel's declared ``block_size`` (``default_block``) is a ``LaunchError``, as is an int
    stream that cannot be a stream handle (``kernel[(a, b, c)]`` read as grid, block, stream).
    Parsed once per subscript (``Kernel.__getitem__`` caches the result), never per launch.
    """
    if not isinstance(config, tuple):
        config = (config,)
    if not 1 <= len(config) <= 4:
        raise LaunchError(
            f"{name}: launch takes kernel[grid], [grid, block] or [grid, block, stream, "
            f"shared_bytes], got {len(config)} entries; a 2-D or 3-D grid is one tuple: "
            "kernel[(gx, gy), block] or kernel[(gx, gy),]"
        )
    grid = _dim3(config[0], "grid")
    block = _dim3(config[1], "block") if len(config) > 1 and config[1] is not None else None
    if default_block is not None:
        declared = _dim3(default_block, "block_size")
        if block is not None and block != declared:
            raise LaunchError(_contradiction(name, config, block, default_block))
        block = declared
    elif block is None:
        raise LaunchError(
            f"{name}: no block size: give one at launch (kernel[grid, block]) or in the "
            "decorator (@kaio.gpu_kernel(block_size=...))"
        )
    check_dims(name, grid, block)
    stream = config[2] if len(config) > 2 else None
    if isinstance(stream, int) and not isinstance(stream, bool) and 2 < stream < _MIN_HANDLE:
        first = ", ".join(map(repr, config[:3]))
        raise LaunchError(
            f"{name}: kernel[{first}] is read as [grid, block, stream], and {stream} is not a "
            f"stream handle (None, 0, 1, 2, a kaio.Stream or a CUstream pointer): for a 3-D "
            f"grid write kernel[({first}),]"
        )
    shared = config[3] if len(config) > 3 else 0
    if not isinstance(shared, int) or shared < 0:
        raise LaunchError(f"{name}: shared_bytes must be a non-negative int, got {shared!r}")
    return LaunchConfig(grid, block, stream, shared)


_MIN_HANDLE = 1 << 16  # a CUstream is a pointer; 0, 1, 2 are the driver's special streams


def _contradiction(name: str, config: tuple, block: tuple, declared) -> str:
    """The message for a launch block that is not the kernel's declared ``block_size``."""
    hint = "launch with that block, or leave the block out: kernel[grid]"
    if isinstance(config[0], int) and isinstance(config[1], int):
        n = 3 if len(config) == 3 else 2
        dims = ", ".join(map(repr, config[:n]))
        reading = "[grid, block, stream]" if n == 3 else "[grid, block]"
        hint = (
            f"Python reads kernel[({dims})] as kernel[{dims}] = {reading}: for a {n}-D grid "
            f"write kernel[({dims}),]; or {hint}"
        )
    return (
        f"{name}: launched with block {block}, but it declares "
        f"@kaio.gpu_kernel(block_size={declared!r}): {hint}"
    )


@dataclass
class Specialization:
    """One variant of a kernel: its constexpr values, array layouts, ``key`` (a hash of the
    sources and values that determine its code) and typed IR, ``function``, compiled on first
    use by ``build_ir``: a launch whose cubin is in the disk cache never needs it."""

    kernel: Kernel
    constexprs: dict
    layouts: tuple
    build_ir: Callable[[], object]
    key: str
    ptx_by_arch: dict = field(default_factory=dict)
    backend: str = "ptx"
    _function: object = None

    @property
    def function(self):
        """The optimized typed IR (compiled now if it was not yet)."""
        if self._function is None:
            with self.kernel._lock:
                if self._function is None:
                    self._function = self.build_ir()
        return self._function

    def ptx(self, arch: str) -> str:
        """The PTX text for ``arch``, compiled once (by ``kaio.ptx`` or ``kaio.llvm``)."""
        text = self.ptx_by_arch.get(arch)
        if text is None:
            if self.backend == "llvm":
                from kaio.llvm import emit
            else:
                from kaio.ptx import emit

            with self.kernel._lock:
                text = self.ptx_by_arch.get(arch)
                if text is None:
                    text = emit(self.function, arch)
                    self.ptx_by_arch[arch] = text
                    _dump(self, arch, text)
        return text


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Python's cyclic garbage collector paused while a kernel's IR is built: the build
    allocates a large graph of objects that stay alive, which every collection of the young
    generations would traverse again (a fifth of the build's time over the shipped kaio_ops
    specializations: tools/compile_digests.py). Reference counting still frees what dies
    meanwhile, and the collector runs again afterwards, unless it was off already."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _dump(spec: Specialization, arch: str, ptx: str) -> None:
    directory = os.environ.get("KAIO_DUMP_DIR")
    if not directory:
        return
    from kaio.ir.printer import format_function

    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f"{spec.function.name}.{spec.key[:12]}.{arch}")
    with open(stem + ".ptx", "w") as f:
        f.write(ptx)
    with open(stem + ".ir", "w") as f:
        f.write(format_function(spec.function))


def _flag(pyfunc, name: str, value) -> None:
    """A yes/no decorator option must be a bool (or 0/1): ``debug="no"`` would be true."""
    if value not in (True, False) or type(value).__name__ not in ("bool", "int", "bool_"):
        raise CompileError(
            f"@kaio.gpu_kernel({name}={value!r}) of {pyfunc.__name__}: {name} takes True or False"
        )


class Kernel:
    """A ``@kaio.gpu_kernel`` function: compile with ``.ptx()``, inspect with ``.ir()``, run
    with ``kernel[grid, block](...)`` on the GPU or ``kernel.sim[grid, block](...)`` on the CPU.
    """

    def __init__(
        self,
        pyfunc,
        block_size=None,
        arch: str | None = None,
        debug: bool = False,
        backend: str | None = None,
        fastmath: bool = False,
    ):
        self.pyfunc = pyfunc
        self.__name__ = pyfunc.__name__
        self.__doc__ = pyfunc.__doc__
        self.__wrapped__ = pyfunc
        if block_size is not None:
            _dim3(block_size, "block_size")  # a LaunchError now, not a TypeError at .ptx()
        self.block_size = block_size
        if arch is not None:  # a CompileError now, not at .ptx() (nor never, in the simulator)
            from kaio.ir.legality import Target

            Target.for_arch(arch)
        self.arch = arch
        _flag(pyfunc, "debug", debug)
        _flag(pyfunc, "fastmath", fastmath)
        self.debug = debug or os.environ.get("KAIO_DEBUG", "") not in ("", "0")
        self.backend = backend_name(backend)
        self.fastmath = bool(fastmath)  # approximate math (docs/dsl-reference.md, "Fast math")
        self._signature = inspect.signature(pyfunc)
        self.param_names = list(self._signature.parameters)
        from kaio.frontend.resolve import check_definition, signature

        self._annotation_signature = signature(pyfunc)
        self._annotations = self._complete(self._annotation_signature.template)
        check_definition(pyfunc, self._annotation_signature.template, "kernel")
        self.constexpr_names = [n for n, a in self._annotations.items() if a is constexpr]
        self._resolved: dict = {}  # dtype constexpr values -> annotations
        self._specs: dict = {}
        self._lock = threading.RLock()  # compiles of this kernel, one thread at a time
        self._launches: dict = {}  # launch subscript -> Launch.call
        self._launchers: dict = {}  # the runtime's per-argument-signature launchers

    # ----------------------------------------------------------------- arguments
    def _complete(self, resolved: dict) -> dict:
        return {
            name: resolved.get(name, inspect.Parameter.empty) for name in self._signature.parameters
        }

    def annotations(self, constexprs: dict | None = None) -> dict:
        """Each parameter's annotation, for these constexpr values: a dtype parameter
        (``DT: kaio.constexpr`` named in ``x: DT[:]``) replaced by its value."""
        generic = self._annotation_signature.generic
        if not generic or constexprs is None or any(n not in constexprs for n in generic):
            return self._annotations
        key = tuple(constexprs.get(n) for n in generic)
        found = self._resolved.get(key)
        if found is None:

            def error(message):
                raise LaunchError(message)

            found = self._complete(self._annotation_signature.resolve(constexprs, error))
            self._resolved[key] = found
        return found

    def array_params(self, constexprs: dict | None = None) -> list[str]:
        """Names of the parameters annotated as arrays, in order."""
        return [n for n, a in self.annotations(constexprs).items() if isinstance(a, ArrayType)]

    def runtime_params(self, constexprs: dict | None = None) -> list[tuple[str, object]]:
        """(name, annotation) of the parameters passed at launch (constexprs excluded), with
        dtype parameters replaced by their values in ``constexprs``."""
        return [
            (n, a) for n, a in self.annotations(constexprs).items() if n not in self.constexpr_names
        ]

    def split_args(self, args: tuple, kwargs: dict) -> tuple[list, dict]:
        """Bind launch arguments to parameters: (runtime values in order, constexpr dict)."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise LaunchError(f"{self.__name__}: {e}") from None
        values = []
        constexprs = {}
        for name in self.param_names:
            if name not in bound.arguments:
                raise LaunchError(f"{self.__name__}: missing argument {name!r}")
            if name in self.constexpr_names:
                constexprs[name] = bound.arguments[name]
            else:
                values.append(bound.arguments[name])
        return values, constexprs

    # ----------------------------------------------------------------- compiling
    def specialize(
        self, constexprs: dict | None = None, layouts: tuple | None = None, backend=None
    ):
        """The compiled variant for these constexpr values and array layouts ('C' contiguous,
        'A' any strides), its PTX from ``backend`` (default: the kernel's); compiled on first
        use, then cached."""
        constexprs = constexprs or {}
        if layouts is None:
            layouts = ("C",) * len(self.array_params())
        backend = backend_name(backend or self.backend)
        try:
            values = constexpr_key(constexprs)
        except TypeError:
            values = None  # an unhashable value: compiled each time, never cached
        cache_key = (values, layouts, self.debug, self.fastmath, backend)
        spec = self._specs.get(cache_key) if values is not None else None
        if spec is not None:
            return spec
        with self._lock:
            spec = self._specs.get(cache_key) if values is not None else None
            if spec is not None:
                return spec  # compiled by another thread meanwhile
            return self._compile(constexprs, layouts, cache_key, backend)

    def _compile(self, constexprs: dict, layouts: tuple, cache_key: tuple, backend: str):
        """Make and cache one specialization, its IR compiled on first use (``specialize``
        holds the kernel's lock)."""
        missing = [n for n in self.constexpr_names if n not in constexprs]
        if missing:
            raise LaunchError(
                f"{self.__name__}: constexpr parameter(s) {', '.join(missing)} need a value: "
                f"pass them as keywords, e.g. kernel.ptx({missing[0]}=...)"
            )
        unknown = [n for n in constexprs if n not in self.constexpr_names]
        if unknown:
            raise LaunchError(
                f"{self.__name__}: {', '.join(unknown)} is not a constexpr parameter of this "
                f"kernel (constexprs: {', '.join(self.constexpr_names) or 'none'})"
            )
        twin = (  # the same variant compiled for another backend: its IR is reused
            next((v for k, v in self._specs.items() if k[:-1] == cache_key[:-1]), None)
            if cache_key[0] is not None
            else None
        )
        constexprs = dict(constexprs)
        debug = self.debug  # the flag now, as the key has it, whenever the IR is built

        def build_ir():
            if twin is not None:  # the other backend's: the same IR (backends only read it)
                return twin.function
            from kaio.frontend import compile_kernel
            from kaio.ir.passes import optimize

            with _cyclic_gc_paused():
                function = compile_kernel(self, constexprs, layouts)
                optimize(function)
            if debug:
                function.meta["debug"] = True  # the PTX emitter adds bounds checks
            return function

        key = self._hash(constexprs, layouts, backend)
        spec = Specialization(self, constexprs, layouts, build_ir, key, backend=backend)
        if cache_key[0] is not None:
            self._specs[cache_key] = spec
        return spec

    def _hash(self, constexprs: dict, layouts: tuple, backend: str = "ptx") -> str:
        from kaio.frontend.resolve import compiler_fingerprint, dependency_sources

        h = hashlib.sha256()
        h.update(compiler_fingerprint().encode())
        for src in dependency_sources(self.pyfunc):
            h.update(src.encode())
            h.update(b"\0")
        values = [
            (k, constexpr_value_key(v) or ("unhashable", repr(v)))
            for k, v in sorted(constexprs.items(), key=lambda kv: kv[0])
        ]
        h.update(repr(values).encode())
        h.update(repr(layouts).encode())
        h.update(repr(self.block_size).encode())
        h.update(repr(self.debug).encode())
        if self.fastmath:
            h.update(b"fastmath")
        if backend != "ptx":
            h.update(f"backend={backend} {_backend_version(backend)}".encode())
        return h.hexdigest()

    def ptx(self, arch: str | None = None, backend: str | None = None, **constexprs) -> str:
        """Compile to PTX for ``arch`` (default: the decorator's arch, else sm_90) with
        ``backend`` (default: the kernel's, see ``BACKENDS``). Needs no GPU."""
        spec = self.specialize(constexprs, backend=backend)
        return spec.ptx(arch or self.arch or DEFAULT_ARCH)

    def use_backend(self, backend: str) -> None:
        """Compile and launch through ``backend`` (``"ptx"`` or ``"llvm"``) from now on.
        Launch objects taken before (``launch = kernel[grid, block]``) keep their code."""
        self.backend = backend_name(backend)
        self._launches.clear()
        self._launchers.clear()

    def ir(self, **constexprs) -> str:
        """The optimized typed IR, printed readably."""
        from kaio.ir.printer import format_function

        return format_function(self.specialize(constexprs).function)

    def resources(self, arch: str | None = None, **constexprs):
        """Registers, local (spill) bytes, shared bytes and max threads per block, read from
        the driver after loading the kernel on the current GPU."""
        from kaio.runtime.launch import resources

        return resources(self, arch, constexprs)

    def max_active_clusters(
        self, threads: int, shared_bytes: int = 0, *, device=None, arch: str | None = None,
        **constexprs,
    ) -> int:  # fmt: skip
        """How many clusters of this kernel (it declares ``kaio.cluster_dims``), with
        ``threads`` threads a block and ``shared_bytes`` of dynamic shared memory, can run at
        once on ``device`` (a ``kaio.Device``; default: the current GPU): the grid of a
        persistent kernel (``cuOccupancyMaxActiveClusters``)."""
        from kaio.runtime.launch import max_active_clusters

        return max_active_clusters(self, arch, constexprs, threads, shared_bytes, device)

    # ----------------------------------------------------------------- running
    def __getitem__(self, config):
        try:
            return self._launches[config]  # the host-side fast path: no re-parsing
        except (KeyError, TypeError):
            pass
        from kaio.runtime.launch import Launch

        # the Launch as a plain function (``.launch``, ``.kernel``, ``.config``): cheaper to call
        launch = Launch(self, parse_launch_config(config, self.block_size, self.__name__)).call
        try:
            if len(self._launches) < 64:
                self._launches[config] = launch
        except TypeError:
            pass  # an unhashable stream object: parse each time
        return launch

    @property
    def sim(self):
        """``kernel.sim[grid, block](*args)`` runs the kernel in the CPU simulator on NumPy
        arrays, modified in place."""
        from kaio.sim import SimLauncher

        return SimLauncher(self)

    def __call__(self, *args, **kwargs):
        raise LaunchError(
            f"{self.__name__} is a GPU kernel: launch it as {self.__name__}[grid, block](...) "
            f"or simulate it as {self.__name__}.sim[grid, block](...)"
        )

    def __repr__(self) -> str:
        return f"<kaio.Kernel {self.__name__}>"


def value_key(value):
    """A hashable key of a compile-time value by its type and its value, so that values
    Python calls equal but which compile differently stay apart: ``1``, ``1.0`` and
    ``True``; ``0.0`` and ``-0.0``; ``np.int32(4)`` and ``4``. Both caches of compiled
    variants use it: the in-memory one (the key itself) and the disk one (its ``repr``).
    Raises ``TypeError`` for an unhashable value of a type it does not know."""
    t = type(value)
    if value is None or t in (bool, int, float, complex, str, bytes):
        return (t.__name__, repr(value))
    if t is tuple or t is list:
        return (t.__name__, tuple(value_key(v) for v in value))
    if t.__module__ == "numpy" and hasattr(value, "tobytes"):  # a NumPy scalar
        return (f"numpy.{t.__name__}", repr(value), value.tobytes().hex())
    if isinstance(value, ScalarType):
        return ("ScalarType", value.name)
    hash(value)
    return (f"{t.__module__}.{t.__qualname__}", value)


def constexpr_value_key(value):
    """``value_key(value)``, or None for a value that has none (unhashable)."""
    try:
        return value_key(value)
    except TypeError:
        return None


def same_constexpr(value, key) -> bool:
    """Whether ``value`` has the ``constexpr_value_key`` ``key`` (never, for None): how a
    launcher built for one constexpr value recognizes it (by type and value)."""
    return key is not None and constexpr_value_key(value) == key


def constexpr_key(constexprs: dict) -> tuple:
    """The in-memory cache key of constexpr values: ``(name, value_key(value))`` pairs in
    name order (by type and value: ``1``, ``1.0`` and ``True`` are three variants). Raises
    ``TypeError`` for an unhashable value."""
    return tuple((k, value_key(v)) for k, v in sorted(constexprs.items(), key=lambda kv: kv[0]))


def _backend_version(backend: str) -> str:
    """The version of the code generator behind a non-default backend (llvmlite's for
    ``"llvm"``): another LLVM emits other PTX."""
    try:
        from importlib.metadata import version

        return f"llvmlite={version('llvmlite')}" if backend == "llvm" else ""
    except Exception:  # noqa: BLE001  (not installed: the compile fails anyway)
        return ""


def backend_name(backend: str | None) -> str:
    """A checked backend name; None means ``$KAIO_BACKEND``, else ``"ptx"``."""
    backend = backend or os.environ.get("KAIO_BACKEND") or "ptx"
    if backend not in BACKENDS:
        names = ", ".join(map(repr, BACKENDS))
        raise ValueError(f"backend must be one of {names}, got {backend!r}")
    return backend


def param_annotation_error(name: str, annotation) -> str:
    """The message for a parameter whose annotation is not a kaio type."""
    return (
        f"parameter {name!r} needs a kaio type annotation (f32, u32, f16[:], kaio.constexpr, "
        f"...), got {annotation!r}"
    )


def is_scalar_annotation(a) -> bool:
    """True for scalar type annotations."""
    return isinstance(a, ScalarType)
