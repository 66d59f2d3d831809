// Attention with a padding mask on the CPU: the entry points, their checks and the set-up of the
// sequences (from the key mask or cu_seqlens). The kernels, and the design, are in kernels/attention_kernel.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_ops.h"

namespace fastbert {
namespace {

using kernels::AttnArgs;
using kernels::AttnSeq;
using kernels::AttnView;
constexpr int64_t kMaxDropoutSeq = int64_t{1} << 16;

void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t dims) {
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"q", q}, {"k", k}, {"v", v}}) {
    TORCH_CHECK(t.defined() && t.device().is_cpu(), "fastbert._C.", op, ": ", name, " must be a CPU tensor");
    TORCH_CHECK(t.dim() == dims, "fastbert._C.", op, ": ", name, " must be ", dims, "-D, got shape ", t.sizes());
    TORCH_CHECK(t.sizes() == q.sizes(), "fastbert._C.", op, ": ", name, " has shape ", t.sizes(), " but q has ",
                q.sizes());
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), "fastbert._C.", op, ": q, k, v must share one dtype");
  }
  TORCH_CHECK(detail::is_float_dtype(q.scalar_type()), "fastbert._C.", op, ": unsupported dtype ", q.scalar_type(),
              " (float32, float16, bfloat16)");
  TORCH_CHECK(q.size(-1) >= 1, "fastbert._C.", op, ": head_dim must be >= 1");
}

// t with a contiguous last dim (a copy only when it is not)
at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// The arguments every call shares; the views, the sequences and the lse are the caller's to set.
AttnArgs common_args(const at::Tensor& q, bool padded, int64_t batch, double scale, double dropout_p, int64_t seed,
                     const char* op) {
  detail::check_dropout(op, dropout_p, seed);
  TORCH_CHECK(std::isfinite(scale), "fastbert._C.", op, ": scale must be finite, got ", scale);
  TORCH_CHECK(detail::kernel_table().attention_forward != nullptr && detail::has_blas(), "fastbert._C.", op,
              ": this torch build exports no BLAS sgemm_, which the attention kernels need");
  AttnArgs a;
  a.dtype = detail::dtype_of(q);
  a.padded = padded;
  a.batch = batch;
  a.heads = q.size(1);
  a.rows = padded ? q.size(2) : q.size(0);
  a.d = q.size(-1);
  a.scale = static_cast<float>(scale);
  a.dropout_p = dropout_p;
  a.seed = static_cast<uint64_t>(seed);
  a.bf16_min_len = a.dtype == kernels::Dtype::kBFloat16 ? attention_bf16_min_len() : -1;
  return a;
}

// [batch, heads, seq, d] (padded) or [tokens, heads, d] (packed), last dim contiguous
AttnView view_of(const at::Tensor& t, bool padded) {
  if (padded) return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
  return {t.data_ptr(), 0, t.stride(1), t.stride(0)};
}

// Sequences of a padded batch from a [batch, seq] mask (bool view kept alive by the caller).
std::vector<AttnSeq> padded_seqs(const AttnArgs& a, const at::Tensor& mask, int64_t seq, const char* op) {
  const bool dropout = a.dropout_p > 0.0;
  std::vector<AttnSeq> seqs(static_cast<size_t>(a.batch));
  if (!mask.defined()) {
    for (AttnSeq& s : seqs) s.len = seq;
    TORCH_CHECK(!dropout || seq <= kMaxDropoutSeq, "fastbert._C.", op, ": attention dropout takes sequences of at most ",
                kMaxDropoutSeq, " tokens, got ", seq);
    return seqs;
  }
  const bool* m = mask.data_ptr<bool>();
  for (int64_t b = 0; b < a.batch; ++b) {
    const bool* row = m + b * seq;
    int64_t first = 0, last = seq;
    while (first < seq && !row[first]) ++first;
    while (last > first && !row[last - 1]) --last;
    AttnSeq& s = seqs[static_cast<size_t>(b)];
    s.first = first;
    s.len = last - first;
    s.real = std::all_of(row + first, row + last, [](bool x) { return x; }) ? nullptr : row + first;
    TORCH_CHECK(!dropout || s.len <= kMaxDropoutSeq, "fastbert._C.", op,
                ": attention dropout takes sequences of at most ", kMaxDropoutSeq, " tokens, got ", s.len);
  }
  return seqs;
}

