// Token masking for masked-language-model pretraining: see masking.h for the rule, and the same
// rule in plain PyTorch in fastbert/reference/masking.py.
//
// One parallel pass over the rows; each row on its own: the id range check, candidate flags, the
// selection (Floyd's sampling of k candidates from k vector-Philox draws; or, for whole words and
// Bernoulli selection, a key per position), then the outcome of every selected token from draws
// indexed by the token's rank among the selected (vector Philox again). When the ids random
// replacements avoid depend on the batch (the ids at special and padding positions), those ids are
// gathered in the same pass and the few random replacements are filled in after it.
#include <Python.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "masking.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace {

constexpr const char* kOp = "fastbert._C.mask_tokens";

// counter offset (4 * row + stream) * 2**32 + index
constexpr uint64_t kStreams = 4;
constexpr uint64_t kStreamKey = 0;
constexpr uint64_t kStreamOutcome = 1;
constexpr uint64_t kStreamRandom = 2;
inline uint64_t counter(int64_t row, uint64_t stream, int64_t pos) {
  return ((static_cast<uint64_t>(row) * kStreams + stream) << 32) + static_cast<uint64_t>(pos);
}

// floor(p * 2**32) for p in [0, 1]: a uniform 32-bit word is below it with probability p
inline uint64_t threshold32(double p) { return static_cast<uint64_t>(std::floor(p * 4294967296.0)); }

// round half to even, as Python's round(); x - floor(x) is exact for every finite double
inline int64_t round_half_even(double x) {
  const double f = std::floor(x);
  const double d = x - f;
  int64_t r = static_cast<int64_t>(f);
  if (d > 0.5 || (d == 0.5 && (r & 1) != 0)) ++r;
  return r;
}

// The number of tokens "count" selection picks in a row with n candidates.
inline int64_t prediction_count(int64_t n, double p, int64_t max_predictions) {
  if (n == 0 || p == 0.0) return 0;
  int64_t k = std::max<int64_t>(1, round_half_even(static_cast<double>(n) * p));
  if (max_predictions >= 0) k = std::min(k, max_predictions);
  return k;
}

// An optional [rows, seq] mask of any integer or bool dtype, read as nonzero / zero.
struct Flags {
  const void* data = nullptr;
  at::ScalarType dtype = at::kBool;
  int64_t seq = 0;
  bool present() const { return data != nullptr; }
};

template <class T>
inline void and_row(const T* p, int64_t n, bool want_nonzero, uint8_t* out) {
  if (want_nonzero) {
    for (int64_t i = 0; i < n; ++i) out[i] &= static_cast<uint8_t>(p[i] != 0);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] &= static_cast<uint8_t>(p[i] == 0);
  }
}

// out[i] &= ((f[row, i] != 0) == want_nonzero) for i < seq
inline void and_flags(const Flags& f, int64_t row, bool want_nonzero, uint8_t* out) {
  const int64_t n = f.seq, off = row * f.seq;
  switch (f.dtype) {
    case at::kBool:
    case at::kByte:
      and_row(static_cast<const uint8_t*>(f.data) + off, n, want_nonzero, out);
      break;
    case at::kChar:
      and_row(static_cast<const int8_t*>(f.data) + off, n, want_nonzero, out);
      break;
    case at::kShort:
      and_row(static_cast<const int16_t*>(f.data) + off, n, want_nonzero, out);
      break;
    case at::kInt:
      and_row(static_cast<const int32_t*>(f.data) + off, n, want_nonzero, out);
      break;
    case at::kLong:
      and_row(static_cast<const int64_t*>(f.data) + off, n, want_nonzero, out);
      break;
    default:
      break;  // rejected by check_flags
  }
}

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
  f.dtype = d;
  f.seq = ids.size(1);
  return f;
}

