// test_pipeline_schedule.cpp — the pipeline's data, without running a model: the layer split,
// the schedules' shapes (warm-up counts, backward order, activations in flight), the validator and
// the rendezvous simulator (a sweep over p ≤ 8, m ≤ 32, v ≤ 4 and a deliberately deadlocking list),
// the simulated bubble against the formulas, and the timeline writers.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/stage.h"
#include "parallel/pipeline/timeline.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

using Kind = Action::Kind;

std::vector<int64_t> counts(const std::vector<nn::GPTShardSpec>& specs) {
  std::vector<int64_t> out;
  for (const auto& s : specs) out.push_back(s.layer_end - s.layer_begin);
  return out;
}

TEST(PipelineSplit, BalancedByCountFirstStagesTakeTheRemainder) {
  EXPECT_EQ(counts(split_layers(7, 3)), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(counts(split_layers(8, 4)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(counts(split_layers(5, 4)), (std::vector<int64_t>{2, 1, 1, 1}));
  const auto specs = split_layers(7, 3);
  EXPECT_EQ(specs[1].layer_begin, 3);
  EXPECT_EQ(specs[2].layer_end, 7);
  EXPECT_EQ(counts(split_layers(6, 3, {1, 4, 1})), (std::vector<int64_t>{1, 4, 1}));
}

TEST(PipelineSplit, RefusesImpossibleSplitsNamingTheValues) {
  expect_error([] { split_layers(3, 4); }, "4 chunks (stages x virtual stages) need at least one layer each, but n_layer is 3");
  expect_error([] { split_layers(6, 3, {2, 2}); }, "--stage-layers gives 2 counts for 3 chunks");
  expect_error([] { split_layers(6, 3, {2, 2, 3}); }, "adds up to 7 layers, but n_layer is 6");
  expect_error([] { split_layers(6, 3, {3, 3, 0}); }, "chunk 2 would hold 0 layers");
}

TEST(PipelineSplit, InterleavedRanksHoldEveryPthChunk) {
  const nn::GPTConfig config{32, 8, 4, 2, 16, 0.0};
  Stage stage = make_stage(config, 1, 0, 2, 2);
  ASSERT_EQ(stage.specs.size(), 2u);
  EXPECT_EQ(stage.specs[0].layer_begin, 0);  // chunk 0: h.0
  EXPECT_EQ(stage.specs[1].layer_begin, 2);  // chunk 2: h.2
  StageModule module(stage);
  std::vector<std::string> names;
  for (const auto& [name, p] : module.named_parameters()) names.push_back(name);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "h.2.mlp.c_fc.weight"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "h.1.mlp.c_fc.weight"), names.end());
  Stage last = make_stage(config, 1, 1, 2, 2);
  StageModule last_module(last);
  EXPECT_EQ(last_module.placement("wte.weight"), nn::Placement::tied("wte"));
  EXPECT_TRUE(last_module.state_dict().count("ln_f.weight"));
}

std::vector<Action> compute_of(const Schedule& s, int rank) {
  std::vector<Action> out;
  for (const Action& a : s.ranks[rank])
    if (a.is_compute()) out.push_back(a);
  return out;
}

int forwards_before_first_backward(const Schedule& s, int rank) {
  int n = 0;
  for (const Action& a : compute_of(s, rank)) {
    if (a.kind == Kind::backward) break;
    ++n;
  }
  return n;
}

TEST(PipelineSchedule, OneFOneBWarmsUpWithMinPMinusRMinus1Forwards) {
  for (int p : {2, 4, 5})
    for (int m : {1, 3, 8}) {
      const Schedule s = make_schedule(ScheduleKind::one_f_one_b, p, m);
      for (int r = 0; r < p; ++r) {
        // min(p-r-1, m) warm-up forwards, then the first steady forward comes before the first backward.
        EXPECT_EQ(forwards_before_first_backward(s, r), std::min(p - r - 1, m) + (p - r - 1 < m ? 1 : 0))
            << "p " << p << " m " << m << " rank " << r;
        int next = 0;
        for (const Action& a : compute_of(s, r))
          if (a.kind == Kind::backward) {
            EXPECT_EQ(a.micro, next++) << "backwards run in micro-batch order";
          }
      }
    }
}

TEST(PipelineSchedule, GPipeRunsEveryForwardFirst) {
  const Schedule s = make_schedule(ScheduleKind::gpipe, 3, 5);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(forwards_before_first_backward(s, r), 5);
  EXPECT_EQ(s.str().substr(0, 38), "rank 0: F0 F1 F2 F3 F4 B0 B1 B2 B3 B4\n");
}

TEST(PipelineSchedule, InterleavedWarmUpIsMegatrons) {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        const Schedule s = make_schedule(ScheduleKind::interleaved, p, m, v);
        for (int r = 0; r < p; ++r) {
          const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, m * v);
          EXPECT_EQ(forwards_before_first_backward(s, r), warmup + (warmup < m * v ? 1 : 0))
              << "p " << p << " v " << v << " m " << m << " rank " << r;
          // Per chunk, backwards in micro-batch order (the serial accumulation order).
          std::map<int, int> next;
          for (const Action& a : compute_of(s, r))
            if (a.kind == Kind::backward) {
              EXPECT_EQ(a.micro, next[a.chunk]++);
            }
        }
      }
}

