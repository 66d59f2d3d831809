// The vector Philox-4x32-10 generator of the vec.h building blocks: word 0 for kWidth counters at
// once, and the dropout keep-scale of those words. philox.h wraps it in the dropout rule.
#pragma once

#include <cstdint>

#include "vec.h"

namespace fastbert {
namespace vec {

// Philox-4x32-10 word 0 for kWidth consecutive 64-bit counters (see philox.h for the rule).
// Each 32-bit state word lives in the low half of a 64-bit lane, so one vpmuludq gives the whole
// 64-bit product of a round (low word in place, high word one vpshufd away) and the upper halves
// may carry junk: products read only low halves, and only low halves are kept at the end.
// k0 / k1: the key of each of the 10 rounds.

#if defined(FASTBERT_VEC_AVX512)
namespace detail {
inline __m512i hi32(__m512i p) { return _mm512_shuffle_epi32(p, _MM_PERM_DDBB); }
inline __m512i xor3(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }
// 8 counters in 64-bit lanes -> word 0 in the low half of each lane
inline __m512i philox8(__m512i offset, uint32_t ra, uint32_t rb, const uint32_t* k0, const uint32_t* k1) {
  const __m512i ma = _mm512_set1_epi64(ra), mb = _mm512_set1_epi64(rb);
  // round 0: counter (lo, hi, 0, 0)
  __m512i pa = _mm512_mul_epu32(offset, ma);
  __m512i c0 = _mm512_xor_si512(_mm512_srli_epi64(offset, 32), _mm512_set1_epi32(static_cast<int>(k0[0])));
  __m512i c2 = _mm512_xor_si512(hi32(pa), _mm512_set1_epi32(static_cast<int>(k1[0])));
  __m512i c1 = _mm512_setzero_si512();
  __m512i c3 = pa;
  for (int i = 1; i < 9; ++i) {
    __m512i pb = _mm512_mul_epu32(c2, mb);
    pa = _mm512_mul_epu32(c0, ma);
    c0 = xor3(hi32(pb), c1, _mm512_set1_epi32(static_cast<int>(k0[i])));
    c2 = xor3(hi32(pa), c3, _mm512_set1_epi32(static_cast<int>(k1[i])));
    c1 = pb;
    c3 = pa;
  }
  return xor3(hi32(_mm512_mul_epu32(c2, mb)), c1, _mm512_set1_epi32(static_cast<int>(k0[9])));
}
}  // namespace detail

inline Vu philox_word0(uint64_t base, uint32_t ra, uint32_t rb, const uint32_t* k0, const uint32_t* k1) {
  const __m512i b = _mm512_set1_epi64(static_cast<long long>(base));
  __m512i lo = detail::philox8(_mm512_add_epi64(b, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)), ra, rb, k0, k1);
  __m512i hi = detail::philox8(_mm512_add_epi64(b, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15)), ra, rb, k0, k1);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return {_mm512_permutex2var_epi32(lo, even, hi)};
}
// `scale` in the lanes whose word u has (u >> 8) >= threshold, 0 elsewhere
inline Vf keep_scale(Vu u, uint32_t threshold, float scale) {
  __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(u.v, 8), _mm512_set1_epi32(static_cast<int>(threshold)));
  return {_mm512_maskz_mov_ps(keep, _mm512_set1_ps(scale))};
}
inline void store_u32(uint32_t* p, Vu a) { _mm512_storeu_si512(p, a.v); }
// word 0 for the counters base + i * step of lane i
inline Vu philox_word0_step(uint64_t base, uint64_t step, uint32_t ra, uint32_t rb, const uint32_t* k0,
                            const uint32_t* k1) {
  const __m512i b = _mm512_set1_epi64(static_cast<long long>(base));
  const __m512i s = _mm512_set1_epi64(static_cast<long long>(step));
  const __m512i lo_i = _mm512_mullo_epi64(s, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  const __m512i hi_i = _mm512_mullo_epi64(s, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15));
  __m512i lo = detail::philox8(_mm512_add_epi64(b, lo_i), ra, rb, k0, k1);
  __m512i hi = detail::philox8(_mm512_add_epi64(b, hi_i), ra, rb, k0, k1);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return {_mm512_permutex2var_epi32(lo, even, hi)};
}

