// The int8 GEMM of int8 inference: c [m, n] int32 = a [m, k] int8 . b [n, k] int8^T, exact for any
// int8 values (int32 wraps only where the exact sum does not fit, k > 131072), with a the quantized
// activations and b a linear layer's weight [out, in], both k-contiguous.
//
// A Goto / BLIS GEMM: k in blocks of kc; per block, rows of a in blocks of kMc packed to the
// micro-kernel's element type (row-major, k padded to the group), and b packed into micro-panels
// of kNr columns laid out [k / kGroup][kNr][kGroup], so that one vector load gives one k-group of
// kNr / kW columns; the micro-kernel keeps a kMr x kNr tile of int32 accumulators in registers,
// broadcasts kGroup k-values of a row (one 32-bit lane) and multiplies them into every column.
// A micro-panel is packed when the first row block needs it (while it is in L1) and read from
// L2 by the later ones. Nothing is kept between calls: the weight is packed on every call.
//   avx512_vnni  vpdpbusd: (a + 128) as u8 x b as s8, 4 products a lane into int32 (no saturation),
//                less 128 x the micro-panel's column sums (computed while packing) as the
//                accumulators' start; zmm, 8 x 48 tile
//   avx512       vpmaddwd + vpaddd on int16 pairs (each pair sum fits int32: exact); zmm, 12 x 32
//   avx2         the same on ymm, 6 x 16 (12 accumulators of the 16 registers)
//   scalar       plain C++: a and b as int16 rows, 3 x 3 dot products that the compiler turns into
//                SSE2 pmaddwd reductions
// (vpmaddubsw, which adds pairs of u8 x s8 products into saturating int16, is never used.)
// Threads: the output in a grid of (row range x column range) tasks, at most one per thread, each
// packing its own rows of a and columns of b; the grid is the one whose largest task (multiply-adds
// plus packing) is cheapest: small m splits the columns, large m either way.
// Zen 4, 2 threads, G int-MAC/s (BERT-base shapes, m = 129 .. 4097): avx2 170-180, avx512 180-190,
// avx512_vnni 390-440, scalar 74-83; torch's fp32 mm 85-100; m = 17: 135-150 / 145-165 / 270-295.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "runtime.h"
#include "vec.h"

#if defined(FASTBERT_VEC_AVX512) && defined(__AVX512VNNI__)
#define FASTBERT_GEMM_VNNI 1
#endif

