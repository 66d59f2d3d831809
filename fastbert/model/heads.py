"""The task models: BertModel with the heads of pretraining, masked LM, sequence and token
classification and extractive question answering; FirstTokenClassifier, the sequence classifier on
the first token's last hidden state that RoBERTa, ELECTRA and MPNet share."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops
from fastbert.model.bert import BertModel
from fastbert.model.config import BertConfig
from fastbert.model.layers import BertOnlyMLMHead, BertPreTrainingHeads
from fastbert.model.outputs import (
    BertForPreTrainingOutput,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from fastbert.model.pretrained import BertPreTrainedModel
from fastbert.ops.masking import IGNORE_INDEX


def real_token_mean(x: torch.Tensor, attention_mask: Optional[torch.Tensor], pooling: str) -> torch.Tensor:
    """The mean of x [batch, seq, ...] over the real tokens (over every token without a mask): a
    sequence classifier's `pooling` (named in the error for a mask of another shape)."""
    if attention_mask is None:
        return x.mean(dim=1)
    if attention_mask.dim() != 2:
        raise ValueError(f"fastbert: classifier_pooling {pooling!r} needs a [batch, seq] attention_mask, got shape "
                         f"{tuple(attention_mask.shape)}")
    weights = attention_mask.to(x.dtype)
    return (x * weights[..., None]).sum(dim=1) / weights.sum(dim=1, keepdim=True)


def real_token_head(head, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """head(hidden) [batch, seq, ...], computed at real tokens only when the batch has padding
    (zeros at padded positions). The MLM head's vocabulary GEMM on padded rows is wasted work, and
    its LayerNorm turns the all-zero padded rows of last_hidden_state (with a zero dense bias, as
    initialised) into a rstd of 1/sqrt(eps), whose fp16 backward gives NaN gradients even though
    those rows take no loss."""
    if attention_mask is None or attention_mask.dim() != 2 or torch.compiler.is_compiling():
        return head(hidden)
    if bool(attention_mask.to(torch.bool).all()):
        return head(hidden)
    rows, indices, _, _ = ops.unpad(hidden, attention_mask)
    return ops.pad(head(rows), indices, *attention_mask.shape)


def labelled_rows(hidden: torch.Tensor, labels: torch.Tensor):
    """(the rows of hidden [..., h] at the labelled tokens [n, h], their labels [n]), in the order of
    labels.reshape(-1): what an MLM head needs to run at the masked tokens only."""
    flat = labels.reshape(-1)
    sel = (flat != IGNORE_INDEX).nonzero().squeeze(1)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, sel), flat.index_select(0, sel)


def cross_entropy_loss(logits: torch.Tensor, labels: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Mean cross-entropy over the labelled positions (fp32), or None without labels."""
    if labels is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def task_output(cls, return_dict: bool, encoded, **fields):
    """The head's output with the encoder's hidden_states / attentions (when they were asked for)."""
    out = cls(**fields, hidden_states=encoded.hidden_states, attentions=encoded.attentions)
    return out if return_dict else out.to_tuple()


class TaskModel(BertPreTrainedModel):
    """A task model: the family's encoder (model_class, under base_model_prefix) and a head."""

    model_class = BertModel
    # whether the head reads the first token alone (then the last layer may run at the first tokens only)
    pooled_only: bool = False

    def _add_encoder(self, config, add_pooling_layer: bool) -> None:
        setattr(self, self.base_model_prefix, self.model_class(config, add_pooling_layer=add_pooling_layer))

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, head_mask,
                output_attentions, output_hidden_states):
        return self.base_model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                               position_ids=position_ids, inputs_embeds=inputs_embeds,
                               head_mask=head_mask, output_attentions=output_attentions,
                               output_hidden_states=output_hidden_states, return_dict=True,
                               _pooled_only=self.pooled_only)


def classifier_dropout(config) -> float:
    """The classifier's dropout: classifier_dropout, else hidden_dropout_prob (transformers' rule)."""
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


