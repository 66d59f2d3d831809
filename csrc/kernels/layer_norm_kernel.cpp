// Fused dropout + residual add + LayerNorm on the CPU (BERT's post-LN tail):
//   h = dropout(x) + residual,  y = (h - mean) * rstd * weight + bias,  per row of [rows, hidden];
// or RMSNorm (kRms; a Llama-style encoder's, EuroBERT's): the mean taken as 0 (so stored as 0, and the
// backward's xhat = h * rstd), rstd = 1 / sqrt(mean(h^2) + eps), no bias, and no mean(g) term backward.
// Forward: x and residual are read once and y written once; h lives only in a per-thread fp32 row
// (in L1/L2) for the mean, the variance (two passes over the cached row) and the output. A pre-LN
// model (ModernBERT) also keeps h, its residual stream: then h is written out too, as it is summed.
// Backward: h is recomputed from x, residual and the regenerated dropout mask (neither h nor the
// mask is ever stored); dweight / dbias are summed per fixed chunk of rows (fp32 over groups of 8
// rows, then double), then over chunks in chunk order, so they do not depend on the thread count.
// The gradient of a written-out h (dsum) adds to the LayerNorm's dh before it reaches dresidual and dx.
// Outputs much larger than the caches are written with non-temporal stores.

#include <algorithm>
#include <cmath>

#include "common.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace kernels {
namespace {

struct Dropout {
  philox::Keys keys;
  uint32_t thresh;
  float scale;
  Dropout(double p, uint64_t seed)
      : keys(seed), thresh(philox::threshold(p)), scale(static_cast<float>(1.0 / (1.0 - p))) {}
  // multiplier (scale or 0) of the W elements with offsets base, base + 1, ...
  Vf at(uint64_t base) const { return philox::keep_scale(base, keys, thresh, scale); }
};

// h = x * keep + residual for one row into hrow (fp32, padded to whole vectors; lanes past n are 0),
// and into sr (T, n elements) when kSum. Returns the row sum.
template <class T, bool kDropout, bool kSum, bool kStream>
inline float load_h(const T* xr, const T* rr, float* hrow, T* sr, int64_t n, uint64_t row_offset, const Dropout* dp) {
  const int64_t body = n / W * W;
  Vf s0 = vec::set1(0.0f), s1 = vec::set1(0.0f);
  int64_t c = 0;
  auto step = [&](Vf xv, Vf rv, int64_t col) {
    Vf h;
    if constexpr (kDropout) {
      h = vec::fmadd(xv, dp->at(row_offset + static_cast<uint64_t>(col)), rv);
    } else {
      h = xv + rv;
    }
    vec::store(hrow + col, h);
    if constexpr (kSum) {
      if (col < body) vec::put<kStream>(sr + col, h);
    }
    return h;
  };
  for (; c + 2 * W <= body; c += 2 * W) {
    s0 = s0 + step(vec::load(xr + c), vec::load(rr + c), c);
    s1 = s1 + step(vec::load(xr + c + W), vec::load(rr + c + W), c + W);
  }
  for (; c < body; c += W) s0 = s0 + step(vec::load(xr + c), vec::load(rr + c), c);
  if (body < n) {
    s1 = s1 + step(vec::load_partial(xr + body, n - body), vec::load_partial(rr + body, n - body), body);
    if constexpr (kSum) vec::store_partial(sr + body, vec::load(hrow + body), n - body);
  }
  return vec::hsum(s0 + s1);
}

// Rows [r0, r1): y, mean, rstd, and h into sum when kSum.
template <class T, bool kDropout, bool kStream, bool kSum, bool kRms>
void forward_rows(const T* x, const T* res, const float* w, const float* b, T* y, T* sum, float* mean_out,
                  float* rstd_out, int64_t r0, int64_t r1, int64_t n, float eps, const Dropout* dp) {
  const int64_t npad = vec::round_up(n, W);
  const int64_t body = n / W * W;
  float* h = vec::thread_buffer<float, kSlotRow>(npad);
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * n;
    const T* rr = res + r * n;
    T* yr = y + r * n;
    const uint64_t row_offset = static_cast<uint64_t>(r) * static_cast<uint64_t>(n);
    T* sr = kSum ? sum + r * n : nullptr;
    const float total = load_h<T, kDropout, kSum, kStream>(xr, rr, h, sr, n, row_offset, dp);
    const float mean = kRms ? 0.0f : total / n;
    for (int64_t c = n; c < npad; ++c) h[c] = mean;  // padding lanes add 0 to the variance
    const Vf mv = vec::set1(mean);
    const float rstd = row_rstd(h, npad, n, mean, eps);
    mean_out[r] = mean;
    rstd_out[r] = rstd;
    const Vf sv = vec::set1(rstd);
    for (int64_t c = 0; c < body; c += W) {
      Vf xhat = (vec::load(h + c) - mv) * sv;
      vec::put<kStream>(yr + c, vec::fmadd(xhat, vec::load(w + c), vec::load(b + c)));
    }
    if (body < n) {
      Vf xhat = (vec::load(h + body) - mv) * sv;
      vec::store_partial(yr + body, vec::fmadd(xhat, vec::load(w + body), vec::load(b + body)), n - body);
    }
  }
}

