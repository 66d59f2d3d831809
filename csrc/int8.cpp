// int8 inference's element-wise ops: their checks and outputs. The scheme and the kernels are in
// kernels/int8_kernel.cpp (the epilogue of every int8 GEMM fused into the op that consumes its output, the
// quantization of every GEMM input into the op that produces it), the GEMM in kernels/int8_gemm.cpp.
#include <algorithm>
#include <atomic>
#include <functional>

#include "cpu_ops.h"

namespace fastbert {
namespace {

using kernels::Int8Acc;
using kernels::Int8Rows;

void check_int8_rows(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kChar && t.dim() == 2, "fastbert._C.", op,
              ": ", name, " must be a 2-D int8 CPU tensor, got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, "fastbert._C.", op, ": ", name, " must have contiguous rows");
}

// row_scale, row_offset float32 [rows]; col_scale float32 [n]; bias absent or a float vector [n]:
// the dequantizing half of an Int8Acc (acc left unset). The view keeps pointers into them (and into
// `bias_c`, bias made contiguous, which the caller keeps alive).
Int8Acc check_scales(const char* op, int64_t rows, int64_t n, const at::Tensor& row_scale,
                     const at::Tensor& row_offset, const at::Tensor& col_scale,
                     const c10::optional<at::Tensor>& bias, at::Tensor& bias_c) {
  for (const at::Tensor* t : {&row_scale, &row_offset}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 1 && t->size(0) == rows &&
                    t->is_contiguous(),
                "fastbert._C.", op, ": row scales and offsets must be contiguous float32 [", rows, "], got ",
                t->scalar_type(), " ", t->sizes());
  }
  TORCH_CHECK(col_scale.device().is_cpu() && col_scale.scalar_type() == at::kFloat && col_scale.dim() == 1 &&
                  col_scale.size(0) == n && col_scale.is_contiguous(),
              "fastbert._C.", op, ": col_scale must be contiguous float32 [", n, "], got ", col_scale.scalar_type(),
              " ", col_scale.sizes());
  kernels::Param b{nullptr, kernels::Dtype::kFloat};
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->dim() == 1 && bias->size(0) == n &&
                    detail::is_float_dtype(bias->scalar_type()),
                "fastbert._C.", op, ": bias must be a float CPU vector [", n, "], got ", bias->sizes());
    bias_c = bias->contiguous();
    b = detail::param(bias_c);
  }
  return Int8Acc{nullptr, kernels::Dtype::kInt32, rows, n, row_scale.data_ptr<float>(), row_offset.data_ptr<float>(),
                 col_scale.data_ptr<float>(), b};
}

// acc [rows + 1, n] int32 / float32 contiguous, and check_scales' for its rows and columns.
Int8Acc check_acc(const char* op, const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset,
                  const at::Tensor& col_scale, const c10::optional<at::Tensor>& bias, at::Tensor& bias_c) {
  TORCH_CHECK(acc.device().is_cpu() && acc.dim() == 2 && acc.is_contiguous() && acc.size(0) >= 1, "fastbert._C.", op,
              ": acc must be a contiguous [rows + 1, n] CPU tensor, got shape ", acc.sizes());
  TORCH_CHECK(acc.scalar_type() == at::kInt || acc.scalar_type() == at::kFloat, "fastbert._C.", op,
              ": acc must be int32 or float32, got ", acc.scalar_type());
  Int8Acc a = check_scales(op, acc.size(0) - 1, acc.size(1), row_scale, row_offset, col_scale, bias, bias_c);
  a.acc = acc.data_ptr();
  a.dtype = detail::dtype_of(acc);
  return a;
}

// Rows of an int8 product made at a time when its epilogue follows (int8_packed_*): -1 none (the
// whole accumulator, then the epilogue), 0 chosen by the product's width, else that many.
std::atomic<int64_t> g_chunk_rows{0};

// The accumulator's bytes a chunk keeps: its int32 [rows, n] stays in the two cores' L2 (each core
// makes half of the columns) until the epilogue reads it. Written to memory out of the caches and read
// back, the whole accumulator took the product twice as long (benchmarks/LOG.md, "AMX as a kernel level").
constexpr int64_t kChunkBytes = int64_t{2} << 20;

