"""``python -m bench all --out DIR [--quick]``: every benchmark suite, one process each, then
DIR/results.json (everything), DIR/log.txt (all output) and DIR/plots.tar (the PNGs, where
matplotlib is installed): three files, whatever the number of suites or plots.

A suite is a script in bench/ that takes ``--out FILE`` and writes its results as JSON there.
Adding one is a line in ``SUITES``, with the arguments that keep ``--quick`` short. Op
benchmarks use bench/harness.py (correctness first, then timing; it writes the JSON after every
case): the report then makes their tables, plots and known gaps by itself, taking every
implementation with "kaio" in its name as kaio's and every other as a peer; any other JSON is
shown as a plain table. A suite whose script does not exist yet is recorded as missing; one
that crashes or overruns its time is recorded with the end of its output and whatever JSON it
wrote, and the run goes on.

Time: the suites share a budget (``--budget``; by default 580 s, 240 s with ``--quick``, so
that the whole run, plots included, stays within 10.5 and 5 minutes). Suites run in the
table's order of importance; each may use its expected time (``Suite.expect``), and more where
the expected times of the suites after it leave room; a suite left with less than
``MIN_START_S`` is not started ("no time").

Cards: by default every suite runs on the one GPU this process sees. ``--gpus 0,1,2,3`` spreads
the suites over those cards (indexes among the cards this process sees; the same index twice
runs two suites at a time on one card): ``assign`` puts the longest expected suite first onto
the least loaded card, each card runs its suites one after the other in the table's order, one
process each with CUDA_VISIBLE_DEVICES set to its card, and the cards run side by side, each
with the whole budget. The suites that time the host (``Suite.alone``: launch, compile) run
first, on the first card, before the others start. results.json records the card each suite
ran on and the cards' names.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.perfdata import PLOTS_TAR, RESULTS_FILE, Run

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LOG_FILE = "log.txt"
BUDGET_S = {False: 580.0, True: 240.0}  # the suites' share of ~10.5 and ~5 minutes
KILL_GRACE_S = 5.0
TAIL_CHARS = 4000  # of a suite's output kept in results.json
# bench/ files that are not suites
HELPERS = {
    "__init__.py",
    "__main__.py",
    "harness.py",
    "mma_peak.py",
    "kernels40.py",
    "perfdata.py",
    "plots.py",
    "report.py",
    "sass_loop.py",  # SASS instructions per main-loop iteration (no GPU): a compiler tool
    "suites.py",
    "targets.py",
    "torch_matmul_grad.py",  # the precision study behind docs/torch.md's matmul backward
}


@dataclass(frozen=True)
class Suite:
    """A benchmark script in bench/ and how to run it."""

    name: str
    script: str  # relative to bench/ (or absolute)
    title: str
    full: tuple[str, ...] = ()  # extra arguments of a full run
    quick: tuple[str, ...] | None = ()  # extra arguments with --quick; None: not in a quick run
    expect: tuple[float, float] = (60.0, 30.0)  # seconds it usually needs (full, quick)
    alone: bool = False  # times the host: with several cards, run before the others start

    @property
    def path(self) -> Path:
        """The script."""
        return BENCH / self.script

    def args(self, quick: bool) -> list[str]:
        """The extra arguments for this run."""
        return list((self.quick or ()) if quick else self.full)


# In order of importance: when the budget runs short, the last suites get what is left.
# Expected seconds (full, quick): about 1.25x what each took in the final check's run of
# 2026-11-28 (one H100 beside three cards of GPU tests on the same host: matmul 63, memory 32,
# attention 20, varlen 34, decode 115, quantized 10, fp8 30, launch 86, compile 4 (5 fresh
# processes; now 15), sim 6, gguf 40, backends-time 11 s; backends ran out of time at 51 s with
# 82% of its output written, about 62 s; gemm-sweep 8-11 and fastmath 5-7 s on 2026-11-27's
# runs).
SUITES: tuple[Suite, ...] = (
    Suite("matmul", "matmul.py", "Tensor-core matmul", (), ("--sizes", "1024,4096"), (80, 60)),
    Suite("memory", "memory_ops.py", "Memory-bound ops", (), ("--dtypes", "f16"), (45, 45)),
    Suite("attention", "attention.py", "Attention", (), ("--only", "flash_attention"), (30, 30)),
    # not in a quick run of all suites (its budget is spent); alone: --quick
    Suite("varlen", "attention_varlen.py", "Variable-length attention", (), None, (45, 0)),
    # not in a quick run of all suites (its budget is spent); alone: bench/decode.py --quick
    Suite("decode", "decode.py", "Decode attention", (), None, (150, 0)),
    Suite("quantized", "quantized.py", "Quantized matmul", (), ("--quick",), (20, 15)),
    Suite("fp8", "fp8.py", "FP8 matmul", (), None, (40, 0)),  # quick: bench/fp8.py --quick
    Suite("launch", "launch_overhead.py", "Launch overhead", (), ("--skip-cold",), (110, 25), True),
    Suite("compile", "compile_time.py", "Compile time", (), ("--runs", "9"), (20, 10), True),
    Suite("sim", "sim_speed.py", "Simulator speed", (), ("--n", str(1 << 18)), (15, 10)),
    Suite("gguf", "gguf.py", "GGUF quantizers", (), None, (55, 0)),
    Suite(
        "backends-time",
        "backends.py",
        "Two backends: run time",
        ("--time", "--quick"),
        None,
        (20, 0),
    ),
    Suite("backends", "backends.py", "Two backends: registers and spills", (), None, (90, 0)),
    # the full sweep takes ~15 minutes: run bench/gemm_sweep.py on its own for all of it
    Suite("gemm-sweep", "gemm_sweep.py", "LLM GEMM shape sweep", ("--quick",), None, (20, 0)),
    Suite("fastmath", "fastmath.py", "Fast math: the silu*gate user kernel", (), None, (15, 0)),
)
MIN_START_S = 10.0  # a suite is not started with less time than this left


def timeout_for(remaining: float, expect: float, later: list[float]) -> float:
    """Seconds a suite may run: its expected time, and more where the later suites' expected
    times leave room; never more than what is left."""
    return max(0.0, min(remaining, max(expect, remaining - sum(later))))


def assign(expected: list[float], cards: int) -> list[list[int]]:
    """Which suites each card runs: the longest expected first onto the least loaded card (the
    lower card on a tie); each card's suites in their order in ``expected`` (the table's order
    of importance, so that a card's budget runs short on its least important suites)."""
    loads, picked = [0.0] * cards, [[] for _ in range(cards)]
    for i in sorted(range(len(expected)), key=lambda i: -expected[i]):  # a stable sort
        card = min(range(cards), key=lambda c: loads[c])
        loads[card] += expected[i]
        picked[card].append(i)
    return [sorted(p) for p in picked]


