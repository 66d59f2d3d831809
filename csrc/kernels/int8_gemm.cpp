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
// How k-values are multiplied (the scheme: int8_gemm_schemes.h) depends on the level: VNNI's
// vpdpbusd; at avx2 vpmaddubsw where every |b| <= 64 (weights quantized with weight_range=64), else
// vpmaddwd on int16 pairs, as at avx512; SSE2 pmaddwd from plain C++ at the scalar level.
// Threads: the output in a grid of (row range x column range) tasks, at most one per thread, each
// packing its own rows of a and columns of b; the grid is the one whose largest task (multiply-adds
// plus packing) is cheapest: small m splits the columns, large m either way.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "int8_gemm_schemes.h"
#include "runtime.h"
#include "vec.h"

namespace fastbert {
namespace kernels {
namespace {

using namespace gemm8;  // NOLINT: the schemes and their vectors

constexpr int kSlotA = 60;  // vec::thread_buffer slots: the packed row block of a,
constexpr int kSlotB = 61;  // and the packed column panel of b

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// the blocking of scheme S
template <class S>
struct Blocks {
  static constexpr int kNr = kW * S::kNv;          // columns of a micro-panel
  static constexpr int64_t kMc = S::kMr * 16;      // rows of a packed at a time (kMc x kKc: L2)
  static constexpr int64_t kNc = kNr * 32;         // columns of b packed per k-block (kKc x kNc: L2 or L3)
  static constexpr int64_t kTileK = kW * S::kGroup;  // k-values that one transposed tile of b covers
  // bytes after a micro-panel's groups: the accumulators' start, -128 x the column sums (int32 [kNr])
  static constexpr int64_t kPanelExtra = S::kColSums ? kNr * 4 : 0;
};

// ---------------------------------------------------------------------------------------------
// packing

// Rows [0, rows) of a over k [0, kb) -> dst [rows][kcp] as S::AT, zero past kb.
template <class S>
void pack_a(const int8_t* a, int64_t lda, int64_t rows, int64_t kb, int64_t kcp, typename S::AT* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = a + r * lda;
    typename S::AT* d = dst + r * kcp;
    for (int64_t i = 0; i < kb; ++i) d[i] = S::to_a(src[i]);
    for (int64_t i = kb; i < kcp; ++i) d[i] = 0;
  }
}

#if defined(FASTBERT_VEC_AVX512) || defined(FASTBERT_VEC_AVX2)
// Groups [q0, kq) of a micro-panel, one value at a time: b's rows [0, nvalid) over k [0, kb),
// zero elsewhere. -> the largest |b| among them.
template <class S>
int pack_b_groups(const int8_t* b, int64_t ldb, int64_t nvalid, int64_t kb, int64_t q0, int64_t kq,
                  typename S::BT* dst) {
  constexpr int kNr = Blocks<S>::kNr;
  int most = 0;
  for (int64_t q = q0; q < kq; ++q) {
    for (int64_t j = 0; j < kNr; ++j) {
      for (int64_t e = 0; e < S::kGroup; ++e) {
        const int64_t i = q * S::kGroup + e;
        const int v = j < nvalid && i < kb ? b[j * ldb + i] : 0;
        most = std::max(most, v < 0 ? -v : v);
        dst[(q * kNr + j) * S::kGroup + e] = static_cast<typename S::BT>(v);
      }
    }
  }
  return most;
}

// One micro-panel of b: rows [0, nvalid) of b (columns of c) over k [0, kb) -> dst [kq][kNr][kGroup]
// (zero past nvalid and kb), kW rows x kW 32-bit lanes at a time, transposed in registers; then,
// for Quads, the accumulators' start. false (the panel unfinished) where S is not exact for b.
template <class S>
bool pack_b_panel(const int8_t* b, int64_t ldb, int64_t nvalid, int64_t kb, typename S::BT* dst) {
  using B = Blocks<S>;
  alignas(64) static const int8_t kZeros[64] = {};
  const int64_t tiles = kb / B::kTileK;
  Vi most = vzero();  // what S tracks of b as it is loaded (avx2's Quads: the largest |b| per byte lane)
  for (int64_t j0 = 0; j0 < B::kNr; j0 += kW) {
    for (int64_t t = 0; t < tiles; ++t) {
      vec::Vf r[kW];
      for (int64_t i = 0; i < kW; ++i) {
        const int8_t* src = j0 + i < nvalid ? b + (j0 + i) * ldb + t * B::kTileK : kZeros;
        const Vi units = S::load_units(src);
        most = S::track(most, units);
        r[i] = as_f(units);
      }
      vec::transpose(r);  // r[q]: lane q of every row: k-group t * kW + q of kW columns
      typename S::BT* d = dst + (t * kW * B::kNr + j0) * S::kGroup;
      for (int64_t q = 0; q < kW; ++q) vstore(d + q * B::kNr * S::kGroup, as_i(r[q]));
    }
  }
  const int64_t kq = ceil_div(kb, S::kGroup);
  const int tail = pack_b_groups<S>(b, ldb, nvalid, kb, tiles * kW, kq, dst);
  if (S::exceeds(most, tail)) return false;
  if constexpr (S::kColSums) {
    // a's +128 adds 128 x the column's sum over this k-block to every accumulator: start them at minus that
    int32_t* start = reinterpret_cast<int32_t*>(dst + kq * B::kNr * S::kGroup);
    const Vi ones = vset1(0x01010101);
    for (int v = 0; v < S::kNv; ++v) {
      Vi s = vzero();
      for (int64_t q = 0; q < kq; ++q) s = S::dot(s, ones, vload(dst + (q * B::kNr + v * kW) * S::kGroup));
      vstore(start + v * kW, times_minus_128(s));
    }
  }
  return true;
}
#else
// One micro-panel of b: rows [0, nvalid) of b over k [0, kb) -> dst [kNr][kcp] int16 (zero past
// nvalid and kb), kcp = kb rounded up to kGroup: the scalar micro-kernel takes dot products of rows.
template <class S>
bool pack_b_panel(const int8_t* b, int64_t ldb, int64_t nvalid, int64_t kb, typename S::BT* dst) {
  const int64_t kcp = ceil_div(kb, S::kGroup) * S::kGroup;
  for (int64_t j = 0; j < Blocks<S>::kNr; ++j) {
    typename S::BT* d = dst + j * kcp;
    const int64_t valid = j < nvalid ? kb : 0;
    for (int64_t i = 0; i < valid; ++i) d[i] = b[j * ldb + i];
    for (int64_t i = valid; i < kcp; ++i) d[i] = 0;
  }
  return true;
}
#endif

// ---------------------------------------------------------------------------------------------
// micro-kernels: c [M, nc) = (add ? c + : ) M packed rows of a (row stride lda) . one micro-panel
// of b, over kq k-groups; the accumulators start at `start` [kNr] where it is not nullptr.

#if defined(FASTBERT_VEC_AVX512) || defined(FASTBERT_VEC_AVX2)
template <class S, int M>
void micro_kernel(int64_t kq, const typename S::AT* a, int64_t lda, const typename S::BT* b, const int32_t* start,
                  int32_t* c, int64_t ldc, int64_t nc, bool add) {
  constexpr int kNv = S::kNv, kNr = Blocks<S>::kNr;
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
  for (int64_t q = 0; q < kq; ++q, b += kNr * S::kGroup) {
    Vi bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = vload(b + v * kW * S::kGroup);
#pragma GCC unroll 16
    for (int r = 0; r < M; ++r) {
      int32_t unit;  // kGroup k-values of row r
      std::memcpy(&unit, a + r * lda + q * S::kGroup, sizeof(unit));
      const Vi av = vset1(unit);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[r][v] = S::dot(acc[r][v], av, bv[v]);
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
template <class S, int M>
void micro_kernel(int64_t kq, const typename S::AT* a, int64_t lda, const typename S::BT* b, const int32_t*,
                  int32_t* c, int64_t ldc, int64_t nc, bool add) {
  constexpr int kNr = Blocks<S>::kNr;
  const int64_t kcp = kq * S::kGroup;
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

template <class S>
using MicroKernel = void (*)(int64_t, const typename S::AT*, int64_t, const typename S::BT*, const int32_t*, int32_t*,
                             int64_t, int64_t, bool);

// micro_kernel<S, M> for M = 1 .. kMr, at [M - 1]
template <class S, int... I>
constexpr std::array<MicroKernel<S>, sizeof...(I)> micro_kernels(std::integer_sequence<int, I...>) {
  return {&micro_kernel<S, I + 1>...};
}
template <class S>
constexpr std::array<MicroKernel<S>, S::kMr> kMicroKernels = micro_kernels<S>(std::make_integer_sequence<int, S::kMr>{});

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
};

// c's rows [m0, m1) x columns [n0, n1) on the calling thread, with scheme S: per column panel (kNc)
// and k-block (kc), the row blocks (kMc) of a packed in turn; the first of them packs each
// micro-panel of b just before it uses it, the later ones find them packed. false, with c's block
// partly written, when b holds a value S is not exact for.
template <class S>
bool gemm_block(const Problem& p, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  using B = Blocks<S>;
  using AT = typename S::AT;
  using BT = typename S::BT;
  // k-blocks of equal size (up to kKc, whole tiles): fewer passes over c, and no short last block
  const int64_t kc = ceil_div(ceil_div(p.k, ceil_div(p.k, S::kKc)), B::kTileK) * B::kTileK;
  const int64_t kcp = ceil_div(kc, S::kGroup) * S::kGroup;
  const int64_t panel = kcp * B::kNr + B::kPanelExtra / static_cast<int64_t>(sizeof(BT));  // BT elements
  AT* ap = vec::thread_buffer<AT, kSlotA>(B::kMc * kcp);
  BT* bp = vec::thread_buffer<BT, kSlotB>(ceil_div(std::min(B::kNc, n1 - n0), B::kNr) * panel);
  for (int64_t jc = n0; jc < n1; jc += B::kNc) {
    const int64_t nb = std::min(B::kNc, n1 - jc);
    for (int64_t pc = 0; pc < p.k; pc += kc) {
      const int64_t kb = std::min(kc, p.k - pc), kq = ceil_div(kb, S::kGroup), lda = kq * S::kGroup;
      for (int64_t ic = m0; ic < m1; ic += B::kMc) {
        const int64_t mb = std::min(B::kMc, m1 - ic);
        pack_a<S>(p.a + ic * p.lda + pc, p.lda, mb, kb, lda, ap);
        for (int64_t jr = 0; jr < nb; jr += B::kNr) {
          BT* bpanel = bp + jr / B::kNr * panel;
          const int64_t nc = std::min<int64_t>(B::kNr, nb - jr);
          if (ic == m0 && !pack_b_panel<S>(p.b + (jc + jr) * p.ldb + pc, p.ldb, nc, kb, bpanel)) return false;
          const int32_t* start =
              S::kColSums ? reinterpret_cast<const int32_t*>(bpanel + kq * B::kNr * S::kGroup) : nullptr;
          int32_t* c = p.c + ic * p.ldc + jc + jr;
          for (int64_t ir = 0; ir < mb; ir += S::kMr) {
            const int64_t mr = std::min<int64_t>(S::kMr, mb - ir);
            kMicroKernels<S>[mr - 1](kq, ap + ir * lda, lda, bpanel, start, c + ir * p.ldc, p.ldc, nc, pc > 0);
          }
        }
      }
    }
  }
  return true;
}

// The tasks: tm row ranges (of whole tiles) x tn column ranges (of whole micro-panels), at most one
// per thread, such that the largest task costs least: its multiply-adds, plus packing its rows of
// a and its columns of b (each task packs its own), per element about kPackA / kPackB multiply-adds.
template <class S>
std::pair<int64_t, int64_t> task_grid(int64_t tiles, int64_t panels, int64_t threads) {
  constexpr int64_t kPackA = 2;
  std::pair<int64_t, int64_t> best{1, 1};
  int64_t best_cost = -1;
  for (int64_t tn = 1; tn <= std::min(threads, panels); ++tn) {
    const int64_t tm = std::min(threads / tn, tiles);
    const int64_t rows = ceil_div(tiles, tm) * S::kMr, cols = ceil_div(panels, tn) * Blocks<S>::kNr;
    const int64_t cost = rows * cols + rows * kPackA + cols * S::kPackB;  // per k
    if (best_cost < 0 || cost < best_cost) best = {tm, tn}, best_cost = cost;
  }
  return best;
}

// The whole product with scheme S; each task that finds a value of b that S is not exact for
// computes its block again with Fallback.
template <class S, class Fallback>
void gemm(const Problem& p, int64_t m, int64_t n) {
  const int64_t panels = ceil_div(n, Blocks<S>::kNr), tiles = ceil_div(m, S::kMr);
  const std::pair<int64_t, int64_t> grid = task_grid<S>(tiles, panels, std::max<int64_t>(1, num_threads()));
  const int64_t tm = grid.first, tn = grid.second;
  parallel_for(0, tm * tn, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / tn, j = t % tn;
      const int64_t m0 = std::min(m, tiles * i / tm * S::kMr), m1 = std::min(m, tiles * (i + 1) / tm * S::kMr);
      const int64_t n0 = std::min(n, panels * j / tn * Blocks<S>::kNr);
      const int64_t n1 = std::min(n, panels * (j + 1) / tn * Blocks<S>::kNr);
      if (!gemm_block<S>(p, m0, m1, n0, n1)) gemm_block<Fallback>(p, m0, m1, n0, n1);
    }
  });
}

}  // namespace

void int8_gemm(const int8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc, int64_t m,
               int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(int32_t) * static_cast<size_t>(n));
    return;
  }
  const Problem p{a, lda, b, ldb, c, ldc, k};
#if defined(FASTBERT_GEMM_QUADS)
  gemm<Quads, Pairs>(p, m, n);
#else
  gemm<Pairs, Pairs>(p, m, n);
#endif
}

}  // namespace kernels
}  // namespace fastbert
