// add_layer_norm's entry points: checks and outputs here, the kernels in kernels/layer_norm_kernel.cpp.
#include <cmath>

#include "cpu_ops.h"

namespace fastbert {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight_in,
    const c10::optional<at::Tensor>& bias_in, double eps, double dropout_p, int64_t seed, bool return_sum, bool rms) {
  const char* op = "add_layer_norm_forward";
  detail::check_rows(op, "x", x);
  detail::check_like(op, "residual", residual, x);
  detail::check_feature(op, "weight", weight_in, x);
  const bool has_bias = bias_in.has_value() && bias_in->defined();
  if (has_bias) detail::check_feature(op, "bias", *bias_in, x);
  TORCH_CHECK(!(rms && has_bias), "fastbert._C.", op, ": an RMSNorm (rms=True) takes no bias");
  detail::check_dropout(op, dropout_p, seed);
  TORCH_CHECK(eps >= 0.0 && std::isfinite(eps), "fastbert._C.", op, ": eps must be finite and >= 0, got ", eps);
  const int64_t m = x.size(0), n = x.size(1);
  at::Tensor y = detail::empty_output(x);
  // h = dropout(x) + residual, when asked for (apart from y: a pre-LN model keeps the one and not the other)
  at::Tensor sum = return_sum ? detail::empty_output(x) : at::Tensor();
  at::Tensor mean = detail::empty({m}, at::kFloat);
  at::Tensor rstd = detail::empty({m}, at::kFloat);
  if (m == 0) return {y, mean, rstd, sum};
  if (n == 0) return {y, mean.zero_(), rstd.fill_(1.0 / std::sqrt(eps)), sum};  // (an RMSNorm's too)
  const at::Tensor weight = weight_in.contiguous(), bias = has_bias ? bias_in->contiguous() : at::Tensor();
  const kernels::Param bias_param = has_bias ? detail::param(bias) : kernels::Param{nullptr, detail::dtype_of(weight)};
  detail::kernels_for(op).add_layer_norm_forward(
      detail::dtype_of(x), x.data_ptr(), residual.data_ptr(), detail::param(weight), bias_param, y.data_ptr(),
      return_sum ? sum.data_ptr() : nullptr, mean.data_ptr<float>(), rstd.data_ptr<float>(), m, n,
      static_cast<float>(eps), dropout_p, static_cast<uint64_t>(seed), rms);
  return {y, mean, rstd, sum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight_in,
    const at::Tensor& mean, const at::Tensor& rstd, double dropout_p, int64_t seed,
    const c10::optional<at::Tensor>& dsum_in, bool rms) {
  const char* op = "add_layer_norm_backward";
  detail::check_rows(op, "x", x);
  detail::check_like(op, "dy", dy, x);
  const bool has_dsum = dsum_in.has_value() && dsum_in->defined();
  if (has_dsum) detail::check_like(op, "dsum", *dsum_in, x);
  detail::check_like(op, "residual", residual, x);
  detail::check_feature(op, "weight", weight_in, x);
  detail::check_dropout(op, dropout_p, seed);
  const int64_t m = x.size(0), n = x.size(1);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"mean", mean}, {"rstd", rstd}}) {
    TORCH_CHECK(t.defined() && t.device().is_cpu() && t.dim() == 1 && t.size(0) == m && t.is_contiguous() &&
                    t.scalar_type() == at::kFloat,
                "fastbert._C.", op, ": ", name, " must be a contiguous float32 CPU tensor of shape [", m, "]");
  }
  auto [dx, dres] = detail::empty_output_pair(x);
  if (m == 0 || n == 0) return {dx, dres, detail::zeros({n}, weight_in.scalar_type()), detail::zeros({n}, weight_in.scalar_type())};
  const at::Tensor weight = weight_in.contiguous();
  at::Tensor dweight = detail::empty({n}, weight.scalar_type());
  at::Tensor dbias = detail::empty({n}, weight.scalar_type());
  detail::kernels_for(op).add_layer_norm_backward(
      detail::dtype_of(x), dy.data_ptr(), has_dsum ? dsum_in->data_ptr() : nullptr, x.data_ptr(), residual.data_ptr(),
      detail::param(weight), mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr(), dres.data_ptr(),
      dweight.data_ptr(), dbias.data_ptr(), m, n, dropout_p, static_cast<uint64_t>(seed), rms);
  return {dx, dres, dweight, dbias};
}

}  // namespace fastbert
