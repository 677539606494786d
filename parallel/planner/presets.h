// presets.h — named model shapes, so that `plan --model gpt3-175b` needs no arithmetic.
//
//   name           layers  n_embd  heads  vocab   T      parameters (shardlab's GPT: 12lh² + 13lh + (V+T)h + 2h)
//   gpt2              12     768     12   50257   1024   124M   (Radford et al. 2019)
//   gpt2-medium       24    1024     16   50257   1024   355M
//   gpt2-large        36    1280     20   50257   1024   774M
//   gpt2-xl           48    1600     25   50257   1024   1.56B
//   zero-7.5b         32    4352     32   50257   1024   7.50B  the ZeRO paper's Ψ = 7.5B (Rajbhandari et al.
//                                                              2020, Table 1 gives Ψ, not a shape; this one
//                                                              lands on 7.498e9)
//   gpt3-175b         96   12288     96   51200   2048   175B   Megatron 2021 (Narayanan et al.) Table 1
//   megatron-530b    105   20480    128   51200   2048   530B   the same table
//   megatron-1t      128   25600    160   51200   2048   1.0T   the same table
//   llama-8b          36    4096     32  128256   8192   7.8B   "Llama-like" (below)
//   llama-70b         84    8192     64  128256   8192   68.8B  "Llama-like"
//
//   Llama-like means Llama 3's width, heads, vocabulary and context on shardlab's GPT, which is not
//   Llama: the MLP is GELU with 4h (8h² weights) where Llama's SwiGLU has 3·h·ffn (~10.5h²), there is
//   no grouped-query attention (k and v have every head: 4h² in attention, Llama 3 ~2.5h²), positions
//   are learned (wpe, T·h weights) instead of rotary, LayerNorm has biases where RMSNorm has none, and
//   the head is tied to wte (Llama unties it: V·h more). Layers are added to make up for the thinner
//   MLP: 36 instead of 32 (7.8B), 84 instead of 80 (68.8B), counts that pipeline stages divide.
#pragma once
#include <string>
#include <vector>

#include "nn/gpt.h"

namespace sl::parallel::planner {

struct ModelPreset {
  std::string name;
  std::string source;  // where the shape comes from, in a few words
  nn::GPTConfig config;
};

// Every preset, in the table's order.
const std::vector<ModelPreset>& model_presets();
// The preset's config; throws sl::Error naming `name` and every known preset.
nn::GPTConfig preset_config(const std::string& name);
// "gpt2, gpt2-medium, ..." for usage and error messages.
std::string preset_names();

// Parameters of shardlab's GPT (tied head, learned positions, biases): l(12h² + 13h) + (V + T)h + 2h.
int64_t gpt_parameters(const nn::GPTConfig& config);

}  // namespace sl::parallel::planner
