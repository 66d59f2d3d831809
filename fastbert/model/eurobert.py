"""EuroBERT (EuroBERT-210m, -610m, -2.1B) on fastbert's ops, a drop-in for transformers' EuroBert
classes: a Llama-style pre-norm encoder.

    h = embed_tokens(ids)
    -> unpad once -> N x [h = h + o_proj(attention(q_proj, k_proj, v_proj of input_layernorm(h)))
                         h = h + down_proj(act(gate_proj(x)) * up_proj(x)), x = post_attention_layernorm(h)]
    -> norm -> pad once

Through fastbert.ops: every RMSNorm that follows a residual add is ops.add_rms_norm with the residual
stream written in the same pass (return_sum), as ModernBERT's LayerNorms are (the norm of the
embeddings, before layer 0, has no add before it: F.rms_norm); Q, K and V are one GEMM (their
weights joined, joined.joined_linear), and so are gate and up; the attention rotates q and k by
their positions inside the kernel (rope_parameters' rope_theta), packed (a batch with padding: real
tokens only, positions counted within each sequence, which gives transformers' scores: rotary scores
depend on distances) or padded; SiLU(gate) * up of the joined product (a GELU gate: the fused GeGLU).
Grouped-query attention (num_key_value_heads < num_attention_heads): each group's keys and values
repeated to its heads before the attention, as transformers does.

The modules and parameters have transformers' names (model.embed_tokens, model.layers.N.self_attn.
q_proj ..., model.norm, lm_head, dense / classifier), so checkpoints move both ways unchanged. int8
(quantize_("int8")): the seven projections of each layer Int8Linear, the joined products of int8
weights; norms, attention and the residual stream float. output_attentions runs the layers padded
and spells the attention out (transformers' eager attention). Not supported, each an error naming
it: head_mask (transformers' EuroBERT has none), position_ids that do not count 0, 1, 2, ... along
each row (up to a constant), a 3-D / 4-D attention mask that is not a padding mask.
"""
from __future__ import annotations

import functools
import sys
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fastbert import ops, reference
from fastbert.model.config import EuroBertConfig
from fastbert.model.heads import (
    cross_entropy_loss,
    real_token_head,
    real_token_mean,
    sequence_classification_loss,
    task_output,
)
from fastbert.model.joined import joined_linear
from fastbert.model.layers import BackendMixin, embed_words, gate_form, gated_activation
from fastbert.model.outputs import MaskedLMOutput, SequenceClassifierOutput, TokenClassifierOutput
from fastbert.model.prenorm import PreNormForward
from fastbert.model.pretrained import BertPreTrainedModel
from fastbert.model.quantize import TRAINING_ERROR, InferenceOnly, Int8Linear
from fastbert.ops import encoder
from fastbert.ops.attention import joined_attention


def linear(module: nn.Module, x: torch.Tensor, backend) -> torch.Tensor:
    """A projection of x: ops.linear for a float layer, the module itself once quantized (Int8Linear)."""
    if isinstance(module, Int8Linear):
        return module(x)
    return ops.linear(x, module.weight, module.bias, backend=backend)


def joinable(modules) -> bool:
    """Whether the linear layers' weights can be one GEMM's: float, or int8 all in one layout."""
    return not isinstance(modules[0], Int8Linear) or len({m.weight.dim() for m in modules}) == 1


def joined_product(owner: nn.Module, name: str, modules, x: torch.Tensor, backend) -> torch.Tensor:
    """The products of x by linear layers that read it together (Q, K, V; gate and up) as one GEMM,
    their outputs side by side (joined.joined_linear's tensors, float or int8). int8 weights of
    different layouts (a key projection too narrow for the packed one, beside a packed query's)
    cannot be joined: each layer then multiplies on its own."""
    if not joinable(modules):
        return torch.cat([m(x) for m in modules], dim=-1)
    tensors = joined_linear(owner, name, modules)
    if len(tensors) == 2:
        return ops.linear(x, *tensors, backend=backend)
    rows = x.reshape(-1, x.shape[-1])
    return encoder.int8_linear(ops.quantize_rows(rows), *tensors, x.dtype).view(*x.shape[:-1], -1)


