"""ELECTRA: fastbert's one encoder with ELECTRA's embeddings and heads.

What differs from BERT, and is all that is written here:
- the embeddings are embedding_size wide, and a linear layer (embeddings_project) takes them to
  hidden_size when the two differ; there is no pooler; the weights live under "electra.";
- the sequence classifier reads the first token through dense + exact GELU (classifier.dense /
  classifier.out_proj); the generator's MLM head is generator_predictions (dense to embedding_size,
  GELU, LayerNorm) and generator_lm_head (tied to the word embeddings); the discriminator
  (ElectraForPreTraining) scores every token as replaced or not.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.model.bert import BertModel
from fastbert.model.config import ElectraConfig
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    FirstTokenClassifier,
    TaskModel,
    task_output,
)
from fastbert.model.layers import BackendMixin, BertEmbeddings, bias_activation
from fastbert.model.outputs import ElectraForPreTrainingOutput


class ElectraEmbeddings(BertEmbeddings):
    def __init__(self, config: ElectraConfig):
        super().__init__(config, width=config.embedding_size)


class ElectraModel(BertModel):
    config_class = ElectraConfig
    base_model_prefix = "electra"
    embeddings_class = ElectraEmbeddings

    def __init__(self, config: ElectraConfig, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=False)  # ELECTRA has no pooler
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
            self._init_weights(self.embeddings_project)

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> torch.Tensor:
        hidden = super().embed(input_ids, token_type_ids, position_ids, inputs_embeds)
        project = getattr(self, "embeddings_project", None)
        return hidden if project is None else ops.linear(hidden, project.weight, project.bias, backend=self.backend)


class ElectraGeneratorPredictions(nn.Module, BackendMixin):
    """dense (hidden -> embedding_size), exact GELU (fused), LayerNorm."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = ops.linear(hidden, self.dense.weight, backend=self.backend)
        h = ops.bias_gelu(h, self.dense.bias, "none", backend=self.backend)
        return F.layer_norm(h, h.shape[-1:], self.LayerNorm.weight, self.LayerNorm.bias, self.LayerNorm.eps)


class ElectraDiscriminatorPredictions(nn.Module, BackendMixin):
    """dense, the config's activation, dense_prediction to one logit a token."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)
        self.hidden_act = config.hidden_act

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = ops.linear(hidden, self.dense.weight, backend=self.backend)
        h = bias_activation(h, self.dense.bias, self.hidden_act, self.backend)
        return self.dense_prediction(h).squeeze(-1)


class _ElectraHead:
    config_class = ElectraConfig
    base_model_prefix = "electra"
    model_class = ElectraModel


class ElectraForMaskedLM(_ElectraHead, BertForMaskedLM):
    """ELECTRA's generator."""

    output_embeddings = "generator_lm_head"
    _tied_weights_keys = {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"}

    def _add_lm_head(self, config) -> None:
        self.generator_predictions = ElectraGeneratorPredictions(config)
        self.generator_lm_head = nn.Linear(config.embedding_size, config.vocab_size)

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.generator_lm_head(self.generator_predictions(hidden))


class ElectraForSequenceClassification(_ElectraHead, FirstTokenClassifier, BertForSequenceClassification):
    head_activation = nn.GELU


class ElectraForTokenClassification(_ElectraHead, BertForTokenClassification):
    pass


class ElectraForQuestionAnswering(_ElectraHead, BertForQuestionAnswering):
    pass


class ElectraForPreTraining(_ElectraHead, TaskModel):
    """ELECTRA's discriminator: a logit a token, replaced (1) or original (0). labels [batch, seq]:
    binary cross-entropy over the real tokens (attention_mask), as transformers computes it."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self._add_encoder(config, False)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, head_mask=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, head_mask,
                           output_attentions, output_hidden_states)
        logits = self.discriminator_predictions(out.last_hidden_state)
        loss = None
        if labels is not None:
            if attention_mask is not None:
                active = attention_mask.view(-1, logits.shape[1]) == 1
                loss = F.binary_cross_entropy_with_logits(logits[active].float(), labels[active].float())
            else:
                loss = F.binary_cross_entropy_with_logits(logits.reshape(-1).float(), labels.reshape(-1).float())
        return task_output(ElectraForPreTrainingOutput, self._return_dict(return_dict), out, loss=loss, logits=logits)


ELECTRA_CLASSES = (ElectraModel, ElectraForPreTraining, ElectraForMaskedLM, ElectraForSequenceClassification,
                   ElectraForTokenClassification, ElectraForQuestionAnswering)
