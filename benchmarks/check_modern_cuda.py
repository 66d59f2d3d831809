"""ModernBERT-base and MPNet-base on a CUDA GPU: fastbert's Triton path (rotary, the sliding window,
GeGLU, LayerNorm without bias; MPNet's relative position bias) against transformers' own model on
the same GPU, the same random weights and the same padded batch (the var512 workload: 8 sequences
of 64..512 tokens):
the last hidden state at the real tokens and every parameter's gradient (of a fixed random weighting
of it), in fp32 and bf16, then the inference time of each (medians of CUDA-synchronized calls).

    python benchmarks/check_modern_cuda.py [--layers N] [--rounds 20] [--json PATH]

A parameter's gradient error is relative to the largest value of transformers' gradient of it.
Where that gradient is zero in exact arithmetic (attention's key bias: a constant added to every
score of a row, which the softmax removes), it is rounding noise in both models, so it is reported
as an absolute error apart from the others, as is any parameter whose gradient is under 1e-6 of the
model's largest. Errors are against transformers in the same dtype; in fp32 they are rounding noise
(about 1e-6 measured on an H200), in bf16 each model rounds its own way through every layer.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from fastbert.bench.workloads import MODERN_ARCHS, WORKLOADS, make_batch, modern_models


def batch(config, device: str):
    """(input_ids, attention_mask, a fixed random weighting of the last hidden state) of var512."""
    g = torch.Generator().manual_seed(1)
    w = WORKLOADS["var512"]
    ids, mask = make_batch(w["batch"], w["lo"], w["hi"], g, vocab=config.vocab_size, pad_id=config.pad_token_id)
    weight = torch.randn(*ids.shape, config.hidden_size, generator=g)
    return ids.to(device), mask.to(device), weight.to(device)


def outputs_and_grads(model, ids, mask, weight):
    model.zero_grad(set_to_none=True)
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    (hidden.float() * weight)[real].sum().backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return hidden.detach().float()[real], grads


def grad_errors(ours: dict, theirs: dict) -> dict:
    """worst relative error over the parameters, and the absolute error where the gradient is ~zero."""
    scale = max(g.abs().max().item() for g in theirs.values())
    rel, tiny = [], []
    for n, g in theirs.items():
        diff = (ours[n] - g).abs().max().item()
        if n.endswith("k.bias") or g.abs().max().item() < 1e-6 * scale:
            tiny.append((diff, n))
        else:
            rel.append((diff / g.abs().max().item(), n))
    worst = max(rel)
    return {"worst_rel": worst[0], "worst_param": worst[1], "near_zero_abs": max(tiny)[0] if tiny else 0.0,
            "missing": sorted(set(theirs) - set(ours))}


def inference_ms(model, ids, mask, rounds: int) -> float:
    times = []
    with torch.inference_mode():
        for i in range(rounds + 3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=None, help="default: each model's base depth (22, 12)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    import transformers
    import triton

    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"transformers {transformers.__version__}", flush=True)
    rows = []
    for name, (_, _, depth) in MODERN_ARCHS.items():
        theirs, ours = (m.to("cuda") for m in modern_models(name, args.layers or depth, "triton"))
        ids, mask, weight = batch(theirs.config, "cuda")
        for dtype in (torch.float32, torch.bfloat16):
            theirs.to(dtype)
            ours.to(dtype)
            want, want_grads = outputs_and_grads(theirs, ids, mask, weight)
            got, got_grads = outputs_and_grads(ours, ids, mask, weight)
            row = dict(model=name, layers=args.layers or depth, dtype=str(dtype).removeprefix("torch."),
                       real_tokens=int(mask.sum()), max_abs_err=(got - want).abs().max().item(),
                       grads=grad_errors(got_grads, want_grads),
                       ms={"fastbert": inference_ms(ours, ids, mask, args.rounds),
                           "transformers": inference_ms(theirs, ids, mask, args.rounds)})
            row["speedup"] = row["ms"]["transformers"] / row["ms"]["fastbert"]
            rows.append(row)
            gr = row["grads"]
            print(f"{name:<10} {row['dtype']:<8} {row['real_tokens']} real tokens: max abs err {row['max_abs_err']:.2e}; "
                  f"gradients: worst {gr['worst_rel']:.2e} of the parameter's largest ({gr['worst_param']}), "
                  f"near-zero ones {gr['near_zero_abs']:.1e} absolute, missing {gr['missing'] or 'none'}; inference "
                  f"fastbert {row['ms']['fastbert']:.2f} ms, transformers {row['ms']['transformers']:.2f} ms, "
                  f"{row['speedup']:.2f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(["python", "benchmarks/check_modern_cuda.py", *(argv or sys.argv[1:])]),
                       "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
