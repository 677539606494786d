// exercises/projects/02_allreduce_algorithm/grader.cpp — grades my_all_reduce (project.cpp).
//
// Worlds 2 to 8 (powers of two and not), thread ranks (parallel/comm/launch.h):
//   * exact against the group's own all_reduce on integers (exact in f32 in any order of addition),
//     also for a tensor with fewer elements than ranks; randn within f32 rounding;
//   * no call of the group's collectives (the ledger counts them): point-to-point only;
//   * bytes sent per rank (the world group's ledger) printed beside the ring's 2(n-1)/n · S;
//   * simulated links (parallel/comm/topology.h): every rank on its own node, 5 ms latency, a small
//     message: the wall time (the slowest rank's; the links really delay each message) and the links'
//     charge per rank (CommLedger::link_seconds, a sum over the messages a rank received, not the
//     critical path), beside the ring's. Required without SL_SOLUTION: at world 8 a wall time at
//     most 3/4 of the ring's (2(n-1) = 14 latencies; a tree or halving-doubling needs about 6).
// At the end, the numbers its written part asks for (ANALYSIS.md): bytes per rank from the ledger, and
// wall times and link charges over simulated links from 64 floats to 4 MB. Printed, never graded.
// With -DSL_SOLUTION the baseline is the library's ring (ProcessGroup::all_reduce): then the bytes and
// times are the ring's own and the "beats the ring" check is reported, not required (README.md).
#include "exercises/grader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/comm/topology.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;

namespace project02 {
void my_all_reduce(ProcessGroup& group, const Tensor& tensor);
}

#ifdef SL_SOLUTION
namespace solution {
void my_all_reduce(ProcessGroup& group, const Tensor& tensor) { group.all_reduce(tensor); }  // the ring
}  // namespace solution
namespace impl = solution;
#else
namespace impl = project02;
#endif

// What one algorithm did on every rank.
struct Measured {
  std::vector<std::vector<double>> input;   // [n] the tensor before the call
  std::vector<std::vector<double>> result;  // [n] the tensor after the call
  std::vector<int64_t> bytes_sent;          // [n] from the world group's ledger
  std::vector<int64_t> collective_calls;    // [n] calls of the group's own collectives
  std::vector<double> link_s;               // [n] simulated links' charge (0 without a topology)
  std::vector<double> wall_s;               // [n] from entering the call to leaving it
};

struct Outcome {
  Measured student, ring;
};

static Tensor input_of(int rank, int64_t numel, bool integers) {
  if (!integers) {
    manual_seed(300 + rank);
    return randn({numel});
  }
  std::vector<double> values;
  for (int64_t i = 0; i < numel; ++i) values.push_back((rank + 1) * 1000 + i);
  return from_vector(values, Shape({numel}));
}

// When the ranks start the timed call: at once after the barrier, or (aligned) all at one instant.
// Over simulated links the barrier's own messages let the ranks out up to 2(n-1) latencies apart, and
// a rank that leaves early times its wait for the late ones too. Aligned, the first rank out of the
// barrier names an instant 60 ms ahead (longer than any barrier skew here) and every rank sleeps until
// it, so the slowest rank's time is the algorithm's critical path alone.
struct StartClock {
  bool aligned = false;
  std::atomic<int64_t> at{0};  // steady_clock ticks; 0: not named yet
};

static std::chrono::steady_clock::time_point start_now(StartClock* clock) {
  using Clock = std::chrono::steady_clock;
  if (clock == nullptr || !clock->aligned) return Clock::now();
  int64_t none = 0;
  const int64_t ahead = (Clock::now() + std::chrono::milliseconds(60)).time_since_epoch().count();
  clock->at.compare_exchange_strong(none, ahead);
  const Clock::time_point at{Clock::duration(clock->at.load())};
  std::this_thread::sleep_until(at);
  return at;
}

