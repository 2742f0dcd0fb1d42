"""Target legality: which IR op, on which type, needs which SM and PTX ISA version.

One table (``TABLE``) and one pass (``check``), run on the optimized IR before any backend:
``check(fn, arch)`` raises the located ``CompileError`` of the first instruction the arch
lacks (what, where, the arch it needs, what to do) and returns the ``Target`` with the
lowest ``.version`` that the arch and every instruction used accept (and ``sm_90a`` where an
arch-specific instruction needs it). The PTX emitter and the LLVM lowering only translate:
where an op has a native form and a fallback (f16/bf16 computed in f32, the sm_80 forms of
bf16x2 arithmetic, atomics as compare-and-swap loops), both ask ``native`` which one the
target gets, so the form they emit is the form this pass checked and versioned.

Entries are keyed by ``(op, key)``: the key is the name of the type the op computes in
(``"bf16"``, ``"f16x2"``), or, for ops whose form depends on more, what ``key`` says
(``"bf16->f32"`` for conversions, ``"add.bf16"`` for atomics, the kind of an ``mma``...);
ops and keys not in the table need nothing beyond the arch's own PTX version. A ``Need``
lists what the op's own form uses (features of ``FEATURES``, or other entries it is made of)
and, for ops that have one, the ``fallback`` used when the arch lacks one of those features.
"""

from __future__ import annotations

from dataclasses import dataclass

from kaio.errors import CompileError
from kaio.ir.nodes import Const, Function, If, Instr, Loop, Region, SourceLoc, StaticFor
from kaio.ir.ops import MMA_KINDS
from kaio.types import FP8_TYPES, f32

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
    "f16x2_ex2": Feature(75, (7, 0), "ex2.approx.f16x2"),
    "bf16x2_ex2": Feature(90, (7, 8), "ex2.approx.ftz.bf16x2"),
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
    "l2_fetch_size": Feature(80, (7, 4), "ld.global.L2::{64,128,256}B"),
    "l1_eviction": Feature(70, (7, 4), "ld.global.L1::{evict_last,evict_first,no_allocate}"),
    "bulk_prefetch": Feature(90, (8, 0), "cp.async.bulk.prefetch.L2"),
    "fence_proxy_async": Feature(90, (8, 0), "fence.proxy.async"),
    "griddepcontrol": Feature(90, (7, 8), "griddepcontrol (programmatic dependent launch)"),
    "cluster": Feature(
        90, (7, 8), "thread-block clusters: .reqnctapercluster, barrier.cluster, mapa"
    ),
    "wgmma": Feature(90, (8, 0), "wgmma.mma_async, Hopper only", arch_specific=True),
    "setmaxnreg": Feature(90, (8, 0), "setmaxnreg, Hopper only", arch_specific=True),
}


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
        return f"{self.version[0]}.{self.version[1]}"

    def has(self, feature: str) -> bool:
        """Whether the arch supports ``feature``."""
        return self.sm >= FEATURES[feature].sm

    def use(self, feature: str, what: str, loc: SourceLoc | None = None) -> None:
        """Record that ``feature`` is used by ``what`` (raising ``.version``, switching to the
        ``a`` target for an arch-specific one); CompileError at ``loc`` naming ``what`` and
        the arch needed when the target lacks it."""
        f = FEATURES[feature]
        where = (loc.filename, loc.lineno, loc.col) if loc else ()
        if f.arch_specific and self.sm != f.sm:
            raise CompileError(
                f"{what} needs sm_{f.sm}a ({f.what}); the target is {self.arch}: compile "
                f"for sm_{f.sm} (or sm_{f.sm}a), or avoid {what} on other GPUs",
                *where,
            )
        if self.sm < f.sm:
            raise CompileError(
                f"{what} needs sm_{f.sm} or newer ({f.what}); the target is {self.arch}: "
                f"compile for a newer arch or avoid {what}",
                *where,
            )
        if f.arch_specific:
            self.arch = f"sm_{f.sm}a"
        self.version = max(self.version, f.version)


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Need:
    """What one form of an op uses: ``uses`` (feature names, ``(op, key)`` entries of
    ``TABLE`` it is made of, or inner ``Need``s), named ``what`` in errors (``{dt}`` and
    ``{st}`` become a conversion's types). ``fallback``: what is used instead when the arch
    lacks one of the features of ``uses`` (None: that is a CompileError), or always when the
    op has no form of its ``own`` (f16/bf16 division: computed in f32)."""

    uses: tuple
    what: str
    fallback: tuple | None = None
    own: bool = True


