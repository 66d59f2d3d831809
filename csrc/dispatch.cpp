// Runtime dispatch: what this CPU can execute, and the kernel libraries (kernels/api.h) every
// entry point calls through. fastbert.backend picks the level (the highest this CPU runs, capped
// by FASTBERT_CPU_CAPABILITY) and hands the libraries' paths to use_kernels.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu_ops.h"

// The BLAS libtorch_cpu is linked with (MKL in the x86 wheels): at::native::cpublas::gemm calls
// this sgemm_ for fp32 but is not exported. Weak, so that a torch without a BLAS still loads the
// extension (the attention ops then raise a clear error).
extern "C" void sgemm_(char* transa, char* transb, int* m, int* n, int* k, float* alpha, const float* a, int* lda,
                       const float* b, int* ldb, float* beta, float* c, int* ldc) __attribute__((weak));
// MKL's bf16 GEMM (fp32 results), absent from other BLAS builds.
extern "C" void gemm_bf16bf16f32_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                                  const float* alpha, const uint16_t* a, const int* lda, const uint16_t* b,
                                  const int* ldb, const float* beta, float* c, const int* ldc) __attribute__((weak));
// MKL's per-thread thread count (absent from other BLAS builds).
extern "C" int MKL_Set_Num_Threads_Local(int n) __attribute__((weak));

namespace fastbert {
namespace {


// The instruction-set levels a kernel library is built for, lowest first, with what each needs.
struct Level {
  const char* name;
  uint64_t features;
};
constexpr Level kLevels[] = {
    {"scalar", 0},
    {"avx2", kernels::kAvx2},
    {"avx512", kernels::kAvx2 | kernels::kAvx512},
    {"avx512_vnni", kernels::kAvx2 | kernels::kAvx512 | kernels::kAvx512Vnni},
    // no library of its own: avx512_vnni's kernels, with the packed int8 GEMM's whole 16-row blocks on
    // AMX's tiles (kernels/int8_gemm_packed.cpp); also needs the OS to grant the tile state
    {"amx", kernels::kAvx2 | kernels::kAvx512 | kernels::kAvx512Vnni | kernels::kAmx},
};
constexpr const char* kLibrarylessLevel = "amx";

// The Feature bits this CPU and its OS support (the compiler's cpuid + xgetbv checks).
uint64_t cpu_features_bits() {
  uint64_t f = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("bmi2")) {
    f |= kernels::kAvx2;
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd")) {
    f |= kernels::kAvx512;
  }
  if (__builtin_cpu_supports("avx512vnni")) f |= kernels::kAvx512Vnni;
  if (__builtin_cpu_supports("avx512bf16")) f |= kernels::kAvx512Bf16;
  if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("amx-bf16")) {
    f |= kernels::kAmx;
  }
#endif
  return f;
}

void host_parallel_for(int64_t begin, int64_t end, int64_t grain, void (*body)(void*, int64_t, int64_t), void* ctx) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { body(ctx, b, e); });
}

int64_t host_num_threads() { return at::get_num_threads(); }

std::atomic<bool> g_int8_amx{false};

bool host_int8_amx() { return g_int8_amx.load(std::memory_order_relaxed); }

// Whether the OS lets this process use AMX's tile registers: Linux grants their state (XTILEDATA,
// xfeature 18) to a process that asks for it with arch_prctl(ARCH_REQ_XCOMP_PERM) before its first
// tile instruction; asked once (oneDNN asks the same for torch's own AMX kernels).
bool amx_permitted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return granted;
#else
  return false;
#endif
}

const kernels::Host kHost{&host_parallel_for, &host_num_threads, sgemm_ != nullptr ? &sgemm_ : nullptr,
                          MKL_Set_Num_Threads_Local != nullptr ? &MKL_Set_Num_Threads_Local : nullptr,
                          gemm_bf16bf16f32_ != nullptr ? &gemm_bf16bf16f32_ : nullptr, &host_int8_amx};

// The table of the library at `path`, loaded once (and never unloaded: its code may be running).
const kernels::Table* load_library(const std::string& level, const std::string& path) {
  static std::map<std::string, const kernels::Table*> loaded;
  auto it = loaded.find(path);
  if (it != loaded.end()) return it->second;
#if defined(__linux__) || defined(__APPLE__)
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle != nullptr, "fastbert._C: cannot load the ", level, " kernel library ", path, ": ", dlerror());
  using Entry = const kernels::Table* (*)(const kernels::Host*, int);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "fastbert_kernel_table"));
  TORCH_CHECK(entry != nullptr, "fastbert._C: ", path, " is not a fastbert kernel library");
  const kernels::Table* table = entry(&kHost, kernels::kAbiVersion);
  TORCH_CHECK(table != nullptr, "fastbert._C: the kernel library ", path,
              " was built from another version of fastbert; rebuild: pip install --no-build-isolation -e .");
  const uint64_t missing = table->features & ~cpu_features_bits();
  TORCH_CHECK(missing == 0, "fastbert._C: the ", level, " kernel library needs instructions this CPU lacks (feature bits ",
              missing, ")");
  loaded[path] = table;
  return table;
#else
  TORCH_CHECK(false, "fastbert._C: kernel libraries load on Linux and macOS only");
#endif
}

std::mutex g_mutex;
std::atomic<const kernels::Table*> g_active{nullptr};
std::string g_level;
std::atomic<bool> g_bf16_available{false};
std::atomic<int64_t> g_bf16_min_len{-1};
const kernels::Table kEmpty{};

}  // namespace

