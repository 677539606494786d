// Lesson 05 — collectives: how ranks talk, what it costs, and how it fails.
//
// What you will learn
//   * SPMD: launch(n, fn) runs fn once per rank; here every rank is a thread with its own device
//     cpu:r and its own random generator
//   * the ring all-reduce, written out below from isend/recv alone: a reduce-scatter phase, then an
//     all-gather phase, 2(n-1) steps in all; it matches the library's all_reduce bit for bit
//   * its cost: each rank sends (and receives) 2(n-1)/n x S bytes, almost 2S whatever n is, as the
//     ledger of every group counts
//   * all_gather, reduce_scatter and broadcast in one picture each; all_reduce = reduce_scatter +
//     all_gather (which is what ZeRO and FSDP take apart)
//   * algorithm bandwidth S/t versus bus bandwidth S/t x 2(n-1)/n
//   * failure: a rank that throws stops the world (the others get sl::RemoteError naming it); a
//     rank that never arrives is caught by the collective timeout
//
// Run:    make lesson N=05        Prints: the story below, then "lesson 05: OK".
// Try:    build/lessons/05_collectives --world 8 --elements 13440 --mib 4 --svg /tmp/svg_05
//         build/lessons/05_collectives --break-chunk-index   (the ring adds into the wrong chunk)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lesson_args.h"
#include "lesson_svg.h"
#include "parallel/comm/launch.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using Clock = std::chrono::steady_clock;

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static int mod(int a, int n) { return ((a % n) + n) % n; }
static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
static std::string show(const Tensor& t) {
  std::string s = "[";
  for (double v : t.to_vector()) s += (s.size() > 1 ? " " : "") + std::to_string(static_cast<long long>(v));
  return s + "]";
}

// The ring's chunk indices. Rank r sends to r+1 and receives from r-1; the tensor is cut into n chunks.
//   reduce-scatter step k: send chunk r-k (the partial sum it finished last step; at k=0 its own
//                          data), receive chunk r-k-1 (what r-1 sends) and add its own data to it.
//                          After n-1 steps the chunk received last, r+1, holds all n contributions.
//   all-gather step k:     send chunk r+1-k (at k=0 the finished one), receive chunk r-k, copy it.
static int rs_send(int r, int k, int n) { return mod(r - k, n); }
static int rs_recv(int r, int k, int n) { return mod(r - k - 1, n); }
// The mistake (--break-chunk-index): add the incoming partial sum into chunk r-k, the one just sent.
static int rs_recv_off_by_one(int r, int k, int n) { return mod(r - k, n); }
static int ag_send(int r, int k, int n) { return mod(r + 1 - k, n); }
static int ag_recv(int r, int k, int n) { return mod(r - k, n); }

// A sum all-reduce of `data` (numel divisible by n) from point-to-point messages only.
static void ring_all_reduce(ProcessGroup& group, const Tensor& data, bool off_by_one) {
  const int n = group.size(), r = group.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t chunk = data.numel() / n;
  auto piece = [&](int c) { return data.flat_view(c * chunk, Shape({chunk})); };  // a view: same bytes
  Tensor incoming = Tensor::empty(Shape({chunk}), data.options());
  for (int k = 0; k < n - 1; ++k) {
    // isend first: a send waits until the receiver took it, and everyone sends before receiving.
    WorkPtr sending = group.isend(piece(rs_send(r, k, n)), right, /*tag=*/k);
    group.recv(incoming, left, k);
    piece(off_by_one ? rs_recv_off_by_one(r, k, n) : rs_recv(r, k, n)).add_(incoming);  // mine + theirs: the order the library adds in too
    sending->wait();
  }
  for (int k = 0; k < n - 1; ++k) {
    WorkPtr sending = group.isend(piece(ag_send(r, k, n)), right, n + k);
    group.recv(piece(ag_recv(r, k, n)), left, n + k);  // straight into place: a copy, no add
    sending->wait();
  }
}

