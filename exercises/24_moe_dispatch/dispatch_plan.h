// exercises/24_moe_dispatch/dispatch_plan.h — the types student.cpp and grader.cpp share.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace exercise24 {

// Which assignments each expert computes: expert 0's first, each expert's in the order it served them.
struct Plan {
  std::vector<int64_t> token;   // [M] the token of each kept assignment
  std::vector<int64_t> choice;  // [M] its entry n·k + j
  std::vector<int64_t> routed;  // [E] routed to each expert
  std::vector<int64_t> kept;    // [E] computed by each expert
};

struct Dispatched {
  sl::Tensor rows;               // [M, C]: rows[m] = x[token[m]]
  std::vector<int64_t> offsets;  // [E + 1]: expert e's rows are [offsets[e], offsets[e + 1])
};

}  // namespace exercise24
