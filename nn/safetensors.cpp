// safetensors.cpp — reading and writing safetensors files (the layout is drawn in nn/safetensors.h).
//
// Reading trusts nothing: the file size is known first, the header length is checked against it,
// then the JSON header is parsed and every entry checked (dtype, shape, offsets, byte count, overlap)
// before any tensor is allocated. Each tensor is then filled by a bounded read of its own bytes, so
// the memory a file can make us allocate is at most its own size (plus a header of at most 100 MB).
//
// Writing follows the reference implementation: tensors sorted by dtype (widest first) then name,
// packed back to back, the compact JSON header padded with spaces to a multiple of 8 — so every
// tensor's data starts at a multiple of its element size.
#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

namespace sl::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

using json = nlohmann::json;
using detail::concat;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr size_t kMaxChunk = size_t{1} << 30;      // one read()/write() call moves at most 1 GiB

// rank is the reference writer's dtype order: tensors are written widest (highest rank) first.
struct DTypeInfo {
  DType dtype;
  const char* name;
  int rank;
};
constexpr DTypeInfo kDTypes[] = {{DType::f16, "F16", 0}, {DType::bf16, "BF16", 1}, {DType::i32, "I32", 2},
                                 {DType::f32, "F32", 3}, {DType::f64, "F64", 4}, {DType::i64, "I64", 5}};

const DTypeInfo& info_of(DType dtype) {
  for (const DTypeInfo& info : kDTypes)
    if (info.dtype == dtype) return info;
  detail::throw_internal("every DType has a safetensors name", __FILE__, __LINE__);
}

std::string errno_text() { return std::strerror(errno); }

// A JSON value shown in an error message, cut short: a hostile header may hold megabytes of it.
std::string brief(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() <= 40 ? text : text.substr(0, 40) + "...";
}

