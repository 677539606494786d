// exercises/10_naive_pipeline_cut/wrong_remainder_last.cpp — a wrong cut: the extra blocks on the last stages.
//
// A common mistake: handing the n_layer % p extra blocks to the LAST stages. The ranges are a
// valid cut, but not the library's (split_layers gives them to the first stages), so a checkpoint,
// a stage's weights and the schedule's timings disagree with every other part that cuts the model.
// The last stage also holds ln_f and the head, the largest piece: loading it more makes it slower.
// expect: the extra blocks went to the last stages
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
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t begin = 0;
  for (int r = 0; r < stages; ++r) {
    const int64_t count = n_layer / stages + (r >= stages - n_layer % stages ? 1 : 0);  // the mistake: the last stages
    ranges.emplace_back(begin, begin + count);
    begin += count;
  }
  return ranges;
}

int64_t stage_parameter_count(const sl::nn::GPTConfig& config, int64_t layer_begin, int64_t layer_end) {
  throw exercises::NotImplemented("stage_parameter_count");
}

std::vector<int> tied_wte_stages(int stages) { throw exercises::NotImplemented("tied_wte_stages"); }

}  // namespace exercise10
