"""Digests of the code kaio compiles for every shipped kaio_ops specialization, and the time
each compile phase took: the check that a compiler change leaves the output byte for byte
as it was, and the measure of what it saved (docs/performance.md, "Compile time").

The kernels: every (kernel, constexprs) pair listed by the ``shipped()`` or
``specializations()`` of a kaio_ops module (private modules too; a pair listed by two modules
counts once), each compiled by the PTX emitter for sm_80 and sm_90 (a kernel that cannot
target one of them records its error instead, which must not change either); and the LLVM
backend's output for the kernels tests/test_llvm_backend.py compiles (the catalog, the
tensor-core and Hopper cases, its kaio_ops sample), for the archs it uses.

Each line of ``--out`` is ``sha256  backend arch  label``; ``--compare`` names a previous
output and lists the lines that differ. ``--times`` writes the timings as JSON: per
specialization the CPU seconds of ``build_ir`` (lowering, then each IR pass, by name) and of
each emission; the totals are printed. ``--profile`` writes a cProfile of every worker's
``build_ir`` calls (pstats files, one per worker).

    python tools/compile_digests.py --out ref.txt --times ref.json --jobs 2
    python tools/compile_digests.py --out new.txt --compare ref.txt --stride 7   # a sample
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import hashlib
import importlib
import json
import multiprocessing
import os
import pkgutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kaio.frontend  # noqa: E402
import kaio_ops  # noqa: E402
from kaio.ir import passes  # noqa: E402
from kaio.kernel import constexpr_key  # noqa: E402

PTX_ARCHS = ("sm_80", "sm_90")
# The functions timed as phases of build_ir: the frontend, then the passes ``optimize`` calls.
PASSES = (
    "unroll",
    "fold",
    "propagate_copies",
    "eliminate_dead_code",
    "strength_reduce",
    "constants_outward",
    "hoist_invariants",
    "loads_before_slow_paths",
)


def kaio_ops_specializations() -> list[tuple[str, object, dict]]:
    """(module, kernel, constexprs) of every pair a kaio_ops module lists in its own
    ``shipped()`` or ``specializations()``, modules in name order, each pair once."""
    out, seen = [], set()
    for info in sorted(pkgutil.iter_modules(kaio_ops.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kaio_ops.{info.name}")
        for name in ("shipped", "specializations"):
            listing = getattr(module, name, None)
            if listing is None or listing.__module__ != module.__name__:
                continue
            for kernel, constexprs in listing():
                key = (id(kernel), constexpr_key(constexprs))
                if key not in seen:
                    seen.add(key)
                    out.append((info.name, kernel, dict(constexprs)))
    return out


def llvm_cases() -> list[tuple[str, object, dict, tuple]]:
    """(group, kernel, constexprs, archs) of the kernels tests/test_llvm_backend.py compiles
    through LLVM."""
    from tests import test_llvm_backend as t

    out = [("catalog", c.kernel, c.constexprs, t.ARCHS) for c in t.CASES]
    out += [("tensor_cores", k, c, t.ARCHS) for k, c in t.PTX_CASES]
    out += [("hopper", k, c, ("sm_90",)) for k, c in t.HOPPER_CASES]
    out += [(f"ops.{m}", k, c, (arch,)) for arch, m, k, c in t.kaio_ops_sample()]
    return out


def label(group: str, kernel, constexprs: dict) -> str:
    """``group kernel K=V ...`` (values by repr: kaio types print their names)."""
    values = " ".join(f"{k}={v!r}" for k, v in constexprs.items())
    return f"{group} {kernel.pyfunc.__module__}.{kernel.__name__} {values}".rstrip()


class PhaseClock:
    """CPU seconds per phase of build_ir, by wrapping the frontend and the passes in the
    modules ``build_ir`` and ``optimize`` read them from (only top-level calls count)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._depth = 0
        self._wrap(kaio.frontend, "compile_kernel", "lower")
        for name in PASSES:
            self._wrap(passes, name, name)

    def _wrap(self, module, attr: str, phase: str) -> None:
        inner = getattr(module, attr)

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            if self._depth:
                return inner(*args, **kwargs)
            self._depth += 1
            t0 = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.process_time() - t0
                self._depth -= 1

        setattr(module, attr, timed)

    def take(self) -> dict[str, float]:
        """The seconds since the last ``take``, and start again."""
        taken, self.seconds = self.seconds, {}
        return taken


def _digest(compile_text) -> tuple[str, float]:
    """sha256 of the text (or of the error's type and message) and the CPU seconds. The
    repository's path (in ``.file`` directives and messages) reads ``<root>``, so that two
    checkouts compare."""
    t0 = time.process_time()
    try:
        text = compile_text()
    except Exception as e:  # noqa: BLE001  (an error is an output too)
        text = f"error {type(e).__name__}: {e}"
    seconds = time.process_time() - t0
    return hashlib.sha256(text.replace(ROOT, "<root>").encode()).hexdigest(), seconds


