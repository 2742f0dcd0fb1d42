"""The plumbing every op shares: what kind of array came in, checking it, making outputs.

An op wraps each input with ``Inputs(op).array(obj, name, ...)``, which refuses a wrong dtype,
rank, shape, device or a non-contiguous array with a ``ValueError`` naming the argument and
the form expected. The first input fixes the *kind* of the call (torch, CuPy, kaio
``DeviceArray``, or NumPy inside ``with kaio.simulate():``), and ``output`` allocates results
of that kind on the same device. ``Operand.arg`` and ``arg`` hand an array to a kernel as
another shape or element type without making a view (a ``RawArray`` of its address);
``view`` reshapes without copying, for arrays that go back to the caller.
"""

from __future__ import annotations

import math

import numpy as np

import kaio
from kaio import DeviceArray, LaunchError
from kaio.runtime import NUMPY_HINT, RawArray, current, describe
from kaio.runtime import torch_dtype as torch_scalar_type
from kaio.sim import active as simulating
from kaio.types import ScalarType, bf16, f16, f32, from_numpy_dtype

__all__ = ["FLOATS", "Inputs", "Operand", "arg", "output", "output_arg", "stream_of", "view"]

FLOATS = (f32, f16, bf16)
MAX_ELEMENTS = 2**31 - 1  # kernels index with 32-bit integers
MAX_ELEMENTS_UNSIGNED = 2**32 - 1  # for operands a kernel indexes with unsigned ones only


def _alternatives(names: list) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class Operand:
    """One input of an op: the object itself, its kind ('torch', 'cupy', 'kaio', 'numpy'),
    shape, kaio element type, device ordinal (None for NumPy) and the address of element 0.

    A plain slotted class: ops make several per call, and a frozen dataclass costs four
    times as much to construct."""

    __slots__ = ("name", "obj", "kind", "shape", "dtype", "device", "ptr")

    def __init__(
        self,
        name: str,
        obj: object,
        kind: str,
        shape: tuple,
        dtype: ScalarType,
        device: int | None,
        ptr: int,
    ):
        self.name = name
        self.obj = obj
        self.kind = kind
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.ptr = ptr

    def __repr__(self) -> str:
        return (
            f"Operand({self.name!r}, {self.kind}, shape={self.shape}, dtype={self.dtype}, "
            f"device={self.device}, ptr=0x{self.ptr:x})"
        )

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def aligned(self, nbytes: int) -> bool:
        """True when element 0 sits on an ``nbytes`` boundary."""
        return self.ptr % nbytes == 0

    def arg(self, *shape: int, dtype: ScalarType | None = None):
        """This (contiguous) memory as a kernel argument of ``shape`` (default: its own) and
        ``dtype`` (default: its own; else its bytes reinterpreted): see ``arg``."""
        dtype = dtype or self.dtype
        if self.kind == "numpy":
            return arg(self.obj, self.kind, shape or self.shape, dtype, None)
        return RawArray(self.ptr, shape or self.shape, dtype, self.device, self.obj)


def _kind(obj) -> str | None:
    if type(obj) is DeviceArray:
        return "kaio"
    module = type(obj).__module__
    if module.startswith("torch"):
        return "torch"
    if module.startswith("cupy"):
        return "cupy"
    if isinstance(obj, np.ndarray):
        return "numpy"
    return None


def view(obj, kind: str, shape: tuple):
    """Contiguous ``obj`` of ``kind`` seen as an array of ``shape`` (no copy)."""
    if kind == "torch":
        return obj.view(shape)
    if kind == "kaio":
        strides, step = [], obj.itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= max(n, 1)
        return obj._view(obj.ptr, shape, tuple(reversed(strides)))
    return obj.reshape(shape)  # NumPy and CuPy: a view of a contiguous array


def _address(obj, kind: str) -> int:
    if kind == "torch":
        return obj.data_ptr()
    if kind == "cupy":
        return obj.data.ptr
    return obj.ptr


def arg(obj, kind: str, shape: tuple, dtype: ScalarType, device: int | None):
    """Contiguous ``obj`` of ``kind`` (on GPU ``device``) as a kernel argument of ``shape``
    and ``dtype`` (its bytes reinterpreted when that differs), without making a view of
    it: a ``RawArray`` of its address on the GPU (a torch view costs microseconds), a
    NumPy view in the simulator."""
    if kind == "numpy":
        return obj.reshape(-1).view(dtype.np_dtype).reshape(shape)
    return RawArray(_address(obj, kind), shape, dtype, device, obj)


def output_arg(like: Operand, out, shape: tuple, dtype: ScalarType | None = None):
    """``out``, an array of ``like``'s kind and device (from ``output``), as a kernel
    argument of ``shape`` and ``dtype`` (default ``like``'s): see ``arg``."""
    return arg(out, like.kind, shape, dtype or like.dtype, like.device)


_TORCH_DTYPES: dict = {}  # kaio scalar type -> torch dtype


