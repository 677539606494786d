// exercises/22_checkpoint_reshard/grader.cpp — grades the read plan of a resharded load (student.cpp).
//
// The saving layouts' regions are the grader's own index arithmetic (zero-3 flat shards of a padded
// buffer, tp boxes, tp boxes cut into zero runs); every plan is held to the one the library's reader
// makes (parallel/checkpoint/regions.h: overlap_count and overlap_span, what checkpoint::Reader reads),
// and executed: reading only the planned bytes of each piece must fill the wanted region exactly.
// The prediction is measured by saving a checkpoint on thread ranks and counting the Reader's bytes.
// With -DSL_SOLUTION the library's overlap_count, overlap_span and region_problem stand in.
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "exercises/22_checkpoint_reshard/piece_read.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/regions.h"
#include "tensor/ops.h"

using namespace sl;
using exercise22::PieceRead;
using exercises::expect;
using sl::parallel::Region;
using Shape_ = std::vector<int64_t>;

namespace exercise22 {
double predicted_bytes_read();
std::vector<PieceRead> plan_reads(const Shape_& shape, const Region& want, const std::vector<Region>& saved,
                                  int64_t element_bytes);
}  // namespace exercise22

// The library's plan: what checkpoint::Reader::load reads of each saved piece (reader.cpp).
static std::vector<PieceRead> library_plan(const Shape_& shape, const Region& want, const std::vector<Region>& saved,
                                           int64_t element_bytes) {
  const std::string problem = parallel::checkpoint::region_problem(want, shape);
  SL_CHECK(problem.empty(), "the wanted region ", parallel::checkpoint::describe(want), ": ", problem);
  SL_CHECK(element_bytes >= 1, "element_bytes ", element_bytes, " < 1");
  for (const Region& piece : saved) {
    const std::string bad = parallel::checkpoint::region_problem(piece, shape);
    SL_CHECK(bad.empty(), "a saved piece ", parallel::checkpoint::describe(piece), ": ", bad);
  }
  std::vector<PieceRead> plan;
  for (size_t i = 0; i < saved.size(); ++i) {
    const auto [begin, end] = parallel::checkpoint::overlap_span(saved[i], want);
    if (begin == end) continue;
    plan.push_back({i, parallel::checkpoint::overlap_count(saved[i], want),
                    (begin - saved[i].flat_begin) * element_bytes, (end - saved[i].flat_begin) * element_bytes});
  }
  return plan;
}

