// linear.cpp — see linear.h.
#include "parallel/tensor_parallel/linear.h"

#include <utility>

#include "autograd/grad_mode.h"
#include "parallel/comm/mesh_dim.h"
#include "parallel/runner/fault_sites.h"
#include "parallel/tensor_parallel/mappings.h"

namespace sl::parallel {

namespace {

// What enters a column-parallel layer: f(x) (x [B, T, C]), or under SP the gathered sequence
// (x [B, T/t, C] -> [B, T, C]).
Tensor column_input(const Tensor& x, const TPGroup& tp) {
  return tp.sequence_parallel ? gather_sequence(x, tp.group) : copy_to_tp(x, tp.group);
}

// What leaves a row-parallel layer: g(partial) + bias (partial [B, T, out]), or under SP the
// reduce-scattered rows + bias ([B, T/t, out]). bias may be undefined.
Tensor row_output(Tensor partial, const Tensor& bias, const TPGroup& tp) {
  if (const FaultSites* faults = FaultSites::here())  // a fault the divergence finder planted; none otherwise
    partial = faults->before_partial_sum(partial, bias);
  Tensor summed = tp.sequence_parallel ? reduce_scatter_sequence(partial, tp.group) : reduce_from_tp(partial, tp.group);
  return bias.defined() ? add(summed, bias) : summed;  // once, after the sum
}

// A new Linear(in, out) holding copies of `weight` [out, in] and `bias` [out] (or none).
std::shared_ptr<nn::Linear> linear_holding(const Tensor& weight, const Tensor& bias) {
  Generator scratch(0);  // the constructor's draw is overwritten: keep it off the thread's generator
  auto shard = std::make_shared<nn::Linear>(weight.size(1), weight.size(0), bias.defined(),
                                            nn::InitOptions{0.0, &scratch, weight.dtype()});
  NoGradGuard no_grad;
  shard->weight.copy_(weight);
  if (bias.defined()) shard->bias.copy_(bias);
  return shard;
}

}  // namespace

void column_input_after(nn::Module& module, const TPGroup& tp) {
  module.register_forward_hook([tp](nn::Module&, const Tensor&, const Tensor& out) { return column_input(out, tp); });
}

void make_column_parallel(nn::Linear& linear, nn::Module& input_from, const TPGroup& tp, bool gather_output) {
  column_input_after(input_from, tp);  // f (SP: all-gather T) on the input
  linear.set_placement("weight", nn::Placement::sharded(0, name(MeshDim::tp)));
  if (linear.bias.defined()) linear.set_placement("bias", nn::Placement::sharded(0, name(MeshDim::tp)));
  if (gather_output)  // [B, T, out/t] -> [B, T, out]
    linear.register_forward_hook(
        [tp](nn::Module&, const Tensor&, const Tensor& out) { return gather_last_dim(out, tp.group); });
}

void make_row_parallel(nn::Linear& linear, const TPGroup& tp) {
  // Linear's forward adds linear.bias; leave that handle empty so it computes the partial product
  // alone. The parameter stays registered (state_dict, optimizer, DDP see it) and is added here.
  Tensor bias = std::exchange(linear.bias, Tensor());
  linear.register_forward_hook(
      [tp, bias](nn::Module&, const Tensor&, const Tensor& partial) { return row_output(partial, bias, tp); });
  linear.set_placement("weight", nn::Placement::sharded(1, name(MeshDim::tp)));
  if (bias.defined() && tp.sequence_parallel)  // added to T/t rows: each rank's gradient is a part
    linear.set_placement("bias", nn::Placement::replicated().with_partial_grad(name(MeshDim::tp)));
}

std::shared_ptr<nn::Linear> column_shard(const nn::Linear& serial, const TPGroup& tp) {
  const int64_t out = serial.weight.size(0), t = tp.size();
  SL_CHECK(out % t == 0, "column_shard: out_features (", out, ") is not divisible by tp (", t, ")");
  const int64_t rows = out / t, start = tp.rank() * rows;
  return linear_holding(serial.weight.detach().narrow(0, start, rows),
                        serial.bias.defined() ? serial.bias.detach().narrow(0, start, rows) : Tensor());
}

std::shared_ptr<nn::Linear> row_shard(const nn::Linear& serial, const TPGroup& tp) {
  const int64_t in = serial.weight.size(1), t = tp.size();
  SL_CHECK(in % t == 0, "row_shard: in_features (", in, ") is not divisible by tp (", t, ")");
  const int64_t cols = in / t;
  return linear_holding(serial.weight.detach().narrow(1, tp.rank() * cols, cols),
                        serial.bias.defined() ? serial.bias.detach() : Tensor());
}

}  // namespace sl::parallel