TEST(PipelineSchedule, ActivationsInFlight) {
  const int p = 4, m = 8;
  const auto gpipe = peak_in_flight(make_schedule(ScheduleKind::gpipe, p, m));
  const auto one_f_one_b = peak_in_flight(make_schedule(ScheduleKind::one_f_one_b, p, m));
  const auto naive = peak_in_flight(make_schedule(ScheduleKind::naive, p, m));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gpipe[r], m);
    EXPECT_EQ(one_f_one_b[r], std::min(p - r, m));
    EXPECT_EQ(naive[r], 1);
  }
  EXPECT_EQ(peak_in_flight(make_schedule(ScheduleKind::one_f_one_b, 4, 2))[0], 2);  // m < p: all of them
}

TEST(PipelineSchedule, RefusesInvalidCombinationsNamingTheValues) {
  expect_error([] { make_schedule(ScheduleKind::interleaved, 4, 6, 2); },
               "micro-batches (6) to be a multiple of stages (4)");
  expect_error([] { make_schedule(ScheduleKind::one_f_one_b, 4, 6, 2); }, "--virtual-stages 2 needs --schedule interleaved");
  expect_error([] { make_schedule(ScheduleKind::interleaved, 1, 4, 2); }, "at least 2 stages (got 1)");
  expect_error([] { make_schedule(ScheduleKind::gpipe, 2, 0, 1); }, "micro-batches (0)");
  expect_error([] { parse_schedule("zb-h2"); }, "unknown schedule 'zb-h2' (naive, gpipe, 1f1b, interleaved or zero-bubble)");
}

// Every valid combination is well formed and finishes under rendezvous semantics; every invalid one
// is refused.
TEST(PipelineSimulate, SweepEveryValidScheduleIsDeadlockFree) {
  int valid = 0, refused = 0;
  for (auto kind : {ScheduleKind::naive, ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                    ScheduleKind::zero_bubble})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 32; ++m)
        for (int v = 1; v <= 4; ++v) {
          bool ok = true;
          try {
            check_schedule_config(kind, p, m, v);
          } catch (const Error&) {
            ok = false;
          }
          if (!ok) {
            EXPECT_THROW(make_schedule(kind, p, m, v), Error);
            ++refused;
            continue;
          }
          ++valid;
          const Schedule s = make_schedule(kind, p, m, v);
          EXPECT_NO_THROW(check(s)) << schedule_name(kind) << " p " << p << " m " << m << " v " << v;
        }
  EXPECT_EQ(valid + refused, 5 * 8 * 32 * 4);
  EXPECT_GT(valid, 900);
  EXPECT_GT(refused, 900);
}

