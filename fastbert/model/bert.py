"""BERT on fastbert's fused ops, a drop-in for transformers' BERT classes.

Same config fields, same module and parameter names (so state dicts move both ways unchanged),
same forward arguments and output field names. Inside, every layer runs through fastbert.ops:

    embeddings (+ LayerNorm) -> unpad once -> N x [QKV GEMM -> attention -> out GEMM ->
    add_layer_norm -> GEMM -> bias_gelu -> GEMM -> add_layer_norm] -> pad once -> heads

A batch with padding runs packed (varlen attention over the real tokens only); a batch without
padding, or any batch under torch.compile, runs padded. Every path and precision (fp32 / bf16
packed, padded, int8) and every family walks the layers in the one loop of BertModel._layers;
how each layer runs (one call of the extension, the kernels one by one, int8) is fastbert.ops.encoder's.
Both give the same values at real tokens; hidden states at padded positions are not defined
(fastbert leaves them zero on the packed path).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch

from fastbert import ops
from fastbert.model import stack_plan
from fastbert.model.checks import check_input_shape, check_inputs
from fastbert.model.config import OTHER_ACTIVATIONS, BertConfig
from fastbert.model.joined import Unmoved, views_of
from fastbert.model.layers import BertEmbeddings, BertEncoder, BertPooler, gate_form, gated_activation
from fastbert.model.masks import attention_masks, head_scales
from fastbert.model.outputs import BaseModelOutputWithPooling
from fastbert.model.pretrained import BertPreTrainedModel
from fastbert.model.quantize import TRAINING_ERROR, InferenceOnly
from fastbert.ops import encoder
from fastbert.ops.bias_gelu import GELU_FORMS
from fastbert.ops.encoder import LayerWeights


class KeptLayers(NamedTuple):
    """BertModel.kept_layers: each layer's (weights, heads, eps, GELU form), and the layers' backend
    settings."""

    layers: list
    backends: frozenset


class BertModel(BertPreTrainedModel):
    """The encoder of every family: embeddings (the family's: embeddings_class, embed) -> the
    layers -> pooler (when the family has one)."""

    embeddings_class = BertEmbeddings
    pooler_class = BertPooler
    encoder_class = BertEncoder  # the layers (MPNet's: and the relative position bias they share)
    # a batch with padding runs packed (unpad once, varlen attention, pad once); False keeps every
    # batch padded (the two paths agree at real tokens; the switch is there to check that)
    unpad_inputs: bool = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = self.embeddings_class(config)
        self.encoder = self.encoder_class(config)
        self.pooler = self.pooler_class(config) if add_pooling_layer else None
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
        graphs = None
        if bias is None and head_mask is None and not output_attentions and not output_hidden_states:
            graphs = self.graphs_for(input_ids)
        if graphs is not None:  # the encoder as one CUDA graph replay
            hidden = graphs(encoder.pack_inputs(input_ids, token_type_ids, position_ids, key_mask),
                            self.graph_sources)
            out = BaseModelOutputWithPooling(last_hidden_state=hidden,
                                             pooler_output=self.pooler(hidden) if self.pooler is not None else None)
            return out if return_dict else out.to_tuple()
        hidden = self.embed(input_ids, token_type_ids, position_ids, inputs_embeds)
        scales = head_scales(head_mask, cfg.num_hidden_layers, cfg.num_attention_heads)
        rel = self.relative_position_bias(seq)
        explicit = bias is not None or bool(output_attentions)
        first_only = (_pooled_only and not self.quantized and cfg.num_hidden_layers > 0
                      and not explicit and not output_hidden_states and not compiling
                      and self.layers[-1].rotary_base is None  # (first_tokens takes absolute positions)
                      and (key_mask is None or bool(key_mask[:, 0].all())))
        hidden, states, probs = self._encode(hidden, key_mask, bias, scales, bool(output_hidden_states),
                                             bool(output_attentions), first_only, rel)
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

    def packed_encode(self, ids, types, positions, cu_seqlens, max_seqlen: int):
        """The embeddings and every layer on packed tokens -> the last layer's rows [tokens, hidden]
        (what a CUDA graph captures; see BertPreTrainedModel.packed_encode)."""
        h = self.embed(ids, types, positions, None)
        return self._layers(h, mask=None, packed=(cu_seqlens, max_seqlen), bias=None, scales=[None] * len(self.layers),
                            rel=self.relative_position_bias(max_seqlen), want_states=False, want_probs=False,
                            first=None, shape=None)[0]

    def relative_position_bias(self, seq: int):
        """The relative position bias [heads, 2 seq - 1] every layer's attention adds to its scores
        (MPNet's, made once a forward from its bucket table), or None: the families without one."""
        return None

    def _encode(self, hidden, key_mask, bias, scales, want_states: bool, want_probs: bool, first_only: bool, rel):
        """The encoder's layers on the embeddings' output hidden [batch, seq, width] -> (the last
        hidden state, the hidden states (hidden, then each layer's output) or None, each layer's
        attention probabilities or None). Unpad once, the layers (BertModel._layers), pad once.

        The layers run packed on the real tokens (varlen attention) where the batch has padding and
        nothing asks for the padded explicit path (an additive mask, the probabilities; torch.compile
        tracing, whose shapes may not depend on values; unpad_inputs False); int8 layers run packed
        whenever no additive mask, probabilities or head mask ask for that path. first_only: the last
        layer at each sequence's first token only (-> [batch, 1, width])."""
        bsz, seq, width = hidden.shape
        int8 = self.quantized is not None
        if int8 and self.training:
            raise RuntimeError(TRAINING_ERROR)
        explicit = bias is not None or want_probs
        if int8:
            pack = not explicit and all(s is None for s in scales)
            unpad = pack and key_mask is not None and not bool(key_mask.all())
        else:
            unpad = pack = (self.unpad_inputs and key_mask is not None and not torch.compiler.is_compiling()
                            and not explicit and not bool(key_mask.all()))
        indices = cu_seqlens = None
        if unpad:
            rows, indices, cu_seqlens, max_seqlen = ops.unpad(hidden, key_mask)
        elif pack:  # int8 with no padding: every row real
            rows, max_seqlen = hidden.reshape(-1, width), seq
            cu_seqlens = torch.arange(0, (bsz + 1) * seq, seq, dtype=torch.int32, device=hidden.device)
        else:
            rows = hidden.reshape(-1, width) if int8 else hidden
        first = (key_mask, None if indices is None else (indices, cu_seqlens)) if first_only else None
        run = functools.partial(self._layers, mask=None if pack else key_mask,
                                packed=(cu_seqlens, max_seqlen) if pack else None, bias=bias, scales=scales, rel=rel,
                                want_states=want_states, want_probs=want_probs, first=first, shape=(bsz, seq, width))
        if int8 and torch.is_grad_enabled() and rows.requires_grad:
            out = InferenceOnly.apply(rows, run)  # no gradient through int8 layers: its backward names the fix
        else:
            out = run(rows)
        if first_only:
            return out[0][:, None], None, None

        def padded(h):  # pad once: rows back to [batch, seq, width]
            return ops.pad(h, indices, bsz, seq) if indices is not None else h.view(bsz, seq, width)

        n_states = len(self.layers) if want_states else 0
        states = [padded(h) for h in out[1:1 + n_states]]
        last = states[-1] if states else padded(out[0])
        return (last, (hidden, *states) if want_states else None,
                tuple(out[1 + n_states:]) if want_probs else None)

    def _layers(self, h, *, mask, packed, bias, scales, rel, want_states: bool, want_probs: bool, first, shape):
        """The loop over the layers, for every path and precision: h [batch, seq, width] (mask: bool
        [batch, seq] or None), the packed rows [tokens, width] (packed = (cu_seqlens, max_seqlen)),
        or int8's padded rows [batch * seq, width] (shape: [batch, seq, width]). All of them in one
        call of the extension where it runs them (fastbert.ops.encoder's stacks), else one by one:
        training, forward hooks, head_mask, attention probabilities, a path or precision the
        extension does not run. first = (key_mask, (indices, cu_seqlens) of the packed rows or None):
        the last layer runs at each sequence's first token only. -> (the last h, each layer's h
        (want_states), each layer's probabilities (want_probs))."""
        int8 = self.quantized is not None
        pairs = list(zip(self.layers, scales))
        last = pairs.pop() if first is not None else None
        hq = ops.quantize_rows(h) if int8 else None  # the layer input's quantized rows, made by the layer before
        outs = None
        if (bias is None and not want_probs and all(s is None for _, s in pairs)
                and (packed is not None or not int8)):
            outs = self._stack(h, hq, mask, packed, rel, len(pairs), want_states)
        kept = None
        if outs is None and not int8 and bias is None and not want_probs and all(s is None for _, s in pairs):
            kept = self.kept_layers(len(pairs))
        if outs is None and kept is not None and len(kept.backends) == 1:
            # what BertLayer.forward runs for each layer (kept_layers: no hook, eval mode, inference),
            # without the calls' host time, the route decided once for the stack
            route = (mask, None, None) if packed is None else (None, *packed)
            outs = encoder.layers_forward(h, kept.layers, *route, rel, next(iter(kept.backends)), want_states)
        if outs is not None:
            h, states, probs = outs[-1], (outs if want_states else []), []
        else:
            states, probs = [], []
            route = (mask, None, None) if packed is None else (None, *packed)
            for i, (layer, scale) in enumerate(pairs):
                if int8:
                    h, hq, p = self._int8_layer(layer, h, hq, mask, packed, bias, scale, want_probs, rel, shape,
                                                quantize_out=i < len(pairs) - 1)
                elif kept is not None:  # layers of more than one backend setting: each its own
                    weights, heads, eps, form = kept.layers[i]
                    h, p = encoder.layer_forward(h, weights, heads, eps, form, *route, rel, layer.backend), None
                else:
                    h, p = self._run_layer(layer, h, mask, packed, bias, scale, want_probs, rel)
                if want_states:
                    states.append(h)
                if want_probs:
                    probs.append(p)
        if last is not None:
            h = self._run_layer(last[0].first_tokens, h, first[0], first[1], last[1], rel)
        return (h, *states, *probs)

    def _stack(self, h, hq, mask, packed, rel, count: int, keep_states: bool) -> Optional[list]:
        """The first `count` layers in one call of the extension (hq: h's quantized rows for int8
        layers, else None) -> [the last output] (keep_states: every layer's), or None where it does
        not run them here; their tensors read once and kept (fastbert.model.stack_plan)."""
        int8 = hq is not None
        layers = tuple(self.layers)
        if (count < 1 or not encoder.stack_applies(h, int8, mask, layers[0].backend)
                or (not int8 and (not encoder.inference_now() or stack_plan.hooked(layers[:count])))):
            return None
        cu, n = (None, 0) if packed is None else (packed[0], int(packed[1]))
        for _ in range(2):
            p = stack_plan.plan(self, layers, int8)
            if not p.runs:
                return None
            args = (p.tensors[:count], p.products[:count], p.heads[:count], p.eps[:2 * count], p.forms[:count],
                    p.backends)
            if int8:
                out = encoder.int8_encoder_stack(h, hq, *args, cu, n, rel, keep_states)
            else:
                out = encoder.encoder_stack(h, *args, mask=mask, cu_seqlens=cu, max_seqlen=n, rel=rel,
                                            keep_states=keep_states)
            if out is None or out:
                return out
            stack_plan.drop_plans(self, int8)  # a joined tensor's parts moved: the next plan joins them again
        return None

    def kept_layers(self, count: int) -> Optional["KeptLayers"]:
        """What the inference route (encoder.layer_forward, as BertLayer.forward calls it) reads of
        each of the first `count` layers, (weights(), heads, both eps, the GELU form) in .layers,
        and their backend settings (.backends), taken from the plan the model keeps
        (fastbert.model.stack_plan: rebuilt whenever anything it was read from changes), so that a
        forward whose layers run one by one (on Triton) does not read every module again; None
        where the plan does not cover them (training, hooks, a layer of another kind) or a joined
        QKV tensor's parts moved (the layers' own read joins them again). Made once per plan and
        count; the joined tensors' parts are checked at every call."""
        layers = tuple(self.layers)
        if count < 1 or not encoder.inference_now() or stack_plan.hooked(layers[:count]):
            return None
        p = stack_plan.plan(self, layers, False)
        if not p.runs:
            return None
        made = p.made.get(("kept", count))
        if made is not None and made[1]():  # (KeptLayers, their joined tensors' parts unmoved)
            return made[0]
        if made is not None or not all(views_of(tensors[0], tensors[12:15]) and views_of(tensors[1], tensors[15:])
                                       for tensors in p.tensors[:count]):
            stack_plan.drop_plans(self, False)  # a part moved: the layers' own reads join them again
            return None
        kept = KeptLayers([(LayerWeights(*tensors[:12]), p.heads[i], (p.eps[2 * i], p.eps[2 * i + 1]), p.forms[i])
                           for i, tensors in enumerate(p.tensors[:count])], p.backends)
        p.made[("kept", count)] = (kept, Unmoved([t for tensors in p.tensors[:count] for t in tensors[12:]]))
        return kept

    def _int8_layer(self, layer, h, hq, mask, packed, bias, scale, want_probs: bool, rel, shape, quantize_out: bool):
        """One int8 layer on rows h [rows, width] and hq, their quantized rows, around the layer's
        own attention -> (its output rows, their quantized rows (empty unless quantize_out), its
        attention probabilities or None)."""
        w = layer.weights()
        qkv = encoder.int8_linear(hq, w.qkv_weight, w.qkv_scale, w.qkv_bias, h.dtype)
        ctx, p = layer.attend(qkv, h.shape if packed is not None else shape, mask, packed, bias, scale, want_probs,
                              rel)
        act, gated = layer.ffn_act, layer.ffn_gated
        if gated:  # (w's FFN input: the gate and up products joined, whose output this gates)
            activation = gate_form(act) or functools.partial(gated_activation, act=act, backend=layer.backend)
        else:
            activation = GELU_FORMS[act] if act in GELU_FORMS else OTHER_ACTIVATIONS[act]
        h, hq = encoder.int8_layer_rest(ctx.reshape(-1, h.shape[-1]), h, w,
                                        (layer.attention_norm.eps, layer.ffn_norm.eps), activation, quantize_out,
                                        gated)
        return h, hq, p
