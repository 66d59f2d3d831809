// The int8 GEMM on a weight stored packed: c [m, n] int32 = a [m, k] int8 . b^T, exact, with b a
// linear layer's int8 weight [n, k] kept in the layout the micro-kernels read,
//
//     bp [n / 16][kq][16][4]     kq = ceil(k / 4): panels of 16 columns (output features), and in
//                                each panel one 64-byte vector per 4 k-values (zero past k)
//
// which is the weight's only copy in the model (fastbert.model.quantize.Int8Linear): nothing is derived
// from it and kept, so nothing can go stale, and no call spends time packing it. int8_gemm.cpp packs
// the weight on every call instead; at a handful of rows that packing costs about as much as the
// multiply-adds.
//
// a is packed per call as the scheme reads it; per group of columns (avx512_vnni: up to three
// panels, 3 zmm; avx2: one panel, 2 ymm) the rows in tiles (8 and 6), each k-group one broadcast of
// a row and one product a vector (int8_gemm_schemes.h's Quads and Signs). With VNNI, vpdpbusd on a + 128 (u8)
// and b: a's +128 adds 128 x b's column sums to every product: a row of ones, in the group's first
// tile (the one that reads b from memory), gives the sums (block() has how). At avx2, |a| times b
// with a's sign, vpmaddubsw (u8 x s8 pairs into 16 bits) and vpmaddwd by ones: exact for every b
// but -128 (which int8 layers' symmetric weights never hold): the first tile of each group checks,
// and a task whose weight holds it runs the plain loop instead. The threads split the column groups
// (and the rows, when there are fewer groups than threads, or enough rows for a few tasks a thread:
// packed_gemm).
// With AMX (a CPU with AMX-INT8 whose OS grants the tile state, at the VNNI level: Host::int8_amx),
// the rows in whole 16-row blocks run on the tiles instead: the layout is AMX's own for B (a tile of
// 16 k-groups x 16 columns x 4 bytes is 16 consecutive k-groups of a panel, rows 64 bytes apart), a
// tile of A is 16 rows of a read where they lie, and tdpbssd multiplies s8 x s8 into int32 exactly,
// so nothing is packed or shifted per call; the last m % 16 rows, and k not a multiple of 64, take
// the vector scheme above (amx_gemm).
// Other levels: the plain loop over the layout, exact, for models whose weight was packed elsewhere;
// the layout choice (fastbert.ops.int8.int8_layout) measures the packed GEMM against the other paths.
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

constexpr int64_t kPanel = 16;      // columns of a panel
constexpr int64_t kGroupK = 4;      // k-values a 32-bit lane holds
constexpr int64_t kPanelVec = kPanel * kGroupK;  // bytes of one k-group of a panel
constexpr int kSlotRows = 62;       // vec::thread_buffer slots: a's rows as u8,
constexpr int kSlotStart = 63;      // and the accumulators' start of the task's columns

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The plain loop, every level: c's rows [m0, m1) x panels [p0, p1), 16 int32 sums a panel and row.
void plain_block(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t k, int64_t m0,
                 int64_t m1, int64_t p0, int64_t p1) {
  const int64_t kq = ceil_div(k, kGroupK), full = k / kGroupK, ps = kq * kPanelVec;
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* b = bp + p * ps;
    for (int64_t r = m0; r < m1; ++r) {
      const int8_t* x = a + r * lda;
      int32_t acc[kPanel] = {};
      for (int64_t q = 0; q < full; ++q) {
        const int8_t* g = b + q * kPanelVec;
        const int32_t x0 = x[q * 4], x1 = x[q * 4 + 1], x2 = x[q * 4 + 2], x3 = x[q * 4 + 3];
        for (int64_t j = 0; j < kPanel; ++j) {
          acc[j] += x0 * g[j * 4] + x1 * g[j * 4 + 1] + x2 * g[j * 4 + 2] + x3 * g[j * 4 + 3];
        }
      }
      for (int64_t i = full * kGroupK; i < k; ++i) {  // the last, partial k-group
        const int8_t* g = b + full * kPanelVec + (i - full * kGroupK);
        for (int64_t j = 0; j < kPanel; ++j) acc[j] += static_cast<int32_t>(x[i]) * g[j * 4];
      }
      std::memcpy(c + r * ldc + p * kPanel, acc, sizeof(acc));
    }
  }
}

