// One post-LN encoder layer for inference in one call, in float (fastbert.ops.encoder_layer's fused
// path) and in int8 (fastbert.ops.encoder's int8_linear for QKV, the attention, int8_layer_rest): the host
// functions the separate ops' launchers call, in the same order with the same arguments, so the result is bit for bit theirs, with no
// Python between them and the GIL released for the whole layer. For one short sequence the Python
// between about ten small kernels a layer cost as much as the kernels.
//
// Each GEMM runs on the path fastbert.ops.gemm measured fastest for its shape, which the caller
// passes (`paths`, one per product: QKV, attention output, FFN in, FFN out); the layer takes the
// paths it can call from here (GemmPath), and the caller keeps the others in Python. The weights
// are arguments: nothing is derived from them or kept between calls.
//
// A model's whole stack of layers is one call too (encoder_forward, int8_encoder_forward): each
// layer's tensors as the one-layer call takes them, followed by the parts of its joined tensors
// (the QKV projections' weights, biases, scales, which fastbert.model.joined.share_storage made
// slices of one tensor each). The parts are checked to be those slices still, every layer's before
// any runs; where one is not, the call returns no tensor and the caller joins them again.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ops/_int_mm.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "cpu_ops.h"

namespace fastbert {
namespace {

// The GEMM paths a layer runs (fastbert.ops.gemm's names). fastbert.ops.encoder.GEMM_PATH_IDS is the one
// Python table of them, checked against gemm_path_ids() below by tests/ops/test_encoder.py.
enum GemmPath : int64_t {
  kAddmm = 0,     // "addmm": torch.addmm / torch.mm
  kDot = 1,       // "dot": fastbert's fp32 dot-product GEMM
  kInt8 = 2,      // "fastbert": fastbert's int8 GEMM
  kIntMm = 3,     // "int_mm": torch._int_mm
  kPacked = 4,    // fastbert's int8 GEMM on a packed weight (the weight's only copy: no choice to measure)
  kOnednn = 5,    // "onednn": oneDNN's inner product on the weight as it is
  kOnednnPacked = 6,  // "onednn_packed": the same on the weight reordered on this call
  kMklPacked = 7,     // "mkl_packed": MKL's packed GEMM on the weight packed on this call
};

// the paths whose product torch's mkldnn and mkl operators make (library_product)
bool library_path(int64_t p) { return p == kOnednn || p == kOnednnPacked || p == kMklPacked; }
bool float_path(int64_t p) { return p == kAddmm || p == kDot || library_path(p); }

void check_paths(const char* op, const std::vector<int64_t>& paths, bool int8) {
  TORCH_CHECK(paths.size() == 4, "fastbert._C.", op, ": paths must hold one GEMM path per product (4), got ",
              paths.size());
  for (int64_t p : paths) {
    TORCH_CHECK(int8 ? (p == kInt8 || p == kIntMm || p == kPacked) : float_path(p), "fastbert._C.", op,
                ": GEMM path ", p, " is not one this layer runs");
  }
}

}  // namespace

std::vector<std::tuple<std::string, int64_t, bool>> gemm_path_ids() {
  const std::vector<std::pair<const char*, GemmPath>> named = {
      {"addmm", kAddmm},   {"dot", kDot},         {"fastbert", kInt8},          {"int_mm", kIntMm},
      {"packed", kPacked}, {"onednn", kOnednn}, {"onednn_packed", kOnednnPacked}, {"mkl_packed", kMklPacked}};
  std::vector<std::tuple<std::string, int64_t, bool>> out;
  for (const auto& [name, id] : named) out.emplace_back(name, id, !float_path(id));
  return out;
}

namespace {

// torch's operator `name`. The mkldnn and mkl operators are registered by the torch builds that have
// those libraries; fastbert.ops.gemm offers their paths only there, so each is looked up (once) only
// where a measured choice names it.
c10::OperatorHandle torch_op(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

// op called boxed on `args` -> its one tensor
at::Tensor call_op(const c10::OperatorHandle& op, std::vector<c10::IValue> args) {
  op.callBoxed(&args);
  return args.at(0).toTensor();
}

// The mkldnn and mkl paths' products, as fastbert.ops.gemm_paths calls them (torch allocates the output).
at::Tensor library_product(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                           int64_t path) {
  const c10::IValue b = bias.has_value() && bias->defined() ? c10::IValue(*bias) : c10::IValue();
  if (path == kMklPacked) {
    static const c10::OperatorHandle pack = torch_op("mkl::_mkl_reorder_linear_weight");
    static const c10::OperatorHandle linear = torch_op("mkl::_mkl_linear");
    const at::Tensor packed = call_op(pack, {w, x.size(0)});
    return call_op(linear, {x, packed, w, b, x.size(0)});
  }
  static const c10::OperatorHandle pointwise = torch_op("mkldnn::_linear_pointwise");
  at::Tensor weight = w;
  if (path == kOnednnPacked) {
    static const c10::OperatorHandle reorder = torch_op("mkldnn::_reorder_linear_weight");
    weight = call_op(reorder, {w.contiguous(), x.size(0)});
  }
  return call_op(pointwise, {x, weight, b, std::string("none"), c10::List<c10::optional<at::Scalar>>(),
                             c10::IValue()});
}

// x [rows, in] @ w [out, in]^T (+ bias) on `path`, into the reusing allocator's memory (the library
// paths: into torch's), as fastbert.ops.linear.rows_forward's product.
at::Tensor float_product(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                         int64_t path) {
  if (library_path(path)) return library_product(x, w, bias, path);
  at::Tensor out = detail::empty({x.size(0), w.size(0)}, x.scalar_type());
  if (path == kDot) return f32_dot_gemm(x, w, bias, out);
  if (bias.has_value() && bias->defined()) return at::addmm_out(out, *bias, x, w.t());
  return at::mm_out(out, x, w.t());
}

// The int32 accumulator a [rows, in] int8 @ w [out, in]^T int8 (packed: [out / 16, in / 4, 16, 4]), as
// fastbert.ops.int8_matmul's.
at::Tensor int8_product(const at::Tensor& a, const at::Tensor& w, int64_t path) {
  at::Tensor out = detail::empty({a.size(0), path == kPacked ? w.size(0) * 16 : w.size(0)}, at::kInt);
  if (path == kPacked) return int8_gemm_packed(a, w, out);
  if (path == kInt8) return int8_gemm(a, w, out);
  return at::_int_mm_out(out, a, w.t());
}

// The attention's context [rows, hidden] of the QKV projection qkv [rows, 3 hidden]: packed rows
// (cu_seqlens) or a padded batch [batch, seq] (key_mask or none), scale 1 / sqrt(head size), no dropout.
at::Tensor attend(const at::Tensor& qkv, int64_t batch, int64_t seq, int64_t heads,
                  const c10::optional<at::Tensor>& key_mask, const c10::optional<at::Tensor>& cu_seqlens,
                  int64_t max_seqlen, const c10::optional<at::Tensor>& rel_bias) {
  const int64_t h = qkv.size(1) / 3, d = h / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const c10::optional<at::Tensor> none;
  if (cu_seqlens.has_value() && cu_seqlens->defined()) {
    const at::Tensor t = qkv.view({-1, 3, heads, d});
    return std::get<0>(varlen_attention_forward(t.select(1, 0), t.select(1, 1), t.select(1, 2), cu_seqlens->contiguous(),
                                                max_seqlen, scale, 0.0, 0, false, none, none, -1, rel_bias))
        .view({-1, h});
  }
  const at::Tensor t = qkv.view({batch, seq, 3, heads, d}).permute({2, 0, 3, 1, 4});
  const at::Tensor ctx =
      std::get<0>(attention_forward(t.select(0, 0), t.select(0, 1), t.select(0, 2), key_mask, scale, 0.0, 0, false,
                                    none, none, -1, rel_bias));
  return ctx.transpose(1, 2).reshape({-1, h});
}

// Whether the parts following layer tensors t[0..base) are still the consecutive slices of t[0],
// t[1], ... (three parts each) that share_storage made them: fastbert.model.joined.views_of's test.
bool joins_intact(const std::vector<at::Tensor>& t, size_t base) {
  if (t.size() < base || (t.size() - base) % 3 != 0) return false;
  for (size_t j = 0; base + 3 * j < t.size(); ++j) {
    const at::Tensor& joined = t[j];
    if (!joined.defined() || joined.dim() == 0) return false;
    const char* start = static_cast<const char*>(joined.data_ptr());
    const int64_t row = joined.stride(0) * static_cast<int64_t>(joined.element_size());
    for (size_t k = 0; k < 3; ++k) {
      const at::Tensor& p = t[base + 3 * j + k];
      if (!p.defined() || p.data_ptr() != start || p.dim() != joined.dim() ||
          p.sizes().slice(1) != joined.sizes().slice(1) || p.scalar_type() != joined.scalar_type() ||
          p.device() != joined.device() || !p.is_contiguous())
        return false;
      start += p.size(0) * row;
    }
    if (start != static_cast<const char*>(joined.data_ptr()) + joined.size(0) * row) return false;
  }
  return true;
}

// Checks that paths (4 a layer), heads, eps (2 a layer) and approximate match the layers; then
// whether every layer's joined tensors (its tensors after the first `base`) are intact.
bool stack_ready(const char* op, const std::vector<std::vector<at::Tensor>>& layers, size_t base,
                 const std::vector<int64_t>& paths, const std::vector<int64_t>& heads,
                 const std::vector<double>& eps, const std::vector<std::string>& approximate) {
  const size_t n = layers.size();
  TORCH_CHECK(paths.size() == 4 * n && heads.size() == n && eps.size() == 2 * n && approximate.size() == n,
              "fastbert._C.", op, ": paths (4 a layer), heads, eps (2 a layer) and approximate must match the ", n,
              " layers");
  for (const auto& t : layers) {
    if (!joins_intact(t, base)) return false;
  }
  return true;
}

std::vector<int64_t> slice4(const std::vector<int64_t>& paths, size_t i) {
  return std::vector<int64_t>(paths.begin() + 4 * i, paths.begin() + 4 * i + 4);
}

}  // namespace

at::Tensor encoder_layer_forward(const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                                 const std::vector<int64_t>& paths, int64_t heads, double eps1, double eps2,
                                 const std::string& approximate, const c10::optional<at::Tensor>& key_mask,
                                 const c10::optional<at::Tensor>& cu_seqlens, int64_t max_seqlen,
                                 const c10::optional<at::Tensor>& rel_bias) {
  const char* op = "encoder_layer_forward";
  check_paths(op, paths, false);
  TORCH_CHECK(w.size() == 12, "fastbert._C.", op, ": weights must be the layer's 12 tensors, got ", w.size());
  TORCH_CHECK(hidden.dim() == 2 || hidden.dim() == 3, "fastbert._C.", op, ": hidden must be 2-D or 3-D");
  const int64_t h = hidden.size(-1);
  const at::Tensor x = hidden.reshape({-1, h}).contiguous();
  const int64_t batch = hidden.dim() == 3 ? hidden.size(0) : 0, seq = hidden.dim() == 3 ? hidden.size(1) : 0;
  const at::Tensor qkv = float_product(x, w[0], w[1], paths[0]);
  const at::Tensor ctx = attend(qkv, batch, seq, heads, key_mask, cu_seqlens, max_seqlen, rel_bias);
  const at::Tensor attn = float_product(ctx, w[2], w[3], paths[1]);
  const at::Tensor h1 = std::get<0>(add_layer_norm_forward(attn, x, w[4].contiguous(), w[5].contiguous(), eps1, 0.0,
                                                            0, false));
  const at::Tensor inter = bias_gelu_forward(float_product(h1, w[6], c10::nullopt, paths[2]), w[7].contiguous(),
                                             approximate);
  const at::Tensor out = float_product(inter, w[8], w[9], paths[3]);
  return std::get<0>(add_layer_norm_forward(out, h1, w[10].contiguous(), w[11].contiguous(), eps2, 0.0, 0, false))
      .view(hidden.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> int8_encoder_layer_forward(
    const at::Tensor& hidden, const at::Tensor& hq, const at::Tensor& hs, const at::Tensor& ho,
    const std::vector<at::Tensor>& w, const std::vector<int64_t>& paths, int64_t heads, double eps1, double eps2,
    const std::string& approximate, const at::Tensor& cu_seqlens, int64_t max_seqlen,
    const c10::optional<at::Tensor>& rel_bias, bool quantize_out) {
  const char* op = "int8_encoder_layer_forward";
  check_paths(op, paths, true);
  TORCH_CHECK(w.size() == 16, "fastbert._C.", op, ": weights must be the layer's 16 tensors, got ", w.size());
  TORCH_CHECK(hidden.dim() == 2, "fastbert._C.", op, ": hidden must be the packed rows [tokens, hidden]");
  const at::Tensor x = hidden.contiguous();
  // w: QKV (int8 weight, scale, bias), output (weight, scale, bias), norm1 (weight, bias), FFN in
  // (weight, scale, bias), FFN out (weight, scale, bias), norm2 (weight, bias)
  // a packed weight's product goes to its epilogue in chunks of rows (int8_packed_*), the others whole
  const at::Tensor qkv = paths[0] == kPacked
                             ? int8_packed_dequantize(hq, w[0], hs, ho, w[1], w[2], x.scalar_type())
                             : int8_dequantize(int8_product(hq, w[0], paths[0]), hs, ho, w[1], w[2], x.scalar_type());
  const at::Tensor ctx = attend(qkv, 0, 0, heads, c10::nullopt, cu_seqlens, max_seqlen, rel_bias).contiguous();
  auto [cq, cs, co] = quantize_rows(ctx);
  auto add_norm = [&](const at::Tensor& a, const at::Tensor& as, const at::Tensor& ao, size_t i, int64_t path,
                      const at::Tensor& residual, double eps, bool quantize) {
    return path == kPacked ? int8_packed_add_layer_norm(a, w[i], as, ao, w[i + 1], w[i + 2], residual, w[i + 3],
                                                        w[i + 4], eps, quantize, false)
                           : int8_add_layer_norm(int8_product(a, w[i], path), as, ao, w[i + 1], w[i + 2], residual,
                                                 w[i + 3], w[i + 4], eps, quantize, false);
  };
  auto [h1, q1, s1, o1, unused1] = add_norm(cq, cs, co, 3, paths[1], x, eps1, true);
  auto [iq, is, io] = paths[2] == kPacked
                          ? int8_packed_bias_gelu(q1, w[8], s1, o1, w[9], w[10], approximate)
                          : int8_bias_gelu(int8_product(q1, w[8], paths[2]), s1, o1, w[9], w[10], approximate);
  auto [h2, q2, s2, o2, unused2] = add_norm(iq, is, io, 11, paths[3], h1, eps2, quantize_out);
  return {h2, q2, s2, o2};
}

std::vector<at::Tensor> encoder_forward(
    const at::Tensor& hidden, const std::vector<std::vector<at::Tensor>>& layers, const std::vector<int64_t>& paths,
    const std::vector<int64_t>& heads, const std::vector<double>& eps, const std::vector<std::string>& approximate,
    const c10::optional<at::Tensor>& key_mask, const c10::optional<at::Tensor>& cu_seqlens, int64_t max_seqlen,
    const c10::optional<at::Tensor>& rel_bias, bool keep_states) {
  if (!stack_ready("encoder_forward", layers, 12, paths, heads, eps, approximate)) return {};
  std::vector<at::Tensor> out;
  at::Tensor h = hidden;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::vector<at::Tensor> w(layers[i].begin(), layers[i].begin() + 12);
    h = encoder_layer_forward(h, w, slice4(paths, i), heads[i], eps[2 * i], eps[2 * i + 1], approximate[i], key_mask,
                              cu_seqlens, max_seqlen, rel_bias);
    if (keep_states || i + 1 == layers.size()) out.push_back(h);
  }
  return out;
}

std::vector<at::Tensor> int8_encoder_forward(
    const at::Tensor& hidden, const at::Tensor& hq, const at::Tensor& hs, const at::Tensor& ho,
    const std::vector<std::vector<at::Tensor>>& layers, const std::vector<int64_t>& paths,
    const std::vector<int64_t>& heads, const std::vector<double>& eps, const std::vector<std::string>& approximate,
    const at::Tensor& cu_seqlens, int64_t max_seqlen, const c10::optional<at::Tensor>& rel_bias, bool keep_states) {
  if (!stack_ready("int8_encoder_forward", layers, 16, paths, heads, eps, approximate)) return {};
  std::vector<at::Tensor> out;
  at::Tensor h = hidden, q = hq, s = hs, o = ho;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::vector<at::Tensor> w(layers[i].begin(), layers[i].begin() + 16);
    const bool last = i + 1 == layers.size();
    std::tie(h, q, s, o) = int8_encoder_layer_forward(h, q, s, o, w, slice4(paths, i), heads[i], eps[2 * i],
                                                      eps[2 * i + 1], approximate[i], cu_seqlens, max_seqlen,
                                                      rel_bias, !last);
    if (keep_states || last) out.push_back(h);
  }
  return out;
}

}  // namespace fastbert
