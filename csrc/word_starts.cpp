// Whole-word masking's input on the CPU: which WordPiece tokens start a word (a table over the
// vocabulary: no "##" prefix), and that table looked up for a batch of ids (masking.h).
#include <ATen/Parallel.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpu_ops.h"
#include "masking.h"

namespace fastbert {

at::Tensor word_start_table(const std::vector<std::string>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  at::Tensor table = detail::empty({n}, at::kBool);
  bool* p = table.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    const std::string& t = tokens[static_cast<size_t>(i)];
    p[i] = !(t.size() >= 2 && t[0] == '#' && t[1] == '#');
  }
  return table;
}

at::Tensor word_starts(const at::Tensor& input_ids, const at::Tensor& table) {
  const char* op = "fastbert._C.word_starts";
  TORCH_CHECK_VALUE(input_ids.defined() && input_ids.device().is_cpu(), op, ": input_ids must be a CPU tensor");
  TORCH_CHECK_TYPE(input_ids.scalar_type() == at::kLong, op, ": input_ids must be int64, got ",
                   input_ids.scalar_type());
  TORCH_CHECK_VALUE(input_ids.is_contiguous(), op, ": input_ids must be contiguous");
  TORCH_CHECK_VALUE(table.defined() && table.device().is_cpu() && table.dim() == 1 && table.is_contiguous(), op,
                    ": the word-start table must be a contiguous 1-D CPU tensor");
  TORCH_CHECK_TYPE(table.scalar_type() == at::kBool, op, ": the word-start table must be bool, got ",
                   table.scalar_type());
  at::Tensor out = detail::empty(input_ids.sizes(), at::kBool);
  const int64_t n = input_ids.numel(), vocab = table.numel();
  if (n == 0) return out;
  const int64_t* ids = input_ids.data_ptr<int64_t>();
  const uint8_t* tab = reinterpret_cast<const uint8_t*>(table.data_ptr<bool>());
  uint8_t* o = reinterpret_cast<uint8_t*>(out.data_ptr<bool>());
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> first_bad(chunks, -1);
  at::parallel_for(0, chunks, 16, [&](int64_t c0, int64_t c1) {  // tasks of 256k ids at least
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t i0 = ch * kChunk, i1 = std::min(n, i0 + kChunk);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t v = ids[i];
        if (static_cast<uint64_t>(v) >= static_cast<uint64_t>(vocab)) {
          first_bad[ch] = i;
          break;
        }
        o[i] = tab[v];
      }
    }
  });
  for (int64_t ch = 0; ch < chunks; ++ch) {
    TORCH_CHECK_VALUE(first_bad[ch] < 0, op, ": input_ids holds ", ids[first_bad[ch] < 0 ? 0 : first_bad[ch]],
                      " (flat index ", first_bad[ch], "), outside [0, vocab size of the table = ", vocab, ")");
  }
  return out;
}

}  // namespace fastbert
