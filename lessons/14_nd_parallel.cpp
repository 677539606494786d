// Lesson 14 — N-D parallelism: every cut at once, on one mesh.
//
// What you will learn
//   * the mesh: world ranks laid out row-major as [pp, dp_replicate, dp_shard, ep, cp, tp] (TP
//     innermost, PP outermost, as torchtitan does). A group over a dimension holds the ranks that
//     agree on every OTHER coordinate. Drawn for world 8 = dp 2 x pp 2 x tp 2 and pp 2 x cp 2 x tp 2,
//     computed on the page and checked against DeviceMesh's groups:
//
//        rank = (((pp·R + r)·S + s)·C + c)·T + t          (R, S, C, T: the degrees of dp_replicate,
//                                                            dp_shard, cp, tp)
//   * a tour of layouts of world 8 on the same small GPT, all through parallel::Trainer: per layout
//     the memory per rank by category (ledger peak), the bytes each group sends per rank and step,
//     and the pipeline bubble, side by side; every layout's loss equals the serial model's
//   * the rules of thumb for choosing a layout, each checked against a number of that table
//   * Hugging Face Accelerate's ND-parallel guide walked section by section, with FSDP and HSDP over
//     every cut: HSDP, FSDP + TP, FSDP + CP, HSDP + TP, then its example dp_shard 2 x dp_replicate 2
//     x cp 2 x tp 2 on world 16. Per layout rank 0's groups, the memory per rank between steps and at
//     peak, and the bytes each group (dp_shard or dp_shard_cp, dp_replicate, tp, cp) sends; each
//     claim checked against a formula in Ψ worked out on the page: Ψ counted from nn::GPT and split
//     by Megatron's rule into TP-sliced and replicated parameters, Ψ_tp = Ψ_sliced/tp + Ψ_replicated:
//
//        model state per rank = 16·Ψ_tp/(dp_shard·cp)       FSDP sends 3·(N-1)/N·4·Ψ_tp per rank and step
//        HSDP's replica all-reduce = 2·(R-1)/R·4·Ψ_tp/N      (N = dp_shard·cp, R = dp_replicate)
//   * how every one of those layouts was built: parallel/nd/parallelize.cpp read line by line (section
//     5, in 14_parallelize_on_the_page.h): cut for the pipeline -> apply_tensor_parallel ->
//     apply_context_parallel -> the stage's schedule -> the data-parallel strategy, one path for all;
//     then checked on two layouts of world 8, rank by rank
//
// Where each gradient is reduced (parallel/nd/nd_parallelizer.h):
//                        dp (DDP/ZeRO-1)   cp (sum)   tp (sum)                         pp pair {0, p-1} (sum)
//     tp-sharded weights     average          yes        —                                 —
//     replicated params      average          yes        under SP: LayerNorms, ln_f,       —
//                                                        c_proj biases (T/tp rows each)
//     wte (tied)             average          yes        —                                 yes
//
// Run:    make lesson N=14   (about 2 s here: 17 runs of 2 steps, up to 16 thread ranks)
// Try:    build/lessons/14_nd_parallel --batch 32 --T 8 --steps 3 --svg /tmp/svg_14   (the meshes drawn)
//         build/lessons/14_nd_parallel --mesh pp2,cp2,tp4;  --break-order (the page lays ranks out pp-fastest)
// Prints: 1 the two meshes, rank by rank; 2 the table; 3 the rules, each "OK"; 4 the guide's
//         sections, each layout's groups, memory and bytes, then its checks; 5 parallelize, line by
//         line, and what it built on two layouts; then "lesson 14: OK".
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "tensor/ledger.h"
#include "lesson_args.h"
#include "lesson_svg.h"
#include "14_parallelize_on_the_page.h"  // section 5

