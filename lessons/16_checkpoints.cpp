// Lesson 16 — distributed checkpoints: save under one mesh, resume under another.
//
// What you will learn
//   * a checkpoint that no rank assembles: every rank writes the pieces of the serial tensors it
//     holds (a ZeRO-3 shard is a run of elements of a flat buffer; a TP slice is a box of a tensor),
//     and metadata.json, written last, says where each piece sits in its tensor
//   * resharding on the page: a rank of another mesh asks, for each element it needs, which saved
//     piece holds it; written out element by element in ~40 lines and checked against the library's
//     row-by-row copy (parallel/runner/state_pieces.h copy_overlap)
//   * the pieces of one tensor drawn for both meshes: FSDP over 4 ranks against TP 2 x PP 2
//   * one run saved under ZeRO-3 over 4 ranks after 3 steps, resumed under TP 2 x PP 2: its loss
//     curve continues the uninterrupted serial run's (Megatron's tolerance)
//   * crash safety: a checkpoint without metadata.json does not exist; newest_complete skips it
//
// Run:    make lesson N=16   (about 2 s)
// Try:    build/lessons/16_checkpoints --shards 8 --tp 4 --pp 1 --svg /tmp/svg_16   (the pieces drawn)
//         build/lessons/16_checkpoints --save-steps 5 --resume-steps 2;  --break-box-order, --break-run-state
// Prints: the two meshes' pieces of h.0.mlp.c_fc.weight, the hand-written reshard checked, the loss
//         curves side by side, the crash-safety check, then "lesson 16: OK".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/comm/launch.h"
#include "parallel/train/checkpointing.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "lesson_args.h"
#include "lesson_svg.h"

using namespace sl;
using namespace sl::parallel;

