// The backward of the CPU attention, one (sequence, head) pair at a time (attention.cpp has the
// design and the entry points, attention_common.h the code shared with the forward).
//
// Backward of one pair, per block of key rows, in the transposed orientation (a key per row, the
// queries along the vectors, so that dropout and D broadcast along the rows):
//   S^T = K Q^T, dP^T = V dO^T       GEMMs
//   P^T = exp(S^T * scale - lse)     lse = +inf for padded queries: their column is exactly 0;
//                                    then P_ij /= sum_j P_ij (see backward_pair)
//   D_i = sum_j P_ij dP_ij keep/(1-p)
//   dS^T = P^T * (dP^T keep/(1-p) - D) * scale
//   dV = (P keep/(1-p))^T dO, dK = dS^T Q        GEMMs
//   dQ += dS K                       GEMM accumulated over key blocks in a fixed order
// DeBERTa's terms (S += c2p + p2c, read by distance) are remade as the forward makes them; dS is
// summed into their gradients by distance ([len, 2 len - 1] each), which give dK (per key block),
// dQ and the position tables' gradients of the pair (GEMMs).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention_common.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace attn {
namespace {

constexpr int64_t kOneBlockLen = 256;  // backward: sequences up to this long take all keys in one block

// One block of key rows j0 .. j0 + n of the backward, from its score and dP^T GEMM outputs:
// pt[r, i] <- P[i, j0 + r] = exp(S * scale - lse), dpt[r, i] <- dP[i, j0 + r] * keep / (1 - p),
// kst[r, i] <- keep / (1 - p) (dropout only); when `accumulate`, psum[i] += P and dsum[i] += P dP.
template <bool kDropout>
void probabilities_block(const Problem& pb, const Seq& sq, uint64_t pair, int64_t j0, int64_t n, int64_t qa,
                         int64_t nqp, int64_t ld, const float* nlse, const float* rel, float* pt, float* dpt,
                         float* kst, float* psum, float* dsum, bool accumulate) {
  const Vf scale = vec::set1(pb.scale);
  const int64_t lp = vec::round_up(sq.len, W);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t j = j0 + r;
    const float* rel_row = rel != nullptr ? rel + (lp - 1 - j) + qa : nullptr;
    float* prow = pt + r * ld;
    float* drow = dpt + r * ld;
    if (sq.real != nullptr && !sq.real[j]) {  // a hole key: no weight, no gradient
      std::fill(prow, prow + nqp, 0.0f);
      std::fill(drow, drow + nqp, 0.0f);
      if constexpr (kDropout) std::fill(kst + r * ld, kst + r * ld + nqp, 0.0f);
      continue;
    }
    for (int64_t c = 0; c < nqp; c += W) {
      const int64_t i = qa + c;  // the query of column c
      Vf t = vec::fmadd(vec::load(prow + c), scale, vec::load(nlse + i));
      if (rel_row != nullptr) t = t + vec::load(rel_row + c);
      const Vf p = vec::vexp_or_zero(t);
      Vf dp = vec::load(drow + c);
      if constexpr (kDropout) {
        // probability (query i + lane, key j): counter pair + (i + lane) * 2^16 + j
        const Vf ks = philox::keep_scale_step(pair + (static_cast<uint64_t>(i) << 16) + static_cast<uint64_t>(j),
                                              uint64_t{1} << 16, pb.keys, pb.thresh, pb.keep);
        vec::store(kst + r * ld + c, ks);
        dp = dp * ks;
      }
      vec::store(prow + c, p);
      vec::store(drow + c, dp);
      if (accumulate) {
        vec::store(psum + i, vec::load(psum + i) + p);
        vec::store(dsum + i, vec::fmadd(p, dp, vec::load(dsum + i)));
      }
    }
  }
}

// The row sums of P and P dP over every key -> psum[i] <- 1 / sum_j P_ij (0 at padded queries),
// dsum[i] <- D_i of the normalised P.
inline void finish_sums(float* psum, float* dsum, int64_t lp) {
  for (int64_t i = 0; i < lp; ++i) {
    const float r = psum[i] > 0.0f ? 1.0f / psum[i] : 0.0f;
    psum[i] = r;
    dsum[i] *= r;
  }
}

