"""The walker: one kernel's optimized IR to one LLVM IR module (llvmlite's IR builder).

- Values: a ``Var`` with one definition that dominates its uses (every frontend temporary,
  checked structurally by ``ssa_vars``) is an SSA value. Any other ``Var`` (user variables
  assigned in loops or branches) gets a stack slot (``alloca`` in the entry block), read with
  a ``load`` and written with a ``store``; LLVM's SROA/mem2reg turns the slots into SSA values,
  so the non-SSA IR needs no SSA construction here.
- Parameters: one LLVM argument per ``Param``: ``ptr addrspace(1)`` for array pointers (the
  same 8-byte ``.param`` the PTX emitter declares), ``i64`` shapes and strides, scalars by type
  (bool as ``i8``, f16/bf16 as ``i16``), tensor maps as 128-byte ``byval`` parameters
  (``kaio.llvm.hopper``). The function has the ``ptx_kernel`` calling convention.
- Arrays: global arrays index their pointer argument; shared arrays are ``addrspace(3)``
  globals (in declaration order; 1024-byte aligned where TMA or a wgmma descriptor addresses
  them), dynamic shared arrays views of one external ``[0 x i8]``; local arrays are allocas
  (SROA keeps those indexed only by constants in registers, like the emitter's register
  promotion; ``Frag`` operands need them there).
- Control flow maps to basic blocks: ``If`` to a conditional branch around ``then``/``else``;
  ``Loop`` to ``head: body; step: ...; br head; done:``; ``Region`` to an end block that
  ``Break`` (and an unrolled copy's ``Continue``) branch to; ``Return`` to ``ret void``.
  Statements after a jump go to a fresh block that LLVM deletes as unreachable.
- Instructions: ``kaio.llvm.lowering.LOWERING``, one entry per IR op.
"""

from __future__ import annotations

from llvmlite import ir

from kaio.errors import CompileError
from kaio.ir import nodes
from kaio.ir.legality import Target
from kaio.ir.nodes import Array, BlockLowering, Const, Function, Instr, Var, child_blocks
from kaio.ir.passes import definitions
from kaio.llvm.hopper import TENSOR_MAP, aligned_tiles, declare_tensor_maps
from kaio.llvm.lowering import LOWERING
from kaio.llvm.typemap import (
    GLOBAL,
    I8,
    I32,
    I64,
    SHARED,
    VOID,
    const,
    int_const,
    lltype,
    memtype,
    paramtype,
)
from kaio.ptx.emitter import ptx_identifier, register_locals

TRIPLE = "nvptx64-nvidia-cuda"


