"""Targets and PTX ISA versions: which ``.version`` a kernel needs and what its arch can do.

The emitted ``.version`` is the lowest one that both the target and every instruction used
accept, so that the PTX loads on the oldest driver possible. ``ARCHS`` gives each target's
own minimum (PTX ISA "Target ISA notes"); ``FEATURES`` the instructions that need more.
"""

from __future__ import annotations

from dataclasses import dataclass

from kaio.errors import CompileError

# arch -> (SM number for feature checks, lowest PTX ISA version that accepts the target).
ARCHS: dict[str, tuple[int, tuple[int, int]]] = {
    "sm_75": (75, (6, 3)),
    "sm_80": (80, (7, 0)),
    "sm_86": (86, (7, 1)),
    "sm_89": (89, (7, 8)),
    "sm_90": (90, (7, 8)),
    "sm_90a": (90, (8, 0)),
    "sm_100": (100, (8, 6)),
    "sm_120": (120, (8, 7)),
}


@dataclass(frozen=True)
class Feature:
    """An instruction form that needs at least ``sm`` and PTX ISA ``version``. An
    ``arch_specific`` one exists only on that very SM, through its ``a`` target (``sm_90a``):
    using it for ``sm_90`` switches the module's ``.target`` to ``sm_90a``."""

    sm: int
    version: tuple[int, int]
    what: str
    arch_specific: bool = False


FEATURES: dict[str, Feature] = {
    "tanh": Feature(75, (7, 0), "tanh.approx.f32"),
    "f16_minmax": Feature(80, (7, 0), "min/max.f16"),
    "bf16_from_f32": Feature(80, (7, 0), "cvt.rn.bf16.f32"),
    "bf16_to_f32": Feature(80, (7, 1), "cvt.f32.bf16"),
    "bf16_minmax": Feature(80, (7, 0), "min/max.bf16"),
    "bf16_cvt": Feature(90, (7, 8), "cvt between bf16 and integers or f64"),
    "bf16_arith": Feature(90, (7, 8), "add/sub/mul.rn.bf16"),
    "bf16_setp": Feature(90, (7, 8), "setp.bf16"),
    "atom_cas_b16": Feature(70, (6, 3), "atom.cas.b16"),
    "atom_add_f16": Feature(70, (6, 3), "atom.add.noftz.f16"),
    "atom_add_bf16": Feature(90, (7, 8), "atom.add.noftz.bf16"),
    "f16x2_from_f32": Feature(80, (7, 0), "cvt.rn.f16x2.f32"),
    "bf16x2_from_f32": Feature(80, (7, 0), "cvt.rn.bf16x2.f32"),
    "bf16x2_fma": Feature(80, (7, 0), "fma.rn.bf16x2"),
    "bf16_fma": Feature(80, (7, 0), "fma.rn.bf16"),
    "ldmatrix": Feature(75, (6, 5), "ldmatrix"),
    "mma": Feature(80, (7, 0), "mma.sync.aligned m16n8k16/k32/k8 and cvt.rna.tf32.f32"),
    "fp8_cvt": Feature(89, (8, 1), "cvt to and from e4m3x2/e5m2x2 (8-bit floats)"),
    "mma_fp8": Feature(89, (8, 4), "mma.sync.aligned.m16n8k32 with e4m3/e5m2 inputs"),
    "cp_async": Feature(80, (7, 0), "cp.async"),
    "mbarrier": Feature(80, (7, 0), "mbarrier.init/arrive"),
    "mbarrier_wait": Feature(90, (7, 8), "mbarrier.try_wait.parity"),
    "mbarrier_tx": Feature(90, (8, 0), "mbarrier expect_tx"),
    "tma": Feature(90, (8, 0), "cp.async.bulk.tensor and tensor-map parameters"),
    "bulk_copy": Feature(90, (8, 0), "cp.async.bulk (shared to global) and its bulk groups"),
    "fence_proxy_async": Feature(90, (8, 0), "fence.proxy.async"),
    "cluster": Feature(
        90, (7, 8), "thread-block clusters: .reqnctapercluster, barrier.cluster, mapa"
    ),
    "wgmma": Feature(90, (8, 0), "wgmma.mma_async, Hopper only", arch_specific=True),
    "setmaxnreg": Feature(90, (8, 0), "setmaxnreg, Hopper only", arch_specific=True),
}


def _fmt(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


@dataclass
class Target:
    """One compilation's target: the arch, its SM number and the ``.version`` needed so far."""

    arch: str
    sm: int
    version: tuple[int, int]

    @classmethod
    def for_arch(cls, arch: str) -> Target:
        """The target for ``arch`` (``"sm_80"``...); CompileError for an unknown arch."""
        if not isinstance(arch, str) or arch not in ARCHS:
            known = ", ".join(ARCHS)
            raise CompileError(f"unknown GPU architecture {arch!r}; kaio targets {known}")
        sm, version = ARCHS[arch]
        return cls(arch, sm, version)

    @property
    def version_text(self) -> str:
        """The ``.version`` operand, e.g. ``"7.8"``."""
        return _fmt(self.version)

    def has(self, feature: str) -> bool:
        """Whether the arch supports ``feature`` (without recording its use)."""
        return self.sm >= FEATURES[feature].sm

    def require(self, feature: str, builtin: str, loc=None) -> None:
        """Record that ``feature`` is used (raising ``.version`` if needed); CompileError
        naming ``builtin`` and the arch needed when the target lacks it."""
        f = FEATURES[feature]
        where = (loc.filename, loc.lineno, loc.col) if loc else ()
        if f.arch_specific and self.sm != f.sm:
            raise CompileError(
                f"{builtin} needs sm_{f.sm}a ({f.what}); the target is {self.arch}: compile "
                f"for sm_{f.sm} (or sm_{f.sm}a), or avoid {builtin} on other GPUs",
                *where,
            )
        if self.sm < f.sm:
            raise CompileError(
                f"{builtin} needs sm_{f.sm} or newer ({f.what}); the target is {self.arch}: "
                f"compile for a newer arch or avoid {builtin}",
                *where,
            )
        if f.arch_specific:
            self.arch = f"sm_{f.sm}a"
        self.version = max(self.version, f.version)