def _needs(feature: str, what: str, fallback: tuple | None = None) -> Need:
    return Need((feature,), what, fallback)


# What the user wrote, for errors about packed pairs.
SPELLING = {
    "add": "'+'",
    "sub": "'-'",
    "mul": "'*'",
    "fma": "kaio.fma",
    "min": "kaio.min",
    "max": "kaio.max",
    "exp2": "kaio.exp2",
}

_TO_F32, _FROM_F32 = ("cvt", "bf16->f32"), ("cvt", "f32->bf16")
_VIA_F32 = {"f16": (), "bf16": (_TO_F32, _TO_F32, _FROM_F32)}  # an op computed in f32
_WIDE = ("i32", "u32", "i64", "u64", "f64")  # cvt.bf16 takes these directly on sm_90
_NARROW = ("f16", "i8", "u8", "i16", "u16")  # always through f32, exactly
_CAS_B16 = "atom_cas_b16"
_COMPARES = ("lt", "le", "gt", "ge", "eq", "ne")
_TYPED = ("add", "sub", "mul", "div", "min", "max", "fma", "tanh", "exp2")  # keyed by type


# (op, key, feature, builtin named in errors when not the op's name): the forms that need one
# feature and have no fallback.
_ONE_FEATURE = (
    ("ldmatrix", "", "ldmatrix", ""),
    ("ldmatrix", "trans", "ldmatrix", "ldmatrix_trans"),
    ("to_tf32", "", "mma", ""),
    ("cp_async", "", "cp_async", ""),
    ("cp_async_commit", "", "cp_async", ""),
    ("cp_async_wait", "", "cp_async", ""),
    ("wgmma_fence", "", "wgmma", ""),
    ("wgmma_commit", "", "wgmma", ""),
    ("wgmma_wait", "", "wgmma", ""),
    ("smem_desc", "", "wgmma", "smem_descriptor"),
    ("mbarrier_init", "", "mbarrier", ""),
    ("mbarrier_arrive", "", "mbarrier", ""),
    ("mbarrier_arrive", "tx", "mbarrier_tx", "mbarrier_arrive_expect_tx"),
    ("mbarrier_expect_tx", "", "mbarrier_tx", ""),
    ("mbarrier_try_wait", "", "mbarrier_wait", ""),
    ("mbarrier_wait", "", "mbarrier_wait", ""),
    ("tma_load", "", "tma", "tma_load_2d"),
    ("mbarrier_arrive_cluster", "", "cluster", ""),
    ("bulk_store", "", "bulk_copy", ""),
    ("ld_vec", "l2", "l2_fetch_size", "load_vector"),
    ("ld_vec", "l1", "l1_eviction", "load_vector"),
    ("prefetch_l2", "bulk", "bulk_prefetch", ""),
    ("bulk_store", "add", "bulk_copy", "bulk_reduce_add"),
    ("bulk_prefetch", "", "bulk_copy", "prefetch_l2"),
    ("bulk_commit", "", "bulk_copy", ""),
    ("bulk_wait", "", "bulk_copy", ""),
    ("bulk_wait", "read", "bulk_copy", "bulk_wait_read"),
    ("fence_proxy_async", "", "fence_proxy_async", ""),
    ("griddep_wait", "", "griddepcontrol", "grid_dependency_wait"),
    ("griddep_launch", "", "griddepcontrol", "launch_dependents"),
    ("setmaxnreg", "", "setmaxnreg", "setmaxnreg_*"),
    ("cluster_sync", "", "cluster", ""),
    ("cluster_arrive", "", "cluster", ""),
    ("cluster_wait", "", "cluster", ""),
    ("dsmem_load", "", "cluster", "cluster_load"),
    ("sreg", "cluster", "cluster", "cluster_rank"),
)


