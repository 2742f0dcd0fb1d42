"""The Hopper flash-attention backward (``kaio_ops._attention_hopper_bwd``, wgmma + TMA)
against the mma.sync one (``kaio_ops._attention_tc``) and torch SDPA's flash backward, in
one run, on an sm_90 GPU. Steps (each its own process, so that one stuck kernel cannot take
the others' results):

- ``warm --jobs N``: compile every specialization the other steps launch, N processes at a
  time (each launches its kernels once at a small size; the cubins land in the disk cache).
- ``check``: each wgmma variant's dQ, dK, dV against float64 autograd (f16 and bf16, D 64
  and 128, causal and not, grouped-query heads, Sq != Sk, partial tiles), and the same bits
  on a second run; the public op's dispatch where it should take the new kernels.
- ``time``: TFLOP/s (2.5 x the forward's 4 * B * H * Sq * Sk * D, halved when causal) with
  CUDA events, the median of several rounds of back-to-back calls, every contender in the
  same process: the wgmma variants, the mma.sync kernels (``KAIO_HOPPER_ATTENTION=0``) and
  SDPA's flash backward (``torch.autograd.grad`` of its output).
- ``tiny``: the default kernels on a few small cases (for compute-sanitizer).
- ``one``: one call of the default kernels at S 4096 (for Nsight Compute).
- ``repeat``: each variant several times at a real size: how many distinct bit patterns
  (the ordered fused kernel and the pair: one).
- ``table``: the public op as shipped against SDPA flash over dtypes, head dims, masks and
  sequence lengths (docs/performance.md's table).
- ``ab``: interleaved A/B of variants (another commit's module from a file among them) and
  SDPA flash, each case's variants timed in turn (``--spec``; default ``AB_SPEC``).
- ``kernels``: where a call's GPU time goes: each kernel's time a call (CUDA events around
  each launch) for ``--spec``'s variants, SDPA flash's whole call beside.

Usage: ``python bench/attention_hopper_bwd.py {warm,check,time,tiny,one,table,repeat,ab,kernels}
[--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.attention_hopper import SLEEP_CYCLES, emit, save, time_calls, time_queued  # noqa: E402

NEW = {  # name: overrides of _attention_hopper_bwd.config's constexprs, per kernel
    "wgmma": {},  # the fused kernel (dQ by bulk reductions)
    "shipped": {"shipped": True},  # flash_attention_bwd's default (FUSED: fused or the pair)
    "pair": {"deterministic": True},  # the deterministic dK/dV and dQ kernels
    "fused atomics": {"fused": {"DQ": 2, "STAGES": 3}},  # dQ by atomics from the registers
    "fused writers": {"fused": {"DQ": 3}},  # by atomics from dq_s (the writer warps)
    "dkdv only": {"only": "dkdv"},  # one kernel alone (its FLOPs: 4/7 of the pair's, 2/3 dQ's)
    "dq only": {"only": "dq"},
    "ordered": {"ordered": True},  # the deterministic fused kernel (_attention_hopper_bwd_fused)
}
D64 = {
    "fused atomics late": {"fused": {"DQ": 2, "STAGES": 4, "LATE": 1}},
    "pair pipe0": {"deterministic": True, "dkdv": {"PIPE": 0}, "dq": {"PIPE": 0}},
}
DEFAULTS = (("float16", 128), ("bfloat16", 128), ("float16", 64), ("bfloat16", 64))


# ``--spec`` labels that are not variants: SDPA's flash backward, and the public op as users
# call it (``kaio_ops.flash_attention_bwd``: its call plan, its defaults).
PEERS = ("sdpa flash", "public")


def variants(spec=None):
    """(label, dtype name, head dim, kind, overrides): every backward the steps launch, the
    default kernels first (a check cut short by its timeout still covers them); with
    ``spec`` (``--spec``'s cases), those its cases time."""
    if spec is not None:
        seen = {}
        for case in spec:
            for label, over in case["variants"].items():
                if label in PEERS:  # (no overrides of kaio's kernels)
                    continue
                kind = "old" if label == "mma.sync" else "new"
                seen[(label, case["dtype"], case["d"])] = (kind, over or {})
        return [(lab, dt, d, kind, over) for (lab, dt, d), (kind, over) in seen.items()]
    out = [("shipped", dt, d, "new", NEW["shipped"]) for dt, d in DEFAULTS]
    out += [("wgmma", dt, d, "new", {}) for dt, d in DEFAULTS]
    out += [(n, "float16", 128, "new", over) for n, over in NEW.items() if over and n != "shipped"]
    for name in ("pair", "fused atomics late", "pair pipe0", "dkdv only", "dq only"):
        out.append((name, "float16", 64, "new", D64[name] if name in D64 else NEW[name]))
    out += [("mma.sync", dt, d, "old", {}) for dt, d in DEFAULTS]
    return out


def runner(kind: str, d: int, over: dict):
    """A function (do, q, k, v, o, lse, causal) -> (dq, dk, dv) for one variant: the public
    op's own code (unplanned), with the dispatch and the configuration forced."""
    from kaio_ops import _attention_hopper_bwd as hb
    from kaio_ops import attention

    raw = (_load(over["attention"]) if "attention" in over else attention).flash_attention_bwd
    raw = raw.__wrapped__  # (unplanned; "attention": another commit's kaio_ops.attention)
    base, launch = hb.config, hb.launch

    fixed = over.get("deterministic", False)

    def run(do, q, k, v, o, lse, causal):
        if kind == "old":
            os.environ["KAIO_HOPPER_ATTENTION"] = "0"
            try:
                return raw(do, q, k, v, o, lse, causal)
            finally:
                del os.environ["KAIO_HOPPER_ATTENTION"]
        cfg = base(d)
        cfg = {key: {**cfg[key], **over.get(key, {})} for key in cfg}
        saved = (hb.config, hb.worthwhile, hb.launch, hb.FUSED)
        hb.config, hb.worthwhile = (lambda _d: cfg), (lambda *a: True)
        if not over.get("shipped"):  # the fused kernel, even where the pair is the default
            hb.FUSED = dict.fromkeys(hb.FUSED, True)
        if "only" in over:
            hb.launch = functools.partial(launch, only=over["only"])
        elif "side" in over:  # the pair's dQ kernel on a second stream (or not)
            hb.launch = functools.partial(launch, side=over["side"])
        elif not over.get("shipped"):  # the ordered fused kernel only where named
            hb.launch = functools.partial(launch, ordered=over.get("ordered", False))
        try:
            return raw(do, q, k, v, o, lse, causal, None, fixed)
        finally:
            hb.config, hb.worthwhile, hb.launch, hb.FUSED = saved

    return run


def tensors(b, h, hkv, sq, sk, d, dtype, seed=0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q, do = (torch.randn((b, h, sq, d), device="cuda", dtype=dt, generator=gen) for _ in "qo")
    k, v = (torch.randn((b, hkv, sk, d), device="cuda", dtype=dt, generator=gen) for _ in "kv")
    return q, k, v, do


def forward(q, k, v, causal):
    import kaio_ops

    return kaio_ops.flash_attention_with_stats(q, k, v, causal=causal)


def forward_sdpa(q, k, v, causal):
    """(o, lse) from torch's flash forward (natural-log lse [B, H, Sq] f32, as kaio's;
    grouped-query K/V heads repeated): no kaio forward to compile for each shape (its
    configuration depends on the shape); kaio's where torch's op is missing or refuses."""
    import torch

    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    try:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return out[0], out[1].float().contiguous()
    except (AttributeError, RuntimeError):
        return forward(q, k, v, causal)


def load_spec(path):
    """``--spec``'s cases: a JSON list of {dtype, d, b, h, hkv, s, causal: [bools], variants:
    {label: overrides ("mma.sync": the old kernels; "module", "attention": the files of
    another commit's ordered-kernel module and ``kaio_ops.attention``)}}; None without a
    path."""
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def warm_one(i: int, spec_path=None) -> str:
    import time

    import torch

    t0 = time.time()
    label, dtype, d, kind, over = variants(load_spec(spec_path))[i]
    q, k, v, do = tensors(1, 2, 2 if spec_path else 1, 256, 256, d, dtype)
    run = runner(kind, d, {x: y for x, y in over.items() if x != "module"})
    if "module" in over:
        run = _module_swapped(run, over["module"])
    for causal in (False, True):  # (the ordered kernel's schedule depends on the mask)
        o, lse = (forward_sdpa if spec_path else forward)(q, k, v, causal)  # (ab's, repeat's)
        run(do, q, k, v, o, lse, causal)
    if label == "wgmma":  # the Hopper forward the time step runs (S 4096) too
        from kaio_ops import _attention_hopper as hop
        from kaio_ops import attention

        (qa, ka, va), dims, scale = attention._check_flash("bench", q, k, v, None)
        hop.launch(qa, ka, va, dims, False, scale)
    torch.cuda.synchronize()
    return f"{label} {dtype} D{d}: {time.time() - t0:.1f}s"


def warm_table_one(i: int) -> str:
    """Compile what ``table``'s case i (of its dtypes x head dims x masks) launches: the
    public forward and backward once at B2 H16 S1024 (whose dispatch matches the table's)."""
    import time

    import torch

    import kaio_ops

    t0 = time.time()
    dtype, d, causal = [(t, d, c) for t in ("float16", "bfloat16") for d in (64, 128, 256)
                        for c in (False, True)][i]  # fmt: skip
    q, k, v, do = tensors(2, 16, 16, 1024, 1024, d, dtype)
    o, lse = forward(q, k, v, causal)
    kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal)
    torch.cuda.synchronize()
    return f"table {dtype} D{d} causal={causal}: {time.time() - t0:.1f}s"


def _scores64(q64, k64, v64, causal):
    """The float64 scores (grouped-query K/V heads repeated; causal: key <= query) and V."""
    import torch

    g = q64.shape[1] // k64.shape[1]
    k64, v64 = (x.repeat_interleave(g, dim=1) for x in (k64, v64))
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q64.shape[-1])
    if causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, -math.inf)
    return s, v64


