// presets.cpp — see presets.h.
#include "parallel/planner/presets.h"

#include "tensor/error.h"

namespace sl::parallel::planner {

namespace {

ModelShape shape(int64_t layers, int64_t n_embd, int64_t heads, int64_t vocab, int64_t block) {
  ModelShape config;
  config.n_layer = layers;
  config.n_embd = n_embd;
  config.n_head = heads;
  config.vocab_size = vocab;
  config.block_size = block;
  return config;
}

// A mixture of experts on that shape: E routed experts of width F, k per token, S shared, the first
// `dense` layers dense, every block after them MoE.
ModelShape moe(ModelShape config, int64_t experts, int64_t top_k, int64_t width, int64_t shared, int64_t dense) {
  config.moe_experts = experts;
  config.moe_top_k = top_k;
  config.moe_every = 1;
  config.expert_hidden = width;
  config.shared_experts = shared;
  config.dense_layers = dense;
  return config;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"gpt2", "GPT-2 124M (Radford et al. 2019)", shape(12, 768, 12, 50257, 1024)},
      {"gpt2-medium", "GPT-2 355M", shape(24, 1024, 16, 50257, 1024)},
      {"gpt2-large", "GPT-2 774M", shape(36, 1280, 20, 50257, 1024)},
      {"gpt2-xl", "GPT-2 1.5B", shape(48, 1600, 25, 50257, 1024)},
      {"zero-7.5b", "ZeRO (Rajbhandari et al. 2020) Table 1's 7.5B", shape(32, 4352, 32, 50257, 1024)},
      {"gpt3-175b", "GPT-3 175B, Megatron 2021 Table 1", shape(96, 12288, 96, 51200, 2048)},
      {"megatron-530b", "530B, Megatron 2021 Table 1", shape(105, 20480, 128, 51200, 2048)},
      {"megatron-1t", "1T, Megatron 2021 Table 1", shape(128, 25600, 160, 51200, 2048)},
      {"llama-8b", "Llama-like 8B (GELU 4h MLP, no GQA, learned positions)", shape(36, 4096, 32, 128256, 8192)},
      {"llama-70b", "Llama-like 70B (GELU 4h MLP, no GQA, learned positions)", shape(84, 8192, 64, 128256, 8192)},
      {"mixtral-8x7b", "Mixtral-like 8x7B (8 experts, top-2; GELU experts as wide as SwiGLU's weights, no GQA)",
       moe(shape(32, 4096, 32, 32000, 4096), 8, 2, 21504, 0, 0)},
      {"deepseek-v3", "DeepSeek-V3-like (256 + 1 shared experts, top-8, 3 dense layers; MHA for MLA)",
       moe(shape(61, 7168, 128, 129280, 4096), 256, 8, 3072, 1, 3)},
  };
  return presets;
}

std::string preset_names() {
  std::string names;
  for (const ModelPreset& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

ModelShape preset_config(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return p.config;
  throw Error("unknown model preset '" + name + "' (known: " + preset_names() + ")");
}

int64_t gpt_parameters(const nn::GPTConfig& c) {
  const int64_t h = c.n_embd;
  return c.n_layer * (12 * h * h + 13 * h) + (c.vocab_size + c.block_size) * h + 2 * h;
}

}  // namespace sl::parallel::planner