#if defined(FASTBERT_GEMM_VNNI) || defined(FASTBERT_GEMM_SIGNS)
// int8_gemm_schemes.h's Quads with VNNI (vpdpbusd on a + 128), its Signs at avx2 (vpmaddubsw +
// vpmaddwd on |a| and b with a's sign, with the b != -128 check), and their tile: 8 x 3 zmm, or
// 6 x 2 ymm (one panel)
using namespace gemm8;  // NOLINT: the schemes and their vectors
#if defined(FASTBERT_GEMM_VNNI)
using Scheme = Quads;
#else
using Scheme = Signs;
#endif
using V = Vi;

// a as the scheme reads it, for kW * 4 values: a + 128 as u8 (x ^ 0x80) with VNNI, else a itself
inline V flip(V x) {
  if constexpr (!Scheme::kColSums) return x;
#if defined(FASTBERT_VEC_AVX512)
  return _mm512_xor_si512(x, _mm512_set1_epi8(static_cast<char>(0x80)));
#else
  return _mm256_xor_si256(x, _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
}
constexpr int kMr = Scheme::kMr;
constexpr int kVecsPerPanel = kPanel / kW;
constexpr int kGroupPanels = Scheme::kNv / kVecsPerPanel;  // panels of a column group: the tile's width
constexpr int kGroupCols = kGroupPanels * kPanel;
constexpr int64_t kMc = 128;  // rows of a packed at a time

// The next column group's lines of b, prefetched a few at each k-group of a tile, so that the
// memory's stream runs behind every tile of a group, not only behind the first one (which reads b
// from memory; the others find it in cache).
struct Ahead {
  const int8_t* line;  // the next line to prefetch
  int64_t left;        // lines of this tile's share left
  int64_t each;        // lines a k-group
};

// c [M rows, NV vectors of columns] = a (M packed u8 rows, stride lda) . the group's panels of b
// (panel stride ps) over kq k-groups, the accumulators starting at start [NV * kW]. kTrack: also
// returns whether b holds a value the scheme is not exact for (the group's first tile).
template <int M, int NV, bool kTrack>
bool tile(int64_t kq, const uint8_t* a, int64_t lda, const int8_t* b, int64_t ps, const int32_t* start, int32_t* c,
          int64_t ldc, Ahead ahead) {
  V acc[M][NV];
  V most = vzero();
#pragma GCC unroll 3
  for (int v = 0; v < NV; ++v) {
    const V s = vload(start + v * kW);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) acc[r][v] = s;
  }
  for (int64_t q = 0; q < kq; ++q) {
    for (int64_t t = std::min(ahead.each, ahead.left); t > 0; --t, --ahead.left, ahead.line += 64) {
      __builtin_prefetch(ahead.line);
    }
    V bv[NV];
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      bv[v] = vload(b + (v / kVecsPerPanel) * ps + q * kPanelVec + (v % kVecsPerPanel) * kW * 4);
      if constexpr (kTrack) most = Scheme::track(most, bv[v]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      int32_t unit;
      std::memcpy(&unit, a + r * lda + q * kGroupK, sizeof(unit));
      const V av = vset1(unit);
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) acc[r][v] = Scheme::dot(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < M; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * kW, acc[r][v]);
  }
  return !(kTrack && Scheme::exceeds(most, 0));
}

using Tile = bool (*)(int64_t, const uint8_t*, int64_t, const int8_t*, int64_t, const int32_t*, int32_t*, int64_t,
                     Ahead);

template <int P, bool kTrack, int... I>
constexpr std::array<Tile, sizeof...(I)> tiles_of(std::integer_sequence<int, I...>) {
  return {&tile<I + 1, P * kVecsPerPanel, kTrack>...};
}
template <bool kTrack, int... P>
constexpr std::array<std::array<Tile, kMr>, sizeof...(P)> tiles_by_panels(std::integer_sequence<int, P...>) {
  return {tiles_of<P + 1, kTrack>(std::make_integer_sequence<int, kMr>{})...};
}
// kTiles[first][panels - 1][M - 1] = tile<M, panels x kVecsPerPanel, first>
constexpr std::array<std::array<std::array<Tile, kMr>, kGroupPanels>, 2> kTiles = {
    tiles_by_panels<false>(std::make_integer_sequence<int, kGroupPanels>{}),
    tiles_by_panels<true>(std::make_integer_sequence<int, kGroupPanels>{})};