// Rank 0 runs one micro-batch at a time (F0 B0 F1 B1) while rank 1 wants both forwards first (F0 F1
// B0 B1): the tags match pair by pair, so it is well formed, but rank 0 waits for gradient 0 before
// sending activation 1, and rank 1 waits for activation 1 before sending gradient 0.
TEST(PipelineSimulate, FindsADeadlockBeforeAnythingRuns) {
  const std::vector<std::vector<Action>> compute = {
      {{Kind::forward, 0, 0}, {Kind::backward, 0, 0}, {Kind::forward, 1, 0}, {Kind::backward, 1, 0}},
      {{Kind::forward, 0, 1}, {Kind::forward, 1, 1}, {Kind::backward, 0, 1}, {Kind::backward, 1, 1}}};
  const Schedule s = with_communication(ScheduleKind::gpipe, 2, 2, 1, compute);
  EXPECT_NO_THROW(validate(s));
  const Simulation sim = simulate(s);
  EXPECT_TRUE(sim.deadlocked);
  EXPECT_NE(sim.stuck.find("rank 0 waits in {send act 0.0 -> 1, recv grad 0.1 <- 1}"), std::string::npos) << sim.stuck;
  EXPECT_NE(sim.stuck.find("rank 1 waits in {recv act 1.0 <- 0}"), std::string::npos) << sim.stuck;
  expect_error([&] { check(s); }, "deadlocks: rank 0 waits in");
}

// Interleaved's order with each send right after its compute and each receive right before its
// consumer (what with_communication does) is well formed, yet under rendezvous it deadlocks: rank 0
// sends a gradient that rank 1 takes only after an activation rank 0 sends later. With buffered
// sends it would run; on NCCL it hangs. Megatron's exchange (every send and receive between two
// steps in one batch, receives posted a step ahead) is what make_schedule builds instead.
TEST(PipelineSimulate, InterleavedNeedsItsExchangesBatched) {
  const Schedule megatron = make_schedule(ScheduleKind::interleaved, 2, 4, 2);
  std::vector<std::vector<Action>> compute = {compute_of(megatron, 0), compute_of(megatron, 1)};
  const Schedule naive_exchanges = with_communication(ScheduleKind::interleaved, 2, 4, 2, compute);
  EXPECT_NO_THROW(validate(naive_exchanges));
  const Simulation sim = simulate(naive_exchanges);
  EXPECT_TRUE(sim.deadlocked);
  EXPECT_NE(sim.stuck.find("rank 0 waits in {send grad 0.2 -> 1}"), std::string::npos) << sim.stuck;
  EXPECT_NO_THROW(check(megatron));
}

TEST(PipelineValidate, CatchesMalformedLists) {
  // Backwards in reverse on rank 0 but in order on rank 1: the k-th send meets another tag.
  Schedule reversed = with_communication(
      ScheduleKind::gpipe, 2, 2, 1,
      {{{Kind::forward, 0, 0}, {Kind::forward, 1, 0}, {Kind::backward, 1, 0}, {Kind::backward, 0, 0}},
       {{Kind::forward, 0, 1}, {Kind::forward, 1, 1}, {Kind::backward, 0, 1}, {Kind::backward, 1, 1}}});
  expect_error([&] { validate(reversed); }, "message 0 from rank 1 to rank 0 is sent as 'send grad 0.1 -> 0' but received as 'recv grad 1.1 <- 1'");
  Schedule backward_first = make_schedule(ScheduleKind::gpipe, 2, 1);
  std::swap(backward_first.ranks[1][1], backward_first.ranks[1][2]);  // B0 before F0 on rank 1
  expect_error([&] { validate(backward_first); }, "rank 1 runs B0.1 before its forward F0.1");
  Schedule missing = make_schedule(ScheduleKind::gpipe, 2, 2);
  missing.ranks[0].pop_back();  // rank 0's last backward: its gradient's receive now feeds nothing
  expect_error([&] { validate(missing); }, "rank 0 recv grad 1.1 <- 1 comes after the compute that needs it");
  missing.ranks[0].pop_back();  // and that receive
  expect_error([&] { validate(missing); }, "rank 0 never runs F or B of micro-batch 1 on chunk 0");
}

