// schedule.h — a pipeline schedule is data: one list of actions per rank, which the engine runs
// (engine.h), the simulator checks (simulate.h) and the timeline draws (timeline.h).
//
//   F(m, c)   forward of micro-batch m through chunk c        B(m, c)  its backward
//   send/recv of an activation (forward) or a gradient (backward), tagged (m, c, direction)
//
//   Consecutive send/recv actions form one batch that the engine posts together
//   (batch_isend_irecv), as Megatron's send_forward_recv_backward does: in the steady state a stage
//   hands its output down and takes the next gradient up in one exchange, without which two
//   neighbours that both send first would wait for each other forever.
//
//   p = 4 stages, m = 4 micro-batches (F = 0..3, B = a..d), time →
//
//     GPipe   rank 0  0123      abcd          1F1B  rank 0  0123   a b c d       (warm-up p-r-1 = 3)
//             rank 1   0123    abcd                 rank 1   012 a3b c d
//             rank 2    0123  abcd                  rank 2    01a2b3c d
//             rank 3     0123abcd                   rank 3     0a1b2c3d          (no warm-up)
//
//   The bubble (idle share of a rank) is (p-1)/(m+p-1) for both; 1F1B holds at most min(p-r, m)
//   micro-batches' activations on rank r where GPipe holds all m. Interleaved 1F1B gives each rank
//   v chunks (r, r+p, …): the bubble shrinks to (p-1)/(v·m+p-1) for v times the messages.
//
//   Rules this file implements:
//     naive        one micro-batch at a time through every stage and back (F0 B0 F1 B1 …)
//     gpipe        all forwards, then all backwards, both in micro-batch order
//     1f1b         warm-up min(p-r-1, m) forwards, then pairs F,B, then the cool-down backwards
//     interleaved  Megatron's order: warm-up 2(p-r-1) + (v-1)·p forwards (capped at m·v), the k-th
//                  forward runs chunk (k mod p·v) / p of micro-batch (k / p·v)·p + k mod p. Megatron's
//                  original rule, m a multiple of p, is required (the relaxed rule is not built).
//     zero-bubble  ZB-H1 (Qi et al. 2023): the backward is split into B (input gradient, which the
//                  previous stage waits for) and W (weight gradient, which nobody waits for). Same
//                  warm-up as 1F1B, then F,B pairs; rank r lets r W's wait and runs one after each
//                  B beyond that, and the held-back W's fill the cool-down, where 1F1B idles:
//
//     p = 4, m = 4   rank 0  F0 F1 F2 F3 B0 W0 B1 W1 B2 W2 B3 W3
//     (W's lag r)    rank 1  F0 F1 F2 B0 F3 B1 W0 B2 W1 B3 W2 W3
//                    rank 2  F0 F1 B0 F2 B1 F3 B2 W0 B3 W1 W2 W3
//                    rank 3  F0 B0 F1 B1 F2 B2 F3 B3 W0 W1 W2 W3
//
//                  With F = B = W the bubble is (p-1)/(3m+p-1) ≈ (p-1)/(3m) for m >= p, a third of
//                  1F1B's (each rank idles p-1 units of one pass where 1F1B idles p-1 of F+B+W).
//                  A rank holds at most p-r micro-batches between F and B (1F1B's count) plus up
//                  to r between B and W, which keep only what W needs (autograd/deferred_grad.h):
//                  the most any rank holds, p on rank 0, is 1F1B's.
//   Backwards (B and W) always run in micro-batch order per chunk, so gradients accumulate in the
//   serial order and every schedule gives the same bits.
//
//   Lessons: 08, 09, 10   Tests: tests/parallel/pipeline/test_pipeline_schedule.cpp
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sl::parallel {

enum class ScheduleKind : uint8_t { naive, gpipe, one_f_one_b, interleaved, zero_bubble };
const char* schedule_name(ScheduleKind kind);     // "naive", "gpipe", "1f1b", "interleaved", "zero-bubble"
ScheduleKind parse_schedule(const std::string& name);  // throws naming the choices

struct Action {
  // backward: the whole backward, or only the input gradient (B) when the schedule has weight (W) actions.
  enum class Kind : uint8_t { forward, backward, send_activation, recv_activation, send_grad, recv_grad, weight };
  Kind kind;
  int micro = 0;  // the micro-batch
  int chunk = 0;  // the global chunk (0 .. p·v-1) computed, or whose output/input gradient moves
  int peer = -1;  // send/recv: the other rank

  bool is_compute() const { return kind == Kind::forward || kind == Kind::backward || kind == Kind::weight; }
  bool is_send() const { return kind == Kind::send_activation || kind == Kind::send_grad; }
  // The message tag: (micro-batch, chunk, direction), the same on both ends.
  int tag() const;
  std::string str() const;  // "F3.1", "B0.0", "W0.0", "send act 3.1 -> 2", "recv grad 0.2 <- 1"
  bool operator==(const Action&) const = default;
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::gpipe;
  int stages = 1, micro_batches = 1, virtual_stages = 1;
  std::vector<std::vector<Action>> ranks;  // [p] the action list of each rank

  int chunks() const { return stages * virtual_stages; }
  bool split_backward() const { return kind == ScheduleKind::zero_bubble; }  // B and W are separate actions
  std::string str() const;  // every rank's list, one line each (compute actions only: "F0 F1 B0 F2 B1 …")
};

// Throws sl::Error naming the values and the rule when the combination cannot run, before anything
// is built or sent: p >= 1, m >= 1, v >= 1; v > 1 only for interleaved, which needs p >= 2 and m a
// multiple of p.
void check_schedule_config(ScheduleKind kind, int stages, int micro_batches, int virtual_stages);

// The compute order per rank (F and B only), then the sends and receives that feed it.
Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, int virtual_stages = 1);

// Sends and receives around a compute order: recv before a F/B that needs input from another rank,
// send after one whose output another rank needs (a B's gradient after the W's that follow it when a
// forward comes next: it joins that forward's receive). Public so a test can hand-craft an order.
Schedule with_communication(ScheduleKind kind, int stages, int micro_batches, int virtual_stages,
                            const std::vector<std::vector<Action>>& compute);

// The most micro-batches whose forward has run and backward not yet, on each rank: the activations
// it holds at its peak, in micro-batch units (per chunk: each (m, c) counts once). With a split
// backward a micro-batch counts until its W (between B and W it holds only what W needs).
std::vector<int> peak_in_flight(const Schedule& schedule);

// The formula for the bubble: (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1), zero-bubble (ZB-H1, with
// F = B = W and m >= p) (p-1)/(3m+p-1) ≈ (p-1)/(3m).
double bubble_formula(ScheduleKind kind, int stages, int micro_batches, int virtual_stages);

}  // namespace sl::parallel