using namespace sl;
using namespace sl::parallel;

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static std::string num(double v, int digits = 1) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
static bool ok = true;  // the lesson's verdict: every check() and'ed in
static void check(bool condition, const std::string& what) {
  std::printf("  check: %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
  ok = ok && condition;
}

// What a student may change (main reads the flags): the batch B (rows, split over dp), the context T
// (the model's block_size), the AdamW steps, the random seed; the mesh order mistake; where pictures go.
struct Run {
  const nn::TokenStream& data;
  nn::GPTConfig model;
  int64_t batch = 16, T = 16;
  int steps = 2;
  uint64_t seed = 13;
  bool column_major = false;  // the mistake: the page's coordinates vary pp fastest, not tp
  std::string svg_dir;
};

// ---- 1. the mesh on the page ------------------------------------------------------------------------
// Degrees and coordinates in grid order: pp, dp_replicate, dp_shard, ep, cp, tp (outermost first;
// ep, expert parallelism, is 1 in this lesson: lesson 17 splits experts over it).
using Coords = std::array<int, kGridDimCount>;
static Coords coords_of(int rank, const Coords& degrees, bool column_major = false) {
  Coords c{};
  if (column_major) {  // the mistake: pp varies fastest, so tp pairs land world/tp apart
    for (int d = 0; d < kGridDimCount; ++d) c[d] = rank % degrees[d], rank /= degrees[d];
    return c;
  }
  for (int d = kGridDimCount - 1; d >= 0; --d) c[d] = rank % degrees[d], rank /= degrees[d];  // row-major: the last varies fastest
  return c;
}
// The groups of the set `dims`: ranks that agree on every coordinate outside it, each ascending.
static std::vector<std::vector<int>> groups_on_page(const std::vector<int>& dims, const Coords& degrees,
                                                    bool column_major = false) {
  int world = 1;
  for (int d : degrees) world *= d;
  std::map<std::vector<int>, std::vector<int>> by_rest;
  for (int r = 0; r < world; ++r) {
    Coords c = coords_of(r, degrees, column_major);
    for (int d : dims) c[d] = -1;  // forget the coordinates the group varies
    by_rest[{c.begin(), c.end()}].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [rest, members] : by_rest) out.push_back(members);
  std::sort(out.begin(), out.end());
  return out;
}
static std::string braces(const std::vector<int>& ranks) {
  std::string s = "{";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "}";
}

// The mesh as a picture: one row of boxes per dimension (tp, cp, dp_shard, dp_replicate, pp), one box
// per rank, coloured by which of that dimension's groups (DeviceMesh::partition) holds the rank.
static void picture_mesh(const Run& run, const ParallelismConfig& config,
                         const std::map<std::string, std::vector<std::vector<int>>>& partitions) {
  const char* colours[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6"};
  const int world = config.world_size();
  const double w = 44, h = 26, left = 110;
  const std::string title = "world " + std::to_string(world) + " = " + config.str() + " (colour = group)";
  lesson::Canvas canvas(std::max(left + w * world + 20, 7.5 * title.size() + 20), 40 + (h + 8) * partitions.size() + 10);
  canvas.text(10, 20, title, 12);
  double y = 34;
  for (const auto& [name, groups] : partitions) {
    canvas.text(left - 8, y + h / 2 + 4, name, 11, "end");
    for (size_t g = 0; g < groups.size(); ++g)
      for (int rank : groups[g]) canvas.box(left + w * rank, y, w - 4, h, colours[g % 8], std::to_string(rank));
    y += h + 8;
  }
  std::string file = "mesh";
  for (MeshDim dim : {MeshDim::pp, MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::cp, MeshDim::tp})
    file += "_" + std::to_string(config.degrees()[grid_index(dim)]);
  lesson::write_picture(run.svg_dir, file + ".svg", canvas.str());
}

static void draw_mesh(const ParallelismConfig& config, const Run& run) {
  const Coords degrees = config.degrees();
  const int world = config.world_size();
  std::printf("world %d = %s, grid [pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d]\n", world, config.str().c_str(),
              degrees[0], degrees[1], degrees[2], degrees[4], degrees[5]);
  // a mesh dim -> the grid positions it spans, drawn by hand (products too)
  const std::vector<std::pair<MeshDim, std::vector<int>>> names = {{MeshDim::pp, {0}},
                                                                   {MeshDim::dp_replicate, {1}},
                                                                   {MeshDim::cp, {4}},
                                                                   {MeshDim::tp, {5}},
                                                                   {MeshDim::dp_cp, {1, 2, 3, 4}}};
  std::map<std::string, std::vector<std::vector<int>>> library;  // from DeviceMesh, on rank 0
  std::map<std::string, std::vector<std::vector<int>>> drawn;    // the dimensions of more than one rank
  std::vector<std::string> lines(world);
  launch(world, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, config);  // collective: every rank builds the same mesh
    const Coords c = mesh.coordinates();
    char head[96];
    std::snprintf(head, sizeof head, "  rank %d = (pp %d, dp %d, cp %d, tp %d):", ctx.rank, c[0], c[1], c[4], c[5]);
    std::string line = head;
    for (MeshDim dim : {MeshDim::tp, MeshDim::cp, MeshDim::dp_replicate, MeshDim::pp})
      if (mesh.size(dim) > 1) {
        std::vector<int> peers = mesh.members(dim);
        peers.erase(std::find(peers.begin(), peers.end(), ctx.rank));
        line += "  " + std::string(dim == MeshDim::dp_replicate ? "dp" : name(dim)) + " with " + braces(peers);
      }
    lines[ctx.rank] = line;
    if (ctx.rank != 0) return;
    for (const auto& [dim, positions] : names) library[std::string(name(dim))] = mesh.partition(dim);
    for (MeshDim dim : {MeshDim::tp, MeshDim::cp, MeshDim::dp_shard, MeshDim::dp_replicate, MeshDim::pp})
      if (mesh.size(dim) > 1) drawn[std::string(name(dim))] = mesh.partition(dim);
  });
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  for (const auto& [dim, positions] : names) {
    const std::string name = std::string(parallel::name(dim));
    std::vector<std::vector<int>> want = groups_on_page(positions, degrees, run.column_major), got = library[name];
    std::sort(got.begin(), got.end());
    std::string shown, library_shown;
    for (const auto& g : want) shown += " " + braces(g);
    for (const auto& g : got) library_shown += " " + braces(g);
    if (got != want) std::printf("  --break-order: the page's %s groups%s, DeviceMesh's%s\n", name.c_str(), shown.c_str(), library_shown.c_str());
    check(got == want, name + " groups" + shown + " == DeviceMesh::partition");
  }
  if (!run.svg_dir.empty()) picture_mesh(run, config, drawn);
}

// ---- 2. the tour ------------------------------------------------------------------------------------
// B·T per rank must exceed ~3C for TP's activation all-reduces to outweigh DP's gradient one, as in
// real LLMs (B·T in the thousands, C in the thousands): 16 rows of 16 tokens, C 16.
// (Run's defaults; --batch and --T change them, and the rules of section 3 hold over their ranges.)
static const nn::GPTConfig kConfig{.vocab_size = 32, .block_size = 16, .n_layer = 4, .n_head = 4, .n_embd = 16};
static nn::AdamWOptions adamw() { return {.lr = 1e-2, .eps = 1e-6, .weight_decay = 0.1}; }

