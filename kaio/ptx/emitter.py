"""The walker: one kernel's IR to one PTX module.

- Registers: one virtual register per IR ``Var`` and per temporary, in the classes of
  ``kaio.ptx.regs`` (``%p %h %r %rd %f %fd``), numbered from 1; ptxas allocates.
- Parameters: each ``Param`` is one ``.param`` (``.u64`` pointers, ``.s64`` shapes and strides,
  scalars by type, bool as ``.u8``), loaded in the prologue only if used; array pointers are
  converted with ``cvta.to.global`` once. Shape-derived byte strides are also computed there.
- Control flow: ``If`` branches around its blocks (an ``If`` holding only a jump becomes one
  predicated ``bra``/``ret``); ``Loop`` is ``head: body; cont: step; bra head; break:``;
  ``Region`` ends at a label that ``Break`` (and ``Continue``) jump to; ``Return`` is ``ret``.
- Line info: a ``.file`` per source file and ``.loc file line col`` (1-based column) whenever a
  statement's location changes, with a ``// file.py:LINE  source`` comment per new line.
- Local arrays indexed only by constants (and not atomically) live in registers.
"""

from __future__ import annotations

import linecache
import os
import re
from itertools import count

from kaio.errors import CompileError
from kaio.ir import nodes
from kaio.ir.legality import Target
from kaio.ir.nodes import Array, BlockLowering, Const, Function, Instr, Var, walk
from kaio.ir.passes import constant_term, definitions
from kaio.ptx.debug import DebugChecks
from kaio.ptx.hopper import ALIGNED_OPS
from kaio.ptx.lowering import LOWERING
from kaio.ptx.regs import REG_PREFIX, bty, immediate, mem_type, storage
from kaio.types import u32

_JUMPS = (nodes.Break, nodes.Continue, nodes.Return)


def ptx_identifier(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_$]", "_", name)


def register_locals(fn: Function) -> set[Array]:
    """Local arrays whose every access is a load or store at constant indices."""
    arrays = {a for a in fn.arrays if a.space == "local"}
    for s in walk(fn.body):
        if isinstance(s, Instr) and s.op in ("load", "store", "atomic") and s.args[0] in arrays:
            idxs = s.args[1 : 1 + s.args[0].ndim]
            if s.op == "atomic" or not all(isinstance(i, Const) for i in idxs):
                arrays.discard(s.args[0])
    return arrays


def _constant_sums(fn: Function) -> dict[Var, tuple]:
    """``{d: (x, c)}`` for each ``d = x + c`` (integers, ``c`` a constant) where ``d`` and
    ``x`` are each assigned once (or ``x`` is a parameter): ``x`` holds the same value
    wherever ``d`` is read."""
    defs = definitions(fn.body)
    once = {p.value for p in fn.params} | {v for v, n in defs.items() if n == 1}
    out = {}
    for s in walk(fn.body):
        term = constant_term(s)
        if term is not None and s.dst in once and term[0] in once:
            out[s.dst] = term
    return out


