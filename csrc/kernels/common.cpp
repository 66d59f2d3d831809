// What the kernels of common.h share out of line: the fixed-order sum of gradient partials.
#include "common.h"

namespace fastbert {
namespace kernels {

void sum_partials(const double* partials, int64_t chunks, int64_t stride, int64_t n, Dtype dtype, void* out) {
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    // columns in parallel; each column is summed over chunks 0, 1, 2, ... whatever the split
    parallel_for(0, n, 1024, [&](int64_t j0, int64_t j1) {
      constexpr int64_t kBlock = 256;
      double acc[kBlock];
      for (int64_t j = j0; j < j1; j += kBlock) {
        const int64_t len = std::min(j1 - j, kBlock);
        for (int64_t i = 0; i < len; ++i) acc[i] = 0.0;
        for (int64_t k = 0; k < chunks; ++k) {
          const double* row = partials + k * stride + j;
          for (int64_t i = 0; i < len; ++i) acc[i] += row[i];
        }
        for (int64_t i = 0; i < len; ++i) o[j + i] = static_cast<T>(static_cast<float>(acc[i]));
      }
    });
  });
}

}  // namespace kernels
}  // namespace fastbert
