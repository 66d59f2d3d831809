// The GELU ops' entry points, bias_gelu's and the gated units' (geglu's, and swiglu's on the same
// kernels): checks and outputs here, the kernels in kernels/bias_gelu_kernel.cpp and kernels/geglu.cpp.
#include "cpu_ops.h"

namespace fastbert {
namespace {

bool parse_approximate(const std::string& approximate, const char* op) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "fastbert._C.", op,
              ": approximate must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh";
}

// x [rows, 2n]: its last dim split in two halves (geglu's a and b)
void check_halves(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.size(1) % 2 == 0, "fastbert._C.", op, ": x's last dim must be even (two halves), got ", x.size(1));
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

// x [rows, 2n] -> y [rows, n] = act(x[:, :n]) * x[:, n:]; act: GELU (approximate "none", "tanh") or SiLU
// ("silu")
at::Tensor geglu_forward(const at::Tensor& x, const std::string& approximate) {
  const char* op = "geglu_forward";
  detail::check_rows(op, "x", x);
  check_halves(op, x);
  const kernels::Gate gate = detail::gate_of(op, approximate);
  const int64_t n = x.size(1) / 2;
  at::Tensor y = detail::empty({x.size(0), n}, x.scalar_type());
  if (y.numel() == 0) return y;
  detail::kernels_for(op).geglu_forward(detail::dtype_of(x), x.data_ptr(), y.data_ptr(), x.size(0), n, gate);
  return y;
}

// dy [rows, n], x [rows, 2n] -> dx [rows, 2n]
at::Tensor geglu_backward(const at::Tensor& dy, const at::Tensor& x, const std::string& approximate) {
  const char* op = "geglu_backward";
  detail::check_rows(op, "x", x);
  detail::check_rows(op, "dy", dy);
  check_halves(op, x);
  TORCH_CHECK(dy.size(0) == x.size(0) && 2 * dy.size(1) == x.size(1), "fastbert._C.", op, ": dy has shape ",
              dy.sizes(), " but x has shape ", x.sizes(), "; dy must be [rows, x's last dim / 2]");
  TORCH_CHECK(dy.scalar_type() == x.scalar_type(), "fastbert._C.", op, ": dy has dtype ", dy.scalar_type(),
              " but x has dtype ", x.scalar_type());
  const kernels::Gate gate = detail::gate_of(op, approximate);
  at::Tensor dx = detail::empty_output(x);
  if (dy.numel() == 0) return dx;
  detail::kernels_for(op).geglu_backward(detail::dtype_of(x), dy.data_ptr(), x.data_ptr(), dx.data_ptr(), x.size(0),
                                         dy.size(1), gate);
  return dx;
}

}  // namespace fastbert
