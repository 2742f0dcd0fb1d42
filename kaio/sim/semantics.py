"""The simulator's meaning of every IR op: ONE table, ``SEMANTICS``, keyed by op name.

Each entry is ``handler(machine, instr, values) -> result``: ``values`` are the operands as
NumPy values (a vector with one element per lane, or a 0-d array for a constant; ``Array``
operands are left out, memory handlers read them from ``instr.args``); the result is a vector
or 0-d array of the destination's dtype, or None. Pure ops (``kaio.sim.arith``) ignore the
machine; the others are in ``kaio.sim.memory`` (load, store, atomic) and ``kaio.sim.threads``
(special registers, barriers, shuffles, votes). Packed pairs (f16x2, bf16x2) and ``prmt`` are
in ``kaio.sim.packed``.
"""

from __future__ import annotations

import numpy as np

from kaio.sim import hopper, memory, mufu, packed, tensor, threads
from kaio.sim.arith import (
    abs_,
    add,
    approx,
    bitcast,
    compare,
    cvt,
    div,
    fma,
    integer,
    max_,
    min_,
    mov,
    mul,
    neg,
    plain,
    select,
    sub,
)


def _on_dst(fn):
    """Handler for an op typed by its destination."""
    return lambda m, ins, vals: fn(ins.dst.type, *vals)


def _on_operand(fn, i=0):
    """Handler for an op typed by its ``i``-th operand (comparisons)."""
    return lambda m, ins, vals: fn(ins.args[i].type, *vals)


def _convert(fn):
    return lambda m, ins, vals: fn(ins.args[0].type, ins.dst.type, vals[0])


# NaN bits as measured on an H200: f16/bf16/f32 arithmetic returns one canonical NaN
# (0x7FFF, 0x7FFFFFFF) whatever the operands' payloads, except f64 -> f32 conversion, which
# gives 0x7FC00000. f64 arithmetic behaves like x86 (the first NaN operand, quieted; else
# 0xFFF8000000000000), which NumPy already reproduces, so f64 results are left alone.
_CANONICAL_NAN = {"f16": 0x7FFF, "bf16": 0x7FFF, "f32": 0x7FFFFFFF}
_F64_TO_F32_NAN = 0x7FC00000
_UINT = {16: np.uint16, 32: np.uint32}


def _canonical_nan(handler):
    """Wrap a float-producing handler so NaN results carry the GPU's canonical bits."""

    def run(m, ins, vals):
        result = handler(m, ins, vals)
        t = ins.dst.type
        if t.name not in _CANONICAL_NAN:
            return result
        result = np.asarray(result)
        nan = np.isnan(result.astype(np.float32) if t.bits == 16 else result)
        if not nan.any():
            return result
        bits = result.view(_UINT[t.bits]).copy()
        from_f64 = ins.op == "cvt" and ins.args[0].type.name == "f64" and t.name == "f32"
        bits[nan] = _F64_TO_F32_NAN if from_f64 else _CANONICAL_NAN[t.name]
        return bits.view(result.dtype)

    return run


_REVERSED_BYTE = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], np.uint8)


def _brev(t, x):
    """``brev.b32``/``b64``: the bytes in reverse order, and the bits of each byte."""
    x = np.ascontiguousarray(x)
    data = x.reshape(-1).view(np.uint8).reshape(-1, x.dtype.itemsize)
    reversed_ = np.ascontiguousarray(_REVERSED_BYTE[data][:, ::-1])
    return reversed_.view(x.dtype).reshape(x.shape)


# Ops typed by their destination: op -> fn(dst_type, *operands).
_BY_DST = {
    "mov": mov,
    "add": add,
    "sub": sub,
    "mul": mul,
    "div": div,
    **{op: integer(op) for op in ("floordiv", "mod", "and", "or", "xor", "shl", "shr")},
    "min": min_,
    "max": max_,
    "neg": neg,
    "not": integer("not"),
    "invert": integer("invert"),
    "brev": _brev,
    "abs": abs_,
    "select": select,
    "sqrt": plain(np.sqrt),
    "floor": plain(np.floor),
    "ceil": plain(np.ceil),
    "trunc": plain(np.trunc),
    "rint": plain(np.rint),
    "fma": fma,
    # the GPU's approximate math, bit for bit (kaio.sim.mufu; measured on an H100)
    "exp2": plain(lambda x: mufu.ex2(x, ftz_=False)),
    "log2": plain(lambda x: mufu.lg2(x, ftz_=False)),
    "rsqrt": plain(lambda x: mufu.rsqrt(x, ftz_=False)),
    "rcp_approx": plain(lambda x: mufu.rcp(x, ftz_=False)),
    "exp2_ftz": plain(mufu.ex2),
    "rcp_ftz": plain(mufu.rcp),
    "log2_ftz": plain(mufu.lg2),
    "rsqrt_ftz": plain(mufu.rsqrt),
    "sin_ftz": plain(mufu.sin),
    "cos_ftz": plain(mufu.cos),
    "div_ftz": plain(mufu.div_full_ftz),
    "sin": plain(mufu.sin),
    "cos": plain(mufu.cos),
    "tanh": approx(np.tanh),
    "to_tf32": tensor.to_tf32,
}

# Comparisons, typed by their first operand: op -> the NumPy comparison.
_COMPARISONS = {
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}

SEMANTICS = {
    **{op: _on_dst(fn) for op, fn in _BY_DST.items()},
    **{op: _on_operand(compare(fn)) for op, fn in _COMPARISONS.items()},
    "cvt": _convert(cvt),
    "bitcast": _convert(bitcast),
}
SEMANTICS.update(
    {
        op: _canonical_nan(SEMANTICS[op])
        for op in "add sub mul div min max cvt sqrt floor ceil trunc rint fma exp2 log2 "
        "rsqrt rcp_approx exp2_ftz rcp_ftz sin cos tanh to_tf32 log2_ftz rsqrt_ftz sin_ftz "
        "cos_ftz div_ftz".split()
    }
)
SEMANTICS.update(packed.semantics(SEMANTICS))  # f16x2/bf16x2 arithmetic, pack/unpack, prmt
SEMANTICS |= {
    "sreg": threads.sreg,
    "load": memory.load,
    "store": memory.store,
    "atomic": memory.atomic,
    "wait_eq": memory.wait_eq,
    "shfl": threads.shfl,
    "vote_any": threads.vote_any,
    "vote_all": threads.vote_all,
    "ballot": threads.ballot,
    "sync_threads": threads.sync_threads,
    "cluster_sync": threads.cluster_sync,
    "cluster_arrive": threads.cluster_arrive,
    "cluster_wait": threads.cluster_wait,
    "sync_warp": threads.sync_warp,
    "threadfence": threads.threadfence,
    "ld_vec": tensor.ld_vec,
    "st_vec": tensor.st_vec,
    "prefetch_l2": tensor.prefetch_l2,
    "ldmatrix": tensor.ldmatrix,
    "mma": tensor.mma,
    "cp_async": tensor.cp_async,
    "cp_async_commit": tensor.cp_async_commit,
    "cp_async_wait": tensor.cp_async_wait,
    **hopper.SEMANTICS,
}
