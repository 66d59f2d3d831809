"""The other BERT families (RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT, GTE, NomicBERT, Jina v3,
DeBERTa-v2)
beside transformers' classes: each family's configuration at a small size, random-weight pairs, batches
and labels."""
import pytest
import torch

import fastbert

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# each family's own structure at a small size: RoBERTa-style positions from pad + 1 (a table of
# max tokens + 2), one token type, pad id 1; ELECTRA's narrower embeddings and their projection
CONFIGS = {
    "roberta": dict(SMALL, vocab_size=120, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1),
    "xlm-roberta": dict(SMALL, vocab_size=120, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1),
    "camembert": dict(SMALL, vocab_size=120, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1),
    "electra": dict(SMALL, vocab_size=97, embedding_size=32, max_position_embeddings=64),
    # DistilBERT's own field names
    "distilbert": dict(vocab_size=97, dim=64, n_layers=2, n_heads=2, hidden_dim=96, dropout=0.0, attention_dropout=0.0,
                       max_position_embeddings=64),
    # rotary positions (no table), a gated feed-forward, two token types (gte-multilingual-base has one)
    "gte": dict(SMALL, vocab_size=120, type_vocab_size=2, pad_token_id=1),
    # GTE's layer without biases, SwiGLU
    "nomic_bert": dict(SMALL, vocab_size=120, type_vocab_size=2),
    # GTE's layer with BERT's feed-forward, RoBERTa's heads
    "jina_embeddings_v3": dict(SMALL, vocab_size=120, type_vocab_size=1, pad_token_id=1),
    # deberta-v3's structure: relative attention (c2p and p2c, shared projections) over log buckets (16
    # here, which the batches' distances outgrow), the relative embeddings normalised, no absolute
    # positions, no token types
    "deberta-v2": dict(SMALL, vocab_size=120, type_vocab_size=0, relative_attention=True, position_buckets=16,
                       max_relative_positions=64, pos_att_type="p2c|c2p", share_att_key=True,
                       norm_rel_ebd="layer_norm", position_biased_input=False, pad_token_id=0),
}
PREFIX = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert", "electra": "Electra",
          "distilbert": "DistilBert", "gte": "Gte",
          "nomic_bert": "NomicBert", "jina_embeddings_v3": "JinaEmbeddingsV3",
          "deberta-v2": "DebertaV2"}


def hf_config(family, **kw):
    return transformers.AutoConfig.for_model(family, **CONFIGS[family], **kw)


def pair(family, name, tmp_path=None, seed=0):
    """(transformers' model, fastbert's), the same random weights; fastbert's through
    from_pretrained when tmp_path is given, else load_state_dict."""
    torch.manual_seed(seed)
    hc = hf_config(family, num_labels=2 if name.endswith("QuestionAnswering") else 3)
    hm = getattr(transformers, name)(hc).eval()
    if tmp_path is None:
        cls = getattr(fastbert, name)
        fm = cls(cls.config_class(**hc.to_dict())).eval()
        fm.load_transformers_state_dict(hm.state_dict())
    else:
        hm.save_pretrained(tmp_path)
        fm = getattr(fastbert, name).from_pretrained(str(tmp_path))
    return hm, fm


def batch(family, bsz, seq, g, pad=True):
    cfg = CONFIGS[family]
    ids = torch.randint(3, cfg["vocab_size"], (bsz, seq), generator=g)
    mask = torch.ones(bsz, seq, dtype=torch.long)
    if pad:
        for b in range(1, bsz):
            mask[b, int(torch.randint(1, seq, (1,), generator=g)):] = 0
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, cfg.get("pad_token_id", 0)))
    if family == "distilbert":  # no token types
        return ids, mask, None
    tt = torch.zeros_like(ids) if cfg.get("type_vocab_size", 2) == 1 else (torch.arange(seq) >= seq // 2).long() * mask
    return ids, mask, tt


def labels_for(name, ids, mask, g):
    bsz, seq = ids.shape
    if name.endswith("ForMaskedLM"):
        tok = torch.where(torch.rand(bsz, seq, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        tok[mask == 0] = -100
        return dict(labels=tok)
    if name.endswith("ForSequenceClassification"):
        return dict(labels=torch.randint(0, 3, (bsz,), generator=g))
    if name.endswith("ForTokenClassification"):
        t = torch.randint(0, 3, (bsz, seq), generator=g)
        t[mask == 0] = -100
        return dict(labels=t)
    if name == "ElectraForPreTraining":
        return dict(labels=torch.randint(0, 2, (bsz, seq), generator=g))
    return {}
