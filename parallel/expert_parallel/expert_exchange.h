// expert_exchange.h — the two differentiable pieces expert parallelism adds to autograd: an uneven
// all-to-all (rows of dim 0, per-destination counts) whose backward is the same exchange with the
// counts swapped, and a gradient scale (identity forward, backward × s).
#pragma once
#include <vector>

#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace sl::parallel {

// x [Σ send, ...] -> [Σ receive, ...]: send[d] rows go to group rank d, receive[s] rows come from s.
// Collective over `group`, and so is its backward: under grad mode it runs on every rank, whether x
// needs a gradient there or not (a rank none of whose experts got rows computes nothing from a weight).
Tensor exchange_rows(const Tensor& x, const ProcessGroupPtr& group, const std::vector<int64_t>& receive,
                     const std::vector<int64_t>& send);

// x unchanged; its gradient multiplied by `scale`.
Tensor scale_gradient(const Tensor& x, double scale);

}  // namespace sl::parallel