class Codegen(BlockLowering):
    """Lowers one ``Function`` for one ``Target``; ``run()`` returns the ``ir.Module``.

    The lowering functions see this object as ``g``: ``g.b`` is the IR builder at the current
    position, ``g.value``/``g.set`` read and write IR values, ``g.intrinsic``/``g.asm`` call
    LLVM intrinsics and inline PTX, ``g.target``/``g.loc``/``g.fail`` are as in the PTX
    emitter (``target`` is the one ``kaio.ir.legality.check`` returned: it only translates)."""

    what = "the LLVM backend"

    def __init__(self, fn: Function, target: Target, data_layout: str = ""):
        self.fn = fn
        self.target = target
        self.loc = None
        self.module = ir.Module(name=fn.name)
        self.module.triple = TRIPLE
        self.module.data_layout = data_layout
        types = [_param_type(p) for p in fn.params]
        self.func = ir.Function(self.module, ir.FunctionType(VOID, types), ptx_identifier(fn.name))
        self.func.calling_convention = "ptx_kernel"
        declare_tensor_maps(self.module, self.func, fn.params)
        for key, annotation in (
            ("max_threads", "maxntidx"),
            ("min_blocks", "minctasm"),
            ("cluster", "cluster_dim_x"),
        ):
            if key in fn.meta:  # kaio.launch_bounds() (LLVM 21+ reads these as attributes too)
                value = ir.Constant(I32, fn.meta[key])
                self.module.add_named_metadata("nvvm.annotations", [self.func, annotation, value])
        self._entry = ir.IRBuilder(self.func.append_basic_block("entry"))
        self.b = ir.IRBuilder(self.func.append_basic_block("body"))
        self._args = {p.value: arg for p, arg in zip(fn.params, self.func.args, strict=True)}
        self._slots: dict[Var, ir.Value] = {}
        self._ssa = ssa_vars(fn) - set(self._args)
        self._values: dict[Var, ir.Value] = {}
        self._params: dict[Var, ir.Value] = {}
        self._targets: dict[int, tuple[ir.Block, ir.Block]] = {}  # id -> (continue, break)
        self._bases: dict[Array, ir.Value] = {}
        self._strides: dict[Array, list] = {}
        self._in_registers = {a: None for a in register_locals(fn)}
        self._dynamic = None
        self._aligned = aligned_tiles(fn)  # shared tiles TMA and wgmma address

    # ------------------------------------------------------------------ values

    def value(self, v) -> ir.Value:
        """The LLVM value of an IR operand (a constant, or the variable's current value)."""
        if isinstance(v, Const):
            return const(v)
        if v in self._ssa:
            return self._values[v]
        return self.b.load(self._slot(v), typ=lltype(v.type))

    def set(self, v: Var, value: ir.Value) -> None:
        """Assign ``value`` to the variable ``v``."""
        if v in self._ssa:
            self._values[v] = value
        else:
            self.b.store(value, self._slot(v))

    def _slot(self, v: Var) -> ir.Value:
        slot = self._slots.get(v)
        if slot is None:
            slot = self._slots[v] = self._entry.alloca(lltype(v.type), name=v.name)
            if v in self._args:
                self._entry.store(self.param(v), slot)
        return slot

    def param(self, v: Var) -> ir.Value:
        """A parameter's value as its IR type, computed once in the entry block."""
        value = self._params.get(v)
        if value is None:
            arg, e = self._args[v], self._entry
            if isinstance(arg.type, ir.PointerType):
                value = e.ptrtoint(arg, I64)
            elif v.type.is_bool:
                value = e.icmp_unsigned("!=", arg, ir.Constant(I8, 0))
            elif arg.type != lltype(v.type):
                value = e.bitcast(arg, lltype(v.type))
            else:
                value = arg
            self._params[v] = value
        return value

    # ------------------------------------------------------------------ calls

    def intrinsic(self, name: str, ret: ir.Type, args: list, attrs=()) -> ir.Value:
        """Call the LLVM intrinsic ``name`` (declared on first use)."""
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return self.b.call(fn, args, attrs=attrs)

    def asm(self, text: str, constraints: str, ret: ir.Type, args: list, attrs=(), effects=False):
        """Inline PTX ``text`` (``$0``... operands per ``constraints``). ``effects``: the asm
        has side effects LLVM must keep in order (a memory clobber belongs in ``constraints``).
        """
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return self.b.call(ir.InlineAsm(fnty, text, constraints, effects), args, attrs=attrs)

    def fail(self, message: str):
        """Raise CompileError at the current statement."""
        loc = self.loc
        if loc is None:
            raise CompileError(message)
        raise CompileError(message, loc.filename, loc.lineno, loc.col)

    # ------------------------------------------------------------------ arrays

    def array_base(self, arr: Array) -> ir.Value:
        """A pointer to the array's first element (shared: 32-bit, in address space 3)."""
        base = self._bases.get(arr)
        if base is None:
            e = self._entry
            if arr.space == "global":
                base = self._args[arr.ptr]
            elif arr.space == "local":
                ty = ir.ArrayType(memtype(arr.dtype), arr.static_size)
                slot = e.alloca(ty, name=f"l_{arr.name}")
                slot.align = 16
                base = e.bitcast(slot, memtype(arr.dtype).as_pointer())
            elif arr.space == "shared":
                size = arr.static_size * arr.dtype.itemsize
                gv = ir.GlobalVariable(
                    self.module, ir.ArrayType(I8, size), f"s_{arr.name}", addrspace=SHARED
                )
                gv.linkage = "internal"
                gv.initializer = ir.Constant(gv.value_type, ir.Undefined)
                gv.align = 1024 if arr in self._aligned else 16
                base = e.bitcast(gv, memtype(arr.dtype).as_pointer(SHARED))
            else:
                base = e.bitcast(self._dynamic_shared(), I8.as_pointer(SHARED))
                if arr.offset:
                    base = e.gep(base, [int_const(I32, arr.offset)], True, source_etype=I8)
                base = e.bitcast(base, memtype(arr.dtype).as_pointer(SHARED))
            self._bases[arr] = base
        return base

    def pointer_to(self, ptr: ir.Value, ty: ir.Type) -> ir.Value:
        """``ptr`` as a pointer llvmlite lets one store a ``ty`` through (llvmlite checks the
        pointee of its typed pointers; LLVM's pointers are all opaque)."""
        if ptr.type.is_opaque or ptr.type.pointee == ty:
            return ptr
        return self.b.bitcast(ptr, ty.as_pointer(ptr.type.addrspace))

    def _dynamic_shared(self) -> ir.Value:
        if self._dynamic is None:
            gv = ir.GlobalVariable(self.module, ir.ArrayType(I8, 0), "dynamic_smem", SHARED)
            gv.linkage = "external"
            gv.align = 1024 if any(a.space == "shared_dyn" for a in self._aligned) else 16
            self._dynamic = gv
        return self._dynamic

    def strides(self, arr: Array) -> list:
        """Per dimension, the stride in elements: an int, or an i64 value (global arrays)."""
        strides = self._strides.get(arr)
        if strides is None:
            if arr.space == "global" and arr.strides is not None:
                strides = [self.param(s) for s in arr.strides]
            else:
                strides = [1]
                for d in reversed(arr.shape[1:]):
                    if isinstance(d, Const) and isinstance(strides[0], int):
                        strides.insert(0, d.value * strides[0])
                    else:
                        inner = strides[0]
                        if isinstance(inner, int):
                            inner = int_const(I64, inner)
                        strides.insert(0, self._entry.mul(self.param(d), inner))
            self._strides[arr] = strides
        return strides

    def local_registers(self, arr: Array) -> list | None:
        """Pointers to the elements of a local array indexed only by constants (SROA keeps
        them in registers), or None if it is also indexed at run time. The PTX emitter's
        helpers (bounds checks, fragment checks) take these in place of its registers."""
        if arr not in self._in_registers:
            return None
        ptrs = self._in_registers[arr]
        if ptrs is None:
            base = self.array_base(arr)
            ptrs = self._in_registers[arr] = [
                self._entry.gep(base, [int_const(I32, k)], True, source_etype=memtype(arr.dtype))
                for k in range(arr.static_size)
            ]
        return ptrs

    # ------------------------------------------------------------------ statements

    def _set_loc(self, loc) -> None:
        self.loc = loc

    def _instr(self, s: Instr) -> None:
        LOWERING[s.op](self, s)

    def _region(self, s: nodes.Region) -> None:
        end = self.func.append_basic_block(f"region{s.id}_end")
        self._targets[s.id] = (end, end)  # continue in an unrolled body: next copy
        self.block(s.body)
        self._goto(end)
        self.b.position_at_end(end)

    def _jump(self, s) -> None:
        if isinstance(s, nodes.Return):
            self.b.ret_void()
        else:
            cont, done = self._targets[s.target]
            self.b.branch(done if isinstance(s, nodes.Break) else cont)
        self._dead()

    def _goto(self, target: ir.Block) -> None:
        if not self.b.block.is_terminated:
            self.b.branch(target)

    def _dead(self) -> None:
        """Continue in a block nothing branches to (code after a jump; LLVM deletes it)."""
        self.b.position_at_end(self.func.append_basic_block("dead"))

    def _if(self, s: nodes.If) -> None:
        if isinstance(s.cond, Const):
            self.block(s.then if s.cond.value else s.orelse)
            return
        then = self.func.append_basic_block("then")
        other = self.func.append_basic_block("else") if s.orelse else None
        end = self.func.append_basic_block("endif")
        self.b.cbranch(self.value(s.cond), then, other or end)
        self.b.position_at_end(then)
        self.block(s.then)
        self._goto(end)
        if other is not None:
            self.b.position_at_end(other)
            self.block(s.orelse)
            self._goto(end)
        self.b.position_at_end(end)

    def _loop(self, s: nodes.Loop) -> None:
        head = self.func.append_basic_block(f"loop{s.id}")
        step = self.func.append_basic_block(f"loop{s.id}_step")
        done = self.func.append_basic_block(f"loop{s.id}_end")
        self._targets[s.id] = (step, done)
        self.b.branch(head)
        self.b.position_at_end(head)
        self.block(s.body)
        self._goto(step)
        self.b.position_at_end(step)
        self.block(s.step)
        self._goto(head)
        self.b.position_at_end(done)

    # ------------------------------------------------------------------ module

    def run(self) -> ir.Module:
        """Lower the function; the module holds the kernel and its declarations."""
        if self.fn.meta.get("debug"):
            raise CompileError(
                f"{self.fn.name}: debug mode (bounds checks) is implemented by the PTX emitter "
                "only: use backend='ptx' with debug=True, or turn debug off"
            )
        for a in self.fn.arrays:  # static shared arrays in declaration order, as the emitter
            if a.space == "shared":
                self.array_base(a)
        self.block(self.fn.body)
        if not self.b.block.is_terminated:
            self.b.ret_void()
        self._entry.branch(self.func.blocks[1])
        return self.module


