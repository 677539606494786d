// fsdp_nd_runner.cpp — see fsdp_nd_runner.h.
#include "parallel/nd/fsdp_nd_runner.h"

#include "parallel/zero/zero_strategies.h"

namespace sl::parallel {

void check_fsdp_cut(const ParallelismConfig& c, const PipelineOptions& options, bool offload) {
  SL_CHECK(!offload, "FSDP over a cut model: ", c.str(), ": --offload with pp, tp or cp is not supported (FSDP ",
           "offloads the whole model only)");
  if (c.pp == 1) return;
  SL_CHECK(options.virtual_stages == 1 && options.schedule != ScheduleKind::interleaved,
           "FSDP over pipeline stages: ", c.str(),
           ": FSDP shards one chunk per rank; the interleaved schedule (virtual_stages ", options.virtual_stages,
           ") gives each rank several: use naive, gpipe or 1f1b");
  SL_CHECK(options.schedule != ScheduleKind::zero_bubble, "FSDP over pipeline stages: ", c.str(),
           ": the zero-bubble schedule's W actions would fill a unit's weight gradients after the unit's next ",
           "forward has resharded it: use naive, gpipe or 1f1b");
}

FsdpNdRunner::FsdpNdRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh, const NdOptions& options)
    : NdRunner(config, seed, mesh, (check_fsdp_cut(mesh.config(), options.pipeline, false), options)),
      grad_dtype_(options.grad_dtype) {}

std::unique_ptr<DataParallelStrategy> FsdpNdRunner::own_strategy(const DeviceMesh& mesh,
                                                                 const nn::AdamWOptions& adamw) {
  SL_CHECK(!fsdp_, "FsdpNdRunner::own_strategy: the part is already sharded");
  SL_ASSERT(stage().parts.size() == 1);  // check_fsdp_cut: one chunk per rank
  ProcessGroupPtr replicas = mesh.size(MeshDim::dp_replicate) > 1 ? mesh.group(MeshDim::dp_replicate) : nullptr;
  fsdp_ = std::make_shared<FullyShardedGPT>(
      *stage().parts[0], mesh.group(MeshDim::dp_shard_cp), replicas, adamw,
      FsdpOptions{.gradient_divisor = mesh.size(MeshDim::dp_shard), .grad_dtype = grad_dtype_});
  return std::make_unique<FsdpStrategy>(fsdp_, *this, mesh, MeshDims{MeshDim::dp_shard, MeshDim::cp});
}

nn::StateDict FsdpNdRunner::full_state_dict() {
  if (!fsdp_) return NdRunner::full_state_dict();
  const nn::StateDict whole = fsdp_->full_state_dict();  // this part, gathered over dp_shard_cp
  return gather(false, &whole);
}

nn::StateDict FsdpNdRunner::full_gradients() {
  if (!fsdp_) return NdRunner::full_gradients();
  const nn::StateDict whole = fsdp_->full_grads();
  return gather(true, &whole);
}

void FsdpNdRunner::load_full_state_dict(const nn::StateDict& full) {
  SL_CHECK(!fsdp_, "FsdpNdRunner::load_full_state_dict: the part is sharded (FSDP); load its weights before");
  NdRunner::load_full_state_dict(full);
}

}  // namespace sl::parallel
