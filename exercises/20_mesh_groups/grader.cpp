// exercises/20_mesh_groups/grader.cpp — grades the mesh's coordinates and groups (student.cpp).
//
// Lesson 14's world 8 first; then a real DeviceMesh on thread ranks (parallel/comm/launch.h) for worlds
// 8, 12 and 16; then every mesh of worlds 1 to 16 (every way to write the world as pp x dp_replicate x
// dp_shard x cp x tp) against DeviceMesh::group_members, which needs no ranks. A wrong answer is
// compared with the layouts students mix up: column-major, the config's field order, another
// dimension's stride. With -DSL_SOLUTION the library's DeviceMesh stands in.
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
using Coordinates = std::array<int, 5>;

namespace exercise20 {
double predicted_pp_partner();
Coordinates mesh_coordinates(const ParallelismConfig& config, int rank);
std::vector<int> mesh_group(const ParallelismConfig& config, MeshDim dim, int rank);
}  // namespace exercise20

// The grid dimensions (indices into kGridDims) `dim` covers: itself, or a product's parts (mesh_dim.h).
static std::vector<int> dims_of(MeshDim dim) {
  switch (dim) {
    case MeshDim::dp: return {1, 2};
    case MeshDim::dp_shard_cp: return {2, 3};
    case MeshDim::dp_cp: return {1, 2, 3};
    default: return {grid_index(dim)};
  }
}

// A layout: layout[i] = the dimension at grid position i, outermost first. The library's is
// {0, 1, 2, 3, 4}; the mistakes below permute it. The library's group_members over a config whose
// degrees are permuted the same way gives the groups that layout would make.
using Layout = std::array<int, 5>;
constexpr Layout kRowMajor = {0, 1, 2, 3, 4}, kColumnMajor = {4, 3, 2, 1, 0}, kFieldOrder = {1, 2, 0, 3, 4};

static std::vector<int> members_in_layout(const ParallelismConfig& config, const Layout& layout, const std::vector<int>& dims,
                                          int rank) {
  const Coordinates degrees = config.degrees();
  Coordinates permuted{};
  MeshDims names;
  for (int position = 0; position < 5; ++position) {
    permuted[static_cast<size_t>(position)] = degrees[static_cast<size_t>(layout[static_cast<size_t>(position)])];
    for (int d : dims)
      if (layout[static_cast<size_t>(position)] == d) names.push_back(kGridDims[static_cast<size_t>(position)]);
  }
  const ParallelismConfig as_laid_out{permuted[1], permuted[2], permuted[0], permuted[3], permuted[4]};
  return DeviceMesh::group_members(as_laid_out, names, rank);
}

// A coordinate is the rank's index in its group along that one dimension (coordinate == group rank).
static Coordinates coordinates_in_layout(const ParallelismConfig& config, const Layout& layout, int rank) {
  Coordinates coords{};
  for (int d = 0; d < 5; ++d) {
    const std::vector<int> group = members_in_layout(config, layout, {d}, rank);
    for (size_t i = 0; i < group.size(); ++i)
      if (group[i] == rank) coords[static_cast<size_t>(d)] = static_cast<int>(i);
  }
  return coords;
}

// The same coordinates listed in the layout's position order (a student's array in the wrong order).
static Coordinates in_positions(const Coordinates& by_dimension, const Layout& layout) {
  Coordinates out{};
  for (size_t i = 0; i < 5; ++i) out[i] = by_dimension[static_cast<size_t>(layout[i])];
  return out;
}