def reference(q, k, v, do, causal):
    """(dq, dk, dv) in float64 by autograd over the explicit softmax."""
    import torch

    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    s, v64 = _scores64(*leaves, causal)
    (torch.softmax(s, -1) @ v64).backward(do.double())
    return [x.grad for x in leaves]


def forward_ref(q, k, v, causal):
    """(o, lse) in float64 by the explicit softmax (o rounded to q's type, lse f32): small
    cases, with no forward kernel to compile (``tiny``, under compute-sanitizer)."""
    import torch

    with torch.no_grad():
        s, v64 = _scores64(q.double(), k.double(), v.double(), causal)
        o = (torch.softmax(s, -1) @ v64).to(q.dtype)
        return o, torch.logsumexp(s, -1).float().contiguous()


def check(out_path, spec=None):
    import torch

    import kaio_ops
    from kaio_ops import _attention_hopper_bwd as hb
    from kaio_ops import attention

    shapes = [  # b, h, hkv, sq, sk
        (2, 8, 8, 1024, 1024),
        (2, 8, 2, 1024, 2048),  # grouped-query, Sq < Sk
        (1, 4, 2, 300, 700),  # partial tiles of queries and keys, Sq < Sk
        (1, 2, 1, 640, 256),  # Sq > Sk
    ]
    rows, refs = [], {}
    for label, dtype, d, kind, over in variants(spec):
        run = runner(kind, d, over)
        if "only" in over:  # the other kernel's outputs are left unwritten
            continue
        for b, h, hkv, sq, sk in shapes:
            if label not in ("wgmma", "shipped", "ordered") and sq != 1024:
                continue
            for causal in (False, True):
                key = (dtype, d, b, h, hkv, sq, sk, causal)
                if key not in refs:
                    q, k, v, do = tensors(b, h, hkv, sq, sk, d, dtype, seed=sq + d)
                    o, lse = forward(q, k, v, causal)
                    refs[key] = (q, k, v, do, o, lse, reference(q, k, v, do, causal))
                q, k, v, do, o, lse, ref = refs[key]
                grads = run(do, q, k, v, o, lse, causal)
                errs = [
                    (torch.linalg.norm(g.double() - r) / torch.linalg.norm(r)).item()
                    for g, r in zip(grads, ref, strict=True)
                ]
                again = run(do, q, k, v, o, lse, causal)
                same = all(torch.equal(x, y) for x, y in zip(grads, again, strict=True))
                finite = all(bool(torch.isfinite(g).all()) for g in grads)
                row = dict(variant=label, dtype=dtype, d=d, b=b, h=h, hkv=hkv, sq=sq, sk=sk,
                           causal=causal, dq=errs[0], dk=errs[1], dv=errs[2], same_bits=same,
                           finite=finite)  # fmt: skip
                emit(rows, row)
    # the public op takes the new kernels where it should, with the same bits
    q, k, v, do = tensors(2, 8, 2, 1024, 1024, 128, "float16", seed=3)
    o, lse = forward(q, k, v, True)
    (qa, _, _), dims, _ = attention._check_flash("bench", q, k, v, None)
    takes = attention.hopper_takes(qa, dims, hb)
    op = kaio_ops.flash_attention_bwd(do, q, k, v, o, lse, causal=True, deterministic=True)
    direct = runner("new", 128, NEW["pair"])(do, q, k, v, o, lse, True)
    same = all(torch.equal(x, y) for x, y in zip(op, direct, strict=True))
    emit(rows, dict(variant="dispatch", takes=takes, same_bits_as_direct=same))
    save(rows, out_path)


