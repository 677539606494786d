// The train program: usage errors, determinism and valid JSON of --log-jsonl, --profile, --steps 0 --save,
// --init-from.
//
// Runs the real binary (build*/bin/train, passed by `make test` in SL_TRAIN_BIN) on tiny settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/safetensors.h"
#include "tensor/cuda_info.h"
#include "tests/support/train_cli.h"

namespace sl {
namespace {

using namespace train_cli;

const std::string kTiny =
    "--n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 --eval-every 0 --threads 1";

TEST_F(TrainCli, BadFlagsAreUsageErrorsNamingTheFlag) {
  CliRun unknown = run_train("--bogus 3");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("unknown flag --bogus"), std::string::npos) << unknown.output;
  CliRun bad_value = run_train("--steps many");
  EXPECT_EQ(bad_value.exit_code, 2);
  EXPECT_NE(bad_value.output.find("--steps: expected an integer"), std::string::npos) << bad_value.output;
  CliRun missing = run_train("--lr");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("--lr needs a value"), std::string::npos) << missing.output;
  CliRun heads = run_train("--n-embd 10 --n-head 4");
  EXPECT_EQ(heads.exit_code, 2);
  EXPECT_NE(heads.output.find("--n-embd (10) must be divisible by --n-head (4)"), std::string::npos) << heads.output;
  // Values the task would refuse later are refused here, naming the flag: exit 2, not a run-time error.
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--digits 9", "--digits: expected an integer in 1..4, got '9'"},
           {"--digits 0", "--digits: expected an integer in 1..4, got '0'"},
           {"--task bin --data tokens.bin --vocab-size 70000", "--vocab-size: expected an integer in 1..65536"},
           {"--vocab-size 100", "--vocab-size is for --task bin only"},
           {"--task text --data input.txt --vocab-size 100", "--vocab-size is for --task bin only"},
           {"--threads 5000000000", "--threads: expected an integer in 1..1024"},
           {"--profile --dp 2", "--profile times the serial run's ops"},
           {"--profile --zero 1", "--profile times the serial run's ops"}}) {
    CliRun run = run_train(args);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << args << "\n" << run.output;
  }
  // A bad combination (tests/tools/test_train_options.cpp has them all) or value: exit 2 and one line.
  CliRun offload = run_train("--dp 2 --offload");
  EXPECT_EQ(offload.exit_code, 2);
  EXPECT_EQ(offload.output, "train: --offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3\n");
  CliRun tp = run_train("--tp 0");
  EXPECT_EQ(tp.exit_code, 2);
  EXPECT_EQ(tp.output, "train: --tp: expected an integer in 1..1024, got '0'\n");
  // --help: every flag under its chapter's group, with its range and default.
  CliRun help = run_train("--help");
  EXPECT_EQ(help.exit_code, 0);
  for (const std::string group : {"Model:", "Training:", "Data parallel:", "ZeRO/FSDP:", "Pipeline:",
                                  "Tensor parallel:", "Context parallel:", "Mixed precision:", "Checkpoints:", "Output:"})
    EXPECT_NE(help.output.find("\n" + group + "\n"), std::string::npos) << group << "\n" << help.output;
  EXPECT_NE(help.output.find("(1..1024; default 1)"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--config FILE.toml"), std::string::npos) << help.output;
}

// A layout the model cannot take is refused before any rank starts (nothing of the run is printed),
// naming the values: Ulysses gives each cp rank n_head / cp whole heads.
TEST_F(TrainCli, UlyssesNeedsTheHeadsToSplitBeforeAnyRankStarts) {
  for (const auto& [layout, message] : std::vector<std::pair<std::string, std::string>>{
           {"--cp 4 --cp-variant ulysses", "context parallel (ulysses): n_head 2 must divide by the Ulysses degree 4"},
           {"--tp 2 --cp 2 --cp-variant ulysses",
            "context parallel (ulysses): n_head 2 must divide by the Ulysses degree 2 x tp 2"},
           {"--cp 4 --cp-variant hybrid --ulysses-degree 3",
            "context parallel (hybrid): the Ulysses degree 3 must divide cp 4"}}) {
    CliRun run = run_train(kTiny + " --steps 1 " + layout);
    EXPECT_EQ(run.exit_code, 1) << layout << "\n" << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << layout << "\n" << run.output;
    EXPECT_EQ(run.output.find("parallel:"), std::string::npos) << "a rank started: " << run.output;
  }
}

// Run-time errors (exit code 1): one line naming the flag or the reader, the path and the OS error.
// Inputs are read and output paths checked before step 0: nothing else is printed before the error,
// so no training is lost. A log that stops taking writes fails the run at its first line.
TEST_F(TrainCli, RunTimeErrorsNameThePathAndTheOsError) {
  const std::string directory = temp_path("a_directory"), missing = temp_path("no_such_dir") + "/x";
  ASSERT_EQ(std::system(("mkdir -p " + directory).c_str()), 0);
  const std::string corrupt = temp_path("corrupt.safetensors");
  std::ofstream(corrupt) << "12345";
  const std::string log = temp_path("not_written.jsonl");
  struct Case {
    std::string args, error;  // the error: the whole output when the run must stop before anything else
    bool before_anything = true;
  };
  for (const Case& c : std::vector<Case>{
           {"--init-from " + missing,
            "load_safetensors: '" + missing + "': cannot open for reading: No such file or directory"},
           {"--init-from " + corrupt,
            "load_safetensors: '" + corrupt + "': the file is 5 bytes, shorter than the 8-byte header length"},
           {"--dp 2 --zero 3 --init-from " + corrupt,
            "load_safetensors: '" + corrupt + "': the file is 5 bytes, shorter than the 8-byte header length"},
           {"--task text --data " + missing,
            "TokenStream::from_text_file: '" + missing + "' does not exist or is not a regular file"},
           {"--save " + missing + " --log-jsonl " + log,
            "--save '" + missing + "': cannot create '" + missing + ".tmp': No such file or directory"},
           {"--dp 2 --zero 2 --save " + directory,
            "--save '" + directory + "': exists and is not a regular file (a directory or a device); give a file path"},
           {"--log-jsonl " + directory, "--log-jsonl '" + directory + "': cannot open for writing: Is a directory"},
           {"--log-jsonl /dev/full", "--log-jsonl '/dev/full': write failed: No space left on device", false},
           {"--dp 2 --log-jsonl /dev/full", "--log-jsonl '/dev/full': write failed: No space left on device", false},
       }) {
    SCOPED_TRACE(c.args);
    CliRun run = run_train(kTiny + " --steps 3 " + c.args);
    EXPECT_EQ(run.exit_code, 1) << run.output;
    if (c.before_anything)
      EXPECT_EQ(run.output, "\ntrain: " + c.error + "\n");
    else
      EXPECT_TRUE(run.output.ends_with("\ntrain: " + c.error + "\n")) << run.output;
    EXPECT_EQ(run.output.find("trained 3 steps"), std::string::npos) << run.output;
  }
  EXPECT_FALSE(file_exists(log)) << "the log was opened before --save's path was checked";
  EXPECT_FALSE(file_exists(missing + ".tmp"));
  // Standard output that takes no bytes: the report is lost, so the run fails (stderr still works).
  CliRun full = run_train(kTiny + " --steps 1", "2>&1 >/dev/full");
  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_EQ(full.output, "\ntrain: cannot write to standard output: No space left on device\n");
  std::remove(corrupt.c_str());
  std::remove(directory.c_str());
}

// --profile: the optimizer (clipping and AdamW) has its own column, and the held-out evaluation at
// step 2 is not counted: the embedding runs once per training step, 4 times, not more.
TEST_F(TrainCli, ProfileCountsTrainingStepsAndShowsTheOptimizerApart) {
  CliRun run = run_train(kTiny + " --steps 4 --eval-every 2 --profile");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("held-out accuracy"), std::string::npos) << run.output;  // the evaluation ran
  EXPECT_NE(run.output.find("optimizer ms"), std::string::npos) << run.output;
  // op, forward ms, backward ms, optimizer ms, fwd n, bwd n, opt n
  auto row = [&](const std::string& op) {
    std::smatch match;
    std::regex pattern("\n" + op + R"re( +([0-9.]+) +([0-9.]+) +([0-9.]+) +(\d+) +(\d+) +(\d+) )re");
    EXPECT_TRUE(std::regex_search(run.output, match, pattern)) << op << " is missing:\n" << run.output;
    std::vector<std::string> columns;
    for (size_t i = 1; i < match.size(); ++i) columns.push_back(match[i]);
    return columns;
  };
  for (const std::string op : {"AdamW\\.step", "clip_grad_norm"}) {
    std::vector<std::string> columns = row(op);
    if (columns.size() != 6) continue;
    EXPECT_EQ(columns[0], "0.00") << op;  // no forward time
    EXPECT_EQ(columns[3], "0") << op;
    EXPECT_EQ(columns[5], "4") << op;  // once per step
  }
  std::vector<std::string> embedding = row("Embedding");
  if (embedding.size() == 6) {
    EXPECT_EQ(embedding[3], "8") << run.output;  // wte and wpe, once per step
  }
}

