"""DistilBERT: fastbert's one encoder under DistilBERT's module names, with its heads.

What differs from BERT, and is all that is written here:
- its modules have other names (embeddings without token types; transformer.layer.N.attention.
  q_lin / k_lin / v_lin / out_lin, sa_layer_norm, ffn.lin1 / lin2, output_layer_norm), which
  TransformerBlock maps onto BertLayer's roles: the layer runs BertLayer's code;
- no dropout after the attention output (only on the attention weights and after the FFN);
  LayerNorm eps 1e-12; no pooler; the weights live under "distilbert.";
- the heads: pre_classifier + ReLU on the first token (sequence classification), vocab_transform /
  vocab_layer_norm / vocab_projector (MLM), dropout (qa_dropout) before qa_outputs.
The forward arguments are DistilBERT's, in transformers' order (no token types).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.model.bert import BertModel
from fastbert.model.config import DistilBertConfig
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from fastbert.model.layers import BertEmbeddings, BertLayer, RenamedSelfAttention, bias_activation
from fastbert.model.pretrained import BertPreTrainedModel


class DistilBertEmbeddings(BertEmbeddings):
    def __init__(self, config: DistilBertConfig):
        super().__init__(config, token_types=False)
        if config.sinusoidal_pos_embds:  # fixed, as DistilBERT's are when sinusoidal
            self.position_embeddings.weight.requires_grad_(False)


def sinusoidal_positions(n_pos: int, dim: int) -> torch.Tensor:
    """DistilBERT's fixed position table: sin at even features, cos at odd ones, of
    pos / 10000^(2 * (j // 2) / dim)."""
    pairs = torch.div(torch.arange(dim, dtype=torch.float64), 2, rounding_mode="floor")
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] / torch.pow(10000.0, 2 * pairs / dim)
    out = torch.empty(n_pos, dim, dtype=torch.float64)
    out[:, 0::2] = torch.sin(angles[:, 0::2])
    out[:, 1::2] = torch.cos(angles[:, 1::2])
    return out


class _DistilBertInit:
    """A fresh model's sinusoidal position table, when the config asks for one (as transformers
    initialises it)."""

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, DistilBertEmbeddings) and self.config.sinusoidal_pos_embds:
            weight = module.position_embeddings.weight
            with torch.no_grad():
                weight.copy_(sinusoidal_positions(*weight.shape))


class DistilBertSelfAttention(RenamedSelfAttention):
    """q_lin, k_lin, v_lin, out_lin; BertSelfAttention's joined QKV over the first three."""

    names = ("q_lin", "k_lin", "v_lin", "out_lin")


class FFN(nn.Module):
    def __init__(self, config: DistilBertConfig):
        super().__init__()
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = config.activation


class TransformerBlock(BertLayer):
    """BertLayer (its code, fused ops, int8) on DistilBERT's modules."""

    def __init__(self, config: DistilBertConfig):
        nn.Module.__init__(self)
        self.attention = DistilBertSelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.ffn = FFN(config)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)

    self_attention = property(lambda self: self.attention)
    attention_output = property(lambda self: self.attention.out_lin)
    attention_norm = property(lambda self: self.sa_layer_norm)
    attention_dropout_p = 0.0  # DistilBERT has no dropout after out_lin
    ffn_input = property(lambda self: self.ffn.lin1)
    ffn_act = property(lambda self: self.ffn.activation)
    ffn_output = property(lambda self: self.ffn.lin2)
    ffn_norm = property(lambda self: self.output_layer_norm)
    ffn_dropout_p = property(lambda self: self.ffn.dropout.p)

    def linear_slots(self):
        a, f = self.attention, self.ffn
        return [(a, "q_lin"), (a, "k_lin"), (a, "v_lin"), (a, "out_lin"), (f, "lin1"), (f, "lin2")]


class Transformer(nn.Module):
    def __init__(self, config: DistilBertConfig):
        super().__init__()
        self.layer = nn.ModuleList([TransformerBlock(config) for _ in range(config.n_layers)])


