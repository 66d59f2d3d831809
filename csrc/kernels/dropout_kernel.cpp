// The dropout mask of fastbert's counter-based rule (see philox.h), and the raw Philox words, for
// tests: the fused kernels regenerate the mask element by element and never store it.
#include <algorithm>

#include "common.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace kernels {

void dropout_keep_mask(bool* out, int64_t rows, int64_t cols, double p, uint64_t seed) {
  const philox::Keys keys(seed);
  const uint32_t thresh = philox::threshold(p);
  constexpr int64_t W = vec::kWidth;
  parallel_for(0, rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    alignas(64) uint32_t u[W];
    for (int64_t r = r0; r < r1; ++r) {
      const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(cols);
      for (int64_t c = 0; c < cols; c += W) {
        vec::store_u32(u, philox::words(base + static_cast<uint64_t>(c), keys));
        const int64_t k = std::min(W, cols - c);
        for (int64_t i = 0; i < k; ++i) out[r * cols + c + i] = (u[i] >> 8) >= thresh;
      }
    }
  });
}

void philox_uint32(int64_t* out, uint64_t seed, int64_t start, int64_t count) {
  const philox::Keys keys(seed);
  constexpr int64_t W = vec::kWidth;
  const int64_t blocks = (count + W - 1) / W;
  parallel_for(0, blocks, 1024, [&](int64_t b0, int64_t b1) {
    alignas(64) uint32_t u[W];
    for (int64_t b = b0; b < b1; ++b) {
      vec::store_u32(u, philox::words(static_cast<uint64_t>(start) + static_cast<uint64_t>(b * W), keys));
      const int64_t k = std::min(W, count - b * W);
      for (int64_t i = 0; i < k; ++i) out[b * W + i] = u[i];
    }
  });
}

void philox_uint32_scalar(int64_t* out, uint64_t seed, int64_t start, int64_t count) {
  const philox::Keys keys(seed);
  for (int64_t i = 0; i < count; ++i) out[i] = philox::word0(static_cast<uint64_t>(start + i), keys);
}

}  // namespace kernels
}  // namespace fastbert
