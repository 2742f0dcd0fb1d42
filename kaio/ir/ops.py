"""The catalogue of IR operations: one entry per op name, with its operand rule and meaning.

Both backends key their lowering tables by these names (``kaio.ptx.lowering`` and
``kaio.sim.semantics``); ``tests/test_op_tables.py`` checks that each op has an entry in each.
Operands of an arithmetic op all have the destination's type: the frontend inserts ``cvt``s
to apply the promotion rules, so backends never promote.

Semantics that matter to both backends:

- Integers wrap (two's complement) at their width. ``floordiv``/``mod`` follow Python: the
  quotient is floored, the remainder has the divisor's sign. Division by zero gives an
  unspecified value (as on the GPU).
- ``shl``/``shr`` take a u32 amount; amounts >= the width give 0 (``shl``, unsigned ``shr``)
  or the sign fill (signed ``shr``), as PTX's clamped shifts do.
- f16 and bf16 arithmetic (``add sub mul div``) gives the correctly rounded f16/bf16 result
  (round to nearest even): computing in f32 and rounding once is bit-identical.
- ``cvt`` float to int truncates toward zero and saturates (NaN gives 0); int to float and
  float narrowing round to nearest even; int to int wraps (truncates or extends by the source's
  signedness); anything to bool is ``!= 0``; bool to a number is 0 or 1.
- ``min``/``max`` on floats return the other operand when one is NaN (PTX ``min``/``max``).
- Approximate math (``exp exp2 log log2 rsqrt sin cos tanh``) is f32 only and lowers to the
  hardware's approximate instructions; docs/dsl-reference.md gives each error bound.
- Packed pairs (f16x2, bf16x2; element 0 in the low half): the ops of ``PACKED_OPS`` also take
  them and work on each half independently, with the f16/bf16 meaning (each half rounded once;
  a NaN result is the canonical 0x7FFF; ``neg``/``abs`` flip/clear the sign bits only).
  ``pack`` builds a pair, ``unpack_lo``/``unpack_hi`` take a half, ``prmt`` permutes bytes,
  ``lop3`` computes any bitwise function of three words.
"""

from __future__ import annotations

from dataclasses import dataclass

from kaio.types import ScalarType


@dataclass(frozen=True)
class OpInfo:
    """One IR op: its operand ``rule`` (see below), whether it is ``pure`` (removable when its
    result is unused, foldable when its operands are constant) and a one-line meaning.

    Rules: ``"binary"`` (T, T) -> T; ``"shift"`` (T, u32) -> T; ``"unary"`` T -> T;
    ``"compare"`` (T, T) -> bool_; ``"convert"`` S -> T; ``"select"`` (bool_, T, T) -> T;
    ``"ternary"`` (T, T, T) -> T; ``"special"`` see the op's meaning.
    """

    rule: str
    types: str
    pure: bool
    meaning: str


# The operands and result of each "special" op (the other rules declare theirs), checked by
# the verifier: space-separated operand kinds, then the result. Kinds: ``A`` an array;
# ``idx`` one integer index per dimension of the array before it; ``E`` a scalar of that
# array's element type; ``F`` a register fragment; ``I`` an integer; ``S`` any scalar; ``T``
# a scalar of the result type; a type name (``u32``, ``u64``, ``bool_``); a trailing ``?``
# makes the last kind optional. Results: ``none``, a type name, ``T`` (any type), ``elem``
# (the first array's element type).
SIGNATURES: dict[str, tuple[str, str]] = {
    "pack": ("S S", "T"),
    "prmt": ("u32 u32 u32", "u32"),
    "lop3": ("u32 u32 u32", "u32"),
    "sreg": ("", "u32"),
    "load": ("A idx", "elem"),
    "store": ("A idx E", "none"),
    "atomic": ("A idx E E?", "elem"),
    "wait_eq": ("A idx E", "none"),
    "shfl": ("T u32", "T"),
    "vote_any": ("bool_", "bool_"),
    "vote_all": ("bool_", "bool_"),
    "ballot": ("bool_", "u32"),
    "ld_vec": ("F A idx", "none"),
    "st_vec": ("A idx F", "none"),
    "prefetch_l2": ("A idx", "none"),
    "ldmatrix": ("F A idx", "none"),
    "mma": ("F F F F", "none"),
    "cp_async": ("A idx A idx u32", "none"),
    "wgmma": ("F u64 u64 bool_", "none"),
    "wgmma_rs": ("F F u64 bool_", "none"),
    "smem_desc": ("A idx", "u64"),
    "mbarrier_try_wait": ("A idx u32", "bool_"),
    "tma_load": ("A idx u64 I I A idx", "none"),
    "tma_load_multicast": ("A idx u64 I I A idx u32", "none"),
    "bulk_store": ("A idx A idx u32", "none"),
    "bulk_prefetch": ("A idx u32", "none"),
    "dsmem_load": ("A idx u32", "elem"),
    **dict.fromkeys(
        (
            "sync_threads sync_warp threadfence cp_async_commit cp_async_wait wgmma_fence "
            "wgmma_commit wgmma_wait bulk_commit bulk_wait fence_proxy_async cluster_sync "
            "cluster_arrive cluster_wait setmaxnreg griddep_wait griddep_launch"
        ).split(),
        ("", "none"),
    ),
    **dict.fromkeys(
        (
            "mbarrier_init mbarrier_arrive mbarrier_expect_tx mbarrier_wait mbarrier_arrive_cluster"
        ).split(),
        ("A idx u32", "none"),  # a barrier array element and a u32
    ),
}

