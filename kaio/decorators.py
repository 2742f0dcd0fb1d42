"""``@kaio.gpu_kernel`` and ``@kaio.gpu_func``."""

from __future__ import annotations

from kaio.kernel import Kernel


class DeviceFunction:
    """A ``@kaio.gpu_func``: callable from kernels and other device functions, where it is
    inlined. Calling it from host code is an error."""

    def __init__(self, pyfunc):
        from kaio.frontend.resolve import check_definition

        raw = getattr(pyfunc, "__annotations__", {})
        params = {n: a for n, a in raw.items() if n != "return"}
        check_definition(pyfunc, params, "device function", defaults_allowed=True)
        self.pyfunc = pyfunc
        self.__name__ = pyfunc.__name__
        self.__doc__ = pyfunc.__doc__
        self.__wrapped__ = pyfunc

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self.__name__} is a @kaio.gpu_func: call it from a @kaio.gpu_kernel, "
            "not from host code"
        )

    def __repr__(self) -> str:
        return f"<kaio.gpu_func {self.__name__}>"


def gpu_kernel(
    fn=None,
    *,
    block_size=None,
    arch: str | None = None,
    debug: bool = False,
    backend: str | None = None,
    fastmath: bool = False,
):
    """Compile a typed Python function into a GPU kernel.

    Use bare (``@kaio.gpu_kernel``) or with options (``@kaio.gpu_kernel(block_size=256)``):
    ``block_size`` is the default block (an int or a tuple of up to 3 ints), ``arch`` the
    default PTX target of ``.ptx()``, ``debug`` turns on bounds checks, ``backend`` picks the
    code generator: ``"ptx"`` (kaio's emitter, the default) or ``"llvm"`` (LLVM's NVPTX
    backend through llvmlite: ``pip install 'kaio[llvm]'``); ``$KAIO_BACKEND`` sets the default.
    ``fastmath=True`` makes exp, exp2, log, log2, sin, cos, rsqrt and f32 division the
    subnormal-flushing approximations (``.ftz``; docs/dsl-reference.md, "Fast math").
    """

    def wrap(f):
        if isinstance(f, Kernel | DeviceFunction):
            raise TypeError(f"{f.__name__} is already decorated")
        return Kernel(
            f, block_size=block_size, arch=arch, debug=debug, backend=backend, fastmath=fastmath
        )

    return wrap(fn) if fn is not None else wrap


def gpu_func(fn=None):
    """Mark a typed Python function as a device function, inlined where kernels call it."""

    def wrap(f):
        return DeviceFunction(f)

    return wrap(fn) if fn is not None else wrap
