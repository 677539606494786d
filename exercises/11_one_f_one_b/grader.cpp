// exercises/11_one_f_one_b/grader.cpp — grades the 1F1B compute order (student.cpp).
//
// Against the library's make_schedule(one_f_one_b) for p <= 8 and m <= 16 (with m < p apart: the capped
// warm-up); then the student's lists are wrapped in sends and receives (with_communication) and handed
// to the pipeline simulator: validate, a rendezvous run without deadlock, the bubble (p-1)/(m+p-1) with
// unit costs, and the peak in-flight micro-batches min(p-r, m). With -DSL_SOLUTION the library's own
// schedule stands in.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/simulate.h"

using namespace sl::parallel;
using exercises::expect;
using Kind = Action::Kind;

namespace exercise11 {
std::vector<Action> one_f_one_b_order(int stages, int micro_batches, int rank);
}  // namespace exercise11

// The library's compute order of rank r: make_schedule's list without its sends and receives.
static std::vector<Action> library_order(int p, int m, int r) {
  const Schedule schedule = make_schedule(ScheduleKind::one_f_one_b, p, m);
  std::vector<Action> order;
  for (const Action& a : schedule.ranks[static_cast<size_t>(r)])
    if (a.is_compute()) order.push_back(a);
  return order;
}

#ifdef SL_SOLUTION
namespace solution {
std::vector<Action> one_f_one_b_order(int stages, int micro_batches, int rank) {
  return library_order(stages, micro_batches, rank);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise11;
#endif

static std::string spell(const std::vector<Action>& order) {  // "F0 F1 B0 F2 B1 ..."
  std::string out;
  for (const Action& a : order) out += (out.empty() ? "" : " ") + a.str().substr(0, a.str().find('.'));
  return out;
}

static int forwards_before_first_backward(const std::vector<Action>& order) {
  int count = 0;
  while (count < static_cast<int>(order.size()) && order[static_cast<size_t>(count)].kind == Kind::forward) ++count;
  return count;
}

// The micro-batches of one kind, in the order the list runs them.
static std::vector<int> micro_order(const std::vector<Action>& order, Kind kind) {
  std::vector<int> micros;
  for (const Action& a : order)
    if (a.kind == kind) micros.push_back(a.micro);
  return micros;
}

// Says in words how rank r's list differs from 1F1B's.
static std::string diagnose(int p, int m, int r, const std::vector<Action>& got, const std::vector<Action>& want) {
  const std::string who = "p " + std::to_string(p) + ", m " + std::to_string(m) + ", rank " + std::to_string(r) + ": ";
  const std::string lists = "\n        yours:  " + spell(got) + "\n        1F1B's: " + spell(want);
  for (const Action& a : got)
    if ((a.kind != Kind::forward && a.kind != Kind::backward) || a.chunk != r)
      return who + "the list holds " + a.str() + ": only F and B actions, each with chunk = rank (" + std::to_string(r) + ")" + lists;
  for (const Action& a : got)
    if (a.micro < 0 || a.micro >= m)
      return who + "the list runs " + a.str().substr(0, a.str().find('.')) + ", but the micro-batches are 0.." + std::to_string(m - 1) +
             ": with m < p-r-1 the warm-up is capped at m (min(p-r-1, m))" + lists;
  std::vector<int> forwards = micro_order(got, Kind::forward), backwards = micro_order(got, Kind::backward);
  for (int i = 0; i < m; ++i) {
    const auto f = std::count(forwards.begin(), forwards.end(), i), b = std::count(backwards.begin(), backwards.end(), i);
    if (f != 1 || b != 1)
      return who + "micro-batch " + std::to_string(i) + " runs " + std::to_string(f) + " forward(s) and " + std::to_string(b) +
             " backward(s), not one of each: every micro-batch 0..m-1 goes down and up once" + lists;
  }
  // Before the first backward: the warm-up, then (when any is left) the first steady pair's forward.
  const int before = forwards_before_first_backward(got), expected = forwards_before_first_backward(want);
  if (before != expected) {
    std::string why = "1F1B runs " + std::to_string(expected) + " (the warm-up min(p-r-1, m) = " + std::to_string(std::min(p - r - 1, m)) +
                      (expected > std::min(p - r - 1, m) ? ", then the first steady pair's forward)" : ")");
    if (before == expected + 1) why += ": one warm-up forward too many (the last stage, r = p-1, warms up with none)";
    else if (before == expected - 1) why += ": one warm-up forward too few";
    else if (before == m) why += ": all forwards first is GPipe, not 1F1B";
    return who + std::to_string(before) + " forwards run before the first backward, " + why + lists;
  }
  if (!std::is_sorted(backwards.begin(), backwards.end()))
    return who + "the backwards are not in micro-batch order 0, 1, 2, ...: 1F1B runs the oldest backward first (the gradient that came back first)" + lists;
  if (!std::is_sorted(forwards.begin(), forwards.end()))
    return who + "the forwards are not in micro-batch order 0, 1, 2, ..." + lists;
  size_t k = 0;
  while (k < got.size() && got[k] == want[k]) ++k;
  return who + "action " + std::to_string(k) + " is " + got[k].str().substr(0, got[k].str().find('.')) + ", 1F1B runs " +
         want[k].str().substr(0, want[k].str().find('.')) + " there: after the warm-up, pairs of (next forward, oldest backward)" + lists;
}

static void expect_orders_equal(int p, int m) {
  for (int r = 0; r < p; ++r) {
    const std::vector<Action> got = impl::one_f_one_b_order(p, m, r), want = library_order(p, m, r);
    if (got != want) expect(false, diagnose(p, m, r, got, want));
  }
}

// The student's lists for every rank, with the sends and receives that feed them.
static Schedule student_schedule(int p, int m) {
  std::vector<std::vector<Action>> compute;
  for (int r = 0; r < p; ++r) compute.push_back(impl::one_f_one_b_order(p, m, r));
  return with_communication(ScheduleKind::one_f_one_b, p, m, 1, compute);
}

int main() {
  exercises::Grader grader("11_one_f_one_b");
  grader.check("p 4, m 8 (lesson 09's picture): every rank's list equals make_schedule(one_f_one_b)", [] { expect_orders_equal(4, 8); });
  grader.check("p 1 to 8, m = p to 16: every rank's list equals make_schedule(one_f_one_b)", [] {
    for (int p = 1; p <= 8; ++p)
      for (int m = p; m <= 16; ++m) expect_orders_equal(p, m);
  });
  grader.check("m < p (fewer micro-batches than stages): the warm-up is capped at m", [] {
    for (int p = 2; p <= 8; ++p)
      for (int m = 1; m < p; ++m) expect_orders_equal(p, m);
  });
  grader.check("validate(): every F and B once per micro-batch, F before B, on the rank's own chunk", [] {
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 10; ++m) {
        try {
          validate(student_schedule(p, m));
        } catch (const sl::Error& e) {
          expect(false, "p " + std::to_string(p) + ", m " + std::to_string(m) + ": the validator refused your schedule: " + e.what());
        }
      }
  });
  grader.check("the rendezvous simulator runs it without deadlock; bubble = (p-1)/(m+p-1) with F = B = 1", [] {
    for (int p = 2; p <= 6; ++p)
      for (int m = 1; m <= 12; ++m) {
        const Simulation sim = simulate(student_schedule(p, m), Costs{1, 1});
        const std::string who = "p " + std::to_string(p) + ", m " + std::to_string(m) + ": ";
        expect(!sim.deadlocked, who + "the pipeline deadlocks: " + sim.stuck +
                                    " (a backward before its gradient can come back? count the warm-up again)");
        const double formula = bubble_formula(ScheduleKind::one_f_one_b, p, m, 1), bubble = sim.timeline.bubble();
        expect(std::abs(bubble - formula) < 1e-9,
               who + "the simulated bubble is " + std::to_string(bubble) + ", the formula (p-1)/(m+p-1) gives " + std::to_string(formula) +
                   ": a stage waits longer than it must (too few warm-up forwards, or a backward run too early)");
      }
  });
  grader.check("peak in-flight micro-batches on rank r = min(p-r, m) (GPipe's would be m)", [] {
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 12; ++m) {
        const std::vector<int> peaks = peak_in_flight(student_schedule(p, m));
        for (int r = 0; r < p; ++r)
          expect(peaks[static_cast<size_t>(r)] == std::min(p - r, m),
                 "p " + std::to_string(p) + ", m " + std::to_string(m) + ", rank " + std::to_string(r) + " holds " +
                     std::to_string(peaks[static_cast<size_t>(r)]) + " micro-batches at its peak, 1F1B holds min(p-r, m) = " +
                     std::to_string(std::min(p - r, m)) + ": run each backward as soon as its gradient is back, not later");
      }
  });
  return grader.finish();
}