// Everything a row needs, shared read-only by the workers.
struct Plan {
  const int64_t* ids = nullptr;
  int64_t* out = nullptr;
  int64_t* labels = nullptr;
  int64_t seq = 0;
  int64_t vocab_size = 0;
  Flags special, attention, word_start;
  const uint8_t* special_id = nullptr;  // [vocab_size] 1 for special_token_ids, or nullptr
  bool collect = false;                 // gather the ids at special / padding positions
  philox::Keys keys;
  bool bernoulli = false;
  double p = 0.0;
  int64_t max_predictions = -1;  // < 0: no limit
  uint64_t t_select = 0;         // bernoulli: a unit is eligible when its key is below this
  uint64_t t_mask = 0;           // outcome draw below this: mask_token_id
  uint64_t t_random = 0;         // below this (and not below t_mask): a random ordinary id
  int64_t mask_token_id = 0;
  uint64_t ordinary = 0;          // number of ids random replacements draw from
  const int64_t* gaps = nullptr;  // excluded[j] - j, non-decreasing
  int64_t n_gaps = 0;
};

// What one fixed chunk of rows reports back (chunks depend on the row count only).
struct ChunkResult {
  int64_t first_bad = -1;                    // flat index of the first id out of range
  std::vector<int64_t> seen;                 // ids at special / padding positions (collect)
  std::vector<std::pair<int64_t, uint32_t>> deferred;  // (flat index, draw) of random replacements (collect)
};

// Per-thread scratch rows (vec::thread_buffer slots of this file).
struct Scratch {
  uint8_t* cand;     // [seq] candidate flags
  uint8_t* start;    // [seq] word-start flags
  uint8_t* picked;   // [seq] Floyd's picks, by candidate index
  int32_t* cpos;     // [seq] candidate positions
  uint32_t* draw;    // [seq rounded up to the vector width] Philox draws
  uint64_t* units;   // [seq] (key << 32) | first position
  int64_t* len;      // [seq] word length, indexed by first position
  int32_t* sel;      // [seq] selected positions
  explicit Scratch(int64_t seq) {
    const int64_t padded = vec::round_up(seq, vec::kWidth);
    cand = vec::thread_buffer<uint8_t, 40>(seq);
    start = vec::thread_buffer<uint8_t, 41>(seq);
    picked = vec::thread_buffer<uint8_t, 42>(seq);
    cpos = vec::thread_buffer<int32_t, 43>(seq);
    draw = vec::thread_buffer<uint32_t, 44>(padded);
    units = vec::thread_buffer<uint64_t, 45>(seq);
    len = vec::thread_buffer<int64_t, 46>(seq);
    sel = vec::thread_buffer<int32_t, 47>(seq);
  }
};

// dst[j] = draw(stream, row, first + j) for j < n (n rounded up to the vector width is written)
inline void draws(const Plan& c, int64_t row, uint64_t stream, int64_t first, int64_t n, uint32_t* dst) {
  for (int64_t j = 0; j < n; j += vec::kWidth) {
    vec::store_u32(dst + j, philox::words(counter(row, stream, first + j), c.keys));
  }
}

inline uint64_t unit(const uint32_t* key, int64_t pos) {
  return (static_cast<uint64_t>(key[pos]) << 32) | static_cast<uint64_t>(pos);
}
inline int64_t unit_pos(uint64_t u) { return static_cast<int64_t>(u & 0xFFFFFFFFu); }

// out = the values[i] with flags[i] != 0 (i < n, flags 0 / 1), in order; returns their number.
inline int64_t compress_positions(const uint8_t* flags, const int32_t* values, int64_t n, int32_t* out) {
  int64_t m = 0, i = 0;
#if defined(FASTBERT_VEC_AVX512)
  for (; i + 16 <= n; i += 16) {
    const __mmask16 k = _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(flags + i)),
                                           _mm_set1_epi8(static_cast<char>(0xFF)));
    _mm512_mask_compressstoreu_epi32(out + m, k, _mm512_loadu_si512(values + i));
    m += __builtin_popcount(static_cast<unsigned>(k));
  }
#endif
  for (; i < n; ++i) {
    out[m] = values[i];
    m += flags[i];
  }
  return m;
}

