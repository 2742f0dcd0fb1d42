"""Launch arguments: ``describe`` turns any CUDA array (kaio, CuPy, numba, PyTorch, any DLPack
producer) into an ``ArgInfo`` without copying; ``check_array`` and ``check_scalar`` refuse
wrong arguments with a ``LaunchError`` that names the parameter and what it expects."""

from __future__ import annotations

import ctypes

import numpy as np

from kaio.errors import LaunchError
from kaio.runtime import dlpack
from kaio.runtime.arginfo import ArgInfo, RawArray, c_strides
from kaio.runtime.memory import DeviceArray
from kaio.types import ArrayType, ScalarType, from_numpy_dtype, int_range

__all__ = [
    "describe",
    "is_torch",
    "is_cupy",
    "torch_dtype",
    "check_array",
    "check_scalar",
    "NUMPY_HINT",
]

NUMPY_HINT = (
    "a NumPy array lives in host memory: copy it to the GPU with kaio.to_device(array) "
    "(and read results back with .numpy()), or run on the CPU inside `with kaio.simulate():`"
)

_TORCH_DTYPES = {
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.int16": "i16",
    "torch.uint16": "u16",
    "torch.int32": "i32",
    "torch.uint32": "u32",
    "torch.int64": "i64",
    "torch.uint64": "u64",
    "torch.bool": "bool_",
    "torch.float8_e4m3fn": "e4m3",
    "torch.float8_e5m2": "e5m2",
}


_DEVICE_ORDINAL = 9  # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL


def _pointer_device(ptr: int) -> int:
    """The ordinal of the GPU whose memory ``ptr`` points into. Asked of libcuda through
    ctypes: cuda-bindings 13.3 answers this attribute with 0 for memory on any GPU (seen on a
    two-GPU H200 machine, where it sent CuPy arrays of GPU 1 to kernels on GPU 0)."""
    from kaio.runtime.driver import cuda_error, libcuda

    ordinal = ctypes.c_int(-1)
    rc = libcuda().cuPointerGetAttribute(ctypes.byref(ordinal), _DEVICE_ORDINAL, ptr)
    if rc:
        raise cuda_error(rc, "cuPointerGetAttribute")
    return ordinal.value


def is_torch(obj) -> bool:
    """A torch tensor (read through torch's own API rather than DLPack: it is faster)."""
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def is_cupy(obj) -> bool:
    """A CuPy array (``describe`` reads its ``__cuda_array_interface__``; the launch fast path
    reads ``.data.ptr`` and ``.flags`` directly)."""
    return (
        type(obj).__module__.startswith("cupy") and hasattr(obj, "data") and hasattr(obj, "flags")
    )


