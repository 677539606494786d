// The train program's output paths are checked before step 0, so a run that could not write its
// results fails at once instead of after hours of training:
//   * --checkpoint-dir: created (with its parents) and a file written into it and removed; an
//     unwritable one fails with one line naming the flag and the path (exit 1, as the other output
//     errors), a writable one holding earlier checkpoints is left exactly as it was;
//   * --report-json and --trace: a missing folder or a directory in the file's place fails the same way;
//   * the directory probe itself (train_files::check_output_directory) leaves nothing behind.
// (--save and --log-jsonl: tests/tools/test_train_cli.cpp; the file probes: test_train_files.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/support/test_util.h"
#include "tests/support/train_cli.h"
#include "parallel/train/train_files.h"

namespace sl {
namespace {

using namespace train_cli;
namespace fs = std::filesystem;

const std::string kTiny =
    "--n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --eval-every 0 --threads 1";

// Every file under root (relative path -> bytes) and every folder (-> "<dir>").
std::map<std::string, std::string> tree(const std::string& root) {
  std::map<std::string, std::string> entries;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root))
    entries[fs::relative(e.path(), root).string()] = e.is_directory() ? "<dir>" : read_file(e.path().string());
  return entries;
}

struct RefusedRun {
  std::string args, error;
};

// Each run stops before anything is printed (no step, no line of the run): exit 1 and one line.
void expect_refused_before_step_zero(const std::vector<RefusedRun>& runs) {
  for (const RefusedRun& r : runs) {
    SCOPED_TRACE(r.args);
    CliRun run = run_train(kTiny + " " + r.args);
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_EQ(run.output, "\ntrain: " + r.error + "\n");
  }
}

// /proc takes no new file or folder, even from root (the tests may run as root, so permissions
// alone would not refuse anything).
TEST_F(TrainCli, AnUnwritableCheckpointDirFailsBeforeStepZero) {
  const std::string file = temp_path("checkpoint_dir_is_a_file");
  std::ofstream(file) << "not a directory";
  expect_refused_before_step_zero({
      {"--checkpoint-dir /proc/forbidden --save-every 50 --steps 60",
       "--checkpoint-dir '/proc/forbidden': cannot create the directory: No such file or directory"},
      {"--dp 2 --checkpoint-dir /proc/forbidden --steps 60",
       "--checkpoint-dir '/proc/forbidden': cannot create the directory: No such file or directory"},
      {"--checkpoint-dir /proc --steps 60",
       "--checkpoint-dir '/proc': cannot create a file in it: No such file or directory"},
      {"--checkpoint-dir " + file + " --steps 60",
       "--checkpoint-dir '" + file + "': exists and is not a directory; give a directory path"},
      {"--checkpoint-dir " + file + "/run --steps 60",
       "--checkpoint-dir '" + file + "/run': cannot create the directory: Not a directory"},
  });
  EXPECT_EQ(read_file(file), "not a directory");
  std::remove(file.c_str());
}

TEST_F(TrainCli, AnUnwritableReportJsonOrTraceFailsBeforeStepZero) {
  // --trace takes FILE.svg or FILE.json, so the directory in its way is one named like that.
  const std::string directory = temp_path("output_is_a_directory.svg"), missing = temp_path("no_such_folder");
  fs::create_directories(directory);
  expect_refused_before_step_zero({
      {"--steps 60 --report-json " + missing + "/report.json", "--report-json '" + missing +
                                                                   "/report.json': cannot create '" + missing +
                                                                   "/report.json.tmp': No such file or directory"},
      {"--steps 60 --dp 2 --report-json " + directory,
       "--report-json '" + directory +
           "': exists and is not a regular file (a directory or a device); give a file path"},
      {"--steps 60 --n-layer 2 --pp 2 --trace " + missing + "/timeline.svg",
       "--trace '" + missing + "/timeline.svg': cannot create '" + missing +
           "/timeline.svg.tmp': No such file or directory"},
      {"--steps 60 --n-layer 2 --pp 2 --trace " + directory,
       "--trace '" + directory + "': exists and is not a regular file (a directory or a device); give a file path"},
  });
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_TRUE(fs::is_empty(directory));
  fs::remove(directory);
}

// A run that checks the folder and then fails (its --init-from is missing: read after the outputs are
// checked) leaves a folder of earlier checkpoints exactly as it was, and a new one created and empty.
TEST_F(TrainCli, TheCheckpointDirProbeLeavesEarlierCheckpointsAlone) {
  const std::string root = temp_path("earlier_checkpoints"), fresh = temp_path("fresh_checkpoints");
  fs::remove_all(root);
  fs::remove_all(fresh);
  CliRun first = run_train(kTiny + " --steps 2 --save-every 1 --checkpoint-dir " + root);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::map<std::string, std::string> before = tree(root);
  ASSERT_TRUE(before.count("step-00000001/metadata.json") && before.count("step-00000002/metadata.json"));
  for (const auto& [name, bytes] : before)  // that run probed the folder too: nothing but checkpoints
    EXPECT_TRUE(name.starts_with("step-0000000")) << name;
  const std::string missing = temp_path("no_such_weights.safetensors");
  for (const std::string& dir : {root, fresh + "/a/b"}) {
    SCOPED_TRACE(dir);
    CliRun probed = run_train(kTiny + " --steps 2 --checkpoint-dir " + dir + " --init-from " + missing);
    EXPECT_EQ(probed.exit_code, 1) << probed.output;
    EXPECT_NE(probed.output.find("load_safetensors: '" + missing + "'"), std::string::npos) << probed.output;
  }
  EXPECT_EQ(tree(root), before);
  EXPECT_TRUE(fs::is_directory(fresh + "/a/b"));
  EXPECT_TRUE(fs::is_empty(fresh + "/a/b"));
  fs::remove_all(root);
  fs::remove_all(fresh);
}

// The probe itself: a file under a name of its own, written and removed, whatever the folder holds.
TEST(TrainFiles, OutputDirectoryProbeLeavesNothingBehind) {
  const std::string root = temp_path("probed_dir");
  fs::remove_all(root);
  train_files::check_output_directory("--checkpoint-dir", root + "/nested");
  EXPECT_TRUE(fs::is_directory(root + "/nested"));
  EXPECT_TRUE(fs::is_empty(root + "/nested"));
  std::ofstream(root + "/nested/step-00000001") << "kept";
  for (int i = 0; i < 3; ++i) train_files::check_output_directory("--checkpoint-dir", root + "/nested");
  EXPECT_EQ(tree(root + "/nested"), (std::map<std::string, std::string>{{"step-00000001", "kept"}}));
  expect_error([&] { train_files::check_output_directory("--checkpoint-dir", ""); },
               "--checkpoint-dir: the path is empty");
  fs::remove_all(root);
}

}  // namespace
}  // namespace sl
