// Gated linear units on the CPU: y = act(a) * b with a = x[:, :n] and b = x[:, n:] (one
// projection's output, [m, 2n]), and the backward da = dy * b * act'(a), db = dy * act(a) into
// dx [m, 2n]. act: GELU (GeGLU: ModernBERT, GTE) or SiLU (SwiGLU: NomicBERT, EuroBERT). One pass
// over the rows each way, fp32 math, AVX-512 / AVX2 lanes; the GELU forms and their derivatives
// are bias_gelu's (gelu.h).

#include "common.h"
#include "gelu.h"
#include "vec.h"

namespace fastbert {
namespace kernels {
namespace {

// silu(x) = x s with s = sigmoid(x) = 1 / (1 + e), e = exp(-x); -x clamped to [-100, 80] (1 + e keeps
// a normal reciprocal; past the clamp s is 1, or x s is within 2e-33 of 0)
inline void sigmoid_parts(Vf x, Vf& s, Vf& e) {
  e = vec::vexp(vec::vmax(vec::vmin(vec::set1(0.0f) - x, vec::set1(80.0f)), vec::set1(-100.0f)));
  s = vec::recip(e + vec::set1(1.0f));
}

// the gate's activation: SiLU, or a GELU form (gelu.h)
template <Gate kGate>
inline Vf act(Vf x) {
  if constexpr (kGate == Gate::kSilu) {
    Vf s, e;
    sigmoid_parts(x, s, e);
    return x * s;
  } else {
    return gelu<kGate == Gate::kGeluTanh>(x);
  }
}

// act(x) and its derivative together (the backward needs both: SiLU's share one exp and one
// reciprocal); SiLU's: d/dx x s = s + x s (1 - s), with 1 - s = e s (e s <= 1: no overflow for
// large |x|)
template <Gate kGate>
inline void act_and_grad(Vf x, Vf& y, Vf& grad) {
  if constexpr (kGate == Gate::kSilu) {
    Vf s, e;
    sigmoid_parts(x, s, e);
    y = x * s;
    grad = vec::fmadd(x * (e * s), s, s);
  } else {
    y = gelu<kGate == Gate::kGeluTanh>(x);
    grad = gelu_grad<kGate == Gate::kGeluTanh>(x);
  }
}

// f(gate as a std::integral_constant, stream as a std::bool_constant)
template <class F>
void dispatch_gate(Gate gate, bool stream, F&& f) {
  auto with = [&](auto gate_tag) {
    if (stream)
      f(gate_tag, std::true_type{});
    else
      f(gate_tag, std::false_type{});
  };
  switch (gate) {
    case Gate::kGeluTanh: with(std::integral_constant<Gate, Gate::kGeluTanh>{}); break;
    case Gate::kSilu: with(std::integral_constant<Gate, Gate::kSilu>{}); break;
    default: with(std::integral_constant<Gate, Gate::kGeluErf>{}); break;
  }
}

// y[r] = act(x[r, :n]) * x[r, n:] for rows [r0, r1)
template <class T, Gate kGate, bool kStream>
void forward_rows(const T* x, T* y, int64_t r0, int64_t r1, int64_t n) {
  const int64_t body = n / W * W;
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = x + r * 2 * n;
    const T* b = a + n;
    T* yr = y + r * n;
    for (int64_t c = 0; c < body; c += W) vec::put<kStream>(yr + c, act<kGate>(vec::load(a + c)) * vec::load(b + c));
    if (body < n) {
      const int64_t k = n - body;
      vec::store_partial(yr + body, act<kGate>(vec::load_partial(a + body, k)) * vec::load_partial(b + body, k), k);
    }
  }
}

// dx[r, :n] = dy[r] * x[r, n:] * act'(x[r, :n]), dx[r, n:] = dy[r] * act(x[r, :n]) for rows [r0, r1)
template <class T, Gate kGate, bool kStream>
void backward_rows(const T* dy, const T* x, T* dx, int64_t r0, int64_t r1, int64_t n) {
  const int64_t body = n / W * W;
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = x + r * 2 * n;
    const T* b = a + n;
    const T* g = dy + r * n;
    T* da = dx + r * 2 * n;
    T* db = da + n;
    for (int64_t c = 0; c < body; c += W) {
      const Vf gv = vec::load(g + c);
      Vf y, grad;
      act_and_grad<kGate>(vec::load(a + c), y, grad);
      vec::put<kStream>(da + c, (gv * vec::load(b + c)) * grad);
      vec::put<kStream>(db + c, gv * y);
    }
    if (body < n) {
      const int64_t k = n - body;
      const Vf gv = vec::load_partial(g + body, k);
      Vf y, grad;
      act_and_grad<kGate>(vec::load_partial(a + body, k), y, grad);
      vec::store_partial(da + body, (gv * vec::load_partial(b + body, k)) * grad, k);
      vec::store_partial(db + body, gv * y, k);
    }
  }
}

}  // namespace

void geglu_forward(Dtype dtype, const void* x, void* y, int64_t m, int64_t n, Gate gate) {
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    dispatch_gate(gate, stream_output(yp, m, n), [&](auto gate_tag, auto stream_flag) {
      parallel_for(0, m, row_grain(3 * n), [&](int64_t r0, int64_t r1) {
        forward_rows<T, decltype(gate_tag)::value, decltype(stream_flag)::value>(xp, yp, r0, r1, n);
        vec::stream_fence();
      });
    });
  });
}

void geglu_backward(Dtype dtype, const void* dy, const void* x, void* dx, int64_t m, int64_t n, Gate gate) {
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* dyp = static_cast<const T*>(dy);
    const T* xp = static_cast<const T*>(x);
    T* dxp = static_cast<T*>(dx);
    dispatch_gate(gate, stream_output(dxp, m, 2 * n) && vec::rows_aligned(dxp, n), [&](auto gate_tag, auto stream_flag) {
      parallel_for(0, m, row_grain(5 * n), [&](int64_t r0, int64_t r1) {
        backward_rows<T, decltype(gate_tag)::value, decltype(stream_flag)::value>(dyp, xp, dxp, r0, r1, n);
        vec::stream_fence();
      });
    });
  });
}

}  // namespace kernels
}  // namespace fastbert
