// exercises/20_mesh_groups/grader.cpp — grades a rank's coordinates and groups on a mesh laid out in any order.
//
// The library's DeviceMesh has one order, [pp, dp_replicate, dp_shard, ep, cp, tp]. A mesh in another order
// is the library's mesh over permuted degrees: grid position i gets the degree of order[i], so
// DeviceMesh::group_members over a config of those degrees, asked about the positions that `order`
// gives a set's dimensions, names the set's group in that order; a dimension's coordinate is the rank's
// index in its group. That composition is the reference (the SL_SOLUTION branch), and a real
// DeviceMesh on thread ranks (parallel/comm/launch.h) built over the permuted degrees checks it. A wrong
// answer is compared with the mistakes students make: the order read fastest first, shardlab's own
// order taken instead of `order`, coordinates filed by position, a product taken as one dimension.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"

using namespace sl::parallel;
using exercises::expect;
using Coordinates = std::array<int, 6>;
using GridOrder = std::array<MeshDim, 6>;

namespace exercise20 {
double predicted_pp_partner();
Coordinates mesh_coordinates(const ParallelismConfig& config, const GridOrder& order, int rank);
std::vector<int> mesh_group(const ParallelismConfig& config, const GridOrder& order, MeshDim dim, int rank);
}  // namespace exercise20

constexpr GridOrder kShardlab = {MeshDim::pp, MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::ep, MeshDim::cp, MeshDim::tp};
// Megatron-LM's "tp-cp-ep-pp-dp" (written fastest first): the stages inside data parallelism.
constexpr GridOrder kMegatronPpInsideDp = {MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::pp,
                                           MeshDim::ep,           MeshDim::cp,       MeshDim::tp};
// HSDP's replicas outermost, the stages between them and the shards: dp and dp_cp split by pp.
constexpr GridOrder kReplicasOutside = {MeshDim::dp_replicate, MeshDim::pp, MeshDim::dp_shard, MeshDim::ep, MeshDim::cp, MeshDim::tp};
constexpr GridOrder kTpOutermost = {MeshDim::tp, MeshDim::cp, MeshDim::ep, MeshDim::dp_shard, MeshDim::dp_replicate, MeshDim::pp};

static GridOrder reversed(GridOrder order) {
  std::reverse(order.begin(), order.end());
  return order;
}

// The grid dimensions (indices into kGridDims) `dim` covers: itself, or a product's parts (mesh_dim.h).
static std::vector<int> dims_of(MeshDim dim) {
  std::vector<int> dims;
  for (MeshDim part : grid_dims(grid_mask(dim))) dims.push_back(grid_index(part));
  return dims;
}

// The library's config whose grid position i has the degree of order[i].
static ParallelismConfig laid_out(const ParallelismConfig& config, const GridOrder& order) {
  const Coordinates degrees = config.degrees();
  Coordinates permuted{};
  for (size_t position = 0; position < 6; ++position) permuted[position] = degrees[static_cast<size_t>(grid_index(order[position]))];
  return ParallelismConfig{.dp_replicate = permuted[1], .dp_shard = permuted[2], .pp = permuted[0], .cp = permuted[4],
                           .tp = permuted[5], .ep = permuted[3]};
}

// `rank`'s group over the grid dimensions `dims` on the grid laid out in `order`: the library's group
// over the positions `order` gives them.
static std::vector<int> members_in_order(const ParallelismConfig& config, const GridOrder& order, const std::vector<int>& dims,
                                         int rank) {
  MeshDims positions;
  for (size_t position = 0; position < 6; ++position)
    if (std::find(dims.begin(), dims.end(), grid_index(order[position])) != dims.end()) positions.push_back(kGridDims[position]);
  return DeviceMesh::group_members(laid_out(config, order), positions, rank);
}

