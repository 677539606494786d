// test_mesh.cpp — ParallelismConfig (validation messages) and DeviceMesh (coordinates, group members,
// traffic that stays inside a group), over layouts of world 1 to 12 on the threads backend.
//
// The expected values come from a reference that builds the grid by counting through nested loops
// (what arange(world).view(pp, dp_replicate, dp_shard, ep, cp, tp) does, as torchtitan lays it out), not from the mesh's own
// arithmetic; group members are checked by what the group itself moves (all_gather, all_reduce).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "tensor/ops.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

using Coords = std::array<int, 6>;  // pp, dp_replicate, dp_shard, ep, cp, tp (outermost first)
using DimSet = std::array<bool, 6>;


// Every rank's coordinates, by counting: rank r is the r-th cell visited with tp changing fastest.
std::vector<Coords> reference_grid(const ParallelismConfig& c) {
  std::vector<Coords> grid;
  for (int p = 0; p < c.pp; ++p)
    for (int a = 0; a < c.dp_replicate; ++a)
      for (int b = 0; b < c.dp_shard; ++b)
        for (int e = 0; e < c.ep; ++e)
          for (int q = 0; q < c.cp; ++q)
            for (int t = 0; t < c.tp; ++t) grid.push_back({p, a, b, e, q, t});
  return grid;
}

// The ranks that agree with `rank` on every dimension outside the set, ascending.
std::vector<int> reference_members(const std::vector<Coords>& grid, int rank, const DimSet& in_set) {
  std::vector<int> members;
  for (int other = 0; other < static_cast<int>(grid.size()); ++other) {
    bool same = true;
    for (int d = 0; d < 6; ++d)
      if (!in_set[d] && grid[other][d] != grid[rank][d]) same = false;
    if (same) members.push_back(other);
  }
  return members;
}

// Each name and generic set the tests look up, with the dimensions it spans spelled out by hand.
struct NamedSet {
  std::string label;
  MeshDims names;
  DimSet dims;
};
const std::vector<NamedSet>& named_sets() {
  static const std::vector<NamedSet> sets = {
      //                                                   pp dpr dps ep cp tp
      {"dp_replicate", {MeshDim::dp_replicate}, {0, 1, 0, 0, 0, 0}},
      {"dp_shard", {MeshDim::dp_shard}, {0, 0, 1, 0, 0, 0}},
      {"pp", {MeshDim::pp}, {1, 0, 0, 0, 0, 0}},
      {"ep", {MeshDim::ep}, {0, 0, 0, 1, 0, 0}},
      {"cp", {MeshDim::cp}, {0, 0, 0, 0, 1, 0}},
      {"tp", {MeshDim::tp}, {0, 0, 0, 0, 0, 1}},
      {"dp", {MeshDim::dp}, {0, 1, 1, 1, 0, 0}},
      {"dp_shard_cp", {MeshDim::dp_shard_cp}, {0, 0, 1, 1, 1, 0}},
      {"dp_cp", {MeshDim::dp_cp}, {0, 1, 1, 1, 1, 0}},
      {"expert_dp_cp", {MeshDim::expert_dp_cp}, {0, 1, 1, 0, 1, 0}},
      {"expert_dp_shard_cp", {MeshDim::expert_dp_shard_cp}, {0, 0, 1, 0, 1, 0}},
      {"{dp_replicate,dp_shard}", {MeshDim::dp_replicate, MeshDim::dp_shard}, {0, 1, 1, 0, 0, 0}},
      {"{pp,tp}", {MeshDim::pp, MeshDim::tp}, {1, 0, 0, 0, 0, 1}},
      {"{dp_replicate,cp}", {MeshDim::dp_replicate, MeshDim::cp}, {0, 1, 0, 0, 1, 0}},
      {"{dp,tp}", {MeshDim::dp, MeshDim::tp}, {0, 1, 1, 1, 0, 1}},
      {"{ep,tp}", {MeshDim::ep, MeshDim::tp}, {0, 0, 0, 1, 0, 1}},
      {"all six", {MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::pp, MeshDim::ep, MeshDim::cp, MeshDim::tp},
       {1, 1, 1, 1, 1, 1}},
  };
  return sets;
}

ProcessGroupPtr lookup(const DeviceMesh& mesh, const NamedSet& set) {
  return set.names.size() == 1 ? mesh.group(set.names[0]) : mesh.group(set.names);
}

