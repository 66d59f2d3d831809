// Scaled-dot-product attention with a padding mask on the CPU (the "cpp" backend of
// fastbert.ops.attention / varlen_attention), forward and backward, on real tokens only.
//
// Work is split into (sequence, head) pairs, handed out longest sequence first from a shared
// counter to the threads of one at::parallel_for region (lengths vary, so static chunks would leave
// a thread idle). A pair only ever touches its real range [first, first + len) of rows: a padded
// batch of lengths 16..128 padded to 128 does a third of the work of a padded kernel. Rows outside
// the range are written as zeros; holes inside it (masks with gaps) are masked as keys and give
// zero rows as queries.
//
// Every pair is computed by one thread in a fixed order, so results do not depend on the thread
// count. All math is fp32; fp16 / bf16 inputs are converted to fp32 rows first.
//
// The other route the design allowed, one torch SDPA call per unpadded sequence
// (at::_scaled_dot_product_flash_attention_for_cpu on [1, heads, len, d] slices), took 7.7 ms
// (2 threads) on a batch of 32 x 12 heads x 128 x 64 fp32 with lengths 16..128, against 12.2 ms for
// SDPA over the padded batch and 4.2 ms for this kernel.
//
// The forward of a pair is in attention_forward.cpp, the backward in attention_backward.cpp, and
// what they share (the problem, the GEMM, row helpers, the pair scheduler) in attention_common.h;
// this file holds the entry points, their checks and set-up, and the debug keep-mask.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_common.h"
#include "cpu_ops.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace {

using attn::Problem;
using attn::Rows;
using attn::run_backward;
using attn::run_forward;
using attn::Seq;
using attn::W;
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

void set_common(Problem& pb, int64_t batch, int64_t heads, int64_t d, double scale, double dropout_p, int64_t seed,
                const char* op) {
  detail::check_dropout(op, dropout_p, seed);
  TORCH_CHECK(std::isfinite(scale), "fastbert._C.", op, ": scale must be finite, got ", scale);
  pb.batch = batch;
  pb.heads = heads;
  pb.d = d;
  pb.scale = static_cast<float>(scale);
  pb.dropout = dropout_p > 0.0;
  pb.keys = philox::Keys(static_cast<uint64_t>(seed));
  pb.thresh = philox::threshold(dropout_p);
  pb.keep = static_cast<float>(1.0 / (1.0 - dropout_p));
}