// A coordinate is the rank's index in its group along that one dimension (coordinate == group rank).
static Coordinates coordinates_in_order(const ParallelismConfig& config, const GridOrder& order, int rank) {
  Coordinates coords{};
  for (int d = 0; d < 6; ++d) {
    const std::vector<int> group = members_in_order(config, order, {d}, rank);
    coords[static_cast<size_t>(d)] = static_cast<int>(std::find(group.begin(), group.end(), rank) - group.begin());
  }
  return coords;
}

// The same coordinates filed by their position in `order` (coords[i] belongs to order[i]).
static Coordinates by_position(const Coordinates& by_dimension, const GridOrder& order) {
  Coordinates out{};
  for (size_t i = 0; i < 6; ++i) out[i] = by_dimension[static_cast<size_t>(grid_index(order[i]))];
  return out;
}

// The mistake for a product: one dimension of size (the parts' product) with its innermost part's
// stride, as if its parts sat next to each other in `order`.
static std::vector<int> product_as_one_dimension(const ParallelismConfig& config, const GridOrder& order, const std::vector<int>& dims,
                                                 int rank) {
  const Coordinates degrees = config.degrees(), coords = coordinates_in_order(config, order, rank);
  int stride = 1, innermost_stride = 0, base = rank, size = 1;
  for (int position = 5; position >= 0; --position) {
    const int d = grid_index(order[static_cast<size_t>(position)]);
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      if (innermost_stride == 0) innermost_stride = stride;
      base -= coords[static_cast<size_t>(d)] * stride;
      size *= degrees[static_cast<size_t>(d)];
    }
    stride *= degrees[static_cast<size_t>(d)];
  }
  std::vector<int> members;
  for (int k = 0; k < size; ++k) members.push_back(base + k * innermost_stride);
  return members;
}