static bool ok = true;
static void check(bool condition, const std::string& what) {
  std::printf("  check: %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
  ok = ok && condition;
}
static void section(const char* title) { std::printf("\n--- %s\n", title); }

static const nn::GPTConfig kConfig{.vocab_size = 32, .block_size = 8, .n_layer = 2, .n_head = 4, .n_embd = 16};
constexpr int64_t kRows = 8;

// What a student may change: the saving mesh (ZeRO-3 over `shards` ranks), the resuming one (TP x PP),
// the steps before and after the checkpoint, the random seed, and two mistakes.
struct Config {
  int shards = 4, tp = 2, pp = 2;
  int save_steps = 3, resume_steps = 3;
  uint64_t seed = 3;
  bool column_first = false;     // the page numbers a box's elements column-first, not row-major
  bool skip_run_state = false;   // resume the tensors but not the trainer's run state (AdamW's step count)
  std::string svg_dir;
};
static nn::AdamWOptions adamw() { return {.lr = 1e-2, .eps = 1e-6, .weight_decay = 0.1}; }
static const nn::TokenStream& tokens() {
  static const nn::TokenStream s = [] {
    nn::TokenStream t;
    t.vocab_size = 32;
    for (int i = 0; i < 600; ++i) t.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
    return t;
  }();
  return s;
}

static TrainPlan plan_of(ParallelismConfig par, DpStrategy strategy = DpStrategy::ddp, int micro = 1) {
  TrainPlan p;
  p.parallelism = par;
  p.dp_strategy = strategy;
  p.micro_batches = micro;
  return p;
}

// Trains steps [first, first + steps) under `plan`; resumes from `resume_dir` first if given, saves to
// `save_dir` after if given. Returns rank 0's losses; `pieces_of` collects every rank's pieces of one tensor.
static std::vector<double> run(const Config& cfg, const TrainPlan& plan, int64_t first, int64_t steps,
                               const std::string& resume_dir,
                               const std::string& save_dir, const std::string& tensor = "",
                               std::map<int, std::vector<Region>>* pieces_of = nullptr) {
  std::vector<double> losses(static_cast<size_t>(steps));
  std::mutex mutex;
  launch(plan.parallelism.world_size(), [&](RankContext& ctx) {
    std::unique_ptr<Trainer> trainer = std::make_unique<Trainer>(
        ctx, plan, parallelize(kConfig, cfg.seed, ctx.world, plan.parallelize_options(adamw())));
    std::vector<StatePiece> pieces = state_pieces(*trainer, kConfig);
    if (!resume_dir.empty()) {
      checkpoint::Reader reader(resume_dir);
      reader.load(pieces);  // each rank reads only the saved pieces that overlap its own
      // (Broken: AdamW restarts its step count at 0, so its bias correction is that of a first step.)
      if (!cfg.skip_run_state) restore_trainer_run_state(*trainer, reader.run_state().at("trainer"));
    }
    if (pieces_of) {
      std::lock_guard lock(mutex);
      for (const StatePiece& p : pieces)
        if (p.tensor == tensor) (*pieces_of)[ctx.rank].push_back(p.region);
    }
    for (int64_t s = 0; s < steps; ++s) {
      const double loss = trainer->train_step(tokens(), first + s, kRows, 8, adamw().lr, 1.0);
      if (ctx.rank == 0) losses[static_cast<size_t>(s)] = loss;
    }
    if (!save_dir.empty()) {
      const nlohmann::json state{{"step", first + steps}, {"trainer", trainer_run_state(*trainer)}};
      checkpoint::save(save_dir, *ctx.world, state_pieces(*trainer, kConfig), state, plan.name());
    }
  });
  return losses;
}

// ---- resharding on the page: element by element --------------------------------------------------------
// A region is a box of the tensor and a range [flat_begin, flat_end) of the box's row-major elements.
// Element g (global coordinates) is in a region when it is in the box and its index in the box is in
// the range; its place in the region's data is that index minus flat_begin.
// (column_first is the mistake: the first coordinate varies fastest, so a run of a flat shard is
// read as the wrong elements.)
static int64_t index_in(const Region& r, const std::vector<int64_t>& g, bool column_first = false) {
  int64_t index = 0;
  for (size_t d = 0; d < g.size(); ++d)
    if (g[d] < r.offsets[d] || g[d] >= r.offsets[d] + r.lengths[d]) return -1;
  for (size_t k = 0; k < g.size(); ++k) {
    const size_t d = column_first ? g.size() - 1 - k : k;
    index = index * r.lengths[d] + (g[d] - r.offsets[d]);
  }
  return index >= r.flat_begin && index < r.flat_end ? index - r.flat_begin : -1;
}

// Fills `want` (a region of the tensor of `shape`) from the saved pieces, one element at a time.
static std::vector<float> reshard_by_hand(const std::vector<int64_t>& shape, const Region& want,
                                          const std::vector<std::pair<Region, std::vector<float>>>& saved,
                                          bool column_first) {
  std::vector<float> out(static_cast<size_t>(want.numel()), NAN);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<int64_t> g(shape.size());
  for (int64_t flat = 0; flat < numel; ++flat) {  // every element of the tensor
    for (int64_t rest = flat, d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) g[d] = rest % shape[d], rest /= shape[d];
    const int64_t to = index_in(want, g);
    if (to < 0) continue;  // not one this rank needs
    for (const auto& [region, data] : saved)
      if (int64_t from = index_in(region, g, column_first); from >= 0) out[static_cast<size_t>(to)] = data[static_cast<size_t>(from)];
  }
  return out;
}

// Both meshes' pieces of one [rows, cols] tensor, side by side: each run of a row a box, coloured by
// the rank that holds it (a flat shard's run may start and end mid-row).
static void picture(const Config& cfg, const std::string& tensor, const std::vector<int64_t>& shape,
                    const std::map<int, std::vector<Region>>& saved, const std::map<int, std::vector<Region>>& wanted) {
  const char* colours[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6"};
  const double cell_w = 10, cell_h = 5, panel = shape[1] * cell_w + 60;
  lesson::Canvas canvas(2 * panel + 40, shape[0] * cell_h + 70);
  canvas.text(10, 18, tensor + " [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + "]: colour = rank", 12);
  int side = 0;
  for (const auto* pieces : {&saved, &wanted}) {
    const double x0 = 20 + side * panel, y0 = 50;
    canvas.text(x0, 40, side ? "resumed: TP x PP" : "saved: ZeRO-3", 11);
    for (const auto& [rank, regions] : *pieces)
      for (const Region& r : regions)
        for (int64_t flat = r.flat_begin; flat < r.flat_end;) {  // one row of the box at a time
          const int64_t row = flat / r.lengths[1], col = flat % r.lengths[1];
          const int64_t run = std::min(r.lengths[1] - col, r.flat_end - flat);
          canvas.box(x0 + (r.offsets[1] + col) * cell_w, y0 + (r.offsets[0] + row) * cell_h, run * cell_w, cell_h,
                     colours[rank % 8]);
          flat += run;
        }
    ++side;
  }
  lesson::write_picture(cfg.svg_dir, "pieces.svg", canvas.str());
}

static void draw(const char* mesh, const std::map<int, std::vector<Region>>& pieces) {
  std::printf("  %s:\n", mesh);
  for (const auto& [rank, regions] : pieces)
    for (const Region& r : regions)
      std::printf("    rank %d  rows [%2lld, %2lld) cols [%2lld, %2lld), elements [%4lld, %4lld) of that box\n", rank,
                  (long long)r.offsets[0], (long long)(r.offsets[0] + r.lengths[0]), (long long)r.offsets[1],
                  (long long)(r.offsets[1] + r.lengths[1]), (long long)r.flat_begin, (long long)r.flat_end);
}

// Section 4: the saved pieces' data, cut from the tensor as the library reads it whole, resharded into
// every wanted piece by hand and by copy_overlap.
static void reshard_on_the_page(const Config& cfg, const checkpoint::Reader& reader, const std::string& tensor,
                                const std::map<int, std::vector<Region>>& saved_pieces,
                                const std::map<int, std::vector<Region>>& wanted_pieces) {
  section("4. resharding on the page, element by element, against the library");
  std::vector<std::pair<Region, std::vector<float>>> saved;
  const Tensor full = reader.read_tensor(tensor);
  for (const auto& [rank, regions] : saved_pieces)
    for (const Region& r : regions) {
      std::vector<float> data(static_cast<size_t>(r.numel()));
      Region all{{0, 0}, reader.shape(tensor), 0, full.numel()};
      copy_overlap(r, data.data(), all, full.data<float>(), 4);
      saved.push_back({r, data});
    }
  bool same = true;
  int64_t wrong = 0;
  for (const auto& [rank, regions] : wanted_pieces)
    for (const Region& want : regions) {
      std::vector<float> by_hand = reshard_by_hand(reader.shape(tensor), want, saved, cfg.column_first),
                         library(by_hand.size());
      for (const auto& [region, data] : saved) copy_overlap(want, library.data(), region, data.data(), 4);
      same = same && std::memcmp(by_hand.data(), library.data(), 4 * by_hand.size()) == 0;
      for (size_t i = 0; i < by_hand.size(); ++i) wrong += !(by_hand[i] == library[i]);
    }
  if (cfg.column_first) std::printf("  --break-box-order: %lld elements differ from the library's\n", (long long)wrong);
  check(same, "every TP x PP rank's piece of " + tensor + ", element by element, == copy_overlap's rows");
}

static void crash_safety(const std::string& dir) {
  section("5. crash safety: without metadata.json there is no checkpoint");
  const std::string root = dir + "_root";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  std::filesystem::copy(dir, root + "/step-00000003");
  std::filesystem::copy(dir, root + "/step-00000004");
  std::filesystem::remove(root + "/step-00000004/metadata.json");  // killed before its metadata was renamed
  const auto newest = checkpoint::newest_complete(root);
  check(newest && newest->find("step-00000003") != std::string::npos,
        "newest_complete skips step 4 (shards, no metadata) and returns step 3");
  std::filesystem::remove_all(root);
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "16_checkpoints", "distributed checkpoints: save under one mesh, resume under another");
  Config cfg;
  cfg.shards = static_cast<int>(args.integer("shards", 4, "ZeRO-3 ranks that save (rows 8: 2, 4 or 8)", 2, 8));
  cfg.tp = static_cast<int>(args.integer("tp", 2, "tp of the resuming mesh (divides the 4 heads: 1, 2 or 4)", 1, 4));
  cfg.pp = static_cast<int>(args.integer("pp", 2, "pp of the resuming mesh (divides the 2 layers: 1 or 2)", 1, 2));
  cfg.save_steps = static_cast<int>(args.integer("save-steps", 3, "steps before the checkpoint", 1, 10));
  cfg.resume_steps = static_cast<int>(args.integer("resume-steps", 3, "steps after it, under the other mesh", 1, 10));
  cfg.seed = static_cast<uint64_t>(args.integer("seed", 3, "the model's seed", 0, 1000000));
  cfg.column_first = args.breaks("box-order", "the page's reshard numbers a box's elements column-first, not row-major");
  cfg.skip_run_state = args.breaks("run-state", "resume the tensors but not the run state: AdamW's step count restarts at 0");
  cfg.svg_dir = args.svg();
  args.done();
  if (8 % cfg.shards != 0 || cfg.tp == 3 || cfg.tp * cfg.pp < 2) {
    std::fprintf(stderr, "16_checkpoints: need --shards 2, 4 or 8, --tp 1, 2 or 4, and tp·pp >= 2\n");
    return 2;
  }
  const int total = cfg.save_steps + cfg.resume_steps;
  std::printf("Lesson 16: distributed checkpoints, saved under one mesh and resumed under another\n");
  std::printf("with ZeRO-3 over %d, then TP %d x PP %d; %d + %d steps, seed %llu%s%s\n", cfg.shards, cfg.tp, cfg.pp,
              cfg.save_steps, cfg.resume_steps, static_cast<unsigned long long>(cfg.seed),
              cfg.column_first ? ", BROKEN: column-first boxes" : "", cfg.skip_run_state ? ", BROKEN: no run state" : "");
  const std::string dir = (std::filesystem::temp_directory_path() / "shardlab_lesson16").string();
  std::filesystem::remove_all(dir);
  const TrainPlan zero3 = plan_of({.dp_shard = cfg.shards}, DpStrategy::fsdp);
  const TrainPlan tp_pp = plan_of({.pp = cfg.pp, .tp = cfg.tp}, DpStrategy::ddp, cfg.pp);
  const std::string tensor = "h.0.mlp.c_fc.weight";  // [4C, C] = [64, 16]

  std::printf("\n--- 1. the uninterrupted serial run, %d steps\n", total);
  const std::vector<double> serial = run(cfg, plan_of({}), 0, total, "", "");

  std::printf("\n--- 2. ZeRO-3 over %d ranks: %d steps, then every rank saves its pieces; metadata.json last\n", cfg.shards,
              cfg.save_steps);
  std::map<int, std::vector<Region>> saved_pieces, wanted_pieces;
  const std::vector<double> head = run(cfg, zero3, 0, cfg.save_steps, "", dir, tensor, &saved_pieces);
  draw(("FSDP over " + std::to_string(cfg.shards) + " ranks saves h.0.mlp.c_fc.weight as runs of its flat shards").c_str(),
       saved_pieces);
  checkpoint::Reader reader(dir);
  reader.verify();
  std::printf("  %zu tensors in %zu shard files, layout '%s'\n", reader.tensor_names().size(),
              reader.metadata().files.size(), reader.layout().c_str());

  std::printf("\n--- 3. TP %d x PP %d resumes: each rank fills its own pieces, %d more steps\n", cfg.tp, cfg.pp,
              cfg.resume_steps);
  const std::vector<double> tail = run(cfg, tp_pp, cfg.save_steps, cfg.resume_steps, dir, "", tensor, &wanted_pieces);
  const std::string rows = cfg.tp == 1 ? "one box, rows [0, 64)" : "boxes of " + std::to_string(64 / cfg.tp) + " rows per tp rank";
  draw(("TP " + std::to_string(cfg.tp) + " x PP " + std::to_string(cfg.pp) + " needs it as " + rows).c_str(), wanted_pieces);
  if (!cfg.svg_dir.empty()) picture(cfg, tensor, reader.shape(tensor), saved_pieces, wanted_pieces);
  std::printf("  step   serial      ZeRO-3 then TP x PP\n");
  bool continues = true;
  double worst = 0;
  for (int s = 0; s < total; ++s) {
    const double got = s < cfg.save_steps ? head[s] : tail[s - cfg.save_steps];
    std::printf("  %4d   %.6f    %.6f%s\n", s, serial[s], got, s == cfg.save_steps ? "   <- resumed" : "");
    continues = continues && std::abs(got - serial[s]) <= 4e-5 + 1e-5 * serial[s];
    worst = std::max(worst, std::abs(got - serial[s]));
  }
  if (cfg.skip_run_state)
    std::printf("  --break-run-state: AdamW resumed at step 0, its first update as large as a first step's: the\n"
                "  curve leaves the serial one by up to %.2e (the first resumed loss is still equal: the weights are)\n",
                worst);
  check(continues, "the resumed curve continues the serial run's (rtol 1e-5, atol 4e-5)");
  reshard_on_the_page(cfg, reader, tensor, saved_pieces, wanted_pieces);
  crash_safety(dir);
  std::filesystem::remove_all(dir);
  std::printf("\nlesson 16: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
