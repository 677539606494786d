// exercises/23_find_the_divergence/wrong_tail_left_out.cpp — a wrong solution: the hook as shipped,
// with the predictions written in.
//
// The across step copies the bucket through the staging buffer in whole pieces only: the loop stops
// before the last, partial piece, whose elements keep their pair's sum. At Ψ = 10944 that is the last
// 704 elements of the bucket, the last 44 rows of wte.weight, wrong on every rank.
// expect: FIRST DIVERGENCE: step 0, backward, wte.weight
// expect: 704 of 4096 elements over the bound
// expect: 704 of its elements are not the mean, elements [10240, 10944)
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
    for (int64_t begin = 0; begin + kStagingElements <= numel; begin += kStagingElements) {
      const Tensor piece = bucket.flat_view(begin, Shape({kStagingElements}));
      staging.copy_(piece);
      groups.across->all_reduce(staging, ReduceOp::sum);
      piece.copy_(staging);
    }
  }
  // 3. Back into the pair, and 4. the mean.
  pair.broadcast(bucket, 0);
  bucket.mul_(1.0 / groups.world);
}

}  // namespace exercise23
