"""IR to PTX through LLVM's NVPTX backend (llvmlite): the second lowering of kaio's IR.

``emit(fn, arch)`` returns PTX like ``kaio.ptx.emit`` does, compiled by LLVM instead of the
hand-written emitter; ``llvm_ir(fn, arch)`` the LLVM IR, before or after optimization. Kernels
choose it with ``@kaio.gpu_kernel(backend="llvm")``, ``kernel.ptx(backend="llvm")`` or the
environment variable ``KAIO_BACKEND=llvm``.

llvmlite is an optional dependency (``pip install 'kaio[llvm]'``); without it these functions
raise ``LLVMUnavailable`` saying so. Modules: ``typemap`` (types and constants), ``codegen``
(the walker: values, arrays, control flow), ``lowering`` (the op table), ``memory``, ``tensor``,
``packed`` and ``hopper`` (like their ``kaio.ptx`` namesakes), ``machine`` (LLVM's pipeline and
the NVPTX target machine). docs/llvm-backend.md describes the lowering.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from contextlib import contextmanager

from kaio.ir.nodes import Function

__all__ = ["emit", "llvm_ir", "available", "using", "LLVMUnavailable"]

MISSING = (
    "backend='llvm' compiles through llvmlite, which is not installed: "
    "pip install 'kaio[llvm]' (or pip install llvmlite), or use the default backend='ptx'"
)


class LLVMUnavailable(ImportError):
    """backend='llvm' was asked for, but llvmlite cannot be imported."""


def available() -> bool:
    """True when llvmlite can be imported (backend='llvm' works)."""
    try:
        import llvmlite.binding  # noqa: F401
    except ImportError:
        return False
    return True


def _machine():
    try:
        machine = importlib.import_module("kaio.llvm.machine")
    except ImportError as e:
        if (e.name or "").split(".")[0] == "llvmlite":
            raise LLVMUnavailable(MISSING) from None
        raise
    return machine


def emit(fn: Function, arch: str) -> str:
    """The PTX text of ``fn`` for ``arch``, compiled by LLVM's NVPTX backend. Raises
    ``CompileError`` as ``kaio.ptx.emit`` does, ``LLVMUnavailable`` without llvmlite."""
    return _machine().emit(fn, arch)


def llvm_ir(fn: Function, arch: str, optimized: bool = True) -> str:
    """The LLVM IR of ``fn`` for ``arch``: as lowered, or after LLVM's -O3 pipeline."""
    machine = _machine()
    if not optimized:
        return machine.lower(fn, arch)[0]
    return str(machine.optimize(fn, arch)[0])


@contextmanager
def using(kernels: Iterable, backend: str):
    """Within the block, ``kernels`` (``kaio.Kernel`` objects, e.g. those an op library
    launches) compile and launch through ``backend``; their own backends come back after."""
    kernels = list({id(k): k for k in kernels}.values())
    before = [k.backend for k in kernels]
    for k in kernels:
        k.use_backend(backend)
    try:
        yield
    finally:
        for k, b in zip(kernels, before, strict=True):
            k.use_backend(b)
