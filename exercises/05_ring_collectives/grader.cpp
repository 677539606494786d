// exercises/05_ring_collectives/grader.cpp — grades the ring reduce-scatter and all-gather (student.cpp).
//
// At worlds 2 to 5 (thread ranks, parallel/comm/launch.h): the input left as given (the reference is
// computed from a copy taken before the student's call), exact values on integers against the library's
// own reduce_scatter / all_gather, close values on randn, and the bytes each rank sent, from its group's
// ledger, against the ring's (n-1)/n · S. With -DSL_SOLUTION the library's collectives stand in.
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"
#include "parallel/comm/launch.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;

namespace exercise05 {
double predicted_reduce_scatter_bytes();
void ring_reduce_scatter(ProcessGroup& group, const Tensor& output, const Tensor& input);
void ring_all_gather(ProcessGroup& group, const Tensor& output, const Tensor& input);
}  // namespace exercise05

#ifdef SL_SOLUTION
namespace solution {
void ring_reduce_scatter(ProcessGroup& group, const Tensor& output, const Tensor& input) {
  group.reduce_scatter(output, input);
}
void ring_all_gather(ProcessGroup& group, const Tensor& output, const Tensor& input) { group.all_gather(output, input); }
// n - 1 = 7 steps, one chunk of S/n = 600 bytes each: (n-1)/n · S, nearly the whole input at any n.
double predicted_reduce_scatter_bytes() { return (8.0 - 1) / 8 * 4 * 1200; }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise05;
#endif

constexpr int64_t kChunk = 6;  // elements per chunk: S = n · 6 · 4 bytes

// What each rank ended with, and what it sent.
struct Outcome {
  std::vector<std::vector<double>> got, want;  // per rank
  std::vector<int64_t> bytes_sent;             // per rank, every op of the world group
  std::vector<int64_t> library_calls;          // per rank: calls of the group's own collectives
  std::vector<char> input_changed;             // per rank: the student's call wrote into its input
};

// Rank r's input: integers that say where they came from (exact in f32 in any order), or randn.
static Tensor input_of(int rank, int64_t numel, bool integers) {
  if (!integers) {
    manual_seed(100 + rank);
    return randn({numel});
  }
  std::vector<double> values;
  for (int64_t i = 0; i < numel; ++i) values.push_back((rank + 1) * 1000 + i);
  return from_vector(values, Shape({numel}));
}

// Runs the student's collective (reduce_scatter or all_gather) and the library's at world n.
static Outcome run(int n, bool reduce_scatter, bool integers) {
  Outcome out{std::vector<std::vector<double>>(n), std::vector<std::vector<double>>(n), std::vector<int64_t>(n),
              std::vector<int64_t>(n), std::vector<char>(n)};
  exercises::run_ranks(n, [&](RankContext& ctx) {
    const int r = ctx.rank;
    const Tensor input = input_of(r, reduce_scatter ? n * kChunk : kChunk, integers), original = input.clone();
    const Tensor output = zeros({reduce_scatter ? kChunk : n * kChunk});
    const Tensor reference = zeros(output.shape());
    ctx.world->ledger().reset();
    if (reduce_scatter)
      impl::ring_reduce_scatter(*ctx.world, output, input);
    else
      impl::ring_all_gather(*ctx.world, output, input);
    const CommLedger& ledger = ctx.world->ledger();
    out.bytes_sent[r] = ledger.total().bytes_sent;
    out.library_calls[r] = ledger[CommOp::reduce_scatter].calls + ledger[CommOp::all_gather].calls +
                           ledger[CommOp::all_reduce].calls + ledger[CommOp::broadcast].calls;
    out.input_changed[r] = input.to_vector() != original.to_vector();
    if (reduce_scatter)  // the reference from the input as it was given
      ctx.world->reduce_scatter(reference, original);
    else
      ctx.world->all_gather(reference, original);
    out.got[r] = output.to_vector();
    out.want[r] = reference.to_vector();
  }, "a rank waited 4 s for a message that never came (a deadlock?): every rank must "
      "isend before it recv's, and the tags of a step must match. ");
  return out;
}

// The sum over ranks of chunk j of the integer inputs (what rank j should hold after reduce-scatter).
static std::vector<double> chunk_sum(int n, int j) {
  std::vector<double> sum(kChunk, 0.0);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < kChunk; ++i) sum[i] += (r + 1) * 1000 + j * kChunk + i;
  return sum;
}

// Says in words what a wrong reduce-scatter result on rank r looks like.
static std::string diagnose_reduce_scatter(int n, int r, const std::vector<double>& got) {
  const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r);
  std::vector<double> average = chunk_sum(n, r), own(kChunk);
  for (double& v : average) v /= n;
  if (all_close(got, average, 1e-6, 1e-6))
    return who + " holds the average of its chunk: this reduce-scatter sums (ReduceOp::sum)";
  for (int j = 0; j < n; ++j)
    if (j != r && all_close(got, chunk_sum(n, j), 0, 0))
      return who + " holds the finished sum of chunk " + std::to_string(j) + " instead of chunk " + std::to_string(r) +
             ": shift your ring indices (off by " + std::to_string((j - r + n) % n) + ")";
  for (int64_t i = 0; i < kChunk; ++i) own[i] = (r + 1) * 1000 + r * kChunk + i;
  if (all_close(got, own, 0, 0))
    return who + " holds only its own data of chunk " + std::to_string(r) + ": nothing was added";
  for (int m = 1; m < n; ++m) {  // a sum of fewer ranks' data: too few steps?
    std::vector<double> partial(kChunk, 0.0);
    for (int k = 0; k < m; ++k)
      for (int64_t i = 0; i < kChunk; ++i) partial[i] += (((r - k) % n + n) % n + 1) * 1000 + r * kChunk + i;
    if (all_close(got, partial, 0, 0))
      return who + " holds the sum of " + std::to_string(m) + " ranks' data, not " + std::to_string(n) +
             ": the ring needs n-1 steps, each adding one more rank";
  }
  return who + " holds a wrong chunk: first value " + std::to_string(got.empty() ? 0.0 : got[0]) + ", expected " +
         std::to_string(chunk_sum(n, r)[0]);
}

