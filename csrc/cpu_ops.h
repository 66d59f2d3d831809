// The fused CPU ops of fastbert._C and the helpers their .cpp files share.
// Tensors are [rows, hidden] contiguous CPU tensors (the Python layer in fastbert/ops reshapes and
// validates; the checks here only keep a direct call from crashing). Math runs in fp32 whatever the
// storage dtype (float32, float16, bfloat16); outputs come back in the input dtype.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace fastbert {

// bias_gelu.cpp
at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, const std::string& approximate);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                      const at::Tensor& bias, const std::string& approximate);

// layer_norm.cpp
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward(const at::Tensor& x, const at::Tensor& residual,
                                                                       const at::Tensor& weight, const at::Tensor& bias,
                                                                       double eps, double dropout_p, int64_t seed);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
    const at::Tensor& mean, const at::Tensor& rstd, double dropout_p, int64_t seed);

// dropout.cpp
at::Tensor dropout_keep_mask(int64_t rows, int64_t cols, double p, int64_t seed);
at::Tensor philox_uint32(int64_t seed, int64_t start, int64_t count);         // the kernels' vector path
at::Tensor philox_uint32_scalar(int64_t seed, int64_t start, int64_t count);  // one counter at a time
// attention.cpp (the work of a (sequence, head) pair: attention_forward.cpp, attention_backward.cpp):
// q, k, v [batch, heads, seq, head_dim] (padded) or [tokens, heads, head_dim] (packed), one float
// dtype, last dim contiguous. lse: float32 [batch, heads, seq] / [heads, tokens]. keep: the
// bool dropout keep-mask [batch, heads, n, n] when asked for, else an empty bool tensor of shape [0].
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v,
                                                                  const c10::optional<at::Tensor>& key_mask,
                                                                  double scale, double dropout_p, int64_t seed,
                                                                  bool return_dropout_mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const c10::optional<at::Tensor>& key_mask, double scale, double dropout_p, int64_t seed);
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                         const at::Tensor& v,
                                                                         const at::Tensor& cu_seqlens,
                                                                         int64_t max_seqlen, double scale,
                                                                         double dropout_p, int64_t seed,
                                                                         bool return_dropout_mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens, int64_t max_seqlen, double scale, double dropout_p,
    int64_t seed);

// int8.cpp: int8 inference. Quantized activations: (q int8 [rows + 1, n], its last row all ones;
// scale, offset float32 [rows]), x ~ q * scale + offset per row. acc: the int32 (or float32)
// [rows + 1, n] output of an int8 GEMM of such activations with a weight quantized per output channel
// (col_scale float32 [n]); its last row holds the weight's column sums. The layer's output is
// (acc * scale + offset * acc[rows]) * col_scale + bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x);
at::Tensor int8_dequantize(const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset,
                           const at::Tensor& col_scale, const c10::optional<at::Tensor>& bias, at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_bias_gelu(const at::Tensor& acc, const at::Tensor& row_scale,
                                                              const at::Tensor& row_offset,
                                                              const at::Tensor& col_scale, const at::Tensor& bias,
                                                              const std::string& approximate);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_add_layer_norm(
    const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset, const at::Tensor& col_scale,
    const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& ln_bias,
    double eps, bool quantize);

// padding.cpp: (indices int64 [total_tokens], cu_seqlens int32 [batch + 1], max_seqlen) of a [batch, seq] mask
std::tuple<at::Tensor, at::Tensor, int64_t> unpad_indices(const at::Tensor& attention_mask);

// cpu_common.cpp
const char* cpu_isa();  // "avx512", "avx2" or "scalar"

namespace detail {

inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// Calls f(T{}) with T the C++ type of `t` (float, c10::Half or c10::BFloat16).
template <class F>
inline void dispatch_float(at::ScalarType t, const char* op, F&& f) {
  switch (t) {
    case at::kFloat:
      f(float{});
      break;
    case at::kHalf:
      f(c10::Half{});
      break;
    case at::kBFloat16:
      f(c10::BFloat16{});
      break;
    default:
      TORCH_CHECK(false, "fastbert._C.", op, ": unsupported dtype ", t, " (float32, float16, bfloat16)");
  }
}

inline void check_rows(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "fastbert._C.", op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), "fastbert._C.", op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 2, "fastbert._C.", op, ": ", name, " must be 2-D [rows, hidden], got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), "fastbert._C.", op, ": ", name, " must be contiguous");
  TORCH_CHECK(is_float_dtype(t.scalar_type()), "fastbert._C.", op, ": ", name, " has dtype ", t.scalar_type(),
              "; supported: float32, float16, bfloat16");
}

inline void check_like(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  check_rows(op, name, t);
  TORCH_CHECK(t.sizes() == x.sizes(), "fastbert._C.", op, ": ", name, " has shape ", t.sizes(), " but x has shape ",
              x.sizes());
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "fastbert._C.", op, ": ", name, " has dtype ", t.scalar_type(),
              " but x has dtype ", x.scalar_type());
}

