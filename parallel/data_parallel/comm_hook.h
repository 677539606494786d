// comm_hook.h — DDP communication hooks (PyTorch's DistributedDataParallel.register_comm_hook): the
// code that turns one bucket of this rank's gradients into the average over the data-parallel group.
//
//   DDP's default: one async all-reduce (avg) of each bucket, launched from backward (ddp.h).
//   A hook replaces it: DDP calls hook(bucket) when the bucket's last gradient is in, in bucket order,
//   and the hook must return with `bucket` holding the average over every rank of the group.
//
//   bucket [numel]   this rank's gradients of the bucket's parameters, end to end, in the buckets'
//                    dtype (DDPOptions::grad_dtype, else the parameters': f32, or bf16/f16 under
//                    mixed precision), already summed over the rank's micro-batches
//
// The contract, the same one NCCL and PyTorch's hooks live by:
//   - every rank of the group calls the same collectives, on the same groups, in the same order, with
//     the same sizes: a hook that branches on the rank must keep the ranks' calls matched (a send
//     meets a recv), or the ranks wait for each other until the group's timeout;
//   - it runs synchronously, on the rank's own thread, inside backward: backward resumes when it
//     returns, so its communication does not overlap the rest of backward (the built-in all-reduce
//     does); the last bucket's hook returns before loss.backward() does;
//   - it may keep state (sub-groups, buffers): a CommHookFactory builds each rank's hook once, when
//     DistributedDataParallel is built, on every rank of the group (so it may create sub-groups:
//     ProcessGroup::split and new_group are collective over the group).
//
// Two hooks come with the library:
//   all_reduce_hook()              all_reduce (sum), then × 1/N: the built-in's values, bitwise
//   two_level_all_reduce_hook(L)   the hierarchical all-reduce of Horovod and NCCL's trees over groups of L
//                                  consecutive ranks (a node's GPUs): reduce to each group's first rank,
//                                  all-reduce across the first ranks, broadcast back, × 1/N
//
//     ranks      0   1 │ 2   3          reduce in the pair:   1 → 0, 3 → 2        (send/recv, S bytes)
//     leaders    0 ◄────► 2             all-reduce across:    ring over N/L ranks (2(P-1)/P · S, P = N/L)
//     broadcast  0 → 1 │ 2 → 3          back into the pair:   (S bytes from each leader)
//
//   Bytes sent per rank and step, S = the bucket's bytes (4Ψ in f32 over all buckets), P = N/L groups,
//   in pairs (L = 2):
//     a pair's first rank   S (broadcast) + 2(P-1)/P · S (across)
//     its second rank       S (its gradient, sent to the first)
//   (L > 2: each other rank sends S to the first, and the chain broadcast of the threads backend has
//   every rank but the last forward S.)
//   Only the first ranks talk between groups, in a ring of P ranks rather than N: 2(P-1) steps over
//   the slow links instead of the flat ring's 2(N-1), the latency that dominates small buckets. The
//   sums' order differs from the ring's, so the values equal the built-in's to rounding, not bitwise.
//
//   Tests: tests/parallel/data_parallel/test_comm_hook.cpp    Exercise: exercises/23_find_the_divergence
#pragma once
#include <functional>
#include <memory>

#include "parallel/comm/process_group.h"

namespace sl::parallel {

// One bucket's reduction: on return `bucket` holds the average of every rank's bucket.
using CommHook = std::function<void(const Tensor& bucket)>;
// Builds a rank's hook over its data-parallel group, once per DistributedDataParallel (collective over
// `group`). Empty: DDP's built-in async all-reduce. Called from every rank's thread at once: keep
// per-rank state in the hook it returns, not in the factory.
using CommHookFactory = std::function<CommHook(const ProcessGroupPtr& group)>;

// all_reduce(sum) then × 1/N: the built-in's values bitwise (its avg is the same sum times 1/N), run
// synchronously.
CommHookFactory all_reduce_hook();
// The two-level all-reduce over groups of `group_size` consecutive ranks (above): the hook of
// make_two_level_groups and two_level_all_reduce. The group's size must be a multiple of it (sl::Error
// naming both, when DDP is built).
CommHookFactory two_level_all_reduce_hook(int group_size);

// One rank's groups of the two levels.
struct TwoLevelGroups {
  ProcessGroupPtr local;   // the group_size consecutive ranks of this rank's group; its first is local rank 0
  ProcessGroupPtr across;  // the groups' first ranks, in order; null on every other rank
  int world = 1;           // the data-parallel group's size N: the mean divides by it
};
// Collective over `group` (two splits).
TwoLevelGroups make_two_level_groups(const ProcessGroupPtr& group, int group_size);
// `bucket` := the mean of every rank's bucket: reduce to local rank 0 (send/recv, summed in local rank
// order), all-reduce (sum) across, broadcast from local rank 0, × 1/N.
void two_level_all_reduce(const Tensor& bucket, const TwoLevelGroups& groups);

}  // namespace sl::parallel
