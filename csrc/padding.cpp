// Index building for fastbert.ops.unpad on the CPU: one pass over a [batch, seq] padding mask.
#include <ATen/Dispatch.h>

#include <limits>

#include "cpu_ops.h"

namespace fastbert {

std::tuple<at::Tensor, at::Tensor, int64_t> unpad_indices(const at::Tensor& attention_mask) {
  const char* op = "unpad_indices";
  TORCH_CHECK(attention_mask.defined(), "fastbert._C.", op, ": attention_mask is undefined");
  TORCH_CHECK(attention_mask.dim() == 2, "fastbert._C.", op, ": attention_mask must be 2-D [batch, seq], got shape ",
              attention_mask.sizes());
  TORCH_CHECK(attention_mask.device().is_cpu(), "fastbert._C.", op, ": attention_mask must be a CPU tensor, got ",
              attention_mask.device());
  TORCH_CHECK(!attention_mask.is_complex(), "fastbert._C.", op, ": attention_mask must be bool, integer or float");
  const at::Tensor m = attention_mask.contiguous();
  const int64_t batch = m.size(0), seq = m.size(1);
  TORCH_CHECK(batch * seq <= std::numeric_limits<int32_t>::max(), "fastbert._C.", op,
              ": int32 cu_seqlens hold at most 2**31 - 1 tokens, the mask has ", batch * seq, " positions");
  // capacity for every position; shrunk to the real-token count below (resize_ keeps the storage)
  at::Tensor indices = detail::empty({batch * seq}, at::kLong);
  at::Tensor cu_seqlens = detail::empty({batch + 1}, at::kInt);
  int64_t* idx = indices.data_ptr<int64_t>();
  int32_t* cu = cu_seqlens.data_ptr<int32_t>();
  int64_t total = 0, max_seqlen = 0;
  cu[0] = 0;
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, m.scalar_type(), "unpad_indices", [&] {
    const scalar_t* p = m.data_ptr<scalar_t>();
    const scalar_t zero = static_cast<scalar_t>(0);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t before = total;
      const scalar_t* row = p + b * seq;
      for (int64_t s = 0; s < seq; ++s) {
        idx[total] = b * seq + s;
        total += row[s] != zero;  // written always, kept only for a real token: no branch
      }
      cu[b + 1] = static_cast<int32_t>(total);
      max_seqlen = std::max(max_seqlen, total - before);
    }
  });
  indices.resize_({total});
  return {indices, cu_seqlens, max_seqlen};
}

}  // namespace fastbert
