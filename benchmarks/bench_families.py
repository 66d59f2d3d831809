"""The families on fastbert's one encoder, each built by transformers from its real base configuration
with random weights (roberta-base, xlm-roberta-base with its 250,002-token vocabulary, camembert-base,
electra-small-discriminator with its 128-wide embeddings and their projection, distilbert-base,
bert-base, gte-multilingual-base (rotary, gated feed-forward, 250,048 tokens), nomic-embed-text-v1.5
(no biases, SwiGLU), jina-embeddings-v3 (XLM-R large's widths, rotary), EuroBERT-210m (a pre-norm
encoder: RMSNorm, rotary, SwiGLU, 128,256 tokens), deberta-v3-base (the disentangled attention over
256 log buckets)), at --layers layers (--families: some of them); a class transformers does not
have for a family (GTE's and EuroBERT's question answering) is left out:

1. family x class: the max abs error of fastbert's outputs (at real tokens) and of every parameter's
   gradient (over the largest gradient of any parameter) against transformers in fp32 on the same
   batch, both backpropagating the same random weighting of the outputs; whether
   fastbert's save_pretrained directory loads in transformers with nothing missing or left over and
   the same outputs; for the base model, int8 (quantize="int8") against fp32: the cosine of every
   real token's hidden state, mean and min;
2. fastbert.patch on transformers' XLMRobertaModel at base size (--patch-layers): the same batch
   (32 sequences of 16..128 tokens) before and after the patch, in one process, and the max abs
   difference of the outputs;
3. the memory of fastbert's XLMRobertaModel at base size (12 layers), fp32 and quantize="int8": the
   bytes of every tensor it holds (each storage once), in all and in the word embeddings.

    python benchmarks/bench_families.py [--layers 2] [--patch-layers 12] [--rounds 3] [--families gte,deberta-v2]
"""
from __future__ import annotations

import copy
import statistics
import sys
import tempfile

import torch

import fastbert
from fastbert.bench.report import command_line, header, parser
from fastbert.bench.timing import interleaved_cpu_times
from fastbert.bench.workloads import ARCH_CONFIGS, WORKLOADS, arch_config, base_config, make_batch

REAL = {  # each family's published base configuration (what its config.json holds), but the depth
    "bert": ("Bert", dict()),
    "roberta": ("Roberta", dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                                layer_norm_eps=1e-5)),
    "xlm-roberta": ("XLMRoberta", dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
                                       pad_token_id=1, layer_norm_eps=1e-5)),
    "camembert": ("Camembert", dict(vocab_size=32005, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                                    layer_norm_eps=1e-5)),
    "electra": ("Electra", dict(embedding_size=128, hidden_size=256, num_attention_heads=4, intermediate_size=1024)),
    "distilbert": ("DistilBert", dict()),  # distilbert-base: BERT-base's widths under its own names
    "gte": ("Gte", dict(vocab_size=250048, max_position_embeddings=8192, type_vocab_size=1, pad_token_id=1)),
    "nomic_bert": ("NomicBert", dict(vocab_size=30528, max_position_embeddings=2048, type_vocab_size=2, pad_token_id=0)),
    "jina_embeddings_v3": ("JinaEmbeddingsV3", dict(vocab_size=250002, hidden_size=1024, num_attention_heads=16,
                                                    intermediate_size=4096, max_position_embeddings=8194,
                                                    type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)),
    "eurobert": ("EuroBert", dict()),  # transformers' EuroBertConfig defaults: EuroBERT-210m's widths
    "deberta-v2": ("DebertaV2", dict(ARCH_CONFIGS["deberta-v2"])),  # deberta-v3-base's
}
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]


def build(family, head, layers):
    import transformers

    prefix, extra = REAL[family]
    labels = 2 if head == "ForQuestionAnswering" else 3  # start and end
    if family == "distilbert":
        cfg = transformers.DistilBertConfig(n_layers=layers, dropout=0.0, attention_dropout=0.0, num_labels=labels)
    elif family == "eurobert":  # (its own field names; no dropout but the attention's, 0 by default)
        cfg = transformers.EuroBertConfig(num_hidden_layers=layers, num_labels=labels)
    else:
        cfg = transformers.AutoConfig.for_model(family, **{**base_config(layers), **extra}, num_labels=labels,
                                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hm = getattr(transformers, prefix + head)(cfg).eval()
    return hm, fastbert.hf.from_transformers(copy.deepcopy(hm)).eval()


def batch(cfg, g):
    ids, mask = make_batch(8, 8, 64, g, cfg.vocab_size, cfg.pad_token_id)
    return ids, mask


def main_output(out):
    for key in ("logits", "start_logits", "last_hidden_state"):
        if getattr(out, key, None) is not None:
            return out[key]


def errors(hm, fm, ids, mask):
    """(max abs output error at real tokens, the largest gradient error of any parameter / the
    largest gradient of any parameter)."""
    real = mask.bool()
    w = None
    totals = []
    outs = []
    for m in (hm, fm):
        m.zero_grad()
        y = main_output(m(input_ids=ids, attention_mask=mask))
        y = y[real] if y.shape[:2] == ids.shape else y
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9)) if w is None else w
        (y * w).sum().backward()
        outs.append(y.detach())
        totals.append(dict(m.named_parameters(remove_duplicate=False)))
    diff, scale = 0.0, 0.0
    for name, p in totals[1].items():
        q = totals[0][name]
        if p.grad is not None and q.grad is not None:
            diff = max(diff, (p.grad - q.grad).abs().max().item())
            scale = max(scale, q.grad.abs().max().item())
    grad_err = diff / scale
    return (outs[1] - outs[0]).abs().max().item(), grad_err


