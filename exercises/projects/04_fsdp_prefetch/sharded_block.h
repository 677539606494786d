// exercises/projects/04_fsdp_prefetch/sharded_block.h — the FSDP units the prefetch driver runs (given:
// the grader builds them; read it, don't change it).
//
// One unit = one GPT block's parameters, flat and padded to P = N·S (parallel/zero/flat_params.h),
// of which this rank keeps its shard [S], as FsdpUnit does (parallel/zero/fsdp_unit.h). Unlike
// FsdpUnit::unshard, which blocks, the gather here is split in two, so a driver can issue the next
// unit's all-gather and compute meanwhile:
//
//   WorkPtr w = unit.start_gather();   full [P] allocated (ledger: weights), all_gather_async issued
//   unit.finish_gather(w);             waits: the block's parameters now view full [P]
//   y = unit.forward(x);               the block: [B, T, C] -> [B, T, C]   (refused unless gathered)
//   unit.reshard();                    full's bytes freed in place
//
// forward may sleep a fixed time per block (the grader's stand-in for a big block's compute).
// Every step is written into the rank's UnitLog with its time, so the grader can see the order.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/comm/process_group.h"
#include "parallel/zero/flat_params.h"

namespace project04 {

struct UnitEvent {
  enum class Kind : uint8_t { gather_issued, gather_done, compute_begin, compute_end, resharded };
  Kind kind;
  int unit = 0;
  double seconds = 0;  // since the log's start
};

class UnitLog {
 public:
  UnitLog();
  void restart();  // clears the events; times count from now
  void record(UnitEvent::Kind kind, int unit);
  const std::vector<UnitEvent>& events() const { return events_; }
  // Position of the first event of `kind` for `unit` (-1 if none).
  int position(UnitEvent::Kind kind, int unit) const;

 private:
  double start_;
  std::vector<UnitEvent> events_;
};

class ShardedBlock {
 public:
  // Moves `block`'s parameters into a flat buffer, keeps this rank's shard [S], frees the rest.
  // compute_seconds: slept in each forward on top of the real compute, a fixed cost per block so the
  // overlap shows even on shared cores (as the pipeline engine's sleep_per_layer_row_seconds).
  ShardedBlock(int index, sl::nn::Block& block, sl::parallel::ProcessGroupPtr group, UnitLog& log,
               double compute_seconds = 0);

  sl::parallel::WorkPtr start_gather();  // refused if gathered or in flight
  void finish_gather(const sl::parallel::WorkPtr& work);
  sl::Tensor forward(const sl::Tensor& x);  // refused unless gathered
  void reshard();                           // no-op when sharded

  int index() const { return index_; }
  bool gathered() const { return state_ == State::gathered; }
  int64_t padded_numel() const { return flat_->layout().padded_numel; }  // P

 private:
  enum class State : uint8_t { sharded, in_flight, gathered };
  sl::Storage& full_storage() const { return *flat_->buffer().impl()->storage; }

  int index_;
  sl::nn::Block& block_;
  sl::parallel::ProcessGroupPtr group_;
  UnitLog& log_;
  double compute_seconds_;
  std::unique_ptr<sl::parallel::FlatParams> flat_;  // the params view flat_->buffer(), whose bytes come and go
  sl::Tensor shard_;                                // [S] what this rank owns
  State state_ = State::sharded;
};

}  // namespace project04
