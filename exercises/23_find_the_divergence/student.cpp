// exercises/23_find_the_divergence/student.cpp — a two-level all-reduce for DDP that ships BROKEN:
// find where with the divergence finder, then fix it.
//
// A cluster of nodes with 2 GPUs each: the GPUs of a node talk fast, the nodes slowly. Horovod's
// hierarchical all-reduce (and NCCL's trees) average each bucket in two levels, so that only one
// rank per node talks across nodes. Here a "node" is a pair of consecutive data-parallel ranks:
//
//   dp ranks     0   1 │ 2   3 │ ...       pair p = ranks {2p, 2p+1}; its first rank 2p leads it
//   1. reduce    1 → 0 │ 3 → 2             the second rank sends its bucket, the leader adds it
//   2. across    0 ◄────► 2 ◄──► ...       the leaders all-reduce (sum) their pairs' sums: Σ of all N
//   3. back      0 → 1 │ 2 → 3             the leader broadcasts the sum into its pair
//   4. mean      bucket × 1/N              on every rank
//
// It runs as a DDP communication hook (parallel/data_parallel/comm_hook.h): DDP calls it with each
// bucket, the flat f32 gradients of the bucket's parameters (this rank's, summed over its micro-batches),
// in bucket order, when the bucket is ready; it must leave the bucket holding the mean over all N ranks.
// Every rank must call the same collectives on the same groups in the same order (a send meets a recv).
// The grader runs it inside a real layout, train's `--dp 4` (and dp 2, dp 8), through the library's
// divergence finder (parallel/train/divergence.h, docs/diverge.md), which compares every rank's
// gradients and weights with a serial run and names the first place they differ.
//
// The code below runs, trains, and is wrong. Do not rewrite it: run the grader, read what the finder
// prints (step, phase, parameter, ranks, how many elements, which serial indices), work out from it
// and from this code which elements of the bucket go wrong and why, and fix that.
//
// Tools: ProcessGroup::split, send, recv, all_reduce, broadcast (parallel/comm/process_group.h),
// Tensor::flat_view, copy_, add_, mul_ (tensor/tensor.h), sl::parallel::TwoLevelGroups (comm_hook.h).
// Do not call the library's make_two_level_groups or two_level_all_reduce.
//
// Grade it:  make exercise N=23
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
double predicted_elements_left_out() { throw exercises::NotImplemented("predicted_elements_left_out (predict first)"); }

// PREDICT FIRST. Once the hook is right: at dp 4 (2 pairs), how many bytes does rank 0, a pair's
// leader, send per step over all its groups (the bucket in f32: S = 4Ψ bytes)?
double predicted_leader_bytes_per_step() { throw exercises::NotImplemented("predicted_leader_bytes_per_step (predict first)"); }

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
