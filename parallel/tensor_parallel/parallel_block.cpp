// parallel_block.cpp — see parallel_block.h.
#include "parallel/tensor_parallel/parallel_block.h"

#include <utility>

namespace sl::parallel::tp {

void column_input_after(nn::LayerNorm& norm, const TPGroup& tp) {
  norm.register_forward_hook([tp](nn::Module&, const Tensor&, const Tensor& out) { return column_input(out, tp); });
}

void make_row_parallel(nn::Linear& linear, const TPGroup& tp) {
  // Linear's forward adds linear.bias; leave that handle empty so it computes the partial product
  // alone. The parameter stays registered (state_dict, optimizer, DDP see it) and is added here.
  Tensor bias = std::exchange(linear.bias, Tensor());
  SL_ASSERT(bias.defined());
  linear.register_forward_hook(
      [tp, bias](nn::Module&, const Tensor&, const Tensor& partial) { return row_output(partial, bias, tp); });
}

void parallelize_block(nn::Block& block, const TPGroup& tp) {
  SL_CHECK(block.attn->c_attn->weight.size(0) * tp.size() == block.attn->c_attn->weight.size(1) * 3,
           "parallelize_block: c_attn ", block.attn->c_attn->weight.shape(), " is not a 1/", tp.size(),
           " slice (build the GPT with GPTShardSpec::with_tensor_parallel)");
  column_input_after(*block.ln_1, tp);  // parallel attention: heads split, c_attn column, c_proj row
  make_row_parallel(*block.attn->c_proj, tp);
  column_input_after(*block.ln_2, tp);  // parallel MLP: c_fc column, c_proj row
  make_row_parallel(*block.mlp->c_proj, tp);
}

}  // namespace sl::parallel::tp
