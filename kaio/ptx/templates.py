"""Template tables: how a table entry is chosen for a type and filled in.

Entries are keyed by type class (``"int"``, ``"uint"``, ``"float"`` for f32/f64, ``"f16"``,
``"bf16"``, ``"half"`` for both, ``"f16x2"``, ``"bf16x2"``, ``"packed"`` for both, ``"pred"``,
``"any"``). Templates use ``{d} {a} {b} {c}`` for
operands and ``{ty}`` (arithmetic type, ``s32`` for a narrow signed integer), ``{bt}`` (bit
type) and ``{st}`` (signed type of the register width). A ``(template, feature)`` pair is used
only when the arch has the feature (``kaio.ptx.target.FEATURES``).
"""

from __future__ import annotations

from kaio.ptx.regs import bty, is_half, ity, sty
from kaio.types import ScalarType


def classes(t: ScalarType) -> tuple[str, ...]:
    """The table keys that may hold ``t``'s template, most specific first."""
    if t.is_bool:
        return ("pred", "any")
    if t.kind == "uint":
        return ("uint", "int", "any")
    if t.is_int:
        return ("int", "any")
    if is_half(t):
        return (t.name, "half", "any")
    if t.is_packed:
        return (t.name, "packed", "any")
    return ("float", "any")


def fmt(template: str, t: ScalarType, **operands: str) -> str:
    """Fill a template for type ``t``."""
    return template.format(ty=ity(t), bt=bty(t), st=sty(t), **operands)


def pick(e, entry: dict, t: ScalarType, builtin: str) -> str | None:
    """The template of ``entry`` for ``t``, recording the feature it needs. None when there is
    none, or when an f16/bf16 form needs a feature the arch lacks (the caller then computes in
    f32 or loops); for other types a missing feature raises CompileError."""
    for key in classes(t):
        if key in entry:
            template = entry[key]
            break
    else:
        return None
    if isinstance(template, tuple):
        template, feature = template
        if is_half(t) and not e.target.has(feature):
            return None
        e.target.require(feature, builtin, e.loc)
    return template
