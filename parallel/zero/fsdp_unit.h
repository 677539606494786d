// fsdp_unit.h — one FSDP unit: the parameters of one wrapped module, flat, padded and sharded.
//
//   between steps         this rank keeps  weights [S]  grads [S]  exp_avg [S]  exp_avg_sq [S]   (16 S bytes)
//                         mixed precision: 16-bit weights [S] and grads [S] (f32: main_grad), the
//                         f32 master [S] beside the moments: 2S + 2S + 12S, FSDP's 16Ψ/N again
//   unshard()             all-gather [S] x N  ->  full [P]  (P = S x N: Ψ_u padded); the params view it
//   reshard()             full's bytes released in place (the params and autograd's saved tensors keep
//                         naming the same Storage, so no copy of the weights survives anywhere)
//   pre_backward()        unshard() + zeroed full grads [P] bound as the params' .grad
//   (AccumulateGrad adds each param's gradient in place; the last one's hook calls post_backward)
//   post_backward()       reduce-scatter(avg) full grads -> my chunk [S] of them, in place; HSDP: all-reduce(avg)
//                         over replicas; added into the grad shard; full grads freed; reshard()
//
// The unit's layout (segments, padding, shard pieces with AdamW's decay flag) is parallel/zero/flat_params.h.
// Why release in place: a Linear's backward node holds a detached alias of its weight. Re-pointing
// the parameter at a new storage (FlatParams::release) would leave that alias, and so the whole
// gathered buffer, alive inside the graph until backward. Storage::release() frees the bytes of the
// one Storage every alias shares; unshard() refills that same Storage before backward reads it.
//
//   Used by: parallel/zero/fsdp.h       Tests: tests/parallel/zero/test_fsdp.cpp
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/optim.h"
#include "parallel/comm/process_group.h"
#include "parallel/runner/state_pieces.h"
#include "parallel/zero/flat_params.h"
#include "parallel/zero/sharded_adamw.h"

namespace sl::parallel {

struct FsdpOptions {
  // CPU offload (FSDP's CPUOffload, ZeRO-Offload's placement): every unit's weight shard, gradient
  // shard and AdamW state live on the host (ledger "offload", 16 S bytes) and the update runs there.
  // Per step the weight shards move up before each all-gather (forward and backward: 2 x eS) and
  // the reduced gradient shards move down (eS), e the bytes of the model's dtype (parallel/zero/host_link.h).
  // A rank's host is cpu:i for a device with index i (a CPU rank's: itself).
  bool offload = false;
  // What the summed gradients are divided by; 0: the shard group's size (every rank of it a
  // data-parallel replica: the average). FSDP over dp_shard x cp (parallel/nd) divides by dp_shard:
  // the cp ranks of one replica hold its tokens' parts of the gradient, which add.
  int gradient_divisor = 0;
  // Mixed precision (16-bit parameters): the dtype the gradients are reduced and kept in; unset: the
  // parameters' (the paper's 2 + 2 + 12 bytes over N), f32: main_grad. The unit keeps an f32 master
  // shard for AdamW (the options must set master_weights).
  std::optional<DType> grad_dtype = std::nullopt;
  // Parameters kept out of every unit (FullyShardedGPT; true: left out), whole on their rank and
  // never freed: an expert-parallel model's experts, which their own replicas average. None by default.
  std::function<bool(const nn::Placement&)> leave_out;
};

class FsdpUnit {
 public:
  // Flattens `params` (GPT-2 names with their tensors) into one buffer padded to a multiple of shard_group's size,
  // keeps this rank's shard of it, and frees the rest. Every rank must pass parameters holding the
  // same values (built from the same seed). replicate_group (HSDP) may be null.
  // options.offload: the weight shard, the gradient shard and AdamW's state live on the host (ledger
  // category "offload") and the update runs there; unshard() moves the weight shard up before its
  // all-gather and post_backward() moves the reduced gradient shard down.
  static std::shared_ptr<FsdpUnit> make(std::string name, const nn::NamedTensors& params, ProcessGroupPtr shard_group,
                                        ProcessGroupPtr replicate_group, const FsdpOptions& options = {});

