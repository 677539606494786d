// exercises/12_interleaved_warmup/grader.cpp — grades interleaved 1F1B's warm-up and order (student.cpp).
//
// Against the library's make_schedule(interleaved) for p <= 8, v <= 4, m = p..4p: the warm-up count, the
// k-th forward and backward, the whole list. Then the student's list is wrapped in messages the way
// Megatron posts them (each step's receives one step ahead, with its sends, in one batch) and handed to
// the simulator: validate, no deadlock, the bubble (p-1)/(v·m+p-1). With -DSL_SOLUTION the library's
// schedule stands in, read back through small adapters.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/stage.h"

using namespace sl::parallel;
using exercises::expect;
using Kind = Action::Kind;

namespace exercise12 {
int interleaved_warmup(int stages, int micro_batches, int virtual_stages, int rank);
Action interleaved_kth_action(int k, int stages, int virtual_stages, int rank, bool forward);
std::vector<Action> interleaved_order(int stages, int micro_batches, int virtual_stages, int rank);
}  // namespace exercise12

// The library's compute order of rank r (make_schedule's list without its messages).
static std::vector<Action> library_order(int p, int m, int v, int r) {
  const Schedule schedule = make_schedule(ScheduleKind::interleaved, p, m, v);
  std::vector<Action> order;
  for (const Action& a : schedule.ranks[static_cast<size_t>(r)])
    if (a.is_compute()) order.push_back(a);
  return order;
}

static int forwards_before_first_backward(const std::vector<Action>& order) {
  int count = 0;
  while (count < static_cast<int>(order.size()) && order[static_cast<size_t>(count)].kind == Kind::forward) ++count;
  return count;
}

// The library's warm-up, read off its full list (messages included): a steady forward runs back to back
// with its backward, one exchange after both; a warm-up forward is followed by its own messages (the
// compute order alone cannot tell: with warm-up m·v-1, "F F F B B B" is 2 forwards and a pair).
static int library_warmup(int p, int m, int v, int r) {
  const Schedule schedule = make_schedule(ScheduleKind::interleaved, p, m, v);
  const std::vector<Action>& list = schedule.ranks[static_cast<size_t>(r)];
  int warmup = 0;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == Kind::forward && !(i + 1 < list.size() && list[i + 1].kind == Kind::backward)) ++warmup;
  return warmup;
}

// The library's k-th action of that kind, read from a schedule with enough micro-batches (the order
// of the first m·v does not depend on m).
static Action library_kth_action(int k, int p, int v, int r, bool forward) {
  const int m = p * (k / (p * v) + 1);
  int seen = 0;
  for (const Action& a : library_order(p, m, v, r))
    if (a.kind == (forward ? Kind::forward : Kind::backward) && seen++ == k) return a;
  throw sl::Error("library_kth_action: the schedule has no action " + std::to_string(k));
}

