// exercises/10_naive_pipeline_cut/student.cpp — cut the GPT into p pipeline stages: which blocks each
// stage holds, how many weights that is, and who must sum the tied wte's gradient.
//
// Model parallelism by layers (lesson 08): stage r of p holds a contiguous range of blocks
// [begin, end). Balanced by count, and the FIRST n_layer % p stages take one extra block:
//
//   n_layer 7, p 3:   stage 0: wte wpe h.0 h.1 h.2     stage 1: h.3 h.4     stage 2: h.5 h.6 ln_f head
//
// What a stage holds, with C = n_embd, V = vocab_size, BS = block_size (positions):
//   every block h.l      ln_1 (2C), c_attn (3C·C + 3C), c_proj (C·C + C), ln_2 (2C),
//                        c_fc (4C·C + 4C), mlp c_proj (4C·C + C)          = 12C² + 13C numbers
//   the first stage      wte [V, C] and wpe [BS, C]                        = (V + BS)·C
//   the last stage       ln_f (2C) and the head, whose weight is tied to wte: the last stage keeps
//                        its OWN copy of wte [V, C]                        = 2C + V·C
//   p = 1: one stage is both ends and wte is one tensor there (the head reads the embedding's).
//
// The two copies of wte (first and last stage) are one parameter of the serial model: each step the
// first and the last stage all-reduce their wte gradients, so both hold the serial gradient (the
// embedding's part + the head's part) and AdamW keeps them equal. At p = 1 there is nothing to sum.
//
// The tools: nn::GPTConfig (nn/gpt.h: vocab_size, block_size, n_layer, n_embd); SL_CHECK from
// tensor/error.h to refuse a cut that cannot be made. Do not call split_layers, make_stage or
// StageModule (parallel/pipeline/stage.h) here: the grader compares you with them.
//
// Grade it:  make exercise N=10
#include <cstdint>
#include <utility>
#include <vector>

#include "exercises/grader.h"
#include "nn/gpt.h"

namespace exercise10 {

// PREDICT FIRST, before any code. GPT-2 small (V 50257, block size 1024, 12 layers, C 768) cut over
// p = 4 stages: how many parameters (numbers) does stage 0 hold? A middle stage holds 3 blocks. Replace
// the throw with your number; the grader counts the library's stage.
double predicted_stage0_parameters() {
  throw exercises::NotImplemented("predicted_stage0_parameters (predict first)");
}

// The layer ranges [begin, end) of stages 0 .. p-1, in order. Throw sl::Error (SL_CHECK) when
// p < 1 or some stage would hold no block (n_layer < p).
std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t n_layer, int stages) {
  // TODO: n_layer / p blocks each, one more for the first n_layer % p stages; contiguous ranges.
  throw exercises::NotImplemented("stage_layers");
}

// How many weight numbers a stage over blocks [layer_begin, layer_end) holds: its blocks, plus wte and
// wpe when it starts at layer 0, plus ln_f and the head's wte copy when it ends at config.n_layer
// (only one wte when it is both).
int64_t stage_parameter_count(const sl::nn::GPTConfig& config, int64_t layer_begin, int64_t layer_end) {
  // TODO: count from the shapes above.
  throw exercises::NotImplemented("stage_parameter_count");
}

// The stages that all-reduce wte's gradient each step, ascending; empty when there is no second copy.
std::vector<int> tied_wte_stages(int stages) {
  // TODO: the two ends of the pipe, or nobody.
  throw exercises::NotImplemented("tied_wte_stages");
}

}  // namespace exercise10
