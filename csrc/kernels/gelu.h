// The GELU forms of the fused CPU kernels, forward only (the backward's derivatives are in
// bias_gelu.cpp), shared by bias_gelu.cpp and the int8 kernels (int8.cpp). See bias_gelu.cpp for
// how each is computed and how accurate it is.
#pragma once

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

}  // namespace gelu_math
}  // namespace fastbert
