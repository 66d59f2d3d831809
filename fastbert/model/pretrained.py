"""BertPreTrainedModel: weight init, the backend setting, and from_pretrained / save_pretrained
in transformers' format."""
from __future__ import annotations

import os
import warnings
from typing import Dict, Optional

import torch
from torch import nn

from fastbert.model.checkpoint import SAFE_WEIGHTS_NAME, load_state_dict, normalise_keys
from fastbert.model.config import BertConfig
from fastbert.model.layers import BertLMPredictionHead, _Backend


class BertPreTrainedModel(nn.Module):
    """Weights init as transformers', from_pretrained / save_pretrained in transformers' format."""

    base_model_prefix = "bert"
    # keys that share a tensor with another key: not written by save_pretrained, tied on load
    _tied_weights_keys: Dict[str, str] = {}

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"fastbert: config must be a fastbert.BertConfig, got {type(config).__name__}")
        self.config = config
        self._backend: Optional[str] = None

    def post_init(self) -> None:
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    @property
    def backend(self) -> Optional[str]:
        return self._backend

    def set_backend(self, backend: Optional[str]) -> "BertPreTrainedModel":
        """Run every fused op of this model on `backend` ("triton", "cpp", "torch"; None: automatic)."""
        from fastbert.backend import BACKENDS

        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"fastbert: unknown backend {backend!r}; choose one of {BACKENDS} or None")
        self._backend = backend
        for m in self.modules():
            if isinstance(m, _Backend):
                m.backend = backend
        return self

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def get_input_embeddings(self) -> nn.Embedding:
        return self.base_model().embeddings.word_embeddings

    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)

    # ---- saving

    def save_pretrained(self, directory: str) -> None:
        """config.json + model.safetensors, as transformers writes them (tied copies left out)."""
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        config = self.config.to_dict()
        config["architectures"] = [type(self).__name__]
        config["dtype"] = str(self.dtype).replace("torch.", "")
        config.pop("torch_dtype", None)
        BertConfig(**config).save_pretrained(directory)
        # copies: safetensors refuses tensors that share memory (the QKV projections are slices of one)
        state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.state_dict().items()
                 if k not in self._tied_weights_keys}
        tmp = os.path.join(directory, SAFE_WEIGHTS_NAME + ".tmp")
        save_file(state, tmp, metadata={"format": "pt"})
        os.replace(tmp, os.path.join(directory, SAFE_WEIGHTS_NAME))  # never a half-written checkpoint

    # ---- loading

    @classmethod
    def from_pretrained(cls, path: str, backend: Optional[str] = None, dtype: Optional[torch.dtype] = None, **config_overrides):
        """Load a transformers-format directory: config.json + model.safetensors or pytorch_model.bin.

        Old checkpoints (LayerNorm gamma/beta, position_ids buffers, with or without the "bert."
        prefix) load too. Missing or unexpected keys are reported in a warning that names them.
        """
        if not os.path.isdir(path):
            raise FileNotFoundError(f"fastbert: {path} is not a directory (expected config.json and model weights)")
        config = BertConfig.from_pretrained(path)
        for k, v in config_overrides.items():
            setattr(config, k, v)
        state = load_state_dict(path)
        model = cls(config)
        model.load_transformers_state_dict(state, source=path)
        if dtype is not None:
            model = model.to(dtype)
        model.set_backend(backend)
        return model.eval()

    def load_transformers_state_dict(self, state: Dict[str, torch.Tensor], source: str = "state dict") -> None:
        """load_state_dict for checkpoints of any BERT class, old or new names; warns with the keys
        that were missing or left over."""

        state = normalise_keys(state)
        own = self.state_dict()
        prefix = self.base_model_prefix + "."
        has_prefix = any(k.startswith(prefix) for k in own)
        renamed = {}
        for k, v in state.items():
            if has_prefix and not k.startswith(prefix) and prefix + k in own:
                k = prefix + k  # a BertModel checkpoint into a model with heads
            elif not has_prefix and k.startswith(prefix):
                k = k[len(prefix):]  # a checkpoint with heads into a BertModel
            renamed[k] = v
        for dst, src in self._tied_weights_keys.items():
            if dst not in renamed and src in renamed:
                renamed[dst] = renamed[src]
        missing = sorted(k for k in own if k not in renamed)
        unexpected = sorted(k for k in renamed if k not in own)
        bad_shapes = [f"{k}: checkpoint {tuple(renamed[k].shape)} vs model {tuple(own[k].shape)}"
                      for k in own if k in renamed and renamed[k].shape != own[k].shape]
        if bad_shapes:
            raise ValueError(f"fastbert: {source} does not fit this config: " + "; ".join(bad_shapes))
        self.load_state_dict({k: v for k, v in renamed.items() if k in own}, strict=False)
        if missing or unexpected:
            msg = f"fastbert: loading {type(self).__name__} from {source}:"
            if missing:
                msg += f"\n  missing (left at their initial values): {missing}"
            if unexpected:
                msg += f"\n  unexpected (ignored): {unexpected}"
            warnings.warn(msg, stacklevel=3)
