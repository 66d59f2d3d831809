// The GELU forms of the fused CPU kernels and their derivatives, shared by bias_gelu.cpp,
// geglu.cpp and the int8 kernels (int8_kernel.cpp), and a gated unit's activations (GELU's forms,
// SiLU) shared by geglu.cpp and int8_kernel.cpp. See bias_gelu.cpp for how each GELU is computed
// and how accurate it is.
#pragma once

#include <type_traits>

#include "api.h"
#include "vec.h"

namespace fastbert {
namespace gelu_math {

using vec::Vf;

constexpr float kBeta = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// x Phi(x) with Phi from the rational fit. (vmin / vmax return their second operand when either is
// NaN: x comes second so NaN propagates.)
constexpr float kRationalClamp = 6.3f;
inline Vf gelu_erf(Vf x) {
  Vf xc = vec::vmax(vec::set1(-kRationalClamp), vec::vmin(vec::set1(kRationalClamp), x));
  Vf t = xc * xc;
  Vf p = vec::set1(2.024131440e-08f);
  p = vec::fmadd(p, t, vec::set1(6.510377261e-06f));
  p = vec::fmadd(p, t, vec::set1(1.980543311e-04f));
  p = vec::fmadd(p, t, vec::set1(4.855063278e-03f));
  p = vec::fmadd(p, t, vec::set1(3.676643223e-02f));
  p = vec::fmadd(p, t, vec::set1(3.989421129e-01f));
  Vf q = vec::set1(1.135605544e-06f);
  q = vec::fmadd(q, t, vec::set1(8.277418965e-05f));
  q = vec::fmadd(q, t, vec::set1(2.050577663e-03f));
  q = vec::fmadd(q, t, vec::set1(3.031142056e-02f));
  q = vec::fmadd(q, t, vec::set1(2.588239312e-01f));
  q = vec::fmadd(q, t, vec::set1(1.0f));
  // The fit crosses 0 and 1 between |x| = 5.8 and 6.0 and is 7e-7 beyond them at the clamp: Phi is
  // clamped to [0, 1], which makes the tails exact (and gelu(-inf) = -inf * 0 = NaN, as in torch).
  Vf cdf = vec::vmin(vec::set1(1.0f), vec::vmax(vec::set1(0.0f), vec::fmadd(xc, p * vec::recip(q), vec::set1(0.5f))));
  return x * cdf;
}

// s = sigmoid(2u) and e = exp(-2u), with -2u clamped to [-100, 80] (1 + e keeps a normal reciprocal)
inline void tanh_parts(Vf x, Vf x2, Vf& s, Vf& e) {
  Vf z = x * vec::fmadd(x2, vec::set1(-2.0f * kBeta * kKappa), vec::set1(-2.0f * kBeta));
  e = vec::vexp(vec::vmax(vec::vmin(z, vec::set1(80.0f)), vec::set1(-100.0f)));
  s = vec::recip(e + vec::set1(1.0f));
}

inline Vf gelu_tanh(Vf x) {
  Vf s, e;
  tanh_parts(x, x * x, s, e);
  return x * s;
}

template <bool kTanh>
inline Vf gelu(Vf x) {
  return kTanh ? gelu_tanh(x) : gelu_erf(x);
}

// ---- the derivatives (the backward passes)

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)

// Beyond |x| = 14 the tail q is below 1e-43: |x| is clamped there, which also keeps exp's argument
// in range and infinities finite.
constexpr float kTailClamp = 14.0f;

// q = Phi(-|x|) = 0.5 erfc(|x| / sqrt 2) and g = exp(-x^2 / 2), from c = min(|x|, 14)
inline void normal_tail(Vf c, Vf& q, Vf& g) {
  Vf t = vec::recip(vec::fmadd(c, vec::set1(0.4f * kSqrtHalf), vec::set1(1.0f)));
  // 0.5 R(a) as a polynomial in t = 1 / (1 + 0.4 a)
  Vf r = vec::set1(0.5f * 8.709574491e-02f);
  r = vec::fmadd(r, t, vec::set1(0.5f * -4.614000618e-01f));
  r = vec::fmadd(r, t, vec::set1(0.5f * 8.342061043e-01f));
  r = vec::fmadd(r, t, vec::set1(0.5f * -5.618997216e-01f));
  r = vec::fmadd(r, t, vec::set1(0.5f * 5.528609157e-01f));
  r = vec::fmadd(r, t, vec::set1(0.5f * 7.066605240e-02f));
  r = vec::fmadd(r, t, vec::set1(0.5f * 2.565577328e-01f));
  r = vec::fmadd(r, t, vec::set1(0.5f * 2.216879427e-01f));
  r = vec::fmadd(r, t, vec::set1(0.5f * 2.252689737e-04f));
  g = vec::vexp((c * vec::set1(-0.5f)) * c);  // argument in [-98, 0]
  q = g * r;
}

// Phi(x) + x phi(x)
inline Vf gelu_erf_grad(Vf x) {
  Vf c = vec::vmin(vec::set1(kTailClamp), vec::vabs(x));
  Vf q, g;
  normal_tail(c, q, g);
  Vf cdf = vec::where_negative(x, q, vec::set1(1.0f) - q);
  Vf xc = vec::vmax(vec::vmin(x, vec::set1(kTailClamp)), vec::set1(-kTailClamp));
  return vec::fmadd(xc * g, vec::set1(kInvSqrt2Pi), cdf);
}

// d/dx x sigmoid(2u) = s + 2 x s (1 - s) u', with s (1 - s) = e s^2 and u' = beta (1 + 3 kappa x^2)
inline Vf gelu_tanh_grad(Vf x) {
  Vf x2 = x * x;
  Vf s, e;
  tanh_parts(x, x2, s, e);
  Vf du = vec::fmadd(x2, vec::set1(3.0f * kKappa * kBeta), vec::set1(kBeta));
  Vf w = (vec::set1(2.0f) * x) * (e * s) * s;  // e * s <= 1: no overflow for large |x|
  return vec::fmadd(w, du, s);
}

template <bool kTanh>
inline Vf gelu_grad(Vf x) {
  return kTanh ? gelu_tanh_grad(x) : gelu_erf_grad(x);
}

}  // namespace gelu_math

