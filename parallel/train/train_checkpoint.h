// train_checkpoint.h — train's distributed checkpoints (parallel/checkpoint, checkpointing.h).
//
//   --checkpoint-dir ROOT [--save-every N] [--keep-last K]   ROOT/step-N after step N (every N steps
//                                                          and at the end); old ones deleted only
//                                                          once a new one is complete
//   --resume DIR                                           the newest complete checkpoint in DIR (or
//                                                          DIR itself), verified, under any layout
//
//   A checkpoint's run_state: {"step": the steps done (the next step's index: the data stream's
//   position, which depends on the step alone, never the layout), "config": the model and the run
//   (checked on resume), "trainer": AdamW's step count, the loss scale, every rank's generator}.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "nn/gpt.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/train/train_options.h"

namespace sl::train_checkpoint {

// What a resumed run must share with the run that saved: the model (a checkpoint of another shape
// cannot load) and the data's sequence length.
inline nlohmann::json run_config(const parallel::TrainOptions& o, const nn::GPTConfig& config) {
  return {{"n_layer", config.n_layer},       {"n_head", config.n_head},       {"n_embd", config.n_embd},
          {"vocab_size", config.vocab_size}, {"block_size", config.block_size}, {"param_dtype", dtype_name(config.param_dtype)},
          {"task", o.task},                  {"batch_size", o.batch_size},    {"seed", o.seed},
          {"steps", o.steps},                {"lr", o.lr},                    {"dropout", config.dropout}};
}

struct Resume {
  std::string dir;
  int64_t next_step = 0;
  nlohmann::json run_state;
  std::string layout;
};

// --resume DIR: finds the checkpoint, checks every shard's size and SHA-256, and refuses another
// model or sequence length before step 0, naming both values.
inline Resume open(const parallel::TrainOptions& o, const nn::GPTConfig& config) {
  std::optional<std::string> dir = parallel::checkpoint::newest_complete(o.resume);
  SL_CHECK(dir.has_value(), "--resume ", o.resume, ": no complete checkpoint there (a directory with metadata.json, or ",
           "step-N directories holding one)");
  parallel::checkpoint::Reader reader(*dir);
  reader.verify();
  const nlohmann::json& state = reader.run_state();
  SL_CHECK(state.is_object() && state.contains("step") && state.contains("config") && state.contains("trainer"),
           "--resume ", *dir, ": its run state has no step, config or trainer: not a checkpoint train wrote");
  const nlohmann::json mine = run_config(o, config), saved = state.at("config");
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "block_size", "param_dtype"})
    SL_CHECK(saved.contains(key) && saved.at(key) == mine.at(key), "--resume ", *dir, ": it was saved with ", key, " ",
             saved.contains(key) ? saved.at(key).dump() : std::string("(none)"), " but this run has ", key, " ",
             mine.at(key).dump());
  Resume resume{*dir, state.at("step").get<int64_t>(), state, reader.layout()};
  SL_CHECK(resume.next_step >= 0 && resume.next_step <= o.steps, "--resume ", *dir, ": it is at step ", resume.next_step,
           " but this run has --steps ", o.steps);
  return resume;
}

// Whether the step that just finished (`done` steps so far) ends with a checkpoint.
inline bool due(const parallel::TrainOptions& o, int64_t done) {
  if (o.checkpoint_dir.empty()) return false;
  return done == o.steps || (o.save_every > 0 && done % o.save_every == 0);
}

inline nlohmann::json run_state(const parallel::TrainOptions& o, const nn::GPTConfig& config, int64_t done,
                                const nlohmann::json& trainer) {
  return {{"step", done}, {"config", run_config(o, config)}, {"trainer", trainer}};
}

}  // namespace sl::train_checkpoint
