// stage.cpp — see stage.h: the balanced split and one rank's chunks.
#include "parallel/pipeline/stage.h"

#include <numeric>

#include "tensor/ops.h"

namespace sl::parallel {

std::vector<nn::GPTShardSpec> split_layers(int64_t n_layer, int chunks, const std::vector<int64_t>& layers_per_chunk) {
  SL_CHECK(chunks >= 1, "pipeline: the model must be cut into at least 1 chunk (got ", chunks, ")");
  std::vector<int64_t> counts = layers_per_chunk;
  if (counts.empty()) {
    SL_CHECK(n_layer >= chunks, "pipeline: ", chunks, " chunks (stages x virtual stages) need at least one layer each, "
             "but n_layer is ", n_layer);
    for (int c = 0; c < chunks; ++c) counts.push_back(n_layer / chunks + (c < n_layer % chunks ? 1 : 0));
  }
  SL_CHECK(static_cast<int>(counts.size()) == chunks, "pipeline: --stage-layers gives ", counts.size(),
           " counts for ", chunks, " chunks (stages x virtual stages)");
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  SL_CHECK(total == n_layer, "pipeline: --stage-layers adds up to ", total, " layers, but n_layer is ", n_layer);
  std::vector<nn::GPTShardSpec> specs;
  int64_t begin = 0;
  for (int c = 0; c < chunks; ++c) {
    SL_CHECK(counts[c] >= 1, "pipeline: chunk ", c, " would hold ", counts[c], " layers; every chunk needs at least 1");
    specs.push_back(nn::GPTShardSpec::layers(begin, begin + counts[c]));
    begin += counts[c];
  }
  return specs;
}

Stage make_stage(const nn::GPTConfig& config, uint64_t seed, int rank, int stages, int virtual_stages,
                 const std::vector<int64_t>& layers_per_chunk) {
  return make_stage(config, rank, stages, virtual_stages, layers_per_chunk,
                    [&](const nn::GPTShardSpec& layers) { return std::make_shared<nn::GPT>(config, seed, layers); });
}

Stage make_stage(const nn::GPTConfig& config, int rank, int stages, int virtual_stages,
                 const std::vector<int64_t>& layers_per_chunk, const ChunkBuilder& build) {
  SL_CHECK(stages >= 1 && virtual_stages >= 1, "pipeline: stages (", stages, ") and virtual stages (", virtual_stages,
           ") must be >= 1");
  SL_CHECK(!(stages == 1 && virtual_stages > 1), "pipeline: virtual stages (", virtual_stages,
           ") need at least 2 stages: with 1 the embedding and the head would be two chunks of one rank");
  SL_CHECK(rank >= 0 && rank < stages, "pipeline: rank ", rank, " is not one of ", stages, " stages");
  const std::vector<nn::GPTShardSpec> all = split_layers(config.n_layer, stages * virtual_stages, layers_per_chunk);
  Stage stage{rank, stages, virtual_stages, {}, {}};
  for (int local = 0; local < virtual_stages; ++local) {
    stage.specs.push_back(all[global_chunk(rank, local, stages)]);
    stage.parts.push_back(build(stage.specs.back()));
  }
  return stage;
}

std::string Stage::str() const {
  std::string out = "stage " + std::to_string(rank) + "/" + std::to_string(stages) + ":";
  for (size_t local = 0; local < specs.size(); ++local) {
    if (local > 0) out += " |";
    if (specs[local].has_embedding()) out += " wte wpe";
    for (int64_t l = specs[local].layer_begin; l < specs[local].layer_end; ++l) out += " h." + std::to_string(l);
    if (parts[local]->ln_f) out += " ln_f head";
  }
  return out;
}

namespace {
// The blocks of several chunks under their global indices ("h.2", "h.5"), as GPT names them.
class BlockSet : public nn::Module {
 public:
  void add(const std::string& name, std::shared_ptr<nn::Module> block) { register_module(name, std::move(block)); }
};
}  // namespace

StageModule::StageModule(const Stage& stage) {
  // wte, wpe first, then the blocks in layer order, then ln_f: named_parameters() in the serial
  // model's order. The last stage's wte (the head's tied copy) keeps its tied("wte") placement.
  auto blocks = std::make_shared<BlockSet>();
  std::shared_ptr<nn::Module> wte, wpe, ln_f;
  for (const auto& part : stage.parts) {
    for (const auto& [name, child] : part->children()) {
      if (name == "wte") wte = child;
      if (name == "wpe") wpe = child;
      if (name == "ln_f") ln_f = child;
      if (name == "h")
        for (const auto& [index, block] : child->children()) blocks->add(index, block);
    }
  }
  if (wte) register_module("wte", wte);
  if (wpe) register_module("wpe", wpe);
  register_module("h", blocks);
  if (ln_f) register_module("ln_f", ln_f);
}

}  // namespace sl::parallel
