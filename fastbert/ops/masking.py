"""Token masking for masked-language-model (MLM) pretraining, in the C++ extension.

    mask_tokens(input_ids, *, mask_token_id, vocab_size, special_tokens_mask=None, attention_mask=None,
                mlm_probability=0.15, mask_replace_prob=0.8, random_replace_prob=0.1, max_predictions=None,
                word_start_mask=None, generator=None, seed=None, special_token_ids=None,
                selection="count", backend=None) -> (masked_input_ids, labels)
        input_ids:           integer [batch, seq], every id in [0, vocab_size)
        special_tokens_mask: [batch, seq] bool / integer (nonzero = special token, never selected)
        attention_mask:      [batch, seq] bool / integer (0 = padding, never selected)
        word_start_mask:     [batch, seq] bool / integer (nonzero = the token starts a word): switches
                             on whole-word masking (word_starts() derives it from WordPiece "##")
        masked_input_ids:    int64 [batch, seq]; labels: int64 [batch, seq], the original id where
                             selected and -100 elsewhere
    word_start_table(vocab) -> bool [vocab_size]      True where a token does not begin with "##"
    word_starts(input_ids, vocab) -> bool like input_ids

The rule (written out, and implemented in plain PyTorch, in the "token masking" section of
fastbert/reference/masking.py; the C++ result is bit-identical to it):
  * candidates are the tokens that are neither special nor padding (nor one of special_token_ids);
  * selection="count" (default, BERT's create_pretraining_data): each row predicts
    k = round(candidates * mlm_probability) tokens (half to even), at least 1 when the row has a
    candidate, at most max_predictions (Google uses 20 at seq 128 and 80 at 512), chosen without
    replacement; mlm_probability = 0 selects nothing. selection="bernoulli" (transformers'
    DataCollatorForLanguageModeling): every candidate independently with probability mlm_probability,
    then at most max_predictions of them;
  * whole-word masking selects words whole (a start token and the continuation tokens after it); a
    word that would push the count past k is skipped, as in BERT's whole-word masking. When every
    word of a row is longer than k, the row's first word (no longer than max_predictions) is taken,
    so no row with a candidate ends with nothing to predict;
  * of the selected tokens, mask_replace_prob become mask_token_id, random_replace_prob a random id
    drawn uniformly from the ordinary vocabulary, the rest stay unchanged (decided per token, also
    under whole-word masking). The ordinary vocabulary is [0, vocab_size) without mask_token_id and
    without special_token_ids when they are given; when they are not, without every id the batch
    holds at a special or padding position (for a BERT batch: [CLS], [SEP], [PAD]);
  * randomness: one 64-bit seed per call (`seed`, or drawn from `generator`, or from torch's default
    generator: torch.manual_seed makes runs repeatable) and Philox counters per (row, position), so
    the result depends on the seed and the batch only, never on the number of threads.
"""
from __future__ import annotations

import numbers
import os
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch

from fastbert import backend as fb_backend
from fastbert import reference
from fastbert.ops.checks import (
    check_device,
    check_ids,
    check_int,
    check_mask,
    check_prob,
    check_range,
    check_shape_like,
    check_tensor,
)

__all__ = ["mask_tokens", "word_start_table", "word_starts", "draw_seed", "IGNORE_INDEX"]

IGNORE_INDEX = reference.MLM_IGNORE_INDEX  # labels at the tokens not to predict
SELECTIONS = reference.MLM_SELECTIONS
_MAX_ROWS = 2**29  # counters (4 * row + stream) * 2**32 + position stay below 2**63
_MAX_SEQ = 2**31
_MAX_VOCAB = 2**31
_MASKS = ("special_tokens_mask", "attention_mask", "word_start_mask")


def _cpp(name: str):
    """The extension's masking function `name`, or None. The masking kernels came as one set: an
    extension built before them runs all of masking in plain PyTorch, with one warning."""
    if fb_backend.cpp_function("mask_tokens") is None:
        return None
    return fb_backend.cpp_function(name)


def _use_cpp(op: str, backend: Optional[str], t: torch.Tensor) -> bool:
    if backend is None:
        return t.device.type == "cpu" and _cpp(op) is not None
    if backend == "torch":
        return False
    if backend == "cpp":
        if t.device.type != "cpu":
            raise RuntimeError(f"fastbert.masking.{op}: backend='cpp' runs on CPU tensors, got tensors on {t.device}")
        if _cpp(op) is None:
            raise RuntimeError(
                f"fastbert.masking.{op}: backend='cpp' asked for but the C++ extension with the masking kernels "
                "is not built; reinstall with: pip install --no-build-isolation -e ."
            )
        return True
    raise ValueError(f"fastbert.masking.{op}: backend must be 'cpp', 'torch' or None, got {backend!r}")


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """A seed in [0, 2**63 - 1) drawn from `generator` (torch's default CPU generator when None)."""
    return int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, generator=generator))


