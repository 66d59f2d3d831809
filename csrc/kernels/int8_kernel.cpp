// The element-wise kernels of int8 inference on the CPU: the epilogue of every int8 GEMM fused into
// the op that consumes its output, and the dynamic quantization of every GEMM input fused into the
// op that produces it.
//
// Activations are quantized per row (token), asymmetrically: the row's midpoint o = (max + min) / 2
// is taken out and the rest scaled to [-127, 127], x ~ q_x * s + o. Weights are quantized per output
// channel, symmetrically: w ~ q_w * s_col. A quantized activation tensor carries one more row than
// it has tokens, all ones: the GEMM acc = q_x q_w^T (int32) then also yields, in that last row, the
// column sums sum_k q_w[n, k] that the offsets need, so nothing derived from a weight is kept
// anywhere. The linear layer's output x w^T + b is then
//   y[m, n] = (acc[m, n] * s[m] + o[m] * acc[rows, n]) * s_col[n] + b[n]
// (the dequantization, or "epilogue"), which the consumer of the output applies as it reads a row:
//   int8_add_layer_norm   y = LayerNorm(epilogue + residual); y and, for the next GEMM, y quantized; and
//                         the sum itself for a pre-LN model, whose residual stream it is
//   int8_bias_gelu        gelu(epilogue), quantized (the FFN's second GEMM input); the fp32
//                         activation exists only as one row in a thread's buffer
//   int8_glu              a gated feed-forward's act(gate) * up of the epilogue's two halves,
//                         quantized (GeGLU, SwiGLU), the same way
//   int8_dequantize       the epilogue into a float tensor (the general case: the attention's QKV)
//   quantize_rows         x quantized (what the other kernels do at the end of a row)
// Quantizing a row: mx, mn = its max and min, o = (mx + mn) / 2, r = (mx - mn) / 2, s = r / 127,
// q = round((x - o) * (127 / r)), nearest even (a constant row: s = 0, q = 0, o = the value). The
// accumulator is int32 (torch._int_mm) or float32 (oneDNN's quantized linear), read as fp32.
// Rows are independent: parallel_for over rows, each row once through a per-thread fp32 buffer.
// The checks and the outputs are the host's (../int8.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "common.h"
#include "gelu.h"
#include "vec.h"
#include "vec_int8.h"

