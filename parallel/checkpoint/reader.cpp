// reader.cpp — metadata.json checked, shards verified, pieces loaded under any cut (see reader.h).
#include "parallel/checkpoint/reader.h"

#include <cstddef>

#include "parallel/checkpoint/file_io.h"
#include "parallel/checkpoint/regions.h"
#include "parallel/checkpoint/sha256.h"

namespace sl::parallel::checkpoint {
namespace {

using detail::concat;

std::string shape_text(const std::vector<int64_t>& shape) { return nlohmann::json(shape).dump(); }

}  // namespace

Reader::Reader(const std::string& dir) : dir_(dir), where_(concat("checkpoint '", dir, "': ")) {
  const std::string path = dir + "/" + kMetadataName;
  SL_CHECK(exists(path), where_, "no ", kMetadataName,
           " (not a checkpoint, or a save that did not finish: a checkpoint without its metadata does not exist)");
  metadata_ = parse_metadata(read_small_file(path, kMaxMetadataBytes, where_), where_ + kMetadataName + ": ");
}

std::vector<std::string> Reader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : metadata_.tensors) names.push_back(name);
  return names;
}

const SavedTensor& Reader::saved(const std::string& tensor) const {
  auto found = metadata_.tensors.find(tensor);
  SL_CHECK(found != metadata_.tensors.end(), where_, "has no tensor '", tensor,
           "' (the model asks for it: another model, or state the saving run did not have)");
  return found->second;
}

const std::vector<int64_t>& Reader::shape(const std::string& tensor) const { return saved(tensor).shape; }
DType Reader::dtype(const std::string& tensor) const { return saved(tensor).dtype; }

void Reader::verify() const {
  for (const auto& [file, record] : metadata_.files) verify_file(file);
}

void Reader::verify_file(const std::string& file) const {
  auto listed = metadata_.files.find(file);
  SL_CHECK(listed != metadata_.files.end(), where_, "metadata.json lists no file '", file, "'");
  const std::string path = dir_ + "/" + file;
  const std::string at = concat(where_, file, " (holding ", metadata_.tensors_in(file), "): ");
  SL_CHECK(exists(path), at, "the file is missing");
  uint64_t size = 0;
  File::open_read(path, at, size);
  SL_CHECK(size == listed->second.bytes, at, "the file is ", size, " bytes but metadata.json says ",
           listed->second.bytes, " (truncated or replaced)");
  const std::string digest = sha256_file(path);
  SL_CHECK(digest == listed->second.sha256, at, "SHA-256 mismatch: metadata.json says ", listed->second.sha256,
           ", the file hashes to ", digest, " (the file is corrupt)");
  // Its header names every piece metadata.json puts in it, with the tensor's dtype and [numel].
  const ShardReader& reader = shard(file, LoadOptions{.verify = false});
  for (const auto& [name, tensor] : metadata_.tensors)
    for (const SavedPiece& piece : tensor.pieces) {
      if (piece.file != file) continue;
      const nn::safetensors::TensorRecord& record = reader.find(piece.key);
      SL_CHECK(record.dtype == tensor.dtype && record.shape == Shape{piece.region.numel()}, at, "tensor '", name,
               "': key '", piece.key, "' is ", dtype_label(record.dtype), " ", record.shape, " but metadata.json says ",
               dtype_label(tensor.dtype), " [", piece.region.numel(), "]");
    }
  verified_.insert(file);
}

const ShardReader& Reader::shard(const std::string& file, const LoadOptions& options) const {
  if (options.verify && !verified_.count(file)) verify_file(file);
  std::unique_ptr<ShardReader>& reader = shards_[file];
  if (!reader) {
    const std::string at = concat(where_, file, " (holding ", metadata_.tensors_in(file), "): ");
    SL_CHECK(exists(dir_ + "/" + file), at, "the file is missing");
    uint64_t size = 0;  // checked first: a truncated file then says so, rather than what it cut off
    File::open_read(dir_ + "/" + file, at, size);
    SL_CHECK(size == metadata_.files.at(file).bytes, at, "the file is ", size, " bytes but metadata.json says ",
             metadata_.files.at(file).bytes, " (truncated or replaced)");
    reader = std::make_unique<ShardReader>(dir_ + "/" + file, at);
  }
  return *reader;
}