static nn::TokenStream tokens() {
  nn::TokenStream s;
  s.vocab_size = 32;
  for (int i = 0; i < 4000; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
  return s;
}

struct Layout {
  std::string name;
  TrainPlan plan;
};
static Layout layout(std::string name, ParallelismConfig par, int zero = 0, int micro = 1, bool sp = false) {
  TrainPlan plan;
  plan.parallelism = par;
  plan.dp_strategy = zero_stage_strategy(zero);
  plan.micro_batches = micro;
  plan.sequence_parallel = sp;
  return {std::move(name), plan};
}

constexpr MemoryCategory kCats[] = {MemoryCategory::weights, MemoryCategory::grads, MemoryCategory::optimizer,
                                    MemoryCategory::activations};
struct Row {
  std::string name;
  ParallelismConfig config;
  std::vector<double> losses;
  std::array<double, 5> kib{};          // per category (kCats), then the total: peak, max over ranks
  std::map<std::string, double> sent;   // KiB sent per rank and step, mean over ranks: dp, pp, cp, tp
  std::map<std::string, double> calls;  // calls per rank and step, mean over ranks
  double bubble = 0;
  int64_t batch = 0;                    // the global batch's rows
  // Section 4 keeps the data-parallel groups apart and looks between steps:
  std::map<std::string, double> group_sent;  // as `sent`, by the group's own name: dp_shard, dp_replicate, ...
  std::array<double, 4> held{};              // KiB per category after the last step, max over ranks
  double model_state = 0;                    // KiB weights + grads + optimizer then, max over ranks
  int dp = 1;                                // dp_replicate x dp_shard: the batch's rows are split over it
  std::vector<std::pair<std::string, std::vector<int>>> rank0_groups;  // innermost first
  bool tp_groups_share_dp_rank = true;  // every tp group's ranks have one DeviceMesh::dp_rank()
};

struct RankRecord {  // what one rank counted
  std::array<int64_t, 5> peak{};
  std::array<int64_t, 4> held{};
  std::map<std::string, CommStats> traffic;  // the steps only, by group name
  int dp_rank = 0, tp_first = 0;             // tp_first: the lowest rank of its tp group
};

static void train_rank(RankContext& ctx, const TrainPlan& plan, const Run& run, RankRecord& record, Row& row) {
  MemoryLedger& ledger = MemoryLedger::instance();
  std::array<int64_t, 4> before_build{};
  for (int c = 0; c < 4; ++c) before_build[c] = ledger.current(ctx.device, kCats[c]);
  std::unique_ptr<Trainer> trainer = std::make_unique<Trainer>(
      ctx, plan, parallelize(run.model, run.seed, ctx.world, plan.parallelize_options(adamw())));
  auto totals = [&] {  // bytes so far per group
    std::map<std::string, CommStats> t;
    for (const auto& [name, group] : trainer->ledgers())
      if (name != "loss") t[name] = group->total();
    return t;
  };
  auto before = totals();         // setup's broadcast left out: the steps only
  ledger.reset_peak(ctx.device);  // and the peaks of training, not of building (FSDP's whole replica)
  for (int s = 0; s < run.steps; ++s) {
    double loss = trainer->train_step(run.data, s, run.batch, run.T, adamw().lr, 0.0);
    if (ctx.rank == 0) row.losses[s] = loss;
  }
  for (auto& [name, s] : totals())
    record.traffic[name] = {s.calls - before[name].calls, s.bytes_sent - before[name].bytes_sent, 0};
  for (int c = 0; c < 4; ++c) record.peak[c] = ledger.peak(ctx.device, kCats[c]);
  record.peak[4] = ledger.peak(ctx.device);
  for (int c = 0; c < 4; ++c) record.held[c] = ledger.current(ctx.device, kCats[c]) - before_build[c];
  const DeviceMesh& mesh = trainer->mesh();
  record.dp_rank = mesh.dp_rank();
  record.tp_first = mesh.members(MeshDim::tp).front();
  if (ctx.rank != 0) return;
  row.dp = mesh.size(MeshDim::dp);
  const bool both = mesh.size(MeshDim::cp) > 1 && mesh.size(MeshDim::dp_shard) > 1;  // else dp_shard_cp is one of them
  for (MeshDim dim : {MeshDim::tp, MeshDim::cp, MeshDim::dp_shard, MeshDim::dp_shard_cp, MeshDim::dp_replicate,
                      MeshDim::pp})
    if (mesh.size(dim) > 1 && (both || dim != MeshDim::dp_shard_cp))
      row.rank0_groups.push_back({std::string(name(dim)), mesh.members(dim)});
}

static Row measure(const Layout& l, int world, const Run& run) {
  Row row;
  row.name = l.name;
  row.config = l.plan.parallelism;
  row.batch = run.batch;
  row.losses.assign(run.steps, 0.0);
  const TrainPlan& plan = l.plan;
  plan.validate(world);
  check_model_cut(run.model, plan.parallelize_options(), plan.micro_batches);
  std::vector<RankRecord> records(world);
  launch(world, [&](RankContext& ctx) { train_rank(ctx, plan, run, records[ctx.rank], row); });
  for (const RankRecord& r : records) {
    for (int c = 0; c < 5; ++c) row.kib[c] = std::max(row.kib[c], r.peak[c] / 1024.0);
    for (int c = 0; c < 4; ++c) row.held[c] = std::max(row.held[c], r.held[c] / 1024.0);
    row.model_state = std::max(row.model_state, (r.held[0] + r.held[1] + r.held[2]) / 1024.0);
    for (const auto& [name, s] : r.traffic) {
      const std::string merged = name.rfind("dp", 0) == 0 ? "dp" : name;  // DDP's dp, ZeRO's dp_shard, HSDP's both
      row.sent[merged] += s.bytes_sent / 1024.0 / run.steps / world;
      row.calls[merged] += static_cast<double>(s.calls) / run.steps / world;
      row.group_sent[name] += s.bytes_sent / 1024.0 / run.steps / world;
    }
    row.tp_groups_share_dp_rank &= r.dp_rank == records[r.tp_first].dp_rank;  // the same rows of the batch
  }
  const auto& par = plan.parallelism;
  if (par.pp > 1)
    row.bubble = bubble_formula(plan.schedule, par.pp, plan.micro_batches, 1);
  return row;
}

static Row serial_row(const Run& run) {  // an independent nn::GPT + nn::AdamW
  Row row;
  row.name = "serial";
  MemoryLedger& ledger = MemoryLedger::instance();
  const Device dev = current_device();
  {
    nn::GPT model(run.model, run.seed);
    nn::AdamW optimizer(model.parameters(), adamw());
    ledger.reset_peak(dev);
    for (int s = 0; s < run.steps; ++s) {
      optimizer.zero_grad();
      nn::Batch batch = run.data.get_batch(s, run.batch, run.T);
      Tensor loss = model.loss(batch.inputs, batch.targets);
      loss.backward();
      row.losses.push_back(loss.item());
      optimizer.step();
    }
    for (int c = 0; c < 4; ++c) row.kib[c] = ledger.peak(dev, kCats[c]) / 1024.0;
    row.kib[4] = ledger.peak(dev) / 1024.0;
  }
  return row;
}
static void check_losses(const Row& r, const Row& serial) {
  bool same = true;
  for (size_t s = 0; s < serial.losses.size(); ++s)
    same = same && std::abs(r.losses[s] - serial.losses[s]) <= 4e-5 + 1e-5 * std::abs(serial.losses[s]);
  check(same, r.name + ": every step's loss == serial (rtol 1e-5, atol 4e-5)");
}

// ---- 4. the Accelerate guide, section by section ------------------------------------------------------
// Ψ on the page: nn::GPT(kConfig)'s parameters, split by Megatron's rule. Sliced over tp: c_attn's and
// c_fc's weight and bias, both c_proj weights, and wte (V padded up to a multiple of tp). Whole on
// every tp rank: the LayerNorms, wpe and the c_proj biases (added after the all-reduce).
struct ParamCount {
  int64_t sliced = 0, replicated = 0;
  double total() const { return static_cast<double>(sliced + replicated); }
  double on_tp_rank(int tp) const {  // Ψ_tp = Ψ_sliced/tp (with wte's padding rows) + Ψ_replicated
    const int64_t vocab = kConfig.vocab_size, padded = (vocab + tp - 1) / tp * tp;
    return static_cast<double>(sliced + (padded - vocab) * kConfig.n_embd) / tp + replicated;
  }
};
static ParamCount count_parameters(const Run& run) {
  ParamCount count;
  for (const auto& [name, p] : nn::GPT(run.model, run.seed).named_parameters()) {
    auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
    const bool sliced = has("c_attn") || has("c_fc") || has("c_proj.weight") || name.rfind("wte", 0) == 0;
    (sliced ? count.sliced : count.replicated) += p.numel();
  }
  return count;
}

// FSDP holds per rank, between steps, 4 bytes of weights, 4 of gradients and 8 of AdamW moments per
// element of its shard. Each unit (a block, the root, wte on its own: n_layer + 2 at most) is padded
// to a multiple of N, so a shard holds under one element more per unit and array: that is the slack.
static void check_state(const Row& r, double per_rank, const std::string& formula, double bytes = 16) {
  const double want = bytes * per_rank / 1024, pad = bytes * (kConfig.n_layer + 2) / 1024;
  const double got = bytes == 16 ? r.model_state : r.held[2];
  check(got >= want - 1e-6 && got < want + pad, r.name + (bytes == 16 ? ": weights+grads+optimizer " : ": optimizer ") +
                                                    num(got, 2) + " KiB, on the page " + formula + " = " +
                                                    num(want, 2) + " KiB (+ padding < " + num(pad, 2) + ")");
}
// Ring collectives: an all-gather or a reduce-scatter of P elements over N ranks sends (N-1)/N · 4P
// bytes per rank, an all-reduce twice that. ±1%: the padding adds under (n_layer + 2)·N elements to P
// (0.2% here), and nothing else rides on these groups (no clipping; the loss has its own group).
static double ring_kib(double elements, int n) { return (n - 1.0) / n * 4 * elements / 1024; }
static double sent(const Row& r, const std::string& group) {
  return r.group_sent.count(group) ? r.group_sent.at(group) : 0.0;
}
static void check_sent(const Row& r, const std::string& group, double want, const std::string& formula) {
  const double got = sent(r, group);
  check(std::abs(got - want) <= 0.01 * want, r.name + ": " + group + " sends " + num(got, 2) +
                                                 " KiB per rank and step, " + formula + " = " + num(want, 2) +
                                                 " KiB (±1%)");
}

static void show(const Row& r, const Row& serial) {
  std::printf("\n%s = %s (world %d, %d rows per data-parallel rank)\n", r.name.c_str(), r.config.str().c_str(),
              r.config.world_size(), static_cast<int>(r.batch / r.dp));
  std::string line;
  for (const auto& [name, ranks] : r.rank0_groups) line += "  " + name + " " + braces(ranks);
  std::printf("  mesh, rank 0's groups:%s\n", line.c_str());
  std::printf("  KiB per rank (max over ranks)  weights  grads  optim  activ\n");
  std::printf("    between steps               %7.2f %6.2f %6.2f %6.2f   (model state %.2f)\n", r.held[0],
              r.held[1], r.held[2], r.held[3], r.model_state);
  std::printf("    peak                        %7.2f %6.2f %6.2f %6.2f\n", r.kib[0], r.kib[1], r.kib[2], r.kib[3]);
  line.clear();
  for (const auto& [group, kib] : r.group_sent) line += "  " + group + " " + num(kib, 2);
  std::printf("  KiB sent per rank and step:%s\n", line.c_str());
  check_losses(r, serial);
}
static void bytes_not_time(const char* claim) {
  std::printf(
      "  (The guide: %s.\n"
      "   That is about time on real links; this lesson counts bytes between threads. bench/nd_parallel\n"
      "   measures CPU time per step; time on real links is the planner's, a later chapter.)\n",
      claim);
}

struct Guide {
  const Run& run;
  const Row& serial;
  const Row& fsdp8;  // section 2's FSDP over all 8 ranks
  ParamCount psi;
};

static void guide_hsdp(const Guide& g) {
  const int R = 2, S = 4;
  const double psi = g.psi.total();
  std::printf(
      "\n4.1 HSDP (dp_replicate R, dp_shard S): FSDP inside a node, whole replicas across nodes. With nodes\n"
      "of 4 ranks: S = 4 shards, R = 2 replicas. Within a replica FSDP all-gathers and reduce-scatters as\n"
      "ever; across replicas each rank all-reduces its gradient shard, once per step.\n");
  Row hsdp = measure(layout("hsdp 2x4", {.dp_replicate = R, .dp_shard = S}, 3), R * S, g.run);
  show(hsdp, g.serial);
  check_state(hsdp, psi / S, "8Ψ/S", 8);
  check_state(hsdp, psi / S, "16Ψ/S");
  check_sent(hsdp, "dp_shard", 3 * ring_kib(psi, S), "3·(S-1)/S·4Ψ");
  check(sent(hsdp, "dp_replicate") > 0, "hsdp 2x4: the replicas exchange gradients");
  check_sent(hsdp, "dp_replicate", 2 * ring_kib(psi / S, R), "2·(R-1)/R·4Ψ/S");
  std::printf(
      "Only dp_replicate crosses nodes, carrying a shard. Flat FSDP (section 2's fsdp8) runs every\n"
      "all-gather and reduce-scatter on a ring over both nodes:\n");
  check(sent(hsdp, "dp_replicate") < sent(g.fsdp8, "dp_shard") / S,
        "hsdp's cross-node group sends " + num(sent(hsdp, "dp_replicate"), 2) + " KiB per rank, under 1/S of fsdp8's " +
            num(sent(g.fsdp8, "dp_shard"), 2));
  std::printf("The knob: shard over more ranks (fsdp8: FSDP across both nodes) for less memory per rank:\n");
  check(g.fsdp8.model_state < hsdp.model_state, "fsdp8 holds " + num(g.fsdp8.model_state, 2) +
                                                    " KiB of model state per rank, hsdp 2x4 " +
                                                    num(hsdp.model_state, 2));
  bytes_not_time("FSDP's heavy traffic stays on fast intra-node links, the slow inter-node ones carry little");
}

static void guide_fsdp_tp(const Guide& g) {
  const int S = 4, T = 2;
  const double psi = g.psi.total(), part = g.psi.on_tp_rank(T);
  std::printf(
      "\n4.2 FSDP + TP (dp_shard S, tp T): TP inside a node (neighbouring ranks), FSDP across nodes over what\n"
      "TP leaves on a rank. Ψ = %.0f parameters: %lld sliced by TP, %lld replicated (LayerNorms, wpe, c_proj\n"
      "biases); a tp rank of %d holds Ψ_tp = Ψ_sliced/%d + Ψ_replicated = %.0f = %.3f Ψ, not Ψ/%d.\n",
      psi, static_cast<long long>(g.psi.sliced), static_cast<long long>(g.psi.replicated), T, T, part, part / psi, T);
  Row alone = measure(layout("fsdp4", {.dp_shard = S}, 3), S, g.run);
  Row both = measure(layout("fsdp4 x tp2", {.dp_shard = S, .tp = T}, 3), S * T, g.run);
  show(alone, g.serial);
  show(both, g.serial);
  check_state(both, part / S, "16·Ψ_tp/S");
  check_sent(both, "dp_shard", 3 * ring_kib(part, S), "3·(S-1)/S·4·Ψ_tp");
  const double ratio = sent(both, "dp_shard") / sent(alone, "dp_shard"), want = part / psi;
  check(std::abs(ratio - want) <= 0.01 * want, "TP cuts FSDP's bytes per rank to " + num(ratio, 3) +
                                                   "x, on the page Ψ_tp/Ψ = " + num(want, 3) + "x (1/tp = " +
                                                   num(1.0 / T, 3) + " but for the replicated params) (±1%)");
  check(both.kib[0] < alone.kib[0], "peak weights (shards + one gathered block) " + num(alone.kib[0], 2) + " -> " +
                                        num(both.kib[0], 2) + " KiB: no rank gathers a whole block any more");
  std::printf(
      "A tp group computes on one batch: its ranks share a dp rank, so dp = world/tp. At %d rows per\n"
      "data-parallel rank, world 8 trains on %d x dp rows: fsdp8 %d x %d, fsdp4 x tp2 %d x %d.\n",
      static_cast<int>(both.batch / both.dp), static_cast<int>(both.batch / both.dp),
      static_cast<int>(both.batch / both.dp), g.fsdp8.dp, static_cast<int>(both.batch / both.dp), both.dp);
  check(both.tp_groups_share_dp_rank, "fsdp4 x tp2: every tp group's ranks (DeviceMesh::members) have one dp_rank()");
  check(both.dp == S && g.fsdp8.dp == both.dp * T, "dp = world/tp = " + std::to_string(both.dp) + " vs fsdp8's " +
                                                       std::to_string(g.fsdp8.dp) + ": the global batch shrinks by tp");
  bytes_not_time("TP must stay within a node, on NVLink");
}

static void guide_fsdp_cp(const Guide& g) {
  const int S = 2, C = 2;
  const double psi = g.psi.total();
  std::printf(
      "\n4.3 FSDP + CP (dp_shard S, cp C): the cp ranks hold the same weights (each its part of the sequence),\n"
      "so FSDP shards over all S·C of them: the group dp_shard_cp. Against the same mesh under DDP:\n");
  Row ddp = measure(layout("ddp2 x cp2", {.dp_replicate = S, .cp = C}), S * C, g.run);
  Row both = measure(layout("fsdp2 x cp2", {.dp_shard = S, .cp = C}, 3), S * C, g.run);
  show(ddp, g.serial);
  show(both, g.serial);
  check_state(both, psi / (S * C), "16Ψ/(S·cp)");
  check_sent(both, "dp_shard_cp", 3 * ring_kib(psi, S * C), "3·(N-1)/N·4Ψ, N = S·cp");
  std::printf("Under DDP the cp ranks also all-reduce the gradients; FSDP folds that sum into its reduce-scatter:\n");
  const double fold = sent(ddp, "cp") - sent(both, "cp"), want = 2 * ring_kib(psi, C);
  check(std::abs(fold - want) <= 0.01 * want, "cp sends " + num(fold, 2) + " KiB more under DDP, 2·(C-1)/C·4Ψ = " +
                                                  num(want, 2) + " KiB (±1%); the rest is ring attention's K/V");
  check(ddp.model_state >= 16 * psi / 1024, "ddp2 x cp2: every rank holds the whole model state (" +
                                                num(ddp.model_state, 2) + " KiB >= 16Ψ = " + num(16 * psi / 1024, 2) +
                                                ")");
}

static void guide_hsdp_tp(const Guide& g) {
  const int R = 2, S = 2, T = 2;
  const double part = g.psi.on_tp_rank(T);
  std::printf(
      "\n4.4 HSDP + TP (dp_replicate R, dp_shard S, tp T): replicas across groups of nodes, FSDP within a\n"
      "group, TP within a node; world 8 = 2 x 2 x 2, the smallest such mesh.\n");
  Row three = measure(layout("hsdp 2x2 x tp2", {.dp_replicate = R, .dp_shard = S, .tp = T}, 3), R * S * T, g.run);
  show(three, g.serial);
  check_state(three, part / S, "16·Ψ_tp/S");
  check_sent(three, "dp_shard", 3 * ring_kib(part, S), "3·(S-1)/S·4·Ψ_tp");
  check_sent(three, "dp_replicate", 2 * ring_kib(part / S, R), "2·(R-1)/R·4·Ψ_tp/S");
}

static void guide_example(const Guide& g) {
  const ParallelismConfig par{.dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 2};
  const int N = par.dp_shard * par.cp;
  const double part = g.psi.on_tp_rank(par.tp);
  std::printf(
      "\n4.5 the guide's first example, ParallelismConfig(dp_shard_size=2, dp_replicate_size=2, cp_size=2,\n"
      "tp_size=2), on world 16. Rank 0's groups by section 1's rule, against DeviceMesh's:\n");
  Row all = measure(layout("guide example", par, 3), par.world_size(), g.run);
  const std::vector<std::pair<std::string, std::vector<int>>> dims = {
      {"tp", {5}}, {"cp", {4}}, {"dp_shard", {2}}, {"dp_shard_cp", {2, 3, 4}}, {"dp_replicate", {1}}};
  for (const auto& [name, set] : dims) {
    const std::vector<int> want = groups_on_page(set, par.degrees(), g.run.column_major).front();  // the group holding rank 0
    const auto& got = all.rank0_groups;
    check(std::find(got.begin(), got.end(), std::pair{name, want}) != got.end(),
          "rank 0's " + name + " group " + braces(want) + " == DeviceMesh::members");
  }
  show(all, g.serial);
  check_state(all, part / N, "16·Ψ_tp/(S·cp)");
  check_sent(all, "dp_shard_cp", 3 * ring_kib(part, N), "3·(N-1)/N·4·Ψ_tp, N = S·cp");
  check_sent(all, "dp_replicate", 2 * ring_kib(part / N, par.dp_replicate), "2·(R-1)/R·4·Ψ_tp/N");
}

static void the_mesh(const Run& run, const std::optional<ParallelismConfig>& extra) {
  section("1. the mesh: which rank talks to which, over which dimension");
  draw_mesh({.dp_replicate = 2, .pp = 2, .tp = 2}, run);
  draw_mesh({.pp = 2, .cp = 2, .tp = 2}, run);
  if (extra) draw_mesh(*extra, run);
  std::printf("  tp pairs are neighbours (one node, the fastest links); pp pairs are 4 apart (across nodes)\n");
}

static std::vector<Row> tour(const Run& run) {
  std::printf("\n--- 2. a tour of layouts of world 8 (GPT: 4 layers, C 16, 4 heads; %lld rows x %lld tokens; %d AdamW steps)\n",
              (long long)run.batch, (long long)run.T, run.steps);
  const std::vector<Layout> layouts = {
      layout("dp8 (DDP)", {.dp_replicate = 8}),
      layout("dp8 ZeRO-1", {.dp_shard = 8}, 1),
      layout("fsdp8 (ZeRO-3)", {.dp_shard = 8}, 3),
      layout("dp2 x pp4", {.dp_replicate = 2, .pp = 4}, 0, 4),
      layout("dp2 x tp4", {.dp_replicate = 2, .tp = 4}),
      layout("dp2 x pp2 x tp2", {.dp_replicate = 2, .pp = 2, .tp = 2}, 0, 2),
      layout("dp2 x pp2 x tp2 ZeRO-1", {.dp_shard = 2, .pp = 2, .tp = 2}, 1, 2),
      layout("dp2 x tp2 x cp2", {.dp_replicate = 2, .cp = 2, .tp = 2}),
      layout("pp2 x tp2+SP x cp2", {.pp = 2, .cp = 2, .tp = 2}, 0, 2, true),
  };
  std::vector<Row> rows = {serial_row(run)};
  for (const Layout& l : layouts) rows.push_back(measure(l, 8, run));
  std::printf("%-24s %8s | %-34s | %-27s |\n", "", "", "peak KiB per rank (max over ranks)",
              "KiB sent per rank and step");
  std::printf("%-24s %8s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s | %6s\n", "layout", ("loss " + std::to_string(run.steps)).c_str(), "weight", "grads",
              "optim", "activ", "total", "dp", "pp", "tp", "cp", "bubble");
  auto cell = [](const Row& r, const char* g) { return r.sent.count(g) ? r.sent.at(g) : 0.0; };
  for (const Row& r : rows)
    std::printf("%-24s %8.5f | %6.1f %6.1f %6.1f %6.1f %6.1f | %6.1f %6.1f %6.1f %6.1f | %5.0f%%\n", r.name.c_str(),
                r.losses.back(), r.kib[0], r.kib[1], r.kib[2], r.kib[3], r.kib[4], cell(r, "dp"), cell(r, "pp"),
                cell(r, "tp"), cell(r, "cp"), 100 * r.bubble);
  std::printf(
      "  (the bubble is schedule.h's formula (p-1)/(m+p-1) for 1F1B; train --trace measures one.\n"
      "   pp: the stage boundary only; the tied wte's all-reduce over {first, last stage} has its own\n"
      "   group, which Trainer::ledgers() does not list)\n");
  const Row& serial = rows[0];
  for (size_t i = 1; i < rows.size(); ++i) check_losses(rows[i], serial);
  if (!run.svg_dir.empty()) {
    lesson::BarChart chart("peak KiB per rank (max over ranks), world 8", "KiB");
    for (const Row& r : rows) chart.bar(r.name, r.kib[4]);
    lesson::write_picture(run.svg_dir, "tour_peak_memory.svg", chart.svg());
  }
  return rows;
}

static void rules_of_thumb(const std::vector<Row>& rows) {
  section("3. rules of thumb, checked against the table");
  auto cell = [](const Row& r, const char* g) { return r.sent.count(g) ? r.sent.at(g) : 0.0; };
  const Row& serial = rows[0];
  auto row = [&](const std::string& name) -> const Row& {
    return *std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.name == name; });
  };
  const Row& three = row("dp2 x pp2 x tp2");
  std::printf(
      "TP cuts every layer and all-reduces activations in it, forward and backward: the most\n"
      "bytes and calls of any cut, so keep it inside a node, on the fastest links.\n");
  check(cell(three, "tp") > cell(three, "dp") && cell(three, "tp") > cell(three, "pp"),
        "dp2 x pp2 x tp2: tp sends the most (" + num(cell(three, "tp")) + " KiB vs dp " + num(cell(three, "dp")) +
            ", pp " + num(cell(three, "pp")) + ")");
  std::printf(
      "PP sends one activation per micro-batch per stage boundary: the fewest bytes, so it takes\n"
      "the slowest links (across nodes); its price is the bubble, which more micro-batches shrink.\n");
  check(cell(three, "pp") < cell(three, "dp") && cell(row("dp2 x pp4"), "pp") < cell(row("dp2 x pp4"), "dp"),
        "pp sends less than dp in dp2 x pp2 x tp2 and dp2 x pp4");
  check(row("dp2 x pp4").bubble > three.bubble && three.bubble > 0,
        "4 stages idle more than 2 (" + num(100 * row("dp2 x pp4").bubble) + "% vs " + num(100 * three.bubble) +
            "%), though at twice the micro-batches");
  std::printf(
      "PP and TP cut the model itself: no rank ever holds a whole layer (TP) or every layer (PP),\n"
      "where FSDP gathers a whole block for each forward: for layers too big for one device.\n");
  check(three.kib[0] < serial.kib[0] / 3 && three.kib[2] < serial.kib[2] / 3,
        "dp2 x pp2 x tp2 holds under a third of the serial weights and optimizer state (" + num(three.kib[0]) + " vs " +
            num(serial.kib[0]) + " KiB weights)");
  std::printf(
      "DP (replicas) exchanges gradients once per step, bucketed and overlapped with backward:\n"
      "few calls, so it tolerates distance: replicas go across nodes (only PP sits further out).\n");
  check(three.calls.at("dp") < three.calls.at("tp"), "dp2 x pp2 x tp2: dp makes fewer calls per step (" +
                                                         num(three.calls.at("dp")) + ") than tp (" +
                                                         num(three.calls.at("tp")) + ")");
  std::printf("When memory binds, shard what DP replicates: ZeRO-1 the optimizer state, FSDP everything.\n");
  double least_optim = 1e30;
  for (size_t i = 1; i < rows.size(); ++i) least_optim = std::min(least_optim, rows[i].kib[2]);
  check(row("fsdp8 (ZeRO-3)").kib[2] <= least_optim * 1.01 && row("dp8 ZeRO-1").kib[2] <= least_optim * 1.01,
        "fsdp8 and dp8 ZeRO-1 hold the least optimizer state");
  check(row("dp8 (DDP)").kib[2] >= serial.kib[2] * 0.99, "dp8 (DDP) holds the serial model's whole optimizer state");
  check(row("fsdp8 (ZeRO-3)").kib[4] < row("dp8 (DDP)").kib[4], "fsdp8's total peak is below DDP's");
  std::printf(
      "CP cuts the sequence: the only cut that shrinks one long sequence's activations, at the\n"
      "price of passing K/V around the ring.\n");
  check(row("dp2 x tp2 x cp2").kib[3] < row("dp2 x tp4").kib[3],
        "dp2 x tp2 x cp2 holds fewer activations than dp2 x tp4 (same rows per rank)");
}

