"""The tensor-core matmul's main loop in SASS, per configuration and backend (no GPU).

Each configuration of ``kaio_ops.matmul.CONFIGS`` is compiled to PTX by both backends
(``kaio.ptx`` and ``kaio.llvm``), assembled for one arch with ``ptxas -v`` (registers,
spill bytes) and disassembled with ``cuobjdump -sass``. The main loop is the innermost
backward branch whose body holds the ``HMMA`` instructions; its instruction count is what
the GPU issues per iteration of the k loop (one BK tile).

The CUDA tools come from ``--bin`` (or ``$KAIO_CUDA_BIN``): a folder with ``ptxas`` and
``cuobjdump``, by default the one holding the ptxas kaio finds (the ``nvidia-cuda-nvcc``
wheel has both; so does the triton wheel's ``triton/backends/nvidia/bin``).

    python bench/sass_loop.py                          # f16, pipelined, sm_90
    python bench/sass_loop.py --sync --dtype bf16      # the unpipelined bf16 kernel
    python bench/sass_loop.py --dump /tmp/sass         # also each kernel's PTX and SASS
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kaio.kernel import BACKENDS  # noqa: E402
from kaio.ptx.ptxas import find_ptxas  # noqa: E402
from kaio.types import bf16, f16  # noqa: E402
from kaio_ops._matmul_kernels import matmul_kernel  # noqa: E402
from kaio_ops.matmul import CONFIGS  # noqa: E402

_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
_RESOURCES = {
    "registers": r"Used (\d+) registers",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
}


@dataclass(frozen=True)
class LoopStats:
    """One kernel's main loop: its SASS instructions, HMMAs among them, and the kernel's
    registers and spill bytes (stores + loads)."""

    instructions: int
    hmma: int
    registers: int
    spills: int


def parse_sass(text: str) -> list[tuple[int, str]]:
    """(address, instruction) of each SASS instruction in ``cuobjdump -sass`` output."""
    return [(int(m.group(1), 16), m.group(2)) for m in _SASS_LINE.finditer(text)]


def main_loop(sass: list[tuple[int, str]]) -> list[str]:
    """The instructions of the innermost loop holding HMMAs: from a backward branch's target
    to the branch itself, the shortest such range with an HMMA. Empty if there is none."""
    best: list[str] = []
    for i, (addr, ins) in enumerate(sass):
        m = _BRANCH.search(ins)
        if m is None or int(m.group(1), 16) > addr:
            continue
        target = int(m.group(1), 16)
        body = [s for a, s in sass[: i + 1] if a >= target]
        if any("HMMA" in s for s in body) and (not best or len(body) < len(best)):
            best = body
    return best


def default_bin() -> str:
    """``$KAIO_CUDA_BIN``, else the folder of the ptxas kaio finds ("" if none: PATH)."""
    return os.environ.get("KAIO_CUDA_BIN") or os.path.dirname(find_ptxas() or "")


def tool(bin_dir: str, name: str) -> str:
    """The path of CUDA tool ``name`` in ``bin_dir`` (or on PATH when ``bin_dir`` is empty)."""
    return os.path.join(bin_dir, name) if bin_dir else name


def measure(ptx: str, arch: str, bin_dir: str, dump: str | None = None) -> LoopStats:
    """Assemble ``ptx``, disassemble it and measure its main loop (``dump``: a path prefix
    to keep the PTX and SASS under)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        report = subprocess.run(
            [tool(bin_dir, "ptxas"), f"-arch={arch}", "-v", "-o", cubin, src],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        sass = subprocess.run(
            [tool(bin_dir, "cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    if dump:
        for ext, text in ((".ptx", ptx), (".sass", sass)):
            with open(dump + ext, "w") as f:
                f.write(text)
    found = {k: int(re.search(p, report).group(1)) for k, p in _RESOURCES.items()}
    loop = main_loop(parse_sass(sass))
    return LoopStats(
        instructions=len(loop),
        hmma=sum("HMMA" in s for s in loop),
        registers=found["registers"],
        spills=found["spill_stores"] + found["spill_loads"],
    )


def table(dtype, pipelined: bool, arch: str, bin_dir: str, dump: str | None) -> str:
    """A Markdown table: per configuration and backend, the main loop's SASS instructions
    (and HMMAs), registers and spill bytes."""
    rows = [
        "| config | backend | loop instructions | HMMA | registers | spill bytes |",
        "|---|---|---|---|---|---|",
    ]
    for name, cfg in CONFIGS.items():
        constexprs = cfg.for_itemsize(dtype.itemsize).constexprs(pipelined, True)
        for backend in BACKENDS:
            ptx = matmul_kernel.ptx(arch=arch, backend=backend, DT=dtype, **constexprs)
            prefix = os.path.join(dump, f"{name}_{backend}") if dump else None
            s = measure(ptx, arch, bin_dir, prefix)
            rows.append(
                f"| {name} | {backend} | {s.instructions} | {s.hmma} | {s.registers} | {s.spills} |"
            )
    return "\n".join(rows)


def main() -> None:
    """Print the table for the command line's element type, pipeline and arch."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=default_bin(), help="the folder of ptxas and cuobjdump")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    p.add_argument("--sync", action="store_true", help="the unpipelined kernel")
    p.add_argument("--dump", help="a folder to write each kernel's PTX and SASS to")
    args = p.parse_args()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    dtype = {"f16": f16, "bf16": bf16}[args.dtype]
    print(table(dtype, not args.sync, args.arch, args.bin, args.dump))


if __name__ == "__main__":
    main()
