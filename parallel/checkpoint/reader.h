// reader.h — reading a checkpoint under any layout.
//
//   Reader reader(dir);                 // parses and checks metadata.json: no file is opened yet
//   reader.verify();                    // every shard's size and SHA-256 (reads every byte)
//   reader.load(my_pieces);             // fills each piece's data, whatever cut wrote the checkpoint
//   reader.run_state()["step"];         // the caller's JSON, as saved
//
//   load, for each destination piece: the saved pieces of its tensor that share elements with it
//   (regions.h) — only those — and of each only the byte range that holds the shared elements,
//   read from its shard and copied by copy_overlap. Each destination must receive exactly its
//   region's element count. With LoadOptions::verify (the default) every shard a load reads from is
//   first checked against its SHA-256, once per Reader; without it, only those byte ranges are read.
//   A missing tensor, another global shape or dtype, a corrupt or missing shard: sl::Error naming
//   the checkpoint, the file, the tensor and both values. A Reader is used by one thread.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "parallel/checkpoint/metadata.h"
#include "parallel/checkpoint/shard_file.h"
#include "parallel/runner/state_pieces.h"

namespace sl::parallel::checkpoint {

struct LoadOptions {
  bool verify = true;  // check each shard read from against its SHA-256 first
};

class Reader {
 public:
  explicit Reader(const std::string& dir);

  const std::string& directory() const { return dir_; }
  const Metadata& metadata() const { return metadata_; }
  const nlohmann::json& run_state() const { return metadata_.run_state; }
  const std::string& layout() const { return metadata_.layout; }
  std::vector<std::string> tensor_names() const;
  bool has(const std::string& tensor) const { return metadata_.tensors.count(tensor) > 0; }
  const std::vector<int64_t>& shape(const std::string& tensor) const;
  DType dtype(const std::string& tensor) const;

  void verify() const;                          // every file
  void verify_file(const std::string& file) const;
  void load(std::vector<StatePiece>& pieces, const LoadOptions& options = {}) const;
  Tensor read_tensor(const std::string& tensor, const LoadOptions& options = {}) const;  // whole, on the CPU

  uint64_t data_bytes_read() const { return data_bytes_read_; }  // by loads so far (tests: ranges only)

 private:
  const SavedTensor& saved(const std::string& tensor) const;
  const ShardReader& shard(const std::string& file, const LoadOptions& options) const;
  void check_piece(const StatePiece& piece) const;
  int64_t load_piece(const StatePiece& piece, void* into, const LoadOptions& options) const;

  std::string dir_, where_;
  Metadata metadata_;
  mutable std::map<std::string, std::unique_ptr<ShardReader>> shards_;  // opened on first use
  mutable std::set<std::string> verified_;
  mutable uint64_t data_bytes_read_ = 0;
};

}  // namespace sl::parallel::checkpoint
