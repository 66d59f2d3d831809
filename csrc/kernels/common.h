// What the kernels of a kernel library share: dtype dispatch over api.h's Dtype, the per-feature
// parameters as padded fp32, the fixed-order gradient reduction, and row helpers.
// Tensors are [rows, hidden] contiguous (the host has checked them); math runs in fp32 whatever the
// storage dtype (float32, float16, bfloat16).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "api.h"
#include "runtime.h"
#include "vec.h"

namespace fastbert {
namespace kernels {

// The fp32 vector every kernel computes in, and its lane count (the step of a row loop).
using vec::Vf;
constexpr int64_t W = vec::kWidth;

// Calls f(T{}) with T the C++ type of a float dtype (float, c10::Half or c10::BFloat16).
template <class F>
inline void dispatch_float(Dtype t, F&& f) {
  switch (t) {
    case Dtype::kHalf:
      f(c10::Half{});
      break;
    case Dtype::kBFloat16:
      f(c10::BFloat16{});
      break;
    default:
      f(float{});
      break;
  }
}

// Calls f(std::bool_constant<a>{}, std::bool_constant<b>{}): runtime flags to template flags.
template <class F>
inline void dispatch_flags(bool a, bool b, F&& f) {
  if (a) {
    if (b)
      f(std::true_type{}, std::true_type{});
    else
      f(std::true_type{}, std::false_type{});
  } else {
    if (b)
      f(std::false_type{}, std::true_type{});
    else
      f(std::false_type{}, std::false_type{});
  }
}

// Buffer slots of vec::thread_buffer: row scratch in every worker thread, and the per-call
// vectors of the calling thread (which is also worker 0 of the parallel region).
enum Slot : int { kSlotRow = 0, kSlotKeep = 1, kSlotSums = 2, kSlotPartials = 3, kSlotParamA = 4, kSlotParamB = 5 };

// A per-feature vector of n values as fp32, zero-padded to `padded` elements so that whole-vector
// loads past n are safe; lives in the calling thread's buffer `kSlot`.
template <int kSlot>
inline const float* padded_float(Param v, int64_t n, int64_t padded) {
  float* out = vec::thread_buffer<float, kSlot>(padded);
  if (v.p == nullptr) {  // an absent vector (a LayerNorm without bias): zeros
    for (int64_t i = 0; i < padded; ++i) out[i] = 0.0f;
    return out;
  }
  dispatch_float(v.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(v.p);
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  });
  for (int64_t i = n; i < padded; ++i) out[i] = 0.0f;
  return out;
}

// Rows per reduction chunk for the per-feature gradient sums. It depends on the row count only,
// never on the thread count, so the sums (per chunk in row order, then over chunks in chunk order)
// are bit-identical whatever torch.get_num_threads() is.
constexpr int64_t kReduceChunks = 64;
inline int64_t reduce_chunk_rows(int64_t rows) {
  int64_t r = (rows + kReduceChunks - 1) / kReduceChunks;
  return r < 1 ? 1 : r;
}

// Per-feature gradient sums run in fp32 over groups of kFlushRows rows, which flush_sums adds into
// the chunk's double partials (and zeroes): cheap adds in the row loop, double where sums get long.
constexpr int64_t kFlushRows = 8;
inline void flush_sums(float* acc, double* partial, int64_t npad) {
  const vec::Vf zero = vec::set1(0.0f);
  for (int64_t c = 0; c < npad; c += vec::kWidth) {
    vec::add_to_double(partial + c, vec::load(acc + c));
    vec::store(acc + c, zero);
  }
}

// out[j] (dtype) = the sum of partials[k * stride + j] (double) over k < chunks, in chunk order, j < n.
void sum_partials(const double* partials, int64_t chunks, int64_t stride, int64_t n, Dtype dtype, void* out);

// Whether a [rows, n] output at p is written with non-temporal stores: when it is far larger than
// the caches it would only evict other data on its way out, and its rows are vector-aligned.
template <class T>
inline bool stream_output(const T* p, int64_t rows, int64_t n) {
  constexpr int64_t kStreamBytes = int64_t{4} << 20;
  return rows * n * static_cast<int64_t>(sizeof(T)) >= kStreamBytes && vec::rows_aligned(p, n);
}

// 1 / sqrt(variance + eps) of a LayerNorm row h of n values about `mean` (fp32, padded to npad, a
// multiple of vec::kWidth, with lanes n .. npad holding the mean so that they add nothing).
inline float row_rstd(const float* h, int64_t npad, int64_t n, float mean, float eps) {
  const vec::Vf mv = vec::set1(mean);
  vec::Vf v0 = vec::set1(0.0f), v1 = vec::set1(0.0f);
  int64_t c = 0;
  for (; c + 2 * vec::kWidth <= npad; c += 2 * vec::kWidth) {
    vec::Vf d0 = vec::load(h + c) - mv, d1 = vec::load(h + c + vec::kWidth) - mv;
    v0 = vec::fmadd(d0, d0, v0);
    v1 = vec::fmadd(d1, d1, v1);
  }
  for (; c < npad; c += vec::kWidth) {
    vec::Vf d = vec::load(h + c) - mv;
    v0 = vec::fmadd(d, d, v0);
  }
  const float var = vec::hsum(v0 + v1) / n;
  return 1.0f / std::sqrt(std::max(var, 0.0f) + eps);
}

// Row grain of parallel_for for elementwise row loops (does not change any result).
inline int64_t row_grain(int64_t cols) {
  int64_t g = 32768 / (cols > 0 ? cols : 1);
  return g < 1 ? 1 : g;
}

}  // namespace kernels
}  // namespace fastbert