# ``@kaio.gpu_kernel(fastmath=True)``: the op each f32 op becomes (the frontend's builder
# substitutes them; docs/dsl-reference.md, "Fast math", gives each error bound).
FASTMATH: dict[str, str] = {
    "exp2": "exp2_ftz",
    "log2": "log2_ftz",
    "rsqrt": "rsqrt_ftz",
    "sin": "sin_ftz",
    "cos": "cos_ftz",
    "div": "div_ftz",
}

# types: which operand types are allowed: "num" int+float, "int", "intbool", "float",
# "f32" (approximate math), "float_exact" (f32 and f64), "any".
OPS: dict[str, OpInfo] = {
    "mov": OpInfo("unary", "any", True, "copy a value"),
    "add": OpInfo("binary", "num", True, "a + b"),
    "sub": OpInfo("binary", "num", True, "a - b"),
    "mul": OpInfo("binary", "num", True, "a * b"),
    "div": OpInfo("binary", "float", True, "a / b, IEEE round to nearest"),
    "floordiv": OpInfo("binary", "int", True, "Python a // b (floored)"),
    "mod": OpInfo("binary", "int", True, "Python a % b (sign of b)"),
    "and": OpInfo("binary", "intbool", True, "bitwise/logical and"),
    "or": OpInfo("binary", "intbool", True, "bitwise/logical or"),
    "xor": OpInfo("binary", "intbool", True, "bitwise/logical xor"),
    "shl": OpInfo("shift", "int", True, "a << b, clamped"),
    "shr": OpInfo("shift", "int", True, "a >> b, arithmetic for signed, clamped"),
    "min": OpInfo("binary", "num", True, "minimum (NaN-ignoring for floats)"),
    "max": OpInfo("binary", "num", True, "maximum (NaN-ignoring for floats)"),
    "neg": OpInfo("unary", "num", True, "-a (wraps for integers)"),
    "not": OpInfo("unary", "bool", True, "logical not"),
    "invert": OpInfo("unary", "int", True, "bitwise not ~a"),
    "brev": OpInfo("unary", "int", True, "a's bits in reverse order (32- and 64-bit integers)"),
    "abs": OpInfo("unary", "num", True, "|a| (wraps for the most negative integer)"),
    "lt": OpInfo("compare", "num", True, "a < b"),
    "le": OpInfo("compare", "num", True, "a <= b"),
    "gt": OpInfo("compare", "num", True, "a > b"),
    "ge": OpInfo("compare", "num", True, "a >= b"),
    "eq": OpInfo("compare", "any", True, "a == b"),
    "ne": OpInfo("compare", "any", True, "a != b (true for NaN)"),
    "select": OpInfo("select", "any", True, "c ? a : b (both evaluated)"),
    "cvt": OpInfo("convert", "any", True, "convert to the destination type"),
    "bitcast": OpInfo("convert", "any", True, "reinterpret the bits (same width)"),
    "sqrt": OpInfo("unary", "float_exact", True, "square root, IEEE round to nearest"),
    "floor": OpInfo("unary", "float_exact", True, "round toward -inf (exact)"),
    "ceil": OpInfo("unary", "float_exact", True, "round toward +inf (exact)"),
    "trunc": OpInfo("unary", "float_exact", True, "round toward zero (exact)"),
    "rint": OpInfo("unary", "float_exact", True, "round to nearest even (exact)"),
    "fma": OpInfo("ternary", "float", True, "a * b + c rounded once (f16 and bf16 too)"),
    "exp2": OpInfo("unary", "f32", True, "2**a, ex2.approx"),
    "log2": OpInfo("unary", "f32", True, "log2(a), lg2.approx"),
    "rsqrt": OpInfo("unary", "f32", True, "1/sqrt(a), rsqrt.approx"),
    "rcp_approx": OpInfo("unary", "f32", True, "1/a, rcp.approx"),
    "exp2_ftz": OpInfo("unary", "f32", True, "2**a, ex2.approx.ftz (subnormals flushed to 0)"),
    "rcp_ftz": OpInfo("unary", "f32", True, "1/a, rcp.approx.ftz (subnormals flushed to 0)"),
    # fastmath=True kernels (docs/dsl-reference.md, "Fast math"): the .ftz approximations
    "log2_ftz": OpInfo("unary", "f32", True, "log2(a), lg2.approx.ftz (subnormals flushed to 0)"),
    "rsqrt_ftz": OpInfo("unary", "f32", True, "1/sqrt(a), rsqrt.approx.ftz (subnormals to 0)"),
    "sin_ftz": OpInfo("unary", "f32", True, "sin(a), sin.approx.ftz (subnormals flushed to 0)"),
    "cos_ftz": OpInfo("unary", "f32", True, "cos(a), cos.approx.ftz (subnormals flushed to 0)"),
    "div_ftz": OpInfo("binary", "f32", True, "a / b, div.full.ftz (2 ulp, subnormals to 0)"),
    "sin": OpInfo("unary", "f32", True, "sin(a), sin.approx"),
    "cos": OpInfo("unary", "f32", True, "cos(a), cos.approx"),
    "tanh": OpInfo("unary", "f32", True, "tanh(a), tanh.approx (sm_75+)"),
    # packed half-precision pairs (see PACKED_OPS)
    "pack": OpInfo(
        "special",
        "any",
        True,
        "(lo, hi) -> f16x2/bf16x2: two halves, or two f32 each rounded once (nearest even)",
    ),
    "unpack_lo": OpInfo("convert", "any", True, "the low half (element 0) of a packed pair"),
    "unpack_hi": OpInfo("convert", "any", True, "the high half (element 1) of a packed pair"),
    "prmt": OpInfo("special", "u32", True, "(a, b, selector) u32: PTX prmt.b32 byte permute"),
    "lop3": OpInfo(
        "special", "u32", True, "(a, b, c) u32: bitwise function attrs['lut'] (lop3.b32)"
    ),
    "sreg": OpInfo("special", "u32", True, "read a special register attrs['name']"),
    "load": OpInfo("special", "any", False, "dst = array[idx...]"),
    "store": OpInfo("special", "any", False, "array[idx...] = value"),
    "atomic": OpInfo("special", "any", False, "old = array[idx]; array[idx] = f(old, v...)"),
    "wait_eq": OpInfo("special", "any", False, "spin until array[idx] == v (acquire loads)"),
    "shfl": OpInfo("special", "any", False, "warp shuffle attrs['mode'] of (value, lane/delta)"),
    "vote_any": OpInfo("special", "bool", False, "any lane of the warp has p"),
    "vote_all": OpInfo("special", "bool", False, "all lanes of the warp have p"),
    "ballot": OpInfo("special", "bool", False, "u32 mask of the lanes with p"),
    "sync_threads": OpInfo("special", "none", False, "block-wide barrier"),
    "sync_warp": OpInfo("special", "none", False, "warp-wide barrier"),
    "threadfence": OpInfo("special", "none", False, "device-wide memory fence"),
    # Register fragments (``Frag`` operands) and the tensor-core and async-copy instructions.
    "to_tf32": OpInfo("unary", "f32", True, "round to tf32 (10-bit mantissa), nearest, ties away"),
    "ld_vec": OpInfo("special", "any", False, "(frag, array, *idx): one 4/8/16-byte vector load"),
    "st_vec": OpInfo("special", "any", False, "(array, *idx, frag): one 4/8/16-byte store"),
    "prefetch_l2": OpInfo("special", "none", False, "(array, *idx): prefetch a line into L2"),
    "ldmatrix": OpInfo(
        "special", "any", False, "(frag, shared array, *idx): ldmatrix x1/x2/x4 {trans}"
    ),
    "mma": OpInfo("special", "any", False, "(d, a, b, c) frags: d = a @ b + c {kind}"),
    "cp_async": OpInfo(
        "special",
        "any",
        False,
        "(shared, *idx, global, *idx, src_bytes): async copy of {bytes}, zero-filled past "
        "src_bytes {cache}",
    ),
    "cp_async_commit": OpInfo("special", "none", False, "close this thread's async-copy group"),
    "cp_async_wait": OpInfo(
        "special", "none", False, "wait until at most {pending} async-copy groups are pending"
    ),
    # Hopper (sm_90/sm_90a): warpgroup MMA, shared-memory descriptors, mbarriers, TMA
    # (kaio.lang_hopper, kaio.ptx.hopper, kaio.sim.hopper; docs/hopper.md).
    "wgmma": OpInfo(
        "special",
        "any",
        False,
        "(acc frag, a_desc u64, b_desc u64, scale_d bool): acc = A @ B (+ acc if scale_d), "
        "m64n{n}k16 {kind}, A and B from shared memory through descriptors {trans_a} {trans_b}",
    ),
    "wgmma_rs": OpInfo(
        "special",
        "any",
        False,
        "(acc frag, a frag, b_desc u64, scale_d bool): acc = A @ B (+ acc if scale_d), "
        "m64n{n}k16 {kind}, A from registers, B from shared memory {trans_b}",
    ),
    "wgmma_fence": OpInfo("special", "none", False, "order register accesses before wgmma"),
    "wgmma_commit": OpInfo("special", "none", False, "close this warpgroup's wgmma group"),
    "wgmma_wait": OpInfo(
        "special", "none", False, "wait until at most {pending} wgmma groups are pending"
    ),
    "smem_desc": OpInfo(
        "special",
        "any",
        False,
        "(shared array, *idx) -> u64 wgmma matrix descriptor of the tile at that element, "
        "{swizzle} bytes swizzle, {lbo}/{sbo} leading/stride byte offsets",
    ),
    "mbarrier_init": OpInfo("special", "none", False, "(bar, *idx, count u32): init a barrier"),
    "mbarrier_arrive": OpInfo(
        "special", "none", False, "(bar, *idx, tx u32): expect tx bytes, then arrive once"
    ),
    "mbarrier_expect_tx": OpInfo(
        "special", "none", False, "(bar, *idx, tx u32): expect tx more bytes (no arrival)"
    ),
    "mbarrier_try_wait": OpInfo(
        "special", "bool", False, "(bar, *idx, parity u32) -> whether that phase completed"
    ),
    "mbarrier_wait": OpInfo(
        "special", "none", False, "(bar, *idx, parity u32): spin until that phase completed"
    ),
    "tma_load": OpInfo(
        "special",
        "none",
        False,
        "(shared, *idx, map u64, c0 i32, c1 i32, bar, *idx): copy the box at column c0, row "
        "c1 of the map's array into shared memory, completing tx bytes on the barrier",
    ),
    "tma_load_multicast": OpInfo(
        "special",
        "none",
        False,
        "(shared, *idx, map u64, c0 i32, c1 i32, bar, *idx, ctas u32): tma_load into the same "
        "address and barrier of each cluster block in the ctas mask",
    ),
    "mbarrier_arrive_cluster": OpInfo(
        "special", "none", False, "(bar, *idx, rank u32): arrive once on block rank's barrier"
    ),
    "bulk_store": OpInfo(
        "special",
        "none",
        False,
        "(global, *idx, shared, *idx, nbytes u32): async bulk copy of nbytes from shared to "
        "global memory, in this thread's open bulk group",
    ),
    "bulk_prefetch": OpInfo(
        "special", "none", False, "(global, *idx, nbytes u32): prefetch nbytes into L2 (a hint)"
    ),
    "bulk_commit": OpInfo("special", "none", False, "close this thread's bulk-copy group"),
    "bulk_wait": OpInfo(
        "special",
        "none",
        False,
        "wait until at most {pending} bulk-copy groups are pending (read: only their reads)",
    ),
    "fence_proxy_async": OpInfo(
        "special", "none", False, "order generic-proxy shared accesses with async-proxy ones"
    ),
    "griddep_wait": OpInfo(
        "special", "none", False, "wait for the grids this one depends on, their writes visible"
    ),
    "griddep_launch": OpInfo(
        "special", "none", False, "let the grids that depend on this one launch"
    ),
    "cluster_sync": OpInfo(
        "special", "none", False, "barrier for all threads of the cluster's blocks"
    ),
    "cluster_arrive": OpInfo(
        "special", "none", False, "this thread's arrival at the cluster barrier (release)"
    ),
    "cluster_wait": OpInfo(
        "special", "none", False, "wait for every thread of the cluster to arrive (acquire)"
    ),
    "dsmem_load": OpInfo(
        "special",
        "any",
        False,
        "(shared array, *idx, rank u32): the element of block rank of this cluster",
    ),
    "setmaxnreg": OpInfo(
        "special", "none", False, "{action} this warpgroup's registers to {count}"
    ),
}


