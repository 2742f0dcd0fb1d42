"""Streams and events: ``kaio.Stream``, ``kaio.Event``, and ``stream_handle`` which accepts
any stream a user may hold (None, ``kaio.Stream``, a raw handle, a torch or CuPy stream)."""

from __future__ import annotations

import weakref

from kaio.runtime.device import ensure_context
from kaio.runtime.driver import check, cu

__all__ = ["Stream", "Event", "stream_handle"]


def _destroy_stream(handle) -> None:
    try:
        cu.cuStreamDestroy(handle)
    except Exception:  # interpreter shutdown: the driver may be gone already
        pass


def _destroy_event(handle) -> None:
    try:
        cu.cuEventDestroy(handle)
    except Exception:  # interpreter shutdown: the driver may be gone already
        pass


class Stream:
    """A CUDA stream on the current device, destroyed when collected.

    ``Stream()`` creates one; ``kernel[grid, block, stream](...)`` launches on it. It also
    speaks the ``__cuda_stream__`` protocol, so other libraries can take it.
    """

    def __init__(self, non_blocking: bool = False):
        ensure_context()
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else 0
        self._stream = check(cu.cuStreamCreate(flags), "cuStreamCreate")
        self.handle: int = int(self._stream)
        self._finalizer = weakref.finalize(self, _destroy_stream, self._stream)

    def synchronize(self) -> None:
        """Wait for the work on this stream; a GPU fault raises ``CudaError``."""
        check(cu.cuStreamSynchronize(self._stream), "stream synchronize", self.handle)

    def query(self) -> bool:
        """True when all work on the stream has finished."""
        err = cu.cuStreamQuery(self._stream)[0]
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuStreamQuery", self.handle)
        return True

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait until ``event`` has completed."""
        check(cu.cuStreamWaitEvent(self._stream, event._event, 0), "cuStreamWaitEvent")

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"<kaio.Stream 0x{self.handle:x}>"


class Event:
    """A CUDA event, for ordering streams and timing: ``start.record(); ...; end.record();
    end.synchronize(); start.elapsed_time(end)`` in milliseconds."""

    def __init__(self, timing: bool = True):
        ensure_context()
        flags = 0 if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._event = check(cu.cuEventCreate(flags), "cuEventCreate")
        self._finalizer = weakref.finalize(self, _destroy_event, self._event)

    def record(self, stream=None) -> Event:
        """Record the event on ``stream`` (default stream when None)."""
        check(cu.cuEventRecord(self._event, stream_handle(stream)), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        """Wait until the work before the event has completed."""
        check(cu.cuEventSynchronize(self._event), "event synchronize")

    def query(self) -> bool:
        """True when the work before the event has completed."""
        err = cu.cuEventQuery(self._event)[0]
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        return True

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both recorded and complete)."""
        return check(cu.cuEventElapsedTime(self._event, end._event), "cuEventElapsedTime")


def stream_handle(stream) -> int:
    """The raw ``CUstream`` of ``stream``: None (the default stream), a ``kaio.Stream``, an int
    handle, an object with ``__cuda_stream__`` (cuda.core), ``.cuda_stream`` (torch) or ``.ptr``
    (CuPy)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if isinstance(stream, Stream):
        return stream.handle
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if value is not None:
            return int(value)
    raise TypeError(
        f"not a CUDA stream: {stream!r}; pass None, a kaio.Stream, a raw handle (int), or a "
        "torch/CuPy stream"
    )
