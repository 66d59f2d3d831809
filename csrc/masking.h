// Token masking for masked-language-model pretraining (fastbert.masking calls these; the rule is
// written out in full, as executable Python, in fastbert/reference/masking.py,
// and the two are bit-identical).
//
// Every random number is word 0 of Philox-4x32-10 (philox.h) with key = the call's 64-bit seed and
// counter offset (4 * row + stream) * 2**32 + index: stream 0 = selection, 1 = outcome (mask /
// random / keep), 2 = random replacement id. A row's draws depend on (seed, row) only, so rows can
// be split across threads in any way without changing the result.
//
// Per row: the candidates are the tokens that are not padding, not special and not one of
// special_ids. "count" selection takes k = min(max(1, round_half_even(candidates * p)),
// max_predictions) tokens (0 when p == 0 or there is no candidate): single tokens by Floyd's
// sampling over the candidates; whole words (word_start given) by walking the words in increasing
// (key of the first token, position), skipping a word that would overshoot k, and when nothing fits,
// taking the first word no longer than max_predictions. "bernoulli" selection takes the units whose
// key is below floor(p * 2**32), at most max_predictions tokens. The t-th selected token (in
// position order) gets its outcome from index t of streams 1 and 2.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

typedef struct _object PyObject;  // <Python.h>'s

namespace fastbert {

// masking.cpp (and kernels/masking_rows.cpp): (masked_input_ids, labels), both int64 [rows, seq].
//   input_ids:      int64 [rows, seq], every id in [0, vocab_size)
//   special_mask, attention_mask, word_start: optional [rows, seq] masks of dtype bool, uint8,
//                   int8, int16, int32 or int64 (nonzero = true); attention 0 = padding
//   special_ids:    optional int64 [n]: tokens holding these ids are never selected, and random
//                   replacements never draw them or mask_token_id. When absent, random replacements
//                   avoid mask_token_id and every id found at a special or padding position.
//   max_predictions: < 0 for no limit
std::tuple<at::Tensor, at::Tensor> mask_tokens(
    const at::Tensor& input_ids, const std::optional<at::Tensor>& special_mask,
    const std::optional<at::Tensor>& attention_mask, const std::optional<at::Tensor>& word_start,
    const std::optional<at::Tensor>& special_ids, int64_t mask_token_id, int64_t vocab_size, double mlm_probability,
    double mask_replace_prob, double random_replace_prob, int64_t max_predictions, int64_t seed, bool bernoulli);

// word_starts.cpp: bool [tokens.size()], true where the token starts a word (does not begin with "##").
at::Tensor word_start_table(const std::vector<std::string>& tokens);

// bool [rows, seq] = table[input_ids] for int64 input_ids [rows, seq] and a bool table [vocab_size].
at::Tensor word_starts(const at::Tensor& input_ids, const at::Tensor& table);

// pad_id_lists.cpp: int64 [len(rows), seq], row r = rows[r] (a list or tuple of Python ints, or of
// objects with __index__) followed by pad_value. The collator's fast path from tokenizer output to
// a tensor; call with the GIL held (as from Python).
at::Tensor pad_id_lists(PyObject* rows, int64_t seq, int64_t pad_value);

}  // namespace fastbert
