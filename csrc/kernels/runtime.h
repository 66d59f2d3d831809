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

inline int64_t num_threads() { return host().num_threads(); }

// Claims a thread may make in one parallel region (parallel_for, the packed int8 GEMM's tasks).
constexpr int64_t kClaimsPerThread = 4;

// f(b, e) over ranges [b, e) split statically among the threads (at::parallel_for on the host's
// thread pool): one range a thread at most.
template <class F>
void split_among_threads(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  host().parallel_for(
      begin, end, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// f(i) for every i in [0, n), handed out one index at a time from a shared counter to the threads
// of one parallel region: a thread that starts late, or is held up, does fewer of them instead of
// keeping the others waiting.
template <class F>
void for_each_claimed(int64_t n, const F& f) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min(num_threads(), n));
  split_among_threads(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
  });
}

// f(b, e) over ranges [b, e) that split [begin, end), each about `grain` long or more. When there
// are more such ranges than threads, up to kClaimsPerThread a thread are claimed in turn
// (for_each_claimed): on cores shared with other work (a server's event loop, a neighbour's
// process) a thread the scheduler holds up then leaves its ranges to the others instead of keeping
// them waiting at the region's end (what that costs: benchmarks/LOG.md, "fastbert serve at 64
// clients: work claimed, not shared out"). The ranges' bounds depend on
// n, grain and the thread count only, never on which thread runs them.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin, g = std::max<int64_t>(1, grain), threads = num_threads();
  const int64_t ranges = std::min((n + g - 1) / g, threads * kClaimsPerThread);
  if (threads <= 1 || ranges <= threads) return split_among_threads(begin, end, grain, f);
  for_each_claimed(ranges, [&](int64_t i) { f(begin + n * i / ranges, begin + n * (i + 1) / ranges); });
}

}  // namespace kernels
}  // namespace fastbert
