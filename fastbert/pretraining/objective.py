"""The pretraining objective: BertForPreTraining's MLM + NSP loss with the MLM head on the masked
tokens only, the statistics the logs and evaluations read, and autocast's dtype at the embeddings."""
from __future__ import annotations

import math
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from fastbert.model import BertForPreTraining
from fastbert.model.heads import labelled_rows

# stats: MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct, NSP count, real tokens
NSTATS = 7


class PretrainingObjective(nn.Module):
    """BertForPreTraining's loss, with the MLM head on the masked tokens only.

    forward(input_ids, attention_mask, token_type_ids, labels, next_sentence_label)
        -> (loss, stats float64 [7]: MLM loss sum, MLM correct, MLM count, NSP loss sum, NSP correct,
            NSP count, real tokens)"""

    def __init__(self, model: BertForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label):
        out = self.model.bert(input_ids, attention_mask, token_type_ids)
        picked, targets = labelled_rows(out.last_hidden_state, labels)
        mlm_logits = self.model.cls.predictions(picked).float()
        nsp_logits = self.model.cls.seq_relationship(out.pooler_output).float()
        if targets.numel():
            mlm_sum = F.cross_entropy(mlm_logits, targets, reduction="sum")
            mlm_loss = mlm_sum / targets.numel()
        else:
            mlm_sum = mlm_loss = mlm_logits.sum() * 0.0
        nsp_sum = F.cross_entropy(nsp_logits, next_sentence_label, reduction="sum")
        nsp_loss = nsp_sum / next_sentence_label.numel()
        loss = mlm_loss + nsp_loss
        with torch.no_grad():
            stats = torch.stack([
                mlm_sum.detach().double(),
                (mlm_logits.argmax(-1) == targets).sum().double(),
                torch.tensor(float(targets.numel()), dtype=torch.float64, device=loss.device),
                nsp_sum.detach().double(),
                (nsp_logits.argmax(-1) == next_sentence_label).sum().double(),
                torch.tensor(float(next_sentence_label.numel()), dtype=torch.float64, device=loss.device),
                attention_mask.sum().double(),
            ])
        return loss, stats


def cast_embeddings_under_autocast(model: BertForPreTraining, device_type: str) -> None:
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

    model.bert.embeddings.register_forward_hook(hook)


def summarize(stats: torch.Tensor) -> Dict[str, float]:
    s = stats.tolist()
    mlm_n, nsp_n = max(s[2], 1.0), max(s[5], 1.0)
    mlm_loss, nsp_loss = s[0] / mlm_n, s[3] / nsp_n
    return {
        "loss": mlm_loss + nsp_loss,
        "mlm_loss": mlm_loss,
        "mlm_acc": s[1] / mlm_n,
        "mlm_perplexity": math.exp(min(mlm_loss, 50.0)),
        "nsp_loss": nsp_loss,
        "nsp_acc": s[4] / nsp_n,
        "masked_tokens": int(s[2]),
        "pairs": int(s[5]),
    }
