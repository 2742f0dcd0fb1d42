"""Scalar and array types of the DSL, and the promotion rules of shared/API.md.

Every scalar type is one ``ScalarType`` instance (``kaio.f32``, ``kaio.u32``...). Calling one
inside a kernel converts a value; outside a kernel it converts a Python or NumPy value to the
matching NumPy scalar. Indexing one (``f32[:, :]``) gives the ``ArrayType`` used to annotate
array parameters.

``f16x2`` and ``bf16x2`` are packed pairs: one 32-bit value holding two f16 (bf16) numbers,
element 0 in the low 16 bits, as in PTX. Their kind is ``"packed"``: they are neither floats
nor integers, take part in no promotion, and live in NumPy as ``uint32`` bit patterns
(``kaio.f16x2(1.0, 2.0)`` on the host gives that pattern).

``e4m3`` and ``e5m2`` (aliases ``f8e4m3``, ``f8e5m2``) are the 8-bit floats of sm_89+ tensor
cores (``ml_dtypes.float8_e4m3fn``: no infinities, NaN ``S.1111.111``, largest 448;
``ml_dtypes.float8_e5m2``: IEEE-like, largest 57344). Their kind is ``"fp8"``: storage types
that arrays hold and conversions read and write (to and from f32, f16, bf16: see
``kaio.lang_fp8``), with no arithmetic and no promotion.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from kaio.numerics import round_f64, to_fp8  # one rounding (NumPy's bf16 casts round twice)

__all__ = [
    "ScalarType",
    "ArrayType",
    "i8",
    "u8",
    "i16",
    "u16",
    "i32",
    "u32",
    "i64",
    "u64",
    "f16",
    "bf16",
    "f32",
    "f64",
    "bool_",
    "f16x2",
    "bf16x2",
    "e4m3",
    "e5m2",
    "f8e4m3",
    "f8e5m2",
    "SCALAR_TYPES",
    "FP8_TYPES",
    "is_scalar_type_name",
    "scalar_type",
    "PACKED_TYPES",
    "promote",
    "literal_type",
    "from_numpy_dtype",
]


@dataclass(frozen=True, eq=True)
class ScalarType:
    """A scalar type of the DSL.

    ``kind`` is one of ``"int"`` (signed), ``"uint"``, ``"float"``, ``"bool"``,
    ``"packed"`` (f16x2, bf16x2) or ``"fp8"`` (e4m3, e5m2);
    ``ptx`` is the PTX type suffix used for loads, stores and arithmetic (``"s32"``, ``"f32"``,
    ``"bf16"``, ``"pred"``).
    """

    name: str
    bits: int
    kind: str
    ptx: str
    numpy_name: str

    # Types are hashed and compared on every op call (dispatch tables, argument checks): the
    # hash is computed once and equality tries identity first, as the module's constants are
    # the types almost every comparison sees.
    def __post_init__(self) -> None:
        fields = (self.name, self.bits, self.kind, self.ptx, self.numpy_name)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if type(other) is not ScalarType:
            return NotImplemented
        return (
            self.name == other.name
            and self.bits == other.bits
            and self.kind == other.kind
            and self.ptx == other.ptx
            and self.numpy_name == other.numpy_name
        )

    @property
    def np_dtype(self) -> np.dtype:
        """The NumPy dtype holding values of this type (ml_dtypes.bfloat16 for bf16)."""
        if self.name == "bf16":
            return np.dtype(ml_dtypes.bfloat16)
        if self.kind == "fp8":
            return np.dtype(getattr(ml_dtypes, self.numpy_name))
        return np.dtype(self.numpy_name)

    @property
    def is_float(self) -> bool:
        """True for f16, bf16, f32 and f64."""
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """True for signed and unsigned integers (not bool)."""
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        """True for signed integers and floats."""
        return self.kind in ("int", "float")

    @property
    def is_bool(self) -> bool:
        """True for ``bool_``."""
        return self.kind == "bool"

    @property
    def is_packed(self) -> bool:
        """True for the packed pairs ``f16x2`` and ``bf16x2``."""
        return self.kind == "packed"

    @property
    def is_fp8(self) -> bool:
        """True for the 8-bit floats ``e4m3`` and ``e5m2`` (storage and conversion only)."""
        return self.kind == "fp8"

    @property
    def element(self) -> ScalarType:
        """The type of each half of a packed pair (f16 for f16x2, bf16 for bf16x2)."""
        if not self.is_packed:
            raise TypeError(f"{self.name} is not a packed type")
        return SCALAR_TYPES[self.name[:-2]]

    @property
    def itemsize(self) -> int:
        """Bytes one element takes in memory (bool takes one byte)."""
        return max(1, self.bits // 8)

    def __getitem__(self, dims) -> ArrayType | InvalidAnnotation:
        """``f32[:]``, ``f32[:, :]``: an array parameter type. Anything else (``f32[0]``,
        ``f16x2[:]``) gives an ``InvalidAnnotation``, which the kernel reports as a located
        CompileError at decoration, with or without ``from __future__ import annotations``."""
        if self.is_packed:
            return InvalidAnnotation(
                f"{self.name} cannot annotate an array parameter: declare it u32[:] and read "
                f"elements with kaio.bitcast(x[i], kaio.{self.name}) (shared and local arrays of "
                f"{self.name} are fine)"
            )
        if not isinstance(dims, tuple):
            dims = (dims,)
        for d in dims:
            if not (isinstance(d, slice) and d == slice(None)):
                return InvalidAnnotation(
                    f"array annotations are written {self.name}[:], {self.name}[:, :] (one ':' "
                    f"per dimension), got {self.name}[{', '.join(map(_slice_text, dims))}]"
                )
        return ArrayType(self, len(dims))

    def __call__(self, value, *more):
        """Convert a host value to this type (in kernels the frontend handles the call).

        A packed type takes ``(lo, hi)`` or one value for both halves and returns the packed
        bits as ``numpy.uint32``, each half rounded once to nearest even."""
        if self.is_packed:
            return pack_host(self, value, *more)
        if self.is_fp8 and not more:
            return to_fp8(np.asarray(value, np.float64), self)[()]
        if more:
            raise TypeError(f"{self.name}() takes one value")
        with np.errstate(over="ignore"):  # out of a float type's range: inf, as cvt gives
            return self.np_dtype.type(value)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


def _slice_text(d) -> str:
    if isinstance(d, slice):
        parts = ["" if x is None else repr(x) for x in (d.start, d.stop, d.step)]
        return ":".join(parts[:2] if d.step is None else parts)
    return repr(d)


@dataclass(frozen=True)
class InvalidAnnotation:
    """A malformed array annotation (``f32[0]``, ``f16x2[:]``): ``message`` says why. Kernels
    and device functions report it as a CompileError at the parameter."""

    message: str

    def __repr__(self) -> str:
        return "<invalid kaio annotation>"


@dataclass(frozen=True, eq=True)
class ArrayType:
    """A global-memory array parameter type: element type and number of dimensions."""

    dtype: ScalarType
    ndim: int

    def __repr__(self) -> str:
        return f"{self.dtype.name}[{', '.join([':'] * self.ndim)}]"

    __str__ = __repr__


class TensorMapType:
    """The annotation of a TMA tensor-map kernel parameter (``m: kaio.tensormap``): the
    128-byte ``CUtensorMap`` a ``kaio.TensorMap`` carries, passed by value (PTX ``.param .align
    64 .b8 m[128]``) and used only by ``kaio.tma_load_2d``. docs/hopper.md."""

    def __repr__(self) -> str:
        return "kaio.tensormap"

    __str__ = __repr__


tensormap = TensorMapType()


i8 = ScalarType("i8", 8, "int", "s8", "int8")
u8 = ScalarType("u8", 8, "uint", "u8", "uint8")
i16 = ScalarType("i16", 16, "int", "s16", "int16")
u16 = ScalarType("u16", 16, "uint", "u16", "uint16")
i32 = ScalarType("i32", 32, "int", "s32", "int32")
u32 = ScalarType("u32", 32, "uint", "u32", "uint32")
i64 = ScalarType("i64", 64, "int", "s64", "int64")
u64 = ScalarType("u64", 64, "uint", "u64", "uint64")
f16 = ScalarType("f16", 16, "float", "f16", "float16")
bf16 = ScalarType("bf16", 16, "float", "bf16", "bfloat16")
f32 = ScalarType("f32", 32, "float", "f32", "float32")
f64 = ScalarType("f64", 64, "float", "f64", "float64")
bool_ = ScalarType("bool_", 8, "bool", "pred", "bool")
f16x2 = ScalarType("f16x2", 32, "packed", "b32", "uint32")
bf16x2 = ScalarType("bf16x2", 32, "packed", "b32", "uint32")

SCALAR_TYPES: dict[str, ScalarType] = {
    t.name: t for t in (i8, u8, i16, u16, i32, u32, i64, u64, f16, bf16, f32, f64, bool_)
}

# Packed pairs are not in SCALAR_TYPES: their NumPy dtype (uint32) is u32's.
PACKED_TYPES: dict[str, ScalarType] = {t.name: t for t in (f16x2, bf16x2)}

# The 8-bit floats are not in SCALAR_TYPES either: no arithmetic, no promotion (the tables
# and tests keyed by SCALAR_TYPES are about arithmetic types).
e4m3 = ScalarType("e4m3", 8, "fp8", "b8", "float8_e4m3fn")
e5m2 = ScalarType("e5m2", 8, "fp8", "b8", "float8_e5m2")
f8e4m3 = e4m3
f8e5m2 = e5m2
FP8_TYPES: dict[str, ScalarType] = {t.name: t for t in (e4m3, e5m2)}


def is_scalar_type_name(name: str) -> bool:
    """Whether ``scalar_type(name)`` names a type."""
    return any(name in table for table in (SCALAR_TYPES, FP8_TYPES, PACKED_TYPES))


def scalar_type(name: str) -> ScalarType:
    """The scalar type named ``name`` (``"f32"``, ``"e4m3"``, ``"f16x2"``...)."""
    for table in (SCALAR_TYPES, FP8_TYPES, PACKED_TYPES):
        if name in table:
            return table[name]
    raise KeyError(f"kaio has no scalar type {name!r}")


_INT_BY_KIND_BITS = {(t.kind, t.bits): t for t in SCALAR_TYPES.values() if t.is_int}


def int_type(signed: bool, bits: int) -> ScalarType:
    """The integer type of the given signedness and width."""
    return _INT_BY_KIND_BITS[("int" if signed else "uint", bits)]


def promote(a: ScalarType, b: ScalarType) -> ScalarType | None:
    """The common type of two operands (C-like rules of API.md), or None when none exists.

    - two integers: the wider wins; equal widths with mixed signedness give the unsigned type;
    - an integer (or bool) with a float gives the float;
    - f16 or bf16 with f32 gives f32; f16 with bf16 gives f32; any float with f64 gives f64;
    - bool with bool stays bool; bool with an integer gives the integer;
    - a packed pair (f16x2, bf16x2) combines only with its own type;
    - an fp8 type (e4m3, e5m2) combines with nothing (convert it to f32 first).
    """
    if a.is_fp8 or b.is_fp8:
        return None
    if a == b:
        return a
    if a.is_packed or b.is_packed:
        return None
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        if a.bits == b.bits:  # f16 with bf16
            return f32
        wider = a if a.bits > b.bits else b
        return wider if wider.bits >= 32 else f32
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if a.kind == "uint" else b


def literal_type(value) -> ScalarType:
    """The type of a literal standing alone: i32 for ints, f32 for floats, bool_ for bools."""
    if isinstance(value, bool | np.bool_):
        return bool_
    if isinstance(value, int | np.integer):
        if isinstance(value, np.integer):
            return from_numpy_dtype(np.asarray(value).dtype)
        return i32 if -(2**31) <= value < 2**31 else i64
    if isinstance(value, np.floating):
        return from_numpy_dtype(np.asarray(value).dtype)
    return f32


def int_range(t: ScalarType) -> tuple[int, int]:
    """The smallest and the largest value of the integer or bool type ``t``."""
    if t.is_bool:
        return 0, 1
    if t.kind == "int":
        return -(2 ** (t.bits - 1)), 2 ** (t.bits - 1) - 1
    return 0, 2**t.bits - 1


def int_fits(value: int, t: ScalarType) -> bool:
    """True when the integer literal fits ``t``'s width as a signed or unsigned bit pattern."""
    if t.is_bool:
        return value in (0, 1)
    if t.is_float:
        return True
    return -(2 ** (t.bits - 1)) <= value < 2**t.bits