int64_t chunk_rows_for(int64_t n) {
  const int64_t set = g_chunk_rows.load();
  if (set != 0) return set;
  return std::max<int64_t>(64, kChunkBytes / (4 * std::max<int64_t>(n, 1)) / 16 * 16);
}

// An epilogue run on part of an accumulator: (that part, its first row among all the rows).
using Epilogue = std::function<void(const Int8Acc&, int64_t)>;
// What runs an epilogue over every row of an accumulator whose dequantizing half is given.
using AccRows = std::function<void(const Int8Acc&, const Epilogue&)>;

// The accumulator check_acc took, whole.
void whole_acc(const Int8Acc& acc, const Epilogue& epilogue) { epilogue(acc, 0); }

// a [rows + 1, k] (quantized rows, the last the ones) and bp (a packed weight [n / 16, ceil(k / 4), 16,
// 4]) checked, and check_scales' for the product's rows and columns.
Int8Acc check_packed(const char* op, const at::Tensor& a, const at::Tensor& bp, const at::Tensor& row_scale,
                     const at::Tensor& row_offset, const at::Tensor& col_scale, const c10::optional<at::Tensor>& bias,
                     at::Tensor& bias_c) {
  check_int8_rows(op, "a", a);
  TORCH_CHECK(a.size(0) >= 1, "fastbert._C.", op, ": a must be quantized rows [rows + 1, k], got ", a.sizes());
  const int64_t k = a.size(1);
  TORCH_CHECK(bp.defined() && bp.device().is_cpu() && bp.scalar_type() == at::kChar && bp.dim() == 4 &&
                  bp.size(1) == (k + 3) / 4 && bp.size(2) == 16 && bp.size(3) == 4 && bp.is_contiguous(),
              "fastbert._C.", op, ": bp must be a contiguous int8 weight packed [n / 16, ", (k + 3) / 4, ", 16, 4] for "
              "a's ", k, " features, got ", bp.scalar_type(), " ", bp.sizes());
  return check_scales(op, a.size(0) - 1, bp.size(0) * 16, row_scale, row_offset, col_scale, bias, bias_c);
}

// The rows of the product a @ bp^T (check_packed's) for an epilogue: in chunks of rows, each made into
// one scratch accumulator [chunk + 1, n] (its last row the weight's column sums, made once) and handed
// to the epilogue before the next is made; with no more rows than a chunk (or chunks off), made whole.
// Each row's result is the same either way: every epilogue works row by row and the product is exact.
AccRows packed_rows(const char* op, const at::Tensor& a, const at::Tensor& bp) {
  return [op, &a, &bp](const Int8Acc& scales, const Epilogue& epilogue) {
    const int64_t rows = scales.rows, k = a.size(1), n = scales.n, lda = std::max<int64_t>(a.stride(0), 1);
    const int64_t chunk = chunk_rows_for(n);
    if (chunk < 0 || rows <= chunk) {
      const at::Tensor acc = int8_gemm_packed(a, bp, c10::nullopt);
      Int8Acc whole = scales;
      whole.acc = acc.data_ptr();
      return epilogue(whole, 0);
    }
    const auto& kt = detail::kernels_for(op);
    const int8_t* ap = a.data_ptr<int8_t>();
    const int8_t* b = bp.data_ptr<int8_t>();
    at::Tensor scratch = detail::empty({chunk + 1, n}, at::kInt);
    int32_t* c = scratch.data_ptr<int32_t>();
    int32_t* sums = c + chunk * n;
    if (k == 0) {
      scratch.zero_();
    } else {
      kt.int8_gemm_packed(ap + rows * lda, lda, b, sums, n, 1, n, k);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t m = std::min(chunk, rows - r0);
      if (k > 0) kt.int8_gemm_packed(ap + r0 * lda, lda, b, c, n, m, n, k);
      if (m < chunk) std::copy(sums, sums + n, c + m * n);  // the last, short chunk: its sums after its rows
      Int8Acc part = scales;
      part.acc = c;
      part.rows = m;
      part.row_scale += r0;
      part.row_offset += r0;
      epilogue(part, r0);
    }
  };
}

