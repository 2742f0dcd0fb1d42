"""The keys of compiled variants: the in-memory cache (by constexpr type and value) and the
disk cache (everything the PTX depends on: the kernel's sources, the module-level values it
reads by any route, the constexprs by type and value, the compiler's own sources)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest

import kaio
from kaio import f32
from kaio.frontend import resolve
from tests.test_runtime_cpu import fake_device_array, fake_driver  # noqa: F401 (a fixture)


@kaio.gpu_kernel(block_size=32)
def store_constexpr(out: f32[:], A: kaio.constexpr):
    out[0] = A


@pytest.mark.parametrize(
    "values",
    [
        (1, 1.0, True),
        (0.0, -0.0),
        (np.int32(4), 4, np.int64(4), np.float32(4)),
        ((1, 2), (1.0, 2), (True, 2)),
    ],
    ids=["int-float-bool", "signed-zeros", "numpy-scalars", "tuples"],
)
def test_constexprs_equal_in_python_are_distinct_variants(values):
    """Issue 29.2: each value gets its own variant, whatever was compiled first, and the
    in-memory and the disk key agree on what is distinct."""
    for order in (values, values[::-1]):
        kernel = kaio.gpu_kernel(block_size=32)(store_constexpr.pyfunc)  # a fresh cache
        specs = [kernel.specialize({"A": v}, ("C",)) for v in order]
        assert len({id(s) for s in specs}) == len(values)
        assert len({s.key for s in specs}) == len(values)
        for v, s in zip(order, specs, strict=True):
            assert type(s.constexprs["A"]) is type(v) and repr(s.constexprs["A"]) == repr(v)
        again = [kernel.specialize({"A": v}, ("C",)) for v in order]
        assert [id(s) for s in again] == [id(s) for s in specs]  # and each is cached


def test_signed_zero_constexpr_stores_its_own_sign():
    """The order-dependent result of issue 29.2: -0.0 after 0.0 used 0.0's variant."""
    kernel = kaio.gpu_kernel(block_size=32)(store_constexpr.pyfunc)
    for value in (0.0, -0.0, 0.0):
        out = np.full(1, np.nan, np.float32)
        kernel.sim[1, 32](out, A=value)
        assert out[0] == 0.0 and np.signbit(out[0]) == np.signbit(value)


def test_unhashable_constexpr_compiles_without_caching():
    kernel = kaio.gpu_kernel(block_size=32)(store_constexpr.pyfunc)

    class Opaque:
        __hash__ = None

        def __index__(self):
            return 3

    assert kernel.specialize({"A": 2}, ("C",)) is kernel.specialize({"A": 2}, ("C",))
    opaque = Opaque()
    first = kernel.specialize({"A": opaque}, ("C",))
    assert first is not kernel.specialize({"A": opaque}, ("C",))


# ----------------------------------------------------------------------------- disk key
HELPERS = """
import kaio
from kaio import f16, f32

N = 4
T = f32[:]


class C:
    N = 4


@kaio.gpu_func
def f(x: f32) -> f32:
    return x + 1.0


@kaio.gpu_func
def g(x: f32) -> f32:
    return x + 2.0
"""

KERNEL = """
import numpy as np

import kaio
from kaio import f32

import {helpers} as helpers
from {helpers} import C, T

SCALE = np.float32(2)
FLAG = 1


@kaio.gpu_kernel(block_size=32)
def kern(out: T, n: kaio.u32):
    i = kaio.thread_idx_x()
    if i < n:
        out[i] = helpers.f(f32(helpers.N + C.N + FLAG) * SCALE)
"""


@pytest.fixture
def kernel_module(tmp_path, monkeypatch, request):
    """A kernel in a module of its own (the disk key reads its source) and the helper module
    it reads constants, a class, an array-type alias and a device function from."""
    tag = f"{len(sys.modules)}_{abs(hash(request.node.name))}"
    helpers, kern = f"c30_helpers_{tag}", f"c30_kernel_{tag}"
    (tmp_path / f"{helpers}.py").write_text(HELPERS)
    (tmp_path / f"{kern}.py").write_text(textwrap.dedent(KERNEL.format(helpers=helpers)))
    monkeypatch.syspath_prepend(str(tmp_path))
    h = importlib.import_module(helpers)
    m = importlib.import_module(kern)
    yield h, m
    sys.modules.pop(helpers, None)
    sys.modules.pop(kern, None)


def disk_key(module) -> str:
    """The disk-cache part of the key of ``module.kern``'s only variant."""
    return module.kern._hash({}, ("C",))


