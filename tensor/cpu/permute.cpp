// permute.cpp — the permute copy (see permute.h): plan a loop nest, then memcpy runs or tiled transposes.
#include "tensor/cpu/permute.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tensor/error.h"

namespace sl::cpu {

namespace {

// ---- planning the loop nest ----------------------------------------------------------------------------

// The output dims in order, each with its size, its stride in the input and its stride in the
// (contiguous) output. Size-1 dims are dropped and neighbours that stay adjacent in the input are
// merged, so [B,T,NH,HS] -> [B,NH,T,HS] is the nest [B, NH, T] of runs of HS elements.
struct LoopNest {
  std::vector<int64_t> sizes, in_strides, out_strides;
  int dim() const { return static_cast<int>(sizes.size()); }
};

LoopNest plan_permute(const Shape& in_shape, const std::vector<int>& perm) {
  std::vector<int64_t> in_strides = contiguous_strides(in_shape);
  LoopNest nest;
  for (int d : perm) {
    int64_t size = in_shape[d], stride = in_strides[d];
    if (size == 1) continue;
    if (!nest.sizes.empty() && nest.in_strides.back() == stride * size) {  // the outer dim continues this one
      nest.sizes.back() *= size;
      nest.in_strides.back() = stride;
    } else {
      nest.sizes.push_back(size);
      nest.in_strides.push_back(stride);
    }
  }
  if (nest.sizes.empty()) nest = {{1}, {1}, {}};  // one element
  nest.out_strides = contiguous_strides(Shape(nest.sizes));
  return nest;
}

// Calls body(in_offset, out_offset) for every index of the nest dims `dims` (the first slowest),
// stepping both offsets like an odometer instead of dividing.
template <typename Body>
void for_each_index(const LoopNest& nest, const std::vector<int>& dims, Body&& body) {
  std::vector<int64_t> index(dims.size(), 0);
  int64_t in = 0, out = 0;
  for (;;) {
    body(in, out);
    int d = static_cast<int>(dims.size()) - 1;
    for (; d >= 0; --d) {
      int k = dims[d];
      in += nest.in_strides[k];
      out += nest.out_strides[k];
      if (++index[d] < nest.sizes[k]) break;
      in -= nest.in_strides[k] * nest.sizes[k];
      out -= nest.out_strides[k] * nest.sizes[k];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// ---- the two copies --------------------------------------------------------------------------------------

// A 2-D transpose of single elements, out[i*out_r + j] = in[i + j*in_c] (i < rows, j < cols), in
// 16 KiB tiles so that the strided side stays in cache. Out of line (noinline): inlined into the
// loop nest, GCC ran out of registers and reloaded the strides inside the innermost loop (1.6x slower).
template <typename E>
[[gnu::noinline]] void transpose_tiled(const E* in, int64_t in_c, E* out, int64_t out_r, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = sizeof(E) >= 8 ? 32 : 64;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    int64_t i1 = std::min(i0 + kTile, rows);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      int64_t j1 = std::min(j0 + kTile, cols);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) out[i * out_r + j] = in[i + j * in_c];
    }
  }
}

template <typename E>
void permute_kernel(const E* in, E* out, const LoopNest& nest) {
  int n = nest.dim();
  std::vector<int> outer;
  if (nest.in_strides[n - 1] == 1) {
    // The innermost dim is contiguous on both sides: one memcpy per run. Attention's
    // [B,T,NH,HS] <-> [B,NH,T,HS] is B*NH*T runs of HS; with runs that long, the loop order
    // hardly matters (measured: within 2x of one big memcpy either way).
    int64_t run_bytes = nest.sizes[n - 1] * static_cast<int64_t>(sizeof(E));
    for (int d = 0; d < n - 1; ++d) outer.push_back(d);
    for_each_index(nest, outer, [&](int64_t in_offset, int64_t out_offset) {
      std::memcpy(out + out_offset, in + in_offset, static_cast<size_t>(run_bytes));
    });
    return;
  }
  // Single elements ([..., T, HS] -> [..., HS, T], or any permute that moves the last dim): tile the
  // dim that is contiguous in the input (r) against the one contiguous in the output (the last).
  int r = n - 2;
  while (r > 0 && nest.in_strides[r] != 1) --r;
  SL_ASSERT(nest.in_strides[r] == 1);
  for (int d = 0; d < n - 1; ++d)
    if (d != r) outer.push_back(d);
  for_each_index(nest, outer, [&](int64_t in_offset, int64_t out_offset) {
    transpose_tiled(in + in_offset, nest.in_strides[n - 1], out + out_offset, nest.out_strides[r], nest.sizes[r],
                    nest.sizes[n - 1]);
  });
}

}  // namespace

// The copy is dtype-blind: only the element size matters.
void permute_copy(const void* in, const Shape& in_shape, const std::vector<int>& perm, void* out, size_t element_size) {
  LoopNest nest = plan_permute(in_shape, perm);
  auto run = [&](auto element) {
    using E = decltype(element);
    permute_kernel(static_cast<const E*>(in), static_cast<E*>(out), nest);
  };
  switch (element_size) {
    case 2:
      run(uint16_t{});
      break;
    case 4:
      run(uint32_t{});
      break;
    case 8:
      run(uint64_t{});
      break;
    default:
      SL_ASSERT(false);
  }
}

}  // namespace sl::cpu
