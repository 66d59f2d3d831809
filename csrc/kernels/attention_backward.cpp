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
void probabilities_block(const Problem& pb, const Seq& sq, uint64_t pair, int64_t j0, int64_t n, int64_t lp,
                         const float* nlse, float* pt, float* dpt, float* kst, float* psum, float* dsum,
                         bool accumulate) {
  const Vf scale = vec::set1(pb.scale);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t j = j0 + r;
    float* prow = pt + r * lp;
    float* drow = dpt + r * lp;
    if (sq.real != nullptr && !sq.real[j]) {  // a hole key: no weight, no gradient
      std::fill(prow, prow + lp, 0.0f);
      std::fill(drow, drow + lp, 0.0f);
      if constexpr (kDropout) std::fill(kst + r * lp, kst + (r + 1) * lp, 0.0f);
      continue;
    }
    for (int64_t i = 0; i < lp; i += W) {
      const Vf p = vec::vexp_or_zero(vec::fmadd(vec::load(prow + i), scale, vec::load(nlse + i)));
      Vf dp = vec::load(drow + i);
      if constexpr (kDropout) {
        // probability (query i + lane, key j): counter pair + (i + lane) * 2^16 + j
        const Vf ks = philox::keep_scale_step(pair + (static_cast<uint64_t>(i) << 16) + static_cast<uint64_t>(j),
                                              uint64_t{1} << 16, pb.keys, pb.thresh, pb.keep);
        vec::store(kst + r * lp + i, ks);
        dp = dp * ks;
      }
      vec::store(prow + i, p);
      vec::store(drow + i, dp);
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
template <bool kDropout>
inline void gradient_block(float* pt, float* dpt, const float* kst, const float* psum, const float* dsum, int64_t n,
                           int64_t lp, Vf scale) {
  for (int64_t r = 0; r < n; ++r) {
    float* prow = pt + r * lp;
    float* drow = dpt + r * lp;
    for (int64_t i = 0; i < lp; i += W) {
      const Vf p = vec::load(prow + i) * vec::load(psum + i);
      vec::store(drow + i, p * (vec::load(drow + i) - vec::load(dsum + i)) * scale);
      vec::store(prow + i, kDropout ? p * vec::load(kst + r * lp + i) : p);
    }
  }
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
  const int64_t nb = lp <= kOneBlockLen ? len : std::min(block_rows(lp), len);
  const bool one_block = nb == len;
  const int64_t rows = std::is_same_v<T, float> ? 0 : len * d;
  const int64_t qkrows = pb.rope() ? len * d : rows;  // q and k: rotated, or converted, fp32 rows
  float* buf = vec::thread_buffer<float, kSlotAttention>(arena_size(
      {len * d, lp, lp, lp, nb * lp, nb * lp, kDropout ? nb * lp : 0, nb * d, nb * d, qkrows, qkrows, rows, rows}));
  Arena arena{buf};
  float* dqa = arena.take(len * d);  // dQ accumulated over key blocks [len, d]
  float* nlse = arena.take(lp);      // -lse, -inf at padded queries
  float* psum = arena.take(lp);      // sum_j P_ij, then its inverse
  float* dsum = arena.take(lp);      // D_i
  float* pt = arena.take(nb * lp);   // S^T, then P^T, then normalised with dropout [nb, lp]
  float* dpt = arena.take(nb * lp);  // dP^T, then with dropout, then dS^T * scale [nb, lp]
  float* kst = kDropout ? arena.take(nb * lp) : nullptr;  // keep / (1 - p) [nb, lp]
  float* dkb = arena.take(nb * d);
  float* dvb = arena.take(nb * d);
  int64_t ldq = d, ldk = d, ldv, lddo;
  const int64_t pos0 = pb.first_position(sq);
  float* qbuf = arena.take(qkrows);
  float* kbuf = arena.take(qkrows);
  const float* qr = qbuf;
  const float* kr = kbuf;
  if (pb.rope()) {  // the scores of the rotated q and k; their gradients are rotated back below
    rotate_rows(q.at(b, h, sq.first), q.sr, len, d, pb, pos0, 1.0f, qbuf);
    rotate_rows(k.at(b, h, sq.first), k.sr, len, d, pb, pos0, 1.0f, kbuf);
  } else {
    qr = fp32_rows(q.at(b, h, sq.first), q.sr, len, d, qbuf, ldq);
    kr = fp32_rows(k.at(b, h, sq.first), k.sr, len, d, kbuf, ldk);
  }
  const float* vr = fp32_rows(v.at(b, h, sq.first), v.sr, len, d, arena.take(rows), ldv);
  const float* dor = fp32_rows(dout.at(b, h, sq.first), dout.sr, len, d, arena.take(rows), lddo);
  for (int64_t i = 0; i < lp; ++i) {
    const bool real = i < len && (sq.real == nullptr || sq.real[i]);
    nlse[i] = real ? -*pb.lse.at(b, h, sq.first + i) : -kInf;
    psum[i] = 0.0f;
    dsum[i] = 0.0f;
  }
  const uint64_t pair = pb.counter(b, h);
  auto scores = [&](int64_t j0, int64_t n) {
    gemm(false, true, n, len, d, kr + j0 * ldk, ldk, qr, ldq, pt, lp, false);    // S^T = K Q^T
    gemm(false, true, n, len, d, vr + j0 * ldv, ldv, dor, lddo, dpt, lp, false);  // dP^T = V dO^T
    for (int64_t r = 0; r < n; ++r) {  // padding columns (the GEMMs leave them unwritten)
      std::fill(pt + r * lp + len, pt + (r + 1) * lp, 0.0f);
      std::fill(dpt + r * lp + len, dpt + (r + 1) * lp, 0.0f);
    }
  };
  if (!one_block) {
    for (int64_t j0 = 0; j0 < len; j0 += nb) {
      const int64_t n = std::min(nb, len - j0);
      scores(j0, n);
      probabilities_block<kDropout>(pb, sq, pair, j0, n, lp, nlse, pt, dpt, kst, psum, dsum, true);
    }
    finish_sums(psum, dsum, lp);
  }
  const Vf scale = vec::set1(pb.scale);
  for (int64_t j0 = 0; j0 < len; j0 += nb) {
    const int64_t n = std::min(nb, len - j0);
    scores(j0, n);
    probabilities_block<kDropout>(pb, sq, pair, j0, n, lp, nlse, pt, dpt, kst, psum, dsum, one_block);
    if (one_block) finish_sums(psum, dsum, lp);
    gradient_block<kDropout>(pt, dpt, kst, psum, dsum, n, lp, scale);
    gemm(false, false, n, d, len, pt, lp, dor, lddo, dvb, d, false);             // dV = P^T dO
    gemm(false, false, n, d, len, dpt, lp, qr, ldq, dkb, d, false);             // dK = dS^T Q
    gemm(true, false, len, d, n, dpt, lp, kr + j0 * ldk, ldk, dqa, d, j0 > 0);  // dQ += dS K
    if (pb.rope()) rotate_rows(static_cast<const float*>(dkb), d, n, d, pb, pos0 + j0, -1.0f, dkb);
    put_key_rows(pb, dk, dv, b, h, sq.first + j0, dkb, dvb, n);
  }
  if (pb.rope()) rotate_rows(static_cast<const float*>(dqa), d, len, d, pb, pos0, -1.0f, dqa);
  put_query_rows(pb, dq, b, h, sq.first, dqa, len);
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
