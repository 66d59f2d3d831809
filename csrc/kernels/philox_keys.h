// The dropout rule of fastbert (fastbert/reference/philox.py; bit-identical to triton's tl.randint):
// element with int64 counter offset o draws u = word 0 of Philox-4x32-10 with counter
// (lo32(o), hi32(o), 0, 0) and key (lo32(seed), hi32(seed)); it is kept when
// (u >> 8) >= threshold(p) = floor(p * 2**24), and kept values are scaled by 1 / (1 - p).
// This header: the keys and one counter at a time in plain C++ (the host uses it too); philox.h
// adds the vector generator.
#pragma once

#include <cmath>
#include <cstdint>

namespace fastbert {
namespace philox {

constexpr uint32_t kRoundA = 0xD2511F53u;  // multiplies c0
constexpr uint32_t kRoundB = 0xCD9E8D57u;  // multiplies c2
constexpr uint32_t kKeyA = 0x9E3779B9u;
constexpr uint32_t kKeyB = 0xBB67AE85u;

inline uint32_t threshold(double p) { return static_cast<uint32_t>(std::floor(p * 16777216.0)); }

// The ten round keys of a seed, computed once per call.
struct Keys {
  uint32_t k0[10];
  uint32_t k1[10];
  Keys() : Keys(0) {}
  explicit Keys(uint64_t seed) {
    uint32_t a = static_cast<uint32_t>(seed), b = static_cast<uint32_t>(seed >> 32);
    for (int i = 0; i < 10; ++i) {
      k0[i] = a;
      k1[i] = b;
      a += kKeyA;
      b += kKeyB;
    }
  }
};

// u for one counter, in plain C++
inline uint32_t word0(uint64_t offset, const Keys& keys) {
  uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(offset >> 32), c2 = 0, c3 = 0;
  for (int i = 0; i < 10; ++i) {
    const uint64_t pb = static_cast<uint64_t>(kRoundB) * c2;
    const uint64_t pa = static_cast<uint64_t>(kRoundA) * c0;
    const uint32_t n0 = static_cast<uint32_t>(pb >> 32) ^ c1 ^ keys.k0[i];
    const uint32_t n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ keys.k1[i];
    c1 = static_cast<uint32_t>(pb);
    c3 = static_cast<uint32_t>(pa);
    c0 = n0;
    c2 = n2;
  }
  return c0;
}

}  // namespace philox
}  // namespace fastbert
