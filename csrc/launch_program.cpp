// A model's inference layers on the GPU launched from C++ (launch_program.h). A layer's Python route
// costs the host some 60-100 us beyond its launches and GEMMs (benchmarks/RESULTS.md, "The CUDA
// path's host cost"): its launches computed and packed here, the whole stack is one call.
#include "launch_program.h"

#include <climits>
#include <cstring>

namespace fastbert {

namespace {

// CUlaunchConfig (cuda.h, CUDA 12), field for field: the driver's entry point reads it
struct DriverLaunchConfig {
  unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
  void* stream;
  void* attrs;
  unsigned int num_attrs;
};
using LaunchKernelEx = int (*)(const DriverLaunchConfig*, void* function, void** params, void** extra);

constexpr int kMaxParams = 96;

LaunchValue none() { return LaunchValue{}; }

LaunchValue pointer(const at::Tensor& t, int64_t byte_offset = 0) {
  LaunchValue v;
  v.kind = LaunchValue::kPointer;
  v.dtype = static_cast<int8_t>(t.scalar_type());
  v.i = reinterpret_cast<int64_t>(t.data_ptr()) + byte_offset;
  return v;
}

LaunchValue integer(int64_t i) {
  LaunchValue v;
  v.kind = LaunchValue::kInt;
  v.i = i;
  return v;
}

LaunchValue real(double f) {
  LaunchValue v;
  v.kind = LaunchValue::kFloat;
  v.f = f;
  return v;
}

// The class of a value as Triton's JIT specializes on it, refined: two values of one class take the
// same compiled kernel (an int's width, whether it is 1 or a multiple of 16; a pointer's dtype and
// 16-byte alignment; none).
int32_t class_of(const LaunchValue& v) {
  switch (v.kind) {
    case LaunchValue::kNone:
      return 1;
    case LaunchValue::kFloat:
      return 2;
    case LaunchValue::kInt: {
      const bool wide = v.i < INT32_MIN || v.i > INT32_MAX;
      return 16 + (wide ? 4 : 0) + (v.i == 1 ? 2 : (v.i % 16 == 0 ? 1 : 0));
    }
    case LaunchValue::kPointer:
      return 1024 + 2 * (v.dtype + 1) + (v.i % 16 == 0 ? 1 : 0);
  }
  return 0;
}

// A value as the parameter of kind `kind` reads it from its first bytes (little-endian)
uint64_t bits_of(const LaunchValue& v, char kind) {
  uint64_t out = 0;
  switch (kind) {
    case 'f': {
      const float f = static_cast<float>(v.kind == LaunchValue::kFloat ? v.f : static_cast<double>(v.i));
      std::memcpy(&out, &f, sizeof f);
      return out;
    }
    case 'd': {
      const double d = v.kind == LaunchValue::kFloat ? v.f : static_cast<double>(v.i);
      std::memcpy(&out, &d, sizeof d);
      return out;
    }
    case 'b':
      return static_cast<uint64_t>(v.i) & 0xffu;
    case 'i':
      return static_cast<uint64_t>(static_cast<uint32_t>(v.i));
    default:  // p, l
      return static_cast<uint64_t>(v.i);
  }
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The attention role's values for the QKV rows qkv [rows, 3 hidden] (the context written over the
// queries; the log-sum-exp into the sink), as kernels.attention.qkv_attention_forward computes them.
void attention_values(std::vector<LaunchValue>& values, const at::Tensor& qkv, const at::Tensor& sink,
                      const c10::optional<at::Tensor>& key_mask, const at::Tensor& ranges,
                      const c10::optional<at::Tensor>& cu_seqlens, int64_t heads, int64_t seq, const at::Tensor* cos,
                      const at::Tensor* sin) {
  const bool masked = key_mask.has_value(), varlen = cu_seqlens.has_value();
  const int64_t rows = qkv.size(0), hidden = qkv.size(1) / 3, es = static_cast<int64_t>(qkv.element_size());
  const int64_t step = seq * qkv.stride(0);
  values = {pointer(qkv),
            pointer(sink),
            pointer(qkv),
            pointer(qkv, hidden * es),
            pointer(qkv, 2 * hidden * es),
            varlen ? pointer(*cu_seqlens) : none(),
            masked ? pointer(*key_mask) : none(),
            masked ? pointer(ranges) : none(),
            integer(heads * seq),
            integer(varlen ? rows : seq),
            integer(step),
            integer(step),
            integer(step),
            integer(step),
            integer(masked ? key_mask->stride(0) : 0),
            integer(seq),
            integer(0),
            cos != nullptr ? pointer(*cos) : none(),
            sin != nullptr ? pointer(*sin) : none()};
}

// The key mask's ranges ([batch, 2] int32, fresh) and their launch at `position`; false as launch's.
bool launch_ranges(const LaunchProgram& program, size_t position, std::vector<LaunchValue>& values,
                   const at::Tensor& key_mask, at::Tensor& ranges, int64_t seq, uint64_t stream) {
  const int64_t batch = key_mask.size(0);
  ranges = at::empty({batch, 2}, key_mask.options().dtype(at::kInt));
  values = {pointer(ranges), pointer(key_mask), integer(key_mask.stride(0)), integer(seq)};
  return program.launch(position, values, batch, 1, 1, stream);
}

// The (add + norm) role's values: y = norm(x + residual) over x, the statistics into the sink; with
// sum_out, the sum into it (the norm-with-sum role's).
void norm_values(std::vector<LaunchValue>& values, const at::Tensor& x, const at::Tensor& residual,
                 const at::Tensor& weight, const at::Tensor* bias, double eps, const at::Tensor& sink,
                 const at::Tensor* sum_out) {
  values = {pointer(x), integer(x.stride(0)), pointer(sink), pointer(sink), pointer(x), integer(x.stride(0)),
            pointer(residual), integer(residual.stride(0)), pointer(weight), pointer(bias != nullptr ? *bias : weight),
            integer(x.size(0)), real(eps)};
  if (sum_out != nullptr) {
    values.push_back(pointer(*sum_out));
    values.push_back(integer(sum_out->stride(0)));
  }
}

// x W^T + b, or x W^T where there is no bias: rows_forward's product
at::Tensor product(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  return bias.has_value() ? at::addmm(*bias, x, weight.t()) : at::mm(x, weight.t());
}

}  // namespace

std::vector<std::vector<std::string>> launch_role_names() {
  return {
      {"RANGES", "MASK", "stride_mb", "seq"},
      {"OUT", "LSE", "Q", "K", "V", "CU_SEQLENS", "MASK", "RANGES", "stride_lb", "stride_lh", "stride_ob", "stride_qb",
       "stride_kb", "stride_vb", "stride_mb", "seq", "seed", "ROPE_COS", "ROPE_SIN"},
      {"Y", "stride_ym", "MEAN", "RSTD", "X", "stride_xm", "RES", "stride_rm", "W", "B", "M", "eps"},
      {"Y", "stride_ym", "X", "stride_xm", "BIAS", "M"},
      {"Y", "stride_ym", "MEAN", "RSTD", "X", "stride_xm", "RES", "stride_rm", "W", "B", "M", "eps", "S", "stride_sm"},
      {"Y", "stride_ym", "X", "stride_xm", "M"},
  };
}

LaunchProgram::LaunchProgram(uint64_t launch_fn, std::vector<int64_t> roles) : launch_fn_(launch_fn) {
  TORCH_CHECK(launch_fn != 0, "fastbert: LaunchProgram needs the driver's cuLaunchKernelEx");
  for (int64_t r : roles) {
    TORCH_CHECK(r >= 0 && r <= 5, "fastbert: LaunchProgram: unknown role ", r);
    LaunchPosition p;
    p.role = static_cast<LaunchRole>(r);
    positions_.push_back(std::move(p));
  }
}

int64_t LaunchProgram::variants(int64_t position) const {
  TORCH_CHECK(position >= 0 && position < size(), "fastbert: LaunchProgram: no launch ", position);
  return static_cast<int64_t>(positions_[position].variants.size());
}

bool LaunchProgram::add(int64_t position, uint64_t function, int64_t threads, int64_t shared, const std::string& kinds,
                        const std::vector<int64_t>& value_kinds, const std::vector<c10::optional<at::Tensor>>& tensors,
                        const std::vector<int64_t>& ints, const std::vector<double>& floats,
                        const std::vector<int64_t>& slots, int64_t block_m, int64_t grid_n) {
  TORCH_CHECK(position >= 0 && position < size(), "fastbert: LaunchProgram: no launch ", position);
  const size_t n = kinds.size();
  TORCH_CHECK(value_kinds.size() == n && tensors.size() == n && ints.size() == n && floats.size() == n &&
                  slots.size() == n,
              "fastbert: LaunchProgram.add: one kind, value and slot per argument");
  TORCH_CHECK(block_m >= 1 && grid_n >= 1 && threads >= 32 && shared >= 0, "fastbert: LaunchProgram.add: bad launch");
  const size_t n_values = launch_role_names()[static_cast<int>(positions_[position].role)].size();
  LaunchVariant v;
  v.function = function;
  v.threads = static_cast<uint32_t>(threads);
  v.shared = static_cast<uint32_t>(shared);
  for (size_t i = 0; i < n; ++i) {
    LaunchValue value;
    switch (value_kinds[i]) {
      case 0:
        break;
      case 1:
        TORCH_CHECK(tensors[i].has_value(), "fastbert: LaunchProgram.add: argument ", i, " has no tensor");
        value = pointer(*tensors[i]);
        break;
      case 2:
        value = integer(ints[i]);
        break;
      case 3:
        value = real(floats[i]);
        break;
      default:
        TORCH_CHECK(false, "fastbert: LaunchProgram.add: unknown value kind ", value_kinds[i]);
    }
    const int64_t slot = slots[i];
    TORCH_CHECK(slot >= -1 && slot < static_cast<int64_t>(n_values), "fastbert: LaunchProgram.add: bad slot ", slot);
    if (slot >= 0) {
      v.checks.emplace_back(static_cast<int16_t>(slot), class_of(value));
    } else if (value.kind == LaunchValue::kPointer) {
      v.held.push_back(*tensors[i]);  // a fixed tensor (an absent argument's stand-in): its address kept alive
    }
    const char kind = kinds[i];
    if (kind == '-') continue;  // no parameter of the compiled kernel: a constexpr, or a value the JIT made one
    TORCH_CHECK(std::strchr("pbilfd", kind) != nullptr, "fastbert: LaunchProgram.add: unknown parameter kind ", kind);
    v.kinds.push_back(kind);
    v.bits.push_back(slot < 0 ? bits_of(value, kind) : 0);
    v.slots.push_back(static_cast<int16_t>(slot));
  }
  TORCH_CHECK(v.kinds.size() + 2 <= static_cast<size_t>(kMaxParams), "fastbert: LaunchProgram.add: too many parameters");
  LaunchPosition& p = positions_[position];
  // the grid's rule is the position's: every variant of it must have the same tiles
  if (!p.variants.empty() && (p.block_m != block_m || p.grid_n != grid_n)) return false;
  for (const LaunchVariant& known : p.variants) {
    if (known.checks == v.checks) {  // registered before: the same classes must take the same launch
      return known.function == v.function && known.threads == v.threads && known.shared == v.shared &&
             known.kinds == v.kinds && known.bits == v.bits && known.slots == v.slots;
    }
  }
  p.block_m = block_m;
  p.grid_n = grid_n;
  p.variants.push_back(std::move(v));
  return true;
}

bool LaunchProgram::launch(size_t position, const std::vector<LaunchValue>& values, int64_t gx, int64_t gy,
                           int64_t gz, uint64_t stream) const {
  const LaunchPosition& p = positions_[position];
  int32_t classes[32];
  const size_t n_values = values.size() < 32 ? values.size() : 32;
  for (size_t i = 0; i < n_values; ++i) classes[i] = class_of(values[i]);
  for (const LaunchVariant& v : p.variants) {
    bool match = true;
    for (const auto& [slot, cls] : v.checks) {
      if (static_cast<size_t>(slot) >= n_values || classes[slot] != cls) {
        match = false;
        break;
      }
    }
    if (!match) continue;
    if (gx * gy * gz == 0) return true;  // nothing to launch, as Triton's launcher skips an empty grid
    uint64_t storage[kMaxParams];
    void* params[kMaxParams];
    const size_t n = v.kinds.size();
    for (size_t j = 0; j < n; ++j) {
      storage[j] = v.slots[j] < 0 ? v.bits[j] : bits_of(values[v.slots[j]], v.kinds[j]);
      params[j] = &storage[j];
    }
    storage[n] = storage[n + 1] = 0;  // the global and profile scratch pointers: none
    params[n] = &storage[n];
    params[n + 1] = &storage[n + 1];
    DriverLaunchConfig config{static_cast<unsigned int>(gx), static_cast<unsigned int>(gy),
                              static_cast<unsigned int>(gz), v.threads, 1, 1, v.shared,
                              reinterpret_cast<void*>(stream), nullptr, 0};
    const int err = reinterpret_cast<LaunchKernelEx>(launch_fn_)(&config, reinterpret_cast<void*>(v.function), params,
                                                                 nullptr);
    TORCH_CHECK(err == 0, "fastbert: cuLaunchKernelEx failed with CUDA error ", err);
    return true;
  }
  return false;
}

std::vector<at::Tensor> post_ln_stack(const LaunchProgram& program, const at::Tensor& x,
                                      const std::vector<at::Tensor>& weights, const std::vector<double>& eps,
                                      int64_t heads, const c10::optional<at::Tensor>& key_mask,
                                      const c10::optional<at::Tensor>& cu_seqlens, int64_t seq, const at::Tensor& sink,
                                      uint64_t stream, bool keep_states) {
  const char* op = "post_ln_stack";
  const int64_t layers = static_cast<int64_t>(weights.size() / 12);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 12 * layers && static_cast<int64_t>(eps.size()) == 2 * layers,
              "fastbert: ", op, ": 12 weights and 2 eps per layer");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "fastbert: ", op, ": x must be contiguous [rows, hidden]");
  const bool masked = key_mask.has_value(), varlen = cu_seqlens.has_value();
  TORCH_CHECK(!(masked && varlen), "fastbert: ", op, ": a key mask or cu_seqlens, not both");
  TORCH_CHECK(program.size() == (masked ? 5 : 4), "fastbert: ", op, ": the program is not a post-LN layer's");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(seq >= 1 && heads >= 1 && hidden % heads == 0, "fastbert: ", op, ": bad seq or heads");
  const int64_t batch = varlen ? cu_seqlens->size(0) - 1 : rows / seq;
  TORCH_CHECK(varlen || batch * seq == rows, "fastbert: ", op, ": rows must be batch x seq");
  TORCH_CHECK(sink.scalar_type() == at::kFloat && sink.numel() >= heads * rows, "fastbert: ", op, ": sink too small");
  const size_t first = masked ? 1 : 0;  // the attention's launch; the mask's ranges before it
  const LaunchPosition& attention = program.position(first);
  const LaunchPosition& norm1 = program.position(first + 1);
  const LaunchPosition& gelu = program.position(first + 2);
  const LaunchPosition& norm2 = program.position(first + 3);
  std::vector<at::Tensor> outs;
  std::vector<LaunchValue> values;
  values.reserve(32);
  at::Tensor h = x;
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = &weights[static_cast<size_t>(12 * l)];
    at::Tensor qkv = at::addmm(w[1], h, w[0].t());
    at::Tensor ranges;
    if (masked && !launch_ranges(program, 0, values, *key_mask, ranges, seq, stream)) return {};
    attention_values(values, qkv, sink, key_mask, ranges, cu_seqlens, heads, seq, nullptr, nullptr);
    if (!program.launch(first, values, cdiv(seq, attention.block_m), heads, batch, stream)) return {};
    at::Tensor a = at::addmm(w[3], qkv.narrow(1, 0, hidden), w[2].t());
    norm_values(values, a, h, w[4], &w[5], eps[2 * l], sink, nullptr);
    if (!program.launch(first + 1, values, cdiv(rows, norm1.block_m), 1, 1, stream)) return {};
    at::Tensor inter = at::mm(a, w[6].t());
    values = {pointer(inter), integer(inter.stride(0)), pointer(inter), integer(inter.stride(0)), pointer(w[7]),
              integer(rows)};
    if (!program.launch(first + 2, values, cdiv(rows, gelu.block_m), gelu.grid_n, 1, stream)) return {};
    at::Tensor f = at::addmm(w[9], inter, w[8].t());
    norm_values(values, f, a, w[10], &w[11], eps[2 * l + 1], sink, nullptr);
    if (!program.launch(first + 3, values, cdiv(rows, norm2.block_m), 1, 1, stream)) return {};
    h = f;
    if (keep_states) outs.push_back(h);
  }
  if (!keep_states) outs.push_back(h);
  return outs;
}