#ifdef SL_SOLUTION
namespace solution {
// PP is outermost: its members are world/pp = 8 apart, so rank 3's partner is 3 + 8.
double predicted_pp_partner() { return 3 + 16 / 2; }
Coordinates mesh_coordinates(const ParallelismConfig& config, int rank) { return coordinates_in_layout(config, kRowMajor, rank); }
std::vector<int> mesh_group(const ParallelismConfig& config, MeshDim dim, int rank) {
  return DeviceMesh::group_members(config, {dim}, rank);
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
static std::string where(const ParallelismConfig& config, int rank) {
  return "mesh [pp, dp_replicate, dp_shard, cp, tp] = " + spell(config.degrees()) + ", rank " + std::to_string(rank);
}

static void expect_coordinates(const ParallelismConfig& config, int rank, const Coordinates& want) {
  const Coordinates got = impl::mesh_coordinates(config, rank);
  if (got == want) return;
  std::string why = "coordinates " + spell(got) + ", the mesh says " + spell(want);
  if (got == coordinates_in_layout(config, kColumnMajor, rank))
    why += ": that is column-major (pp innermost); the grid is row-major, tp innermost: t = rank % T first";
  else if (got == coordinates_in_layout(config, kFieldOrder, rank) || got == in_positions(coordinates_in_layout(config, kFieldOrder, rank), kFieldOrder))
    why += ": that lays the grid out in ParallelismConfig's field order (dp_replicate, dp_shard, pp, ...); use config.degrees()";
  else
    why += ": peel them off innermost first, coordinate = rank % degree, then rank /= degree";
  expect(false, where(config, rank) + ": " + why);
}

static void expect_group(const ParallelismConfig& config, MeshDim dim, int rank) {
  const std::vector<int> got = impl::mesh_group(config, dim, rank), want = DeviceMesh::group_members(config, {dim}, rank);
  if (got == want) return;
  const std::string name(sl::parallel::name(dim));
  std::string why = "the " + name + " group is " + spell(got) + ", the mesh's is " + spell(want);
  const std::vector<int> dims = dims_of(dim);
  // A single dimension whose group this is. A product's own parts are tried first, then the dimensions
  // of size > 1: a size-1 dimension's group is the rank alone, which any group of one matches.
  std::vector<int> order = dims.size() > 1 ? dims : std::vector<int>{};
  const Coordinates degrees = config.degrees();
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < 5; ++d)
      if (std::find(order.begin(), order.end(), d) == order.end() && (degrees[static_cast<size_t>(d)] > 1) == (pass == 0))
        order.push_back(d);
  std::string other_dimension, part_of;  // part_of: the name is a product and the group is one of its parts
  for (int d : order)
    if (other_dimension.empty() && dims != std::vector<int>{d} && got == members_in_layout(config, kRowMajor, {d}, rank)) {
      other_dimension = sl::parallel::name(kGridDims[static_cast<size_t>(d)]);
      if (std::find(dims.begin(), dims.end(), d) != dims.end()) part_of = name;
    }
  bool coordinates_right = false;  // then a column-major group is a coincidence, the dimension is wrong
  try {
    coordinates_right = impl::mesh_coordinates(config, rank) == coordinates_in_layout(config, kRowMajor, rank);
  } catch (const exercises::NotImplemented&) {
  }
  if (!part_of.empty() && coordinates_right) {
    std::string parts;
    for (int d : dims) parts += (parts.empty() ? "" : " x ") + std::string(sl::parallel::name(kGridDims[static_cast<size_t>(d)]));
    why += ": that is the " + other_dimension + " group only; " + name + " is " + parts + ", its group spans them all";
  } else if (!other_dimension.empty() && coordinates_right)
    why += ": that is the " + other_dimension + " group: a stride of the wrong dimension";
  else if (got == members_in_layout(config, kColumnMajor, dims, rank))
    why += ": that is the column-major group (pp innermost); the grid is row-major with tp innermost";
  else if (got == members_in_layout(config, kFieldOrder, dims, rank))
    why += ": that is the group in ParallelismConfig's field order; the grid's order is config.degrees()";
  else if (std::find(got.begin(), got.end(), rank) == got.end())
    why += ": it must hold the rank itself";
  else if (got.size() == want.size() && !std::is_sorted(got.begin(), got.end()))
    why += ": list the members ascending (the group rank order)";
  else if (!coordinates_right)
    why += ": mesh_coordinates is wrong for this rank too: fix it first, the groups follow from the coordinates";
  else if (!other_dimension.empty())
    why += ": that is the " + other_dimension + " group: a stride of the wrong dimension";
  expect(false, where(config, rank) + ": " + why);
}

// Every config of worlds 1..16: each degree >= 1, product <= 16.
static std::vector<ParallelismConfig> every_mesh() {
  std::vector<ParallelismConfig> meshes;
  for (int pp = 1; pp <= 16; ++pp)
    for (int r = 1; pp * r <= 16; ++r)
      for (int s = 1; pp * r * s <= 16; ++s)
        for (int c = 1; pp * r * s * c <= 16; ++c)
          for (int t = 1; pp * r * s * c * t <= 16; ++t) meshes.push_back(ParallelismConfig{r, s, pp, c, t});
  return meshes;
}

// Each rank of a real DeviceMesh (thread ranks) reports its coordinates; the student's must match.
static void expect_like_device_mesh(const ParallelismConfig& config) {
  const int world = config.world_size();
  std::vector<Coordinates> mesh_says(static_cast<size_t>(world));
  launch(world, [&](RankContext& ctx) {
    const DeviceMesh mesh(ctx.world, config);
    mesh_says[static_cast<size_t>(ctx.rank)] = mesh.coordinates();
  }, exercises::thread_ranks());
  for (int rank = 0; rank < world; ++rank) expect_coordinates(config, rank, mesh_says[static_cast<size_t>(rank)]);
}

// The prediction's measure: the member of rank 3's pp group that is not rank 3, from DeviceMesh.
static double measured_pp_partner() {
  const ParallelismConfig config{.dp_shard = 2, .pp = 2, .cp = 2, .tp = 2};
  for (int member : DeviceMesh::group_members(config, {MeshDim::pp}, 3))
    if (member != 3) return member;
  return -1;
}

int main() {
  exercises::Grader grader("20_mesh_groups");
  grader.predict("the other rank of rank 3's pp group at world 16 = pp 2 x dp_shard 2 x cp 2 x tp 2",
                 impl::predicted_pp_partner, measured_pp_partner, 0, "(a rank)");
  const ParallelismConfig lesson{2, 1, 2, 1, 2};  // world 8 = pp 2 x dp_replicate 2 x tp 2
  grader.check("lesson 14's world 8 = pp 2 x dp 2 x tp 2: coordinates, tp {0,1}, dp {0,2}, pp {0,4} groups", [&] {
    for (int rank = 0; rank < 8; ++rank) {
      expect_coordinates(lesson, rank, {rank / 4, rank / 2 % 2, 0, 0, rank % 2});
      for (MeshDim dim : {MeshDim::tp, MeshDim::dp_replicate, MeshDim::pp, MeshDim::dp}) expect_group(lesson, dim, rank);
    }
  });
  grader.check("coordinates equal a real DeviceMesh's on thread ranks (worlds 8, 12, 16)", [] {
    expect_like_device_mesh(ParallelismConfig{1, 2, 2, 1, 2});
    expect_like_device_mesh(ParallelismConfig{1, 3, 2, 1, 2});
    expect_like_device_mesh(ParallelismConfig{2, 2, 1, 2, 2});  // Accelerate's dp_shard 2 x dp_replicate 2 x cp 2 x tp 2
  });
  const std::vector<ParallelismConfig> meshes = every_mesh();
  grader.check("coordinates of every rank of every mesh of worlds 1 to 16", [&] {
    for (const ParallelismConfig& config : meshes)
      for (int rank = 0; rank < config.world_size(); ++rank) expect_coordinates(config, rank, coordinates_in_layout(config, kRowMajor, rank));
  });
  grader.check("groups along pp, dp_replicate, dp_shard, cp, tp: every rank of every mesh of worlds 1 to 16", [&] {
    for (const ParallelismConfig& config : meshes)
      for (int rank = 0; rank < config.world_size(); ++rank)
        for (MeshDim dim : kGridDims) expect_group(config, dim, rank);
  });
  grader.check("the named products dp, dp_shard_cp, dp_cp: every rank of every mesh of worlds 1 to 16", [&] {
    for (const ParallelismConfig& config : meshes)
      for (int rank = 0; rank < config.world_size(); ++rank)
        for (MeshDim dim : kProductDims) expect_group(config, dim, rank);
  });
  grader.check("a size-1 dimension's group is the rank alone", [] {
    const ParallelismConfig tp_only{1, 1, 1, 1, 4};
    for (int rank = 0; rank < 4; ++rank)
      for (MeshDim dim : {MeshDim::pp, MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::cp, MeshDim::dp, MeshDim::dp_cp})
        expect(impl::mesh_group(tp_only, dim, rank) == std::vector<int>{rank},
               where(tp_only, rank) + ": the " + std::string(name(dim)) + " group is " +
                   spell(impl::mesh_group(tp_only, dim, rank)) + ", but that dimension has size 1: the group is the rank alone");
  });
  return grader.finish();
}
