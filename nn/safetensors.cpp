// safetensors.cpp — reading and writing safetensors files (the layout is drawn in nn/safetensors.h).
//
// Reading trusts nothing: the file size is known first, the header length is checked against it,
// then the JSON header is parsed and every entry checked (dtype, shape, offsets, byte count, overlap;
// nn/safetensors_header.cpp) before any tensor is allocated. Each tensor is then filled by a bounded
// read of its own bytes, so the memory a file can make us allocate is at most its own size (plus a
// header of at most 100 MB).
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
#include <utility>
#include <vector>

#include "nn/safetensors_header.h"

namespace sl::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

using detail::concat;
using safetensors::Header;
using safetensors::TensorRecord;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr size_t kMaxChunk = size_t{1} << 30;      // one read()/write() call moves at most 1 GiB

std::string errno_text() { return std::strerror(errno); }

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
  struct stat info {};
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

// The 8-byte length N, checked against the file, then the N bytes of header, parsed and checked.
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
  return safetensors::parse_header(text, file_size, where);
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
    return safetensors::write_rank(a.host.dtype()) > safetensors::write_rank(b.host.dtype());
  });

  // Packed back to back in that order.
  std::vector<TensorRecord> records;
  uint64_t offset = 0;
  for (const Item& item : items) {
    auto bytes = static_cast<uint64_t>(item.host.nbytes());
    records.push_back({*item.name, item.host.dtype(), item.host.shape(), offset, offset + bytes});
    offset += bytes;
  }
  const std::string text = safetensors::format_header(records, metadata, where);

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
