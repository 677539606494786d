// The run report's tokens per expert: each --log-jsonl record of a mixture-of-experts model holds, per
// MoE layer, the assignments routed to and kept by each expert over the step's micro-batches; under
// --ep they are the whole batch's routing, so the same as the serial model's from the same weights
// (under --ep micro-batch m of every rank is the serial run's micro-batch m).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "tests/support/train_cli.h"

namespace sl {
namespace {

using namespace train_cli;

const std::string kMoE =
    "--task addition --n-layer 2 --n-head 2 --n-embd 16 --batch-size 16 --steps 2 --eval-every 0 "
    "--moe-experts 4 --moe-top-k 2 --moe-capacity-factor 0.75";

std::vector<nlohmann::json> records(const std::string& path) {
  std::istringstream lines(read_file(path));
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST_F(TrainCli, LogsTokensPerExpertEachStepSeriallyAndUnderEp) {
  const std::string serial_log = temp_path("moe_serial.jsonl"), ep_log = temp_path("moe_ep.jsonl");
  CliRun serial = run_train(kMoE + " --micro-batches 2 --log-jsonl " + serial_log);  // counts add up over both
  const std::string one_log = temp_path("moe_one.jsonl");
  ASSERT_EQ(run_train(kMoE + " --log-jsonl " + one_log).exit_code, 0);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  CliRun ep = run_train(kMoE + " --ep 2 --log-jsonl " + ep_log);
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  EXPECT_NE(serial.output.find("experts max/mean"), std::string::npos) << serial.output;
  const auto s = records(serial_log), one = records(one_log), e = records(ep_log);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(e.size(), 2u);
  // The addition task's sequences: 16 rows of block_size tokens per step, routed k = 2 times each.
  for (const std::vector<nlohmann::json>* log : {&s, &e})
    for (const auto& record : *log)
      for (const std::string layer : {"h.0.mlp", "h.1.mlp"}) {
        const auto& load = record.at("experts").at(layer);
        const auto routed = load.at("routed").get<std::vector<int64_t>>();
        const auto kept = load.at("kept").get<std::vector<int64_t>>();
        const int64_t tokens = load.at("tokens").get<int64_t>();
        ASSERT_EQ(routed.size(), 4u);
        EXPECT_EQ(std::accumulate(routed.begin(), routed.end(), int64_t{0}), 2 * tokens) << layer;
        EXPECT_EQ(tokens, one[0].at("experts").at(layer).at("tokens").get<int64_t>()) << "every row of the step";
        for (size_t x = 0; x < 4; ++x) EXPECT_LE(kept[x], routed[x]);
        // capacity factor 0.75 of an even share: some expert drops assignments
        EXPECT_LT(std::accumulate(kept.begin(), kept.end(), int64_t{0}), 2 * tokens) << layer;
      }
  // Step 0 starts from the same weights and batch: the whole batch's routing is the serial model's.
  EXPECT_EQ(one[0].at("experts"), e[0].at("experts"));
  // With two micro-batches each is one MoE batch, capped on its own: the routing is counted over both.
  EXPECT_EQ(s[0].at("experts").at("h.0.mlp").at("routed"), one[0].at("experts").at("h.0.mlp").at("routed"));
  // Under --ep with two micro-batches each rank takes its slice of each of the serial run's: the same
  // two MoE batches, so the same drops.
  const std::string ep_micro_log = temp_path("moe_ep_micro.jsonl");
  CliRun ep_micro = run_train(kMoE + " --ep 2 --micro-batches 2 --log-jsonl " + ep_micro_log);
  ASSERT_EQ(ep_micro.exit_code, 0) << ep_micro.output;
  EXPECT_EQ(records(ep_micro_log)[0].at("experts"), s[0].at("experts"));
}

// The serial run trains through an expert that no token reached in a step (its log shows kept 0): it has
// no gradient, which AdamW skips, where DDP over the one rank would wait for it.
TEST_F(TrainCli, TheSerialRunTrainsPastAnExpertNoTokenReached) {
  const std::string log = temp_path("moe_idle.jsonl");
  CliRun run = run_train("--task addition --n-layer 2 --n-head 4 --n-embd 32 --batch-size 8 --steps 8 --eval-every 0 "
                         "--lr 1e-2 --warmup-steps 0 --threads 1 --seed 5 --moe-experts 4 --moe-top-k 2 "
                         "--moe-capacity-factor 1 --log-jsonl " + log);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  int idle = 0;
  for (const auto& record : records(log))
    for (const auto& [layer, load] : record.at("experts").items())
      for (int64_t kept : load.at("kept").get<std::vector<int64_t>>()) idle += kept == 0;
  EXPECT_GT(idle, 0) << "this run must leave an expert without rows in some step";
}

}  // namespace
}  // namespace sl
