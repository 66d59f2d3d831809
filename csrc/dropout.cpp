// The dropout rule's mask and raw Philox words, for tests (kernels/dropout_kernel.cpp computes them).
#include <cstdint>

#include "cpu_ops.h"

namespace fastbert {

at::Tensor dropout_keep_mask(int64_t rows, int64_t cols, double p, int64_t seed) {
  const char* op = "dropout_keep_mask";
  TORCH_CHECK(rows >= 0 && cols >= 0, "fastbert._C.", op, ": rows and cols must be >= 0, got ", rows, ", ", cols);
  detail::check_dropout(op, p, seed);
  at::Tensor mask = detail::empty({rows, cols}, at::kBool);
  if (rows == 0 || cols == 0) return mask;
  detail::kernels_for(op).dropout_keep_mask(mask.data_ptr<bool>(), rows, cols, p, static_cast<uint64_t>(seed));
  return mask;
}

namespace {
void check_counters(const char* op, int64_t seed, int64_t start, int64_t count) {
  TORCH_CHECK(seed >= 0, "fastbert._C.", op, ": seed must be in [0, 2**63), got ", seed);
  TORCH_CHECK(start >= 0 && count >= 0 && count <= INT64_MAX - start, "fastbert._C.", op,
              ": need start >= 0, count >= 0 and start + count < 2**63, got ", start, ", ", count);
}
}  // namespace

at::Tensor philox_uint32(int64_t seed, int64_t start, int64_t count) {
  const char* op = "philox_uint32";
  check_counters(op, seed, start, count);
  at::Tensor out = detail::empty({count}, at::kLong);
  if (count > 0) detail::kernels_for(op).philox_uint32(out.data_ptr<int64_t>(), static_cast<uint64_t>(seed), start, count);
  return out;
}

at::Tensor philox_uint32_scalar(int64_t seed, int64_t start, int64_t count) {
  const char* op = "philox_uint32_scalar";
  check_counters(op, seed, start, count);
  at::Tensor out = detail::empty({count}, at::kLong);
  if (count > 0) {
    detail::kernels_for(op).philox_uint32_scalar(out.data_ptr<int64_t>(), static_cast<uint64_t>(seed), start, count);
  }
  return out;
}

}  // namespace fastbert
