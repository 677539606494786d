// Lesson 13 — N-D parallelism: every cut at once, on one mesh.
//
// What you will learn
//   * the mesh: world ranks laid out row-major as [pp, dp_replicate, dp_shard, cp, tp] (TP
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
//
// Where each gradient is reduced (parallel/nd/nd_parallelizer.h):
//                        dp (DDP/ZeRO-1)   cp (sum)   tp (sum)                         pp pair {0, p-1} (sum)
//     tp-sharded weights     average          yes        —                                 —
//     replicated params      average          yes        under SP: LayerNorms, ln_f,       —
//                                                        c_proj biases (T/tp rows each)
//     wte (tied)             average          yes        —                                 yes
//
// Run:    make lesson N=13   (under a second here: 10 runs of 2 steps, up to 8 thread ranks)
// Prints: 1 the two meshes, rank by rank; 2 the table; 3 the rules, each "OK"; then "lesson 13: OK".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/train/factory.h"
#include "parallel/train/trainer.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}
static bool ok = true;
static void check(bool condition, const std::string& what) {
  std::printf("  check: %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
  ok = ok && condition;
}

// ---- 1. the mesh on the page ------------------------------------------------------------------------
// Degrees and coordinates in grid order: pp, dp_replicate, dp_shard, cp, tp (outermost first).
using Coords = std::array<int, 5>;
static Coords coords_of(int rank, const Coords& degrees) {
  Coords c{};
  for (int d = 4; d >= 0; --d) c[d] = rank % degrees[d], rank /= degrees[d];  // row-major: the last varies fastest
  return c;
}
// The groups of the set `dims`: ranks that agree on every coordinate outside it, each ascending.
static std::vector<std::vector<int>> groups_on_page(const std::vector<int>& dims, const Coords& degrees) {
  int world = 1;
  for (int d : degrees) world *= d;
  std::map<std::vector<int>, std::vector<int>> by_rest;
  for (int r = 0; r < world; ++r) {
    Coords c = coords_of(r, degrees);
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

static void draw_mesh(const ParallelismConfig& config) {
  const Coords degrees = config.degrees();
  const int world = config.world_size();
  std::printf("world %d = %s, grid [pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d]\n", world, config.str().c_str(),
              degrees[0], degrees[1], degrees[2], degrees[3], degrees[4]);
  // name -> the dimensions it spans (products too)
  const std::vector<std::pair<std::string, std::vector<int>>> names = {
      {"pp", {0}}, {"dp_replicate", {1}}, {"cp", {3}}, {"tp", {4}}, {"dp_cp", {1, 2, 3}}};
  std::map<std::string, std::vector<std::vector<int>>> library;  // from DeviceMesh, on rank 0
  std::vector<std::string> lines(world);
  launch(world, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, config);  // collective: every rank builds the same mesh
    const Coords c = mesh.coordinates();
    char head[96];
    std::snprintf(head, sizeof head, "  rank %d = (pp %d, dp %d, cp %d, tp %d):", ctx.rank, c[0], c[1], c[3], c[4]);
    std::string line = head;
    for (const char* dim : {"tp", "cp", "dp_replicate", "pp"})
      if (mesh.size(dim) > 1) {
        std::vector<int> peers = mesh.members(dim);
        peers.erase(std::find(peers.begin(), peers.end(), ctx.rank));
        line += std::string("  ") + (dim == std::string("dp_replicate") ? "dp" : dim) + " with " + braces(peers);
      }
    lines[ctx.rank] = line;
    if (ctx.rank == 0)
      for (const auto& [name, dims] : names) library[name] = mesh.partition(name);
  });
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  for (const auto& [name, dims] : names) {
    std::vector<std::vector<int>> want = groups_on_page(dims, degrees), got = library[name];
    std::sort(got.begin(), got.end());
    std::string shown;
    for (const auto& g : want) shown += " " + braces(g);
    check(got == want, name + " groups" + shown + " == DeviceMesh::partition");
  }
}

// ---- 2. the tour ------------------------------------------------------------------------------------
// B·T per rank must exceed ~3C for TP's activation all-reduces to outweigh DP's gradient one, as in
// real LLMs (B·T in the thousands, C in the thousands): 16 rows of 16 tokens, C 16.
static const nn::GPTConfig kConfig{.vocab_size = 32, .block_size = 16, .n_layer = 4, .n_head = 4, .n_embd = 16};
constexpr int64_t kBatch = 16, kT = 16;
constexpr int kSteps = 2;
constexpr uint64_t kSeed = 13;
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
  std::vector<double> losses;
  std::array<double, 5> kib{};          // per category (kCats), then the total: peak, max over ranks
  std::map<std::string, double> sent;   // KiB sent per rank and step, mean over ranks: dp, pp, cp, tp
  std::map<std::string, double> calls;  // calls per rank and step, mean over ranks
  double bubble = 0;
  // For section 4, which needs the data-parallel groups apart:
  std::map<std::string, double> group_sent;  // KiB per rank and step by the group's own name (dp_shard,
                                             // dp_shard_cp, dp_replicate, tp, cp, pp), mean over ranks
  std::array<double, 4> held{};  // KiB per category (kCats) between steps, after the last: max over ranks
  double model_state = 0;        // KiB weights + grads + optimizer between steps, max over ranks
  int dp = 1;                    // the data-parallel degree, dp_replicate x dp_shard: the batch's rows split over it
  std::map<std::string, std::vector<int>> rank0_groups;  // rank 0's group per dimension of size > 1
  bool tp_groups_share_dp_rank = true;                   // every tp group's members have one dp_rank()
};