// One reduction chunk of rows [r0, r1): dx, dresidual, and the chunk's dweight / dbias partial sums
// (double) in pw / pb. Within the chunk, sums run in fp32 over groups of kFlushRows rows (aw / ab)
// which are then added to the double partials, so the order of every addition is fixed. kDsum: the
// gradient of h itself, ds (x's dtype), adds to dh.
template <class T, bool kDropout, bool kStream, bool kDsum, bool kRms>
void backward_rows(const T* dy, const T* ds, const T* x, const T* res, const float* w, const float* mean,
                   const float* rstd, T* dx, T* dres, double* pw, double* pb, float* aw, float* ab, float* h, float* k,
                   int64_t r0, int64_t r1, int64_t n, const Dropout* dp) {
  const int64_t body = n / W * W;
  const int64_t npad = vec::round_up(n, W);
  const Vf zero = vec::set1(0.0f);
  for (int64_t c = 0; c < npad; c += W) {
    vec::store(aw + c, zero);
    vec::store(ab + c, zero);
  }
  for (int64_t r = r0; r < r1; ++r) {
    const T* dyr = dy + r * n;
    const T* xr = x + r * n;
    const T* rr = res + r * n;
    const uint64_t row_offset = static_cast<uint64_t>(r) * static_cast<uint64_t>(n);
    const Vf mv = vec::set1(mean[r]);
    const Vf sv = vec::set1(rstd[r]);
    // pass 1: h and xhat = (h - mean) * rstd (kept in h), the row sums of g = dy * w and g * xhat,
    // and the dweight / dbias sums
    Vf sg = zero, sgx = zero;
    auto step = [&](Vf xv, Vf rv, Vf d, int64_t c) {
      Vf hv;
      if constexpr (kDropout) {
        Vf kv = dp->at(row_offset + static_cast<uint64_t>(c));
        vec::store(k + c, kv);
        hv = vec::fmadd(xv, kv, rv);
      } else {
        hv = xv + rv;
      }
      Vf xhat = (hv - mv) * sv;
      vec::store(h + c, xhat);
      Vf g = d * vec::load(w + c);
      sg = sg + g;
      sgx = vec::fmadd(g, xhat, sgx);
      vec::store(aw + c, vec::fmadd(d, xhat, vec::load(aw + c)));
      vec::store(ab + c, vec::load(ab + c) + d);
    };
    for (int64_t c = 0; c < body; c += W) step(vec::load(xr + c), vec::load(rr + c), vec::load(dyr + c), c);
    if (body < n) {  // lanes past n: h = mean (xhat = 0) and dy = 0
      const int64_t t = n - body;
      step(vec::load_partial(xr + body, t), vec::load_partial(rr + body, t, mean[r]), vec::load_partial(dyr + body, t),
           body);
    }
    const Vf mg = kRms ? zero : vec::set1(vec::hsum(sg) / n);
    const Vf mgx = vec::set1(vec::hsum(sgx) / n);
    // pass 2: dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ ds); dresidual = dh, dx = dh * keep
    T* dxr = dx + r * n;
    T* drr = dres + r * n;
    auto grad = [&](Vf d, int64_t c) { return sv * vec::fnmadd(vec::load(h + c), mgx, vec::fmadd(d, vec::load(w + c), -mg)); };
    for (int64_t c = 0; c < body; c += W) {
      Vf dh = grad(vec::load(dyr + c), c);
      if constexpr (kDsum) dh = dh + vec::load(ds + r * n + c);
      Vf dxv = kDropout ? dh * vec::load(k + c) : dh;
      vec::put<kStream>(drr + c, dh);
      vec::put<kStream>(dxr + c, dxv);
    }
    if (body < n) {
      Vf dh = grad(vec::load_partial(dyr + body, n - body), body);
      if constexpr (kDsum) dh = dh + vec::load_partial(ds + r * n + body, n - body);
      vec::store_partial(drr + body, dh, n - body);
      vec::store_partial(dxr + body, kDropout ? dh * vec::load(k + body) : dh, n - body);
    }
    if ((r - r0) % kFlushRows == kFlushRows - 1 || r == r1 - 1) {
      flush_sums(aw, pw, npad);
      flush_sums(ab, pb, npad);
    }
  }
}

}  // namespace

