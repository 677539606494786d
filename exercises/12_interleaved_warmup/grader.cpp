// exercises/12_interleaved_warmup/grader.cpp — grades interleaved 1F1B read backwards (student.cpp).
//
// Every position against the place the (micro-batch, chunk) takes in the library's
// make_schedule(interleaved) lists, for p <= 6, v <= 4, m = p..3p; the peak against peak_in_flight()
// of the library's schedule for p <= 8, v <= 4, m = p..4p. With -DSL_SOLUTION the library's lists are
// read back through small adapters.
#include "exercises/grader.h"

#include <algorithm>
#include <string>
#include <vector>

#include "parallel/pipeline/simulate.h"

using namespace sl::parallel;
using exercises::expect;
using Kind = Action::Kind;

namespace exercise12 {
double predicted_rank0_peak_layers();
int forward_position(int micro, int chunk, int stages, int virtual_stages);
int backward_position(int micro, int chunk, int stages, int virtual_stages);
int peak_in_flight(int stages, int micro_batches, int virtual_stages, int rank);
}  // namespace exercise12

// Where the library's list of rank chunk mod p runs (micro, chunk) among its actions of that kind. The
// order of the first micro-batches does not depend on m, so m is taken just large enough.
static int library_position(int micro, int chunk, int p, int v, bool forward) {
  const int m = p * (micro / p + 1);
  const Schedule schedule = make_schedule(ScheduleKind::interleaved, p, m, v);
  int k = 0;
  for (const Action& a : schedule.ranks[static_cast<size_t>(chunk % p)]) {
    if (a.kind != (forward ? Kind::forward : Kind::backward)) continue;
    if (a.micro == micro && a.chunk == chunk) return k;
    ++k;
  }
  throw sl::Error("library_position: F/B of " + std::to_string(micro) + "." + std::to_string(chunk) +
                  " not in the schedule");
}

static int library_peak(int p, int m, int v, int r) {
  return sl::parallel::peak_in_flight(make_schedule(ScheduleKind::interleaved, p, m, v))[static_cast<size_t>(r)];
}

#ifdef SL_SOLUTION
namespace solution {
// Rank 0's warm-up is 2(p-r-1) + (v-1)·p = 6 + 4 = 10 forwards, all held; the first steady forward
// runs before its backward: 11 (micro-batch, chunk) pairs of one layer each. 1F1B held 8 layers.
double predicted_rank0_peak_layers() { return (2 * (4 - 0 - 1) + (2 - 1) * 4 + 1) * (8.0 / (4 * 2)); }
int forward_position(int micro, int chunk, int p, int v) { return library_position(micro, chunk, p, v, true); }
int backward_position(int micro, int chunk, int p, int v) { return library_position(micro, chunk, p, v, false); }
int peak_in_flight(int p, int m, int v, int r) { return library_peak(p, m, v, r); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise12;
#endif

static double measured_rank0_peak_layers() {
  const int p = 4, m = 8, v = 2, n_layer = 8;
  return library_peak(p, m, v, 0) * static_cast<double>(n_layer) / (p * v);  // one layer per chunk
}

// Says which part of the order a wrong position got wrong.
static void expect_position(int micro, int chunk, int p, int v, bool forward) {
  const int got = forward ? impl::forward_position(micro, chunk, p, v) : impl::backward_position(micro, chunk, p, v);
  const int want = library_position(micro, chunk, p, v, forward);
  if (got == want) return;
  const int group = micro / p, in_group = micro % p;
  auto position_with_local = [&](int local) { return group * p * v + local * p + in_group; };
  std::string why = "p " + std::to_string(p) + ", v " + std::to_string(v) + ": " + (forward ? "F" : "B") +
                    std::to_string(micro) + "." + std::to_string(chunk) + " runs on rank " + std::to_string(chunk % p) +
                    " at " + (forward ? "forward " : "backward ") + std::to_string(got) +
                    ", Megatron's order runs it at " + std::to_string(want);
  if (!forward && got == library_position(micro, chunk, p, v, true))
    why += ": backwards walk the chunks in reverse (local chunk v-1-c): the last chunk's gradient comes back first";
  else if (v > 1 && (got == position_with_local(chunk % v) || got == position_with_local(v - 1 - chunk % v)))
    why +=
        ": chunks are dealt round-robin (rank r holds r, r+p, r+2p, ...): global chunk c is local chunk c / p of rank "
        "c mod p, "
        "not c mod v";
  else if (got == micro * v + (forward ? chunk / p : v - 1 - chunk / p))
    why +=
        ": micro-batches go in groups of p (each group through one chunk before the next), not one micro-batch through "
        "every chunk";
  expect(false, why);
}

static void expect_positions(int p, int v, int m, bool forward) {
  for (int micro = 0; micro < m; ++micro)
    for (int chunk = 0; chunk < p * v; ++chunk) expect_position(micro, chunk, p, v, forward);
}

static void expect_peak(int p, int m, int v, int r) {
  const int got = impl::peak_in_flight(p, m, v, r), want = library_peak(p, m, v, r);
  if (got == want) return;
  const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, m * v);
  std::string why = "p " + std::to_string(p) + ", m " + std::to_string(m) + ", v " + std::to_string(v) + ", rank " +
                    std::to_string(r) + ": your peak is " + std::to_string(got) + ", the library's schedule holds " +
                    std::to_string(want) + " (micro-batch, chunk) pairs at once";
  if (got == std::min(2 * (p - r - 1) + 1, m * v) || got == std::min(p - r, m))
    why += ": the (v-1)·p term is missing (a whole round of the other chunks runs before the first gradient is back)";
  else if (got == warmup && warmup < m * v)
    why += ": one more than the warm-up: the first steady forward runs before its backward frees anything";
  else if (got == warmup + 1 && warmup == m * v)
    why += ": when the warm-up runs every forward (m·v) there is no steady forward to add: cap at m·v";
  expect(false, why);
}

int main() {
  exercises::Grader grader("12_interleaved_warmup");
  grader.predict(
      "interleaved 1F1B, p 4, m 8, v 2, 8 layers: the layers' activations rank 0 holds at its peak (1F1B: 8)",
      impl::predicted_rank0_peak_layers, measured_rank0_peak_layers, 0, "layers");
  grader.check("forward positions, lesson 09's p 4, v 2, m 8: every (micro-batch, chunk)",
               [] { expect_positions(4, 2, 8, true); });
  grader.check("forward positions, p 2 to 6, v 1 to 4, m = 3p: every (micro-batch, chunk)", [] {
    for (int p = 2; p <= 6; ++p)
      for (int v = 1; v <= 4; ++v) expect_positions(p, v, 3 * p, true);
  });
  grader.check("backward positions (chunks in reverse), p 2 to 6, v 1 to 4, m = 3p", [] {
    for (int p = 2; p <= 6; ++p)
      for (int v = 1; v <= 4; ++v) expect_positions(p, v, 3 * p, false);
  });
  grader.check("peak in flight, lesson 09's p 4, m 8, v 2: every rank", [] {
    for (int r = 0; r < 4; ++r) expect_peak(4, 8, 2, r);
  });
  grader.check("peak in flight, p 2 to 8, v 1 to 4, m = p to 4p (where the warm-up reaches m·v too): every rank", [] {
    for (int p = 2; p <= 8; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int m = p; m <= 4 * p; m += p)
          for (int r = 0; r < p; ++r) expect_peak(p, m, v, r);
  });
  return grader.finish();
}
