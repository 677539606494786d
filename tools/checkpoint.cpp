// checkpoint.cpp — build/bin/checkpoint: look into a distributed checkpoint (parallel/checkpoint/).
//
//   checkpoint info DIR                        the layout, world size, run_state and every tensor:
//                                              its shape, dtype and how many pieces it was cut into
//   checkpoint verify DIR                      every shard's size and SHA-256; exit 1 naming the
//                                              first file that fails (and the tensors it holds)
//   checkpoint consolidate DIR OUT.safetensors the full serial weight file (weights only, no AdamW
//                                              state): what train --save writes and --init-from reads
//
// DIR is a checkpoint directory, or a --checkpoint-dir root (its newest complete step is used).
// The command line is CLI11's (tools/cli.h): `checkpoint --help`, `checkpoint info --help`.
// Bad usage is one line on stderr and exit code 2; a bad checkpoint is one line and exit code 1.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "nn/safetensors.h"
#include "parallel/checkpoint/checkpoint.h"
#include "tools/cli.h"

namespace {

using namespace sl::parallel::checkpoint;

// A checkpoint directory, or the newest complete step under a root.
std::string resolve(const std::string& dir) {
  std::optional<std::string> found = newest_complete(dir);
  if (found) return *found;
  return dir;  // Reader names what is missing
}

// AdamW's state and the master weights are named with a prefix (state_tensor_name); weights are not.
bool is_weight(const std::string& name) {
  for (const char* prefix : {"exp_avg.", "exp_avg_sq.", "master."})
    if (name.rfind(prefix, 0) == 0) return false;
  return true;
}

std::string brief(const nlohmann::json& value) {
  if (value.is_object()) return "{" + std::to_string(value.size()) + " keys}";
  if (value.is_array()) return "[" + std::to_string(value.size()) + " entries]";
  std::string text = value.dump();
  return text.size() <= 60 ? text : text.substr(0, 60) + "...";
}

int info(const std::string& dir) {
  const Reader reader(resolve(dir));
  const Metadata& metadata = reader.metadata();
  uint64_t bytes = 0;
  for (const auto& [name, file] : metadata.files) bytes += file.bytes;
  std::printf("checkpoint %s\n  layout: %s\n  world size: %lld, %zu shard files, %llu bytes\n",
              reader.directory().c_str(), metadata.layout.c_str(), static_cast<long long>(metadata.world_size),
              metadata.files.size(), static_cast<unsigned long long>(bytes));
  std::printf("  run_state:\n");
  for (const auto& [key, value] : metadata.run_state.items())
    std::printf("    %-20s %s\n", key.c_str(), brief(value).c_str());
  std::printf("  %zu tensors:\n", metadata.tensors.size());
  for (const auto& [name, tensor] : metadata.tensors)
    std::printf("    %-40s %-5s %-16s %zu piece%s\n", name.c_str(), dtype_label(tensor.dtype).c_str(),
                nlohmann::json(tensor.shape).dump().c_str(), tensor.pieces.size(),
                tensor.pieces.size() == 1 ? "" : "s");
  return 0;
}

int verify(const std::string& dir) {
  const Reader reader(resolve(dir));
  reader.verify();
  uint64_t bytes = 0;
  for (const auto& [name, file] : reader.metadata().files) bytes += file.bytes;
  std::printf("verify: %s: %zu files, %llu bytes, every size and SHA-256 matches metadata.json\n",
              reader.directory().c_str(), reader.metadata().files.size(), static_cast<unsigned long long>(bytes));
  return 0;
}

int consolidate(const std::string& dir, const std::string& out) {
  const Reader reader(resolve(dir));
  sl::nn::StateDict weights;
  for (const std::string& name : reader.tensor_names())
    if (is_weight(name)) weights[name] = reader.read_tensor(name);
  sl::nn::save_safetensors(out, weights);
  std::printf("consolidate: %zu weight tensors of %s -> %s\n", weights.size(), reader.directory().c_str(),
              out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sl::cli::Parser cli("checkpoint", "checkpoint: look into a distributed checkpoint (train --checkpoint-dir)");
  CLI::App& app = cli.app();
  app.require_subcommand(1);
  std::string dir, out;
  const std::string dir_help = "a checkpoint directory, or a --checkpoint-dir root (its newest complete step)";
  CLI::App* info_command = app.add_subcommand(
      "info", sl::cli::wrap("DIR: the layout, world size, run_state and every tensor: its shape, dtype and how many "
                            "pieces it was cut into"));
  CLI::App* verify_command = app.add_subcommand(
      "verify", sl::cli::wrap("DIR: every shard's size and SHA-256; exit 1 naming the first file that fails (and the "
                              "tensors it holds)"));
  CLI::App* consolidate_command = app.add_subcommand(
      "consolidate", sl::cli::wrap("DIR OUT.safetensors: the full serial weight file (weights only, no AdamW state): "
                                   "what train --save writes and --init-from reads"));
  for (CLI::App* command : {info_command, verify_command, consolidate_command})
    command->add_option("DIR", dir, dir_help)->type_name("")->required();
  consolidate_command->add_option("OUT", out, "the .safetensors file to write")->type_name("")->required();
  app.footer("DIR is a checkpoint directory, or a --checkpoint-dir root (its newest complete step is used).");
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command.empty()) throw sl::UsageError{"a command is needed: info DIR, verify DIR or consolidate DIR OUT"};
    if (command[0] == '-' && command != "-h" && command != "--help") throw sl::UsageError{"unknown flag " + command};
    if (command[0] != '-' && command != "info" && command != "verify" && command != "consolidate")
      throw sl::UsageError{"unknown command '" + command + "' (info, verify, consolidate)"};
    if (cli.parse(argc, argv)) return 0;
  } catch (const sl::UsageError& e) {
    std::fprintf(stderr, "checkpoint: %s (checkpoint --help lists the commands)\n", e.message.c_str());
    return 2;
  }
  try {
    const int status = info_command->parsed()     ? info(dir)
                       : verify_command->parsed() ? verify(dir)
                                                  : consolidate(dir, out);
    return std::fflush(stdout) == 0 ? status : 1;
  } catch (const std::exception& e) {  // sl::Error: a bad or missing checkpoint, named
    std::string message = e.what();
    for (char& ch : message)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "checkpoint: %s\n", message.c_str());
    return 1;
  }
}
