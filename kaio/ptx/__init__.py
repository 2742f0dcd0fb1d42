"""IR to PTX: ``emit(fn, arch)`` returns the PTX module of one kernel.

Modules: ``target`` (archs, ``.version`` selection, feature table), ``regs`` (types to
registers and literals), ``templates`` and ``lowering`` (the op tables), ``memory`` (addresses,
loads, stores, atomics), ``emitter`` (the walker), ``ptxas`` (an optional local assembler,
for tests and resource reports).
"""

from __future__ import annotations

from kaio.ir.nodes import Function
from kaio.ptx.emitter import Emitter
from kaio.ptx.target import ARCHS, Target

__all__ = ["emit", "ARCHS"]


def emit(fn: Function, arch: str) -> str:
    """The PTX text of ``fn`` for ``arch`` (``"sm_80"``, ``"sm_90a"``...), with the lowest
    ``.version`` that the arch and the instructions used allow. Raises ``CompileError`` for an
    unknown arch or an operation the arch lacks."""
    return Emitter(fn, Target.for_arch(arch)).run()
