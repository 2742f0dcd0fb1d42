"""Debug mode: a bounds check before every memory access of the emitted PTX.

With ``@kaio.gpu_kernel(debug=True)`` (or ``KAIO_DEBUG=1``) a specialization's IR carries
``meta["debug"]`` and the emitter calls ``DebugChecks.check`` from ``memory.address``, that is
before every global, shared, dynamic shared and local-memory access: loads, stores, atomics,
vector loads and stores, ``ldmatrix`` and both sides of ``cp.async``. Each index is widened to
64 bits (sign-extended when its type is signed, so a negative index is a huge unsigned one)
and compared, unsigned, with its dimension; an access of several elements (vectors,
``ldmatrix`` rows, ``cp.async``) also checks its last element; a shaped view of dynamic shared
memory checks that it ends within the bytes the launch gave. Register-held local arrays are
indexed by constants and checked at compile time already.

A failing check branches to an out-of-line stub. The first failing thread of the launch claims
the error record with a compare-and-swap on its first word, writes which access failed, the
indices, the shape, its thread and its block, and exits; any other failing thread exits
without writing. ``exit`` (not ``trap``) keeps the CUDA context usable, so the runtime can read
the record after synchronizing and raise ``kaio.OutOfBoundsError`` (see
``kaio.runtime.debug``); an exited thread counts as arrived at later barriers.

The record is a hidden last kernel parameter (``.param .u64 kaio_debug``) pointing to
``RECORD_BYTES`` of global memory laid out as ``RECORD`` says. Each access site is described by
a ``// kaio-debug-site {json}`` comment in the PTX, which the runtime parses back to name the
array, the kind of access and the source line. With debug off nothing of this is emitted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property

from kaio.ir.nodes import Array, Const, Instr
from kaio.types import u32

PARAM = "kaio_debug"
SITE_TAG = "// kaio-debug-site "
MAX_DIMS = 8  # indices and extents recorded per access (the checks cover every dimension)
# Byte offsets of the error record's fields: u32 flag (0 = no error), u32 site, u32 thread
# x y z, u32 block x y z, u64 value (the last element a multi-element access reaches), u64 limit
# (the launch's dynamic shared bytes, for shaped views of them), u64 index[8], u64 shape[8].
RECORD = {
    "flag": 0,
    "site": 4,
    "thread": 8,
    "block": 20,
    "value": 40,
    "limit": 48,
    "index": 56,
    "shape": 56 + 8 * MAX_DIMS,
}
RECORD_BYTES = RECORD["shape"] + 8 * MAX_DIMS

Operand = int | str  # a compile-time value or a 64-bit register


_DECLARED = re.compile(r"\.param \.u64 " + PARAM + r"\w*\s*\)")


def declares_record(ptx: str) -> bool:
    """True when ``ptx`` is a debug kernel's: its last parameter is the error record."""
    return _DECLARED.search(ptx) is not None


def _imm(v: int) -> str:
    v &= 2**64 - 1
    return str(v) if v < 2**31 else hex(v)


def _op(v: Operand) -> str:
    return _imm(v) if isinstance(v, int) else v


@dataclass
class _Site:
    """One checked access: what it is, the array, its index values (as emitted: 64-bit
    operands), the array's extents, and the extra checks' operands: the last element a
    multi-element access reaches (``end``), and for a shaped view of dynamic shared memory the
    byte it ends at (``view_end``) and the register holding the launch's dynamic bytes."""

    what: str
    arr: Array
    idxs: list
    ins: Instr
    index: list = field(default_factory=list)
    shape: list = field(default_factory=list)
    kinds: list = field(default_factory=list)
    end: Operand | None = None
    view_end: int | None = None
    dynamic: str | None = None

    def describe(self, number: int) -> dict:
        """The site's description, written into the PTX for the runtime's report."""
        loc = self.ins.loc
        return {
            "site": number,
            "what": self.what,
            "array": self.arr.name,
            "space": self.arr.space,
            "checks": self.kinds,
            "signed": [bool(i.type.is_signed) for i in self.idxs],
            "view_end": self.view_end,
            "file": loc.filename if loc else "",
            "line": loc.lineno if loc else 0,
            "col": loc.col if loc else 0,
        }