namespace fastbert {
namespace kernels {
namespace {

constexpr int kSlotSumScale = 9;  // vec::thread_buffer slot of the epilogue's column sums x scales

// Per-column vectors of an epilogue, as fp32 padded to whole vectors (0 past n): the weight's
// column scales, its column sums times those scales, and the bias.
struct Epilogue {
  const float* col_scale;
  const float* sum_scale;
  const float* bias;
};

// The epilogue of acc [rows + 1, n] (its last row: the weight's column sums) in the calling
// thread's buffers.
template <class A>
Epilogue epilogue(const Int8Acc& acc) {
  const int64_t n = acc.n, npad = vec::round_up(n, W);
  const float* cs = padded_float<kSlotParamA>(Param{acc.col_scale, Dtype::kFloat}, n, npad);
  float* b = vec::thread_buffer<float, kSlotParamB>(npad);
  float* ss = vec::thread_buffer<float, kSlotSumScale>(npad);
  const A* sums = static_cast<const A*>(acc.acc) + acc.rows * n;
  for (int64_t c = 0; c < npad; ++c) {
    ss[c] = c < n ? static_cast<float>(sums[c]) * cs[c] : 0.0f;
    b[c] = 0.0f;
  }
  if (acc.bias.p != nullptr) {
    dispatch_float(acc.bias.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* bp = static_cast<const T*>(acc.bias.p);
      for (int64_t c = 0; c < n; ++c) b[c] = static_cast<float>(bp[c]);
    });
  }
  return {cs, ss, b};
}

// out[c] = acc[c] * s * col_scale[c] + o * sum_scale[c] + bias[c] for one row of n (out padded with
// 0 to whole vectors)
// (ep by value: its pointers then live in registers; the vector stores may alias anything, and would
// make the compiler reload them from memory after every store)
template <class A>
inline void dequantize_row(const A* acc, float s, float o, const Epilogue ep, float* out, int64_t n) {
  const Vf sv = vec::set1(s), ov = vec::set1(o);
  const int64_t body = n / W * W;
  auto step = [&](Vf a, int64_t c) {
    Vf shift = vec::fmadd(ov, vec::load(ep.sum_scale + c), vec::load(ep.bias + c));
    vec::store(out + c, vec::fmadd(a * sv, vec::load(ep.col_scale + c), shift));
  };
  for (int64_t c = 0; c < body; c += W) step(vec::load(acc + c), c);
  if (body < n) step(vec::load_partial(acc + body, n - body), body);
}

// out[c] = the dequantized acc[c] + residual[c] (one pass; out padded with 0); returns the row sum.
template <class A, class T>
inline float dequantize_add_row(const A* acc, float s, float o, const Epilogue ep, const T* res, float* out,
                                int64_t n) {
  const Vf sv = vec::set1(s), ov = vec::set1(o);
  const int64_t body = n / W * W;
  Vf sum0 = vec::set1(0.0f), sum1 = vec::set1(0.0f);
  auto at = [&](Vf a, Vf r, int64_t c) {
    Vf shift = vec::fmadd(ov, vec::load(ep.sum_scale + c), vec::load(ep.bias + c));
    Vf h = vec::fmadd(a * sv, vec::load(ep.col_scale + c), shift) + r;
    vec::store(out + c, h);
    return h;
  };
  int64_t c = 0;
  for (; c + 2 * W <= body; c += 2 * W) {
    sum0 = sum0 + at(vec::load(acc + c), vec::load(res + c), c);
    sum1 = sum1 + at(vec::load(acc + c + W), vec::load(res + c + W), c + W);
  }
  for (; c < body; c += W) sum0 = sum0 + at(vec::load(acc + c), vec::load(res + c), c);
  if (body < n) sum1 = sum1 + at(vec::load_partial(acc + body, n - body), vec::load_partial(res + body, n - body), body);
  return vec::hsum(sum0 + sum1);
}

// Min and max of a row of n fp32 values.
inline void row_range(const float* v, int64_t n, float& mn, float& mx) {
  const int64_t body = n / W * W;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Vf hi0 = vec::set1(-kInf), hi1 = hi0, lo0 = vec::set1(kInf), lo1 = lo0;
  int64_t c = 0;
  for (; c + 2 * W <= body; c += 2 * W) {
    const Vf x0 = vec::load(v + c), x1 = vec::load(v + c + W);
    hi0 = vec::vmax(hi0, x0);
    hi1 = vec::vmax(hi1, x1);
    lo0 = vec::vmin(lo0, x0);
    lo1 = vec::vmin(lo1, x1);
  }
  for (; c < body; c += W) {
    const Vf x = vec::load(v + c);
    hi0 = vec::vmax(hi0, x);
    lo0 = vec::vmin(lo0, x);
  }
  mx = vec::hmax(vec::vmax(hi0, hi1));
  mn = -vec::hmax(-vec::vmin(lo0, lo1));
  for (c = body; c < n; ++c) {
    mx = std::max(mx, v[c]);
    mn = std::min(mn, v[c]);
  }
}

// Quantizes a row of n fp32 values v (padded to whole vectors with anything) whose min and max are
// mn and mx to q; writes its scale and offset.
inline void quantize_row(const float* v, int8_t* q, int64_t n, float mn, float mx, float* scale, float* offset) {
  const int64_t body = n / W * W;
  const float o = (mx + mn) * 0.5f, r = (mx - mn) * 0.5f;
  const float inv = r > 0.0f ? 127.0f / r : 0.0f;
  const Vf ov = vec::set1(o), iv = vec::set1(inv);
  for (int64_t c = 0; c < body; c += W) vec::store(q + c, (vec::load(v + c) - ov) * iv);
  if (body < n) vec::store_partial(q + body, (vec::load(v + body) - ov) * iv, n - body);
  *scale = r / 127.0f;
  *offset = o;
}

inline void quantize_row(const float* v, int8_t* q, int64_t n, float* scale, float* offset) {
  float mn, mx;
  row_range(v, n, mn, mx);
  quantize_row(v, q, n, mn, mx, scale, offset);
}

// out[c] = gelu(the dequantized acc[c]) for one row (out padded with gelu(0) = 0); the row's min and max.
template <bool kTanh, class A>
inline void dequantize_gelu_row(const A* acc, float s, float o, const Epilogue ep, float* out, int64_t n, float& mn,
                                float& mx) {
  const Vf sv = vec::set1(s), ov = vec::set1(o);
  const int64_t body = n / W * W;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Vf hi = vec::set1(-kInf), lo = vec::set1(kInf);
  auto at = [&](Vf a, int64_t c) {
    Vf shift = vec::fmadd(ov, vec::load(ep.sum_scale + c), vec::load(ep.bias + c));
    Vf g = gelu<kTanh>(vec::fmadd(a * sv, vec::load(ep.col_scale + c), shift));
    vec::store(out + c, g);
    return g;
  };
  for (int64_t c = 0; c < body; c += W) {
    const Vf g = at(vec::load(acc + c), c);
    hi = vec::vmax(hi, g);
    lo = vec::vmin(lo, g);
  }
  mx = vec::hmax(hi);
  mn = -vec::hmax(-lo);
  if (body < n) {
    at(vec::load_partial(acc + body, n - body), body);
    for (int64_t c = body; c < n; ++c) {
      mx = std::max(mx, out[c]);
      mn = std::min(mn, out[c]);
    }
  }
}

// v[c] = act(v[c]) * v[n + c] for c < n, in place, of a dequantized row v [2n] of a gated unit's
// input (the buffer holds round_up(2n, W) + W floats, so the last vector's read of the second half
// stays inside it; its lanes past n are not used); the result's min and max.
template <Gate kGate>
inline void glu_row(float* v, int64_t n, float& mn, float& mx) {
  const int64_t body = n / W * W;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Vf hi = vec::set1(-kInf), lo = vec::set1(kInf);
  for (int64_t c = 0; c < body; c += W) {
    const Vf g = gate_act<kGate>(vec::load(v + c)) * vec::load(v + n + c);
    vec::store(v + c, g);
    hi = vec::vmax(hi, g);
    lo = vec::vmin(lo, g);
  }
  mx = vec::hmax(hi);
  mn = -vec::hmax(-lo);
  if (body < n) {  // writes lanes past n: second-half values the steps before have read
    vec::store(v + body, gate_act<kGate>(vec::load(v + body)) * vec::load(v + n + body));
    for (int64_t c = body; c < n; ++c) {
      mx = std::max(mx, v[c]);
      mn = std::min(mn, v[c]);
    }
  }
}

// Where a kernel writes its quantized rows (plain pointers, copied into each worker).
struct QuantizedOut {
  int8_t* q;
  float* scale;
  float* offset;
  explicit QuantizedOut(const Int8Rows& t) : q(t.q), scale(t.scale), offset(t.offset) {}
  void row(const float* v, int64_t r, int64_t n) const { quantize_row(v, q + r * n, n, scale + r, offset + r); }
  void row(const float* v, int64_t r, int64_t n, float mn, float mx) const {
    quantize_row(v, q + r * n, n, mn, mx, scale + r, offset + r);
  }
};

// Calls f(ap, ep): acc's values as their C++ type (const int32_t* or const float*) and its epilogue.
template <class F>
void with_acc(const Int8Acc& acc, F&& f) {
  auto typed = [&](auto atag) {
    using A = decltype(atag);
    f(static_cast<const A*>(acc.acc), epilogue<A>(acc));
  };
  if (acc.dtype == Dtype::kInt32) {
    typed(int32_t{});
  } else {
    typed(float{});
  }
}

}  // namespace

void quantize_rows(Dtype dtype, const void* x, int64_t rows, int64_t n, Int8Rows out) {
  const int64_t npad = vec::round_up(n, W);
  const QuantizedOut qo(out);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    parallel_for(0, rows, row_grain(n), [=](int64_t r0, int64_t r1) {
      float* v = vec::thread_buffer<float, kSlotRow>(npad);
      const int64_t body = n / W * W;
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * n;
        for (int64_t c = 0; c < body; c += W) vec::store(v + c, vec::load(xr + c));
        if (body < n) vec::store(v + body, vec::load_partial(xr + body, n - body));
        qo.row(v, r, n);
      }
    });
  });
}

