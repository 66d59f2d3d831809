"""NomicBERT (nomic-embed-text-v1 / v1.5): GTE's layer (gte.py: rotary positions, a gated
feed-forward, BertLayer's code) without biases, with NomicBERT's names and heads.

What differs from GTE, and is all that is written here:
- no projection has a bias (the QKV, the attention output, gate / up / down) and the feed-forward has
  no dropout of its own; SwiGLU by default (hidden_act "silu"); always two token types;
- the weights live under "nomic_bert."; the files keep the original model's names (the QKV joined as
  attn.Wqkv, attn.out_proj, mlp.fc11 (up) / fc12 (gate) / fc2, norm1 / norm2, emb_ln, the layers
  under encoder.layers), which transformers reads and writes: fastbert reads both and writes the files';
- the MLM head is BERT's (cls.predictions, its decoder tied to the word embeddings, its bias
  cls.predictions.bias) with its norm named layer_norm; the classifiers are BERT's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastbert import ops
from fastbert.model.checkpoint import KeyFormat
from fastbert.model.config import NomicBertConfig
from fastbert.model.gte import GteLayer, GteModel
from fastbert.model.heads import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification
from fastbert.model.layers import BertOnlyMLMHead, BertPredictionHeadTransform, bias_activation

CHECKPOINT_FORMAT = KeyFormat(
    renames=(("encoder.layers.", "layers."), ("emb_ln.", "embeddings.LayerNorm."),
             ("attn.out_proj.", "self_attn.o_proj."), ("mlp.fc11.", "mlp.up_proj."), ("mlp.fc12.", "mlp.gate_proj."),
             ("mlp.fc2.", "mlp.down_proj."), ("norm1.", "post_attention_layernorm."),
             ("norm2.", "post_mlp_layernorm.")),
    joins=(("attn.Wqkv.", ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")),))


class NomicBertLayer(GteLayer):
    """GTE's layer with no biases."""

    biased = False


class NomicBertModel(GteModel):
    config_class = NomicBertConfig
    base_model_prefix = "nomic_bert"
    layer_class = NomicBertLayer
    checkpoint_format = CHECKPOINT_FORMAT


class NomicBertPredictionHeadTransform(BertPredictionHeadTransform):
    """dense, hidden_act, layer_norm (BERT's transform, its norm under NomicBERT's name)."""

    def __init__(self, config: NomicBertConfig):
        super().__init__(config)
        self.layer_norm = self.LayerNorm
        del self.LayerNorm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = ops.linear(hidden, self.dense.weight, backend=self.backend)
        h = bias_activation(h, self.dense.bias, self.hidden_act, self.backend)
        norm = self.layer_norm
        return F.layer_norm(h, h.shape[-1:], norm.weight, norm.bias, norm.eps)


class _NomicBertHead:
    config_class = NomicBertConfig
    base_model_prefix = "nomic_bert"
    model_class = NomicBertModel
    checkpoint_format = CHECKPOINT_FORMAT


class NomicBertForMaskedLM(_NomicBertHead, BertForMaskedLM):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "nomic_bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def _add_lm_head(self, config) -> None:
        self.cls = BertOnlyMLMHead(config)
        self.cls.predictions.transform = NomicBertPredictionHeadTransform(config)


class NomicBertForSequenceClassification(_NomicBertHead, BertForSequenceClassification):
    pass


class NomicBertForTokenClassification(_NomicBertHead, BertForTokenClassification):
    pass


NOMIC_BERT_CLASSES = (NomicBertModel, NomicBertForMaskedLM, NomicBertForSequenceClassification,
                      NomicBertForTokenClassification)