// ---- ParallelismConfig ---------------------------------------------------------------------------

TEST(ParallelismConfig, WorldSizeIsTheProduct) {
  EXPECT_EQ(ParallelismConfig{}.world_size(), 1);
  EXPECT_EQ((ParallelismConfig{2, 3, 1, 2, 2}.world_size()), 24);
  EXPECT_EQ((ParallelismConfig{1, 2, 2, 1, 3}.str()), "dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 3");
  EXPECT_EQ((ParallelismConfig{1, 2, 2, 1, 3, 2}.world_size()), 24);
  EXPECT_EQ((ParallelismConfig{1, 2, 2, 1, 3, 2}.str()), "dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 3 x ep 2");
  EXPECT_EQ(message_of([] { ParallelismConfig{.ep = 0}.world_size(); }), "ParallelismConfig: ep must be >= 1 (got 0)");
}

TEST(ParallelismConfig, WorldMismatchNamesEveryValue) {
  const ParallelismConfig config{.dp_shard = 2, .pp = 2, .tp = 3};
  EXPECT_EQ(message_of([&] { config.validate(8); }),
            "ParallelismConfig: world size 8 != dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 3");
  EXPECT_EQ(message_of([&] { config.validate(12); }), "(no error)");
  EXPECT_EQ(message_of([] { ParallelismConfig{}.validate(0); }),
            "ParallelismConfig: world size 0 != dp_replicate 1 x dp_shard 1 x pp 1 x cp 1 x tp 1");
}

TEST(ParallelismConfig, EveryDegreeMustBePositive) {
  EXPECT_EQ(message_of([] { ParallelismConfig{.tp = 0}.validate(1); }), "ParallelismConfig: tp must be >= 1 (got 0)");
  EXPECT_EQ(message_of([] { ParallelismConfig{.dp_replicate = -2}.validate(2); }),
            "ParallelismConfig: dp_replicate must be >= 1 (got -2)");
  EXPECT_EQ(message_of([] { ParallelismConfig{.cp = 0}.world_size(); }), "ParallelismConfig: cp must be >= 1 (got 0)");
  // The first bad degree (outermost first) is the one named.
  EXPECT_EQ(message_of([] { ParallelismConfig{.dp_shard = 0, .pp = 0}.validate(1); }),
            "ParallelismConfig: dp_shard must be >= 1 (got 0)");
}

TEST(ParallelismConfig, OverflowIsAnErrorNotAWrap) {
  const ParallelismConfig huge{.dp_replicate = 65536, .tp = 65536};  // 2^32 wraps to 0 in int
  EXPECT_EQ(message_of([&] { huge.validate(0); }),
            "ParallelismConfig: dp_replicate 65536 x dp_shard 1 x pp 1 x cp 1 x tp 65536 overflows int");
}

// ---- DeviceMesh over many layouts ------------------------------------------------------------------

struct MeshCase {
  ParallelismConfig config;
};

void PrintTo(const MeshCase& c, std::ostream* out) { *out << c.config.str(); }

std::string case_name(const testing::TestParamInfo<MeshCase>& info) {
  const auto& c = info.param.config;
  return "world" + std::to_string(c.world_size()) + "_dpr" + std::to_string(c.dp_replicate) + "_dps" +
         std::to_string(c.dp_shard) + "_pp" + std::to_string(c.pp) + "_cp" + std::to_string(c.cp) + "_tp" +
         std::to_string(c.tp) + (c.ep > 1 ? "_ep" + std::to_string(c.ep) : "");
}

// What one rank saw; each rank fills its own slot, the test thread checks after launch() joined.
struct RankReport {
  Coords coords{};
  Coords accessors{};
  int dp_rank = -1;
  std::map<std::string, int> coordinate, size, group_rank, group_size;
  std::map<std::string, std::vector<int>> members, gathered;
  std::map<std::string, double> summed_bits;
  bool shares_dp_handle = false;
};

