"""Jina embeddings v3 (jina-embeddings-v3): XLM-RoBERTa with rotary positions, on GTE's layer (gte.py:
BertLayer's code, the rotation inside the attention kernel) with a plain feed-forward, and RoBERTa's
heads.

What differs from GTE, and is all that is written here:
- the feed-forward is BERT's: fc1, GELU (fused with its bias), fc2, with no dropout of its own;
- the weights live under "roberta."; the heads are RoBERTa's (lm_head with its tied bias, the
  first-token classifier, token classification, question answering) on this encoder;
- the files keep the original model's names (the QKV joined as mixer.Wqkv, mixer.out_proj, norm1 /
  norm2, emb_ln, the layers under encoder.layers), which transformers reads and writes.
The original model's task LoRA adapters are not part of transformers' class, nor of this one.
"""
from __future__ import annotations

from torch import nn

from fastbert.model.checkpoint import KeyFormat
from fastbert.model.config import JinaEmbeddingsV3Config
from fastbert.model.gte import GteLayer, GteModel
from fastbert.model.roberta import (
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
)

CHECKPOINT_FORMAT = KeyFormat(
    renames=(("encoder.layers.", "layers."), ("emb_ln.", "embeddings.LayerNorm."),
             ("mixer.out_proj.", "self_attn.o_proj."), ("norm1.", "post_attention_layernorm."),
             ("norm2.", "post_mlp_layernorm.")),
    joins=(("mixer.Wqkv.", ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")),))


class JinaEmbeddingsV3MLP(nn.Module):
    """fc1, hidden_act, fc2."""

    def __init__(self, config: JinaEmbeddingsV3Config):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.hidden_act = config.hidden_act


class JinaEmbeddingsV3Layer(GteLayer):
    """GTE's layer (rotary attention, post-LN) with BERT's feed-forward."""

    ffn_gated = False
    ffn_up = None
    ffn_inner_dropout_p = 0.0
    ffn_input = property(lambda self: self.mlp.fc1)
    ffn_output = property(lambda self: self.mlp.fc2)

    def make_mlp(self, config: JinaEmbeddingsV3Config) -> nn.Module:
        return JinaEmbeddingsV3MLP(config)

    def linear_slots(self):
        a, m = self.self_attn, self.mlp
        return [(a, "q_proj"), (a, "k_proj"), (a, "v_proj"), (a, "o_proj"), (m, "fc1"), (m, "fc2")]


class JinaEmbeddingsV3Model(GteModel):
    """embeddings -> layers -> pooler (by default, as transformers' JinaEmbeddingsV3Model)."""

    config_class = JinaEmbeddingsV3Config
    base_model_prefix = "roberta"
    layer_class = JinaEmbeddingsV3Layer
    checkpoint_format = CHECKPOINT_FORMAT

    def __init__(self, config: JinaEmbeddingsV3Config, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer)


class _JinaHead:
    config_class = JinaEmbeddingsV3Config
    model_class = JinaEmbeddingsV3Model
    checkpoint_format = CHECKPOINT_FORMAT


class JinaEmbeddingsV3ForMaskedLM(_JinaHead, RobertaForMaskedLM):
    pass


class JinaEmbeddingsV3ForSequenceClassification(_JinaHead, RobertaForSequenceClassification):
    pass


class JinaEmbeddingsV3ForTokenClassification(_JinaHead, RobertaForTokenClassification):
    pass


class JinaEmbeddingsV3ForQuestionAnswering(_JinaHead, RobertaForQuestionAnswering):
    pass


JINA_EMBEDDINGS_V3_CLASSES = (JinaEmbeddingsV3Model, JinaEmbeddingsV3ForMaskedLM,
                              JinaEmbeddingsV3ForSequenceClassification, JinaEmbeddingsV3ForTokenClassification,
                              JinaEmbeddingsV3ForQuestionAnswering)
