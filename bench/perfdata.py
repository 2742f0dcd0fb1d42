"""The results of one ``python -m bench all`` run, as the report and the plots read them.

``results.json`` holds ``meta`` (the machine and the run) and ``suites``: per suite its status
and the JSON the suite wrote. Suites built on bench/harness.py write ``results``, a list of
records (op, case, impl, ok, error, ms, gbps, tflops, ...); this module groups them into ops
(one table each: cases x implementations), decides each op's unit and each figure's ceiling.

Ceilings: the device-to-device copy bandwidth (the highest any suite measured) for GB/s, and
for TFLOP/s the register-only ``mma.sync`` loop's rate for the op's data type, lowered to the
memory roofline (copy bandwidth x the case's FLOPs per byte) where that is lower: a decode
matmul (M = 1) is bounded by the bytes it reads, not by the tensor cores.

No torch, no GPU: this runs anywhere.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench import targets

RESULTS_FILE = "results.json"
PLOTS_TAR = "plots.tar"


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (letters, digits, '-')."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def is_kaio(impl: str) -> bool:
    """kaio's own implementations have "kaio" in their name; every other is a peer."""
    return "kaio" in impl.lower()


@dataclass
class Record:
    """One implementation of one case (bench.harness.Result, read back)."""

    op: str
    case: str
    impl: str
    ok: bool = False
    error: float | None = None
    ms: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    note: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        """A record from a harness result dict; unknown keys are ignored."""
        return cls(
            op=str(d.get("op", "?")),
            case=str(d.get("case", "")),
            impl=str(d.get("impl", "?")),
            ok=bool(d.get("ok", False)),
            error=d.get("error"),
            ms=d.get("ms"),
            gbps=d.get("gbps"),
            tflops=d.get("tflops"),
            note=str(d.get("note") or ""),
        )

    @property
    def timed(self) -> bool:
        """Correct and timed: usable for ratios."""
        return self.ok and self.ms is not None and self.ms > 0

    @property
    def flops_per_byte(self) -> float | None:
        """Arithmetic intensity of the case (FLOPs / minimum bytes), when both were counted."""
        if self.tflops and self.gbps:
            return self.tflops * 1e3 / self.gbps
        return None


@dataclass
class Op:
    """The records of one op of one suite: a table of cases by implementations."""

    suite: str
    name: str
    cases: list[str] = field(default_factory=list)
    impls: list[str] = field(default_factory=list)
    records: dict[tuple[str, str], Record] = field(default_factory=dict)

    def add(self, r: Record) -> None:
        """Add a record (a later one of the same case and impl replaces an earlier one)."""
        if r.case not in self.cases:
            self.cases.append(r.case)
        if r.impl not in self.impls:
            self.impls.append(r.impl)
        self.records[(r.case, r.impl)] = r

    def get(self, case: str, impl: str) -> Record | None:
        """The record of ``impl`` on ``case``, if any."""
        return self.records.get((case, impl))

    @property
    def kaio_impls(self) -> list[str]:
        """kaio's implementations, in the order they ran."""
        return [i for i in self.impls if is_kaio(i)]

    @property
    def peer_impls(self) -> list[str]:
        """The peers' implementations, in the order they ran."""
        return [i for i in self.impls if not is_kaio(i)]

    @property
    def unit(self) -> str:
        """TFLOP/s when the op counts FLOPs, else GB/s when it counts bytes, else µs."""
        recs = self.records.values()
        if any(r.tflops for r in recs):
            return "TFLOP/s"
        if any(r.gbps for r in recs):
            return "GB/s"
        return "µs"

    def value(self, r: Record | None) -> float | None:
        """The figure of ``r`` in this op's unit."""
        if r is None or r.ms is None:
            return None
        return {"TFLOP/s": r.tflops, "GB/s": r.gbps, "µs": r.ms * 1e3}[self.unit]

    def best(self, case: str, pattern: str | None = None, kaio: bool | None = None):
        """The fastest correct record of ``case`` among impls matching ``pattern`` (a regex)
        and/or of kaio (``kaio=True``) or of the peers (``kaio=False``)."""
        found = [
            r
            for i in self.impls
            if (r := self.get(case, i)) is not None
            and r.timed
            and (pattern is None or re.search(pattern, i))
            and (kaio is None or is_kaio(i) == kaio)
        ]
        return min(found, key=lambda r: r.ms, default=None)