class EuroBertRMSNorm(nn.Module):
    """weight, variance_epsilon (transformers' names): rms_norm(x) * weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], self.weight.to(x.dtype), self.variance_epsilon)

    def add(self, x: torch.Tensor, residual: torch.Tensor, backend) -> Tuple[torch.Tensor, torch.Tensor]:
        """(norm(s), s), s = x + residual: a pre-norm layer's norm and its residual stream, one fused pass."""
        return ops.add_rms_norm(x, residual, self.weight, self.variance_epsilon, return_sum=True, backend=backend)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class EuroBertAttention(nn.Module, BackendMixin):
    """q_proj, k_proj, v_proj (num_key_value_heads heads each of the last two), o_proj; the attention
    with the rotary embedding."""

    def __init__(self, config: EuroBertConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_key_value_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = d = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * d, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, config.hidden_size, bias=bias)
        self.attention_dropout = config.attention_dropout
        self.rope_theta = config.rope_theta

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], packed: Optional[Tuple[torch.Tensor, int]],
                want_probs: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: [tokens, hidden] packed (packed = (cu_seqlens, max_seqlen)) or [batch, seq, hidden]
        padded (mask [batch, seq] or None) -> (the same shape, probabilities [batch, heads, seq, seq]
        when want_probs (padded), else None)."""
        qkv = joined_product(self, "qkv", (self.q_proj, self.k_proj, self.v_proj), x, self.backend)
        ctx, probs = self.attend(qkv, (*x.shape[:-1], self.num_heads * self.head_dim), mask, packed, want_probs)
        return linear(self.o_proj, ctx, self.backend), probs

    def attend(self, qkv: torch.Tensor, shape, mask, packed, want_probs: bool):
        heads, kv, d = self.num_heads, self.num_key_value_heads, self.head_dim
        opts = dict(dropout_p=self.attention_dropout if self.training else 0.0, rotary_base=self.rope_theta,
                    backend=self.backend)
        if kv == heads and not want_probs:
            ctx = joined_attention(qkv, shape, heads, mask, packed, seed=None, **opts)
            if ctx is not None:
                return ctx, None
        q, k, v = qkv.split((heads * d, kv * d, kv * d), dim=-1)
        q, k, v = (t.unflatten(-1, (-1, d)) for t in (q, k, v))  # [..., heads (kv), d]
        if kv != heads:  # each group's keys and values for each of its heads (transformers' repeat_kv)
            k, v = (t.repeat_interleave(heads // kv, dim=-2) for t in (k, v))
        if packed is not None:
            # cu_seqlens: the model's own (ops.unpad's), not read again on the host
            return ops.varlen_attention(q, k, v, packed[0], packed[1], validate=False, **opts).reshape(shape), None
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, heads, seq, d]
        if want_probs:
            ctx, probs = self._spelled_out(q, k, v, mask, opts["dropout_p"])
        else:
            ctx, probs = ops.attention(q, k, v, mask, **opts), None
        return ctx.transpose(1, 2).reshape(shape), probs

    def _spelled_out(self, q, k, v, mask: Optional[torch.Tensor], dropout_p: float):
        """(context, probabilities) as transformers' eager attention forms them: q and k rotated,
        padded keys masked with float32's minimum."""
        cos, sin = reference.rotary_tables(self.rope_theta, self.head_dim, q.shape[2], q.device)
        q, k = reference.rotate(q, cos, sin), reference.rotate(k, cos, sin)
        bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape, device=q.device).masked_fill(~mask.to(torch.bool),
                                                                       torch.finfo(torch.float32).min)[:, None, None, :]
        return ops.attention_weights(q, k, v, bias, dropout_p=dropout_p)