// Builds the mesh on every rank and records what each rank sees, moving data in every group.
std::vector<RankReport> observe(const ParallelismConfig& config) {
  std::vector<RankReport> reports(static_cast<size_t>(config.world_size()));
  launch(
      config.world_size(),
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, config);
        RankReport& report = reports[static_cast<size_t>(ctx.rank)];
        report.coords = mesh.coordinates();
        report.accessors = {mesh.pp_rank(), mesh.dp_replicate_rank(), mesh.dp_shard_rank(), mesh.ep_rank(),
                            mesh.cp_rank(), mesh.tp_rank()};
        report.dp_rank = mesh.dp_rank();
        report.shares_dp_handle =
            mesh.group(MeshDims{MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::ep}) == mesh.group(MeshDim::dp);
        for (const auto& set : named_sets()) {
          ProcessGroupPtr group = lookup(mesh, set);
          report.group_rank[set.label] = group->rank();
          report.group_size[set.label] = group->size();
          if (set.names.size() == 1) {
            report.coordinate[set.label] = mesh.coordinate(set.names[0]);
            report.size[set.label] = mesh.size(set.names[0]);
            report.members[set.label] = mesh.members(set.names[0]);
          }
          // Every member contributes its world rank: the gathered list is the group, in group order.
          Tensor mine = from_vector({static_cast<double>(ctx.rank)}, {1}, DType::i64);
          Tensor all = Tensor::empty({group->size()}, DType::i64);
          group->all_gather(all, mine);
          for (double r : all.to_vector()) report.gathered[set.label].push_back(static_cast<int>(r));
          // Bit `rank` from each member: the sum spells out exactly who took part.
          Tensor bits = from_vector({static_cast<double>(1LL << ctx.rank)}, {1}, DType::f64);
          group->all_reduce(bits);
          report.summed_bits[set.label] = bits.item();
        }
      },
      quick_on(Backend::threads, 3000));
  return reports;
}

class DeviceMeshLayout : public testing::TestWithParam<MeshCase> {};

TEST_P(DeviceMeshLayout, CoordinatesFollowTheGrid) {
  const ParallelismConfig config = GetParam().config;
  const auto reports = observe(config);
  const auto grid = reference_grid(config);
  for (int r = 0; r < config.world_size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankReport& report = reports[static_cast<size_t>(r)];
    EXPECT_EQ(report.coords, grid[r]);
    EXPECT_EQ(report.accessors, grid[r]);
    EXPECT_EQ(report.dp_rank, (grid[r][1] * config.dp_shard + grid[r][2]) * config.ep + grid[r][3]);
    for (const auto& set : named_sets()) {
      if (set.names.size() != 1) continue;
      SCOPED_TRACE(set.label);
      const std::vector<int> expected = reference_members(grid, r, set.dims);
      const auto position = std::find(expected.begin(), expected.end(), r) - expected.begin();
      EXPECT_EQ(report.coordinate.at(set.label), static_cast<int>(position));  // row-major within the set
      EXPECT_EQ(report.size.at(set.label), static_cast<int>(expected.size()));
    }
  }
}

TEST_P(DeviceMeshLayout, GroupsHoldExactlyTheExpectedRanks) {
  const ParallelismConfig config = GetParam().config;
  const auto reports = observe(config);
  const auto grid = reference_grid(config);
  for (int r = 0; r < config.world_size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankReport& report = reports[static_cast<size_t>(r)];
    EXPECT_TRUE(report.shares_dp_handle);
    for (const auto& set : named_sets()) {
      SCOPED_TRACE(set.label);
      const std::vector<int> expected = reference_members(grid, r, set.dims);
      const auto position = std::find(expected.begin(), expected.end(), r) - expected.begin();
      EXPECT_EQ(report.gathered.at(set.label), expected);  // what the group itself moved
      EXPECT_EQ(report.group_size.at(set.label), static_cast<int>(expected.size()));
      EXPECT_EQ(report.group_rank.at(set.label), static_cast<int>(position));
      if (set.names.size() == 1) {
        EXPECT_EQ(report.members.at(set.label), expected);
      }
    }
  }
}