// Quantized rows (q [rows + 1, n] with its last row of ones, scale [rows], offset [rows]).
struct Quantized {
  at::Tensor q, scale, offset;
  Quantized(int64_t rows, int64_t n)
      : q(detail::empty({rows + 1, n}, at::kChar)), scale(detail::empty({rows}, at::kFloat)),
        offset(detail::empty({rows}, at::kFloat)) {
    int8_t* ones = q.data_ptr<int8_t>() + rows * n;
    std::fill(ones, ones + n, int8_t{1});
  }
  Int8Rows rows() { return {q.data_ptr<int8_t>(), scale.data_ptr<float>(), offset.data_ptr<float>()}; }
  std::tuple<at::Tensor, at::Tensor, at::Tensor> tuple() const { return {q, scale, offset}; }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  const char* op = "quantize_rows";
  detail::check_rows(op, "x", x);
  const int64_t rows = x.size(0), n = x.size(1);
  Quantized out(rows, n);
  if (rows > 0 && n > 0) detail::kernels_for(op).quantize_rows(detail::dtype_of(x), x.data_ptr(), rows, n, out.rows());
  return out.tuple();
}

namespace {

at::Tensor dequantized(const char* op, const Int8Acc& scales, at::ScalarType dtype, const AccRows& rows_of) {
  TORCH_CHECK(detail::is_float_dtype(dtype), "fastbert._C.", op, ": dtype must be a float dtype");
  at::Tensor y = detail::empty({scales.rows, scales.n}, dtype);
  if (y.numel() == 0) return y;
  char* out = static_cast<char*>(y.data_ptr());
  const int64_t row_bytes = scales.n * static_cast<int64_t>(y.element_size());
  rows_of(scales, [&](const Int8Acc& part, int64_t r0) {
    detail::kernels_for(op).int8_dequantize(part, detail::dtype_of(dtype), out + r0 * row_bytes);
  });
  return y;
}

}  // namespace

at::Tensor int8_dequantize(const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset,
                           const at::Tensor& col_scale, const c10::optional<at::Tensor>& bias, at::ScalarType dtype) {
  const char* op = "int8_dequantize";
  at::Tensor bias_c;
  return dequantized(op, check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c), dtype, whole_acc);
}

at::Tensor int8_packed_dequantize(const at::Tensor& a, const at::Tensor& bp, const at::Tensor& row_scale,
                                  const at::Tensor& row_offset, const at::Tensor& col_scale,
                                  const c10::optional<at::Tensor>& bias, at::ScalarType dtype) {
  const char* op = "int8_packed_dequantize";
  at::Tensor bias_c;
  return dequantized(op, check_packed(op, a, bp, row_scale, row_offset, col_scale, bias, bias_c), dtype,
                     packed_rows(op, a, bp));
}