std::vector<std::string> cpu_features() {
  const uint64_t have = cpu_features_bits();
  std::vector<std::string> out;
  const std::pair<uint64_t, const char*> names[] = {{kernels::kAvx2, "avx2"},
                                                    {kernels::kAvx512, "avx512"},
                                                    {kernels::kAvx512Vnni, "avx512_vnni"},
                                                    {kernels::kAvx512Bf16, "avx512_bf16"},
                                                    {kernels::kAmx, "amx"}};
  for (const auto& [bit, name] : names) {
    if (have & bit) out.emplace_back(name);
  }
  return out;
}

std::vector<std::string> cpu_levels() {
  std::vector<std::string> out;
  const uint64_t have = cpu_features_bits();
  for (const Level& l : kLevels) {
    if ((l.features & ~have) == 0 && ((l.features & kernels::kAmx) == 0 || amx_permitted())) out.emplace_back(l.name);
  }
  return out;
}

void use_kernels(const std::vector<std::string>& levels, const std::vector<std::string>& paths) {
  TORCH_CHECK(!levels.empty() && levels.size() == paths.size(),
              "fastbert._C.use_kernels: needs one path per level, at least one");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto* t = new kernels::Table();  // never freed: another thread may still be reading the previous one
  const std::vector<std::string> runnable = cpu_levels();
  for (size_t i = 0; i < levels.size(); ++i) {
    if (paths[i].empty()) {  // a level without a library: it changes how the ones below run
      TORCH_CHECK(levels[i] == kLibrarylessLevel && i > 0 && levels[i - 1] == "avx512_vnni",
                  "fastbert._C.use_kernels: only the level ", kLibrarylessLevel,
                  " has no library, and it stands over avx512_vnni; got ", levels[i], " with no path");
      TORCH_CHECK(std::find(runnable.begin(), runnable.end(), levels[i]) != runnable.end(), "fastbert._C.use_kernels: ",
                  "this CPU (or its OS) does not run the level ", levels[i]);
      continue;
    }
    const kernels::Table* lib = load_library(levels[i], paths[i]);
#define FASTBERT_OVERLAY(name, ret, ...) \
  if (lib->name != nullptr) t->name = lib->name;
    FASTBERT_KERNEL_ENTRIES(FASTBERT_OVERLAY)
#undef FASTBERT_OVERLAY
    t->level = lib->level;
    t->features |= lib->features;
    t->vector_bytes = std::max(t->vector_bytes, lib->vector_bytes);
  }
#define FASTBERT_CHECK_ENTRY(name, ret, ...)                                                                   \
  TORCH_CHECK(t->name != nullptr, "fastbert._C.use_kernels: no library of levels up to ", levels.back(), \
              " provides the kernel " #name);
  FASTBERT_KERNEL_ENTRIES(FASTBERT_CHECK_ENTRY)
#undef FASTBERT_CHECK_ENTRY
  g_level = levels.back();
  // bf16 attention products offered where the CPU multiplies bf16 natively (AVX512_BF16 or AMX) at a
  // level of AVX-512 or above: a level capped lower stands for a CPU without them (as the Python
  // side's backend.native_bf16 reads it). Taken from the sequence length fastbert.ops.attention
  // times (bf16_min_len) and sets.
  const bool wide = g_level != "scalar" && g_level != "avx2";
  g_bf16_available.store(wide && gemm_bf16bf16f32_ != nullptr &&
                         (cpu_features_bits() & (kernels::kAvx512Bf16 | kernels::kAmx)) != 0);
  g_bf16_min_len.store(-1);
  // int8 GEMMs on AMX's tiles (kernels/int8_gemm_packed.cpp) at the level amx, and at native (built
  // for this CPU: everything it has) where the CPU has them and the library multiplies int8 with VNNI;
  // avx512_vnni and below stand for a CPU without them
  const bool native_amx = g_level == "native" && (t->features & kernels::kAvx512Vnni) != 0 &&
                          (cpu_features_bits() & kernels::kAmx) != 0 && amx_permitted();
  g_int8_amx.store(g_level == kLibrarylessLevel || native_amx);
  g_active.store(t);
}

bool int8_amx() { return g_int8_amx.load(); }

bool attention_bf16_available() { return g_bf16_available.load(); }

int64_t attention_bf16_min_len() { return g_bf16_min_len.load(); }

int64_t set_attention_bf16_min_len(int64_t min_len) {
  TORCH_CHECK(min_len < 0 || g_bf16_available.load(), "fastbert._C.set_attention_bf16_min_len: this CPU, at the "
              "kernel level in use, has no native bf16 GEMM for the attention");
  return g_bf16_min_len.exchange(min_len < 0 ? -1 : min_len);
}

std::string kernel_level() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_level;
}

namespace detail {

const kernels::Table& kernel_table() {
  const kernels::Table* t = g_active.load();
  return t != nullptr ? *t : kEmpty;
}

const kernels::Table& kernels_for(const char* op) {
  const kernels::Table* t = g_active.load();
  TORCH_CHECK(t != nullptr, "fastbert._C.", op,
              ": no kernel library is loaded (fastbert.backend loads one when fastbert imports the extension)");
  return *t;
}

bool has_blas() { return sgemm_ != nullptr; }

kernels::Dtype dtype_of(at::ScalarType t) {
  using D = kernels::Dtype;
  static constexpr std::pair<at::ScalarType, D> kNames[] = {
      {at::kFloat, D::kFloat}, {at::kHalf, D::kHalf},   {at::kBFloat16, D::kBFloat16}, {at::kInt, D::kInt32},
      {at::kChar, D::kInt8},   {at::kByte, D::kUInt8},  {at::kShort, D::kInt16},       {at::kLong, D::kInt64},
      {at::kBool, D::kBool}};
  for (const auto& [torch_dtype, name] : kNames) {
    if (torch_dtype == t) return name;
  }
  TORCH_CHECK(false, "fastbert._C: no kernel takes dtype ", t);
}

}  // namespace detail
}  // namespace fastbert
