"""Debug mode on the GPU: the error record of a kernel compiled with bounds checks.

A debug kernel (``@kaio.gpu_kernel(debug=True)`` or ``KAIO_DEBUG=1``; the checks are emitted by
``kaio.ptx.debug``) takes one hidden last parameter: the address of a small record in global
memory that the first thread failing a check fills before it exits. ``DebugRecord`` owns that
memory for one loaded kernel; its launcher refuses a launch on a stream that is capturing a CUDA
graph (``refuse_capture``), passes ``pointer`` and, after every launch, calls
``check(stream)``, which synchronizes the stream, reads the record and raises
``kaio.OutOfBoundsError`` naming the kernel, the array, the index, the thread, the block and the
source line (as the simulator does). The record is cleared after a report, so the next launch
starts clean; the CUDA context stays usable, since the failing threads exit instead of trapping.
"""

from __future__ import annotations

import json
import linecache
import re
import struct

import numpy as np

from kaio.errors import LaunchError, OutOfBoundsError
from kaio.ptx.debug import MAX_DIMS, RECORD, RECORD_BYTES, SITE_TAG
from kaio.runtime.driver import check, cu

__all__ = ["DebugRecord", "parse_sites", "describe_record"]

_SITE = re.compile(r"^\s*" + re.escape(SITE_TAG) + r"(.*)$", re.MULTILINE)


def parse_sites(ptx: str) -> dict[int, dict]:
    """The checked access sites a debug kernel's PTX describes, by site number."""
    sites = (json.loads(m.group(1)) for m in _SITE.finditer(ptx))
    return {s["site"]: s for s in sites}


def _signed(value: int, signed: bool) -> int:
    return value - 2**64 if signed and value >= 2**63 else value


def _failed_check(site: dict, index: tuple, shape: tuple, value: int, limit: int) -> str:
    """Why the access failed, for the message: which check of the site's is violated (the
    first dimension whose index is outside it, else the span's end, else the view's end)."""
    if any(not 0 <= i < n for i, n in zip(index, shape, strict=False)):
        return ""  # the index itself says it
    if "end" in site["checks"] and value >= shape[-1]:
        return f" (the access reaches element {value} of the last dimension)"
    view_end = site.get("view_end")
    if "dynamic" in site["checks"] and view_end is not None and view_end > limit:
        return (
            f" (the array ends at byte {view_end} of dynamic shared memory, but the launch gave "
            f"{limit} bytes: pass at least {view_end} as shared_bytes)"
        )
    return ""


def describe_record(kernel: str, sites: dict[int, dict], raw: bytes) -> OutOfBoundsError | None:
    """The error a record's bytes report, or None when its flag is clear."""
    flag, number = struct.unpack_from("<2I", raw, RECORD["flag"])
    if not flag:
        return None
    thread = struct.unpack_from("<3I", raw, RECORD["thread"])
    block = struct.unpack_from("<3I", raw, RECORD["block"])
    value, limit = struct.unpack_from("<2Q", raw, RECORD["value"])
    site = sites.get(number)
    if site is None:
        return OutOfBoundsError(
            f"{kernel}: out-of-bounds access by thread {thread} of block {block} (site "
            f"{number}, which the kernel's PTX does not describe)",
            kernel=kernel,
            thread=thread,
            block=block,
        )
    ndim = min(len(site["signed"]), MAX_DIMS)
    words = struct.unpack_from(f"<{ndim}Q", raw, RECORD["index"])
    index = tuple(_signed(v, s) for v, s in zip(words, site["signed"], strict=False))
    shape = tuple(_signed(v, True) for v in struct.unpack_from(f"<{ndim}Q", raw, RECORD["shape"]))
    detail = _failed_check(site, index, shape, value, limit)
    filename, line = site["file"], site["line"]
    where = f"{filename}:{line}" if filename else f"kernel {kernel}"
    source = linecache.getline(filename, line).strip() if filename else ""
    shown = ", ".join(str(i) for i in index)
    message = (
        f"{where}: out-of-bounds {site['what']} of {site['space']} array '{site['array']}' "
        f"(shape {shape}) at index [{shown}] by thread {thread} of block {block} in kernel "
        f"{kernel}{detail}" + (f"\n    {source}" if source else "")
    )
    return OutOfBoundsError(
        message,
        kernel=kernel,
        array=site["array"],
        shape=shape,
        index=index,
        thread=thread,
        block=block,
        filename=filename,
        lineno=line,
    )


class DebugRecord:
    """The error record of one debug kernel loaded on one device."""

    def __init__(self, kernel: str, ptx: str, device):
        from kaio.runtime.memory import Allocation

        self.kernel = kernel
        self.sites = parse_sites(ptx)
        self._memory = Allocation(RECORD_BYTES, device)
        self.pointer = self._memory.ptr
        self._clear()

    def _clear(self) -> None:
        check(cu.cuMemsetD8(self.pointer, 0, RECORD_BYTES), "clearing the debug record")

    @staticmethod
    def extend_format(fmt: str, size: int) -> tuple[str, int]:
        """A parameter buffer's ``struct`` format and size with the record's address added
        as the last, 8-byte aligned entry."""
        pad = -size % 8
        return fmt + "x" * pad + "Q", size + pad + 8

    def refuse_capture(self, stream: int) -> None:
        """Raise ``LaunchError`` before a launch on ``stream`` while it captures a CUDA
        graph (``cuStreamIsCapturing``): a debug kernel synchronizes after each launch to
        read its record, which a capture cannot do (and a graph replay would not report)."""
        status = check(
            cu.cuStreamIsCapturing(stream), f"asking whether {self.kernel}'s stream captures"
        )
        if int(status) != int(cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE):
            raise LaunchError(
                f"{self.kernel}: a kernel in debug mode (debug=True or KAIO_DEBUG=1) cannot be "
                f"launched while its stream ({stream:#x}) is capturing a CUDA graph: it "
                "synchronizes after each launch to read its bounds-check record. Run it in "
                "debug mode outside the capture, or capture it without debug mode"
            )

    def check(self, stream: int) -> None:
        """Wait for ``stream``, then raise ``OutOfBoundsError`` if a thread failed a check."""
        check(cu.cuStreamSynchronize(stream), f"synchronizing after {self.kernel}", stream)
        raw = np.zeros(RECORD_BYTES, np.uint8)
        check(cu.cuMemcpyDtoH(raw.ctypes.data, self.pointer, RECORD_BYTES), "reading the record")
        error = describe_record(self.kernel, self.sites, raw.tobytes())
        if error is not None:
            self._clear()
            raise error