TEST_F(TrainCli, TwoRunsWriteTheSameLogApartFromTimings) {
  std::string a = temp_path("a.jsonl"), b = temp_path("b.jsonl");
  ASSERT_EQ(run_train(kTiny + " --steps 6 --log-jsonl " + a).exit_code, 0);
  ASSERT_EQ(run_train(kTiny + " --steps 6 --log-jsonl " + b).exit_code, 0);
  std::regex timing(R"re("(ms|tokens_per_s)": [0-9.e+-]+)re");
  std::string log_a = std::regex_replace(read_file(a), timing, "\"$1\": T");
  std::string log_b = std::regex_replace(read_file(b), timing, "\"$1\": T");
  EXPECT_EQ(log_a, log_b);
  // One line per step, numbered from 0, with the loss of the batch before the update.
  EXPECT_EQ(std::count(log_a.begin(), log_a.end(), '\n'), 6);
  EXPECT_NE(log_a.find("{\"step\": 0, \"loss\": "), std::string::npos) << log_a;
  EXPECT_NE(log_a.find("{\"step\": 5, \"loss\": "), std::string::npos) << log_a;
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// A diverged run (lr 1e30) logs null for its nan losses: every line stays valid JSON.
TEST_F(TrainCli, ADivergedRunLogsNullForNonFiniteNumbers) {
  std::string path = temp_path("diverged.jsonl");
  CliRun run =
      run_train(kTiny + " --steps 4 --lr 1e30 --min-lr 1e30 --warmup-steps 0 --grad-clip 0 --log-jsonl " + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::istringstream lines(read_file(path));
  int parsed = 0, null_losses = 0;
  for (std::string line; std::getline(lines, line); ++parsed) {
    nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(object.is_discarded()) << "not JSON: " << line;
    null_losses += object["loss"].is_null();
  }
  EXPECT_EQ(parsed, 4);
  EXPECT_GT(null_losses, 0) << read_file(path);
  std::remove(path.c_str());
}

// Every data-parallel layout writes the serial log's format, with the serial losses (rtol 1.3e-6,
// atol 1e-5), prints the memory table and the traffic, and --compare-serial's reported differences
// stay within the parity tolerance. No warm-up and lr 1e-2, so the weights move from step 0 and a
// wrong gradient scale or a lost decay would show; AdamW eps 1e-6, since at 1e-8 Adam amplifies
// summation-order noise on gradients that are ~0 in exact arithmetic (the attention key bias).
// The chapters that cut the model (pipeline stages, tensor-parallel shards, sequence shards), alone
// and under data parallelism, log the serial losses at TP/PP tolerances (rtol 1e-5, atol 4e-5); the
// pipeline's --trace writes its timeline as a picture or a Chrome trace.
TEST_F(TrainCli, ModelCuttingLayoutsLogTheSerialLosses) {
  const std::string tiny =
      kTiny + " --n-layer 2 --batch-size 12 --steps 4 --warmup-steps 0 --lr 1e-2 --adam-eps 1e-6";
  std::string serial = temp_path("cut_serial.jsonl");
  ASSERT_EQ(run_train(tiny + " --log-jsonl " + serial).exit_code, 0);
  std::vector<double> expected = logged_losses(serial);
  ASSERT_EQ(expected.size(), 4u);
  for (const std::string layout :
       {"--pp 2", "--pp 2 --schedule naive --micro-batches 3", "--pp 2 --schedule zero-bubble --micro-batches 3", "--pp 2 --schedule interleaved --micro-batches 2",
        "--dp 2 --pp 2 --micro-batches 2 --zero 1", "--tp 2", "--tp 2 --sp", "--dp 3 --tp 2 --micro-batches 2",
        "--cp 2", "--cp 2 --cp-balance none --cp-variant allgather", "--dp 2 --cp 2 --zero 1",
        "--cp 2 --cp-variant ulysses", "--cp 4 --cp-variant hybrid --ulysses-degree 2",
        // N-D: several cuts at once (parallel/nd)
        "--pp 2 --tp 2 --sp --cp 2 --micro-batches 2", "--dp 2 --pp 2 --tp 2 --micro-batches 2 --zero 1",
        // FSDP with pp: each stage's chunk sharded over dp (torchtitan)
        "--pp 2 --dp 2 --zero 3 --micro-batches 3"}) {
    SCOPED_TRACE(layout);
    std::string path = temp_path("cut.jsonl");
    CliRun run = run_train(tiny + " " + layout + " --log-jsonl " + path);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::vector<double> got = logged_losses(path);
    ASSERT_EQ(got.size(), expected.size()) << read_file(path);
    for (size_t s = 0; s < got.size(); ++s) EXPECT_NEAR(got[s], expected[s], 4e-5 + 1e-5 * std::abs(expected[s]));
    EXPECT_NE(run.output.find("per rank: mesh coordinates; memory in MiB"), std::string::npos) << run.output;
    std::remove(path.c_str());
  }
  for (const std::string trace : {"timeline.svg", "timeline.json"}) {
    const std::string path = temp_path(trace);
    CliRun run = run_train(tiny + " --dp 2 --pp 2 --schedule gpipe --micro-batches 3 --trace " + path);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("wrote the timeline of every rank to " + path), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("rank 3 |"), std::string::npos) << "every rank of the world, not one pipeline";
    const std::string text = read_file(path);
    EXPECT_NE(text.find(trace.ends_with(".svg") ? "<svg" : "\"traceEvents\""), std::string::npos) << text.substr(0, 200);
    std::remove(path.c_str());
  }
  // Interleaved stages (4 chunks of one layer over 2 ranks), alone and with ZeRO-1 over dp.
  const std::string four = tiny + " --n-layer 4 --schedule interleaved --virtual-stages 2 --micro-batches 2 --pp 2";
  std::string serial4 = temp_path("cut_serial4.jsonl"), interleaved = temp_path("interleaved.jsonl");
  ASSERT_EQ(run_train(tiny + " --n-layer 4 --log-jsonl " + serial4).exit_code, 0);
  for (const std::string dp : {"", " --dp 2 --zero 1"}) {
    CliRun run = run_train(four + dp + " --log-jsonl " + interleaved);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::vector<double> want = logged_losses(serial4), got = logged_losses(interleaved);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) EXPECT_NEAR(got[s], want[s], 4e-5 + 1e-5 * std::abs(want[s])) << dp;
  }
  std::remove(serial4.c_str());
  std::remove(interleaved.c_str());
  // make run's check: a run below --min-accuracy fails, naming both numbers (4 steps learn nothing).
  CliRun weak = run_train(tiny + " --eval-every 0 --min-accuracy 90");
  EXPECT_EQ(weak.exit_code, 1) << weak.output;
  EXPECT_NE(weak.output.find("is below --min-accuracy 90%"), std::string::npos) << weak.output;
  CliRun heads = run_train(tiny + " --tp 3 --n-head 3 --n-embd 15");  // 3 heads split, the sequence does not matter
  EXPECT_EQ(heads.exit_code, 0) << heads.output;
  CliRun odd = run_train(tiny + " --tp 4");
  EXPECT_EQ(odd.exit_code, 1);
  EXPECT_NE(odd.output.find("tensor parallel: n_head 2 does not split over tp 4"), std::string::npos) << odd.output;
  std::remove(serial.c_str());
}