// A JSON non-negative integer, or nothing (negative, fractional, string, bool, ...).
std::optional<uint64_t> as_count(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

// A file descriptor, closed when the handle goes away.
class FileHandle {
 public:
  explicit FileHandle(int fd) : fd_(fd) {}
  FileHandle(FileHandle&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  FileHandle& operator=(FileHandle&&) = delete;
  ~FileHandle() { close(); }
  int fd() const { return fd_; }
  int close() { return fd_ < 0 ? 0 : ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

FileHandle open_for_reading(const std::string& path, const std::string& where, uint64_t& file_size) {
  // O_NONBLOCK: opening a FIFO must not hang; it is then refused as not a regular file.
  FileHandle file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  SL_CHECK(file.fd() >= 0, where, "cannot open for reading: ", errno_text());
  struct stat info{};
  SL_CHECK(::fstat(file.fd(), &info) == 0, where, "cannot stat: ", errno_text());
  SL_CHECK(S_ISREG(info.st_mode), where, "not a regular file");
  file_size = static_cast<uint64_t>(info.st_size);
  return file;
}

// Reads exactly `bytes` starting at `offset`; the caller has checked that they lie inside the file.
void read_exact(int fd, void* into, uint64_t bytes, uint64_t offset, const std::string& where) {
  auto* cursor = static_cast<char*>(into);
  while (bytes > 0) {
    ssize_t got = ::pread(fd, cursor, std::min<uint64_t>(bytes, kMaxChunk), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    SL_CHECK(got >= 0, where, "read failed at byte ", offset, ": ", errno_text());
    SL_CHECK(got > 0, where, "the file ended at byte ", offset, " (was it truncated while being read?)");
    cursor += got;
    offset += static_cast<uint64_t>(got);
    bytes -= static_cast<uint64_t>(got);
  }
}

void write_all(int fd, const void* from, uint64_t bytes, const std::string& where) {
  const auto* cursor = static_cast<const char*>(from);
  while (bytes > 0) {
    ssize_t put = ::write(fd, cursor, std::min<uint64_t>(bytes, kMaxChunk));
    if (put < 0 && errno == EINTR) continue;
    SL_CHECK(put > 0, where, "write failed: ", errno_text());
    cursor += put;
    bytes -= static_cast<uint64_t>(put);
  }
}

// ---- reading the header -------------------------------------------------------------------------

struct TensorRecord {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
};

struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorRecord> tensors;
  uint64_t data_start = 0;  // file offset of the data buffer: 8 + N
};

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& where) {
  SL_CHECK(value.is_object(), where, "\"__metadata__\" must be an object of string to string, got ", brief(value));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    SL_CHECK(text.is_string(), where, "\"__metadata__\" must map strings to strings, but key '", key, "' holds ",
             brief(text));
    metadata[key] = text.get<std::string>();
  }
  return metadata;
}

TensorRecord parse_entry(const std::string& name, const json& entry, uint64_t data_bytes, const std::string& where) {
  std::string at = concat(where, "tensor '", name, "': ");
  SL_CHECK(entry.is_object(), at, "the entry must be a JSON object, got ", brief(entry));
  for (const char* key : {"dtype", "shape", "data_offsets"}) SL_CHECK(entry.contains(key), at, "missing \"", key, "\"");
  TensorRecord record;
  record.name = name;

  const json& dtype = entry["dtype"];
  SL_CHECK(dtype.is_string(), at, "\"dtype\" must be a string, got ", brief(dtype));
  const DTypeInfo* info = nullptr;
  for (const DTypeInfo& candidate : kDTypes)
    if (dtype.get<std::string>() == candidate.name) info = &candidate;
  SL_CHECK(info != nullptr, at, "unknown dtype ", brief(dtype), " (shardlab reads F32, F64, BF16, F16, I32, I64)");
  record.dtype = info->dtype;

  // numel and bytes with overflow-checked products: a hostile shape must not wrap around to a small size.
  const json& shape = entry["shape"];
  SL_CHECK(shape.is_array(), at, "\"shape\" must be an array, got ", brief(shape));
  int64_t numel = 1;
  for (const json& size : shape) {
    std::optional<uint64_t> count = as_count(size);
    SL_CHECK(count && *count <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), at, "shape entry ",
             brief(size), " is not a non-negative integer (shape ", brief(shape), ")");
    SL_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(*count), &numel), at, "shape ", brief(shape),
             " overflows int64 (its element count)");
    record.shape.push_back(static_cast<int64_t>(*count));
  }
  int64_t nbytes = 0;
  SL_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(record.dtype)), &nbytes), at, "shape ",
           record.shape, " of ", info->name, " overflows int64 in bytes");

  const json& offsets = entry["data_offsets"];
  SL_CHECK(offsets.is_array() && offsets.size() == 2, at, "\"data_offsets\" must be [begin, end], got ",
           brief(offsets));
  std::optional<uint64_t> begin = as_count(offsets[0]), end = as_count(offsets[1]);
  SL_CHECK(begin && end, at, "\"data_offsets\" ", brief(offsets), " must be non-negative integers [begin, end]");
  SL_CHECK(*begin <= *end, at, "data_offsets [", *begin, ", ", *end, "]: begin ", *begin, " > end ", *end);
  SL_CHECK(*end <= data_bytes, at, "data_offsets [", *begin, ", ", *end, "] run past the end of the data buffer (",
           data_bytes, " bytes)");
  SL_CHECK(*end - *begin == static_cast<uint64_t>(nbytes), at, "data_offsets [", *begin, ", ", *end, "] hold ",
           *end - *begin, " bytes but shape ", record.shape, " of ", info->name, " needs ", nbytes);
  record.begin = *begin;
  record.end = *end;
  return record;
}

// Two tensors may not share bytes. Sorted by begin, it is enough that each starts at or after the
// previous one's end. Empty tensors own no bytes and cannot overlap anything.
void check_no_overlap(const std::vector<TensorRecord>& tensors, const std::string& where) {
  std::vector<const TensorRecord*> by_begin;
  for (const TensorRecord& record : tensors)
    if (record.end > record.begin) by_begin.push_back(&record);
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorRecord* a, const TensorRecord* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const TensorRecord& previous = *by_begin[i - 1];
    const TensorRecord& current = *by_begin[i];
    SL_CHECK(current.begin >= previous.end, where, "tensors '", previous.name, "' (data_offsets [", previous.begin,
             ", ", previous.end, "]) and '", current.name, "' (data_offsets [", current.begin, ", ", current.end,
             "]) overlap");
  }
}

