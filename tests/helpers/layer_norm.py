"""Inputs of the add_layer_norm / add_rms_norm tests (fresh seeded values, never zeros), and their
outputs and gradients with the gradient flowing through the norm, the sum, or both."""
import torch


def make_inputs(shape, dtype, dev, seed, param_dtype=None):
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = torch.randn(shape, generator=g).to(dev, dtype)
    res = (torch.randn(shape, generator=g) * 3 + 1).to(dev, dtype)
    w = (1 + 0.5 * torch.randn(n, generator=g)).to(dev, param_dtype or dtype)
    b = (0.5 * torch.randn(n, generator=g)).to(dev, param_dtype or dtype)
    dy = torch.randn(shape, generator=g).to(dev, dtype)
    return x, res, w, b, dy


def outputs_and_grads(fn, inputs, dy, ds, through):
    """fn(*inputs) -> (y, s) on fresh leaf copies, backward from y (dy), s (ds) or both ("y", "s",
    "both"); or fn -> y alone ("plain") -> ([the outputs], [the gradient of each input, None where
    none flows])."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    if through == "plain":
        out.backward(dy.to(out.dtype))
        return [out.detach()], [t.grad for t in leaves]
    y, s = out
    outs, grads = [], []
    if through in ("y", "both"):
        outs, grads = outs + [y], grads + [dy.to(y.dtype)]
    if through in ("s", "both"):
        outs, grads = outs + [s], grads + [ds.to(s.dtype)]
    torch.autograd.backward(outs, grads)
    return [y.detach(), s.detach()], [t.grad for t in leaves]
