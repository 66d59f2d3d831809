"""The model's input checks: ids against the config, every tensor shaped like input_ids, a 0/1
attention mask; one readable error each (built on fastbert.ops.checks)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from fastbert.ops.checks import check_float, check_ids, check_range, check_shape_like

WHERE = "fastbert"


def check_input_shape(input_ids, inputs_embeds, width: int, max_tokens: int) -> Tuple[int, int]:
    """(batch, seq) of input_ids [batch, seq] or inputs_embeds [batch, seq, width] (exactly one of
    them), no longer than the max_tokens the position table has room for."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"{WHERE}: give exactly one of input_ids and inputs_embeds")
    if inputs_embeds is not None:
        check_float(WHERE, "inputs_embeds", inputs_embeds)
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != width:
            raise ValueError(f"{WHERE}: inputs_embeds must be [batch, seq, {width}] (the word embeddings' width), "
                             f"got {tuple(inputs_embeds.shape)}")
        shape = tuple(inputs_embeds.shape[:2])
    elif not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"{WHERE}: input_ids must be a [batch, seq] tensor, got {got}")
    else:
        shape = tuple(input_ids.shape)
    if shape[1] > max_tokens:
        raise ValueError(f"{WHERE}: sequence length {shape[1]} is longer than the model's max_position_embeddings "
                         f"allow ({max_tokens} tokens)")
    return shape


def check_id_tensor(name: str, t: Optional[torch.Tensor], shape, upper: int, what: str) -> None:
    """An optional tensor of integer ids in [0, upper), shaped like input_ids when `shape` is given."""
    if t is None:
        return
    check_ids(WHERE, name, t)
    if shape is not None:
        check_shape_like(WHERE, name, t, shape)
    check_range(WHERE, name, t, upper, what)


def check_inputs(config, input_ids, token_type_ids, position_ids, shape) -> None:
    """Every value check of BertModel.forward (they read the tensors: skipped under torch.compile)."""
    check_id_tensor("input_ids", input_ids, None, config.vocab_size, "the vocabulary")
    check_id_tensor("token_type_ids", token_type_ids, shape, config.type_vocab_size, "type_vocab_size")
    check_id_tensor("position_ids", position_ids, None, config.max_position_embeddings, "max_position_embeddings")


def check_counting_positions(position_ids: Optional[torch.Tensor], bsz: int, seq: int, family: str) -> None:
    """position_ids [batch or 1, seq] of a rotary family must count 0, 1, 2, ... along each row, up to
    a constant (the kernels rotate by the index within the sequence; a constant shift leaves every
    score as it is)."""
    if position_ids is None:
        return
    check_ids(WHERE, "position_ids", position_ids)
    if position_ids.dim() not in (1, 2) or position_ids.shape[-1] != seq or (
            position_ids.dim() == 2 and position_ids.shape[0] not in (1, bsz)):
        raise ValueError(f"{WHERE}: position_ids has shape {tuple(position_ids.shape)}; it must be [batch, seq] = "
                         f"({bsz}, {seq}) or [1, seq]")
    rows = position_ids.reshape(-1, seq)
    if not torch.equal(rows - rows[:, :1], torch.arange(seq, device=rows.device).expand_as(rows)):
        raise NotImplementedError(f"{WHERE}: position_ids other than 0, 1, 2, ... along each row is not supported "
                                  f"for {family} yet")
