// SIMD building blocks of the fused CPU kernels: one float vector type `Vf` and one uint32 vector
// type `Vu` whose width is fixed at compile time by the instruction set the compiler targets:
//   AVX-512 (F, BW, DQ, VL)  -> 16 lanes
//   AVX2 + FMA + F16C        ->  8 lanes
//   anything else            ->  1 lane (plain C++)
// setup.py compiles with -march=native by default (FASTBERT_CPU_ARCH overrides it), so the widest
// set the build machine has is picked. Kernels are written once against the functions below and
// work at every width; rows whose length is not a multiple of kWidth end with load_partial /
// store_partial.
//
// Everything computes in fp32; fp16 and bf16 are converted on load and rounded to nearest even on
// store (the same rounding as c10::Half / c10::BFloat16). The int8 / int32 lanes are in vec_int8.h,
// the vector Philox generator in vec_philox.h.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define FASTBERT_VEC_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FASTBERT_VEC_AVX2 1
#include <immintrin.h>
#endif

namespace fastbert {
namespace vec {

// ---------------------------------------------------------------------------------------------
// types, width, broadcast and arithmetic

#if defined(FASTBERT_VEC_AVX512)

constexpr int64_t kWidth = 16;
constexpr const char* kIsa = "avx512";
struct Vf { __m512 v; };
struct Vu { __m512i v; };

inline Vf set1(float a) { return {_mm512_set1_ps(a)}; }
inline Vf operator+(Vf a, Vf b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vf operator-(Vf a, Vf b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vf operator*(Vf a, Vf b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vf fmadd(Vf a, Vf b, Vf c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }    // a * b + c
inline Vf fnmadd(Vf a, Vf b, Vf c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }  // c - a * b
inline Vf vmin(Vf a, Vf b) { return {_mm512_min_ps(a.v, b.v)}; }  // b when a is NaN
inline Vf vmax(Vf a, Vf b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Vf vabs(Vf a) { return {_mm512_abs_ps(a.v)}; }
inline float hsum(Vf a) { return _mm512_reduce_add_ps(a.v); }
// out[0..3] = hsum(a), hsum(b), hsum(c), hsum(d): halves added across the four, 8 shuffles in all
inline void hsum4(Vf a, Vf b, Vf c, Vf d, float* out) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a.v, b.v, 0x44), _mm512_shuffle_f32x4(a.v, b.v, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c.v, d.v, 0x44), _mm512_shuffle_f32x4(c.v, d.v, 0xEE));
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));  // 128-bit lane i: 4 partial sums of a, b, c, d
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  out[0] = t[0], out[1] = t[4], out[2] = t[8], out[3] = t[12];
}
inline float hmax(Vf a) { return _mm512_reduce_max_ps(a.v); }
// lanes of `if_neg` where x < 0, else lanes of `otherwise`
inline Vf where_negative(Vf x, Vf if_neg, Vf otherwise) {
  __mmask16 m = _mm512_cmp_ps_mask(x.v, _mm512_setzero_ps(), _CMP_LT_OQ);
  return {_mm512_mask_blend_ps(m, otherwise.v, if_neg.v)};
}
// 1 / d to about 1 ulp for normal d whose reciprocal is normal (rcp14 + one Newton step)
inline Vf recip(Vf d) {
  __m512 r = _mm512_rcp14_ps(d.v);
  __m512 e = _mm512_fnmadd_ps(d.v, r, _mm512_set1_ps(1.0f));
  return {_mm512_fmadd_ps(r, e, r)};
}

#elif defined(FASTBERT_VEC_AVX2)

constexpr int64_t kWidth = 8;
constexpr const char* kIsa = "avx2";
struct Vf { __m256 v; };
struct Vu { __m256i v; };

inline Vf set1(float a) { return {_mm256_set1_ps(a)}; }
inline Vf operator+(Vf a, Vf b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vf operator-(Vf a, Vf b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vf operator*(Vf a, Vf b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vf fmadd(Vf a, Vf b, Vf c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf fnmadd(Vf a, Vf b, Vf c) { return {_mm256_fnmadd_ps(a.v, b.v, c.v)}; }
inline Vf vmin(Vf a, Vf b) { return {_mm256_min_ps(a.v, b.v)}; }
inline Vf vmax(Vf a, Vf b) { return {_mm256_max_ps(a.v, b.v)}; }
inline Vf vabs(Vf a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
inline float hsum(Vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void hsum4(Vf a, Vf b, Vf c, Vf d, float* out) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a.v, b.v), _mm256_hadd_ps(c.v, d.v));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}
inline float hmax(Vf a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline Vf where_negative(Vf x, Vf if_neg, Vf otherwise) {
  __m256 m = _mm256_cmp_ps(x.v, _mm256_setzero_ps(), _CMP_LT_OQ);
  return {_mm256_blendv_ps(otherwise.v, if_neg.v, m)};
}
inline Vf recip(Vf d) { return {_mm256_div_ps(_mm256_set1_ps(1.0f), d.v)}; }

#else

constexpr int64_t kWidth = 1;
constexpr const char* kIsa = "scalar";
struct Vf { float v; };
struct Vu { uint32_t v; };

inline Vf set1(float a) { return {a}; }
inline Vf operator+(Vf a, Vf b) { return {a.v + b.v}; }
inline Vf operator-(Vf a, Vf b) { return {a.v - b.v}; }
inline Vf operator*(Vf a, Vf b) { return {a.v * b.v}; }
inline Vf fmadd(Vf a, Vf b, Vf c) { return {std::fma(a.v, b.v, c.v)}; }
inline Vf fnmadd(Vf a, Vf b, Vf c) { return {std::fma(-a.v, b.v, c.v)}; }
inline Vf vmin(Vf a, Vf b) { return {a.v < b.v ? a.v : b.v}; }  // b when a is NaN
inline Vf vmax(Vf a, Vf b) { return {a.v > b.v ? a.v : b.v}; }
inline Vf vabs(Vf a) { return {std::fabs(a.v)}; }
inline float hsum(Vf a) { return a.v; }
inline void hsum4(Vf a, Vf b, Vf c, Vf d, float* out) { out[0] = a.v, out[1] = b.v, out[2] = c.v, out[3] = d.v; }
inline float hmax(Vf a) { return a.v; }
inline Vf where_negative(Vf x, Vf if_neg, Vf otherwise) { return x.v < 0.0f ? if_neg : otherwise; }
inline Vf recip(Vf d) { return {1.0f / d.v}; }

#endif

inline Vf operator-(Vf a) { return set1(0.0f) - a; }

// ---------------------------------------------------------------------------------------------
// exp(x) for x in [-104, 88.7] (callers clamp; that keeps the fast path free of range checks):
// n = round(x log2 e), r = x - n ln 2 (one fused multiply-add), a degree-6 minimax polynomial for
// e^r on [-ln2/2, ln2/2] (7e-8 relative, about 1 ulp), times 2^n. Results below the normal range
// come out as denormals or 0 (AVX-512) or as 0 (AVX2).

namespace detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
inline Vf exp_poly(Vf r) {
  Vf p = set1(1.383679919e-03f);
  p = fmadd(p, r, set1(8.374814875e-03f));
  p = fmadd(p, r, set1(4.166822508e-02f));
  p = fmadd(p, r, set1(1.666641980e-01f));
  p = fmadd(p, r, set1(4.999999106e-01f));
  p = fmadd(p, r, set1(1.0f));
  return fmadd(p, r, set1(1.0f));
}
}  // namespace detail

#if defined(FASTBERT_VEC_AVX512)
inline Vf vexp(Vf x) {
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x.v, _mm512_set1_ps(detail::kLog2e)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vf r = fnmadd({n}, set1(detail::kLn2), x);
  return {_mm512_scalef_ps(detail::exp_poly(r).v, n)};  // p * 2^n
}
#elif defined(FASTBERT_VEC_AVX2)
inline Vf vexp(Vf x) {
  __m256 tiny = _mm256_cmp_ps(x.v, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
  x = vmax(vmin(x, set1(88.37f)), set1(-87.33654f));  // 2^n stays a normal float
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x.v, _mm256_set1_ps(detail::kLog2e)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vf r = fnmadd({n}, set1(detail::kLn2), x);
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(detail::exp_poly(r).v, _mm256_castsi256_ps(e));
  return {_mm256_andnot_ps(tiny, y)};
}
#else
inline Vf vexp(Vf x) { return {std::exp(x.v)}; }
#endif

// exp(x) for x <= 88.3 whose lanes below -87.33 (where e^x leaves the normal range), -inf
// included, are exactly 0: softmax weights of masked entries, which must carry no weight at all.
inline Vf vexp_or_zero(Vf x) {
  const Vf lo = set1(-87.33654f);
  return where_negative(x - lo, set1(0.0f), vexp(vmax(x, lo)));
}

// ---------------------------------------------------------------------------------------------
// transpose of a kWidth x kWidth block held in kWidth vectors: r[i] lane j <- r[j] lane i

#if defined(FASTBERT_VEC_AVX512)
inline void transpose(Vf* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  // u[4i + k], 128-bit lane l: column 4l + k of rows 4i .. 4i + 3
  __m512 u[16];
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 ab_even = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    const __m512 ab_odd = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    const __m512 cd_even = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 cd_odd = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k].v = _mm512_shuffle_f32x4(ab_even, cd_even, 0x88);
    r[8 + k].v = _mm512_shuffle_f32x4(ab_even, cd_even, 0xDD);
    r[4 + k].v = _mm512_shuffle_f32x4(ab_odd, cd_odd, 0x88);
    r[12 + k].v = _mm512_shuffle_f32x4(ab_odd, cd_odd, 0xDD);
  }
}
#elif defined(FASTBERT_VEC_AVX2)
inline void transpose(Vf* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    r[k].v = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    r[4 + k].v = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}
#else
inline void transpose(Vf*) {}
#endif

// ---------------------------------------------------------------------------------------------
// loads and stores: float / c10::Half / c10::BFloat16 memory <-> fp32 lanes

#if defined(FASTBERT_VEC_AVX512)
inline Vf load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vf load(const c10::Half* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline Vf load(const c10::BFloat16* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
inline void store(float* p, Vf a) { _mm512_storeu_ps(p, a.v); }
inline void store(c10::Half* p, Vf a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// fp32 -> bf16 bits, round to nearest even (NaN -> quiet NaN), as c10::BFloat16 does
inline __m256i bf16_bits(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}
inline void store(c10::BFloat16* p, Vf a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_bits(a.v)); }
// acc[0 .. kWidth) += a, in double
inline void add_to_double(double* acc, Vf a) {
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(a.v));
  __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a.v, 1));
  _mm512_storeu_pd(acc, _mm512_add_pd(_mm512_loadu_pd(acc), lo));
  _mm512_storeu_pd(acc + 8, _mm512_add_pd(_mm512_loadu_pd(acc + 8), hi));
}
#elif defined(FASTBERT_VEC_AVX2)
inline Vf load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline Vf load(const c10::Half* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline Vf load(const c10::BFloat16* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}
inline void store(float* p, Vf a) { _mm256_storeu_ps(p, a.v); }
inline void store(c10::Half* p, Vf a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store(c10::BFloat16* p, Vf a) {
  __m256i bits = _mm256_castps_si256(a.v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  __m256 nan = _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q);
  r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0)), nan));
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline void add_to_double(double* acc, Vf a) {
  __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(a.v));
  __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(a.v, 1));
  _mm256_storeu_pd(acc, _mm256_add_pd(_mm256_loadu_pd(acc), lo));
  _mm256_storeu_pd(acc + 4, _mm256_add_pd(_mm256_loadu_pd(acc + 4), hi));
}
#else
inline Vf load(const float* p) { return {*p}; }
inline Vf load(const c10::Half* p) { return {static_cast<float>(*p)}; }
inline Vf load(const c10::BFloat16* p) { return {static_cast<float>(*p)}; }
inline void store(float* p, Vf a) { *p = a.v; }
inline void store(c10::Half* p, Vf a) { *p = c10::Half(a.v); }
inline void store(c10::BFloat16* p, Vf a) { *p = c10::BFloat16(a.v); }
inline void add_to_double(double* acc, Vf a) { acc[0] += static_cast<double>(a.v); }
#endif

