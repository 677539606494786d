// exercises/22_checkpoint_reshard/wrong_whole_wanted_box.cpp — a wrong plan_reads: the wanted region taken as its whole box.
//
// A common mistake: a wanted region is tested by its box only, as if it were a tp slice. Under tp x
// zero the region is a run [flat_begin, flat_end) of the tp box: the plan reads (and counts) the
// elements of the other zero ranks of the same tp slice. Whole-box regions plan right, which hides it.
// expect: your plan reads the whole wanted box
#include <algorithm>
#include <cstdint>
#include <vector>

#include "exercises/22_checkpoint_reshard/piece_read.h"
#include "exercises/grader.h"
#include "parallel/runner/state_pieces.h"
#include "tensor/error.h"

namespace exercise22 {

using sl::parallel::Region;

double predicted_bytes_read() { return 4.0 * (15 * 16 + 8) * 4; }  // 4 spans of 248 elements

std::vector<PieceRead> plan_reads(const std::vector<int64_t>& shape, const Region& want,
                                  const std::vector<Region>& saved, int64_t element_bytes) {
  const size_t dims = shape.size();
  auto check_region = [&](const Region& r) {
    SL_CHECK(r.offsets.size() == dims && r.lengths.size() == dims, "a region of ", r.offsets.size(), " dims");
    for (size_t d = 0; d < dims; ++d)
      SL_CHECK(r.offsets[d] >= 0 && r.lengths[d] >= 0 && r.offsets[d] + r.lengths[d] <= shape[d], "dim ", d,
               " of a region leaves [0, ", shape[d], ")");
    SL_CHECK(0 <= r.flat_begin && r.flat_begin <= r.flat_end && r.flat_end <= r.box_numel(), "a region's range [",
             r.flat_begin, ", ", r.flat_end, ") leaves its box of ", r.box_numel());
  };
  check_region(want);
  for (const Region& p : saved) check_region(p);
  SL_CHECK(element_bytes >= 1, "element_bytes ", element_bytes, " < 1");
  // The index of global coordinates g in region r's box when g is one of r's elements, else -1.
  auto index_in = [&](const Region& r, const std::vector<int64_t>& g, bool whole_box) -> int64_t {
    int64_t j = 0;
    for (size_t d = 0; d < dims; ++d) {
      if (g[d] < r.offsets[d] || g[d] >= r.offsets[d] + r.lengths[d]) return -1;
      j = j * r.lengths[d] + (g[d] - r.offsets[d]);
    }
    return whole_box || (j >= r.flat_begin && j < r.flat_end) ? j : -1;
  };
  std::vector<PieceRead> plan;
  std::vector<int64_t> g(dims);
  for (size_t i = 0; i < saved.size(); ++i) {
    const Region& p = saved[i];
    int64_t shared = 0, first = -1, last = -1;
    for (int64_t k = p.flat_begin; k < p.flat_end; ++k) {  // every element of the piece
      for (size_t d = dims, rest = static_cast<size_t>(k); d-- > 0; rest /= static_cast<size_t>(p.lengths[d]))
        g[d] = p.offsets[d] + static_cast<int64_t>(rest) % p.lengths[d];
      if (index_in(want, g, true) < 0) continue;
      ++shared;
      if (first < 0) first = k;
      last = k;
    }
    if (shared == 0) continue;
    plan.push_back({i, shared, (first - p.flat_begin) * element_bytes, (last + 1 - p.flat_begin) * element_bytes});
  }
  return plan;
}

}  // namespace exercise22