// A per-feature vector of x [rows, n]: shape [n], dtype x's or float32, on the CPU.
inline void check_feature(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  TORCH_CHECK(t.defined(), "fastbert._C.", op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), "fastbert._C.", op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 1 && t.size(0) == x.size(1), "fastbert._C.", op, ": ", name, " must have shape [", x.size(1),
              "], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == x.scalar_type() || t.scalar_type() == at::kFloat, "fastbert._C.", op, ": ", name,
              " has dtype ", t.scalar_type(), "; it must be x's dtype (", x.scalar_type(), ") or float32");
}

inline void check_dropout(const char* op, double p, int64_t seed) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "fastbert._C.", op, ": dropout_p must be in [0, 1), got ", p);
  TORCH_CHECK(seed >= 0, "fastbert._C.", op, ": dropout seed must be in [0, 2**63), got ", seed);
}

// Buffer slots of vec::thread_buffer: row scratch in every worker thread, and the per-call
// vectors of the calling thread (which is also worker 0 of the parallel region).
enum Slot : int { kSlotRow = 0, kSlotKeep = 1, kSlotSums = 2, kSlotPartials = 3, kSlotParamA = 4, kSlotParamB = 5 };

// v [n] (float32, float16 or bfloat16) as fp32, zero-padded to `padded` elements so that
// whole-vector loads past n are safe; lives in the calling thread's buffer `kSlot`.
template <int kSlot>
inline const float* padded_float(const at::Tensor& v, int64_t padded) {
  float* out = vec::thread_buffer<float, kSlot>(padded);
  const at::Tensor c = v.contiguous();
  const int64_t n = c.size(0);
  dispatch_float(c.scalar_type(), "padded_float", [&](auto tag) {
    using T = decltype(tag);
    const T* p = c.data_ptr<T>();
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

// Sums the partial rows partials[k * stride + j] (k < chunks, j < n; double) over k, in chunk order,
// into a new [n] tensor of dtype `dtype`.
at::Tensor sum_partials(const double* partials, int64_t chunks, int64_t stride, int64_t n, at::ScalarType dtype);

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

// Row grain of at::parallel_for for elementwise row loops (does not change any result).
inline int64_t row_grain(int64_t cols) {
  int64_t g = 32768 / (cols > 0 ? cols : 1);
  return g < 1 ? 1 : g;
}

// A contiguous output like x (large ones on transparent huge pages where the system allows it).
at::Tensor empty_output(const at::Tensor& x);
// An uninitialised contiguous CPU tensor; 4 MiB and more from the reusing mapping allocator.
at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype);

// Two contiguous outputs like x from one allocation; each tensor has its own storage (no
// aliasing: the byte ranges are disjoint) and the memory goes back when both are freed.
// Two separate equal-size allocations freed together make glibc trim its heap whenever their sum
// reaches its trim threshold (twice the adaptive mmap threshold, i.e. twice one output), so every
// call would page-fault both outputs in again; one block of twice the size does not.
std::pair<at::Tensor, at::Tensor> empty_output_pair(const at::Tensor& x);

// Unmaps the large-output mappings kept for reuse (see cpu_common.cpp).
void release_cached_memory();

}  // namespace detail
}  // namespace fastbert
