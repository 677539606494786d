// divergence_report.cpp — see divergence.h: the first divergence, in words, and the whole table as JSON.
#include <cstdio>
#include <sstream>

#include "parallel/train/divergence.h"

namespace sl::parallel {

// The rows are sorted by step, phase and place (find_divergence): the first that diverged.
const Comparison* DivergenceReport::first() const {
  for (const Comparison& c : rows)
    if (c.diverged()) return &c;
  return nullptr;
}

std::vector<const Comparison*> DivergenceReport::at_same_place(const Comparison& row) const {
  std::vector<const Comparison*> out;
  for (const Comparison& c : rows)
    if (c.step == row.step && c.phase == row.phase && c.name == row.name && c.diverged()) out.push_back(&c);
  return out;
}

namespace {

std::string index_text(const std::vector<int64_t>& index) {
  std::string out = "[";
  for (size_t i = 0; i < index.size(); ++i) out += (i ? ", " : "") + std::to_string(index[i]);
  return out + "]";
}

}  // namespace

std::string first_divergence_text(const DivergenceReport& report) {
  std::ostringstream out;
  char line[400];
  for (const std::string& f : report.faults) out << "planted: " << f << "\n";
  out << "bounds:\n";
  for (const std::string& d : report.derivation) out << "  " << d << "\n";
  for (const std::string& why : report.uncompared) out << "not compared: " << why << "\n";
  const Comparison* first = report.first();
  if (first == nullptr) {
    out << "no divergence: " << report.rows.size() << " comparisons, every element within its bound\n";
    return out.str();
  }
  std::snprintf(line, sizeof line, "FIRST DIVERGENCE: step %d, %s, %s\n", first->step, first->phase.c_str(),
                first->name.c_str());
  out << line;
  for (const Comparison* c : report.at_same_place(*first)) {
    std::snprintf(line, sizeof line,
                  "  rank %d (%s): %lld of %lld elements over the bound, max |layout - serial| %.3g, worst %.3g x its bound\n",
                  c->rank, c->coordinates.c_str(), (long long)c->over, (long long)c->elements, c->max_error, c->worst_ratio);
    out << line;
  }
  out << "  bound: " << first->bound << "\n  largest (serial index: layout vs serial, bound):\n";
  for (const DivergentElement& e : first->largest) {
    std::snprintf(line, sizeof line, "    %s: %.6g vs %.6g (bound %.3g)\n", index_text(e.index).c_str(), e.layout, e.serial,
                  e.bound);
    out << line;
  }
  return out.str();
}

nlohmann::json divergence_json(const DivergenceReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Comparison& c : report.rows) {
    nlohmann::json largest = nlohmann::json::array();
    for (const DivergentElement& e : c.largest)
      largest.push_back({{"index", e.index}, {"layout", e.layout}, {"serial", e.serial}, {"bound", e.bound}});
    rows.push_back({{"step", c.step}, {"phase", c.phase}, {"name", c.name}, {"rank", c.rank},
                    {"coordinates", c.coordinates}, {"elements", c.elements}, {"over", c.over},
                    {"max_error", c.max_error}, {"worst_ratio", c.worst_ratio}, {"bound", c.bound},
                    {"largest", largest}});
  }
  nlohmann::json out{{"rows", rows}, {"bounds", report.derivation}, {"not_compared", report.uncompared},
                     {"planted", report.faults}, {"diverged", report.first() != nullptr}};
  if (const Comparison* f = report.first())
    out["first"] = {{"step", f->step}, {"phase", f->phase}, {"name", f->name}, {"rank", f->rank}, {"coordinates", f->coordinates}};
  return out;
}

}  // namespace sl::parallel
