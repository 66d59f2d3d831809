"""The pretraining objective: BertForPreTraining's MLM + NSP loss, or a ForMaskedLM model's MLM loss
(XLM-R), with the MLM head on the masked tokens only; the statistics the logs and evaluations read,
and autocast's dtype at the embeddings."""
from __future__ import annotations

import math
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from fastbert.model import BertForPreTraining
from fastbert.model.heads import labelled_rows

# stats: MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct, NSP count, real tokens, sequences
NSTATS = 8


class PretrainingObjective(nn.Module):
    """The pretraining loss, with the MLM head on the masked tokens only: BertForPreTraining's MLM +
    NSP, or the MLM alone of a ForMaskedLM model (no NSP: its statistics stay 0).

    forward(input_ids, attention_mask, token_type_ids, labels, next_sentence_label)
        -> (loss, stats float64 [8]: MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct,
            NSP count, real tokens, sequences)"""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.next_sentence = isinstance(model, BertForPreTraining)

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label):
        out = self.model.base_model(input_ids, attention_mask, token_type_ids)
        picked, targets = labelled_rows(out.last_hidden_state, labels)
        mlm_logits = self.model._lm_logits(picked).float()
        count = torch.tensor(float(targets.numel()), dtype=torch.float64, device=mlm_logits.device)
        if targets.numel():
            mlm_sum = F.cross_entropy(mlm_logits, targets, reduction="sum")
            mlm_loss = mlm_sum / targets.numel()
        else:
            mlm_sum = mlm_loss = mlm_logits.sum() * 0.0
        nsp = [count * 0] * 3
        loss = mlm_loss
        if self.next_sentence:
            nsp_logits = self.model.cls.seq_relationship(out.pooler_output).float()
            nsp_sum = F.cross_entropy(nsp_logits, next_sentence_label, reduction="sum")
            loss = mlm_loss + nsp_sum / next_sentence_label.numel()
            nsp = [nsp_sum.detach().double(), (nsp_logits.argmax(-1) == next_sentence_label).sum().double(),
                   count * 0 + next_sentence_label.numel()]
        with torch.no_grad():
            stats = torch.stack([mlm_sum.detach().double(), (mlm_logits.argmax(-1) == targets).sum().double(), count,
                                 *nsp, attention_mask.sum().double(), count * 0 + input_ids.shape[0]])
        return loss, stats


def cast_embeddings_under_autocast(model, device_type: str) -> None:
    """Keep the residual stream in the autocast dtype. Under autocast the embeddings' output
    (LayerNorm, float32) is the residual of the first layer's add_layer_norm, whose other input
    comes out of an autocast GEMM in bf16 / fp16; the op promotes the pair to float32, as the
    unfused model does, and every layer then carries float32 hidden states. Casting the
    embeddings' output to the autocast dtype (as the GEMMs that read it would) keeps them in
    bf16 / fp16: half the memory traffic between the layers, for pretraining's speed."""
    def hook(module, args, output):
        if torch.is_autocast_enabled(device_type):
            return output.to(torch.get_autocast_dtype(device_type))
        return output

    model.base_model.embeddings.register_forward_hook(hook)


def summarize(stats: torch.Tensor) -> Dict[str, float]:
    """The figures of summed statistics; the NSP ones only where there were NSP labels."""
    s = stats.tolist()
    mlm_n = max(s[2], 1.0)
    mlm_loss = s[0] / mlm_n
    out = {
        "loss": mlm_loss,
        "mlm_loss": mlm_loss,
        "mlm_acc": s[1] / mlm_n,
        "mlm_perplexity": math.exp(min(mlm_loss, 50.0)),
        "masked_tokens": int(s[2]),
        "pairs": int(s[7]),
    }
    if s[5]:
        out.update(nsp_loss=s[3] / s[5], nsp_acc=s[4] / s[5])
        out["loss"] += out["nsp_loss"]
    return out
