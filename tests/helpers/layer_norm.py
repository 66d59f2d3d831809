"""Inputs of the add_layer_norm tests: fresh seeded values, never zeros."""
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
