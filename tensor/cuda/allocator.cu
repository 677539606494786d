// allocator.cu — a caching allocator for GPU memory, one pool per device (the idea of PyTorch's
// CUDACachingAllocator, in its simplest form).
//
//   allocate(bytes)  round up to 512 B; reuse the smallest free block of at least that size (and at
//                    most twice it, so a small tensor does not pin a huge block), else cudaMalloc;
//                    if CUDA is out of memory, give every cached block back and try once more
//   release(p)       the block goes back to its pool, not to CUDA
//
// Reusing a block at once is safe because every kernel and copy of a device runs on one stream in
// issue order (runtime.h): the next op that gets the block runs after the last op that used it.
// The memory ledger charges what tensors hold; cached_bytes() is the pool's slack on top.
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace sl::cuda {

namespace {

constexpr size_t kGranule = 512;

class DevicePool {
 public:
  explicit DevicePool(int device) : device_(device) {}

  void* allocate(size_t bytes) {
    const size_t size = (bytes + kGranule - 1) / kGranule * kGranule + (bytes == 0 ? kGranule : 0);
    std::lock_guard lock(mutex_);
    auto reuse = free_.lower_bound(size);
    if (reuse != free_.end() && reuse->first <= 2 * size) {
      void* block = reuse->second;
      cached_ -= reuse->first;
      free_.erase(reuse);
      return block;
    }
    SL_CUDA_CHECK(cudaSetDevice(device_));
    void* block = nullptr;
    cudaError_t status = cudaMalloc(&block, size);
    if (status == cudaErrorMemoryAllocation) {  // out of memory: return the cache to CUDA, try again
      cudaGetLastError();
      empty_locked();
      status = cudaMalloc(&block, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      throw Error(detail::concat("CUDA out of memory: cannot allocate ", bytes, " bytes on cuda:", device_, " (",
                                 free_bytes, " of ", total_bytes, " bytes free)"));
    }
    SL_CUDA_CHECK(status);
    sizes_[block] = size;
    return block;
  }

  void release(void* block) {
    std::lock_guard lock(mutex_);
    auto found = sizes_.find(block);
    SL_ASSERT(found != sizes_.end());
    free_.emplace(found->second, block);
    cached_ += found->second;
  }

  int64_t cached() {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(cached_);
  }

  void empty() {
    std::lock_guard lock(mutex_);
    empty_locked();
  }

 private:
  void empty_locked() {
    if (free_.empty()) return;
    SL_CUDA_CHECK(cudaSetDevice(device_));
    SL_CUDA_CHECK(cudaDeviceSynchronize());  // a cached block may still be read by queued work
    for (auto& [size, block] : free_) {
      SL_CUDA_CHECK(cudaFree(block));
      sizes_.erase(block);
    }
    free_.clear();
    cached_ = 0;
  }

  int device_;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;        // size -> cached block, smallest first
  std::unordered_map<void*, size_t> sizes_;  // every block this pool made, by address
  size_t cached_ = 0;
};

// One pool per device, made on first use and never destroyed: a tensor in a static or thread_local
// may be freed after every static of this file is gone, and must still find its pool.
DevicePool& pool(int device) {
  static std::mutex mutex;
  static auto* pools = new std::vector<std::unique_ptr<DevicePool>>(static_cast<size_t>(device_count()));
  require_device(Device::cuda(device), "cuda allocator");
  std::lock_guard lock(mutex);
  if (!(*pools)[device]) (*pools)[device] = std::make_unique<DevicePool>(device);
  return *(*pools)[device];
}

}  // namespace

void* allocate(int64_t bytes, int device) { return pool(device).allocate(static_cast<size_t>(bytes)); }
void release(void* pointer, int device) { pool(device).release(pointer); }
int64_t cached_bytes(int device) { return pool(device).cached(); }
void empty_cache(int device) { pool(device).empty(); }

}  // namespace sl::cuda
