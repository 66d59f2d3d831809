// Token masking for masked-language-model pretraining: see masking.h for the rule, and the same
// rule in plain PyTorch in fastbert/reference/masking.py.
//
// One parallel pass over the rows (kernels/masking_rows.cpp), set up and finished here. When the ids random
// replacements avoid depend on the batch (the ids at special and padding positions), those ids are
// gathered in the same pass and the few random replacements are filled in after it.
#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "cpu_ops.h"
#include "kernels/masking_plan.h"
#include "kernels/philox_keys.h"
#include "masking.h"

namespace fastbert {
namespace {

using masking::ChunkResult;
using masking::Flags;
using masking::ordinary_id;
using masking::Plan;
using masking::threshold32;

constexpr const char* kOp = "fastbert._C.mask_tokens";

Flags check_flags(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& ids) {
  Flags f;
  if (!t.has_value() || !t->defined()) return f;
  TORCH_CHECK_VALUE(t->device().is_cpu(), kOp, ": ", name, " must be a CPU tensor, got ", t->device());
  TORCH_CHECK_VALUE(t->sizes() == ids.sizes(), kOp, ": ", name, " has shape ", t->sizes(),
                    " but input_ids has shape ", ids.sizes(), "; they must match");
  TORCH_CHECK_VALUE(t->is_contiguous(), kOp, ": ", name, " must be contiguous");
  const at::ScalarType d = t->scalar_type();
  TORCH_CHECK_TYPE(d == at::kBool || d == at::kByte || d == at::kChar || d == at::kShort || d == at::kInt ||
                       d == at::kLong,
                   kOp, ": ", name, " has dtype ", d, "; it must be bool or an integer type");
  f.data = t->data_ptr();
  f.dtype = detail::dtype_of(d);
  f.seq = ids.size(1);
  return f;
}

// The checks of mask_tokens' arguments, but for the optional masks and special_token_ids.
void check_arguments(const at::Tensor& input_ids, int64_t mask_token_id, int64_t vocab_size, double mlm_probability,
                     double mask_replace_prob, double random_replace_prob, int64_t seed) {
  TORCH_CHECK_VALUE(input_ids.defined(), kOp, ": input_ids is undefined");
  TORCH_CHECK_VALUE(input_ids.device().is_cpu(), kOp, ": input_ids must be a CPU tensor, got ", input_ids.device());
  TORCH_CHECK_TYPE(input_ids.scalar_type() == at::kLong, kOp, ": input_ids must be int64, got ",
                   input_ids.scalar_type());
  TORCH_CHECK_VALUE(input_ids.dim() == 2, kOp, ": input_ids must be [batch, seq], got shape ", input_ids.sizes());
  TORCH_CHECK_VALUE(input_ids.is_contiguous(), kOp, ": input_ids must be contiguous");
  TORCH_CHECK_VALUE(vocab_size >= 1 && vocab_size < (int64_t{1} << 31), kOp,
                    ": vocab_size must be in [1, 2**31), got ", vocab_size);
  TORCH_CHECK_VALUE(mask_token_id >= 0 && mask_token_id < vocab_size, kOp, ": mask_token_id = ", mask_token_id,
                    " is outside [0, vocab_size = ", vocab_size, ")");
  TORCH_CHECK_VALUE(mlm_probability >= 0.0 && mlm_probability <= 1.0, kOp,
                    ": mlm_probability must be in [0, 1], got ", mlm_probability);
  TORCH_CHECK_VALUE(mask_replace_prob >= 0.0 && mask_replace_prob <= 1.0, kOp,
                    ": mask_replace_prob must be in [0, 1], got ", mask_replace_prob);
  TORCH_CHECK_VALUE(random_replace_prob >= 0.0 && random_replace_prob <= 1.0, kOp,
                    ": random_replace_prob must be in [0, 1], got ", random_replace_prob);
  TORCH_CHECK_VALUE(mask_replace_prob + random_replace_prob <= 1.0 + 1e-12, kOp,
                    ": mask_replace_prob + random_replace_prob must be at most 1, got ", mask_replace_prob, " + ",
                    random_replace_prob);
  TORCH_CHECK_VALUE(seed >= 0, kOp, ": seed must be in [0, 2**63), got ", seed);
  const int64_t rows = input_ids.size(0), seq = input_ids.size(1);
  TORCH_CHECK_VALUE(rows < (int64_t{1} << 29) && seq < (int64_t{1} << 31), kOp,
                    ": input_ids must have fewer than 2**29 rows and 2**31 columns, got ", input_ids.sizes());
}

// The ids of special_token_ids (a 1-D int64 CPU tensor), each checked against the vocabulary,
// appended to `excluded`.
void read_special_ids(const at::Tensor& t, int64_t vocab_size, std::vector<int64_t>& excluded) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.dim() == 1 && t.scalar_type() == at::kLong, kOp,
                    ": special_token_ids must be a 1-D int64 CPU tensor, got ", t.scalar_type(), " ", t.sizes());
  const at::Tensor tc = t.contiguous();
  const int64_t* p = tc.data_ptr<int64_t>();
  for (int64_t i = 0; i < tc.numel(); ++i) {
    TORCH_CHECK_VALUE(p[i] >= 0 && p[i] < vocab_size, kOp, ": special_token_ids holds ", p[i],
                      ", outside [0, vocab_size = ", vocab_size, ")");
    excluded.push_back(p[i]);
  }
}

