"""A C function called from Python without ctypes: ``trampoline(address)``.

kaio launches a kernel by calling libcuda's ``cuLaunchKernelEx(config, function,
kernelParams, extra)`` with four ctypes ``byref`` objects made once (``launcher.py``). A call
through a ctypes function pointer costs about 0.2 to 0.3 µs of the 4 µs a launch takes
(libffi, and ctypes converting each argument); a builtin function takes a fraction of that.
``trampoline(address)`` is such a builtin, ``f(a, b, c, d) -> int``, which calls the C function
at ``address`` (four pointer arguments, an ``int`` result) with the pointers ctypes would pass
for the same arguments: a ``byref`` gives its pointer, None gives NULL; any other argument, or
another count, raises ``TypeError``. So it replaces the ctypes prototype where the launches
call it, with nothing else changed, and keeps the GIL as that prototype does.

The builtin's code is twenty machine instructions compiled by LLVM (llvmlite) from the IR
below, position-independent and with no relocations: everything it calls or compares with
comes from a table of addresses in its ``self`` object, a ``bytes`` of this process's
addresses (the target, ``None``, the ``byref`` type, ``PyLong_FromLong``,
``PyErr_BadArgument``). The machine code is cached on disk beside the cubins (the same
directory, the same trust model: ``cache.py``), so llvmlite is imported once per machine, not
once per process; a process maps the cached bytes executable (``mmap``, ``mprotect``) and
makes the builtin with ``PyCFunction_NewEx``.

Where any of that is not possible (llvmlite missing and nothing cached, not CPython on x86-64
Linux, objects laid out otherwise than probed), ``trampoline`` returns None and the launches
keep calling through ctypes. The builtin keeps no state and touches no reference count but
its result's, so any thread may call it.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import struct
import sys
from collections.abc import Callable

__all__ = ["trampoline", "status"]

# the table in the builtin's ``self`` (a bytes object), one 8-byte word each, in this order
_TABLE = ("target", "none", "byref_type", "from_long", "bad_argument")
_METH_FASTCALL = 0x0080
_ARGUMENTS = 4


def _ir(payload: int, type_offset: int, value_offset: int) -> str:
    """The builtin's LLVM IR: ``PyObject *call(PyObject *self, PyObject *const *args,
    Py_ssize_t nargs)`` (METH_FASTCALL). ``payload``: where a bytes object's bytes start;
    ``type_offset``: an object's type pointer; ``value_offset``: a ``byref``'s pointer."""
    word = {name: 8 * i for i, name in enumerate(_TABLE)}
    lines = [
        "define ptr @call(ptr %self, ptr %args, i64 %nargs) {",
        "entry:",
        f"  %table = getelementptr i8, ptr %self, i64 {payload}",
    ]
    for name in _TABLE:
        lines += [
            f"  %{name}.at = getelementptr i8, ptr %table, i64 {word[name]}",
            f"  %{name} = load ptr, ptr %{name}.at",
        ]
    lines += [
        f"  %counted = icmp eq i64 %nargs, {_ARGUMENTS}",
        "  br i1 %counted, label %arg0, label %bad",
    ]
    for i in range(_ARGUMENTS):  # None -> NULL, a byref -> its pointer, else TypeError
        lines += [
            f"arg{i}:",
            f"  %obj{i}.at = getelementptr ptr, ptr %args, i64 {i}",
            f"  %obj{i} = load ptr, ptr %obj{i}.at",
            f"  %is_none{i} = icmp eq ptr %obj{i}, %none",
            f"  br i1 %is_none{i}, label %join{i}, label %typed{i}",
            f"typed{i}:",
            f"  %type{i}.at = getelementptr i8, ptr %obj{i}, i64 {type_offset}",
            f"  %type{i} = load ptr, ptr %type{i}.at",
            f"  %is_byref{i} = icmp eq ptr %type{i}, %byref_type",
            f"  br i1 %is_byref{i}, label %byref{i}, label %bad",
            f"byref{i}:",
            f"  %value{i}.at = getelementptr i8, ptr %obj{i}, i64 {value_offset}",
            f"  %value{i} = load ptr, ptr %value{i}.at",
            f"  br label %join{i}",
            f"join{i}:",
            f"  %p{i} = phi ptr [ null, %arg{i} ], [ %value{i}, %byref{i} ]",
            f"  br label %{'arg' + str(i + 1) if i + 1 < _ARGUMENTS else 'call'}",
        ]
    pointers = ", ".join(f"ptr %p{i}" for i in range(_ARGUMENTS))
    lines += [
        "call:",
        f"  %rc = call i32 %target({pointers})",
        "  %wide = sext i32 %rc to i64",
        "  %result = call ptr %from_long(i64 %wide)",
        "  ret ptr %result",
        "bad:",
        "  %ignored = call i32 %bad_argument()",
        "  ret ptr null",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _compile(ir: str) -> bytes:
    """The machine code of ``ir``'s one function for this host (position-independent), from
    an object file LLVM emits: its ``.text``. Raises ``RuntimeError`` if the object has
    relocations (the code would need linking, which a plain copy does not do)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(ir)
    module.verify()
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(opt=2, reloc="pic", codemodel="small")
    sections = {
        section.name(): section.data()
        for section in llvm.ObjectFileRef.from_data(machine.emit_object(module)).sections()
    }
    if b".text" not in sections or {b".rel.text", b".rela.text"} & sections.keys():
        raise RuntimeError(f"the trampoline did not compile to relocation-free code: {[*sections]}")
    return bytes(sections[b".text"])


