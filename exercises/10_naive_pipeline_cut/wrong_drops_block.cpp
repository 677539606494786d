// exercises/10_naive_pipeline_cut/wrong_drops_block.cpp — a wrong cut: n_layer / p blocks each, the remainder lost.
//
// A common mistake: giving every stage n_layer / p blocks, [r·(n_layer/p), (r+1)·(n_layer/p)). When
// p divides n_layer this is right; otherwise integer division drops the last n_layer % p blocks, and
// the pipelined model is shallower than the serial one it claims to be. The first n_layer % p stages
// take one block more, so the ranges cover [0, n_layer) exactly.
// expect: the ranges must cover [0, n_layer) exactly
#include <cstdint>
#include <utility>
#include <vector>

#include "exercises/grader.h"
#include "nn/gpt.h"
#include "tensor/error.h"

namespace exercise10 {

double predicted_stage0_parameters() { return 3.0 * (12 * 768 * 768 + 13 * 768) + (50257 + 1024) * 768; }  // + wte, wpe

std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t n_layer, int stages) {
  SL_CHECK(stages >= 1 && n_layer >= stages, "cannot cut ", n_layer, " blocks into ", stages, " stages");
  const int64_t per_stage = n_layer / stages;  // the mistake: the n_layer % p blocks left over go nowhere
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int r = 0; r < stages; ++r) ranges.emplace_back(r * per_stage, (r + 1) * per_stage);
  return ranges;
}

int64_t stage_parameter_count(const sl::nn::GPTConfig& config, int64_t layer_begin, int64_t layer_end) {
  throw exercises::NotImplemented("stage_parameter_count");
}

std::vector<int> tied_wte_stages(int stages) { throw exercises::NotImplemented("tied_wte_stages"); }

}  // namespace exercise10
