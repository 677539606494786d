// The train program with every data-parallel layout: --init-from and --save cross between layouts
// (a serial file starts a --dp run, a --dp run's file continues serially), and runs are bitwise
// reproducible, run to run and across --threads (issue 10, test item 9).
//
// Runs the real binary on a text corpus (the seed then only draws the weights) with a tiny GPT,
// lr 1e-2, weight decay 0.1, no warm-up (the weights move from step 0) and AdamW eps 1e-6 (at 1e-8
// Adam amplifies summation-order noise on gradients that are ~0 in exact arithmetic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "tests/support/train_cli.h"

namespace sl {
namespace {

using namespace train_cli;

constexpr double kRtol = 1.3e-6, kAtol = 1e-5;  // DDP/ZeRO parity (PyTorch's float32 tolerances)
constexpr double kCutRtol = 1e-5, kCutAtol = 4e-5;  // a cut model: TP/PP/CP (Megatron's tolerances)

// The shared run: 3 steps of a 2-layer GPT, n_embd 32, 4 heads, 12 rows of 16 tokens (splits over 2, 3, 4).
std::string base_args(const std::string& corpus) {
  return "--task text --data " + corpus +
         " --n-layer 2 --n-head 4 --n-embd 32 --block-size 16 --batch-size 12 --steps 3 --eval-every 0 "
         "--lr 1e-2 --warmup-steps 0 --weight-decay 0.1 --adam-eps 1e-6 --threads 1";
}

struct Layout {
  std::string name, args;
  bool cuts_model = false;  // pipeline, tensor or context parallel: sums in another order
  double rtol() const { return cuts_model ? kCutRtol : kRtol; }
  double atol() const { return cuts_model ? kCutAtol : kAtol; }
};
void PrintTo(const Layout& layout, std::ostream* out) { *out << layout.args; }  // failures name the flags

// The files every layout is compared with, made once by serial runs:
//   trained   seed 9, 3 steps                          (what a --dp run from seed 9 must save and log)
//   resumed   --init-from trained, 3 more steps        (what a --dp run started from `trained` must save)
class TrainLayouts : public testing::TestWithParam<Layout> {
 protected:
  static void SetUpTestSuite() {
    corpus_ = new std::string(write_corpus("layouts_corpus.txt"));
    trained_ = new std::string(temp_path("serial_trained.safetensors"));
    resumed_ = new std::string(temp_path("serial_resumed.safetensors"));
    serial_log_ = new std::string(temp_path("serial_trained.jsonl"));
    CliRun a = run_train(base_args(*corpus_) + " --seed 9 --save " + *trained_ + " --log-jsonl " + *serial_log_);
    CliRun b = run_train(base_args(*corpus_) + " --seed 4 --init-from " + *trained_ + " --save " + *resumed_);
    setup_ok_ = a.exit_code == 0 && b.exit_code == 0;
    setup_output_ = new std::string(a.output + b.output);
  }
  static void TearDownTestSuite() {
    for (std::string* path : {corpus_, trained_, resumed_, serial_log_}) {
      std::remove(path->c_str());
      delete path;
    }
    delete setup_output_;
  }
  void SetUp() override { ASSERT_TRUE(setup_ok_) << *setup_output_; }