def tensor_check(tensors: list, shapes: list | None = None, strides: list | None = None):
    """``check(*tensors)``: True when each tensor has the Python type, dispatch keys, dtype,
    device, shape, strides and ``requires_grad`` that the tensor in its place in ``tensors``
    has (its shape and strides: ``shapes[i]``, ``strides[i]`` where given), False for
    anything else in a place, a non-tensor included (torch's ``TensorGuards``, the check
    torch.compile's guards make: one C call for every tensor, a fraction of reading those
    accessors one by one; it keeps no tensor). The dispatch keys are read under the
    thread's dispatch state (inference mode, autocast), so a check made in one state
    refuses every tensor in another where their keys differ. None where this torch has no
    such check, or for anything it cannot check."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(
            *tensors,
            dynamic_dims_sizes=shapes or [list(t.shape) for t in tensors],
            dynamic_dims_strides=strides or [list(t.stride()) for t in tensors],
        ).check
    except Exception:  # noqa: BLE001 (an older or newer torch, a stand-in: no check)
        return None


_torch_dtypes: dict = {}  # torch dtype object -> kaio scalar type (None: no kaio type)


def torch_dtype(dtype) -> ScalarType | None:
    """The kaio type of a torch dtype, None when kaio has none; cached per dtype object."""
    try:
        return _torch_dtypes[dtype]
    except KeyError:
        from kaio import types

        name = _TORCH_DTYPES.get(str(dtype))
        scalar = _torch_dtypes[dtype] = types.scalar_type(name) if name else None
        return scalar


def _from_torch(obj) -> ArgInfo:
    if not obj.is_cuda:
        raise LaunchError(f"a torch tensor on {obj.device}: move it to the GPU with .cuda()")
    dtype = torch_dtype(obj.dtype)
    if dtype is None:
        raise LaunchError(f"torch dtype {obj.dtype} has no kaio type")
    return ArgInfo(
        obj.data_ptr(),
        tuple(obj.shape),
        tuple(obj.stride()),
        dtype,
        obj.get_device(),
        obj.is_contiguous(),
    )


def _from_cai(cai: dict) -> ArgInfo:
    np_dtype = np.dtype(cai["typestr"])
    try:
        dtype = from_numpy_dtype(np_dtype)
    except TypeError as e:
        raise LaunchError(str(e)) from None
    shape = tuple(cai["shape"])
    ptr = int(cai["data"][0])
    if cai.get("strides") is None:
        strides = c_strides(shape)
    else:
        if any(s % np_dtype.itemsize for s in cai["strides"]):
            raise LaunchError(f"strides {cai['strides']} are not a multiple of the element size")
        strides = tuple(s // np_dtype.itemsize for s in cai["strides"])
    device = _pointer_device(ptr) if ptr else 0
    return ArgInfo(ptr, shape, strides, dtype, device)


def _from_dlpack(obj) -> ArgInfo:
    device_type, device_id = obj.__dlpack_device__()
    if device_type not in (dlpack.KDL_CUDA, dlpack.KDL_CUDA_MANAGED):
        raise LaunchError(
            f"a DLPack array on device type {device_type}, not CUDA: move it to the GPU first"
        )
    try:
        ptr, shape, strides, dtype, _ = dlpack.read_capsule(obj.__dlpack__(stream=None))
    except TypeError as e:
        raise LaunchError(str(e)) from None
    return ArgInfo(ptr, shape, strides, dtype, int(device_id))


def describe(obj) -> ArgInfo:
    """Pointer, shape, strides (in elements), kaio dtype and device ordinal of a CUDA array:
    a ``DeviceArray``, a ``RawArray``, a torch tensor, anything with
    ``__cuda_array_interface__`` or a CUDA ``__dlpack__``. Raises ``LaunchError`` for NumPy
    arrays, CPU tensors and non-arrays."""
    if type(obj) is DeviceArray:
        return obj._info
    if type(obj) is RawArray:
        return obj.info()
    if is_torch(obj):
        return _from_torch(obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(cai)
    if isinstance(obj, np.ndarray | np.generic):
        raise LaunchError(NUMPY_HINT)
    if hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj)
    raise LaunchError(
        f"{type(obj).__name__} is not a CUDA array: pass a kaio.DeviceArray (kaio.to_device), "
        "a torch CUDA tensor, a CuPy array or any __cuda_array_interface__/DLPack CUDA array"
    )


def _where(kernel: str, name: str, expected) -> str:
    return f"{kernel}: argument {name!r} (expects {expected})"


def check_array(obj, name: str, expected: ArrayType, kernel: str) -> ArgInfo:
    """``describe(obj)``, checked against the parameter's annotation (dtype and rank)."""
    where = _where(kernel, name, expected)
    try:
        info = describe(obj)
    except LaunchError as e:
        raise LaunchError(f"{where}: {e}") from None
    if info.dtype != expected.dtype:
        raise LaunchError(f"{where}: got an array of {info.dtype}; convert it to {expected.dtype}")
    if len(info.shape) != expected.ndim:
        raise LaunchError(
            f"{where}: got a {len(info.shape)}-d array of shape {info.shape}; "
            f"reshape it to {expected.ndim} dimension(s)"
        )
    return info


def check_scalar(value, name: str, expected: ScalarType, kernel: str) -> None:
    """Refuse a scalar argument that ``expected`` cannot hold exactly (wrong kind or range)."""
    where = _where(kernel, name, expected)
    if isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
        raise LaunchError(f"{where}: got an array; this parameter is a scalar")
    if expected.is_float:
        if not isinstance(value, int | float | np.integer | np.floating | bool):
            raise LaunchError(f"{where}: got {type(value).__name__} {value!r}")
        return
    if not isinstance(value, int | np.integer | bool | np.bool_):
        hint = f"; pass int({value!r}) if truncation is intended" if expected.is_int else ""
        raise LaunchError(f"{where}: got {type(value).__name__} {value!r}{hint}")
    v = int(value)
    lo, hi = int_range(expected)
    if not lo <= v <= hi:
        raise LaunchError(f"{where}: {v} is out of range [{lo}, {hi}]")
