// The dropout mask of fastbert's counter-based rule (see philox.h), exposed for tests: the fused
// kernels regenerate it element by element and never store it.
#include <ATen/Parallel.h>

#include <algorithm>

#include "cpu_ops.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {

at::Tensor dropout_keep_mask(int64_t rows, int64_t cols, double p, int64_t seed) {
  const char* op = "dropout_keep_mask";
  TORCH_CHECK(rows >= 0 && cols >= 0, "fastbert._C.", op, ": rows and cols must be >= 0, got ", rows, ", ", cols);
  detail::check_dropout(op, p, seed);
  at::Tensor mask = at::empty({rows, cols}, at::TensorOptions().dtype(at::kBool));
  if (rows == 0 || cols == 0) return mask;
  const philox::Keys keys(static_cast<uint64_t>(seed));
  const uint32_t thresh = philox::threshold(p);
  bool* out = mask.data_ptr<bool>();
  constexpr int64_t W = vec::kWidth;
  at::parallel_for(0, rows, detail::row_grain(cols), [&](int64_t r0, int64_t r1) {
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
  return mask;
}

at::Tensor philox_uint32(int64_t seed, int64_t start, int64_t count) {
  const char* op = "philox_uint32";
  TORCH_CHECK(seed >= 0, "fastbert._C.", op, ": seed must be in [0, 2**63), got ", seed);
  TORCH_CHECK(start >= 0 && count >= 0 && count <= INT64_MAX - start, "fastbert._C.", op,
              ": need start >= 0, count >= 0 and start + count < 2**63, got ", start, ", ", count);
  at::Tensor out = at::empty({count}, at::TensorOptions().dtype(at::kLong));
  const philox::Keys keys(static_cast<uint64_t>(seed));
  int64_t* o = out.data_ptr<int64_t>();
  constexpr int64_t W = vec::kWidth;
  const int64_t blocks = (count + W - 1) / W;
  at::parallel_for(0, blocks, 1024, [&](int64_t b0, int64_t b1) {
    alignas(64) uint32_t u[W];
    for (int64_t b = b0; b < b1; ++b) {
      vec::store_u32(u, philox::words(static_cast<uint64_t>(start) + static_cast<uint64_t>(b * W), keys));
      const int64_t k = std::min(W, count - b * W);
      for (int64_t i = 0; i < k; ++i) o[b * W + i] = u[i];
    }
  });
  return out;
}

at::Tensor philox_uint32_scalar(int64_t seed, int64_t start, int64_t count) {
  TORCH_CHECK(seed >= 0 && start >= 0 && count >= 0 && count <= INT64_MAX - start,
              "fastbert._C.philox_uint32_scalar: bad seed / start / count");
  at::Tensor out = at::empty({count}, at::TensorOptions().dtype(at::kLong));
  const philox::Keys keys(static_cast<uint64_t>(seed));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) o[i] = philox::word0(static_cast<uint64_t>(start + i), keys);
  return out;
}

}  // namespace fastbert