// One block of n key rows after probabilities_block, in place: P^T is normalised by its row sums
// (psum holds their inverses), then dpt <- dS^T * scale = P^T * (dP^T - D) * scale and pt <- P^T with
// dropout (times kst = keep / (1 - p)), the two left operands of the block's gradient GEMMs.
// With a relative bias, racc (laid out as fill_relative's for key rows, rows j0 .. j0 + n, columns
// from query qa) gains each score's gradient dS, the bias's gradient summed along its distance.
template <bool kDropout>
inline void gradient_block(float* pt, float* dpt, const float* kst, const float* psum, const float* dsum, int64_t n,
                           int64_t nqp, int64_t ld, Vf scale, float* racc, int64_t lp, int64_t j0, int64_t qa) {
  for (int64_t r = 0; r < n; ++r) {
    float* prow = pt + r * ld;
    float* drow = dpt + r * ld;
    float* grow = racc != nullptr ? racc + (lp - 1 - (j0 + r)) + qa : nullptr;
    for (int64_t i = 0; i < nqp; i += W) {
      const Vf p = vec::load(prow + i) * vec::load(psum + i);
      const Vf ds = p * (vec::load(drow + i) - vec::load(dsum + i));
      vec::store(drow + i, ds * scale);
      vec::store(prow + i, kDropout ? p * vec::load(kst + r * ld + i) : p);
      if (grow != nullptr) vec::store(grow + i, vec::load(grow + i) + ds);
    }
  }
}

// The relative bias gradient of pair (b, h) from racc (gradient_block's) into pb.rel_grad.
inline void put_relative_grad(const Problem& pb, int64_t b, int64_t h, int64_t len, int64_t lp, const float* racc) {
  float* g = pb.rel_grad + (b * pb.heads + h) * (2 * pb.rel_n - 1) + pb.rel_n - 1;
  for (int64_t dist = -(len - 1); dist < len; ++dist) g[dist] = racc[lp - 1 - dist];
}

// Rows first .. first + n of dk and dv of (b, h) from the fp32 blocks dkb, dvb [n, d].
template <class T>
inline void put_key_rows(const Problem& pb, const Rows<T>& dk, const Rows<T>& dv, int64_t b, int64_t h, int64_t first,
                         const float* dkb, const float* dvb, int64_t n) {
  const int64_t d = pb.d;
  for (int64_t r = 0; r < n; ++r) {
    T* kd = dk.at(b, h, first + r);
    T* vd = dv.at(b, h, first + r);
    for (int64_t c = 0; c < d; c += W) {
      put_n(kd + c, load_n(dkb + r * d + c, d - c), d - c, pb.stream);
      put_n(vd + c, load_n(dvb + r * d + c, d - c), d - c, pb.stream);
    }
  }
}

// Rows first .. first + n of dq of (b, h) from the fp32 rows dqa [n, d].
template <class T>
inline void put_query_rows(const Problem& pb, const Rows<T>& dq, int64_t b, int64_t h, int64_t first, const float* dqa,
                           int64_t n) {
  const int64_t d = pb.d;
  for (int64_t i = 0; i < n; ++i) {
    T* qd = dq.at(b, h, first + i);
    for (int64_t c = 0; c < d; c += W) put_n(qd + c, load_n(dqa + i * d + c, d - c), d - c, pb.stream);
  }
}

// The backward's softmax is made consistent with itself: P is recomputed from the saved lse and
// then divided by its own row sum (the recomputed scores round differently from the forward's, so
// exp(S * scale - lse) sums to 1 only to a few ulps), and D_i = sum_j P_ij dP_ij (dropout applied)
// is taken from the same fp32 P and dP as dS, not as dO . O from the rounded output. Then
// sum_j dS_ij = 0 to fp32 rounding; with a single real key, dS vanishes to an ulp of P.
// The fp32 rows of one pair the backward reads: q and k (rotated when rotary), v and dO.
struct PairRows {
  const float *q, *k, *v, *dout;
  int64_t ldq, ldk, ldv, lddo;
};