  static std::string *corpus_, *trained_, *resumed_, *serial_log_, *setup_output_;
  static bool setup_ok_;
};
std::string *TrainLayouts::corpus_, *TrainLayouts::trained_, *TrainLayouts::resumed_, *TrainLayouts::serial_log_,
    *TrainLayouts::setup_output_;
bool TrainLayouts::setup_ok_ = false;

// serial -> layout: each rank loads the serial file (another seed, so the file is what counts) and
// takes its shard; after 3 steps the layout saves the serial run's weights, names and shapes.
TEST_P(TrainLayouts, StartsFromASerialFile) {
  const std::string out = temp_path(GetParam().name + "_resumed.safetensors");
  CliRun run =
      run_train(base_args(*corpus_) + " " + GetParam().args + " --seed 5 --init-from " + *trained_ + " --save " + out);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("initial weights from " + *trained_), std::string::npos) << run.output;
  expect_same_weights(out, *resumed_, GetParam().rtol(), GetParam().atol());
  std::remove(out.c_str());
}

// layout -> serial: the layout's --save from seed 9 holds the serial run's names, shapes and values.
// Run twice, with --threads 1 and 3: the same bytes (run to run, and the thread count changes nothing).
TEST_P(TrainLayouts, SavesTheSerialFileWithTheSameBytesEveryRun) {
  std::vector<std::string> files;
  const std::string log = temp_path(GetParam().name + ".jsonl");
  for (const std::string threads : {"1", "3"}) {
    files.push_back(temp_path(GetParam().name + "_threads" + threads + ".safetensors"));
    CliRun run = run_train(base_args(*corpus_) + " " + GetParam().args + " --seed 9 --threads " + threads + " --save " +
                           files.back() + (threads == "1" ? " --log-jsonl " + log : ""));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("saved " + files.back()), std::string::npos) << run.output;
  }
  expect_same_weights(files[0], *trained_, GetParam().rtol(), GetParam().atol());
  // The first run's --log-jsonl: every step's loss the serial run's.
  const std::vector<double> serial = logged_losses(*serial_log_), losses = logged_losses(log);
  ASSERT_EQ(losses.size(), serial.size()) << GetParam().args;
  for (size_t i = 0; i < serial.size(); ++i)
    EXPECT_NEAR(losses[i], serial[i], GetParam().atol() + GetParam().rtol() * std::abs(serial[i]))
        << GetParam().args << ": step " << i << "'s loss";
  std::remove(log.c_str());
  std::string first = read_file(files[0]);
  EXPECT_FALSE(first.empty());
  EXPECT_TRUE(first == read_file(files[1])) << GetParam().args << ": --threads 1 and --threads 3 saved different bytes";
  // And the serial program loads it, strictly by name and shape, exactly: with --steps 0 it saves the
  // same bytes. Once, for FSDP, whose file is the most rebuilt (gathered from shards, padding dropped).
  if (GetParam().name == "fsdp") {
    const std::string copy = temp_path("fsdp_copy.safetensors");
    CliRun serial = run_train(base_args(*corpus_) + " --steps 0 --seed 4 --init-from " + files[0] + " --save " + copy);
    ASSERT_EQ(serial.exit_code, 0) << serial.output;
    EXPECT_TRUE(read_file(copy) == first) << "the serial program changed the FSDP file's weights on the way through";
    std::remove(copy.c_str());
  }
  for (const std::string& file : files) std::remove(file.c_str());
}

// --recompute selective and full rerun parts of each block in backward instead of keeping their
// activations (autograd/checkpoint.h): in every layout the same losses and the same saved bytes as
// keeping everything, because the rerun computes the same values and the same gradients.
std::string saved_bytes_with(const std::string& args, const std::string& recompute, std::vector<double>* losses) {
  const std::string file = temp_path("recompute_" + recompute + ".safetensors"), log = temp_path("recompute.jsonl");
  CliRun run = run_train(args + " --seed 9 --recompute " + recompute + " --save " + file + " --log-jsonl " + log);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::string bytes = read_file(file);
  *losses = logged_losses(log);
  std::remove(file.c_str());
  std::remove(log.c_str());
  return bytes;
}

void expect_recompute_changes_no_byte(const std::string& args) {
  std::vector<double> kept_losses, losses;
  const std::string kept = saved_bytes_with(args, "none", &kept_losses);
  ASSERT_FALSE(kept.empty());
  ASSERT_EQ(kept_losses.size(), 3u);
  for (const std::string mode : {"selective", "full"}) {
    EXPECT_TRUE(saved_bytes_with(args, mode, &losses) == kept) << args << " --recompute " << mode << " saved other bytes";
    EXPECT_EQ(losses, kept_losses) << args << " --recompute " << mode << " logged other losses";
  }
}

TEST_P(TrainLayouts, RecomputingChangesNoByte) {
  expect_recompute_changes_no_byte(base_args(*corpus_) + " " + GetParam().args);
}

// Simulated links (--links, parallel/comm/topology.h) only delay messages: the same losses and the
// same saved bytes as without them, while every rank's report shows the time they charged.
TEST_P(TrainLayouts, SimulatedLinksChangeNoByte) {
  const std::string args = base_args(*corpus_) + " " + GetParam().args + " --seed 9";
  std::vector<std::string> saved;
  std::vector<std::vector<double>> losses;
  for (const std::string links : {"", " --links 'intra=10GB/s,2us;inter=1GB/s,20us;gpus-per-node=2'"}) {
    const std::string file = temp_path(GetParam().name + "_links.safetensors"), log = temp_path("links.jsonl");
    CliRun run = run_train(args + links + " --save " + file + " --log-jsonl " + log);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    if (!links.empty()) {
      EXPECT_NE(run.output.find("simulated links: 2 ranks per node"), std::string::npos) << run.output;
      EXPECT_NE(run.output.find("charged by the simulated links"), std::string::npos) << run.output;
    }
    saved.push_back(read_file(file));
    losses.push_back(logged_losses(log));
    std::remove(file.c_str());
    std::remove(log.c_str());
  }
  ASSERT_FALSE(saved[0].empty());
  EXPECT_TRUE(saved[0] == saved[1]) << GetParam().args << ": --links changed the saved bytes";
  EXPECT_EQ(losses[0], losses[1]) << GetParam().args << ": --links changed the losses";
}

