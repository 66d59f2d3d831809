// What the forward (attention_forward.cpp) and the backward (attention_backward.cpp) of the CPU
// attention share: the problem and the rows of a (sequence, head) pair, the single-threaded BLAS
// GEMM, per-thread scratch, vector row helpers and the scheduler that hands out the pairs. The
// kernel entry points are in attention.cpp here, the checks and set-up in ../attention.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "common.h"
#include "philox.h"
#include "vec.h"

// GEMMs: the BLAS sgemm_ that at::native::cpublas::gemm uses for fp32 (MKL here; cpublas::gemm
// itself is not exported by libtorch_cpu), lent by the host (Host::sgemm), kept on one thread per
// pair. Measured against the other GEMM ATen exports, at::native::cpublas::brgemm (oneDNN's micro-kernel, JIT-compiled per
// shape and thread), on one core of the 2-core AVX-512 machine this was written on, per call at
// head_dim 64 (S = Q K^T and O = P V, lengths 16 to 128) and over the whole kernel forward and
// backward (32 x 12 heads x 128 x 64 fp32, lengths 16..128; K^T packed here, which beat letting
// sgemm transpose K): brgemm is a little faster, but every new shape adds a JIT kernel whose
// small, never-freed allocations land in freed large heap blocks: one pass over the sequence
// lengths 1..512 grew the process by 0.8 GB (forward) and 1.8 GB (backward) with brgemm, by 16 MB
// and 7 MB with sgemm, which keeps no per-shape state.

