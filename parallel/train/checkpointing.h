// checkpointing.h — a Trainer's state as pieces of the serial model's tensors, whatever the layout:
// what a distributed checkpoint (parallel/checkpoint/checkpoint.h) saves, and loads under another.
//
//   strategy.local_state(runner)          runs of local parameters' elements: [begin, end) of the
//   (data_parallel_strategy.h)            tensor module() holds, views of the weights, AdamW's moments,
//                                         the master copy; the mesh dims where other ranks hold the same
//        +
//   parameter_places(module, config, mesh) where each local parameter sits in the serial tensor: the
//                                         boxes it stacks (a TP slice; c_attn's q, k, v rows; wte's
//                                         real vocabulary rows), and whether this rank may save it
//                                         (not a tp replica off tp rank 0, not the last stage's tied wte)
//        =
//   state_pieces(trainer, config)         StatePieces (runner/state_pieces.h): one per run, kind and box,
//                                         `owner` on exactly one rank per region of every tensor
//
//   Loading writes through the same views, so a checkpoint saved under ZeRO-3 at world 4 loads into
//   TP 2 x PP 2: each rank fills its own pieces from whichever saved pieces overlap them.
//
//   Tests: tests/parallel/train/test_checkpoint_resharding.cpp
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/runner/state_pieces.h"
#include "parallel/train/trainer.h"

namespace sl::parallel {

// The serial GPT's parameters by name, with their shapes (wte [V, C], ..., ln_f.bias [C]).
std::map<std::string, Shape> serial_parameter_shapes(const nn::GPTConfig& config);

struct ParameterPlace {
  std::vector<int64_t> global_shape;
  std::vector<Region> boxes;  // the local tensor is these boxes stacked (elements past them: padding)
  bool saves = true;          // false: another rank saves the same elements
};
// Every parameter of `module` (a rank's part, serial names) placed in the serial model of `config`
// on `mesh`. Throws sl::Error naming a parameter the serial model lacks or a shape no cut explains.
std::map<std::string, ParameterPlace> parameter_places(nn::Module& module, const nn::GPTConfig& config,
                                                       const DeviceMesh& mesh);

// This rank's training state as pieces of global tensors (views of the live state).
std::vector<StatePiece> state_pieces(Trainer& trainer, const nn::GPTConfig& config);

// The serial run's state (one nn::GPT, one nn::AdamW): every parameter whole, this rank saves all.
std::vector<StatePiece> whole_state_pieces(nn::Module& model, nn::AdamW& optimizer);
// The serial run's run state, as trainer_run_state's (one rank), and its restore.
nlohmann::json serial_run_state(const nn::AdamW& optimizer, const nn::GradScaler& scaler);
void restore_serial_run_state(nn::AdamW& optimizer, nn::GradScaler& scaler, const nlohmann::json& state);

// What else a resume needs, the same JSON on every rank (collective over the mesh's world):
// {"optimizer_steps": AdamW's step count, "scaler": {"scale", "clean_steps", "skipped_steps"},
//  "rng": [{"seed", "offset"} per world rank: each rank thread's generator, which dropout draws from]}.
nlohmann::json trainer_run_state(Trainer& trainer);
// The same with this rank's count given: build/bin/diverge's, whose experts may lag the others
// (DataParallelStrategy::parameters_behind); the state holds the most over the ranks.
nlohmann::json trainer_run_state(Trainer& trainer, int64_t optimizer_steps);
// Sets AdamW's step count and the scaler; the ranks' generators when the world has as many ranks as
// the state (under another world size dropout draws other masks: say so, it is not an error).
// Returns false when the generators could not be restored.
bool restore_trainer_run_state(Trainer& trainer, const nlohmann::json& state);

}  // namespace sl::parallel
