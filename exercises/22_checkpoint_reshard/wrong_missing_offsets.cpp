// exercises/22_checkpoint_reshard/wrong_missing_offsets.cpp — a wrong read_resharded: the box's offsets forgotten.
//
// A common mistake: unravelling k over want.lengths and using those box coordinates as if they were
// the tensor's. They are relative to the box: tp rank 1's rows [4, 8) start at want.offsets = {4, 0},
// and without the offsets rank 1 reads rows [0, 4), rank 0's weights. Rank 0 (offsets 0) reads right,
// which hides the slip until a rank whose box does not start at the origin resumes.
// expect: Your global coordinates lack want.offsets
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
    for (size_t d = 0; d < dims; ++d)
      SL_CHECK(r.offsets[d] >= 0 && r.lengths[d] >= 0 && r.offsets[d] + r.lengths[d] <= shape[d], "dim ", d,
               " of a region leaves [0, ", shape[d], ")");
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
      g[d] = static_cast<int64_t>(rest) % want.lengths[d];  // the mistake: + want.offsets[d] is missing
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
