// divergence_sync.h — the layout's training state, gathered by build/bin/diverge (divergence.h) from its
// ranks' state pieces, and loaded into the serial run and its f64 twin at the start of every step
// after the first. Each step of the serial runs then starts where the layout's starts, so the step's
// bound needs only that step's roundings (divergence_compare.h), not the drift of the steps before.
//
//   every rank   state.add(state_pieces(trainer, config))       its pieces the checkpoint saves from it:
//                                                               one replica per element (`owner`)
//   one rank     state.load_into(whole_state_pieces(model, adamw))   the weights, AdamW's moments and
//                                                               f32 masters, each whole serial tensor
//
//   layout ranks (ZeRO shards, TP slices, stages)        LayoutState (f64, global row-major)
//   ┌────┬────┐  ┌────┐                                ┌──────────────────────┐   widened or rounded into
//   │tp 0│tp 1│  │pp 1│  ── copy_overlap of the  ──>   │ h.0.attn.c_attn.weight│ ─ each serial tensor's
//   └────┴────┘  └────┘     owned regions              │ exp_avg.h.0...  ...   │   dtype (load_into)
//                                                      └──────────────────────┘
//
// The places are the checkpoint's (train/checkpointing.h: the placements and the strategies' runs),
// never the layout's own gathers (full_state_dict, the strategies' all-gathers): what a gather would
// hide is what the finder compares. A replica that is not saved is not read; where it disagrees with
// the saved one, the previous step's weights comparison has already named it.
//
//   Tests: tests/parallel/train/test_divergence.cpp
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/runner/state_pieces.h"

namespace sl::parallel {

class LayoutState {
 public:
  // Room for every tensor of `serial` (the serial run's pieces, whole_state_pieces): weights, moments, masters.
  explicit LayoutState(const std::vector<StatePiece>& serial);
  LayoutState(const LayoutState&) = delete;
  LayoutState& operator=(const LayoutState&) = delete;

  void clear();  // nothing held: before the ranks add a step's state
  // A rank's pieces (state_pieces): the owned ones are copied in, the replicas skipped. Thread-safe:
  // every rank thread adds its own.
  void add(const std::vector<StatePiece>& rank_pieces);
  // Writes each piece (whole tensors of a serial run) from what the ranks added, in the piece's
  // dtype. Throws sl::Error naming a tensor no rank's pieces covered whole (nothing is written then).
  void load_into(const std::vector<StatePiece>& pieces) const;
  // A rank's parameters whose AdamW step count lags the run's (DataParallelStrategy::parameters_behind:
  // an expert AdamW skipped), by serial name; thread-safe. The serial runs take them after the run
  // state's single count.
  void add_steps_behind(const std::map<std::string, int64_t>& steps);
  const std::map<std::string, int64_t>& steps_behind() const { return steps_behind_; }

 private:
  struct Buffer {
    std::vector<int64_t> shape;
    std::vector<double> values;  // row-major
    std::vector<char> covered;   // 1 where a rank's piece wrote the element
  };
  std::map<std::string, Buffer> buffers_;
  std::map<std::string, int64_t> steps_behind_;
  std::mutex mutex_;
};

}  // namespace sl::parallel
