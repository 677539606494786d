// Lesson 09 — 1F1B and interleaved 1F1B: the same bubble with less memory, then a smaller bubble.
//
// What you will learn
//   * 1F1B: rank r runs min(p-r-1, m) warm-up forwards, then alternates one forward and one backward,
//     then drains the backwards. Its bubble is GPipe's, (p-1)/(m+p-1), but it frees a micro-batch's
//     activations as soon as the pipe allows: rank r holds min(p-r, m) micro-batches instead of m
//   * interleaved 1F1B (Megatron): each rank holds v chunks (r, r+p, …); the bubble shrinks to
//     (p-1)/(v·m+p-1) for v times the messages
//   * the schedules are data: the orders written again on the page (below) equal the library's
//     lists, the rendezvous simulator times them (F = 1, B = 2), and the engine runs them; the
//     drawn timelines are measured runs with a fixed cost per layer
//   * zero-bubble (ZB-H1, splitting B into input and weight gradients) is lesson 10
//
// Run:    make lesson N=09   (about two seconds)
// Prints: 1 the orders by hand == library; 2 ideal timelines and bubbles; 3 memory per rank;
//         4 measured timelines, bubbles and messages; 5 every schedule == GPipe bit for bit;
//         then "lesson 09: OK".
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/pipeline/simulate.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;
using i64 = long long;

static const nn::GPTConfig kConfig{32, 8, 8, 2, 16, 0.0};  // 8 layers: 4 stages x 2 chunks of 1
constexpr uint64_t kSeed = 4;
constexpr int kP = 4, kM = 8;
constexpr double kSleep = 1e-3;  // synthetic cost per layer per row

static void section(const char* title) { std::printf("\n== %s\n", title); }

// ---- the orders on the page ---------------------------------------------------------------------------
// 1F1B on rank r of p with m micro-batches: "F0 F1 B0 F2 B1 …" (micro-batch ids).
static std::vector<std::string> one_f_one_b(int p, int r, int m) {
  std::vector<std::string> order;
  const int warmup = std::min(p - r - 1, m);
  // Warmup: fill the pipe down to the last stage.
  for (int i = 0; i < warmup; ++i) order.push_back("F" + std::to_string(i));
  // Steady state: one forward, then the oldest backward (whose gradient has just come back).
  for (int i = 0; i < m - warmup; ++i) {
    order.push_back("F" + std::to_string(warmup + i));
    order.push_back("B" + std::to_string(i));
  }
  // Cooldown: the backwards still owed.
  for (int i = m - warmup; i < m; ++i) order.push_back("B" + std::to_string(i));
  return order;
}