def _table() -> dict[tuple[str, str], Need]:
    t: dict[tuple[str, str], Need] = {}
    for op in ("add", "sub", "mul"):
        t[op, "bf16"] = _needs("bf16_arith", op, _VIA_F32["bf16"])
        # sm_80: one fma.rn.bf16x2 with a constant operand (kaio.ptx.packed)
        t[op, "bf16x2"] = _needs("bf16_arith", f"{SPELLING[op]} on bf16x2", ("bf16x2_fma",))
    for op in ("min", "max"):
        for half in ("f16", "bf16"):
            t[op, half] = _needs(f"{half}_minmax", op, _VIA_F32[half])
            t[op, f"{half}x2"] = _needs(f"{half}_minmax", f"{SPELLING[op]} on {half}x2")
    for half in ("f16", "bf16"):
        t["div", half] = Need((), "div", _VIA_F32[half], own=False)
    for op in _COMPARES:
        t[op, "bf16"] = _needs("bf16_setp", op, (_TO_F32, _TO_F32))
    t["fma", "bf16"] = _needs("bf16_fma", "fma")
    t["fma", "bf16x2"] = _needs("bf16x2_fma", "kaio.fma on bf16x2")
    t["tanh", "f32"] = _needs("tanh", "tanh")
    for half in ("f16", "bf16"):  # exponentials of both halves at once
        t["exp2", f"{half}x2"] = _needs(f"{half}x2_ex2", f"kaio.exp2 on {half}x2")
    t["pack", "f32->f16x2"] = _needs("f16x2_from_f32", "kaio.f16x2() from f32", ())
    t["pack", "f32->bf16x2"] = _needs("bf16x2_from_f32", "kaio.bf16x2() from f32")
    # conversions
    t[_TO_F32] = _needs("bf16_to_f32", "bf16 conversion")
    t[_FROM_F32] = _needs("bf16_from_f32", "bf16 conversion")
    for other in _WIDE:
        t["cvt", f"bf16->{other}"] = _needs("bf16_cvt", "bf16 conversion", (_TO_F32,))
        t["cvt", f"{other}->bf16"] = _needs("bf16_cvt", "bf16 conversion", (_FROM_F32,))
    for other in _NARROW:
        t["cvt", f"bf16->{other}"] = Need((_TO_F32,), "bf16 conversion")
        t["cvt", f"{other}->bf16"] = Need((_FROM_F32,), "bf16 conversion")
    for fp8 in FP8_TYPES:
        for other in ("f16", "bf16", "f32", *FP8_TYPES):
            for pair in (f"{fp8}->{other}", f"{other}->{fp8}"):
                if other != fp8:
                    t["cvt", pair] = _needs("fp8_cvt", "kaio.{dt}() (a conversion from {st})")
    # atomics: one instruction where the arch has it, else a compare-and-swap loop
    cas = {h: _needs(_CAS_B16, f"atomic_{{kind}} on {h}") for h in ("f16", "bf16")}
    for half in ("f16", "bf16"):
        loop = (cas[half], ("add", half)) if half == "bf16" else (cas[half],)  # f16 add: own
        t["atomic", f"add.{half}"] = _needs(f"atom_add_{half}", "atomic_add", loop)
        for kind in ("max", "min"):  # no 16-bit atom.max/min/exch: always a loop
            t["atomic", f"{kind}.{half}"] = Need((), "", (cas[half], (kind, half)), own=False)
        t["atomic", f"exch.{half}"] = Need((), "", (cas[half],), own=False)
        t["atomic", f"cas.{half}"] = _needs(_CAS_B16, "atomic_cas")
    # fragments and tensor cores
    for kind in MMA_KINDS:
        feature = "mma_fp8" if kind in FP8_TYPES else "mma"
        t["mma", kind] = _needs(feature, f"kaio.mma_{kind}()")
    for kind in ("f16", "bf16", "s8", *FP8_TYPES):
        t["wgmma", kind] = _needs("wgmma", f"kaio.wgmma_{kind}()")
    for kind in ("f16", "bf16"):  # A from registers
        t["wgmma_rs", kind] = _needs("wgmma", f"kaio.wgmma_{kind}()")
    for op, key, feature, builtin in _ONE_FEATURE:
        t[op, key] = _needs(feature, f"kaio.{builtin or op}()")
    multicast = _needs("cluster", "kaio.tma_load_2d_multicast()")
    t["tma_load_multicast", ""] = Need((t["tma_load", ""], multicast), "")
    return t


TABLE: dict[tuple[str, str], Need] = _table()
"""``(op, key) -> Need``: every op form that needs more than its arch's base PTX version."""

KERNEL_NEEDS: dict[str, Need] = {"cluster": _needs("cluster", "kaio.cluster_dims()")}
"""``Function.meta`` keys that need a feature (``.reqnctapercluster``), checked first."""


