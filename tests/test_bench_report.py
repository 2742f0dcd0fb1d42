"""``python -m bench report``: docs/performance.md from a small synthetic run (no GPU, no torch,
no matplotlib needed)."""

from __future__ import annotations

import io
import json
import re
import tarfile

import pytest

from bench import plots, report, targets
from bench.perfdata import RESULTS_FILE, Run

FLOPS_4096 = 2.0 * 4096**3
FLOPS_DECODE = 2.0 * 4096 * 4096
BYTES_DECODE = (4096 + 4096 * 4096) * 2 + 4096 * 4
BYTES_SILU = 3 * 16384 * 8192 * 2
BYTES_ROWS = 2 * 32768 * 4096 * 2


def rec(op, case, impl, ms, nbytes=None, flops=None, ok=True, error=1e-6, note=""):
    """A harness result record as bench/harness.py writes it."""
    return {
        "op": op,
        "case": case,
        "impl": impl,
        "ok": ok,
        "error": error,
        "ms": ms,
        "gbps": nbytes / ms / 1e6 if nbytes and ms else None,
        "tflops": flops / ms / 1e9 if flops and ms else None,
        "note": note,
    }


def harness(results, complete=True, **meta):
    return {"meta": {"reps": 50, "warmup": 5, "complete": complete, **meta}, "results": results}