at::Tensor bool_mask(const c10::optional<at::Tensor>& key_mask, int64_t batch, int64_t seq, const char* op) {
  if (!key_mask.has_value() || !key_mask->defined()) return at::Tensor();
  const at::Tensor& m = *key_mask;
  TORCH_CHECK(m.device().is_cpu(), "fastbert._C.", op, ": key_mask must be a CPU tensor");
  TORCH_CHECK(m.dim() == 2 && m.size(0) == batch && m.size(1) == seq, "fastbert._C.", op,
              ": key_mask must have shape [", batch, ", ", seq, "], got ", m.sizes());
  return (m.scalar_type() == at::kBool ? m : m.ne(0)).contiguous();
}

void check_cu_seqlens(const char* op, const at::Tensor& cu_seqlens) {
  TORCH_CHECK(cu_seqlens.defined() && cu_seqlens.device().is_cpu() && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1,
              "fastbert._C.", op, ": cu_seqlens must be a 1-D CPU tensor [batch + 1]");
  TORCH_CHECK(cu_seqlens.scalar_type() == at::kInt || cu_seqlens.scalar_type() == at::kLong, "fastbert._C.", op,
              ": cu_seqlens must be int32 (or int64), got ", cu_seqlens.scalar_type());
}

// Sequences of a packed batch.
std::vector<AttnSeq> packed_seqs(const AttnArgs& a, const at::Tensor& cu_seqlens, const char* op) {
  const at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* c = cu.data_ptr<int64_t>();
  std::vector<AttnSeq> seqs(static_cast<size_t>(a.batch));
  TORCH_CHECK(c[0] == 0 && c[a.batch] == a.rows, "fastbert._C.", op, ": cu_seqlens must run from 0 to ", a.rows);
  for (int64_t b = 0; b < a.batch; ++b) {
    TORCH_CHECK(c[b + 1] >= c[b], "fastbert._C.", op, ": cu_seqlens must be non-decreasing");
    seqs[static_cast<size_t>(b)] = AttnSeq{c[b], c[b + 1] - c[b], nullptr};
    TORCH_CHECK(a.dropout_p == 0.0 || c[b + 1] - c[b] <= kMaxDropoutSeq, "fastbert._C.", op,
                ": attention dropout takes sequences of at most ", kMaxDropoutSeq, " tokens");
  }
  return seqs;
}

// bool [batch, heads, n, n]: the dropout keep-mask of every (query, key) position, counters from starts[b].
at::Tensor keep_mask(const AttnArgs& a, const std::vector<int64_t>& starts, int64_t n, const char* op) {
  at::Tensor mask = detail::empty({a.batch, a.heads, n, n}, at::kBool);
  if (mask.numel() > 0) detail::kernels_for(op).attention_keep_mask(a, starts.data(), n, mask.data_ptr<bool>());
  return mask;
}

at::Tensor check_lse(const char* op, const at::Tensor& lse, at::IntArrayRef shape) {
  TORCH_CHECK(lse.defined() && lse.device().is_cpu() && lse.scalar_type() == at::kFloat && lse.sizes() == shape,
              "fastbert._C.", op, ": lse must be the float32 ", shape, " tensor the forward returned, got ",
              lse.sizes());
  return lse.contiguous();
}

void check_like_q(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.sizes() == q.sizes() && t.scalar_type() == q.scalar_type(),
              "fastbert._C.", op, ": ", name, " must be a CPU tensor of q's shape ", q.sizes(), " and dtype ",
              q.scalar_type());
}


