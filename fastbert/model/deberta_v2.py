"""DeBERTa-v2 / v3 (deberta-v3-base / large, mdeberta-v3-base, and the NLI, zero-shot, reranking and
extraction models built on them): fastbert's one post-LN encoder with DeBERTa's disentangled
attention, embeddings and heads.

What differs from BERT, and is all that is written here:
- the attention adds content-to-position and position-to-content terms (pos_att_type "c2p", "p2c")
  over the bucketed relative distance (fastbert.ops.disentangled_attention): the encoder's relative
  embeddings (encoder.rel_embeddings, 2 x 256 rows for v3, through encoder.LayerNorm where
  norm_rel_ebd says "layer_norm") are made once a forward (BertModel.relative_position_bias's slot)
  and each layer projects the rows the batch's distances reach with its own query and key
  projections (share_att_key; else pos_query_proj / pos_key_proj), [heads, rows, head_dim], which
  the op reads by distance;
- the embeddings: words (embedding_size wide, projected by embed_proj where that differs), absolute
  positions only where position_biased_input (v3 has none), token types only where
  type_vocab_size > 0 (v3 has none: the token_type_ids a tokenizer gives are ignored, as
  transformers ignores them), LayerNorm, dropout;
- the projections are named query_proj / key_proj / value_proj; the rest of the layer is BERT's
  (attention.output, intermediate, output), which DebertaV2Layer runs with BertLayer's code;
- the weights live under "deberta."; the base model has no pooler; the sequence classifier and the
  multiple-choice head pool the first token through their own ContextPooler (pooler.dense, the
  pooler_hidden_act); the MLM head is BERT's (legacy, cls.predictions) or DeBERTa's newer
  lm_predictions.lm_head (legacy False: the decoder is the word embeddings' product).
A batch with padding runs packed, as every family's: the linear layers, the attention (the fused
kernel reads the terms on packed rows) and the feed-forward on the real tokens alone; the layers
run one by one (the one-call routes have no position terms). Not
supported, each a clear error: conv_kernel_size > 0 (deberta-v2-xlarge's convolution), an additive
float attention mask.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.model.bert import BertModel
from fastbert.model.config import DebertaV2Config
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForTokenClassification,
    TaskModel,
    cross_entropy_loss,
    sequence_classification_loss,
    task_output,
)
from fastbert.model.layers import (
    BackendMixin,
    BertIntermediate,
    BertLayer,
    BertOutput,
    BertPredictionHeadTransform,
    BertSelfOutput,
    RenamedSelfAttention,
    bias_activation,
    embed_words,
)
from fastbert.model.outputs import MultipleChoiceModelOutput, SequenceClassifierOutput
from fastbert.ops.disentangled_attention import disentangled_attention, position_index, varlen_disentangled_attention


class DebertaV2Embeddings(nn.Module, BackendMixin):
    """word_embeddings (embedding_size wide), position_embeddings (position_biased_input),
    token_type_embeddings (type_vocab_size > 0), embed_proj (embedding_size != hidden_size),
    LayerNorm, dropout."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        width = getattr(config, "embedding_size", config.hidden_size)
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        if config.position_biased_input:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        if width != config.hidden_size:
            self.embed_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    @property
    def max_tokens(self) -> int:
        """The longest input: the position table's rows, or any length (relative positions only)."""
        return self.position_embeddings.num_embeddings if hasattr(self, "position_embeddings") else sys.maxsize

    def default_position_ids(self, input_ids, bsz: int, seq: int, device) -> Optional[torch.Tensor]:
        return torch.arange(seq, device=device).expand(bsz, seq) if hasattr(self, "position_embeddings") else None

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds=None) -> torch.Tensor:
        h = embed_words(self.word_embeddings, input_ids) if inputs_embeds is None else inputs_embeds
        if hasattr(self, "position_embeddings"):
            h = h + self.position_embeddings(position_ids).to(h.dtype)
        if hasattr(self, "token_type_embeddings"):
            h = h + self.token_type_embeddings(token_type_ids).to(h.dtype)
        if hasattr(self, "embed_proj"):
            h = ops.linear(h, self.embed_proj.weight, backend=self.backend)
        norm = self.LayerNorm
        return self.dropout(F.layer_norm(h, h.shape[-1:], norm.weight, norm.bias, norm.eps))


