// A model's inference layers on the GPU launched from C++: the GEMMs through ATen, the Triton
// kernels through the driver's cuLaunchKernelEx with their compiled variants registered from Python
// (fastbert.ops.encoder). No CUDA header or library is needed to build it: the driver's entry point
// is handed over as an address, the stream as the integer torch gives.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fastbert {

// The kernels a post-LN layer launches, each a role: which values the layer computes for it.
enum class LaunchRole : int { kRanges = 0, kAttention = 1, kNorm = 2, kGelu = 3, kNormSum = 4, kGeglu = 5 };

// The names of each role's values, in the order the layer computes them (Python maps a kernel's
// varying arguments to them by name).
std::vector<std::vector<std::string>> launch_role_names();

// An argument value as a layer computes it: a tensor's address (with its dtype), none, an int, a float.
struct LaunchValue {
  enum Kind : int8_t { kNone = 0, kPointer = 1, kInt = 2, kFloat = 3 };
  Kind kind = kNone;
  int8_t dtype = -1;
  int64_t i = 0;
  double f = 0.0;
};

// One compiled variant of a kernel: what cuLaunchKernelEx takes, and the classes its varying values
// must have (the specialization the JIT compiled it for).
struct LaunchVariant {
  uint64_t function = 0;
  uint32_t threads = 0, shared = 0;
  std::string kinds;                            // per kernel parameter: p, b, i, l, f, d
  std::vector<uint64_t> bits;                   // per parameter: its fixed value's bytes (slot < 0)
  std::vector<int16_t> slots;                   // per parameter: the role's value it takes, or -1
  std::vector<std::pair<int16_t, int32_t>> checks;  // (value, class) for each varying argument
  std::vector<at::Tensor> held;                 // the fixed tensors whose addresses are in bits
};

struct LaunchPosition {
  LaunchRole role = LaunchRole::kNorm;
  int64_t block_m = 1, grid_n = 1;  // the grid's rule's constants (the variants' tiles)
  std::vector<LaunchVariant> variants;
};

// The launches of one layer, in order (every layer of a stack alike), and their registered variants.
class LaunchProgram {
 public:
  LaunchProgram(uint64_t launch_fn, std::vector<int64_t> roles);

  // Register a variant for launch `position` of a layer from a recorded launch: per positional
  // argument of the kernel, its parameter kind ('-': none), its value (value_kinds: 0 none, 1 tensor,
  // 2 int, 3 float; tensors / ints / floats hold it) and the role's value it varies with (-1: fixed).
  // False where a variant of the same classes was registered with another launch (another kernel or
  // fixed value), or this one's tiles are not the position's: the program's kind was keyed too
  // coarsely, and must not be launched from here.
  bool add(int64_t position, uint64_t function, int64_t threads, int64_t shared, const std::string& kinds,
           const std::vector<int64_t>& value_kinds, const std::vector<c10::optional<at::Tensor>>& tensors,
           const std::vector<int64_t>& ints, const std::vector<double>& floats, const std::vector<int64_t>& slots,
           int64_t block_m, int64_t grid_n);

  int64_t size() const { return static_cast<int64_t>(positions_.size()); }
  int64_t variants(int64_t position) const;

  // Launch `position`'s variant for `values` on `stream` with `grid`; false (nothing launched) where
  // no registered variant was compiled for their classes.
  bool launch(size_t position, const std::vector<LaunchValue>& values, int64_t gx, int64_t gy, int64_t gz,
              uint64_t stream) const;

  const LaunchPosition& position(size_t i) const { return positions_[i]; }

 private:
  uint64_t launch_fn_;
  std::vector<LaunchPosition> positions_;
};

// Post-LN layers (BERT's) for inference on the Triton kernels, launched from here: per layer
// qkv = x Wqkv^T + b, the attention over the QKV rows written over its queries (the key mask's
// ranges first), h1 = layer_norm(ctx Wo^T + bo + x) over its GEMM's output, gelu(h1 Wi^T + bi)
// over its own, out = layer_norm(.. Wf^T + bf + h1); what fastbert.ops.encoder's Python route
// launches, in its order, with the same arguments. weights: 12 per layer (LayerWeights' order),
// eps: 2 per layer; x [rows, hidden] contiguous; key_mask bool [batch, seq] or cu_seqlens int32
// [batch + 1] or neither (seq: the padded length or max_seqlen); sink: fp32, at least heads * rows.
// -> every layer's output (keep_states) or the last; empty where a launch had no registered variant
// (the caller runs the layers its own way then, and registers what they launched).
std::vector<at::Tensor> post_ln_stack(const LaunchProgram& program, const at::Tensor& x,
                                      const std::vector<at::Tensor>& weights, const std::vector<double>& eps,
                                      int64_t heads, const c10::optional<at::Tensor>& key_mask,
                                      const c10::optional<at::Tensor>& cu_seqlens, int64_t seq, const at::Tensor& sink,
                                      uint64_t stream, bool keep_states);

// Pre-LN layers (ModernBERT's) for inference, launched from here: the residual stream enters as x
// alone (layer 0 has no attention norm) and leaves as (stream, delta), stream + delta the layers'
// output; per layer [(stream, normed) = add + norm(delta, stream), over delta and stream], qkv = normed
// Wqkv^T (+ b), the attention with its rotary tables (ropes: cos, sin per layer) and window, (stream,
// normed) = add + norm(ctx Wo^T (+ b), stream), over the product and (but in layer 0, where a fresh
// tensor takes it) the stream, delta = geglu(normed Wi^T (+ b)) Wf^T (+ b); what
// fastbert.ops.encoder's prenorm route launches, in its order. weights: 12 per layer
// (PreNormLayerWeights' order, None where a layer has none: a bias, layer 0's attention norm); the
// program's launches are the whole stack's (layers differ: their windows, their first). -> [stream,
// delta], or empty as post_ln_stack's.
std::vector<at::Tensor> pre_ln_stack(const LaunchProgram& program, const at::Tensor& x,
                                     const std::vector<c10::optional<at::Tensor>>& weights,
                                     const std::vector<double>& eps, int64_t heads, const std::vector<at::Tensor>& ropes,
                                     const c10::optional<at::Tensor>& key_mask,
                                     const c10::optional<at::Tensor>& cu_seqlens, int64_t seq, const at::Tensor& sink,
                                     uint64_t stream);

}  // namespace fastbert
