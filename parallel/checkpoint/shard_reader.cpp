// shard_reader.cpp — a shard's header and byte ranges of its tensors (see shard_file.h).
#include <cstring>

#include "parallel/checkpoint/shard_file.h"

namespace sl::parallel::checkpoint {

nn::safetensors::Header parse_shard_header(const std::string& prefix, uint64_t file_size, const std::string& where) {
  SL_CHECK(file_size >= 8 && prefix.size() >= 8, where, "the file is ", file_size,
           " bytes, shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix.data(), 8);  // little-endian, as the host (nn/safetensors.cpp asserts it)
  SL_CHECK(header_bytes <= file_size - 8, where, "header length ", header_bytes, " runs past the end of the file (",
           file_size, " bytes)");
  SL_CHECK(header_bytes <= kMaxShardHeaderBytes, where, "header length ", header_bytes, " is over the limit of ",
           kMaxShardHeaderBytes, " bytes");
  SL_CHECK(prefix.size() >= 8 + header_bytes, where, "internal: the header was not read whole");
  return nn::safetensors::parse_header(prefix.substr(8, header_bytes), file_size, where);
}

ShardReader::ShardReader(const std::string& path, const std::string& where)
    : where_(where), file_(File::open_read(path, where, size_)) {
  std::string prefix(std::min<uint64_t>(size_, 8), '\0');
  file_.read_at(prefix.data(), prefix.size(), 0, where_);
  if (prefix.size() == 8) {  // the header too: its length is checked before the buffer grows to hold it
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, prefix.data(), 8);
    if (header_bytes <= size_ - 8 && header_bytes <= kMaxShardHeaderBytes) {
      prefix.resize(8 + header_bytes);
      file_.read_at(prefix.data() + 8, header_bytes, 8, where_);
    }
  }
  header_ = parse_shard_header(prefix, size_, where_);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

const nn::safetensors::TensorRecord& ShardReader::find(const std::string& key) const {
  auto found = index_.find(key);
  SL_CHECK(found != index_.end(), where_, "holds no tensor '", key, "'");
  return header_.tensors[found->second];
}

void ShardReader::read(const nn::safetensors::TensorRecord& record, uint64_t begin, uint64_t end, void* into) const {
  SL_CHECK(begin <= end && end <= record.end - record.begin, where_, "bytes [", begin, ", ", end, ") are not inside '",
           record.name, "' (", record.end - record.begin, " bytes)");
  file_.read_at(into, end - begin, header_.data_start + record.begin + begin, where_);
}

}  // namespace sl::parallel::checkpoint
