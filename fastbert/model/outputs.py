"""Model outputs as transformers' ModelOutput: fields by attribute, by name (out["loss"]) and by
position (out[0], out.to_tuple(); fields that are None are skipped), and a dict of the fields set."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple

import torch

Tensors = Optional[Tuple[torch.Tensor, ...]]


class _Output(OrderedDict):
    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                OrderedDict.__setitem__(self, f.name, value)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if value is not None and name in (f.name for f in fields(self)):
            OrderedDict.__setitem__(self, name, value)

    def __getitem__(self, key):
        if isinstance(key, str):
            return OrderedDict.__getitem__(self, key)
        return self.to_tuple()[key]

    def to_tuple(self) -> Tuple[Any, ...]:
        return tuple(OrderedDict.__getitem__(self, k) for k in self.keys())


@dataclass(eq=False)
class BaseModelOutputWithPooling(_Output):
    """last_hidden_state [batch, seq, hidden], pooler_output [batch, hidden]; hidden_states (the
    embeddings' output, then every layer's) and attentions ([batch, heads, seq, seq] per layer) when asked."""

    last_hidden_state: Optional[torch.Tensor] = None
    pooler_output: Optional[torch.Tensor] = None
    hidden_states: Tensors = None
    attentions: Tensors = None


@dataclass(eq=False)
class BertForPreTrainingOutput(_Output):
    loss: Optional[torch.Tensor] = None
    prediction_logits: Optional[torch.Tensor] = None
    seq_relationship_logits: Optional[torch.Tensor] = None
    hidden_states: Tensors = None
    attentions: Tensors = None


@dataclass(eq=False)
class _LossAndLogits(_Output):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    hidden_states: Tensors = None
    attentions: Tensors = None


class MaskedLMOutput(_LossAndLogits):
    """loss (mean cross-entropy over the labelled tokens), logits [batch, seq, vocab_size]."""


class SequenceClassifierOutput(_LossAndLogits):
    """loss (per config.problem_type), logits [batch, num_labels]."""


class TokenClassifierOutput(_LossAndLogits):
    """loss (mean cross-entropy over the labelled tokens), logits [batch, seq, num_labels]."""


@dataclass(eq=False)
class QuestionAnsweringModelOutput(_Output):
    loss: Optional[torch.Tensor] = None
    start_logits: Optional[torch.Tensor] = None
    end_logits: Optional[torch.Tensor] = None
    hidden_states: Tensors = None
    attentions: Tensors = None