def synthetic_run() -> dict:
    mm, big, dec = "matmul f16", "4096x4096x4096", "1x4096x4096"
    matmul = harness(
        [
            rec(mm, big, "cuBLAS", 0.2, flops=FLOPS_4096),
            rec(mm, big, "kaio async", 0.4, flops=FLOPS_4096),
            rec(mm, big, "kaio sync", 0.5, flops=FLOPS_4096),
            rec(mm, big, "Triton", 0.25, flops=FLOPS_4096),
            rec(mm, dec, "cuBLAS", 0.019, BYTES_DECODE, FLOPS_DECODE),
            rec(mm, dec, "kaio async", 0.02, BYTES_DECODE, FLOPS_DECODE),
            rec(mm, dec, "kaio sync", 0.03, BYTES_DECODE, FLOPS_DECODE),
            rec(mm, dec, "Triton", 0.05, BYTES_DECODE, FLOPS_DECODE, ok=False, error=0.5),
            rec("sgemm f32 (TF32 off)", big, "cuBLAS sgemm", 2.75, flops=FLOPS_4096),
        ],
        mma_sync_peak_tflops={"f16": 600.0, "bf16": 600.0},
    )
    silu, soft, gelu = "f16 [16384, 8192]", "f16 [32768, 4096]", "f16 [16384, 8192]"
    memory = harness(
        [
            rec("copy", "1024 MiB", "torch copy_", 2 * 2**30 / 4000 / 1e6, 2 * 2**30),
            rec("silu_gate", silu, "kaio", 0.2, BYTES_SILU),
            rec("silu_gate", silu, "triton", 0.19, BYTES_SILU),
            rec("silu_gate", silu, "torch", 0.33, BYTES_SILU),
            rec("gelu tanh", gelu, "kaio", 0.2, BYTES_SILU),
            rec("gelu tanh", gelu, "triton", 0.18, BYTES_SILU),
            rec("softmax", soft, "kaio", 0.16, BYTES_ROWS, ok=False, error=0.1),
            rec("softmax", soft, "triton", 0.17, BYTES_ROWS),
            rec("softmax", soft, "torch", None, ok=False, error=None, note="RuntimeError: boom"),
            rec("copy", "1024 MiB", "torch copy_", 2 * 2**30 / 3900 / 1e6, 2 * 2**30),
        ]
    )
    launch = {
        "device": "NVIDIA H200",
        "arch": "sm_90",
        "ptx": "emitted",
        "results": {
            "rows": {
                "raw ctypes cuLaunchKernelEx, extra buffer": {"host_us": 3.7, "free_us": 3.8},
                "kaio pre-bound launch(...), DeviceArray": {"host_us": 5.1, "free_us": 5.2},
                "kaio pre-bound launch(...), torch": {"host_us": 6.4, "free_us": 6.2},
                "kaio add[grid, 256](...), CuPy": {"host_us": 12.5, "free_us": 12.4},
                "triton add[grid](...), torch": {"host_us": 12.0, "free_us": 12.1},
            },
            "GPU us/kernel, back to back": 1.8,
            "first launch in a new process, empty cache (ms)": 13.6,
            "ops": [
                {
                    "op": "rms_norm [1, 4096] f16",
                    "torch": "F.rms_norm",
                    "kaio_us": 20.0,
                    "torch_us": 10.0,
                },
            ],  # fmt: skip
        },
        "late": 0,
        "errors": {},
    }
    quantized = harness(
        [
            rec("matmul int8", big, "kaio", 1.0, flops=FLOPS_4096),
            rec("matmul int8", big, "torch._int_mm", 2.0, flops=FLOPS_4096),
        ],
        complete=False,
    )
    smi = {
        "name": "NVIDIA H200",
        "driver_version": "580.159.04",
        "pstate": "P0",
        "clocks.sm": "345",
        "clocks.mem": "3201",
        "clocks.max.sm": "1980",
        "clocks.max.mem": "3201",
        "temperature.gpu": "31",
        "power.draw": "75.51",
        "power.limit": "700.00",
        "memory.total": "143771",
    }

    def suite(title, script, status="ok", data=None, **kw):
        return {"title": title, "script": script, "status": status, "seconds": 10.0, "rc": 0,
                "data": data, **kw}  # fmt: skip

    return {
        "meta": {
            "started": "2026-11-22 10:00 UTC",
            "command": "python -m bench all",
            "seconds": 451.2,
            "software": {"Python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0"},
            "gpu": {"name": "NVIDIA H200", "sms": 132, "l2_mb": 62.9},
            "nvidia_smi": {
                "start": smi,
                "end": {**smi, "clocks.sm": "1980"},
                "cuda_version": "13.0",
            },
            "source": {"commit": "abc1234", "dirty": False, "digest": "000000000000"},
            "host": "16 CPUs",
            "unlisted": ["extra.py"],
            "plots": {"status": "matplotlib is not installed"},
        },
        "suites": {
            "matmul": suite("Tensor-core matmul", "matmul.py", data=matmul),
            "quantized": suite(
                "Quantized matmul",
                "quantized.py",
                "timeout",
                quantized,
                rc=-15,
                log_tail="case 1 done\nstill going",
            ),  # fmt: skip
            "attention": suite("Attention", "attention.py", "missing"),
            "memory": suite("Memory-bound ops", "memory_ops.py", data=memory),
            "extra": suite(
                "An extra suite",
                "extra_suite.py",
                "failed",
                rc=1,
                log_tail="Traceback\nImportError: no llvmlite",
            ),
            "backends-time": suite(
                "Two backends: run time",
                "backends.py",
                data={"rows": [{"op": "add", "ptx_us": 1.0}], "markdown": "| own | table |"},
            ),
            "generic": suite(
                "Some JSON",
                "generic.py",
                data={"meta": {"arch": "sm_90"}, "rows": [{"kernel": "k", "registers": 40}]},
            ),
            "launch": suite("Launch overhead", "launch_overhead.py", data=launch),
            "compile": suite(
                "Compile time",
                "compile_time.py",
                data={
                    "kernel": "kernels40",
                    "first_compile_ms": 22.3,
                    "first_compile_min_ms": 21.9,
                    "first_compile_cpu_ms": 22.1,
                    "first_compile_cpu_min_ms": 21.8,
                    "cached_ptx_call_us": 1.03,
                    "cached_ptx_call_cpu_min_us": 1.02,
                    "ptx_lines": 120,
                    "runs": 5,
                },
            ),  # fmt: skip
            "sim": suite(
                "Simulator speed",
                "sim_speed.py",
                data={
                    "n": 1048576,
                    "results": [
                        {
                            "kernel": "elementwise silu_gate",
                            "thread_instructions": 20000000,
                            "seconds": 0.074,
                            "rate": 2.7e8,
                        }
                    ],
                },
            ),  # fmt: skip
        },
    }


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / RESULTS_FILE).write_text(json.dumps(synthetic_run()))
    return d


