// int8 inference's element-wise ops: their checks and outputs. The scheme and the kernels are in
// kernels/int8_kernel.cpp (the epilogue of every int8 GEMM fused into the op that consumes its output, the
// quantization of every GEMM input into the op that produces it), the GEMM in kernels/int8_gemm.cpp.
#include <algorithm>

#include "cpu_ops.h"

namespace fastbert {
namespace {

using kernels::Int8Acc;
using kernels::Int8Rows;

// acc [rows + 1, n] int32 / float32 contiguous; row_scale, row_offset float32 [rows]; col_scale
// float32 [n]; bias absent or a float vector [n]. The returned view keeps pointers into them (and
// into `bias_c`, bias made contiguous, which the caller keeps alive).
Int8Acc check_acc(const char* op, const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset,
                  const at::Tensor& col_scale, const c10::optional<at::Tensor>& bias, at::Tensor& bias_c) {
  TORCH_CHECK(acc.device().is_cpu() && acc.dim() == 2 && acc.is_contiguous() && acc.size(0) >= 1, "fastbert._C.", op,
              ": acc must be a contiguous [rows + 1, n] CPU tensor, got shape ", acc.sizes());
  TORCH_CHECK(acc.scalar_type() == at::kInt || acc.scalar_type() == at::kFloat, "fastbert._C.", op,
              ": acc must be int32 or float32, got ", acc.scalar_type());
  const int64_t rows = acc.size(0) - 1, n = acc.size(1);
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
  return Int8Acc{acc.data_ptr(), detail::dtype_of(acc), rows, n, row_scale.data_ptr<float>(),
                 row_offset.data_ptr<float>(), col_scale.data_ptr<float>(), b};
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

at::Tensor int8_dequantize(const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset,
                           const at::Tensor& col_scale, const c10::optional<at::Tensor>& bias, at::ScalarType dtype) {
  const char* op = "int8_dequantize";
  at::Tensor bias_c;
  const Int8Acc a = check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c);
  TORCH_CHECK(detail::is_float_dtype(dtype), "fastbert._C.int8_dequantize: dtype must be a float dtype");
  at::Tensor y = detail::empty({a.rows, a.n}, dtype);
  if (y.numel() > 0) detail::kernels_for(op).int8_dequantize(a, detail::dtype_of(dtype), y.data_ptr());
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_bias_gelu(const at::Tensor& acc, const at::Tensor& row_scale,
                                                              const at::Tensor& row_offset,
                                                              const at::Tensor& col_scale, const at::Tensor& bias,
                                                              const std::string& approximate) {
  const char* op = "int8_bias_gelu";
  at::Tensor bias_c;
  const Int8Acc a = check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c);
  TORCH_CHECK(approximate == "none" || approximate == "tanh",
              "fastbert._C.int8_bias_gelu: approximate must be 'none' or 'tanh', got '", approximate, "'");
  Quantized out(a.rows, a.n);
  if (a.rows > 0 && a.n > 0) detail::kernels_for(op).int8_bias_gelu(a, approximate == "tanh", out.rows());
  return out.tuple();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_glu(const at::Tensor& acc, const at::Tensor& row_scale,
                                                        const at::Tensor& row_offset, const at::Tensor& col_scale,
                                                        const c10::optional<at::Tensor>& bias, const std::string& gate) {
  const char* op = "int8_glu";
  at::Tensor bias_c;
  const Int8Acc a = check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c);
  TORCH_CHECK(a.n % 2 == 0, "fastbert._C.int8_glu: acc must hold the gate's and the up product's columns, an even "
              "number, got ", a.n);
  const kernels::Gate g = detail::gate_of(op, gate);
  Quantized out(a.rows, a.n / 2);
  if (a.rows > 0 && a.n > 0) detail::kernels_for(op).int8_glu(a, g, out.rows());
  return out.tuple();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_add_layer_norm(
    const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& row_offset, const at::Tensor& col_scale,
    const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& weight_in, const at::Tensor& ln_bias_in,
    double eps, bool quantize, bool return_sum) {
  const char* op = "int8_add_layer_norm";
  at::Tensor bias_c;
  const Int8Acc a = check_acc(op, acc, row_scale, row_offset, col_scale, bias, bias_c);
  detail::check_rows(op, "residual", residual);
  TORCH_CHECK(residual.size(0) == a.rows && residual.size(1) == a.n, "fastbert._C.int8_add_layer_norm: residual has shape ",
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
    detail::kernels_for(op).int8_add_layer_norm(a, detail::dtype_of(residual), residual.data_ptr(),
                                                detail::param(weight), detail::param(ln_bias),
                                                static_cast<float>(eps), y.data_ptr(), quantize ? &q : nullptr,
                                                return_sum ? sum.data_ptr() : nullptr);
  }
  if (!quantize) {
    return {y, detail::empty({0}, at::kChar), detail::empty({0}, at::kFloat), detail::empty({0}, at::kFloat), sum};
  }
  return {y, out.q, out.scale, out.offset, sum};
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

void check_int8_rows(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kChar && t.dim() == 2, "fastbert._C.", op,
              ": ", name, " must be a 2-D int8 CPU tensor, got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, "fastbert._C.", op, ": ", name, " must have contiguous rows");
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
