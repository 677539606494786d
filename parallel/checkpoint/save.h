// save.h — writing a checkpoint, collectively and crash-safe, and the step directories of a run.
//
//   save(dir, world, pieces, run_state, layout)      every rank of `world` calls it
//     rank 0   removes dir/metadata.json (and any old shards): from here on dir is no checkpoint
//     barrier
//     rank r   writes its owner pieces to shard-r.safetensors.tmp, fsync, rename, fsync dir
//     all      all_gather each rank's piece list, file size and SHA-256 (JSON bytes)
//     rank 0   checks the pieces tile every tensor, writes metadata.json.tmp, fsync, rename,
//              fsync dir: the checkpoint now exists
//     barrier
//
//   save_step(root, step, ...) saves into root/step-00000010.partial/ and then renames it to
//   root/step-00000010 (a directory rename is atomic): a step directory is always complete, and the
//   metadata-last rule holds inside it as well. Saving a step that exists swaps the two directories
//   atomically (renameat2 RENAME_EXCHANGE), then deletes the old one.
//   keep_last(root, K) deletes all but the newest K complete step directories, and stale *.partial
//   ones; save_step calls it (rank 0, after the rename) when given keep > 0.
//   newest_complete(root): root itself if it holds a valid metadata.json, else the newest
//   step-NNNNNNNN whose metadata.json parses and checks, else nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/runner/state_pieces.h"

namespace sl::parallel::checkpoint {

// Writes the checkpoint `dir` (created if missing). Every rank passes its pieces; those with
// owner == false are skipped (another rank saves them). run_state and layout are rank 0's.
void save(const std::string& dir, ProcessGroup& world, const std::vector<StatePiece>& pieces,
          const nlohmann::json& run_state, const std::string& layout);

std::string step_directory_name(int64_t step);  // "step-00000010"
// save() into root/step-XXXXXXXX through its .partial name; returns the step directory's path.
std::string save_step(const std::string& root, int64_t step, ProcessGroup& world, const std::vector<StatePiece>& pieces,
                      const nlohmann::json& run_state, const std::string& layout, int keep = 0);

// One process (rank 0) calls these; keep >= 1.
void keep_last(const std::string& root, int keep);
std::optional<std::string> newest_complete(const std::string& root);
// The complete step directories of root, newest first (step, path).
std::vector<std::pair<int64_t, std::string>> complete_steps(const std::string& root);

// Tests only: called with each named point a save passes ("shard.begin", "shard.mid",
// "shard.before_rename", "metadata.before_rename", "metadata.after_rename", "step.before_rename",
// "step.after_rename") and the rank; a hook that throws fails the save there, one that sleeps slows
// it. Set it before the launch and clear it (an empty function) after.
using FaultHook = std::function<void(const std::string& point, int rank)>;
void set_fault_hook(FaultHook hook);
void fault_point(const std::string& point, int rank);  // calls the hook, if one is set

}  // namespace sl::parallel::checkpoint
