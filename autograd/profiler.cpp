#include "autograd/profiler.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace sl {

namespace {
thread_local bool tls_enabled = false;
thread_local ProfilePhase tls_phase = ProfilePhase::forward;
thread_local std::map<std::string, Profiler::Entry> tls_entries;
}  // namespace

void Profiler::enable() { tls_enabled = true; }
void Profiler::disable() { tls_enabled = false; }
bool Profiler::enabled() { return tls_enabled; }
void Profiler::reset() { tls_entries.clear(); }
const std::map<std::string, Profiler::Entry>& Profiler::entries() { return tls_entries; }
ProfilePhase Profiler::current_phase() { return tls_phase; }
void Profiler::set_current_phase(ProfilePhase phase) { tls_phase = phase; }

void Profiler::record(const std::string& op, ProfilePhase phase, double ms) {
  Entry& entry = tls_entries[op];
  switch (phase) {
    case ProfilePhase::forward:
      entry.forward_ms += ms;
      entry.forward_calls++;
      break;
    case ProfilePhase::backward:
      entry.backward_ms += ms;
      entry.backward_calls++;
      break;
    case ProfilePhase::optimizer:
      entry.optimizer_ms += ms;
      entry.optimizer_calls++;
      break;
  }
}

std::string Profiler::report(int rows) {
  std::vector<std::pair<std::string, Entry>> sorted(tls_entries.begin(), tls_entries.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.total_ms() > b.second.total_ms(); });
  Entry sum;
  for (auto& [_, e] : sorted) {
    sum.forward_ms += e.forward_ms;
    sum.backward_ms += e.backward_ms;
    sum.optimizer_ms += e.optimizer_ms;
  }
  const double total = sum.total_ms();
  std::string out;
  char line[200];
  // op | ms per phase | calls per phase | share of the total
  std::snprintf(line, sizeof line, "%-16s %11s %11s %12s %7s %7s %7s %7s\n", "op", "forward ms", "backward ms",
                "optimizer ms", "fwd n", "bwd n", "opt n", "share");
  out += line;
  for (int i = 0; i < static_cast<int>(sorted.size()) && i < rows; ++i) {
    const auto& [name, e] = sorted[i];
    std::snprintf(line, sizeof line, "%-16s %11.2f %11.2f %12.2f %7ld %7ld %7ld %6.1f%%\n", name.c_str(), e.forward_ms,
                  e.backward_ms, e.optimizer_ms, e.forward_calls, e.backward_calls, e.optimizer_calls,
                  total > 0 ? 100.0 * e.total_ms() / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-16s %11.2f %11.2f %12.2f   total %.2f ms\n", "(all ops)", sum.forward_ms,
                sum.backward_ms, sum.optimizer_ms, total);
  out += line;
  return out;
}

}  // namespace sl