void int8_dequantize(const Int8Acc& acc, Dtype dtype, void* y) {
  const int64_t rows = acc.rows, n = acc.n, npad = vec::round_up(n, W);
  const float *rs = acc.row_scale, *ro = acc.row_offset;
  with_acc(acc, [&](const auto* ap, const Epilogue ep) {
    dispatch_float(dtype, [&](auto tag) {
      using T = decltype(tag);
      T* yp = static_cast<T*>(y);
      parallel_for(0, rows, row_grain(n), [=](int64_t r0, int64_t r1) {
        float* v = vec::thread_buffer<float, kSlotRow>(npad);
        const int64_t body = n / W * W;
        for (int64_t r = r0; r < r1; ++r) {
          dequantize_row(ap + r * n, rs[r], ro[r], ep, v, n);
          T* yr = yp + r * n;
          for (int64_t c = 0; c < body; c += W) vec::store(yr + c, vec::load(v + c));
          if (body < n) vec::store_partial(yr + body, vec::load(v + body), n - body);
        }
      });
    });
  });
}

void int8_bias_gelu(const Int8Acc& acc, bool tanh, Int8Rows out) {
  const int64_t rows = acc.rows, n = acc.n, npad = vec::round_up(n, W);
  const float *rs = acc.row_scale, *ro = acc.row_offset;
  const QuantizedOut qo(out);
  with_acc(acc, [&](const auto* ap, const Epilogue ep) {
    dispatch_flags(tanh, false, [&](auto kTanh, auto) {
      parallel_for(0, rows, row_grain(n), [=](int64_t r0, int64_t r1) {
        float* v = vec::thread_buffer<float, kSlotRow>(npad);
        for (int64_t r = r0; r < r1; ++r) {
          float mn, mx;
          dequantize_gelu_row<decltype(kTanh)::value>(ap + r * n, rs[r], ro[r], ep, v, n, mn, mx);
          qo.row(v, r, n, mn, mx);
        }
      });
    });
  });
}

