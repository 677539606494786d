// divergence_compare.cpp — see divergence_compare.h.
#include "parallel/train/divergence_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tensor/error.h"

namespace sl::parallel {

double NoiseBound::at(double serial, double scale) const {
  return relative() * (std::fabs(serial) + scale) + 2 * unit * std::fabs(serial);
}

std::string NoiseBound::str() const {
  char text[200];
  std::snprintf(text, sizeof text, "%g·r·(|s| + rms s) + 2u·|s|, r = %.3g (%s vs f64), u = 2^%d", kFactor, noise,
                dtype.c_str(), static_cast<int>(std::lround(std::log2(unit))));
  return text;
}

double measured_noise(const std::vector<double>& serial, const std::vector<double>& exact) {
  SL_ASSERT(serial.size() == exact.size());
  const double scale = rms(serial);
  double noise = 0;
  for (size_t j = 0; j < serial.size(); ++j) {
    const double magnitude = std::fabs(serial[j]) + scale;
    if (magnitude > 0) noise = std::max(noise, std::fabs(serial[j] - exact[j]) / magnitude);
  }
  return noise;
}

double rms(const std::vector<double>& values) {
  double squares = 0;
  for (double v : values) squares += v * v;
  return values.empty() ? 0 : std::sqrt(squares / static_cast<double>(values.size()));
}

void check_element(Comparison& row, std::vector<int64_t> index, double layout, double serial, double bound) {
  ++row.elements;
  const double error = std::fabs(layout - serial);
  const bool nan_one_side = std::isnan(layout) != std::isnan(serial);
  if (std::isnan(layout) && std::isnan(serial)) return;
  const double ratio = nan_one_side ? INFINITY : bound > 0 ? error / bound : (error > 0 ? INFINITY : 0);
  if (!nan_one_side) row.max_error = std::max(row.max_error, error);
  if (!(ratio > 1)) {
    row.worst_ratio = std::max(row.worst_ratio, ratio);
    return;
  }
  ++row.over;
  row.worst_ratio = std::max(row.worst_ratio, ratio);
  auto worse = [](const DivergentElement& a, const DivergentElement& b) {
    const double ra = std::fabs(a.layout - a.serial) / std::max(a.bound, 1e-300);
    const double rb = std::fabs(b.layout - b.serial) / std::max(b.bound, 1e-300);
    return std::isnan(a.layout) || ra > rb;
  };
  row.largest.push_back({std::move(index), layout, serial, bound});
  std::sort(row.largest.begin(), row.largest.end(), worse);
  if (row.largest.size() > 4) row.largest.pop_back();
}

std::vector<int64_t> RankCut::positions() const {
  std::vector<int64_t> out;
  const int rings = cp / ulysses, ring = cp_rank / ulysses, piece = cp_rank % ulysses;
  // The ring shard's chunks: contiguous, one of T/R; zigzag, chunks ring and 2R-1-ring of T/(2R).
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [begin, length)
  if (zigzag) {
    const int64_t len = tokens / (2 * rings);
    chunks = {{ring * len, len}, {(2 * rings - 1 - ring) * len, len}};
  } else {
    const int64_t len = tokens / rings;
    chunks = {{ring * len, len}};
  }
  for (const auto& [begin, length] : chunks) {
    const int64_t part = length / ulysses;
    for (int64_t i = 0; i < part; ++i) out.push_back(begin + piece * part + i);
  }
  return out;
}

std::string compare_output(const RankCut& cut, int micro, const Tensor& layout, const Tensor& serial,
                           const NoiseBound& bound, Comparison& row) {
  const bool positions_only = serial.dim() == 2;  // wpe: [T, C]
  const int seq_dim = positions_only ? 0 : 1;
  if (layout.dim() != serial.dim()) return "rank dims " + layout.shape().str() + " vs serial " + serial.shape().str();
  // Rows of the serial batch.
  const int64_t rows_per_micro = cut.batch / (cut.dp * cut.micro_batches);
  const int64_t first_row = cut.micro_major ? micro * (cut.batch / cut.micro_batches) + cut.dp_rank * rows_per_micro
                                            : cut.dp_rank * (cut.batch / cut.dp) + micro * rows_per_micro;
  if (!positions_only && layout.size(0) != rows_per_micro)
    return "rows " + std::to_string(layout.size(0)) + ", expected " + std::to_string(rows_per_micro);
  // Tokens: the cp shard's positions, under SP this tp rank's part of them.
  std::vector<int64_t> positions = cut.positions();
  const int64_t local = layout.size(seq_dim);
  if (local * cut.tp == static_cast<int64_t>(positions.size()) && cut.tp > 1) {
    positions = std::vector<int64_t>(positions.begin() + cut.tp_rank * local, positions.begin() + (cut.tp_rank + 1) * local);
  } else if (local != static_cast<int64_t>(positions.size())) {
    return "tokens " + std::to_string(local) + ", expected " + std::to_string(positions.size());
  }
  // Columns: whole, or this tp rank's vocabulary rows of the head.
  const int64_t width = layout.size(-1), serial_width = serial.size(-1);
  int64_t first_col = 0;
  if (width != serial_width) {
    const int64_t per_rank = (cut.vocab + cut.tp - 1) / cut.tp;
    if (width != per_rank) return "columns " + std::to_string(width) + ", expected " + std::to_string(serial_width);
    first_col = cut.tp_rank * per_rank;
  }
  const std::vector<double> s = serial.to_vector(), l = layout.to_vector();
  const double scale = rms(s);
  row.bound = bound.str();
  const int64_t nrows = positions_only ? 1 : layout.size(0);
  const int64_t T = serial.size(seq_dim);
  for (int64_t i = 0; i < nrows; ++i)
    for (int64_t j = 0; j < local; ++j)
      for (int64_t c = 0; c < width && first_col + c < serial_width; ++c) {
        const int64_t srow = first_row + i, spos = positions[j], scol = first_col + c;
        const double sv = s[((positions_only ? 0 : srow) * T + spos) * serial_width + scol];
        const double lv = l[(i * local + j) * width + c];
        std::vector<int64_t> index = positions_only ? std::vector<int64_t>{spos, scol} : std::vector<int64_t>{srow, spos, scol};
        check_element(row, std::move(index), lv, sv, bound.at(sv, scale));
      }
  return "";
}

void compare_region(const Region& region, const std::vector<int64_t>& global_shape, const std::vector<double>& run,
                    int64_t local_offset, const std::vector<double>& serial, const std::vector<double>& bounds,
                    Comparison& row) {
  const size_t dims = global_shape.size();
  SL_ASSERT(region.offsets.size() == dims && region.lengths.size() == dims);
  std::vector<int64_t> index(dims);
  for (int64_t f = region.flat_begin; f < region.flat_end; ++f) {
    int64_t rest = f, flat = 0;
    for (size_t d = dims; d-- > 0;) {  // the box's row-major index, then the global one
      index[d] = region.offsets[d] + rest % region.lengths[d];
      rest /= region.lengths[d];
    }
    for (size_t d = 0; d < dims; ++d) flat = flat * global_shape[d] + index[d];
    check_element(row, index, run.at(local_offset + (f - region.flat_begin)), serial.at(flat), bounds.at(flat));
  }
}

}  // namespace sl::parallel
