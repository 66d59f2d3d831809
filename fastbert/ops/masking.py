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
fastbert/reference.py; the C++ result is bit-identical to it):
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
import warnings
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch

from fastbert import backend as _backend
from fastbert import reference as _reference

__all__ = ["mask_tokens", "word_start_table", "word_starts", "draw_seed", "IGNORE_INDEX"]

IGNORE_INDEX = _reference.MLM_IGNORE_INDEX  # labels at the tokens not to predict
SELECTIONS = ("count", "bernoulli")
_MAX_ROWS = 2**29  # counters (4 * row + stream) * 2**32 + position stay below 2**63
_MAX_SEQ = 2**31
_MAX_VOCAB = 2**31

_warned_stale = False


def _ext():
    """The extension when it has the masking kernels, else None (warning once when it is stale)."""
    global _warned_stale
    ext = _backend.cpp_extension()
    if ext is not None and not hasattr(ext, "mask_tokens"):
        if not _warned_stale:
            warnings.warn(
                "fastbert: the built extension fastbert._C predates the masking kernels; token masking "
                "runs in plain PyTorch. Rebuild with: pip install --no-build-isolation -e .",
                RuntimeWarning,
                stacklevel=3,
            )
            _warned_stale = True
        return None
    return ext


def _use_cpp(op: str, backend: Optional[str], t: torch.Tensor) -> bool:
    if backend is None:
        return t.device.type == "cpu" and _ext() is not None
    if backend == "torch":
        return False
    if backend == "cpp":
        if t.device.type != "cpu":
            raise RuntimeError(f"fastbert.masking.{op}: backend='cpp' runs on CPU tensors, got tensors on {t.device}")
        if _ext() is None:
            raise RuntimeError(
                f"fastbert.masking.{op}: backend='cpp' asked for but the C++ extension with the masking kernels "
                "is not built; reinstall with: pip install --no-build-isolation -e ."
            )
        return True
    raise ValueError(f"fastbert.masking.{op}: backend must be 'cpp', 'torch' or None, got {backend!r}")


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """A seed in [0, 2**63 - 1) drawn from `generator` (torch's default CPU generator when None)."""
    return int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, generator=generator))


def _check_ids(op: str, input_ids) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"fastbert.masking.{op}: input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise TypeError(
            f"fastbert.masking.{op}: input_ids must hold integer token ids (int64, int32, ...), got {input_ids.dtype}"
        )
    if input_ids.dtype != torch.int64:
        input_ids = input_ids.to(torch.int64)
    return input_ids.contiguous()


