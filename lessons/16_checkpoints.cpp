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
#include "parallel/train/factory.h"
#include "parallel/train/trainer.h"

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
constexpr uint64_t kSeed = 3;
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
static std::vector<double> run(const TrainPlan& plan, int64_t first, int64_t steps, const std::string& resume_dir,
                               const std::string& save_dir, const std::string& tensor = "",
                               std::map<int, std::vector<Region>>* pieces_of = nullptr) {
  std::vector<double> losses(static_cast<size_t>(steps));
  std::mutex mutex;
  launch(plan.parallelism.world_size(), [&](RankContext& ctx) {
    std::unique_ptr<nn::GPT> whole;
    std::unique_ptr<Trainer> trainer;
    if (plan.cuts_model())
      trainer = std::make_unique<Trainer>(
          ctx, plan, [&](const DeviceMesh& mesh) { return make_model_runner(plan, kConfig, kSeed, {}, mesh); }, adamw());
    else
      whole = std::make_unique<nn::GPT>(kConfig, kSeed), trainer = std::make_unique<Trainer>(*whole, ctx, plan, adamw());
    std::vector<StatePiece> pieces = state_pieces(*trainer, kConfig);
    if (!resume_dir.empty()) {
      checkpoint::Reader reader(resume_dir);
      reader.load(pieces);  // each rank reads only the saved pieces that overlap its own
      restore_trainer_run_state(*trainer, reader.run_state().at("trainer"));
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
static int64_t index_in(const Region& r, const std::vector<int64_t>& g) {
  int64_t index = 0;
  for (size_t d = 0; d < g.size(); ++d) {
    if (g[d] < r.offsets[d] || g[d] >= r.offsets[d] + r.lengths[d]) return -1;
    index = index * r.lengths[d] + (g[d] - r.offsets[d]);
  }
  return index >= r.flat_begin && index < r.flat_end ? index - r.flat_begin : -1;
}

// Fills `want` (a region of the tensor of `shape`) from the saved pieces, one element at a time.
static std::vector<float> reshard_by_hand(const std::vector<int64_t>& shape, const Region& want,
                                          const std::vector<std::pair<Region, std::vector<float>>>& saved) {
  std::vector<float> out(static_cast<size_t>(want.numel()), NAN);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<int64_t> g(shape.size());
  for (int64_t flat = 0; flat < numel; ++flat) {  // every element of the tensor
    for (int64_t rest = flat, d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) g[d] = rest % shape[d], rest /= shape[d];
    const int64_t to = index_in(want, g);
    if (to < 0) continue;  // not one this rank needs
    for (const auto& [region, data] : saved)
      if (int64_t from = index_in(region, g); from >= 0) out[static_cast<size_t>(to)] = data[static_cast<size_t>(from)];
  }
  return out;
}

static void draw(const char* mesh, const std::map<int, std::vector<Region>>& pieces) {
  std::printf("  %s:\n", mesh);
  for (const auto& [rank, regions] : pieces)
    for (const Region& r : regions)
      std::printf("    rank %d  rows [%2lld, %2lld) cols [%2lld, %2lld), elements [%4lld, %4lld) of that box\n", rank,
                  (long long)r.offsets[0], (long long)(r.offsets[0] + r.lengths[0]), (long long)r.offsets[1],
                  (long long)(r.offsets[1] + r.lengths[1]), (long long)r.flat_begin, (long long)r.flat_end);
}

int main() {
  std::printf("Lesson 16: distributed checkpoints, saved under one mesh and resumed under another\n");
  const std::string dir = (std::filesystem::temp_directory_path() / "shardlab_lesson16").string();
  std::filesystem::remove_all(dir);
  const TrainPlan zero3 = plan_of({.dp_shard = 4}, DpStrategy::fsdp);
  const TrainPlan tp_pp = plan_of({.pp = 2, .tp = 2}, DpStrategy::ddp, 2);
  const std::string tensor = "h.0.mlp.c_fc.weight";  // [4C, C] = [64, 16]

  section("1. the uninterrupted serial run, 6 steps");
  const std::vector<double> serial = run(plan_of({}), 0, 6, "", "");

  section("2. ZeRO-3 over 4 ranks: 3 steps, then every rank saves its pieces; metadata.json last");
  std::map<int, std::vector<Region>> saved_pieces, wanted_pieces;
  const std::vector<double> head = run(zero3, 0, 3, "", dir, tensor, &saved_pieces);
  draw("FSDP over 4 ranks saves h.0.mlp.c_fc.weight as runs of its flat shards", saved_pieces);
  checkpoint::Reader reader(dir);
  reader.verify();
  std::printf("  %zu tensors in %zu shard files, layout '%s'\n", reader.tensor_names().size(),
              reader.metadata().files.size(), reader.layout().c_str());

  section("3. TP 2 x PP 2 resumes: each rank fills its own pieces, 3 more steps");
  const std::vector<double> tail = run(tp_pp, 3, 3, dir, "", tensor, &wanted_pieces);
  draw("TP 2 x PP 2 needs it as boxes (tp rank 0 rows [0, 32), tp rank 1 rows [32, 64))", wanted_pieces);
  std::printf("  step   serial      ZeRO-3 then TP x PP\n");
  bool continues = true;
  for (int s = 0; s < 6; ++s) {
    const double got = s < 3 ? head[s] : tail[s - 3];
    std::printf("  %4d   %.6f    %.6f%s\n", s, serial[s], got, s == 3 ? "   <- resumed" : "");
    continues = continues && std::abs(got - serial[s]) <= 4e-5 + 1e-5 * serial[s];
  }
  check(continues, "the resumed curve continues the serial run's (rtol 1e-5, atol 4e-5)");

  section("4. resharding on the page, element by element, against the library");
  // The saved pieces' data, cut from the tensor as the library reads it whole.
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
  for (const auto& [rank, regions] : wanted_pieces)
    for (const Region& want : regions) {
      std::vector<float> by_hand = reshard_by_hand(reader.shape(tensor), want, saved), library(by_hand.size());
      for (const auto& [region, data] : saved) copy_overlap(want, library.data(), region, data.data(), 4);
      same = same && std::memcmp(by_hand.data(), library.data(), 4 * by_hand.size()) == 0;
    }
  check(same, "every TP x PP rank's piece of " + tensor + ", element by element, == copy_overlap's rows");

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
  std::filesystem::remove_all(dir);
  std::printf("\nlesson 16: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
