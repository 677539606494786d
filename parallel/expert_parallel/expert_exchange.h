// expert_exchange.h — the differentiable pieces expert parallelism adds to autograd: an uneven
// all-to-all (rows of dim 0, per-destination counts) whose backward is the same exchange with the
// counts swapped, a gradient scale (identity forward, backward × s), and a loss attached to an
// output (identity forward, backward also seeds the loss).
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

// y unchanged; its backward also gives the scalar `loss` the gradient `weight`, as if weight · loss
// had been added to the loss being backpropagated (Megatron's MoEAuxLossAutoScaler). A layer's
// auxiliary loss rides on its output this way to a pipeline stage's backward, which starts from the
// gradient the next stage sent, not from a loss it could add to.
Tensor attach_loss(const Tensor& y, const Tensor& loss, double weight);

}  // namespace sl::parallel
