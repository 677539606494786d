// exercises/11_one_f_one_b/grader.cpp — grades the student's pipeline timer (student.cpp).
//
// The lists come from the library (make_schedule: naive, GPipe, 1F1B) and from lesson 09's broken
// warm-up; every start tick is compared with the library's rendezvous simulator (simulate(), the lists
// wrapped in their sends and receives by with_communication), the bubble with Timeline::bubble(), the
// peak with peak_in_flight(). A circular wait must be refused. With -DSL_SOLUTION the library's
// simulator stands in.
#include "exercises/grader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/pipeline/simulate.h"

using namespace sl::parallel;
using exercises::expect;
using Kind = Action::Kind;
using Orders = std::vector<std::vector<Action>>;
using Ticks = std::vector<std::vector<double>>;

namespace exercise11 {
double predicted_first_backward_tick();
Ticks start_ticks(const Orders& orders, double forward_cost, double backward_cost);
double bubble(const Orders& orders, const Ticks& starts, double forward_cost, double backward_cost);
int peak_in_flight(const std::vector<Action>& order);
}  // namespace exercise11

// The library's run of the lists: sends and receives added, then the rendezvous simulator.
static Simulation library_run(const Orders& orders, double f, double b) {
  const int p = static_cast<int>(orders.size());
  int m = 0;
  for (const Action& a : orders[0]) m = std::max(m, a.micro + 1);
  return simulate(with_communication(ScheduleKind::one_f_one_b, p, m, 1, orders), Costs{f, b});
}

// The start ticks of the compute events of a timeline, rank by rank.
static Ticks compute_starts(const Timeline& timeline) {
  Ticks starts(timeline.ranks.size());
  for (size_t r = 0; r < timeline.ranks.size(); ++r)
    for (const TimelineEvent& e : timeline.ranks[r])
      if (e.kind != TimelineEvent::Kind::comm) starts[r].push_back(e.start);
  return starts;
}

#ifdef SL_SOLUTION
namespace solution {
// F0 goes down all p stages (p·F), then its gradient comes back up through ranks 3, 2 and 1 (p-1
// backwards) before rank 0 can run B0: one round trip, not the warm-up's p forwards.
double predicted_first_backward_tick() { return 4 * 1.0 + (4 - 1) * 2.0; }
Ticks start_ticks(const Orders& orders, double f, double b) {
  const Simulation sim = library_run(orders, f, b);
  if (sim.deadlocked) throw sl::Error("the lists never finish: " + sim.stuck);
  return compute_starts(sim.timeline);
}
double bubble(const Orders& orders, const Ticks& starts, double f, double b) {
  Timeline timeline;
  for (size_t r = 0; r < orders.size(); ++r) {
    timeline.ranks.emplace_back();
    for (size_t k = 0; k < orders[r].size(); ++k) {
      const Action& a = orders[r][k];
      const bool forward = a.kind == Kind::forward;
      timeline.ranks[r].push_back({forward ? TimelineEvent::Kind::forward : TimelineEvent::Kind::backward, a.micro,
                                   a.chunk, starts[r][k], starts[r][k] + (forward ? f : b)});
    }
  }
  return timeline.bubble();
}
int peak_in_flight(const std::vector<Action>& order) {
  return sl::parallel::peak_in_flight(Schedule{ScheduleKind::one_f_one_b, 1, 1, 1, {order}})[0];
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise11;
#endif

static Orders compute_orders(const Schedule& schedule) {
  Orders orders(schedule.ranks.size());
  for (size_t r = 0; r < schedule.ranks.size(); ++r)
    for (const Action& a : schedule.ranks[r])
      if (a.is_compute()) orders[r].push_back(a);
  return orders;
}
static Orders library_orders(ScheduleKind kind, int p, int m) { return compute_orders(make_schedule(kind, p, m)); }

// Lesson 09's --break-warmup: every rank warms up with p-1 forwards, as if it were rank 0. Valid and
// deadlock-free, but not a schedule the library makes: a timer that recognises 1F1B cannot pass it.
static Orders broken_warmup_orders(int p, int m) {
  Orders orders(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - 1, m);
    for (int i = 0; i < warmup; ++i) orders[r].push_back({Kind::forward, i, r});
    for (int i = 0; i < m - warmup; ++i)
      orders[r].insert(orders[r].end(), {{Kind::forward, warmup + i, r}, {Kind::backward, i, r}});
    for (int i = m - warmup; i < m; ++i) orders[r].push_back({Kind::backward, i, r});
  }
  return orders;
}

static std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}
static std::string costs(double f, double b) { return "F = " + number(f) + ", B = " + number(b); }

