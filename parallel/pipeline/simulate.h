// simulate.h — before a schedule runs: is it well formed, and does it finish?
//
//   validate(s)   every rank runs F(m, c) and then B(m, c) exactly once for each micro-batch m of each
//                 of its chunks c, and W(m, c) once after B(m, c) when the schedule splits the
//                 backward (zero-bubble; no W otherwise); every send and receive sits after the compute that makes its
//                 tensor and before the compute that needs it; between each pair of ranks the k-th
//                 send meets the k-th receive (NCCL's rule) with the same tag (micro-batch, chunk,
//                 direction).
//   simulate(s)   runs the lists with rendezvous semantics (no buffering, as NCCL behaves for
//                 large messages): a send completes only when its receive is posted, and consecutive
//                 send/recv actions are posted together as one batch. When no rank can move, the
//                 schedule deadlocks: the error names what every stuck rank waits for, and this is
//                 found here, not in a hung run.
//
//   The simulation also times the lists with fixed costs (F = 1, B = 2 by default; communication
//   free), which gives the ideal timeline the lessons draw and the bubble the formula predicts.
//   A split backward costs the same in all: B = backward - weight = 1, W = weight = 1.
//
//   Tests: tests/parallel/pipeline/test_pipeline_schedule.cpp (every valid (p ≤ 8, m ≤ 32, v ≤ 4) finishes; a hand-made
//   deadlock is found)
#pragma once
#include <string>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/timeline.h"

namespace sl::parallel {

// Throws sl::Error naming the rank, the action and the rule it breaks.
void validate(const Schedule& schedule);

struct Costs {
  double forward = 1, backward = 2;  // backward: input and weight gradients together
  double weight = 1;                 // the W part of it, when the schedule splits the backward
};

struct Simulation {
  bool deadlocked = false;
  std::string stuck;  // deadlocked: "rank 0 waits in {send act 0.0 -> 1, recv grad 0.1 <- 1}; rank 1 …"
  Timeline timeline;  // the ideal timeline up to where it finished or stuck
};

Simulation simulate(const Schedule& schedule, const Costs& costs = {});

// validate, then simulate: throws when the schedule is malformed or deadlocks.
void check(const Schedule& schedule);

}  // namespace sl::parallel
