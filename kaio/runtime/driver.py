"""The CUDA driver, thinly wrapped: the bindings, error checking, initialization, the driver
version and the PTX ISA versions it loads, and libcuda itself through ctypes for the two hot or
pointer-heavy calls (kernel launch, JIT linking).

Every ``CUresult`` other than success becomes a ``kaio.CudaError`` carrying the error's name and
the driver's text. Nothing here runs at import time: machines without a driver can import kaio.
"""

from __future__ import annotations

import ctypes
import re

from kaio.errors import CudaError


class _Bindings:
    """``cu``: cuda-bindings' driver module, imported on first use rather than with kaio
    (it takes a good part of a second to import). Each name is looked up once, then kept on
    this object, so later uses are plain attribute reads."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(_driver_module(), name)
        setattr(self, name, value)
        return value


def _driver_module():
    try:  # cuda-bindings >= 12.6 and 13.x
        from cuda.bindings import driver
    except ImportError:  # pragma: no cover - cuda-python 12.x before the cuda.bindings package
        from cuda import cuda as driver
    return driver


cu = _Bindings()

__all__ = [
    "cu",
    "check",
    "cuda_error",
    "error_name_text",
    "init",
    "driver_version",
    "format_version",
    "ptx_isa_of",
    "max_ptx_isa",
    "check_ptx_supported",
    "libcuda",
    "last_launched",
    "last_launched_slot",
]

# GPU faults: sticky errors that surface at the next synchronizing call after a bad kernel.
_FAULTS = {
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
}

# stream handle -> a one-element list holding the name of the kernel launched last on it, to
# name the culprit of a GPU fault. A launcher fetches its stream's list once and writes the name
# into it with one store per launch.
last_launched: dict[int | None, list] = {}


def last_launched_slot(stream: int | None) -> list:
    """The one-element list in which launches on ``stream`` record their kernel's name."""
    return last_launched.setdefault(stream, [None])


def error_name_text(code: int) -> tuple[str, str]:
    """The name (``CUDA_ERROR_ILLEGAL_ADDRESS``) and the driver's description of a CUresult."""
    try:
        name = cu.CUresult(int(code)).name
    except ValueError:
        name = f"CUresult {int(code)}"
    try:
        err, text = cu.cuGetErrorString(cu.CUresult(int(code)))
        text = text.decode() if err == cu.CUresult.CUDA_SUCCESS and text else ""
    except Exception:  # no libcuda to ask: the name alone still says what happened
        text = ""
    return name, text


def cuda_error(code: int, what: str = "", stream: int | None = None) -> CudaError:
    """The ``CudaError`` for a failed driver call ``what``; a GPU fault names the kernel(s)
    launched last (on ``stream`` when given) since the fault belongs to one of them."""
    name, text = error_name_text(code)
    message = f"{what}: {name}" if what else name
    if text:
        message += f" ({text})"
    if name in _FAULTS:
        names = {s: slot[0] for s, slot in last_launched.items() if slot[0] is not None}
        if stream is not None and stream in names:
            message += f"; last kernel launched on this stream: {names[stream]}"
        elif names:
            culprits = ", ".join(sorted(set(names.values())))
            message += f"; kernels launched last (one per stream): {culprits}"
        message += (
            ". The CUDA context is now unusable: restart the process; run the kernel under "
            "kernel.sim[...] to find out-of-bounds accesses"
        )
    return CudaError(message, name, int(code))


def check(result, what: str = "", stream: int | None = None):
    """Unpack a cuda-bindings result tuple ``(CUresult, *values)``: raise ``CudaError`` on
    failure, else return None, the single value, or the tuple of values."""
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise cuda_error(int(err), what, stream)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


_initialized = False


def init() -> None:
    """``cuInit`` once per process; a missing driver or GPU raises a ``CudaError`` that says
    so and names the CPU alternative."""
    global _initialized
    if _initialized:
        return
    try:
        result = cu.cuInit(0)
    except Exception as e:  # the bindings raise when libcuda.so cannot be loaded at all
        raise CudaError(
            f"no NVIDIA driver found ({e}). Install the NVIDIA driver to run kernels on a GPU, "
            "or run them on the CPU with kernel.sim[grid, block](...) or `with kaio.simulate():`",
            "CUDA_ERROR_NO_DEVICE",
            100,
        ) from None
    check(result, "cuInit (is an NVIDIA GPU visible to this process?)")
    _initialized = True