// The rotary tables of a call, checked, into a (none: a stays without); positions: how many rows
// of the tables the call reads.
void set_rope(AttnArgs& a, const c10::optional<at::Tensor>& rope_cos, const c10::optional<at::Tensor>& rope_sin,
              int64_t positions, const char* op) {
  const bool has_cos = rope_cos.has_value() && rope_cos->defined(), has_sin = rope_sin.has_value() && rope_sin->defined();
  TORCH_CHECK(has_cos == has_sin, "fastbert._C.", op, ": rope_cos and rope_sin go together");
  if (!has_cos) return;
  TORCH_CHECK(a.d % 2 == 0, "fastbert._C.", op, ": rotary embeddings need an even head_dim, got ", a.d);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"rope_cos", *rope_cos}, {"rope_sin", *rope_sin}}) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 2 &&
                    t.size(1) == a.d / 2 && t.size(0) >= positions,
                "fastbert._C.", op, ": ", name, " must be a contiguous float32 CPU tensor [>= ", positions, ", ",
                a.d / 2, "], got ", t.scalar_type(), " ", t.sizes());
  }
  a.rope_cos = rope_cos->data_ptr<float>();
  a.rope_sin = rope_sin->data_ptr<float>();
}

// The relative bias of a call, checked, into a (none: a stays without); positions: the longest
// sequence. Returns the bias as the kernels read it (float32, contiguous), kept alive by the caller.
at::Tensor set_relative(AttnArgs& a, const c10::optional<at::Tensor>& rel_bias, int64_t positions, const char* op) {
  if (!rel_bias.has_value() || !rel_bias->defined()) return at::Tensor();
  const at::Tensor& r = *rel_bias;
  TORCH_CHECK(r.device().is_cpu() && detail::is_float_dtype(r.scalar_type()) && r.dim() == 2 && r.size(0) == a.heads &&
                  r.size(1) % 2 == 1 && (r.size(1) + 1) / 2 >= positions,
              "fastbert._C.", op, ": rel_bias must be a float CPU tensor [heads, 2n - 1] = [", a.heads, ", >= ",
              2 * positions - 1, "], got ", r.scalar_type(), " ", r.sizes());
  at::Tensor f = r.to(at::kFloat).contiguous();
  a.rel_bias = f.data_ptr<float>();
  a.rel_n = (r.size(1) + 1) / 2;
  return f;
}

// The relative bias gradient of a backward: [batch, heads, 2n - 1] per pair, zeroed, pointed to by a
// (an empty tensor without a bias); summed over the batch by relative_grad.
at::Tensor relative_grad_buffer(AttnArgs& a) {
  if (a.rel_bias == nullptr) return detail::empty({0}, at::kFloat);
  at::Tensor g = detail::zeros({a.batch, a.heads, 2 * a.rel_n - 1}, at::kFloat);
  a.rel_grad = g.data_ptr<float>();
  return g;
}
at::Tensor relative_grad(const at::Tensor& g, const c10::optional<at::Tensor>& rel_bias) {
  return g.numel() == 0 ? g : g.sum(0).to(rel_bias->scalar_type());
}

// The longest sequence of a packed batch.
int64_t longest(const std::vector<AttnSeq>& seqs) {
  int64_t n = 0;
  for (const AttnSeq& s : seqs) n = std::max(n, s.len);
  return n;
}

// What every entry point sets alike: the sequences, the local-attention window, the rotary tables
// and the relative bias (read for `positions` rows) and the views of q, k, v. Returns the bias as
// the kernels read it, kept alive by the caller.
at::Tensor set_inputs(AttnArgs& a, const std::vector<AttnSeq>& seqs, int64_t positions, int64_t window,
                      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const c10::optional<at::Tensor>& rope_cos, const c10::optional<at::Tensor>& rope_sin,
                      const c10::optional<at::Tensor>& rel_bias, const char* op) {
  a.seqs = seqs.data();
  a.window = window < 0 ? -1 : window;
  set_rope(a, rope_cos, rope_sin, positions, op);
  at::Tensor rel = set_relative(a, rel_bias, positions, op);
  a.q = view_of(q, a.padded), a.k = view_of(k, a.padded), a.v = view_of(v, a.padded);
  return rel;
}