// Compares every start tick with the simulator's; the wrong tick the library's run reaches first is the
// one reported, with the wait it most likely got wrong.
static void expect_ticks(const std::string& what, const Orders& orders, double f, double b) {
  const Ticks want = compute_starts(library_run(orders, f, b).timeline), got = impl::start_ticks(orders, f, b);
  const int p = static_cast<int>(orders.size());
  const std::string who = what + " (p " + std::to_string(p) + ", " + costs(f, b) + "): ";
  expect(static_cast<int>(got.size()) == p,
         who + std::to_string(got.size()) + " lists of ticks for " + std::to_string(p) + " ranks");
  int worst_r = -1, worst_k = -1;
  for (int r = 0; r < p; ++r) {
    expect(got[r].size() == orders[r].size(), who + "rank " + std::to_string(r) + " has " +
                                                  std::to_string(orders[r].size()) + " actions but " +
                                                  std::to_string(got[r].size()) + " start ticks");
    for (size_t k = 0; k < got[r].size(); ++k)
      if (std::abs(got[r][k] - want[r][k]) > 1e-9 && (worst_r < 0 || want[r][k] < want[worst_r][worst_k]))
        worst_r = r, worst_k = static_cast<int>(k);
  }
  if (worst_r < 0) return;
  const Action& a = orders[worst_r][worst_k];
  const std::string name = (a.kind == Kind::forward ? "F" : "B") + std::to_string(a.micro);
  std::string why = who + "rank " + std::to_string(worst_r) + "'s " + name + " starts at tick " +
                    number(got[worst_r][worst_k]) + ", the simulator starts it at " + number(want[worst_r][worst_k]);
  if (a.kind == Kind::forward)
    why += worst_r > 0 ? ": F(i) on rank r starts only after F(i) on rank r-1 has ended, it needs that activation (and "
                         "after rank r's previous action)"
                       : ": rank 0's forwards wait only for the rank's own previous action";
  else
    why +=
        ": B(i) on rank r waits for B(i) on rank r+1 to end, the gradient comes back from the next stage (r+1); the "
        "last "
        "rank's B(i) waits only for its own previous action";
  expect(false, why);
}

static double library_first_backward_tick() {
  const Simulation sim = simulate(make_schedule(ScheduleKind::one_f_one_b, 4, 8), Costs{1, 2});
  for (const TimelineEvent& e : sim.timeline.ranks[0])
    if (e.kind == TimelineEvent::Kind::backward) return e.start;
  throw sl::Error("rank 0 ran no backward");
}

static void expect_bubble(ScheduleKind kind, int p, int m, double f, double b) {
  const Orders orders = library_orders(kind, p, m);
  const Simulation sim = library_run(orders, f, b);
  const double got = impl::bubble(orders, compute_starts(sim.timeline), f, b), want = sim.timeline.bubble();
  expect(std::abs(got - want) < 1e-9, std::string(schedule_name(kind)) + " p " + std::to_string(p) + ", m " +
                                          std::to_string(m) + ", " + costs(f, b) + ": your bubble is " + number(got) +
                                          ", the timeline's is " + number(want) +
                                          " ((p-1)/(m+p-1) = " + number(bubble_formula(kind, p, m, 1)) +
                                          "): each rank's idle time counts up to the end of the whole step (the latest "
                                          "end over every rank), not its own last action");
}