// --mesh "pp2,cp2,tp2": degrees by name (pp, dp or dp_replicate, dp_shard, cp, tp), world at most 16.
static std::optional<ParallelismConfig> parse_mesh(const std::string& text) {
  if (text.empty()) return std::nullopt;
  ParallelismConfig config;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t digits = item.find_first_of("0123456789");
    const std::string name = item.substr(0, digits);
    const int degree = digits == std::string::npos ? 0 : std::atoi(item.c_str() + digits);
    int* field = name == "pp" ? &config.pp : name == "dp" || name == "dp_replicate" ? &config.dp_replicate
                 : name == "dp_shard" ? &config.dp_shard : name == "cp" ? &config.cp : name == "tp" ? &config.tp : nullptr;
    if (!field || degree < 1) throw Error("--mesh: '" + item + "' is not <pp|dp|dp_shard|cp|tp><degree>");
    *field = degree;
    start = comma + 1;
  }
  if (config.world_size() > 16) throw Error("--mesh " + text + ": world " + std::to_string(config.world_size()) + " > 16");
  return config;
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "14_nd_parallel", "N-D parallelism: every cut at once, on one mesh");
  const nn::TokenStream data = tokens();
  Run run{.data = data, .model = kConfig, .svg_dir = {}};
  run.batch = args.integer("batch", 16, "B, the global batch's rows (a multiple of 8: dp 8, and dp 2 x 4 micro-batches; B·T <= 256)", 8, 32);
  run.T = args.integer("T", 16, "T, the context and the model's block_size (a multiple of 8: cp 2 zigzag x tp 2 SP)", 8, 32);
  run.steps = static_cast<int>(args.integer("steps", 2, "AdamW steps per layout", 1, 4));
  run.seed = static_cast<uint64_t>(args.integer("seed", 13, "the model's seed", 0, 1000000));
  const std::string mesh_text = args.text("mesh", "", "one more mesh for section 1 to lay out and check, e.g. pp2,cp2,tp4");
  run.column_major = args.breaks("order", "the page lays ranks out with pp varying fastest, not tp");
  run.svg_dir = args.svg();
  args.done();
  std::optional<ParallelismConfig> extra;
  try {
    extra = parse_mesh(mesh_text);
  } catch (const Error& e) {
    std::fprintf(stderr, "14_nd_parallel: %s\n", e.what());
    return 2;
  }
  // Above 256 tokens a step, this small model's stage-boundary activations (B·T·C) outweigh its
  // gradients (Ψ), and section 3's rule "pp sends less than dp" stops holding: the rules are for
  // models whose Ψ dwarfs B·T·C.
  if (run.batch % 8 != 0 || run.T % 8 != 0 || run.batch * run.T > 256) {
    std::fprintf(stderr, "14_nd_parallel: --batch and --T must be multiples of 8 with B·T <= 256 (here pp's activations\n"
                         "  would outweigh dp's gradients, and section 3's rules are for models where they do not)\n");
    return 2;
  }
  run.model.block_size = run.T;
  std::printf("lesson 14 with B = %lld, T = %lld, %d steps, seed %llu%s%s\n", (long long)run.batch, (long long)run.T,
              run.steps, static_cast<unsigned long long>(run.seed), mesh_text.empty() ? "" : (", mesh " + mesh_text).c_str(),
              run.column_major ? ", BROKEN: the page's mesh is column-major" : "");
  the_mesh(run, extra);
  const std::vector<Row> rows = tour(run);
  rules_of_thumb(rows);
  auto row = [&](const std::string& name) -> const Row& {
    return *std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.name == name; });
  };
  section("4. the Accelerate guide, section by section (FSDP and HSDP over every cut)");
  const Guide guide{run, rows[0], row("fsdp8 (ZeRO-3)"), count_parameters(run)};
  guide_hsdp(guide);
  guide_fsdp_tp(guide);
  guide_fsdp_cp(guide);
  guide_hsdp_tp(guide);
  guide_example(guide);
  lesson14_parallelize::walk_parallelize(run.model, check);
  std::printf("\nlesson 14: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