def cuda_device(gpu: str, visible: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES value for card ``gpu`` (an index among the cards this process
    sees, as ``visible``, this process's CUDA_VISIBLE_DEVICES, lists them)."""
    if not gpu.isdigit():
        raise ValueError(f"a card is an index: {gpu!r}")
    if not visible:
        return gpu
    seen = [d.strip() for d in visible.split(",") if d.strip()]
    if int(gpu) >= len(seen):
        raise ValueError(f"no card {gpu}: this process sees {len(seen)} ({visible})")
    return seen[int(gpu)]


class Log:
    """Prints progress and keeps every line in DIR/log.txt."""

    def __init__(self, path: Path, echo: bool = True):
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115  (closed by close())
        self.echo = echo
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, line: str, console: bool = True) -> None:
        """Log a line; print it too unless ``console`` is False."""
        with self.lock:
            self.file.write(line + "\n")
            self.file.flush()
            if self.echo and console:
                print(line, flush=True)

    def clock(self) -> str:
        """Time since the run started, m:ss."""
        s = int(time.monotonic() - self.start)
        return f"{s // 60}:{s % 60:02d}"

    def close(self) -> None:
        """Close the log file."""
        self.file.close()


def run_suite(
    suite: Suite, out_json: Path, quick: bool, timeout: float, log: Log, device: str | None = None
) -> dict:
    """Run one suite in its own process group (on card ``device``, a CUDA_VISIBLE_DEVICES
    value; None: the cards this process sees); stream its output; stop it at ``timeout``."""
    cmd = [sys.executable, str(suite.path), "--out", str(out_json), *suite.args(quick)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    lines: list[str] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: stopped whole, children included
    )

    def pump() -> None:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            # the harness's final table goes to the log only; progress lines to the console
            log(f"  {suite.name} {log.clock()} | {line}", console=not line.startswith("|"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        status = "timeout"
        _stop(proc)
    reader.join(timeout=10)
    seconds = time.monotonic() - t0
    data = None
    if out_json.is_file():
        try:
            data = json.loads(out_json.read_text())
        except ValueError as e:
            lines.append(f"[bench] unreadable JSON from the suite: {e}")
    if status is None:
        status = "failed" if proc.returncode != 0 else ("ok" if data is not None else "no data")
    return {
        "title": suite.title,
        "script": suite.script,
        "status": status,
        "rc": proc.returncode,
        "seconds": round(seconds, 1),
        "timeout_s": round(timeout, 1),
        "args": suite.args(quick),
        "log_tail": "\n".join(lines)[-TAIL_CHARS:],
        "data": data,
    }


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the suite's process group, SIGKILL it if still there after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------------------- environment
SMI_FIELDS = (
    "name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
    "temperature.gpu,power.draw,power.limit,memory.total"
)
SMI_FIELDS_MINIMAL = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem"

_PROBE = r"""
import json, sys
out = {}
def version(name, attr="__version__"):
    try:
        mod = __import__(name)
        for part in name.split(".")[1:]:
            mod = getattr(mod, part)
        out[name] = str(getattr(mod, attr))
    except Exception:
        pass
for name in ("kaio", "torch", "triton", "numpy", "cupy"):
    version(name)
try:
    from importlib.metadata import version as dist_version
    out["cuda-bindings"] = dist_version("cuda-bindings")
except Exception:
    pass
gpu = {}
try:
    import torch
    out["torch CUDA"] = torch.version.cuda
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "sms": p.multi_processor_count,
               "memory_mib": p.total_memory // 2**20,
               "l2_mb": getattr(p, "L2_cache_size", 0) / 1e6 or None}
except Exception:
    pass
print(json.dumps({"software": out, "gpu": gpu}))
"""


def _run(cmd: list[str], timeout: float = 60, env: dict | None = None) -> str | None:
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def nvidia_smi(device: str | None = None) -> dict | None:
    """The name, driver, clocks, temperature and power now (nvidia-smi) of card ``device`` (an
    index or UUID, as CUDA_VISIBLE_DEVICES names it; None: the first card), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    card = ["-i", device] if device is not None else []
    for fields in (SMI_FIELDS, SMI_FIELDS_MINIMAL):  # a field this driver lacks fails them all
        text = _run(["nvidia-smi", *card, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
        if text and text.strip():
            values = [v.strip() for v in text.splitlines()[0].split(",")]
            return dict(zip(fields.split(","), values, strict=False))
    return None


def environment(device: str | None = None, smi_id: str | None = None) -> dict:
    """What the page's header needs: versions, GPU (card ``device`` as ``run_suite`` takes it,
    ``smi_id`` as ``nvidia_smi`` does), CUDA version, sources."""
    from bench.report import source_digest

    env: dict = {"software": {"Python": platform.python_version()}, "gpu": {}}
    probe_env = None if device is None else dict(os.environ, CUDA_VISIBLE_DEVICES=device)
    probe = _run([sys.executable, "-c", _PROBE], timeout=120, env=probe_env)
    if probe:
        try:
            found = json.loads(probe.strip().splitlines()[-1])
            env["software"].update(found["software"])
            env["gpu"] = found["gpu"]
        except (ValueError, KeyError, IndexError):
            pass
    smi = _run(["nvidia-smi"]) if shutil.which("nvidia-smi") else None
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi or "")
    env["nvidia_smi"] = {
        "start": nvidia_smi(smi_id),
        "cuda_version": cuda.group(1) if cuda else None,
    }
    commit = _run(["git", "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    env["source"] = {
        "commit": commit.strip() if commit else None,
        "dirty": bool(dirty and dirty.strip()),
        "digest": source_digest(),
    }
    env["host"] = f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    return env


def unlisted_scripts(suites: tuple[Suite, ...]) -> list[str]:
    """bench/*.py files that are neither helpers nor in the suite table."""
    listed = {s.path.name for s in suites}
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS | listed)


# ---------------------------------------------------------------------------- the run
def pack_plots(results: Path, out: Path, log: Log) -> dict:
    """Draw the plots of the run in ``results`` into a temporary folder and pack them as
    DIR/plots.tar."""
    from bench import plots

    if not plots.available():
        return {"status": "matplotlib is not installed on the machine that ran the benchmarks"}
    with tempfile.TemporaryDirectory(prefix="kaio-plots-") as tmp:
        try:
            names, errors = plots.write_plots(Run.load(results), tmp)
        except Exception as e:  # noqa: BLE001  (plots must not lose the results)
            return {"status": f"failed: {type(e).__name__}: {e}"}
        for e in errors:
            log(f"[bench] plot failed: {e}")
        if names:
            with tarfile.open(out / PLOTS_TAR, "w") as tf:
                for n in names:
                    tf.add(Path(tmp) / n, arcname=n)
    return {"status": "ok" if not errors else "some failed", "files": names, "errors": errors}


@dataclass
class Card:
    """A card the suites run on: as ``--gpus`` names it (None: the default, the cards this
    process sees), its CUDA_VISIBLE_DEVICES value, and nvidia-smi's view of it."""

    gpu: str | None = None
    device: str | None = None
    start: dict | None = None
    end: dict | None = None

    @property
    def smi_id(self) -> str | None:
        """The card as nvidia-smi names it (the default: the first card this process sees)."""
        if self.device is not None:
            return self.device
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        return visible or None

    @property
    def name(self) -> str | None:
        """The card's name (nvidia-smi at the start), if read."""
        return (self.start or {}).get("name")

    def record(self) -> dict:
        """What a suite's result records of its card (nothing for the default)."""
        return {} if self.gpu is None else {"gpu": self.gpu, "card": self.name}


def cards_for(gpus: list[str] | None) -> list[Card]:
    """The cards of ``--gpus`` (one per entry, so a card named twice runs two suites at a
    time); without it one card, the default."""
    if not gpus:
        return [Card()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [Card(g, cuda_device(g, visible)) for g in gpus]


def _not_run(suite: Suite, status: str, **extra) -> dict:
    return {"title": suite.title, "script": suite.script, "status": status, **extra}


def run_card(
    todo: list[Suite], card: Card, deadline: float, quick: bool, tmp: Path, log: Log
) -> dict[str, dict]:
    """Run ``todo`` one after the other on ``card`` until ``deadline``: each suite may use its
    expected time, and more where the later suites' expected times leave room."""
    results = {}
    on = f" on gpu {card.gpu}" if card.gpu is not None else ""
    for k, s in enumerate(todo):
        step = f"[{k + 1}/{len(todo)}] {s.name}{on}"
        later = [x.expect[quick] for x in todo[k + 1 :]]
        limit = timeout_for(deadline - time.monotonic(), s.expect[quick], later)
        if limit < MIN_START_S:
            results[s.name] = _not_run(s, "no time", **card.record())
            log(f"[bench] {log.clock()} {step}: no time left")
            continue
        log(f"[bench] {log.clock()} {step}: bench/{s.script} {' '.join(s.args(quick))} "
            f"(limit {limit:.0f} s)")  # fmt: skip
        try:
            res = run_suite(s, tmp / f"{s.name}.json", quick, limit, log, card.device)
        except Exception as e:  # noqa: BLE001  (a suite that cannot start is recorded)
            res = _not_run(s, "failed", log_tail=f"{type(e).__name__}: {e}", data=None)
        results[s.name] = {**res, **card.record()}
        log(f"[bench] {log.clock()} {step}: {res['status']} in {res.get('seconds', 0):.0f} s, "
            f"{_count(res)} results")  # fmt: skip
    return results


def run_all(
    out: str | Path,
    quick: bool = False,
    only: list[str] | None = None,
    budget: float | None = None,
    suites: tuple[Suite, ...] = SUITES,
    echo: bool = True,
    probe: bool = True,
    command: str | None = None,
    gpus: list[str] | None = None,
) -> Path:
    """Run the suites (those named in ``only``, else all; spread over the cards of ``gpus``,
    else on the one card this process sees) and write DIR/results.json, DIR/log.txt and
    DIR/plots.tar. Returns the path of results.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / PLOTS_TAR).unlink(missing_ok=True)
    log = Log(out / LOG_FILE, echo)
    budget = BUDGET_S[quick] if budget is None else budget
    cards = cards_for(gpus)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    mode = "quick" if quick else "full"
    where = f", on gpus {','.join(gpus)}" if gpus else ""
    log(f"[bench] {mode} run, suites' budget {budget:.0f} s{where}, results in {out}")
    meta = {
        "started": started,
        "command": command or "python -m bench all" + (" --quick" if quick else ""),
        "quick": quick,
        "budget_s": budget,
        "unlisted": unlisted_scripts(suites),
    }
    if probe:
        try:
            meta.update(environment(cards[0].device, cards[0].smi_id))
        except Exception as e:  # noqa: BLE001  (the header may lack a line; the run goes on)
            meta["environment_error"] = f"{type(e).__name__}: {e}"
        log(f"[bench] {log.clock()} environment: {json.dumps(meta.get('software'))}")
        log(f"[bench] nvidia-smi at start: {meta.get('nvidia_smi', {}).get('start')}")
        for c in cards:
            c.start = nvidia_smi(c.smi_id)
    deadline = time.monotonic() + budget  # for the suites: the probe above is not counted
    chosen = [s for s in suites if (only is None or s.name in only)]
    chosen = [s for s in chosen if not (quick and s.quick is None)]
    present = [s for s in chosen if s.path.is_file()]
    results: dict[str, dict] = {}
    for s in suites:
        if s not in chosen:
            why = "not in a quick run" if quick and s.quick is None else "not selected"
            results[s.name] = _not_run(s, "skipped", why=why)
        elif s not in present:
            results[s.name] = _not_run(s, "missing")
    # host-timing suites first, on the first card while the others are idle: the other cards'
    # suites load the host (the launch rows of 2026-11-28's four-card run: 5.54 µs against 4.67)
    first = [s for s in present if s.alone and len(cards) > 1]
    rest = [s for s in present if s not in first]
    plan = assign([s.expect[quick] for s in rest], len(cards))
    with (
        tempfile.TemporaryDirectory(prefix="kaio-bench-") as tmp,
        ThreadPoolExecutor(len(cards)) as pool,
    ):
        results.update(run_card(first, cards[0], deadline, quick, Path(tmp), log))
        runs = [
            pool.submit(run_card, [rest[i] for i in picked], card, deadline, quick,
                        Path(tmp), log)
            for picked, card in zip(plan, cards, strict=True)
        ]  # fmt: skip
        for r in runs:
            results.update(r.result())
    ordered = {s.name: results[s.name] for s in suites}
    meta["seconds"] = round(time.monotonic() - log.start, 1)
    if probe:
        for c in cards:
            c.end = nvidia_smi(c.smi_id)
        meta.setdefault("nvidia_smi", {})["end"] = cards[0].end
    if gpus:
        meta["gpus"] = gpus
        meta["cards"] = {c.gpu: {"device": c.device, "start": c.start, "end": c.end} for c in cards}
    path = out / RESULTS_FILE
    path.write_text(json.dumps({"meta": meta, "suites": ordered}, indent=1))
    meta["plots"] = pack_plots(path, out, log)
    meta["seconds"] = round(time.monotonic() - log.start, 1)
    path.write_text(json.dumps({"meta": meta, "suites": ordered}, indent=1))
    summary(ordered, meta, out, log)
    log.close()
    return path


def _count(suite: dict) -> int:
    """How many records a suite's JSON holds (its "results" list; 0 for other shapes)."""
    data = suite.get("data")
    res = data.get("results") if isinstance(data, dict) else None
    return len(res) if isinstance(res, list) else 0


def summary(results: dict[str, dict], meta: dict, out: Path, log: Log) -> None:
    """The last lines printed: each suite's status, and the files written."""
    log("\n[bench] suite          status    seconds  results  gpu")
    for name, r in results.items():
        n = _count(r)
        secs = f"{r['seconds']:.0f}" if r.get("seconds") is not None else "-"
        log(f"[bench] {name:<14} {r['status']:<9} {secs:>7}  {n:>7}  {r.get('gpu', '-')}")
    files = sorted(p.name for p in out.iterdir() if p.name in (RESULTS_FILE, LOG_FILE, PLOTS_TAR))
    log(
        f"[bench] plots: {meta['plots'].get('status')}; {meta['seconds']:.0f} s in all; "
        f"wrote {', '.join(files)} in {out}"
    )
    log(f"[bench] next: python -m bench report {out}")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench all --out DIR [--quick] [--suites a,b] [--budget S] [--gpus 0,1]``."""
    p = argparse.ArgumentParser(prog="python -m bench all", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for results.json, log.txt, plots.tar")
    p.add_argument("--quick", action="store_true", help="a subset, within about 5 minutes")
    p.add_argument(
        "--suites",
        help="comma-separated suite names (default: all): " + ",".join(s.name for s in SUITES),
    )
    p.add_argument("--budget", type=float, help="seconds for all suites together (on each card)")
    p.add_argument(
        "--gpus",
        help="comma-separated cards to spread the suites over, as indexes among the cards this "
        "process sees, e.g. 0,1,2,3 (default: one card, the first it sees)",
    )
    args = p.parse_args(argv)
    only = args.suites.split(",") if args.suites else None
    unknown = set(only or ()) - {s.name for s in SUITES}
    if unknown:
        p.error(f"unknown suites: {', '.join(sorted(unknown))}")
    gpus = [g.strip() for g in args.gpus.split(",")] if args.gpus else None
    try:
        for g in gpus or ():
            cuda_device(g, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except ValueError as e:
        p.error(f"--gpus: {e}")
    shown = list(sys.argv[2:] if argv is None else argv)
    if "--out" in shown:  # the page names the command, not the folder it wrote to
        del shown[shown.index("--out") : shown.index("--out") + 2]
    shown = [a for a in shown if not a.startswith("--out=")]
    command = " ".join(["python -m bench all", *shown])
    run_all(args.out, args.quick, only, args.budget, command=command, gpus=gpus)
    return 0
