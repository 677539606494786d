// run_report.cpp — see run_report.h.
#include "parallel/train/run_report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tensor/ledger.h"

namespace sl::parallel {

RankReport collect_rank_report(int rank, const std::array<int, DeviceMesh::kDims>& coordinates,
                               const std::vector<std::pair<std::string, const CommLedger*>>& groups, Device device,
                               double wall_s, double step_s, double step_blocked_s) {
  RankReport report;
  report.rank = rank;
  report.coordinates = coordinates;
  const MemoryLedger& memory = MemoryLedger::instance();
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    auto category = static_cast<MemoryCategory>(c);
    report.memory.push_back({category_name(category), memory.current(device, category), memory.peak(device, category)});
  }
  report.memory.push_back({"total", memory.current(device), memory.peak(device)});
  for (const auto& [group, ledger] : groups) {
    for (int o = 0; o < static_cast<int>(CommOp::count_); ++o) {
      auto op = static_cast<CommOp>(o);
      CommStats stats = (*ledger)[op];
      if (stats.calls > 0) report.traffic.push_back({group, comm_op_name(op), stats});
    }
    report.communication_s += ledger->wait_seconds();
    report.link_s += ledger->link_seconds();
  }
  report.wall_s = wall_s;
  report.compute_s = std::max(0.0, step_s - step_blocked_s);
  report.idle_s = std::max(0.0, wall_s - report.compute_s - report.communication_s);
  return report;
}

std::string run_report_table(const std::vector<RankReport>& ranks, int64_t steps) {
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; };
  std::string out = "per rank: mesh coordinates; memory in MiB (held at the end / peak); MiB sent per group and "
                    "op; where the time went\n";
  char line[256];
  for (const RankReport& r : ranks) {
    out += "rank " + std::to_string(r.rank) + " (";
    for (int d = 0; d < DeviceMesh::kDims; ++d)
      out += std::string(d ? ", " : "") + std::string(name(kGridDims[static_cast<size_t>(d)])) + " " + std::to_string(r.coordinates[d]);
    out += ")\n  memory  ";
    for (const auto& m : r.memory) {
      if (m.peak == 0) continue;
      std::snprintf(line, sizeof line, " %s %.3f/%.3f", m.category.c_str(), mib(m.current), mib(m.peak));
      out += line;
    }
    out += "\n  sent    ";
    int64_t sent = 0;
    for (const auto& t : r.traffic) {
      std::snprintf(line, sizeof line, " %s %s %.3f (%lld calls),", t.group.c_str(), t.op.c_str(),
                    mib(t.stats.bytes_sent), static_cast<long long>(t.stats.calls));
      out += line;
      sent += t.stats.bytes_sent;
    }
    std::snprintf(line, sizeof line, " in all %.3f MiB, %.3f per step\n", mib(sent),
                  mib(sent) / static_cast<double>(std::max<int64_t>(1, steps)));
    out += r.traffic.empty() ? std::string(" nothing\n") : std::string(line);
    const double wall = std::max(r.wall_s, 1e-12);
    std::snprintf(line, sizeof line, "  time     compute %.0f%%, communication %.0f%%, idle %.0f%% of %.3f s\n",
                  100 * r.compute_s / wall, 100 * r.communication_s / wall, 100 * r.idle_s / wall, r.wall_s);
    out += line;
    if (r.link_s > 0) {
      std::snprintf(line, sizeof line, "  links    %.3f s charged by the simulated links (%.3f ms per step)\n", r.link_s,
                    1e3 * r.link_s / static_cast<double>(std::max<int64_t>(1, steps)));
      out += line;
    }
    if (!r.pipeline.stage.empty()) {
      std::snprintf(line, sizeof line,
                    "  pipeline %s, %s: at most %d micro-batches held, bubble %.2f of the last step (formula %.2f)\n",
                    r.pipeline.stage.c_str(), r.pipeline.schedule.c_str(), r.pipeline.peak_micro_batches,
                    r.pipeline.bubble, r.pipeline.bubble_formula);
      out += line;
    }
  }
  return out;
}

std::string run_report_json(const std::string& plan, const ParallelismConfig& parallelism, int64_t steps,
                            const std::vector<RankReport>& ranks) {
  using nlohmann::json;
  json out;
  out["plan"] = plan;
  out["steps"] = steps;
  json degrees;
  const auto values = parallelism.degrees();
  for (int d = 0; d < DeviceMesh::kDims; ++d) degrees[std::string(name(kGridDims[static_cast<size_t>(d)]))] = values[d];
  out["parallelism"] = degrees;
  out["ranks"] = json::array();
  for (const RankReport& r : ranks) {
    json rank;
    rank["rank"] = r.rank;
    json coords;
    for (int d = 0; d < DeviceMesh::kDims; ++d) coords[std::string(name(kGridDims[static_cast<size_t>(d)]))] = r.coordinates[d];
    rank["coordinates"] = coords;
    json memory;
    for (const auto& m : r.memory) memory[m.category] = {{"current_bytes", m.current}, {"peak_bytes", m.peak}};
    rank["memory"] = memory;
    rank["communication"] = json::array();
    for (const auto& t : r.traffic)
      rank["communication"].push_back({{"group", t.group},
                                       {"op", t.op},
                                       {"calls", t.stats.calls},
                                       {"bytes_sent", t.stats.bytes_sent},
                                       {"bytes_received", t.stats.bytes_received},
                                       {"link_s", t.stats.link_s}});
    rank["time_s"] = {{"wall", r.wall_s}, {"compute", r.compute_s}, {"communication", r.communication_s},
                      {"idle", r.idle_s}, {"links", r.link_s}};
    if (!r.pipeline.stage.empty())
      rank["pipeline"] = {{"stage", r.pipeline.stage},
                          {"schedule", r.pipeline.schedule},
                          {"peak_micro_batches", r.pipeline.peak_micro_batches},
                          {"bubble", r.pipeline.bubble},
                          {"bubble_formula", r.pipeline.bubble_formula}};
    out["ranks"].push_back(rank);
  }
  return out.dump(1) + "\n";
}

}  // namespace sl::parallel
