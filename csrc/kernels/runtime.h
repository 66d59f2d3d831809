// What the kernels of a kernel library take from the host (api.h): torch's thread pool and the
// BLAS, set once by fastbert_kernel_table (table.cpp).
#pragma once

#include <cstdint>

#include "api.h"

namespace fastbert {
namespace kernels {

const Host& host();

// f(b, e) over ranges [b, e) that split [begin, end) (at::parallel_for on the host's thread pool).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  host().parallel_for(
      begin, end, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

inline int64_t num_threads() { return host().num_threads(); }

}  // namespace kernels
}  // namespace fastbert
