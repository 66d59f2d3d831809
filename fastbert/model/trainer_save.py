"""transformers.Trainer saves fastbert models as save_pretrained does.

Trainer writes a bare state dict for models that are not transformers' own; a fastbert model asks
for config.json and the weights under transformers' names, which transformers loads. Each fastbert
model calls `patch_trainer_if_loaded` when it is built and when `train()` is called (Trainer calls it
before it trains and saves), so the patch lands once transformers' trainer module is loaded; it costs
a dictionary lookup otherwise, and patching twice changes nothing.
"""
from __future__ import annotations

import os
import sys

import torch


def patch_trainer_if_loaded(base: type) -> None:
    """Make transformers.Trainer save models of class `base` (fastbert's BertPreTrainedModel) with
    their save_pretrained, when transformers' trainer module is loaded."""
    trainer_module = sys.modules.get("transformers.trainer")
    if trainer_module is None or getattr(trainer_module.Trainer._save, "_fastbert", False):
        return
    original = trainer_module.Trainer._save

    def _save(self, output_dir=None, state_dict=None):
        model = self.model
        while hasattr(model, "module") and not isinstance(model, base):
            model = model.module  # DistributedDataParallel and other wrappers
        if not isinstance(model, base):
            return original(self, output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return None
        os.makedirs(output_dir, exist_ok=True)
        model.save_pretrained(output_dir, state_dict=state_dict,
                              safe_serialization=getattr(self.args, "save_safetensors", True))
        processing = self.processing_class or getattr(self.data_collator, "tokenizer", None)
        if processing is not None:
            processing.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
        return None

    _save._fastbert = True
    trainer_module.Trainer._save = _save