def _executable(code: bytes) -> int:
    """The address of a private copy of ``code`` in memory that may run but not be written
    (written first, then made read-and-execute), kept for the life of the process."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    size = max(len(code), 1)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap of the trampoline's code failed")
    ctypes.memmove(address, code, len(code))
    if libc.mprotect(address, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of the trampoline's code failed")
    return address


def _byref_value_offset() -> int:
    """Where a ``byref`` object keeps the pointer it passes (ctypes' ``PyCArgObject.value``),
    found in two byrefs of different offsets and checked in a third; ``RuntimeError`` if no
    one offset holds all three."""
    anchor = ctypes.create_string_buffer(64)
    base = ctypes.addressof(anchor)
    refs = [(ctypes.byref(anchor, k), base + k) for k in (8, 24, 40)]
    size = sys.getsizeof(refs[0][0])
    for offset in range(0, size - 7, 8):
        if all(ctypes.c_void_p.from_address(id(r) + offset).value == want for r, want in refs):
            return offset
    raise RuntimeError("no pointer field found in ctypes.byref objects")


def _layout() -> tuple[int, int, int]:
    """(a bytes object's payload offset, an object's type pointer offset, a byref's pointer
    offset) in this interpreter, each checked on a live object."""
    payload = bytes.__basicsize__ - 1  # PyBytesObject: the header, then ob_sval (NUL-ended)
    probe = b"kaio trampoline"
    if ctypes.string_at(id(probe) + payload, len(probe)) != probe:
        raise RuntimeError("bytes objects are laid out otherwise")
    type_offset = object.__basicsize__ - 8  # the object header ends with its type pointer
    if ctypes.c_void_p.from_address(id(probe) + type_offset).value != id(bytes):
        raise RuntimeError("object headers are laid out otherwise")
    return payload, type_offset, _byref_value_offset()


class _MethodDef(ctypes.Structure):
    """CPython's ``PyMethodDef``."""

    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


_code: int | None = None  # the address of the loaded machine code, once loaded
_why_not: str | None = None  # why there is none, once that is known
_kept: list = []  # method definitions the builtins point to: alive as long as the process


def _supported() -> str | None:
    """Why this interpreter cannot run the trampoline, or None (the object layouts it relies
    on are checked on live objects: ``_layout``)."""
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name} is not CPython"
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return f"{sys.platform} {os.uname().machine} (only x86-64 Linux is done)"
    return None


def _load() -> int:
    """The address of the trampoline's machine code: from the disk cache, else compiled
    (llvmlite) and cached."""
    from kaio.runtime.cache import cached
    from kaio.runtime.module import disk_cache

    ir = _ir(*_layout())
    key = "trampoline-" + hashlib.sha256(f"{ir}|{os.uname().machine}".encode()).hexdigest()
    code, _ = cached(disk_cache(), key, lambda: _compile(ir))
    return _executable(code)


def trampoline(address: int, name: str = "call") -> Callable | None:
    """A builtin ``f(a, b, c, d) -> int`` that calls the C function ``int fn(void *, void *,
    void *, void *)`` at ``address`` with each argument's pointer (a ``ctypes.byref``'s, NULL
    for None), keeping the GIL; None where the trampoline cannot be had (``status()`` says
    why)."""
    global _code, _why_not
    if _code is None and _why_not is None:
        _why_not = _supported()
        if _why_not is None:
            try:
                _code = _load()
            except Exception as e:  # noqa: BLE001 (no llvmlite, an odd layout: use ctypes)
                _why_not = f"{type(e).__name__}: {e}"
    if _code is None:
        return None
    api = ctypes.pythonapi
    table = struct.pack(
        f"={len(_TABLE)}Q",
        address,
        id(None),
        id(type(ctypes.byref(ctypes.c_char()))),
        ctypes.cast(api.PyLong_FromLong, ctypes.c_void_p).value,
        ctypes.cast(api.PyErr_BadArgument, ctypes.c_void_p).value,
    )
    definition = _MethodDef(name.encode(), _code, _METH_FASTCALL, None)
    _kept.append(definition)
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]
    return new(ctypes.byref(definition), table, None)  # the builtin holds the table


def status() -> str:
    """How the launches call the driver: ``"native"``, or ``"ctypes (<why>)"``."""
    return "native" if _code is not None else f"ctypes ({_why_not or 'not tried yet'})"