// rows [m0, m1) x panels [p0, p1) of c on the calling thread; false (c's block partly written) when
// b holds a value the scheme is not exact for. With VNNI (a + 128), the first row block's packed
// rows start with a row of ones (u8 1): the first tile of each column group, the one that reads b
// from memory, gives b's column sums with its rows, at no pass of their own over b; its real rows
// are then moved to c less 128 x the sums, where the group's other tiles start their accumulators.
// At avx2 (a as it is) every tile starts at zero, and the first one only checks b.
bool block(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t k, int64_t m0, int64_t m1,
           int64_t p0, int64_t p1) {
  const int64_t kq = ceil_div(k, kGroupK), kp = kq * kGroupK, ps = kq * kPanelVec;
  uint8_t* ap = vec::thread_buffer<uint8_t, kSlotRows>((kMc + 1) * kp);
  int32_t* start = vec::thread_buffer<int32_t, kSlotStart>((p1 - p0) * kPanel + kMr * kGroupCols + kGroupCols);
  int32_t* first = start + (p1 - p0) * kPanel;  // the first tile's rows [kMr][kGroupCols]
  int32_t* zeros = first + kMr * kGroupCols;
  std::fill(zeros, zeros + kGroupCols, 0);
  constexpr int64_t kVecBytes = kW * 4;
  for (int64_t ic = m0; ic < m1; ic += kMc) {
    const int64_t mb = std::min(kMc, m1 - ic), ones = Scheme::kColSums && ic == m0 ? 1 : 0, rows = mb + ones;
    if (ones) std::fill(ap, ap + kp, uint8_t{1});
    for (int64_t r = 0; r < mb; ++r) {  // a as the scheme reads it, k padded with what b's zeros ignore
      const int8_t* src = a + (ic + r) * lda;
      uint8_t* dst = ap + (r + ones) * kp;
      int64_t i = 0;
      for (; i + kVecBytes <= k; i += kVecBytes) vstore(dst + i, flip(vload(src + i)));
      for (; i < k; ++i) dst[i] = Scheme::to_a(src[i]);
      for (; i < kp; ++i) dst[i] = 0;
    }
    for (int64_t pg = p0; pg < p1; pg += kGroupPanels) {
      const int np = static_cast<int>(std::min<int64_t>(kGroupPanels, p1 - pg));
      const int64_t cols = np * kPanel;
      const int8_t* b = bp + pg * ps;
      int32_t* st = start + (pg - p0) * kPanel;
      int32_t* cg = c + ic * ldc + pg * kPanel;  // c's row ic, this group's first column
      // the next group's panels (contiguous after this group's), a share for each tile of this one
      const int64_t lines = std::min<int64_t>(kGroupPanels, p1 - pg - np) * ps / 64, tiles = ceil_div(rows, kMr);
      const auto ahead = [&](int64_t ir) {
        const int64_t t = ir / kMr, l0 = lines * t / tiles, l1 = lines * (t + 1) / tiles;
        return Ahead{b + np * ps + l0 * 64, l1 - l0, ceil_div(l1 - l0, kq)};
      };
      int64_t ir = 0;  // packed row
      if (!Scheme::kColSums && ic == m0) {  // the first tile checks b, from zero
        const int64_t mr = std::min<int64_t>(kMr, rows);
        if (!kTiles[1][np - 1][mr - 1](kq, ap, kp, b, ps, zeros, cg, ldc, ahead(0))) return false;
        ir = mr;
      } else if (ones) {
        const int64_t mr = std::min<int64_t>(kMr, rows);
        if (!kTiles[1][np - 1][mr - 1](kq, ap, kp, b, ps, zeros, first, kGroupCols, ahead(0))) return false;
        for (int64_t j = 0; j < cols; ++j) st[j] = -128 * first[j];
        for (int64_t r = 1; r < mr; ++r) {
          for (int64_t j = 0; j < cols; ++j) cg[(r - 1) * ldc + j] = first[r * kGroupCols + j] + st[j];
        }
        ir = mr;
      }
      for (; ir < rows; ir += kMr) {
        const int64_t mr = std::min<int64_t>(kMr, rows - ir);
        kTiles[0][np - 1][mr - 1](kq, ap + ir * kp, kp, b, ps, Scheme::kColSums ? st : zeros, cg + (ir - ones) * ldc,
                                  ldc, ahead(ir));
      }
    }
  }
  return true;
}