static std::string diagnose_all_gather(int n, int r, const std::vector<double>& got) {
  const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r);
  for (int j = 0; j < n; ++j) {
    std::vector<double> slot(got.begin() + j * kChunk, got.begin() + (j + 1) * kChunk);
    if (all_close(slot, std::vector<double>(kChunk, 0.0), 0, 0))
      return who + ": slot " + std::to_string(j) + " is still zero: it never arrived (n-1 steps, each passing one slot on)";
    const int from = static_cast<int>(slot[0]) / 1000 - 1;
    if (from != j)
      return who + ": slot " + std::to_string(j) + " holds rank " + std::to_string(from) +
             "'s chunk: receive slot r-k-1 at step k, and send the slot you received the step before";
  }
  return who + " has the right slots but wrong values";
}

// The caller still needs its input (DDP's gradients, ZeRO's weights): a ring must work on a copy.
static void expect_input_kept(int n, const Outcome& out, const char* op) {
  for (int r = 0; r < n; ++r)
    expect(!out.input_changed[r], std::string(op) + " at world " + std::to_string(n) + ": rank " + std::to_string(r) +
                                      "'s input changed: the ring adds into a working copy (input.clone()), "
                                      "never into the caller's input");
}

// Bytes: (n-1)/n · S for S = the full buffer (reduce-scatter's input, all-gather's output).
static void expect_ring_bytes(int n, const Outcome& out, const char* op) {
  const int64_t S = n * kChunk * 4, formula = (n - 1) * S / n;
  for (int r = 0; r < n; ++r) {
#ifndef SL_SOLUTION
    expect(out.library_calls[r] == 0, std::string("rank ") + std::to_string(r) +
                                          " called the group's own collectives: write the ring from isend/recv");
#endif
    expect(out.bytes_sent[r] == formula,
           std::string(op) + " at world " + std::to_string(n) + ": rank " + std::to_string(r) + " sent " +
               std::to_string(out.bytes_sent[r]) + " bytes, the ring sends (n-1)/n · S = " + std::to_string(formula) +
               " (" + std::to_string(n - 1) + " chunks of " + std::to_string(S / n) + " bytes); you sent " +
               std::to_string(static_cast<double>(out.bytes_sent[r]) / (S / n)) + " chunks");
  }
}

// The prediction's measured value: the library's reduce_scatter at world 8, rank 0's ledger.
static double measured_reduce_scatter_bytes() {
  int64_t bytes = 0;
  exercises::run_ranks(8, [&](RankContext& ctx) {
    const Tensor input = ones({1200}), output = zeros({150});
    ctx.world->ledger().reset();
    ctx.world->reduce_scatter(output, input, ReduceOp::sum);
    if (ctx.rank == 0) bytes = ctx.world->ledger()[CommOp::reduce_scatter].bytes_sent;
  }, "the library's reduce_scatter did not finish: ");
  return static_cast<double>(bytes);
}

int main() {
  exercises::Grader grader("05_ring_collectives");
  grader.predict("bytes rank 0 sends in a ring reduce-scatter of 1200 floats at world 8",
                 impl::predicted_reduce_scatter_bytes, measured_reduce_scatter_bytes, 0, "bytes");
  for (int n = 2; n <= 5; ++n) {
    grader.check("ring_reduce_scatter, world " + std::to_string(n) + ": exact sums (integers) and (n-1)/n·S bytes sent", [n] {
      const Outcome out = run(n, /*reduce_scatter=*/true, /*integers=*/true);
      expect_input_kept(n, out, "ring_reduce_scatter");
      for (int r = 0; r < n; ++r)
        if (!all_close(out.got[r], out.want[r], 0, 0)) expect(false, diagnose_reduce_scatter(n, r, out.got[r]));
      expect_ring_bytes(n, out, "ring_reduce_scatter");
    });
  }
  for (int n = 2; n <= 5; ++n) {
    grader.check("ring_all_gather, world " + std::to_string(n) + ": every slot exact and (n-1)/n·S bytes sent", [n] {
      const Outcome out = run(n, /*reduce_scatter=*/false, /*integers=*/true);
      expect_input_kept(n, out, "ring_all_gather");
      for (int r = 0; r < n; ++r)
        if (!all_close(out.got[r], out.want[r], 0, 0)) expect(false, diagnose_all_gather(n, r, out.got[r]));
      expect_ring_bytes(n, out, "ring_all_gather");
    });
  }
  grader.check("ring_reduce_scatter, world 4, randn: within f32 rounding of the library's", [] {
    const Outcome out = run(4, true, false);
    for (int r = 0; r < 4; ++r)
      expect(all_close(out.got[r], out.want[r], 1e-5, 1e-5),
             "rank " + std::to_string(r) +
                 " differs from the library's reduce_scatter on randn inputs by more than rounding");
  });
  return grader.finish();
}
