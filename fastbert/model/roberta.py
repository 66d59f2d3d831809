"""RoBERTa, XLM-RoBERTa and CamemBERT: fastbert's one encoder with RoBERTa's position ids and heads.

What differs from BERT, and is all that is written here:
- position ids count from padding_idx + 1 over the tokens that are not padding (input_ids !=
  pad_token_id; padding takes position padding_idx), as transformers numbers them, so the position
  table holds max_position_embeddings - padding_idx - 1 tokens;
- the weights live under "roberta." (XLM-RoBERTa and CamemBERT too), and no head uses a pooler;
- the sequence classifier reads the first token's last hidden state through dense + tanh
  (classifier.dense / classifier.out_proj); the MLM head is lm_head (dense, exact GELU,
  layer_norm, decoder tied to the word embeddings).
XLM-RoBERTa and CamemBERT are RoBERTa under another model_type: the same classes with their configs.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.model.bert import BertModel
from fastbert.model.config import CamembertConfig, RobertaConfig, XLMRobertaConfig
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    FirstTokenClassifier,
)
from fastbert.model.layers import BackendMixin, BertEmbeddings


class RobertaEmbeddings(BertEmbeddings):
    """BertEmbeddings whose positions count from padding_idx + 1 (config.pad_token_id unless given;
    MPNet fixes its own)."""

    def __init__(self, config: RobertaConfig, padding_idx: Optional[int] = None, token_types: bool = True):
        padding_idx = config.pad_token_id if padding_idx is None else padding_idx
        super().__init__(config, position_padding_idx=padding_idx, token_types=token_types)
        self.padding_idx = padding_idx

    @property
    def max_tokens(self) -> int:
        return self.position_embeddings.num_embeddings - self.padding_idx - 1

    def default_position_ids(self, input_ids: Optional[torch.Tensor], bsz: int, seq: int,
                             device: torch.device) -> torch.Tensor:
        if input_ids is None:  # inputs_embeds: every token is a real one
            return torch.arange(self.padding_idx + 1, seq + self.padding_idx + 1, device=device).expand(bsz, seq)
        real = input_ids.ne(self.padding_idx).int()
        return (torch.cumsum(real, dim=1).type_as(real) * real).long() + self.padding_idx


class RobertaModel(BertModel):
    config_class = RobertaConfig
    base_model_prefix = "roberta"
    embeddings_class = RobertaEmbeddings


class RobertaLMHead(nn.Module, BackendMixin):
    """dense, exact GELU (fused), layer_norm, decoder (its bias is `bias`, as in transformers)."""

    def __init__(self, config: RobertaConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = ops.linear(hidden, self.dense.weight, backend=self.backend)
        h = ops.bias_gelu(h, self.dense.bias, "none", backend=self.backend)
        h = F.layer_norm(h, h.shape[-1:], self.layer_norm.weight, self.layer_norm.bias, self.layer_norm.eps)
        return self.decoder(h)


class _RobertaHead:
    config_class = RobertaConfig
    base_model_prefix = "roberta"
    model_class = RobertaModel


class RobertaForMaskedLM(_RobertaHead, BertForMaskedLM):
    output_embeddings = "lm_head.decoder"
    _tied_weights_keys = {
        "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }

    def _add_lm_head(self, config) -> None:
        self.lm_head = RobertaLMHead(config)

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class RobertaForSequenceClassification(_RobertaHead, FirstTokenClassifier, BertForSequenceClassification):
    pass


class RobertaForTokenClassification(_RobertaHead, BertForTokenClassification):
    pass


class RobertaForQuestionAnswering(_RobertaHead, BertForQuestionAnswering):
    pass


ROBERTA_CLASSES = (RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification, RobertaForTokenClassification,
                   RobertaForQuestionAnswering)


def _same_as_roberta(name: str, config_class):
    """RoBERTa's classes under another family's name and config (the weights stay under "roberta.")."""
    model = type(f"{name}Model", (RobertaModel,), {"config_class": config_class, "__module__": __name__})
    heads = tuple(type(c.__name__.replace("Roberta", name, 1), (c,),
                       {"config_class": config_class, "model_class": model, "__module__": __name__})
                  for c in ROBERTA_CLASSES[1:])
    return (model, *heads)


(XLMRobertaModel, XLMRobertaForMaskedLM, XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification,
 XLMRobertaForQuestionAnswering) = _same_as_roberta("XLMRoberta", XLMRobertaConfig)
(CamembertModel, CamembertForMaskedLM, CamembertForSequenceClassification, CamembertForTokenClassification,
 CamembertForQuestionAnswering) = _same_as_roberta("Camembert", CamembertConfig)