// The forward of a call set up in a (inputs): (out, lse), lse float32 `lse_shape` with strides
// (lse_sb, lse_sh) per (batch, head).
std::pair<at::Tensor, at::Tensor> run_forward(AttnArgs& a, const at::Tensor& q, at::IntArrayRef lse_shape, int64_t lse_sb,
                                              int64_t lse_sh, const char* op) {
  at::Tensor out = detail::empty_output(q);
  at::Tensor lse = detail::empty(lse_shape, at::kFloat);
  a.out = view_of(out, a.padded);
  a.lse = lse.data_ptr<float>(), a.lse_sb = lse_sb, a.lse_sh = lse_sh;
  if (q.numel() > 0) detail::kernels_for(op).attention_forward(a);
  return {out, lse};
}

// The backward of a call set up in a (inputs and lse): (dq, dk, dv, the relative bias gradient).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_backward(AttnArgs& a, const at::Tensor& q,
                                                                        const at::Tensor& dout,
                                                                        const c10::optional<at::Tensor>& rel_bias,
                                                                        const char* op) {
  at::Tensor dq = detail::empty_output(q), dk = detail::empty_output(q), dv = detail::empty_output(q);
  a.dout = view_of(dout, a.padded);
  a.dq = view_of(dq, a.padded), a.dk = view_of(dk, a.padded), a.dv = view_of(dv, a.padded);
  at::Tensor drel = relative_grad_buffer(a);
  if (q.numel() > 0) detail::kernels_for(op).attention_backward(a);
  return {dq, dk, dv, relative_grad(drel, rel_bias)};
}

// DeBERTa's position tables of a call, checked, into a.pos: pos_key, pos_query [heads, rows, d]
// (returned as the float32 copies the kernels read, kept alive by the caller), pos_index int32
// [2n - 1] (n >= positions, the longest sequence) with rows in [0, rows), non-decreasing (the
// kernels read a pair's rows as a span).
std::pair<at::Tensor, at::Tensor> set_positions(AttnArgs& a, const c10::optional<at::Tensor>& pos_key,
                                                const c10::optional<at::Tensor>& pos_query,
                                                const at::Tensor& pos_index, int64_t positions, const char* op) {
  const bool has_key = pos_key.has_value() && pos_key->defined(), has_query = pos_query.has_value() && pos_query->defined();
  TORCH_CHECK(has_key || has_query, "fastbert._C.", op, ": pos_key, pos_query or both must be given");
  int64_t rows = -1;
  at::Tensor tables[2];
  int n = 0;
  for (const auto& [name, t] : {std::pair<const char*, const c10::optional<at::Tensor>&>{"pos_key", pos_key},
                                {"pos_query", pos_query}}) {
    if (t.has_value() && t->defined()) {
      TORCH_CHECK(t->device().is_cpu() && detail::is_float_dtype(t->scalar_type()) && t->dim() == 3 &&
                      t->size(0) == a.heads && t->size(2) == a.d && t->size(1) >= 1 && (rows < 0 || t->size(1) == rows),
                  "fastbert._C.", op, ": ", name, " must be a float CPU tensor [heads, rows, head_dim] = [", a.heads,
                  ", rows, ", a.d, "] (one rows for both tables), got ", t->scalar_type(), " ", t->sizes());
      rows = t->size(1);
      tables[n] = t->to(at::kFloat).contiguous();
    }
    ++n;
  }
  TORCH_CHECK(pos_index.defined() && pos_index.device().is_cpu() && pos_index.scalar_type() == at::kInt &&
                  pos_index.dim() == 1 && pos_index.is_contiguous() && pos_index.numel() % 2 == 1 &&
                  (pos_index.numel() + 1) / 2 >= positions,
              "fastbert._C.", op, ": pos_index must be a contiguous int32 CPU tensor [2n - 1], n >= ", positions,
              ", got ", pos_index.scalar_type(), " ", pos_index.sizes());
  const int32_t* idx = pos_index.data_ptr<int32_t>();
  for (int64_t x = 0; x < pos_index.numel(); ++x) {
    TORCH_CHECK(idx[x] >= 0 && idx[x] < rows && (x == 0 || idx[x] >= idx[x - 1]), "fastbert._C.", op,
                ": pos_index must hold non-decreasing rows in [0, ", rows, "), got ", idx[x], " at ", x);
  }
  a.pos.key = tables[0].defined() ? tables[0].data_ptr<float>() : nullptr;
  a.pos.query = tables[1].defined() ? tables[1].data_ptr<float>() : nullptr;
  a.pos.index = idx;
  a.pos.n = (pos_index.numel() + 1) / 2;
  a.pos.rows = rows;
  return {tables[0], tables[1]};
}

