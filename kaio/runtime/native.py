"""C functions called from Python without ctypes: ``trampoline(address)``, ``launch_front``.

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

``launch_front(...)`` makes a second kind of builtin from the same machinery: the front of a
launcher (``launcher.front_setup``). It tests that a call's positional arguments are the
ones launched last (a memo the Python launch publishes: each argument by identity, a
``DeviceArray`` by its ``ArgInfo``), that the module flags hold their resting values and
that the thread's current CUDA context is the launcher's (``cuCtxGetCurrent``), and calls
``cuLaunchKernelEx`` itself; any other call goes to the Python launch it fronts, as it was
made (``PyObject_Vectorcall``). The memos of a launcher of torch tensors leave the tensors
out and hold the guard of the dims their buffer was packed with: the front calls its check
(torch's ``TensorGuards.check``, a C function) with the tensors and reads each one's
``data_ptr()``, and writes their addresses into the parameter buffer before the driver
call. Its ``self`` is a tuple of the objects it reads, so it holds them; the object layouts
it reads (a tuple's items, a list's item array, an object's slot) are probed on live objects
like the rest.

Where any of that is not possible (llvmlite missing and nothing cached, not CPython on x86-64
Linux, a free-threaded build, objects laid out otherwise than probed), ``trampoline`` returns
None and the launches keep calling through ctypes (and ``launch_front`` None: no front). The
trampoline keeps no state and touches no reference count but its result's, so any thread may
call it; a front holds the GIL from its first test to its return.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import struct
import sys
import sysconfig
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


def _load_ir(name: str, base: str, offset: int, kind: str = "ptr") -> list[str]:
    """IR lines that load ``%{name}`` (a ``kind``) from ``offset`` bytes past ``%{base}``."""
    return [
        f"  %{name}.at = getelementptr i8, ptr %{base}, i64 {offset}",
        f"  %{name} = load {kind}, ptr %{name}.at",
    ]


# the items of a launch front's ``self`` (a tuple), in this order; then, in a front of torch
# tensors, ``_TENSOR_ITEMS``; then its guards' pairs
_FRONT = ("fallback", "memos", "config", "function", "last", "name", "wrapper", "wrapped",
          "byref_type", "none", "int_type", "words")  # fmt: skip
_TENSOR_ITEMS = ("table", "data_ptr", "true", "tensor_key")
# the words of a front's "words" item (a bytes object), 8 bytes each: the C functions it calls
# and the CUDA context a launch must find current
_FRONT_WORDS = ("target", "incref", "decref", "set_item", "vectorcall", "compare",
                "context_get", "context", "err_clear", "err_occurred", "as_pointer")  # fmt: skip
_METH_KEYWORDS = 0x0002
_PY_EQ = 2
MAX_TENSORS = 16  # the most torch tensors a front takes (its stack arrays' size)


def _front_ir(guards: int, tensors: bool, offsets: dict) -> str:
    """A launch front's LLVM IR: ``PyObject *front(PyObject *self, PyObject *const *args,
    Py_ssize_t nargs, PyObject *kwnames)`` (METH_FASTCALL | METH_KEYWORDS), ``self`` a tuple
    (``_FRONT``, then with ``tensors`` ``_TENSOR_ITEMS``, then ``guards`` pairs of a list
    and the object its item 0 must be). ``offsets``: the object layouts (``_layout``,
    ``_containers``, the wrapper's slot). In order: the memo whose keys are the call's
    arguments (``_scan_ir``); with ``tensors``, the tensor tests, which can run Python
    (``_tensor_ir``: the memo held meanwhile, and still its buffer's after); the guards; the
    thread's context; then, with no Python since the last test, the tensors' addresses into
    the buffer and the launch."""
    o = offsets
    names = [*_FRONT, *(_TENSOR_ITEMS if tensors else ())]
    word = {name: 8 * i for i, name in enumerate(_FRONT_WORDS)}
    fail = "drop" if tensors else "miss"  # a miss once the memo is held
    stack = ("tensors", "pointers") if tensors else ()  # the tensors, their addresses
    lines = [
        "define ptr @front(ptr %self, ptr %args, i64 %nargs, ptr %kwnames) {",
        "entry:",
        "  %ctx.slot = alloca ptr",
        "  store ptr null, ptr %ctx.slot",
        *(f"  %{name} = alloca ptr, i64 {MAX_TENSORS}" for name in stack),
        f"  %items = getelementptr i8, ptr %self, i64 {o['tuple_items']}",
    ]
    guard_items = [(f"g{g}.{part}", len(names) + 2 * g + j)
                   for g in range(guards) for j, part in enumerate(("list", "want"))]  # fmt: skip
    for name, i in [*((n, i) for i, n in enumerate(names)), *guard_items]:
        lines += _load_ir(name, "items", 8 * i)
    lines += [f"  %table.words = getelementptr i8, ptr %words, i64 {o['payload']}"]
    for name, offset in word.items():
        lines += _load_ir(f"w.{name}", "table.words", offset)
    lines += [
        "  %positional = icmp eq ptr %kwnames, null",
        "  br i1 %positional, label %scan.start, label %miss",
        *_scan_ir(o, tensors),
        "found:",
    ]
    after = "guard0" if guards else "context"
    lines += _tensor_ir(o, after) if tensors else [f"  br label %{after}"]
    for g in range(guards):  # each guard list's item 0 the object wanted, by identity
        lines += [f"guard{g}:"] + _load_ir(f"g{g}.array", f"g{g}.list", o["list_items"])
        lines += [
            f"  %g{g}.item = load ptr, ptr %g{g}.array",
            f"  %g{g}.same = icmp eq ptr %g{g}.item, %g{g}.want",
            f"  br i1 %g{g}.same, label %{f'guard{g + 1}' if g + 1 < guards else 'context'}, "
            f"label %{fail}",
        ]
    lines += [
        "context:",  # the launcher's context current in this thread
        "  %ctx.rc = call i32 %w.context_get(ptr %ctx.slot)",
        "  %ctx.value = load ptr, ptr %ctx.slot",
        "  %ctx.ok = icmp eq i32 %ctx.rc, 0",
        "  %ctx.same = icmp eq ptr %ctx.value, %w.context",
        "  %ctx.hit = and i1 %ctx.ok, %ctx.same",
        f"  br i1 %ctx.hit, label %call, label %{fail}",
        "call:",
        *_load_ir("params", "params.obj", o["value"]),
        *_load_ir("config.pointer", "config", o["value"]),
        *_load_ir("function.pointer", "function", o["value"]),
    ]
    if tensors:  # each tensor's address into its entry of the parameter buffer
        lines += [
            "  br label %write",
            "write:",
            "  %v = phi i64 [ 0, %call ], [ %v.next, %write.body ]",
            "  %v.more = icmp ult i64 %v, %tab.count",
            "  br i1 %v.more, label %write.body, label %driver",
            "write.body:",
            "  %v.pair = shl i64 %v, 1",
            "  %v.index = or i64 %v.pair, 1",
            "  %v.entry.at = getelementptr i64, ptr %tab, i64 %v.index",
            "  %v.entry = load i64, ptr %v.entry.at",
            "  %v.slot.at = getelementptr ptr, ptr %params, i64 %v.entry",
            "  %v.slot = load ptr, ptr %v.slot.at",
            "  %v.value.at = getelementptr ptr, ptr %pointers, i64 %v",
            "  %v.value = load ptr, ptr %v.value.at",
            "  store ptr %v.value, ptr %v.slot",
            "  %v.next = add i64 %v, 1",
            "  br label %write",
        ]
    else:
        lines += ["  br label %driver"]
    lines += [
        "driver:",
        "  %rc = call i32 %w.target(ptr %config.pointer, ptr %function.pointer, "
        "ptr %params, ptr null)",
        "  %failed = icmp ne i32 %rc, 0",  # the fallback launches again and explains
        f"  br i1 %failed, label %{fail}, label %noted",
        "noted:",
        *_load_ir("last.array", "last", o["list_items"]),
        "  %last.item = load ptr, ptr %last.array",
        "  %named = icmp eq ptr %last.item, %name",
        "  br i1 %named, label %done, label %note",
        "note:",  # last[0] = name
        "  call void %w.incref(ptr %name)",
        "  %ignored = call i32 %w.set_item(ptr %last, i64 0, ptr %name)",
        "  br label %done",
        "done:",
        *(["  call void %w.decref(ptr %memo.tuple)"] if tensors else []),
        "  call void %w.incref(ptr %none)",
        "  ret ptr %none",
        *(
            ["drop:", "  call void %w.decref(ptr %memo.tuple)", "  br label %miss"]
            if tensors
            else []
        ),  # fmt: skip
        "miss:",
        "  %result = call ptr %w.vectorcall(ptr %fallback, ptr %args, i64 %nargs, ptr %kwnames)",
        "  ret ptr %result",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _scan_ir(o: dict, tensors: bool) -> list[str]:
    """The memo scan of a front (``_front_ir``), from ``scan.start:`` to a branch to
    ``found:`` with ``%list`` (the memo's list), ``%memo.tuple`` and ``%params.obj.at`` (its
    keys' end) set, or to ``miss:``. The memos: a tuple of one-item lists, each item
    ``(keys..., params byref, config byref[, the guard's tuple])``; the first whose keys are
    the arguments is taken: each by identity (a wrapper by the object in its slot, a key
    ``tensor_key`` in a front of ``tensors`` skipped), two ``int``s by value."""
    return [
        "scan.start:",
        *_load_ir("memos.count", "memos", o["size"], "i64"),
        f"  %memos.items = getelementptr i8, ptr %memos, i64 {o['tuple_items']}",
        f"  %expected = add i64 %nargs, {3 if tensors else 2}",
        "  br label %scan",
        "scan:",
        "  %m = phi i64 [ 0, %scan.start ], [ %m.next, %other ]",
        "  %memos.more = icmp ult i64 %m, %memos.count",
        "  br i1 %memos.more, label %memo.read, label %miss",
        "memo.read:",
        "  %list.at = getelementptr ptr, ptr %memos.items, i64 %m",
        "  %list = load ptr, ptr %list.at",
        *_load_ir("memo.array", "list", o["list_items"]),
        "  %memo.tuple = load ptr, ptr %memo.array",
        *_load_ir("memo.size", "memo.tuple", o["size"], "i64"),
        f"  %keys = getelementptr i8, ptr %memo.tuple, i64 {o['tuple_items']}",
        "  %counted = icmp eq i64 %memo.size, %expected",
        "  br i1 %counted, label %loop, label %other",
        "other:",
        "  %m.next = add i64 %m, 1",
        "  br label %scan",
        "loop:",
        "  %i = phi i64 [ 0, %memo.read ], [ %i.next, %next ]",
        "  %more = icmp ult i64 %i, %nargs",
        "  br i1 %more, label %body, label %keyed",
        "body:",
        "  %key.at = getelementptr ptr, ptr %keys, i64 %i",
        "  %key = load ptr, ptr %key.at",
        *(
            [  # a tensor's place: the guard checks it
                "  %is.tensor = icmp eq ptr %key, %tensor_key",
                "  br i1 %is.tensor, label %next, label %argument",
            ]
            if tensors
            else ["  br label %argument"]
        ),  # fmt: skip
        "argument:",
        "  %arg.at = getelementptr ptr, ptr %args, i64 %i",
        "  %arg = load ptr, ptr %arg.at",
        *_load_ir("type", "arg", o["type"]),
        "  %is.wrapper = icmp eq ptr %type, %wrapper",
        "  br i1 %is.wrapper, label %unwrap, label %bare",
        "unwrap:",  # a wrapper stands for the object in its slot
        *_load_ir("inner", "arg", o["slot"]),
        "  br label %compare",
        "bare:",  # a wrapped object itself is never a key's match
        "  %is.wrapped = icmp eq ptr %type, %wrapped",
        "  br i1 %is.wrapped, label %miss, label %compare",
        "compare:",
        "  %value = phi ptr [ %inner, %unwrap ], [ %arg, %bare ]",
        "  %same = icmp eq ptr %value, %key",
        "  br i1 %same, label %next, label %unequal",
        "unequal:",  # two ints: equal values pack the same bytes
        *_load_ir("value.type", "value", o["type"]),
        *_load_ir("key.type", "key", o["type"]),
        "  %value.int = icmp eq ptr %value.type, %int_type",
        "  %key.int = icmp eq ptr %key.type, %int_type",
        "  %ints = and i1 %value.int, %key.int",
        "  br i1 %ints, label %valued, label %other",
        "valued:",
        f"  %equal = call i32 %w.compare(ptr %value, ptr %key, i32 {_PY_EQ})",
        "  %equal.ints = icmp eq i32 %equal, 1",
        "  br i1 %equal.ints, label %next, label %other",
        "next:",
        "  %i.next = add i64 %i, 1",
        "  br label %loop",
        "keyed:",
        "  %params.obj.at = getelementptr ptr, ptr %keys, i64 %nargs",
        "  %params.obj = load ptr, ptr %params.obj.at",
        "  %config.key.at = getelementptr ptr, ptr %params.obj.at, i64 1",
        "  %config.key = load ptr, ptr %config.key.at",
        "  %config.same = icmp eq ptr %config.key, %config",
        "  br i1 %config.same, label %typed, label %other",
        "typed:",
        *_load_ir("params.type", "params.obj", o["type"]),
        "  %params.byref = icmp eq ptr %params.type, %byref_type",
        "  br i1 %params.byref, label %found, label %other",
    ]


def _tensor_ir(o: dict, after: str) -> list[str]:
    """The tensor tests of a front of torch tensors (``_front_ir``), from ``found:`` on to
    a branch to ``after``: the memo held (until the front returns), its guard's check (the
    tuple's item 0) called with the tensors (the arguments at the table's positions), each
    tensor's ``data_ptr()`` read into ``%pointers``; then the memo still its list's item
    (no launch has packed its buffer again meanwhile: that replaces the memo first). An
    exception from the check or ``data_ptr`` is cleared and the call handed to the
    fallback, which makes them again."""
    return [
        "  call void %w.incref(ptr %memo.tuple)",
        "  %g.at = getelementptr ptr, ptr %params.obj.at, i64 2",
        "  %g = load ptr, ptr %g.at",
        *_load_ir("check", "g", o["tuple_items"]),
        *_load_ir("tab.size", "table", o["size"], "i64"),  # (position, entry) pairs of words
        "  %tab.count = lshr i64 %tab.size, 4",
        f"  %tab = getelementptr i8, ptr %table, i64 {o['payload']}",
        "  br label %gather",
        "gather:",
        "  %t = phi i64 [ 0, %found ], [ %t.next, %gathered ]",
        "  %t.more = icmp ult i64 %t, %tab.count",
        "  br i1 %t.more, label %gather.body, label %checking",
        "gather.body:",
        "  %t.pair = shl i64 %t, 1",
        "  %t.pos.at = getelementptr i64, ptr %tab, i64 %t.pair",
        "  %t.pos = load i64, ptr %t.pos.at",
        "  %t.inside = icmp ult i64 %t.pos, %nargs",
        "  br i1 %t.inside, label %gathered, label %drop",
        "gathered:",
        "  %t.arg.at = getelementptr ptr, ptr %args, i64 %t.pos",
        "  %t.arg = load ptr, ptr %t.arg.at",
        "  %t.into = getelementptr ptr, ptr %tensors, i64 %t",
        "  store ptr %t.arg, ptr %t.into",
        "  %t.next = add i64 %t, 1",
        "  br label %gather",
        "checking:",
        "  %verdict = call ptr %w.vectorcall(ptr %check, ptr %tensors, i64 %tab.count, ptr null)",
        "  %raised = icmp eq ptr %verdict, null",
        "  br i1 %raised, label %clear, label %judged",
        "judged:",
        "  %passed = icmp eq ptr %verdict, %true",
        "  call void %w.decref(ptr %verdict)",
        "  br i1 %passed, label %read, label %drop",
        "read:",
        "  %r = phi i64 [ 0, %judged ], [ %r.next, %read.stored ]",
        "  %r.more = icmp ult i64 %r, %tab.count",
        "  br i1 %r.more, label %read.body, label %still",
        "read.body:",
        "  %r.tensor.at = getelementptr ptr, ptr %tensors, i64 %r",
        "  %r.long = call ptr %w.vectorcall(ptr %data_ptr, ptr %r.tensor.at, i64 1, ptr null)",
        "  %r.raised = icmp eq ptr %r.long, null",
        "  br i1 %r.raised, label %clear, label %read.convert",
        "read.convert:",
        "  %r.value = call ptr %w.as_pointer(ptr %r.long)",
        "  call void %w.decref(ptr %r.long)",
        "  %r.zero = icmp eq ptr %r.value, null",
        "  br i1 %r.zero, label %read.zero, label %read.stored",
        "read.zero:",  # NULL: an address of 0, or an error
        "  %r.error = call ptr %w.err_occurred()",
        "  %r.failed = icmp ne ptr %r.error, null",
        "  br i1 %r.failed, label %clear, label %read.stored",
        "read.stored:",
        "  %r.into = getelementptr ptr, ptr %pointers, i64 %r",
        "  store ptr %r.value, ptr %r.into",
        "  %r.next = add i64 %r, 1",
        "  br label %read",
        "still:",
        *_load_ir("now.array", "list", o["list_items"]),
        "  %now = load ptr, ptr %now.array",
        "  %kept = icmp eq ptr %now, %memo.tuple",
        f"  br i1 %kept, label %{after}, label %drop",
        "clear:",
        "  call void %w.err_clear()",
        "  br label %drop",
    ]


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


def _containers() -> tuple[int, int, int]:
    """(a tuple's first item, a list's item array pointer, a sized object's length) offsets
    in this interpreter, each checked on a live object."""
    probe, items = (object(), object()), [object()]
    tuple_items = tuple.__basicsize__  # PyTupleObject: the sized header, then ob_item[]
    if ctypes.c_void_p.from_address(id(probe) + tuple_items).value != id(probe[0]):
        raise RuntimeError("tuples are laid out otherwise")
    size = object.__basicsize__  # PyVarObject: the object header, then ob_size
    if ctypes.c_ssize_t.from_address(id(probe) + size).value != len(probe):
        raise RuntimeError("sized objects are laid out otherwise")
    list_items = size + 8  # PyListObject: the sized header, then ob_item
    array = ctypes.c_void_p.from_address(id(items) + list_items).value
    if ctypes.c_void_p.from_address(array).value != id(items[0]):
        raise RuntimeError("lists are laid out otherwise")
    return tuple_items, list_items, size


def slot_offset(cls: type, name: str) -> int:
    """Where an instance of ``cls`` (a class with ``__slots__``) keeps its slot ``name``,
    found on a new instance holding a probe there and no other slot set."""
    obj, probe = cls.__new__(cls), object()
    setattr(obj, name, probe)
    for offset in range(0, sys.getsizeof(obj) - 7, 8):
        if ctypes.c_void_p.from_address(id(obj) + offset).value == id(probe):
            return offset
    raise RuntimeError(f"no slot {name!r} found in {cls.__name__} objects")


class _MethodDef(ctypes.Structure):
    """CPython's ``PyMethodDef``."""

    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


_codes: dict[str, int] = {}  # builtin -> the address of its machine code, once loaded
_why_not: dict[str, str] = {}  # code -> why there is none, once that is known
_kept: list = []  # method definitions the builtins point to: alive as long as the process


def _supported() -> str | None:
    """Why this interpreter cannot run the trampoline, or None (the object layouts it relies
    on are checked on live objects: ``_layout``)."""
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name} is not CPython"
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return f"{sys.platform} {os.uname().machine} (only x86-64 Linux is done)"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):  # a front's tests and launch are one step
        return "a free-threaded build (no GIL)"
    return None


def _load(ir: str) -> int:
    """The address of ``ir``'s machine code: from the disk cache, else compiled (llvmlite)
    and cached."""
    from kaio.runtime.cache import cached
    from kaio.runtime.module import disk_cache

    key = "trampoline-" + hashlib.sha256(f"{ir}|{os.uname().machine}".encode()).hexdigest()
    code, _ = cached(disk_cache(), key, lambda: _compile(ir))
    return _executable(code)


def _loaded(name: str, make_ir: Callable[[], str]) -> int | None:
    """The address of the machine code of ``name`` (``make_ir()``'s, loaded once), or None
    where there can be none (``_why_not[name]`` says why)."""
    if name not in _codes and name not in _why_not:
        why = _supported()
        if why is None:
            try:
                _codes[name] = _load(make_ir())
            except Exception as e:  # noqa: BLE001 (no llvmlite, an odd layout: use ctypes)
                why = f"{type(e).__name__}: {e}"
        if why is not None:
            _why_not[name] = why
    return _codes.get(name)


def _builtin(code: int, name: str, flags: int, state: object) -> Callable:
    """A builtin function ``name`` running ``code`` with ``state`` as its ``self``."""
    definition = _MethodDef(name.encode(), code, flags, None)
    _kept.append(definition)
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.POINTER(_MethodDef), ctypes.py_object, ctypes.py_object]
    return new(ctypes.byref(definition), state, None)  # the builtin holds its state


def _address(function) -> int:
    """The address of a function of ``ctypes.pythonapi``."""
    return ctypes.cast(function, ctypes.c_void_p).value


def trampoline(address: int, name: str = "call") -> Callable | None:
    """A builtin ``f(a, b, c, d) -> int`` that calls the C function ``int fn(void *, void *,
    void *, void *)`` at ``address`` with each argument's pointer (a ``ctypes.byref``'s, NULL
    for None), keeping the GIL; None where the trampoline cannot be had (``status()`` says
    why)."""
    code = _loaded("trampoline", lambda: _ir(*_layout()))
    if code is None:
        return None
    api = ctypes.pythonapi
    table = struct.pack(
        f"={len(_TABLE)}Q",
        address,
        id(None),
        id(type(ctypes.byref(ctypes.c_char()))),
        _address(api.PyLong_FromLong),
        _address(api.PyErr_BadArgument),
    )
    return _builtin(code, name, _METH_FASTCALL, table)


def _front_code(guards: int, tensors: bool, wrapper: tuple[type, str, type]) -> int | None:
    """The address of the machine code of a launch front with ``guards`` guards, of torch
    ``tensors`` or not, and ``wrapper`` (``launch_front``), or None where there can be none."""
    kind, slot, _ = wrapper

    def ir() -> str:
        payload, type_offset, value_offset = _layout()
        tuple_items, list_items, size = _containers()
        offsets = dict(payload=payload, type=type_offset, value=value_offset, size=size,
                       tuple_items=tuple_items, list_items=list_items,
                       slot=slot_offset(kind, slot))  # fmt: skip
        return _front_ir(guards, tensors, offsets)

    return _loaded(f"front {guards} {'tensors ' * tensors}{kind.__qualname__}.{slot}", ir)


def fronts(guards: int, wrapper: tuple[type, str, type], tensors: bool = False) -> bool:
    """Whether ``launch_front`` can make fronts with these ``guards`` (a count) and
    ``wrapper``, of torch ``tensors`` or not, in this process."""
    return _front_code(guards, tensors, wrapper) is not None


TENSOR_KEY = object()  # a memo's key in a tensor's place (``launch_front``'s ``tensors``)


def _data_ptr():
    """torch's ``Tensor.data_ptr`` method descriptor (a C function of the tensor), or None."""
    try:
        import torch

        method = torch._C.TensorBase.data_ptr
    except (ImportError, AttributeError):
        return None
    return method if type(method).__name__ == "method_descriptor" else None


def launch_front(
    target: int,
    fallback: Callable,
    memos: tuple,
    config,
    function,
    last: list,
    name: str,
    guards: tuple,
    wrapper: tuple[type, str, type],
    context: tuple[int, int],
    tensors: list[tuple[int, int]] | None = None,
) -> Callable | None:
    """A builtin ``front(*args, **kwargs)`` that launches a call like the last one again
    with no Python in between, and hands every other call to ``fallback`` as it was made.

    ``memos`` is a tuple of one-item lists, each item a tuple ``(keys..., params, config)``
    (``(keys..., params, config, guard)`` in a front of ``tensors``). When, for one of them,
    the call has one positional argument a key, each argument is its key (by identity; two
    ``int``s by value; ``wrapper``, ``(type, slot, wrapped type)``: an instance of the type
    stands for the object in its slot, and an object of the wrapped type is never taken
    itself), the memo's ``config`` is ``config``, every guard ``(list, value)`` has
    ``list[0] is value`` and the C function at ``context[0]`` (``cuCtxGetCurrent``) gives
    the context ``context[1]``, the front calls the C function at ``target``
    (``cuLaunchKernelEx``) with the pointers of ``config``, ``function`` and ``params``
    (``byref``s) and NULL; on success it sets ``last[0] = name`` and returns None. A failed
    call goes to ``fallback`` too, which launches again and explains.

    ``tensors``, ``[(position, entry), ...]``: the arguments at those positions are torch
    tensors, whose keys are ``TENSOR_KEY``, and a memo's ``guard`` is a tuple whose item 0
    is a check (``arguments.tensor_check``) of the dims its buffer holds. Once a memo's
    other keys match, the front calls that check with the tensors and reads each one's
    ``data_ptr()`` (these may run Python: a tensor subclass, a torch function mode, so the
    memo must still be its list's item after them, and the guards and the context are
    tested after them), then writes each address into its ``kernelParams`` entry and
    launches. It holds ``fallback``, ``memos`` and the rest. None where there can be no
    front (``status()`` and ``_why_not`` say why)."""
    if tensors is not None and (len(tensors) > MAX_TENSORS or _data_ptr() is None):
        return None
    code = _front_code(len(guards), tensors is not None, wrapper)
    if code is None:
        return None
    api = ctypes.pythonapi
    get_context, current_context = context
    addresses = dict(target=target, incref=_address(api.Py_IncRef),
                     decref=_address(api.Py_DecRef), set_item=_address(api.PyList_SetItem),
                     vectorcall=_address(api.PyObject_Vectorcall),
                     compare=_address(api.PyObject_RichCompareBool), context_get=get_context,
                     context=current_context, err_clear=_address(api.PyErr_Clear),
                     err_occurred=_address(api.PyErr_Occurred),
                     as_pointer=_address(api.PyLong_AsVoidPtr))  # fmt: skip
    words = struct.pack(f"={len(_FRONT_WORDS)}Q", *(addresses[w] for w in _FRONT_WORDS))
    byref_type = type(ctypes.byref(ctypes.c_char()))
    kind, _, wrapped = wrapper
    state = (fallback, memos, config, function, last, name, kind, wrapped, byref_type, None,
             int, words)  # fmt: skip
    if tensors is not None:
        table = struct.pack(f"={2 * len(tensors)}Q", *(n for place in tensors for n in place))
        state += (table, _data_ptr(), True, TENSOR_KEY)
    state += tuple(part for guard in guards for part in guard)
    return _builtin(code, "front", _METH_FASTCALL | _METH_KEYWORDS, state)


def status() -> str:
    """How the launches call the driver: ``"native"``, or ``"ctypes (<why>)"``."""
    if "trampoline" in _codes:
        return "native"
    return f"ctypes ({_why_not.get('trampoline', 'not tried yet')})"
