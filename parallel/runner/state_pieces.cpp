// state_pieces.cpp — regions of global tensors and the copy between two of them (state_pieces.h).
#include "parallel/runner/state_pieces.h"

#include <algorithm>
#include <cstring>

#include "tensor/error.h"

namespace sl::parallel {

std::string state_tensor_name(StateKind kind, const std::string& parameter) {
  switch (kind) {
    case StateKind::weight: return parameter;
    case StateKind::exp_avg: return "exp_avg." + parameter;
    case StateKind::exp_avg_sq: return "exp_avg_sq." + parameter;
    case StateKind::master: return "master." + parameter;
  }
  return parameter;
}

int64_t Region::box_numel() const {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

std::vector<LocalRun> runs_of(const std::vector<Region>& boxes, int64_t begin, int64_t end) {
  std::vector<LocalRun> runs;
  int64_t first = 0;  // the box's first local element
  for (size_t i = 0; i < boxes.size(); ++i) {
    const int64_t n = boxes[i].box_numel(), lo = std::max(begin, first), hi = std::min(end, first + n);
    if (lo < hi) {
      Region r = boxes[i];
      r.flat_begin = lo - first;
      r.flat_end = hi - first;
      runs.push_back({i, r, lo - begin});
    }
    first += n;
  }
  return runs;
}

int64_t copy_overlap(const Region& dst, void* dst_data, const Region& src, const void* src_data, int64_t element_bytes) {
  const size_t ndim = dst.offsets.size();
  SL_CHECK(src.offsets.size() == ndim && dst.lengths.size() == ndim && src.lengths.size() == ndim,
           "copy_overlap: regions of ", ndim, " and ", src.offsets.size(), " dimensions");
  // The intersection box; a 0-d tensor is one element.
  std::vector<int64_t> lo(ndim), hi(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    lo[d] = std::max(dst.offsets[d], src.offsets[d]);
    hi[d] = std::min(dst.offsets[d] + dst.lengths[d], src.offsets[d] + src.lengths[d]);
    if (lo[d] >= hi[d]) return 0;
  }
  // Row-major strides of each box, and the flat index of a global coordinate in it.
  auto flat_index = [&](const Region& box, const std::vector<int64_t>& at) {
    int64_t index = 0;
    for (size_t d = 0; d < ndim; ++d) index = index * box.lengths[d] + (at[d] - box.offsets[d]);
    return index;
  };
  const int64_t row = ndim == 0 ? 1 : hi[ndim - 1] - lo[ndim - 1];
  auto* out = static_cast<std::byte*>(dst_data);
  const auto* in = static_cast<const std::byte*>(src_data);
  std::vector<int64_t> at = lo;  // the first element of the current row of the intersection
  int64_t copied = 0;
  while (true) {
    const int64_t fd = flat_index(dst, at), fs = flat_index(src, at);
    if (fd >= dst.flat_end || fs >= src.flat_end) break;  // rows only move forward in both boxes
    const int64_t t0 = std::max({int64_t{0}, dst.flat_begin - fd, src.flat_begin - fs});
    const int64_t t1 = std::min({row, dst.flat_end - fd, src.flat_end - fs});
    if (t0 < t1) {
      std::memcpy(out + (fd + t0 - dst.flat_begin) * element_bytes, in + (fs + t0 - src.flat_begin) * element_bytes,
                  static_cast<size_t>((t1 - t0) * element_bytes));
      copied += t1 - t0;
    }
    // The next row: the odometer over every dimension but the last.
    int d = static_cast<int>(ndim) - 2;
    for (; d >= 0; --d) {
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
    }
    if (d < 0) break;
  }
  return copied;
}

}  // namespace sl::parallel