def reloads(hm, fm, ids, mask):
    import transformers

    with tempfile.TemporaryDirectory() as d:
        fm.save_pretrained(d)
        back, info = getattr(transformers, type(hm).__name__).from_pretrained(d, output_loading_info=True)
    clean = not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    with torch.no_grad():
        same = torch.allclose(main_output(back.eval()(input_ids=ids, attention_mask=mask)),
                              main_output(hm(input_ids=ids, attention_mask=mask)), atol=1e-5)
    return clean and same


def int8_cosine(hm, ids, mask):
    q = fastbert.hf.from_transformers(copy.deepcopy(hm)).eval().quantize_("int8")
    f = fastbert.hf.from_transformers(copy.deepcopy(hm)).eval()
    real = mask.bool()
    with torch.no_grad():
        a, b = q(ids, mask).last_hidden_state[real], f(ids, mask).last_hidden_state[real]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return cos.mean().item(), cos.min().item()


def family_table(layers, families):
    g = torch.Generator().manual_seed(0)
    print(f"\n{'family':<19} {'class':<42} {'out err':>9} {'grad err':>9} {'reload':>7} {'int8 cos mean/min':>18}")
    import transformers

    for family in families:
        for head in HEADS:
            if not hasattr(transformers, REAL[family][0] + head):
                continue
            hm, fm = build(family, head, layers)
            ids, mask = batch(hm.config, g)
            out_err, grad_err = errors(hm, fm, ids, mask)
            ok = reloads(hm, fm, ids, mask)
            cos = int8_cosine(hm, ids, mask) if head == "Model" else None
            cos_text = f"{cos[0]:.5f}/{cos[1]:.5f}" if cos else ""
            print(f"{family:<19} {type(fm).__name__:<42} {out_err:>9.2e} {grad_err:>9.2e} {'yes' if ok else 'NO':>7} "
                  f"{cos_text:>18}", flush=True)


def patch_speed(layers, rounds):
    import transformers

    torch.manual_seed(0)
    model = transformers.XLMRobertaModel(arch_config("xlm-roberta", layers)).eval()
    plain = copy.deepcopy(model)
    fastbert.patch(model)
    cfg = model.config
    ids, mask = make_batch(**WORKLOADS["var128"], g=torch.Generator().manual_seed(0), vocab=cfg.vocab_size,
                           pad_id=cfg.pad_token_id)
    real = mask.bool()
    with torch.no_grad():
        diff = (model(input_ids=ids, attention_mask=mask).last_hidden_state[real]
                - plain(input_ids=ids, attention_mask=mask).last_hidden_state[real]).abs().max().item()
        times = interleaved_cpu_times({"transformers": lambda: plain(input_ids=ids, attention_mask=mask),
                                       "patched": lambda: model(input_ids=ids, attention_mask=mask)},
                                      warmup=1, repeats=rounds)
    before, after = (statistics.median(times[k]) for k in ("transformers", "patched"))
    tokens = int(mask.sum())
    print(f"\nfastbert.patch(transformers XLMRobertaModel), base size, {layers} layers, var128 "
          f"({tokens} real tokens), fp32, median of {rounds}:")
    print(f"  before {before * 1e3:8.1f} ms  {tokens / before:8.0f} tokens/s")
    print(f"  after  {after * 1e3:8.1f} ms  {tokens / after:8.0f} tokens/s   {before / after:.2f}x;  "
          f"max abs difference {diff:.2e}")


def tensor_bytes(module) -> int:
    """Bytes of the tensors a module holds (parameters and buffers, each storage counted once)."""
    seen = {}
    for t in list(module.parameters()) + list(module.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def memory():
    import transformers

    torch.manual_seed(0)
    hf = transformers.XLMRobertaModel(arch_config("xlm-roberta", 12)).eval()
    fp32 = fastbert.hf.from_transformers(copy.deepcopy(hf)).eval()
    int8 = fastbert.hf.from_transformers(copy.deepcopy(hf)).eval().quantize_("int8")
    emb = tensor_bytes(fp32.embeddings.word_embeddings)
    print("\nfastbert XLMRobertaModel, xlm-roberta-base's configuration (12 layers, 250,002-token vocabulary):")
    for name, m in (("fp32", fp32), ("int8", int8)):
        total = tensor_bytes(m)
        print(f"  {name}: {total / 2**20:7.1f} MiB of tensors, of which the word embeddings {emb / 2**20:.1f} MiB "
              f"(float32, in both) and the rest {(total - emb) / 2**20:.1f} MiB")


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--patch-layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", default=None,
                    help="comma-separated model types: their table alone (default: every family, then the "
                         "patch and memory parts)")
    args = ap.parse_args(argv)
    header(command_line(argv))
    families = list(REAL) if args.families is None else args.families.split(",")
    unknown = [f for f in families if f not in REAL]
    if unknown:
        ap.error(f"--families: unknown {unknown}; known: {', '.join(REAL)}")
    family_table(args.layers, families)
    if args.families is None:
        patch_speed(args.patch_layers, args.rounds)
        memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
