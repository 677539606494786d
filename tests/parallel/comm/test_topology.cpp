// Simulated links (parallel/comm/topology.h): the spec and JSON forms, and the threads backend's
// charges. Expected charges come from the alpha-beta formula latency + bytes / bandwidth and the ring
// algorithm's step count, written out here.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/comm/topology.h"
#include "tensor/ops.h"

namespace sl::parallel {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Topology, ReadsTheSpecAndItsUnits) {
  Topology t = Topology::parse_links("intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=4");
  EXPECT_EQ(t.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(t.intra.bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(t.intra.latency_s, 1e-6);
  EXPECT_DOUBLE_EQ(t.inter.bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(t.inter.latency_s, 5e-6);
  EXPECT_EQ(Topology::parse_links(t.str()), t);  // str() is a spec that reads back the same
  EXPECT_DOUBLE_EQ(parse_bandwidth("100Gbit/s", "x"), 12.5e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1 GiB/s", "x"), 1073741824.0);
  EXPECT_DOUBLE_EQ(parse_duration("2ms", "x"), 2e-3);
  EXPECT_DOUBLE_EQ(parse_bytes("80GB", "x"), 80e9);
  EXPECT_DOUBLE_EQ(parse_flops("312TFLOP/s", "x"), 312e12);
  // Ranks fill nodes in order.
  EXPECT_EQ(t.node_of(3), 0);
  EXPECT_EQ(t.node_of(4), 1);
  EXPECT_EQ(t.link(1, 2), t.intra);
  EXPECT_EQ(t.link(3, 4), t.inter);
  EXPECT_TRUE(t.crosses_nodes({2, 6}));
  Topology placed = Topology::parse_links("inter=1GB/s,1us;gpus-per-node=2;placement=0,1,0,1");
  EXPECT_EQ(placed.placement, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_TRUE(placed.crosses_nodes({0, 1}));
  EXPECT_FALSE(placed.crosses_nodes({1, 3}));
  EXPECT_EQ(Topology::parse_links(placed.str()), placed);
  EXPECT_FALSE(t.crosses_nodes({0, 1, 2, 3}));
  // A ring step lasts as long as its slowest hop: 0 -> 4 crosses nodes.
  EXPECT_DOUBLE_EQ(t.ring_step_seconds({0, 1, 2, 3}, 3000), 1e-6 + 3000 / 300e9);
  EXPECT_DOUBLE_EQ(t.ring_step_seconds({0, 4}, 3000), 5e-6 + 3000 / 25e9);
}

TEST(Topology, ReadsJsonWithNumbersOrUnits) {
  Topology t = Topology::from_json_text(
      R"({"gpus_per_node": 8, "nodes": 4, "intra": {"bandwidth": "300GB/s", "latency": 1e-6},
          "inter": {"bandwidth": 16e9, "latency": "3us"}})");
  EXPECT_EQ(t.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(t.intra.bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(t.intra.latency_s, 1e-6);
  EXPECT_DOUBLE_EQ(t.inter.bytes_per_s, 16e9);
  EXPECT_DOUBLE_EQ(t.inter.latency_s, 3e-6);
}

void expect_error_naming(const std::function<void()>& fn, const std::string& piece) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming '" << piece << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
  }
}

TEST(Topology, BadInputIsNamed) {
  expect_error_naming([] { Topology::parse_links("intra=300GB/s,1us"); }, "gpus-per-node");
  expect_error_naming([] { Topology::parse_links("intra=300GB/s,1us;gpus-per-node=0"); }, "gpus-per-node");
  expect_error_naming([] { Topology::parse_links("intra=300GB/s;gpus-per-node=2"); }, "300GB/s");
  expect_error_naming([] { Topology::parse_links("intra=300XB/s,1us;gpus-per-node=2"); }, "300XB/s");
  expect_error_naming([] { Topology::parse_links("intra=300GB/s,1 fortnight;gpus-per-node=2"); }, "1 fortnight");
  expect_error_naming([] { Topology::parse_links("intra=-3GB/s,1us;gpus-per-node=2"); }, "-3GB/s");
  expect_error_naming([] { Topology::parse_links("wifi=1MB/s,1ms;gpus-per-node=2"); }, "wifi");
  expect_error_naming([] { Topology::from_json_text("{\"gpus_per_node\": 2.5}"); }, "gpus_per_node");
  expect_error_naming([] { Topology::from_json_text("[1, 2"); }, "not JSON");
  expect_error_naming([] { Topology::load("/nonexistent/cluster.json"); }, "/nonexistent/cluster.json");
  LaunchOptions options;
  options.backend = Backend::mpi;
  options.topology = Topology::parse_links("inter=1GB/s,1us;gpus-per-node=1");
  expect_error_naming([&] { launch(2, [](RankContext&) {}, options); }, "threads-backend");
  options.backend = Backend::threads;
  options.topology = Topology::parse_links("inter=1GB/s,1us;gpus-per-node=1;placement=0,1,1");
  expect_error_naming([&] { launch(2, [](RankContext&) {}, options); }, "3 ranks' nodes but the world has 2");
}

// Two nodes of 2 ranks: intra 1 GB/s and 10 us, inter 100 MB/s and 200 us (slow enough that the
// sleeps dominate the real copies).
LaunchOptions two_nodes_of_two() {
  LaunchOptions options;
  options.topology = Topology::parse_links("intra=1GB/s,10us;inter=100MB/s,200us;gpus-per-node=2");
  return options;
}

TEST(SimulatedLinks, ARingIsChargedItsStepsAndBoundedByItsSlowestHop) {
  const LaunchOptions options = two_nodes_of_two();
  const Topology& t = options.topology;
  constexpr int n = 4;
  constexpr int64_t count = 4096, chunk_bytes = count / n * 4;  // f32, equal chunks
  std::vector<double> charged(n), elapsed(n);
  launch(n, [&](RankContext& ctx) {
    Tensor x = full({count}, 1.0);
    ctx.world->barrier();
    ctx.world->ledger().reset();
    const auto start = Clock::now();
    ctx.world->all_reduce(x);
    elapsed[ctx.rank] = std::chrono::duration<double>(Clock::now() - start).count();
    charged[ctx.rank] = ctx.world->ledger()[CommOp::all_reduce].link_s;
  }, options);
  // Rank r receives all 2(n-1) chunks from its left neighbour: ranks 0 (from 3) and 2 (from 1) over
  // the inter-node link, ranks 1 and 3 within their node.
  const double inter_step = 200e-6 + chunk_bytes / 100e6, intra_step = 10e-6 + chunk_bytes / 1e9;
  for (int r = 0; r < n; ++r) {
    const double step = (r % 2 == 0) ? inter_step : intra_step;
    EXPECT_NEAR(charged[r], 2 * (n - 1) * step, 1e-12) << "rank " << r;
    EXPECT_DOUBLE_EQ(t.link((r + n - 1) % n, r).seconds(chunk_bytes), step);
    // Every rank waits for the ring, whose steps move at the speed of its slowest hop: the last
    // step a rank receives needs every earlier step of its left neighbour, which crossed nodes or
    // waited for a rank that did.
    EXPECT_GE(elapsed[r], (2 * (n - 1) - 1) * inter_step) << "rank " << r << " finished faster than the ring allows";
  }
}

TEST(SimulatedLinks, GroupsAreChargedByWhereTheirRanksSit) {
  // world 8 = pp 2 x dp 2 x tp 2 on 2 nodes of 4: a tp pair shares a node, a pp pair spans both.
  LaunchOptions options;
  options.topology = Topology::parse_links("intra=2GB/s,5us;inter=200MB/s,100us;gpus-per-node=4");
  std::vector<double> tp_charge(8), pp_charge(8), dp_charge(8);
  launch(8, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.dp_replicate = 2, .pp = 2, .tp = 2});
    Tensor x = full({1000}, 1.0);
    for (MeshDim dim : {MeshDim::tp, MeshDim::pp, MeshDim::dp}) {
      mesh.group(dim)->ledger().reset();
      mesh.group(dim)->all_reduce(x);
    }
    tp_charge[ctx.rank] = mesh.group(MeshDim::tp)->ledger().link_seconds();
    pp_charge[ctx.rank] = mesh.group(MeshDim::pp)->ledger().link_seconds();
    dp_charge[ctx.rank] = mesh.group(MeshDim::dp)->ledger().link_seconds();
  }, options);
  // A pair's all-reduce: 2 steps of half the tensor (2000 bytes).
  for (int r = 0; r < 8; ++r) {
    EXPECT_NEAR(tp_charge[r], 2 * (5e-6 + 2000 / 2e9), 1e-12) << "rank " << r;      // ranks 2k, 2k+1: one node
    EXPECT_NEAR(dp_charge[r], 2 * (5e-6 + 2000 / 2e9), 1e-12) << "rank " << r;      // r, r+2: one node
    EXPECT_NEAR(pp_charge[r], 2 * (100e-6 + 2000 / 200e6), 1e-12) << "rank " << r;  // r, r+4: across
  }
}

TEST(SimulatedLinks, PointToPointChargesTheReceiverOneMessage) {
  const LaunchOptions options = two_nodes_of_two();
  std::vector<double> recv_charge(4), send_charge(4);
  launch(4, [&](RankContext& ctx) {
    Tensor x = full({250}, static_cast<double>(ctx.rank));  // 1000 bytes
    if (ctx.rank == 0) ctx.world->send(x, 3);
    if (ctx.rank == 3) ctx.world->recv(x, 0);
    if (ctx.rank == 1) ctx.world->send(x, 0);
    if (ctx.rank == 0) ctx.world->recv(x, 1);
    recv_charge[ctx.rank] = ctx.world->ledger()[CommOp::recv].link_s;
    send_charge[ctx.rank] = ctx.world->ledger()[CommOp::send].link_s;
  }, options);
  EXPECT_NEAR(recv_charge[3], 200e-6 + 1000 / 100e6, 1e-15);  // 0 -> 3 crosses nodes
  EXPECT_NEAR(recv_charge[0], 10e-6 + 1000 / 1e9, 1e-15);     // 1 -> 0 does not
  for (int r = 0; r < 4; ++r) EXPECT_EQ(send_charge[r], 0.0) << "rank " << r;
}

// With links or without, the same collectives give the same bytes, bitwise, and the ledger the same counts.
TEST(SimulatedLinks, ChangeNoResultAndNoByteCount) {
  struct Outcome {
    std::vector<double> reduced, gathered, scattered, broadcast;
    std::vector<CommStats> stats;
  };
  auto run = [](const LaunchOptions& options) {
    std::vector<Outcome> outcomes(3);
    launch(3, [&](RankContext& ctx) {
      Generator gen(11 + ctx.rank);
      Tensor a = randn({1001}, {}, &gen), g = Tensor::empty({3 * 7}), s = Tensor::empty({5}), b = randn({333}, {}, &gen);
      ctx.world->all_reduce(a);
      ctx.world->all_gather(g, randn({7}, {}, &gen));
      ctx.world->reduce_scatter(s, randn({15}, {}, &gen));
      ctx.world->broadcast(b, 1);
      Outcome& o = outcomes[ctx.rank];
      o = {a.to_vector(), g.to_vector(), s.to_vector(), b.to_vector(), {}};
      for (CommOp op : {CommOp::all_reduce, CommOp::all_gather, CommOp::reduce_scatter, CommOp::broadcast})
        o.stats.push_back(ctx.world->ledger()[op]);
    }, options);
    return outcomes;
  };
  LaunchOptions with_links;
  with_links.topology = Topology::parse_links("intra=1GB/s,2us;inter=1GB/s,20us;gpus-per-node=2");
  std::vector<Outcome> off = run({}), on = run(with_links);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(off[r].reduced, on[r].reduced);
    EXPECT_EQ(off[r].gathered, on[r].gathered);
    EXPECT_EQ(off[r].scattered, on[r].scattered);
    EXPECT_EQ(off[r].broadcast, on[r].broadcast);
    for (size_t op = 0; op < off[r].stats.size(); ++op) {
      EXPECT_EQ(off[r].stats[op].calls, on[r].stats[op].calls);
      EXPECT_EQ(off[r].stats[op].bytes_sent, on[r].stats[op].bytes_sent);
      EXPECT_EQ(off[r].stats[op].bytes_received, on[r].stats[op].bytes_received);
      EXPECT_EQ(off[r].stats[op].link_s, 0.0);
      if (op != 3 || r != 1) {  // the broadcast's root (rank 1) receives nothing
        EXPECT_GT(on[r].stats[op].link_s, 0.0) << "rank " << r << " op " << op;
      }
    }
  }
}

}  // namespace
}  // namespace sl::parallel