namespace {

// An Int8Rows' rows from r0 on.
Int8Rows rows_from(const Int8Rows& q, int64_t r0, int64_t n) { return {q.q + r0 * n, q.scale + r0, q.offset + r0}; }

std::tuple<at::Tensor, at::Tensor, at::Tensor> bias_gelu_quantized(const char* op, const Int8Acc& scales,
                                                                   const std::string& approximate,
                                                                   const AccRows& rows_of) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "fastbert._C.", op,
              ": approximate must be 'none' or 'tanh', got '", approximate, "'");
  Quantized out(scales.rows, scales.n);
  if (scales.rows > 0 && scales.n > 0) {
    const Int8Rows q = out.rows();
    rows_of(scales, [&](const Int8Acc& part, int64_t r0) {
      detail::kernels_for(op).int8_bias_gelu(part, approximate == "tanh", rows_from(q, r0, scales.n));
    });
  }
  return out.tuple();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_bias_gelu(const at::Tensor& acc, const at::Tensor& row_scale,
                                                              const at::Tensor& row_offset,
                                                              const at::Tensor& col_scale, const at::Tensor& bias,
                                                              const std::string& approximate) {
  const char* op = "int8_bias_gelu";
  at::Tensor bias_c;
  return bias_gelu_quantized(op, check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c), approximate,
                             whole_acc);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_packed_bias_gelu(const at::Tensor& a, const at::Tensor& bp,
                                                                     const at::Tensor& row_scale,
                                                                     const at::Tensor& row_offset,
                                                                     const at::Tensor& col_scale,
                                                                     const at::Tensor& bias,
                                                                     const std::string& approximate) {
  const char* op = "int8_packed_bias_gelu";
  at::Tensor bias_c;
  return bias_gelu_quantized(op, check_packed(op, a, bp, row_scale, row_offset, col_scale, bias, bias_c),
                             approximate, packed_rows(op, a, bp));
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> glu_quantized(const char* op, const Int8Acc& a, const std::string& gate,
                                                             const AccRows& rows_of) {
  TORCH_CHECK(a.n % 2 == 0, "fastbert._C.", op, ": acc must hold the gate's and the up product's columns, an even "
              "number, got ", a.n);
  const kernels::Gate g = detail::gate_of(op, gate);
  Quantized out(a.rows, a.n / 2);
  if (a.rows > 0 && a.n > 0) {
    const Int8Rows q = out.rows();
    rows_of(a, [&](const Int8Acc& part, int64_t r0) {
      detail::kernels_for(op).int8_glu(part, g, rows_from(q, r0, a.n / 2));
    });
  }
  return out.tuple();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_glu(const at::Tensor& acc, const at::Tensor& row_scale,
                                                        const at::Tensor& row_offset, const at::Tensor& col_scale,
                                                        const c10::optional<at::Tensor>& bias, const std::string& gate) {
  const char* op = "int8_glu";
  at::Tensor bias_c;
  return glu_quantized(op, check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c), gate, whole_acc);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_packed_glu(const at::Tensor& a, const at::Tensor& bp,
                                                               const at::Tensor& row_scale, const at::Tensor& row_offset,
                                                               const at::Tensor& col_scale,
                                                               const c10::optional<at::Tensor>& bias,
                                                               const std::string& gate) {
  const char* op = "int8_packed_glu";
  at::Tensor bias_c;
  return glu_quantized(op, check_packed(op, a, bp, row_scale, row_offset, col_scale, bias, bias_c), gate,
                       packed_rows(op, a, bp));
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_rows(
    const char* op, const Int8Acc& a, const AccRows& rows_of, const at::Tensor& residual,
    const at::Tensor& weight_in, const at::Tensor& ln_bias_in, double eps, bool quantize, bool return_sum) {
  detail::check_rows(op, "residual", residual);
  TORCH_CHECK(residual.size(0) == a.rows && residual.size(1) == a.n, "fastbert._C.", op, ": residual has shape ",
              residual.sizes(), " but acc holds ", a.rows, " rows of ", a.n);
  detail::check_feature(op, "weight", weight_in, residual);
  detail::check_feature(op, "ln_bias", ln_bias_in, residual);
  const at::Tensor weight = weight_in.contiguous(), ln_bias = ln_bias_in.contiguous();
  at::Tensor y = detail::empty({a.rows, a.n}, residual.scalar_type());
  // the dequantized acc + residual, when asked for (apart from y: the two are not freed together)
  at::Tensor sum = return_sum ? detail::empty({a.rows, a.n}, residual.scalar_type()) : at::Tensor();
  Quantized out(quantize ? a.rows : 0, quantize ? a.n : 0);
  const Int8Rows q = out.rows();
  if (a.rows > 0 && a.n > 0) {
    const int64_t row_bytes = a.n * static_cast<int64_t>(residual.element_size());
    auto at_row = [&](const at::Tensor& t, int64_t r0) -> char* {
      return t.defined() ? static_cast<char*>(t.data_ptr()) + r0 * row_bytes : nullptr;
    };
    rows_of(a, [&](const Int8Acc& part, int64_t r0) {
      const Int8Rows qr = rows_from(q, r0, a.n);
      detail::kernels_for(op).int8_add_layer_norm(part, detail::dtype_of(residual), at_row(residual, r0),
                                                  detail::param(weight), detail::param(ln_bias),
                                                  static_cast<float>(eps), at_row(y, r0), quantize ? &qr : nullptr,
                                                  at_row(sum, r0));
    });
  }
  if (!quantize) {
    return {y, detail::empty({0}, at::kChar), detail::empty({0}, at::kFloat), detail::empty({0}, at::kFloat), sum};
  }
  return {y, out.q, out.scale, out.offset, sum};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_add_layer_norm(
    const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset, const at::Tensor& col_scale,
    const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& ln_bias,
    double eps, bool quantize, bool return_sum) {
  const char* op = "int8_add_layer_norm";
  at::Tensor bias_c;
  return add_layer_norm_rows(op, check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c), whole_acc,
                             residual, weight, ln_bias, eps, quantize, return_sum);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_packed_add_layer_norm(
    const at::Tensor& a, const at::Tensor& bp, const at::Tensor& row_scale, const at::Tensor& row_offset,
    const at::Tensor& col_scale, const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight,
    const at::Tensor& ln_bias, double eps, bool quantize, bool return_sum) {
  const char* op = "int8_packed_add_layer_norm";
  at::Tensor bias_c;
  return add_layer_norm_rows(op, check_packed(op, a, bp, row_scale, row_offset, col_scale, bias, bias_c),
                             packed_rows(op, a, bp), residual, weight, ln_bias, eps, quantize, return_sum);
}

int64_t set_int8_chunk_rows(int64_t rows) {
  TORCH_CHECK(rows >= -1, "fastbert._C.set_int8_chunk_rows: rows must be -1 (off), 0 (by the product's width) or a "
              "count, got ", rows);
  return g_chunk_rows.exchange(rows);
}

namespace {

// `out` checked as contiguous int32 [m, n], or a new one
at::Tensor int32_out(const char* op, const c10::optional<at::Tensor>& out, int64_t m, int64_t n) {
  if (!out.has_value() || !out->defined()) return detail::empty({m, n}, at::kInt);
  const at::Tensor& c = *out;
  TORCH_CHECK(c.device().is_cpu() && c.scalar_type() == at::kInt && c.dim() == 2 && c.size(0) == m && c.size(1) == n &&
                  c.is_contiguous(),
              "fastbert._C.", op, ": out must be a contiguous int32 [", m, ", ", n, "] CPU tensor");
  return c;
}

}  // namespace

at::Tensor int8_gemm(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& out) {
  const char* op = "int8_gemm";
  check_int8_rows(op, "a", a);
  check_int8_rows(op, "b", b);
  TORCH_CHECK(a.size(1) == b.size(1), "fastbert._C.", op, ": a [m, k] and b [n, k] differ in k: ", a.sizes(), " and ",
              b.sizes());
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  at::Tensor c = int32_out(op, out, m, n);
  if (m == 0 || n == 0) return c;
  if (k == 0) return c.zero_();
  detail::kernels_for(op).int8_gemm(a.data_ptr<int8_t>(), std::max<int64_t>(a.stride(0), 1), b.data_ptr<int8_t>(),
                                    std::max<int64_t>(b.stride(0), 1), c.data_ptr<int32_t>(), n, m, n, k);
  return c;
}

at::Tensor int8_gemm_packed(const at::Tensor& a, const at::Tensor& bp, const c10::optional<at::Tensor>& out) {
  const char* op = "int8_gemm_packed";
  check_int8_rows(op, "a", a);
  const int64_t m = a.size(0), k = a.size(1), kq = (k + 3) / 4;
  TORCH_CHECK(bp.defined() && bp.device().is_cpu() && bp.scalar_type() == at::kChar && bp.dim() == 4 &&
                  bp.size(1) == kq && bp.size(2) == 16 && bp.size(3) == 4 && bp.is_contiguous(),
              "fastbert._C.", op, ": bp must be a contiguous int8 [n / 16, ", kq, ", 16, 4] CPU tensor (a weight packed "
              "for a's ", k, " features), got ", bp.scalar_type(), " ", bp.sizes());
  const int64_t n = bp.size(0) * 16;
  at::Tensor c = int32_out(op, out, m, n);
  if (m == 0 || n == 0) return c;
  if (k == 0) return c.zero_();
  detail::kernels_for(op).int8_gemm_packed(a.data_ptr<int8_t>(), std::max<int64_t>(a.stride(0), 1),
                                           bp.data_ptr<int8_t>(), c.data_ptr<int32_t>(), n, m, n, k);
  return c;
}

}  // namespace fastbert
