"""One kernel source, one compiled kernel per element type.

A kaio kernel's array parameters carry their element type in the annotation (``x: f16[:]``).
The ops are written once against a module-level placeholder, ``DT``, and ``by_dtype(kernel)``
gives the kernel compiled with ``DT`` bound to f32, f16 or bf16: a copy of the Python function
whose globals have ``DT`` replaced, and so have the device functions it calls (transitively).
The placeholder is a module-level dtype, which is part of each kernel's cache key.

Transitional: the ops are moving to dtype constexprs (``DT: kaio.constexpr``). A device
function shared with a module still on ``by_dtype`` takes ``DT`` as a constexpr parameter
with a default; a variant's copy of it gets the variant's type as that default, so the old
callers, which do not pass ``DT``, keep working. This module goes once no op uses it.
"""

from __future__ import annotations

import inspect
import types

from kaio.decorators import DeviceFunction
from kaio.kernel import Kernel
from kaio.types import ScalarType

__all__ = ["by_dtype", "PLACEHOLDER"]

PLACEHOLDER = "DT"


def _copy(pyfunc, subs: dict, memo: dict):
    """``pyfunc`` with the names in ``subs`` rebound in its globals, device functions too."""
    done = memo.get(pyfunc)
    if done is not None:
        return done
    scope = dict(pyfunc.__globals__)
    copy = types.FunctionType(
        pyfunc.__code__, scope, pyfunc.__name__, _defaults(pyfunc, subs), pyfunc.__closure__
    )
    copy.__annotations__ = dict(pyfunc.__annotations__)
    copy.__qualname__ = pyfunc.__qualname__
    copy.__doc__ = pyfunc.__doc__
    memo[pyfunc] = copy
    scope.update(subs)
    for name, value in pyfunc.__globals__.items():
        if isinstance(value, DeviceFunction) and _generic(value.pyfunc):
            scope[name] = DeviceFunction(_copy(value.pyfunc, subs, memo))
    return copy


def _generic(pyfunc) -> bool:
    """Whether ``pyfunc`` depends on the placeholder: through its module's global or as a
    parameter (a dtype constexpr)."""
    return PLACEHOLDER in pyfunc.__globals__ or PLACEHOLDER in inspect.signature(pyfunc).parameters


def _defaults(pyfunc, subs: dict):
    """``pyfunc``'s default values with those of the parameters named in ``subs`` (a dtype
    constexpr defaulting for callers still on by_dtype) replaced by the variant's."""
    defaults = pyfunc.__defaults__
    if not defaults:
        return defaults
    code = pyfunc.__code__
    names = code.co_varnames[code.co_argcount - len(defaults) : code.co_argcount]
    return tuple(subs.get(n, d) for n, d in zip(names, defaults, strict=True))


class by_dtype:  # noqa: N801  (reads like a function at the use site)
    """``by_dtype(kernel)[f16]``: ``kernel`` compiled with its module's ``DT`` bound to f16.
    Keyword arguments name other module globals to rebind, each a function of the dtype
    (``by_dtype(k, ACC=lambda t: i32 if t.itemsize == 1 else f32)``).

    Variants are built on first use and kept; the one for the placeholder's own value is the
    kernel itself.
    """

    def __init__(self, kernel: Kernel, **derived):
        self.kernel = kernel
        self.derived = derived  # other module globals, as functions of the dtype
        self._variants: dict[ScalarType, Kernel] = {}

    def __getitem__(self, dtype: ScalarType) -> Kernel:
        variant = self._variants.get(dtype)
        if variant is None:
            k = self.kernel
            subs = {PLACEHOLDER: dtype, **{n: f(dtype) for n, f in self.derived.items()}}
            if all(k.pyfunc.__globals__.get(n) is v for n, v in subs.items()):
                variant = k
            else:
                pyfunc = _copy(k.pyfunc, subs, {})
                variant = Kernel(
                    pyfunc, block_size=k.block_size, arch=k.arch, debug=k.debug, fastmath=k.fastmath
                )
            self._variants[dtype] = variant
        return variant

    def __repr__(self) -> str:
        return f"<by_dtype {self.kernel.__name__}>"