def _where(op: str) -> str:
    return f"fastbert.masking.{op}"


def _check_ids(op: str, input_ids) -> torch.Tensor:
    check_ids(_where(op), "input_ids", input_ids)
    return input_ids.to(torch.int64).contiguous()


def _check_batch(op: str, input_ids) -> torch.Tensor:
    """input_ids as a contiguous int64 [batch, seq] tensor, within the counters' range."""
    ids = _check_ids(op, input_ids)
    if ids.dim() != 2:
        raise ValueError(f"fastbert.masking.{op}: input_ids must be [batch, seq], got shape {tuple(ids.shape)}")
    if ids.shape[0] >= _MAX_ROWS or ids.shape[1] >= _MAX_SEQ:
        raise ValueError(
            f"fastbert.masking.{op}: at most 2**29 - 1 rows and 2**31 - 1 columns, got {tuple(ids.shape)}"
        )
    return ids


def _check_mask(op: str, name: str, mask, ids: torch.Tensor) -> Optional[torch.Tensor]:
    """A [batch, seq] mask like input_ids (nonzero = set) as a contiguous bool tensor, or None."""
    if mask is None:
        return None
    check_tensor(_where(op), name, mask)
    check_shape_like(_where(op), name, mask, ids.shape)
    check_device(_where(op), name, mask, ids, like="input_ids")
    return check_mask(_where(op), name, mask).contiguous()


def _check_special_ids(op: str, special_token_ids, vocab_size: int) -> Optional[torch.Tensor]:
    if special_token_ids is None:
        return None
    if isinstance(special_token_ids, torch.Tensor):
        check_ids(_where(op), "special_token_ids", special_token_ids)
        ids = special_token_ids.reshape(-1).to(device="cpu", dtype=torch.int64)
    else:
        values = [check_int(_where(op), "a special token id", v, 0) for v in special_token_ids]
        ids = torch.tensor(values, dtype=torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0].item()
        raise ValueError(f"fastbert.masking.{op}: special token id {bad} is outside [0, vocab_size = {vocab_size})")
    return ids


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_tokens_mask: Optional[torch.Tensor] = None,
    attention_mask: Optional[torch.Tensor] = None,
    mlm_probability: float = 0.15,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    max_predictions: Optional[int] = None,
    word_start_mask: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    seed: Optional[int] = None,
    special_token_ids: Optional[Union[Iterable[int], torch.Tensor]] = None,
    selection: str = "count",
    backend: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(masked_input_ids, labels) of a [batch, seq] batch by the MLM masking rule (module docstring).

    Keyword-only extras beyond the contract:
        seed:              int in [0, 2**63): use it instead of drawing one from `generator`
        special_token_ids: ids that are never selected and never drawn as random replacements
        selection:         "count" (BERT's rule, the default) or "bernoulli" (transformers' collator)
        backend:           "cpp" (the extension; CPU tensors), "torch" (fastbert.reference; any
                           device, bit-identical) or None: "cpp" when it can run, else "torch"
    """
    op = "mask_tokens"
    ids = _check_batch(op, input_ids)
    rule = _check_rule(op, mask_token_id, vocab_size, mlm_probability, mask_replace_prob, random_replace_prob,
                       max_predictions, selection)
    masks = (special_tokens_mask, attention_mask, word_start_mask)
    rule.update((name, _check_mask(op, name, m, ids)) for name, m in zip(_MASKS, masks))
    special_ids = _check_special_ids(op, special_token_ids, rule["vocab_size"])
    rule["seed"] = _check_seed(op, seed, generator)
    if _use_cpp(op, backend, ids):
        return _cpp_mask_tokens(ids, rule, special_ids)
    _check_id_range(op, ids, rule["vocab_size"])
    special = None if special_ids is None else special_ids.tolist()
    return reference.mask_tokens(ids, **rule, special_token_ids=special)


def _cpp_mask_tokens(ids: torch.Tensor, rule: dict, special_ids: Optional[torch.Tensor]):
    """The extension's mask_tokens on checked arguments (`rule`: the keywords of the reference rule)."""
    max_predictions = -1 if rule["max_predictions"] is None else rule["max_predictions"]
    return _cpp("mask_tokens")(
        ids, *(rule[name] for name in _MASKS), special_ids, rule["mask_token_id"], rule["vocab_size"],
        rule["mlm_probability"], rule["mask_replace_prob"], rule["random_replace_prob"], max_predictions,
        rule["seed"], rule["selection"] == "bernoulli",
    )


