"""The pretraining collator: tokenized sentence pairs -> a masked, padded (or packed) batch.

    collator = PretrainingCollator.from_vocab("vocab.txt", whole_word_mask=True, seed=0)
    batch = collator(features)

Input: a list of features, one per sentence pair, each a dict with
    "input_ids":           list of ints or 1-D integer tensor: [CLS] A [SEP] B [SEP], special
                           tokens included, no padding
    "token_type_ids":      optional, the same length (0 for [CLS] A [SEP], 1 for B [SEP]); zeros
                           when absent
    "next_sentence_label": optional int, 0 when B follows A and 1 when B is a random sentence
                           (BertForPreTraining's convention); in every feature or in none
Other keys (special_tokens_mask, attention_mask, offset_mapping, ...) are ignored: special tokens
are recognised by their ids.

Output, padded (default): a dict of tensors
    input_ids            int64 [batch, seq]  the masked ids; pad_token_id at padding
    token_type_ids       int64 [batch, seq]  0 at padding
    attention_mask       int64 [batch, seq]  1 = real token, 0 = padding
    labels               int64 [batch, seq]  the original id at the tokens to predict, -100 elsewhere
    next_sentence_label  int64 [batch]       when the features carry it
  seq = the longest feature rounded up to a multiple of pad_to_multiple_of (8).
Output, unpadded (unpadded=True): the real tokens only, packed sequence after sequence in the
layout of fastbert.ops.unpad (the same masking as the padded output for the same seed):
    input_ids, token_type_ids, labels, position_ids   int64 [total_tokens]
    indices              int64 [total_tokens]  flat position b * seq + s of each token in the
                                               padded layout above
    cu_seqlens           int32 [batch + 1]     sequence b is tokens cu_seqlens[b]:cu_seqlens[b + 1]
    max_seqlen           int                   the longest sequence
    next_sentence_label  int64 [batch]         when the features carry it

Masking runs in the C++ extension (fastbert.masking.mask_tokens): BERT's count rule by default
(round(0.15 * candidates) per sequence, at least 1, at most max_predictions), 80% [MASK], 10% a
random ordinary token, 10% unchanged; whole-word masking from WordPiece "##" continuations.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence

import torch

from fastbert import masking
from fastbert.data.vocab import SPECIAL_TOKENS as BERT_SPECIAL_TOKENS
from fastbert.ops.padding import pad_id_lists, unpad_indices


class PretrainingCollator:
    """Callable: list of features -> batch dict (see the module docstring).

    vocab_size, mask_token_id, pad_token_id: the vocabulary's size and the [MASK] / [PAD] ids.
    special_token_ids: ids never selected for prediction and never drawn as random replacements
        ([CLS], [SEP], [UNK], ...; pad_token_id and mask_token_id are added to them).
    mlm_probability, mask_replace_prob, random_replace_prob, max_predictions, selection: as in
        fastbert.masking.mask_tokens ("count" is BERT's rule, "bernoulli" transformers').
    whole_word_mask: select whole words; needs word_start_table (fastbert.masking.word_start_table
        of the vocabulary; from_vocab builds it).
    pad_to_multiple_of: the padded length is a multiple of it (8 suits tensor cores; 1 = none).
    unpadded: return the packed layout instead of the padded one.
    seed / generator: where each batch's masking seed comes from: a generator of the collator's own
        seeded with `seed`, the given generator, or torch's default generator (when both are None).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        mask_token_id: int,
        pad_token_id: int = 0,
        special_token_ids: Iterable[int] = (),
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        max_predictions: Optional[int] = None,
        whole_word_mask: bool = False,
        word_start_table: Optional[torch.Tensor] = None,
        pad_to_multiple_of: int = 8,
        unpadded: bool = False,
        selection: str = "count",
        seed: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ):
        if seed is not None and generator is not None:
            raise ValueError("PretrainingCollator: pass seed or generator, not both")
        if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
            raise ValueError(f"PretrainingCollator: pad_to_multiple_of must be an int >= 1, got {pad_to_multiple_of!r}")
        self.vocab_size = int(vocab_size)
        self.mask_token_id = int(mask_token_id)
        self.pad_token_id = int(pad_token_id)
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"PretrainingCollator: pad_token_id {pad_token_id} is outside [0, vocab_size = {vocab_size})"
            )
        ids = sorted({int(i) for i in special_token_ids} | {self.pad_token_id, self.mask_token_id})
        self.special_token_ids = torch.tensor(ids, dtype=torch.int64)
        self.mlm_probability = mlm_probability
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.max_predictions = max_predictions
        self.selection = selection
        self.whole_word_mask = bool(whole_word_mask)
        if self.whole_word_mask:
            if word_start_table is None:
                raise ValueError(
                    "PretrainingCollator: whole_word_mask=True needs word_start_table "
                    "(fastbert.masking.word_start_table(vocab)), or build the collator with from_vocab"
                )
            word_start_table = masking.word_start_table(word_start_table)
            if word_start_table.numel() != self.vocab_size:
                raise ValueError(
                    f"PretrainingCollator: word_start_table has {word_start_table.numel()} entries but "
                    f"vocab_size is {self.vocab_size}"
                )
        self.word_start_table = word_start_table
        self.pad_to_multiple_of = pad_to_multiple_of
        self.unpadded = bool(unpadded)
        self.generator = torch.Generator().manual_seed(int(seed)) if seed is not None else generator
        # every argument checked once now, rather than on the first batch
        masking.mask_tokens(
            torch.zeros(1, 1, dtype=torch.int64) + self.pad_token_id, **self._mask_kwargs(), seed=0,
        )

    @classmethod
    def from_vocab(cls, vocab, **kwargs) -> "PretrainingCollator":
        """A collator for a BERT WordPiece vocabulary (a vocab.txt path, a list of tokens in id order
        or a {token: id} dict) holding [PAD], [UNK], [CLS], [SEP] and [MASK]; kwargs as __init__."""
        tokens = masking.vocab_tokens(vocab)
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in BERT_SPECIAL_TOKENS if t not in index]
        if missing:
            raise ValueError(f"PretrainingCollator.from_vocab: the vocabulary lacks {missing}")
        kwargs.setdefault("special_token_ids", [index[t] for t in BERT_SPECIAL_TOKENS])
        if kwargs.get("whole_word_mask") and kwargs.get("word_start_table") is None:
            kwargs["word_start_table"] = masking.word_start_table(tokens)
        return cls(vocab_size=len(tokens), mask_token_id=index["[MASK]"], pad_token_id=index["[PAD]"], **kwargs)

    def _mask_kwargs(self) -> dict:
        return dict(
            mask_token_id=self.mask_token_id, vocab_size=self.vocab_size, special_token_ids=self.special_token_ids,
            mlm_probability=self.mlm_probability, mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob, max_predictions=self.max_predictions,
            selection=self.selection,
        )

    def __call__(self, features: Sequence[Mapping]) -> dict:
        n = len(features)
        if n == 0:
            raise ValueError("PretrainingCollator: got an empty list of features")
        try:
            ids_list = [f["input_ids"] for f in features]
        except (KeyError, TypeError):
            raise ValueError("PretrainingCollator: every feature must be a dict with 'input_ids'") from None
        lengths = [len(x) for x in ids_list]
        longest = max(lengths)
        m = self.pad_to_multiple_of
        seq = (longest + m - 1) // m * m
        real = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]  # bool [batch, seq]

        input_ids = pad_id_lists(ids_list, lengths, seq, real, self.pad_token_id, "PretrainingCollator: input_ids")
        if "token_type_ids" in features[0]:
            types = [f.get("token_type_ids") for f in features]
            if any(t is None or len(t) != length for t, length in zip(types, lengths)):
                raise ValueError(
                    "PretrainingCollator: token_type_ids must be in every feature, as long as its input_ids"
                )
            token_type_ids = pad_id_lists(types, lengths, seq, real, 0, "PretrainingCollator: token_type_ids")
        else:
            token_type_ids = torch.zeros(n, seq, dtype=torch.int64)

        word_start = masking.word_starts(input_ids, self.word_start_table) if self.whole_word_mask else None
        masked, labels = masking.mask_tokens(
            input_ids, attention_mask=real, word_start_mask=word_start, generator=self.generator, **self._mask_kwargs(),
        )
        batch = {}
        nsp = [f.get("next_sentence_label") for f in features]
        has_nsp = [x is not None for x in nsp]
        if any(has_nsp):
            if not all(has_nsp):
                raise ValueError("PretrainingCollator: next_sentence_label must be in every feature or in none")
            batch_nsp = torch.tensor([int(x) for x in nsp], dtype=torch.int64)
        if self.unpadded:
            indices, cu_seqlens, max_seqlen = unpad_indices(real)
            batch.update(
                input_ids=masked.view(-1)[indices],
                token_type_ids=token_type_ids.view(-1)[indices],
                labels=labels.view(-1)[indices],
                position_ids=indices % seq,
                indices=indices,
                cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen,
            )
        else:
            batch.update(
                input_ids=masked, token_type_ids=token_type_ids, attention_mask=real.to(torch.int64), labels=labels,
            )
        if any(has_nsp):
            batch["next_sentence_label"] = batch_nsp
        return batch