namespace fastbert {
namespace kernels {
namespace {

constexpr int kSlotA = 60;  // vec::thread_buffer slots: the packed row block of a,
constexpr int kSlotB = 61;  // and the packed column panel of b

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// the level: element types of packed a (AT) and b (BT), k-values per 32-bit lane (kGroup), int32
// lanes per vector (kW), vectors per tile row (kNv), tile rows (kMr), the longest k-block (kKc:
// BERT's k = 768 in one block, one pass over c; a micro-panel of b, kKc x kNr, is 24 KiB (avx2)
// to 48 KiB (vnni)), and what packing an element of b costs, in multiply-adds (kPackB, measured)

#if defined(FASTBERT_GEMM_VNNI)
using AT = uint8_t;
using BT = int8_t;
constexpr int kGroup = 4, kW = 16, kNv = 3, kMr = 8;
constexpr int64_t kKc = 1024;
constexpr int64_t kPackB = 8;
inline AT to_a(int8_t x) { return static_cast<AT>(x ^ 0x80); }  // a + 128
#elif defined(FASTBERT_VEC_AVX512)
using AT = int16_t;
using BT = int16_t;
constexpr int kGroup = 2, kW = 16, kNv = 2, kMr = 12;
constexpr int64_t kKc = 768;
constexpr int64_t kPackB = 4;
inline AT to_a(int8_t x) { return x; }
#elif defined(FASTBERT_VEC_AVX2)
using AT = int16_t;
using BT = int16_t;
constexpr int kGroup = 2, kW = 8, kNv = 2, kMr = 6;
constexpr int64_t kKc = 768;
constexpr int64_t kPackB = 4;
inline AT to_a(int8_t x) { return x; }
#else
using AT = int16_t;
using BT = int16_t;
constexpr int kGroup = 2, kW = 1, kNv = 3, kMr = 3;
constexpr int64_t kKc = 768;
constexpr int64_t kPackB = 2;
inline AT to_a(int8_t x) { return x; }
#endif

constexpr int kNr = kW * kNv;        // columns of a micro-panel
constexpr int64_t kMc = kMr * 16;    // rows of a packed at a time (kMc x kKc: L2)
constexpr int64_t kNc = kNr * 32;    // columns of b packed per k-block (kKc x kNc: L2 or L3)
constexpr int64_t kTileK = kW * kGroup;  // k-values that one transposed tile of b covers
// bytes after a micro-panel's groups: VNNI's accumulator start, -128 x the column sums (int32 [kNr])
#if defined(FASTBERT_GEMM_VNNI)
constexpr int64_t kPanelExtra = kNr * 4;
#else
constexpr int64_t kPanelExtra = 0;
#endif

// ---------------------------------------------------------------------------------------------
// int32 vectors

#if defined(FASTBERT_VEC_AVX512)
using Vi = __m512i;
inline Vi vzero() { return _mm512_setzero_si512(); }
inline Vi vload(const void* p) { return _mm512_loadu_si512(p); }
inline void vstore(void* p, Vi v) { _mm512_storeu_si512(p, v); }
inline Vi vadd(Vi a, Vi b) { return _mm512_add_epi32(a, b); }
inline Vi vset1(int32_t x) { return _mm512_set1_epi32(x); }
inline vec::Vf as_f(Vi v) { return {_mm512_castsi512_ps(v)}; }
inline Vi as_i(vec::Vf v) { return _mm512_castps_si512(v.v); }
#if defined(FASTBERT_GEMM_VNNI)
inline Vi vdot(Vi acc, Vi a, Vi b) { return _mm512_dpbusd_epi32(acc, a, b); }  // a u8, b s8
inline Vi load_units(const int8_t* p) { return _mm512_loadu_si512(p); }        // 64 k-values
#else
inline Vi vdot(Vi acc, Vi a, Vi b) { return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)); }
inline Vi load_units(const int8_t* p) {  // 32 k-values as int16
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif
#elif defined(FASTBERT_VEC_AVX2)
using Vi = __m256i;
inline Vi vzero() { return _mm256_setzero_si256(); }
inline Vi vload(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void vstore(void* p, Vi v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline Vi vadd(Vi a, Vi b) { return _mm256_add_epi32(a, b); }
inline Vi vset1(int32_t x) { return _mm256_set1_epi32(x); }
inline vec::Vf as_f(Vi v) { return {_mm256_castsi256_ps(v)}; }
inline Vi as_i(vec::Vf v) { return _mm256_castps_si256(v.v); }
inline Vi vdot(Vi acc, Vi a, Vi b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
inline Vi load_units(const int8_t* p) {  // 16 k-values as int16
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

// ---------------------------------------------------------------------------------------------
// packing

// Rows [0, rows) of a over k [0, kb) -> dst [rows][kcp] as AT, zero past kb.
void pack_a(const int8_t* a, int64_t lda, int64_t rows, int64_t kb, int64_t kcp, AT* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = a + r * lda;
    AT* d = dst + r * kcp;
    for (int64_t i = 0; i < kb; ++i) d[i] = to_a(src[i]);
    for (int64_t i = kb; i < kcp; ++i) d[i] = 0;
  }
}

#if defined(FASTBERT_VEC_AVX512) || defined(FASTBERT_VEC_AVX2)
// Groups [q0, kq) of a micro-panel, one value at a time: b's rows [0, nvalid) over k [0, kb),
// zero elsewhere.
void pack_b_groups(const int8_t* b, int64_t ldb, int64_t nvalid, int64_t kb, int64_t q0, int64_t kq, BT* dst) {
  for (int64_t q = q0; q < kq; ++q) {
    for (int64_t j = 0; j < kNr; ++j) {
      for (int64_t e = 0; e < kGroup; ++e) {
        const int64_t i = q * kGroup + e;
        dst[(q * kNr + j) * kGroup + e] = j < nvalid && i < kb ? static_cast<BT>(b[j * ldb + i]) : BT(0);
      }
    }
  }
}

// One micro-panel of b: rows [0, nvalid) of b (columns of c) over k [0, kb) -> dst [kq][kNr][kGroup]
// (zero past nvalid and kb): kW rows x kW 32-bit lanes at a time, transposed in registers.
void pack_b_panel(const int8_t* b, int64_t ldb, int64_t nvalid, int64_t kb, BT* dst) {
  alignas(64) static const int8_t kZeros[64] = {};
  const int64_t tiles = kb / kTileK;
  for (int64_t j0 = 0; j0 < kNr; j0 += kW) {
    for (int64_t t = 0; t < tiles; ++t) {
      vec::Vf r[kW];
      for (int64_t i = 0; i < kW; ++i) {
        const int8_t* src = j0 + i < nvalid ? b + (j0 + i) * ldb + t * kTileK : kZeros;
        r[i] = as_f(load_units(src));
      }
      vec::transpose(r);  // r[q]: lane q of every row: k-group t * kW + q of kW columns
      BT* d = dst + (t * kW * kNr + j0) * kGroup;
      for (int64_t q = 0; q < kW; ++q) vstore(d + q * kNr * kGroup, as_i(r[q]));
    }
  }
  const int64_t kq = ceil_div(kb, kGroup);
  pack_b_groups(b, ldb, nvalid, kb, tiles * kW, kq, dst);
#if defined(FASTBERT_GEMM_VNNI)
  // a's +128 adds 128 x the column's sum over this k-block to every accumulator: start them at minus that
  int32_t* start = reinterpret_cast<int32_t*>(dst + kq * kNr * kGroup);
  const Vi ones = vset1(0x01010101);
  for (int v = 0; v < kNv; ++v) {
    Vi s = vzero();
    for (int64_t q = 0; q < kq; ++q) s = vdot(s, ones, vload(dst + (q * kNr + v * kW) * kGroup));
    vstore(start + v * kW, _mm512_sub_epi32(vzero(), _mm512_slli_epi32(s, 7)));
  }
#endif
}
#else
// One micro-panel of b: rows [0, nvalid) of b over k [0, kb) -> dst [kNr][kcp] int16 (zero past
// nvalid and kb), kcp = kb rounded up to kGroup: the scalar micro-kernel takes dot products of rows.
void pack_b_panel(const int8_t* b, int64_t ldb, int64_t nvalid, int64_t kb, BT* dst) {
  const int64_t kcp = ceil_div(kb, kGroup) * kGroup;
  for (int64_t j = 0; j < kNr; ++j) {
    BT* d = dst + j * kcp;
    const int64_t valid = j < nvalid ? kb : 0;
    for (int64_t i = 0; i < valid; ++i) d[i] = b[j * ldb + i];
    for (int64_t i = valid; i < kcp; ++i) d[i] = 0;
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// micro-kernels: c [M, nc) = (add ? c + : ) M packed rows of a (row stride lda) . one micro-panel
// of b, over kq k-groups; the accumulators start at `start` [kNr] where it is not nullptr.

#if defined(FASTBERT_VEC_AVX512) || defined(FASTBERT_VEC_AVX2)
template <int M>
void micro_kernel(int64_t kq, const AT* a, int64_t lda, const BT* b, const int32_t* start, int32_t* c,
                  int64_t ldc, int64_t nc, bool add) {
  // c's lines are needed only at the end: fetch them now, behind the k-loop, not after it
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
    for (int64_t j = 0; j < kNr; j += 16) __builtin_prefetch(c + r * ldc + j, 1);
    __builtin_prefetch(c + r * ldc + kNr - 1, 1);
  }
  Vi acc[M][kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) {
    const Vi s = start != nullptr ? vload(start + v * kW) : vzero();
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) acc[r][v] = s;
  }
  for (int64_t q = 0; q < kq; ++q, b += kNr * kGroup) {
    Vi bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = vload(b + v * kW * kGroup);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      int32_t unit;  // kGroup k-values of row r
      std::memcpy(&unit, a + r * lda + q * kGroup, sizeof(unit));
      const Vi av = vset1(unit);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[r][v] = vdot(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < M; ++r) {
    int32_t* cr = c + r * ldc;
    if (nc == kNr) {
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) vstore(cr + v * kW, add ? vadd(acc[r][v], vload(cr + v * kW)) : acc[r][v]);
    } else {
      alignas(64) int32_t t[kNr];
      for (int v = 0; v < kNv; ++v) vstore(t + v * kW, acc[r][v]);
      for (int64_t j = 0; j < nc; ++j) cr[j] = add ? cr[j] + t[j] : t[j];
    }
  }
}
#else
template <int M>
void micro_kernel(int64_t kq, const AT* a, int64_t lda, const BT* b, const int32_t*, int32_t* c, int64_t ldc,
                  int64_t nc, bool add) {
  const int64_t kcp = kq * kGroup;
  int32_t s[M][kNr] = {};
  for (int64_t i = 0; i < kcp; ++i) {
    for (int r = 0; r < M; ++r) {
      for (int j = 0; j < kNr; ++j) s[r][j] += a[r * lda + i] * b[j * kcp + i];
    }
  }
  for (int r = 0; r < M; ++r) {
    for (int64_t j = 0; j < nc; ++j) c[r * ldc + j] = add ? c[r * ldc + j] + s[r][j] : s[r][j];
  }
}
#endif

using MicroKernel = void (*)(int64_t, const AT*, int64_t, const BT*, const int32_t*, int32_t*, int64_t, int64_t,
                             bool);

// micro_kernel<M> for M = 1 .. kMr, at [M - 1]
template <int... I>
constexpr std::array<MicroKernel, sizeof...(I)> micro_kernels(std::integer_sequence<int, I...>) {
  return {&micro_kernel<I + 1>...};
}
constexpr std::array<MicroKernel, kMr> kMicroKernels = micro_kernels(std::make_integer_sequence<int, kMr>{});

// ---------------------------------------------------------------------------------------------
// the loops

struct Problem {
  const int8_t* a;
  int64_t lda;
  const int8_t* b;
  int64_t ldb;
  int32_t* c;
  int64_t ldc;
  int64_t k;
  int64_t kc;  // the k-block, a multiple of kTileK
};

// c's rows [m0, m1) x columns [n0, n1) on the calling thread: per column panel (kNc) and k-block
// (kc), the row blocks (kMc) of a packed in turn; the first of them packs each micro-panel of b
// just before it uses it, the later ones find them packed.
void gemm_block(const Problem& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t kcp = ceil_div(p.kc, kGroup) * kGroup;
  const int64_t panel = kcp * kNr + kPanelExtra / static_cast<int64_t>(sizeof(BT));  // BT elements
  AT* ap = vec::thread_buffer<AT, kSlotA>(kMc * kcp);
  BT* bp = vec::thread_buffer<BT, kSlotB>(ceil_div(std::min(kNc, n1 - n0), kNr) * panel);
  for (int64_t jc = n0; jc < n1; jc += kNc) {
    const int64_t nb = std::min(kNc, n1 - jc);
    for (int64_t pc = 0; pc < p.k; pc += p.kc) {
      const int64_t kb = std::min(p.kc, p.k - pc), kq = ceil_div(kb, kGroup), lda = kq * kGroup;
      for (int64_t ic = m0; ic < m1; ic += kMc) {
        const int64_t mb = std::min(kMc, m1 - ic);
        pack_a(p.a + ic * p.lda + pc, p.lda, mb, kb, lda, ap);
        for (int64_t jr = 0; jr < nb; jr += kNr) {
          BT* bpanel = bp + jr / kNr * panel;
          const int64_t nc = std::min<int64_t>(kNr, nb - jr);
          if (ic == m0) pack_b_panel(p.b + (jc + jr) * p.ldb + pc, p.ldb, nc, kb, bpanel);
          const int32_t* start =
              kPanelExtra > 0 ? reinterpret_cast<const int32_t*>(bpanel + kq * kNr * kGroup) : nullptr;
          int32_t* c = p.c + ic * p.ldc + jc + jr;
          for (int64_t ir = 0; ir < mb; ir += kMr) {
            const int64_t mr = std::min<int64_t>(kMr, mb - ir);
            kMicroKernels[mr - 1](kq, ap + ir * lda, lda, bpanel, start, c + ir * p.ldc, p.ldc, nc, pc > 0);
          }
        }
      }
    }
  }
}

// The tasks: tm row ranges (of whole tiles) x tn column ranges (of whole micro-panels), at most one
// per thread, such that the largest task costs least: its multiply-adds, plus packing its rows of
// a and its columns of b (each task packs its own), per element about kPackA / kPackB multiply-adds.
std::pair<int64_t, int64_t> task_grid(int64_t tiles, int64_t panels, int64_t threads) {
  constexpr int64_t kPackA = 2;
  std::pair<int64_t, int64_t> best{1, 1};
  int64_t best_cost = -1;
  for (int64_t tn = 1; tn <= std::min(threads, panels); ++tn) {
    const int64_t tm = std::min(threads / tn, tiles);
    const int64_t rows = ceil_div(tiles, tm) * kMr, cols = ceil_div(panels, tn) * kNr;
    const int64_t cost = rows * cols + rows * kPackA + cols * kPackB;  // per k
    if (best_cost < 0 || cost < best_cost) best = {tm, tn}, best_cost = cost;
  }
  return best;
}

}  // namespace

void int8_gemm(const int8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc, int64_t m,
               int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(int32_t) * static_cast<size_t>(n));
    return;
  }
  // k-blocks of equal size (up to kKc, whole tiles): fewer passes over c, and no short last block
  const int64_t blocks = ceil_div(k, kKc);
  const Problem p{a, lda, b, ldb, c, ldc, k, ceil_div(ceil_div(k, blocks), kTileK) * kTileK};
  const int64_t panels = ceil_div(n, kNr), tiles = ceil_div(m, kMr);
  const std::pair<int64_t, int64_t> grid = task_grid(tiles, panels, std::max<int64_t>(1, num_threads()));
  const int64_t tm = grid.first, tn = grid.second;
  parallel_for(0, tm * tn, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / tn, j = t % tn;
      const int64_t m0 = std::min(m, tiles * i / tm * kMr), m1 = std::min(m, tiles * (i + 1) / tm * kMr);
      const int64_t n0 = std::min(n, panels * j / tn * kNr), n1 = std::min(n, panels * (j + 1) / tn * kNr);
      gemm_block(p, m0, m1, n0, n1);
    }
  });
}

}  // namespace kernels
}  // namespace fastbert
