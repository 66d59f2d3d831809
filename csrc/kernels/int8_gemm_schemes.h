// The int8 GEMM's schemes (int8_gemm.cpp): how a level multiplies int8 k-values into int32 lanes,
// with the element types of the packed operands and the micro-kernel's tile.
//
//   Pairs  a and b widened to int16, pairs of products into int32 (vpmaddwd + vpaddd): exact for
//          any int8 operands. avx2: ymm, 6 x 16 tile; avx512: zmm, 12 x 32.
//   Quads  (a + 128) as u8 x b as s8, four products a lane into int32, the accumulators starting at
//          -128 x the column sums of b (computed while packing). avx512_vnni: one vpdpbusd, exact
//          for any b; zmm, 8 x 48. avx2: vpmaddubsw (pairs of u8 x s8 products into saturating
//          int16) + vpmaddwd by ones + vpaddd, exact while every |b| <= 64 (255 x 64 x 2 = 32640
//          fits int16; weights quantized with weight_range=64); packing checks the bound, and a
//          task whose b exceeds it runs Pairs instead; ymm, 6 x 16. (avx512 without VNNI could do
//          the same on zmm; it runs Pairs.)
//   Signs  avx2, the packed GEMM's (int8_gemm_packed.cpp: no pass over b to check it first): |a| as
//          u8 x b with a's sign (vpabsb, vpsignb), vpmaddubsw + vpmaddwd by ones + vpaddd: every
//          pair fits int16 (128 x 127 x 2 = 32512) for any a and any b but -128 (whose negation
//          wraps), so full-range weights are exact; one more instruction per product than Quads
//          (about as fast as Pairs on a Zen 3: benchmarks/LOG.md, "AVX2's GEMMs with full-range
//          weights"); ymm, 6 x 16.
//   scalar level: Pairs in plain C++ (a and b as int16 rows, dot products that the compiler turns
//          into SSE2 pmaddwd reductions), 3 x 3.
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec.h"

#if defined(FASTBERT_VEC_AVX512) && defined(__AVX512VNNI__)
#define FASTBERT_GEMM_VNNI 1
#endif