class Emitter(BlockLowering):
    """Emits one ``Function`` for one ``Target``; ``run()`` returns the module text."""

    what = "the PTX emitter"

    def __init__(self, fn: Function, target: Target):
        self.fn = fn
        self.target = target
        self.loc = None
        self._counts = dict.fromkeys(REG_PREFIX, 0)
        self._regs: dict[Var, str] = {}
        self._params = {p.value: p for p in fn.params}
        self._prologue: list[str] = []
        self._body: list[str] = []
        self._labels = count(1)
        self._targets: dict[int, tuple[str, str]] = {}  # id -> (continue, break) labels
        self._loop_vars: list[set[Var]] = []  # per enclosing loop, outermost first: its Vars
        self._sums = _constant_sums(fn)
        self._bases: dict[Array, str] = {}
        self._strides: dict[Array, list] = {}
        self._in_registers = {a: None for a in register_locals(fn)}
        self._files: dict[str, int] = {}
        self._last_loc = None
        self._used_names: set[str] = set()
        self._names = {p.value: self._unique(p.name) for p in fn.params}
        self._symbols = {a: self._unique(f"s_{a.name}") for a in fn.arrays if "shared" in a.space}
        for a in fn.arrays:
            if a.space == "local" and a not in self._in_registers:
                self._symbols[a] = self._unique(f"l_{a.name}")
        self._aligned = {  # shared tiles that TMA and wgmma address: 1024-byte aligned
            s.args[0] for s in walk(fn.body) if isinstance(s, Instr) and s.op in ALIGNED_OPS
        }
        self._param_addresses: dict[Var, str] = {}
        self.instr: Instr | None = None  # the instruction being lowered
        self.debug = DebugChecks(self) if fn.meta.get("debug") else None  # bounds checks

    def _unique(self, name: str) -> str:
        name = ptx_identifier(name)
        if not name[0].isalpha():
            name = "v" + name
        base, n = name, 1
        while name in self._used_names:
            n += 1
            name = f"{base}_{n}"
        self._used_names.add(name)
        return name

    # ------------------------------------------------------------------ registers and operands

    def _new(self, cls: str) -> str:
        self._counts[cls] += 1
        return f"{REG_PREFIX[cls]}{self._counts[cls]}"

    def tmp(self, t) -> str:
        """A fresh register for a value of type ``t``."""
        return self._new(storage(t))

    def tmp_pred(self) -> str:
        """A fresh predicate register."""
        return self._new("pred")

    def tmp_addr(self, wide: bool) -> str:
        """A fresh address register: 64-bit (global, local) or 32-bit (shared)."""
        return self._new("b64" if wide else "b32")

    def var(self, v: Var) -> str:
        """The register of ``v`` (a parameter is loaded in the prologue on first use)."""
        reg = self._regs.get(v)
        if reg is None:
            reg = self._regs[v] = self.tmp(v.type)
            if v in self._params:
                self._load_param(v, reg)
        return reg

    def dst(self, ins: Instr) -> str:
        """The register of an instruction's result."""
        return self.var(ins.dst)

    def r(self, v) -> str:
        """``v`` in a register (a constant is moved into a fresh one)."""
        if isinstance(v, Var):
            return self.var(v)
        reg = self.tmp(v.type)
        op = "mov.pred" if v.type.is_bool else f"mov.{bty(v.type)}"
        self.line(f"{op} {reg}, {immediate(v)}")
        return reg

    def o(self, v) -> str:
        """``v`` as an operand: an immediate for 32/64-bit constants, else a register."""
        if isinstance(v, Const) and storage(v.type) in ("b32", "b64", "f32", "f64"):
            return immediate(v)
        return self.r(v)

    # ------------------------------------------------------------------ output

    def line(self, text: str) -> None:
        """Append one instruction to the body."""
        self._body.append(f"\t{text};")

    def new_label(self, stem: str) -> str:
        """A fresh label name."""
        return f"$L__{stem}{next(self._labels)}"

    def place(self, label: str) -> None:
        """Put ``label`` here."""
        self._body.append(f"{label}:")

    def fail(self, message: str):
        """Raise CompileError at the current statement."""
        loc = self.loc
        if loc is None:
            raise CompileError(message)
        raise CompileError(message, loc.filename, loc.lineno, loc.col)

    # ------------------------------------------------------------------ prologue: params, arrays

    def _load_param(self, v: Var, reg: str) -> None:
        name = self._names[v]
        if v.type.is_bool:
            byte = self.tmp(u32)
            self._prologue.append(f"\tld.param.u8 {byte}, [{name}];")
            self._prologue.append(f"\tsetp.ne.u32 {reg}, {byte}, 0;")
        else:
            self._prologue.append(f"\tld.param.{mem_type(v.type)} {reg}, [{name}];")

    def param_address(self, v: Var) -> str:
        """A register holding the generic address of parameter ``v`` in place (a tensor map
        is read by TMA where the launch put it: ``mov`` + ``cvta.param``, in the prologue)."""
        reg = self._param_addresses.get(v)
        if reg is None:
            local, reg = self.tmp_addr(True), self.tmp_addr(True)
            self._prologue.append(f"\tmov.b64 {local}, {self._names[v]};")
            self._prologue.append(f"\tcvta.param.u64 {reg}, {local};")
            self._param_addresses[v] = reg
        return reg

    def symbol(self, arr: Array) -> str:
        """The PTX variable of a shared or local array."""
        return self._symbols[arr]

    def array_base(self, arr: Array) -> str:
        """A register holding the array's base address in its state space."""
        base = self._bases.get(arr)
        if base is None:
            if arr.space == "global":
                ptr = self.var(arr.ptr)
                base = self.tmp_addr(True)
                self._prologue.append(f"\tcvta.to.global.u64 {base}, {ptr};")
            elif arr.space == "local":
                base = self.tmp_addr(True)
                self._prologue.append(f"\tmov.u64 {base}, {self.symbol(arr)};")
            else:
                base = self.tmp_addr(False)
                self._prologue.append(f"\tmov.u32 {base}, {self.symbol(arr)};")
            self._bases[arr] = base
        return base

    def byte_strides(self, arr: Array) -> list:
        """Per dimension, the stride in bytes: an int, or a register (global arrays)."""
        strides = self._strides.get(arr)
        if strides is None:
            size = arr.dtype.itemsize
            if arr.space == "global" and arr.strides is not None:
                strides = []
                for s in arr.strides:
                    reg = self.tmp_addr(True)
                    self._prologue.append(f"\tmul.lo.s64 {reg}, {self.var(s)}, {size};")
                    strides.append(reg)
            else:
                strides = [size]
                for d in reversed(arr.shape[1:]):
                    if isinstance(d, Const) and isinstance(strides[0], int):
                        strides.insert(0, d.value * strides[0])
                    else:
                        reg = self.tmp_addr(True)
                        self._prologue.append(f"\tmul.lo.s64 {reg}, {self.var(d)}, {strides[0]};")
                        strides.insert(0, reg)
            self._strides[arr] = strides
        return strides

    def local_registers(self, arr: Array) -> list[str] | None:
        """The registers of a register-promoted local array, or None if it is in memory."""
        if arr not in self._in_registers:
            return None
        regs = self._in_registers[arr]
        if regs is None:
            regs = self._in_registers[arr] = [self.tmp(arr.dtype) for _ in range(arr.static_size)]
        return regs

    # ------------------------------------------------------------------ statements

    def _set_loc(self, loc) -> None:
        self.loc = loc
        if loc is None or not loc.filename or (loc.filename, loc.lineno, loc.col) == self._last_loc:
            return
        fid = self._files.setdefault(loc.filename, len(self._files) + 1)
        if self._last_loc is None or self._last_loc[:2] != (loc.filename, loc.lineno):
            source = linecache.getline(loc.filename, loc.lineno).strip()
            self._body.append(f"\t// {os.path.basename(loc.filename)}:{loc.lineno}  {source}")
        self._body.append(f"\t.loc {fid} {loc.lineno} {loc.col + 1}")
        self._last_loc = (loc.filename, loc.lineno, loc.col)

    def _instr(self, s: Instr) -> None:
        self.instr = s
        LOWERING[s.op](self, s)

    def _region(self, s: nodes.Region) -> None:
        end = self.new_label("region")
        self._targets[s.id] = (end, end)  # continue in an unrolled body: next copy
        self.block(s.body)
        self.place(end)

    def _jump(self, s) -> None:
        self.line(self._jump_text(s))

    def _jump_text(self, s) -> str:
        if isinstance(s, nodes.Return):
            return "ret"
        continue_label, break_label = self._targets[s.target]
        return f"bra {break_label if isinstance(s, nodes.Break) else continue_label}"

    def _if(self, s: nodes.If) -> None:
        if isinstance(s.cond, Const):
            self.block(s.then if s.cond.value else s.orelse)
            return
        p = self.r(s.cond)
        if not s.orelse and len(s.then) == 1 and isinstance(s.then[0], _JUMPS):
            self._set_loc(s.then[0].loc)
            self.line(f"@{p} {self._jump_text(s.then[0])}")
            return
        end = self.new_label("endif")
        if not s.orelse:
            self.line(f"@!{p} bra {end}")
            self.block(s.then)
        else:
            other = self.new_label("else")
            self.line(f"@!{p} bra {other}")
            self.block(s.then)
            if not (s.then and isinstance(s.then[-1], _JUMPS)):
                self.line(f"bra {end}")
            self.place(other)
            self.block(s.orelse)
        self.place(end)

    def _loop(self, s: nodes.Loop) -> None:
        n = next(self._labels)
        head, cont, done = f"$L__loop{n}", f"$L__loop{n}_step", f"$L__loop{n}_end"
        self._targets[s.id] = (cont, done)
        assigned = {i.dst for i in walk([s]) if isinstance(i, Instr) and i.dst is not None}
        self._loop_vars.append(assigned)
        self.place(head)
        self.block(s.body)
        self.place(cont)
        self.block(s.step)
        self.line(f"bra {head}")
        self.place(done)
        self._loop_vars.pop()

    def constant_offset(self, v) -> tuple:
        """``(x, c)`` when ``v`` is ``x + c`` for a variable ``x`` and a constant ``c``
        (``constants_outward`` puts constants last in sums), else ``(v, None)``."""
        return self._sums.get(v, (v, None)) if isinstance(v, Var) else (v, None)

    def loop_depth(self, v) -> int:
        """How many of the enclosing loops ``v`` is invariant in, counted from the outermost:
        the depth of the innermost enclosing loop that assigns it (0: none, or a constant).
        Address arithmetic sums operands in this order, so that ptxas can hoist the
        invariant part of an address out of the loop."""
        for depth in range(len(self._loop_vars), 0, -1):
            if v in self._loop_vars[depth - 1]:
                return depth
        return 0

    # ------------------------------------------------------------------ module

    def run(self) -> str:
        """Emit the function and return the whole PTX module."""
        self.block(self.fn.body)
        if not (self.fn.body and isinstance(self.fn.body[-1], nodes.Return)):
            self.line("ret")
        if self.debug:
            self.debug.finish()
        fn, out = self.fn, []
        source = f" from {os.path.basename(fn.filename)}" if fn.filename else ""
        out += ["//", f"// Generated by kaio{source}", "//", ""]
        out += [f".version {self.target.version_text}", f".target {self.target.arch}"]
        out += [".address_size 64", ""]
        for name, fid in self._files.items():
            escaped = name.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'.file {fid} "{escaped}"')
        for a in fn.arrays:
            if a.space == "shared_dyn":
                dyn_aligned = any(b.space == "shared_dyn" for b in self._aligned)
                align = 1024 if dyn_aligned else 16
                out.append(f".extern .shared .align {align} .b8 {self.symbol(a)}[];")
        params = []
        for p in fn.params:
            if p.role == "tensormap":
                params.append(f"\t.param .align 64 .b8 {self._names[p.value]}[128]")
                continue
            ptype = "u64" if p.role == "ptr" else mem_type(p.value.type)
            params.append(f"\t.param .{ptype} {self._names[p.value]}")
        if self.debug:
            params.append(self.debug.declaration())
        out += ["", f".visible .entry {ptx_identifier(fn.name)}(", ",\n".join(params), ")"]
        if "max_threads" in fn.meta:
            out.append(f".maxntid {fn.meta['max_threads']}, 1, 1")
        if "min_blocks" in fn.meta:
            out.append(f".minnctapersm {fn.meta['min_blocks']}")
        if "cluster" in fn.meta:
            out.append(f".reqnctapercluster {fn.meta['cluster']}, 1, 1")
        out.append("{")
        for cls, prefix in REG_PREFIX.items():
            if self._counts[cls]:
                out.append(f"\t.reg .{cls} {prefix}<{self._counts[cls] + 1}>;")
        for a in fn.arrays:
            if a in self._symbols and a.space != "shared_dyn":
                space = "shared" if a.space == "shared" else "local"
                size = a.static_size * a.dtype.itemsize
                align = 1024 if a in self._aligned else 16
                out.append(f"\t.{space} .align {align} .b8 {self.symbol(a)}[{size}];")
        out += ["", *self._prologue, "", *self._body, "}", ""]
        return "\n".join(out)
