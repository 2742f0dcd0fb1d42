"""GPUs and their primary contexts: ``kaio.Device``, ``kaio.device()``, ``kaio.synchronize()``.

kaio uses each device's primary context (the one the CUDA runtime, PyTorch and CuPy share), so
pointers and streams pass freely between them. ``current.ordinal`` is the device allocations
and launches without array arguments go to; ``Device(i).set_current()`` or
``with kaio.Device(i):`` changes it. A launch with arrays runs on their device (launcher.py);
``visiting(dev)`` makes a device's context current for a block and puts the thread's own back.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property

from kaio.runtime.driver import check, cu, init

__all__ = [
    "Device",
    "device",
    "device_count",
    "ensure_context",
    "synchronize",
    "current",
    "moved",
    "visiting",
]


class _Current(threading.local):
    """The device kaio works on in the calling thread, whether this thread's CUDA context is
    set, and how many ``kaio.simulate()`` blocks it has open (launches then go to the CPU
    simulator; ``kaio.sim.mode`` keeps the count here so that a launch reads it as cheaply as
    the device). Per thread, as the CUDA runtime's current device is: primary contexts are
    shared by all threads, and a thread without a current context is given it on first use.
    The class attributes are the defaults every new thread sees."""

    _ordinal = 0
    context_ready = False
    simulating = 0
    recorder = None  # a kaio.runtime.plan.Recorder while a call plan is built: launches go to it

    def __init__(self):
        self.entered: list[tuple] = []  # what each open ``with kaio.Device(i):`` replaced

    @property
    def ordinal(self) -> int:
        """The thread's current device (0 until a thread makes another one current)."""
        return self._ordinal

    @ordinal.setter
    def ordinal(self, value: int) -> None:
        if value != 0:
            moved[0] = True
        self._ordinal = value


current = _Current()
# Whether any thread has ever made a device other than 0 current (it stays True). While it is
# False every thread's current device is 0: a launch on GPU 0 knows it is home without
# reading the thread-local ``current.ordinal`` (generated launchers: ``home(0)``).
moved = [False]


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when cuInit succeeds and at least one GPU is visible, else why not (never raises:
    machines without libcuda or cuda-bindings get a reason)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu
        except ImportError:
            return "cuda-bindings is not installed"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {err.name}"
        err, count = cu.cuDeviceGetCount()
    except Exception as e:  # libcuda missing: the bindings raise instead of returning a code
        return f"no NVIDIA driver: {e}"
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA GPU visible"
    return None


def gpu_available() -> bool:
    """True when a CUDA driver and at least one GPU are usable (never raises)."""
    return gpu_unavailable_reason() is None


def device_count() -> int:
    """Number of CUDA devices visible to this process."""
    init()
    return check(cu.cuDeviceGetCount(), "cuDeviceGetCount")


def _attribute(name: str, doc: str) -> cached_property:
    """A ``Device`` property read once from the driver: ``CU_DEVICE_ATTRIBUTE_<name>`` (an
    int), or, for a name with ``{c}``, the triple of its X, Y and Z attributes."""

    def read(self: Device) -> int | tuple[int, int, int]:
        if "{c}" in name:
            return tuple(self.attribute(name.format(c=c)) for c in "XYZ")
        return self.attribute(name)

    read.__doc__ = doc
    return cached_property(read)