namespace fastbert {
namespace kernels {
namespace gemm8 {

// ---------------------------------------------------------------------------------------------
// int32 vectors

#if defined(FASTBERT_VEC_AVX512)
constexpr int kW = 16;  // int32 lanes of a vector
using Vi = __m512i;
inline Vi vzero() { return _mm512_setzero_si512(); }
inline Vi vload(const void* p) { return _mm512_loadu_si512(p); }
inline void vstore(void* p, Vi v) { _mm512_storeu_si512(p, v); }
inline Vi vadd(Vi a, Vi b) { return _mm512_add_epi32(a, b); }
inline Vi vset1(int32_t x) { return _mm512_set1_epi32(x); }
inline Vi times_minus_128(Vi v) { return _mm512_sub_epi32(vzero(), _mm512_slli_epi32(v, 7)); }
inline Vi madd16(Vi a, Vi b) { return _mm512_madd_epi16(a, b); }
inline Vi widen8(const int8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#elif defined(FASTBERT_VEC_AVX2)
constexpr int kW = 8;
using Vi = __m256i;
inline Vi vzero() { return _mm256_setzero_si256(); }
inline Vi vload(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void vstore(void* p, Vi v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline Vi vadd(Vi a, Vi b) { return _mm256_add_epi32(a, b); }
inline Vi vset1(int32_t x) { return _mm256_set1_epi32(x); }
inline Vi times_minus_128(Vi v) { return _mm256_sub_epi32(vzero(), _mm256_slli_epi32(v, 7)); }
inline Vi madd16(Vi a, Vi b) { return _mm256_madd_epi16(a, b); }
inline Vi maddubs(Vi a, Vi b) { return _mm256_maddubs_epi16(a, b); }
inline Vi widen8(const int8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// the largest |v| in each byte lane so far (|-128| is 128 as u8), and the largest of the 32
inline Vi abs8_max(Vi m, Vi v) { return _mm256_max_epu8(m, _mm256_abs_epi8(v)); }
inline int max_u8(Vi m) {
  __m128i q = _mm_max_epu8(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  q = _mm_max_epu8(q, _mm_srli_si128(q, 8));
  q = _mm_max_epu8(q, _mm_srli_si128(q, 4));
  q = _mm_max_epu8(q, _mm_srli_si128(q, 2));
  q = _mm_max_epu8(q, _mm_srli_si128(q, 1));
  return _mm_extract_epi8(q, 0);
}
#endif

#if defined(FASTBERT_VEC_AVX512) || defined(FASTBERT_VEC_AVX2)
inline vec::Vf as_f(Vi v) {
#if defined(FASTBERT_VEC_AVX512)
  return {_mm512_castsi512_ps(v)};
#else
  return {_mm256_castsi256_ps(v)};
#endif
}
inline Vi as_i(vec::Vf v) {
#if defined(FASTBERT_VEC_AVX512)
  return _mm512_castps_si512(v.v);
#else
  return _mm256_castps_si256(v.v);
#endif
}

// ---------------------------------------------------------------------------------------------
// the schemes: element types of packed a (AT) and b (BT), k-values per 32-bit lane (kGroup), vectors
// per tile row (kNv), tile rows (kMr), the longest k-block (kKc: BERT's k = 768 in one block, one
// pass over c), what packing an element of b costs in multiply-adds (kPackB, measured), whether the
// accumulators start at -128 x b's column sums (kColSums), and whether b, as packed, holds a value
// it is not exact for (track each loaded vector of b, then ask exceeds with the largest |b| of the
// rest).

struct Pairs {
  using AT = int16_t;
  using BT = int16_t;
  static constexpr int kGroup = 2, kNv = 2;
#if defined(FASTBERT_VEC_AVX512)
  static constexpr int kMr = 12;
#else
  static constexpr int kMr = 6;  // 12 accumulators of the 16 ymm registers
#endif
  static constexpr int64_t kKc = 768, kPackB = 4;
  static constexpr bool kColSums = false;
  static AT to_a(int8_t x) { return x; }
  static Vi dot(Vi acc, Vi a, Vi b) { return vadd(acc, madd16(a, b)); }
  static Vi load_units(const int8_t* p) { return widen8(p); }  // kW * kGroup k-values as int16
  static Vi track(Vi most, Vi) { return most; }
  static bool exceeds(Vi, int) { return false; }
};

#if defined(FASTBERT_GEMM_VNNI) || !defined(FASTBERT_VEC_AVX512)
#define FASTBERT_GEMM_QUADS 1
struct Quads {
  using AT = uint8_t;
  using BT = int8_t;
  static constexpr int kGroup = 4;
#if defined(FASTBERT_GEMM_VNNI)
  static constexpr int kNv = 3, kMr = 8;
  static Vi dot(Vi acc, Vi a, Vi b) { return _mm512_dpbusd_epi32(acc, a, b); }
  static Vi track(Vi most, Vi) { return most; }  // exact for any b
  static bool exceeds(Vi, int) { return false; }
#else
  // 12 accumulators, 2 of b, a, ones and a product: one more than the 16 ymm registers, and one
  // accumulator goes to the stack; 5 rows (no spill) and the ones as vpmaddwd's memory operand
  // measured the same
  static constexpr int kNv = 2, kMr = 6;
  static Vi dot(Vi acc, Vi a, Vi b) { return vadd(acc, madd16(maddubs(a, b), vset1(0x00010001))); }
  // exact while every |b| <= 64: `most` gathers |b| of each byte lane as b is packed
  static Vi track(Vi most, Vi units) { return abs8_max(most, units); }
  static bool exceeds(Vi most, int tail) { return std::max(max_u8(most), tail) > 64; }
#endif
  static constexpr int64_t kKc = 1024, kPackB = 8;
  static constexpr bool kColSums = true;
  static AT to_a(int8_t x) { return static_cast<AT>(x ^ 0x80); }  // a + 128
  static Vi load_units(const int8_t* p) { return vload(p); }     // kW * kGroup k-values
};
#endif

#if !defined(FASTBERT_VEC_AVX512)
#define FASTBERT_GEMM_SIGNS 1
struct Signs {
  using AT = uint8_t;  // a's bits as they are: dot() takes its size and sign
  using BT = int8_t;
  static constexpr int kGroup = 4;
  static constexpr int kNv = 2, kMr = 6;
  // a . b = |a| . (b with a's sign): vpsignb gives -b where a < 0 and 0 where a == 0
  static Vi dot(Vi acc, Vi a, Vi b) {
    return vadd(acc, madd16(maddubs(_mm256_abs_epi8(a), _mm256_sign_epi8(b, a)), vset1(0x00010001)));
  }
  // exact while no b is -128: `most` gathers |b| of each byte lane (|-128| is 128 as u8)
  static Vi track(Vi most, Vi units) { return abs8_max(most, units); }
  static bool exceeds(Vi most, int tail) { return std::max(max_u8(most), tail) > 127; }
  static constexpr int64_t kKc = 1024, kPackB = 8;
  static constexpr bool kColSums = false;
  static AT to_a(int8_t x) { return static_cast<AT>(x); }
  static Vi load_units(const int8_t* p) { return vload(p); }
};
#endif
#else
constexpr int kW = 1;
struct Pairs {
  using AT = int16_t;
  using BT = int16_t;
  static constexpr int kGroup = 2, kNv = 3, kMr = 3;
  static constexpr int64_t kKc = 768, kPackB = 2;
  static constexpr bool kColSums = false;
  static AT to_a(int8_t x) { return x; }
};
#endif

}  // namespace gemm8
}  // namespace kernels
}  // namespace fastbert
