// train's distributed checkpoints end to end (issue 24): --checkpoint-dir / --save-every / --keep-last,
// --resume under the same layout (bitwise, dropout and micro-batches on) and under another (the
// serial curve), refusals before step 0, a corrupt shard caught, and a run killed with SIGKILL in the
// middle of its saves resuming from its last complete checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "tests/support/train_cli.h"

namespace sl {
namespace {

using namespace train_cli;
namespace fs = std::filesystem;

std::string args(const std::string& corpus, int steps) {
  return "--task text --data " + corpus + " --n-layer 2 --n-head 4 --n-embd 32 --block-size 16 --batch-size 8 --steps " +
         std::to_string(steps) + " --eval-every 0 --lr 1e-2 --warmup-steps 0 --adam-eps 1e-6 --threads 1 --seed 5";
}

class TrainCheckpoint : public TrainCli {
 protected:
  void SetUp() override {
    TrainCli::SetUp();
    corpus_ = write_corpus("checkpoint_corpus.txt");
    root_ = temp_path("checkpoints");
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    fs::remove_all(root_);
    std::remove(corpus_.c_str());
  }
  std::string dir(const std::string& name) const { return root_ + "/" + name; }
  std::string corpus_, root_;
};

// Same layout: 8 steps straight against 4, a resume, 4 more: the same losses and the same saved bytes,
// with dropout drawing from every rank's generator and 2 micro-batches a step.
TEST_F(TrainCheckpoint, TheSameLayoutResumesBitwiseWithDropoutAndMicroBatches) {
  for (const std::string layout : {"--dp 2 --zero 2 --micro-batches 2", "--pp 2 --micro-batches 2", "--tp 2 --dp 2"}) {
    const std::string common = layout + " --dropout 0.1";
    CliRun straight = run_train(args(corpus_, 8) + " " + common + " --save " + dir("straight.st") + " --log-jsonl " +
                                dir("straight.jsonl"));
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
    CliRun first = run_train(args(corpus_, 8) + " " + common + " --checkpoint-dir " + dir("run") + " --save-every 4");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    CliRun resumed = run_train(args(corpus_, 8) + " " + common + " --resume " + dir("run/step-00000004") + " --save " +
                               dir("resumed.st") + " --log-jsonl " + dir("resumed.jsonl"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
    const std::vector<double> all = logged_losses(dir("straight.jsonl")), tail = logged_losses(dir("resumed.jsonl"));
    ASSERT_EQ(all.size(), 8u);
    ASSERT_EQ(tail.size(), 4u) << layout;
    for (int s = 0; s < 4; ++s) EXPECT_EQ(tail[s], all[4 + s]) << layout << ": step " << 4 + s;
    EXPECT_TRUE(read_file(dir("resumed.st")) == read_file(dir("straight.st"))) << layout << ": the weights differ";
    fs::remove_all(dir("run"));
  }
}

// Another layout: the resumed run's losses are the uninterrupted serial run's (the cut's tolerance),
// whatever the new dp degree: the data stream's position is the step alone.
TEST_F(TrainCheckpoint, AnotherLayoutContinuesTheSerialRun) {
  CliRun serial = run_train(args(corpus_, 6) + " --log-jsonl " + dir("serial.jsonl"));
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  const std::vector<double> expected = logged_losses(dir("serial.jsonl"));
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"--dp 2 --zero 3", "--tp 2 --pp 2 --micro-batches 2"},
      {"--dp-replicate 2 --dp-shard 2 --tp 2", "--dp 4 --zero 1"},
      {"--pp 2 --micro-batches 2 --dp 2 --zero 1", ""},  // to serial
      {"", "--cp 2 --dp 2 --zero 2"}};  // from serial
  for (const auto& [before, after] : pairs) {
    fs::remove_all(dir("run"));
    // --steps 6 as the serial run's (the lr schedule spans the run), a checkpoint after step 3.
    CliRun first = run_train(args(corpus_, 6) + " " + before + " --checkpoint-dir " + dir("run") + " --save-every 3");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    CliRun resumed = run_train(args(corpus_, 6) + " " + after + " --resume " + dir("run/step-00000003") +
                               " --log-jsonl " + dir("resumed.jsonl"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const std::vector<double> tail = logged_losses(dir("resumed.jsonl"));
    ASSERT_EQ(tail.size(), 3u) << before << " -> " << after;
    for (int s = 0; s < 3; ++s)
      EXPECT_NEAR(tail[s], expected[3 + s], 4e-5 + 1e-5 * expected[3 + s])
          << "'" << before << "' -> '" << after << "': step " << 3 + s;
  }
}

TEST_F(TrainCheckpoint, KeepLastDeletesOnlyOlderCompleteCheckpoints) {
  CliRun run = run_train(args(corpus_, 6) + " --dp 2 --checkpoint-dir " + dir("run") + " --save-every 2 --keep-last 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir("run"))) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000004", "step-00000006"}));
}

// Refused before step 0, naming both values; a flipped byte is named with its file.
TEST_F(TrainCheckpoint, ResumeRefusesAnotherModelAndCorruptShards) {
  ASSERT_EQ(run_train(args(corpus_, 2) + " --dp 2 --checkpoint-dir " + dir("run")).exit_code, 0);
  CliRun wider = run_train(args(corpus_, 4) + " --n-embd 64 --resume " + dir("run"));
  EXPECT_EQ(wider.exit_code, 1);
  EXPECT_NE(wider.output.find("n_embd 32 but this run has n_embd 64"), std::string::npos) << wider.output;
  CliRun longer = run_train(args(corpus_, 4) + " --block-size 32 --resume " + dir("run"));
  EXPECT_EQ(longer.exit_code, 1);
  EXPECT_NE(longer.output.find("block_size 16 but this run has block_size 32"), std::string::npos) << longer.output;
  EXPECT_EQ(run_train(args(corpus_, 4) + " --save-every 2").exit_code, 2);  // no --checkpoint-dir
  // Flip one byte in the middle of rank 0's shard (DDP's replicas: rank 0 saves them all).
  const std::string shard = dir("run/step-00000002/shard-00000.safetensors");
  ASSERT_TRUE(fs::exists(shard));
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(f.tellg());
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(size / 2);
  f.write(&c, 1);
  f.close();
  CliRun corrupt = run_train(args(corpus_, 4) + " --dp 2 --resume " + dir("run"));
  EXPECT_EQ(corrupt.exit_code, 1);
  EXPECT_NE(corrupt.output.find("shard-00000.safetensors"), std::string::npos) << corrupt.output;
}

// kill -9 while a run saves a checkpoint every step: the newest complete one verifies, and a resumed
// run finishes from it. No partial checkpoint is ever taken for a complete one.
TEST_F(TrainCheckpoint, ARunKilledWhileSavingResumesFromItsLastCompleteCheckpoint) {
  const std::string command = train_binary() + " " + args(corpus_, 100000) + " --dp 2 --zero 3 --checkpoint-dir " +
                              dir("run") + " --save-every 1 --keep-last 3 > /dev/null 2>&1";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait for a few checkpoints, then kill it wherever it is (most likely inside a save).
  for (int i = 0; i < 200 && parallel::checkpoint::complete_steps(dir("run")).size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run ended on its own";
  const auto newest = parallel::checkpoint::newest_complete(dir("run"));
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->find(".partial"), std::string::npos) << *newest;
  parallel::checkpoint::Reader(*newest).verify();
  const int64_t step = parallel::checkpoint::Reader(*newest).run_state().at("step").get<int64_t>();
  CliRun resumed = run_train(args(corpus_, static_cast<int>(step) + 2) + " --tp 2 --resume " + dir("run"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step " + std::to_string(step)), std::string::npos) << resumed.output;
}

}  // namespace
}  // namespace sl