def tiny() -> None:
    """The pair (the default) and the fused kernel once per case at small sizes (f16, D 128
    and 64, causal and not, partial tiles, grouped-query heads), checked: for
    compute-sanitizer (``TINY=pair``: the pair alone; ``TINY=one``: the pair at D 128,
    causal; ``TINY=ordered``: the deterministic fused kernel at D 128, not causal, or with
    ``TINY_OVER`` (JSON: its ``ordered_config`` overrides), ``TINY_D`` (64, 128 or 64,128)
    and ``TINY_CAUSAL`` (0, 1 or 0,1))."""
    import torch

    cases = [("float16", 128, NEW["pair"]), ("float16", 64, NEW["pair"]), ("float16", 128, {}),
             ("float16", 64, {})]  # fmt: skip
    if os.environ.get("TINY") == "pair":  # the shipped kernels alone (a shorter sanitizer run)
        cases = cases[:2]
    masks = (False, True)
    if os.environ.get("TINY") == "ordered":  # the deterministic fused kernel, D 128 (SCHED 4)
        over = json.loads(os.environ.get("TINY_OVER", "null")) or True  # (its overrides)
        dims = [int(x) for x in os.environ.get("TINY_D", "128").split(",")]
        cases = [("float16", d, {"ordered": over}) for d in dims]
        masks = [bool(int(x)) for x in os.environ.get("TINY_CAUSAL", "0").split(",")]
    if os.environ.get("TINY") == "one":  # the shipped kernels at D 128, causal: the shortest
        cases, masks = cases[:1], (True,)
    for dtype, d, over in cases:
        run = runner("new", d, over)
        for causal in masks:
            q, k, v, do = tensors(1, 4, 2, 200, 300, d, dtype)
            o, lse = forward_ref(q, k, v, causal)
            grads = run(do, q, k, v, o, lse, causal)
            ref = reference(q, k, v, do, causal)
            errs = [
                (torch.linalg.norm(g.double() - r) / torch.linalg.norm(r)).item()
                for g, r in zip(grads, ref, strict=True)
            ]
            print(f"tiny {dtype} D{d} {over} causal={causal}: rel {errs}", flush=True)


