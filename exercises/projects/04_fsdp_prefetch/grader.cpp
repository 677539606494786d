// exercises/projects/04_fsdp_prefetch/grader.cpp — grades forward_with_prefetch (project.cpp).
//
// A GPT of 4 blocks (C 32), every block an FSDP unit (sharded_block.h) over worlds 2 and 4, the
// embedding and head replicated, forward only (no_grad: an evaluation pass, FSDP's forward). Links
// are simulated (every rank its own node, 2 ms latency) and each block's compute costs 2 ms more
// (a sleep), so gathers and computes take comparable, visible time:
//   * the logits equal an independent serial nn::GPT's;
//   * the ledger's all-gather bytes per rank are the no-prefetch pass's: L · (N-1) · S · 4, L calls;
//   * the peak of gathered weights (MemoryLedger, category weights) is at most two units' P · 4;
//   * every unit is resharded at the end;
//   * overlap: unit i+1's gather issued before unit i's compute begins (the unit log's order).
// The two lanes (gathers in flight, computes) are drawn for your pass and the grader's no-prefetch
// pass, with their wall times. At the end, the numbers its written part asks for (ANALYSIS.md,
// printed by written_part.h): peak gathered weights, bytes and wall times with none, one (yours) and
// all units prefetched, and the time against each block's compute. Printed, never graded.
// With -DSL_SOLUTION the baseline is FSDP without prefetch: then the overlap check is reported, not
// required (README.md).
#include "exercises/grader.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/projects/04_fsdp_prefetch/sharded_block.h"
#include "exercises/projects/04_fsdp_prefetch/written_part.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/topology.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;
using project04::ShardedBlock;
using project04::UnitEvent;
using project04::UnitLog;
using project04::written::Driver;
using project04::written::Pass;

namespace project04 {
Tensor forward_with_prefetch(const std::vector<ShardedBlock*>& units, const Tensor& x);
}

// FSDP as parallel/zero/fsdp.h runs it: gather, compute, reshard, one unit after the other.
static Tensor forward_without_prefetch(const std::vector<ShardedBlock*>& units, const Tensor& x) {
  Tensor h = x;
  for (ShardedBlock* unit : units) {
    unit->finish_gather(unit->start_gather());
    h = unit->forward(h);
    unit->reshard();
  }
  return h;
}

