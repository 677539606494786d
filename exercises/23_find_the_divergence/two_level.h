// exercises/23_find_the_divergence/two_level.h — what student.cpp writes and the grader calls: the
// pair groups and the two-level all-reduce of a DDP bucket (the groups' type is the library's,
// parallel/data_parallel/comm_hook.h).
#pragma once
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/comm_hook.h"

namespace exercise23 {

double predicted_elements_left_out();
double predicted_leader_bytes_per_step();
// Collective over dp: local = my pair {2p, 2p+1}, across = the leaders {0, 2, ...} (null on the
// others), world = dp's size.
sl::parallel::TwoLevelGroups make_pair_groups(const sl::parallel::ProcessGroupPtr& dp);
// bucket [numel] := the mean over the dp ranks of every rank's bucket: reduce into the pair's leader,
// all-reduce across the leaders, broadcast back into the pair, × 1/N.
void two_level_all_reduce(const sl::Tensor& bucket, const sl::parallel::TwoLevelGroups& groups);

}  // namespace exercise23
