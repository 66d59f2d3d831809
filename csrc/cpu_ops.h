// The host side of fastbert._C: the entry points the bindings expose (each checks its input,
// allocates its outputs and calls the kernel library of the CPU's instruction-set level through
// kernels/api.h's table) and the helpers they share. Tensors are [rows, hidden] contiguous CPU
// tensors (the Python layer in fastbert/ops reshapes and validates; the checks here keep a direct
// call from crashing). Math runs in fp32 whatever the storage dtype (float32, float16, bfloat16);
// outputs come back in the input dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/api.h"

namespace fastbert {

// bias_gelu.cpp: bias_gelu and geglu
at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, const std::string& approximate);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                      const at::Tensor& bias, const std::string& approximate);
at::Tensor geglu_forward(const at::Tensor& x, const std::string& approximate);
at::Tensor geglu_backward(const at::Tensor& dy, const at::Tensor& x, const std::string& approximate);

// layer_norm.cpp
// bias: None for a LayerNorm without bias (ModernBERT's). The forward returns (y, mean, rstd, sum):
// sum is h = dropout(x) + residual when return_sum (the residual stream of a pre-LN model), else
// undefined; the backward adds dsum, h's gradient, when it is given. rms: an RMSNorm (no bias; mean 0).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
    double eps, double dropout_p, int64_t seed, bool return_sum, bool rms = false);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
    const at::Tensor& mean, const at::Tensor& rstd, double dropout_p, int64_t seed,
    const c10::optional<at::Tensor>& dsum, bool rms = false);

// dropout.cpp
at::Tensor dropout_keep_mask(int64_t rows, int64_t cols, double p, int64_t seed);
at::Tensor philox_uint32(int64_t seed, int64_t start, int64_t count);         // the kernels' vector path
at::Tensor philox_uint32_scalar(int64_t seed, int64_t start, int64_t count);  // one counter at a time
// attention.cpp (the kernels: kernels/attention*.cpp):
// q, k, v [batch, heads, seq, head_dim] (padded) or [tokens, heads, head_dim] (packed), one float
// dtype, last dim contiguous. lse: float32 [batch, heads, seq] / [heads, tokens]. keep: the
// bool dropout keep-mask [batch, heads, n, n] when asked for, else an empty bool tensor of shape [0].
// rope_cos, rope_sin: none, or the float32 [positions, head_dim / 2] rotary tables of q and k
// (fastbert.reference.rotary; position: the row index padded, the index in the sequence packed).
// window >= 0: local attention, a query sees the keys at most `window` rows away; < 0: every key.
// rel_bias: none, or float32 [heads, 2n - 1] (n >= every sequence's length), entry j - i + n - 1 added
// to the scaled score of query i and key j. The backward returns its gradient fourth (else empty).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& key_mask,
    double scale, double dropout_p, int64_t seed, bool return_dropout_mask, const c10::optional<at::Tensor>& rope_cos,
    const c10::optional<at::Tensor>& rope_sin, int64_t window, const c10::optional<at::Tensor>& rel_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const c10::optional<at::Tensor>& key_mask, double scale, double dropout_p, int64_t seed,
    const c10::optional<at::Tensor>& rope_cos, const c10::optional<at::Tensor>& rope_sin, int64_t window,
    const c10::optional<at::Tensor>& rel_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens, int64_t max_seqlen,
    double scale, double dropout_p, int64_t seed, bool return_dropout_mask, const c10::optional<at::Tensor>& rope_cos,
    const c10::optional<at::Tensor>& rope_sin, int64_t window, const c10::optional<at::Tensor>& rel_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& cu_seqlens, int64_t max_seqlen, double scale, double dropout_p,
    int64_t seed, const c10::optional<at::Tensor>& rope_cos, const c10::optional<at::Tensor>& rope_sin, int64_t window,
    const c10::optional<at::Tensor>& rel_bias);
// DeBERTa's disentangled attention: softmax((q k^T + c2p + p2c) * scale, padded keys masked) v with
// c2p[i, j] = q_i . pos_key[h, pos_index[i - j + n - 1]], p2c[i, j] = k_j . pos_query[h, the same row]
// (pos_key, pos_query: float [heads, rows, head_dim], either may be none; pos_index int32 [2n - 1],
// non-decreasing rows, n >= every sequence's length). Packed rows when cu_seqlens is given (q
// [tokens, heads, head_dim], lse [heads, tokens]), else padded with key_mask (q [batch, heads, seq,
// head_dim], lse [batch, heads, seq]). Dropout as attention_forward's. The backward returns dq, dk,
// dv, then the tables' gradients (each in its table's dtype, or an empty tensor).
std::tuple<at::Tensor, at::Tensor> disentangled_attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& key_mask,
    const c10::optional<at::Tensor>& cu_seqlens, const c10::optional<at::Tensor>& pos_key,
    const c10::optional<at::Tensor>& pos_query, const at::Tensor& pos_index, double scale, double dropout_p,
    int64_t seed);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> disentangled_attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const c10::optional<at::Tensor>& key_mask, const c10::optional<at::Tensor>& cu_seqlens,
    const c10::optional<at::Tensor>& pos_key, const c10::optional<at::Tensor>& pos_query, const at::Tensor& pos_index,
    double scale, double dropout_p, int64_t seed);

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
// quantize_rows(act(h[:, :n]) * h[:, n:]) of the dequantized acc h [rows, 2n] (a gated feed-forward's joined
// gate and up products), gate "none" / "tanh" (GELU's forms) or "silu"
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_glu(const at::Tensor& acc, const at::Tensor& row_scale,
                                                        const at::Tensor& row_offset, const at::Tensor& col_scale,
                                                        const c10::optional<at::Tensor>& bias, const std::string& gate);
