// What the kernels of a kernel library take from the host (api.h): torch's thread pool and the
// BLAS, set once by fastbert_kernel_table (table.cpp).
#pragma once

#include <algorithm>
#include <atomic>
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

// f(i) for every i in [0, n), handed out one index at a time from a shared counter to the threads
// of one parallel region: a thread that starts late, or is held up, does fewer of them instead of
// keeping the others waiting.
template <class F>
void for_each_claimed(int64_t n, const F& f) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min(num_threads(), n));
  parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
  });
}

}  // namespace kernels
}  // namespace fastbert