TEST_F(TrainCli, DataParallelLayoutsLogTheSerialLosses) {
  const std::string tiny = kTiny + " --batch-size 12 --steps 5 --warmup-steps 0 --lr 1e-2 --adam-eps 1e-6";
  std::string serial = temp_path("serial.jsonl");
  ASSERT_EQ(run_train(tiny + " --log-jsonl " + serial).exit_code, 0);
  std::vector<double> expected = logged_losses(serial);
  ASSERT_EQ(expected.size(), 5u);
  EXPECT_LT(expected.back(), expected.front() - 0.1) << "the run should train, or matching it proves little";
  const std::regex reported(
      R"re(compared with the serial model: largest loss difference ([0-9.e+-]+) \(step \d+\), largest parameter difference ([0-9.e+-]+) )re");
  for (const std::string layout : {"--dp 2", "--dp 3 --zero 1", "--dp 4 --zero 2 --offload", "--dp 2 --zero 3",
                                   "--dp-replicate 2 --dp-shard 2", "--dp 3 --naive-dp", "--dp 2 --micro-batches 3",
                                   "--dp 2 --zero 2 --micro-batches 2", "--dp-replicate 2 --dp-shard 2 --micro-batches 3"}) {
    SCOPED_TRACE(layout);
    std::string path = temp_path("parallel.jsonl");
    CliRun run = run_train(tiny + " " + layout + " --compare-serial --log-jsonl " + path);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::vector<double> got = logged_losses(path);
    ASSERT_EQ(got.size(), expected.size()) << read_file(path);
    for (size_t s = 0; s < got.size(); ++s) EXPECT_NEAR(got[s], expected[s], 1e-5 + 1.3e-6 * std::abs(expected[s]));
    EXPECT_NE(run.output.find("per rank: mesh coordinates; memory in MiB"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("rank 1 (pp 0, dp_replicate "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("  time     compute "), std::string::npos) << run.output;
    std::smatch match;
    ASSERT_TRUE(std::regex_search(run.output, match, reported)) << run.output;
    // Losses are ~5.5: rtol 1.3e-6 adds 7e-6 to atol; the weights are below 1 in magnitude.
    EXPECT_LE(std::stod(match[1]), 1e-5 + 1.3e-6 * 6) << run.output;
    EXPECT_LE(std::stod(match[2]), 1e-5 + 1.3e-6) << run.output;
    std::remove(path.c_str());
  }
  // Serial gradient accumulation (the addition task counts only answer digits, so the micro-batches
  // hold different counts and must be weighted by them): the losses of one backward per step.
  for (const std::string micro : {"--micro-batches 3", "--micro-batches 12"}) {
    SCOPED_TRACE(micro);
    std::string path = temp_path("micro.jsonl");
    ASSERT_EQ(run_train(tiny + " " + micro + " --log-jsonl " + path).exit_code, 0);
    std::vector<double> got = logged_losses(path);
    ASSERT_EQ(got.size(), expected.size()) << read_file(path);
    for (size_t s = 0; s < got.size(); ++s) EXPECT_NEAR(got[s], expected[s], 1e-5 + 1.3e-6 * std::abs(expected[s]));
    std::remove(path.c_str());
  }
  CliRun uneven = run_train(kTiny + " --batch-size 10 --dp 3");
  EXPECT_EQ(uneven.exit_code, 2);
  EXPECT_NE(uneven.output.find("--batch-size 10 must be micro-batch rows x 1 micro-batches x dp_replicate 3 x dp_shard 1, but 10 % 3 = 1"), std::string::npos) << uneven.output;
  CliRun hsdp = run_train(kTiny + " --dp-replicate 2");
  EXPECT_EQ(hsdp.exit_code, 2);
  std::remove(serial.c_str());
}

TEST_F(TrainCli, StepsZeroSavesTheInitialWeightsAndInitFromLoadsThem) {
  std::string path = temp_path("init.safetensors");
  CliRun saved = run_train(kTiny + " --steps 0 --seed 9 --save " + path);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  nn::StateDict loaded = nn::load_safetensors(path);
  nn::GPT reference(nn::GPTConfig{256, 16, 1, 2, 16, 0.0}, 9);
  ASSERT_EQ(loaded.size(), reference.state_dict().size());
  for (auto& [name, tensor] : reference.state_dict())
    EXPECT_EQ(loaded.at(name).to_vector(), tensor.to_vector()) << name;
  // On a text task (where the seed only draws the weights), seed 4 started from seed 9's weights
  // trains exactly like seed 9.
  std::string text = temp_path("corpus.txt"), a = temp_path("from_seed.jsonl"), b = temp_path("from_file.jsonl");
  std::ofstream(text) << "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs\n";
  std::string task = " --task text --data " + text;
  ASSERT_EQ(run_train(kTiny + task + " --steps 2 --seed 9 --log-jsonl " + a).exit_code, 0);
  ASSERT_EQ(run_train(kTiny + task + " --steps 2 --seed 4 --init-from " + path + " --log-jsonl " + b).exit_code, 0);
  std::regex loss(R"re("loss": [0-9.e+-]+)re");
  auto losses = [&](const std::string& file) {
    std::string text = read_file(file), out;
    for (std::sregex_iterator it(text.begin(), text.end(), loss), end; it != end; ++it) out += it->str() + ";";
    return out;
  };
  EXPECT_EQ(losses(a), losses(b));
  // A checkpoint of another shape is refused, naming the parameter.
  CliRun mismatch = run_train("--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --steps 1 --init-from " + path);
  EXPECT_NE(mismatch.exit_code, 0);
  EXPECT_NE(mismatch.output.find("shape mismatch"), std::string::npos) << mismatch.output;
  for (const std::string& file : {path, a, b, text}) std::remove(file.c_str());
}

// Ten AdamW steps of a small GPT, same seed and data, on the CPU and on the GPU. The GPU adds up its
// GEMMs and reductions in another order (cuBLAS tiles and FMAs, tree reductions), so the losses
// differ in the last f32 digits, and each update carries the difference into the weights. On the
// CPU, another summation order (--dp 2 or --dp 4 --zero 3 against serial) moves these ten losses by
// under 1e-7 relative; rtol 1e-4 leaves room for the GPU's, while a wrong kernel moves the loss by
// 1e-2 or more.
TEST_F(TrainCli, TenStepsOnTheGpuMatchTheCpuRun) {
  if (cuda_info().device_count == 0) GTEST_SKIP() << "no CUDA device: " << cuda_info().error;
  const std::string tiny =
      "--n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --batch-size 8 --eval-every 0 --threads 1 --steps 10 "
      "--seed 7 --warmup-steps 0";  // no warm-up: the weights move from the first step (loss 5.5 -> 4.5)
  std::vector<std::vector<double>> losses;
  for (const std::string device : {"cpu", "cuda"}) {
    const std::string log = temp_path(device + ".jsonl");
    CliRun run = run_train(tiny + " --device " + device + " --log-jsonl " + log);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    losses.push_back(logged_losses(log));
    std::remove(log.c_str());
    ASSERT_EQ(losses.back().size(), 10u) << "--device " << device << ":\n" << run.output;
  }
  const std::vector<double>&cpu = losses[0], &gpu = losses[1];
  EXPECT_LT(cpu.back(), cpu.front() - 0.5) << "the run should train, or matching it proves little";
  for (size_t step = 0; step < cpu.size(); ++step)
    EXPECT_NEAR(gpu[step], cpu[step], 1e-4 * std::abs(cpu[step])) << "step " << step;
}

// --device cuda with ranks needs a GPU: without one it is refused before any rank starts (nothing of
// the run printed); the layouts with host code on their path are usage errors (tests/tools/test_train_options.cpp
// has them all).
TEST_F(TrainCli, CudaRanksWithoutAGpuAreRefusedBeforeAnyRankStarts) {
  CliRun naive = run_train(kTiny + " --steps 1 --dp 2 --naive-dp --device cuda");
  EXPECT_EQ(naive.exit_code, 2) << naive.output;
  EXPECT_TRUE(naive.output.starts_with("train: --device cuda: --naive-dp packs the scattered batches")) << naive.output;
  if (cuda_info().device_count > 0) GTEST_SKIP() << "a GPU is visible: the no-GPU refusal cannot show here";
  CliRun run = run_train(kTiny + " --steps 1 --dp 2 --device cuda");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("train: --device cuda: world 2 needs a GPU, and none is visible (no CUDA device"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("data parallel:"), std::string::npos) << "a rank started: " << run.output;
  EXPECT_EQ(run.output.find("train: task"), std::string::npos) << "the data was read first: " << run.output;
}

// More ranks than GPUs: thread ranks share them, their collectives staged through the host. World 4
// (dp 2 x tp 2, pp 2 x cp 2) against the same layouts on CPU thread ranks, ten steps.
TEST_F(TrainCli, RanksSharingAGpuMatchTheCpuRanks) {
  const int gpus = cuda_info().device_count;
  if (gpus == 0) GTEST_SKIP() << "no CUDA device: " << cuda_info().error;
  if (gpus >= 4) GTEST_SKIP() << gpus << " GPUs: 4 ranks get one each (NCCL), none shares";
  const std::string tiny =
      "--n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --batch-size 8 --eval-every 0 --threads 1 --steps 10 "
      "--seed 7 --warmup-steps 0";
  for (const std::string layout : {"--dp 2 --tp 2", "--pp 2 --cp 2"}) {
    std::vector<std::vector<double>> losses;
    for (const std::string device : {"cpu", "cuda"}) {
      const std::string log = temp_path(device + "_shared.jsonl");
      CliRun run = run_train(tiny + " " + layout + " --device " + device + " --log-jsonl " + log);
      ASSERT_EQ(run.exit_code, 0) << layout << " --device " << device << ":\n" << run.output;
      if (device == "cuda") {
        EXPECT_NE(run.output.find("(threads on shared GPUs"), std::string::npos) << run.output;
      }
      losses.push_back(logged_losses(log));
      std::remove(log.c_str());
      ASSERT_EQ(losses.back().size(), 10u) << layout << " --device " << device << ":\n" << run.output;
    }
    for (size_t step = 0; step < losses[0].size(); ++step)
      EXPECT_NEAR(losses[1][step], losses[0][step], 1e-4 * std::abs(losses[0][step])) << layout << ", step " << step;
  }
}

// Ranks on GPUs (one per GPU, NCCL) against the same layout on CPU thread ranks: DDP and the
// pipeline, ten steps, the losses within the tolerance of TenStepsOnTheGpuMatchTheCpuRun.
TEST_F(TrainCli, RanksOnGpusMatchTheCpuRanks) {
  const int gpus = cuda_info().device_count;
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs (one rank per GPU over NCCL); cudaGetDeviceCount found " << gpus;
#ifndef SL_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL backend";
#endif
  const std::string tiny =
      "--n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --batch-size 8 --eval-every 0 --threads 1 --steps 10 "
      "--seed 7 --warmup-steps 0";
  for (const std::string layout : {"--dp 2", "--pp 2", "--dp 2 --micro-batches 2"}) {
    std::vector<std::vector<double>> losses;
    for (const std::string device : {"cpu", "cuda"}) {
      const std::string log = temp_path(device + "_ranks.jsonl");
      CliRun run = run_train(tiny + " " + layout + " --device " + device + " --log-jsonl " + log);
      ASSERT_EQ(run.exit_code, 0) << layout << " --device " << device << ":\n" << run.output;
      if (device == "cuda") {
        EXPECT_NE(run.output.find("(nccl backend)"), std::string::npos) << run.output;
      }
      losses.push_back(logged_losses(log));
      std::remove(log.c_str());
      ASSERT_EQ(losses.back().size(), 10u) << layout << " --device " << device << ":\n" << run.output;
    }
    for (size_t step = 0; step < losses[0].size(); ++step)
      EXPECT_NEAR(losses[1][step], losses[0][step], 1e-4 * std::abs(losses[0][step])) << layout << ", step " << step;
  }
}

}  // namespace
}  // namespace sl
