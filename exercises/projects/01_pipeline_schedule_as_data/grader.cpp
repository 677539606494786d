// exercises/projects/01_pipeline_schedule_as_data/grader.cpp — grades my_schedule (project.cpp).
//
// For (p, m) = (2, 4), (3, 6), (4, 4), (4, 6), (4, 8):
//   * well formed: p ranks, every chunk's F and B (and W when the backward is split) of every
//     micro-batch exactly once, on the rank that holds the chunk, F before B before W;
//   * runnable: sl::parallel::validate (every send after what it sends, every receive before what
//     needs it, the k-th send between two ranks meets the k-th receive) and simulate (rendezvous
//     semantics: no deadlock);
//   * its simulated bubble (F = 1, B = 2, W = 1 of it) at most 1F1B's; printed beside 1F1B's and the
//     formulas, with the peak in-flight micro-batches per rank (reported, not graded).
// Then the real engine (run_schedule, parallel/pipeline/engine.h, which takes any Schedule) runs it at
// p = 3, m = 6 on a small GPT: loss and every gradient equal to an independent serial nn::GPT's.
// At the end, the numbers its written part asks for (ANALYSIS.md), measured on the simulator: bubble,
// span and peak in flight of GPipe, 1F1B, interleaved, ZB-H1 and yours at p 4, m 8, and the bubble
// against m at p 4 and 8. Printed, never graded.
// With -DSL_SOLUTION the baseline is the library's 1F1B (make_schedule), as data.
#include "exercises/grader.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/pipeline/engine.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/stage.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;

namespace project01 {
Schedule my_schedule(int stages, int micro_batches);
}