#elif defined(FASTBERT_VEC_AVX2)
namespace detail {
inline __m256i hi32(__m256i p) { return _mm256_shuffle_epi32(p, 0xF5); }  // dwords (1, 1, 3, 3)
inline __m256i philox4(__m256i offset, uint32_t ra, uint32_t rb, const uint32_t* k0, const uint32_t* k1) {
  const __m256i ma = _mm256_set1_epi64x(ra), mb = _mm256_set1_epi64x(rb);
  __m256i pa = _mm256_mul_epu32(offset, ma);
  __m256i c0 = _mm256_xor_si256(_mm256_srli_epi64(offset, 32), _mm256_set1_epi32(static_cast<int>(k0[0])));
  __m256i c2 = _mm256_xor_si256(hi32(pa), _mm256_set1_epi32(static_cast<int>(k1[0])));
  __m256i c1 = _mm256_setzero_si256();
  __m256i c3 = pa;
  for (int i = 1; i < 9; ++i) {
    __m256i pb = _mm256_mul_epu32(c2, mb);
    pa = _mm256_mul_epu32(c0, ma);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi32(pb), c1), _mm256_set1_epi32(static_cast<int>(k0[i])));
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi32(pa), c3), _mm256_set1_epi32(static_cast<int>(k1[i])));
    c1 = pb;
    c3 = pa;
  }
  return _mm256_xor_si256(_mm256_xor_si256(hi32(_mm256_mul_epu32(c2, mb)), c1),
                          _mm256_set1_epi32(static_cast<int>(k0[9])));
}
}  // namespace detail

inline Vu philox_word0(uint64_t base, uint32_t ra, uint32_t rb, const uint32_t* k0, const uint32_t* k1) {
  const __m256i b = _mm256_set1_epi64x(static_cast<long long>(base));
  __m256i lo = detail::philox4(_mm256_add_epi64(b, _mm256_setr_epi64x(0, 1, 2, 3)), ra, rb, k0, k1);
  __m256i hi = detail::philox4(_mm256_add_epi64(b, _mm256_setr_epi64x(4, 5, 6, 7)), ra, rb, k0, k1);
  // low dwords: per 128-bit half (lo.q0, lo.q1, hi.q0, hi.q1), then the halves in order
  __m256 packed = _mm256_shuffle_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), _MM_SHUFFLE(2, 0, 2, 0));
  return {_mm256_permute4x64_epi64(_mm256_castps_si256(packed), _MM_SHUFFLE(3, 1, 2, 0))};
}
inline Vf keep_scale(Vu u, uint32_t threshold, float scale) {
  // (u >> 8) < 2^24 and threshold <= 2^24, so a signed compare is exact
  __m256i keep = _mm256_cmpgt_epi32(_mm256_srli_epi32(u.v, 8), _mm256_set1_epi32(static_cast<int>(threshold) - 1));
  return {_mm256_and_ps(_mm256_castsi256_ps(keep), _mm256_set1_ps(scale))};
}
inline void store_u32(uint32_t* p, Vu a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), a.v); }
inline Vu philox_word0_step(uint64_t base, uint64_t step, uint32_t ra, uint32_t rb, const uint32_t* k0,
                            const uint32_t* k1) {
  const auto at = [&](uint64_t i) { return static_cast<long long>(base + i * step); };
  __m256i lo = detail::philox4(_mm256_setr_epi64x(at(0), at(1), at(2), at(3)), ra, rb, k0, k1);
  __m256i hi = detail::philox4(_mm256_setr_epi64x(at(4), at(5), at(6), at(7)), ra, rb, k0, k1);
  __m256 packed = _mm256_shuffle_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), _MM_SHUFFLE(2, 0, 2, 0));
  return {_mm256_permute4x64_epi64(_mm256_castps_si256(packed), _MM_SHUFFLE(3, 1, 2, 0))};
}

#else
inline Vu philox_word0(uint64_t base, uint32_t ra, uint32_t rb, const uint32_t* k0, const uint32_t* k1) {
  uint32_t c0 = static_cast<uint32_t>(base), c1 = static_cast<uint32_t>(base >> 32), c2 = 0, c3 = 0;
  for (int i = 0; i < 10; ++i) {
    const uint64_t pa = static_cast<uint64_t>(ra) * c0, pb = static_cast<uint64_t>(rb) * c2;
    const uint32_t n0 = static_cast<uint32_t>(pb >> 32) ^ c1 ^ k0[i];
    const uint32_t n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ k1[i];
    c1 = static_cast<uint32_t>(pb);
    c3 = static_cast<uint32_t>(pa);
    c0 = n0;
    c2 = n2;
  }
  return {c0};
}
inline Vf keep_scale(Vu u, uint32_t threshold, float scale) { return {(u.v >> 8) >= threshold ? scale : 0.0f}; }
inline void store_u32(uint32_t* p, Vu a) { *p = a.v; }
inline Vu philox_word0_step(uint64_t base, uint64_t /*step*/, uint32_t ra, uint32_t rb, const uint32_t* k0,
                            const uint32_t* k1) {
  return philox_word0(base, ra, rb, k0, k1);
}
#endif

}  // namespace vec
}  // namespace fastbert
