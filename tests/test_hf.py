"""kaio_ops.hf: Hugging Face transformers models patched onto kaio_ops.

Without a GPU (CPU torch and transformers installed): a tiny Llama-family model with seeded
random weights, patched, runs on kaio's CPU simulator; its logits agree with the unpatched
model's and its greedy tokens equal the unpatched model's wherever the reference's top-2
margin exceeds the measured logit difference. Marked gpu: the same at larger sizes for every
supported family in f16 and bf16, 64 greedy tokens, int4, and a decode step from a static cache
in a CUDA graph.
"""

from __future__ import annotations

import copy

import pytest

import kaio

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("kaio_ops.hf")
greedy = hf.greedy


def tiny_config(family: str, **extra):
    """A small config of the family: head dim 64 (kaio's decode kernels take 64, 128, 256),
    GQA 2:1, K multiples of 128 (int4 groups)."""
    common = dict(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    common.update(extra)
    cls = transformers.AutoConfig.for_model(family).__class__
    return cls(**common)


def build(family: str, dtype, device="cpu", seed=0, **extra):
    """The unpatched model and a patched deep copy, same seeded random weights."""
    torch.manual_seed(seed)
    config = tiny_config(family, **extra)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype)
    model.eval()
    with torch.no_grad():  # norms away from 1 so that a wrong weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model, hf.apply(copy.deepcopy(model))


def check_generation(ref, patched, ids, steps, cache="dynamic"):
    """Greedy tokens of ``patched`` (with a ``cache`` of that kind) equal the unpatched
    model's (dynamic cache) up to a near-tie, which is reported with its step and margin."""
    ref_tokens, ref_logits = greedy(ref, ids, steps)
    tokens, logits = greedy(patched, ids, steps, cache)
    div = hf.first_divergence(ref_tokens, ref_logits, tokens, logits)
    if div is not None:
        assert div.near_tie, (
            f"greedy tokens diverge at step {div.step} where the reference's top-2 margin "
            f"{div.margin:.4g} exceeds twice the logit difference {div.diff:.4g}"
        )
        print(
            f"divergence at a near-tie: step {div.step}, margin {div.margin:.4g}, "
            f"logit diff {div.diff:.4g}"
        )
    return ref_tokens, tokens


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tiny_model_in_simulator(family):
    ref, patched = build(family, torch.float16)
    rep = patched.kaio_report
    assert rep["attention"] == 2 and rep["rms_norm"] == 5 and rep["linear"] == 9
    assert rep["kept"] == []
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (1, 12), generator=g)
    with torch.no_grad(), kaio.simulate():
        got = patched(input_ids=ids).logits.float()
        want = ref(input_ids=ids).logits.float()
        assert torch.isfinite(got).all()
        assert rel_err(got, want) < 2e-2
        check_generation(ref, patched, ids[:, :8], steps=3)


@pytest.mark.parametrize("keyword", ["past_key_values", "cache"])
def test_batched_decode_in_simulator(monkeypatch, keyword):
    """Decode steps of a batch of 2: q, k and v come out of one rope call over every head of
    the batch as strided views (``hf._decode_qkv``); each step's logits, both models fed the
    same tokens, agree with the unpatched model's. The patched model takes its cache under
    either keyword (transformers 5.24 renames ``past_key_values`` to ``cache``)."""
    ref, patched = build("llama", torch.float16)
    calls = []
    monkeypatch.setattr(hf, "_decode_qkv", lambda *a: calls.append(1) or _decode_qkv(*a))
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(2))
    caches = [transformers.DynamicCache(config=m.config) for m in (ref, patched)]
    keywords = (hf.cache_keyword(ref.forward), keyword)
    with torch.no_grad(), kaio.simulate():
        for step in range(3):
            want, got = (
                m(input_ids=ids, use_cache=True, **{kw: c}).logits[:, -1].float()
                for m, c, kw in zip((ref, patched), caches, keywords, strict=True)
            )
            # 1e-3 here; an unrotated k (a wrong view) gives 1e-2
            assert rel_err(got, want) < 4e-3, f"step {step}"
            ids = want.argmax(-1, keepdim=True)
    assert len(calls) == 4  # 2 layers x the 2 decode steps after the prefill


_decode_qkv = hf._decode_qkv


