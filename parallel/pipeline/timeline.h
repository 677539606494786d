// timeline.h — what each pipeline rank did when: compute (F, B or W of which micro-batch and chunk),
// communication (a send/recv batch, waiting included) and, in the gaps, idle. The engine records
// it itself as it runs (no extra thread); the simulator produces one with unit costs.
//
//   ASCII Gantt (forward: the micro-batch's digit, backward: its letter, a zero-bubble W: its capital
//   letter, '-' communication, '.' idle)
//
//     rank 0 |0123---------abcd|
//     rank 1 |.0123-------abcd.|
//
//   bubble = idle + communication share of the step, averaged over ranks; printed beside the formula
//   (p-1)/(m+p-1) (interleaved: (p-1)/(v·m+p-1)) by the lessons and bench/pipeline.cpp.
//
//   Writers: ascii_gantt (terminal), write_svg (a picture), write_chrome_trace (JSON that opens in
//   Perfetto or chrome://tracing; a comm event's args carry link_us, the simulated links' charge
//   inside it); write_trace picks by the file's extension (.svg, .json).
//
//   Tests: tests/parallel/pipeline/test_pipeline_schedule.cpp
#pragma once
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace sl::parallel {

struct TimelineEvent {
  enum class Kind : uint8_t { forward, backward, comm, weight };  // weight: a zero-bubble W
  Kind kind = Kind::forward;
  int micro = -1, chunk = -1;  // compute only
  double start = 0, end = 0;   // seconds from the step's start
  double link_s = 0;           // comm: what simulated links (--links) charged the messages received here
};

struct Timeline {
  std::vector<std::vector<TimelineEvent>> ranks;  // [p] events in order
  int micro_batches = 1;

  double span() const;                // from 0 to the last event's end, over every rank
  double busy(int rank) const;        // seconds computing
  double communicating(int rank) const;
  double idle(int rank) const;        // span - busy - communicating
  double bubble() const;              // mean over ranks of (span - busy) / span
};

std::string ascii_gantt(const Timeline& timeline, int width = 72);
std::string svg(const Timeline& timeline);
std::string chrome_trace_json(const Timeline& timeline);
// .svg or .json; throws naming the path for any other extension or when it cannot be written.
void write_trace(const Timeline& timeline, const std::string& path);

// Collective over `group` (the pp group): every rank's events, on every rank, as one Timeline.
// `mine` is this rank's list; the ranks' clocks are taken as one (true for threads; under MPI each
// rank's times start at its own step start).
Timeline gather_timeline(const std::vector<TimelineEvent>& mine, ProcessGroup& group, int micro_batches);

}  // namespace sl::parallel
