// exercises/09_fsdp_unshard/fsdp_linear.h — one FSDP unit (a Linear), shared by student.cpp and grader.cpp.
//
//   the unit's parameters, flat:   | weight [out, in] row-major | bias [out] | pad |   P = N·S elements
//   rank r keeps                   elements [r·S, (r+1)·S): S = ceil(Ψ_u / N), Ψ_u = out·in + out
//
// The grader builds it (the shards cut from the same weights on every rank, grad_shard zeros); the
// student's unshard, reshard and reduce_gradients run its life.
#pragma once
#include <cstdint>
#include <memory>

#include "parallel/zero/fsdp_unit.h"
#include "tensor/tensor.h"

namespace exercise09 {

struct FsdpLinear {
  int64_t in = 0, out = 0;
  int64_t numel = 0;        // Ψ_u = out·in + out
  int64_t shard_numel = 0;  // S = ceil(Ψ_u / N); the padding (P - Ψ_u zeros) sits at the end of the last shard
  sl::Tensor weight_shard;  // [S]: this rank's elements of the flat parameters
  sl::Tensor grad_shard;    // [S]: the same elements of the mean gradient, summed over backwards
  sl::Tensor full;          // [P = N·S]: the gathered parameters, only while unsharded
  sl::Tensor weight, bias;  // [out, in] and [out]: views of full that require grad, only while unsharded
  std::shared_ptr<sl::parallel::FsdpUnit> library;  // SOLUTION=1 only: the library's unit behind this one
};

}  // namespace exercise09
