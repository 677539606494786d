// broadcast.h — walking an output and the operands that broadcast to it, one contiguous row at a time.
//
// NumPy broadcasting aligns shapes on the right; where an operand has size 1, or no dim at all, it
// repeats, which is a stride of 0. Walking element by element with an index per dim would cost a
// division (or an odometer step) per element, so the walk first shrinks the loop nest:
//
//   * output dims of size 1 move nothing and are dropped;
//   * a dim merges into the one before it when every operand walks the pair as one run:
//     outer stride == inner stride * inner size for each operand (an operand held along both, 0 and 0,
//     passes too).
//
// What is left is a few outer dims stepped like an odometer, and an inner row where each operand's
// step is 1 (it walks) or 0 (one element held for the whole row). Two examples, the output as operand 0:
//
//   out [2, 3, 4] = a [2, 3, 4] + bias [4]      strides  out 12 4 1   a 12 4 1   bias 0 0 1
//     dims 0 and 1 merge (bias: 0 == 0 * 3); dim 2 cannot join them (bias: 0 != 1 * 4)
//     -> 6 rows of 4; bias starts every row at offset 0 and walks it (step 1)
//
//   out [2, 3, 4] = a [2, 3, 4] * scale [3, 1]  strides  out 12 4 1   a 12 4 1   scale 0 1 0
//     nothing merges (scale: 0 != 1 * 3, 1 != 0 * 4)
//     -> 6 rows of 4; scale's offset steps 0, 1, 2, 0, 1, 2 and stays put along each row (step 0)
//
// A [B, NH, T, T] attention score with a [T, T] mask is B*NH rows of T*T elements.
// Used by tensor/ops/binary.cpp (add, mul, ... and sum_to) and tensor/ops/select.cpp (masked_fill, where).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "tensor/error.h"
#include "tensor/shape.h"

namespace sl::cpu {

// Walks `out` in row-major order together with N contiguous operands that broadcast to it. Operand
// 0 is often the output itself, whose offset is then the running element index.
template <int N>
class BroadcastWalk {
 public:
  using Offsets = std::array<int64_t, N>;

  BroadcastWalk(const Shape& out, const std::array<Shape, N>& operands) : numel_(out.numel()) {
    std::array<std::vector<int64_t>, N> operand_strides;
    for (int k = 0; k < N; ++k) operand_strides[k] = contiguous_strides(operands[k]);
    for (int d = 0; d < out.dim(); ++d) {
      if (out[d] == 1) continue;  // a size-1 dim moves no operand
      Offsets stride{};
      for (int k = 0; k < N; ++k) {
        int od = d - (out.dim() - operands[k].dim());  // operands are right-aligned
        stride[k] = od < 0 || operands[k][od] == 1 ? 0 : operand_strides[k][od];
      }
      bool mergeable = !sizes_.empty();
      for (int k = 0; k < N && mergeable; ++k) mergeable = strides_.back()[k] == stride[k] * out[d];
      if (mergeable) {
        sizes_.back() *= out[d];
        strides_.back() = stride;
      } else {
        sizes_.push_back(out[d]);
        strides_.push_back(stride);
      }
    }
    if (sizes_.empty()) {  // a single element
      sizes_.push_back(1);
      strides_.push_back(Offsets{});
    }
    for (int k = 0; k < N; ++k) SL_ASSERT(strides_.back()[k] <= 1);  // a row is walked or held, never strided
  }

  // Calls row(offsets, length, steps) once per row, in output order: the row's elements are at
  // offsets[k] + i * steps[k] in operand k, for i in [0, length); each step is 1 or 0.
  template <typename F>
  void for_each_row(F&& row) const {
    if (numel_ == 0) return;
    const int outer = static_cast<int>(sizes_.size()) - 1;
    // Locals, not members: row() is usually an opaque call, after which members would be re-read
    // (measured: sum_to to [B, T, 1] about 20% slower).
    const int64_t length = sizes_.back();
    const Offsets steps = strides_.back();
    const int64_t* sizes = sizes_.data();
    const Offsets* strides = strides_.data();
    std::vector<int64_t> index(outer, 0);
    Offsets offsets{};
    for (int64_t r = 0, rows = numel_ / length; r < rows; ++r) {
      row(offsets, length, steps);
      for (int d = outer - 1; d >= 0; --d) {  // odometer step over the outer dims
        for (int k = 0; k < N; ++k) offsets[k] += strides[d][k];
        if (++index[d] < sizes[d]) break;
        for (int k = 0; k < N; ++k) offsets[k] -= strides[d][k] * sizes[d];
        index[d] = 0;
      }
    }
  }

 private:
  int64_t numel_;
  std::vector<int64_t> sizes_;    // the merged dims, outermost first; the last is the row
  std::vector<Offsets> strides_;  // per merged dim, each operand's element stride (0: repeated)
};

// Is `small` (leading 1s ignored) a trailing part of `big`, like [C] or [1, T, C] of [B, T, C]? Then
// broadcasting is plain repetition: small[j] pairs with big[i] for j = i % small.numel(), with no walk.
inline bool is_trailing_part(const Shape& small, const Shape& big) {
  int first = 0;
  while (first < small.dim() && small[first] == 1) ++first;
  int len = small.dim() - first;
  if (len > big.dim()) return false;
  for (int j = 0; j < len; ++j)
    if (small[first + j] != big[big.dim() - len + j]) return false;
  return true;
}

}  // namespace sl::cpu
