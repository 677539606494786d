// parallel/train/train_files.h: the train program's output files. Paths are probed before step 0 without
// harming what is there, the log's every write is checked, and --save never replaces a non-regular file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "nn/safetensors.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"
#include "tests/support/train_cli.h"
#include "parallel/train/train_files.h"

namespace sl {
namespace {

using train_cli::file_exists;
using train_cli::read_file;
using train_cli::temp_path;

// A directory and a FIFO: paths that exist but are not regular files (no device node is needed).
struct NonRegularPaths {
  std::string directory = temp_path("files_directory"), fifo = temp_path("files_fifo");
  NonRegularPaths() {
    ::mkdir(directory.c_str(), 0755);
    ::mkfifo(fifo.c_str(), 0644);
  }
  ~NonRegularPaths() {
    ::rmdir(directory.c_str());
    ::unlink(fifo.c_str());
  }
};

TEST(TrainFiles, SavePathProbeLeavesNothingBehindAndAnOldFileIntact) {
  const std::string fresh = temp_path("probe_fresh.safetensors"), old = temp_path("probe_old.safetensors");
  std::ofstream(old) << "old weights";
  train_files::check_save_path("--save", fresh);
  train_files::check_save_path("--save", old);
  EXPECT_FALSE(file_exists(fresh));
  EXPECT_FALSE(file_exists(fresh + ".tmp"));
  EXPECT_FALSE(file_exists(old + ".tmp"));
  EXPECT_EQ(read_file(old), "old weights");  // the old file survives until the new one is complete
  // A PATH.tmp left by a crashed save is neither truncated nor removed by the probe.
  std::ofstream(old + ".tmp") << "partial";
  train_files::check_save_path("--save", old);
  EXPECT_EQ(read_file(old + ".tmp"), "partial");
  std::remove((old + ".tmp").c_str());
  std::remove(old.c_str());
}

TEST(TrainFiles, SavePathProbeNamesThePathAndTheOsError) {
  NonRegularPaths paths;
  const std::string missing = temp_path("no_such_directory") + "/model.safetensors";
  EXPECT_EQ(message_of([&] { train_files::check_save_path("--save", missing); }),
            "--save '" + missing + "': cannot create '" + missing + ".tmp': No such file or directory");
  for (const std::string& path : {paths.directory, paths.fifo})
    EXPECT_EQ(message_of([&] { train_files::check_save_path("--save", path); }),
              "--save '" + path + "': exists and is not a regular file (a directory or a device); give a file path");
  EXPECT_FALSE(file_exists(paths.fifo + ".tmp"));
}

// save_weights writes through a temp file and a rename, and refuses to rename over a FIFO or a
// directory even when the probe was skipped (the file system may change during a run).
TEST(TrainFiles, SaveWeightsIsAtomicAndRefusesNonRegularTargets) {
  NonRegularPaths paths;
  nn::StateDict weights{{"w", from_vector({1.0, 2.0, 3.0}, Shape({3}))}};
  const std::string path = temp_path("saved.safetensors");
  train_files::save_weights("--save", path, weights);
  EXPECT_FALSE(file_exists(path + ".tmp"));
  EXPECT_EQ(nn::load_safetensors(path).at("w").to_vector(), (std::vector<double>{1.0, 2.0, 3.0}));
  for (const std::string& target : {paths.directory, paths.fifo}) {
    EXPECT_EQ(message_of([&] { train_files::save_weights("--save", target, weights); }),
              "--save '" + target + "': exists and is not a regular file (a directory or a device); give a file path");
    EXPECT_FALSE(file_exists(target + ".tmp"));
  }
  struct stat info {};
  ASSERT_EQ(::stat(paths.fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode)) << "the FIFO was replaced";
  std::remove(path.c_str());
}

TEST(TrainFiles, LogChecksEveryWrite) {
  const std::string path = temp_path("log.jsonl");
  {
    train_files::LogFile log;
    log.open("--log-jsonl", path);
    log.write("{\"step\": 0}\n");
    log.write("{\"step\": 1}\n");
    log.close();
    log.close();  // a second close is a no-op
  }
  EXPECT_EQ(read_file(path), "{\"step\": 0}\n{\"step\": 1}\n");
  std::remove(path.c_str());
  // /dev/full opens, then refuses every byte: the first write names the path and ENOSPC.
  train_files::LogFile full;
  full.open("--log-jsonl", "/dev/full");
  EXPECT_EQ(message_of([&] { full.write("{\"step\": 0}\n"); }),
            "--log-jsonl '/dev/full': write failed: No space left on device");
  NonRegularPaths paths;
  train_files::LogFile directory;
  EXPECT_EQ(message_of([&] { directory.open("--log-jsonl", paths.directory); }),
            "--log-jsonl '" + paths.directory + "': cannot open for writing: Is a directory");
}

}  // namespace
}  // namespace sl
