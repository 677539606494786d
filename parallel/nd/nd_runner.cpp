// nd_runner.cpp — see nd_runner.h.
#include "parallel/nd/nd_runner.h"

namespace sl::parallel {

NdRunner::NdRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh, const NdOptions& options)
    : PipelineRunner(config, seed, mesh, options.pipeline, std::make_shared<const NdParallelizer>(config, mesh, options)),
      tp_rank_(mesh.tp_rank()) {}

}  // namespace sl::parallel
