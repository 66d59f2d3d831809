// The fp32 dot-product GEMM (kernels/dot_gemm_kernel.cpp): its checks and output.
// c [m, n] = a [m, k] . b [n, k]^T (+ bias [n]) with b a linear layer's weight as it lies in memory.
#include <algorithm>

#include "cpu_ops.h"

namespace fastbert {
namespace {

// a [m, k] and b [n, k]: 2-D CPU tensors of `dtype` whose rows are contiguous, with the same k.
void check_operands(const char* op, const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"a", a}, {"b", b}}) {
    TORCH_CHECK(t.defined() && t.device().is_cpu() && t.scalar_type() == dtype && t.dim() == 2, "fastbert._C.", op,
                ": ", name, " must be a 2-D ", dtype, " CPU tensor, got ", t.scalar_type(), " ", t.sizes());
    TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, "fastbert._C.", op, ": ", name, " must have contiguous rows");
  }
  TORCH_CHECK(a.size(1) == b.size(1), "fastbert._C.", op, ": a [m, k] and b [n, k] differ in k: ", a.sizes(), " and ",
              b.sizes());
}

// `out` checked as a contiguous [m, n] CPU tensor of `dtype`, or a new one.
at::Tensor output(const char* op, const c10::optional<at::Tensor>& out, int64_t m, int64_t n, at::ScalarType dtype) {
  if (!out.has_value() || !out->defined()) return detail::empty({m, n}, dtype);
  const at::Tensor& c = *out;
  TORCH_CHECK(c.device().is_cpu() && c.scalar_type() == dtype && c.dim() == 2 && c.size(0) == m && c.size(1) == n &&
                  c.is_contiguous(),
              "fastbert._C.", op, ": out must be a contiguous ", dtype, " [", m, ", ", n, "] CPU tensor");
  return c;
}

}  // namespace

at::Tensor f32_dot_gemm(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& out) {
  const char* op = "f32_dot_gemm";
  check_operands(op, a, b, at::kFloat);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n,
                "fastbert._C.", op, ": bias must be a float32 CPU vector [", n, "], got ", bias->scalar_type(), " ",
                bias->sizes());
    bias_c = bias->contiguous();
  }
  at::Tensor c = output(op, out, m, n, at::kFloat);
  if (m == 0 || n == 0) return c;
  detail::kernels_for(op).f32_dot_gemm(a.data_ptr<float>(), std::max<int64_t>(a.stride(0), 1), b.data_ptr<float>(),
                                       std::max<int64_t>(b.stride(0), 1),
                                       bias_c.defined() ? bias_c.data_ptr<float>() : nullptr, c.data_ptr<float>(), n, m,
                                       n, k);
  return c;
}

}  // namespace fastbert
