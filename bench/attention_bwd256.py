"""Head dim 256 flash-attention backward on an sm_90 GPU: ``kaio_ops.flash_attention_bwd``
(as shipped, and the variants named) against torch SDPA's flash backward, in one process,
with CUDA events. TFLOP/s at 2.5x the forward's 4 B H Sq Sk D (halved when causal).

Usage: ``python bench/attention_bwd256.py [--dtypes float16,bfloat16] [--seqs 1024,4096,16384]
[--variants shipped,mma.sync,pair,fused] [--out FILE.json] [--check]``: H 16 at S 1024 (B
16), 4096 (B 4), 16384 (B 1); ``--check`` compares each variant's gradients with SDPA's
first (the largest difference over the largest of SDPA's), with its own on a second call and
with the first variant's (``_bits``: the same bits), and gives the call's peak of transient
memory (``_peak_gib``: its outputs and workspace). ``--tiny pair,fused``: each
schedule once at small sizes against float64 (for compute-sanitizer; with ``--dtypes`` and
``--causal``; ``varlen``: the varlen backward). ``--varlen 4k,1k [--impls
hopper,hopper:bm64,mma.sync,padded,sdpa,dispatched] [--check]``: the varlen backward at D 256
against padding (``varlen_rows``); ``--kernels dq,dq:pair,dkdv,dkdv:bm64,all,...``: the
kernels alone and the variants (``kernel_rows``, at each of ``--seqs``, the first of
``--dtypes``); with either, ``--table`` runs the table too (first the kernels, then the
table, then varlen); ``--warm``: those once each, untimed (to compile; ``--no-fwd``: o and
lse random). ``--rotate [--rounds N]``: the kernels' items, the varlen implementations and
the table's contenders (SDPA and the variants) timed in turn, the order rotated each round
(``time_rotated``; ``--queued``: each round behind a GPU sleep, no host time).
``--profile shipped,...``: each kernel of one call of each variant under torch.profiler
(``profile_rows``). o and lse come from torch SDPA flash's forward where it has the op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.attention_hopper import SLEEP_CYCLES, time_calls  # noqa: E402

SCHEDULES = {"pair": 0, "fused": 1}  # _attention_hopper_bwd256.FUSED forced
BATCH = {1024: 16, 2048: 8, 4096: 4, 8192: 2, 16384: 1}


def variant(name: str):
    """(do, q, k, v, o, lse, causal) -> (dq, dk, dv): ``shipped`` the public op, ``mma.sync``
    the op with the Hopper kernels off, ``pair`` and ``fused`` the D 256 wgmma kernels with
    that schedule (``_attention_hopper_bwd256.FUSED``), ``NAME=N[+NAME=N]`` the op unplanned
    with ``_attention_hopper_bwd256.NAME`` = N (``HALVES=1+SFIRST=1``), else the op
    unplanned."""
    import kaio_ops
    from kaio_ops import _attention_hopper_bwd256 as hopper_bwd256
    from kaio_ops import attention

    raw = attention.flash_attention_bwd.__wrapped__

    def run(do, q, k, v, o, lse, causal):
        if name == "shipped":
            return kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal)
        if name in SCHEDULES or "=" in name:
            pairs = [("FUSED", SCHEDULES[name])] if name in SCHEDULES else [
                x.split("=") for x in name.split("+")]  # fmt: skip
            saved = {c: getattr(hopper_bwd256, c) for c, _ in pairs}
            for const, value in pairs:
                setattr(hopper_bwd256, const, int(value))
            try:
                return raw(do, q, k, v, o, lse, causal)
            finally:
                for const, value in saved.items():
                    setattr(hopper_bwd256, const, value)
        os.environ["KAIO_HOPPER_ATTENTION"] = "0" if name == "mma.sync" else "1"
        try:
            return raw(do, q, k, v, o, lse, causal)
        finally:
            del os.environ["KAIO_HOPPER_ATTENTION"]

    return run


def sdpa_grads(q, k, v, do, causal):
    """SDPA flash's output and a function computing its gradients."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = sdpa(*leaves, is_causal=causal)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


