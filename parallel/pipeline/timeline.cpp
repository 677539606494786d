// timeline.cpp — see timeline.h: measures of a timeline and its three drawings.
#include "parallel/pipeline/timeline.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace sl::parallel {

using Kind = TimelineEvent::Kind;

double Timeline::span() const {
  double end = 0;
  for (const auto& events : ranks)
    for (const auto& e : events) end = std::max(end, e.end);
  return end;
}

static double total(const std::vector<TimelineEvent>& events, bool compute) {
  double sum = 0;
  for (const auto& e : events)
    if ((e.kind != Kind::comm) == compute) sum += e.end - e.start;
  return sum;
}

double Timeline::busy(int rank) const { return total(ranks.at(rank), true); }
double Timeline::communicating(int rank) const { return total(ranks.at(rank), false); }
double Timeline::idle(int rank) const { return span() - busy(rank) - communicating(rank); }

double Timeline::bubble() const {
  const double s = span();
  if (ranks.empty() || s <= 0) return 0;
  double sum = 0;
  for (size_t r = 0; r < ranks.size(); ++r) sum += (s - busy(static_cast<int>(r))) / s;
  return sum / static_cast<double>(ranks.size());
}

static char micro_char(const TimelineEvent& e) {
  const int m = e.micro % 26;
  if (e.kind == Kind::forward) return static_cast<char>(m < 10 ? '0' + m : 'A' + m - 10);
  if (e.kind == Kind::weight) return static_cast<char>('A' + m);
  return static_cast<char>('a' + m);
}

std::string ascii_gantt(const Timeline& t, int width) {
  const double s = t.span();
  std::string out;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    std::string row(width, '.');
    // Communication first, compute over it: a cell shows what covers its middle.
    for (int pass = 0; pass < 2; ++pass)
      for (const auto& e : t.ranks[r]) {
        if ((e.kind == Kind::comm) != (pass == 0)) continue;
        for (int c = 0; c < width; ++c) {
          const double mid = (c + 0.5) * s / width;
          if (mid >= e.start && mid < e.end) row[c] = e.kind == Kind::comm ? '-' : micro_char(e);
        }
      }
    char busy[64];
    std::snprintf(busy, sizeof busy, "  busy %3.0f%%", s > 0 ? 100 * t.busy(static_cast<int>(r)) / s : 0.0);
    out += "rank " + std::to_string(r) + " |" + row + "|" + busy + "\n";
  }
  bool weights = false;
  for (const auto& events : t.ranks)
    for (const auto& e : events) weights = weights || e.kind == Kind::weight;
  out += weights ? "        0-9 forward of micro-batch 0..9   a-j backward B (input gradient)   A-J W (weight gradient)"
                   "   - send/recv   . idle\n"
                 : "        0-9,A-P forward of micro-batch 0..25   a-z backward   - in send/recv (waiting for a peer, "
                   "mostly)   . idle\n";
  return out;
}

static const char* colour(const TimelineEvent& e) {
  static const char* const forward[] = {"#4e79a7", "#6b93c0", "#2f5d8a"};
  static const char* const backward[] = {"#e15759", "#f08a5d", "#b83b3e"};
  const int shade = std::max(e.chunk, 0) % 3;  // the chunks of interleaving in three shades
  if (e.kind == Kind::comm) return "#bab0ac";
  if (e.kind == Kind::weight) return "#59a14f";
  return e.kind == Kind::forward ? forward[shade] : backward[shade];
}

std::string svg(const Timeline& t) {
  const double s = std::max(t.span(), 1e-12), width = 960, row = 28, left = 60;
  const double height = row * static_cast<double>(t.ranks.size()) + 30;
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"monospace\" "
                "font-size=\"11\">\n",
                left + width + 10, height);
  out += buf;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    const double y = 10 + row * static_cast<double>(r);
    std::snprintf(buf, sizeof buf, "<text x=\"4\" y=\"%.1f\">rank %zu</text>\n", y + 17, r);
    out += buf;
    for (const auto& e : t.ranks[r]) {
      const double x = left + width * e.start / s, w = std::max(width * (e.end - e.start) / s, 0.5);
      const double h = e.kind == Kind::comm ? 6 : row - 4;
      std::snprintf(buf, sizeof buf, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n", x,
                    e.kind == Kind::comm ? y + row - 10 : y, w, h, colour(e));
      out += buf;
      if (e.kind != Kind::comm && w > 14) {
        std::snprintf(buf, sizeof buf, "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\">%c%d</text>\n", x + 2, y + 16,
                      e.kind == Kind::forward ? 'F' : e.kind == Kind::weight ? 'W' : 'B', e.micro);
        out += buf;
      }
    }
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"%.0f\">blue forward, red backward (B), green weight gradient (W), grey "
                "send/recv; bubble %.1f%%</text>\n</svg>\n",
                left, height - 4, 100 * t.bubble());
  out += buf;
  return out;
}

