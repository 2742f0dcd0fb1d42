"""Tensor parallel end to end: a Llama-3-8B-shaped model split over the GPUs of one host by
transformers' own plan (``tp_plan="auto"``, NCCL through torch.distributed), unpatched and
patched by ``kaio_ops.hf.apply``.

Started by torchrun, one process per GPU::

    torchrun --nproc-per-node 2 bench/e2e_tp.py --out tp.json [--layers 4]

Rank 0 builds the model of ``bench/e2e.py`` (seeded random f16 weights) and saves it to
``--model-dir``; every rank loads it split by the plan, twice: unpatched and patched. Checked:
the patched split model's greedy tokens equal the unpatched split model's, and (rank 0) the
unpatched model's on one GPU, wherever the reference's top-2 logit margin exceeds the two
models' logit difference (the first divergence is reported with its margin). Measured: decode
tokens/s of one greedy step over a dynamic cache of ``--ctx`` random tokens at each batch
(CUDA events, median), unpatched and patched, all ranks stepping together.

``--tiny`` takes a tiny model (the GPU test's), and ``--cpu`` runs on the CPU (gloo; the
patched model on kaio's simulator): the CPU test's check of the same code path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import transformers  # noqa: E402

import kaio  # noqa: E402
import kaio_ops.hf as hf  # noqa: E402

TINY = dict(
    vocab_size=96,
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


def save_model(path: Path, layers: int, tiny: bool) -> None:
    """Rank 0: the seeded random model, saved once (kept for later runs)."""
    if (path / "config.json").exists():
        return
    from bench.e2e import LLAMA3_8B  # only here: bench.e2e needs no GPU to import

    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=layers, **(TINY if tiny else LLAMA3_8B))
    model = transformers.LlamaForCausalLM(config).to(torch.float16)
    with torch.no_grad():  # norms away from 1 so that a wrong weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)


def load(path: Path, split: bool, device) -> torch.nn.Module:
    """The saved model, split by transformers' plan or whole on ``device``."""
    kwargs = dict(dtype=torch.float16, attn_implementation="sdpa")
    if split:
        plan = transformers.DistributedConfig(tp_plan="auto")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, distributed_config=plan, **kwargs
        )
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
    return model.eval()


def generate(model, ids, steps: int, simulate: bool):
    """``hf.greedy`` of ``model``, in kaio's simulator when ``simulate``."""
    if not simulate:
        return hf.greedy(model, ids, steps)
    with kaio.simulate():
        return hf.greedy(model, ids, steps)


def compare(reference, generated) -> dict:
    """A result row: the generated tokens, their first divergence from the reference's (each
    a ``(tokens, logits)`` pair of ``hf.greedy``) and the relative difference of the first
    step's logits (both models saw the same prompt there)."""
    div = hf.first_divergence(*reference, *generated)
    first, got = reference[1][0].double(), generated[1][0].to(reference[1][0].device).double()
    rel = ((first - got).norm() / first.norm()).item()  # the prompt's logits: same input
    row = dict(equal=div is None, logit_rel_err=rel, tokens=generated[0].tolist())
    if div is not None:
        row.update(diverge_step=div.step, margin=div.margin, diff=div.diff, near_tie=div.near_tie)
    return row


def decode_tokens_per_s(model, batch: int, ctx: int, kv_heads: int, reps: int) -> float:
    """Tokens/s of one decode step at ``batch`` over ``ctx`` cached tokens (every rank runs
    it at once; the split model's collectives keep them in step)."""
    from bench.e2e import decode_step, median_ms

    with torch.no_grad():
        ms = median_ms(decode_step(model, batch, ctx, static=False, kv_heads=kv_heads), reps)
    return batch / ms * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--layers", type=int, default=None, help="4 (--tiny: 2)")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--batches", default="1,16")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens compared")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--model-dir", default=None)
    p.add_argument("--tiny", action="store_true", help="a tiny model")
    p.add_argument("--cpu", action="store_true", help="on the CPU (gloo, kaio's simulator)")
    args = p.parse_args()
    gpu = not args.cpu
    args.layers = args.layers or (2 if args.tiny else 4)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else "cpu"
    if gpu:
        torch.cuda.set_device(device)
    kind = "tiny" if args.tiny else "llama3-8b"
    path = Path(args.model_dir or f"/tmp/kaio_e2e_tp_{kind}_{args.layers}")
    if rank == 0:
        save_model(path, args.layers, args.tiny)
    dist.barrier()
    t0 = time.perf_counter()

    ref = load(path, split=True, device=device)
    patched = hf.apply(load(path, split=True, device=device))
    vocab = ref.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(vocab, 1000), (1, 16 if args.tiny else 64), generator=g)
    ids = ids.to(device)
    steps = min(args.steps, 4) if args.cpu else args.steps
    ref_run = hf.greedy(ref, ids, steps)
    patched_run = generate(patched, ids, steps, simulate=args.cpu)  # every rank: collectives
    result = dict(world=world, steps=steps, kept=patched.kaio_report["kept"])
    result["split_vs_split"] = compare(ref_run, patched_run)
    if rank == 0:
        single = load(path, split=False, device=device)
        result["split_vs_single"] = compare(hf.greedy(single, ids, steps), patched_run)
        del single
    if gpu and not args.tiny:
        kv_heads = ref.config.num_key_value_heads // world
        rows = []
        for b in (int(x) for x in args.batches.split(",")):
            for label, model in (("transformers", ref), ("kaio", patched)):
                tps = decode_tokens_per_s(model, b, args.ctx, kv_heads, args.reps)
                rows.append(dict(impl=label, batch=b, ctx=args.ctx, tokens_per_s=tps))
                if rank == 0:
                    print(f"decode {label:12s} B={b:3d} L={args.ctx} {tps:10.1f} tok/s", flush=True)
        result["decode"] = rows
    if gpu:
        result["gpu"] = torch.cuda.get_device_name()
    result.update(layers=args.layers, seconds=time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "decode"}))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