  enum class State : uint8_t { sharded, gathered, backward };

  void unshard();          // all-gather the parameters (no-op unless sharded)
  void reshard();          // free the gathered parameters' bytes in place (no-op if sharded)
  void pre_backward();     // unshard + bind zeroed full gradients, start counting (no-op if already)
  void finish_backward();  // post_backward now if a backward left this unit waiting (unused params)

  // AdamW on the shard (parallel/zero/sharded_adamw.h: nn::AdamW's update, piece by piece).
  void adamw_step(const nn::AdamWOptions& options, double lr);
  void zero_grad();
  // The optimizer state by parameter name ("<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step"),
  // full and unpadded on every rank of the shard group: collective. Empty before the first step.
  void gather_optimizer_state(nn::StateDict& out) const;

  // Distributed checkpoints: my shard as runs of the unit's parameters, views of the weights, AdamW's
  // moments and the f32 master (mixed precision), wherever they live (the host when offloading).
  std::vector<LocalStateRun> shard_state(const MeshDims& replicated_over);
  std::vector<LocalGradientRun> shard_gradients() const;  // the gradient shard as runs (views)
  int64_t step_count() const;         // AdamW's, the most any parameter took
  void set_step_count(int64_t steps);  // every parameter's
  // Full (unpadded) copies on every rank of the shard group, by parameter name: collective.
  void gather_weights(nn::StateDict& out) const { gather(weight_shard_, out); }
  void gather_grads(nn::StateDict& out) const { gather(grad_shard_, out); }

  const std::string& name() const { return name_; }
  const std::vector<std::string>& param_names() const { return param_names_; }  // layout().segments' order
  const FlatLayout& layout() const { return flat_->layout(); }
  State state() const { return state_; }
  bool has_grad() const { return has_grad_; }
  const Tensor& weight_shard() const { return weight_shard_; }
  const Tensor& grad_shard() const { return grad_shard_; }
  const Tensor& master_shard() const { return master_; }  // mixed precision: f32 [S]; else undefined

  FsdpUnit(const FsdpUnit&) = delete;
  FsdpUnit& operator=(const FsdpUnit&) = delete;

 private:
  FsdpUnit(std::string name, const nn::NamedTensors& params, ProcessGroupPtr shard_group,
           ProcessGroupPtr replicate_group, const FsdpOptions& options);
  void on_grad_accumulated();  // a parameter's post-accumulate-grad hook
  void post_backward();
  Storage& full_storage() const { return *flat_->buffer().impl()->storage; }
  void gather(const Tensor& shard, nn::StateDict& out) const;

  std::string name_;
  std::vector<std::string> param_names_;
  std::unique_ptr<FlatParams> flat_;  // the params view flat_->buffer(), whose bytes come and go
  ProcessGroupPtr shard_group_, replicate_group_;
  bool offload_ = false;
  int gradient_divisor_ = 0;            // FsdpOptions::gradient_divisor
  DType grad_dtype_ = DType::f32;       // FsdpOptions::grad_dtype, resolved
  Device device_, host_;                // host_: cpu:i for device index i (on a CPU build, the same)
  Tensor weight_shard_, grad_shard_;    // [S] each: what this rank owns (offload: on the host)
  Tensor master_;                       // mixed precision: the f32 weights of the shard [S], "optimizer"
  std::unique_ptr<ShardedAdamW> adam_;  // exp_avg, exp_avg_sq [S]
  Tensor full_grads_;                   // [P], only during this unit's backward
  size_t pending_grads_ = 0;            // parameters still to accumulate in this backward
  bool has_grad_ = false;               // a backward reached the unit since zero_grad (AdamW skips it otherwise)
  State state_ = State::gathered;
};

}  // namespace sl::parallel