// all_reduce in "tp" (and every other group) sums over its peers and nobody else.
TEST_P(DeviceMeshLayout, AllReduceStaysInsideEachGroup) {
  const ParallelismConfig config = GetParam().config;
  const auto reports = observe(config);
  const auto grid = reference_grid(config);
  for (int r = 0; r < config.world_size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (const auto& set : named_sets()) {
      SCOPED_TRACE(set.label);
      double expected_bits = 0;
      for (int member : reference_members(grid, r, set.dims)) expected_bits += static_cast<double>(1LL << member);
      EXPECT_EQ(reports[static_cast<size_t>(r)].summed_bits.at(set.label), expected_bits);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DeviceMeshLayout,
    testing::Values(MeshCase{{}},                                                         // world 1
                    MeshCase{{.tp = 2}}, MeshCase{{.dp_shard = 2}}, MeshCase{{.pp = 2}},  // world 2
                    MeshCase{{.dp_replicate = 2, .tp = 2}}, MeshCase{{.pp = 4}},          // world 4
                    MeshCase{{.dp_shard = 2, .cp = 2}}, MeshCase{{.dp_replicate = 2, .dp_shard = 2}},
                    MeshCase{{.dp_replicate = 2, .pp = 2, .tp = 2}},  // world 8: the header's example
                    MeshCase{{.dp_shard = 2, .pp = 2, .cp = 2}}, MeshCase{{.dp_replicate = 2, .dp_shard = 2, .cp = 2}},
                    MeshCase{{.dp_shard = 2, .pp = 2, .tp = 3}},  // world 12
                    MeshCase{{.dp_replicate = 3, .tp = 4}}, MeshCase{{.dp_replicate = 2, .cp = 3, .tp = 2}},
                    MeshCase{{.dp_replicate = 3, .dp_shard = 2, .pp = 2}},
                    MeshCase{{.ep = 2}}, MeshCase{{.dp_shard = 2, .ep = 2}},  // expert parallel
                    MeshCase{{.dp_replicate = 2, .tp = 2, .ep = 2}}, MeshCase{{.pp = 2, .cp = 2, .ep = 2}},
                    MeshCase{{.dp_shard = 2, .pp = 2, .tp = 2, .ep = 2}},  // world 16
                    MeshCase{{.dp_replicate = 2, .dp_shard = 2, .cp = 2, .tp = 2, .ep = 2}}),  // world 32
    case_name);

// ---- the header's example, written out by hand ------------------------------------------------------

TEST(DeviceMesh, HeaderExampleGroups) {
  const ParallelismConfig config{.dp_replicate = 2, .pp = 2, .tp = 2};
  std::vector<std::map<std::string, std::vector<std::vector<int>>>> partitions(8);
  std::string drawing;
  launch(
      8,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, config);
        for (MeshDim dim : {MeshDim::tp, MeshDim::pp, MeshDim::dp, MeshDim::dp_cp, MeshDim::cp})
          partitions[static_cast<size_t>(ctx.rank)][std::string(name(dim))] = mesh.partition(dim);
        if (ctx.rank == 5) drawing = mesh.str();
      },
      quick_on(Backend::threads, 3000));
  using Partition = std::vector<std::vector<int>>;
  for (const auto& p : partitions) {
    EXPECT_EQ(p.at("tp"), (Partition{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
    EXPECT_EQ(p.at("dp"), (Partition{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
    EXPECT_EQ(p.at("pp"), (Partition{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
    EXPECT_EQ(p.at("dp_cp"), p.at("dp"));
    EXPECT_EQ(p.at("cp"), (Partition{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  }
  EXPECT_EQ(drawing,
            "DeviceMesh: world 8 = dp_replicate 2 x dp_shard 1 x pp 2 x cp 1 x tp 2   (this is rank 5, marked *)\n"
            "                        tp 0   tp 1\n"
            "  pp 0  dp_replicate 0     0      1\n"
            "  pp 0  dp_replicate 1     2      3\n"
            "  pp 1  dp_replicate 0     4      5*\n"
            "  pp 1  dp_replicate 1     6      7\n"
            "  pp          : {0,4} {1,5} {2,6} {3,7}\n"
            "  dp_replicate: {0,2} {1,3} {4,6} {5,7}\n"
            "  tp          : {0,1} {2,3} {4,5} {6,7}\n"
            "  dp          : same as dp_replicate\n"
            "  dp_cp       : same as dp_replicate\n");
}

TEST(DeviceMesh, TpAllReduceSumsOnlyTpPeers) {
  std::vector<std::vector<double>> sums(8);
  launch(
      8,
      [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, ParallelismConfig{.dp_replicate = 2, .pp = 2, .tp = 2});
        Tensor t = full({2}, static_cast<double>(ctx.rank));
        mesh.group(MeshDim::tp)->all_reduce(t);
        sums[static_cast<size_t>(ctx.rank)] = t.to_vector();
      },
      quick_on(Backend::threads, 3000));
  // tp groups {0,1} {2,3} {4,5} {6,7}: each pair's sum, not the world's 28.
  const std::vector<double> expected = {1, 1, 5, 5, 9, 9, 13, 13};
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(sums[static_cast<size_t>(r)], std::vector<double>(2, expected[r])) << "rank " << r;
}

TEST(DeviceMesh, SizeOneDimensionsGetATrivialGroup) {
  launch(
      4,
      [](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, ParallelismConfig{.dp_shard = 2, .tp = 2});
        for (MeshDim dim : {MeshDim::dp_replicate, MeshDim::pp, MeshDim::cp}) {
          ProcessGroupPtr alone = mesh.group(dim);
          SL_CHECK(alone && alone->size() == 1 && alone->rank() == 0, "trivial group ", name(dim));
          Tensor t = full({3}, 7.0);
          alone->all_reduce(t);  // a group of one: nothing moves, nothing changes
          SL_CHECK(t.to_vector() == std::vector<double>({7, 7, 7}), "all_reduce over one rank changed ", name(dim));
        }
        // Sets that differ only by size-1 dimensions are one group (one handle, one sequence).
        SL_CHECK(mesh.group(MeshDim::dp) == mesh.group(MeshDim::dp_shard), "dp is dp_shard when dp_replicate is 1");
        SL_CHECK(mesh.group(MeshDims{MeshDim::pp, MeshDim::tp}) == mesh.group(MeshDim::tp), "{pp,tp} is tp when pp is 1");
        SL_CHECK(mesh.group(MeshDims{MeshDim::dp_shard, MeshDim::tp}) == ctx.world, "the set of every size>1 dimension is the world");
      },
      quick_on(Backend::threads, 3000));
}

// ---- failures: before communication, the same on every rank ---------------------------------------

TEST(DeviceMesh, BadConfigThrowsOnEveryRankBeforeAnyCommunication) {
  const std::string expected = "ParallelismConfig: world size 8 != dp_replicate 1 x dp_shard 2 x pp 2 x cp 1 x tp 3";
  std::vector<std::string> messages(8, "(no error)");
  std::vector<uint64_t> collectives(8, 99);
  std::vector<int64_t> calls(8, 99);
  const std::string launched = message_of([&] {
    launch(
        8,
        [&](RankContext& ctx) {
          try {
            DeviceMesh mesh(ctx.world, ParallelismConfig{.dp_shard = 2, .pp = 2, .tp = 3});
          } catch (const Error& e) {
            messages[static_cast<size_t>(ctx.rank)] = e.what();
            collectives[static_cast<size_t>(ctx.rank)] = ctx.world->collectives_issued();
            calls[static_cast<size_t>(ctx.rank)] = ctx.world->ledger().total().calls;
            throw;
          }
        },
        quick_on(Backend::threads, 3000));
  });
  EXPECT_EQ(launched, expected);
  for (int r = 0; r < 8; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(messages[static_cast<size_t>(r)], expected);  // its own error, not a RemoteError from a peer
    EXPECT_EQ(collectives[static_cast<size_t>(r)], 0u);
    EXPECT_EQ(calls[static_cast<size_t>(r)], 0);
  }
}

TEST(DeviceMesh, RanksThatDisagreeOnTheConfigAllThrow) {
  std::vector<std::string> messages(4, "(no error)");
  const std::string launched = message_of([&] {
    launch(
        4,
        [&](RankContext& ctx) {
          const ParallelismConfig config =
              ctx.rank == 2 ? ParallelismConfig{.tp = 4} : ParallelismConfig{.dp_shard = 4};
          messages[static_cast<size_t>(ctx.rank)] = message_of([&] { DeviceMesh mesh(ctx.world, config); });
        },
        quick_on(Backend::threads, 3000));
  });
  const std::string expected =
      "DeviceMesh: ranks disagree on the ParallelismConfig: rank 0 has dp_replicate 1 x dp_shard 4 x pp 1 x cp 1 x "
      "tp 1, rank 2 has dp_replicate 1 x dp_shard 1 x pp 1 x cp 1 x tp 4";
  EXPECT_EQ(launched, "(no error)");  // each rank caught its own error
  for (const auto& message : messages) EXPECT_EQ(message, expected);
}

// Names come in as text only at the edges (command lines, files): the parse names the valid ones.
TEST(MeshDim, NamesAreAcceleratesAndParseBack) {
  const std::vector<std::pair<MeshDim, std::string>> all = {
      {MeshDim::pp, "pp"}, {MeshDim::dp_replicate, "dp_replicate"}, {MeshDim::dp_shard, "dp_shard"},
      {MeshDim::cp, "cp"}, {MeshDim::tp, "tp"},                     {MeshDim::dp, "dp"},
      {MeshDim::dp_shard_cp, "dp_shard_cp"}, {MeshDim::dp_cp, "dp_cp"}, {MeshDim::ep, "ep"},
      {MeshDim::expert_dp_cp, "expert_dp_cp"}, {MeshDim::expert_dp_shard_cp, "expert_dp_shard_cp"}};
  ASSERT_EQ(static_cast<int>(all.size()), kMeshDimCount);
  for (const auto& [dim, text] : all) {
    EXPECT_EQ(name(dim), text);
    EXPECT_EQ(mesh_dim_from_name(text), dim) << text;
  }
  EXPECT_EQ(name(MeshDims{MeshDim::pp, MeshDim::tp}), "pp+tp");
  EXPECT_EQ(name(MeshDims{MeshDim::dp_shard}), "dp_shard");
  EXPECT_EQ(name(MeshDims{}), "");
}

TEST(MeshDim, UnknownNameListsTheValidOnes) {
  const std::string valid =
      "(valid: pp, dp_replicate, dp_shard, ep, cp, tp, dp, dp_shard_cp, dp_cp, expert_dp_cp, expert_dp_shard_cp)";
  EXPECT_EQ(message_of([] { mesh_dim_from_name("data"); }), "unknown mesh dimension 'data' " + valid);
  EXPECT_EQ(message_of([] { mesh_dim_from_name("etp"); }), "unknown mesh dimension 'etp' " + valid);
  EXPECT_EQ(message_of([] { mesh_dim_from_name("TP"); }), "unknown mesh dimension 'TP' " + valid);
}

// The grid's dimensions come first, in grid order; the products cover their parts.
TEST(MeshDim, GridOrderAndProducts) {
  ASSERT_EQ(kGridDimCount, 6);
  using enum MeshDim;
  EXPECT_EQ(grid_dims(grid_mask(dp)), (MeshDims{dp_replicate, dp_shard, ep}));
  EXPECT_EQ(grid_dims(grid_mask(dp_shard_cp)), (MeshDims{dp_shard, ep, cp}));
  EXPECT_EQ(grid_dims(grid_mask(dp_cp)), (MeshDims{dp_replicate, dp_shard, ep, cp}));
  EXPECT_EQ(grid_dims(grid_mask(expert_dp_cp)), (MeshDims{dp_replicate, dp_shard, cp}));
  EXPECT_EQ(grid_dims(grid_mask(expert_dp_shard_cp)), (MeshDims{dp_shard, cp}));
  EXPECT_EQ(grid_dims(grid_mask(MeshDims{MeshDim::tp, MeshDim::pp})), (MeshDims{MeshDim::pp, MeshDim::tp}));
  for (int d = 0; d < kGridDimCount; ++d) EXPECT_EQ(grid_mask(kGridDims[static_cast<size_t>(d)]), 1u << d);
}

TEST(DeviceMesh, AnEmptySetListsTheKnownOnes) {
  std::string message;
  launch(
      1, [&](RankContext& ctx) {
        DeviceMesh mesh(ctx.world, ParallelismConfig{});
        message = message_of([&] { mesh.group(MeshDims{}); });
      },
      quick_on(Backend::threads, 3000));
  EXPECT_EQ(message,
            "DeviceMesh: group() needs at least one dimension (known: pp, dp_replicate, dp_shard, ep, cp, tp, dp, "
            "dp_shard_cp, dp_cp, expert_dp_cp, expert_dp_shard_cp)");
}

TEST(DeviceMesh, NullWorldIsAnError) {
  EXPECT_EQ(message_of([] { DeviceMesh mesh(nullptr, ParallelismConfig{}); }),
            "DeviceMesh: the world process group is null");
}

}  // namespace
}  // namespace sl::parallel
