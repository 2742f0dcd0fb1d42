"""End to end: a Llama-3-8B-shaped transformers model, unpatched and on kaio (``kaio_ops.hf``).

The model is ``LlamaForCausalLM`` with Llama-3-8B's layer shapes (hidden 4096, 32 query and 8
KV heads of 128, MLP 14336, vocabulary 128256) and ``--layers`` layers (8 by default; the
figure is per model of that depth), random f16 weights, nothing downloaded. Measured, each in
the same process on the same weights:

- decode: tokens/s of one greedy step (``B`` new tokens) at batch B over a cache already
  holding ``--ctx`` tokens, for: transformers unpatched (eager, dynamic cache: transformers'
  default), unpatched in a CUDA graph (static cache, the step captured once), unpatched under
  ``torch.compile`` (static cache; its failure is recorded, not hidden), kaio-patched eager
  (transformers' ``StaticCache``, which kaio writes in place: ``kv_cache_append_rope``; with
  ``--dynamic`` also over the dynamic cache) and in a CUDA graph, and kaio with
  ``quantize="int4"`` (both ways); eager rows also give the host time of one step (the
  Python call, the GPU idle before it);
- prefill: tokens/s of one forward over a prompt of S tokens at batch 1 (no cache), unpatched
  and kaio-patched (and int4, with its weights' dense f16 copy for prompts:
  ``dense_prefill=True``, and without it);
- with ``--generate N``: ``model.generate`` of N greedy tokens after a 512-token prompt at
  each batch, tokens/s of the whole call: transformers as it comes (dynamic cache), kaio
  with ``cache_implementation="static"`` (eager: ``disable_compile=True``) and dynamic.

Each step time is the median over ``--reps`` timed steps (CUDA events), after warm-up; the
cache content is random (the kernels read every cached token whatever its value).

Usage: ``python bench/e2e.py --out results.json [--layers 8] [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import transformers  # noqa: E402

import kaio_ops.hf as hf  # noqa: E402

SLACK = 256  # static-cache slots past ctx: more than the steps one measurement makes
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=16384,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)


def build(layers: int) -> torch.nn.Module:
    """The unpatched model, random f16 weights on the GPU (seeded)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=layers, **LLAMA3_8B)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.float16)
    return model.eval()


def median_ms(fn, reps: int) -> tuple[float, float]:
    """(median time of ``fn()`` over ``reps`` calls, each between CUDA events; median host
    time of the call, the GPU idle before it), in ms, after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times, host = [], []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), statistics.median(host)


def filled_cache(model, batch: int, ctx: int, static: bool, kv_heads: int | None = None):
    """A cache of ``ctx`` random tokens per sequence for every layer (``kv_heads`` heads: the
    config's, or a tensor-parallel rank's share). A static cache gets room for ``SLACK``
    more: transformers' static layers write each step at their own running count (not at the
    step's position), so each timed step takes the next slot."""
    cfg = model.config
    kv = (batch, kv_heads or cfg.num_key_value_heads, ctx, cfg.head_dim)
    if static:
        cache = transformers.StaticCache(config=cfg, max_cache_len=ctx + SLACK)
    else:
        cache = transformers.DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(kv, device="cuda", dtype=torch.float16)
        v = torch.randn(kv, device="cuda", dtype=torch.float16)
        cache.update(k, v, layer)
    return cache


def decode_step(model, batch: int, ctx: int, static: bool, kv_heads: int | None = None):
    """A function running one decode step at position ``ctx`` (static cache: transformers'
    own attention writes each step into the next of the ``SLACK`` spare slots, kaio's at the
    step's position; dynamic: the cache is cropped back after each step), so it can repeat."""
    cache = filled_cache(model, batch, ctx, static, kv_heads)
    ids = torch.randint(0, 1000, (batch, 1), device="cuda")
    pos = torch.full((batch, 1), ctx, device="cuda", dtype=torch.long)

    def step():
        out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        if not static:
            cache.crop(ctx)
        return out.logits

    return step