namespace fastbert {
namespace attn {

using vec::Vf;
constexpr int64_t W = vec::kWidth;
constexpr int kSlotAttention = 8;        // vec::thread_buffer slot of the per-pair scratch
constexpr int64_t kBlockElems = 32768;   // a block of scores: 128 KiB of fp32, L2-resident
constexpr int64_t kMinBlockRows = 128;   // ... but at least this many rows (block_rows)
constexpr float kInf = std::numeric_limits<float>::infinity();

// C[m, n] (= or +=) op(A) op(B), op(X) = X or X^T; fp32, row-major, leading dimensions in elements
// (op(A) is [m, k], op(B) is [k, n]). A row-major C is the column-major C^T = op(B)^T op(A)^T.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
  int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  kernels::host().sgemm(&opb, &opa, &mi, &ni, &ki, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

// The same product of bf16 operands (their bits), fp32 C (Host::bf16_gemm, which must be present).
inline void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
  const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  const float alpha = 1.0f, beta = 0.0f;
  kernels::host().bf16_gemm(&opb, &opa, &mi, &ni, &ki, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

// Keeps the BLAS on one thread for its lifetime: every pair is one thread's work, and a GEMM split
// over threads could round differently with the thread count.
struct SingleThreadedBlas {
  int prev = -1;
  SingleThreadedBlas() {
    if (kernels::host().blas_threads_local != nullptr) prev = kernels::host().blas_threads_local(1);
  }
  ~SingleThreadedBlas() {
    if (kernels::host().blas_threads_local != nullptr && prev >= 0) kernels::host().blas_threads_local(prev);
  }
};

// Rows of one head: row r (absolute: a position of the padded sequence, or a packed token) of head
// h of batch entry b starts at base + b * sb + h * sh + r * sr; the last dim is contiguous.
template <class T>
struct Rows {
  T* base;
  int64_t sb, sh, sr;
  T* at(int64_t b, int64_t h, int64_t r) const { return base + b * sb + h * sh + r * sr; }
};

template <class T>
Rows<T> rows_of(const kernels::AttnView& t) {
  return {static_cast<T*>(t.p), t.sb, t.sh, t.sr};
}

using Seq = kernels::AttnSeq;

struct Problem {
  int64_t batch = 0, heads = 0, d = 0;
  int64_t pad_rows = 0;  // padded layout: rows per (b, h) (those outside a sequence are zeroed); packed: 0
  float scale = 1.0f;
  bool dropout = false;
  philox::Keys keys;
  uint32_t thresh = 0;
  float keep = 1.0f;  // 1 / (1 - p)
  bool stream = false;  // outputs written with non-temporal stores (kernels::stream_output)
  const Seq* seqs = nullptr;  // [batch]
  Rows<float> lse{nullptr, 0, 0, 0};
  const float* rope_cos = nullptr;  // rotary tables [positions, d / 2], or nullptr
  const float* rope_sin = nullptr;

  int64_t window = -1;  // local attention: keys at most this many rows away; < 0: every key

  const float* rel_bias = nullptr;  // relative position bias [heads, 2 rel_n - 1], or nullptr
  int64_t rel_n = 0;
  float* rel_grad = nullptr;  // its gradient per pair [batch, heads, 2 rel_n - 1] (the backward's)

  kernels::AttnPositions pos;  // DeBERTa's disentangled terms (none: pos.on() false)
  int64_t bf16_min_len = -1;  // kernels::AttnArgs::bf16_min_len

  bool rope() const { return rope_cos != nullptr; }
  bool local() const { return window >= 0; }
  bool relative() const { return rel_bias != nullptr; }
  // the rotary position of row 0 of a pair's rows: its row index (padded), 0 (packed)
  int64_t first_position(const Seq& s) const { return pad_rows > 0 ? s.first : 0; }

  uint64_t counter(int64_t b, int64_t h) const {
    return static_cast<uint64_t>(b * heads + h) << 32;
  }
};

// Block rows for scores of `lp` columns: a multiple of 16 in [kMinBlockRows, 256], about kBlockElems
// in all. Each block's two GEMMs have the BLAS pack all of K^T (V) again, so a long sequence takes
// more rows than kBlockElems gives: at 2048 keys, blocks of 16 rows spent as long packing as
// multiplying (benchmarks/LOG.md, "Attention on long sequences").
inline int64_t block_rows(int64_t lp) {
  return std::clamp<int64_t>(kBlockElems / lp / 16 * 16, kMinBlockRows, 256);
}

// The rows [lo, hi) of the other side a block of rows [first, first + n) of a pair of `len` rows
// meets: every row, or (local attention, a symmetric window) those within the window of one of the
// block's rows. Query blocks get their keys this way, key blocks their queries.
struct Span {
  int64_t lo, hi;
};
inline Span span_of(const Problem& pb, int64_t first, int64_t n, int64_t len) {
  if (!pb.local()) return {0, len};
  return {std::max<int64_t>(0, first - pb.window), std::min(len, first + n + pb.window)};
}

// Rows per block and the stride of a block's score rows, for a pair of len rows (lp = len rounded up
// to whole vectors) whose blocks over every column would have `rows_full` rows: with local attention
// a block of m rows meets at most m + 2 * window others, so its blocks can be taller (as tall as
// blocks over that many columns) and stay cache-sized however long the sequence is.
inline void block_shape(const Problem& pb, int64_t len, int64_t lp, int64_t rows_full, int64_t& rows, int64_t& ld) {
  if (!pb.local()) {
    rows = std::min(rows_full, len);
    ld = lp;
    return;
  }
  const int64_t reach = std::min(lp, vec::round_up(2 * pb.window + 64, W));
  rows = std::min(std::max(rows_full, block_rows(reach)), len);
  ld = std::min(lp, vec::round_up(rows + 2 * pb.window, W));
}

// row[c] = -inf for the columns c of [0, cols) outside [c0, c1) (clipped to it): the scores of the
// keys (queries) out of a row's window, and the padding columns past the span.
inline void mask_outside(float* row, int64_t c0, int64_t c1, int64_t cols) {
  c0 = std::clamp<int64_t>(c0, 0, cols);
  c1 = std::clamp<int64_t>(c1, c0, cols);
  std::fill(row, row + c0, -kInf);
  std::fill(row + c1, row + cols, -kInf);
}

// A bump allocator over one thread's scratch; every piece starts on a 64-byte boundary.
struct Arena {
  float* p;
  float* take(int64_t n) {
    float* r = p;
    p += vec::round_up(n, 16);
    return r;
  }
};
inline int64_t arena_size(std::initializer_list<int64_t> sizes) {
  int64_t s = 0;
  for (int64_t n : sizes) s += vec::round_up(n, 16);
  return s;
}

template <class T>
inline Vf load_n(const T* p, int64_t n) {
  return n >= W ? vec::load(p) : vec::load_partial(p, n);
}
template <class T>
inline void store_n(T* p, Vf a, int64_t n) {
  if (n >= W)
    vec::store(p, a);
  else
    vec::store_partial(p, a, n);
}

// Output elements p[0, n) (n >= W: one whole vector, streamed when `stream`) from a.
template <class T>
inline void put_n(T* p, Vf a, int64_t n, bool stream) {
  if (n < W) {
    vec::store_partial(p, a, n);
  } else if (stream) {
    vec::stream(p, a);
  } else {
    vec::store(p, a);
  }
}

template <class T>
inline void zero_row(T* p, int64_t d) {
  std::fill(p, p + d, static_cast<T>(0.0f));
}

// dst[len, d] (row stride d) = fp32 of the rows src + j * ld
template <class T>
void convert_rows(const T* src, int64_t ld, int64_t len, int64_t d, float* dst) {
  for (int64_t j = 0; j < len; ++j)
    for (int64_t c = 0; c < d; c += W) store_n(dst + j * d + c, load_n(src + j * ld + c, d - c), d - c);
}

// dst[d, lp] = transpose of the fp32 of the rows src + j * ld (j < len); columns len .. lp (lp a
// multiple of W) are 0.
template <class T>
void pack_transposed(const T* src, int64_t ld, int64_t len, int64_t d, float* dst, int64_t lp) {
  Vf r[W];
  for (int64_t j0 = 0; j0 < lp; j0 += W) {
    for (int64_t c0 = 0; c0 < d; c0 += W) {
      const int64_t nc = std::min(W, d - c0);
      for (int64_t j = 0; j < W; ++j) r[j] = j0 + j < len ? load_n(src + (j0 + j) * ld + c0, nc) : vec::set1(0.0f);
      vec::transpose(r);
      for (int64_t c = 0; c < nc; ++c) vec::store(dst + (c0 + c) * lp + j0, r[c]);
    }
  }
}

// dst[len, d] (row stride d) = the fp32 rows src + j * ld rotated by the angles of positions
// pos0 + j (rotate-half convention, fastbert.reference.rotary): with h = d / 2,
//   dst[i] = x[i] cos - x[i + h] sin,  dst[i + h] = x[i + h] cos + x[i] sin       (sign = +1)
// and sign = -1 rotates back (the transpose, for the gradients). dst may be src (fp32, ld = d); U:
// fp32, or bf16 for the forward's bf16 products.
template <class T, class U = float>
void rotate_rows(const T* src, int64_t ld, int64_t len, int64_t d, const Problem& pb, int64_t pos0, float sign,
                 U* dst) {
  const int64_t h = d / 2;
  const Vf sg = vec::set1(sign);
  for (int64_t j = 0; j < len; ++j) {
    const T* x = src + j * ld;
    U* y = dst + j * d;
    const float* cs = pb.rope_cos + (pos0 + j) * h;
    const float* sn = pb.rope_sin + (pos0 + j) * h;
    for (int64_t c = 0; c < h; c += W) {
      const int64_t n = std::min(W, h - c);
      const Vf x1 = load_n(x + c, n), x2 = load_n(x + h + c, n);
      const Vf cv = load_n(cs + c, n), sv = load_n(sn + c, n) * sg;
      store_n(y + c, x1 * cv - x2 * sv, n);
      store_n(y + h + c, x2 * cv + x1 * sv, n);
    }
  }
}

// The relative bias of head h laid out for a pair's score rows (len rows, lp = len rounded up to
// whole vectors): dst[x], x in [0, relative_size(lp)), is the bias of the distance key - query =
// sign * (x - (lp - 1)), 0 past the sequence. The forward (sign +1, query rows) reads query i's
// row from dst + lp - 1 - i + key; the backward (sign -1, key rows) key j's from dst + lp - 1 - j + query.
inline int64_t relative_size(int64_t lp) { return 2 * lp + W; }
inline void fill_relative(const Problem& pb, int64_t h, int64_t len, int64_t lp, int64_t sign, float* dst) {
  const float* rel = pb.rel_bias + h * (2 * pb.rel_n - 1) + pb.rel_n - 1;
  for (int64_t x = 0; x < relative_size(lp); ++x) {
    const int64_t dist = sign * (x - (lp - 1));
    dst[x] = dist > -len && dist < len ? rel[dist] : 0.0f;
  }
}

// DeBERTa's disentangled terms of one pair of len rows: c2p[i, c] = q_i . pos_key[lo + c] and
// p2c[j, c] = k_j . pos_query[lo + c], [len, n] each (nullptr where the term is absent), over the rows
// [lo, lo + n) the pair's distances reach: pos.index is non-decreasing in the distance, so they run
// from the row of -(len - 1) to that of len - 1, at most 2 len - 1 however many rows the tables have.
// (query i, key j) reads column at[i - j] - lo of both; the products stay [len, 2 len - 1], never
// a [len, len] gather of them.
struct Terms {
  const float* c2p = nullptr;
  const float* p2c = nullptr;
  const int32_t* at = nullptr;  // pos.index + pos.n - 1: the row of distance i - j at at[i - j]
  int64_t lo = 0, n = 0;
  bool on() const { return c2p != nullptr || p2c != nullptr; }
};

// The rows a pair of len rows reaches (0 without the terms), for its arena.
inline int64_t terms_rows(const Problem& pb, int64_t len) {
  if (!pb.pos.on() || len == 0) return 0;
  const int32_t* at = pb.pos.index + pb.pos.n - 1;
  return at[len - 1] + 1 - at[-(len - 1)];
}

// The terms of head h's pair of len rows into c2p, p2c ([len, terms_rows] each; unused where the
// term is absent): q as fp32 rows (stride ldq), k as fp32 rows (stride ldk) or, k_transposed, as
// the packed K^T [d, ldk].
inline Terms pair_terms(const Problem& pb, int64_t h, int64_t len, const float* q, int64_t ldq, const float* k,
                        int64_t ldk, bool k_transposed, float* c2p, float* p2c) {
  Terms t;
  if (!pb.pos.on() || len == 0) return t;
  t.at = pb.pos.index + pb.pos.n - 1;
  t.lo = t.at[-(len - 1)];
  t.n = terms_rows(pb, len);
  const int64_t d = pb.d, table = h * pb.pos.rows * d + t.lo * d;
  if (pb.pos.key != nullptr) {
    gemm(false, true, len, t.n, d, q, ldq, pb.pos.key + table, d, c2p, t.n, false);
    t.c2p = c2p;
  }
  if (pb.pos.query != nullptr) {
    gemm(k_transposed, true, len, t.n, d, k, ldk, pb.pos.query + table, d, p2c, t.n, false);
    t.p2c = p2c;
  }
  return t;
}

// row[c] += the terms of (query i, key j) for the nc pairs (i, j) = (i0 + c * di, j0 + c * dj): a
// query's row of keys (di 0, dj 1) in the forward, a key's row of queries (di 1, dj 0) in the backward.
inline void add_terms(const Terms& t, int64_t i0, int64_t di, int64_t j0, int64_t dj, int64_t nc, float* row) {
  const float* c2p = t.c2p != nullptr ? t.c2p - t.lo : nullptr;
  const float* p2c = t.p2c != nullptr ? t.p2c - t.lo : nullptr;
  for (int64_t c = 0, i = i0, j = j0; c < nc; ++c, i += di, j += dj) {
    const int64_t r = t.at[i - j];
    float s = 0.0f;
    if (c2p != nullptr) s += c2p[i * t.n + r];
    if (p2c != nullptr) s += p2c[j * t.n + r];
    row[c] += s;
  }
}

// The terms' gradients from a key's row of score gradients: dc2p[i, c] and dp2c[j, c] ([len, t.n],
// laid out as the terms) += g[c'] for the queries i = i0 + c' (c' < nc) of key j.
inline void add_term_grads(const Terms& t, int64_t i0, int64_t j, int64_t nc, const float* g, float* dc2p,
                           float* dp2c) {
  float* gc = t.c2p != nullptr ? dc2p - t.lo : nullptr;
  float* gp = t.p2c != nullptr ? dp2c - t.lo + j * t.n : nullptr;
  for (int64_t c = 0, i = i0; c < nc; ++c, ++i) {
    const int64_t r = t.at[i - j];
    if (gc != nullptr) gc[i * t.n + r] += g[c];
    if (gp != nullptr) gp[r] += g[c];
  }
}

// Zeroes the rows of (b, h) outside its sequence (padded layout only) in each of `outs`, and the lse.
template <class T>
void zero_outside(const Problem& pb, int64_t b, int64_t h, std::initializer_list<Rows<T>> outs, bool lse) {
  if (pb.pad_rows == 0) return;
  const Seq& s = pb.seqs[b];
  auto clear = [&](int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    for (const Rows<T>& o : outs) {
      if (pb.stream && o.sr == pb.d) {  // contiguous rows of whole vectors
        T* p = o.at(b, h, r0);
        const Vf zero = vec::set1(0.0f);
        for (int64_t i = 0; i < (r1 - r0) * pb.d; i += W) vec::stream(p + i, zero);
      } else if (o.sr == pb.d) {  // contiguous rows: one fill
        std::memset(static_cast<void*>(o.at(b, h, r0)), 0, static_cast<size_t>((r1 - r0) * pb.d) * sizeof(T));
      } else {
        for (int64_t r = r0; r < r1; ++r) zero_row(o.at(b, h, r), pb.d);
      }
    }
    if (lse) std::fill(pb.lse.at(b, h, r0), pb.lse.at(b, h, r1), 0.0f);
  };
  clear(0, s.first);
  clear(s.first + s.len, pb.pad_rows);
}

// fp32 rows [len, d] of one pair: the input itself for fp32 (ld = its row stride), else a
// converted copy in `scratch` (ld = d).
template <class T>
inline const float* fp32_rows(const T* src, int64_t ld, int64_t len, int64_t d, float* scratch, int64_t& ld_out) {
  if constexpr (std::is_same_v<T, float>) {
    ld_out = ld;
    return src;
  } else {
    convert_rows(src, ld, len, d, scratch);
    ld_out = d;
    return scratch;
  }
}

// Runs f(b, h) for every pair, longest sequence first, from a shared counter in one parallel region.
template <class F>
void for_each_pair(const Problem& pb, F&& f) {
  const int64_t n = pb.batch * pb.heads;
  if (n == 0) return;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) {
    return pb.seqs[a / pb.heads].len > pb.seqs[c / pb.heads].len;
  });
  std::atomic<int64_t> next{0};
  // one worker per thread even when there are fewer pairs: every GEMM then runs inside the
  // parallel region, where the BLAS stays on its caller's thread
  const int64_t workers = std::max<int64_t>(1, kernels::num_threads());
  kernels::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    const SingleThreadedBlas one_thread;
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) {
      const int64_t pair = order[static_cast<size_t>(t)];
      f(pair / pb.heads, pair % pb.heads);
    }
    vec::stream_fence();
  });
}

// The problem of a call (kernels/attention_kernel.cpp).
Problem problem_of(const kernels::AttnArgs& a);

// Runs the forward (attention_forward.cpp) / backward (attention_backward.cpp) of every pair, for
// T = float, c10::Half or c10::BFloat16: the views of `a` (padded [batch, heads, seq, d] or packed
// [tokens, heads, d]) hold elements of type T.
template <class T>
void run_forward(const kernels::AttnArgs& a);
template <class T>
void run_backward(const kernels::AttnArgs& a);

}  // namespace attn
}  // namespace fastbert
