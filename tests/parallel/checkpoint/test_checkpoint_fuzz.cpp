// The checkpoint readers under a fixed-seed mutation storm: valid shards and metadata.json (and the
// fuzzers' seed corpus, fuzz/corpus/, when run from the repository root) mutated a few thousand
// times each — bits flipped, bytes inserted and cut, lengths and numbers replaced by edge values —
// and fed to the same parsers the libFuzzer targets drive (fuzz/). Every input must end in success
// or sl::Error: under `make test SANITIZE=address,undefined` this is the fuzzers' check without clang.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "tests/support/checkpoint.h"

namespace sl::parallel::checkpoint {
namespace {

using namespace testing_util;

// One random edit of `bytes`: the mutations libFuzzer starts with, plus edge values where sizes sit.
std::string mutate(std::string bytes, std::mt19937& rng) {
  auto at = [&] { return bytes.empty() ? size_t{0} : rng() % bytes.size(); };
  static const char* kNumbers[] = {"-1", "0", "1e999", "-1e999", "18446744073709551616", "9223372036854775807",
                                   "9223372036854775808", "0.5", "4294967296", "null", "\"7\"", "[]", "{}"};
  switch (rng() % 8) {
    case 0:  // flip a bit
      if (!bytes.empty()) bytes[at()] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:  // a random byte
      if (!bytes.empty()) bytes[at()] = static_cast<char>(rng());
      break;
    case 2:  // insert bytes
      bytes.insert(at(), std::string(1 + rng() % 8, static_cast<char>(rng())));
      break;
    case 3:  // cut a range
      if (!bytes.empty()) {
        const size_t from = at();
        bytes.erase(from, 1 + rng() % 64);
      }
      break;
    case 4:  // truncate
      bytes.resize(at());
      break;
    case 5: {  // the 8-byte length of a safetensors file: an edge value
      const uint64_t values[] = {0, bytes.size(), bytes.size() - 8, bytes.size() - 7, uint64_t{1} << 63, ~uint64_t{0},
                                 100'000'001, static_cast<uint64_t>(rng())};
      if (bytes.size() >= 8) std::memcpy(bytes.data(), &values[rng() % 8], 8);
      break;
    }
    default: {  // a number (or a token) replaced by an edge value
      size_t from = at();
      while (from < bytes.size() && !std::isdigit(static_cast<unsigned char>(bytes[from]))) ++from;
      size_t to = from;
      while (to < bytes.size() && std::isdigit(static_cast<unsigned char>(bytes[to]))) ++to;
      if (to > from) bytes.replace(from, to - from, kNumbers[rng() % std::size(kNumbers)]);
    }
  }
  return bytes;
}

// `parse` on `input`: success or sl::Error, anything else a failure naming the mutation.
template <typename Parse>
bool survives(const std::string& what, int mutation, const std::string& input, Parse parse) {
  try {
    parse(input);
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " mutation " << mutation << " (" << input.size() << " bytes) threw a non-sl::Error: "
                  << e.what();
    return false;
  }
}

// The valid files mutations start from: a saved checkpoint's, and the corpus seeds when present.
std::vector<std::string> seeds(const std::string& dir, const std::string& kind) {
  std::vector<std::string> files;
  if (kind == "safetensors")
    for (const char* name : {"shard-00000.safetensors", "shard-00001.safetensors"})
      files.push_back(read_file_bytes(dir + "/" + name));
  else
    files.push_back(read_file_bytes(dir + "/metadata.json"));
  const std::filesystem::path corpus = std::filesystem::path("fuzz/corpus") / kind;
  if (std::filesystem::is_directory(corpus))
    for (const auto& entry : std::filesystem::directory_iterator(corpus))
      files.push_back(read_file_bytes(entry.path().string()));
  return files;
}

class CheckpointMutations : public CheckpointDirTest {};

TEST_F(CheckpointMutations, ShardHeadersEndInSuccessOrAnError) {
  save_model(dir_, Cut::cols, 2, 1);
  const std::vector<std::string> inputs = seeds(dir_, "safetensors");
  std::mt19937 rng(2024);
  int parsed = 0;
  for (int mutation = 0; mutation < 4000; ++mutation) {
    std::string input = inputs[rng() % inputs.size()];
    for (int edits = 1 + rng() % 3; edits > 0; --edits) input = mutate(std::move(input), rng);
    parsed += survives("shard", mutation, input, [](const std::string& bytes) {
      const nn::safetensors::Header header = parse_shard_header(bytes, bytes.size(), "");
      for (const auto& record : header.tensors) ASSERT_LE(header.data_start + record.end, bytes.size());
    });
    if (mutation % 10 == 0)  // through a file, reading every tensor's bytes
      survives("shard file", mutation, input, [&](const std::string& bytes) {
        write_file_bytes(path("mutated.safetensors"), bytes);
        ShardReader reader(path("mutated.safetensors"), "");
        std::vector<char> buffer;
        for (const auto& record : reader.header().tensors) {
          buffer.resize(record.end - record.begin);
          reader.read(record, 0, buffer.size(), buffer.data());
        }
      });
  }
  EXPECT_GT(parsed, 0);  // some mutations keep the file valid: the parser is not refusing everything
  std::printf("[          ] %d of 4000 mutated shards parsed, the rest refused with sl::Error\n", parsed);
}

TEST_F(CheckpointMutations, MetadataEndsInSuccessOrAnErrorAndLoadsStaySafe) {
  save_model(dir_, Cut::cols, 2, 1);
  const std::vector<std::string> inputs = seeds(dir_, "metadata");
  const std::string original = read_file_bytes(path("metadata.json"));
  std::mt19937 rng(2025);
  int parsed = 0, loaded = 0;
  for (int mutation = 0; mutation < 4000; ++mutation) {
    std::string input = inputs[rng() % inputs.size()];
    for (int edits = 1 + rng() % 2; edits > 0; --edits) input = mutate(std::move(input), rng);
    if (!survives("metadata", mutation, input, [](const std::string& text) { parse_metadata(text, ""); })) continue;
    ++parsed;
    if (loaded < 200 && input.find("shard-0000") != std::string::npos) {  // a load trusting it must stay safe
      ++loaded;
      write_file_bytes(path("metadata.json"), input);
      survives("metadata load", mutation, input, [&](const std::string&) {
        const Reader reader(dir_);
        for (const std::string& name : reader.tensor_names()) reader.read_tensor(name, {.verify = false});
        reader.verify();
      });
    }
  }
  write_file_bytes(path("metadata.json"), original);
  EXPECT_GT(parsed, 0);
  std::printf("[          ] %d of 4000 mutated metadata.json parsed (%d of them loaded from), the rest refused\n",
              parsed, loaded);
  EXPECT_EQ(load_model(dir_, Cut::flat, 3, 1), "");
}

TEST(CheckpointHostileHeaders, DeepNestingIsRefusedNotRecursedInto) {
  // nn's header parser printed a refused value whole: a million nested arrays overflowed the stack.
  const std::string header = "{\"w@0\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  std::string file(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(file.data(), &length, 8);
  file += header;
  try {
    parse_shard_header(file, file.size(), "");
    ADD_FAILURE() << "a header nested a million deep was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nests JSON deeper than 64 levels"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sl::parallel::checkpoint
