"""PNG plots of a run (matplotlib, optional): per op family, one panel per op with the
throughput of kaio and of each peer against the case (size or data type), and the case's
ceiling dashed; for the launch overhead, host time per launch by path.

Without matplotlib ``available()`` is False and nothing is drawn: the page says so.
"""

from __future__ import annotations

import math
from pathlib import Path

from bench.perfdata import (
    Op,
    Run,
    case_group,
    families,
    is_kaio,
    launch_rows,
    plot_name,
    slug,
)

LAUNCH_PLOT = "launch-overhead.png"


def available() -> bool:
    """Whether matplotlib can be imported here."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _panels(ops: list[Op]) -> list[tuple[Op, list[str], str]]:
    """(op, its cases on one axis, title): an op's cases split by ``case_group``."""
    panels = []
    for op in ops:
        groups: dict[str, list[str]] = {}
        for c in op.cases:
            groups.setdefault(case_group(c), []).append(c)
        for group, cases in groups.items():
            panels.append((op, cases, f"{op.name}, {group}" if group else op.name))
    return panels


def _figure(op: Op, r) -> float:
    """The figure of record ``r`` in the op's unit; NaN (no point) when it has none: not
    timed, or a unit it does not count (the bytes of a host-side reference)."""
    value = op.value(r) if r is not None and r.timed else None
    return math.nan if value is None else value


def _op_panel(ax, run: Run, op: Op, cases: list[str], title: str, colors: dict) -> None:
    """One op on some cases: a line per implementation, or with 3 cases or fewer a bar group;
    the cases' ceilings dashed."""
    x = list(range(len(cases)))
    impls = [i for i in op.kaio_impls + op.peer_impls if any(op.get(c, i) for c in cases)]
    bars = len(cases) <= 3
    width = 0.8 / max(len(impls), 1)
    values = []
    for k, impl in enumerate(impls):
        ys = [_figure(op, op.get(c, impl)) for c in cases]
        values += [y for y in ys if not math.isnan(y)]
        kaio = impl in op.kaio_impls
        style = {"label": impl, "color": colors[impl], "zorder": 3 if kaio else 2}
        if bars:
            ax.bar([i - 0.4 + (k + 0.5) * width for i in x], ys, width, **style)
        else:
            ax.plot(x, ys, marker="o", lw=2.2 if kaio else 1.2, ls="-" if kaio else "--", **style)
    ceilings = []
    for c in cases:
        r = next((r for i in impls if (r := op.get(c, i)) is not None), None)
        ceiling = run.ceilings.of(op, r) if r is not None else None
        ceilings.append(ceiling[0] if ceiling else math.nan)
    if not all(math.isnan(v) for v in ceilings):
        values += [v for v in ceilings if not math.isnan(v)]
        if bars:
            lo, hi = [i - 0.45 for i in x], [i + 0.45 for i in x]
            ax.hlines(ceilings, lo, hi, colors="k", linestyles="dashed", label="ceiling", zorder=4)
        else:
            ax.plot(x, ceilings, "k:", lw=1, label="ceiling")
    if values and min(values) > 0 and max(values) / min(values) > 30:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(op.unit, fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(cases, rotation=25, ha="right", fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="y", alpha=0.3)


def _family_plot(plt, run: Run, title: str, ops: list[Op], path: Path) -> None:
    panels = _panels(ops)
    impls = list(dict.fromkeys(i for op in ops for i in op.kaio_impls + op.peer_impls))
    colors = {impl: f"C{k % 10}" for k, impl in enumerate(impls)}  # one color per impl
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows + 0.8), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        _op_panel(ax, run, *panel, colors)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=min(len(legend), 6),
               fontsize=8, frameon=False)  # fmt: skip
    gpu = run.meta.get("gpu", {}).get("name", "")
    fig.suptitle(f"{title}: kaio and peers{', ' + gpu if gpu else ''}", fontsize=11)
    fig.tight_layout(rect=(0, 0.8 / (3.6 * rows + 0.8), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _launch_plot(plt, rows: dict[str, dict], path: Path) -> None:
    names = list(rows)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.2))
    colors = ["C0" if is_kaio(n) else "C7" for n in names]
    ax.barh(names, [rows[n]["host_us"] for n in names], color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("host µs per launch (lower is better)")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


SWEEP_OP = "gemm sweep"  # bench/gemm_sweep.py's ops: one heat map each


def _sweep_heatmap(plt, op: Op, path: Path, peer_name: str = "cuBLAS") -> None:
    """bench/gemm_sweep.py's op: ``peer_name`` time (cuBLAS, or Triton) / kaio time (> 1:
    kaio faster) by M (columns) and (N, K) shape (rows), the ratio written in each cell;
    blank where a case is missing or failed."""
    from bench.gemm_sweep import parse_label

    cells = {}
    for case in op.cases:
        at = parse_label(case)
        kaio, peer = op.get(case, "kaio"), op.get(case, peer_name)
        if at and kaio and peer and kaio.timed and peer.timed:
            cells[at] = peer.ms / kaio.ms
    ms = sorted({m for m, _ in cells})
    shapes = list(dict.fromkeys(s for _, s in cells))
    grid = [[cells.get((m, s), math.nan) for m in ms] for s in shapes]
    fig, ax = plt.subplots(figsize=(0.6 * len(ms) + 2.5, 0.45 * len(shapes) + 1.5))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.5, aspect="auto")
    ax.set_xticks(range(len(ms)), [str(m) for m in ms], fontsize=7)
    ax.set_yticks(range(len(shapes)), shapes, fontsize=7)
    ax.set_xlabel("M")
    ax.set_ylabel("N x K")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    fig.colorbar(image, ax=ax, label=f"{peer_name} time / kaio time")
    ax.set_title(f"{op.name}: kaio_ops.matmul vs {peer_name}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(run: Run, outdir: str | Path) -> tuple[list[str], list[str]]:
    """Draw every plot of ``run`` into ``outdir``: (file names written, errors). One plot
    failing does not stop the others."""
    plt = _pyplot()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written, errors = [], []
    jobs = []
    for suite in run.suites:
        for title, ops in families(suite):
            jobs.append(
                (plot_name(suite, title), lambda p, t=title, o=ops: _family_plot(plt, run, t, o, p))
            )
        for op in suite.ops:
            if op.name.startswith(SWEEP_OP):
                name = f"{slug(op.name)}-heatmap.png"
                jobs.append((name, lambda p, op=op: _sweep_heatmap(plt, op, p)))
        if rows := launch_rows(suite):
            jobs.append((LAUNCH_PLOT, lambda p, rows=rows: _launch_plot(plt, rows, p)))
    for name, draw in jobs:
        try:
            draw(outdir / name)
            written.append(name)
        except Exception as e:  # noqa: BLE001  (a plot failing must not lose the others)
            errors.append(f"{name}: {type(e).__name__}: {e}")
    return written, errors