def key(ins: Instr) -> str:
    """The key of ``ins``'s entry in ``TABLE`` (see the module docstring)."""
    op, attrs = ins.op, ins.attrs
    if op == "cvt":
        return f"{ins.args[0].type.name}->{ins.dst.type.name}"
    if op == "pack":
        return f"f32->{ins.dst.type.name}" if ins.args[0].type == f32 else ""
    if op == "atomic":
        return f"{attrs['kind']}.{ins.args[0].dtype.name}"
    if op in ("mma", "wgmma", "wgmma_rs"):
        return attrs["kind"]
    if op == "ldmatrix":
        return "trans" if attrs["trans"] else ""
    if op == "ld_vec":
        if attrs.get("cache", "").startswith("L1::"):
            return "l1"  # PTX 7.4, as an L2 fetch size (with or without one)
        return "l2" if attrs.get("l2") else ""
    if op == "prefetch_l2":
        return "bulk" if attrs.get("bulk") else ""
    if op == "bulk_wait":
        return "read" if attrs["read"] else ""
    if op == "bulk_store":
        return attrs.get("reduce", "")
    if op == "sreg":
        return "cluster" if attrs["name"].startswith("cluster_") else ""
    if op == "mbarrier_arrive":
        tx = ins.args[-1]
        return "" if isinstance(tx, Const) and tx.value == 0 else "tx"
    if op in _COMPARES:
        return ins.args[0].type.name
    return ins.dst.type.name if op in _TYPED else ""


def native(op: str, key: str, target: Target) -> bool:
    """Whether ``target`` runs the form of ``TABLE[op, key]`` that needs its features (True
    too when there is no entry): False means the backends emit the entry's fallback."""
    need = TABLE.get((op, key))
    return need is None or not _falls_back(need, target)


def _falls_back(need: Need, target: Target) -> bool:
    if not need.own:
        return True
    lacks = any(not target.has(u) for u in need.uses if isinstance(u, str))
    return lacks and need.fallback is not None


def use(need: Need, target: Target, loc: SourceLoc | None = None, **names: str) -> None:
    """Record what ``need`` uses on ``target`` (its fallback's where it has one and the
    target lacks a feature), raising the located CompileError of the first thing missing."""
    items = need.fallback if _falls_back(need, target) else need.uses
    for item in items:
        if isinstance(item, str):
            target.use(item, need.what.format(**names), loc)
        else:
            use(item if isinstance(item, Need) else TABLE[item], target, loc, **names)


def check(fn: Function, arch: str) -> Target:
    """The legality pass: every instruction of ``fn`` (in program order, skipping the branch
    that a constant condition never takes, as the backends do) checked against ``TABLE`` for
    ``arch``; returns the ``Target`` to emit for. CompileError for an unknown arch or the
    first instruction the arch lacks, at its source location."""
    target = Target.for_arch(arch)
    for name, need in KERNEL_NEEDS.items():
        if name in fn.meta:
            use(need, target)
    _block(fn.body, target)
    return target


def _atomic_operand(ins: Instr) -> None:
    """What no arch gives an atomic: a local array, or a bool or 8- or 16-bit integer element
    (CompileError at the instruction; the frontend refuses both at the call already, this
    guards IR built otherwise)."""
    arr, builtin = ins.args[0], f"atomic_{ins.attrs['kind']}"
    t = arr.dtype
    where = (ins.loc.filename, ins.loc.lineno, ins.loc.col) if ins.loc else ()
    if getattr(arr, "space", None) == "local":
        raise CompileError(
            f"{builtin} needs a global or shared array; {arr.name} is a local array", *where
        )
    if t.is_bool or (t.is_int and t.bits < 32):
        raise CompileError(
            f"{builtin} on {t} is not supported; use a 32- or 64-bit type, f16 or bf16", *where
        )


def _block(stmts: list, target: Target) -> None:
    for s in stmts:
        if isinstance(s, Instr):
            need = TABLE.get((s.op, key(s)))
            if need is not None:
                names = {}
                if s.op == "cvt":
                    names = {"dt": s.dst.type.name, "st": s.args[0].type.name}
                elif s.op == "atomic":
                    names = {"kind": s.attrs["kind"]}
                use(need, target, s.loc, **names)
            if s.op == "atomic":
                _atomic_operand(s)
        elif isinstance(s, If):
            if isinstance(s.cond, Const):
                _block(s.then if s.cond.value else s.orelse, target)
            else:
                _block(s.then, target)
                _block(s.orelse, target)
        elif isinstance(s, Loop):
            _block(s.body, target)
            _block(s.step, target)
        elif isinstance(s, Region | StaticFor):
            _block(s.body, target)
