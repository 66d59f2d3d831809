// The interface between the extension fastbert._C (the host: input checks, output allocation and
// the Python bindings, compiled once for the baseline CPU) and the kernel libraries
// fastbert/_kernels_<level>.so, which hold the vectorised kernels, compiled once per instruction-set
// level from the same sources (setup.py has the levels and their flags).
//
// The host loads the libraries of the level it runs at and the levels below it (dispatch.cpp) and
// calls the kernels through one Table of function pointers; a library may leave an entry empty
// (nullptr), and then the entry of the level below it stands. Only plain types cross: a kernel
// library links nothing of torch, takes the host's thread pool and BLAS through Host, and exports
// nothing but fastbert_kernel_table (every other symbol is hidden), so no inline function compiled
// for one level can ever stand in for another level's.
//
// Tensors are raw pointers to contiguous memory with their sizes (and strides where the layout is
// not contiguous); the host has checked every shape, dtype and value before a kernel is called, so
// kernels check nothing and never fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace fastbert {
namespace kernels {

constexpr int kAbiVersion = 7;

// The activation of a gated linear unit's gate (geglu_forward / _backward): GELU's exact erf form,
// its tanh approximation (GeGLU), or SiLU, x sigmoid(x) (SwiGLU).
enum class Gate : int32_t { kGeluErf = 0, kGeluTanh, kSilu };

// The storage type of a tensor.
enum class Dtype : int32_t { kFloat = 0, kHalf, kBFloat16, kInt32, kInt8, kUInt8, kInt16, kInt64, kBool };

// The Fortran-ABI sgemm_ of the BLAS torch links (MKL in the x86 wheels).
using Sgemm = void (*)(char* transa, char* transb, int* m, int* n, int* k, float* alpha, const float* a, int* lda,
                       const float* b, int* ldb, float* beta, float* c, int* ldc);
// MKL's gemm_bf16bf16f32_ (Fortran ABI): C (fp32) = alpha op(A) op(B) + beta C, A and B bf16 (their bits).
using Bf16Gemm = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                          const float* alpha, const uint16_t* a, const int* lda, const uint16_t* b, const int* ldb,
                          const float* beta, float* c, const int* ldc);

// What the host lends the kernels.
struct Host {
  // body(ctx, b, e) over ranges [b, e) that split [begin, end), each at least `grain` long but the
  // last, on torch's intra-op thread pool (at::parallel_for); the calling thread is worker 0.
  void (*parallel_for)(int64_t begin, int64_t end, int64_t grain, void (*body)(void* ctx, int64_t b, int64_t e),
                       void* ctx);
  int64_t (*num_threads)();
  Sgemm sgemm;                         // nullptr when torch was built without a BLAS
  int (*blas_threads_local)(int n);    // MKL_Set_Num_Threads_Local: returns the previous count; or nullptr
  Bf16Gemm bf16_gemm;                  // nullptr when the BLAS has no bf16 GEMM
  // whether the int8 GEMMs may run on AMX's tiles now: the CPU has AMX-INT8, the OS has granted this
  // process the tile state, the level is avx512_vnni or above, and fastbert._C.set_int8_amx allows it
  bool (*int8_amx)();
};

// A per-feature vector [n] (a bias or a LayerNorm weight): float32 or the input's dtype.
struct Param {
  const void* p;
  Dtype dtype;
};

// ---------------------------------------------------------------------------------------------
// attention (kernels/attention*.cpp)

// The real rows of one batch entry: [first, first + len); `real` (nullptr when every row of the
// range is real) flags the real ones among them, for masks with holes.
struct AttnSeq {
  int64_t first = 0;
  int64_t len = 0;
  const bool* real = nullptr;
};

// Rows of one head of a tensor: row r (a position of the padded sequence, or a packed token) of
// head h of batch entry b starts at p + b * sb + h * sh + r * sr elements; the last dim is contiguous.
struct AttnView {
  void* p = nullptr;
  int64_t sb = 0, sh = 0, sr = 0;
};

// DeBERTa's disentangled terms of an attention call: float32 [heads, rows, d] position keys
// (content-to-position: query i against row idx(i - j)) and position queries (position-to-content:
// key j against the same row), each term added to the unscaled score of (query i, key j); key or
// query nullptr leaves that term out. index int32 [2 n - 1]: idx(i - j) at i - j + n - 1, in
// [0, rows) and non-decreasing; n >= every sequence's length. dkey, dquery: the backward's float32
// [batch, heads, rows, d] (nullptr where the term is absent), zeroed by the host, per pair.
struct AttnPositions {
  const float* key = nullptr;
  const float* query = nullptr;
  const int32_t* index = nullptr;
  int64_t n = 0, rows = 0;
  float* dkey = nullptr;
  float* dquery = nullptr;
  bool on() const { return key != nullptr || query != nullptr; }
};