// Non-temporal stores of a whole vector to a p aligned to kWidth elements' bytes, for outputs that
// will not be read again soon: they skip the read-for-ownership of ordinary stores (a third less
// memory traffic for a pure write). stream_fence() orders them before later stores.
#if defined(FASTBERT_VEC_AVX512)
inline void stream(float* p, Vf a) { _mm512_stream_ps(p, a.v); }
inline void stream(c10::Half* p, Vf a) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void stream(c10::BFloat16* p, Vf a) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bf16_bits(a.v)); }
inline void stream_fence() { _mm_sfence(); }
#elif defined(FASTBERT_VEC_AVX2)
inline void stream(float* p, Vf a) { _mm256_stream_ps(p, a.v); }
template <class T>
inline void stream(T* p, Vf a) { store(p, a); }
inline void stream_fence() { _mm_sfence(); }
#else
template <class T>
inline void stream(T* p, Vf a) { store(p, a); }
inline void stream_fence() {}
#endif

template <bool kStream, class T>
inline void put(T* p, Vf a) {
  if constexpr (kStream) {
    stream(p, a);
  } else {
    store(p, a);
  }
}

// True when every row of a [rows, n] tensor of T at p starts on a whole-vector boundary.
template <class T>
inline bool rows_aligned(const T* p, int64_t n) {
  const uintptr_t bytes = static_cast<uintptr_t>(kWidth) * sizeof(T);
  return reinterpret_cast<uintptr_t>(p) % bytes == 0 && (static_cast<uintptr_t>(n) * sizeof(T)) % bytes == 0;
}