// int8_add_layer_norm: (y, q, scale, offset, sum), sum (the dequantized acc + residual, residual's
// dtype) when return_sum, else undefined
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_add_layer_norm(
    const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset, const at::Tensor& col_scale,
    const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& ln_bias,
    double eps, bool quantize, bool return_sum);
// The same four on the product a [rows + 1, k] (quantized rows) @ bp^T (a packed weight) instead of its
// accumulator, made in chunks of rows each of which its epilogue takes while it is in cache (the same
// bits as the product, then the op).
at::Tensor int8_packed_dequantize(const at::Tensor& a, const at::Tensor& bp, const at::Tensor& row_scale,
                                  const at::Tensor& row_offset, const at::Tensor& col_scale,
                                  const c10::optional<at::Tensor>& bias, at::ScalarType dtype);
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_packed_bias_gelu(const at::Tensor& a, const at::Tensor& bp,
                                                                     const at::Tensor& row_scale,
                                                                     const at::Tensor& row_offset,
                                                                     const at::Tensor& col_scale,
                                                                     const at::Tensor& bias,
                                                                     const std::string& approximate);
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_packed_glu(const at::Tensor& a, const at::Tensor& bp,
                                                               const at::Tensor& row_scale, const at::Tensor& row_offset,
                                                               const at::Tensor& col_scale,
                                                               const c10::optional<at::Tensor>& bias,
                                                               const std::string& gate);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_packed_add_layer_norm(
    const at::Tensor& a, const at::Tensor& bp, const at::Tensor& row_scale, const at::Tensor& row_offset,
    const at::Tensor& col_scale, const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight,
    const at::Tensor& ln_bias, double eps, bool quantize, bool return_sum);
// The rows a chunk of those products takes: -1 none (the whole accumulator first), 0 by the product's
// width (the default), else that many; returns the previous setting.
int64_t set_int8_chunk_rows(int64_t rows);
// c [m, n] int32 = a [m, k] int8 . b [n, k] int8 ^T, exact (kernels/int8_gemm.cpp); into `out` when given.
at::Tensor int8_gemm(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& out);
// the same with b packed (bp [n / 16, ceil(k / 4), 16, 4], kernels/int8_gemm_packed.cpp), int32 [m, n]
at::Tensor int8_gemm_packed(const at::Tensor& a, const at::Tensor& bp, const c10::optional<at::Tensor>& out);

// dot_gemm.cpp: c [m, n] float32 = a [m, k] . b [n, k]^T (+ bias [n]) with b read as it lies in memory
// (nothing packed), for few rows of a (kernels/dot_gemm_kernel.cpp); into `out` when given.
at::Tensor f32_dot_gemm(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& out);