// The tasks: column ranges (tn, whole groups) times row ranges (tm, whole tiles). One task a thread
// when the rows are few; with more rows, up to kClaimsPerThread a thread, of kMinTaskTiles tiles or
// more, claimed in turn (for_each_claimed), so that a thread the scheduler holds up does fewer.
void vector_gemm(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t m, int64_t n,
                 int64_t k) {
  constexpr int64_t kGp = kGroupPanels, kMinTaskTiles = 4;
  const int64_t panels = n / kPanel, groups = ceil_div(panels, kGp), tiles = ceil_div(m, kMr);
  const int64_t threads = std::max<int64_t>(1, num_threads());
  const int64_t tn = std::min(threads, groups);
  const int64_t claimed =
      threads > 1 ? std::min(tiles / kMinTaskTiles, ceil_div(threads * kClaimsPerThread, tn)) : 0;
  const int64_t tm = std::max({int64_t{1}, std::min(threads / tn, tiles), claimed});
  const auto task = [&](int64_t t) {
    const int64_t i = t / tn, j = t % tn;
    const int64_t m0 = std::min(m, tiles * i / tm * kMr), m1 = std::min(m, tiles * (i + 1) / tm * kMr);
    const int64_t p0 = std::min(panels, groups * j / tn * kGp), p1 = std::min(panels, groups * (j + 1) / tn * kGp);
    if (m0 < m1 && p0 < p1 && !block(a, lda, bp, c, ldc, k, m0, m1, p0, p1)) {
      plain_block(a, lda, bp, c, ldc, k, m0, m1, p0, p1);
    }
  };
  for_each_claimed(tm * tn, task);  // at most tm x tn workers: one task each when there are no more
}

#if defined(FASTBERT_GEMM_VNNI) && defined(__x86_64__) && defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 11)
#define FASTBERT_GEMM_AMX 1
constexpr int64_t kAmxRows = 16;         // rows of a tile
constexpr int64_t kAmxK = 64;            // k-values of a tile of A (16 k-groups of B)
constexpr int64_t kAmxChunkRows = 256;   // rows of a that a task takes at a time (256 x 3,072 bytes stay in L2)

// The tile registers: c in tmm0..3 (row block r, panel p at 2r + p), a's two row blocks in tmm4, 5,
// b's two panels in tmm6, 7; each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// c's rows [r, r + 16 R) x panels [p, p + P) (R, P: 1 or 2) over k / 64 steps of tiles.
template <int R, int P>
__attribute__((target("amx-tile,amx-int8"))) void amx_block(const int8_t* a, int64_t lda, const int8_t* b, int64_t ps,
                                                             int32_t* c, int64_t ldc, int64_t k) {
  _tile_zero(0);
  if constexpr (P == 2) _tile_zero(1);
  if constexpr (R == 2) _tile_zero(2);
  if constexpr (R == 2 && P == 2) _tile_zero(3);
  for (int64_t kk = 0; kk < k; kk += kAmxK) {
    const int8_t* bk = b + kk / kGroupK * kPanelVec;
    _tile_loadd(4, a + kk, lda);
    _tile_loadd(6, bk, kPanelVec);
    if constexpr (P == 2) _tile_loadd(7, bk + ps, kPanelVec);
    if constexpr (R == 2) _tile_loadd(5, a + kAmxRows * lda + kk, lda);
    _tile_dpbssd(0, 4, 6);
    if constexpr (P == 2) _tile_dpbssd(1, 4, 7);
    if constexpr (R == 2) _tile_dpbssd(2, 5, 6);
    if constexpr (R == 2 && P == 2) _tile_dpbssd(3, 5, 7);
  }
  const int64_t stride = ldc * static_cast<int64_t>(sizeof(int32_t));  // c's rows, in bytes
  _tile_stored(0, c, stride);
  if constexpr (P == 2) _tile_stored(1, c + kPanel, stride);
  if constexpr (R == 2) _tile_stored(2, c + kAmxRows * ldc, stride);
  if constexpr (R == 2 && P == 2) _tile_stored(3, c + kAmxRows * ldc + kPanel, stride);
}

