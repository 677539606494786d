// traffic_book.h — the cost model's tally of one step's traffic (traffic_model.cpp), keyed by group:
// a mesh group by its set of dims (those of size 1 dropped, as DeviceMesh shares one handle among
// sets that differ only by them), or a group of its own ("loss", "pp_tied_wte"). finish() names
// each group once, by the first name the trainer gives it, and lists its world ranks.
#pragma once
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/mesh_dim.h"
#include "parallel/planner/cost_model.h"
#include "parallel/planner/rank_part.h"

namespace sl::parallel::planner {

constexpr int64_t kBucketBytes = int64_t{1} << 20;  // DDPOptions and ZeroOptions' bucket_bytes
// What a step moves, per group and op; bytes are one call's, times calls.
class Book {
 public:
  Book(const TrainPlan& plan, int rank) : plan_(plan), rank_(rank), coords_(mesh_coordinates(plan.parallelism, rank)) {
    const auto degrees = plan.parallelism.degrees();
    for (int d = 0; d < kGridDimCount; ++d)
      if (degrees[d] > 1) nontrivial_ |= 1u << d;
  }
  int size(const MeshDims& dims) const {
    int n = 1;
    const auto degrees = plan_.parallelism.degrees();
    const GridMask mask = grid_mask(dims);
    for (int d = 0; d < kGridDimCount; ++d)
      if (mask & (1u << d)) n *= degrees[d];
    return n;
  }
  int rank_in(const MeshDims& dims) const {  // row-major over the set's dims
    int r = 0;
    const auto degrees = plan_.parallelism.degrees();
    const GridMask mask = grid_mask(dims);
    for (int d = 0; d < kGridDimCount; ++d)
      if (mask & (1u << d)) r = r * degrees[d] + coords_[d];
    return r;
  }
  void all_reduce(const MeshDims& dims, int64_t count, int64_t es, int64_t calls = 1) {
    add(key(dims), CommOp::all_reduce, calls, ring_all_reduce(count, es, size(dims), rank_in(dims)));
  }
  void all_gather(const MeshDims& dims, int64_t input_bytes, int64_t calls = 1) {
    add(key(dims), CommOp::all_gather, calls, ring_all_gather(input_bytes, size(dims)));
  }
  void reduce_scatter(const MeshDims& dims, int64_t output_bytes, int64_t calls = 1) {
    add(key(dims), CommOp::reduce_scatter, calls, ring_reduce_scatter(output_bytes, size(dims)));
  }
  void p2p(const MeshDims& dims, int64_t bytes, int64_t sends, int64_t receives) { own_p2p(key(dims), bytes, sends, receives); }
  // all_to_all of input_bytes per call (equal chunks): (n-1)/n of it leaves, as much arrives.
  void all_to_all(const MeshDims& dims, int64_t input_bytes, int64_t calls = 1) {
    own_all_to_all(key(dims), size(dims), input_bytes, calls);
  }
  void own_all_to_all(const std::string& name, int n, int64_t input_bytes, int64_t calls) {
    const int64_t moved = input_bytes / n * (n - 1);
    add(name, CommOp::all_to_all, calls, {moved, moved});
  }
  // A mesh group's all-to-all under a name of its own, whatever else shares its ranks (the "ep"
  // exchange: at dp_replicate x dp_shard 1 the ep group is also dp's, whose name would win).
  void named_all_to_all(const std::string& name, const MeshDims& dims, int64_t input_bytes, int64_t calls);
  void own_p2p(const std::string& name, int64_t bytes, int64_t sends, int64_t receives) {
    add(name, CommOp::send, sends, {bytes, 0});
    add(name, CommOp::recv, receives, {0, bytes});
  }
  void own_all_reduce(const std::string& name, int n, int r, int64_t count, int64_t es) {
    add(name, CommOp::all_reduce, 1, ring_all_reduce(count, es, n, r));
  }
  // `names`: the trainer's, in its order; each names the group of its dims.
  std::vector<GroupTraffic> finish(const MeshDims& names) const;

 private:
  // A mesh group's key: '#' and its set's grid mask, size-1 dims dropped; own groups go by name.
  std::string key(const MeshDims& dims) const { return "#" + std::to_string(grid_mask(dims) & nontrivial_); }
  void add(const std::string& group, CommOp op, int64_t calls, RingBytes bytes) {
    GroupTraffic& t = entries_[{group, static_cast<int>(op)}];
    t.op = op;
    t.calls += calls;
    t.bytes_sent += calls * bytes.sent;  // bytes: one call's
    t.bytes_received += calls * bytes.received;
  }
  const TrainPlan& plan_;
  int rank_;
  std::array<int, kGridDimCount> coords_;
  GridMask nontrivial_ = 0;
  std::map<std::pair<std::string, int>, GroupTraffic> entries_;
};

}  // namespace sl::parallel::planner
