// The forward of the CPU attention, one (sequence, head) pair at a time (attention.cpp has the
// design and the entry points, attention_common.h the code shared with the backward).
//
// Forward of one pair, per block of query rows (all of them unless the sequence is long):
//   S = Q K^T                        GEMM, K^T packed once per pair (fp32, padded to whole vectors)
//   S += c2p + p2c                   DeBERTa's terms: their products with the position tables
//                                    [len, 2 len - 1] made once per pair, read by distance
//   t = S * scale + key bias         bias 0 for real keys, -inf for holes and the padding columns;
//                                    local attention: the block's keys are those within the window
//                                    of one of its rows (a span of block + 2 * window), the others
//                                    are never read, and -inf out of each row's own window
//   e = exp(t - max t), l = sum e    lse = max + log(l) saved for the backward
//   e *= keep / (1 - p)              dropout (fastbert's Philox rule, counters from the sequence start)
//   O = (e V) / l                    GEMM, then the row scale on the way out
//
// bf16 inputs, where the CPU multiplies bf16 natively, sequences of at least Problem::bf16_min_len
// tokens (not with DeBERTa's terms or a relative bias): both GEMMs on the BLAS's bf16 GEMM, which
// reads Q, K (transposed by the BLAS) and V where they lie (rotated into bf16 rows first when
// rotary), fp32 scores and softmax, e rounded to bf16 for the second product (as flash attention
// does on GPUs).
#include <algorithm>
#include <cmath>

#include "attention_common.h"
#include "philox.h"
#include "vec.h"

