// shard_writer.cpp — a rank's pieces into one safetensors file, hashed on the way out (see shard_file.h).
#include <algorithm>

#include "parallel/checkpoint/sha256.h"
#include "parallel/checkpoint/shard_file.h"

namespace sl::parallel::checkpoint {
namespace {

using nn::safetensors::TensorRecord;

// A file being written whose bytes also feed a SHA-256; fault("shard.mid") fires once, when half
// of `data_bytes` have gone out.
struct HashedWriter {
  const File& file;
  const std::string& where;
  uint64_t data_bytes, data_written = 0;
  const std::function<void(const char*)>& fault;
  Sha256 hash;
  bool mid_passed = false;

  void put(const void* bytes, uint64_t count) {
    file.write_all(bytes, count, where);
    hash.update(bytes, count);
  }
  void put_data(const void* bytes, uint64_t count) {
    const uint64_t half = data_bytes / 2;
    const auto* cursor = static_cast<const char*>(bytes);
    if (!mid_passed && data_written + count >= half) {  // split at the middle
      mid_passed = true;
      const uint64_t first = half - data_written;
      put(cursor, first);
      fault("shard.mid");
      cursor += first;
      count -= first;
      data_written += first;
    }
    put(cursor, count);
    data_written += count;
  }
};

}  // namespace

WrittenShard write_shard(const std::string& dir, const std::string& name, const std::vector<ShardTensor>& tensors,
                         const std::function<void(const char*)>& fault) {
  const std::string path = dir + "/" + name, temp = path + ".tmp";
  const std::string where = "checkpoint: writing '" + temp + "': ";
  fault("shard.begin");
  // The reference writer's order: widest dtype first (so every tensor starts aligned), then by key.
  std::vector<std::pair<std::string, Tensor>> items;
  for (const ShardTensor& tensor : tensors)
    items.emplace_back(tensor.key, tensor.data.device().is_cpu() ? tensor.data : tensor.data.to(Device::cpu()));
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    const int ra = nn::safetensors::write_rank(a.second.dtype()), rb = nn::safetensors::write_rank(b.second.dtype());
    return ra != rb ? ra > rb : a.first < b.first;
  });
  std::vector<TensorRecord> records;
  uint64_t offset = 0;
  for (const auto& [key, data] : items) {
    const auto bytes = static_cast<uint64_t>(data.nbytes());
    records.push_back({key, data.dtype(), Shape{data.numel()}, offset, offset + bytes});
    offset += bytes;
  }
  const std::string header = nn::safetensors::format_header(records, {{"format", "pt"}}, where);

  File file = File::create(temp, where);
  WrittenShard written;
  try {
    HashedWriter out{file, where, offset, 0, fault, {}};
    const uint64_t header_bytes = header.size();
    out.put(&header_bytes, 8);
    out.put(header.data(), header.size());
    for (const auto& [key, data] : items) out.put_data(data.raw_data(), static_cast<uint64_t>(data.nbytes()));
    if (!out.mid_passed) fault("shard.mid");  // no data at all
    file.sync(where);
    file.close(where);
    written = {8 + header.size() + offset, out.hash.finish()};
    fault("shard.before_rename");
  } catch (...) {
    remove_file(temp);
    throw;
  }
  rename_path(temp, path, where);
  sync_directory(dir, where);
  return written;
}

}  // namespace sl::parallel::checkpoint
