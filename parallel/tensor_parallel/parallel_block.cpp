// parallel_block.cpp — see parallel_block.h.
#include "parallel/tensor_parallel/parallel_block.h"

namespace sl::parallel {

void parallelize_block(nn::Block& block, const TPGroup& tp) {
  SL_CHECK(block.attn->c_attn->weight.size(0) * tp.size() == block.attn->c_attn->weight.size(1) * 3,
           "parallelize_block: c_attn ", block.attn->c_attn->weight.shape(), " is not a 1/", tp.size(),
           " slice (build the GPT with GPTShardSpec::with_tensor_parallel)");
  // parallel attention: heads split, c_attn column (f on ln_1's output), c_proj row
  make_column_parallel(*block.attn->c_attn, *block.ln_1, tp);
  make_row_parallel(*block.attn->c_proj, tp);
  // A mixture of experts stays whole, replicated over tp: every rank of the group routes and computes
  // the same tokens, so its input gradient is already whole and ln_2 needs no f.
  if (!block.mlp) return;
  // parallel MLP: c_fc column (f on ln_2's output), c_proj row
  make_column_parallel(*block.mlp->c_fc, *block.ln_2, tp);
  make_row_parallel(*block.mlp->c_proj, tp);
}

}  // namespace sl::parallel
