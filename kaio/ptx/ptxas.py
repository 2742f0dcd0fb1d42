"""Run NVIDIA's ``ptxas`` on emitted PTX, when one is installed (tests, resource reports,
and the runtime's opt-in ``KAIO_PTXAS`` build of cubins).

kaio itself never needs ptxas: by default the driver JIT-compiles PTX. It is found in the
``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin`` or ``nvidia/cuda_nvcc/bin`` on ``sys.path``)
or on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

_WHEEL_DIRS = (("nvidia", "cu13", "bin"), ("nvidia", "cuda_nvcc", "bin"))


def find_ptxas() -> str | None:
    """The path of a ptxas executable, or None."""
    for entry in sys.path:
        for parts in _WHEEL_DIRS:
            path = os.path.join(entry or ".", *parts, "ptxas")
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return shutil.which("ptxas")


def assemble(ptx: str, arch: str) -> str:
    """Assemble ``ptx`` for ``arch`` with ``ptxas -v`` and return its report (stderr: registers,
    spills, shared memory). RuntimeError with ptxas' whole message when it fails or is absent."""
    ptxas = find_ptxas()
    if ptxas is None:
        raise RuntimeError("ptxas not found: pip install nvidia-cuda-nvcc, or put ptxas on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", "-o", os.devnull, src],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"ptxas -arch={arch} failed:\n{done.stderr}{done.stdout}")
    return done.stderr


_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.MULTILINE)


def build_cubin(ptx: str, ptxas: str, arch: str) -> bytes:
    """Compile ``ptx`` to a cubin for the GPU architecture ``arch`` (``sm_90``: the device's,
    since SASS runs only on its own architecture, whatever older ``.target`` the PTX names;
    ``sm_90a`` where the PTX targets it) with the ``ptxas`` executable at that path, ``-O3``.
    RuntimeError with ptxas' whole message when it fails."""
    target = _TARGET.search(ptx)
    if target is not None and target.group(1) == arch + "a":
        arch = target.group(1)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [ptxas, f"-arch={arch}", "-O3", "-o", dst, src], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{ptxas} -arch={arch} failed:\n{done.stderr}")
        with open(dst, "rb") as f:
            return f.read()


def version(ptxas: str) -> str:
    """The last line of ``ptxas --version`` (its build), which names the compiler in cache
    keys."""
    done = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]