class DisentangledSelfAttention(RenamedSelfAttention):
    """query_proj, key_proj, value_proj (BertSelfAttention's joined QKV over them); pos_key_proj /
    pos_query_proj where the position terms have projections of their own (share_att_key False)."""

    names = ("query_proj", "key_proj", "value_proj")

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.position_terms = config.position_terms
        self.position_buckets = getattr(config, "position_buckets", -1)
        self.max_relative_positions = config.max_relative_distance
        self.share_att_key = bool(getattr(config, "share_att_key", False))
        self.pos_dropout_p = config.hidden_dropout_prob
        self.scale = (self.attention_head_size * config.score_scale_terms) ** -0.5
        if self.position_terms and not self.share_att_key:
            if "c2p" in self.position_terms:
                self.pos_key_proj = nn.Linear(config.hidden_size, config.hidden_size)
            if "p2c" in self.position_terms:
                self.pos_query_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def position_tables(self, rel: torch.Tensor):
        """(pos_key, pos_query), each [heads, rows, head_dim] or None: rows of the relative embeddings,
        rel [rows, hidden], through the key and query projections (the layer's own, or the position ones)."""
        heads, d = self.num_attention_heads, self.attention_head_size

        def project(linear: nn.Linear) -> torch.Tensor:
            return linear(rel).view(-1, heads, d).transpose(0, 1)  # (an Int8Linear once quantized)

        key = self.key if self.share_att_key else getattr(self, "pos_key_proj", None)
        query = self.query if self.share_att_key else getattr(self, "pos_query_proj", None)
        return (project(key) if "c2p" in self.position_terms else None,
                project(query) if "p2c" in self.position_terms else None)


