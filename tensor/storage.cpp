#include "tensor/storage.h"

#include <cstdlib>
#include <new>

#include "tensor/error.h"

namespace sl {

Storage::Storage(int64_t bytes, Device device) : bytes_(bytes), device_(device), category_(MemoryScope::current()) {
  SL_ASSERT(bytes >= 0);
  SL_CHECK(device.is_cpu(), "Storage: cannot allocate on ", device,
           ": this build of shardlab has no CUDA backend (build with CUDA=1 on a machine with nvcc)");
  allocate();
}

void Storage::allocate() {
  size_t rounded = (static_cast<size_t>(bytes_) + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  SL_CHECK(data_ != nullptr, "Storage: out of memory allocating ", bytes_, " bytes on ", device_);
  MemoryLedger::instance().allocate(device_, category_, bytes_);
}

Storage::~Storage() { release(); }

void Storage::release() {
  if (data_ == nullptr) return;
  std::free(data_);
  data_ = nullptr;
  MemoryLedger::instance().release(device_, category_, bytes_);
}

void Storage::reallocate() {
  if (data_ == nullptr) allocate();
}

}  // namespace sl
