#include "autograd/profiler.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace sl {

namespace {
thread_local bool tls_enabled = false;
thread_local std::map<std::string, Profiler::Entry> tls_entries;
}  // namespace

void Profiler::enable() { tls_enabled = true; }
void Profiler::disable() { tls_enabled = false; }
bool Profiler::enabled() { return tls_enabled; }
void Profiler::reset() { tls_entries.clear(); }
const std::map<std::string, Profiler::Entry>& Profiler::entries() { return tls_entries; }

void Profiler::record(const std::string& op, bool backward, double ms) {
  Entry& entry = tls_entries[op];
  if (backward) {
    entry.backward_ms += ms;
    entry.backward_calls++;
  } else {
    entry.forward_ms += ms;
    entry.forward_calls++;
  }
}

std::string Profiler::report(int rows) {
  std::vector<std::pair<std::string, Entry>> sorted(tls_entries.begin(), tls_entries.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.forward_ms + a.second.backward_ms > b.second.forward_ms + b.second.backward_ms;
  });
  double total = 0;
  for (auto& [_, e] : sorted) total += e.forward_ms + e.backward_ms;
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-16s %11s %11s %8s %8s %7s\n", "op", "forward ms", "backward ms", "fwd n", "bwd n",
                "share");
  out += line;
  for (int i = 0; i < static_cast<int>(sorted.size()) && i < rows; ++i) {
    const auto& [name, e] = sorted[i];
    std::snprintf(line, sizeof line, "%-16s %11.2f %11.2f %8ld %8ld %6.1f%%\n", name.c_str(), e.forward_ms,
                  e.backward_ms, e.forward_calls, e.backward_calls,
                  total > 0 ? 100.0 * (e.forward_ms + e.backward_ms) / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-16s %11s %11s %8s %8s %7s   total %.2f ms\n", "", "", "", "", "", "", total);
  out += line;
  return out;
}

}  // namespace sl
