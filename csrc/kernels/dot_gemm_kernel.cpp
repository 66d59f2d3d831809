// The fp32 dot-product GEMM: c [m, n] = a [m, k] . b [n, k]^T (+ bias [n]), with b a linear layer's
// weight [out, in] read as it lies in memory, nothing packed and nothing kept between calls.
//
// Each output is the dot product of a row of a and a row of b, both k-contiguous: a tile of kMr
// rows of a by kNr rows of b keeps kMr x kNr vector accumulators over k, and sums each one's
// lanes at the end. The loops run over panels of kNr rows of b outermost, and over the row blocks
// of a inside: a panel comes from memory once a call (the first row block reads it, while the next
// panel is fetched behind it; the later ones find it in L1 or L2), and a, a few rows, stays in L2.
// A GEMM that packs b (MKL, oneDNN, int8_gemm.cpp) reads and writes every weight once more on each
// call; with few rows of a (a batch of one short sequence: 20 rows) that pass, not the
// multiply-adds, takes most of the time. With many rows this loses to a packed GEMM: which one runs
// a product is measured (fastbert.ops.gemm).
// Threads: contiguous ranges of panels, a few per thread, claimed in turn (kernels::for_each_claimed);
// row blocks of a in chunks whose rows fit in L2 (each chunk reads the range's panels again).
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "api.h"
#include "runtime.h"
#include "vec.h"

namespace fastbert {
namespace kernels {
namespace {

#if defined(FASTBERT_VEC_AVX512)
constexpr int kMr = 4, kNr = 6;  // 24 accumulators, 4 rows of a and one of b: 29 of the 32 zmm registers
#else
constexpr int kMr = 3, kNr = 4;  // 12 accumulators, 3 rows of a and one of b: the 16 ymm registers
#endif
constexpr int64_t kChunkBytes = int64_t{256} << 10;  // rows of a per chunk: as many as fit in this (L2)
constexpr int64_t kChunksPerThread = 4;  // column ranges per thread, claimed in turn (runtime.h)
constexpr int64_t kTaskMacs = int64_t{1} << 18;  // multiply-adds a range has at least: less, and a second
                                                 // thread costs more to start than it saves

using vec::Vf;

// acc[r][j] += a row r . b row j over k-values [i0, i1) (whole vectors).
template <int MR, int NR>
inline void accumulate(Vf (&acc)[MR][NR], const float* a, int64_t lda, const float* b, int64_t ldb, int64_t i0,
                       int64_t i1) {
  for (int64_t i = i0; i < i1; i += vec::kWidth) {
    Vf av[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) av[r] = vec::load(a + r * lda + i);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const Vf bv = vec::load(b + j * ldb + i);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][j] = vec::fmadd(av[r], bv, acc[r][j]);
    }
  }
}

// c [MR, NR] (row stride ldc) = MR rows of a . NR rows of b over k (+ bias [NR] when not nullptr).
// The cache lines of k-values [pf0, pf1) of the next panel's rows (next, NR rows of stride ldb) are
// prefetched on the way, spread evenly over the whole of k (none when next is nullptr).
template <int MR, int NR>
void tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, const float* bias, float* c,
          int64_t ldc, const float* next, int64_t pf0, int64_t pf1) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(float));  // k-values a cache line holds
  Vf acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[r][j] = vec::set1(0.0f);
  }
  const int64_t kv = k / vec::kWidth * vec::kWidth;
  // The share's lines, NR * per_row of them (row j, line l), taken in order j fastest: `each` a
  // step of kStep k-values, the last steps taking none.
  constexpr int64_t kStep = 2 * kLine;
  const int64_t per_row = next != nullptr && pf1 > pf0 ? (pf1 - pf0 + kLine - 1) / kLine : 0;
  const int64_t steps = (kv + kStep - 1) / kStep;
  const int64_t each = steps > 0 ? (NR * per_row + steps - 1) / steps : 0;
  const float* line = next != nullptr ? next + pf0 : nullptr;
  int64_t row = 0, left = NR * per_row;
  for (int64_t i = 0; i < kv; i += kStep) {
    for (int64_t t = std::min(each, left); t > 0; --t, --left) {
      __builtin_prefetch(line + row * ldb);
      if (++row == NR) row = 0, line += kLine;
    }
    accumulate(acc, a, lda, b, ldb, i, std::min(i + kStep, kv));
  }
  float sums[MR * NR];
  int q = 0;