@dataclass(frozen=True)
class MmaKind:
    """One ``mma.sync.aligned`` form: the m x n x k shape, the PTX types of the inputs and the
    accumulator, and how many 32-bit registers each thread holds for A, B and C/D."""

    shape: tuple[int, int, int]
    input: str
    acc: str
    a_regs: int
    b_regs: int
    c_regs: int

    @property
    def ptx_shape(self) -> str:
        """``m16n8k16``."""
        m, n, k = self.shape
        return f"m{m}n{n}k{k}"


MMA_KINDS: dict[str, MmaKind] = {
    "f16": MmaKind((16, 8, 16), "f16", "f32", 4, 2, 4),
    "bf16": MmaKind((16, 8, 16), "bf16", "f32", 4, 2, 4),
    "s8": MmaKind((16, 8, 32), "s8", "s32", 4, 2, 4),
    "tf32": MmaKind((16, 8, 8), "tf32", "f32", 4, 2, 4),
    "e4m3": MmaKind((16, 8, 32), "e4m3", "f32", 4, 2, 4),
    "e5m2": MmaKind((16, 8, 32), "e5m2", "f32", 4, 2, 4),
}

SPECIAL_REGISTERS = (
    "tid.x tid.y tid.z ntid.x ntid.y ntid.z ctaid.x ctaid.y ctaid.z "
    "nctaid.x nctaid.y nctaid.z laneid dynamic_smem_size cluster_ctarank"
).split()

