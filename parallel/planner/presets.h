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
//   mixtures of experts (model_shape.h)       E    k   F      total / active   published
//   mixtral-8x7b      32    4096     32   32000   4096    8    2  21504   47.4B / 13.6B    46.7B / 12.9B
//   deepseek-v3       61    7168    128  129280   4096  256+1  8   3072  671.5B / 37.8B    671B / 37B
//
//   Llama-like means Llama 3's width, heads, vocabulary and context on shardlab's GPT, which is not
//   Llama: the MLP is GELU with 4h (8h² weights) where Llama's SwiGLU has 3·h·ffn (~10.5h²), there is
//   no grouped-query attention (k and v have every head: 4h² in attention, Llama 3 ~2.5h²), positions
//   are learned (wpe, T·h weights) instead of rotary, LayerNorm has biases where RMSNorm has none, and
//   the head is tied to wte (Llama unties it: V·h more). Layers are added to make up for the thinner
//   MLP: 36 instead of 32 (7.8B), 84 instead of 80 (68.8B), counts that pipeline stages divide.
//
//   The mixtures are the published shapes on the same GPT, every expert shardlab's two-matrix GELU
//   MLP. An expert's SwiGLU of width f holds 3·C·f weights; an MLP of width F = 1.5f holds as many
//   and computes as many FLOPs per token, so F is 1.5f: Mixtral's 14336 -> 21504, DeepSeek's 2048 ->
//   3072. What stays different, and where the counts above part from the published ones:
//     mixtral-8x7b  attention has every k/v head (4C², 67.1M a layer) where Mixtral's GQA has 8 of 32
//                   (2.5C², 41.9M): +0.81B; the head is tied (Mixtral unties it: -0.13B); learned
//                   positions for T 4096 (Mixtral: rotary, 32k context) +0.02B. Both counts, less
//                   these, land within 0.1% of 46.70B and 12.88B.
//     deepseek-v3   multi-head latent attention (low-rank q and kv projections, 187.1M a layer) is
//                   modelled as plain multi-head attention over 128 heads of 56 (205.5M): +1.12B;
//                   the head is tied (-0.93B); the 3 dense layers are the GPT's 4C MLP (8C², where
//                   DeepSeek's SwiGLU of 18432 holds 7.7C²): +0.04B; learned positions +0.03B; the
//                   multi-token-prediction module (outside the published 671B) is left out. The
//                   published 37B activated is 37.5B counted from the shapes (the test derives it).
#pragma once
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/planner/model_shape.h"

namespace sl::parallel::planner {

struct ModelPreset {
  std::string name;
  std::string source;  // where the shape comes from, in a few words
  ModelShape config;
};

// Every preset, in the table's order.
const std::vector<ModelPreset>& model_presets();
// The preset's config; throws sl::Error naming `name` and every known preset.
ModelShape preset_config(const std::string& name);
// "gpt2, gpt2-medium, ..." for usage and error messages.
std::string preset_names();

// Parameters of shardlab's dense GPT (tied head, learned positions, biases): l(12h² + 13h) + (V + T)h + 2h.
// A mixture of experts: model_parameters (model_shape.h).
int64_t gpt_parameters(const nn::GPTConfig& config);

}  // namespace sl::parallel::planner