void add_layer_norm_forward(Dtype dtype, const void* x, const void* residual, Param weight, Param bias, void* y,
                            void* sum, float* mean, float* rstd, int64_t m, int64_t n, float eps, double dropout_p,
                            uint64_t seed, bool rms) {
  const int64_t npad = vec::round_up(n, W);
  const float* wp = padded_float<kSlotParamA>(weight, n, npad);
  const float* bp = padded_float<kSlotParamB>(bias, n, npad);
  const Dropout drop(dropout_p, seed);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    const T* rp = static_cast<const T*>(residual);
    T* yp = static_cast<T*>(y);
    T* sp = static_cast<T*>(sum);
    const bool stream = stream_output(yp, m, n) && (sp == nullptr || stream_output(sp, m, n));
    dispatch_flags(dropout_p > 0.0, stream, [&](auto dropout_flag, auto stream_flag) {
      dispatch_flags(sp != nullptr, rms, [&](auto sum_flag, auto rms_flag) {
        parallel_for(0, m, row_grain(n), [&](int64_t r0, int64_t r1) {
          forward_rows<T, decltype(dropout_flag)::value, decltype(stream_flag)::value, decltype(sum_flag)::value,
                       decltype(rms_flag)::value>(
              xp, rp, wp, bp, yp, sp, mean, rstd, r0, r1, n, eps, &drop);
          vec::stream_fence();
        });
      });
    });
  });
}

void add_layer_norm_backward(Dtype dtype, const void* dy, const void* dsum, const void* x, const void* residual,
                             Param weight, const float* mean, const float* rstd, void* dx, void* dresidual,
                             void* dweight, void* dbias, int64_t m, int64_t n, double dropout_p, uint64_t seed,
                             bool rms) {
  const int64_t npad = vec::round_up(n, W);
  const float* wp = padded_float<kSlotParamA>(weight, n, npad);
  const int64_t chunk = reduce_chunk_rows(m);
  const int64_t chunks = (m + chunk - 1) / chunk;
  // per chunk: [dweight partial (npad) | dbias partial (npad)]
  double* pp = vec::thread_buffer<double, kSlotPartials>(chunks * 2 * npad);
  const Dropout drop(dropout_p, seed);
  const bool dropout = dropout_p > 0.0;
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    const T* rp = static_cast<const T*>(residual);
    const T* dyp = static_cast<const T*>(dy);
    const T* dsp = static_cast<const T*>(dsum);
    T* dxp = static_cast<T*>(dx);
    T* drp = static_cast<T*>(dresidual);
    const bool stream = stream_output(dxp, m, n) && stream_output(drp, m, n);
    dispatch_flags(dropout, stream, [&](auto dropout_flag, auto stream_flag) {
      dispatch_flags(dsp != nullptr, rms, [&](auto dsum_flag, auto rms_flag) {
        parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
          float* h = vec::thread_buffer<float, kSlotRow>(npad);
          float* k = dropout ? vec::thread_buffer<float, kSlotKeep>(npad) : nullptr;
          float* aw = vec::thread_buffer<float, kSlotSums>(2 * npad);
          float* ab = aw + npad;
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t r0 = c * chunk, r1 = std::min(m, r0 + chunk);
            double* pw = pp + c * 2 * npad;
            double* pb = pw + npad;
            std::fill(pw, pw + 2 * npad, 0.0);
            backward_rows<T, decltype(dropout_flag)::value, decltype(stream_flag)::value, decltype(dsum_flag)::value,
                          decltype(rms_flag)::value>(
                dyp, dsp, xp, rp, wp, mean, rstd, dxp, drp, pw, pb, aw, ab, h, k, r0, r1, n, &drop);
          }
          vec::stream_fence();
        });
      });
    });
  });
  sum_partials(pp, chunks, 2 * npad, n, weight.dtype, dweight);
  sum_partials(pp + npad, chunks, 2 * npad, n, weight.dtype, dbias);
}

}  // namespace kernels
}  // namespace fastbert