// The positions i < seq with cand[i] != 0, in increasing order, to cpos; returns their number.
inline int64_t candidate_positions(const uint8_t* cand, int64_t seq, int32_t* cpos) {
  int64_t n = 0, i = 0;
#if defined(FASTBERT_VEC_AVX512)
  const __m512i step = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i + 16 <= seq; i += 16) {
    const __mmask16 k = _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cand + i)),
                                           _mm_set1_epi8(static_cast<char>(0xFF)));
    _mm512_mask_compressstoreu_epi32(cpos + n, k, idx);
    n += __builtin_popcount(static_cast<unsigned>(k));
    idx = _mm512_add_epi32(idx, step);
  }
#endif
  for (; i < seq; ++i) {
    cpos[n] = static_cast<int32_t>(i);
    n += cand[i];
  }
  return n;
}

// k of the n candidates by Floyd's sampling: for j = n-k .. n-1, t = uniform in [0, j] from
// draw(0, row, j); pick t, or j when t is picked already. Writes the picked positions to s.sel in
// increasing order.
int64_t select_floyd(const Plan& c, const Scratch& s, int64_t b, int64_t n, int64_t k) {
  uint8_t* picked = s.picked;
  if (k >= n) {
    std::memcpy(s.sel, s.cpos, static_cast<size_t>(n) * sizeof(int32_t));
    return n;
  }
  std::memset(picked, 0, static_cast<size_t>(n));
  draws(c, b, kStreamKey, n - k, k, s.draw);
  for (int64_t j = n - k; j < n; ++j) {
    const uint64_t w = s.draw[j - (n - k)];
    const int64_t t = static_cast<int64_t>((w * static_cast<uint64_t>(j + 1)) >> 32);  // uniform in [0, j]
    picked[picked[t] ? j : t] = 1;
  }
  return compress_positions(picked, s.cpos, n, s.sel);
}

// Bernoulli selection of single tokens: the candidates with key < t_select; past the budget (>= 0),
// those with the smallest (key, position). Positions in increasing order.
int64_t select_bernoulli(const Plan& c, const Scratch& s, int64_t b, int64_t n, int64_t budget) {
  const uint32_t* key = s.draw;
  draws(c, b, kStreamKey, 0, c.seq, s.draw);
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = s.cpos[j];
    s.units[m] = unit(key, i);
    m += static_cast<int64_t>(key[i] < c.t_select);
  }
  if (budget >= 0 && m > budget) {
    std::nth_element(s.units, s.units + budget, s.units + m);
    m = budget;
    std::sort(s.units, s.units + m, [](uint64_t x, uint64_t y) { return unit_pos(x) < unit_pos(y); });
  }
  for (int64_t j = 0; j < m; ++j) s.sel[j] = static_cast<int32_t>(unit_pos(s.units[j]));
  return m;
}

// Walks the sorted units, taking a unit whole when it fits in the budget (< 0: unlimited) and
// skipping it when it does not, until the budget is reached. Returns the number of tokens taken
// (their positions in s.sel, in walk order).
int64_t walk_words(const Scratch& s, int64_t nu, int64_t budget) {
  const int64_t cap = budget < 0 ? std::numeric_limits<int64_t>::max() : budget;
  int64_t count = 0;
  for (int64_t j = 0; j < nu && count < cap; ++j) {
    const int64_t first = unit_pos(s.units[j]);
    const int64_t len = s.len[first];
    if (len > cap - count) continue;  // this word would overshoot: skip it
    for (int64_t t = 0; t < len; ++t) s.sel[count + t] = static_cast<int32_t>(first + t);
    count += len;
  }
  return count;
}

// The fraction of a row's tokens whose keys surely hold the k smallest, but for rare rows:
// k + 4 sqrt(k) + 8 expected keys below it (their count is binomial, sd < sqrt(k)).
inline double prune_fraction(int64_t k, int64_t n) {
  return (static_cast<double>(k) + 4.0 * std::sqrt(static_cast<double>(k)) + 8.0) / static_cast<double>(n);
}

