// exercises/projects/04_fsdp_prefetch/wrong_prefetch_all.cpp — every unit's gather issued up front.
//
// A common mistake: "prefetch as much as possible": start every unit's all-gather before the first
// compute. The gathers overlap everything and the result is right, but each gather allocates its
// unit's full weights at once: the peak is the whole unsharded model, which is what FSDP exists to
// avoid. Prefetch one unit ahead: at most two units gathered at any moment.
// expect: prefetch one unit ahead, not all
#include <vector>

#include "exercises/grader.h"
#include "exercises/projects/04_fsdp_prefetch/sharded_block.h"

namespace project04 {

sl::Tensor forward_with_prefetch(const std::vector<ShardedBlock*>& units, const sl::Tensor& x) {
  std::vector<sl::parallel::WorkPtr> gathers;
  for (ShardedBlock* unit : units) gathers.push_back(unit->start_gather());  // the mistake: all L at once
  sl::Tensor h = x;
  for (size_t i = 0; i < units.size(); ++i) {
    units[i]->finish_gather(gathers[i]);
    h = units[i]->forward(h);
    units[i]->reshard();
  }
  return h;
}

}  // namespace project04