def graphed(step):
    """``step`` captured once in a CUDA graph; the returned function replays it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def measure(results, name, batch, ctx, fn_maker, reps, kind="decode", tokens=None):
    """One row: tokens/s of the function ``fn_maker()`` makes, or the failure."""
    row = dict(kind=kind, impl=name, batch=batch, ctx=ctx)
    try:
        with torch.no_grad():
            fn = fn_maker()
            ms, host_ms = median_ms(fn, reps)
        row.update(ms=ms, host_ms=host_ms, tokens_per_s=(tokens or batch) / ms * 1e3)
    except Exception as e:  # recorded on the page: a peer that fails is a result
        row.update(error=f"{type(e).__name__}: {str(e)[:300]}")
        traceback.print_exc()
    results.append(row)
    shown = (
        f"{row['tokens_per_s']:10.1f} tok/s ({row['ms']:.3f} ms, host {row['host_ms']:.3f})"
        if "ms" in row
        else row["error"]
    )
    print(f"{kind:8s} {name:28s} B={batch:3d} L={ctx:5d}  {shown}", flush=True)
    torch.cuda.empty_cache()


def decode_rows(results, label, model, batches, ctx, reps, compile_=False, kaio=False, ways=()):
    """Decode rows of one model: eager (dynamic cache for transformers; static for kaio, which
    writes it in place, and dynamic too with ``"dynamic"`` in ``ways``), CUDA graph (static
    cache) unless ``"no-graph"`` is in ``ways`` and, for the unpatched model, torch.compile
    with CUDA graphs (static cache)."""
    for b in batches:

        def eager(b=b, static=kaio):
            return decode_step(model, b, ctx, static)

        def graph(b=b):
            return graphed(decode_step(model, b, ctx, True))

        def compiled(b=b):
            step = decode_step(model, b, ctx, True)
            model.forward = torch.compile(model.forward, mode="reduce-overhead")
            return step

        measure(results, f"{label} eager", b, ctx, eager, reps)
        if kaio and "dynamic" in ways:
            measure(results, f"{label} eager dynamic", b, ctx, lambda b=b: eager(b, False), reps)
        if "no-graph" not in ways:
            measure(results, f"{label} graph", b, ctx, graph, reps)
        if compile_:
            measure(results, f"{label} torch.compile", b, ctx, compiled, reps)
            model.forward = model.__class__.forward.__get__(model)


def generate_rows(results, label, model, batches, prompt: int, new: int, **extra) -> None:
    """Rows of ``model.generate`` as a user calls it: ``new`` greedy tokens after a random
    prompt of ``prompt`` tokens at each batch, tokens/s over the whole call (prefill
    included), median of 3 calls after one warm-up; ``extra``: more generate arguments."""
    for b in batches:
        ids = torch.randint(0, 1000, (b, prompt), device="cuda")
        args = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

        def run(ids=ids, args=args):
            return lambda: model.generate(ids, **args, **extra)

        measure(results, label, b, prompt, run, 3, kind="generate", tokens=b * new)


def two_steps(model, ids, static: bool) -> list:
    """The last-position logits (f32) of a prompt ``ids`` and of one greedy step after it,
    over a dynamic or a static cache."""
    cfg = model.config
    if static:
        cache = transformers.StaticCache(config=cfg, max_cache_len=ids.shape[1] + 8)
    else:
        cache = transformers.DynamicCache(config=cfg)
    out = []
    with torch.no_grad():
        inp = ids
        for _ in range(2):
            logits = model(input_ids=inp, past_key_values=cache, use_cache=True).logits[:, -1]
            out.append(logits.float())
            inp = logits.argmax(-1, keepdim=True)
    return out


def check_rows(results, label, model, ids, want) -> None:
    """A row per step: the relative difference of ``model``'s logits over the static cache
    kaio writes from the unpatched model's (``want``, dynamic cache)."""
    got = two_steps(model, ids, True)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        err = ((g - w).norm() / w.norm()).item()
        same = bool((g.argmax(-1) == w.argmax(-1)).all())
        results.append(dict(kind="check", impl=label, step=i, rel_err=err, same_token=same))
        print(f"check    {label:28s} step {i}: logits rel err {err:.2e}, same token {same}")


