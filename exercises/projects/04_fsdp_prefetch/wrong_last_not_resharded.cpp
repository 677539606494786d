// exercises/projects/04_fsdp_prefetch/wrong_last_not_resharded.cpp — the last unit left gathered.
//
// A common mistake: freeing the previous unit at the top of each iteration ("it is done now") and
// forgetting that the loop ends before the last unit's turn comes. The pass is right and overlaps,
// but the last unit stays gathered: its full weights sit in memory through the rest of the step, and
// the next forward's start_gather of it is refused (it is already gathered).
// expect: units still gathered after the pass: reshard every unit
#include <vector>

#include "exercises/grader.h"
#include "exercises/projects/04_fsdp_prefetch/sharded_block.h"

namespace project04 {

sl::Tensor forward_with_prefetch(const std::vector<ShardedBlock*>& units, const sl::Tensor& x) {
  sl::Tensor h = x;
  sl::parallel::WorkPtr current = units[0]->start_gather(), next;
  for (size_t i = 0; i < units.size(); ++i) {
    if (i > 0) units[i - 1]->reshard();  // the previous unit is done; the mistake: the last one never is
    if (i + 1 < units.size()) next = units[i + 1]->start_gather();  // in flight while unit i computes
    units[i]->finish_gather(current);
    h = units[i]->forward(h);
    current = next;
  }
  return h;
}

}  // namespace project04