FWD = True  # --no-fwd (with --warm): o and lse random, the forward not compiled
REPS = 3  # --reps: calls a timed round (the median of 3 rounds)


def forward(q, k, v, causal: bool) -> tuple:
    """(o, lse) of the forward for the backward's inputs: torch SDPA flash's output and
    logsumexp where this torch has the op (no kaio forward to compile: each size and mask
    is a specialization of its own), else ``kaio_ops.flash_attention_with_stats``'s."""
    import torch

    import kaio_ops

    if q.shape[1] == k.shape[1]:
        try:
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
            return o, lse.float().contiguous()
        except (RuntimeError, AttributeError):
            pass
    return kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)


def fake(q) -> tuple:
    """A random o like q and lse zeros [*q.shape[:-1]] (only compiling: --no-fwd)."""
    import torch

    return torch.randn_like(q), torch.zeros(q.shape[:-1], device=q.device)


def operands(q, k, v, do, causal: bool) -> tuple:
    """``_attention_hopper_bwd256.launch``'s first arguments for q, k, v, do (torch, [B, H,
    S, D]): the checked operands, delta from the forward's output, the dims, the mask and
    the scale."""
    from kaio.types import f32
    from kaio_ops import _arrays, attention

    o, lse = forward(q, k, v, causal) if FWD else fake(q)
    inputs = _arrays.Inputs("bench")
    (qa, ka, va), dims, scale = attention._check_flash("bench", q, k, v, None, inputs)
    da = inputs.array(do, "do", ndim=4)
    la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
    delta = (o.float() * do.float()).sum(-1).reshape(-1)
    return qa, ka, va, da, la, delta, dims, causal, scale


def tiny_varlen(dtypes: str, masks: str) -> None:
    """The varlen backward at D 256 (``_attention_hopper_varlen_bwd``) once per case at small
    sizes (two query heads a K/V head, sq != sk, an empty and a length-1 sequence, one
    without keys), against float64 autograd: for compute-sanitizer."""
    import torch

    import kaio_ops
    from kaio_ops import attention_varlen as av
    from tests.test_ops_attention_varlen import _gpu_batch, _rel_t, _torch_reference

    lens_q, lens_k = [70, 0, 1, 133, 5], [66, 4, 1, 140, 0]
    for dtype in dtypes.split(","):
        for causal in [bool(int(c)) for c in masks.split(",")]:
            q, k, v, do, cu_q, cu_k = _gpu_batch(
                lens_q, lens_k, 2, 1, 256, getattr(torch, dtype), 3
            )
            args = (cu_q, cu_k, max(lens_q), max(lens_k), causal)
            o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, *args)
            grads = av.backward_hopper(do, q, k, v, o, lse, *args)
            _, *ref = _torch_reference(q, k, v, lens_q, lens_k, causal, grads_of=do)
            errs = [_rel_t(g, r) for g, r in zip(grads, ref, strict=True)]
            print(f"tiny {dtype} varlen causal={causal}: rel {errs}", flush=True)


