"""The on-disk cubin cache.

Entries live in ``$KAIO_CACHE_DIR`` (default ``$XDG_CACHE_HOME/kaio``, else ``~/.cache/kaio``),
one file per key. Each file is a header (magic, payload length, SHA-256 of the payload) and the
payload; writes go to a temporary file in the same directory, then ``os.replace``, so readers in
other processes see either nothing or a whole entry. A damaged entry (short, wrong checksum) is
deleted and reported as a miss: the caller rebuilds it. Cache trouble never fails a launch.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import warnings
from collections.abc import Callable

__all__ = ["cache_dir", "DiskCache", "cache_key", "cached"]

_MAGIC = b"KAIOCUBIN1\n"
_HEADER = struct.Struct(f"<{len(_MAGIC)}sQ32s")


def cache_dir() -> str:
    """The cache directory: ``KAIO_CACHE_DIR``, else ``$XDG_CACHE_HOME/kaio``, else
    ``~/.cache/kaio``."""
    explicit = os.environ.get("KAIO_CACHE_DIR")
    if explicit:
        return os.path.expanduser(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kaio")


def cache_key(spec_key: str, arch: str, driver_version: int) -> str:
    """The file key of one kernel specialization compiled for ``arch`` by this driver."""
    text = f"{spec_key}|{arch}|{driver_version}"
    return hashlib.sha256(text.encode()).hexdigest()


class DiskCache:
    """A directory of checksummed entries; ``get`` returns None on a miss or a damaged entry."""

    def __init__(self, directory: str | None = None):
        self.directory = directory or cache_dir()
        self._warned = False

    def path(self, key: str) -> str:
        """The file holding ``key``."""
        return os.path.join(self.directory, f"{key}.cubin")

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (a damaged entry is removed)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) >= _HEADER.size:
            magic, length, digest = _HEADER.unpack_from(data)
            payload = data[_HEADER.size :]
            if (
                magic == _MAGIC
                and length == len(payload)
                and hashlib.sha256(payload).digest() == digest
            ):
                return payload
        try:
            os.remove(path)
        except OSError:
            pass
        return None

    def keys(self) -> list[str]:
        """The keys of the entries in the directory (none when it does not exist), sorted."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(n[: -len(".cubin")] for n in names if n.endswith(".cubin"))

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` atomically; an unwritable cache warns once and is skipped."""
        header = _HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest())
        tmp = None
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(header + payload)
            os.replace(tmp, self.path(key))
        except OSError as e:
            if tmp is not None and os.path.exists(tmp):
                os.remove(tmp)
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"kaio: cannot write the kernel cache in {self.directory} ({e}); kernels "
                    "will be recompiled in each process. Set KAIO_CACHE_DIR to a writable "
                    "directory",
                    stacklevel=3,
                )


def cached(cache: DiskCache, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
    """``(payload, hit)``: the cached payload for ``key``, else ``build()`` stored and returned."""
    payload = cache.get(key)
    if payload is not None:
        return payload, True
    payload = build()
    cache.put(key, payload)
    return payload, False
