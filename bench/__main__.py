"""The benchmarks, in one command.

python -m bench all --out DIR [--quick] [--suites matmul,memory] [--budget SECONDS]
                     [--gpus 0,1,2,3]
    every suite of bench/suites.py on the GPU, one process each: DIR/results.json,
    DIR/log.txt, DIR/plots.tar. --gpus spreads the suites over those cards (indexes among
    the cards this process sees), side by side, each card within its own budget: the
    longest expected suite first onto the least loaded card; results.json and the page
    name the card of each suite. Default: one card, the suites one after the other.
python -m bench report DIR [--page docs/performance.md] [--plots docs/perf]
    docs/performance.md (and docs/perf/*.png) from that run
python -m bench list
    the suites, their scripts, arguments and expected seconds (full / quick)
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def list_suites() -> int:
    """Print the suite table."""
    from bench.suites import SUITES

    for s in SUITES:
        state = "" if s.path.is_file() else "  (not written yet)"
        quick = "not run" if s.quick is None else " ".join(s.quick) or "-"
        print(f"{s.name:<14} bench/{s.script:<20} full: {' '.join(s.full) or '-'}; quick: {quick}"
              f"; expected {s.expect[0]:g} / {s.expect[1]:g} s{state}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """Dispatch to ``all``, ``report`` or ``list``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("all", "report", "list"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "all":
        from bench.suites import main as run

        return run(rest)
    if command == "report":
        from bench.report import main as report

        return report(rest)
    return list_suites()


if __name__ == "__main__":
    sys.exit(main())