def tiny(schedules: str, dtypes: str = "float16,bfloat16", masks: str = "0,1") -> None:
    """Each schedule (``pair``, ``fused``; ``varlen``: ``tiny_varlen``) once per case at small
    sizes (``dtypes``, ``masks`` causal or not, grouped-query heads, partial tiles, Sq !=
    Sk), against float64 autograd: for compute-sanitizer."""
    import torch

    if "varlen" in schedules.split(","):
        tiny_varlen(dtypes, masks)
        schedules = ",".join(x for x in schedules.split(",") if x != "varlen")
        if not schedules:
            return

    from kaio_ops import _attention_hopper_bwd256 as hopper_bwd256
    from tests.test_ops_attention import _rel_t, _sdpa64

    for dtype in dtypes.split(","):
        for causal in [bool(int(c)) for c in masks.split(",")]:
            gen = torch.Generator(device="cuda").manual_seed(1)
            dt = getattr(torch, dtype)
            q, do = (torch.randn((1, 4, 200, 256), device="cuda", dtype=dt, generator=gen)
                     for _ in "qo")  # fmt: skip
            k, v = (torch.randn((1, 2, 300, 256), device="cuda", dtype=dt, generator=gen)
                    for _ in "kv")  # fmt: skip
            leaves = [x.double().requires_grad_() for x in (q, k, v)]
            _sdpa64(*leaves, causal, group=2).backward(do.double())
            op = operands(q, k, v, do, causal)
            for name in schedules.split(","):
                cfg = {"dkdv": {"DQ": SCHEDULES[name]}}
                grads = hopper_bwd256.launch(*op, cfg)
                errs = [_rel_t(g, x.grad) for g, x in zip(grads, leaves, strict=True)]
                print(f"tiny {dtype} {name} causal={causal}: rel {errs}", flush=True)


# varlen backward cases (B, max length, H, dtype): lengths uniform in [max / 8, max]
VARLEN = {"4k": (8, 4096, 16, "float16"), "1k": (32, 1024, 16, "float16"),
          "512": (64, 512, 16, "float16"), "256": (128, 256, 16, "float16"),
          "4kbf": (8, 4096, 16, "bfloat16")}  # fmt: skip


def varlen_impls(lens: list, q, k, v, do, causal: bool, sdpa: bool, variants: list) -> dict:
    """``varlen_rows``' implementations (name: a function of no arguments) on the packed
    q, k, v, do of sequences ``lens`` (and the padded batch's); ``variants``: the Hopper
    kernels' with ``kernel_cfg``'s options (``hopper:q128:kv``, ...)."""
    import torch

    import kaio_ops
    from bench.attention_varlen import offsets, pad
    from kaio_ops import _attention_hopper_varlen_bwd as hvb
    from kaio_ops import attention_varlen as av

    top, cu = max(lens), offsets(lens)
    if FWD:
        o, lse = kaio_ops.flash_attention_varlen_with_stats(q, k, v, cu, cu, top, top, causal)
    else:
        o, lse = fake(q)
        lse = lse.reshape(q.shape[1], -1)
    args = (do, q, k, v, o, lse, cu, cu, top, top, causal)
    qp, kp, vp, dop, op = (pad(x, lens) for x in (q, k, v, do, o))
    lsep = torch.zeros((len(lens), q.shape[1], top), device="cuda", dtype=torch.float32)
    start = 0
    for i, n in enumerate(lens):
        lsep[i, :, :n] = lse[:, start : start + n]
        start += n

    def variant(item):  # "hopper:q128:kv:side": the Hopper kernels with kernel_cfg's options
        _, over, side = kernel_cfg(item)
        cfg = hvb.config(q.shape[-1])
        cfg = {n: {**c, **over[n]} for n, c in cfg.items()}
        arrays, dims, scale, oa = av._check_bwd("bench", *args[:-1], None)
        return lambda: hvb.launch(*arrays, oa, dims, causal, scale, cfg, side=side)

    fns = {
        "hopper": lambda: av.backward_hopper(*args),
        "mma.sync": lambda: av.backward_mma(*args),
        "dispatched": lambda: kaio_ops.flash_attention_varlen_bwd(*args),
        "padded": lambda: kaio_ops.flash_attention_bwd(dop, qp, kp, vp, op, lsep, causal),
    }
    if sdpa:
        fns["sdpa"] = sdpa_grads(qp, kp, vp, dop, causal)
    for item in variants:
        fns[item] = variant(item)
    return fns