template <class T>
PairRows pair_rows(const Problem& pb, const Rows<const T>& dout, const Rows<const T>& q, const Rows<const T>& k,
                   const Rows<const T>& v, int64_t b, int64_t h, Arena& arena, int64_t qkrows, int64_t rows) {
  const Seq& sq = pb.seqs[b];
  const int64_t len = sq.len, d = pb.d;
  PairRows pr{nullptr, nullptr, nullptr, nullptr, d, d, d, d};
  float* qbuf = arena.take(qkrows);
  float* kbuf = arena.take(qkrows);
  if (pb.rope()) {  // the scores of the rotated q and k; their gradients are rotated back at the end
    const int64_t pos0 = pb.first_position(sq);
    rotate_rows(q.at(b, h, sq.first), q.sr, len, d, pb, pos0, 1.0f, qbuf);
    rotate_rows(k.at(b, h, sq.first), k.sr, len, d, pb, pos0, 1.0f, kbuf);
    pr.q = qbuf, pr.k = kbuf;
  } else {
    pr.q = fp32_rows(q.at(b, h, sq.first), q.sr, len, d, qbuf, pr.ldq);
    pr.k = fp32_rows(k.at(b, h, sq.first), k.sr, len, d, kbuf, pr.ldk);
  }
  pr.v = fp32_rows(v.at(b, h, sq.first), v.sr, len, d, arena.take(rows), pr.ldv);
  pr.dout = fp32_rows(dout.at(b, h, sq.first), dout.sr, len, d, arena.take(rows), pr.lddo);
  return pr;
}