class DebertaV2Attention(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.self = DisentangledSelfAttention(config)
        self.output = BertSelfOutput(config)


class DebertaV2Layer(BertLayer):
    """BertLayer (its QKV GEMM, its fused feed-forward) with the disentangled attention."""

    def __init__(self, config: DebertaV2Config):
        nn.Module.__init__(self)
        self.attention = DebertaV2Attention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def linear_slots(self):
        sa = self.attention.self
        return [(sa, "query_proj"), (sa, "key_proj"), (sa, "value_proj"), (self.attention.output, "dense"),
                (self.intermediate, "dense"), (self.output, "dense")]

    def forward(self, hidden, mask, packed, bias=None, head_scale=None, want_probs=False, relative_bias=None):
        """BertLayer.forward's separate ops (a layer of its own forward: no stack plan runs it)."""
        return super().forward(hidden, mask, packed, bias, head_scale, want_probs, relative_bias)

    def _one_call(self) -> bool:
        return False  # the extension's whole-layer routes have no position terms

    def _training_node(self, *args) -> None:
        return None

    def attend(self, qkv, shape, mask, packed, bias=None, head_scale=None, want_probs=False, relative_bias=None,
               seeds=None):
        """The disentangled attention on the QKV projection of a hidden state of shape `shape`
        (padded, or packed rows: the op takes them as they are, unless the probabilities are asked
        for, which the padded formulation gives); relative_bias: the encoder's relative embeddings
        [2 span, hidden] (None without relative attention). -> (context shaped `shape`, probabilities or None)."""
        if bias is not None:
            raise NotImplementedError("fastbert.DebertaV2Model: an additive float attention mask is not supported; "
                                      "pass a [batch, seq] mask of 0 and 1")
        sa = self.self_attention
        heads, d = sa.num_attention_heads, sa.attention_head_size
        if packed is not None and want_probs:  # rows [tokens, 3 hidden] -> [batch, longest, 3 hidden], and back after
            lengths = packed[0].diff().long()
            longest = int(packed[1])
            mask = torch.arange(longest, device=qkv.device)[None, :] < lengths[:, None]
            indices = mask.reshape(-1).nonzero().squeeze(1)
            ctx, probs = self.attend(ops.pad(qkv, indices, lengths.numel(), longest), (lengths.numel(), longest),
                                     mask, None, None, head_scale, want_probs, relative_bias, seeds)
            return ctx.reshape(-1, ctx.shape[-1])[indices].reshape(shape), probs
        pos_key = pos_query = None
        if relative_bias is not None:
            # only the rows this batch's distances reach go through the projections: 2 x 256 rows
            # for v3 at every length otherwise (transformers projects them all), 39 for 20 tokens
            _, lo, hi = position_index(int(packed[1]) if packed is not None else shape[1], sa.position_buckets,
                                       sa.max_relative_positions)
            rel = F.dropout(relative_bias[lo:hi], sa.pos_dropout_p, self.training)
            pos_key, pos_query = sa.position_tables(rel.to(qkv.dtype))
        p = sa.dropout_p if self.training else 0.0
        kw = dict(pos_key=pos_key, pos_query=pos_query, position_buckets=sa.position_buckets,
                  max_relative_positions=sa.max_relative_positions, dropout_p=p, scale=sa.scale,
                  seed=None if seeds is None else seeds.take(p), backend=self.backend)
        if packed is not None:  # [tokens, heads, d] views of the QKV rows
            q, k, v = qkv.view(-1, 3, heads, d).unbind(1)
            ctx = varlen_disentangled_attention(q, k, v, packed[0], int(packed[1]), validate=False, **kw)
            if head_scale is not None:
                ctx = ctx * head_scale.to(ctx.dtype).view(1, heads, 1)
            return ctx.reshape(shape), None
        bsz, seq = shape[:2]
        q, k, v = qkv.view(bsz, seq, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
        out = disentangled_attention(q, k, v, mask, want_probs=want_probs, **kw)
        ctx, probs = out if want_probs else (out, None)
        if head_scale is not None:
            ctx = ctx * head_scale.to(ctx.dtype).view(1, heads, 1, 1)
        return ctx.transpose(1, 2).reshape(bsz, seq, heads * d), probs


class DebertaV2Encoder(nn.Module):
    """layer, rel_embeddings (relative_attention), LayerNorm (norm_rel_ebd "layer_norm")."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.layer = nn.ModuleList([DebertaV2Layer(config) for _ in range(config.num_hidden_layers)])
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
        if "layer_norm" in [x.strip() for x in str(getattr(config, "norm_rel_ebd", "none")).lower().split("|")]:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def relative_embeddings(self) -> Optional[torch.Tensor]:
        if not hasattr(self, "rel_embeddings"):
            return None
        rel = self.rel_embeddings.weight
        if hasattr(self, "LayerNorm"):
            rel = F.layer_norm(rel, rel.shape[-1:], self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps)
        return rel


class DebertaV2Model(BertModel):
    """embeddings -> layers (disentangled attention); no pooler, as transformers' DebertaV2Model."""

    config_class = DebertaV2Config
    base_model_prefix = "deberta"
    embeddings_class = DebertaV2Embeddings
    encoder_class = DebertaV2Encoder

    def __init__(self, config: DebertaV2Config, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=False)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None,
                _pooled_only: bool = False):
        """transformers' DebertaV2Model.forward (its argument order; token_type_ids and position_ids
        are ignored where the embeddings have no table for them, as transformers ignores them)."""
        emb = self.embeddings
        if not hasattr(emb, "token_type_embeddings"):
            token_type_ids = None
        if not hasattr(emb, "position_embeddings"):
            position_ids = None
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                              head_mask=head_mask, output_attentions=output_attentions,
                              output_hidden_states=output_hidden_states, return_dict=True)
        if not self._return_dict(return_dict):
            return tuple(v for v in (out.last_hidden_state, out.hidden_states, out.attentions) if v is not None)
        return out

    def relative_position_bias(self, seq: int):
        """The encoder's relative embeddings [2 span, hidden] (normalised), made once a forward and
        read by every layer's attention (DebertaV2Layer.attend)."""
        return self.encoder.relative_embeddings()