#ifdef SL_SOLUTION
namespace solution {
// The measured value, derived: a flat shard holds 16 whole rows; the row-parallel half of each is
// columns [8, 16). The span runs from (first row, col 8) to (last row, col 15): 15 rows of 16 and 8
// more, 248 elements of the shard's 256, though only 16·8 = 128 are needed. Four shards, 4 bytes each.
double predicted_bytes_read() { return 4.0 * (15 * 16 + 8) * 4; }
std::vector<PieceRead> plan_reads(const Shape_& shape, const Region& want, const std::vector<Region>& saved,
                                  int64_t element_bytes) {
  return library_plan(shape, want, saved, element_bytes);
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
static std::string describe(const Region& r) { return parallel::checkpoint::describe(r); }
static std::string entry(const PieceRead& p) {
  return "{piece " + std::to_string(p.piece) + ", " + std::to_string(p.elements) + " elements, bytes [" +
         std::to_string(p.byte_begin) + ", " + std::to_string(p.byte_end) + ")}";
}

// Says what is wrong with a plan that differs from the library's, and the likely slip.
static std::string diagnose(const Shape_& shape, const Region& want, const std::vector<Region>& saved, int64_t eb,
                            const std::vector<PieceRead>& got, const std::vector<PieceRead>& expected) {
  std::string text = "reading " + describe(want) + ": ";
  Region box_only = want;
  box_only.flat_begin = 0, box_only.flat_end = want.box_numel();
  if (want.numel() != want.box_numel() && got == library_plan(shape, box_only, saved, eb))
    return text + "your plan reads the whole wanted box. A wanted region is also only a range [" +
           std::to_string(want.flat_begin) + ", " + std::to_string(want.flat_end) +
           ") of its box's elements (a ZeRO shard of the tensor or of a tp slice): an element is shared only when it lies in "
           "both regions' ranges";
  for (const PieceRead& e : expected) {
    const auto it = std::find_if(got.begin(), got.end(), [&](const PieceRead& g) { return g.piece == e.piece; });
    if (it == got.end())
      return text + "saved piece " + std::to_string(e.piece) + " (" + describe(saved[e.piece]) + ") holds " +
             std::to_string(e.elements) + " of its elements, but your plan does not read it";
    const Region& p = saved[e.piece];
    if (it->elements != e.elements) {
      if (it->elements * eb == it->byte_end - it->byte_begin)
        return text + "piece " + std::to_string(e.piece) + ": you counted every element of the span (" +
               std::to_string(it->elements) + "), but only " + std::to_string(e.elements) +
               " are shared: a span read whole may hold elements the region does not need";
      return text + "piece " + std::to_string(e.piece) + " shares " + std::to_string(e.elements) +
             " elements, your plan says " + std::to_string(it->elements);
    }
    if (it->byte_begin != e.byte_begin || it->byte_end != e.byte_end) {
      if (p.flat_begin != 0 && it->byte_begin == e.byte_begin + p.flat_begin * eb)
        return text + "piece " + std::to_string(e.piece) + " (" + describe(p) + "): your bytes [" +
               std::to_string(it->byte_begin) + ", " + std::to_string(it->byte_end) +
               ") count from its box's first element; its data starts at element flat_begin " +
               std::to_string(p.flat_begin) + ": subtract the piece's flat_begin (the expected range is [" +
               std::to_string(e.byte_begin) + ", " + std::to_string(e.byte_end) + "))";
      if (it->byte_begin == e.byte_begin / eb && it->byte_end == e.byte_end / eb)
        return text + "piece " + std::to_string(e.piece) + ": your range is in elements; multiply by element_bytes (" +
               std::to_string(eb) + ")";
      return text + "piece " + std::to_string(e.piece) + " (" + describe(p) + "): your range " + entry(*it) +
             " is not the smallest one holding its " + std::to_string(e.elements) + " shared elements, " + entry(e) +
             ": from the first shared element's index in the piece's box to the last's, plus one";
    }
  }
  for (const PieceRead& g : got)
    if (std::none_of(expected.begin(), expected.end(), [&](const PieceRead& e) { return e.piece == g.piece; }))
      return text + "your plan reads piece " + std::to_string(g.piece) + " (" +
             (g.piece < saved.size() ? describe(saved[g.piece]) : std::string("no such piece")) +
             "), which shares no element with it: a piece with nothing shared is not read at all";
  return text + "your plan lists the right reads in another order or twice; list each piece once, in saved order";
}

static void expect_plans(const Shape_& shape, const std::vector<Region>& saved, const std::vector<Region>& wanted,
                         const std::string& layouts, int64_t eb = 4) {
  for (const Region& want : wanted) {
    const std::vector<PieceRead> got = impl::plan_reads(shape, want, saved, eb);
    const std::vector<PieceRead> expected = library_plan(shape, want, saved, eb);
    if (got != expected) expect(false, layouts + ": " + diagnose(shape, want, saved, eb, got, expected));
  }
}

// The plan executed: each piece's data cut from a tensor holding i + 1 at global flat index i, only the
// planned bytes of it kept, copied into the wanted region; every wanted element must arrive.
static void expect_plan_fills(const Shape_& shape, const std::vector<Region>& saved, const Region& want,
                              const std::string& layouts) {
  const Region all = whole(shape, 0, numel_of(shape));
  std::vector<float> tensor(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < tensor.size(); ++i) tensor[i] = static_cast<float>(i + 1);
  std::vector<float> out(static_cast<size_t>(want.numel()), NAN), expected(out.size());
  parallel::copy_overlap(want, expected.data(), all, tensor.data(), 4);
  int64_t read = 0;
  for (const PieceRead& p : impl::plan_reads(shape, want, saved, 4)) {
    expect(p.piece < saved.size() && p.byte_begin >= 0 && p.byte_begin % 4 == 0 && p.byte_end % 4 == 0 &&
               p.byte_begin <= p.byte_end && p.byte_end <= saved[p.piece].numel() * 4,
           layouts + ": " + entry(p) + " is not a range of bytes inside that piece's data");
    Region span = saved[p.piece];
    span.flat_begin += p.byte_begin / 4, span.flat_end = saved[p.piece].flat_begin + p.byte_end / 4;
    std::vector<float> bytes(static_cast<size_t>(span.numel()));
    parallel::copy_overlap(span, bytes.data(), all, tensor.data(), 4);  // what the read returns
    parallel::copy_overlap(want, out.data(), span, bytes.data(), 4);
    read += span.numel();
  }
  for (size_t i = 0; i < out.size(); ++i)
    expect(out[i] == expected[i], layouts + ": after reading only the planned bytes, element " + std::to_string(i) +
                                      " of " + describe(want) + " is missing: some shared element lies outside "
                                      "the range you read");
  std::printf("        %s: %lld elements read for %lld needed\n", layouts.c_str(), static_cast<long long>(read),
              static_cast<long long>(want.numel()));
}

// The call must throw sl::Error; anything else (no throw, another exception) fails with `what`.
static void expect_refused(const Shape_& shape, const Region& want, const std::vector<Region>& saved, int64_t eb,
                           const std::string& what) {
  try {
    impl::plan_reads(shape, want, saved, eb);
  } catch (const exercises::NotImplemented&) {
    throw;
  } catch (const sl::Error&) {
    return;
  } catch (const std::exception& e) {
    expect(false, what + ": it threw " + e.what() + " instead of sl::Error (SL_CHECK(condition, \"message\"))");
  }
  expect(false, what + " was accepted: check it before planning anything, and throw sl::Error");
}

// The prediction's measure: ZeRO-3 over 4 thread ranks saves a [64, 16] f32 weight as flat shards;
// a Reader fills tp 2 row-parallel rank 1's box (columns [8, 16)) and counts the bytes it read.
static double measured_bytes_read() {
  const Shape_ shape = {64, 16};
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("shardlab_exercise22_" + std::to_string(std::chrono::steady_clock::now()
                                                                        .time_since_epoch().count()))).string();
  const std::vector<Region> shards = flat_shards(shape, 4);
  exercises::run_ranks(4, [&](parallel::RankContext& ctx) {
    const Region& mine = shards[static_cast<size_t>(ctx.rank)];
    Tensor data = arange(static_cast<double>(mine.flat_begin), static_cast<double>(mine.flat_end));
    parallel::StatePiece piece{"h.0.mlp.c_fc.weight", shape, mine, data};
    parallel::checkpoint::save(dir, *ctx.world, {piece}, nlohmann::json::object(), "zero-3 x4");
  }, "saving the checkpoint timed out: ");
  parallel::checkpoint::Reader reader(dir);
  std::vector<parallel::StatePiece> wanted{{"h.0.mlp.c_fc.weight", shape, tp_box(shape, 1, 2, 1), zeros({512})}};
  reader.load(wanted, {.verify = false});
  std::filesystem::remove_all(dir);
  return static_cast<double>(reader.data_bytes_read());
}

int main() {
  exercises::Grader grader("22_checkpoint_reshard");
  grader.predict("bytes the Reader reads for tp 2 row-parallel rank 1's columns [8, 16) of a [64, 16] f32 weight "
                 "saved by ZeRO-3 over 4",
                 impl::predicted_bytes_read, measured_bytes_read, 0, "bytes");
  const Shape_ fc = {8, 6};  // a c_fc-like weight [4C, C]
  grader.check("zero-3 flat shards over 4 -> tp 2 column-parallel boxes (rows): whole pieces, exact", [&] {
    expect_plans(fc, flat_shards(fc, 4), {tp_box(fc, 0, 2, 0), tp_box(fc, 0, 2, 1)}, "zero-3 x4 -> tp 2 rows");
  });
  grader.check("zero-3 flat shards over 4 -> tp 2 row-parallel boxes (columns): spans wider than the need", [&] {
    expect_plans(fc, flat_shards(fc, 4), {tp_box(fc, 1, 2, 0), tp_box(fc, 1, 2, 1)}, "zero-3 x4 -> tp 2 columns");
  });
  grader.check("tp 2 boxes -> uneven flat shards of a buffer the tensor shares (bias [6] first, padded)", [&] {
    // Buffer [bias 6 | weight 48] = 54 over 4: S = 14, the weight's runs [0, 8) [8, 22) [22, 36) [36, 48).
    expect_plans(fc, {tp_box(fc, 1, 2, 0), tp_box(fc, 1, 2, 1)}, flat_shards(fc, 4, 6, 54),
                 "tp 2 columns -> zero-3 x4 of [bias | weight]");
  });
  grader.check("tp 2 x zero 2 (runs inside tp boxes) -> tp 3 row boxes cut in zero 2 runs (flat_begin != 0)", [&] {
    const Shape_ rows = {12, 6};
    std::vector<Region> saved, wanted;
    for (int r = 0; r < 2; ++r)
      for (const Region& run : runs_of_box(tp_box(rows, 1, 2, r), 2)) saved.push_back(run);
    for (int r = 0; r < 3; ++r)
      for (const Region& run : runs_of_box(tp_box(rows, 0, 3, r), 2)) wanted.push_back(run);
    expect_plans(rows, saved, wanted, "tp 2 x zero 2 -> tp 3 x zero 2");
    expect_plans(rows, wanted, saved, "tp 3 x zero 2 -> tp 2 x zero 2");
  });
  grader.check("a 3-d tensor [2, 4, 6], and bf16 (2 bytes an element)", [&] {
    const Shape_ qkv = {2, 4, 6};
    expect_plans(qkv, {tp_box(qkv, 1, 2, 0), tp_box(qkv, 1, 2, 1)}, flat_shards(qkv, 3), "tp 2 (dim 1) -> zero x3");
    expect_plans(qkv, flat_shards(qkv, 5), runs_of_box(tp_box(qkv, 2, 3, 1), 2), "zero x5 -> tp 3 (dim 2) x zero 2");
    expect_plans(qkv, flat_shards(qkv, 5), runs_of_box(tp_box(qkv, 2, 3, 1), 2), "bf16 zero x5 -> tp 3 x zero 2", 2);
  });
  grader.check("the plan executed: reading only the planned bytes fills the region exactly", [&] {
    expect_plan_fills(fc, flat_shards(fc, 7), flat_shards(fc, 5)[2], "zero x7 -> zero x5, rank 2");
    expect_plan_fills(fc, flat_shards(fc, 4), tp_box(fc, 1, 2, 1), "zero-3 x4 -> tp 2 columns, rank 1");
    const Shape_ rows = {12, 6};
    std::vector<Region> saved;
    for (int r = 0; r < 2; ++r)
      for (const Region& run : runs_of_box(tp_box(rows, 1, 2, r), 2)) saved.push_back(run);
    expect_plan_fills(rows, saved, runs_of_box(tp_box(rows, 0, 3, 1), 2)[1], "tp 2 x zero 2 -> tp 3 x zero 2");
  });
  grader.check("bad regions and element sizes refused with sl::Error", [&] {
    const std::vector<Region> saved = flat_shards(fc, 4);
    expect_refused(fc, Region{{6, 0}, {4, 6}, 0, 24}, saved, 4, "a wanted box of rows [6, 10) in a tensor of 8 rows");
    expect_refused(fc, Region{{0, 0}, {4, 6}, 0, 25}, saved, 4, "a wanted range [0, 25) of a box of 24 elements");
    expect_refused(fc, Region{{0, 0}, {4, 6}, 10, 5}, saved, 4, "a wanted range [10, 5) (flat_begin > flat_end)");
    expect_refused(fc, Region{{0}, {48}, 0, 48}, saved, 4, "a 1-d wanted region of the 2-d tensor [8, 6]");
    std::vector<Region> negative = saved;
    negative[1].offsets = {-1, 0};
    expect_refused(fc, tp_box(fc, 0, 2, 0), negative, 4, "a saved piece whose box starts at row -1");
    std::vector<Region> past = saved;
    past[3].flat_end = 49;
    expect_refused(fc, tp_box(fc, 0, 2, 1), past, 4, "a saved piece whose range [36, 49) leaves its box of 48");
    expect_refused(fc, tp_box(fc, 0, 2, 1), saved, 0, "element_bytes 0");
  });
  return grader.finish();
}