// The layout and sequences of a DeBERTa call: packed when cu_seqlens is given (q [tokens, heads, d]),
// else padded (q [batch, heads, seq, d], key_mask kept alive in `mask`).
std::vector<AttnSeq> disentangled_seqs(AttnArgs& a, const at::Tensor& q, const c10::optional<at::Tensor>& key_mask,
                                       const c10::optional<at::Tensor>& cu_seqlens, at::Tensor& mask, const char* op) {
  if (cu_seqlens.has_value() && cu_seqlens->defined()) {
    check_cu_seqlens(op, *cu_seqlens);
    TORCH_CHECK(!key_mask.has_value() || !key_mask->defined(), "fastbert._C.", op,
                ": packed rows (cu_seqlens) take no key_mask");
    return packed_seqs(a, *cu_seqlens, op);
  }
  mask = bool_mask(key_mask, a.batch, q.size(2), op);
  a.pad_rows = q.size(2);
  return padded_seqs(a, mask, q.size(2), op);
}

// The arguments of a DeBERTa call: q (checked, contiguous rows) gives the layout; returns the args.
AttnArgs disentangled_args(const at::Tensor& q, const c10::optional<at::Tensor>& cu_seqlens, double scale,
                           double dropout_p, int64_t seed, const char* op) {
  const bool packed = cu_seqlens.has_value() && cu_seqlens->defined();
  const int64_t batch = packed ? cu_seqlens->numel() - 1 : q.size(0);
  return common_args(q, !packed, batch, scale, dropout_p, seed, op);
}

