// The pass over the rows of mask_tokens (the host's ../masking.cpp), each row on its own: the id range check,
// candidate flags, the selection (Floyd's sampling of k candidates from k vector-Philox draws; or,
// for whole words and Bernoulli selection, a key per position), then the outcome of every selected
// token from draws indexed by the token's rank among the selected (vector Philox again).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common.h"
#include "masking_plan.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace masking {
namespace {

// counter offset (4 * row + stream) * 2**32 + index
constexpr uint64_t kStreams = 4;
constexpr uint64_t kStreamKey = 0;
constexpr uint64_t kStreamOutcome = 1;
constexpr uint64_t kStreamRandom = 2;
inline uint64_t counter(int64_t row, uint64_t stream, int64_t pos) {
  return ((static_cast<uint64_t>(row) * kStreams + stream) << 32) + static_cast<uint64_t>(pos);
}

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

// Adds v to the ids seen at special / padding positions: kept free of repeats while short (a batch
// holds a handful of special ids), duplicates are removed after the pass.
inline void note_seen(std::vector<int64_t>& seen, int64_t v) {
  if (seen.size() <= 64) {
    if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
  } else if (seen.back() != v) {
    seen.push_back(v);
  }
}

// Whether every id of row b is in [0, vocab_size); when one is not, the first such is recorded in
// r.first_bad.
bool ids_in_range(const Plan& c, int64_t b, ChunkResult& r) {
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
  return true;
}

// The candidates of row b: flags in s.cand (not padding, not special, not one of the special ids),
// positions in s.cpos; returns their number. With c.collect, the ids at the other positions (but
// those of special ids) go to r.seen.
int64_t row_candidates(const Plan& c, const Scratch& s, int64_t b, ChunkResult& r) {
  const int64_t S = c.seq;
  const int64_t* ids = c.ids + b * S;
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
  return candidate_positions(cand, S, s.cpos);
}

// The selection among the n candidates of row b: positions in s.sel, in increasing order; returns
// their number.
int64_t select_row(const Plan& c, const Scratch& s, int64_t b, int64_t n) {
  const int64_t S = c.seq;
  if (c.bernoulli) {
    if (c.t_select == 0 || c.max_predictions == 0) return 0;
    if (c.word_start.present()) {
      std::memset(s.start, 1, static_cast<size_t>(S));
      and_flags(c.word_start, b, true, s.start);
      return select_words(c, s, b, n, c.max_predictions);
    }
    return select_bernoulli(c, s, b, n, c.max_predictions);
  }
  const int64_t k = prediction_count(n, c.p, c.max_predictions);
  if (k == 0) return 0;
  if (c.word_start.present()) {
    std::memset(s.start, 1, static_cast<size_t>(S));
    and_flags(c.word_start, b, true, s.start);
    return select_words(c, s, b, n, k);
  }
  return select_floyd(c, s, b, n, k);
}

// The outcomes of the m selected tokens of row b (positions in s.sel), written to out and labels.
void apply_outcomes(const Plan& c, const Scratch& s, int64_t b, int64_t m, int64_t* out, int64_t* labels,
                    ChunkResult& r) {
  const int64_t S = c.seq;
  const int64_t* ids = c.ids + b * S;
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
}

// Returns false when the row holds an id out of range (recorded in r.first_bad).
bool mask_row(const Plan& c, const Scratch& s, int64_t b, ChunkResult& r) {
  if (!ids_in_range(c, b, r)) return false;
  const int64_t S = c.seq;
  int64_t* out = c.out + b * S;
  int64_t* labels = c.labels + b * S;
  std::memcpy(out, c.ids + b * S, static_cast<size_t>(S) * sizeof(int64_t));
  std::fill(labels, labels + S, int64_t{-100});
  const int64_t n = row_candidates(c, s, b, r);
  if (n == 0) return true;
  const int64_t m = select_row(c, s, b, n);
  if (m == 0) return true;
  apply_outcomes(c, s, b, m, out, labels, r);
  return true;
}

}  // namespace
}  // namespace masking

namespace kernels {

// The pass over every row of c: fills c.out and c.labels, one ChunkResult per fixed chunk of rows.
// Stops a chunk at its first row holding an id out of range.
std::vector<masking::ChunkResult> mask_rows(const masking::Plan& c, int64_t rows) {
  using masking::ChunkResult;
  const int64_t seq = c.seq;
  // Fixed chunks of rows (their number depends on the row count only); a task takes whole chunks of
  // at least kTaskTokens tokens, so a batch below that runs on the calling thread: a token's work is
  // so short that it would gain less from a second thread than a parallel region costs when the
  // cores are busy.
  // A row's result depends on its own tokens and index only.
  constexpr int64_t kTaskTokens = 32768;
  const int64_t chunk_rows = std::max<int64_t>(1, (rows + 63) / 64);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  std::vector<ChunkResult> results(static_cast<size_t>(chunks));
  const int64_t grain = std::max<int64_t>(1, kTaskTokens / std::max<int64_t>(1, chunk_rows * seq));
  parallel_for(0, chunks, grain, [&](int64_t c0, int64_t c1) {
    const masking::Scratch s(seq);
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t r0 = ch * chunk_rows, r1 = std::min(rows, r0 + chunk_rows);
      for (int64_t b = r0; b < r1; ++b) {
        if (!masking::mask_row(c, s, b, results[static_cast<size_t>(ch)])) break;
      }
    }
  });
  return results;
}

}  // namespace kernels
}  // namespace fastbert