// Interleaved: the k-th forward of rank r runs, in groups of p micro-batches, chunk (k mod p·v)/p of
// micro-batch (k / p·v)·p + k mod p; backwards the same, chunks in reverse. Warm-up 2(p-r-1)+(v-1)p.
static std::vector<std::string> interleaved(int p, int r, int m, int v) {
  auto name = [&](int k, bool forward) {
    const int local = (k % (p * v)) / p, micro = (k / (p * v)) * p + k % p;
    const int chunk = (forward ? local : v - 1 - local) * p + r;
    return (forward ? "F" : "B") + std::to_string(micro) + "." + std::to_string(chunk);
  };
  std::vector<std::string> order;
  const int total = m * v, warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) order.push_back(name(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(name(warmup + k, true));
    order.push_back(name(k, false));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(name(k, false));
  return order;
}

static std::vector<std::string> library_order(const Schedule& s, int r) {
  std::vector<std::string> out;
  for (const Action& a : s.ranks[r])
    if (a.is_compute())
      out.push_back((a.kind == Action::Kind::forward ? "F" : "B") + std::to_string(a.micro) +
                    (s.virtual_stages > 1 ? "." + std::to_string(a.chunk) : ""));
  return out;
}

struct Measured {
  Timeline timeline;
  std::vector<int> in_flight = std::vector<int>(kP);
  std::vector<i64> peak = std::vector<i64>(kP);
  i64 sends = 0;                       // p2p sends of the step, all ranks
  std::vector<nn::StateDict> grads = std::vector<nn::StateDict>(1);
};

static Measured run(ScheduleKind kind, int v, double sleep) {
  nn::TokenStream data;
  data.vocab_size = 32;
  for (int i = 0; i < 2000; ++i) data.tokens.push_back((i * 5 + i / 3 + (i * i) % 7) % 32);
  Measured out;
  std::vector<i64> sends(kP);
  launch(kP, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.pp = kP});
    PipelineOptions options;
    options.schedule = kind;
    options.virtual_stages = v;
    options.engine.sleep_per_layer_row_seconds = sleep;
    PipelineRunner runner(kConfig, kSeed, mesh, options);
    auto micros = data.micro_batches(0, 2 * kM, 8, kM);
    double count = 0;
    for (const auto& mb : micros) count += static_cast<double>(mb.counted);
    MemoryLedger& ledger = MemoryLedger::instance();
    const i64 before = ledger.current(ctx.device, MemoryCategory::activations);
    ledger.reset_peak(ctx.device);
    const i64 sent_before = runner.pp_group()->ledger()[CommOp::send].calls;
    runner.forward_backward(micros, count, 1, {});
    out.peak[ctx.rank] = ledger.peak(ctx.device, MemoryCategory::activations) - before;
    sends[ctx.rank] = runner.pp_group()->ledger()[CommOp::send].calls - sent_before;
    out.in_flight[ctx.rank] = runner.peak_in_flight();
    Timeline t = runner.gather_timeline();
    runner.finish_gradients();
    nn::StateDict g = runner.full_gradients();
    if (ctx.rank == 0) {
      out.timeline = t;
      out.grads[0] = g;
    }
  });
  for (i64 s : sends) out.sends += s;
  return out;
}

