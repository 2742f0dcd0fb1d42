"""The Hopper flash-attention forward (``kaio_ops._attention_hopper``, wgmma + TMA) against
the mma.sync one (``kaio_ops._attention_tc``) and torch SDPA's flash backend, in one run, on
an sm_90 GPU. Three steps, each its own process so that one stuck kernel cannot take the
others' results:

- ``warm --jobs N``: compile every specialization the other steps launch, N processes at a
  time (each launches its kernel once at a small size; the cubins land in the disk cache).
- ``check``: each variant against SDPA in float64 (f16 and bf16, D 64/128/256, causal and
  not, grouped-query heads, Sq != Sk), the relative error of the output and the largest
  error of the row logsumexp; then the same bits on a second run.
- ``time``: TFLOP/s (4 * B * H * Sq * Sk * D, halved when causal) with CUDA events, the
  median of several rounds of back-to-back calls, every contender in the same process.

- ``grid --specs "D/dtype/K=V,...;..." [--shapes "B,H,HKV,S;..."]``: any configurations
  (``parse_specs``; ``default`` for the routed one, ``old`` for the mma.sync kernel;
  ``BASE=n`` a copy of the module at ``$ATTN_BASE`` or ``$ATTN_BASE<n>``, ``NOCHECK=1`` a
  diagnostic timed whatever its check says, ``ROUTED=1`` the other keys over the routed
  configuration rather than over ``config``'s), compiled N processes at a time, checked
  against float64 on two small cases, then timed beside SDPA flash in interleaved rounds,
  causal and not: 4 calls queued behind a GPU sleep (``time_queued``: kernel time, the
  table's figure) and, in brackets, 4 calls as they come (``time_calls``' window, which
  also holds the first call's host time).
- ``tiny``: the default kernel on a few small cases, and persistent variants (for
  compute-sanitizer; ``tiny-warm --jobs N`` compiles them first, N processes at a time).
- ``one --variant LABEL [--d D] [--causal]``: one variant three times at B4 H16 S4096 (for a
  profiler).

Usage: ``python bench/attention_hopper.py {warm,check,time,tiny,one,grid} [--out FILE.json]
[--ptxas PATH]`` (``--ptxas``: cubins built by that ptxas, not the driver's JIT).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NEW = {  # name: the config over _attention_hopper.config's (the default: "wgmma")
    "wgmma": {},
    "pipe0": {"PIPE": 0, "PERSIST": 0},  # the plain order, a tile a block
    "pipe0 persist": {"PIPE": 0, "PERSIST": 1},
    "pipe1": {"PIPE": 1, "PERSIST": 0},  # the softmax under P V, O rescaled after it
    "pipe1 persist": {"PIPE": 1, "PERSIST": 1},
    "pipe1 pairs": {"PIPE": 1, "PERSIST": 3},  # pairs of query tiles (causal)
    "pipe3": {"PIPE": 3, "PERSIST": 0},  # FlashAttention-3's order
    "pipe3 persist": {"PIPE": 3, "PERSIST": 1},
    "pipe4 persist": {"PIPE": 4, "PERSIST": 1},  # and ping-pong
    "wg2": {"WG": 2, "REGS": 240},
    "precise": {"precise": True},  # without fastmath (ex2.approx.f32, not .ftz)
}
D128 = ["wgmma", "pipe0", "pipe0 persist", "pipe1", "pipe1 persist", "pipe1 pairs", "pipe3",
        "pipe3 persist", "pipe4 persist"]  # fmt: skip
D64 = ["wgmma", "wg2", "pipe1", "pipe3 persist"]
D256 = ["wgmma", "pipe0", "pipe1", "pipe3"]
BF16 = ["wgmma", "pipe4 persist"]
BEST = ["wgmma", "pipe1", "pipe3 persist"]  # the other shapes


def variants():
    """(label, dtype name, head dim, kind, config): every kernel the steps launch."""
    out = [(name, "float16", 128, "new", NEW[name]) for name in dict.fromkeys(D128 + BEST)]
    out += [(name, "bfloat16", 128, "new", NEW[name]) for name in BF16]
    out += [(name, "float16", 64, "new", NEW[name]) for name in D64]
    out += [(name, "float16", 256, "new", NEW[name]) for name in D256]
    for dt, d in (("float16", 128), ("bfloat16", 128), ("float16", 64), ("float16", 256)):
        out.append(("mma.sync", dt, d, "old", {}))
    return out


_PRECISE = []


def precise_kernel():
    """``attention_fwd_wgmma`` without fastmath (one kernel object: its specializations are
    kept with it)."""
    if not _PRECISE:
        import kaio
        from kaio_ops import _attention_hopper as hop

        _PRECISE.append(kaio.gpu_kernel(hop.attention_fwd_wgmma.pyfunc))
    return _PRECISE[0]


_BASE = {}


def base_module(n: int = 1):
    """The module that ``BASE=n`` variants run: a copy of ``_attention_hopper.py`` (another
    branch's, or a patched one, for an A/B in one process) at the path ``$ATTN_BASE`` names
    (n 1) or ``$ATTN_BASE<n>``."""
    if n not in _BASE:
        import importlib.util

        path = os.environ["ATTN_BASE" if n == 1 else f"ATTN_BASE{n}"]
        spec = importlib.util.spec_from_file_location(f"kaio_ops._attention_hopper_base{n}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _BASE[n] = mod
    return _BASE[n]


def runner(kind: str, d: int, over: dict):
    """A function (q, k, v, causal) -> (out, lse) for one variant (``BASE`` 1: of
    ``base_module``'s kernel)."""
    from kaio_ops import _arrays, attention
    from kaio_ops import _attention_hopper as hop

    over = dict(over)
    over.pop("NOCHECK", 0)  # (``grid``'s)
    base = over.pop("BASE", 0)
    routed = over.pop("ROUTED", 0)
    if base:
        hop = base_module(base)

    def run(q, k, v, causal):
        (qa, ka, va), dims, scale = attention._check_flash("bench", q, k, v, None)
        if kind == "old":
            dp = attention._pow2_dim(d, attention.FLASH_DIMS)
            return attention.tc_forward(qa, ka, va, qa.dtype, qa.shape, dims, causal, scale, dp)
        cfg = {**hop.config(d, causal), **over} if over else None  # None: as launch routes
        if routed:  # ``over`` on top of the routed configuration (``extras``'s too)
            many = dims[0] * -(-dims[3] // 128) >= hop.MANY_TILES * _arrays.multiprocessors(qa)
            cfg = {**hop.config(d, causal), **hop.extras(d, causal, qa.dtype, dims[4], many),
                   **over}  # fmt: skip
        kernel = precise_kernel() if cfg and cfg.pop("precise", False) else None
        return hop.launch(qa, ka, va, dims, causal, scale, cfg, kernel)

    return run


def tensors(b, h, hkv, sq, sk, d, dtype, seed=0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn((b, h, sq, d), device="cuda", dtype=dt, generator=gen)
    k = torch.randn((b, hkv, sk, d), device="cuda", dtype=dt, generator=gen)
    v = torch.randn((b, hkv, sk, d), device="cuda", dtype=dt, generator=gen)
    return q, k, v


def warm_one(i: int, specs: str | None = None) -> str:
    """Compile variant ``i`` (of ``variants()``, or of ``parse_specs(specs)``) by launching it
    once at a small size, causal and not; returns a line with its compile time."""
    import time

    t0 = time.time()
    label, dtype, d, kind, over = (parse_specs(specs) if specs else variants())[i]
    for sk in (512, 2048) if d == 128 else (512,):  # (``extras`` routes by the keys at D128)
        q, k, v = tensors(1, 2, 1, 512, sk, d, dtype)
        for causal in (False, True):  # the default's configuration may depend on the mask
            runner(kind, d, over)(q, k, v, causal)
    import torch

    torch.cuda.synchronize()
    res = ""
    if kind == "new" and "precise" not in over:  # the driver's registers and local bytes
        import kaio
        from kaio_ops import _attention_hopper as hop

        over = dict(over)
        over.pop("NOCHECK", 0)
        base = over.pop("BASE", 0)
        if base:
            hop = base_module(base)
        dt = kaio.f16 if dtype == "float16" else kaio.bf16
        # the kernel launched above (without the mask, 512 keys: launch's merge)
        routed = hop.extras(d, False, dt) if base else hop.extras(d, False, dt, 512)
        launched = {**hop.config(d), **over} if over else {**hop.config(d), **routed}
        cfg = {**hop.EXTRAS_OFF, **routed, **launched}
        cfg.pop("SECTION", None)  # launch's, not the kernel's
        r = hop.attention_fwd_wgmma.resources(D=d, DT=dt, **cfg)
        res = f" (registers {r.registers}, local bytes {r.local_bytes})"
    return f"{label} {dtype} D{d}: {time.time() - t0:.1f}s{res}"


def parse_specs(specs: str) -> list:
    """Variants from ``D/dtype/K=V,K=V;...`` (dtype f16 or bf16; ``old`` for the mma.sync
    kernel, ``default`` for ``config``'s choice): (label, dtype name, d, kind, config)."""
    out = []
    for spec in specs.split(";"):
        d, dt, cfg = spec.strip().split("/")
        dtype = {"f16": "float16", "bf16": "bfloat16"}[dt]
        if cfg == "old":
            out.append((spec.strip(), dtype, int(d), "old", {}))
            continue
        over = {} if cfg == "default" else {
            k: int(v) for k, v in (kv.split("=") for kv in cfg.split(","))
        }  # fmt: skip
        out.append((spec.strip(), dtype, int(d), "new", over))
    return out


def reference(q, k, v, causal):
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    g = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(g, dim=1).double() for x in (k, v))
    q = q.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(
            ~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), -math.inf
        )
    return sdpa(q, k, v, is_causal=causal), torch.logsumexp(s, -1)


def check(out_path):
    import torch

    shapes = [  # b, h, hkv, sq, sk
        (1, 4, 4, 1024, 1024),
        (2, 8, 2, 512, 500),  # grouped-query, a partial last key tile
        (1, 4, 1, 300, 768),  # Sq != Sk, a query tail
        (1, 2, 2, 1000, 256),  # Sq > Sk
    ]
    rows, refs = [], {}
    for label, dtype, d, kind, over in variants():
        if kind == "old":  # tested by tests/test_ops_attention.py
            continue
        run = runner(kind, d, over)
        for b, h, hkv, sq, sk in shapes:
            if d != 128 and (b, h) != (2, 8) and sq != 300:
                continue
            if label not in ("wgmma", "mma.sync") and (b, h) != (2, 8) and sq != 300:
                continue  # the variants on two shapes: the round's time is short
            for causal in (False, True):
                key = (dtype, d, b, h, hkv, sq, sk, causal)
                if key not in refs:
                    q, k, v = tensors(b, h, hkv, sq, sk, d, dtype, seed=sq + d)
                    refs[key] = (q, k, v, *reference(q, k, v, causal))
                q, k, v, ref, ref_lse = refs[key]
                try:
                    out, lse = run(q, k, v, causal)
                except Exception as e:  # noqa: BLE001  (one variant's failure, the others go on)
                    print(f"FAILED {label} {dtype} D{d}: {type(e).__name__}: {e}", flush=True)
                    break
                err = (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()
                lse_err = (lse.double() - ref_lse).abs().max().item()
                again = torch.equal(run(q, k, v, causal)[0], out)
                finite = bool(torch.isfinite(out).all())
                row = dict(variant=label, dtype=dtype, d=d, b=b, h=h, hkv=hkv, sq=sq, sk=sk,
                           causal=causal, rel=err, lse_err=lse_err, same_bits=again,
                           finite=finite)  # fmt: skip
                emit(rows, row)
    save(rows, out_path)


D64_COUNTER = {"PERSIST": 4, "QB": 2, "STAGES": 3, "SECTION": 2, "ONES": 1, "OV": 1}
TINY = [  # (d, causal, sk, config over the routed one, persistent blocks or None[, q's scale])
    (128, False, 300, {}, None),  # the routed kernels, a partial last key tile, GQA
    (128, True, 300, {}, None),
    (64, False, 300, {}, None),
    (64, True, 300, {}, None),
    # 8 tiles (or 4 pairs) of D128 on 3 persistent blocks
    (128, False, 256, {"PERSIST": 1, "PIPE": 0}, 3),
    (128, True, 256, {"PERSIST": 2, "PIPE": 0}, 3),
    (128, False, 300, {"PERSIST": 1, "PIPE": 4}, 3),  # a partial last key tile in every tile
    (128, True, 256, {"PERSIST": 3, "PIPE": 4}, 3),  # pairs of query tiles
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "ONES": 0}, 3),  # the row sums by FADD
    # one stream of steps a block, two Q buffers; 64-key tiles with the mask: warpgroup 0
    # skips the last key tile of each query tile
    (128, False, 300, {"PERSIST": 1, "PIPE": 3, "XT": 1, "QB": 2, "ONES": 1}, 3),
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "XT": 1, "QB": 2, "BN": 64}, 3),
    # a tile at a time with two Q buffers and the rounding added back to the row sums;
    # 64-key tiles with the mask: warpgroup 0 frees the last key tile of each query tile
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "QB": 2, "ONES": 1, "LSE": 1, "BN": 64}, 3),
    # tiles taken from a counter (12, 13: with the exponentials two at a time; 13: three
    # warpgroups of 64 keys, two Q buffers, warpgroups freeing the key tiles past their rows)
    (128, True, 300, {"PERSIST": 4, "PIPE": 1}, 3),
    (128, False, 300, {"PERSIST": 4, "PIPE": 3, "HEXP": 1}, 3),
    (64, True, 300, {"PERSIST": 4, "PIPE": 1, "QB": 2, "HEXP": 1, "BN": 64}, 3),
    # two Q buffers on pairs of query tiles, D128's 128-key tiles (15: and the exponentials
    # two at a time, without the mask)
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "QB": 2}, 3),
    (128, False, 300, {"PERSIST": 3, "PIPE": 1, "QB": 2, "HEXP": 1}, 3),
    # 17, 18: D64's three warpgroups of 128 keys taking tiles from a counter, with the mask
    # and two Q buffers, and without; 19, 20: the unmasked key tiles apart (DIAG 1, 2) on
    # D128's causal route
    (64, True, 300, {"PERSIST": 4, "PIPE": 1, "QB": 2}, 3),
    (64, False, 300, {"PERSIST": 4, "PIPE": 3}, 3),
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "QB": 2, "DIAG": 1}, 3),
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "QB": 2, "DIAG": 2}, 3),
    # 21: O stored as 16-byte vectors (shuffles in every lane, a query tail), D128's route
    (128, True, 300, {"PERSIST": 3, "PIPE": 1, "QB": 2, "OV": 1}, 3),
    # 22: D128's causal options on the tiles of a plan (PERSIST 5, sections of two heads)
    (128, True, 300, {"PERSIST": 5, "SECTION": 2, "PIPE": 1, "QB": 2, "DIAG": 1, "OV": 1}, 3),
    # 23: D64's causal route on the counter: three stages, sections of two heads
    (64, True, 300, {"PERSIST": 4, "PIPE": 1, "QB": 2, "STAGES": 3, "SECTION": 2, "ONES": 1}, 3),
    # 24: the same with 200 keys: each head's partial last key tile in a query tile of two
    # key tiles, fewer than the ring's three stages (``zero_tail``'s barrier)
    (64, True, 200, {"PERSIST": 4, "PIPE": 1, "QB": 2, "STAGES": 3, "SECTION": 2, "ONES": 1}, 3),
    # 25, 26: D64's counter routes since fwd64's third pass: with the mask O as 16-byte
    # vectors and the unmasked key tiles apart; without it O as vectors
    (64, True, 300, {**D64_COUNTER, "PIPE": 1, "DIAG": 1}, 3),
    (64, False, 300, {**D64_COUNTER, "PIPE": 3}, 3),
    # 27, 28: the same with q times 8: rows' maxima that grow far in later key tiles (LAZY
    # 2's rare paths: P rescaled, and the scores computed again from shared memory)
    (64, True, 300, {**D64_COUNTER, "PIPE": 1, "DIAG": 1}, 3, 8.0),
    (64, False, 300, {**D64_COUNTER, "PIPE": 3}, 3, 8.0),
]


