"""bench/gemm_sweep.py's offline parts: the ratio tables of finished runs and the stream-K
wins turned into ``linear.MEASURED`` entries (no GPU)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
gemm_sweep = pytest.importorskip("bench.gemm_sweep")


def _run(tmp_path, rows):
    results = [
        {"op": op, "case": case, "impl": impl, "ok": True, "error": 0.0, "ms": ms}
        for op, case, impl, ms in rows
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"meta": {"gpu": "Test GPU"}, "results": results}))
    return str(path)


def test_report_tables_and_geomean(tmp_path):
    path = _run(
        tmp_path,
        [
            ("gemm sweep f16", "M=1 4096x4096", "kaio", 2.0),
            ("gemm sweep f16", "M=1 4096x4096", "cuBLAS", 1.0),
            ("gemm sweep f16", "M=16 4096x4096", "kaio", 1.0),
            ("gemm sweep f16", "M=16 4096x4096", "cuBLAS", 2.0),
            ("gemm sweep f16", "M=16 4096x4096", "Triton", 3.0),
        ],
    )
    text = gemm_sweep.report([path])
    assert "GPU: Test GPU" in text
    assert "cuBLAS time / kaio time over 2 cases: geometric mean 1.000x, 0.50x to 2.00x" in text
    assert "| 4096x4096 | 0.50 | 2.00 |" in text
    assert "| 4096x4096 | 3.00 |" in text  # Triton: M = 16 only


def test_propose_takes_streamk_where_it_wins(tmp_path):
    """A stream-K plan 10% faster than the op at M = 128 replaces the table's choice there
    only; a 1% win (under the margin) does not."""
    from kaio_ops.linear import MEASURED

    path = _run(
        tmp_path,
        [
            ("gemm sweep f16", "M=128 4096x4096", "kaio", 1.0),
            ("gemm sweep f16", "M=128 4096x4096", "kaio sk 2x128", 0.9),
            ("gemm sweep f16", "M=256 4096x4096", "kaio", 1.0),
            ("gemm sweep f16", "M=256 4096x4096", "kaio sk 2x128", 0.99),
        ],
    )
    line = gemm_sweep.propose([path])
    assert line.startswith('    (4096, 4096, "kn"): [')
    from kaio_ops import _gemm_hopper, _gemm_streamk
    from kaio_ops.matmul import Plan

    names = {"_P": _gemm_hopper.Plan, "_S": _gemm_streamk.Plan, "Plan": Plan}  # the table's
    entries = eval(line.split(": ", 1)[1].rstrip(","), names)  # noqa: S307
    old = dict(MEASURED[(4096, 4096, "kn")])
    got = dict(entries)
    assert got[128][:2] == (2, 128) and got[128] != old[128]
    assert got[256] == old[256]


def test_report_draws_a_heat_map_per_peer(tmp_path):
    """``--report --plots``: one heat map against cuBLAS and one against Triton where
    Triton ran (bench/plots.py), each named in the text."""
    pytest.importorskip("matplotlib")
    path = _run(
        tmp_path,
        [
            ("gemm sweep f16", f"M={m} 4096x4096", impl, ms)
            for m in (1, 16)
            for impl, ms in (("kaio", 1.0), ("cuBLAS", 1.1), ("Triton", 1.3))
        ],
    )
    text = gemm_sweep.report([path], str(tmp_path / "plots"))
    for name in ("gemm-sweep-f16-heatmap.png", "gemm-sweep-f16-triton-heatmap.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000
        assert name in text
    assert "Triton time / kaio time over 2 cases: geometric mean 1.300x" in text


def test_alt_plan_is_the_routes_variant(monkeypatch):
    """``--alt``: the routed Hopper plan with wide stores, the persistent kernel (from 256
    rows) in pairs sharing B at the route's width, nothing for other kernels or fewer rows."""
    import importlib

    import numpy as np

    import kaio
    from kaio_ops import _gemm_hopper

    linear_mod = importlib.import_module("kaio_ops.linear")
    routed = {}
    monkeypatch.setattr(linear_mod, "route", lambda a, b, mnk, *rest: routed[mnk[0]])
    routed.update({64: _gemm_hopper.Plan(1, 64, 12, 1, False), 512: "persistent"})
    routed.update({128: "persistent", 1024: linear_mod.Persistent(224), 16: "mma.sync"})
    routed[32] = _gemm_hopper.Plan(1, 64, 6, 2, True)  # a K split: no wide stores

    def alt(m, n=10240):
        with kaio.simulate():  # NumPy operands (the plan needs no GPU)
            b = np.zeros((64, n), np.float16)
            return gemm_sweep.alt_plan(np.zeros((m, 64), np.float16), b, 132)

    assert alt(64) == _gemm_hopper.Plan(1, 64, 12, 1, False, 0, 1)
    assert alt(512) == linear_mod.Persistent(160, 8, 1)  # persistent_width(512, 10240)
    assert alt(1024) == linear_mod.Persistent(224, 8, 1)
    assert alt(128) is None and alt(16) is None and alt(32) is None


def test_report_takes_each_case_from_one_run(tmp_path):
    """A chunk run later replaces the whole case: Triton's time from an earlier run is not
    divided by kaio's from a later one."""
    first = _run(
        tmp_path,
        [
            ("gemm sweep f16", "M=1 4096x4096", "kaio", 2.0),
            ("gemm sweep f16", "M=1 4096x4096", "cuBLAS", 2.0),
            ("gemm sweep f16", "M=1 4096x4096", "Triton", 2.0),
        ],
    )
    (tmp_path / "first.json").write_text(open(first).read())
    later = _run(
        tmp_path,
        [
            ("gemm sweep f16", "M=1 4096x4096", "kaio", 1.0),
            ("gemm sweep f16", "M=1 4096x4096", "cuBLAS", 1.5),
        ],
    )
    text = gemm_sweep.report([str(tmp_path / "first.json"), later])
    assert "cuBLAS time / kaio time over 1 cases: geometric mean 1.500x" in text
    assert "Triton time" not in text
