// cost_model.h — what one rank of a layout holds and sends in one optimizer step, worked out from the
// model's shapes and the chapters' rules, without running anything. The planner (planner.h) builds its
// step times and its ranking on these two functions; tests/parallel/planner/test_planner_ledger.cpp holds them to the
// ledgers of real runs of shardlab's own layouts (bytes exactly, model states exactly, activations
// within 5%), and tests/parallel/planner/test_planner.cpp to the papers' figures at scale.
//
//   inputs   model   a ModelShape (model_shape.h): nn::GPTConfig's n_layer, n_embd, n_head, vocab_size,
//                    block_size, param_dtype, recompute and moe_ fields, with an expert's width, shared
//                    experts and leading dense layers
//            plan    a TrainPlan: the mesh's degrees, the data-parallel strategy (ZeRO stage), offload,
//                    micro-batches, the pipeline schedule and virtual stages, SP, the CP balance, precision
//            batch   the global batch in rows (train's --batch-size) and the sequence length T
//            rank    a world rank of the mesh [pp, dp_replicate, dp_shard, ep, cp, tp] (stages differ)
//
//   Expert parallelism (ep, the expert_parallel chapter's rules, as the library runs them): a rank
//   holds E/ep routed experts and every other weight whole (ep ranks are data-parallel ranks for them:
//   dp includes ep, the batch splits over dp_replicate x dp_shard x ep). tp does not cut an MoE block:
//   its router and experts are whole on every tp rank, which route the same tokens, send the same
//   all-to-all bytes and compute the same expert rows. Per MoE layer and micro-batch two all-to-alls
//   forward (dispatch, combine) and their two reverses backward on the ep group, each moving the
//   rank's kept assignments that live on other ranks, tokens·k·min(1, cf)·C·bytes·(ep-1)/ep for a
//   uniform load, and one all-gather of the routing choices (tokens·k·8 bytes) over the ranks that
//   split the batch (dp_cp). Expert gradients are averaged over expert_dp_cp: DDP's own buckets
//   there; under ZeRO-1/2 and FSDP the experts stay out of the flat buffers and units (weights, .grad
//   and AdamW moments whole) and one all-reduce per expert tensor averages them, while the other
//   weights are sharded over dp_shard x ep.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm/mesh_dim.h"
#include "parallel/comm/process_group.h"
#include "parallel/planner/model_shape.h"
#include "parallel/train/train_plan.h"

namespace sl::parallel::planner {

struct BatchShape {
  int64_t batch_size = 0;  // global rows per optimizer step (over every dp rank and micro-batch)
  int64_t seq_len = 0;     // T, tokens per row
};

// Bytes a rank holds on its device, in the memory ledger's categories (tensor/ledger.h). weights,
// grads and optimizer: between steps (after optimizer.step, before the next zero_grad), what the
// ledger's "current" shows; activations: the peak of one step's forward and backward above that.
// Offloaded state lives on the host (host_offload), not on the device.
struct MemoryEstimate {
  int64_t weights = 0, grads = 0, optimizer = 0, activations = 0;
  int64_t host_offload = 0;
  int64_t model_states() const { return weights + grads + optimizer; }
  int64_t total() const { return weights + grads + optimizer + activations; }
};
MemoryEstimate estimate_memory(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch, int rank);
// The layouts train runs: TrainPlan::validate (the library's own checks, ep's refusals with them:
// no SP, HSDP or offload with ep, ZeRO/FSDP not with pp or cp, no interleaved stages under DDP, no
// mixed precision), then train's refusals for a mixture of experts (f32 only, no full recomputation).
// The planner costs nothing else. Throws sl::Error as validate does.
void check_trainable(const ModelShape& model, const TrainPlan& plan, int world);

// What a rank sends and receives in one optimizer step, per (group, op), as its group's CommLedger
// counts it. Group names are the trainer's (Trainer::ledgers()): the strategy's groups, then "pp",
// "cp", "tp", then the runner's own.
struct GroupTraffic {
  std::string group;  // as reports and ledgers print it: name(dims), or a group of its own ("loss")
  CommOp op = CommOp::all_reduce;
  int64_t calls = 0;
  int64_t bytes_sent = 0, bytes_received = 0;
  // The group's world ranks in ring order (DeviceMesh::group_members): which links its rings cross.
  std::vector<int> members;
  // A mesh group's dims as its name lists them: the one the trainer names it by (dp_shard_cp), or
  // a set it does not name ({pp, tp}: "pp+tp"). Empty: a group of its own, or this rank alone ("self").
  MeshDims dims;
};
std::vector<GroupTraffic> estimate_traffic(const ModelShape& model, const TrainPlan& plan, const BatchShape& batch,
                                           int rank);

// The expert rules of a layout: ep > 1 only with experts, ep divides E (tp does not cut the experts).
// Throws sl::Error naming the values.
void check_experts(const ModelShape& model, const ParallelismConfig& parallelism);

}  // namespace sl::parallel::planner