// Whole-word selection ("count" or "bernoulli"); positions in increasing order.
int64_t select_words(const Plan& c, const Scratch& s, int64_t b, int64_t n, int64_t budget) {
  const int64_t S = c.seq;
  const uint8_t* cand = s.cand;
  const uint8_t* start = s.start;
  const uint32_t* key = s.draw;
  draws(c, b, kStreamKey, 0, S, s.draw);
  // the words: a candidate that starts a word or follows a non-candidate, and the candidates after
  // it that do not start one
  int64_t words = 0;
  for (int64_t i = 0; i < S;) {
    if (!cand[i]) {
      ++i;
      continue;
    }
    const int64_t first = i++;
    while (i < S && cand[i] && !start[i]) ++i;
    s.len[first] = i - first;
    s.units[words++] = unit(key, first);
  }
  int64_t count = -1;
  if (c.bernoulli) {
    int64_t nu = 0;
    for (int64_t j = 0; j < words; ++j) {
      const uint64_t u = s.units[j];
      s.units[nu] = u;
      nu += static_cast<int64_t>((u >> 32) < c.t_select);
    }
    std::sort(s.units, s.units + nu);
    count = walk_words(s, nu, budget);
  } else {
    const int64_t k = budget;
    // The words with keys below the pruning threshold fill k in all but rare rows; their walk is
    // then the walk over all words, which ends at k before it reaches a larger key.
    const double q = prune_fraction(k, n);
    if (q < 1.0) {
      const uint64_t t = threshold32(q);
      int64_t lo = 0;  // move the words below t to the front (all words stay in the array)
      for (int64_t j = 0; j < words; ++j) {
        if ((s.units[j] >> 32) < t) std::swap(s.units[lo++], s.units[j]);
      }
      if (lo < words) {
        std::sort(s.units, s.units + lo);
        count = walk_words(s, lo, k);
        if (count != k) count = -1;
      }
    }
    if (count < 0) {
      std::sort(s.units, s.units + words);
      count = walk_words(s, words, k);
    }
    if (count == 0) {  // every word is longer than k: the first one within max_predictions
      const int64_t limit = c.max_predictions < 0 ? std::numeric_limits<int64_t>::max() : c.max_predictions;
      for (int64_t j = 0; j < words; ++j) {
        const int64_t first = unit_pos(s.units[j]);
        if (s.len[first] <= limit) {
          for (int64_t t = 0; t < s.len[first]; ++t) s.sel[t] = static_cast<int32_t>(first + t);
          count = s.len[first];
          break;
        }
      }
    }
  }
  std::sort(s.sel, s.sel + count);
  return count;
}

// The r-th id (from 0) not excluded: r plus the number of excluded ids at or below it.
inline int64_t ordinary_id(const Plan& c, uint32_t w) {
  const int64_t r = static_cast<int64_t>((static_cast<uint64_t>(w) * c.ordinary) >> 32);  // uniform in [0, ordinary)
  return r + (std::upper_bound(c.gaps, c.gaps + c.n_gaps, r) - c.gaps);
}

// Adds v to the ids seen at special / padding positions: kept free of repeats while short (a batch
// holds a handful of special ids), duplicates are removed after the pass.
inline void note_seen(std::vector<int64_t>& seen, int64_t v) {
  if (seen.size() <= 64) {
    if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
  } else if (seen.back() != v) {
    seen.push_back(v);
  }
}