int main() {
  exercises::Grader grader("11_one_f_one_b");
  grader.predict("1F1B at p 4, m 8, F = 1, B = 2: the tick rank 0 starts its first backward B0",
                 impl::predicted_first_backward_tick, library_first_backward_tick, 0, "ticks");
  grader.check("lesson 09's 1F1B, p 4, m 8, F = 1, B = 2: every start tick equals the library's simulator",
               [] { expect_ticks("1f1b, m 8", library_orders(ScheduleKind::one_f_one_b, 4, 8), 1, 2); });
  grader.check("naive, GPipe and 1F1B for p 1 to 6, m 1 to 10, with (F, B) = (1, 2), (1, 1), (2, 1): every start tick",
               [] {
                 for (ScheduleKind kind : {ScheduleKind::naive, ScheduleKind::gpipe, ScheduleKind::one_f_one_b})
                   for (int p = 1; p <= 6; ++p)
                     for (int m = 1; m <= 10; ++m)
                       for (auto [f, b] : {std::pair{1.0, 2.0}, {1.0, 1.0}, {2.0, 1.0}})
                         expect_ticks(std::string(schedule_name(kind)) + ", m " + std::to_string(m),
                                      library_orders(kind, p, m), f, b);
               });
  grader.check("lists the library does not make (lesson 09's broken warm-up: p-1 forwards on every rank)", [] {
    for (int p = 2; p <= 6; ++p)
      for (int m = 1; m <= 10; ++m)
        expect_ticks("p-1 warm-up forwards, m " + std::to_string(m), broken_warmup_orders(p, m), 1, 2);
  });
  grader.check("lists that wait in a circle are refused with sl::Error (rank 0 runs B0 before F0)", [] {
    const Orders circle{{{Kind::backward, 0, 0}, {Kind::forward, 0, 0}},
                        {{Kind::forward, 0, 1}, {Kind::backward, 0, 1}}};
    bool refused = false;
    try {
      impl::start_ticks(circle, 1, 2);
    } catch (const sl::Error&) {
      refused = true;
    }
    expect(
        refused,
        "rank 0's B0 waits for rank 1's B0, which waits for rank 1's F0, which waits for rank 0's F0, which waits for "
        "rank 0's B0: these lists never finish; throw sl::Error when no rank can move and some have actions left");
  });
  grader.check(
      "the bubble equals the timeline's, (p-1)/(m+p-1) for GPipe and 1F1B, any F and B; and the naive schedule's", [] {
        for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe, ScheduleKind::naive})
          for (int p = 2; p <= 6; ++p)
            for (int m = 1; m <= 10; ++m)
              for (auto [f, b] : {std::pair{1.0, 2.0}, {2.0, 1.0}}) expect_bubble(kind, p, m, f, b);
      });
  grader.check(
      "peak in flight on every rank equals peak_in_flight: 1F1B's min(p-r, m), GPipe's m, the broken warm-up's", [] {
        for (int p = 1; p <= 6; ++p)
          for (int m = 1; m <= 10; ++m)
            for (const Orders& orders :
                 {library_orders(ScheduleKind::one_f_one_b, p, m), library_orders(ScheduleKind::gpipe, p, m),
                  broken_warmup_orders(std::max(p, 2), m)})
              for (size_t r = 0; r < orders.size(); ++r) {
                const int got = impl::peak_in_flight(orders[r]);
                const int want =
                    sl::parallel::peak_in_flight(Schedule{ScheduleKind::one_f_one_b, 1, 1, 1, {orders[r]}})[0];
                expect(got == want, "p " + std::to_string(orders.size()) + ", m " + std::to_string(m) + ", rank " +
                                        std::to_string(r) + ": your peak is " + std::to_string(got) +
                                        ", the list holds at most " + std::to_string(want) +
                                        " micro-batches between their F and B (count the peak right after each F)");
              }
      });
  return grader.finish();
}