def case_group(case: str) -> str:
    """Which cases of an op share an axis in a plot: matmul shapes "MxNxK" are square sizes
    ("") or other shapes (decode); every other case label is in one group ("")."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", case)
    return "other shapes" if m and len(set(m.groups())) > 1 else ""


def ratio(kaio_rec: Record | None, peer_rec: Record | None) -> float | None:
    """Peer time / kaio time (> 1: kaio faster), when both are correct and timed."""
    if kaio_rec is None or peer_rec is None or not (kaio_rec.timed and peer_rec.timed):
        return None
    return peer_rec.ms / kaio_rec.ms


@dataclass
class Ceilings:
    """The page's ceilings: copy bandwidth (GB/s) and mma.sync peaks (TFLOP/s by dtype)."""

    copy_gbps: float | None = None
    copies: list[tuple[str, float]] = field(default_factory=list)  # (suite, GB/s) measured
    peaks: dict[str, float] = field(default_factory=dict)
    peak_source: dict[str, str] = field(default_factory=dict)  # dtype -> suite

    @staticmethod
    def peak_key(op: str, case: str) -> str | None:
        """Which mma.sync peak applies to an op (by the data type its name or case carries)."""
        text = f"{op} {case}"
        for pattern, key in targets.PEAK_KEYS:
            if re.search(pattern, text):
                return key
        return None

    def of(self, op: Op, r: Record) -> tuple[float, str] | None:
        """(ceiling in the op's unit, what it is) for the case of ``r``, or None."""
        if op.unit == "GB/s" and self.copy_gbps:
            return self.copy_gbps, "copy"
        if op.unit != "TFLOP/s":
            return None
        key = self.peak_key(r.op, r.case)  # a shared peer's own op: sgemm f32 has no mma peak
        peak = self.peaks.get(key) if key else None
        if not peak:
            return None
        intensity = r.flops_per_byte
        if intensity and self.copy_gbps and self.copy_gbps * intensity / 1e3 < peak:
            return self.copy_gbps * intensity / 1e3, f"copy x {intensity:.3g} FLOP/B"
        return peak, f"mma.sync {key}"

    def share(self, op: Op, r: Record | None) -> float | None:
        """The figure of ``r`` as a fraction of its ceiling."""
        if r is None:
            return None
        ceiling, v = self.of(op, r), op.value(r)
        return v / ceiling[0] if ceiling and v else None


@dataclass
class SuiteRun:
    """One suite of a run: its status and the JSON it wrote (None when it wrote none)."""

    name: str
    title: str = ""
    script: str = ""
    status: str = "missing"  # ok, failed, timeout, no data; not run: missing, skipped, no time
    why: str = ""  # why a suite was skipped
    seconds: float | None = None
    rc: int | None = None
    args: list[str] = field(default_factory=list)
    log_tail: str = ""
    data: object = None
    gpu: str | None = None  # the card it ran on, as ``--gpus`` named it (None: the default)
    card: str | None = None  # that card's name (nvidia-smi)

    @property
    def is_harness(self) -> bool:
        """Whether the data is a bench/harness.py JSON (a list of op/case/impl records)."""
        res = self.data.get("results") if isinstance(self.data, dict) else None
        return isinstance(res, list) and all(
            isinstance(r, dict) and "op" in r and "impl" in r for r in res
        )

    @property
    def records(self) -> list[Record]:
        """The harness records (none for other suites)."""
        return [Record.from_dict(d) for d in self.data["results"]] if self.is_harness else []

    @property
    def ops(self) -> list[Op]:
        """The harness records grouped by op, in the order they ran (the copy measurements,
        which are the page's ceiling, left out). A peer-only op named in
        bench.targets.SHARED_PEERS joins the ops it is a peer of, on the cases they share."""
        ops: dict[str, Op] = {}
        for r in self.records:
            if r.op != "copy":
                ops.setdefault(r.op, Op(self.name, r.op)).add(r)
        for suite_pattern, peer_pattern, into_pattern in targets.SHARED_PEERS:
            if not re.search(suite_pattern, self.name):
                continue
            for peer in [o for o in ops.values() if re.search(peer_pattern, o.name)]:
                into = [
                    o for o in ops.values() if o is not peer and re.search(into_pattern, o.name)
                ]
                for op in into:
                    for r in peer.records.values():
                        if r.case in op.cases:
                            op.add(r)
                if into and not peer.kaio_impls:
                    del ops[peer.name]
        return list(ops.values())

    @property
    def meta(self) -> dict:
        """The suite's own meta (harness suites), else {}."""
        m = self.data.get("meta") if isinstance(self.data, dict) else None
        return m if isinstance(m, dict) else {}

    @property
    def complete(self) -> bool:
        """False when the suite stopped before it finished (a partial harness JSON)."""
        return self.status == "ok" and self.meta.get("complete", True) is not False