def varlen_rows(cases: str, masks: str, impls: str, check: bool, reps: int = 3,
                warm: bool = False) -> list:  # fmt: skip
    """``flash_attention_varlen_bwd`` at D 256 (``hopper``: ``_attention_hopper_varlen_bwd``
    launched directly, ``hopper:side``, ``hopper:q128:kv``...: the same with
    ``kernel_cfg``'s options,
    ``mma.sync``: the mma.sync kernels, ``dispatched``: the op) against padding to the
    longest sequence (``padded``: ``flash_attention_bwd`` on the padded batch, the dense D
    256 kernels; ``sdpa``: torch SDPA flash's backward, padded), every row a case of
    ``VARLEN``; TFLOP/s of the useful work (2.5 times the forward's). ``check``: the Hopper
    kernels' gradients against the mma.sync ones' first (largest difference over the
    largest). ``warm``: each implementation called once, nothing timed (to compile)."""
    import torch

    from bench.attention_varlen import lengths, useful_flops

    rows = []
    d = 256
    for case in cases.split(","):
        b, top, h, dtype = VARLEN[case]
        dt = getattr(torch, dtype)
        lens = lengths(b, top, 7)
        total = sum(lens)
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn((total, h, d), device="cuda", dtype=dt, generator=gen)
                       for _ in range(4))  # fmt: skip
        for causal in [bool(int(c)) for c in masks.split(",")]:
            names = impls.split(",")
            fns = varlen_impls(lens, q, k, v, do, causal, "sdpa" in names,
                               [x for x in names if x.startswith("hopper:")])  # fmt: skip
            flops = 2.5 * useful_flops(lens, h, d, causal)
            row = dict(case=case, dtype=dtype, b=b, h=h, top=top, mean=total // b, causal=causal)
            if check:
                want = fns["mma.sync"]()
                for name in [x for x in names if x.startswith("hopper")]:
                    row[f"{name}_err"] = max(
                        float((g.float() - w.float()).abs().max() / w.float().abs().max())
                        for g, w in zip(fns[name](), want, strict=True)
                    )
            if warm:
                for name in names:
                    fns[name]()
                continue
            if ROTATE:
                times = time_rotated({name: fns[name] for name in names}, ROUNDS)
            else:
                times = {name: time_calls(fns[name], reps=reps) for name in names}
            for name, ms in times.items():
                row[f"{name}_ms"], row[name] = ms, flops / ms / 1e9
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# kernel_cfg's options NAMEn: (the kernels, the constexpr) that they set to n
KNOBS = {"halves": (("dkdv",), "HALVES"), "sfirst": (("dq",), "SFIRST"),
         "rot": (("dq", "dkdv"), "ROT"), "union": (("dq",), "UNION"),
         "ds": (("dkdv",), "DS")}  # fmt: skip


def kernel_cfg(item: str) -> tuple[str, dict, bool]:
    """``(part, cfg, side)`` of a ``--kernels`` item: its part (``dq``, ``dkdv`` or ``all``),
    the ``launch`` overrides of its options (``kv``: the dQ kernel
    ``attention_bwd_dq_d256``, ``pair``: the pair's; ``q128``: the dK/dV kernel
    ``attention_bwd_dkdv_d256q``, ``bm64``: ``attention_bwd_dkdv_d256``; ``halvesN``,
    ``sfirstN``, ``rotN``, ``unionN``, ``dsN`` (dkdv: with its dS^T copies; dq: dQ from the
    workspace): ``KNOBS``' constexpr N (without N: 1);
    ``BN:STAGES:PIPE``: the pair's dQ kernel with those) and whether ``side``."""
    part, *opts = item.split(":")
    cfg: dict = {"dq": {}, "dkdv": {}}
    if opts and opts[0].isdigit():
        bn, st, pipe = (int(x) for x in opts[:3])
        cfg["dq"].update(BN=bn, STAGES=st, PIPE=pipe, KV=0)
        opts = opts[3:]
    if "kv" in opts or "pair" in opts:  # pair: the pair's dQ kernel
        cfg["dq"]["KV"] = int("kv" in opts)
    if "q128" in opts or "bm64" in opts:  # bm64: attention_bwd_dkdv_d256
        cfg["dkdv"]["Q128"] = int("q128" in opts)
    for x in opts:  # NAMEn: KNOBS' constexpr n (NAME: 1)
        name = x.rstrip("0123456789")
        if name in KNOBS:
            for kernel in KNOBS[name][0]:
                cfg[kernel][KNOBS[name][1]] = int(x[len(name) :] or 1)
    return part, cfg, "side" in opts


def time_rotated(fns: dict, rounds: int = 5, reps: int = 2, queued: bool = False) -> dict:
    """Milliseconds a call of each of ``fns`` (name: function of no arguments), timed in
    turn: ``rounds`` rounds of ``reps`` calls each between CUDA events, the order rotated
    each round, the median round; ``queued``: each round's calls behind a GPU sleep, so that
    the window holds no host time (``time_queued``'s kernel time). (Under the H100's 700 W
    cap the clock moves with the power drawn and the temperature: timed one after the other,
    the last of a row ran up to 8% below the same kernel timed first, GPU round B of
    2026-11-27.)"""
    import torch

    names = list(fns)
    times: dict = {n: [] for n in names}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queued:
                torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            for _ in range(reps):
                fns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / reps)
    return {n: sorted(t)[len(t) // 2] for n, t in times.items()}


ROTATE = False  # --rotate: kernel_row's items, the table's contenders timed in turn (time_rotated)
ROUNDS = 5  # --rounds: time_rotated's rounds
QUEUED = False  # --queued: time_rotated's rounds behind a GPU sleep (kernel time)


def kernel_row(items: str, q, k, v, do, causal: bool, warm: bool = False) -> dict:
    """``kernel_rows``' row of one mask (``warm``: each item called once, nothing timed)."""
    from kaio_ops import _attention_hopper_bwd256 as hopper_bwd256

    b, h, seq, d = q.shape
    op = operands(q, k, v, do, causal)
    prod = 2 * b * h * seq * seq * d / (2 if causal else 1)
    row = dict(dtype=str(q.dtype), s=seq, b=b, causal=causal)
    want = None if warm else hopper_bwd256.launch(*op)
    fns, parts = {}, {}
    for item in items.split(","):
        part, cfg, side = kernel_cfg(item)
        only = None if part == "all" else part
        picked = {"dq": [0], "dkdv": [1, 2], "all": [0, 1, 2]}[part]
        got = hopper_bwd256.launch(*op, cfg, only, side)
        if warm:
            continue
        row[f"{item}_err"] = max(
            float((got[i].float() - want[i].float()).abs().max() / want[i].float().abs().max())
            for i in picked
        )
        fns[item] = lambda cfg=cfg, only=only, side=side: hopper_bwd256.launch(*op, cfg, only, side)
        parts[item] = part
    if ROTATE:
        times = time_rotated(fns, ROUNDS)
    else:
        times = {item: time_calls(fn, reps=REPS) for item, fn in fns.items()}
    for item, ms in times.items():
        row[item] = {"dq": 3, "dkdv": 4, "all": 5}[parts[item]] * prod / ms / 1e9
    return row


def random_qkvdo(seq: int, dtype: str) -> tuple:
    """q, k, v and dO of H16 D256 at ``seq`` (``BATCH`` sequences), the same random draws each
    time."""
    import torch

    b = BATCH[seq]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (b, 16, seq, 256)
    dt = getattr(torch, dtype)
    return tuple(torch.randn(shape, device="cuda", dtype=dt, generator=gen) for _ in range(4))


def kernel_rows(
    items: str, seq: int, masks: str, dtype: str = "float16", warm: bool = False
) -> list:
    """The D 256 kernels alone (``launch(only=...)``) or the whole backward, as shipped and
    with ``kernel_cfg``'s variants (``items``: ``dq``, ``dq:kv``, ``dq:48:2:0``, ``dkdv``,
    ``dkdv:q128``, ``all``, ``all:q128:kv:side``, ...), H16 at ``seq`` (``BATCH``); TFLOP/s
    of their own products (three for dQ, four for dK/dV, the backward's five for ``all``:
    2 B H S S D each, halved when causal); ``_err``: the largest difference from the shipped
    kernels' outputs over their largest."""
    q, k, v, do = random_qkvdo(seq, dtype)
    rows = []
    for causal in [bool(int(c)) for c in masks.split(",")]:
        rows.append(kernel_row(items, q, k, v, do, causal, warm))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def profile_rows(seq: int, masks: str, dtype: str, variants: str) -> list:
    """The kernels of a call of each of ``variants`` (``variant``'s names) under
    torch.profiler, H16 at ``seq`` (``BATCH``): each kernel's name, start after the call's
    first kernel began and GPU time (µs), the median of 3 profiled calls (what a call's time
    is made of: the delta pass, the dK/dV and the dQ kernels, the gaps and overlaps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    q, k, v, do = random_qkvdo(seq, dtype)
    rows = []
    for causal in [bool(int(c)) for c in masks.split(",")]:
        o, lse = forward(q, k, v, causal)
        for name in variants.split(","):
            fn = variant(name)
            fn(do, q, k, v, o, lse, causal)
            torch.cuda.synchronize()
            calls = []
            for _ in range(3):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn(do, q, k, v, o, lse, causal)
                    torch.cuda.synchronize()
                gpu = [e for e in prof.events() if e.device_type.name == "CUDA"]
                kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in gpu)
                t0 = kernels[0][0]
                calls.append([(n[:28], s - t0, e - s) for s, e, n in kernels])
            calls.sort(key=lambda c: max(s + d for _, s, d in c))
            row = dict(s=seq, dtype=dtype, causal=causal, variant=name, kernels=calls[1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:

    p = argparse.ArgumentParser()
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--seqs", default="4096,1024,16384")
    p.add_argument("--causal", default="0,1")
    p.add_argument("--variants", default="shipped")
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out")
    p.add_argument("--tiny", help="schedules to run once at small sizes (pair,fused)")
    p.add_argument("--varlen", help="varlen backward cases (VARLEN's keys: 4k,1k,...)")
    p.add_argument("--impls", default="hopper,hopper:side,mma.sync,padded,sdpa",
                   help="--varlen's implementations")  # fmt: skip
    p.add_argument("--kernels", help="D 256 kernels to time (dq,dq:kv,dkdv:q128,all,...)")
    p.add_argument("--profile", help="variants whose kernels to profile (profile_rows)")
    p.add_argument("--warm", action="store_true", help="--varlen, --kernels: compile, no timing")
    p.add_argument("--no-fwd", action="store_true", help="--warm: o, lse random (no forward)")
    p.add_argument("--table", action="store_true", help="the table too (with --kernels, --varlen)")
    p.add_argument("--reps", type=int, default=3, help="calls a timed round (3 rounds)")
    p.add_argument("--rotate", action="store_true",
                   help="--kernels, --varlen, --table: in turn, the order rotated")  # fmt: skip
    p.add_argument("--rounds", type=int, default=5, help="--rotate's rounds (the median)")
    p.add_argument("--queued", action="store_true", help="--rotate: each round behind a GPU sleep")
    a = p.parse_args()
    if a.tiny:
        return tiny(a.tiny, a.dtypes, a.causal)
    global FWD, REPS, ROTATE, ROUNDS, QUEUED
    FWD = not (a.no_fwd and a.warm)
    REPS = a.reps
    ROTATE = a.rotate
    ROUNDS = a.rounds
    QUEUED = a.queued
    rows: list = []

    def save():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(rows, f, indent=1)

    if a.profile:
        for seq in [int(x) for x in a.seqs.split(",")]:
            rows += profile_rows(seq, a.causal, a.dtypes.split(",")[0], a.profile)
            save()
        if not (a.kernels or a.table or a.varlen):
            return
    if a.kernels:
        for seq in [int(x) for x in a.seqs.split(",")]:
            rows += kernel_rows(a.kernels, seq, a.causal, a.dtypes.split(",")[0], a.warm)
            save()
    if a.table or not (a.kernels or a.varlen):
        table_rows(a, rows, save)
    if a.varlen:
        rows += varlen_rows(a.varlen, a.causal, a.impls, a.check, warm=a.warm)
        save()


def table_rows(a, rows: list, save) -> None:
    """The table: each of ``a.seqs`` x ``a.dtypes`` x ``a.causal``, torch SDPA flash's
    backward and ``a.variants`` (``variant``), TFLOP/s and x SDPA; each row added to
    ``rows`` and saved (``save``) as it comes, the table printed."""
    import torch

    gpu = torch.cuda.get_device_name()
    first = len(rows)
    d, h = a.d, a.heads
    for s in [int(x) for x in a.seqs.split(",")]:
        b = BATCH[s]
        for dtype in a.dtypes.split(","):
            dt = getattr(torch, dtype)
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn((b, h, s, d), device="cuda", dtype=dt, generator=gen)
                           for _ in range(4))  # fmt: skip
            for causal in [bool(int(c)) for c in a.causal.split(",")]:
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                o, lse = forward(q, k, v, causal)
                ref = sdpa_grads(q, k, v, do, causal)
                want = ref() if a.check else None
                fns = {"sdpa": ref}
                row = dict(gpu=gpu, dtype=dtype, d=d, b=b, h=h, s=s, causal=causal)
                first_got = None
                for name in a.variants.split(","):
                    fn = variant(name)
                    if want is not None:
                        torch.cuda.synchronize()
                        held = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                        got = fn(do, q, k, v, o, lse, causal)
                        torch.cuda.synchronize()  # the call's transient bytes (workspace)
                        row[f"{name}_peak_gib"] = (torch.cuda.max_memory_allocated() - held) / 2**30
                        errs = [float((g.float() - w.float()).abs().max() / w.float().abs().max())
                                for g, w in zip(got, want, strict=True)]  # fmt: skip
                        row[f"{name}_err"] = max(errs)
                        again = fn(do, q, k, v, o, lse, causal)
                        first_got = first_got or got  # the same bits as the first variant's
                        row[f"{name}_bits"] = all(torch.equal(x, y) for x, y in zip(
                            (*got, *got), (*again, *first_got), strict=True))  # fmt: skip
                    args = (do, q, k, v, o, lse, causal)
                    fns[name] = lambda fn=fn, args=args: fn(*args)
                if ROTATE:  # SDPA and the variants in turn, the order rotated each round
                    times = time_rotated(fns, ROUNDS, queued=QUEUED)
                else:
                    times = {name: time_calls(fn, reps=REPS) for name, fn in fns.items()}
                for name, ms in times.items():
                    row[f"{name}_ms"], row[name] = ms, flops / ms / 1e9
                    if name != "sdpa":
                        row[f"{name}/sdpa"] = times["sdpa"] / ms
                rows.append(row)
                print(json.dumps(row), flush=True)
                del ref
                save()
    print(f"\n{gpu}: head dim {d} backward, TFLOP/s (x SDPA flash)")
    for r in rows[first:]:
        cells = "  ".join(f"{n} {r[n]:.0f} ({r[n + '/sdpa']:.2f}x)" for n in a.variants.split(","))
        print(f"{r['dtype']:9} S{r['s']:5} {'causal' if r['causal'] else 'full  '}  "
              f"sdpa {r['sdpa']:.0f}  {cells}")  # fmt: skip


if __name__ == "__main__":
    main()
