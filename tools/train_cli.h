// train_cli.h — build/bin/train's flags (tools/train.cpp): which flag sets which field of the
// library's TrainOptions (parallel/train/train_options.h), under which --help group, with which range.
//
//   train --dp-replicate 2 --dp-shard 2 --cp 2 --tp 2 --steps 100
//   train --config configs/hsdp_cp_tp.toml --steps 3        # a flag given here wins over the file
//
// parse_train() returns the options checked (each value as it is read, then TrainOptions::validate()'s
// rules across them), or throws a one-line UsageError; `help` is set when --help was asked (printed).
// The layout flags are shared with build/bin/plan (tools/layout_cli.h).
#pragma once
#include <algorithm>
#include <cctype>
#include <string>

#include "parallel/comm/topology.h"
#include "tools/layout_cli.h"

namespace sl {
namespace train_flags {

// --stage-layers: counts like 2,1,1, each in 1..1048576.
inline std::string stage_layers_error(const std::string& v) {
  const std::string form = "expected layer counts like 2,1,1, got '" + v + "'";
  if (v.empty() || v.front() == ',' || v.back() == ',' || v.find(",,") != std::string::npos) return form;
  for (char ch : v)
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == ',')) return form;
  for (size_t begin = 0; begin < v.size();) {
    const size_t end = std::min(v.find(',', begin), v.size());
    const std::string count = v.substr(begin, end - begin);
    if (count.size() > 7 || std::stoll(count) < 1 || std::stoll(count) > (1 << 20))
      return "expected layer counts in 1..1048576 like 2,1,1, got '" + v + "'";
    begin = end + 1;
  }
  return "";
}

// --trace: FILE.svg or FILE.json.
inline std::string trace_error(const std::string& v) {
  for (const std::string suffix : {".svg", ".json"})
    if (v.size() > suffix.size() && v.compare(v.size() - suffix.size(), suffix.size(), suffix) == 0) return "";
  return "expected a FILE.svg or FILE.json, got '" + v + "'";
}

