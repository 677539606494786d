// fault_sites.h — the places inside the chapters where the debug probe (debug_probe.h) plants a
// mistake that no module hook can reach: a rank's contribution to a sharded gradient's reduce, a
// row-parallel layer's partial product before its sum over tp, the ring's causal mask, the row
// order after Ulysses' all-to-all, an expert-parallel layer's capacity and its combine's weights. Each chapter asks this rank's sites at its place; a rank thread
// without a probe that plants such a fault (every ordinary run) has none, and the question is one
// thread-local read of a null pointer: nothing else runs, and the results are bitwise the same.
//
//   site                           asked in                                the mistake a fault plants there
//   before_gradient_reduce(p)      zero/zero_reducer.cpp (ZeRO-2: before   p.grad, this rank's part of p's gradient,
//                                  a bucket's reduce-scatter),             × F before the reduce over dp_shard
//                                  zero/fsdp_unit.cpp (FSDP, HSDP)         (× cp): x0 drops this rank's part
//   before_partial_sum(y_i, b)     tensor_parallel/linear.cpp (the row-    b (+ V) added to y_i = X_i·B_iᵀ on this
//                                  parallel layer, before g sums over tp)  rank; the sum then adds b once more
//   breaks(zigzag_unswapped)       context_parallel/ring_attention.cpp     the ring's mask as if cp rank r held
//                                                                          chunks r and cp+r (zigzag without its
//                                                                          swap); the data stays where it is
//   breaks(ulysses_arrival_order)  context_parallel/ulysses_attention.cpp  sequence -> heads stacks the received
//                                                                          rows rank by rank, not at their places
//   breaks(local_capacity)         expert_parallel/expert_parallel_moe.cpp each batch rank's tokens capped on their
//                                                                          own: capacity ceil(cf·N_l·k/E), not the
//                                                                          MoE batch's ceil(cf·R·N_l·k/E)
//   breaks(detached_combine_weights)  expert_parallel/expert_parallel_moe.cpp  the combine multiplies by the router's
//                                                                          weights detached: no gradient to the router
//
// The module-level sites act inside the module the probe sees running (h.N.attn or h.N.mlp: its
// forward hooks mark it), at the step and mesh coordinates the fault names.
//
// Thread safety: the sites are this rank thread's (ranks are threads); a chapter asks them on the
// thread that runs its forward and backward, which is the rank's.
//
//   Tests: tests/parallel/train/test_divergence_faults.cpp, test_divergence_experts.cpp
#pragma once
#include "tensor/tensor.h"

namespace sl::parallel {

class FaultSites {
 public:
  enum class Mistake { zigzag_unswapped, ulysses_arrival_order, local_capacity, detached_combine_weights };

  // This rank thread's sites; null when no probe planting a fault at them is attached on it.
  static const FaultSites* here();

  virtual ~FaultSites() = default;
  // `parameter`'s .grad holds this rank's contribution to the reduce that follows; changed in place.
  virtual void before_gradient_reduce(const Tensor& parameter) const = 0;
  // A row-parallel layer's partial product [B, T, out] and its bias [out] (undefined: none): what
  // this rank sends into the sum over tp.
  virtual Tensor before_partial_sum(const Tensor& partial, const Tensor& bias) const = 0;
  // Whether the chapter makes `mistake` here, now, on this rank.
  virtual bool breaks(Mistake mistake) const = 0;

 protected:
  // Makes `sites` this thread's (null: none), for as long as the caller says.
  static void set_here(const FaultSites* sites);
};

}  // namespace sl::parallel
