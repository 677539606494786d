// traffic_book.cpp — see traffic_book.h.
#include "parallel/planner/traffic_book.h"

#include "parallel/comm/mesh.h"

namespace sl::parallel::planner {

void Book::named_all_to_all(const std::string& name, const MeshDims& dims, int64_t input_bytes, int64_t calls) {
  own_all_to_all(name, size(dims), input_bytes, calls);
  GroupTraffic& t = entries_[{name, static_cast<int>(CommOp::all_to_all)}];
  t.dims = dims;
  t.members = DeviceMesh::group_members(plan_.parallelism, dims, rank_);
}

std::vector<GroupTraffic> Book::finish(const MeshDims& names) const {
  std::vector<GroupTraffic> out;
  for (const auto& [key, entry] : entries_) {
    GroupTraffic t = entry;
    if (key.first[0] == '#') {
      const GridMask mask = static_cast<GridMask>(std::stoul(key.first.substr(1)));
      for (MeshDim trainer_name : names)
        if (t.dims.empty() && (grid_mask(trainer_name) & nontrivial_) == mask) t.dims = {trainer_name};
      if (t.dims.empty()) t.dims = grid_dims(mask);  // a set the trainer does not name: "pp+tp"
      t.group = t.dims.empty() ? "self" : name(t.dims);
      // A group of size 1 ("dp" of the serial layout): this rank alone.
      t.members = mask == 0 ? std::vector<int>{rank_} : DeviceMesh::group_members(plan_.parallelism, grid_dims(mask), rank_);
    } else {
      t.group = key.first;
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace sl::parallel::planner
