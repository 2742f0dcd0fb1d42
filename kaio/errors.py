"""The exceptions kaio raises: each says what went wrong, where, and what to do instead."""

from __future__ import annotations

import linecache


def _source_excerpt(filename: str, lineno: int, col: int) -> str:
    line = linecache.getline(filename, lineno).rstrip("\n") if filename else ""
    if not line:
        return ""
    return f"\n    {line}\n    {' ' * col}^"


class CompileError(Exception):
    """A kernel is outside the DSL's subset or ill-typed.

    The message reads ``file.py:LINE:COL: error: ...`` followed by the source line and a caret;
    ``filename``, ``lineno`` (1-based) and ``col`` (0-based) are kept as attributes.
    """

    def __init__(self, message: str, filename: str = "", lineno: int = 0, col: int = 0):
        self.message = message
        self.filename = filename
        self.lineno = lineno
        self.col = col
        if filename:
            text = f"{filename}:{lineno}:{col + 1}: error: {message}"
            text += _source_excerpt(filename, lineno, col)
        else:
            text = f"error: {message}"
        super().__init__(text)


class KaioWarning(UserWarning):
    """A kernel compiles but probably does not do what it says (the base of kaio's warnings;
    filter them with ``warnings.filterwarnings("error", category=kaio.KaioWarning)``)."""


class UnsignedComparisonWarning(KaioWarning):
    """A comparison of an unsigned value with a negative literal (``n > -1`` for a u32 ``n``):
    the literal becomes a huge unsigned number, so the result is constant, as C compilers
    warn. The message reads ``file.py:LINE:COL: warning: ...``."""


class LaunchError(Exception):
    """A launch was refused before anything ran: bad grid or block, arguments or devices."""


class CudaError(Exception):
    """The CUDA driver reported an error; ``name`` is the CUresult name (e.g.
    ``CUDA_ERROR_ILLEGAL_ADDRESS``) and ``code`` its number."""

    def __init__(self, message: str, name: str = "", code: int = -1):
        self.name = name
        self.code = code
        super().__init__(message)


class OutOfBoundsError(CudaError):
    """A kernel compiled in debug mode (``@kaio.gpu_kernel(debug=True)`` or ``KAIO_DEBUG=1``)
    indexed an array out of bounds on the GPU. The thread stopped before the access; the
    message names the kernel, the array and its shape, the index, the thread, the block and the
    source line, which are also kept as ``kernel``, ``array``, ``shape``, ``index``,
    ``thread``, ``block``, ``filename`` and ``lineno``. The CUDA context stays usable."""

    def __init__(self, message: str, **details):
        super().__init__(message, "KAIO_OUT_OF_BOUNDS", -1)
        self.kernel = details.get("kernel", "")
        self.array = details.get("array", "")
        self.shape = details.get("shape", ())
        self.index = details.get("index", ())
        self.thread = details.get("thread", ())
        self.block = details.get("block", ())
        self.filename = details.get("filename", "")
        self.lineno = details.get("lineno", 0)


class SimulationError(Exception):
    """The CPU simulator found an error: an out-of-bounds access, a barrier or shuffle in
    divergent code, a shared-memory race, or an ordinary shared store read by ``wgmma`` or
    ``bulk_store`` (or a shared element stored or read, then overwritten by a TMA copy)
    without ``fence_proxy_async()``. The message names the kernel's source line, the array,
    the index, the thread and the block."""
