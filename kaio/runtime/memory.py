"""Device memory: ``kaio.DeviceArray`` and ``kaio.to_device``, ``kaio.empty``, ``kaio.zeros``.

One ``Allocation`` owns each ``cuMemAlloc`` block and frees it when collected; views (slices,
``.T``) share it, so memory lives as long as any array that sees it. Arrays speak
``__cuda_array_interface__`` (v3) and DLPack, so CuPy, numba and PyTorch take them without a copy.
"""

from __future__ import annotations

import weakref

import numpy as np

from kaio.errors import CudaError
from kaio.runtime import dlpack
from kaio.runtime.arginfo import ArgInfo, c_strides
from kaio.runtime.device import Device, ensure_context, visiting
from kaio.runtime.driver import check, cu
from kaio.runtime.stream import Event, stream_handle
from kaio.types import ScalarType, from_numpy_dtype

__all__ = ["Allocation", "DeviceArray", "to_device", "empty", "zeros", "as_dtype"]


def as_dtype(dtype) -> tuple[np.dtype, ScalarType]:
    """``(numpy dtype, kaio scalar type)`` of a NumPy dtype (or anything ``np.dtype`` takes)
    or a kaio scalar type such as ``kaio.f32``."""
    if isinstance(dtype, ScalarType):
        return dtype.np_dtype, dtype
    np_dtype = np.dtype(dtype)
    return np_dtype, from_numpy_dtype(np_dtype)


def _free(ptr, device: Device) -> None:
    try:
        with visiting(device):
            cu.cuMemFree(ptr)
    except Exception:  # interpreter shutdown: the driver may be gone already
        pass


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``"1.50 GiB (1610612736 bytes)"``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"


def out_of_memory(nbytes: int, device: Device, code: int) -> CudaError:
    """The ``CudaError`` of an allocation the device could not satisfy: what was asked, what
    is free and the device's total."""
    try:
        free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        have = f"{format_bytes(free)} free of {format_bytes(total)}"
    except CudaError as e:
        have = f"free memory unknown ({e.name})"
    name = getattr(device, "name", f"device {getattr(device, 'ordinal', '?')}")
    return CudaError(
        f"out of GPU memory: asked for {format_bytes(nbytes)} on {name}, which has {have}. "
        "Free arrays you no longer need (del them; memory is released when the last view is "
        "collected) or use smaller batches",
        "CUDA_ERROR_OUT_OF_MEMORY",
        code,
    )


class Allocation:
    """One block of device memory, freed when the last array using it is collected."""

    __slots__ = ("ptr", "nbytes", "device", "_finalizer", "__weakref__")

    def __init__(self, nbytes: int, device: Device):
        with visiting(device):  # memory goes to the current context's GPU
            err, handle = cu.cuMemAlloc(max(nbytes, 1))
            if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                raise out_of_memory(nbytes, device, int(err))
        check((err, handle), f"cuMemAlloc({nbytes} bytes)")
        self.ptr = int(handle)
        self.nbytes = nbytes
        self.device = device
        self._finalizer = weakref.finalize(self, _free, handle, device)


def _copy_to_host(dst: np.ndarray, src: int, nbytes: int, stream) -> None:
    """``nbytes`` from device address ``src`` into ``dst`` (a context of the GPU is current)."""
    if stream is None:
        check(cu.cuMemcpyDtoH(dst.ctypes.data, src, nbytes), "copy to host", 0)
        return
    handle = stream_handle(stream)
    check(cu.cuMemcpyDtoHAsync(dst.ctypes.data, src, nbytes, handle), "copy to host", handle)
    check(cu.cuStreamSynchronize(handle), "copy to host", handle)


