// run_report.h — what one rank did during a run: where it sits in the mesh, the memory it held, the
// bytes it moved per group and op, and where its time went. `train --report-json PATH` writes one
// per rank (README: "The run report" gives the schema); tests/parallel/train/test_run_report.cpp checks it against
// the ledgers it reads.
//
//   time, per rank, over the run (every rank measures its own clock):
//     wall           from the trainer's construction to the report
//     communication  blocked in a collective or a wait() on this rank's groups (CommLedger::wait_seconds),
//                    setup included (the mesh, the initial broadcast)
//     compute        inside train_step and not blocked: forward, backward, the optimizer
//     idle           the rest: setup's own work, logging, held-out evaluation
//     links          with simulated links (--links, --topology): what the links charged this rank's
//                    received messages, a part of communication (CommStats::link_s per group and op)
//   compute + communication + idle = wall. Under data parallelism "communication" also holds the
//   time a rank waits for a slower peer; a pipeline's bubble would show there too.
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/mesh.h"
#include "parallel/comm/process_group.h"
#include "tensor/device.h"

namespace sl::parallel {

struct RankReport {
  int rank = 0;
  std::array<int, DeviceMesh::kDims> coordinates{};  // in kGridDims order: pp, dp_replicate, dp_shard, cp, tp
  struct Memory {
    std::string category;  // MemoryCategory names, then "total" (peak: of the total, not a sum of peaks)
    int64_t current = 0, peak = 0;
  };
  std::vector<Memory> memory;
  struct Traffic {
    std::string group, op;
    CommStats stats;
  };
  std::vector<Traffic> traffic;  // every (group, op) that was called, groups in the given order
  double wall_s = 0, compute_s = 0, communication_s = 0, idle_s = 0;
  // Simulated links (train --links): the time they charged the messages this rank received, summed
  // over its groups. It is a part of communication_s (the rank waited for those messages), not of compute.
  double link_s = 0;
  // A pipeline stage's own figures, from its last step (absent from the JSON when `stage` is empty).
  struct Pipeline {
    std::string stage;              // "stage 1/2: h.1"
    std::string schedule;           // "1f1b"
    int peak_micro_batches = 0;     // micro-batch chunks whose activations it held at once
    double bubble = 0;              // idle and waiting share of its last step's span
    double bubble_formula = 0;      // (p-1)/(m+p-1), (p-1)/(v·m+p-1), ...
  } pipeline;
};

// Reads the memory ledger on `device` (current and peak per category) and each named group ledger.
// `wall_s`: the whole run on this rank; `step_s`: the time inside train_step, of which
// `step_blocked_s` blocked in the groups (Trainer::step_seconds, step_blocked_seconds).
RankReport collect_rank_report(int rank, const std::array<int, DeviceMesh::kDims>& coordinates,
                               const std::vector<std::pair<std::string, const CommLedger*>>& groups, Device device,
                               double wall_s, double step_s, double step_blocked_s);

// The end-of-run table train prints, a block per rank: coordinates; memory per category (MiB held at
// the end / peak), categories that held nothing left out; MiB sent per group and op, with calls; the
// compute / communication / idle split of its wall time.
std::string run_report_table(const std::vector<RankReport>& ranks, int64_t steps);

// The run report as JSON text: {"plan", "parallelism", "steps", "ranks": [...]} (README: "The run report").
std::string run_report_json(const std::string& plan, const ParallelismConfig& parallelism, int64_t steps,
                            const std::vector<RankReport>& ranks);

}  // namespace sl::parallel
