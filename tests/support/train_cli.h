// tests/support/train_cli.h — running build/bin/train from a test (tests/tools/test_train_cli.cpp,
// tests/tools/test_train_layouts.cpp): the binary, its exit code and output, temp files, logs and checkpoints.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "nn/safetensors.h"
#include "tests/support/compare.h"

namespace sl::train_cli {

// `make test` passes the binary it built in SL_TRAIN_BIN.
inline std::string train_binary() {
  const char* path = std::getenv("SL_TRAIN_BIN");
  return path ? path : "build/bin/train";
}

struct CliRun {
  int exit_code;
  std::string output;  // stdout and stderr together, unless the redirection says otherwise
};

// Runs `train ARGS REDIRECT` through the shell; the default redirection joins stderr to stdout.
inline CliRun run_train(const std::string& args, const std::string& redirect = "2>&1") {
  std::string command = train_binary() + " " + args + " " + redirect;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// A path in the test's temp directory, unique to this process.
inline std::string temp_path(const std::string& name) {
  return testing::TempDir() + "shardlab_train_" + std::to_string(getpid()) + "_" + name;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// The losses of a JSONL log, in step order.
inline std::vector<double> logged_losses(const std::string& path) {
  std::vector<double> losses;
  std::regex line(R"re(\{"step": (\d+), "loss": ([0-9.e+-]+),)re");
  std::string text = read_file(path);
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
    losses.push_back(std::stod((*it)[2]));
  return losses;
}

// A text corpus for --task text: the seed then draws only the weights, so two runs differ only where
// their starting weights do.
inline std::string write_corpus(const std::string& name) {
  std::string path = temp_path(name);
  std::ofstream(path) << "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "
                         "sphinx of black quartz, judge my vow! how vexingly quick daft zebras jump.\n";
  return path;
}

// Two checkpoints hold the same names and shapes, and every value agrees within atol + rtol |expected|
// (DDP/ZeRO parity: rtol 1.3e-6, atol 1e-5).
inline void expect_same_weights(const std::string& got_path, const std::string& expected_path, double rtol,
                                double atol) {
  test_support::expect_close(nn::load_safetensors(got_path), nn::load_safetensors(expected_path),
                             {.atol = atol, .rtol = rtol}, got_path + " vs " + expected_path);
}

class TrainCli : public testing::Test {
 protected:
  void SetUp() override {
    if (std::ifstream(train_binary()).good()) return;
    FAIL() << "the train binary is missing at " << train_binary() << " (build it with make, or set SL_TRAIN_BIN)";
  }
};

}  // namespace sl::train_cli
