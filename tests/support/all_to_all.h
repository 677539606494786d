// tests/support/all_to_all.h — what the all_to_all tests share (threads, MPI): inputs whose every value
// says where it goes, the outputs those must give, and the rules that make uneven splits.
//
//   stamp(from, to, i)        element i of the chunk rank `from` sends rank `to`: 1000·from + 100·to + i
//   input_of(r, rows_to, row) rank r's input: rows_to[d] rows (each of shape `row`) for every rank d
//   expected_output(r, rows_from, row_numel)   chunk s = what rank s put in its chunk for r
//   SplitRule                 how many rows rank `from` sends rank `to`; both sides derive their
//                             splits from it (input_splits from the sender's side, output from the receiver's)
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "tests/support/parallel.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl::parallel {

// Integers below 2^24 (chunks of under 100 elements, worlds under 10): exact in f32, f64 and i64.
inline double stamp(int from, int to, int64_t i) { return 1000.0 * from + 100.0 * to + static_cast<double>(i); }

// [rows, row...]: the shape of `rows` rows of shape `row`.
inline Shape stacked(int64_t rows, const Shape& row) {
  Shape shape({rows});
  shape.insert(shape.end(), row.begin(), row.end());
  return shape;
}

inline int64_t sum_of(const std::vector<int64_t>& rows) {
  return std::accumulate(rows.begin(), rows.end(), int64_t{0});
}

inline Tensor input_of(int r, const std::vector<int64_t>& rows_to, const Shape& row, DType dtype) {
  std::vector<double> values;
  for (int d = 0; d < static_cast<int>(rows_to.size()); ++d)
    for (int64_t i = 0; i < rows_to[d] * row.numel(); ++i) values.push_back(stamp(r, d, i));
  return from_vector(values, stacked(sum_of(rows_to), row), dtype);
}

inline std::vector<double> expected_output(int r, const std::vector<int64_t>& rows_from, int64_t row_numel) {
  std::vector<double> values;
  for (int s = 0; s < static_cast<int>(rows_from.size()); ++s)
    for (int64_t i = 0; i < rows_from[s] * row_numel; ++i) values.push_back(stamp(s, r, i));
  return values;
}

struct SplitRule {
  std::string name;
  std::function<int64_t(int from, int to)> rows;
};

// (from + to + 1) % 3 rows: 0, 1 or 2, so some chunks are empty and every rank's splits differ.
// "rank 0 sends nothing": its input has 0 rows (the row size then comes from its output).
inline std::vector<SplitRule> split_rules() {
  return {
      {"(from+to+1)%3", [](int from, int to) { return int64_t{(from + to + 1) % 3}; }},
      {"rank 0 sends nothing", [](int from, int to) { return from == 0 ? int64_t{0} : int64_t{1 + (from + to) % 2}; }}};
}

// Rank r's input_splits: what it sends each rank d.
inline std::vector<int64_t> rows_sent_by(const SplitRule& rule, int r, int n) {
  std::vector<int64_t> rows(n);
  for (int d = 0; d < n; ++d) rows[d] = rule.rows(r, d);
  return rows;
}

// Rank r's output_splits: what each rank s sends it.
inline std::vector<int64_t> rows_received_by(const SplitRule& rule, int r, int n) {
  std::vector<int64_t> rows(n);
  for (int s = 0; s < n; ++s) rows[s] = rule.rows(s, r);
  return rows;
}

// The threads backend even under mpirun, with a short timeout: a broken exchange fails in seconds.
inline LaunchOptions threads_options(int timeout_ms = 5000, bool debug = false) {
  return quick_on(Backend::threads, timeout_ms, debug);
}

}  // namespace sl::parallel
