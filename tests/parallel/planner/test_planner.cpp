// The planner against the papers' published figures (parallel/planner/planner.h): ZeRO's Table 1,
// Korthikanti et al.'s Table 2, Narayanan et al.'s parameters, FLOPs and training time, the bubble
// formulas and the schedules' simulated bubbles; the CLI's worked example; bad input. Expected
// values are the papers' numbers (or their formulas with the numbers put in), never the code's.
// tests/parallel/planner/test_planner_ledger.cpp holds the cost model to shardlab's own ledgers.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/planner/planner.h"
#include "parallel/planner/plan_request.h"
#include "tools/plan_cli.h"

namespace sl::parallel::planner {
namespace {

// ZeRO (Rajbhandari et al. 2020) Table 1: GB per device of model states, mixed-precision Adam,
// Ψ = 7.5B, 128B, 1T; columns P_os, P_os+g, P_os+g+p; rows N_d = 1, 4, 16, 64, 256, 1024.
struct ZeroRow {
  double psi, dp, os, os_g, os_g_p;
};
const ZeroRow kZeroTable1[] = {
    {7.5e9, 1, 120, 120, 120},        {7.5e9, 4, 52.5, 41.3, 30},       {7.5e9, 16, 35.6, 21.6, 7.5},
    {7.5e9, 64, 31.4, 16.6, 1.88},    {7.5e9, 256, 30.4, 15.4, 0.47},   {7.5e9, 1024, 30.1, 15.1, 0.12},
    {128e9, 1, 2048, 2048, 2048},     {128e9, 4, 896, 704, 512},        {128e9, 16, 608, 368, 128},
    {128e9, 64, 536, 284, 32},        {128e9, 256, 518, 263, 8},        {128e9, 1024, 513, 257, 2},
    {1e12, 1, 16000, 16000, 16000},   {1e12, 4, 7000, 5500, 4000},      {1e12, 16, 4750, 2875, 1000},
    {1e12, 64, 4187, 2218, 250},      {1e12, 256, 4046, 2054, 62.5},    {1e12, 1024, 4011, 2013, 15.6},
};

// The table prints 3-4 significant digits, rounded or cut off: within one unit of the last digit.
double last_digit(double printed) {
  if (printed >= 100) return 1;
  if (printed >= 10) return printed == std::floor(printed) ? 1 : 0.1;
  return printed >= 1 && printed == std::floor(printed) ? 1 : (printed * 10 == std::floor(printed * 10) ? 0.1 : 0.01);
}

TEST(PlannerPapers, ZeroTable1ModelStatesEveryCell) {
  for (const ZeroRow& row : kZeroTable1) {
    const double printed[] = {row.os, row.os_g, row.os_g_p};
    for (int stage = 1; stage <= 3; ++stage) {
      const double gbytes = zero_model_state_bytes(row.psi, row.dp, stage) / 1e9;
      EXPECT_NEAR(gbytes, printed[stage - 1], last_digit(printed[stage - 1]))
          << "Psi " << row.psi << " N_d " << row.dp << " stage " << stage;
    }
    EXPECT_NEAR(zero_model_state_bytes(row.psi, row.dp, 0) / 1e9, 16 * row.psi / 1e9, 1e-6);  // DP: 16Ψ
  }
}

// The ZeRO row at N_d = 64 through the planner's own path (the CLI's library function): the
// zero-7.5b preset (Ψ = 7.498e9) in bf16 gives 120 / 31.4 / 16.6 / 1.88 GB of model states.
nlohmann::json plan_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv_text{"plan"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  return nlohmann::json::parse(run_plan(parse_plan(static_cast<int>(argv.size()), argv.data())));
}

double model_states(const nlohmann::json& layout) {
  const nlohmann::json& m = layout.at("memory_bytes");
  return m.at("weights").get<double>() + m.at("grads").get<double>() + m.at("optimizer").get<double>();
}

TEST(PlannerPapers, ZeroSevenPointFiveBAtSixtyFourRanksThroughTheCli) {
  const nlohmann::json one = plan_json({"--model", "zero-7.5b", "--dp", "64", "--zero", "1", "--mixed-precision",
                                        "bf16", "--json"});
  ASSERT_EQ(one.at("layouts").size(), 1u);
  EXPECT_NEAR(model_states(one.at("layouts")[0]) / 31.4e9, 1.0, 0.005);  // 2Ψ + 2Ψ + 12Ψ/64
  const double printed[] = {120, 31.4, 16.6, 1.88};  // DDP (the table's N_d = 1 column), stages 1, 2, 3
  for (int zero = 0; zero <= 3; ++zero) {
    const nlohmann::json run = plan_json({"--model", "zero-7.5b", "--dp", "64", "--zero", std::to_string(zero),
                                          "--mixed-precision", "bf16", "--json"});
    EXPECT_NEAR(model_states(run.at("layouts")[0]) / 1e9, printed[zero], last_digit(printed[zero])) << "zero " << zero;
  }
}

// Korthikanti et al. 2022 Table 2, GPT-3's layer (s 2048, b 1, h 12288, a 96) at t = 8: the formulas
// with the numbers put in. shardlab's own model differs by design (no dropout masks, FlashAttention
// keeps no scores), so estimate_memory is held to shardlab's ledgers instead (test_planner_ledger.cpp).
TEST(PlannerPapers, KorthikantiTable2ActivationsPerLayer) {
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
  using nn::Recompute;
  EXPECT_DOUBLE_EQ(korthikanti_activation_bytes(s, b, h, a, 1, false, Recompute::none), sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(korthikanti_activation_bytes(s, b, h, a, t, false, Recompute::none),
                   sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(korthikanti_activation_bytes(s, b, h, a, t, true, Recompute::none),
                   sbh * (34 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(korthikanti_activation_bytes(s, b, h, a, t, false, Recompute::selective), sbh * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(korthikanti_activation_bytes(s, b, h, a, t, true, Recompute::selective), sbh * 34 / t);
  EXPECT_DOUBLE_EQ(korthikanti_activation_bytes(s, b, h, a, t, true, Recompute::full), 2 * sbh);
  // The paper's headline: for GPT-3, 5as/h = 80 > 34, so the attention scores are most of a layer.
  EXPECT_NEAR(korthikanti_activation_bytes(s, b, h, a, 1, false, Recompute::none) / 1e9, 2.869, 0.001);
}

// Narayanan et al. 2021: Table 1's models have 175B, 530B and 1T parameters; the FLOPs formula is
// about 8 × parameters × tokens with recomputation (6 without); GPT-3 on 1024 A100s at 140
// TFLOP/s takes about 34 days for 300B tokens, the 1T model on 3072 at 163 TFLOP/s about 84 days
// for 450B.
TEST(PlannerPapers, NarayananParametersFlopsAndTrainingTime) {
  EXPECT_NEAR(narayanan_parameters(96, 12288, 51200, 2048) / 175e9, 1.0, 0.01);
  EXPECT_NEAR(narayanan_parameters(105, 20480, 51200, 2048) / 530e9, 1.0, 0.01);
  EXPECT_NEAR(narayanan_parameters(128, 25600, 51200, 2048) / 1e12, 1.0, 0.01);
  // shardlab's GPT is the formula's transformer plus the final LayerNorm's 2h.
  for (const char* name : {"gpt3-175b", "megatron-530b", "megatron-1t", "gpt2"}) {
    const nn::GPTConfig c = preset_config(name);
    EXPECT_DOUBLE_EQ(static_cast<double>(gpt_parameters(c)),
                     narayanan_parameters(c.n_layer, c.n_embd, c.vocab_size, c.block_size) + 2 * c.n_embd)
        << name;
  }
  const double P = narayanan_parameters(96, 12288, 51200, 2048), tokens = 1536.0 * 2048;
  EXPECT_NEAR(narayanan_flops(1536, 2048, 96, 12288, 51200, true) / (8 * P * tokens), 1.0, 0.03);
  EXPECT_NEAR(narayanan_flops(1536, 2048, 96, 12288, 51200, false) / (6 * P * tokens), 1.0, 0.03);
  const double day = 86400;
  EXPECT_NEAR(narayanan_training_seconds(300e9, 175e9, 1024, 140e12) / day, 34, 0.5);
  EXPECT_NEAR(narayanan_training_seconds(450e9, 1e12, 3072, 163e12) / day, 84, 1.0);
}

TEST(PlannerPapers, PresetsHaveTheirSizes) {
  const std::pair<const char*, double> sizes[] = {{"gpt2", 124e6},     {"gpt2-medium", 355e6}, {"gpt2-large", 774e6},
                                                  {"gpt2-xl", 1.56e9}, {"zero-7.5b", 7.5e9},   {"llama-8b", 8e9},
                                                  {"llama-70b", 70e9}};
  for (auto [name, size] : sizes)
    EXPECT_NEAR(static_cast<double>(gpt_parameters(preset_config(name))) / size, 1.0, 0.025) << name;
}

// Bubble over ideal: (p-1)/m, (p-1)/(v·m), ZB-H1 (p-1)/(3m), naive p-1; and the action lists on the
// rendezvous simulator give the same.
TEST(PlannerPapers, BubbleFormulasAndSimulatedSchedules) {
  EXPECT_DOUBLE_EQ(bubble_over_ideal(ScheduleKind::gpipe, 4, 8), 3.0 / 8);
  EXPECT_DOUBLE_EQ(bubble_over_ideal(ScheduleKind::one_f_one_b, 4, 8), 3.0 / 8);
  EXPECT_DOUBLE_EQ(bubble_over_ideal(ScheduleKind::interleaved, 4, 8, 2), 3.0 / 16);
  EXPECT_DOUBLE_EQ(bubble_over_ideal(ScheduleKind::zero_bubble, 4, 8), 3.0 / 24);
  EXPECT_DOUBLE_EQ(bubble_over_ideal(ScheduleKind::naive, 4, 8), 3.0);
  for (auto [p, m] : std::vector<std::pair<int, int>>{{2, 4}, {4, 8}, {4, 16}, {8, 16}}) {
    for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zero_bubble})
      EXPECT_NEAR(simulated_bubble(kind, p, m), bubble_over_ideal(kind, p, m), 1e-9)
          << schedule_name(kind) << " p " << p << " m " << m;
    EXPECT_NEAR(simulated_bubble(ScheduleKind::interleaved, p, m, 2),
                bubble_over_ideal(ScheduleKind::interleaved, p, m, 2), 1e-9)
        << "interleaved p " << p << " m " << m;
  }
  EXPECT_THROW(bubble_over_ideal(ScheduleKind::gpipe, 0, 8), Error);
}

// A ring all-reduce of S bytes over n ranks: 2(n-1) steps of S/n at the slowest hop's speed.
TEST(PlannerStepTime, RingCollectivesRunAtTheSlowestHop) {
  const Topology t = Topology::parse_links("intra=100GB/s,1us;inter=10GB/s,10us;gpus-per-node=4");
  GroupTraffic inside{"dp", CommOp::all_reduce, 1, 2 * 3 * 100'000'000, 0, {0, 1, 2, 3}, {MeshDim::dp}};  // S = 400 MB: 2·3/4·S sent
  EXPECT_NEAR(traffic_seconds(inside, t), 6 * (1e-6 + 100e6 / 100e9), 1e-9);
  GroupTraffic across{"dp", CommOp::all_reduce, 1, 2 * 3 * 100'000'000, 0, {0, 4, 8, 12}, {MeshDim::dp}};
  EXPECT_NEAR(traffic_seconds(across, t), 6 * (10e-6 + 100e6 / 10e9), 1e-9);
  GroupTraffic gather{"tp", CommOp::all_gather, 2, 2 * 3 * 1'000'000, 0, {0, 1, 2, 3}, {MeshDim::tp}};  // 2 calls of S = 4 MB
  EXPECT_NEAR(traffic_seconds(gather, t), 2 * 3 * (1e-6 + 1e6 / 100e9), 1e-12);
}

// The seeds' first rule: a model that fits on one GPU trains data-parallel, uncut.
TEST(PlannerSearch, SmallModelTrainsDataParallel) {
  Workload work{preset_config("gpt2"), {64, 1024}};
  Cluster cluster;
  cluster.topology = Topology::parse_links("intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=8");
  cluster.gpu_memory_bytes = 80e9;
  cluster.flops = 312e12;
  const Ranking r = search(work, cluster);
  ASSERT_GT(r.fitting(), 0);
  const ParallelismConfig& best = r.layouts.front().plan.parallelism;
  EXPECT_EQ(best.tp * best.pp * best.cp, 1) << r.layouts.front().plan.name();
  // 175B on one node of 80 GB GPUs: 16 bytes x 175e9 / 8 = 350 GB a GPU: nothing fits, and it says so.
  const Ranking big = search({preset_config("gpt3-175b"), {8, 2048}}, cluster);
  EXPECT_EQ(big.fitting(), 0);
  EXPECT_TRUE(recommendation(big, {preset_config("gpt3-175b"), {8, 2048}}, cluster).starts_with("Nothing fits"));
}

TEST(PlannerBadInput, ErrorsNameTheValue) {
  try {
    preset_config("gpt5");
    FAIL() << "gpt5 is not a preset";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gpt5'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gpt2, gpt2-medium"), std::string::npos) << e.what();
  }
  Workload work{preset_config("gpt2"), {64, 1024}};
  TrainPlan tp5;
  tp5.parallelism.tp = 5;
  EXPECT_THROW(check_layout(work, tp5, 5), Error);
  TrainPlan pp5;
  pp5.parallelism.pp = 5;
  EXPECT_THROW(check_layout(work, pp5, 5), Error);
  Cluster no_memory;
  no_memory.topology.gpus_per_node = 8;
  no_memory.flops = 1e12;
  EXPECT_THROW(no_memory.validate(), Error);
}

// The binary: one line on stderr naming the value, exit code 2.
struct CliResult {
  int exit_code;
  std::string output;
};
CliResult run_cli(const std::string& args) {
  const char* train = std::getenv("SL_TRAIN_BIN");
  std::string bin = train ? std::string(train) : "build/bin/train";
  bin = bin.substr(0, bin.size() - 5) + "plan";  // beside train
  FILE* pipe = popen((bin + " " + args + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The flags' errors through the CLI's library functions, then the binary itself for two of them.
std::string plan_error(const std::string& args) {
  std::vector<std::string> words{"plan"};
  std::istringstream in(args);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  try {
    run_plan(parse_plan(static_cast<int>(argv.size()), argv.data()));
  } catch (const UsageError& e) {
    return e.message;
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(PlannerBadInput, CliRefusesNamingTheValue) {
  const std::pair<std::string, std::string> cases[] = {
      {"--model gpt2 --tp 5", "tp 5 does not divide the 12 heads"},
      {"--model gpt2 --pp 5", "pp 5 x virtual stages 1 does not divide the 12 layers"},
      {"--model gpt2 --gpu-memory 0GB", "GPU memory must be > 0"},
      {"--model gpt2 --flops 0TFLOP/s", "FLOP/s per GPU must be > 0"},
      {"--model gpt5", "unknown model preset 'gpt5'"},
      {"--model gpt2 --bogus 3", "unknown flag --bogus"},
      {"--model gpt2 --tp two", "--tp: expected an integer"},
      {"--model gpt2 --seq-len 2048", "the sequence length 2048 must be in 1..block_size 1024"},
      {"--model gpt2 --dp 4 --batch-size 6", "--batch-size 6 must be micro-batch rows x 1 micro-batches"},
  };
  for (const auto& [args, message] : cases)
    EXPECT_NE(plan_error(args).find(message), std::string::npos) << args << ": " << plan_error(args);
  for (const auto& [args, message] : {cases[0], cases[5]}) {
    const CliResult run = run_cli(args);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << args << "\n" << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << args << "\n" << run.output;
    EXPECT_TRUE(run.output.starts_with("plan: " + message) || run.output.starts_with("plan: unknown flag"))
        << "the program is named once: " << run.output;
  }
}

}  // namespace
}  // namespace sl::parallel::planner
