// exercises/10_naive_pipeline_cut/grader.cpp — grades the pipeline cut (student.cpp).
//
// The layer ranges against split_layers for every (n_layer, p) up to 16 layers, uneven ones included;
// the weight counts against the parameters of the library's own stages (make_stage + StageModule) and
// against a count from shapes derived here (blocks 12C² + 13C, the ends (V + BS)·C and 2C + V·C); the
// ledger's weight bytes of stages built on thread ranks (parallel/comm/launch.h); the tied wte's pair
// against PipelineRunner's embedding group. A wrong count is named by the usual mistake: the remainder
// on the wrong stages, the embeddings on every stage, wte counted twice at p = 1 or never on the last.
// With -DSL_SOLUTION the library's split and stages stand in.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "exercises/grader.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/pipeline/stage.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

namespace exercise10 {
double predicted_stage0_parameters();
Ranges stage_layers(int64_t n_layer, int stages);
int64_t stage_parameter_count(const nn::GPTConfig& config, int64_t layer_begin, int64_t layer_end);
std::vector<int> tied_wte_stages(int stages);
}  // namespace exercise10

constexpr uint64_t kSeed = 3;

static LaunchOptions four_seconds() {
  LaunchOptions options;
  options.timeout = std::chrono::seconds(4);  // a rank that waits forever fails the check, not the grader
  return options;
}

// The ranks whose PipelineRunner sums wte.weight over its own tied-wte group (pp ranks {0, p-1}; none at p = 1).
static std::vector<int> library_tied_wte_stages(const nn::GPTConfig& config, int p) {
  std::vector<int> in_group(p, 0), members;
  launch(p, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.pp = p});
    PipelineRunner runner(config, kSeed, mesh, PipelineOptions{});
    for (const GradientSum& sum : runner.gradient_sums())
      if (!sum.over && sum.params == std::vector<std::string>{"wte.weight"} && sum.group) in_group[ctx.rank] = 1;
  }, four_seconds());
  for (int r = 0; r < p; ++r)
    if (in_group[r]) members.push_back(r);
  return members;
}

