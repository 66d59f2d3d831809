"""GTE (gte-multilingual-base, gte-base-en-v1.5, Snowflake's arctic-embed-m-v2.0): fastbert's one
post-LN encoder with rotary positions, a gated feed-forward and GTE's names and heads.

What differs from BERT, and is all that is written here:
- no position table: the attention rotates q and k by their positions inside the kernel
  (BertLayer.rotary_base: rope_parameters' rope_theta); packed, the positions count within each
  sequence, so left padding gives the scores transformers gives (rotary scores depend on distances);
- the feed-forward is gated: act(gate_proj(h)) * up_proj(h) (one fused GeGLU for the GELU forms, the
  two products joined into one GEMM: BertLayer.ffn_gated), dropout, down_proj;
- word embeddings, token types where type_vocab_size > 0, LayerNorm, dropout;
- the modules have transformers' names (gte.layers.N.self_attn.q_proj ... o_proj,
  post_attention_layernorm, mlp.gate_proj / up_proj / down_proj, post_mlp_layernorm), which
  GteLayer maps onto BertLayer's roles: the layer runs BertLayer's code, int8 included;
- the weights live under "gte."; the MLM head is RoBERTa's without its separate bias parameter
  (lm_head.decoder.bias); the sequence classifier reads the pooler (gte.pooler) as BERT's does; the
  token classifier is BERT's. transformers has no GTE question-answering head, nor has fastbert.
position_ids, where given, must count 0, 1, 2, ... along each row (up to a constant).
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from fastbert import ops
from fastbert.model.bert import BertModel
from fastbert.model.checkpoint import KeyFormat
from fastbert.model.checks import check_counting_positions
from fastbert.model.config import GteConfig
from fastbert.model.heads import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification
from fastbert.model.layers import BackendMixin, BertLayer, RenamedSelfAttention, embed_words
from fastbert.model.pretrained import BertPreTrainedModel
from fastbert.model.roberta import RobertaLMHead

# GTE's files keep the original model's names (transformers reads them into its modules' names, and
# writes them back): the QKV projections joined, gate and up joined (up first), other names for the
# norms, the layers under encoder.layer, a task model's encoder under "new." in the original files
CHECKPOINT_FORMAT = KeyFormat(
    renames=(("encoder.layer.", "layers."), ("attention.o_proj.", "self_attn.o_proj."),
             ("attn_ln.", "post_attention_layernorm."), ("mlp_ln.", "post_mlp_layernorm."),
             ("lm_head.norm.", "lm_head.layer_norm.")),
    joins=(("attention.qkv_proj.", ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")),
           ("mlp.up_gate_proj.", ("mlp.up_proj.", "mlp.gate_proj."))),
    old_prefixes=("new",))


class GteEmbeddings(nn.Module, BackendMixin):
    """word_embeddings, token_type_embeddings (where type_vocab_size > 0), LayerNorm, dropout."""

    max_tokens = sys.maxsize  # rotary positions: no table to outgrow

    def __init__(self, config: GteConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        if config.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.model_type = config.model_type  # (named in errors: GTE's, NomicBERT's, Jina v3's embeddings)

    def default_position_ids(self, input_ids, bsz: int, seq: int, device) -> None:
        return None  # the rotary positions count along each sequence inside the attention

    def forward(self, input_ids, token_type_ids, position_ids, inputs_embeds=None) -> torch.Tensor:
        words = self.words(input_ids) if inputs_embeds is None else inputs_embeds
        if not torch.compiler.is_compiling():  # (a value check: skipped while torch.compile traces)
            check_counting_positions(position_ids, words.shape[0], words.shape[1], self.model_type)
        norm = self.LayerNorm
        if hasattr(self, "token_type_embeddings"):
            types = self.types(token_type_ids).to(words.dtype)
            h = ops.add_layer_norm(words, types, norm.weight, norm.bias, norm.eps, backend=self.backend)
        else:
            h = torch.nn.functional.layer_norm(words, words.shape[-1:], norm.weight, norm.bias, norm.eps)
        return self.dropout(h)


    def words(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The word embeddings of input_ids [batch, seq]."""
        return embed_words(self.word_embeddings, input_ids)

    def types(self, token_type_ids: torch.Tensor) -> torch.Tensor:
        """The token type embeddings of token_type_ids [batch, seq]."""
        return self.token_type_embeddings(token_type_ids)


