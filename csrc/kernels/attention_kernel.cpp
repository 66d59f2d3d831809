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
// (at::_scaled_dot_product_flash_attention_for_cpu on [1, heads, len, d] slices), was timed on a
// batch of 32 x 12 heads x 128 x 64 fp32 with lengths 16..128: faster than SDPA over the padded
// batch, slower than this kernel, so not taken.
//
// The forward of a pair is in attention_forward.cpp, the backward in attention_backward.cpp, and
// what they share (the problem, the GEMM, row helpers, the pair scheduler) in attention_common.h;
// this file holds the kernel entry points and the debug keep-mask (the checks and the set-up of
// the sequences are the host's, in ../attention.cpp).
#include <algorithm>
#include <cmath>

#include "attention_common.h"
#include "common.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace attn {

Problem problem_of(const kernels::AttnArgs& a) {
  Problem pb;
  pb.batch = a.batch;
  pb.heads = a.heads;
  pb.d = a.d;
  pb.pad_rows = a.pad_rows;
  pb.scale = a.scale;
  pb.dropout = a.dropout_p > 0.0;
  pb.keys = philox::Keys(a.seed);
  pb.thresh = philox::threshold(a.dropout_p);
  pb.keep = static_cast<float>(1.0 / (1.0 - a.dropout_p));
  pb.seqs = a.seqs;
  pb.lse = Rows<float>{a.lse, a.lse_sb, a.lse_sh, 1};
  pb.rope_cos = a.rope_cos;
  pb.rope_sin = a.rope_sin;
  pb.window = a.window;
  pb.rel_bias = a.rel_bias;
  pb.rel_n = a.rel_n;
  pb.rel_grad = a.rel_grad;
  pb.pos = a.pos;
  pb.bf16_min_len = a.bf16_min_len;
  return pb;
}

}  // namespace attn

namespace kernels {

// Measured against torch.nn.functional.scaled_dot_product_attention with the key mask over the
// padded batch (32 sequences, lengths uniform in 16..128, seq 128, 12 heads, head_dim 64) by
// benchmarks/bench_attention.py: faster forward and forward + backward, in fp32 and bf16 (the
// widest gap in bf16's backward, where SDPA is slowest). Today's ratios: benchmarks/RESULTS.md,
// "Ops"; the runs: benchmarks/LOG.md, "Attention on the CPU".
void attention_forward(const AttnArgs& a) {
  dispatch_float(a.dtype, [&](auto tag) { attn::run_forward<decltype(tag)>(a); });
}

void attention_backward(const AttnArgs& a) {
  dispatch_float(a.dtype, [&](auto tag) { attn::run_backward<decltype(tag)>(a); });
}

// out bool [batch, heads, n, n]: the keep-mask of every (query, key) position (fastbert.reference.
// attention_keep_mask with these starts): counters (b * heads + h) * 2^32 + ((i - start) mod 2^16) * 2^16
// + ((j - start) mod 2^16).
void attention_keep_mask(const AttnArgs& a, const int64_t* starts, int64_t n, bool* out) {
  const int64_t rows = a.batch * a.heads * n;
  if (a.dropout_p == 0.0) {
    std::fill(out, out + rows * n, true);
    return;
  }
  const philox::Keys keys(a.seed);
  const uint32_t thresh = philox::threshold(a.dropout_p);
  constexpr int64_t W = vec::kWidth;
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / n), [&](int64_t r0, int64_t r1) {
    alignas(64) uint32_t u[W];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % n, bh = r / n, b = bh / a.heads;
      const uint64_t st = static_cast<uint64_t>(starts[b]);
      const uint64_t base = (static_cast<uint64_t>(bh) << 32) + (((static_cast<uint64_t>(i) - st) & 0xFFFF) << 16);
      bool* row = out + r * n;
      // j < start wraps to 2^16 - start + j, j >= start is j - start: two runs of consecutive counters
      const int64_t split = std::min<int64_t>(static_cast<int64_t>(st), n);
      for (int run = 0; run < 2; ++run) {
        const int64_t j0 = run == 0 ? 0 : split, j1 = run == 0 ? split : n;
        const uint64_t first = base + ((static_cast<uint64_t>(j0) - st) & 0xFFFF);
        for (int64_t j = j0; j < j1; j += W) {
          vec::store_u32(u, philox::words(first + static_cast<uint64_t>(j - j0), keys));
          const int64_t cnt = std::min<int64_t>(W, j1 - j);
          for (int64_t l = 0; l < cnt; ++l) row[j + l] = (u[l] >> 8) >= thresh;
        }
      }
    }
  });
}

}  // namespace kernels
}  // namespace fastbert
