"""The Python and torch glue of one kaio-patched Llama decoder layer's decode step, measured
on the CPU: the layer's forward with every kaio op replaced by a stub that returns an array
made beforehand, so what is left is the glue (module calls, tensor views, the model's KV
cache update, the choice between ``kaio_ops`` and ``torch.ops.kaio``). Llama-3-8B head
layout (32 query heads, 8 K/V heads, head dim 128, hidden 4096; a small MLP), a static cache
of 1024 tokens, batch 1 and 16. Times are the process's
CPU time (``time.process_time``: a shared host's other work is not counted), the least of 7
rounds.

``--before FILE``: also measure another version of ``kaio_ops/hf.py`` (e.g. main's:
``git show main:kaio_ops/hf.py > /tmp/hf_main.py``) the same way. Its ops go through the
``torch.ops.kaio`` names; the stubs stand in for both, so the dispatcher's own cost per op
(``dispatcher floor``, an empty custom op registered as kaio_ops.torch registers its ops,
measured here on CPU tensors) is printed beside it: add it per dispatched call.

    PYTHONPATH=$PWD python3 bench/hf_layer_host_cpu.py --before /tmp/hf_main.py
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import time
import types

import torch

from kaio_ops import hf


class Stubs:
    """Stand-ins for kaio's ops: outputs of the right shape, made once per shape."""

    def __init__(self):
        self.made: dict = {}
        self.calls = 0

    def _like(self, shape, dtype):
        self.calls += 1
        key = (tuple(shape), dtype)
        if key not in self.made:
            self.made[key] = torch.zeros(shape, dtype=dtype)
        return self.made[key]

    def linear(self, x, w, bias=None, residual=None, activation=None, out_dtype=None):
        n = w.shape[0] // (2 if activation == "silu_gate" else 1)
        return self._like((*x.shape[:-1], n), x.dtype)

    def rms_norm(self, x, w, eps=1e-6):
        return self._like(x.shape, x.dtype)

    def rope(self, x, cos, sin):
        return self._like(x.shape, x.dtype)

    def flash_attention_decode(self, q, k, v, seq_lens, block_table=None, scale=None):
        return self._like(q.shape, q.dtype)

    def kv_cache_append_rope(self, k_cache, v_cache, qkv, cos, sin, seq_lens, heads, table=None):
        return self._like((qkv.shape[0], heads, qkv.shape[1], k_cache.shape[-1]), qkv.dtype)


def load(path: str):
    spec = importlib.util.spec_from_file_location("hf_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_case(module, batch: int, stubs: Stubs):
    """(one layer's decode step, kaio ops it calls, the rotary module's step) for a patched
    one-layer Llama with ``module``."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    config = LlamaConfig(
        hidden_size=4096, intermediate_size=256, num_attention_heads=32, num_key_value_heads=8,
        num_hidden_layers=1, vocab_size=128, max_position_embeddings=8192,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float16).eval()
    model = module.apply(copy.deepcopy(model))
    module.ops = stubs  # the torch.ops.kaio names
    if hasattr(module, "_direct"):
        module._direct = lambda x, residual=None: True  # eager CUDA tensors on a GPU
    names = ("linear", "rms_norm", "rope", "flash_attention_decode", "kv_cache_append_rope")
    module.kaio_ops = types.SimpleNamespace(**{n: getattr(stubs, n) for n in names})
    layer = model.model.layers[0]
    # room for every timed step: transformers' static layers write at their running count
    cache = StaticCache(config=config, max_cache_len=1024)
    x = torch.zeros(batch, 1, 4096, dtype=torch.float16)
    position = torch.tensor([[100]])
    rotary = model.model.rotary_emb

    with torch.no_grad():
        embeddings = rotary(x, position)
    cache_position = position[0]

    def step():
        return layer(x, attention_mask=None, position_embeddings=embeddings,
                     past_key_values=cache, cache_position=cache_position)  # fmt: skip

    with torch.no_grad():
        step()
        before = stubs.calls
        step()
        return step, stubs.calls - before, lambda: rotary(x, position)


def per_call_us(fn, calls: int = 300, repeats: int = 7) -> float:
    """The least over ``repeats`` of the mean CPU time of ``calls`` calls, in µs."""
    times = []
    with torch.no_grad():
        fn()
        for _ in range(repeats):
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            times.append((time.process_time() - t0) / calls * 1e6)
    return min(times)


def dispatcher_floor_us() -> float:
    """An empty custom op registered as kaio_ops.torch registers its ops, on a CPU tensor."""
    lib = torch.library.Library("kaio_bench_cpu", "FRAGMENT")
    lib.define("empty(Tensor x) -> Tensor")
    made = torch.empty(1)
    lib.impl("empty", lambda x: made, "CompositeExplicitAutograd")
    torch.library.register_fake("kaio_bench_cpu::empty", lambda x: x.new_empty(1), lib=lib)
    probe = torch.empty(1)
    empty = torch.ops.kaio_bench_cpu.empty
    us = per_call_us(lambda: empty(probe), calls=3000)
    del lib
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="another kaio_ops/hf.py to measure the same way")
    args = parser.parse_args()
    versions = [("this tree", hf)]
    if args.before:
        versions.insert(0, (args.before, load(args.before)))
    print(f"dispatcher floor (empty custom op, CPU tensor): {dispatcher_floor_us():.2f} us/call")
    for label, module in versions:
        saved = module.ops, getattr(module, "_direct", None), module.kaio_ops
        for batch in (1, 16):
            stubs = Stubs()
            step, ops, rotary = layer_case(module, batch, stubs)
            us, once = per_call_us(step, calls=100), per_call_us(rotary)
            print(
                f"{label:<30} batch {batch:2d}: {us:8.1f} us per layer ({ops} kaio ops), "
                f"{once:8.1f} us per step (the rotary tables, once for every layer)"
            )
        module.ops, module.kaio_ops = saved[0], saved[2]
        if saved[1] is not None:
            module._direct = saved[1]


if __name__ == "__main__":
    main()
