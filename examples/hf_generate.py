"""Generate with a Hugging Face transformers model, with and without kaio.

Builds a small Llama-style model from a config (seeded random weights, nothing downloaded),
generates greedily with transformers as it is, then patches the model with
``kaio_ops.hf.apply`` and generates again; prints both token sequences and tokens per second.
On a machine without a GPU the model is tiny and the kaio run goes through the CPU simulator
(slow, but the same kernels).

    python examples/hf_generate.py [--tokens 32]

Needs torch and transformers (``pip install 'kaio[hf]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch
import transformers

import kaio
import kaio_ops.hf


def build(gpu: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    size = (
        dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8)
        if gpu
        else dict(
            hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2
        )
    )
    config = transformers.LlamaConfig(
        vocab_size=512, num_key_value_heads=size["num_attention_heads"] // 2, head_dim=64, **size
    )
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config)
    return model.to("cuda" if gpu else "cpu", torch.float16).eval()


def generate(model, ids, tokens: int, **extra) -> tuple[list[int], float]:
    """Greedy tokens and tokens per second (``extra``: more ``generate`` arguments)."""
    with torch.no_grad():
        if ids.is_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(
            ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, **extra
        )
        if ids.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
    return out[0, ids.shape[1] :].tolist(), tokens / dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=None)
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    tokens = args.tokens or (32 if gpu else 4)
    model = build(gpu)
    ids = torch.randint(0, 512, (1, 16), device=model.device)
    ref, ref_rate = generate(model, ids, tokens)
    patched = kaio_ops.hf.apply(copy.deepcopy(model))
    print("kaio replaced:", patched.kaio_report)
    # the static cache is written in place by kaio (eager: no torch.compile)
    static = dict(cache_implementation="static", disable_compile=True)
    with contextlib.nullcontext() if gpu else kaio.simulate():
        got, rate = generate(patched, ids, tokens)
        got_static, rate_static = generate(patched, ids, tokens, **static)
    where = torch.cuda.get_device_name() if gpu else "CPU (kaio on its simulator)"
    print(f"on {where}")
    print(f"transformers: {ref}  {ref_rate:.1f} tokens/s")
    print(f"kaio:         {got}  {rate:.1f} tokens/s")
    print(f"kaio, static: {got_static}  {rate_static:.1f} tokens/s")
    same = sum(a == b for a, b in zip(ref, got, strict=True))
    print(
        f"{same} of {tokens} tokens equal"
        + ("" if same == tokens else " (random weights: near-ties)")
    )


if __name__ == "__main__":
    main()