// Sequences of a padded batch from a [batch, seq] mask (bool view kept alive by the caller).
void padded_seqs(Problem& pb, const at::Tensor& mask, int64_t seq, bool dropout, const char* op) {
  pb.seqs.assign(static_cast<size_t>(pb.batch), Seq{});
  pb.pad_rows = seq;
  if (!mask.defined()) {
    for (Seq& s : pb.seqs) s.len = seq;
    TORCH_CHECK(!dropout || seq <= kMaxDropoutSeq, "fastbert._C.", op, ": attention dropout takes sequences of at most ",
                kMaxDropoutSeq, " tokens, got ", seq);
    return;
  }
  const bool* m = mask.data_ptr<bool>();
  for (int64_t b = 0; b < pb.batch; ++b) {
    const bool* row = m + b * seq;
    int64_t first = 0, last = seq;
    while (first < seq && !row[first]) ++first;
    while (last > first && !row[last - 1]) --last;
    Seq& s = pb.seqs[static_cast<size_t>(b)];
    s.first = first;
    s.len = last - first;
    s.real = std::all_of(row + first, row + last, [](bool x) { return x; }) ? nullptr : row + first;
    TORCH_CHECK(!dropout || s.len <= kMaxDropoutSeq, "fastbert._C.", op,
                ": attention dropout takes sequences of at most ", kMaxDropoutSeq, " tokens, got ", s.len);
  }
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
void packed_seqs(Problem& pb, const at::Tensor& cu_seqlens, int64_t tokens, bool dropout, const char* op) {
  const at::Tensor cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* c = cu.data_ptr<int64_t>();
  pb.seqs.assign(static_cast<size_t>(pb.batch), Seq{});
  pb.pad_rows = 0;
  TORCH_CHECK(c[0] == 0 && c[pb.batch] == tokens, "fastbert._C.", op, ": cu_seqlens must run from 0 to ", tokens);
  for (int64_t b = 0; b < pb.batch; ++b) {
    TORCH_CHECK(c[b + 1] >= c[b], "fastbert._C.", op, ": cu_seqlens must be non-decreasing");
    pb.seqs[static_cast<size_t>(b)] = Seq{c[b], c[b + 1] - c[b], nullptr};
    TORCH_CHECK(!dropout || c[b + 1] - c[b] <= kMaxDropoutSeq, "fastbert._C.", op,
                ": attention dropout takes sequences of at most ", kMaxDropoutSeq, " tokens");
  }
}

// bool [batch, heads, n, n]: the keep-mask of every (query, key) position (fastbert.reference.
// attention_keep_mask with these starts): counters (b * heads + h) * 2^32 + ((i - start) mod 2^16) * 2^16
// + ((j - start) mod 2^16).
at::Tensor keep_mask(const Problem& pb, const std::vector<int64_t>& starts, int64_t n, double p) {
  at::Tensor mask = at::empty({pb.batch, pb.heads, n, n}, at::TensorOptions().dtype(at::kBool));
  if (mask.numel() == 0) return mask;
  if (p == 0.0) return mask.fill_(true);
  bool* out = mask.data_ptr<bool>();
  const int64_t rows = pb.batch * pb.heads * n;
  at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / n), [&](int64_t r0, int64_t r1) {
    alignas(64) uint32_t u[W];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % n, bh = r / n, b = bh / pb.heads;
      const uint64_t st = static_cast<uint64_t>(starts[static_cast<size_t>(b)]);
      const uint64_t base = (static_cast<uint64_t>(bh) << 32) + (((static_cast<uint64_t>(i) - st) & 0xFFFF) << 16);
      bool* row = out + r * n;
      // j < start wraps to 2^16 - start + j, j >= start is j - start: two runs of consecutive counters
      const int64_t split = std::min<int64_t>(static_cast<int64_t>(st), n);
      for (int run = 0; run < 2; ++run) {
        const int64_t j0 = run == 0 ? 0 : split, j1 = run == 0 ? split : n;
        const uint64_t first = base + ((static_cast<uint64_t>(j0) - st) & 0xFFFF);
        for (int64_t j = j0; j < j1; j += W) {
          vec::store_u32(u, philox::words(first + static_cast<uint64_t>(j - j0), pb.keys));
          const int64_t cnt = std::min<int64_t>(W, j1 - j);
          for (int64_t l = 0; l < cnt; ++l) row[j + l] = (u[l] >> 8) >= pb.thresh;
        }
      }
    }
  });
  return mask;
}

at::Tensor no_keep_mask() { return at::empty({0}, at::TensorOptions().dtype(at::kBool)); }

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

}  // namespace

