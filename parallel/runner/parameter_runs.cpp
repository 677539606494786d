// parameter_runs.cpp — whole_parameter_runs and whole_gradient_runs (state_pieces.h): a module's
// parameters whole, with nn::AdamW's state, and their gradients. Apart from state_pieces.cpp, whose regions the fuzzers link without the library.
#include "parallel/runner/state_pieces.h"

#include "parallel/runner/model_runner.h"
#include "tensor/error.h"

namespace sl::parallel {

std::vector<LocalGradientRun> whole_gradient_runs(nn::Module& module) {
  std::vector<LocalGradientRun> runs;
  for (const auto& [name, param] : module.named_parameters()) {
    const Tensor grad = grad_or_zeros(param);
    runs.push_back({name, 0, param.numel(), grad.flat_view(0, {param.numel()})});
  }
  return runs;
}

std::vector<LocalStateRun> whole_parameter_runs(nn::Module& module, nn::AdamW* adamw,
                                                const MeshDims& replicated_over) {
  std::vector<LocalStateRun> runs;
  size_t i = 0;
  for (const auto& [name, param] : module.named_parameters()) {
    const int64_t n = param.numel();
    LocalStateRun run{name, 0, n, {{StateKind::weight, param.detach().flat_view(0, {n})}}, replicated_over};
    if (adamw) {
      SL_ASSERT(adamw->params()[i].is_same(param));
      run.data.push_back({StateKind::exp_avg, adamw->ensure_buffer(i, "exp_avg").flat_view(0, {n})});
      run.data.push_back({StateKind::exp_avg_sq, adamw->ensure_buffer(i, "exp_avg_sq").flat_view(0, {n})});
      if (adamw->state(i).buffers.count("master"))
        run.data.push_back({StateKind::master, adamw->state(i).buffers.at("master").flat_view(0, {n})});
    }
    runs.push_back(std::move(run));
    ++i;
  }
  return runs;
}

}  // namespace sl::parallel