def profile_host(model, batch: int, ctx: int, steps: int, path: str) -> None:
    """cProfile of ``steps`` eager decode steps (static cache), the GPU synchronized after
    each (so launches never wait for a full queue): the host's time by function, to ``path``."""
    import cProfile
    import io
    import pstats

    with torch.no_grad():
        step = decode_step(model, batch, ctx, True)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        for _ in range(steps):
            prof.enable()
            step()
            prof.disable()
            torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    Path(path).write_text(f"{steps} steps, batch {batch}\n" + out.getvalue())
    print(f"host profile of {steps} steps written to {path}", flush=True)


def prefill_rows(results, label, model, lengths, reps):
    """Prefill rows: one forward over S tokens at batch 1, no cache."""
    for s in lengths:
        ids = torch.randint(0, 1000, (1, s), device="cuda")

        def run(ids=ids):
            return lambda: model(input_ids=ids, use_cache=False).logits

        measure(results, label, 1, s, run, reps, kind="prefill", tokens=s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prefill", default="512,2048,8192", help="lengths ('' for none)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--no-int4", action="store_true")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph rows")
    p.add_argument("--dynamic", action="store_true", help="kaio eager over a dynamic cache too")
    p.add_argument("--profile", default=None, help="write a host profile of kaio's B1 steps")
    p.add_argument(
        "--generate", type=int, default=0, help="also time generate() of this many tokens"
    )
    p.add_argument("--quick", action="store_true", help="batches 1,16; prefill 512,2048; 10 reps")
    args = p.parse_args()
    if args.quick:
        args.batches, args.prefill, args.reps = "1,16", "512,2048", 10
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(s) for s in args.prefill.split(",") if s]
    ways = ("no-graph",) * args.no_graph + ("dynamic",) * args.dynamic
    results: list[dict] = []
    t0 = time.perf_counter()
    few = max(3, args.reps // 4)

    model = build(args.layers)
    decode_rows(
        results, "transformers", model, batches, args.ctx, args.reps,
        compile_=not args.no_compile, ways=ways,
    )  # fmt: skip
    prefill_rows(results, "transformers", model, lengths, few)
    if args.generate:
        generate_rows(results, "transformers", model, batches, 512, args.generate)
    ids = torch.randint(0, 1000, (2, 16), device="cuda", generator=torch.Generator("cuda"))
    want = two_steps(model, ids, False)
    if not args.no_int4:
        q4 = hf.apply(copy.deepcopy(model), quantize="int4", dense_prefill=True)
    hf.apply(model)
    check_rows(results, "kaio static cache", model, ids, want)
    decode_rows(results, "kaio", model, batches, args.ctx, args.reps, kaio=True, ways=ways)
    prefill_rows(results, "kaio", model, lengths, few)
    if args.generate:
        static = dict(cache_implementation="static", disable_compile=True)
        generate_rows(results, "kaio static", model, batches, 512, args.generate, **static)
        generate_rows(results, "kaio dynamic", model, batches, 512, args.generate)
    if args.profile:
        profile_host(model, 1, args.ctx, 20, args.profile)
    del model
    torch.cuda.empty_cache()
    if not args.no_int4:
        decode_rows(results, "kaio int4", q4, batches, args.ctx, args.reps, kaio=True, ways=ways)
        prefill_rows(results, "kaio int4 dense prefill", q4, lengths, few)
        hf.set_dense_prefill(q4, False)
        prefill_rows(results, "kaio int4", q4, lengths, few)

    meta = dict(
        gpu=torch.cuda.get_device_name(),
        layers=args.layers,
        ctx=args.ctx,
        transformers=transformers.__version__,
        torch=torch.__version__,
        seconds=time.perf_counter() - t0,
    )
    print(json.dumps(meta))
    if args.out:
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=results), indent=1))


if __name__ == "__main__":
    main()