class ContextPooler(nn.Module, BackendMixin):
    """The first token, dropout (pooler_dropout), dense, pooler_hidden_act: DeBERTa's pooler, in its heads."""

    def __init__(self, config: DebertaV2Config):
        super().__init__()
        width = getattr(config, "pooler_hidden_size", config.hidden_size)
        self.dense = nn.Linear(width, width)
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.activation = config.pooler_hidden_act

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = ops.linear(self.dropout(hidden[:, 0]), self.dense.weight, backend=self.backend)
        return bias_activation(x, self.dense.bias, self.activation, self.backend)


class _DebertaHead:
    config_class = DebertaV2Config
    base_model_prefix = "deberta"
    model_class = DebertaV2Model


def _cls_dropout(config) -> float:
    p = getattr(config, "cls_dropout", None)
    return config.hidden_dropout_prob if p is None else p


class DebertaV2ForSequenceClassification(_DebertaHead, TaskModel):
    """deberta -> pooler (ContextPooler) -> dropout (cls_dropout) -> classifier."""

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._add_encoder(config, False)
        self.pooler = ContextPooler(config)
        self.classifier = nn.Linear(getattr(config, "pooler_hidden_size", config.hidden_size), config.num_labels)
        self.dropout = nn.Dropout(_cls_dropout(config))
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, None,
                           output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(self.pooler(out.last_hidden_state)))
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return task_output(SequenceClassifierOutput, self._return_dict(return_dict), out, loss=loss, logits=logits)


class DebertaV2ForMultipleChoice(_DebertaHead, TaskModel):
    """Each choice [batch, choices, seq] through deberta, pooler, dropout, classifier (one score)."""

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self._add_encoder(config, False)
        self.pooler = ContextPooler(config)
        self.classifier = nn.Linear(getattr(config, "pooler_hidden_size", config.hidden_size), 1)
        self.dropout = nn.Dropout(_cls_dropout(config))
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(t, keep: int = 1):
            return None if t is None else t.reshape(-1, *t.shape[-keep:])

        out = self._encode(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                           flat(inputs_embeds, 2), None, output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(self.pooler(out.last_hidden_state))).view(-1, choices)
        return task_output(MultipleChoiceModelOutput, self._return_dict(return_dict), out,
                           loss=cross_entropy_loss(logits, labels), logits=logits)


class DebertaV2ForTokenClassification(_DebertaHead, BertForTokenClassification):
    def _add_classifier(self, config) -> None:
        self.dropout = nn.Dropout(config.hidden_dropout_prob)  # (transformers': no classifier_dropout field)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        return super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels,
                               output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                               return_dict=return_dict)


class DebertaV2ForQuestionAnswering(_DebertaHead, BertForQuestionAnswering):
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, output_attentions=None, output_hidden_states=None,
                return_dict=None):
        return super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, start_positions,
                               end_positions, output_attentions=output_attentions,
                               output_hidden_states=output_hidden_states, return_dict=return_dict)


class DebertaV2LMPredictionHead(BertPredictionHeadTransform):
    """DeBERTa's newer MLM head (legacy False): BERT's transform (dense, hidden_act, LayerNorm, under
    the same names), then the word embeddings' product plus bias."""

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))


class DebertaV2OnlyMLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config):
        super().__init__()
        self.lm_head = DebertaV2LMPredictionHead(config)


class DebertaV2ForMaskedLM(_DebertaHead, BertForMaskedLM):
    """BERT's MLM head (cls.predictions, the decoder tied to the word embeddings) where config.legacy,
    as deberta-v3's files have it; else lm_predictions.lm_head."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "deberta.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def _add_lm_head(self, config) -> None:
        if config.legacy:
            super()._add_lm_head(config)
        else:
            self._tied_weights_keys = {}
            self.lm_predictions = DebertaV2OnlyMLMHead(config)

    def tie_weights(self) -> None:
        if self.config.legacy:
            super().tie_weights()

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.legacy:
            return super()._lm_logits(hidden)
        head = self.lm_predictions.lm_head
        return F.linear(head(hidden), self.deberta.embeddings.word_embeddings.weight, head.bias)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        return super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels,
                               output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                               return_dict=return_dict)


DEBERTA_V2_CLASSES = (DebertaV2Model, DebertaV2ForMaskedLM, DebertaV2ForSequenceClassification,
                      DebertaV2ForTokenClassification, DebertaV2ForQuestionAnswering)
