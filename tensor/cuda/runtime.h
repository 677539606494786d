// runtime.h — the CUDA runtime as shardlab uses it: which GPUs exist, memory, copies, waiting.
//
// A plain C++ header (no CUDA types), so every file can call it; the code is tensor/cuda/runtime.cu
// and allocator.cu, or tensor/cuda/no_cuda.cpp in a build without CUDA (where every call throws).
//
//   Streams: one per device, CUDA's legacy default stream. Kernels, cuBLAS and copies of one device
//   run in the order they were issued, so memory freed by one op can be handed to the next at once
//   (the caching allocator relies on it), and the NCCL backend orders its own stream after it.
//   The host waits only where it must read a value: item(), to(cpu), printing, error checks on ids.
//
//   Memory: a caching allocator per device (allocator.cu). cudaMalloc and cudaFree synchronise the
//   whole GPU and cost tens of microseconds, and a training step frees and re-takes the same sizes
//   every step; so freed blocks are kept in a pool per device and reused. The memory ledger counts
//   what tensors hold (as on the CPU); cached_bytes() what the pool keeps on top.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/device.h"

namespace sl::cuda {

// How many GPUs the CUDA runtime reports (0 on a machine without one, or without CUDA).
int device_count();
// Throws sl::Error unless `device` is a CPU or a GPU this process can use: "<what> on cuda:1: ..."
// and why: built without CUDA, no device found (with cudaGetDeviceCount's error), or an index past
// the last GPU.
void require_device(Device device, const char* what);

// Device memory from the caching allocator (uninitialised); bytes == 0 gives a valid small block.
void* allocate(int64_t bytes, int device);
void release(void* pointer, int device);
int64_t cached_bytes(int device);  // held by the pool for reuse, not by any tensor
void empty_cache(int device);      // gives the pool's blocks back to CUDA

// Copies `bytes` between any two devices (host <-> GPU, GPU <-> GPU, peer to peer when the GPUs
// can reach each other). A copy to the host returns once the bytes are there (after the GPU's
// earlier work on them); copies onto a GPU are ordered on its stream before any later kernel.
void copy(void* to, Device to_device, const void* from, Device from_device, size_t bytes);
// Strided 2-D copy within one GPU: `rows` runs of `row_bytes`, at pitches in bytes; a null `from`
// writes zeros instead. How narrow, cat and split move [outer, size(dim), inner] slabs.
void copy_rows(void* to, int64_t to_pitch, const void* from, int64_t from_pitch, int64_t row_bytes, int64_t rows,
               int device);

// Waits until every kernel and copy issued to `device` has finished (and reports a failed one).
void synchronize(int device);

}  // namespace sl::cuda