def _check_rule(op, mask_token_id, vocab_size, mlm_probability, mask_replace_prob, random_replace_prob,
                max_predictions, selection) -> dict:
    """The scalar settings of mask_tokens, checked, as keyword arguments of the reference rule."""
    where = _where(op)
    vocab_size = check_int(where, "vocab_size", vocab_size, 1, _MAX_VOCAB, "2**31")
    rule = dict(
        vocab_size=vocab_size,
        mask_token_id=check_int(where, "mask_token_id", mask_token_id, 0, vocab_size, f"vocab_size = {vocab_size}"),
        mlm_probability=check_prob(where, "mlm_probability", mlm_probability),
        mask_replace_prob=check_prob(where, "mask_replace_prob", mask_replace_prob),
        random_replace_prob=check_prob(where, "random_replace_prob", random_replace_prob),
        max_predictions=None if max_predictions is None else check_int(where, "max_predictions", max_predictions, 0),
        selection=selection,
    )
    if rule["mask_replace_prob"] + rule["random_replace_prob"] > 1.0 + 1e-12:
        raise ValueError(
            f"{where}: mask_replace_prob + random_replace_prob must be at most 1 (the rest of the selected "
            f"tokens stay unchanged), got {rule['mask_replace_prob']} + {rule['random_replace_prob']}"
        )
    if selection not in SELECTIONS:
        raise ValueError(f"{where}: selection must be one of {SELECTIONS}, got {selection!r}")
    return rule


def _check_seed(op: str, seed, generator) -> int:
    """`seed` checked, or one drawn from `generator` (torch's default generator when None)."""
    if seed is not None:
        if generator is not None:
            raise ValueError(f"fastbert.masking.{op}: pass generator or seed, not both")
        return check_int(_where(op), "seed", seed, 0, 2**63, "2**63")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"fastbert.masking.{op}: generator must be a torch.Generator, got {type(generator).__name__}")
    return draw_seed(generator)


def _check_id_range(op: str, ids: torch.Tensor, vocab_size: int) -> None:
    """Every id in [0, vocab_size), or an error naming the first one outside (the extension checks its own)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        flat = ((ids < 0) | (ids >= vocab_size)).flatten().nonzero()[0].item()
        row, col = divmod(flat, ids.shape[1])
        raise ValueError(
            f"fastbert.masking.{op}: input_ids[{row}, {col}] = {ids[row, col].item()} is outside "
            f"[0, vocab_size = {vocab_size})"
        )


VocabLike = Union[Sequence[str], dict, str, os.PathLike, torch.Tensor]


def vocab_tokens(vocab) -> list:
    """The tokens of a vocabulary in id order: from a list of tokens, a {token: id} dict with ids
    0 .. n-1, or the path of a vocab.txt (one token a line, as BERT's)."""
    if isinstance(vocab, (str, os.PathLike)):
        with open(vocab, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    if isinstance(vocab, dict):
        tokens = [None] * len(vocab)
        for token, i in vocab.items():
            if not (isinstance(i, numbers.Integral) and 0 <= i < len(vocab)) or tokens[i] is not None:
                raise ValueError("fastbert.masking: a {token: id} vocabulary must map its tokens to 0 .. n-1 once each")
            tokens[i] = token
        return tokens
    tokens = list(vocab)
    if not all(isinstance(t, str) for t in tokens):
        raise TypeError("fastbert.masking: a vocabulary must be a list of str tokens, a {token: id} dict or a path")
    return tokens


def word_start_table(vocab: VocabLike, *, backend: Optional[str] = None) -> torch.Tensor:
    """bool [vocab_size]: True where the token starts a word, False for WordPiece continuations
    ("##" tokens). Build it once and pass it to word_starts; a bool tensor is returned as it is."""
    if isinstance(vocab, torch.Tensor):
        if vocab.dtype != torch.bool or vocab.dim() != 1:
            raise TypeError(
                f"fastbert.masking.word_start_table: a tensor must be a bool [vocab_size] table, got "
                f"{vocab.dtype} {tuple(vocab.shape)}"
            )
        return vocab
    tokens = vocab_tokens(vocab)
    build = _cpp("word_start_table") if backend != "torch" else None
    if build is not None:
        return build(tokens)
    if backend == "cpp":
        raise RuntimeError("fastbert.masking.word_start_table: backend='cpp' but the extension is not built")
    return reference.word_start_table(tokens)


def word_starts(input_ids: torch.Tensor, vocab: VocabLike, *, backend: Optional[str] = None) -> torch.Tensor:
    """bool like input_ids: True where the token starts a word (see word_start_table; pass the table
    itself rather than a vocabulary when calling this on many batches)."""
    op = "word_starts"
    ids = _check_ids(op, input_ids)
    table = word_start_table(vocab, backend=backend)
    if _use_cpp(op, backend, ids):
        return _cpp("word_starts")(ids, table.contiguous())
    check_range(_where(op), "input_ids", ids, table.numel(), "the vocabulary's size")
    return reference.word_starts(ids, table)
