#include "tensor/storage.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <new>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace sl {

void keep_freed_memory_for_reuse() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return;
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
  });
}

Storage::Storage(int64_t bytes, Device device) : bytes_(bytes), device_(device), category_(MemoryScope::current()) {
  SL_ASSERT(bytes >= 0);
  cuda::require_device(device, "Storage: cannot allocate");
  allocate();
}

void Storage::allocate() {
  if (device_.is_cuda()) {  // the caching allocator of tensor/cuda/allocator.cu
    data_ = cuda::allocate(bytes_, device_.index);
  } else {
    keep_freed_memory_for_reuse();
    size_t rounded = (static_cast<size_t>(bytes_) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  }
  SL_CHECK(data_ != nullptr, "Storage: out of memory allocating ", bytes_, " bytes on ", device_);
  MemoryLedger::instance().allocate(device_, category_, bytes_);
}

Storage::~Storage() { release(); }

void Storage::release() {
  if (data_ == nullptr) return;
  if (device_.is_cuda())
    cuda::release(data_, device_.index);
  else
    std::free(data_);
  data_ = nullptr;
  MemoryLedger::instance().release(device_, category_, bytes_);
}

void Storage::reallocate() {
  if (data_ == nullptr) allocate();
}

}  // namespace sl