class CountingOps:
    """Stands for ``torch.ops.kaio`` in ``kaio_ops.hf``, counting the calls of each op."""

    def __init__(self):
        self.calls: dict = {}

    def __getattr__(self, name):
        op = getattr(torch.ops.kaio, name)

        def call(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return op(*args, **kwargs)

        return call


def test_static_cache_generation_in_simulator(monkeypatch):
    """A static cache (transformers' StaticCache) written by kaio: each step rotates q and k
    and appends k and v in one kv_cache_append_rope per layer, a 20-token prompt takes
    flash_attention, the steps flash_attention_decode over the cache; greedy tokens of a
    batch of 2 equal the unpatched model's (dynamic cache) up to a near-tie, and the cache's
    count (transformers' get_seq_length) follows the steps."""
    ref, patched = build("llama", torch.float16)
    counting = CountingOps()
    monkeypatch.setattr(hf, "ops", counting)
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(5))
    with kaio.simulate():
        check_generation(ref, patched, ids, steps=3, cache="static")
    calls = counting.calls
    assert calls["kv_cache_append_rope"] == 2 * 3  # 2 layers x (prefill + 2 decode steps)
    assert calls["flash_attention"] == 2 and calls["flash_attention_decode"] == 4
    assert "rope" not in calls and "kv_cache_append" not in calls
    # a cache of more positions than max_position_embeddings (256): the tables grow to it
    cache = transformers.StaticCache(config=patched.config, max_cache_len=300)
    with torch.no_grad(), kaio.simulate():
        patched(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
        patched(input_ids=ids[:, 5:6], past_key_values=cache, use_cache=True)
    assert [int(layer.cumulative_length) for layer in cache.layers] == [6, 6]
    ((cos, sin),) = patched.model.rotary_emb._tables.values()
    assert cos.shape == sin.shape == (300, 32)


def test_int4_in_simulator():
    ref, patched = build("llama", torch.float16)
    q = hf.apply(copy.deepcopy(ref), quantize="int4")
    ids = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), kaio.simulate():
        got = q(input_ids=ids).logits.float()
        dense = patched(input_ids=ids).logits.float()
        want = ref(input_ids=ids).logits.float()
    # int4 weights move the logits (round-to-nearest, 15 levels a group): closer to the f16
    # model than a model of unrelated weights, and finite
    assert torch.isfinite(got).all()
    assert rel_err(got, want) < 0.5 * rel_err(torch.zeros_like(want) + want.mean(), want)
    assert rel_err(dense, want) < rel_err(got, want)


def test_quantize_int4_round_trip():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(24, 256, generator=g) * 0.05
    packed, scales = hf.quantize_int4(w)
    assert packed.dtype == torch.int32 and packed.shape == (32, 24)
    assert scales.dtype == torch.float16 and scales.shape == (2, 24)
    # unpack independently: nibble j of word r is row 8 r + j, signed
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nib = torch.stack([(words >> (4 * j)) & 0xF for j in range(8)], 1).reshape(256, 24)
    q = torch.where(nib >= 8, nib - 16, nib).double()
    deq = q * scales.double().repeat_interleave(128, 0)
    step = scales.double().repeat_interleave(128, 0)
    assert ((deq - w.t().double()).abs() <= 0.5 * step + 1e-6).all()
    assert torch.equal(hf.dequantize_int4(packed, scales), deq.t().half())


def test_int4_dense_prefill_in_simulator(monkeypatch):
    """With ``dense_prefill``, an int4 model's prompt of more than ``DENSE_ROWS`` tokens
    (64; 8 here) takes the f16 GEMM (``linear``) on the dequantized weights: its logits equal
    those of the int4 kernels to rounding."""
    ref, _ = build("llama", torch.float16)
    q4 = hf.apply(copy.deepcopy(ref), quantize="int4", dense_prefill=True)
    monkeypatch.setattr(hf, "DENSE_ROWS", 8)  # a short prompt for the simulator
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(6))
    counting = CountingOps()
    monkeypatch.setattr(hf, "ops", counting)
    with torch.no_grad(), kaio.simulate():
        dense = q4(input_ids=ids).logits.float()
        assert counting.calls.get("linear") == 9 and "matmul_int4" not in counting.calls
        hf.set_dense_prefill(q4, False)
        packed = q4(input_ids=ids).logits.float()
        assert counting.calls["matmul_int4"] == 8  # lm_head stays dense
    assert rel_err(dense, packed) < 2e-3


