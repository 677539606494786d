// regions.cpp — a region as boxes, the overlap of two, and the tiling check (see regions.h).
#include "parallel/checkpoint/regions.h"

#include <algorithm>
#include <sstream>

#include "tensor/error.h"

namespace sl::parallel::checkpoint {
namespace {

using detail::concat;

std::string list(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// The range [a, b) of the row-major elements of the sub-box over dims d.. of `region`'s box, the
// dims before d fixed at `fixed` (box coordinates), as boxes appended to `out`.
void decompose(const Region& region, size_t d, std::vector<int64_t>& fixed, int64_t a, int64_t b,
               std::vector<Box>& out) {
  if (a >= b) return;
  const size_t ndim = region.lengths.size();
  auto push = [&](int64_t first, int64_t count) {  // dims < d fixed, dim d [first, first + count), rest whole
    Box box{region.offsets, region.lengths};
    for (size_t k = 0; k < d; ++k) box.lo[k] += fixed[k], box.length[k] = 1;
    if (d < ndim) box.lo[d] += first, box.length[d] = count;
    out.push_back(std::move(box));
  };
  if (d == ndim) return push(0, 1);  // one element (a 0-d tensor)
  int64_t stride = 1;                // elements per index of dim d
  for (size_t k = d + 1; k < ndim; ++k) stride *= region.lengths[k];
  int64_t first = a / stride;
  const int64_t last = b / stride, head = a % stride, tail = b % stride;
  if (first == last) {  // inside one index of dim d
    fixed[d] = first;
    return decompose(region, d + 1, fixed, head, tail, out);
  }
  if (head != 0) {  // the ragged head: the end of index `first`
    fixed[d] = first;
    decompose(region, d + 1, fixed, head, stride, out);
    ++first;
  }
  if (first < last) push(first, last - first);  // whole slabs
  if (tail != 0) {                              // the ragged tail: the start of index `last`
    fixed[d] = last;
    decompose(region, d + 1, fixed, 0, tail, out);
  }
}

// The elements two boxes share.
int64_t intersection(const Box& a, const Box& b) {
  int64_t count = 1;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    const int64_t lo = std::max(a.lo[d], b.lo[d]);
    const int64_t hi = std::min(a.lo[d] + a.length[d], b.lo[d] + b.length[d]);
    if (hi <= lo) return 0;
    count *= hi - lo;
  }
  return count;
}

// The row-major index, in `region`'s box, of a global coordinate inside it.
int64_t flat_index(const Region& region, const std::vector<int64_t>& at) {
  int64_t index = 0;
  for (size_t d = 0; d < at.size(); ++d) index = index * region.lengths[d] + (at[d] - region.offsets[d]);
  return index;
}

}  // namespace

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where) {
  SL_CHECK(shape.size() <= kMaxDims, where, "shape ", list(shape), " has ", shape.size(), " dimensions (at most ",
           kMaxDims, ")");
  int64_t numel = 1;
  for (int64_t size : shape) {
    SL_CHECK(size >= 0, where, "shape ", list(shape), " has a negative size");
    SL_CHECK(!__builtin_mul_overflow(numel, size, &numel), where, "shape ", list(shape), " overflows int64");
  }
  return numel;
}

std::string region_problem(const Region& region, const std::vector<int64_t>& shape) {
  const size_t ndim = shape.size();
  if (region.offsets.size() != ndim || region.lengths.size() != ndim)
    return concat("offsets ", list(region.offsets), " and lengths ", list(region.lengths), " do not have the ", ndim,
                  " dimensions of shape ", list(shape));
  int64_t box_numel = 1;
  for (size_t d = 0; d < ndim; ++d) {
    const int64_t offset = region.offsets[d], length = region.lengths[d];
    if (offset < 0 || length < 0 || length > shape[d] || offset > shape[d] - length)
      return concat("out of bounds: dimension ", d, " spans [", offset, ", ", offset, " + ", length,
                    ") but the shape is ", list(shape));
    box_numel *= length;  // no overflow: each length is at most its size, whose product was checked
  }
  if (region.flat_begin < 0 || region.flat_begin > region.flat_end || region.flat_end > box_numel)
    return concat("out of bounds: flat range [", region.flat_begin, ", ", region.flat_end,
                  ") is not inside the box's ", box_numel, " elements");
  return "";
}