void Reader::check_piece(const StatePiece& piece) const {
  const SavedTensor& tensor = saved(piece.tensor);
  const std::string at = concat(where_, "tensor '", piece.tensor, "': ");
  SL_CHECK(tensor.shape == piece.global_shape, at, "the checkpoint's shape ", shape_text(tensor.shape),
           " differs from the model's ", shape_text(piece.global_shape), " (another model config?)");
  SL_CHECK(piece.data.defined(), at, "the piece ", describe(piece.region), " has no data");
  SL_CHECK(tensor.dtype == piece.data.dtype(), at, "the checkpoint holds ", dtype_label(tensor.dtype),
           " but the model's piece is ", dtype_label(piece.data.dtype()));
  const std::string problem = region_problem(piece.region, piece.global_shape);
  SL_CHECK(problem.empty(), at, "the piece ", describe(piece.region), ": ", problem);
  SL_CHECK(piece.data.numel() == piece.region.numel(), at, "the piece ", describe(piece.region), " has ",
           piece.data.numel(), " elements of data for a region of ", piece.region.numel());
}

// Copies into `into` (the piece's elements, host memory) every saved element of its region.
int64_t Reader::load_piece(const StatePiece& piece, void* into, const LoadOptions& options) const {
  const SavedTensor& tensor = saved(piece.tensor);
  const auto element = static_cast<int64_t>(dtype_size(tensor.dtype));
  int64_t copied = 0;
  std::vector<std::byte> buffer;
  for (const SavedPiece& source : tensor.pieces) {
    const auto [begin, end] = overlap_span(source.region, piece.region);
    if (begin == end) continue;  // nothing shared: not read at all
    const ShardReader& reader = shard(source.file, options);
    const nn::safetensors::TensorRecord& record = reader.find(source.key);
    SL_CHECK(record.dtype == tensor.dtype && record.shape == Shape{source.region.numel()}, where_, source.file,
             ": tensor '", piece.tensor, "': key '", source.key, "' is ", dtype_label(record.dtype), " ",
             record.shape, " but metadata.json says ", dtype_label(tensor.dtype), " [", source.region.numel(), "]");
    buffer.resize(static_cast<size_t>((end - begin) * element));
    const auto first = static_cast<uint64_t>((begin - source.region.flat_begin) * element);
    reader.read(record, first, first + buffer.size(), buffer.data());
    data_bytes_read_ += buffer.size();
    Region span = source.region;  // the part of the saved piece just read
    span.flat_begin = begin, span.flat_end = end;
    copied += copy_overlap(piece.region, into, span, buffer.data(), element);
  }
  return copied;
}

void Reader::load(std::vector<StatePiece>& pieces, const LoadOptions& options) const {
  for (StatePiece& piece : pieces) {
    check_piece(piece);
    const bool in_place = piece.data.device().is_cpu();
    Tensor host = in_place ? piece.data : Tensor::empty({piece.data.numel()}, {piece.data.dtype(), Device::cpu()});
    const int64_t copied = load_piece(piece, host.raw_data(), options);
    SL_CHECK(copied == piece.region.numel(), where_, "tensor '", piece.tensor, "': the piece ", describe(piece.region),
             " received ", copied, " of its ", piece.region.numel(), " elements");
    if (!in_place) piece.data.copy_(host);
  }
}

Tensor Reader::read_tensor(const std::string& tensor, const LoadOptions& options) const {
  const SavedTensor& entry = saved(tensor);
  Tensor whole = Tensor::empty(Shape(entry.shape), {entry.dtype, Device::cpu()});
  const int64_t numel = whole.numel();
  std::vector<StatePiece> piece(1);
  piece[0] = {tensor, entry.shape, Region{std::vector<int64_t>(entry.shape.size(), 0), entry.shape, 0, numel},
              whole.reshape({numel}), true};
  load(piece, options);
  return whole;
}

}  // namespace sl::parallel::checkpoint