// Measured against torch.nn.functional.scaled_dot_product_attention with the key mask over the
// padded batch (32 sequences, lengths uniform in 16..128, seq 128, 12 heads, head_dim 64), through
// fastbert.ops.attention, the two called in turn, medians of 20-40 rounds, 2 threads of the 2-core
// AVX-512 VM this was written on (a shared machine: under load all times grow 2-5x and the forward
// ratio drops to about 2x):
//   fp32 forward   cpp 4.2 ms   SDPA 11.2 ms   2.7x      fp32 fwd+bwd   cpp 15.8 ms   SDPA 43.5 ms   2.8x
//   bf16 forward   cpp 3.7 ms   SDPA 12.6 ms   3.5x      bf16 fwd+bwd   cpp 13.8 ms   SDPA 154 ms    11x
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                                                  const at::Tensor& v_in,
                                                                  const c10::optional<at::Tensor>& key_mask,
                                                                  double scale, double dropout_p, int64_t seed,
                                                                  bool return_dropout_mask) {
  const char* op = "attention_forward";
  check_qkv(op, q_in, k_in, v_in, 4);
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), d = q.size(3);
  Problem pb;
  set_common(pb, batch, heads, d, scale, dropout_p, seed, op);
  const at::Tensor mask = bool_mask(key_mask, batch, seq, op);
  padded_seqs(pb, mask, seq, pb.dropout, op);
  at::Tensor out = detail::empty_output(q);
  at::Tensor lse = at::empty({batch, heads, seq}, q.options().dtype(at::kFloat));
  pb.lse = Rows<float>{lse.data_ptr<float>(), heads * seq, seq, 1};
  detail::dispatch_float(q.scalar_type(), op, [&](auto tag) {
    run_forward<decltype(tag)>(pb, q, k, v, out, /*padded=*/true);
  });
  at::Tensor keep = no_keep_mask();
  if (return_dropout_mask) {
    std::vector<int64_t> starts(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      const Seq& s = pb.seqs[static_cast<size_t>(b)];
      starts[static_cast<size_t>(b)] = s.len > 0 ? s.first : 0;
    }
    keep = keep_mask(pb, starts, seq, dropout_p);
  }
  return {out, lse, keep};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const c10::optional<at::Tensor>& key_mask, double scale,
    double dropout_p, int64_t seed) {
  const char* op = "attention_backward";
  check_qkv(op, q_in, k_in, v_in, 4);
  check_like_q(op, "do", dout_in, q_in);
  check_like_q(op, "out", out_in, q_in);  // part of the interface; D comes from P and dP (see backward_pair)
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in),
                   dout = rows_contiguous(dout_in);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), d = q.size(3);
  const at::Tensor lse = check_lse(op, lse_in, {batch, heads, seq});
  Problem pb;
  set_common(pb, batch, heads, d, scale, dropout_p, seed, op);
  const at::Tensor mask = bool_mask(key_mask, batch, seq, op);
  padded_seqs(pb, mask, seq, pb.dropout, op);
  pb.lse = Rows<float>{const_cast<float*>(lse.data_ptr<float>()), heads * seq, seq, 1};
  at::Tensor dq = detail::empty_output(q), dk = detail::empty_output(q), dv = detail::empty_output(q);
  detail::dispatch_float(q.scalar_type(), op, [&](auto tag) {
    run_backward<decltype(tag)>(pb, dout, q, k, v, dq, dk, dv, /*padded=*/true);
  });
  return {dq, dk, dv};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                                                         const at::Tensor& v_in,
                                                                         const at::Tensor& cu_seqlens,
                                                                         int64_t max_seqlen, double scale,
                                                                         double dropout_p, int64_t seed,
                                                                         bool return_dropout_mask) {
  const char* op = "varlen_attention_forward";
  check_qkv(op, q_in, k_in, v_in, 3);
  check_cu_seqlens(op, cu_seqlens);
  TORCH_CHECK(max_seqlen >= 0, "fastbert._C.", op, ": max_seqlen must be >= 0, got ", max_seqlen);
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  Problem pb;
  set_common(pb, cu_seqlens.numel() - 1, heads, d, scale, dropout_p, seed, op);
  packed_seqs(pb, cu_seqlens, tokens, pb.dropout, op);
  at::Tensor out = detail::empty_output(q);
  at::Tensor lse = at::empty({heads, tokens}, q.options().dtype(at::kFloat));
  pb.lse = Rows<float>{lse.data_ptr<float>(), 0, tokens, 1};
  detail::dispatch_float(q.scalar_type(), op, [&](auto tag) {
    run_forward<decltype(tag)>(pb, q, k, v, out, /*padded=*/false);
  });
  at::Tensor keep = no_keep_mask();
  if (return_dropout_mask) {
    keep = keep_mask(pb, std::vector<int64_t>(static_cast<size_t>(pb.batch), 0), max_seqlen, dropout_p);
  }
  return {out, lse, keep};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attention_backward(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const at::Tensor& cu_seqlens, int64_t max_seqlen,
    double scale, double dropout_p, int64_t seed) {
  const char* op = "varlen_attention_backward";
  (void)max_seqlen;  // the sequences come from cu_seqlens
  check_qkv(op, q_in, k_in, v_in, 3);
  check_cu_seqlens(op, cu_seqlens);
  check_like_q(op, "do", dout_in, q_in);
  check_like_q(op, "out", out_in, q_in);  // part of the interface; D comes from P and dP (see backward_pair)
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in),
                   dout = rows_contiguous(dout_in);
  const int64_t tokens = q.size(0), heads = q.size(1), d = q.size(2);
  const at::Tensor lse = check_lse(op, lse_in, {heads, tokens});
  Problem pb;
  set_common(pb, cu_seqlens.numel() - 1, heads, d, scale, dropout_p, seed, op);
  packed_seqs(pb, cu_seqlens, tokens, pb.dropout, op);
  pb.lse = Rows<float>{const_cast<float*>(lse.data_ptr<float>()), 0, tokens, 1};
  at::Tensor dq = detail::empty_output(q), dk = detail::empty_output(q), dv = detail::empty_output(q);
  detail::dispatch_float(q.scalar_type(), op, [&](auto tag) {
    run_backward<decltype(tag)>(pb, dout, q, k, v, dq, dk, dv, /*padded=*/false);
  });
  return {dq, dk, dv};
}

}  // namespace fastbert