namespace fastbert {
namespace attn {
namespace {

// The softmax of one block's score rows s [m, ld] (queries i0 .. i0 + m, keys ka .. ka + nk of the
// pair) in place: DeBERTa's terms, scale, key bias, relative bias (rel: fill_relative's, or nullptr),
// the window, exp, dropout; rinv[r] = 1 / row sum, lse saved. e16 (or nullptr): the weights go there
// in bf16 ([m, ld] too) instead of back into s, for the bf16 product with V.
template <bool kDropout>
void softmax_rows(const Problem& pb, const Seq& sq, int64_t b, int64_t h, int64_t i0, int64_t m, int64_t ka,
                  int64_t nk, const float* bias, const float* rel, const Terms& terms, float* s, int64_t ld,
                  float* rinv, c10::BFloat16* e16 = nullptr) {
  const int64_t nkp = vec::round_up(nk, W), lp = vec::round_up(sq.len, W);
  const Vf scale = vec::set1(pb.scale);
  const uint64_t pair = pb.counter(b, h);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = i0 + r;
    float* row = s + r * ld;
    float* lse = pb.lse.at(b, h, sq.first + i);
    if (sq.real != nullptr && !sq.real[i]) {  // a hole: no output, no weight
      std::fill(row, row + nkp, 0.0f);
      if (e16 != nullptr) std::fill(e16 + r * ld, e16 + r * ld + nkp, c10::BFloat16(0.0f));
      rinv[r] = 0.0f;
      *lse = 0.0f;
      continue;
    }
    // keys past the span (the GEMM leaves them unwritten) and, local attention, out of the window
    if (pb.local()) {
      mask_outside(row, i - pb.window - ka, std::min(i + pb.window + 1 - ka, nk), nkp);
    } else {
      mask_outside(row, 0, nk, nkp);
    }
    if (terms.on()) add_terms(terms, i, 0, ka, 1, nk, row);
    Vf mx = vec::set1(-kInf);
    const float* rel_row = rel != nullptr ? rel + (lp - 1 - i) + ka : nullptr;
    for (int64_t j = 0; j < nkp; j += W) {
      Vf t = vec::fmadd(vec::load(row + j), scale, vec::load(bias + ka + j));
      if (rel_row != nullptr) t = t + vec::load(rel_row + j);
      vec::store(row + j, t);
      mx = vec::vmax(mx, t);
    }
    const float mxs = vec::hmax(mx);  // finite: a real query sees itself
    const Vf mv = vec::set1(mxs);
    Vf sum = vec::set1(0.0f);
    const uint64_t base = pair + (static_cast<uint64_t>(i) << 16) + static_cast<uint64_t>(ka);
    for (int64_t j = 0; j < nkp; j += W) {
      Vf e = vec::vexp_or_zero(vec::load(row + j) - mv);
      sum = sum + e;
      if constexpr (kDropout) e = e * philox::keep_scale(base + static_cast<uint64_t>(j), pb.keys, pb.thresh, pb.keep);
      if (e16 != nullptr) {
        vec::store(e16 + r * ld + j, e);
      } else {
        vec::store(row + j, e);
      }
    }
    const float l = vec::hsum(sum);  // >= 1: the row max contributes e^0
    rinv[r] = 1.0f / l;
    *lse = mxs + std::log(l);
  }
}

// The key bias of a pair's len rows: 0 for a real key, -inf for a hole and past the sequence
// (bias [lp + W]).
inline void fill_key_bias(const Seq& sq, int64_t len, int64_t lp, float* bias) {
  for (int64_t j = 0; j < lp + W; ++j) bias[j] = j < len && (sq.real == nullptr || sq.real[j]) ? 0.0f : -kInf;
}

// Output rows i0 .. i0 + m of the pair from the unnormalised block o [m, d], each scaled by rinv.
template <class T>
void put_block(const Problem& pb, const Rows<T>& out, const Seq& sq, int64_t b, int64_t h, int64_t i0, int64_t m,
               const float* o, const float* rinv) {
  const int64_t d = pb.d;
  for (int64_t r = 0; r < m; ++r) {
    T* dst = out.at(b, h, sq.first + i0 + r);
    const Vf f = vec::set1(rinv[r]);
    for (int64_t c = 0; c < d; c += W) put_n(dst + c, load_n(o + r * d + c, d - c) * f, d - c, pb.stream);
  }
}

// The pair on bf16 products (the header's last paragraph); zero_outside done.
template <bool kDropout>
void forward_pair_bf16(const Problem& pb, const Rows<const c10::BFloat16>& q, const Rows<const c10::BFloat16>& k,
                       const Rows<const c10::BFloat16>& v, const Rows<c10::BFloat16>& out, int64_t b, int64_t h) {
  using B = c10::BFloat16;
  const Seq& sq = pb.seqs[b];
  const int64_t len = sq.len, d = pb.d;
  const int64_t lp = vec::round_up(len, W);
  int64_t mb, ls;
  block_shape(pb, len, lp, block_rows(lp), mb, ls);
  const int64_t rotated = pb.rope() ? len * d : 0;  // q and k rotated, bf16: half as many floats
  float* buf = vec::thread_buffer<float, kSlotAttention>(
      arena_size({lp + W, mb * ls, (mb * ls + 1) / 2, mb * d, mb, (rotated + 1) / 2, (rotated + 1) / 2}));
  Arena arena{buf};
  float* bias = arena.take(lp + W);
  float* s = arena.take(mb * ls);
  B* e = reinterpret_cast<B*>(arena.take((mb * ls + 1) / 2));  // the weights in bf16 [mb, ls]
  float* o = arena.take(mb * d);
  float* rinv = arena.take(mb);
  const B *qr = q.at(b, h, sq.first), *kr = k.at(b, h, sq.first);
  int64_t ldq = q.sr, ldk = k.sr;
  if (pb.rope()) {
    const int64_t pos0 = pb.first_position(sq);
    B* qb = reinterpret_cast<B*>(arena.take((rotated + 1) / 2));
    B* kb = reinterpret_cast<B*>(arena.take((rotated + 1) / 2));
    rotate_rows(qr, ldq, len, d, pb, pos0, 1.0f, qb);
    rotate_rows(kr, ldk, len, d, pb, pos0, 1.0f, kb);
    qr = qb;
    kr = kb;
    ldq = ldk = d;
  }
  const B* vr = v.at(b, h, sq.first);
  auto bits = [](const B* p) { return reinterpret_cast<const uint16_t*>(p); };
  fill_key_bias(sq, len, lp, bias);
  for (int64_t i0 = 0; i0 < len; i0 += mb) {
    const int64_t m = std::min(mb, len - i0);
    const Span keys = span_of(pb, i0, m, len);
    const int64_t nk = keys.hi - keys.lo;
    gemm_bf16(false, true, m, nk, d, bits(qr + i0 * ldq), ldq, bits(kr + keys.lo * ldk), ldk, s, ls);  // S = Q K^T
    softmax_rows<kDropout>(pb, sq, b, h, i0, m, keys.lo, nk, bias, nullptr, Terms{}, s, ls, rinv, e);
    gemm_bf16(false, false, m, d, nk, bits(e), ls, bits(vr + keys.lo * v.sr), v.sr, o, d);  // O = E V
    put_block(pb, out, sq, b, h, i0, m, o, rinv);
  }
}

template <class T, bool kDropout>
void forward_pair(const Problem& pb, const Rows<const T>& q, const Rows<const T>& k, const Rows<const T>& v,
                  const Rows<T>& out, int64_t b, int64_t h) {
  zero_outside<T>(pb, b, h, {out}, true);
  const Seq& sq = pb.seqs[b];
  const int64_t len = sq.len, d = pb.d;
  if (len == 0) return;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (pb.bf16_min_len >= 0 && len >= pb.bf16_min_len && !pb.pos.on() && !pb.relative())
      return forward_pair_bf16<kDropout>(pb, q, k, v, out, b, h);
  }
  const int64_t lp = vec::round_up(len, W);
  int64_t mb, ls;  // query rows per block, the stride of a block's score rows
  block_shape(pb, len, lp, block_rows(lp), mb, ls);
  const int64_t rows = std::is_same_v<T, float> ? 0 : len * d;
  const int64_t rotated = pb.rope() ? len * d : 0;  // q and k rotated (fp32)
  const int64_t qrows = std::max(rows, rotated);
  const int64_t terms = len * terms_rows(pb, len);  // c2p and p2c
  float* buf = vec::thread_buffer<float, kSlotAttention>(arena_size(
      {d * lp, lp + W, mb * ls, mb * d, mb, qrows, rows, rotated, pb.relative() ? relative_size(lp) : 0, terms, terms}));
  Arena arena{buf};
  float* kt = arena.take(d * lp);     // K^T [d, lp]
  float* bias = arena.take(lp + W);   // key bias: 0 real, -inf hole / past the sequence
  float* s = arena.take(mb * ls);     // scores, then weights [mb, ls]
  float* o = arena.take(mb * d);      // unnormalised output block [mb, d]
  float* rinv = arena.take(mb);       // 1 / row sum (0 for a padded query)
  int64_t ldq = d, ldv;
  float* qbuf = arena.take(qrows);
  const float* qr = qbuf;
  const float* vr = fp32_rows(v.at(b, h, sq.first), v.sr, len, d, arena.take(rows), ldv);
  // K^T packed by this code: an NN product with it is faster than letting the BLAS transpose
  if (pb.rope()) {  // q and k rotated as they are read into fp32 rows
    const int64_t pos0 = pb.first_position(sq);
    float* kbuf = arena.take(rotated);
    rotate_rows(q.at(b, h, sq.first), q.sr, len, d, pb, pos0, 1.0f, qbuf);
    rotate_rows(k.at(b, h, sq.first), k.sr, len, d, pb, pos0, 1.0f, kbuf);
    pack_transposed(static_cast<const float*>(kbuf), d, len, d, kt, lp);
  } else {
    qr = fp32_rows(q.at(b, h, sq.first), q.sr, len, d, qbuf, ldq);
    pack_transposed(k.at(b, h, sq.first), k.sr, len, d, kt, lp);
  }
  fill_key_bias(sq, len, lp, bias);
  float* rel = nullptr;  // the relative bias by distance, for query rows
  if (pb.relative()) {
    rel = arena.take(relative_size(lp));
    fill_relative(pb, h, len, lp, 1, rel);
  }
  float* c2p = arena.take(terms);
  const Terms tm = pair_terms(pb, h, len, qr, ldq, kt, lp, true, c2p, arena.take(terms));