struct RankRecord {  // what one rank counted during the steps
  std::array<int64_t, 5> peak{};
  std::array<int64_t, 4> held{};
  std::map<std::string, CommStats> traffic;  // by group name
  int dp_rank = 0;
  int tp_first = 0;  // the lowest world rank of its tp group (DeviceMesh::members("tp"))
};

static void train_rank(RankContext& ctx, const TrainPlan& plan, const nn::TokenStream& data, RankRecord& record,
                       Row& row) {
  MemoryLedger& ledger = MemoryLedger::instance();
  std::array<int64_t, 4> before_build{};
  for (int c = 0; c < 4; ++c) before_build[c] = ledger.current(ctx.device, kCats[c]);
  std::unique_ptr<nn::GPT> replica;
  std::unique_ptr<Trainer> trainer;
  if (plan.cuts_model())
    trainer = std::make_unique<Trainer>(
        ctx, plan, [&](const DeviceMesh& mesh) { return make_model_runner(plan, kConfig, kSeed, {}, mesh); }, adamw());
  else
    replica = std::make_unique<nn::GPT>(kConfig, kSeed),
    trainer = std::make_unique<Trainer>(*replica, ctx, plan, adamw());
  auto totals = [&] {  // bytes so far per group, by name
    std::map<std::string, CommStats> t;
    for (const auto& [name, group] : trainer->ledgers())
      if (name != "loss") t[name] = group->total();
    return t;
  };
  auto before = totals();         // setup's broadcast left out: the steps only
  ledger.reset_peak(ctx.device);  // and the peaks of training, not of building (FSDP's whole replica)
  for (int s = 0; s < kSteps; ++s) {
    double loss = trainer->train_step(data, s, kBatch, kT, adamw().lr, 0.0);
    if (ctx.rank == 0) row.losses[s] = loss;
  }
  for (auto& [name, s] : totals())
    record.traffic[name] = {s.calls - before[name].calls, s.bytes_sent - before[name].bytes_sent, 0};
  for (int c = 0; c < 4; ++c) record.peak[c] = ledger.peak(ctx.device, kCats[c]);
  record.peak[4] = ledger.peak(ctx.device);
  for (int c = 0; c < 4; ++c) record.held[c] = ledger.current(ctx.device, kCats[c]) - before_build[c];
  const DeviceMesh& mesh = trainer->mesh();
  record.dp_rank = mesh.dp_rank();
  record.tp_first = mesh.members("tp").front();
  if (ctx.rank != 0) return;
  row.dp = mesh.size("dp");
  for (const char* name : {"dp_replicate", "dp_shard", "cp", "tp", "pp", "dp_shard_cp"})
    if (mesh.size(name) > 1) row.rank0_groups[name] = mesh.members(name);
}