Header read_header(int fd, uint64_t file_size, const std::string& where) {
  SL_CHECK(file_size >= 8, where, "the file is ", file_size, " bytes, shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  read_exact(fd, &header_bytes, 8, 0, where);  // little-endian on a little-endian host
  SL_CHECK(header_bytes <= file_size - 8, where, "header length ", header_bytes, " runs past the end of the file (",
           file_size, " bytes)");
  SL_CHECK(header_bytes <= kMaxHeaderBytes, where, "header length ", header_bytes, " is over the limit of ",
           kMaxHeaderBytes, " bytes");
  std::string text(header_bytes, '\0');
  read_exact(fd, text.data(), header_bytes, 8, where);

  json parsed;
  try {
    parsed = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(concat(where, "the header is not valid JSON (", e.what(), ")"));
  }
  SL_CHECK(parsed.is_object(), where, "the header is not a JSON object (it is ", parsed.type_name(), ")");

  Header header;
  header.data_start = 8 + header_bytes;
  uint64_t data_bytes = file_size - header.data_start;
  for (const auto& [name, entry] : parsed.items()) {
    if (name == "__metadata__")
      header.metadata = parse_metadata(entry, where);
    else
      header.tensors.push_back(parse_entry(name, entry, data_bytes, where));
  }
  check_no_overlap(header.tensors, where);
  return header;
}

}  // namespace

// ---- the API ------------------------------------------------------------------------------------

StateDict load_safetensors(const std::string& path, Device device) {
  std::string where = concat("load_safetensors: '", path, "': ");
  uint64_t file_size = 0;
  FileHandle file = open_for_reading(path, where, file_size);
  Header header = read_header(file.fd(), file_size, where);
  // CPU devices are filled in place; a GPU tensor is read into host memory, then copied over.
  Device host = device.is_cpu() ? device : Device::cpu();
  StateDict tensors;
  for (const TensorRecord& record : header.tensors) {
    Tensor tensor = Tensor::empty(record.shape, TensorOptions{record.dtype, host});
    read_exact(file.fd(), tensor.raw_data(), record.end - record.begin, header.data_start + record.begin, where);
    tensors.emplace(record.name, host == device ? tensor : tensor.to(device));
  }
  return tensors;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  std::string where = concat("load_safetensors_metadata: '", path, "': ");
  uint64_t file_size = 0;
  FileHandle file = open_for_reading(path, where, file_size);
  return read_header(file.fd(), file_size, where).metadata;
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string where = concat("save_safetensors: '", path, "': ");
  struct Item {
    const std::string* name;
    Tensor host;  // the tensor itself, or its copy in host memory
  };
  std::vector<Item> items;
  for (const auto& [name, tensor] : tensors) {
    SL_CHECK(name != "__metadata__", where, "\"__metadata__\" is reserved for the metadata and cannot name a tensor");
    SL_CHECK(tensor.defined(), where, "tensor '", name, "' is undefined");
    items.push_back({&name, tensor.device().is_cpu() ? tensor : tensor.detach().to(Device::cpu())});
  }
  // The map gives name order; a stable sort by dtype rank keeps it within each dtype.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return info_of(a.host.dtype()).rank > info_of(b.host.dtype()).rank;
  });

  // ordered_json keeps insertion order: __metadata__ first, then the tensors in data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Item& item : items) {
    auto bytes = static_cast<uint64_t>(item.host.nbytes());
    header[*item.name] = {{"dtype", info_of(item.host.dtype()).name},
                          {"shape", static_cast<const std::vector<int64_t>&>(item.host.shape())},
                          {"data_offsets", nlohmann::ordered_json::array({offset, offset + bytes})}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(concat(where, "a tensor name or metadata string is not valid UTF-8 (", e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned

  // Write PATH.tmp and rename it over PATH: a crash leaves either the old file or the new one.
  std::string temp_path = path + ".tmp";
  std::string temp_where = concat("save_safetensors: '", temp_path, "': ");
  FileHandle file(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  SL_CHECK(file.fd() >= 0, temp_where, "cannot open for writing: ", errno_text());
  try {
    uint64_t header_bytes = text.size();
    write_all(file.fd(), &header_bytes, 8, temp_where);
    write_all(file.fd(), text.data(), text.size(), temp_where);
    for (const Item& item : items)
      write_all(file.fd(), item.host.raw_data(), static_cast<uint64_t>(item.host.nbytes()), temp_where);
    // fsync before the rename, or a power cut could leave PATH naming blocks never written.
    SL_CHECK(::fsync(file.fd()) == 0, temp_where, "fsync failed: ", errno_text());
    SL_CHECK(file.close() == 0, temp_where, "close failed: ", errno_text());
    SL_CHECK(::rename(temp_path.c_str(), path.c_str()) == 0, where, "cannot rename '", temp_path,
             "' into place: ", errno_text());
  } catch (...) {
    file.close();
    ::unlink(temp_path.c_str());
    throw;
  }
}

}  // namespace sl::nn