class Device:
    """One CUDA device. ``kaio.Device(0)`` is the same object every time.

    Attributes read from the driver: ``name``, ``compute_capability`` ((major, minor)),
    ``arch`` (``"sm_90"``), ``total_memory`` (bytes), ``multiprocessor_count``,
    ``max_threads_per_block``, ``max_block_dim``, ``max_grid_dim``, ``max_shared_per_block``
    and ``max_shared_per_block_optin`` (bytes); ``attribute(name)`` reads any other
    ``CU_DEVICE_ATTRIBUTE_*``.
    """

    _instances: dict[int, Device] = {}
    _lock = threading.Lock()  # one Device object and one context retain per ordinal

    def __new__(cls, ordinal: int = 0) -> Device:
        ordinal = int(ordinal)
        dev = cls._instances.get(ordinal)
        if dev is not None:
            return dev
        with cls._lock:
            dev = cls._instances.get(ordinal)
            if dev is None:
                count = device_count()
                if not 0 <= ordinal < count:
                    raise ValueError(f"no CUDA device {ordinal}: this machine has {count}")
                dev = super().__new__(cls)
                dev.ordinal = ordinal
                dev._handle = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
                dev._context = None
                cls._instances[ordinal] = dev
        return dev

    def attribute(self, name: str | int) -> int:
        """A device attribute by name (``"MULTIPROCESSOR_COUNT"`` or the full
        ``"CU_DEVICE_ATTRIBUTE_..."``) or by ``CUdevice_attribute`` value."""
        if isinstance(name, str):
            full = (
                name if name.startswith("CU_DEVICE_ATTRIBUTE_") else f"CU_DEVICE_ATTRIBUTE_{name}"
            )
            try:
                attr = getattr(cu.CUdevice_attribute, full.upper())
            except AttributeError:
                raise ValueError(f"unknown device attribute {name!r}") from None
        else:
            attr = cu.CUdevice_attribute(name)
        return check(cu.cuDeviceGetAttribute(attr, self._handle), f"cuDeviceGetAttribute({name})")

    @cached_property
    def name(self) -> str:
        """The marketing name, e.g. ``"NVIDIA H100 80GB HBM3"``."""
        raw = check(cu.cuDeviceGetName(256, self._handle), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode()

    @cached_property
    def compute_capability(self) -> tuple[int, int]:
        """``(major, minor)``, e.g. ``(9, 0)``."""
        return (
            self.attribute("COMPUTE_CAPABILITY_MAJOR"),
            self.attribute("COMPUTE_CAPABILITY_MINOR"),
        )

    @property
    def arch(self) -> str:
        """The PTX target of this device, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @cached_property
    def total_memory(self) -> int:
        """Global memory in bytes."""
        return check(cu.cuDeviceTotalMem(self._handle), "cuDeviceTotalMem")

    multiprocessor_count = _attribute("MULTIPROCESSOR_COUNT", "Number of SMs.")
    max_threads_per_block = _attribute(
        "MAX_THREADS_PER_BLOCK", "The most threads one block may have."
    )
    max_block_dim = _attribute("MAX_BLOCK_DIM_{c}", "The largest block extent in x, y and z.")
    max_grid_dim = _attribute("MAX_GRID_DIM_{c}", "The largest grid extent in x, y and z.")
    max_shared_per_block = _attribute(
        "MAX_SHARED_MEMORY_PER_BLOCK", "Shared memory a block gets without opting in (48 KB)."
    )
    max_shared_per_block_optin = _attribute(
        "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
        "The most shared memory a block may opt in to (227 KB on H100).",
    )

    @property
    def context(self):
        """The device's primary context (retained once, for the life of the process)."""
        if self._context is None:
            with Device._lock:
                if self._context is None:
                    self._context = check(
                        cu.cuDevicePrimaryCtxRetain(self._handle), "cuDevicePrimaryCtxRetain"
                    )
        return self._context

    def set_current(self) -> Device:
        """Make this device current for kaio's allocations and launches (and the calling
        thread's CUDA context)."""
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        current.ordinal = self.ordinal
        current.context_ready = True
        return self

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of global memory."""
        with visiting(self):
            return check(cu.cuMemGetInfo(), "cuMemGetInfo")

    def synchronize(self) -> None:
        """Wait for all work on this device; a GPU fault raises ``CudaError`` naming the last
        kernel launched."""
        with visiting(self):
            check(cu.cuCtxSynchronize(), "synchronize")

    def __enter__(self) -> Device:
        saved = (current.ordinal, current.context_ready, _thread_context())
        current.entered.append(saved)  # per thread: Device objects are shared by all threads
        return self.set_current()

    def __exit__(self, *exc) -> None:
        # the thread's own context goes back as it was: none is created for a device that
        # was current by default but never used
        current.ordinal, current.context_ready, context = current.entered.pop()
        check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def __repr__(self) -> str:
        return f"<kaio.Device {self.ordinal}: {self.name} ({self.arch})>"


def _thread_context():
    """The calling thread's current CUDA context (a NULL one when it has none)."""
    return check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")


@contextmanager
def visiting(dev: Device) -> Iterator[Device]:
    """``dev``'s primary context current in the calling thread for the block, then the thread's
    previous context (whichever library set it, or none) current again; kaio's current device
    does not change. For the slow paths that must run in a device's context (loading a module
    for a launch on another GPU); launches switch through ``launcher.py``'s faster calls."""
    previous = _thread_context()
    if int(previous) == int(dev.context):
        yield dev
        return
    check(cu.cuCtxSetCurrent(dev.context), "cuCtxSetCurrent")
    try:
        yield dev
    finally:
        check(cu.cuCtxSetCurrent(previous), "cuCtxSetCurrent")


def ensure_context() -> Device:
    """The current device, its primary context made current on first use. A thread that
    already has a current context when kaio first needs one (made current by torch, CuPy or
    the CUDA runtime: ``torch.cuda.set_device(1)``) starts on that context's device, not on
    device 0, and keeps it current."""
    if not current.context_ready:
        init()
        if int(_thread_context()):
            current.ordinal = int(check(cu.cuCtxGetDevice(), "cuCtxGetDevice"))
        return Device(current.ordinal).set_current()
    return Device(current.ordinal)


def device() -> Device:
    """The current device: ``kaio.Device(0)``, or the device of the context the calling
    thread already had current (see ``ensure_context``), unless changed."""
    return ensure_context()


def synchronize() -> None:
    """Wait for all work on the current device (``kaio.synchronize()``)."""
    ensure_context()
    check(cu.cuCtxSynchronize(), "synchronize")