def test_unsupported_model_is_refused():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
    model = transformers.GPT2LMHeadModel(config).half()
    with pytest.raises(ValueError, match="not supported; supported families: llama"):
        hf.apply(model)
    ref, _ = build("llama", torch.float16)
    with pytest.raises(ValueError, match="quantize must be None or 'int4'"):
        hf.apply(ref, quantize="int8")
    with pytest.raises(ValueError, match="f16 or bf16"):
        hf.apply(copy.deepcopy(ref).float())


def test_model_forward_refuses_padding_and_falls_back_for_hidden_states(monkeypatch):
    """The patched model's shorter forward: a prompt whose mask has padding raises (kaio's
    attention has no mask), a decode step's mask is not read (no synchronization), and a
    call asking for hidden states goes to the model's own forward (its hooks record them)."""
    ref, patched = build("llama", torch.float16)
    ids = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(8))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad(), kaio.simulate():
        with pytest.raises(NotImplementedError, match="padding"):
            patched(input_ids=ids, attention_mask=mask)
        out = patched(input_ids=ids, output_hidden_states=True)
        want = ref(input_ids=ids, output_hidden_states=True)
        assert len(out.hidden_states) == len(want.hidden_states) == 3
        assert rel_err(out.hidden_states[1].float(), want.hidden_states[1].float()) < 2e-2
        cache = transformers.StaticCache(config=patched.config, max_cache_len=16)
        patched(input_ids=ids, past_key_values=cache, attention_mask=torch.ones(2, 6))
        mask = torch.ones(2, 7)
        monkeypatch.setattr(torch.Tensor, "all", lambda *_: pytest.fail("mask read"))
        patched(input_ids=ids[:, :1], past_key_values=cache, attention_mask=mask)


def test_gemma2_reports_what_it_keeps():
    _, patched = build("gemma2", torch.float16, hidden_activation="gelu_pytorch_tanh")
    rep = patched.kaio_report
    assert rep["rms_norm"] == 9 and rep["linear"] == 15
    assert any("soft-capping" in k for k in rep["kept"])


# ---------------------------------------------------------------------------- GPU
GPU_FAMILIES = ["llama", "mistral", "qwen2"]


def gpu_size(**changes) -> dict:
    """The GPU tests' model size (over tiny_config's): 8 query and 2 KV heads of 128, 2
    layers, with ``changes``."""
    size = dict(
        hidden_size=512,
        intermediate_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        num_hidden_layers=2,
        vocab_size=512,
    )
    return {**size, **changes}