// The ring for n ranks as a grid: a column per step, a box per rank with the chunk it sends right and
// the one it receives (blue: reduce-scatter adds, green: all-gather copies).
static std::string ring_steps_picture(int n) {
  const double w = 92, h = 26, left = 70, top = 40;
  lesson::Canvas canvas(left + 2 * (n - 1) * w + 20, top + n * h + 20);
  canvas.text(10, 20, "ring all-reduce, n = " + std::to_string(n) + ": rank r sends right, receives from r-1", 13);
  for (int r = 0; r < n; ++r) canvas.text(10, top + r * h + h / 2 + 4, "rank " + std::to_string(r), 11);
  for (int k = 0; k < 2 * (n - 1); ++k) {
    const bool reducing = k < n - 1;
    const int step = reducing ? k : k - (n - 1);
    canvas.text(left + k * w + w / 2, top - 6, (reducing ? "rs " : "ag ") + std::to_string(step), 11, "middle");
    for (int r = 0; r < n; ++r) {
      const int sent = reducing ? rs_send(r, step, n) : ag_send(r, step, n);
      const int got = reducing ? rs_recv(r, step, n) : ag_recv(r, step, n);
      canvas.box(left + k * w, top + r * h, w - 4, h - 4, reducing ? "#9ecae9" : "#a1d99b",
                 "c" + std::to_string(sent) + "> " + (reducing ? "+c" : "=c") + std::to_string(got));
    }
  }
  return canvas.str();
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "05_collectives", "collectives: the ring all-reduce, its cost, and failure");
  const int world = args.integer("world", 4, "largest ring of section 3 (it runs n = 2..world)", 2, 8);
  const int64_t numel = args.integer("elements", 12 * 1024, "f32 elements all-reduced in section 3 (divisible by 2..world)", 64, 1 << 20);
  const int64_t bandwidth_mib = args.integer("mib", 16, "MiB all-reduced in the bandwidth section", 1, 64);
  const int64_t timeout_ms = args.integer("timeout-ms", 200, "collective timeout of section 6 (rank 2 sleeps 600 ms)", 50, 400);
  const bool off_by_one = args.breaks("chunk-index", "the hand ring adds the incoming chunk into chunk r-k, not r-k-1");
  const std::string svg_dir = args.svg();
  args.done();
  for (int n = 2; n <= world; ++n)
    if (numel % n != 0) {
      std::fprintf(stderr, "05_collectives: --elements %lld is not divisible by n = %d (try 13440 for --world 8)\n",
                   (long long)numel, n);
      return 2;
    }
  std::printf("values: world %d, elements %lld, mib %lld, timeout-ms %lld%s\n", world, (long long)numel,
              (long long)bandwidth_mib, (long long)timeout_ms, off_by_one ? ", BROKEN: chunk-index" : "");
  bool ok = true;
  auto check = [&](bool condition, const std::string& what) {
    std::printf("  check: %-70s %s\n", what.c_str(), condition ? "ok" : "FAILED");
    ok = ok && condition;
  };

  section("1. Ranks are threads: same program, own rank, own device, own random stream");
  {
    const int n = 4;
    std::vector<std::vector<double>> common(n), own(n);
    std::vector<std::string> device(n);
    launch(n, [&](RankContext& ctx) {  // each rank writes only its own slots: no locks needed
      const int r = ctx.rank;
      common[r] = rand({3}).to_vector();  // every thread's generator starts at seed 0
      manual_seed(1000 + r);
      Tensor mine = rand({3});
      own[r] = mine.to_vector();
      device[r] = ctx.world->rank() == r && ctx.world->size() == n ? mine.device().str() : "a wrong group";
    });
    bool own_devices = true;
    for (int r = 0; r < n; ++r) {
      std::printf("  rank %d of %d, tensors on %s: rand() %.4f %.4f   after manual_seed(1000 + rank) %.4f %.4f\n", r, n,
                  device[r].c_str(), common[r][0], common[r][1], own[r][0], own[r][1]);
      own_devices = own_devices && device[r] == Device::cpu(r).str();
    }
    std::printf(
        "  Same seed, same numbers (replicas initialise identical weights); seed + rank, own numbers\n"
        "  (each rank shuffles its own data, draws its own dropout masks).\n");
    check(std::all_of(common.begin(), common.end(), [&](auto& v) { return v == common[0]; }),
          "every rank's default generator draws the same numbers");
    check(own[0] != own[1] && own[1] != own[2] && own[2] != own[3], "seeded by rank, the ranks' draws differ");
    check(own_devices, "rank r allocates on cpu:r, and ctx.world knows its rank");
  }

  section("2. The ring all-reduce by hand: who sends which chunk when (n = 4)");
  std::printf("  Each step every rank sends one chunk right and receives one from the left, all at once.\n");
  std::printf("  %-15s %-5s", "phase", "step");
  for (int r = 0; r < 4; ++r) std::printf(r < 3 ? "  rank %d          " : "  rank %d", r);
  for (int k = 0; k < 6; ++k) {
    const bool reducing = k < 3;
    std::printf("\n  %-15s %-5d", k == 0 ? "reduce-scatter" : k == 3 ? "all-gather" : "", k % 3);
    for (int r = 0; r < 4; ++r) {
      int sent = reducing ? rs_send(r, k, 4) : ag_send(r, k - 3, 4);
      int received = reducing ? rs_recv(r, k, 4) : ag_recv(r, k - 3, 4);
      std::printf("  send c%d, %s c%d", sent, reducing ? "add " : "copy", received);
    }
  }
  std::printf("\n");
  std::printf(
      "  After reduce-scatter rank r holds the finished chunk r+1 (c1 c2 c3 c0); all-gather passes\n"
      "  the finished chunks round until every rank has all of them.\n");
  lesson::write_picture(svg_dir, "05_ring_steps.svg", ring_steps_picture(world));

  section("3. Hand-written ring == library all_reduce, and the bytes each rank moved");
  const int64_t S = numel * 4;  // f32; numel divisible by every n of the loop
  std::printf("  S = %lld bytes (f32). Per rank, from ctx.world->ledger():\n", (long long)S);
  std::printf("  %-3s %-22s %-22s %s\n", "n", "by hand: send / recv", "all_reduce: sent/recv", "2(n-1)/n x S");
  bool exact_equal = true, random_equal = true, bytes_as_formula = true;
  lesson::BarChart traffic("bytes each rank sent in one all-reduce of S = " + std::to_string(S) + " (mark: 2(n-1)/n x S)", "KiB");
  for (int n = 2; n <= world; ++n) {
    std::vector<CommStats> by_hand_sent(n), by_hand_received(n), library(n);
    std::vector<char> equal(2 * n);
    std::vector<double> largest_gap(n, 0.0);  // per rank: the largest |by hand - library| over the integers
    launch(n, [&](RankContext& ctx) {
      const int r = ctx.rank;
      manual_seed(r);
      std::vector<double> integers = rand({numel}).to_vector();
      for (double& v : integers) v = std::floor(v * 1000);  // small integers: exact in f32, in any order
      Tensor data[2] = {from_vector(integers, Shape({numel})), randn({numel})};  // randn: rounding depends on order
      for (int d = 0; d < 2; ++d) {
        Tensor by_hand = data[d].clone(), reduced = data[d].clone();
        ctx.world->ledger().reset();
        ring_all_reduce(*ctx.world, by_hand, off_by_one);
        by_hand_sent[r] = ctx.world->ledger()[CommOp::send];
        by_hand_received[r] = ctx.world->ledger()[CommOp::recv];
        ctx.world->all_reduce(reduced);
        library[r] = ctx.world->ledger()[CommOp::all_reduce];
        equal[2 * r + d] = std::memcmp(by_hand.raw_data(), reduced.raw_data(), S) == 0;
        if (d == 0) largest_gap[r] = std::sqrt(sl::max(pow(sub(by_hand, reduced), 2.0)).item());
      }
    });
    const int64_t formula = 2 * (n - 1) * S / n;
    std::printf("  %-3d %9lld / %-10lld %9lld / %-10lld %lld\n", n, (long long)by_hand_sent[0].bytes_sent,
                (long long)by_hand_received[0].bytes_received, (long long)library[0].bytes_sent,
                (long long)library[0].bytes_received, (long long)formula);
    if (largest_gap[0] > 0)
      std::printf("      n = %d: rank 0's hand ring is off the library's by up to %g (a partial sum in the wrong chunk)\n", n,
                  largest_gap[0]);
    traffic.bar("n = " + std::to_string(n), library[0].bytes_sent / 1024.0, formula / 1024.0);
    for (int r = 0; r < n; ++r) {
      exact_equal = exact_equal && equal[2 * r];
      random_equal = random_equal && equal[2 * r + 1];
      bytes_as_formula = bytes_as_formula && by_hand_sent[r].bytes_sent == formula &&
                         by_hand_received[r].bytes_received == formula && library[r].bytes_sent == formula &&
                         library[r].bytes_received == formula;
    }
  }
  lesson::write_picture(svg_dir, "05_ring_bytes.svg", traffic.svg());
  check(exact_equal, "hand-written ring == library all_reduce: integer values, bitwise");
  check(random_equal, "... and randn values, bitwise (both add in the same ring order)");
  check(bytes_as_formula, "every rank sent and received 2(n-1)/n x S, by hand and in the library");
  std::printf(
      "  n = 2 sends S, n = 4 sends 1.5 S, n = 1000 would send 1.998 S: each rank's traffic hardly\n"
      "  grows with the number of ranks, which is why the ring is the default for large tensors.\n"
      "  The price is 2(n-1) steps, each paying a latency: small tensors prefer trees.\n");

  section("4. The other collectives, one picture each (n = 4)");
  {
    const int n = 4;
    std::vector<std::string> gathered(n), scattered(n), broadcasted(n), composed(n);
    std::vector<char> composed_equal(n);
    launch(n, [&](RankContext& ctx) {
      const int r = ctx.rank;
      ProcessGroup& world = *ctx.world;
      Tensor one = full({1}, r + 1), all = zeros({n});
      world.all_gather(all, one);
      gathered[r] = show(one) + "  ->  " + show(all);
      // input_r = (r+1) x [1 10 100 1000]: the sum over ranks is 10 x [1 10 100 1000]
      Tensor input = from_vector({1, 10, 100, 1000}, {4}) * (r + 1), chunk = zeros({1});
      world.reduce_scatter(chunk, input);
      scattered[r] = show(input) + "  ->  " + show(chunk);
      Tensor t = full({3}, r);
      std::string before = show(t);
      world.broadcast(t, /*root=*/2);
      broadcasted[r] = before + "  ->  " + show(t);
      // all_reduce = reduce_scatter (each rank finishes one chunk) + all_gather (everyone gets all)
      Tensor pieces = zeros({n}), summed = input.clone();
      world.all_gather(pieces, chunk);
      world.all_reduce(summed);
      composed[r] = show(pieces);
      composed_equal[r] = pieces.to_vector() == summed.to_vector();
    });
    auto picture = [&](const char* what, const std::vector<std::string>& rows) {
      std::printf("  %s\n", what);
      for (int r = 0; r < n; ++r) std::printf("    rank %d  %s\n", r, rows[r].c_str());
    };
    picture("all_gather(out, in): everyone contributes a piece, everyone gets them all", gathered);
    picture("reduce_scatter(out, in): sum element by element; rank r keeps chunk r of the sum", scattered);
    picture("broadcast(t, root=2): everyone gets rank 2's tensor", broadcasted);
    picture("all_gather of the reduce_scatter chunks = all_reduce(input)", composed);
    check(std::all_of(gathered.begin(), gathered.end(), [](auto& row) { return row.ends_with("->  [1 2 3 4]"); }),
          "all_gather: [1 2 3 4] on every rank");
    check(scattered[3] == "[4 40 400 4000]  ->  [10000]", "reduce_scatter: rank 3 gets chunk 3 of the sum");
    check(broadcasted[0] == "[0 0 0]  ->  [2 2 2]", "broadcast: rank 0 now holds rank 2's [2 2 2]");
    check(std::all_of(composed_equal.begin(), composed_equal.end(), [](char c) { return c != 0; }),
          "reduce_scatter + all_gather == all_reduce on every rank");
    std::printf("  (ZeRO-2 keeps the reduce_scatter half for gradients; FSDP all_gathers weights when needed.)\n");
  }

  std::printf("\n--- 5. Bandwidth: a %lld MiB all_reduce\n", (long long)bandwidth_mib);
  {
    const int64_t bytes = bandwidth_mib << 20, iterations = 5;
    std::vector<char> source(bytes, 1), destination(bytes, 0);
    std::vector<double> copy_ms(5);
    for (double& ms : copy_ms) {
      Clock::time_point start = Clock::now();
      std::memcpy(destination.data(), source.data(), bytes);
      ms = ms_since(start);
    }
    std::printf("  memcpy of %lld MiB on one thread: %.2f ms = %.2f GB/s (the hardware's yardstick here)\n",
                (long long)bandwidth_mib, median(copy_ms), bytes / median(copy_ms) / 1e6);
    for (int n : {2, 4}) {
      std::vector<std::vector<double>> times(n);
      launch(n, [&](RankContext& ctx) {
        Tensor gradients = zeros({bytes / 4});
        ctx.world->all_reduce(gradients);  // warm-up: the pages are touched, the threads awake
        for (int i = 0; i < iterations; ++i) {
          ctx.world->barrier();  // start together
          Clock::time_point start = Clock::now();
          ctx.world->all_reduce(gradients);
          times[ctx.rank].push_back(ms_since(start));
        }
      });
      std::vector<double> slowest(iterations);  // an all_reduce is done when its last rank is
      for (int i = 0; i < iterations; ++i)
        for (int r = 0; r < n; ++r) slowest[i] = std::max(slowest[i], times[r][i]);
      double median_ms = median(slowest), algbw = bytes / median_ms / 1e6;
      std::printf("  n = %d: %.2f ms   algbw S/t = %.2f GB/s   busbw = algbw x 2(n-1)/n = %.2f GB/s\n", n, median_ms,
                  algbw, algbw * 2 * (n - 1) / n);
    }
    std::printf(
        "  algbw is what the caller sees; busbw is what each rank's link carried, comparable across n\n"
        "  and against the link's speed (NVLink, InfiniBand; here: memory, shared by 2 cores).\n"
        "  bench/collectives.cpp measures this properly at several sizes.\n");
  }

  section("6. When a rank fails");
  {
    const int n = 3;
    std::vector<std::string> caught(n);
    std::vector<int> blamed(n, -1);
    try {
      launch(n, [&](RankContext& ctx) {
        if (ctx.rank == 1) throw Error("rank 1: could not read batch 17 from disk");
        try {
          ctx.world->all_reduce(ones({1024}));  // waits for rank 1, which will never come
        } catch (const RemoteError& e) {
          caught[ctx.rank] = e.what();
          blamed[ctx.rank] = e.failed_rank();
          throw;
        }
      });
    } catch (const Error& e) {
      std::printf("  launch() rethrew the original error: %s\n", e.what());
    }
    for (int r : {0, 2}) std::printf("  rank %d caught RemoteError: %s\n", r, caught[r].c_str());
    check(blamed[0] == 1 && blamed[2] == 1, "the waiting ranks got RemoteError naming rank 1");

    // A rank that neither fails nor arrives (stuck, or it skipped the call) is found by the timeout.
    LaunchOptions quick;
    quick.timeout = std::chrono::milliseconds(timeout_ms);
    std::vector<double> caught_at(n, 0);
    std::vector<std::string> kind(n);
    double woke_at = 0;  // when rank 2 is done with its sleep
    Clock::time_point start = Clock::now();
    bool timed_out = false;
    auto rank_2_skips = [&](RankContext& ctx) {
      if (ctx.rank == 2) {  // skips the all_reduce: busy with something else for a while
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        woke_at = ms_since(start);
        return;
      }
      try {
        ctx.world->all_reduce(ones({1024}));
      } catch (const Error& e) {
        kind[ctx.rank] = dynamic_cast<const TimeoutError*>(&e) ? "TimeoutError"
                         : dynamic_cast<const RemoteError*>(&e) ? "RemoteError"
                                                                 : "Error";
        caught[ctx.rank] = e.what();
        caught_at[ctx.rank] = ms_since(start);
        throw;
      }
    };
    try {
      launch(n, rank_2_skips, quick);
    } catch (const TimeoutError& e) {
      timed_out = true;
      std::printf("  launch() rethrew: TimeoutError: %s\n", e.what());
    } catch (const Error& e) {
      std::printf("  launch() rethrew (not a timeout?): %s\n", e.what());
    }
    for (int r : {0, 1})
      std::printf("  rank %d, after %.0f ms: %s: %s\n", r, caught_at[r], kind[r].c_str(), caught[r].c_str());
    check(timed_out, "a rank that skips a collective: the others time out (" + std::to_string(timeout_ms) + " ms here)");
    std::printf("  rank 2 woke up after %.0f ms and returned\n", woke_at);
    // Against rank 2's own wake-up, not a fixed 550 ms: on a loaded machine any thread may be late
    // by a scheduler's slice, but the waiting ranks still raise long before rank 2's 600 ms are up.
    check(caught_at[0] > 0 && caught_at[1] > 0 && caught_at[0] < woke_at && caught_at[1] < woke_at,
          "... and they knew before the skipping rank woke up (600 ms)");
    bool every_one_knew = true;  // each waiting rank raised: its own timeout, or the news of another's
    for (int r : {0, 1}) every_one_knew = every_one_knew && (kind[r] == "TimeoutError" || kind[r] == "RemoteError");
    check(every_one_knew, "... each with a TimeoutError of its own or a RemoteError naming a rank that timed out");
    std::printf(
        "  Both waiting ranks wait on rank 2 (rank 0 for its chunk, rank 1 for it to take rank 1's),\n"
        "  with deadlines microseconds apart. The first to reach its deadline raises TimeoutError, and\n"
        "  that error, leaving its function, aborts the world; the other raises RemoteError naming it,\n"
        "  or, if its own deadline passed before the abort reached it, a TimeoutError of its own (both\n"
        "  happen: the lines above show this run's). A rank that skips a call and *returns* is noticed\n"
        "  at once (\"has already returned from its function\").\n"
        "  The default timeout is 10 minutes (SL_COLLECTIVE_TIMEOUT_MS), as NCCL's: a real job waits that\n"
        "  long for a slow peer, so a test or a lesson sets a short one in LaunchOptions.\n");
  }

  std::printf("\nlesson 05: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