@pytest.mark.parametrize(
    "change",
    [
        ("module attribute (helpers.N)", lambda h, m: setattr(h, "N", 5)),
        ("module attribute, same value other type", lambda h, m: setattr(h, "N", 4.0)),
        ("class attribute (C.N)", lambda h, m: setattr(h.C, "N", 5)),
        ("NumPy scalar value", lambda h, m: setattr(m, "SCALE", np.float32(3))),
        ("NumPy scalar type", lambda h, m: setattr(m, "SCALE", np.float16(2))),
        ("constant 1 -> True", lambda h, m: setattr(m, "FLAG", True)),
        ("constant 1 -> 1.0", lambda h, m: setattr(m, "FLAG", 1.0)),
        ("device function via attribute", lambda h, m: setattr(h, "f", h.g)),
        ("array-type alias annotation", lambda h, m: setattr(m, "T", kaio.f16[:])),
    ],
    ids=lambda c: c[0] if isinstance(c, tuple) else None,
)
def test_disk_key_changes_with_each_kind_of_dependency(kernel_module, change):
    """Issue 30.2: every route by which a kernel reads a module-level value enters the key,
    by type and value; before, a new process loaded the old cubin."""
    h, m = kernel_module
    before = disk_key(m)
    assert before == disk_key(m)  # stable
    change[1](h, m)
    assert disk_key(m) != before, change[0]


def test_disk_key_follows_the_ptx(kernel_module):
    """Proof by the output: variants whose keys agree compile to the same PTX, and each
    change above that changes the PTX changes the key."""
    h, m = kernel_module
    seen: dict[str, str] = {}

    def record():
        kernel = kaio.gpu_kernel(block_size=32)(m.kern.pyfunc)
        ptx = kernel.specialize({}, ("C",)).ptx("sm_80")
        key = kernel._hash({}, ("C",))
        assert seen.setdefault(key, ptx) == ptx
        return key, ptx

    base = record()
    for change in (
        lambda: setattr(h, "N", 9),
        lambda: setattr(h.C, "N", 7),
        lambda: setattr(m, "SCALE", np.float32(5)),
        lambda: setattr(h, "f", h.g),
    ):
        change()
        key, ptx = record()
        assert ptx != base[1] and key != base[0]
        base = key, ptx


def test_disk_key_includes_the_compiler_sources(monkeypatch):
    """Issue 30.2: kaio's own sources, not ``__version__``, key the compiler."""
    before = store_constexpr._hash({"A": 1}, ("C",))
    monkeypatch.setattr(resolve, "compiler_fingerprint", lambda: "another compiler")
    assert store_constexpr._hash({"A": 1}, ("C",)) != before


def test_compiler_fingerprint_covers_the_compiler_not_the_simulator(tmp_path, monkeypatch):
    """A change in the frontend, IR, emitters, language tables or the cache's metadata writer
    changes the fingerprint; one in the simulator or the launcher does not."""
    import kaio as kaio_pkg

    root = tmp_path / "kaio"
    files = [
        "__init__.py",
        "lang.py",
        "types.py",
        "frontend/lower.py",
        "ir/passes.py",
        "ptx/emitter.py",
        "llvm/lowering.py",
        "runtime/module.py",
        "runtime/launcher.py",
        "sim/engine.py",
    ]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    monkeypatch.setattr(kaio_pkg, "__file__", str(root / "__init__.py"))

    def fingerprint() -> str:
        resolve.compiler_fingerprint.cache_clear()
        return resolve.compiler_fingerprint()

    try:
        base = fingerprint()
        assert base == fingerprint()
        for rel in files:
            (root / rel).write_text(f"# {rel}, changed\n")
            now = fingerprint()
            if rel.startswith("sim/") or rel == "runtime/launcher.py":
                assert now == base, rel
            else:
                assert now != base, rel
            base = now
        (root / "ir" / "new_pass.py").write_text("# a new file\n")
        assert fingerprint() != base
    finally:
        resolve.compiler_fingerprint.cache_clear()


def test_compiler_fingerprint_is_computed_once():
    resolve.compiler_fingerprint.cache_clear()
    first = resolve.compiler_fingerprint()
    assert resolve.compiler_fingerprint.cache_info().misses == 1
    assert resolve.compiler_fingerprint() == first
    assert resolve.compiler_fingerprint.cache_info().hits >= 1


# ----------------------------------------------------------------------------- launchers
@kaio.gpu_kernel(block_size=32)
def fill_constexpr(out: f32[:], n: kaio.u32, A: kaio.constexpr):
    i = kaio.thread_idx_x()
    if i < n:
        out[i] = A


@pytest.mark.parametrize(
    "built, others",
    [(1, [1.0, True, np.int32(1)]), (0.0, [-0.0, 0, False]), (np.int32(4), [4, np.int64(4)])],
)
def test_a_launcher_takes_only_its_own_constexpr(fake_driver, built, others):  # noqa: F811
    """The generated launcher of the variant for ``built`` declines the values Python calls
    equal to it (the slow path then builds theirs), and takes ``built`` again, as a new
    object of its type too."""
    from kaio.runtime.arguments import describe
    from kaio.runtime.launcher import build_launcher

    calls, loaded = fake_driver
    out = fake_device_array(loaded.device, 0x1000, (8,), (4,))
    args = (out, 8, built)
    spec = fill_constexpr.specialize({"A": built}, ("C",))
    loaded.params = spec.function.params
    bind = build_launcher(fill_constexpr, spec, loaded, args, {0: describe(out)})
    launch = bind((1, 1, 1), (32, 1, 1), 0, 0)
    assert launch(args) and len(calls) == 1
    for other in others:
        assert not launch((out, 8, other)), repr(other)
    same = type(built)(repr(built) if isinstance(built, float) else int(built))
    assert launch((out, 8, same)) and len(calls) == 2
