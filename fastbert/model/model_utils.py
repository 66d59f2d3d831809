"""The methods of transformers' PreTrainedModel that Trainer and user scripts call, for fastbert's
models: parameter counts, the embeddings (get / set / resize, tied), gradient checkpointing (the
encoder layers' activations recomputed in the backward), FLOP counts for Trainer's logs."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def trunc_normal_(t: torch.Tensor, std: float, cutoff: float) -> torch.Tensor:
    """t filled in place from a normal of mean 0 and deviation std truncated to [-cutoff * std,
    cutoff * std] (what nn.init.trunc_normal_ draws), by drawing normals and drawing again only the
    few that fall outside: for a 256k x 768 embedding a fifth of nn.init.trunc_normal_'s time."""
    if t.is_meta:  # no values to draw
        return t
    with torch.no_grad():
        t.normal_(0.0, std)
        flat, bound = t.view(-1), cutoff * std
        idx = (flat.abs() > bound).nonzero().squeeze(1)
        while idx.numel():
            fresh = torch.empty(idx.numel(), dtype=t.dtype, device=t.device).normal_(0.0, std)
            flat[idx] = fresh
            idx = idx[fresh.abs() > bound]
    return t


class ModelUtilsMixin:
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _keys_to_ignore_on_save = None
    _keys_to_ignore_on_load_missing = None
    _keys_to_ignore_on_load_unexpected = None

    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters counted once each (tied ones once), as transformers counts them."""
        skip = set()
        if exclude_embeddings:
            skip = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        seen = {}
        for p in self.parameters():
            if id(p) not in skip and (p.requires_grad or not only_trainable):
                seen[id(p)] = p.numel()
        return sum(seen.values())

    def floating_point_ops(self, input_dict, exclude_embeddings: bool = True) -> int:
        """6 x tokens x parameters (forward and backward of every weight), transformers' estimate."""
        ids = input_dict.get(self.main_input_name, input_dict.get("inputs_embeds"))
        tokens = 0 if ids is None else int(ids.shape[0] * ids.shape[1])
        return 6 * tokens * self.num_parameters(exclude_embeddings=exclude_embeddings)

    # the word embeddings' name in the base model's `embeddings` (ModernBERT's: tok_embeddings)
    word_embeddings_name = "word_embeddings"

    def get_input_embeddings(self) -> nn.Embedding:
        return getattr(self.base_model.embeddings, self.word_embeddings_name)

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        setattr(self.base_model.embeddings, self.word_embeddings_name, value)
        self.tie_weights()

    # the dotted name of an MLM head's decoder (the family's), None for a model without one
    output_embeddings: Optional[str] = None

    def get_output_embeddings(self) -> Optional[nn.Linear]:
        return None if self.output_embeddings is None else self.get_submodule(self.output_embeddings)

    def set_output_embeddings(self, value: nn.Linear) -> None:
        owner_name, _, attr = self.output_embeddings.rpartition(".")
        owner = self.get_submodule(owner_name) if owner_name else self
        setattr(owner, attr, value)
        if isinstance(getattr(owner, "bias", None), nn.Parameter):  # a head whose bias is the decoder's, by name too
            owner.bias = value.bias

    def tie_weights(self) -> None:
        """Models with an MLM head share its decoder with the word embeddings; the rest have nothing to tie."""

    def can_generate(self) -> bool:
        return False

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """A vocabulary of new_num_tokens (rounded up to pad_to_multiple_of): the word embeddings and
        an MLM head's decoder and bias keep their first rows; new rows are the mean of the old ones
        (mean_resizing) or drawn as at initialisation. Updates config.vocab_size."""
        old = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return old
        n = old.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of is not None:
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        if n < 1:
            raise ValueError(f"fastbert: resize_token_embeddings needs at least one token, got {n}")
        keep = min(n, old.num_embeddings)
        new = nn.Embedding(n, old.embedding_dim, padding_idx=old.padding_idx if (old.padding_idx or 0) < n else None,
                           device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            if mean_resizing:
                new.weight[:] = old.weight.mean(0)
            else:
                new.weight.normal_(0.0, self.config.initializer_range)
            new.weight[:keep] = old.weight[:keep]
        setattr(self.base_model.embeddings, self.word_embeddings_name, new)
        decoder = self.get_output_embeddings()
        if decoder is not None:
            has_bias = decoder.bias is not None  # (ModernBERT's decoder_bias=False: none)
            new_decoder = nn.Linear(old.embedding_dim, n, bias=has_bias, device=old.weight.device, dtype=old.weight.dtype)
            if has_bias:
                bias = torch.zeros(n, device=decoder.bias.device, dtype=decoder.bias.dtype)
                bias[:keep] = decoder.bias.detach()[:keep]
                new_decoder.bias = nn.Parameter(bias)
            self.set_output_embeddings(new_decoder)
        self.config.vocab_size = n
        self.tie_weights()
        return new

    # ---- gradient checkpointing

    @property
    def is_gradient_checkpointing(self) -> bool:
        return bool(getattr(self.base_model, "gradient_checkpointing", False))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Optional[dict] = None) -> None:
        """Keep only each encoder layer's input in training; recompute the layer in the backward
        (dropout masks come out the same: the RNG state is restored). kwargs go to
        torch.utils.checkpoint.checkpoint (use_reentrant=False unless given)."""
        kwargs = {"use_reentrant": False, **(gradient_checkpointing_kwargs or {})}
        self.base_model.gradient_checkpointing = True
        self.base_model.checkpoint_kwargs = kwargs
        if kwargs["use_reentrant"]:
            self.enable_input_require_grads()

    def gradient_checkpointing_disable(self) -> None:
        self.base_model.gradient_checkpointing = False

    def enable_input_require_grads(self) -> None:
        """Make the embeddings' output require grad (reentrant checkpointing of frozen embeddings needs it)."""
        def hook(module, args, output):
            output.requires_grad_(True)

        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(hook)
