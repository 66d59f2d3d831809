"""MPNet: fastbert's one encoder with MPNet's relative position bias, module names and heads.

What differs from BERT, and is all that is written here:
- a relative position bias: the encoder's relative_attention_bias table [32 buckets, heads], shared
  by every layer, gives each head a bias by the bucketed distance j - i between query i and key j
  (fastbert.layouts.relative_bias, bit for bit transformers' compute_position_bias). It is made
  once a forward, at the padded length, and every layer's attention adds it to its scaled scores
  (BertModel.relative_position_bias: the fused kernels read it by distance, packed and padded; the
  explicit path that returns the probabilities, the int8 path and the first-token shortcut of the
  sequence classifier take it too);
- its modules have other names (encoder.layer.N.attention.attn.q / k / v / o, attention.LayerNorm),
  which MPNetLayer maps onto BertLayer's roles: the layer runs BertLayer's code;
- no token types; position ids as RoBERTa's, counted from padding id 1 (fixed, as transformers' MPNet
  fixes it) + 1 over the tokens that are not padding;
- the weights live under "mpnet."; the MLM head is RoBERTa's (lm_head), the sequence classifier
  RoBERTa's first-token head (classifier.dense / out_proj); only MPNetModel has a pooler (BERT's).
The forward arguments are MPNet's, in transformers' order (no token types).
"""
from __future__ import annotations

import torch
from torch import nn

from fastbert import layouts
from fastbert.model.bert import BertModel
from fastbert.model.config import MPNetConfig
from fastbert.model.heads import BertForQuestionAnswering, BertForTokenClassification
from fastbert.model.layers import (
    BertIntermediate,
    BertLayer,
    BertOutput,
    RenamedSelfAttention,
)
from fastbert.model.roberta import RobertaEmbeddings, RobertaForMaskedLM, RobertaForSequenceClassification

PADDING_IDX = 1  # transformers' MPNet numbers positions (and zeroes embeddings) from 1, whatever pad_token_id says
BUCKETS = 32  # transformers' compute_position_bias buckets distances into 32, whatever relative_attention_num_buckets says


class MPNetEmbeddings(RobertaEmbeddings):
    """word_embeddings, position_embeddings (RoBERTa's numbering), LayerNorm, dropout; no token types."""

    def __init__(self, config: MPNetConfig):
        super().__init__(config, padding_idx=PADDING_IDX, token_types=False)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PADDING_IDX)


class MPNetSelfAttention(RenamedSelfAttention):
    """q, k, v, o; BertSelfAttention's joined QKV over the first three."""

    names = ("q", "k", "v", "o")


class MPNetAttention(nn.Module):
    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.attn = MPNetSelfAttention(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class MPNetLayer(BertLayer):
    """BertLayer (its code, fused ops, int8) on MPNet's modules."""

    def __init__(self, config: MPNetConfig):
        nn.Module.__init__(self)
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    self_attention = property(lambda self: self.attention.attn)
    attention_output = property(lambda self: self.attention.attn.o)
    attention_norm = property(lambda self: self.attention.LayerNorm)
    attention_dropout_p = property(lambda self: self.attention.dropout.p)

    def linear_slots(self):
        a = self.attention.attn
        return [(a, "q"), (a, "k"), (a, "v"), (a, "o"), (self.intermediate, "dense"), (self.output, "dense")]


class MPNetEncoder(nn.Module):
    """The layers and the relative position bias table [relative_attention_num_buckets, heads] they share."""

    def __init__(self, config: MPNetConfig):
        super().__init__()
        self.layer = nn.ModuleList([MPNetLayer(config) for _ in range(config.num_hidden_layers)])
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)


class MPNetModel(BertModel):
    config_class = MPNetConfig
    base_model_prefix = "mpnet"
    embeddings_class = MPNetEmbeddings
    encoder_class = MPNetEncoder

    def relative_position_bias(self, seq: int) -> torch.Tensor:
        """[heads, 2 seq - 1]: each head's bias at each distance j - i (entry j - i + seq - 1),
        differentiable in the table."""
        return layouts.relative_bias(self.encoder.relative_attention_bias.weight, seq, num_buckets=BUCKETS)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None,
                token_type_ids=None, _pooled_only: bool = False):
        """transformers' MPNetModel.forward (input_ids or inputs_embeds, attention_mask,
        position_ids, ...) -> .last_hidden_state, .pooler_output, .hidden_states, .attentions;
        head_mask as BertModel takes it."""
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("fastbert: MPNet has no token types; token_type_ids must be None or all 0")
        return super().forward(input_ids, attention_mask, None, position_ids, inputs_embeds, head_mask=head_mask,
                               output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                               return_dict=return_dict, _pooled_only=_pooled_only)


class _MPNetHead:
    config_class = MPNetConfig
    base_model_prefix = "mpnet"
    model_class = MPNetModel

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """transformers' MPNet head arguments, in their order (no token types)."""
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, labels=labels, head_mask=head_mask,
                               output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                               return_dict=return_dict)


class MPNetForMaskedLM(_MPNetHead, RobertaForMaskedLM):
    """lm_head: dense, exact GELU, layer_norm, decoder tied to the word embeddings (RoBERTa's head)."""

    _tied_weights_keys = {
        "lm_head.decoder.weight": "mpnet.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }


class MPNetForSequenceClassification(_MPNetHead, RobertaForSequenceClassification):
    """classifier (dense, tanh, out_proj) on the first token; the last layer runs there alone."""


class MPNetForTokenClassification(_MPNetHead, BertForTokenClassification):
    pass


class MPNetForQuestionAnswering(_MPNetHead, BertForQuestionAnswering):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, *, head_mask=None):
        """transformers' MPNetForQuestionAnswering arguments, in their order."""
        return BertForQuestionAnswering.forward(
            self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            inputs_embeds=inputs_embeds, start_positions=start_positions, end_positions=end_positions,
            head_mask=head_mask, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            return_dict=return_dict)


MPNET_CLASSES = (MPNetModel, MPNetForMaskedLM, MPNetForSequenceClassification, MPNetForTokenClassification,
                 MPNetForQuestionAnswering)
