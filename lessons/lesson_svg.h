// lesson_svg.h — small pictures for the lessons' --svg DIR (header-only): a canvas of boxes, lines and
// text, and a bar chart (memory per rank, bytes per group) with an optional formula mark per bar.
// Pipeline timelines use the library's own writer instead (parallel/pipeline/timeline.h: svg()).
//
//   lesson::Canvas canvas(400, 120);
//   canvas.box(10, 10, 80, 30, "#4c78a8", "rank 0");
//   canvas.arrow(90, 25, 150, 25);
//   lesson::write_picture(dir, "ring.svg", canvas.str());
//
//   lesson::BarChart chart("ZeRO-3 model states per rank", "KiB");
//   chart.bar("rank 0", 123.0, /*mark=*/120.0);      // the mark: what the paper's formula says
//   lesson::write_picture(dir, "memory.svg", chart.svg());
#pragma once
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lesson {

// Escapes text for SVG.
inline std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

class Canvas {
 public:
  Canvas(double width, double height) : width_(width), height_(height) {}

  void box(double x, double y, double w, double h, const std::string& fill, const std::string& label = "") {
    body_ << "<rect x='" << x << "' y='" << y << "' width='" << w << "' height='" << h << "' fill='" << fill
          << "' stroke='#333' stroke-width='0.5'/>\n";
    if (!label.empty()) text(x + w / 2, y + h / 2 + 4, label, 11, "middle");
  }
  void line(double x1, double y1, double x2, double y2, const std::string& stroke = "#333", double width = 1) {
    body_ << "<line x1='" << x1 << "' y1='" << y1 << "' x2='" << x2 << "' y2='" << y2 << "' stroke='" << stroke
          << "' stroke-width='" << width << "'/>\n";
  }
  // A line through the points {x, y}, in order (a curve over steps).
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke = "#333", double width = 1) {
    body_ << "<polyline fill='none' stroke='" << stroke << "' stroke-width='" << width << "' points='";
    for (const auto& [x, y] : points) body_ << x << ',' << y << ' ';
    body_ << "'/>\n";
  }
  void arrow(double x1, double y1, double x2, double y2, const std::string& stroke = "#333") {
    body_ << "<line x1='" << x1 << "' y1='" << y1 << "' x2='" << x2 << "' y2='" << y2 << "' stroke='" << stroke
          << "' stroke-width='1.2' marker-end='url(#arrow)'/>\n";
  }
  void text(double x, double y, const std::string& words, int size = 12, const std::string& anchor = "start") {
    body_ << "<text x='" << x << "' y='" << y << "' font-size='" << size << "' text-anchor='" << anchor
          << "' font-family='monospace'>" << svg_escape(words) << "</text>\n";
  }
  std::string str() const {
    std::ostringstream out;
    out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width_ << "' height='" << height_ << "'>\n"
        << "<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='3' orient='auto'>"
        << "<path d='M0,0 L7,3 L0,6 z' fill='#333'/></marker></defs>\n"
        << "<rect width='100%' height='100%' fill='white'/>\n"
        << body_.str() << "</svg>\n";
    return out.str();
  }

 private:
  double width_, height_;
  std::ostringstream body_;
};

// Horizontal bars, one per row, scaled to the largest value (or mark); a mark is a red tick.
class BarChart {
 public:
  BarChart(std::string title, std::string unit) : title_(std::move(title)), unit_(std::move(unit)) {}

  void bar(const std::string& label, double value, double mark = -1, const std::string& fill = "#4c78a8") {
    rows_.push_back({label, value, mark, fill});
  }

  std::string svg() const {
    const double label_w = 170, bar_w = 360, row_h = 22, top = 34;
    double most = 1e-300;
    for (const Row& row : rows_) most = std::max({most, row.value, row.mark});
    Canvas canvas(label_w + bar_w + 110, top + row_h * rows_.size() + 26);
    canvas.text(10, 20, title_, 14);
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& row = rows_[i];
      const double y = top + row_h * i;
      canvas.text(label_w - 6, y + 15, row.label, 11, "end");
      canvas.box(label_w, y + 3, bar_w * row.value / most, row_h - 6, row.fill);
      char value[48];
      std::snprintf(value, sizeof value, "%.4g %s", row.value, unit_.c_str());
      canvas.text(label_w + bar_w * row.value / most + 6, y + 15, value, 11);
      if (row.mark >= 0) canvas.line(label_w + bar_w * row.mark / most, y, label_w + bar_w * row.mark / most, y + row_h, "#d62728", 2);
    }
    bool marked = false;
    for (const Row& row : rows_) marked = marked || row.mark >= 0;
    if (marked) canvas.text(label_w, top + row_h * rows_.size() + 16, "red tick: the formula", 11);
    return canvas.str();
  }

 private:
  struct Row {
    std::string label;
    double value, mark;
    std::string fill;
  };
  std::string title_, unit_;
  std::vector<Row> rows_;
};

}  // namespace lesson
