// 14_parallelize_on_the_page.h — lesson 14, section 5: how every layout of the tour was built. Included
// once, by lessons/14_nd_parallel.cpp (header-only: that lesson was 680 lines before this section).
//
//   parallel/nd/parallelize.cpp, line by line: the one function that builds every layout `train`
//   accepts, serial included. The lines quoted on the page are checked against the file when the
//   lesson runs from the repository (make lesson N=14), so the page cannot drift from the code.
//
//   Sections: 5a the walk (each line, what it does, which chapter it calls), 5b the walk checked on
//   two layouts of world 8: what each step left on every rank (chunks, tp slice, attention core,
//   runner, strategy), against what the walk says.
#pragma once
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/data_parallel/data_parallel_strategies.h"
#include "parallel/nd/parallelize.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/runner/part_runner.h"
#include "parallel/train/train_plan.h"
#include "parallel/zero/zero_strategies.h"

namespace lesson14_parallelize {

using namespace sl;
using namespace sl::parallel;

// One step of the walk: the lines of parallelize.cpp it quotes, and what they do.
struct Step {
  std::vector<std::string> code;
  std::string says;
};

inline const std::vector<Step>& walk() {
  static const std::vector<Step> steps = {
      {{"check_layout(options, world->size());  // before any communication",
        "out.mesh = std::make_unique<DeviceMesh>(world, options.parallelism);"},
       "Every rule of the layout first (ZeRO-2 under pp, HSDP with offload, ...): a bad layout throws on\n"
       "every rank before any rank communicates. Then the mesh [pp, dp_replicate, dp_shard, ep, cp, tp]."},
      {{"auto cut = std::make_shared<const NdParallelizer>(",
        "config, mesh, NdOptions{.sequence_parallel = o.sequence_parallel, .cp = o.cp});"},
       "How a part cut over tp and cp runs (its tokens, vocab-parallel embedding and loss, gradient\n"
       "sums, gathers back to the serial tensors). Either degree may be 1: the serial model's part runs\n"
       "through the same object, as the plain GPT."},
      {{"Stage stage = make_stage(config, mesh.pp_rank(), pp, pp > 1 ? o.pipeline.virtual_stages : 1,"},
       "1. Pipeline: this rank's chunks, layer ranges of the serial model (GPTShardSpec). pp 1: one\n"
       "chunk holding everything, wte to the head."},
      {{"auto part = std::make_shared<nn::GPT>(config, seed, layers.with_tensor_parallel(tp.rank(), tp.size()));",
        "if (tp.size() > 1) apply_tensor_parallel(*part, tp);"},
       "2. Tensor parallelism: each chunk is BUILT as this rank's slice of every weight (the serial\n"
       "draw's own rows: Philox regions), then the TP chapter installs f, g and the SP pairs as hooks on\n"
       "the chunk's own modules, and the placements the clip and the gathers read."},
      {{"if (cut->sequence().cp > 1) apply_context_parallel(*part, cut->sequence(), cut->cp_groups(), cut->cp_variant());"},
       "3. Context parallelism: every attention of the chunk attends through the ring (or all-gather,\n"
       "Ulysses, hybrid) over this rank's sequence shard. Nothing else in the model changes."},
      {{"if (mesh.size(MeshDim::ep) > 1) apply_expert_parallel(*part, mesh, token_positions(cut->sequence()));"},
       "3b. Expert parallelism (a mixture of experts only): each MoE block keeps this rank's E/ep\n"
       "experts and moves its tokens to them and back by two all-to-alls (lesson 17)."},
      {{"runner = std::make_unique<PipelineRunner>(std::move(stage), mesh, o.pipeline, cut);",
        "runner = std::make_unique<PartRunner>(first, cut);"},
       "4. The stage's schedule: several stages run the pipeline's schedule (1F1B, ...); one stage runs\n"
       "the plain micro-batch loop. Under ep each gets expert parallelism's step around it (each MoE\n"
       "batch's aux-loss weight, the experts gathered over ep): ExpertParallelPipelineRunner and\n"
       "ExpertParallelRunner."},
      {{"const bool replicate = mesh.size(MeshDim::dp) > 1 || (!o.cuts_model() && part.config().moe_experts == 0);",
        "return std::make_unique<DdpStrategy>(runner, mesh, replicate, o.adamw, o.precision, o.ddp_comm_hook);",
        "return std::make_unique<ZeroStrategy>(runner, mesh, zero_stage(o.dp_strategy), o.offload, o.adamw, o.precision);",
        "return fully_shard(part, runner, mesh, adamw, fsdp);"},
       "5. Data parallelism around it: DDP over dp (a cut or a mixture of experts at dp 1: AdamW\n"
       "alone), ZeRO-1/2 over dp_shard, or fully_shard: FSDP over dp_shard x cp (the cp ranks hold the\n"
       "same weights), HSDP across dp_replicate. FSDP has this one entry, for the whole model and for\n"
       "every cut."},
  };
  return steps;
}

// The lines of parallelize.cpp, whitespace-trimmed, when the lesson runs from the repository.
inline std::vector<std::string> source_lines() {
  std::ifstream in("parallel/nd/parallelize.cpp");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find_first_not_of(' ');
    lines.push_back(first == std::string::npos ? "" : line.substr(first));
  }
  return lines;
}