// One timed call on every rank: barrier, reset the ledger, run, read the ledger.
template <typename Call>
static void measure(RankContext& ctx, Measured& m, const Tensor& tensor, Call call, StartClock* clock = nullptr) {
  const int r = ctx.rank;
  ctx.world->barrier();
  ctx.world->ledger().reset();
  m.input[r] = tensor.to_vector();
  const auto start = start_now(clock);
  call(tensor);
  m.wall_s[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const CommLedger& ledger = ctx.world->ledger();
  m.bytes_sent[r] = ledger.total().bytes_sent;
  m.link_s[r] = ledger.link_seconds();
  m.collective_calls[r] = ledger[CommOp::all_reduce].calls + ledger[CommOp::reduce_scatter].calls +
                          ledger[CommOp::all_gather].calls + ledger[CommOp::broadcast].calls;
  m.result[r] = tensor.to_vector();
}

static Outcome run(int n, int64_t numel, bool integers, const Topology& links = {}, bool aligned = false) {
  auto blank = [n] {
    return Measured{std::vector<std::vector<double>>(n), std::vector<std::vector<double>>(n), std::vector<int64_t>(n),
                    std::vector<int64_t>(n), std::vector<double>(n), std::vector<double>(n)};
  };
  Outcome out{blank(), blank()};
  LaunchOptions options;
  options.backend = Backend::threads;
  options.timeout = std::chrono::seconds(4);  // a deadlock ends as a TimeoutError, well inside `timeout 120`
  options.topology = links;
  StartClock student_clock, ring_clock;
  student_clock.aligned = ring_clock.aligned = aligned;
  try {
    launch(
        n,
        [&](RankContext& ctx) {
          const Tensor mine = input_of(ctx.rank, numel, integers), theirs = mine.clone();
          measure(
              ctx, out.student, mine, [&](const Tensor& t) { impl::my_all_reduce(*ctx.world, t); }, &student_clock);
          measure(
              ctx, out.ring, theirs, [&](const Tensor& t) { ctx.world->all_reduce(t); }, &ring_clock);
        },
        options);
  } catch (const TimeoutError& e) {
    throw exercises::CheckFailed(std::string("a rank waited 4 s for a message that never came (a deadlock, or a tag "
                                             "that differs between sender and receiver?): ") +
                                 e.what());
  } catch (const RemoteError& e) {
    throw exercises::CheckFailed(std::string("a rank failed: ") + e.what());
  }
  return out;
}

static std::string where(int n, int r) { return "world " + std::to_string(n) + ", rank " + std::to_string(r); }

// A rank's element that still holds its own input: never reduced. In the last numel % n elements
// (all of them when numel < n) that is the mark of chunks of numel / n, rounded down.
static std::string own_input(size_t i, int64_t numel, int n) {
  const bool remainder = static_cast<int64_t>(i) >= n * (numel / n);
  return std::string(" (this rank's own input: the element was never reduced") +
         (remainder ? "; it lies past n·(numel / n): chunks of numel / n rounded down leave out the last numel % n "
                      "elements, and every element when numel < n)"
                    : ")");
}

// Every rank's result against the ring's: exact (tol 0) or within rounding.
static void expect_sums(int n, const Outcome& out, double tol) {
  for (int r = 0; r < n; ++r) {
    const auto &got = out.student.result[r], &want = out.ring.result[r];
    expect(got.size() == want.size(), where(n, r) + ": the tensor changed size");
    for (size_t i = 0; i < got.size(); ++i) {
      expect(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])),
             where(n, r) + ", element " + std::to_string(i) + ": " + std::to_string(got[i]) + ", the sum is " +
                 std::to_string(want[i]) + (got[i] == want[i] / n ? " (you divided by n: this all-reduce sums)" : "") +
                 (got[i] == 0 ? " (still zero: a slice never arrived?)" : "") +
                 (n > 1 && got[i] == out.student.input[r][i] ? own_input(i, static_cast<int64_t>(got.size()), n) : ""));
    }
#ifndef SL_SOLUTION
    expect(out.student.collective_calls[r] == 0,
           where(n, r) + " called the group's own collectives: write it from isend/irecv");
#endif
  }
}

