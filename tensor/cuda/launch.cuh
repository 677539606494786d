// launch.cuh — what the kernels of tensor/cuda/*.cu share: launch sizes, device pointers, and the
// block-wide sums and maxima that the row kernels (softmax, layer norm, cross-entropy) are made of.
//
//   Elementwise kernels:  one thread per element, grid-stride loops (any n fits a bounded grid).
//   Row kernels:          one block of kRowThreads per row; each thread strides over the row, then
//                         block_reduce combines the threads' partial results:
//
//     thread t  ─ sums x[t], x[t + 256], ...  ─┐
//                                              ├─ warp_reduce (shuffles, 32 -> 1) ─ shared[warp] ─ warp 0 ─ total
//     thread t' ─ sums x[t'], ...             ─┘
#pragma once
#include <cstdint>
#include <limits>

#include "tensor/cuda/check.h"
#include "tensor/tensor.h"

namespace sl::cuda {

constexpr int kThreads = 256;     // threads per block of an elementwise kernel
constexpr int kRowThreads = 256;  // threads per block of a row kernel (a multiple of 32)

// Blocks for n elements at kThreads each, capped: the kernels' grid-stride loops cover the rest.
inline unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

// Row kernels launch one block per row; the grid's x dimension holds at most 2^31 - 1 blocks, so
// more rows than that go in several launches: launch(first_row, row_count) for each piece, every
// piece but the last a multiple of `group` rows (attention's [T, T] blocks stay whole).
constexpr int64_t kMaxRowsPerLaunch = 1 << 30;
template <typename Launch>
void for_row_chunks(int64_t rows, Launch&& launch, int64_t group = 1) {
  const int64_t chunk =
      group > 0 && group <= kMaxRowsPerLaunch ? kMaxRowsPerLaunch - kMaxRowsPerLaunch % group : kMaxRowsPerLaunch;
  for (int64_t first = 0; first < rows; first += chunk)
    launch(first, static_cast<unsigned>(rows - first < chunk ? rows - first : chunk));
}

// The GPU a tensor lives on becomes this thread's current CUDA device (kernels launch there).
inline void use_device_of(const Tensor& t) { SL_CUDA_CHECK(cudaSetDevice(t.device().index)); }

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// The grid-stride loop every elementwise kernel runs.
#define SL_FOR_EACH_INDEX(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
// NaN wins, as in the CPU loops' comparisons (a NaN anywhere in a row makes the row's result NaN).
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return (a != a || a > b) ? a : b;
  }
};

template <typename T, typename Op>
__device__ T warp_reduce(T value, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Combines one value from every thread of the block; every thread gets the result. All threads of
// the block must call it (it synchronises), and blockDim.x must be a multiple of 32.
template <typename T, typename Op>
__device__ T block_reduce(T value, Op op, T identity) {
  __shared__ T partial[32];
  __shared__ T result;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_reduce(value, op);
  __syncthreads();  // a previous call may still be reading partial and result
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    T combined = warp_reduce(lane < warps ? partial[lane] : identity, op);
    if (lane == 0) result = combined;
  }
  __syncthreads();
  return result;
}

// ---- column sums: [N, C] values summed over N, deterministically ----------------------------------
//
// A bias gradient (dy [N, C] -> [C]) has few columns and many rows: one thread per column would
// leave most of the GPU idle. So rows are cut into chunks; pass 1 gives each (chunk, column) a
// thread that sums value(n, c) over its chunk, pass 2 adds each column's chunk sums in chunk order.
// No atomics: the same bits on every run. Value and Store are small structs with __device__ calls:
//   value(n, c) -> Acc        store(c, total)

template <typename Acc, typename Value>
__global__ void column_chunk_sums_kernel(int64_t N, int64_t C, int64_t chunk_rows, Value value, Acc* partial) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t last = first + chunk_rows < N ? first + chunk_rows : N;
  Acc total = 0;
  for (int64_t n = first; n < last; ++n) total += value(n, c);
  partial[blockIdx.y * C + c] = total;
}

template <typename Acc, typename Store>
__global__ void column_chunk_totals_kernel(const Acc* partial, int64_t chunks, int64_t C, Store store) {
  SL_FOR_EACH_INDEX(c, C) {
    Acc total = 0;
    for (int64_t k = 0; k < chunks; ++k) total += partial[k * C + c];
    store(c, total);
  }
}

// Runs both passes on the GPU of `like`; partial sums live in a scratch tensor there.
template <typename Acc, typename Value, typename Store>
void column_sums(const Tensor& like, int64_t N, int64_t C, Value value, Store store) {
  if (C == 0) return;
  constexpr int64_t kMaxChunks = 65535;  // gridDim.y's limit
  const int64_t chunk_rows = N <= 32 * kMaxChunks ? 32 : (N + kMaxChunks - 1) / kMaxChunks;
  const int64_t chunks = N == 0 ? 1 : (N + chunk_rows - 1) / chunk_rows;
  Tensor partial = Tensor::empty(Shape{chunks, C}, TensorOptions(dtype_of<Acc>::value, like.device()));
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  column_chunk_sums_kernel<Acc><<<grid, kThreads>>>(N, C, chunk_rows, value, ptr<Acc>(partial));
  SL_CUDA_CHECK_LAUNCH();
  column_chunk_totals_kernel<Acc><<<blocks_for(C), kThreads>>>(ptr<const Acc>(partial), chunks, C, store);
  SL_CUDA_CHECK_LAUNCH();
}

template <typename T>
__device__ T block_sum(T value) {
  return block_reduce(value, SumOp{}, T(0));
}
template <typename T>
__device__ T block_max(T value) {
  return block_reduce(value, MaxOp{}, -std::numeric_limits<T>::infinity());
}

}  // namespace sl::cuda