#ifdef SL_SOLUTION
namespace solution {
Schedule my_schedule(int stages, int micro_batches) {
  return make_schedule(ScheduleKind::one_f_one_b, stages, micro_batches);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = project01;
#endif

using Kind = Action::Kind;

static std::string config_name(int p, int m) { return "p " + std::to_string(p) + ", m " + std::to_string(m); }

// Each (kind, micro, chunk) of the compute actions exactly once, on the chunk's rank, in F, B, W order.
static void expect_well_formed(const Schedule& s, int p, int m) {
  const std::string at = config_name(p, m) + ": ";
  expect(s.stages == p && s.micro_batches == m && static_cast<int>(s.ranks.size()) == p,
         at + "the schedule says stages " + std::to_string(s.stages) + ", micro_batches " +
             std::to_string(s.micro_batches) + " with " + std::to_string(s.ranks.size()) + " rank lists");
  expect(s.virtual_stages >= 1, at + "virtual_stages must be >= 1");
  std::map<std::tuple<int, int, int>, int> seen;  // (kind, micro, chunk) -> position on its rank
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (!a.is_compute()) continue;
      expect(a.chunk >= 0 && a.chunk < s.chunks() && chunk_rank(a.chunk, p) == r && a.micro >= 0 && a.micro < m,
             at + "rank " + std::to_string(r) + " runs " + a.str() +
                 ": chunk c lives on rank c % p, micro-batches are 0..m-1");
      const auto key = std::make_tuple(static_cast<int>(a.kind), a.micro, a.chunk);
      expect(!seen.count(key), at + "rank " + std::to_string(r) + " runs " + a.str() + " twice");
      seen[key] = static_cast<int>(i);
    }
  for (int c = 0; c < s.chunks(); ++c)
    for (int mb = 0; mb < m; ++mb) {
      const Action f{Kind::forward, mb, c}, b{Kind::backward, mb, c}, w{Kind::weight, mb, c};
      auto at_of = [&](const Action& a) {
        return seen.count({static_cast<int>(a.kind), mb, c}) ? seen[{static_cast<int>(a.kind), mb, c}] : -1;
      };
      expect(at_of(f) >= 0, at + f.str() + " never runs");
      expect(at_of(b) >= 0, at + b.str() + " never runs");
      expect(at_of(f) < at_of(b), at + b.str() + " runs before " + f.str() + " on rank " + std::to_string(c % p));
      if (s.split_backward()) {
        expect(at_of(w) > at_of(b), at + w.str() + " is missing or runs before " + b.str());
      } else {
        expect(at_of(w) < 0,
               at + w.str() + " runs, but only ScheduleKind::zero_bubble splits the backward into B and W");
      }
    }
}

static std::string join(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out;
}

// Validated, simulated without deadlock, bubble at most 1F1B's; prints the measurements.
static void grade_config(int p, int m, bool draw) {
  const Schedule s = impl::my_schedule(p, m);
  expect_well_formed(s, p, m);
  validate(s);  // throws sl::Error naming the rank, the action and the rule
  const Simulation sim = simulate(s);
  expect(!sim.deadlocked, config_name(p, m) + ": the schedule deadlocks: " + sim.stuck);
  const Schedule base = make_schedule(ScheduleKind::one_f_one_b, p, m);
  const double yours = sim.timeline.bubble(), one_f_one_b = simulate(base).timeline.bubble();
  std::printf(
      "        %s: bubble %.3f (1F1B %.3f; formulas: 1F1B (p-1)/(m+p-1) = %.3f, yours as %s, v %d: %.3f); "
      "peak in flight per rank %s (1F1B %s)\n",
      config_name(p, m).c_str(), yours, one_f_one_b, bubble_formula(ScheduleKind::one_f_one_b, p, m, 1),
      schedule_name(s.kind), s.virtual_stages, bubble_formula(s.kind, p, m, s.virtual_stages),
      join(peak_in_flight(s)).c_str(), join(peak_in_flight(base)).c_str());
  if (draw) std::printf("%s", ascii_gantt(sim.timeline, 72).c_str());
  const std::vector<int> peaks = peak_in_flight(s);  // all 1: each backward returns before the next forward
  const bool one_at_a_time = p > 1 && *std::max_element(peaks.begin(), peaks.end()) == 1;
  expect(yours <= one_f_one_b + 1e-9,
         config_name(p, m) + ": the simulated bubble " + std::to_string(yours) + " is larger than 1F1B's " +
             std::to_string(one_f_one_b) +
             (one_at_a_time ? ": only one micro-batch is ever in flight (the naive schedule); let rank r run p-1-r "
                              "forwards before its first backward"
                            : ": start the first backward as early as 1F1B does"));
}

// ---- the real engine against an independent serial model ------------------------------------------
constexpr uint64_t kSeed = 7;
constexpr int64_t kBlock = 8, kRowsPerMicro = 2;

static nn::TokenStream masked_tokens() {  // micro-batches count different numbers of targets
  nn::TokenStream s;
  s.vocab_size = 32;
  for (int i = 0; i < 600; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
  for (int i = 0; i < 600; ++i) s.loss_mask.push_back((i % 7 == 3 || i % 11 == 5) ? 0 : 1);
  return s;
}

struct Step {
  double loss = 0;
  nn::StateDict grads;  // serial names
};

static Step serial_step(const nn::GPTConfig& config, const std::vector<nn::TokenStream::MicroBatch>& micros, double C) {
  nn::GPT model(config, kSeed);
  Step out;
  for (const auto& micro : micros) {
    const double weight = static_cast<double>(micro.counted) / C;
    Tensor loss = model.loss(micro.batch.inputs, micro.batch.targets);
    out.loss += loss.item() * weight;
    mul(loss, weight).backward();
  }
  for (const auto& [name, p] : model.named_parameters()) out.grads[name] = p.grad().clone();
  return out;
}

static std::vector<nn::TokenStream::MicroBatch> step_micros(int m) {
  return masked_tokens().micro_batches(0, kRowsPerMicro * m, kBlock, m);
}

static Step pipelined_step(const Schedule& s, const nn::GPTConfig& config, double C) {
  const int p = s.stages;
  std::vector<nn::StateDict> grads(p);
  std::vector<double> loss(p);
  LaunchOptions options;
  options.backend = Backend::threads;
  options.timeout = std::chrono::seconds(10);
  launch(
      p,
      [&](RankContext& ctx) {
        Stage stage = make_stage(config, kSeed, ctx.rank, p, s.virtual_stages);
        StageModule module(stage);
        const auto micros = step_micros(s.micro_batches);  // on this rank's device
        std::vector<double> weights, loss_factor;
        for (const auto& micro : micros) {
          weights.push_back(micro_batch_weight(static_cast<double>(micro.counted), C, 1));
          loss_factor.push_back(static_cast<double>(micro.counted) / C);
        }
        loss[ctx.rank] = run_schedule(s, stage, *ctx.world, micros, weights, loss_factor, {}).loss_share;
        for (const auto& [name, param] : module.named_parameters()) grads[ctx.rank][name] = param.grad().clone();
      },
      options);
  Step out;
  for (int r = 0; r < p; ++r) {
    out.loss += loss[r];
    for (const auto& [name, on_rank] : grads[r]) {  // wte: the first stage's and the head's copy add up
      const Tensor g = from_vector(on_rank.to_vector(), on_rank.shape());  // here, on cpu:0
      out.grads[name] = out.grads.count(name) ? add(out.grads[name], g) : g;
    }
  }
  return out;
}

static void expect_close(const Step& got, const Step& want) {
  expect(std::abs(got.loss - want.loss) <= 1e-5 * (1 + std::abs(want.loss)),
         "the pipeline's loss " + std::to_string(got.loss) + " differs from serial " + std::to_string(want.loss));
  for (const auto& [name, w] : want.grads) {
    expect(got.grads.count(name), name + " has no gradient from the pipeline");
    const auto g = got.grads.at(name).to_vector(), e = w.to_vector();
    for (size_t i = 0; i < e.size(); ++i)
      expect(std::abs(g[i] - e[i]) <= 4e-5 + 1e-5 * std::abs(e[i]),
             name + "[" + std::to_string(i) + "] = " + std::to_string(g[i]) + ", serial " + std::to_string(e[i]) +
                 (std::abs(g[i]) < 1e-12 ? ": no gradient arrived (a B or W that never ran?)" : ""));
  }
}

// ---- the numbers the written part asks for (ANALYSIS.md): the simulator's, printed, never graded ---
// Every number is measured on the simulated timeline (F = 1, B = 2, a split B = W = 1, communication
// free): the bubble (mean over ranks of idle / span), the span, rank 0's busy time, and the peak
// in-flight micro-batches per rank (peak_in_flight). None is a formula.
static void print_measured(const std::string& name, const Schedule& s) {
  validate(s);  // a malformed schedule is named (sl::Error) instead of measured
  const Simulation sim = simulate(s);
  if (sim.deadlocked) {
    std::printf("    %-22s stuck in the simulator: %s\n", name.c_str(), sim.stuck.c_str());
    return;
  }
  std::printf("    %-22s %d  %6.3f  %5.1f  %5.1f   %s\n", name.c_str(), s.virtual_stages, sim.timeline.bubble(),
              sim.timeline.span(), sim.timeline.busy(0), join(peak_in_flight(s)).c_str());
}

static std::string yours_name(const Schedule& s) { return std::string("yours (") + schedule_name(s.kind) + ")"; }

// Your schedule's simulated bubble at (p, m), or why there is none.
static std::string yours_bubble(int p, int m) {
  try {
    const Schedule yours = impl::my_schedule(p, m);
    validate(yours);
    const Simulation sim = simulate(yours);
    if (sim.deadlocked) return "stuck";
    char text[16];
    std::snprintf(text, sizeof text, "%.3f", sim.timeline.bubble());
    return text;
  } catch (const exercises::NotImplemented&) {
    return "(my_schedule not written yet)";
  } catch (const Error& e) {
    return std::string("(refused: ") + e.what() + ")";
  }
}

static void print_bubbles_against_m(int p) {
  std::printf("    m    gpipe   1f1b    interleaved v 2   zero-bubble   yours\n");
  for (int m : {p, 2 * p, 4 * p, 8 * p}) {
    auto bubble = [](const Schedule& s) { return simulate(s).timeline.bubble(); };
    std::printf("    %-3d  %.3f   %.3f   %.3f             %.3f         %s\n", m,
                bubble(make_schedule(ScheduleKind::gpipe, p, m)),
                bubble(make_schedule(ScheduleKind::one_f_one_b, p, m)),
                bubble(make_schedule(ScheduleKind::interleaved, p, m, 2)),
                bubble(make_schedule(ScheduleKind::zero_bubble, p, m)), yours_bubble(p, m).c_str());
  }
}

static void print_written_part_numbers(exercises::Grader& grader) {
  constexpr int p = 4, m = 8;
  grader.numbers("Q1, Q2: p 4, m 8 on the simulator (every chunk F = 1, B = 2; a split backward B = 1, W = 1)", [] {
    std::printf("    schedule               v  bubble   span  busy(rank 0)  peak in flight per rank 0..p-1\n");
    print_measured("gpipe", make_schedule(ScheduleKind::gpipe, p, m));
    print_measured("1f1b", make_schedule(ScheduleKind::one_f_one_b, p, m));
    print_measured("interleaved", make_schedule(ScheduleKind::interleaved, p, m, 2));
    print_measured("zero-bubble (ZB-H1)", make_schedule(ScheduleKind::zero_bubble, p, m));
    const Schedule yours = impl::my_schedule(p, m);
    print_measured(yours_name(yours), yours);
  });
  grader.numbers("Q3: the simulated bubble against m at p 4", [] { print_bubbles_against_m(4); });
  grader.numbers("Q4: p 8 (m = p, 2p, 4p, 8p): the same table one pipeline deeper", [] { print_bubbles_against_m(8); });
}

int main() {
  exercises::Grader grader("01_pipeline_schedule_as_data");
  const std::vector<std::pair<int, int>> configs = {{2, 4}, {3, 6}, {4, 4}, {4, 6}, {4, 8}};
  for (const auto& [p, m] : configs)
    grader.check(config_name(p, m) + ": well formed, no deadlock, bubble at most 1F1B's",
                 [p, m] { grade_config(p, m, /*draw=*/p == 4 && m == 8); });
  grader.check("the engine runs it (p 3, m 6): loss and gradients equal to a serial GPT's", [] {
    const Schedule s = impl::my_schedule(3, 6);
    // n_layer 3·v + 1: never divisible by the chunk count
    const nn::GPTConfig config{
        .vocab_size = 32, .block_size = 8, .n_layer = 3 * s.virtual_stages + 1, .n_head = 2, .n_embd = 16};
    const auto micros = step_micros(6);
    double C = 0;
    for (const auto& micro : micros) C += static_cast<double>(micro.counted);
    check(s);  // a malformed schedule is refused here rather than hanging the engine
    expect_close(pipelined_step(s, config, C), serial_step(config, micros, C));
  });
  print_written_part_numbers(grader);
  return grader.finish();
}
