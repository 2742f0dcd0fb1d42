"""DLPack, both ways, with ctypes: ``export`` wraps device memory in a ``"dltensor"`` capsule
(so ``torch.from_dlpack(kaio_array)`` shares it), ``read_capsule`` reads a producer's capsule
(pointer, shape, strides, dtype, device) without taking ownership of the memory."""

from __future__ import annotations

import ctypes

from kaio import types as t
from kaio.runtime.arginfo import c_strides
from kaio.types import ScalarType

__all__ = ["KDL_CUDA", "export", "read_capsule", "dl_dtype", "from_dl_dtype"]

KDL_CUDA = 2
KDL_CUDA_MANAGED = 13
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT, _KDL_BOOL = 0, 1, 2, 4, 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_CODES = {"int": _KDL_INT, "uint": _KDL_UINT, "float": _KDL_FLOAT, "bool": _KDL_BOOL}
# DLPack 1.1's kDLFloat8_e4m3fn and kDLFloat8_e5m2 (8-bit floats, one code per format)
_KDL_FP8 = {"e4m3": 10, "e5m2": 12}


def dl_dtype(dtype: ScalarType) -> tuple[int, int]:
    """The DLPack ``(code, bits)`` of a kaio scalar type (bf16 is kDLBfloat)."""
    if dtype == t.bf16:
        return _KDL_BFLOAT, 16
    if dtype.is_fp8:
        return _KDL_FP8[dtype.name], 8
    return _CODES[dtype.kind], dtype.bits


_FROM_DL = {
    (c, b): s for s in (*t.SCALAR_TYPES.values(), *t.FP8_TYPES.values()) for c, b in [dl_dtype(s)]
}
_FROM_DL[(_KDL_UINT, 1)] = t.bool_


def from_dl_dtype(code: int, bits: int, lanes: int = 1) -> ScalarType:
    """The kaio scalar type of a DLPack dtype; ``TypeError`` when kaio has none."""
    scalar = _FROM_DL.get((code, bits)) if lanes == 1 else None
    if scalar is None:
        raise TypeError(f"DLPack dtype (code {code}, {bits} bits, {lanes} lanes) has no kaio type")
    return scalar


# Exported tensors still owned by a consumer: address -> (struct, shape, strides, owner).
_live: dict[int, tuple] = {}

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.c_void_p]


@_Deleter
def _delete(managed) -> None:
    _live.pop(ctypes.addressof(managed.contents), None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule) -> None:
    # An unconsumed capsule still owns the tensor; a consumer renames it "used_dltensor".
    if _api.PyCapsule_IsValid(capsule, b"dltensor"):
        address = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        _live.pop(address, None)


def export(owner, ptr: int, shape: tuple, strides: tuple, dtype: ScalarType, device: int):
    """A ``"dltensor"`` capsule for CUDA memory at ``ptr`` (strides in elements); ``owner`` is
    kept alive until the consumer releases the tensor."""
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
    code, bits = dl_dtype(dtype)
    managed = DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = ptr
    tensor.device = DLDevice(KDL_CUDA, device)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(code, bits, 1)
    tensor.shape = shape_arr
    tensor.strides = strides_arr
    tensor.byte_offset = 0
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    _live[address] = (managed, shape_arr, strides_arr, owner)
    return _api.PyCapsule_New(
        address, b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p)
    )


def read_capsule(capsule) -> tuple[int, tuple, tuple, ScalarType, tuple[int, int]]:
    """``(ptr, shape, strides in elements, dtype, (device_type, device_id))`` of a DLPack
    capsule. The capsule is left unconsumed, so its destructor releases the producer's
    bookkeeping; the memory stays owned by the producing object."""
    address = id(capsule)
    name = _api.PyCapsule_GetName(address)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise TypeError(f"not a DLPack capsule (name {name!r})")
    pointer = _api.PyCapsule_GetPointer(address, name)
    if name == b"dltensor_versioned":
        # DLManagedTensorVersioned: {DLPackVersion (2 x u32), manager_ctx, deleter, flags (u64),
        # DLTensor}: the tensor follows 32 bytes of header.
        pointer += 32
    tensor = DLTensor.from_address(pointer)
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    if tensor.strides:
        strides = tuple(tensor.strides[i] for i in range(ndim))
    else:
        strides = c_strides(shape)
    dtype = from_dl_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    ptr = (tensor.data or 0) + tensor.byte_offset
    return ptr, shape, strides, dtype, (tensor.device.device_type, tensor.device.device_id)
