"""fastbert's BERT classes beside transformers': tiny random-weight pairs, batches with mixed
padding, labels for each head, and the comparison of every output, loss and gradient at real tokens."""
import pytest
import torch

import fastbert

transformers = pytest.importorskip("transformers")

HEADS = [
    "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering",
]
TINY = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2)}


def pair(name, cfg, seed=0):
    torch.manual_seed(seed)
    hc = transformers.BertConfig(**cfg, num_labels=2 if name == "BertForQuestionAnswering" else 3)
    hm = getattr(transformers, name)(hc).eval()
    fm = getattr(fastbert, name)(fastbert.BertConfig(**hc.to_dict())).eval()
    fm.load_transformers_state_dict(hm.state_dict())
    return hm, fm


def batch(vocab, bsz, seq, g, pad=True):
    ids = torch.randint(1, vocab, (bsz, seq), generator=g)
    mask = torch.ones(bsz, seq, dtype=torch.long)
    if pad:
        for b in range(1, bsz):
            mask[b, int(torch.randint(1, seq, (1,), generator=g)):] = 0
    tt = (torch.arange(seq) >= seq // 2).long().expand(bsz, seq).clone() * mask
    return ids * mask, mask, tt


def labels_for(name, fm, ids, mask, g):
    bsz, seq = ids.shape
    tok = torch.where(torch.rand(bsz, seq, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    tok[mask == 0] = -100
    if name == "BertForPreTraining":
        return dict(labels=tok, next_sentence_label=torch.randint(0, 2, (bsz,), generator=g))
    if name == "BertForMaskedLM":
        return dict(labels=tok)
    if name == "BertForSequenceClassification":
        return dict(labels=torch.randint(0, 3, (bsz,), generator=g))
    if name == "BertForTokenClassification":
        t = torch.randint(0, 3, (bsz, seq), generator=g)
        t[mask == 0] = -100
        return dict(labels=t)
    if name == "BertForQuestionAnswering":
        return {}  # its loss softmaxes over padded positions too: checked on a batch without padding
    return {}


def compare(name, hm, fm, ids, mask, tt, extra, dtype, check_grads=True):
    real = mask.bool()
    hout = hm(input_ids=ids, attention_mask=mask, token_type_ids=tt, **extra)
    fout = fm(ids, mask, tt, **extra)
    tol = TOL[dtype]
    weights = {}
    g = torch.Generator().manual_seed(5)
    total_h, total_f = 0.0, 0.0
    for key in fout.keys():
        a, b = fout[key], hout[key]
        if key == "loss":
            torch.testing.assert_close(a.float(), b.float(), **tol, msg=f"{name} loss")
            total_h, total_f = total_h + b.float(), total_f + a.float()
            continue
        if a.dim() >= 2 and tuple(a.shape[:2]) == tuple(ids.shape):
            a, b = a[real], b[real]
        torch.testing.assert_close(a.float(), b.float(), **tol, msg=f"{name} {key}")
        weights[key] = torch.randn(a.shape, generator=g)
        total_h = total_h + (b.float() * weights[key]).sum()
        total_f = total_f + (a.float() * weights[key]).sum()
    if not check_grads:
        return
    total_h.backward()
    total_f.backward()
    hgrads = dict(hm.named_parameters(remove_duplicate=False))  # a tied weight under either name
    for pname, p in fm.named_parameters():
        hp = hgrads[pname]
        if hp.grad is None and p.grad is None:
            continue
        assert p.grad is not None and hp.grad is not None, f"{name}: no gradient for {pname}"
        scale = max(1.0, hp.grad.abs().max().item())
        torch.testing.assert_close(p.grad.float() / scale, hp.grad.float() / scale, **tol, msg=f"{name} grad {pname}")