@pytest.mark.gpu
@pytest.mark.parametrize("family", GPU_FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_generation_on_gpu(family, dtype):
    extra = gpu_size(head_dim=64, num_hidden_layers=4)
    ref, patched = build(family, dtype, device="cuda", **extra)
    ids = torch.randint(
        0, 512, (2, 40), device="cuda", generator=torch.Generator("cuda").manual_seed(4)
    )
    with torch.no_grad():
        got = patched(input_ids=ids).logits.float()
        want = ref(input_ids=ids).logits.float()
    assert rel_err(got, want) < (2e-2 if dtype == torch.bfloat16 else 5e-3)
    check_generation(ref, patched, ids, steps=64)
    check_generation(ref, patched, ids, steps=64, cache="static")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_static_cache_generate_on_gpu(batch):
    """``generate(cache_implementation="static", disable_compile=True)`` on the patched model
    (kaio writes transformers' StaticCache in place, eagerly) gives the unpatched model's
    greedy tokens (dynamic cache) up to a near-tie, reported with its step and margin; and
    ``greedy`` with a static cache the same."""
    extra = gpu_size(num_hidden_layers=4)
    ref, patched = build("llama", torch.float16, device="cuda", **extra)
    # tokens from 1: generate() takes pad_token_id's tokens (0) in the prompt for padding
    ids = torch.randint(
        1, 512, (batch, 40), device="cuda", generator=torch.Generator("cuda").manual_seed(7)
    )
    check_generation(ref, patched, ids, steps=32, cache="static")
    with torch.no_grad():
        # min_new_tokens: no sequence stops early at the config's eos token (2), so both
        # calls return 16 tokens a sequence whatever a near-tie changed
        args = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
        want = ref.generate(ids, **args)
        got = patched.generate(ids, cache_implementation="static", disable_compile=True, **args)
    assert got.shape == want.shape
    differ = (got != want).any(0).nonzero()
    if differ.numel():  # a near-tie of random weights: greedy() above checked the margins
        print(f"generate: first different token at {int(differ[0]) - ids.shape[1]}")
    else:
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_gemma2_on_gpu():
    extra = gpu_size(head_dim=64, hidden_activation="gelu_pytorch_tanh")
    ref, patched = build("gemma2", torch.float16, device="cuda", **extra)
    ids = torch.randint(0, 512, (1, 32), device="cuda")
    with torch.no_grad():
        assert (
            rel_err(patched(input_ids=ids).logits.float(), ref(input_ids=ids).logits.float()) < 1e-2
        )


@pytest.mark.gpu
def test_int4_generation_on_gpu():
    extra = gpu_size()
    ref, _ = build("llama", torch.float16, device="cuda", **extra)
    q = hf.apply(copy.deepcopy(ref), quantize="int4")
    ids = torch.randint(0, 512, (4, 16), device="cuda")
    tokens, _ = greedy(q, ids, 8)
    assert tokens.shape == (4, 8)
    with torch.no_grad():
        assert rel_err(q(input_ids=ids).logits.float(), ref(input_ids=ids).logits.float()) < 0.3


@pytest.mark.gpu
def test_static_cache_decode_in_cuda_graph():
    """Decode steps from a static cache, one captured in a CUDA graph and replayed at later
    positions, give the logits of the same steps made eagerly (lengths are read on the GPU,
    so one capture serves every position)."""
    extra = gpu_size()
    _, model = build("llama", torch.float16, device="cuda", **extra)
    b, prompt, steps = 2, 24, 4
    ids = torch.randint(0, 512, (b, prompt), device="cuda")
    toks = torch.randint(0, 512, (steps + 2, b, 1), device="cuda")

    def run(use_graph: bool) -> list:
        """Prefill, two eager steps (positions 24, 25), then ``steps`` more (26, ...): in a
        graph captured once, or eagerly. transformers' static layers write each step at
        their running count, which the positions here keep equal."""
        cache = transformers.StaticCache(config=model.config, max_cache_len=64)
        tok = torch.empty_like(toks[0])
        pos = torch.empty((1, 1), device="cuda", dtype=torch.long)

        def step():
            return model(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True)

        model(input_ids=ids, past_key_values=cache, use_cache=True)
        for i in range(2):
            tok.copy_(toks[i])
            pos.fill_(prompt + i)
            step()
        if use_graph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # captured, not run: the cache count stays
                logits = step().logits
        out = []
        for i in range(2, steps + 2):
            tok.copy_(toks[i])
            pos.fill_(prompt + i)
            if use_graph:
                graph.replay()
                out.append(logits.float().clone())
            else:
                out.append(step().logits.float())
        return out

    with torch.no_grad():
        eager, replayed = run(False), run(True)
    for e, r in zip(eager, replayed, strict=True):
        assert torch.isfinite(r).all()
        assert rel_err(r, e) < 1e-3


# ---------------------------------------------------------------------------- tensor parallel
def run_tensor_parallel(tmp_path, *flags: str) -> dict:
    """bench/e2e_tp.py over two processes (torchrun) with ``flags``: its result."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("accelerate")  # transformers' tensor-parallel loading needs it
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "tp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += [str(root / "bench" / "e2e_tp.py"), *flags, "--out", str(out)]
    cmd += ["--model-dir", str(tmp_path / "model")]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def check_tensor_parallel(result: dict, tolerance: float) -> None:
    """The split patched model's greedy tokens equal the split unpatched model's and the
    whole unpatched model's (or diverge only at a near-tie), with close first logits."""
    assert result["world"] == 2 and result["kept"][0].startswith("lm_head")
    for key in ("split_vs_split", "split_vs_single"):
        row = result[key]
        assert row["logit_rel_err"] < tolerance, (key, row)
        assert row["equal"] or row["near_tie"], (key, row)
        if not row["equal"]:
            print(f"{key}: divergence at a near-tie: {row}")


def test_tensor_parallel_tiny_on_cpu(tmp_path):
    """A tiny one-layer Llama split over two processes by transformers' plan (gloo), patched,
    on the simulator, two greedy tokens (the GPU test runs two layers and 32 tokens)."""
    flags = ("--tiny", "--cpu", "--layers", "1", "--steps", "2")
    check_tensor_parallel(run_tensor_parallel(tmp_path, *flags), 2e-2)


@pytest.mark.gpu
def test_tensor_parallel_on_two_gpus(tmp_path):
    """The same over two GPUs (NCCL), 32 greedy tokens."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    check_tensor_parallel(run_tensor_parallel(tmp_path, "--tiny", "--steps", "32"), 1e-2)
