// mesh.h — the device mesh: every rank placed on one 6-D grid, with a process group per dimension.
//
//   ParallelismConfig{dp_replicate, dp_shard, pp, cp, tp, ep} (Accelerate's names) splits the world:
//     dp_replicate  data parallel, full replicas (DDP; the "replicate" half of HSDP)
//     dp_shard      data parallel, sharded (ZeRO / FSDP)
//     pp            pipeline stages       cp  context (sequence) parallel      tp  tensor parallel
//     ep            expert parallel: a mixture of experts' experts split over ep ranks, which for
//                   every other weight are data-parallel ranks (mesh_dim.h)
//   The grid is arange(world).view(pp, dp_replicate, dp_shard, ep, cp, tp), as torchtitan lays it out: TP
//   innermost, so consecutive ranks share a TP group and the chattiest parallelism (an all-reduce
//   per layer) stays inside a node; PP outermost, since a stage boundary moves one activation per
//   micro-batch and tolerates the slowest links. ep sits between data parallelism and cp, where
//   Megatron's order tp-cp-ep-dp-pp (fastest first) puts it: its two all-to-alls per MoE layer want
//   faster links than data parallelism's one gradient reduction per step, slower than cp's ring.
//
//   world 8 = pp 2 x dp 2 x tp 2  (dp_replicate 2)          rank = (pp * 2 + dp) * 2 + tp
//
//                     tp 0  tp 1
//        pp 0  dp 0     0     1     <- a tp group: neighbours, one node, the fastest links
//              dp 1     2     3
//        pp 1  dp 0     4     5
//              dp 1     6     7
//
//        tp groups {0,1} {2,3} {4,5} {6,7}     vary tp, hold the rest
//        dp groups {0,2} {1,3} {4,6} {5,7}     vary dp
//        pp groups {0,4} {1,5} {2,6} {3,7}     vary pp (the outermost, farthest apart)
//
//   A group over a set of dimensions holds the ranks that agree on every *other* coordinate; its
//   group ranks follow the world ranks (row-major over the set). Dimensions are MeshDims (mesh_dim.h).
//   Named products: MeshDim::dp = dp_replicate x dp_shard x ep (all of data parallelism), dp_shard_cp =
//   dp_shard x ep x cp (what FSDP shards over when CP is on: CP ranks hold the same weights), dp_cp =
//   dp_replicate x dp_shard x ep x cp (where gradients are averaged); expert_dp_cp and
//   expert_dp_shard_cp, the same without ep, for an expert's weights. Any other set:
//   group({MeshDim::pp, MeshDim::tp}).
//
//   Cost: the constructor is collective over the world (every rank builds the mesh with the same
//   config): one all_gather of the 6 degrees (all ranks must agree), then one split per distinct
//   group. Sets that differ only by size-1 dimensions have the same members and share one group
//   handle, so k dimensions of size > 1 cost 2^k - 1 splits (the set of all of them is the world
//   itself). Every group is made there, in a fixed order; lookups afterwards never communicate.
//
//   Lesson: lessons/14_nd_parallel.cpp draws the mesh rank by rank   Tests: tests/parallel/comm/test_mesh.cpp
#pragma once
#include <array>
#include <string>
#include <vector>

#include "parallel/comm/mesh_dim.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel {

struct ParallelismConfig {
  int dp_replicate = 1, dp_shard = 1, pp = 1, cp = 1, tp = 1;
  int ep = 1;  // expert parallel: a mixture of experts' experts split over ep ranks (mesh_dim.h)

  // dp_replicate * dp_shard * pp * cp * tp * ep (throws if a degree is < 1 or the product overflows int).
  int world_size() const;
  // Throws sl::Error unless every degree is >= 1 and their product is world_size:
  //   "ParallelismConfig: world size 8 != dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 3"
  void validate(int world_size) const;
  // "dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 3" (the fields' order), then " x ep 2" when ep > 1.
  std::string str() const;
  // The degrees in grid order (kGridDims), outermost first: pp, dp_replicate, dp_shard, ep, cp, tp.
  std::array<int, kGridDimCount> degrees() const { return {pp, dp_replicate, dp_shard, ep, cp, tp}; }
  bool operator==(const ParallelismConfig&) const = default;
};

class DeviceMesh {
 public:
  static constexpr int kDims = kGridDimCount;

  // Collective over `world`: every member calls it with the same config. Throws sl::Error before
  // any communication when the config does not fit world->size(). Ranks are ranks of `world`
  // (normally the whole world; a mesh may also be laid over a sub-group).
  DeviceMesh(ProcessGroupPtr world, const ParallelismConfig& config);

  const ParallelismConfig& config() const { return config_; }
  const ProcessGroupPtr& world() const { return world_; }
  int rank() const { return rank_; }
  int world_size() const { return world_->size(); }

  // This rank's index along a dimension or a named product (the product's row-major index, which
  // is also the rank in its group): coordinate(MeshDim::tp) == group(MeshDim::tp)->rank().
  int coordinate(MeshDim dim) const;
  int size(MeshDim dim) const;  // the degree (a product's: the product)
  std::array<int, kDims> coordinates() const { return coords_; }  // in kGridDims order
  int pp_rank() const { return coordinate(MeshDim::pp); }
  int dp_replicate_rank() const { return coordinate(MeshDim::dp_replicate); }
  int dp_shard_rank() const { return coordinate(MeshDim::dp_shard); }
  int ep_rank() const { return coordinate(MeshDim::ep); }
  int cp_rank() const { return coordinate(MeshDim::cp); }
  int tp_rank() const { return coordinate(MeshDim::tp); }
  int dp_rank() const { return coordinate(MeshDim::dp); }

  // This rank's group over one dimension or over a set (dimensions or products, united).
  // Never communicates. A size-1 dimension gives a trivial group (this rank alone).
  ProcessGroupPtr group(MeshDim dim) const;
  ProcessGroupPtr group(const MeshDims& dims) const;

  // The world ranks in this rank's group, ascending (= group rank order); no communication.
  std::vector<int> members(MeshDim dim) const;
  // Every group of that kind, each as its world ranks: the partition of the world it induces.
  std::vector<std::vector<int>> partition(MeshDim dim) const;
  // members() without a mesh or any communication: `rank`'s group over `dims` (dimensions or
  // products, united) in a mesh of `config`. The planner's question: who would talk to whom.
  static std::vector<int> group_members(const ParallelismConfig& config, const MeshDims& dims, int rank);

  // The grid with this rank marked, then the groups of every dimension and product of size > 1.
  std::string str() const;

 private:
  using Mask = GridMask;  // bit d set: dimension kGridDims[d] is in the set
  ProcessGroupPtr group_of(Mask mask) const;
  std::vector<int> members_of(Mask mask, int rank) const;
  std::vector<std::vector<int>> partition_of(Mask mask) const;
  std::array<int, kDims> coordinates_of(int rank) const;
  void check_ranks_agree() const;

  ProcessGroupPtr world_;
  ParallelismConfig config_;
  std::array<int, kDims> degrees_{};
  std::array<int, kDims> coords_{};
  int rank_ = 0;
  Mask nontrivial_ = 0;                                // the dimensions of size > 1
  std::array<ProcessGroupPtr, 1u << kDims> groups_{};  // indexed by mask & nontrivial_
};

}  // namespace sl::parallel