class DebugChecks:
    """The bounds checks of one kernel being emitted by ``e`` (a ``kaio.ptx.emitter.Emitter``
    whose ``instr`` is the instruction being lowered)."""

    def __init__(self, e):
        self.e = e
        self.param = e._unique(PARAM)
        self._extents: dict = {}
        self._scratch: tuple | None = None
        self._stubs: list[str] = []
        self._tail_label: str | None = None
        self._tail_code: list[str] = []
        self._sites = 0

    # ------------------------------------------------------------------ registers
    def declaration(self) -> str:
        """The hidden parameter's ``.param`` line (the entry's last parameter)."""
        return f"\t.param .u64 {self.param}"

    def _prologue(self, line: str) -> None:
        self.e._prologue.append(f"\t{line};")

    def _in_prologue(self, temporary: str, first: str, then: str) -> str:
        """A new 64-bit register {d} that two prologue lines compute: ``first`` into
        ``temporary`` ({t}), then ``then`` from it."""
        d = self.e.tmp_addr(True)
        self._prologue(first.format(t=temporary))
        self._prologue(then.format(t=temporary, d=d))
        return d

    @cached_property
    def _record(self) -> str:
        """The record's global address, loaded once in the prologue."""
        load = f"ld.param.u64 {{t}}, [{self.param}]"
        return self._in_prologue(self.e.tmp_addr(True), load, "cvta.to.global.u64 {d}, {t}")

    @cached_property
    def _dynamic_bytes(self) -> str:
        """``%dynamic_smem_size`` as a 64-bit register, read once in the prologue."""
        read = "mov.u32 {t}, %dynamic_smem_size"
        return self._in_prologue(self.e.tmp(u32), read, "cvt.u64.u32 {d}, {t}")

    def _scratch_regs(self) -> tuple[str, str]:
        """(temporary, predicate) registers the stubs share: a stub never returns, so one
        pair serves them all."""
        if self._scratch is None:
            self._scratch = (self.e.tmp(u32), self.e.tmp_pred())
        return self._scratch

    def _extent(self, arr: Array, d: int) -> Operand:
        """Dimension ``d`` of ``arr``: a constant, a shape parameter's register, or (plain
        dynamic shared arrays) the elements the launch's dynamic shared bytes hold."""
        n = arr.shape[d]
        if isinstance(n, Const):
            return int(n.value)
        if n is not None:
            return self.e.var(n)
        reg = self._extents.get(arr)
        if reg is None:
            reg = self._extents[arr] = self.e.tmp_addr(True)
            size = arr.dtype.itemsize
            available = self._dynamic_bytes
            if arr.offset:
                self._prologue(f"max.u64 {reg}, {available}, {arr.offset}")
                self._prologue(f"sub.u64 {reg}, {reg}, {arr.offset}")
                available = reg
            self._prologue(f"shr.u64 {reg}, {available}, {size.bit_length() - 1}")
        return reg

    def _wide(self, i) -> Operand:
        """An index as a 64-bit operand (sign-extended when signed)."""
        from kaio.ptx.memory import _index64

        if isinstance(i, Const):
            return int(i.value) & (2**64 - 1)
        return _index64(self.e, i)

    # ------------------------------------------------------------------ the checks
    def _access(self, ins: Instr, arr: Array) -> tuple[str, Operand | None, object]:
        """(what the access is; how many elements past the first it reaches, as an operand,
        or None when it accesses no memory at all; a guard: None, or a function returning a
        predicate register that is true for the threads that do access memory)."""
        op = ins.op
        size = arr.dtype.itemsize
        if op == "atomic":
            return f"atomic_{ins.attrs['kind']}", 0, None
        if op in ("ld_vec", "st_vec"):
            frag = ins.args[0] if op == "ld_vec" else ins.args[-1]
            nbytes = frag.size * frag.array.dtype.itemsize
            return ("vector load" if op == "ld_vec" else "vector store"), nbytes // size - 1, None
        if op == "ldmatrix":  # lanes 8 * count and up give no row address
            readers = 8 * ins.args[0].size
            guard = None if readers >= 32 else lambda: self._lane_guard(readers)
            return "ldmatrix row read", 16 // size - 1, guard
        if op == "cp_async":
            nbytes = ins.attrs["bytes"]
            if arr is ins.args[0]:
                return "cp_async write", nbytes // size - 1, None
            return "cp_async read", *self._source_span(ins.args[-1], size)
        return op, 0, None

    def _lane_guard(self, readers: int) -> str:
        lane, p = self.e.tmp(u32), self.e.tmp_pred()
        self.e.line(f"mov.u32 {lane}, %laneid")
        self.e.line(f"setp.lt.u32 {p}, {lane}, {readers}")
        return p

    def _source_span(self, src_bytes, size: int) -> tuple[Operand | None, object]:
        """A ``cp.async`` source reads ``ceil(src_bytes / size)`` elements, none for 0."""
        e = self.e
        if isinstance(src_bytes, Const):
            n = int(src_bytes.value)
            return ((n - 1) // size if n else None), None
        last, wide = e.tmp(u32), e.tmp_addr(True)
        e.line(f"sub.u32 {last}, {e.r(src_bytes)}, 1")
        e.line(f"shr.u32 {last}, {last}, {size.bit_length() - 1}")
        e.line(f"cvt.u64.u32 {wide}, {last}")

        def guard() -> str:
            p = e.tmp_pred()
            e.line(f"setp.ne.u32 {p}, {e.r(src_bytes)}, 0")
            return p

        return wide, guard

    def check(self, arr: Array, idxs) -> None:
        """Emit the checks of the current instruction's access to ``arr[idxs]``: one
        predicate accumulating every comparison, and one branch to the site's stub."""
        e = self.e
        ins = e.instr
        what, span, guard = self._access(ins, arr)
        if span is None:
            return
        site = _Site(what, arr, list(idxs), ins)
        site.index = [self._wide(i) for i in idxs]
        site.shape = [self._extent(arr, d) for d in range(arr.ndim)]
        tests = list(zip(site.index, site.shape, strict=True))
        site.kinds = ["dim"] * arr.ndim
        if span != 0:
            last = site.index[-1]
            if isinstance(last, int) and isinstance(span, int):
                site.end = last + span
            else:
                site.end = e.tmp_addr(True)
                e.line(f"add.u64 {site.end}, {_op(last)}, {_op(span)}")
            tests.append((site.end, site.shape[-1]))
            site.kinds.append("end")
        if arr.space == "shared_dyn" and arr.shape != (None,):
            site.view_end = arr.offset + arr.static_size * arr.dtype.itemsize
            site.dynamic = self._dynamic_bytes
            tests.append((site.view_end - 1, site.dynamic))
            site.kinds.append("dynamic")
        fails = self._any_fails(tests)
        if fails is None:
            return
        label = e.new_label("oob")
        if guard is not None:
            accesses = guard()
            if fails is True:
                fails = accesses
            else:
                e.line(f"and.pred {fails}, {fails}, {accesses}")
        e.line(f"bra.uni {label}" if fails is True else f"@{fails} bra {label}")
        self._stub(site, label)

    def _any_fails(self, tests: list) -> str | bool | None:
        """A predicate register that is true when some ``value >= limit`` (unsigned): True
        when one fails at compile time already, None when none can fail."""
        e = self.e
        p = None
        for value, limit in tests:
            if isinstance(value, int) and isinstance(limit, int):
                if value >= limit:
                    return True
                continue
            first = p is None
            p = p or e.tmp_pred()
            combine, tail = ("", "") if first else (".or", f", {p}")
            if isinstance(value, int):
                e.line(f"setp.le{combine}.u64 {p}, {limit}, {_imm(value)}{tail}")
            else:
                e.line(f"setp.ge{combine}.u64 {p}, {value}, {_op(limit)}{tail}")
        return p

    def _stub(self, site: _Site, label: str) -> None:
        """The out-of-line code of one access site: claim the record (the first failing
        thread only), write what failed, and go to the common tail."""
        tmp, p = self._scratch_regs()
        base = self._record
        number = self._sites
        self._sites += 1
        out = self._stubs
        out += [f"{label}:", f"\t{SITE_TAG}{json.dumps(site.describe(number))}"]
        out.append(f"\tatom.global.cas.b32 {tmp}, [{base}], 0, 1;")
        out += [f"\tsetp.ne.u32 {p}, {tmp}, 0;", f"\t@{p} exit;"]
        fields = [(RECORD["site"], 32, str(number))]
        if site.end is not None:
            fields.append((RECORD["value"], 64, _op(site.end)))
        if site.dynamic is not None:
            fields.append((RECORD["limit"], 64, site.dynamic))
        for name, values in (("index", site.index), ("shape", site.shape)):
            fields += [(RECORD[name] + 8 * d, 64, _op(v)) for d, v in enumerate(values[:MAX_DIMS])]
        out += [f"\tst.global.u{bits} [{base}+{at}], {operand};" for at, bits, operand in fields]
        out.append(f"\tbra.uni {self._tail()};")

    def _tail(self) -> str:
        """The label of the code every stub ends with: record the thread and block, exit."""
        if self._tail_label is None:
            self._tail_label = self.e.new_label("oob_thread")
            tmp, _ = self._scratch_regs()
            base = self._record
            code = [f"{self._tail_label}:"]
            for name, sreg in (("thread", "tid"), ("block", "ctaid")):
                for d, axis in enumerate("xyz"):
                    code.append(f"\tmov.u32 {tmp}, %{sreg}.{axis};")
                    code.append(f"\tst.global.u32 [{base}+{RECORD[name] + 4 * d}], {tmp};")
            self._tail_code = code + ["\texit;"]
        return self._tail_label

    def finish(self) -> None:
        """Append the stubs after the kernel's last instruction (which never falls through)."""
        self.e._body.extend(self._stubs + self._tail_code)
