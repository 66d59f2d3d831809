"""Model outputs as transformers' ModelOutput: fields by attribute, by name (out["loss"]) and by
position (out[0], out.to_tuple(); fields that are None are skipped), and a dict of the fields set."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple


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


def _output_class(name: str, doc: str, *names: str):
    """A dataclass of `names` (tensors, None by default), then hidden_states and attentions, in
    transformers' field order."""
    names = names + ("hidden_states", "attentions")
    namespace = {"__doc__": doc, "__module__": __name__, "__qualname__": name,
                 "__annotations__": {n: Optional[Any] for n in names}, **{n: None for n in names}}
    return dataclass(eq=False)(type(name, (_Output,), namespace))


BaseModelOutput = _output_class(
    "BaseModelOutput", "last_hidden_state [batch, seq, hidden]; hidden_states and attentions when asked (ModernBERT's "
    "base model: no pooler).", "last_hidden_state")
BaseModelOutputWithPooling = _output_class(
    "BaseModelOutputWithPooling",
    "last_hidden_state [batch, seq, hidden], pooler_output [batch, hidden]; hidden_states (the embeddings' "
    "output, then every layer's) and attentions ([batch, heads, seq, seq] per layer) when asked.",
    "last_hidden_state", "pooler_output")
BertForPreTrainingOutput = _output_class(
    "BertForPreTrainingOutput", "loss (MLM + NSP), prediction_logits [batch, seq, vocab_size], "
    "seq_relationship_logits [batch, 2].", "loss", "prediction_logits", "seq_relationship_logits")
MaskedLMOutput = _output_class(
    "MaskedLMOutput", "loss (mean cross-entropy over the labelled tokens), logits [batch, seq, vocab_size].",
    "loss", "logits")
SequenceClassifierOutput = _output_class(
    "SequenceClassifierOutput", "loss (per config.problem_type), logits [batch, num_labels].", "loss", "logits")
TokenClassifierOutput = _output_class(
    "TokenClassifierOutput", "loss (mean cross-entropy over the labelled tokens), logits [batch, seq, num_labels].",
    "loss", "logits")
QuestionAnsweringModelOutput = _output_class(
    "QuestionAnsweringModelOutput", "loss (start and end cross-entropy), start_logits, end_logits [batch, seq].",
    "loss", "start_logits", "end_logits")
MultipleChoiceModelOutput = _output_class(
    "MultipleChoiceModelOutput", "loss (cross-entropy over the choices), logits [batch, choices].", "loss", "logits")
ElectraForPreTrainingOutput = _output_class(
    "ElectraForPreTrainingOutput", "loss (binary cross-entropy of replaced-token detection over the real tokens), "
    "logits [batch, seq].", "loss", "logits")