int64_t qkv_dims(const c10::optional<at::Tensor>& cu_seqlens) {
  return cu_seqlens.has_value() && cu_seqlens->defined() ? 3 : 4;
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> disentangled_attention_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const c10::optional<at::Tensor>& key_mask,
    const c10::optional<at::Tensor>& cu_seqlens, const c10::optional<at::Tensor>& pos_key,
    const c10::optional<at::Tensor>& pos_query, const at::Tensor& pos_index, double scale, double dropout_p,
    int64_t seed) {
  const char* op = "disentangled_attention_forward";
  check_qkv(op, q_in, k_in, v_in, qkv_dims(cu_seqlens));
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  AttnArgs a = disentangled_args(q, cu_seqlens, scale, dropout_p, seed, op);
  at::Tensor mask;
  const std::vector<AttnSeq> seqs = disentangled_seqs(a, q, key_mask, cu_seqlens, mask, op);
  const auto tables = set_positions(a, pos_key, pos_query, pos_index, a.padded ? q.size(2) : longest(seqs), op);
  set_inputs(a, seqs, 0, -1, q, k, v, c10::nullopt, c10::nullopt, c10::nullopt, op);
  if (a.padded) return run_forward(a, q, {a.batch, a.heads, a.rows}, a.heads * a.rows, a.rows, op);
  return run_forward(a, q, {a.heads, a.rows}, 0, a.rows, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> disentangled_attention_backward(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const c10::optional<at::Tensor>& key_mask,
    const c10::optional<at::Tensor>& cu_seqlens, const c10::optional<at::Tensor>& pos_key,
    const c10::optional<at::Tensor>& pos_query, const at::Tensor& pos_index, double scale, double dropout_p,
    int64_t seed) {
  const char* op = "disentangled_attention_backward";
  check_qkv(op, q_in, k_in, v_in, qkv_dims(cu_seqlens));
  check_like_q(op, "do", dout_in, q_in);
  check_like_q(op, "out", out_in, q_in);  // part of the interface; D comes from P and dP (see backward_pair)
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in),
                   dout = rows_contiguous(dout_in);
  AttnArgs a = disentangled_args(q, cu_seqlens, scale, dropout_p, seed, op);
  at::Tensor mask;
  const std::vector<AttnSeq> seqs = disentangled_seqs(a, q, key_mask, cu_seqlens, mask, op);
  const auto tables = set_positions(a, pos_key, pos_query, pos_index, a.padded ? q.size(2) : longest(seqs), op);
  set_inputs(a, seqs, 0, -1, q, k, v, c10::nullopt, c10::nullopt, c10::nullopt, op);
  const at::Tensor lse = a.padded ? check_lse(op, lse_in, {a.batch, a.heads, a.rows}) : check_lse(op, lse_in, {a.heads, a.rows});
  a.lse = const_cast<float*>(lse.data_ptr<float>());
  a.lse_sb = a.padded ? a.heads * a.rows : 0, a.lse_sh = a.rows;
  // the position tables' gradients per pair, summed over the batch in a fixed order
  auto grads = [&](const c10::optional<at::Tensor>& t, float*& dst) {
    if (!t.has_value() || !t->defined()) return at::Tensor();
    at::Tensor g = detail::zeros({a.batch, a.heads, a.pos.rows, a.d}, at::kFloat);
    dst = g.data_ptr<float>();
    return g;
  };
  const at::Tensor dkey = grads(pos_key, a.pos.dkey), dquery = grads(pos_query, a.pos.dquery);
  auto [dq, dk, dv, unused] = run_backward(a, q, dout, c10::nullopt, op);
  (void)unused;
  auto summed = [&](const at::Tensor& g, const c10::optional<at::Tensor>& t) {
    return g.defined() ? g.sum(0).to(t->scalar_type()) : detail::empty({0}, at::kFloat);
  };
  return {dq, dk, dv, summed(dkey, pos_key), summed(dquery, pos_query)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const c10::optional<at::Tensor>& key_mask,
    double scale, double dropout_p, int64_t seed, bool return_dropout_mask, const c10::optional<at::Tensor>& rope_cos,
    const c10::optional<at::Tensor>& rope_sin, int64_t window, const c10::optional<at::Tensor>& rel_bias) {
  const char* op = "attention_forward";
  check_qkv(op, q_in, k_in, v_in, 4);
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2);
  AttnArgs a = common_args(q, /*padded=*/true, batch, scale, dropout_p, seed, op);
  const at::Tensor mask = bool_mask(key_mask, batch, seq, op);
  const std::vector<AttnSeq> seqs = padded_seqs(a, mask, seq, op);
  a.pad_rows = seq;
  const at::Tensor rel = set_inputs(a, seqs, seq, window, q, k, v, rope_cos, rope_sin, rel_bias, op);
  auto [out, lse] = run_forward(a, q, {batch, heads, seq}, heads * seq, seq, op);
  at::Tensor keep = detail::empty({0}, at::kBool);
  if (return_dropout_mask) {
    std::vector<int64_t> starts(static_cast<size_t>(batch));
    for (size_t b = 0; b < starts.size(); ++b) starts[b] = seqs[b].len > 0 ? seqs[b].first : 0;
    keep = keep_mask(a, starts, seq, op);
  }
  return {out, lse, keep};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const c10::optional<at::Tensor>& key_mask, double scale,
    double dropout_p, int64_t seed, const c10::optional<at::Tensor>& rope_cos, const c10::optional<at::Tensor>& rope_sin,
    int64_t window, const c10::optional<at::Tensor>& rel_bias) {
  const char* op = "attention_backward";
  check_qkv(op, q_in, k_in, v_in, 4);
  check_like_q(op, "do", dout_in, q_in);
  check_like_q(op, "out", out_in, q_in);  // part of the interface; D comes from P and dP (see backward_pair)
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in),
                   dout = rows_contiguous(dout_in);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2);
  const at::Tensor lse = check_lse(op, lse_in, {batch, heads, seq});
  AttnArgs a = common_args(q, /*padded=*/true, batch, scale, dropout_p, seed, op);
  const at::Tensor mask = bool_mask(key_mask, batch, seq, op);
  const std::vector<AttnSeq> seqs = padded_seqs(a, mask, seq, op);
  a.pad_rows = seq;
  const at::Tensor rel = set_inputs(a, seqs, seq, window, q, k, v, rope_cos, rope_sin, rel_bias, op);
  a.lse = const_cast<float*>(lse.data_ptr<float>()), a.lse_sb = heads * seq, a.lse_sh = seq;
  return run_backward(a, q, dout, rel_bias, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& cu_seqlens,
    int64_t max_seqlen, double scale, double dropout_p, int64_t seed, bool return_dropout_mask,
    const c10::optional<at::Tensor>& rope_cos, const c10::optional<at::Tensor>& rope_sin, int64_t window,
    const c10::optional<at::Tensor>& rel_bias) {
  const char* op = "varlen_attention_forward";
  check_qkv(op, q_in, k_in, v_in, 3);
  check_cu_seqlens(op, cu_seqlens);
  TORCH_CHECK(max_seqlen >= 0, "fastbert._C.", op, ": max_seqlen must be >= 0, got ", max_seqlen);
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t tokens = q.size(0), heads = q.size(1);
  AttnArgs a = common_args(q, /*padded=*/false, cu_seqlens.numel() - 1, scale, dropout_p, seed, op);
  const std::vector<AttnSeq> seqs = packed_seqs(a, cu_seqlens, op);
  const at::Tensor rel = set_inputs(a, seqs, longest(seqs), window, q, k, v, rope_cos, rope_sin, rel_bias, op);
  auto [out, lse] = run_forward(a, q, {heads, tokens}, 0, tokens, op);
  at::Tensor keep = detail::empty({0}, at::kBool);
  if (return_dropout_mask) keep = keep_mask(a, std::vector<int64_t>(static_cast<size_t>(a.batch), 0), max_seqlen, op);
  return {out, lse, keep};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_attention_backward(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const at::Tensor& cu_seqlens, int64_t max_seqlen,
    double scale, double dropout_p, int64_t seed, const c10::optional<at::Tensor>& rope_cos,
    const c10::optional<at::Tensor>& rope_sin, int64_t window, const c10::optional<at::Tensor>& rel_bias) {
  const char* op = "varlen_attention_backward";
  (void)max_seqlen;  // the sequences come from cu_seqlens
  check_qkv(op, q_in, k_in, v_in, 3);
  check_cu_seqlens(op, cu_seqlens);
  check_like_q(op, "do", dout_in, q_in);
  check_like_q(op, "out", out_in, q_in);  // part of the interface; D comes from P and dP (see backward_pair)
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in),
                   dout = rows_contiguous(dout_in);
  const int64_t tokens = q.size(0), heads = q.size(1);
  const at::Tensor lse = check_lse(op, lse_in, {heads, tokens});
  AttnArgs a = common_args(q, /*padded=*/false, cu_seqlens.numel() - 1, scale, dropout_p, seed, op);
  const std::vector<AttnSeq> seqs = packed_seqs(a, cu_seqlens, op);
  const at::Tensor rel = set_inputs(a, seqs, longest(seqs), window, q, k, v, rope_cos, rope_sin, rel_bias, op);
  a.lse = const_cast<float*>(lse.data_ptr<float>()), a.lse_sb = 0, a.lse_sh = tokens;
  return run_backward(a, q, dout, rel_bias, op);
}

}  // namespace fastbert
