// plan_cli.h — build/bin/plan's flags (tools/plan.cpp), bound to the library's PlanOptions
// (parallel/planner/plan_options.h). The model, batch and layout flags are train's (tools/layout_cli.h:
// the same names, ranges and checks); the cluster flags are the planner's. Any layout flag (or
// --layout) evaluates that one layout; without them every layout is searched and ranked.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "parallel/planner/plan_options.h"
#include "tools/layout_cli.h"

namespace sl {

using parallel::planner::PlanOptions;

inline void add_plan_flags(cli::Parser& cli, PlanOptions& o) {
  using cli::kNoMaximum;
  cli.group("Model");
  cli.text("--model", o.model, "PRESET",
           "gpt2, gpt2-medium, gpt2-large, gpt2-xl, zero-7.5b, gpt3-175b, megatron-530b, megatron-1t, llama-8b, "
           "llama-70b, mixtral-8x7b, deepseek-v3 (mixtures of experts: ep is searched too); without it train's model (2 layers, 4 heads, 128 wide, vocabulary 256, block 64)");
  cli.integer("--n-layer", o.n_layer, 1, 1 << 20, "transformer blocks, over the preset's");
  cli.integer("--n-head", o.n_head, 1, 1 << 20, "attention heads, over the preset's");
  cli.integer("--n-embd", o.n_embd, 1, 1 << 20, "embedding width, over the preset's");
  cli.integer("--vocab-size", o.vocab_size, 1, 1 << 24, "vocabulary, over the preset's");
  cli.integer("--block-size", o.block_size, 1, 1 << 24, "context length, over the preset's");
  cli.choice("--recompute", o.layout.recompute, {"none", "selective", "full"}, "activation recomputation");
  cli.group("Batch");
  cli.integer("--batch-size", o.batch_size, 1, int64_t{1} << 30, "global batch in rows (unset: one row per GPU)");
  cli.integer("--seq-len", o.seq_len, 1, 1 << 24, "tokens per row, <= the block size (unset: the block size)");
  cli.group("Mixed precision");
  cli.choice("--mixed-precision", o.layout.mixed_precision, {"no", "bf16", "fp16"},
             "16-bit weights and activations (no: f32 everywhere)");
  cli.choice("--grad-reduce-dtype", o.grad_reduce_dtype, {"bf16", "f32"},
             "how gradients are reduced (default bf16 for bf16, f32 for fp16)");
  cli.group("Cluster");
  cli.text("--cluster", o.cluster_file, "FILE.json",
           "{\"nodes\", \"gpus_per_node\", \"gpu_memory\", \"flops\", \"intra\", \"inter\"}, or the flags below");
  cli.integer("--nodes", o.nodes, 1, 1 << 20, "nodes (unset: enough for the layout; a search: 1)");
  cli.integer("--gpus-per-node", o.gpus_per_node, 1, 1 << 16, "GPUs per node");
  cli.text("--gpu-memory", o.gpu_memory, "BYTES", "memory per GPU, e.g. 80GB");
  cli.text("--flops", o.flops, "RATE", "dense FLOP/s per GPU, e.g. 312TFLOP/s");
  cli.text("--links", o.links, "SPEC", "intra- and inter-node links: bandwidth and latency");
  cli.group("Output");
  cli.flag("--layout", o.layout_given, "evaluate the layout the flags give (world = its product)");
  cli.flag("--json", o.json, "every figure as JSON");
  cli.integer("--top", o.top, 0, kNoMaximum, "layouts to show from a search (0: all)");
}

// The flags parsed and checked; `help` set when --help was asked (printed).
inline PlanOptions parse_plan(int argc, const char* const* argv, bool* help = nullptr) {
  for (int i = 1; i < argc; ++i)
    for (const std::string train_only : {"--stage-layers", "--trace"})
      if (argv[i] == train_only)
        throw UsageError{train_only + " is train's: the planner splits layers evenly and runs nothing"};
  PlanOptions o;
  cli::Parser cli("plan", "plan: which layout should train a model on a cluster, and why (nothing is run)");
  add_plan_flags(cli, o);
  const size_t before = cli.app().get_options().size();
  add_layout_flags(cli, o.layout);
  cli.group("Pipeline");
  cli.integer("--micro-batches", o.layout.micro_batches, 1, 1 << 20,
              "gradient accumulation: micro-batches per step (the pipeline's M)");
  cli.footer("Any of train's layout flags (or --layout) evaluates that one layout; without them every layout the "
             "cluster can run is searched and ranked.\nA bad flag or value exits 2 naming it.");
  const std::vector<CLI::Option*> options = cli.app().get_options();
  const bool asked = cli.parse(argc, argv);
  if (help) *help = asked;
  if (asked) return o;
  for (size_t i = before; i < options.size(); ++i) o.layout_given |= options[i]->count() > 0;
  for (const std::string flag : {"--nodes", "--gpus-per-node", "--gpu-memory", "--flops", "--links"})
    if (cli.given(flag)) o.cluster_flags.insert(flag);
  o.layout.resolve();  // --dp-shard alone: FSDP over S, as train
  try {
    o.validate();
  } catch (const parallel::OptionError& e) {
    throw UsageError{e.what()};
  }
  return o;
}

}  // namespace sl
