// storage.h — a block of bytes on one device, charged to the memory ledger while it lives.
//
// Tensors share a Storage through shared_ptr (reshape and flat views reuse it); the bytes are
// released, and the ledger credited, when the last tensor using it goes away.
//
// FSDP also frees a storage's bytes *in place* while tensors still name it (PyTorch's
// storage.resize_(0)): autograd's saved tensors hold the same Storage object as the parameters, so
// only releasing that object's bytes actually gives the memory back. release() credits the ledger,
// reallocate() charges the same bytes to the same device and category again; in between data()
// throws instead of handing out a dangling pointer.
#pragma once
#include <cstdint>
#include <memory>

#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/ledger.h"

namespace sl {

// Large tensors come and go every training step (activations, gradient buckets, collective scratch).
// By default glibc maps each allocation above its mmap threshold (dynamic, at most 32 MiB) with fresh
// pages and unmaps it on free, so every step pays the page faults again — and with rank threads in
// one process, the TLB shootdowns of each munmap too. This keeps freed memory in the heap for reuse,
// a caching allocator's trade (more resident memory, no faults), for the whole process; Storage
// calls it before its first allocation. A user's MALLOC_MMAP_THRESHOLD_ wins. Idempotent.
void keep_freed_memory_for_reuse();

class Storage {
 public:
  // Allocates `bytes` (64-byte aligned, uninitialised) on `device`, charged to the thread's category.
  Storage(int64_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return checked_data(); }
  const void* data() const { return checked_data(); }
  int64_t bytes() const { return bytes_; }  // the size, also while released
  Device device() const { return device_; }
  MemoryCategory category() const { return category_; }

  // Frees the bytes now (the ledger is credited); every tensor on this storage keeps its handle.
  void release();
  // Takes bytes() again (uninitialised), charged to the same device and category. No-op if held.
  void reallocate();
  bool is_allocated() const { return data_ != nullptr; }

 private:
  void* checked_data() const {
    SL_CHECK(data_ != nullptr, "Storage: the ", bytes_, " bytes on ", device_.str(),
             " were released (FSDP frees a unit's gathered parameters between uses); reallocate() first");
    return data_;
  }
  void allocate();

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_;
  MemoryCategory category_;
};

}  // namespace sl