// Rows [m0, m1) (whole 16-row blocks) x panels [p0, p1) on the tiles, on the calling thread: per
// chunk of rows, per pair of panels (their b read from L2 for every row block of the chunk), the
// row blocks in pairs.
__attribute__((target("amx-tile,amx-int8"))) void amx_task(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c,
                                                            int64_t ldc, int64_t k, int64_t m0, int64_t m1,
                                                            int64_t p0, int64_t p1) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kAmxRows;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const int64_t ps = ceil_div(k, kGroupK) * kPanelVec;
  for (int64_t ic = m0; ic < m1; ic += kAmxChunkRows) {
    const int64_t ie = std::min(m1, ic + kAmxChunkRows);
    for (int64_t p = p0; p < p1; p += 2) {
      const int8_t* b = bp + p * ps;
      int32_t* cp = c + p * kPanel;
      const bool two = p + 1 < p1;
      int64_t r = ic;
      for (; r + 2 * kAmxRows <= ie; r += 2 * kAmxRows) {
        if (two) {
          amx_block<2, 2>(a + r * lda, lda, b, ps, cp + r * ldc, ldc, k);
        } else {
          amx_block<2, 1>(a + r * lda, lda, b, ps, cp + r * ldc, ldc, k);
        }
      }
      if (r < ie) {
        if (two) {
          amx_block<1, 2>(a + r * lda, lda, b, ps, cp + r * ldc, ldc, k);
        } else {
          amx_block<1, 1>(a + r * lda, lda, b, ps, cp + r * ldc, ldc, k);
        }
      }
    }
  }
  _tile_release();
}

// The rows in whole 16-row blocks on the tiles, the rest (fewer than 16) on vector_gemm. Tasks as
// vector_gemm's: column ranges (pairs of panels) times chunks of rows, claimed in turn.
void amx_gemm(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t m, int64_t n,
              int64_t k) {
  const int64_t whole = m / kAmxRows * kAmxRows, panels = n / kPanel, pairs = ceil_div(panels, 2);
  const int64_t threads = std::max<int64_t>(1, num_threads());
  const int64_t tn = std::min(threads, pairs);
  const int64_t blocks = whole / kAmxRows;
  const int64_t tm = std::max<int64_t>(1, std::min(blocks, ceil_div(threads * kClaimsPerThread, tn)));
  for_each_claimed(tm * tn, [&](int64_t t) {
    const int64_t i = t / tn, j = t % tn;
    const int64_t m0 = blocks * i / tm * kAmxRows, m1 = blocks * (i + 1) / tm * kAmxRows;
    const int64_t p0 = std::min(panels, pairs * j / tn * 2), p1 = std::min(panels, pairs * (j + 1) / tn * 2);
    if (m0 < m1 && p0 < p1) amx_task(a, lda, bp, c, ldc, k, m0, m1, p0, p1);
  });
  if (whole < m) vector_gemm(a + whole * lda, lda, bp, c + whole * ldc, ldc, m - whole, n, k);
}
#endif

void packed_gemm(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t m, int64_t n,
                 int64_t k) {
#if defined(FASTBERT_GEMM_AMX)
  if (m >= kAmxRows && k % kAmxK == 0 && host().int8_amx()) {  // the host always lends the switch (ABI 7)
    return amx_gemm(a, lda, bp, c, ldc, m, n, k);
  }
#endif
  vector_gemm(a, lda, bp, c, ldc, m, n, k);
}
#else
void packed_gemm(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t m, int64_t n,
                 int64_t k) {
  parallel_for(0, n / kPanel, 1, [&](int64_t p0, int64_t p1) { plain_block(a, lda, bp, c, ldc, k, 0, m, p0, p1); });
}
#endif

}  // namespace

void int8_gemm_packed(const int8_t* a, int64_t lda, const int8_t* bp, int32_t* c, int64_t ldc, int64_t m, int64_t n,
                      int64_t k) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(int32_t) * static_cast<size_t>(n));
    return;
  }
  packed_gemm(a, lda, bp, c, ldc, m, n, k);
}

}  // namespace kernels
}  // namespace fastbert