class GteAttention(RenamedSelfAttention):
    """q_proj, k_proj, v_proj, o_proj; BertSelfAttention's joined QKV over the first three."""

    names = ("q_proj", "k_proj", "v_proj", "o_proj")


class GteMLP(nn.Module):
    """gate_proj, up_proj (no biases), dropout, down_proj: down_proj(dropout(act(gate_proj(h)) * up_proj(h)))
    (biased False: down_proj without a bias and no dropout, NomicBERT's)."""

    def __init__(self, config: GteConfig, biased: bool = True):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=biased)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if biased else 0.0)
        self.hidden_act = config.hidden_act


class GteLayer(BertLayer):
    """BertLayer (its code: fused ops, packed and padded, int8) on GTE's modules, rotary and gated
    (biased False: no bias in any projection, NomicBERT's layer)."""

    ffn_gated = True
    biased = True

    def __init__(self, config: GteConfig):
        nn.Module.__init__(self)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.post_mlp_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.mlp = self.make_mlp(config)
        self.self_attn = GteAttention(config, bias=self.biased)
        self.post_mlp_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_base = config.rope_theta

    self_attention = property(lambda self: self.self_attn)
    attention_output = property(lambda self: self.self_attn.o_proj)
    attention_norm = property(lambda self: self.post_attention_layernorm)
    attention_dropout_p = property(lambda self: self.post_attention_dropout.p)
    ffn_input = property(lambda self: self.mlp.gate_proj)
    ffn_up = property(lambda self: self.mlp.up_proj)
    ffn_act = property(lambda self: self.mlp.hidden_act)
    ffn_inner_dropout_p = property(lambda self: self.mlp.dropout.p)
    ffn_output = property(lambda self: self.mlp.down_proj)
    ffn_norm = property(lambda self: self.post_mlp_layernorm)
    ffn_dropout_p = property(lambda self: self.post_mlp_dropout.p)

    def make_mlp(self, config: GteConfig) -> nn.Module:
        """The layer's feed-forward module (Jina v3's layer makes BERT's)."""
        return GteMLP(config, self.biased)

    def linear_slots(self):
        a, m = self.self_attn, self.mlp
        return [(a, "q_proj"), (a, "k_proj"), (a, "v_proj"), (a, "o_proj"), (m, "gate_proj"), (m, "up_proj"),
                (m, "down_proj")]


class GteModel(BertModel):
    """embeddings -> layers (under "layers", no encoder module) -> pooler (only where
    add_pooling_layer: transformers' GteModel has none by default)."""

    config_class = GteConfig
    base_model_prefix = "gte"
    embeddings_class = GteEmbeddings
    layer_class = GteLayer
    checkpoint_format = CHECKPOINT_FORMAT

    def __init__(self, config: GteConfig, add_pooling_layer: bool = False):
        BertPreTrainedModel.__init__(self, config)
        self.embeddings = self.embeddings_class(config)
        self.pooler = self.pooler_class(config) if add_pooling_layer else None  # (before the layers, as transformers orders them)
        self.layers = nn.ModuleList([self.layer_class(config) for _ in range(config.num_hidden_layers)])
        self.post_init()

    @property
    def layers(self) -> nn.ModuleList:
        return self._modules["layers"]


class GteLMHead(RobertaLMHead):
    """dense, exact GELU (fused), layer_norm, decoder (with its own bias, tied to nothing)."""

    def __init__(self, config: GteConfig):
        nn.Module.__init__(self)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)


class _GteHead:
    config_class = GteConfig
    base_model_prefix = "gte"
    model_class = GteModel
    checkpoint_format = CHECKPOINT_FORMAT


class GteForMaskedLM(_GteHead, BertForMaskedLM):
    output_embeddings = "lm_head.decoder"
    _tied_weights_keys = {"lm_head.decoder.weight": "gte.embeddings.word_embeddings.weight"}

    def _add_lm_head(self, config) -> None:
        self.lm_head = GteLMHead(config)

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class GteForSequenceClassification(_GteHead, BertForSequenceClassification):
    pass


class GteForTokenClassification(_GteHead, BertForTokenClassification):
    pass


GTE_CLASSES = (GteModel, GteForMaskedLM, GteForSequenceClassification, GteForTokenClassification)

