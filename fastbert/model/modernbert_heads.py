"""ModernBERT's task models on fastbert's ModernBertModel (modernbert.py), as transformers' classes:
masked LM, sequence and token classification, extractive question answering.

Every head starts with the prediction head `head` (dense, classifier_activation, LayerNorm): the
MLM's decoder (tied to tok_embeddings when tie_word_embeddings) reads it at every real token (at
the labelled tokens only with sparse_prediction and labels, as transformers does); the sequence
classifier pools the last hidden states first ("cls": the first token; "mean": the mean over the
real tokens), then head, dropout (drop), classifier; the token classifier and the span (QA) head
run head, drop, classifier at every token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.model.config import ModernBertConfig
from fastbert.model.heads import (
    cross_entropy_loss,
    real_token_head,
    real_token_mean,
    sequence_classification_loss,
    task_output,
)
from fastbert.model.layers import BackendMixin
from fastbert.model.modernbert import ModernBertModel, ModernBertPreTrainedModel, activation, add_norm
from fastbert.model.outputs import (
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)


class ModernBertPredictionHead(nn.Module, BackendMixin):
    """dense, classifier_activation, norm."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = config.classifier_activation
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = activation(ops.linear(hidden, self.dense.weight, backend=self.backend), self.dense.bias, self.act, self.backend)
        return add_norm(self.norm, h, None, self.backend)


class _ModernBertHead(ModernBertPreTrainedModel):
    """A task model: ModernBertModel (under "model") and the prediction head (under "head")."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)

    def _encode(self, input_ids, attention_mask, position_ids, inputs_embeds, output_attentions, output_hidden_states,
                head_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                          output_hidden_states=output_hidden_states, return_dict=True, head_mask=head_mask)

    def _init_head(self, module: nn.Module, init, std_out: float, std_final: float) -> None:
        if isinstance(module, ModernBertPredictionHead):
            init(module.dense, std_out)
        elif module is self and hasattr(self, "classifier"):
            init(self.classifier, std_final)


class ModernBertForMaskedLM(_ModernBertHead):
    output_embeddings = "decoder"

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        # the decoder is the embedding matrix: saved once, filled in on load
        self._tied_weights_keys = ({"decoder.weight": "model.embeddings.tok_embeddings.weight"}
                                   if config.tie_word_embeddings else {})
        self.post_init()
        self.tie_weights()

    def _init_head(self, module: nn.Module, init, std_out: float, std_final: float) -> None:
        super()._init_head(module, init, std_out, std_final)
        if module is self:
            init(self.decoder, std_out)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.decoder.weight = self.get_input_embeddings().weight

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.head(hidden))

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """-> .loss (mean cross-entropy over the labelled tokens), .logits [batch, seq, vocab_size]
        ([labelled tokens, vocab_size] with config.sparse_prediction and labels)."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        hidden = out.last_hidden_state
        if labels is not None and self.config.sparse_prediction:
            flat = labels.reshape(-1)
            picked = flat != self.config.sparse_pred_ignore_index
            labels = flat[picked]
            logits = self._lm_logits(hidden.reshape(flat.shape[0], -1)[picked])
        else:
            logits = real_token_head(self._lm_logits, hidden, attention_mask)
        return task_output(MaskedLMOutput, self._return_dict(return_dict), out, loss=cross_entropy_loss(logits, labels),
                           logits=logits)


class _Classifier(_ModernBertHead):
    """head, dropout (drop), classifier to config.num_labels outputs (QA: 2, start and end)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(hidden)))


class ModernBertForSequenceClassification(_Classifier):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """-> .loss (per config.problem_type, as transformers chooses it), .logits [batch, num_labels]."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        logits = self._logits(self._pool(out.last_hidden_state, attention_mask))
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return task_output(SequenceClassifierOutput, self._return_dict(return_dict), out, loss=loss, logits=logits)

    def _pool(self, hidden: torch.Tensor, attention_mask) -> torch.Tensor:
        """classifier_pooling "cls": the first token's hidden state; "mean": the mean over the real tokens."""
        if self.config.classifier_pooling == "cls":
            return hidden[:, 0]
        return real_token_mean(hidden, attention_mask, "mean")


class ModernBertForTokenClassification(_Classifier):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """-> .loss (mean cross-entropy over the labelled tokens), .logits [batch, seq, num_labels]."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        logits = real_token_head(self._logits, out.last_hidden_state, attention_mask)
        return task_output(TokenClassifierOutput, self._return_dict(return_dict), out, loss=cross_entropy_loss(logits, labels),
                       logits=logits)


class ModernBertForQuestionAnswering(_Classifier):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, start_positions=None, end_positions=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, inputs_embeds=None,
                head_mask=None):
        """transformers' arguments, in their order (inputs_embeds: fastbert's extra) -> .loss (start and
        end cross-entropy; positions outside the input ignored), .start_logits, .end_logits [batch, seq]."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        logits = self._logits(out.last_hidden_state)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.size(1)  # positions outside the input are ignored, as in transformers
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)) / 2
        return task_output(QuestionAnsweringModelOutput, self._return_dict(return_dict), out, loss=loss,
                       start_logits=start_logits, end_logits=end_logits)


MODERNBERT_CLASSES = (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
                      ModernBertForTokenClassification, ModernBertForQuestionAnswering)
