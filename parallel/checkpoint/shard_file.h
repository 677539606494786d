// shard_file.h — one rank's shard: a safetensors file of its pieces, each a 1-D tensor.
//
//   shard-00001.safetensors   [8 bytes: N] [N bytes: JSON header] [the pieces' bytes, back to back]
//     "__metadata__": {"format": "pt"}
//     "h.0.attn.c_attn.weight@0": {"dtype": "F32", "shape": [384], "data_offsets": [0, 1536]}
//     "h.0.attn.c_attn.weight@1": ...        key = global tensor name @ the rank's count of its pieces
//
//   Written as nn/safetensors.h writes a file (widest dtype first, header padded to 8 bytes, the
//   data packed with no gap), so PyTorch's `safetensors.torch.load_file` opens it; metadata.json
//   says where each key sits in its global tensor. The writer hashes the bytes as they go out, so
//   the SHA-256 costs no second read. The reader reads the header (checked by nn's parse_header:
//   every size against the file's size before anything is allocated) and then byte ranges only.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nn/safetensors_header.h"
#include "parallel/checkpoint/file_io.h"
#include "tensor/tensor.h"

namespace sl::parallel::checkpoint {

constexpr uint64_t kMaxShardHeaderBytes = 100'000'000;  // nn/safetensors.cpp's (the reference's) limit

// ---- writing ----
struct ShardTensor {
  std::string key;
  Tensor data;  // 1-D, contiguous, any device
};
struct WrittenShard {
  uint64_t bytes = 0;
  std::string sha256;
};
// Writes dir/name through dir/name.tmp (fsync, rename, fsync dir). `fault(point)` is called at
// "shard.begin", "shard.mid" (half the data written) and "shard.before_rename" (tests throw there).
WrittenShard write_shard(const std::string& dir, const std::string& name, const std::vector<ShardTensor>& tensors,
                         const std::function<void(const char*)>& fault);

// ---- reading ----
// The header of a safetensors file whose first bytes are `prefix` and whose size is file_size:
// the 8-byte length checked against both, then the JSON checked by nn::safetensors::parse_header.
// Needs prefix.size() >= min(file_size, 8 + N); reads nothing else.
nn::safetensors::Header parse_shard_header(const std::string& prefix, uint64_t file_size, const std::string& where);

class ShardReader {
 public:
  ShardReader(const std::string& path, const std::string& where);
  uint64_t size() const { return size_; }
  const nn::safetensors::Header& header() const { return header_; }
  // The entry of `key`, or an Error naming the file and the key.
  const nn::safetensors::TensorRecord& find(const std::string& key) const;
  // Bytes [begin, end) of `record`'s data (checked inside it) into `into`.
  void read(const nn::safetensors::TensorRecord& record, uint64_t begin, uint64_t end, void* into) const;

 private:
  std::string where_;
  uint64_t size_ = 0;
  File file_;
  nn::safetensors::Header header_;
  std::map<std::string, size_t> index_;  // key -> header_.tensors
};

}  // namespace sl::parallel::checkpoint
