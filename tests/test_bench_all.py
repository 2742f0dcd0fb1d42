"""``python -m bench all``: the suite runner, on small fake suites (CPU only, a few seconds): a
suite that crashes or overruns its time is recorded with what it wrote, and the run goes on."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest

import kaio
from bench import report, suites
from bench.__main__ import main as bench_main
from bench.perfdata import RESULTS_FILE, Run

WRITE = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
def write(results, complete):
    json.dump({"meta": {"complete": complete, "args": sys.argv[3:]}, "results": results},
              open(out, "w"))
rec = {"op": "add", "case": "f16 [8]", "impl": "kaio", "ok": True, "error": 0.0, "ms": 1.0,
       "gbps": 10.0}
"""

SCRIPTS = {
    "good.py": WRITE + "print('  add f16 [8] kaio=1000us')\nprint('| table |')\n"
    "write([rec, dict(rec, impl='triton', ms=2.0)], True)\n",
    "crash.py": WRITE + "write([rec], False)\nraise RuntimeError('kernel exploded')\n",
    "slow.py": WRITE + "import time\nwrite([rec], False)\nprint('working', flush=True)\n"
    "time.sleep(60)\n",
    "silent.py": "print('no json')\n",
    "where.py": "import json, os, sys, time\nt0 = time.time()\ntime.sleep(1.0)\n"
    "json.dump({'device': os.environ.get('CUDA_VISIBLE_DEVICES'), 'start': t0, "
    "'end': time.time()}, open(sys.argv[sys.argv.index('--out') + 1], 'w'))\n",
}


@pytest.fixture
def fake_suites(tmp_path):
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    s = suites.Suite
    return (
        s("good", str(tmp_path / "good.py"), "Good", ("--full",), ("--fast",), (1, 1)),
        s("crash", str(tmp_path / "crash.py"), "Crash", expect=(1, 1)),
        s("absent", str(tmp_path / "absent.py"), "Absent"),
        s("silent", str(tmp_path / "silent.py"), "Silent", expect=(1, 1)),
        s("slow", str(tmp_path / "slow.py"), "Slow", expect=(1, 1)),
        s("other", str(tmp_path / "good.py"), "Not chosen"),
        s("full only", str(tmp_path / "good.py"), "Not in quick runs", quick=None),
    )


def test_failures_are_recorded_and_the_run_goes_on(fake_suites, tmp_path, monkeypatch):
    monkeypatch.setattr(suites, "KILL_GRACE_S", 1.0)
    monkeypatch.setattr(suites, "MIN_START_S", 0.5)
    out = tmp_path / "out"
    chosen = ["good", "crash", "absent", "silent", "slow", "full only"]
    path = suites.run_all(
        out, quick=True, only=chosen, budget=4, suites=fake_suites, echo=False, probe=False
    )
    raw = json.loads(path.read_text())
    got = {name: s["status"] for name, s in raw["suites"].items()}
    assert got == {
        "good": "ok",
        "crash": "failed",
        "absent": "missing",
        "silent": "no data",
        "slow": "timeout",
        "other": "skipped",
        "full only": "skipped",
    }
    assert raw["suites"]["full only"]["why"] == "not in a quick run"
    good, crash, slow = raw["suites"]["good"], raw["suites"]["crash"], raw["suites"]["slow"]
    assert good["data"]["meta"]["args"] == ["--fast"] and good["args"] == ["--fast"]
    assert len(good["data"]["results"]) == 2
    assert crash["rc"] == 1 and "RuntimeError: kernel exploded" in crash["log_tail"]
    assert crash["data"]["meta"]["complete"] is False  # what it wrote before it crashed
    assert slow["seconds"] < 8 and "working" in slow["log_tail"]
    assert len(slow["data"]["results"]) == 1
    log = (out / "log.txt").read_text()
    assert "good" in log and "| table |" in log and "[bench] slow" in log
    assert sorted(p.name for p in out.iterdir()) in (
        ["log.txt", "results.json"],
        ["log.txt", "plots.tar", "results.json"],
    )
    assert raw["meta"]["quick"] is True and "plots" in raw["meta"]
    # the report reads it back
    page = tmp_path / "performance.md"
    monkeypatch.setattr(report.plots, "available", lambda: False)
    report.write_report(out, page, tmp_path / "perf")
    text = page.read_text()
    assert "## Crash (`" in text and "kernel exploded" in text and "2.00x" in text


def test_time_allotment():
    assert suites.timeout_for(100, 10, [20, 30]) == 50  # the rest, less what later suites need
    assert suites.timeout_for(100, 10, []) == 100
    assert suites.timeout_for(40, 10, [20, 30]) == 10  # its own time first: later ones wait
    assert suites.timeout_for(5, 10, [20]) == 5  # never past the budget
    assert suites.timeout_for(-3, 10, []) == 0