def torch_dtype(dtype: ScalarType):
    """The torch dtype of a kaio scalar type (float16, bfloat16, int8, uint32...), cached:
    NumPy's ``dtype.name`` costs microseconds, and ops are called in tight loops."""
    try:
        return _TORCH_DTYPES[dtype]
    except KeyError:
        import torch

        found = _TORCH_DTYPES[dtype] = getattr(torch, dtype.np_dtype.name)
        return found


class Inputs:
    """The inputs of one op call, checked one by one (``array``); the first sets the kind."""

    def __init__(self, op: str):
        self.op = op
        self.first: Operand | None = None

    def error(self, name: str, message: str) -> ValueError:
        """A ValueError about argument ``name``."""
        return ValueError(f"{self.op}: argument {name!r} {message}")

    def _describe(self, obj, name: str) -> tuple[Operand, bool]:
        """The operand and whether it is row-major contiguous."""
        kind = _kind(obj)
        if simulating():
            if kind != "numpy":
                raise self.error(
                    name,
                    "must be a NumPy array inside `with kaio.simulate():` (ops run on the CPU "
                    f"simulator there), got {type(obj).__name__}",
                )
            try:
                dtype = from_numpy_dtype(obj.dtype)
            except TypeError:
                raise self.error(name, f"has dtype {obj.dtype}, which no kaio type holds") from None
            a = Operand(name, obj, kind, obj.shape, dtype, None, obj.ctypes.data)
            return a, obj.flags.c_contiguous
        if kind == "numpy":
            raise self.error(name, f"is a NumPy array: {NUMPY_HINT}")
        if kind is None:
            raise self.error(
                name,
                "must be a torch CUDA tensor, a CuPy array or a kaio.DeviceArray, got "
                f"{type(obj).__name__}",
            )
        if kind == "torch" and obj.is_cuda:
            # torch's own accessors, without describe()'s launch ABI (what ops need, faster)
            dtype = torch_scalar_type(obj.dtype)
            if dtype is not None:
                shape, device = tuple(obj.shape), obj.get_device()
                a = Operand(name, obj, kind, shape, dtype, device, obj.data_ptr())
                return a, obj.is_contiguous()
        try:
            info = describe(obj)
        except LaunchError as e:
            raise self.error(name, f"is not usable on the GPU: {e}") from None
        a = Operand(name, obj, kind, info.shape, info.dtype, info.device, info.ptr)
        return a, info.contiguous

    def array(
        self,
        obj,
        name: str,
        ndim: int | tuple = (2, 3),
        shape: tuple | None = None,
        dtypes: tuple | None = None,
        form: str = "",
        max_elements: int = MAX_ELEMENTS,
    ) -> Operand:
        """Check ``obj`` and return it as an ``Operand``.

        ``ndim``: the allowed ranks; ``shape``: the exact shape wanted, where known;
        ``dtypes``: the allowed element types (default: f32, f16, bf16 for the first input,
        the first input's dtype for the others); ``form``: the expected shape as errors
        write it (e.g. "[..., N]"); ``max_elements``: the most elements the op's kernels can
        index (``MAX_ELEMENTS_UNSIGNED`` where they index this operand with u32 only).
        """
        a, contiguous = self._describe(obj, name)
        if dtypes is None:
            dtypes = FLOATS if self.first is None else (self.first.dtype,)
        ndims = (ndim,) if isinstance(ndim, int) else ndim

        def want() -> str:  # built only for an error: ops are called in tight loops
            return f"a {_alternatives([f'{n}-D' for n in ndims])} array" + f" {form}" * bool(form)

        if a.dtype not in dtypes:
            types = _alternatives([t.name for t in dtypes])
            raise self.error(name, f"must be {want()} of {types}, got dtype {a.dtype.name}")
        if len(a.shape) not in ndims:
            raise self.error(name, f"must be {want()}, got shape {a.shape}")
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise self.error(name, f"must have shape {tuple(shape)}, got {a.shape}")
        if not contiguous:
            raise self.error(name, "must be contiguous (row-major); pass a contiguous copy of it")
        if a.size > max_elements:
            raise self.error(name, f"has {a.size} elements; this op takes at most {max_elements}")
        if self.first is None:
            self.first = a
        elif a.device != self.first.device:
            raise self.error(
                name,
                f"is on GPU {a.device} but {self.first.name!r} is on GPU {self.first.device}",
            )
        return a


_TORCH_DEVICES: dict = {}  # ordinal -> torch.device


def _torch_empty(shape: tuple, dtype: ScalarType, device: int):
    """``torch.empty`` on CUDA device ``device``. The sizes go as separate arguments and the
    device as a cached object: on an H100 host, 4.2 µs a call against 6.0 for a shape tuple
    and the tensor's own ``.device``."""
    import torch

    try:
        dev = _TORCH_DEVICES[device]
    except KeyError:
        dev = _TORCH_DEVICES[device] = torch.device("cuda", device)
    if shape:
        return torch.empty(*shape, dtype=torch_dtype(dtype), device=dev)
    return torch.empty(shape, dtype=torch_dtype(dtype), device=dev)


