"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes.

Same config fields, same module and parameter names (so state dicts move both ways unchanged),
same forward arguments and output field names. Inside, every layer runs through fastbert.ops:

    embeddings (+ LayerNorm) -> unpad once -> N x [QKV GEMM -> attention -> out GEMM ->
    add_layer_norm -> GEMM -> bias_gelu -> GEMM -> add_layer_norm] -> pad once -> heads

A batch with padding runs packed (varlen attention over the real tokens only); a batch without
padding, or any batch under torch.compile, runs padded. Both give the same values at real tokens;
hidden states at padded positions are not defined (fastbert leaves them zero on the packed path).
"""
from __future__ import annotations

import torch

from fastbert import ops
from fastbert.model.checks import check_input_ids, check_inputs
from fastbert.model.config import BertConfig
from fastbert.model.layers import BertEmbeddings, BertEncoder, BertPooler
from fastbert.model.outputs import BaseModelOutputWithPooling
from fastbert.model.pretrained import BertPreTrainedModel


class BertModel(BertPreTrainedModel):
    # a batch with padding runs packed (unpad once, varlen attention, pad once); False keeps every
    # batch padded (the two paths agree at real tokens; the switch is there to check that)
    unpad_inputs: bool = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def base_model(self) -> "BertModel":
        return self

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, return_dict=True):
        """input_ids [batch, seq]; attention_mask [batch, seq] (1 = real token); token_type_ids,
        position_ids [batch, seq] -> .last_hidden_state [batch, seq, hidden], .pooler_output [batch, hidden]."""
        cfg = self.config
        check_input_ids(input_ids, cfg.max_position_embeddings)
        bsz, seq = input_ids.shape
        compiling = torch.compiler.is_compiling()
        if not compiling:  # value checks read the tensors: skipped while torch.compile traces
            check_inputs(cfg, input_ids, attention_mask, token_type_ids, position_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(seq, device=input_ids.device).expand(bsz, seq)
        hidden = self.embeddings(input_ids, token_type_ids, position_ids)
        mask = None if attention_mask is None else attention_mask.to(torch.bool)
        packed = self.unpad_inputs and mask is not None and not compiling and not bool(mask.all())
        if packed:
            h, indices, cu_seqlens, max_seqlen = ops.unpad(hidden, mask)
            for layer in self.encoder.layer:
                h = layer(h, None, (cu_seqlens, max_seqlen))
            hidden = ops.pad(h, indices, bsz, seq)
        else:
            for layer in self.encoder.layer:
                hidden = layer(hidden, mask, None)
        pooled = self.pooler(hidden) if self.pooler is not None else None
        out = BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)
        return out if return_dict else out.to_tuple()
