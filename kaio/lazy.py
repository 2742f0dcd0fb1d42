"""Lazy names for a package: a module ``__getattr__`` (PEP 562) that imports what a name
refers to on first use, so that ``import kaio`` stays cheap (no cuda-bindings, no simulator
engine, no PTX emitter until something needs them) while ``kaio.Device``,
``from kaio.runtime import Device`` and the like keep working."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, where: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: ``where`` maps each lazy name to
    ``"module"`` (the name is that module's attribute of the same name) or
    ``"module:attribute"``. A name found is stored in ``namespace`` (the package's globals),
    so each is imported once; a submodule of the package is imported by its name too."""

    def __getattr__(name: str):
        target = where.get(name)
        if target is None:
            if name.startswith("__"):
                raise AttributeError(name)
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            module, _, attribute = target.partition(":")
            value = getattr(importlib.import_module(module), attribute or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