def _check_int(op: str, name: str, value, lo: int, hi: Optional[int] = None, hi_name: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        else:
            raise TypeError(f"fastbert.masking.{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value >= hi):
        bound = f"[{lo}, {hi_name or hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"fastbert.masking.{op}: {name} = {value} is outside {bound}")
    return value


def _check_prob(op: str, name: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"fastbert.masking.{op}: {name} must be a float in [0, 1], got {type(p).__name__} {p!r}")
    p = float(p)
    if not 0.0 <= p <= 1.0:  # also rejects NaN
        raise ValueError(f"fastbert.masking.{op}: {name} must be in [0, 1], got {p}")
    return p


def _check_mask(op: str, name: str, mask, ids: torch.Tensor) -> Optional[torch.Tensor]:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"fastbert.masking.{op}: {name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(
            f"fastbert.masking.{op}: {name} has shape {tuple(mask.shape)} but input_ids has shape "
            f"{tuple(ids.shape)}; they must match"
        )
    if mask.device != ids.device:
        raise ValueError(f"fastbert.masking.{op}: {name} is on {mask.device} but input_ids is on {ids.device}")
    if mask.is_complex():
        raise TypeError(f"fastbert.masking.{op}: {name} has dtype {mask.dtype}; it must be bool or integer")
    if mask.is_floating_point():
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError(f"fastbert.masking.{op}: a floating {name} must hold only 0 and 1")
        mask = mask != 0
    elif mask.dtype not in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        mask = mask != 0
    return mask.contiguous()


def _check_special_ids(op: str, special_token_ids, vocab_size: int) -> Optional[torch.Tensor]:
    if special_token_ids is None:
        return None
    if isinstance(special_token_ids, torch.Tensor):
        t = special_token_ids
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"fastbert.masking.{op}: special_token_ids must hold integer ids, got {t.dtype}")
        ids = special_token_ids.reshape(-1).to(device="cpu", dtype=torch.int64)
    else:
        values = [_check_int(op, "a special token id", v, 0) for v in special_token_ids]
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
    ids = _check_ids(op, input_ids)
    if ids.dim() != 2:
        raise ValueError(f"fastbert.masking.{op}: input_ids must be [batch, seq], got shape {tuple(ids.shape)}")
    if ids.shape[0] >= _MAX_ROWS or ids.shape[1] >= _MAX_SEQ:
        raise ValueError(f"fastbert.masking.{op}: at most 2**29 - 1 rows and 2**31 - 1 columns, got {tuple(ids.shape)}")
    vocab_size = _check_int(op, "vocab_size", vocab_size, 1, _MAX_VOCAB, "2**31")
    mask_token_id = _check_int(op, "mask_token_id", mask_token_id, 0, vocab_size, f"vocab_size = {vocab_size}")
    mlm_probability = _check_prob(op, "mlm_probability", mlm_probability)
    mask_replace_prob = _check_prob(op, "mask_replace_prob", mask_replace_prob)
    random_replace_prob = _check_prob(op, "random_replace_prob", random_replace_prob)
    if mask_replace_prob + random_replace_prob > 1.0 + 1e-12:
        raise ValueError(
            f"fastbert.masking.{op}: mask_replace_prob + random_replace_prob must be at most 1 "
            f"(the rest of the selected tokens stay unchanged), got {mask_replace_prob} + {random_replace_prob}"
        )
    if max_predictions is not None:
        max_predictions = _check_int(op, "max_predictions", max_predictions, 0)
    if selection not in SELECTIONS:
        raise ValueError(f"fastbert.masking.{op}: selection must be one of {SELECTIONS}, got {selection!r}")
    special_tokens_mask = _check_mask(op, "special_tokens_mask", special_tokens_mask, ids)
    attention_mask = _check_mask(op, "attention_mask", attention_mask, ids)
    word_start_mask = _check_mask(op, "word_start_mask", word_start_mask, ids)
    special_ids = _check_special_ids(op, special_token_ids, vocab_size)
    if seed is not None:
        if generator is not None:
            raise ValueError(f"fastbert.masking.{op}: pass generator or seed, not both")
        seed = _check_int(op, "seed", seed, 0, 2**63, "2**63")
    else:
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                f"fastbert.masking.{op}: generator must be a torch.Generator, got {type(generator).__name__}"
            )
        seed = draw_seed(generator)

    if _use_cpp(op, backend, ids):
        return _ext().mask_tokens(
            ids, special_tokens_mask, attention_mask, word_start_mask, special_ids, mask_token_id, vocab_size,
            mlm_probability, mask_replace_prob, random_replace_prob,
            -1 if max_predictions is None else max_predictions, seed, selection == "bernoulli",
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        flat = ((ids < 0) | (ids >= vocab_size)).flatten().nonzero()[0].item()
        row, col = divmod(flat, ids.shape[1])
        raise ValueError(
            f"fastbert.masking.{op}: input_ids[{row}, {col}] = {ids[row, col].item()} is outside "
            f"[0, vocab_size = {vocab_size})"
        )
    return _reference.mask_tokens(
        ids, mask_token_id=mask_token_id, vocab_size=vocab_size, special_tokens_mask=special_tokens_mask,
        attention_mask=attention_mask, mlm_probability=mlm_probability, mask_replace_prob=mask_replace_prob,
        random_replace_prob=random_replace_prob, max_predictions=max_predictions, word_start_mask=word_start_mask,
        seed=seed, special_token_ids=None if special_ids is None else special_ids.tolist(), selection=selection,
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
    if backend != "torch" and (backend == "cpp" or _ext() is not None):
        ext = _ext()
        if ext is None:
            raise RuntimeError("fastbert.masking.word_start_table: backend='cpp' but the extension is not built")
        return ext.word_start_table(tokens)
    return _reference.word_start_table(tokens)


def word_starts(input_ids: torch.Tensor, vocab: VocabLike, *, backend: Optional[str] = None) -> torch.Tensor:
    """bool like input_ids: True where the token starts a word (see word_start_table; pass the table
    itself rather than a vocabulary when calling this on many batches)."""
    op = "word_starts"
    ids = _check_ids(op, input_ids)
    table = word_start_table(vocab, backend=backend)
    if _use_cpp(op, backend, ids):
        return _ext().word_starts(ids, table.contiguous())
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.numel()):
        raise ValueError(
            f"fastbert.masking.{op}: input_ids must be in [0, {table.numel()}) (the vocabulary's size), got "
            f"values in [{int(ids.min())}, {int(ids.max())}]"
        )
    return _reference.word_starts(ids, table)
