// The host's output allocation: large outputs from a mapping allocator of its own (below).
#include <ATen/EmptyTensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/accumulate.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <dlfcn.h>
#include <sys/mman.h>
#endif

#include "cpu_ops.h"

namespace fastbert {

namespace detail {

namespace {

// Large outputs (4 MiB and more) come from a mapping allocator of their own instead of torch's CPU
// allocator (malloc). glibc's malloc maps every block above its mmap threshold (which starts at
// 128 KiB and moves up to at most 32 MiB with the sizes freed so far) and unmaps it on free, and
// trims its heap top back to the system beyond a matching trim threshold; such an output is then
// page-faulted in again, 4 KiB at a time, on every call. Which calls pay depends on the history of
// the heap: at 4096 x 768 fp32 (12 MiB) one run pays on every call, the next on none; at 4096 x 3072
// (48 MiB) every call pays, and the faults take longer than the kernel itself (benchmarks/LOG.md,
// "Fused ops on the CPU"). The allocator here
//   - maps 2 MiB aligned with MADV_HUGEPAGE (transparent huge pages: one fault per 2 MiB), and
//   - keeps freed mappings and hands one out again to a request of the same size, as a training
//     or inference loop makes, or of up to 2x smaller: those are neither faulted nor zeroed again.
//     A sentence-encoding loop over batches sorted by length makes a few sizes per batch and
//     dozens in all, hence up to 64 entries (with 16, fastbert's linear layers and ops evicted each
//     other's mappings). The kept bytes are bounded by the most bytes the process ever had in use
//     from this allocator at once (and by kCacheBytes): a loop whose largest step needs P bytes
//     keeps at most P for the steps after it, however many sizes it meets, so a server or a corpus
//     job that sees every batch shape holds no more than its largest batch needs twice over (in use
//     and kept), instead of growing towards kCacheBytes with each new shape. The oldest go first.
//     Freshly mapped huge pages can also be slow on a VM whose host reclaims free guest memory;
//     reused ones are not.
// Smaller outputs keep torch's allocator. This is on when malloc is glibc's (jemalloc / tcmalloc
// keep large blocks for reuse themselves); FASTBERT_THP=0 in the environment turns it off,
// FASTBERT_THP=1 on. fastbert._C.release_cached_memory() unmaps the kept mappings.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = size_t{4} << 20;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define FASTBERT_HUGE_ALLOC 1

class HugePageAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kCacheEntries = 64;
  static constexpr size_t kCacheBytes = size_t{1} << 30;

  // Never destroyed: tensors may outlive static destruction at exit.
  static HugePageAllocator* get() {
    static auto* a = new HugePageAllocator();
    return a;
  }

  c10::DataPtr allocate(size_t n) override {
    if (n < kHugeMin) return c10::GetCPUAllocator()->allocate(n);
    const size_t len = (n + kHugePage - 1) / kHugePage * kHugePage;
    Mapping m{nullptr, len};
    if (!take(len, &m)) m.base = map(len);
    if (m.base == nullptr) return c10::GetCPUAllocator()->allocate(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_bytes_ += m.len;
      peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
    }
    return {m.base, new Mapping(m), &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void release_cached() {
    std::vector<Mapping> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      drop.swap(cache_);
      cached_bytes_ = 0;
      peak_live_bytes_ = live_bytes_;  // the bound starts again from what is in use now
    }
    for (const Mapping& m : drop) munmap(m.base, m.len);
  }

  // (bytes kept for reuse, bytes handed out and not yet freed, the most ever handed out at once)
  std::array<size_t, 3> stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {cached_bytes_, live_bytes_, peak_live_bytes_};
  }

 private:
  struct Mapping {
    void* base;
    size_t len;
  };

  static void* map(size_t len) {
    void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    char* p = static_cast<char*>(raw);
    char* a = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1));
    if (a > p) munmap(p, static_cast<size_t>(a - p));
    char* end = p + len + kHugePage;
    if (a + len < end) munmap(a + len, static_cast<size_t>(end - (a + len)));
    madvise(a, len, MADV_HUGEPAGE);  // a hint: where THP is unavailable the pages are 4 KiB
    return a;
  }

