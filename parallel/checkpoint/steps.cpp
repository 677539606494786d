// steps.cpp — a run's step directories: saved whole or not at all, the newest found, the oldest
// removed (see save.h).
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "parallel/checkpoint/file_io.h"
#include "parallel/checkpoint/metadata.h"
#include "parallel/checkpoint/save.h"

namespace sl::parallel::checkpoint {
namespace {

using detail::concat;
constexpr const char* kPartialSuffix = ".partial";

// The step of "step-00000010" (8 or more digits, nothing after), or -1.
int64_t step_of(const std::string& name) {
  const std::string prefix = "step-";
  if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 8 || name.size() > prefix.size() + 18) return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Does dir hold a metadata.json that parses and checks?
bool is_complete(const std::string& dir) {
  const std::string path = dir + "/" + kMetadataName;
  if (!exists(path)) return false;
  try {
    parse_metadata(read_small_file(path, kMaxMetadataBytes, ""), "");
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A checkpoint deleted so that no moment leaves it looking complete: metadata.json first.
void remove_checkpoint(const std::string& dir, const std::string& where) {
  remove_file(dir + "/" + kMetadataName);
  sync_directory(dir, where);
  remove_tree(dir);
}

}  // namespace

std::string step_directory_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08" PRId64, step);
  return name;
}

std::string save_step(const std::string& root, int64_t step, ProcessGroup& world, const std::vector<StatePiece>& pieces,
                      const nlohmann::json& run_state, const std::string& layout, int keep) {
  const std::string where = concat("checkpoint::save_step '", root, "' step ", step, ": ");
  SL_CHECK(step >= 0, where, "the step must not be negative");
  SL_CHECK(keep >= 0, where, "keep ", keep, " must not be negative (0 keeps every step)");
  const std::string final_dir = root + "/" + step_directory_name(step), partial = final_dir + kPartialSuffix;
  if (world.rank() == 0) {
    make_directory(root, where);
    remove_tree(partial);  // a crashed save of this step
  }
  save(partial, world, pieces, run_state, layout);  // its barriers order the two blocks
  if (world.rank() == 0) {
    fault_point("step.before_rename", 0);
    if (exists(final_dir)) {  // saved again: swap atomically, then drop the old one
      exchange_paths(partial, final_dir, where);
      sync_directory(root, where);
      remove_checkpoint(partial, where);
    } else {
      rename_path(partial, final_dir, where);
    }
    sync_directory(root, where);
    fault_point("step.after_rename", 0);
    if (keep > 0) keep_last(root, keep);
  }
  world.barrier();
  return final_dir;
}

std::vector<std::pair<int64_t, std::string>> complete_steps(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  if (!is_directory(root)) return steps;
  for (const std::string& name : list_directory(root, concat("checkpoint '", root, "': "))) {
    const int64_t step = step_of(name);
    if (step >= 0 && is_complete(root + "/" + name)) steps.emplace_back(step, root + "/" + name);
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return steps;
}

std::optional<std::string> newest_complete(const std::string& root) {
  if (is_complete(root)) return root;
  const auto steps = complete_steps(root);
  if (steps.empty()) return std::nullopt;
  return steps.front().second;
}

void keep_last(const std::string& root, int keep) {
  const std::string where = concat("checkpoint::keep_last '", root, "': ");
  SL_CHECK(keep >= 1, where, "keep ", keep, " must be at least 1");
  const auto steps = complete_steps(root);
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) remove_checkpoint(steps[i].second, where);
  for (const std::string& name : list_directory(root, where)) {  // stale temporaries of crashed saves
    const size_t suffix = name.size() - std::min(name.size(), std::string(kPartialSuffix).size());
    if (name.compare(suffix, std::string::npos, kPartialSuffix) == 0 && step_of(name.substr(0, suffix)) >= 0)
      remove_tree(root + "/" + name);
  }
  sync_directory(root, where);
}

}  // namespace sl::parallel::checkpoint
