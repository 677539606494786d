// exercises/22_checkpoint_reshard/wrong_box_unchecked.cpp — a wrong read_resharded: a box outside the tensor accepted.
//
// A common mistake: checking a region's dims and its flat range against its own box, but not the
// box against the tensor. A region comes from a file (or from a layout computed for another model
// size): rows [6, 10) of an 8-row weight is a corrupt or mismatched checkpoint, and reading it
// silently leaves half the rank's weights unset. Refuse it before reading anything.
// expect: a wanted box of rows [6, 10) in a tensor of 8 rows was accepted
#include <cstdint>
#include <vector>

#include "exercises/22_checkpoint_reshard/saved_piece.h"
#include "exercises/grader.h"
#include "tensor/error.h"

namespace exercise22 {

int64_t read_resharded(const std::vector<int64_t>& shape, const sl::parallel::Region& want,
                       const std::vector<SavedPiece>& saved, std::vector<float>& out) {
  const size_t dims = shape.size();
  auto check_region = [&](const sl::parallel::Region& r) {
    SL_CHECK(r.offsets.size() == dims && r.lengths.size() == dims, "a region of ", r.offsets.size(), " dims");
    // the mistake: no check that offsets[d] >= 0 and offsets[d] + lengths[d] <= shape[d]
    SL_CHECK(0 <= r.flat_begin && r.flat_begin <= r.flat_end && r.flat_end <= r.box_numel(), "a region's range [",
             r.flat_begin, ", ", r.flat_end, ") leaves its box of ", r.box_numel());
  };
  check_region(want);
  SL_CHECK(static_cast<int64_t>(out.size()) == want.numel(), "out holds ", out.size(), " for ", want.numel());
  for (const SavedPiece& p : saved) {
    check_region(p.region);
    SL_CHECK(static_cast<int64_t>(p.data.size()) == p.region.numel(), "a piece's data holds ", p.data.size());
  }
  int64_t filled = 0;
  std::vector<int64_t> g(dims);
  for (int64_t k = want.flat_begin; k < want.flat_end; ++k) {
    for (size_t d = dims, rest = static_cast<size_t>(k); d-- > 0; rest /= static_cast<size_t>(want.lengths[d]))
      g[d] = want.offsets[d] + static_cast<int64_t>(rest) % want.lengths[d];
    for (const SavedPiece& p : saved) {
      int64_t j = 0;  // g's index in p's box
      bool inside = true;
      for (size_t d = 0; d < dims && inside; ++d) {
        const int64_t c = g[d] - p.region.offsets[d];
        inside = c >= 0 && c < p.region.lengths[d];
        j = j * p.region.lengths[d] + c;
      }
      if (!inside || j < p.region.flat_begin || j >= p.region.flat_end) continue;
      out[static_cast<size_t>(k - want.flat_begin)] = p.data[static_cast<size_t>(j - p.region.flat_begin)];
      ++filled;
      break;
    }
  }
  return filled;
}

}  // namespace exercise22