std::vector<at::Tensor> pre_ln_stack(const LaunchProgram& program, const at::Tensor& x,
                                     const std::vector<c10::optional<at::Tensor>>& weights,
                                     const std::vector<double>& eps, int64_t heads, const std::vector<at::Tensor>& ropes,
                                     const c10::optional<at::Tensor>& key_mask,
                                     const c10::optional<at::Tensor>& cu_seqlens, int64_t seq, const at::Tensor& sink,
                                     uint64_t stream) {
  const char* op = "pre_ln_stack";
  const int64_t layers = static_cast<int64_t>(weights.size() / 12);
  TORCH_CHECK(layers >= 1 && static_cast<int64_t>(weights.size()) == 12 * layers &&
                  static_cast<int64_t>(eps.size()) == 2 * layers && static_cast<int64_t>(ropes.size()) == 2 * layers,
              "fastbert: ", op, ": 12 weights, 2 eps and 2 rotary tables per layer");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "fastbert: ", op, ": x must be contiguous [rows, hidden]");
  const bool masked = key_mask.has_value(), varlen = cu_seqlens.has_value();
  TORCH_CHECK(!(masked && varlen), "fastbert: ", op, ": a key mask or cu_seqlens, not both");
  const int64_t per_layer = masked ? 5 : 4;
  TORCH_CHECK(program.size() == per_layer * layers - 1, "fastbert: ", op, ": the program is not this stack's");
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(seq >= 1 && heads >= 1 && hidden % heads == 0, "fastbert: ", op, ": bad seq or heads");
  const int64_t batch = varlen ? cu_seqlens->size(0) - 1 : rows / seq;
  TORCH_CHECK(varlen || batch * seq == rows, "fastbert: ", op, ": rows must be batch x seq");
  TORCH_CHECK(sink.scalar_type() == at::kFloat && sink.numel() >= heads * rows, "fastbert: ", op, ": sink too small");
  std::vector<LaunchValue> values;
  values.reserve(32);
  at::Tensor residual = x, delta, normed;
  size_t p = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const c10::optional<at::Tensor>* w = &weights[static_cast<size_t>(12 * l)];
    TORCH_CHECK(w[2].has_value() && w[4].has_value() && w[6].has_value() && w[8].has_value() && w[10].has_value() &&
                    (l == 0) == !w[0].has_value(),
                "fastbert: ", op, ": layer ", l, " lacks a weight");
    if (l == 0) {
      normed = residual;
    } else {  // norm(delta + stream) over delta, the sum over the stream
      norm_values(values, delta, residual, *w[0], w[1] ? &*w[1] : nullptr, eps[2 * l], sink, &residual);
      if (!program.launch(p, values, cdiv(rows, program.position(p).block_m), 1, 1, stream)) return {};
      ++p;
      normed = delta;
    }
    at::Tensor qkv = product(normed, *w[2], w[3]);
    at::Tensor ranges;
    if (masked && !launch_ranges(program, p++, values, *key_mask, ranges, seq, stream)) return {};
    attention_values(values, qkv, sink, key_mask, ranges, cu_seqlens, heads, seq, &ropes[2 * l], &ropes[2 * l + 1]);
    if (!program.launch(p, values, cdiv(seq, program.position(p).block_m), heads, batch, stream)) return {};
    ++p;
    at::Tensor a = product(qkv.narrow(1, 0, hidden), *w[4], w[5]);
    // layer 0's stream is the embeddings' output, not to be written over: its sum goes to a fresh tensor
    at::Tensor sum = l == 0 ? at::empty_like(a) : residual;
    norm_values(values, a, residual, *w[6], w[7] ? &*w[7] : nullptr, eps[2 * l + 1], sink, &sum);
    if (!program.launch(p, values, cdiv(rows, program.position(p).block_m), 1, 1, stream)) return {};
    ++p;
    residual = sum;
    at::Tensor gated_in = product(a, *w[8], w[9]);
    at::Tensor gated = at::empty({rows, gated_in.size(1) / 2}, gated_in.options());
    values = {pointer(gated), integer(gated.stride(0)), pointer(gated_in), integer(gated_in.stride(0)), integer(rows)};
    const LaunchPosition& geglu = program.position(p);
    if (!program.launch(p, values, cdiv(rows, geglu.block_m), geglu.grid_n, 1, stream)) return {};
    ++p;
    delta = product(gated, *w[10], w[11]);
  }
  return {residual, delta};
}

}  // namespace fastbert
