"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes.

Same config fields, same module and parameter names (so state dicts move both ways unchanged),
same forward arguments and output field names. Inside, every layer runs through fastbert.ops:

    embeddings (+ LayerNorm) -> unpad once -> N x [QKV GEMM -> attention -> out GEMM ->
    add_layer_norm -> GEMM -> bias_gelu -> GEMM -> add_layer_norm] -> pad once -> heads

A batch with padding runs packed (varlen attention over the real tokens only); a batch without
padding, or any batch under torch.compile, runs padded. Every path and precision (fp32 / bf16
packed, padded, int8) and every family walks the layers in the one loop of layers.run_layers.
Both give the same values at real tokens; hidden states at padded positions are not defined
(fastbert leaves them zero on the packed path).
"""
from __future__ import annotations

import torch

from fastbert import ops
from fastbert.model import stack
from fastbert.model.checks import check_input_shape, check_inputs
from fastbert.model.config import BertConfig
from fastbert.model.int8 import encode_int8
from fastbert.model.layers import BertEmbeddings, BertEncoder, BertPooler, run_layers
from fastbert.model.masks import attention_masks, head_scales
from fastbert.model.outputs import BaseModelOutputWithPooling
from fastbert.model.pretrained import BertPreTrainedModel


class BertModel(BertPreTrainedModel):
    """The encoder of every family: embeddings (the family's: embeddings_class, embed) -> the
    layers -> pooler (when the family has one)."""

    embeddings_class = BertEmbeddings
    # a batch with padding runs packed (unpad once, varlen attention, pad once); False keeps every
    # batch padded (the two paths agree at real tokens; the switch is there to check that)
    unpad_inputs: bool = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = self.embeddings_class(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                encoder_hidden_states=None, encoder_attention_mask=None, past_key_values=None, use_cache=None,
                head_mask=None, output_attentions=None, output_hidden_states=None, return_dict=None, *,
                _pooled_only: bool = False):
        """transformers' BertModel.forward: input_ids [batch, seq] (or inputs_embeds [batch, seq,
        hidden]); attention_mask (see fastbert.model.masks), token_type_ids, position_ids [batch, seq];
        head_mask; output_attentions / output_hidden_states / return_dict (config's when None) ->
        .last_hidden_state [batch, seq, hidden], .pooler_output [batch, hidden], .hidden_states,
        .attentions. The cross-attention and cache arguments are a decoder's: not supported.

        _pooled_only (for heads that read the first token alone, through the pooler or not: BERT's
        and RoBERTa's sequence classifiers): the last layer may run at each
        sequence's first token only (BertLayer.first_tokens); last_hidden_state is then [batch, 1,
        hidden]. It does whenever the other outputs do not need every token: no hidden states or
        attention probabilities asked for, no additive float mask, a real first token in every
        sequence."""
        if encoder_hidden_states is not None or encoder_attention_mask is not None or past_key_values is not None:
            raise NotImplementedError("fastbert: BertModel is an encoder; cross-attention and key/value caches "
                                      "(BERT as a decoder) are not supported")
        cfg = self.config
        output_attentions = cfg.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = cfg.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = self._return_dict(return_dict)
        emb = self.embeddings
        bsz, seq = check_input_shape(input_ids, inputs_embeds, emb.word_embeddings.embedding_dim, emb.max_tokens)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        compiling = torch.compiler.is_compiling()
        if not compiling:  # value checks read the tensors: skipped while torch.compile traces
            check_inputs(cfg, input_ids, token_type_ids, position_ids, (bsz, seq))
        key_mask, bias = attention_masks(attention_mask, bsz, seq, cfg.num_attention_heads)
        if token_type_ids is None:
            token_type_ids = torch.zeros((bsz, seq), dtype=torch.long, device=device)
        if position_ids is None:
            position_ids = emb.default_position_ids(input_ids, bsz, seq, device)
        hidden = self.embed(input_ids, token_type_ids, position_ids, inputs_embeds)
        scales = head_scales(head_mask, cfg.num_hidden_layers, cfg.num_attention_heads)
        rel = self.relative_position_bias(seq)
        explicit = bias is not None or bool(output_attentions)
        first_only = (_pooled_only and not self.quantized and cfg.num_hidden_layers > 0
                      and not explicit and not output_hidden_states and not compiling
                      and (key_mask is None or bool(key_mask[:, 0].all())))
        if self.quantized:
            hidden, states, probs = encode_int8(self, hidden, key_mask, bias, scales, output_hidden_states,
                                                output_attentions, rel)
        elif self.unpad_inputs and key_mask is not None and not compiling and not explicit and not bool(key_mask.all()):
            hidden, states, probs = self._encode_packed(hidden, key_mask, scales, output_hidden_states, first_only, rel)
        else:
            hidden, states, probs = self._encode_padded(hidden, key_mask, bias, scales, output_hidden_states,
                                                        output_attentions, first_only, rel)
        pooled = self.pooler(hidden) if self.pooler is not None else None
        out = BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled, hidden_states=states,
                                         attentions=probs)
        return out if return_dict else out.to_tuple()

    @property
    def layers(self) -> torch.nn.ModuleList:
        """The encoder layers (encoder.layer; DistilBERT's transformer.layer)."""
        return self.encoder.layer

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> torch.Tensor:
        """The encoder's input [batch, seq, hidden]."""
        return self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)

    def relative_position_bias(self, seq: int):
        """The relative position bias [heads, 2 seq - 1] every layer's attention adds to its scores
        (MPNet's, made once a forward from its bucket table), or None: the families without one."""
        return None

    def _encode_packed(self, hidden, key_mask, scales, output_hidden_states, first_only=False, rel=None):
        """Unpad once, every layer on the real tokens (varlen attention), pad once; with first_only,
        the last layer at each sequence's first token only (-> [batch, 1, hidden]); rel: the
        relative position bias or None."""
        bsz, seq = key_mask.shape
        h, indices, cu_seqlens, max_seqlen = ops.unpad(hidden, key_mask)
        layers, last = self._layer_plan(scales, first_only)

        def step(layer, h, scale):
            return self._run_layer(layer, h, None, (cu_seqlens, max_seqlen), None, scale, False, rel)

        def to_output(h):
            return ops.pad(h, indices, bsz, seq)

        h, states = self._run_stack(layers, h, None, (cu_seqlens, max_seqlen), rel, to_output, output_hidden_states,
                                    step)
        if last is not None:
            return (self._run_layer(last[0].first_tokens, h, key_mask, (indices, cu_seqlens), last[1], rel)[:, None],
                    None, None)
        out = states[-1] if states else ops.pad(h, indices, bsz, seq)
        return out, None if states is None else (hidden, *states), None

    def _encode_padded(self, hidden, key_mask, bias, scales, output_hidden_states, output_attentions,
                       first_only=False, rel=None):
        layers, last = self._layer_plan(scales, first_only)
        want_probs = bool(output_attentions)

        def step(layer, h, scale):
            return self._run_layer(layer, h, key_mask, None, bias, scale, want_probs, rel)

        if bias is None and not want_probs:
            out, states = self._run_stack(layers, hidden, key_mask, None, rel, lambda h: h, output_hidden_states, step)
            probs = None
        else:
            out, states, probs = run_layers(layers, hidden, step, lambda h: h, output_hidden_states, want_probs)
        if last is not None:
            return self._run_layer(last[0].first_tokens, out, key_mask, None, last[1], rel)[:, None], None, None
        return out, None if states is None else (hidden, *states), None if probs is None else tuple(probs)

    def _run_stack(self, layers, h, mask, packed, rel, to_output, output_hidden_states, step):
        """-> (the last h, [to_output(h) after each layer] or None): the (layer, head scale) pairs in
        one call of the extension where it runs them all (fastbert.model.stack), else one by one."""
        outs = None
        if all(scale is None for _, scale in layers):
            outs = stack.float_stack(self, len(layers), h, mask, packed, rel, bool(output_hidden_states))
        if outs is None:
            h, states, _ = run_layers(layers, h, step, to_output, output_hidden_states, False)
            return h, states
        return outs[-1], [to_output(o) for o in outs] if output_hidden_states else None

    def _layer_plan(self, scales, first_only: bool):
        """(the (layer, head scale) pairs run on every token, the last pair when first_only runs it
        at the first tokens alone, else None)."""
        pairs = list(zip(self.layers, scales))
        return (pairs[:-1], pairs[-1]) if first_only else (pairs, None)
