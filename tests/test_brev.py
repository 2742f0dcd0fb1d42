"""kaio.brev (bit reverse): the builtin added through the five files of docs/architecture.md's
"Adding a builtin" (kaio/lang.py, kaio/ir/ops.py, kaio/ptx/lowering.py, kaio/llvm/lowering.py,
kaio/sim/semantics.py), checked in the simulator against Python's own bit strings, through
ptxas for both backends, and for its misuse."""

from __future__ import annotations

import numpy as np
import pytest

import kaio
from kaio import bool_, f32, i32, i64, u8, u32, u64
from kaio.ptx.ptxas import assemble, find_ptxas
from tests.catalog import poison, rand_int

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


@kaio.gpu_kernel(block_size=64)
def reverse(x: DT[:], out: DT[:], twice: DT[:], DT: kaio.constexpr):  # noqa: F821
    i = kaio.thread_idx_x()
    out[i] = kaio.brev(x[i])
    twice[i] = kaio.brev(kaio.brev(x[i])) ^ kaio.brev(DT(1))


def _reversed(values, bits: int) -> list[int]:
    return [int(format(int(v) % (1 << bits), f"0{bits}b")[::-1], 2) for v in values]


@pytest.mark.parametrize("t", [u32, i32, u64, i64], ids=str)
def test_simulator_reverses_the_bits(t):
    rng = np.random.default_rng(7)
    dtype = t.np_dtype
    info = np.iinfo(dtype)
    x = rand_int(rng, dtype, 64)
    x[:4] = [0, 1, info.max, info.min]
    out, twice = poison(64, dtype), poison(64, dtype)
    reverse.sim[1, 64](x, out, twice, DT=t)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    expected = np.array(_reversed(x, t.bits), unsigned).view(dtype)
    np.testing.assert_array_equal(out, expected)
    top = np.array(1 << (t.bits - 1), unsigned).view(dtype)  # brev(1): the top bit
    np.testing.assert_array_equal(twice, x ^ top)


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("t", [u32, i64], ids=str)
def test_ptx_assembles_through_both_backends(t, arch):
    backends = ["ptx"] + (["llvm"] if kaio.llvm.available() else [])
    for backend in backends:
        text = reverse.ptx(arch=arch, backend=backend, DT=t)
        assert f"brev.b{t.bits}" in text
        assemble(text, arch)


@kaio.gpu_kernel
def _narrow(x: DT[:], DT: kaio.constexpr):  # noqa: F821
    x[0] = kaio.brev(x[1])


@pytest.mark.parametrize("t", [u8, f32, bool_], ids=str)
def test_other_types_are_compile_errors(t):
    with pytest.raises(kaio.CompileError) as info:
        _narrow.ir(DT=t)
    message = str(info.value)
    assert f"test_brev.py:{_narrow.pyfunc.__code__.co_firstlineno + 2}:" in message
    assert f"kaio.brev() takes a 32- or 64-bit integer, got {t}" in message
