// exercises/22_checkpoint_reshard/saved_piece.h — one saved piece of a tensor, shared by student.cpp and grader.cpp.
#pragma once
#include <vector>

#include "parallel/runner/state_pieces.h"

namespace exercise22 {

// What one rank of the saving layout wrote of one tensor: a region (a box of the global shape and a
// range [flat_begin, flat_end) of the box's row-major elements) and its elements, in that order.
struct SavedPiece {
  sl::parallel::Region region;
  std::vector<float> data;  // [region.numel()]
};

}  // namespace exercise22