static Row measure(const Layout& l, int world, const nn::TokenStream& data) {
  Row row;
  row.name = l.name;
  row.losses.assign(kSteps, 0.0);
  const TrainPlan& plan = l.plan;
  plan.validate(world);
  if (plan.cuts_model()) check_model_runner(plan, kConfig);
  std::vector<RankRecord> records(world);
  launch(world, [&](RankContext& ctx) { train_rank(ctx, plan, data, records[ctx.rank], row); });
  for (const RankRecord& r : records) {
    double state = 0;
    for (int c = 0; c < 5; ++c) row.kib[c] = std::max(row.kib[c], r.peak[c] / 1024.0);
    for (int c = 0; c < 4; ++c) row.held[c] = std::max(row.held[c], r.held[c] / 1024.0);
    for (int c = 0; c < 3; ++c) state += r.held[c] / 1024.0;
    row.model_state = std::max(row.model_state, state);
    for (const auto& [name, s] : r.traffic) {
      const std::string merged = name.rfind("dp", 0) == 0 ? "dp" : name;  // DDP's dp, ZeRO's dp_shard, HSDP's both
      row.sent[merged] += s.bytes_sent / 1024.0 / kSteps / world;
      row.calls[merged] += static_cast<double>(s.calls) / kSteps / world;
      row.group_sent[name] += s.bytes_sent / 1024.0 / kSteps / world;
    }
  }
  for (const RankRecord& r : records)  // a tp group's ranks take the same rows of the batch
    row.tp_groups_share_dp_rank &= r.dp_rank == records[r.tp_first].dp_rank;
  const auto& par = plan.parallelism;
  if (par.pp > 1)
    row.bubble = bubble_formula(plan.schedule, par.pp, plan.micro_batches, 1);
  return row;
}

static Row serial_row(const nn::TokenStream& data) {  // an independent nn::GPT + nn::AdamW
  Row row;
  row.name = "serial";
  MemoryLedger& ledger = MemoryLedger::instance();
  const Device dev = current_device();
  {
    nn::GPT model(kConfig, kSeed);
    nn::AdamW optimizer(model.parameters(), adamw());
    ledger.reset_peak(dev);
    for (int s = 0; s < kSteps; ++s) {
      optimizer.zero_grad();
      nn::Batch batch = data.get_batch(s, kBatch, kT);
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

int main() {
  section("1. the mesh: which rank talks to which, over which dimension");
  draw_mesh({.dp_replicate = 2, .pp = 2, .tp = 2});
  draw_mesh({.pp = 2, .cp = 2, .tp = 2});
  std::printf("  tp pairs are neighbours (one node, the fastest links); pp pairs are 4 apart (across nodes)\n");

  section("2. a tour of layouts of world 8 (GPT: 4 layers, C 16, 4 heads; 16 rows x 16 tokens; 2 AdamW steps)");
  const nn::TokenStream data = tokens();
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
  std::vector<Row> rows = {serial_row(data)};
  for (const Layout& l : layouts) rows.push_back(measure(l, 8, data));
  std::printf("%-24s %8s | %-34s | %-27s |\n", "", "", "peak KiB per rank (max over ranks)",
              "KiB sent per rank and step");
  std::printf("%-24s %8s | %6s %6s %6s %6s %6s | %6s %6s %6s %6s | %6s\n", "layout", "loss 2", "weight", "grads",
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
  for (size_t i = 1; i < rows.size(); ++i) {
    bool same = true;
    for (int s = 0; s < kSteps; ++s)
      same = same && std::abs(rows[i].losses[s] - serial.losses[s]) <= 4e-5 + 1e-5 * std::abs(serial.losses[s]);
    check(same, rows[i].name + ": both steps' losses == serial (rtol 1e-5, atol 4e-5)");
  }

  section("3. rules of thumb, checked against the table");
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
  std::printf("\nlesson 13: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