#ifdef SL_SOLUTION
namespace solution {
// In {dp_replicate, dp_shard, pp, ep, cp, tp} the dimensions inside pp are ep, cp and tp: pp's stride is
// ep·cp·tp = 4, so rank 3 (pp 0) pairs with rank 3 + 4. In shardlab's order it would be 3 + 16/2 = 11.
double predicted_pp_partner() { return 3 + 2 * 2; }
Coordinates mesh_coordinates(const ParallelismConfig& config, const GridOrder& order, int rank) {
  return coordinates_in_order(config, order, rank);
}
std::vector<int> mesh_group(const ParallelismConfig& config, const GridOrder& order, MeshDim dim, int rank) {
  return members_in_order(config, order, dims_of(dim), rank);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise20;
#endif

static std::string spell(const std::vector<int>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out + "}";
}
static std::string spell(const Coordinates& c) { return spell(std::vector<int>(c.begin(), c.end())); }
static std::string spell(const GridOrder& order) {
  std::string out = "[";
  for (size_t i = 0; i < 6; ++i) out += (i ? ", " : "") + std::string(name(order[i]));
  return out + "]";
}
static std::string where(const ParallelismConfig& config, const GridOrder& order, int rank) {
  std::string degrees;
  for (MeshDim dim : order) degrees += (degrees.empty() ? "" : " x ") + std::string(name(dim)) + " " + std::to_string(config.degrees()[static_cast<size_t>(grid_index(dim))]);
  return "order " + spell(order) + ", mesh " + degrees + ", rank " + std::to_string(rank);
}

static void expect_coordinates(const ParallelismConfig& config, const GridOrder& order, int rank, const Coordinates& want) {
  const Coordinates got = impl::mesh_coordinates(config, order, rank);
  if (got == want) return;
  std::string why = "coordinates " + spell(got) + " (pp, dp_replicate, dp_shard, ep, cp, tp), the mesh says " + spell(want);
  if (got == coordinates_in_order(config, reversed(order), rank))
    why += ": that reads the order fastest first, as Megatron writes its strings; order[0] is the outermost, "
           "order[5] varies fastest";
  else if (got == coordinates_in_order(config, kShardlab, rank))
    why += ": that is shardlab's own order [pp, dp_replicate, dp_shard, ep, cp, tp], lesson 14's grid; lay the ranks out in `order`";
  else if (got == by_position(want, order))
    why += ": those are filed by their position in `order`; return them in grid order, coords[grid_index(order[i])]";
  else
    why += ": peel them off from the last dimension of `order`: coordinate = rank % degree, then rank /= degree";
  expect(false, where(config, order, rank) + ": " + why);
}

static void expect_group(const ParallelismConfig& config, const GridOrder& order, MeshDim dim, int rank) {
  const std::vector<int> dims = dims_of(dim);
  const std::vector<int> got = impl::mesh_group(config, order, dim, rank), want = members_in_order(config, order, dims, rank);
  if (got == want) return;
  const std::string dim_name(name(dim));
  std::string why = "the " + dim_name + " group is " + spell(got) + ", the mesh's is " + spell(want);
  // The student's groups are built from every rank's coordinates: are they right everywhere?
  bool coordinates_right = true;
  try {
    for (int other = 0; other < config.world_size() && coordinates_right; ++other)
      coordinates_right = impl::mesh_coordinates(config, order, other) == coordinates_in_order(config, order, other);
  } catch (const exercises::NotImplemented&) {
    coordinates_right = false;
  }
  // A grid dimension whose group this is: a product's own parts first, then the dimensions of size > 1
  // (a size-1 dimension's group is the rank alone, which any group of one matches).
  std::vector<int> candidates = dims.size() > 1 ? dims : std::vector<int>{};
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < 6; ++d)
      if (std::find(candidates.begin(), candidates.end(), d) == candidates.end() && (config.degrees()[static_cast<size_t>(d)] > 1) == (pass == 0))
        candidates.push_back(d);
  std::string other_dimension;
  bool part_of_product = false;
  for (int d : candidates)
    if (other_dimension.empty() && dims != std::vector<int>{d} && got == members_in_order(config, order, {d}, rank)) {
      other_dimension = name(kGridDims[static_cast<size_t>(d)]);
      part_of_product = std::find(dims.begin(), dims.end(), d) != dims.end();
    }
  if (dims.size() > 1 && got == product_as_one_dimension(config, order, dims, rank)) {
    why += ": that takes " + dim_name + " as one dimension with its innermost part's stride; in this order its parts are not "
           "neighbours, so its group is every rank that agrees on the other dimensions";
  } else if (!coordinates_right) {
    why += ": mesh_coordinates is wrong for some rank of this mesh: fix it first, the groups follow from the coordinates";
  } else if (part_of_product) {
    std::string parts;
    for (int d : dims) parts += (parts.empty() ? "" : " x ") + std::string(name(kGridDims[static_cast<size_t>(d)]));
    why += ": that is the " + other_dimension + " group only; " + dim_name + " is " + parts + ", its group spans them all";
  } else if (got == members_in_order(config, reversed(order), dims, rank)) {
    why += ": that is the group with the order read fastest first; order[0] is the outermost";
  } else if (got == members_in_order(config, kShardlab, dims, rank)) {
    why += ": that is the group in shardlab's own order [pp, dp_replicate, dp_shard, ep, cp, tp]; lay the ranks out in `order`";
  } else if (std::find(got.begin(), got.end(), rank) == got.end()) {
    why += ": it must hold the rank itself";
  } else if (got.size() == want.size() && !std::is_sorted(got.begin(), got.end())) {
    why += ": list the members ascending (the group rank order)";
  } else if (!other_dimension.empty()) {
    why += ": that is the " + other_dimension + " group: a stride of the wrong dimension";
  }
  expect(false, where(config, order, rank) + ": " + why);
}

static void expect_every_group(const ParallelismConfig& config, const GridOrder& order, int rank) {
  for (MeshDim dim : kGridDims) expect_group(config, order, dim, rank);
  for (MeshDim dim : kProductDims) expect_group(config, order, dim, rank);
}

// Every rank's coordinates first (a wrong group is most often wrong coordinates), then every group.
static void expect_mesh(const ParallelismConfig& config, const GridOrder& order) {
  for (int rank = 0; rank < config.world_size(); ++rank) expect_coordinates(config, order, rank, coordinates_in_order(config, order, rank));
  for (int rank = 0; rank < config.world_size(); ++rank) expect_every_group(config, order, rank);
}

// Every config of worlds 1..16: each degree >= 1, product <= 16.
static std::vector<ParallelismConfig> every_mesh() {
  std::vector<ParallelismConfig> meshes;
  for (int pp = 1; pp <= 16; ++pp)
    for (int r = 1; pp * r <= 16; ++r)
      for (int s = 1; pp * r * s <= 16; ++s)
        for (int c = 1; pp * r * s * c <= 16; ++c)
          for (int t = 1; pp * r * s * c * t <= 16; ++t)
            for (int e = 1; pp * r * s * c * t * e <= 16; ++e) meshes.push_back(ParallelismConfig{r, s, pp, c, t, e});
  return meshes;
}

// Every permutation of the six grid dimensions: 720 orders.
static std::vector<GridOrder> every_order() {
  std::vector<GridOrder> orders;
  GridOrder order = kShardlab;
  std::array<int, 6> index = {0, 1, 2, 3, 4, 5};
  do {
    for (size_t i = 0; i < 6; ++i) order[i] = kGridDims[static_cast<size_t>(index[i])];
    orders.push_back(order);
  } while (std::next_permutation(index.begin(), index.end()));
  return orders;
}

// Each rank of a real DeviceMesh over the permuted degrees (thread ranks) reports its coordinates, one
// per position of `order`; filed under their dimensions, the student's must match.
static void expect_like_device_mesh(const ParallelismConfig& config, const GridOrder& order) {
  const int world = config.world_size();
  std::vector<Coordinates> by_position_says(static_cast<size_t>(world));
  launch(world, [&](RankContext& ctx) {
    const DeviceMesh mesh(ctx.world, laid_out(config, order));
    by_position_says[static_cast<size_t>(ctx.rank)] = mesh.coordinates();
  }, exercises::thread_ranks());
  for (int rank = 0; rank < world; ++rank) {
    Coordinates want{};
    for (size_t i = 0; i < 6; ++i) want[static_cast<size_t>(grid_index(order[i]))] = by_position_says[static_cast<size_t>(rank)][i];
    expect_coordinates(config, order, rank, want);
  }
}

const ParallelismConfig kPredictMesh{.dp_shard = 2, .pp = 2, .cp = 2, .tp = 2};  // world 16

// The prediction's measure: the member of rank 3's pp group that is not rank 3, from the library's mesh.
static double measured_pp_partner() {
  for (int member : members_in_order(kPredictMesh, kMegatronPpInsideDp, {grid_index(MeshDim::pp)}, 3))
    if (member != 3) return member;
  return -1;
}

int main() {
  exercises::Grader grader("20_mesh_groups");
  grader.predict("the other rank of rank 3's pp group at world 16 = pp 2 x dp_shard 2 x cp 2 x tp 2 in order "
                 "{dp_replicate, dp_shard, pp, ep, cp, tp}",
                 impl::predicted_pp_partner, measured_pp_partner, 0, "(a rank)");
  const ParallelismConfig lesson{2, 1, 2, 1, 2};  // world 8 = pp 2 x dp_replicate 2 x tp 2
  grader.check("lesson 14's world 8 = pp 2 x dp 2 x tp 2 in shardlab's order: tp {0,1}, dp {0,2}, pp {0,4} groups", [&] {
    for (int rank = 0; rank < 8; ++rank) expect_coordinates(lesson, kShardlab, rank, {rank / 4, rank / 2 % 2, 0, 0, 0, rank % 2});
    expect_mesh(lesson, kShardlab);
  });
  grader.check("the same world 8 in Megatron's tp-cp-ep-pp-dp order: pp {0,2}, dp {0,4} groups", [&] {
    for (int rank = 0; rank < 8; ++rank) expect_coordinates(lesson, kMegatronPpInsideDp, rank, {rank / 2 % 2, rank / 4, 0, 0, 0, rank % 2});
    expect_mesh(lesson, kMegatronPpInsideDp);
  });
  grader.check("world 16 = pp 2 x dp_shard 2 x cp 2 x tp 2 in Megatron's tp-cp-ep-pp-dp order: every group", [] {
    expect_mesh(kPredictMesh, kMegatronPpInsideDp);
  });
  grader.check("coordinates equal a real DeviceMesh's on thread ranks over the permuted degrees (worlds 8, 12, 16, 12 with ep 3)", [] {
    expect_like_device_mesh(ParallelismConfig{1, 2, 2, 1, 2}, kMegatronPpInsideDp);
    expect_like_device_mesh(ParallelismConfig{1, 3, 2, 1, 2}, kTpOutermost);
    expect_like_device_mesh(ParallelismConfig{2, 2, 1, 2, 2}, kReplicasOutside);
    expect_like_device_mesh(ParallelismConfig{.dp_shard = 2, .cp = 2, .ep = 3}, kTpOutermost);
  });
  // Degrees all different where it fits, so that no mix-up of two dimensions goes unseen.
  const ParallelismConfig distinct{.dp_replicate = 3, .dp_shard = 2, .pp = 2, .cp = 1, .tp = 4},
      experts{.dp_shard = 3, .cp = 2, .ep = 4}, all_two{.dp_replicate = 2, .dp_shard = 2, .pp = 2, .cp = 2, .tp = 2, .ep = 2};
  const std::vector<GridOrder> orders = every_order();
  grader.check("coordinates in all 720 orders: every rank of worlds 48 (pp 2, dp_replicate 3, dp_shard 2, tp 4), 24 (dp_shard "
               "3, ep 4, cp 2) and 64 (all 2)", [&] {
    for (const GridOrder& order : orders)
      for (const ParallelismConfig& config : {distinct, experts, all_two})
        for (int rank = 0; rank < config.world_size(); ++rank)
          expect_coordinates(config, order, rank, coordinates_in_order(config, order, rank));
  });
  grader.check("the groups of the six dimensions and the five products in all 720 orders (worlds 48, 24, 64)", [&] {
    for (const GridOrder& order : orders)
      for (const ParallelismConfig& config : {distinct, experts, all_two})
        for (int rank = 0; rank < config.world_size(); ++rank) expect_every_group(config, order, rank);
  });
  const std::vector<ParallelismConfig> meshes = every_mesh();
  grader.check("coordinates and every group of every mesh of worlds 1 to 16, in four orders", [&] {
    for (const GridOrder& order : {kShardlab, kMegatronPpInsideDp, kReplicasOutside, kTpOutermost})
      for (const ParallelismConfig& config : meshes) expect_mesh(config, order);
  });
  grader.check("a size-1 dimension's group is the rank alone, in any order", [] {
    const ParallelismConfig tp_only{1, 1, 1, 1, 4};
    for (const GridOrder& order : {kShardlab, kTpOutermost})
      for (int rank = 0; rank < 4; ++rank)
        for (MeshDim dim : {MeshDim::pp, MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::ep, MeshDim::cp, MeshDim::dp,
                            MeshDim::dp_cp, MeshDim::expert_dp_cp}) {
          const std::vector<int> got = impl::mesh_group(tp_only, order, dim, rank);
          expect(got == std::vector<int>{rank}, where(tp_only, order, rank) + ": the " + std::string(name(dim)) + " group is " +
                                                    spell(got) + ", but that dimension has size 1: the group is the rank alone");
        }
  });
  return grader.finish();
}
