"""The model's input checks: ids against the config, every tensor shaped like input_ids, a 0/1
attention mask; one readable error each (built on fastbert.ops.checks)."""
from __future__ import annotations

from typing import Optional

import torch

from fastbert.ops.checks import check_binary_mask, check_ids, check_range, check_shape_like

WHERE = "fastbert"


def check_input_ids(input_ids, max_positions: int) -> None:
    """input_ids is a [batch, seq] tensor no longer than the position table."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"{WHERE}: input_ids must be a [batch, seq] tensor, got {got}")
    if input_ids.shape[1] > max_positions:
        raise ValueError(
            f"{WHERE}: sequence length {input_ids.shape[1]} is longer than max_position_embeddings {max_positions}"
        )


def check_id_tensor(name: str, t: Optional[torch.Tensor], shape, upper: int, what: str) -> None:
    """An optional tensor of integer ids in [0, upper), shaped like input_ids when `shape` is given."""
    if t is None:
        return
    check_ids(WHERE, name, t)
    if shape is not None:
        check_shape_like(WHERE, name, t, shape)
    check_range(WHERE, name, t, upper, what)


def check_inputs(config, input_ids, attention_mask, token_type_ids, position_ids) -> None:
    """Every value check of BertModel.forward (they read the tensors: skipped under torch.compile)."""
    check_id_tensor("input_ids", input_ids, None, config.vocab_size, "the vocabulary")
    check_id_tensor("token_type_ids", token_type_ids, input_ids.shape, config.type_vocab_size, "type_vocab_size")
    check_id_tensor("position_ids", position_ids, None, config.max_position_embeddings, "max_position_embeddings")
    if attention_mask is not None:
        check_binary_mask(WHERE, "attention_mask", attention_mask)
        check_shape_like(WHERE, "attention_mask", attention_mask, input_ids.shape)