// Returns false when the row holds an id out of range (recorded in r.first_bad).
bool mask_row(const Plan& c, const Scratch& s, int64_t b, ChunkResult& r) {
  const int64_t S = c.seq;
  const int64_t* ids = c.ids + b * S;
  uint64_t bad = 0;
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
  for (int64_t i = 0; i < S; ++i) bad |= static_cast<uint64_t>(static_cast<uint64_t>(ids[i]) >= vocab);
  if (bad != 0) {
    for (int64_t i = 0; i < S; ++i) {
      if (ids[i] < 0 || ids[i] >= c.vocab_size) {
        r.first_bad = b * S + i;
        break;
      }
    }
    return false;
  }
  int64_t* out = c.out + b * S;
  int64_t* labels = c.labels + b * S;
  std::memcpy(out, ids, static_cast<size_t>(S) * sizeof(int64_t));
  std::fill(labels, labels + S, int64_t{-100});

  uint8_t* cand = s.cand;
  std::memset(cand, 1, static_cast<size_t>(S));
  if (c.attention.present()) and_flags(c.attention, b, true, cand);
  if (c.special.present()) and_flags(c.special, b, false, cand);
  if (c.collect) {  // the ids at special / padding positions; 8 flags at a time, most are all 1
    constexpr uint64_t kAllOnes = 0x0101010101010101ull;
    for (int64_t i0 = 0; i0 < S; i0 += 8) {
      const int64_t w = std::min<int64_t>(8, S - i0);
      if (w == 8) {
        uint64_t flags;
        std::memcpy(&flags, cand + i0, 8);
        if (flags == kAllOnes) continue;
      }
      for (int64_t i = i0; i < i0 + w; ++i) {
        if (!cand[i]) note_seen(r.seen, ids[i]);
      }
    }
  }
  if (c.special_id != nullptr) {
    for (int64_t i = 0; i < S; ++i) cand[i] &= static_cast<uint8_t>(c.special_id[ids[i]] ^ 1);
  }
  const int64_t n = candidate_positions(cand, S, s.cpos);
  if (n == 0) return true;

  int64_t m;
  if (c.bernoulli) {
    if (c.t_select == 0 || c.max_predictions == 0) return true;
    if (c.word_start.present()) {
      std::memset(s.start, 1, static_cast<size_t>(S));
      and_flags(c.word_start, b, true, s.start);
      m = select_words(c, s, b, n, c.max_predictions);
    } else {
      m = select_bernoulli(c, s, b, n, c.max_predictions);
    }
  } else {
    const int64_t k = prediction_count(n, c.p, c.max_predictions);
    if (k == 0) return true;
    if (c.word_start.present()) {
      std::memset(s.start, 1, static_cast<size_t>(S));
      and_flags(c.word_start, b, true, s.start);
      m = select_words(c, s, b, n, k);
    } else {
      m = select_floyd(c, s, b, n, k);
    }
  }
  if (m == 0) return true;

  // outcome of the t-th selected token (in position order): draw(1, row, t); its random id: draw(2, row, t)
  draws(c, b, kStreamOutcome, 0, m, s.draw);
  for (int64_t t = 0; t < m; ++t) {
    const int64_t pos = s.sel[t];
    labels[pos] = ids[pos];
    const uint64_t u = s.draw[t];
    if (u < c.t_mask) {
      out[pos] = c.mask_token_id;
    } else if (u < c.t_random) {
      const uint32_t w = philox::word0(counter(b, kStreamRandom, t), c.keys);
      if (c.collect) {
        r.deferred.emplace_back(b * S + pos, w);  // the excluded ids are known after the pass
      } else {
        out[pos] = ordinary_id(c, w);
      }
    }
  }
  return true;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mask_tokens(const at::Tensor& input_ids,
                                               const std::optional<at::Tensor>& special_mask,
                                               const std::optional<at::Tensor>& attention_mask,
                                               const std::optional<at::Tensor>& word_start,
                                               const std::optional<at::Tensor>& special_ids, int64_t mask_token_id,
                                               int64_t vocab_size, double mlm_probability, double mask_replace_prob,
                                               double random_replace_prob, int64_t max_predictions, int64_t seed,
                                               bool bernoulli) {
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

  Plan c;
  c.special = check_flags(special_mask, "special_tokens_mask", input_ids);
  c.attention = check_flags(attention_mask, "attention_mask", input_ids);
  c.word_start = check_flags(word_start, "word_start_mask", input_ids);

  std::vector<int64_t> excluded;
  const bool explicit_ids = special_ids.has_value() && special_ids->defined();
  if (explicit_ids) {
    const at::Tensor& t = *special_ids;
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

  at::Tensor out = at::empty({rows, seq}, input_ids.options());
  at::Tensor labels = at::empty({rows, seq}, input_ids.options());
  if (rows == 0 || seq == 0) return {out, labels};

  const uint64_t t_mask = threshold32(mask_replace_prob);
  const uint64_t t_random = threshold32(std::min(1.0, mask_replace_prob + random_replace_prob));
  const bool draws_random = t_random > t_mask;
  c.collect = draws_random && !explicit_ids;

  std::vector<uint8_t> special_id;
  if (explicit_ids && !excluded.empty()) {
    special_id.assign(static_cast<size_t>(vocab_size), 0);
    for (int64_t v : excluded) special_id[static_cast<size_t>(v)] = 1;
    c.special_id = special_id.data();
  }
  // with explicit ids the excluded set is known now; otherwise after the pass
  std::vector<int64_t> gaps;
  const auto set_excluded = [&]() {
    excluded.push_back(mask_token_id);
    std::sort(excluded.begin(), excluded.end());
    excluded.erase(std::unique(excluded.begin(), excluded.end()), excluded.end());
    gaps.resize(excluded.size());
    for (size_t j = 0; j < excluded.size(); ++j) gaps[j] = excluded[j] - static_cast<int64_t>(j);
    const int64_t ordinary = vocab_size - static_cast<int64_t>(excluded.size());
    TORCH_CHECK_VALUE(!draws_random || ordinary >= 1, kOp,
                      ": random replacements need an ordinary id to draw, but all ", vocab_size,
                      " ids are special or the mask token");
    c.ordinary = static_cast<uint64_t>(std::max<int64_t>(ordinary, 0));
    c.gaps = gaps.data();
    c.n_gaps = static_cast<int64_t>(gaps.size());
  };
  if (!c.collect) set_excluded();

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

  // Fixed chunks of rows (their number depends on the row count only); a task takes whole chunks of
  // at least kTaskTokens tokens, so a batch below that runs on the calling thread: at ~5 ns a token
  // it would gain less from a second thread than a parallel region costs when the cores are busy.
  // A row's result depends on its own tokens and index only.
  constexpr int64_t kTaskTokens = 32768;
  const int64_t chunk_rows = std::max<int64_t>(1, (rows + 63) / 64);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  std::vector<ChunkResult> results(static_cast<size_t>(chunks));
  const int64_t grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(1, chunk_rows * seq));
  at::parallel_for(0, chunks, grain, [&](int64_t c0, int64_t c1) {
    const Scratch s(seq);
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t r0 = ch * chunk_rows, r1 = std::min(rows, r0 + chunk_rows);
      for (int64_t b = r0; b < r1; ++b) {
        if (!mask_row(c, s, b, results[static_cast<size_t>(ch)])) break;
      }
    }
  });
  for (const ChunkResult& r : results) {
    if (r.first_bad >= 0) {
      TORCH_CHECK_VALUE(false, kOp, ": input_ids[", r.first_bad / seq, ", ", r.first_bad % seq, "] = ",
                        c.ids[r.first_bad], " is outside [0, vocab_size = ", vocab_size, ")");
    }
  }
  if (c.collect) {
    for (const ChunkResult& r : results) excluded.insert(excluded.end(), r.seen.begin(), r.seen.end());
    set_excluded();
    int64_t* o = c.out;
    for (const ChunkResult& r : results) {
      for (const auto& d : r.deferred) o[d.first] = ordinary_id(c, d.second);
    }
  }
  return {out, labels};
}

