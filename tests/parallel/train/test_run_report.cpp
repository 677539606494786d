// test_run_report.cpp — the run report (parallel/train/run_report.h) says what the ledgers say: each
// (group, op) row equals that group's ledger, the memory rows equal the memory ledger, the times add
// up to the wall time, and the JSON carries the same numbers. Then `train --report-json` end to end.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/train/run_report.h"
#include "parallel/train/trainer.h"
#include "tests/support/trainer.h"
#include "tensor/ledger.h"
#include "tests/support/train_cli.h"

namespace sl::parallel {
namespace {

struct ReportCase {
  std::string name;
  TrainPlan plan;
  int world;
};
void PrintTo(const ReportCase& c, std::ostream* out) { *out << c.name; }

class RunReport : public testing::TestWithParam<ReportCase> {};

TEST_P(RunReport, EveryRowIsWhatTheLedgersHold) {
  const ReportCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  std::vector<RankReport> reports(c.world);
  std::vector<std::vector<std::pair<std::string, CommStats>>> expected(c.world);
  launch(c.world, [&](RankContext& ctx) {
    const nn::TokenStream tokens = parity_tokens();
    MemoryLedger::instance().reset_peak(ctx.device);
    Trainer trainer(ctx, c.plan, parallelize(parity_config(), 3, ctx.world, c.plan.parallelize_options(parity_adamw())));
    for (int step = 0; step < 2; ++step) trainer.train_step(tokens, step, 12, parity_config().block_size, 1e-2, 1.0);
    RankReport report = collect_rank_report(ctx.rank, trainer.mesh().coordinates(), trainer.ledgers(), ctx.device,
                                            10.0, trainer.step_seconds(), trainer.step_blocked_seconds());
    // The ledgers, read here on their own: every op of every group that was called.
    for (const auto& [group, ledger] : trainer.ledgers())
      for (int o = 0; o < static_cast<int>(CommOp::count_); ++o)
        if ((*ledger)[static_cast<CommOp>(o)].calls > 0)
          expected[ctx.rank].emplace_back(group + "/" + comm_op_name(static_cast<CommOp>(o)),
                                          (*ledger)[static_cast<CommOp>(o)]);
    const MemoryLedger& memory = MemoryLedger::instance();
    ASSERT_EQ(report.memory.size(), static_cast<size_t>(kNumMemoryCategories) + 1);
    EXPECT_EQ(report.memory[0].category, "weights");
    EXPECT_EQ(report.memory[0].current, memory.current(ctx.device, MemoryCategory::weights));
    EXPECT_EQ(report.memory.back().category, "total");
    EXPECT_EQ(report.memory.back().peak, memory.peak(ctx.device));
    EXPECT_EQ(report.coordinates, trainer.mesh().coordinates());
    reports[ctx.rank] = report;
  });
  for (int r = 0; r < c.world; ++r) {
    const RankReport& report = reports[r];
    ASSERT_EQ(report.traffic.size(), expected[r].size()) << "rank " << r;
    for (size_t i = 0; i < expected[r].size(); ++i) {
      EXPECT_EQ(report.traffic[i].group + "/" + report.traffic[i].op, expected[r][i].first);
      EXPECT_EQ(report.traffic[i].stats.calls, expected[r][i].second.calls);
      EXPECT_EQ(report.traffic[i].stats.bytes_sent, expected[r][i].second.bytes_sent);
      EXPECT_EQ(report.traffic[i].stats.bytes_received, expected[r][i].second.bytes_received);
    }
    EXPECT_NEAR(report.compute_s + report.communication_s + report.idle_s, report.wall_s, 1e-9) << "rank " << r;
    EXPECT_GT(report.compute_s, 0) << "rank " << r << ": two steps of a GPT take time";
    EXPECT_GT(report.communication_s, 0) << "rank " << r << ": every layout waits in its collectives";
  }
  // The JSON holds the same numbers under the documented names.
  const nlohmann::json json = nlohmann::json::parse(run_report_json(c.plan.name(), c.plan.parallelism, 2, reports));
  EXPECT_EQ(json["plan"], c.plan.name());
  EXPECT_EQ(json["steps"], 2);
  EXPECT_EQ(json["parallelism"]["dp_shard"], c.plan.parallelism.dp_shard);
  ASSERT_EQ(json["ranks"].size(), static_cast<size_t>(c.world));
  for (int r = 0; r < c.world; ++r) {
    const auto& rank = json["ranks"][r];
    EXPECT_EQ(rank["rank"], r);
    EXPECT_EQ(rank["coordinates"]["dp_shard"], reports[r].coordinates[2]);
    EXPECT_EQ(rank["memory"]["total"]["peak_bytes"], reports[r].memory.back().peak);
    ASSERT_EQ(rank["communication"].size(), reports[r].traffic.size());
    EXPECT_EQ(rank["communication"][0]["bytes_sent"], reports[r].traffic[0].stats.bytes_sent);
    EXPECT_DOUBLE_EQ(rank["time_s"]["communication"].get<double>(), reports[r].communication_s);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RunReport,
                         testing::Values(ReportCase{"ddp", TrainPlan::data_parallel(2), 2},
                                         ReportCase{"zero2", TrainPlan::data_parallel(2, 2), 2},
                                         ReportCase{"hsdp", {.parallelism = {.dp_replicate = 2, .dp_shard = 2}, .dp_strategy = DpStrategy::fsdp}, 4}),
                         [](const auto& info) { return info.param.name; });

// train --report-json, serial and ZeRO-2: the file parses, names every rank's coordinates, and its
// reduce-scatter bytes per step are ZeRO-2's (N-1)/N · 4Ψ (padding aside) for the run's model.
TEST(RunReport, TrainWritesItForEveryRank) {
  using namespace train_cli;
  const std::string corpus = write_corpus("report_corpus.txt"), path = temp_path("report.json");
  const std::string args = "--task text --data " + corpus +
                           " --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --steps 3 --eval-every 0"
                           " --threads 1 --report-json " + path;
  CliRun serial = run_train(args);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  nlohmann::json one = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(one["plan"], "serial");
  ASSERT_EQ(one["ranks"].size(), 1u);
  EXPECT_TRUE(one["ranks"][0]["communication"].empty());
  EXPECT_GT(one["ranks"][0]["memory"]["weights"]["current_bytes"].get<int64_t>(), 0);

  CliRun zero2 = run_train(args + " --dp 2 --zero 2");
  ASSERT_EQ(zero2.exit_code, 0) << zero2.output;
  nlohmann::json two = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(two["plan"], "zero2");
  ASSERT_EQ(two["ranks"].size(), 2u);
  // Ψ of GPT(vocab 256, block 16, 1 layer, n_embd 16): wte 256·16 + wpe 16·16 + a block's 12C² + 13C + ln_f 2C.
  const int64_t C = 16, psi = 256 * C + 16 * C + 12 * C * C + 13 * C + 2 * C;
  for (int r = 0; r < 2; ++r) {
    const auto& rank = two["ranks"][r];
    EXPECT_EQ(rank["coordinates"]["dp_shard"], r);
    int64_t scattered = 0;
    for (const auto& row : rank["communication"])
      if (row["group"] == "dp_shard" && row["op"] == "reduce_scatter") scattered += row["bytes_sent"].get<int64_t>();
    const double per_step = scattered / 3.0, formula = 0.5 * 4 * psi;
    EXPECT_GE(per_step, formula) << "rank " << r;
    EXPECT_LE(per_step, formula * 1.02) << "rank " << r << ": padding adds well under 2%";
    EXPECT_FALSE(rank.contains("pipeline")) << "only a pipeline stage reports one";
  }

  // A 1F1B pipeline over p = 3 stages with m = 4 micro-batches: each stage names its layers, holds at
  // most min(p - r, m) micro-batches (1F1B's warm-up), and reports the bubble beside (p-1)/(m+p-1).
  CliRun pipeline = run_train(args + " --n-layer 3 --pp 3 --micro-batches 4");
  ASSERT_EQ(pipeline.exit_code, 0) << pipeline.output;
  nlohmann::json three = nlohmann::json::parse(read_file(path));
  ASSERT_EQ(three["ranks"].size(), 3u);
  const int p = 3, m = 4;
  for (int r = 0; r < p; ++r) {
    const auto& stage = three["ranks"][r]["pipeline"];
    EXPECT_EQ(three["ranks"][r]["coordinates"]["pp"], r);
    EXPECT_NE(stage["stage"].get<std::string>().find("h." + std::to_string(r)), std::string::npos) << stage;
    EXPECT_EQ(stage["schedule"], "1f1b");
    EXPECT_EQ(stage["peak_micro_batches"].get<int>(), std::min(p - r, m)) << "rank " << r;
    EXPECT_DOUBLE_EQ(stage["bubble_formula"].get<double>(), (p - 1.0) / (m + p - 1.0));
    EXPECT_GE(stage["bubble"].get<double>(), 0.0);
    EXPECT_LT(stage["bubble"].get<double>(), 1.0);
  }
  EXPECT_NE(pipeline.output.find("1f1b: at most 3 micro-batches held"), std::string::npos) << pipeline.output;
  std::remove(path.c_str());
  std::remove(corpus.c_str());
}

}  // namespace
}  // namespace sl::parallel