// Zero-bubble's own rules: W after its B, exactly once, and only where the backward is split.
TEST(PipelineValidate, ZeroBubbleWeightGradientRules) {
  const Schedule zb = make_schedule(ScheduleKind::zero_bubble, 2, 2);
  EXPECT_NO_THROW(validate(zb));
  Schedule w_first = zb;  // rank 1 (last): F0 B0 F1 B1 W0 W1 — move W0 before B0
  auto& list = w_first.ranks[1];
  auto w0 = std::find(list.begin(), list.end(), Action{Kind::weight, 0, 1, -1});
  auto b0 = std::find(list.begin(), list.end(), Action{Kind::backward, 0, 1, -1});
  ASSERT_TRUE(w0 != list.end() && b0 != list.end());
  const Action w = *w0;
  list.erase(w0);
  list.insert(b0, w);
  expect_error([&] { validate(w_first); }, "rank 1 runs W0.1 before its input-gradient backward B0.1");
  Schedule dropped = zb;
  dropped.ranks[0].erase(std::find(dropped.ranks[0].begin(), dropped.ranks[0].end(), Action{Kind::weight, 1, 0, -1}));
  expect_error([&] { validate(dropped); }, "rank 0 never runs W of micro-batch 1 on chunk 0: its weight gradient would be lost");
  Schedule foreign = make_schedule(ScheduleKind::one_f_one_b, 2, 1);
  foreign.ranks[0].push_back({Kind::weight, 0, 0, -1});
  expect_error([&] { validate(foreign); }, "1f1b does not split the backward");
}

// ZB-H1: 1F1B's warm-up and F,B order; rank r lets r W's wait and runs the rest after each B.
TEST(PipelineSchedule, ZeroBubbleIsOneFOneBWithWeightsHeldBackRPerRank) {
  EXPECT_EQ(make_schedule(ScheduleKind::zero_bubble, 4, 4).str(),
            "rank 0: F0 F1 F2 F3 B0 W0 B1 W1 B2 W2 B3 W3\n"
            "rank 1: F0 F1 F2 B0 F3 B1 W0 B2 W1 B3 W2 W3\n"
            "rank 2: F0 F1 B0 F2 B1 F3 B2 W0 B3 W1 W2 W3\n"
            "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3\n");
  for (int p : {2, 4, 5})
    for (int m : {1, 3, 8}) {
      const Schedule zb = make_schedule(ScheduleKind::zero_bubble, p, m);
      const Schedule one = make_schedule(ScheduleKind::one_f_one_b, p, m);
      for (int r = 0; r < p; ++r) {
        std::vector<Action> fb;  // zero-bubble's F and B: 1F1B's order
        int waiting = 0, most_waiting = 0, next_w = 0;
        for (const Action& a : compute_of(zb, r)) {
          if (a.kind != Kind::weight) fb.push_back(a);
          waiting += a.kind == Kind::backward ? 1 : a.kind == Kind::weight ? -1 : 0;
          most_waiting = std::max(most_waiting, waiting);
          if (a.kind == Kind::weight) {
            EXPECT_EQ(a.micro, next_w++) << "W's run in micro-batch order";
          }
        }
        EXPECT_EQ(fb, compute_of(one, r)) << "p " << p << " m " << m << " rank " << r;
        EXPECT_EQ(most_waiting, std::min(r + 1, m)) << "p " << p << " m " << m << " rank " << r;
      }
      // The micro-batches held (F done, W not yet) never exceed what 1F1B's rank 0 holds.
      const auto held = peak_in_flight(zb), held_1f1b = peak_in_flight(one);
      EXPECT_LE(*std::max_element(held.begin(), held.end()), *std::max_element(held_1f1b.begin(), held_1f1b.end()));
    }
  expect_error([] { make_schedule(ScheduleKind::zero_bubble, 4, 8, 2); }, "--virtual-stages 2 needs --schedule interleaved");
  EXPECT_EQ(parse_schedule("zero-bubble"), ScheduleKind::zero_bubble);
}

// With F = 1 and B = 2 and free communication the simulated bubble is the formula exactly for
// GPipe and 1F1B; interleaved follows (p-1)/(v·m+p-1) when its chunks cost 1/v of a stage.
TEST(PipelineSimulate, BubbleMatchesTheFormula) {
  for (int p : {2, 4})
    for (int m : {p, 2 * p, 4 * p}) {
      for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
        const Simulation sim = simulate(make_schedule(kind, p, m));
        EXPECT_NEAR(sim.timeline.bubble(), static_cast<double>(p - 1) / (m + p - 1), 1e-12)
            << schedule_name(kind) << " p " << p << " m " << m;
      }
      const int v = 2;
      const Simulation sim = simulate(make_schedule(ScheduleKind::interleaved, p, m, v), Costs{1.0 / v, 2.0 / v});
      EXPECT_NEAR(sim.timeline.bubble(), static_cast<double>(p - 1) / (v * m + p - 1), 1e-12) << "interleaved p " << p << " m " << m;
    }
  const Simulation naive = simulate(make_schedule(ScheduleKind::naive, 4, 3));
  EXPECT_NEAR(naive.timeline.bubble(), 3.0 / 4, 1e-12);
}

