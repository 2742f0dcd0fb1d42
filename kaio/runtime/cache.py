"""The on-disk cubin cache.

Entries live in ``$KAIO_CACHE_DIR`` (default ``$XDG_CACHE_HOME/kaio``, else ``~/.cache/kaio``),
one file per key. Each file is a header (magic, payload length, SHA-256 of the payload) and the
payload; writes go to a temporary file in the same directory, then ``os.replace``, so readers in
other processes see either nothing or a whole entry. A damaged entry (short, wrong checksum) is
deleted and reported as a miss: the caller rebuilds it. Cache trouble never fails a launch.

The cache runs what it holds (a cubin is machine code), so it trusts its directory only when
no one else can write there: kaio creates it ``0700``, and a directory that is group- or
world-writable, or owned by another user (root aside), is not used at all (one warning; kernels
are then compiled in each process). Entries are read only from regular files (never through a
symlink, a FIFO or a device) and at most ``MAX_ENTRY_BYTES`` of them. docs/runtime.md has the
trust model.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import tempfile
import warnings
from collections.abc import Callable

__all__ = ["cache_dir", "DiskCache", "cache_key", "cached", "MAX_ENTRY_BYTES"]

MAX_ENTRY_BYTES = 256 << 20  # a larger file is no entry kaio wrote: discarded unread

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


def cache_key(spec_key: str, arch: str, driver_version: int, compiler: str = "") -> str:
    """The file key of one kernel specialization compiled for ``arch`` by this driver's JIT,
    or by the ptxas build ``compiler`` names (``KAIO_PTXAS``)."""
    text = f"{spec_key}|{arch}|{driver_version}" + (f"|{compiler}" if compiler else "")
    return hashlib.sha256(text.encode()).hexdigest()


class DiskCache:
    """A directory of checksummed entries; ``get`` returns None on a miss or a damaged entry.
    A directory others can write to is never read nor written (``trusted``)."""

    def __init__(self, directory: str | None = None):
        self.directory = directory or cache_dir()
        self._warned = False
        self._trusted: bool | None = None  # known once the directory exists

    def path(self, key: str) -> str:
        """The file holding ``key``."""
        return os.path.join(self.directory, f"{key}.cubin")

    def trusted(self) -> bool:
        """Whether the directory is private to this user: not group- or world-writable and
        owned by this user (or root). Asked of the directory once it exists; a doubtful one
        warns once and turns the cache off for this process."""
        if self._trusted is not None:
            return self._trusted
        try:
            st = os.stat(self.directory)
        except OSError:
            return True  # not there yet: put() creates it 0700
        problem = None
        if not stat.S_ISDIR(st.st_mode):
            problem = "is not a directory"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        elif hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
            problem = f"belongs to another user (uid {st.st_uid})"
        self._trusted = problem is None
        if problem is not None:
            self._warn(
                f"kaio: the kernel cache {self.directory} {problem}: anyone who can write there "
                "could plant code that runs in this process, so it is not used (kernels are "
                "compiled in each process). Run chmod 700 on it, or set KAIO_CACHE_DIR to a "
                "private directory"
            )
        return self._trusted

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, stacklevel=4)

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (a damaged entry is removed; so is
        anything but a regular file in its place, unread)."""
        if not self.trusted():
            return None
        path = self.path(key)
        data = _read_regular(path, _HEADER.size + MAX_ENTRY_BYTES)
        if data is None:
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
        self.discard(key)
        return None

    def discard(self, key: str) -> None:
        """Remove the entry of ``key`` (a damaged or untrustworthy one), if it can be."""
        _remove(self.path(key))

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
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            if not self.trusted():
                return
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(header + payload)
            os.replace(tmp, self.path(key))
        except OSError as e:
            if tmp is not None and os.path.exists(tmp):
                os.remove(tmp)
            self._warn(
                f"kaio: cannot write the kernel cache in {self.directory} ({e}); kernels "
                "will be recompiled in each process. Set KAIO_CACHE_DIR to a writable "
                "directory"
            )


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _read_regular(path: str, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a symlink, FIFO, device...) of at
    most ``limit`` bytes; None when missing. Anything else in its place is removed unread:
    opening never blocks (a FIFO) and reading never runs away (a link to /dev/zero)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP with O_NOFOLLOW), no permission...
        _remove(path)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            _remove(path)
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while read
        _remove(path)
        return None
    return data


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def cached(cache: DiskCache, key: str, build: Callable[[], bytes]) -> tuple[bytes, bool]:
    """``(payload, hit)``: the cached payload for ``key``, else ``build()`` stored and returned."""
    payload = cache.get(key)
    if payload is not None:
        return payload, True
    payload = build()
    cache.put(key, payload)
    return payload, False