namespace kernels {
// the GELU forms as the kernels call them
using gelu_math::gelu;
using gelu_math::gelu_grad;

// silu(x) = x s with s = sigmoid(x) = 1 / (1 + e), e = exp(-x); -x clamped to [-100, 80] (1 + e keeps
// a normal reciprocal; past the clamp s is 1, or x s is within 2e-33 of 0)
inline void sigmoid_parts(vec::Vf x, vec::Vf& s, vec::Vf& e) {
  e = vec::vexp(vec::vmax(vec::vmin(vec::set1(0.0f) - x, vec::set1(80.0f)), vec::set1(-100.0f)));
  s = vec::recip(e + vec::set1(1.0f));
}

// a gated unit's activation of its gate: SiLU, or a GELU form
template <Gate kGate>
inline vec::Vf gate_act(vec::Vf x) {
  if constexpr (kGate == Gate::kSilu) {
    vec::Vf s, e;
    sigmoid_parts(x, s, e);
    return x * s;
  } else {
    return gelu<kGate == Gate::kGeluTanh>(x);
  }
}

// gate_act(x) and its derivative together (the backward needs both: SiLU's share one exp and one
// reciprocal); SiLU's: d/dx x s = s + x s (1 - s), with 1 - s = e s (e s <= 1: no overflow for
// large |x|)
template <Gate kGate>
inline void gate_act_and_grad(vec::Vf x, vec::Vf& y, vec::Vf& grad) {
  if constexpr (kGate == Gate::kSilu) {
    vec::Vf s, e;
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
}  // namespace kernels

}  // namespace fastbert
