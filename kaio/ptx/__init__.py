"""IR to PTX: ``emit(fn, arch)`` returns the PTX module of one kernel.

Modules: ``regs`` (types to registers and literals), ``templates`` and ``lowering`` (the op
tables), ``memory`` (addresses, loads, stores, atomics), ``emitter`` (the walker), ``ptxas``
(an optional local assembler, for tests and resource reports). Archs, features and
``.version`` selection are ``kaio.ir.legality``'s, which checks a kernel before any backend.
"""

from __future__ import annotations

from kaio.ir.legality import ARCHS, check
from kaio.ir.nodes import Function
from kaio.ptx.emitter import Emitter

__all__ = ["emit", "ARCHS"]


def emit(fn: Function, arch: str) -> str:
    """The PTX text of ``fn`` for ``arch`` (``"sm_80"``, ``"sm_90a"``...), with the lowest
    ``.version`` that the arch and the instructions used allow. Raises ``CompileError`` for an
    unknown arch or an operation the arch lacks (``kaio.ir.legality.check``)."""
    return Emitter(fn, check(fn, arch)).run()
