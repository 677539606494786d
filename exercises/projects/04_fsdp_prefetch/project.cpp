// exercises/projects/04_fsdp_prefetch/project.cpp — FSDP's forward with prefetching.
//
// FSDP keeps 1/N of every unit's weights and all-gathers a unit just before its compute
// (parallel/zero/fsdp.h). Without prefetch each unit waits for its own gather:
//
//   comm     |g0|     |g1|     |g2|     |g3|
//   compute      |F0|     |F1|     |F2|     |F3|          time = L · (gather + compute)
//
// With prefetch the next unit's all-gather is issued before this unit computes, so it crosses the
// wire while the block runs (PyTorch's forward_prefetch, DeepSpeed's prefetch bucket):
//
//   comm     |g0||g1|  |g2|  |g3|
//   compute      |F0|  |F1|  |F2|  |F3|                   time ≈ gather + L · max(gather, compute)
//
// The price is memory: two units are unsharded at once (this one and the next), never more.
// Every unit is still gathered exactly once, so the bytes on the wire are unchanged.
//
// The units (sharded_block.h): unit->start_gather() returns the in-flight work, unit->finish_gather(w)
// waits for it, unit->forward(x) runs the block, unit->reshard() frees the gathered bytes.
//
// Grade it:  make project N=04        (README.md: what is checked and the rubric)
#include "exercises/grader.h"
#include "exercises/projects/04_fsdp_prefetch/sharded_block.h"

namespace project04 {

// x [B, T, C] through units[0], units[1], … in order -> [B, T, C]. Each unit gathered exactly once
// and resharded after its compute; unit i+1's gather issued before unit i computes; at most two units
// gathered at any moment.
sl::Tensor forward_with_prefetch(const std::vector<ShardedBlock*>& units, const sl::Tensor& x) {
  // TODO: gather unit 0; then for each unit: issue the next unit's gather, wait for this one's,
  // compute, reshard.
  throw exercises::NotImplemented("forward_with_prefetch");
}

}  // namespace project04
