"""The torch reference of ``kaio_ops.linear``, shared by the op tests and the torch tests:
``linear``, then the activation, then the residual, in the inputs' own precision (give it
float64 tensors for a float64 reference)."""

from __future__ import annotations


def torch_linear_reference(x, w, bias=None, residual=None, activation=None):
    """``activation(x @ w.T + bias) + residual`` with torch ops ("silu_gate": w holds the
    gate rows then the up rows)."""
    import torch

    F = torch.nn.functional
    z = F.linear(x, w, bias)
    if activation == "silu_gate":
        g, u = z.chunk(2, -1)
        z = F.silu(g) * u
    elif activation == "gelu":
        z = F.gelu(z)
    elif activation == "gelu_tanh":
        z = F.gelu(z, approximate="tanh")
    elif activation == "silu":
        z = F.silu(z)
    return z if residual is None else z + residual