#ifdef SL_SOLUTION
namespace solution {
Tensor forward_with_prefetch(const std::vector<ShardedBlock*>& units, const Tensor& x) {
  return forward_without_prefetch(units, x);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = project04;
#endif

constexpr uint64_t kSeed = 5;
constexpr int kLayers = 4;
static const nn::GPTConfig kConfig{.vocab_size = 32, .block_size = 8, .n_layer = kLayers, .n_head = 2, .n_embd = 32};

static Tensor ids() {  // [2, 8]
  std::vector<double> v;
  for (int i = 0; i < 16; ++i) v.push_back((i * 5 + 3) % 32);
  return from_vector(v, Shape({2, 8}), TensorOptions(DType::i64));
}

static Pass run(int n, Driver driver, double compute_seconds = 2e-3) {
  Pass pass{{}, std::vector<int64_t>(n), std::vector<int64_t>(n), std::vector<int64_t>(n), std::vector<int>(n), {}};
  LaunchOptions options;
  options.backend = Backend::threads;
  options.timeout = std::chrono::seconds(10);
  options.topology = Topology::parse_links("inter=1GB/s,2ms;gpus-per-node=1");
  launch(
      n,
      [&](RankContext& ctx) {
        NoGradGuard no_grad;
        nn::GPT model(kConfig, kSeed);
        UnitLog log;
        std::vector<std::unique_ptr<ShardedBlock>> owned;
        std::vector<ShardedBlock*> units;
        for (int l = 0; l < kLayers; ++l) {
          owned.push_back(std::make_unique<ShardedBlock>(l, model.block(l), ctx.world, log, compute_seconds));
          units.push_back(owned.back().get());
        }
        const Tensor x = model.embed(ids());
        MemoryLedger& memory = MemoryLedger::instance();
        const int64_t before = memory.current(ctx.device, MemoryCategory::weights);
        memory.reset_peak(ctx.device);
        ctx.world->barrier();
        ctx.world->ledger().reset();
        log.restart();
        const auto start = std::chrono::steady_clock::now();
        const Tensor y = driver(units, x);
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const int r = ctx.rank;
        pass.bytes[r] = ctx.world->ledger()[CommOp::all_gather].bytes_sent;
        pass.calls[r] = ctx.world->ledger()[CommOp::all_gather].calls;
        pass.peak_weights[r] = memory.peak(ctx.device, MemoryCategory::weights) - before;
        for (ShardedBlock* unit : units) pass.left_gathered[r] += unit->gathered();
        const Tensor logits = model.head(y);
        if (r == 0) {
          pass.logits = logits.to_vector();
          pass.log = log.events();
          pass.wall_s = wall;
          pass.unit_bytes = units[0]->padded_numel() * 4;
          pass.shard_bytes = pass.unit_bytes / n;
        }
      },
      options);
  return pass;
}

// Two lanes over the pass's time: a unit's digit from its gather's issue to the wait's end (a
// prefetched gather may have arrived long before it is waited for) / while its block computes.
static void draw(const Pass& pass, const char* title) {
  constexpr int kWidth = 64;
  double end = 0;
  for (const UnitEvent& e : pass.log) end = std::max(end, e.seconds);
  std::string comm(kWidth, '.'), compute(kWidth, '.');
  auto paint = [&](std::string& lane, UnitEvent::Kind from, UnitEvent::Kind to, int unit) {
    double a = -1, b = -1;
    for (const UnitEvent& e : pass.log) {
      if (e.unit == unit && e.kind == from) a = e.seconds;
      if (e.unit == unit && e.kind == to) b = e.seconds;
    }
    if (a < 0 || b < 0 || end <= 0) return;
    for (int c = static_cast<int>(a / end * (kWidth - 1)); c <= static_cast<int>(b / end * (kWidth - 1)); ++c)
      lane[c] = static_cast<char>('0' + unit);
  };
  for (int u = kLayers - 1; u >= 0; --u) {  // an earlier unit drawn over a later one's overlapping wait
    paint(comm, UnitEvent::Kind::gather_issued, UnitEvent::Kind::gather_done, u);
    paint(compute, UnitEvent::Kind::compute_begin, UnitEvent::Kind::compute_end, u);
  }
  std::printf("        %s (rank 0, %.1f ms)\n          gather  |%s|\n          compute |%s|\n", title,
              1e3 * pass.wall_s, comm.c_str(), compute.c_str());
}

static std::string rank_of(int n, int r) { return "world " + std::to_string(n) + ", rank " + std::to_string(r); }

static void grade_world(int n) {
  NoGradGuard no_grad;
  nn::GPT serial(kConfig, kSeed);
  const std::vector<double> want = serial.forward(ids()).to_vector();
  const Pass pass = run(n, impl::forward_with_prefetch), plain = run(n, forward_without_prefetch);
  draw(plain, "without prefetch");
  draw(pass, "yours");
  for (size_t i = 0; i < want.size(); ++i)
    expect(pass.logits.size() == want.size() && std::abs(pass.logits[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])),
           "world " + std::to_string(n) + ": logit " + std::to_string(i) +
               " differs from the serial GPT's: every unit "
               "once, in order, each on the previous unit's output");
  const int64_t bytes = kLayers * (n - 1) * pass.shard_bytes;
  for (int r = 0; r < n; ++r) {
    expect(pass.calls[r] == kLayers && pass.bytes[r] == bytes,
           rank_of(n, r) + ": " + std::to_string(pass.calls[r]) + " all-gathers sending " +
               std::to_string(pass.bytes[r]) + " bytes; without prefetch " + std::to_string(kLayers) + " sending " +
               std::to_string(bytes) + ": prefetching moves a gather earlier, it never adds one");
    expect(pass.peak_weights[r] <= 2 * pass.unit_bytes, rank_of(n, r) + ": " + std::to_string(pass.peak_weights[r]) +
                                                            " bytes of gathered weights at once, more than two "
                                                            "units (" +
                                                            std::to_string(2 * pass.unit_bytes) +
                                                            "): reshard each unit right after its compute, and "
                                                            "prefetch one unit ahead, not all");
    expect(pass.left_gathered[r] == 0, rank_of(n, r) + ": " + std::to_string(pass.left_gathered[r]) +
                                           " units still gathered after the pass: reshard every unit");
  }
  std::printf(
      "        all-gather bytes per rank %lld (unchanged: %lld), peak gathered weights %lld bytes (two units: %lld)\n",
      static_cast<long long>(pass.bytes[0]), static_cast<long long>(plain.bytes[0]),
      static_cast<long long>(*std::max_element(pass.peak_weights.begin(), pass.peak_weights.end())),
      static_cast<long long>(2 * pass.unit_bytes));
}

// How many i have unit i+1's gather issued before unit i's compute begins, on rank 0's log.
static int overlapped_gathers(const Pass& pass) {
  auto position = [&](UnitEvent::Kind kind, int unit) {
    for (size_t i = 0; i < pass.log.size(); ++i)
      if (pass.log[i].kind == kind && pass.log[i].unit == unit) return static_cast<int>(i);
    return -1;
  };
  int overlapped = 0;
  for (int i = 0; i + 1 < kLayers; ++i)
    overlapped += position(UnitEvent::Kind::gather_issued, i + 1) < position(UnitEvent::Kind::compute_begin, i);
  return overlapped;
}

// Unit i+1's gather issued before unit i's compute begins, on rank 0's log.
static void grade_overlap() {
  const int overlapped = overlapped_gathers(run(2, impl::forward_with_prefetch));
  std::printf("        %d of %d next-unit gathers issued before the current unit's compute\n", overlapped, kLayers - 1);
#ifdef SL_SOLUTION
  std::printf("        (SOLUTION: the baseline is FSDP without prefetch: reported, not required)\n");
#else
  expect(overlapped == kLayers - 1, "only " + std::to_string(overlapped) + " of " + std::to_string(kLayers - 1) +
                                        " gathers were issued before the previous unit's compute: start_gather(i+1) "
                                        "before forward(i)");
#endif
}

int main() {
  exercises::Grader grader("04_fsdp_prefetch");
  for (int n : {2, 4})
    grader.check(
        "world " + std::to_string(n) + ": logits = serial, bytes unchanged, at most two units gathered, all resharded",
        [n] { grade_world(n); });
  grader.check("overlap: unit i+1's all-gather issued before unit i's compute", [] { grade_overlap(); });
  project04::written::print_written_part_numbers(grader, kLayers, run, forward_without_prefetch,
                                                 impl::forward_with_prefetch, overlapped_gathers);
  return grader.finish();
}