class EuroBertMLP(nn.Module, BackendMixin):
    """gate_proj and up_proj (one GEMM), act(gate) * up, down_proj."""

    def __init__(self, config: EuroBertConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act = config.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modules, down, form = (self.gate_proj, self.up_proj), self.down_proj, gate_form(self.act)
        if isinstance(down, Int8Linear) and form is not None and joinable(modules):
            # int8: gate and up products, act(gate) * up and its quantization in one pass (int8_glu_rows)
            gq = encoder.int8_glu_rows(ops.quantize_rows(x.reshape(-1, x.shape[-1])),
                                       *joined_linear(self, "gate_up", modules), form)
            y = encoder.int8_linear(gq, down.weight, down.weight_scale, down.bias, x.dtype)
            return y.view(*x.shape[:-1], -1)
        h = joined_product(self, "gate_up", modules, x, self.backend)
        return linear(down, gated_activation(h, self.act, self.backend), self.backend)


class EuroBertDecoderLayer(nn.Module, BackendMixin):
    """input_layernorm, self_attn, post_attention_layernorm, mlp (transformers' names: the decoder
    layer of a Llama, its attention not causal)."""

    def __init__(self, config: EuroBertConfig, layer_idx: int):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = EuroBertAttention(config, layer_idx)
        self.mlp = EuroBertMLP(config)
        self.input_layernorm = EuroBertRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = EuroBertRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def linear_slots(self):
        """(owner module, attribute name) of the seven linear layers (int8 swaps them)."""
        attn, mlp = self.self_attn, self.mlp
        return [(attn, "q_proj"), (attn, "k_proj"), (attn, "v_proj"), (attn, "o_proj"), (mlp, "gate_proj"),
                (mlp, "up_proj"), (mlp, "down_proj")]

    def forward(self, h: torch.Tensor, delta: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                packed: Optional[Tuple[torch.Tensor, int]], want_probs: bool = False):
        """The residual stream enters as h + delta (delta: the previous layer's MLP output, None
        before the first layer) and leaves as (h', delta', probabilities or None), so that each norm
        reads the sum in its fused add (rows as in EuroBertAttention.forward)."""
        if delta is None:  # the first layer: the stream is the embeddings
            stream, normed = h, self.input_layernorm(h)
        else:
            normed, stream = self.input_layernorm.add(delta, h, self.backend)
        out, probs = self.self_attn(normed, mask, packed, want_probs)
        normed, stream = self.post_attention_layernorm.add(out, stream, self.backend)
        return stream, self.mlp(normed), probs


class EuroBertPreTrainedModel(BertPreTrainedModel):
    """Weights init as transformers' (normal, initializer_range; the norms ones), from_pretrained /
    save_pretrained in transformers' format, the backend setting."""

    config_class = EuroBertConfig
    base_model_prefix = "model"
    word_embeddings_name = "embed_tokens"

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, EuroBertRMSNorm):
            nn.init.ones_(module.weight)


class EuroBertModel(PreNormForward, EuroBertPreTrainedModel):
    """embed_tokens -> layers -> norm; forward as transformers' EuroBertModel (PreNormForward's:
    unpad_inputs False keeps every batch padded)."""

    family = "EuroBERT"

    def __init__(self, config: EuroBertConfig, add_pooling_layer: bool = False):
        super().__init__(config)  # (add_pooling_layer: EuroBERT has no pooler)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList([EuroBertDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = EuroBertRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pooler = None  # (none: what code that reads a base model's pooler finds)
        self.post_init()

    max_tokens = sys.maxsize  # rotary positions: no table to outgrow (8192 is what EuroBERT was trained to)

    @property
    def backend(self) -> Optional[str]:
        return self.layers[0].backend if len(self.layers) else None

    @property
    def embeddings(self) -> "EuroBertModel":
        """What holds the word embeddings (embed_tokens), as a BERT's `embeddings` does: the model
        itself (transformers' EuroBertModel has them at its top), with its backend and max_tokens."""
        return self

    def embed(self, input_ids: Optional[torch.Tensor], inputs_embeds: Optional[torch.Tensor]) -> torch.Tensor:
        return embed_words(self.embed_tokens, input_ids) if inputs_embeds is None else inputs_embeds

    def packed_encode(self, ids, types, positions, cu_seqlens, max_seqlen: int):
        """The embeddings, every layer and the norm on packed tokens -> rows [tokens, hidden] (what a
        CUDA graph captures; the rotary positions come from cu_seqlens: types and positions unread)."""
        h = embed_words(self.embed_tokens, ids)
        return self._layers(h, mask=None, packed=(cu_seqlens, max_seqlen), want_states=False, want_probs=False)[0]

    def _encode(self, h: torch.Tensor, mask, packed, to_output, want_states: bool, want_probs: bool):
        """(last_hidden_state, hidden states or None, probabilities or None), each through to_output;
        h: the embeddings, rows as in EuroBertAttention.forward."""
        if self.quantized is not None and self.training:
            raise RuntimeError(TRAINING_ERROR)
        run = functools.partial(self._layers, mask=mask, packed=packed, want_states=want_states,
                                want_probs=want_probs)
        if self.quantized is not None and torch.is_grad_enabled() and h.requires_grad:
            out = InferenceOnly.apply(h, run)  # no gradient through int8 layers: its backward names the fix
        else:
            out = run(h)
        n_out = len(self.layers) + 1 if want_states else 1
        outs = [to_output(o) for o in out[:n_out]]
        probs = tuple(out[n_out:]) if want_probs else None
        return outs[-1], (tuple(outs) if want_states else None), probs

    def _layers(self, h: torch.Tensor, *, mask, packed, want_states: bool, want_probs: bool):
        """The loop over the layers -> (the output after the norm, or with want_states: h, then every
        layer's output, the last after the norm; then each layer's probabilities when want_probs)."""
        states, probs = [h], []
        delta = None
        for layer in self.layers:
            h, delta, p = self._run_layer(layer, h, delta, mask, packed, want_probs)
            if want_states:
                states.append(h + delta)
            probs.append(p)
        out = self.norm(h) if delta is None else self.norm.add(delta, h, self.backend)[0]
        if want_states:
            states[-1] = out  # transformers gives the last layer's output after the norm
        return (*(states if want_states else [out]), *(probs if want_probs else ()))


