"""``ArgInfo``: what a launch needs to know about one array argument, whatever library made it;
``RawArray``: a contiguous array given by its address, the cheapest argument to launch with."""

from __future__ import annotations

import struct

from kaio.types import ScalarType

__all__ = ["ArgInfo", "RawArray", "c_strides"]

_SIGNATURES: dict[tuple, tuple] = {}


def c_strides(shape: tuple) -> tuple:
    """Row-major strides, in elements, of ``shape``."""
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class ArgInfo:
    """A CUDA array seen by a launch: ``ptr``, ``shape``, ``strides`` (in ELEMENTS), ``dtype``
    (a kaio scalar type) and ``device`` (ordinal). ``contiguous`` may be given by a producer
    that knows it (torch's ``is_contiguous()``), so that its launch fast path and this agree.

    ``sig`` (dtype, ndim, contiguous, device) is interned, so launchers compare it with ``is``;
    ``abi_c`` and ``abi_a`` are the argument's launch-ABI entries for a contiguous ('C') and a
    strided ('A') specialization, already packed as the kernel parameters' bytes: the pointer
    (u64), the shape (i64 each), and for 'A' the strides (i64 each). A launch copies them in
    whole, which costs less than packing one integer at a time.
    """

    __slots__ = (
        "ptr",
        "shape",
        "strides",
        "dtype",
        "device",
        "contiguous",
        "sig",
        "abi_c",
        "abi_a",
    )

    def __init__(
        self,
        ptr: int,
        shape: tuple,
        strides: tuple,
        dtype: ScalarType,
        device: int,
        contiguous: bool | None = None,
    ):
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device
        if contiguous is None:
            contiguous = all(
                n == 1 or s == c for n, s, c in zip(shape, strides, c_strides(shape), strict=True)
            )
        self.contiguous = contiguous
        sig = (dtype, len(shape), self.contiguous, device)
        self.sig = _SIGNATURES.setdefault(sig, sig)
        n = len(shape)
        self.abi_c = struct.pack(f"=Q{n}q", ptr, *shape)
        self.abi_a = struct.pack(f"=Q{2 * n}q", ptr, *shape, *strides)

    @property
    def layout(self) -> str:
        """'C' for a row-major contiguous array, 'A' for any other strides."""
        return "C" if self.contiguous else "A"

    def __repr__(self) -> str:
        return (
            f"ArgInfo(ptr=0x{self.ptr:x}, shape={self.shape}, strides={self.strides}, "
            f"dtype={self.dtype}, device={self.device})"
        )


class RawArray:
    """A contiguous row-major array in GPU memory given by its address: ``ptr``, ``shape``,
    ``dtype`` (a kaio scalar type) and ``device`` (ordinal); ``owner`` is the object that
    owns the memory, kept alive with the reference.

    ``kaio_ops`` hands its kernels these instead of reshaped or retyped views of their
    arrays: a torch view costs 1 to 3 µs to make and as much again for the launcher to
    read, this a fraction of that. The caller vouches for the memory (no bounds or
    contiguity check is possible)."""

    __slots__ = ("ptr", "shape", "dtype", "device", "owner")

    def __init__(self, ptr: int, shape: tuple, dtype: ScalarType, device: int, owner=None):
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.owner = owner

    def info(self) -> ArgInfo:
        """The ``ArgInfo`` of this array."""
        return ArgInfo(self.ptr, self.shape, c_strides(self.shape), self.dtype, self.device, True)

    def __repr__(self) -> str:
        return (
            f"RawArray(ptr=0x{self.ptr:x}, shape={self.shape}, dtype={self.dtype}, "
            f"device={self.device})"
        )