// The backward's softmax is made consistent with itself: P is recomputed from the saved lse and
// then divided by its own row sum (the recomputed scores round differently from the forward's, so
// exp(S * scale - lse) sums to 1 only to a few ulps), and D_i = sum_j P_ij dP_ij (dropout applied)
// is taken from the same fp32 P and dP as dS, not as dO . O from the rounded output. Then
// sum_j dS_ij = 0 to fp32 rounding; with a single real key, dS vanishes to an ulp of P.
// Local attention: a key block meets only the queries within the window of one of its keys (a span
// of block + 2 * window columns); the scores out of each key's own window are -inf, so P is 0 there.
template <class T, bool kDropout>
void backward_pair(const Problem& pb, const Rows<const T>& dout, const Rows<const T>& q, const Rows<const T>& k,
                   const Rows<const T>& v, const Rows<T>& dq, const Rows<T>& dk, const Rows<T>& dv, int64_t b,
                   int64_t h) {
  zero_outside<T>(pb, b, h, {dq, dk, dv}, false);
  const Seq& sq = pb.seqs[b];
  const int64_t len = sq.len, d = pb.d;
  if (len == 0) return;
  const int64_t lp = vec::round_up(len, W);
  // one block of every key when the [len, len] blocks stay cache-sized; longer sequences make a
  // first pass over the key blocks for D alone (the two score GEMMs once more)
  int64_t nb, ls;  // key rows per block, the stride of a block's rows of P^T
  block_shape(pb, len, lp, lp <= kOneBlockLen ? len : block_rows(lp), nb, ls);
  const bool one_block = nb == len;
  const int64_t rows = std::is_same_v<T, float> ? 0 : len * d;
  const int64_t qkrows = pb.rope() ? len * d : rows;  // q and k: rotated, or converted, fp32 rows
  const int64_t terms = len * terms_rows(pb, len);     // c2p, p2c and their gradients
  float* buf = vec::thread_buffer<float, kSlotAttention>(arena_size({len * d, lp + W, lp + W, lp + W, nb * ls,
      nb * ls, kDropout ? nb * ls : 0, nb * d, nb * d, qkrows, qkrows, rows, rows,
      pb.relative() ? relative_size(lp) : 0, pb.relative() ? relative_size(lp) : 0, terms, terms, terms, terms}));
  Arena arena{buf};
  float* dqa = arena.take(len * d);  // dQ accumulated over key blocks [len, d]
  float* nlse = arena.take(lp + W);  // -lse, -inf at padded queries and past the sequence
  float* psum = arena.take(lp + W);  // sum_j P_ij, then its inverse
  float* dsum = arena.take(lp + W);  // D_i
  float* pt = arena.take(nb * ls);   // S^T, then P^T, then normalised with dropout [nb, ls]
  float* dpt = arena.take(nb * ls);  // dP^T, then with dropout, then dS^T * scale [nb, ls]
  float* kst = kDropout ? arena.take(nb * ls) : nullptr;  // keep / (1 - p) [nb, ls]
  float* dkb = arena.take(nb * d);
  float* dvb = arena.take(nb * d);
  const PairRows pr = pair_rows(pb, dout, q, k, v, b, h, arena, qkrows, rows);
  for (int64_t i = 0; i < lp + W; ++i) {
    const bool real = i < len && (sq.real == nullptr || sq.real[i]);
    nlse[i] = real ? -*pb.lse.at(b, h, sq.first + i) : -kInf;
    psum[i] = 0.0f;
    dsum[i] = 0.0f;
  }
  if (pb.local()) std::fill(dqa, dqa + len * d, 0.0f);  // a key block adds to the rows of its span only
  float *rel = nullptr, *racc = nullptr;  // the relative bias by distance for key rows, its gradient
  if (pb.relative()) {
    rel = arena.take(relative_size(lp));
    racc = arena.take(relative_size(lp));
    fill_relative(pb, h, len, lp, -1, rel);
    std::fill(racc, racc + relative_size(lp), 0.0f);
  }
  float* c2p = arena.take(terms);
  float* p2c = arena.take(terms);
  float* dc2p = arena.take(terms);
  float* dp2c = arena.take(terms);
  const Terms tm = pair_terms(pb, h, len, pr.q, pr.ldq, pr.k, pr.ldk, false, c2p, p2c);
  std::fill(dc2p, dc2p + terms, 0.0f);
  std::fill(dp2c, dp2c + terms, 0.0f);
  const uint64_t pair = pb.counter(b, h);
  // S^T and dP^T of the key rows j0 .. j0 + n against the queries of their span (-inf out of windows)
  auto scores = [&](int64_t j0, int64_t n, const Span& qs) {
    const int64_t nq = qs.hi - qs.lo, nqp = vec::round_up(nq, W);
    gemm(false, true, n, nq, d, pr.k + j0 * pr.ldk, pr.ldk, pr.q + qs.lo * pr.ldq, pr.ldq, pt, ls, false);
    gemm(false, true, n, nq, d, pr.v + j0 * pr.ldv, pr.ldv, pr.dout + qs.lo * pr.lddo, pr.lddo, dpt, ls, false);
    for (int64_t r = 0; r < n; ++r) {  // columns past the span (the GEMMs leave them unwritten)
      const int64_t j = j0 + r;
      if (tm.on()) add_terms(tm, qs.lo, 1, j, 0, nq, pt + r * ls);
      if (pb.local()) {
        mask_outside(pt + r * ls, j - pb.window - qs.lo, std::min(j + pb.window + 1 - qs.lo, nq), nqp);
      } else {
        mask_outside(pt + r * ls, 0, nq, nqp);
      }
      std::fill(dpt + r * ls + nq, dpt + r * ls + nqp, 0.0f);
    }
    return nqp;
  };
  if (!one_block) {
    for (int64_t j0 = 0; j0 < len; j0 += nb) {
      const int64_t n = std::min(nb, len - j0);
      const Span qs = span_of(pb, j0, n, len);
      const int64_t nqp = scores(j0, n, qs);
      probabilities_block<kDropout>(pb, sq, pair, j0, n, qs.lo, nqp, ls, nlse, rel, pt, dpt, kst, psum, dsum, true);
    }
    finish_sums(psum, dsum, lp);
  }
  const Vf scale = vec::set1(pb.scale);
  for (int64_t j0 = 0; j0 < len; j0 += nb) {
    const int64_t n = std::min(nb, len - j0);
    const Span qs = span_of(pb, j0, n, len);
    const int64_t nq = qs.hi - qs.lo, nqp = scores(j0, n, qs);
    probabilities_block<kDropout>(pb, sq, pair, j0, n, qs.lo, nqp, ls, nlse, rel, pt, dpt, kst, psum, dsum,
                                  one_block);
    if (one_block) finish_sums(psum, dsum, lp);
    gradient_block<kDropout>(pt, dpt, kst, psum + qs.lo, dsum + qs.lo, n, nqp, ls, scale, racc, lp, j0, qs.lo);
    gemm(false, false, n, d, nq, pt, ls, pr.dout + qs.lo * pr.lddo, pr.lddo, dvb, d, false);  // dV = P^T dO
    gemm(false, false, n, d, nq, dpt, ls, pr.q + qs.lo * pr.ldq, pr.ldq, dkb, d, false);      // dK = dS^T Q
    if (tm.on()) {  // the terms' gradients (dpt: dS^T * scale, the unscaled sum's), dK += dp2c pos_query
      for (int64_t r = 0; r < n; ++r) add_term_grads(tm, qs.lo, j0 + r, nq, dpt + r * ls, dc2p, dp2c);
      if (tm.p2c != nullptr)
        gemm(false, false, n, d, tm.n, dp2c + j0 * tm.n, tm.n, pb.pos.query + (h * pb.pos.rows + tm.lo) * d, d, dkb, d,
             true);
    }
    gemm(true, false, nq, d, n, dpt, ls, pr.k + j0 * pr.ldk, pr.ldk, dqa + qs.lo * d, d,
         pb.local() || j0 > 0);  // dQ += dS K
    if (pb.rope()) rotate_rows(static_cast<const float*>(dkb), d, n, d, pb, pb.first_position(sq) + j0, -1.0f, dkb);
    put_key_rows(pb, dk, dv, b, h, sq.first + j0, dkb, dvb, n);
  }
  if (pb.rope()) rotate_rows(static_cast<const float*>(dqa), d, len, d, pb, pb.first_position(sq), -1.0f, dqa);
  if (tm.on()) {  // dQ += dc2p pos_key; the pair's position tables' gradients: dc2p^T Q, dp2c^T K
    const int64_t table = (h * pb.pos.rows + tm.lo) * d, grads = ((b * pb.heads + h) * pb.pos.rows + tm.lo) * d;
    if (tm.c2p != nullptr) {
      gemm(false, false, len, d, tm.n, dc2p, tm.n, pb.pos.key + table, d, dqa, d, true);
      gemm(true, false, tm.n, d, len, dc2p, tm.n, pr.q, pr.ldq, pb.pos.dkey + grads, d, false);
    }
    if (tm.p2c != nullptr) gemm(true, false, tm.n, d, len, dp2c, tm.n, pr.k, pr.ldk, pb.pos.dquery + grads, d, false);
  }
  put_query_rows(pb, dq, b, h, sq.first, dqa, len);
  if (pb.relative()) put_relative_grad(pb, b, h, len, lp, racc);
}

}  // namespace