def driver_version() -> int:
    """The CUDA version the driver supports, as ``1000 * major + 10 * minor`` (12080 = 12.8)."""
    init()
    return check(cu.cuDriverGetVersion(), "cuDriverGetVersion")


def format_version(version: int) -> str:
    """``12080`` -> ``"12.8"``."""
    return f"{version // 1000}.{version % 1000 // 10}"


# The first CUDA driver that loads each PTX ISA version (PTX ISA release notes).
_PTX_MIN_DRIVER = {
    (7, 0): 11000,
    (7, 1): 11010,
    (7, 2): 11020,
    (7, 3): 11030,
    (7, 4): 11040,
    (7, 5): 11050,
    (7, 6): 11060,
    (7, 7): 11070,
    (7, 8): 11080,
    (8, 0): 12000,
    (8, 1): 12010,
    (8, 2): 12020,
    (8, 3): 12030,
    (8, 4): 12040,
    (8, 5): 12050,
    (8, 6): 12070,
    (8, 7): 12080,
    (8, 8): 12090,
    (9, 0): 13000,
    (9, 1): 13010,
}

_VERSION_LINE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)


def ptx_isa_of(ptx: str) -> tuple[int, int]:
    """The ``.version`` of a PTX text as ``(major, minor)``."""
    m = _VERSION_LINE.search(ptx)
    if m is None:
        raise ValueError("PTX text has no .version directive")
    return int(m.group(1)), int(m.group(2))


def max_ptx_isa(version: int) -> tuple[int, int]:
    """The newest PTX ISA a driver of CUDA ``version`` (e.g. 12080) loads: 12.6 -> (8, 5),
    12.8 -> (8, 7), 13.0 -> (9, 0)."""
    loadable = [isa for isa, first in _PTX_MIN_DRIVER.items() if first <= version]
    return max(loadable) if loadable else (6, 0)


def check_ptx_supported(ptx: str, version: int, kernel_name: str = "") -> None:
    """Refuse, before loading, PTX whose ``.version`` the driver of CUDA ``version`` cannot
    load, saying which driver it needs. PTX newer than this table is left to the driver."""
    isa = ptx_isa_of(ptx)
    needed = _PTX_MIN_DRIVER.get(isa)
    if needed is None or version >= needed:
        return
    top = max_ptx_isa(version)
    what = f"kernel {kernel_name}" if kernel_name else "this kernel"
    raise CudaError(
        f"{what} is PTX ISA {isa[0]}.{isa[1]}, which needs an NVIDIA driver for CUDA "
        f"{format_version(needed)} or newer; this driver supports CUDA {format_version(version)} "
        f"(PTX ISA up to {top[0]}.{top[1]}). Update the NVIDIA driver, or compile for an older "
        "arch (@kaio.gpu_kernel(arch=...)) if the kernel's instructions allow it",
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        int(cu.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
    )


_libcuda: ctypes.CDLL | None = None


def libcuda() -> ctypes.CDLL:
    """libcuda through ctypes (the same library the bindings use), with the prototypes of the
    calls kaio makes directly: ``cuLaunchKernel``, ``cuModuleLoadDataEx`` (the JIT's log) and
    ``cuPointerGetAttribute``."""
    global _libcuda
    if _libcuda is None:
        init()
        lib = ctypes.CDLL("libcuda.so.1")
        p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        pp = ctypes.POINTER(p)
        lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, pp, pp]
        lib.cuLaunchKernel.restype = i
        lib.cuModuleLoadDataEx.argtypes = [pp, ctypes.c_char_p, u, ctypes.POINTER(i), pp]
        lib.cuModuleLoadDataEx.restype = i
        lib.cuPointerGetAttribute.argtypes = [p, i, ctypes.c_uint64]
        lib.cuPointerGetAttribute.restype = i
        _libcuda = lib
    return _libcuda
