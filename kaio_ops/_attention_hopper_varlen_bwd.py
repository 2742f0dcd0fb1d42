"""The Hopper (sm_90a) backward of ``kaio_ops.flash_attention_varlen``: the dense Hopper
backward's deterministic pair of kernels (``kaio_ops._attention_hopper_bwd``: a dK/dV kernel
and a dQ kernel on TMA, an mbarrier ring, warp specialization and ``wgmma``; no atomics)
over a packed batch of variable-length sequences.

The packed q, do [total_q, H, D] and k, v [total_k, Hkv, D] are seen by the tensor maps as
2-D arrays [total, H * D] (Hkv * D), as in the varlen forward
(``_attention_hopper_varlen``): a head of a sequence is the box of rows from the sequence's
start (``cu_seqlens``, read on the GPU: no synchronization with the host) and columns from
h * D. The kernels are the dense ones with ``COLS`` 1 (``attention_bwd_dkdv_wgmma``,
``attention_bwd_dq_wgmma``), which then take these row and column bases: the dK/dV block
(x, y, z) owns the keys x of K/V head y of sequence z, the dQ block the query tile x
(counted from the last: the heaviest causal tiles first) of head y of sequence z. A block
whose tile lies past its sequence's end returns at once (the grid covers the longest
sequence, ``max_seqlen``). At head dim 256 the kernels are the dense D 256 backward's
(``_attention_hopper_bwd256``: the dK/dV kernel of 64 keys a block whose two consumer
warpgroups split the head dim, lse and delta read from the copies below in global memory,
and its dQ kernel), with ``COLS`` 1 as well.

The row logsumexps and delta = rowsum(dO * O) come to shared memory with the tiles (TMA)
from f32 [H, Tp] copies (``varlen_stats``) in which each sequence starts on a multiple of 4
(``stats_start``: cu_q[b] + 3 b rounded up; a TMA copy's first column must be 16 bytes
into a row), zeros in the gaps and past the last sequence. Rows past a sequence's end are
those of the next sequence (or TMA's zeros past the array): their probabilities and dS are masked
to zero, and their gradients never stored (each thread stores its own rows, below the
sequence's length), as the dense kernels do past a head's rows.

Causal attention is aligned bottom-right, as the varlen forward: query i of a sequence of
sq queries and sk keys sees keys j <= i + sk - sq. Both kernels see the query rows shifted
by sk - sq (the dense kernels' mask, key <= row, is then this one) and store them shifted
back. A dQ tile whose rows see no key (sk = 0, or every row before the first key) writes
zeros without touching the pipeline; a key tile that no query sees gets zeros from the
dK/dV kernel's empty loop.
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import math

import kaio
from kaio import f32, i32
from kaio_ops import _attention_hopper_bwd as dense
from kaio_ops import _attention_hopper_bwd256 as bwd256
from kaio_ops._attention_hopper import SW
from kaio_ops._attention_hopper_bwd import stats_start
from kaio_ops._common import lanes_sum


@kaio.gpu_kernel(block_size=256)
def varlen_stats(
    o: DT[:], do: DT[:], lse: f32[:], lse_p: f32[:], delta_p: f32[:], cu_q: i32[:],
    heads: i32, total_q: i32, tp: i32, D: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The TMA copies' lse and delta: for sequence b = block z, head h = block y and its
    slots i from ``stats_start(b)`` to ``stats_start(b + 1)`` (``tp`` for the last
    sequence), lse_p[h, slot] = lse[h, t] and delta_p[h, slot] = sum(o[t, h] * do[t, h])
    in f32 for its tokens t = cu_q[b] + i, zeros past its end (lse_p, delta_p: f32 [heads,
    tp]; o, do [total_q, heads, D]; lse [heads, total_q]). Each group of D / 8 lanes takes
    a slot (8 columns a lane, 16-byte loads): 256 / D slots a warp, 2048 / D a block x."""
    G = D // 8  # lanes a slot
    b = kaio.block_idx_z()
    h = i32(kaio.block_idx_y())
    lane = i32(kaio.lane_id())
    i = i32(kaio.block_idx_x() * 8 + kaio.warp_id()) * (32 // G) + lane // G
    p0 = stats_start(cu_q, b)
    p1 = tp
    if b + 1 < kaio.grid_dim_z():
        p1 = stats_start(cu_q, b + 1)
    t = i32(cu_q[b]) + i
    real = p0 + i < p1 and t < i32(cu_q[b + 1])
    acc = 0.0
    if real:
        x = kaio.local(DT, 8)
        y = kaio.local(DT, 8)
        at = (t * heads + h) * D + lane % G * 8
        kaio.load_vector(x, o, at)
        kaio.load_vector(y, do, at)
        for e in kaio.static_range(8):
            acc += f32(x[e]) * f32(y[e])
    acc = lanes_sum(acc, G)  # every lane: the shuffles
    if lane % G == 0 and p0 + i < p1:
        lv = 0.0
        if real:
            lv = lse[h * total_q + t]
        delta_p[h * tp + p0 + i] = acc
        lse_p[h * tp + p0 + i] = lv


def config(d: int) -> dict:
    """The constexprs of the two kernels for head dim ``d`` with ``COLS`` 1: D 64, 128 the
    dense pair's (``_attention_hopper_bwd.config``: ``{"dkdv": ..., "dq": ...}``, lse and
    delta by TMA, no dQ in the dK/dV kernel); D 256 the dense D 256 backward's
    (``_attention_hopper_bwd256.config`` without dQ in the dK/dV kernel)."""
    cfg = bwd256.config(d, 0) if bwd256.eligible(d) else dense.config(d)
    return {"dkdv": {**cfg["dkdv"], "COLS": 1}, "dq": {**cfg["dq"], "COLS": 1}}


def eligible(d: int) -> bool:
    """Whether the kernels take head dim ``d``: the dense pair's (64 and 128) and the dense
    D 256 backward's (256)."""
    return dense.eligible(d) or bwd256.eligible(d)


# The shortest mean sequence length (queries and keys, tokens) from which the kernels beat
# the mma.sync varlen backward, by head dim and mask: measured on an H100 (2026-11-26, round
# B; lengths uniform in [max / 8, max], f16 H16; µs Hopper / mma.sync, the stats copies
# included): D 128 mean 149 622 / 768, causal 573 / 593; mean 304 750 / 1116, causal
# 619 / 750; mean 608 1035 / 1854, causal 765 / 1116. D 64 mean 149 408 / 466, causal
# 376 / 358 (slower); mean 304 484 / 652, causal 400 / 435; mean 608 685 / 1061, causal
# 493 / 628. Below the shortest measured mean (149) the mma.sync kernels are kept.
MIN_MEAN = {(64, False): 128, (64, True): 224, (128, False): 128, (128, True): 128}
# D 256 (H100, 2026-11-27, GPU round B, the same lengths, f16 H16, ms Hopper / mma.sync):
# mean 149 1.17 / 1.58, causal 1.02 / 1.24; mean 304 1.49 / 2.33, causal 1.15 / 1.56; mean
# 608 2.14 / 3.92, causal 1.50 / 2.35.
MIN_MEAN.update({(256, False): 128, (256, True): 128})


def worthwhile(mean_q: float, mean_k: float, d: int, causal: bool) -> bool:
    """Whether the kernels measured faster than the mma.sync varlen backward for sequences
    of ``mean_q`` queries and ``mean_k`` keys on average (``MIN_MEAN``), head dim ``d``."""
    key = (d, bool(causal))
    return eligible(d) and key in MIN_MEAN and min(mean_q, mean_k) >= MIN_MEAN[key]


def launch(qa, ka, va, da, la, cqa, cka, oa, dims: tuple, causal: bool, scale: float,
           cfg: dict | None = None, only: str | None = None, side: bool = False):  # fmt: skip
    """Run ``varlen_stats`` and the two kernels on checked operands (``_arrays.Operand``s q,
    do, o [total_q, H, D], k, v [total_k, Hkv, D] of one 16-bit type, total_q and total_k
    > 0, D 64, 128 or 256, lse f32 [H, total_q], the int32 offsets [B + 1]); ``dims``:
    ``attention_varlen._check``'s (B, H, group, total_q, D, max_q, max_k); ``cfg``: the
    constexprs (default ``config(d)``); ``only``: "dkdv" or "dq" launches that kernel alone
    (to time it); ``side`` (torch arrays): the dQ kernel on a second stream beside the dK/dV
    kernel (``_attention_hopper_bwd.side_stream``). Returns (dq, dk, dv) of q's, resp. k's,
    type and shape."""
    from kaio_ops import _arrays

    batch, heads, group, total_q, d, max_q, max_k = dims
    total_k, hkv = ka.shape[0], ka.shape[1]
    if not eligible(d) or total_q == 0 or total_k == 0:
        raise ValueError(
            f"_attention_hopper_varlen_bwd.launch: needs D 64, 128 or 256 and tokens of both q "
            f"and k (tensor maps), got D = {d}, total_q = {total_q}, total_k = {total_k}; use "
            f"the mma.sync kernels (attention_varlen.backward_mma)"
        )
    cfg = cfg or config(d)
    c1, c2 = cfg["dkdv"], cfg["dq"]
    d256 = bwd256.eligible(d)
    for c in (c2,) if d256 else (c1, c2):
        if c["PIPE"] and c["STAGES"] < 2:
            raise ValueError(
                f"_attention_hopper_varlen_bwd.launch: PIPE 1-3 needs 2 stages or more: {c}"
            )
    if not (d256 or c1["TSTATS"]) or c1["DQ"] or not c1["COLS"] or not c2["COLS"]:
        raise ValueError(
            f"_attention_hopper_varlen_bwd.launch: the varlen kernels read lse and delta by "
            f"TMA (TSTATS 1; D 256: from global memory), add no dQ in the dK/dV kernel (DQ 0) "
            f"and take COLS 1: {cfg}"
        )
    stream = _arrays.stream_of(qa)
    dq = _arrays.output(da, qa.shape)
    dk, dv = (_arrays.output(da, ka.shape) for _ in range(2))
    tp = (total_q + 3 * batch + 3) // 4 * 4  # stats_start(B)
    lse_p, delta_p = (_arrays.output(da, (heads * tp,), f32) for _ in range(2))
    slots = 2048 // d  # a block x's
    varlen_stats[(-(-(max_q + 6) // slots), heads, batch), 256, stream, 0](
        oa.arg(oa.size), da.arg(da.size), la.arg(la.size), lse_p, delta_p, cqa.arg(), heads,
        total_q, tp, D=d, DT=qa.dtype,
    )  # fmt: skip

    def stats_maps(box):  # lse and delta as [1, H * tp] f32
        flat = [_arrays.view(x, da.kind, (1, heads * tp)) for x in (lse_p, delta_p)]
        return [kaio.tensor_map_2d(x, (1, box), 0) for x in flat]

    def tmap(a, rows, h, box):
        return kaio.tensor_map_2d(a.arg(rows, h * d), (box, 64), SW)

    args = (0, 0, heads, group, math.log2(math.e) * scale, scale, int(causal))  # sq, sk: cu
    varlen = {"cu_q": cqa.arg(), "cu_k": cka.arg(), "tp": tp}
    bk = 64 if d256 else 64 * c1["WG"]

    def dkdv_kernel():
        if d256:  # the D 256 kernels: lse and delta from global memory (no dQ: lse_p, cu_q
            # stand for the dq_acc and semaphores of attention_bwd_dkdv_d256)

            def maps(rows):
                return (
                    tmap(ka, total_k, hkv, bk),
                    tmap(va, total_k, hkv, bk),
                    *(tmap(x, total_q, heads, rows) for x in (qa, da)),
                )

            out = (_arrays.output_arg(da, x, (ka.size,)) for x in (dk, dv))
            bwd256.run_dkdv(c1, d, (-(-max_k // bk), hkv, batch), stream, maps, stats_maps,
                            lse_p, delta_p, *out, (lse_p, cqa.arg()), args, varlen,
                            qa.dtype)  # fmt: skip
            return
        smem = dense.shared_bytes(d, bk, c1["BM"], c1["STAGES"], c1["STAGES"] * c1["BM"],
                                  *dense._ds_buffers(c1))  # fmt: skip
        grid = (-(-max_k // bk), hkv, batch)
        dense.attention_bwd_dkdv_wgmma[grid, 128 * c1["WG"] + 128, stream, smem](
            tmap(ka, total_k, hkv, bk), tmap(va, total_k, hkv, bk),
            tmap(qa, total_q, heads, c1["BM"]), tmap(da, total_q, heads, c1["BM"]),
            *stats_maps(c1["BM"]), lse_p, delta_p, _arrays.output_arg(da, dk, (ka.size,)),
            _arrays.output_arg(da, dv, (ka.size,)), lse_p, *args, **varlen, D=d, DT=qa.dtype,
            **c1,
        )  # fmt: skip

    side = side and only is None
    if only != "dq" and not side:
        dkdv_kernel()
    if only == "dkdv":
        return dq, dk, dv
    kernel, consts, threads, smem, bq, bn = bwd256.dq_kernel(c2, d, 1)
    with dense.side_stream(qa, side) as dq_stream:  # (there the dQ kernel first)
        grid = (-(-max_q // bq), heads, batch)
        kernel[grid, threads, dq_stream, smem](
            tmap(qa, total_q, heads, bq), tmap(da, total_q, heads, bq),
            tmap(ka, total_k, hkv, bn), tmap(va, total_k, hkv, bn), *stats_maps(bq),
            _arrays.output_arg(da, dq, (qa.size,)), *args, **varlen, DT=qa.dtype, **consts,
        )  # fmt: skip
        if side:
            dkdv_kernel()
    return dq, dk, dv


def specializations():
    """(kernel, constexprs) of the specializations ``flash_attention_varlen_bwd`` launches
    (for PTX checks)."""
    from kaio import bf16, f16

    for dt in (f16, bf16):
        for d in (64, 128, bwd256.D256):
            cfg = config(d)
            if bwd256.eligible(d):
                yield bwd256.dkdv_kernel(cfg["dkdv"], d, dt)
            else:
                yield dense.attention_bwd_dkdv_wgmma, {"D": d, "DT": dt, **cfg["dkdv"]}
            kernel, consts, *_ = bwd256.dq_kernel(cfg["dq"], d, 1)
            yield kernel, {"DT": dt, **consts}
