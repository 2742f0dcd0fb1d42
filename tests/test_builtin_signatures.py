"""Every builtin's argument count is checked by its signature alone (the lowerings no longer
count their arguments): one argument too many, and one too few, is a CompileError at the
call naming the builtin's signature, for every builtin of ``kaio.lang.BUILTINS``."""

import importlib.util
import inspect

import pytest

import kaio
from kaio.lang import BUILTINS

_PARAMS = {b.name: list(b.signature.parameters.values()) for b in BUILTINS.values()}


def _counts(name: str) -> list[tuple[int, str]]:
    """(argument count, what the error says) for the wrong counts of builtin ``name``."""
    params = _PARAMS[name]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = sum(1 for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL)
    out = [] if variadic else [(len(params) + 1, "too many positional arguments")]
    if required:
        out.append((required - 1, "missing a required argument"))
    return out


CASES = [(name, n, what) for name in sorted(_PARAMS) for n, what in _counts(name)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """One module of kernels, each calling one builtin with a wrong number of arguments."""
    path = tmp_path_factory.mktemp("arity") / "arity_kernels.py"
    lines, where = ["import kaio", ""], {}
    for name, n, _ in CASES:
        fn = f"k_{name}_{n}"
        lines += ["@kaio.gpu_kernel", f"def {fn}(out: kaio.u32[:]):"]
        where[name, n] = (fn, len(lines) + 1)
        lines += [f"    kaio.{name}({', '.join(['0'] * n)})", ""]
    path.write_text("\n".join(lines))
    spec = importlib.util.spec_from_file_location("arity_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path), where


def test_every_builtin_has_a_call_form():
    """The signatures cover every builtin the lowerings used to count arguments for."""
    assert all(hasattr(kaio, name) for name in _PARAMS)
    assert {"shared", "mma_f16", "tma_load_2d_multicast", "wgmma_wait"} <= set(_PARAMS)
    assert all(isinstance(b.signature, inspect.Signature) for b in BUILTINS.values())


@pytest.mark.parametrize("name, n, what", CASES, ids=lambda x: str(x))
def test_wrong_argument_count_is_a_located_signature_error(kernels, name, n, what):
    module, path, where = kernels
    fn, line = where[name, n]
    with pytest.raises(kaio.CompileError) as info:
        getattr(module, fn).ir()
    message = str(info.value)
    assert message.startswith(f"{path}:{line}:5: error: kaio.{name}(")
    assert what in message