// encoder_layer.cpp: one post-LN encoder layer for inference in one call, on the GEMM paths given
// (the ids of gemm_path_ids()), bit for bit the separate ops' result. Float: hidden
// [batch, seq, h] (key_mask or none) or packed [tokens, h] (cu_seqlens); weights: the 12 tensors of
// fastbert.ops.LayerWeights. int8: packed rows with their quantized rows (hq, hs, ho); weights: 16
// (see the definition) -> (out, and its quantized rows when quantize_out).
// The GEMM paths the layers run: (fastbert.ops.gemm's name, the id a layer takes, whether it is int8's).
std::vector<std::tuple<std::string, int64_t, bool>> gemm_path_ids();
at::Tensor encoder_layer_forward(const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                                 const std::vector<int64_t>& paths, int64_t heads, double eps1, double eps2,
                                 const std::string& approximate, const c10::optional<at::Tensor>& key_mask,
                                 const c10::optional<at::Tensor>& cu_seqlens, int64_t max_seqlen,
                                 const c10::optional<at::Tensor>& rel_bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_encoder_layer_forward(
    const at::Tensor& hidden, const at::Tensor& hq, const at::Tensor& hs, const at::Tensor& ho,
    const std::vector<at::Tensor>& w, const std::vector<int64_t>& paths, int64_t heads, double eps1, double eps2,
    const std::string& approximate, const at::Tensor& cu_seqlens, int64_t max_seqlen,
    const c10::optional<at::Tensor>& rel_bias, bool quantize_out);
// A model's layers one after another (float: encoder_layer_forward's, int8: int8_encoder_layer_forward's,
// quantize_out but on the last): layers[i] = layer i's tensors (12 or 16) then the three parts of each
// joined tensor; paths 4, eps 2 a layer. -> the last layer's output (keep_states: every layer's), or
// nothing where a joined tensor's parts are no longer its slices.
std::vector<at::Tensor> encoder_forward(
    const at::Tensor& hidden, const std::vector<std::vector<at::Tensor>>& layers, const std::vector<int64_t>& paths,
    const std::vector<int64_t>& heads, const std::vector<double>& eps, const std::vector<std::string>& approximate,
    const c10::optional<at::Tensor>& key_mask, const c10::optional<at::Tensor>& cu_seqlens, int64_t max_seqlen,
    const c10::optional<at::Tensor>& rel_bias, bool keep_states);
std::vector<at::Tensor> int8_encoder_forward(
    const at::Tensor& hidden, const at::Tensor& hq, const at::Tensor& hs, const at::Tensor& ho,
    const std::vector<std::vector<at::Tensor>>& layers, const std::vector<int64_t>& paths,
    const std::vector<int64_t>& heads, const std::vector<double>& eps, const std::vector<std::string>& approximate,
    const at::Tensor& cu_seqlens, int64_t max_seqlen, const c10::optional<at::Tensor>& rel_bias, bool keep_states);

// padding.cpp: (indices int64 [total_tokens], cu_seqlens int32 [batch + 1], max_seqlen) of a [batch, seq] mask
std::tuple<at::Tensor, at::Tensor, int64_t> unpad_indices(const at::Tensor& attention_mask);

// dispatch.cpp: the kernel libraries of the instruction-set levels (kernels/api.h)
std::vector<std::string> cpu_levels();  // the levels this CPU can run, lowest first
// The extensions of api.h's Feature this CPU and its OS support: "avx2", "avx512", "avx512_vnni",
// "avx512_bf16", "amx".
std::vector<std::string> cpu_features();
// Loads the libraries at `paths` (one per level, lowest first: each one's entries stand over the
// ones below) and runs every kernel on them from then on.
void use_kernels(const std::vector<std::string>& levels, const std::vector<std::string>& paths);
std::string kernel_level();  // the level of the topmost library in use, "" before use_kernels
bool attention_bf16_available();  // whether bf16 attention can multiply in bf16 here (AttnArgs::bf16_min_len)
int64_t attention_bf16_min_len();  // from which sequence length it does (-1: none; -1 after use_kernels)
int64_t set_attention_bf16_min_len(int64_t min_len);  // returns the previous setting; >= 0 needs available
bool int8_amx();  // whether the packed int8 GEMM multiplies on AMX's tiles at the level in use

namespace detail {

// a gated unit's activation: GELU's forms ("none", "tanh") or "silu"
inline kernels::Gate gate_of(const char* op, const std::string& gate) {
  TORCH_CHECK(gate == "none" || gate == "tanh" || gate == "silu", "fastbert._C.", op,
              ": the gate must be 'none' or 'tanh' (GELU's forms) or 'silu', got '", gate, "'");
  return gate == "silu" ? kernels::Gate::kSilu : gate == "tanh" ? kernels::Gate::kGeluTanh : kernels::Gate::kGeluErf;
}

inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// The kernels' name of a dtype (float, integer and bool dtypes).
kernels::Dtype dtype_of(at::ScalarType t);
inline kernels::Dtype dtype_of(const at::Tensor& t) { return dtype_of(t.scalar_type()); }

// A contiguous per-feature vector as the kernels take it (the tensor must outlive the call).
inline kernels::Param param(const at::Tensor& t) { return {t.data_ptr(), dtype_of(t)}; }

// The kernel table in use (dispatch.cpp); an error naming `op` when no kernel library is loaded.
const kernels::Table& kernels_for(const char* op);
// The table in use, empty (every entry nullptr) when none is loaded.
const kernels::Table& kernel_table();
// Whether torch exports the BLAS sgemm_ the attention kernels need.
bool has_blas();

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

// A contiguous output like x (large ones on transparent huge pages where the system allows it).
at::Tensor empty_output(const at::Tensor& x);
// An uninitialised contiguous CPU tensor; 4 MiB and more from the reusing mapping allocator.
at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype);
// A zero-filled contiguous CPU tensor.
at::Tensor zeros(at::IntArrayRef sizes, at::ScalarType dtype);

// Two contiguous outputs like x from one allocation; each tensor has its own storage (no
// aliasing: the byte ranges are disjoint) and the memory goes back when both are freed.
// Two separate equal-size allocations freed together make glibc trim its heap whenever their sum
// reaches its trim threshold (twice the adaptive mmap threshold, i.e. twice one output), so every
// call would page-fault both outputs in again; one block of twice the size does not.
std::pair<at::Tensor, at::Tensor> empty_output_pair(const at::Tensor& x);

// Unmaps the large-output mappings kept for reuse (see cpu_common.cpp).
void release_cached_memory();
// The mapping allocator's bytes: kept for reuse, in use, the most ever in use at once (the bound of
// the kept ones); zeros where it is off.
std::array<int64_t, 3> cached_memory();

}  // namespace detail
}  // namespace fastbert
