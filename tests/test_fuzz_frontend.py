"""The frontend fuzzer (tests/frontend_fuzz.py), short run: random kernels (valid and invalid,
with device functions, decorator options and constexprs of every kind) either compile to PTX
that ptxas accepts, through both backends, or raise ``kaio.CompileError``, and those that
compile run in the simulator or raise LaunchError/SimulationError; mutants of real kernels
compile or raise CompileError; never another exception, never a hang.

The long run (a few thousand cases, kaio_ops' kernels among the mutated ones) is marked
``slow`` and runs only when selected (docs/testing.md)::

    python3 -m pytest -q -m slow tests/test_fuzz_frontend.py
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings

import kaio
from kaio.ptx.ptxas import find_ptxas
from tests import frontend_fuzz

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")

EXAMPLES = int(os.environ.get("KAIO_FUZZ_EXAMPLES", 40))
MUTANTS = int(os.environ.get("KAIO_FUZZ_MUTANTS", 20))
LONG_EXAMPLES = int(os.environ.get("KAIO_FUZZ_LONG_EXAMPLES", 2000))
LONG_MUTANTS = int(os.environ.get("KAIO_FUZZ_LONG_MUTANTS", 1000))
QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
OUTCOMES = {"ptx", "error", "python", "sim", "sim-error", "sim-timeout", "skip", "big"}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=QUIET)
@given(frontend_fuzz.kernels())
def test_random_kernels_compile_or_raise_compile_error(case):
    assert frontend_fuzz.check(case) in OUTCOMES


@settings(max_examples=MUTANTS, deadline=None, suppress_health_check=QUIET)
@given(frontend_fuzz.mutants())
def test_mutated_real_kernels_compile_or_raise_compile_error(mutant):
    assert frontend_fuzz.check_mutant(mutant) in OUTCOMES


@pytest.mark.slow
@settings(max_examples=LONG_EXAMPLES, deadline=None, suppress_health_check=QUIET)
@given(frontend_fuzz.kernels())
def test_long_run_random_kernels(case):
    assert frontend_fuzz.check(case) in OUTCOMES


@pytest.mark.slow
@settings(max_examples=LONG_MUTANTS, deadline=None, suppress_health_check=QUIET)
@given(frontend_fuzz.mutants(full=True))
def test_long_run_mutated_kernels(mutant):
    assert frontend_fuzz.check_mutant(mutant) in OUTCOMES


def test_known_kernels_take_each_outcome():
    """The checker itself: a valid kernel gives PTX, a bad one a CompileError, a broken
    signature is Python's business, and an exception of another kind escapes."""
    head = "import kaio\nfrom kaio import *\n\n\n@kaio.gpu_kernel\n"
    good = head + "def fuzzed(out0: f32[:], n: u32):\n    out0[0] = f32(n)\n"
    bad = head + "def fuzzed(out0: f32[:], n: u32):\n    out0[0] = [1]\n"
    syntax = head + "def fuzzed(out0: f32[:], n: u32):\n    break\n"
    assert frontend_fuzz.compile_source(good, {}) == "ptx"
    assert frontend_fuzz.compile_source(bad, {}) == "error"
    assert frontend_fuzz.compile_source(syntax, {}) == "python"
    with pytest.raises(kaio.LaunchError):  # not a CompileError: the fuzz test would fail
        frontend_fuzz.compile_source(good, {"missing": 1})


def test_a_pass_that_changes_results_is_caught(monkeypatch):
    """The simulator run of a kernel that compiles is checked against the unoptimized IR's:
    a pass that turned a multiplication into an addition fails the check."""
    from kaio.ir import passes

    optimize = passes.optimize

    def broken(fn, *args, **kwargs):
        result = optimize(fn, *args, **kwargs)
        for s in passes.walk(fn.body):
            if getattr(s, "op", None) == "mul":
                s.op = "add"
        return result

    source = SIM_HEAD.format("block_size=32") + (
        "def fuzzed(out0: f32[:], p0: f16[:], n: u32):\n"
        "    i = kaio.thread_idx_x()\n"
        "    out0[i] = f32(p0[i]) * 0.1 + f32(n)\n"
    )
    params = [("out0", "array", "f32", 1), ("p0", "array", "f16", 1), ("n", "scalar", "u32", 0)]
    case = frontend_fuzz.Case(source, {}, params, 32)
    assert frontend_fuzz.check(case, llvm=False) == "sim"
    monkeypatch.setattr(passes, "optimize", broken)
    with pytest.raises(AssertionError, match="differs between the optimized and the unopt"):
        frontend_fuzz.check(case, llvm=False)


HEAD = "import kaio\nfrom kaio import *\n\n\n@kaio.gpu_kernel\ndef fuzzed(out0: f32[:], n: u32):\n"
# What long fuzz runs found (each was a TypeError, a MemoryError or a hang before the fix).
FOUND = {
    "    for q in range(1 << 62):\n        pass": "ptx",  # a runtime loop, not a list
    "    out0[0] = 1 << 2.5": "error",
    "    out0[0] = (1 | 0.5) + n": "error",
    "    out0[0] = 2 ** 2 ** 40": "error",
    "    out0[0] = 1 << (1 << 40)": "error",
    "    for q in kaio.static_range(10 ** 9):\n        out0[0] = 1": "error",
    "    for q in kaio.static_range(0, 4, 0):\n        pass": "error",
    "    out0[0] = None < 1": "error",
    "    out0[0] = kaio.f32(10 ** 400)": "ptx",  # rounds to inf, as int -> float does
    "    out0[0] = kaio.i32(1e308 * 10)": "ptx",  # saturates, as cvt does
}


@pytest.mark.parametrize("body", sorted(FOUND))
def test_what_the_long_runs_found(body):
    assert frontend_fuzz.compile_source(HEAD + body + "\n", {}, limit=10) == FOUND[body]


SIM_HEAD = "import kaio\nfrom kaio import *\n\n\n@kaio.gpu_kernel({})\n"
SIM_BODY = "def fuzzed(out0: f32[:], n: u32):\n    out0[kaio.thread_idx_x()] = f32(n)\n"
# What the long runs with the simulator found (each an exception of another kind before).
FOUND_SIM = {
    # an int arch ran in the simulator into an AttributeError; an unknown one simulated a
    # kernel that no target compiles: both are a CompileError at definition now
    "block_size=32, arch=90": "error",
    "block_size=32, arch='sm_999'": "error",
    "block_size=32, arch='sm_80'": "sim",
}


@pytest.mark.parametrize("options", sorted(FOUND_SIM))
def test_what_the_long_runs_found_in_the_simulator(options):
    params = [("out0", "array", "f32", 1), ("n", "scalar", "u32", 0)]
    case = frontend_fuzz.Case(SIM_HEAD.format(options) + SIM_BODY, {}, params, 32)
    assert frontend_fuzz.check(case, llvm=False, limit=10) == FOUND_SIM[options]


def test_a_hang_is_reported():
    with pytest.raises(frontend_fuzz.Timeout):
        with frontend_fuzz.time_limit(0.05):
            time.sleep(1)