def repeat(out_path, spec=None) -> None:
    """Determinism at real sizes: each variant of ``spec`` (default: the ordered fused kernel,
    the pair and the unordered fused kernel, f16 D 128) ``runs`` times on its cases' inputs
    (B, H, Hkv, S, both masks; ``RUNS``, default 5), the number of distinct bit patterns of
    dq, dk and dv (1: deterministic) and dq's largest difference from the first run."""
    import torch

    runs = int(os.environ.get("RUNS", "5"))
    spec = spec or [{"dtype": "float16", "d": 128, "b": 4, "h": 16, "hkv": 16, "s": 4096,
                     "variants": {"ordered": NEW["ordered"], "pair": NEW["pair"],
                                  "wgmma": {}}}]  # fmt: skip
    by = {(lab, dt, d): (kind, over) for lab, dt, d, kind, over in variants(spec)}
    rows = []
    for c in spec:
        q, k, v, do = tensors(c["b"], c["h"], c["hkv"], c["s"], c["s"], c["d"], c["dtype"])
        for causal in c.get("causal", [False, True]):
            o, lse = forward_sdpa(q, k, v, causal)
            for lab in c["variants"]:
                kind, over = by[(lab, c["dtype"], c["d"])]
                run = runner(kind, c["d"], over)
                first = [g.clone() for g in run(do, q, k, v, o, lse, causal)]
                distinct = [1, 1, 1]
                seen = [[x] for x in first]
                diff = 0.0
                for _ in range(runs - 1):
                    grads = run(do, q, k, v, o, lse, causal)
                    for j, g in enumerate(grads):
                        if not any(torch.equal(g, x) for x in seen[j]):
                            seen[j].append(g.clone())
                            distinct[j] += 1
                    diff = max(diff, (grads[0].float() - first[0].float()).abs().max().item())
                emit(rows, dict(variant=lab, dtype=c["dtype"], d=c["d"], b=c["b"], h=c["h"],
                                hkv=c["hkv"], s=c["s"], causal=causal, runs=runs,
                                distinct_dq_dk_dv=distinct, dq_max_diff=diff))  # fmt: skip
    save(rows, out_path)


# ``ab``'s cases without ``--spec``: the shipped backward (the ordered fused kernel, its
# heads interleaved in the launch order) against the same kernel launched key block by key
# block (``HG`` 1) and SDPA flash, f16 and bf16, D 64 and 128, S 1024 (B16), 4096 (B4) and
# 16384 (B1), H16, both masks.
AB_SPEC = [
    {"dtype": dt, "d": d, "b": b, "h": 16, "hkv": 16, "s": s,
     "variants": {"shipped": {"shipped": True}, "hg 1": {"ordered": {"HG": 1}}, "sdpa flash": {}}}
    for s, b in ((4096, 4), (1024, 16), (16384, 1)) for d in (128, 64)
    for dt in ("float16", "bfloat16")
]  # fmt: skip