#ifdef SL_SOLUTION
namespace solution {
// Stage 0: 12 / 4 = 3 blocks of 12C² + 13C, and wte [V, C] and wpe [BS, C]: 21.3 M of blocks and
// 39.4 M of embeddings, nearly three times a middle stage.
double predicted_stage0_parameters() { return 3.0 * (12 * 768 * 768 + 13 * 768) + (50257 + 1024) * 768; }
Ranges stage_layers(int64_t n_layer, int stages) {
  Ranges ranges;
  for (const nn::GPTShardSpec& spec : split_layers(n_layer, stages)) ranges.emplace_back(spec.layer_begin, spec.layer_end);
  return ranges;
}
int64_t stage_parameter_count(const nn::GPTConfig& config, int64_t layer_begin, int64_t layer_end) {
  nn::GPT part(config, kSeed, nn::GPTShardSpec::layers(layer_begin, layer_end));  // the library's chunk
  int64_t count = 0;
  for (const Tensor& p : part.parameters()) count += p.numel();
  return count;
}
std::vector<int> tied_wte_stages(int stages) { return library_tied_wte_stages(nn::GPTConfig{32, 8, 6, 2, 16, 0.0}, stages); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise10;
#endif

static std::string spell(const Ranges& ranges) {
  std::string out;
  for (size_t s = 0; s < ranges.size(); ++s)
    out += (s ? " " : "") + std::string("[") + std::to_string(ranges[s].first) + "," + std::to_string(ranges[s].second) + ")";
  return "{" + out + "}";
}
static std::string spell(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return "{" + out + "}";
}

static Ranges library_ranges(int64_t n_layer, int p) {
  Ranges ranges;
  for (const nn::GPTShardSpec& spec : split_layers(n_layer, p)) ranges.emplace_back(spec.layer_begin, spec.layer_end);
  return ranges;
}

// The balanced split with the extra blocks given to the LAST n_layer % p stages (the usual slip).
static Ranges remainder_last(int64_t n_layer, int p) {
  Ranges ranges;
  int64_t begin = 0;
  for (int s = 0; s < p; ++s) {
    const int64_t count = n_layer / p + (s >= p - n_layer % p ? 1 : 0);
    ranges.emplace_back(begin, begin + count);
    begin += count;
  }
  return ranges;
}

static void expect_ranges(int64_t n_layer, int p) {
  const Ranges got = impl::stage_layers(n_layer, p), want = library_ranges(n_layer, p);
  if (got == want) return;
  std::string why = "n_layer " + std::to_string(n_layer) + ", p " + std::to_string(p) + ": you cut " + spell(got) +
                    ", the library cuts " + spell(want);
  if (got.size() != want.size())
    why += ": one range per stage, p of them";
  else if (got == remainder_last(n_layer, p))
    why += ": the extra blocks went to the last stages; the library gives them to the FIRST n_layer % p stages";
  else if (got.front().first != 0 || got.back().second != n_layer)
    why += ": the ranges must cover [0, n_layer) exactly (end is exclusive)";
  else
    why += ": each stage gets n_layer / p blocks, +1 for stages below n_layer % p, each range starting where the last ended";
  expect(false, why);
}

// The count from shapes, in parts, so a wrong count can be named by the part it got wrong.
struct Parts {
  int64_t block, embedding, head_copy, ln_f, position;
};
static Parts parts_of(const nn::GPTConfig& c) {
  const int64_t C = c.n_embd;
  return {12 * C * C + 13 * C, c.vocab_size * C + c.block_size * C, c.vocab_size * C, 2 * C, c.block_size * C};
}

static std::string config_text(const nn::GPTConfig& c) {
  return "V " + std::to_string(c.vocab_size) + ", BS " + std::to_string(c.block_size) + ", n_layer " +
         std::to_string(c.n_layer) + ", C " + std::to_string(c.n_embd);
}

// Counts every stage of the p-stage cut against the parameters of the library's own stage.
static void expect_counts(const nn::GPTConfig& config, int p) {
  const Ranges ranges = library_ranges(config.n_layer, p);
  const Parts parts = parts_of(config);
  for (int r = 0; r < p; ++r) {
    const auto [begin, end] = ranges[static_cast<size_t>(r)];
    int64_t want = 0;  // the library's stage r, built
    for (const Tensor& param : StageModule(make_stage(config, kSeed, r, p, 1)).parameters()) want += param.numel();
    const int64_t got = impl::stage_parameter_count(config, begin, end);
    if (got == want) continue;
    const bool first = begin == 0, last = end == config.n_layer;
    std::string why = config_text(config) + ", stage " + std::to_string(r) + " of " + std::to_string(p) + " (blocks [" +
                      std::to_string(begin) + ", " + std::to_string(end) + ")): you count " + std::to_string(got) +
                      ", the library's stage holds " + std::to_string(want);
    const int64_t gap = got - want;
    if (first && last && gap == parts.head_copy)
      why += ": wte counted twice; at p = 1 the head reads the embedding's wte, one tensor";
    else if (!first && gap == parts.embedding)
      why += ": wte and wpe counted on a stage that does not start at layer 0; only the first stage embeds";
    else if (!last && gap == parts.head_copy + parts.ln_f)
      why += ": ln_f and the head counted on a stage that does not end at n_layer; only the last stage has them";
    else if (last && !first && gap == -parts.head_copy)
      why += ": the last stage's own copy of wte (the tied head, V x C) is missing";
    else if (first && gap == -parts.position)
      why += ": wpe [BS, C] is missing on the first stage";
    else if (last && gap == -parts.ln_f)
      why += ": ln_f (2C: weight and bias) is missing on the last stage";
    else if (gap % parts.block == 0)
      why += ": " + std::to_string(gap / parts.block) + " block(s) off; a range [begin, end) holds end - begin blocks";
    else if (gap == -(end - begin) * 13 * config.n_embd)
      why += ": the biases and LayerNorms are missing; a block is 12C² + 13C numbers";
    else
      why += ": a block is 12C² + 13C, the first stage adds (V + BS)·C, the last 2C + V·C";
    expect(false, why);
  }
}

static const std::vector<nn::GPTConfig> kConfigs = {
    {32, 8, 6, 2, 16, 0.0},  // lesson 08's GPT
    {50, 12, 7, 3, 24, 0.0},  // uneven: 7 layers, V and BS that are no multiple of anything
    {17, 5, 5, 1, 8, 0.0},
};

// The prediction's measured value: the parameters of the library's stage 0 of GPT-2 small over p = 4.
static double measured_stage0_parameters() {
  const nn::GPTConfig gpt2_small{50257, 1024, 12, 12, 768, 0.0};
  const nn::GPTShardSpec first = split_layers(gpt2_small.n_layer, 4).front();
  nn::GPT stage(gpt2_small, kSeed, first);
  int64_t count = 0;
  for (const Tensor& p : stage.parameters()) count += p.numel();
  return static_cast<double>(count);
}

int main() {
  exercises::Grader grader("10_naive_pipeline_cut");
  grader.predict("parameters of stage 0 when GPT-2 small (V 50257, block 1024, 12 layers, C 768) is cut over p = 4",
                 impl::predicted_stage0_parameters, measured_stage0_parameters, 0, "parameters");

  grader.check("the header's cuts: n_layer 6 over p 3, n_layer 7 over p 3", [] {
    expect_ranges(6, 3);
    expect_ranges(7, 3);
  });

  grader.check("layer ranges equal split_layers' for every n_layer 1-16 and p 1-n_layer (uneven ones)", [] {
    for (int64_t n_layer = 1; n_layer <= 16; ++n_layer)
      for (int p = 1; p <= n_layer; ++p) expect_ranges(n_layer, p);
  });

  grader.check("a cut that cannot be made is refused with sl::Error (n_layer < p, p < 1)", [] {
    for (const auto& [n_layer, p] : std::vector<std::pair<int64_t, int>>{{3, 4}, {1, 2}, {4, 0}, {4, -1}}) {
      bool refused = false;
      try {
        impl::stage_layers(n_layer, p);
      } catch (const Error&) {
        refused = true;
      }
      expect(refused, "stage_layers(" + std::to_string(n_layer) + ", " + std::to_string(p) +
                          ") returned a cut: some stage would hold no block (or there is no stage); throw with SL_CHECK");
    }
  });

  grader.check("weights per stage equal the library's stage modules, lesson 08's GPT at p 1-6", [] {
    for (int p = 1; p <= 6; ++p) expect_counts(kConfigs[0], p);
  });

  grader.check("weights per stage equal the library's on other shapes (7 and 5 layers, odd V and BS)", [] {
    for (size_t c = 1; c < kConfigs.size(); ++c)
      for (int p = 1; p <= kConfigs[c].n_layer; ++p) expect_counts(kConfigs[c], p);
  });

  grader.check("the ledger's weight bytes per stage on thread ranks = 4 x your count (f32), 2 x (bf16)", [] {
    for (DType dtype : {DType::f32, DType::bf16}) {
      nn::GPTConfig config = kConfigs[1];
      config.param_dtype = dtype;
      const int p = 3;
      const Ranges ranges = library_ranges(config.n_layer, p);
      std::vector<int64_t> measured(p);
      launch(p, [&](RankContext& ctx) {
        MemoryLedger& ledger = MemoryLedger::instance();
        const int64_t before = ledger.current(ctx.device, MemoryCategory::weights);
        Stage stage = make_stage(config, kSeed, ctx.rank, p, 1);
        measured[ctx.rank] = ledger.current(ctx.device, MemoryCategory::weights) - before;
      }, four_seconds());
      const int64_t size = static_cast<int64_t>(dtype_size(dtype));
      for (int r = 0; r < p; ++r) {
        const int64_t predicted = size * impl::stage_parameter_count(config, ranges[r].first, ranges[r].second);
        expect(predicted == measured[r], std::string(dtype_name(dtype)) + ", stage " + std::to_string(r) + " of 3: you predict " +
                                             std::to_string(predicted) + " bytes, the ledger measured " +
                                             std::to_string(measured[r]) + " (" + std::to_string(size) +
                                             " bytes a number): recount the stage's weights");
      }
    }
  });

  grader.check("the tied wte's gradient is summed by PipelineRunner's pair, p 5 down to 1", [] {
    for (int p = 5; p >= 1; --p) {
      const std::vector<int> got = impl::tied_wte_stages(p), want = library_tied_wte_stages(kConfigs[0], p);
      if (got == want) continue;
      std::string why = "p " + std::to_string(p) + ": you sum wte's gradient over " + spell(got) + ", the pipeline over " +
                        spell(want);
      if (p == 1)
        why += ": at p = 1 there is one wte and nothing to sum it with";
      else if (got.size() == static_cast<size_t>(p) && p > 2)
        why += ": only the first stage (embedding) and the last (head) hold a copy of wte";
      else
        why += ": the copies live on the first and the last stage, {0, p-1}";
      expect(false, why);
    }
  });

  return grader.finish();
}
