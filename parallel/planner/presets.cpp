// presets.cpp — see presets.h.
#include "parallel/planner/presets.h"

#include "tensor/error.h"

namespace sl::parallel::planner {

namespace {

nn::GPTConfig shape(int64_t layers, int64_t n_embd, int64_t heads, int64_t vocab, int64_t block) {
  nn::GPTConfig config;
  config.n_layer = layers;
  config.n_embd = n_embd;
  config.n_head = heads;
  config.vocab_size = vocab;
  config.block_size = block;
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
  };
  return presets;
}

std::string preset_names() {
  std::string names;
  for (const ModelPreset& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

nn::GPTConfig preset_config(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return p.config;
  throw Error("unknown model preset '" + name + "' (known: " + preset_names() + ")");
}

int64_t gpt_parameters(const nn::GPTConfig& c) {
  const int64_t h = c.n_embd;
  return c.n_layer * (12 * h * h + 13 * h) + (c.vocab_size + c.block_size) * h + 2 * h;
}

}  // namespace sl::parallel::planner
