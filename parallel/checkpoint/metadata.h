// metadata.h — metadata.json: what a checkpoint holds and where, parsed as hostile input.
//
//   {"format": "shardlab.checkpoint", "version": 1,
//    "layout": "zero3 dp 4", "world_size": 4,
//    "files":   {"shard-00000.safetensors": {"bytes": 5160, "sha256": "9f86d0..."}, ...},
//    "tensors": {"h.0.mlp.c_fc.weight": {"shape": [64, 16], "dtype": "F32",
//                  "pieces": [{"file": "shard-00000.safetensors", "key": "h.0.mlp.c_fc.weight@0",
//                              "offsets": [0, 0], "lengths": [64, 16], "flat_begin": 0, "flat_end": 256},
//                             ...]}, ...},
//    "run_state": {...}}     the caller's: step, lr schedule, loss scale, data position, RNG, config
//
//   A piece is a Region of its global tensor (state_pieces.h) saved as the 1-D tensor `key` of
//   `file`. parse_metadata checks every field's type and range before it is used: files are named
//   shard-NNNNN.safetensors (no paths), sizes are non-negative and bounded, every piece names a
//   listed file, no two pieces share a (file, key), and the pieces of each tensor tile it exactly
//   (regions.h). Errors name the tensor, the piece and the values.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/runner/state_pieces.h"
#include "tensor/dtype.h"

namespace sl::parallel::checkpoint {

constexpr const char* kFormatName = "shardlab.checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kMetadataName = "metadata.json";
constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;
constexpr int kMaxJsonDepth = 64;
constexpr int64_t kMaxWorldSize = 1 << 20;

struct SavedPiece {
  std::string file, key;  // the safetensors file in the checkpoint directory, and the tensor in it
  Region region;
};

struct SavedTensor {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::vector<SavedPiece> pieces;
};

struct SavedFile {
  uint64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct Metadata {
  int version = kFormatVersion;
  std::string layout;      // who wrote it, in the caller's words ("zero3 dp 4")
  int64_t world_size = 1;  // ranks that wrote it
  std::map<std::string, SavedTensor> tensors;
  std::map<std::string, SavedFile> files;
  nlohmann::json run_state = nlohmann::json::object();

  // "h.0.attn.c_attn.weight, exp_avg.h.0.attn.c_attn.weight" — the tensors with a piece in `file`.
  std::string tensors_in(const std::string& file) const;
};

// The safetensors dtype names (F32, BF16, ...), as the shard files spell them.
std::string dtype_label(DType dtype);
DType parse_dtype_label(const std::string& label, const std::string& where);

std::string shard_file_name(int rank);  // "shard-00003.safetensors"
bool is_shard_file_name(const std::string& name);

std::string metadata_text(const Metadata& metadata);  // the JSON, as written
// Parses and checks everything listed above; errors are sl::Error beginning with `where`.
Metadata parse_metadata(const std::string& text, const std::string& where);

}  // namespace sl::parallel::checkpoint
