"""torch.ops.kaio.matmul and torch.ops.kaio.linear beyond the table of tests/test_torch_ops.py:
keyword arguments (residual, activation, out_dtype), gradients of every input for each
activation against float64 torch autograd (simulator), torch.compile with fullgraph on meta
tensors and against eager on the simulator; marked gpu, the same on CUDA tensors."""

from __future__ import annotations

import pytest

import kaio
from tests.linear_reference import torch_linear_reference as reference

torch = pytest.importorskip("torch")
kt = pytest.importorskip("kaio_ops.torch")


def inputs(device, dtype, activation, m=(2, 5), k=24, n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * n if activation == "silu_gate" else n

    def r(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(device, dtype)

    return r(*m, k), r(rows, k, scale=0.3), r(rows), r(*m, n)


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu", "silu_gate"])
def test_linear_keywords_and_gradients_on_simulator(activation):
    dtype = torch.bfloat16 if activation in ("gelu", "silu_gate") else torch.float16
    x, w, b, res = inputs("cpu", dtype, activation)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, res)]
    with kaio.simulate():
        y = torch.ops.kaio.linear(*leaves[:3], residual=leaves[3], activation=activation)
        up = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        (y.double() * up.double()).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w, b, res)]
    ref = reference(*ref_leaves[:3], residual=ref_leaves[3], activation=activation)
    (ref * up.double()).sum().backward()
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    assert y.dtype == dtype and rel(y, ref) < tol
    for ours, theirs in zip(leaves, ref_leaves, strict=True):
        assert ours.grad is not None and ours.grad.dtype == dtype
        assert rel(ours.grad, theirs.grad) < tol


def test_matmul_out_dtype_and_gradient_on_simulator():
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(5, 24, generator=gen).half().requires_grad_()
    b = torch.randn(24, 8, generator=gen).half().requires_grad_()
    with kaio.simulate():
        c = torch.ops.kaio.matmul(a, b, out_dtype=torch.float32)
        c.sum().backward()
    ref = a.detach().double() @ b.detach().double()
    assert c.dtype == torch.float32 and rel(c, ref) < 1e-6
    ones = torch.ones(5, 8, dtype=torch.float64)
    assert rel(a.grad, ones @ b.detach().double().T) < 5e-3
    assert rel(b.grad, a.detach().double().T @ ones) < 5e-3


def block(x, w_up, w_down, b):
    """An MLP block: SwiGLU up projection, down projection with bias and residual."""
    h = torch.ops.kaio.linear(x, w_up, None, activation="silu_gate")
    return torch.ops.kaio.linear(h, w_down, b, residual=x)


def block_inputs(device, k=32, f=24, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(shape, generator=gen) * s).to(device, torch.float16)
        for shape, s in (((6, k), 1.0), ((2 * f, k), 0.2), ((k, f), 0.2), ((k,), 1.0))
    ]


def test_torch_compile_fullgraph_on_meta_tensors():
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")(gm, example_inputs)

    fn = torch.compile(block, backend=backend, fullgraph=True)
    args = [t.to("meta").requires_grad_() for t in block_inputs("cpu")]
    y = fn(*args)
    assert y.shape == (6, 32) and y.dtype == torch.float16 and y.device.type == "meta"
    y.sum().backward()
    assert all(a.grad is not None and a.grad.shape == a.shape for a in args)
    assert len(graphs) == 1
    called = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert any("kaio.linear" in c for c in called)


def test_torch_compile_matches_eager_on_simulator():
    torch._dynamo.reset()
    args = block_inputs("cpu")
    with kaio.simulate():
        eager = block(*args)
        compiled = torch.compile(block, backend="aot_eager", fullgraph=True)(*args)
    assert torch.equal(eager, compiled)


@pytest.mark.gpu
def test_gpu_linear_gradients_and_compile():
    x, w, b, res = inputs("cuda", torch.bfloat16, "silu_gate", m=(3, 100), k=512, n=256)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, res)]
    y = torch.ops.kaio.linear(*leaves[:3], residual=leaves[3], activation="silu_gate")
    y.float().sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w, b, res)]
    ref = reference(*ref_leaves[:3], residual=ref_leaves[3], activation="silu_gate")
    ref.sum().backward()
    assert rel(y, ref) < 3e-2
    for ours, theirs in zip(leaves, ref_leaves, strict=True):
        assert rel(ours.grad, theirs.grad) < 3e-2
    torch._dynamo.reset()
    args = block_inputs("cuda", k=512, f=384)
    assert torch.equal(block(*args), torch.compile(block, fullgraph=True)(*args))