// ZB-H1 with F = B = W = 1 (the default costs split a backward of 2 into B 1 + W 1): each rank idles
// p-1 units of 3m + p-1, a third of 1F1B's p-1 units of F+B+W; exact for m >= p.
TEST(PipelineSimulate, ZeroBubbleBubbleIsAThirdOfOneFOneBs) {
  for (int p : {2, 3, 4, 8})
    for (int m : {p, p + 1, 2 * p, 4 * p}) {
      const Simulation sim = simulate(make_schedule(ScheduleKind::zero_bubble, p, m));
      ASSERT_FALSE(sim.deadlocked) << sim.stuck;
      const double expected = static_cast<double>(p - 1) / (3 * m + p - 1);
      EXPECT_NEAR(sim.timeline.bubble(), expected, 1e-12) << "p " << p << " m " << m;
      EXPECT_EQ(bubble_formula(ScheduleKind::zero_bubble, p, m, 1), expected);
      EXPECT_NEAR(sim.timeline.span(), 3 * m + p - 1, 1e-12);
      const Simulation one = simulate(make_schedule(ScheduleKind::one_f_one_b, p, m));
      EXPECT_NEAR(one.timeline.span() - 3 * m, 3 * (p - 1), 1e-12) << "1F1B idles three times as long";
    }
}

TEST(PipelineTimeline, WritersDrawEveryEvent) {
  const Simulation sim = simulate(make_schedule(ScheduleKind::one_f_one_b, 3, 4));
  const std::string gantt = ascii_gantt(sim.timeline, 54);
  EXPECT_NE(gantt.find("rank 2 |"), std::string::npos) << gantt;
  EXPECT_NE(gantt.find('a'), std::string::npos);
  size_t compute = 0, events = 0;
  for (const auto& rank : sim.timeline.ranks)
    for (const auto& e : rank) {
      ++events;
      compute += e.kind != TimelineEvent::Kind::comm;
    }
  EXPECT_EQ(compute, 3u * 4 * 2);
  const std::string picture = svg(sim.timeline);
  size_t rects = 0;
  for (size_t at = picture.find("<rect"); at != std::string::npos; at = picture.find("<rect", at + 1)) ++rects;
  EXPECT_EQ(rects, events);
  const auto json = nlohmann::json::parse(chrome_trace_json(sim.timeline));
  size_t complete = 0;
  for (const auto& e : json["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, events);
  expect_error([&] { write_trace(sim.timeline, "/tmp/trace.txt"); }, "must end in .svg or .json");
}

TEST(PipelineTimeline, WritersDrawZeroBubblesWeightGradients) {
  const Simulation sim = simulate(make_schedule(ScheduleKind::zero_bubble, 3, 4));
  size_t weights = 0;
  for (const auto& rank : sim.timeline.ranks)
    for (const auto& e : rank) weights += e.kind == TimelineEvent::Kind::weight;
  EXPECT_EQ(weights, 3u * 4);
  const std::string gantt = ascii_gantt(sim.timeline, 48);
  EXPECT_NE(gantt.find("A-J W (weight gradient)"), std::string::npos) << gantt;
  EXPECT_NE(gantt.find('D'), std::string::npos) << gantt;  // W of micro-batch 3
  EXPECT_NE(svg(sim.timeline).find(">W3<"), std::string::npos);
  const auto json = nlohmann::json::parse(chrome_trace_json(sim.timeline));
  size_t named_w = 0;
  for (const auto& e : json["traceEvents"]) named_w += e["name"] == "W2";
  EXPECT_EQ(named_w, 3u);
}

}  // namespace
}  // namespace sl::parallel