// --links and --topology: the library's parser says what is wrong (its sl::Error).
template <typename Read>
cli::Check readable(Read read) {
  return [read](const std::string& v) {
    try {
      read(v);
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
}

// What the fields take that are not plain values: the random seed (unsigned), the links (a spec or a file).
struct Raw {
  int64_t seed = 1337;
  std::string links, topology;
};

}  // namespace train_flags

inline void add_model_flags(cli::Parser& cli, Options& o) {
  cli.group("Task and data");
  cli.choice("--task", o.task, {"addition", "text", "bin"},
             "what to learn: addition (\"a+b=c\" lines, held-out accuracy), a text file's bytes, or a uint16 "
             "token file");
  cli.text("--data", o.data, "PATH", "the text file (--task text) or uint16 token file (--task bin)");
  cli.integer("--vocab-size", o.vocab_size, 1, 65536, "vocabulary of --task bin (addition and text use bytes: 256)");
  cli.integer("--digits", o.digits, 1, 4, "operand digits for addition");
  cli.group("Model");
  cli.integer("--n-layer", o.n_layer, 1, cli::kNoMaximum, "transformer blocks");
  cli.integer("--n-head", o.n_head, 1, cli::kNoMaximum, "attention heads (they divide --n-embd)");
  cli.integer("--n-embd", o.n_embd, 1, cli::kNoMaximum, "embedding width");
  cli.integer("--block-size", o.block_size, 1, cli::kNoMaximum,
              "context length; 0, the default, is one line for addition and 64 otherwise");
  cli.real("--dropout", o.dropout, cli::number_where([](double p) { return p >= 0 && p < 1; }, "a probability in [0, 1)"), "0 <= P < 1",
           "dropout probability in attention and the MLP");
  cli.choice("--recompute", o.recompute, {"none", "selective", "full"},
             "activation recomputation: rerun each block's attention core (selective) or whole forward (full) "
             "during backward instead of keeping its activations; the same gradients, bitwise");
  cli.text("--init-from", o.init_from, "PATH",
           "load weights (safetensors, strict by name) before training, into any layout");
  cli.group("Mixture of experts (serial, or over --ep)");
  cli.integer("--moe-experts", o.moe_experts, 0, cli::kNoMaximum,
              "experts E in place of the MLP (a router picks --moe-top-k per token); 0, the default: the dense MLP");
  cli.integer("--moe-top-k", o.moe_top_k, 1, cli::kNoMaximum, "experts each token is routed to (<= --moe-experts)");
  cli.integer("--moe-every", o.moe_every, 0, cli::kNoMaximum,
              "every N-th block's MLP is a mixture of experts (blocks N-1, 2N-1, ...); 0 or 1: every block");
  cli.real("--moe-capacity-factor", o.moe_capacity_factor, cli::number_at_least(0), ">= 0",
           "each expert takes at most ceil(F x tokens x k / E) assignments, the rest dropped (first choices "
           "first, then token order); 0, the default: dropless");
  cli.choice("--moe-router", o.moe_router, {"softmax-topk", "topk-softmax"},
             "softmax over all experts then the k largest as they are (Switch), or the k largest logits then "
             "softmax over them (Mixtral)");
  cli.real("--moe-aux-weight", o.moe_aux_weight, cli::number_at_least(0), ">= 0",
           "weight of Switch's load-balancing loss E x sum f_e P_e");
  cli.real("--moe-z-weight", o.moe_z_weight, cli::number_at_least(0), ">= 0",
           "weight of the router z-loss, the mean squared logsumexp of the router logits");
}

inline void add_training_flags(cli::Parser& cli, Options& o, train_flags::Raw& raw) {
  using cli::number_at_least, cli::number_where;
  cli.group("Training");
  cli.integer("--batch-size", o.batch_size, 1, cli::kNoMaximum,
              "the global batch: rows over every rank and micro-batch");
  cli.integer("--steps", o.steps, 0, cli::kNoMaximum, "optimizer steps");
  cli.integer("--micro-batches", o.micro_batches, 1, 1 << 20,
              "gradient accumulation: each rank's rows in M backward passes, one optimizer step; the same loss "
              "and update as M = 1");
  cli.real("--lr", o.lr, number_at_least(0), ">= 0", "peak learning rate, after the warm-up");
  cli.real("--min-lr", o.min_lr, number_at_least(0), ">= 0", "where the cosine decay ends");
  cli.integer("--warmup-steps", o.warmup_steps, 0, cli::kNoMaximum, "linear warm-up steps");
  cli.real("--weight-decay", o.weight_decay, number_at_least(0), ">= 0", "AdamW decay on matrices");
  // Adam divides by sqrt(v) + eps: 0 would turn a parameter with no gradient into 0/0.
  cli.real("--adam-eps", o.adam_eps, number_where([](double x) { return x > 0; }, "a number > 0"), "> 0",
           "AdamW's epsilon");
  cli.real("--grad-clip", o.grad_clip, number_at_least(0), ">= 0", "clip the global gradient norm; 0 turns it off");
  cli.integer("--seed", raw.seed, 0, cli::kNoMaximum, "model init and data order");
  cli.integer("--eval-every", o.eval_every, 0, cli::kNoMaximum,
              "held-out accuracy every N steps (addition; 0: only at the end)");
  cli.real("--min-accuracy", o.min_accuracy,
           number_where([](double p) { return p >= 0 && p <= 100; }, "a percentage in 0..100"), "0..100",
           "addition: exit 1 when the final held-out accuracy is below P percent");
  cli.choice("--device", o.device, {"cpu", "cuda"},
             "with ranks, cuda runs rank r on GPU cuda:r over NCCL (one rank per GPU: world <= GPUs visible): "
             "DDP, --pp, --tp, --cp; ZeRO, FSDP, HSDP, --naive-dp and --links run on CPU ranks only");
  cli.integer("--threads", o.threads, 1, 1024, "GEMM threads");
  cli.flag("--compare-serial", o.compare_serial, "also train the serial model and report the largest difference");
  cli.group("Mixed precision");
  cli.choice("--mixed-precision", o.mixed_precision, {"no", "bf16", "fp16"},
             "16-bit weights and activations, f32 master weights and moments in the optimizer; matmuls "
             "accumulate, softmax, LayerNorm and the loss compute in f32");
  cli.choice("--grad-reduce-dtype", o.grad_reduce_dtype, {"bf16", "f32"},
             "how gradients accumulate over micro-batches and are reduced (bf16: 2 + 2 + 12 bytes per parameter; "
             "f32: Megatron's main_grad, 2 + 4 + 12; default bf16 for bf16, f32 for fp16)");
  cli.text("--loss-scale", o.loss_scale, "dynamic|N",
           "fp16 loss scaling (GradScaler: 2^16, x2 per 2000 clean steps, x0.5 and the step skipped on inf/NaN; "
           "default dynamic for fp16, off for bf16)");
}

inline void add_output_flags(cli::Parser& cli, Options& o, train_flags::Raw& raw) {
  cli.group("Checkpoints");
  cli.text("--checkpoint-dir", o.checkpoint_dir, "DIR",
           "save a distributed checkpoint DIR/step-N (every rank its own shards, then metadata.json) at the end "
           "of the run and every --save-every steps (build/bin/checkpoint reads them); created and checked "
           "writable before step 0");
  cli.integer("--save-every", o.save_every, 1, cli::kNoMaximum, "a checkpoint every N steps too");
  cli.integer("--keep-last", o.keep_last, 1, 1 << 20, "keep only the newest K checkpoints");
  cli.text("--resume", o.resume, "DIR",
           "continue from the newest complete checkpoint in DIR (or DIR itself), under any layout: weights, "
           "AdamW's state, the step, the data's position, the loss scale and (same world size) the ranks' "
           "random generators");
  cli.text("--save", o.save, "PATH",
           "save weights (safetensors, the serial model's names) at the end, from any layout; --steps 0 saves "
           "the initial weights; checked writable before step 0");
  cli.group("Output");
  cli.text("--log-jsonl", o.log_jsonl, "PATH", "one JSON object per optimizer step");
  cli.text("--report-json", o.report_json, "PATH",
           "per rank: mesh coordinates, memory by category, bytes and calls per group and op, "
           "compute/communication/idle time (README: \"The run report\")");
  cli.flag("--profile", o.profile,
           "print time per op kind: forward, backward, optimizer (serial runs only)");
  cli.group("Simulated cluster");
  cli.text("--links", raw.links, "SPEC",
           "simulate a cluster's links on the thread ranks: every message waits latency + bytes/bandwidth of its "
           "link, e.g. 'intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=4' (ranks fill nodes in order)",
           train_flags::readable(parallel::Topology::parse_links));
  cli.text("--topology", raw.topology, "FILE.json",
           "the same from a file: {\"gpus_per_node\": 4, \"intra\": {\"bandwidth\": \"300GB/s\", \"latency\": "
           "\"1us\"}, \"inter\": {...}}",
           train_flags::readable(parallel::Topology::load));
}

// Every flag of train, bound to `o` (and `raw`), grouped for --help.
inline void add_expert_parallel_flags(cli::Parser& cli, Options& o) {
  cli.group("Expert parallel");
  cli.integer("--ep", o.ep, 1, 1024,
              "a mixture of experts' experts over N ranks, which also split the batch (world = dp x ep x pp x tp x "
              "cp); with --moe-experts, under DDP or --zero 1|2|3 (--dp), with --tp (the experts whole on every tp "
              "rank), --pp and --cp (DDP), and HSDP; not yet with --offload or --sp");
}

inline void add_train_flags(cli::Parser& cli, Options& o, train_flags::Raw& raw) {
  cli.group("Config file");
  cli.config_file(
      "read flags from a TOML file: the same keys without -- (tp = 2, dp-replicate = 2, sp = true, cp-variant = "
      "\"ring\"); flags on the command line win over it (configs/ holds ready layouts)");
  add_model_flags(cli, o);
  add_training_flags(cli, o, raw);
  add_layout_flags(cli, o);
  cli.group("Data parallel");
  cli.flag("--naive-dp", o.naive_dp, "the classic DataParallel (rank 0 scatters, gathers and steps)");
  add_expert_parallel_flags(cli, o);
  cli.group("Pipeline");
  cli.text("--stage-layers", o.stage_layers, "a,b,...", "layers per stage (default: balanced by count)",
           train_flags::stage_layers_error);
  cli.text("--trace", o.trace, "FILE.svg|FILE.json",
           "the pipeline's timeline: an SVG picture or a Chrome trace (Perfetto)", train_flags::trace_error);
  add_output_flags(cli, o, raw);
}

inline Options parse_train(int argc, const char* const* argv, bool* help = nullptr) {
  Options o;
  train_flags::Raw raw;
  raw.seed = static_cast<int64_t>(o.seed);
  cli::Parser cli("train", "train: the tiny GPT learns a task, serially or over any layout of thread ranks");
  add_train_flags(cli, o, raw);
  cli.footer("A bad flag or value exits 2 naming it; a failed run exits 1 naming what failed.");
  const bool asked = cli.parse(argc, argv);
  if (help) *help = asked;
  if (asked) return o;
  o.seed = static_cast<uint64_t>(raw.seed);
  if (!raw.links.empty()) o.topology = parallel::Topology::parse_links(raw.links);
  if (!raw.topology.empty()) o.topology = parallel::Topology::load(raw.topology);
  o.resolve();
  try {
    o.validate();
  } catch (const parallel::OptionError& e) {
    throw UsageError{e.what()};
  }
  return o;
}

}  // namespace sl
