// comm_hook.cpp — the library's two DDP communication hooks (comm_hook.h).
#include "parallel/data_parallel/comm_hook.h"

#include "autograd/grad_mode.h"
#include "tensor/ledger.h"

namespace sl::parallel {

CommHookFactory all_reduce_hook() {
  return [](const ProcessGroupPtr& group) -> CommHook {
    return [group](const Tensor& bucket) {
      NoGradGuard no_grad;
      group->all_reduce(bucket, ReduceOp::sum);
      bucket.mul_(1.0 / group->size());  // as the built-in avg: the sum times 1/N
    };
  };
}

TwoLevelGroups make_two_level_groups(const ProcessGroupPtr& group, int group_size) {
  const int n = group->size(), rank = group->rank();
  SL_CHECK(group_size >= 1 && n % group_size == 0, "two_level_all_reduce_hook: the data-parallel group's ", n,
           " ranks do not split into groups of ", group_size);
  TwoLevelGroups g;
  g.local = group->split(rank / group_size);
  g.across = group->split(rank % group_size == 0 ? 0 : -1);
  g.world = n;
  return g;
}

void two_level_all_reduce(const Tensor& bucket, const TwoLevelGroups& g) {
  NoGradGuard no_grad;
  ProcessGroup& local = *g.local;
  // 1. Reduce to the group's first rank: every other rank sends its bucket, the first adds them in rank order.
  if (local.rank() != 0) {
    local.send(bucket, 0);
  } else {
    Tensor incoming;
    {
      MemoryScope scope(MemoryCategory::comm);
      incoming = Tensor::empty(bucket.shape(), bucket.options());
    }
    for (int source = 1; source < local.size(); ++source) {
      local.recv(incoming, source);
      bucket.add_(incoming);
    }
  }
  // 2. The first ranks all-reduce their groups' sums: every rank's gradient, once.
  if (g.across) g.across->all_reduce(bucket, ReduceOp::sum);
  // 3. Back into the group, then the mean.
  local.broadcast(bucket, 0);
  bucket.mul_(1.0 / g.world);
}

CommHookFactory two_level_all_reduce_hook(int group_size) {
  return [group_size](const ProcessGroupPtr& group) -> CommHook {
    const TwoLevelGroups g = make_two_level_groups(group, group_size);
    return [g](const Tensor& bucket) { two_level_all_reduce(bucket, g); };
  };
}

}  // namespace sl::parallel