SHUFFLE_MODES = ("bfly", "down", "up", "idx")

ATOMIC_KINDS = ("add", "max", "min", "exch", "cas")

# Ops that also take packed pairs (every operand and the result of one packed type).
PACKED_OPS = ("add", "sub", "mul", "fma", "min", "max", "neg", "abs", "exp2")

# The attrs each special op carries (the verifier checks them).
REQUIRED_ATTRS = {
    "sreg": {"name": SPECIAL_REGISTERS},
    "shfl": {"mode": SHUFFLE_MODES},
    "atomic": {"kind": ATOMIC_KINDS},
    "ldmatrix": {"trans": (False, True)},
    "mma": {"kind": tuple(MMA_KINDS)},
    "cp_async": {"bytes": (4, 8, 16), "cache": ("ca", "cg")},
    "wgmma": {
        "kind": ("f16", "bf16", "e4m3", "e5m2"),
        "trans_a": (False, True),
        "trans_b": (False, True),
    },
    "wgmma_rs": {"kind": ("f16", "bf16"), "trans_b": (False, True)},
    "smem_desc": {"swizzle": (0, 32, 64, 128)},
    "setmaxnreg": {"action": ("inc", "dec")},
}


def integer_classes(t: ScalarType) -> tuple[str, ...] | None:
    """The keys of a backend's table (``kaio.ptx.templates``, ``kaio.llvm.lowering``) that may
    hold the entry of a bool or integer type ``t``, most specific first; None for a float or
    packed type, whose keys each backend orders its own way."""
    if t.is_bool:
        return ("pred", "any")
    if t.kind == "uint":
        return ("uint", "int", "any")
    if t.is_int:
        return ("int", "any")
    return None


class OpTable(dict):
    """One consumer's entry per IR op (a backend's lowering: op name -> function), filled
    where each function is defined: ``@LOWERING.register("tma_load", "tma_load_multicast")``
    over it, or ``LOWERING.add(op, function)`` for a made one. Both refuse a name that is not
    an op of ``OPS`` and an op that already has an entry (``update`` still replaces entries,
    for a wrapper such as ``kaio.ptx.packed.packed_lowering``)."""

    def add(self, op: str, function) -> None:
        """Make ``function`` the entry of ``op``."""
        if op not in OPS:
            raise ValueError(f"{op!r} is not an IR op: declare it in kaio.ir.ops.OPS first")
        if op in self:
            raise ValueError(
                f"{op!r} already has an entry ({getattr(self[op], '__qualname__', self[op])}): "
                f"one function per op and table"
            )
        self[op] = function

    def register(self, *ops: str):
        """Decorator: the function becomes the entry of each of ``ops``."""

        def add_all(function):
            for op in ops:
                self.add(op, function)
            return function

        return add_all

    def include(self, *tables: dict) -> None:
        """Add every entry of ``tables`` (another module's part of the same table)."""
        for table in tables:
            for op, function in table.items():
                self.add(op, function)