#pragma GCC unroll 8
  for (; q + 4 <= MR * NR; q += 4) {
    vec::hsum4(acc[q / NR][q % NR], acc[(q + 1) / NR][(q + 1) % NR], acc[(q + 2) / NR][(q + 2) % NR],
               acc[(q + 3) / NR][(q + 3) % NR], sums + q);
  }
#pragma GCC unroll 4
  for (; q < MR * NR; ++q) sums[q] = vec::hsum(acc[q / NR][q % NR]);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float s = sums[r * NR + j];
      for (int64_t i = kv; i < k; ++i) s += a[r * lda + i] * b[j * ldb + i];
      c[r * ldc + j] = bias != nullptr ? s + bias[j] : s;
    }
  }
}

using Tile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t,
                      const float*, int64_t, int64_t);

template <int MR, int... J>
constexpr std::array<Tile, sizeof...(J)> tiles_of(std::integer_sequence<int, J...>) {
  return {&tile<MR, J + 1>...};
}
template <int... I>
constexpr std::array<std::array<Tile, kNr>, sizeof...(I)> all_tiles(std::integer_sequence<int, I...>) {
  return {tiles_of<I + 1>(std::make_integer_sequence<int, kNr>{})...};
}
// kTiles[mr - 1][nr - 1]: the tile of mr rows of a by nr rows of b
constexpr std::array<std::array<Tile, kNr>, kMr> kTiles = all_tiles(std::make_integer_sequence<int, kMr>{});

struct Problem {
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  const float* bias;
  float* c;
  int64_t ldc;
  int64_t m, n, k;
};

// Columns [n0, n1) of c (rows of b), every row of a, on the calling thread. While a panel is read
// (from memory by the first row block of a, from cache by the others), the next one is prefetched,
// each row block taking an equal share of its lines: a steady stream of requests behind the
// multiply-adds.
void columns(const Problem& p, int64_t n0, int64_t n1) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(float));
  const int64_t row_bytes = std::max<int64_t>(p.k, 1) * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::max<int64_t>(kMr, kChunkBytes / row_bytes / kMr * kMr);
  for (int64_t m0 = 0; m0 < p.m; m0 += chunk) {
    const int64_t m1 = std::min(p.m, m0 + chunk), blocks = (m1 - m0 + kMr - 1) / kMr;
    for (int64_t j = n0; j < n1; j += kNr) {
      const int64_t nr = std::min<int64_t>(kNr, n1 - j);
      const float* b = p.b + j * p.ldb;
      const float* next = j + 2 * kNr <= n1 ? b + kNr * p.ldb : nullptr;  // a whole panel after this one
      const float* bias = p.bias != nullptr ? p.bias + j : nullptr;
      for (int64_t ib = 0; ib < blocks; ++ib) {
        const int64_t i = m0 + ib * kMr, mr = std::min<int64_t>(kMr, m1 - i);
        const int64_t pf0 = p.k * ib / blocks / kLine * kLine, pf1 = p.k * (ib + 1) / blocks / kLine * kLine;
        kTiles[mr - 1][nr - 1](p.a + i * p.lda, p.lda, b, p.ldb, p.k, bias, p.c + i * p.ldc + j, p.ldc, next, pf0,
                               ib + 1 == blocks ? p.k : pf1);
      }
    }
  }
}

}  // namespace

void f32_dot_gemm(const float* a, int64_t lda, const float* b, int64_t ldb, const float* bias, float* c, int64_t ldc,
                  int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  const Problem p{a, lda, b, ldb, bias, c, ldc, m, n, k};
  const int64_t panels = (n + kNr - 1) / kNr;
  const int64_t chunks = std::max<int64_t>(1, std::min({panels, kChunksPerThread * std::max<int64_t>(1, num_threads()),
                                                        m * n * k / kTaskMacs}));
  for_each_claimed(chunks, [&](int64_t i) {
    columns(p, std::min(n, panels * i / chunks * kNr), std::min(n, panels * (i + 1) / chunks * kNr));
  });
}

}  // namespace kernels
}  // namespace fastbert
