"""`fastbert selfcheck`: every fused op on every backend this machine can run, against the fp64
reference, forward and every gradient, with the error bound the tests use:

    err(backend, fp64 reference) <= 2 * err(torch in the same dtype, fp64 reference) + ATOL[dtype] * scale
"""
from __future__ import annotations

import sys
from typing import Callable, List, Sequence, Tuple

import torch

import fastbert
from fastbert import backend as fb_backend
from fastbert import reference

ATOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def bound_check(out: torch.Tensor, torch_out: torch.Tensor, ref64: torch.Tensor, dtype) -> Tuple[bool, float, float]:
    """(ok, err, bound) of the error bound above; non-finite output is never ok."""
    err = (out.detach().double() - ref64.detach()).abs().max().item() if out.numel() else 0.0
    base = (torch_out.detach().double() - ref64.detach()).abs().max().item() if out.numel() else 0.0
    scale = max(1.0, ref64.abs().max().item()) if out.numel() else 1.0
    bound = 2 * base + ATOL[dtype] * scale
    ok = bool(torch.isfinite(out).all()) and out.shape == ref64.shape and err <= bound
    return ok, err, bound


def with_grads(fn: Callable, inputs: Sequence[torch.Tensor], grad_out: torch.Tensor):
    """fn(*inputs) on fresh leaf copies -> (output, [gradient of each input])."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(grad_out.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def available_backends(device: str) -> List[str]:
    names = ["torch"]
    if device == "cpu" and fb_backend.cpp_extension() is not None:
        names.append("cpp")
    if fb_backend.triton_available() and (device == "cuda" or fb_backend.triton_interpreting()):
        names.append("triton")
    return names


def cases(device: str, interpreted: bool):
    shapes = [(3, 7), (4, 768)] if interpreted else [(512, 768), (512, 3072), (333, 1023)]
    dtypes = [torch.float32, torch.float16] if interpreted else [torch.float32, torch.bfloat16]
    for op in ("bias_gelu", "add_layer_norm"):
        for shape in shapes:
            for dtype in dtypes:
                yield op, shape, dtype


def check_case(op: str, shape, dtype, backend: str, device: str) -> List[Tuple[str, bool, float, float]]:
    g = torch.Generator().manual_seed(0)
    m, n = shape
    x = torch.randn(m, n, generator=g).to(device, dtype)
    dy = torch.randn(m, n, generator=g).to(device, dtype)
    if op == "bias_gelu":
        inputs = [x, torch.randn(n, generator=g).to(device, dtype)]
        names = ["y", "dx", "dbias"]
        fused = lambda *a: fastbert.ops.bias_gelu(*a, backend=backend)  # noqa: E731
        ref = reference.bias_gelu
    else:
        inputs = [x, torch.randn(m, n, generator=g).to(device, dtype),
                  (1 + torch.randn(n, generator=g)).to(device, dtype), torch.randn(n, generator=g).to(device, dtype)]
        names = ["y", "dx", "dresidual", "dweight", "dbias"]
        p, seed = 0.1, 1234
        keep = reference.dropout_keep_mask(seed, shape, p, device)
        fused = lambda *a: fastbert.ops.add_layer_norm(*a, dropout_p=p, seed=seed, backend=backend)  # noqa: E731
        ref = lambda *a: reference.add_layer_norm(*a, dropout_p=p, keep_mask=keep)  # noqa: E731
    got = with_grads(fused, inputs, dy)
    base = with_grads(ref, inputs, dy)
    r64 = with_grads(ref, [t.double() for t in inputs], dy.double())
    return [(name, *bound_check(a, b, c, dtype)) for name, a, b, c in zip(names, got, base, r64)]


def main(argv=None) -> int:
    import argparse

    from tqdm import tqdm

    ap = argparse.ArgumentParser(prog="fastbert selfcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = args.device
    backends = available_backends(device)
    print(f"fastbert {fastbert.__version__}, torch {torch.__version__}, device {device}, backends {backends}")
    todo = [(b, *c) for b in backends for c in cases(device, b == "triton" and device == "cpu")]
    failures, lines = 0, []
    for b, op, shape, dtype in tqdm(todo, desc="selfcheck", file=sys.stderr):
        for name, ok, err, bound in check_case(op, shape, dtype, b, device):
            failures += not ok
            lines.append(f"{b:<8}{op:<16}{str(shape):<14}{str(dtype)[6:]:<10}{name:<11}{err:>11.2e}{bound:>11.2e}  "
                         + ("ok" if ok else "FAIL"))
    print(f"{'backend':<8}{'op':<16}{'shape':<14}{'dtype':<10}{'tensor':<11}{'max err':>11}{'bound':>11}")
    print("\n".join(lines))
    print(f"{len(lines) - failures} passed, {failures} failed")
    return 1 if failures else 0
