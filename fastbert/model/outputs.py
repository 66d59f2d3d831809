"""Model outputs: attribute access and tuple-style indexing, as transformers' ModelOutput."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple

import torch


class _Output:
    def to_tuple(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None)

    def __getitem__(self, key):
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())

    def keys(self):
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


@dataclass
class BaseModelOutputWithPooling(_Output):
    last_hidden_state: Optional[torch.Tensor] = None
    pooler_output: Optional[torch.Tensor] = None


@dataclass
class BertForPreTrainingOutput(_Output):
    loss: Optional[torch.Tensor] = None
    prediction_logits: Optional[torch.Tensor] = None
    seq_relationship_logits: Optional[torch.Tensor] = None


@dataclass
class _LossAndLogits(_Output):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


class MaskedLMOutput(_LossAndLogits):
    """loss (mean cross-entropy over the labelled tokens), logits [batch, seq, vocab_size]."""


class SequenceClassifierOutput(_LossAndLogits):
    """loss (per config.problem_type), logits [batch, num_labels]."""


class TokenClassifierOutput(_LossAndLogits):
    """loss (mean cross-entropy over the labelled tokens), logits [batch, seq, num_labels]."""


@dataclass
class QuestionAnsweringModelOutput(_Output):
    loss: Optional[torch.Tensor] = None
    start_logits: Optional[torch.Tensor] = None
    end_logits: Optional[torch.Tensor] = None