def launch_rows(suite: SuiteRun) -> dict[str, dict]:
    """bench/launch_overhead.py's rows: path -> {"host_us", "free_us"} (else {})."""
    res = suite.data.get("results") if isinstance(suite.data, dict) else None
    rows = res.get("rows") if isinstance(res, dict) else None
    if not isinstance(rows, dict):
        return {}
    return {k: v for k, v in rows.items() if isinstance(v, dict) and "host_us" in v}


def family_of(suite: SuiteRun, op: str) -> str:
    """The plot family of an op (bench.targets.FAMILIES; else the suite's title)."""
    for suite_pattern, op_pattern, family in targets.FAMILIES:
        if re.search(suite_pattern, suite.name) and re.search(op_pattern, op):
            return family
    return suite.title or suite.name


def families(suite: SuiteRun) -> list[tuple[str, list[Op]]]:
    """The suite's ops grouped by plot family, in the order they ran."""
    groups: dict[str, list[Op]] = {}
    for op in suite.ops:
        groups.setdefault(family_of(suite, op.name), []).append(op)
    return list(groups.items())


def plot_name(suite: SuiteRun, family: str) -> str:
    """The file name of a family's plot."""
    return f"{slug(suite.name)}-{slug(family)}.png"


@dataclass
class Run:
    """A whole ``python -m bench all`` run."""

    meta: dict
    suites: list[SuiteRun]
    ceilings: Ceilings

    @classmethod
    def load(cls, path: str | Path) -> Run:
        """Read a run from its directory (or its results.json)."""
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS_FILE
        raw = json.loads(path.read_text())
        suites = [
            SuiteRun(
                name=name,
                **{
                    k: v for k, v in s.items() if k in SuiteRun.__dataclass_fields__ and k != "name"
                },
            )
            for name, s in raw.get("suites", {}).items()
        ]
        return cls(raw.get("meta", {}), suites, measured_ceilings(suites))

    def suite(self, name: str) -> SuiteRun | None:
        """The suite of that name, if the run has it."""
        return next((s for s in self.suites if s.name == name), None)


def measured_ceilings(suites: list[SuiteRun]) -> Ceilings:
    """The copy bandwidth (highest measured by any suite) and the mma.sync peaks (any suite
    meta key starting with "mma_sync_peak" holding {dtype: TFLOP/s})."""
    c = Ceilings()
    for s in suites:
        for r in s.records:
            if r.op == "copy" and r.gbps:
                c.copies.append((s.name, r.gbps))
        for key, value in s.meta.items():
            if key.startswith("mma_sync_peak") and isinstance(value, dict):
                for dtype, peak in value.items():
                    if isinstance(peak, int | float) and math.isfinite(peak) and peak > 0:
                        if peak > c.peaks.get(dtype, 0):
                            c.peaks[dtype], c.peak_source[dtype] = float(peak), s.name
    if c.copies:
        c.copy_gbps = max(g for _, g in c.copies)
    return c