def sequence_classification_loss(config, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' rule: regression for one label, else single- or multi-label by the labels' dtype
    (the choice is stored in config.problem_type)."""
    problem = config.problem_type
    if problem is None:
        if config.num_labels == 1:
            problem = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem = "single_label_classification"
        else:
            problem = "multi_label_classification"
        config.problem_type = problem
    if problem == "regression":
        if config.num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.mse_loss(logits, labels)
    if problem == "single_label_classification":
        return cross_entropy_loss(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, labels)


class _TiedMLMHead(TaskModel):
    """A model whose MLM decoder is the word-embedding matrix (one parameter, as transformers ties it)."""

    output_embeddings = "cls.predictions.decoder"
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def tie_weights(self) -> None:
        self.get_output_embeddings().weight = self.get_input_embeddings().weight


class BertForPreTraining(_TiedMLMHead):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self._add_encoder(config, True)
        self.cls = BertPreTrainingHeads(config)
        self.post_init()
        self.tie_weights()

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.cls.predictions(hidden)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, next_sentence_label=None, head_mask=None, output_attentions=None, output_hidden_states=None,
                return_dict=None):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, head_mask,
                           output_attentions, output_hidden_states)
        scores = real_token_head(self.cls.predictions, out.last_hidden_state, attention_mask)
        nsp = self.cls.seq_relationship(out.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            loss = cross_entropy_loss(scores, labels) + cross_entropy_loss(nsp, next_sentence_label)
        return task_output(BertForPreTrainingOutput, self._return_dict(return_dict), out, loss=loss,
                       prediction_logits=scores, seq_relationship_logits=nsp)


class BertForMaskedLM(_TiedMLMHead):
    """With config.dense_seq_output = True (flash-attn's BERT has the same switch) and labels, the
    decoder runs at the labelled tokens only and logits are [labelled tokens, vocab_size] in the
    order of labels.reshape(-1); the loss is the same. Off by default: logits are then
    [batch, seq, vocab_size], as transformers gives them."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self._add_encoder(config, False)
        self._add_lm_head(config)
        self.post_init()
        self.tie_weights()

    def _add_lm_head(self, config) -> None:
        self.cls = BertOnlyMLMHead(config)

    def _lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.cls.predictions(hidden)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, head_mask=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, head_mask,
                           output_attentions, output_hidden_states)
        if labels is not None and getattr(self.config, "dense_seq_output", False) and not torch.compiler.is_compiling():
            # the vocabulary product at the labelled tokens only (XLM-R's is 250,002 wide): logits [labelled, vocab]
            rows, targets = labelled_rows(out.last_hidden_state, labels)
            scores = self._lm_logits(rows)
            loss = cross_entropy_loss(scores, targets)
        else:
            scores = real_token_head(self._lm_logits, out.last_hidden_state, attention_mask)
            loss = cross_entropy_loss(scores, labels)
        return task_output(MaskedLMOutput, self._return_dict(return_dict), out, loss=loss, logits=scores)


class _Classifier(TaskModel):
    """BertModel, then dropout (classifier_dropout, else hidden_dropout_prob) and a linear layer to
    num_labels: on the pooled output for sequences, on every token for tokens."""

    output_class = SequenceClassifierOutput
    features = "pooler_output"  # the BertModel output the classifier reads

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._add_encoder(config, self.features == "pooler_output")
        self._add_classifier(config)
        self.post_init()

    def _add_classifier(self, config) -> None:
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(features))

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, head_mask=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, head_mask,
                           output_attentions, output_hidden_states)
        logits = self._logits(getattr(out, self.features))
        return task_output(self.output_class, self._return_dict(return_dict), out, loss=self._loss(logits, labels),
                       logits=logits)


class BertForSequenceClassification(_Classifier):
    """Classification (or regression) of the whole sequence, from the pooled [CLS] output. Unless
    hidden states or attentions are asked for, the last layer runs at the [CLS] token alone (keys
    and values at every token): one layer's work, less its K and V projections, saved. Set
    pooled_only = False (on the class or the instance) to run it on every token."""

    pooled_only = True

    def _loss(self, logits, labels):
        return None if labels is None else sequence_classification_loss(self.config, logits, labels)


class FirstTokenClassificationHead(nn.Module):
    """dropout, dense, activation, dropout, out_proj on the first token's hidden state: RoBERTa's
    (tanh) and ELECTRA's (exact GELU) sequence classifier."""

    def __init__(self, config, activation):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)
        self.activation = activation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.dropout(hidden[:, 0])
        x = self.dropout(self.activation(self.dense(x)))
        return self.out_proj(x)


class FirstTokenClassifier:
    """A sequence classifier whose head reads the first token's last hidden state through
    classifier (dense, the family's activation, out_proj); the last layer runs at the first token
    alone, as BertForSequenceClassification's does."""

    features = "last_hidden_state"
    head_activation = nn.Tanh  # RoBERTa's; ELECTRA's is GELU

    def _add_classifier(self, config) -> None:
        self.classifier = FirstTokenClassificationHead(config, self.head_activation())

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(features)


class BertForTokenClassification(_Classifier):
    """A label for every token (NER), from the last hidden states."""

    output_class, features = TokenClassifierOutput, "last_hidden_state"

    def _loss(self, logits, labels):
        return cross_entropy_loss(logits, labels)


class BertForQuestionAnswering(TaskModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self._add_encoder(config, False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _span_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """What qa_outputs reads (DistilBERT drops some of it out first)."""
        return hidden

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, head_mask=None, output_attentions=None,
                output_hidden_states=None, return_dict=None):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, head_mask,
                           output_attentions, output_hidden_states)
        logits = self.qa_outputs(self._span_features(out.last_hidden_state))
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            start_positions = start_positions.reshape(-1)
            end_positions = end_positions.reshape(-1)
            ignored = start_logits.size(1)  # positions outside the input are ignored, as in transformers
            start_positions = start_positions.clamp(0, ignored)
            end_positions = end_positions.clamp(0, ignored)
            loss = (
                F.cross_entropy(start_logits.float(), start_positions, ignore_index=ignored)
                + F.cross_entropy(end_logits.float(), end_positions, ignore_index=ignored)
            ) / 2
        return task_output(QuestionAnsweringModelOutput, self._return_dict(return_dict), out, loss=loss,
                       start_logits=start_logits, end_logits=end_logits)
