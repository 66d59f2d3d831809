// The vector side of fastbert's dropout rule (the rule, the keys and the scalar generator are in
// philox_keys.h): Philox words for kWidth consecutive counters at once, and the keep-scale.
#pragma once

#include <cmath>
#include <cstdint>

#include "philox_keys.h"
#include "vec.h"
#include "vec_philox.h"

namespace fastbert {
namespace philox {

// u for the counters base + i of lane i (i < kWidth); 64-bit counters, the high word carries
inline vec::Vu words(uint64_t base, const Keys& keys) {
  return vec::philox_word0(base, kRoundA, kRoundB, keys.k0, keys.k1);
}

// scale in the lanes kept by the dropout rule, 0 in the dropped ones (counters base + i)
inline vec::Vf keep_scale(uint64_t base, const Keys& keys, uint32_t thresh, float scale) {
  return vec::keep_scale(words(base, keys), thresh, scale);
}

// the same for the counters base + i * step of lane i (a column of a row-major counter grid)
inline vec::Vf keep_scale_step(uint64_t base, uint64_t step, const Keys& keys, uint32_t thresh, float scale) {
  return vec::keep_scale(vec::philox_word0_step(base, step, kRoundA, kRoundB, keys.k0, keys.k1), thresh, scale);
}

}  // namespace philox
}  // namespace fastbert