// What step 1 to 5 left on one rank.
struct Built {
  int chunks = 0;
  bool pipeline = false, plain_loop = false, ddp = false, fsdp = false;
  int64_t c_fc_rows = 0;  // the first chunk's first layer: 4C/tp
  bool ring_core = false;
};

inline Built built_on(RankContext& ctx, const nn::GPTConfig& config, const TrainPlan& plan) {
  Parallelized parts = parallelize(config, 13, ctx.world, plan.parallelize_options());
  Built b;
  nn::GPT* first = nullptr;
  if (auto* pipeline = dynamic_cast<PipelineRunner*>(parts.runner.get())) {
    b.pipeline = true;
    b.chunks = static_cast<int>(pipeline->stage().parts.size());
    first = pipeline->stage().parts[0].get();
  } else if (auto* plain = dynamic_cast<PartRunner*>(parts.runner.get())) {
    b.plain_loop = true;
    b.chunks = 1;
    first = &plain->part();
  }
  b.ddp = dynamic_cast<DdpStrategy*>(parts.strategy.get()) != nullptr;
  b.fsdp = dynamic_cast<FsdpStrategy*>(parts.strategy.get()) != nullptr;
  if (first) {
    const nn::GPTShardSpec range = first->spec().resolved(config);
    b.ring_core = static_cast<bool>(first->block(range.layer_begin).attn->core);
    if (!b.fsdp)  // FSDP has freed the weights into its shards: the slice's rows are read before it
      b.c_fc_rows = first->block(range.layer_begin).mlp->c_fc->weight.size(0);
  }
  return b;
}

// Section 5. `check` is the lesson's own (prints and and's into its verdict).
template <class Check>
void walk_parallelize(const nn::GPTConfig& config, Check check) {
  std::printf("\n--- 5. how every layout above was built: parallelize, line by line (parallel/nd/parallelize.cpp)\n");
  const std::vector<std::string> source = source_lines();
  bool quoted = true;
  for (const Step& step : walk()) {
    std::printf("\n");
    for (const std::string& line : step.code) {
      std::printf("    %s\n", line.c_str());
      if (!source.empty()) quoted = quoted && std::find(source.begin(), source.end(), line) != source.end();
    }
    std::istringstream says(step.says);
    for (std::string line; std::getline(says, line);) std::printf("  %s\n", line.c_str());
  }
  if (source.empty())
    std::printf("\n  (parallel/nd/parallelize.cpp not found from here: run from the repository to check the quotes)\n");
  else
    check(quoted, "every line quoted above is a line of parallel/nd/parallelize.cpp");

  std::printf("\n  5b. the walk on world 8, what each step left on every rank:\n");
  struct Case {
    const char* name;
    ParallelismConfig parallelism;
    DpStrategy dp;
  };
  const Case cases[] = {{"pp2 x tp2 x fsdp2", {.dp_shard = 2, .pp = 2, .tp = 2}, DpStrategy::fsdp},
                        {"dp2 x cp2 x tp2 (DDP)", {.dp_replicate = 2, .cp = 2, .tp = 2}, DpStrategy::ddp}};
  for (const Case& c : cases) {
    TrainPlan plan{.parallelism = c.parallelism, .dp_strategy = c.dp};
    plan.micro_batches = c.parallelism.pp > 1 ? 2 : 1;
    plan.cp_balance = CpBalance::none;
    plan.validate(8);
    std::vector<Built> ranks(8);
    launch(8, [&](RankContext& ctx) { ranks[ctx.rank] = built_on(ctx, config, plan); });
    const Built& b = ranks[0];
    std::printf("    %-22s rank 0: %d chunk(s), %s, c_fc rows %s, attention %s, strategy %s\n", c.name, b.chunks,
                b.pipeline ? "PipelineRunner" : "PartRunner (the plain loop)",
                b.fsdp ? "(sharded)" : std::to_string(b.c_fc_rows).c_str(), b.ring_core ? "ring core" : "the GPT's own",
                b.fsdp ? "fully_shard" : b.ddp ? "DDP" : "?");
    bool same = true;
    for (const Built& r : ranks)
      same = same && r.chunks == b.chunks && r.pipeline == b.pipeline && r.ring_core == b.ring_core && r.fsdp == b.fsdp;
    const bool pp = c.parallelism.pp > 1, cp = c.parallelism.cp > 1;
    check(same && b.chunks == 1 && b.pipeline == pp && b.plain_loop == !pp,
          std::string(c.name) + ": one chunk per rank, " + (pp ? "the pipeline's schedule" : "the plain loop"));
    check(b.ring_core == cp, std::string(c.name) + ": step 3 " + (cp ? "swapped" : "left") + " the attention core");
    check(c.dp == DpStrategy::fsdp ? b.fsdp : (b.ddp && b.c_fc_rows == 4 * config.n_embd / c.parallelism.tp),
          std::string(c.name) + (c.dp == DpStrategy::fsdp ? ": step 5 sharded the part (fully_shard)"
                                                           : ": c_fc holds 4C/tp rows, DDP around it"));
  }
}

}  // namespace lesson14_parallelize
