// train --config FILE.toml (tools/train_cli.h, tools/cli.h): the keys are the flags without --, each
// checked like its flag; the command line wins over the file; a bad key or value names the file, the
// key and the value. And every layout in configs/ runs (a few steps each, so none of them can rot).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/train_cli.h"
#include "tools/train_cli.h"

namespace sl {
namespace {

// A TOML file in the test's temp directory.
std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = train_cli::temp_path(name);
  std::ofstream(path) << text;
  return path;
}

// parse_train() of "train ARGS..."; the UsageError's message, or "" when it parsed.
std::string parse_error(std::vector<std::string> args, Options* parsed = nullptr) {
  args.insert(args.begin(), "train");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    Options o = parse_train(static_cast<int>(argv.size()), argv.data());
    if (parsed) *parsed = o;
  } catch (const UsageError& e) {
    return e.message;
  }
  return "";
}

TEST(TrainConfig, TheFileSetsTheFlagsItNames) {
  const std::string path = write_config("layout.toml",
                                        "# a layout\n"
                                        "dp-replicate = 2\n"
                                        "dp_shard = 2   # underscores read as dashes\n"
                                        "tp = 2\n"
                                        "sp = true\n"
                                        "cp = 2\n"
                                        "cp-variant = \"allgather\"\n"
                                        "lr = 1e-3\n");
  Options o;
  ASSERT_EQ(parse_error({"--config", path}, &o), "");
  EXPECT_EQ(o.dp_replicate, 2);
  EXPECT_EQ(o.dp_shard, 2);
  EXPECT_EQ(o.tp, 2);
  EXPECT_TRUE(o.sp);
  EXPECT_EQ(o.cp, 2);
  EXPECT_EQ(o.cp_variant, "allgather");
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.world(), 16);
  EXPECT_EQ(o.steps, Options().steps);  // what the file does not name keeps its default
}

TEST(TrainConfig, TheCommandLineWinsOverTheFile) {
  const std::string path = write_config("override.toml", "tp = 2\nsteps = 40\ncp-variant = \"ring\"\n");
  Options o;
  ASSERT_EQ(parse_error({"--config", path, "--steps", "3", "--tp", "4"}, &o), "");
  EXPECT_EQ(o.steps, 3);
  EXPECT_EQ(o.tp, 4);
  ASSERT_EQ(parse_error({"--steps", "5", "--config", path}, &o), "");  // wherever --config stands
  EXPECT_EQ(o.steps, 5);
  EXPECT_EQ(o.tp, 2);
}

TEST(TrainConfig, AnUnknownKeyIsRefusedNamingTheFile) {
  const std::string path = write_config("unknown.toml", "tp = 2\ntensor-parallel = 2\n");
  EXPECT_EQ(parse_error({"--config", path}),
            path + ": unknown key tensor-parallel = 2 (the keys are train's flags without --: train --help)");
  const std::string section = write_config("section.toml", "[model]\nn-layer = 2\n");
  EXPECT_EQ(parse_error({"--config", section}),
            section + ": [model]: sections are not read; write each key at the top, as its flag without --");
}

TEST(TrainConfig, ABadValueIsRefusedWithItsRange) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"tp = 0\n", "tp = 0: expected an integer in 1..1024, got '0'"},
           {"steps = \"many\"\n", "steps = many: expected an integer >= 0, got 'many'"},
           {"cp-variant = \"star\"\n", "cp-variant = star: expected one of ring, allgather, ulysses, hybrid, got 'star'"},
           {"sp = 3\n", "sp = 3: expected true or false, got '3'"},
           {"dropout = 1.5\n", "dropout = 1.5: expected a probability in [0, 1), got '1.5'"}}) {
    const std::string path = write_config("bad.toml", text);
    EXPECT_EQ(parse_error({"--config", path}), path + ": " + message) << text;
  }
  EXPECT_EQ(parse_error({"--config", "/nonexistent/layout.toml"}),
            "--config: expected an existing file, got '/nonexistent/layout.toml'");
  // The cross-flag checks hold for what the file says too.
  const std::string sp = write_config("sp.toml", "sp = true\n");
  EXPECT_EQ(parse_error({"--config", sp}), "--sp shards the sequence over the tensor-parallel ranks: add --tp N");
}

// Every layout in configs/ trains: `train --config configs/NAME.toml --steps 2` (the tests run in the
// repository's root, as `make test` does).
using train_cli::TrainCli;

TEST_F(TrainCli, EveryConfigInConfigsRuns) {
  std::vector<std::string> configs;
  for (const auto& entry : std::filesystem::directory_iterator("configs"))
    if (entry.path().extension() == ".toml") configs.push_back(entry.path().string());
  ASSERT_GE(configs.size(), 5u) << "configs/ holds the layouts (hsdp_cp_tp, fsdp_tp, fsdp_cp, hsdp_tp, ddp)";
  for (const std::string& config : configs) {
    const train_cli::CliRun run = train_cli::run_train("--config " + config + " --steps 2 --eval-every 0");
    EXPECT_EQ(run.exit_code, 0) << config << "\n" << run.output;
    EXPECT_NE(run.output.find("trained 2 steps"), std::string::npos) << config << "\n" << run.output;
  }
}

}  // namespace
}  // namespace sl
