// int8 / int32 lanes of the vector building blocks (vec.h): int32 GEMM accumulators and int8
// activations loaded as fp32 lanes, and fp32 lanes stored as int8, for the int8 inference kernels
// (int8.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "vec.h"

namespace fastbert {
namespace vec {

// int32 / int8 memory -> fp32 lanes, and fp32 lanes -> int8 (rounded to nearest even, saturated to
// [-128, 127]): the int8 inference kernels' GEMM accumulators and quantized activations.
#if defined(FASTBERT_VEC_AVX512)
inline Vf load(const int32_t* p) { return {_mm512_cvtepi32_ps(_mm512_loadu_si512(p))}; }
inline Vf load(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline void store(int8_t* p, Vf a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(a.v)));
}
#elif defined(FASTBERT_VEC_AVX2)
inline Vf load(const int32_t* p) { return {_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline Vf load(const int8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))))};
}
inline void store(int8_t* p, Vf a) {
  const __m256i i = _mm256_cvtps_epi32(a.v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
}
#else
inline Vf load(const int32_t* p) { return {static_cast<float>(*p)}; }
inline Vf load(const int8_t* p) { return {static_cast<float>(*p)}; }
inline void store(int8_t* p, Vf a) {
  const float r = std::nearbyint(a.v);
  *p = static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -128.0f ? -128.0f : r));
}
#endif

// Writes the first n (< kWidth) lanes of a to p as int8, rounded and saturated as store(int8_t*).
inline void store_partial(int8_t* p, Vf a, int64_t n) {
  alignas(64) int8_t tmp[kWidth > 16 ? kWidth : 16];
  store(tmp, a);
  for (int64_t i = 0; i < n; ++i) p[i] = tmp[i];
}

}  // namespace vec
}  // namespace fastbert
