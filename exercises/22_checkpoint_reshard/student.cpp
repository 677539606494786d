// exercises/22_checkpoint_reshard/student.cpp — the read plan of a checkpoint loaded under another layout.
//
// A tensor of global shape [d0, d1, ...] is saved as pieces; each piece is a Region
// (parallel/runner/state_pieces.h) and, in a shard file, its region.numel() elements in order:
//
//   region.offsets, region.lengths     a box of the global shape: dims [offsets[d], offsets[d] + lengths[d])
//   region.flat_begin, flat_end        a range of the box's row-major elements (last dimension fastest)
//   the piece's data, element i        the box's element flat_begin + i, at bytes [i·eb, (i + 1)·eb)
//
//   zero-3 over 4, weight [8, 6]:      box = the whole tensor, flat [0, 12), [12, 24), [24, 36), [36, 48)
//   tp 2, column parallel (rows):      rank 1: offsets {4, 0}, lengths {4, 6}, flat [0, 24)
//   tp 2, row parallel (columns):      rank 1: offsets {0, 3}, lengths {8, 3}, flat [0, 24)
//   tp 2 x zero 2:                     the tp box, flat [0, 12) and [12, 24) of it
//
// Lesson 16 fills a wanted region element by element from pieces already in memory. A loader does not
// read whole shard files: before it opens one, it plans, for the region `want` it needs, which saved
// pieces share elements with it and which bytes of each to read. One contiguous range per piece (one
// read call): the smallest one that holds every shared element, so it may hold elements `want` does
// not need. Reading rows [4, 8) of a weight [8, 6] saved by zero-3 over 4 is exact (pieces 2 and 3,
// all their bytes); reading columns [3, 6) is not: of piece 0 (elements [0, 12): rows 0 and 1) it
// needs (0, 3), (0, 4), (0, 5), (1, 3), (1, 4), (1, 5), 6 elements, and must read from (0, 3) to
// (1, 5): elements [3, 12) of the piece, bytes [12, 48) in f32.
//
//   for each saved piece p, in order:
//     the elements it shares with want: inside both boxes, and at an index in [flat_begin, flat_end)
//     of both boxes' ranges;  none: p is not in the plan
//     elements = how many;  [first, last] = the smallest and largest of their indices in p's box
//     byte_begin = (first - p.flat_begin)·eb,  byte_end = (last + 1 - p.flat_begin)·eb
//
// Walking p's elements and asking lesson 16's question of each (is it in want?) is fine; box
// arithmetic is faster. Regions come from files: refuse (throw sl::Error, tensor/error.h:
// SL_CHECK(cond, "what", ...)) any region, wanted or saved, whose dims differ from the shape's, whose
// box leaves the shape (negative offset or length, offset + length > dim) or whose range is not
// 0 <= flat_begin <= flat_end <= the box's elements, and an element_bytes < 1.
// Do not call the library's overlap_span or checkpoint::Reader: you are writing them.
//
// Grade it:  make exercise N=22
#include <cstdint>
#include <vector>

#include "exercises/22_checkpoint_reshard/piece_read.h"
#include "exercises/grader.h"
#include "parallel/runner/state_pieces.h"
#include "tensor/error.h"

namespace exercise22 {

// PREDICT FIRST, before any code. The weight h.0.mlp.c_fc.weight [64, 16] (f32) is saved by ZeRO-3
// over 4 ranks: 4 flat shards of 256 elements (16 whole rows each). The run resumes under tp 2, and
// its row-parallel rank 1 needs columns [8, 16), all 64 rows: 512 elements. How many bytes of the
// shard files does the library's checkpoint::Reader read to fill it? Replace the throw with your
// number; the grader saves the checkpoint and counts.
double predicted_bytes_read() { throw exercises::NotImplemented("predicted_bytes_read (predict first)"); }

// The read plan of `want` (a region of the tensor of global `shape`) from the `saved` pieces' regions,
// element_bytes per element: one PieceRead per piece that shares an element with want, in saved order.
std::vector<PieceRead> plan_reads(const std::vector<int64_t>& shape, const sl::parallel::Region& want,
                                  const std::vector<sl::parallel::Region>& saved, int64_t element_bytes) {
  // TODO: check every region, then for each piece the shared elements' count and index span.
  throw exercises::NotImplemented("plan_reads");
}

}  // namespace exercise22
