// model_shape.cpp — see model_shape.h.
#include "parallel/planner/model_shape.h"

#include "tensor/error.h"

namespace sl::parallel::planner {

int64_t ModelShape::moe_layer_count() const {
  int64_t count = 0;
  for (int64_t layer = 0; layer < n_layer; ++layer) count += moe_layer(layer);
  return count;
}

void ModelShape::validate() const {
  nn::GPTConfig::validate();
  SL_CHECK(expert_hidden >= 0 && shared_experts >= 0 && dense_layers >= 0, "ModelShape: expert_hidden (",
           expert_hidden, "), shared_experts (", shared_experts, ") and dense_layers (", dense_layers,
           ") must be >= 0");
  SL_CHECK(has_experts() || (expert_hidden == 0 && shared_experts == 0 && dense_layers == 0),
           "ModelShape: expert_hidden (", expert_hidden, "), shared_experts (", shared_experts, ") and dense_layers (",
           dense_layers, ") describe experts, but moe_experts is 0");
  SL_CHECK(!has_experts() || moe_layer_count() > 0, "ModelShape: ", moe_experts, " experts but no MoE layer (",
           n_layer, " layers, the first ", dense_layers, " dense, moe_every ", moe_every, ")");
}

ParameterCount model_parameters(const ModelShape& m) {
  const int64_t C = m.n_embd;
  const int64_t attention = 4 * C * C + 4 * C + 4 * C;  // c_attn, c_proj (biases), ln_1, ln_2
  const int64_t dense_mlp = 8 * C * C + 5 * C;
  const int64_t outside = (m.vocab_size + m.block_size) * C + 2 * C;  // wte (tied head), wpe, ln_f
  ParameterCount count{outside, outside};
  for (int64_t layer = 0; layer < m.n_layer; ++layer) {
    if (!m.moe_layer(layer)) {
      count.total += attention + dense_mlp;
      count.active += attention + dense_mlp;
      continue;
    }
    const int64_t router = m.moe_experts * C;
    count.total += attention + router + (m.moe_experts + m.shared_experts) * m.expert_numel();
    count.active += attention + router + (m.moe_top_k + m.shared_experts) * m.expert_numel();
  }
  return count;
}

}  // namespace sl::parallel::planner
