// The table of a kernel library (api.h): every entry whose kernel is linked into this library, the
// level it was compiled for, and the host's services. The only exported symbol of the library.
//
// Each entry is declared weak: a library built from a subset of the kernel sources (a level that
// only adds one kernel, such as avx512_vnni's int8 GEMM) leaves the others nullptr, and the host
// takes them from the level below.
#include "api.h"
#include "common.h"
#include "vec.h"

#ifndef FASTBERT_LEVEL
#error "FASTBERT_LEVEL (the level's name) must be defined when a kernel library is compiled"
#endif
#define FASTBERT_STRINGIFY2(x) #x
#define FASTBERT_STRINGIFY(x) FASTBERT_STRINGIFY2(x)

namespace fastbert {
namespace kernels {
namespace {
Host g_host;
}  // namespace

const Host& host() { return g_host; }

#define FASTBERT_DECLARE_WEAK(name, ret, ...) __attribute__((weak, visibility("hidden"))) ret name(__VA_ARGS__);
FASTBERT_KERNEL_ENTRIES(FASTBERT_DECLARE_WEAK)
#undef FASTBERT_DECLARE_WEAK

namespace {

// The Feature bits of what this library was compiled for.
constexpr uint64_t compiled_features() {
  uint64_t f = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  f |= kAvx2;
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  f |= kAvx512;
#endif
#if defined(__AVX512VNNI__)
  f |= kAvx512Vnni;
#endif
#if defined(__AVX512BF16__)
  f |= kAvx512Bf16;
#endif
#if defined(__AMX_TILE__)
  f |= kAmx;
#endif
  return f;
}

Table make_table() {
  Table t;
  t.level = FASTBERT_STRINGIFY(FASTBERT_LEVEL);
  t.features = compiled_features();
  t.vector_bytes = vec::kWidth * static_cast<int64_t>(sizeof(float));
#define FASTBERT_SET_ENTRY(name, ret, ...) t.name = &name;
  FASTBERT_KERNEL_ENTRIES(FASTBERT_SET_ENTRY)
#undef FASTBERT_SET_ENTRY
  return t;
}

}  // namespace
}  // namespace kernels
}  // namespace fastbert

extern "C" __attribute__((visibility("default"))) const fastbert::kernels::Table* fastbert_kernel_table(
    const fastbert::kernels::Host* host, int abi_version) {
  if (abi_version != fastbert::kernels::kAbiVersion || host == nullptr) return nullptr;
  fastbert::kernels::g_host = *host;
  static const fastbert::kernels::Table table = fastbert::kernels::make_table();
  return &table;
}