struct AttnArgs {
  Dtype dtype = Dtype::kFloat;     // of q, k, v, out, dout and the gradients
  bool padded = false;             // [batch, heads, rows, d] (padded) or [rows, heads, d] (packed)
  int64_t batch = 0, heads = 0, rows = 0, d = 0;
  int64_t pad_rows = 0;            // padded layout: rows per (b, h), those outside a sequence are zeroed; packed: 0
  float scale = 1.0f;
  double dropout_p = 0.0;
  uint64_t seed = 0;
  const AttnSeq* seqs = nullptr;   // [batch]
  AttnView q, k, v, out;           // out: written by the forward, unused by the backward
  AttnView dout, dq, dk, dv;       // the backward's
  float* lse = nullptr;            // float32, row r of (b, h) at lse + b * lse_sb + h * lse_sh + r
  int64_t lse_sb = 0, lse_sh = 0;
  // Rotary embedding of q and k (nullptr: none): float32 [positions, d / 2] cos and sin of each
  // position's angles; a row's position is its row index (padded) or its index in its sequence (packed)
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  // Local attention: a query sees the keys at most `window` rows away on either side; < 0: all keys
  int64_t window = -1;
  // Relative position bias (nullptr: none): float32 [heads, 2 rel_n - 1], entry j - i + rel_n - 1 of head
  // h added to the scaled score of (query i, key j); rel_n >= every sequence's length. rel_grad: the
  // backward's float32 [batch, heads, 2 rel_n - 1], zeroed by the host, the gradient of each pair
  const float* rel_bias = nullptr;
  int64_t rel_n = 0;
  float* rel_grad = nullptr;
  AttnPositions pos;               // DeBERTa's disentangled terms (none: both tables nullptr)
  // bf16 q, k, v: the forward's two products on the BLAS's bf16 GEMM (Host::bf16_gemm) for the
  // sequences of at least this many tokens, the softmax's weights rounded to bf16 for the second
  // (-1: none); set where the CPU multiplies bf16 natively, from a length measured there
  int64_t bf16_min_len = -1;
};

// ---------------------------------------------------------------------------------------------
// int8 inference (kernels/int8_kernel.cpp, kernels/int8_gemm.cpp): see csrc/int8.cpp for the scheme

// An int8 GEMM's accumulator acc [rows + 1, n] (int32 or float32; its last row: the weight's column
// sums) with what dequantizes it: (acc * row_scale + row_offset * acc[rows]) * col_scale + bias.
struct Int8Acc {
  const void* acc;
  Dtype dtype;                     // kInt32 or kFloat
  int64_t rows, n;
  const float* row_scale;          // [rows]
  const float* row_offset;         // [rows]
  const float* col_scale;          // [n]
  Param bias;                      // p == nullptr: no bias
};

// Where quantized rows go: q [rows + 1, n] (the host has set its last row to ones), scale and offset [rows].
struct Int8Rows {
  int8_t* q;
  float* scale;
  float* offset;
};

