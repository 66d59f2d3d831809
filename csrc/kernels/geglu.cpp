// Gated linear units on the CPU: y = act(a) * b with a = x[:, :n] and b = x[:, n:] (one
// projection's output, [m, 2n]), and the backward da = dy * b * act'(a), db = dy * act(a) into
// dx [m, 2n]. act: GELU (GeGLU: ModernBERT, GTE) or SiLU (SwiGLU: NomicBERT, EuroBERT). One pass
// over the rows each way, fp32 math, AVX-512 / AVX2 lanes; the GELU forms and their derivatives
// are bias_gelu's, the gates' activations beside them (gelu.h).

#include "common.h"
#include "gelu.h"
#include "vec.h"

namespace fastbert {
namespace kernels {
namespace {

// y[r] = act(x[r, :n]) * x[r, n:] for rows [r0, r1)
template <class T, Gate kGate, bool kStream>
void forward_rows(const T* x, T* y, int64_t r0, int64_t r1, int64_t n) {
  const int64_t body = n / W * W;
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = x + r * 2 * n;
    const T* b = a + n;
    T* yr = y + r * n;
    for (int64_t c = 0; c < body; c += W) vec::put<kStream>(yr + c, gate_act<kGate>(vec::load(a + c)) * vec::load(b + c));
    if (body < n) {
      const int64_t k = n - body;
      vec::store_partial(yr + body, gate_act<kGate>(vec::load_partial(a + body, k)) * vec::load_partial(b + body, k), k);
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
      gate_act_and_grad<kGate>(vec::load(a + c), y, grad);
      vec::put<kStream>(da + c, (gv * vec::load(b + c)) * grad);
      vec::put<kStream>(db + c, gv * y);
    }
    if (body < n) {
      const int64_t k = n - body;
      const Vf gv = vec::load_partial(g + body, k);
      Vf y, grad;
      gate_act_and_grad<kGate>(vec::load_partial(a + body, k), y, grad);
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
