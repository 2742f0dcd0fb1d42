"""A readable text form of the IR (``kernel.ir()``)."""

from __future__ import annotations

from kaio.ir import nodes
from kaio.ir.nodes import Array, Const, Function, Instr, Var


def format_operand(v) -> str:
    """One operand as text: ``%name``, ``@array`` or ``value:type``."""
    if isinstance(v, Var):
        return f"%{v.name}"
    if isinstance(v, Array):
        return f"@{v.name}"
    if isinstance(v, Const):
        return f"{v.value!r}:{v.type.name}"
    return repr(v)


def format_instr(s: Instr) -> str:
    """One instruction as text, e.g. ``%t3: f32 = add %a, %b``."""
    args = ", ".join(format_operand(a) for a in s.args)
    attrs = ""
    if s.attrs:
        attrs = " {" + ", ".join(f"{k}={v}" for k, v in sorted(s.attrs.items())) + "}"
    lhs = f"%{s.dst.name}: {s.dst.type.name} = " if s.dst is not None else ""
    line = f"  [{s.loc.lineno}]" if s.loc else ""
    return f"{lhs}{s.op}{' ' + args if args else ''}{attrs}{line}"


def _headed_blocks(s) -> list[tuple[str, list]]:
    """A compound statement as its (header, nested block) pairs. The first block is always
    printed, a later one (``else``, ``step``) only when it has statements."""
    if isinstance(s, nodes.If):
        return [(f"if {format_operand(s.cond)}", s.then), ("else", s.orelse)]
    if isinstance(s, nodes.Loop):
        return [(f"loop L{s.id}", s.body), (f"step L{s.id}", s.step)]
    if isinstance(s, nodes.StaticFor):
        values = ", ".join(repr(v) for v in s.values)
        return [(f"static_for L{s.id} %{s.var.name} in ({values})", s.body)]
    if isinstance(s, nodes.Region):
        return [(f"region R{s.id}", s.body)]
    raise TypeError(f"unknown IR statement {s!r}")


def _format_block(stmts: list, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for s in stmts:
        if isinstance(s, Instr):
            out.append(pad + format_instr(s))
        elif isinstance(s, nodes.Break):
            out.append(f"{pad}break {s.target}")
        elif isinstance(s, nodes.Continue):
            out.append(f"{pad}continue {s.target}")
        elif isinstance(s, nodes.Return):
            out.append(f"{pad}return")
        else:
            for k, (header, block) in enumerate(_headed_blocks(s)):
                if k == 0 or block:
                    out.append(f"{pad}{header}:")
                    _format_block(block, indent + 1, out)


def format_array(a: Array) -> str:
    """An array declaration line."""
    shape = ", ".join("?" if d is None else format_operand(d) for d in a.shape)
    strides = ""
    if a.strides is not None:
        strides = " strides (" + ", ".join(format_operand(d) for d in a.strides) + ")"
    return f"{a.space} @{a.name}: {a.dtype.name}[{shape}]{strides}"


def format_function(fn: Function) -> str:
    """The whole kernel as text: signature, arrays, then the body."""
    params = ", ".join(f"%{p.value.name}: {p.value.type.name}" for p in fn.params)
    out = [f"kernel {fn.name}({params})"]
    if fn.block_size:
        out[0] += f" block={fn.block_size}"
    for a in fn.arrays:
        out.append("  " + format_array(a))
    out.append("{")
    _format_block(fn.body, 1, out)
    out.append("}")
    return "\n".join(out) + "\n"
