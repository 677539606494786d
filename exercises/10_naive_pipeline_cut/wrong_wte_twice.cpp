// exercises/10_naive_pipeline_cut/wrong_wte_twice.cpp — a wrong count: the tied wte counted twice at p = 1.
//
// A common mistake: adding the first stage's embedding (wte, wpe) and the last stage's head copy of
// wte whenever a stage is first and last, including p = 1 where it is both. The head's copy exists
// only because the head lives on another rank than the embedding; on one stage the head reads the
// embedding's wte, one tensor of V·C numbers, and the count is V·C too high.
// expect: wte counted twice; at p = 1 the head reads the embedding's wte
#include <cstdint>
#include <utility>
#include <vector>

#include "exercises/grader.h"
#include "nn/gpt.h"

namespace exercise10 {

double predicted_stage0_parameters() { return 3.0 * (12 * 768 * 768 + 13 * 768) + (50257 + 1024) * 768; }  // + wte, wpe

std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t n_layer, int stages) {
  throw exercises::NotImplemented("stage_layers");
}

int64_t stage_parameter_count(const sl::nn::GPTConfig& config, int64_t layer_begin, int64_t layer_end) {
  const int64_t C = config.n_embd, V = config.vocab_size, BS = config.block_size;
  int64_t count = (layer_end - layer_begin) * (12 * C * C + 13 * C);  // the blocks
  if (layer_begin == 0) count += (V + BS) * C;                        // wte and wpe
  if (layer_end == config.n_layer) count += 2 * C + V * C;            // ln_f and the head's wte copy
  return count;  // the mistake: at p = 1 the stage is both ends and wte was counted twice
}

std::vector<int> tied_wte_stages(int stages) { throw exercises::NotImplemented("tied_wte_stages"); }

}  // namespace exercise10
