// traffic_book.cpp — see traffic_book.h.
#include "parallel/planner/traffic_book.h"

#include "parallel/comm/mesh.h"

namespace sl::parallel::planner {

namespace {

std::vector<std::string> dim_names(unsigned mask) {
  std::vector<std::string> out;
  for (int d = 0; d < 5; ++d)
    if (mask & (1u << d)) out.emplace_back(DeviceMesh::kDimNames[d]);
  return out;
}

}  // namespace

std::vector<GroupTraffic> Book::finish(const std::vector<std::pair<std::string, unsigned>>& names) const {
  std::vector<GroupTraffic> out;
  for (const auto& [key, entry] : entries_) {
    GroupTraffic t = entry;
    if (key.first[0] == '#') {
      const unsigned mask = static_cast<unsigned>(std::stoul(key.first.substr(1)));
      std::string name;
      for (const auto& [trainer_name, trainer_mask] : names)
        if (name.empty() && (trainer_mask & nontrivial_) == mask) name = trainer_name;
      if (name.empty())
        for (const std::string& d : dim_names(mask)) name += (name.empty() ? "" : "+") + d;
      t.group = name.empty() ? "self" : name;
      // A group of size 1 ("dp" of the serial layout): this rank alone.
      t.members = mask == 0 ? std::vector<int>{rank_} : DeviceMesh::group_members(plan_.parallelism, dim_names(mask), rank_);
    } else {
      t.group = key.first;
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace sl::parallel::planner