_JOBS: list = []  # (label, kernel, constexprs, backend, archs), listed before the fork
_CLOCK: list = []  # this worker's PhaseClock
_PROFILE: list = []  # this worker's cProfile.Profile, with --profile


def _compile(index: int) -> dict:
    """One job: build its IR (timed per phase), then each arch's text."""
    name, kernel, constexprs, backend, archs = _JOBS[index]
    if not _CLOCK:
        _CLOCK.append(PhaseClock())
    row = {"label": name, "backend": backend, "digests": {}, "emit_s": {}}
    try:
        spec = kernel.specialize(constexprs, backend=backend)
        build = functools.partial(getattr, spec, "function")  # compiled on first use
        t0 = time.process_time()
        _PROFILE[0].runcall(build) if _PROFILE else build()
        row["build_ir_s"] = time.process_time() - t0
    except Exception:  # noqa: BLE001  (digested below, from the same error)
        spec = None
    row["phases_s"] = _CLOCK[0].take()
    for arch in archs:
        text = functools.partial(kernel.ptx, arch=arch, backend=backend, **constexprs)
        row["digests"][arch], row["emit_s"][arch] = _digest(text)
    return row


def _worker_init(profile_dir: str | None) -> None:
    if profile_dir:
        _PROFILE.append(cProfile.Profile())

        def dump():
            _PROFILE[0].dump_stats(os.path.join(profile_dir, f"build_ir.{os.getpid()}.pstats"))

        multiprocessing.util.Finalize(None, dump, exitpriority=100)  # run as the worker exits


def jobs(llvm: bool, only: list[str], stride: int) -> list:
    """Every job (PTX specializations, then LLVM cases), filtered and sampled."""
    out = [(label(m, k, c), k, c, "ptx", PTX_ARCHS) for m, k, c in kaio_ops_specializations()]
    if llvm:
        out += [(label(g, k, c), k, c, "llvm", a) for g, k, c, a in llvm_cases()]
    if only:
        out = [j for j in out if any(o in j[0] for o in only)]
    return out[::stride]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the digests, one line per text")
    parser.add_argument("--compare", help="a previous --out: print the lines that differ")
    parser.add_argument("--times", help="JSON file for the per-job timings")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", nargs="*", default=[], help="label substrings to keep")
    parser.add_argument("--stride", type=int, default=1, help="every N-th job only")
    parser.add_argument("--no-llvm", action="store_true", help="the PTX emitter's texts only")
    parser.add_argument("--profile", help="folder for cProfile stats of build_ir")
    args = parser.parse_args()

    _JOBS[:] = jobs(not args.no_llvm, args.only, args.stride)
    print(f"{len(_JOBS)} jobs on {args.jobs} processes", flush=True)
    wall = time.perf_counter()
    pool = multiprocessing.get_context("fork").Pool(args.jobs, _worker_init, (args.profile,))
    rows = list(pool.imap_unordered(_compile, range(len(_JOBS))))
    pool.close()  # (not terminate: the workers exit normally and write their profiles)
    pool.join()
    wall = time.perf_counter() - wall

    lines = sorted(
        f"{d}  {r['backend']} {arch}  {r['label']}"
        for r in rows
        for arch, d in r["digests"].items()
    )
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    phases: dict[str, float] = {}
    for r in rows:
        for k, v in r["phases_s"].items():
            phases[k] = phases.get(k, 0.0) + v
    totals = {
        "wall_s": wall,
        "build_ir_cpu_s": sum(r.get("build_ir_s", 0.0) for r in rows),
        "emit_cpu_s": sum(sum(r["emit_s"].values()) for r in rows),
        "phases_cpu_s": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
    }
    print(json.dumps(totals, indent=1))
    if args.times:
        with open(args.times, "w") as f:
            json.dump({"totals": totals, "rows": rows}, f, indent=0)
    if args.compare:
        with open(args.compare) as f:
            before = {line.split("  ", 1)[1]: line for line in f.read().splitlines()}
        after = {line.split("  ", 1)[1]: line for line in lines}
        differ = [k for k in after if k in before and before[k] != after[k]]
        missing = [k for k in after if k not in before]
        for k in differ:
            print(f"DIFFERS: {k}")
        for k in missing:
            print(f"NOT IN {args.compare}: {k}")
        print(f"{len(after) - len(differ) - len(missing)} identical, {len(differ)} differ, "
              f"{len(missing)} not in the reference")  # fmt: skip
        if differ:
            sys.exit(1)


if __name__ == "__main__":
    main()
