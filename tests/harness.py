"""Running catalog cases and comparing their outputs with the references."""

from __future__ import annotations

import os
import re

import numpy as np

from kaio.ptx.ptxas import assemble


def covering(specs: list) -> list[int]:
    """The indices, in order, of a small subset of ``specs`` ((kernel, constexprs) pairs) that
    still has each kernel with every value of each of its constexprs at least once (greedy set
    cover: the case bringing the most new (kernel, name, value) triples first): what CI
    assembles of an op's long list of specializations. ``KAIO_TEST_EVERY_SPECIALIZATION=1``
    keeps them all."""
    if os.environ.get("KAIO_TEST_EVERY_SPECIALIZATION") == "1":
        return list(range(len(specs)))
    brings = []
    for kernel, constexprs in specs:
        name = getattr(kernel, "__name__", repr(kernel))
        triples = {(name, None, None)}
        triples |= {(name, k, type(v).__name__, repr(v)) for k, v in constexprs.items()}
        brings.append(triples)
    missing = set().union(*brings)
    kept: list[int] = []
    while missing:
        best = max(range(len(specs)), key=lambda i: (len(brings[i] & missing), -i))
        kept.append(best)
        missing -= brings[best]
    return sorted(kept)


def covered(specs: list) -> list:
    """The specializations ``covering`` keeps, in order."""
    return [specs[i] for i in covering(specs)]


def assemble_wgmma(kernel, constexprs: dict) -> None:
    """ptxas assembles an sm_90a kernel (wgmma, TMA): its PTX targets sm_90a, no spill stores,
    and no wgmma serialized by ptxas (warnings C7508, C7510, C7518: the products then wait
    for each other)."""
    ptx = kernel.ptx(arch="sm_90", **constexprs)
    assert ".target sm_90a" in ptx
    report = assemble(ptx, "sm_90a")
    spills = re.search(r"(\d+) bytes spill stores", report)
    assert spills and spills[1] == "0", (constexprs, report)
    assert "C7518" not in report and "C7508" not in report and "C7510" not in report, report


def launch_config(grid, block, shared_bytes):
    """The subscript for kernel[...] / kernel.sim[...] (block None: the decorator's)."""
    return (grid, block, None, shared_bytes)


def with_views(args, views):
    """The launch arguments: strided views of the arguments the case names."""
    return [a[views[i]] if i in views else a for i, a in enumerate(args)]


def host_copies(args):
    """Copies of the NumPy arguments (references must not see kernel writes)."""
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def assert_matches(name, got, expected, rtol, atol):
    """Every element equal (NaN equal to NaN) when rtol == atol == 0, else within tolerance."""
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    g = got.astype(np.float64) if got.dtype.kind in "fV" or got.dtype.name == "bfloat16" else got
    e = expected.astype(g.dtype) if g.dtype == np.float64 else expected.astype(got.dtype)
    if rtol == 0 and atol == 0:
        same = (g == e) | (np.isnan(g) & np.isnan(e)) if g.dtype == np.float64 else g == e
    else:
        same = np.isclose(g, e, rtol=rtol, atol=atol)
        same &= ~np.isnan(g)
    if not same.all():
        bad = np.argwhere(~same)[:5]
        details = ", ".join(f"{tuple(i)}: got {g[tuple(i)]!r} want {e[tuple(i)]!r}" for i in bad)
        raise AssertionError(f"{name}: {int((~same).sum())} elements differ; first: {details}")


def assemble_without_spills(kernel, constexprs: dict, archs=("sm_80", "sm_90")) -> None:
    """ptxas assembles the kernel's PTX for each of ``archs``; for sm_90 (H100, H200) the
    kernel fits its registers (up to 255): no spill stores."""
    for arch in archs:
        report = assemble(kernel.ptx(arch=arch, **constexprs), arch)
        if arch == "sm_90":
            spills = re.search(r"(\d+) bytes spill stores", report)
            assert spills and spills[1] == "0", (kernel.pyfunc.__name__, constexprs, report)
