"""What the pre-norm encoders (ModernBERT, EuroBERT) share: their base model's forward. It checks
the inputs as transformers' forward takes them, replays the CUDA graphs where they run, and runs
the layers packed (a batch with padding: unpad once, pad once) or padded; the family gives its
embeddings (embed) and its layers (_encode)."""
from __future__ import annotations

import sys
from typing import Optional

import torch

from fastbert import ops
from fastbert.model.checks import check_counting_positions, check_id_tensor, check_input_shape
from fastbert.model.masks import attention_masks
from fastbert.model.outputs import BaseModelOutput
from fastbert.ops import encoder


class PreNormForward:
    """The base model's forward of a pre-norm family (a BertPreTrainedModel beside it)."""

    family: str  # its name in errors: "ModernBERT"
    # a batch with padding runs packed; False keeps every batch padded (the two agree at real tokens)
    unpad_inputs: bool = True

    def embed(self, input_ids: Optional[torch.Tensor], inputs_embeds: Optional[torch.Tensor]) -> torch.Tensor:
        """The embeddings' output [batch, seq, hidden]."""
        raise NotImplementedError

    def _encode(self, h: torch.Tensor, mask, packed, to_output, want_states: bool, want_probs: bool):
        """(last_hidden_state, hidden states or None, probabilities or None), each through to_output;
        h: the embeddings' output, packed rows [tokens, hidden] (packed = (cu_seqlens, max_seqlen))
        or padded [batch, seq, hidden] (mask [batch, seq] or None)."""
        raise NotImplementedError

    def not_supported(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"fastbert: {what} is not supported for {self.family} yet")

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """transformers' forward: input_ids [batch, seq] (or inputs_embeds [batch, seq, hidden]),
        attention_mask [batch, seq] (1 = real token), position_ids (0, 1, 2, ... a row, the default:
        rotary positions count along each row) -> .last_hidden_state [batch, seq, hidden] (after the
        final norm), .hidden_states (the embeddings' output, then every layer's, the last one after
        the final norm, as transformers gives them), .attentions (each layer's probabilities [batch,
        heads, seq, seq], as transformers' eager attention gives them). head_mask: an error (these
        families' transformers classes take none)."""
        cfg = self.config
        output_hidden_states = cfg.output_hidden_states if output_hidden_states is None else output_hidden_states
        want_probs = bool(cfg.output_attentions if output_attentions is None else output_attentions)
        return_dict = self._return_dict(return_dict)
        if head_mask is not None:
            raise NotImplementedError(f"fastbert: {self.family} takes no head_mask: transformers' {type(self).__name__} "
                                      "has none either (its forward ignores one); leave head_mask out")
        bsz, seq = check_input_shape(input_ids, inputs_embeds, cfg.hidden_size, sys.maxsize)
        compiling = torch.compiler.is_compiling()
        if not compiling:  # value checks read the tensors: skipped while torch.compile traces
            check_id_tensor("input_ids", input_ids, None, cfg.vocab_size, "the vocabulary")
            check_counting_positions(position_ids, bsz, seq, self.family)
        key_mask, bias = attention_masks(attention_mask, bsz, seq, cfg.num_attention_heads)
        if bias is not None:
            raise self.not_supported("an attention_mask other than a padding mask")
        graphs = None if want_probs or output_hidden_states else self.graphs_for(input_ids)
        if graphs is not None:  # the encoder as one CUDA graph replay
            hidden = graphs(encoder.pack_inputs(input_ids, None, None, key_mask), self.graph_sources)
            result = BaseModelOutput(last_hidden_state=hidden)
            return result if return_dict else result.to_tuple()
        hidden = self.embed(input_ids, inputs_embeds)
        if key_mask is not None and not compiling and bool(key_mask.all()):
            key_mask = None
        encode = self._encode
        # packed (unpad once, pad once) unless there is no padding, the probabilities are asked for
        # (they are [batch, heads, seq, seq]) or torch.compile traces (the packed shapes depend on values)
        if key_mask is not None and self.unpad_inputs and not want_probs and not compiling:
            h, indices, cu_seqlens, max_seqlen = ops.unpad(hidden, key_mask)
            out, states, probs = encode(h, None, (cu_seqlens, max_seqlen), lambda t: ops.pad(t, indices, bsz, seq),
                                        output_hidden_states, False)
        else:
            out, states, probs = encode(hidden, key_mask, None, lambda t: t, output_hidden_states, want_probs)
        result = BaseModelOutput(last_hidden_state=out, hidden_states=states, attentions=probs)
        return result if return_dict else result.to_tuple()