template <class T>
void run_backward(const kernels::AttnArgs& a) {
  Problem pb = problem_of(a);
  const Rows<const T> gr = rows_of<const T>(a.dout), qr = rows_of<const T>(a.q), kr = rows_of<const T>(a.k),
                      vr = rows_of<const T>(a.v);
  const Rows<T> dqr = rows_of<T>(a.dq), dkr = rows_of<T>(a.dk), dvr = rows_of<T>(a.dv);
  const int64_t rows = a.rows * a.heads * (a.padded ? a.batch : 1);
  pb.stream = kernels::stream_output(dqr.base, rows, pb.d) && kernels::stream_output(dkr.base, rows, pb.d) &&
              kernels::stream_output(dvr.base, rows, pb.d);
  if (pb.dropout) {
    for_each_pair(pb, [&](int64_t b, int64_t h) {
      backward_pair<T, true>(pb, gr, qr, kr, vr, dqr, dkr, dvr, b, h);
    });
  } else {
    for_each_pair(pb, [&](int64_t b, int64_t h) {
      backward_pair<T, false>(pb, gr, qr, kr, vr, dqr, dkr, dvr, b, h);
    });
  }
}

template void run_backward<float>(const kernels::AttnArgs&);
template void run_backward<c10::Half>(const kernels::AttnArgs&);
template void run_backward<c10::BFloat16>(const kernels::AttnArgs&);

}  // namespace attn
}  // namespace fastbert