def ssa_vars(fn: Function) -> set[Var]:
    """The variables assigned once whose assignment dominates every use: each use is in the
    same statement list after the assignment, or nested in a statement after it."""
    once = {v for v, n in definitions(fn.body).items() if n == 1}
    where: dict[Var, tuple] = {}
    reads: list[tuple[Var, tuple]] = []

    def visit(stmts: list, path: tuple) -> None:
        for i, s in enumerate(stmts):
            here = (*path, (id(stmts), i))
            operands = (
                s.args if isinstance(s, Instr) else (s.cond,) if isinstance(s, nodes.If) else ()
            )
            reads.extend((v, here) for v in operands if v in once)
            if isinstance(s, Instr) and s.dst in once:
                where[s.dst] = here
            for block in child_blocks(s):
                visit(block, here)

    visit(fn.body, ())
    dominated = set(where)
    for v, use in reads:
        d = where.get(v)
        if d is None or len(use) < len(d) or use[: len(d) - 1] != d[:-1]:
            dominated.discard(v)
            continue
        (block, at), (use_block, use_at) = d[-1], use[len(d) - 1]
        if use_block != block or use_at <= at:
            dominated.discard(v)
    return dominated


def _param_type(p) -> ir.Type:
    if p.role == "ptr":
        return ir.PointerType(addrspace=GLOBAL)
    if p.role == "tensormap":  # byval (kaio.llvm.hopper.declare_tensor_maps)
        return TENSOR_MAP.as_pointer()
    return paramtype(p.value.type)