// The first n (< kWidth) elements at p; the other lanes hold `fill`.
template <class T>
inline Vf load_partial(const T* p, int64_t n, float fill = 0.0f) {
  alignas(64) float tmp[kWidth];
  for (int64_t i = 0; i < kWidth; ++i) tmp[i] = i < n ? static_cast<float>(p[i]) : fill;
  return load(tmp);
}

// Writes the first n (< kWidth) lanes of a to p.
template <class T>
inline void store_partial(T* p, Vf a, int64_t n) {
  alignas(64) float tmp[kWidth];
  store(tmp, a);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(tmp[i]);
}

// ---------------------------------------------------------------------------------------------
// scratch memory

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// A 64-byte aligned buffer of at least n elements owned by the calling thread, grow-only and kept
// for the thread's life, so that a kernel call allocates nothing on the heap but its outputs (glibc
// trims and remaps its heap on patterns of large frees, which then costs page faults on the next
// call). kSlot tells apart the buffers one thread holds at once. Contents are not initialised.
template <class T, int kSlot>
inline T* thread_buffer(int64_t n) {
  struct Buffer {
    T* p = nullptr;
    int64_t cap = 0;
    ~Buffer() {
      if (p != nullptr) ::operator delete[](p, std::align_val_t(64));
    }
  };
  thread_local Buffer b;
  if (b.cap < n) {
    if (b.p != nullptr) ::operator delete[](b.p, std::align_val_t(64));
    b.p = nullptr;
    b.cap = 0;
    b.p = static_cast<T*>(::operator new[](sizeof(T) * static_cast<size_t>(n), std::align_val_t(64)));
    b.cap = n;
  }
  return b.p;
}

}  // namespace vec
}  // namespace fastbert
