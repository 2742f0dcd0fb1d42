"""TMA tensor maps on the host: ``kaio.tensor_map_2d(array, box, swizzle)``.

A ``TensorMap`` describes how ``kaio.tma_load_2d`` copies a box of a 2-D row-major array into
shared memory: the array, the box (rows, columns), the swizzle of the shared tile and what
out-of-bounds elements read (zeros). Pass it to a kernel parameter annotated
``kaio.tensormap``. On the GPU it is the driver's 128-byte ``CUtensorMap``, encoded once with
``cuTensorMapEncodeTiled`` and passed by value; under the simulator (a NumPy array) it is the
array itself, and ``kaio.sim.hopper`` performs the same copies. docs/hopper.md.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kaio.errors import LaunchError
from kaio.types import ScalarType, from_numpy_dtype

__all__ = ["TensorMap", "tensor_map_2d", "SWIZZLES", "L2_PROMOTIONS", "MAPS_KEPT"]

SWIZZLES = (0, 32, 64, 128)
"""The shared-tile swizzles, in bytes (0: none): 16-byte chunk ``c`` of the tile's 128-byte
line ``L`` is stored at chunk ``c ^ (L % (swizzle // 16))`` (the ``kaio.swizzle`` pattern)."""

_DATA_TYPES = {"u8": 0, "i8": 0, "u16": 1, "i16": 1, "u32": 2, "i32": 3, "u64": 4, "i64": 5}
_DATA_TYPES |= {"f16": 6, "f32": 7, "f64": 8, "bf16": 9}
_SWIZZLE_ENUM = {0: 0, 32: 1, 64: 2, 128: 3}
L2_PROMOTIONS = {0: 0, 64: 1, 128: 2, 256: 3}  # bytes -> CUtensorMapL2promotion
"""The L2 promotions a map may ask for, in bytes (0: none): the sector size an L2 miss of a
copy fetches."""

# encoded maps kept by (address, dtype, shape, row stride, box, swizzle, L2 promotion): all the 128
# bytes depend on, so a hit is the same map the driver would encode again (an op called in
# a loop over the same arrays, or over the few addresses torch's caching allocator hands
# back, encodes each map once). The oldest go past this many; 0: encode every time
MAPS_KEPT = 4096
_KEPT: dict = {}  # key -> (the encoder that made it, its 128 bytes)


class TensorMap:
    """A 2-D TMA tensor map over ``array`` (row-major, ``[rows, cols]``) copying boxes of
    ``box = (box_rows, box_cols)`` elements into shared tiles swizzled by ``swizzle`` bytes,
    its L2 misses promoted to ``l2_promotion`` bytes. Build it with ``kaio.tensor_map_2d``;
    ``encoded()`` gives the driver's 128 bytes."""

    def __init__(
        self,
        array,
        dtype: ScalarType,
        shape: tuple,
        row_stride: int,
        box,
        swizzle,
        address: int | None = None,
        l2_promotion: int = 256,
    ):
        self.array = array
        self.address = address  # of element 0 of a CUDA array (None: asked when encoding)
        self.dtype = dtype
        self.shape = shape
        self.row_stride = row_stride  # elements
        self.box = box
        self.swizzle = swizzle
        self.l2_promotion = l2_promotion
        self._bytes: bytes | None = None

    @property
    def box_bytes(self) -> int:
        """The bytes one ``tma_load_2d`` of this map writes to shared memory."""
        return self.box[0] * self.box[1] * self.dtype.itemsize

    def encoded(self) -> bytes:
        """The 128-byte ``CUtensorMap`` (``cuTensorMapEncodeTiled``), encoded on first use, or
        the bytes of an identical map encoded before (same address, dtype, shape, strides,
        box, swizzle and L2 promotion: ``MAPS_KEPT``)."""
        if self._bytes is None:
            self._bytes = _kept_encoding(self)
        return self._bytes

    def __repr__(self) -> str:
        return (
            f"kaio.TensorMap({self.dtype}[{self.shape[0]}, {self.shape[1]}], box={self.box}, "
            f"swizzle={self.swizzle}, l2_promotion={self.l2_promotion})"
        )


def _shape_of(array) -> tuple[tuple, tuple, ScalarType, int | None]:
    """(shape, strides in elements, dtype, address or None) of a NumPy or CUDA array."""
    if isinstance(array, np.ndarray):
        strides = tuple(s // array.itemsize for s in array.strides)
        return array.shape, strides, from_numpy_dtype(array.dtype), None
    from kaio.runtime.arguments import RawArray, describe

    if type(array) is RawArray and len(array.shape) == 2:  # row-major by construction
        return tuple(array.shape), (max(array.shape[1], 1), 1), array.dtype, array.ptr
    info = describe(array)
    return tuple(info.shape), tuple(info.strides), info.dtype, info.ptr


def tensor_map_2d(array, box: tuple, swizzle: int = 128, l2_promotion: int = 256) -> TensorMap:
    """A ``TensorMap`` copying ``box = (rows, cols)`` boxes of the 2-D array ``array`` (a CUDA
    array, or a NumPy array for the simulator) into shared tiles with the given swizzle (0,
    32, 64 or 128 bytes). The rows of ``array`` must be contiguous, 16-byte aligned and a
    multiple of 16 bytes apart; a box row (``cols`` elements) is at most ``swizzle`` bytes
    when swizzled and each box side is 1..256. Elements outside the array read as zero.
    ``l2_promotion``: the bytes an L2 miss of a copy fetches (0, 64, 128 or 256)."""
    shape, strides, dtype, address = _shape_of(array)

    def error(message: str) -> ValueError:  # the text is made only for an error
        return ValueError(f"kaio.tensor_map_2d({dtype}[{', '.join(map(str, shape))}]): {message}")

    if len(shape) != 2:
        raise error(f"needs a 2-D array, got {len(shape)} dimensions")
    if strides[1] != 1:
        raise error(f"the rows must be contiguous (column stride {strides[1]})")
    if dtype.name not in _DATA_TYPES:
        raise error(f"TMA does not copy {dtype} (supported: {list(_DATA_TYPES)})")
    row_bytes = strides[0] * dtype.itemsize
    if shape[0] > 1 and row_bytes % 16:
        raise error(
            f"rows are {row_bytes} bytes apart; TMA needs a multiple of 16 (pad the columns "
            "to a multiple of 16 bytes)"
        )
    if swizzle not in SWIZZLES:
        raise error(f"swizzle must be one of {SWIZZLES} bytes, got {swizzle!r}")
    if l2_promotion not in L2_PROMOTIONS:
        raise error(
            f"l2_promotion must be one of {list(L2_PROMOTIONS)} bytes, got {l2_promotion!r}"
        )
    rows, cols = (int(b) for b in box)
    if not (1 <= rows <= 256 and 1 <= cols <= 256):
        raise error(f"each box side must be 1..256, got {box}")
    inner = cols * dtype.itemsize
    if inner % 16 or (swizzle and inner > swizzle):
        limit = f"at most {swizzle} bytes (the swizzle) and " if swizzle else ""
        raise error(f"a box row is {inner} bytes; it must be {limit}a multiple of 16 bytes")
    return TensorMap(
        array, dtype, tuple(shape), strides[0], (rows, cols), swizzle, address, l2_promotion
    )


def _kept_encoding(tm: TensorMap) -> bytes:
    """``_encode(tm)``, or the bytes kept from encoding the same map before (the key holds
    all the map depends on; bytes made by another ``_encode``, a test's stand-in for the
    driver, are never handed out)."""
    address = tm.address
    if address is None or not MAPS_KEPT:
        return _encode(tm)
    encode = _encode
    key = (address, tm.dtype, tm.shape, tm.row_stride, tm.box, tm.swizzle, tm.l2_promotion)
    found = _KEPT.get(key)
    if found is not None and found[0] is encode:
        return found[1]
    made = encode(tm, address)
    if found is None and len(_KEPT) >= MAPS_KEPT:
        _KEPT.pop(next(iter(_KEPT)), None)  # the oldest (another thread may have taken it)
    _KEPT[key] = (encode, made)
    return made


def _encode(tm: TensorMap, address: int | None = None) -> bytes:
    """``cuTensorMapEncodeTiled`` for ``tm`` (a CUDA array): its 128 bytes; with ``address``,
    the same map over the array of ``tm``'s shape and strides at that address (call plans
    replay a launch with the map of each call's array)."""
    if isinstance(tm.array, np.ndarray):
        raise LaunchError(
            f"{tm!r} is over a NumPy array: launch on the simulator (kernel.sim[...] or "
            "kaio.simulate()), or build it over a CUDA array (kaio.to_device)"
        )
    from kaio.runtime.arguments import describe
    from kaio.runtime.driver import check, cu

    if address is None:
        address = describe(tm.array).ptr
    size = tm.dtype.itemsize
    result = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType(_DATA_TYPES[tm.dtype.name]),
        2,
        address,
        [cu.cuuint64_t(tm.shape[1]), cu.cuuint64_t(tm.shape[0])],  # innermost first
        [cu.cuuint64_t(tm.row_stride * size)],  # the stride of dimension 1, in bytes
        [cu.cuuint32_t(tm.box[1]), cu.cuuint32_t(tm.box[0])],
        [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle(_SWIZZLE_ENUM[tm.swizzle]),
        cu.CUtensorMapL2promotion(L2_PROMOTIONS[tm.l2_promotion]),
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    encoded = check(result, f"cuTensorMapEncodeTiled for {tm!r}")
    return ctypes.string_at(encoded.getPtr(), 128)