_BY_NUMPY = {t.np_dtype: t for t in (*SCALAR_TYPES.values(), *FP8_TYPES.values())}


def from_numpy_dtype(dtype) -> ScalarType:
    """The DSL type matching a NumPy dtype (``ml_dtypes.bfloat16`` maps to bf16,
    ``ml_dtypes.float8_e4m3fn`` to e4m3, ``ml_dtypes.float8_e5m2`` to e5m2)."""
    dtype = np.dtype(dtype)
    try:
        return _BY_NUMPY[dtype]
    except KeyError:
        raise TypeError(f"NumPy dtype {dtype} has no kaio scalar type") from None


def pack_host(t: ScalarType, lo, hi=None) -> np.uint32:
    """The bits of the packed pair ``(lo, hi)`` of type ``t`` (``hi`` defaults to ``lo``):
    each value rounded once to nearest even to ``t.element`` (NaN: the canonical 0x7FFF, as
    the GPU's conversions give), ``lo`` in the low half."""
    halves = [
        0x7FFF
        if np.isnan(float(v))
        else int(round_f64(np.asarray(float(v)), t.element.np_dtype).view(np.uint16))
        for v in (lo, lo if hi is None else hi)
    ]
    return np.uint32(halves[0] | halves[1] << 16)


def unpack_host(t: ScalarType, bits) -> tuple:
    """The two halves of packed bits (NumPy scalars or arrays of ``t.element``): (lo, hi)."""
    bits = np.asarray(bits, dtype=np.uint32)
    dtype = t.element.np_dtype
    return (
        (bits & 0xFFFF).astype(np.uint16).view(dtype),
        (bits >> 16).astype(np.uint16).view(dtype),
    )
