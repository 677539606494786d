// model_shape.h — the model the planner costs: shardlab's GPT (nn::GPTConfig, its moe_ fields
// included) plus what a published mixture of experts has that nn::MoE does not say: an expert
// width other than 4C, shared experts that every token runs, and dense layers in front.
//
//   a block       attention 4C² + 4C (fused qkv and c_proj, biases), two LayerNorms 4C
//   dense MLP     c_fc [4C, C] + c_proj [C, 4C] with biases: 8C² + 5C
//   MoE MLP       router [E, C] (no bias), then E routed experts and S shared ones, each an MLP of
//                 width F (c_fc [F, C], c_proj [C, F], biases): 2CF + F + C each. A token runs the
//                 router, its k routed experts and the S shared ones.
//   which blocks  layer l is MoE when l >= dense_layers and GPTConfig::is_moe_layer(l) (moe_every 1:
//                 every block; 2: layers 1, 3, 5, ...)
//
//   total  = every weight;  active = what one token computes with: total less the E - k routed
//   experts it skips in each MoE layer (the router and the shared experts are active).
//
// A ModelShape with moe_experts 0 is the dense GPT: every count is gpt_parameters' (presets.h).
#pragma once
#include <cstdint>

#include "nn/gpt.h"

namespace sl::parallel::planner {

struct ModelShape : nn::GPTConfig {
  int64_t expert_hidden = 0;   // F, the width of an expert's MLP; 0: 4C (nn::MoE's expert is the GPT's MLP)
  int64_t shared_experts = 0;  // S experts every token runs beside its k routed ones (DeepSeek's 1)
  int64_t dense_layers = 0;    // the first layers keep the dense MLP (DeepSeek-V3's 3)

  ModelShape() = default;
  ModelShape(const nn::GPTConfig& config) : nn::GPTConfig(config) {}  // NOLINT: a GPT is a dense ModelShape

  bool has_experts() const { return moe_experts > 0; }
  // Whether block `layer`'s MLP is a mixture of experts (dense_layers, then GPTConfig's rule).
  bool moe_layer(int64_t layer) const { return layer >= dense_layers && is_moe_layer(layer); }
  int64_t moe_layer_count() const;
  int64_t expert_width() const { return expert_hidden > 0 ? expert_hidden : 4 * n_embd; }
  int64_t expert_numel() const { return 2 * n_embd * expert_width() + expert_width() + n_embd; }
  // Throws sl::Error naming the values (GPTConfig::validate, then the expert fields).
  void validate() const;
};

struct ParameterCount {
  int64_t total = 0, active = 0;
};
// Every weight, and those one token computes with (above).
ParameterCount model_parameters(const ModelShape& model);

}  // namespace sl::parallel::planner
