// runtime.cu — devices, copies and errors (see runtime.h); the allocator is allocator.cu.
#include <mutex>
#include <vector>

#include "tensor/cuda/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda_info.h"
#include "tensor/error.h"

namespace sl::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  throw Error(detail::concat(file, ":", line, ": ", call, " failed: ", cudaGetErrorString(status), " (",
                             cudaGetErrorName(status), ")"));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(detail::concat(file, ":", line, ": ", call, " failed: ", cublasGetStatusName(status), " (",
                             cublasGetStatusString(status), ")"));
}

namespace {
// What the runtime said the first time it was asked; GPUs do not come and go while we run.
const CudaInfo& info() {
  static const CudaInfo found = cuda_info();
  return found;
}
}  // namespace

int device_count() { return info().device_count; }

void require_device(Device device, const char* what) {
  if (!device.is_cuda()) return;
  const CudaInfo& found = info();
  SL_CHECK(found.device_count > 0, what, " on ", device,
           ": shardlab was built with CUDA, but cudaGetDeviceCount found no device", found.error.empty() ? "" : " (",
           found.error, found.error.empty() ? "" : ")");
  SL_CHECK(device.index >= 0 && device.index < found.device_count, what, " on ", device, ": this machine has ",
           found.device_count, " CUDA device", found.device_count == 1 ? "" : "s",
           " (cuda:0 to cuda:", found.device_count - 1, ")");
}

namespace {
// Lets GPU `to` read and write GPU `from` directly (NVLink or PCIe), once per pair, when it can;
// otherwise cudaMemcpyPeer stages the copy through the host by itself.
void enable_peer_access(int to, int from) {
  static std::mutex mutex;
  static std::vector<std::vector<bool>> tried;
  std::lock_guard lock(mutex);
  const int n = device_count();
  if (tried.empty()) tried.assign(n, std::vector<bool>(n, false));
  if (tried[to][from]) return;
  tried[to][from] = true;
  int can = 0;
  SL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, to, from));
  if (!can) return;
  SL_CUDA_CHECK(cudaSetDevice(to));
  cudaError_t status = cudaDeviceEnablePeerAccess(from, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled)
    cudaGetLastError();
  else
    SL_CUDA_CHECK(status);
}
}  // namespace

void copy(void* to, Device to_device, const void* from, Device from_device, size_t bytes) {
  if (bytes == 0) return;
  if (to_device.is_cuda() && from_device.is_cuda()) {
    if (to_device.index == from_device.index) {
      SL_CUDA_CHECK(cudaSetDevice(to_device.index));
      SL_CUDA_CHECK(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice));
    } else {
      enable_peer_access(to_device.index, from_device.index);
      SL_CUDA_CHECK(cudaMemcpyPeer(to, to_device.index, from, from_device.index, bytes));
    }
    return;
  }
  // One side is the host: plain cudaMemcpy, which waits for the GPU's earlier work on the data.
  SL_CUDA_CHECK(cudaSetDevice(to_device.is_cuda() ? to_device.index : from_device.index));
  SL_CUDA_CHECK(cudaMemcpy(to, from, bytes, to_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
}

void copy_rows(void* to, int64_t to_pitch, const void* from, int64_t from_pitch, int64_t row_bytes, int64_t rows,
               int device) {
  if (row_bytes == 0 || rows == 0) return;
  SL_CUDA_CHECK(cudaSetDevice(device));
  // The 2-D calls take pitches below the device's limit (2^31 bytes); one row needs no pitch, and
  // larger pitches (a slab of a tensor over 2 GiB) go row by row.
  int max_pitch = 0;
  SL_CUDA_CHECK(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device));
  if (rows > 1 && to_pitch <= max_pitch && from_pitch <= max_pitch) {
    if (from == nullptr)
      SL_CUDA_CHECK(cudaMemset2DAsync(to, to_pitch, 0, row_bytes, rows, cudaStreamLegacy));
    else
      SL_CUDA_CHECK(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice,
                                      cudaStreamLegacy));
    return;
  }
  for (int64_t row = 0; row < rows; ++row) {
    char* row_to = static_cast<char*>(to) + row * to_pitch;
    if (from == nullptr)
      SL_CUDA_CHECK(cudaMemsetAsync(row_to, 0, row_bytes, cudaStreamLegacy));
    else
      SL_CUDA_CHECK(cudaMemcpyAsync(row_to, static_cast<const char*>(from) + row * from_pitch, row_bytes,
                                    cudaMemcpyDeviceToDevice, cudaStreamLegacy));
  }
}

void synchronize(int device) {
  SL_CUDA_CHECK(cudaSetDevice(device));
  SL_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace sl::cuda