at::Tensor word_start_table(const std::vector<std::string>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  at::Tensor table = at::empty({n}, at::TensorOptions().dtype(at::kBool));
  bool* p = table.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    const std::string& t = tokens[static_cast<size_t>(i)];
    p[i] = !(t.size() >= 2 && t[0] == '#' && t[1] == '#');
  }
  return table;
}

at::Tensor word_starts(const at::Tensor& input_ids, const at::Tensor& table) {
  const char* op = "fastbert._C.word_starts";
  TORCH_CHECK_VALUE(input_ids.defined() && input_ids.device().is_cpu(), op, ": input_ids must be a CPU tensor");
  TORCH_CHECK_TYPE(input_ids.scalar_type() == at::kLong, op, ": input_ids must be int64, got ",
                   input_ids.scalar_type());
  TORCH_CHECK_VALUE(input_ids.is_contiguous(), op, ": input_ids must be contiguous");
  TORCH_CHECK_VALUE(table.defined() && table.device().is_cpu() && table.dim() == 1 && table.is_contiguous(), op,
                    ": the word-start table must be a contiguous 1-D CPU tensor");
  TORCH_CHECK_TYPE(table.scalar_type() == at::kBool, op, ": the word-start table must be bool, got ",
                   table.scalar_type());
  at::Tensor out = at::empty(input_ids.sizes(), at::TensorOptions().dtype(at::kBool));
  const int64_t n = input_ids.numel(), vocab = table.numel();
  if (n == 0) return out;
  const int64_t* ids = input_ids.data_ptr<int64_t>();
  const uint8_t* tab = reinterpret_cast<const uint8_t*>(table.data_ptr<bool>());
  uint8_t* o = reinterpret_cast<uint8_t*>(out.data_ptr<bool>());
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> first_bad(chunks, -1);
  at::parallel_for(0, chunks, 16, [&](int64_t c0, int64_t c1) {  // tasks of 256k ids at least
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t i0 = ch * kChunk, i1 = std::min(n, i0 + kChunk);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t v = ids[i];
        if (static_cast<uint64_t>(v) >= static_cast<uint64_t>(vocab)) {
          first_bad[ch] = i;
          break;
        }
        o[i] = tab[v];
      }
    }
  });
  for (int64_t ch = 0; ch < chunks; ++ch) {
    TORCH_CHECK_VALUE(first_bad[ch] < 0, op, ": input_ids holds ", ids[first_bad[ch] < 0 ? 0 : first_bad[ch]],
                      " (flat index ", first_bad[ch], "), outside [0, vocab size of the table = ", vocab, ")");
  }
  return out;
}

