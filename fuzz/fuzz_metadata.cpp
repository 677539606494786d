// fuzz_metadata.cpp — libFuzzer target: a checkpoint's metadata.json as a hostile writer could make
// it, through parse_metadata (parallel/checkpoint/metadata.h): types, sizes, file names, the
// pieces' tiling of every tensor.
//
//   make fuzz        (clang's -fsanitize=fuzzer,address,undefined; seeds in fuzz/corpus/metadata/)
//
// Every input must end in success or sl::Error. What parses must also hold what the parser promises:
// written back out, it parses again to the same tensors, and each tensor's pieces cover it once.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "parallel/checkpoint/metadata.h"
#include "parallel/checkpoint/regions.h"

using namespace sl::parallel::checkpoint;

namespace {

void check_promises(const Metadata& metadata) {
  for (const auto& [name, tensor] : metadata.tensors) {
    int64_t covered = 0;
    for (const SavedPiece& piece : tensor.pieces) {
      if (!region_problem(piece.region, tensor.shape).empty()) std::abort();
      covered += piece.region.numel();
    }
    if (covered != checked_numel(tensor.shape, "")) std::abort();
  }
  const Metadata again = parse_metadata(metadata_text(metadata), "fuzz (written back): ");
  if (again.tensors.size() != metadata.tensors.size() || again.files.size() != metadata.files.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check_promises(parse_metadata(std::string(reinterpret_cast<const char*>(data), size), "fuzz: "));
  } catch (const sl::Error&) {
  }
  return 0;
}
