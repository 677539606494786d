// regions.h — checking that saved pieces tile a tensor: no gaps, no overlaps, nothing outside it.
//
//   A piece's Region (parallel/runner/state_pieces.h) is a box of the global shape and a flat range
//   [flat_begin, flat_end) of the box's row-major elements. A flat range of a box is itself a few
//   boxes: a ragged head, whole slabs, a ragged tail, recursively — at most 2·ndim - 1 of them.
//
//     box [4, 6], flat [3, 20):   row 0  . . . █ █ █      head:  row 0, columns [3, 6)
//                                 row 1  █ █ █ █ █ █      slab:  rows [1, 3), every column
//                                 row 2  █ █ █ █ █ █
//                                 row 3  █ █ . . . .      tail:  row 3, columns [0, 2)
//
//   Boxes intersect by arithmetic (a product of interval overlaps), so two pieces share elements
//   exactly when two of their boxes intersect, and the pieces tile a tensor exactly when none share
//   an element, each lies inside the shape, and their element counts add up to the tensor's.
//   Every product here is overflow-checked: the numbers come from files we do not trust.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/runner/state_pieces.h"

namespace sl::parallel::checkpoint {

struct Box {
  std::vector<int64_t> lo, length;  // global coordinates
};

// Most pieces one tensor may have in a checkpoint (the tiling check compares pieces pairwise).
constexpr size_t kMaxPiecesPerTensor = 65536;
constexpr size_t kMaxDims = 16;

// The element count of a shape, or an Error (with `where`) if a size is negative or it overflows.
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where);
// Empty if the region is well formed inside `shape`; otherwise what is wrong, with the numbers.
std::string region_problem(const Region& region, const std::vector<int64_t>& shape);
// "offsets [0, 4] lengths [2, 4] flat [0, 8)"
std::string describe(const Region& region);
// The region's elements as disjoint, non-empty boxes (the region must be well formed).
std::vector<Box> boxes_of(const Region& region);
// How many elements two well-formed regions of one tensor share.
int64_t overlap_count(const Region& a, const Region& b);
// The smallest flat range [begin, end) of `source`'s box that holds every element it shares with
// `target` (inside source's own flat range); begin == end when they share nothing.
std::pair<int64_t, int64_t> overlap_span(const Region& source, const Region& target);

// Throws sl::Error naming `tensor` and the pieces (named by describe_piece(i)) unless `regions`
// tile `shape` exactly.
void check_tiling(const std::string& tensor, const std::vector<int64_t>& shape, const std::vector<Region>& regions,
                  const std::function<std::string(size_t)>& describe_piece);

}  // namespace sl::parallel::checkpoint