// The ids random replacements never draw: `ids` (special_token_ids, or the ids found at special and
// padding positions) and mask_token_id, as the gaps ordinary_id reads.
struct Excluded {
  std::vector<int64_t> ids;
  std::vector<int64_t> gaps;

  // Adds mask_token_id and points c at the gaps; called once: before the pass with explicit ids,
  // otherwise after it.
  void apply(Plan& c, int64_t mask_token_id, int64_t vocab_size, bool draws_random) {
    ids.push_back(mask_token_id);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    gaps.resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) gaps[j] = ids[j] - static_cast<int64_t>(j);
    const int64_t ordinary = vocab_size - static_cast<int64_t>(ids.size());
    TORCH_CHECK_VALUE(!draws_random || ordinary >= 1, kOp,
                      ": random replacements need an ordinary id to draw, but all ", vocab_size,
                      " ids are special or the mask token");
    c.ordinary = static_cast<uint64_t>(std::max<int64_t>(ordinary, 0));
    c.gaps = gaps.data();
    c.n_gaps = static_cast<int64_t>(gaps.size());
  }
};

// After the pass: the first id out of range raises; with ids collected in the pass, the excluded
// set is completed and the random replacements deferred until then are drawn.
void finish_pass(Plan& c, const std::vector<ChunkResult>& results, Excluded& excluded, int64_t mask_token_id,
                 bool draws_random) {
  const int64_t seq = c.seq, vocab_size = c.vocab_size;
  for (const ChunkResult& r : results) {
    if (r.first_bad >= 0) {
      TORCH_CHECK_VALUE(false, kOp, ": input_ids[", r.first_bad / seq, ", ", r.first_bad % seq, "] = ",
                        c.ids[r.first_bad], " is outside [0, vocab_size = ", vocab_size, ")");
    }
  }
  if (c.collect) {
    for (const ChunkResult& r : results) excluded.ids.insert(excluded.ids.end(), r.seen.begin(), r.seen.end());
    excluded.apply(c, mask_token_id, vocab_size, draws_random);
    int64_t* o = c.out;
    for (const ChunkResult& r : results) {
      for (const auto& d : r.deferred) o[d.first] = ordinary_id(c, d.second);
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mask_tokens(
    const at::Tensor& input_ids, const std::optional<at::Tensor>& special_mask,
    const std::optional<at::Tensor>& attention_mask, const std::optional<at::Tensor>& word_start,
    const std::optional<at::Tensor>& special_ids, int64_t mask_token_id, int64_t vocab_size, double mlm_probability,
    double mask_replace_prob, double random_replace_prob, int64_t max_predictions, int64_t seed, bool bernoulli) {
  check_arguments(input_ids, mask_token_id, vocab_size, mlm_probability, mask_replace_prob, random_replace_prob, seed);
  const int64_t rows = input_ids.size(0), seq = input_ids.size(1);

  Plan c;
  c.special = check_flags(special_mask, "special_tokens_mask", input_ids);
  c.attention = check_flags(attention_mask, "attention_mask", input_ids);
  c.word_start = check_flags(word_start, "word_start_mask", input_ids);

  Excluded excluded;
  const bool explicit_ids = special_ids.has_value() && special_ids->defined();
  if (explicit_ids) read_special_ids(*special_ids, vocab_size, excluded.ids);

  at::Tensor out = detail::empty({rows, seq}, at::kLong);
  at::Tensor labels = detail::empty({rows, seq}, at::kLong);
  if (rows == 0 || seq == 0) return {out, labels};

  const uint64_t t_mask = threshold32(mask_replace_prob);
  const uint64_t t_random = threshold32(std::min(1.0, mask_replace_prob + random_replace_prob));
  const bool draws_random = t_random > t_mask;
  c.collect = draws_random && !explicit_ids;

  std::vector<uint8_t> special_id;
  if (explicit_ids && !excluded.ids.empty()) {
    special_id.assign(static_cast<size_t>(vocab_size), 0);
    for (int64_t v : excluded.ids) special_id[static_cast<size_t>(v)] = 1;
    c.special_id = special_id.data();
  }
  // with explicit ids the excluded set is known now; otherwise after the pass
  if (!c.collect) excluded.apply(c, mask_token_id, vocab_size, draws_random);

  c.ids = input_ids.data_ptr<int64_t>();
  c.out = out.data_ptr<int64_t>();
  c.labels = labels.data_ptr<int64_t>();
  c.seq = seq;
  c.vocab_size = vocab_size;
  c.keys = philox::Keys(static_cast<uint64_t>(seed));
  c.bernoulli = bernoulli;
  c.p = mlm_probability;
  c.max_predictions = max_predictions < 0 ? -1 : max_predictions;
  c.t_select = threshold32(mlm_probability);
  c.t_mask = t_mask;
  c.t_random = t_random;
  c.mask_token_id = mask_token_id;

  const std::vector<ChunkResult> results = detail::kernels_for("mask_tokens").mask_rows(c, rows);
  finish_pass(c, results, excluded, mask_token_id, draws_random);
  return {out, labels};
}

}  // namespace fastbert