  // The smallest kept mapping of at least len bytes and at most twice that (the most recently
  // freed among equals), whole: a loop whose sizes shrink, such as sentence batches sorted by
  // length, keeps reusing the mappings its first, largest step made.
  bool take(size_t len, Mapping* out) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = cache_.size();
    for (size_t i = cache_.size(); i-- > 0;) {
      const size_t l = cache_[i].len;
      if (l >= len && l / 2 <= len && (best == cache_.size() || l < cache_[best].len)) best = i;
    }
    if (best == cache_.size()) return false;
    *out = cache_[best];
    cache_.erase(cache_.begin() + static_cast<std::ptrdiff_t>(best));
    cached_bytes_ -= out->len;
    return true;
  }

  static void release(void* ctx) {
    std::unique_ptr<Mapping> m(static_cast<Mapping*>(ctx));
    HugePageAllocator* self = get();
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->live_bytes_ -= m->len;
      const size_t bound = std::min(kCacheBytes, self->peak_live_bytes_);
      if (m->len <= bound) {
        // make room: the oldest entries go first
        while (!self->cache_.empty() &&
               (self->cache_.size() >= kCacheEntries || self->cached_bytes_ + m->len > bound)) {
          munmap(self->cache_.front().base, self->cache_.front().len);
          self->cached_bytes_ -= self->cache_.front().len;
          self->cache_.erase(self->cache_.begin());
        }
        self->cache_.push_back(*m);
        self->cached_bytes_ += m->len;
        return;
      }
    }
    munmap(m->base, m->len);
  }

  std::mutex mu_;
  std::vector<Mapping> cache_;  // oldest first
  size_t cached_bytes_ = 0;
  size_t live_bytes_ = 0;       // handed out, not yet freed
  size_t peak_live_bytes_ = 0;  // the most ever handed out at once: the cache's bound
};

// Only glibc's malloc unmaps large blocks on free; an allocator such as jemalloc or tcmalloc
// (LD_PRELOAD) keeps them for reuse, and then torch's allocator is the better path.
bool malloc_is_glibc() {
  Dl_info info;
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  return m != nullptr && dladdr(m, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libc.so") != nullptr;
}

bool huge_pages_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FASTBERT_THP");
    if (v != nullptr) return std::strcmp(v, "0") != 0;
    return malloc_is_glibc();
  }();
  return on;
}
#endif

// An uninitialised contiguous CPU tensor of `sizes` and `dtype` (see above for the large ones).
at::Tensor empty_contiguous(at::IntArrayRef sizes, at::ScalarType dtype) {
#if defined(FASTBERT_HUGE_ALLOC)
  const size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  if (huge_pages_enabled() && nbytes >= kHugeMin) {
    return at::detail::empty_generic(sizes, HugePageAllocator::get(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                     dtype, at::MemoryFormat::Contiguous);
  }
#endif
  return at::detail::empty_cpu(sizes, dtype, /*pin_memory=*/false, at::MemoryFormat::Contiguous);
}

void release_block(void* ctx) { delete static_cast<at::Tensor*>(ctx); }

// A tensor of x's shape and dtype over bytes [offset, offset + nbytes) of `block`, with a storage of
// its own that keeps the block alive (and can still be resized like any CPU tensor's).
at::Tensor carve(const at::Tensor& block, size_t offset, const at::Tensor& x) {
  const size_t nbytes = static_cast<size_t>(x.numel()) * x.element_size();
  c10::DataPtr data(static_cast<char*>(block.data_ptr()) + offset, new at::Tensor(block), &release_block,
                    c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), c10::GetCPUAllocator(),
                       /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                          x.dtype());
  t.unsafeGetTensorImpl()->set_sizes_contiguous(x.sizes());
  return t;
}

}  // namespace

at::Tensor empty_output(const at::Tensor& x) { return empty_contiguous(x.sizes(), x.scalar_type()); }

at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype) { return empty_contiguous(sizes, dtype); }

at::Tensor zeros(at::IntArrayRef sizes, at::ScalarType dtype) {
  at::Tensor t = empty_contiguous(sizes, dtype);
  if (t.numel() > 0) std::memset(t.data_ptr(), 0, static_cast<size_t>(t.nbytes()));
  return t;
}

void release_cached_memory() {
#if defined(FASTBERT_HUGE_ALLOC)
  HugePageAllocator::get()->release_cached();
#endif
}

std::array<int64_t, 3> cached_memory() {
#if defined(FASTBERT_HUGE_ALLOC)
  const std::array<size_t, 3> s = HugePageAllocator::get()->stats();
  return {static_cast<int64_t>(s[0]), static_cast<int64_t>(s[1]), static_cast<int64_t>(s[2])};
#else
  return {0, 0, 0};
#endif
}

std::pair<at::Tensor, at::Tensor> empty_output_pair(const at::Tensor& x) {
  const size_t nbytes = static_cast<size_t>(x.numel()) * x.element_size();
  if (nbytes == 0) return {empty_output(x), empty_output(x)};
  const size_t stride = (nbytes + 63) / 64 * 64;
  at::Tensor block = empty_contiguous({static_cast<int64_t>(stride + nbytes)}, at::kByte);
  return {carve(block, 0, x), carve(block, stride, x)};
}

}  // namespace detail
}  // namespace fastbert
