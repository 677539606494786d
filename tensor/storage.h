// storage.h — a block of bytes on one device, charged to the memory ledger while it lives.
//
// Tensors share a Storage through shared_ptr (reshape and flat views reuse it); the bytes are
// released, and the ledger credited, when the last tensor using it goes away.
#pragma once
#include <cstdint>
#include <memory>

#include "tensor/device.h"
#include "tensor/ledger.h"

namespace sl {

class Storage {
 public:
  // Allocates `bytes` (64-byte aligned, uninitialised) on `device`, charged to the thread's category.
  Storage(int64_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemoryCategory category() const { return category_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_;
  MemoryCategory category_;
};

}  // namespace sl