// The interleaved schedule needs 2 chunks per stage: 4 layers, so outside the 2-layer suite above.
TEST(TrainRecompute, TheInterleavedScheduleRecomputesEachChunkPerMicroBatch) {
  const std::string corpus = write_corpus("recompute_corpus.txt");
  expect_recompute_changes_no_byte(base_args(corpus) +
                                   " --n-layer 4 --pp 2 --schedule interleaved --virtual-stages 2 --micro-batches 2");
  std::remove(corpus.c_str());
}

INSTANTIATE_TEST_SUITE_P(Layouts, TrainLayouts,
                         testing::Values(Layout{"ddp", "--dp 2"}, Layout{"naive", "--dp 3 --naive-dp"},
                                         Layout{"zero1", "--dp 3 --zero 1"}, Layout{"zero2", "--dp 2 --zero 2"},
                                         Layout{"zero2_offload", "--dp 4 --zero 2 --offload"},
                                         Layout{"fsdp", "--dp 3 --zero 3"},
                                         Layout{"fsdp_offload", "--dp 2 --zero 3 --offload"},
                                         Layout{"hsdp", "--dp-replicate 2 --dp-shard 2"},
                                         Layout{"pp2_1f1b", "--pp 2 --micro-batches 3", true},
                                         Layout{"pp2_gpipe_dp2", "--dp 2 --pp 2 --schedule gpipe --micro-batches 2", true},
                                         Layout{"pp2_zero_bubble", "--pp 2 --schedule zero-bubble --micro-batches 2", true},
                                         Layout{"tp2", "--tp 2", true}, Layout{"tp2_sp_zero1", "--dp 2 --tp 2 --sp --zero 1", true},
                                         Layout{"cp2_zigzag", "--cp 2", true},
                                         Layout{"cp2_allgather_dp2", "--dp 2 --cp 2 --cp-variant allgather --cp-balance none", true},
                                         Layout{"cp2_ulysses_tp2", "--tp 2 --cp 2 --cp-variant ulysses", true},
                                         Layout{"cp4_hybrid_u2_dp2", "--dp 2 --cp 4 --cp-variant hybrid --ulysses-degree 2", true},
                                         // the Accelerate guide's: FSDP / HSDP over tp, cp and pp, ZeRO-2 over a cut
                                         Layout{"fsdp2_tp2_sp", "--dp 2 --zero 3 --tp 2 --sp", true},
                                         Layout{"fsdp2_cp2", "--dp 2 --zero 3 --cp 2", true},
                                         Layout{"hsdp2x2_tp2", "--dp-replicate 2 --dp-shard 2 --tp 2", true},
                                         Layout{"fsdp2_pp2_tp2", "--dp 2 --zero 3 --pp 2 --tp 2 --micro-batches 2", true},
                                         Layout{"zero2_tp2_cp2", "--dp 2 --zero 2 --tp 2 --cp 2", true},
                                         Layout{"guide16_hsdp2x2_cp2_tp2", "--dp-replicate 2 --dp-shard 2 --cp 2 --tp 2", true}),
                         [](const testing::TestParamInfo<Layout>& info) { return info.param.name; });

// The serial run, with GEMMs big enough to be split over threads (the MLP on 16 x 32 rows:
// [512, 128] @ [128, 512] is 67 MFLOP, 8 blocks): --threads 1, 2 and 3 save the same bytes. With
// OpenBLAS's own threads (before tensor/cpu/gemm.cpp fixed the blocks) --threads 1 and 2 differed.
TEST(TrainDeterminism, SerialRunsSaveTheSameBytesForEveryThreadCount) {
  const std::string corpus = write_corpus("threads_corpus.txt");
  std::vector<std::string> files;
  for (const std::string threads : {"1", "2", "3"}) {
    files.push_back(temp_path("serial_threads" + threads + "_" + std::to_string(files.size()) + ".safetensors"));
    CliRun run = run_train("--task text --data " + corpus +
                           " --n-layer 1 --n-head 4 --n-embd 128 --block-size 32 --batch-size 16 --steps 2 "
                           "--eval-every 0 --lr 1e-2 --warmup-steps 0 --seed 3 --threads " +
                           threads + " --save " + files.back());
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  std::string first = read_file(files[0]);
  EXPECT_FALSE(first.empty());
  for (size_t i = 1; i < files.size(); ++i) EXPECT_TRUE(first == read_file(files[i])) << "run " << i << " differs";
  for (const std::string& file : files) std::remove(file.c_str());
  std::remove(corpus.c_str());
}

}  // namespace
}  // namespace sl