std::string chrome_trace_json(const Timeline& t) {
  std::string out = "{\"traceEvents\":[\n";
  char buf[256];
  bool first = true;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    std::snprintf(buf, sizeof buf, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%zu,\"args\":{\"name\":\"rank %zu\"}}",
                  first ? "" : ",\n", r, r);
    out += buf;
    first = false;
    for (const auto& e : t.ranks[r]) {
      const char* letter = e.kind == Kind::forward ? "F" : e.kind == Kind::weight ? "W" : "B";
      std::string name = e.kind == Kind::comm ? "send/recv" : letter + std::to_string(e.micro);
      std::snprintf(buf, sizeof buf,
                    ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%zu,\"ts\":%.3f,\"dur\":%.3f,"
                    "\"args\":{\"micro\":%d,\"chunk\":%d,\"link_us\":%.3f}}",
                    name.c_str(), e.kind == Kind::comm ? "comm" : "compute", r, e.start * 1e6, (e.end - e.start) * 1e6,
                    e.micro, e.chunk, e.link_s * 1e6);
      out += buf;
    }
  }
  out += "\n]}\n";
  return out;
}

void write_trace(const Timeline& t, const std::string& path) {
  auto ends_with = [&](const std::string& ext) {
    return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  };
  SL_CHECK(ends_with(".svg") || ends_with(".json"), "--trace ", path, ": the file must end in .svg or .json");
  std::ofstream file(path);
  SL_CHECK(file.good(), "--trace: cannot write ", path);
  file << (ends_with(".svg") ? svg(t) : chrome_trace_json(t));
}

Timeline gather_timeline(const std::vector<TimelineEvent>& mine, ProcessGroup& group, int micro_batches) {
  constexpr int kFields = 6;
  // Each event is 6 doubles (kind, micro, chunk, start, end, link_s); the lists are padded to the longest.
  const int n = group.size();
  Tensor count = full({1}, static_cast<double>(mine.size()), TensorOptions(DType::f64));
  Tensor counts = Tensor::empty({n}, TensorOptions(DType::f64));
  group.all_gather(counts, count);
  const std::vector<double> sizes = counts.to_vector();  // from a GPU too
  const int64_t longest = static_cast<int64_t>(*std::max_element(sizes.begin(), sizes.end()));
  std::vector<double> rows(static_cast<size_t>(std::max<int64_t>(longest, 1) * kFields), 0.0);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& e = mine[i];
    double row[kFields] = {static_cast<double>(e.kind), static_cast<double>(e.micro), static_cast<double>(e.chunk),
                           e.start, e.end, e.link_s};
    std::copy(row, row + kFields, rows.begin() + static_cast<long>(kFields * i));
  }
  // Built and read on the host, moved on the group's device (a GPU rank's under NCCL).
  Tensor packed = from_vector(rows, Shape({static_cast<int64_t>(rows.size())}), DType::f64);
  Tensor all = Tensor::empty({n * packed.numel()}, TensorOptions(DType::f64));
  group.all_gather(all, packed);
  const std::vector<double> gathered = all.to_vector();
  const double* a = gathered.data();
  Timeline t;
  t.micro_batches = micro_batches;
  t.ranks.resize(n);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < static_cast<int64_t>(sizes[r]); ++i) {
      const double* row = a + r * packed.numel() + kFields * i;
      t.ranks[r].push_back({static_cast<Kind>(static_cast<int>(row[0])), static_cast<int>(row[1]),
                            static_cast<int>(row[2]), row[3], row[4], row[5]});
    }
  return t;
}

}  // namespace sl::parallel