  for (int64_t i0 = 0; i0 < len; i0 += mb) {
    const int64_t m = std::min(mb, len - i0);
    const Span keys = span_of(pb, i0, m, len);  // local attention: the keys of the block's windows only
    const int64_t nk = keys.hi - keys.lo;
    gemm(false, false, m, nk, d, qr + i0 * ldq, ldq, kt + keys.lo, lp, s, ls, false);  // S = Q K^T
    softmax_rows<kDropout>(pb, sq, b, h, i0, m, keys.lo, nk, bias, rel, tm, s, ls, rinv);
    gemm(false, false, m, d, nk, s, ls, vr + keys.lo * ldv, ldv, o, d, false);  // O = E V
    put_block(pb, out, sq, b, h, i0, m, o, rinv);
  }
}

}  // namespace

template <class T>
void run_forward(const kernels::AttnArgs& a) {
  Problem pb = problem_of(a);
  const Rows<const T> qr = rows_of<const T>(a.q), kr = rows_of<const T>(a.k), vr = rows_of<const T>(a.v);
  const Rows<T> orows = rows_of<T>(a.out);
  pb.stream = kernels::stream_output(orows.base, a.rows * a.heads * (a.padded ? a.batch : 1), pb.d);
  if (pb.dropout) {
    for_each_pair(pb, [&](int64_t b, int64_t h) { forward_pair<T, true>(pb, qr, kr, vr, orows, b, h); });
  } else {
    for_each_pair(pb, [&](int64_t b, int64_t h) { forward_pair<T, false>(pb, qr, kr, vr, orows, b, h); });
  }
}

template void run_forward<float>(const kernels::AttnArgs&);
template void run_forward<c10::Half>(const kernels::AttnArgs&);
template void run_forward<c10::BFloat16>(const kernels::AttnArgs&);

}  // namespace attn
}  // namespace fastbert
