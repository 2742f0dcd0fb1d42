"""The layers stay apart: the types and the numeric helpers they share with the simulator
import no backend, no simulator and no runtime; compiling a kernel loads no CUDA binding."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("module", ["kaio/types.py", "kaio/numerics.py", "kaio/ir/legality.py"])
def test_neutral_modules_import_no_backend_simulator_or_runtime(module):
    layers = ("kaio.sim", "kaio.ptx", "kaio.llvm", "kaio.runtime", "cuda")
    bad = [m for m in _imports(ROOT / module) if m.startswith(layers)]
    assert not bad, f"{module} imports {bad}"


def test_compiling_loads_no_cuda_bindings(tmp_path):
    code = (
        "import sys, kaio\n"
        "from kaio import f32\n"
        "@kaio.gpu_kernel\n"
        "def k(x: f32[:]):\n"
        "    x[kaio.thread_idx_x()] = kaio.exp(x[0])\n"
        "assert '.entry k' in k.ptx(arch='sm_80')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cuda', 'cupy', 'torch')))\n"
    )
    path = tmp_path / "compile_only.py"
    path.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# the kaio modules whose public names (``__all__``) a library may import
PUBLIC = ("kaio", "kaio.types", "kaio.runtime", "kaio.sim")


def _from_imports(path: Path):
    """(module, name, line) of each ``from kaio... import name`` in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kaio"):
            for a in node.names:
                yield node.module, a.name, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kaio.") and not a.name.startswith("kaio_ops"):
                    yield a.name, None, node.lineno


@pytest.mark.parametrize("path", sorted((ROOT / "kaio_ops").glob("*.py")), ids=lambda p: p.name)
def test_kaio_ops_imports_only_public_kaio_names(path):
    import importlib

    bad = []
    for module, name, line in _from_imports(path):
        if module == "kaio_ops" or module.startswith("kaio_ops."):
            continue
        if module == "kaio.sim.mode" and name in ("active", "simulate", "anywhere"):
            continue  # kaio.sim's names, documented there (docs/simulator.md) by this path too
        public = module in PUBLIC and (
            name in importlib.import_module(module).__all__
            or module == "kaio"
            and name in PUBLIC[1:] + ("sim",)
            or module == "kaio.types"  # the type module: every name without an underscore
            and not name.startswith("_")
        )
        if not public:
            bad.append(f"{path.name}:{line}: from {module} import {name}")
    assert not bad, "private kaio names (export them from kaio.runtime instead):\n" + "\n".join(bad)


def _layer(module: str) -> str:
    """The layer of a kaio module: its subpackage (``kaio.ptx``, ``kaio.sim``...); the
    builtin modules (``kaio.lang``, ``kaio.lang_hopper``, ``kaio.lang_fp8``) fill one table
    and are one layer."""
    parts = module.split(".")
    return "kaio.lang" if parts[1].startswith("lang") else ".".join(parts[:2])


def test_no_layer_imports_another_layers_private_names():
    """The LLVM backend no private name of the PTX emitter, the runtime none of the compiler's,
    and so on (the package's root, kaio/__init__.py, assembles the public names)."""
    bad = []
    for path in sorted((ROOT / "kaio").rglob("*.py")):
        if path == ROOT / "kaio" / "__init__.py":
            continue
        own = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for module, name, line in _from_imports(path):
            if name and name.startswith("_") and _layer(module) != _layer(own):
                bad.append(f"{path.relative_to(ROOT)}:{line}: from {module} import {name}")
    assert not bad, bad