at::Tensor pad_id_lists(PyObject* rows, int64_t seq, int64_t pad_value) {
  const char* op = "fastbert._C.pad_id_lists";
  TORCH_CHECK_VALUE(seq >= 0, op, ": seq must be >= 0, got ", seq);
  TORCH_CHECK_TYPE(PyList_Check(rows) || PyTuple_Check(rows), op, ": rows must be a list or tuple of lists");
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(rows);
  at::Tensor out = at::empty({static_cast<int64_t>(n), seq}, at::TensorOptions().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  PyObject** row_items = PySequence_Fast_ITEMS(rows);
  for (Py_ssize_t r = 0; r < n; ++r) {
    PyObject* row = row_items[r];
    TORCH_CHECK_TYPE(PyList_Check(row) || PyTuple_Check(row), op, ": row ", r, " is a ", Py_TYPE(row)->tp_name,
                     ", not a list or tuple");
    const Py_ssize_t len = PySequence_Fast_GET_SIZE(row);
    TORCH_CHECK_VALUE(len <= seq, op, ": row ", r, " has ", len, " ids, more than seq = ", seq);
    PyObject** items = PySequence_Fast_ITEMS(row);
    int64_t* dst = o + r * seq;
    for (Py_ssize_t i = 0; i < len; ++i) {
      PyObject* item = items[i];
      int overflow = 0;
      long long v;
      if (PyLong_Check(item)) {
        v = PyLong_AsLongLongAndOverflow(item, &overflow);
      } else {
        PyObject* index = PyIndex_Check(item) ? PyNumber_Index(item) : nullptr;
        if (index == nullptr) {
          PyErr_Clear();
          TORCH_CHECK_TYPE(false, op, ": row ", r, " holds a ", Py_TYPE(item)->tp_name, " at ", i,
                           "; ids must be integers");
        }
        v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
      }
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        TORCH_CHECK_VALUE(false, op, ": row ", r, " holds an integer at ", i, " that does not fit in int64");
      }
      dst[i] = static_cast<int64_t>(v);
    }
    std::fill(dst + len, dst + seq, pad_value);
  }
  return out;
}

}  // namespace fastbert