#ifdef SL_SOLUTION
namespace solution {
int interleaved_warmup(int p, int m, int v, int r) { return library_warmup(p, m, v, r); }
Action interleaved_kth_action(int k, int p, int v, int r, bool forward) { return library_kth_action(k, p, v, r, forward); }
std::vector<Action> interleaved_order(int p, int m, int v, int r) { return library_order(p, m, v, r); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise12;
#endif

static std::string config(int p, int m, int v, int r) {
  return "p " + std::to_string(p) + ", m " + std::to_string(m) + ", v " + std::to_string(v) + ", rank " + std::to_string(r);
}
static std::string spell(const std::vector<Action>& order) {  // "F0.0 F1.0 F0.2 ..."
  std::string out;
  for (const Action& a : order) out += (out.empty() ? "" : " ") + a.str();
  return out;
}

// Says which part of Megatron's rule a wrong warm-up count left out.
static std::string diagnose_warmup(int p, int m, int v, int r, int got, int want) {
  std::string why = config(p, m, v, r) + ": warm-up " + std::to_string(got) + ", Megatron's is min(2(p-r-1) + (v-1)·p, m·v) = " +
                    std::to_string(want);
  const int fill = 2 * (p - r - 1), round = (v - 1) * p, cap = m * v;
  if (got == std::min(fill, cap)) return why + ": the (v-1)·p term is missing (a whole round of the other chunks)";
  if (got == std::min(p - r - 1 + round, cap)) return why + ": 1F1B's p-r-1 is doubled here, 2(p-r-1)";
  if (got == fill + round) return why + ": cap it at m·v = " + std::to_string(cap) + ", every forward the rank has";
  if (got == std::min(fill + v * p, cap)) return why + ": the round of the other chunks is (v-1)·p, not v·p";
  return why;
}

static void expect_warmup(int p, int m, int v, int r) {
  const int got = impl::interleaved_warmup(p, m, v, r), want = library_warmup(p, m, v, r);
  if (got != want) expect(false, diagnose_warmup(p, m, v, r, got, want));
}

// Says what a wrong k-th action mixed up: local and global chunks, the backward's reversed chunks, the groups.
static void expect_kth_action(int k, int p, int v, int r, bool forward) {
  const Action got = impl::interleaved_kth_action(k, p, v, r, forward), want = library_kth_action(k, p, v, r, forward);
  if (got == want) return;
  const std::string what = std::string(forward ? "forward " : "backward ") + std::to_string(k);
  std::string why = "p " + std::to_string(p) + ", v " + std::to_string(v) + ", rank " + std::to_string(r) + ": " + what + " is " +
                    got.str() + ", Megatron's is " + want.str() + " (micro.chunk)";
  const Kind kind = forward ? Kind::forward : Kind::backward;
  const int want_local = (want.chunk - r) / p;
  if (got.kind != kind) why += ": return a " + std::string(forward ? "forward (Kind::forward)" : "backward (Kind::backward)");
  else if (got.micro == want.micro && want_local != want.chunk && (got.chunk == want_local || got.chunk == r * v + want_local))
    why += ": that is the local chunk (or r·v + c, chunks in contiguous blocks); ranks take the chunks round-robin "
           "(rank r holds r, r+p, ...): local chunk c of rank r is the global chunk c·p + r";
  else if (!forward && got.micro == want.micro && got.chunk == library_kth_action(k, p, v, r, true).chunk)
    why += ": backwards walk the chunks in reverse (local chunk v-1-c), the last chunk's gradient comes first";
  else if (got.chunk == want.chunk && got.micro == k % (p * v))
    why += ": micro-batches go in groups of p, not p·v: micro = (k / (p·v))·p + k mod p";
  else if (got.micro == want.micro && got.chunk != want.chunk)
    why += ": the local chunk is (k mod p·v) / p: p forwards per chunk before the next chunk";
  expect(false, why);
}

// Says how a wrong whole list differs: the warm-up, the forward or backward sequence, or the pairing.
static void expect_order(int p, int m, int v, int r) {
  const std::vector<Action> got = impl::interleaved_order(p, m, v, r), want = library_order(p, m, v, r);
  if (got == want) return;
  const std::string lists = "\n        yours:     " + spell(got) + "\n        Megatron's: " + spell(want);
  auto of_kind = [](const std::vector<Action>& order, Kind kind) {
    std::vector<Action> out;
    for (const Action& a : order)
      if (a.kind == kind) out.push_back(a);
    return out;
  };
  std::string why = config(p, m, v, r) + ": ";
  if (got.size() != want.size())
    why += std::to_string(got.size()) + " actions, not 2·m·v = " + std::to_string(want.size());
  else if (of_kind(got, Kind::forward) != of_kind(want, Kind::forward))
    why += "the forwards are not in Megatron's order (interleaved_kth_action with forward = true, k = 0, 1, ...)";
  else if (of_kind(got, Kind::backward) != of_kind(want, Kind::backward))
    why += "the backwards are not in Megatron's order (interleaved_kth_action with forward = false, k = 0, 1, ...)";
  else if (forwards_before_first_backward(got) != forwards_before_first_backward(want))
    why += std::to_string(forwards_before_first_backward(got)) + " forwards before the first backward, Megatron runs " +
           std::to_string(forwards_before_first_backward(want)) + " (the warm-up, then the first steady pair's forward)";
  else
    why += "the right actions, interleaved differently: after the warm-up, pairs (next forward, next backward), then the cool-down";
  expect(false, why + lists);
}

// ---- the student's lists, run by the simulator ---------------------------------------------------------
// with_communication() places each receive just before its compute, which deadlocks the interleaved
// ring under rendezvous (the last rank feeds rank 0's next chunk). Megatron instead posts the next
// step's receives together with this step's sends, as one batch; a step is one warm-up forward, one
// steady (forward, backward) pair, or one cool-down backward: the student's list cut at the student's warm-up.

static void add_sends_of(std::vector<Action>& batch, const Action& a, int p, int last) {
  if (a.kind == Kind::forward && a.chunk < last) batch.push_back({Kind::send_activation, a.micro, a.chunk, chunk_rank(a.chunk + 1, p)});
  if (a.kind == Kind::backward && a.chunk > 0) batch.push_back({Kind::send_grad, a.micro, a.chunk, chunk_rank(a.chunk - 1, p)});
}
static void add_recvs_for(std::vector<Action>& batch, const Action& a, int p, int last) {
  if (a.kind == Kind::forward && a.chunk > 0) batch.push_back({Kind::recv_activation, a.micro, a.chunk - 1, chunk_rank(a.chunk - 1, p)});
  if (a.kind == Kind::backward && a.chunk < last) batch.push_back({Kind::recv_grad, a.micro, a.chunk + 1, chunk_rank(a.chunk + 1, p)});
}

// The steps of one list: the student's warm-up forwards one by one, then (forward, backward) pairs,
// then the rest. (The list alone cannot say it: with warm-up m·v-1, "F F F B B B" is 2 F's and a pair.)
static std::vector<std::vector<Action>> steps_of(const std::vector<Action>& order, int warmup_count) {
  const size_t warmup = static_cast<size_t>(std::clamp(warmup_count, 0, static_cast<int>(order.size())));
  std::vector<std::vector<Action>> steps;
  for (size_t k = 0; k < order.size(); ++k) {
    const bool pair = k >= warmup && order[k].kind == Kind::forward && k + 1 < order.size() && order[k + 1].kind == Kind::backward;
    steps.push_back(pair ? std::vector<Action>{order[k], order[k + 1]} : std::vector<Action>{order[k]});
    if (pair) ++k;
  }
  return steps;
}

static Schedule with_megatron_messages(int p, int m, int v, const std::vector<std::vector<Action>>& compute,
                                       const std::vector<int>& warmups) {
  Schedule s{ScheduleKind::interleaved, p, m, v, std::vector<std::vector<Action>>(static_cast<size_t>(p))};
  const int last = p * v - 1;
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = s.ranks[static_cast<size_t>(r)];
    auto flush = [&list](std::vector<Action> batch) {  // activations before gradients, each in tag order: both ends alike
      std::stable_sort(batch.begin(), batch.end(), [](const Action& a, const Action& b) {
        auto key = [](const Action& x) { return std::make_pair(x.kind == Kind::send_grad || x.kind == Kind::recv_grad, x.tag()); };
        return key(a) < key(b);
      });
      list.insert(list.end(), batch.begin(), batch.end());
    };
    const std::vector<std::vector<Action>> steps = steps_of(compute[static_cast<size_t>(r)], warmups[static_cast<size_t>(r)]);
    if (steps.empty()) continue;
    std::vector<Action> first;
    add_recvs_for(first, steps[0][0], p, last);
    flush(first);
    for (size_t i = 0; i < steps.size(); ++i) {
      list.insert(list.end(), steps[i].begin(), steps[i].end());
      std::vector<Action> batch;
      for (const Action& a : steps[i]) add_sends_of(batch, a, p, last);
      if (i + 1 < steps.size())
        for (const Action& a : steps[i + 1]) add_recvs_for(batch, a, p, last);
      flush(batch);
    }
  }
  return s;
}

static void expect_simulated(int p, int m, int v) {
  std::vector<std::vector<Action>> compute;
  std::vector<int> warmups;
  for (int r = 0; r < p; ++r) {
    compute.push_back(impl::interleaved_order(p, m, v, r));
    warmups.push_back(impl::interleaved_warmup(p, m, v, r));
  }
  const Schedule schedule = with_megatron_messages(p, m, v, compute, warmups);
  const std::string who = "p " + std::to_string(p) + ", m " + std::to_string(m) + ", v " + std::to_string(v) + ": ";
  try {
    validate(schedule);
  } catch (const sl::Error& e) {
    expect(false, who + "the validator refused your lists: " + e.what());
  }
  const Simulation sim = simulate(schedule, Costs{1, 1});
  expect(!sim.deadlocked, who + "the pipeline deadlocks: " + sim.stuck +
                              " (a backward whose gradient cannot have come back yet: is the warm-up long enough?)");
  const double formula = bubble_formula(ScheduleKind::interleaved, p, m, v), bubble = sim.timeline.bubble();
  expect(std::abs(bubble - formula) < 1e-9, who + "the simulated bubble is " + std::to_string(bubble) + ", (p-1)/(v·m+p-1) = " +
                                                std::to_string(formula) + ": a rank waits more than it must (check the warm-up and the chunk order)");
}

int main() {
  exercises::Grader grader("12_interleaved_warmup");
  grader.check("warm-up, lesson 09's p 4, v 2, m 8: every rank (2(p-r-1) + (v-1)·p)", [] {
    for (int r = 0; r < 4; ++r) expect_warmup(4, 8, 2, r);
  });
  grader.check("warm-up for p 2 to 8, v 1 to 4, m = p to 4p (capped at m·v): every rank", [] {
    for (int p = 2; p <= 8; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int m = p; m <= 4 * p; m += p)
          for (int r = 0; r < p; ++r) expect_warmup(p, m, v, r);
  });
  grader.check("the k-th forward's micro-batch and global chunk, p 2 to 6, v 1 to 4, k < 3·p·v", [] {
    for (int p = 2; p <= 6; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int r = 0; r < p; ++r)
          for (int k = 0; k < 3 * p * v; ++k) expect_kth_action(k, p, v, r, true);
  });
  grader.check("the k-th backward's micro-batch and global chunk (chunks in reverse), same range", [] {
    for (int p = 2; p <= 6; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int r = 0; r < p; ++r)
          for (int k = 0; k < 3 * p * v; ++k) expect_kth_action(k, p, v, r, false);
  });
  grader.check("the whole list equals make_schedule(interleaved), p 2 to 6, v 1 to 4, m = p to 3p", [] {
    for (int p = 2; p <= 6; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int m = p; m <= 3 * p; m += p)
          for (int r = 0; r < p; ++r) expect_order(p, m, v, r);
  });
  grader.check("the simulator runs your lists: valid, no deadlock, bubble (p-1)/(v·m+p-1) with F = B = 1", [] {
    for (int p = 2; p <= 6; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int m = p; m <= 3 * p; m += p) expect_simulated(p, m, v);
  });
  return grader.finish();
}
