// exercises/projects/04_fsdp_prefetch/wrong_prefetch_after_compute.cpp — the next gather issued after the compute.
//
// A common mistake: "prefetch the next unit" written as start_gather(i+1) right after forward(i).
// Every unit is still gathered once and the result is right, but nothing overlaps: the next
// all-gather only starts once the block has finished, so each unit still waits gather + compute,
// exactly FSDP without prefetch. The gather must be on the wire WHILE the block computes.
// expect: start_gather(i+1) before forward(i)
#include <vector>

#include "exercises/grader.h"
#include "exercises/projects/04_fsdp_prefetch/sharded_block.h"

namespace project04 {

sl::Tensor forward_with_prefetch(const std::vector<ShardedBlock*>& units, const sl::Tensor& x) {
  sl::Tensor h = x;
  sl::parallel::WorkPtr next = units[0]->start_gather();
  for (size_t i = 0; i < units.size(); ++i) {
    units[i]->finish_gather(next);
    h = units[i]->forward(h);
    if (i + 1 < units.size()) next = units[i + 1]->start_gather();  // the mistake: after the compute, not before
    units[i]->reshard();
  }
  return h;
}

}  // namespace project04