def test_assign_puts_the_longest_first_onto_the_least_loaded_card():
    assert suites.assign([10, 50, 30, 40, 20], 2) == [[0, 1, 4], [2, 3]]  # 80 s and 70 s
    assert suites.assign([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]  # ties: the lower card
    assert suites.assign([3, 1, 2], 1) == [[0, 1, 2]]  # one card: the table's order
    assert suites.assign([5], 3) == [[0], [], []]
    assert suites.assign([], 2) == [[], []]


def test_the_table_over_four_cards_fits_half_the_budget():
    """The final check's four cards: the full run's expected seconds spread so that each
    card's share fits in half the default budget, every suite given its expected time."""
    expected = [s.expect[0] for s in suites.SUITES]
    plan = suites.assign(expected, 4)
    loads = [sum(expected[i] for i in card) for card in plan]
    assert sorted(i for card in plan for i in card) == list(range(len(expected)))
    assert max(loads) <= suites.BUDGET_S[False] / 2
    assert max(loads) - min(loads) <= max(expected)


def test_cards_are_indexes_among_the_visible_ones():
    assert suites.cuda_device("1", None) == "1"
    assert suites.cuda_device("1", "4,5") == "5"
    assert suites.cuda_device("0", "GPU-8f1c") == "GPU-8f1c"
    with pytest.raises(ValueError, match="sees 2"):
        suites.cuda_device("2", "4,5")
    for bad in ("-1", "x", "GPU-8f1c"):
        with pytest.raises(ValueError, match="an index"):
            suites.cuda_device(bad, None)


def test_suites_spread_over_cards_run_side_by_side(tmp_path, monkeypatch):
    (tmp_path / "where.py").write_text(SCRIPTS["where.py"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    s = suites.Suite
    table = tuple(
        s(name, str(tmp_path / "where.py"), name, expect=(t, t))
        for name, t in (("a", 3), ("b", 2), ("c", 2), ("d", 1))
    )
    path = suites.run_all(
        tmp_path / "out", gpus=["0", "1"], budget=60, suites=table, echo=False, probe=False
    )
    raw = json.loads(path.read_text())
    got = {n: (r["status"], r["gpu"], r["data"]["device"]) for n, r in raw["suites"].items()}
    assert got == {"a": ("ok", "0", "6"), "b": ("ok", "1", "7"), "c": ("ok", "1", "7"),
                   "d": ("ok", "0", "6")}  # fmt: skip
    a, b, c, d = (raw["suites"][n]["data"] for n in "abcd")
    assert a["end"] <= d["start"] and b["end"] <= c["start"]  # one card: one after the other
    assert max(a["start"], b["start"]) < min(a["end"], b["end"])  # two cards: side by side
    assert raw["meta"]["gpus"] == ["0", "1"]
    assert {g: c["device"] for g, c in raw["meta"]["cards"].items()} == {"0": "6", "1": "7"}
    log = (tmp_path / "out" / "log.txt").read_text()
    assert "[2/2] d on gpu 0: ok" in log and "on gpus 0,1" in log


def test_host_timing_suites_run_alone_before_the_others(tmp_path, monkeypatch):
    """With several cards, a suite marked ``alone`` runs on the first card before any other
    suite starts; on one card it keeps its place in the table."""
    (tmp_path / "where.py").write_text(SCRIPTS["where.py"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    s = suites.Suite
    table = (
        s("a", str(tmp_path / "where.py"), "a", expect=(2, 2)),
        s("h", str(tmp_path / "where.py"), "h", expect=(1, 1), alone=True),
        s("b", str(tmp_path / "where.py"), "b", expect=(2, 2)),
    )
    path = suites.run_all(
        tmp_path / "out", gpus=["0", "1"], budget=60, suites=table, echo=False, probe=False
    )
    got = json.loads(path.read_text())["suites"]
    h = got["h"]["data"]
    assert got["h"]["gpu"] == "0" and h["device"] == "6"
    assert all(h["end"] <= got[n]["data"]["start"] for n in "ab")
    one = suites.run_all(tmp_path / "one", budget=60, suites=table, echo=False, probe=False)
    ran = json.loads(one.read_text())["suites"]
    assert ran["a"]["data"]["end"] <= ran["h"]["data"]["start"] <= ran["b"]["data"]["start"]


def test_a_suite_without_time_is_not_started(fake_suites, tmp_path):
    path = suites.run_all(
        tmp_path / "out", only=["good"], budget=0, suites=fake_suites, echo=False, probe=False
    )
    assert json.loads(path.read_text())["suites"]["good"]["status"] == "no time"


def test_the_suite_table():
    names = [s.name for s in suites.SUITES]
    assert len(names) == len(set(names))
    for s in suites.SUITES:
        assert s.expect[1] <= s.expect[0] and s.path.name not in suites.HELPERS
    quick = [s for s in suites.SUITES if s.quick is not None]
    assert sum(s.expect[1] for s in quick) <= suites.BUDGET_S[True]  # a quick run runs them all


def test_command_line(capsys, tmp_path):
    assert bench_main(["list"]) == 0
    assert "matmul" in capsys.readouterr().out
    assert bench_main([]) == 2
    with pytest.raises(SystemExit):
        bench_main(["all", "--out", str(tmp_path), "--suites", "nope"])
    with pytest.raises(SystemExit):
        bench_main(["all", "--out", str(tmp_path), "--gpus", "0,x"])


def test_report_command(tmp_path, monkeypatch):
    monkeypatch.setattr(report.plots, "available", lambda: False)
    run = tmp_path / "run"
    run.mkdir()
    (run / RESULTS_FILE).write_text(json.dumps({"meta": {}, "suites": {}}))
    page = tmp_path / "p.md"
    assert bench_main(["report", str(run), "--page", str(page), "--plots", str(tmp_path)]) == 0
    assert page.read_text().startswith(report.MARK)
    assert Run.load(run).suites == []


def test_python_dash_m_bench(tmp_path):
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "bench", "list"],
        capture_output=True,
        text=True,
        cwd=suites.ROOT,
        timeout=60,
    )
    assert out.returncode == 0 and "memory_ops.py" in out.stdout


def test_sim_speed_counts_the_instructions_it_runs():
    # the counter wraps the engine's instruction step: twice the blocks, twice the count
    from bench import sim_speed

    n = sim_speed.BLOCK * 2
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    out = np.empty(n, np.float32)
    counts = [
        sim_speed.count_thread_instructions(
            lambda b=b: sim_speed.silu_gate.sim[b](x, x, out, b * sim_speed.BLOCK)
        )
        for b in (1, 2)
    ]
    assert counts[0] > 0 and counts[1] == 2 * counts[0]
    np.testing.assert_allclose(out, x / (1 + np.exp(-x)) * x, rtol=1e-5)


def test_sim_speed_matmul_is_the_product():
    from bench import sim_speed

    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((sim_speed.MM, sim_speed.MM)).astype(np.float16) for _ in "ab")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out = np.asarray(sim_speed.simulated_matmul(a, b), np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3


@pytest.mark.parametrize("rows, cols", [(16, 1024), (5, 36)])
def test_read_words_floor_reads_every_word(rows, cols):
    # one XOR a thread: with whole blocks (16 x 1024) the XOR of the outputs is the XOR of
    # all the words; a ragged shape re-reads the last vector, in bounds
    from bench import floors

    w = np.random.default_rng(2).integers(-(2**31), 2**31, (rows, cols)).astype(np.int32)
    blocks = floors.blocks_for(w.size)
    out = np.full(blocks * floors.THREADS, 7, np.int32)
    with kaio.simulate():
        floors.read_words[blocks, floors.THREADS](w, out)
    vectors = w.reshape(-1, 4)
    v = np.arange(blocks * floors.THREADS * floors.LOADS)  # block, load, thread
    thread = (v // (floors.THREADS * floors.LOADS)) * floors.THREADS + v % floors.THREADS
    read = vectors[np.minimum(v, len(vectors) - 1)]
    expected = np.zeros_like(out)
    np.bitwise_xor.at(expected, thread, np.bitwise_xor.reduce(read, axis=1))
    np.testing.assert_array_equal(out, expected)
    if w.size % (4 * floors.THREADS * floors.LOADS) == 0:
        assert np.bitwise_xor.reduce(out) == np.bitwise_xor.reduce(w.ravel())


def test_harness_times_implementations_in_turn(monkeypatch):
    """Each case's timed calls come in rounds that take its implementations in turn (a GPU
    whose clock drops midway slows every implementation alike); an implementation that fails
    while timed is reported and dropped from the later rounds."""
    pytest.importorskip("torch")
    from bench import harness

    h = harness.Harness("rounds", reps=50)
    order = []

    def fake_time(fn, sets, batch=1, reps=None, warmup=None):
        order.append(fn.__name__)
        if fn.__name__ == "broken" and len(order) > 3:
            raise RuntimeError("gone")
        return [float(len(order))] * reps

    def fast():
        return None

    def slow():
        return None

    def broken():
        return None

    monkeypatch.setattr(h, "time", fake_time)
    done = h.case("op", "case", lambda: (), {"fast": fast, "slow": slow, "broken": broken})
    rounds = harness.ROUNDS
    assert order[:6] == ["fast", "slow", "broken", "fast", "slow", "broken"]
    assert order.count("fast") == order.count("slow") == rounds and order.count("broken") == 2
    by = {r.impl: r for r in done}
    assert by["fast"].ok and by["fast"].ms is not None
    assert not by["broken"].ok and "gone" in by["broken"].note and by["broken"].ms is None


def test_harness_divides_by_the_calls_one_call_makes(monkeypatch):
    """A call that replays a graph of several calls of the op (bench/decode.py's kernel time)
    is timed as one, and its times divided by the calls; GB/s counts one call's bytes."""
    pytest.importorskip("torch")
    from bench import harness

    h = harness.Harness("calls", reps=10)
    monkeypatch.setattr(h, "time", lambda fn, sets, batch=1, reps=None, warmup=None: [2.0] * reps)
    ops = {"graph": lambda: None}
    (one,) = h.case("op", "one", lambda: (), ops, nbytes=10**6)
    (many,) = h.case("op", "many", lambda: (), ops, nbytes=10**6, calls=8)
    assert one.ms == 2.0 and many.ms == 0.25 and many.ms_max == 0.25
    assert many.gbps == 8 * one.gbps
