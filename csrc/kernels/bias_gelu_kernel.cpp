// Fused bias + GELU on the CPU: y = gelu(x + bias), and its backward dx = dy * gelu'(x + bias),
// dbias = column sums of dx. One pass over the rows each way, fp32 math, AVX-512 / AVX2 lanes.
// The GELU forms and their derivatives are in gelu.h (shared with geglu.cpp and the int8 kernels):
//
// The exact (erf) GELU is x * Phi(x) with Phi the normal CDF.
// Forward: Phi(x) = 0.5 + x P(x^2) / Q(x^2), P and Q of degree 5 with positive coefficients (a
// rational minimax fit on [0, 6]: 3e-8 in exact arithmetic, 1.9e-7 absolute in fp32, against 6e-8
// for torch's 0.5 (1 + erf(x / sqrt 2))), clamped to [0, 1]. That is 22 vector operations, against
// 31 for the tail formula below: the forward is compute-bound on AVX-512 at BERT sizes, so fewer
// operations make it faster (its time per element beside torch's GELU: benchmarks/LOG.md, "Fused
// ops on the CPU").
// Backward: Phi'(x) needs exp(-x^2 / 2) anyway, so Phi goes through the tail
// q(x) = Phi(-|x|) = 0.5 * erfc(|x| / sqrt 2) = 0.5 * exp(-x^2 / 2) * R(a), a = |x| / sqrt 2,
// where R(a) = exp(a^2) erfc(a) is a degree-8 polynomial in t = 1 / (1 + 0.4 a) (relative error
// 4e-8 on [0, 5], a least-squares fit with Lawson reweighting). Then Phi(x) = q for x < 0 and
// 1 - q for x >= 0, and the same exp(-x^2 / 2) gives the derivative Phi(x) + x phi(x).
// The tanh GELU is written as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which equals
// 0.5 x (1 + tanh u) without the cancellation of 1 + tanh u for negative u.

#include <algorithm>

#include "common.h"
#include "gelu.h"
#include "vec.h"

namespace fastbert {
namespace kernels {
namespace {

// y[r] = gelu(x[r] + b) for rows [r0, r1); b is fp32, padded to whole vectors
template <class T, bool kTanh, bool kStream>
void forward_rows(const T* x, const float* b, T* y, int64_t r0, int64_t r1, int64_t n) {
  const int64_t body = n / W * W;
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    for (int64_t c = 0; c < body; c += W) vec::put<kStream>(yr + c, gelu<kTanh>(vec::load(xr + c) + vec::load(b + c)));
    if (body < n) {
      Vf v = vec::load_partial(xr + body, n - body) + vec::load(b + body);
      vec::store_partial(yr + body, gelu<kTanh>(v), n - body);
    }
  }
}

// dx[r] = dy[r] * gelu'(x[r] + b) for the rows [r0, r1) of one reduction chunk; the chunk's dbias
// partial (double, padded) in `partial`, through fp32 sums over groups of kFlushRows rows in acc.
template <class T, bool kTanh, bool kStream>
void backward_rows(const T* dy, const T* x, const float* b, T* dx, double* partial, float* acc, int64_t r0, int64_t r1,
                   int64_t n) {
  const int64_t body = n / W * W;
  const int64_t npad = vec::round_up(n, W);
  for (int64_t c = 0; c < npad; c += W) vec::store(acc + c, vec::set1(0.0f));
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    T* dxr = dx + r * n;
    for (int64_t c = 0; c < body; c += W) {
      Vf g = vec::load(dyr + c) * gelu_grad<kTanh>(vec::load(xr + c) + vec::load(b + c));
      vec::put<kStream>(dxr + c, g);
      vec::store(acc + c, vec::load(acc + c) + g);
    }
    if (body < n) {
      const int64_t k = n - body;
      Vf g = vec::load_partial(dyr + body, k) * gelu_grad<kTanh>(vec::load_partial(xr + body, k) + vec::load(b + body));
      vec::store_partial(dxr + body, g, k);
      vec::store(acc + body, vec::load(acc + body) + g);  // lanes past n carry dy = 0
    }
    if ((r - r0) % kFlushRows == kFlushRows - 1 || r == r1 - 1) flush_sums(acc, partial, npad);
  }
}

}  // namespace

void bias_gelu_forward(Dtype dtype, const void* x, Param bias, void* y, int64_t m, int64_t n, bool tanh) {
  const float* bp = padded_float<kSlotParamA>(bias, n, vec::round_up(n, W));
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    dispatch_flags(tanh, stream_output(yp, m, n), [&](auto tanh_flag, auto stream_flag) {
      parallel_for(0, m, row_grain(n), [&](int64_t r0, int64_t r1) {
        forward_rows<T, decltype(tanh_flag)::value, decltype(stream_flag)::value>(xp, bp, yp, r0, r1, n);
        vec::stream_fence();
      });
    });
  });
}

void bias_gelu_backward(Dtype dtype, const void* dy, const void* x, Param bias, void* dx, void* dbias, int64_t m,
                        int64_t n, bool tanh) {
  const int64_t npad = vec::round_up(n, W);
  const float* bp = padded_float<kSlotParamA>(bias, n, npad);
  const int64_t chunk = reduce_chunk_rows(m);
  const int64_t chunks = (m + chunk - 1) / chunk;
  double* pp = vec::thread_buffer<double, kSlotPartials>(chunks * npad);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    const T* dyp = static_cast<const T*>(dy);
    T* dxp = static_cast<T*>(dx);
    dispatch_flags(tanh, stream_output(dxp, m, n), [&](auto tanh_flag, auto stream_flag) {
      parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        float* acc = vec::thread_buffer<float, kSlotSums>(npad);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r0 = c * chunk, r1 = std::min(m, r0 + chunk);
          std::fill(pp + c * npad, pp + (c + 1) * npad, 0.0);
          backward_rows<T, decltype(tanh_flag)::value, decltype(stream_flag)::value>(dyp, xp, bp, dxp, pp + c * npad,
                                                                                       acc, r0, r1, n);
        }
        vec::stream_fence();
      });
    });
  });
  sum_partials(pp, chunks, npad, n, bias.dtype, dbias);
}

}  // namespace kernels
}  // namespace fastbert