void int8_glu(const Int8Acc& acc, Gate gate, Int8Rows out) {
  const int64_t rows = acc.rows, wide = acc.n, n = wide / 2, vpad = vec::round_up(wide, W) + W;
  const float *rs = acc.row_scale, *ro = acc.row_offset;
  const QuantizedOut qo(out);
  with_acc(acc, [&](const auto* ap, const Epilogue ep) {
    dispatch_gate(gate, false, [&](auto gate_tag, auto) {
      parallel_for(0, rows, row_grain(wide), [=](int64_t r0, int64_t r1) {
        float* v = vec::thread_buffer<float, kSlotRow>(vpad);
        for (int64_t r = r0; r < r1; ++r) {
          float mn, mx;
          dequantize_row(ap + r * wide, rs[r], ro[r], ep, v, wide);
          glu_row<decltype(gate_tag)::value>(v, n, mn, mx);
          qo.row(v, r, n, mn, mx);
        }
      });
    });
  });
}

void int8_add_layer_norm(const Int8Acc& acc, Dtype dtype, const void* residual, Param weight, Param ln_bias, float eps,
                         void* y, const Int8Rows* out, void* sum) {
  const int64_t rows = acc.rows, n = acc.n, npad = vec::round_up(n, W);
  const float *rs = acc.row_scale, *ro = acc.row_offset;
  const bool quantize = out != nullptr;
  const QuantizedOut qo(quantize ? *out : Int8Rows{nullptr, nullptr, nullptr});
  // the LayerNorm's own vectors live in row-scratch slots of the calling thread
  const float* w = padded_float<kSlotKeep>(weight, n, npad);
  const float* lb = padded_float<kSlotSums>(ln_bias, n, npad);
  with_acc(acc, [&](const auto* ap, const Epilogue ep) {
    dispatch_float(dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* resp = static_cast<const T*>(residual);
      T* yp = static_cast<T*>(y);
      T* sp = static_cast<T*>(sum);
      dispatch_flags(sp != nullptr, false, [&](auto sum_flag, auto) {
        constexpr bool kSum = decltype(sum_flag)::value;
        parallel_for(0, rows, row_grain(n), [=](int64_t r0, int64_t r1) {
          float* v = vec::thread_buffer<float, kSlotPartials>(npad);
          const int64_t body = n / W * W;
          for (int64_t r = r0; r < r1; ++r) {
            const float mean = dequantize_add_row(ap + r * n, rs[r], ro[r], ep, resp + r * n, v, n) / n;
            for (int64_t c = n; c < npad; ++c) v[c] = mean;  // padding lanes add 0 to the variance
            const Vf mv = vec::set1(mean);
            const Vf sv = vec::set1(row_rstd(v, npad, n, mean, eps));
            T* yr = yp + r * n;
            T* sr = kSum ? sp + r * n : nullptr;
            if constexpr (kSum) {  // the sum itself (the residual stream), before v is overwritten
              if (body < n) vec::store_partial(sr + body, vec::load(v + body), n - body);
            }
            for (int64_t c = 0; c < npad; c += W) {
              const Vf h = vec::load(v + c);
              Vf o = vec::fmadd((h - mv) * sv, vec::load(w + c), vec::load(lb + c));
              vec::store(v + c, o);
              if (c < body) {
                vec::store(yr + c, o);
                if constexpr (kSum) vec::store(sr + c, h);
              }
            }
            if (body < n) vec::store_partial(yr + body, vec::load(v + body), n - body);
            if (quantize) qo.row(v, r, n);
          }
        });
      });
    });
  });
}

}  // namespace kernels
}  // namespace fastbert
