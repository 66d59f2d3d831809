// What the two halves of mask_tokens share: its set-up and the work after the pass (the host's
// ../masking.cpp) and the parallel pass over the rows (masking_rows.cpp, a kernel). The Plan of a call, the optional masks
// it reads, what a chunk of rows reports back, and the draw of a random replacement id.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "api.h"
#include "philox_keys.h"

namespace fastbert {
namespace masking {

// floor(p * 2**32) for p in [0, 1]: a uniform 32-bit word is below it with probability p
inline uint64_t threshold32(double p) { return static_cast<uint64_t>(std::floor(p * 4294967296.0)); }

// An optional [rows, seq] mask of any integer or bool dtype, read as nonzero / zero.
struct Flags {
  const void* data = nullptr;
  kernels::Dtype dtype = kernels::Dtype::kBool;
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
    case kernels::Dtype::kBool:
    case kernels::Dtype::kUInt8: return and_row(static_cast<const uint8_t*>(f.data) + off, n, want_nonzero, out);
    case kernels::Dtype::kInt8: return and_row(static_cast<const int8_t*>(f.data) + off, n, want_nonzero, out);
    case kernels::Dtype::kInt16: return and_row(static_cast<const int16_t*>(f.data) + off, n, want_nonzero, out);
    case kernels::Dtype::kInt32: return and_row(static_cast<const int32_t*>(f.data) + off, n, want_nonzero, out);
    case kernels::Dtype::kInt64: return and_row(static_cast<const int64_t*>(f.data) + off, n, want_nonzero, out);
    default: return;  // rejected by check_flags
  }
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

// The r-th id (from 0) not excluded: r plus the number of excluded ids at or below it.
inline int64_t ordinary_id(const Plan& c, uint32_t w) {
  const int64_t r = static_cast<int64_t>((static_cast<uint64_t>(w) * c.ordinary) >> 32);  // uniform in [0, ordinary)
  return r + (std::upper_bound(c.gaps, c.gaps + c.n_gaps, r) - c.gaps);
}

}  // namespace masking
}  // namespace fastbert
