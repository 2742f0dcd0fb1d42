"""Template tables: how a table entry is chosen for a type and filled in.

Entries are keyed by type class (``"int"``, ``"uint"``, ``"float"`` for f32/f64, ``"f16"``,
``"bf16"``, ``"half"`` for both, ``"f16x2"``, ``"bf16x2"``, ``"packed"`` for both, ``"pred"``,
``"any"``). Templates use ``{d} {a} {b} {c}`` for
operands and ``{ty}`` (arithmetic type, ``s32`` for a narrow signed integer), ``{bt}`` (bit
type) and ``{st}`` (signed type of the register width). Which forms an arch has is not
decided here: ``kaio.ir.legality`` checked the kernel, and its ``native`` says where an
f16/bf16 op uses a fallback instead of its template.
"""

from __future__ import annotations

from kaio.ir.ops import integer_classes
from kaio.ptx.regs import bty, is_half, ity, sty
from kaio.types import ScalarType


def classes(t: ScalarType) -> tuple[str, ...]:
    """The table keys that may hold ``t``'s template, most specific first."""
    integer = integer_classes(t)
    if integer is not None:
        return integer
    if is_half(t):
        return (t.name, "half", "any")
    if t.is_packed:
        return (t.name, "packed", "any")
    return ("float", "any")


def fmt(template: str, t: ScalarType, **operands: str) -> str:
    """Fill a template for type ``t``."""
    return template.format(ty=ity(t), bt=bty(t), st=sty(t), **operands)


def pick(entry: dict, t: ScalarType) -> str | None:
    """The template of ``entry`` for ``t``; None when there is none."""
    for key in classes(t):
        if key in entry:
            return entry[key]
    return None