def tiny(cases=None) -> None:
    """The routed kernels once per case at small sizes (f16, D 128 and 64, causal and not,
    a partial last key tile, grouped-query heads; then variants on persistent blocks of
    several tiles each), checked: for compute-sanitizer (``TINY``; ``cases``: their
    indices, default all)."""
    from kaio_ops import _attention_hopper as hop
    from kaio_ops import attention

    for i in range(len(TINY)) if cases is None else cases:
        d, causal, sk, over, ctas, *scaled = TINY[i]
        q, k, v = tensors(1, 4, 2, 200 if ctas is None else 256, sk, d, "float16")
        q = q * (scaled[0] if scaled else 1.0)
        (qa, ka, va), dims, scale = attention._check_flash("tiny", q, k, v, None)
        cfg = {**hop.config(d, causal), **({"STAGES": 2} if over else {}), **over}
        out, _ = hop.launch(qa, ka, va, dims, causal, scale, cfg, ctas=ctas)
        ref, _ = reference(q, k, v, causal)
        err = (out.double() - ref).norm().item() / ref.norm().item()
        print(f"tiny {i}: D{d} sk {sk} causal={causal} {over} blocks {ctas}: rel {err:.1e}",
              flush=True)  # fmt: skip


def tiny_warm(jobs: int, cases=None) -> None:
    """Compile ``TINY``'s kernels (``cases``: those of these indices), ``jobs`` processes at
    a time (each runs its case once; the cubins land in the disk cache), so that a run under
    compute-sanitizer only loads them."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for f in [pool.submit(tiny, [i]) for i in cases or range(len(TINY))]:
            try:
                f.result(timeout=120)
            except Exception as e:  # noqa: BLE001  (report each case's failure)
                print(f"FAILED: {type(e).__name__}: {e}", flush=True)


def one(label: str, d: int, causal: bool, shape: str = "4,16,16,4096") -> None:
    """Variant ``label`` (a ``NEW`` label, or a ``parse_specs`` config ``K=V,...``; f16,
    head dim d, ``shape`` B,H,HKV,S) three times: for a profiler."""
    over = NEW[label] if label in NEW else parse_specs(f"{d}/f16/{label}")[0][4]
    run = runner("new" if label != "mma.sync" else "old", d, over)
    b, h, hkv, s = (int(x) for x in shape.split(","))
    q, k, v = tensors(b, h, hkv, s, s, d, "float16")
    for _ in range(3):
        run(q, k, v, causal)
    import torch

    torch.cuda.synchronize()


def case_row(gpu: str, case: tuple, tflops: dict) -> dict:
    """A timed case's row: the GPU, (dtype, d, b, h, hkv, s, causal) and each contender's
    TFLOP/s."""
    return dict(zip(("gpu", "dtype", "d", "b", "h", "hkv", "s", "causal", "tflops"),
                    (gpu, *case, tflops), strict=True))  # fmt: skip


def emit(rows: list, row: dict) -> None:
    """Keep ``row`` and print it (one JSON line: a run cut short still shows it)."""
    rows.append(row)
    print(json.dumps(row), flush=True)


def save(rows: list, out_path) -> None:
    """The rows as JSON to ``out_path`` (if given)."""
    if out_path:
        with open(out_path, "w") as f:
            json.dump(rows, f, indent=1)


def sdpa_flash(q, k, v, causal):
    """torch SDPA's flash backend on the same operands (grouped-query heads as its GQA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return sdpa(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def time_calls(fn, reps=6, rounds=3):
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    times.sort()
    return times[len(times) // 2]


SLEEP_CYCLES = 2_000_000  # ~1 ms of a GPU's clock: longer than a call's host time


def time_queued(fn, calls=4):
    """Milliseconds a call of ``fn``, ``calls`` of them queued behind a GPU sleep
    (``torch.cuda._sleep``) so that the GPU never waits for the host: the kernels' own time
    back to back (docs MEASURING.md's kernel time). ``time_calls``' window also holds the
    first call's host time (some 90 µs for ``launch`` unplanned, 50-80 for SDPA: 5-7% of a
    causal call at B4 H16 S4096 D128, 2026-11-27)."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def passed(check_log) -> set | None:
    """(variant, dtype, head dim) of the variants the check step reached (its output
    ``check_log``; None without a log): one it did not reach may hang, and is not timed (the
    check's table tells the others' accuracy)."""
    if not check_log or not os.path.exists(check_log):
        return None
    reached = set()
    for line in open(check_log):
        if line.startswith("{"):
            r = json.loads(line)
            reached.add((r["variant"], r["dtype"], r["d"]))
    return reached


def bench(out_path, check_log=None):
    import torch

    cases = [  # dtype, d, b, h, hkv, s, variants
        ("float16", 128, 4, 16, 16, 4096, D128 + ["mma.sync"]),
        ("bfloat16", 128, 4, 16, 16, 4096, BF16 + ["mma.sync"]),
        ("float16", 64, 4, 16, 16, 4096, D64 + ["mma.sync"]),
        ("float16", 256, 4, 16, 16, 4096, D256 + ["mma.sync"]),
        ("float16", 128, 32, 16, 16, 512, BEST + ["mma.sync"]),
        ("float16", 128, 16, 16, 16, 1024, BEST + ["mma.sync"]),
        ("float16", 128, 8, 16, 16, 2048, BEST + ["mma.sync"]),
        ("float16", 128, 2, 16, 16, 8192, BEST + ["mma.sync"]),
        ("float16", 128, 1, 16, 16, 16384, BEST + ["mma.sync"]),
        ("float16", 128, 4, 32, 8, 4096, BEST + ["mma.sync"]),
        ("float16", 64, 2, 16, 16, 8192, D64 + ["mma.sync"]),
    ]
    by = {(lab, dt, d): (kind, over) for lab, dt, d, kind, over in variants()}
    ok = passed(check_log)
    rows = []
    name = torch.cuda.get_device_name()
    for dtype, d, b, h, hkv, s, names in cases:
        q, k, v = tensors(b, h, hkv, s, s, d, dtype)
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            res = {}
            for lab in names:
                kind, over = by[(lab, dtype, d)]
                if kind == "new" and ok is not None and (lab, dtype, d) not in ok:
                    continue
                run = runner(kind, d, over)
                try:
                    ms = time_calls(lambda run=run, a=(q, k, v, causal): run(*a))
                except Exception as e:  # noqa: BLE001  (one variant's failure, the others go on)
                    print(f"FAILED {lab} {dtype} D{d}: {type(e).__name__}: {e}", flush=True)
                    continue
                res[lab] = flops / ms / 1e9
            ms = time_calls(partial(sdpa_flash, q, k, v, causal))
            res["sdpa flash"] = flops / ms / 1e9
            emit(rows, case_row(name, (dtype, d, b, h, hkv, s, causal), res))
    save(rows, out_path)
    print(f"\n{name}: TFLOP/s (CUDA events, median of 3 rounds of 6 calls)")
    for r in rows:
        t = r["tflops"]
        ratio = t.get("wgmma", math.nan) / t["sdpa flash"]
        cells = "  ".join(f"{k} {v:.0f}" for k, v in t.items())
        print(f"{r['dtype']:>8} D{r['d']} B{r['b']} H{r['h']}/{r['hkv']} S{r['s']}"
              f"{' causal' if r['causal'] else ''}: {cells}  (wgmma/sdpa {ratio:.2f})")  # fmt: skip


def warm(jobs: int, specs: str | None = None) -> None:
    """Compile the variants (of ``variants()``, or ``specs``) ``jobs`` processes at a time."""
    import multiprocessing as mp

    n = len(parse_specs(specs) if specs else variants())
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(warm_one, i, specs) for i in range(n)]
        for f in futures:
            try:
                print(f.result(timeout=120), flush=True)
            except Exception as e:  # noqa: BLE001  (report each specialization's failure)
                print(f"FAILED: {type(e).__name__}: {e}", flush=True)


# grid's small cases (b, h, hkv, sq, sk): the routes at 1024 keys and fewer, a query tail;
# D64's at 2048 (the counter with the mask) and 4096 keys (a tile a block)
CHECKS = ((2, 16, 4, 1024, 1024), (1, 4, 2, 300, 500), (1, 8, 2, 2048, 2048), (1, 4, 2, 1024, 4096))


def module_of(over: dict):
    """The module a variant's ``over`` runs (``BASE=n``: ``base_module(n)``) and ``over``
    without the bench's own keys."""
    from kaio_ops import _attention_hopper as hop

    over = {k: v for k, v in over.items() if k not in ("NOCHECK", "BASE")}
    return hop, over


def launch_cfg(hop, d: int, causal: bool, dt, sk: int, many: bool, over: dict) -> dict:
    """The constexprs (but D and DT) that ``hop.launch`` gives the kernel for a variant's
    ``over`` (as ``runner`` passes it), the mask, ``sk`` keys and ``many`` query tiles."""
    routed = hop.extras(d, causal, dt, sk, many)
    if over.get("ROUTED"):  # (``runner``'s)
        cfg = {**hop.EXTRAS_OFF, **hop.config(d, causal), **routed, **over}
        cfg.pop("ROUTED")
    elif over:
        cfg = {**hop.EXTRAS_OFF, **routed, **hop.config(d, causal), **over}
    else:
        cfg = {**hop.EXTRAS_OFF, **hop.config(d, causal), **routed}
    cfg.pop("SECTION", None)
    return cfg


def compile_spec(base: int, d: int, dtype: str, items: tuple) -> str:
    """Compile and load one specialization (``base``: of ``base_module(base)``, else the
    branch's module) into the disk cache; a line with its time and resources."""
    import time

    import kaio
    from kaio_ops import _attention_hopper as hop

    if base:
        hop = base_module(base)
    t0 = time.time()
    dt = kaio.f16 if dtype == "float16" else kaio.bf16
    r = hop.attention_fwd_wgmma.resources(D=d, DT=dt, **dict(items))
    return (f"base {base} D{d} {dtype} {dict(items)}: {time.time() - t0:.1f}s (registers "
            f"{r.registers}, local bytes {r.local_bytes})")  # fmt: skip


def warm_specs(vs: list, shapes: str, causals: tuple, jobs: int, sms: int, checks=CHECKS) -> None:
    """Compile every specialization that ``grid`` launches (its ``checks`` with
    ``MANY_TILES`` 0, each timed shape as routed), one process a specialization, ``jobs`` at
    a time."""
    import multiprocessing as mp

    import kaio

    todo = {}
    for _, dtype, d, kind, over in vs:
        if kind != "new" or "precise" in over:
            continue
        base = over.get("BASE", 0)
        hop = base_module(base) if base else module_of(over)[0]
        clean = module_of(over)[1]
        dt = kaio.f16 if dtype == "float16" else kaio.bf16
        keys = [(sk, True) for *_, sk in checks]
        for shape in shapes.split(";"):
            b, h, _, s, *rest = (int(x) for x in shape.split(","))
            keys.append((rest[0] if rest else s, b * h * -(-s // 128) >= hop.MANY_TILES * sms))
        for causal in causals:
            for sk, many in keys:
                cfg = launch_cfg(hop, d, causal, dt, sk, many, clean)
                todo[(base, d, dtype, tuple(sorted(cfg.items())))] = None
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(compile_spec, *key) for key in todo]
        for f in futures:
            try:
                print(f.result(timeout=120), flush=True)
            except Exception as e:  # noqa: BLE001  (report each specialization's failure)
                print(f"FAILED: {type(e).__name__}: {e}", flush=True)


def grid(
    specs: str,
    shapes: str,
    causals: tuple,
    out_path,
    rounds: int = 5,
    jobs: int = 0,
    warm_only: bool = False,
    checks: tuple = CHECKS,
    q_scales: tuple = (1.0,),
) -> None:
    """Each variant of ``specs`` (``parse_specs``) checked against float64 on two small
    cases (grouped-query heads with several tiles a persistent block, and a partial last key
    tile with a query tail), then, where it passed, timed with SDPA flash on each shape
    ``B,H,HKV,S[,SK];...`` (SK: keys, when not S): ``rounds`` rounds, each of every
    contender in turn (so that a drift of the clocks reaches all of them), the median of
    each. ``warm_only``: compile (``jobs`` processes at a time) and stop, so that a GPU round
    can run other steps beside the compiles; ``checks``: the small cases (``CHECKS``'s), each
    with q times each of ``q_scales`` (past 1: scores spread so wide that rows' maxima grow
    far in later key tiles, the rare paths of ``LAZY``)."""
    import torch

    vs = parse_specs(specs)
    name = torch.cuda.get_device_name()
    if jobs:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        warm_specs(vs, shapes, causals, jobs, sms, checks)
    if warm_only:
        return
    rows, refs, ok = [], {}, []
    for label, dtype, d, kind, over in vs:
        run = runner(kind, d, over)
        worst = 0.0
        lse_at = dict.fromkeys(q_scales, 0.0)  # the largest lse error at each q scale
        base = over.get("BASE", 0)
        hop = base_module(base) if base else module_of(over)[0]
        many, hop.MANY_TILES = hop.MANY_TILES, 0  # the checks take the routes of the timing
        try:
            for (b, h, hkv, sq, sk), qs in ((c, qs) for c in checks for qs in q_scales):
                for causal in causals:
                    key = (dtype, d, b, h, hkv, sq, sk, causal, qs)
                    if key not in refs:
                        q, k, v = tensors(b, h, hkv, sq, sk, d, dtype, seed=sq + d)
                        q = q * qs
                        refs[key] = (q, k, v, *reference(q, k, v, causal))
                    q, k, v, ref, ref_lse = refs[key]
                    out, lse = run(q, k, v, causal)
                    err = (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()
                    worst = max(worst, err if math.isfinite(err) else math.inf)
                    lse_err = (lse.double() - ref_lse).abs().max().item()
                    lse_at[qs] = max(lse_at[qs], lse_err if math.isfinite(lse_err) else math.inf)
        except Exception as e:  # noqa: BLE001  (one variant's failure, the others go on)
            print(f"FAILED {label}: {type(e).__name__}: {e}", flush=True)
            continue
        finally:
            hop.MANY_TILES = many
        tol = 2e-2 if dtype == "bfloat16" else 3e-3
        wrong = "" if worst < tol else "  WRONG"
        at = ", ".join(f"q x {qs:g}: {e:.1e}" for qs, e in lse_at.items())
        print(f"check {label}: rel {worst:.1e}, lse {max(lse_at.values()):.1e} ({at}){wrong}",
              flush=True)  # fmt: skip
        if worst < tol or over.get("NOCHECK"):  # (NOCHECK 1: a diagnostic, timed anyway)
            ok.append((label, dtype, d, kind, over))

    for shape in shapes.split(";"):
        b, h, hkv, s, *rest = (int(x) for x in shape.split(","))
        sk = rest[0] if rest else s  # B,H,HKV,S or B,H,HKV,SQ,SK
        for dtype, d in dict.fromkeys((dt, dd) for _, dt, dd, _, _ in ok):
            q, k, v = tensors(b, h, hkv, s, sk, d, dtype)
            for causal in causals:
                if causal and s != sk:  # (SDPA flash takes the mask only where Sq = Sk)
                    continue
                flops = 4 * b * h * s * sk * d / (2 if causal else 1)
                fns = {"sdpa flash": partial(sdpa_flash, q, k, v, causal)}
                for label, dt, dd, kind, over in ok:
                    if (dt, dd) == (dtype, d):
                        fns[label] = partial(runner(kind, d, over), q, k, v, causal)
                times = {lab: [] for lab in fns}
                window = {lab: [] for lab in fns}
                for _ in range(rounds):
                    for lab, fn in fns.items():
                        times[lab].append(time_queued(fn))
                        window[lab].append(time_calls(fn, reps=4, rounds=1))
                res = {lab: flops / sorted(t)[len(t) // 2] / 1e9 for lab, t in times.items()}
                row = case_row(name, (dtype, d, b, h, hkv, s, causal), res)
                row["tflops_window"] = {
                    lab: flops / sorted(t)[len(t) // 2] / 1e9 for lab, t in window.items()
                }  # fmt: skip
                emit(rows, {**row, "sk": sk} if sk != s else row)
    save(rows, out_path)
    print(
        f"\n{name}: TFLOP/s (CUDA events, median of {rounds} interleaved rounds; calls queued "
        "behind a GPU sleep, in brackets timed with the first call's host time)"
    )
    for r in rows:
        t, w = r["tflops"], r["tflops_window"]
        print(
            f"{r['dtype']} D{r['d']} B{r['b']} H{r['h']}/{r['hkv']} S{r['s']}"
            f"{'/' + str(r['sk']) if 'sk' in r else ''}"
            f"{' causal' if r['causal'] else ''}: sdpa flash {t['sdpa flash']:.0f}"
        )
        print(f"    {t['sdpa flash']:6.0f} ({w['sdpa flash']:4.0f})  sdpa flash")
        for lab, v in sorted(t.items(), key=lambda kv: -kv[1]):
            if lab != "sdpa flash":
                print(f"    {v:6.0f} ({w[lab]:4.0f})  {v / t['sdpa flash']:.2f}x  {lab}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("step", choices=("warm", "check", "time", "tiny", "tiny-warm", "one", "grid"))
    p.add_argument("--specs", help="warm, grid: the variants, D/dtype/K=V,K=V;... (parse_specs)")
    p.add_argument(
        "--shapes", default="4,16,16,4096", help="grid: B,H,HKV,S[,SK];... one: B,H,HKV,S"
    )
    p.add_argument("--causal-grid", default="both", choices=("both", "no", "yes"))
    p.add_argument("--variant", default="wgmma", help="one: a NEW label, or K=V,... (or default)")
    p.add_argument("--d", type=int, default=128, help="one: the head dim")
    p.add_argument("--causal", action="store_true", help="one: causal")
    p.add_argument("--cases", help="tiny: the TINY cases to run, i,j,... (default all)")
    p.add_argument("--out")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--check-log", help="time: only the variants this check output passed")
    p.add_argument("--rounds", type=int, default=5, help="grid: interleaved rounds of timing")
    p.add_argument("--warm-only", action="store_true", help="grid: compile, then stop")
    p.add_argument("--checks", help="grid: the CHECKS cases to run, i,j,... (default all)")
    p.add_argument("--q-scales", default="1", help="grid: each check with q times these, x,y,...")
    p.add_argument("--ptxas", help="build the cubins with this ptxas, not the driver's JIT")
    args = p.parse_args()
    if args.ptxas:  # before kaio compiles anything; cached under their own keys
        os.environ["KAIO_PTXAS"] = args.ptxas  # the runtime's opt-in; read by the workers too
    if args.step == "warm":
        warm(args.jobs, args.specs)
    elif args.step == "grid":
        causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal_grid]
        checks = [CHECKS[int(i)] for i in args.checks.split(",")] if args.checks else CHECKS
        q_scales = tuple(float(x) for x in args.q_scales.split(","))
        grid(args.specs, args.shapes, causals, args.out, args.rounds, args.jobs, args.warm_only,
             checks, q_scales)  # fmt: skip
    elif args.step == "check":
        check(args.out)
    elif args.step == "tiny":
        tiny([int(i) for i in args.cases.split(",")] if args.cases else None)
    elif args.step == "tiny-warm":
        tiny_warm(args.jobs, [int(i) for i in args.cases.split(",")] if args.cases else None)
    elif args.step == "one":
        one(args.variant, args.d, args.causal, args.shapes)
    else:
        bench(args.out, args.check_log)


if __name__ == "__main__":
    main()
