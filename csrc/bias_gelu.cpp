// bias_gelu's entry points: checks and outputs here, the kernels in kernels/bias_gelu.cpp.
#include "cpu_ops.h"

namespace fastbert {
namespace {

bool parse_approximate(const std::string& approximate, const char* op) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "fastbert._C.", op,
              ": approximate must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh";
}

}  // namespace

at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias_in, const std::string& approximate) {
  const char* op = "bias_gelu_forward";
  detail::check_rows(op, "x", x);
  detail::check_feature(op, "bias", bias_in, x);
  const bool tanh = parse_approximate(approximate, op);
  at::Tensor y = detail::empty_output(x);
  if (x.numel() == 0) return y;
  const at::Tensor bias = bias_in.contiguous();
  detail::kernels_for(op).bias_gelu_forward(detail::dtype_of(x), x.data_ptr(), detail::param(bias), y.data_ptr(),
                                            x.size(0), x.size(1), tanh);
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias_in,
                                                      const std::string& approximate) {
  const char* op = "bias_gelu_backward";
  detail::check_rows(op, "x", x);
  detail::check_like(op, "dy", dy, x);
  detail::check_feature(op, "bias", bias_in, x);
  const bool tanh = parse_approximate(approximate, op);
  at::Tensor dx = detail::empty_output(x);
  if (x.numel() == 0) return {dx, detail::zeros({bias_in.size(0)}, bias_in.scalar_type())};
  const at::Tensor bias = bias_in.contiguous();
  at::Tensor dbias = detail::empty({x.size(1)}, bias.scalar_type());
  detail::kernels_for(op).bias_gelu_backward(detail::dtype_of(x), dy.data_ptr(), x.data_ptr(), detail::param(bias),
                                             dx.data_ptr(), dbias.data_ptr(), x.size(0), x.size(1), tanh);
  return {dx, dbias};
}

}  // namespace fastbert