std::string describe(const Region& region) {
  return concat("offsets ", list(region.offsets), " lengths ", list(region.lengths), " flat [", region.flat_begin,
                ", ", region.flat_end, ")");
}

std::vector<Box> boxes_of(const Region& region) {
  std::vector<Box> boxes;
  std::vector<int64_t> fixed(region.lengths.size(), 0);
  decompose(region, 0, fixed, region.flat_begin, region.flat_end, boxes);
  return boxes;
}

int64_t overlap_count(const Region& a, const Region& b) {
  int64_t count = 0;
  for (const Box& x : boxes_of(a))
    for (const Box& y : boxes_of(b)) count += intersection(x, y);
  return count;
}

std::pair<int64_t, int64_t> overlap_span(const Region& source, const Region& target) {
  int64_t begin = source.flat_end, end = source.flat_begin;
  for (const Box& x : boxes_of(source))
    for (const Box& y : boxes_of(target)) {
      if (intersection(x, y) == 0) continue;
      std::vector<int64_t> first(x.lo.size()), last(x.lo.size());  // the shared box's corners
      for (size_t d = 0; d < x.lo.size(); ++d) {
        first[d] = std::max(x.lo[d], y.lo[d]);
        last[d] = std::min(x.lo[d] + x.length[d], y.lo[d] + y.length[d]) - 1;
      }
      begin = std::min(begin, flat_index(source, first));
      end = std::max(end, flat_index(source, last) + 1);
    }
  return begin < end ? std::pair(begin, end) : std::pair(int64_t{0}, int64_t{0});
}

void check_tiling(const std::string& tensor, const std::vector<int64_t>& shape, const std::vector<Region>& regions,
                  const std::function<std::string(size_t)>& describe_piece) {
  const std::string at = concat("tensor '", tensor, "' ", list(shape), ": ");
  const int64_t numel = checked_numel(shape, at);
  SL_CHECK(regions.size() <= kMaxPiecesPerTensor, at, regions.size(), " pieces (at most ", kMaxPiecesPerTensor, ")");
  struct Owned {
    Box box;
    size_t piece;
  };
  std::vector<Owned> boxes;
  int64_t covered = 0;
  for (size_t i = 0; i < regions.size(); ++i) {
    const std::string problem = region_problem(regions[i], shape);
    SL_CHECK(problem.empty(), at, describe_piece(i), ": ", problem);
    for (Box& box : boxes_of(regions[i])) boxes.push_back({std::move(box), i});
  }
  // Sorted by where they start in dimension 0, a box can only meet those that start before it ends there.
  std::sort(boxes.begin(), boxes.end(), [](const Owned& a, const Owned& b) { return a.box.lo < b.box.lo; });
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      if (!shape.empty() && boxes[j].box.lo[0] >= boxes[i].box.lo[0] + boxes[i].box.length[0]) break;
      if (boxes[i].piece == boxes[j].piece || intersection(boxes[i].box, boxes[j].box) == 0) continue;
      const size_t p = std::min(boxes[i].piece, boxes[j].piece), q = std::max(boxes[i].piece, boxes[j].piece);
      throw Error(concat(at, "overlap: ", describe_piece(p), " and ", describe_piece(q), " share ",
                         overlap_count(regions[p], regions[q]), " elements"));
    }
  for (const Region& region : regions) covered += region.numel();  // disjoint inside the shape: <= numel
  SL_CHECK(covered == numel, at, "gap: the pieces cover ", covered, " of its ", numel, " elements");
}

}  // namespace sl::parallel::checkpoint