@functools.cache
def _load(path):
    """The module in file ``path`` (another commit's copy of a kaio_ops module), loaded once
    under a name of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"ab_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _module_swapped(run, path):
    """``run`` with ``kaio_ops._attention_hopper_bwd_fused`` replaced by the module in file
    ``path`` (another commit's copy, for an A/B of the two in one process)."""
    import importlib

    import kaio_ops

    mod = _load(path)
    name = "kaio_ops._attention_hopper_bwd_fused"

    def swapped(*a):
        saved = importlib.import_module(name)
        sys.modules[name] = kaio_ops._attention_hopper_bwd_fused = mod
        try:
            return run(*a)
        finally:
            sys.modules[name] = kaio_ops._attention_hopper_bwd_fused = saved

    return swapped


def ab(out_path, spec) -> None:
    """Interleaved A/B: each case of ``spec`` (``load_spec``'s, default ``AB_SPEC``; a
    variant's overrides may name ``"module"``: the ordered kernel's module from that file;
    ``"sdpa flash"``: SDPA's flash backward) times every variant in turn for ``ROUNDS``
    rounds (default 5, the order rotated each round) of ``REPS`` calls (default 4) with
    CUDA events, on o and lse from torch's flash forward (``forward_sdpa``): TFLOP/s of the
    median round and of the best, and each variant's dq, dk, dv against the first
    variant's (largest difference over the first's largest value). ``QUEUED`` 1: each
    round's calls queued behind a GPU sleep (``time_queued``: the GPU's time alone, no
    host lead in the window)."""
    import torch

    import kaio_ops  # noqa: F401  (the fused module's package, for _module_swapped)

    rounds, reps = int(os.environ.get("ROUNDS", "5")), int(os.environ.get("REPS", "4"))
    queued = os.environ.get("QUEUED") == "1"
    spec = spec or AB_SPEC
    by = {(lab, dt, d): (kind, over) for lab, dt, d, kind, over in variants(spec)}
    rows = []
    name = torch.cuda.get_device_name()
    for c in spec:
        b, h, hkv, s, d, dtype = c["b"], c["h"], c["hkv"], c["s"], c["d"], c["dtype"]
        inputs = tensors(b, h, hkv, s, s, d, dtype)
        for causal in c.get("causal", [False, True]):
            flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            fns = _variant_calls(c, causal, by, inputs)
            times = {lab: [] for lab in fns}
            first, diff = None, {}
            for lab, fn in list(fns.items()):
                try:
                    grads = [g.float() for g in fn()]
                except Exception as e:  # noqa: BLE001  (one variant's failure: the others run)
                    print(f"FAILED {lab} {dtype} D{d}: {type(e).__name__}: {e}", flush=True)
                    del fns[lab], times[lab]
                    continue
                first = first or grads  # each variant's dq, dk, dv against the first's
                diff[lab] = _differences(grads, first)
            torch.cuda.synchronize()
            labs = list(fns)
            for r in range(rounds):
                for lab in labs[r % len(labs) :] + labs[: r % len(labs)]:
                    fn = fns[lab]
                    ms = time_queued(fn, reps) if queued else time_calls(fn, reps=reps, rounds=1)
                    times[lab].append(ms)
            tf = {lab: flops / sorted(t)[len(t) // 2] / 1e9 for lab, t in times.items()}
            best = {lab: flops / min(t) / 1e9 for lab, t in times.items()}
            emit(rows, dict(gpu=name, dtype=dtype, d=d, b=b, h=h, hkv=hkv, s=s, causal=causal,
                            tflops=tf, best=best, diff=diff))  # fmt: skip
    save(rows, out_path)
    print(f"\n{name}: backward TFLOP/s, interleaved (median of {rounds} rounds of {reps}"
          f"{', queued' if queued else ''}; the largest difference from the first variant's"
          " gradients)")  # fmt: skip
    for r in rows:
        cells = "  ".join(f"{k} {v:.0f} ({max(r['diff'][k]):.0e})" for k, v in r["tflops"].items())
        print(
            f"{r['dtype']:>8} D{r['d']} B{r['b']} S{r['s']}{' causal' if r['causal'] else ''}:"
            f" {cells}"
        )


def _differences(grads: list, first: list) -> list:
    """The largest difference of each gradient from the first variant's, over the largest
    value of the first's."""
    return [(g - f).abs().max().item() / f.abs().max().item()
            for g, f in zip(grads, first, strict=True)]  # fmt: skip


def _variant_calls(c: dict, causal: bool, by: dict, tensors_: tuple) -> dict:
    """{label: a call of that variant of ``--spec``'s case c} on the inputs ``tensors_``
    (q, k, v, do; o and lse from ``forward_sdpa``); ``PEERS``: SDPA's flash backward, the
    public op."""
    import torch

    from bench.attention_hopper import sdpa_flash

    q, k, v, do = tensors_
    o, lse = forward_sdpa(q, k, v, causal)
    fns = {}
    for lab in c["variants"]:
        if lab == "sdpa flash":
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            out = sdpa_flash(*leaves, causal)
            fns[lab] = functools.partial(torch.autograd.grad, out, leaves, do, retain_graph=True)
            continue
        if lab == "public":
            import kaio_ops

            fns[lab] = functools.partial(kaio_ops.flash_attention_bwd, do, q, k, v, o, lse, causal)
            continue
        kind, over = by[(lab, c["dtype"], c["d"])]
        run = runner(kind, c["d"], {x: y for x, y in over.items() if x != "module"})
        if "module" in over:
            run = _module_swapped(run, over["module"])
        fns[lab] = functools.partial(run, do, q, k, v, o, lse, causal)
    return fns


@contextlib.contextmanager
def _launches_timed(log: list):
    """Within it, every kaio kernel launch appends (kernel name, start event, end event) to
    ``log``: CUDA events recorded on torch's current stream around the launch (the ops launch
    on it), so that ``elapsed_time`` is that kernel's GPU time."""
    import torch

    from kaio.kernel import Kernel

    index = Kernel.__getitem__

    def timed_index(kernel, config):
        launch = index(kernel, config)

        def timed(*args, **kwargs):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            launch(*args, **kwargs)
            end.record()
            log.append((kernel.__name__, start, end))

        return timed

    Kernel.__getitem__ = timed_index
    try:
        yield
    finally:
        Kernel.__getitem__ = index


def kernels(out_path, spec) -> None:
    """Each kernel's GPU time a call (µs; CUDA events around each launch, ``_launches_timed``,
    the median over ``CALLS`` calls, default 7, after one, each queued behind a GPU sleep:
    the GPU's own time, no host gaps) for every variant of ``spec``'s cases, their sum, and
    the whole call's (events around it; SDPA flash: the call only), with the largest
    difference of its gradients from the first variant's: where the time goes (the
    preprocessing, the zeroing, the main kernel, the dQ conversion)."""
    import statistics

    import torch

    calls = int(os.environ.get("CALLS", "7"))
    by = {(lab, dt, d): (kind, over) for lab, dt, d, kind, over in variants(spec)}
    rows = []
    for c in spec:
        b, h, hkv, s, d, dtype = c["b"], c["h"], c["hkv"], c["s"], c["d"], c["dtype"]
        inputs = tensors(b, h, hkv, s, s, d, dtype)
        for causal in c.get("causal", [False, True]):
            first = None
            for lab, fn in _variant_calls(c, causal, by, inputs).items():
                grads = [g.float() for g in fn()]
                first = first or grads
                diff = max(_differences(grads, first))
                torch.cuda.synchronize()
                per, whole = {}, []
                for _ in range(calls):
                    log = []
                    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    torch.cuda._sleep(SLEEP_CYCLES)  # (the launches queue up behind it)
                    with _launches_timed(log):
                        start.record()
                        fn()
                        end.record()
                    end.synchronize()
                    whole.append(start.elapsed_time(end) * 1e3)
                    for i, (name, e0, e1) in enumerate(log):
                        per.setdefault(f"{i} {name}", []).append(e0.elapsed_time(e1) * 1e3)
                us = {k: round(statistics.median(v), 1) for k, v in per.items()}
                emit(rows, dict(variant=lab, dtype=dtype, d=d, b=b, h=h, hkv=hkv, s=s,
                                causal=causal, call_us=round(statistics.median(whole), 1),
                                diff=diff, kernels_us=us))  # fmt: skip
    save(rows, out_path)
    for r in rows:
        cells = ", ".join(f"{k} {v:.1f}" for k, v in r["kernels_us"].items())
        print(
            f"{r['variant']} {r['dtype']} D{r['d']} B{r['b']} S{r['s']}"
            f"{' causal' if r['causal'] else ''}: call {r['call_us']:.0f} us ({r['diff']:.0e}),"
            f" kernels {sum(r['kernels_us'].values()):.0f} = {cells}"
        )


def one() -> None:
    """One call of the default kernels, f16 H16 D128, B1 S4096 (for Nsight Compute; ``ONE``:
    the name of another variant of ``NEW``; ``ONE_D``: the head dim; ``ONE_OVER``: JSON
    overrides of the ordered kernel's configuration, with ``ONE`` "ordered"; ``ONE_B``,
    ``ONE_S``: the batch and sequence length; ``ONE_CAUSAL`` 1: the mask; o and lse from
    torch's flash forward)."""
    import torch

    d = int(os.environ.get("ONE_D", "128"))
    b, s = int(os.environ.get("ONE_B", "1")), int(os.environ.get("ONE_S", "4096"))
    causal = os.environ.get("ONE_CAUSAL") == "1"
    over = NEW[os.environ.get("ONE", "wgmma")]
    if "ONE_OVER" in os.environ:
        over = {**over, "ordered": json.loads(os.environ["ONE_OVER"])}
    q, k, v, do = tensors(b, 16, 16, s, s, d, "float16")
    o, lse = forward_sdpa(q, k, v, causal)
    runner("new", d, over)(do, q, k, v, o, lse, causal)
    torch.cuda.synchronize()


def bench(out_path, check_log=None, quick=False, spec=None):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    cases = [  # dtype, d, b, h, hkv, s, variants ("shipped": flash_attention_bwd's default)
        ("float16", 128, 4, 16, 16, 4096, list(NEW) + ["mma.sync"]),  # "only": kernel ms
        ("bfloat16", 128, 4, 16, 16, 4096, ["shipped", "wgmma", "mma.sync"]),
        (
            "float16",
            64,
            4,
            16,
            16,
            4096,
            ["shipped", "wgmma", *D64, "dkdv only", "dq only", "mma.sync"],
        ),  # fmt: skip
        ("float16", 128, 1, 16, 16, 16384, ["shipped", "wgmma", "mma.sync"]),
        ("float16", 128, 2, 16, 16, 8192, ["shipped", "mma.sync"]),
        ("float16", 128, 8, 16, 16, 2048, ["shipped", "mma.sync"]),
        ("float16", 128, 16, 16, 16, 1024, ["shipped", "dkdv only", "dq only", "mma.sync"]),
        ("float16", 128, 32, 16, 16, 512, ["shipped", "dkdv only", "dq only", "mma.sync"]),
        ("float16", 128, 4, 32, 8, 4096, ["shipped", "mma.sync"]),
        ("bfloat16", 64, 4, 16, 16, 4096, ["shipped", "mma.sync"]),
    ]
    if quick:
        cases = cases[:3]
    if spec is not None:
        cases = [(c["dtype"], c["d"], c["b"], c["h"], c["hkv"], c["s"], list(c["variants"]),
                  c.get("causal", [False, True])) for c in spec]  # fmt: skip
    else:
        cases = [(*c, [False, True]) for c in cases]
    by = {(lab, dt, d): (kind, over) for lab, dt, d, kind, over in variants(spec)}
    ok = None
    if check_log and os.path.exists(check_log):
        ok = {(r["variant"], r["dtype"], r["d"]) for r in map(json.loads, _json_lines(check_log))}
    rows = []
    name = torch.cuda.get_device_name()
    for dtype, d, b, h, hkv, s, names, causals in cases:
        q, k, v, do = tensors(b, h, hkv, s, s, d, dtype)
        for causal in causals:
            flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            o, lse = forward_sdpa(q, k, v, causal)
            res, times = {}, {}
            for lab in names:
                kind, over = by[(lab, dtype, d)]
                checked = "wgmma" if "only" in over else lab
                if kind == "new" and ok is not None and (checked, dtype, d) not in ok:
                    continue
                run = runner(kind, d, over)
                try:
                    ms = time_calls(lambda run=run, a=(do, q, k, v, o, lse, causal): run(*a))
                except Exception as e:  # noqa: BLE001  (one variant's failure: the others run)
                    print(f"FAILED {lab} {dtype} D{d}: {type(e).__name__}: {e}", flush=True)
                    continue
                res[lab] = flops / ms / 1e9
                times[lab] = ms
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = sdpa(*leaves, is_causal=causal, enable_gqa=h != hkv)
            ms = time_calls(
                lambda out=out, do=do, leaves=leaves: torch.autograd.grad(
                    out, leaves, do, retain_graph=True
                )
            )
            res["sdpa flash"] = flops / ms / 1e9
            times["sdpa flash"] = ms
            del out, leaves
            row = dict(gpu=name, dtype=dtype, d=d, b=b, h=h, hkv=hkv, s=s, causal=causal,
                       tflops=res, ms=times)  # fmt: skip
            emit(rows, row)
    save(rows, out_path)
    print(f"\n{name}: backward TFLOP/s (2.5x forward FLOPs; CUDA events, median of 3 x 6)")
    for r in rows:
        t = r["tflops"]
        ours = t.get("shipped", t.get("wgmma", math.nan))  # flash_attention_bwd's default
        ratio = ours / t["sdpa flash"]
        ratio_old = ours / t.get("mma.sync", math.nan)
        cells = "  ".join(f"{k} {v:.0f}" for k, v in t.items())
        print(f"{r['dtype']:>8} D{r['d']} B{r['b']} H{r['h']}/{r['hkv']} S{r['s']}"
              f"{' causal' if r['causal'] else ''}: {cells}  (kaio/sdpa {ratio:.2f}, "
              f"kaio/mma.sync {ratio_old:.2f})")  # fmt: skip


def table(out_path, dims=(64, 128, 256), seqs=(4096, 1024, 16384)) -> None:
    """``flash_attention_bwd`` as shipped (the public op: its dispatch, its defaults) against
    SDPA's flash backward, f16 and bf16, head dims ``dims``, causal and not, H16 at S 1024
    (B16), 4096 (B4) and 16384 (B1): TFLOP/s (2.5x the forward's FLOPs, halved when causal)
    and ms, with CUDA events (the median of 3 rounds of 3 calls); ``seqs``: the sequence
    lengths of those three to run."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    import kaio_ops

    rows = []
    name = torch.cuda.get_device_name()
    for s, b in [(s, b) for s, b in ((4096, 4), (1024, 16), (16384, 1)) if s in seqs]:
        for d in dims:
            for dtype in ("float16", "bfloat16"):
                q, k, v, do = tensors(b, 16, 16, s, s, d, dtype)
                for causal in (False, True):
                    flops = 2.5 * 4 * b * 16 * s * s * d / (2 if causal else 1)
                    o, lse = forward(q, k, v, causal)
                    ms = time_calls(
                        lambda a=(do, q, k, v, o, lse, causal): kaio_ops.flash_attention_bwd(*a),
                        reps=3,
                    )
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        out = sdpa(*leaves, is_causal=causal)
                    ref = time_calls(
                        lambda out=out, leaves=leaves, do=do: torch.autograd.grad(
                            out, leaves, do, retain_graph=True
                        ),
                        reps=3,
                    )
                    del out, leaves
                    row = dict(gpu=name, dtype=dtype, d=d, b=b, s=s, causal=causal,
                               kaio_ms=ms, sdpa_ms=ref, kaio=flops / ms / 1e9,
                               sdpa=flops / ref / 1e9, ratio=ref / ms)  # fmt: skip
                    emit(rows, row)
    save(rows, out_path)


def _json_lines(path):
    return [line for line in open(path) if line.startswith("{") and '"dtype"' in line]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "step",
        choices=("warm", "check", "time", "tiny", "one", "table", "repeat", "ab", "kernels"),
    )
    p.add_argument("--out")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="time: the first three cases only")
    p.add_argument("--check-log", help="time: only the variants this check output reached")
    p.add_argument("--dims", default="64,128,256", help="table: the head dims (comma-separated)")
    p.add_argument("--seqs", default="4096,1024,16384", help="table: the sequence lengths")
    p.add_argument(
        "--spec",
        help="warm, time: the cases of this JSON file (load_spec); "
        "warm --spec table: what the table step launches",
    )
    args = p.parse_args()
    if args.step == "warm":
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
            if args.spec == "table":  # what the table step launches
                futures = [pool.submit(warm_table_one, i) for i in range(12)]
            else:
                n = len(variants(load_spec(args.spec)))
                futures = [pool.submit(warm_one, i, args.spec) for i in range(n)]
            for f in futures:
                try:
                    print(f.result(timeout=120), flush=True)
                except Exception as e:  # noqa: BLE001  (report each specialization's failure)
                    print(f"FAILED: {type(e).__name__}: {e}", flush=True)
    elif args.step == "check":
        check(args.out, load_spec(args.spec))
    elif args.step == "tiny":
        tiny()
    elif args.step == "repeat":
        repeat(args.out, load_spec(args.spec))
    elif args.step == "ab":
        ab(args.out, load_spec(args.spec))
    elif args.step == "kernels":
        kernels(args.out, load_spec(args.spec))
    elif args.step == "one":
        one()
    elif args.step == "table":
        seqs = [int(x) for x in args.seqs.split(",")]
        table(args.out, tuple(int(x) for x in args.dims.split(",")), seqs)
    else:
        bench(args.out, args.check_log, args.quick, load_spec(args.spec))


if __name__ == "__main__":
    main()