class DeviceArray:
    """An n-dimensional array in GPU memory.

    ``dtype`` is a NumPy dtype (``ml_dtypes.bfloat16`` for bf16) and ``kaio_dtype`` the kaio
    type; ``strides`` are in bytes (NumPy's convention); ``ptr`` is the device address of
    element 0. Create with ``kaio.to_device``, ``kaio.empty`` or ``kaio.zeros``; read back with
    ``.numpy()``; index with ints and slices for views that share memory.
    """

    __slots__ = ("shape", "strides", "dtype", "kaio_dtype", "ptr", "device", "_alloc", "_info")

    def __init__(self, shape, dtype, device: Device | None = None):
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        np_dtype, kaio_dtype = as_dtype(dtype)
        device = device or ensure_context()
        nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        alloc = Allocation(nbytes, device)
        strides = tuple(s * np_dtype.itemsize for s in c_strides(shape))
        self._init(alloc, alloc.ptr, shape, strides, np_dtype, kaio_dtype)

    def _init(self, alloc, ptr, shape, strides, np_dtype, kaio_dtype) -> None:
        self._alloc = alloc
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = np_dtype
        self.kaio_dtype = kaio_dtype
        self.device = alloc.device
        item = np_dtype.itemsize
        self._info = ArgInfo(
            ptr, shape, tuple(s // item for s in strides), kaio_dtype, alloc.device.ordinal
        )

    def _view(self, ptr: int, shape: tuple, strides: tuple, dtype=None) -> DeviceArray:
        np_dtype, kaio_dtype = (self.dtype, self.kaio_dtype) if dtype is None else as_dtype(dtype)
        view = DeviceArray.__new__(DeviceArray)
        view._init(self._alloc, ptr, shape, strides, np_dtype, kaio_dtype)
        return view

    def _require_contiguous(self, what: str) -> None:
        item = self.dtype.itemsize
        if self.strides != tuple(s * item for s in c_strides(self.shape)):
            raise ValueError(f"DeviceArray.{what}() needs a contiguous array; copy it first")

    def reshape(self, *shape) -> DeviceArray:
        """The same memory with another shape (a contiguous array; no copy), like NumPy."""
        self._require_contiguous("reshape")
        shape = tuple(
            int(n) for n in (shape[0] if len(shape) == 1 and np.ndim(shape[0]) else shape)
        )
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape an array of {self.size} elements into {shape}")
        item = self.dtype.itemsize
        return self._view(self.ptr, shape, tuple(s * item for s in c_strides(shape)))

    def view(self, dtype) -> DeviceArray:
        """The same bytes read as ``dtype`` (a contiguous array; the last dimension scales by
        the ratio of the item sizes), like NumPy's ``ndarray.view``."""
        self._require_contiguous("view")
        np_dtype, _ = as_dtype(dtype)
        last = self.shape[-1] * self.dtype.itemsize
        if last % np_dtype.itemsize:
            raise ValueError(
                f"the last dimension ({last} bytes) is not a whole number of {np_dtype}"
            )
        shape = (*self.shape[:-1], last // np_dtype.itemsize)
        strides = tuple(s * np_dtype.itemsize for s in c_strides(shape))
        return self._view(self.ptr, shape, strides, np_dtype)

    # ------------------------------------------------------------------ shape
    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (not of the whole allocation a view may belong to)."""
        return self.size * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        """True when the array is row-major contiguous."""
        return self._info.contiguous

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    @property
    def T(self) -> DeviceArray:
        """The transposed view (no copy)."""
        return self._view(self.ptr, self.shape[::-1], self.strides[::-1])

    def __getitem__(self, key) -> DeviceArray:
        """Basic indexing: ints, slices (any step), ``...`` and ``None``; returns a view."""
        key = key if isinstance(key, tuple) else (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if Ellipsis in key:
            at = key.index(Ellipsis)
            fill = self.ndim - (len(key) - 1 - key.count(None))
            key = key[:at] + (slice(None),) * fill + key[at + 1 :]
        if len(key) - key.count(None) > self.ndim:
            raise IndexError(f"too many indices for a {self.ndim}-d DeviceArray")
        key = key + (slice(None),) * (self.ndim - (len(key) - key.count(None)))
        ptr, shape, strides, dim = self.ptr, [], [], 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, stride = self.shape[dim], self.strides[dim]
            dim += 1
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                shape.append(len(range(start, stop, step)))
                strides.append(stride * step)
                ptr += start * stride
            elif hasattr(k, "__index__"):
                i = k.__index__()
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {dim - 1} of size {n}")
                ptr += (i % n) * stride
            else:
                raise IndexError(
                    f"DeviceArray supports ints, slices, ... and None as indices, got {k!r}; "
                    "copy to the host with .numpy() for fancy indexing"
                )
        return self._view(ptr, tuple(shape), tuple(strides))

    # ------------------------------------------------------------------ copies
    def numpy(self, stream=None) -> np.ndarray:
        """Copy to a new NumPy array (waits for the copy; on ``stream`` when given)."""
        out = np.empty(self.shape, self.dtype)
        if self.size == 0:
            return out
        with visiting(self.device):  # the copy needs a context; the default stream is its
            return self._copy_out(out, stream)

    def _copy_out(self, out: np.ndarray, stream) -> np.ndarray:
        """``numpy``'s copy into ``out``, with the array's context current."""
        if self.is_contiguous:
            _copy_to_host(out, self.ptr, self.nbytes, stream)
            return out
        # A strided view: copy the byte range it spans, then gather on the host.
        reach = [s * (n - 1) for n, s in zip(self.shape, self.strides, strict=True)]
        lo = self.ptr + sum(r for r in reach if r < 0)
        hi = self.ptr + sum(r for r in reach if r > 0)
        span = np.empty(hi - lo + self.itemsize, np.uint8)
        _copy_to_host(span, lo, span.nbytes, stream)
        view = np.ndarray(self.shape, self.dtype, span, self.ptr - lo, self.strides)
        out[...] = view
        return out

    copy_to_host = numpy

    def copy_from_host(self, array, stream=None) -> DeviceArray:
        """Overwrite this (contiguous) array with a host array of the same shape."""
        if not self.is_contiguous:
            raise ValueError(
                "copy_from_host needs a contiguous DeviceArray; this is a strided view"
            )
        host = np.ascontiguousarray(array, dtype=self.dtype)
        if host.shape != self.shape:
            raise ValueError(f"shape mismatch: host {host.shape}, device {self.shape}")
        if self.size:
            with visiting(self.device):
                if stream is None:
                    copied = cu.cuMemcpyHtoD(self.ptr, host.ctypes.data, self.nbytes)
                else:
                    h = stream_handle(stream)
                    copied = cu.cuMemcpyHtoDAsync(self.ptr, host.ctypes.data, self.nbytes, h)
                check(copied, "copy to device")
        return self

    # ------------------------------------------------------------------ interop
    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None if self.is_contiguous else self.strides,
            "version": 3,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.KDL_CUDA, self.device.ordinal)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule sharing this memory (``torch.from_dlpack(array)``). kaio's work
        runs on the legacy default stream; a consumer stream other than it waits for that."""
        if copy:
            raise BufferError("kaio arrays export by reference only (copy=True not supported)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"cannot export a CUDA array to device {dl_device}")
        if stream is not None and stream not in (-1, 0, 1, 2):
            with visiting(self.device):  # the default stream of the array's GPU
                ready = Event(timing=False).record(0)
            check(cu.cuStreamWaitEvent(stream, ready._event, 0), "cuStreamWaitEvent")
        return dlpack.export(
            self, self.ptr, self.shape, self._info.strides, self.kaio_dtype, self.device.ordinal
        )

    def __repr__(self) -> str:
        return (
            f"<kaio.DeviceArray shape={self.shape} dtype={self.dtype} "
            f"device={self.device.ordinal} ptr=0x{self.ptr:x}>"
        )


def empty(shape, dtype) -> DeviceArray:
    """An uninitialized array on the current device; ``dtype`` a NumPy dtype or kaio type."""
    return DeviceArray(shape, dtype)


def zeros(shape, dtype) -> DeviceArray:
    """A zero-filled array on the current device."""
    out = DeviceArray(shape, dtype)
    if out.nbytes:
        check(cu.cuMemsetD8(out.ptr, 0, out.nbytes), "cuMemsetD8")
    return out


def to_device(array, stream=None) -> DeviceArray:
    """Copy a NumPy array (or anything ``np.asarray`` takes) to a new DeviceArray on the
    current device."""
    host = np.ascontiguousarray(array)
    return DeviceArray(host.shape, host.dtype).copy_from_host(host, stream)