static double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
static int64_t max_of(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

// ---- the numbers the written part asks for (ANALYSIS.md): measured, printed, never graded ----------
// Bytes from the world group's ledger, wall times from the clock (the slowest rank's, every rank
// starting at one instant, the links really delaying each message; the fastest of three runs), the
// links' charge from CommLedger::link_seconds. None is a formula.
static std::string per_rank(const std::vector<int64_t>& bytes) {
  std::string out;
  for (int64_t b : bytes) out += (out.empty() ? "" : " ") + std::to_string(b);
  return out;
}

static void print_bytes_per_rank(int n, int64_t numel) {
  const Outcome out = run(n, numel, /*integers=*/true);
  std::printf("    world %d, numel %lld (S = %lld bytes): bytes sent per rank 0..n-1\n", n,
              static_cast<long long>(numel), static_cast<long long>(4 * numel));
  std::printf("      yours     %s\n      the ring  %s\n", per_rank(out.student.bytes_sent).c_str(),
              per_rank(out.ring.bytes_sent).c_str());
}

static void print_times(const char* links_spec, int n, int64_t numel) {
  // The fastest of three runs, each algorithm's own: other work on the cores only ever adds time.
  const Outcome out = run(n, numel, /*integers=*/true, Topology::parse_links(links_spec), /*aligned=*/true);
  double yours = max_of(out.student.wall_s), ring = max_of(out.ring.wall_s);
  for (int i = 1; i < 3; ++i) {
    const Outcome again = run(n, numel, true, Topology::parse_links(links_spec), true);
    yours = std::min(yours, max_of(again.student.wall_s));
    ring = std::min(ring, max_of(again.ring.wall_s));
  }
  std::printf("    %-5d %-9lld %-10lld %9.1f %9.1f   %9.1f %9.1f\n", n, static_cast<long long>(numel),
              static_cast<long long>(4 * numel), 1e3 * yours, 1e3 * ring, 1e3 * max_of(out.student.link_s),
              1e3 * max_of(out.ring.link_s));
}

static void print_written_part_numbers(exercises::Grader& grader) {
  grader.numbers("Q1: bytes per rank, no simulated links (the ledger's, exact)", [] {
    print_bytes_per_rank(8, 840);
    print_bytes_per_rank(6, 840);
    print_bytes_per_rank(8, 1 << 18);
  });
  const char* header =
      "    world numel     S bytes    wall yours  the ring   charge yours  the ring   (ms; charge: the links' "
      "sum over the messages a rank received, max over ranks)\n";
  grader.numbers("Q2: latency-bound, every hop 5 ms and 100 GB/s, 64 floats", [header] {
    std::printf("%s", header);
    for (int n : {2, 4, 6, 8}) print_times("inter=100GB/s,5ms;gpus-per-node=1", n, 64);
  });
  grader.numbers("Q3: from latency- to bandwidth-bound, world 8, every hop 1 ms and 100 MB/s", [header] {
    std::printf("%s", header);
    for (int64_t numel : {64, 1024, 16384, 65536, 262144, 1048576})
      print_times("inter=100MB/s,1ms;gpus-per-node=1", 8, numel);
  });
}

int main() {
  exercises::Grader grader("02_allreduce_algorithm");
  constexpr int64_t kNumel = 840;  // divisible by every n <= 8: S = 3360 bytes
  for (int n = 2; n <= 8; ++n)
    grader.check("world " + std::to_string(n) + ": exact sums of integers (numel 840)", [n] {
      const Outcome out = run(n, kNumel, /*integers=*/true);
      expect_sums(n, out, 0);
      const int64_t S = kNumel * 4, ring_formula = 2 * (n - 1) * S / n;
      std::printf("        bytes sent per rank (max): yours %lld, the ring's %lld (2(n-1)/n·S = %lld)\n",
                  static_cast<long long>(max_of(out.student.bytes_sent)),
                  static_cast<long long>(max_of(out.ring.bytes_sent)), static_cast<long long>(ring_formula));
    });
  grader.check("worlds 3, 6, 8: fewer elements than ranks (numel 5), and an odd numel (1001)", [] {
    for (int n : {3, 6, 8})
      for (int64_t numel : {5, 1001}) expect_sums(n, run(n, numel, true), 0);
  });
  grader.check("world 6, randn: within f32 rounding of the ring", [] { expect_sums(6, run(6, kNumel, false), 1e-5); });
  grader.check("simulated links, 5 ms latency, 64 floats: at world 8 at most 3/4 of the ring's wall time", [] {
    const Topology links = Topology::parse_links("inter=100GB/s,5ms;gpus-per-node=1");  // every hop: 5 ms
    double yours_at_8 = 0, ring_at_8 = 0;
    for (int n : {4, 6, 8}) {
      const Outcome out = run(n, 64, true, links);
      expect_sums(n, out, 0);
      std::printf(
          "        world %d: wall yours %.1f ms, the ring's %.1f ms (2(n-1)·α = %d ms); links' charge per rank "
          "(max) yours %.1f ms, the ring's %.1f ms\n",
          n, 1e3 * max_of(out.student.wall_s), 1e3 * max_of(out.ring.wall_s), 2 * (n - 1) * 5,
          1e3 * max_of(out.student.link_s), 1e3 * max_of(out.ring.link_s));
      if (n == 8) yours_at_8 = max_of(out.student.wall_s), ring_at_8 = max_of(out.ring.wall_s);
    }
#ifdef SL_SOLUTION
    std::printf("        (SOLUTION: the baseline is the ring itself, so this is reported, not required)\n");
    (void)yours_at_8, (void)ring_at_8;
#else
    expect(yours_at_8 <= 0.75 * ring_at_8,
           "at world 8 yours took " + std::to_string(1e3 * yours_at_8) + " ms, the ring " + std::to_string(1e3 * ring_at_8) +
               " ms: a chain of messages pays one latency per hop; a tree or halving-doubling has about 2·log2(n) = 6 "
               "steps on its longest path, not 2(n-1) = 14");
#endif
  });
  print_written_part_numbers(grader);
  return grader.finish();
}