def _allocate(like: Operand, shape: tuple, dtype: ScalarType):
    """A new uninitialized array of ``like``'s kind and device (noted by the call plan being
    recorded, if any: ``kaio_ops._plan`` makes the same array on each replay)."""
    made = new_array(like.kind, like.device, like.obj, shape, dtype)
    recorder = current.recorder
    if recorder is not None:
        recorder.allocated.append((made, like.kind, like.device, like.obj, shape, dtype))
    return made


def new_array(kind: str, device: int | None, like_obj, shape: tuple, dtype: ScalarType):
    """A new uninitialized array of ``kind`` on GPU ``device`` (a kaio one on the device of
    ``like_obj``, a ``DeviceArray``)."""
    if kind == "torch":
        return _torch_empty(shape, dtype, device)
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=dtype.np_dtype)
    if kind == "kaio":
        return DeviceArray(shape, dtype.np_dtype, device=like_obj.device)
    return np.empty(shape, dtype.np_dtype)


_CONSTANTS: dict = {}  # id -> array: arrays an op keeps for good (call plans use them as is)


def constant(array):
    """``array``, registered as one an op keeps for the life of the process (a cached
    placeholder argument): a call plan passes its address as recorded instead of taking it
    for an array of the call. Returns ``array``."""
    _CONSTANTS[id(array)] = array
    return array


def output(like: Operand, shape: tuple | None = None, dtype: ScalarType | None = None):
    """A new output array of the same kind and device as ``like`` (shape and dtype default to
    ``like``'s)."""
    return _allocate(like, tuple(like.shape if shape is None else shape), dtype or like.dtype)


def stream_of(like: Operand):
    """The stream to launch on: the current torch or CuPy stream for their arrays (the one
    the caller's surrounding work runs on), else the default stream."""
    if like.kind == "torch":
        import torch

        # torch's own fast accessor (the one Triton's launcher calls); the public one builds
        # a Stream object per call
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw(like.device)
        return torch.cuda.current_stream(like.obj.device).cuda_stream
    if like.kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return None


DEFAULT_SMS = 132  # H100/H200 SXM; used when there is no GPU to ask (the simulator)


def gpu(like: Operand) -> kaio.Device | None:
    """The GPU ``like`` is on, which the op's launches run on; None for NumPy arrays in the
    simulator. Ops ask it, not the current device, what to plan for: the arrays of a call may
    be on any GPU."""
    return None if like.device is None else kaio.Device(like.device)


def multiprocessors(like: Operand) -> int:
    """The SM count an op on ``like`` plans its grid for: its GPU's, or DEFAULT_SMS in the
    simulator (so plans, and results, match an H100/H200)."""
    dev = gpu(like)
    return DEFAULT_SMS if dev is None else dev.multiprocessor_count


_BANDWIDTH: dict = {}  # device ordinal -> peak memory bandwidth, bytes/s (None: unknown)


def memory_bandwidth(like: Operand) -> float | None:
    """The peak memory bandwidth (bytes/s: double data rate over the bus) of ``like``'s GPU
    from the driver's memory clock and bus width; None in the simulator or where the driver
    does not tell."""
    dev = gpu(like)
    if dev is None:
        return None
    if like.device not in _BANDWIDTH:
        try:
            khz = dev.attribute("MEMORY_CLOCK_RATE")
            bits = dev.attribute("GLOBAL_MEMORY_BUS_WIDTH")
            _BANDWIDTH[like.device] = 2 * khz * 1e3 * bits / 8 if khz > 0 and bits > 0 else None
        except Exception:  # noqa: BLE001  (an attribute this driver lacks: no limit)
            _BANDWIDTH[like.device] = None
    return _BANDWIDTH[like.device]


# GPUs whose peak memory bandwidth is FAST_MEMORY or more (H200: 4.8 TB/s, H100: 3.35) take the
# plans measured on the faster memory (``linear.ByMemory``, ``_int4_decode.plan``): a
# memory-bound kernel keeps the faster memory busy only with more bytes in flight an SM, which
# changes its fastest tile
FAST_MEMORY = 4e12


def fast_memory(like: Operand) -> bool:
    """Whether ``like``'s GPU has the faster memory (a peak of ``FAST_MEMORY`` or more: an
    H200); False for an H100, in the simulator and where the driver does not tell."""
    peak = memory_bandwidth(like)
    return peak is not None and peak >= FAST_MEMORY


def three(items: list) -> list:
    """``items`` (one to three) padded to three with the first: the kernels that take up to
    three weights or outputs (the QKV projections) get the first one's arrays for the unused
    ones, with no columns."""
    return list(items) + list(items[:1]) * (3 - len(items))