int main() {
  bool ok = true;
  auto check = [&](bool condition, const std::string& what) {
    std::printf("  check: %-72s %s\n", what.c_str(), condition ? "ok" : "FAILED");
    ok = ok && condition;
  };

  section("1. The orders, written again above, against the library's lists");
  {
    bool same_1f1b = true, same_interleaved = true;
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 12; ++m)
        for (int r = 0; r < p; ++r)
          same_1f1b = same_1f1b && one_f_one_b(p, r, m) == library_order(make_schedule(ScheduleKind::one_f_one_b, p, m), r);
    for (int p : {2, 3, 4})
      for (int v : {2, 3})
        for (int m : {p, 2 * p, 3 * p})
          for (int r = 0; r < p; ++r)
            same_interleaved = same_interleaved &&
                               interleaved(p, r, m, v) == library_order(make_schedule(ScheduleKind::interleaved, p, m, v), r);
    std::printf("%s", make_schedule(ScheduleKind::one_f_one_b, kP, kM).str().c_str());
    check(same_1f1b, "1F1B by hand == make_schedule, p <= 6, m <= 12, every rank");
    check(same_interleaved, "interleaved by hand == make_schedule, p 2-4, v 2-3, m = p, 2p, 3p");
  }

  section("2. Ideal timelines (simulated: F = 1, B = 2, free messages), p = 4, m = 8");
  bool exact = true;
  for (auto [kind, v] : {std::pair{ScheduleKind::gpipe, 1}, {ScheduleKind::one_f_one_b, 1}, {ScheduleKind::interleaved, 2}}) {
    const Schedule s = make_schedule(kind, kP, kM, v);
    check_schedule_config(kind, kP, kM, v);
    const Simulation sim = simulate(s, Costs{1.0 / v, 2.0 / v});  // a chunk is 1/v of a stage
    const double formula = bubble_formula(kind, kP, kM, v);
    std::printf("  %s%s: bubble %.4f, formula %.4f\n%s", schedule_name(kind), v > 1 ? " v=2" : "", sim.timeline.bubble(),
                formula, ascii_gantt(sim.timeline, 66).c_str());
    exact = exact && !sim.deadlocked && std::abs(sim.timeline.bubble() - formula) < 1e-12;
  }
  check(exact, "simulated bubble == (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1)");

  section("3. Memory: what each rank holds at its peak (measured, p = 4, m = 8)");
  const Measured gpipe = run(ScheduleKind::gpipe, 1, 0), ofob = run(ScheduleKind::one_f_one_b, 1, 0);
  bool counts = true, smaller = true;
  std::printf("  %-5s %-26s %-26s %s\n", "rank", "GPipe: in flight / bytes", "1F1B: in flight / bytes", "min(p-r, m)");
  for (int r = 0; r < kP; ++r) {
    std::printf("  %-5d %2d / %-21lld %2d / %-21lld %d\n", r, gpipe.in_flight[r], gpipe.peak[r], ofob.in_flight[r],
                ofob.peak[r], std::min(kP - r, kM));
    counts = counts && gpipe.in_flight[r] == kM && ofob.in_flight[r] == std::min(kP - r, kM);
    smaller = smaller && ofob.peak[r] < gpipe.peak[r];
  }
  std::printf("  The same bubble, but the first stage holds p micro-batches, the last one only one.\n");
  check(counts, "in flight: GPipe m on every rank, 1F1B min(p-r, m)");
  check(smaller, "1F1B's activation peak < GPipe's on every rank (ledger)");

  section("4. Measured runs (fixed cost per layer): bubble against the formula, and the messages");
  bool overlapped = true, messages = true;
  for (auto [kind, v] : {std::pair{ScheduleKind::one_f_one_b, 1}, {ScheduleKind::interleaved, 2}}) {
    const Measured m = run(kind, v, kSleep);
    const double formula = bubble_formula(kind, kP, kM, v);
    const i64 expected_sends = 2LL * kM * (kP * v - 1);  // an activation and a gradient per chunk boundary
    std::printf("  %s%s: step %.0f ms, bubble %.3f (formula %.3f), %lld sends (2·m·(p·v-1) = %lld)\n%s",
                schedule_name(kind), v > 1 ? " v=2" : "", 1e3 * m.timeline.span(), m.timeline.bubble(), formula, m.sends,
                expected_sends, ascii_gantt(m.timeline, 66).c_str());
    overlapped = overlapped && m.timeline.bubble() < bubble_formula(ScheduleKind::naive, kP, kM, 1);
    messages = messages && m.sends == expected_sends;
  }
  std::printf("  Interleaving trades messages ((p·v-1)/(p-1) times as many) for a bubble about v times smaller.\n");
  // Not held to the formula: every message costs a thread wake-up, which the formula (free messages)
  // leaves out, and on a loaded 2-core machine a wake-up can wait milliseconds for a core. A chunk's
  // forward lasts 2 ms here, so the measured bubble has come out from 0.02 to 0.2 above the formula,
  // interleaved (twice the messages) the most. Section 2 checks the schedules' bubbles exactly
  // (simulated); the measured ones are checked only to overlap the stages, which holds under load.
  std::printf(
      "  (measured on a shared machine: each message waits for its thread to be scheduled, which the formula\n"
      "   leaves out, so the measured bubbles lie above it, by more the busier the machine; section 2 checks\n"
      "   the formulas exactly, here the check is only that the stages overlap)\n");
  check(overlapped, "measured bubble < the naive schedule's (p-1)/p: the stages overlap");
  check(messages, "sends per step = 2·m·(p·v - 1)");

  section("5. Only the order changes: every schedule's gradients equal GPipe's, bit for bit");
  bool bitwise = !gpipe.grads[0].empty();  // no gradients to compare must fail, not pass
  for (auto [kind, v] : {std::pair{ScheduleKind::one_f_one_b, 1}, {ScheduleKind::interleaved, 2}, {ScheduleKind::naive, 1}}) {
    const Measured m = run(kind, v, 0);
    for (const auto& [name, g] : gpipe.grads[0]) bitwise = bitwise && m.grads[0].at(name).values<float>() == g.values<float>();
  }
  check(bitwise, "naive, 1F1B and interleaved gradients == GPipe's, every parameter");

  std::printf("\nlesson 09: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