// ---------------------------------------------------------------------------------------------
// token masking (kernels/masking_rows.cpp; the plan is in masking_plan.h)

}  // namespace kernels
namespace masking {
struct Plan;
struct ChunkResult;
}  // namespace masking
namespace kernels {

// ---------------------------------------------------------------------------------------------
// The table. X(name, return type, parameters...) for every entry, in a fixed order.

#define FASTBERT_KERNEL_ENTRIES(X)                                                                                    \
  /* gelu(x + bias), x and y [m, n] */                                                                                \
  X(bias_gelu_forward, void, Dtype dtype, const void* x, Param bias, void* y, int64_t m, int64_t n, bool tanh)       \
  /* dx = dy * gelu'(x + bias), dbias (bias's dtype) = column sums of dx, thread-count independent */                 \
  X(bias_gelu_backward, void, Dtype dtype, const void* dy, const void* x, Param bias, void* dx, void* dbias,          \
    int64_t m, int64_t n, bool tanh)                                                                                  \
  /* y [m, n] = act(x[:, :n]) * x[:, n:], x [m, 2n], act the gate's activation (GELU: GeGLU, SiLU: SwiGLU) */        \
  X(geglu_forward, void, Dtype dtype, const void* x, void* y, int64_t m, int64_t n, Gate gate)                        \
  /* dx [m, 2n] = (dy * x[:, n:] * act'(x[:, :n]), dy * act(x[:, :n])) */                                             \
  X(geglu_backward, void, Dtype dtype, const void* dy, const void* x, void* dx, int64_t m, int64_t n, Gate gate)      \
  /* y = layer_norm(h) * weight + bias (none when bias.p is nullptr), h = dropout(x) + residual; mean, rstd */        \
  /* float32 [m]; h itself into sum (x's dtype) unless sum is nullptr; rms: an RMSNorm (mean 0, no bias) */           \
  X(add_layer_norm_forward, void, Dtype dtype, const void* x, const void* residual, Param weight, Param bias,         \
    void* y, void* sum, float* mean, float* rstd, int64_t m, int64_t n, float eps, double dropout_p, uint64_t seed,   \
    bool rms)                                                                                                         \
  /* dx, dresidual (x's dtype), dweight, dbias (weight's dtype) from dy and, unless nullptr, dsum (h's gradient) */   \
  X(add_layer_norm_backward, void, Dtype dtype, const void* dy, const void* dsum, const void* x,                     \
    const void* residual, Param weight, const float* mean, const float* rstd, void* dx, void* dresidual,             \
    void* dweight, void* dbias, int64_t m, int64_t n, double dropout_p, uint64_t seed, bool rms)                      \
  /* out [rows, cols]: the elements the dropout rule keeps */                                                         \
  X(dropout_keep_mask, void, bool* out, int64_t rows, int64_t cols, double p, uint64_t seed)                          \
  /* out[i] = Philox word 0 of counter start + i, by the vector code / one counter at a time */                       \
  X(philox_uint32, void, int64_t* out, uint64_t seed, int64_t start, int64_t count)                                  \
  X(philox_uint32_scalar, void, int64_t* out, uint64_t seed, int64_t start, int64_t count)                           \
  /* attention of every (sequence, head) pair: out and lse / dq, dk and dv */                                         \
  X(attention_forward, void, const AttnArgs& args)                                                                    \
  X(attention_backward, void, const AttnArgs& args)                                                                   \
  /* bool out [batch, heads, n, n]: the dropout keep-mask, counters from starts[b] */                                 \
  X(attention_keep_mask, void, const AttnArgs& args, const int64_t* starts, int64_t n, bool* out)                    \
  /* x [rows, n] float quantized per row */                                                                           \
  X(quantize_rows, void, Dtype dtype, const void* x, int64_t rows, int64_t n, Int8Rows out)                          \
  /* the dequantized accumulator as `dtype` y [rows, n] */                                                            \
  X(int8_dequantize, void, const Int8Acc& acc, Dtype dtype, void* y)                                                 \
  /* quantize_rows(gelu(the dequantized accumulator)) */                                                              \
  X(int8_bias_gelu, void, const Int8Acc& acc, bool tanh, Int8Rows out)                                               \
  /* quantize_rows(act(h[:, :n]) * h[:, n:]), h [rows, 2n] the dequantized accumulator (acc.n = 2n) */              \
  X(int8_glu, void, const Int8Acc& acc, Gate gate, Int8Rows out)                                                      \
  /* y = layer_norm(h) * weight + ln_bias, h = dequantized + residual (residual's dtype); quantized too when out, */  \
  /* h itself into sum (residual's dtype) unless sum is nullptr */                                                    \
  X(int8_add_layer_norm, void, const Int8Acc& acc, Dtype dtype, const void* residual, Param weight, Param ln_bias,   \
    float eps, void* y, const Int8Rows* out, void* sum)                                                               \
  /* c [m, n] int32 (row stride ldc) = a [m, k] int8 (lda) . b [n, k] int8 (ldb)^T, exact */                          \
  X(int8_gemm, void, const int8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc, int64_t m, \
    int64_t n, int64_t k)                                                                                             \
  /* the same with b packed: bp [n / 16][ceil(k / 4)][16][4] (kernels/int8_gemm_packed.cpp), n a multiple of 16 */  \
  X(int8_gemm_packed, void, const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t m,      \
    int64_t n, int64_t k)                                                                                             \
  /* c [m, n] float32 (ldc) = a [m, k] (lda) . b [n, k] (ldb)^T (+ bias [n] when not nullptr), b read as it lies */   \
  X(f32_dot_gemm, void, const float* a, int64_t lda, const float* b, int64_t ldb, const float* bias, float* c,       \
    int64_t ldc, int64_t m, int64_t n, int64_t k)                                                                     \
  /* the pass of mask_tokens over rows [0, rows): one result per fixed chunk of rows */                               \
  X(mask_rows, std::vector<masking::ChunkResult>, const masking::Plan& plan, int64_t rows)

#define FASTBERT_KERNEL_FIELD(name, ret, ...) ret (*name)(__VA_ARGS__) = nullptr;

// Instruction-set extensions a library was compiled to use (Table::features); the host loads a
// library only on a CPU (and OS) that has all of them.
enum Feature : uint64_t {
  kAvx2 = 1,          // AVX2 + FMA + F16C (x86-64-v3)
  kAvx512 = 2,        // AVX-512 F, BW, CD, DQ, VL (x86-64-v4)
  kAvx512Vnni = 4,
  kAvx512Bf16 = 8,
  kAmx = 16,          // AMX-TILE, AMX-INT8, AMX-BF16
};

struct Table {
  int abi_version = kAbiVersion;
  const char* level = nullptr;     // the level the library was compiled for ("avx2", ...)
  uint64_t features = 0;           // Feature bits its code needs
  int64_t vector_bytes = 0;        // the width of its float vectors (4, 32 or 64)
  FASTBERT_KERNEL_ENTRIES(FASTBERT_KERNEL_FIELD)
};

#undef FASTBERT_KERNEL_FIELD

}  // namespace kernels
}  // namespace fastbert

// The one symbol a kernel library exports: its table (entries it does not provide are nullptr),
// once `host` is set; nullptr when abi_version is not the library's.
extern "C" const fastbert::kernels::Table* fastbert_kernel_table(const fastbert::kernels::Host* host, int abi_version);