def write(run_dir, tmp_path):
    docs = tmp_path / "docs"
    rep = report.write_report(run_dir, docs / "performance.md", docs / "perf")
    return rep, rep.page.read_text()


def section(page: str, title: str) -> str:
    """The text of one ``## title`` section."""
    return page.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def row(text: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell``."""
    line = next(x for x in text.splitlines() if x.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_header_ceilings_and_method(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    _, page = write(run_dir, tmp_path)
    assert page.startswith(report.MARK)
    run = section(page, "The run")
    assert "NVIDIA H200, 132 SMs, 63 MB L2, 143771 MiB" in run
    assert "580.159.04, CUDA 13.0" in run
    assert (
        "SM 345 MHz (max 1980), memory 3201 MHz (max 3201), P0, 31 °C, 75.51 W of 700.00 W" in run
    )
    assert "torch 2.11.0+cu130; triton 3.6.0" in run
    assert "2026-11-22 10:00 UTC, 7 min 31 s in all" in run
    assert "they differ from this page's tree" in run
    ceilings = section(page, "Ceilings")
    assert "| 4000 GB/s |" in ceilings and "4000 (memory), 3900 (memory)" in ceilings
    assert "| 600 TFLOP/s |" in ceilings
    assert "the median of 50 timed calls after 5 + 5 warm-up calls" in page
    assert "{{" not in page


def test_op_tables_ratios_and_shares(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    _, page = write(run_dir, tmp_path)
    mm = section(page, "Tensor-core matmul")
    header = row(mm, "case")
    assert header[2:6] == ["kaio async TFLOP/s", "kaio sync TFLOP/s", "cuBLAS TFLOP/s",
                           "Triton TFLOP/s"]  # fmt: skip
    assert "kaio / cuBLAS sgemm" in header  # the sgemm op joined the f16 matmul as a peer
    big = dict(zip(header, row(mm, "4096x4096x4096"), strict=True))
    assert big["kaio µs"] == "400"
    assert big["kaio async TFLOP/s"] == "344 (57%)"  # 343.6 of the 600 TFLOP/s peak
    assert big["cuBLAS TFLOP/s"] == "687 (115%)"
    assert big["kaio / cuBLAS"] == "0.50x" and big["kaio / Triton"] == "0.62x"
    assert big["kaio / cuBLAS sgemm"] == "6.88x"
    assert big["ceiling"] == "600 (mma.sync f16)"
    dec = dict(zip(header, row(mm, "1x4096x4096"), strict=True))
    assert dec["kaio async TFLOP/s"] == "1.68 (42%)"  # memory roofline: 4000 GB/s x ~1 FLOP/B
    assert dec["ceiling"].startswith("4.00 (copy x 0.999 FLOP/B")
    assert dec["Triton TFLOP/s"].startswith("✗") and dec["kaio / Triton"] == "–"
    assert "- ✗ Triton, 1x4096x4096: rel. error 5.0e-01" in mm
    assert "| sgemm" not in page and "**sgemm" not in page  # no table of its own
    mem = section(page, "Memory-bound ops")
    header = row(mem, "case")
    silu = dict(zip(header, row(mem, "f16 [16384, 8192]"), strict=True))
    assert silu["kaio GB/s"] == "4027 (101%)" and silu["kaio / triton"] == "0.95x"
    assert silu["kaio / torch"] == "1.65x"
    assert "- ✗ torch, f16 [32768, 4096]: RuntimeError: boom" in mem
    summary = section(page, "Summary")
    assert "0.69x cuBLAS (0.50x to 0.95x)" in summary  # geometric mean of 0.5 and 0.95


def test_other_suites_and_statuses(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    _, page = write(run_dir, tmp_path)
    assert "## An extra suite (`bench/extra_suite.py`)" in page  # not in the template
    extra = section(page, "An extra suite")
    assert "**This suite failed** (exit code 1)" in extra
    assert "ImportError: no llvmlite" in extra
    backends = section(page, "Two backends: kaio's PTX emitter")
    assert "| own | table |" in backends and "ptx_us" not in backends  # the suite's own table
    generic = section(page, "Some JSON")
    assert "| meta.arch | sm_90 |" in generic and "| k | 40 |" in generic
    quant = section(page, "Quantized matmul")
    assert "stopped at its time limit" in quant and "still going" in quant
    assert row(quant, "4096x4096x4096")[-1] == "2.00x"
    assert "Not run: `bench/attention.py` does not exist yet." in section(page, "Attention")
    launch = section(page, "Launch overhead")
    assert row(launch, "kaio pre-bound launch(...), DeviceArray")[1:] == ["5.10", "5.20", "2.35x"]
    assert row(launch, "`rms_norm [1, 4096] f16`")[1:] == ["20.0", "F.rms_norm", "10.0", "0.50x"]
    compile_row = row(section(page, "Compile time"), "source to PTX, first call (fresh process)")
    assert compile_row[1:] == ["21.8 ms", "22.1 ms", "21.9 ms", "22.3 ms"]
    assert "| 2.70e+08 |" in section(page, "Simulator speed")


def test_known_gaps_and_not_measured(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    _, page = write(run_dir, tmp_path)
    gaps = section(page, "Known gaps")
    items: dict[str, str] = {}  # op -> its bullets (one per target it misses), joined
    for m in re.finditer(r"- \*\*([^*]+)\*\*: [^\n]*", gaps):
        items[m.group(1)] = items.get(m.group(1), "") + m.group(0)
    assert "4096x4096x4096: kaio async 0.50x cuBLAS" in items["matmul f16"]
    assert "1x4096x4096" not in items["matmul f16"]  # within 1.5x of cuBLAS there
    assert "not slower than Triton" in gaps and "f16 [16384, 8192]: kaio 0.95x triton" in gaps
    assert "rel. error 1.0e-01" in items["softmax"]
    assert "`ex2.approx.ftz`" in gaps  # the hand-written note on gelu tanh
    assert "persistent kernel" not in gaps  # the softmax note explains speed, not errors
    assert "5.10 µs (target at most 5)" in items["kaio pre-bound launch(...), DeviceArray"]
    assert "kaio pre-bound launch(...), torch" not in items  # held only below Triton's 12.0
    assert "not below Triton's 12.0 µs" in items["kaio add[grid, 256](...), CuPy"]
    assert "4096x4096x4096: kaio 2.00x torch._int_mm" in items["matmul int8"]
    assert "stopped at its time limit" in items["Quantized matmul suite"]
    assert "failed" in items["An extra suite suite"]
    assert "compile time" not in items  # 22.3 ms and 1.03 µs are within the targets
    for hand in targets.OPEN_GAPS:
        assert hand in gaps
    missing = section(page, "Not measured in this run")
    assert "Attention (`bench/attention.py`): not written yet." in missing
    assert "`bench/extra.py`: not in the suite table" in missing
    assert (
        "  - flash_attention f16 backward, B4 H16 S4096 D128: at least 50% of SDPA's flash "
        in missing
    )
    assert "at least 60% of cuBLAS" not in missing


def test_plots_from_the_run_are_copied_and_linked(run_dir, tmp_path):
    png = b"\x89PNG\r\n\x1a\n fake"
    with tarfile.open(run_dir / "plots.tar", "w") as tf:
        for name in ("matmul-matmul.png", "../memory-elementwise.png", "launch-overhead.png"):
            info = tarfile.TarInfo(name)
            info.size = len(png)
            tf.addfile(info, io.BytesIO(png))
    stale = tmp_path / "docs" / "perf" / "old.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(png)
    rep, page = write(run_dir, tmp_path)
    perf = tmp_path / "docs" / "perf"
    assert sorted(p.name for p in perf.iterdir()) == [
        "launch-overhead.png",
        "matmul-matmul.png",
        "memory-elementwise.png",
    ]
    assert (perf / "matmul-matmul.png").read_bytes() == png
    assert rep.plots == sorted(perf.iterdir())
    assert "![matmul: kaio and peers](perf/matmul-matmul.png)" in page
    assert "![elementwise: kaio and peers](perf/memory-elementwise.png)" in page
    assert "(perf/launch-overhead.png)" in page
    assert "perf/memory-row-ops.png" not in page  # not in the run's plots: not linked
    assert "3 PNGs drawn by the run" in page


def test_without_matplotlib_the_page_says_so(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    rep, page = write(run_dir, tmp_path)
    assert rep.plots == [] and list((tmp_path / "docs" / "perf").iterdir()) == []
    assert "matplotlib is not installed where the report ran" in section(page, "The run")
    # no plot of the run is linked; the figures of the hand-written notes live in perf/notes/
    assert not re.search(r"\]\(perf/[\w.-]+\.png\)", page)


def test_with_matplotlib_the_report_draws_the_plots(run_dir, tmp_path):
    pytest.importorskip("matplotlib")
    rep, page = write(run_dir, tmp_path)
    names = {p.name for p in rep.plots}
    assert {"matmul-matmul.png", "memory-elementwise.png", "launch-overhead.png"} <= names
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in rep.plots)


def test_hand_written_page_is_flagged(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    page = tmp_path / "docs" / "performance.md"
    page.parent.mkdir()
    page.write_text("# Performance\n\nwritten by hand\n")
    rep = report.write_report(run_dir, page, tmp_path / "docs" / "perf")
    assert rep.warnings and "hand-written" in rep.warnings[0]
    assert report.write_report(run_dir, page, tmp_path / "docs" / "perf").warnings == []


def test_unknown_placeholder_is_an_error(run_dir):
    with pytest.raises(ValueError, match="nope"):
        report.render(Run.load(run_dir), "{{nope}}", set(), "", "perf")


def test_targets_are_valid_patterns():
    for t in targets.TARGETS:
        for pattern in (t.op, t.case, t.suite, t.peer, t.kaio):
            re.compile(pattern)
        assert t.min_ratio is not None or t.min_share is not None
    for n in targets.NOTES:
        re.compile(n.op), re.compile(n.case)


def test_timing_in_rounds_is_described():
    """Runs that record rounds say so; older runs (no rounds) keep their sentence."""
    assert report._settings(50, 5, None) == "the median of 50 timed calls after 5 + 5 warm-up calls"
    rounds = report._settings(50, 5, 5)
    assert "50 timed calls in 5 rounds" in rounds and "5 + 5 in the first" in rounds


def test_gemm_sweep_heat_map_is_linked(tmp_path):
    """bench/gemm_sweep.py's heat map (drawn by the run) is linked under its op's table."""
    sweep = harness(
        [
            rec("gemm sweep f16", f"M={m} 4096x4096", impl, ms, flops=2.0 * m * 4096 * 4096)
            for m in (1, 16)
            for impl, ms in (("kaio", 0.012), ("cuBLAS", 0.010))
        ]
    )
    data = synthetic_run()
    data["suites"]["gemm-sweep"] = {
        "title": "LLM GEMM shape sweep",
        "script": "gemm_sweep.py",
        "status": "ok",
        "seconds": 30.0,
        "rc": 0,
        "data": sweep,
    }
    d = tmp_path / "run"
    d.mkdir()
    (d / RESULTS_FILE).write_text(json.dumps(data))
    png = b"\x89PNG\r\n\x1a\n fake"
    name = f"{plots.slug('gemm sweep f16')}-heatmap.png"
    with tarfile.open(d / "plots.tar", "w") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(png)
        tf.addfile(info, io.BytesIO(png))
    _, page = write(d, tmp_path)
    assert f"(perf/{name})" in page
    assert page.index("**gemm sweep f16**") < page.index(f"(perf/{name})")


def test_decode_targets_read_the_kernel_time():
    """bench/decode.py records kernel time under the op's name alone and one call a graph
    under ", one call a graph": issue 34's targets read only the first."""
    decode = [t for t in targets.TARGETS if t.source == "issue 34"]
    assert len(decode) == 3
    for t in decode:
        for layout in ("", " paged"):
            assert re.search(t.op, f"flash_attention_decode f16{layout}")
            assert not re.search(t.op, f"flash_attention_decode f16{layout}, one call a graph")


def two_card_run(second_card: str) -> dict:
    """The synthetic run as ``bench all --gpus 0,1`` records it, the second card named
    ``second_card``."""
    data = synthetic_run()
    meta = data["meta"]
    smi = meta["nvidia_smi"]["start"]
    meta["gpus"], meta["budget_s"] = ["0", "1"], 580.0
    meta["cards"] = {
        "0": {"device": "4", "start": smi, "end": {**smi, "clocks.sm": "1980"}},
        "1": {"device": "5", "start": {**smi, "name": second_card, "clocks.sm": "1755"},
              "end": {**smi, "name": second_card}},
    }  # fmt: skip
    names = {"0": smi["name"], "1": second_card}
    for k, (name, s) in enumerate(data["suites"].items()):
        if s["status"] != "missing":
            s["gpu"] = "1" if name == "quantized" else str(k % 2)
            s["card"] = names[s["gpu"]]
    return data


def render_run(data: dict, tmp_path) -> str:
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    (d / RESULTS_FILE).write_text(json.dumps(data))
    return write(d, tmp_path)[1]


def test_a_run_over_two_cards_names_each_suites_card(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    page = render_run(two_card_run("NVIDIA H200"), tmp_path)
    run = section(page, "The run")
    assert "| **GPU** | NVIDIA H200, 132 SMs, 63 MB L2, 143771 MiB; the suites spread over gpus " \
        "0, 1 |" in run  # fmt: skip
    clocks = row(run, "**clocks at start**")[1]
    assert clocks.startswith("gpu 0: SM 345 MHz (max 1980)") and "<br>gpu 1: SM 1755 MHz" in clocks
    suites = row(run, "**suites**")[1]
    assert "quantized timeout 10 s on gpu 1;" in suites and "attention missing 10 s;" in suites
    assert "NVIDIA H200" not in suites  # the same card twice: named once, above
    processes = page.split("- **Processes.** ", 1)[1].split("\n", 1)[0]
    assert processes.startswith("The suites ran spread over 2 cards of one host (`--gpus 0,1`)")
    assert "in order of importance within 580 s of the start" in processes


def test_cards_that_differ_are_named_per_suite(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    page = render_run(two_card_run("NVIDIA H100 80GB HBM3"), tmp_path)
    run = section(page, "The run")
    assert row(run, "**GPU**")[1] == "gpu 0: NVIDIA H200; gpu 1: NVIDIA H100 80GB HBM3"
    suites = row(run, "**suites**")[1]
    assert "quantized timeout 10 s on gpu 1 (NVIDIA H100 80GB HBM3)" in suites
    assert "matmul ok 10 s on gpu 0 (NVIDIA H200)" in suites


def test_a_one_card_run_names_no_cards(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    _, page = write(run_dir, tmp_path)
    run = section(page, "The run")
    assert " on gpu " not in run and "<br>" not in run
    assert "- **Processes.** Each suite runs in its own process, one after the other, on one " \
        "card;" in page  # fmt: skip


def compile_times(cpu_min: float, cpu: float, wall: float) -> dict:
    return {"first_compile_cpu_min_ms": cpu_min, "first_compile_cpu_ms": cpu,
            "first_compile_ms": wall}  # fmt: skip


@pytest.mark.parametrize(
    "figures, gap, note",
    [
        (compile_times(31.0, 32.0, 64.5), None, "wall time was 2.0x its CPU time"),
        (compile_times(40.0, 60.0, 60.0), None, "CPU time was 1.5x the fastest process's"),
        (compile_times(52.5, 53.0, 58.0), "first_compile_cpu_min_ms 52.5", "Targets"),
        ({"first_compile_ms": 70.5}, "first_compile_ms 70.5", "the median wall time only"),
    ],
    ids=["waiting", "slowed processes", "slower compiler", "wall time only"],
)
def test_compile_targets_read_the_fastest_cpu_time(tmp_path, monkeypatch, figures, gap, note):
    """A busy host (wall time above CPU time, or processes at different speeds) is no gap; a
    slower compile is, in the fastest process's CPU time; a run that recorded the median wall
    time only is read on it."""
    monkeypatch.setattr(plots, "available", lambda: False)
    data = synthetic_run()
    data["suites"]["compile"]["data"] = {"cached_ptx_call_us": 1.0, "runs": 7, **figures}
    page = render_run(data, tmp_path)
    gaps = section(page, "Known gaps")
    if gap is None:
        assert "**compile time**" not in gaps
    else:
        assert f"Measured: {gap} ms (target below 50 ms)" in gaps
    assert note in section(page, "Compile time")
