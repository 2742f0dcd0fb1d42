"""A benchmark harness for kaio_ops and its peers (torch, Triton, cuBLAS...), shared by every
op benchmark in bench/.

Per case: every implementation is first checked against a reference (relative error
||out - ref|| / ||ref||, NaN never passes); then each is timed with CUDA events
(torch.cuda.Event) around every call, after warm-up, and the median is kept. The timed calls
come in ROUNDS rounds that take the implementations in turn, so that a change of the GPU's
state during a case (an H100 reaches its power cap within about 0.1 s of 8192^3 matmuls and
lowers its clock by up to 30%) falls on every implementation alike. Before the timed
calls are enqueued the GPU is kept busy with a spin (torch.cuda._sleep) long enough for the
host to queue them all, so host overhead (argument checks, launches) never shows as GPU
idle time between the events. When one input set is smaller than a few times the L2 cache,
several sets are made and the calls rotate over them, so data is not timed warm in L2.
Peers run in the same process, on the same inputs, one after the other.

Results: a table printed at the end (time, GB/s, TFLOP/s, % of the device-to-device copy
bandwidth measured in the same run, ratio to a named baseline) and a JSON file (--out).

    from bench.harness import Harness
    h = Harness.from_args("memory ops")
    h.copy_bandwidth()
    h.case("silu_gate", "f16 [8192, 8192]", make_inputs, {"kaio": f, "torch": g},
           reference=ref, nbytes=3 * x.nbytes)
    h.finish()
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

L2_BYTES = 50 * 2**20  # H100: 50 MB, H200: 60 MB
ROUNDS = 5  # rounds of timed calls per case, the implementations in turn
SPIN_CYCLES_PER_S = 2.0e9  # above any H100/H200 SM clock, so a spin lasts at least as asked


@dataclass
class Result:
    """One implementation of one case."""

    op: str
    case: str
    impl: str
    ok: bool
    error: float | None  # relative error against the reference
    ms: float | None = None  # median time of one call
    ms_min: float | None = None
    ms_max: float | None = None
    gbps: float | None = None  # bytes moved / time, 1e9 bytes per second
    tflops: float | None = None
    pct_copy: float | None = None  # gbps / the run's copy bandwidth
    vs_baseline: float | None = None  # baseline time / this time (> 1: faster)
    note: str = ""


def _rel_error(out, ref) -> float:
    if isinstance(ref, tuple | list):
        return max(_rel_error(o, r) for o, r in zip(out, ref, strict=True))
    out64, ref64 = torch.as_tensor(out).double(), ref.double()
    if out64.shape != ref64.shape or not torch.isfinite(out64).all():
        return math.inf
    return (torch.linalg.norm(out64 - ref64) / torch.linalg.norm(ref64).clamp_min(1e-30)).item()


@dataclass
class Harness:
    """Runs cases, collects ``Result``s, prints the table and writes the JSON."""

    title: str
    reps: int = 50
    warmup: int = 5
    out: str | None = None
    results: list[Result] = field(default_factory=list)
    copy_gbps: float | None = None
    meta: dict = field(default_factory=dict)
    only: str = ""  # run only the ops whose name contains this

    @classmethod
    def from_args(cls, title: str, argv: list[str] | None = None, **defaults) -> Harness:
        """A harness configured from the command line (--out, --reps, --warmup)."""
        p = argparse.ArgumentParser(description=title)
        p.add_argument("--out", help="write the results as JSON to this path")
        p.add_argument("--reps", type=int, default=defaults.get("reps", 50))
        p.add_argument("--warmup", type=int, default=defaults.get("warmup", 5))
        p.add_argument("--only", default="", help="run only the ops whose name contains this")
        args, _ = p.parse_known_args(argv)
        h = cls(title, reps=args.reps, warmup=args.warmup, out=args.out, only=args.only)
        props = torch.cuda.get_device_properties(0)
        h.meta = {
            "title": title,
            "gpu": props.name,
            "sms": props.multi_processor_count,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d"),
            "reps": h.reps,
            "warmup": h.warmup,
            "rounds": ROUNDS,
        }
        try:
            import triton

            h.meta["triton"] = triton.__version__
        except ImportError:
            pass
        return h

    # ------------------------------------------------------------------ timing
    def sets_for(self, nbytes: int) -> int:
        """How many input sets to rotate over so the working set is ~3x the L2 cache."""
        return max(1, min(16, math.ceil(3 * L2_BYTES / max(nbytes, 1))))

    def time(
        self,
        fn: Callable,
        input_sets: list,
        batch: int = 1,
        reps: int | None = None,
        warmup: int | None = None,
    ) -> list[float]:
        """Milliseconds of each of ``reps`` (default: the harness's) calls
        ``fn(*input_sets[i % len])``, CUDA events, after ``warmup`` (default: the harness's)
        calls twice.
        With ``batch`` > 1, each time is one pair of events around ``batch`` calls in a row,
        divided by ``batch`` (``reps // batch`` such times): what a call costs when calls
        follow each other on the GPU (a CUDA graph, a decode loop), without the gap each pair
        of events adds around a single call."""
        k = len(input_sets)
        warmup = warmup or self.warmup
        for i in range(warmup):
            fn(*input_sets[i % k])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(warmup):
            fn(*input_sets[i % k])
        host = (time.perf_counter() - t0) / warmup  # an upper bound on enqueue time
        torch.cuda.synchronize()
        times = max(1, (reps or self.reps) // batch)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(times)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(times)]
        spin = min(2.0, 1.5 * host * times * batch + 1e-3)
        torch.cuda._sleep(int(spin * SPIN_CYCLES_PER_S))
        for i in range(times):
            starts[i].record()
            for j in range(batch):
                fn(*input_sets[(i * batch + j) % k])
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / batch for s, e in zip(starts, ends, strict=True)]

    # ------------------------------------------------------------------ cases
    def copy_bandwidth(self, nbytes: int = 1 << 30) -> float:
        """Device-to-device copy bandwidth (bytes read + written per second) with torch
        ``copy_`` of ``nbytes``; recorded as the op "copy" and used for % of copy."""
        src = torch.randn(nbytes // 4, device="cuda")
        dst = torch.empty_like(src)
        ms = statistics.median(self.time(lambda a, b: b.copy_(a), [(src, dst)]))
        self.copy_gbps = 2 * nbytes / ms / 1e6
        self.results.append(
            Result("copy", f"{nbytes >> 20} MiB", "torch copy_", True, 0.0, ms, gbps=self.copy_gbps)
        )
        del src, dst
        torch.cuda.empty_cache()
        return self.copy_gbps

    def case(
        self,
        op: str,
        label: str,
        make_inputs: Callable[[], tuple],
        impls: dict[str, Callable],
        reference: Callable | None = None,
        tol: float = 1e-5,
        nbytes: int | None = None,
        flops: float | None = None,
        baseline: str | None = None,
        set_bytes: int | None = None,
        batch: int = 1,
        timing_only: tuple[str, ...] = (),
        calls: int = 1,
    ) -> list[Result]:
        """Check, then time, each implementation of one case.

        make_inputs() -> a tuple of arguments (called once per input set); impls: name ->
        fn(*inputs); reference(*inputs) -> the expected output (a tensor or tuple of tensors,
        any dtype; compared in float64); nbytes/flops: the minimum bytes moved and operations
        of one call, for GB/s and TFLOP/s; baseline: the impl others are compared with;
        set_bytes: bytes of one input set (default nbytes), for the L2 rotation; batch: calls
        timed back to back between one pair of events (see ``time``); timing_only: impls that
        are timed but not checked (a floor that does part of the work, marked in the note);
        calls: how many calls of the op one fn call makes (a CUDA graph of several calls):
        each time is divided by it.
        """
        if self.only and self.only not in op:
            return []
        sets = [make_inputs() for _ in range(self.sets_for(set_bytes or nbytes or 0))]
        expected = reference(*sets[0]) if reference is not None else None
        done, timed = [], {}
        for name, fn in impls.items():
            r = Result(op, label, name, True, None)
            done.append(r)
            if name in timing_only:
                r.note = "timed only: it does part of the work, its result is not checked"
            try:
                if expected is not None and name not in timing_only:
                    r.error = _rel_error(fn(*sets[0]), expected)
                    r.ok = r.error <= tol
            except Exception as e:  # noqa: BLE001  (a peer failing must not stop the run)
                r.ok, r.note = False, f"{type(e).__name__}: {e}"[:200]
                continue
            timed[name] = (r, fn, [])
        for round_ in range(ROUNDS):
            for name, (r, fn, times) in list(timed.items()):
                try:
                    warmup = None if round_ == 0 else 1  # the first round's also compiles
                    reps = -(-self.reps // ROUNDS)
                    times += [t / calls for t in self.time(fn, sets, batch, reps, warmup)]
                except Exception as e:  # noqa: BLE001
                    r.ok, r.note = False, f"{type(e).__name__}: {e}"[:200]
                    del timed[name]
        for r, _, times in timed.values():
            r.ms = statistics.median(times)
            r.ms_min, r.ms_max = min(times), max(times)
            if nbytes:
                r.gbps = nbytes / r.ms / 1e6
                if self.copy_gbps:
                    r.pct_copy = 100 * r.gbps / self.copy_gbps
            if flops:
                r.tflops = flops / r.ms / 1e9
        base = next((r for r in done if r.impl == baseline and r.ms), None)
        for r in done:
            if base is not None and r.ms:
                r.vs_baseline = base.ms / r.ms
        self.results.extend(done)
        self.save()
        print(
            f"  {op:<20} {label:<28} "
            + "  ".join(f"{r.impl}={r.ms * 1e3:.1f}us" if r.ms else f"{r.impl}=FAIL" for r in done),
            flush=True,
        )
        del sets, expected
        torch.cuda.empty_cache()
        return done

    # ------------------------------------------------------------------ report
    def table(self) -> str:
        """The results as a Markdown table."""

        def f(v, fmt):
            return "" if v is None else format(v, fmt)

        lines = [
            "| op | case | impl | ok | rel. error | median µs | GB/s | TFLOP/s | % copy | "
            "vs baseline |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            ok = "yes" if r.ok else f"NO {r.note}"
            lines.append(
                f"| {r.op} | {r.case} | {r.impl} | {ok} | {f(r.error, '.1e')} | "
                f"{f(r.ms and r.ms * 1e3, '.1f')} | {f(r.gbps, '.0f')} | {f(r.tflops, '.1f')} | "
                f"{f(r.pct_copy, '.1f')} | {f(r.vs_baseline, '.2f')} |"
            )
        return "\n".join(lines)

    def save(self, complete: bool = False) -> None:
        """Write the JSON (--out) of the results so far, atomically: a run stopped midway
        (python -m bench all stops a suite at its time limit) keeps its finished cases.
        ``meta["complete"]`` is True only once finish() ran."""
        if not self.out:
            return
        tmp = f"{self.out}.tmp"
        with open(tmp, "w") as fh:
            json.dump(
                {
                    "meta": {**self.meta, "complete": complete},
                    "copy_gbps": self.copy_gbps,
                    "results": [asdict(r) for r in self.results],
                },
                fh,
                indent=1,
            )
        os.replace(tmp, self.out)

    def finish(self) -> None:
        """Print the table (last) and write the JSON when --out was given. % of copy is
        taken against the highest copy bandwidth measured in the run (the conservative
        choice when copy_bandwidth() ran more than once)."""
        copies = [r.gbps for r in self.results if r.op == "copy" and r.gbps]
        if copies:
            self.copy_gbps = max(copies)
            for r in self.results:
                if r.gbps and r.op != "copy":
                    r.pct_copy = 100 * r.gbps / self.copy_gbps
        self.save(complete=True)
        print(
            f"\n{self.title} on {self.meta.get('gpu')} ({self.meta.get('date')}); "
            f"copy bandwidth {self.copy_gbps and round(self.copy_gbps)} GB/s"
        )
        print(self.table())
        sys.stdout.flush()
