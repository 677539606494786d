// exercises/23_find_the_divergence/wrong_divided_twice.cpp — a wrong solution: the partial piece sent,
// but the leaders all-reduce with ReduceOp::avg and the end still multiplies by 1/N.
//
// Every element is then the sum over the N ranks divided by P·N: 1/P of the mean (1/2 at dp 4), on
// every rank and every parameter, from the first gradient on. dp 2 (P = 1) hides it.
// expect: FIRST DIVERGENCE: step 0, backward, ln_f.bias
// expect: every element is 0.500000 x the mean
#include <algorithm>

#include "autograd/grad_mode.h"
#include "exercises/23_find_the_divergence/two_level.h"
#include "exercises/grader.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise23 {

// PREDICT FIRST, from this file and the finder's report. The grader's layout is GPT with n_layer 2,
// n_embd 16, n_head 4, block_size 16 and a vocabulary of 256 (wte tied to the head): all its
// Ψ parameters in one bucket, wte.weight [256, 16] last (buckets are filled in reverse parameter
// order). How many elements of the bucket does two_level_all_reduce below leave out of the sum across
// pairs, each step? Replace the throw with your number.
double predicted_elements_left_out() { return 704; }

// PREDICT FIRST. Once the hook is right: at dp 4 (2 pairs), how many bytes does rank 0, a pair's
// leader, send per step over all its groups (the bucket in f32: S = 4Ψ bytes)?
double predicted_leader_bytes_per_step() { return 87552; }

// The groups, made once per rank when DDP is built (collective over dp: every rank calls each split).
TwoLevelGroups make_pair_groups(const ProcessGroupPtr& dp) {
  TwoLevelGroups groups;
  groups.local = dp->split(dp->rank() / 2);                       // my pair: {2p, 2p+1}
  groups.across = dp->split(dp->rank() % 2 == 0 ? 0 : -1);        // the leaders {0, 2, ...}; null on the others
  groups.world = dp->size();
  return groups;
}

// The across step sends through a staging buffer of kStagingElements floats (4 KiB), as a hook that
// copies to pinned host memory before a slow link would: one all-reduce per piece.
constexpr int64_t kStagingElements = 1024;

// bucket [numel] f32 := the mean over the N dp ranks of every rank's bucket.
void two_level_all_reduce(const Tensor& bucket, const TwoLevelGroups& groups) {
  NoGradGuard no_grad;
  ProcessGroup& pair = *groups.local;
  const int64_t numel = bucket.numel();
  // 1. Reduce into the leader.
  if (pair.rank() == 1) {
    pair.send(bucket, 0);
  } else {
    Tensor partner;
    {
      MemoryScope scope(MemoryCategory::comm);
      partner = Tensor::empty(bucket.shape(), bucket.options());
    }
    pair.recv(partner, 1);
    bucket.add_(partner);
  }
  // 2. Across pairs, leaders only, one staging buffer's worth at a time.
  if (groups.across) {
    Tensor staging;
    {
      MemoryScope scope(MemoryCategory::comm);
      staging = Tensor::empty(Shape({kStagingElements}), bucket.options());
    }
    for (int64_t begin = 0; begin < numel; begin += kStagingElements) {
      const int64_t count = std::min(kStagingElements, numel - begin);
      const Tensor piece = bucket.flat_view(begin, Shape({count})), stage = staging.flat_view(0, Shape({count}));
      stage.copy_(piece);
      groups.across->all_reduce(stage, ReduceOp::avg);  // the leaders' mean ...
      piece.copy_(stage);
    }
  }
  // 3. Back into the pair, and 4. the mean.
  pair.broadcast(bucket, 0);
  bucket.mul_(1.0 / groups.world);  // ... and the mean again: 1/P of the mean
}

}  // namespace exercise23
