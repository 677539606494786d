// build/bin/checkpoint (tools/checkpoint.cpp): info, verify and consolidate on a checkpoint saved by
// thread ranks, a flipped byte named by verify, and usage errors (exit 2, one line).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "nn/safetensors.h"
#include "tests/support/checkpoint.h"

namespace sl::parallel::checkpoint {
namespace {

using namespace testing_util;

// Runs build/bin/checkpoint (beside this test binary's build/tests/) with `args`; its exit code, and its output.
int run_tool(const std::string& args, std::string& output) {
  const std::string exe = std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / "bin/checkpoint";
  FILE* pipe = ::popen((exe + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  output.clear();
  while (size_t got = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, got);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(CheckpointDirTest, TheToolInformsVerifiesAndConsolidates) {
  save_model(dir_, Cut::cols, 3, 4, 10);
  std::string out;
  ASSERT_EQ(run_tool("info " + dir_, out), 0) << out;
  EXPECT_NE(out.find("layout: cols x3"), std::string::npos) << out;
  EXPECT_NE(out.find("h.0.bf"), std::string::npos) << out;
  EXPECT_NE(out.find("version"), std::string::npos) << out;
  ASSERT_EQ(run_tool("verify " + dir_, out), 0) << out;
  EXPECT_NE(out.find("every size and SHA-256 matches"), std::string::npos) << out;
  ASSERT_EQ(run_tool("consolidate " + dir_ + " " + path("model.safetensors"), out), 0) << out;
  const nn::StateDict weights = nn::load_safetensors(path("model.safetensors"));
  std::vector<StatePiece> pieces;
  for (const auto& [name, tensor] : weights)
    pieces.push_back({name, tensor.shape(), Region{std::vector<int64_t>(tensor.dim(), 0), tensor.shape(), 0,
                                                   tensor.numel()}, tensor.reshape({tensor.numel()}), true});
  EXPECT_EQ(pieces.size(), 5u);  // the weights: not exp_avg.w
  EXPECT_EQ(check_pieces(pieces, 4), "");
  const std::string shard = path("step-00000010/shard-00002.safetensors"), bytes = read_file_bytes(shard);
  write_file_bytes(shard, bytes.substr(0, 100) + "X" + bytes.substr(101));
  ASSERT_EQ(run_tool("verify " + dir_, out), 1) << out;
  EXPECT_NE(out.find("shard-00002.safetensors (holding "), std::string::npos) << out;
  EXPECT_EQ(run_tool("verify", out), 2) << out;
  EXPECT_EQ(run_tool("consolidate " + dir_, out), 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace
}  // namespace sl::parallel::checkpoint