class DistilBertModel(_DistilBertInit, BertModel):
    config_class = DistilBertConfig
    base_model_prefix = "distilbert"

    def __init__(self, config: DistilBertConfig, add_pooling_layer: bool = False):
        BertPreTrainedModel.__init__(self, config)
        self.embeddings = DistilBertEmbeddings(config)
        self.transformer = Transformer(config)
        self.pooler = None  # DistilBERT has none
        self.post_init()

    @property
    def layers(self) -> nn.ModuleList:
        return self.transformer.layer

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, position_ids=None, head_mask=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, token_type_ids=None,
                _pooled_only: bool = False):
        """transformers' DistilBertModel.forward (input_ids or inputs_embeds, attention_mask,
        position_ids, ...) -> .last_hidden_state, .hidden_states, .attentions."""
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("fastbert: DistilBERT has no token types; token_type_ids must be None or all 0")
        return super().forward(input_ids, attention_mask, None, position_ids, inputs_embeds, head_mask=head_mask,
                               output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                               return_dict=return_dict, _pooled_only=_pooled_only)


class _DistilBertHead(_DistilBertInit):
    config_class = DistilBertConfig
    base_model_prefix = "distilbert"
    model_class = DistilBertModel

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None, position_ids=None,
                head_mask=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        """transformers' DistilBERT head arguments, in their order (no token types)."""
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                               labels=labels, position_ids=position_ids, head_mask=head_mask,
                               output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                               return_dict=return_dict)


class DistilBertForMaskedLM(_DistilBertHead, BertForMaskedLM):
    output_embeddings = "vocab_projector"
    _tied_weights_keys = {"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"}

    def _add_lm_head(self, config) -> None:
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=config.layer_norm_eps)
        self.vocab_projector = nn.Linear(config.dim, config.vocab_size)

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        t, ln = self.vocab_transform, self.vocab_layer_norm
        h = bias_activation(ops.linear(hidden, t.weight, backend=self.backend), t.bias, self.config.activation, None)
        return self.vocab_projector(F.layer_norm(h, h.shape[-1:], ln.weight, ln.bias, ln.eps))


class DistilBertForSequenceClassification(_DistilBertHead, BertForSequenceClassification):
    """The first token through pre_classifier, ReLU, dropout (seq_classif_dropout), classifier; the
    last layer runs at the first token alone."""

    features = "last_hidden_state"

    def _add_classifier(self, config) -> None:
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.classifier = nn.Linear(config.dim, config.num_labels)
        self.dropout = nn.Dropout(config.seq_classif_dropout)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(F.relu(self.pre_classifier(features[:, 0]))))


class DistilBertForTokenClassification(_DistilBertHead, BertForTokenClassification):
    pass


class DistilBertForQuestionAnswering(_DistilBertHead, BertForQuestionAnswering):
    """qa_outputs on the hidden states after dropout (qa_dropout)."""

    def __init__(self, config: DistilBertConfig):
        if config.num_labels != 2:
            raise ValueError(f"fastbert: DistilBertForQuestionAnswering needs num_labels 2, got {config.num_labels}")
        super().__init__(config)
        self.dropout = nn.Dropout(config.qa_dropout)

    def _span_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dropout(hidden)

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, start_positions=None,
                end_positions=None, position_ids=None, head_mask=None, output_attentions=None,
                output_hidden_states=None, return_dict=None):
        """transformers' DistilBertForQuestionAnswering arguments, in their order."""
        return BertForQuestionAnswering.forward(
            self, input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
            start_positions=start_positions, end_positions=end_positions, position_ids=position_ids,
            head_mask=head_mask, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            return_dict=return_dict)


DISTILBERT_CLASSES = (DistilBertModel, DistilBertForMaskedLM, DistilBertForSequenceClassification,
                      DistilBertForTokenClassification, DistilBertForQuestionAnswering)
