"""Pretraining data: the collator that turns tokenized sentence pairs into masked batches
(fastbert.data.collator); masking itself is fastbert.masking (C++)."""
from fastbert.data.collator import BERT_SPECIAL_TOKENS, PretrainingCollator

__all__ = ["PretrainingCollator", "BERT_SPECIAL_TOKENS"]
