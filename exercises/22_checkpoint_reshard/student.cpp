// exercises/22_checkpoint_reshard/student.cpp — a checkpoint read under another layout than the save's.
//
// A tensor of global shape [d0, d1, ...] is saved as pieces; each piece is a Region
// (parallel/runner/state_pieces.h) and its elements:
//
//   region.offsets, region.lengths     a box of the global shape: dims [offsets[d], offsets[d] + lengths[d])
//   region.flat_begin, flat_end        a range of the box's row-major elements (last dimension fastest)
//   data[i]                            the box's element flat_begin + i
//
//   zero-3 over 4, weight [8, 6]:      box = the whole tensor, flat [0, 12), [12, 24), [24, 36), [36, 48)
//   tp 2, column parallel (rows):      rank 1: offsets {4, 0}, lengths {4, 6}, flat [0, 24)
//   tp 2, row parallel (columns):      rank 1: offsets {0, 3}, lengths {8, 3}, flat [0, 24)
//   tp 2 x zero 2:                     the tp box, flat [0, 12) and [12, 24) of it
//
// The reading rank needs `want` (a region of the same tensor under its own layout) as want.numel()
// elements, in want's own order. For each of them find a saved piece that holds it and copy it:
//
//   k in [want.flat_begin, want.flat_end)   index in want's box
//     -> box coordinates c[d]                unravel k over want.lengths (row-major)
//     -> global coordinates g[d] = want.offsets[d] + c[d]
//   in piece p when  p.offsets[d] <= g[d] < p.offsets[d] + p.lengths[d] for every d,  and its index j
//   in p's box (ravel g - p.offsets over p.lengths) lies in [p.flat_begin, p.flat_end):
//     out[k - want.flat_begin] = p.data[j - p.flat_begin]
//
// Elements no piece holds stay as they were (the caller sees want.numel() - filled of them missing).
// Regions come from files: refuse (throw sl::Error, tensor/error.h: SL_CHECK(cond, "what", ...)) any
// region whose dims differ from the shape's, whose box leaves the shape (negative offset or length,
// offset + length > dim) or whose range is not 0 <= flat_begin <= flat_end <= the box's elements, and
// any piece whose data or an `out` whose size does not match its region's numel().
// Element by element is fine (lesson 16 does it); row by row is faster. Do not call the library's
// copy_overlap or checkpoint::Reader: you are writing them.
//
// Grade it:  make exercise N=22
#include <cstdint>
#include <vector>

#include "exercises/22_checkpoint_reshard/saved_piece.h"
#include "exercises/grader.h"
#include "tensor/error.h"

namespace exercise22 {

// SavedPiece (saved_piece.h): a Region and its data, [region.numel()] floats.

// Fills out [want.numel()] with every element of `want` that a saved piece of this tensor (global
// `shape`) holds; returns how many elements it filled.
int64_t read_resharded(const std::vector<int64_t>& shape, const sl::parallel::Region& want,
                       const std::vector<SavedPiece>& saved, std::vector<float>& out) {
  // TODO: check every region and size, then walk want's elements and find each one's piece.
  throw exercises::NotImplemented("read_resharded");
}

}  // namespace exercise22