class _EuroBertHead(EuroBertPreTrainedModel):
    """A task model: EuroBertModel under "model"."""

    def __init__(self, config: EuroBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = EuroBertModel(config)

    def _encode(self, input_ids, attention_mask, position_ids, inputs_embeds, output_attentions, output_hidden_states,
                head_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                          output_hidden_states=output_hidden_states, return_dict=True, head_mask=head_mask)


class EuroBertForMaskedLM(_EuroBertHead):
    """lm_head (hidden -> vocabulary; tied to embed_tokens when tie_word_embeddings) at every real token."""

    output_embeddings = "lm_head"

    def __init__(self, config: EuroBertConfig):
        super().__init__(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.mlp_bias)
        self._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {}
        self.post_init()
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.get_input_embeddings().weight

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """-> .loss (mean cross-entropy over the labelled tokens), .logits [batch, seq, vocab_size]."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        logits = real_token_head(self.lm_head, out.last_hidden_state, attention_mask)
        return task_output(MaskedLMOutput, self._return_dict(return_dict), out, loss=cross_entropy_loss(logits, labels),
                           logits=logits)


class EuroBertForSequenceClassification(_EuroBertHead):
    """dense, GELU, classifier, pooled as config.classifier_pooling says: "bos" (the first token) or
    "mean" (over the real tokens) before dense; "late" (transformers' default) after the classifier,
    the mean of every real token's logits."""

    def __init__(self, config: EuroBertConfig):
        super().__init__(config)
        self.classifier_pooling = config.classifier_pooling
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.GELU()
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.activation(self.dense(hidden)))

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """-> .loss (per config.problem_type, as transformers chooses it), .logits [batch, num_labels]."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        hidden = out.last_hidden_state
        if self.classifier_pooling == "bos":
            logits = self._head(hidden[:, 0])
        elif self.classifier_pooling == "mean":
            logits = self._head(real_token_mean(hidden, attention_mask, "mean"))
        else:
            logits = real_token_mean(self._head(hidden), attention_mask, "late")
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return task_output(SequenceClassifierOutput, self._return_dict(return_dict), out, loss=loss, logits=logits)


class EuroBertForTokenClassification(_EuroBertHead):
    """classifier at every token."""

    def __init__(self, config: EuroBertConfig):
        super().__init__(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, *, head_mask=None):
        """-> .loss (mean cross-entropy over the labelled tokens), .logits [batch, seq, num_labels]."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, output_attentions,
                           output_hidden_states, head_mask)
        logits = real_token_head(self.classifier, out.last_hidden_state, attention_mask)
        return task_output(TokenClassifierOutput, self._return_dict(return_dict), out,
                           loss=cross_entropy_loss(logits, labels), logits=logits)


# transformers has no EuroBERT question-answering head, nor has fastbert
EUROBERT_CLASSES = (EuroBertModel, EuroBertForMaskedLM, EuroBertForSequenceClassification,
                    EuroBertForTokenClassification)
