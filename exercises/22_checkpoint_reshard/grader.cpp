// exercises/22_checkpoint_reshard/grader.cpp — grades the resharding read (student.cpp).
//
// A tensor whose element at global flat index i holds i + 1 (exact in f32) is cut into the pieces of a
// saving layout (the grader's own index arithmetic: zero-3 flat shards of a padded buffer, tp boxes,
// tp boxes cut into zero runs); every region a loading layout needs must come back exactly as the
// full tensor's slice, elements no piece holds untouched, and bad regions refused with sl::Error.
// With -DSL_SOLUTION the library's copy_overlap and checkpoint::region_problem stand in.
#include "exercises/grader.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "exercises/22_checkpoint_reshard/saved_piece.h"
#include "parallel/checkpoint/regions.h"

using namespace sl;
using exercise22::SavedPiece;
using exercises::expect;
using sl::parallel::Region;
using Shape_ = std::vector<int64_t>;

namespace exercise22 {
int64_t read_resharded(const Shape_& shape, const Region& want, const std::vector<SavedPiece>& saved,
                       std::vector<float>& out);
}  // namespace exercise22

#ifdef SL_SOLUTION
namespace solution {
int64_t read_resharded(const Shape_& shape, const Region& want, const std::vector<SavedPiece>& saved,
                       std::vector<float>& out) {
  const std::string problem = parallel::checkpoint::region_problem(want, shape);
  SL_CHECK(problem.empty(), "the wanted region ", parallel::checkpoint::describe(want), ": ", problem);
  SL_CHECK(static_cast<int64_t>(out.size()) == want.numel(), "out holds ", out.size(), " for ", want.numel());
  for (const SavedPiece& piece : saved) {
    const std::string bad = parallel::checkpoint::region_problem(piece.region, shape);
    SL_CHECK(bad.empty(), "a saved piece ", parallel::checkpoint::describe(piece.region), ": ", bad);
    SL_CHECK(static_cast<int64_t>(piece.data.size()) == piece.region.numel(), "a saved piece's data holds ",
             piece.data.size(), " for ", piece.region.numel());
  }
  int64_t filled = 0;
  for (const SavedPiece& piece : saved)
    filled += parallel::copy_overlap(want, out.data(), piece.region, piece.data.data(), sizeof(float));
  return filled;
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise22;
#endif

// ---- the grader's own layouts ---------------------------------------------------------------------------
static int64_t numel_of(const Shape_& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
static Region whole(const Shape_& shape, int64_t begin, int64_t end) {
  return Region{Shape_(shape.size(), 0), shape, begin, end};
}
// The tensor at `offset` in a flat buffer of `buffer` elements, padded to a multiple of n and cut into n
// shards of S: each shard's run inside the tensor (empty runs left out). ZeRO-3 / FSDP's pieces.
static std::vector<Region> flat_shards(const Shape_& shape, int n, int64_t offset = 0, int64_t buffer = -1) {
  const int64_t numel = numel_of(shape), total = buffer < 0 ? numel : buffer, S = (total + n - 1) / n;
  std::vector<Region> runs;
  for (int r = 0; r < n; ++r) {
    const int64_t begin = std::max(r * S, offset) - offset, end = std::min((r + 1) * S, offset + numel) - offset;
    if (begin < end) runs.push_back(whole(shape, begin, end));
  }
  return runs;
}
// Tensor parallelism's slice of rank r of tp along dim: a whole box.
static Region tp_box(const Shape_& shape, size_t dim, int tp, int r) {
  Region box = whole(shape, 0, 0);
  box.lengths[dim] = shape[dim] / tp;
  box.offsets[dim] = r * box.lengths[dim];
  box.flat_end = box.box_numel();
  return box;
}
// A box cut into n flat runs (tp x zero: the zero shards of a tp rank's slice), as flat_shards cuts a tensor.
static std::vector<Region> runs_of_box(const Region& box, int n) {
  std::vector<Region> runs;
  const int64_t S = (box.box_numel() + n - 1) / n;
  for (int r = 0; r < n; ++r) {
    Region run = box;
    run.flat_begin = std::min(r * S, box.box_numel()), run.flat_end = std::min((r + 1) * S, box.box_numel());
    if (run.numel() > 0) runs.push_back(run);
  }
  return runs;
}

// The global flat index of element k of a region's box.
static int64_t global_index(const Shape_& shape, const Region& region, int64_t k) {
  Shape_ at(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d)
    at[d] = region.offsets[d] + k % region.lengths[d], k /= region.lengths[d];
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + at[d];
  return index;
}
static std::string coordinates(const Shape_& shape, int64_t flat) {
  std::string text;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    text = std::to_string(flat % shape[d]) + (text.empty() ? "" : ", ") + text;
    flat /= shape[d];
  }
  return "[" + text + "]";
}
// The full tensor's elements of a region (value i + 1 at global flat index i).
static std::vector<float> cut(const Shape_& shape, const Region& region) {
  std::vector<float> data;
  for (int64_t k = region.flat_begin; k < region.flat_end; ++k)
    data.push_back(static_cast<float>(global_index(shape, region, k) + 1));
  return data;
}
static std::vector<SavedPiece> save(const Shape_& shape, const std::vector<Region>& regions) {
  std::vector<SavedPiece> pieces;
  for (const Region& region : regions) pieces.push_back({region, cut(shape, region)});
  return pieces;
}
static std::string describe(const Region& r) { return parallel::checkpoint::describe(r); }

// Says what is wrong with element i of `got` (want's order): which element it holds, and the likely slip.
static std::string diagnose(const Shape_& shape, const Region& want, const std::vector<SavedPiece>& saved, size_t i,
                            float got) {
  const int64_t expected = global_index(shape, want, want.flat_begin + static_cast<int64_t>(i));
  std::string text =
      "in " + describe(want) + ", element " + std::to_string(i) + " (global " + coordinates(shape, expected) + ") ";
  if (std::isnan(got))
    return text +
           "was never written, yet a saved piece holds it: an element is in a piece when it is inside the "
           "piece's box in every dimension AND its index in that box lies in [flat_begin, flat_end)";
  const int64_t held = static_cast<int64_t>(got) - 1;
  text += "holds global " + coordinates(shape, held) + "'s value. ";
  Region at_origin = want;
  at_origin.offsets.assign(shape.size(), 0);
  if (held == global_index(shape, at_origin, want.flat_begin + static_cast<int64_t>(i)))
    return text +
           "Your global coordinates lack want.offsets: the box's coordinates c[d] sit at want.offsets[d] + c[d] "
           "in the tensor";
  if (held == want.flat_begin + static_cast<int64_t>(i))
    return text +
           "You used the index in your box as a global flat index: unravel it over want.lengths, add "
           "want.offsets, then ravel over the global shape";
  for (const SavedPiece& piece : saved) {
    if (piece.region.flat_begin != 0 && std::abs(held - expected) == piece.region.flat_begin)
      return text + "It is off by a saved piece's flat_begin (" + std::to_string(piece.region.flat_begin) +
             "): an element's place in a piece's data is its index in the piece's box MINUS flat_begin";
  }
  if (want.flat_begin != 0 && std::abs(held - global_index(shape, want, static_cast<int64_t>(i))) == 0)
    return text + "Your region starts at flat_begin " + std::to_string(want.flat_begin) +
           ": out[i] is the box's element flat_begin + i, not element i";
  return text + "Check the row-major (last dimension fastest) index arithmetic of both boxes";
}

// Loads every wanted region from the saved pieces; each must equal the full tensor's slice exactly.
static void expect_resharded(const Shape_& shape, const std::vector<Region>& saved_regions,
                             const std::vector<Region>& wanted, const std::string& layouts) {
  const std::vector<SavedPiece> saved = save(shape, saved_regions);
  for (const Region& want : wanted) {
    std::vector<float> out(static_cast<size_t>(want.numel()), NAN);
    const int64_t filled = impl::read_resharded(shape, want, saved, out);
    const std::vector<float> expected = cut(shape, want);
    for (size_t i = 0; i < out.size(); ++i)
      if (!(out[i] == expected[i])) expect(false, layouts + ": " + diagnose(shape, want, saved, i, out[i]));
    expect(filled == want.numel(), layouts + ": " + describe(want) +
                                       " is filled correctly but read_resharded returned " + std::to_string(filled) +
                                       " elements filled, not " + std::to_string(want.numel()) +
                                       (filled > want.numel() ? ": count each element once" : ""));
  }
}

// The call must throw sl::Error; anything else (no throw, another exception) fails with `what`.
static void expect_refused(const Shape_& shape, const Region& want, const std::vector<SavedPiece>& saved,
                           size_t out_size, const std::string& what) {
  std::vector<float> out(out_size, NAN);
  try {
    impl::read_resharded(shape, want, saved, out);
  } catch (const exercises::NotImplemented&) {
    throw;
  } catch (const sl::Error&) {
    return;
  } catch (const std::exception& e) {
    expect(false, what + ": it threw " + e.what() + " instead of sl::Error (SL_CHECK(condition, \"message\"))");
  }
  expect(false, what + " was accepted: check it before reading or writing anything, and throw sl::Error");
}

int main() {
  exercises::Grader grader("22_checkpoint_reshard");
  const Shape_ fc = {8, 6};  // a c_fc-like weight [4C, C]
  grader.check("zero-3 flat shards over 4 -> tp 2 column-parallel boxes (rows), exact", [&] {
    expect_resharded(fc, flat_shards(fc, 4), {tp_box(fc, 0, 2, 0), tp_box(fc, 0, 2, 1)}, "zero-3 x4 -> tp 2 rows");
  });
  grader.check("zero-3 flat shards over 4 -> tp 2 row-parallel boxes (columns), exact", [&] {
    expect_resharded(fc, flat_shards(fc, 4), {tp_box(fc, 1, 2, 0), tp_box(fc, 1, 2, 1)}, "zero-3 x4 -> tp 2 columns");
  });
  grader.check("tp 2 boxes -> uneven flat shards of a buffer the tensor shares (bias [6] first, padded), exact", [&] {
    // Buffer [bias 6 | weight 48] = 54 over 4: S = 14, the weight's runs [0, 8) [8, 22) [22, 36) [36, 48).
    expect_resharded(fc, {tp_box(fc, 1, 2, 0), tp_box(fc, 1, 2, 1)}, flat_shards(fc, 4, 6, 54),
                     "tp 2 columns -> zero-3 x4 of [bias | weight]");
  });
  grader.check("tp 2 x zero 2 (runs inside tp boxes) -> tp 3 row boxes cut in zero 2 runs, exact", [&] {
    const Shape_ rows = {12, 6};  // tp 2 along columns, each box in 2 zero runs -> tp 3 along rows, 2 runs each
    std::vector<Region> saved, wanted;
    for (int r = 0; r < 2; ++r)
      for (const Region& run : runs_of_box(tp_box(rows, 1, 2, r), 2)) saved.push_back(run);
    for (int r = 0; r < 3; ++r)
      for (const Region& run : runs_of_box(tp_box(rows, 0, 3, r), 2)) wanted.push_back(run);
    expect_resharded(rows, saved, wanted, "tp 2 x zero 2 -> tp 3 x zero 2");
  });
  grader.check("a 3-d tensor [2, 4, 6]: boxes along the middle dimension -> flat shards over 3, exact", [&] {
    const Shape_ qkv = {2, 4, 6};
    expect_resharded(qkv, {tp_box(qkv, 1, 2, 0), tp_box(qkv, 1, 2, 1)}, flat_shards(qkv, 3), "tp 2 (dim 1) -> zero x3");
    expect_resharded(qkv, flat_shards(qkv, 5), runs_of_box(tp_box(qkv, 2, 3, 1), 2),
                     "zero x5 -> tp 3 (dim 2) x zero 2");
  });
  grader.check("7 uneven flat shards -> 5 uneven flat shards, and back, exact", [&] {
    expect_resharded(fc, flat_shards(fc, 7), flat_shards(fc, 5), "zero x7 -> zero x5");
    expect_resharded(fc, flat_shards(fc, 5, 3, 51), flat_shards(fc, 7), "zero x5 (offset 3) -> zero x7");
  });
  grader.check("a saved piece missing: the count filled says so, uncovered elements stay untouched", [&] {
    std::vector<Region> shards = flat_shards(fc, 4);
    shards.erase(shards.begin() + 2);  // rank 2's run [24, 36): rows 4 and 5
    const std::vector<SavedPiece> saved = save(fc, shards);
    const Region want = tp_box(fc, 0, 2, 1);  // rows [4, 8): global [24, 48), half of it lost
    std::vector<float> out(24, NAN);
    const int64_t filled = impl::read_resharded(fc, want, saved, out);
    for (size_t i = 0; i < out.size(); ++i) {
      if (i < 12)
        expect(std::isnan(out[i]), "element " + std::to_string(i) + " of " + describe(want) + " (global " +
                                       coordinates(fc, 24 + i) + ") is in no saved piece, yet it was written (" +
                                       std::to_string(out[i]) + "): leave uncovered elements alone");
      else
        expect(out[i] == 25.0f + i, "with a piece missing, " + diagnose(fc, want, saved, i, out[i]));
    }
    expect(filled == 12, "12 of the 24 elements are in a saved piece, but read_resharded returned " +
                             std::to_string(filled) + " filled: count only the elements you copied");
  });
  grader.check("bad regions and sizes refused with sl::Error", [&] {
    const std::vector<SavedPiece> saved = save(fc, flat_shards(fc, 4));
    expect_refused(fc, Region{{6, 0}, {4, 6}, 0, 24}, saved, 24, "a wanted box of rows [6, 10) in a tensor of 8 rows");
    expect_refused(fc, Region{{0, 0}, {4, 6}, 0, 25}, saved, 25, "a wanted range [0, 25) of a box of 24 elements");
    expect_refused(fc, Region{{0, 0}, {4, 6}, 10, 5}, saved, 0, "a wanted range [10, 5) (flat_begin > flat_end)");
    expect_refused(fc, Region{{0}, {48}, 0, 48}, saved, 48, "a 1-d wanted region of the 2-d tensor [8, 6]");
    expect_refused(fc, tp_box(fc, 0, 2, 0), saved, 23, "an out of 23 elements for a region of 24");
    std::vector<SavedPiece> negative = saved;
    negative[1].region.offsets = {-1, 0};
    expect_refused(fc, tp_box(fc, 0, 2, 0), negative, 24, "a saved piece whose box starts at row -1");
    std::vector<SavedPiece> short_data = saved;
    short_data[3].data.pop_back();
    expect_refused(fc, tp_box(fc, 0, 2, 1), short_data, 24,
                   "a saved piece with 11 elements of data for a region of 12");
  });
  return grader.finish();
}
